//! One HTTP connection on the HTTP listener: Host routing, the same Host for every request on a
//! kept-alive connection, raw relay after a genuine WebSocket switch.
//!
//! How it fits: the accept loop ([`super::listener`]) runs [`Proxy::handle_http`] per connection. It
//! reads and decides the first request head ([`HttpConn`]), dials the decided name on port 80, then an
//! [`HttpRelay`] runs the two halves at once: requests (each head parsed by [`super::http`] and checked
//! against the first, each body framed exactly) and responses (raw, except the answer to an upgrade).
//! How far the two halves have got is a [`Halves`] state.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use agent_sandbox_shared::logs::{Decision, Kind};
use agent_sandbox_shared::{HostName, Refusal, Rules};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tracing::warn;

use super::conn_log::ConnLog;
use super::http::{self, BodyFramer, HeadError, HeadReader, RequestHead, Status};
use super::refusal::{self, refuse_http, send_and_close, Refusals};
use super::relay::{self, read_maybe_first, read_some, shutdown_write, write_all, write_first};
use super::{show, Proxy, PEEK_READ};
use crate::fairness::{PeekBudgetSpent, PeekCharge};
use crate::live::LiveRules;
use crate::metrics::{CloseReason, RefusalReason};

/// Read size while relaying HTTP request bodies, while the [`PeekBudget`](crate::fairness::PeekBudget)
/// has room for the buffer (it is charged like a large head: an upstream that stops reading leaves it
/// full).
const BODY_READ: usize = 64 * 1024;
/// Read size for request bodies when the budget has no room: what the relay's copy buffer holds too.
const SMALL_BODY_READ: usize = 16 * 1024;

impl Proxy {
    /// One HTTP connection.
    pub(super) async fn handle_http(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let conn = HttpConn {
            client: &client,
            live: &self.rules,
            rules: OnceLock::new(),
            refusals: &self.refusals,
            peek_timeout: self.peek_timeout,
            peek: Mutex::new(PeekCharge::new(&self.bounds.peek)),
            log: ConnLog::new(
                peer,
                Kind::Http,
                self.coalesce,
                Arc::clone(&self.bounds.metrics),
            ),
        };
        let Some((buf, head, name)) = conn.first_request().await else {
            return;
        };
        conn.log.set_name(name.as_str());
        let upstream = match self.dial(&name, 80, &conn.log).await {
            Ok(s) => s,
            Err(e) => {
                let (status, text) = refusal::dial_response(name.as_str(), &e);
                refuse_http(&client, status, &text).await;
                return;
            }
        };
        // The idle timeout covers the relay and a kept-alive connection waiting for its next request.
        let relaying = HttpRelay {
            conn: &conn,
            upstream: &upstream,
            name,
        };
        self.until_idle(&conn.log, relaying.run(buf, head)).await;
    }
}

/// An HTTP connection's client side and what it is judged by.
#[derive(Debug)]
struct HttpConn<'a> {
    /// The client.
    client: &'a TcpStream,
    /// The rules in force, of which the first decision takes a snapshot.
    live: &'a LiveRules,
    /// The rules as they were when the first request head had been read: every request on the
    /// connection is judged by them. Not the accept's: a client that sent a byte before a reload and
    /// the rest of its head after it is judged by the new rules.
    rules: OnceLock<Arc<Rules>>,
    /// The texts refused clients see.
    refusals: &'a Refusals,
    /// How long a request head may take once it has begun.
    peek_timeout: Duration,
    /// The request buffer's charge to the router-wide budget for large heads, updated as heads are read
    /// (locked only between awaits).
    peek: Mutex<PeekCharge<'a>>,
    /// This connection's log.
    log: ConnLog,
}

