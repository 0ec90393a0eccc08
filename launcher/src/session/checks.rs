//! Step 1, the checks: the project directory, the allowlist, podman's set-up and the images. Nothing is
//! created here but the user's allowlist (copied from the default); the read-only podman queries that
//! the later steps need are made here too, all at once.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context as _};

use agent_sandbox_shared::{Allowlist, Policy};

use super::user::{passwd_lookup, sandbox_user, SandboxUser};
use super::{join, say};
use crate::podman::json::Info;
use crate::podman::{args, Podman, PodmanError};
use crate::settings::{Settings, EGRESS_NETWORK, EMBEDDED_ALLOWLIST, PACKAGED_ALLOWLIST};
use crate::workdir;

/// What the checks established.
pub(super) struct Checked {
    /// The canonical project directory.
    pub(super) project: PathBuf,
    /// The allowlist, compiled.
    pub(super) policy: Policy,
    /// Who the sandbox user is.
    pub(super) user: SandboxUser,
    /// The project directory's device and inode when it was checked.
    project_id: (u64, u64),
    /// podman's `info`, asked in the background ([`HostCheck`]).
    host: HostCheck,
}

impl Checked {
    /// The checks' result for `project` as it is now, with an empty allowlist (tests).
    #[cfg(test)]
    pub(super) fn for_tests(project: PathBuf, user: SandboxUser) -> Checked {
        let project_id = fs::metadata(&project)
            .map(|m| (m.dev(), m.ino()))
            .unwrap_or_default();
        let rootless = user.mapping == crate::podman::UserMapping::KeepId;
        Checked {
            project,
            policy: Policy::new(&agent_sandbox_shared::Allowlist::parse("", "test").unwrap()),
            user,
            project_id,
            host: HostCheck {
                state: HostState::Done(Ok(Vec::new())),
                rootless,
            },
        }
    }

    /// Waits for `podman info`'s answer while `stop` says nothing ([`HostCheck::wait`]); false when it
    /// did.
    pub(super) fn wait_for_host(&mut self, stop: &dyn Fn() -> bool) -> bool {
        self.host.wait(stop)
    }

    /// `podman info`'s checks ([`HostCheck::confirm`]) for the checked project: before the sandbox
    /// container is created, and to explain a start that failed. Returns where podman keeps
    /// containers ([`HostInfo::container_stores`]).
    pub(super) fn confirm_host(&mut self) -> anyhow::Result<Vec<PathBuf>> {
        self.host.confirm(&self.project)
    }

    /// The allowlist read again (under the live lock, [`crate::live::lock`]): the policy the session
    /// starts with is the file as it is now, not as it was before the images were pulled.
    pub(super) fn reread_policy(&mut self, settings: &Settings) -> anyhow::Result<()> {
        self.policy = Policy::new(&Allowlist::load(&settings.allowlist)?);
        Ok(())
    }

    /// Right before podman mounts the project: its path still leads, through no symlink, to the
    /// directory that was checked. Podman resolves the path again when it mounts; this narrows what a
    /// process that can rename directories on the way (see [`refuse_inside_a_live_session`]) could do
    /// in between to the time podman takes to start.
    pub(super) fn still_the_checked_project(&self) -> anyhow::Result<()> {
        let resolved = fs::canonicalize(&self.project).ok();
        let id = fs::metadata(&self.project).ok().map(|m| (m.dev(), m.ino()));
        if resolved.as_deref() == Some(self.project.as_path()) && id == Some(self.project_id) {
            return Ok(());
        }
        bail!(
            "refusing to start the sandbox: the project directory {} changed while the session \
             started (renamed, replaced, or a symlink now on its path). Run agent-sandbox again from \
             the directory you mean",
            self.project.display()
        )
    }
}

/// Step 1: the checks. Nothing is created here but the user's allowlist (copied from the default).
pub(super) fn check(
    podman: &Podman,
    settings: &Settings,
) -> anyhow::Result<(Checked, SharedProbes)> {
    let project = std::env::current_dir()
        .context("cannot read the current directory")?
        .canonicalize()
        .context("cannot resolve the current directory")?;
    check_in(podman, settings, project)
}

