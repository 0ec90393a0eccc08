//! The containment self-test: a real session (the session module's own steps, in an empty project
//! directory of the doctor's) whose command is the probe (`probe.py`, run by the image's python3 as
//! the agent's user). The probe is aimed only at addresses this machine already uses: its own
//! addresses, its resolvers, the router's egress side and the addresses the router's DNS hands out.
//! Listeners on this host count whatever arrives from the sandbox, which must be nothing.
//!
//! Where nested podman can run (the sandbox user is not root), the probe also imports the sandbox
//! image's [`NESTED_PROBE_IN_IMAGE`] with the sandbox's own podman and runs the static nested probe
//! (`nested-probe/`) in a nested container: it must share the sandbox's network namespace, get the same
//! DNS answers, reach the router through the same forwarder, and reach none of the same targets.
//!
//! "The address the host resolves for the first allowlisted name" is found the way this host resolves
//! names (getaddrinfo), or from [`Options::upstream_hosts`] in tests; nothing here ever sends to it:
//! only the probes inside the sandbox try it, and must fail.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Deserialize;

use agent_sandbox_shared::Allowlist;

pub use super::host::{
    default_resolv_conf, host_addresses, hosts_file_addresses, resolvers, HostLookup,
    LOOKUP_DEADLINE, MAX_UPSTREAM_ADDRESSES,
};
use super::host::{HostListeners, Lookup, Ports};
use super::report::{Check, Section, Status};
use crate::podman::json::Network;
use crate::podman::{args, Podman};
use crate::session::{self, ProbeTarget};
use crate::settings::{Settings, EGRESS_NETWORK};
use crate::signals::SignalWatch;

/// The probe's source, run with [`PYTHON`] `-c`.
pub const PROBE: &str = include_str!("probe.py");

/// How the probe's python3 starts: isolated (`-I`: no `PYTHON*` variables, no user site directory,
/// nothing from the working directory on the path) and without the `site` module (`-S`: no `.pth`
/// file and no `sitecustomize` or `usercustomize` runs). The probe uses the standard library only, and
/// nothing that the sandbox could have written earlier may run before it and answer in its place.
pub const PYTHON: &[&str] = &["python3", "-I", "-S"];

/// Where the sandbox image keeps the nested probe's root filesystem (containers/sandbox/Containerfile).
pub const NESTED_PROBE_IN_IMAGE: &str = "/usr/lib/agent-sandbox/nested-probe.tar";

/// The nested-podman check: what `probe.py` imports and runs inside the sandbox.
#[derive(Debug, Default, serde::Serialize)]
pub struct NestedSpec {
    /// The root filesystem tarball in the sandbox image.
    pub tarball: String,
    /// The name the tarball is imported as in the sandbox's podman storage (removed after the run).
    pub image: String,
    /// The nested probe's command line, without `--netns` (which only the sandbox can tell).
    pub command: Vec<String>,
}

/// What the probe is told: where to look and what to expect. Serialized as its one argument.
#[derive(Debug, Default, serde::Serialize)]
pub struct ProbeSpec {
    /// An allowlisted name; empty when the allowlist is (the checks that need one are skipped).
    pub name: String,
    /// The loopback address the router's DNS gives it in the sandbox; empty with `name`.
    pub expect: String,
    /// A name that is not on the allowlist (under `.invalid`, so nothing anywhere resolves it).
    pub unlisted: String,
    /// `(kind, address, port)` that a TCP connection must not reach.
    pub tcp: Vec<(String, String, u16)>,
    /// `(kind, address, port)` that a UDP datagram must not reach (this host's listener checks).
    pub udp: Vec<(String, String, u16)>,
    /// `(kind, address, port)` of DNS servers other than the router, which must not answer.
    pub dns: Vec<(String, String, u16)>,
    /// The project directory as mounted.
    pub project: String,
    /// The home volume's mount point.
    pub home: String,
    /// The nested-podman check, when nested podman can run here.
    pub nested: Option<NestedSpec>,
    /// Names to complete one HTTPS handshake with (`--reach`).
    pub reach: Vec<String>,
}

impl ProbeSpec {
    /// The command that runs the probe with this spec.
    #[must_use]
    pub fn command(&self) -> Vec<OsString> {
        PYTHON
            .iter()
            .map(OsString::from)
            .chain([
                "-c".into(),
                PROBE.into(),
                serde_json::to_string(self).unwrap_or_default().into(),
            ])
            .collect()
    }
}

/// One line of the probe's output.
#[derive(Debug, Deserialize)]
struct ProbeLine {
    name: String,
    ok: bool,
    tried: String,
    got: String,
    /// Not a breach but a feature that does not work here (nested podman that cannot start).
    #[serde(default)]
    warn: bool,
    /// Not run (an empty allowlist has no name to resolve); `got` says why.
    #[serde(default)]
    skip: bool,
}

/// The checks every probe run reports (beside the per-address ones).
pub const ALWAYS: &[&str] = &[
    "dns-allowlisted",
    "dns-unlisted-udp",
    "dns-unlisted-tcp",
    "tls-unlisted-sni",
    "http-unlisted-host",
    "no-ipv6",
    "no-capabilities",
    "read-only-/etc/hosts",
    "read-only-/etc/resolv.conf",
    "no-podman-socket",
    "host-mounts",
    "no-setuid",
];

/// Whether the probe's skips of [`NEED_A_NAME`] count: only where it was aimed with no name and the
/// session itself allows nothing (no name has an address in the sandbox). An allowlist that read as
/// empty while the session's router holds names (edited while the doctor ran) is not one.
fn skips_allowed(spec: &ProbeSpec, t: &ProbeTarget) -> bool {
    spec.name.is_empty() && t.loopbacks.is_empty()
}

