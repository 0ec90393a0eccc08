//! HTTP/1 request heads and body framing: pure functions over bytes, no I/O.
//!
//! How it fits: the HTTP listener feeds the bytes of each request head on a connection to a
//! [`HeadReader`] as they arrive, decides on the Host of the [`RequestHead`] it returns, forwards the
//! head, then forwards exactly the body the head announced, found with a [`BodyFramer`], before it reads
//! the next head. Tracking request boundaries this way is what lets the router see (and refuse) a second
//! request on a kept-alive connection that names another host.
//!
//! Heads that different parsers could read differently are refused rather than forwarded: several Host,
//! Content-Length or Transfer-Encoding headers, Transfer-Encoding together with Content-Length, a transfer
//! coding other than `chunked`, bare LF line endings (in the head or in chunked framing), obs-fold, bytes
//! outside visible ASCII, SP and HTAB anywhere in the head, absolute-form targets naming another host or
//! a port other than 80 or carrying `@`, `#` or `\`, `CONNECT`, and HTTP/2 (the prior-knowledge preface,
//! or an `h2c` upgrade). Host-override fields (`X-Forwarded-Host`, `X-Host`, `X-Original-Host`,
//! `Forwarded`) are refused too: a shared front end may route by them instead of by Host.
//!
//! WebSocket is the only upgrade, and only a well-formed RFC 6455 opening handshake: `GET` without a body,
//! `Upgrade: websocket`, `Connection: upgrade`, `Sec-WebSocket-Version: 13` and a `Sec-WebSocket-Key`
//! of 16 base64-encoded bytes. The head carries the `Sec-WebSocket-Accept` the upstream must answer with
//! ([`RequestHead::websocket_accept`]); the listener switches to a raw relay only after a `101` that
//! carries `Upgrade: websocket` and exactly that value ([`ResponseHead::accepts_websocket`]).
//!
//! The files, in the order a request meets them:
//! - `reader.rs`: [`HeadReader`] finds where a head ends (or where it goes wrong) as its bytes arrive,
//!   seeing each byte once, with the byte-level hygiene checks;
//! - `head.rs`: the complete head through httparse, its header set built in one pass, and the checks on
//!   method, Host, target and body length that make a [`RequestHead`];
//! - `websocket.rs`: the only upgrade, its opening handshake, and the accept value the answer must carry;
//! - `framing.rs`: [`BodyFramer`], where a body ends;
//! - `response.rs`: the upstream's answer to an upgrade;
//! - this file: [`HeadError`] and [`Status`], which decide what a refused client sees, and [`response`].

mod framing;
mod head;
mod reader;
mod response;
mod websocket;

pub use self::framing::{BodyError, BodyFramer, BodyLength};
pub use self::head::{parse_request_head, RequestHead};
pub use self::reader::HeadReader;
pub use self::response::{parse_response_head, ResponseHead};
pub use self::websocket::websocket_accept;

/// The largest request (or response) head accepted.
pub const MAX_HEAD_LEN: usize = 64 * 1024;

/// The most header fields in a head.
pub(crate) const MAX_HEADERS: usize = 128;

