//! The admin endpoint (`--admin ADDR`): liveness, readiness and metrics for an operator or Kubernetes.
//!
//! How it fits: `main` binds ADDR and runs [`serve`] next to the workers; the workers and the reload task
//! update the shared [`AdminState`] (readiness, draining) and its [`Metrics`]. It is served only on its
//! own socket, never through the client-facing listeners.
//!
//! A small HTTP/1.1 responder rather than hyper: three GET routes need a request line and nothing else,
//! and every part of it is bounded: the request head (8 KB), the time to send it and to take the response
//! (5 s each), and the number of connections at once (64, and 8 from any one address; more are closed
//! at once). Each connection
//! carries one request and is closed after its response (`Connection: close`), so nothing is kept alive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::fairness::ClientSlots;
use crate::metrics::{process, Metrics};

/// Largest request head read; a longer one gets 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Time a client has to send its whole request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Time a client has to take the whole response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Time the client has, after the response, to close its side before the connection is dropped.
const LINGER_TIMEOUT: Duration = Duration::from_secs(1);

/// Most input read and discarded after the response.
const LINGER_BYTES: usize = 64 * 1024;

/// Admin connections handled at once; a scraper and two probes need three.
pub const MAX_CONNECTIONS: usize = 64;

/// Admin connections one source address may hold at once. The kubelet's probes come from the node and
/// a scraper from its own pod, so a client that holds connections open (each may take
/// [`READ_TIMEOUT`] to send nothing) cannot use up [`MAX_CONNECTIONS`] and fail the probes.
pub const MAX_PER_SOURCE: u32 = 8;

/// The content type of the text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the admin endpoint reports, shared with the workers and the reload task.
#[derive(Debug, Default)]
pub struct AdminState {
    /// Every metric, rendered on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Every listener of the policy in force is bound and being served.
    listeners_bound: AtomicBool,
    /// A policy has been loaded (start-up succeeded).
    policy_loaded: AtomicBool,
    /// SIGTERM arrived: new work is refused and `/readyz` says so, so load balancers stop sending.
    draining: AtomicBool,
}

impl AdminState {
    /// Not ready, not draining, with these metrics.
    #[must_use]
    pub fn new(metrics: Arc<Metrics>) -> AdminState {
        AdminState {
            metrics,
            listeners_bound: AtomicBool::new(false),
            policy_loaded: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }

    /// Every listener is bound and served (or, `false`: one is being rebound).
    pub fn set_listeners_bound(&self, bound: bool) {
        self.listeners_bound.store(bound, Ordering::SeqCst);
    }

    /// A policy is loaded.
    pub fn set_policy_loaded(&self, loaded: bool) {
        self.policy_loaded.store(loaded, Ordering::SeqCst);
    }

    /// Marks the process as draining; from now on `/readyz` answers 503. There is no way back.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the process is draining.
    #[must_use]
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Ready for traffic: listeners bound, a policy loaded, not draining.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.listeners_bound.load(Ordering::SeqCst)
            && self.policy_loaded.load(Ordering::SeqCst)
            && !self.is_draining()
    }
}

/// Serves the admin endpoint on `listener` until `shutdown` is cancelled; then stops accepting and
/// aborts connections still open (they are at most a few seconds from their own deadline anyway).
pub async fn serve(listener: TcpListener, state: Arc<AdminState>, shutdown: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "admin endpoint listening on {addr}");
    }
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let sources = ClientSlots::new(MAX_PER_SOURCE);
    let mut tasks = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
            // Reap finished connections so the set does not grow over a long uptime.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Some(slot) = sources.try_take(peer.ip()) else {
                    // Closing at once costs nothing, and a prober retries.
                    debug!(%peer, "admin connection refused: {MAX_PER_SOURCE} already open from its address");
                    continue;
                };
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    debug!(%peer, "admin connection refused: {MAX_CONNECTIONS} already open");
                    continue;
                };
                let state = Arc::clone(&state);
                tasks.spawn(async move {
                    handle(stream, &state).await;
                    drop((permit, slot));
                });
            }
            Err(e) => {
                // Out of descriptors (EMFILE/ENFILE) or memory: wait instead of spinning on accept.
                warn!(error = %e, "admin endpoint: accept failed");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
    tasks.shutdown().await;
}

