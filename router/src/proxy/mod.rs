//! The router's TCP side: TLS routed by SNI, HTTP routed by Host, and one listener per host:port entry.
//!
//! How it fits: [`crate::run`] builds one [`Proxy`] from the validated configuration and hands each TCP
//! listener to [`Proxy::serve_https`], [`Proxy::serve_http`] or [`Proxy::serve_forward`]. A connection
//! is decided on the name the client sent (SNI, Host, or the entry itself), by the shared
//! [`Policy`](agent_sandbox_shared::Policy) — normalised once, matched once — and the upstream is always
//! that name, resolved and checked by [`upstream`], never an address the client chose. Nothing that fails
//! to parse is forwarded; the upstream is not even resolved until the decision is made.
//!
//! Logging contract (the launcher's end-of-session report parses it): every refusal is one INFO event
//! with the message `refused` and the fields `kind` (tls|http|forward), `name`, `reason`, `client`; every
//! connection ends with one INFO event `connection` with `client`, `listener`, `name`, `decision`,
//! `upstream`, `bytes_up`, `bytes_down`, `duration_ms`.
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
//! upstream is still the allowed name's own server. Likewise Encrypted Client Hello: the outer SNI is what
//! is routed; the router's DNS hands out no HTTPS/SVCB records, so clients get no ECH configurations from
//! it.

pub mod cache;
pub mod http;
pub mod relay;
pub mod retry;
pub mod tls;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_shared::{HostName, NameError, Policy, Refusal, ValidConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument as _};

use self::http::{BodyFramer, HeadError, HeadReader, RequestHead, Status};
use self::relay::{read_some, shutdown_write, write_all};
use self::tls::{alert_record, AlertDescription, HelloReader};
use self::upstream::{DialError, Upstream};

/// Where the allowlist lives, for the messages refused clients see.
pub const ALLOWLIST_PATH: &str = "~/.config/agent-sandbox/allowed-hosts";

/// The longest client-supplied name put in a log line or a response.
const MAX_SHOWN_NAME: usize = 256;

/// Read size while peeking at a hello or a request head. Small: a typical ClientHello (1.5–2 KB with a
/// post-quantum key share) or request head fits, and a thousand clients connecting at once should not
/// each pin a large buffer.
const PEEK_READ: usize = 4 * 1024;

/// Read size while relaying HTTP request bodies.
const BODY_READ: usize = 64 * 1024;

/// How long a refused client gets to read the refusal before the socket is closed.
const LINGER: Duration = Duration::from_secs(1);

/// The longest pause after an accept error caused by resource exhaustion.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Which listener a connection came in on; also the `kind` of its refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The HTTPS listener (SNI routing).
    Tls,
    /// The HTTP listener (Host routing).
    Http,
    /// A host:port entry's listener.
    Forward,
}

impl Kind {
    /// The name used in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tls => "tls",
            Kind::Http => "http",
            Kind::Forward => "forward",
        }
    }
}

/// The TCP side of the router: shared by every listener.
#[derive(Debug)]
pub struct Proxy {
    /// The compiled allowlist every decision asks.
    policy: Policy,
    /// Resolution, the address check and dialling.
    upstream: Upstream,
    /// The cap on connections handled at once, across all listeners; more wait in the backlog.
    limit: Arc<Semaphore>,
    /// How long a client may take to send its ClientHello or request head.
    peek_timeout: Duration,
}

impl Proxy {
    /// Builds the resolver (`config.raw.resolvers`, or the system's /etc/resolv.conf and /etc/hosts
    /// when empty), the connection cap, the timeouts, and learns the router's own addresses for the dial
    /// check. Also raises the soft descriptor limit to the hard one: each relayed connection holds two
    /// sockets and two pipes.
    pub fn new(config: &ValidConfig) -> anyhow::Result<Proxy> {
        let limit = Arc::new(Semaphore::new(config.raw.max_connections.max(1)));
        Proxy::with_limit(config, limit)
    }

