//! The host-side OAuth token store (issue 20): where a subscription user's real access and refresh tokens
//! live, outside the sandbox.
//!
//! How it fits: the launcher creates the store (`init`) and moves tokens it finds on the home volume
//! into it; the router (the only process that puts a real token on the wire) reads it, and writes it
//! when the token endpoint hands out new tokens. Several sessions share one store, so every
//! read-modify-write happens under an exclusive `flock` on [`LOCK_FILE`] ([`StoreLock`]), and the
//! store is replaced by rename so a reader never sees half a file. The directory is mounted into each
//! session's router (a directory, not the file: a bind-mounted file keeps its old inode after a rename).
//!
//! Format (`oauth.json`, mode 0600, in a 0700 directory):
//! `{"version":1, "access_token":…|null, "refresh_token":…|null, "expires_at":<ms since epoch>|null,
//! "scopes":[…], "subscription_type":…|null, "access_placeholder":…, "refresh_placeholder":…}`.
//! The placeholders are what the sandbox holds instead of the tokens: random, stable for the store, with
//! the real tokens' prefixes so Claude Code takes them for tokens.
//!
//! This module is behind the `oauth-store` feature: the rest of the crate does no I/O.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The store file's name inside the store directory.
pub const STORE_FILE: &str = "oauth.json";
/// The lock file's name inside the store directory (`flock`, exclusive, for every read-modify-write).
pub const LOCK_FILE: &str = "oauth.lock";
/// The largest store file read: two tokens, a few scopes and two placeholders are well under 4 KiB.
pub const MAX_STORE_LEN: u64 = 64 * 1024;
/// The only store format version this build reads and writes.
pub const STORE_VERSION: u32 = 1;
/// The prefix of a Claude OAuth access token (and of its placeholder).
pub const ACCESS_PREFIX: &str = "sk-ant-oat01-";
/// The prefix of a Claude OAuth refresh token (and of its placeholder).
pub const REFRESH_PREFIX: &str = "sk-ant-ort01-";
/// Random bytes in a placeholder: 64 bytes, 86 base64url characters, as long as a real token's body.
const PLACEHOLDER_RANDOM_BYTES: usize = 64;
/// How long [`StoreLock::acquire`] waits for another session's token exchange before giving up.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The token store's contents. `Debug` never prints a token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthStore {
    /// Format version: [`STORE_VERSION`].
    pub version: u32,
    /// The real access token; `None` before the first sign-in.
    pub access_token: Option<String>,
    /// The real refresh token; `None` before the first sign-in.
    pub refresh_token: Option<String>,
    /// When the access token expires, in milliseconds since the epoch (as Claude Code counts), if known.
    pub expires_at: Option<u64>,
    /// The scopes the tokens were granted.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The subscription (`pro`, `max`, …) Claude Code recorded with the tokens, if any.
    #[serde(default)]
    pub subscription_type: Option<String>,
    /// What the sandbox holds instead of the access token.
    pub access_placeholder: String,
    /// What the sandbox holds instead of the refresh token.
    pub refresh_placeholder: String,
}

impl fmt::Debug for OAuthStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |t: &Option<String>| t.as_ref().map(|_| "<redacted>");
        f.debug_struct("OAuthStore")
            .field("version", &self.version)
            .field("access_token", &redact(&self.access_token))
            .field("refresh_token", &redact(&self.refresh_token))
            .field("expires_at", &self.expires_at)
            .field("scopes", &self.scopes)
            .field("subscription_type", &self.subscription_type)
            .field("access_placeholder", &self.access_placeholder)
            .field("refresh_placeholder", &self.refresh_placeholder)
            .finish()
    }
}

/// What went wrong with the store; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened, inspected or read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is larger than [`MAX_STORE_LEN`].
    #[error("{} is larger than {MAX_STORE_LEN} bytes: not a token store", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not valid store JSON. The message never quotes a value from the file (it may be a
    /// token).
    #[error("{}: line {line}, column {column}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What is wrong, with any quoted value from the file removed.
        message: String,
    },
    /// The JSON is well formed but not a store this build accepts.
    #[error("{}: {problem}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A file or directory could not be created or written, or the rename failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Another process held the lock for longer than [`LOCK_TIMEOUT`].
    #[error("{} is still locked by another session after {}s", path.display(), LOCK_TIMEOUT.as_secs())]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
    },
    /// The kernel gave no random bytes for a placeholder.
    #[error("cannot get random bytes for a placeholder: {0}")]
    Random(io::Error),
}

