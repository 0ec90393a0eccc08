//! HTTP/1 request heads and body framing: pure functions over bytes, no I/O.
//!
//! How it fits: the HTTP listener parses each request head on a connection with [`parse_request_head`],
//! decides on its Host, forwards the head, then forwards exactly the body the head announced, found with
//! a [`BodyFramer`], before it parses the next head. Tracking request boundaries this way is what lets
//! the router see (and refuse) a second request on a kept-alive connection that names another host.
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

/// The largest request (or response) head accepted.
pub const MAX_HEAD_LEN: usize = 64 * 1024;

/// The most header fields in a head.
const MAX_HEADERS: usize = 128;

/// The longest chunk-size line (size, extensions, CRLF).
const MAX_CHUNK_LINE: usize = 4096;

/// The most bytes of trailer fields after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

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

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLength {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A request head that parsed and passed the syntax checks (the Host is not decided yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// Bytes of the head, CRLFCRLF included.
    pub len: usize,
    /// The method, as sent.
    pub method: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// The Host value, whitespace-trimmed.
    pub host: String,
    /// The authority of an absolute-form target, if the target was one.
    pub target_authority: Option<String>,
    /// How the body is delimited.
    pub body: BodyLength,
    /// The Upgrade value, if any: only ever `websocket`, in a valid opening handshake.
    pub upgrade: Option<String>,
    /// For a WebSocket upgrade, the `Sec-WebSocket-Accept` value a genuine switch must carry.
    pub websocket_accept: Option<String>,
}

/// Parses one request head from the start of `buf`. `Ok(None)`: incomplete (read more).
pub fn parse_request_head<'b>(buf: &'b [u8]) -> Result<Option<RequestHead>, HeadError> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";
    let n = buf.len().min(PREFACE.len());
    if n >= 3 && buf[..n] == PREFACE[..n] {
        return if n == PREFACE.len() {
            Err(HeadError::Http2Preface)
        } else {
            Ok(None)
        };
    }
    check_raw_head(buf)?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= MAX_HEAD_LEN {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    if len > MAX_HEAD_LEN {
        return Err(HeadError::TooLarge);
    }
    // Complete heads always carry these three.
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("incomplete request line".into()));
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(HeadError::Connect);
    }

    let mut host = None;
    let mut content_length = None;
    let mut transfer_encoding = None;
    let mut upgrade = None;
    let mut ws_key = None;
    let mut ws_version = None;
    let mut connection_upgrade = false;
    for h in req.headers.iter() {
        let name = h.name;
        let once = |slot: &mut Option<&'b [u8]>, err: HeadError| {
            if slot.is_some() {
                Err(err)
            } else {
                *slot = Some(h.value);
                Ok(())
            }
        };
        if name.eq_ignore_ascii_case("host") {
            once(&mut host, HeadError::SeveralHosts)?;
        } else if name.eq_ignore_ascii_case("content-length") {
            once(&mut content_length, HeadError::SeveralContentLengths)?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            once(&mut transfer_encoding, HeadError::SeveralTransferEncodings)?;
        } else if name.eq_ignore_ascii_case("upgrade") {
            once(&mut upgrade, HeadError::SeveralUpgrades)?;
        } else if name.eq_ignore_ascii_case("http2-settings") {
            return Err(HeadError::H2cUpgrade);
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            once(
                &mut ws_key,
                HeadError::BadWebSocket("several Sec-WebSocket-Key"),
            )?;
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            once(
                &mut ws_version,
                HeadError::BadWebSocket("several Sec-WebSocket-Version"),
            )?;
        } else if name.eq_ignore_ascii_case("connection") {
            connection_upgrade |= h
                .value
                .split(|b| *b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"upgrade"));
        } else if let Some(o) = HOST_OVERRIDES.iter().find(|o| name.eq_ignore_ascii_case(o)) {
            return Err(HeadError::HostOverride(o));
        }
    }

    let host = std::str::from_utf8(host.ok_or(HeadError::NoHost)?)
        .map_err(|_| HeadError::HostNotText)?
        .trim_matches([' ', '\t'])
        .to_owned();

    let target_authority = if target.starts_with('/') {
        None
    } else if target == "*" {
        if !method.eq_ignore_ascii_case("OPTIONS") {
            return Err(HeadError::BadTarget);
        }
        None
    } else {
        Some(absolute_form_authority(target)?.to_owned())
    };

    let body = match (transfer_encoding, content_length) {
        (Some(_), Some(_)) => return Err(HeadError::LengthConflict),
        (Some(te), None) => {
            let te = trim(te);
            if version == 0 || !te.eq_ignore_ascii_case(b"chunked") {
                return Err(HeadError::UnsupportedTransferEncoding);
            }
            BodyLength::Chunked
        }
        (None, Some(cl)) => {
            let cl = trim(cl);
            if cl.is_empty() || cl.len() > 18 || !cl.iter().all(u8::is_ascii_digit) {
                return Err(HeadError::BadContentLength);
            }
            let n = cl.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if n == 0 {
                BodyLength::None
            } else {
                BodyLength::Length(n)
            }
        }
        (None, None) => BodyLength::None,
    };

    // Only WebSocket may switch protocols: after a 101 the router relays raw bytes, and a protocol that
    // carries requests of its own (h2c, with an :authority per stream) would bypass the Host check.
    let upgrade = match upgrade {
        None => None,
        Some(v) => {
            let v = String::from_utf8_lossy(trim(v)).into_owned();
            let protocols = || {
                v.split(',')
                    .map(|p| p.trim().split('/').next().unwrap_or(""))
            };
            if protocols().any(|t| t.eq_ignore_ascii_case("h2c")) {
                return Err(HeadError::H2cUpgrade);
            }
            if !protocols().all(|t| t.eq_ignore_ascii_case("websocket")) {
                return Err(HeadError::UnsupportedUpgrade);
            }
            if !v.eq_ignore_ascii_case("websocket") {
                return Err(HeadError::BadWebSocket("Upgrade must be exactly websocket"));
            }
            Some(v)
        }
    };
    // A WebSocket opening handshake (RFC 6455 §4.1), checked in full: the switch it asks for ends the
    // router's view of the connection, so only a request that is unmistakably this may ask for it.
    let websocket_accept =
        match upgrade {
            None => None,
            Some(_) => {
                if method != "GET" {
                    return Err(HeadError::BadWebSocket("method is not GET"));
                }
                if body != BodyLength::None || transfer_encoding.is_some() {
                    return Err(HeadError::BadWebSocket("the request has a body"));
                }
                if !connection_upgrade {
                    return Err(HeadError::BadWebSocket("Connection lacks upgrade"));
                }
                if ws_version.map(trim) != Some(&b"13"[..]) {
                    return Err(HeadError::BadWebSocket("Sec-WebSocket-Version is not 13"));
                }
                let key = ws_key.map(trim).filter(|k| is_websocket_key(k)).ok_or(
                    HeadError::BadWebSocket("Sec-WebSocket-Key is not 16 base64-encoded bytes"),
                )?;
                Some(websocket_accept(key))
            }
        };

    Ok(Some(RequestHead {
        len,
        method: method.to_owned(),
        version,
        host,
        target_authority,
        body,
        upgrade,
        websocket_accept,
    }))
}

