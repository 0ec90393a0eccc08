//! agent-sandbox-router: the only way out of a sandbox session, and a standalone egress allowlist gateway.
//!
//! How it fits: the launcher writes a [`RouterConfig`](agent_sandbox_shared::RouterConfig) from the
//! session plan and starts this binary on the session's internal network and the shared egress network;
//! the standalone gateway builds the same configuration from flags ([`cli`]). [`bind_workers`] opens every
//! listener once per worker (so a bad address fails before anything is served); each worker is a
//! single-threaded runtime, and [`run`] serves DNS ([`dns`]) and the TLS, HTTP and host:port listeners
//! ([`proxy`]) on all of them until the shutdown token is cancelled. Every worker decides on the same
//! rules, held once in a [`live::Live`] holder that a reload ([`reload`]) replaces; the admin endpoint
//! ([`admin`], [`metrics`]) reports readiness and counters. ARCHITECTURE.md follows one query, one
//! connection and one session through the files. Names a credential is added for (issue 20) have their
//! TLS terminated by [`inject`]; every other name is spliced.

pub mod admin;
mod bind;
pub mod cli;
pub mod coalesce;
pub mod dns;
mod dns_tcp;
mod dns_udp;
pub mod fairness;
mod inject;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod reload;
mod rlimit;
#[cfg(test)]
mod test_support;
pub mod watch;
mod workers;

/// Private parsers, exposed to the fuzz targets in `fuzz/` only (the `fuzzing` feature).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_api {
    pub use crate::dns_udp::{fuzz_parse as dns_udp_parse, FuzzQuestion as DnsQuestion};
    pub use crate::inject::rewrite::fuzz_rewrite as inject_rewrite;
    pub use crate::proxy::routes::parse_dump as netlink_parse;
}

use std::fmt::Write as _;
use std::net::SocketAddr;

use agent_sandbox_shared::ValidConfig;

pub use bind::{bind_workers, tcp_listener, Listeners, Opening, WorkerSockets, DEFER_ACCEPT_SECS};
/// A stand-in OAuth token store for the tests of the terminated token exchange.
#[cfg(feature = "test-support")]
pub use inject::oauth_hook::TestStore;
pub use workers::{run, Control, Handles};

/// A human-readable description of the effective configuration, for `--check`.
#[must_use]
pub fn describe(config: &ValidConfig) -> String {
    let (policy, answers) = (&config.rules.policy, &config.rules.answers);
    let mut out = String::new();
    let _ = writeln!(out, "listeners:");
    let opt = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_owned(), |a| a.to_string());
    let _ = writeln!(out, "  dns    {} (udp, tcp)", opt(config.listen.dns));
    let _ = writeln!(out, "  http   {}", opt(config.listen.http));
    let _ = writeln!(out, "  https  {}", opt(config.listen.https));
    for (host, port, addr) in &config.forwards {
        let _ = writeln!(out, "  {addr}  -> {host}:{port} (host:port entry)");
    }
    let _ = writeln!(out, "allowed names (DNS answer, TTL {}s):", answers.ttl);
    if policy.is_empty() {
        let _ = writeln!(
            out,
            "  (none: every name is NXDOMAIN and nothing is forwarded)"
        );
    }
    for host in policy.exact_hosts() {
        let _ = writeln!(out, "  {:<40} A {}", host.as_str(), answers.for_name(host));
    }
    for apex in policy.subdomain_apexes() {
        let _ = writeln!(
            out,
            "  {:<40} A {}",
            format!(".{apex} (and subdomains)"),
            answers.default
        );
    }
    let resolvers = if config.resolvers.is_empty() {
        "system (/etc/resolv.conf, /etc/hosts)".to_owned()
    } else {
        config
            .resolvers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "upstream resolvers: {resolvers}");
    if let Some(inject) = &config.inject {
        let names: Vec<&str> = inject.terminated.iter().map(|h| h.as_str()).collect();
        let _ = writeln!(
            out,
            "TLS terminated to add credentials: {} (every other name is spliced)",
            names.join(", ")
        );
    }
    let limits = &config.limits;
    let _ = writeln!(
        out,
        "limits: peek timeout {}s, connect timeout {}s, {} connections ({} per client), idle timeout {}s, {} wildcard lookups per client per minute",
        limits.peek_timeout.as_secs(),
        limits.connect_timeout.as_secs(),
        limits.max_connections,
        limits.max_connections_per_client,
        limits.idle_timeout.as_secs(),
        limits.wildcard_lookups_per_minute
    );
    out
}
