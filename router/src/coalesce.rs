//! Refusal log flood control: the first refusal of a name by a client is logged at once; repeats within
//! a window are counted and logged as one line with their count when the window closes.
//!
//! How it fits: every refusal (DNS, TLS, HTTP, forward) goes through a [`Coalescer`] owned by its worker
//! (each worker is single-threaded, so no lock). An agent that retries a refused name in a loop would
//! otherwise write one line per attempt. The counts stay exact: each refusal is in exactly one line's
//! `count` (the first line says 1, the window's summary says how many more), and [`Coalescer::drain`]
//! flushes everything at shutdown, so the launcher's report, which sums the counts, loses nothing. The map
//! is bounded: past [`MAX_TRACKED`] keys a refusal is logged on its own line (still exact, just not
//! coalesced), so a client inventing names cannot grow memory.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use agent_sandbox_shared::logs::{self, Kind};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// How long repeats of one key are gathered into one line.
pub const WINDOW: Duration = Duration::from_secs(5);

/// The most keys gathered at once.
pub const MAX_TRACKED: usize = 4096;

/// A line to log: `key` was refused `count` times (`count` ≥ 1).
#[derive(Debug, PartialEq, Eq)]
pub struct Emit<K> {
    /// What was refused (kind, client, name, reason).
    pub key: K,
    /// How many refusals this line stands for.
    pub count: u64,
}

/// Repeats being gathered for one key.
#[derive(Debug)]
struct Pending {
    /// When the key's first (logged) refusal was seen: the window runs from here.
    since: Instant,
    /// Repeats since then, not yet logged.
    repeats: u64,
}

/// Gathers repeated refusals into counted lines.
#[derive(Debug)]
pub struct Coalescer<K> {
    /// Keys logged within the current window, with their unlogged repeats.
    pending: HashMap<K, Pending>,
    /// The window length (a parameter for tests).
    window: Duration,
    /// The bound on `pending`.
    max: usize,
}

impl<K: Hash + Eq + Clone> Default for Coalescer<K> {
    fn default() -> Self {
        Coalescer::new(WINDOW, MAX_TRACKED)
    }
}

impl<K: Hash + Eq + Clone> Coalescer<K> {
    /// A coalescer with a given window and bound.
    #[must_use]
    pub fn new(window: Duration, max: usize) -> Coalescer<K> {
        Coalescer {
            pending: HashMap::new(),
            window,
            max,
        }
    }

    /// Records one refusal of `key` at `now`: `Some` when it must be logged now (the first in its window,
    /// or one that cannot be tracked), `None` when it was counted for the window's summary.
    #[must_use]
    pub fn record(&mut self, key: K, now: Instant) -> Option<Emit<K>> {
        if let Some(p) = self.pending.get_mut(&key) {
            if now.duration_since(p.since) < self.window {
                p.repeats += 1;
                return None;
            }
        }
        if self.pending.len() >= self.max && !self.pending.contains_key(&key) {
            return Some(Emit { key, count: 1 });
        }
        // A new window for this key. An ended window that `expire` has not collected yet is replaced
        // here, and its repeats are folded into this line so that none is lost.
        if let Some(old) = self.pending.insert(
            key.clone(),
            Pending {
                since: now,
                repeats: 0,
            },
        ) {
            if old.repeats > 0 {
                return Some(Emit {
                    key,
                    count: 1 + old.repeats,
                });
            }
        }
        Some(Emit { key, count: 1 })
    }

    /// The summaries of windows that have ended by `now` (keys with no repeats are just forgotten).
    #[must_use]
    pub fn expire(&mut self, now: Instant) -> Vec<Emit<K>> {
        let window = self.window;
        let mut out = Vec::new();
        self.pending.retain(|key, p| {
            if now.duration_since(p.since) < window {
                return true;
            }
            if p.repeats > 0 {
                out.push(Emit {
                    key: key.clone(),
                    count: p.repeats,
                });
            }
            false
        });
        out
    }

    /// Every pending summary, at shutdown.
    #[must_use]
    pub fn drain(&mut self) -> Vec<Emit<K>> {
        self.pending
            .drain()
            .filter(|(_, p)| p.repeats > 0)
            .map(|(key, p)| Emit {
                key,
                count: p.repeats,
            })
            .collect()
    }

    /// Keys currently tracked.
    #[must_use]
    pub fn tracked(&self) -> usize {
        self.pending.len()
    }
}

/// What makes two refusals "the same" for coalescing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RefusalKey {
    /// DNS, TLS, HTTP or forward.
    kind: Kind,
    /// The client's address (its port differs from connection to connection: not part of the key).
    client: IpAddr,
    /// The name, as logged.
    name: String,
    /// Why.
    reason: String,
}

thread_local! {
    /// The worker's coalescer: each worker is one thread running a current-thread runtime, so a
    /// thread-local is one coalescer per worker, used without a lock (and never across an `.await`).
    static REFUSALS: RefCell<Coalescer<RefusalKey>> = RefCell::new(Coalescer::default());
}

