//! Issue 13's fairness and bounds, through the real binary: the per-client connection cap (every
//! listener, DNS over TCP included), the idle timeout, DNS over TCP's idle close, the wildcard lookup
//! budget, the HelloRetryRequest check, and refusal coalescing.
//!
//! Clients are told apart by source address: loopback has all of 127/8, so two clients are two source
//! addresses (127.0.0.1 and 127.0.0.2) talking to a router on 127.0.0.1. Upstreams live in a network
//! namespace of the test's own, reached over a veth pair (see `proxy_support`); the router resolves
//! test names through a DNS server of the test's own on loopback, so nothing can leave the machine.

mod common;
mod proxy_support;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_router::proxy::tls::build;
use agent_sandbox_testkit::client::read_response;
use agent_sandbox_testkit::dns::TestDns;
use agent_sandbox_testkit::netns::Netns;
use agent_sandbox_testkit::upstream::{echo_upstream, http_upstream, tls_upstream};
use common::{tcp_query, temp_dir, udp_query, write_file, Router};
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

/// A second client on the same machine: another loopback source address.
const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The address of the router's `proto` listener (the harness reads the "listening on" lines as text;
/// in JSON logs they end in the JSON's closing quote and braces).
fn addr(router: &Router, proto: &str) -> SocketAddr {
    router
        .listening
        .iter()
        .find(|(_, p)| p.trim_end_matches(['"', '}', ')']) == proto)
        .unwrap_or_else(|| panic!("no {proto} listener in {:?}", router.listening))
        .0
}

/// A blocking TCP connection to `to` from source address `from`.
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::new(IpAddr::V4(from), 0).into())
        .unwrap();
    socket.connect(&to.into()).unwrap();
    let stream: std::net::TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// Reads until end of stream (or the read timeout); the bytes and how long it took.
fn read_all(stream: &mut std::net::TcpStream) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    (out, started.elapsed())
}

/// The router's JSON `refused` events so far.
fn refused_events(router: &Router) -> Vec<serde_json::Value> {
    router
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["fields"]["message"] == "refused")
        .collect()
}

