//! The argument vectors: one pure function per podman command the launcher runs, from a spec (see
//! `spec.rs`) to the words after `podman`. The security-relevant flags are asserted by the tests below.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{
    ForwarderSpec, NetworkSpec, PodSpec, RouterSpec, SandboxSpec, SessionLabels, UserMapping,
    FORWARDER_LOG_MAX, FORWARDER_PATH, FORWARDER_RELAYS_DIR, FORWARDER_RELAYS_PATH,
    LABEL_DOCTOR_HOME, LABEL_SESSION, LABEL_SHARED, LABEL_VERSION, NO_HOST_ENV, NO_IPV6,
    ROUTER_CONFIG_DIR, ROUTER_CONFIG_PATH, ROUTER_GID, ROUTER_INJECT_DIR, ROUTER_LOG_MAX,
    ROUTER_OAUTH_DIR, ROUTER_UID, SANDBOX_SESSION_CA, STOP_TIMEOUT_SECS, SYSTEM_CA_BUNDLE,
};

/// An argument vector under construction. `opt` keeps a flag and its value together, so each line of
/// a builder below reads like the podman command line it makes.
#[derive(Debug, Default)]
struct Argv(Vec<OsString>);

impl Argv {
    fn new(words: &[&str]) -> Argv {
        Argv(words.iter().map(OsString::from).collect())
    }

    fn arg(&mut self, a: impl Into<OsString>) -> &mut Argv {
        self.0.push(a.into());
        self
    }

    fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(&mut self, items: I) -> &mut Argv {
        self.0.extend(items.into_iter().map(Into::into));
        self
    }

    fn opt(&mut self, flag: &str, value: impl Into<OsString>) -> &mut Argv {
        self.arg(flag).arg(value)
    }

    fn labels(&mut self, labels: &SessionLabels) -> &mut Argv {
        self.args(labels.args())
    }

    fn done(&mut self) -> Vec<OsString> {
        std::mem::take(&mut self.0)
    }
}

/// `SRC:DST` plus options (`:ro`, `:U`), for `--volume`.
fn mount(src: &Path, dst: &Path, opts: &str) -> OsString {
    let mut m = src.as_os_str().to_owned();
    m.push(":");
    m.push(dst.as_os_str());
    m.push(opts);
    m
}

/// Whether `path` can be a `--mount` destination whole: podman reads `--mount` as CSV, so a comma, a
/// double quote or a line break would split it. A mount below the project at such a path is not
/// covered; the project is then bound alone, as with no mount below it.
fn mountable_destination(path: &Path) -> bool {
    !path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'))
}

/// `path` if podman and conmon take it whole as a log path. Podman before 5.0 reads `--log-opt` values
/// as CSV, so a comma or a double quote would break the container's start; conmon gets the driver and
/// the path as `k8s-file:PATH` and cuts at the first colon after the driver, so with a colon it would
/// write elsewhere. None: podman's own place.
#[must_use]
pub fn log_path_podman_takes(path: PathBuf) -> Option<PathBuf> {
    let bytes = path.as_os_str().as_encoded_bytes();
    (!bytes.iter().any(|b| matches!(b, b',' | b'"' | b':'))).then_some(path)
}

/// `--log-opt path=FILE` (where a container's k8s-file log goes), or nothing for podman's own place.
fn log_path_opt(path: Option<&Path>) -> Vec<OsString> {
    path.map(|path| {
        let mut o = OsString::from("path=");
        o.push(path.as_os_str());
        vec!["--log-opt".into(), o]
    })
    .unwrap_or_default()
}

/// `podman info` as JSON: rootless or not, id mappings.
#[must_use]
pub fn info() -> Vec<OsString> {
    Argv::new(&["info", "--format", "json"]).done()
}

/// Exit 0 if the image is in local storage.
#[must_use]
pub fn image_exists(image: &str) -> Vec<OsString> {
    Argv::new(&["image", "exists", image]).done()
}

/// The ids of images in local storage; fails if any is missing.
#[must_use]
pub fn image_ids(images: &[&str]) -> Vec<OsString> {
    Argv::new(&["image", "inspect", "--format", "{{.Id}}"])
        .args(images.iter().copied())
        .done()
}

/// The images' labels and sizes as JSON (`agent-sandbox doctor`: which launcher version built them).
#[must_use]
pub fn image_inspect(images: &[&str]) -> Vec<OsString> {
    Argv::new(&["image", "inspect"])
        .args(images.iter().copied())
        .done()
}

/// `agent-sandbox doctor`'s trial run: can podman start a container here at all? The router image's
/// own `--version`, with no network and nothing it could change.
#[must_use]
pub fn trial_run(image: &str) -> Vec<OsString> {
    Argv::new(&["run", "--rm", "--pull=never"])
        .opt("--network", "none")
        .args(NO_HOST_ENV)
        .arg("--read-only")
        .opt("--cap-drop", "ALL")
        .opt("--security-opt", "no-new-privileges")
        .opt("--log-driver", "none")
        .arg(image)
        .arg("--version")
        .done()
}

/// A container's address on one of its networks (`agent-sandbox doctor`: the router's egress side).
#[must_use]
pub fn container_ip(name: &str, network: &str) -> Vec<OsString> {
    Argv::new(&["container", "inspect"])
        .opt(
            "--format",
            format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        )
        .arg(name)
        .done()
}

/// Fetches a registry image (release builds pin registry images).
#[must_use]
pub fn image_pull(image: &str) -> Vec<OsString> {
    Argv::new(&["pull", image]).done()
}

/// Exit 0 if the network exists.
#[must_use]
pub fn network_exists(name: &str) -> Vec<OsString> {
    Argv::new(&["network", "exists", name]).done()
}

/// The shared egress network: an ordinary bridge with DNS, so the router resolves upstream names
/// (and, in tests, other containers' aliases) through podman's resolver.
#[must_use]
pub fn network_create_egress(name: &str) -> Vec<OsString> {
    Argv::new(&["network", "create"])
        .opt("--label", format!("{LABEL_SHARED}=egress"))
        .arg(name)
        .done()
}

/// The session network: `--internal` (no route out) and `--disable-dns` (no aardvark-dns, which on
/// older podman forwards queries upstream from internal networks too).
#[must_use]
pub fn network_create_session(spec: &NetworkSpec) -> Vec<OsString> {
    Argv::new(&["network", "create", "--internal", "--disable-dns"])
        .labels(&spec.labels)
        .arg(&spec.name)
        .done()
}

/// The network as JSON (subnets, gateways, whether DNS is enabled).
#[must_use]
pub fn network_inspect(name: &str) -> Vec<OsString> {
    Argv::new(&["network", "inspect", name]).done()
}

