//! The workers and the process's life: start, serve, reload, drain, stop.
//!
//! How it fits: [`run`] takes the sockets [`crate::bind_workers`] bound and serves them with one
//! single-threaded runtime per worker (nginx's model: each worker an event loop of its own, accepting on
//! its own SO_REUSEPORT sockets, no cross-thread wake-ups). Everything the workers share is in
//! [`Shared`]: the live rules, the connection cap, the metrics. The first worker also runs the process's
//! control tasks: the admin endpoint ([`crate::admin`]), the allowlist watch ([`crate::watch`]), the
//! reload task ([`crate::reload`], which talks to every worker through a [`Command`] channel to open and
//! close `host:port` listeners), and the drain.
//!
//! Stopping: [`Handles::terminate`] (SIGTERM) with a drain time first stops accepting everywhere (the
//! listeners close, `/readyz` answers 503), lets the connections in flight go on until they end or the
//! drain time runs out, then stops; without one, or on a second SIGTERM, it stops at once, and in-flight
//! work gets [`SHUTDOWN_GRACE`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_shared::logs::LISTENING_ON;
use agent_sandbox_shared::{HostName, ValidConfig};
use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::AdminState;
use crate::bind::{Listeners, WorkerSockets};
use crate::fairness::Bounds;
use crate::live::{Live, LiveRules};
use crate::metrics::{CloseReason, DnsResult, Metrics, RefusalReason};
use crate::proxy::Stop;
use crate::reload::{Reloader, Source};
use crate::watch::{AllowlistWatch, Fingerprint, Settled};
use crate::{admin, coalesce, dns, dns_udp, proxy};

/// How long in-flight work may take to finish after shutdown is requested. SIGTERM must exit within a
/// second, so this stays well under it.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(400);

/// How long the first worker waits for the others to be set up before it reports readiness.
const WORKER_SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a drain looks whether every connection has ended.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// How the process is driven, beyond the configuration.
#[derive(Default)]
pub struct Control {
    /// Cancelled: stop now (in-flight work gets [`SHUTDOWN_GRACE`]).
    pub shutdown: CancellationToken,
    /// How long connections in flight may go on after a first [`Handles::terminate`]; zero: stop at once.
    pub drain_for: Duration,
    /// How a reload re-reads the configuration; `None`: reloads are refused (logged) and nothing is
    /// watched.
    pub reload: Option<Source>,
    /// Files whose content changes trigger a reload (the allowlist; the configuration file), each with
    /// the fingerprint of the content the configuration in force was built from
    /// ([`crate::cli::Built::read`]): any other content is a change.
    pub watch: Vec<(PathBuf, Fingerprint)>,
    /// The admin endpoint's listener (`--admin`), bound by the caller.
    pub admin: Option<std::net::TcpListener>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("drain_for", &self.drain_for)
            .field("reload", &self.reload.is_some())
            .field("watch", &self.watch)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

/// What the binary's signal handlers act on; given to `run`'s `start`.
#[derive(Clone, Debug)]
pub struct Handles {
    /// Stop now.
    shutdown: CancellationToken,
    /// Stop accepting and let the connections finish (a child of `shutdown`).
    drain: CancellationToken,
    /// Whether a drain is configured.
    drains: bool,
    /// Asks the reload task to re-read the configuration.
    reload: Arc<Notify>,
}

impl Handles {
    /// SIGTERM/SIGINT: the first one drains when a drain time is set, anything else stops at once.
    pub fn terminate(&self) {
        if self.drains && !self.drain.is_cancelled() {
            self.drain.cancel();
        } else {
            self.shutdown.cancel();
        }
    }

