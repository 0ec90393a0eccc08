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
use tracing::{info, warn};

use super::oauth_hook::{self, TokenFinish};
use super::rewrite::{rewrite_head, RewriteError, Rewritten, Swap};
use super::scan::Scanner;
use super::Injector;
use crate::fairness::{PeekBudgetSpent, PeekCharge};
use crate::metrics::{CloseReason, Injected, RefusalReason};
use crate::proxy::conn_log::ConnLog;
use crate::proxy::http::{
    BodyFramer, BodyLength, HeadError, HeadReader, RequestHead, MAX_HEAD_LEN,
};
use crate::proxy::{show, Proxy};

/// Read size on both legs.
const READ: usize = 16 * 1024;

/// The largest token request or response body (the store's cap).
const MAX_TOKEN_BODY: usize = 64 * 1024;

/// The most header fields in a response head.
const MAX_RESPONSE_HEADERS: usize = 128;

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
        client_w,
        upstream: None,
        buf: Vec::new(),
        peek: PeekCharge::new(&proxy.bounds.peek),
        rbuf: Vec::new(),
        scanner: Scanner::new(inject.secrets()),
    };
    let _ = proxy.until_idle(log, conn.run()).await;
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
    client_w: WriteHalf<ClientTls>,
    /// The upstream, once the first request passed the checks.
    upstream: Option<(ReadHalf<UpstreamTls>, WriteHalf<UpstreamTls>)>,
    /// Client bytes read and not yet forwarded (the head being read, a pipelined request).
    buf: Vec<u8>,
    /// What `buf` holds past one read's room, charged to the router-wide budget for large heads (and
    /// for token request bodies, which are read whole).
    peek: PeekCharge<'a>,
    /// Upstream bytes read and not yet sent on.
    rbuf: Vec<u8>,
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
            if !keep {
                let _ = self.client_w.shutdown().await;
                return Ok(());
            }
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
                let (client_r, buf, rbuf) = (&mut self.client_r, &mut self.buf, &mut self.rbuf);
                tokio::select! {
                    n = read_into(client_r, buf) => n,
                    _ = read_into(up_r, rbuf) => return Ok(None),
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
        let is_head = rewritten.method.eq_ignore_ascii_case("HEAD");
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
        let Ok(again) = rewrite_head(&original, swap, &mut |_| None) else {
            return Err(End);
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

/// The upstream-to-client half of an exchange.
struct Relay<'r> {
    /// Reading the upstream.
    up_r: &'r mut ReadHalf<UpstreamTls>,
    /// Upstream bytes read and not yet sent on.
    rbuf: &'r mut Vec<u8>,
    /// Writing to the client.
    client_w: &'r mut WriteHalf<ClientTls>,
    /// The secret scan.
    scanner: &'r mut Scanner,
    /// The connection's log.
    log: &'r ConnLog,
    /// The SNI.
    name: &'r HostName,
    /// For the secrets.
    inject: &'r Arc<Injector>,
}

impl Relay<'_> {
    /// Reads a response head (after any interim ones) into `rbuf`.
    async fn head(&mut self) -> Result<ResponseFrame, End> {
        loop {
            if let Some(frame) = parse_response(self.rbuf).map_err(|e| self.bad_upstream(&e))? {
                return Ok(frame);
            }
            if read_into(self.up_r, self.rbuf).await.map_err(|_| End)? == 0 {
                self.bad_upstream("the upstream closed before a complete response head");
                return Err(End);
            }
        }
    }

    /// The length of the next piece of a framed response body in `rbuf`, reading from the upstream when
    /// `rbuf` is empty; the upstream closing mid-body or breaking the framing ends the connection.
    async fn body_part(&mut self, framer: &mut BodyFramer) -> Result<usize, End> {
        if self.rbuf.is_empty() && read_into(self.up_r, self.rbuf).await.map_err(|_| End)? == 0 {
            return Err(self.bad_upstream("the upstream closed mid-body"));
        }
        framer
            .advance(self.rbuf)
            .map_err(|e| self.bad_upstream(&e.to_string()))
    }

    /// Logs an upstream that broke HTTP framing.
    fn bad_upstream(&self, why: &str) -> End {
        self.log.upstream_failed(self.name.as_str(), &why);
        End
    }

    /// Passes `data` through the scan: the bytes safe to send now, or the end of the connection (a
    /// real secret: logged, never its value).
    fn scan(&mut self, data: &[u8]) -> Result<Vec<u8>, End> {
        self.scanner.push(data).map_err(|_| {
            warn!(
                { logs::CLIENT } = %self.log.client,
                { logs::NAME } = %self.name.as_str(),
                "{}",
                logs::SECRET_IN_RESPONSE
            );
            self.log.set_decision(Decision::UpstreamError);
            End
        })
    }

    /// Writes bytes to the client.
    async fn write(&mut self, data: &[u8]) -> Result<(), End> {
        if !data.is_empty() {
            self.client_w.write_all(data).await.map_err(|_| End)?;
            self.log.down(data.len() as u64);
        }
        Ok(())
    }

    /// Sends `data` to the client through the scan.
    async fn send(&mut self, data: &[u8]) -> Result<(), End> {
        let safe = self.scan(data)?;
        self.write(&safe).await
    }

    /// Sends body content to the client through the scan, as a chunk of its own.
    async fn send_chunk(&mut self, content: &[u8]) -> Result<(), End> {
        let safe = self.scan(content)?;
        self.write_chunk(&safe).await
    }

    /// Writes one chunk (nothing for no bytes: an empty chunk would end the body).
    async fn write_chunk(&mut self, data: &[u8]) -> Result<(), End> {
        if data.is_empty() {
            return Ok(());
        }
        let framed = [format!("{:x}\r\n", data.len()).as_bytes(), data, b"\r\n"].concat();
        self.write(&framed).await
    }

    /// Ends a response: releases what the scan held and flushes.
    async fn end(&mut self) -> Result<(), End> {
        let rest = self.scanner.flush();
        self.write(&rest).await?;
        self.client_w.flush().await.map_err(|_| End)
    }

    /// Ends a chunked response: what the scan held as a last chunk, then the last-chunk marker (the
    /// upstream's trailers, if any, are not passed on).
    async fn end_chunked(&mut self) -> Result<(), End> {
        let rest = self.scanner.flush();
        self.write_chunk(&rest).await?;
        self.write(b"0\r\n\r\n").await?;
        self.client_w.flush().await.map_err(|_| End)
    }

    /// Relays one response (interim ones first). `true`: the connection may go on.
    async fn response(&mut self, is_head: bool) -> Result<bool, End> {
        self.scanner.set_secrets(self.inject.secrets());
        loop {
            let frame = self.head().await?;
            let head: Vec<u8> = self.rbuf.drain(..frame.len).collect();
            if frame.code == 101 {
                return Err(self.bad_upstream("the upstream switched protocols unasked"));
            }
            if frame.encoded {
                return self.refuse_encoded().await;
            }
            self.send(&head).await?;
            if (100..200).contains(&frame.code) {
                self.client_w.flush().await.map_err(|_| End)?;
                continue;
            }
            let body = if is_head || frame.code == 204 || frame.code == 304 {
                Body::Framed(BodyLength::None)
            } else {
                frame.body
            };
            match body {
                Body::Framed(length) => {
                    // A chunked body is scanned as the client reads it, without the chunk framing
                    // (a secret split across two chunks is contiguous to the client), and sent
                    // re-chunked.
                    let chunked = length == BodyLength::Chunked;
                    let mut framer = BodyFramer::new(length);
                    let mut dechunker = Dechunker::default();
                    while !framer.is_done() {
                        let n = self.body_part(&mut framer).await?;
                        let part: Vec<u8> = self.rbuf.drain(..n).collect();
                        if chunked {
                            let content = dechunker.push(&part);
                            self.send_chunk(&content).await?;
                        } else {
                            self.send(&part).await?;
                        }
                        // Streamed answers reach the client as they come.
                        self.client_w.flush().await.map_err(|_| End)?;
                    }
                    if chunked {
                        self.end_chunked().await?;
                    } else {
                        self.end().await?;
                    }
                    return Ok(!frame.close);
                }
                Body::UntilClose => {
                    loop {
                        let part = std::mem::take(self.rbuf);
                        if !part.is_empty() {
                            self.send(&part).await?;
                            self.client_w.flush().await.map_err(|_| End)?;
                        }
                        if read_into(self.up_r, self.rbuf).await.unwrap_or(0) == 0 {
                            break;
                        }
                    }
                    self.end().await?;
                    return Ok(false);
                }
            }
        }
    }

    /// Refuses a response in a content or transfer coding (other than chunked): the router asked for
    /// identity and sent no TE, and an encoded body could carry a secret that neither the scan nor the
    /// token store's checks can read. The client gets a 502 and none of the response.
    async fn refuse_encoded<T>(&mut self) -> Result<T, End> {
        self.bad_upstream("the upstream sent a content-encoded response the scan cannot read");
        self.write(&bad_gateway("the upstream's response was content-encoded"))
            .await?;
        let _ = self.client_w.shutdown().await;
        Err(End)
    }

    /// Reads a token endpoint's whole response, hands its body to the store, and sends the rewritten
    /// response with its new length.
    async fn token_response(&mut self, exchange: Box<dyn TokenFinish>) -> Result<bool, End> {
        let frame = loop {
            let frame = self.head().await?;
            if frame.code == 101 {
                return Err(self.bad_upstream("the upstream switched protocols unasked"));
            }
            if (100..200).contains(&frame.code) {
                // Interim answers carry nothing of the store's; dropped (the body was sent whole).
                self.rbuf.drain(..frame.len);
                continue;
            }
            break frame;
        };
        if frame.encoded {
            return self.refuse_encoded().await;
        }
        let head: Vec<u8> = self.rbuf.drain(..frame.len).collect();
        let mut raw = Vec::new();
        match frame.body {
            Body::Framed(length) => {
                let mut framer = BodyFramer::new(length);
                while !framer.is_done() {
                    let n = self.body_part(&mut framer).await?;
                    raw.extend(self.rbuf.drain(..n));
                    if raw.len() > 2 * MAX_TOKEN_BODY {
                        return Err(self.bad_upstream("token response body too large"));
                    }
                }
            }
            Body::UntilClose => loop {
                raw.append(self.rbuf);
                if raw.len() > 2 * MAX_TOKEN_BODY {
                    return Err(self.bad_upstream("token response body too large"));
                }
                if read_into(self.up_r, self.rbuf).await.unwrap_or(0) == 0 {
                    break;
                }
            },
        }
        let body = match frame.body {
            Body::Framed(BodyLength::Chunked) => dechunk(&raw)
                .ok_or_else(|| self.bad_upstream("malformed chunked token response"))?,
            _ => raw,
        };
        if body.len() > MAX_TOKEN_BODY {
            return Err(self.bad_upstream("token response body too large"));
        }
        let new_body = match oauth_hook::finish(exchange, frame.code, &body) {
            Ok(b) => b,
            Err(e) => {
                // Nothing of this response has been sent: the client gets a 502, not the tokens.
                self.bad_upstream(&format!("token response: {e}"));
                self.write(&bad_gateway("the token response could not be rewritten"))
                    .await?;
                let _ = self.client_w.shutdown().await;
                return Err(End);
            }
        };
        let head = with_length(&head, new_body.len());
        self.scanner.set_secrets(self.inject.secrets());
        self.send(&head).await?;
        self.send(&new_body).await?;
        self.end().await?;
        Ok(!frame.close && !matches!(frame.body, Body::UntilClose))
    }
}