    /// As [`Proxy::new`], with a connection cap shared with other workers' proxies.
    pub fn with_limit(config: &ValidConfig, limit: Arc<Semaphore>) -> anyhow::Result<Proxy> {
        raise_fd_limit();
        let raw = &config.raw;
        let upstream = Upstream::new(
            &raw.resolvers,
            Duration::from_secs(raw.connect_timeout_secs.max(1)),
        )?;
        // The addresses DNS hands out are this router (or its forwarders) as far as clients know: a
        // name resolving there upstream must not loop back into the router (behind NAT the answer
        // address need not be on an interface).
        upstream.add_own_address(raw.answers.default.into());
        for a in raw.answers.hosts.values() {
            upstream.add_own_address((*a).into());
        }
        Ok(Proxy {
            policy: config.policy.clone(),
            upstream,
            limit,
            peek_timeout: Duration::from_secs(raw.peek_timeout_secs.max(1)),
        })
    }

    /// TLS on the HTTPS listener: peek at the ClientHello, decide on its SNI, dial name:443, write the
    /// buffered bytes unchanged, relay.
    pub async fn serve_https(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        self.accept_loop(listener, Kind::Tls, shutdown, |proxy, stream, peer| {
            proxy.handle_tls(stream, peer)
        })
        .await;
    }