/// Step 1 for a given (canonical) project directory: `agent-sandbox doctor` runs its session in an
/// empty directory of its own.
pub(super) fn check_in(
    podman: &Podman,
    settings: &Settings,
    project: PathBuf,
) -> anyhow::Result<(Checked, SharedProbes)> {
    let locations = workdir::guarded_locations(&settings.allowlist).with_context(|| {
        format!(
            "cannot resolve the allowlist path {}",
            settings.allowlist.display()
        )
    })?;
    let guarded = workdir::Guarded::from_env(
        &settings.home,
        locations,
        |k| std::env::var_os(k),
        &identity(&project),
    )
    .with_context(|| {
        format!(
            "cannot resolve HOME ({}) or the directories to keep out of the sandbox",
            settings.home.display()
        )
    })?;
    workdir::check(&project, &guarded)?;
    let project_id = fs::metadata(&project)
        .map(|m| (m.dev(), m.ino()))
        .with_context(|| format!("cannot read {}", project.display()))?;

    ensure_allowlist(&settings.allowlist)?;
    let allowlist = Allowlist::load(&settings.allowlist)?;
    for w in allowlist.warnings() {
        say!(
            "warning: {}:{}: `{}`: {}",
            settings.allowlist.display(),
            w.line,
            w.text,
            w.message
        );
    }
    let policy = Policy::new(&allowlist);

    let mut host = HostCheck::start(podman);
    let probes = Probes::gather(podman, settings);
    // A podman that does not work fails these queries too: `podman info`'s answer explains it better.
    if probes.shared.session_networks.is_err() || !probes.images_present {
        host.confirm(&project)?;
    }
    refuse_inside_a_live_session(&project, &probes.shared.session_networks)?;
    let (router_image, sandbox_image) = if probes.images_present {
        (Ok(true), Ok(true))
    } else {
        std::thread::scope(|s| {
            let r = s.spawn(|| image_present(podman, &settings.router_image));
            let i = image_present(podman, &settings.image);
            (join(r), i)
        })
    };
    ensure_image(
        podman,
        router_image?,
        &settings.router_image,
        "AGENT_SANDBOX_ROUTER_IMAGE",
    )?;
    ensure_image(
        podman,
        sandbox_image?,
        &settings.image,
        "AGENT_SANDBOX_IMAGE",
    )?;
    let user = sandbox_user(host.rootless, &project, &settings.home)?;
    let checked = Checked {
        project,
        policy,
        user,
        project_id,
        host,
    };
    Ok((checked, probes.shared))
}

/// Refuses a project inside the project of a running session. That session's sandbox can rename
/// and replace every directory between its project and this one, so it could swap this project for a
/// symlink (to the home, say) between the checks above and podman's mount of it, which follows the
/// path again. A project that contains a running session's, or is the same, is not at risk: the other
/// sandbox sees nothing above its own project.
fn refuse_inside_a_live_session(
    project: &Path,
    session_networks: &Result<String, PodmanError>,
) -> anyhow::Result<()> {
    let listing = session_networks.as_ref().map_err(|e| {
        anyhow::anyhow!(
            "cannot list the running sessions (to check that none of them holds this project): {e}"
        )
    })?;
    let live =
        super::stale::live_projects(listing).context("cannot read the list of running sessions")?;
    refuse_inside(project, &live)
}

/// [`refuse_inside_a_live_session`] against the running sessions' projects `live`. Compared as text
/// with invalid UTF-8 replaced, as podman's JSON gives the labels back (it replaces each invalid
/// sequence with U+FFFD): a project below another session's that is not valid UTF-8 is still seen
/// inside it (and a sibling whose name differs only in such bytes is refused too).
fn refuse_inside(project: &Path, live: &[PathBuf]) -> anyhow::Result<()> {
    let lossy = |p: &Path| PathBuf::from(p.to_string_lossy().into_owned());
    let project_text = lossy(project);
    if let Some(outer) = live.iter().find(|o| {
        let o = lossy(o);
        project_text != o && project_text.starts_with(&o)
    }) {
        bail!(
            "refusing to run in {}: it is inside {}, the project directory of a running \
             agent-sandbox session. That session's sandbox can rename the directories on the way \
             here, and so could make this session mount another directory (your home) instead. \
             Stop that session first, or run this one from a directory outside {}",
            project.display(),
            outer.display(),
            outer.display()
        );
    }
    Ok(())
}

/// Read-only podman queries, made at once before any check decides: each podman call costs 20–200 ms
/// of start-up, and in sequence they were a third of a session's start time. Nothing is created here.
struct Probes {
    /// Whether both images are in local storage (false also when podman could not say: the images are
    /// then checked one by one, with podman's error).
    images_present: bool,
    /// What the shared objects look like, for [`prepare_shared`].
    shared: SharedProbes,
}

