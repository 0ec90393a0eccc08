//! The real binary against the test's own servers on loopback: a DNS server and an HTTP server that
//! play the router, listeners that play the host-side targets. Shows every check passing where it
//! should and failing where a sandbox would be breached.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const PROBE: &str = env!("CARGO_BIN_EXE_agent-sandbox-nested-probe");

/// A DNS server on 127.0.0.1 for one test: `unlisted` gets NXDOMAIN (or, when `lie`, an empty
/// NOERROR), every other name an A record 127.0.0.1. It answers from another socket than the one
/// asked, as a host whose route back picks another address does: the probe must still hear it.
/// Answers until the test process ends.
fn dns_server(unlisted: &'static str, lie: bool) -> u16 {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let reply = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = sock.recv_from(&mut buf) {
            let q = &buf[..n];
            let mut name = Vec::new();
            let mut i = 12;
            while i < n && q[i] != 0 {
                let l = usize::from(q[i]);
                if !name.is_empty() {
                    name.push(b'.');
                }
                name.extend_from_slice(&q[i + 1..(i + 1 + l).min(n)]);
                i += l + 1;
            }
            let mut r = q[..(i + 5).min(n)].to_vec();
            r[2] |= 0x80;
            if name == unlisted.as_bytes() {
                r[3] = if lie { 0 } else { 3 };
            } else {
                r[7] = 1;
                r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]);
            }
            let _ = reply.send_to(&r, peer);
        }
    });
    port
}

/// An HTTP server on 127.0.0.1 that answers like the router does for an unlisted Host.
fn router_http() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).into_owned();
            let host = req
                .lines()
                .find_map(|l| l.strip_prefix("Host: "))
                .unwrap_or("")
                .to_owned();
            let body = format!("{host} is not on the allowlist\n");
            let _ = write!(
                s,
                "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn resolv_conf(tag: &str) -> (Dir, PathBuf) {
    let dir = std::env::temp_dir().join(format!("nested-probe-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("resolv.conf");
    std::fs::write(&f, "search dns.podman\nnameserver 127.0.0.1\n").unwrap();
    (Dir(dir), f)
}

/// Runs the probe; returns `(name, ok, got)` of each line.
fn probe(args: &[String]) -> Vec<(String, bool, String)> {
    let out = Command::new(PROBE).args(args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout
        .lines()
        .map(|l| {
            // The lines are flat objects of strings and one boolean: enough to read them here.
            let field = |k: &str| {
                let start = l.find(&format!("\"{k}\":")).unwrap() + k.len() + 3;
                let rest = &l[start..];
                if let Some(s) = rest.strip_prefix('"') {
                    s[..s.find('"').unwrap()].to_owned()
                } else {
                    rest[..rest.find([',', '}']).unwrap()].to_owned()
                }
            };
            (field("name"), field("ok") == "true", field("got"))
        })
        .collect()
}

/// The line of check `name`.
fn line_of<'a>(lines: &'a [(String, bool, String)], name: &str) -> &'a (String, bool, String) {
    lines
        .iter()
        .find(|l| l.0 == name)
        .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
}

fn ok_of(lines: &[(String, bool, String)], name: &str) -> bool {
    line_of(lines, name).1
}

#[test]
fn checks_pass_where_the_path_is_the_router_and_fail_where_a_target_is_reached() {
    let dns = dns_server("unlisted.invalid", false);
    let http = router_http();
    let (_dir, conf) = resolv_conf("pass");
    let netns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let args: Vec<String> = [
        "--netns",
        &netns.to_string_lossy(),
        "--name",
        "web.test",
        "--expect",
        "127.0.0.1",
        "--unlisted",
        "unlisted.invalid",
        "--resolv-conf",
        conf.to_str().unwrap(),
        "--dns-port",
        &dns.to_string(),
        "--http-port",
        &http.to_string(),
        "--tcp",
        &format!("host,127.0.0.1,{}", target.local_addr().unwrap().port()),
        "--udp",
        &format!("host,127.0.0.1,{}", udp.local_addr().unwrap().port()),
        "--dns",
        &format!("host-resolver,127.0.0.1,{dns}"),
    ]
    .map(str::to_owned)
    .to_vec();
    let lines = probe(&args);
    let names: Vec<&str> = lines.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "nested-netns",
            "nested-dns-allowlisted",
            "nested-dns-unlisted",
            "nested-router",
            "nested-udp-host-127.0.0.1-sent",
            "nested-tcp-host-127.0.0.1",
            "nested-dns-host-resolver-127.0.0.1",
        ]
    );
    for pass in [
        "nested-netns",
        "nested-dns-allowlisted",
        "nested-dns-unlisted",
        "nested-router",
        "nested-udp-host-127.0.0.1-sent",
    ] {
        assert!(ok_of(&lines, pass), "{pass}: {lines:?}");
    }
    // Reached: a breach, were this a sandbox.
    assert!(!ok_of(&lines, "nested-tcp-host-127.0.0.1"), "{lines:?}");
    assert!(
        !ok_of(&lines, "nested-dns-host-resolver-127.0.0.1"),
        "{lines:?}"
    );
    let mut buf = [0u8; 64];
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"agent-sandbox doctor (nested)");
}