/// The checks that need an allowlisted name, which the probes skip when the allowlist is empty.
pub const NEED_A_NAME: &[&str] = &[
    "dns-allowlisted",
    "tls-unlisted-sni",
    "http-unlisted-host",
    "nested-dns-allowlisted",
    "nested-router",
];

/// Reads the probe's output into checks; a check the probe should have reported and did not is a
/// failure. The nested probe's checks (`nested`) are expected once `nested-podman` says the nested
/// container ran; when it did not, that one line says why. A line that says it was skipped counts as
/// skipped only when `may_skip` (the allowlist is empty) and the check is one of [`NEED_A_NAME`];
/// any other skip is a failure, as a line that cannot be trusted.
#[must_use]
pub fn parse_output(
    stdout: &str,
    expected: &[String],
    nested: &[String],
    may_skip: bool,
) -> Vec<Check> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let mut nested_ran = false;
    for line in stdout.lines() {
        let Ok(l) = serde_json::from_str::<ProbeLine>(line) else {
            continue;
        };
        seen.insert(l.name.clone());
        nested_ran |= l.name == NESTED_PODMAN && l.ok;
        let detail = format!("{}: {}", l.tried, l.got);
        let check = if l.skip && may_skip && NEED_A_NAME.contains(&l.name.as_str()) {
            Check::skip(Section::Containment, &l.name, detail)
        } else if l.skip {
            Check::bad(
                Section::Containment,
                Status::Fail,
                &l.name,
                format!("{detail} (a skip the doctor did not ask for)"),
                fix_for(&l.name),
            )
        } else if l.ok {
            Check::pass(Section::Containment, &l.name, detail)
        } else if l.warn {
            Check::bad(
                Section::Containment,
                Status::Warn,
                &l.name,
                detail,
                fix_for(&l.name),
            )
        } else {
            Check::bad(
                Section::Containment,
                Status::Fail,
                &l.name,
                detail,
                fix_for(&l.name),
            )
        };
        out.push(check);
    }
    let nested = nested.iter().filter(|_| nested_ran);
    for name in expected.iter().chain(nested) {
        if !seen.contains(name) {
            out.push(Check::bad(
                Section::Containment,
                Status::Fail,
                name,
                "the probe did not report this check",
                "run `agent-sandbox doctor` again; if it persists, report it with this output",
            ));
        }
    }
    out
}

/// The check that says whether the nested container ran.
pub const NESTED_PODMAN: &str = "nested-podman";

/// The one thing to do when a containment check fails.
fn fix_for(name: &str) -> String {
    if name == NESTED_PODMAN {
        return "nested podman does not work in the sandbox here (podman's error above): the sandbox's own containment is unaffected, but agents cannot run containers; `agent-sandbox --exec podman info` shows more".into();
    }
    if ["nested-netns", "nested-dns-allowlisted", "nested-router"].contains(&name) {
        return "nested containers do not get the sandbox's network here (the checks above say how): report this output (podman version inside and outside the sandbox) as a bug".into();
    }
    if name.starts_with("reach-") {
        return "check that the name is on the allowlist and that its upstream answers HTTPS"
            .into();
    }
    "containment does not hold on this machine: do not run agents with agent-sandbox here, and report this output (podman version, kernel, distribution) as a bug".into()
}

/// An empty project directory for the session (and its random part, which also names the nested
/// probe's image), removed on drop.
struct Project(PathBuf, String);

impl Project {
    fn create() -> anyhow::Result<Project> {
        // A directory below the temporary directory is a project a session accepts ($XDG_RUNTIME_DIR
        // and everything in it is refused).
        let base = std::env::temp_dir();
        let mut rand = [0u8; 6];
        fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rand))
            .context("cannot read /dev/urandom")?;
        let hex: String = rand.iter().map(|b| format!("{b:02x}")).collect();
        let dir = base.join(format!("agent-sandbox-doctor-{hex}"));
        fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        Ok(Project(dir, hex))
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Options of the self-test.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Complete an HTTPS handshake with each exact allowlisted name.
    pub reach: bool,
    /// The resolv.conf whose nameservers count as "the host's DNS servers".
    pub host_resolv_conf: PathBuf,
    /// How the host's addresses of the first allowlisted name are found.
    pub upstream_hosts: HostLookup,
}

/// Runs the self-test: one session, one probe, its checks.
pub fn run(
    podman: &Podman,
    settings: &Settings,
    options: &Options,
    signals: &SignalWatch,
    progress: &dyn Fn(&str),
) -> Vec<Check> {
    match run_inner(podman, settings, options, signals, progress) {
        Ok(checks) => checks,
        Err(e) => vec![Check::bad(
            Section::Containment,
            Status::Fail,
            "session",
            format!("a session could not be started: {e:#}"),
            "fix the prerequisites marked ✗ above; `agent-sandbox --exec true` shows the same error",
        )],
    }
}

/// Where systemd-resolved lists the servers it asks, when /etc/resolv.conf names only its stub
/// (127.0.0.53).
const RESOLVED_UPSTREAMS: &str = "/run/systemd/resolve/resolv.conf";

/// The host's resolvers that the probe asks directly (loopback ones left out: inside the sandbox they
/// would be its own loopback), or why there are none. On a systemd-resolved host, whose
/// /etc/resolv.conf names only the stub, those of [`RESOLVED_UPSTREAMS`].
fn host_resolvers(resolv_conf: &Path) -> Result<Vec<IpAddr>, String> {
    let text = fs::read_to_string(resolv_conf)
        .map_err(|e| format!("{} cannot be read ({e})", resolv_conf.display()))?;
    let found = resolvers(&text);
    if !found.is_empty() {
        return Ok(found);
    }
    if resolv_conf == default_resolv_conf() {
        if let Ok(text) = fs::read_to_string(RESOLVED_UPSTREAMS) {
            let found = resolvers(&text);
            if !found.is_empty() {
                return Ok(found);
            }
        }
    }
    Err(format!(
        "{} names no resolver but loopback ones",
        resolv_conf.display()
    ))
}

