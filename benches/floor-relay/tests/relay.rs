//! The floor relay over real loopback sockets: bytes both ways, half-close, many connections at once,
//! and an upstream that refuses.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use agent_sandbox_floor_relay::{Pair, Relay, StopHandle};

/// An upstream that reads each connection to its end, then answers with the byte count and the last
/// byte it saw, and closes.
fn counting_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            thread::spawn(move || {
                let mut all = Vec::new();
                if s.read_to_end(&mut all).is_ok() {
                    let last = all.last().copied().unwrap_or(0);
                    let _ = write!(s, "{} {}", all.len(), last);
                }
            });
        }
    });
    addr
}

fn start(upstream: SocketAddr) -> (SocketAddr, StopHandle, thread::JoinHandle<()>) {
    let relay = Relay::bind(&[Pair {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstream,
    }])
    .unwrap();
    let addr = relay.local_addrs().unwrap()[0];
    let stop = relay.stop_handle();
    let t = thread::spawn(move || relay.serve(Default::default()).unwrap());
    (addr, stop, t)
}

fn exchange(relay: SocketAddr, len: usize) -> String {
    let mut c = TcpStream::connect(relay).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    c.write_all(&data).unwrap();
    // Half-close: the upstream answers only after our end of stream has been passed on.
    c.shutdown(Shutdown::Write).unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn relays_both_ways_with_the_half_close_passed_on() {
    let (relay, stop, t) = start(counting_upstream());
    assert_eq!(exchange(relay, 0), "0 0");
    assert_eq!(exchange(relay, 10), "10 9");
    // Larger than every buffer on the way, so reads, writes and readiness edges all wrap around.
    let big = 8 * 1024 * 1024 + 7;
    assert_eq!(exchange(relay, big), format!("{big} {}", (big - 1) % 251));
    stop.stop().unwrap();
    t.join().unwrap();
}

#[test]
fn many_connections_at_once() {
    let (relay, stop, t) = start(counting_upstream());
    let clients: Vec<_> = (0..64)
        .map(|i| thread::spawn(move || (i, exchange(relay, 1000 + i * 997))))
        .collect();
    for c in clients {
        let (i, answer) = c.join().unwrap();
        let len = 1000 + i * 997;
        assert_eq!(answer, format!("{len} {}", (len - 1) % 251));
    }
    stop.stop().unwrap();
    t.join().unwrap();
}

#[test]
fn a_refused_upstream_closes_the_client() {
    // A port with nothing listening: bind one, note it, close it.
    let gone = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (relay, stop, t) = start(gone);
    let mut c = TcpStream::connect(relay).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 16];
    // End of stream or a reset, never a hang.
    match c.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    stop.stop().unwrap();
    t.join().unwrap();
}