/// One connection: read a request head, answer it, close.
async fn handle(mut stream: TcpStream, state: &AdminState) {
    let response = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => with_process_metrics(respond(&head, state)).await,
        Ok(Err(HeadError::TooLarge)) => Response::error(431, "Request Header Fields Too Large"),
        // The client closed or broke the connection: nobody to answer.
        Ok(Err(HeadError::Io)) => return,
        Err(_) => Response::error(408, "Request Timeout"),
    };
    let bytes = response.into_bytes();
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    if let Err(e) = tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
    {
        debug!(error = %e, "admin response not delivered");
        return;
    }
    // Closing with unread input (a body after the head) makes the kernel send a reset, which can
    // destroy the response before the client has read it; read a bounded amount first.
    let mut sink = [0u8; 1024];
    let mut left = LINGER_BYTES;
    let drain = async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIMEOUT, drain).await;
}

/// Appends the standard `process_*` families ([`crate::metrics::process`]) to a `/metrics` response
/// (GET or HEAD: the length counts them either way). Reading `/proc` takes milliseconds with thousands
/// of connections open, so it runs on tokio's blocking pool: this endpoint shares its runtime with a
/// worker that relays connections (the gateway's only one).
async fn with_process_metrics(mut response: Response) -> Response {
    if response.process_metrics {
        match tokio::task::spawn_blocking(process::sample).await {
            Ok(sample) => response.body.push_str(&process::render(&sample)),
            Err(error) => debug!(%error, "process_* metrics left out"),
        }
    }
    response
}

/// Why no request head could be read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// More than [`MAX_HEAD_BYTES`] without the blank line that ends a head.
    TooLarge,
    /// The connection closed or failed before the head was complete.
    Io,
}

/// Reads until the blank line that ends the request head, within [`MAX_HEAD_BYTES`]. Each read scans only
/// the new bytes (and the three before them), so a head sent a byte at a time costs linear time.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Io);
        }
        let scanned = buf.len();
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf, scanned) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
    }
}

/// The length of the head (through its terminating blank line) if `buf` holds one, looking only at
/// bytes from `scanned - 3` on (the earlier ones were searched before). Accepts bare LF line ends, as
/// RFC 9112 allows recipients to.
fn head_end(buf: &[u8], scanned: usize) -> Option<usize> {
    let from = scanned.saturating_sub(3);
    let tail = buf.get(from..)?;
    (0..tail.len())
        .find_map(|i| {
            let rest = &tail[i..];
            if rest.starts_with(b"\r\n\r\n") {
                Some(from + i + 4)
            } else if rest.starts_with(b"\n\n") {
                Some(from + i + 2)
            } else if rest.starts_with(b"\n\r\n") {
                Some(from + i + 3)
            } else {
                None
            }
        })
        .filter(|&end| end <= MAX_HEAD_BYTES)
}

/// A response to write: status, extra headers, body, and whether to send the body (not for HEAD).
#[derive(Debug)]
struct Response {
    /// Status code.
    status: u16,
    /// Reason phrase.
    reason: &'static str,
    /// Content-Type of the body.
    content_type: &'static str,
    /// Headers besides Content-Type, Content-Length and Connection.
    extra: &'static str,
    /// The body (its length is sent even for HEAD).
    body: String,
    /// False for HEAD: headers only.
    send_body: bool,
    /// A `/metrics` answer: the `process_*` families are still to be appended
    /// ([`with_process_metrics`]).
    process_metrics: bool,
}

impl Response {
    /// A short plain-text response.
    fn text(status: u16, reason: &'static str, body: &str) -> Response {
        Response {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            extra: "",
            body: format!("{body}\n"),
            send_body: true,
            process_metrics: false,
        }
    }

    /// An error whose body is its reason phrase.
    fn error(status: u16, reason: &'static str) -> Response {
        Response::text(status, reason, reason)
    }