/// A standalone router on loopback (DNS, HTTP, TLS on port 0), JSON logs, with `extra` flags.
fn start_router(allowlist: &str, resolver: Option<SocketAddr>, extra: &[&str]) -> Router {
    let dir = temp_dir("fairness");
    let list = write_file(&dir, "allowed-hosts", allowlist);
    let resolver = resolver.map(|r| r.to_string());
    let mut args = vec![
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "127.0.0.2",
        "--dns",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--https",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ];
    if let Some(r) = &resolver {
        args.extend(["--resolver", r.as_str()]);
    }
    args.extend_from_slice(extra);
    Router::start(&args, 4).holding(dir)
}

/// One client holding its cap of idle connections (on DNS over TCP: the cap is one per client across
/// listeners) has its next connection closed at once on every listener — a TLS
/// internal_error alert, an HTTP 503 naming the reason, DNS over TCP closed — while another client is
/// answered at once; every turn-away is logged.
#[test]
fn a_client_at_its_cap_is_turned_away_and_another_is_served() {
    let router = start_router(
        "allowed.test\n",
        Some("127.0.0.1:9".parse().unwrap()),
        &[
            "--max-connections-per-client",
            "3",
            "--peek-timeout",
            "30",
            "--threads",
            "2",
        ],
    );
    let (dns, http, https) = (
        addr(&router, "dns/tcp"),
        addr(&router, "http"),
        addr(&router, "https"),
    );
    let local = Ipv4Addr::LOCALHOST;
    let query = {
        let q = common::query_bytes("allowed.test.", RecordType::A, 7);
        let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        framed
    };
    // Three held connections, each known to be accepted and counted before the next step: a DNS-over-TCP
    // connection that got its answer and now sits idle inside the 30 s idle time. (Connections on
    // different listeners with two workers are accepted in no fixed order, so a probe could otherwise
    // take a slot before a held connection does.)
    let _held: Vec<_> = (0..3)
        .map(|_| {
            let mut c = connect_from(local, dns);
            c.write_all(&query).unwrap();
            let mut len = [0u8; 2];
            c.read_exact(&mut len).unwrap();
            let mut reply = vec![0; usize::from(u16::from_be_bytes(len))];
            c.read_exact(&mut reply).unwrap();
            assert_eq!(common::decode(&reply).code, ResponseCode::NoError);
            c
        })
        .collect();
    // HTTP: a 503 naming the flag, at once.
    let mut c = connect_from(local, http);
    c.write_all(b"GET / HTTP/1.1\r\nHost: refused.test\r\n\r\n")
        .unwrap();
    let (answer, took) = read_all(&mut c);
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.contains("--max-connections-per-client") && text.contains("holds 3"),
        "{text}"
    );
    assert!(took < Duration::from_secs(2), "503 took {took:?}");

    // TLS: a fatal internal_error alert, then the close. The client's first byte goes out at once, as
    // a real client's ClientHello does: the listener defers the accept until a first byte is in.
    let mut tls = connect_from(local, https);
    tls.write_all(&[0x16]).unwrap();
    let (alert, took) = read_all(&mut tls);
    assert_eq!(alert, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 80], "alert");
    assert!(took < Duration::from_secs(2), "alert took {took:?}");

    // DNS over TCP: closed at once, no answer.
    let mut d = connect_from(local, dns);
    let _ = d.write_all(&query);
    let (nothing, took) = read_all(&mut d);
    assert!(nothing.is_empty(), "{nothing:?}");
    assert!(took < Duration::from_secs(2), "close took {took:?}");

    // Another client is served promptly on every listener.
    let started = Instant::now();
    let mut other = connect_from(OTHER_CLIENT, http);
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: refused.test\r\n\r\n")
        .unwrap();
    let (answer, _) = read_all(&mut other);
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 403"),
        "{answer:?}"
    );
    let mut other_dns = connect_from(OTHER_CLIENT, dns);
    other_dns.write_all(&query).unwrap();
    let mut len = [0u8; 2];
    other_dns.read_exact(&mut len).unwrap();
    let mut reply = vec![0; usize::from(u16::from_be_bytes(len))];
    other_dns.read_exact(&mut reply).unwrap();
    assert_eq!(common::decode(&reply).code, ResponseCode::NoError);
    assert!(started.elapsed() < Duration::from_secs(2));

    let refusals = refused_events(&router);
    let cap: Vec<_> = refusals
        .iter()
        .filter(|e| {
            e["fields"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("--max-connections-per-client"))
        })
        .collect();
    assert!(
        cap.iter().any(|e| e["fields"]["kind"] == "tls")
            && cap.iter().any(|e| e["fields"]["kind"] == "http"),
        "{cap:?}"
    );
    assert!(cap.iter().all(|e| e["fields"]["client"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1")));
}

/// The start of a ClientHello announcing a body of nearly 64 KiB, sent in records of 10 bytes and
/// never finished: what the parsers' caps allow one connection to make the router hold (about 190 KiB
/// of buffers).
fn large_unfinished_hello() -> Vec<u8> {
    let body_len: u32 = 65_000;
    let mut handshake = vec![1];
    handshake.extend_from_slice(&body_len.to_be_bytes()[1..]);
    handshake.extend_from_slice(&[0x03, 0x03]);
    handshake.resize(64_000, 0x11);
    build::records(&handshake, 10)
}

/// A complete ClientHello for `name` of about 40 KiB (padding), in 16 KiB records.
fn large_hello(name: &str) -> Vec<u8> {
    build::hello_record(&[name.as_bytes()], 40_000)
}

/// The TLS alert or HTTP answer `bytes` get on a fresh connection to `to`.
fn answer(to: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut c = connect_from(Ipv4Addr::LOCALHOST, to);
    // The router may refuse before it has read everything: a failed write is part of the answer.
    let _ = c.write_all(bytes);
    read_all(&mut c).0
}

/// ClientHellos and request heads larger than usual draw on one memory budget for all connections
/// (8 MiB past the first 8 KiB of each): clients holding it with unfinished 64 KiB hellos get the
/// next large hello refused (internal_error) and the next large head refused (503), while ordinary
/// hellos and heads are still decided; once they go, large ones are decided again. Without the budget,
/// these 120 connections alone held about 22 MiB, and the per-client cap allows 1,024.
#[test]
fn large_hellos_and_heads_share_one_memory_budget() {
    let router = start_router(
        "allowed.test\n",
        Some("127.0.0.1:9".parse().unwrap()),
        &["--peek-timeout", "120", "--threads", "1"],
    );
    let (http, https) = (addr(&router, "http"), addr(&router, "https"));
    let unfinished = large_unfinished_hello();
    let holders: Vec<_> = (0..120)
        .map(|_| {
            let mut c = connect_from(Ipv4Addr::LOCALHOST, https);
            let _ = c.write_all(&unfinished);
            c
        })
        .collect();
    router.wait_for_log("a hello refused for the budget", |log| {
        log.contains("memory for large ClientHellos and request heads")
    });
    const INTERNAL_ERROR: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 80];
    const ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49];
    // The holders' bytes may still be on their way in: once they are read, a large hello finds the
    // budget spent.
    let deadline = Instant::now() + Duration::from_secs(20);
    while answer(https, &large_hello("other.test")) != INTERNAL_ERROR {
        assert!(Instant::now() < deadline, "a large hello was still decided");
    }
    // An ordinary hello is decided as ever.
    assert_eq!(
        answer(https, &build::hello_record(&[b"other.test"], 0)),
        ACCESS_DENIED
    );
    // The same for request heads: a 20 KiB head is refused with a 503 that says why, a small one is
    // decided.
    let big_head = format!(
        "GET / HTTP/1.1\r\nHost: other.test\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let text = String::from_utf8(answer(http, big_head.as_bytes())).unwrap();
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("memory for large ClientHellos"), "{text}");
    let text =
        String::from_utf8(answer(http, b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")).unwrap();
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    // The holders go: the budget is given back, and large hellos and heads are decided again.
    drop(holders);
    let deadline = Instant::now() + Duration::from_secs(20);
    while answer(https, &large_hello("other.test")) != ACCESS_DENIED {
        assert!(Instant::now() < deadline, "the budget was not given back");
    }
    let text = String::from_utf8(answer(http, big_head.as_bytes())).unwrap();
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    let spent: Vec<_> = refused_events(&router)
        .into_iter()
        .filter(|e| {
            e["fields"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("memory for large ClientHellos"))
        })
        .collect();
    assert!(
        spent.iter().any(|e| e["fields"]["kind"] == "tls")
            && spent.iter().any(|e| e["fields"]["kind"] == "http"),
        "{spent:?}"
    );
}

/// DNS over TCP: an idle connection is closed after the peek timeout even after answered queries.
#[test]
fn dns_over_tcp_idle_connections_are_closed() {
    let router = start_router(
        "allowed.test\n",
        Some("127.0.0.1:9".parse().unwrap()),
        &["--peek-timeout", "1"],
    );
    let dns = addr(&router, "dns/tcp");
    assert_eq!(
        tcp_query(dns, "allowed.test.", RecordType::A).code,
        ResponseCode::NoError
    );
    let mut c = connect_from(Ipv4Addr::LOCALHOST, dns);
    let q = common::query_bytes("allowed.test.", RecordType::A, 9);
    let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    c.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    c.read_exact(&mut len).unwrap();
    let mut reply = vec![0; usize::from(u16::from_be_bytes(len))];
    c.read_exact(&mut reply).unwrap();
    // Now idle: closed after about a second, not held.
    let (rest, took) = read_all(&mut c);
    assert!(rest.is_empty());
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// A relay with no byte either way for the idle timeout is closed; one kept busy is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_relays_are_closed() {
    require_netns!();
    let ns = Netns::create();
    let dns = TestDns::start(300).await;
    dns.set("echo.test", &[IpAddr::V4(ns.ns_ip)]);
    let _echo = echo_upstream(ns.bind(7000));
    let http_accepts = http_upstream(ns.bind(80));
    let resolver = dns.addr;
    let router = tokio::task::spawn_blocking(move || {
        let dir = temp_dir("idle");
        let list = write_file(&dir, "allowed-hosts", "echo.test:7000\n");
        Router::start(
            &[
                "--allowlist",
                list.to_str().unwrap(),
                "--answer",
                "127.0.0.2",
                "--dns",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
                "--https",
                "127.0.0.1:0",
                "--forward",
                "echo.test:7000=127.0.0.1:0",
                "--resolver",
                &resolver.to_string(),
                "--idle-timeout",
                "1",
                "--log-format",
                "json",
            ],
            5,
        )
        .holding(dir)
    })
    .await
    .unwrap();
    let forward = addr(&router, "forward echo.test:7000");

    // Raw relay: echo once, then quiet.
    let mut c = tokio::net::TcpStream::connect(forward).await.unwrap();
    c.write_all(b"ping\n").await.unwrap();
    let mut r = BufReader::new(c);
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    assert_eq!(line, "ping\n");
    let quiet = Instant::now();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut rest),
    )
    .await
    .expect("an idle relay must be closed")
    .unwrap();
    assert_eq!(n, 0);
    let took = quiet.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );

    // A busy relay outlives the timeout: a line every 300 ms for 2.5 s.
    let c = tokio::net::TcpStream::connect(forward).await.unwrap();
    let mut r = BufReader::new(c);
    for i in 0..8 {
        r.get_mut()
            .write_all(format!("{i}\n").as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        r.read_line(&mut line).await.unwrap();
        assert_eq!(line, format!("{i}\n"), "closed while busy");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // HTTP: a kept-alive connection waiting for its next request is closed too.
    dns.set("web.test", &[IpAddr::V4(ns.ns_ip)]);
    drop(router);
    let router = tokio::task::spawn_blocking(move || {
        let dir = temp_dir("idle-http");
        let list = write_file(&dir, "allowed-hosts", "web.test\n");
        Router::start(
            &[
                "--allowlist",
                list.to_str().unwrap(),
                "--answer",
                "127.0.0.2",
                "--dns",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
                "--https",
                "127.0.0.1:0",
                "--resolver",
                &resolver.to_string(),
                "--idle-timeout",
                "1",
            ],
            4,
        )
        .holding(dir)
    })
    .await
    .unwrap();
    let c = tokio::net::TcpStream::connect(addr(&router, "http"))
        .await
        .unwrap();
    let mut r = BufReader::new(c);
    r.get_mut()
        .write_all(b"GET /a HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut r).await.expect("a response");
    assert_eq!(status, 200);
    assert_eq!(http_accepts.get(), 1);
    let quiet = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut r, &mut rest),
    )
    .await
    .expect("an idle kept-alive connection must be closed")
    .unwrap();
    assert!(
        quiet.elapsed() < Duration::from_secs(4),
        "{:?}",
        quiet.elapsed()
    );
}

