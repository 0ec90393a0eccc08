//! The addresses of allowlisted names, as upstream DNS gave them, for as long as their TTL allows.
//!
//! How it fits: [`super::upstream::Upstream::connect`] asks here before the resolver. One cache is shared
//! by every worker, so a name resolved by one is a hit for all; a hit costs one lock and a hash lookup,
//! less than hickory's own cache path. It also tells the wildcard budget what counts: only a lookup that
//! this cache cannot answer sends a client-chosen name to the upstream DNS servers. Entries live until
//! the TTL upstream gave (at most [`MAX_TTL`]); the map is bounded, and when full, expired entries go
//! first, then the entry closest to expiry.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agent_sandbox_shared::HostName;

/// The longest an answer is kept, whatever its TTL.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// The most names kept.
pub const MAX_ENTRIES: usize = 16 * 1024;

/// One name's addresses and when they expire.
#[derive(Debug, Clone)]
struct Cached {
    /// The addresses, in the resolver's order.
    addrs: Arc<[IpAddr]>,
    /// When the TTL runs out.
    until: Instant,
}

/// Resolved addresses by name, shared by all workers.
#[derive(Debug)]
pub struct ResolveCache {
    /// The entries.
    map: Mutex<HashMap<HostName, Cached>>,
    /// The bound on `map`.
    max: usize,
}

impl Default for ResolveCache {
    fn default() -> Self {
        ResolveCache::new(MAX_ENTRIES)
    }
}

impl ResolveCache {
    /// A cache of at most `max` names.
    #[must_use]
    pub fn new(max: usize) -> ResolveCache {
        ResolveCache {
            map: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    /// The live addresses of `name` at `now`.
    #[must_use]
    pub fn get(&self, name: &HostName, now: Instant) -> Option<Arc<[IpAddr]>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(name)
            .filter(|c| c.until > now)
            .map(|c| Arc::clone(&c.addrs))
    }

    /// Keeps `addrs` for `name` until `until` (at most [`MAX_TTL`] from `now`); an answer already expired,
    /// or with no address, is not kept.
    pub fn insert(&self, name: HostName, addrs: Arc<[IpAddr]>, until: Instant, now: Instant) {
        let until = until.min(now + MAX_TTL);
        if until <= now || addrs.is_empty() {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max && !map.contains_key(&name) {
            map.retain(|_, c| c.until > now);
            if map.len() >= self.max {
                if let Some(soonest) = map
                    .iter()
                    .min_by_key(|(_, c)| c.until)
                    .map(|(n, _)| n.clone())
                {
                    map.remove(&soonest);
                }
            }
        }
        map.insert(name, Cached { addrs, until });
    }

    /// Names kept now (expired ones included until swept).
    #[must_use]
    pub fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether nothing is kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> HostName {
        HostName::parse(s).unwrap()
    }

    fn addrs(s: &[&str]) -> Arc<[IpAddr]> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn hits_until_the_ttl_runs_out() {
        let cache = ResolveCache::new(8);
        let t0 = Instant::now();
        cache.insert(
            name("a.example"),
            addrs(&["198.18.0.1", "198.18.0.2"]),
            t0 + Duration::from_secs(30),
            t0,
        );
        let hit = cache.get(&name("a.example"), t0 + Duration::from_secs(29));
        assert_eq!(
            hit.as_deref(),
            Some(&addrs(&["198.18.0.1", "198.18.0.2"])[..])
        );
        assert!(cache
            .get(&name("a.example"), t0 + Duration::from_secs(30))
            .is_none());
        assert!(cache.get(&name("b.example"), t0).is_none());
    }

    #[test]
    fn ttl_is_capped_and_useless_answers_are_not_kept() {
        let cache = ResolveCache::new(8);
        let t0 = Instant::now();
        cache.insert(
            name("a.example"),
            addrs(&["198.18.0.1"]),
            t0 + MAX_TTL * 5,
            t0,
        );
        assert!(cache.get(&name("a.example"), t0 + MAX_TTL).is_none());
        cache.insert(name("b.example"), addrs(&["198.18.0.1"]), t0, t0);
        cache.insert(name("c.example"), addrs(&[]), t0 + MAX_TTL, t0);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn bounded_expired_first_then_soonest() {
        let cache = ResolveCache::new(2);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        cache.insert(name("a.example"), addrs(&["198.18.0.1"]), t0 + s(5), t0);
        cache.insert(name("b.example"), addrs(&["198.18.0.1"]), t0 + s(50), t0);
        // a has expired at t0+10: it goes.
        cache.insert(
            name("c.example"),
            addrs(&["198.18.0.1"]),
            t0 + s(60),
            t0 + s(10),
        );
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&name("b.example"), t0 + s(10)).is_some());
        // Full of live entries: the one closest to expiry (b) goes.
        cache.insert(
            name("d.example"),
            addrs(&["198.18.0.1"]),
            t0 + s(70),
            t0 + s(11),
        );
        assert!(cache.get(&name("b.example"), t0 + s(11)).is_none());
        assert!(cache.get(&name("c.example"), t0 + s(11)).is_some());
        assert!(cache.get(&name("d.example"), t0 + s(11)).is_some());
    }
}
