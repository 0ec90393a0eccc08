//! A session directory's live-policy files: what `allow`, `deny` and `reload` read and replace.
//!
//! ```text
//! $XDG_RUNTIME_DIR/agent-sandbox/agent-sandbox-ID/   0700, this user's only
//!   session.json          who the session is: id, project, start, allowlist file, router address
//!   plan-state.json       every loopback address and router port handed out (never renumbered)
//!   session-allowlist     entries allowed for this session only (`allow --session`)
//!   router-in-force.toml  the router configuration last confirmed in force by a live change (a copy)
//!   router-log-path       where the router's log is (written at start), and forwarder-log-path
//!   router/router.toml    the router's configuration   (mounted as a directory into the router only)
//!   forwarder/relays      the forwarder's relays        (mounted as a directory into the forwarder only)
//!   hosts, resolv.conf    the sandbox's (unchanged during a session)
//!
//! $XDG_STATE_HOME/agent-sandbox/logs/agent-sandbox-ID/   0700, on disk (`session::rundir::log_dir`)
//!   router.log, forwarder.log   their logs (k8s-file, written by conmon, capped at 32 MB and 1 MB)
//! ```
//!
//! Every file is replaced whole by a rename, never written in place: the router and the forwarder
//! re-read theirs on SIGHUP and must never see half a file. That is also why their files live in
//! subdirectories mounted as directories: a single-file bind mount keeps pointing at the replaced inode.
//! The sandbox container mounts none of this: it cannot read or change the policy, nor signal anyone.

use std::fs;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use agent_sandbox_shared::plan::PlanState;
use agent_sandbox_shared::SessionPlan;

/// The router's subdirectory of a session directory.
pub(crate) const ROUTER_DIR: &str = "router";
/// The router's configuration in [`ROUTER_DIR`].
pub(crate) const ROUTER_FILE: &str = "router.toml";
/// The forwarder's subdirectory of a session directory.
pub(crate) const FORWARDER_DIR: &str = "forwarder";
/// The forwarder's relays in [`FORWARDER_DIR`].
pub(crate) const RELAYS_FILE: &str = "relays";
/// [`SessionMeta`] as JSON.
const META_FILE: &str = "session.json";
/// [`PlanState`] as JSON.
const STATE_FILE: &str = "plan-state.json";
/// Entries allowed for this session only, one per line.
const EXTRA_FILE: &str = "session-allowlist";
/// The router configuration the router last confirmed it holds ([`record_in_force`]).
const IN_FORCE_FILE: &str = "router-in-force.toml";
/// The router's log (k8s-file, written by conmon) in the session's log directory, where the launcher
/// has podman put it.
pub(crate) const ROUTER_LOG: &str = "router.log";
/// The forwarder's log, as [`ROUTER_LOG`].
pub(crate) const FORWARDER_LOG: &str = "forwarder.log";
/// Where the router's log is ([`write_log_path`]): where a live change reads its verdict. Sessions
/// of launchers that left the log where podman puts it by default have it only once a live change
/// asked podman.
pub(crate) const ROUTER_LOG_PATH_FILE: &str = "router-log-path";
/// The forwarder's k8s-file log on the host, as [`ROUTER_LOG_PATH_FILE`].
pub(crate) const FORWARDER_LOG_PATH_FILE: &str = "forwarder-log-path";
/// The largest session file read: they are small, a bigger one is not ours.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Who a running session is, written at its start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionMeta {
    /// The session id (12 hex digits).
    pub id: String,
    /// The project directory.
    pub project: PathBuf,
    /// Start time, seconds since the Unix epoch.
    pub started: u64,
    /// The allowlist file the session was started with.
    pub allowlist: PathBuf,
    /// The router's address on the session network (the plan's fixed point).
    pub router_ip: Ipv4Addr,
}

/// Creates the router's and the forwarder's subdirectories, mode 0755: their containers' non-root
/// users must enter them; the session directory around them stays 0700, and a bind mount does not
/// need the host's parent directories to be open.
pub(crate) fn create_layout(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    for sub in [ROUTER_DIR, FORWARDER_DIR] {
        let d = dir.join(sub);
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&d)
            .with_context(|| format!("cannot create {}", d.display()))?;
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot set permissions on {}", d.display()))?;
    }
    Ok(())
}