/// Distinct names under a wildcard entry that the resolver cache cannot answer spend the client's
/// budget; past it the connection is refused with a reason (a 503 naming it, and the log), a cached
/// name still connects, and another client has a budget of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wildcard_lookup_budget_bounds_distinct_names() {
    require_netns!();
    let ns = Netns::create();
    let dns = TestDns::start(300).await;
    for i in 0..6 {
        dns.set(&format!("n{i}.wild.test"), &[IpAddr::V4(ns.ns_ip)]);
    }
    dns.set("exact.test", &[IpAddr::V4(ns.ns_ip)]);
    let accepts = http_upstream(ns.bind(80));
    let resolver = dns.addr;
    let router = tokio::task::spawn_blocking(move || {
        start_router(
            ".wild.test\nexact.test\n",
            Some(resolver),
            &["--wildcard-lookups-per-minute", "3"],
        )
    })
    .await
    .unwrap();
    let http = addr(&router, "http");
    let get = |from: Ipv4Addr, host: String| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
        let c = socket.connect(http).await.unwrap();
        let mut r = BufReader::new(c);
        r.get_mut()
            .write_all(
                format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        read_response(&mut r).await.expect("a response")
    };
    let local = Ipv4Addr::LOCALHOST;
    for i in 0..3 {
        assert_eq!(get(local, format!("n{i}.wild.test")).await.0, 200, "n{i}");
    }
    let (status, body) = get(local, "n3.wild.test".into()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--wildcard-lookups-per-minute"), "{body}");
    assert_eq!(dns.count("n3.wild.test"), 0, "refused before any lookup");
    // A cached name and an exact entry cost nothing.
    assert_eq!(get(local, "n0.wild.test".into()).await.0, 200);
    assert_eq!(get(local, "exact.test".into()).await.0, 200);
    // Another client's budget is its own.
    assert_eq!(get(OTHER_CLIENT, "n4.wild.test".into()).await.0, 200);
    assert_eq!(accepts.get(), 6);
    let refusals = refused_events(&router);
    assert!(
        refusals
            .iter()
            .any(|e| e["fields"]["name"] == "n3.wild.test"
                && e["fields"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("wildcard"))),
        "{refusals:?}"
    );
}

