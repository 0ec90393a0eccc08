//! The one change the router makes to a terminated request: its credential header. Pure, no I/O.
//!
//! How it fits: the request loop ([`super::terminate`]) reads a head with the proxy's
//! [`HeadReader`](crate::proxy::http::HeadReader) (caps, hygiene: CRLF lines only, no obs-fold, visible
//! ASCII) and hands the complete head here. Every field line is copied byte for byte except:
//! - `x-api-key: <placeholder>` and `Authorization: Bearer <placeholder>` (the value exactly the API key
//!   placeholder) on an API key host become the real key;
//! - `Authorization: Bearer <access placeholder>` on an OAuth API host becomes the real access token
//!   (the store decides what is a placeholder);
//! - `Accept-Encoding` becomes `identity`, so the response comes back unencoded and the secret scan
//!   ([`super::scan`]) reads what the client will read (a compressed echo of the key would pass it; an
//!   encoded response is refused); `TE` is dropped for the same reason (a transfer coding other than
//!   chunked is refused too);
//! - a token request's `Content-Length` is set to its rewritten body's length.
//!
//! The result stays within the head parser's own caps ([`MAX_HEADERS`] fields, [`MAX_HEAD_LEN`]
//! bytes): a head at a cap that the added `Accept-Encoding` (or `Content-Length`) would take past it
//! is refused ([`RewriteError::TooLarge`]) rather than sent on as one the router itself would refuse.
//!
//! Anything else that holds a placeholder (another header, a value with more around it, a body) passes
//! unchanged.

use agent_sandbox_shared::logs::Credential;

use super::oauth_hook::Secret;
use crate::proxy::http::{trim, MAX_HEADERS, MAX_HEAD_LEN};

/// Why a head cannot be rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RewriteError {
    /// Not a head the parser accepts (never the case for its output).
    Unreadable,
    /// With the router's own fields it would be over the parser's caps: answer 431.
    TooLarge,
}

/// What the credential swap may use for one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Swap<'a> {
    /// The API key placeholder and the real key, on an API key host.
    pub(crate) api_key: Option<(&'a [u8], &'a [u8])>,
    /// Whether the host is an OAuth API host (bearer placeholders go to the store).
    pub(crate) oauth: bool,
    /// The Content-Length to write instead of the head's (a token request's rewritten body).
    pub(crate) content_length: Option<usize>,
}

/// A rewritten head and what the loop needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rewritten {
    /// The head to send upstream, CRLFCRLF included.
    pub(crate) head: Vec<u8>,
    /// Which credential was put in (the API key's when both were: see `both`).
    pub(crate) credential: Credential,
    /// Whether the real OAuth access token was put in (whatever `credential` says).
    pub(crate) oauth_added: bool,
    /// Whether both the API key and the access token were put in: no client needs both, and a request
    /// carrying both would be authorised by whichever the upstream reads, so it is refused.
    pub(crate) both: bool,
    /// The request method, as sent.
    pub(crate) method: String,
    /// The request target, as sent.
    pub(crate) target: String,
    /// The Content-Type value, if any (a token request's body format).
    pub(crate) content_type: Option<String>,
}

