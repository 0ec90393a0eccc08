//! Where a request body ends, found byte by byte without buffering it.
//!
//! How it fits: after forwarding a head, the HTTP connection forwards exactly the body that head
//! announced ([`BodyLength`]) and then reads the next head. Chunked framing is parsed strictly (CRLF
//! only, bounded size lines and trailers) so that the router and the upstream cannot disagree on where
//! one request ends and the next (possibly for another host) begins.

/// The longest chunk-size line (size, extensions, CRLF).
const MAX_CHUNK_LINE: usize = 4096;

/// The most bytes of trailer fields after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

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
    /// Where in the body the bytes so far end.
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

    proptest! {
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
