//! The one upgrade the router lets through: a WebSocket opening handshake (RFC 6455 §4.1), checked in
//! full, and the `Sec-WebSocket-Accept` value that the upstream's `101` must carry.
//!
//! How it fits: after a `101` the router relays raw bytes and no longer sees request boundaries, so a
//! protocol that carries requests of its own (h2c, with an `:authority` per stream) would bypass the
//! Host check. [`check_upgrade`] refuses every other upgrade while the head is checked; the connection
//! switches only when [`super::ResponseHead::accepts_websocket`] finds the accept value computed here.

use super::framing::BodyLength;
use super::head::Fields;
use super::{trim, HeadError};

/// The GUID RFC 6455 appends to the key.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A request's valid WebSocket upgrade.
#[derive(Debug)]
pub(super) struct Upgrade {
    /// The Upgrade value: `websocket`, in the case the client sent.
    pub(super) upgrade: String,
    /// The `Sec-WebSocket-Accept` value a genuine switch must carry.
    pub(super) accept: String,
}

/// Checks a head's Upgrade field: none, or WebSocket in a valid opening handshake (`GET`, no body,
/// `Connection: upgrade`, version 13, a key of 16 base64-encoded bytes). Anything else is refused.
pub(super) fn check_upgrade(
    method: &str,
    fields: &Fields<'_>,
    body: BodyLength,
) -> Result<Option<Upgrade>, HeadError> {
    let Some(v) = fields.upgrade else {
        return Ok(None);
    };
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
    // The switch this asks for ends the router's view of the connection, so only a request that is
    // unmistakably an opening handshake may ask for it.
    if method != "GET" {
        return Err(HeadError::BadWebSocket("method is not GET"));
    }
    if body != BodyLength::None || fields.transfer_encoding.is_some() {
        return Err(HeadError::BadWebSocket("the request has a body"));
    }
    if !fields.connection_upgrade {
        return Err(HeadError::BadWebSocket("Connection lacks upgrade"));
    }
    if fields.ws_version.map(trim) != Some(&b"13"[..]) {
        return Err(HeadError::BadWebSocket("Sec-WebSocket-Version is not 13"));
    }
    let key = fields
        .ws_key
        .map(trim)
        .filter(|k| is_websocket_key(k))
        .ok_or(HeadError::BadWebSocket(
            "Sec-WebSocket-Key is not 16 base64-encoded bytes",
        ))?;
    Ok(Some(Upgrade {
        upgrade: v,
        accept: websocket_accept(key),
    }))
}

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

#[cfg(test)]
mod tests {
    use super::super::parse_response_head;
    use super::super::tests::{head, WS_OK};
    use super::*;

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
}
