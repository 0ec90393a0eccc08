//! agent-sandbox-router: the only way out of a sandbox session, and a standalone egress allowlist gateway.
//!
//! How it fits: the launcher writes a [`RouterConfig`](agent_sandbox_shared::RouterConfig) from the
//! session plan and starts this binary on the session's internal network and the shared egress network;
//! the standalone gateway builds the same configuration from flags ([`cli`]). [`bind_workers`] opens every
//! listener once per worker (so a bad address fails before anything is served); each worker is a
//! single-threaded runtime, and [`run`] serves DNS ([`dns`]) and the TLS, HTTP and host:port listeners
//! ([`proxy`]) on all of them until the shutdown token is cancelled. Every worker decides on the same
//! rules, held once in a [`live::Live`] holder that a reload will replace.

pub mod cli;
pub mod coalesce;
pub mod dns;
mod dns_tcp;
mod dns_udp;
pub mod fairness;
pub mod live;
pub mod logging;
pub mod proxy;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_shared::logs::LISTENING_ON;
use agent_sandbox_shared::{HostName, ValidConfig};
use anyhow::Context as _;
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::dns::DnsStats;
use crate::fairness::Bounds;
use crate::live::{Live, LiveRules};

/// How long in-flight work may take to finish after shutdown is requested. SIGTERM must exit within a
/// second, so this stays well under it.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(400);

/// Every socket the router serves, bound before anything is served.
#[derive(Debug)]
pub struct Listeners {
    /// DNS over UDP: several sockets on one port (SO_REUSEPORT), one receive loop each.
    pub dns_udp: Vec<UdpSocket>,
    /// DNS over TCP.
    pub dns_tcp: Option<TcpListener>,
    /// HTTP, routed by Host.
    pub http: Option<TcpListener>,
    /// TLS, routed by SNI.
    pub https: Option<TcpListener>,
    /// One listener per host:port entry.
    pub forwards: Vec<(HostName, u16, TcpListener)>,
}

impl Listeners {
    /// Each listener's bound address and protocol, for the "listening on" lines and tests.
    #[must_use]
    pub fn addresses(&self) -> Vec<(SocketAddr, String)> {
        let mut out = Vec::new();
        let mut push = |addr: std::io::Result<SocketAddr>, proto: String| {
            if let Ok(a) = addr {
                out.push((a, proto));
            }
        };
        if let Some(s) = self.dns_udp.first() {
            push(s.local_addr(), "dns/udp".into());
        }
        if let Some(s) = &self.dns_tcp {
            push(s.local_addr(), "dns/tcp".into());
        }
        if let Some(s) = &self.http {
            push(s.local_addr(), "http".into());
        }
        if let Some(s) = &self.https {
            push(s.local_addr(), "https".into());
        }
        for (host, port, l) in &self.forwards {
            push(l.local_addr(), format!("forward {host}:{port}"));
        }
        out
    }
}

/// The sockets of one worker, bound but not yet registered with a runtime: each worker runs its own
/// single-threaded runtime, and a socket belongs to the runtime that registers it.
#[derive(Debug)]
pub struct WorkerSockets {
    dns_udp: Vec<std::net::UdpSocket>,
    dns_tcp: Option<std::net::TcpListener>,
    http: Option<std::net::TcpListener>,
    https: Option<std::net::TcpListener>,
    forwards: Vec<(HostName, u16, std::net::TcpListener)>,
}

impl WorkerSockets {
    /// Registers the sockets with the current runtime.
    pub fn register(self) -> std::io::Result<Listeners> {
        let tcp = |l: Option<std::net::TcpListener>| l.map(TcpListener::from_std).transpose();
        Ok(Listeners {
            dns_udp: self
                .dns_udp
                .into_iter()
                .map(UdpSocket::from_std)
                .collect::<Result<_, _>>()?,
            dns_tcp: tcp(self.dns_tcp)?,
            http: tcp(self.http)?,
            https: tcp(self.https)?,
            forwards: self
                .forwards
                .into_iter()
                .map(|(h, p, l)| Ok((h, p, TcpListener::from_std(l)?)))
                .collect::<std::io::Result<_>>()?,
        })
    }
}