/// Rewrites the complete request head `head` (as accepted by the proxy's head parser) for `swap`;
/// `bearer` looks up an OAuth access token for a bearer value (called only when `swap.oauth`).
/// [`RewriteError::Unreadable`]: the head is not what the parser accepts (never the case for its
/// output); [`RewriteError::TooLarge`]: the result would be over the parser's caps.
pub(crate) fn rewrite_head(
    head: &[u8],
    swap: Swap<'_>,
    bearer: &mut dyn FnMut(&[u8]) -> Option<Secret>,
) -> Result<Rewritten, RewriteError> {
    use RewriteError::Unreadable;
    let mut rest = head;
    // httparse skips empty lines before the request line; so does this (and drops them).
    while let Some(r) = rest.strip_prefix(b"\r\n") {
        rest = r;
    }
    let body = rest.strip_suffix(b"\r\n\r\n").ok_or(Unreadable)?;
    let mut lines = Lines(body);
    let request_line = lines.next().ok_or(Unreadable)?;
    let mut parts = request_line.split(|b| *b == b' ');
    let mut part = || {
        std::str::from_utf8(parts.next().ok_or(Unreadable)?)
            .map(str::to_owned)
            .map_err(|_| Unreadable)
    };
    let method = part()?;
    let target = part()?;
    let mut out = Vec::with_capacity(head.len() + 64);
    out.extend_from_slice(request_line);
    out.extend_from_slice(b"\r\n");
    let mut api_key_used = false;
    let mut oauth_used = false;
    let mut content_type = None;
    let mut length_written = false;
    for line in lines {
        let colon = line.iter().position(|b| *b == b':').ok_or(Unreadable)?;
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("accept-encoding") {
            // Replaced by `identity` below.
            continue;
        }
        if is("te") {
            // The transfer codings the client accepts (RFC 9110, 10.1.4): hop-by-hop, and the router
            // is the hop; a coded response is refused, so the upstream is not invited to send one.
            continue;
        }
        if is("content-type") {
            content_type = std::str::from_utf8(value).ok().map(str::to_owned);
        }
        if let (true, Some(n)) = (is("content-length"), swap.content_length) {
            if !length_written {
                out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes());
                length_written = true;
            }
            continue;
        }
        if is("x-api-key") {
            if let Some((placeholder, key)) = swap.api_key {
                if value == placeholder {
                    field(&mut out, name, &[key]);
                    api_key_used = true;
                    continue;
                }
            }
        }
        if is("authorization") {
            if let Some(token) = bearer_token(value) {
                if let Some((placeholder, key)) = swap.api_key {
                    if token == placeholder {
                        field(&mut out, name, &[b"Bearer ", key]);
                        api_key_used = true;
                        continue;
                    }
                }
                if swap.oauth {
                    if let Some(real) = bearer(token) {
                        field(&mut out, name, &[b"Bearer ", real.expose()]);
                        oauth_used = true;
                        continue;
                    }
                }
            }
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    if let (false, Some(n)) = (length_written, swap.content_length) {
        out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes());
    }
    // No Accept-Encoding would let the upstream pick any coding (RFC 9110, 12.5.3).
    out.extend_from_slice(b"Accept-Encoding: identity\r\n\r\n");
    // Field lines: every CRLF but the request line's and the final empty line's.
    let fields = out.windows(2).filter(|w| w == b"\r\n").count() - 2;
    if fields > MAX_HEADERS || out.len() > MAX_HEAD_LEN {
        return Err(RewriteError::TooLarge);
    }
    let credential = if api_key_used {
        Credential::ApiKey
    } else if oauth_used {
        Credential::OAuth
    } else {
        Credential::None
    };
    Ok(Rewritten {
        head: out,
        credential,
        oauth_added: oauth_used,
        both: api_key_used && oauth_used,
        method,
        target,
        content_type,
    })
}

/// Writes `name: parts…` CRLF.
fn field(out: &mut Vec<u8>, name: &[u8], parts: &[&[u8]]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

/// The token of a `Bearer <token>` value (scheme case-insensitive, one or more SP between).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = trim(&value[7..]);
    (!token.is_empty()).then_some(token)
}

/// The CRLF-separated lines of a head without its final empty line.
struct Lines<'a>(&'a [u8]);

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.0.is_empty() {
            return None;
        }
        match self.0.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                let line = &self.0[..i];
                self.0 = &self.0[i + 2..];
                Some(line)
            }
            None => {
                let line = self.0;
                self.0 = &[];
                Some(line)
            }
        }
    }
}