/// Identifies one version of the store file cheaply (inode, size, modification time): a rename gives a
/// new inode, so a replaced store is noticed even within the file system's timestamp granularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Device of the file.
    dev: u64,
    /// Inode of the file.
    ino: u64,
    /// Size in bytes.
    len: u64,
    /// Modification time, seconds.
    mtime: i64,
    /// Modification time, nanoseconds.
    mtime_nsec: i64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// The store file's path in `dir`.
#[must_use]
pub fn store_path(dir: &Path) -> PathBuf {
    dir.join(STORE_FILE)
}

/// The lock file's path in `dir`.
#[must_use]
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join(LOCK_FILE)
}

/// The current stamp of the store file in `dir`, to tell whether [`OAuthStore::read`] must run again.
///
/// # Errors
/// [`StoreError::Read`] when the file cannot be inspected.
pub fn stamp(dir: &Path) -> Result<Stamp, StoreError> {
    let path = store_path(dir);
    fs::metadata(&path)
        .map(|m| Stamp::of(&m))
        .map_err(|source| StoreError::Read { path, source })
}

impl OAuthStore {
    /// A store with no tokens and fresh random placeholders.
    ///
    /// # Errors
    /// [`StoreError::Random`] when the kernel gives no random bytes.
    pub fn fresh() -> Result<OAuthStore, StoreError> {
        Ok(OAuthStore {
            version: STORE_VERSION,
            access_token: None,
            refresh_token: None,
            expires_at: None,
            scopes: Vec::new(),
            subscription_type: None,
            access_placeholder: placeholder(ACCESS_PREFIX)?,
            refresh_placeholder: placeholder(REFRESH_PREFIX)?,
        })
    }

    /// Whether the store holds a real token.
    #[must_use]
    pub fn has_tokens(&self) -> bool {
        self.access_token.is_some() || self.refresh_token.is_some()
    }

    /// Reads and checks the store in `dir`, with the stamp of exactly the version read.
    ///
    /// # Errors
    /// Every [`StoreError`] reading variant, naming the file.
    pub fn read(dir: &Path) -> Result<(OAuthStore, Stamp), StoreError> {
        let path = store_path(dir);
        let read_err = |source| StoreError::Read {
            path: path.clone(),
            source,
        };
        // No symlinks: the store is the user's own file, never something a path can redirect.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .map_err(read_err)?;
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(StoreError::Invalid {
                path,
                problem: "not a regular file".into(),
            });
        }
        if meta.len() > MAX_STORE_LEN {
            return Err(StoreError::TooLarge { path });
        }
        let mut text = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.take(MAX_STORE_LEN + 1)
            .read_to_end(&mut text)
            .map_err(read_err)?;
        if text.len() as u64 > MAX_STORE_LEN {
            return Err(StoreError::TooLarge { path });
        }
        let store = OAuthStore::parse(&text).map_err(|e| e.at(&path))?;
        Ok((store, Stamp::of(&meta)))
    }

    /// Parses and checks store JSON.
    ///
    /// # Errors
    /// [`ParseProblem`] (the caller adds the file with [`ParseProblem::at`]).
    pub fn parse(text: &[u8]) -> Result<OAuthStore, ParseProblem> {
        let store: OAuthStore = serde_json::from_slice(text).map_err(|e| ParseProblem::Syntax {
            line: e.line(),
            column: e.column(),
            message: {
                // The position is reported apart; the message keeps only what is wrong.
                let full = e.to_string();
                redact_quoted(full.rsplit_once(" at line ").map_or(&*full, |(m, _)| m))
            },
        })?;
        if store.version != STORE_VERSION {
            return Err(ParseProblem::Invalid(format!(
                "version {} is not the supported version {STORE_VERSION}",
                store.version
            )));
        }
        check_placeholder(
            "access_placeholder",
            &store.access_placeholder,
            ACCESS_PREFIX,
        )?;
        check_placeholder(
            "refresh_placeholder",
            &store.refresh_placeholder,
            REFRESH_PREFIX,
        )?;
        if store.access_placeholder == store.refresh_placeholder {
            return Err(ParseProblem::Invalid(
                "the two placeholders are equal".into(),
            ));
        }
        for (what, token) in [
            ("access_token", &store.access_token),
            ("refresh_token", &store.refresh_token),
        ] {
            if let Some(t) = token {
                if t.is_empty() || t == &store.access_placeholder || t == &store.refresh_placeholder
                {
                    return Err(ParseProblem::Invalid(format!(
                        "{what} is empty or a placeholder"
                    )));
                }
            }
        }
        Ok(store)
    }

    /// Replaces the store in `dir` atomically: a 0600 temporary file in the same directory, written and
    /// synced, renamed over the store, then the directory synced. The caller holds the [`StoreLock`].
    ///
    /// # Errors
    /// [`StoreError::Write`] naming the file that failed.
    pub fn write(&self, dir: &Path) -> Result<(), StoreError> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| StoreError::Write {
            path: store_path(dir),
            source: io::Error::other(e),
        })?;
        write_atomically(dir, STORE_FILE, &text)
    }
}