#[test]
fn another_netns_a_lying_resolver_and_no_router_fail() {
    let dns = dns_server("unlisted.invalid", true);
    // A server that sends each datagram back as it came (not even a DNS response): it got there.
    let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
    let echo_port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = echo.recv_from(&mut buf) {
            let _ = echo.send_to(&buf[..n], peer);
        }
    });
    let (_dir, conf) = resolv_conf("fail");
    // A port of the test's own with nothing listening: refused, as where no router is.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let args: Vec<String> = [
        "--netns",
        "net:[1]",
        "--name",
        "web.test",
        "--expect",
        "127.0.0.2",
        "--unlisted",
        "unlisted.invalid",
        "--resolv-conf",
        conf.to_str().unwrap(),
        "--dns-port",
        &dns.to_string(),
        "--http-port",
        &closed.to_string(),
        "--tcp",
        &format!("host,127.0.0.1,{closed}"),
        "--dns",
        &format!("host,127.0.0.1,{echo_port}"),
    ]
    .map(str::to_owned)
    .to_vec();
    let lines = probe(&args);
    let echoed = line_of(&lines, "nested-dns-host-127.0.0.1");
    assert!(
        !echoed.1 && echoed.2.contains("something came back"),
        "{echoed:?}"
    );
    for fail in [
        "nested-netns",
        "nested-dns-allowlisted",
        "nested-dns-unlisted",
        "nested-router",
        "nested-tcp-host-127.0.0.1",
    ] {
        assert!(!ok_of(&lines, fail), "{fail}: {lines:?}");
    }
    let refused = line_of(&lines, "nested-tcp-host-127.0.0.1");
    assert!(refused.2.contains("the packet got there"), "{refused:?}");
}

#[test]
fn a_bad_command_line_exits_2_with_the_reason() {
    let out = Command::new(PROBE)
        .args(["--netns", "x", "--name", "web.test", "--expect", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"--expect: "nope" is not an IPv4 address"#),
        "{err}"
    );
    assert!(err.contains("Usage: agent-sandbox-nested-probe"), "{err}");
}

/// An empty allowlist (no `--name`, no `--expect`): the checks that need an allowlisted name say they
/// were skipped and why, every other check still runs, another DNS server is asked the unlisted name
/// (an answer of any kind fails), and more targets than the old cap of 64 are each reported.
#[test]
fn an_empty_allowlist_skips_what_needs_a_name_and_every_target_is_still_checked() {
    let dns = dns_server("unlisted.invalid", false);
    let (_dir, conf) = resolv_conf("empty");
    let netns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut args: Vec<String> = [
        "--netns",
        &netns.to_string_lossy(),
        "--unlisted",
        "unlisted.invalid",
        "--resolv-conf",
        conf.to_str().unwrap(),
        "--dns-port",
        &dns.to_string(),
        "--dns",
        &format!("host-resolver,127.0.0.1,{dns}"),
    ]
    .map(str::to_owned)
    .to_vec();
    // 200 loopback addresses (127.0.1.0 - 127.0.1.199), each refused at once: reached.
    for i in 0..200 {
        args.push("--tcp".into());
        args.push(format!("host,127.0.1.{i},{closed}"));
    }
    let out = Command::new(PROBE).args(&args).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    for skipped in ["nested-dns-allowlisted", "nested-router"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("\"name\":\"{skipped}\"")))
            .unwrap_or_else(|| panic!("no {skipped} in {stdout}"));
        assert!(
            line.contains("\"skip\":true") && line.contains("the allowlist is empty"),
            "{line}"
        );
    }
    assert!(!stdout.contains("web.test"), "{stdout}");
    let lines = probe(&args);
    assert!(ok_of(&lines, "nested-netns"), "{lines:?}");
    assert!(ok_of(&lines, "nested-dns-unlisted"), "{lines:?}");
    // The other server was asked the unlisted name, and its NXDOMAIN is an answer: it got there.
    let other = line_of(&lines, "nested-dns-host-resolver-127.0.0.1");
    assert!(
        !other.1 && other.2.contains("answered: rcode 3"),
        "{other:?}"
    );
    let tcp: Vec<_> = lines
        .iter()
        .filter(|l| l.0.starts_with("nested-tcp-host-"))
        .collect();
    assert_eq!(tcp.len(), 200, "{lines:?}");
    assert!(tcp.iter().all(|l| !l.1), "{tcp:?}");
    // Only the skip lines carry the field.
    assert_eq!(stdout.matches("\"skip\"").count(), 2, "{stdout}");
}