/// The fuzz target's view: parse `data` as the request loop does, then rewrite it with a fixed
/// placeholder and key; checks the invariants the loop relies on (panics when one breaks).
#[cfg(feature = "fuzzing")]
pub fn fuzz_rewrite(data: &[u8]) {
    const PLACEHOLDER: &[u8] = b"sk-ant-api03-placeholder-0000000000";
    const KEY: &[u8] = b"sk-ant-api03-REAL-KEY-11111111111111";
    const ACCESS: &[u8] = b"sk-ant-oat01-placeholder-0000000000";
    let Ok(Some(head)) = crate::proxy::http::parse_request_head(data) else {
        return;
    };
    let swap = Swap {
        api_key: Some((PLACEHOLDER, KEY)),
        oauth: true,
        content_length: None,
    };
    let mut bearer = |t: &[u8]| (t == ACCESS).then(|| Secret::new(b"REAL-ACCESS".to_vec()));
    let r = match rewrite_head(&data[..head.len], swap, &mut bearer) {
        Ok(r) => r,
        // Only a head at a cap: the added fields take it over.
        Err(RewriteError::TooLarge) => {
            let lines = data[..head.len].windows(2).filter(|w| w == b"\r\n").count();
            assert!(
                // Two added fields; at most a byte more per swapped field (the fixed key is one
                // longer than the placeholder) and 64 for the added fields.
                lines + 2 > MAX_HEADERS || head.len + 64 + MAX_HEADERS > MAX_HEAD_LEN,
                "a head well within the caps was refused as too large"
            );
            return;
        }
        Err(RewriteError::Unreadable) => panic!("every head the parser accepts can be rewritten"),
    };
    // The rewritten head parses to the same request.
    let again = crate::proxy::http::parse_request_head(&r.head)
        .expect("a rewritten head parses")
        .expect("a rewritten head is complete");
    assert_eq!(again.len, r.head.len());
    assert_eq!(again.host, head.host);
    assert_eq!(again.body, head.body);
    // The real key is added only where a credential was put in (the input may hold the key's bytes
    // itself: never more of them than that).
    if r.credential == Credential::None {
        assert!(count(&r.head, KEY) <= count(&data[..head.len], KEY));
    }
}

