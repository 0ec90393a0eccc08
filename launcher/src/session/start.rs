//! Step 3, the session's own objects: the session network, the session directory, the router, the pod
//! and the forwarder, each recorded in the [`Cleanup`] as soon as it exists; done once both containers
//! report their listeners (`readiness.rs`).

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use agent_sandbox_shared::plan::LoopbackAssignment;
use agent_sandbox_shared::SessionPlan;

use super::checks::Checked;
use super::cleanup::Cleanup;
use super::readiness::wait_listening;
use super::rundir::{
    create_log_dir, create_session_dir, log_dir, new_session_id, session_dir, write_file,
};
use super::shared::Shared;
use super::{interrupted, join, say, SessionError, NAME_PREFIX};
use crate::inject::{self, SessionInject};
use crate::live::files;
use crate::liveness;
use crate::podman::json::Network;
use crate::podman::{
    args, ForwarderSpec, NetworkSpec, PodSpec, Podman, RouterSpec, SessionLabels, UserMapping,
};
use crate::settings::{Settings, EGRESS_NETWORK};
use crate::signals::SignalWatch;

/// A started session: everything the command's container needs.
pub(super) struct Session {
    /// Labels for the sandbox container.
    pub(super) labels: SessionLabels,
    /// Prefix of the session's object names.
    pub(super) base: String,
    /// The pod.
    pub(super) pod: String,
    /// The router container.
    pub(super) router: String,
    /// The router's log on the host, where the session put it (None: where podman put it).
    pub(super) router_log: Option<PathBuf>,
    /// The session's /etc/hosts.
    pub(super) hosts: PathBuf,
    /// The session's /etc/resolv.conf.
    pub(super) resolv: PathBuf,
    /// podman for the session's containers: with an empty directory of the session's as its only OCI
    /// hooks directory (`Podman::with_hooks_dir`), so no hook of podman's configuration runs for any;
    /// never interruptible (`Podman::uninterruptible`).
    pub(super) podman: Podman,
    /// The router's address on the session network.
    pub(super) router_ip: Ipv4Addr,
    /// Which names resolve to which loopback address in the sandbox.
    pub(super) loopbacks: Vec<LoopbackAssignment>,
    /// Credential injection: what the sandbox gets of the session CA, and its environment (None:
    /// nothing is terminated).
    pub(super) inject: Option<SessionInject>,
}

/// Step 3: the session network, the router, the pod and the forwarder, recorded in `cleanup` as they
/// come into existence; returns once the router and the forwarder listen.
pub(super) fn start(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    shared: &Shared,
    cleanup: &mut Cleanup,
    signals: &SignalWatch,
) -> Result<Session, SessionError> {
    let planned = plan(podman, settings, checked, shared, cleanup).map_err(SessionError::Start)?;
    interrupted(signals)?;
    let names = launch(&planned.podman, settings, checked, &planned, cleanup)
        .map_err(SessionError::Start)?;
    interrupted(signals)?;
    wait_ready(podman, &planned, &names, signals)?;
    interrupted(signals)?;
    Ok(Session {
        labels: planned.labels,
        base: planned.base,
        pod: names.pod,
        router: names.router,
        router_log: planned.router_log,
        hosts: planned.hosts,
        resolv: planned.resolv,
        // A signal from now on is for the sandboxed command, not the start: nothing it runs is given up
        // at one.
        podman: planned.podman.uninterruptible(),
        router_ip: planned.router_ip,
        loopbacks: planned.plan.loopbacks,
        inject: planned.inject,
    })
}

/// The session network and directory, and the plan they allow: addresses and files.
struct Planned {
    /// The labels of every object of the session.
    labels: SessionLabels,
    /// Prefix of the session's object names (also the network's and the pod's name).
    base: String,
    /// The session network.
    network: String,
    /// The router's address on it.
    router_ip: Ipv4Addr,
    /// The router's configuration and the forwarder's relays.
    plan: SessionPlan,
    /// The router's configuration directory.
    config: PathBuf,
    /// The forwarder's relays directory.
    relays: PathBuf,
    /// The router's log on the host (None: where podman puts it).
    router_log: Option<PathBuf>,
    /// The forwarder's log on the host (None: where podman puts it).
    forwarder_log: Option<PathBuf>,
    /// The session's /etc/hosts.
    hosts: PathBuf,
    /// The session's /etc/resolv.conf.
    resolv: PathBuf,
    /// podman for the session's containers (see [`Session::podman`]).
    podman: Podman,
    /// The session CA, the secret files and the sandbox's side of them (None: nothing terminated).
    inject: Option<SessionInject>,
}

