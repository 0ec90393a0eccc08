//! Every podman command the launcher runs, built in one place.
//!
//! The session module decides *what* to create; this module decides *how podman is told*: no other
//! module spells a podman flag. The builders are pure functions from a spec to an argument vector, so the
//! security-relevant flags (capabilities, read-only root filesystems, user mapping, networks, mounts) are
//! unit-tested here without podman. [`Podman`] runs the vectors and turns failures into errors that show
//! the command and podman's own message.

use std::ffi::{OsStr, OsString};
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};

use std::os::unix::process::CommandExt as _;

/// Label naming the session on every object a session creates (network, router, pod, containers).
pub const LABEL_SESSION: &str = "agent-sandbox.session";
/// Label holding the launcher's process id, to tell live sessions from stale ones.
pub const LABEL_PID: &str = "agent-sandbox.launcher-pid";
/// Label holding the launcher's start time (clock ticks since boot), so a reused pid is not mistaken
/// for the launcher that created the object.
pub const LABEL_START: &str = "agent-sandbox.launcher-start";
/// Label holding the kernel boot id: after a reboot no launcher of an earlier boot can be alive.
pub const LABEL_BOOT: &str = "agent-sandbox.boot-id";
/// Label holding the project directory, for humans (`podman ps --filter label=...`).
pub const LABEL_PROJECT: &str = "agent-sandbox.project";
/// Label on the shared objects a session creates but does not remove (egress network, home volume).
pub const LABEL_SHARED: &str = "agent-sandbox.shared";

/// Where the router finds its configuration inside its container.
pub const ROUTER_CONFIG_PATH: &str = "/etc/agent-sandbox/router.toml";
/// The forwarder's path inside the router image (it runs from that image with `--entrypoint`).
pub const FORWARDER_PATH: &str = "/agent-sandbox-forwarder";

/// Keeps the host's environment out of a container: podman copies the host's proxy variables
/// (`http_proxy` and friends, credentials included) into every container unless told not to, and
/// `--env-host` would copy all of it.
pub const NO_HOST_ENV: &[&str] = &["--http-proxy=false", "--env-host=false"];

/// Sysctls of the pod's network namespace: no IPv6 at all, so no link-local path to the session
/// network's bridge or anything else exists beside the router (the session network is IPv4 only).
pub const NO_IPV6: &[&str] = &[
    "net.ipv6.conf.all.disable_ipv6=1",
    "net.ipv6.conf.default.disable_ipv6=1",
];

/// Seconds podman waits after SIGTERM before SIGKILL when a session's objects are removed. The router
/// and the forwarder exit at once on SIGTERM; the sandboxed command gets a moment to save its state.
pub const STOP_TIMEOUT_SECS: u32 = 3;

/// The router's log (one line per connection and per refusal) is capped: an agent that floods the
/// router with refused names must not fill the host's disk through podman's log file. conmon then keeps
/// the latest part; the end-of-session report says so when the start of the log is gone.
pub const ROUTER_LOG_MAX: &str = "32mb";

/// The forwarder logs its listeners and its errors only.
pub const FORWARDER_LOG_MAX: &str = "1mb";

/// The labels every object of one session carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionLabels {
    /// The session id (also part of every object name).
    pub session: String,
    /// The launcher's pid.
    pub pid: u32,
    /// The launcher's start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot: String,
    /// The canonical project directory.
    pub project: PathBuf,
}

impl SessionLabels {
    /// `--label K=V` pairs, in a fixed order.
    fn args(&self) -> Vec<OsString> {
        let mut out = Vec::new();
        let mut push = |k: &str, v: &OsStr| {
            out.push("--label".into());
            let mut kv = OsString::from(k);
            kv.push("=");
            kv.push(v);
            out.push(kv);
        };
        push(LABEL_SESSION, OsStr::new(&self.session));
        push(LABEL_PID, OsStr::new(&self.pid.to_string()));
        push(LABEL_START, OsStr::new(&self.start.to_string()));
        push(LABEL_BOOT, OsStr::new(&self.boot));
        push(LABEL_PROJECT, self.project.as_os_str());
        out
    }
}

/// How the sandbox user is mapped to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserMapping {
    /// Rootless podman: the pod runs in a `keep-id` user namespace, so the sandbox user *is* the invoking
    /// user (same uid, same name) and files it creates in the project are the user's.
    KeepId,
    /// Rootful podman, where `keep-id` is refused: no user namespace, the sandbox runs as this uid/gid
    /// (the invoking user, see the session module) with every capability dropped.
    Host {
        /// The uid the sandbox runs as.
        uid: u32,
        /// The gid the sandbox runs as.
        gid: u32,
    },
}

