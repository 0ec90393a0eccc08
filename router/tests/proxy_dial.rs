//! Resolving and dialling upstreams: forbidden addresses (rebinding) are never dialled, an unreachable
//! or unresolvable upstream fails fast, answers are cached for their TTL only, and the next address is
//! tried when one refuses.
//!
//! Upstream test hosts live in a network namespace reached over a veth pair, with a test DNS server on
//! loopback (`agent-sandbox-testkit`); each test states its set-up as a [`Scenario`]. Needs root.

mod proxy_support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use agent_sandbox_router::proxy::tls::build;
use agent_sandbox_testkit::client::{
    raw_exchange, read_response, ALERT_ACCESS_DENIED, ALERT_INTERNAL_ERROR,
};
use agent_sandbox_testkit::netns::Netns;
use agent_sandbox_testkit::upstream::echo_upstream;
use proxy_support::{connection_event, refusal, Scenario};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_to_forbidden_addresses_is_not_dialled() {
    require_netns!();
    let w = Scenario::new("rebind")
        .host("lo")
        .host("mapped")
        .host("own")
        .host("mixed")
        .echo_upstream(443)
        .start()
        .await;
    let to_loopback = w.name("lo");
    let to_mapped = w.name("mapped");
    let to_own = w.name("own");
    let mixed = w.name("mixed");
    w.dns.set(&to_loopback, &["127.0.0.1".parse().unwrap()]);
    w.dns
        .set(&to_mapped, &["::ffff:127.0.0.1".parse().unwrap()]);
    w.dns.set(&to_own, &[IpAddr::V4(w.ns.host_ip)]);
    w.dns.set(
        &mixed,
        &[IpAddr::V4(w.ns.ns_ip), "169.254.169.254".parse().unwrap()],
    );
    // Listeners where a dial would land: on the router's own veth address, and in the namespace
    // (the scenario's echo upstream).
    let own_listener = tokio::net::TcpListener::bind((w.ns.host_ip, 443))
        .await
        .unwrap();
    let own_accepts = echo_upstream(own_listener);
    let cases = [
        (&to_loopback, "resolves to a forbidden address 127.0.0.1"),
        (
            &to_mapped,
            "resolves to a forbidden address ::ffff:127.0.0.1",
        ),
        (&to_own, "resolves to a forbidden address"),
        (&mixed, "resolves to a forbidden address 169.254.169.254"),
    ];
    for (name, reason) in cases {
        let (_, answer) =
            raw_exchange(w.router.https, &build::hello_record(&[name.as_bytes()], 0)).await;
        assert_eq!(answer, ALERT_ACCESS_DENIED, "{name}");
        let got = refusal(name).await;
        assert!(got.starts_with(reason), "{name}: {got}");
        // Same over HTTP: a 403 that says why.
        let mut s = TcpStream::connect(w.router.http).await.unwrap();
        s.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (status, body) = read_response(&mut BufReader::new(s)).await.unwrap();
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("forbidden address"), "{body}");
    }
    assert_eq!(own_accepts.get(), 0);
    assert_eq!(w.echo().get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_closes_promptly() {
    require_netns!();
    let w = Scenario::new("down")
        .host("down")
        .unresolvable_host("nx")
        .start()
        .await;
    let name = w.name("down");
    let nx = w.name("nx");
    // Nothing listens in the namespace: connection refused at once.
    let start = Instant::now();
    let (_, answer) =
        raw_exchange(w.router.https, &build::hello_record(&[name.as_bytes()], 0)).await;
    assert_eq!(answer, ALERT_INTERNAL_ERROR);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let mut s = TcpStream::connect(w.router.http).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, body) = read_response(&mut BufReader::new(s)).await.unwrap();
    assert_eq!(status, 502, "{body}");
    // A name that does not resolve.
    let (_, answer) = raw_exchange(w.router.https, &build::hello_record(&[nx.as_bytes()], 0)).await;
    assert_eq!(answer, ALERT_INTERNAL_ERROR);
    // The router carries on.
    let (_, answer) = raw_exchange(w.router.https, b"junk").await;
    assert_eq!(answer, ALERT_ACCESS_DENIED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_is_cached_for_the_record_ttl_only() {
    require_netns!();
    let w = Scenario::new("ttl")
        .forward("db", 5432)
        .echo_upstream(5432)
        .dns_ttl(1)
        .start()
        .await;
    let db = w.name("db");
    let round_trip = || async {
        let mut s = TcpStream::connect(w.router.forward(&db, 5432))
            .await
            .unwrap();
        s.write_all(b"t").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
    };
    let a_queries = || w.dns.count_type(&db, hickory_proto::rr::RecordType::A);
    round_trip().await;
    round_trip().await;
    assert_eq!(a_queries(), 1, "within the TTL the answer is reused");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    round_trip().await;
    assert_eq!(a_queries(), 2, "after the TTL the name is resolved again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_address_is_tried_when_one_refuses() {
    require_netns!();
    let w = Scenario::new("next")
        .forward("db", 5432)
        .echo_upstream(5432)
        .start()
        .await;
    let down = Netns::create();
    let db = w.name("db");
    // The first address refuses (nothing listens there), the second serves.
    w.dns
        .set(&db, &[IpAddr::V4(down.ns_ip), IpAddr::V4(w.ns.ns_ip)]);
    let mut s = TcpStream::connect(w.router.forward(&db, 5432))
        .await
        .unwrap();
    let local = s.local_addr().unwrap();
    s.write_all(b"n").await.unwrap();
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    drop(s);
    assert_eq!(w.echo().get(), 1);
    let e = connection_event(w.mark, local).await;
    assert_eq!(e["upstream"], format!("{}:5432", w.ns.ns_ip));
}

/// The DNS answer address is one of the router's own even when no interface has it (NAT, a Service
/// address): a name resolving to it is never dialled, at start and after the 1 s re-read of the
/// router's own addresses (reviewer R).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_the_answer_address_is_not_dialled() {
    require_netns!();
    let w = Scenario::new("answer")
        .host("loop")
        .echo_upstream(443)
        .world()
        .await;
    let name = w.name("loop");
    let toml = format!(
        "hosts = [{name:?}]\nresolvers = [\"{}\"]\npeek_timeout_secs = 2\nconnect_timeout_secs = 2\n\
         [listen]\nhttps = \"127.0.0.1:0\"\n[answers]\ndefault = \"{}\"\n",
        w.dns.addr, w.ns.ns_ip
    );
    let proxy = proxy_support::proxy_from_toml(&toml);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let https = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(std::sync::Arc::clone(&proxy).serve_https(listener, stop.clone()));
    for wait in [Duration::ZERO, Duration::from_millis(1500)] {
        tokio::time::sleep(wait).await;
        let mark = proxy_support::log_mark();
        let (local, answer) = tokio::time::timeout(
            Duration::from_secs(5),
            raw_exchange(https, &build::hello_record(&[name.as_bytes()], 0)),
        )
        .await
        .expect("refused at once, not relayed");
        assert_eq!(answer, ALERT_ACCESS_DENIED, "after {wait:?}");
        let (_, reason) = proxy_support::refusal_from(mark, local).await;
        assert!(reason.contains("router's own addresses"), "{reason}");
    }
    assert_eq!(w.echo().get(), 0);
    stop.cancel();
    let _ = task.await;
}
