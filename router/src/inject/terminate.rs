//! A terminated TLS connection: the router is the client's TLS server, reads each HTTP/1.1 request,
//! puts the credential in, and is the upstream's TLS client.
//!
//! How it fits: the TLS driver has read the ClientHello and decided on its SNI; for a name in
//! [`Injector::terminates`] it calls [`serve`] with the hello's bytes, which are replayed into rustls
//! ahead of the socket ([`Replay`]). Then, per request:
//!
//! 1. the head is read with the proxy's [`HeadReader`] (caps, hygiene, the peek timeout once a head has
//!    begun) and must name the SNI in Host (and in an absolute-form target): `421` otherwise, before
//!    anything is dialled or sent — also for the second request of a kept-alive connection. The HTTP/2
//!    preface gets `505`, Upgrade and CONNECT `501`;
//! 2. the head is rewritten ([`super::rewrite`]); the upstream is dialled on the first request only
//!    (one upstream connection per client connection, to the SNI's name, through the proxy's dial and
//!    its address checks) and its certificate verified: a failure answers `502` and nothing of the
//!    request has been sent;
//! 3. the body goes upstream exactly as framed ([`BodyFramer`]), while the response comes back (so an
//!    `Expect: 100-continue` exchange works): head, interim answers and body framed by the response's
//!    own headers, every byte through the secret [`Scanner`]. A real secret in it cuts both connections.
//!
//! Requests are answered in order: a pipelined request waits in the buffer until the response before it
//! is complete, so the framing never depends on the upstream agreeing with the router about pipelining.
//! A token request to the OAuth token host is read whole, rewritten by the store, and its response read
//! whole and rewritten too ([`super::oauth_hook`]), within the peek timeout (the store stays locked
//! meanwhile).
//!
//! Here: the handshake and the request loop. The response half is in [`relay`], response heads and
//! chunked bodies in [`response`], the targets refused for minting an API key in [`paths`].

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_sandbox_shared::logs::{self, Credential, Decision};
use agent_sandbox_shared::HostName;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::info;

use super::oauth_hook;
use super::rewrite::{rewrite_head, RewriteError, Rewritten, Swap};
use super::scan::Scanner;
use super::Injector;
use crate::fairness::{PeekBudgetSpent, PeekCharge};
use crate::metrics::{CloseReason, Injected, RefusalReason};
use crate::proxy::conn_log::ConnLog;
use crate::proxy::http::{BodyFramer, BodyLength, HeadError, HeadReader, RequestHead};
use crate::proxy::refusal::discard_briefly;
use crate::proxy::{show, Proxy};

mod paths;
mod relay;
mod response;

use paths::{mints_api_key, normalised_path};
use relay::Relay;

/// Read size on both legs.
const READ: usize = 16 * 1024;

/// The largest token request or response body (the store's cap).
const MAX_TOKEN_BODY: usize = 64 * 1024;

/// The client's TLS stream.
type ClientTls = tokio_rustls::server::TlsStream<Replay>;
/// The upstream's TLS stream.
type UpstreamTls = tokio_rustls::client::TlsStream<TcpStream>;

/// The client socket, with the bytes already read from it (the ClientHello) in front.
#[derive(Debug)]
pub(crate) struct Replay {
    /// Bytes to hand out before reading the socket.
    prefix: Vec<u8>,
    /// How many of them were handed out.
    at: usize,
    /// The socket.
    inner: TcpStream,
}

impl AsyncRead for Replay {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Writing to the client; remembers whether the router ended its side cleanly (close_notify and FIN
/// sent), after which the connection lingers briefly before it is closed.
pub(crate) struct ClientWriter {
    /// The write half.
    inner: WriteHalf<ClientTls>,
    /// The shutdown completed.
    ended: bool,
}

impl AsyncWrite for ClientWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let done = Pin::new(&mut self.inner).poll_shutdown(cx);
        if matches!(done, Poll::Ready(Ok(()))) {
            self.ended = true;
        }
        done
    }
}

/// Why a terminated connection ended early (already answered and logged when it matters).
#[derive(Debug)]
struct End;

