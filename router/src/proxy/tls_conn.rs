//! One TLS connection on the HTTPS listener: read the ClientHello, decide on its SNI, dial name:443,
//! write the hello's records unchanged, relay. What the client sent after the hello in the same reads
//! is held until the upstream has answered, so that on a HelloRetryRequest it is read as the start of
//! the second hello, from the offset where the upstream reads it.
//!
//! A name in the `[inject]` section's terminated set goes to [`crate::inject::terminate`] instead,
//! with the hello's bytes, once the decision is made; nothing else changes for it before that point.
//!
//! How it fits: the accept loop ([`super::listener`]) runs [`Proxy::handle_tls`] per connection; the
//! hello is parsed by the pure [`HelloReader`](super::tls::HelloReader); refusals are answered with a
//! TLS alert ([`super::refusal`]).
//!
//! Before splicing, the upstream's first bytes are read through
//! [`ServerHelloWatch`](super::retry::ServerHelloWatch) (and passed on to the client): on a TLS 1.3
//! HelloRetryRequest the client's second ClientHello is read through
//! [`SecondHello`](super::retry::SecondHello) and must name the same server, without ECH, or the
//! connection is closed. The common path pays one user-space read and write of the ServerHello's
//! first segment; then the relay runs until both sides end or the idle timeout.

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sandbox_shared::logs::{Decision, Kind};
use agent_sandbox_shared::{NameError, Refusal};
use tokio::net::TcpStream;
use tracing::debug;

use super::conn_log::ConnLog;
use super::refusal::{self, refuse_tls};
use super::relay::{self, read_maybe_first, read_some, shutdown_write, write_all, write_first};
use super::retry::{SecondHello, ServerFirst, ServerHelloWatch};
use super::tls::{AlertDescription, HelloReader};
use super::{show, Proxy, PEEK_READ};
use crate::fairness::{PeekBudgetSpent, PeekCharge};
use crate::metrics::{CloseReason, RefusalReason};