    /// HTTP on the HTTP listener: Host routing, the same Host for every request on a kept-alive
    /// connection, raw relay after a `101 Switching Protocols`.
    pub async fn serve_http(self: Arc<Self>, listener: TcpListener, shutdown: CancellationToken) {
        self.accept_loop(listener, Kind::Http, shutdown, |proxy, stream, peer| {
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
        shutdown: CancellationToken,
    ) {
        let host = Arc::new(host);
        self.accept_loop(
            listener,
            Kind::Forward,
            shutdown,
            move |proxy, stream, peer| proxy.handle_forward(stream, peer, Arc::clone(&host), port),
        )
        .await;
    }

    /// Accepts until `shutdown`, one task per connection under the connection cap. On shutdown the
    /// in-flight connections are dropped: a long relay must not hold the exit back.
    async fn accept_loop<F, Fut>(
        self: Arc<Self>,
        listener: TcpListener,
        kind: Kind,
        shutdown: CancellationToken,
        handler: F,
    ) where
        F: Fn(Arc<Proxy>, TcpStream, SocketAddr) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        if let Ok(addr) = listener.local_addr() {
            self.upstream.add_own_address(addr.ip());
        }
        let mut tasks = JoinSet::new();
        let mut backoff = Duration::from_millis(10);
        loop {
            while tasks.try_join_next().is_some() {}
            // Accept first, then wait for a slot: a permit taken before accept() would sit idle in
            // every quiet listener and starve the busy one. While this loop waits for a slot it accepts
            // nothing more, so the excess waits in the kernel's backlog.
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                a = listener.accept() => a,
            };
            let permit = match &accepted {
                Ok(_) => tokio::select! {
                    () = shutdown.cancelled() => break,
                    p = Arc::clone(&self.limit).acquire_owned() => match p {
                        Ok(p) => Some(p),
                        Err(_) => break,
                    },
                },
                Err(_) => None,
            };
            match accepted {
                Ok((stream, peer)) => {
                    backoff = Duration::from_millis(10);
                    // Debug level: the events a connection logs at info carry client and listener
                    // themselves, and an enabled span costs work at every poll of every connection.
                    let span =
                        tracing::debug_span!("conn", client = %peer, listener = kind.as_str());
                    let work = handler(Arc::clone(&self), stream, peer);
                    let stop = shutdown.clone();
                    tasks.spawn(
                        async move {
                            let _permit = permit;
                            tokio::select! {
                                () = stop.cancelled() => {}
                                () = work => {}
                            }
                        }
                        .instrument(span),
                    );
                }
                Err(error) => {
                    if is_resource_exhaustion(&error) {
                        // Out of descriptors or memory: spinning on accept would only burn CPU.
                        warn!(listener = kind.as_str(), %error, backoff_ms = backoff.as_millis() as u64, "cannot accept; backing off");
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                    } else {
                        debug!(listener = kind.as_str(), %error, "accept failed");
                    }
                }
            }
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }

    /// One TLS connection.
    async fn handle_tls(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let log = ConnLog::new(peer, Kind::Tls);
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let mut reader = HelloReader::new();
        let mut buf = Vec::with_capacity(PEEK_READ);
        let sni = loop {
            buf.clear();
            match tokio::time::timeout_at(deadline, read_some(&client, &mut buf, PEEK_READ)).await {
                Err(_) => {
                    log.refuse("", "peek timeout");
                    refuse_tls(&client, AlertDescription::AccessDenied).await;
                    return;
                }
                Ok(Ok(0)) | Ok(Err(_)) => {
                    if !reader.buffered().is_empty() {
                        log.refuse("", "client closed before the ClientHello was complete");
                    } else {
                        log.set_decision("closed");
                    }
                    return;
                }
                Ok(Ok(_)) => match reader.push(&buf) {
                    Ok(None) => {}
                    Ok(Some(sni)) => break sni,
                    Err(e) => {
                        log.refuse("", &e.to_string());
                        refuse_tls(&client, e.alert()).await;
                        return;
                    }
                },
            }
        };
        drop(buf);
        let shown = show(&sni);
        let name = match std::str::from_utf8(&sni) {
            Ok(s) => self.policy.decide(s),
            Err(_) => Err(Refusal::Invalid(NameError::NonAscii(
                char::REPLACEMENT_CHARACTER,
            ))),
        };
        let name = match name {
            Ok(n) => n,
            Err(refusal) => {
                log.refuse(&shown, &refusal_reason(&refusal));
                let alert = match refusal {
                    Refusal::NotListed(_) => AlertDescription::AccessDenied,
                    Refusal::Invalid(_) => AlertDescription::UnrecognizedName,
                };
                refuse_tls(&client, alert).await;
                return;
            }
        };
        log.set_name(name.as_str());
        let upstream = match self.upstream.connect(&name, 443).await {
            Ok((stream, addr)) => {
                log.set_upstream(addr);
                stream
            }
            Err(e) => {
                log.dial_failed(name.as_str(), &e);
                let alert = if e.is_refusal() {
                    AlertDescription::AccessDenied
                } else {
                    AlertDescription::InternalError
                };
                refuse_tls(&client, alert).await;
                return;
            }
        };
        log.set_decision("allowed");
        let hello = reader.into_buffered();
        if write_all(&upstream, &hello).await.is_err() {
            log.set_decision("upstream-error");
            return;
        }
        log.up(hello.len() as u64);
        drop(hello);
        if let Err(error) = relay::relay(&client, &upstream, &log.bytes_up, &log.bytes_down).await {
            debug!(%error, "relay ended with an error");
        }
    }

    /// One host:port connection.
    async fn handle_forward(
        self: Arc<Self>,
        client: TcpStream,
        peer: SocketAddr,
        host: Arc<HostName>,
        port: u16,
    ) {
        let log = ConnLog::new(peer, Kind::Forward);
        log.set_name(host.as_str());
        if !self.policy.allows_port(&host, port) {
            log.refuse(
                host.as_str(),
                &format!("port {port} is not allowed for this host"),
            );
            return;
        }
        let upstream = match self.upstream.connect(&host, port).await {
            Ok((stream, addr)) => {
                log.set_upstream(addr);
                stream
            }
            Err(e) => {
                log.dial_failed(host.as_str(), &e);
                return;
            }
        };
        log.set_decision("allowed");
        if let Err(error) = relay::relay(&client, &upstream, &log.bytes_up, &log.bytes_down).await {
            debug!(%error, "relay ended with an error");
        }
    }

    /// One HTTP connection.
    async fn handle_http(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let log = ConnLog::new(peer, Kind::Http);
        let mut buf = Vec::with_capacity(PEEK_READ);
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let head = match read_head(&client, &mut buf, Some(deadline), self.peek_timeout).await {
            HeadRead::Head(h) => h,
            HeadRead::Eof => {
                if buf.is_empty() {
                    log.set_decision("closed");
                } else {
                    log.refuse("", "client closed before the request head was complete");
                }
                return;
            }
            HeadRead::Timeout => {
                log.refuse("", "peek timeout");
                let body = format!(
                    "agent-sandbox: no complete request head within {} s; nothing was forwarded.\n",
                    self.peek_timeout.as_secs()
                );
                refuse_http(&client, Status::RequestTimeout, &body).await;
                return;
            }
            HeadRead::Bad(e) => {
                log.refuse("", &e.to_string());
                refuse_http(&client, e.status(), &bad_request_body("", &e.to_string())).await;
                return;
            }
        };
        let name = match self.decide_head(&head) {
            Ok(n) => n,
            Err((status, reason)) => {
                let shown = show(head.host.as_bytes());
                log.refuse(&shown, &reason);
                refuse_http(&client, status, &refusal_body(status, &shown, &reason)).await;
                return;
            }
        };
        log.set_name(name.as_str());
        let upstream = match self.upstream.connect(&name, 80).await {
            Ok((stream, addr)) => {
                log.set_upstream(addr);
                stream
            }
            Err(e) => {
                log.dial_failed(name.as_str(), &e);
                let (status, text) = if e.is_refusal() {
                    (
                        Status::Forbidden,
                        format!(
                            "agent-sandbox: {name} {e}, which the sandbox never connects to; nothing was forwarded.\n"
                        ),
                    )
                } else {
                    (Status::BadGateway, format!("agent-sandbox: {e}.\n"))
                };
                refuse_http(&client, status, &text).await;
                return;
            }
        };
        log.set_decision("allowed");
        self.http_session(&client, &upstream, buf, head, &name, &log)
            .await;
    }

    /// Checks a request head's Host (and absolute-form target) against the policy.
    fn decide_head(&self, head: &RequestHead) -> Result<HostName, (Status, String)> {
        let name = self
            .policy
            .decide_http_host(&head.host)
            .map_err(|r| (refusal_status(&r), refusal_reason(&r)))?;
        if let Some(authority) = &head.target_authority {
            let target = HostName::parse(strip_port(authority)).map_err(|e| {
                (
                    Status::BadRequest,
                    format!(
                        "absolute-form target: {}",
                        refusal_reason(&Refusal::Invalid(e))
                    ),
                )
            })?;
            if target != name {
                return Err((
                    Status::BadRequest,
                    format!(
                        "the request target names {} but Host names {name}",
                        show(authority.as_bytes())
                    ),
                ));
            }
        }
        Ok(name)
    }

    /// Relays an allowed HTTP connection: request by request from the client (each checked), raw from
    /// the upstream.
    async fn http_session(
        &self,
        client: &TcpStream,
        upstream: &TcpStream,
        buf: Vec<u8>,
        head: RequestHead,
        name: &HostName,
        log: &ConnLog,
    ) {
        let websocket_accept = head.websocket_accept.clone();
        let (upgraded_tx, upgraded_rx) = oneshot::channel();
        let requests = self.http_requests(client, upstream, buf, head, name, log, upgraded_rx);
        let responses = http_responses(upstream, client, websocket_accept, upgraded_tx, name, log);
        tokio::pin!(requests, responses);
        let mut requests_done = None;
        let mut responses_done = false;
        loop {
            tokio::select! {
                r = &mut requests, if requests_done.is_none() => {
                    match r {
                        RequestsEnd::ClientDone => shutdown_write(upstream),
                        RequestsEnd::Failed => return,
                        RequestsEnd::Refused(_) => {
                            // Let the upstream finish answering what was already forwarded, then answer
                            // the refused request in order.
                            shutdown_write(upstream);
                        }
                    }
                    requests_done = Some(r);
                    if responses_done {
                        break;
                    }
                }
                r = &mut responses, if !responses_done => {
                    responses_done = true;
                    if r.is_err() {
                        return;
                    }
                    match &requests_done {
                        Some(_) => break,
                        None => shutdown_write(client),
                    }
                }
                () = tokio::time::sleep(self.peek_timeout), if (matches!(requests_done, Some(RequestsEnd::Refused(_))) && !responses_done) || (responses_done && requests_done.is_none()) => {
                    // Either the upstream keeps its side open after a refusal (give up on ordering),
                    // or it has gone and the client keeps the connection idle: nothing more can be
                    // answered on it, so it does not keep its slot.
                    return;
                }
            }
        }
        if let Some(RequestsEnd::Refused(response)) = requests_done {
            let _ = write_all(client, &response).await;
            shutdown_write(client);
            linger(client).await;
        } else {
            shutdown_write(client);
        }
    }

    /// Client → upstream: forwards each request head after checking it, then exactly its body.
    #[allow(clippy::too_many_arguments)]
    async fn http_requests(
        &self,
        client: &TcpStream,
        upstream: &TcpStream,
        mut buf: Vec<u8>,
        first: RequestHead,
        name: &HostName,
        log: &ConnLog,
        mut upgraded: oneshot::Receiver<bool>,
    ) -> RequestsEnd {
        let mut head = first;
        let mut index = 0usize;
        loop {
            if index > 0 {
                if head.upgrade.is_some() {
                    let reason = "Upgrade is only supported on the first request of a connection";
                    log.refuse(&show(head.host.as_bytes()), reason);
                    return RequestsEnd::Refused(http::response(
                        Status::BadRequest,
                        &bad_request_body(name.as_str(), reason),
                    ));
                }
                match self.decide_head(&head) {
                    Ok(n) if n == *name => {}
                    Ok(n) => {
                        let reason =
                            format!("Host changed from {name} to {n} on a kept-alive connection");
                        log.refuse(n.as_str(), &reason);
                        return RequestsEnd::Refused(http::response(
                            Status::Forbidden,
                            &format!(
                                "agent-sandbox: {reason}; open a new connection for {n}. Nothing was forwarded.\n"
                            ),
                        ));
                    }
                    Err((status, reason)) => {
                        let shown = show(head.host.as_bytes());
                        log.refuse(&shown, &reason);
                        return RequestsEnd::Refused(http::response(
                            status,
                            &refusal_body(status, &shown, &reason),
                        ));
                    }
                }
            }
            if write_all(upstream, &buf[..head.len]).await.is_err() {
                return RequestsEnd::Failed;
            }
            log.up(head.len as u64);
            buf.drain(..head.len);
            let mut framer = BodyFramer::new(head.body);
            while !framer.is_done() {
                if buf.is_empty() {
                    match read_some(client, &mut buf, BODY_READ).await {
                        Ok(0) => return RequestsEnd::ClientDone,
                        Ok(_) => {}
                        Err(_) => return RequestsEnd::Failed,
                    }
                }
                let n = match framer.advance(&buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let reason = format!("request body: {e}");
                        log.refuse(name.as_str(), &reason);
                        return RequestsEnd::Refused(http::response(
                            Status::BadRequest,
                            &bad_request_body(name.as_str(), &reason),
                        ));
                    }
                };
                if write_all(upstream, &buf[..n]).await.is_err() {
                    return RequestsEnd::Failed;
                }
                log.up(n as u64);
                buf.drain(..n);
            }
            if index == 0 && head.upgrade.is_some() {
                // Hold everything else until the upstream has answered the upgrade.
                if !(&mut upgraded).await.unwrap_or(false) {
                    // No switch: the upstream's answer is relayed, but nothing more is sent on this
                    // connection, since whether the upstream still reads HTTP on it is unknowable.
                    return RequestsEnd::ClientDone;
                }
                if write_all(upstream, &buf).await.is_err() {
                    return RequestsEnd::Failed;
                }
                log.up(buf.len() as u64);
                return match relay::pump(client, upstream, &log.bytes_up).await {
                    Ok(_) => RequestsEnd::ClientDone,
                    Err(_) => RequestsEnd::Failed,
                };
            }
            index += 1;
            if buf.is_empty() {
                // An idle kept-alive connection holds no buffer while it waits.
                buf = Vec::new();
            }
            head = match read_head(client, &mut buf, None, self.peek_timeout).await {
                HeadRead::Head(h) => h,
                HeadRead::Eof if buf.is_empty() => return RequestsEnd::ClientDone,
                HeadRead::Eof => {
                    log.refuse(
                        name.as_str(),
                        "client closed in the middle of a request head",
                    );
                    return RequestsEnd::ClientDone;
                }
                HeadRead::Timeout => {
                    log.refuse(name.as_str(), "peek timeout");
                    return RequestsEnd::Refused(http::response(
                        Status::RequestTimeout,
                        "agent-sandbox: request head not completed in time.\n",
                    ));
                }
                HeadRead::Bad(e) => {
                    log.refuse(name.as_str(), &e.to_string());
                    return RequestsEnd::Refused(http::response(
                        e.status(),
                        &bad_request_body(name.as_str(), &e.to_string()),
                    ));
                }
            };
        }
    }
}

