//! One change to what sessions allow at a time, per user: `allow`, `deny`, `reload`, and a session's
//! start from its last reading of the allowlist until its router listens, each hold an exclusive
//! `flock` on `live.lock` in the state directory (`$XDG_STATE_HOME/agent-sandbox`, by default
//! `~/.local/state/agent-sandbox`).
//!
//! Without it, each command applied the allowlist text it had read earlier: an `allow` that was still
//! waiting for podman when a `deny` ran applied its older text afterwards and put the denied name back
//! into the running sessions, while `deny` had said it was refused. A session starting while `deny`
//! ran could likewise start from the text before the deny, unseen by it. A start takes the lock only
//! once its images are there and stale sessions are swept (a first pull can take minutes), and reads
//! the allowlist again under it. The kernel releases the lock when its holder exits, however it exits,
//! so a killed command leaves nothing to clean up.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// How long to wait for another command's change before giving up. A session start holds the lock for
/// as long as its router and forwarder take to listen (up to its readiness timeout, 30 s), and a live
/// change waits a few seconds per session for its verdicts.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// How often a waiting command tries again.
const RETRY: Duration = Duration::from_millis(50);

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct LiveLock {
    /// The locked file.
    _file: File,
}

/// Takes this user's live lock (in `state_dir`), waiting up to [`PATIENCE`] for another holder and
/// saying so on stderr once when it has to wait; `doing` names what the caller is about to do, for that
/// message.
pub fn acquire(state_dir: &Path, doing: &str) -> anyhow::Result<LiveLock> {
    let path = crate::session::rundir::live_lock_path(state_dir)?;
    acquire_at(path, doing, PATIENCE, &|| false)?.context("the wait for the live lock was stopped")
}

/// [`acquire`] of the lock at `path` (`session::rundir::live_lock_path`) for a session start, which
/// handles its own signals: `None` as soon as `stop` says so (a Ctrl-C while waiting).
pub fn acquire_unless(
    path: PathBuf,
    doing: &str,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<Option<LiveLock>> {
    acquire_at(path, doing, PATIENCE, stop)
}

fn acquire_at(
    path: PathBuf,
    doing: &str,
    patience: Duration,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<Option<LiveLock>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    let started = Instant::now();
    let mut said = false;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is touched.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(LiveLock { _file: file }));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err).with_context(|| format!("cannot lock {}", path.display()));
        }
        if stop() {
            return Ok(None);
        }
        if started.elapsed() >= patience {
            bail!(
                "another agent-sandbox command or session start has held {} for {} s; wait for it \
                 to finish (`ps -C agent-sandbox` shows it), then try {doing} again",
                path.display(),
                patience.as_secs()
            );
        }
        if !said {
            eprintln!(
                "agent-sandbox: waiting for another agent-sandbox command or session start to finish its change before {doing}"
            );
            said = true;
        }
        std::thread::sleep(RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock excludes a second holder until the first is dropped; a waiter past its patience fails
    /// with a message that says what to do, and one told to stop stops at once.
    #[test]
    fn one_holder_at_a_time() {
        let dir = std::env::temp_dir().join(format!("as-live-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("live.lock");
        let never = &|| false;
        let first = acquire_at(path.clone(), "allowing", PATIENCE, never)
            .unwrap()
            .unwrap();
        let err = acquire_at(path.clone(), "denying", Duration::from_millis(120), never)
            .unwrap_err()
            .to_string();
        assert!(err.contains("has held"), "{err}");
        assert!(err.contains("then try denying again"), "{err}");
        let stopped = acquire_at(path.clone(), "starting", PATIENCE, &|| true).unwrap();
        assert!(stopped.is_none());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || {
                let got = acquire_at(path, "reloading", PATIENCE, &|| false);
                let _ = tx.send(());
                got.map(|l| l.is_some())
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "taken while held"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("taken once released");
        assert!(waiter.join().unwrap().unwrap());
        // A symlink in its place is refused, not followed.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), &path).unwrap();
        assert!(acquire_at(path, "allowing", PATIENCE, never).is_err());
        assert!(!dir.join("elsewhere").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