/// Removes a network and anything still attached to it.
#[must_use]
pub fn network_rm(name: &str) -> Vec<OsString> {
    Argv::new(&["network", "rm", "--force", name]).done()
}

/// Exit 0 if the volume exists.
#[must_use]
pub fn volume_exists(name: &str) -> Vec<OsString> {
    Argv::new(&["volume", "exists", name]).done()
}

/// Creates the home volume (kept between sessions, shared by all of them).
#[must_use]
pub fn volume_create(name: &str) -> Vec<OsString> {
    Argv::new(&["volume", "create"])
        .opt("--label", format!("{LABEL_SHARED}=home"))
        .arg(name)
        .done()
}

/// The doctor's throw-away home volume: new and empty for one self-test, labelled with the launcher
/// that made it, so that a later doctor removes it should that launcher be killed before its cleanup.
#[must_use]
pub fn volume_create_doctor_home(name: &str, labels: &SessionLabels) -> Vec<OsString> {
    Argv::new(&["volume", "create"])
        .labels(labels)
        .opt("--label", format!("{LABEL_DOCTOR_HOME}=1"))
        .arg(name)
        .done()
}

/// The doctor's throw-away home volumes, as JSON.
#[must_use]
pub fn volume_ls_doctor_homes() -> Vec<OsString> {
    Argv::new(&["volume", "ls"])
        .opt("--filter", format!("label={LABEL_DOCTOR_HOME}"))
        .opt("--format", "json")
        .done()
}

/// Removes a volume, and any container still using it.
#[must_use]
pub fn volume_rm(name: &str) -> Vec<OsString> {
    Argv::new(&["volume", "rm", "--force", name]).done()
}

/// The volume's driver, mount options and directory on the host (JSON, `json::VolumeInspect`): to
/// check that it is a plain volume and who owns its directory.
#[must_use]
pub fn volume_inspect(name: &str) -> Vec<OsString> {
    Argv::new(&["volume", "inspect", name]).done()
}

/// The router: on the session network at its fixed address and on the egress network; read-only root
/// filesystem; every capability dropped. It binds 53/80/443 as its non-root image user thanks to
/// `ip_unprivileged_port_start` in its own network namespace, so it needs no capability at all.
#[must_use]
pub fn router_run(spec: &RouterSpec) -> Vec<OsString> {
    let mut a = Argv::new(&["run", "--detach"]);
    a.opt("--name", &spec.name)
        .labels(&spec.labels)
        .arg("--pull=never")
        .opt(
            "--network",
            format!("{}:ip={}", spec.session_network, spec.session_ip),
        )
        .opt("--network", &spec.egress_network)
        .args(NO_HOST_ENV)
        .arg("--read-only")
        .opt("--cap-drop", "ALL")
        .opt("--sysctl", "net.ipv4.ip_unprivileged_port_start=53")
        .opt("--log-driver", "k8s-file")
        .opt("--log-opt", format!("max-size={ROUTER_LOG_MAX}"))
        .args(log_path_opt(spec.log_path.as_deref()))
        .opt("--security-opt", "no-new-privileges")
        .opt("--security-opt", "label=disable")
        .opt(
            "--volume",
            mount(&spec.config_dir, Path::new(ROUTER_CONFIG_DIR), ":ro"),
        );
    if spec.keep_id {
        a.arg(format!(
            "--userns=keep-id:uid={ROUTER_UID},gid={ROUTER_GID}"
        ));
    }
    if let Some(dir) = &spec.inject_dir {
        a.opt("--volume", mount(dir, Path::new(ROUTER_INJECT_DIR), ":ro"));
    }
    // Read-write, and no `:U`: the store stays its owner's (rootless, the user mapped to the router's
    // uid; rootful, the router's user, given it by the launcher).
    if let Some(dir) = &spec.oauth_store {
        a.opt("--volume", mount(dir, Path::new(ROUTER_OAUTH_DIR), ":rw"));
    }
    a.arg(&spec.image)
        // One worker thread: a session's router serves one sandbox, and the sandbox keeps the
        // other cores (measured: less CPU per connection than one thread per core).
        .args([
            "--config",
            ROUTER_CONFIG_PATH,
            "--log-format",
            "json",
            "--threads",
            "1",
        ])
        .done()
}

/// The pod: its only network is the session network, its only resolver the router, its hosts file
/// is not generated from the host's (the sandbox mounts a localhost-only one), and IPv6 is disabled
/// in its network namespace.
#[must_use]
pub fn pod_create(spec: &PodSpec) -> Vec<OsString> {
    let mut a = Argv::new(&["pod", "create"]);
    a.opt("--name", &spec.name)
        .labels(&spec.labels)
        .opt("--network", &spec.network)
        .opt("--dns", spec.dns.to_string())
        .arg("--no-hosts")
        .args(NO_IPV6.iter().flat_map(|s| ["--sysctl", *s]));
    // A user namespace cannot be set per container in a pod: keep-id goes on the pod.
    if spec.user == UserMapping::KeepId {
        a.arg("--userns=keep-id");
    }
    a.done()
}

/// The forwarder in the pod: read-only, no capability but NET_BIND_SERVICE (it binds 80/443 and port
/// entries below 1024 on the loopback addresses). Its relays come from the session directory's
/// `forwarder/`, mounted as a directory only into this container (the sandbox container of the same pod
/// cannot see it), and re-read on SIGHUP.
#[must_use]
pub fn forwarder_run(spec: &ForwarderSpec) -> Vec<OsString> {
    Argv::new(&["run", "--detach"])
        .opt("--name", &spec.name)
        .opt("--pod", &spec.pod)
        .labels(&spec.labels)
        .arg("--pull=never")
        .args(NO_HOST_ENV)
        .arg("--read-only")
        .opt("--cap-drop", "ALL")
        .opt("--cap-add", "NET_BIND_SERVICE")
        .opt("--log-driver", "k8s-file")
        .opt("--log-opt", format!("max-size={FORWARDER_LOG_MAX}"))
        .args(log_path_opt(spec.log_path.as_deref()))
        .opt("--security-opt", "no-new-privileges")
        .opt("--security-opt", "label=disable")
        .opt(
            "--volume",
            mount(&spec.relays_dir, Path::new(FORWARDER_RELAYS_DIR), ":ro"),
        )
        .opt("--entrypoint", FORWARDER_PATH)
        .arg(&spec.image)
        .args(["--relays", FORWARDER_RELAYS_PATH])
        .done()
}