/// Header fields some front ends route by instead of Host.
const HOST_OVERRIDES: [&str; 4] = ["X-Forwarded-Host", "X-Host", "X-Original-Host", "Forwarded"];

/// The GUID RFC 6455 appends to the key.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// True for a `Sec-WebSocket-Key`: the canonical base64 encoding of exactly 16 bytes.
fn is_websocket_key(key: &[u8]) -> bool {
    use base64::Engine as _;
    key.len() == 24
        && base64::engine::general_purpose::STANDARD
            .decode(key)
            .is_ok_and(|k| k.len() == 16)
}

/// The `Sec-WebSocket-Accept` for a key: base64(SHA-1(key + GUID)).
#[must_use]
pub fn websocket_accept(key: &[u8]) -> String {
    use base64::Engine as _;
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key);
    sha.update(WEBSOCKET_GUID);
    base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes())
}

/// Byte-level checks httparse does not make (it accepts bare LF, and bytes above 0x7E in values) over
/// the head at the start of `buf`, complete or not: every line ends in CRLF, no header line starts with
/// SP or HTAB, and the request line and fields hold only visible ASCII, SP and HTAB. Empty lines before
/// the request line are skipped, as httparse does.
fn check_raw_head(buf: &[u8]) -> Result<(), HeadError> {
    let mut rest = buf;
    while let Some(r) = rest.strip_prefix(b"\r\n") {
        rest = r;
    }
    let mut first = true;
    loop {
        let (line, complete) = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => (&rest[..i], true),
            None => (rest, false),
        };
        let line = match line.strip_suffix(b"\r") {
            Some(l) if complete => l,
            _ if complete => return Err(HeadError::BareLf),
            // An unfinished line: its CR may be the last byte read so far.
            _ => line.strip_suffix(b"\r").unwrap_or(line),
        };
        if complete && line.is_empty() {
            return Ok(());
        }
        if !first && line.first().is_some_and(|b| matches!(b, b' ' | b'\t')) {
            return Err(HeadError::ObsFold);
        }
        if line
            .iter()
            .any(|b| !matches!(b, b' ' | b'\t' | 0x21..=0x7e))
        {
            return Err(HeadError::BadByte);
        }
        if !complete {
            return Ok(());
        }
        first = false;
        rest = &rest[line.len() + 2..];
    }
}