/// Why a request head is refused; [`HeadError::status`] gives the response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// The head is larger than [`MAX_HEAD_LEN`].
    #[error("request head larger than {} bytes", MAX_HEAD_LEN)]
    TooLarge,
    /// More than [`MAX_HEADERS`] fields.
    #[error("more than {} header fields", MAX_HEADERS)]
    TooManyHeaders,
    /// httparse refused the syntax.
    #[error("malformed request head ({0})")]
    Malformed(String),
    /// The HTTP/2 prior-knowledge preface.
    #[error("HTTP/2 prior knowledge (h2c) is not supported")]
    Http2Preface,
    /// An `Upgrade: h2c` request or an `HTTP2-Settings` field.
    #[error("upgrade to HTTP/2 (h2c) is not supported")]
    H2cUpgrade,
    /// The `CONNECT` method.
    #[error("CONNECT is not supported")]
    Connect,
    /// No Host field.
    #[error("no Host header")]
    NoHost,
    /// More than one Host field.
    #[error("several Host headers")]
    SeveralHosts,
    /// A Host that is not UTF-8 text.
    #[error("Host header is not text")]
    HostNotText,
    /// A target that is neither origin-form, `*` (for OPTIONS) nor an http(s) absolute-form.
    #[error("malformed request target")]
    BadTarget,
    /// More than one Content-Length field.
    #[error("several Content-Length headers")]
    SeveralContentLengths,
    /// A Content-Length that is not a decimal number.
    #[error("invalid Content-Length")]
    BadContentLength,
    /// More than one Transfer-Encoding field.
    #[error("several Transfer-Encoding headers")]
    SeveralTransferEncodings,
    /// A transfer coding other than exactly `chunked`, or one in an HTTP/1.0 request.
    #[error("unsupported Transfer-Encoding")]
    UnsupportedTransferEncoding,
    /// Both Transfer-Encoding and Content-Length.
    #[error("both Transfer-Encoding and Content-Length")]
    LengthConflict,
    /// More than one Upgrade field.
    #[error("several Upgrade headers")]
    SeveralUpgrades,
    /// An Upgrade to anything but WebSocket.
    #[error("only WebSocket upgrades are supported")]
    UnsupportedUpgrade,
    /// A WebSocket upgrade that is not a valid opening handshake.
    #[error("invalid WebSocket upgrade ({0})")]
    BadWebSocket(&'static str),
    /// A line of the head ends in a bare LF instead of CRLF.
    #[error("bare LF line ending in the request head")]
    BareLf,
    /// A header line starting with SP or HTAB (obsolete line folding).
    #[error("obsolete line folding in the request head")]
    ObsFold,
    /// A control byte or a byte above 0x7E in the request line or a header field.
    #[error("control or non-ASCII byte in the request head")]
    BadByte,
    /// A header field a front end might route by instead of Host.
    #[error("host-override header {0} is not allowed")]
    HostOverride(&'static str),
    /// An absolute-form target with an explicit port other than 80.
    #[error("absolute-form target with a port other than 80")]
    TargetPort,
}

impl HeadError {
    /// The status line of the refusal.
    #[must_use]
    pub fn status(&self) -> Status {
        match self {
            HeadError::Connect => Status::MethodNotAllowed,
            HeadError::TooLarge | HeadError::TooManyHeaders => Status::HeaderTooLarge,
            _ => Status::BadRequest,
        }
    }
}

/// The statuses the router itself answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 400: a request the router will not try to interpret.
    BadRequest,
    /// 403: a host that is not on the allowlist (or resolves to a forbidden address).
    Forbidden,
    /// 405: CONNECT.
    MethodNotAllowed,
    /// 408: the head did not arrive within the peek timeout.
    RequestTimeout,
    /// 431: a head beyond the caps.
    HeaderTooLarge,
    /// 502: the upstream could not be reached.
    BadGateway,
    /// 503: a per-client bound of the gateway (connections held, wildcard lookups) turned the
    /// connection away; trying again later can succeed.
    ServiceUnavailable,
}

impl Status {
    /// `code reason`.
    #[must_use]
    pub fn line(self) -> &'static str {
        match self {
            Status::BadRequest => "400 Bad Request",
            Status::Forbidden => "403 Forbidden",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::RequestTimeout => "408 Request Timeout",
            Status::HeaderTooLarge => "431 Request Header Fields Too Large",
            Status::BadGateway => "502 Bad Gateway",
            Status::ServiceUnavailable => "503 Service Unavailable",
        }
    }
}

/// A complete response the router sends on its own behalf, always closing the connection.
#[must_use]
pub fn response(status: Status, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n",
        status.line(),
        body.len()
    );
    if status == Status::MethodNotAllowed {
        out.push_str("Allow: GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, TRACE\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

/// `v` without leading and trailing SP and HTAB.
pub(crate) fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &v[start..end.max(start)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses a head given as text, in one piece.
    pub(super) fn head(s: &str) -> Result<Option<RequestHead>, HeadError> {
        parse_request_head(s.as_bytes())
    }

    /// RFC 6455 §1.3's example opening handshake.
    pub(super) const WS_OK: &str = "GET /chat HTTP/1.1\r\nHost: a.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn refusal_response() {
        let r = String::from_utf8(response(Status::Forbidden, "no")).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.contains("Content-Length: 2\r\n"));
        assert!(r.ends_with("\r\n\r\nno"));
    }
}
