//! DNS that answers only the allowlist.
//!
//! [`crate::dns_udp`] and [`crate::dns_tcp`] do the wire work (framing, FORMERR for packets that do not
//! decode, dropping packets that are responses); this module is the whole policy: for an allowlisted name, `A`
//! gets the configured address and every other type gets NOERROR with no records (never NXDOMAIN, which
//! would poison the name for the `A` lookup too; and no HTTPS/SVCB records means clients get no ECH
//! configuration). Every other name gets NXDOMAIN. Nothing is ever forwarded or looked up elsewhere:
//! answering needs no I/O beyond the reply.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use agent_sandbox_shared::logs::Kind;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, RecordType};
use tracing::debug;

use crate::coalesce;
use crate::live::LiveRules;
use crate::metrics::{DnsResult, Metrics};

/// The DNS request handler.
#[derive(Debug)]
pub struct DnsHandler {
    /// The same rules the proxy decides on (a name that resolves is a name that connects); one snapshot
    /// per query.
    rules: LiveRules,
    /// Where each query is counted, by result (one relaxed add; the exit log and `/metrics` read it).
    metrics: Arc<Metrics>,
}

impl DnsHandler {
    /// A handler deciding on `rules` and counting into `metrics`.
    #[must_use]
    pub fn new(rules: LiveRules, metrics: Arc<Metrics>) -> DnsHandler {
        DnsHandler { rules, metrics }
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
            self.metrics.dns_query(DnsResult::Rejected);
            let reason = format!("not class IN (class {qclass})");
            let name = logged.escape_debug().to_string();
            let qtype = qtype.to_string();
            coalesce::refused(Kind::Dns, client, &name, &reason, Some(&qtype));
            return Reply::Error(ResponseCode::Refused);
        }
        let rules = self.rules.load();
        match rules.policy.decide(asked) {
            Ok(name) => {
                self.metrics.dns_query(DnsResult::Answered);
                debug!(name = %name, qtype = %qtype, client = %client, "answered");
                if qtype == RecordType::A {
                    Reply::Address(rules.answers.for_name(&name), rules.answers.ttl.get())
                } else {
                    Reply::NoData
                }
            }
            Err(refusal) => {
                self.metrics.dns_query(DnsResult::Refused);
                let name = logged.escape_debug().to_string();
                let qtype = qtype.to_string();
                coalesce::refused(Kind::Dns, client, &name, &refusal.to_string(), Some(&qtype));
                Reply::Error(ResponseCode::NXDomain)
            }
        }
    }

    /// Where this handler counts (shared with the rest of the router).
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts and logs a request that is not one standard question: a `refused` event with no name,
    /// coalesced per client and reason like every other refusal (a client sending garbage costs one
    /// line per window, not one per packet).
    pub(crate) fn reject(&self, client: SocketAddr, why: &str) {
        self.metrics.dns_query(DnsResult::Rejected);
        coalesce::refused(Kind::Dns, client, "", why, None);
    }
}