    /// The bytes on the wire.
    fn into_bytes(self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{}Connection: close\r\n\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len(),
            self.extra,
        )
        .into_bytes();
        if self.send_body {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// The answer to a complete request head. Pure, so property tests can feed it anything.
fn respond(head: &[u8], state: &AdminState) -> Response {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut headers);
    let (Ok(httparse::Status::Complete(_)), Some(method), Some(target)) =
        (request.parse(head), request.method, request.path)
    else {
        return Response::error(400, "Bad Request");
    };
    // Routing ignores the query string: `/metrics?x=1` is `/metrics`.
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let known = matches!(path, "/livez" | "/readyz" | "/metrics");
    if !known {
        return Response::error(404, "Not Found");
    }
    let send_body = match method {
        "GET" => true,
        "HEAD" => false,
        _ => {
            let mut r = Response::error(405, "Method Not Allowed");
            r.extra = "Allow: GET, HEAD\r\n";
            return r;
        }
    };
    let mut response = match path {
        "/livez" => Response::text(200, "OK", "ok"),
        "/readyz" if state.is_ready() => Response::text(200, "OK", "ready"),
        "/readyz" if state.is_draining() => Response::text(503, "Service Unavailable", "draining"),
        "/readyz" => Response::text(503, "Service Unavailable", "not ready"),
        _ => Response {
            status: 200,
            reason: "OK",
            content_type: METRICS_CONTENT_TYPE,
            extra: "",
            body: state.metrics.render(),
            send_body: true,
            process_metrics: true,
        },
    };
    response.send_body = send_body;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ready_state() -> AdminState {
        let s = AdminState::new(Arc::new(Metrics::new()));
        s.set_listeners_bound(true);
        s.set_policy_loaded(true);
        s
    }

    fn status_of(head: &[u8], state: &AdminState) -> u16 {
        respond(head, state).status
    }

    #[test]
    fn routes_methods_and_queries() {
        let s = ready_state();
        assert_eq!(status_of(b"GET /livez HTTP/1.1\r\n\r\n", &s), 200);
        assert_eq!(status_of(b"GET /readyz?verbose HTTP/1.1\r\n\r\n", &s), 200);
        assert_eq!(status_of(b"HEAD /metrics HTTP/1.0\r\n\r\n", &s), 200);
        assert_eq!(status_of(b"GET /nope HTTP/1.1\r\n\r\n", &s), 404);
        assert_eq!(status_of(b"GET /livez/ HTTP/1.1\r\n\r\n", &s), 404);
        assert_eq!(status_of(b"POST /metrics HTTP/1.1\r\n\r\n", &s), 405);
        assert_eq!(status_of(b"DELETE /livez HTTP/1.1\r\n\r\n", &s), 405);
        assert_eq!(status_of(b"GET /livez HTTP/2.0\r\n\r\n", &s), 400);
        assert_eq!(status_of(b"garbage\r\n\r\n", &s), 400);
        let head = respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", &s).into_bytes();
        assert!(head.ends_with(b"\r\n\r\n"), "HEAD has no body");
    }

    #[test]
    fn readiness_needs_listeners_and_policy_and_no_drain() {
        let s = AdminState::new(Arc::new(Metrics::new()));
        let probe = |s: &AdminState| status_of(b"GET /readyz HTTP/1.1\r\n\r\n", s);
        assert_eq!(probe(&s), 503);
        s.set_policy_loaded(true);
        assert_eq!(probe(&s), 503);
        s.set_listeners_bound(true);
        assert_eq!(probe(&s), 200);
        s.start_draining();
        assert_eq!(probe(&s), 503);
        assert_eq!(status_of(b"GET /livez HTTP/1.1\r\n\r\n", &s), 200);
    }

    #[test]
    fn head_end_finds_terminators() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
    }

    proptest! {
        #[test]
        fn respond_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let s = ready_state();
            let status = respond(&bytes, &s).status;
            prop_assert!(matches!(status, 200 | 400 | 404 | 405 | 503));
        }

        #[test]
        fn respond_never_panics_on_near_requests(
            method in "(GET|HEAD|POST|get|G\u{0}T|)",
            target in "[ -~]{0,40}",
            version in "(HTTP/1\\.[01]|HTTP/9|)",
            tail in "[\r\n: a-z]{0,30}",
        ) {
            let head = format!("{method} {target} {version}\r\n{tail}\r\n\r\n");
            let _ = respond(head.as_bytes(), &ready_state());
        }

        /// Scanning only the new bytes finds the same end as scanning the whole buffer, however the
        /// head was split into reads.
        #[test]
        fn head_end_is_split_independent(
            bytes in proptest::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'a')], 0..64),
            cuts in proptest::collection::vec(0usize..64, 0..8),
        ) {
            let whole = head_end(&bytes, 0);
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < bytes.len()).collect();
            cuts.sort_unstable();
            cuts.push(bytes.len());
            let mut buf = Vec::new();
            let mut found = None;
            for cut in cuts {
                if cut < buf.len() { continue; }
                let scanned = buf.len();
                buf.extend_from_slice(&bytes[scanned..cut]);
                if let Some(end) = head_end(&buf, scanned) { found = Some(end); break; }
            }
            prop_assert_eq!(found, whole);
        }
    }
}
