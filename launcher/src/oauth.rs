//! The OAuth token store's preparation before a session (issue 20): the store exists, and the home
//! volume holds placeholders only.
//!
//! How it fits: the session calls [`prepare`] before the router starts, then mounts the store directory
//! into the router (read-write) and names it in the router's `[inject.oauth]` section. Claude Code in
//! the sandbox reads `~/.claude/.credentials.json` from the home volume; before issue 20 that file held
//! the real tokens, readable (and so exportable) by anything in any session. The first prepared session
//! moves them into the store and leaves placeholders in their place; the router puts the real tokens on
//! the wire (router/src/inject/oauth.rs explains the whole flow).
//!
//! The home volume is written by the sandbox, so nothing in it is trusted: every path component below
//! the volume's mount point is opened without following symlinks, the credentials file must be a
//! regular file of bounded size, and it is replaced by rename inside the directory already opened, with
//! its owner and mode kept (the sandbox user must still be able to write it).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use agent_sandbox_shared::oauth_store::{self, OAuthStore, StoreError};
use serde_json::{Map, Value};

/// Where Claude Code keeps its sign-in, relative to its home (the home volume's mount point).
pub const CREDENTIALS_DIR: &str = ".claude";
/// The credentials file's name in [`CREDENTIALS_DIR`].
pub const CREDENTIALS_FILE: &str = ".credentials.json";
/// The largest credentials file read: a few tokens and MCP sign-ins are far below this.
const MAX_CREDENTIALS_LEN: u64 = 256 * 1024;
/// The key of Claude's own sign-in in the credentials file; every other key is kept as it is.
const OAUTH_KEY: &str = "claudeAiOauth";

/// What the user is told when [`Prepared::moved_tokens`] is set.
pub const MOVED_TOKENS_NOTICE: &str = "Your Claude sign-in tokens were on the sandbox's home volume; they \
are now stored outside the sandbox, and the sandbox holds stand-ins. Sessions before this one could read \
the real tokens, so treat them as exposed: run /logout and then /login once in this session to replace them.";

/// What [`prepare`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// Real tokens were found on the home volume and moved into the store: show
    /// [`MOVED_TOKENS_NOTICE`].
    pub moved_tokens: bool,
    /// The credentials file on the home volume was written (tokens replaced by placeholders, or a file
    /// holding the placeholders created because the store has tokens and the volume had none).
    pub wrote_credentials: bool,
}

