//! The router's TCP side: TLS routed by SNI, HTTP routed by Host, and one listener per host:port entry.
//!
//! How it fits: [`crate::run`] builds one [`Proxy`] per worker from the validated configuration and the
//! shared [`LiveRules`], and hands each TCP listener to [`Proxy::serve_https`], [`Proxy::serve_http`] or
//! [`Proxy::serve_forward`]. The files, in the order a connection meets them:
//!
//! - [`listener`]: the accept loop, the connection slots (the shared cap) and the per-client cap
//!   ([`crate::fairness`]), one task per connection. DNS over TCP ([`crate::dns_tcp`]) is accepted by
//!   the same loop, under the same caps.
//! - [`tls_conn`], [`http_conn`], [`forward_conn`]: the three connection drivers. Each takes one snapshot
//!   of the rules when it has the name to decide on (the ClientHello or first request head read; the
//!   accept for an entry's own port) and decides on the name the client sent (SNI, Host, or the
//!   entry itself) by the shared [`Policy`](agent_sandbox_shared::Policy) — normalised once, matched once.
//!   The parsers they drive are pure: [`tls`] (ClientHello) and [`http`] (request heads, bodies).
//! - [`dial`]: the one way any driver reaches an upstream: always the decided name, resolved and checked
//!   by [`upstream`], never an address the client chose, and only once the decision is made.
//! - [`relay`]: moving bytes once a connection is decided, until both sides end or neither has sent a
//!   byte for the idle timeout. [`guard`]: how shutdown and the idle timeout sit beside a connection's
//!   work without being polled at every wake-up.
//! - [`conn_log`]: the one `connection` event per connection and every `refused` event
//!   (the contract is [`agent_sandbox_shared::logs`]); [`refusal`]: every text a refused client sees.
//!
//! HTTP specifics: every request head on a kept-alive connection is parsed and must name the same host
//! as the first (request boundaries are tracked through Content-Length and chunked bodies); responses
//! are relayed raw. A WebSocket upgrade is honoured on the first request of a connection only, and only
//! for a complete RFC 6455 opening handshake (see [`http`]) — the router reads the upstream's answer to
//! it, and only after a `101` with `Upgrade: websocket` and the `Sec-WebSocket-Accept` for the request's
//! key does the client side go raw. Any other `101` gets the client a `502` and ends the connection; any
//! other final answer is relayed, and nothing more is forwarded on that connection. Each
//! client connection has its own upstream connection: pooling upstream connections across clients (as
//! an nginx `keepalive` upstream does) would mix clients on one upstream stream.
//!
//! What this cannot see: on 443 the router reads only the ClientHello, so a client may send an allowed SNI
//! and then, inside the encrypted stream, a Host header for another site served by the same upstream
//! (domain fronting). Preventing that needs TLS interception, which this design deliberately avoids; the
//! upstream is still the allowed name's own server. Encrypted Client Hello would hide the real name
//! behind an allowed public one, so a hello carrying ECH (or ESNI) is refused, a dummy ("GREASE") one
//! included: it looks the same by design ([`tls::HelloError::EncryptedHello`]).

pub mod cache;
pub(crate) mod conn_log;
mod dial;
mod forward_conn;
mod guard;
pub mod http;
mod http_conn;
mod listener;
pub(crate) mod refusal;
pub mod relay;
pub mod retry;
pub mod routes;
pub mod tls;
mod tls_conn;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_shared::{HostName, ValidConfig};
use tokio::net::TcpListener;

pub use agent_sandbox_shared::logs::Kind;

use self::conn_log::ConnLog;
pub use self::listener::Stop;
use self::refusal::Refusals;
use self::upstream::Upstream;
use crate::dns::DnsHandler;
use crate::fairness::Bounds;
use crate::inject::Injector;
use crate::live::{Live, LiveRules};
use crate::metrics::{CloseReason, Listener};

/// The longest client-supplied name put in a log line or a response.
const MAX_SHOWN_NAME: usize = 256;