    /// SIGHUP: re-read the configuration (requests during a reload fold into one more).
    pub fn reload(&self) {
        self.reload.notify_one();
    }
}

/// A change a reload asks of one worker.
#[derive(Debug)]
pub(crate) enum Command {
    /// Serve a new `host:port` entry on this bound socket until `accepting` is cancelled.
    Forward {
        /// The entry's host.
        host: HostName,
        /// The entry's port.
        port: u16,
        /// This worker's socket for it.
        socket: std::net::TcpListener,
        /// Cancelled when a later reload removes the entry (or on drain).
        accepting: CancellationToken,
    },
    /// An address DNS now answers with: never dial it (it is the router, as clients see it).
    OwnAddress(IpAddr),
}

/// What every worker shares.
#[derive(Clone, Debug)]
struct Shared {
    /// The policy and answers; one snapshot per DNS query and per new connection.
    rules: LiveRules,
    /// The connection caps (global and per client), the wildcard budget and the resolver cache; they
    /// count into `metrics`.
    bounds: Bounds,
    /// Every counter the admin endpoint exposes and the exit log sums up (DNS, connections, bounds).
    metrics: Arc<Metrics>,
    /// Cancelled: stop everything now.
    shutdown: CancellationToken,
    /// Cancelled: stop accepting (a child of `shutdown`).
    drain: CancellationToken,
    /// Each `host:port` entry's "stop accepting" token (children of `drain`), the same for every
    /// worker's listener of that entry, so a reload can close them all.
    forward_stops: Arc<BTreeMap<(HostName, u16), CancellationToken>>,
    /// Credential injection, loaded once at start (the CA, the leaf, the keys), for every worker.
    inject: Option<Arc<crate::inject::Injector>>,
}

/// Serves `sets` (from [`crate::bind_workers`]) with one single-threaded runtime per worker, the first on
/// the calling thread, until `control.shutdown` is cancelled or a worker fails (which stops them all).
/// `start` runs in the first worker's runtime before its listeners are reported ("listening on …"
/// lines); the binary installs its signal handlers there, acting on the [`Handles`].
///
/// The rules live in one [`Live`] holder shared by every worker: replacing its value (a reload) applies
/// to the next DNS query and the next connection of every worker at once.
pub fn run(
    config: ValidConfig,
    sets: Vec<WorkerSockets>,
    control: Control,
    start: impl FnOnce(Handles) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    // Once for the process, before any worker: the limit every connection and pipe counts against.
    proxy::raise_fd_limit();
    if let Some(limit) = proxy::descriptor_limit() {
        match proxy::descriptor_shortfall(
            limit,
            config.limits.max_connections.get(),
            proxy::relay::splice_enabled(),
        ) {
            Some(proxy::Shortfall::Connections(warning)) => tracing::warn!(limit, "{warning}"),
            Some(proxy::Shortfall::Pipes(note)) => tracing::info!(limit, "{note}"),
            None => {}
        }
    }
    let shutdown = control.shutdown.clone();
    let drain = shutdown.child_token();
    let metrics = Arc::new(Metrics::new());
    metrics.policy_loaded(config.rules.policy.entries().len());
    let admin_state = Arc::new(AdminState::new(Arc::clone(&metrics)));
    admin_state.set_policy_loaded(true);
    let forward_stops: BTreeMap<_, _> = config
        .forwards
        .iter()
        .map(|(host, port, _)| ((host.clone(), *port), drain.child_token()))
        .collect();
    // Fail closed: an `[inject]` section that cannot be served stops the router here.
    let inject = proxy::load_inject(&config).context("cannot set up credential injection")?;
    let shared = Shared {
        inject,
        rules: Live::new(config.rules.clone()),
        bounds: Bounds::with_metrics(&config.limits, Arc::clone(&metrics)),
        metrics,
        shutdown: shutdown.clone(),
        drain: drain.clone(),
        forward_stops: Arc::new(forward_stops),
    };
    let handles = Handles {
        shutdown: shutdown.clone(),
        drain,
        drains: !control.drain_for.is_zero(),
        reload: Arc::new(Notify::new()),
    };
    let metrics = Arc::clone(&shared.metrics);
    let mut sets = sets.into_iter();
    let first = sets.next().context("no worker sockets were bound")?;
    let mut senders = Vec::new();
    let (first_tx, first_rx) = mpsc::unbounded_channel();
    senders.push(first_tx);
    // Each other worker reports here once it is set up; a worker that fails (or panics) first drops its
    // sender without a word.
    let (set_up, set_up_rx) = std::sync::mpsc::channel::<()>();
    let mut others = Vec::new();
    let mut outcome: anyhow::Result<()> = Ok(());
    for (i, set) in sets.enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        let (config, shared, set_up) = (config.clone(), shared.clone(), set_up.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("worker-{}", i + 1))
            .spawn(move || {
                // However this worker ends (error or panic included), every worker stops.
                let _stop_all = shared.shutdown.clone().drop_guard();
                serve_worker(
                    set,
                    config,
                    shared,
                    rx,
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
        let ready_state = Arc::clone(&admin_state);
        let reloader = Reloader::new(
            control.reload,
            &config,
            shared.rules.clone(),
            Arc::clone(&shared.forward_stops),
            shared.drain.clone(),
            senders,
            Arc::clone(&shared.metrics),
        );
        let controls = ControlTasks {
            handles: handles.clone(),
            admin: control.admin,
            admin_state,
            watch: control.watch,
            reloader,
            drain_for: control.drain_for,
            limit: Arc::clone(&shared.bounds.limit),
            max_connections: config.limits.max_connections.get(),
        };
        outcome = serve_worker(
            first,
            config,
            shared,
            first_rx,
            move || {
                start(handles)?;
                controls.spawn()
            },
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
                ready_state.set_listeners_bound(true);
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
    let answered = metrics.dns_queries(DnsResult::Answered);
    let refused = metrics.dns_queries(DnsResult::Refused);
    let rejected = metrics.dns_queries(DnsResult::Rejected);
    info!(answered, refused, rejected, "DNS queries served");
    let client_cap = metrics.refusals(RefusalReason::PerClientLimit);
    let wildcard_refused = metrics.refusals(RefusalReason::WildcardLookupLimit);
    let wildcard_lookups = metrics.wildcard_lookups();
    let idle_closed = metrics.closes(CloseReason::IdleTimeout);
    let bad_hello = metrics.refusals(RefusalReason::BadHello);
    info!(
        client_cap,
        wildcard_refused, wildcard_lookups, idle_closed, bad_hello, "fairness bounds"
    );
    if outcome.is_ok() && not_ready.load(Ordering::Relaxed) {
        outcome = Err(anyhow::anyhow!(
            "a worker did not finish setting up within {} s",
            WORKER_SETUP_TIMEOUT.as_secs()
        ));
    }
    outcome
}

/// The process's control tasks, run on the first worker.
struct ControlTasks {
    /// Shutdown, drain and reload triggers.
    handles: Handles,
    /// The admin endpoint's listener.
    admin: Option<std::net::TcpListener>,
    /// What `/readyz` and `/metrics` report.
    admin_state: Arc<AdminState>,
    /// Files to watch for a reload, with the fingerprints of the content in force.
    watch: Vec<(PathBuf, Fingerprint)>,
    /// Re-reads and applies the configuration.
    reloader: Reloader,
    /// How long a drain may take.
    drain_for: Duration,
    /// The connection cap: all its permits back means no connection is open.
    limit: Arc<Semaphore>,
    /// The cap's size.
    max_connections: usize,
}

impl ControlTasks {
    /// Spawns every control task on the current (first worker's) runtime.
    fn spawn(self) -> anyhow::Result<()> {
        let ControlTasks {
            handles,
            admin,
            admin_state,
            watch,
            reloader,
            drain_for,
            limit,
            max_connections,
        } = self;
        let shutdown = handles.shutdown.clone();
        if let Some(listener) = admin {
            let listener =
                TcpListener::from_std(listener).context("cannot register the admin listener")?;
            // The admin endpoint outlives a drain: `/readyz` must say 503 while connections finish.
            tokio::spawn(admin::serve(
                listener,
                Arc::clone(&admin_state),
                shutdown.clone(),
            ));
        }
        // The watches wake the reload task through `changed`, SIGHUP through `handles.reload`: a reload
        // a watch asked for applies only content the watches saw settle.
        let changed = Arc::new(Notify::new());
        let settled = Settled::default();
        // The content in force is what the policy was built from; each reload that applies updates it.
        settled.set_in_force(&watch);
        let mut reloader = reloader.tracking(settled.clone());
        if reloader.can_reload() {
            for (path, loaded) in watch {
                tokio::spawn(
                    AllowlistWatch::loaded(path, loaded)
                        .publishing(settled.clone())
                        .run(Arc::clone(&changed), shutdown.clone()),
                );
            }
        }
        let requests = Arc::clone(&handles.reload);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let check = tokio::select! {
                    () = stop.cancelled() => return,
                    () = requests.notified() => None,
                    () = changed.notified() => Some(&settled),
                };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = reloader.reload(check) => {}
                }
            }
        });
        tokio::spawn(drain_then_stop(
            handles,
            admin_state,
            drain_for,
            limit,
            max_connections,
        ));
        Ok(())
    }
}

/// Waits for a drain; then `/readyz` says 503, the listeners are closed (every accept loop watches the
/// drain token), and the process stops once no connection is open or `drain_for` has passed.
async fn drain_then_stop(
    handles: Handles,
    admin: Arc<AdminState>,
    drain_for: Duration,
    limit: Arc<Semaphore>,
    max_connections: usize,
) {
    tokio::select! {
        () = handles.drain.cancelled() => {}
        () = handles.shutdown.cancelled() => return,
    }
    if handles.shutdown.is_cancelled() {
        return;
    }
    admin.start_draining();
    let open = |limit: &Semaphore| max_connections.saturating_sub(limit.available_permits());
    info!(
        open = open(&limit),
        drain_seconds = drain_for.as_secs(),
        "draining: listeners closed, connections in flight may go on for up to {} s",
        drain_for.as_secs()
    );
    let deadline = tokio::time::Instant::now() + drain_for;
    loop {
        if open(&limit) == 0 {
            info!("drained: no connection left");
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let left = open(&limit);
            admin.metrics.closed_many(
                CloseReason::DrainDeadline,
                u64::try_from(left).unwrap_or(u64::MAX),
            );
            warn!(
                open = left,
                "drain time is up: closing the connections still open"
            );
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(DRAIN_POLL) => {}
            () = handles.shutdown.cancelled() => return,
        }
    }
    handles.shutdown.cancel();
}

/// One worker on a single-threaded runtime of its own: `start` runs in it first (the binary's signal
/// handlers and the control tasks, for the first worker), then the sockets are registered and served;
/// `ready` gets the listeners' addresses once the worker is set up.
fn serve_worker(
    set: WorkerSockets,
    config: ValidConfig,
    shared: Shared,
    commands: mpsc::UnboundedReceiver<Command>,
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
        run_worker(config, listeners, shared, commands, move || {
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

/// One worker: serves its listeners (and the ones reloads add) until shutdown, then stops within
/// [`SHUTDOWN_GRACE`]. `ready` is called once everything that can fail is set up, before anything is
/// served.
async fn run_worker(
    config: ValidConfig,
    listeners: Listeners,
    shared: Shared,
    mut commands: mpsc::UnboundedReceiver<Command>,
    ready: impl FnOnce(),
) -> anyhow::Result<()> {
    // Everything that can fail is set up before anything is served.
    let proxy = Arc::new(
        proxy::Proxy::with_shared(&config, shared.rules.clone(), shared.bounds)
            .context("cannot set up the proxy")?
            .with_inject(shared.inject),
    );
    ready();
    let shutdown = shared.shutdown;
    let stop = |accepting: CancellationToken| Stop {
        accepting,
        shutdown: shutdown.clone(),
    };
    let mut tasks = JoinSet::new();
    tasks.spawn(coalesce::flush_task(shutdown.child_token()));

    let handler = Arc::new(dns::DnsHandler::new(
        shared.rules,
        Arc::clone(&shared.metrics),
    ));
    for udp in listeners.dns_udp {
        // DNS over UDP answers through a drain: it holds no connection, and clients may still be
        // pointed here until their configuration catches up.
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
            stop(shared.drain.child_token()),
        ));
    }

    if let Some(l) = listeners.https {
        tasks.spawn(Arc::clone(&proxy).serve_https(l, stop(shared.drain.child_token())));
    }
    if let Some(l) = listeners.http {
        tasks.spawn(Arc::clone(&proxy).serve_http(l, stop(shared.drain.child_token())));
    }
    for (host, port, l) in listeners.forwards {
        let accepting = shared
            .forward_stops
            .get(&(host.clone(), port))
            .cloned()
            .unwrap_or_else(|| shared.drain.child_token());
        tasks.spawn(Arc::clone(&proxy).serve_forward(l, host, port, stop(accepting)));
    }

    loop {
        let command = tokio::select! {
            () = shutdown.cancelled() => break,
            c = commands.recv() => c,
        };
        match command {
            Some(Command::Forward {
                host,
                port,
                socket,
                accepting,
            }) => match TcpListener::from_std(socket) {
                Ok(l) => {
                    if let Ok(addr) = l.local_addr() {
                        info!("{LISTENING_ON}{addr} (forward {host}:{port})");
                    }
                    tasks.spawn(Arc::clone(&proxy).serve_forward(l, host, port, stop(accepting)));
                }
                Err(error) => warn!(%host, port, %error, "cannot serve a new entry's listener"),
            },
            Some(Command::OwnAddress(ip)) => proxy.add_own_address(ip),
            // The reload task is gone (it only ends at shutdown).
            None => shutdown.cancelled().await,
        }
    }
    info!("shutting down");
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        warn!("in-flight work did not finish in time; dropping it");
    }
    // Refusals logged during the grace period: their repeats are counted too.
    coalesce::flush(true);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bind_workers;
    use crate::test_support::{loopback_cli, TempDir};
    use std::sync::atomic::AtomicU64;

    /// One A query over UDP: whether `name` was answered (NoError with an address), or `None` if no
    /// answer came within `wait`.
    fn answered(server: SocketAddr, name: &str, wait: Duration) -> Option<bool> {
        use hickory_proto::op::{Message, Query, ResponseCode};
        use hickory_proto::rr::{Name, RecordType};
        use hickory_proto::serialize::binary::{BinDecodable as _, BinEncodable as _};
        let mut msg = Message::query();
        msg.metadata.id = 0x4242;
        msg.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(wait)).unwrap();
        sock.send_to(&msg.to_bytes().unwrap(), server).unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = sock.recv_from(&mut buf).ok()?;
        let reply = Message::from_bytes(&buf[..n]).unwrap();
        Some(reply.metadata.response_code == ResponseCode::NoError && !reply.answers.is_empty())
    }

