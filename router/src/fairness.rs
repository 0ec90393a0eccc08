//! Per-client bounds for a gateway with many clients: connections held at once, and names resolved under
//! wildcard entries per minute.
//!
//! How it fits: both are shared by every worker (one `Arc` each, built at start-up) and asked once per
//! connection, after `accept` and before anything is read from the client. A client is its source
//! address. [`ClientSlots`] stops one client holding idle or half-sent connections from using up the
//! global cap that everyone's answers wait on; [`WildcardBudget`] bounds the data channel that names under
//! a wildcard entry open: the client chooses the labels, and resolving them sends them to the upstream DNS
//! servers. [`PeekBudget`] bounds the memory that ClientHellos and request heads larger than usual hold
//! while they are read, over all connections.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agent_sandbox_shared::config::Limits;
use tokio::sync::Semaphore;

use crate::metrics::Metrics;
use crate::proxy::cache::ResolveCache;

/// Refusals of clients at their cap answered with a short linger at once (the rest are closed
/// without one): a client flooding past its cap must not buy itself unbounded lingering sockets.
const LINGERING_REFUSALS: usize = 256;

/// Memory each connection's peek buffers (a ClientHello or request head being read) may hold without
/// drawing on the [`PeekBudget`]: a real client's hello or head, post-quantum key shares included,
/// takes one read of at most 4 KiB.
pub const PEEK_FREE: usize = 8 * 1024;

/// Memory the peek buffers of all connections together may hold beyond [`PEEK_FREE`] each. The parsers'
/// own caps allow one connection up to about 384 KiB (a 64 KiB hello in tiny records, and a second hello
/// after a retry); without a shared bound, a few clients at their connection cap could hold gigabytes.
pub const PEEK_BUDGET: usize = 8 * 1024 * 1024;

/// Everything every worker shares to keep clients apart: the global connection cap, the per-client
/// slots, the wildcard lookup budget, the resolver cache, and the metrics (where what the bounds did is
/// counted: refusals by reason, idle closes, wildcard lookups). Cloning shares.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// The cap on connections handled at once, over all workers and listeners; more wait in the
    /// kernel's backlog.
    pub limit: Arc<Semaphore>,
    /// Connections per client (`--max-connections-per-client`).
    pub slots: Arc<ClientSlots>,
    /// Wildcard lookups per client per minute (`--wildcard-lookups-per-minute`).
    pub budget: Arc<WildcardBudget>,
    /// Resolved addresses by name, in front of the resolver; what the budget counts past.
    pub cache: Arc<ResolveCache>,
    /// Every counter of the router (the bounds count their refusals and closes here, once).
    pub metrics: Arc<Metrics>,
    /// Over-cap refusals that may linger at once (see [`LINGERING_REFUSALS`]).
    pub lingering: Arc<Semaphore>,
    /// Memory for large ClientHellos and request heads, over all connections.
    pub peek: Arc<PeekBudget>,
    /// The per-client cap, for the texts refused clients see.
    pub per_client: u32,
    /// The wildcard budget per minute, for the texts refused clients see.
    pub wildcard_per_minute: u32,
}

impl Bounds {
    /// Fresh bounds for `limits`, counting into metrics of their own.
    #[must_use]
    pub fn new(limits: &Limits) -> Bounds {
        Bounds::with_metrics(limits, Arc::new(Metrics::new()))
    }

    /// Fresh bounds for `limits`, counting into `metrics` (shared with the admin endpoint).
    #[must_use]
    pub fn with_metrics(limits: &Limits, metrics: Arc<Metrics>) -> Bounds {
        let per_client = u32::try_from(limits.max_connections_per_client.get()).unwrap_or(u32::MAX);
        let wildcard_per_minute = limits.wildcard_lookups_per_minute.get();
        Bounds {
            limit: Arc::new(Semaphore::new(limits.max_connections.get())),
            slots: ClientSlots::new(per_client),
            budget: WildcardBudget::new(wildcard_per_minute),
            cache: Arc::new(ResolveCache::default()),
            metrics,
            lingering: Arc::new(Semaphore::new(LINGERING_REFUSALS)),
            peek: Arc::new(PeekBudget::new(PEEK_BUDGET)),
            per_client,
            wildcard_per_minute,
        }
    }
}