/// Read size while peeking at a hello or a request head. Small: a typical ClientHello (with a
/// post-quantum key share, more than one TCP segment) or request head fits, and a thousand clients
/// connecting at once should not each pin a large buffer.
const PEEK_READ: usize = 4 * 1024;

/// The TCP side of the router: shared by every listener of one worker.
#[derive(Debug)]
pub struct Proxy {
    /// The rules every new connection takes one snapshot of (a reload replaces them for all workers).
    rules: LiveRules,
    /// Resolution, the address check and dialling.
    upstream: Upstream,
    /// The connection caps (global and per client), the wildcard budget and the resolver cache, shared
    /// with the other workers.
    pub(crate) bounds: Bounds,
    /// How long a client may take to send its ClientHello or request head.
    pub(crate) peek_timeout: Duration,
    /// No byte in either direction for this long closes a relay or an idle kept-alive connection.
    idle_timeout: Duration,
    /// The texts refused clients see.
    refusals: Refusals,
    /// Whether refusals go through the worker's [`coalesce`](crate::coalesce)r: always in the
    /// router; not in a test proxy from [`Proxy::new`], whose tests match each refusal to its
    /// connection (and whose multi-threaded test runtimes have no per-worker flush task).
    coalesce: bool,
    /// Credential injection: the names whose TLS is terminated and what that needs (issue 20);
    /// `None`: every allowed SNI is spliced.
    inject: Option<Arc<Injector>>,
}

impl Proxy {
    /// A proxy of its own (rules and bounds not shared with anything), logging every refusal on a line
    /// of its own: what tests use. Loads the `[inject]` section's files, if any.
    pub fn new(config: &ValidConfig) -> anyhow::Result<Proxy> {
        let mut proxy = Proxy::with_shared(
            config,
            Live::new(config.rules.clone()),
            Bounds::new(&config.limits),
        )?;
        proxy.coalesce = false;
        proxy.inject = load_inject(config)?;
        Ok(proxy)
    }

    /// [`Proxy::new`] with `store` standing in for the OAuth token store of the `[inject]` section (the
    /// tests of the terminated token exchange).
    #[cfg(feature = "test-support")]
    pub fn with_test_oauth(
        config: &ValidConfig,
        store: crate::inject::oauth_hook::TestStore,
    ) -> anyhow::Result<Proxy> {
        let mut proxy = Proxy::new(&ValidConfig {
            inject: None,
            ..config.clone()
        })?;
        let inject = config
            .inject
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no [inject] section"))?;
        proxy.inject = Some(Arc::new(Injector::load_with(
            inject,
            Some(Arc::new(store)),
        )?));
        Ok(proxy)
    }

    /// This proxy terminating TLS for the names `inject` covers (loaded once, shared by the workers).
    #[must_use]
    pub(crate) fn with_inject(mut self, inject: Option<Arc<Injector>>) -> Proxy {
        self.inject = inject;
        self
    }

    /// Builds the resolver (`config.resolvers`, or the system's /etc/resolv.conf and /etc/hosts when
    /// empty), and learns the router's own addresses for the dial check; `rules` and `bounds` are shared
    /// with the other workers. Also raises the soft descriptor limit to the hard one:
    /// each relayed connection holds two sockets and two pipes.
    pub fn with_shared(
        config: &ValidConfig,
        rules: LiveRules,
        bounds: Bounds,
    ) -> anyhow::Result<Proxy> {
        raise_fd_limit();
        let upstream = Upstream::new(
            &config.resolvers,
            config.limits.connect_timeout,
            Arc::clone(&bounds.cache),
        )?;
        // The addresses DNS hands out are this router (or its forwarders) as far as clients know: a
        // name resolving there upstream must not loop back into the router (behind NAT the answer
        // address need not be on an interface).
        let answers = &config.rules.answers;
        upstream.add_own_address(answers.default.into());
        for a in answers.hosts.values() {
            upstream.add_own_address((*a).into());
        }
        Ok(Proxy {
            rules,
            upstream,
            bounds,
            peek_timeout: config.limits.peek_timeout,
            idle_timeout: config.limits.idle_timeout,
            refusals: Refusals::new(config.allowlist.clone()),
            coalesce: true,
            inject: None,
        })
    }