/// One mount of the sandbox container, as [`sandbox_mounts`] decides them: what `podman create` is
/// told, and what its OCI configuration must hold before the command starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxMount {
    /// A host path bound at `destination` (`--volume SRC:DST:OPTS`, or `--mount type=bind` for a
    /// covered file, whose source is `/dev/null`).
    Bind {
        /// The host path.
        source: PathBuf,
        /// Where it shows in the sandbox.
        destination: PathBuf,
        /// Written into by the sandbox (the project only).
        writable: bool,
        /// The `--volume` options after the destination (`:bind`, `:rbind`, `:ro`), or None for a
        /// `--mount` of `/dev/null`.
        volume_opts: Option<&'static str>,
    },
    /// A named volume (the home volume).
    Volume {
        /// Its name.
        name: String,
        /// Where it shows in the sandbox.
        destination: PathBuf,
        /// `:U` or nothing.
        volume_opts: &'static str,
    },
    /// An empty read-only tmpfs covering a directory mounted below the project.
    Tmpfs {
        /// The covered directory.
        destination: PathBuf,
    },
}

impl SandboxMount {
    /// Where it shows in the sandbox.
    #[must_use]
    pub fn destination(&self) -> &Path {
        match self {
            SandboxMount::Bind { destination, .. }
            | SandboxMount::Volume { destination, .. }
            | SandboxMount::Tmpfs { destination } => destination,
        }
    }
}

/// Every mount of the sandbox container: the project at its own path (read-write, not recursive
/// unless something below it is covered, no relabelling), each covered mount point, the home volume,
/// the session's hosts and resolv.conf read-only, and the session CA's files when there are any.
#[must_use]
pub fn sandbox_mounts(spec: &SandboxSpec) -> Vec<SandboxMount> {
    let bind = |source: &Path, destination: &Path, writable, opts| SandboxMount::Bind {
        source: source.to_owned(),
        destination: destination.to_owned(),
        writable,
        volume_opts: Some(opts),
    };
    let mut out = Vec::new();
    // Mounts below the project on the host (a USB disk, an sshfs, a bind of ~/.ssh) never show in the
    // sandbox. With none, the project is bound alone (`:bind`, not podman's default `rbind`). With
    // some, a bind that leaves them out fails under rootless podman for a mount older than its user
    // namespace (the kernel locks such mounts, and a non-recursive bind of a directory with a locked
    // mount below it is refused: EINVAL), so the bind is recursive and each one is covered by an
    // empty read-only tmpfs, which nothing in the sandbox can unmount (no capability; and in a nested
    // user namespace the copy is locked).
    let coverable = spec.covered.iter().all(|c| mountable_destination(&c.path));
    if spec.covered.is_empty() || !coverable {
        out.push(bind(&spec.project, &spec.project, true, ":bind"));
    } else {
        out.push(bind(&spec.project, &spec.project, true, ":rbind"));
        for c in &spec.covered {
            out.push(if c.file {
                SandboxMount::Bind {
                    source: PathBuf::from("/dev/null"),
                    destination: c.path.clone(),
                    writable: false,
                    volume_opts: None,
                }
            } else {
                SandboxMount::Tmpfs {
                    destination: c.path.clone(),
                }
            });
        }
    }
    out.push(SandboxMount::Volume {
        name: spec.home_volume.clone(),
        destination: spec.home.clone(),
        volume_opts: if spec.chown_home { ":U" } else { "" },
    });
    out.push(bind(
        &spec.hosts_file,
        Path::new("/etc/hosts"),
        false,
        ":ro",
    ));
    out.push(bind(
        &spec.resolv_file,
        Path::new("/etc/resolv.conf"),
        false,
        ":ro",
    ));
    if let Some(ca) = &spec.ca {
        out.push(bind(&ca.cert, Path::new(SANDBOX_SESSION_CA), false, ":ro"));
        out.push(bind(&ca.bundle, Path::new(SYSTEM_CA_BUNDLE), false, ":ro"));
    }
    out
}

/// The sandbox container, created and not started: [`sandbox_start`] runs it once its OCI
/// configuration (after [`container_init`]) has shown that it mounts [`sandbox_mounts`] and podman's
/// own files and nothing else (podman's configuration can add mounts of its own). Every capability
/// dropped, no new privileges, none of the image's volumes.
///
/// `unmask=/proc/*` lets nested podman mount /proc for its containers (the kernel refuses a new proc
/// mount while parts of /proc are masked); /sys stays masked. It is given only to a non-root sandbox
/// user, which owns nothing under /proc/sys and has no capability to use the rest.
#[must_use]
pub fn sandbox_create(spec: &SandboxSpec) -> Vec<OsString> {
    let mut a = Argv::new(&["create"]);
    a.opt("--name", &spec.name)
        .opt("--pod", &spec.pod)
        .labels(&spec.labels)
        .arg("--interactive");
    if spec.tty {
        a.arg("--tty");
    }
    let non_root = match &spec.user {
        UserMapping::KeepId => true,
        UserMapping::Host { uid, gid } => {
            a.opt("--user", format!("{uid}:{gid}"));
            *uid != 0
        }
    };
    if let Some(entry) = &spec.passwd_entry {
        a.opt("--passwd-entry", entry);
    }
    // The command's output goes to the launcher's terminal or pipes only: with a log driver, podman
    // would also copy every byte (every redraw of a TUI) into a file in its storage for the whole
    // session.
    // The image's VOLUME declarations would add anonymous volumes; the sandbox gets none.
    a.arg("--pull=never")
        .args(NO_HOST_ENV)
        .arg("--image-volume=ignore")
        .opt("--log-driver", "none")
        .arg("--init")
        .opt("--cap-drop", "ALL")
        .opt("--security-opt", "no-new-privileges")
        .opt("--security-opt", "label=disable");
    if non_root {
        a.opt("--security-opt", "unmask=/proc/*");
    }
    for m in sandbox_mounts(spec) {
        match m {
            SandboxMount::Bind {
                source,
                destination,
                volume_opts: Some(opts),
                ..
            } => {
                a.opt("--volume", mount(&source, &destination, opts));
            }
            SandboxMount::Bind { destination, .. } => {
                let mut m = OsString::from("type=bind,source=/dev/null,ro=true,destination=");
                m.push(destination.as_os_str());
                a.opt("--mount", m);
            }
            SandboxMount::Tmpfs { destination } => {
                let mut m = OsString::from(
                    "type=tmpfs,tmpfs-size=4096,tmpfs-mode=0555,notmpcopyup,ro=true,destination=",
                );
                m.push(destination.as_os_str());
                a.opt("--mount", m);
            }
            SandboxMount::Volume {
                name,
                destination,
                volume_opts,
            } => {
                a.opt(
                    "--volume",
                    mount(Path::new(&name), &destination, volume_opts),
                );
            }
        }
    }
    let mut home_env = OsString::from("HOME=");
    home_env.push(spec.home.as_os_str());
    a.opt("--workdir", &spec.project).opt("--env", home_env);
    for (name, value) in &spec.env {
        a.opt("--env", format!("{name}={value}"));
    }
    for name in &spec.pass_env {
        a.opt("--env", name);
    }
    a.arg(&spec.image).args(spec.command.iter().cloned()).done()
}

