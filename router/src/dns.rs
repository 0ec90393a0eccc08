//! DNS that answers only the allowlist.
//!
//! [`crate::dns_udp`] and [`crate::dns_tcp`] do the wire work (framing, FORMERR for packets that do not
//! decode, dropping packets that are responses); this module is the whole policy: for an allowlisted name, `A`
//! gets the configured address and every other type gets NOERROR with no records (never NXDOMAIN, which
//! would poison the name for the `A` lookup too; and no HTTPS/SVCB records means clients get no ECH
//! configuration). Every other name gets NXDOMAIN. Nothing is ever forwarded or looked up elsewhere:
//! answering needs no I/O beyond the reply.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agent_sandbox_shared::logs::Kind;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, RecordType};
use tracing::debug;

use crate::coalesce;
use crate::live::LiveRules;

/// Counters of what DNS did, over every worker: summed up in the log at exit, and what a metrics
/// endpoint will read.
#[derive(Debug, Default)]
pub struct DnsStats {
    /// Allowlisted names answered (with an address or NODATA).
    pub answered: AtomicU64,
    /// Names refused with NXDOMAIN.
    pub refused: AtomicU64,
    /// Queries rejected as malformed (FORMERR), not a query, or not class IN.
    pub rejected: AtomicU64,
}

impl DnsStats {
    /// (answered, refused, rejected) so far.
    #[must_use]
    pub fn totals(&self) -> (u64, u64, u64) {
        (
            self.answered.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
        )
    }
}

/// The DNS request handler.
#[derive(Debug)]
pub struct DnsHandler {
    /// The same rules the proxy decides on (a name that resolves is a name that connects); one snapshot
    /// per query.
    rules: LiveRules,
    /// Counters.
    stats: Arc<DnsStats>,
}

impl DnsHandler {
    /// A handler deciding on `rules` and counting into `stats`.
    #[must_use]
    pub fn new(rules: LiveRules, stats: Arc<DnsStats>) -> DnsHandler {
        DnsHandler { rules, stats }
    }
}

/// What to reply, decided before anything is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// An A record for the question's name, with its TTL.
    Address(Ipv4Addr, u32),
    /// NOERROR with no records.
    NoData,
    /// An error code and no records.
    Error(ResponseCode),
}

impl DnsHandler {
    /// The whole policy for one well-formed question; both the UDP and the TCP path call it, so the two
    /// cannot disagree. `asked` is the name as it came off the wire.
    pub(crate) fn decide(
        &self,
        asked: &str,
        qtype: RecordType,
        qclass: DNSClass,
        client: SocketAddr,
    ) -> Reply {
        // Logged like the TLS and HTTP refusals: without the root's trailing dot, escaped.
        let logged = asked.strip_suffix('.').unwrap_or(asked);
        if qclass != DNSClass::IN {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            let reason = format!("not class IN (class {qclass})");
            let name = logged.escape_debug().to_string();
            let qtype = qtype.to_string();
            coalesce::refused(Kind::Dns, client, &name, &reason, Some(&qtype));
            return Reply::Error(ResponseCode::Refused);
        }
        let rules = self.rules.load();
        match rules.policy.decide(asked) {
            Ok(name) => {
                self.stats.answered.fetch_add(1, Ordering::Relaxed);
                debug!(name = %name, qtype = %qtype, client = %client, "answered");
                if qtype == RecordType::A {
                    Reply::Address(rules.answers.for_name(&name), rules.answers.ttl.get())
                } else {
                    Reply::NoData
                }
            }
            Err(refusal) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                let name = logged.escape_debug().to_string();
                let qtype = qtype.to_string();
                coalesce::refused(Kind::Dns, client, &name, &refusal.to_string(), Some(&qtype));
                Reply::Error(ResponseCode::NXDomain)
            }
        }
    }

    /// Counts and logs a request that is not one standard question.
    pub(crate) fn reject(&self, client: SocketAddr, why: &str) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        debug!(%client, why, "malformed DNS request");
    }
}