/// Serves a terminated connection for `name` whose ClientHello (`hello`) has been read from `client`.
pub(crate) async fn serve(
    proxy: &Proxy,
    inject: &Arc<Injector>,
    client: TcpStream,
    hello: Vec<u8>,
    name: HostName,
    log: &ConnLog,
) {
    let shown = name.as_str().to_owned();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&inject.server));
    let replay = Replay {
        prefix: hello,
        at: 0,
        inner: client,
    };
    let tls = match tokio::time::timeout(proxy.peek_timeout, acceptor.accept(replay)).await {
        Err(_) => {
            log.client_failed(
                &shown,
                "TLS handshake not complete within the peek timeout",
                Some(CloseReason::ClientTimeout),
            );
            return;
        }
        Ok(Err(e)) => {
            log.client_failed(&shown, &format!("TLS handshake failed: {e}"), None);
            return;
        }
        Ok(Ok(tls)) => tls,
    };
    // rustls read the same hello; should it see another name, the router's decision is not about
    // this connection.
    let same = tls
        .get_ref()
        .1
        .server_name()
        .and_then(|s| HostName::parse(s).ok())
        .is_some_and(|s| s == name);
    if !same {
        log.refuse(
            &shown,
            "the TLS library read another server name than the router",
            RefusalReason::BadHello,
        );
        return;
    }
    log.set_decision(Decision::Terminated);
    proxy.bounds.metrics.terminated();
    let (client_r, client_w) = tokio::io::split(tls);
    let mut conn = Terminated {
        proxy,
        inject,
        name,
        log,
        client_r,
        client_w: ClientWriter {
            inner: client_w,
            ended: false,
        },
        upstream: None,
        buf: Vec::new(),
        peek: PeekCharge::new(&proxy.bounds.peek),
        rbuf: Vec::new(),
        rpeek: PeekCharge::new(&proxy.bounds.peek),
        scanner: Scanner::new(inject.secrets()),
    };
    if proxy.until_idle(log, conn.run()).await.is_some() && conn.client_w.ended {
        // Whatever the client still sends (a pipelined request, the body of a refused one) is read
        // and dropped for a moment, as the listeners do for their refusals: closing with it unread
        // would reset the connection, and a reset can destroy the answer before the client reads it.
        discard_briefly(&mut conn.client_r).await;
    }
}

/// One terminated connection's state.
struct Terminated<'a> {
    /// Timeouts, the dial, metrics.
    proxy: &'a Proxy,
    /// Credentials and TLS configurations.
    inject: &'a Arc<Injector>,
    /// The SNI, decided: every request's Host must be it; the upstream is it.
    name: HostName,
    /// The connection's log.
    log: &'a ConnLog,
    /// Reading the client.
    client_r: ReadHalf<ClientTls>,
    /// Writing to the client.
    client_w: ClientWriter,
    /// The upstream, once the first request passed the checks.
    upstream: Option<(ReadHalf<UpstreamTls>, WriteHalf<UpstreamTls>)>,
    /// Client bytes read and not yet forwarded (the head being read, a pipelined request).
    buf: Vec<u8>,
    /// What `buf` holds past one read's room, charged to the router-wide budget for large heads (and
    /// for token request bodies, which are read whole).
    peek: PeekCharge<'a>,
    /// Upstream bytes read and not yet sent on.
    rbuf: Vec<u8>,
    /// What `rbuf` holds past one read's room (a large response head), charged to the same budget.
    rpeek: PeekCharge<'a>,
    /// Every byte to the client passes through it.
    scanner: Scanner,
}

