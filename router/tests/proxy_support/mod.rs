//! The proxy tests' scenario builder and log capture. A [`Scenario`] names what a test needs (names on
//! the allowlist, names that merely resolve, host:port entries, upstreams, router limits) and starts it:
//! a network namespace with the upstreams, a test DNS server that points the names at it, a test CA,
//! and an in-process router ([`router::TestRouter`]) configured for them. The hosts themselves come from
//! the dev-only `agent-sandbox-testkit` crate, shared with the proxy benchmark.
//!
//! The log capture reads the router's JSON events (the contract the launcher's report parses): every
//! test of a binary shares one capture, so each looks only at events after its own mark.
#![allow(dead_code, unreachable_pub)]

pub mod router;

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_sandbox_testkit::dns::TestDns;
use agent_sandbox_testkit::netns::Netns;
use agent_sandbox_testkit::pki::Pki;
use agent_sandbox_testkit::upstream::{echo_upstream, http_upstream, tls_upstream, Accepts};
use router::{Settings, TestRouter};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Returns early from the calling test when it cannot create network namespaces (not root): loudly,
/// or with a failure when `CI` is set.
#[macro_export]
macro_rules! require_netns {
    () => {
        if !agent_sandbox_testkit::netns::require() {
            return;
        }
    };
}

/// Tests that count descriptors or change process limits take this exclusively ([`Scenario::alone`]);
/// every other scenario of the binary shares it.
static PROCESS: RwLock<()> = RwLock::const_new(());

/// How long a started scenario may live. The slowest scenario takes a few seconds; a scenario still
/// alive after this is hung (a relay waiting for ever, say), and libtest has no per-test timeout, so
/// its watchdog ends the test binary with a message naming it instead of letting CI wait out its limit.
const HUNG_AFTER: Duration = Duration::from_secs(300);

/// Overrides [`HUNG_AFTER`] (whole seconds), for the test of the watchdog itself.
pub const HUNG_AFTER_ENV: &str = "AGENT_SANDBOX_TEST_SCENARIO_DEADLINE_SECS";

/// [`HUNG_AFTER`], or the override.
fn hung_after() -> Duration {
    std::env::var(HUNG_AFTER_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(HUNG_AFTER, Duration::from_secs)
}

/// Ends the test binary if its scenario is still alive after [`HUNG_AFTER`] (the test
/// `scenario_watchdog.rs` checks it does); dropping it (the end of the scenario) stops it at once.
#[derive(Debug)]
struct Watchdog {
    /// Dropped with the scenario: wakes the watchdog's thread, which then exits.
    _alive: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    /// Watches the scenario with this domain and namespace.
    fn start(domain: &str, netns: &str) -> Watchdog {
        let (alive, dead) = std::sync::mpsc::channel::<()>();
        let (domain, netns) = (domain.to_owned(), netns.to_owned());
        let deadline = hung_after();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = dead.recv_timeout(deadline) {
                let removed = match std::process::Command::new("ip")
                    .args(["netns", "del", &netns])
                    .output()
                {
                    Ok(o) if o.status.success() => format!("Its namespace {netns} is removed"),
                    Ok(o) => format!(
                        "Its namespace {netns} could not be removed ({}): `ip netns del {netns}`",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                    Err(e) => format!(
                        "Its namespace {netns} could not be removed ({e}): `ip netns del {netns}`"
                    ),
                };
                // Straight to the descriptor: libtest captures eprintln! (this thread inherited the
                // test's capture) and an aborted test's capture is never shown. Processes the test
                // started (a router binary, say) are not stopped.
                let _ = writeln!(
                    std::io::stderr(),
                    "HUNG: the scenario {domain} is still running after {} s; ending this test \
                     binary (libtest has no per-test timeout). {removed}; the next run sweeps any \
                     other namespace this binary left.",
                    deadline.as_secs()
                );
                std::process::abort();
            }
        });
        Watchdog { _alive: alive }
    }
}

/// A `Proxy` built from a router configuration's TOML (which must parse and validate), for a test that
/// serves one listener itself.
pub fn proxy_from_toml(toml: &str) -> std::sync::Arc<agent_sandbox_router::proxy::Proxy> {
    let config = agent_sandbox_shared::RouterConfig::from_toml(toml)
        .unwrap_or_else(|e| panic!("{e}\n{toml}"))
        .validate()
        .unwrap();
    std::sync::Arc::new(agent_sandbox_router::proxy::Proxy::new(&config).unwrap())
}