/// How the client → upstream half of an HTTP connection ended.
#[derive(Debug)]
enum RequestsEnd {
    /// The client finished sending (end of stream between requests).
    ClientDone,
    /// A read or write failed; the connection is over.
    Failed,
    /// A later request was refused: this response goes to the client once the upstream is done.
    Refused(Vec<u8>),
}

/// Upstream → client: raw, except that after an upgrade request (only ever the first; `websocket_accept`
/// is the `Sec-WebSocket-Accept` it calls for) the response heads are read until the final one, to learn
/// whether the protocol switched. A `101` that is not a genuine WebSocket switch gets the client a `502`
/// and ends the connection: the upstream may have switched to a protocol the router cannot follow.
async fn http_responses(
    upstream: &TcpStream,
    client: &TcpStream,
    websocket_accept: Option<String>,
    upgraded: oneshot::Sender<bool>,
    name: &HostName,
    log: &ConnLog,
) -> std::io::Result<()> {
    if let Some(accept) = websocket_accept {
        let mut buf = Vec::new();
        let switched = loop {
            match http::parse_response_head(&buf) {
                Ok(None) => {
                    if read_some(upstream, &mut buf, PEEK_READ).await? == 0 {
                        break false;
                    }
                }
                Ok(Some(h)) if h.accepts_websocket(&accept) => break true,
                Ok(Some(h)) if h.code == 101 => {
                    let reason = "the upstream's 101 lacks Upgrade: websocket or the expected Sec-WebSocket-Accept";
                    warn!(kind = log.kind.as_str(), name = %name, reason, client = %log.client, "invalid upgrade");
                    log.set_decision("upstream-error");
                    let text =
                        format!("agent-sandbox: {name}: {reason}; the connection is closed.\n");
                    let _ = write_all(client, &http::response(Status::BadGateway, &text)).await;
                    shutdown_write(client);
                    linger(client).await;
                    return Err(std::io::Error::other("invalid WebSocket switch"));
                }
                Ok(Some(h)) if (100..200).contains(&h.code) => {
                    write_all(client, &buf[..h.len]).await?;
                    log.down(h.len as u64);
                    buf.drain(..h.len);
                }
                Ok(Some(_)) | Err(_) => break false,
            }
        };
        write_all(client, &buf).await?;
        log.down(buf.len() as u64);
        let _ = upgraded.send(switched);
    } else {
        drop(upgraded);
    }
    relay::pump(upstream, client, &log.bytes_down).await?;
    Ok(())
}

