//! The terminated request path's pure part (issue 20): a request head the router accepted, rewritten
//! for credential injection (seeds: real clients' requests with the API key placeholder).
//!
//! Invariants (checked inside `fuzz_api::inject_rewrite`): every head the proxy's head parser accepts
//! can be rewritten; the rewritten head parses again to the same Host, the same body framing and exactly
//! its own length (so a rewrite can never turn one request into two, or change where the body ends);
//! the real key appears only where a credential was put in; CPU time is linear.
//!
//! API used: `proxy::http::parse_request_head`, and the rewrite in router/src/inject/rewrite.rs through
//! `fuzz_api::inject_rewrite`.
#![no_main]

use agent_sandbox_fuzz::{assert_linear, thread_cpu};
use agent_sandbox_router::fuzz_api::inject_rewrite;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    inject_rewrite(data);
    assert_linear("inject rewrite", data.len(), start);
});