impl HttpConn<'_> {
    /// Reads and decides the first request head. `None`: the connection is over (refused, timed out
    /// or closed; already logged and answered). Otherwise the buffer (the head and whatever followed
    /// it), the head, and the decided name.
    async fn first_request(&self) -> Option<(Vec<u8>, RequestHead, HostName)> {
        let mut buf = Vec::with_capacity(PEEK_READ);
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let head = match self.read_head(&mut buf, Some(deadline)).await {
            HeadRead::Head(h) => h,
            HeadRead::Eof => {
                if buf.is_empty() {
                    self.log.set_decision(Decision::Closed);
                } else {
                    self.log.client_failed(
                        "",
                        "client closed before the request head was complete",
                        None,
                    );
                }
                return None;
            }
            HeadRead::Timeout => {
                self.log
                    .client_failed("", "peek timeout", Some(CloseReason::ClientTimeout));
                let body = refusal::head_timeout_body(self.peek_timeout);
                refuse_http(self.client, Status::RequestTimeout, &body).await;
                return None;
            }
            HeadRead::Bad(e) => {
                let reason = e.to_string();
                self.log.refuse("", &reason, RefusalReason::BadRequest);
                let body = self.refusals.bad_request_body("", &reason);
                refuse_http(self.client, e.status(), &body).await;
                return None;
            }
            HeadRead::Spent => {
                drop(buf);
                let reason = PeekBudgetSpent.to_string();
                self.log.refuse("", &reason, RefusalReason::PeekMemory);
                refuse_http(self.client, Status::ServiceUnavailable, &busy_body(&reason)).await;
                return None;
            }
        };
        match self.decide(&head) {
            Ok(name) => Some((buf, head, name)),
            Err((status, reason)) => {
                let shown = show(head.host.as_bytes());
                self.log
                    .refuse(&shown, &reason, refusal::http_refusal(status));
                let body = self.refusals.policy_body(status, &shown, &reason);
                refuse_http(self.client, status, &body).await;
                None
            }
        }
    }

    /// Checks a request head's Host (and absolute-form target) against the policy.
    fn decide(&self, head: &RequestHead) -> Result<HostName, (Status, String)> {
        let name = self
            .rules
            .get_or_init(|| self.live.load())
            .policy
            .decide_http_host(&head.host)
            .map_err(|r| (refusal::policy_status(&r), refusal::policy_reason(&r)))?;
        if let Some(authority) = &head.target_authority {
            let target = HostName::parse(strip_port(authority)).map_err(|e| {
                (
                    Status::BadRequest,
                    format!(
                        "absolute-form target: {}",
                        refusal::policy_reason(&Refusal::Invalid(e))
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

    /// The request buffer now holds `bytes`: [`PeekCharge::hold`].
    fn hold(&self, bytes: usize) -> Result<(), PeekBudgetSpent> {
        self.peek
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .hold(bytes)
    }

    /// Reads until `buf` starts with a complete head. With a `deadline`, the whole head must arrive by
    /// then (the first request). Without one (between requests on a kept-alive connection) the wait for
    /// the first byte is unbounded — TCP keepalive covers a vanished peer — but once a head has begun it
    /// must be complete within the peek timeout.
    async fn read_head(
        &self,
        buf: &mut Vec<u8>,
        mut deadline: Option<tokio::time::Instant>,
    ) -> HeadRead {
        // Scans only the bytes each read adds: a head sent a byte at a time costs linear work.
        let mut reader = HeadReader::new();
        // What the buffer holds past the usual is charged while a head is read; a buffer dropped
        // since the last head gives its charge back here.
        let charge = |buf: &Vec<u8>| self.hold(buf.capacity());
        // What a body left behind is more than the next head needs.
        if buf.len() <= PEEK_READ {
            buf.shrink_to(PEEK_READ);
        }
        if charge(buf).is_err() {
            return HeadRead::Spent;
        }
        // The first request's first read goes out at once (see `read_first`); later heads on a
        // kept-alive connection are usually not there yet, so they wait for the runtime.
        let mut first = deadline.is_some() && buf.is_empty();
        loop {
            if !buf.is_empty() {
                match reader.parse(buf) {
                    Ok(Some(h)) => return HeadRead::Head(h),
                    Ok(None) => {}
                    Err(e) => return HeadRead::Bad(e),
                }
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + self.peek_timeout);
            }
            let read = read_maybe_first(self.client, buf, PEEK_READ, std::mem::take(&mut first));
            let n = match deadline {
                Some(d) => match tokio::time::timeout_at(d, read).await {
                    Ok(r) => r,
                    Err(_) => return HeadRead::Timeout,
                },
                None => read.await,
            };
            match n {
                Ok(0) | Err(_) => return HeadRead::Eof,
                Ok(_) if charge(buf).is_err() => return HeadRead::Spent,
                Ok(_) => {}
            }
        }
    }
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
    /// The head is larger than usual and the router-wide budget for those is in use.
    Spent,
}

/// An allowed HTTP connection with its upstream.
#[derive(Debug)]
struct HttpRelay<'r, 'a> {
    /// The client side.
    conn: &'r HttpConn<'a>,
    /// The upstream, dialled for `name`.
    upstream: &'r TcpStream,
    /// The name decided on the first request; every later request must name it too.
    name: HostName,
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

/// How far the two halves of a relayed HTTP connection have got.
#[derive(Debug)]
enum Halves {
    /// Both are running.
    Both,
    /// The requests are over: the upstream's write side is shut; its answers still flow. `refused`: the
    /// answer to a refused request, sent once the upstream is done.
    ResponsesOnly {
        /// The refusal to send last, if a request was refused.
        refused: Option<Vec<u8>>,
    },
    /// The upstream is done (the client's write side is shut) while the client may still send.
    RequestsOnly,
}

impl HttpRelay<'_, '_> {
    /// Relays request by request from the client (each checked), raw from the upstream, until both
    /// halves are done.
    async fn run(&self, buf: Vec<u8>, head: RequestHead) {
        let client = self.conn.client;
        let websocket_accept = head.websocket_accept.clone();
        let (upgraded_tx, upgraded_rx) = oneshot::channel();
        let requests = self.requests(buf, head, upgraded_rx);
        let responses = self.responses(websocket_accept, upgraded_tx);
        tokio::pin!(requests, responses);
        let peek_timeout = self.conn.peek_timeout;
        let mut halves = Halves::Both;
        // Whether the client's write side is already shut (the upstream finished first): shutting it
        // again costs a failing system call per connection.
        let mut client_shut = false;
        let refused = loop {
            halves = match halves {
                Halves::Both => tokio::select! {
                    r = &mut requests => match self.requests_ended(r) {
                        Some(refused) => Halves::ResponsesOnly { refused },
                        None => return,
                    },
                    r = &mut responses => {
                        if r.is_err() {
                            return;
                        }
                        shutdown_write(client);
                        client_shut = true;
                        Halves::RequestsOnly
                    }
                },
                Halves::ResponsesOnly { refused } => {
                    let done = match refused {
                        None => (&mut responses).await,
                        // The upstream may keep its side open after a refusal: then give up on
                        // ordering rather than hold the slot.
                        Some(_) => match tokio::time::timeout(peek_timeout, &mut responses).await {
                            Ok(r) => r,
                            Err(_) => return,
                        },
                    };
                    if done.is_err() {
                        return;
                    }
                    break refused;
                }
                // The upstream has gone and the client keeps the connection idle: nothing more can be
                // answered on it, so it does not keep its slot.
                Halves::RequestsOnly => {
                    match tokio::time::timeout(peek_timeout, &mut requests).await {
                        Ok(r) => match self.requests_ended(r) {
                            Some(refused) => break refused,
                            None => return,
                        },
                        Err(_) => return,
                    }
                }
            };
        };
        match refused {
            Some(response) => send_and_close(client, &response).await,
            None if !client_shut => shutdown_write(client),
            None => {}
        }
    }

    /// The requests half ended: shut the upstream's write side. `None`: the connection is over;
    /// otherwise the refusal to answer last, if any.
    fn requests_ended(&self, end: RequestsEnd) -> Option<Option<Vec<u8>>> {
        match end {
            RequestsEnd::Failed => None,
            RequestsEnd::ClientDone => {
                shutdown_write(self.upstream);
                Some(None)
            }
            // Let the upstream finish answering what was already forwarded, then answer the refused
            // request in order.
            RequestsEnd::Refused(response) => {
                shutdown_write(self.upstream);
                Some(Some(response))
            }
        }
    }

    /// Checks a later request on the connection: same Host, no upgrade. `Err`: the refusal to send.
    fn check_later(&self, head: &RequestHead) -> Result<(), Vec<u8>> {
        let conn = self.conn;
        let name = &self.name;
        if head.upgrade.is_some() {
            let reason = "Upgrade is only supported on the first request of a connection";
            conn.log.refuse(
                &show(head.host.as_bytes()),
                reason,
                RefusalReason::BadRequest,
            );
            let body = conn.refusals.bad_request_body(name.as_str(), reason);
            return Err(http::response(Status::BadRequest, &body));
        }
        match conn.decide(head) {
            Ok(n) if n == *name => Ok(()),
            Ok(n) => {
                let reason = format!("Host changed from {name} to {n} on a kept-alive connection");
                conn.log
                    .refuse(n.as_str(), &reason, RefusalReason::NotAllowed);
                let body = refusal::host_changed_body(&reason, n.as_str());
                Err(http::response(Status::Forbidden, &body))
            }
            Err((status, reason)) => {
                let shown = show(head.host.as_bytes());
                conn.log
                    .refuse(&shown, &reason, refusal::http_refusal(status));
                let body = conn.refusals.policy_body(status, &shown, &reason);
                Err(http::response(status, &body))
            }
        }
    }

    /// Client → upstream: forwards each request head after checking it, then exactly its body.
    async fn requests(
        &self,
        mut buf: Vec<u8>,
        first: RequestHead,
        mut upgraded: oneshot::Receiver<bool>,
    ) -> RequestsEnd {
        let (client, upstream, log) = (self.conn.client, self.upstream, &self.conn.log);
        let mut head = first;
        let mut index = 0usize;
        loop {
            if index > 0 {
                if let Err(response) = self.check_later(&head) {
                    return RequestsEnd::Refused(response);
                }
            }
            let head_out = if index == 0 {
                write_first(upstream, &buf[..head.len]).await
            } else {
                write_all(upstream, &buf[..head.len]).await
            };
            if head_out.is_err() {
                return RequestsEnd::Failed;
            }
            log.up(head.len as u64);
            buf.drain(..head.len);
            if let Err(end) = self.body(&mut buf, &head).await {
                return end;
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
            head = match self.next_head(&mut buf).await {
                Ok(h) => h,
                Err(end) => return end,
            };
        }
    }

    /// Forwards exactly the body of `head` (already partly in `buf`).
    async fn body(&self, buf: &mut Vec<u8>, head: &RequestHead) -> Result<(), RequestsEnd> {
        let (client, upstream, log) = (self.conn.client, self.upstream, &self.conn.log);
        let mut framer = BodyFramer::new(head.body);
        while !framer.is_done() {
            if buf.is_empty() {
                // Large reads while the budget has room for them; past it, a buffer of the size every
                // connection may hold (a client whose upstream stops reading holds its buffer full).
                let read = if self
                    .conn
                    .hold(buf.capacity().max(buf.len() + BODY_READ))
                    .is_ok()
                {
                    BODY_READ
                } else {
                    SMALL_BODY_READ
                };
                match read_some(client, buf, read).await {
                    Ok(0) => return Err(RequestsEnd::ClientDone),
                    Ok(_) => {}
                    Err(_) => return Err(RequestsEnd::Failed),
                }
            }
            let n = framer.advance(buf).map_err(|e| {
                let reason = format!("request body: {e}");
                log.refuse(self.name.as_str(), &reason, RefusalReason::BadRequest);
                let body = self
                    .conn
                    .refusals
                    .bad_request_body(self.name.as_str(), &reason);
                RequestsEnd::Refused(http::response(Status::BadRequest, &body))
            })?;
            if write_all(upstream, &buf[..n]).await.is_err() {
                return Err(RequestsEnd::Failed);
            }
            log.up(n as u64);
            buf.drain(..n);
        }
        Ok(())
    }

    /// Reads the next request head on the kept-alive connection.
    async fn next_head(&self, buf: &mut Vec<u8>) -> Result<RequestHead, RequestsEnd> {
        let (log, name) = (&self.conn.log, self.name.as_str());
        match self.conn.read_head(buf, None).await {
            HeadRead::Head(h) => Ok(h),
            HeadRead::Eof if buf.is_empty() => Err(RequestsEnd::ClientDone),
            HeadRead::Eof => {
                log.client_failed(name, "client closed in the middle of a request head", None);
                Err(RequestsEnd::ClientDone)
            }
            HeadRead::Timeout => {
                log.client_failed(name, "peek timeout", Some(CloseReason::ClientTimeout));
                Err(RequestsEnd::Refused(http::response(
                    Status::RequestTimeout,
                    refusal::LATER_HEAD_TIMEOUT_BODY,
                )))
            }
            HeadRead::Bad(e) => {
                let reason = e.to_string();
                log.refuse(name, &reason, RefusalReason::BadRequest);
                let body = self.conn.refusals.bad_request_body(name, &reason);
                Err(RequestsEnd::Refused(http::response(e.status(), &body)))
            }
            HeadRead::Spent => {
                let reason = PeekBudgetSpent.to_string();
                log.refuse(name, &reason, RefusalReason::PeekMemory);
                Err(RequestsEnd::Refused(http::response(
                    Status::ServiceUnavailable,
                    &busy_body(&reason),
                )))
            }
        }
    }

    /// Upstream → client: raw, except that after an upgrade request (only ever the first;
    /// `websocket_accept` is the `Sec-WebSocket-Accept` it calls for) the response heads are read until
    /// the final one, to learn whether the protocol switched. A `101` that is not a genuine WebSocket
    /// switch gets the client a `502` and ends the connection: the upstream may have switched to a
    /// protocol the router cannot follow.
    async fn responses(
        &self,
        websocket_accept: Option<String>,
        upgraded: oneshot::Sender<bool>,
    ) -> std::io::Result<()> {
        let (client, upstream, log) = (self.conn.client, self.upstream, &self.conn.log);
        let Some(accept) = websocket_accept else {
            drop(upgraded);
            relay::pump(upstream, client, &log.bytes_down).await?;
            return Ok(());
        };
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
                    warn!(kind = log.kind.as_str(), name = %self.name, reason, client = %log.client, "invalid upgrade");
                    log.upstream_error(reason);
                    let text = refusal::invalid_switch_body(self.name.as_str(), reason);
                    refuse_http(client, Status::BadGateway, &text).await;
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
        relay::pump(upstream, client, &log.bytes_down).await?;
        Ok(())
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

/// What a client refused for [`PeekBudgetSpent`] reads: the router is short of memory for a head this
/// large; a smaller head, or the same one later, goes through.
fn busy_body(reason: &str) -> String {
    format!("agent-sandbox router: {reason}; send a smaller request head, or retry later\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_port_cases() {
        assert_eq!(strip_port("a.com:80"), "a.com");
        assert_eq!(strip_port("a.com"), "a.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]:80");
    }
}