#[cfg(feature = "fuzzing")]
fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &[u8] = b"sk-ant-api03-placeholder-0000000000";
    const K: &[u8] = b"sk-real";
    const A: &[u8] = b"sk-ant-oat01-placeholder-0000000000";

    /// Found by the `inject_rewrite` fuzz target (an auditor's 30 s run): a head of exactly
    /// `MAX_HEADERS` fields, which the parser accepts, became one over the cap with the added
    /// `Accept-Encoding`, and was sent on although the router itself would refuse it.
    #[test]
    fn a_head_at_the_field_cap_is_too_large_once_the_routers_field_is_added() {
        let head = |n: usize| {
            let fields: String = (1..n).map(|i| format!("X-{i}: y\r\n")).collect();
            format!("GET / HTTP/1.1\r\nHost: api.anthropic.com\r\n{fields}\r\n")
        };
        let swap = Swap {
            api_key: Some((P, K)),
            oauth: false,
            content_length: None,
        };
        let at_cap = head(MAX_HEADERS);
        assert!(crate::proxy::http::parse_request_head(at_cap.as_bytes())
            .unwrap()
            .is_some());
        assert_eq!(
            rewrite_head(at_cap.as_bytes(), swap, &mut |_| None),
            Err(RewriteError::TooLarge)
        );
        // One fewer leaves room: the result parses again, within the cap.
        let below = rewrite_head(head(MAX_HEADERS - 1).as_bytes(), swap, &mut |_| None).unwrap();
        assert!(crate::proxy::http::parse_request_head(&below.head)
            .unwrap()
            .is_some());
        // A client's own Accept-Encoding is replaced, not added to: no room needed for it.
        let with_ae = head(MAX_HEADERS).replace("X-1: y", "Accept-Encoding: gzip");
        assert!(rewrite_head(with_ae.as_bytes(), swap, &mut |_| None).is_ok());
    }

    fn run(head: &str, api: bool, oauth: bool) -> Rewritten {
        let mut bearer = |t: &[u8]| (t == A).then(|| Secret::new(b"real-access".to_vec()));
        rewrite_head(
            head.as_bytes(),
            Swap {
                api_key: api.then_some((P, K)),
                oauth,
                content_length: None,
            },
            &mut bearer,
        )
        .unwrap()
    }

    fn text(r: &Rewritten) -> &str {
        std::str::from_utf8(&r.head).unwrap()
    }

    #[test]
    fn swaps_only_exact_placeholders() {
        let p = std::str::from_utf8(P).unwrap();
        let r = run(
            &format!("POST /v1/messages HTTP/1.1\r\nHost: a\r\nX-Api-Key:  {p} \r\nX-Other: {p}\r\nAccept-Encoding: gzip\r\n\r\n"),
            true,
            false,
        );
        assert_eq!(
            text(&r),
            format!("POST /v1/messages HTTP/1.1\r\nHost: a\r\nX-Api-Key: sk-real\r\nX-Other: {p}\r\nAccept-Encoding: identity\r\n\r\n")
        );
        assert_eq!(r.credential, Credential::ApiKey);
        assert_eq!(
            (r.method.as_str(), r.target.as_str()),
            ("POST", "/v1/messages")
        );
        // TE is not passed on (any case): the upstream is not invited to pick a transfer coding.
        let r = run(
            "GET / HTTP/1.1\r\nHost: a\r\nTE: gzip, trailers\r\nte: deflate\r\nX-TE: 1\r\n\r\n",
            true,
            false,
        );
        assert_eq!(
            text(&r),
            "GET / HTTP/1.1\r\nHost: a\r\nX-TE: 1\r\nAccept-Encoding: identity\r\n\r\n"
        );
        // More around the placeholder: untouched.
        let r = run(
            &format!(
                "GET / HTTP/1.1\r\nHost: a\r\nx-api-key: {p}x\r\nAuthorization: Basic {p}\r\n\r\n"
            ),
            true,
            false,
        );
        assert_eq!(r.credential, Credential::None);
        assert!(text(&r).contains(&format!("x-api-key: {p}x\r\n")));
        // Not an API key host: untouched.
        let r = run(
            &format!("GET / HTTP/1.1\r\nHost: a\r\nx-api-key: {p}\r\n\r\n"),
            false,
            false,
        );
        assert_eq!(r.credential, Credential::None);
    }

    #[test]
    fn bearer_api_key_and_oauth() {
        let p = std::str::from_utf8(P).unwrap();
        let a = std::str::from_utf8(A).unwrap();
        let r = run(
            &format!("GET / HTTP/1.1\r\nHost: a\r\nauthorization: bearer {p}\r\n\r\n"),
            true,
            true,
        );
        assert!(text(&r).contains("authorization: Bearer sk-real\r\n"));
        assert_eq!(r.credential, Credential::ApiKey);
        assert!(!r.oauth_added && !r.both);
        let r = run(
            &format!("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {a}\r\n\r\n"),
            true,
            true,
        );
        assert!(text(&r).contains("Authorization: Bearer real-access\r\n"));
        assert_eq!(r.credential, Credential::OAuth);
        assert!(r.oauth_added && !r.both);
        // Both placeholders, in x-api-key and Authorization or in two Authorization lines: both are
        // added and said, whatever the label.
        for head in [
            format!("GET / HTTP/1.1\r\nHost: a\r\nx-api-key: {p}\r\nAuthorization: Bearer {a}\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {a}\r\nAuthorization: Bearer {p}\r\n\r\n"),
        ] {
            let r = run(&head, true, true);
            assert!(r.oauth_added && r.both, "{head}");
            assert_eq!(r.credential, Credential::ApiKey);
        }
        // OAuth placeholder on a host that is not an OAuth API host.
        let r = run(
            &format!("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {a}\r\n\r\n"),
            true,
            false,
        );
        assert_eq!(r.credential, Credential::None);
    }

    #[test]
    fn content_length_override_and_leading_empty_lines() {
        let mut none = |_: &[u8]| None;
        let r = rewrite_head(
            b"\r\nPOST /t HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Type: application/json\r\n\r\n",
            Swap {
                api_key: None,
                oauth: false,
                content_length: Some(42),
            },
            &mut none,
        )
        .unwrap();
        assert_eq!(
            text(&r),
            "POST /t HTTP/1.1\r\nHost: a\r\nContent-Length: 42\r\nContent-Type: application/json\r\nAccept-Encoding: identity\r\n\r\n"
        );
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
        // A token request without a body gets the new body's length.
        let r = rewrite_head(
            b"POST /t HTTP/1.1\r\nHost: a\r\n\r\n",
            Swap {
                api_key: None,
                oauth: false,
                content_length: Some(7),
            },
            &mut none,
        )
        .unwrap();
        assert_eq!(
            text(&r),
            "POST /t HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\nAccept-Encoding: identity\r\n\r\n"
        );
    }
}
