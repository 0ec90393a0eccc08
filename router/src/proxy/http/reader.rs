//! Finding where a request head ends, or where it goes wrong, as its bytes arrive: each byte is looked
//! at once, however the client splits the head.
//!
//! How it fits: the HTTP connection reads a head in as many pieces as the client sends, and answers as
//! soon as the bytes so far are refused (a stalled client whose request line is malformed gets its 400 at
//! once, not a 408 later). Re-parsing the whole buffer after every read did that in quadratic time: a
//! 64 KB head sent one byte per segment cost gigabytes of parsing on a worker that serves every client.
//!
//! [`HeadReader`] remembers how far it has scanned and runs two small state machines over the new bytes
//! only: [`Hygiene`], the byte-level checks httparse does not make (bare LF, obs-fold, bytes outside
//! visible ASCII), and [`Syntax`], httparse's request grammar as far as needed to know where httparse
//! would stop: at the end of the head or at the first byte it refuses. Only then does httparse run, once,
//! over the buffer (`head::parse_complete`), and its answer is the one returned: the tracker decides when
//! to ask httparse, never what the answer is. Every answer equals the one-shot
//! [`super::parse_request_head`] of the same bytes (the property tests below hold it to the whole-buffer
//! algorithm this replaced).

use super::head::{self, RequestHead};
use super::{HeadError, MAX_HEADERS, MAX_HEAD_LEN};

/// The HTTP/2 prior-knowledge preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// What an HTTP/1 request line must say after the target, the minor version aside.
const VERSION: &[u8] = b"HTTP/1.";

/// Reads one request head incrementally: call [`HeadReader::parse`] with the connection's buffer each
/// time bytes were appended to it. Use a new reader for each head.
#[derive(Clone, Debug)]
pub struct HeadReader {
    /// Bytes of the buffer already scanned: the next call scans from here.
    scanned: usize,
    /// What the first bytes say about the HTTP/2 preface.
    preface: Preface,
    /// The byte-level checks, up to the end of the head.
    hygiene: Hygiene,
    /// Where httparse would be after the bytes scanned.
    syntax: Syntax,
    /// Bytes looked at, by the scan and by httparse: the measure of the reader's cost, which tests hold
    /// to be linear in the length of the head.
    work: usize,
}

impl Default for HeadReader {
    fn default() -> HeadReader {
        HeadReader::new()
    }
}

impl HeadReader {
    /// A reader for a head that has not begun.
    #[must_use]
    pub fn new() -> HeadReader {
        HeadReader {
            scanned: 0,
            preface: Preface::Undecided,
            hygiene: Hygiene::new(),
            syntax: Syntax::Leading,
            work: 0,
        }
    }

    /// Parses the request head at the start of `buf`, which holds everything received since the head
    /// began: the `buf` of the previous call with bytes appended (bytes already scanned are not looked
    /// at again). `Ok(None)`: incomplete (read more). The answer is that of
    /// [`super::parse_request_head`]`(buf)`; a head that is complete or refused stays so.
    pub fn parse(&mut self, buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        if buf.len() < self.scanned {
            // Not the same buffer grown: start over rather than misread it.
            *self = HeadReader::new();
        }
        self.scan(&buf[self.scanned..]);
        self.scanned = buf.len();
        // The order of the checks is that of the whole-buffer algorithm: the preface, then the hygiene
        // of every line so far, then httparse.
        match self.preface(buf) {
            Preface::Seen => return Err(HeadError::Http2Preface),
            Preface::Undecided if buf.len() >= 3 => return Ok(None),
            Preface::Undecided | Preface::Not => {}
        }
        self.hygiene.verdict()?;
        match self.syntax {
            Syntax::Complete | Syntax::Refused => {
                self.work += buf.len();
                head::parse_complete(buf)
            }
            // httparse would answer Partial.
            _ if buf.len() >= MAX_HEAD_LEN => Err(HeadError::TooLarge),
            _ => Ok(None),
        }
    }