    /// Treats `ip` as one of the router's own addresses from now on (a reload added a DNS answer).
    pub(crate) fn add_own_address(&self, ip: std::net::IpAddr) {
        self.upstream.add_own_address(ip);
    }

    /// TLS on the HTTPS listener: peek at the ClientHello, decide on its SNI, dial name:443, write the
    /// buffered bytes unchanged, relay.
    pub async fn serve_https(self: Arc<Self>, listener: TcpListener, stop: impl Into<Stop>) {
        self.accept_loop(listener, Kind::Tls, stop.into(), |proxy, stream, peer| {
            proxy.handle_tls(stream, peer)
        })
        .await;
    }

    /// HTTP on the HTTP listener: Host routing, the same Host for every request on a kept-alive
    /// connection, raw relay after a `101 Switching Protocols`.
    pub async fn serve_http(self: Arc<Self>, listener: TcpListener, stop: impl Into<Stop>) {
        self.accept_loop(listener, Kind::Http, stop.into(), |proxy, stream, peer| {
            proxy.handle_http(stream, peer)
        })
        .await;
    }

    /// One host:port entry: every connection goes to `host:port` only, without peeking.
    pub async fn serve_forward(
        self: Arc<Self>,
        listener: TcpListener,
        host: HostName,
        port: u16,
        stop: impl Into<Stop>,
    ) {
        let host = Arc::new(host);
        self.accept_loop(
            listener,
            Kind::Forward,
            stop.into(),
            move |proxy, stream, peer| proxy.handle_forward(stream, peer, Arc::clone(&host), port),
        )
        .await;
    }
}

impl Proxy {
    /// Runs `work` (a connection's relaying) until it ends, or until no byte has moved in either
    /// direction on `log`'s counters for the idle timeout (`None`: closed as idle; dropping `work`
    /// and then the sockets closes both sides).
    pub(crate) async fn until_idle<T>(
        &self,
        log: &ConnLog,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        let work = std::pin::pin!(work);
        let idle = std::pin::pin!(relay::idle(
            &log.bytes_up,
            &log.bytes_down,
            self.idle_timeout
        ));
        match guard::Guarded::new(work, idle).await {
            guard::Ended::Work(r) => Some(r),
            guard::Ended::Stop(()) => {
                self.bounds.metrics.closed(CloseReason::IdleTimeout);
                tracing::debug!(
                    idle_s = self.idle_timeout.as_secs(),
                    "closed after the idle timeout"
                );
                None
            }
        }
    }

    /// DNS over TCP: each connection answered by [`crate::dns_tcp`] with `handler`, under the same
    /// connection caps as every other listener; idle after the peek timeout.
    pub async fn serve_dns_tcp(
        self: Arc<Self>,
        listener: TcpListener,
        handler: Arc<DnsHandler>,
        stop: impl Into<Stop>,
    ) {
        let idle = self.peek_timeout;
        self.accept_loop(listener, Kind::Dns, stop.into(), move |_, stream, peer| {
            let handler = Arc::clone(&handler);
            async move {
                // No policy decision per connection (each query is decided and counted): a DNS
                // connection that got past the caps counts as allowed.
                handler
                    .metrics()
                    .connection(Listener::DnsTcp, crate::metrics::Decision::Allowed);
                crate::dns_tcp::serve_connection(stream, peer, &handler, idle).await;
            }
        })
        .await;
    }
}

/// Loads what the configuration's `[inject]` section names; `None` without one. Fails (the router does
/// not start) on anything unreadable or invalid.
pub(crate) fn load_inject(config: &ValidConfig) -> anyhow::Result<Option<Arc<Injector>>> {
    config
        .inject
        .as_ref()
        .map(|i| Injector::load(i).map(Arc::new))
        .transpose()
        .map_err(anyhow::Error::new)
}

