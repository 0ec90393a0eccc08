//! One sandbox session: checks, topology, the command, the report, cleanup.
//!
//! ```text
//! 1 checks.rs     directory, allowlist, podman, images        nothing is created before these pass
//!   user.rs       who the sandbox user is                     (podman's read-only queries run at once)
//! 2 shared.rs     stale sessions removed (stale.rs) · egress network and home volume ensured
//! 3 start.rs      session network ─ session directory (rundir.rs) ─ router at .2 ─ pod (--dns router)
//!                 ─ forwarder; ready when both log their listeners (readiness.rs)
//! 4 command.rs    the command in the sandbox container, signals passed on
//! 5 command.rs    report of refused names
//!   cleanup.rs    pod, router, session directory and network removed, on every way out
//!   doctor_home.rs  the doctor's probe session: a throw-away home volume instead of the user's
//! ```
//!
//! Each step is a function ([`run`] calls them in order). Objects are recorded in a `Cleanup` as soon as
//! they exist, so an error, a signal or a panic at any step removes exactly what this session created.
//! Every failure is a [`SessionError`] that says which step it stopped.

mod checks;
pub(crate) use checks::ensure_allowlist;
mod cleanup;
mod command;
mod doctor_home;
mod mounts;
mod readiness;
pub(crate) mod rundir;
mod shared;
pub(crate) use shared::{home_volume_fix, home_volume_refusal};
mod stale;
mod start;
mod user;

use std::ffi::OsString;

use crate::podman::Podman;
use crate::settings::Settings;
use crate::signals::SignalWatch;

/// Environment variables handed to the sandboxed command when set (values never go on a command line).
/// `ANTHROPIC_API_KEY` only with `--no-inject`: otherwise the sandbox gets a placeholder (`inject`).
pub const PASS_ENV: &[&str] = &[
    "TERM",
    "COLORTERM",
    "LANG",
    "LC_ALL",
    "TZ",
    "ANTHROPIC_API_KEY",
];

/// Prefix of every object name; the session id follows.
const NAME_PREFIX: &str = "agent-sandbox-";

/// Prints a launcher message on stderr.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("agent-sandbox: {}\n", format_args!($($t)*)),
        );
    }};
}
use say;

/// Why a session stopped before its command ran to the end. The message is the step's own (with its
/// causes, for `{:#}`): the variant says which step it was.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A signal arrived while the session was being set up (what was created is removed).
    #[error("interrupted by signal {0} while starting the session; removed what was created")]
    Interrupted(i32),
    /// Step 1: the checks refused (directory, allowlist, podman's set-up, images); nothing was created,
    /// or, for what `podman info` says (it is confirmed later: `checks::HostCheck`), what was is removed.
    #[error(transparent)]
    Check(anyhow::Error),
    /// Step 2: the stale sweep, the egress network or the home volume failed.
    #[error(transparent)]
    Shared(anyhow::Error),
    /// Step 3: the session's network, directory, router, pod or forwarder could not be set up, or did
    /// not become ready.
    #[error(transparent)]
    Start(anyhow::Error),
    /// Step 4: the sandbox's `podman run` could not be started or waited for.
    #[error(transparent)]
    Command(anyhow::Error),
}

impl SessionError {
    /// The exit code for an interruption by signal `sig`: 128 + the signal, as a shell reports it.
    #[must_use]
    pub fn interrupted_exit_code(&self) -> Option<i32> {
        match self {
            SessionError::Interrupted(sig) => Some(128 + sig),
            _ => None,
        }
    }
}

/// Runs `command` in a new session; returns its exit status for the launcher to exit with.
pub fn run(
    podman: &Podman,
    settings: &Settings,
    command: Vec<OsString>,
    signals: &SignalWatch,
) -> Result<i32, SessionError> {
    let setup = interruptible(podman, signals);
    let (mut checked, probes) = checks::check(&setup, settings)
        .map_err(|e| signal_first(signals, SessionError::Check(e)))?;
    interrupted(signals)?;
    let shared = shared::prepare_shared(&setup, settings, &checked, probes)
        .map_err(|e| host_first(&mut checked, signals, SessionError::Shared(e)))?;
    interrupted(signals)?;
    let lock = live_lock(settings, &mut checked, signals)?;
    let mut cleanup = cleanup::Cleanup::new(podman.clone());
    let session = start::start(&setup, settings, &checked, &shared, &mut cleanup, signals)
        .map_err(|e| host_first(&mut checked, signals, e))?;
    drop(lock);
    wait_for_host(&mut checked, signals)?;
    let status = command::run_command(settings, checked, &shared, &session, command, signals)
        .map_err(SessionError::Command)?;
    command::report_refusals(podman, &session, &settings.allowlist);
    cleanup.run();
    Ok(command::exit_code(status))
}