/// A fresh test-unique label.
pub fn uniq(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}{}p{}",
        N.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    )
}

/// An upstream server a scenario starts in its namespace.
#[derive(Debug, Clone, Copy)]
enum Upstream {
    /// [`tls_upstream`] on 443, with the scenario's certificate.
    Tls,
    /// [`http_upstream`] on 80.
    Http,
    /// [`echo_upstream`] on this port.
    Echo(u16),
}

/// What a test needs, built up then started. Names are labels under the scenario's own domain
/// (`LABEL.<tag><n>p<pid>.test`; `""` is the domain itself).
#[derive(Debug)]
#[must_use]
pub struct Scenario {
    /// Prefix of the domain, for reading logs.
    tag: String,
    /// Exact names on the allowlist that resolve to the namespace.
    hosts: Vec<String>,
    /// Exact names on the allowlist that do not resolve (NXDOMAIN).
    unresolvable: Vec<String>,
    /// The domain with every subdomain is on the allowlist.
    subdomains: bool,
    /// Names that resolve to the namespace but are not on the allowlist.
    resolves: Vec<String>,
    /// host:port entries (the host resolves to the namespace).
    forwards: Vec<(String, u16)>,
    /// The certificate's names, when not the hosts' and resolving names.
    cert: Option<Vec<String>>,
    /// Servers to start in the namespace.
    upstreams: Vec<Upstream>,
    /// TTL of the test DNS server's answers.
    dns_ttl: u32,
    /// Router settings other than the names.
    settings: Settings,
    /// Run with no other scenario of this binary at the same time.
    alone: bool,
}

impl Scenario {
    /// An empty scenario; `tag` names its domain.
    pub fn new(tag: &str) -> Scenario {
        Scenario {
            tag: tag.to_owned(),
            hosts: Vec::new(),
            unresolvable: Vec::new(),
            subdomains: false,
            resolves: Vec::new(),
            forwards: Vec::new(),
            cert: None,
            upstreams: Vec::new(),
            dns_ttl: 300,
            settings: Settings::default(),
            alone: false,
        }
    }

    /// `label` on the allowlist (an exact name), resolving to the namespace.
    pub fn host(mut self, label: &str) -> Scenario {
        self.hosts.push(label.to_owned());
        self
    }

    /// `label` on the allowlist, but with no address in DNS.
    pub fn unresolvable_host(mut self, label: &str) -> Scenario {
        self.unresolvable.push(label.to_owned());
        self
    }

    /// The scenario's domain and every name below it on the allowlist.
    pub fn subdomains(mut self) -> Scenario {
        self.subdomains = true;
        self
    }

    /// `label` resolves to the namespace but is not on the allowlist.
    pub fn resolves(mut self, label: &str) -> Scenario {
        self.resolves.push(label.to_owned());
        self
    }

    /// A host:port entry for `label` (which resolves to the namespace).
    pub fn forward(mut self, label: &str, port: u16) -> Scenario {
        self.forwards.push((label.to_owned(), port));
        self
    }

    /// The certificate's names (labels; `*.x` for a wildcard) instead of every host and resolving name.
    pub fn cert(mut self, labels: &[&str]) -> Scenario {
        self.cert = Some(labels.iter().map(|l| (*l).to_owned()).collect());
        self
    }

    /// A TLS upstream on port 443 that answers each line with `upstream <sni> <line>`.
    pub fn tls_upstream(mut self) -> Scenario {
        self.upstreams.push(Upstream::Tls);
        self
    }

    /// An HTTP upstream on port 80 that describes each request.
    pub fn http_upstream(mut self) -> Scenario {
        self.upstreams.push(Upstream::Http);
        self
    }

    /// A TCP echo upstream on `port`.
    pub fn echo_upstream(mut self, port: u16) -> Scenario {
        self.upstreams.push(Upstream::Echo(port));
        self
    }

    /// TTL of DNS answers (default 300 s).
    pub fn dns_ttl(mut self, secs: u32) -> Scenario {
        self.dns_ttl = secs;
        self
    }

    /// The router's peek timeout (default 10 s).
    pub fn peek_timeout_secs(mut self, secs: u64) -> Scenario {
        self.settings.peek_timeout_secs = secs;
        self
    }

    /// The router's connection cap (default 4096).
    pub fn max_connections(mut self, n: usize) -> Scenario {
        self.settings.max_connections = n;
        self
    }

    /// Runs with no other scenario of this test binary at once: for tests that count the process's
    /// descriptors or change its limits.
    pub fn alone(mut self) -> Scenario {
        self.alone = true;
        self
    }

