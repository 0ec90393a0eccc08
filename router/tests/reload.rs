//! Live reload of the standalone gateway, with the real binary in a network namespace of the test's own
//! (see `lab`): SIGHUP, the allowlist watch (rename, in-place write, a Kubernetes ConfigMap `..data`
//! swap), invalid files, and the listeners of `host:port` entries a reload adds or removes.
//!
//! Entries a reload adds listen on `0.0.0.0:PORT` inside R (the default), which touches nothing outside
//! the namespace. A `--forward` mapping to `127.0.0.1:0` works for an entry present at start-up: the
//! kernel picks the port once and a reload that keeps the entry keeps its listener. (`--forward` for an
//! entry absent at start-up is a usage error, so a mapping cannot be given ahead for an entry a reload
//! will add; a reload that removes a mapped entry closes its listener, with a warning.)

mod gateway;
mod lab;

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use agent_sandbox_router::proxy::tls::build;
use gateway::{replace_file, Gateway, SlowBody, TempDir};
use hickory_proto::op::ResponseCode;
use lab::{Dns, DnsBehaviour, Lab, Upstream};

/// The watch must notice a change within this long (issue 13).
const WATCH_BOUND: Duration = Duration::from_secs(5);

const NX: (ResponseCode, usize) = (ResponseCode::NXDomain, 0);
const ANSWERED: (ResponseCode, usize) = (ResponseCode::NoError, 1);

/// A lab with a resolver, an allowlist file and the router.
struct Fixture {
    lab: Lab,
    dns: Dns,
    dir: TempDir,
    list: std::path::PathBuf,
}

impl Fixture {
    fn new(initial: &str) -> Option<Fixture> {
        if !lab::require_netns() {
            return None;
        }
        let lab = Lab::new(4);
        let dns = Dns::start(&lab);
        let dir = TempDir::new("reload");
        let list = dir.0.join("allowed-hosts");
        std::fs::write(&list, initial).unwrap();
        Some(Fixture {
            lab,
            dns,
            dir,
            list,
        })
    }

    fn start(&self, extra: &[&str]) -> Gateway {
        Gateway::start(&self.lab, &self.dns, &self.list, extra)
    }

    /// An HTTP upstream for `name` on the `i`th upstream address, answering `200 hello NAME`.
    fn hello(&self, name: &str, i: usize) -> Upstream {
        let ip = self.lab.upstream_ips[i];
        self.dns.set(name, DnsBehaviour::A(ip));
        let body = format!("hello {name}");
        Upstream::start(&self.lab, SocketAddr::from((ip, 80)), move |mut s| {
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut buf);
            let _ = s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        })
    }
}

fn status(reply: &str) -> &str {
    reply.split(' ').nth(1).unwrap_or("none")
}

/// SIGHUP: an added name is answered and connectable right after the reload, a removed one is
/// NXDOMAIN and refused, and a relay admitted before the reload keeps flowing after it.
#[test]
fn sighup_adds_and_removes_names_and_relays_go_on() {
    let Some(f) = Fixture::new("keep.test\nold.test\n") else {
        return;
    };
    let _keep = f.hello("keep.test", 0);
    let _new = f.hello("new.test", 1);
    let slow = SlowBody::new();
    f.dns
        .set("old.test", DnsBehaviour::A(f.lab.upstream_ips[2]));
    let _old = Upstream::start(
        &f.lab,
        SocketAddr::from((f.lab.upstream_ips[2], 80)),
        slow.handler(),
    );
    let gw = f.start(&[]);
    assert_eq!(gw.query("new.test"), NX);
    assert_eq!(status(&gw.http_get("new.test")), "403");

    // A relay to old.test, flowing before the reload.
    let mut relay = gw.connect(gw.http).unwrap();
    relay
        .write_all(b"GET /long HTTP/1.1\r\nHost: old.test\r\n\r\n")
        .unwrap();
    gateway::read_first_half(&mut relay);

    std::fs::write(&f.list, "keep.test\nnew.test\n").unwrap();
    gw.signal(libc::SIGHUP);
    let summary = gw.wait_reload(1);
    assert_eq!(summary["level"], "INFO", "{summary}");
    assert_eq!(summary["fields"]["result"], "success");
    assert_eq!(summary["fields"]["entries_before"], 2);
    assert_eq!(summary["fields"]["entries_after"], 2);
    assert_eq!(
        summary["fields"]["message"], "reload succeeded: 2 -> 2 entries",
        "one summary line, entries before -> after"
    );

    assert_eq!(gw.query("new.test"), ANSWERED);
    let reply = gw.http_get("new.test");
    assert!(reply.ends_with("hello new.test"), "{reply:?}");
    assert_eq!(gw.query("old.test"), NX);
    assert_eq!(status(&gw.http_get("old.test")), "403");
    assert!(gw.http_get("keep.test").ends_with("hello keep.test"));

    // The relay admitted under the old policy finishes.
    slow.release();
    gateway::read_second_half(&mut relay);
}

