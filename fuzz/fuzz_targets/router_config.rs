//! The router's TOML configuration (shared/src/config.rs): parse, validate, serialise.
//!
//! Invariants: no panic; a configuration that parses survives a round trip through `to_toml`
//! unchanged, and validates the same way after it; work is linear.
#![no_main]

use agent_sandbox_fuzz::{assert_linear, thread_cpu};
use agent_sandbox_shared::RouterConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = RouterConfig::from_toml(text) else {
        return;
    };
    let valid = config.validate();
    let again = RouterConfig::from_toml(&config.to_toml()).expect("our own TOML parses");
    assert_eq!(
        again, config,
        "the TOML round trip changed the configuration"
    );
    let valid_again = again.validate();
    assert_eq!(valid.is_ok(), valid_again.is_ok());
    if let (Ok(a), Ok(b)) = (valid, valid_again) {
        assert_eq!(a.rules.policy.entries(), b.rules.policy.entries());
        assert_eq!(a.forwards, b.forwards);
    }
    assert_linear("router configuration", data.len(), start);
});