/// Binds every listener of the configuration once per worker, before anything is served; the error
/// names the address that failed. With several workers each TCP address gets one SO_REUSEPORT socket per
/// worker, so the kernel spreads new connections over the workers (as nginx's `reuseport` does) and no
/// worker steals another's; a single worker gets plain TCP sockets. DNS over UDP gets one SO_REUSEPORT
/// socket per worker; DNS over TCP is served by the first worker.
///
/// An address someone already holds is an error, SO_REUSEPORT or not: each shared address is first
/// bound exclusively, so a second router (or anything else) on the same port is refused rather than
/// joined, and connections are never split between two policies. (Linux lets a socket join a
/// SO_REUSEPORT group only under the same effective uid anyway.)
pub fn bind_workers(config: &ValidConfig, workers: usize) -> anyhow::Result<Vec<WorkerSockets>> {
    let workers = workers.max(1);
    let listen = &config.listen;
    let mut sets: Vec<WorkerSockets> = (0..workers)
        .map(|_| WorkerSockets {
            dns_udp: Vec::new(),
            dns_tcp: None,
            http: None,
            https: None,
            forwards: Vec::new(),
        })
        .collect();
    if let Some(addr) = listen.dns {
        let (udp, tcp) = bind_dns(addr, workers)?;
        for (i, socket) in udp.into_iter().enumerate() {
            sets[i % workers].dns_udp.push(socket);
        }
        sets[0].dns_tcp = Some(tcp);
    }
    if let Some(addr) = listen.http {
        for (set, l) in sets.iter_mut().zip(
            bind_tcp_many(addr, workers)
                .with_context(|| format!("cannot listen for HTTP on {addr}"))?,
        ) {
            set.http = Some(l);
        }
    }
    if let Some(addr) = listen.https {
        for (set, l) in sets.iter_mut().zip(
            bind_tcp_many(addr, workers)
                .with_context(|| format!("cannot listen for TLS on {addr}"))?,
        ) {
            set.https = Some(l);
        }
    }
    for (host, port, addr) in &config.forwards {
        let ls = bind_tcp_many(*addr, workers)
            .with_context(|| format!("cannot listen for the entry {host}:{port} on {addr}"))?;
        for (set, l) in sets.iter_mut().zip(ls) {
            set.forwards.push((host.clone(), *port, l));
        }
    }
    Ok(sets)
}

/// DNS sockets: `count` UDP sockets sharing the port, and TCP on the same port. With port 0 (tests),
/// TCP takes the port UDP was given; if another socket already has that TCP port, try another.
fn bind_dns(
    addr: SocketAddr,
    count: usize,
) -> anyhow::Result<(Vec<std::net::UdpSocket>, std::net::TcpListener)> {
    let attempts = if addr.port() == 0 { 20 } else { 1 };
    if addr.port() != 0 {
        drop(
            std::net::UdpSocket::bind(addr)
                .with_context(|| format!("cannot listen for DNS on {addr} (udp)"))?,
        );
    }
    let mut last_error = None;
    for _ in 0..attempts {
        let udp = dns_udp::bind_many(addr, count)
            .with_context(|| format!("cannot listen for DNS on {addr} (udp)"))?;
        let tcp_addr = udp
            .first()
            .and_then(|s| s.local_addr().ok())
            .unwrap_or(addr);
        match bind_tcp(tcp_addr, false) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last_error = Some((tcp_addr, e)),
        }
    }
    let (tcp_addr, e) = last_error.expect("the loop runs at least once");
    Err(anyhow::Error::new(e).context(format!("cannot listen for DNS on {tcp_addr} (tcp)")))
}

/// `count` listeners on one address: SO_REUSEPORT when more than one (port 0 takes the port the first
/// was given).
fn bind_tcp_many(addr: SocketAddr, count: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let shared = count > 1;
    if shared && addr.port() != 0 {
        // Exclusively first: a listener already on the address (another router's SO_REUSEPORT group
        // included) makes this fail with EADDRINUSE instead of letting the group below join it.
        drop(bind_tcp(addr, false)?);
    }
    let first = bind_tcp(addr, shared)?;
    let addr = first.local_addr()?;
    let mut out = vec![first];
    for _ in 1..count {
        out.push(bind_tcp(addr, shared)?);
    }
    Ok(out)
}

