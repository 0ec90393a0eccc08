//! One connection's log: the `refused` events it causes (through the worker's
//! [`coalesce`](crate::coalesce)r) and the one `connection` event that ends it.
//!
//! How it fits: each connection driver makes a [`ConnLog`] first thing and records on it as the
//! connection goes (name, [`Decision`], upstream, bytes); dropping it — however the connection ends,
//! cancellation included — writes the `connection` event. Event messages and field names are the
//! contract in [`agent_sandbox_shared::logs`], which the launcher's report and the tests read.
//!
//! The same drop counts the connection in the [`Metrics`]: its listener and final decision, and its
//! bytes in each direction (one add per direction per connection, not per read). Refusals are counted
//! by reason when they happen; a client that sent nothing usable in time counts as failed, not refused
//! (the log still says refused, with the reason).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_sandbox_shared::logs::{self, Decision, Kind};
use tracing::{info, warn};

use super::upstream::DialError;
use crate::coalesce;
use crate::logging::{Addr, MaybeAddr};
use crate::metrics::{self, CloseReason, Direction, Listener, Metrics, RefusalReason};

/// One connection's log line, written when the connection ends (however it ends).
#[derive(Debug)]
pub(crate) struct ConnLog {
    /// The client's address.
    pub(crate) client: SocketAddr,
    /// The listener the connection came in on.
    pub(crate) kind: Kind,
    /// When the connection was accepted, for `duration_ms`.
    start: Instant,
    /// The decided name (or what the client sent, on refusal).
    name: Mutex<String>,
    /// How the connection ends, as far as it got.
    decision: Mutex<Decision>,
    /// Why it was refused or failed (the refusal's reason, the upstream's error); empty otherwise.
    reason: Mutex<String>,
    /// The upstream address dialled, once one answered.
    upstream: Mutex<Option<SocketAddr>>,
    /// Bytes relayed client → upstream (the relay adds to it directly).
    pub(crate) bytes_up: AtomicU64,
    /// Bytes relayed upstream → client.
    pub(crate) bytes_down: AtomicU64,
    /// Whether refusals go through the worker's coalescer (the router) or are logged one line each
    /// (an in-process test proxy, whose tests match each refusal to its connection).
    coalesce: bool,
    /// The client sent nothing usable in time (or closed mid-hello/head): counted as failed, whatever
    /// the log's decision says.
    client_failed: AtomicBool,
    /// Where the connection, its refusal reason and its bytes are counted.
    metrics: Arc<Metrics>,
}

impl ConnLog {
    /// A log for a connection just accepted; [`Decision::Cancelled`] until something else is decided.
    #[must_use]
    pub(crate) fn new(
        client: SocketAddr,
        kind: Kind,
        coalesce: bool,
        metrics: Arc<Metrics>,
    ) -> ConnLog {
        ConnLog {
            client,
            kind,
            start: Instant::now(),
            name: Mutex::new(String::new()),
            decision: Mutex::new(Decision::Cancelled),
            reason: Mutex::new(String::new()),
            upstream: Mutex::new(None),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            coalesce,
            client_failed: AtomicBool::new(false),
            metrics,
        }
    }

    /// Records the name the connection is about.
    pub(crate) fn set_name(&self, name: &str) {
        *self.name.lock().unwrap_or_else(|e| e.into_inner()) = name.to_owned();
    }