/// Polls DNS for `name` after `change` and prints how long the watch took.
fn watched(gw: &Gateway, what: &str, name: &str) {
    let took = gw.wait_answered(name);
    println!("{what}: picked up after {took:?} with no signal");
    assert!(took < WATCH_BOUND, "{what}: took {took:?}");
    let summary = gw.wait_reload(1);
    assert_eq!(summary["fields"]["result"], "success", "{summary}");
    assert_eq!(summary["fields"]["entries_before"], 1, "{summary}");
    assert_eq!(summary["fields"]["entries_after"], 2);
}

#[test]
fn watch_picks_up_a_rename() {
    let Some(f) = Fixture::new("a.test\n") else {
        return;
    };
    let gw = f.start(&[]);
    assert_eq!(gw.query("b.test"), NX);
    replace_file(&f.list, "a.test\nb.test\n");
    watched(&gw, "rename over the file", "b.test");
    // A second change lands at some point of the watch's cycle rather than right after its start.
    replace_file(&f.list, "a.test\nb.test\nc.test\n");
    let took = gw.wait_answered("c.test");
    println!("second rename: picked up after {took:?} with no signal");
    assert!(took < WATCH_BOUND, "second rename: took {took:?}");
}

#[test]
fn watch_picks_up_an_in_place_write() {
    let Some(f) = Fixture::new("a.test\n") else {
        return;
    };
    let gw = f.start(&[]);
    assert_eq!(gw.query("b.test"), NX);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&f.list)
        .unwrap();
    file.write_all(b"b.test\n").unwrap();
    drop(file);
    watched(&gw, "in-place write", "b.test");
}

/// A ConfigMap volume: `allowed-hosts -> ..data/allowed-hosts`, `..data -> ..2026_a`; an update writes
/// a new timestamped directory and swaps `..data` by rename. The file itself is never written.
#[test]
fn watch_picks_up_a_configmap_swap() {
    let Some(f) = Fixture::new("") else {
        return;
    };
    let root = &f.dir.0;
    let cm = root.join("cm");
    std::fs::create_dir(&cm).unwrap();
    let version = |stamp: &str, content: &str| {
        let d = cm.join(stamp);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("allowed-hosts"), content).unwrap();
    };
    version("..2026_a", "a.test\n");
    std::os::unix::fs::symlink("..2026_a", cm.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/allowed-hosts", cm.join("allowed-hosts")).unwrap();
    let gw = Gateway::start(&f.lab, &f.dns, &cm.join("allowed-hosts"), &[]);
    assert_eq!(gw.query("a.test"), ANSWERED);
    assert_eq!(gw.query("b.test"), NX);

    version("..2026_b", "a.test\nb.test\n");
    std::os::unix::fs::symlink("..2026_b", cm.join("..data_tmp")).unwrap();
    std::fs::rename(cm.join("..data_tmp"), cm.join("..data")).unwrap();
    std::fs::remove_dir_all(cm.join("..2026_a")).unwrap();
    watched(&gw, "ConfigMap ..data swap", "b.test");
}