/// The authority of an `http://` or `https://` absolute-form target. Userinfo, `#` and `\\` are refused
/// (the classic ways to make two parsers disagree on the host), and so is any explicit port but 80: the
/// router only ever dials port 80, and an upstream must not be told the request was for another port.
fn absolute_form_authority(target: &str) -> Result<&str, HeadError> {
    let lower_prefix = |p: &str| {
        target
            .get(..p.len())
            .is_some_and(|t| t.eq_ignore_ascii_case(p))
    };
    let rest = if lower_prefix("http://") {
        &target[7..]
    } else if lower_prefix("https://") {
        &target[8..]
    } else {
        return Err(HeadError::BadTarget);
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty() || authority.contains(['@', '#', '\\']) || target.contains('#') {
        return Err(HeadError::BadTarget);
    }
    // An IPv6 literal has no name to allow; the Host check refuses it.
    if !authority.starts_with('[') {
        if let Some((host, port)) = authority.split_once(':') {
            if host.is_empty() {
                return Err(HeadError::BadTarget);
            }
            if port != "80" {
                return Err(HeadError::TargetPort);
            }
        }
    }
    Ok(authority)
}

fn trim(v: &[u8]) -> &[u8] {
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

/// A response head, as much as the router needs: the status, its length, and what a WebSocket switch
/// must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// Bytes of the head.
    pub len: usize,
    /// The status code.
    pub code: u16,
    /// Exactly one Upgrade field, and it is `websocket`.
    pub upgrade_websocket: bool,
    /// The Sec-WebSocket-Accept value, if there is exactly one.
    pub websocket_accept: Option<String>,
}

impl ResponseHead {
    /// True if this is a genuine WebSocket switch answering the request whose expected
    /// `Sec-WebSocket-Accept` is `accept`: a `101` with `Upgrade: websocket` and that value.
    #[must_use]
    pub fn accepts_websocket(&self, accept: &str) -> bool {
        self.code == 101
            && self.upgrade_websocket
            && self.websocket_accept.as_deref() == Some(accept)
    }
}

/// Parses a response head at the start of `buf`. `Ok(None)`: incomplete.
pub fn parse_response_head(buf: &[u8]) -> Result<Option<ResponseHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let only = |name: &str| {
                let mut values = resp
                    .headers
                    .iter()
                    .filter(|h| h.name.eq_ignore_ascii_case(name));
                match (values.next(), values.next()) {
                    (Some(h), None) => std::str::from_utf8(trim(h.value)).ok(),
                    _ => None,
                }
            };
            Ok(Some(ResponseHead {
                len,
                code: resp.code.unwrap_or(0),
                upgrade_websocket: only("upgrade")
                    .is_some_and(|v| v.eq_ignore_ascii_case("websocket")),
                websocket_accept: only("sec-websocket-accept").map(str::to_owned),
            }))
        }
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_LEN => Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooManyHeaders),
        Err(e) => Err(HeadError::Malformed(e.to_string())),
    }
}

