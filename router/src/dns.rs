//! DNS that answers only the allowlist.
//!
//! hickory-server does the wire work (UDP and TCP framing, FORMERR for packets that do not decode,
//! dropping packets that are responses); this module is the whole policy: for an allowlisted name, `A`
//! gets the configured address and every other type gets NOERROR with no records (never NXDOMAIN, which
//! would poison the name for the `A` lookup too; and no HTTPS/SVCB records means clients get no ECH
//! configuration). Every other name gets NXDOMAIN. Nothing is ever forwarded or looked up elsewhere:
//! answering needs no I/O beyond the reply.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agent_sandbox_shared::{HostName, Policy, ValidConfig};
use hickory_proto::op::{MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tracing::{debug, info, warn};

/// Counters of what DNS did, for logs and a later metrics endpoint.
#[derive(Debug, Default)]
pub struct DnsStats {
    /// Allowlisted names answered (with an address or NODATA).
    pub answered: AtomicU64,
    /// Names refused with NXDOMAIN.
    pub refused: AtomicU64,
    /// Queries rejected as malformed (FORMERR), not a query, or not class IN.
    pub rejected: AtomicU64,
}

/// The DNS request handler.
#[derive(Debug)]
pub struct DnsHandler {
    /// Compiled from the same configuration as the proxy's: a name that resolves is a name that connects.
    policy: Policy,
    /// Answer for allowlisted names without a per-host answer.
    default_answer: Ipv4Addr,
    /// Per-host answers (in a session: hosts with port entries have their own loopback address).
    host_answers: BTreeMap<HostName, Ipv4Addr>,
    /// TTL of every answer.
    ttl: u32,
    /// Counters.
    stats: Arc<DnsStats>,
}

impl DnsHandler {
    /// Builds the handler from a validated configuration.
    #[must_use]
    pub fn new(config: &ValidConfig, stats: Arc<DnsStats>) -> DnsHandler {
        DnsHandler {
            policy: config.policy.clone(),
            default_answer: config.raw.answers.default,
            host_answers: config.host_answers.clone(),
            ttl: config.raw.answers.ttl,
            stats,
        }
    }

    /// The address an allowed name resolves to.
    fn answer_for(&self, name: &HostName) -> Ipv4Addr {
        self.host_answers
            .get(name)
            .copied()
            .unwrap_or(self.default_answer)
    }
}

/// What to reply, decided before anything is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// An A record for the question's name.
    Address(Ipv4Addr),
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
            info!(kind = "dns", name = %logged.escape_debug(), qtype = %qtype, class = %qclass,
                  client = %client, reason = "not class IN", "refused");
            return Reply::Error(ResponseCode::Refused);
        }
        match self.policy.decide(asked) {
            Ok(name) => {
                self.stats.answered.fetch_add(1, Ordering::Relaxed);
                debug!(name = %name, qtype = %qtype, client = %client, "answered");
                if qtype == RecordType::A {
                    Reply::Address(self.answer_for(&name))
                } else {
                    Reply::NoData
                }
            }
            Err(refusal) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                info!(kind = "dns", name = %logged.escape_debug(), qtype = %qtype,
                      client = %client, reason = %refusal, "refused");
                Reply::Error(ResponseCode::NXDomain)
            }
        }
    }

    /// Counts and logs a request that is not one standard question.
    fn reject(&self, client: SocketAddr, why: &str) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        debug!(%client, why, "malformed DNS request");
    }

    /// The TTL of answers.
    pub(crate) fn ttl(&self) -> u32 {
        self.ttl
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
            Reply::Address(address) => {
                metadata.authoritative = true;
                let record = Record::from_rdata(
                    queries[0].original().name().clone(),
                    this.ttl,
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