/// The shared objects as probed; an `Err` means missing or unknown, and [`prepare_shared`] takes the
/// careful path (check, create, inspect) for it.
pub(super) struct SharedProbes {
    /// `podman network ls` of session networks: every session object (the session directory included)
    /// is created after its network and removed before it, so a dead session always leaves its network
    /// behind.
    pub(super) session_networks: Result<String, PodmanError>,
    /// `podman network inspect` of the egress network.
    pub(super) egress: Result<String, PodmanError>,
    /// The home volume's mount point.
    pub(super) volume: Result<String, PodmanError>,
}

impl Probes {
    fn gather(podman: &Podman, settings: &Settings) -> Probes {
        std::thread::scope(|s| {
            let images = s.spawn(|| {
                podman
                    .run(&args::image_ids(&[&settings.router_image, &settings.image]))
                    .is_ok()
            });
            let networks = s.spawn(|| podman.run(&args::network_ls_sessions()));
            let egress = s.spawn(|| podman.run(&args::network_inspect(EGRESS_NETWORK)));
            let volume = podman.run(&args::volume_inspect(&settings.home_volume));
            Probes {
                images_present: join(images),
                shared: SharedProbes {
                    session_networks: join(networks),
                    egress: join(egress),
                    volume,
                },
            }
        })
    }
}

/// Who this launcher acts for, for the directory checks: the passwd home of the real uid and, under
/// sudo, of `SUDO_UID`; as root (rootful podman, where the sandbox may run as the project's owner) also
/// the project owner's home. Their homes are refused like `$HOME`.
fn identity(project: &Path) -> workdir::Identity {
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let mut uids = vec![uid];
    if let Some(sudo) = std::env::var("SUDO_UID")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        uids.push(sudo);
    }
    if uid == 0 {
        if let Ok(meta) = fs::metadata(project) {
            uids.push(meta.uid());
        }
    }
    workdir::Identity {
        uid,
        other_homes: uids
            .into_iter()
            .filter_map(|u| passwd_lookup(u).map(|(_, home)| home))
            .filter(|h| h.is_absolute())
            .collect(),
        executable: std::env::current_exe().ok(),
        invoked: std::env::args_os().next().and_then(|argv0| {
            workdir::invoked_path(
                &argv0,
                std::env::var_os("PATH").as_deref(),
                &std::env::current_dir().ok()?,
                std::env::var_os("HOME").map(PathBuf::from).as_deref(),
            )
        }),
    }
}