/// Why a body's framing is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// A chunk-size line that is not hex digits followed by optional extensions and CRLF.
    #[error("malformed chunk size line")]
    ChunkSize,
    /// A chunk size beyond 64 bits.
    #[error("chunk size too large")]
    ChunkTooLarge,
    /// Chunk data not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    ChunkEnd,
    /// A line longer than allowed.
    #[error("chunk line or trailers too long")]
    LineTooLong,
    /// Trailer fields not terminated by CRLF.
    #[error("malformed trailer")]
    Trailer,
}

/// Where a [`BodyFramer`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// Counting down a Content-Length, or the data of a chunk.
    Data { left: u64, chunked: bool },
    /// The hex digits of a chunk size; `digits` so far.
    Size { size: u64, digits: u8, line: usize },
    /// After the size: extensions (anything but CR, LF and NUL) up to CR.
    Extension { size: u64, line: usize },
    /// Expecting the LF of a size line.
    SizeLf { size: u64 },
    /// Expecting the CR after chunk data.
    DataCr,
    /// Expecting the LF after chunk data.
    DataLf,
    /// In the trailer section: `at_line_start`, bytes so far.
    Trailer { at_line_start: bool, total: usize },
    /// Expecting the LF of a trailer line (`empty`: the line was empty, ending the body).
    TrailerLf { empty: bool, total: usize },
    /// The body is complete.
    Done,
}

/// Finds where a body ends, byte by byte, without buffering it.
#[derive(Clone, Debug)]
pub struct BodyFramer {
    state: Framing,
}

impl BodyFramer {
    /// A framer for a body of the given kind.
    #[must_use]
    pub fn new(length: BodyLength) -> BodyFramer {
        let state = match length {
            BodyLength::None | BodyLength::Length(0) => Framing::Done,
            BodyLength::Length(n) => Framing::Data {
                left: n,
                chunked: false,
            },
            BodyLength::Chunked => Framing::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
        };
        BodyFramer { state }
    }

