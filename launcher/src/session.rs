//! One sandbox session: checks, topology, the command, the report, cleanup.
//!
//! ```text
//! checks (directory, allowlist, podman, images)       nothing is created before these pass
//!   (the read-only podman queries run at once: podman's start-up is most of a session's start time)
//! stale sessions removed · egress network and home volume ensured
//! session network (--internal --disable-dns) ─ router at .2 ─ pod (--dns router) ─ forwarder ─ sandbox
//! report of refused names · pod, router, network and session files removed, on every way out
//! ```
//!
//! Each step is a function below ([`check`], [`prepare_shared`], [`start`], [`run_command`],
//! [`report_refusals`]). Objects are recorded in a [`Cleanup`] as soon as they exist, so an error, a
//! signal or a panic at any step removes exactly what this session created.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io::{IsTerminal as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use agent_sandbox_shared::{Allowlist, Policy, SessionPlan};

use crate::liveness;
use crate::podman::{
    args, ForwarderSpec, NetworkSpec, PodSpec, Podman, PodmanError, RouterSpec, SandboxSpec,
    SessionLabels, UserMapping, LABEL_SESSION,
};
use crate::report;
use crate::settings::{Settings, EGRESS_NETWORK, EMBEDDED_ALLOWLIST, PACKAGED_ALLOWLIST};
use crate::signals::SignalWatch;
use crate::workdir;

/// Environment variables handed to the sandboxed command when set (values never go on a command line).
pub const PASS_ENV: &[&str] = &[
    "TERM",
    "COLORTERM",
    "LANG",
    "LC_ALL",
    "TZ",
    "ANTHROPIC_API_KEY",
];

/// How long the router and forwarder may take to report their listeners.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prefix of every object name; the session id follows.
const NAME_PREFIX: &str = "agent-sandbox-";

/// Prints a launcher message on stderr.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr(), "agent-sandbox: {}", format_args!($($t)*));
    }};
}

/// Runs `command` in a new session; returns its exit status for the launcher to exit with.
pub fn run(
    podman: &Podman,
    settings: &Settings,
    command: Vec<OsString>,
    signals: &SignalWatch,
) -> anyhow::Result<i32> {
    let (checked, probes) = check(podman, settings)?;
    interrupted(signals)?;
    let shared = prepare_shared(podman, settings, &checked, probes)?;
    interrupted(signals)?;
    let mut cleanup = Cleanup::new(podman.clone());
    let session = start(podman, settings, &checked, &shared, &mut cleanup, signals)?;
    let status = run_command(
        podman, settings, checked, &shared, &session, command, signals,
    )?;
    report_refusals(podman, &session.router, &settings.allowlist);
    cleanup.run();
    Ok(exit_code(status))
}

/// What the checks established.
struct Checked {
    /// The canonical project directory.
    project: PathBuf,
    /// The allowlist, compiled.
    policy: Policy,
    /// Who the sandbox user is.
    user: SandboxUser,
}

