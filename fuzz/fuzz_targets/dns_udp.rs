//! The DNS-over-UDP fast path's parser (dns_udp.rs `parse`, through `fuzz_api`).
//!
//! Invariants: no panic; a parsed question ends inside the packet; its name is dotted text with the
//! trailing dot, made only of the hostname alphabet and `\DDD` escapes (so a byte the policy must see is
//! never dropped), and it names the same labels as the wire; responses and runts are dropped, never
//! answered; work is linear.
#![no_main]

use agent_sandbox_fuzz::{assert_linear, thread_cpu};
use agent_sandbox_router::fuzz_api::dns_udp_parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    let parsed = dns_udp_parse(data);
    if data.len() < 12 || data[2] & 0x80 != 0 {
        assert_eq!(parsed, Err(None), "a runt or a response must be dropped");
    }
    if let Ok((name, _qtype, _qclass, end, edns)) = parsed {
        assert!(end <= data.len());
        assert!(name.ends_with('.'), "{name:?}");
        assert!(name.len() <= 4 * 255 + 1, "{name:?}");
        // Decode the escapes back and compare with the wire labels.
        let mut wire = Vec::new();
        let mut at = 12;
        while data[at] != 0 {
            let len = usize::from(data[at]);
            wire.push(data[at + 1..at + 1 + len].to_vec());
            at += 1 + len;
        }
        assert_eq!(
            at + 5,
            end,
            "the question ends after the root label, type and class"
        );
        let mut labels = Vec::new();
        if name != "." {
            for label in name.trim_end_matches('.').split('.') {
                let bytes = label.as_bytes();
                let mut out = Vec::new();
                let mut i = 0;
                while i < bytes.len() {
                    if bytes[i] == b'\\' {
                        let code: u8 = label[i + 1..i + 4].parse().expect("a \\DDD escape");
                        out.push(code);
                        i += 4;
                    } else {
                        assert!(
                            bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'-' | b'_'),
                            "{name:?}"
                        );
                        out.push(bytes[i]);
                        i += 1;
                    }
                }
                labels.push(out);
            }
        }
        assert_eq!(labels, wire, "the name is not the wire name");
        assert_eq!(edns, u16::from_be_bytes([data[10], data[11]]) == 1);
    }
    assert_linear("DNS question", data.len(), start);
});
