//! The session directory: the router's configuration, the sandbox's hosts file and resolv.conf, in a
//! private directory of this user's (in `$XDG_RUNTIME_DIR`), named after the session id.

use std::ffi::OsString;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::NAME_PREFIX;

/// A random session id: 12 hex digits from the kernel's generator.
pub(super) fn new_session_id() -> anyhow::Result<String> {
    let mut bytes = [0u8; 6];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("cannot read /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The directory for the session's router configuration, hosts and resolv.conf, in [`sessions_root`].
pub(crate) fn session_dir(session: &str) -> PathBuf {
    sessions_root().join(format!("{NAME_PREFIX}{session}"))
}

/// The session directory an object's `agent-sandbox.session-dir` label names, if it is one this
/// user's launcher made for session `id`: an absolute path named `agent-sandbox-ID`, a directory of
/// this user's (not a symlink) that no one else may enter. `None` otherwise: the caller then uses the
/// place its own environment gives ([`session_dir`]).
pub(crate) fn labelled_session_dir(label: Option<&String>, id: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(label?);
    let ours = dir.is_absolute()
        && dir.file_name() == Some(std::ffi::OsStr::new(&format!("{NAME_PREFIX}{id}")))
        && fs::symlink_metadata(&dir).is_ok_and(|m| {
            // SAFETY: getuid cannot fail and touches no memory.
            m.is_dir() && m.uid() == unsafe { libc::getuid() } && m.mode() & 0o077 == 0
        });
    ours.then_some(dir)
}

/// The live lock's file ([`crate::live::lock`]): `live.lock` in the state directory, which is made if
/// missing and must be this user's and writable by no one else. Not in the runtime directory, which
/// depends on `XDG_RUNTIME_DIR`: an ssh login, `su` or cron may lack it, and commands that disagree on
/// the lock's place would not take turns.
pub(crate) fn live_lock_path(state_dir: &Path) -> anyhow::Result<PathBuf> {
    ensure_state_dir(state_dir)?;
    Ok(state_dir.join("live.lock"))
}

/// Makes the state directory (0700) if missing; it may be a symlink (to another disk of the user's,
/// say), but what it leads to must be this user's and writable by no one else (made so if it is the
/// user's), or whoever else can write there could swap what is in it for a symlink after the check.
fn ensure_state_dir(state: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state)
        .with_context(|| format!("cannot create {}", state.display()))?;
    let meta = fs::metadata(state).with_context(|| format!("cannot stat {}", state.display()))?;
    own_dir(
        state,
        &meta,
        0o022,
        "agent-sandbox keeps its state there (set XDG_STATE_HOME, or give it to your user)",
    )
}

/// The directory for the session's router and forwarder logs: `logs/agent-sandbox-ID` in the state
/// directory (`$XDG_STATE_HOME/agent-sandbox`), on disk. Not in the session directory: that is normally
/// in the runtime directory, a tmpfs the size of a tenth of RAM that rootless podman needs too, and a
/// sandbox can fill the router's log up to its cap (32 MB) with refused connections.
pub(crate) fn log_dir(state_dir: &Path, session: &str) -> PathBuf {
    state_dir
        .join("logs")
        .join(format!("{NAME_PREFIX}{session}"))
}

/// Creates [`log_dir`] mode 0700 in a `logs` directory that must be this user's, 0700 and no symlink.
/// The state directory above is made (0700) if missing; it may be a symlink (to another disk of the
/// user's, say), but what it leads to must be this user's and writable by no one else (made so if it
/// is the user's), or whoever else can write there could swap `logs` for a symlink after the check.
pub(super) fn create_log_dir(dir: &Path) -> anyhow::Result<()> {
    let logs = dir.parent().context("a log directory has a parent")?;
    let state = logs
        .parent()
        .context("a log directory is in a state directory")?;
    ensure_state_dir(state)?;
    // Checks `logs` (its parent) as private, then makes the session's own.
    create_session_dir(dir)
}

/// `dir` (with `meta`) must be a directory of this user's, else the error says so and then `what`;
/// any of the `loose` mode bits set are cleared (mode 0700).
fn own_dir(dir: &Path, meta: &fs::Metadata, loose: u32, what: &str) -> anyhow::Result<()> {
    // SAFETY: getuid cannot fail and touches no memory.
    if !meta.is_dir() || meta.uid() != unsafe { libc::getuid() } {
        bail!("{} is not a directory of yours: {what}", dir.display());
    }
    if meta.mode() & loose != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot set permissions on {}", dir.display()))?;
    }
    Ok(())
}