/// A non-blocking TCP listener with SO_REUSEADDR (a restarted router must not wait out TIME_WAIT), a deep
/// backlog, and the options every accepted connection inherits (no Nagle delay, keepalive).
fn bind_tcp(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    proxy::upstream::tune(socket2::SockRef::from(&socket))?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// What every worker shares: the rules, the DNS counters and the connection caps.
#[derive(Clone, Debug)]
struct Shared {
    /// The policy and answers; one snapshot per DNS query and per new connection.
    rules: LiveRules,
    /// DNS counters over all workers.
    stats: Arc<DnsStats>,
    /// The connection caps (global and per client), the wildcard budget, the resolver cache, and
    /// their counters.
    bounds: Bounds,
}

/// One worker: serves its listeners until `shutdown` is cancelled, then stops within
/// [`SHUTDOWN_GRACE`]. `ready` is called once everything that can fail is set up, before anything is
/// served.
async fn run_worker(
    config: ValidConfig,
    listeners: Listeners,
    shared: Shared,
    shutdown: CancellationToken,
    ready: impl FnOnce(),
) -> anyhow::Result<()> {
    // Everything that can fail is set up before anything is served.
    let proxy = Arc::new(
        proxy::Proxy::with_shared(&config, shared.rules.clone(), shared.bounds)
            .context("cannot set up the proxy")?,
    );
    ready();
    let mut tasks = JoinSet::new();
    tasks.spawn(coalesce::flush_task(shutdown.child_token()));

    let handler = Arc::new(dns::DnsHandler::new(shared.rules, shared.stats));
    for udp in listeners.dns_udp {
        tasks.spawn(dns_udp::serve(
            Arc::new(udp),
            Arc::clone(&handler),
            shutdown.child_token(),
        ));
    }
    if let Some(tcp) = listeners.dns_tcp {
        tasks.spawn(Arc::clone(&proxy).serve_dns_tcp(
            tcp,
            Arc::clone(&handler),
            shutdown.child_token(),
        ));
    }

    if let Some(l) = listeners.https {
        tasks.spawn(Arc::clone(&proxy).serve_https(l, shutdown.child_token()));
    }
    if let Some(l) = listeners.http {
        tasks.spawn(Arc::clone(&proxy).serve_http(l, shutdown.child_token()));
    }
    for (host, port, l) in listeners.forwards {
        tasks.spawn(Arc::clone(&proxy).serve_forward(l, host, port, shutdown.child_token()));
    }

    shutdown.cancelled().await;
    info!("shutting down");
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        warn!("in-flight work did not finish in time; dropping it");
    }
    // Refusals logged during the grace period: their repeats are counted too.
    coalesce::flush(true);
    Ok(())
}

