//! Noticing that the allowlist file changed, so the router reloads it without a SIGHUP.
//!
//! How it fits: the configuration in force was built from one read of each file (`--config`,
//! `--allowlist`), and each file's [`AllowlistWatch`] starts from the [`Fingerprint`] of those very bytes
//! ([`crate::cli::Built::read`]), so a change at any moment after that read, start-up included, is a
//! change. [`AllowlistWatch::run`] runs on a task; each settled change wakes the reload task through a
//! [`Notify`]. A `Notify` holds at most one permit, so changes that arrive while a reload runs are folded
//! into one more reload, never queued up.
//!
//! Content polling rather than inotify: every [`DEFAULT_INTERVAL`] the file is opened through its path
//! (following symlinks, as the reload will), read as the reload reads it (a FIFO or device is never
//! read; at most the configuration file's size cap), and hashed. That sees
//! every way the file can change, with no special case for any of them: a Kubernetes ConfigMap update
//! (the `..data` symlink in the mounted directory is swapped to a new timestamped directory; the file is
//! never written in place), a rename over the file, an in-place write, a symlink whose target lives in a
//! directory nobody watches, a directory bind-mounted into a container and changed from the host, a
//! file that disappears and comes back. Inotify on the directory sees the first three only, needs
//! overflow handling, and a file descriptor per router. The cost is one small read and hash a second,
//! a small fraction of a core even at the size cap (BENCHMARKS.md, "The file watch's cost"); and the
//! change is noticed within one interval plus [`DEFAULT_SETTLE`], well inside the 5 s promised.
//!
//! A change is reported only once the content has stayed the same for one settle period, so a file
//! being written in several pieces is reloaded once, whole, rather than failing on a torn read first. A
//! file that keeps changing for [`MAX_SETTLE_ROUNDS`] settle periods is not reported at all: a warning
//! says so, the rules in force stay, and the next interval looks again. What settled is published in
//! [`Settled`], and a reload a watch asked for applies only content read with that fingerprint: a write
//! that starts after the content settled is never applied half-done (its watch reports it once it
//! settles in turn). Settling cannot tell a writer that pauses longer than the settle period from one
//! that is done; writing a new file and renaming it over the old one is the way to change a file in one
//! step. Settled content is compared with the content in force (which the reload records in
//! [`Settled`], SIGHUP's reloads included), not with what the watch last reported: content whose
//! reload was skipped or failed is reported again after [`RETRY_AFTER`], doubling up to
//! [`MAX_RETRY_AFTER`], and content a SIGHUP read mid-write is put right once the file settles. A
//! missing or unreadable file is a state like any content: its appearance is one change (the reload
//! reports the failure), and while it stays missing it is retried as above, no more often.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::Hasher as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_shared::allowlist::MAX_ALLOWLIST_BYTES;
use agent_sandbox_shared::config::MAX_CONFIG_BYTES;
use agent_sandbox_shared::file::{read_capped, ReadError};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The most read of a watched file: the larger of the allowlist's and the configuration file's caps, so
/// a file the reload can load is fingerprinted whole, as the reload fingerprints it.
const MAX_WATCHED_BYTES: u64 = if MAX_ALLOWLIST_BYTES > MAX_CONFIG_BYTES {
    MAX_ALLOWLIST_BYTES
} else {
    MAX_CONFIG_BYTES
};

/// How often the file is read.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// How long new content must stay unchanged before it is reported.
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(250);

/// Settle reads after which a file that keeps changing is given up on until the next interval: it is not
/// reported (its content may be half-written), a warning says so, and the next interval tries again.
pub const MAX_SETTLE_ROUNDS: u32 = 8;

/// What a read of the file found; two reads that give equal fingerprints saw the same thing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fingerprint {
    /// The file's content (up to one byte past the size cap): its length and hash.
    Content {
        /// Bytes read.
        len: u64,
        /// Hash of those bytes.
        hash: u64,
    },
    /// The path does not exist (or a symlink on it dangles).
    Missing,
    /// The path exists but is not a regular file (a directory, a FIFO that must not be read, ...).
    NotAFile,
    /// Opening or reading failed otherwise (permissions, I/O error), by error kind.
    Unreadable(std::io::ErrorKind),
}

impl Fingerprint {
    /// Reads `path` (following symlinks) and fingerprints what is there, read as the reload reads it
    /// (a FIFO or device is never read). Blocking: call it off the async workers.
    #[must_use]
    pub fn of(path: &Path) -> Fingerprint {
        match read_capped(path, MAX_WATCHED_BYTES) {
            Ok(bytes) => Fingerprint::of_bytes(&bytes),
            Err(ReadError::NotAFile) => Fingerprint::NotAFile,
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                Fingerprint::Missing
            }
            Err(ReadError::Io(e)) => Fingerprint::Unreadable(e.kind()),
        }
    }

    /// The fingerprint of content already read: what [`Fingerprint::of`] gives for a file holding
    /// `bytes` (up to one byte past the cap).
    #[must_use]
    pub fn of_bytes(bytes: &[u8]) -> Fingerprint {
        let mut hasher = DefaultHasher::new();
        hasher.write(bytes);
        Fingerprint::Content {
            len: bytes.len() as u64,
            hash: hasher.finish(),
        }
    }
}

