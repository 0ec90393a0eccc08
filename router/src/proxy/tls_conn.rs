//! One TLS connection on the HTTPS listener: read the ClientHello, decide on its SNI, dial name:443,
//! write the buffered hello unchanged, relay.
//!
//! How it fits: the accept loop ([`super::listener`]) runs [`Proxy::handle_tls`] per connection; the
//! hello is parsed by the pure [`HelloReader`](super::tls::HelloReader); refusals are answered with a
//! TLS alert ([`super::refusal`]).

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sandbox_shared::logs::{Decision, Kind};
use agent_sandbox_shared::{NameError, Refusal};
use tokio::net::TcpStream;
use tracing::debug;

use super::conn_log::ConnLog;
use super::refusal::{self, refuse_tls};
use super::relay::{self, read_some, write_all};
use super::tls::{AlertDescription, HelloReader};
use super::{show, Proxy, PEEK_READ};

impl Proxy {
    /// One TLS connection.
    pub(super) async fn handle_tls(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let log = ConnLog::new(peer, Kind::Tls);
        let rules = self.rules.load();
        let Some(reader) = self.read_hello(&client, &log).await else {
            return;
        };
        let sni = reader.sni();
        let shown = show(sni);
        let decided = match std::str::from_utf8(sni) {
            Ok(s) => rules.policy.decide(s),
            Err(_) => Err(Refusal::Invalid(NameError::NonAscii(
                char::REPLACEMENT_CHARACTER,
            ))),
        };
        let name = match decided {
            Ok(n) => n,
            Err(refusal) => {
                log.refuse(&shown, &refusal::policy_reason(&refusal));
                refuse_tls(&client, refusal::policy_alert(&refusal)).await;
                return;
            }
        };
        drop(rules);
        log.set_name(name.as_str());
        let upstream = match self.dial(&name, 443, &log).await {
            Ok(s) => s,
            Err(e) => {
                refuse_tls(&client, refusal::dial_alert(&e)).await;
                return;
            }
        };
        let hello = reader.into_buffered();
        if write_all(&upstream, &hello).await.is_err() {
            log.set_decision(Decision::UpstreamError);
            return;
        }
        log.up(hello.len() as u64);
        drop(hello);
        if let Err(error) = relay::relay(&client, &upstream, &log.bytes_up, &log.bytes_down).await {
            debug!(%error, "relay ended with an error");
        }
    }

    /// Reads until the ClientHello is complete, within the peek timeout. `None`: the connection is over
    /// (refused, timed out or closed; already logged and answered).
    async fn read_hello(&self, client: &TcpStream, log: &ConnLog) -> Option<Hello> {
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let mut reader = HelloReader::new();
        let mut buf = Vec::with_capacity(PEEK_READ);
        loop {
            buf.clear();
            match tokio::time::timeout_at(deadline, read_some(client, &mut buf, PEEK_READ)).await {
                Err(_) => {
                    log.refuse("", "peek timeout");
                    refuse_tls(client, AlertDescription::AccessDenied).await;
                    return None;
                }
                Ok(Ok(0) | Err(_)) => {
                    if reader.buffered().is_empty() {
                        log.set_decision(Decision::Closed);
                    } else {
                        log.refuse("", "client closed before the ClientHello was complete");
                    }
                    return None;
                }
                Ok(Ok(_)) => match reader.push(&buf) {
                    Ok(None) => {}
                    Ok(Some(sni)) => return Some(Hello { reader, sni }),
                    Err(e) => {
                        log.refuse("", &e.to_string());
                        refuse_tls(client, e.alert()).await;
                        return None;
                    }
                },
            }
        }
    }
}

/// A complete ClientHello: the bytes buffered so far and the SNI they carry.
#[derive(Debug)]
struct Hello {
    /// Holds every byte read, to be written to the upstream unchanged.
    reader: HelloReader,
    /// The server_name, raw.
    sni: Vec<u8>,
}

impl Hello {
    /// The SNI as sent.
    fn sni(&self) -> &[u8] {
        &self.sni
    }

    /// Every byte the client sent so far.
    fn into_buffered(self) -> Vec<u8> {
        self.reader.into_buffered()
    }
}
