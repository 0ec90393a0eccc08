//! The containment self-test: a real session (the session module's own steps, in an empty project
//! directory of the doctor's) whose command is the probe (`probe.py`, run by the image's python3 as
//! the agent's user). The probe is aimed only at addresses this machine already uses: its own
//! addresses, its resolvers, the router's egress side and the addresses the router's DNS hands out.
//! Listeners on this host count whatever arrives from the sandbox, which must be nothing.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;

use agent_sandbox_shared::Allowlist;

use super::report::{Check, Section, Status};
use crate::podman::json::Network;
use crate::podman::{args, Podman};
use crate::session::{self, ProbeTarget};
use crate::settings::{Settings, EGRESS_NETWORK};
use crate::signals::SignalWatch;

/// The probe's source, run with `python3 -c`.
pub const PROBE: &str = include_str!("probe.py");

/// What the probe is told: where to look and what to expect. Serialized as its one argument.
#[derive(Debug, Default, serde::Serialize)]
pub struct ProbeSpec {
    /// An allowlisted name.
    pub name: String,
    /// The loopback address the router's DNS gives it in the sandbox.
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
    /// Whether to try a nested `podman run` (rootless only).
    pub nested: bool,
    /// Names to complete one HTTPS handshake with (`--reach`).
    pub reach: Vec<String>,
}

