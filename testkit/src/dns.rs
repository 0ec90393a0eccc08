//! A DNS server on 127.0.0.1 that answers test names from a table and records every query, so tests can
//! prove that a refused name was never even resolved.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{rdata, Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// A DNS server on 127.0.0.1 that answers test names from a table and counts queries.
#[derive(Clone, Debug)]
pub struct TestDns {
    /// Where it listens (UDP): the router's resolver in the tests.
    pub addr: SocketAddr,
    /// Name (lower case, no trailing dot) → its addresses; a name missing here is NXDOMAIN.
    records: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
    /// Every query so far, in order: (name, type).
    pub queries: Arc<Mutex<Vec<(String, RecordType)>>>,
    /// Stops the server task (shared by the clones).
    stop: CancellationToken,
}

impl TestDns {
    /// Starts the server; every answer carries `ttl` seconds.
    pub async fn start(ttl: u32) -> TestDns {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let dns = TestDns {
            addr: sock.local_addr().unwrap(),
            records: Arc::default(),
            queries: Arc::default(),
            stop: CancellationToken::new(),
        };
        let d = dns.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = tokio::select! {
                    () = d.stop.cancelled() => return,
                    r = sock.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
                };
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let Some(query) = q.queries.first().cloned() else {
                    continue;
                };
                let name = query
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                let qtype = query.query_type();
                d.queries.lock().unwrap().push((name.clone(), qtype));
                let mut resp = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
                resp.metadata.recursion_desired = q.metadata.recursion_desired;
                resp.metadata.recursion_available = true;
                resp.metadata.authoritative = true;
                resp.add_query(query.clone());
                match d.records.lock().unwrap().get(&name) {
                    None => resp.metadata.response_code = ResponseCode::NXDomain,
                    Some(addrs) => {
                        for a in addrs {
                            let rdata = match (a, qtype) {
                                (IpAddr::V4(v4), RecordType::A) => RData::A(rdata::A(*v4)),
                                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(rdata::AAAA(*v6)),
                                _ => continue,
                            };
                            resp.add_answer(Record::from_rdata(
                                Name::from_ascii(format!("{name}.")).unwrap(),
                                ttl,
                                rdata,
                            ));
                        }
                    }
                }
                if let Ok(bytes) = resp.to_vec() {
                    let _ = sock.send_to(&bytes, peer).await;
                }
            }
        });
        dns
    }

    /// Answers `name` with `addrs` from now on (A for IPv4, AAAA for IPv6), replacing earlier ones.
    pub fn set(&self, name: &str, addrs: &[IpAddr]) {
        self.records
            .lock()
            .unwrap()
            .insert(name.to_owned(), addrs.to_vec());
    }

    /// How many queries of `rtype` named `name`.
    pub fn count_type(&self, name: &str, rtype: RecordType) -> usize {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, t)| n == name && *t == rtype)
            .count()
    }

    /// How many queries named `name`.
    pub fn count(&self, name: &str) -> usize {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .count()
    }
}