/// Why store JSON was refused, before the caller names the file.
#[derive(Debug, thiserror::Error)]
pub enum ParseProblem {
    /// Not JSON of the store's shape.
    #[error("line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message with quoted values removed.
        message: String,
    },
    /// The right shape, wrong content.
    #[error("{0}")]
    Invalid(String),
}

impl ParseProblem {
    /// The same problem, naming `path`.
    #[must_use]
    pub fn at(self, path: &Path) -> StoreError {
        let path = path.to_owned();
        match self {
            ParseProblem::Syntax {
                line,
                column,
                message,
            } => StoreError::Parse {
                path,
                line,
                column,
                message,
            },
            ParseProblem::Invalid(problem) => StoreError::Invalid { path, problem },
        }
    }
}

/// A placeholder must look like the token it stands for and be long enough never to occur by chance.
fn check_placeholder(what: &str, value: &str, prefix: &str) -> Result<(), ParseProblem> {
    let body = value.strip_prefix(prefix).unwrap_or("");
    if body.len() < 32
        || value.len() > crate::inject::MAX_PLACEHOLDER_LEN
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ParseProblem::Invalid(format!(
            "{what} must be `{prefix}` and at least 32 characters of [A-Za-z0-9_-]"
        )));
    }
    Ok(())
}

/// serde_json quotes the offending value in "invalid type: string \"…\"": it could be a token, and the
/// message ends up in a log. Keeps the message, drops every double-quoted part.
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        if c == '"' {
            if !inside {
                out.push_str("\"…\"");
            }
            inside = !inside;
        } else if !inside {
            out.push(c);
        }
    }
    out
}

/// A fresh random placeholder: `prefix` and 86 base64url characters.
///
/// # Errors
/// [`StoreError::Random`] when the kernel gives no random bytes.
pub fn placeholder(prefix: &str) -> Result<String, StoreError> {
    let mut bytes = [0u8; PLACEHOLDER_RANDOM_BYTES];
    random_bytes(&mut bytes).map_err(StoreError::Random)?;
    let mut out = String::with_capacity(prefix.len() + PLACEHOLDER_RANDOM_BYTES * 4 / 3 + 2);
    out.push_str(prefix);
    base64url(&bytes, &mut out);
    Ok(out)
}

/// Fills `buf` from the kernel's CSPRNG (getrandom(2), blocking only before the pool is seeded).
fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: the pointer and length describe `rest`, a live, writable slice.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n.unsigned_abs();
    }
    Ok(())
}

/// Unpadded base64url (RFC 4648 §5): the alphabet real tokens use.
fn base64url(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
}

/// Writes `name` in `dir` by rename: temporary file (0600, created exclusively), write, fsync, rename,
/// fsync of the directory, so after a crash the store is either the old or the new one, never torn.
fn write_atomically(dir: &Path, name: &str, text: &[u8]) -> Result<(), StoreError> {
    let target = dir.join(name);
    let mut suffix = [0u8; 6];
    random_bytes(&mut suffix).map_err(StoreError::Random)?;
    let mut tmp_name = OsString::from(format!(".{name}.tmp-"));
    let mut s = String::new();
    base64url(&suffix, &mut s);
    tmp_name.push(s);
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(text)?;
        file.sync_all()?;
        fs::rename(&tmp, &target)
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::Write {
            path: target,
            source,
        });
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Write {
            path: dir.to_owned(),
            source,
        })
}