/// The memory that peek buffers may hold beyond [`PEEK_FREE`] each, over all connections: a connection
/// whose ClientHello or request head would take more than is left is refused (and the rest keep
/// working), so the router's memory stays within what its sizing says whatever clients send.
#[derive(Debug)]
pub struct PeekBudget {
    /// Bytes charged now.
    used: AtomicUsize,
    /// The most that may be charged.
    limit: usize,
}

/// The peek buffers would need more memory than [`PEEK_BUDGET`] has left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the router's memory for large ClientHellos and request heads ({} MiB over all connections) is in use", PEEK_BUDGET >> 20)]
pub struct PeekBudgetSpent;

impl PeekBudget {
    /// A budget of `limit` bytes.
    #[must_use]
    pub fn new(limit: usize) -> PeekBudget {
        PeekBudget {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Bytes charged now, over all connections.
    #[must_use]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One connection's share of the [`PeekBudget`]; what it holds is given back when it is dropped.
/// Borrowed, not an `Arc`: a clone per connection would bounce the count's cache line between workers.
#[derive(Debug)]
pub struct PeekCharge<'a> {
    /// The budget drawn on.
    budget: &'a PeekBudget,
    /// Bytes charged to this connection.
    charged: usize,
}

impl PeekCharge<'_> {
    /// A connection's charge, holding nothing yet.
    #[must_use]
    pub fn new(budget: &PeekBudget) -> PeekCharge<'_> {
        PeekCharge { budget, charged: 0 }
    }

    /// The connection's peek buffers now hold `bytes` (their capacity): charges what is above
    /// [`PEEK_FREE`], or gives back what is no longer needed. On `Err` nothing changed, and the buffers
    /// must not grow: the connection is refused.
    pub fn hold(&mut self, bytes: usize) -> Result<(), PeekBudgetSpent> {
        let want = bytes.saturating_sub(PEEK_FREE);
        if want == self.charged {
            // The usual case (nothing charged, nothing to charge) touches no shared cache line.
            return Ok(());
        }
        if want < self.charged {
            self.budget
                .used
                .fetch_sub(self.charged - want, Ordering::Relaxed);
            self.charged = want;
            return Ok(());
        }
        let more = want - self.charged;
        let limit = self.budget.limit;
        self.budget
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(more).filter(|&total| total <= limit)
            })
            .map_err(|_| PeekBudgetSpent)?;
        self.charged = want;
        Ok(())
    }
}

impl Drop for PeekCharge<'_> {
    fn drop(&mut self) {
        if self.charged > 0 {
            self.budget.used.fetch_sub(self.charged, Ordering::Relaxed);
        }
    }
}

/// Connections each client holds at once, shared by all workers.
#[derive(Debug)]
pub struct ClientSlots {
    /// The most connections one client may hold.
    per_client: u32,
    /// Connections held, per client; a client at zero is removed, so the map holds only clients with a
    /// connection open (bounded by the global connection cap).
    held: Mutex<HashMap<IpAddr, u32>>,
}

/// One connection's slot; dropping it gives the slot back.
#[derive(Debug)]
pub struct ClientSlot {
    /// Where the slot is counted.
    slots: Arc<ClientSlots>,
    /// Whose slot it is.
    client: IpAddr,
}

