//! The accept loop of every TCP listener, and the connection slots.
//!
//! How it fits: [`Proxy::serve_https`](super::Proxy::serve_https) and its siblings call
//! [`Proxy::accept_loop`] with their connection driver. The accept step itself (a slot from the cap
//! shared by every listener and worker before `accept`, so the excess waits in the kernel's backlog;
//! back-off on descriptor or memory exhaustion) is the one the forwarder uses too:
//! [`agent_sandbox_shared::net::Acceptor`]. Each connection runs as a task that holds its slot until it
//! ends, inside a `conn` span.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use agent_sandbox_shared::net::{AcceptFailure, Accepted, Acceptor};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn, Instrument as _};

use super::{Kind, Proxy};

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
        let mut acceptor = match Acceptor::new(listener, Arc::clone(&self.limit)) {
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
            // Debug level: the events a connection logs at info carry client and listener themselves,
            // and an enabled span costs work at every poll of every connection.
            let span = tracing::debug_span!("conn", client = %peer, listener = kind.as_str());
            let work = handler(Arc::clone(&self), stream, peer);
            let shutdown = stop.shutdown.clone();
            tasks.spawn(
                async move {
                    let _slot = permit;
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = work => {}
                    }
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