impl Terminated<'_> {
    /// The request loop.
    async fn run(&mut self) -> Result<(), End> {
        let mut first = true;
        loop {
            let Some(head) = self.read_head(first).await? else {
                let _ = self.client_w.shutdown().await;
                return Ok(());
            };
            first = false;
            let shown = self.name.as_str().to_owned();
            let host_ok = same_host(&head.host, &self.name)
                && head
                    .target_authority
                    .as_deref()
                    .map_or(true, |a| same_host(a, &self.name));
            if !host_ok {
                let reason = format!(
                    "Host {} is not the TLS server name {shown}",
                    show(head.host.as_bytes())
                );
                return self
                    .refuse(
                        "421 Misdirected Request",
                        &reason,
                        RefusalReason::BadRequest,
                    )
                    .await;
            }
            if head.upgrade.is_some() {
                return self
                    .refuse(
                        "501 Not Implemented",
                        "upgrade on a terminated connection",
                        RefusalReason::BadRequest,
                    )
                    .await;
            }
            let inject = Arc::clone(self.inject);
            let api_key = if inject.api_key_hosts.contains(&self.name) {
                inject
                    .api_key
                    .as_ref()
                    .map(|(p, k)| (p.as_slice(), k.expose()))
            } else {
                None
            };
            let oauth = inject
                .oauth
                .as_ref()
                .filter(|_| inject.oauth_api_hosts.contains(&self.name));
            let swap = Swap {
                api_key,
                oauth: oauth.is_some(),
                content_length: None,
            };
            let mut bearer = |t: &[u8]| oauth.and_then(|o| oauth_hook::access_token(o.as_ref(), t));
            let rewritten = match rewrite_head(&self.buf[..head.len], swap, &mut bearer) {
                Ok(rewritten) => rewritten,
                Err(RewriteError::Unreadable) => {
                    return self
                        .refuse(
                            "400 Bad Request",
                            "unreadable request head",
                            RefusalReason::BadRequest,
                        )
                        .await
                }
                Err(RewriteError::TooLarge) => {
                    return self
                        .refuse(
                            "431 Request Header Fields Too Large",
                            "request head at the router's caps: no room for the fields the router adds (Accept-Encoding)",
                            RefusalReason::BadRequest,
                        )
                        .await
                }
            };
            if rewritten.both {
                return self
                    .refuse(
                        "400 Bad Request",
                        "the request carries both the API key placeholder and the sign-in placeholder; send one credential",
                        RefusalReason::BadRequest,
                    )
                    .await;
            }
            // On whether the access token was added, not on the label: with both, the label is the
            // API key's.
            if rewritten.oauth_added && mints_api_key(&rewritten.target) {
                return self
                    .refuse(
                        "403 Forbidden",
                        "creating an API key with the sign-in the router adds would hand a real key to the sandbox; set ANTHROPIC_API_KEY on the host instead (the router adds it)",
                        RefusalReason::BadRequest,
                    )
                    .await;
            }
            let token = match (&inject.oauth, &inject.token_host) {
                (Some(o), Some(t)) if *t == self.name => {
                    // Normalised as for the minting check: an absolute-form target, percent-escapes,
                    // dot segments or doubled slashes must not make a token request look like another
                    // one (its response would come back unmasked).
                    let path = normalised_path(&rewritten.target);
                    oauth_hook::is_token_request(o.as_ref(), &rewritten.method, &path)
                }
                _ => false,
            };
            self.connect_upstream().await?;
            self.buf.drain(..head.len);
            let keep = if token {
                self.token_exchange(&head, rewritten).await?
            } else {
                self.note_request(rewritten.credential);
                self.exchange(&head, &rewritten).await?
            };
            if keep && self.rbuf.is_empty() {
                continue;
            }
            if keep {
                // The upstream sent more than the response it was asked for. Served to the next
                // request, it would answer the wrong one (on the token host, tokens the scan does not
                // know yet): the connection ends after the response the client has.
                self.log.upstream_failed(
                    self.name.as_str(),
                    &"the upstream sent bytes after its response",
                );
                self.rbuf = Vec::new();
            }
            let _ = self.client_w.shutdown().await;
            return Ok(());
        }
    }

    /// Logs and counts one request's credential.
    fn note_request(&self, credential: Credential) {
        let metrics = &self.proxy.bounds.metrics;
        match credential {
            Credential::ApiKey => metrics.injected(Injected::ApiKey),
            Credential::OAuth => metrics.injected(Injected::OAuth),
            Credential::None => {}
        }
        info!(
            { logs::CLIENT } = %self.log.client,
            { logs::NAME } = %self.name.as_str(),
            { logs::CREDENTIAL } = credential.as_str(),
            "{}",
            logs::REQUEST
        );
    }

    /// Reads the next request head into `buf`. `None`: the client closed between requests. The first
    /// head must come within the peek timeout of the handshake, later ones within it of their first
    /// byte (the wait between requests is the idle timeout's).
    async fn read_head(&mut self, first: bool) -> Result<Option<RequestHead>, End> {
        let peek = self.proxy.peek_timeout;
        let mut deadline = first.then(|| Instant::now() + peek);
        let mut reader = HeadReader::new();
        // What the last request left is more than the next head needs.
        if self.buf.len() <= READ {
            self.buf.shrink_to(READ);
        }
        self.charge_buf().await?;
        loop {
            if !self.buf.is_empty() {
                deadline.get_or_insert_with(|| Instant::now() + peek);
                match reader.parse(&self.buf) {
                    Ok(Some(head)) => return Ok(Some(head)),
                    Ok(None) => {}
                    Err(e) => {
                        let status = match e {
                            HeadError::Http2Preface | HeadError::H2cUpgrade => {
                                "505 HTTP Version Not Supported"
                            }
                            HeadError::Connect | HeadError::UnsupportedUpgrade => {
                                "501 Not Implemented"
                            }
                            ref e => e.status().line(),
                        };
                        return self
                            .refuse(status, &e.to_string(), RefusalReason::BadRequest)
                            .await
                            .map(|()| None);
                    }
                }
            }
            let n = if self.buf.is_empty() && !first {
                // Between requests: an upstream that closes its idle connection closes the client's
                // too (as a server would), rather than failing the client's next request.
                let Some((up_r, _)) = self.upstream.as_mut() else {
                    return Ok(None);
                };
                // Whatever the upstream sends now ends the connection: one byte is read to know,
                // into a buffer of its own (`rbuf` would keep the room reserved for it, uncharged).
                let (client_r, buf) = (&mut self.client_r, &mut self.buf);
                let mut byte = [0u8; 1];
                tokio::select! {
                    n = read_into(client_r, buf) => n,
                    _ = up_r.read(&mut byte) => return Ok(None),
                }
            } else {
                let read = read_into(&mut self.client_r, &mut self.buf);
                match deadline {
                    Some(at) => match tokio::time::timeout_at(at, read).await {
                        Ok(r) => r,
                        Err(_) => {
                            self.log.client_failed(
                                self.name.as_str(),
                                "request head not complete within the peek timeout",
                                Some(CloseReason::ClientTimeout),
                            );
                            return Err(End);
                        }
                    },
                    None => read.await,
                }
            };
            match n {
                Ok(0) | Err(_) if self.buf.is_empty() => return Ok(None),
                Ok(0) | Err(_) => {
                    self.log.client_failed(
                        self.name.as_str(),
                        "client closed in the middle of a request head",
                        None,
                    );
                    return Err(End);
                }
                Ok(_) => self.charge_buf().await?,
            }
        }
    }

    /// Charges what `buf` holds past one read's room to the budget for large heads and bodies; past
    /// it, the client gets a 503 and the connection ends (the buffer is let go first).
    async fn charge_buf(&mut self) -> Result<(), End> {
        if self
            .peek
            .hold(self.buf.capacity().saturating_sub(READ))
            .is_ok()
        {
            return Ok(());
        }
        self.buf = Vec::new();
        self.refuse(
            "503 Service Unavailable",
            &PeekBudgetSpent.to_string(),
            RefusalReason::PeekMemory,
        )
        .await
    }

    /// Answers the client with `status` on the router's behalf, logs the refusal, closes.
    async fn refuse(&mut self, status: &str, reason: &str, why: RefusalReason) -> Result<(), End> {
        self.log.refuse(self.name.as_str(), reason, why);
        self.answer(status, reason).await;
        Err(End)
    }

    /// Writes a complete closing response and shuts the client's TLS down.
    async fn answer(&mut self, status: &str, reason: &str) {
        let body = format!("agent-sandbox: {reason}\n");
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{body}",
            body.len()
        );
        let _ = self.client_w.write_all(response.as_bytes()).await;
        let _ = self.client_w.shutdown().await;
    }

    /// Dials the SNI's name (first request only) and completes a verified TLS handshake with it;
    /// `502` to the client otherwise, with nothing of the request sent.
    async fn connect_upstream(&mut self) -> Result<(), End> {
        if self.upstream.is_some() {
            return Ok(());
        }
        let shown = self.name.as_str().to_owned();
        let tcp = match self.proxy.dial(&self.name, 443, self.log).await {
            Ok(s) => s,
            Err(e) => {
                let status = if e.is_refusal() {
                    "403 Forbidden"
                } else {
                    "502 Bad Gateway"
                };
                self.answer(status, &format!("cannot reach {shown}: {e}"))
                    .await;
                return Err(End);
            }
        };
        let server_name = rustls::pki_types::ServerName::try_from(shown.clone())
            .map_err(|_| End)?
            .to_owned();
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.inject.client));
        let failed = match tokio::time::timeout(
            self.proxy.peek_timeout,
            connector.connect(server_name, tcp),
        )
        .await
        {
            Ok(Ok(tls)) => match tls.get_ref().1.alpn_protocol() {
                None | Some(super::HTTP11) => {
                    self.log.set_decision(Decision::Terminated);
                    self.upstream = Some(tokio::io::split(tls));
                    return Ok(());
                }
                Some(_) => "the upstream chose another protocol than HTTP/1.1".to_owned(),
            },
            Ok(Err(e)) => format!("TLS with the upstream failed: {e}"),
            Err(_) => "TLS with the upstream timed out".to_owned(),
        };
        self.log.upstream_failed(&shown, &failed);
        self.answer("502 Bad Gateway", &format!("{shown}: {failed}"))
            .await;
        Err(End)
    }

    /// Sends one request (rewritten head, body as framed) while relaying its response. `true`: the
    /// connection may carry another request.
    async fn exchange(&mut self, head: &RequestHead, rewritten: &Rewritten) -> Result<bool, End> {
        let Some((up_r, up_w)) = self.upstream.as_mut() else {
            return Err(End);
        };
        let log = self.log;
        // Methods are case-sensitive (RFC 9110, 9.1): `head` is not HEAD, and its response has a body.
        let is_head = rewritten.method == "HEAD";
        up_w.write_all(&rewritten.head).await.map_err(|_| End)?;
        log.up(rewritten.head.len() as u64);
        let body = head.body;
        let (client_r, buf) = (&mut self.client_r, &mut self.buf);
        let send = async move {
            let mut framer = BodyFramer::new(body);
            while !framer.is_done() {
                if buf.is_empty() && read_into(client_r, buf).await.map_err(|_| End)? == 0 {
                    return Err(End);
                }
                let n = framer.advance(buf).map_err(|_| End)?;
                up_w.write_all(&buf[..n]).await.map_err(|_| End)?;
                log.up(n as u64);
                buf.drain(..n);
            }
            up_w.flush().await.map_err(|_| End)?;
            Ok(())
        };
        let mut relay = Relay {
            up_r,
            rbuf: &mut self.rbuf,
            client_w: &mut self.client_w,
            scanner: &mut self.scanner,
            log,
            name: &self.name,
            inject: self.inject,
            peek: &mut self.rpeek,
        };
        let (_, keep) = tokio::try_join!(send, relay.response(is_head))?;
        Ok(keep)
    }

    /// A token request: the whole body (Content-Length only, at most 64 KiB) goes through the store,
    /// and so does the whole response.
    async fn token_exchange(
        &mut self,
        head: &RequestHead,
        rewritten: Rewritten,
    ) -> Result<bool, End> {
        let len = match head.body {
            BodyLength::None => 0,
            BodyLength::Length(n) if n <= MAX_TOKEN_BODY as u64 => n as usize,
            BodyLength::Length(_) => {
                return self
                    .refuse(
                        "413 Content Too Large",
                        "token request body larger than 64 KiB",
                        RefusalReason::BadRequest,
                    )
                    .await
                    .map(|()| false);
            }
            BodyLength::Chunked => {
                return self
                    .refuse(
                        "411 Length Required",
                        "a chunked token request",
                        RefusalReason::BadRequest,
                    )
                    .await
                    .map(|()| false);
            }
        };
        while self.buf.len() < len {
            if read_into(&mut self.client_r, &mut self.buf)
                .await
                .map_err(|_| End)?
                == 0
            {
                return Err(End);
            }
            self.charge_buf().await?;
        }
        let body: Vec<u8> = self.buf.drain(..len).collect();
        let Some(hook) = self.inject.oauth.clone() else {
            return Err(End);
        };
        let begun =
            oauth_hook::begin(hook.as_ref(), rewritten.content_type.as_deref(), &body).await;
        let (new_body, exchange) = match begun {
            Ok(b) => b,
            Err(e) => {
                self.log
                    .upstream_failed(self.name.as_str(), &format!("token request: {e}"));
                self.answer(
                    "502 Bad Gateway",
                    "the token request could not be rewritten",
                )
                .await;
                return Err(End);
            }
        };
        // The head again, with the new body's length (and still no Accept-Encoding).
        let swap = Swap {
            api_key: None,
            oauth: false,
            content_length: Some(new_body.len()),
        };
        let original = [rewritten.head.as_slice()].concat();
        let again = match rewrite_head(&original, swap, &mut |_| None) {
            Ok(again) => again,
            Err(RewriteError::Unreadable) => return Err(End),
            // The new Content-Length (added, or a digit longer) took a head at a cap over it.
            Err(RewriteError::TooLarge) => {
                drop(exchange);
                return self
                    .refuse(
                        "431 Request Header Fields Too Large",
                        "token request head at the router's caps: no room for its new Content-Length",
                        RefusalReason::BadRequest,
                    )
                    .await
                    .map(|()| false);
            }
        };
        self.note_request(Credential::OAuth);
        let Some((up_r, up_w)) = self.upstream.as_mut() else {
            return Err(End);
        };
        let request = [again.head.as_slice(), &new_body].concat();
        let log = self.log;
        let mut relay = Relay {
            up_r,
            rbuf: &mut self.rbuf,
            client_w: &mut self.client_w,
            scanner: &mut self.scanner,
            log,
            name: &self.name,
            inject: self.inject,
            peek: &mut self.rpeek,
        };
        // `exchange` holds the store's lock (every session's, through the flock) until it is finished
        // or dropped: a token endpoint that does not answer must not keep it for the idle timeout,
        // while other sessions give up on it after `LOCK_TIMEOUT` (30 s). Dropped at the deadline.
        let answered = tokio::time::timeout(self.proxy.peek_timeout, async move {
            up_w.write_all(&request).await.map_err(|_| End)?;
            up_w.flush().await.map_err(|_| End)?;
            log.up(request.len() as u64);
            relay.token_response(exchange).await
        })
        .await;
        match answered {
            Ok(keep) => keep,
            Err(_) => {
                let why = "the token endpoint did not answer within the peek timeout";
                self.log.upstream_failed(self.name.as_str(), &why);
                self.answer("504 Gateway Timeout", why).await;
                Err(End)
            }
        }
    }
}

/// Whether a Host value (or an absolute-form authority) names `name`: the same name, any case, an
/// optional trailing dot, and no port but 443.
fn same_host(host: &str, name: &HostName) -> bool {
    let bare = host.strip_suffix(":443").unwrap_or(host);
    if bare.contains(':') {
        return false;
    }
    HostName::parse(bare).is_ok_and(|h| h == *name)
}

/// Reads once from `r`, appending to `buf` (room for [`READ`] bytes is made first). Cancel-safe: a
/// read dropped before it completes leaves `buf` as it was.
async fn read_into<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.reserve(READ);
    r.read_buf(buf).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_must_be_the_sni() {
        let n = HostName::parse("api.example.test").unwrap();
        for ok in [
            "api.example.test",
            "API.example.test.",
            "api.example.test:443",
        ] {
            assert!(same_host(ok, &n), "{ok}");
        }
        for bad in [
            "other.test",
            "api.example.test:80",
            "api.example.test:8443",
            "",
        ] {
            assert!(!same_host(bad, &n), "{bad}");
        }
    }
}
