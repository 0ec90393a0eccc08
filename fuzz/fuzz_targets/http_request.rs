//! HTTP/1 request heads and body framing over raw client bytes (seeds: real clients' requests), pipelined
//! requests included, driven the way the router's HTTP listener drives them: read, parse the head at the
//! start of the buffer, frame its body, parse the next head.
//!
//! Invariants: the sequence of requests (each head as parsed, each body's length, and how the
//! connection ends, a refusal by its status) does not depend on the read boundaries; the head parser is never shown the same bytes
//! over and over (the bytes it must scan add up to a small multiple of the input: otherwise a client that
//! sends a head a byte at a time makes the router's work quadratic); CPU time is linear.
//!
//! API used (proxy/http/): a `HeadReader` per head, given the whole buffer after every read (it scans only
//! the bytes added since its last call), `RequestHead::{len, body, upgrade}`,
//! `BodyFramer::{new, advance, is_done}`. The bytes counted as scanned are the bytes each call adds.
#![no_main]

use agent_sandbox_fuzz::{assert_linear, pieces, splits, thread_cpu};
use agent_sandbox_router::proxy::http::{BodyError, BodyFramer, HeadReader, RequestHead, Status};
use libfuzzer_sys::fuzz_target;

/// The router reads heads at most this much at a time (`PEEK_READ` in proxy/mod.rs).
const READ: usize = 4096;

#[derive(Debug, PartialEq)]
enum Event {
    Head(RequestHead),
    Body(u64),
    /// A refused head, by the status the client is answered with: the reason may depend on how much
    /// of the head had arrived (a CR inside a line is "bare LF" once the line ends, "bad byte" while
    /// it is incomplete), the refusal must not.
    BadHead(Status),
    BadBody(BodyError),
    /// An upgrade was framed: the router stops reading HTTP until the upstream answers.
    Upgrade,
}

/// Runs the listener's loop over `data` cut at `cuts`; returns the events and the bytes the head parser
/// had to scan (a whole incomplete buffer, or up to the end of a complete head).
fn drive(data: &[u8], cuts: &[usize]) -> (Vec<Event>, usize) {
    let mut events = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut scanned = 0usize;
    let mut framer: Option<(BodyFramer, u64, bool)> = None;
    // The head being read, and how much of `buf` it has been shown.
    let mut reader = HeadReader::new();
    let mut shown = 0usize;
    for piece in pieces(data, cuts) {
        for read in piece.chunks(READ) {
            buf.extend_from_slice(read);
            loop {
                if let Some((f, total, upgrade)) = framer.as_mut() {
                    if !f.is_done() {
                        if buf.is_empty() {
                            break;
                        }
                        match f.advance(&buf) {
                            Ok(n) => {
                                *total += n as u64;
                                buf.drain(..n);
                            }
                            Err(e) => {
                                events.push(Event::BadBody(e));
                                return (events, scanned);
                            }
                        }
                        if !f.is_done() {
                            continue;
                        }
                    }
                    events.push(Event::Body(*total));
                    if *upgrade {
                        events.push(Event::Upgrade);
                        return (events, scanned);
                    }
                    framer = None;
                }
                if buf.is_empty() {
                    break;
                }
                match reader.parse(&buf) {
                    Ok(Some(head)) => {
                        // The reader stops at the end of its head: bytes after it (pipelined) are the
                        // next reader's to scan.
                        scanned += head.len.saturating_sub(shown);
                        buf.drain(..head.len);
                        reader = HeadReader::new();
                        shown = 0;
                        framer = Some((BodyFramer::new(head.body), 0, head.upgrade.is_some()));
                        events.push(Event::Head(head));
                    }
                    Ok(None) => {
                        scanned += buf.len().saturating_sub(shown);
                        shown = buf.len();
                        break;
                    }
                    Err(e) => {
                        events.push(Event::BadHead(e.status()));
                        return (events, scanned);
                    }
                }
            }
        }
    }
    if let Some((f, total, _)) = framer {
        if f.is_done() {
            events.push(Event::Body(total));
        }
    }
    (events, scanned)
}

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    let all = splits(data.len(), data);
    let (whole, _) = drive(data, &all[0]);
    for cuts in &all[1..] {
        let (events, scanned) = drive(data, cuts);
        assert_eq!(
            events,
            whole,
            "the requests depend on the read boundaries ({} reads)",
            cuts.len()
        );
        assert!(
            scanned <= 2 * data.len() + 64,
            "the head parser scanned {scanned} bytes for {} bytes of input in {} reads: quadratic",
            data.len(),
            cuts.len()
        );
    }
    assert_linear("HTTP requests", data.len() * all.len(), start);
});
