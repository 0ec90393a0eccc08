//! The accept loop of every TCP listener, and the connection slots.
//!
//! How it fits: [`Proxy::serve_https`](super::Proxy::serve_https) and its siblings call
//! [`Proxy::accept_loop`] with their connection driver. The accept step itself (a slot from the cap
//! shared by every listener and worker before `accept`, so the excess waits in the kernel's backlog;
//! back-off on descriptor or memory exhaustion) is the one the forwarder uses too:
//! [`agent_sandbox_shared::net::Acceptor`]. Right after `accept`, where the peer is known, the client
//! takes one of its own slots ([`ClientSlots`](crate::fairness::ClientSlots), shared by every listener
//! and worker); a client already at its cap has the new connection closed at once — after a TLS
//! `internal_error` alert or an HTTP 503 naming the reason, or with nothing on a host:port or DNS
//! listener — and the refusal is counted and logged (coalesced). The global permit is given back first,
//! so one client's flood cannot keep anyone else's connection waiting. Each accepted connection runs as
//! a task that holds both its permit and its client slot until it ends, inside a `conn` span.
//!
//! Why `internal_error` and not `access_denied`: the router sends `access_denied` when a name is not
//! allowed, and a client (or its user) reads that as "this name is blocked"; a client at its cap is
//! turned away by a transient resource limit of the gateway, which is what `internal_error` says (RFC
//! 8446 §6.2: an error unrelated to the peer or the protocol), and clients retry it like one.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use agent_sandbox_shared::net::{AcceptFailure, Accepted, Acceptor};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn, Instrument as _};

use super::guard::Guarded;
use super::http::{self, Status};
use super::refusal::{self, send_and_close};
use super::tls::{alert_record, AlertDescription};
use super::{Kind, Proxy};
use crate::coalesce;
use crate::metrics::{self, Listener, RefusalReason};

/// When a listener stops: it stops accepting when `accepting` is cancelled (a drain, or a reload that
/// removed its `host:port` entry) and its connections go on; when `shutdown` is cancelled, they are
/// dropped too.
#[derive(Clone, Debug)]
pub struct Stop {
    /// Cancelled: close the listener, let its connections finish.
    pub accepting: CancellationToken,
    /// Cancelled: drop everything now.
    pub shutdown: CancellationToken,
}

impl From<CancellationToken> for Stop {
    /// One token for both: stop accepting and drop the connections at once.
    fn from(token: CancellationToken) -> Stop {
        Stop {
            accepting: token.clone(),
            shutdown: token,
        }
    }
}

impl Proxy {
    /// Accepts until `stop.accepting`, one task per connection under the connection cap. Then the
    /// listener is closed and the connections finish on their own, unless `stop.shutdown` comes first:
    /// then they are dropped, since a long relay must not hold the exit back.
    pub(super) async fn accept_loop<F, Fut>(
        self: Arc<Self>,
        listener: TcpListener,
        kind: Kind,
        stop: Stop,
        handler: F,
    ) where
        F: Fn(Arc<Proxy>, TcpStream, SocketAddr) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if let Ok(addr) = listener.local_addr() {
            self.upstream.add_own_address(addr.ip());
        }
        let mut acceptor = match Acceptor::new(listener, Arc::clone(&self.bounds.limit)) {
            Ok(a) => a,
            Err(e) => {
                error!(listener = kind.as_str(), error = %e, "cannot watch the listener");
                return;
            }
        };
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let accepted = tokio::select! {
                () = stop.accepting.cancelled() => break,
                a = acceptor.accept(|f| report(kind, f)) => a,
            };
            let Some(Accepted {
                stream,
                peer,
                permit,
            }) = accepted
            else {
                break;
            };
            let listener = Listener::of(kind);
            let Some(client_slot) = self.bounds.slots.try_take(peer.ip()) else {
                drop(permit);
                if let Some(refusing) = self.refuse_over_cap(kind, stream, peer) {
                    tasks.spawn(refusing);
                }
                continue;
            };
            // Debug level: the events a connection logs at info carry client and listener themselves,
            // and an enabled span costs work at every poll of every connection.
            let span = tracing::debug_span!("conn", client = %peer, listener = kind.as_str());
            // Boxed at once: a connection's future is several KiB and the wrappers below (the `Guarded`,
            // the span, the task cell) each move what they wrap, so unboxed it was copied whole at each
            // step (measured in BENCHMARKS.md, issue 18). Moving a box moves a pointer.
            let work = Box::pin(handler(Arc::clone(&self), stream, peer));
            let open = self.bounds.metrics.open(listener);
            let shutdown = stop.shutdown.clone();
            tasks.spawn(
                async move {
                    let _slots = (permit, client_slot, open);
                    let stop = std::pin::pin!(shutdown.cancelled());
                    let _ = Guarded::new(work, stop).await;
                }
                .instrument(span),
            );
        }
        // The listener closes here: new connections are refused by the kernel, not left in a backlog.
        drop(acceptor);
        let finished = async { while tasks.join_next().await.is_some() {} };
        tokio::select! {
            () = finished => {}
            () = stop.shutdown.cancelled() => {
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
    }
}

impl Proxy {
    /// A new connection from a client at its cap: counted, logged (coalesced), and closed at once. TLS
    /// and HTTP clients are told why first; that telling may linger briefly (so the close does not reset
    /// the answer away) only while few such refusals are lingering, and holds no connection permit.
    /// Returns the lingering close to run as a task, if any.
    fn refuse_over_cap(
        &self,
        kind: Kind,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let metrics = &self.bounds.metrics;
        metrics.refusal(RefusalReason::PerClientLimit);
        metrics.connection(Listener::of(kind), metrics::Decision::Refused);
        let cap = self.bounds.per_client;
        let reason = refusal::client_cap_reason(cap);
        if self.coalesce {
            coalesce::refused(kind, peer, "", &reason, None);
        } else {
            coalesce::log_refusal(kind, peer, "", &reason, None, 1);
        }
        let answer = match kind {
            Kind::Tls => alert_record(AlertDescription::InternalError).to_vec(),
            Kind::Http => {
                http::response(Status::ServiceUnavailable, &refusal::client_cap_body(cap))
            }
            Kind::Forward | Kind::Dns => return None,
        };
        match Arc::clone(&self.bounds.lingering).try_acquire_owned() {
            Ok(lingering) => Some(async move {
                let _lingering = lingering;
                send_and_close(&stream, &answer).await;
            }),
            Err(_) => {
                // Too many refusals lingering already: say it once, without waiting, and close.
                let _ = stream.try_write(&answer);
                None
            }
        }
    }
}

/// Logs an accept error: quietly when it concerns one connection, as a warning when the listener backs
/// off (at most once a second while it lasts, the longest pause).
fn report(kind: Kind, failure: AcceptFailure<'_>) {
    match failure {
        AcceptFailure::PerConnection(error) => {
            debug!(listener = kind.as_str(), %error, "accept failed");
        }
        AcceptFailure::BackingOff { error, pause, .. } => {
            warn!(listener = kind.as_str(), %error, backoff_ms = pause.as_millis() as u64, "cannot accept; backing off");
        }
    }
}
