//! agent-sandbox-router: the only way out of a sandbox session, and a standalone egress allowlist gateway.
//!
//! How it fits: the launcher writes a [`RouterConfig`](agent_sandbox_shared::RouterConfig) from the
//! session plan and starts this binary on the session's internal network and the shared egress network;
//! the standalone gateway builds the same configuration from flags ([`cli`]). [`bind_workers`] opens every
//! listener once per worker (so a bad address fails before anything is served); each worker is a
//! single-threaded runtime in which [`run_worker`] serves DNS ([`dns`]) and the TLS, HTTP and host:port
//! listeners ([`proxy`]) until the shutdown token is cancelled. [`bind`] and [`run`] are the same for one
//! worker in the caller's runtime.

pub mod cli;
pub mod dns;
mod dns_udp;
pub mod logging;
pub mod proxy;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_shared::{HostName, ValidConfig};
use anyhow::Context as _;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use dns::DnsStats;

/// How long in-flight work may take to finish after shutdown is requested. SIGTERM must exit within a
/// second, so this stays well under it.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(400);

/// Response buffer per DNS-over-TCP connection.
const DNS_TCP_BUFFER: usize = 64;

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

/// Binds every listener of the configuration for one runtime; the error names the address that failed.
pub async fn bind(config: &ValidConfig) -> anyhow::Result<Listeners> {
    let mut sets = bind_workers(config, 1)?;
    let set = sets.pop().expect("one set per worker");
    set.register()
        .context("cannot register the listeners with the runtime")
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
/// worker steals another's; DNS over UDP gets one socket per worker, DNS over TCP is served by the first.
/// A single worker gets plain sockets.
pub fn bind_workers(config: &ValidConfig, workers: usize) -> anyhow::Result<Vec<WorkerSockets>> {
    let workers = workers.max(1);
    let listen = &config.raw.listen;
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

/// Serves every listener until `shutdown` is cancelled, then stops within [`SHUTDOWN_GRACE`].
pub async fn run(
    config: ValidConfig,
    listeners: Listeners,
    stats: Arc<DnsStats>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let limit = Arc::new(Semaphore::new(config.raw.max_connections.max(1)));
    run_worker(config, listeners, stats, shutdown, limit).await
}

/// [`run`] for one of several workers: the connection cap `limit` is shared by all of them.
pub async fn run_worker(
    config: ValidConfig,
    listeners: Listeners,
    stats: Arc<DnsStats>,
    shutdown: CancellationToken,
    limit: Arc<Semaphore>,
) -> anyhow::Result<()> {
    // Everything that can fail is set up before anything is served.
    let proxy =
        Arc::new(proxy::Proxy::with_limit(&config, limit).context("cannot set up the proxy")?);
    let mut tasks = JoinSet::new();

    let handler = Arc::new(dns::DnsHandler::new(&config, stats));
    for udp in listeners.dns_udp {
        tasks.spawn(dns_udp::serve(
            Arc::new(udp),
            Arc::clone(&handler),
            shutdown.child_token(),
        ));
    }
    let mut dns_server = None;
    if let Some(tcp) = listeners.dns_tcp {
        let mut server = hickory_server::Server::new(dns::SharedHandler(Arc::clone(&handler)));
        server.register_listener(
            tcp,
            Duration::from_secs(config.raw.peek_timeout_secs),
            DNS_TCP_BUFFER,
        );
        dns_server = Some(server);
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
    let drain = async {
        if let Some(server) = dns_server.as_mut() {
            if let Err(error) = server.shutdown_gracefully().await {
                warn!(%error, "DNS server did not stop cleanly");
            }
        }
        while tasks.join_next().await.is_some() {}
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        warn!("in-flight work did not finish in time; dropping it");
    }
    Ok(())
}

/// A human-readable description of the effective configuration, for `--check`.
#[must_use]
pub fn describe(config: &ValidConfig) -> String {
    let raw = &config.raw;
    let mut out = String::new();
    let _ = writeln!(out, "listeners:");
    let opt = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_owned(), |a| a.to_string());
    let _ = writeln!(out, "  dns    {} (udp, tcp)", opt(raw.listen.dns));
    let _ = writeln!(out, "  http   {}", opt(raw.listen.http));
    let _ = writeln!(out, "  https  {}", opt(raw.listen.https));
    for (host, port, addr) in &config.forwards {
        let _ = writeln!(out, "  {addr}  -> {host}:{port} (host:port entry)");
    }
    let _ = writeln!(out, "allowed names (DNS answer, TTL {}s):", raw.answers.ttl);
    if config.policy.is_empty() {
        let _ = writeln!(
            out,
            "  (none: every name is NXDOMAIN and nothing is forwarded)"
        );
    }
    for host in config.policy.exact_hosts() {
        let answer = config
            .host_answers
            .get(host)
            .unwrap_or(&raw.answers.default);
        let _ = writeln!(out, "  {:<40} A {answer}", host.as_str());
    }
    for apex in config.policy.subdomain_apexes() {
        let _ = writeln!(
            out,
            "  {:<40} A {}",
            format!(".{apex} (and subdomains)"),
            raw.answers.default
        );
    }
    let resolvers = if raw.resolvers.is_empty() {
        "system (/etc/resolv.conf, /etc/hosts)".to_owned()
    } else {
        raw.resolvers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "upstream resolvers: {resolvers}");
    let _ = writeln!(
        out,
        "limits: peek timeout {}s, connect timeout {}s, {} connections",
        raw.peek_timeout_secs, raw.connect_timeout_secs, raw.max_connections
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy::upstream::{KEEPALIVE_INTERVAL, KEEPALIVE_RETRIES, KEEPALIVE_TIME};

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