/// Copies the default allowlist to `path` if nothing is there, and says so.
pub(crate) fn ensure_allowlist(path: &Path) -> anyhow::Result<()> {
    if fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    let (text, from) = match fs::read_to_string(PACKAGED_ALLOWLIST) {
        Ok(text) => (text, PACKAGED_ALLOWLIST),
        Err(_) => (
            EMBEDDED_ALLOWLIST.to_owned(),
            "the default built into agent-sandbox",
        ),
    };
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create the allowlist {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write the allowlist {}", path.display()))?;
    say!(
        "no allowlist yet: created {} from {from}. Edit it to allow more hosts.",
        path.display()
    );
    Ok(())
}

/// `podman info` and what depends on it: podman works for this user, rootless podman has subordinate
/// ids, and the project is not podman's storage, run directory or API socket, nor holds or lies in one.
///
/// `podman info` is the slowest of podman's answers by far (0.45 s here against 0.04–0.09 s for the
/// others, most of it podman asking the package manager for the versions of conmon, runc and
/// slirp4netns), and nothing needs it before the sandbox container, the only one that mounts the
/// project, is created. So it is asked in a thread of its own when the checks begin, and the session
/// is set up meanwhile in the mode podman's own rule gives ([`podman_rootless`]). [`HostCheck::confirm`] waits for it before the sandbox container is
/// created, refuses a podman in the other mode, and runs the checks; a start that fails before then
/// is reported with `podman info`'s explanation when it has one.
#[derive(Debug)]
pub(super) struct HostCheck {
    state: HostState,
    /// The mode the session is set up in.
    pub(super) rootless: bool,
}

#[derive(Debug)]
enum HostState {
    /// `podman info` is under way: its answer comes on this channel (none if its thread panicked). It
    /// comes in the end: the deadline of `Podman::output` stops a `podman info` stuck on
    /// a lock.
    Pending {
        answer: mpsc::Receiver<Result<String, PodmanError>>,
    },
    /// It answered (or was given up); not checked yet.
    Answered(Result<String, PodmanError>),
    /// Confirmed, with where podman keeps containers (`Err`: the refusal, kept as text for each
    /// later asking).
    Done(Result<Vec<PathBuf>, String>),
}

impl HostCheck {
    fn start(podman: &Podman) -> HostCheck {
        let podman = podman.clone();
        let (tx, answer) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(podman.run(&args::info()));
        });
        HostCheck {
            state: HostState::Pending { answer },
            rootless: podman_rootless(),
        }
    }

    /// Waits for `podman info` to answer, looking at `stop` twenty times a second: false when `stop`
    /// said so first (a signal: the start is abandoned), true once there is an answer to check.
    pub(super) fn wait(&mut self, stop: &dyn Fn() -> bool) -> bool {
        loop {
            let HostState::Pending { answer } = &self.state else {
                return true;
            };
            let got = match answer.recv_timeout(Duration::from_millis(50)) {
                Ok(info) => Some(info),
                Err(mpsc::RecvTimeoutError::Disconnected) => Some(Err(PodmanError::Spawn(
                    std::io::Error::other("the thread asking `podman info` panicked"),
                ))),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
            };
            match got {
                Some(info) => self.state = HostState::Answered(info),
                None if stop() => return false,
                None => {}
            }
        }
    }

    /// Waits for `podman info` (once; podman's deadline at most) and checks what it says against the
    /// session and `project`.
    pub(super) fn confirm(&mut self, project: &Path) -> anyhow::Result<Vec<PathBuf>> {
        self.wait(&|| false);
        if let HostState::Answered(_) = self.state {
            let HostState::Answered(info) =
                std::mem::replace(&mut self.state, HostState::Done(Ok(Vec::new())))
            else {
                unreachable!("matched just above")
            };
            let verdict = check_host(info, self.rootless, project).map_err(|e| format!("{e:#}"));
            self.state = HostState::Done(verdict);
        }
        match &self.state {
            HostState::Done(Ok(stores)) => Ok(stores.clone()),
            HostState::Done(Err(e)) => Err(anyhow::anyhow!("{e}")),
            HostState::Pending { .. } | HostState::Answered(_) => {
                unreachable!("waited for and checked above")
            }
        }
    }
}

/// podman's own rule for its mode: rootless unless the effective uid is 0 with CAP_SYS_ADMIN, and
/// always inside `podman unshare` (which sets `_CONTAINERS_USERNS_CONFIGURED`).
fn podman_rootless() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    euid != 0
        || std::env::var_os("_CONTAINERS_USERNS_CONFIGURED").is_some_and(|v| !v.is_empty())
        || !has_cap_sys_admin()
}

/// Whether this process's effective capabilities hold CAP_SYS_ADMIN (`/proc/self/status` CapEff).
fn has_cap_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// [`preflight`], then the mode against the one the session was set up in, then the project against
/// podman's own idea of its storage (storage.conf may move it from the default places
/// `workdir::check` already refused).
fn check_host(
    info: Result<String, PodmanError>,
    assumed_rootless: bool,
    project: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    let host = preflight(info)?;
    if host.remote {
        bail!(
            "podman talks to a remote service (podman --remote, CONTAINER_HOST, podman-remote): the \
             sandbox must be made by this machine's own podman, which mounts this directory. Unset \
             CONTAINER_HOST (or use the local podman) and run agent-sandbox again"
        );
    }
    if host.rootless != assumed_rootless {
        bail!(
            "podman says it runs {} but this launcher, with effective uid {}, set the session up for \
             {} podman by podman's own rule (rootless unless uid 0 with CAP_SYS_ADMIN, outside \
             `podman unshare`): run agent-sandbox with the local podman of the user it runs as",
            if host.rootless { "rootless" } else { "rootful" },
            // SAFETY: geteuid cannot fail and touches no memory.
            unsafe { libc::geteuid() },
            if assumed_rootless { "rootless" } else { "rootful" },
        );
    }
    let podman_paths = host
        .paths
        .iter()
        .map(|p| workdir::canonicalize_lenient(p))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot resolve podman's storage directories")?;
    workdir::check_podman_paths(project, &podman_paths)?;
    Ok(host.container_stores)
}