/// Starts the created sandbox container attached to the launcher's terminal or pipes; podman exits
/// with the command's exit code.
#[must_use]
pub fn sandbox_start(spec: &SandboxSpec) -> Vec<OsString> {
    let mut a = Argv::new(&["start", "--attach", "--interactive"]);
    if spec.tty {
        // Ctrl-P is an ordinary key for the programs in the sandbox (shell history, editors, Claude);
        // podman's default detach sequence (ctrl-p,ctrl-q) would swallow it.
        a.opt("--detach-keys", "");
    }
    a.arg(&spec.name).done()
}

/// Initialises a created container: podman prepares its mounts and writes its OCI configuration
/// (`config.json`), which the sandbox's check reads before [`sandbox_start`].
#[must_use]
pub fn container_init(name: &str) -> Vec<OsString> {
    Argv::new(&["init", name]).done()
}

/// At most `max` bytes of a file, printed from inside rootless podman's user namespace (`podman
/// unshare head`), where the storage's files owned by the container's users can be read.
#[must_use]
pub fn unshare_read(path: &Path, max: u64) -> Vec<OsString> {
    Argv::new(&["unshare", "head", "-c"])
        .arg(max.to_string())
        .arg("--")
        .arg(path)
        .done()
}

/// The first entry of a directory that is anything but an empty regular file named `system-fips`,
/// from inside rootless podman's user namespace (`podman unshare find`): nothing when there is none.
#[must_use]
pub fn unshare_find_not_fips_marker(dir: &Path) -> Vec<OsString> {
    Argv::new(&["unshare", "find"])
        .arg(dir)
        .args([
            "-mindepth",
            "1",
            "-maxdepth",
            "1",
            "!",
            "(",
            "-name",
            "system-fips",
            "-type",
            "f",
            "-empty",
            ")",
            "-print",
            "-quit",
        ])
        .done()
}

/// The whole `podman container inspect` of one container (where the sandbox's OCI configuration is).
#[must_use]
pub fn container_inspect(name: &str) -> Vec<OsString> {
    Argv::new(&["container", "inspect", name]).done()
}

/// Prints one file of an image on stdout: `cat` in a throw-away container with no network, nothing
/// writable and no capability (the session reads the sandbox image's CA bundle this way).
#[must_use]
pub fn read_image_file(image: &str, path: &Path) -> Vec<OsString> {
    Argv::new(&["run", "--rm", "--pull=never"])
        .opt("--network", "none")
        .args(NO_HOST_ENV)
        .arg("--read-only")
        .opt("--cap-drop", "ALL")
        .opt("--security-opt", "no-new-privileges")
        .opt("--security-opt", "label=disable")
        .opt("--log-driver", "none")
        .opt("--entrypoint", "cat")
        .arg(image)
        .arg(path)
        .done()
}

/// `podman ps|pod ps|network ls` of every object carrying the session label, as JSON.
fn list_sessions(command: &[&str]) -> Vec<OsString> {
    Argv::new(command)
        .opt("--filter", format!("label={LABEL_SESSION}"))
        .opt("--format", "json")
        .done()
}

/// Containers (JSON) carrying the session label, of any session.
#[must_use]
pub fn ps_sessions() -> Vec<OsString> {
    list_sessions(&["ps", "--all"])
}

/// Running containers (JSON) carrying the session label: the live commands' view of the sessions.
#[must_use]
pub fn ps_running_sessions() -> Vec<OsString> {
    list_sessions(&["ps"])
}

/// A container's log from `since` (seconds since the epoch, with a fraction) on; `follow` keeps it open
/// and prints what comes.
#[must_use]
pub fn logs_since(name: &str, since: f64, follow: bool) -> Vec<OsString> {
    let mut a = Argv::new(&["logs"]);
    a.opt("--since", format!("{since:.6}"));
    if follow {
        a.arg("--follow");
    }
    a.arg(name).done()
}

/// Pods (JSON) carrying the session label.
#[must_use]
pub fn pod_ps_sessions() -> Vec<OsString> {
    list_sessions(&["pod", "ps"])
}

/// Networks (JSON) carrying the session label.
#[must_use]
pub fn network_ls_sessions() -> Vec<OsString> {
    list_sessions(&["network", "ls"])
}

/// Removes a pod and its containers.
#[must_use]
pub fn pod_rm(name: &str) -> Vec<OsString> {
    Argv::new(&["pod", "rm", "--force"])
        .opt("--time", STOP_TIMEOUT_SECS.to_string())
        .arg(name)
        .done()
}

/// Removes a container.
#[must_use]
pub fn rm(name: &str) -> Vec<OsString> {
    Argv::new(&["rm", "--force"])
        .opt("--time", STOP_TIMEOUT_SECS.to_string())
        .arg(name)
        .done()
}

/// Sends a signal (by number) to a container's main process.
#[must_use]
pub fn kill(name: &str, signal: i32) -> Vec<OsString> {
    Argv::new(&["kill"])
        .opt("--signal", signal.to_string())
        .arg(name)
        .done()
}

/// Where a container's k8s-file log is on the host.
#[must_use]
pub fn log_path(name: &str) -> Vec<OsString> {
    Argv::new(&["container", "inspect"])
        .opt("--format", "{{.HostConfig.LogConfig.Path}}")
        .arg(name)
        .done()
}

/// Sends a signal (by number) to several containers' main processes with one podman command.
#[must_use]
pub fn kill_many(names: &[&str], signal: i32) -> Vec<OsString> {
    Argv::new(&["kill"])
        .opt("--signal", signal.to_string())
        .args(names.iter().copied())
        .done()
}

/// Kills a pod's containers at once (the launcher was told to stop and the command did not).
#[must_use]
pub fn pod_kill(name: &str) -> Vec<OsString> {
    Argv::new(&["pod", "kill", name]).done()
}

/// A container's log, stdout and stderr.
#[must_use]
pub fn logs(name: &str) -> Vec<OsString> {
    Argv::new(&["logs", name]).done()
}