/// Step 1: the checks. Nothing is created here but the user's allowlist (copied from the default).
fn check(podman: &Podman, settings: &Settings) -> anyhow::Result<(Checked, SharedProbes)> {
    let project = std::env::current_dir()
        .context("cannot read the current directory")?
        .canonicalize()
        .context("cannot resolve the current directory")?;
    let locations = workdir::allowlist_locations(&settings.allowlist).with_context(|| {
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

    let probes = Probes::gather(podman, settings);
    let host = preflight(probes.info)?;
    // podman's own idea of its storage (storage.conf may move it from the default places checked above).
    let podman_paths = host
        .paths
        .iter()
        .map(|p| workdir::canonicalize_lenient(p))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot resolve podman's storage directories")?;
    workdir::check_podman_paths(&project, &podman_paths)?;
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
    let user = sandbox_user(&host, &project, &settings.home)?;
    let checked = Checked {
        project,
        policy,
        user,
    };
    Ok((checked, probes.shared))
}

/// Read-only podman queries, made at once before any check decides: each podman call costs 20–200 ms
/// of start-up, and in sequence they were a third of a session's start time. Nothing is created here.
struct Probes {
    /// `podman info --format json`.
    info: Result<String, PodmanError>,
    /// Whether both images are in local storage (false also when podman could not say: the images are
    /// then checked one by one, with podman's error).
    images_present: bool,
    /// What the shared objects look like, for [`prepare_shared`].
    shared: SharedProbes,
}

/// The shared objects as probed; an `Err` means missing or unknown, and [`prepare_shared`] takes the
/// careful path (check, create, inspect) for it.
struct SharedProbes {
    /// `podman network ls` of session networks: every session object (the session directory included)
    /// is created after its network and removed before it, so a dead session always leaves its network
    /// behind.
    session_networks: Result<String, PodmanError>,
    /// `podman network inspect` of the egress network.
    egress: Result<String, PodmanError>,
    /// The home volume's mount point.
    volume: Result<String, PodmanError>,
}

impl Probes {
    fn gather(podman: &Podman, settings: &Settings) -> Probes {
        std::thread::scope(|s| {
            let info = s.spawn(|| podman.run(&args::info()));
            let images = s.spawn(|| {
                podman
                    .run(&args::image_ids(&[&settings.router_image, &settings.image]))
                    .is_ok()
            });
            let networks = s.spawn(|| podman.run(&args::network_ls_sessions()));
            let egress = s.spawn(|| podman.run(&args::network_inspect(EGRESS_NETWORK)));
            let volume = podman.run(&args::volume_mountpoint(&settings.home_volume));
            Probes {
                info: join(info),
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
    }
}

/// What the shared objects contribute to a session.
struct Shared {
    /// The router's resolvers (podman's DNS on the egress network).
    resolvers: Vec<SocketAddr>,
    /// Whether the home volume must be re-owned to the sandbox user when mounted.
    chown_home: bool,
}

/// Step 2: leftovers of dead sessions removed; the egress network and the home volume ensured. The three
/// are independent of each other.
fn prepare_shared(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    probes: SharedProbes,
) -> anyhow::Result<Shared> {
    let (stale, resolvers, chown_home) = std::thread::scope(|s| {
        let stale = s.spawn(|| match &probes.session_networks {
            Ok(listing) if !any_stale(listing)? => Ok(()),
            _ => remove_stale_sessions(podman),
        });
        let egress = s.spawn(|| ensure_egress_network(podman, probes.egress));
        let volume = ensure_home_volume(
            podman,
            &settings.home_volume,
            checked.user.host_uid,
            probes.volume,
        );
        (join(stale), join(egress), volume)
    });
    stale?;
    Ok(Shared {
        resolvers: resolvers?,
        chown_home: chown_home?,
    })
}

/// A started session: everything the command's container needs.
struct Session {
    /// Labels for the sandbox container.
    labels: SessionLabels,
    /// Prefix of the session's object names.
    base: String,
    /// The pod.
    pod: String,
    /// The router container.
    router: String,
    /// The session's /etc/hosts.
    hosts: PathBuf,
    /// The session's /etc/resolv.conf.
    resolv: PathBuf,
}

/// Step 3: the session network, the router, the pod and the forwarder, recorded in `cleanup` as they
/// come into existence; returns once the router and the forwarder listen.
fn start(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    shared: &Shared,
    cleanup: &mut Cleanup,
    signals: &SignalWatch,
) -> anyhow::Result<Session> {
    let session = new_session_id()?;
    let labels = SessionLabels {
        session: session.clone(),
        pid: std::process::id(),
        start: liveness::start_time(std::process::id())
            .context("cannot read this process's start time from /proc")?,
        boot: liveness::boot_id().context("cannot read the boot id from /proc")?,
        project: checked.project.clone(),
    };
    let base = format!("{NAME_PREFIX}{session}");

    let dir = session_dir(&session);
    // The network first and the directory after it (and removed before it): a launcher killed at any
    // point leaves its network behind, which the next start finds, and with it the directory.
    let network = base.clone();
    podman.run(&args::network_create_session(&NetworkSpec {
        name: network.clone(),
        labels: labels.clone(),
    }))?;
    cleanup.network = Some(network.clone());
    cleanup.dir = Some(dir.clone());
    create_session_dir(&dir)?;
    let router_ip = router_address(&podman.run(&args::network_inspect(&network))?)
        .with_context(|| format!("cannot pick the router's address on network {network}"))?;
    let mut plan = SessionPlan::new(&checked.policy, router_ip)?;
    plan.router.resolvers.clone_from(&shared.resolvers);
    plan.router.allowlist = Some(settings.allowlist.display().to_string());

    let config = dir.join("router.toml");
    write_file(&config, &plan.router.to_toml())?;
    let hosts = dir.join("hosts");
    // IPv4 only: IPv6 is disabled in the pod's netns, so ::1 does not exist there.
    write_file(&hosts, "127.0.0.1\tlocalhost\n")?;
    let resolv = dir.join("resolv.conf");
    write_file(&resolv, &format!("nameserver {router_ip}\n"))?;
    interrupted(signals)?;

    // The router and the pod side start at once: the forwarder connects to the router per connection,
    // so neither waits for the other; both are checked for readiness below.
    let router = format!("{base}-router");
    let pod = base.clone();
    let forwarder = format!("{base}-forwarder");
    cleanup.router = Some(router.clone());
    cleanup.pod = Some(pod.clone());
    let relays = plan.forwarder_args();
    let router_spec = RouterSpec {
        name: router.clone(),
        labels: labels.clone(),
        image: settings.router_image.clone(),
        session_network: network.clone(),
        session_ip: router_ip,
        egress_network: EGRESS_NETWORK.to_owned(),
        config_file: config,
    };
    let pod_spec = PodSpec {
        name: pod.clone(),
        labels: labels.clone(),
        network,
        dns: router_ip,
        user: checked.user.mapping.clone(),
    };
    let forwarder_spec = ForwarderSpec {
        name: forwarder.clone(),
        labels: labels.clone(),
        pod: pod.clone(),
        image: settings.router_image.clone(),
        relays: relays.clone(),
    };
    let (router_started, pod_started) = std::thread::scope(|s| {
        let r = s.spawn(|| podman.run(&args::router_run(&router_spec)));
        let p = podman.run(&args::pod_create(&pod_spec)).and_then(|_| {
            if relays.is_empty() {
                Ok(String::new())
            } else {
                podman.run(&args::forwarder_run(&forwarder_spec))
            }
        });
        (join(r), p)
    });
    router_started?;
    pod_started?;
    interrupted(signals)?;

    // Ready means every listener is bound: DNS must answer, and the forwarder must hold its addresses
    // before the sandboxed command could bind them itself (ports above 1023 need no capability).
    let mut router_addrs: Vec<String> = [
        plan.router.listen.dns,
        plan.router.listen.http,
        plan.router.listen.https,
    ]
    .into_iter()
    .flatten()
    .map(|a| a.to_string())
    .collect();
    router_addrs.extend(plan.router.forwards.iter().map(|f| f.listen.to_string()));
    let listens: Vec<String> = plan.relays.iter().map(|r| r.listen.to_string()).collect();
    let (router_ready, forwarder_ready) = std::thread::scope(|s| {
        let f = s.spawn(|| {
            if listens.is_empty() {
                Ok(())
            } else {
                wait_listening(podman, &forwarder, &listens, signals)
            }
        });
        let r = wait_listening(podman, &router, &router_addrs, signals);
        (r, join(f))
    });
    router_ready?;
    forwarder_ready?;
    interrupted(signals)?;
    Ok(Session {
        labels,
        base,
        pod,
        router,
        hosts,
        resolv,
    })
}

/// Step 4: the command, in the pod, with the launcher's terminal or pipes; signals are passed on to it.
fn run_command(
    podman: &Podman,
    settings: &Settings,
    checked: Checked,
    shared: &Shared,
    session: &Session,
    command: Vec<OsString>,
    signals: &SignalWatch,
) -> anyhow::Result<ExitStatus> {
    let spec = SandboxSpec {
        name: format!("{}-sandbox", session.base),
        labels: session.labels.clone(),
        pod: session.pod.clone(),
        image: settings.image.clone(),
        user: checked.user.mapping,
        passwd_entry: checked.user.passwd_entry,
        project: checked.project,
        home_volume: settings.home_volume.clone(),
        home: checked.user.home,
        chown_home: shared.chown_home,
        hosts_file: session.hosts.clone(),
        resolv_file: session.resolv.clone(),
        tty: std::io::stdin().is_terminal(),
        pass_env: PASS_ENV.iter().map(|s| (*s).to_owned()).collect(),
        command,
    };
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
    let mut child = podman.spawn_foreground(&args::sandbox_run(&spec))?;
    signals.set_child(Some(child.id()));
    signals.forward_pending();
    let status = child.wait();
    signals.set_child(None);
    status.context("waiting for the sandbox's podman run")
}

/// Step 5: what the router refused, from its log (nothing when nothing was refused).
fn report_refusals(podman: &Podman, router: &str, allowlist: &Path) {
    if let Ok(out) = podman.output(&args::logs(router)) {
        let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stderr));
        if let Some(text) =
            report::render(&report::refusals(&log), allowlist, report::truncated(&log))
        {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
}

/// The launcher's exit code for the command's status: its code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// A signal arrived during setup: stop here (the caller's cleanup removes what exists).
#[derive(Debug, thiserror::Error)]
#[error("interrupted by signal {0} while starting the session; removed what was created")]
pub struct Interrupted(pub i32);

fn interrupted(signals: &SignalWatch) -> Result<(), Interrupted> {
    match signals.received() {
        Some(sig) => Err(Interrupted(sig)),
        None => Ok(()),
    }
}

/// Copies the default allowlist to `path` if nothing is there, and says so.
fn ensure_allowlist(path: &Path) -> anyhow::Result<()> {
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

/// What podman says about the host.
#[derive(Debug)]
struct HostInfo {
    /// Rootless podman (the product's mode) or rootful.
    rootless: bool,
    /// More ids than the user's own are mapped (rootless only).
    subordinate_ids: bool,
    /// podman's storage, runtime and configuration paths as it reports them (graphRoot, runRoot,
    /// volumePath, the storage configuration file, its API socket).
    paths: Vec<PathBuf>,
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
    let info: serde_json::Value =
        serde_json::from_str(json).context("cannot parse `podman info --format json`")?;
    let host = &info["host"];
    let mapped = |key: &str| -> u64 {
        host["idMappings"][key]
            .as_array()
            .map(|m| m.iter().filter_map(|e| e["size"].as_u64()).sum())
            .unwrap_or(0)
    };
    let store = &info["store"];
    let paths = [
        &store["graphRoot"],
        &store["runRoot"],
        &store["volumePath"],
        &store["configFile"],
        &host["remoteSocket"]["path"],
    ]
    .into_iter()
    .filter_map(|v| v.as_str())
    .map(|s| PathBuf::from(s.strip_prefix("unix://").unwrap_or(s)))
    .filter(|p| p.is_absolute())
    .collect();
    Ok(HostInfo {
        rootless: host["security"]["rootless"].as_bool().unwrap_or(false),
        subordinate_ids: mapped("uidmap") > 1 && mapped("gidmap") > 1,
        paths,
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

/// Joins a scoped thread, passing its panic on.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The sandbox user, its home inside the container and the host uid that should own the home volume.
#[derive(Debug)]
struct SandboxUser {
    mapping: UserMapping,
    passwd_entry: Option<String>,
    home: PathBuf,
    host_uid: u32,
}

/// Rootless: keep-id, so the sandbox user is you (same uid, name and home path). Rootful podman refuses
/// keep-id, and a user namespace that maps a non-root sandbox user to the invoking user breaks podman
/// 4's overlay storage, so rootful runs without a user namespace as the invoking user: the sudo user
/// when run through sudo, else the owner of the project directory. When that is root, the sandbox user
/// is root with no capabilities and nested podman is not available; rootless is the supported mode.
fn sandbox_user(host: &HostInfo, project: &Path, home: &Path) -> anyhow::Result<SandboxUser> {
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let entry = |name: &str, uid: u32, gid: u32, home: &Path| {
        Some(format!(
            "{name}:*:{uid}:{gid}:{name}:{}:/bin/bash",
            home.display()
        ))
    };
    if host.rootless {
        let name = passwd_lookup(uid)
            .map(|(n, _)| n)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "sandbox".to_owned());
        return Ok(SandboxUser {
            mapping: UserMapping::KeepId,
            passwd_entry: entry(&name, uid, gid, home),
            home: home.to_owned(),
            host_uid: uid,
        });
    }
    let sudo = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    let (uid, gid) = match (sudo("SUDO_UID"), sudo("SUDO_GID")) {
        (Some(u), Some(g)) if u != 0 => (u, g),
        _ => {
            let meta = fs::metadata(project)
                .with_context(|| format!("cannot stat {}", project.display()))?;
            (meta.uid(), meta.gid())
        }
    };
    if uid == 0 {
        say!(
            "podman is rootful and {} belongs to root: the sandbox runs as root without capabilities, \
             and nested podman is not available. Rootless podman is the supported mode.",
            project.display()
        );
        return Ok(SandboxUser {
            mapping: UserMapping::Host { uid: 0, gid: 0 },
            passwd_entry: None,
            home: PathBuf::from("/root"),
            host_uid: 0,
        });
    }
    let (name, home) = passwd_lookup(uid).unwrap_or_else(|| {
        (
            "sandbox".to_owned(),
            PathBuf::from(format!("/home/sandbox-{uid}")),
        )
    });
    Ok(SandboxUser {
        mapping: UserMapping::Host { uid, gid },
        passwd_entry: entry(&name, uid, gid, &home),
        home,
        host_uid: uid,
    })
}

/// The name and home of a uid from /etc/passwd.
fn passwd_lookup(uid: u32) -> Option<(String, PathBuf)> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 7 && f[2].parse::<u32>().ok()? == uid && !f[5].is_empty())
            .then(|| (f[0].to_owned(), PathBuf::from(f[5])))
    })
}

/// Creates the egress network unless it exists (another session may create it at the same moment),
/// and returns the resolver the router should use: podman's DNS server on that network (at its
/// gateway), which answers for the network's containers and forwards everything else to the host's
/// resolvers. Naming it explicitly matters: the router's resolv.conf also lists the host's resolvers,
/// which answer NXDOMAIN for names that only podman knows, and which one answers first is luck.
fn ensure_egress_network(
    podman: &Podman,
    probed: Result<String, PodmanError>,
) -> anyhow::Result<Vec<SocketAddr>> {
    if let Ok(inspect) = probed {
        return Ok(network_dns_servers(&inspect));
    }
    if !podman.check(&args::network_exists(EGRESS_NETWORK))? {
        if let Err(e) = podman.run(&args::network_create_egress(EGRESS_NETWORK)) {
            if !podman.check(&args::network_exists(EGRESS_NETWORK))? {
                return Err(e.into());
            }
        }
    }
    let inspect = podman.run(&args::network_inspect(EGRESS_NETWORK))?;
    Ok(network_dns_servers(&inspect))
}

/// The DNS servers podman runs for a network: port 53 on each gateway, if DNS is enabled on it.
fn network_dns_servers(inspect_json: &str) -> Vec<SocketAddr> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(inspect_json) else {
        return Vec::new();
    };
    let net = if v.is_array() { &v[0] } else { &v };
    if net["dns_enabled"] != serde_json::Value::Bool(true) {
        return Vec::new();
    }
    net["subnets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["gateway"].as_str()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Creates the home volume unless it exists; returns whether it must be re-owned to `uid` on mount
/// (podman's `:U` is recursive, so only when its top directory is not already theirs).
fn ensure_home_volume(
    podman: &Podman,
    name: &str,
    uid: u32,
    probed: Result<String, PodmanError>,
) -> anyhow::Result<bool> {
    let mountpoint = match probed {
        Ok(mountpoint) => mountpoint,
        Err(_) => {
            if !podman.check(&args::volume_exists(name))? {
                if let Err(e) = podman.run(&args::volume_create(name)) {
                    if !podman.check(&args::volume_exists(name))? {
                        return Err(e.into());
                    }
                }
            }
            podman.run(&args::volume_mountpoint(name))?
        }
    };
    Ok(match fs::metadata(mountpoint.trim()) {
        Ok(meta) => meta.uid() != uid,
        // Not visible from here (another volume driver): let podman make it right.
        Err(_) => true,
    })
}

/// A random session id: 12 hex digits from the kernel's generator.
fn new_session_id() -> anyhow::Result<String> {
    let mut bytes = [0u8; 6];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("cannot read /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The directory for the session's router configuration, hosts and resolv.conf, in [`sessions_root`].
fn session_dir(session: &str) -> PathBuf {
    sessions_root().join(format!("{NAME_PREFIX}{session}"))
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
        std::env::temp_dir(),
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
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid {
        bail!(
            "{} is not a directory of yours: remove it, or set XDG_RUNTIME_DIR to your runtime directory",
            dir.display()
        );
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot set permissions on {}", dir.display()))?;
    }
    Ok(())
}

/// Creates the session's directory (mode 0700, in a 0700 [`sessions_root`]).
fn create_session_dir(dir: &Path) -> anyhow::Result<()> {
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
fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
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

/// The router's address: the second host address of the session network's subnet (the first is the
/// gateway's by convention, even where an internal network has none), skipping the gateway if podman
/// put it there.
fn router_address(inspect_json: &str) -> anyhow::Result<Ipv4Addr> {
    let v: serde_json::Value =
        serde_json::from_str(inspect_json).context("cannot parse `podman network inspect`")?;
    let net = if v.is_array() { &v[0] } else { &v };
    let subnets = net["subnets"]
        .as_array()
        .context("the network has no subnets")?;
    for s in subnets {
        let Some((addr, prefix)) = s["subnet"].as_str().and_then(|s| s.split_once('/')) else {
            continue;
        };
        let (Ok(addr), Ok(prefix)) = (addr.parse::<Ipv4Addr>(), prefix.parse::<u32>()) else {
            continue; // IPv6
        };
        if prefix > 29 {
            bail!("subnet {addr}/{prefix} is too small");
        }
        let gateway = s["gateway"]
            .as_str()
            .and_then(|g| g.parse::<Ipv4Addr>().ok());
        let base = u32::from(addr) & (u32::MAX << (32 - prefix));
        let candidate = [base + 2, base + 3]
            .into_iter()
            .map(Ipv4Addr::from)
            .find(|ip| Some(*ip) != gateway)
            .context("no free address")?;
        return Ok(candidate);
    }
    bail!("the network has no IPv4 subnet")
}

/// Waits until a detached container has logged `listening on ADDR` for every address; fails with its
/// log if it exits first.
fn wait_listening(
    podman: &Podman,
    container: &str,
    addrs: &[String],
    signals: &SignalWatch,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut delay = Duration::from_millis(20);
    loop {
        interrupted(signals)?;
        let out = podman.output(&args::logs(container))?;
        let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stderr));
        let ready = addrs.iter().all(|a| {
            let needle = format!("{}{a}", agent_sandbox_shared::logs::LISTENING_ON);
            log.lines().any(|l| {
                l.split(needle.as_str())
                    .nth(1)
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
            })
        });
        if ready {
            return Ok(());
        }
        let state = podman.run(&args::container_state(container))?;
        if state.trim_start().starts_with("false") {
            bail!(
                "{container} stopped while starting (exit {}):\n{}",
                state.split_whitespace().nth(1).unwrap_or("?"),
                log.trim_end()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{container} did not report all its listeners within {}s:\n{}",
                READY_TIMEOUT.as_secs(),
                log.trim_end()
            );
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

/// Removes what a session created. Recorded as objects come into existence; runs once, on the normal
/// path or from Drop on every other way out.
#[derive(Debug)]
pub struct Cleanup {
    podman: Podman,
    pod: Option<String>,
    router: Option<String>,
    network: Option<String>,
    dir: Option<PathBuf>,
}

impl Cleanup {
    fn new(podman: Podman) -> Cleanup {
        Cleanup {
            podman,
            pod: None,
            router: None,
            network: None,
            dir: None,
        }
    }

    /// Removes everything recorded; failures are reported, not fatal (the next start retries them as
    /// stale objects).
    pub fn run(&mut self) {
        let podman = &self.podman;
        let attempt = |what: &str, argv: Vec<OsString>| match podman.run(&argv) {
            Ok(_) => {}
            Err(e) if is_missing(&e) => {}
            Err(e) => say!("could not remove {what}: {e}"),
        };
        let (pod, router) = (self.pod.take(), self.router.take());
        std::thread::scope(|s| {
            if let Some(pod) = &pod {
                s.spawn(|| attempt("the pod", args::pod_rm(pod)));
            }
            if let Some(router) = &router {
                attempt("the router", args::rm(router));
            }
        });
        // The directory before the network (see `start`).
        if let Some(dir) = self.dir.take() {
            let _ = fs::remove_dir_all(dir);
        }
        if let Some(network) = self.network.take() {
            attempt("the session network", args::network_rm(&network));
        }
    }
}

/// podman's answer for an object that does not exist (any more): nothing to remove.
fn is_missing(e: &PodmanError) -> bool {
    matches!(e, PodmanError::Failed { stderr, .. }
        if stderr.contains("no such") || stderr.contains("not found") || stderr.contains("unable to find"))
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.run();
    }
}

/// One object of some session, as listed by podman.
#[derive(Debug)]
struct Listed {
    kind: Kind,
    name: String,
    labels: HashMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pod,
    Container,
    Network,
}

/// Whether a listing of session networks holds one whose launcher is gone.
fn any_stale(networks_json: &str) -> anyhow::Result<bool> {
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    Ok(parse_listing(Kind::Network, networks_json)
        .iter()
        .any(|o| o.labels.contains_key(LABEL_SESSION) && !liveness::is_live(&o.labels, &boot)))
}

/// Finds objects of sessions whose launcher is gone and removes them (pods, then containers, then
/// networks). Objects of live sessions are never touched.
fn remove_stale_sessions(podman: &Podman) -> anyhow::Result<()> {
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    let mut objects = Vec::new();
    for (kind, argv) in [
        (Kind::Pod, args::pod_ps_sessions()),
        (Kind::Container, args::ps_sessions()),
        (Kind::Network, args::network_ls_sessions()),
    ] {
        objects.extend(parse_listing(kind, &podman.run(&argv)?));
    }
    let mut stale: BTreeMap<String, Vec<&Listed>> = BTreeMap::new();
    for o in &objects {
        let Some(session) = o.labels.get(LABEL_SESSION) else {
            continue;
        };
        if !liveness::is_live(&o.labels, &boot) {
            stale.entry(session.clone()).or_default().push(o);
        }
    }
    for (session, mut list) in stale {
        list.sort_by_key(|o| o.kind);
        say!(
            "removing {} object(s) left by session {session}, whose launcher is gone",
            list.len()
        );
        // The session directory before the network, as in `Cleanup::run`: should this launcher die
        // midway, the network is still there for the next start to find. The name comes from a label:
        // only ever a session id of ours.
        if session.len() == 12 && session.chars().all(|c| c.is_ascii_hexdigit()) {
            let _ = fs::remove_dir_all(session_dir(&session));
        }
        for o in list {
            let argv = match o.kind {
                Kind::Pod => args::pod_rm(&o.name),
                Kind::Container => args::rm(&o.name),
                Kind::Network => args::network_rm(&o.name),
            };
            match podman.run(&argv) {
                Ok(_) => {}
                // Gone already (removed with its pod or network).
                Err(e) if is_missing(&e) => {}
                Err(e) => say!("could not remove {}: {e}", o.name),
            }
        }
    }
    Ok(())
}

/// Parses `podman {pod ps,ps,network ls} --format json`; field names differ in case between them.
fn parse_listing(kind: Kind, json: &str) -> Vec<Listed> {
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str::<serde_json::Value>(json)
    else {
        return Vec::new();
    };
    let field = |o: &serde_json::Value, names: &[&str]| -> serde_json::Value {
        names
            .iter()
            .map(|n| o[*n].clone())
            .find(|v| !v.is_null())
            .unwrap_or(serde_json::Value::Null)
    };
    items
        .iter()
        .filter_map(|o| {
            let name = match field(o, &["Names", "Name", "name"]) {
                serde_json::Value::String(s) => s,
                serde_json::Value::Array(a) => a.first()?.as_str()?.to_owned(),
                _ => return None,
            };
            let labels = field(o, &["Labels", "labels"])
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default();
            Some(Listed { kind, name, labels })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_address_is_the_second_host() {
        let inspect = r#"[{"name":"n","subnets":[{"subnet":"10.89.3.0/24"}],"internal":true}]"#;
        assert_eq!(
            router_address(inspect).unwrap(),
            Ipv4Addr::new(10, 89, 3, 2)
        );
        let with_gw = r#"[{"subnets":[{"subnet":"10.89.3.0/24","gateway":"10.89.3.2"}]}]"#;
        assert_eq!(
            router_address(with_gw).unwrap(),
            Ipv4Addr::new(10, 89, 3, 3)
        );
        let v6_first = r#"[{"subnets":[{"subnet":"fd00::/64"},{"subnet":"10.0.5.16/28","gateway":"10.0.5.17"}]}]"#;
        assert_eq!(
            router_address(v6_first).unwrap(),
            Ipv4Addr::new(10, 0, 5, 18)
        );
        assert!(router_address(r#"[{"subnets":[]}]"#).is_err());
        assert!(router_address(r#"[{"subnets":[{"subnet":"10.0.0.0/30"}]}]"#).is_err());
    }

    #[test]
    fn egress_dns_is_podmans_resolver_at_the_gateway() {
        let inspect = r#"[{"name":"agent-sandbox-egress","subnets":[{"subnet":"10.89.0.0/24","gateway":"10.89.0.1"}],"dns_enabled":true}]"#;
        assert_eq!(
            network_dns_servers(inspect),
            ["10.89.0.1:53".parse::<SocketAddr>().unwrap()]
        );
        let no_dns = r#"[{"subnets":[{"subnet":"10.89.0.0/24","gateway":"10.89.0.1"}],"dns_enabled":false}]"#;
        assert!(network_dns_servers(no_dns).is_empty());
        assert!(network_dns_servers("garbage").is_empty());
    }

    #[test]
    fn listings_of_all_three_kinds() {
        let pods = r#"[{"Name":"agent-sandbox-a","Labels":{"agent-sandbox.session":"a"}}]"#;
        let ctrs =
            r#"[{"Names":["agent-sandbox-a-router"],"Labels":{"agent-sandbox.session":"a"}}]"#;
        let nets = r#"[{"name":"agent-sandbox-a","labels":{"agent-sandbox.session":"a"}}]"#;
        for (kind, json, name) in [
            (Kind::Pod, pods, "agent-sandbox-a"),
            (Kind::Container, ctrs, "agent-sandbox-a-router"),
            (Kind::Network, nets, "agent-sandbox-a"),
        ] {
            let l = parse_listing(kind, json);
            assert_eq!(l.len(), 1);
            assert_eq!(l[0].name, name);
            assert_eq!(l[0].labels[LABEL_SESSION], "a");
        }
        assert!(parse_listing(Kind::Pod, "null").is_empty());
    }

    #[test]
    fn a_session_network_of_a_dead_launcher_is_stale() {
        let me = std::process::id();
        let start = liveness::start_time(me).unwrap();
        let boot = liveness::boot_id().unwrap();
        let net = |pid: u32, start: u64| {
            serde_json::json!([{"name": "agent-sandbox-a", "labels": {
                LABEL_SESSION: "a",
                crate::podman::LABEL_PID: pid.to_string(),
                crate::podman::LABEL_START: start.to_string(),
                crate::podman::LABEL_BOOT: boot,
            }}])
            .to_string()
        };
        assert!(
            !any_stale(&net(me, start)).unwrap(),
            "this process is alive"
        );
        assert!(any_stale(&net(me, start + 1)).unwrap(), "a reused pid");
        assert!(!any_stale("[]").unwrap());
        // Labels this version cannot read: not ours to judge live, so swept.
        assert!(any_stale(r#"[{"name":"x","labels":{"agent-sandbox.session":"a"}}]"#).unwrap());
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
        assert!(parse_host_info("not json").is_err());
    }

    #[test]
    fn exit_codes() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }

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
        // A symlink in place of the root is refused.
        let linked = tmp.join("linked-root");
        std::os::unix::fs::symlink(&runtime, &linked).unwrap();
        assert!(ensure_private_dir(&linked).is_err());
        fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn session_ids_are_random_hex() {
        let a = new_session_id().unwrap();
        assert_eq!(a.len(), 12);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_session_id().unwrap());
    }
}