/// What podman says about the host.
#[derive(Debug)]
pub(super) struct HostInfo {
    /// Rootless podman (the product's mode) or rootful.
    pub(super) rootless: bool,
    /// More ids than the user's own are mapped (rootless only).
    pub(super) subordinate_ids: bool,
    /// podman's storage, runtime and configuration paths as it reports them (graphRoot, runRoot,
    /// volumePath, the storage configuration file, its API socket).
    pub(super) paths: Vec<PathBuf>,
    /// Where its storage keeps containers' own files by its layout, `<driver>-containers` under the
    /// graph root (their `config.json`) and the run root (what podman writes for them); empty when
    /// `podman info` does not name both.
    pub(super) container_stores: Vec<PathBuf>,
    /// podman talks to a remote service.
    pub(super) remote: bool,
}

/// Checks that podman runs and, when rootless, has subordinate ids (keep-id needs them).
fn preflight(info: Result<String, PodmanError>) -> anyhow::Result<HostInfo> {
    let info = info.map_err(|e| {
        if matches!(e, PodmanError::NotInstalled) {
            return anyhow::Error::new(e);
        }
        anyhow::anyhow!(
            "{e}\npodman does not work for this user; `podman info` shows why (for rootless podman: \
             an /etc/subuid and /etc/subgid range for your user, then `podman system migrate`)"
        )
    })?;
    let host = parse_host_info(&info)?;
    if host.rootless && !host.subordinate_ids {
        let user = std::env::var("USER").unwrap_or_else(|_| "$USER".into());
        bail!(
            "rootless podman is not set up for {user}: there is no subordinate uid/gid range. \
             Add one (e.g. `sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`), \
             then run `podman system migrate`"
        );
    }
    Ok(host)
}

/// Reads `podman info --format json`: the mode, and whether more than the user's own id is mapped
/// (keep-id needs a subordinate range; without one podman maps only the user, and warns).
fn parse_host_info(json: &str) -> anyhow::Result<HostInfo> {
    let info = Info::parse(json)?;
    Ok(HostInfo {
        rootless: info.host.security.rootless,
        subordinate_ids: info.subordinate_ids(),
        paths: info.paths(),
        container_stores: info.container_stores(),
        remote: info.host.service_is_remote,
    })
}

/// Whether an image is in local storage.
fn image_present(podman: &Podman, image: &str) -> Result<bool, PodmanError> {
    podman.check(&args::image_exists(image))
}

