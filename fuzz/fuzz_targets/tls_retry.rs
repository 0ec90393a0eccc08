//! The HelloRetryRequest path (router/src/proxy/retry.rs): the first ClientHello, whatever the client
//! sent after it in the same reads, and the records the router walks to the second ClientHello, built
//! from structure (a ChangeCipherSpec, early data, second hellos that name the same or another server,
//! with or without ECH, raw bytes) and cut into TLS records and reads of arbitrary sizes. The upstream's
//! first bytes, raw, go through `ServerHelloWatch`.
//!
//! Invariants:
//! - the first hello's reader splits its buffer exactly where the hello's records end
//!   (`into_parts`): the first part is the hello's records, byte for byte, and the second part is what
//!   followed them in the same reads;
//! - the second hello's outcome does not depend on the read boundaries, nor on how many of the bytes
//!   after the first hello came in its reads;
//! - for streams built only from known pieces, the outcome is the one RFC 8446 gives: at most one dummy
//!   ChangeCipherSpec and any early-data records before the second hello, which is accepted only if it
//!   names the first hello's server and carries no ECH; anything else is refused;
//! - `ServerHelloWatch` decides the same for every way of cutting the upstream's bytes;
//! - the work is linear in the input.
#![no_main]

use agent_sandbox_fuzz::{assert_linear, cut, thread_cpu};
use agent_sandbox_router::proxy::retry::{RetryError, SecondHello, ServerHelloWatch};
use agent_sandbox_router::proxy::tls::build::{client_hello, extension, sni_extension};
use agent_sandbox_router::proxy::tls::{HelloReader, MAX_BUFFERED};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

/// The largest TLSCiphertext fragment (RFC 8446 §5.2), which early-data records may reach.
const MAX_CIPHERTEXT: usize = (1 << 14) + 256;

#[derive(Arbitrary, Debug)]
enum Piece {
    /// The dummy ChangeCipherSpec record of middlebox compatibility mode.
    Ccs,
    /// An application-data (early data) record of this length (0 and over the maximum are refused).
    EarlyData(u16),
    /// A second ClientHello: another name (`None`: the first hello's), ECH or not, cut into records.
    Hello {
        other_name: Option<Vec<u8>>,
        ech: bool,
        records: Vec<u16>,
    },
    /// Bytes that may be anything.
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// The first hello's server name.
    name: Vec<u8>,
    /// Record payload sizes of the first hello (cycled; 0 counts as 1).
    first_records: Vec<u16>,
    /// What the client sends after the first hello.
    after: Vec<Piece>,
    /// Read sizes for the whole client stream (cycled; 0 counts as 1).
    reads: Vec<u16>,
    /// The upstream's first bytes.
    server: Vec<u8>,
    /// Read sizes for the upstream's bytes.
    server_reads: Vec<u16>,
}

/// A ClientHello naming `name`, with ECH if asked, cut into handshake records at `sizes`.
fn hello_records(name: &[u8], ech: bool, sizes: &[u16]) -> Vec<u8> {
    let mut ext = extension(43, &[0x02, 0x03, 0x04]);
    ext.extend_from_slice(&sni_extension(&[name]));
    if ech {
        ext.extend_from_slice(&extension(0xfe0d, &[0; 8]));
    }
    let hello = client_hello(Some(&ext));
    let mut out = Vec::new();
    let mut at = 0;
    for n in cut(hello.len(), sizes, 1 << 14) {
        out.extend_from_slice(&[0x16, 0x03, 0x03]);
        out.extend_from_slice(&(n as u16).to_be_bytes());
        out.extend_from_slice(&hello[at..at + n]);
        at += n;
    }
    out
}

/// What RFC 8446 says of the bytes after the first hello, for streams of known pieces: `Some(true)`
/// accepted, `Some(false)` refused, `None` more bytes needed (no second hello yet); `Err(())` when a raw
/// piece makes it unknown.
fn expected(first: &[u8], after: &[Piece]) -> Result<Option<bool>, ()> {
    let mut seen_ccs = false;
    for piece in after {
        match piece {
            Piece::Ccs if seen_ccs => return Ok(Some(false)),
            Piece::Ccs => seen_ccs = true,
            Piece::EarlyData(len) => {
                if *len == 0 || usize::from(*len) > MAX_CIPHERTEXT {
                    return Ok(Some(false));
                }
            }
            Piece::Hello {
                other_name, ech, ..
            } => {
                let name = other_name.as_deref().unwrap_or(first);
                return Ok(Some(name == first && !ech));
            }
            Piece::Raw(_) => return Err(()),
        }
    }
    Ok(None)
}

/// Feeds the client stream to the first hello's reader and then, from where that hello ends, to
/// `SecondHello`, in reads of `reads`. Returns the first hello's two parts and the second outcome.
/// The first hello's two parts (its records, and what followed them in the same reads), and what
/// `SecondHello` made of the rest.
type Fed = ((Vec<u8>, Vec<u8>), Result<bool, RetryError>);