/// The outcome of reading a request head.
#[derive(Debug)]
enum HeadRead {
    /// A complete head at the start of the buffer.
    Head(RequestHead),
    /// End of stream (or a read error) first.
    Eof,
    /// The deadline passed.
    Timeout,
    /// The head is refused.
    Bad(HeadError),
}

/// Reads until `buf` starts with a complete head. With a `deadline`, the whole head must arrive by then
/// (the first request). Without one (between requests on a kept-alive connection) the wait for the first
/// byte is unbounded — TCP keepalive covers a vanished peer — but once a head has begun it must be
/// complete within `peek_timeout`.
async fn read_head(
    client: &TcpStream,
    buf: &mut Vec<u8>,
    deadline: Option<tokio::time::Instant>,
    peek_timeout: Duration,
) -> HeadRead {
    let mut deadline = deadline;
    let mut reader = HeadReader::new();
    loop {
        if !buf.is_empty() {
            match reader.parse(buf) {
                Ok(Some(h)) => return HeadRead::Head(h),
                Ok(None) => {}
                Err(e) => return HeadRead::Bad(e),
            }
            deadline.get_or_insert_with(|| tokio::time::Instant::now() + peek_timeout);
        }
        let read = read_some(client, buf, PEEK_READ);
        let n = match deadline {
            Some(d) => match tokio::time::timeout_at(d, read).await {
                Ok(r) => r,
                Err(_) => return HeadRead::Timeout,
            },
            None => read.await,
        };
        match n {
            Ok(0) | Err(_) => return HeadRead::Eof,
            Ok(_) => {}
        }
    }
}