/// What `agent-sandbox doctor` learns of a session it started, to aim its probe.
#[derive(Debug)]
pub struct ProbeTarget {
    /// The router container.
    pub router: String,
    /// The router's address on the session network (the sandbox's resolver).
    pub router_ip: std::net::Ipv4Addr,
    /// Which names resolve to which loopback address in the sandbox.
    pub loopbacks: Vec<agent_sandbox_shared::plan::LoopbackAssignment>,
    /// Rootless podman (keep-id): nested podman is available in the sandbox.
    pub rootless: bool,
    /// The sandbox user's uid on the host: under rootful podman, nested podman needs it to be non-root.
    pub sandbox_uid: u32,
    /// The project directory, as mounted in the sandbox.
    pub project: std::path::PathBuf,
    /// The sandbox user's home (the home volume).
    pub home: std::path::PathBuf,
}

/// `agent-sandbox doctor`'s self-test: a session exactly as [`run`] starts one (same checks, images,
/// topology and user mapping) in `project`, whose command `probe` makes once the session is up; the
/// command's output is returned instead of shown. One difference: its home volume is a new, empty one
/// of its own, never the user's (`doctor_home.rs` says why). Everything, that volume included, is
/// removed before it returns; `progress` hears when the command has finished and the removal starts.
pub fn run_probe(
    podman: &Podman,
    settings: &Settings,
    project: std::path::PathBuf,
    signals: &SignalWatch,
    probe: impl FnOnce(&ProbeTarget) -> anyhow::Result<Vec<OsString>>,
    progress: &dyn Fn(&str),
) -> Result<std::process::Output, SessionError> {
    let home = doctor_home::DoctorHome::new().map_err(SessionError::Check)?;
    let settings = &Settings {
        home_volume: home.volume.clone(),
        ..settings.clone()
    };
    let setup = interruptible(podman, signals);
    let (mut checked, mut probes) = checks::check_in(&setup, settings, project)
        .map_err(|e| signal_first(signals, SessionError::Check(e)))?;
    interrupted(signals)?;
    let mut cleanup = cleanup::Cleanup::new(podman.clone());
    probes.volume = home
        .create(podman, &settings.state_dir, &checked.project, &mut cleanup)
        .map_err(SessionError::Shared)?;
    let shared = shared::prepare_shared(&setup, settings, &checked, probes)
        .map_err(|e| host_first(&mut checked, signals, SessionError::Shared(e)))?;
    interrupted(signals)?;
    let lock = live_lock(settings, &mut checked, signals)?;
    let session = start::start(&setup, settings, &checked, &shared, &mut cleanup, signals)
        .map_err(|e| host_first(&mut checked, signals, e))?;
    drop(lock);
    let target = ProbeTarget {
        router: session.router.clone(),
        router_ip: session.router_ip,
        loopbacks: session.loopbacks.clone(),
        rootless: checked.user.mapping == crate::podman::UserMapping::KeepId,
        sandbox_uid: checked.user.host_uid,
        project: checked.project.clone(),
        home: checked.user.home.clone(),
    };
    let command = probe(&target).map_err(SessionError::Command)?;
    wait_for_host(&mut checked, signals)?;
    // Said only once `podman info`'s checks have passed (the sandbox container's creation asks for the
    // same verdict again, kept): until then they may still refuse the session.
    checked.confirm_host().map_err(SessionError::Check)?;
    progress("session up; probing from inside the sandbox");
    let out = command::run_captured(settings, checked, &shared, &session, command)
        .map_err(SessionError::Command)?;
    progress("probe finished; removing the session");
    cleanup.run();
    Ok(out)
}

/// Waits for `podman info` (`checks::HostCheck`) before the sandbox container is made, giving up at a
/// signal: a slow or stuck podman must not keep a Ctrl-C from stopping the start.
fn wait_for_host(checked: &mut checks::Checked, signals: &SignalWatch) -> Result<(), SessionError> {
    checked.wait_for_host(&|| signals.received().is_some());
    interrupted(signals)
}

/// A step before the sandbox's that failed: what `podman info` refuses, when it refuses something, comes
/// first (a podman without subordinate ids, say, fails to start the router with a message that does not
/// say so); an interruption, or a failure after a signal (which may have stopped the step), is one.
fn host_first(
    checked: &mut checks::Checked,
    signals: &SignalWatch,
    e: SessionError,
) -> SessionError {
    let e = signal_first(signals, e);
    if matches!(e, SessionError::Interrupted(_)) {
        return e;
    }
    match checked.confirm_host() {
        Err(refusal) => SessionError::Check(refusal),
        Ok(_) => e,
    }
}

/// For `agent-sandbox doctor`: how many session networks of a `podman network ls` listing belong to
/// launchers that are gone (their objects are leftovers), and how many to live sessions.
pub fn stale_networks(networks_json: &str) -> anyhow::Result<(usize, usize)> {
    stale::count(networks_json)
}

