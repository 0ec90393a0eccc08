//! Steps 4 and 5: the command in the sandbox container, with the launcher's terminal and signals; then
//! the report of what the router refused.

use std::ffi::OsString;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output};

use anyhow::Context as _;

use super::checks::Checked;
use super::shared::Shared;
use super::start::Session;
use super::PASS_ENV;
use crate::podman::{args, logfile, Covered, Podman, SandboxCa, SandboxSpec, UserMapping};
use crate::report;
use crate::settings::Settings;
use crate::signals::SignalWatch;

/// Step 4: the command, in the pod, with the launcher's terminal or pipes; signals are passed on to it.
pub(super) fn run_command(
    settings: &Settings,
    checked: Checked,
    shared: &Shared,
    session: &Session,
    command: Vec<OsString>,
    signals: &SignalWatch,
) -> anyhow::Result<ExitStatus> {
    // No OCI hook of podman's configuration runs for the sandbox (see `Session::podman`).
    let podman = &session.podman;
    let (spec, stores) = checked_spec(
        podman,
        settings,
        checked,
        shared,
        session,
        command,
        std::io::stdin().is_terminal(),
    )?;
    let escalate = {
        let podman = podman.clone();
        let pod = session.pod.clone();
        move || {
            let _ = podman.output(&args::pod_kill(&pod));
        }
    };
    signals.set_escalation(escalate);
    let forward = {
        let podman = podman.clone();
        let name = spec.name.clone();
        move |sig: i32| {
            let _ = podman.output(&args::kill(&name, sig));
        }
    };
    signals.set_forward(forward);
    create_sandbox(podman, shared, &spec, &stores)?;
    let mut child = podman.spawn_foreground(&args::sandbox_start(&spec))?;
    signals.set_child(Some(child.id()));
    signals.forward_pending();
    let status = child.wait();
    signals.set_child(None);
    status.context("waiting for the sandbox's podman run")
}

/// The sandbox container created, initialised and checked (`mounts.rs`), with the home volume locked
/// meanwhile (rootful: `shared::lock_home`) until podman has re-owned it to the sandbox's user.
fn create_sandbox(
    podman: &Podman,
    shared: &Shared,
    spec: &SandboxSpec,
    stores: &[PathBuf],
) -> anyhow::Result<()> {
    let _home = super::shared::lock_home(
        shared.home_mountpoint.as_deref(),
        &spec.home_volume,
        &spec.user,
    )?;
    super::mounts::create_checked(podman, spec, stores)
}

/// The sandbox container of a session, right before it runs: `podman info`'s checks confirmed
/// (`checks::HostCheck`), the project checked once more (it must be the directory the checks looked
/// at), what is mounted below it read, then [`sandbox_spec`]. The same
/// for an interactive command and for the doctor's probe.
fn checked_spec(
    podman: &Podman,
    settings: &Settings,
    mut checked: Checked,
    shared: &Shared,
    session: &Session,
    command: Vec<OsString>,
    tty: bool,
) -> anyhow::Result<(SandboxSpec, Vec<PathBuf>)> {
    let stores = checked.confirm_host()?;
    checked.still_the_checked_project()?;
    let covered = covered(podman, &checked, session)?;
    let spec = sandbox_spec(settings, checked, covered, shared, session, command, tty);
    Ok((spec, stores))
}

/// The sandbox container of a session.
fn sandbox_spec(
    settings: &Settings,
    checked: Checked,
    covered: Vec<Covered>,
    shared: &Shared,
    session: &Session,
    command: Vec<OsString>,
    tty: bool,
) -> SandboxSpec {
    SandboxSpec {
        name: format!("{}-sandbox", session.base),
        labels: session.labels.clone(),
        pod: session.pod.clone(),
        image: settings.image.clone(),
        user: checked.user.mapping,
        passwd_entry: checked.user.passwd_entry,
        covered,
        project: checked.project,
        home_volume: settings.home_volume.clone(),
        home: checked.user.home,
        chown_home: shared.chown_home,
        hosts_file: session.hosts.clone(),
        resolv_file: session.resolv.clone(),
        tty,
        ca: session.inject.as_ref().map(|i| SandboxCa {
            cert: i.ca_cert.clone(),
            bundle: i.bundle.clone(),
        }),
        env: session
            .inject
            .as_ref()
            .map(|i| i.env.clone())
            .unwrap_or_default(),
        pass_env: pass_env(settings.inject),
        command,
    }
}

