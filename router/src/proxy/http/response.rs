//! The upstream's response head, read only where the router must know what it says: the answer to a
//! WebSocket upgrade request, since only a genuine switch turns the connection into a raw relay.

use super::{trim, HeadError, MAX_HEADERS, MAX_HEAD_LEN};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