    /// Records how the connection ends (so far).
    pub(crate) fn set_decision(&self, d: Decision) {
        *self.decision.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Records why it was refused or failed, for the `connection` line.
    fn set_reason(&self, reason: &dyn std::fmt::Display) {
        let mut slot = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        slot.clear();
        let _ = std::fmt::Write::write_fmt(&mut *slot, format_args!("{reason}"));
    }

    /// Records the upstream address dialled.
    pub(crate) fn set_upstream(&self, a: SocketAddr) {
        *self.upstream.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
    }

    /// Counts bytes sent to the upstream outside the relay.
    pub(crate) fn up(&self, n: u64) {
        self.bytes_up.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts bytes sent to the client outside the relay.
    pub(crate) fn down(&self, n: u64) {
        self.bytes_down.fetch_add(n, Ordering::Relaxed);
    }

    /// Logs a refusal (the `refused` event, through the worker's coalescer), counts it by `why` and
    /// marks the connection refused.
    pub(crate) fn refuse(&self, name: &str, reason: &str, why: RefusalReason) {
        self.metrics.refusal(why);
        self.log_refusal(name, reason);
    }

    /// Logs a client that sent no complete hello or request head: `closed` says why the router closed
    /// it (`None`: the client closed first). Logged as a refusal; counted as a failed connection.
    pub(crate) fn client_failed(&self, name: &str, reason: &str, closed: Option<CloseReason>) {
        if let Some(why) = closed {
            self.metrics.closed(why);
        }
        self.client_failed.store(true, Ordering::Relaxed);
        self.log_refusal(name, reason);
    }

    /// The `refused` event, and the decision.
    fn log_refusal(&self, name: &str, reason: &str) {
        if self.coalesce {
            coalesce::refused(self.kind, self.client, name, reason, None);
        } else {
            coalesce::log_refusal(self.kind, self.client, name, reason, None, 1);
        }
        if !name.is_empty() {
            self.set_name(name);
        }
        self.set_reason(&reason);
        self.set_decision(Decision::Refused);
    }

    /// Logs an upstream that failed or misbehaved, and marks the connection so.
    pub(crate) fn upstream_failed(&self, name: &str, error: &dyn std::fmt::Display) {
        warn!(
            { logs::KIND } = self.kind.as_str(),
            { logs::NAME } = %name,
            error = %error,
            { logs::CLIENT } = %self.client,
            "upstream failed"
        );
        self.set_reason(error);
        self.set_decision(Decision::UpstreamError);
    }

    /// Marks the connection failed on the upstream's side for `reason`, where the event itself was
    /// logged already or needs no line of its own (a write to the upstream that failed).
    pub(crate) fn upstream_error(&self, reason: &str) {
        self.set_reason(&reason);
        self.set_decision(Decision::UpstreamError);
    }

    /// Logs a failed dial: a refusal if the address check refused it, an upstream failure otherwise.
    pub(crate) fn dial_failed(&self, name: &str, e: &DialError) {
        if e.is_refusal() {
            let why = if matches!(e, DialError::WildcardBudget { .. }) {
                RefusalReason::WildcardLookupLimit
            } else {
                RefusalReason::RefusedAddress
            };
            self.refuse(name, &e.to_string(), why);
        } else {
            self.upstream_failed(name, e);
        }
    }
}

impl Drop for ConnLog {
    fn drop(&mut self) {
        let name = std::mem::take(self.name.get_mut().unwrap_or_else(|e| e.into_inner()));
        let decision = *self.decision.get_mut().unwrap_or_else(|e| e.into_inner());
        let reason = std::mem::take(self.reason.get_mut().unwrap_or_else(|e| e.into_inner()));
        let upstream = *self.upstream.get_mut().unwrap_or_else(|e| e.into_inner());
        let (up, down) = (*self.bytes_up.get_mut(), *self.bytes_down.get_mut());
        let counted = match decision {
            _ if *self.client_failed.get_mut() => metrics::Decision::Failed,
            Decision::Allowed | Decision::Terminated => metrics::Decision::Allowed,
            Decision::Refused => metrics::Decision::Refused,
            Decision::Cancelled | Decision::Closed | Decision::UpstreamError => {
                metrics::Decision::Failed
            }
        };
        self.metrics.connection(Listener::of(self.kind), counted);
        if up > 0 {
            self.metrics.bytes(Direction::Upstream, up);
        }
        if down > 0 {
            self.metrics.bytes(Direction::Downstream, down);
        }
        info!(
            { logs::CLIENT } = %Addr(self.client),
            { logs::LISTENER } = self.kind.as_str(),
            { logs::NAME } = %name,
            { logs::DECISION } = decision.as_str(),
            { logs::REASON } = %reason,
            { logs::UPSTREAM } = %MaybeAddr(upstream),
            { logs::BYTES_UP } = up,
            { logs::BYTES_DOWN } = down,
            { logs::DURATION_MS } = self.start.elapsed().as_millis() as u64,
            "{}",
            logs::CONNECTION
        );
    }
}
