//! Every podman command the launcher runs, built in one place, and the JSON podman answers with.
//!
//! The session module decides *what* to create; this module decides *how podman is told*: no other
//! module spells a podman flag or a key of podman's JSON.
//!
//! - `spec.rs`: what to create ([`RouterSpec`], [`PodSpec`], …) and the [`SessionLabels`] on every object;
//! - [`args`]: pure builders from a spec to an argument vector, so the security-relevant flags
//!   (capabilities, read-only root filesystems, user mapping, networks, mounts) are unit-tested without
//!   podman;
//! - `runner.rs`: [`Podman`] runs the vectors and turns failures into a [`PodmanError`] that shows the
//!   command and podman's own message;
//! - [`logfile`]: a container's k8s-file log read from the host, without a podman process;
//! - [`json`]: typed readers of podman's JSON answers (`info`, `network inspect`, the listings), for
//!   podman 4.3 through 5.x.

pub mod args;
pub mod json;
pub mod logfile;
mod runner;
mod spec;

pub use runner::{Podman, PodmanError};
pub use spec::{
    Covered, ForwarderSpec, NetworkSpec, PodSpec, RouterSpec, SandboxCa, SandboxSpec,
    SessionLabels, UserMapping,
};

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
/// Label holding the session's log directory (`session::rundir::log_dir`), so that the stale sweep
/// removes the one the session used even when the sweeping launcher's state directory differs.
pub const LABEL_LOG_DIR: &str = "agent-sandbox.log-dir";
/// Label holding the session's directory (`session::rundir::session_dir`), so that the live commands
/// find it even when their `XDG_RUNTIME_DIR` differs from the session's (an ssh login, `su`, cron).
pub const LABEL_SESSION_DIR: &str = "agent-sandbox.session-dir";
/// Label on the shared objects a session creates but does not remove (egress network, home volume).
pub const LABEL_SHARED: &str = "agent-sandbox.shared";
/// Label on the doctor's throw-away home volumes (beside the launcher's [`SessionLabels`]): how a later
/// doctor finds the ones a killed doctor left.
pub const LABEL_DOCTOR_HOME: &str = "agent-sandbox.doctor-home";

/// Where the session directory's `router/` is mounted inside the router container.
pub const ROUTER_CONFIG_DIR: &str = "/etc/agent-sandbox";
/// Where the session directory's `inject/` (session CA and key, the real API key) is mounted inside the
/// router container; it is mounted into no other container.
pub const ROUTER_INJECT_DIR: &str = "/etc/agent-sandbox-inject";
/// Where the host-side OAuth token store's directory is mounted (read-write) inside the router
/// container; it is mounted into no other container.
pub const ROUTER_OAUTH_DIR: &str = "/etc/agent-sandbox-oauth";
/// The router image's user (its Containerfile's `USER`): rootful, the owner of the session's secret
/// files and of the token store; rootless, the id the invoking user is mapped to in the router.
pub const ROUTER_UID: u32 = 65532;
/// The router image's group.
pub const ROUTER_GID: u32 = 65532;
/// Where the sandbox finds the session CA's certificate (`NODE_EXTRA_CA_CERTS`).
pub const SANDBOX_SESSION_CA: &str = "/etc/agent-sandbox/session-ca.pem";
/// The system CA bundle of the (Debian) sandbox image, over which the session's bundle is mounted.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Label on the images `--build-images` makes: the launcher version that built them.
pub const LABEL_VERSION: &str = "agent-sandbox.version";

/// Where the router finds its configuration inside its container.
pub const ROUTER_CONFIG_PATH: &str = "/etc/agent-sandbox/router.toml";
/// Where the session directory's `forwarder/` is mounted inside the forwarder container.
pub const FORWARDER_RELAYS_DIR: &str = "/etc/agent-sandbox-forwarder";
/// The forwarder's relays file inside its container (`--relays`), re-read on SIGHUP.
pub const FORWARDER_RELAYS_PATH: &str = "/etc/agent-sandbox-forwarder/relays";
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
