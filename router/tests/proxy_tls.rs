//! The TLS listener end to end: the name a client sends in its ClientHello decides, however the hello
//! is cut; refusals get the right alert and never reach the upstream or even the resolver.
//!
//! Upstream test hosts live in a network namespace reached over a veth pair, with a test DNS server on
//! loopback (`agent-sandbox-testkit`); each test states its set-up as a [`Scenario`]. Needs root.

mod proxy_support;

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_router::proxy::tls::build;
use agent_sandbox_testkit::client::{
    ping, raw_exchange, tls_connect, ALERT_ACCESS_DENIED, ALERT_UNRECOGNIZED_NAME,
};
use proxy_support::{connection_event, refusal, refusal_from, Scenario};

/// Drives a rustls client by hand so the ClientHello can be re-cut: `cut` turns the hello's bytes into
/// the writes to make (with `pause` between them); the rest of the handshake runs normally.
fn manual_tls(
    router: SocketAddr,
    config: rustls::ClientConfig,
    name: &str,
    cut: impl Fn(Vec<u8>) -> Vec<Vec<u8>>,
    pause: Duration,
) -> std::io::Result<String> {
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server_name)
        .map_err(std::io::Error::other)?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello)?;
    let mut sock = std::net::TcpStream::connect(router)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    for piece in cut(hello) {
        sock.write_all(&piece)?;
        std::thread::sleep(pause);
    }
    let mut stream = rustls::Stream::new(&mut conn, &mut sock);
    stream.write_all(b"split\n")?;
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while stream.read(&mut byte)? == 1 && byte[0] != b'\n' {
        out.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Re-frames a single-record hello into records of at most `size` payload bytes.
fn refragment(hello: Vec<u8>, size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = &hello[..];
    while !rest.is_empty() {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        out.extend_from_slice(&build::records(&rest[5..5 + len], size));
        rest = &rest[5 + len..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_allowed_end_to_end_and_logged() {
    require_netns!();
    let w = Scenario::new("tlsok")
        .host("api")
        .tls_upstream()
        .start()
        .await;
    let name = w.name("api");
    let (local, mut tls) = tls_connect(w.router.https, w.pki.client_config(), &name)
        .await
        .unwrap();
    assert_eq!(
        ping(&mut tls, "hello").await,
        format!("upstream {name} hello")
    );
    // Upper case and a trailing dot are the same name.
    let upper = format!("{}.", name.to_ascii_uppercase());
    let (_, mut tls2) = tls_connect(w.router.https, w.pki.client_config(), &upper)
        .await
        .unwrap();
    assert!(ping(&mut tls2, "again").await.ends_with(" again"));
    assert_eq!(w.tls().get(), 2);
    // The TTL-honouring cache: two connections, one A lookup (the AAAA NODATA carries no SOA here,
    // so it is not cached).
    assert_eq!(
        w.dns.count_type(&name, hickory_proto::rr::RecordType::A),
        1,
        "{:?}",
        w.dns.queries.lock().unwrap()
    );
    drop(tls);
    let event = connection_event(w.mark, local).await;
    assert_eq!(event["decision"], "allowed");
    assert_eq!(event["listener"], "tls");
    assert_eq!(event["name"], name.as_str());
    assert_eq!(event["upstream"], format!("{}:443", w.ns.ns_ip));
    assert!(event["bytes_up"].as_u64().unwrap() > 100);
    assert!(event["bytes_down"].as_u64().unwrap() > 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_wildcard() {
    require_netns!();
    let w = Scenario::new("wild")
        .subdomains()
        .resolves("a.b")
        .resolves("")
        .cert(&["*.b", ""])
        .tls_upstream()
        .start()
        .await;
    let deep = w.name("a.b");
    let apex = w.name("");
    let look_alike = format!("bad{}", w.domain);
    w.point(&look_alike);
    for n in [&deep, &apex] {
        let (_, mut tls) = tls_connect(w.router.https, w.pki.client_config(), n)
            .await
            .unwrap();
        assert_eq!(ping(&mut tls, "x").await, format!("upstream {n} x"));
    }
    assert!(
        tls_connect(w.router.https, w.pki.client_config(), &look_alike)
            .await
            .is_err()
    );
    assert_eq!(refusal(&look_alike).await, "not on the allowlist");
    assert_eq!(w.tls().get(), 2);
    assert_eq!(w.dns.count(&look_alike), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_hello_split_every_way() {
    require_netns!();
    let w = Scenario::new("split")
        .host("s")
        .tls_upstream()
        .start()
        .await;
    let name = w.name("s");
    let want = format!("upstream {name} split");
    type Cut = Box<dyn Fn(Vec<u8>) -> Vec<Vec<u8>> + Send>;
    let cases: Vec<(&str, Cut, Duration)> = vec![
        (
            "three writes",
            Box::new(|h: Vec<u8>| {
                let (a, b) = h.split_at(3);
                let (b, c) = b.split_at(b.len() / 2);
                vec![a.to_vec(), b.to_vec(), c.to_vec()]
            }),
            Duration::from_millis(30),
        ),
        (
            "one byte at a time",
            Box::new(|h: Vec<u8>| h.into_iter().map(|b| vec![b]).collect()),
            Duration::from_micros(200),
        ),
        (
            "37-byte records",
            Box::new(|h: Vec<u8>| vec![refragment(h, 37)]),
            Duration::ZERO,
        ),
        (
            "1-byte records, byte-sized writes of 3",
            Box::new(|h: Vec<u8>| refragment(h, 1).chunks(3).map(<[u8]>::to_vec).collect()),
            Duration::ZERO,
        ),
        (
            // What the client sends after its hello in the same write (a middlebox-compatibility
            // ChangeCipherSpec here) waits for the upstream's answer, then follows the hello.
            "the hello and a ChangeCipherSpec in one write",
            Box::new(|h: Vec<u8>| vec![[&h[..], &[20, 3, 3, 0, 1, 1]].concat()]),
            Duration::ZERO,
        ),
    ];
    for (what, cut, pause) in cases {
        let config = w.pki.client_config();
        let n = name.clone();
        let addr = w.router.https;
        let got = tokio::task::spawn_blocking(move || manual_tls(addr, config, &n, cut, pause))
            .await
            .unwrap();
        assert_eq!(
            got.as_deref().map_err(|e| e.to_string()),
            Ok(want.as_str()),
            "{what}"
        );
    }
    assert_eq!(w.tls().get(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_twenty_kilobyte_hello() {
    require_netns!();
    let w = Scenario::new("big")
        .host("big")
        .tls_upstream()
        .start()
        .await;
    let name = w.name("big");
    let mut config = w.pki.client_config();
    // 80 ALPN ids of 250 bytes: a ~20 KB hello, more than one TLS record.
    config.alpn_protocols = (0..80u8).map(|i| vec![b'a' + i % 26; 250]).collect();
    let (_, mut tls) = tls_connect(w.router.https, config, &name).await.unwrap();
    assert_eq!(ping(&mut tls, "big").await, format!("upstream {name} big"));
    assert_eq!(w.tls().get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refusals_never_reach_the_upstream() {
    require_netns!();
    let w = Scenario::new("tlsno")
        .host("ok")
        .resolves("evil")
        .tls_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let evil = w.name("evil");

    // A real client asking for a name that is not listed gets access_denied.
    let err = tls_connect(w.router.https, w.pki.client_config(), &evil)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.to_lowercase().contains("accessdenied") || err.contains("AccessDenied"),
        "{err}"
    );
    assert_eq!(refusal(&evil).await, "not on the allowlist");

    // A real client sending no SNI (rustls sends none when told not to).
    let mut no_sni = w.pki.client_config();
    no_sni.enable_sni = false;
    assert!(tls_connect(w.router.https, no_sni, &ok).await.is_err());

    let ip_literal = w.ns.ns_ip.to_string();
    let nul = format!("ok\0.{}", w.domain);
    let long = "a".repeat(300);
    let cases: Vec<(&str, Vec<u8>, [u8; 7], String)> = vec![
        (
            "no sni",
            build::hello_record(&[], 0),
            ALERT_UNRECOGNIZED_NAME,
            "no SNI".into(),
        ),
        (
            "empty sni",
            build::hello_record(&[b""], 0),
            ALERT_UNRECOGNIZED_NAME,
            "empty SNI".into(),
        ),
        (
            "two host names",
            build::hello_record(&[ok.as_bytes(), evil.as_bytes()], 0),
            ALERT_UNRECOGNIZED_NAME,
            "several host_name entries".into(),
        ),
        (
            "ip literal",
            build::hello_record(&[ip_literal.as_bytes()], 0),
            ALERT_UNRECOGNIZED_NAME,
            "IP literal".into(),
        ),
        (
            "nul",
            build::hello_record(&[nul.as_bytes()], 0),
            ALERT_UNRECOGNIZED_NAME,
            "invalid name".into(),
        ),
        (
            "star",
            build::hello_record(&[b"*.test"], 0),
            ALERT_UNRECOGNIZED_NAME,
            "invalid name".into(),
        ),
        (
            "percent",
            build::hello_record(&[b"ok%2etest"], 0),
            ALERT_UNRECOGNIZED_NAME,
            "invalid name".into(),
        ),
        (
            "slash",
            build::hello_record(&[b"ok.test/x"], 0),
            ALERT_UNRECOGNIZED_NAME,
            "invalid name".into(),
        ),
        (
            "at",
            build::hello_record(&[b"u@ok.test"], 0),
            ALERT_UNRECOGNIZED_NAME,
            "invalid name".into(),
        ),
        (
            "long",
            build::hello_record(&[long.as_bytes()], 0),
            ALERT_UNRECOGNIZED_NAME,
            "invalid name".into(),
        ),
        (
            "not listed",
            build::hello_record(&[evil.as_bytes()], 0),
            ALERT_ACCESS_DENIED,
            "not on the allowlist".into(),
        ),
        (
            "plain http",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\n\r\n").into_bytes(),
            ALERT_ACCESS_DENIED,
            "not a TLS handshake".into(),
        ),
        (
            "sslv2",
            vec![0x80, 0x2e, 0x01, 0x03, 0x01, 0, 0],
            ALERT_ACCESS_DENIED,
            "not a TLS handshake".into(),
        ),
    ];
    for (what, bytes, alert, reason) in cases {
        let (local, answer) = raw_exchange(w.router.https, &bytes).await;
        assert_eq!(answer, alert, "{what}");
        let (_, got) = refusal_from(w.mark, local).await;
        assert!(
            got.starts_with(&reason),
            "{what}: {got:?} does not start with {reason:?}"
        );
    }
    assert_eq!(
        w.tls().get(),
        0,
        "a refused connection reached the upstream"
    );
    assert_eq!(w.dns.count(&evil), 0, "a refused name was resolved");
    assert_eq!(w.dns.count(&ok), 0);
}