    /// Polls `name` until its answer is `want` (true: answered, false: NXDOMAIN), for up to `within`.
    fn wait_for(server: SocketAddr, name: &str, want: bool, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if answered(server, name, Duration::from_secs(1)) == Some(want) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The allowlist is replaced after the policy was loaded but before the watch starts (the start-up
    /// window; here inside `start`, which runs just before the control tasks): the revoked name is
    /// NXDOMAIN within the watch's 5 s, because the watch starts from the content that was loaded,
    /// not from what the file holds when it starts.
    #[test]
    fn a_change_during_start_up_is_applied() {
        let dir = TempDir::new("workers-startup");
        let list = dir.join("allowed-hosts");
        std::fs::write(&list, "keep.test\nrevoked.test\n").unwrap();
        let revoke = list.clone();
        let (dns, server, shutdown) =
            serve_watched(&list, crate::cli::Cli::reload_source, move |_| {
                std::fs::write(&revoke, "keep.test\n")?;
                Ok(())
            });
        let _stop = shutdown.clone().drop_guard();
        let revoked = wait_for(dns, "revoked.test", false, Duration::from_secs(8));
        let kept = answered(dns, "keep.test", Duration::from_secs(5));
        shutdown.cancel();
        server.join().unwrap().unwrap();
        assert!(revoked, "a name revoked during start-up is still answered");
        assert_eq!(kept, Some(true), "keep.test is still allowed");
    }

    /// The real reload source, except that on its first call `path` is rewritten with `torn` just
    /// before the real read and `whole` is put back just after: a rewrite of the file that overlaps the
    /// reload's read (a second save, a deploy step that writes the file twice). The calls are counted.
    fn torn_once(
        inner: Source,
        path: PathBuf,
        torn: &'static str,
        whole: &'static str,
    ) -> (Source, Arc<AtomicU64>) {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&calls);
        let source: Source = Arc::new(move || {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                std::fs::write(&path, torn).unwrap();
                let read = inner();
                std::fs::write(&path, whole).unwrap();
                read
            } else {
                inner()
            }
        });
        (source, calls)
    }