impl Proxy {
    /// One TLS connection.
    pub(super) async fn handle_tls(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let log = ConnLog::new(
            peer,
            Kind::Tls,
            self.coalesce,
            Arc::clone(&self.bounds.metrics),
        );
        // What the peek buffers hold past the usual is charged to the router-wide budget until they are
        // gone (dropped before a terminated connection's or a relay's long life).
        let mut charge = PeekCharge::new(&self.bounds.peek);
        let Some(reader) = self.read_hello(&client, &log, &mut charge).await else {
            return;
        };
        // The rules as they are now that the name is known, not as they were at the accept: a client
        // that sent a byte before a reload and the rest after it is judged by the new rules.
        let rules = self.rules.load();
        let sni = reader.sni();
        let first_sni = sni.to_vec();
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
                log.refuse(
                    &shown,
                    &refusal::policy_reason(&refusal),
                    refusal::policy_refusal(&refusal, RefusalReason::BadHello),
                );
                refuse_tls(&client, refusal::policy_alert(&refusal)).await;
                return;
            }
        };
        drop(rules);
        log.set_name(name.as_str());
        // A name a credential is added for is answered by the router itself (issue 20); every other
        // allowed name is spliced.
        if let Some(inject) = self.inject.as_ref().filter(|i| i.terminates(&name)) {
            let inject = Arc::clone(inject);
            let hello = reader.into_buffered();
            drop(charge);
            // Boxed: the terminated connection's state (rustls on both legs) is several KiB, and inline
            // it would make every spliced connection's task that large too (7 KiB each, measured with
            // 1,000 open connections).
            Box::pin(crate::inject::terminate::serve(
                &self, &inject, client, hello, name, &log,
            ))
            .await;
            return;
        }
        let upstream = match self.dial(&name, 443, &log).await {
            Ok(s) => s,
            Err(e) => {
                refuse_tls(&client, refusal::dial_alert(&e)).await;
                return;
            }
        };
        // Only the hello goes now: what the client sent after it waits for the upstream's answer.
        let (hello, after) = reader.into_parts();
        if write_first(&upstream, &hello).await.is_err() {
            log.upstream_error("the ClientHello could not be written to the upstream");
            return;
        }
        log.up(hello.len() as u64);
        drop(hello);
        if !self
            .check_retry(&client, &upstream, first_sni, after, &log, &mut charge)
            .await
        {
            return;
        }
        drop(charge);
        let relaying = relay::relay(&client, &upstream, &log.bytes_up, &log.bytes_down);
        if let Some(Err(error)) = self.until_idle(&log, relaying).await {
            debug!(%error, "relay ended with an error");
        }
    }

    /// Reads the upstream's first bytes until it is known whether they are a HelloRetryRequest, and
    /// passes them to the client; after a retry, reads the client's second ClientHello and passes it on
    /// only if it names `first_sni` and carries no ECH. `after` is what the client sent after its first
    /// hello in the same reads: held until the answer is known, then passed on (no retry) or read as
    /// the start of the second hello's stream (a retry). Each read is bounded by the peek timeout, and
    /// what the second hello's buffers hold by `charge`. `false`: the connection is over (logged).
    async fn check_retry(
        &self,
        client: &TcpStream,
        upstream: &TcpStream,
        first_sni: Vec<u8>,
        after: Vec<u8>,
        log: &ConnLog,
        charge: &mut PeekCharge<'_>,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let mut watch = ServerHelloWatch::new();
        let mut buf = Vec::with_capacity(PEEK_READ);
        let first = loop {
            buf.clear();
            match tokio::time::timeout_at(deadline, read_some(upstream, &mut buf, PEEK_READ)).await
            {
                Err(_) => {
                    log.upstream_failed(
                        &show(&first_sni),
                        &"no answer to the ClientHello within the peek timeout",
                    );
                    return false;
                }
                // The upstream is done (or failed) before a decision: not a retry; the relay passes
                // the end on.
                Ok(Ok(0) | Err(_)) => break ServerFirst::Other,
                Ok(Ok(_)) => {
                    if let Some(first) = watch.push(&buf) {
                        break first;
                    }
                }
            }
        };
        let answer = watch.buffered();
        if write_all(client, answer).await.is_err() {
            return false;
        }
        log.down(answer.len() as u64);
        if first == ServerFirst::Other {
            // The upstream has answered the hello the router decided on: the rest is the relay's.
            if !after.is_empty() {
                if write_all(upstream, &after).await.is_err() {
                    log.upstream_error(
                        "what followed the ClientHello could not be written to the upstream",
                    );
                    return false;
                }
                log.up(after.len() as u64);
            }
            return true;
        }
        let shown = show(&first_sni);
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let mut second = SecondHello::new(first_sni);
        let mut step = second.push(&after);
        drop(after);
        loop {
            if step.is_ok() && charge.hold(second.held()).is_err() {
                drop(second);
                log.refuse(
                    &shown,
                    &PeekBudgetSpent.to_string(),
                    RefusalReason::PeekMemory,
                );
                // The upstream has seen only the first hello: nothing after it reaches it.
                shutdown_write(client);
                return false;
            }
            match step {
                Ok(false) => {}
                Ok(true) => {
                    let hello = second.buffered();
                    if write_all(upstream, hello).await.is_err() {
                        log.upstream_error(
                            "the second ClientHello could not be written to the upstream",
                        );
                        return false;
                    }
                    log.up(hello.len() as u64);
                    return true;
                }
                Err(e) => {
                    log.refuse(&shown, &e.to_string(), RefusalReason::BadHello);
                    // The upstream has seen only the first hello: nothing after it reaches it.
                    shutdown_write(client);
                    return false;
                }
            }
            buf.clear();
            match tokio::time::timeout_at(deadline, read_some(client, &mut buf, PEEK_READ)).await {
                Err(_) => {
                    log.client_failed(
                        &shown,
                        "peek timeout (second ClientHello)",
                        Some(CloseReason::ClientTimeout),
                    );
                    shutdown_write(client);
                    return false;
                }
                Ok(Ok(0) | Err(_)) => {
                    log.set_decision(Decision::Closed);
                    return false;
                }
                Ok(Ok(_)) => step = second.push(&buf),
            }
        }
    }

    /// Reads until the ClientHello is complete, within the peek timeout and what `charge` allows the
    /// buffers to hold. `None`: the connection is over (refused, timed out or closed; already logged and
    /// answered).
    async fn read_hello(
        &self,
        client: &TcpStream,
        log: &ConnLog,
        charge: &mut PeekCharge<'_>,
    ) -> Option<Hello> {
        let deadline = tokio::time::Instant::now() + self.peek_timeout;
        let mut reader = HelloReader::new();
        let mut buf = Vec::with_capacity(PEEK_READ);
        let mut first = true;
        loop {
            buf.clear();
            let read = read_maybe_first(client, &mut buf, PEEK_READ, std::mem::take(&mut first));
            match tokio::time::timeout_at(deadline, read).await {
                Err(_) => {
                    log.client_failed("", "peek timeout", Some(CloseReason::ClientTimeout));
                    refuse_tls(client, AlertDescription::AccessDenied).await;
                    return None;
                }
                Ok(Ok(0) | Err(_)) => {
                    if reader.buffered().is_empty() {
                        log.set_decision(Decision::Closed);
                    } else {
                        log.client_failed(
                            "",
                            "client closed before the ClientHello was complete",
                            None,
                        );
                    }
                    return None;
                }
                Ok(Ok(_)) => match reader.push(&buf) {
                    // Charged as soon as the buffers have grown, and given up before any await.
                    Ok(_) if charge.hold(reader.held()).is_err() => {
                        drop(reader);
                        log.refuse("", &PeekBudgetSpent.to_string(), RefusalReason::PeekMemory);
                        refuse_tls(client, AlertDescription::InternalError).await;
                        return None;
                    }
                    Ok(None) => {}
                    Ok(Some(sni)) => return Some(Hello { reader, sni }),
                    Err(e) => {
                        log.refuse("", &e.to_string(), RefusalReason::BadHello);
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

    /// The hello's records, and what the client sent after them ([`HelloReader::into_parts`]).
    fn into_parts(self) -> (Vec<u8>, Vec<u8>) {
        self.reader.into_parts()
    }
}