    /// Starts the hosts and the in-process router.
    pub async fn start(self) -> Running {
        let settings = self.settings.clone();
        let world = self.world().await;
        let router = TestRouter::start(
            Settings {
                hosts: world.hosts.clone(),
                subdomains: world.subdomains.clone(),
                forwards: world.forwards.clone(),
                ..settings
            },
            &world.dns,
        )
        .await;
        Running { router, world }
    }

    /// Starts the hosts only (a test that runs the router itself).
    pub async fn world(self) -> World {
        let guard = if self.alone {
            Guard::Alone(PROCESS.write().await)
        } else {
            Guard::Shared(PROCESS.read().await)
        };
        capture_logs();
        let mark = log_mark();
        let domain = format!("{}.test", uniq(&self.tag));
        let name = |label: &str| full_name(&domain, label);
        let ns = Netns::create();
        let dns = TestDns::start(self.dns_ttl).await;
        let point = |n: &str| dns.set(n, &[IpAddr::V4(ns.ns_ip)]);
        let hosts: Vec<String> = self.hosts.iter().map(|l| name(l)).collect();
        let resolves: Vec<String> = self.resolves.iter().map(|l| name(l)).collect();
        let forwards: Vec<(String, u16)> =
            self.forwards.iter().map(|(l, p)| (name(l), *p)).collect();
        for n in hosts
            .iter()
            .chain(&resolves)
            .chain(forwards.iter().map(|(n, _)| n))
        {
            point(n);
        }
        let cert: Vec<String> = match &self.cert {
            Some(labels) => labels.iter().map(|l| name(l)).collect(),
            None => hosts.iter().chain(&resolves).cloned().collect(),
        };
        let pki = Pki::new(&cert.iter().map(String::as_str).collect::<Vec<_>>());
        let mut upstreams = Upstreams::default();
        for u in &self.upstreams {
            match u {
                Upstream::Tls => {
                    upstreams.tls = Some(tls_upstream(ns.bind(443), Arc::clone(&pki.server)));
                }
                Upstream::Http => upstreams.http = Some(http_upstream(ns.bind(80))),
                Upstream::Echo(port) => upstreams.echo = Some(echo_upstream(ns.bind(*port))),
            }
        }
        let watchdog = Watchdog::start(&domain, &ns.name);
        World {
            mark,
            hosts: hosts
                .into_iter()
                .chain(self.unresolvable.iter().map(|l| name(l)))
                .collect(),
            subdomains: if self.subdomains {
                vec![domain.clone()]
            } else {
                Vec::new()
            },
            forwards,
            domain,
            ns,
            dns,
            pki,
            upstreams,
            _watchdog: watchdog,
            _guard: guard,
        }
    }
}

/// `label` under `domain` (`""` is the domain itself).
fn full_name(domain: &str, label: &str) -> String {
    if label.is_empty() {
        domain.to_owned()
    } else {
        format!("{label}.{domain}")
    }
}