/// An exclusive `flock` on the store's lock file: held across a read-modify-write of the store, so two
/// sessions refreshing at once do not both spend the same refresh token. Released on drop (close).
#[derive(Debug)]
pub struct StoreLock {
    /// The open lock file; closing it releases the lock.
    _file: File,
}

impl StoreLock {
    /// Takes the lock on the existing lock file in `dir`, waiting at most [`LOCK_TIMEOUT`]. Blocks the
    /// calling thread: async callers run it in `spawn_blocking`.
    ///
    /// # Errors
    /// [`StoreError::Lock`] when the file cannot be opened or locked, [`StoreError::LockTimeout`] when
    /// another holder keeps it too long.
    pub fn acquire(dir: &Path) -> Result<StoreLock, StoreError> {
        StoreLock::acquire_within(dir, LOCK_TIMEOUT)
    }

    /// [`StoreLock::acquire`] with another deadline.
    ///
    /// # Errors
    /// As [`StoreLock::acquire`].
    pub fn acquire_within(dir: &Path, timeout: Duration) -> Result<StoreLock, StoreError> {
        let path = lock_path(dir);
        // Read-only is enough for flock, and works when the lock file is not ours to write.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|source| StoreError::Lock {
                path: path.clone(),
                source,
            })?;
        // Polled with LOCK_NB rather than a blocking flock: a blocked flock cannot be given a deadline
        // without signals, and a router must not wait forever on a stuck peer.
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(2);
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(StoreLock { _file: file });
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK | libc::EINTR) => {}
                _ => return Err(StoreError::Lock { path, source: e }),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::LockTimeout { path });
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