fn run_inner(
    podman: &Podman,
    settings: &Settings,
    options: &Options,
    signals: &SignalWatch,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<Check>> {
    let project = Project::create()?;
    let listeners = HostListeners::start()?;
    let mut extra = Vec::new();
    let host_resolvers = host_resolvers(&options.host_resolv_conf).unwrap_or_else(|why| {
        extra.push(Check::skip(
            Section::Containment,
            "host-resolver",
            format!("{why}, so no DNS query straight to this host's resolvers is tried"),
        ));
        Vec::new()
    });
    progress("starting a session as `agent-sandbox` would");
    let tcp_ports = listeners.tcp_ports;
    let udp_ports = listeners.udp_ports;
    let described = format!(
        "{}, {}",
        tcp_ports.describe("TCP"),
        udp_ports.describe("UDP")
    );
    let mut expected: Vec<String> = ALWAYS.iter().map(|s| (*s).to_owned()).collect();
    let mut nested_expected = Vec::new();
    let mut may_skip = false;
    let output = session::run_probe(
        podman,
        settings,
        project.0.clone(),
        signals,
        |t| {
            progress("router and pod up; aiming the probe");
            // Read only now: the session's checks create the allowlist from the default when it is missing.
            // A file that no longer loads (edited while the doctor runs) is not an empty allowlist: the
            // session's router has the one it started with, so the checks that need a name fail.
            let allowlist = Allowlist::load(&settings.allowlist).unwrap_or_else(|e| {
                extra.push(Check::bad(
                    Section::Containment,
                    Status::Fail,
                    "allowlist-again",
                    format!("the allowlist, read again once the session was up to aim the probe: {e}"),
                    "the allowlist changed while the doctor ran: fix it (`agent-sandbox doctor --no-session` names the line) and run the doctor again",
                ));
                Allowlist::default()
            });
            let first = allowlist.entries().first().map(|e| e.name().as_str());
            // An empty allowlist has no name to look up (and nothing to reach).
            let lookup = first.map(|n| Lookup::start(n, &options.upstream_hosts));
            let name = first.map(str::to_owned);
            let exact: Vec<String> = allowlist
                .entries()
                .iter()
                .filter(|e| !matches!(e, agent_sandbox_shared::Entry::Subdomains(_)))
                .map(|e| e.name().as_str().to_owned())
                .collect();
            let aim = Aim {
                name,
                exact: if options.reach { exact } else { Vec::new() },
                tcp_ports,
                udp_ports,
                host_resolvers: host_resolvers.clone(),
                nested_image: format!("localhost/agent-sandbox-doctor-probe:{}", project.1),
            };
            let spec = spec(podman, t, aim, lookup, &mut extra);
            may_skip = skips_allowed(&spec, t);
            expected.extend(spec.tcp.iter().map(|(k, ip, _)| format!("tcp-{k}-{ip}")));
            expected.extend(
                spec.udp
                    .iter()
                    .map(|(k, ip, _)| format!("udp-{k}-{ip}-sent")),
            );
            expected.extend(spec.dns.iter().map(|(k, ip, _)| format!("dns-{k}-{ip}")));
            if spec.nested.is_some() {
                expected.push(NESTED_PODMAN.into());
                nested_expected = nested_checks(&spec);
            }
            Ok(spec.command())
        },
        progress,
    );
    let hits = listeners.finish();
    progress("session removed");
    let output = output.map_err(anyhow::Error::new)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut checks = extra;
    checks.extend(parse_output(&stdout, &expected, &nested_expected, may_skip));
    if !output.status.success() && checks.iter().all(|c| c.status != Status::Fail) {
        checks.push(Check::bad(
            Section::Containment,
            Status::Fail,
            "probe",
            format!(
                "the probe exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            "run `agent-sandbox --exec python3 --version` to see whether the sandbox image has python3",
        ));
    }
    checks.push(if hits == 0 {
        Check::pass(
            Section::Containment,
            "host-listeners",
            format!("listeners on this host ({described}) received nothing from the sandbox"),
        )
    } else {
        Check::bad(
            Section::Containment,
            Status::Fail,
            "host-listeners",
            format!("listeners on this host received {hits} connection(s) or datagram(s) from the sandbox"),
            fix_for("host-listeners"),
        )
    });
    Ok(checks)
}

/// The most of this host's own addresses the probe tries (each is a TCP, a UDP and a DNS target). With
/// the resolvers, the router's egress side, the egress gateways and the upstream's addresses, each of
/// the nested probe's lists stays within its `MAX_TARGETS`.
const MAX_HOST_ADDRESSES: usize = 160;

/// The most of this host's resolvers the probe asks directly (resolv.conf's resolver uses 3).
const MAX_RESOLVERS: usize = 32;

/// The most of the egress network's gateways tried.
const MAX_GATEWAYS: usize = 8;

/// What the probe is aimed with, beside what the session tells.
struct Aim {
    /// The first allowlisted name; `None` when the allowlist is empty.
    name: Option<String>,
    /// The exact allowlisted names to reach (`--reach`), or none.
    exact: Vec<String>,
    /// The ports of this host's TCP listeners.
    tcp_ports: Ports,
    /// The ports of this host's UDP listeners.
    udp_ports: Ports,
    /// The host's DNS servers.
    host_resolvers: Vec<IpAddr>,
    /// The name the nested probe's tarball is imported as.
    nested_image: String,
}

/// Aims the probe: what this host already uses, and what the session's router hands out.
fn spec(
    podman: &Podman,
    t: &ProbeTarget,
    aim: Aim,
    lookup: Option<Lookup>,
    extra: &mut Vec<Check>,
) -> ProbeSpec {
    let expect = aim
        .name
        .as_ref()
        .and_then(|name| {
            t.loopbacks
                .iter()
                .find(|l| l.names == *name)
                .or_else(|| t.loopbacks.iter().find(|l| l.names == "*"))
        })
        .map(|l| l.address.to_string())
        .unwrap_or_default();
    let mut spec = ProbeSpec {
        unlisted: format!("agent-sandbox-doctor-{}.invalid", std::process::id()),
        project: t.project.display().to_string(),
        home: t.home.display().to_string(),
        reach: aim.exact,
        ..ProbeSpec::default()
    };
    let addresses = host_addresses();
    if addresses.len() > MAX_HOST_ADDRESSES {
        extra.push(Check::bad(
            Section::Containment,
            Status::Warn,
            "host-addresses",
            format!(
                "this host has {} addresses: the first {MAX_HOST_ADDRESSES} are tried from the sandbox, the other {} are not",
                addresses.len(),
                addresses.len() - MAX_HOST_ADDRESSES
            ),
            "the addresses left out are not proven unreachable: try them by hand from `agent-sandbox --exec bash` (each must fail at once), or run the doctor where the host has fewer",
        ));
    }
    for a in addresses.into_iter().take(MAX_HOST_ADDRESSES) {
        // Without an IPv6 listener, an IPv6 address is still tried, at the IPv4 listener's port: the
        // probe counts a refused connection as one that reached this host.
        let tcp_port = aim.tcp_ports.for_address(a).unwrap_or(aim.tcp_ports.v4);
        spec.tcp.push(("host".into(), a.to_string(), tcp_port));
        match aim.udp_ports.for_address(a) {
            Some(port) => spec.udp.push(("host".into(), a.to_string(), port)),
            None => extra.push(Check::skip(
                Section::Containment,
                &format!("udp-host-{a}"),
                "no IPv6 UDP socket could be opened on this host, so a datagram to this address could not be counted and is not sent",
            )),
        }
        spec.dns.push(("host".into(), a.to_string(), 53));
    }
    for a in aim.host_resolvers.into_iter().take(MAX_RESOLVERS) {
        spec.dns.push(("host-resolver".into(), a.to_string(), 53));
    }
    // A target that cannot be learned is said, never left out in silence.
    match podman.run(&args::container_ip(&t.router, EGRESS_NETWORK)) {
        Ok(ip) if ip.trim().parse::<IpAddr>().is_ok() => {
            let ip = ip.trim();
            spec.tcp.push(("router-egress".into(), ip.to_owned(), 443));
            spec.dns.push(("router-egress".into(), ip.to_owned(), 53));
        }
        found => extra.push(Check::skip(
            Section::Containment,
            "router-egress",
            format!(
                "the router's address on {EGRESS_NETWORK} could not be learned ({}), so it is not tried directly",
                found.map_or_else(|e| e.to_string(), |ip| format!("podman gave {:?}", ip.trim()))
            ),
        )),
    }
    let gateways = podman
        .run(&args::network_inspect(EGRESS_NETWORK))
        .map_err(anyhow::Error::new)
        .and_then(|j| Network::parse_inspect(&j).map_err(anyhow::Error::new))
        .map(|net| {
            net.subnets
                .iter()
                .filter_map(|s| s.gateway)
                .collect::<Vec<_>>()
        });
    match gateways {
        Ok(gateways) if !gateways.is_empty() => {
            // A network has a subnet or two (IPv4, IPv6); more is not a network podman made.
            for g in gateways.into_iter().take(MAX_GATEWAYS) {
                spec.tcp.push(("egress-gateway".into(), g.to_string(), 443));
                spec.dns.push(("egress-gateway".into(), g.to_string(), 53));
            }
        }
        found => extra.push(Check::skip(
            Section::Containment,
            "egress-gateway",
            format!(
                "{EGRESS_NETWORK}'s gateway could not be learned ({}), so it is not tried directly",
                found.map_or_else(|e| format!("{e:#}"), |_| "it has none".to_owned())
            ),
        )),
    }
    match lookup.map_or_else(|| Err("the allowlist is empty".to_owned()), Lookup::wait) {
        Ok(addresses) => {
            for a in addresses {
                spec.tcp.push(("upstream".into(), a.to_string(), 443));
                // UDP too (issue 16: "UDP to those addresses gets nowhere"): a DNS question, which
                // passes only if nothing answers, as for the router's egress side and the gateway.
                spec.dns.push(("upstream".into(), a.to_string(), 53));
            }
        }
        Err(why) => extra.push(Check::skip(
            Section::Containment,
            "upstream-address",
            match &aim.name {
                Some(name) => format!(
                    "this host has no address for {name} ({why}), so a direct connection to it is not tried"
                ),
                None => "the allowlist is empty: no allowlisted name's address to try directly".to_owned(),
            },
        )),
    }
    spec.name = aim.name.unwrap_or_default();
    spec.expect = expect;
    // Nested podman needs a user namespace of the sandbox user's own: a non-root user (keep-id under
    // rootless podman, the sudo user or the project's owner under rootful podman).
    if t.rootless || t.sandbox_uid != 0 {
        spec.nested = Some(NestedSpec {
            tarball: NESTED_PROBE_IN_IMAGE.to_owned(),
            image: aim.nested_image,
            command: nested_command(&spec),
        });
    } else {
        extra.push(Check::bad(
            Section::Containment,
            Status::Warn,
            NESTED_PODMAN,
            "not tried: podman is rootful and the sandbox runs as root here, and root without capabilities cannot make the user namespace nested podman needs",
            "run agent-sandbox as your own user with rootless podman (the supported mode; nested podman works there), or through sudo so that the sandbox runs as you",
        ));
    }
    spec
}

/// The nested probe's command line (in the nested container): the same name, answers and targets as
/// the sandbox's own probe. `probe.py` adds `--netns`.
#[must_use]
pub fn nested_command(spec: &ProbeSpec) -> Vec<String> {
    let mut c = vec![crate::images::NESTED_PROBE_PATH.to_owned()];
    // Without an allowlisted name the nested probe skips what needs one; a name without an address
    // is a command line it refuses (so the nested checks fail), never a skip.
    if !spec.name.is_empty() {
        c.extend(["--name".into(), spec.name.clone()]);
        c.extend(["--expect".into(), spec.expect.clone()]);
    }
    c.extend(["--unlisted".into(), spec.unlisted.clone()]);
    for (option, list) in [
        ("--tcp", &spec.tcp),
        ("--udp", &spec.udp),
        ("--dns", &spec.dns),
    ] {
        for (kind, ip, port) in list {
            c.push(option.into());
            c.push(format!("{kind},{ip},{port}"));
        }
    }
    c
}

/// The checks the nested probe reports for `spec` (its `checks::run` order).
#[must_use]
pub fn nested_checks(spec: &ProbeSpec) -> Vec<String> {
    let mut out: Vec<String> = [
        "nested-netns",
        "nested-dns-allowlisted",
        "nested-dns-unlisted",
        "nested-router",
    ]
    .map(str::to_owned)
    .to_vec();
    out.extend(
        spec.udp
            .iter()
            .map(|(k, ip, _)| format!("nested-udp-{k}-{ip}-sent")),
    );
    out.extend(
        spec.tcp
            .iter()
            .map(|(k, ip, _)| format!("nested-tcp-{k}-{ip}")),
    );
    out.extend(
        spec.dns
            .iter()
            .map(|(k, ip, _)| format!("nested-dns-{k}-{ip}")),
    );
    out
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn probe_output_becomes_checks_and_silence_fails() {
        let out = r#"{"name":"dns-allowlisted","ok":true,"tried":"A x","got":"127.0.0.2"}
noise from python
{"name":"no-setuid","ok":false,"tried":"find","got":"/usr/bin/su"}"#;
        let expected = vec![
            "dns-allowlisted".to_owned(),
            "no-setuid".to_owned(),
            "host-mounts".to_owned(),
        ];
        let checks = parse_output(out, &expected, &["nested-netns".to_owned()], false);
        assert_eq!(checks.len(), 3);
        assert_eq!(checks[0].status, Status::Pass);
        assert_eq!(checks[0].detail, "A x: 127.0.0.2");
        assert_eq!(checks[1].status, Status::Fail);
        assert!(checks[1]
            .fix
            .as_deref()
            .unwrap()
            .contains("containment does not hold"));
        assert_eq!(checks[2].name, "host-mounts");
        assert_eq!(checks[2].status, Status::Fail);
    }

    #[test]
    fn resolvers_and_hosts_file() {
        let conf = "# x\nnameserver 10.255.255.53\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nsearch x\n";
        assert_eq!(
            resolvers(conf),
            [
                "10.255.255.53".parse::<IpAddr>().unwrap(),
                "fe80::1".parse().unwrap()
            ]
        );
        let hosts = "127.0.0.1 localhost\n203.0.113.7 api.example.com api # c\n2001:db8::7 api.example.com\n";
        assert_eq!(
            hosts_file_addresses(hosts, "API.example.com"),
            [
                "203.0.113.7".parse::<IpAddr>().unwrap(),
                "2001:db8::7".parse().unwrap()
            ]
        );
        assert!(hosts_file_addresses(hosts, "example.com").is_empty());
    }

    #[test]
    fn nested_checks_are_required_once_the_nested_container_ran() {
        let nested = vec![
            "nested-netns".to_owned(),
            "nested-tcp-host-10.0.0.5".to_owned(),
        ];
        let expected = vec![NESTED_PODMAN.to_owned()];
        // It did not run: one line says why, and nothing else is demanded.
        let out = r#"{"name":"nested-podman","ok":false,"tried":"podman run","got":"exit 125: x"}"#;
        let checks = parse_output(out, &expected, &nested, false);
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].status, Status::Fail);
        assert!(checks[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("nested podman does not work"));
        // It ran: every one of its checks must be there, and a reached target is a breach.
        let out = r#"{"name":"nested-podman","ok":true,"tried":"podman run","got":"ran"}
{"name":"nested-tcp-host-10.0.0.5","ok":false,"tried":"TCP","got":"connected"}"#;
        let checks = parse_output(out, &expected, &nested, false);
        let status = |n: &str| checks.iter().find(|c| c.name == n).map(|c| c.status);
        assert_eq!(status(NESTED_PODMAN), Some(Status::Pass));
        assert_eq!(status("nested-tcp-host-10.0.0.5"), Some(Status::Fail));
        assert_eq!(status("nested-netns"), Some(Status::Fail));
        assert!(checks
            .iter()
            .find(|c| c.name == "nested-tcp-host-10.0.0.5")
            .and_then(|c| c.fix.as_deref())
            .unwrap()
            .contains("containment does not hold"));
    }

    /// The nested probe's reading of `command` (the doctor's nested command line, `--netns` added).
    fn nested_parse(command: &[String]) -> agent_sandbox_nested_probe::spec::Spec {
        let args = command[1..]
            .iter()
            .map(std::ffi::OsString::from)
            .chain(["--netns".into(), "net:[1]".into()]);
        match agent_sandbox_nested_probe::spec::parse(args).unwrap() {
            agent_sandbox_nested_probe::spec::Invocation::Run(parsed) => parsed,
            agent_sandbox_nested_probe::spec::Invocation::Help => panic!("not a run"),
        }
    }

    #[test]
    fn the_nested_command_is_one_the_nested_probe_accepts() {
        let spec = ProbeSpec {
            name: "api.example.com".into(),
            expect: "127.0.0.2".into(),
            unlisted: "agent-sandbox-doctor-1.invalid".into(),
            tcp: vec![
                ("host".into(), "10.0.0.5".into(), 4100),
                ("upstream".into(), "2001:db8::7".into(), 443),
            ],
            udp: vec![("host".into(), "10.0.0.5".into(), 4101)],
            dns: vec![("host-resolver".into(), "10.0.0.1".into(), 53)],
            ..ProbeSpec::default()
        };
        let command = nested_command(&spec);
        assert_eq!(command[0], crate::images::NESTED_PROBE_PATH);
        let parsed = nested_parse(&command);
        let allowed = parsed.allowed.expect("the allowlisted name");
        assert_eq!(allowed.name, spec.name);
        assert_eq!(allowed.expect.to_string(), spec.expect);
        assert_eq!(parsed.tcp[1].ip.to_string(), "2001:db8::7");
        assert_eq!(
            (parsed.tcp.len(), parsed.udp.len(), parsed.dns.len()),
            (2, 1, 1)
        );
        assert_eq!(
            nested_checks(&spec),
            [
                "nested-netns",
                "nested-dns-allowlisted",
                "nested-dns-unlisted",
                "nested-router",
                "nested-udp-host-10.0.0.5-sent",
                "nested-tcp-host-10.0.0.5",
                "nested-tcp-upstream-2001:db8::7",
                "nested-dns-host-resolver-10.0.0.1",
            ]
        );
    }

    #[test]
    fn skips_count_only_where_the_session_allows_nothing() {
        let mut t = ProbeTarget {
            router: "r".into(),
            router_ip: std::net::Ipv4Addr::new(10, 89, 0, 2),
            loopbacks: Vec::new(),
            rootless: true,
            sandbox_uid: 1000,
            project: "/p".into(),
            home: "/h".into(),
        };
        let empty = ProbeSpec::default();
        assert!(skips_allowed(&empty, &t));
        let named = ProbeSpec {
            name: "web.test".into(),
            ..ProbeSpec::default()
        };
        assert!(!skips_allowed(&named, &t));
        // The allowlist read as empty, but the session's router holds a name.
        t.loopbacks
            .push(agent_sandbox_shared::plan::LoopbackAssignment {
                address: std::net::Ipv4Addr::new(127, 0, 0, 2),
                names: "web.test".into(),
            });
        assert!(!skips_allowed(&empty, &t));
    }

    #[test]
    fn every_target_list_fits_the_nested_probe() {
        // Host addresses, resolvers, the router's egress side, the gateways and the upstream's
        // addresses: the longest list (DNS) the nested probe is given stays within its cap.
        const {
            assert!(
                MAX_HOST_ADDRESSES
                    + MAX_RESOLVERS
                    + 1
                    + MAX_GATEWAYS
                    + super::super::host::MAX_UPSTREAM_ADDRESSES
                    <= agent_sandbox_nested_probe::spec::MAX_TARGETS
            )
        };
    }

    #[test]
    fn an_empty_allowlist_is_a_nested_command_without_a_name_and_only_its_skips_are_honoured() {
        let spec = ProbeSpec {
            unlisted: "agent-sandbox-doctor-1.invalid".into(),
            tcp: vec![("host".into(), "10.0.0.5".into(), 4100)],
            ..ProbeSpec::default()
        };
        let command = nested_command(&spec);
        assert!(
            !command.iter().any(|a| a == "--name" || a == "--expect"),
            "{command:?}"
        );
        let parsed = nested_parse(&command);
        assert_eq!(parsed.allowed, None);
        let out = r#"{"name":"dns-allowlisted","ok":true,"tried":"a name","got":"skipped: empty","skip":true}
{"name":"nested-router","ok":true,"tried":"HTTP","got":"skipped: empty","skip":true}
{"name":"no-setuid","ok":true,"tried":"find","got":"skipped?","skip":true}"#;
        let expected = vec!["dns-allowlisted".to_owned(), "no-setuid".to_owned()];
        let status =
            |checks: &[Check], n: &str| checks.iter().find(|c| c.name == n).map(|c| c.status);
        // The allowlist is empty: the checks that need a name are skipped; a skip of any other
        // check is a line that cannot be trusted.
        let checks = parse_output(out, &expected, &[], true);
        assert_eq!(status(&checks, "dns-allowlisted"), Some(Status::Skip));
        assert_eq!(status(&checks, "nested-router"), Some(Status::Skip));
        assert_eq!(status(&checks, "no-setuid"), Some(Status::Fail));
        // With a name on the allowlist, no skip counts.
        let checks = parse_output(out, &expected, &[], false);
        assert_eq!(status(&checks, "dns-allowlisted"), Some(Status::Fail));
        assert_eq!(status(&checks, "nested-router"), Some(Status::Fail));
        assert!(
            checks.iter().all(|c| c.status == Status::Fail),
            "{checks:?}"
        );
    }

    #[test]
    fn the_upstream_lookup_leaves_out_loopback_and_says_why_it_found_nothing() {
        let dir = std::env::temp_dir().join(format!("as-doctor-hosts-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hosts");
        fs::write(
            &file,
            "127.0.0.1 web.test\n198.18.0.7 web.test\n::ffff:198.18.0.7 web.test\n198.18.0.8 web.test\n",
        )
        .unwrap();
        let how = HostLookup::HostsFile(file.clone());
        let found = Lookup::start("web.test", &how).wait();
        let only_loopback = Lookup::start("localhost", &HostLookup::System).wait();
        let missing = Lookup::start("web.test", &HostLookup::HostsFile(dir.join("none"))).wait();
        let absent = Lookup::start("other.test", &how).wait();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(
            found.unwrap(),
            [
                "198.18.0.7".parse::<IpAddr>().unwrap(),
                "198.18.0.8".parse().unwrap()
            ]
        );
        // localhost comes from /etc/hosts: getaddrinfo sends nothing for it.
        assert!(only_loopback.unwrap_err().contains("but loopback"));
        assert!(missing.unwrap_err().contains("none"));
        assert!(absent.unwrap_err().contains("other.test"));
    }

    #[test]
    fn the_host_listeners_count_what_reaches_ipv4_and_ipv6_addresses() {
        let listeners = HostListeners::start().unwrap();
        let (tcp, udp) = (listeners.tcp_ports, listeners.udp_ports);
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        let udp_v6 = udp
            .for_address(v6)
            .expect("this host has IPv6 loopback: an IPv6 UDP listener");
        let tcp_v6 = tcp
            .for_address(v6)
            .expect("this host has IPv6 loopback: an IPv6 TCP listener");
        assert_ne!(udp_v6, udp.v4);
        assert_ne!(tcp_v6, tcp.v4);
        for ports in [tcp, udp] {
            assert_eq!(
                ports.for_address("::ffff:127.0.0.1".parse().unwrap()),
                Some(ports.v4)
            );
        }
        assert!(tcp.describe("TCP").ends_with("(IPv6)"));
        // As the probe sends them: from a socket of the destination's family, to the port it was told.
        for (to, port) in [(v4, udp.v4), (v6, udp_v6)] {
            let from = if to.is_ipv4() {
                "127.0.0.1:0"
            } else {
                "[::1]:0"
            };
            UdpSocket::bind(from)
                .unwrap()
                .send_to(b"agent-sandbox doctor", (to, port))
                .unwrap();
        }
        for (to, port) in [(v4, tcp.v4), (v6, tcp_v6)] {
            drop(std::net::TcpStream::connect((to, port)).unwrap());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while listeners.hits.load(Ordering::SeqCst) < 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            listeners.finish(),
            4,
            "a datagram and a connection each to 127.0.0.1 and to ::1"
        );
        let nothing = HostListeners::start().unwrap();
        assert_eq!(nothing.finish(), 0);
    }

    #[test]
    fn host_addresses_leave_out_loopback() {
        assert!(host_addresses().iter().all(|a| !a.is_loopback()));
    }

    #[test]
    fn nothing_in_the_home_or_the_environment_runs_before_the_probe() {
        // What an earlier agent could leave in the home volume (or a PYTHON* variable point at): each
        // prints a line that claims a check passed. The probe's own python3 command line, with a
        // stand-in for the probe's source, must print only what the stand-in prints.
        /// Removes the test's directory however the test ends.
        struct Scratch(PathBuf);
        impl Drop for Scratch {
            fn drop(&mut self) {
                let _ = fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("as-doctor-site-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let _scratch = Scratch(dir.clone());
        let claim = |who: &str| {
            format!(
                "print('{{\"name\":\"planted-{who}\",\"ok\":true,\"tried\":\"\",\"got\":\"\"}}')\n"
            )
        };
        let version = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')",
            ])
            .output()
            .unwrap();
        let version = String::from_utf8(version.stdout).unwrap();
        let user_site = dir.join(format!(
            "home/.local/lib/python{}/site-packages",
            version.trim()
        ));
        let path_dir = dir.join("pythonpath");
        for d in [&user_site, &path_dir] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(user_site.join("usercustomize.py"), claim("usercustomize")).unwrap();
        fs::write(
            user_site.join("planted.pth"),
            format!("import sys; exec({:?})\n", claim("pth")),
        )
        .unwrap();
        fs::write(path_dir.join("sitecustomize.py"), claim("sitecustomize")).unwrap();
        fs::write(path_dir.join("json.py"), claim("json-shadow")).unwrap();
        let startup = dir.join("startup.py");
        fs::write(&startup, claim("startup")).unwrap();

        let mut cmd = ProbeSpec::default().command();
        let at = cmd.iter().position(|a| a == "-c").unwrap() + 1;
        cmd[at] = "import json; print('probe ran')".into();
        let out = std::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .env("HOME", dir.join("home"))
            .env("PYTHONPATH", &path_dir)
            .env("PYTHONSTARTUP", &startup)
            .env("PYTHONUSERBASE", dir.join("home/.local"))
            .current_dir(&path_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "probe ran\n");
    }

    /// Runs `code` after the probe's own definitions (its source without the final `main()`), in the
    /// probe's python3 with the default spec, and returns what it printed.
    fn probe_functions(code: &str) -> String {
        let source = PROBE.trim_end().strip_suffix("main()").unwrap();
        let cmd = ProbeSpec::default().command();
        let spec = cmd.last().unwrap().clone();
        let out = std::process::Command::new(&cmd[0])
            .args(&cmd[1..cmd.len() - 2])
            .arg(format!("{source}\n{code}"))
            .arg(spec)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// The probe's lines, by name.
    fn probe_lines(printed: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
        printed
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| Some((v.get("name")?.as_str()?.to_owned(), v)))
            .collect()
    }

    #[test]
    fn host_resolvers_or_why_there_are_none() {
        let dir = std::env::temp_dir().join(format!("as-doctor-resolv-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let stub = dir.join("stub");
        fs::write(&stub, "nameserver 127.0.0.53\noptions edns0\n").unwrap();
        let real = dir.join("real");
        fs::write(&real, "nameserver 127.0.0.53\nnameserver 192.0.2.9\n").unwrap();
        let stub_result = host_resolvers(&stub);
        let real_result = host_resolvers(&real);
        let missing_result = host_resolvers(&dir.join("missing"));
        fs::remove_dir_all(&dir).unwrap();
        // A file of the tests' own is never swapped for systemd-resolved's.
        assert!(
            stub_result
                .as_ref()
                .is_err_and(|why| why.contains("names no resolver but loopback ones")),
            "{stub_result:?}"
        );
        assert_eq!(real_result, Ok(vec![IpAddr::from([192, 0, 2, 9])]));
        assert!(
            missing_result
                .as_ref()
                .is_err_and(|why| why.contains("cannot be read")),
            "{missing_result:?}"
        );
    }

    #[test]
    fn a_query_that_was_sent_fails_whatever_came_back() {
        // Loopback stands in for an address outside: the sandbox has no route off its network, so
        // there a blocked query fails at once. A query that was sent fails the check whether an ICMP
        // error comes back (a closed port) or nothing does (a silent server): both show it left.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let printed = probe_functions(&format!(
            "TIMEOUT = 0.3\n\
             other_dns('silent', '127.0.0.1', {})\n\
             other_dns('closed', '127.0.0.1', {closed_port})\n\
             print(json.dumps({{'name': 'blocked', 'timeout': blocked(socket.timeout('x')), \
             'unreachable': blocked(OSError(errno.ENETUNREACH, 'x'))}}))\n",
            silent.local_addr().unwrap().port()
        ));
        let lines = probe_lines(&printed);
        let silent = &lines["dns-silent-127.0.0.1"];
        assert_eq!(silent["ok"], false, "{silent}");
        assert!(
            silent["got"].as_str().unwrap().starts_with("timed out"),
            "{silent}"
        );
        let closed = &lines["dns-closed-127.0.0.1"];
        assert_eq!(closed["ok"], false, "{closed}");
        assert!(
            closed["got"]
                .as_str()
                .unwrap()
                .contains("ECONNREFUSED (Connection refused), reported by 127.0.0.1"),
            "{closed}"
        );
        assert_eq!(lines["blocked"]["timeout"], false);
        assert_eq!(lines["blocked"]["unreachable"], true);
    }

    #[test]
    fn host_mounts_are_told_by_path_component_and_run_secrets_only_when_empty() {
        let printed = probe_functions(
            "for secrets in (['etc-pki-entitlement'], []):\n    \
             print(json.dumps({'name': str(len(secrets)), 'extra': unexpected_mounts(\
             ['/', SPEC['project'], '/dev/shm', '/devel', '/proc/sys', '/sys/fs/cgroup', \
             '/system-config', '/run/secrets', '/etc/hosts', '/etc/ssl/certs/ca-certificates.crt'], \
             secrets)}))\n",
        );
        let lines = probe_lines(&printed);
        assert_eq!(
            lines["1"]["extra"],
            serde_json::json!([
                "/devel",
                "/run/secrets (holding etc-pki-entitlement)",
                "/system-config"
            ])
        );
        assert_eq!(
            lines["0"]["extra"],
            serde_json::json!(["/devel", "/system-config"])
        );
    }

    #[test]
    fn a_terminated_name_passes_only_on_the_upstreams_answer() {
        let printed = probe_functions(
            "for name, answer in (\n\
             ('router', b'HTTP/1.1 502 Bad Gateway\\r\\nContent-Length: 40\\r\\n\\r\\nagent-sandbox: cannot reach api.example\\n'),\n\
             ('refused', b'HTTP/1.1 403 Forbidden\\r\\n\\r\\nagent-sandbox: refused\\n'),\n\
             ('upstream', b'HTTP/1.1 404 Not Found\\r\\nContent-Length: 9\\r\\n\\r\\n'),\n\
             ('upstream-502', b'HTTP/1.1 502 Bad Gateway\\r\\nContent-Length: 3\\r\\n\\r\\n'),\n\
             ('nothing', b''), ('garbage', b'\\x15\\x03\\x03')):\n    \
             ok, got = judge_terminated(answer)\n    \
             print(json.dumps({'name': name, 'ok': ok, 'got': got}))\n",
        );
        let lines = probe_lines(&printed);
        for (name, ok) in [
            ("router", false),
            ("refused", false),
            ("upstream", true),
            ("upstream-502", true),
            ("nothing", false),
            ("garbage", false),
        ] {
            assert_eq!(lines[name]["ok"], ok, "{}", lines[name]);
        }
        assert!(lines["router"]["got"]
            .as_str()
            .unwrap()
            .contains("agent-sandbox: cannot reach api.example"));
    }

    #[test]
    fn the_probe_is_valid_python_and_the_spec_its_argument() {
        let cmd = ProbeSpec::default().command();
        assert_eq!(cmd[0], "python3");
        assert_eq!(cmd[cmd.len() - 3], "-c");
        assert_eq!(cmd[cmd.len() - 2], PROBE);
        let arg: serde_json::Value =
            serde_json::from_str(cmd[cmd.len() - 1].to_str().unwrap()).unwrap();
        for key in [
            "name", "expect", "unlisted", "tcp", "udp", "dns", "project", "home", "nested", "reach",
        ] {
            assert!(arg.get(key).is_some(), "{key}");
        }
        let status = std::process::Command::new("python3")
            .args(["-c", "import ast,sys; ast.parse(sys.stdin.read())"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                std::io::Write::write_all(c.stdin.as_mut().unwrap(), PROBE.as_bytes())?;
                c.wait()
            })
            .unwrap();
        assert!(status.success());
    }
}
