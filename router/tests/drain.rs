//! Graceful drain (`--drain-seconds`) of the real gateway binary, in a network namespace of the test's
//! own: after SIGTERM `/readyz` says 503 at once, the listeners refuse new connections, a relay in
//! flight keeps flowing, and the process exits 0 when it ends or at the deadline; a second SIGTERM exits
//! at once; `--drain-seconds 0` keeps the exit within a second.

mod gateway;
mod lab;

use std::io::{ErrorKind, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use gateway::{Gateway, SlowBody, TempDir};
use lab::{Dns, DnsBehaviour, Lab, Upstream};

/// The drain time the tests run with.
const DRAIN: Duration = Duration::from_secs(3);

/// A router with a relay to a [`SlowBody`] upstream held open (first half read). Fields drop in order:
/// the client and the router go before the upstream, the namespaces and the files.
struct Fixture {
    relay: TcpStream,
    gw: Gateway,
    slow: SlowBody,
    _upstream: Upstream,
    _dir: TempDir,
    _dns: Dns,
    _lab: Lab,
}

fn fixture(drain_seconds: &str) -> Option<Fixture> {
    if !lab::require_netns() {
        return None;
    }
    let lab = Lab::new(1);
    let dns = Dns::start(&lab);
    let dir = TempDir::new("drain");
    let list = dir.0.join("allowed-hosts");
    std::fs::write(&list, "slow.test\n").unwrap();
    dns.set("slow.test", DnsBehaviour::A(lab.upstream_ips[0]));
    let slow = SlowBody::new();
    let upstream = Upstream::start(
        &lab,
        SocketAddr::from((lab.upstream_ips[0], 80)),
        slow.handler(),
    );
    let gw = Gateway::start(&lab, &dns, &list, &["--drain-seconds", drain_seconds]);
    let mut relay = gw.connect(gw.http).unwrap();
    relay
        .write_all(b"GET / HTTP/1.1\r\nHost: slow.test\r\n\r\n")
        .unwrap();
    gateway::read_first_half(&mut relay);
    Some(Fixture {
        relay,
        gw,
        slow,
        _upstream: upstream,
        _dir: dir,
        _dns: dns,
        _lab: lab,
    })
}

/// Polls until `/readyz` answers 503; how long that took.
fn wait_not_ready(gw: &Gateway) -> Duration {
    let started = Instant::now();
    loop {
        let (status, body) = gw.admin("GET", "/readyz");
        if status == 503 {
            assert_eq!(body.trim_end(), "draining");
            return started.elapsed();
        }
        assert_eq!(status, 200);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "/readyz still 200 a second after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls until a new connection to `addr` is refused.
fn wait_refused(gw: &Gateway, addr: SocketAddr, what: &str) {
    let started = Instant::now();
    loop {
        match gw.connect(addr) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return,
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the {what} listener still accepts a second into the drain"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn drain_lets_the_relay_finish_then_exits_0() {
    let Some(mut f) = fixture(&DRAIN.as_secs().to_string()) else {
        return;
    };
    let (http, https) = (f.gw.http, f.gw.https);
    let term = Instant::now();
    f.gw.signal(libc::SIGTERM);
    println!("/readyz 503 after {:?}", wait_not_ready(&f.gw));
    wait_refused(&f.gw, http, "HTTP");
    wait_refused(&f.gw, https, "TLS");
    assert_eq!(f.gw.admin("GET", "/livez").0, 200, "alive while draining");
    assert_eq!(
        f.gw.query("slow.test"),
        (hickory_proto::op::ResponseCode::NoError, 1),
        "DNS answers through a drain"
    );
    assert!(f.gw.wait_exit(Duration::ZERO).is_none());
    f.slow.release();
    gateway::read_second_half(&mut f.relay);
    // The client closes its end, as a client does once its response is complete: until then the
    // router holds the connection open and the drain waits for it.
    f.relay.shutdown(std::net::Shutdown::Both).unwrap();
    let status =
        f.gw.wait_exit(DRAIN)
            .expect("the router exits once the relay has ended");
    let took = term.elapsed();
    println!("exited {took:?} after SIGTERM, the relay having ended");
    assert!(status.success(), "{status}");
    assert!(took < DRAIN, "exit waited for the deadline ({took:?})");
    assert_eq!(f.gw.events("drained: no connection left").len(), 1);
}

#[test]
fn drain_ends_at_the_deadline() {
    let Some(mut f) = fixture(&DRAIN.as_secs().to_string()) else {
        return;
    };
    let term = Instant::now();
    f.gw.signal(libc::SIGTERM);
    wait_not_ready(&f.gw);
    let status =
        f.gw.wait_exit(DRAIN + Duration::from_secs(2))
            .expect("the router exits at the drain deadline");
    let took = term.elapsed();
    println!("exited {took:?} after SIGTERM with the relay still open");
    assert!(status.success(), "{status}");
    assert!(took >= DRAIN, "exited before the deadline ({took:?})");
    assert_eq!(f.gw.events("drain time is up").len(), 1, "{}", f.gw.log());
    // The relay was cut: the second half never comes.
    assert!(gateway::read_to_close(&mut f.relay).is_empty());
}

#[test]
fn a_second_sigterm_exits_at_once() {
    let Some(mut f) = fixture(&DRAIN.as_secs().to_string()) else {
        return;
    };
    f.gw.signal(libc::SIGTERM);
    wait_not_ready(&f.gw);
    let second = Instant::now();
    f.gw.signal(libc::SIGTERM);
    let status =
        f.gw.wait_exit(Duration::from_secs(1))
            .expect("a second SIGTERM exits within a second");
    println!("exited {:?} after the second SIGTERM", second.elapsed());
    assert!(status.success(), "{status}");
}

#[test]
fn drain_seconds_0_exits_at_once() {
    let Some(mut f) = fixture("0") else { return };
    let term = Instant::now();
    f.gw.signal(libc::SIGTERM);
    let status =
        f.gw.wait_exit(Duration::from_secs(1))
            .expect("SIGTERM with no drain exits within a second");
    println!(
        "exited {:?} after SIGTERM with a relay open",
        term.elapsed()
    );
    assert!(status.success(), "{status}");
}