/// An invalid file: the old policy serves on whole, each error is logged with file:line, then one
/// "reload failed" line, the failure is counted; a later valid file applies.
#[test]
fn invalid_file_keeps_the_old_policy() {
    let Some(f) = Fixture::new("a.test\nb.test\n") else {
        return;
    };
    let gw = f.start(&[]);
    let failures = |gw: &Gateway| {
        gw.metric(
            "agent_sandbox_router_config_reloads_total",
            &[("result", "failure")],
        )
    };
    assert_eq!(failures(&gw), Some(0.0));
    // Lines 2 and 4 are wrong; c.test on line 3 is fine but must not apply alone.
    replace_file(&f.list, "a.test\n10.0.0.1\nc.test\ntwo words\n");
    let summary = gw.wait_reload(1);
    assert_eq!(summary["fields"]["result"], "failure", "{summary}");
    assert_eq!(summary["level"], "WARN");
    assert_eq!(summary["fields"]["entries_before"], 2);
    assert_eq!(summary["fields"]["entries_after"], 2);
    let path = f.list.display().to_string();
    let errors: Vec<String> = gw
        .events("reload error")
        .iter()
        .map(|e| e["fields"]["error"].as_str().unwrap().to_owned())
        .collect();
    for line in [2, 4] {
        let at = format!("{path}:{line}:");
        assert_eq!(
            errors.iter().filter(|e| e.starts_with(&at)).count(),
            1,
            "one line for the error at {at}: {errors:#?}"
        );
    }
    assert!(
        errors
            .iter()
            .all(|e| !e.contains(":3:") && !e.contains(":1:")),
        "{errors:#?}"
    );
    assert_eq!(gw.query("a.test"), ANSWERED);
    assert_eq!(gw.query("b.test"), ANSWERED, "the old policy stays whole");
    assert_eq!(gw.query("c.test"), NX, "nothing half-applied");
    assert_eq!(failures(&gw), Some(1.0));
    assert_eq!(
        gw.metric("agent_sandbox_router_allowlist_entries", &[]),
        Some(2.0)
    );

    replace_file(&f.list, "a.test\nc.test\n");
    let summary = gw.wait_reload(2);
    assert_eq!(summary["fields"]["result"], "success", "{summary}");
    assert_eq!(gw.query("c.test"), ANSWERED);
    assert_eq!(gw.query("b.test"), NX);
    assert_eq!(
        gw.metric(
            "agent_sandbox_router_config_reloads_total",
            &[("result", "success")]
        ),
        Some(1.0)
    );
    assert_eq!(failures(&gw), Some(1.0));
}

/// The "listening on" address logged for entry `entry`, as many times as there are workers.
fn forward_listening(gw: &Gateway, entry: &str) -> Vec<SocketAddr> {
    gw.messages()
        .iter()
        .filter_map(|m| gateway::listening(m))
        .filter(|(_, proto)| *proto == format!("forward {entry}"))
        .map(|(a, _)| a)
        .collect()
}

/// A raw forward to an upstream that echoes: `ping` comes back.
fn echo_through(gw: &Gateway, addr: SocketAddr) {
    let mut s = gw.connect(addr).expect("connect to a forward listener");
    s.write_all(b"ping").unwrap();
    assert_eq!(gateway::read_n(&mut s, 4), b"ping");
}