/// Rootless, what is mounted below the project, to be covered in the sandbox (see
/// [`args::sandbox_mounts`]): read now, right before podman mounts the project. Rootful podman binds the
/// project alone, which works whatever is below it. Unreadable: none, and the project is bound alone,
/// which never shows what is below it either. A mount point that is not there by its path (shadowed by
/// a later mount) is left out: podman would make its path in the project.
///
/// The covers go by path, so a directory on the way to a mount point must not be renamed between this
/// read and podman's mounts, or the mount would move out from under its cover and show in the new
/// sandbox. The user does not do that; a running sandbox could, if its project is this one, holds it
/// or lies inside it (reviewer Q). So with mounts to cover, such a session refuses the start.
fn covered(podman: &Podman, checked: &Checked, session: &Session) -> anyhow::Result<Vec<Covered>> {
    if checked.user.mapping != UserMapping::KeepId {
        return Ok(Vec::new());
    }
    let found: Vec<PathBuf> = crate::workdir::mounts_below(&checked.project)
        .unwrap_or_default()
        .into_iter()
        .filter(|path| std::fs::symlink_metadata(path).is_ok())
        .collect();
    let Some(first) = found.first() else {
        return Ok(Vec::new());
    };
    let listing = podman
        .run(&args::network_ls_sessions())
        .context("cannot list the running sessions (to check that none can move what is mounted below this project)")?;
    let live = super::stale::live_sessions(&listing)
        .context("cannot read the list of running sessions")?;
    if let Some((id, other)) = mover(&checked.project, &session.labels.session, &live) {
        anyhow::bail!(
            "refusing to start the sandbox: {} is mounted below this project, and session {id}'s \
             sandbox, running in {}, could rename a directory on the way to it while this one \
             starts, so that this sandbox would see it uncovered. Stop that session first, or \
             unmount {}",
            first.display(),
            other.display(),
            first.display()
        );
    }
    Ok(found
        .into_iter()
        .map(|path| Covered {
            // A mount point the user cannot stat (another user's FUSE mount) is taken as a directory.
            file: std::fs::metadata(&path).is_ok_and(|m| !m.is_dir()),
            path,
        })
        .collect())
}

/// A running session other than `own` whose project is `project`, holds it or lies inside it: its
/// sandbox can rename directories below `project`. Compared as text with invalid UTF-8 replaced, as
/// podman's JSON gives labels back (see `checks::refuse_inside`).
fn mover<'a>(
    project: &Path,
    own: &str,
    live: &'a [(String, PathBuf)],
) -> Option<&'a (String, PathBuf)> {
    let lossy = |p: &Path| PathBuf::from(p.to_string_lossy().into_owned());
    let project = lossy(project);
    live.iter().find(|(id, other)| {
        let other = lossy(other);
        id != own && (project.starts_with(&other) || other.starts_with(&project))
    })
}

/// The variables passed through by name: [`PASS_ENV`], but never the real API key unless injection
/// is off (`--no-inject`): with injection the sandbox holds a placeholder, or nothing.
fn pass_env(inject: bool) -> Vec<String> {
    PASS_ENV
        .iter()
        .filter(|name| !inject || **name != crate::inject::API_KEY_VAR)
        .map(|s| (*s).to_owned())
        .collect()
}

/// Step 4 for `agent-sandbox doctor`: the probe in the sandbox container, exactly as a command would
/// run but with no terminal and its output captured.
pub(super) fn run_captured(
    settings: &Settings,
    checked: Checked,
    shared: &Shared,
    session: &Session,
    command: Vec<OsString>,
) -> anyhow::Result<Output> {
    let podman = &session.podman;
    let (spec, stores) = checked_spec(podman, settings, checked, shared, session, command, false)?;
    create_sandbox(podman, shared, &spec, &stores)?;
    // The probe bounds its own run (the doctor's timeouts), so no podman deadline cuts it short.
    podman
        .output_unbounded(&args::sandbox_start(&spec))
        .context("running the probe in the sandbox")
}

