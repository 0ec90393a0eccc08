//! `agent-sandbox doctor`: it passes here and names every check; each containment check is shown able
//! to fail (the same probe in a plain container on a bridge network of the test's own); broken set-ups
//! give ✗ with the fix and a non-zero exit. Every address probed is this machine's or the test's own
//! containers': the host's resolvers are replaced by a resolv.conf naming this machine's own address,
//! and the host's lookup of the first allowlisted name (web.test) by a hosts file naming web.test's
//! upstream container. Rootless, the nested probe (a nested podman container in the sandbox) must pass
//! every check too; rootful, the doctor runs the sandbox as root and says why nested podman is not tried.

use std::fs;
use std::net::{TcpListener, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::mode::{repo_file, sh};
use crate::suite::Suite;
use crate::SANDBOX_IMAGE;

/// Every prerequisite's name in the table.
const PREREQS: &[&str] = &[
    "podman",
    "mode",
    "subuid/subgid",
    "cgroups",
    "network backend",
    "OCI runtime",
    "user namespaces",
    "/dev/fuse",
    "XDG_RUNTIME_DIR",
    "router image",
    "sandbox image",
    "allowlist",
    "home volume",
    "leftovers",
    "storage driver",
    "trial run",
];

/// The containment checks every run reports (beside one per probed address).
const CONTAINMENT: &[&str] = &[
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
    "host-listeners",
];

/// The nested probe's checks that do not depend on the targets.
const NESTED: &[&str] = &[
    "nested-podman",
    "nested-netns",
    "nested-dns-allowlisted",
    "nested-dns-unlisted",
    "nested-router",
];

/// Run in a session: plants a usercustomize.py in the home volume's user site directory that prints
/// a passing check, and prints where it is.
const PLANT: &str = r#"
import os, site
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
p = os.path.join(d, "usercustomize.py")
with open(p, "w") as f:
    f.write("print('{\"name\":\"planted-usercustomize\",\"ok\":true,\"tried\":\"\",\"got\":\"\"}', flush=True)\n")
print(p)
"#;

/// This machine's first global IPv4 address.
fn host_ipv4() -> String {
    let out = sh(Command::new("ip").args(["-4", "-o", "addr", "show", "scope", "global"]));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .expect("a global IPv4 address")
        .to_owned()
}

fn checks_of(json: &str) -> Vec<Value> {
    serde_json::from_str::<Value>(json)
        .ok()
        .and_then(|v| v["checks"].as_array().cloned())
        .unwrap_or_default()
}

fn status_of<'a>(checks: &'a [Value], name: &str) -> Option<&'a str> {
    checks
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["status"].as_str())
}

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let name = s.mode.name().to_owned();
    let dir = s.project("doctor");
    let resolv = dir.join("host-resolv.conf");
    fs::write(&resolv, format!("nameserver {}\n", host_ipv4())).unwrap();
    // The "outside" address of web.test: its upstream container, which the sandbox must not reach
    // directly (and nothing on this host ever sends to).
    let upstream = s.upstream_ip(0);
    let hosts = dir.join("host-hosts");
    fs::write(&hosts, format!("{upstream} web.test\n")).unwrap();
    let env = [
        (
            "AGENT_SANDBOX_DOCTOR_RESOLV_CONF",
            resolv.display().to_string(),
        ),
        ("AGENT_SANDBOX_DOCTOR_HOSTS", hosts.display().to_string()),
    ];

    // What an earlier agent could leave in the user's home volume to answer for the probe: a
    // usercustomize.py that claims a check passed. The doctor's session has a home of its own.
    let planted = s.launch(&dir, &["--exec", "python3", "-c", PLANT]);
    let planted_at = planted.stdout.trim().to_owned();
    s.checks.check(
        planted.code == Some(0) && planted_at.ends_with("usercustomize.py"),
        format!(
            "[{name}] a usercustomize.py planted in the home volume: {}{}",
            planted.stdout, planted.stderr
        ),
    );

    // 1. It passes here, and its table names every check.
    let t = Instant::now();
    let r = s.launch_env(&dir, &["doctor", "--json"], &env);
    let took = t.elapsed();
    let removed = s.launch(&dir, &["--exec", "rm", "-f", &planted_at]);
    s.checks.check(
        !r.stdout.contains("planted-usercustomize") && removed.code == Some(0),
        format!(
            "[{name}] nothing in the user's home volume runs before the probe: {}",
            r.stdout
        ),
    );
    let homes = s.mode.podman_ok(&[
        "volume",
        "ls",
        "--filter",
        "label=agent-sandbox.doctor-home",
        "--format",
        "{{.Name}}",
    ]);
    s.checks.check(
        homes.trim().is_empty(),
        format!("[{name}] the doctor removes its own home volume: {homes}"),
    );
    eprintln!(
        "  doctor took {took:.1?} ({name}):\n{}",
        r.stderr.trim_end()
    );
    let checks = checks_of(&r.stdout);
    s.checks.check(
        r.code == Some(0),
        format!("[{name}] doctor passes: {}\n{}", r.stdout, r.stderr),
    );
    let expected: Vec<&str> = PREREQS.iter().chain(CONTAINMENT).copied().collect();
    for want in expected {
        let status = status_of(&checks, want);
        s.checks.check(
            matches!(status, Some("pass" | "warn" | "skip")),
            format!("[{name}] doctor names `{want}`, not failed: {status:?}"),
        );
    }
    s.checks.check(
        checks.iter().any(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("tcp-host-"))
        }),
        format!("[{name}] doctor probes this host's addresses"),
    );
    for want in [
        format!("tcp-upstream-{upstream}"),
        format!("dns-upstream-{upstream}"),
        format!("nested-tcp-upstream-{upstream}"),
    ] {
        if want.starts_with("nested-") && s.mode.rootful() {
            continue;
        }
        let status = status_of(&checks, &want);
        s.checks.check(
            status == Some("pass"),
            format!(
                "[{name}] doctor tries web.test's outside address directly: `{want}` {status:?}"
            ),
        );
    }
    if s.mode.rootful() {
        let nested = checks.iter().find(|c| c["name"] == "nested-podman");
        s.checks.check(
            nested.is_some_and(|c| {
                c["status"] == "warn"
                    && c["detail"].as_str().is_some_and(|d| d.contains("rootful"))
                    && c["fix"].as_str().is_some_and(|f| f.contains("rootless"))
            }),
            format!("[{name}] rootful, root sandbox: ! nested-podman with the reason: {nested:?}"),
        );
    } else {
        for want in NESTED {
            let status = status_of(&checks, want);
            s.checks.check(
                status == Some("pass"),
                format!("[{name}] the nested container passes `{want}`: {status:?}"),
            );
        }
        let nested_host = checks
            .iter()
            .filter(|c| {
                c["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("nested-tcp-host-"))
            })
            .collect::<Vec<_>>();
        s.checks.check(
            !nested_host.is_empty() && nested_host.iter().all(|c| c["status"] == "pass"),
            format!("[{name}] the nested container cannot reach this host: {nested_host:?}"),
        );
        // The nested image lives in the doctor's own home volume: nothing of it is in the user's.
        let images = s.launch(
            &dir,
            &["--exec", "podman", "images", "--format", "{{.Repository}}"],
        );
        s.checks.check(
            images.code == Some(0) && !images.stdout.contains("agent-sandbox-doctor-probe"),
            format!(
                "[{name}] the doctor leaves no nested image in the home volume: {}{}",
                images.stdout, images.stderr
            ),
        );
    }
    s.checks.check(
        took < Duration::from_secs(15),
        format!("[{name}] doctor runs in under 15 s: {took:.1?}"),
    );
    s.checks.check(
        s.session_objects(&dir).is_empty() && !r.stderr.contains("could not remove"),
        format!("[{name}] doctor leaves no session objects"),
    );
    let text = s.launch_env(&dir, &["doctor", "--no-session"], &env);
    s.checks.check(
        text.code == Some(0)
            && text.stdout.contains("✓ podman")
            && text.stdout.contains("passed, 0 failed"),
        format!(
            "[{name}] doctor --no-session prints the table: {}",
            text.stdout
        ),
    );

    // `--reach`, against the suite's own upstream: its certificate is from the test CA, which the sandbox
    // image does not trust, so the handshake reaching it ends in a verification failure.
    let reach = s.launch_env(&dir, &["doctor", "--json", "--reach"], &env);
    let checks = checks_of(&reach.stdout);
    let web = checks.iter().find(|c| c["name"] == "reach-web.test");
    s.checks.check(
        web.is_some_and(|c| {
            c["detail"]
                .as_str()
                .is_some_and(|d| d.contains("CERTIFICATE_VERIFY_FAILED"))
        }),
        format!(
            "[{name}] doctor --reach completes a handshake up to web.test's certificate: {web:?}"
        ),
    );

    // An empty allowlist (valid: nothing gets out) is no failure: the checks that need an allowlisted
    // name say they were skipped and why, and every other containment check still runs and passes.
    let empty_list = dir.join("empty-allowlist");
    fs::write(&empty_list, "# nothing\n").unwrap();
    let mut empty_env = env.to_vec();
    empty_env.push(("AGENT_SANDBOX_ALLOWLIST", empty_list.display().to_string()));
    let empty = s.launch_env(&dir, &["doctor", "--json"], &empty_env);
    let checks = checks_of(&empty.stdout);
    let failed: Vec<_> = checks.iter().filter(|c| c["status"] == "fail").collect();
    s.checks.check(
        empty.code == Some(0) && failed.is_empty(),
        format!(
            "[{name}] an empty allowlist: doctor passes: {failed:?} (exit {:?}) {}",
            empty.code, empty.stderr
        ),
    );
    let mut need_a_name = vec!["dns-allowlisted", "tls-unlisted-sni", "http-unlisted-host"];
    if !s.mode.rootful() {
        need_a_name.extend(["nested-dns-allowlisted", "nested-router"]);
    }
    for want in need_a_name {
        let c = checks.iter().find(|c| c["name"] == want);
        s.checks.check(
            c.is_some_and(|c| {
                c["status"] == "skip"
                    && c["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("the allowlist is empty"))
            }),
            format!("[{name}] an empty allowlist: `{want}` skipped, saying why: {c:?}"),
        );
    }
    for want in ["dns-unlisted-udp", "dns-unlisted-tcp", "no-capabilities"] {
        let status = status_of(&checks, want);
        s.checks.check(
            status == Some("pass"),
            format!("[{name}] an empty allowlist: `{want}` still runs and passes: {status:?}"),
        );
    }
    s.checks.check(
        checks.iter().any(|c| {
            c["status"] == "pass"
                && c["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("tcp-host-"))
        }),
        format!("[{name}] an empty allowlist: this host's addresses are still tried"),
    );

    // 2. Broken set-ups: ✗ with the fix, non-zero exit.
    // A PATH with a shell (the suite starts the launcher through `sh`) and no podman.
    let no_podman = dir.join("no-podman-bin");
    fs::create_dir_all(&no_podman).unwrap();
    std::os::unix::fs::symlink("/bin/sh", no_podman.join("sh")).unwrap();
    let bad_list = dir.join("bad-allowlist");
    fs::write(&bad_list, "web.test\n10.0.0.1\n").unwrap();
    for (what, extra, check, fix) in [
        (
            "a missing image",
            (
                "AGENT_SANDBOX_IMAGE",
                "localhost/as-e2e-missing:none".to_owned(),
            ),
            "sandbox image",
            "make build",
        ),
        (
            "an invalid allowlist",
            ("AGENT_SANDBOX_ALLOWLIST", bad_list.display().to_string()),
            "allowlist",
            "edit",
        ),
        (
            "PATH without podman",
            ("PATH", no_podman.display().to_string()),
            "podman",
            "install podman",
        ),
    ] {
        let r = s.launch_env(&dir, &["doctor", "--json", "--no-session"], &[extra]);
        let checks = checks_of(&r.stdout);
        let c = checks.iter().find(|c| c["name"] == check);
        let ok = r.code == Some(1)
            && c.is_some_and(|c| {
                c["status"] == "fail" && c["fix"].as_str().is_some_and(|f| f.contains(fix))
            });
        s.checks.check(
            ok,
            format!(
                "[{name}] {what}: ✗ {check} with the fix: {c:?} (exit {:?}) {}",
                r.code, r.stderr
            ),
        );
        if check == "allowlist" {
            let detail = c.and_then(|c| c["detail"].as_str()).unwrap_or("");
            s.checks.check(
                detail.contains(":2:"),
                format!("[{name}] the allowlist error names its line: {detail}"),
            );
        }
    }

    // 3. Each containment check able to fail: the same probe, in a plain container on a bridge network
    // of this test's own, as root with capabilities, an extra mount, a socket file and a setuid file.
    if s.mode.rootful() {
        control(s, &dir);
        no_subordinate_ids(s);
    }
}

/// A user made for this check (no /etc/subuid or /etc/subgid range), removed with everything of
/// theirs on drop.
struct NoSubIdsUser(&'static str);

impl Drop for NoSubIdsUser {
    fn drop(&mut self) {
        // Their rootless podman leaves a pause process: end exactly the processes of this user.
        let _ =
            sh(Command::new("runuser").args(["-u", self.0, "--", "podman", "system", "migrate"]));
        let pids = sh(Command::new("pgrep").args(["-u", self.0]));
        for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
            let _ = sh(Command::new("kill").args(["-KILL", pid]));
        }
        let _ = sh(Command::new("userdel").args(["--remove", self.0]));
    }
}

/// Rootless podman for a user with no subordinate range: ✗ subuid/subgid with the usermod fix.
fn no_subordinate_ids(s: &mut Suite<'_>) {
    let name = s.mode.name().to_owned();
    let user = "as-e2e-nosubids";
    let made = sh(Command::new("useradd").args([
        "--create-home",
        "-K",
        "SUB_UID_COUNT=0",
        "-K",
        "SUB_GID_COUNT=0",
        user,
    ]));
    let _guard = NoSubIdsUser(user);
    assert!(
        made.status.success(),
        "useradd: {}",
        crate::mode::text(&made)
    );
    let home = format!("/home/{user}");
    let mut c = Command::new("runuser");
    c.args(["-u", user, "--", "env", "-i"])
        .arg(format!("HOME={home}"))
        .arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .arg(format!("USER={user}"));
    if let Ok(conf) = std::env::var("CONTAINERS_CONF") {
        c.arg(format!("CONTAINERS_CONF={conf}"));
    }
    c.args([crate::LAUNCHER, "doctor", "--json", "--no-session"])
        .current_dir("/");
    let out = sh(&mut c);
    let checks = checks_of(&String::from_utf8_lossy(&out.stdout));
    let sub = checks.iter().find(|c| c["name"] == "subuid/subgid");
    s.checks.check(
        out.status.code() == Some(1)
            && sub.is_some_and(|c| {
                c["status"] == "fail"
                    && c["fix"]
                        .as_str()
                        .is_some_and(|f| f.contains("usermod --add-subuids"))
            }),
        format!(
            "[{name}] a user with no subuid range: ✗ subuid/subgid with the fix: {sub:?} {}",
            crate::mode::text(&out)
        ),
    );
}

/// Runs the nested probe outside any sandbox (python3 in the sandbox image, as root in a plain
/// container): a DNS server on the container's own 127.0.0.1:53 that echoes each query back as its
/// answer, then the probe from the image's tarball with the arguments after `-c SCRIPT`.
const NESTED_CONTROL: &str = r#"
import socket, subprocess, sys, tarfile, threading
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
def serve():
    while True:
        q, peer = s.recvfrom(512)
        r = bytearray(q)
        r[2] |= 0x80
        s.sendto(bytes(r), peer)
threading.Thread(target=serve, daemon=True).start()
tarfile.open("/usr/lib/agent-sandbox/nested-probe.tar").extractall("/tmp/nested")
r = subprocess.run(["/tmp/nested/nested-probe", *sys.argv[1:]], capture_output=True, text=True, timeout=60)
sys.stdout.write(r.stdout)
sys.stderr.write(r.stderr)
"#;

/// The probe outside a sandbox: every check that a sandbox must pass reports failure here.
fn control(s: &mut Suite<'_>, dir: &std::path::Path) {
    let name = s.mode.name().to_owned();
    let host = host_ipv4();
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (tcp_port, udp_port) = (
        tcp.local_addr().unwrap().port(),
        udp.local_addr().unwrap().port(),
    );
    // A DNS server of the test's own on this host: it echoes each query back, which the probes read as
    // an answer (a sandbox must never get one from anything but its router). It serves both probe runs.
    let dns = UdpSocket::bind("0.0.0.0:0").unwrap();
    dns.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let dns_port = dns.local_addr().unwrap().port();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok((n, peer)) = dns.recv_from(&mut buf) {
                    let _ = dns.send_to(&buf[..n], peer);
                }
            }
        })
    };
    let network = format!("as-e2e-doctor-{}", std::process::id());
    s.mode
        .podman_ok(&["network", "create", "--disable-dns", &network]);
    let sock = dir.join("podman.sock");
    fs::write(&sock, "").unwrap();
    let spec = serde_json::json!({
        "name": "web.test", "expect": "127.0.0.2", "unlisted": "unlisted.invalid",
        "tcp": [["host", host, tcp_port]], "udp": [["host", host, udp_port]],
        "dns": [["host", host, dns_port]],
        "project": "/project", "home": "/root", "nested": null, "reach": [],
    });
    let probe = fs::read_to_string(repo_file("launcher/src/doctor/probe.py")).unwrap();
    let script = "cp /bin/true /tmp/setuid-true && chmod u+s /tmp/setuid-true && exec python3 -c \"$0\" \"$1\"";
    let out = s.mode.podman(&[
        "run",
        "--rm",
        "--network",
        &network,
        // The container's resolver is this machine's own address: no query can leave the machine.
        "--dns",
        &host,
        "--user",
        "0",
        "-v",
        &format!("{}:/project", dir.display()),
        "-v",
        &format!("{}:/mnt/extra:ro", dir.display()),
        "-v",
        &format!("{}:/run/podman/podman.sock", sock.display()),
        SANDBOX_IMAGE,
        "bash",
        "-c",
        script,
        &probe,
        &spec.to_string(),
    ]);
    // The nested probe, outside any sandbox: from the sandbox image's tarball, in a container on the
    // same bridge, its resolver a DNS server of the container's own on 127.0.0.1 that answers every
    // query (so no query leaves the container), told a network namespace that is not its own.
    let nested_udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    nested_udp
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let nested_udp_port = nested_udp.local_addr().unwrap().port();
    let nested_args = [
        "--netns".to_owned(),
        "net:[0]".to_owned(),
        "--name".to_owned(),
        "web.test".to_owned(),
        "--expect".to_owned(),
        "127.0.0.2".to_owned(),
        "--unlisted".to_owned(),
        "unlisted.invalid".to_owned(),
        "--tcp".to_owned(),
        format!("host,{host},{tcp_port}"),
        "--udp".to_owned(),
        format!("host,{host},{nested_udp_port}"),
        "--dns".to_owned(),
        format!("host,{host},{dns_port}"),
    ];
    let mut run: Vec<&str> = vec![
        "run",
        "--rm",
        "--network",
        &network,
        "--dns",
        "127.0.0.1",
        "--user",
        "0",
        SANDBOX_IMAGE,
        "python3",
        "-c",
        NESTED_CONTROL,
    ];
    run.extend(nested_args.iter().map(String::as_str));
    let nested_out = s.mode.podman(&run);
    let _ = s.mode.podman(&["network", "rm", "--force", &network]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = echo.join();
    let nested_stdout = String::from_utf8_lossy(&nested_out.stdout).into_owned();
    let nested_results: Vec<Value> = nested_stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for check in [
        "nested-netns".to_owned(),
        "nested-dns-allowlisted".to_owned(),
        "nested-dns-unlisted".to_owned(),
        "nested-router".to_owned(),
        format!("nested-tcp-host-{host}"),
        format!("nested-dns-host-{host}"),
    ] {
        let r = nested_results.iter().find(|r| r["name"] == check.as_str());
        s.checks.check(
            r.is_some_and(|r| r["ok"] == false),
            format!(
                "[{name}] outside a sandbox, the nested probe's `{check}` reports failure: {r:?} {}",
                if r.is_none() { crate::mode::text(&nested_out) } else { String::new() }
            ),
        );
    }
    let mut buf = [0u8; 64];
    s.checks.check(
        nested_udp.recv_from(&mut buf).is_ok(),
        format!(
            "[{name}] outside a sandbox, the nested probe's datagram reaches this host's listener"
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let results: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let must_fail = [
        "dns-allowlisted",
        "dns-unlisted-udp",
        "dns-unlisted-tcp",
        "tls-unlisted-sni",
        "http-unlisted-host",
        "no-capabilities",
        "read-only-/etc/hosts",
        "read-only-/etc/resolv.conf",
        "no-podman-socket",
        "host-mounts",
        "no-setuid",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([format!("tcp-host-{host}"), format!("dns-host-{host}")]);
    for check in must_fail {
        let r = results.iter().find(|r| r["name"] == check.as_str());
        s.checks.check(
            r.is_some_and(|r| r["ok"] == false),
            format!("[{name}] outside a sandbox, `{check}` reports failure: {r:?}"),
        );
    }
    tcp.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    s.checks.check(
        udp.recv_from(&mut buf).is_ok(),
        format!("[{name}] outside a sandbox, the UDP datagram reaches this host's listener"),
    );
    if !results.iter().any(|r| r["name"] == "no-setuid") {
        eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    }
}
