//! Signals: the launcher must always clean up, so SIGINT, SIGTERM and SIGHUP never kill it outright.
//!
//! While the session is being set up, a signal is recorded and the setup stops at the next step. While
//! the sandboxed command runs, the signal is passed on to it (the session sends it with `podman kill`:
//! rootless `podman run` reports status 0 for a command it proxied SIGTERM to); if the command is still running [`GRACE`] after a SIGTERM or SIGHUP, the escalation the
//! session registered (killing the pod) runs. Either way the launcher then removes the session's
//! objects and exits.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// How long a command may take to exit after the launcher forwarded SIGTERM or SIGHUP to it.
pub const GRACE: Duration = Duration::from_secs(10);

type Escalation = Box<dyn Fn() + Send + Sync>;
type Forward = Box<dyn Fn(i32) + Send + Sync>;

#[derive(Default)]
struct Shared {
    /// The last signal received (0: none).
    last: AtomicI32,
    /// The pid of the running `podman run` (0: none).
    child: AtomicU32,
    /// What to do when the command ignores a forwarded SIGTERM/SIGHUP.
    escalation: Mutex<Option<Escalation>>,
    /// How a signal reaches the command (default: kill(2) on the child).
    forward: Mutex<Option<Forward>>,
}

impl Shared {
    fn forward(&self, sig: i32, child: u32) {
        match self.forward.lock().unwrap().as_ref() {
            Some(f) => f(sig),
            // SAFETY: kill(2) with a pid we spawned and a valid signal number has no memory effects;
            // at worst the process is gone and it fails with ESRCH.
            None => unsafe {
                libc::kill(child as libc::pid_t, sig);
            },
        }
    }
}

/// The launcher's signal handling, installed once at start.
#[derive(Clone)]
pub struct SignalWatch {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SignalWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalWatch")
            .field("last", &self.shared.last.load(Ordering::SeqCst))
            .field("child", &self.shared.child.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl SignalWatch {
    /// Installs handlers for SIGINT, SIGTERM and SIGHUP and starts the thread that acts on them.
    pub fn install() -> std::io::Result<SignalWatch> {
        let shared = Arc::new(Shared::default());
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    s.last.store(sig, Ordering::SeqCst);
                    let child = s.child.load(Ordering::SeqCst);
                    if child == 0 {
                        continue;
                    }
                    s.forward(sig, child);
                    if sig != SIGINT {
                        let s2 = Arc::clone(&s);
                        std::thread::spawn(move || {
                            std::thread::sleep(GRACE);
                            if s2.child.load(Ordering::SeqCst) == child {
                                if let Some(f) = s2.escalation.lock().unwrap().as_ref() {
                                    f();
                                }
                            }
                        });
                    }
                }
            })?;
        Ok(SignalWatch { shared })
    }

    /// A watch that no signal reaches (tests: installing handlers would catch the test runner's).
    #[cfg(test)]
    #[must_use]
    pub fn for_tests() -> SignalWatch {
        SignalWatch {
            shared: Arc::default(),
        }
    }

    /// The last signal received, if any.
    #[must_use]
    pub fn received(&self) -> Option<i32> {
        match self.shared.last.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Registers the running command's `podman run` (Some) or its end (None).
    pub fn set_child(&self, pid: Option<u32>) {
        self.shared.child.store(pid.unwrap_or(0), Ordering::SeqCst);
    }

    /// Passes a signal that arrived after the last setup check but before [`SignalWatch::set_child`] on
    /// to the child, which would otherwise never hear of it.
    pub fn forward_pending(&self) {
        let (sig, child) = (
            self.shared.last.load(Ordering::SeqCst),
            self.shared.child.load(Ordering::SeqCst),
        );
        if sig != 0 && child != 0 {
            self.shared.forward(sig, child);
        }
    }

    /// Registers how a signal is passed on to the running command, instead of signalling the child.
    pub fn set_forward(&self, f: impl Fn(i32) + Send + Sync + 'static) {
        *self.shared.forward.lock().unwrap() = Some(Box::new(f));
    }

    /// Registers what to do when the command outlives [`GRACE`] after SIGTERM or SIGHUP.
    pub fn set_escalation(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.shared.escalation.lock().unwrap() = Some(Box::new(f));
    }
}
