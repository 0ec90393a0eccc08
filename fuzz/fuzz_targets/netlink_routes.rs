//! The router's parser of rtnetlink route and nexthop dumps (proxy/routes.rs `parse_dump`, through
//! `fuzz_api`), whose next hops the router never dials.
//!
//! Invariants: no panic; an address it adds is never the unspecified one; a datagram shorter than a
//! header fails; the verdict does not depend on what the set already holds; parsing is linear. The
//! sequence number is taken from the first message, so mutations get past that check.
#![no_main]

use std::collections::HashSet;

use agent_sandbox_fuzz::{assert_linear, thread_cpu};
use agent_sandbox_router::fuzz_api::netlink_parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let start = thread_cpu();
    let seq = data
        .get(8..12)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    let mut out = HashSet::new();
    let result = netlink_parse(data, seq, &mut out);
    assert!(out.iter().all(|ip| !ip.is_unspecified()), "{out:?}");
    if !data.is_empty() && data.len() < 16 {
        assert!(result.is_err(), "a datagram shorter than a header parsed");
    }
    // The same datagram into a set that already holds something: the same verdict.
    let mut again = HashSet::from(["192.0.2.1".parse().unwrap()]);
    assert_eq!(netlink_parse(data, seq, &mut again), result);
    assert!(out.is_subset(&again));
    assert_linear("netlink dump", data.len(), start);
});
