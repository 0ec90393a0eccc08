//! The allowlist parser (shared/src/allowlist.rs) and the policy compiled from it.
//!
//! Invariants: no panic; every error and warning names a line of the input; every parsed entry is
//! allowed by the compiled policy; parsing and compiling are linear in the file (a file of many
//! `.apex` lines must not cost entries × wildcards).
#![no_main]

use agent_sandbox_fuzz::{assert_linear, thread_cpu};
use agent_sandbox_shared::{Allowlist, AllowlistError, Entry, Policy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    let text = String::from_utf8_lossy(data);
    let lines = text.lines().count();
    match Allowlist::parse(&text, "fuzz") {
        Ok(list) => {
            for w in list.warnings() {
                assert!(w.line >= 1 && w.line <= lines, "{w}");
            }
            let policy = Policy::new(&list);
            for entry in list.entries() {
                match entry {
                    Entry::Host(n) | Entry::Subdomains(n) => assert!(policy.allows(n), "{n}"),
                    Entry::Port(n, p) => assert!(policy.allows_port(n, *p), "{n}:{p}"),
                }
            }
        }
        Err(AllowlistError::Invalid { errors, .. }) => {
            assert!(!errors.is_empty());
            for e in &errors {
                assert!(e.line >= 1 && e.line <= lines, "{}", e.line);
            }
        }
        Err(e) => panic!("parse returned a file error: {e}"),
    }
    assert_linear("allowlist", data.len(), start);
});