/// The scenario's hold on [`PROCESS`].
#[derive(Debug)]
enum Guard {
    /// With other scenarios.
    Shared(RwLockReadGuard<'static, ()>),
    /// Alone.
    Alone(RwLockWriteGuard<'static, ()>),
}

/// The accept counters of a scenario's upstreams.
#[derive(Debug, Default)]
struct Upstreams {
    /// The TLS upstream's.
    tls: Option<Accepts>,
    /// The HTTP upstream's.
    http: Option<Accepts>,
    /// The echo upstream's.
    echo: Option<Accepts>,
}

/// A started scenario without a router: its hosts, DNS and CA.
#[derive(Debug)]
pub struct World {
    /// Where this test's log events begin.
    pub mark: usize,
    /// The scenario's domain (`<tag><n>p<pid>.test`).
    pub domain: String,
    /// The namespace the upstreams listen in.
    pub ns: Netns,
    /// The router's resolver.
    pub dns: TestDns,
    /// The CA the upstream's certificate comes from.
    pub pki: Pki,
    /// Exact names on the allowlist.
    pub hosts: Vec<String>,
    /// Names on the allowlist with their subdomains.
    pub subdomains: Vec<String>,
    /// host:port entries.
    pub forwards: Vec<(String, u16)>,
    /// The upstreams' accept counters.
    upstreams: Upstreams,
    /// Ends the test binary if the scenario hangs.
    _watchdog: Watchdog,
    /// Held to the end of the test.
    _guard: Guard,
}

impl World {
    /// `label` under the scenario's domain (`""` is the domain itself).
    pub fn name(&self, label: &str) -> String {
        full_name(&self.domain, label)
    }

    /// Makes `name` resolve to the namespace.
    pub fn point(&self, name: &str) {
        self.dns.set(name, &[IpAddr::V4(self.ns.ns_ip)]);
    }

    /// Connections the TLS upstream accepted.
    pub fn tls(&self) -> &Accepts {
        self.upstreams
            .tls
            .as_ref()
            .expect("no TLS upstream in this scenario")
    }

    /// Connections the HTTP upstream accepted.
    pub fn http(&self) -> &Accepts {
        self.upstreams
            .http
            .as_ref()
            .expect("no HTTP upstream in this scenario")
    }

    /// Connections the echo upstream accepted.
    pub fn echo(&self) -> &Accepts {
        self.upstreams
            .echo
            .as_ref()
            .expect("no echo upstream in this scenario")
    }
}

/// A started scenario: its world and the router serving it (stopped first on drop).
#[derive(Debug)]
pub struct Running {
    /// The in-process router.
    pub router: TestRouter,
    /// Hosts, DNS, CA.
    pub world: World,
}

impl Deref for Running {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

/// Captured log lines (JSON), shared by every test of the binary.
#[derive(Clone, Debug, Default)]
pub struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if std::env::var_os("PROXY_TEST_LOG").is_some() {
            let _ = std::io::stderr().write_all(b);
        }
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

static LOGS: OnceLock<LogBuf> = OnceLock::new();

/// Installs the JSON log capture once.
pub fn capture_logs() -> LogBuf {
    LOGS.get_or_init(|| {
        let buf = LogBuf::default();
        let writer = buf.clone();
        tracing_subscriber::fmt()
            .json()
            .flatten_event(false)
            .with_env_filter("info,hickory_proto=warn,hickory_resolver=warn,hickory_net=warn")
            .with_writer(move || writer.clone())
            .init();
        buf
    })
    .clone()
}

/// A position in the captured log: events after it happened later.
pub fn log_mark() -> usize {
    capture_logs().0.lock().unwrap().len()
}

/// Every captured event whose message is `message`, as the "fields" objects.
pub fn events(message: &str) -> Vec<serde_json::Value> {
    events_since(0, message)
}

/// Every event after `mark` whose message is `message`, newest first.
pub fn events_since(mark: usize, message: &str) -> Vec<serde_json::Value> {
    let buf = capture_logs();
    let bytes = buf.0.lock().unwrap();
    let text = String::from_utf8_lossy(&bytes[mark.min(bytes.len())..]).into_owned();
    drop(bytes);
    let mut found: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("fields").cloned())
        .filter(|f| f.get("message").and_then(|m| m.as_str()) == Some(message))
        .collect();
    found.reverse();
    found
}

/// Waits (up to 5 s) for a `refused` event whose name is `name` and returns its reason.
pub async fn refusal(name: &str) -> String {
    for _ in 0..500 {
        if let Some(e) = events("refused")
            .into_iter()
            .find(|e| e.get("name").and_then(|n| n.as_str()) == Some(name))
        {
            return e["reason"].as_str().unwrap_or_default().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no refusal logged for {name:?}; refusals: {:?}",
        events("refused")
    );
}

/// Waits (up to 5 s) for a `refused` event from `client` and returns (name, reason).
/// Only events after `since` (a [`log_mark`] taken before the connection) count: client ports are
/// reused across the tests of this binary.
pub async fn refusal_from(since: usize, client: SocketAddr) -> (String, String) {
    let want = client.to_string();
    for _ in 0..500 {
        if let Some(e) = events_since(since, "refused")
            .into_iter()
            .find(|e| e.get("client").and_then(|n| n.as_str()) == Some(want.as_str()))
        {
            return (
                e["name"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no refusal logged for {client}; refusals: {:?}",
        events("refused")
    );
}

/// Waits (up to 5 s) for the `connection` event of `client`.
pub async fn connection_event(since: usize, client: SocketAddr) -> serde_json::Value {
    let want = client.to_string();
    for _ in 0..500 {
        if let Some(e) = events_since(since, "connection")
            .into_iter()
            .find(|e| e.get("client").and_then(|n| n.as_str()) == Some(want.as_str()))
        {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no connection event for {client}");
}

/// Writes to stderr without interleaving (for diagnostics).
pub fn note(s: &str) {
    let _ = writeln!(std::io::stderr(), "{s}");
}