    /// The router on loopback with one worker, serving `list` with `source` as its reload source and
    /// the watch on `list`; `start` gets the signal handles. Returns the DNS address, the server thread
    /// and the shutdown token.
    fn serve_watched(
        list: &std::path::Path,
        source: impl FnOnce(&crate::cli::Cli) -> Source,
        start: impl FnOnce(Handles) -> anyhow::Result<()> + Send + 'static,
    ) -> (
        SocketAddr,
        std::thread::JoinHandle<anyhow::Result<()>>,
        CancellationToken,
    ) {
        let cli = loopback_cli(list);
        let built = cli.build_config().unwrap();
        let config = built.config.validate().unwrap();
        let sets = bind_workers(&config, 1).unwrap();
        let dns = sets[0].dns_udp[0].local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let control = Control {
            shutdown: shutdown.clone(),
            reload: Some(source(&cli)),
            watch: built.read,
            ..Control::default()
        };
        let server = std::thread::spawn(move || run(config, sets, control, start));
        (dns, server, shutdown)
    }

    /// A change whose reload read the file while it was being rewritten (same content, written again)
    /// is skipped, and then reported again once it has stayed put: the revocation is applied seconds
    /// later, not lost until the next edit.
    #[test]
    fn a_skipped_reload_is_retried() {
        let dir = TempDir::new("workers-skipped");
        let list = dir.join("allowed-hosts");
        std::fs::write(&list, "keep.test\nrevoked.test\n").unwrap();
        let mut calls = None;
        let (dns, server, shutdown) = serve_watched(
            &list,
            |cli| {
                let (source, counted) =
                    torn_once(cli.reload_source(), list.clone(), "keep.te", "keep.test\n");
                calls = Some(counted);
                source
            },
            |_| Ok(()),
        );
        let _stop = shutdown.clone().drop_guard();
        assert!(wait_for(dns, "revoked.test", true, Duration::from_secs(5)));
        std::fs::write(&list, "keep.test\n").unwrap();
        let revoked = wait_for(dns, "revoked.test", false, Duration::from_secs(12));
        let kept = answered(dns, "keep.test", Duration::from_secs(5));
        shutdown.cancel();
        server.join().unwrap().unwrap();
        let calls = calls.unwrap().load(Ordering::SeqCst);
        assert!(
            revoked,
            "the revocation was lost after a skipped reload ({calls} reloads)"
        );
        assert!(calls >= 2, "{calls} reloads");
        assert_eq!(kept, Some(true));
    }