/// Serves `sets` (from [`bind_workers`]) with one single-threaded runtime per worker, the first on the
/// calling thread, until `shutdown` is cancelled or a worker fails (which stops them all). `start` runs
/// in the first worker's runtime before its listeners are reported ("listening on …" lines); the binary
/// installs its signal handlers there.
///
/// This is nginx's model: each worker an event loop of its own, accepting on its own SO_REUSEPORT
/// sockets. A current-thread runtime drives I/O and all its tasks from one thread, with no cross-thread
/// wake-ups or work stealing (BENCHMARKS.md has the router's CPU per new connection).
///
/// The rules live in one [`Live`] holder shared by every worker: replacing its value (a reload) applies
/// to the next DNS query and the next connection of every worker at once.
pub fn run(
    config: ValidConfig,
    sets: Vec<WorkerSockets>,
    shutdown: CancellationToken,
    start: impl FnOnce(CancellationToken) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let shared = Shared {
        rules: Live::new(config.rules.clone()),
        stats: Arc::new(DnsStats::default()),
        bounds: Bounds::new(&config.limits),
    };
    let stats = Arc::clone(&shared.stats);
    let counters = Arc::clone(&shared.bounds.counters);
    let mut sets = sets.into_iter();
    let first = sets.next().context("no worker sockets were bound")?;
    // Each other worker reports here once it is set up; a worker that fails (or panics) first drops its
    // sender without a word.
    let (set_up, set_up_rx) = std::sync::mpsc::channel::<()>();
    let mut others = Vec::new();
    let mut outcome: anyhow::Result<()> = Ok(());
    for (i, set) in sets.enumerate() {
        let (config, shared, stop, set_up) = (
            config.clone(),
            shared.clone(),
            shutdown.clone(),
            set_up.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("worker-{}", i + 1))
            .spawn(move || {
                // However this worker ends (error or panic included), every worker stops.
                let _stop_all = stop.clone().drop_guard();
                serve_worker(
                    set,
                    config,
                    shared,
                    stop,
                    || Ok(()),
                    move |_| {
                        let _ = set_up.send(());
                    },
                )
            });
        match spawned {
            Ok(handle) => others.push(handle),
            Err(e) => {
                outcome = Err(anyhow::Error::new(e).context("cannot start a worker thread"));
                break;
            }
        }
    }
    drop(set_up);
    let workers = others.len();
    let not_ready = Arc::new(AtomicBool::new(false));
    if outcome.is_ok() {
        let stop = shutdown.clone();
        let not_ready = Arc::clone(&not_ready);
        outcome = serve_worker(
            first,
            config,
            shared,
            shutdown.clone(),
            || start(shutdown.clone()),
            move |addresses| {
                // Ready only when every worker is: the launcher starts the sandbox on these lines.
                let all =
                    (0..workers).all(|_| set_up_rx.recv_timeout(WORKER_SETUP_TIMEOUT).is_ok());
                if !all {
                    not_ready.store(true, Ordering::Relaxed);
                    stop.cancel();
                }
                if stop.is_cancelled() {
                    return;
                }
                for (addr, proto) in addresses {
                    info!("{LISTENING_ON}{addr} ({proto})");
                }
            },
        );
    }
    // Whatever ended the first worker ends them all.
    shutdown.cancel();
    for handle in others {
        let result = handle
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")));
        if outcome.is_ok() {
            outcome = result;
        }
    }
    let (answered, refused, rejected) = stats.totals();
    info!(answered, refused, rejected, "DNS queries served");
    let (client_cap, wildcard_refused, wildcard_lookups, idle_closed, retry_refused) =
        counters.totals();
    info!(
        client_cap,
        wildcard_refused, wildcard_lookups, idle_closed, retry_refused, "fairness bounds"
    );
    if outcome.is_ok() && not_ready.load(Ordering::Relaxed) {
        outcome = Err(anyhow::anyhow!(
            "a worker did not finish setting up within {} s",
            WORKER_SETUP_TIMEOUT.as_secs()
        ));
    }
    outcome
}

/// How long the first worker waits for the others to be set up before it reports readiness.
const WORKER_SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// One worker on a single-threaded runtime of its own: `start` runs in it first (the binary's signal
/// handlers, for the first worker), then the sockets are registered and served; `ready` gets the
/// listeners' addresses once the worker is set up.
fn serve_worker(
    set: WorkerSockets,
    config: ValidConfig,
    shared: Shared,
    shutdown: CancellationToken,
    start: impl FnOnce() -> anyhow::Result<()>,
    ready: impl FnOnce(Vec<(SocketAddr, String)>),
) -> anyhow::Result<()> {
    let runtime = worker_runtime()?;
    let served = runtime.block_on(async {
        start()?;
        let listeners = set
            .register()
            .context("cannot register the listeners with the runtime")?;
        let addresses = listeners.addresses();
        run_worker(config, listeners, shared, shutdown, move || {
            ready(addresses);
        })
        .await
    });
    // Detached connection tasks must not hold the exit back past the grace period.
    runtime.shutdown_background();
    served
}

/// A single-threaded runtime for one worker.
fn worker_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