/// Whether a container is running, and its exit code.
#[must_use]
pub fn container_state(name: &str) -> Vec<OsString> {
    Argv::new(&["container", "inspect"])
        .opt("--format", "{{.State.Running}} {{.State.ExitCode}}")
        .arg(name)
        .done()
}

/// Builds an image from a Containerfile.
#[must_use]
pub fn build(
    containerfile: &Path,
    context: &Path,
    tag: &str,
    build_args: &[(String, String)],
    secrets: &[(String, PathBuf)],
) -> Vec<OsString> {
    let mut a = Argv::new(&["build"]);
    // The version label lets `agent-sandbox doctor` tell images built by another launcher version.
    a.opt("--tag", tag).opt("--file", containerfile).opt(
        "--label",
        format!("{LABEL_VERSION}={}", env!("CARGO_PKG_VERSION")),
    );
    for (k, val) in build_args {
        a.opt("--build-arg", format!("{k}={val}"));
    }
    for (id, src) in secrets {
        let mut secret = OsString::from(format!("id={id},src="));
        secret.push(src.as_os_str());
        a.opt("--secret", secret);
    }
    a.arg(context).done()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn labels() -> SessionLabels {
        SessionLabels {
            session: "abc123".into(),
            pid: 42,
            start: 777,
            boot: "boot-1".into(),
            project: "/home/me/src/p".into(),
            log_dir: None,
            session_dir: None,
        }
    }

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    /// True if `needle` appears as consecutive elements of `hay`.
    fn has(hay: &[String], needle: &[&str]) -> bool {
        hay.windows(needle.len())
            .any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
    }

    fn count(hay: &[String], item: &str) -> usize {
        hay.iter().filter(|s| *s == item).count()
    }

    fn router() -> RouterSpec {
        RouterSpec {
            name: "agent-sandbox-abc123-router".into(),
            labels: labels(),
            image: "localhost/agent-sandbox-router:dev".into(),
            session_network: "agent-sandbox-abc123".into(),
            session_ip: Ipv4Addr::new(10, 89, 3, 2),
            egress_network: "agent-sandbox-egress".into(),
            config_dir: "/tmp/s/router".into(),
            inject_dir: None,
            oauth_store: None,
            keep_id: false,
            log_path: Some("/tmp/s/router.log".into()),
        }
    }

    fn sandbox(user: UserMapping) -> SandboxSpec {
        SandboxSpec {
            name: "agent-sandbox-abc123-sandbox".into(),
            labels: labels(),
            pod: "agent-sandbox-abc123".into(),
            image: "localhost/agent-sandbox:dev".into(),
            user,
            passwd_entry: Some("me:*:1000:1000:me:/home/me:/bin/bash".into()),
            project: "/home/me/src/p".into(),
            covered: Vec::new(),
            home_volume: "agent-sandbox-home".into(),
            home: "/home/me".into(),
            chown_home: false,
            hosts_file: "/tmp/s/hosts".into(),
            resolv_file: "/tmp/s/resolv.conf".into(),
            tty: false,
            ca: None,
            env: Vec::new(),
            pass_env: vec!["TERM".into()],
            command: vec!["claude".into(), "--continue".into()],
        }
    }

    #[test]
    fn log_paths_podman_would_split_are_not_given_to_it() {
        let ok = PathBuf::from("/home/me/.local/state/agent-sandbox/logs/x/router.log");
        assert_eq!(log_path_podman_takes(ok.clone()), Some(ok));
        assert_eq!(log_path_podman_takes("/home/a,b/router.log".into()), None);
        assert_eq!(log_path_podman_takes("/home/a\"b/router.log".into()), None);
        // conmon would open /home/me/st (a reviewer compiled its parser).
        assert_eq!(
            log_path_podman_takes("/home/me/st:ate/router.log".into()),
            None
        );
    }

    /// A session's log directory is on its objects, for the stale sweep; none when it has none.
    #[test]
    fn the_log_directory_label() {
        let mut l = labels();
        assert!(!strs(&l.args())
            .iter()
            .any(|a| a.starts_with(super::super::LABEL_LOG_DIR)));
        l.log_dir = Some("/home/me/.local/state/agent-sandbox/logs/agent-sandbox-abc123".into());
        assert!(has(
            &strs(&l.args()),
            &[
                "--label",
                "agent-sandbox.log-dir=/home/me/.local/state/agent-sandbox/logs/agent-sandbox-abc123"
            ]
        ));
    }

    #[test]
    fn labels_name_the_session_on_every_object() {
        let l = labels();
        let net = strs(&network_create_session(&NetworkSpec {
            name: "n".into(),
            labels: l.clone(),
        }));
        let r = strs(&router_run(&router()));
        let pod = strs(&pod_create(&PodSpec {
            name: "p".into(),
            labels: l.clone(),
            network: "n".into(),
            dns: Ipv4Addr::new(10, 89, 3, 2),
            user: UserMapping::KeepId,
        }));
        let f = strs(&forwarder_run(&ForwarderSpec {
            name: "f".into(),
            labels: l.clone(),
            pod: "p".into(),
            image: "i".into(),
            relays_dir: "/tmp/s/forwarder".into(),
            log_path: Some("/tmp/s/forwarder.log".into()),
        }));
        let s = strs(&sandbox_create(&sandbox(UserMapping::KeepId)));
        for argv in [net, r, pod, f, s] {
            for needle in [
                "agent-sandbox.session=abc123",
                "agent-sandbox.launcher-pid=42",
                "agent-sandbox.launcher-start=777",
                "agent-sandbox.boot-id=boot-1",
                "agent-sandbox.project=/home/me/src/p",
            ] {
                assert!(has(&argv, &["--label", needle]), "{needle} in {argv:?}");
            }
        }
    }

    #[test]
    fn logs_are_capped_and_the_command_output_is_not_stored() {
        let router = strs(&router_run(&router()));
        assert!(has(&router, &["--log-driver", "k8s-file"]), "{router:?}");
        assert!(has(&router, &["--log-opt", "max-size=32mb"]), "{router:?}");
        // In the session directory, where the launcher can read it (rootless too).
        assert!(
            has(&router, &["--log-opt", "path=/tmp/s/router.log"]),
            "{router:?}"
        );
        let forwarder = strs(&forwarder_run(&ForwarderSpec {
            name: "f".into(),
            labels: labels(),
            pod: "p".into(),
            image: "i".into(),
            relays_dir: "/tmp/s/forwarder".into(),
            log_path: Some("/tmp/s/forwarder.log".into()),
        }));
        assert!(
            has(&forwarder, &["--log-opt", "max-size=1mb"]),
            "{forwarder:?}"
        );
        assert!(
            has(&forwarder, &["--log-opt", "path=/tmp/s/forwarder.log"]),
            "{forwarder:?}"
        );
        let sandbox = strs(&sandbox_create(&sandbox(UserMapping::KeepId)));
        assert!(has(&sandbox, &["--log-driver", "none"]), "{sandbox:?}");
    }

    #[test]
    fn no_host_environment_or_proxy_reaches_any_container() {
        let router = strs(&router_run(&router()));
        let forwarder = strs(&forwarder_run(&ForwarderSpec {
            name: "f".into(),
            labels: labels(),
            pod: "p".into(),
            image: "i".into(),
            relays_dir: "/tmp/s/forwarder".into(),
            log_path: Some("/tmp/s/forwarder.log".into()),
        }));
        let rootless = strs(&sandbox_create(&sandbox(UserMapping::KeepId)));
        let rootful = strs(&sandbox_create(&sandbox(UserMapping::Host {
            uid: 1000,
            gid: 1000,
        })));
        for argv in [router, forwarder, rootless, rootful] {
            for flag in ["--http-proxy=false", "--env-host=false"] {
                assert_eq!(count(&argv, flag), 1, "{flag} in {argv:?}");
            }
            // Options, so before the image.
            let image = argv
                .iter()
                .position(|s| s == "i" || s.starts_with("localhost/"))
                .unwrap();
            let flag = argv.iter().position(|s| s == "--http-proxy=false").unwrap();
            assert!(flag < image, "{argv:?}");
            assert!(!argv
                .iter()
                .any(|s| s == "--env-host" || s == "--http-proxy"));
        }
    }

    #[test]
    fn session_network_is_internal_without_dns() {
        let a = strs(&network_create_session(&NetworkSpec {
            name: "agent-sandbox-abc123".into(),
            labels: labels(),
        }));
        assert_eq!(
            &a[..4],
            ["network", "create", "--internal", "--disable-dns"]
        );
        assert_eq!(a.last().unwrap(), "agent-sandbox-abc123");
    }

    #[test]
    fn router_is_read_only_capless_on_both_networks() {
        let a = strs(&router_run(&router()));
        assert_eq!(&a[..2], ["run", "--detach"]);
        assert!(has(&a, &["--network", "agent-sandbox-abc123:ip=10.89.3.2"]));
        assert!(has(&a, &["--network", "agent-sandbox-egress"]));
        assert_eq!(count(&a, "--network"), 2);
        assert!(a.contains(&"--read-only".to_owned()));
        assert!(has(&a, &["--cap-drop", "ALL"]));
        assert_eq!(
            count(&a, "--cap-add"),
            0,
            "binding 53/80/443 needs no capability"
        );
        assert!(has(
            &a,
            &["--sysctl", "net.ipv4.ip_unprivileged_port_start=53"]
        ));
        assert!(has(&a, &["--security-opt", "no-new-privileges"]));
        assert!(has(&a, &["--security-opt", "label=disable"]));
        assert!(has(
            &a,
            &["--volume", "/tmp/s/router:/etc/agent-sandbox:ro"]
        ));
        // Options first, then the image, then the router's own arguments.
        let image = a
            .iter()
            .position(|s| s == "localhost/agent-sandbox-router:dev")
            .unwrap();
        assert_eq!(
            &a[image + 1..],
            [
                "--config",
                ROUTER_CONFIG_PATH,
                "--log-format",
                "json",
                "--threads",
                "1"
            ]
        );
    }

    #[test]
    fn the_inject_directory_goes_into_the_router_only_and_the_sandbox_gets_the_ca() {
        let mut r = router();
        r.inject_dir = Some("/tmp/s/inject".into());
        let a = strs(&router_run(&r));
        assert!(has(
            &a,
            &["--volume", "/tmp/s/inject:/etc/agent-sandbox-inject:ro"]
        ));
        assert_eq!(count(&a, "--volume"), 2);
        // Without injection the router has its configuration only.
        assert_eq!(count(&strs(&router_run(&router())), "--volume"), 1);

        let mut spec = sandbox(UserMapping::KeepId);
        spec.ca = Some(super::super::SandboxCa {
            cert: "/tmp/s/inject/ca.pem".into(),
            bundle: "/tmp/s/ca-bundle.crt".into(),
        });
        spec.env = vec![
            ("NODE_EXTRA_CA_CERTS".into(), SANDBOX_SESSION_CA.into()),
            (
                "ANTHROPIC_API_KEY".into(),
                "sk-ant-api03-placeholder".into(),
            ),
        ];
        let a = strs(&sandbox_create(&spec));
        assert!(has(
            &a,
            &[
                "--volume",
                "/tmp/s/inject/ca.pem:/etc/agent-sandbox/session-ca.pem:ro"
            ]
        ));
        assert!(has(
            &a,
            &[
                "--volume",
                "/tmp/s/ca-bundle.crt:/etc/ssl/certs/ca-certificates.crt:ro"
            ]
        ));
        // The inject directory itself (the CA key, the real key) is never mounted into the sandbox.
        assert!(!a.iter().any(|s| s.starts_with("/tmp/s/inject:")));
        assert!(!a
            .iter()
            .any(|s| s.contains("ca.key") || s.contains("api-key")));
        assert_eq!(count(&a, "--volume"), 6);
        assert!(has(
            &a,
            &[
                "--env",
                "NODE_EXTRA_CA_CERTS=/etc/agent-sandbox/session-ca.pem"
            ]
        ));
        assert!(has(
            &a,
            &["--env", "ANTHROPIC_API_KEY=sk-ant-api03-placeholder"]
        ));

        let read = strs(&read_image_file("img", Path::new(SYSTEM_CA_BUNDLE)));
        assert!(has(&read, &["--network", "none"]));
        assert!(has(&read, &["--cap-drop", "ALL"]));
        assert!(read.ends_with(&["img".to_owned(), SYSTEM_CA_BUNDLE.to_owned()]));
    }

    #[test]
    fn the_token_store_goes_into_the_router_only_read_write_and_rootless_maps_the_user() {
        let mut r = router();
        r.inject_dir = Some("/tmp/s/inject".into());
        r.oauth_store = Some("/home/me/.local/state/agent-sandbox/oauth".into());
        let a = strs(&router_run(&r));
        assert!(has(
            &a,
            &[
                "--volume",
                "/home/me/.local/state/agent-sandbox/oauth:/etc/agent-sandbox-oauth:rw"
            ]
        ));
        assert_eq!(count(&a, "--volume"), 3);
        // Never re-owned by podman: the store is shared with other sessions and the launcher.
        assert!(!a.iter().any(|s| s.contains("oauth") && s.ends_with(":U")));
        assert!(!a.iter().any(|s| s.starts_with("--userns")), "{a:?}");
        let image = a.iter().position(|s| s == &r.image).unwrap();
        r.keep_id = true;
        let rootless = strs(&router_run(&r));
        let userns = rootless
            .iter()
            .position(|s| s == "--userns=keep-id:uid=65532,gid=65532")
            .expect("rootless maps the invoking user to the router's user");
        assert!(userns < image, "a podman option, not a router argument");

        // The sandbox of the same session gets nothing of the store.
        let spec = sandbox(UserMapping::KeepId);
        let s = strs(&sandbox_create(&spec));
        assert!(!s
            .iter()
            .any(|w| w.contains("agent-sandbox/oauth") || w.contains(ROUTER_OAUTH_DIR)));
    }

    #[test]
    fn pod_has_only_the_router_as_resolver_and_no_host_entries() {
        let spec = |user| PodSpec {
            name: "agent-sandbox-abc123".into(),
            labels: labels(),
            network: "agent-sandbox-abc123".into(),
            dns: Ipv4Addr::new(10, 89, 3, 2),
            user,
        };
        let a = strs(&pod_create(&spec(UserMapping::KeepId)));
        assert_eq!(&a[..2], ["pod", "create"]);
        assert!(has(&a, &["--network", "agent-sandbox-abc123"]));
        assert_eq!(count(&a, "--network"), 1);
        assert!(has(&a, &["--dns", "10.89.3.2"]));
        assert!(a.contains(&"--no-hosts".to_owned()));
        assert!(a.contains(&"--userns=keep-id".to_owned()));
        assert!(has(&a, &["--sysctl", "net.ipv6.conf.all.disable_ipv6=1"]));
        assert!(has(
            &a,
            &["--sysctl", "net.ipv6.conf.default.disable_ipv6=1"]
        ));
        // Rootful podman refuses keep-id: the pod then has no user namespace option at all.
        let rootful = strs(&pod_create(&spec(UserMapping::Host {
            uid: 1000,
            gid: 1000,
        })));
        assert!(!rootful.iter().any(|s| s.starts_with("--userns")));
        assert!(has(
            &rootful,
            &["--sysctl", "net.ipv6.conf.all.disable_ipv6=1"]
        ));
    }

    #[test]
    fn live_commands_list_running_sessions_and_read_logs_from_a_time() {
        assert_eq!(
            strs(&ps_running_sessions()),
            [
                "ps",
                "--filter",
                "label=agent-sandbox.session",
                "--format",
                "json"
            ]
        );
        assert_eq!(
            strs(&logs_since("r", 1.5, true)),
            ["logs", "--since", "1.500000", "--follow", "r"]
        );
        assert_eq!(
            strs(&logs_since("r", 2.0, false)),
            ["logs", "--since", "2.000000", "r"]
        );
    }

    #[test]
    fn forwarder_is_read_only_with_only_net_bind_service() {
        let a = strs(&forwarder_run(&ForwarderSpec {
            name: "agent-sandbox-abc123-forwarder".into(),
            labels: labels(),
            pod: "agent-sandbox-abc123".into(),
            image: "localhost/agent-sandbox-router:dev".into(),
            relays_dir: "/tmp/s/forwarder".into(),
            log_path: Some("/tmp/s/forwarder.log".into()),
        }));
        assert!(has(&a, &["--pod", "agent-sandbox-abc123"]));
        assert!(a.contains(&"--read-only".to_owned()));
        assert!(has(&a, &["--cap-drop", "ALL"]));
        assert!(has(&a, &["--cap-add", "NET_BIND_SERVICE"]));
        assert_eq!(count(&a, "--cap-add"), 1);
        assert!(has(&a, &["--security-opt", "no-new-privileges"]));
        assert!(has(
            &a,
            &[
                "--entrypoint",
                FORWARDER_PATH,
                "localhost/agent-sandbox-router:dev",
                "--relays",
                "/etc/agent-sandbox-forwarder/relays"
            ]
        ));
        assert!(has(
            &a,
            &[
                "--volume",
                "/tmp/s/forwarder:/etc/agent-sandbox-forwarder:ro"
            ]
        ));
        assert_eq!(count(&a, "--volume"), 1);
        assert!(!a.iter().any(|s| s.starts_with("--network")));
    }

    #[test]
    fn sandbox_rootless_uses_the_pods_keep_id_and_mounts_only_the_project() {
        let a = strs(&sandbox_create(&sandbox(UserMapping::KeepId)));
        assert!(has(&a, &["--pod", "agent-sandbox-abc123"]));
        assert!(!a.iter().any(|s| s == "--user" || s.starts_with("--userns")));
        assert!(a.contains(&"--interactive".to_owned()));
        assert!(!a.contains(&"--tty".to_owned()));
        assert!(has(&a, &["--cap-drop", "ALL"]));
        assert_eq!(count(&a, "--cap-add"), 0);
        assert!(has(&a, &["--security-opt", "no-new-privileges"]));
        assert!(has(&a, &["--security-opt", "label=disable"]));
        assert!(has(&a, &["--security-opt", "unmask=/proc/*"]));
        // Not recursive: `bind`, never podman's default `rbind`.
        assert!(has(&a, &["--volume", "/home/me/src/p:/home/me/src/p:bind"]));
        assert!(!a.iter().any(|s| s.contains("rbind")));
        assert!(has(&a, &["--workdir", "/home/me/src/p"]));
        assert!(has(&a, &["--volume", "agent-sandbox-home:/home/me"]));
        assert!(has(&a, &["--env", "HOME=/home/me"]));
        assert!(has(&a, &["--volume", "/tmp/s/hosts:/etc/hosts:ro"]));
        assert!(has(
            &a,
            &["--volume", "/tmp/s/resolv.conf:/etc/resolv.conf:ro"]
        ));
        // Nothing else from the host: exactly these four volumes, no relabelling (:Z / :z).
        assert_eq!(count(&a, "--volume"), 4);
        assert!(!a.iter().any(|s| s.ends_with(":Z") || s.ends_with(":z")));
        assert!(has(&a, &["--env", "TERM"]));
        assert!(!a.iter().any(|s| s.contains("podman.sock")));
        // The command comes last, after the image, untouched.
        assert!(a.ends_with(&[
            "localhost/agent-sandbox:dev".to_owned(),
            "claude".to_owned(),
            "--continue".to_owned()
        ]));
    }

    /// Mounts below the project: a recursive bind with each covered by an empty read-only tmpfs
    /// (reviewer O: a non-recursive bind failed under rootless podman for a mount older than its user
    /// namespace); a destination podman's CSV would split leaves the project bound alone.
    #[test]
    fn mounts_below_the_project_are_covered() {
        use crate::podman::Covered;
        let mut spec = sandbox(UserMapping::KeepId);
        let covered = |path: &str, file: bool| Covered {
            path: path.into(),
            file,
        };
        spec.covered = vec![
            covered("/home/me/src/p/usb", false),
            covered("/home/me/src/p/a b/c", false),
            covered("/home/me/src/p/key", true),
        ];
        let a = strs(&sandbox_create(&spec));
        assert!(has(
            &a,
            &["--volume", "/home/me/src/p:/home/me/src/p:rbind"]
        ));
        assert!(has(
            &a,
            &[
                "--mount",
                "type=tmpfs,tmpfs-size=4096,tmpfs-mode=0555,notmpcopyup,ro=true,destination=/home/me/src/p/usb"
            ]
        ));
        assert!(has(
            &a,
            &[
                "--mount",
                "type=tmpfs,tmpfs-size=4096,tmpfs-mode=0555,notmpcopyup,ro=true,destination=/home/me/src/p/a b/c"
            ]
        ));
        assert!(has(
            &a,
            &[
                "--mount",
                "type=bind,source=/dev/null,ro=true,destination=/home/me/src/p/key"
            ]
        ));
        assert_eq!(count(&a, "--mount"), 3);
        // Each byte podman's CSV would split at: a cover at half the path would leave the rest seen.
        for odd in ["x,y", "x\"y", "x\ny", "x\ry"] {
            let mut spec = spec.clone();
            spec.covered
                .push(covered(&format!("/home/me/src/p/{odd}"), false));
            let a = strs(&sandbox_create(&spec));
            assert!(
                has(&a, &["--volume", "/home/me/src/p:/home/me/src/p:bind"]),
                "{odd:?}: {a:?}"
            );
            assert_eq!(count(&a, "--mount"), 0, "{odd:?}");
        }
    }

    /// Whoever the sandbox runs as, nothing in it can gain privileges (setuid files, file capabilities).
    #[test]
    fn every_sandbox_has_no_new_privileges() {
        let mut root = sandbox(UserMapping::Host { uid: 0, gid: 0 });
        root.passwd_entry = None;
        for spec in [
            root,
            sandbox(UserMapping::Host {
                uid: 1000,
                gid: 1000,
            }),
            sandbox(UserMapping::KeepId),
        ] {
            let a = strs(&sandbox_create(&spec));
            assert!(has(&a, &["--security-opt", "no-new-privileges"]), "{a:?}");
            assert!(has(&a, &["--cap-drop", "ALL"]), "{a:?}");
        }
    }

    #[test]
    fn sandbox_rootful_runs_as_the_given_user() {
        let mut spec = sandbox(UserMapping::Host {
            uid: 1000,
            gid: 1000,
        });
        spec.tty = true;
        spec.chown_home = true;
        let a = strs(&sandbox_create(&spec));
        assert!(has(&a, &["--user", "1000:1000"]));
        assert!(has(
            &a,
            &["--passwd-entry", "me:*:1000:1000:me:/home/me:/bin/bash"]
        ));
        assert!(has(&a, &["--interactive", "--tty"]) || a.contains(&"--tty".to_owned()));
        // `podman create` has no --detach-keys; `podman start` takes it.
        assert!(!a.contains(&"--detach-keys".to_owned()), "{a:?}");
        assert_eq!(
            strs(&sandbox_start(&spec)),
            [
                "start",
                "--attach",
                "--interactive",
                "--detach-keys",
                "",
                &spec.name
            ]
        );
        spec.tty = false;
        assert_eq!(
            strs(&sandbox_start(&spec)),
            ["start", "--attach", "--interactive", &spec.name]
        );
        assert!(has(&a, &["--volume", "agent-sandbox-home:/home/me:U"]));
        assert!(has(&a, &["--security-opt", "unmask=/proc/*"]));
        // A root sandbox user (rootful podman in a root-owned project) keeps /proc masked.
        let mut root = sandbox(UserMapping::Host { uid: 0, gid: 0 });
        root.passwd_entry = None;
        let root = strs(&sandbox_create(&root));
        assert!(!root.contains(&"--passwd-entry".to_owned()));
        assert!(has(&root, &["--user", "0:0"]));
        assert!(!root.iter().any(|s| s.starts_with("unmask")));
        assert!(!a.iter().any(|s| s == "unmask=ALL"));
        assert!(has(&root, &["--cap-drop", "ALL"]));
    }

    #[test]
    fn cleanup_commands() {
        assert_eq!(
            strs(&pod_rm("p")),
            ["pod", "rm", "--force", "--time", "3", "p"]
        );
        assert_eq!(strs(&rm("r")), ["rm", "--force", "--time", "3", "r"]);
        assert_eq!(strs(&kill("s", 15)), ["kill", "--signal", "15", "s"]);
        assert_eq!(strs(&network_rm("n")), ["network", "rm", "--force", "n"]);
        assert!(has(
            &strs(&ps_sessions()),
            &["--filter", "label=agent-sandbox.session"]
        ));
    }

    #[test]
    fn doctor_commands() {
        assert_eq!(
            strs(&container_ip("r", "agent-sandbox-egress")),
            [
                "container",
                "inspect",
                "--format",
                "{{(index .NetworkSettings.Networks \"agent-sandbox-egress\").IPAddress}}",
                "r"
            ]
        );
        let trial = strs(&trial_run("localhost/r:dev"));
        assert!(trial.windows(2).any(|w| w == ["--network", "none"]));
        assert!(trial.windows(2).any(|w| w == ["--cap-drop", "ALL"]));
        assert_eq!(trial.last().unwrap(), "--version");
    }

    #[test]
    fn build_passes_args_and_secrets() {
        let a = strs(&build(
            Path::new("/r/containers/sandbox/Containerfile"),
            Path::new("/r/containers/sandbox"),
            "localhost/agent-sandbox:dev",
            &[("BASE".into(), "localhost/debian:bookworm".into())],
            &[(
                "ca-bundle".into(),
                "/etc/ssl/certs/ca-certificates.crt".into(),
            )],
        ));
        assert_eq!(
            a,
            [
                "build",
                "--tag",
                "localhost/agent-sandbox:dev",
                "--file",
                "/r/containers/sandbox/Containerfile",
                "--label",
                &format!("agent-sandbox.version={}", env!("CARGO_PKG_VERSION")),
                "--build-arg",
                "BASE=localhost/debian:bookworm",
                "--secret",
                "id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt",
                "/r/containers/sandbox"
            ]
        );
    }
}