/// Makes sure an image is present: local `localhost/` images come from `make build`; registry images
/// (release builds) are pulled.
fn ensure_image(podman: &Podman, present: bool, image: &str, variable: &str) -> anyhow::Result<()> {
    if present {
        return Ok(());
    }
    if image.starts_with("localhost/") {
        bail!(
            "the image {image} is missing: run `make build` in the agent-sandbox source tree \
             (it runs `agent-sandbox --build-images`), or set {variable} to an image you have"
        );
    }
    say!("pulling {image}");
    podman
        .run_visible(&args::image_pull(image))
        .with_context(|| format!("cannot pull {image} (set {variable} to use another image)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// `podman info` asked in the background (here a stand-in that prints a captured answer, after a
    /// pause) and confirmed later: the mode podman reports must be the one the session was set up in,
    /// and the project must stay out of the paths it names; the verdict is kept for a second asking.
    #[test]
    fn podman_info_is_confirmed_later_against_mode_and_paths() {
        let dir = std::env::temp_dir().join(format!("as-hostcheck-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let ours = podman_rootless();
        let [answer, other] = if ours {
            ["info-rootless.json", "info-rootful.json"]
        } else {
            ["info-rootful.json", "info-rootless.json"]
        }
        .map(|f| {
            let sample = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/podman/4.3.1")
                .join(f);
            let script = dir.join(format!("podman-{f}"));
            fs::write(
                &script,
                format!("#!/bin/sh\nsleep 0.2\ncat '{}'\n", sample.display()),
            )
            .unwrap();
            fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            Podman::stand_in(script)
        });
        let graph_root = |podman: &Podman| {
            let json = podman.run(&args::info()).unwrap();
            PathBuf::from(Info::parse(&json).unwrap().store.graph_root)
        };

        let mut host = HostCheck::start(&answer);
        assert_eq!(host.rootless, ours);
        assert!(matches!(host.state, HostState::Pending { .. }));
        host.confirm(Path::new("/nonexistent-as/project")).unwrap();
        assert!(matches!(host.state, HostState::Done(Ok(_))));

        let inside = graph_root(&answer).join("as-project");
        let mut host = HostCheck::start(&answer);
        let refused = format!("{:#}", host.confirm(&inside).unwrap_err());
        assert!(
            refused.contains(&graph_root(&answer).display().to_string()),
            "{refused}"
        );
        assert_eq!(format!("{:#}", host.confirm(&inside).unwrap_err()), refused);

        let mut host = HostCheck::start(&other);
        let refused = format!(
            "{:#}",
            host.confirm(Path::new("/nonexistent-as/p")).unwrap_err()
        );
        assert!(refused.contains("set the session up for"), "{refused}");

        // A signal while podman is slow to answer stops the wait at once (reviewer Z: Ctrl-C did
        // nothing while `podman info` hung); the answer can still be waited for afterwards.
        let slow = dir.join("podman-slow");
        fs::write(&slow, "#!/bin/sh\nsleep 5\n").unwrap();
        fs::set_permissions(&slow, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut host = HostCheck::start(&Podman::stand_in(&slow));
        let asked = Instant::now();
        assert!(!host.wait(&|| true));
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "{:?}",
            asked.elapsed()
        );
        assert!(matches!(host.state, HostState::Pending { .. }));

        let mut host = HostCheck::start(&Podman::stand_in("/nonexistent-as/podman"));
        let refused = format!(
            "{:#}",
            host.confirm(Path::new("/nonexistent-as/p")).unwrap_err()
        );
        assert!(refused.contains("podman is not installed"), "{refused}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn host_info() {
        let rootless = r#"{"host":{"security":{"rootless":true},"idMappings":{
            "uidmap":[{"container_id":0,"host_id":1001,"size":1},{"container_id":1,"host_id":100000,"size":65536}],
            "gidmap":[{"container_id":0,"host_id":1001,"size":1},{"container_id":1,"host_id":100000,"size":65536}]}}}"#;
        let h = parse_host_info(rootless).unwrap();
        assert!(h.rootless && h.subordinate_ids);
        // No /etc/subuid range: podman maps the user alone.
        let single = r#"{"host":{"security":{"rootless":true},"idMappings":{
            "uidmap":[{"container_id":0,"host_id":1001,"size":1}],
            "gidmap":[{"container_id":0,"host_id":1001,"size":1}]}}}"#;
        let h = parse_host_info(single).unwrap();
        assert!(h.rootless && !h.subordinate_ids);
        let rootful = r#"{"host":{"security":{"rootless":false},"idMappings":{},
            "remoteSocket":{"path":"unix:///run/podman/podman.sock"}},
            "store":{"graphRoot":"/srv/storage","runRoot":"/run/containers/storage",
            "volumePath":"/srv/storage/volumes","configFile":"/etc/containers/storage.conf"}}"#;
        let h = parse_host_info(rootful).unwrap();
        assert!(!h.rootless);
        assert_eq!(
            h.paths,
            [
                "/srv/storage",
                "/run/containers/storage",
                "/srv/storage/volumes",
                "/etc/containers/storage.conf",
                "/run/podman/podman.sock"
            ]
            .map(PathBuf::from)
        );
        // A project at or around storage.conf's graphroot is refused once podman has named it.
        assert!(workdir::check_podman_paths(Path::new("/srv"), &h.paths).is_err());
        assert!(workdir::check_podman_paths(Path::new("/srv/storage/x"), &h.paths).is_err());
        assert!(workdir::check_podman_paths(Path::new("/srv/project"), &h.paths).is_ok());
        // storage.conf's additional image stores (reviewer Z: a project holding one could change the
        // images later sessions run) and any other path among the driver's options.
        let stores = rootful.replace(
            r#""store":{"#,
            r#""store":{"graphOptions":{"overlay.imagestore":"/srv/images,/srv/more",
                "overlay.mount_program":{"Executable":"/usr/bin/fuse-overlayfs","Package":"x"}},"#,
        );
        let h = parse_host_info(&stores).unwrap();
        for p in ["/srv/images", "/srv/more", "/usr/bin/fuse-overlayfs"] {
            assert!(h.paths.contains(&PathBuf::from(p)), "{p}: {:?}", h.paths);
        }
        assert!(workdir::check_podman_paths(Path::new("/srv/images/p"), &h.paths).is_err());
        // A remote podman is refused, whatever it says of its mode.
        let remote = rootful.replace(r#""host":{"#, r#""host":{"serviceIsRemote":true,"#);
        assert!(parse_host_info(&remote).unwrap().remote);
        let err = check_host(Ok(remote), false, Path::new("/srv/project")).unwrap_err();
        assert!(format!("{err:#}").contains("remote service"), "{err:#}");
        let err = parse_host_info("not json").unwrap_err();
        assert!(
            format!("{err:#}").starts_with("cannot parse `podman info --format json`: "),
            "{err:#}"
        );
    }

    #[test]
    fn a_project_inside_a_running_sessions_is_refused() {
        let live = [PathBuf::from("/home/me/src"), PathBuf::from("/srv/a/b")];
        for inside in ["/home/me/src/proj", "/home/me/src/a/b/c", "/srv/a/b/x"] {
            let err = refuse_inside(Path::new(inside), &live).unwrap_err();
            assert!(
                format!("{err:#}")
                    .contains("the project directory of a running agent-sandbox session"),
                "{err:#}"
            );
        }
        // The same project, one containing a running session's, a sibling, a name prefix: no risk.
        for fine in [
            "/home/me/src",
            "/home/me",
            "/home/me/srcx",
            "/srv/a",
            "/srv/a/bb",
        ] {
            assert!(refuse_inside(Path::new(fine), &live).is_ok(), "{fine}");
        }
        assert!(refuse_inside(Path::new("/home/me/src/proj"), &[]).is_ok());
        // A project whose path is not valid UTF-8 comes back from podman's JSON with U+FFFD in its
        // label: what is inside it is still refused.
        use std::os::unix::ffi::OsStrExt as _;
        let outer = std::ffi::OsStr::from_bytes(b"/home/me/src/caf\xe9");
        let label = PathBuf::from(outer.to_string_lossy().into_owned());
        let inside = Path::new(outer).join("sub");
        assert!(refuse_inside(&inside, std::slice::from_ref(&label)).is_err());
        assert!(refuse_inside(Path::new(outer), &[label]).is_ok());
        // A listing podman could not give, or that cannot be read: refused, saying why.
        let err =
            refuse_inside_a_live_session(Path::new("/home/me/p"), &Err(PodmanError::NotInstalled))
                .unwrap_err();
        assert!(
            format!("{err:#}").contains("cannot list the running sessions"),
            "{err:#}"
        );
        assert!(
            refuse_inside_a_live_session(Path::new("/home/me/p"), &Ok("garbage".into())).is_err()
        );
        assert!(refuse_inside_a_live_session(Path::new("/home/me/p"), &Ok("[]".into())).is_ok());
    }

    #[test]
    fn the_checked_project_must_still_be_there() {
        struct Removed(PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = fs::remove_dir_all(&self.0);
            }
        }
        let base = std::env::temp_dir().join(format!("as-checked-{}", std::process::id()));
        let _removed = Removed(base.clone());
        let project = base.join("proj");
        fs::create_dir_all(&project).unwrap();
        let other = base.join("other");
        fs::create_dir_all(&other).unwrap();
        let project = project.canonicalize().unwrap();
        let meta = fs::metadata(&project).unwrap();
        let checked = Checked {
            project: project.clone(),
            policy: Policy::new(&Allowlist::parse("", "test").unwrap()),
            user: SandboxUser {
                mapping: crate::podman::UserMapping::KeepId,
                passwd_entry: None,
                home: PathBuf::from("/home/me"),
                host_uid: 1000,
            },
            project_id: (meta.dev(), meta.ino()),
            host: HostCheck {
                state: HostState::Done(Ok(Vec::new())),
                rootless: true,
            },
        };
        assert!(checked.still_the_checked_project().is_ok());
        // Swapped for a symlink to another directory.
        fs::rename(&project, base.join("moved")).unwrap();
        std::os::unix::fs::symlink(&other, &project).unwrap();
        let err = checked.still_the_checked_project().unwrap_err();
        assert!(
            format!("{err:#}").contains("changed while the session"),
            "{err:#}"
        );
        // Replaced by another directory of the same name.
        fs::remove_file(&project).unwrap();
        fs::create_dir(&project).unwrap();
        assert!(checked.still_the_checked_project().is_err());
        // Moved back: the same directory again.
        fs::remove_dir(&project).unwrap();
        fs::rename(base.join("moved"), &project).unwrap();
        assert!(checked.still_the_checked_project().is_ok());
    }
}