impl ProbeSpec {
    /// The command that runs the probe with this spec.
    #[must_use]
    pub fn command(&self) -> Vec<OsString> {
        vec![
            "python3".into(),
            "-c".into(),
            PROBE.into(),
            serde_json::to_string(self).unwrap_or_default().into(),
        ]
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

/// Reads the probe's output into checks; a check the probe should have reported and did not is a
/// failure.
#[must_use]
pub fn parse_output(stdout: &str, expected: &[String]) -> Vec<Check> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for line in stdout.lines() {
        let Ok(l) = serde_json::from_str::<ProbeLine>(line) else {
            continue;
        };
        seen.insert(l.name.clone());
        let detail = format!("{}: {}", l.tried, l.got);
        out.push(if l.ok {
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
        });
    }
    for name in expected {
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

/// The one thing to do when a containment check fails.
fn fix_for(name: &str) -> String {
    if name == "nested-podman" {
        return "nested podman does not work here (podman's error above); the sandbox's own containment is unaffected, but agents cannot run containers".into();
    }
    if name.starts_with("reach-") {
        return "check that the name is on the allowlist and that its upstream answers HTTPS"
            .into();
    }
    "containment does not hold on this machine: do not run agents with agent-sandbox here, and report this output (podman version, kernel, distribution) as a bug".into()
}

/// This host's own addresses (loopback and IPv6 link-local left out: inside the sandbox they name the
/// sandbox's own interfaces).
#[must_use]
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that freeifaddrs releases; we only read it between.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(addr.cast::<libc::sockaddr_in>());
                        out.push(IpAddr::from(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(addr.cast::<libc::sockaddr_in6>());
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out.retain(|a| match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
    });
    out.sort();
    out.dedup();
    out
}

/// The nameservers of a resolv.conf, loopback ones left out (inside the sandbox they would be its own
/// loopback).
#[must_use]
pub fn resolvers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|s| s.trim().split('%').next()?.parse::<IpAddr>().ok())
        .filter(|a| !a.is_loopback())
        .collect()
}

/// The address this host's /etc/hosts gives `name`: the only lookup the doctor makes on the host, so
/// that it never causes new outside traffic.
#[must_use]
pub fn hosts_file_address(hosts: &str, name: &str) -> Option<IpAddr> {
    hosts.lines().find_map(|l| {
        let l = l.split('#').next()?;
        let mut f = l.split_whitespace();
        let ip = f.next()?.parse::<IpAddr>().ok()?;
        f.any(|n| n.eq_ignore_ascii_case(name)).then_some(ip)
    })
}

/// Counts what reaches listeners on this host from the sandbox (which must be nothing).
struct HostListeners {
    tcp_port: u16,
    udp_port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostListeners {
    fn start() -> anyhow::Result<HostListeners> {
        let tcp = TcpListener::bind("0.0.0.0:0").context("cannot bind a TCP listener")?;
        let udp = UdpSocket::bind("0.0.0.0:0").context("cannot bind a UDP socket")?;
        let tcp_port = tcp.local_addr()?.port();
        let udp_port = udp.local_addr()?.port();
        tcp.set_nonblocking(true)?;
        udp.set_read_timeout(Some(Duration::from_millis(50)))?;
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (hits, stop) = (Arc::clone(&hits), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                // The UDP read's timeout paces the loop; the TCP accept is non-blocking.
                while !stop.load(Ordering::SeqCst) {
                    if tcp.accept().is_ok() {
                        hits.fetch_add(1, Ordering::SeqCst);
                    }
                    if udp.recv_from(&mut buf).is_ok() {
                        hits.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        Ok(HostListeners {
            tcp_port,
            udp_port,
            hits,
            stop,
            thread: Some(thread),
        })
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.hits.load(Ordering::SeqCst)
    }
}

/// An empty project directory for the session, removed on drop.
struct Project(PathBuf);

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
        Ok(Project(dir))
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

fn run_inner(
    podman: &Podman,
    settings: &Settings,
    options: &Options,
    signals: &SignalWatch,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<Check>> {
    let project = Project::create()?;
    let listeners = HostListeners::start()?;
    let host_resolv = fs::read_to_string(&options.host_resolv_conf).unwrap_or_default();
    let hosts = fs::read_to_string("/etc/hosts").unwrap_or_default();
    let mut extra = Vec::new();
    progress("starting a session as `agent-sandbox` would");
    let (tcp_port, udp_port) = (listeners.tcp_port, listeners.udp_port);
    let mut expected: Vec<String> = ALWAYS.iter().map(|s| (*s).to_owned()).collect();
    let output = session::run_probe(podman, settings, project.0.clone(), signals, |t| {
        progress("session up; probing from inside the sandbox");
        // Read only now: the session's checks create the allowlist from the default when it is missing.
        let allowlist = Allowlist::load(&settings.allowlist).unwrap_or_default();
        let name = allowlist
            .entries()
            .first()
            .map(|e| e.name().as_str().to_owned());
        let exact: Vec<String> = allowlist
            .entries()
            .iter()
            .filter(|e| !matches!(e, agent_sandbox_shared::Entry::Subdomains(_)))
            .map(|e| e.name().as_str().to_owned())
            .collect();
        let spec = spec(
            podman,
            t,
            name.as_deref(),
            &exact,
            options.reach,
            (tcp_port, udp_port),
            &host_resolv,
            &hosts,
            &mut extra,
        );
        expected.extend(spec.tcp.iter().map(|(k, ip, _)| format!("tcp-{k}-{ip}")));
        expected.extend(
            spec.udp
                .iter()
                .map(|(k, ip, _)| format!("udp-{k}-{ip}-sent")),
        );
        expected.extend(spec.dns.iter().map(|(k, ip, _)| format!("dns-{k}-{ip}")));
        if spec.nested {
            expected.push("nested-podman".into());
        }
        Ok(spec.command())
    });
    let hits = listeners.finish();
    let output = output.map_err(anyhow::Error::new)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut checks = extra;
    checks.extend(parse_output(&stdout, &expected));
    if !output.status.success() && checks.iter().all(|c| c.status == Status::Pass) {
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
            format!("listeners on this host (TCP {tcp_port}, UDP {udp_port}) received nothing from the sandbox"),
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

/// Aims the probe: what this host already uses, and what the session's router hands out.
#[allow(clippy::too_many_arguments)]
fn spec(
    podman: &Podman,
    t: &ProbeTarget,
    name: Option<&str>,
    exact: &[String],
    reach: bool,
    (tcp_port, udp_port): (u16, u16),
    host_resolv: &str,
    hosts: &str,
    extra: &mut Vec<Check>,
) -> ProbeSpec {
    let name = name.unwrap_or("allowlist-is-empty.invalid").to_owned();
    let expect = t
        .loopbacks
        .iter()
        .find(|l| l.names == name)
        .or_else(|| t.loopbacks.iter().find(|l| l.names == "*"))
        .map(|l| l.address.to_string())
        .unwrap_or_default();
    let mut spec = ProbeSpec {
        unlisted: format!("agent-sandbox-doctor-{}.invalid", std::process::id()),
        project: t.project.display().to_string(),
        home: t.home.display().to_string(),
        nested: t.rootless,
        reach: if reach { exact.to_vec() } else { Vec::new() },
        ..ProbeSpec::default()
    };
    for a in host_addresses() {
        spec.tcp.push(("host".into(), a.to_string(), tcp_port));
        spec.udp.push(("host".into(), a.to_string(), udp_port));
        spec.dns.push(("host".into(), a.to_string(), 53));
    }
    for a in resolvers(host_resolv) {
        spec.dns.push(("host-resolver".into(), a.to_string(), 53));
    }
    if let Ok(ip) = podman.run(&args::container_ip(&t.router, EGRESS_NETWORK)) {
        let ip = ip.trim();
        if ip.parse::<IpAddr>().is_ok() {
            spec.tcp.push(("router-egress".into(), ip.to_owned(), 443));
            spec.dns.push(("router-egress".into(), ip.to_owned(), 53));
        }
    }
    if let Ok(net) = podman
        .run(&args::network_inspect(EGRESS_NETWORK))
        .map_err(anyhow::Error::new)
        .and_then(|j| Network::parse_inspect(&j).map_err(anyhow::Error::new))
    {
        for g in net.subnets.iter().filter_map(|s| s.gateway) {
            spec.tcp.push(("egress-gateway".into(), g.to_string(), 443));
            spec.dns.push(("egress-gateway".into(), g.to_string(), 53));
        }
    }
    match hosts_file_address(hosts, &name) {
        Some(a) if !a.is_loopback() => {
            spec.tcp.push(("upstream".into(), a.to_string(), 443));
        }
        _ => extra.push(Check::skip(
            Section::Containment,
            "upstream-address",
            format!("this host has no address for {name} without a new lookup (the doctor makes none), so a direct connection to it is not tried"),
        )),
    }
    if !t.rootless {
        extra.push(Check::skip(
            Section::Containment,
            "nested-podman",
            "rootful podman: the sandbox user has no user namespace of its own, so nested podman is not offered",
        ));
    }
    spec.name = name;
    spec.expect = expect;
    spec
}

/// The default resolv.conf of the host.
#[must_use]
pub fn default_resolv_conf() -> PathBuf {
    Path::new("/etc/resolv.conf").to_owned()
}

#[cfg(test)]
mod tests {
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
        let checks = parse_output(out, &expected);
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
        let hosts = "127.0.0.1 localhost\n203.0.113.7 api.example.com api # c\n";
        assert_eq!(
            hosts_file_address(hosts, "API.example.com"),
            Some("203.0.113.7".parse().unwrap())
        );
        assert_eq!(hosts_file_address(hosts, "example.com"), None);
    }

    #[test]
    fn host_addresses_leave_out_loopback() {
        assert!(host_addresses().iter().all(|a| !a.is_loopback()));
    }

    #[test]
    fn the_probe_is_valid_python_and_the_spec_its_argument() {
        let cmd = ProbeSpec::default().command();
        assert_eq!(cmd[0], "python3");
        let arg: serde_json::Value = serde_json::from_str(cmd[3].to_str().unwrap()).unwrap();
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
