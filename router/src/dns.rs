//! DNS that answers only the allowlist.
//!
//! hickory-server does the wire work (UDP and TCP framing, FORMERR for packets that do not decode,
//! dropping packets that are responses); this module is the whole policy: for an allowlisted name, `A`
//! gets the configured address and every other type gets NOERROR with no records (never NXDOMAIN, which
//! would poison the name for the `A` lookup too; and no HTTPS/SVCB records means clients get no ECH
//! configuration). Every other name gets NXDOMAIN. Nothing is ever forwarded or looked up elsewhere:
//! answering needs no I/O beyond the reply.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agent_sandbox_shared::logs::{self, Kind};
use hickory_proto::op::{MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tracing::{debug, info, warn};

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
    /// The whole policy for one well-formed question; both the UDP fast path and hickory's TCP path
    /// call it, so the two cannot disagree. `asked` is the name as it came off the wire.
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
            info!({ logs::KIND } = Kind::Dns.as_str(), { logs::NAME } = %logged.escape_debug(),
                  qtype = %qtype, class = %qclass, { logs::CLIENT } = %client,
                  { logs::REASON } = "not class IN", "{}", logs::REFUSED);
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
                info!({ logs::KIND } = Kind::Dns.as_str(), { logs::NAME } = %logged.escape_debug(),
                      qtype = %qtype, { logs::CLIENT } = %client, { logs::REASON } = %refusal,
                      "{}", logs::REFUSED);
                Reply::Error(ResponseCode::NXDomain)
            }
        }
    }

    /// Counts and logs a request that is not one standard question.
    fn reject(&self, client: SocketAddr, why: &str) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        debug!(%client, why, "malformed DNS request");
    }
}

/// The handler as hickory-server holds it (DNS over TCP), sharing one [`DnsHandler`] with the UDP loops.
#[derive(Debug)]
pub struct SharedHandler(pub Arc<DnsHandler>);

#[async_trait::async_trait]
impl RequestHandler for SharedHandler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let this = &self.0;
        let client = request.src();
        let queries = request.queries.queries();
        let reply = if request.metadata.message_type != MessageType::Query
            || request.metadata.op_code != OpCode::Query
        {
            this.reject(client, "not a standard query");
            Reply::Error(ResponseCode::NotImp)
        } else if queries.len() != 1 {
            this.reject(client, "not exactly one question");
            Reply::Error(ResponseCode::FormErr)
        } else {
            let query = &queries[0];
            let asked = query.original().name().to_ascii();
            this.decide(&asked, query.query_type(), query.query_class(), client)
        };

        let mut metadata = Metadata::response_from_request(&request.metadata);
        let builder = MessageResponseBuilder::new(&request.queries, request.edns.as_ref());
        let sent = match reply {
            Reply::Address(address, ttl) => {
                metadata.authoritative = true;
                let record = Record::from_rdata(
                    queries[0].original().name().clone(),
                    ttl,
                    RData::A(A(address)),
                );
                let response = builder.build(metadata, [&record], [], [], []);
                response_handle.send_response(response).await
            }
            Reply::NoData => {
                metadata.authoritative = true;
                response_handle
                    .send_response(builder.build_no_records(metadata))
                    .await
            }
            Reply::Error(code) => {
                metadata.authoritative = code == ResponseCode::NXDomain;
                metadata.response_code = code;
                response_handle
                    .send_response(builder.build_no_records(metadata))
                    .await
            }
        };
        match sent {
            Ok(info) => info,
            Err(error) => {
                warn!(%client, %error, "cannot send DNS response");
                let mut failed = Metadata::response_from_request(&request.metadata);
                failed.response_code = ResponseCode::ServFail;
                ResponseInfo::from(hickory_proto::op::Header {
                    metadata: failed,
                    counts: Default::default(),
                })
            }
        }
    }
}