/// A test PKI whose server offers only the key-exchange group secp256r1: a client that sends an X25519
/// key share first gets a HelloRetryRequest.
fn retrying_server(name: &str) -> (Arc<rustls::ServerConfig>, rustls::RootCertStore) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        leaf_key.serialize_der(),
    ));
    let mut only_p256 = rustls::crypto::ring::default_provider();
    only_p256.kx_groups = vec![rustls::crypto::ring::kx_group::SECP256R1];
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(only_p256))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    (Arc::new(server), roots)
}

/// A TLS 1.3 client offering X25519 first, then secp256r1.
fn x25519_first_client(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let mut p = rustls::crypto::ring::default_provider();
    p.kx_groups = vec![
        rustls::crypto::ring::kx_group::X25519,
        rustls::crypto::ring::kx_group::SECP256R1,
    ];
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(p))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// HelloRetryRequest: a well-behaved client's second hello passes and the session works; a second
/// hello naming another server is cut before it reaches the upstream, and the refusal is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_hello_must_name_the_same_server() {
    require_netns!();
    let ns = Netns::create();
    let dns = TestDns::start(300).await;
    dns.set("hrr.test", &[IpAddr::V4(ns.ns_ip)]);
    let (server, roots) = retrying_server("hrr.test");
    let accepts = tls_upstream(ns.bind(443), server);
    let resolver = dns.addr;
    let router =
        tokio::task::spawn_blocking(move || start_router("hrr.test\n", Some(resolver), &[]))
            .await
            .unwrap();
    let https = addr(&router, "https");
    let client = x25519_first_client(roots.clone());

    // Well-behaved: rustls handles the retry itself (its first connection with this configuration
    // sends an X25519 share, so the server retries, as the raw exchange below shows).
    let tcp = tokio::net::TcpStream::connect(https).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(&client))
        .connect("hrr.test".try_into().unwrap(), tcp)
        .await
        .expect("handshake through a HelloRetryRequest");
    let mut r = BufReader::new(tls);
    r.get_mut().write_all(b"hello\n").await.unwrap();
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    assert_eq!(line, "upstream hrr.test hello\n");

    // A second hello for another server: the first hello is a real one (so the upstream retries).
    let other = build::hello_record(&[b"other.test"], 0);
    let second = [&CCS[..], &other].concat();
    refused_after_retry(https, &roots, &[], &second).await;
    assert_eq!(accepts.get(), 2);
    wait_for_other_name_refusals(&router, 1).await;

    // The same, sent with the first hello in one write: held back until the upstream has answered,
    // then read as the second hello's start.
    refused_after_retry(https, &roots, &second, &[]).await;
    assert_eq!(accepts.get(), 3);
    wait_for_other_name_refusals(&router, 2).await;

    // The start of a second hello for another server sent with the first; after the retry, the rest
    // of it, which on its own looks like a hello for the allowed name (it is the data of the other
    // hello's last extension). Read from where the upstream reads it, it names other.test.
    let tail = build::hello_record(&[b"hrr.test"], 0);
    let mut exts = build::extension(43, &[2, 3, 4]);
    exts.extend_from_slice(&build::sni_extension(&[b"other.test"]));
    exts.extend_from_slice(&build::extension(0x0a0a, &tail));
    let real = build::records(&build::client_hello(Some(&exts)), 16 * 1024);
    let begun = [&CCS[..], &real[..real.len() - tail.len()]].concat();
    refused_after_retry(https, &roots, &begun, &tail).await;
    assert_eq!(accepts.get(), 4);
    wait_for_other_name_refusals(&router, 3).await;
}