/// How a response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// By Content-Length or chunked framing (or there is none).
    Framed(BodyLength),
    /// When the upstream closes.
    UntilClose,
}

/// What the relay needs from a response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ResponseFrame {
    /// Bytes of the head.
    len: usize,
    /// The status code.
    code: u16,
    /// How its body ends (before the request method and status are considered).
    body: Body,
    /// The upstream will close after it.
    close: bool,
    /// A Content-Encoding other than `identity`, or a transfer coding other than `chunked`.
    encoded: bool,
}

/// Parses a response head at the start of `buf`. `Ok(None)`: incomplete.
fn parse_response(buf: &[u8]) -> Result<Option<ResponseFrame>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_LEN => {
            return Err("response head too large".into())
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed response head ({e})")),
    };
    let code = resp.code.unwrap_or(0);
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut close = resp.version == Some(0);
    let mut encoded = false;
    for h in resp.headers.iter() {
        let value = h.value.trim_ascii();
        let tokens = || value.split(|b| *b == b',').map(<[u8]>::trim_ascii);
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.len() <= 18 && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or("invalid Content-Length in the response")?;
            if length.is_some_and(|l| l != n) {
                return Err("several Content-Length values in the response".into());
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if chunked.is_some() {
                return Err("several Transfer-Encoding fields in the response".into());
            }
            chunked = Some(
                tokens()
                    .next_back()
                    .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")),
            );
            // A transfer coding is the client's to decode as much as a content coding: `gzip,
            // chunked` would hand it content the scan never read.
            encoded |= tokens().any(|t| !t.eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("content-encoding") {
            encoded |= tokens().any(|t| !t.is_empty() && !t.eq_ignore_ascii_case(b"identity"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for t in tokens() {
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && resp.version == Some(0) {
                    close = false;
                }
            }
        }
    }
    let body = match (chunked, length) {
        (Some(true), None) => Body::Framed(BodyLength::Chunked),
        (Some(_), Some(_)) => {
            return Err("both Transfer-Encoding and Content-Length in the response".into())
        }
        (Some(false), None) => Body::UntilClose,
        (None, Some(0)) => Body::Framed(BodyLength::None),
        (None, Some(n)) => Body::Framed(BodyLength::Length(n)),
        (None, None) => Body::UntilClose,
    };
    Ok(Some(ResponseFrame {
        len,
        code,
        body,
        close,
        encoded,
    }))
}

/// A complete closing `502` on the router's behalf.
fn bad_gateway(reason: &str) -> Vec<u8> {
    let body = format!("agent-sandbox: {reason}\n");
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Where a [`Dechunker`] is in a chunked body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Chunking {
    /// Reading a chunk-size line: the size so far, and whether the digits ended (extensions).
    #[default]
    Size,
    /// In a chunk's data: bytes left.
    Data(u64),
    /// Skipping the CRLF after chunk data: bytes left.
    DataEnd(u8),
    /// In the trailers; the current line's length so far.
    Trailers(usize),
    /// The body is complete.
    Done,
}

/// The content of a chunked body, from its framed bytes as they arrive. It trusts the framing: the
/// same bytes have passed a [`BodyFramer`] first, which refuses anything malformed.
#[derive(Debug, Default)]
struct Dechunker {
    /// Where it is.
    state: Chunking,
    /// The chunk-size line so far (bounded by the framer's line cap).
    line: Vec<u8>,
}

impl Dechunker {
    /// The content bytes in `framed`.
    fn push(&mut self, framed: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < framed.len() {
            match self.state {
                Chunking::Size => {
                    let b = framed[i];
                    i += 1;
                    if b != b'\n' {
                        self.line.push(b);
                        continue;
                    }
                    let digits: Vec<u8> = self
                        .line
                        .iter()
                        .copied()
                        .take_while(u8::is_ascii_hexdigit)
                        .collect();
                    let size = std::str::from_utf8(&digits)
                        .ok()
                        .and_then(|d| u64::from_str_radix(d, 16).ok())
                        .unwrap_or(0);
                    self.line.clear();
                    self.state = if size == 0 {
                        Chunking::Trailers(0)
                    } else {
                        Chunking::Data(size)
                    };
                }
                Chunking::Data(left) => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(framed.len() - i);
                    out.extend_from_slice(&framed[i..i + take]);
                    i += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        Chunking::DataEnd(2)
                    } else {
                        Chunking::Data(left)
                    };
                }
                Chunking::DataEnd(n) => {
                    i += 1;
                    self.state = if n == 1 {
                        Chunking::Size
                    } else {
                        Chunking::DataEnd(n - 1)
                    };
                }
                Chunking::Trailers(len) => {
                    let b = framed[i];
                    i += 1;
                    self.state = match b {
                        b'\n' if len <= 1 => Chunking::Done,
                        b'\n' => Chunking::Trailers(0),
                        _ => Chunking::Trailers(len + 1),
                    };
                }
                Chunking::Done => break,
            }
        }
        out
    }
}

/// The body of a complete chunked message (its framing already checked), trailers dropped.
fn dechunk(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = raw;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = rest[..line_end]
            .split(|b| matches!(b, b';' | b' ' | b'\t'))
            .next()?;
        let size = usize::from_str_radix(std::str::from_utf8(size_text).ok()?, 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// `head` with one `Content-Length: n` instead of any Content-Length or Transfer-Encoding fields.
fn with_length(head: &[u8], n: usize) -> Vec<u8> {
    let text = head.strip_suffix(b"\r\n\r\n").unwrap_or(head);
    let mut out = Vec::with_capacity(head.len() + 24);
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let name = line.split(|b| *b == b':').next().unwrap_or_default();
        if i > 0
            && (name.eq_ignore_ascii_case(b"content-length")
                || name.eq_ignore_ascii_case(b"transfer-encoding"))
        {
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Content-Length: {n}\r\n\r\n").as_bytes());
    out
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

/// Paths where an OAuth access token buys a new API key, returned in clear text in the response: with
/// the token the router added, that key would reach the sandbox (which the response scan cannot know
/// to look for), so such requests are refused. Claude Code's Console sign-in calls the first.
const KEY_MINTING_PATHS: &[&str] = &["/api/oauth/claude_cli/create_api_key"];

/// Whether a request target is one of [`KEY_MINTING_PATHS`], compared the way a server may read it:
/// scheme and authority of an absolute-form target dropped, the query and fragment dropped,
/// percent-escapes decoded once, empty and `.` segments dropped, `..` applied, ASCII case ignored.
fn mints_api_key(target: &str) -> bool {
    let path = normalised_path(target);
    KEY_MINTING_PATHS
        .iter()
        .any(|p| path.eq_ignore_ascii_case(p))
}

/// See [`mints_api_key`].
fn normalised_path(target: &str) -> String {
    let mut rest = target;
    for scheme in ["https://", "http://"] {
        if rest.len() >= scheme.len() && rest[..scheme.len()].eq_ignore_ascii_case(scheme) {
            rest = &rest[scheme.len()..];
            rest = rest.find('/').map_or("", |i| &rest[i..]);
        }
    }
    let path = rest.split(['?', '#']).next().unwrap_or_default();
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                decoded.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_minting_paths_are_recognised_however_written() {
        for t in [
            "/api/oauth/claude_cli/create_api_key",
            "/api/oauth/claude_cli/create_api_key?x=1",
            "/API/OAuth/claude_cli/create_api_key/",
            "//api//oauth/./claude_cli/create_api_key",
            "/api/oauth/x/../claude_cli/create_api_key",
            "/api/oauth/claude_cli/create%5Fapi%5fkey",
            "/api%2Foauth%2Fclaude_cli%2Fcreate_api_key",
            "https://api.anthropic.com/api/oauth/claude_cli/create_api_key",
            "/api\\oauth\\claude_cli\\create_api_key",
        ] {
            assert!(mints_api_key(t), "{t}");
        }
        for t in [
            "/api/oauth/profile",
            "/v1/messages?beta=true",
            "/api/oauth/claude_cli/roles",
            "/api/oauth/claude_cli/create_api_key_x",
            "/x?/api/oauth/claude_cli/create_api_key",
        ] {
            assert!(!mints_api_key(t), "{t}");
        }
    }

    #[test]
    fn response_framing() {
        let f = |s: &str| parse_response(s.as_bytes());
        let r = f("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!(r.body, Body::Framed(BodyLength::Length(5)));
        assert!(!r.close);
        let r = f("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body, Body::Framed(BodyLength::Chunked));
        assert!(r.close);
        let r = f("HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(r.body, Body::UntilClose);
        assert!(r.close);
        assert!(f("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").is_err());
        assert!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
                .is_err()
        );
        assert_eq!(f("HTTP/1.1 200 OK\r\n"), Ok(None));
    }

    #[test]
    fn transfer_codings_other_than_chunked_count_as_encoded() {
        let f = |te: &str| {
            parse_response(format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: {te}\r\n\r\n").as_bytes())
                .unwrap()
                .unwrap()
        };
        assert!(!f("chunked").encoded);
        assert!(!f("Chunked").encoded);
        for te in [
            "gzip, chunked",
            "chunked, gzip",
            "deflate",
            "identity",
            "x-gzip,chunked",
        ] {
            assert!(f(te).encoded, "{te}");
        }
    }

    #[test]
    fn dechunker_matches_dechunk_for_any_split() {
        let framed = b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nT: 1\r\n\r\n";
        for cut in 0..=framed.len() {
            let mut d = Dechunker::default();
            let mut out = d.push(&framed[..cut]);
            out.extend(d.push(&framed[cut..]));
            assert_eq!(out, b"hello world", "cut at {cut}");
            assert_eq!(d.state, Chunking::Done);
        }
        let mut d = Dechunker::default();
        assert_eq!(d.push(b"3\r\nabc\r\n0\r\n\r\n"), b"abc");
        assert_eq!(d.state, Chunking::Done);
    }

    #[test]
    fn dechunk_and_length() {
        assert_eq!(
            dechunk(b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nT: 1\r\n\r\n").as_deref(),
            Some(&b"hello world"[..])
        );
        assert_eq!(dechunk(b"5\r\nhel"), None);
        assert_eq!(
            with_length(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX: y\r\n\r\n",
                3
            ),
            b"HTTP/1.1 200 OK\r\nX: y\r\nContent-Length: 3\r\n\r\n"
        );
    }

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