/// The live lock for a start ([`crate::live::lock`]): taken once the images are there and stale
/// sessions are swept, until the router listens, with the allowlist read again under it, so that a
/// live change either comes before this session's policy is made or finds the session running. A
/// signal while waiting interrupts the start, and a lock held past its patience fails it. Without a
/// usable state directory the start goes on without the lock, and says so.
fn live_lock(
    settings: &Settings,
    checked: &mut checks::Checked,
    signals: &SignalWatch,
) -> Result<Option<crate::live::lock::LiveLock>, SessionError> {
    let lock = match rundir::live_lock_path(&settings.state_dir) {
        Ok(path) => {
            let taken = crate::live::lock::acquire_unless(path, "starting the session", &|| {
                signals.received().is_some()
            })
            .map_err(SessionError::Start)?;
            if taken.is_none() {
                interrupted(signals)?;
            }
            taken
        }
        Err(e) => {
            say!(
                "warning: {e:#}; starting without the live lock: an `agent-sandbox allow`, `deny` or `reload` run during this start may not reach this session"
            );
            None
        }
    };
    checked
        .reread_policy(settings)
        .map_err(SessionError::Check)?;
    Ok(lock)
}

/// The podman of a start, until the sandbox container: a signal gives up the command under way
/// (`Podman::interruptible`), so a podman stuck on a lock does not keep Ctrl-C from stopping the start;
/// the cleanup, made with `podman` itself, removes what exists. The session's containers are then
/// run with an uninterruptible one (`Session::podman`): a signal is meant for the command by then.
fn interruptible(podman: &Podman, signals: &SignalWatch) -> Podman {
    let signals = signals.clone();
    podman.interruptible(move || signals.received().is_some())
}

/// A step that failed after a signal was stopped by it (or raced it): the start was interrupted.
fn signal_first(signals: &SignalWatch, e: SessionError) -> SessionError {
    match signals.received() {
        Some(sig) => SessionError::Interrupted(sig),
        None => e,
    }
}

/// A signal arrived during setup: stop here (the caller's cleanup removes what exists).
fn interrupted(signals: &SignalWatch) -> Result<(), SessionError> {
    match signals.received() {
        Some(sig) => Err(SessionError::Interrupted(sig)),
        None => Ok(()),
    }
}

/// Joins a scoped thread, passing its panic on.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under the live lock the start reads the allowlist again: a change made while the images were
    /// pulled (which `allow` finds no session to apply to) is in the policy the session starts with.
    #[test]
    fn the_policy_is_the_allowlist_as_it_is_under_the_live_lock() {
        let dir = std::env::temp_dir().join(format!("as-live-lock-reread-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let list = dir.join("allowed-hosts");
        std::fs::write(&list, "old.example\n").unwrap();
        let settings = Settings {
            allowlist: list.clone(),
            state_dir: dir.join("state"),
            ..Settings::from_env(|k| (k == "HOME").then(|| "/nonexistent-as/home".into())).unwrap()
        };
        let user = user::SandboxUser {
            mapping: crate::podman::UserMapping::KeepId,
            passwd_entry: None,
            home: "/home/me".into(),
            host_uid: 1000,
        };
        let mut checked = checks::Checked::for_tests(dir.clone(), user);
        checked.reread_policy(&settings).unwrap();
        std::fs::write(&list, "new.example\n").unwrap();
        let lock = live_lock(&settings, &mut checked, &SignalWatch::for_tests());
        let taken = match &lock {
            Ok(held) => Ok(held.is_some()),
            Err(e) => Err(e.to_string()),
        };
        drop(lock);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(taken, Ok(true)), "{taken:?}");
        let name = |n: &str| agent_sandbox_shared::HostName::parse(n).unwrap();
        assert!(checked.policy.allows(&name("new.example")));
        assert!(!checked.policy.allows(&name("old.example")));
    }

    #[test]
    fn errors_show_their_whole_chain_and_interruptions_their_exit_code() {
        // lib.rs prints `{:#}` of the error: each step's context, then its causes, as before the enum.
        let cause = anyhow::anyhow!("no such file").context("cannot read the allowlist");
        let e = anyhow::Error::new(SessionError::Check(cause));
        assert_eq!(format!("{e:#}"), "cannot read the allowlist: no such file");
        assert_eq!(
            SessionError::Interrupted(15).interrupted_exit_code(),
            Some(143)
        );
        assert_eq!(
            SessionError::Interrupted(2).to_string(),
            "interrupted by signal 2 while starting the session; removed what was created"
        );
        assert_eq!(
            SessionError::Start(anyhow::anyhow!("x")).interrupted_exit_code(),
            None
        );
    }
}
