//! ClientHellos built from structure: server_name extensions with any number of names, GREASE and other
//! extensions in any order, ECH, then cut into TLS records of arbitrary sizes and those into TCP reads of
//! arbitrary sizes.
//!
//! Invariants: the reader's outcome does not depend on the record or read boundaries; a hello with one
//! server_name extension holding one non-empty host_name and no ECH yields exactly that name, and every
//! other shape is refused (so a name a policy refuses can never come back as another, allowed one).
#![no_main]

use agent_sandbox_fuzz::{assert_linear, cut, thread_cpu};
use agent_sandbox_router::proxy::tls::build::{client_hello, extension, sni_extension};
use agent_sandbox_router::proxy::tls::{HelloError, HelloReader};
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Ext {
    /// A server_name extension with these host_name entries.
    Sni(Vec<Vec<u8>>),
    /// Any other extension (GREASE values, key shares, padding, ECH when the type says so).
    Other(u16, Vec<u8>),
    /// A large key share, as post-quantum hybrids send (1216 bytes of X25519MLKEM768 and more).
    Big(u16, u16),
}

#[derive(Arbitrary, Debug)]
struct Input {
    exts: Vec<Ext>,
    /// Payload sizes of the TLS records the handshake message is cut into (cycled; 0 counts as 1).
    records: Vec<u16>,
    /// Sizes of the reads the records arrive in (cycled; 0 counts as 1).
    reads: Vec<u16>,
}

fn feed(stream: &[u8], reads: &[usize]) -> Result<Option<Vec<u8>>, HelloError> {
    let mut reader = HelloReader::new();
    let mut at = 0;
    for &n in reads {
        match reader.push(&stream[at..at + n]) {
            Ok(None) => at += n,
            done => return done,
        }
    }
    Ok(None)
}

fuzz_target!(|input: Input| {
    let start = thread_cpu();
    let mut encoded = Vec::new();
    let (mut sni_exts, mut names, mut ech) = (0, Vec::new(), false);
    for ext in &input.exts {
        match ext {
            Ext::Sni(list) => {
                sni_exts += 1;
                names.clone_from(list);
                encoded.extend_from_slice(&sni_extension(
                    &list.iter().map(Vec::as_slice).collect::<Vec<_>>(),
                ));
            }
            Ext::Other(kind, data) => {
                if *kind == 0 {
                    // Type 0 is server_name; raw bytes there are covered by the raw-bytes target.
                    continue;
                }
                ech |= *kind == 0xfe0d || *kind == 0xffce;
                encoded.extend_from_slice(&extension(*kind, data));
            }
            Ext::Big(kind, len) => {
                if *kind == 0 {
                    continue;
                }
                ech |= *kind == 0xfe0d || *kind == 0xffce;
                encoded.extend_from_slice(&extension(*kind, &vec![0x5a; usize::from(*len) % 4096]));
            }
        }
    }
    if encoded.len() > u16::MAX as usize {
        return;
    }
    let hello = client_hello(Some(&encoded));
    let record_cuts = cut(hello.len(), &input.records, 1 << 14);
    let mut stream = Vec::new();
    let mut at = 0;
    for n in record_cuts {
        stream.extend_from_slice(&[0x16, 0x03, 0x01]);
        stream.extend_from_slice(&(n as u16).to_be_bytes());
        stream.extend_from_slice(&hello[at..at + n]);
        at += n;
    }
    let one_record = feed(
        &{
            let mut s = vec![0x16, 0x03, 0x01];
            s.extend_from_slice(&(hello.len() as u16).to_be_bytes());
            s.extend_from_slice(&hello);
            s
        },
        &[hello.len() + 5],
    );
    let outcome = feed(&stream, &cut(stream.len(), &input.reads, 4096));
    let bytewise = feed(&stream, &vec![1; stream.len()]);
    if hello.len() <= 1 << 14 {
        assert_eq!(
            outcome, one_record,
            "record boundaries changed the decision"
        );
    }
    assert_eq!(outcome, bytewise, "read boundaries changed the decision");

    let valid_sni =
        sni_exts == 1 && names.len() == 1 && !names[0].is_empty() && names[0].len() <= 0xffff;
    match &outcome {
        Ok(Some(sni)) => {
            assert!(!ech, "an ECH hello was accepted");
            assert!(valid_sni, "accepted a hello without exactly one host_name");
            assert_eq!(sni, &names[0], "the SNI returned is not the one sent");
        }
        Ok(None) => panic!("a complete hello was not decided"),
        // The caps refuse a hello over MAX_HELLO_LEN, and also records whose raw bytes (headers
        // included: a hello cut into tiny records is several times its size) exceed MAX_BUFFERED.
        Err(_) => assert!(
            ech || !valid_sni
                || hello.len() > agent_sandbox_router::proxy::tls::MAX_HELLO_LEN
                || stream.len() > agent_sandbox_router::proxy::tls::MAX_BUFFERED,
            "a valid hello was refused: {outcome:?}"
        ),
    }
    assert_linear("structured ClientHello", stream.len() * 3, start);
});
