//! A complete request head: httparse's reading of it, the header set, and the checks that make a
//! [`RequestHead`] out of it.
//!
//! How it fits: [`HeadReader`] calls [`parse_complete`] once per head, when its scan has found the end
//! of the head or the first byte httparse refuses. One pass over the header fields builds [`Fields`]
//! (refusing duplicates and host-override fields on the way); the checks on Host, target, body length and
//! upgrade then read that set, in a fixed order, so the first refusal a head earns is always the same.

use super::framing::BodyLength;
use super::reader::HeadReader;
use super::{trim, websocket, HeadError, MAX_HEADERS, MAX_HEAD_LEN};

/// A request head that parsed and passed the syntax checks (the Host is not decided yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// Bytes of the head, CRLFCRLF included.
    pub len: usize,
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

/// Parses one request head from the start of `buf`, all of it at once. `Ok(None)`: incomplete (read
/// more). A connection that reads a head in pieces uses a [`HeadReader`] instead, which gives the same
/// answer for every prefix without re-reading the bytes it has seen.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    HeadReader::new().parse(buf)
}

/// Header fields some front ends route by instead of Host.
const HOST_OVERRIDES: [&str; 4] = ["X-Forwarded-Host", "X-Host", "X-Original-Host", "Forwarded"];

/// The header fields the checks read, collected in one pass over the head. Each field that may appear
/// only once is here at most once: a second one was refused while collecting.
#[derive(Debug, Default)]
pub(super) struct Fields<'b> {
    /// The Host value, as sent.
    pub(super) host: Option<&'b [u8]>,
    /// The Content-Length value, as sent.
    pub(super) content_length: Option<&'b [u8]>,
    /// The Transfer-Encoding value, as sent.
    pub(super) transfer_encoding: Option<&'b [u8]>,
    /// The Upgrade value, as sent.
    pub(super) upgrade: Option<&'b [u8]>,
    /// The Sec-WebSocket-Key value, as sent.
    pub(super) ws_key: Option<&'b [u8]>,
    /// The Sec-WebSocket-Version value, as sent.
    pub(super) ws_version: Option<&'b [u8]>,
    /// Some Connection field lists the `upgrade` option.
    pub(super) connection_upgrade: bool,
}

impl<'b> Fields<'b> {
    /// Collects the fields, refusing a second copy of a field that may appear once, `HTTP2-Settings`
    /// and host-override fields, in the order they appear in the head.
    fn collect(headers: &[httparse::Header<'b>]) -> Result<Fields<'b>, HeadError> {
        let mut f = Fields::default();
        for h in headers {
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
                once(&mut f.host, HeadError::SeveralHosts)?;
            } else if name.eq_ignore_ascii_case("content-length") {
                once(&mut f.content_length, HeadError::SeveralContentLengths)?;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                once(
                    &mut f.transfer_encoding,
                    HeadError::SeveralTransferEncodings,
                )?;
            } else if name.eq_ignore_ascii_case("upgrade") {
                once(&mut f.upgrade, HeadError::SeveralUpgrades)?;
            } else if name.eq_ignore_ascii_case("http2-settings") {
                return Err(HeadError::H2cUpgrade);
            } else if name.eq_ignore_ascii_case("sec-websocket-key") {
                once(
                    &mut f.ws_key,
                    HeadError::BadWebSocket("several Sec-WebSocket-Key"),
                )?;
            } else if name.eq_ignore_ascii_case("sec-websocket-version") {
                once(
                    &mut f.ws_version,
                    HeadError::BadWebSocket("several Sec-WebSocket-Version"),
                )?;
            } else if name.eq_ignore_ascii_case("connection") {
                f.connection_upgrade |= h
                    .value
                    .split(|b| *b == b',')
                    .any(|t| trim(t).eq_ignore_ascii_case(b"upgrade"));
            } else if let Some(o) = HOST_OVERRIDES.iter().find(|o| name.eq_ignore_ascii_case(o)) {
                return Err(HeadError::HostOverride(o));
            }
        }
        Ok(f)
    }

    /// The Host value, whitespace-trimmed: there must be one, and it must be text.
    fn host(&self) -> Result<String, HeadError> {
        Ok(std::str::from_utf8(self.host.ok_or(HeadError::NoHost)?)
            .map_err(|_| HeadError::HostNotText)?
            .trim_matches([' ', '\t'])
            .to_owned())
    }

    /// How the body is delimited: a Content-Length of plain decimal digits, or `chunked` alone in an
    /// HTTP/1.1 request, never both.
    fn body_length(&self, version: u8) -> Result<BodyLength, HeadError> {
        Ok(match (self.transfer_encoding, self.content_length) {
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
        })
    }
}

/// Reads the head at the start of `buf` with httparse and checks it. The hygiene checks httparse does
/// not make have passed over the bytes so far (see `reader.rs`).
pub(super) fn parse_complete(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
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
    let fields = Fields::collect(req.headers)?;
    let host = fields.host()?;
    let target_authority = target_authority(method, target)?;
    let body = fields.body_length(version)?;
    let (upgrade, websocket_accept) = match websocket::check_upgrade(method, &fields, body)? {
        Some(ws) => (Some(ws.upgrade), Some(ws.accept)),
        None => (None, None),
    };
    Ok(Some(RequestHead {
        len,
        host,
        target_authority,
        body,
        upgrade,
        websocket_accept,
    }))
}

/// The authority of an absolute-form target; `None` for origin-form and for `*` (OPTIONS only).
fn target_authority(method: &str, target: &str) -> Result<Option<String>, HeadError> {
    if target.starts_with('/') {
        Ok(None)
    } else if target == "*" {
        if method.eq_ignore_ascii_case("OPTIONS") {
            Ok(None)
        } else {
            Err(HeadError::BadTarget)
        }
    } else {
        Ok(Some(absolute_form_authority(target)?.to_owned()))
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

#[cfg(test)]
mod tests {
    use super::super::tests::{head, WS_OK};
    use super::super::{parse_response_head, Status};
    use super::*;
    use proptest::prelude::*;

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

    proptest! {
        #[test]
        fn heads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_request_head(&bytes);
            let _ = parse_response_head(&bytes);
        }
    }
}