/// What the watches and the reload know of each watched file, by path.
///
/// - What each watch last saw settle (or, before any change, the content the policy in force was
///   loaded from). A reload a watch asked for applies only content read with these fingerprints, so
///   what changed again after it settled (a write in progress) is never applied torn.
/// - Once the reload tracks it ([`Settled::set_in_force`], at start and after each reload applied,
///   SIGHUP's included): the content the policy in force was built from. A watch then reports a file
///   whose settled content differs from that, not merely from what it last reported, so a change whose
///   reload was skipped or read it torn is tried again ([`RETRY_AFTER`]) rather than lost, and content a
///   SIGHUP applied torn is corrected once the file settles.
#[derive(Clone, Debug, Default)]
pub struct Settled(Arc<Mutex<Files>>);

/// The maps behind [`Settled`].
#[derive(Debug, Default)]
struct Files {
    /// What each watch last saw settle.
    settled: HashMap<PathBuf, Fingerprint>,
    /// What the policy in force was built from (empty until the reload tracks it).
    in_force: HashMap<PathBuf, Fingerprint>,
}

impl Settled {
    fn files(&self) -> std::sync::MutexGuard<'_, Files> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, path: &Path, fingerprint: Fingerprint) {
        self.files().settled.insert(path.to_owned(), fingerprint);
    }

    /// Records the files the policy in force was built from (`read`: each with the fingerprint of the
    /// content read).
    pub fn set_in_force(&self, read: &[(PathBuf, Fingerprint)]) {
        let mut files = self.files();
        for (path, seen) in read {
            files.in_force.insert(path.clone(), seen.clone());
        }
    }

    /// What the policy in force was built from for `path`, if the reload tracks it.
    fn in_force(&self, path: &Path) -> Option<Fingerprint> {
        self.files().in_force.get(path).cloned()
    }

    /// The first of the files `read` (with the fingerprints of the content read) that a watch covers and
    /// that was read with other content than the watch saw settle; `None` if every one matches.
    #[must_use]
    pub fn unsettled<'a>(&self, read: &'a [(PathBuf, Fingerprint)]) -> Option<&'a Path> {
        let files = self.files();
        read.iter()
            .find(|(path, seen)| files.settled.get(path).is_some_and(|s| s != seen))
            .map(|(path, _)| path.as_path())
    }
}

/// How long a watch waits before reporting again content it reported whose reload did not put it in
/// force (skipped because the file changed again while it was read, or failed). Each further retry of
/// the same content waits twice as long, up to [`MAX_RETRY_AFTER`]: a file that is invalid is tried a
/// few times, not on every read, and one whose reload read it torn is applied seconds later.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The longest wait between retries of the same content.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Watches one allowlist path for changes of its content.
#[derive(Debug)]
pub struct AllowlistWatch {
    /// The path as given on the command line (may be, or pass through, symlinks).
    path: PathBuf,
    /// Time between reads.
    interval: Duration,
    /// Time new content must stay unchanged before it is reported.
    settle: Duration,
    /// What the last reported (or the initial) read found.
    reported: Fingerprint,
    /// Where settled content is published for the reload.
    settled: Settled,
    /// Reads done so far, for tests that must know the watcher looked without a change to report.
    polls: Arc<AtomicU64>,
}