/// What went wrong preparing the store or the home volume's credentials; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The token store (its error names the file).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file or directory on the home volume could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The credentials file (or its directory) is not what Claude Code writes: a symlink, not a regular
    /// file, too large, or not a JSON object. Never quotes the file's content.
    #[error("{}: {problem}", path.display())]
    Invalid {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The credentials file or its directory could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl PrepareError {
    /// Whether the store is ready and only the home volume's credentials file was in the way (a file
    /// the sandbox can write, so possibly its doing): the session may go on with injection after
    /// telling the user, since the sandbox holds no token that this step would have moved.
    #[must_use]
    pub fn store_is_ready(&self) -> bool {
        !matches!(self, PrepareError::Store(_))
    }
}

/// The store directory: `$XDG_STATE_HOME/agent-sandbox/oauth`, by default
/// `~/.local/state/agent-sandbox/oauth`. `None` when neither variable gives an absolute path.
#[must_use]
pub fn default_store_dir() -> Option<PathBuf> {
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    absolute(std::env::var_os("XDG_STATE_HOME"))
        .or_else(|| absolute(std::env::var_os("HOME")).map(|h| h.join(".local/state")))
        .map(|state| state.join("agent-sandbox").join("oauth"))
}

/// Prepares OAuth injection for a session: creates the store in `store_dir` if it is missing (0700
/// directory, 0600 files, fresh placeholders), then, under the store's lock, makes the home volume
/// (mounted at `home_volume` on the host) hold placeholders only:
/// - real tokens in `.claude/.credentials.json` are moved into the store and replaced by the
///   placeholders (every other field kept, the file's owner and mode kept) — once: the next session
///   finds placeholders;
/// - with no credentials file and real tokens in the store, a file holding the placeholders is written,
///   so Claude Code in the sandbox knows it is signed in.
///
/// # Errors
/// [`PrepareError`] naming the file: the store cannot be created or read, or the credentials file is
/// unreadable, a symlink, not a regular file, too large or not JSON.
pub fn prepare(store_dir: &Path, home_volume: &Path) -> Result<Prepared, PrepareError> {
    let (_lock, mut store) = oauth_store::init(store_dir)?;
    let home = open_dir(None, home_volume, home_volume)?.ok_or_else(|| PrepareError::Read {
        path: home_volume.to_owned(),
        source: io::ErrorKind::NotFound.into(),
    })?;
    let claude_path = home_volume.join(CREDENTIALS_DIR);
    let credentials_path = claude_path.join(CREDENTIALS_FILE);
    let claude = open_dir(Some(&home), Path::new(CREDENTIALS_DIR), &claude_path)?;
    let existing = match &claude {
        Some(dir) => read_credentials(dir, &credentials_path)?,
        None => None,
    };
    let (claude, mut json, meta) = match (claude, existing) {
        (Some(claude), Some((json, meta))) => (claude, json, meta),
        (claude, _) => {
            // No credentials file: after a sign-in kept in the store (a new home volume, or Claude Code
            // removed the file), give the sandbox the placeholders so it knows it is signed in.
            if !store.has_tokens() {
                return Ok(Prepared {
                    moved_tokens: false,
                    wrote_credentials: false,
                });
            }
            let claude = match claude {
                Some(dir) => dir,
                None => make_dir(&home, &claude_path)?,
            };
            let owner = claude.metadata().map_err(|source| PrepareError::Read {
                path: claude_path.clone(),
                source,
            })?;
            let mut fields = Map::new();
            fields.insert(OAUTH_KEY.into(), placeholder_section(&store));
            write_at(
                &claude,
                &credentials_path,
                &Value::Object(fields),
                (owner.uid(), owner.gid(), 0o600),
            )?;
            return Ok(Prepared {
                moved_tokens: false,
                wrote_credentials: true,
            });
        }
    };
    let Some(Value::Object(section)) = json.get_mut(OAUTH_KEY) else {
        // Signed out (or another client's file): nothing of ours to move or to add.
        return Ok(Prepared {
            moved_tokens: false,
            wrote_credentials: false,
        });
    };
    if !take_tokens(section, &mut store) {
        return Ok(Prepared {
            moved_tokens: false,
            wrote_credentials: false,
        });
    }
    // The store first: should the credentials write fail, the tokens are in both places, never lost.
    store.write(store_dir)?;
    write_at(
        &claude,
        &credentials_path,
        &json,
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
    )?;
    Ok(Prepared {
        moved_tokens: true,
        wrote_credentials: true,
    })
}

/// Moves real tokens from Claude Code's `claudeAiOauth` section into `store`, leaving the placeholders
/// in the section; whether there was anything to move. A value equal to a placeholder, empty, or not a
/// string is not a token.
/// The shortest value taken for a token (real ones are over 100 characters).
const MIN_TOKEN_LEN: usize = 20;
/// The longest value taken for a token.
const MAX_TOKEN_LEN: usize = 4096;

fn take_tokens(section: &mut Map<String, Value>, store: &mut OAuthStore) -> bool {
    // Anything but our placeholders is replaced on the volume; only a value shaped like a token is
    // kept in the store. A planted one-character "token" would otherwise join every router's response
    // scan and cut every response holding that character (found in review).
    let other = |key: &str| match section.get(key) {
        Some(Value::String(t))
            if !t.is_empty()
                && *t != store.access_placeholder
                && *t != store.refresh_placeholder =>
        {
            Some(t.clone())
        }
        _ => None,
    };
    let plausible = |t: &String| {
        (MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&t.len())
            && t.bytes().all(|b| b.is_ascii_graphic())
    };
    let (access, refresh) = (other("accessToken"), other("refreshToken"));
    if access.is_none() && refresh.is_none() {
        return false;
    }
    if let Some(access) = access.filter(plausible) {
        store.access_token = Some(access);
        store.expires_at = section.get("expiresAt").and_then(Value::as_u64);
    }
    if let Some(refresh) = refresh.filter(plausible) {
        store.refresh_token = Some(refresh);
    }
    if let Some(Value::Array(scopes)) = section.get("scopes") {
        store.scopes = scopes
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect();
    }
    if let Some(sub) = section.get("subscriptionType") {
        store.subscription_type = sub.as_str().map(str::to_owned);
    }
    section.insert(
        "accessToken".into(),
        Value::String(store.access_placeholder.clone()),
    );
    section.insert(
        "refreshToken".into(),
        Value::String(store.refresh_placeholder.clone()),
    );
    true
}

/// The `claudeAiOauth` section Claude Code would write, with the placeholders for tokens.
fn placeholder_section(store: &OAuthStore) -> Value {
    serde_json::json!({
        "accessToken": store.access_placeholder,
        "refreshToken": store.refresh_placeholder,
        "expiresAt": store.expires_at,
        "scopes": store.scopes,
        "subscriptionType": store.subscription_type,
    })
}

/// `path` as a C string.
fn c_path(path: &Path, shown: &Path) -> Result<CString, PrepareError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| PrepareError::Invalid {
        path: shown.to_owned(),
        problem: "the path contains a NUL byte".into(),
    })
}