    /// True once the whole body has been seen.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.state == Framing::Done
    }

    /// Consumes body bytes from the start of `data`; returns how many belong to the body. Stops at the
    /// end of the body (check [`BodyFramer::is_done`]); the remainder is the next message.
    pub fn advance(&mut self, data: &[u8]) -> Result<usize, BodyError> {
        let mut i = 0;
        while i < data.len() {
            match self.state {
                Framing::Done => return Ok(i),
                Framing::Data { left, chunked } => {
                    let take = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(data.len() - i);
                    i += take;
                    let left = left - take as u64;
                    self.state = match (left, chunked) {
                        (0, false) => Framing::Done,
                        (0, true) => Framing::DataCr,
                        (left, chunked) => Framing::Data { left, chunked },
                    };
                    continue;
                }
                _ => {}
            }
            let b = data[i];
            i += 1;
            self.state = self.step(b)?;
        }
        Ok(i)
    }

    /// One byte of chunked framing.
    fn step(&self, b: u8) -> Result<Framing, BodyError> {
        Ok(match self.state {
            Framing::Size { size, digits, line } => {
                if line + 1 > MAX_CHUNK_LINE {
                    return Err(BodyError::LineTooLong);
                }
                if let Some(d) = (b as char).to_digit(16) {
                    if digits >= 16 {
                        return Err(BodyError::ChunkTooLarge);
                    }
                    Framing::Size {
                        size: size << 4 | u64::from(d),
                        digits: digits + 1,
                        line: line + 1,
                    }
                } else if digits == 0 {
                    return Err(BodyError::ChunkSize);
                } else if b == b'\r' {
                    Framing::SizeLf { size }
                } else if b == b';' || b == b' ' || b == b'\t' {
                    Framing::Extension {
                        size,
                        line: line + 1,
                    }
                } else {
                    return Err(BodyError::ChunkSize);
                }
            }
            Framing::Extension { size, line } => {
                if line + 1 > MAX_CHUNK_LINE {
                    return Err(BodyError::LineTooLong);
                }
                match b {
                    b'\r' => Framing::SizeLf { size },
                    b'\n' | 0 => return Err(BodyError::ChunkSize),
                    _ => Framing::Extension {
                        size,
                        line: line + 1,
                    },
                }
            }
            Framing::SizeLf { size } => {
                if b != b'\n' {
                    return Err(BodyError::ChunkSize);
                }
                if size == 0 {
                    Framing::Trailer {
                        at_line_start: true,
                        total: 0,
                    }
                } else {
                    Framing::Data {
                        left: size,
                        chunked: true,
                    }
                }
            }
            Framing::DataCr if b == b'\r' => Framing::DataLf,
            Framing::DataLf if b == b'\n' => Framing::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
            Framing::DataCr | Framing::DataLf => return Err(BodyError::ChunkEnd),
            Framing::Trailer {
                at_line_start,
                total,
            } => {
                if total + 1 > MAX_TRAILERS {
                    return Err(BodyError::LineTooLong);
                }
                match b {
                    b'\r' => Framing::TrailerLf {
                        empty: at_line_start,
                        total: total + 1,
                    },
                    b'\n' | 0 => return Err(BodyError::Trailer),
                    _ => Framing::Trailer {
                        at_line_start: false,
                        total: total + 1,
                    },
                }
            }
            Framing::TrailerLf { empty, total } => {
                if b != b'\n' {
                    return Err(BodyError::Trailer);
                }
                if empty {
                    Framing::Done
                } else {
                    Framing::Trailer {
                        at_line_start: true,
                        total: total + 1,
                    }
                }
            }
            // Handled by `advance`.
            Framing::Data { .. } | Framing::Done => self.state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn head(s: &str) -> Result<Option<RequestHead>, HeadError> {
        parse_request_head(s.as_bytes())
    }

    #[test]
    fn good_heads() {
        let h = head("GET /x HTTP/1.1\r\nHost: Example.COM:8080 \r\n\r\nrest")
            .unwrap()
            .unwrap();
        assert_eq!(h.host, "Example.COM:8080");
        assert_eq!(
            h.len,
            "GET /x HTTP/1.1\r\nHost: Example.COM:8080 \r\n\r\n".len()
        );
        assert_eq!(h.body, BodyLength::None);
        assert_eq!(h.target_authority, None);
        let h = head("POST / HTTP/1.1\r\nhost: a.com\r\ncontent-length: 12\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyLength::Length(12));
        let h = head("POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: Chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyLength::Chunked);
        let h = head("GET http://a.com:80/p?q HTTP/1.1\r\nHost: a.com\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.target_authority.as_deref(), Some("a.com:80"));
        let h = head(WS_OK).unwrap().unwrap();
        assert_eq!(h.upgrade.as_deref(), Some("websocket"));
        // RFC 6455 §1.3's example.
        assert_eq!(
            h.websocket_accept.as_deref(),
            Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        );
        let h = head(&WS_OK.replace("Connection: Upgrade", "Connection: keep-alive, UPGRADE"))
            .unwrap()
            .unwrap();
        assert!(h.websocket_accept.is_some());
        let h = head(&WS_OK.replace("\r\n\r\n", "\r\nContent-Length: 0\r\n\r\n"))
            .unwrap()
            .unwrap();
        assert!(h.websocket_accept.is_some());
        assert_eq!(
            head("GET / HTTP/1.1\r\nHost: a.com\r\n\r\n")
                .unwrap()
                .unwrap()
                .websocket_accept,
            None
        );
        // Empty lines before a request line are skipped, as httparse does.
        assert!(head("\r\nGET / HTTP/1.1\r\nHost: a.com\r\n\r\n")
            .unwrap()
            .is_some());
        // An incomplete head whose last byte is the CR of a CRLF.
        assert_eq!(head("GET / HTTP/1.1\r\nHost: a.com\r"), Ok(None));
        // Bodies after the head may hold anything.
        assert!(
            head("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n\n\x01\n")
                .unwrap()
                .is_some()
        );
        // Port 80 spelled out is the default port.
        assert!(head("GET http://a.com:80/ HTTP/1.1\r\nHost: a.com\r\n\r\n")
            .unwrap()
            .is_some());
        assert!(head("OPTIONS * HTTP/1.1\r\nHost: a.com\r\n\r\n")
            .unwrap()
            .is_some());
        assert_eq!(head("GET / HTTP/1.1\r\nHost: a.com\r\n"), Ok(None));
        assert_eq!(head("PRI * HT"), Ok(None));
        assert_eq!(head("GE"), Ok(None));
    }

    const WS_OK: &str = "GET /chat HTTP/1.1\r\nHost: a.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

    #[test]
    fn websocket_handshakes_are_checked_in_full() {
        let bad = |what: &str, input: String| {
            assert!(
                matches!(head(&input), Err(HeadError::BadWebSocket(_))),
                "{what}: {input:?}: {:?}",
                head(&input)
            );
        };
        bad("POST", WS_OK.replace("GET", "POST"));
        bad("lowercase get", WS_OK.replace("GET", "get"));
        bad(
            "body",
            WS_OK.replace("\r\n\r\n", "\r\nContent-Length: 5\r\n\r\n"),
        );
        bad(
            "chunked",
            WS_OK.replace("\r\n\r\n", "\r\nTransfer-Encoding: chunked\r\n\r\n"),
        );
        bad(
            "no Connection",
            WS_OK.replace("Connection: Upgrade\r\n", ""),
        );
        bad(
            "Connection without upgrade",
            WS_OK.replace("Connection: Upgrade", "Connection: keep-alive"),
        );
        bad(
            "Connection: upgrades",
            WS_OK.replace("Connection: Upgrade", "Connection: upgrades"),
        );
        bad(
            "no version",
            WS_OK.replace("Sec-WebSocket-Version: 13\r\n", ""),
        );
        bad("version 8", WS_OK.replace("Version: 13", "Version: 8"));
        bad(
            "two versions",
            WS_OK.replace("Version: 13", "Version: 13\r\nSec-WebSocket-Version: 13"),
        );
        bad(
            "no key",
            WS_OK.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
        );
        bad("empty key", WS_OK.replace("dGhlIHNhbXBsZSBub25jZQ==", ""));
        bad(
            "15-byte key",
            WS_OK.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZQ"),
        );
        bad(
            "17-byte key",
            WS_OK.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZSE="),
        );
        bad(
            "not base64",
            WS_OK.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZ!=="),
        );
        bad(
            "two keys",
            WS_OK.replace(
                "Key: dGhlIHNhbXBsZSBub25jZQ==",
                "Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            ),
        );
        bad(
            "two protocols",
            WS_OK.replace("Upgrade: websocket", "Upgrade: websocket, websocket"),
        );
        assert_eq!(
            head(&WS_OK.replace("Upgrade: websocket", "Upgrade: foo")),
            Err(HeadError::UnsupportedUpgrade)
        );

        let accept = websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ==");
        let resp = |s: &str| parse_response_head(s.as_bytes()).unwrap().unwrap();
        let good = resp("HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n");
        assert!(good.accepts_websocket(&accept));
        for not in [
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
            "HTTP/1.1 200 OK\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        ] {
            assert!(!resp(not).accepts_websocket(&accept), "{not:?}");
        }
    }

    #[test]
    fn head_hygiene() {
        let cases: &[(&str, HeadError)] = &[
            ("GET / HTTP/1.1\nHost: a.com\r\n\r\n", HeadError::BareLf),
            ("GET / HTTP/1.1\r\nHost: a.com\n\r\n", HeadError::BareLf),
            ("GET / HTTP/1.1\r\nHost: a.com\r\n\n", HeadError::BareLf),
            ("GET / HTTP/1.1\nHost: a.com\n\n", HeadError::BareLf),
            ("\nGET / HTTP/1.1\r\nHost: a.com\r\n\r\n", HeadError::BareLf),
            // Refused before the head is complete.
            ("GET / HTTP/1.1\nHost: a.c", HeadError::BareLf),
            (
                "GET / HTTP/1.1\r\nX: a\r\n b\r\nHost: a\r\n\r\n",
                HeadError::ObsFold,
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\n\tb\r\n\r\n",
                HeadError::ObsFold,
            ),
            ("GET / HTTP/1.1\r\n Host: a\r\n\r\n", HeadError::ObsFold),
            ("GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", HeadError::BadByte),
            ("GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n", HeadError::BadByte),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nX: \x7f\r\n\r\n",
                HeadError::BadByte,
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nX: caf\u{e9}\r\n\r\n",
                HeadError::BadByte,
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nX\x01: y\r\n\r\n",
                HeadError::BadByte,
            ),
            (
                "GET /\u{e9} HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadByte,
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nX: \x1b[0m\r\n\r\n",
                HeadError::BadByte,
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nX-Forwarded-Host: b.com\r\n\r\n",
                HeadError::HostOverride("X-Forwarded-Host"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nx-host: b.com\r\n\r\n",
                HeadError::HostOverride("X-Host"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nX-ORIGINAL-HOST: b.com\r\n\r\n",
                HeadError::HostOverride("X-Original-Host"),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a.com\r\nForwarded: host=b.com\r\n\r\n",
                HeadError::HostOverride("Forwarded"),
            ),
            (
                "GET http://a.com:8080/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::TargetPort,
            ),
            (
                "GET http://a.com:443/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::TargetPort,
            ),
            (
                "GET http://a.com:080/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::TargetPort,
            ),
            (
                "GET http://a.com:/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::TargetPort,
            ),
            (
                "GET http://a.com:80:80/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::TargetPort,
            ),
            (
                "GET http://a.com#@b.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadTarget,
            ),
            (
                "GET http://a.com/#x HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadTarget,
            ),
            (
                "GET http://a.com\\@b.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadTarget,
            ),
            (
                "GET http://a.com\\b/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadTarget,
            ),
            (
                "GET http://b.com@a.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadTarget,
            ),
            (
                "GET http://:80/ HTTP/1.1\r\nHost: a.com\r\n\r\n",
                HeadError::BadTarget,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(head(input), Err(want.clone()), "{input:?}");
            assert_eq!(want.status(), Status::BadRequest);
        }
    }

    #[test]
    fn refused_heads() {
        let cases: &[(&str, HeadError)] = &[
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HeadError::Http2Preface),
            ("CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n", HeadError::Connect),
            ("GET / HTTP/1.0\r\n\r\n", HeadError::NoHost),
            ("GET / HTTP/1.1\r\n\r\n", HeadError::NoHost),
            ("GET / HTTP/1.1\r\nHost: a.com\r\nHOST: b.com\r\n\r\n", HeadError::SeveralHosts),
            ("GET / HTTP/1.1\r\nHost: a.com\r\nHost: a.com\r\n\r\n", HeadError::SeveralHosts),
            ("GET a.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", HeadError::BadTarget),
            ("GET * HTTP/1.1\r\nHost: a.com\r\n\r\n", HeadError::BadTarget),
            ("GET http://u@b.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", HeadError::BadTarget),
            ("GET http:/// HTTP/1.1\r\nHost: a.com\r\n\r\n", HeadError::BadTarget),
            ("GET ftp://a.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", HeadError::BadTarget),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                HeadError::SeveralContentLengths,
            ),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", HeadError::BadContentLength),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1,1\r\n\r\n", HeadError::BadContentLength),
            ("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", HeadError::BadContentLength),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
                HeadError::BadContentLength,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                HeadError::LengthConflict,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::SeveralTransferEncodings,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                HeadError::UnsupportedTransferEncoding,
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
                HeadError::UnsupportedTransferEncoding,
            ),
            (
                "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                HeadError::UnsupportedTransferEncoding,
            ),
            ("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n", HeadError::H2cUpgrade),
            ("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: foo, H2C\r\n\r\n", HeadError::H2cUpgrade),
            ("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: HTTP/2.0\r\n\r\n", HeadError::UnsupportedUpgrade),
            ("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: TLS/1.2\r\n\r\n", HeadError::UnsupportedUpgrade),
            ("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket, x\r\n\r\n", HeadError::UnsupportedUpgrade),
            ("GET / HTTP/1.1\r\nHost: a\r\nHTTP2-Settings: AAA\r\n\r\n", HeadError::H2cUpgrade),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: a\r\nUpgrade: b\r\n\r\n",
                HeadError::SeveralUpgrades,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(head(input), Err(want.clone()), "{input:?}");
        }
        // httparse's own refusals: space before colon, HTTP/2 version, double space.
        for input in [
            "GET / HTTP/1.1\r\nHost : a.com\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert!(
                matches!(head(input), Err(HeadError::Malformed(_))),
                "{input:?}: {:?}",
                head(input)
            );
        }
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD_LEN));
        assert_eq!(head(&big), Err(HeadError::TooLarge));
        let many: String = (0..200).map(|i| format!("X{i}: y\r\n")).collect();
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            Err(HeadError::TooManyHeaders)
        );
        assert_eq!(HeadError::Connect.status(), Status::MethodNotAllowed);
        assert_eq!(HeadError::NoHost.status(), Status::BadRequest);
    }

    fn frame(kind: BodyLength, data: &[u8]) -> Result<(usize, bool), BodyError> {
        let mut f = BodyFramer::new(kind);
        let n = f.advance(data)?;
        Ok((n, f.is_done()))
    }

    #[test]
    fn framing() {
        assert_eq!(frame(BodyLength::Length(3), b"abcdef"), Ok((3, true)));
        assert_eq!(frame(BodyLength::Length(10), b"abcdef"), Ok((6, false)));
        assert_eq!(frame(BodyLength::None, b"abc"), Ok((0, true)));
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nGET";
        assert_eq!(frame(BodyLength::Chunked, body), Ok((body.len() - 3, true)));
        let body = b"A\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\nnext";
        assert_eq!(frame(BodyLength::Chunked, body), Ok((body.len() - 4, true)));
        assert_eq!(frame(BodyLength::Chunked, b"5\r\nhel"), Ok((6, false)));
        for (bad, want) in [
            (&b"5\nhello\r\n0\r\n\r\n"[..], BodyError::ChunkSize),
            (b"\r\n", BodyError::ChunkSize),
            (b"-5\r\n", BodyError::ChunkSize),
            (b"0x5\r\n", BodyError::ChunkSize),
            (b"5\r\nhelloXX", BodyError::ChunkEnd),
            (b"5\r\nhello\n0\r\n\r\n", BodyError::ChunkEnd),
            (b"11111111111111111\r\n", BodyError::ChunkTooLarge),
            (b"0\r\n\n", BodyError::Trailer),
            (b"0\r\nX: y\n\r\n", BodyError::Trailer),
            (b"5;a\nb\r\n", BodyError::ChunkSize),
        ] {
            assert_eq!(
                frame(BodyLength::Chunked, bad),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn responses() {
        let r = parse_response_head(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nxx",
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.code, 101);
        assert_eq!(r.len, 56);
        assert_eq!(parse_response_head(b"HTTP/1.1 200"), Ok(None));
        assert!(parse_response_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn refusal_response() {
        let r = String::from_utf8(response(Status::Forbidden, "no")).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.contains("Content-Length: 2\r\n"));
        assert!(r.ends_with("\r\n\r\nno"));
    }

    proptest! {
        #[test]
        fn heads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_request_head(&bytes);
            let _ = parse_response_head(&bytes);
        }

        #[test]
        fn framing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = frame(BodyLength::Chunked, &bytes);
        }

        #[test]
        fn chunked_split_invariance(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 0..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut body = Vec::new();
            for c in &chunks {
                body.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                body.extend_from_slice(c);
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"0\r\n\r\n");
            let whole = body.len();
            body.extend_from_slice(b"GET / HTTP/1.1\r\n");
            prop_assert_eq!(frame(BodyLength::Chunked, &body), Ok((whole, true)));
            let cut = cut.index(body.len());
            let mut f = BodyFramer::new(BodyLength::Chunked);
            let a = f.advance(&body[..cut]).unwrap();
            let b = if f.is_done() { 0 } else { f.advance(&body[cut..]).unwrap() };
            prop_assert!(f.is_done());
            prop_assert_eq!(a + b, whole);
        }
    }
}
