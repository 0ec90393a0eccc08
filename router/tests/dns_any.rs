//! DNS over UDP on the unspecified address (`--dns 0.0.0.0:53`, the default, and `[::]:53`), in a
//! network namespace of the test's own: a reply leaves from the address the query was sent to. Without
//! that the kernel picks the source by the route back, and on a host with several addresses a client
//! that asked any but the primary one gets its answer from another address, which resolvers discard
//! (reviewer M: `dig -b 127.0.0.1 @10.77.0.2` timed out). Loopback shows it: every 127.0.0.0/8 address
//! is local, and the route back to 127.0.0.1 has 127.0.0.1 as its source.

mod gateway;
mod lab;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use gateway::{Gateway, TempDir};
use lab::{Dns, Lab};

/// Asks `server` (on `asked`) for `name` from 127.0.0.1; the address the reply came from.
fn reply_source(gw: &Gateway, asked: &str, name: &str) -> SocketAddr {
    let port = gw.dns.port();
    let asked: SocketAddr = format!("{asked}:{port}").parse().unwrap();
    let name = name.to_owned();
    gw.in_r(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_broadcast(true).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // A query for NAME, type A, with the header's id 0x4242.
        let mut q = vec![0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(u8::try_from(label.len()).unwrap());
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let mut buf = [0u8; 512];
        for _ in 0..3 {
            sock.send_to(&q, asked).unwrap();
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                assert!(n >= 12 && buf[..2] == [0x42, 0x42], "{:?}", &buf[..n]);
                return from;
            }
        }
        panic!("no reply to a query sent to {asked}");
    })
}

#[test]
fn replies_leave_from_the_address_asked() {
    if !lab::require_netns() {
        return;
    }
    let lab = Lab::new(1);
    let dns = Dns::start(&lab);
    let dir = TempDir::new("dns-any");
    let list = dir.0.join("allowed-hosts");
    std::fs::write(&list, "a.test\n").unwrap();
    for bind in ["0.0.0.0:0", "[::]:0"] {
        let gw = Gateway::start(&lab, &dns, &list, &["--dns", bind]);
        assert!(gw.dns.ip().is_unspecified(), "{bind}: {}", gw.dns);
        for asked in ["127.0.0.1", "127.0.0.5", "127.3.2.1"] {
            for name in ["a.test", "other.test"] {
                let from = reply_source(&gw, asked, name);
                assert_eq!(
                    from,
                    format!("{asked}:{}", gw.dns.port()).parse().unwrap(),
                    "{bind}: a query for {name} sent to {asked}"
                );
            }
        }
        // A broadcast query is answered from a unicast address of the interface (reviewer P: on a
        // dual-stack socket the reply was sent from the broadcast address, which the kernel refuses,
        // and a warning was logged for each).
        let from = reply_source(&gw, "127.255.255.255", "a.test");
        assert_eq!(from.ip().to_string(), "127.0.0.1", "{bind}: {from}");
        assert!(
            !gw.log().contains("cannot send DNS reply"),
            "{bind}: {}",
            gw.log()
        );
    }
}
