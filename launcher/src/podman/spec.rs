//! What the session asks podman to create: one spec per object, and the labels every object carries.
//! The session module fills them in; `args.rs` turns them into command lines.

use std::ffi::{OsStr, OsString};
use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::{
    LABEL_BOOT, LABEL_LOG_DIR, LABEL_PID, LABEL_PROJECT, LABEL_SESSION, LABEL_SESSION_DIR,
    LABEL_START,
};

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
    /// The session's log directory, if it has one of its own.
    pub log_dir: Option<PathBuf>,
    /// The session's directory (none for the doctor's home volume, which belongs to no session).
    pub session_dir: Option<PathBuf>,
}

impl SessionLabels {
    /// `--label K=V` pairs, in a fixed order.
    pub(super) fn args(&self) -> Vec<OsString> {
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
        if let Some(dir) = &self.log_dir {
            push(LABEL_LOG_DIR, dir.as_os_str());
        }
        if let Some(dir) = &self.session_dir {
            push(LABEL_SESSION_DIR, dir.as_os_str());
        }
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
    /// The directory on the host holding the router's configuration ([`super::ROUTER_CONFIG_PATH`]'s
    /// file name), mounted read-only as a directory so that a configuration replaced by rename (a live
    /// allowlist change) is what the router reads on SIGHUP; a single-file mount would keep the old inode.
    pub config_dir: PathBuf,
    /// The session directory's `inject/` (CA key, real API key), mounted read-only at
    /// [`super::ROUTER_INJECT_DIR`]: only ever into the router. None: nothing is terminated.
    pub inject_dir: Option<PathBuf>,
    /// The host-side OAuth token store's directory, mounted read-write at
    /// [`super::ROUTER_OAUTH_DIR`] (the router writes refreshed tokens into it): only ever into the
    /// router. None: the sign-in is not injected.
    pub oauth_store: Option<PathBuf>,
    /// Rootless: the invoking user is mapped to the router's user ([`super::ROUTER_UID`]) with
    /// `--userns=keep-id:uid=…,gid=…`, so the router reads and writes the user's own files (the
    /// token store is shared by every session and read by the launcher; it must stay the user's).
    /// Rootful podman refuses keep-id: there the files are given to the router's user instead.
    pub keep_id: bool,
    /// Where its log goes on the host (k8s-file; None: podman's own place): the session's log
    /// directory, so that the launcher can read it, rootless too (podman's own place is not readable
    /// by the user when the container's user namespace owns it).
    pub log_path: Option<PathBuf>,
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
    /// The directory on the host holding the relays file ([`super::FORWARDER_RELAYS_PATH`]'s file
    /// name), mounted read-only as a directory for the same reason as the router's.
    pub relays_dir: PathBuf,
    /// Where its log goes on the host, as [`RouterSpec::log_path`].
    pub log_path: Option<PathBuf>,
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
    /// Rootless: what is mounted below the project on the host, the topmost of each stack
    /// ([`crate::workdir::mounts_below`]), each covered in the sandbox by something empty. Empty
    /// (always, rootful): the project is bound alone, not recursively.
    pub covered: Vec<Covered>,
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
    /// The session CA for terminated hosts: None when nothing is terminated.
    pub ca: Option<SandboxCa>,
    /// Environment variables set to values that are no secret (the CA paths, the placeholder key).
    pub env: Vec<(String, String)>,
    /// Environment variables passed through by name (podman reads the values from its own environment,
    /// so they never show up in a command line).
    pub pass_env: Vec<String>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

/// A mount point below the project, covered in the sandbox: a directory by an empty read-only tmpfs,
/// a file by `/dev/null`, read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Covered {
    /// The mount point.
    pub path: PathBuf,
    /// It is a file (a bind mount of one file), not a directory.
    pub file: bool,
}

/// What the sandbox gets of the session CA: its certificate and a bundle that adds it to the image's
/// roots, both mounted read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxCa {
    /// The CA certificate, mounted at [`super::SANDBOX_SESSION_CA`].
    pub cert: PathBuf,
    /// The image's roots plus the CA, mounted over [`super::SYSTEM_CA_BUNDLE`].
    pub bundle: PathBuf,
}