/// The session network, then the session directory with the router's configuration, hosts and
/// resolv.conf.
fn plan(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    shared: &Shared,
    cleanup: &mut Cleanup,
) -> anyhow::Result<Planned> {
    let session = new_session_id()?;
    let logs = log_dir(&settings.state_dir, &session);
    let dir = session_dir(&session);
    let labels = SessionLabels {
        session: session.clone(),
        pid: std::process::id(),
        start: liveness::start_time(std::process::id())
            .context("cannot read this process's start time from /proc")?,
        boot: liveness::boot_id().context("cannot read the boot id from /proc")?,
        project: checked.project.clone(),
        log_dir: Some(logs.clone()),
        session_dir: Some(dir.clone()),
    };
    let base = format!("{NAME_PREFIX}{session}");

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
    // podman's OCI hooks (containers.conf `hooks_dir`) run programs on this machine when a container
    // starts, and can change it in any way: every podman command that starts a container for the
    // session names this empty directory as the only one (`Podman::with_hooks_dir`), so none runs for
    // them (the mount check refuses any that would still come to the sandbox).
    let no_hooks = dir.join("no-hooks");
    fs::create_dir(&no_hooks).with_context(|| format!("cannot create {}", no_hooks.display()))?;
    let podman = &podman.with_hooks_dir(&no_hooks);
    cleanup.log_dir = Some(logs.clone());
    // Without a log directory of its own (a state directory that cannot be written, or one that
    // fails its ownership checks), the session still starts: podman keeps the logs where it keeps
    // every container's, and the live commands ask podman for them, more slowly.
    let logs = match create_log_dir(&logs) {
        Ok(()) => Some(logs),
        Err(e) => {
            // Nothing of it was made (its last step makes the session's own directory).
            cleanup.log_dir = None;
            say!(
                "warning: {e:#}; the router's and the forwarder's logs stay where podman keeps them, and `agent-sandbox allow`, `deny` and `reload` take longer to confirm"
            );
            None
        }
    };
    let router_ip = router_address(&podman.run(&args::network_inspect(&network))?)
        .with_context(|| format!("cannot pick the router's address on network {network}"))?;
    let mut plan = SessionPlan::new(&checked.policy, router_ip)?;
    plan.router.resolvers.clone_from(&shared.resolvers);
    if let Some(resolvers) = &settings.test_resolvers {
        plan.router.resolvers.clone_from(resolvers);
    }
    plan.router.allowlist = Some(settings.allowlist.display().to_string());
    // The session CA's bundle starts from the sandbox image's, read in a container of its own.
    let inject = session_inject(podman, settings, checked, shared, &dir, &session)?;
    plan.router.inject = inject.as_ref().map(|i| i.config.clone());

    // The policy files (router configuration, relays, addresses handed out) and who the session is:
    // what the live commands (`allow`, `deny`, `reload`, `sessions`) read and replace.
    files::create_layout(&dir)?;
    files::write_plan(&dir, &plan)?;
    files::write_meta(
        &dir,
        &files::SessionMeta {
            id: session.clone(),
            project: checked.project.clone(),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            allowlist: settings.allowlist.clone(),
            router_ip,
        },
    )?;
    // The router's and the forwarder's logs go into the session's log directory, and the session
    // directory says where for the live commands, which read their verdicts there. Without a record
    // (a path podman cannot take, or not UTF-8) they ask podman.
    let router_log = logs
        .as_ref()
        .and_then(|l| args::log_path_podman_takes(l.join(files::ROUTER_LOG)));
    let forwarder_log = logs
        .as_ref()
        .and_then(|l| args::log_path_podman_takes(l.join(files::FORWARDER_LOG)));
    for (log, record) in [
        (&router_log, files::ROUTER_LOG_PATH_FILE),
        (&forwarder_log, files::FORWARDER_LOG_PATH_FILE),
    ] {
        if let Some(log) = log {
            let _ = files::write_log_path(&dir.join(record), log);
        }
    }
    let config = dir.join(files::ROUTER_DIR);
    let hosts = dir.join("hosts");
    // IPv4 only: IPv6 is disabled in the pod's netns, so ::1 does not exist there.
    write_file(&hosts, "127.0.0.1\tlocalhost\n")?;
    let resolv = dir.join("resolv.conf");
    write_file(&resolv, &format!("nameserver {router_ip}\n"))?;
    Ok(Planned {
        labels,
        base,
        network,
        router_ip,
        plan,
        config,
        relays: dir.join(files::FORWARDER_DIR),
        router_log,
        forwarder_log,
        hosts,
        resolv,
        podman: podman.clone(),
        inject,
    })
}

/// Credential injection for this session: which hosts are terminated, then the CA and the files
/// (`inject.rs`). With `--no-inject`, or nothing to inject, the session is as before.
fn session_inject(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    shared: &Shared,
    dir: &Path,
    session: &str,
) -> anyhow::Result<Option<SessionInject>> {
    let api_key = inject::host_api_key();
    let store = crate::oauth::default_store_dir();
    let decision = inject::decide(
        &checked.policy,
        api_key.is_some(),
        store.as_deref(),
        settings.inject,
    );
    let prepared = inject::prepare(
        podman,
        &inject::Request {
            session,
            dir,
            decision: &decision,
            api_key: api_key.as_deref(),
            home_volume: &settings.home_volume,
            state_dir: &settings.state_dir,
            cache_dir: &settings.cache_dir,
            image: &settings.image,
            rootless: checked.user.mapping == UserMapping::KeepId,
            upstream_roots: settings.test_upstream_roots.as_deref(),
            home_mountpoint: shared.home_mountpoint.as_deref(),
        },
    )
    .context("cannot prepare credential injection (`--no-inject` runs without it)")?;
    for notice in prepared.iter().flat_map(|p| &p.notices) {
        say!("{notice}");
    }
    Ok(prepared)
}