/// Where session directories live: `$XDG_RUNTIME_DIR/agent-sandbox` when the runtime directory is
/// usable (absolute, a directory, this user's), else `agent-sandbox-UID` in the system temp directory.
/// Either is created mode 0700 and must be this user's, so no other host user can read a session's
/// files or plant their own.
fn sessions_root() -> PathBuf {
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    sessions_root_for(
        uid,
        std::env::var_os("XDG_RUNTIME_DIR"),
        crate::workdir::system_temp_dir(),
    )
}

fn sessions_root_for(uid: u32, runtime: Option<OsString>, temp: PathBuf) -> PathBuf {
    let usable = |dir: &Path| {
        dir.is_absolute()
            && fs::metadata(dir)
                .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0)
    };
    match runtime.map(PathBuf::from) {
        Some(dir) if usable(&dir) => dir.join("agent-sandbox"),
        _ => temp.join(format!("agent-sandbox-{uid}")),
    }
}

/// Creates `dir` mode 0700 unless it exists, then makes sure it is a real directory (not a symlink)
/// owned by this user with no access for anyone else.
fn ensure_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    let meta =
        fs::symlink_metadata(dir).with_context(|| format!("cannot stat {}", dir.display()))?;
    own_dir(
        dir,
        &meta,
        0o077,
        "remove it (or, for the session directories, set XDG_RUNTIME_DIR to your runtime directory)",
    )
}

/// Creates the session's directory (mode 0700, in a 0700 [`sessions_root`]).
pub(super) fn create_session_dir(dir: &Path) -> anyhow::Result<()> {
    if let Some(root) = dir.parent() {
        ensure_private_dir(root)?;
    }
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot set permissions on {}", dir.display()))
}

