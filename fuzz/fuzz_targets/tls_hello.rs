//! ClientHello reassembly and SNI extraction over raw client bytes (seeds: real clients' hellos).
//!
//! Invariants: the outcome (an SNI, a refusal, or "needs more") is the same for every way of cutting the
//! bytes into reads; an accepted hello's buffered bytes are a prefix of what the client sent; the work
//! is linear in the input.
#![no_main]

use agent_sandbox_fuzz::{assert_linear, pieces, splits, thread_cpu};
use agent_sandbox_router::proxy::tls::{HelloError, HelloReader};
use libfuzzer_sys::fuzz_target;

/// The router reads at most this much at a time (`PEEK_READ` in proxy/mod.rs).
const READ: usize = 4096;

fn feed(data: &[u8], cuts: &[usize]) -> Result<Option<Vec<u8>>, HelloError> {
    let mut reader = HelloReader::new();
    for piece in pieces(data, cuts) {
        for read in piece.chunks(READ) {
            match reader.push(read) {
                Ok(None) => {}
                Ok(Some(sni)) => {
                    assert!(
                        data.starts_with(reader.buffered()),
                        "buffered bytes changed"
                    );
                    return Ok(Some(sni));
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(None)
}

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    let all = splits(data.len(), data);
    let whole = feed(data, &all[0]);
    for cuts in &all[1..] {
        let outcome = feed(data, cuts);
        assert_eq!(
            outcome,
            whole,
            "the decision depends on the read boundaries ({} reads)",
            cuts.len()
        );
    }
    assert_linear("ClientHello reader", data.len() * all.len(), start);
});
