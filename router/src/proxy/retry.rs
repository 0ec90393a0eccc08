//! TLS 1.3 HelloRetryRequest: the second ClientHello must name the same server as the first.
//!
//! How it fits: the TLS connection decides on the first ClientHello's SNI. A TLS 1.3 server that wants a
//! different key share answers with a HelloRetryRequest (a ServerHello whose random is a fixed value,
//! RFC 8446 §4.1.3), and the client then sends a second ClientHello. Were the router to splice right after
//! the first hello, that second hello would pass unread: it could name another server (a front that routes
//! by the last hello it saw) or carry Encrypted Client Hello. So the connection reads the upstream's first
//! handshake message with [`ServerHelloWatch`] before splicing; on a retry it reads the client's second
//! hello with [`SecondHello`] and splices only if its SNI is byte-for-byte the first one's and it carries no
//! ECH. Everything read on either side is forwarded unchanged.

use super::tls::{HelloError, HelloReader, MAX_BUFFERED};

/// The ServerHello.random that marks a HelloRetryRequest: SHA-256 of "HelloRetryRequest" (RFC 8446 §4.1.3).
const HRR_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// Record content types (RFC 8446 §5.1).
const CHANGE_CIPHER_SPEC: u8 = 20;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// The dummy ChangeCipherSpec record of middlebox compatibility mode, whole.
const CCS_RECORD: [u8; 6] = [CHANGE_CIPHER_SPEC, 0x03, 0x03, 0x00, 0x01, 0x01];
/// The largest TLSCiphertext fragment (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = (1 << 14) + 256;
/// Handshake message type of a ServerHello.
const SERVER_HELLO: u8 = 2;
/// Handshake header (type, 24-bit length) + legacy_version + random: all the watch needs to see.
const NEEDED: usize = 4 + 2 + 32;
/// The most upstream bytes buffered before deciding; a ServerHello's opening fits in its first record.
/// A safety net: [`MAX_UNDECIDED`] is the real bound.
pub const MAX_SERVER_PEEK: usize = 32 * 1024;
/// The most upstream bytes the watch can hold undecided, whatever the upstream sends: every complete
/// handshake record gives the opening at least one byte, so at most `NEEDED - 1` records of one byte
/// each, then the header of one more. A read (at most 4 KiB here) lands whole on top before the
/// decision, so what an upstream can make a connection hold here is small, and it is not charged.
pub const MAX_UNDECIDED: usize = (NEEDED - 1) * (5 + 1) + 5;

/// What the upstream's first handshake message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerFirst {
    /// A HelloRetryRequest: the client's second ClientHello must be checked.
    RetryRequest,
    /// Anything else (a ServerHello, an alert, a TLS 1.2 server, bytes that are not TLS): the upstream is
    /// the allowed name's own server, so its answer is relayed as it is.
    Other,
}

/// Reads the start of the upstream's reply until it is known whether it is a HelloRetryRequest.
#[derive(Debug, Default)]
pub struct ServerHelloWatch {
    /// Every upstream byte so far (forwarded to the client unchanged).
    raw: Vec<u8>,
}

impl ServerHelloWatch {
    /// An empty watch.
    #[must_use]
    pub fn new() -> ServerHelloWatch {
        ServerHelloWatch::default()
    }

    /// The upstream bytes received so far.
    #[must_use]
    pub fn buffered(&self) -> &[u8] {
        &self.raw
    }

    /// Adds upstream bytes. `None`: more are needed.
    pub fn push(&mut self, data: &[u8]) -> Option<ServerFirst> {
        self.raw.extend_from_slice(data);
        let decided = self.decide();
        if decided.is_none() && self.raw.len() >= MAX_SERVER_PEEK {
            // A ServerHello's first 38 bytes never need this much: not a TLS 1.3 retry.
            return Some(ServerFirst::Other);
        }
        decided
    }

