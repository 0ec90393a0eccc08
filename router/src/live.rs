//! The one holder of what a live reload will replace: [`Live`] over the [`Rules`] (policy and DNS
//! answers).
//!
//! How it fits: [`crate::run`] builds one `Live<Rules>` from the validated configuration and hands a
//! clone to every worker's DNS handler and proxy. Each DNS query and each new connection takes one
//! snapshot ([`Live::load`]) at its start and decides on it alone, so a reload (a later [`Live::store`])
//! applies to the next query or connection everywhere at once, and a relay already running keeps the
//! rules it was admitted under. Readers hold the lock only long enough to clone an `Arc`.

use std::sync::{Arc, RwLock};

use agent_sandbox_shared::Rules;

/// A value every worker reads and a reload may replace atomically.
#[derive(Debug)]
pub struct Live<T> {
    /// The current value; replaced whole, never changed in place.
    current: Arc<RwLock<Arc<T>>>,
}

impl<T> Clone for Live<T> {
    fn clone(&self) -> Self {
        Live {
            current: Arc::clone(&self.current),
        }
    }
}

impl<T> Live<T> {
    /// A holder starting at `value`.
    #[must_use]
    pub fn new(value: T) -> Live<T> {
        Live {
            current: Arc::new(RwLock::new(Arc::new(value))),
        }
    }

    /// The current value, as one consistent snapshot.
    #[must_use]
    pub fn load(&self) -> Arc<T> {
        // A writer cannot panic half-way through replacing an Arc, so a poisoned lock still holds a
        // whole value.
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the value for every later [`load`](Live::load); returns the previous one.
    pub fn store(&self, value: T) -> Arc<T> {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *current, Arc::new(value))
    }
}

/// The rules every worker decides on.
pub type LiveRules = Live<Rules>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_outlives_a_store() {
        let live = Live::new(1);
        let other = live.clone();
        let before = live.load();
        assert_eq!(*other.store(2), 1);
        assert_eq!(*before, 1, "a snapshot taken before is unchanged");
        assert_eq!(*live.load(), 2, "every clone sees the new value");
    }
}