    /// Runs both state machines over bytes not scanned before, stopping where neither needs more.
    fn scan(&mut self, new: &[u8]) {
        let mut i = 0;
        while i < new.len() {
            let hygiene_done = self.hygiene.is_done();
            if hygiene_done && (self.hygiene.refused() || self.syntax.is_done()) {
                break;
            }
            // Field values are most of a head's bytes, and inside one both machines only count bytes
            // until a CR, an LF or a byte outside visible ASCII, SP and HTAB: skip those in one go.
            if matches!(self.syntax, Syntax::Value(_)) && self.hygiene.in_plain_line() {
                let run = new[i..]
                    .iter()
                    .take_while(|b| matches!(b, b' ' | b'\t' | 0x21..=0x7e))
                    .count();
                self.hygiene.line_len += run;
                i += run;
                if i == new.len() {
                    break;
                }
            }
            let b = new[i];
            if !hygiene_done {
                self.hygiene.step(b);
            }
            if !self.syntax.is_done() {
                self.syntax = self.syntax.step(b);
            }
            i += 1;
        }
        self.work += i;
    }

    /// Decides, from the first bytes, whether the head is the HTTP/2 preface. Undecided while fewer than
    /// its 16 bytes have arrived and all of them match.
    fn preface(&mut self, buf: &[u8]) -> Preface {
        if self.preface == Preface::Undecided {
            let n = buf.len().min(PREFACE.len());
            self.work += n;
            if buf[..n] != PREFACE[..n] {
                self.preface = Preface::Not;
            } else if n == PREFACE.len() {
                self.preface = Preface::Seen;
            }
        }
        self.preface
    }
}

/// What the first bytes of a head say about the HTTP/2 prior-knowledge preface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Preface {
    /// All bytes so far match it, and there are fewer than all of its bytes.
    Undecided,
    /// A byte differs: an HTTP/1 head (or none).
    Not,
    /// The whole preface.
    Seen,
}

/// Byte-level checks httparse does not make (it accepts bare LF, and bytes above 0x7E in values), line by
/// line up to the empty line that ends the head: every line ends in CRLF, no header line starts with SP
/// or HTAB, and the request line and fields hold only visible ASCII, SP and HTAB. Empty lines before the
/// request line are skipped, as httparse does.
///
/// A complete line is judged when its LF arrives, and the first refused line stands. The unfinished last
/// line is judged on each call from what the state holds ([`Hygiene::verdict`]) and not recorded: its CR
/// may be the start of a CRLF, and a later LF without one turns its refusal into [`HeadError::BareLf`],
/// as it would be for a buffer holding the whole line.
#[derive(Clone, Debug)]
struct Hygiene {
    /// No non-empty line has ended yet: an empty line is one of those a client may send first.
    leading: bool,
    /// Bytes in the current line so far (its LF aside).
    line_len: usize,
    /// The current line starts with SP or HTAB.
    line_folded: bool,
    /// The last byte of the current line is a CR: the end of the line if an LF follows, a stray byte
    /// otherwise.
    cr: bool,
    /// The current line holds a byte outside visible ASCII, SP and HTAB (a trailing CR aside).
    bad_byte: bool,
    /// The first refused line, or the end of the head: nothing after it is scanned.
    end: Option<Result<(), HeadError>>,
}

impl Hygiene {
    /// The state before the first byte.
    fn new() -> Hygiene {
        Hygiene {
            leading: true,
            line_len: 0,
            line_folded: false,
            cr: false,
            bad_byte: false,
            end: None,
        }
    }

    /// True once the head has ended or a line was refused.
    fn is_done(&self) -> bool {
        self.end.is_some()
    }

    /// True once a line was refused.
    fn refused(&self) -> bool {
        matches!(self.end, Some(Err(_)))
    }

    /// True inside a line that has begun, has no pending CR and is not yet judged: a run of visible
    /// ASCII, SP and HTAB there changes nothing but the line's length.
    fn in_plain_line(&self) -> bool {
        self.end.is_none() && self.line_len > 0 && !self.cr
    }

    /// One byte of the head.
    fn step(&mut self, b: u8) {
        if b == b'\n' {
            self.end_line();
            return;
        }
        if self.line_len == 0 {
            self.line_folded = matches!(b, b' ' | b'\t');
        }
        if self.cr {
            // A CR inside the line.
            self.bad_byte = true;
        }
        self.cr = b == b'\r';
        if !self.cr && !matches!(b, b' ' | b'\t' | 0x21..=0x7e) {
            self.bad_byte = true;
        }
        self.line_len += 1;
    }