/// Sends a fatal alert, then closes gently.
async fn refuse_tls(client: &TcpStream, alert: AlertDescription) {
    let _ = write_all(client, &alert_record(alert)).await;
    shutdown_write(client);
    linger(client).await;
}

/// Sends an HTTP response, then closes gently.
async fn refuse_http(client: &TcpStream, status: Status, body: &str) {
    let _ = write_all(client, &http::response(status, body)).await;
    shutdown_write(client);
    linger(client).await;
}

/// Reads and discards what the client still sends, briefly, so closing does not reset the connection
/// (and destroy the refusal) while unread bytes sit in the receive buffer.
async fn linger(client: &TcpStream) {
    let drain = async {
        let mut buf = Vec::with_capacity(PEEK_READ);
        let mut total = 0usize;
        while total < 1024 * 1024 {
            buf.clear();
            match read_some(client, &mut buf, PEEK_READ).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// The body of a response refusing a host.
fn refusal_body(status: Status, shown: &str, reason: &str) -> String {
    if status == Status::Forbidden {
        format!(
            "agent-sandbox: {shown} is not on the sandbox allowlist ({reason}); nothing was forwarded.\n\
             To allow it, add it to {ALLOWLIST_PATH} (one host per line; .example.com allows every \
             subdomain) and start a new session.\n"
        )
    } else {
        bad_request_body(shown, reason)
    }
}

/// The body of a response refusing a malformed request.
fn bad_request_body(shown: &str, reason: &str) -> String {
    let host = if shown.is_empty() { "(none)" } else { shown };
    format!(
        "agent-sandbox: request refused: {reason} (host {host}); nothing was forwarded.\n\
         The sandbox forwards well-formed HTTP/1.x requests to hosts on its allowlist ({ALLOWLIST_PATH}) only.\n"
    )
}

/// The status for a policy refusal of a Host.
fn refusal_status(r: &Refusal) -> Status {
    match r {
        Refusal::NotListed(_) | Refusal::Invalid(NameError::IpLiteral(_)) => Status::Forbidden,
        Refusal::Invalid(_) => Status::BadRequest,
    }
}

/// A short, actionable reason for a policy refusal.
fn refusal_reason(r: &Refusal) -> String {
    match r {
        Refusal::NotListed(_) => "not on the allowlist".to_owned(),
        Refusal::Invalid(NameError::IpLiteral(_)) => "IP literal".to_owned(),
        Refusal::Invalid(NameError::Empty) => "empty name".to_owned(),
        Refusal::Invalid(e) => format!("invalid name: {e}"),
    }
}

/// `name` without a trailing `:port` (IPv6 literals are left alone and refused by the name check).
fn strip_port(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => authority,
    }
}

/// A client-supplied name made safe for a log line or a response: escaped, truncated.
#[must_use]
pub fn show(raw: &[u8]) -> String {
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

/// True for accept errors that mean the process or system is out of a resource.
fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// One connection's log line, written when the connection ends (however it ends).
#[derive(Debug)]
struct ConnLog {
    client: SocketAddr,
    kind: Kind,
    start: Instant,
    /// The decided name (or what the client sent, on refusal).
    name: std::sync::Mutex<String>,
    decision: std::sync::Mutex<&'static str>,
    upstream: std::sync::Mutex<Option<SocketAddr>>,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl ConnLog {
    fn new(client: SocketAddr, kind: Kind) -> ConnLog {
        ConnLog {
            client,
            kind,
            start: Instant::now(),
            name: std::sync::Mutex::new(String::new()),
            decision: std::sync::Mutex::new("cancelled"),
            upstream: std::sync::Mutex::new(None),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
        }
    }

    fn set_name(&self, name: &str) {
        *self.name.lock().unwrap_or_else(|e| e.into_inner()) = name.to_owned();
    }

    fn set_decision(&self, d: &'static str) {
        *self.decision.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    fn set_upstream(&self, a: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
    }

    fn up(&self, n: u64) {
        self.bytes_up.fetch_add(n, Ordering::Relaxed);
    }

    fn down(&self, n: u64) {
        self.bytes_down.fetch_add(n, Ordering::Relaxed);
    }

    /// Logs a refusal (the one `refused` event) and marks the connection refused.
    fn refuse(&self, name: &str, reason: &str) {
        info!(
            kind = self.kind.as_str(),
            name = %name,
            reason = %reason,
            client = %self.client,
            "refused"
        );
        if !name.is_empty() {
            self.set_name(name);
        }
        self.set_decision("refused");
    }

    /// Logs a failed dial: a refusal if the address check refused it, a warning otherwise.
    fn dial_failed(&self, name: &str, e: &DialError) {
        if e.is_refusal() {
            let reason = e.to_string();
            self.refuse(name, &reason);
        } else {
            warn!(
                kind = self.kind.as_str(),
                name = %name,
                error = %e,
                client = %self.client,
                "upstream failed"
            );
            self.set_decision("upstream-error");
        }
    }
}

impl Drop for ConnLog {
    fn drop(&mut self) {
        let name = std::mem::take(self.name.get_mut().unwrap_or_else(|e| e.into_inner()));
        let decision = *self.decision.get_mut().unwrap_or_else(|e| e.into_inner());
        let upstream = self
            .upstream
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .map(|a| a.to_string())
            .unwrap_or_default();
        info!(
            client = %self.client,
            listener = self.kind.as_str(),
            name = %name,
            decision,
            upstream = %upstream,
            bytes_up = self.bytes_up.load(Ordering::Relaxed),
            bytes_down = self.bytes_down.load(Ordering::Relaxed),
            duration_ms = self.start.elapsed().as_millis() as u64,
            "connection"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn strip_port_cases() {
        assert_eq!(strip_port("a.com:80"), "a.com");
        assert_eq!(strip_port("a.com"), "a.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]:80");
    }
}
