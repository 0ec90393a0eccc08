//! A name that resolves to a next hop of the router's routes (the gateway it sends through: on a
//! session's egress network, the host; in a pod, the node) is never dialled, while a neighbour on the
//! same network that is no next hop is. The real router binary runs in the test's own namespace R, which
//! has no default route; the "gateway" is an upstream address of the test's namespace U, made the next
//! hop of one route of R's that nothing uses.

mod lab;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};

use lab::{Dns, DnsBehaviour, Lab, RouterProc, Upstream};

/// Answers every connection with one small HTTP response.
fn ok_handler(mut s: TcpStream) {
    let mut buf = [0u8; 1024];
    let _ = s.read(&mut buf);
    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
}

/// One request for `host` through the router's HTTP listener; the whole response.
fn get(lab: &Lab, router: &RouterProc, host: &str) -> String {
    let mut s = lab.connect(router.http);
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_name_resolving_to_a_next_hop_is_not_dialled() {
    if !lab::require_netns() {
        return;
    }
    let lab = Lab::new(2);
    let (hop, peer) = (lab.upstream_ips[0], lab.upstream_ips[1]);
    lab::run(
        "ip",
        &[
            "-n",
            &lab.r.name,
            "route",
            "add",
            "198.20.0.0/24",
            "via",
            &hop.to_string(),
        ],
    );
    let dns = Dns::start(&lab);
    dns.set("hop.test", DnsBehaviour::A(hop));
    dns.set("peer.test", DnsBehaviour::A(peer));
    let at_hop = Upstream::start(&lab, SocketAddr::from((hop, 80)), ok_handler);
    let at_peer = Upstream::start(&lab, SocketAddr::from((peer, 80)), ok_handler);
    let toml = format!(
        "hosts = [\"hop.test\", \"peer.test\"]\nresolvers = [\"{}\"]\nconnect_timeout_secs = 2\n",
        dns.addr
    );
    let router = RouterProc::start(&lab, &toml);

    let refused = get(&lab, &router, "hop.test");
    assert!(
        refused.starts_with("HTTP/1.1 403") && refused.contains("forbidden address"),
        "{refused}"
    );
    let reached = get(&lab, &router, "peer.test");
    assert!(reached.starts_with("HTTP/1.1 200"), "{reached}");
    assert_eq!(
        at_hop.accepted.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the next hop was dialled"
    );
    assert_eq!(
        at_peer.accepted.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let log = router.log();
    assert!(log.contains("a gateway its routes go through"), "{log}");
}