    /// Walks the handshake records received so far and concatenates the payloads until the first
    /// message's opening is complete.
    fn decide(&self) -> Option<ServerFirst> {
        let mut opening = Vec::with_capacity(NEEDED);
        let mut rest = self.raw.as_slice();
        // A record header not in whole yet ends the walk, but not the decision: the opening's first
        // byte, when it is there, may already say that the first message is not a ServerHello, as it
        // did when the same bytes came in smaller reads.
        while opening.len() < NEEDED {
            let Some(&kind) = rest.first() else { break };
            if kind != HANDSHAKE {
                return Some(ServerFirst::Other);
            }
            if rest.len() < 5 {
                break;
            }
            let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            if len == 0 {
                return Some(ServerFirst::Other);
            }
            let available = rest.len().saturating_sub(5).min(len);
            let take = available.min(NEEDED - opening.len());
            opening.extend_from_slice(&rest[5..5 + take]);
            if available < len {
                break;
            }
            rest = &rest[5 + len..];
        }
        if opening.first().is_some_and(|&t| t != SERVER_HELLO) {
            return Some(ServerFirst::Other);
        }
        if opening.len() < NEEDED {
            return None;
        }
        if opening[6..NEEDED] == HRR_RANDOM {
            Some(ServerFirst::RetryRequest)
        } else {
            Some(ServerFirst::Other)
        }
    }
}

/// Why a second ClientHello was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetryError {
    /// The second hello could not be read (or carried ECH).
    #[error("second ClientHello after HelloRetryRequest: {0}")]
    Hello(#[from] HelloError),
    /// The second hello names another server than the first.
    #[error("second ClientHello after HelloRetryRequest names another server")]
    OtherName,
    /// Something other than one ChangeCipherSpec record and early-data records came before the second
    /// hello.
    #[error("unexpected record before the second ClientHello")]
    UnexpectedRecord,
}

/// Reads the client's second ClientHello (after a HelloRetryRequest), from the first byte after the
/// first hello's last record (the bytes the client sent after that hello in the same reads come first).
///
/// Before the second hello, a client may send the one dummy ChangeCipherSpec record of middlebox
/// compatibility (RFC 8446 Appendix D.4) and, if it offered early data, application-data records that a
/// retrying server skips (§4.2.10). Those are walked record by record, the way the upstream reads them,
/// so the hello checked here starts exactly where the upstream's starts; any other record is refused.
#[derive(Debug)]
pub struct SecondHello {
    /// The first hello's SNI, raw.
    first_sni: Vec<u8>,
    /// Every client byte so far (forwarded unchanged on acceptance).
    raw: Vec<u8>,
    /// Offset in `raw` of the next record to walk, until the second hello's first record.
    next_record: usize,
    /// Whether the ChangeCipherSpec record was seen.
    seen_ccs: bool,
    /// Once the second hello has begun: the offset in `raw` up to which bytes went to `hello`.
    fed: Option<usize>,
    /// The reassembly of the second hello proper.
    hello: HelloReader,
}

impl SecondHello {
    /// A reader expecting a second hello that names `first_sni`.
    #[must_use]
    pub fn new(first_sni: Vec<u8>) -> SecondHello {
        SecondHello {
            first_sni,
            raw: Vec::new(),
            next_record: 0,
            seen_ccs: false,
            fed: None,
            hello: HelloReader::new(),
        }
    }

    /// The client bytes received so far.
    #[must_use]
    pub fn buffered(&self) -> &[u8] {
        &self.raw
    }

    /// The memory its buffers hold (their capacity), for the [`PeekBudget`](crate::fairness::PeekBudget).
    #[must_use]
    pub fn held(&self) -> usize {
        self.raw.capacity() + self.hello.held()
    }

    /// Adds client bytes. `Ok(false)`: more are needed; `Ok(true)`: the second hello is acceptable.
    pub fn push(&mut self, data: &[u8]) -> Result<bool, RetryError> {
        if self.raw.len() + data.len() > MAX_BUFFERED {
            return Err(RetryError::Hello(HelloError::TooLarge));
        }
        self.raw.extend_from_slice(data);
        let from = match self.fed {
            Some(from) => from,
            None => match self.skip_records()? {
                Some(start) => start,
                None => return Ok(false),
            },
        };
        if from == self.raw.len() {
            self.fed = Some(from);
            return Ok(false);
        }
        self.fed = Some(self.raw.len());
        match self.hello.push(&self.raw[from..])? {
            None => Ok(false),
            Some(sni) if sni == self.first_sni => Ok(true),
            Some(_) => Err(RetryError::OtherName),
        }
    }