fn echo(mut s: std::net::TcpStream) {
    let mut buf = [0u8; 1024];
    while let Ok(n) = std::io::Read::read(&mut s, &mut buf) {
        if n == 0 || s.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// `host:port` entries: an added one listens (on 0.0.0.0:PORT by default, or on its `--forward`
/// address) and relays; a removed one closes; one whose port is taken fails the whole reload.
#[test]
fn reload_opens_and_closes_entry_listeners() {
    let Some(f) = Fixture::new("a.test\nfixed.test:7001\n") else {
        return;
    };
    let mut upstreams = Vec::new();
    for (name, i, port) in [("fixed.test", 0, 7001), ("db.test", 1, 7002)] {
        f.dns.set(name, DnsBehaviour::A(f.lab.upstream_ips[i]));
        upstreams.push(Upstream::start(
            &f.lab,
            SocketAddr::from((f.lab.upstream_ips[i], port)),
            echo,
        ));
    }
    let gw = f.start(&["--threads", "2", "--forward", "fixed.test:7001=127.0.0.1:0"]);
    let fixed = forward_listening(&gw, "fixed.test:7001");
    assert_eq!(fixed.len(), 1, "one line per listener at start-up");
    echo_through(&gw, fixed[0]);

    // Added: 0.0.0.0:7002 inside R, on both workers.
    replace_file(&f.list, "a.test\nfixed.test:7001\ndb.test:7002\n");
    gw.signal(libc::SIGHUP);
    let summary = gw.wait_reload(1);
    assert_eq!(summary["fields"]["result"], "success", "{summary}");
    assert_eq!(summary["fields"]["entries_before"], 2);
    assert_eq!(summary["fields"]["entries_after"], 3);
    assert_eq!(summary["fields"]["opened"], "db.test:7002");
    gw.wait_events("listening on 0.0.0.0:7002 (forward db.test:7002)", 2);
    echo_through(&gw, "127.0.0.1:7002".parse().unwrap());
    echo_through(&gw, fixed[0]);
    assert_eq!(
        forward_listening(&gw, "fixed.test:7001").len(),
        1,
        "a kept entry is not reopened"
    );
    // A connection open on the entry when it is removed goes on.
    let mut open = gw.connect("127.0.0.1:7002".parse().unwrap()).unwrap();
    open.write_all(b"one").unwrap();
    assert_eq!(gateway::read_n(&mut open, 3), b"one");

    // Removed: the listener closes.
    let reloads = gw.reloads();
    replace_file(&f.list, "a.test\nfixed.test:7001\n");
    gw.signal(libc::SIGHUP);
    let summary = gw.wait_reload_where(reloads, |v| v["fields"]["closed"] == "db.test:7002");
    assert_eq!(summary["fields"]["result"], "success", "{summary}");
    assert_eq!(summary["fields"]["entries_after"], 2);
    let refused = (0..500).find_map(|_| match gw.connect("127.0.0.1:7002".parse().unwrap()) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
        _ => {
            std::thread::sleep(Duration::from_millis(10));
            None
        }
    });
    assert!(refused.is_some(), "the removed entry's port still accepts");
    open.write_all(b"two").unwrap();
    assert_eq!(gateway::read_n(&mut open, 3), b"two");
    drop(open);

    // A port held by the test: the whole reload fails, the new name is not answered either.
    let _held: TcpListener = gw.in_r(|| TcpListener::bind("0.0.0.0:7003").unwrap());
    let reloads = gw.reloads();
    replace_file(&f.list, "a.test\nfixed.test:7001\nb.test\nheld.test:7003\n");
    gw.signal(libc::SIGHUP);
    let summary = gw.wait_reload_where(reloads, |v| v["fields"]["result"] == "failure");
    assert_eq!(summary["fields"]["entries_before"], 2, "{summary}");
    assert_eq!(summary["fields"]["entries_after"], 2);
    assert!(
        gw.events("reload error")
            .iter()
            .any(|e| e["fields"]["error"]
                .as_str()
                .is_some_and(|t| t.contains("held.test:7003") && t.contains("0.0.0.0:7003"))),
        "the bind error names the entry and address:\n{}",
        gw.log()
    );
    assert_eq!(gw.query("b.test"), NX);
    assert_eq!(gw.query("a.test"), ANSWERED);
    echo_through(&gw, fixed[0]);

    // Removing the entry that has a `--forward` mapping: a warning, and its listener closes.
    let reloads = gw.reloads();
    replace_file(&f.list, "a.test\n");
    gw.signal(libc::SIGHUP);
    let summary = gw.wait_reload_where(reloads, |v| v["fields"]["closed"] == "fixed.test:7001");
    assert_eq!(summary["fields"]["result"], "success", "{summary}");
    assert!(
        gw.messages()
            .iter()
            .any(|m| m.contains("--forward fixed.test:7001=127.0.0.1:0")
                && m.contains("no entry fixed.test:7001")),
        "{}",
        gw.log()
    );
    let refused = (0..500).find_map(|_| match gw.connect(fixed[0]) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
        _ => {
            std::thread::sleep(Duration::from_millis(10));
            None
        }
    });
    assert!(
        refused.is_some(),
        "the removed mapped entry's port still accepts"
    );

    let failures = gw
        .metric(
            "agent_sandbox_router_config_reloads_total",
            &[("result", "failure")],
        )
        .unwrap();
    assert!(failures >= 1.0, "failures counted: {failures}");
}