/// Writes a session file mode 0644: readable by the router's non-root user and by a rootful sandbox's
/// user once bind-mounted (a bind mount needs no access to the host's parent directories, which stay
/// 0700, so no other host user can reach the file).
pub(super) fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .with_context(|| format!("cannot set permissions on {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_directories_are_private_and_in_the_runtime_directory() {
        // SAFETY: getuid cannot fail and touches no memory.
        let uid = unsafe { libc::getuid() };
        let tmp = std::env::temp_dir().join(format!("as-session-dir-test-{}", std::process::id()));
        let runtime = tmp.join("run");
        fs::create_dir_all(&runtime).unwrap();
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
        let temp = tmp.join("tmp");
        // A usable runtime directory is used; a missing, relative or foreign one falls back to temp.
        assert_eq!(
            sessions_root_for(uid, Some(runtime.clone().into()), temp.clone()),
            runtime.join("agent-sandbox")
        );
        for bad in [
            Some(OsString::from("relative/run")),
            Some(tmp.join("missing").into()),
            None,
        ] {
            assert_eq!(
                sessions_root_for(uid, bad, temp.clone()),
                temp.join(format!("agent-sandbox-{uid}"))
            );
        }
        assert_eq!(
            sessions_root_for(uid + 1, Some(runtime.clone().into()), temp.clone()),
            temp.join(format!("agent-sandbox-{}", uid + 1))
        );
        // A world-writable runtime directory is not trusted either.
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            sessions_root_for(uid, Some(runtime.clone().into()), temp.clone()),
            temp.join(format!("agent-sandbox-{uid}"))
        );
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();

        let root = runtime.join("agent-sandbox");
        // An existing root with loose permissions is tightened.
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.join("agent-sandbox-0123456789ab");
        create_session_dir(&dir).unwrap();
        write_file(&dir.join("router.toml"), "x").unwrap();
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("router.toml")), 0o644);
        // A file is never written through an existing name (a planted symlink).
        assert!(write_file(&dir.join("router.toml"), "y").is_err());
        // The router's label leads to this directory only if it is exactly the session's, ours and
        // private: not another session's, a relative path, a symlink or an open directory.
        let label = |p: &Path| Some(p.display().to_string());
        let id = "0123456789ab";
        assert_eq!(
            labelled_session_dir(label(&dir).as_ref(), id),
            Some(dir.clone())
        );
        assert_eq!(labelled_session_dir(None, id), None);
        assert_eq!(
            labelled_session_dir(label(&dir).as_ref(), "0123456789ac"),
            None
        );
        let relative = Some("agent-sandbox-0123456789ab".to_owned());
        assert_eq!(labelled_session_dir(relative.as_ref(), id), None);
        let link = tmp.join("link").join("agent-sandbox-0123456789ab");
        fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(labelled_session_dir(label(&link).as_ref(), id), None);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(labelled_session_dir(label(&dir).as_ref(), id), None);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        // A symlink in place of the root is refused.
        let linked = tmp.join("linked-root");
        std::os::unix::fs::symlink(&runtime, &linked).unwrap();
        assert!(ensure_private_dir(&linked).is_err());
        fs::remove_dir_all(&tmp).unwrap();
    }

    /// The log directory is on the state directory's disk, private (a new state directory too), and
    /// made even where `$XDG_STATE_HOME`'s parents do not exist yet; a symlink planted as `logs` is
    /// refused.
    #[test]
    fn log_directories_are_private_and_in_the_state_directory() {
        let tmp = std::env::temp_dir().join(format!("as-log-dir-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let state = tmp.join("home/.local/state/agent-sandbox");
        let dir = log_dir(&state, "0123456789ab");
        assert_eq!(dir, state.join("logs/agent-sandbox-0123456789ab"));
        create_log_dir(&dir).unwrap();
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        for p in [&state, &state.join("logs"), &dir] {
            assert_eq!(mode(p), 0o700, "{}", p.display());
        }
        // A second session beside it.
        create_log_dir(&log_dir(&state, "ba9876543210")).unwrap();

        let other = tmp.join("other-state");
        fs::create_dir_all(other.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(other.join("elsewhere"), other.join("logs")).unwrap();
        assert!(create_log_dir(&log_dir(&other, "0123456789ab")).is_err());
        assert!(!other.join("elsewhere/agent-sandbox-0123456789ab").exists());
        // A state directory that is a symlink (to another disk of the user's) is taken as it is.
        fs::create_dir_all(tmp.join("disk/state")).unwrap();
        std::os::unix::fs::symlink(tmp.join("disk/state"), tmp.join("linked-state")).unwrap();
        fs::set_permissions(tmp.join("disk/state"), fs::Permissions::from_mode(0o777)).unwrap();
        create_log_dir(&log_dir(&tmp.join("linked-state"), "0123456789ab")).unwrap();
        // ... made writable by no one else.
        assert_eq!(mode(&tmp.join("disk/state")), 0o700);
        // A state directory of another user's is refused (checked where this test may chown).
        // SAFETY: geteuid cannot fail and touches no memory.
        if unsafe { libc::geteuid() } == 0 {
            let foreign = tmp.join("foreign-state");
            fs::create_dir(&foreign).unwrap();
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
            let err = create_log_dir(&log_dir(&foreign, "0123456789ab")).unwrap_err();
            assert!(
                format!("{err:#}").contains("not a directory of yours"),
                "{err:#}"
            );
            assert!(!foreign.join("logs").exists());
        }
        assert!(tmp
            .join("disk/state/logs/agent-sandbox-0123456789ab")
            .is_dir());
        fs::remove_dir_all(&tmp).unwrap();
    }

    /// A directory of another user's is never taken for the launcher's own: not as a session directory
    /// an object's label names, not as a private directory to write in.
    #[test]
    fn a_directory_of_someone_elses_is_refused() {
        // SAFETY: getuid cannot fail and touches no memory.
        if unsafe { libc::getuid() } != 0 {
            // Not root: "/" is someone else's (root's); with no loose bits, nothing is changed.
            assert!(own_dir(Path::new("/"), &fs::metadata("/").unwrap(), 0, "x").is_err());
            return;
        }
        let tmp = std::env::temp_dir().join(format!("as-foreign-dir-test-{}", std::process::id()));
        let dir = tmp.join(format!("{NAME_PREFIX}0123456789ab"));
        create_session_dir(&dir).unwrap();
        let label = Some(dir.display().to_string());
        // Ours: taken.
        assert_eq!(
            labelled_session_dir(label.as_ref(), "0123456789ab"),
            Some(dir.clone())
        );
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let labelled = labelled_session_dir(label.as_ref(), "0123456789ab");
        let private = ensure_private_dir(&dir).map_err(|e| format!("{e:#}"));
        fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(labelled, None);
        assert!(
            private
                .as_ref()
                .is_err_and(|e| e.contains("is not a directory of yours")),
            "{private:?}"
        );
    }

    #[test]
    fn session_ids_are_random_hex() {
        let a = new_session_id().unwrap();
        assert_eq!(a.len(), 12);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_session_id().unwrap());
    }
}