    /// An LF: judges the line it ends.
    fn end_line(&mut self) {
        if !self.cr {
            self.end = Some(Err(HeadError::BareLf));
            return;
        }
        if self.line_len == 1 {
            if !self.leading {
                self.end = Some(Ok(()));
            }
        } else if let Err(e) = self.line_verdict() {
            self.end = Some(Err(e));
            return;
        } else {
            self.leading = false;
        }
        self.line_len = 0;
        self.line_folded = false;
        self.cr = false;
        self.bad_byte = false;
    }

    /// The checks on the current line's content (a CR that may end it aside).
    fn line_verdict(&self) -> Result<(), HeadError> {
        if !self.leading && self.line_folded {
            Err(HeadError::ObsFold)
        } else if self.bad_byte {
            Err(HeadError::BadByte)
        } else {
            Ok(())
        }
    }

    /// The verdict on the bytes scanned: the first refused line, else the unfinished line's checks.
    fn verdict(&self) -> Result<(), HeadError> {
        match &self.end {
            Some(end) => end.clone(),
            None => self.line_verdict(),
        }
    }
}

/// Where httparse (1.x, `Request::parse` with the default configuration) would be after the bytes
/// scanned, for bytes that pass [`Hygiene`]: those that do not are refused before httparse runs, so a
/// disagreement there changes nothing. The byte classes are httparse's own (RFC 9110 `tchar` for the
/// method and field names, any byte above SP but DEL in the target, HTAB, SP, visible ASCII and obs-text
/// in values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Syntax {
    /// Before the request line: empty lines are skipped.
    Leading,
    /// After a CR before the request line: an LF must follow.
    LeadingLf,
    /// In the method, with at least one byte of it.
    Method,
    /// After the SP that ends the method.
    TargetStart,
    /// In the request target.
    Target,
    /// This many bytes of `HTTP/1.` matched, or all seven of them and the minor version is next.
    Version(u8),
    /// After the minor version: the line ends here.
    VersionEnd,
    /// After the request line's CR.
    RequestLineLf,
    /// At the start of a line after this many complete fields: a field name, or the empty line.
    FieldStart(usize),
    /// After the CR of the empty line that ends the head.
    EndLf,
    /// In a field name.
    Name(usize),
    /// After the colon, in the whitespace before the value.
    ValueStart(usize),
    /// In a field value.
    Value(usize),
    /// After the CR that ends a field.
    ValueLf(usize),
    /// The head is complete: httparse would return `Complete`.
    Complete,
    /// httparse would return an error at the last byte scanned.
    Refused,
}

/// True for a byte httparse accepts in a method or field name: RFC 9110's `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// True for a byte httparse accepts in a request target.
fn is_target_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7e | 0x80..=0xff)
}

/// True for a byte httparse accepts in a field value.
fn is_value_byte(b: u8) -> bool {
    matches!(b, b'\t' | b' '..=0x7e | 0x80..=0xff)
}

impl Syntax {
    /// True once httparse would have its answer.
    fn is_done(self) -> bool {
        matches!(self, Syntax::Complete | Syntax::Refused)
    }

    /// The state after one more byte.
    fn step(self, b: u8) -> Syntax {
        match self {
            Syntax::Leading => match b {
                b'\r' => Syntax::LeadingLf,
                b'\n' => Syntax::Leading,
                _ if is_tchar(b) => Syntax::Method,
                _ => Syntax::Refused,
            },
            Syntax::LeadingLf => Self::expect(b, b'\n', Syntax::Leading),
            Syntax::Method => match b {
                b' ' => Syntax::TargetStart,
                _ if is_tchar(b) => Syntax::Method,
                _ => Syntax::Refused,
            },
            Syntax::TargetStart if is_target_byte(b) => Syntax::Target,
            Syntax::TargetStart => Syntax::Refused,
            Syntax::Target => match b {
                b' ' => Syntax::Version(0),
                _ if is_target_byte(b) => Syntax::Target,
                _ => Syntax::Refused,
            },
            Syntax::Version(n) => match VERSION.get(usize::from(n)) {
                Some(&want) => Self::expect(b, want, Syntax::Version(n + 1)),
                None if matches!(b, b'0' | b'1') => Syntax::VersionEnd,
                None => Syntax::Refused,
            },
            Syntax::VersionEnd => match b {
                b'\r' => Syntax::RequestLineLf,
                b'\n' => Syntax::FieldStart(0),
                _ => Syntax::Refused,
            },
            Syntax::RequestLineLf => Self::expect(b, b'\n', Syntax::FieldStart(0)),
            Syntax::FieldStart(n) => match b {
                b'\r' => Syntax::EndLf,
                b'\n' => Syntax::Complete,
                _ if is_tchar(b) => Syntax::Name(n),
                _ => Syntax::Refused,
            },
            Syntax::EndLf => Self::expect(b, b'\n', Syntax::Complete),
            Syntax::Name(n) => match b {
                b':' => Syntax::ValueStart(n),
                _ if is_tchar(b) => Syntax::Name(n),
                _ => Syntax::Refused,
            },
            Syntax::ValueStart(_) if matches!(b, b' ' | b'\t') => self,
            Syntax::ValueStart(n) | Syntax::Value(n) => match b {
                b'\r' => Syntax::ValueLf(n),
                b'\n' => Self::field_end(n),
                _ if is_value_byte(b) => Syntax::Value(n),
                _ => Syntax::Refused,
            },
            Syntax::ValueLf(n) if b == b'\n' => Self::field_end(n),
            Syntax::ValueLf(_) => Syntax::Refused,
            Syntax::Complete | Syntax::Refused => self,
        }
    }

