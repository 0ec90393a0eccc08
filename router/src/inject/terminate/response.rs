//! Response framing for the terminated path: the parts of a response head the relay needs, chunked
//! bodies decoded for the token endpoint, and the router's own `502`.

use crate::proxy::http::{BodyLength, MAX_HEAD_LEN};

/// The most header fields in a response head.
const MAX_RESPONSE_HEADERS: usize = 128;

/// How a response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Body {
    /// By Content-Length or chunked framing (or there is none).
    Framed(BodyLength),
    /// When the upstream closes.
    UntilClose,
}

/// What the relay needs from a response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ResponseFrame {
    /// Bytes of the head.
    pub(super) len: usize,
    /// The status code.
    pub(super) code: u16,
    /// How its body ends (before the request method and status are considered).
    pub(super) body: Body,
    /// The upstream will close after it.
    pub(super) close: bool,
    /// A Content-Encoding other than `identity`, or a transfer coding other than `chunked`.
    pub(super) encoded: bool,
}

/// Parses a response head at the start of `buf`. `Ok(None)`: incomplete.
pub(super) fn parse_response(buf: &[u8]) -> Result<Option<ResponseFrame>, String> {
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
pub(super) fn bad_gateway(reason: &str) -> Vec<u8> {
    let body = format!("agent-sandbox: {reason}\n");
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Where a [`Dechunker`] is in a chunked body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Chunking {
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
pub(super) struct Dechunker {
    /// Where it is.
    state: Chunking,
    /// The chunk-size line so far (bounded by the framer's line cap).
    line: Vec<u8>,
}

impl Dechunker {
    /// The content bytes in `framed`.
    pub(super) fn push(&mut self, framed: &[u8]) -> Vec<u8> {
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
pub(super) fn dechunk(raw: &[u8]) -> Option<Vec<u8>> {
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
pub(super) fn with_length(head: &[u8], n: usize) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