    /// A SIGHUP that read the file half-rewritten applies it as it is (an operator's request), and the
    /// watch then puts the file's settled content in force: no name the file does not list stays
    /// allowed.
    #[test]
    fn a_torn_sighup_is_corrected_by_the_watch() {
        let dir = TempDir::new("workers-sighup");
        let list = dir.join("allowed-hosts");
        let whole = "keep.test\nallowed.example.test\n";
        std::fs::write(&list, whole).unwrap();
        let mut calls = None;
        let (handles_tx, handles_rx) = std::sync::mpsc::channel();
        let (dns, server, shutdown) = serve_watched(
            &list,
            |cli| {
                let (source, counted) = torn_once(
                    cli.reload_source(),
                    list.clone(),
                    "keep.test\nallowed.example.te",
                    "keep.test\nallowed.example.test\n",
                );
                calls = Some(counted);
                source
            },
            move |handles| {
                let _ = handles_tx.send(handles);
                Ok(())
            },
        );
        let _stop = shutdown.clone().drop_guard();
        // Once the router answers (and its watch has taken its first look), a SIGHUP.
        assert!(wait_for(dns, "keep.test", true, Duration::from_secs(5)));
        handles_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the signal handles")
            .reload();
        let calls = calls.unwrap();
        // The SIGHUP's reload, then the watch's.
        let deadline = std::time::Instant::now() + Duration::from_secs(12);
        while calls.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let reloads = calls.load(Ordering::SeqCst);
        let listed = wait_for(dns, "allowed.example.test", true, Duration::from_secs(5));
        let torn_name = answered(dns, "allowed.example.te", Duration::from_secs(5));
        shutdown.cancel();
        server.join().unwrap().unwrap();
        assert!(
            reloads >= 2,
            "the watch never corrected the torn SIGHUP ({reloads} reloads)"
        );
        assert!(listed, "the listed name is not answered");
        assert_eq!(
            torn_name,
            Some(false),
            "a name the file does not list is allowed"
        );
    }