    /// `next` if `b` is `want`, else refused.
    fn expect(b: u8, want: u8, next: Syntax) -> Syntax {
        if b == want {
            next
        } else {
            Syntax::Refused
        }
    }

    /// After the field that makes `n + 1`: httparse has a slot for [`MAX_HEADERS`] of them and refuses
    /// the next one once it has read it whole.
    fn field_end(n: usize) -> Syntax {
        if n == MAX_HEADERS {
            Syntax::Refused
        } else {
            Syntax::FieldStart(n + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The whole-buffer algorithm the reader replaced: the preface, the hygiene checks over every line
    /// so far, then httparse, all from the first byte on every call.
    fn whole_buffer(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        let n = buf.len().min(PREFACE.len());
        if n >= 3 && buf[..n] == PREFACE[..n] {
            return if n == PREFACE.len() {
                Err(HeadError::Http2Preface)
            } else {
                Ok(None)
            };
        }
        whole_buffer_hygiene(buf)?;
        head::parse_complete(buf)
    }

    /// The hygiene checks as one pass over `buf`, line by line.
    fn whole_buffer_hygiene(buf: &[u8]) -> Result<(), HeadError> {
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

    /// Feeds `bytes` in pieces ending at `cuts` (and at the end), checking each answer against the
    /// whole-buffer algorithm on the same prefix, up to the first answer that is not "read more".
    fn feed_and_compare(bytes: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        ends.push(bytes.len());
        ends.sort_unstable();
        let mut reader = HeadReader::new();
        for end in ends {
            let prefix = &bytes[..end];
            let got = reader.parse(prefix);
            prop_assert_eq!(
                &got,
                &whole_buffer(prefix),
                "prefix {:?}",
                String::from_utf8_lossy(prefix)
            );
            if reader.syntax.is_done() && reader.hygiene.verdict().is_ok() {
                // The tracker asks httparse only when it has its answer (else the reader is correct
                // but no longer linear).
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let status = httparse::Request::new(&mut headers).parse(prefix);
                prop_assert!(
                    !matches!(status, Ok(httparse::Status::Partial)),
                    "{:?}",
                    String::from_utf8_lossy(prefix)
                );
            }
            if !matches!(got, Ok(None)) {
                break;
            }
        }
        Ok(())
    }

    /// Pieces heads are made of, right and wrong, so that random sequences of them reach every state of
    /// the grammar and every hygiene check.
    const PIECES: &[&str] = &[
        "GET",
        "POST",
        "OPTIONS",
        "CONNECT",
        "get",
        "G(T",
        "PRI * HTTP/2.0\r\n",
        "PRI",
        " ",
        "  ",
        "\t",
        "/",
        "/a?b=c",
        "*",
        "http://a.com",
        "http://a.com:80/x",
        "http://b@a.com/",
        "HTTP/1.1",
        "HTTP/1.0",
        "HTTP/1.",
        "HTTP/1.2",
        "HTTP/2.0",
        "HTTP",
        "\r\n",
        "\r\n\r\n",
        "\r",
        "\n",
        "Host",
        "host",
        "Host: a.com",
        ":",
        ": ",
        " :",
        "a.com",
        "Content-Length: 5",
        "Transfer-Encoding: chunked",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "X-Forwarded-Host: b",
        "\x01",
        "\x7f",
        "\0",
        "\u{e9}",
        "(",
        ",",
        "@",
        "#",
        "\\",
        "\"",
        "x",
        "1",
    ];

    /// A choice of the listed texts.
    fn one_of(texts: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
        proptest::sample::select(texts)
    }

    /// A head built part by part, each part right or wrong in one of the ways that matter.
    fn structured_head() -> impl Strategy<Value = Vec<u8>> {
        let eol = || one_of(&["\r\n", "\r\n", "\r\n", "\n", "\r", "\r\r\n", " \r\n"]);
        let request_line = (
            one_of(&["", "\r\n", "\n", "\r\r"]),
            one_of(&[
                "GET", "POST", "OPTIONS", "CONNECT", "G(T", "", "GE\tT", "M-1~",
            ]),
            one_of(&[" ", " ", "  ", "\t", ""]),
            one_of(&[
                "/",
                "/a?b",
                "*",
                "http://a.com:80/",
                "/\u{e9}",
                "/\x7f",
                "/a b",
            ]),
            one_of(&[" ", " ", "  ", "\t"]),
            one_of(&[
                "HTTP/1.1",
                "HTTP/1.0",
                "HTTP/1.2",
                "HTTP/2.0",
                "HTTP/1.",
                "http/1.1",
                "HTTP/1.11",
            ]),
            eol(),
        );
        let field = (
            one_of(&[
                "Host",
                "X-A",
                "Content-Length",
                "(x",
                "",
                " Host",
                "\tX",
                "X y",
                "X\u{e9}",
            ]),
            one_of(&[":", ": ", ":\t", " :", ":  ", ""]),
            one_of(&["a.com", "", "v w", "\x01", "\u{e9}", "a\rb", "5", "\t"]),
            eol(),
        );
        (
            request_line,
            proptest::collection::vec(field, 0..6),
            one_of(&["\r\n", "\r\n", "\n", "\r", "", " \r\n", "\r\nbody"]),
        )
            .prop_map(
                |((lead, method, s1, target, s2, version, eol), fields, end)| {
                    let mut h = format!("{lead}{method}{s1}{target}{s2}{version}{eol}");
                    for (name, colon, value, eol) in fields {
                        h.push_str(&format!("{name}{colon}{value}{eol}"));
                    }
                    h.push_str(end);
                    h.into_bytes()
                },
            )
    }

    /// A valid head with a few bytes replaced, inserted or removed.
    fn edited_head() -> impl Strategy<Value = Vec<u8>> {
        let edit = (
            any::<prop::sample::Index>(),
            proptest::sample::select(&b" \t\r\n:(/012aH\x01\x7f\x80"[..]),
            0u8..3,
        );
        (proptest::collection::vec(edit, 1..4), 0usize..3).prop_map(|(edits, extra)| {
            let mut h = b"GET /x HTTP/1.1\r\nHost: a.com\r\nAccept: */*\r\n".to_vec();
            for _ in 0..extra {
                h.extend_from_slice(b"X-Y: z\r\n");
            }
            h.extend_from_slice(b"\r\nbody");
            for (at, byte, how) in edits {
                let at = at.index(h.len());
                match how {
                    0 => h[at] = byte,
                    1 => h.insert(at, byte),
                    _ => {
                        h.remove(at);
                    }
                }
            }
            h
        })
    }

    /// Random sequences of pieces heads are made of.
    fn pieces() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(proptest::sample::select(PIECES), 0..40)
            .prop_map(|p| p.concat().into_bytes())
    }

    /// Heads, right and wrong, to compare the reader with the whole-buffer parse on.
    fn head_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            structured_head(),
            edited_head(),
            pieces(),
            proptest::collection::vec(any::<u8>(), 0..64)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn answers_as_the_whole_buffer_parse_does_however_split(
            bytes in head_bytes(),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            feed_and_compare(&bytes, &cuts)?;
        }

        #[test]
        fn answers_as_the_whole_buffer_parse_does_byte_by_byte(bytes in head_bytes()) {
            let cuts: Vec<usize> = (0..bytes.len()).collect();
            feed_and_compare(&bytes, &cuts)?;
        }
    }

    #[test]
    fn refused_before_the_head_is_complete() {
        // httparse refuses these at the byte that is wrong; so does the reader, fed one byte at a time.
        for input in [
            "GET  ",
            "GET\t",
            "GET / HTTP/1.2",
            "GET / HTTP/1.1 ",
            "GET / HTTP/1.1\r\nHost ",
            "GET / HTTP/1.1\r\n(",
        ] {
            let mut reader = HeadReader::new();
            let mut got = Ok(None);
            for end in 1..=input.len() {
                got = reader.parse(&input.as_bytes()[..end]);
                if got != Ok(None) {
                    assert_eq!(end, input.len(), "{input:?} refused early: {got:?}");
                }
            }
            assert!(
                matches!(got, Err(HeadError::Malformed(_))),
                "{input:?}: {got:?}"
            );
        }
        // A field over the cap is refused once it is whole, as httparse does.
        let fields: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: y\r\n")).collect();
        let input = format!("GET / HTTP/1.1\r\n{fields}");
        let mut reader = HeadReader::new();
        for end in 1..input.len() {
            assert_eq!(reader.parse(&input.as_bytes()[..end]), Ok(None), "{end}");
        }
        assert_eq!(
            reader.parse(input.as_bytes()),
            Err(HeadError::TooManyHeaders)
        );
    }

    /// The cost of reading a head of `len` bytes one byte per call.
    fn work_one_byte_at_a_time(head: &[u8]) -> usize {
        let mut reader = HeadReader::new();
        for end in 1..head.len() {
            assert_eq!(reader.parse(&head[..end]), Ok(None), "{end}");
        }
        assert!(reader.parse(head).unwrap().is_some());
        reader.work
    }

    #[test]
    fn a_head_sent_one_byte_at_a_time_costs_linear_work() {
        // One long field: the case that cost 64 KB × 64 K calls when each call re-parsed the buffer.
        let long = format!(
            "GET / HTTP/1.1\r\nHost: a.com\r\nX: {}\r\n\r\n",
            "a".repeat(60 * 1024)
        );
        // Many fields: each line end was another full parse.
        let fields: String = (0..120)
            .map(|i| format!("X-Field-{i}: {}\r\n", "v".repeat(480)))
            .collect();
        let many = format!("GET / HTTP/1.1\r\nHost: a.com\r\n{fields}\r\n");
        for head in [long, many] {
            let n = head.len();
            assert!(n > 55 * 1024 && n < MAX_HEAD_LEN, "{n}");
            let work = work_one_byte_at_a_time(head.as_bytes());
            // Each byte scanned once, httparse once over the head, the preface's 16 bytes.
            assert!(work <= 2 * n + 16 * 16, "{work} for {n} bytes");
            // Reading it in one piece costs the same.
            let mut reader = HeadReader::new();
            assert!(reader.parse(head.as_bytes()).unwrap().is_some());
            assert!(work <= reader.work + 16 * 16, "{work} vs {}", reader.work);
        }
    }

    #[test]
    fn the_cap_is_where_it_was() {
        let start = b"GET / HTTP/1.1\r\nHost: a.com\r\nX: ";
        let mut buf = start.to_vec();
        buf.resize(MAX_HEAD_LEN - 1, b'a');
        let mut reader = HeadReader::new();
        assert_eq!(reader.parse(&buf), Ok(None));
        buf.push(b'a');
        assert_eq!(reader.parse(&buf), Err(HeadError::TooLarge));
        assert_eq!(whole_buffer(&buf), Err(HeadError::TooLarge));
        // A complete head of exactly the cap is read; one byte more is refused.
        for (len, want_ok) in [(MAX_HEAD_LEN, true), (MAX_HEAD_LEN + 1, false)] {
            let mut head = start.to_vec();
            head.resize(len - 4, b'a');
            head.extend_from_slice(b"\r\n\r\n");
            let got = HeadReader::new().parse(&head);
            assert_eq!(got.is_ok(), want_ok, "{len}: {got:?}");
            assert_eq!(got, whole_buffer(&head));
        }
    }

    #[test]
    fn a_buffer_that_shrank_is_read_afresh() {
        let mut reader = HeadReader::new();
        assert_eq!(reader.parse(b"GET / HTTP/1.1\r\nHost: a"), Ok(None));
        let short = b"GET / HTTP/1.1\r\n\r\n";
        assert_eq!(reader.parse(short), Err(HeadError::NoHost));
        assert_eq!(reader.parse(short), whole_buffer(short));
    }
}