/// The containers of a session.
struct Names {
    /// The router container.
    router: String,
    /// The pod.
    pod: String,
    /// The forwarder container in the pod (always created: a live `allow` may give it relays).
    forwarder: String,
}

/// The router, and the pod with the forwarder in it.
fn launch(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    planned: &Planned,
    cleanup: &mut Cleanup,
) -> anyhow::Result<Names> {
    // The router and the pod side start at once: the forwarder connects to the router per connection,
    // so neither waits for the other; both are checked for readiness below.
    let base = &planned.base;
    let router = format!("{base}-router");
    let pod = base.clone();
    let forwarder = format!("{base}-forwarder");
    cleanup.router = Some(router.clone());
    cleanup.pod = Some(pod.clone());
    let router_spec = RouterSpec {
        name: router.clone(),
        labels: planned.labels.clone(),
        image: settings.router_image.clone(),
        session_network: planned.network.clone(),
        session_ip: planned.router_ip,
        egress_network: EGRESS_NETWORK.to_owned(),
        config_dir: planned.config.clone(),
        log_path: planned.router_log.clone(),
        inject_dir: planned.inject.as_ref().map(|i| i.router_dir.clone()),
        oauth_store: planned.inject.as_ref().and_then(|i| i.oauth_store.clone()),
        keep_id: checked.user.mapping == UserMapping::KeepId,
    };
    let pod_spec = PodSpec {
        name: pod.clone(),
        labels: planned.labels.clone(),
        network: planned.network.clone(),
        dns: planned.router_ip,
        user: checked.user.mapping.clone(),
    };
    let forwarder_spec = ForwarderSpec {
        name: forwarder.clone(),
        labels: planned.labels.clone(),
        pod: pod.clone(),
        image: settings.router_image.clone(),
        relays_dir: planned.relays.clone(),
        log_path: planned.forwarder_log.clone(),
    };
    let (router_started, pod_started) = std::thread::scope(|s| {
        let r = s.spawn(|| podman.run(&args::router_run(&router_spec)));
        let p = podman
            .run(&args::pod_create(&pod_spec))
            .and_then(|_| podman.run(&args::forwarder_run(&forwarder_spec)));
        (join(r), p)
    });
    router_started?;
    pod_started?;
    Ok(Names {
        router,
        pod,
        forwarder,
    })
}

/// Waits for the router's and the forwarder's listeners, both at once.
fn wait_ready(
    podman: &Podman,
    planned: &Planned,
    names: &Names,
    signals: &SignalWatch,
) -> Result<(), SessionError> {
    let plan = &planned.plan;
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
                wait_listening(
                    podman,
                    &names.forwarder,
                    planned.forwarder_log.as_deref(),
                    &listens,
                    signals,
                )
            }
        });
        let r = wait_listening(
            podman,
            &names.router,
            planned.router_log.as_deref(),
            &router_addrs,
            signals,
        );
        (r, join(f))
    });
    router_ready?;
    forwarder_ready
}

/// The router's address: the second host address of the session network's subnet (the first is the
/// gateway's by convention, even where an internal network has none), skipping the gateway if podman
/// put it there.
fn router_address(inspect_json: &str) -> anyhow::Result<Ipv4Addr> {
    let net = Network::parse_inspect(inspect_json)?;
    for s in &net.subnets {
        let Some((addr, prefix)) = s.subnet.split_once('/') else {
            continue;
        };
        let (Ok(addr), Ok(prefix)) = (addr.parse::<Ipv4Addr>(), prefix.parse::<u32>()) else {
            continue; // IPv6
        };
        if prefix > 29 {
            bail!("subnet {addr}/{prefix} is too small");
        }
        let gateway = match s.gateway {
            Some(IpAddr::V4(g)) => Some(g),
            _ => None,
        };
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
        assert!(router_address(r#"[{"name":"no subnets key"}]"#).is_err());
        assert!(router_address(r#"[{"subnets":[{"subnet":"10.0.0.0/30"}]}]"#).is_err());
        assert!(router_address("garbage").is_err());
    }

    #[test]
    fn router_address_of_real_session_networks() {
        // podman 4.3 gives an internal network no gateway; the router takes .2 either way.
        for json in [
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/podman/4.3.1/network-inspect-session.json"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/podman/5.8.2/network-inspect-session.json"
            )),
        ] {
            assert_eq!(router_address(json).unwrap(), Ipv4Addr::new(10, 89, 0, 2));
        }
    }
}