/// Creates the store in `dir` if it is missing: the directory (0700), the lock file (0600) and, under
/// the lock, a store with fresh placeholders and no tokens. Returns the lock (still held) and the store.
/// An existing store is read and checked, never replaced.
///
/// # Errors
/// [`StoreError`] naming the file or directory that failed.
pub fn init(dir: &Path) -> Result<(StoreLock, OAuthStore), StoreError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // The parents ($XDG_STATE_HOME/agent-sandbox) are the user's own: make them too.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| StoreError::Write {
                    path: dir.to_owned(),
                    source,
                })?;
        }
        Err(source) => {
            return Err(StoreError::Write {
                path: dir.to_owned(),
                source,
            })
        }
    }
    // Followed: the state directory is the user's own, and may be a link they made on purpose.
    let meta = fs::metadata(dir).map_err(|source| StoreError::Read {
        path: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(StoreError::Invalid {
            path: dir.to_owned(),
            problem: "not a directory".into(),
        });
    }
    let lock = lock_path(dir);
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock)
        .map_err(|source| StoreError::Write { path: lock, source })?;
    let held = StoreLock::acquire(dir)?;
    match OAuthStore::read(dir) {
        Ok((store, _)) => Ok((held, store)),
        Err(StoreError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            let store = OAuthStore::fresh()?;
            store.write(dir)?;
            Ok((held, store))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let mut r = [0u8; 6];
            random_bytes(&mut r).unwrap();
            let mut s = String::new();
            base64url(&r, &mut s);
            let p = std::env::temp_dir().join(format!("oauth-store-{tag}-{s}"));
            fs::create_dir(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn placeholders_have_the_prefix_and_differ() {
        let a = placeholder(ACCESS_PREFIX).unwrap();
        let b = placeholder(ACCESS_PREFIX).unwrap();
        assert!(a.starts_with(ACCESS_PREFIX));
        assert_eq!(a.len(), ACCESS_PREFIX.len() + 86);
        assert_ne!(a, b);
        check_placeholder("x", &a, ACCESS_PREFIX).unwrap();
        assert!(check_placeholder("x", &a, REFRESH_PREFIX).is_err());
    }

    #[test]
    fn base64url_matches_rfc4648_vectors() {
        for (input, want) in [
            (&b""[..], ""),
            (b"f", "Zg"),
            (b"fo", "Zm8"),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg"),
            (b"\xfb\xff", "-_8"),
        ] {
            let mut s = String::new();
            base64url(input, &mut s);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn init_creates_private_files_and_keeps_an_existing_store() {
        let tmp = TempDir::new("init");
        let dir = tmp.0.join("state/agent-sandbox/oauth");
        let (lock, first) = init(&dir).unwrap();
        drop(lock);
        assert!(!first.has_tokens());
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&store_path(&dir)), 0o600);
        assert_eq!(mode(&lock_path(&dir)), 0o600);
        let (_lock, second) = init(&dir).unwrap();
        assert_eq!(first, second, "placeholders are stable for the store");
    }

    #[test]
    fn write_replaces_by_rename_and_leaves_no_temporary() {
        let tmp = TempDir::new("write");
        let (lock, mut store) = init(&tmp.0).unwrap();
        let before = stamp(&tmp.0).unwrap();
        store.access_token = Some("sk-ant-oat01-real".into());
        store.write(&tmp.0).unwrap();
        drop(lock);
        let (read, after) = OAuthStore::read(&tmp.0).unwrap();
        assert_eq!(read, store);
        assert_ne!(before.ino, after.ino, "a new inode: replaced by rename");
        assert_eq!(after, stamp(&tmp.0).unwrap());
        assert_eq!(
            fs::metadata(store_path(&tmp.0)).unwrap().mode() & 0o777,
            0o600
        );
        let mut names: Vec<_> = fs::read_dir(&tmp.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [STORE_FILE, LOCK_FILE]);
    }

    #[test]
    fn errors_name_the_file_and_never_quote_a_token() {
        let tmp = TempDir::new("bad");
        let path = store_path(&tmp.0);
        fs::write(
            &path,
            br#"{"version":1,"access_token":"sk-ant-oat01-SECRET","refresh_token":null,"expires_at":"sk-ant-oat01-SECRET2"}"#,
        )
        .unwrap();
        let e = OAuthStore::read(&tmp.0).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(e.contains("line 1"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
        assert_eq!(e.matches("line").count(), 1, "{e}");

        fs::write(&path, br#"{"version":1,"surprise":true}"#).unwrap();
        let e = OAuthStore::read(&tmp.0).unwrap_err().to_string();
        assert!(e.contains("surprise"), "unknown fields are refused: {e}");

        fs::write(&path, vec![b' '; MAX_STORE_LEN as usize + 1]).unwrap();
        assert!(matches!(
            OAuthStore::read(&tmp.0),
            Err(StoreError::TooLarge { .. })
        ));

        let mut store = OAuthStore::fresh().unwrap();
        store.version = 2;
        fs::write(&path, serde_json::to_vec(&store).unwrap()).unwrap();
        let e = OAuthStore::read(&tmp.0).unwrap_err().to_string();
        assert!(e.contains("version 2"), "{e}");

        store.version = 1;
        store.refresh_placeholder = "sk-ant-ort01-short".into();
        fs::write(&path, serde_json::to_vec(&store).unwrap()).unwrap();
        let e = OAuthStore::read(&tmp.0).unwrap_err().to_string();
        assert!(e.contains("refresh_placeholder"), "{e}");
    }

    #[test]
    fn debug_redacts_tokens() {
        let mut store = OAuthStore::fresh().unwrap();
        store.refresh_token = Some("sk-ant-ort01-TOPSECRET".into());
        let shown = format!("{store:?}");
        assert!(!shown.contains("TOPSECRET"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn the_lock_excludes_a_second_holder_until_dropped() {
        let tmp = TempDir::new("lock");
        let (held, _) = init(&tmp.0).unwrap();
        let e = StoreLock::acquire_within(&tmp.0, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, StoreError::LockTimeout { .. }), "{e}");
        assert!(e.to_string().contains(LOCK_FILE), "{e}");
        drop(held);
        StoreLock::acquire_within(&tmp.0, Duration::from_millis(20)).unwrap();
    }

    #[test]
    fn a_missing_lock_file_is_an_error_naming_it() {
        let tmp = TempDir::new("nolock");
        let e = StoreLock::acquire(&tmp.0).unwrap_err().to_string();
        assert!(e.contains(LOCK_FILE), "{e}");
    }
}