/// Records a container's log path in `file` (one of [`ROUTER_LOG_PATH_FILE`] and
/// [`FORWARDER_LOG_PATH_FILE`]). At start, so that a live change needs no podman process to find it
/// (`container inspect` per container, serialised by podman's lock, took most of the first change's
/// time). A path that is not UTF-8 is not recorded: a live change then asks podman.
pub(crate) fn write_log_path(file: &Path, log: &Path) -> anyhow::Result<()> {
    let text = log
        .to_str()
        .with_context(|| format!("{} is not UTF-8", log.display()))?;
    replace_file(file, text, 0o600, Durability::Session)
}

/// The log path [`write_log_path`] recorded, if there is one.
pub(crate) fn read_log_path(file: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string(file).ok()?;
    let path = PathBuf::from(text);
    path.is_absolute().then_some(path)
}

/// Whether a replaced file must reach the disk before the rename: the user's allowlist must survive a
/// crash; a session's files live no longer than the session (and in a tmpfs, normally), and syncing
/// them would only slow a live change down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsync before the rename.
    Synced,
    /// Atomic, not synced.
    Session,
}

/// Replaces `path` with `text` atomically: a new file in the same directory (mode `mode`, created
/// exclusively, so a planted name is never written through), synced if `durability` says so, then
/// renamed over `path`.
pub(crate) fn replace_file(
    path: &Path,
    text: &str,
    mode: u32,
    durability: Durability,
) -> anyhow::Result<()> {
    let dir = path.parent().context("a file path has a directory")?;
    let name = path
        .file_name()
        .context("a file path has a name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        file.write_all(text.as_bytes())
            .and_then(|()| match durability {
                Durability::Synced => file.sync_all(),
                Durability::Session => Ok(()),
            })
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        // The umask may have narrowed the mode given to open.
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set permissions on {}", tmp.display()))?;
        fs::rename(&tmp, path)
            .with_context(|| format!("cannot replace {} with {}", path.display(), tmp.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads a session file (capped at [`MAX_FILE_BYTES`]).
fn read_small(path: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let file = fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    anyhow::ensure!(
        text.len() as u64 <= MAX_FILE_BYTES,
        "{} is larger than {MAX_FILE_BYTES} bytes",
        path.display()
    );
    Ok(text)
}

/// Writes the plan's router configuration, relays and state into session directory `dir` (in that
/// order of importance: the state last, so a failure before it leaves the old state, which the old
/// files match or which the next change extends anyway).
pub(crate) fn write_plan(dir: &Path, plan: &SessionPlan) -> anyhow::Result<()> {
    replace_file(
        &dir.join(ROUTER_DIR).join(ROUTER_FILE),
        &plan.router.to_toml(),
        0o644,
        Durability::Session,
    )?;
    replace_file(
        &dir.join(FORWARDER_DIR).join(RELAYS_FILE),
        &plan.relays_file(),
        0o644,
        Durability::Session,
    )?;
    replace_file(
        &dir.join(STATE_FILE),
        &plan.state.to_json(),
        0o600,
        Durability::Session,
    )
}

/// Writes the session's [`SessionMeta`].
pub(crate) fn write_meta(dir: &Path, meta: &SessionMeta) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(meta).context("cannot serialise the session")?;
    replace_file(&dir.join(META_FILE), &json, 0o600, Durability::Session)
}

/// Reads the session's [`SessionMeta`].
pub(crate) fn read_meta(dir: &Path) -> anyhow::Result<SessionMeta> {
    let path = dir.join(META_FILE);
    serde_json::from_str(&read_small(&path)?)
        .with_context(|| format!("{} is not valid", path.display()))
}

/// Reads the addresses and ports handed out so far.
pub(crate) fn read_state(dir: &Path) -> anyhow::Result<PlanState> {
    let path = dir.join(STATE_FILE);
    PlanState::from_json(&read_small(&path)?)
        .with_context(|| format!("{} is not valid", path.display()))
}

/// The router configuration in force (as last written).
pub(crate) fn read_router_config(dir: &Path) -> anyhow::Result<agent_sandbox_shared::RouterConfig> {
    let path = dir.join(ROUTER_DIR).join(ROUTER_FILE);
    parse_router_config(&path, &read_small(&path)?)
}

/// A router configuration read from `path`, parsed.
fn parse_router_config(
    path: &Path,
    text: &str,
) -> anyhow::Result<agent_sandbox_shared::RouterConfig> {
    agent_sandbox_shared::RouterConfig::from_toml(text)
        .map_err(|e| anyhow::anyhow!("{} is not valid: {e}", path.display()))
}

/// Records the router configuration as last written as the one in force: before the first live change
/// (when it is the start's, which the router took at start) and after each change the router confirmed.
/// A change the router refused, or did not confirm, leaves the record as it was: `router.toml` then
/// holds a policy the router may not hold.
pub(crate) fn record_in_force(dir: &Path) -> anyhow::Result<()> {
    let text = read_small(&dir.join(ROUTER_DIR).join(ROUTER_FILE))?;
    replace_file(&dir.join(IN_FORCE_FILE), &text, 0o600, Durability::Session)
}

/// Whether [`record_in_force`] has a record for the session.
pub(crate) fn has_in_force(dir: &Path) -> bool {
    dir.join(IN_FORCE_FILE).exists()
}

/// The router configurations the router may hold now: the one last confirmed in force, and the one
/// last written when that differs (a change refused or not confirmed, which the router may or may not
/// have taken). Before any live change only the one written at start, which is in force.
pub(crate) fn read_possibly_in_force(
    dir: &Path,
) -> anyhow::Result<Vec<agent_sandbox_shared::RouterConfig>> {
    let written = dir.join(ROUTER_DIR).join(ROUTER_FILE);
    let written_text = read_small(&written)?;
    let mut configs = vec![parse_router_config(&written, &written_text)?];
    if has_in_force(dir) {
        let confirmed = dir.join(IN_FORCE_FILE);
        let confirmed_text = read_small(&confirmed)?;
        if confirmed_text != written_text {
            configs.push(parse_router_config(&confirmed, &confirmed_text)?);
        }
    }
    Ok(configs)
}

/// The session-only entries (`allow --session`), as allowlist text; empty when there are none.
pub(crate) fn read_extra(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join(EXTRA_FILE);
    match fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        _ => read_small(&path),
    }
}

/// Replaces the session-only entries.
pub(crate) fn write_extra(dir: &Path, text: &str) -> anyhow::Result<()> {
    replace_file(&dir.join(EXTRA_FILE), text, 0o600, Durability::Session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn files_are_replaced_whole_with_their_mode_and_read_back() {
        let dir = std::env::temp_dir().join(format!("as-live-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        create_layout(&dir).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dir.join(ROUTER_DIR)), 0o755);
        let policy = agent_sandbox_shared::Policy::new(
            &agent_sandbox_shared::Allowlist::parse("a.com\ndb.com:5432\n", "t").unwrap(),
        );
        let plan = SessionPlan::new(&policy, Ipv4Addr::new(10, 89, 0, 2)).unwrap();
        write_plan(&dir, &plan).unwrap();
        let router = dir.join(ROUTER_DIR).join(ROUTER_FILE);
        let inode = fs::metadata(&router).unwrap().ino();
        write_plan(&dir, &plan).unwrap();
        // A new inode each time: the rename is what the mounted directory shows.
        assert_ne!(fs::metadata(&router).unwrap().ino(), inode);
        assert_eq!(mode(&router), 0o644);
        assert_eq!(read_router_config(&dir).unwrap(), plan.router);
        assert_eq!(read_state(&dir).unwrap(), plan.state);
        assert_eq!(
            fs::read_to_string(dir.join(FORWARDER_DIR).join(RELAYS_FILE)).unwrap(),
            plan.relays_file()
        );
        assert_eq!(read_extra(&dir).unwrap(), "");
        write_extra(&dir, "x.com\n").unwrap();
        assert_eq!(read_extra(&dir).unwrap(), "x.com\n");
        assert_eq!(mode(&dir.join(EXTRA_FILE)), 0o600);
        let meta = SessionMeta {
            id: "0123456789ab".into(),
            project: "/p".into(),
            started: 1,
            allowlist: "/a".into(),
            router_ip: Ipv4Addr::new(10, 89, 0, 2),
        };
        write_meta(&dir, &meta).unwrap();
        assert_eq!(read_meta(&dir).unwrap(), meta);
        // No temporary file is left behind.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