/// The dummy ChangeCipherSpec record a TLS 1.3 client in middlebox compatibility mode sends.
const CCS: [u8; 6] = [20, 3, 3, 0, 1, 1];

/// Sends a real first ClientHello for hrr.test (an X25519 share, so the test's upstream asks for a
/// retry) followed by `with_first` in one write, reads the HelloRetryRequest the router passes back,
/// sends `after_retry`, and checks that the connection is then closed with no answer to a second hello.
async fn refused_after_retry(
    https: SocketAddr,
    roots: &rustls::RootCertStore,
    with_first: &[u8],
    after_retry: &[u8],
) {
    // A fresh client configuration: rustls remembers the group a server chose, and would send a
    // secp256r1 share straight away on a second connection.
    let fresh = x25519_first_client(roots.clone());
    let mut conn = rustls::ClientConnection::new(fresh, "hrr.test".try_into().unwrap()).unwrap();
    let mut first = Vec::new();
    conn.write_tls(&mut first).unwrap();
    first.extend_from_slice(with_first);
    let mut raw = tokio::net::TcpStream::connect(https).await.unwrap();
    raw.write_all(&first).await.unwrap();
    // The HelloRetryRequest comes back through the router: one whole handshake record.
    let mut header = [0u8; 5];
    tokio::io::AsyncReadExt::read_exact(&mut raw, &mut header)
        .await
        .unwrap();
    assert_eq!(header[0], 22, "a handshake record");
    let mut hrr = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
    tokio::io::AsyncReadExt::read_exact(&mut raw, &mut hrr)
        .await
        .unwrap();
    assert_eq!(hrr[0], 2, "a ServerHello");
    assert_eq!(
        &hrr[6..10],
        &[0xcf, 0x21, 0xad, 0x74],
        "the HelloRetryRequest random"
    );
    if !after_retry.is_empty() {
        raw.write_all(after_retry).await.unwrap();
    }
    let mut rest = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut raw, &mut rest),
    )
    .await
    .expect("the connection is closed")
    .ok();
    // Whatever else the upstream had sent after its retry request (a ChangeCipherSpec) may follow, but
    // no answer to the second hello.
    assert!(rest.len() <= 6, "{rest:?}");
}