impl AllowlistWatch {
    /// Takes the initial fingerprint of `path` now (blocking, one read). A watch for a file a policy was
    /// loaded from is made with [`AllowlistWatch::loaded`] instead, so a change after that load but
    /// before this read is not taken for the content in force.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> AllowlistWatch {
        let path = path.into();
        let reported = Fingerprint::of(&path);
        AllowlistWatch::loaded(path, reported)
    }

    /// A watch for `path` whose content in force is `loaded`: the fingerprint of the very bytes the
    /// policy in force was parsed from. Any other content is a change.
    #[must_use]
    pub fn loaded(path: impl Into<PathBuf>, loaded: Fingerprint) -> AllowlistWatch {
        AllowlistWatch {
            path: path.into(),
            interval: DEFAULT_INTERVAL,
            settle: DEFAULT_SETTLE,
            reported: loaded,
            settled: Settled::default(),
            polls: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Publishes what this watch sees settle (and, from the start, the content in force) in `settled`,
    /// which the reload checks the content it read against.
    #[must_use]
    pub fn publishing(mut self, settled: Settled) -> AllowlistWatch {
        self.settled = settled;
        self
    }

    /// Reads every `interval` and waits `settle` for new content to stay put (tests use short ones).
    #[must_use]
    pub fn with_timing(mut self, interval: Duration, settle: Duration) -> AllowlistWatch {
        self.interval = interval;
        self.settle = settle;
        self
    }

    /// A counter of the reads done so far.
    #[must_use]
    pub fn polls(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.polls)
    }

    /// Polls until `shutdown` is cancelled, calling `changed.notify_one()` once per settled change.
    /// Content that never settles is not reported: the rules in force stay, with a warning.
    pub async fn run(mut self, changed: Arc<Notify>, shutdown: CancellationToken) {
        info!(path = %self.path.display(), "watching the allowlist for changes every {:?}", self.interval);
        self.settled.set(&self.path, self.reported.clone());
        let mut ticks = tokio::time::interval(self.interval);
        // After a slow read, carry on from now rather than firing the missed ticks back to back.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Whether the file's not settling has been logged since it last settled.
        let mut warned = false;
        // The content last reported, when, and how long before it is reported again while it is not
        // in force.
        let mut fired: Option<(Fingerprint, tokio::time::Instant, Duration)> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let Some(mut seen) = self.read().await else {
                return;
            };
            // What to compare with: the content in force when the reload tracks it, else what this
            // watch last reported.
            let in_force = self
                .settled
                .in_force(&self.path)
                .unwrap_or_else(|| self.reported.clone());
            if seen == in_force {
                // In force as it is: a reload asked for by the other file's watch may read it so.
                self.settled.set(&self.path, seen);
                warned = false;
                fired = None;
                continue;
            }
            // Reported already, and not (yet) in force: the reload skipped it or failed. Again only
            // after a while, longer each time.
            let mut wait = RETRY_AFTER;
            if let Some((f, at, waited)) = &fired {
                if *f == seen {
                    if at.elapsed() < *waited {
                        continue;
                    }
                    wait = (*waited * 2).min(MAX_RETRY_AFTER);
                }
            }
            // Changed: wait until two reads one settle period apart agree.
            let mut settled = false;
            for _ in 0..MAX_SETTLE_ROUNDS {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(self.settle) => {}
                }
                let Some(again) = self.read().await else {
                    return;
                };
                if again == seen {
                    settled = true;
                    break;
                }
                seen = again;
            }
            if !settled {
                if !warned {
                    warn!(
                        path = %self.path.display(),
                        "the allowlist keeps changing (it did not stay the same for {:?} in {} reads): \
                         the rules in force stay until it does; to change it in one step, write a new \
                         file and rename it over the old one",
                        self.settle,
                        MAX_SETTLE_ROUNDS
                    );
                    warned = true;
                }
                continue;
            }
            warned = false;
            if self.settled.in_force(&self.path).as_ref() == Some(&seen) {
                // Changed and changed back (or applied meanwhile): nothing to reload.
                self.settled.set(&self.path, seen);
                fired = None;
                continue;
            }
            debug!(path = %self.path.display(), ?seen, "allowlist changed");
            self.settled.set(&self.path, seen.clone());
            fired = Some((seen.clone(), tokio::time::Instant::now(), wait));
            self.reported = seen;
            changed.notify_one();
        }
    }

    /// One fingerprint, read on the blocking pool so a slow disk never stalls a runtime. `None` only
    /// if the runtime is shutting down.
    async fn read(&self) -> Option<Fingerprint> {
        let path = self.path.clone();
        let fingerprint = tokio::task::spawn_blocking(move || Fingerprint::of(&path))
            .await
            .ok()?;
        self.polls.fetch_add(1, Ordering::Relaxed);
        Some(fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_tell_content_missing_and_directories_apart() {
        let dir = std::env::temp_dir().join(format!("as-watch-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("allowed-hosts");
        std::fs::write(&file, "example.test\n").unwrap();
        let a = Fingerprint::of(&file);
        assert!(matches!(a, Fingerprint::Content { len: 13, .. }));
        assert_eq!(Fingerprint::of(&file), a, "same content, same fingerprint");
        std::fs::write(&file, "example.tesu\n").unwrap();
        assert_ne!(Fingerprint::of(&file), a);
        assert_eq!(Fingerprint::of(&dir), Fingerprint::NotAFile);
        assert_eq!(Fingerprint::of(&dir.join("nope")), Fingerprint::Missing);
        // A FIFO is not read (that would wait for a writer forever).
        let fifo = dir.join("fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert_eq!(Fingerprint::of(&fifo), Fingerprint::NotAFile);
        let big = dir.join("big");
        std::fs::write(
            &big,
            vec![b'a'; usize::try_from(MAX_WATCHED_BYTES).unwrap() + 100],
        )
        .unwrap();
        assert!(matches!(
            Fingerprint::of(&big),
            Fingerprint::Content { len, .. } if len == MAX_WATCHED_BYTES + 1
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