/// A change only a restart can make (here the connect timeout, from `--config`) fails the reload and
/// says so; the policy in the same change is not applied either. `--config` is watched like the
/// allowlist.
#[test]
fn restart_only_changes_fail_the_reload() {
    let Some(f) = Fixture::new("a.test\n") else {
        return;
    };
    let config = f.dir.0.join("router.toml");
    let toml = |secs: u32| {
        format!("connect_timeout_secs = {secs}\n[listen]\n[answers]\ndefault = \"127.0.0.2\"\n")
    };
    std::fs::write(&config, toml(5)).unwrap();
    let gw = f.start(&["--config", config.to_str().unwrap()]);
    assert_eq!(gw.query("a.test"), ANSWERED);
    // Both files change; the config watch and the allowlist watch may each reload. The configuration
    // changes first, so every reload from here on sees the restart-only change and fails.
    replace_file(&config, &toml(6));
    std::fs::write(&f.list, "a.test\nb.test\n").unwrap();
    let summary = gw.wait_reload_where(0, |v| v["fields"]["result"] == "failure");
    assert_eq!(summary["fields"]["entries_after"], 1, "{summary}");
    assert!(
        gw.events("reload error")
            .iter()
            .any(|e| e["fields"]["error"]
                .as_str()
                .is_some_and(|t| t.contains("timeouts or the connection cap changed")
                    && t.contains("restart"))),
        "{}",
        gw.log()
    );
    assert_eq!(gw.query("b.test"), NX, "nothing half-applied");
    // Back to the running timeout: the allowlist change applies.
    replace_file(&config, &toml(5));
    assert!(gw.wait_answered("b.test") < WATCH_BOUND);
}

/// A connection accepted before a reload is decided by the rules in force once its name is known: a
/// client that sends one byte, waits for the reload that removes a name, then sends the rest of a
/// request head or ClientHello for that name, is refused (reviewer N: both were judged by the rules
/// of the accept, and the removed name was dialled).
#[test]
fn a_connection_begun_before_a_reload_is_decided_after_it() {
    let Some(f) = Fixture::new("keep.test\nold.test\n") else {
        return;
    };
    let _old = f.hello("old.test", 2);
    let (reached, reached_rx) = std::sync::mpsc::channel();
    let _old_tls = Upstream::start(
        &f.lab,
        SocketAddr::from((f.lab.upstream_ips[2], 443)),
        move |mut s| {
            let mut byte = [0u8; 1];
            let _ = reached.send(std::io::Read::read(&mut s, &mut byte).unwrap_or(0));
        },
    );
    let gw = f.start(&[]);
    let hello = build::records(
        &build::client_hello(Some(&build::sni_extension(&[b"old.test"]))),
        16 * 1024,
    );
    let mut http = gw.connect(gw.http).unwrap();
    http.write_all(b"G").unwrap();
    let mut tls = gw.connect(gw.https).unwrap();
    tls.write_all(&hello[..1]).unwrap();
    // Both accepted: the deferred accept hands a connection over once a byte is in.
    let open = |l: &str| {
        gw.metric("agent_sandbox_router_connections_open", &[("listener", l)])
            .unwrap_or(0.0)
    };
    let deadline = std::time::Instant::now() + gateway::PATIENCE;
    while open("http") < 1.0 || open("https") < 1.0 {
        assert!(std::time::Instant::now() < deadline, "not accepted");
        std::thread::sleep(Duration::from_millis(20));
    }

    std::fs::write(&f.list, "keep.test\n").unwrap();
    gw.signal(libc::SIGHUP);
    assert_eq!(gw.wait_reload(1)["fields"]["result"], "success");

    http.write_all(b"ET / HTTP/1.1\r\nHost: old.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let reply = String::from_utf8_lossy(&gateway::read_to_close(&mut http)).into_owned();
    assert_eq!(status(&reply), "403", "{reply}");
    tls.write_all(&hello[1..]).unwrap();
    let answer = gateway::read_to_close(&mut tls);
    assert_eq!(answer.first(), Some(&0x15), "an alert: {answer:?}");
    assert!(
        reached_rx.try_recv().is_err(),
        "old.test's upstream was reached on 443"
    );
}