/// Opens directory `name` (relative to `parent`, or absolute when `parent` is `None`) without
/// following a symlink in its last component; `None` when it does not exist.
fn open_dir(
    parent: Option<&File>,
    name: &Path,
    shown: &Path,
) -> Result<Option<File>, PrepareError> {
    let c = c_path(name, shown)?;
    // The mount point itself comes from podman and may sit under a symlinked directory; only the
    // components the sandbox can write are opened with O_NOFOLLOW.
    let (dirfd, nofollow) = match parent {
        Some(p) => (p.as_raw_fd(), libc::O_NOFOLLOW),
        None => (libc::AT_FDCWD, 0),
    };
    // SAFETY: `c` is a NUL-terminated path that outlives the call; the returned descriptor is owned
    // by the File made from it below.
    let fd = unsafe {
        libc::openat(
            dirfd,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP | libc::ENOTDIR) => Err(PrepareError::Invalid {
                path: shown.to_owned(),
                problem:
                    "is a symlink or not a directory; the launcher does not follow links on the \
                          home volume"
                        .into(),
            }),
            _ => Err(PrepareError::Read {
                path: shown.to_owned(),
                source: e,
            }),
        };
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(Some(unsafe { File::from_raw_fd(fd) }))
}

/// Creates `.claude` in the home volume (0700, owned like the volume's top directory) and opens it.
fn make_dir(home: &File, shown: &Path) -> Result<File, PrepareError> {
    let c = c_path(Path::new(CREDENTIALS_DIR), shown)?;
    let write_err = |source| PrepareError::Write {
        path: shown.to_owned(),
        source,
    };
    // SAFETY: `c` outlives the call; mkdirat touches no memory of ours beyond the path.
    if unsafe { libc::mkdirat(home.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(write_err(e));
        }
    }
    let dir = open_dir(Some(home), Path::new(CREDENTIALS_DIR), shown)?
        .ok_or_else(|| write_err(io::ErrorKind::NotFound.into()))?;
    let owner = home.metadata().map_err(write_err)?;
    fchown(&dir, owner.uid(), owner.gid()).map_err(write_err)?;
    Ok(dir)
}

/// Reads the credentials file in `dir`: `None` when there is none; refused when it is a symlink, not a
/// regular file, too large or not a JSON object.
fn read_credentials(
    dir: &File,
    path: &Path,
) -> Result<Option<(Value, std::fs::Metadata)>, PrepareError> {
    let c = c_path(Path::new(CREDENTIALS_FILE), path)?;
    let invalid = |problem: &str| PrepareError::Invalid {
        path: path.to_owned(),
        problem: problem.to_owned(),
    };
    // SAFETY: `c` outlives the call; the descriptor is owned by the File made from it below.
    // O_NONBLOCK: a FIFO planted by the sandbox must not hang the launcher.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP) => Err(invalid(
                "is a symlink; the launcher does not follow links on the home volume",
            )),
            _ => Err(PrepareError::Read {
                path: path.to_owned(),
                source: e,
            }),
        };
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    let read_err = |source| PrepareError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(invalid("is not a regular file"));
    }
    let mut text = Vec::new();
    file.take(MAX_CREDENTIALS_LEN + 1)
        .read_to_end(&mut text)
        .map_err(read_err)?;
    if text.len() as u64 > MAX_CREDENTIALS_LEN {
        return Err(invalid(&format!(
            "is larger than {MAX_CREDENTIALS_LEN} bytes"
        )));
    }
    match serde_json::from_slice::<Value>(&text) {
        Ok(v @ Value::Object(_)) => Ok(Some((v, meta))),
        Ok(_) => Err(invalid("is not a JSON object")),
        // Only the position: the message could quote a token.
        Err(e) => Err(invalid(&format!(
            "line {}, column {}: not valid JSON",
            e.line(),
            e.column()
        ))),
    }
}