/// Step 5: what the router refused, from its log (nothing when nothing was refused): its file when
/// the session named one, else `podman logs`.
pub(super) fn report_refusals(podman: &Podman, session: &Session, allowlist: &Path) {
    let file = session.router_log.as_deref();
    if let Ok(log) = logfile::log_messages(podman, &session.router, file, logfile::MAX_WHOLE_LOG) {
        if let Some(text) =
            report::render(&report::refusals(&log), allowlist, report::truncated(&log))
        {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
}

/// The launcher's exit code for the command's status: its code, or 128 + the signal that ended it.
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With mounts to cover, a running sandbox that can rename directories in the project refuses the
    /// start: one in the same project, one holding it, one inside it; not this session, and not one
    /// beside it (reviewer Q).
    #[test]
    fn sessions_that_could_move_a_mount_are_found() {
        let live: Vec<(String, PathBuf)> = [
            ("own", "/home/me/src/p"),
            ("beside", "/home/me/src/pp"),
            ("other", "/home/me/other"),
        ]
        .iter()
        .map(|(i, p)| ((*i).to_owned(), PathBuf::from(p)))
        .collect();
        let p = Path::new("/home/me/src/p");
        assert_eq!(mover(p, "own", &live), None);
        for (id, project) in [
            ("same", "/home/me/src/p"),
            ("holds", "/home/me/src"),
            ("inside", "/home/me/src/p/sub"),
        ] {
            let mut with = live.clone();
            with.push((id.to_owned(), project.into()));
            assert_eq!(mover(p, "own", &with).map(|m| m.0.as_str()), Some(id));
        }
    }

    /// A session with credential injection, as `start` leaves it, and what the other steps give.
    fn started(project: &Path) -> (Settings, Checked, Shared, Session) {
        let settings =
            Settings::from_env(|k| (k == "HOME").then(|| "/nonexistent-as/home".into())).unwrap();
        assert!(settings.inject, "injection is the default");
        // Rootful, as the sudo user: no mounts below the project to read, so no podman is asked.
        let user = super::super::user::SandboxUser {
            mapping: UserMapping::Host {
                uid: 1000,
                gid: 1000,
            },
            passwd_entry: None,
            home: PathBuf::from("/home/me"),
            host_uid: 1000,
        };
        let checked = Checked::for_tests(project.to_owned(), user);
        let shared = Shared {
            resolvers: Vec::new(),
            chown_home: false,
            home_mountpoint: None,
        };
        let labels = crate::podman::SessionLabels {
            session: "0123456789ab".into(),
            pid: 1,
            start: 1,
            boot: "boot".into(),
            project: project.to_owned(),
            log_dir: None,
            session_dir: None,
        };
        let inject = crate::inject::SessionInject {
            config: agent_sandbox_shared::inject::InjectConfig {
                ca_cert: "/s/inject/ca.pem".into(),
                ca_key: "/s/inject/ca.key".into(),
                upstream_roots: None,
                api_key: None,
                oauth: None,
            },
            router_dir: "/s/inject".into(),
            ca_cert: "/s/inject/ca.pem".into(),
            bundle: "/s/ca-bundle.crt".into(),
            oauth_store: None,
            notices: Vec::new(),
            env: vec![(
                "ANTHROPIC_API_KEY".into(),
                "sk-ant-api03-placeholder".into(),
            )],
        };
        let session = Session {
            labels,
            base: "agent-sandbox-0123456789ab".into(),
            pod: "agent-sandbox-0123456789ab".into(),
            router: "agent-sandbox-0123456789ab-router".into(),
            router_log: None,
            hosts: "/s/hosts".into(),
            resolv: "/s/resolv.conf".into(),
            podman: Podman::default().with_hooks_dir(Path::new("/s/no-hooks")),
            router_ip: std::net::Ipv4Addr::new(10, 89, 3, 2),
            loopbacks: Vec::new(),
            inject: Some(inject),
        };
        (settings, checked, shared, session)
    }

    /// With injection, the sandbox gets the placeholder key and the session CA's certificate, never
    /// the real key (by name, from the launcher's environment) nor the router's directory (its key).
    #[test]
    fn the_sandbox_gets_the_placeholder_and_the_certificate_only() {
        let project = std::env::temp_dir();
        let (settings, checked, shared, session) = started(&project.canonicalize().unwrap());
        let podman = Podman::stand_in("/nonexistent-as/podman");
        let spec = checked_spec(
            &podman,
            &settings,
            checked,
            &shared,
            &session,
            vec!["claude".into()],
            false,
        )
        .unwrap()
        .0;
        assert!(!spec.pass_env.iter().any(|n| n == "ANTHROPIC_API_KEY"));
        let argv: Vec<String> = args::sandbox_create(&spec)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(argv.contains(&"ANTHROPIC_API_KEY=sk-ant-api03-placeholder".to_owned()));
        assert!(argv
            .iter()
            .any(|a| a.starts_with("/s/inject/ca.pem:/etc/agent-sandbox/session-ca.pem")));
        assert!(
            !argv.iter().any(|a| a == "ANTHROPIC_API_KEY"
                || a.starts_with("/s/inject:")
                || a.contains("ca.key")),
            "{argv:?}"
        );
    }

    /// A project directory swapped after the checks (for a symlink, say) gets no sandbox.
    #[test]
    fn a_project_replaced_after_the_checks_gets_no_sandbox() {
        let base = std::env::temp_dir().join(format!("as-replaced-test-{}", std::process::id()));
        std::fs::create_dir_all(base.join("proj")).unwrap();
        let project = base.join("proj").canonicalize().unwrap();
        let (settings, checked, shared, session) = started(&project);
        std::fs::rename(&project, base.join("moved")).unwrap();
        std::fs::create_dir(&project).unwrap();
        let podman = Podman::stand_in("/nonexistent-as/podman");
        let result = checked_spec(
            &podman,
            &settings,
            checked,
            &shared,
            &session,
            Vec::new(),
            false,
        )
        .map_err(|e| format!("{e:#}"));
        std::fs::remove_dir_all(&base).unwrap();
        assert!(
            result
                .as_ref()
                .is_err_and(|e| e.contains("changed while the session")),
            "{:?}",
            result.map(|_| ())
        );
    }

    #[test]
    fn the_real_key_is_passed_through_only_without_injection() {
        assert!(!pass_env(true).iter().any(|n| n == "ANTHROPIC_API_KEY"));
        assert!(pass_env(true).iter().any(|n| n == "TERM"));
        assert!(pass_env(false).iter().any(|n| n == "ANTHROPIC_API_KEY"));
        assert_eq!(pass_env(false).len(), PASS_ENV.len());
    }

    #[test]
    fn exit_codes() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
