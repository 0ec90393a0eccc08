//! Escape attempts (tests/e2e/scripts/escape.sh): the upstreams' and the router's egress addresses, the
//! gateways, every address of this machine (TCP, UDP, DNS), by address rather than name; listeners on
//! this machine must see nothing.

use std::fs;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mode::sh;
use crate::suite::{finish, Suite};
use crate::EGRESS;

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let dir = s.project("escape");
    s.copy_script(&dir, "escape.sh");
    // Listeners on this machine that the sandbox must not reach.
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    udp.set_nonblocking(true).unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let hits = Arc::clone(&hits);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::SeqCst) {
                if tcp.accept().is_ok() {
                    hits.fetch_add(1, Ordering::SeqCst);
                }
                if udp.recv_from(&mut buf).is_ok() {
                    hits.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let child = s
        .launcher_command(&dir, &["--exec", "bash", "./escape.sh"], &[])
        .spawn()
        .unwrap();
    // The script waits for its targets: some only exist once the session does.
    let ready = dir.join("ready");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut targets = Vec::new();
    for i in 0..2 {
        targets.push(format!("upstream {} 80", s.upstream_ip(i)));
    }
    let router = s
        .session_objects(&dir)
        .into_iter()
        .find(|n| n.ends_with("-router"));
    if let Some(router) = &router {
        let ip = s.mode.podman_ok(&[
            "inspect",
            "--format",
            &format!("{{{{(index .NetworkSettings.Networks \"{EGRESS}\").IPAddress}}}}"),
            router,
        ]);
        targets.push(format!("router-egress {} 443", ip.trim()));
    }
    let egress = s.mode.podman_ok(&[
        "network",
        "inspect",
        "--format",
        "{{range .Subnets}}{{.Gateway}} {{end}}",
        EGRESS,
    ]);
    for gw in egress.split_whitespace().filter(|g| g.contains('.')) {
        targets.push(format!("egress-gateway {gw} {tcp_port}"));
        targets.push(format!("dns-server {gw} 53"));
    }
    if let Some(net) = s.session_objects(&dir).into_iter().find(|n| {
        !n.ends_with("-router")
            && !n.ends_with("-forwarder")
            && !n.ends_with("-sandbox")
            && !n.ends_with("-infra")
    }) {
        let gw = s.mode.podman(&[
            "network",
            "inspect",
            "--format",
            "{{range .Subnets}}{{.Gateway}} {{end}}",
            &net,
        ]);
        for g in String::from_utf8_lossy(&gw.stdout)
            .split_whitespace()
            .filter(|g| g.contains('.') && !g.contains("nil"))
        {
            targets.push(format!("session-gateway {g} {tcp_port}"));
        }
    }
    let addrs = sh(Command::new("ip").args(["-o", "addr", "show", "scope", "global"]));
    for line in String::from_utf8_lossy(&addrs.stdout).lines() {
        let mut f = line.split_whitespace();
        while let Some(w) = f.next() {
            if w == "inet" || w == "inet6" {
                if let Some(a) = f.next() {
                    let ip = a.split('/').next().unwrap();
                    let kind = if w == "inet" { "host" } else { "host6" };
                    targets.push(format!("{kind} {ip} {tcp_port}"));
                    if w == "inet" {
                        targets.push(format!("dns-server {ip} 53"));
                        targets.push(format!("udp {ip} {udp_port}"));
                    }
                }
            }
        }
    }
    let mut body = targets.join("\n");
    body.push('\n');
    let tmp = dir.join("targets.tmp");
    fs::write(&tmp, body).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).unwrap();
    fs::rename(&tmp, dir.join("targets")).unwrap();

    let r = finish(child, Duration::from_secs(300));
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let mode = s.mode.clone();
    eprintln!("  escape targets: {}", targets.join("; "));
    let failed: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    let oks = r.stdout.lines().filter(|l| l.starts_with("ok")).count();
    s.checks.check(
        router.is_some() && failed.is_empty() && oks >= targets.len(),
        format!(
            "[{}] every escape attempt fails ({oks} attempts; failures: {failed:?}; stderr: {})",
            mode.name(),
            r.stderr.trim()
        ),
    );
    s.checks.script(
        &mode,
        &r.stdout,
        &[
            "router-dns-works",
            "no-ipv6-route",
            "ipv6-loopback-only",
            "no-default-route",
        ],
    );
    s.checks.check(
        hits.load(Ordering::SeqCst) == 0,
        format!(
            "[{}] the host's TCP and UDP listeners saw nothing from the sandbox",
            mode.name()
        ),
    );
}