/// Waits until `count` connections to hrr.test are logged as refused, and the reason, that a second
/// hello named another server (repeats of a refusal line are coalesced, connection lines are not).
async fn wait_for_other_name_refusals(router: &Router, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let events: Vec<serde_json::Value> = router
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let refused = events
            .iter()
            .filter(|e| {
                e["fields"]["message"] == "connection"
                    && e["fields"]["name"] == "hrr.test"
                    && e["fields"]["decision"] == "refused"
            })
            .count();
        let reason = events.iter().any(|e| {
            e["fields"]["message"] == "refused"
                && e["fields"]["kind"] == "tls"
                && e["fields"]["name"] == "hrr.test"
                && e["fields"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("names another server"))
        });
        if refused >= count && reason {
            assert_eq!(refused, count, "one refused connection each");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{refused} of {count} refused connections logged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Repeated refusals of one name by one client are one line at once, then one line with the count of
/// the repeats when the window closes: the counts add up exactly.
#[test]
fn repeated_refusals_are_coalesced_with_exact_counts() {
    // One worker: each worker coalesces on its own.
    let router = start_router(
        "allowed.test\n",
        Some("127.0.0.1:9".parse().unwrap()),
        &["--threads", "1"],
    );
    let dns = addr(&router, "dns/udp");
    for _ in 0..10 {
        assert_eq!(
            udp_query(dns, "flood.test.", RecordType::A).code,
            ResponseCode::NXDomain
        );
    }
    let of_flood = |router: &Router| -> Vec<serde_json::Value> {
        refused_events(router)
            .into_iter()
            .filter(|e| e["fields"]["name"] == "flood.test")
            .collect()
    };
    // The first is written at once (with a count of 1), though it reaches the test's log reader a
    // little later: under load, after the window may have closed too.
    router.wait_for_log("the first refusal", |_| !of_flood(&router).is_empty());
    let first = of_flood(&router);
    assert_eq!(first[0]["fields"]["count"], 1, "{first:?}");
    // The repeats come in one line once the window has closed.
    router.wait_for_log("the summary of the repeats", |_| {
        of_flood(&router).len() >= 2
    });
    let lines = of_flood(&router);
    let total: u64 = lines
        .iter()
        .map(|e| e["fields"]["count"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(total, 10);
}