fn feed(stream: &[u8], reads: &[usize]) -> Option<Fed> {
    let mut first = HelloReader::new();
    let mut at = 0;
    let mut reads = reads.iter();
    let sni = loop {
        let n = *reads.next()?;
        let read = &stream[at..at + n];
        at += n;
        match first.push(read) {
            Ok(None) => {}
            Ok(Some(name)) => break name,
            Err(_) => return None,
        }
    };
    let parts = first.into_parts();
    let mut second = SecondHello::new(sni);
    let mut step = second.push(&parts.1);
    for &n in reads {
        if !matches!(step, Ok(false)) {
            break;
        }
        step = second.push(&stream[at..at + n]);
        at += n;
    }
    Some((parts, step))
}

fuzz_target!(|input: Input| {
    let start = thread_cpu();
    if input.name.is_empty() || input.name.len() > 255 {
        return;
    }
    let first = hello_records(&input.name, false, &input.first_records);
    let mut stream = first.clone();
    for piece in &input.after {
        match piece {
            Piece::Ccs => stream.extend_from_slice(&[20, 3, 3, 0, 1, 1]),
            Piece::EarlyData(len) => {
                stream.extend_from_slice(&[23, 3, 3]);
                stream.extend_from_slice(&len.to_be_bytes());
                stream.resize(stream.len() + usize::from(*len), 0x42);
            }
            Piece::Hello {
                other_name,
                ech,
                records,
            } => {
                let name = other_name.as_deref().unwrap_or(&input.name);
                if name.is_empty() || name.len() > 255 {
                    return;
                }
                stream.extend_from_slice(&hello_records(name, *ech, records));
            }
            Piece::Raw(bytes) => stream.extend_from_slice(bytes),
        }
        if stream.len() > 2 * MAX_BUFFERED {
            return;
        }
    }

    // Reads as the input says, then one byte at a time, then the first hello alone and everything
    // after it in one read.
    let patterns = [
        cut(stream.len(), &input.reads, 4096),
        vec![1; stream.len()],
        vec![first.len(), stream.len() - first.len()]
            .into_iter()
            .filter(|&n| n > 0)
            .collect(),
    ];
    let outcomes: Vec<_> = patterns.iter().map(|p| feed(&stream, p)).collect();
    let within_cap = stream.len() - first.len() <= MAX_BUFFERED && first.len() <= MAX_BUFFERED;
    for (pattern, outcome) in patterns.iter().zip(&outcomes) {
        let ((hello, after), _) = outcome.as_ref().expect("a valid first hello was refused");
        assert_eq!(hello, &first, "the first part is not the hello's records");
        let read_with_hello: usize = pattern
            .iter()
            .scan(0, |sum, &n| {
                let before = *sum;
                *sum += n;
                Some((before, *sum))
            })
            .find(|&(_, end)| end >= first.len())
            .map(|(_, end)| end)
            .expect("the reads cover the hello");
        assert_eq!(
            after.as_slice(),
            &stream[first.len()..read_with_hello],
            "the second part is not what followed the hello in its reads"
        );
    }
    if within_cap {
        let decisions: Vec<_> = outcomes
            .iter()
            .map(|o| {
                o.as_ref()
                    .map(|(_, step)| step.as_ref().map_err(|_| ()).copied())
            })
            .collect();
        assert!(
            decisions.windows(2).all(|w| w[0] == w[1]),
            "read boundaries changed the decision: {decisions:?}"
        );
        if let Ok(want) = expected(&input.name, &input.after) {
            let got = decisions[0].expect("checked above");
            match want {
                None => assert_eq!(got, Ok(false), "no second hello, yet decided"),
                Some(true) => assert_eq!(got, Ok(true), "a valid second hello was refused"),
                Some(false) => assert!(got.is_err(), "accepted: {:?}", outcomes[0]),
            }
        }
    } else if let Ok(Some(false)) = expected(&input.name, &input.after) {
        // Over the cap a refusal may come earlier, for size, but never an acceptance.
        for outcome in &outcomes {
            assert!(
                !matches!(outcome, Some((_, Ok(true)))),
                "accepted over the cap"
            );
        }
    }

    let server = &input.server[..input.server.len().min(64 * 1024)];
    let decide = |sizes: &[usize]| {
        let mut watch = ServerHelloWatch::new();
        let mut at = 0;
        for &n in sizes {
            if let Some(first) = watch.push(&server[at..at + n]) {
                return Some(first);
            }
            at += n;
        }
        None
    };
    let whole = decide(&[server.len()][..usize::from(!server.is_empty())]);
    let bytewise = decide(&vec![1; server.len()]);
    let chosen = decide(&cut(server.len(), &input.server_reads, 4096));
    assert_eq!(
        whole, bytewise,
        "upstream read boundaries changed the decision"
    );
    assert_eq!(
        whole, chosen,
        "upstream read boundaries changed the decision"
    );

    assert_linear(
        "HelloRetryRequest path",
        stream.len() * 3 + server.len() * 3,
        start,
    );
});