/// Logs a refusal (the contract's `refused` event, [`logs::REFUSED`]) through this worker's coalescer:
/// the first of its key at once (with the client's full address and `qtype` when given), repeats later
/// as one line with their [`logs::COUNT`].
pub fn refused(kind: Kind, client: SocketAddr, name: &str, reason: &str, qtype: Option<&str>) {
    let key = RefusalKey {
        kind,
        client: client.ip(),
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let emit = REFUSALS.with(|c| c.borrow_mut().record(key, Instant::now()));
    if let Some(Emit { key, count }) = emit {
        log_refusal(key.kind, client, &key.name, &key.reason, qtype, count);
    }
}

/// Writes one `refused` line standing for `count` refusals, without coalescing.
pub fn log_refusal(
    kind: Kind,
    client: SocketAddr,
    name: &str,
    reason: &str,
    qtype: Option<&str>,
    count: u64,
) {
    match qtype {
        Some(qtype) => info!(
            { logs::KIND } = kind.as_str(), { logs::NAME } = %name,
            { logs::REASON } = %reason, { logs::CLIENT } = %client,
            qtype, { logs::COUNT } = count, "{}", logs::REFUSED
        ),
        None => info!(
            { logs::KIND } = kind.as_str(), { logs::NAME } = %name,
            { logs::REASON } = %reason, { logs::CLIENT } = %client,
            { logs::COUNT } = count, "{}", logs::REFUSED
        ),
    }
}

/// Logs the summaries of the windows that have ended (`all`: every pending one, at shutdown).
pub fn flush(all: bool) {
    let lines = REFUSALS.with(|c| {
        let mut c = c.borrow_mut();
        if all {
            c.drain()
        } else {
            c.expire(Instant::now())
        }
    });
    for Emit { key, count } in lines {
        info!(
            { logs::KIND } = key.kind.as_str(), { logs::NAME } = %key.name,
            { logs::REASON } = %key.reason, { logs::CLIENT } = %key.client,
            { logs::COUNT } = count, "{}", logs::REFUSED
        );
    }
}

/// How often a worker logs the summaries of ended windows: a summary comes at most this late after
/// its window.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// A worker's flush task: summaries every [`FLUSH_EVERY`], and everything pending once `shutdown` is
/// cancelled. Must run on the worker's own thread (a task of its current-thread runtime).
pub async fn flush_task(shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => flush(false),
        }
    }
    flush(true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_is_logged_repeats_are_summed() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(5), 10);
        assert_eq!(c.record("a", t0), Some(Emit { key: "a", count: 1 }));
        for i in 1..=9 {
            assert_eq!(c.record("a", t0 + Duration::from_millis(i * 100)), None);
        }
        assert_eq!(c.record("b", t0), Some(Emit { key: "b", count: 1 }));
        assert!(c.expire(t0 + Duration::from_secs(4)).is_empty());
        assert_eq!(
            c.expire(t0 + Duration::from_secs(5)),
            vec![Emit { key: "a", count: 9 }]
        );
        assert_eq!(c.tracked(), 0);
        // After its window the key is logged at once again.
        assert_eq!(
            c.record("a", t0 + Duration::from_secs(6)),
            Some(Emit { key: "a", count: 1 })
        );
    }

    #[test]
    fn bounded_and_exact_when_full() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(5), 2);
        assert!(c.record(1, t0).is_some());
        assert!(c.record(2, t0).is_some());
        assert_eq!(c.record(3, t0), Some(Emit { key: 3, count: 1 }));
        assert_eq!(c.record(3, t0), Some(Emit { key: 3, count: 1 }));
        assert_eq!(c.tracked(), 2);
    }

    #[test]
    fn a_late_window_is_not_lost_without_expire() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_secs(1), 10);
        assert!(c.record("a", t0).is_some());
        assert_eq!(c.record("a", t0), None);
        assert_eq!(
            c.record("a", t0 + Duration::from_secs(2)),
            Some(Emit { key: "a", count: 2 })
        );
        assert!(c.drain().is_empty());
    }

    proptest! {
        /// However refusals and expiries interleave, the logged counts add up to the refusals made.
        #[test]
        fn counts_are_exact(
            events in proptest::collection::vec((0u8..6, 0u64..3000, any::<bool>()), 0..300),
            max in 1usize..8,
        ) {
            let t0 = Instant::now();
            let mut c = Coalescer::new(Duration::from_millis(700), max);
            let mut now = t0;
            let mut logged = 0u64;
            let mut made = 0u64;
            for (key, step, tick) in events {
                now += Duration::from_millis(step % 500);
                made += 1;
                if let Some(e) = c.record(key, now) {
                    logged += e.count;
                }
                if tick {
                    logged += c.expire(now).iter().map(|e| e.count).sum::<u64>();
                }
                prop_assert!(c.tracked() <= max);
            }
            logged += c.drain().iter().map(|e| e.count).sum::<u64>();
            prop_assert_eq!(logged, made);
        }
    }
}