impl ClientSlots {
    /// Slots of at most `per_client` connections per client.
    #[must_use]
    pub fn new(per_client: u32) -> Arc<ClientSlots> {
        Arc::new(ClientSlots {
            per_client,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for `client`, or `None` when it already holds its cap.
    #[must_use]
    pub fn try_take(self: &Arc<Self>, client: IpAddr) -> Option<ClientSlot> {
        let client = canonical(client);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(client).or_insert(0);
        if *n >= self.per_client {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            slots: Arc::clone(self),
            client,
        })
    }

    /// Connections `client` holds now.
    #[must_use]
    pub fn held_by(&self, client: IpAddr) -> u32 {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&canonical(client)).copied().unwrap_or(0)
    }

    /// Clients with at least one connection.
    #[must_use]
    pub fn clients(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self
            .slots
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// An IPv4 client connecting over an IPv6 socket (`::ffff:a.b.c.d`) is the same client as over IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The window [`WildcardBudget`] counts in.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(60);

/// Clients tracked before windows that have ended are swept out.
const SWEEP_AT: usize = 4096;

/// The most names a client's window remembers as already charged: a name asked again within the
/// window costs nothing while it is remembered, and is charged again past this many distinct names
/// (fail closed). 2 KiB of hashes per client at most (about 4.5 KiB with the set's own overhead).
const REMEMBERED_NAMES: usize = 256;

/// Lookups of names already charged in a window, per name the window allows: a name that fails to
/// resolve, or whose answer has a TTL of 0, is looked up again on each connection; which of its
/// charged names a client asks again carries a few bits each time, so repeats are bounded too.
const REPEATS_PER_NAME: u32 = 8;

/// Distinct names under wildcard entries each client may have resolved per minute (lookups that
/// the resolver cache did not answer), shared by all workers. A name asked again in its window is
/// not charged again, but such repeats are bounded by [`REPEATS_PER_NAME`] times the budget.
#[derive(Debug)]
pub struct WildcardBudget {
    /// Distinct names allowed per client per window.
    per_window: u32,
    /// Each client's current window.
    used: Mutex<HashMap<IpAddr, Window>>,
    /// Keys the names' hashes (random per process: a client cannot choose colliding names).
    hasher: RandomState,
}

/// One client's current budget window.
#[derive(Debug)]
struct Window {
    /// When it began.
    start: Instant,
    /// Names charged in it.
    charged: u32,
    /// Lookups of names already charged in it.
    repeats: u32,
    /// The hashes of the names charged in it, up to [`REMEMBERED_NAMES`].
    names: HashSet<u64>,
}

impl WildcardBudget {
    /// A budget of `per_minute` distinct names per client per minute.
    #[must_use]
    pub fn new(per_minute: u32) -> Arc<WildcardBudget> {
        Arc::new(WildcardBudget {
            per_window: per_minute,
            used: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        })
    }

    /// Spends `client`'s budget for a lookup of `name` at `now`: one of its repeats if the name was
    /// charged in the client's current window, else one of its names; `false` when that is used up.
    #[must_use]
    pub fn spend(&self, client: IpAddr, name: &str, now: Instant) -> bool {
        let client = canonical(client);
        let hash = self.hasher.hash_one(name);
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        if used.len() >= SWEEP_AT {
            used.retain(|_, w| now.duration_since(w.start) < BUDGET_WINDOW);
        }
        let window = used.entry(client).or_insert_with(|| Window {
            start: now,
            charged: 0,
            repeats: 0,
            names: HashSet::new(),
        });
        if now.duration_since(window.start) >= BUDGET_WINDOW {
            window.start = now;
            window.charged = 0;
            window.repeats = 0;
            window.names.clear();
            // A window that remembered many names gives their memory back.
            window.names.shrink_to(16);
        }
        if window.names.contains(&hash) {
            if window.repeats >= self.per_window.saturating_mul(REPEATS_PER_NAME) {
                return false;
            }
            window.repeats += 1;
            return true;
        }
        if window.charged >= self.per_window {
            return false;
        }
        window.charged += 1;
        if window.names.len() < REMEMBERED_NAMES {
            window.names.insert(hash);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_charges_are_bounded_and_given_back() {
        let budget = PeekBudget::new(100 * 1024);
        let mut a = PeekCharge::new(&budget);
        let mut b = PeekCharge::new(&budget);
        // The usual hello or head costs nothing.
        a.hold(PEEK_FREE).unwrap();
        assert_eq!(budget.used(), 0);
        a.hold(PEEK_FREE + 60 * 1024).unwrap();
        assert_eq!(budget.used(), 60 * 1024);
        // More than is left: refused, and nothing changes.
        assert_eq!(b.hold(PEEK_FREE + 50 * 1024), Err(PeekBudgetSpent));
        assert_eq!(budget.used(), 60 * 1024);
        b.hold(PEEK_FREE + 40 * 1024).unwrap();
        assert_eq!(budget.used(), 100 * 1024);
        // A connection's own growth is refused the same way; shrinking gives back.
        assert_eq!(a.hold(PEEK_FREE + 61 * 1024), Err(PeekBudgetSpent));
        a.hold(PEEK_FREE + 10 * 1024).unwrap();
        assert_eq!(budget.used(), 50 * 1024);
        drop(b);
        assert_eq!(budget.used(), 10 * 1024);
        a.hold(0).unwrap();
        assert_eq!(budget.used(), 0);
        a.hold(usize::MAX).unwrap_err();
        drop(a);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn slots_are_capped_per_client_and_given_back() {
        let slots = ClientSlots::new(2);
        let a: IpAddr = "198.18.0.1".parse().unwrap();
        let b: IpAddr = "198.18.0.2".parse().unwrap();
        let s1 = slots.try_take(a).unwrap();
        let s2 = slots.try_take(a).unwrap();
        assert!(slots.try_take(a).is_none());
        // The IPv4-mapped form is the same client.
        assert!(slots
            .try_take("::ffff:198.18.0.1".parse().unwrap())
            .is_none());
        let other = slots.try_take(b).unwrap();
        drop(s1);
        assert_eq!(slots.held_by(a), 1);
        let s3 = slots.try_take(a).unwrap();
        drop((s2, s3, other));
        assert_eq!(slots.clients(), 0);
    }

    #[test]
    fn budget_per_client_per_minute() {
        let budget = WildcardBudget::new(3);
        let a: IpAddr = "198.18.0.1".parse().unwrap();
        let b: IpAddr = "198.18.0.2".parse().unwrap();
        let t0 = Instant::now();
        assert!(["x.w.test", "y.w.test", "z.w.test"]
            .iter()
            .all(|n| budget.spend(a, n, t0)));
        assert!(!budget.spend(a, "new.w.test", t0 + Duration::from_secs(59)));
        assert!(budget.spend(b, "new.w.test", t0));
        assert!(budget.spend(a, "new.w.test", t0 + Duration::from_secs(60)));
    }

    /// Issue 13 bounds the *distinct* names a client has resolved: one name that fails to resolve (or
    /// has a TTL of 0) and is asked again and again costs one (an auditor: five requests to one
    /// failing name used up a budget of 3).
    #[test]
    fn a_name_asked_again_in_its_window_is_charged_once() {
        let budget = WildcardBudget::new(3);
        let a: IpAddr = "198.18.0.1".parse().unwrap();
        let t0 = Instant::now();
        assert!((0..20).all(|i| budget.spend(a, "same.w.test", t0 + Duration::from_millis(i))));
        assert!(budget.spend(a, "two.w.test", t0));
        assert!(budget.spend(a, "three.w.test", t0));
        assert!(!budget.spend(a, "four.w.test", t0));
        // Still free: it was charged in this window.
        assert!(budget.spend(a, "same.w.test", t0 + Duration::from_secs(59)));
        // The same client over IPv4-mapped IPv6 is the same window.
        assert!(budget.spend("::ffff:198.18.0.1".parse().unwrap(), "two.w.test", t0));
        // Repeats are bounded too (reviewer G: which of its charged names a client asks again carries
        // a few bits each time): 8 per name the budget allows, 24 here, of which 21 are used above.
        for _ in 0..3 {
            assert!(budget.spend(a, "three.w.test", t0));
        }
        assert!(!budget.spend(a, "two.w.test", t0));
        assert!(!budget.spend(a, "same.w.test", t0));
        // A new window starts afresh.
        assert!(budget.spend(a, "same.w.test", t0 + BUDGET_WINDOW));
        // Past the names a window remembers, a name asked again is charged again (fail closed).
        let big = WildcardBudget::new(REMEMBERED_NAMES as u32 + 10);
        let names: Vec<String> = (0..=REMEMBERED_NAMES)
            .map(|i| format!("n{i}.w.test"))
            .collect();
        assert!(names.iter().all(|n| big.spend(a, n, t0)));
        let last = &names[REMEMBERED_NAMES];
        let before = big.used.lock().unwrap()[&a].charged;
        assert!(big.spend(a, last, t0));
        assert_eq!(big.used.lock().unwrap()[&a].charged, before + 1);
        assert!(big.spend(a, &names[0], t0));
        assert_eq!(big.used.lock().unwrap()[&a].charged, before + 1);
    }

    #[test]
    fn budget_map_is_swept() {
        let budget = WildcardBudget::new(1);
        let t0 = Instant::now();
        for i in 0..SWEEP_AT as u32 {
            assert!(budget.spend(IpAddr::from(i.to_be_bytes()), "a.w.test", t0));
        }
        let later = t0 + BUDGET_WINDOW;
        assert!(budget.spend("198.18.0.9".parse().unwrap(), "a.w.test", later));
        assert_eq!(budget.used.lock().unwrap().len(), 1);
    }
}