/// A human-readable description of the effective configuration, for `--check`.
#[must_use]
pub fn describe(config: &ValidConfig) -> String {
    let (policy, answers) = (&config.rules.policy, &config.rules.answers);
    let mut out = String::new();
    let _ = writeln!(out, "listeners:");
    let opt = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_owned(), |a| a.to_string());
    let _ = writeln!(out, "  dns    {} (udp, tcp)", opt(config.listen.dns));
    let _ = writeln!(out, "  http   {}", opt(config.listen.http));
    let _ = writeln!(out, "  https  {}", opt(config.listen.https));
    for (host, port, addr) in &config.forwards {
        let _ = writeln!(out, "  {addr}  -> {host}:{port} (host:port entry)");
    }
    let _ = writeln!(out, "allowed names (DNS answer, TTL {}s):", answers.ttl);
    if policy.is_empty() {
        let _ = writeln!(
            out,
            "  (none: every name is NXDOMAIN and nothing is forwarded)"
        );
    }
    for host in policy.exact_hosts() {
        let _ = writeln!(out, "  {:<40} A {}", host.as_str(), answers.for_name(host));
    }
    for apex in policy.subdomain_apexes() {
        let _ = writeln!(
            out,
            "  {:<40} A {}",
            format!(".{apex} (and subdomains)"),
            answers.default
        );
    }
    let resolvers = if config.resolvers.is_empty() {
        "system (/etc/resolv.conf, /etc/hosts)".to_owned()
    } else {
        config
            .resolvers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "upstream resolvers: {resolvers}");
    let limits = &config.limits;
    let _ = writeln!(
        out,
        "limits: peek timeout {}s, connect timeout {}s, {} connections ({} per client), idle timeout {}s, {} wildcard lookups per client per minute",
        limits.peek_timeout.as_secs(),
        limits.connect_timeout.as_secs(),
        limits.max_connections,
        limits.max_connections_per_client,
        limits.idle_timeout.as_secs(),
        limits.wildcard_lookups_per_minute
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy::upstream::{KEEPALIVE_INTERVAL, KEEPALIVE_RETRIES, KEEPALIVE_TIME};

    /// Two workers on one HTTP address: every connection is answered whichever worker's socket the
    /// kernel picked, and cancelling the token stops both.
    #[test]
    fn two_workers_serve_one_address_and_stop_together() {
        use std::io::{Read as _, Write as _};
        let toml = "hosts = [\"allowed.test\"]\nresolvers = [\"127.0.0.1:9\"]\n\
                    [listen]\nhttp = \"127.0.0.1:0\"\n[answers]\ndefault = \"127.0.0.2\"\n";
        let config = agent_sandbox_shared::RouterConfig::from_toml(toml)
            .unwrap()
            .validate()
            .unwrap();
        let sets = bind_workers(&config, 2).unwrap();
        assert_eq!(sets.len(), 2);
        let addrs: Vec<SocketAddr> = sets
            .iter()
            .map(|s| s.http.as_ref().unwrap().local_addr().unwrap())
            .collect();
        assert_eq!(addrs[0], addrs[1], "one address, one socket per worker");
        let addr = addrs[0];
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let server = std::thread::spawn(move || run(config, sets, stop, |_| Ok(())));
        // Many client ports, so both workers' sockets get connections.
        for i in 0..64 {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nHost: refused.test\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer);
            assert!(
                answer.starts_with("HTTP/1.1 403"),
                "connection {i}: {answer:?}"
            );
        }
        shutdown.cancel();
        let started = std::time::Instant::now();
        server.join().unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// Another process's SO_REUSEPORT group on the address (a second router, say) is not joined: the
    /// router refuses to start rather than split connections with it.
    #[test]
    fn an_address_held_by_another_reuseport_group_is_refused() {
        use socket2::{Domain, Protocol, Socket, Type};
        let held = |ty: Type, proto: Protocol| {
            let s = Socket::new(Domain::IPV4, ty, Some(proto)).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
                .unwrap();
            if ty == Type::STREAM {
                s.listen(16).unwrap();
            }
            let addr = s.local_addr().unwrap().as_socket().unwrap();
            (s, addr)
        };
        let (_tcp, addr) = held(Type::STREAM, Protocol::TCP);
        let e = bind_tcp_many(addr, 2).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        let (_udp, addr) = held(Type::DGRAM, Protocol::UDP);
        let e = bind_dns(addr, 2).unwrap_err();
        assert!(format!("{e:#}").contains("Address already in use"), "{e:#}");
    }

    /// The per-connection options are set once on the listener: accepted sockets must inherit them.
    #[tokio::test]
    async fn accepted_connections_inherit_the_listener_options() {
        let listener =
            TcpListener::from_std(bind_tcp("127.0.0.1:0".parse().unwrap(), false).unwrap())
                .unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let sock = socket2::SockRef::from(&accepted);
        assert!(sock.tcp_nodelay().unwrap(), "TCP_NODELAY");
        assert!(sock.keepalive().unwrap(), "SO_KEEPALIVE");
        assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_TIME);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_RETRIES);
    }
}