/// The session network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSpec {
    /// Network name.
    pub name: String,
    /// The session's labels.
    pub labels: SessionLabels,
}

/// The router container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterSpec {
    /// Container name.
    pub name: String,
    /// The session's labels.
    pub labels: SessionLabels,
    /// The router image.
    pub image: String,
    /// The session network (the sandbox's side).
    pub session_network: String,
    /// The router's fixed address on the session network: the plan and the pod's `--dns` name it
    /// before the router exists.
    pub session_ip: Ipv4Addr,
    /// The shared egress network (the world's side).
    pub egress_network: String,
    /// The router configuration file on the host, mounted read-only.
    pub config_file: PathBuf,
}

/// The pod: holds the sandbox's network namespace, resolver and hosts file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// The session's labels.
    pub labels: SessionLabels,
    /// The session network, the pod's only network.
    pub network: String,
    /// The router's address: the only resolver.
    pub dns: Ipv4Addr,
    /// User namespace of every container in the pod.
    pub user: UserMapping,
}

/// The forwarder container in the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwarderSpec {
    /// Container name.
    pub name: String,
    /// The session's labels.
    pub labels: SessionLabels,
    /// The pod to join.
    pub pod: String,
    /// The router image, which also holds the forwarder.
    pub image: String,
    /// `LISTEN=TARGET` relays.
    pub relays: Vec<String>,
}

/// The sandbox container in the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxSpec {
    /// Container name.
    pub name: String,
    /// The session's labels.
    pub labels: SessionLabels,
    /// The pod to join.
    pub pod: String,
    /// The sandbox image.
    pub image: String,
    /// How the sandbox user maps to the host.
    pub user: UserMapping,
    /// The `/etc/passwd` line that gives the sandbox user its name and home (none for root, which the
    /// image already has).
    pub passwd_entry: Option<String>,
    /// The canonical project directory: mounted read-write at the same path, and the working directory.
    pub project: PathBuf,
    /// The home volume's name.
    pub home_volume: String,
    /// The sandbox user's home, where the home volume is mounted.
    pub home: PathBuf,
    /// Re-own the home volume to the sandbox user while mounting it (`:U`): only when it is not already
    /// theirs, because podman does it recursively.
    pub chown_home: bool,
    /// The session's `/etc/hosts` (localhost only), mounted read-only.
    pub hosts_file: PathBuf,
    /// The session's `/etc/resolv.conf` (the router only), mounted read-only.
    pub resolv_file: PathBuf,
    /// Allocate a terminal (stdin is one).
    pub tty: bool,
    /// Environment variables passed through by name (podman reads the values from its own environment,
    /// so they never show up in a command line).
    pub pass_env: Vec<String>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

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

/// Builds `podman` argument vectors (without the program name).
pub mod args {
    use super::*;

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

    /// The volume's directory on the host, to check who owns it.
    #[must_use]
    pub fn volume_mountpoint(name: &str) -> Vec<OsString> {
        Argv::new(&["volume", "inspect", "--format", "{{.Mountpoint}}", name]).done()
    }

    /// The router: on the session network at its fixed address and on the egress network; read-only root
    /// filesystem; every capability dropped. It binds 53/80/443 as its non-root image user thanks to
    /// `ip_unprivileged_port_start` in its own network namespace, so it needs no capability at all.
    #[must_use]
    pub fn router_run(spec: &RouterSpec) -> Vec<OsString> {
        Argv::new(&["run", "--detach"])
            .opt("--name", &spec.name)
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
            .opt("--security-opt", "no-new-privileges")
            .opt("--security-opt", "label=disable")
            .opt(
                "--volume",
                mount(&spec.config_file, Path::new(ROUTER_CONFIG_PATH), ":ro"),
            )
            .arg(&spec.image)
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
    /// entries below 1024 on the loopback addresses).
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
            .opt("--security-opt", "no-new-privileges")
            .opt("--security-opt", "label=disable")
            .opt("--entrypoint", FORWARDER_PATH)
            .arg(&spec.image)
            .args(&spec.relays)
            .done()
    }