/// A client-supplied name made safe for a log line or a response: escaped, truncated.
#[must_use]
pub fn show(raw: &[u8]) -> String {
    // Every connection shows its name once. A name of printable ASCII that escaping leaves alone (no
    // quote or backslash) is its own escape: copied, without [`escape_and_cut`]'s work per character.
    if raw
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && !matches!(b, b'\\' | b'"' | b'\''))
    {
        let kept = &raw[..raw.len().min(MAX_SHOWN_NAME)];
        let mut out = String::from_utf8_lossy(kept).into_owned();
        if raw.len() > MAX_SHOWN_NAME {
            out.push('…');
        }
        return out;
    }
    escape_and_cut(raw)
}

/// [`show`] for any bytes: each character escaped as `escape_debug` does, each byte of invalid UTF-8 as
/// `\xNN`, cut after [`MAX_SHOWN_NAME`] bytes with `…`.
fn escape_and_cut(raw: &[u8]) -> String {
    let mut out = String::new();
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            out.extend(c.escape_debug());
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
        if out.len() > MAX_SHOWN_NAME {
            break;
        }
    }
    if out.len() > MAX_SHOWN_NAME {
        let mut cut = MAX_SHOWN_NAME;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// Descriptors the router holds besides its connections' (listeners, the resolver's sockets, the
/// admin endpoint and its connections, the allowlist watch, standard streams), with room to spare.
const BASE_DESCRIPTORS: u64 = 128;

/// What `max_connections` connections need at most: two descriptors each (the client's socket and the
/// upstream's) for every one of them to be served, and four more each (a pipe per direction) for every
/// relay to splice at once. Both include [`BASE_DESCRIPTORS`].
#[must_use]
pub fn descriptors_needed(max_connections: usize) -> (u64, u64) {
    let n = u64::try_from(max_connections).unwrap_or(u64::MAX);
    (
        n.saturating_mul(2).saturating_add(BASE_DESCRIPTORS),
        n.saturating_mul(6).saturating_add(BASE_DESCRIPTORS),
    )
}

/// What a descriptor limit too low for `--max-connections` costs ([`descriptor_shortfall`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// Not every connection can be served: past the limit, accepts fail and new connections wait in
    /// the kernel's backlog. Logged as a warning.
    Connections(String),
    /// Every connection fits, but not a pipe for every bulk direction: past it, bulk relays copy
    /// instead of splicing, at more CPU. Logged as information (a session rarely nears the cap).
    Pipes(String),
}

/// What to tell the operator when the soft descriptor limit `limit` is below what `max_connections`
/// needs ([`descriptors_needed`]); `None` when it holds every connection, and with `splice` (bulk
/// directions splice: `AGENT_SANDBOX_SPLICE`) every relay splicing in both directions.
#[must_use]
pub fn descriptor_shortfall(limit: u64, max_connections: usize, splice: bool) -> Option<Shortfall> {
    let (serve, splicing) = descriptors_needed(max_connections);
    if limit >= splicing || (!splice && limit >= serve) {
        None
    } else if limit < serve {
        let also = if splice {
            format!(" ({splicing} for every bulk relay to splice)")
        } else {
            String::new()
        };
        Some(Shortfall::Connections(format!(
            "the descriptor limit (RLIMIT_NOFILE) is {limit}, but {max_connections} connections \
             (--max-connections) need about {serve}: past the limit, new connections wait unserved. \
             Raise the hard limit (ulimit -Hn, systemd's LimitNOFILE, podman's --ulimit nofile=N:N, \
             the container runtime's default) to at least {serve}{also}, or lower --max-connections \
             to {}",
            limit.saturating_sub(BASE_DESCRIPTORS) / 2
        )))
    } else {
        let pipes = (limit - serve) / 2;
        Some(Shortfall::Pipes(format!(
            "the descriptor limit (RLIMIT_NOFILE) is {limit}: {max_connections} connections \
             (--max-connections) fit, with room for {pipes} splice pipes beside them (one per bulk \
             direction, two descriptors each); bulk directions past that copy instead of splicing. A \
             limit of {splicing} lets every one splice"
        )))
    }
}

