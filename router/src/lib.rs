//! agent-sandbox-router: the only way out of a sandbox session, and a standalone egress allowlist gateway.
//!
//! How it fits: the launcher writes a [`RouterConfig`](agent_sandbox_shared::RouterConfig) from the
//! session plan and starts this binary on the session's internal network and the shared egress network;
//! the standalone gateway builds the same configuration from flags ([`cli`]). [`bind`] opens every listener
//! (so a bad address fails before anything is served), then [`run`] serves DNS ([`dns`]) and the TLS, HTTP
//! and host:port listeners ([`proxy`]) until the shutdown token is cancelled.

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

/// Binds every listener of the configuration; the error names the address that failed.
pub async fn bind(config: &ValidConfig) -> anyhow::Result<Listeners> {
    let listen = &config.raw.listen;
    let mut listeners = Listeners {
        dns_udp: Vec::new(),
        dns_tcp: None,
        http: None,
        https: None,
        forwards: Vec::new(),
    };
    if let Some(addr) = listen.dns {
        let (udp, tcp) = bind_dns(addr)?;
        listeners.dns_udp = udp;
        listeners.dns_tcp = Some(tcp);
    }
    if let Some(addr) = listen.http {
        listeners.http =
            Some(bind_tcp(addr).with_context(|| format!("cannot listen for HTTP on {addr}"))?);
    }
    if let Some(addr) = listen.https {
        listeners.https =
            Some(bind_tcp(addr).with_context(|| format!("cannot listen for TLS on {addr}"))?);
    }
    for (host, port, addr) in &config.forwards {
        let l = bind_tcp(*addr)
            .with_context(|| format!("cannot listen for the entry {host}:{port} on {addr}"))?;
        listeners.forwards.push((host.clone(), *port, l));
    }
    Ok(listeners)
}

/// DNS sockets: one UDP socket per core sharing the port, and TCP on the same port. With port 0 (tests),
/// TCP takes the port UDP was given; if another socket already has that TCP port, try another.
fn bind_dns(addr: SocketAddr) -> anyhow::Result<(Vec<UdpSocket>, TcpListener)> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let attempts = if addr.port() == 0 { 20 } else { 1 };
    let mut last_error = None;
    for _ in 0..attempts {
        let udp = dns_udp::bind_many(addr, cores)
            .with_context(|| format!("cannot listen for DNS on {addr} (udp)"))?;
        let tcp_addr = udp
            .first()
            .and_then(|s| s.local_addr().ok())
            .unwrap_or(addr);
        match bind_tcp(tcp_addr) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last_error = Some((tcp_addr, e)),
        }
    }
    let (tcp_addr, e) = last_error.expect("the loop runs at least once");
    Err(anyhow::Error::new(e).context(format!("cannot listen for DNS on {tcp_addr} (tcp)")))
}

/// A TCP listener with SO_REUSEADDR (a restarted router must not wait out TIME_WAIT) and a deep backlog.
fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves every listener until `shutdown` is cancelled, then stops within [`SHUTDOWN_GRACE`].
pub async fn run(
    config: ValidConfig,
    listeners: Listeners,
    stats: Arc<DnsStats>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Everything that can fail is set up before anything is served.
    let proxy = Arc::new(proxy::Proxy::new(&config).context("cannot set up the proxy")?);
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