    /// The sandbox: the project at its own path (read-write, not recursive, no relabelling), the home volume, the
    /// session's hosts and resolv.conf read-only, every capability dropped, no new privileges.
    ///
    /// `unmask=/proc/*` lets nested podman mount /proc for its containers (the kernel refuses a new proc
    /// mount while parts of /proc are masked); /sys stays masked. It is given only to a non-root sandbox
    /// user, which owns nothing under /proc/sys and has no capability to use the rest.
    #[must_use]
    pub fn sandbox_run(spec: &SandboxSpec) -> Vec<OsString> {
        let mut a = Argv::new(&["run"]);
        a.opt("--name", &spec.name)
            .opt("--pod", &spec.pod)
            .labels(&spec.labels)
            .arg("--interactive");
        if spec.tty {
            // Ctrl-P is an ordinary key for the programs in the sandbox (shell history, editors, Claude);
            // podman's default detach sequence (ctrl-p,ctrl-q) would swallow it.
            a.arg("--tty").opt("--detach-keys", "");
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
        a.arg("--pull=never")
            .args(NO_HOST_ENV)
            .opt("--log-driver", "none")
            .arg("--init")
            .opt("--cap-drop", "ALL")
            .opt("--security-opt", "no-new-privileges")
            .opt("--security-opt", "label=disable");
        if non_root {
            a.opt("--security-opt", "unmask=/proc/*");
        }
        let home_opts = if spec.chown_home { ":U" } else { "" };
        let mut home_env = OsString::from("HOME=");
        home_env.push(spec.home.as_os_str());
        // `:bind`, not podman's default `rbind`: mounts below the project on the host (a USB disk, an
        // sshfs, a bind of ~/.ssh) are not carried into the sandbox.
        a.opt("--volume", mount(&spec.project, &spec.project, ":bind"))
            .opt("--workdir", &spec.project)
            .opt(
                "--volume",
                mount(Path::new(&spec.home_volume), &spec.home, home_opts),
            )
            .opt("--env", home_env)
            .opt(
                "--volume",
                mount(&spec.hosts_file, Path::new("/etc/hosts"), ":ro"),
            )
            .opt(
                "--volume",
                mount(&spec.resolv_file, Path::new("/etc/resolv.conf"), ":ro"),
            );
        for name in &spec.pass_env {
            a.opt("--env", name);
        }
        a.arg(&spec.image).args(spec.command.iter().cloned()).done()
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
        a.opt("--tag", tag).opt("--file", containerfile);
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
}

/// A podman invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum PodmanError {
    /// The podman program was not found.
    #[error("podman is not installed (or not on PATH): install it, e.g. `sudo dnf install podman` or `sudo apt-get install podman`")]
    NotInstalled,
    /// podman could not be started for another reason.
    #[error("cannot run podman: {0}")]
    Spawn(#[source] io::Error),
    /// podman ran and failed.
    #[error("`{command}` failed ({status}){}", stderr_suffix(.stderr))]
    Failed {
        /// The command line, for the user to retry by hand.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// What podman said.
        stderr: String,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}

/// Runs podman.
#[derive(Clone, Debug)]
pub struct Podman {
    /// The program: `podman` from PATH.
    program: OsString,
}

impl Default for Podman {
    fn default() -> Self {
        Podman {
            program: "podman".into(),
        }
    }
}

impl Podman {
    fn command(&self, args: &[OsString]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(args);
        c
    }

    /// The command line as a user would type it (for error messages).
    #[must_use]
    pub fn display(&self, args: &[OsString]) -> String {
        std::iter::once(&self.program)
            .chain(args)
            .map(|a| {
                let s = a.to_string_lossy();
                if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '\'') {
                    format!("'{}'", s.replace('\'', r"'\''"))
                } else {
                    s.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs a helper command to completion with output captured, in its own process group so that a
    /// Ctrl-C meant for the launcher does not kill a half-done setup or cleanup step (the launcher
    /// finishes the step, then cleans up).
    pub fn output(&self, args: &[OsString]) -> Result<Output, PodmanError> {
        self.command(args)
            .stdin(Stdio::null())
            .process_group(0)
            .output()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    PodmanError::NotInstalled
                } else {
                    PodmanError::Spawn(e)
                }
            })
    }

    /// Runs a helper command; non-zero exit is an error. Returns stdout.
    pub fn run(&self, args: &[OsString]) -> Result<String, PodmanError> {
        let out = self.output(args)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(PodmanError::Failed {
                command: self.display(args),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// Runs a command whose exit status is the answer (`exists`): Ok(true) on 0, Ok(false) on 1.
    pub fn check(&self, args: &[OsString]) -> Result<bool, PodmanError> {
        let out = self.output(args)?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(PodmanError::Failed {
                command: self.display(args),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }),
        }
    }

    /// Runs a command with the launcher's own stdin, stdout and stderr (image builds and pulls show
    /// their progress; non-zero exit is an error).
    pub fn run_visible(&self, args: &[OsString]) -> Result<(), PodmanError> {
        let status = self.command(args).status().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PodmanError::NotInstalled,
            _ => PodmanError::Spawn(e),
        })?;
        if status.success() {
            Ok(())
        } else {
            Err(PodmanError::Failed {
                command: self.display(args),
                status,
                stderr: String::new(),
            })
        }
    }

    /// Starts the sandbox's `podman run` with the launcher's terminal: it stays in the launcher's process
    /// group, because with a TTY podman must be in the terminal's foreground group.
    pub fn spawn_foreground(&self, args: &[OsString]) -> Result<Child, PodmanError> {
        self.command(args).spawn().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PodmanError::NotInstalled,
            _ => PodmanError::Spawn(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::args::*;
    use super::*;

    fn labels() -> SessionLabels {
        SessionLabels {
            session: "abc123".into(),
            pid: 42,
            start: 777,
            boot: "boot-1".into(),
            project: "/home/me/src/p".into(),
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
            config_file: "/tmp/s/router.toml".into(),
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
            home_volume: "agent-sandbox-home".into(),
            home: "/home/me".into(),
            chown_home: false,
            hosts_file: "/tmp/s/hosts".into(),
            resolv_file: "/tmp/s/resolv.conf".into(),
            tty: false,
            pass_env: vec!["TERM".into()],
            command: vec!["claude".into(), "--continue".into()],
        }
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
            relays: vec!["127.0.0.2:443=10.89.3.2:443".into()],
        }));
        let s = strs(&sandbox_run(&sandbox(UserMapping::KeepId)));
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
        let forwarder = strs(&forwarder_run(&ForwarderSpec {
            name: "f".into(),
            labels: labels(),
            pod: "p".into(),
            image: "i".into(),
            relays: vec![],
        }));
        assert!(
            has(&forwarder, &["--log-opt", "max-size=1mb"]),
            "{forwarder:?}"
        );
        let sandbox = strs(&sandbox_run(&sandbox(UserMapping::KeepId)));
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
            relays: vec![],
        }));
        let rootless = strs(&sandbox_run(&sandbox(UserMapping::KeepId)));
        let rootful = strs(&sandbox_run(&sandbox(UserMapping::Host {
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
            &[
                "--volume",
                "/tmp/s/router.toml:/etc/agent-sandbox/router.toml:ro"
            ]
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
    fn forwarder_is_read_only_with_only_net_bind_service() {
        let a = strs(&forwarder_run(&ForwarderSpec {
            name: "agent-sandbox-abc123-forwarder".into(),
            labels: labels(),
            pod: "agent-sandbox-abc123".into(),
            image: "localhost/agent-sandbox-router:dev".into(),
            relays: vec![
                "127.0.0.2:80=10.89.3.2:80".into(),
                "127.0.0.2:443=10.89.3.2:443".into(),
            ],
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
                "127.0.0.2:80=10.89.3.2:80",
                "127.0.0.2:443=10.89.3.2:443"
            ]
        ));
        assert!(!a.iter().any(|s| s.starts_with("--network")));
    }

    #[test]
    fn sandbox_rootless_uses_the_pods_keep_id_and_mounts_only_the_project() {
        let a = strs(&sandbox_run(&sandbox(UserMapping::KeepId)));
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

    #[test]
    fn sandbox_rootful_runs_as_the_given_user() {
        let mut spec = sandbox(UserMapping::Host {
            uid: 1000,
            gid: 1000,
        });
        spec.tty = true;
        spec.chown_home = true;
        let a = strs(&sandbox_run(&spec));
        assert!(has(&a, &["--user", "1000:1000"]));
        assert!(has(
            &a,
            &["--passwd-entry", "me:*:1000:1000:me:/home/me:/bin/bash"]
        ));
        assert!(has(&a, &["--interactive", "--tty"]) || a.contains(&"--tty".to_owned()));
        assert!(has(&a, &["--detach-keys", ""]));
        assert!(has(&a, &["--volume", "agent-sandbox-home:/home/me:U"]));
        assert!(has(&a, &["--security-opt", "unmask=/proc/*"]));
        // A root sandbox user (rootful podman in a root-owned project) keeps /proc masked.
        let mut root = sandbox(UserMapping::Host { uid: 0, gid: 0 });
        root.passwd_entry = None;
        let root = strs(&sandbox_run(&root));
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
                "--build-arg",
                "BASE=localhost/debian:bookworm",
                "--secret",
                "id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt",
                "/r/containers/sandbox"
            ]
        );
    }

    #[test]
    fn display_quotes_what_needs_it() {
        let p = Podman::default();
        assert_eq!(
            p.display(&["run".into(), "a b".into(), "it's".into()]),
            r"podman run 'a b' 'it'\''s'"
        );
    }
}