/// The soft RLIMIT_NOFILE now (`None` if it cannot be read).
#[must_use]
pub fn descriptor_limit() -> Option<u64> {
    crate::rlimit::nofile().ok().map(|(soft, _)| soft)
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit.
pub(crate) fn raise_fd_limit() {
    crate::rlimit::raise_nofile_to_hard();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_for_connections_and_their_pipes() {
        assert_eq!(descriptors_needed(1), (130, 134));
        assert_eq!(descriptors_needed(4096), (8_320, 24_704));
        assert_eq!(descriptors_needed(usize::MAX), (u64::MAX, u64::MAX));
        // Enough for every direction to splice: nothing to say.
        assert_eq!(descriptor_shortfall(24_704, 4096, true), None);
        assert_eq!(descriptor_shortfall(1_048_576, 4096, true), None);
        // Copying (the default), every connection fitting is enough.
        assert_eq!(descriptor_shortfall(8_320, 4096, false), None);
        // Every connection fits, not every pipe: how many pipes do.
        let Some(Shortfall::Pipes(note)) = descriptor_shortfall(20_000, 4096, true) else {
            panic!("a pipe shortfall");
        };
        assert!(note.contains("room for 5840 splice pipes"), "{note}");
        assert!(note.contains("A limit of 24704"), "{note}");
        assert!(matches!(
            descriptor_shortfall(8_320, 4096, true),
            Some(Shortfall::Pipes(n)) if n.contains("room for 0 splice pipes")
        ));
        // Not every connection fits: the limit to raise it to, or the cap that fits.
        let Some(Shortfall::Connections(warning)) = descriptor_shortfall(8_319, 4096, false) else {
            panic!("a connection shortfall");
        };
        assert!(warning.contains("need about 8320"), "{warning}");
        assert!(!warning.contains("splice"), "{warning}");
        let Some(Shortfall::Connections(warning)) = descriptor_shortfall(8_319, 4096, true) else {
            panic!("a connection shortfall");
        };
        assert!(
            warning.contains("(24704 for every bulk relay to splice)"),
            "{warning}"
        );
        assert!(
            warning.contains("lower --max-connections to 4095"),
            "{warning}"
        );
        let Some(Shortfall::Connections(warning)) = descriptor_shortfall(1024, 4096, false) else {
            panic!("a connection shortfall");
        };
        assert!(
            warning.contains("lower --max-connections to 448"),
            "{warning}"
        );
        let Some(Shortfall::Connections(warning)) = descriptor_shortfall(0, 1, false) else {
            panic!("a connection shortfall");
        };
        assert!(
            warning.contains("lower --max-connections to 0"),
            "{warning}"
        );
    }

    #[test]
    fn show_escapes_and_truncates() {
        assert_eq!(show(b"a.com"), "a.com");
        assert_eq!(show(b"a\0b\r\n"), "a\\0b\\r\\n");
        assert_eq!(show(b"\xff"), "\\xff");
        let long = show(&[b'a'; 1000]);
        assert!(long.len() <= MAX_SHOWN_NAME + 3, "{}", long.len());
        assert!(long.ends_with('…'));
    }

    #[test]
    fn show_fast_path_is_the_escaping() {
        let mut inputs: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for b in 0..=255u8 {
            inputs.push([b"api.", &[b][..], b".example.com"].concat());
        }
        for len in [
            0,
            1,
            MAX_SHOWN_NAME - 1,
            MAX_SHOWN_NAME,
            MAX_SHOWN_NAME + 1,
            1000,
        ] {
            inputs.push(vec![b'x'; len]);
            inputs.push([&vec![b'x'; len][..], b"\\"].concat());
        }
        for raw in inputs {
            assert_eq!(show(&raw), escape_and_cut(&raw), "{raw:?}");
        }
    }
}