/// fchown(2) on an open file.
fn fchown(file: &File, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: fchown on a descriptor owned by `file`; no memory is involved.
    if unsafe { libc::fchown(file.as_raw_fd(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Replaces `path` (in the open directory `dir`) with `json` by rename: a temporary file created
/// exclusively in `dir`, given `owner` (uid, gid, mode), synced, renamed over the old file, then the
/// directory synced.
fn write_at(
    dir: &File,
    path: &Path,
    json: &Value,
    (uid, gid, mode): (u32, u32, u32),
) -> Result<(), PrepareError> {
    let write_err = |source| PrepareError::Write {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_vec_pretty(json).map_err(|e| write_err(io::Error::other(e)))?;
    let suffix = oauth_store::placeholder("")?;
    let tmp = CString::new(format!(
        "{CREDENTIALS_FILE}.agent-sandbox-{}",
        &suffix[..12]
    ))
    .expect("no NUL in a base64url name");
    let target = CString::new(CREDENTIALS_FILE).expect("no NUL in a constant");
    // SAFETY: `tmp` outlives the call; the descriptor is owned by the File made from it below.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(write_err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let result = (|| {
        file.write_all(&text)?;
        fchown(&file, uid, gid)?;
        // SAFETY: fchmod on a descriptor owned by `file`; no memory is involved.
        if unsafe { libc::fchmod(file.as_raw_fd(), mode) } != 0 {
            return Err(io::Error::last_os_error());
        }
        file.sync_all()?;
        // SAFETY: both names outlive the call and are relative to `dir`, which is open.
        if unsafe {
            libc::renameat(
                dir.as_raw_fd(),
                tmp.as_ptr(),
                dir.as_raw_fd(),
                target.as_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        dir.sync_all()
    })();
    if let Err(e) = result {
        // SAFETY: `tmp` outlives the call; removing our own temporary (already renamed: ENOENT, ignored).
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        return Err(write_err(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt as _};

    use super::*;

    /// A state directory and a home volume under the system temp dir, removed on drop.
    struct Dirs {
        root: PathBuf,
        store: PathBuf,
        home: PathBuf,
    }
    impl Dirs {
        fn new(tag: &str) -> Dirs {
            let root = std::env::temp_dir().join(format!(
                "oauth-prepare-{tag}-{}",
                &oauth_store::placeholder("").unwrap()[..12]
            ));
            let home = root.join("volume/_data");
            fs::create_dir_all(&home).unwrap();
            Dirs {
                store: root.join("state/agent-sandbox/oauth"),
                home,
                root,
            }
        }
        fn credentials(&self) -> PathBuf {
            self.home.join(CREDENTIALS_DIR).join(CREDENTIALS_FILE)
        }
        fn write_credentials(&self, v: &Value, mode: u32) {
            fs::create_dir_all(self.home.join(CREDENTIALS_DIR)).unwrap();
            fs::write(self.credentials(), serde_json::to_vec(v).unwrap()).unwrap();
            fs::set_permissions(self.credentials(), fs::Permissions::from_mode(mode)).unwrap();
        }
        fn read_credentials(&self) -> Value {
            serde_json::from_slice(&fs::read(self.credentials()).unwrap()).unwrap()
        }
        fn store(&self) -> OAuthStore {
            OAuthStore::read(&self.store).unwrap().0
        }
    }
    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn signed_in() -> Value {
        serde_json::json!({
            "claudeAiOauth": {
                "accessToken": "sk-ant-oat01-REAL-ACCESS",
                "refreshToken": "sk-ant-ort01-REAL-REFRESH",
                "expiresAt": 1_900_000_000_000u64,
                "scopes": ["user:inference", "user:profile"],
                "subscriptionType": "max",
                "futureField": {"kept": true},
            },
            "mcpOAuth": {"server": {"accessToken": "mcp-token"}},
        })
    }

    #[test]
    fn a_first_session_gets_a_store_and_no_credentials() {
        let d = Dirs::new("fresh");
        let p = prepare(&d.store, &d.home).unwrap();
        assert_eq!(
            p,
            Prepared {
                moved_tokens: false,
                wrote_credentials: false
            }
        );
        let s = d.store();
        assert!(!s.has_tokens());
        assert!(s.access_placeholder.starts_with(oauth_store::ACCESS_PREFIX));
        assert_eq!(fs::metadata(&d.store).unwrap().mode() & 0o777, 0o700);
        assert!(!d.home.join(CREDENTIALS_DIR).exists());
    }

    #[test]
    fn real_tokens_are_moved_once_keeping_every_other_field_owner_and_mode() {
        let d = Dirs::new("move");
        d.write_credentials(&signed_in(), 0o640);
        let before = fs::metadata(d.credentials()).unwrap();
        let p = prepare(&d.store, &d.home).unwrap();
        assert!(p.moved_tokens && p.wrote_credentials, "{p:?}");
        let s = d.store();
        assert_eq!(s.access_token.as_deref(), Some("sk-ant-oat01-REAL-ACCESS"));
        assert_eq!(
            s.refresh_token.as_deref(),
            Some("sk-ant-ort01-REAL-REFRESH")
        );
        assert_eq!(s.expires_at, Some(1_900_000_000_000));
        assert_eq!(s.scopes, ["user:inference", "user:profile"]);
        assert_eq!(s.subscription_type.as_deref(), Some("max"));
        let mut want = signed_in();
        want["claudeAiOauth"]["accessToken"] = s.access_placeholder.clone().into();
        want["claudeAiOauth"]["refreshToken"] = s.refresh_placeholder.clone().into();
        assert_eq!(d.read_credentials(), want);
        let after = fs::metadata(d.credentials()).unwrap();
        assert_eq!(after.mode() & 0o777, 0o640);
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert_ne!(after.ino(), before.ino(), "replaced by rename");
        let leftovers: Vec<_> = fs::read_dir(d.home.join(CREDENTIALS_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [CREDENTIALS_FILE]);
        // Once: the next session finds placeholders and changes nothing.
        let again = prepare(&d.store, &d.home).unwrap();
        assert!(!again.moved_tokens && !again.wrote_credentials, "{again:?}");
        assert_eq!(d.store(), s);
        assert_eq!(d.read_credentials(), want);
    }

    #[test]
    fn a_value_not_shaped_like_a_token_is_replaced_but_not_stored() {
        let d = Dirs::new("planted");
        let mut planted = signed_in();
        planted["claudeAiOauth"]["accessToken"] = "a".into();
        planted["claudeAiOauth"]["refreshToken"] = "sk-ant-ort01-with\r\nnewline-inside".into();
        d.write_credentials(&planted, 0o600);
        prepare(&d.store, &d.home).unwrap();
        let s = d.store();
        assert!(!s.has_tokens(), "a planted value reached the store");
        let on_volume = d.read_credentials();
        assert_eq!(
            on_volume["claudeAiOauth"]["accessToken"],
            s.access_placeholder.as_str()
        );
        assert_eq!(
            on_volume["claudeAiOauth"]["refreshToken"],
            s.refresh_placeholder.as_str()
        );
    }

    #[test]
    fn the_owner_is_kept_when_the_launcher_runs_as_root() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: the owner of the rewritten file is the launcher's own, checked elsewhere");
            return;
        }
        let d = Dirs::new("owner");
        d.write_credentials(&signed_in(), 0o600);
        std::os::unix::fs::chown(d.credentials(), Some(4321), Some(4322)).unwrap();
        prepare(&d.store, &d.home).unwrap();
        let after = fs::metadata(d.credentials()).unwrap();
        assert_eq!((after.uid(), after.gid()), (4321, 4322));
    }

    #[test]
    fn placeholders_are_written_when_the_store_has_tokens_and_the_volume_none() {
        let d = Dirs::new("restore");
        d.write_credentials(&signed_in(), 0o600);
        prepare(&d.store, &d.home).unwrap();
        // A new home volume: no .claude at all.
        fs::remove_dir_all(d.home.join(CREDENTIALS_DIR)).unwrap();
        let p = prepare(&d.store, &d.home).unwrap();
        assert!(!p.moved_tokens && p.wrote_credentials, "{p:?}");
        let s = d.store();
        assert_eq!(
            d.read_credentials(),
            serde_json::json!({"claudeAiOauth": {
                "accessToken": s.access_placeholder,
                "refreshToken": s.refresh_placeholder,
                "expiresAt": 1_900_000_000_000u64,
                "scopes": ["user:inference", "user:profile"],
                "subscriptionType": "max",
            }})
        );
        assert_eq!(fs::metadata(d.credentials()).unwrap().mode() & 0o777, 0o600);
        assert_eq!(
            fs::metadata(d.home.join(CREDENTIALS_DIR)).unwrap().mode() & 0o777,
            0o700
        );
        // A signed-out file (no claudeAiOauth) is left alone.
        let signed_out = serde_json::json!({"mcpOAuth": {}});
        d.write_credentials(&signed_out, 0o600);
        let p = prepare(&d.store, &d.home).unwrap();
        assert!(!p.moved_tokens && !p.wrote_credentials, "{p:?}");
        assert_eq!(d.read_credentials(), signed_out);
    }

    #[test]
    fn links_fifos_and_garbage_on_the_volume_are_refused_without_following_or_quoting() {
        let d = Dirs::new("hostile");
        let outside = d.root.join("outside.json");
        fs::write(&outside, serde_json::to_vec(&signed_in()).unwrap()).unwrap();
        fs::create_dir_all(d.home.join(CREDENTIALS_DIR)).unwrap();
        symlink(&outside, d.credentials()).unwrap();
        let e = prepare(&d.store, &d.home).unwrap_err().to_string();
        assert!(
            e.contains(".credentials.json") && e.contains("symlink"),
            "{e}"
        );
        assert_eq!(
            fs::read(&outside).unwrap(),
            serde_json::to_vec(&signed_in()).unwrap(),
            "the link's target is untouched"
        );
        assert!(!d.store().has_tokens(), "nothing moved through a link");

        fs::remove_file(d.credentials()).unwrap();
        let c = CString::new(d.credentials().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = prepare(&d.store, &d.home).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");

        fs::remove_file(d.credentials()).unwrap();
        fs::write(
            d.credentials(),
            br#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-SECRET"#,
        )
        .unwrap();
        let e = prepare(&d.store, &d.home).unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("SECRET"), "{e}");

        fs::remove_dir_all(d.home.join(CREDENTIALS_DIR)).unwrap();
        symlink(&d.root, d.home.join(CREDENTIALS_DIR)).unwrap();
        let e = prepare(&d.store, &d.home).unwrap_err().to_string();
        assert!(e.contains(".claude") && e.contains("symlink"), "{e}");
    }

    #[test]
    fn prepare_waits_for_a_token_exchange_holding_the_lock() {
        let d = Dirs::new("locked");
        drop(oauth_store::init(&d.store).unwrap());
        d.write_credentials(&signed_in(), 0o600);
        let held = oauth_store::StoreLock::acquire(&d.store).unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn({
            let (store, home) = (d.store.clone(), d.home.clone());
            move || {
                let r = prepare(&store, &home);
                let _ = done_tx.send(());
                r
            }
        });
        // Waiting for something that must not happen: a bounded wait is the only way to see it.
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "prepare did not wait for the lock"
        );
        assert!(!d.store().has_tokens());
        drop(held);
        assert!(worker.join().unwrap().unwrap().moved_tokens);
        assert!(d.store().has_tokens());
    }

    #[test]
    fn only_a_real_refresh_token_is_moved_alone() {
        let d = Dirs::new("refresh-only");
        let (lock, store) = oauth_store::init(&d.store).unwrap();
        drop(lock);
        let mut creds = signed_in();
        creds["claudeAiOauth"]["accessToken"] = store.access_placeholder.clone().into();
        d.write_credentials(&creds, 0o600);
        assert!(prepare(&d.store, &d.home).unwrap().moved_tokens);
        let s = d.store();
        assert_eq!(s.access_token, None);
        assert_eq!(
            s.refresh_token.as_deref(),
            Some("sk-ant-ort01-REAL-REFRESH")
        );
        assert_eq!(
            d.read_credentials()["claudeAiOauth"]["refreshToken"],
            s.refresh_placeholder
        );
    }

    #[test]
    fn the_default_store_dir_is_under_the_state_home() {
        // Read-only check of the rule on this process's environment.
        let got = default_store_dir();
        let want = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .map(|s| s.join("agent-sandbox/oauth"));
        assert_eq!(got, want);
    }
}