    /// Walks the records before the second hello. `Some(offset)`: a handshake record starts there;
    /// `None`: more bytes are needed.
    fn skip_records(&mut self) -> Result<Option<usize>, RetryError> {
        loop {
            let rest = &self.raw[self.next_record..];
            let Some(&kind) = rest.first() else {
                return Ok(None);
            };
            match kind {
                HANDSHAKE => return Ok(Some(self.next_record)),
                CHANGE_CIPHER_SPEC => {
                    let seen = rest.len().min(CCS_RECORD.len());
                    // Exactly the dummy record, once: type 20, TLS 1.2 version, length 1, value 1.
                    if self.seen_ccs || rest[..seen] != CCS_RECORD[..seen] {
                        return Err(RetryError::UnexpectedRecord);
                    }
                    if seen < CCS_RECORD.len() {
                        return Ok(None);
                    }
                    self.seen_ccs = true;
                    self.next_record += CCS_RECORD.len();
                }
                APPLICATION_DATA => {
                    let seen = rest.len().min(3);
                    if rest[1..seen] != [0x03, 0x03][..seen - 1] {
                        return Err(RetryError::UnexpectedRecord);
                    }
                    if rest.len() < 5 {
                        return Ok(None);
                    }
                    let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
                    if len == 0 || len > MAX_CIPHERTEXT {
                        return Err(RetryError::UnexpectedRecord);
                    }
                    if rest.len() < 5 + len {
                        return Ok(None);
                    }
                    self.next_record += 5 + len;
                }
                _ => return Err(RetryError::UnexpectedRecord),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::tls::build;

    /// A ServerHello handshake record with `random`.
    fn server_hello(random: &[u8; 32]) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(random);
        body.extend_from_slice(&[0x00, 0x13, 0x01, 0x00, 0x00, 0x00]);
        let mut hs = vec![SERVER_HELLO, 0, 0, u8::try_from(body.len()).unwrap()];
        hs.extend_from_slice(&body);
        build::records(&hs, 16384)
    }

    fn watch(bytes: &[u8], step: usize) -> Option<ServerFirst> {
        let mut w = ServerHelloWatch::new();
        for chunk in bytes.chunks(step) {
            if let Some(d) = w.push(chunk) {
                return Some(d);
            }
        }
        None
    }

    #[test]
    fn retry_requests_are_recognised_however_split() {
        let hrr = server_hello(&HRR_RANDOM);
        let plain = server_hello(&[7; 32]);
        for step in [1, 2, 5, 6, 37, 1000] {
            assert_eq!(watch(&hrr, step), Some(ServerFirst::RetryRequest), "{step}");
            assert_eq!(watch(&plain, step), Some(ServerFirst::Other), "{step}");
        }
        // A ServerHello fragmented over several handshake records.
        let mut hs = vec![SERVER_HELLO, 0, 0, 40, 0x03, 0x03];
        hs.extend_from_slice(&HRR_RANDOM);
        hs.extend_from_slice(&[0; 6]);
        assert_eq!(
            watch(&build::records(&hs, 3), 4),
            Some(ServerFirst::RetryRequest)
        );
    }

    /// Found by the `tls_retry` fuzz target: a whole handshake record whose message is not a
    /// ServerHello, read at once, left the watch waiting for the next record, where the same bytes read
    /// one at a time were decided at their sixth.
    #[test]
    fn read_boundaries_do_not_change_the_decision() {
        let record = [22, 20, 3, 0, 5, 255, 97, 195, 236, 0];
        for step in [1, 3, 6, 10] {
            assert_eq!(watch(&record, step), Some(ServerFirst::Other), "{step}");
        }
        // The same with a second record's header begun.
        let mut two = record.to_vec();
        two.extend_from_slice(&[22, 3]);
        assert_eq!(watch(&two, 12), Some(ServerFirst::Other));
        // A ServerHello's first record in whole, the next header partial: still undecided.
        let hrr = server_hello(&HRR_RANDOM);
        let mut split = build::records(&hrr[5..15], 16384);
        split.extend_from_slice(&[22, 3]);
        assert_eq!(watch(&split, split.len()), None);
    }

    #[test]
    fn other_first_messages_are_not_retries() {
        // An alert, garbage, an empty record, another handshake message.
        assert_eq!(watch(&[21, 3, 3, 0, 2, 2, 40], 1), Some(ServerFirst::Other));
        assert_eq!(watch(b"HTTP/1.1 400", 1), Some(ServerFirst::Other));
        assert_eq!(watch(&[22, 3, 3, 0, 0], 5), Some(ServerFirst::Other));
        assert_eq!(
            watch(&build::records(&[11, 0, 0, 40], 100), 1),
            Some(ServerFirst::Other)
        );
        // Incomplete: undecided.
        assert_eq!(watch(&server_hello(&HRR_RANDOM)[..20], 1), None);
    }

    #[test]
    fn the_worst_upstream_is_undecided_for_at_most_max_undecided_bytes() {
        // One payload byte per record: a ServerHello's type, then 36 more, then a header.
        let mut worst = vec![HANDSHAKE, 3, 3, 0, 1, SERVER_HELLO];
        for _ in 1..NEEDED - 1 {
            worst.extend_from_slice(&[HANDSHAKE, 3, 3, 0, 1, 0]);
        }
        worst.extend_from_slice(&[HANDSHAKE, 3, 3, 0, 1]);
        assert_eq!(worst.len(), MAX_UNDECIDED);
        assert_eq!(watch(&worst, 1), None);
        worst.push(0);
        assert_eq!(watch(&worst, 1), Some(ServerFirst::Other));
    }

    proptest::proptest! {
        /// Whatever handshake records an upstream sends, however they are split, the watch decides
        /// before it holds more than [`MAX_UNDECIDED`] bytes.
        #[test]
        fn no_upstream_keeps_the_watch_undecided_past_its_bound(
            records in proptest::collection::vec(
                (
                    proptest::prop_oneof![8 => 1u16..3, 1 => 0u16..80],
                    proptest::collection::vec(proptest::num::u8::ANY, 0..80),
                ),
                1..60,
            ),
            first in proptest::sample::select(vec![SERVER_HELLO, 1, 11]),
        ) {
            let mut stream = Vec::new();
            for (i, (len, payload)) in records.iter().enumerate() {
                stream.extend_from_slice(&[HANDSHAKE, 3, 3]);
                stream.extend_from_slice(&len.to_be_bytes());
                let mut body = payload.clone();
                body.resize(usize::from(*len), 0);
                if i == 0 && !body.is_empty() {
                    body[0] = first;
                }
                stream.extend_from_slice(&body);
            }
            let mut w = ServerHelloWatch::new();
            for b in &stream {
                if w.push(std::slice::from_ref(b)).is_some() {
                    break;
                }
                proptest::prop_assert!(w.buffered().len() <= MAX_UNDECIDED);
            }
        }
    }

    fn second(first: &[u8], bytes: &[u8], step: usize) -> Result<bool, RetryError> {
        let mut s = SecondHello::new(first.to_vec());
        let mut last = Ok(false);
        for chunk in bytes.chunks(step) {
            last = s.push(chunk);
            if !matches!(last, Ok(false)) {
                return last;
            }
        }
        last
    }

    #[test]
    fn second_hello_must_name_the_same_server() {
        let same = build::hello_record(&[b"a.example"], 0);
        let other = build::hello_record(&[b"b.example"], 0);
        let mut with_ccs = vec![20, 3, 3, 0, 1, 1];
        with_ccs.extend_from_slice(&same);
        let mut other_with_ccs = vec![20, 3, 3, 0, 1, 1];
        other_with_ccs.extend_from_slice(&other);
        for step in [1, 3, 6, 7, 4096] {
            assert_eq!(second(b"a.example", &same, step), Ok(true), "{step}");
            assert_eq!(second(b"a.example", &with_ccs, step), Ok(true), "{step}");
            assert_eq!(
                second(b"a.example", &other, step),
                Err(RetryError::OtherName)
            );
            assert_eq!(
                second(b"a.example", &other_with_ccs, step),
                Err(RetryError::OtherName)
            );
        }
        // Case or a trailing dot make another name here: a client repeats its hello's SNI exactly.
        assert_eq!(second(b"A.example", &same, 9), Err(RetryError::OtherName));
    }

    #[test]
    fn second_hello_with_ech_or_odd_records_is_refused() {
        let ech = build::extension(0xfe0d, &[0; 8]);
        let mut exts = build::sni_extension(&[b"a.example"]);
        exts.extend_from_slice(&ech);
        let hello = build::records(&build::client_hello(Some(&exts)), 16384);
        assert_eq!(
            second(b"a.example", &hello, 5),
            Err(RetryError::Hello(HelloError::EncryptedHello))
        );
        // A CCS record of another shape, two CCS records, application data.
        let mut bad = vec![20, 3, 3, 0, 1, 2];
        bad.extend_from_slice(&build::hello_record(&[b"a.example"], 0));
        assert_eq!(
            second(b"a.example", &bad, 1),
            Err(RetryError::UnexpectedRecord)
        );
        let mut two = vec![20, 3, 3, 0, 1, 1, 20, 3, 3, 0, 1, 1];
        two.extend_from_slice(&build::hello_record(&[b"a.example"], 0));
        for step in [1, 100] {
            assert_eq!(
                second(b"a.example", &two, step),
                Err(RetryError::UnexpectedRecord)
            );
        }
        // An alert, early data of another version or of length 0 or over the ciphertext limit.
        for odd in [
            &[21, 3, 3, 0, 2, 1, 0][..],
            &[23, 3, 1, 0, 1, 0],
            &[23, 3, 3, 0, 0],
            &[23, 3, 3, 0x41, 0x01],
        ] {
            for step in [1, 100] {
                assert_eq!(
                    second(b"a.example", odd, step),
                    Err(RetryError::UnexpectedRecord),
                    "{odd:?}"
                );
            }
        }
    }

    /// Early data (application-data records, skipped by a retrying server) and the ChangeCipherSpec
    /// may come before the second hello, in any order, the CCS once.
    #[test]
    fn early_data_and_the_ccs_before_the_second_hello_are_walked() {
        let early = |len: usize| {
            let mut r = vec![23, 3, 3];
            r.extend_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
            r.extend(std::iter::repeat_n(0x5a, len));
            r
        };
        let ccs = CCS_RECORD.to_vec();
        let same = build::hello_record(&[b"a.example"], 0);
        let other = build::hello_record(&[b"b.example"], 0);
        for before in [
            [early(1), ccs.clone()].concat(),
            [ccs.clone(), early(MAX_CIPHERTEXT), early(3)].concat(),
            early(100),
        ] {
            for step in [1, 5, 64, 1 << 20] {
                let bytes = [&before[..], &same].concat();
                assert_eq!(second(b"a.example", &bytes, step), Ok(true), "{step}");
                let bytes = [&before[..], &other].concat();
                assert_eq!(
                    second(b"a.example", &bytes, step),
                    Err(RetryError::OtherName),
                    "{step}"
                );
            }
        }
        // Skipped records count towards the cap.
        let mut s = SecondHello::new(b"a.example".to_vec());
        let mut last = Ok(false);
        for _ in 0..10 {
            last = s.push(&early(MAX_CIPHERTEXT));
            if last.is_err() {
                break;
            }
        }
        assert_eq!(last, Err(RetryError::Hello(HelloError::TooLarge)));
    }

    /// The second hello is read from the first byte after the first hello's last record, as the
    /// upstream reads it. Here the client sends the start of a record holding a hello for another
    /// server with the first, and after the retry the rest, which on its own would look like a hello
    /// for the allowed name (it is the data of the other hello's last extension): refused.
    #[test]
    fn a_second_hello_begun_with_the_first_is_read_from_its_start() {
        let tail = build::hello_record(&[b"a.example"], 0);
        let mut exts = build::extension(43, &[2, 3, 4]);
        exts.extend_from_slice(&build::sni_extension(&[b"b.example"]));
        exts.extend_from_slice(&build::extension(0x0a0a, &tail));
        let real = build::records(&build::client_hello(Some(&exts)), 16 * 1024);
        let cut = real.len() - tail.len();
        let sent_with_the_first = [&CCS_RECORD[..], &real[..cut]].concat();
        let mut s = SecondHello::new(b"a.example".to_vec());
        assert_eq!(s.push(&sent_with_the_first), Ok(false));
        assert_eq!(s.push(&tail), Err(RetryError::OtherName));
        // Read from the tail alone, as before the fix, it would have passed.
        assert_eq!(second(b"a.example", &tail, 1 << 20), Ok(true));
    }
}