    /// A reload whose files are slow to read (here: a source that waits to be released) does not stall
    /// DNS on the worker that runs the reload task, and a shutdown in the middle of it is not held up.
    #[test]
    fn a_slow_reload_read_does_not_stall_dns() {
        let dir = TempDir::new("workers-slow");
        let list = dir.join("allowed-hosts");
        std::fs::write(&list, "keep.test\n").unwrap();
        let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        let entered_tx = std::sync::Mutex::new(entered_tx);
        let (dns, server, shutdown) = serve_watched(
            &list,
            |cli| {
                let inner = cli.reload_source();
                Arc::new(move || {
                    let _ = entered_tx.lock().unwrap().send(());
                    let _ = released.lock().unwrap().recv();
                    inner()
                })
            },
            |handles| {
                handles.reload();
                Ok(())
            },
        );
        let _stop = shutdown.clone().drop_guard();
        let started = entered.recv_timeout(Duration::from_secs(10)).is_ok();
        let during = answered(dns, "keep.test", Duration::from_secs(3));
        drop(release);
        shutdown.cancel();
        server.join().unwrap().unwrap();
        assert!(started, "the reload did not start");
        assert_eq!(during, Some(true), "DNS stalled while a reload was reading");
    }

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
        let control = Control {
            shutdown: stop,
            ..Control::default()
        };
        let server = std::thread::spawn(move || run(config, sets, control, |_| Ok(())));
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
}
