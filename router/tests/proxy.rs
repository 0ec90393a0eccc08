//! The proxy end to end: real sockets, real TLS (rustls with a test CA), upstream test hosts in a network
//! namespace reached over a veth pair, a test DNS server on loopback. Every refusal test also proves that
//! the upstream accepted no connection and that the name was not even resolved.

mod proxy_support;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::time::{Duration, Instant};
use tokio::sync::RwLock;

use agent_sandbox_router::proxy::tls::build;
use proxy_support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The descriptor-count test takes this exclusively; every other test shares it.
static FD_LOCK: RwLock<()> = RwLock::const_new(());

/// A fresh test-unique label.
fn uniq(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}{}p{}",
        N.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    )
}

/// A world: a namespace, DNS, PKI.
struct World {
    /// Where this test's log events begin.
    mark: usize,
    ns: Netns,
    dns: TestDns,
    domain: String,
}

impl World {
    async fn new(tag: &str) -> World {
        capture_logs();
        World {
            mark: log_mark(),
            ns: Netns::create(),
            dns: TestDns::start(300).await,
            domain: format!("{}.test", uniq(tag)),
        }
    }
    fn name(&self, label: &str) -> String {
        if label.is_empty() {
            self.domain.clone()
        } else {
            format!("{label}.{}", self.domain)
        }
    }
    fn point(&self, name: &str) {
        self.dns.set(name, &[IpAddr::V4(self.ns.ns_ip)]);
    }
}

async fn tls_connect(
    router: SocketAddr,
    config: rustls::ClientConfig,
    name: &str,
) -> std::io::Result<(SocketAddr, tokio_rustls::client::TlsStream<TcpStream>)> {
    let tcp = TcpStream::connect(router).await?;
    let local = tcp.local_addr()?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await?;
    Ok((local, tls))
}

async fn ping(tls: &mut tokio_rustls::client::TlsStream<TcpStream>, line: &str) -> String {
    tls.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut reader = BufReader::new(tls);
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut out))
        .await
        .expect("answer in time")
        .unwrap();
    out.trim_end().to_owned()
}

/// Sends raw bytes to the router and returns everything it answers until it closes.
async fn raw_exchange(router: SocketAddr, bytes: &[u8]) -> (SocketAddr, Vec<u8>) {
    let mut s = TcpStream::connect(router).await.unwrap();
    let local = s.local_addr().unwrap();
    s.write_all(bytes).await.unwrap();
    (local, read_to_end(&mut s).await)
}

const ALERT_ACCESS_DENIED: [u8; 7] = [0x15, 3, 3, 0, 2, 2, 49];
const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [0x15, 3, 3, 0, 2, 2, 112];
const ALERT_INTERNAL_ERROR: [u8; 7] = [0x15, 3, 3, 0, 2, 2, 80];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_allowed_end_to_end_and_logged() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("tlsok").await;
    let name = w.name("api");
    w.point(&name);
    let pki = Pki::new(&[&name]);
    let accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let router = TestRouter::start(
        Settings {
            hosts: vec![name.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let (local, mut tls) = tls_connect(router.https, pki.client_config(), &name)
        .await
        .unwrap();
    assert_eq!(
        ping(&mut tls, "hello").await,
        format!("upstream {name} hello")
    );
    // Upper case and a trailing dot are the same name.
    let upper = format!("{}.", name.to_ascii_uppercase());
    let (_, mut tls2) = tls_connect(router.https, pki.client_config(), &upper)
        .await
        .unwrap();
    assert!(ping(&mut tls2, "again").await.ends_with(" again"));
    assert_eq!(accepts.get(), 2);
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
    let _g = FD_LOCK.read().await;
    let w = World::new("wild").await;
    let deep = w.name("a.b");
    let apex = w.name("");
    let look_alike = format!("bad{}", w.domain);
    for n in [&deep, &apex, &look_alike] {
        w.point(n);
    }
    let pki = Pki::new(&[&format!("*.b.{}", w.domain), &apex]);
    let accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let router = TestRouter::start(
        Settings {
            subdomains: vec![w.domain.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    for n in [&deep, &apex] {
        let (_, mut tls) = tls_connect(router.https, pki.client_config(), n)
            .await
            .unwrap();
        assert_eq!(ping(&mut tls, "x").await, format!("upstream {n} x"));
    }
    assert!(tls_connect(router.https, pki.client_config(), &look_alike)
        .await
        .is_err());
    assert_eq!(refusal(&look_alike).await, "not on the allowlist");
    assert_eq!(accepts.get(), 2);
    assert_eq!(w.dns.count(&look_alike), 0);
}

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
async fn tls_hello_split_every_way() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("split").await;
    let name = w.name("s");
    w.point(&name);
    let pki = Pki::new(&[&name]);
    let accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let router = TestRouter::start(
        Settings {
            hosts: vec![name.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
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
    ];
    for (what, cut, pause) in cases {
        let config = pki.client_config();
        let n = name.clone();
        let addr = router.https;
        let got = tokio::task::spawn_blocking(move || manual_tls(addr, config, &n, cut, pause))
            .await
            .unwrap();
        assert_eq!(
            got.as_deref().map_err(|e| e.to_string()),
            Ok(want.as_str()),
            "{what}"
        );
    }
    assert_eq!(accepts.get(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_twenty_kilobyte_hello() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("big").await;
    let name = w.name("big");
    w.point(&name);
    let pki = Pki::new(&[&name]);
    let accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let router = TestRouter::start(
        Settings {
            hosts: vec![name.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let mut config = pki.client_config();
    // 80 ALPN ids of 250 bytes: a ~20 KB hello, more than one TLS record.
    config.alpn_protocols = (0..80u8).map(|i| vec![b'a' + i % 26; 250]).collect();
    let (_, mut tls) = tls_connect(router.https, config, &name).await.unwrap();
    assert_eq!(ping(&mut tls, "big").await, format!("upstream {name} big"));
    assert_eq!(accepts.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refusals_never_reach_the_upstream() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("tlsno").await;
    let ok = w.name("ok");
    let evil = w.name("evil");
    w.point(&ok);
    w.point(&evil);
    let pki = Pki::new(&[&ok, &evil]);
    let accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let router = TestRouter::start(
        Settings {
            hosts: vec![ok.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;

    // A real client asking for a name that is not listed gets access_denied.
    let err = tls_connect(router.https, pki.client_config(), &evil)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.to_lowercase().contains("accessdenied") || err.contains("AccessDenied"),
        "{err}"
    );
    assert_eq!(refusal(&evil).await, "not on the allowlist");

    // A real client sending no SNI (rustls sends none when told not to).
    let mut no_sni = pki.client_config();
    no_sni.enable_sni = false;
    assert!(tls_connect(router.https, no_sni, &ok).await.is_err());

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
        let (local, answer) = raw_exchange(router.https, &bytes).await;
        assert_eq!(answer, alert, "{what}");
        let (_, got) = refusal_from(w.mark, local).await;
        assert!(
            got.starts_with(&reason),
            "{what}: {got:?} does not start with {reason:?}"
        );
    }
    assert_eq!(
        accepts.get(),
        0,
        "a refused connection reached the upstream"
    );
    assert_eq!(w.dns.count(&evil), 0, "a refused name was resolved");
    assert_eq!(w.dns.count(&ok), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebinding_to_forbidden_addresses_is_not_dialled() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("rebind").await;
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
    // Listeners where a dial would land: on the router's own veth address, and in the namespace.
    let own_listener = tokio::net::TcpListener::bind((w.ns.host_ip, 443))
        .await
        .unwrap();
    let own_accepts = echo_upstream(own_listener);
    let ns_accepts = echo_upstream(w.ns.bind(443));
    let router = TestRouter::start(
        Settings {
            hosts: vec![
                to_loopback.clone(),
                to_mapped.clone(),
                to_own.clone(),
                mixed.clone(),
            ],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
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
            raw_exchange(router.https, &build::hello_record(&[name.as_bytes()], 0)).await;
        assert_eq!(answer, ALERT_ACCESS_DENIED, "{name}");
        let got = refusal(name).await;
        assert!(got.starts_with(reason), "{name}: {got}");
        // Same over HTTP: a 403 that says why.
        let mut s = TcpStream::connect(router.http).await.unwrap();
        s.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (status, body) = read_response(&mut BufReader::new(s)).await.unwrap();
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("forbidden address"), "{body}");
    }
    assert_eq!(own_accepts.get(), 0);
    assert_eq!(ns_accepts.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_closes_promptly() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("down").await;
    let name = w.name("down");
    let nx = w.name("nx");
    w.point(&name);
    let router = TestRouter::start(
        Settings {
            hosts: vec![name.clone(), nx.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    // Nothing listens in the namespace: connection refused at once.
    let start = Instant::now();
    let (_, answer) = raw_exchange(router.https, &build::hello_record(&[name.as_bytes()], 0)).await;
    assert_eq!(answer, ALERT_INTERNAL_ERROR);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let mut s = TcpStream::connect(router.http).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, body) = read_response(&mut BufReader::new(s)).await.unwrap();
    assert_eq!(status, 502, "{body}");
    // A name that does not resolve.
    let (_, answer) = raw_exchange(router.https, &build::hello_record(&[nx.as_bytes()], 0)).await;
    assert_eq!(answer, ALERT_INTERNAL_ERROR);
    // The router carries on.
    let (_, answer) = raw_exchange(router.https, b"junk").await;
    assert_eq!(answer, ALERT_ACCESS_DENIED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_are_closed_after_the_peek_timeout() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("stall").await;
    let name = w.name("s");
    w.point(&name);
    let accepts = echo_upstream(w.ns.bind(443));
    let router = TestRouter::start(
        Settings {
            hosts: vec![name.clone()],
            peek_timeout_secs: 1,
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let hello = build::hello_record(&[name.as_bytes()], 0);
    let start = Instant::now();
    let (local, answer) = raw_exchange(router.https, &hello[..hello.len() - 1]).await;
    let took = start.elapsed();
    assert_eq!(answer, ALERT_ACCESS_DENIED);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(refusal_from(w.mark, local).await.1, "peek timeout");
    let start = Instant::now();
    let (local, answer) = raw_exchange(
        router.http,
        format!("GET / HTTP/1.1\r\nHost: {name}\r\n").as_bytes(),
    )
    .await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408 "));
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(refusal_from(w.mark, local).await.1, "peek timeout");
    assert_eq!(accepts.get(), 0);

    // On a kept-alive connection, a later head that stalls half-way is cut off too.
    let http_accepts = http_upstream(w.ns.bind(80));
    let s = TcpStream::connect(router.http).await.unwrap();
    let mut s = BufReader::new(s);
    s.get_mut()
        .write_all(
            format!("GET /1 HTTP/1.1\r\nHost: {name}\r\n\r\nGET /2 HTTP/1.1\r\nHo").as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    let start = Instant::now();
    assert_eq!(read_response(&mut s).await.unwrap().0, 408);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(http_accepts.get(), 1);

    // An upstream that closes after its response: a client that then sits idle is closed, too.
    let s = TcpStream::connect(router.http).await.unwrap();
    let mut s = BufReader::new(s);
    s.get_mut()
        .write_all(format!("GET /close HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    let start = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed after the upstream went away")
        .unwrap();
    assert!(rest.is_empty());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

/// Sends one request on a fresh connection and reads one response.
async fn http_once(router: SocketAddr, request: &str) -> (SocketAddr, Option<(u16, String)>) {
    let s = TcpStream::connect(router).await.unwrap();
    let local = s.local_addr().unwrap();
    let mut s = BufReader::new(s);
    s.get_mut().write_all(request.as_bytes()).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), read_response(&mut s))
        .await
        .unwrap();
    (local, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_routing_and_refusals() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("http").await;
    let ok = w.name("www");
    let evil = w.name("evil");
    w.point(&ok);
    w.point(&evil);
    let accepts = http_upstream(w.ns.bind(80));
    let router = TestRouter::start(
        Settings {
            hosts: vec![ok.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;

    let (_, r) = http_once(
        router.http,
        &format!("GET /a HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.unwrap(), (200, format!("host={ok} path=/a len=0 sum=0")));
    let (_, r) = http_once(
        router.http,
        &format!("GET /b HTTP/1.1\r\nHost: {}:80\r\n\r\n", ok.to_uppercase()),
    )
    .await;
    assert_eq!(r.unwrap().0, 200);
    let (_, r) = http_once(
        router.http,
        &format!("GET http://{ok}/c HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.unwrap().0, 200);
    let (_, r) = http_once(
        router.http,
        &format!("GET /d HTTP/1.0\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.unwrap().0, 200);
    assert_eq!(accepts.get(), 4);

    let refused: Vec<(&str, String, u16, &str)> = vec![
        ("not listed", format!("GET / HTTP/1.1\r\nHost: {evil}\r\n\r\n"), 403, "not on the allowlist"),
        ("ip literal", format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", w.ns.ns_ip), 403, "IP literal"),
        ("no host 1.0", "GET / HTTP/1.0\r\n\r\n".to_owned(), 400, "no Host header"),
        ("duplicate host", format!("GET / HTTP/1.1\r\nHost: {ok}\r\nHost: {evil}\r\n\r\n"), 400, "several Host headers"),
        (
            "absolute-form mismatch",
            format!("GET http://{evil}/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            400,
            "the request target names",
        ),
        ("connect", format!("CONNECT {ok}:443 HTTP/1.1\r\nHost: {ok}:443\r\n\r\n"), 405, "CONNECT"),
        ("h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_owned(), 400, "HTTP/2 prior knowledge"),
        ("h2c upgrade", format!("GET / HTTP/1.1\r\nHost: {ok}\r\nUpgrade: h2c\r\nHTTP2-Settings: AA\r\n\r\n"), 400, "upgrade to HTTP/2"),
        (
            "te+cl",
            format!("POST / HTTP/1.1\r\nHost: {ok}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            400,
            "both Transfer-Encoding",
        ),
        ("nul in host", format!("GET / HTTP/1.1\r\nHost: a\0{ok}\r\n\r\n"), 400, "control or non-ASCII"),
        ("at in host", format!("GET / HTTP/1.1\r\nHost: x@{ok}\r\n\r\n"), 400, "invalid name"),
    ];
    for (what, req, status, reason) in refused {
        let (local, r) = http_once(router.http, &req).await;
        let (got, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(got, status, "{what}: {body}");
        let (_, logged) = refusal_from(w.mark, local).await;
        assert!(
            logged.contains(reason),
            "{what}: {logged:?} lacks {reason:?}"
        );
        if status == 403 {
            assert!(body.contains("not on the sandbox allowlist"), "{body}");
            // This router's configuration names no allowlist file (tests/cli.rs covers the modes).
            assert!(body.contains("add it to the router's allowlist"), "{body}");
        }
    }
    let (_, r) = http_once(
        router.http,
        &format!("GET / HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
    )
    .await;
    assert!(r.unwrap().1.contains(&evil));
    assert_eq!(accepts.get(), 4, "a refused request reached the upstream");
    assert_eq!(w.dns.count(&evil), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_keep_alive_host_switch_is_refused() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("ka").await;
    let ok = w.name("ok");
    let other = w.name("other");
    w.point(&ok);
    w.point(&other);
    let accepts = http_upstream(w.ns.bind(80));
    let router = TestRouter::start(
        Settings {
            // Both are allowed: switching between two allowed names is still refused.
            hosts: vec![ok.clone(), other.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let s = TcpStream::connect(router.http).await.unwrap();
    let local = s.local_addr().unwrap();
    let mut s = BufReader::new(s);
    // Two pipelined requests for the same host, then one for another host, all in one write.
    let req = format!(
        "GET /1 HTTP/1.1\r\nHost: {ok}\r\n\r\nPOST /2 HTTP/1.1\r\nHost: {ok}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /3 HTTP/1.1\r\nHost: {other}\r\n\r\n"
    );
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    let r1 = read_response(&mut s).await.unwrap();
    assert_eq!(r1, (200, format!("host={ok} path=/1 len=0 sum=0")));
    let r2 = read_response(&mut s).await.unwrap();
    assert_eq!(r2, (200, format!("host={ok} path=/2 len=3 sum=294")));
    let (status, body) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(&other), "{body}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    let (name, reason) = refusal_from(w.mark, local).await;
    assert_eq!(name, other);
    assert!(reason.contains("Host changed"), "{reason}");
    assert_eq!(accepts.get(), 1);
    assert_eq!(w.dns.count(&other), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_large_post_and_upgrade() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("post").await;
    let ok = w.name("ok");
    w.point(&ok);
    let _accepts = http_upstream(w.ns.bind(80));
    let router = TestRouter::start(
        Settings {
            hosts: vec![ok.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let body: Vec<u8> = (0..20_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sum = body.iter().fold(0u64, |s, b| s + u64::from(*b));
    let s = TcpStream::connect(router.http).await.unwrap();
    let mut s = BufReader::new(s);
    let head = format!(
        "POST /big HTTP/1.1\r\nHost: {ok}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (mut r, mut wr) = s.get_mut().split();
    let send = async {
        wr.write_all(head.as_bytes()).await.unwrap();
        wr.write_all(&body).await.unwrap();
        // A second request on the same connection after the body: chunked.
        wr.write_all(format!("POST /c HTTP/1.1\r\nHost: {ok}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwxyz\r\n0\r\n\r\n").as_bytes())
            .await
            .unwrap();
    };
    let recv = async {
        let mut br = BufReader::new(&mut r);
        let a = read_response(&mut br).await.unwrap();
        let b = read_response(&mut br).await.unwrap();
        (a, b)
    };
    let ((), (a, b)) = tokio::join!(send, recv);
    assert_eq!(
        a,
        (
            200,
            format!("host={ok} path=/big len={} sum={sum}", body.len())
        )
    );
    assert_eq!(
        b.1,
        format!("host={ok} path=/c len=4 sum={}", 119 + 120 + 121 + 122)
    );
    drop(s);

    // WebSocket upgrade on a fresh connection: after the 101, raw bytes both ways.
    let mut s = TcpStream::connect(router.http).await.unwrap();
    s.write_all(websocket_request(&ok, "/ws").as_bytes())
        .await
        .unwrap();
    let mut br = BufReader::new(&mut s);
    let mut status = String::new();
    br.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    loop {
        let mut l = String::new();
        br.read_line(&mut l).await.unwrap();
        if l == "\r\n" {
            break;
        }
    }
    // Bytes that would be a request for another host are just data now.
    let smuggled = b"GET / HTTP/1.1\r\nHost: elsewhere\r\n\r\n";
    br.get_mut().write_all(smuggled).await.unwrap();
    let mut echoed = vec![0u8; smuggled.len()];
    br.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, smuggled);
}

/// A world with one allowed name served by [`http_upstream`], and a router for it.
async fn http_world(tag: &str) -> (World, String, Accepts, TestRouter) {
    let w = World::new(tag).await;
    let ok = w.name("ok");
    w.point(&ok);
    let accepts = http_upstream(w.ns.bind(80));
    let router = TestRouter::start(
        Settings {
            hosts: vec![ok.clone()],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    (w, ok, accepts, router)
}

/// Sends `bytes` on a fresh connection; returns the first response and whatever follows it until the
/// router closes.
async fn http_exchange(
    router: SocketAddr,
    bytes: &[u8],
) -> (SocketAddr, Option<(u16, String)>, Vec<u8>) {
    let s = TcpStream::connect(router).await.unwrap();
    let local = s.local_addr().unwrap();
    let mut s = BufReader::new(s);
    s.get_mut().write_all(bytes).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), read_response(&mut s))
        .await
        .expect("a response in time");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    (local, r, rest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_websocket_upgrade_requests_are_validated() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let (w, ok, accepts, router) = http_world("wsreq").await;
    let good = websocket_request(&ok, "/ws");
    let key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let cases: Vec<(&str, String)> = vec![
        (
            "bare Upgrade",
            format!("GET /ws HTTP/1.1\r\nHost: {ok}\r\nUpgrade: websocket\r\n\r\n"),
        ),
        ("no key", good.replace(key, "")),
        (
            "short key",
            good.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZQ=="),
        ),
        (
            "key not base64",
            good.replace("dGhlIHNhbXBsZSBub25jZQ==", "not-a-websocket-key-at-all"),
        ),
        ("version 8", good.replace("Version: 13", "Version: 8")),
        (
            "no version",
            good.replace("Sec-WebSocket-Version: 13\r\n", ""),
        ),
        (
            "no Connection: upgrade",
            good.replace("Connection: Upgrade", "Connection: keep-alive"),
        ),
        ("POST", good.replace("GET /ws", "POST /ws")),
        (
            "body",
            good.replace("\r\n\r\n", "\r\nContent-Length: 4\r\n\r\nabcd"),
        ),
        (
            "chunked body",
            good.replace(
                "\r\n\r\n",
                "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            ),
        ),
    ];
    for (what, req) in cases {
        let smuggled = format!("{req}GET / HTTP/1.1\r\nHost: elsewhere.invalid\r\n\r\n");
        let (local, r, rest) = http_exchange(router.http, smuggled.as_bytes()).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(status, 400, "{what}: {body}");
        assert!(
            rest.is_empty(),
            "{what}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        let (_, reason) = refusal_from(w.mark, local).await;
        assert!(reason.contains("WebSocket"), "{what}: {reason}");
    }
    assert_eq!(accepts.get(), 0, "a refused upgrade reached the upstream");

    // The genuine handshake still switches, and the 101 carries the accept for its key.
    let mut s = TcpStream::connect(router.http).await.unwrap();
    s.write_all(good.as_bytes()).await.unwrap();
    let mut br = BufReader::new(&mut s);
    let mut head = String::new();
    loop {
        let mut l = String::new();
        br.read_line(&mut l).await.unwrap();
        head.push_str(&l);
        if l == "\r\n" {
            break;
        }
    }
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains(&format!(
        "Sec-WebSocket-Accept: {}\r\n",
        websocket_accept("dGhlIHNhbXBsZSBub25jZQ==")
    )));
    br.get_mut().write_all(b"frames").await.unwrap();
    let mut echoed = [0u8; 6];
    br.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"frames");
    assert_eq!(accepts.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_websocket_switch_needs_a_genuine_101() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let (_w, ok, accepts, router) = http_world("ws101").await;
    // The upstream answers 101 but not as RFC 6455 requires: the router must not go raw, so the
    // request that follows (for another host) is never relayed; the client gets a 502 and a close.
    for path in ["/ws-noaccept", "/ws-badaccept", "/ws-other"] {
        let before = accepts.get();
        let req = format!(
            "{}GET / HTTP/1.1\r\nHost: elsewhere.invalid\r\n\r\n",
            websocket_request(&ok, path)
        );
        let (_, r, rest) = http_exchange(router.http, req.as_bytes()).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{path}: no response"));
        assert_eq!(status, 502, "{path}: {body}");
        assert!(body.contains("Sec-WebSocket-Accept"), "{path}: {body}");
        assert!(
            rest.is_empty(),
            "{path}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        assert_eq!(accepts.get(), before + 1);
    }

    // A valid handshake answered without a switch (here a 200): the answer is relayed, but nothing
    // more is forwarded on that connection.
    let req = format!(
        "{}GET /second HTTP/1.1\r\nHost: {ok}\r\n\r\n",
        websocket_request(&ok, "/plain")
    );
    let (_, r, rest) = http_exchange(router.http, req.as_bytes()).await;
    assert_eq!(
        r.unwrap(),
        (200, format!("host={ok} path=/plain len=0 sum=0"))
    );
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_head_hygiene() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let (w, ok, accepts, router) = http_world("hyg").await;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bare LF",
            format!("GET / HTTP/1.1\nHost: {ok}\n\n").into_bytes(),
            "bare LF",
        ),
        (
            "bare LF in one line",
            format!("GET / HTTP/1.1\r\nHost: {ok}\nX: y\r\n\r\n").into_bytes(),
            "bare LF",
        ),
        (
            "control byte",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a\x1bb\r\n\r\n").into_bytes(),
            "control or non-ASCII",
        ),
        (
            "DEL",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a\x7f\r\n\r\n").into_bytes(),
            "control or non-ASCII",
        ),
        (
            "high byte",
            [
                format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a").as_bytes(),
                &[0xff, 0x80],
                b"\r\n\r\n",
            ]
            .concat(),
            "control or non-ASCII",
        ),
        (
            "nul in host",
            format!("GET / HTTP/1.1\r\nHost: a\0{ok}\r\n\r\n").into_bytes(),
            "control or non-ASCII",
        ),
        (
            "obs-fold",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a\r\n b\r\n\r\n").into_bytes(),
            "obsolete line folding",
        ),
        (
            "X-Forwarded-Host",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX-Forwarded-Host: evil.invalid\r\n\r\n")
                .into_bytes(),
            "X-Forwarded-Host",
        ),
        (
            "X-Host",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nx-host: evil.invalid\r\n\r\n").into_bytes(),
            "X-Host",
        ),
        (
            "X-Original-Host",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX-Original-Host: evil.invalid\r\n\r\n")
                .into_bytes(),
            "X-Original-Host",
        ),
        (
            "Forwarded",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nForwarded: host=evil.invalid\r\n\r\n")
                .into_bytes(),
            "Forwarded",
        ),
    ];
    for (what, req, reason) in &cases {
        let (local, r, rest) = http_exchange(router.http, req).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(status, 400, "{what}: {body}");
        assert!(rest.is_empty(), "{what}");
        let (_, logged) = refusal_from(w.mark, local).await;
        assert!(
            logged.contains(reason),
            "{what}: {logged:?} lacks {reason:?}"
        );
    }
    assert_eq!(accepts.get(), 0, "a refused head reached the upstream");

    // On a kept-alive connection: the first request is answered, the offending one refused in order,
    // the one after it never forwarded.
    for (what, req, _) in &cases {
        let before = accepts.get();
        let mut all = format!("GET /1 HTTP/1.1\r\nHost: {ok}\r\n\r\n").into_bytes();
        all.extend_from_slice(req);
        all.extend_from_slice(format!("GET /3 HTTP/1.1\r\nHost: {ok}\r\n\r\n").as_bytes());
        let s = TcpStream::connect(router.http).await.unwrap();
        let mut s = BufReader::new(s);
        s.get_mut().write_all(&all).await.unwrap();
        let first = read_response(&mut s).await;
        assert_eq!(
            first,
            Some((200, format!("host={ok} path=/1 len=0 sum=0"))),
            "{what}"
        );
        let (status, body) = read_response(&mut s)
            .await
            .unwrap_or_else(|| panic!("{what}: no refusal"));
        assert_eq!(status, 400, "{what}: {body}");
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
        assert!(
            rest.is_empty(),
            "{what}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        assert_eq!(accepts.get(), before + 1);
    }

    // Chunked framing with a bare LF is refused too (and nothing after it is forwarded).
    let req = format!(
        "POST /c HTTP/1.1\r\nHost: {ok}\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\nGET /x HTTP/1.1\r\nHost: {ok}\r\n\r\n"
    );
    let (local, r, rest) = http_exchange(router.http, req.as_bytes()).await;
    assert_eq!(r.map(|r| r.0), Some(400));
    assert!(rest.is_empty());
    let (_, logged) = refusal_from(w.mark, local).await;
    assert!(logged.contains("chunk size"), "{logged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_absolute_form_targets_are_strict() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let (w, ok, accepts, router) = http_world("abs").await;
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "port 8080",
            format!("GET http://{ok}:8080/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "port other than 80",
        ),
        (
            "port 443",
            format!("GET http://{ok}:443/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "port other than 80",
        ),
        (
            "empty port",
            format!("GET http://{ok}:/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "port other than 80",
        ),
        (
            "userinfo",
            format!("GET http://evil.invalid@{ok}/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "fragment before path",
            format!("GET http://{ok}#@evil.invalid/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "fragment",
            format!("GET http://{ok}/#x HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "backslash",
            format!("GET http://{ok}\\@evil.invalid/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "other host",
            format!("GET http://evil.invalid/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "the request target names",
        ),
    ];
    for (what, req, reason) in &cases {
        let (local, r) = http_once(router.http, req).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(status, 400, "{what}: {body}");
        let (_, logged) = refusal_from(w.mark, local).await;
        assert!(
            logged.contains(reason),
            "{what}: {logged:?} lacks {reason:?}"
        );
    }
    assert_eq!(accepts.get(), 0, "a refused target reached the upstream");
    let (_, r) = http_once(
        router.http,
        &format!("GET http://{ok}:80/p HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(
        r.unwrap(),
        (200, format!("host={ok} path=http://{ok}:80/p len=0 sum=0"))
    );

    // Later on a kept-alive connection: refused in order, after the first answer.
    let req = format!(
        "GET /1 HTTP/1.1\r\nHost: {ok}\r\n\r\nGET http://{ok}:8080/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"
    );
    let s = TcpStream::connect(router.http).await.unwrap();
    let mut s = BufReader::new(s);
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.map(|r| r.0), Some(200));
    assert_eq!(read_response(&mut s).await.map(|r| r.0), Some(400));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_port_entries() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("fwd").await;
    let db = w.name("db");
    w.point(&db);
    let accepts = echo_upstream(w.ns.bind(5432));
    let router = TestRouter::start(
        Settings {
            forwards: vec![(db.clone(), 5432)],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let mut s = TcpStream::connect(router.forward(&db, 5432)).await.unwrap();
    let local = s.local_addr().unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    s.write_all(&data).await.unwrap();
    // Half-close: the echo comes back in full after our FIN.
    s.shutdown().await.unwrap();
    let back = read_to_end(&mut s).await;
    assert_eq!(back.len(), data.len());
    assert!(back == data);
    assert_eq!(accepts.get(), 1);
    let e = connection_event(w.mark, local).await;
    assert_eq!(e["listener"], "forward");
    assert_eq!(e["bytes_up"].as_u64(), Some(1_000_000));
    assert_eq!(e["bytes_down"].as_u64(), Some(1_000_000));
    // The entry's host is also allowed on 443/80 by policy, but the forward goes to its port only.
    assert_eq!(e["upstream"], format!("{}:5432", w.ns.ns_ip));
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_connections_and_no_leaks() {
    require_netns!();
    let _g = FD_LOCK.write().await;
    let w = World::new("load").await;
    let ok = w.name("ok");
    let db = w.name("db");
    w.point(&ok);
    w.point(&db);
    let pki = Pki::new(&[&ok]);
    let tls_accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let fwd_accepts = echo_upstream(w.ns.bind(5432));
    let http_accepts = http_upstream(w.ns.bind(80));
    let router = TestRouter::start(
        Settings {
            hosts: vec![ok.clone()],
            forwards: vec![(db.clone(), 5432)],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    // Warm up (resolver sockets, caches), then take the baseline.
    let (_, mut t) = tls_connect(router.https, pki.client_config(), &ok)
        .await
        .unwrap();
    ping(&mut t, "warm").await;
    drop(t);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = open_fds();

    let fwd = router.forward(&db, 5432);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..400u32 {
        set.spawn(async move {
            let mut s = TcpStream::connect(fwd).await.unwrap();
            let msg = format!("conn {i}\n");
            s.write_all(msg.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; msg.len()];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(buf, msg.as_bytes());
            s
        });
    }
    let mut open = Vec::new();
    while let Some(r) = set.join_next().await {
        open.push(r.unwrap());
    }
    // All 400 are open at once through the router.
    assert_eq!(open.len(), 400);
    let config = Arc::new(pki.client_config());
    let mut tls_set = tokio::task::JoinSet::new();
    for i in 0..100u32 {
        let config = Arc::clone(&config);
        let ok = ok.clone();
        let addr = router.https;
        tls_set.spawn(async move {
            let (_, mut t) = tls_connect(addr, (*config).clone(), &ok).await.unwrap();
            assert!(ping(&mut t, &format!("t{i}"))
                .await
                .ends_with(&format!("t{i}")));
        });
    }
    while let Some(r) = tls_set.join_next().await {
        r.unwrap();
    }
    // HTTP too: allowed requests, and refusals (which linger briefly before closing).
    let mut http_set = tokio::task::JoinSet::new();
    for i in 0..200u32 {
        let host = if i % 2 == 0 {
            ok.clone()
        } else {
            format!("no{i}.invalid-test")
        };
        let addr = router.http;
        http_set.spawn(async move {
            let (_, r) =
                http_once(addr, &format!("GET /{i} HTTP/1.1\r\nHost: {host}\r\n\r\n")).await;
            let status = r.unwrap().0;
            assert_eq!(status, if i % 2 == 0 { 200 } else { 403 });
        });
    }
    while let Some(r) = http_set.join_next().await {
        r.unwrap();
    }
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = open_fds();
        if now <= baseline {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors: {now} now, {baseline} before"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fwd_accepts.get(), 400);
    assert_eq!(tls_accepts.get(), 101);
    assert_eq!(http_accepts.get(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_returns_promptly_on_shutdown() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("stop").await;
    let db = w.name("db");
    w.point(&db);
    let _accepts = echo_upstream(w.ns.bind(5432));
    let mut router = TestRouter::start(
        Settings {
            forwards: vec![(db.clone(), 5432)],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    // A long-lived relay in flight must not hold the shutdown back.
    let mut s = TcpStream::connect(router.forward(&db, 5432)).await.unwrap();
    s.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    let start = Instant::now();
    router.stop.cancel();
    for t in router.tasks.drain(..) {
        tokio::time::timeout(Duration::from_secs(1), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(start.elapsed() < Duration::from_millis(500));
    // The relay was dropped: the client sees the close.
    assert!(read_to_end(&mut s).await.is_empty());
}

/// The real binary, configured by file, with `--log-format json`: the wiring, the logging contract the
/// launcher parses, and SIGTERM with a relay in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_binary_json_log_contract() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("bin").await;
    let ok = w.name("ok");
    let evil = w.name("evil");
    w.point(&ok);
    let pki = Pki::new(&[&ok]);
    let accepts = tls_upstream(w.ns.bind(443), Arc::clone(&pki.server));
    let dir = std::env::temp_dir().join(uniq("asr-bin"));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("router.toml");
    std::fs::write(
        &config,
        format!(
            "hosts = [\"{ok}\"]\nresolvers = [\"{}\"]\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\n[answers]\ndefault = \"127.0.0.2\"\n",
            w.dns.addr
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox-router"))
        .args(["--config", config.to_str().unwrap(), "--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = Arc::new(std::sync::Mutex::new(Vec::<serde_json::Value>::new()));
    let sink = Arc::clone(&lines);
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) => sink.lock().unwrap().push(v),
                Err(_) => eprintln!("router (not JSON): {line}"),
            }
        }
    });
    let find = |pred: &dyn Fn(&serde_json::Value) -> bool| -> Option<serde_json::Value> {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|v| v.get("fields").cloned())
            .find(|f| pred(f))
    };
    let mut https = None;
    for _ in 0..1000 {
        if let Some(f) = find(&|f| {
            f["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("listening on") && m.ends_with("(https)"))
        }) {
            let m = f["message"].as_str().unwrap();
            https = Some(m.split(' ').nth(2).unwrap().parse::<SocketAddr>().unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let https = https.expect("the router reports its https listener");

    let (_, mut tls) = tls_connect(https, pki.client_config(), &ok).await.unwrap();
    assert_eq!(ping(&mut tls, "bin").await, format!("upstream {ok} bin"));
    let (local, answer) = raw_exchange(https, &build::hello_record(&[evil.as_bytes()], 0)).await;
    assert_eq!(answer, ALERT_ACCESS_DENIED);
    let client = local.to_string();
    let mut refused = None;
    for _ in 0..500 {
        refused = find(&|f| f["message"] == "refused" && f["client"] == client.as_str());
        if refused.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = refused.expect("a JSON refused event");
    assert_eq!(refused["kind"], "tls");
    assert_eq!(refused["name"], evil.as_str());
    assert_eq!(refused["reason"], "not on the allowlist");
    let mut conn = None;
    for _ in 0..500 {
        conn = find(&|f| f["message"] == "connection" && f["client"] == client.as_str());
        if conn.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let conn = conn.expect("a JSON connection event");
    for field in [
        "listener",
        "name",
        "decision",
        "upstream",
        "bytes_up",
        "bytes_down",
        "duration_ms",
    ] {
        assert!(conn.get(field).is_some(), "{field} missing in {conn}");
    }
    assert_eq!(conn["decision"], "refused");

    // SIGTERM with the allowed relay still open: out within a second.
    let start = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "router ignored SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(status.success(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(accepts.get(), 1);
    drop(tls);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_holds_extra_connections_in_the_backlog() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    let w = World::new("cap").await;
    let db = w.name("db");
    w.point(&db);
    let accepts = echo_upstream(w.ns.bind(5432));
    let router = TestRouter::start(
        Settings {
            forwards: vec![(db.clone(), 5432)],
            max_connections: 2,
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let addr = router.forward(&db, 5432);
    let echo = |mut s: TcpStream| async move {
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_millis(500), s.read_exact(&mut b)).await;
        (s, r.is_ok())
    };
    let (c1, ok1) = echo(TcpStream::connect(addr).await.unwrap()).await;
    let (_c2, ok2) = echo(TcpStream::connect(addr).await.unwrap()).await;
    assert!(ok1 && ok2);
    // The third waits in the kernel's backlog: no relay, no upstream connection.
    let (mut c3, ok3) = echo(TcpStream::connect(addr).await.unwrap()).await;
    assert!(!ok3, "a third connection was served past the cap of 2");
    assert_eq!(accepts.get(), 2);
    drop(c1);
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), c3.read_exact(&mut b))
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert_eq!(&b, b"x");
    assert_eq!(accepts.get(), 3);
}

fn set_soft_nofile(soft: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let old = lim.rlim_cur;
        lim.rlim_cur = soft;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        old
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_backs_off_then_recovers() {
    require_netns!();
    // Alone: the descriptor limit is process-wide.
    let _g = FD_LOCK.write().await;
    let w = World::new("emfile").await;
    let db = w.name("db");
    w.point(&db);
    let accepts = echo_upstream(w.ns.bind(5432));
    let router = TestRouter::start(
        Settings {
            forwards: vec![(db.clone(), 5432)],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let addr = router.forward(&db, 5432);
    let warnings = || {
        events("cannot accept; backing off")
            .iter()
            .filter(|e| e["listener"] == "forward")
            .count()
    };
    let before = warnings();
    // One free descriptor: the client's socket takes it, the router's accept() gets EMFILE.
    // (open_fds() counts its own directory descriptor, hence no +1.)
    let old = set_soft_nofile(open_fds() as u64);
    let client = TcpStream::connect(addr).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    set_soft_nofile(old);
    let client = client.unwrap();
    let backoffs = warnings() - before;
    // Exponential backoff from 10 ms to 1 s: a handful of warnings in 1.5 s, not a spin.
    assert!((1..=12).contains(&backoffs), "{backoffs} backoff warnings");
    assert_eq!(accepts.get(), 0);
    // With descriptors back, the router serves again (the client that waited may have met a resolver
    // that had just failed for want of a socket; what matters is that the failure does not last).
    drop(client);
    let start = Instant::now();
    loop {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"y").await.unwrap();
        let mut b = [0u8; 1];
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), c.read_exact(&mut b)).await
        {
            assert_eq!(&b, b"y");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the router did not recover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("recovered after {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolution_is_cached_for_the_record_ttl_only() {
    require_netns!();
    let _g = FD_LOCK.read().await;
    capture_logs();
    let ns = Netns::create();
    let dns = TestDns::start(1).await;
    let db = format!("db.{}.test", uniq("ttl"));
    dns.set(&db, &[IpAddr::V4(ns.ns_ip)]);
    let _accepts = echo_upstream(ns.bind(5432));
    let router = TestRouter::start(
        Settings {
            forwards: vec![(db.clone(), 5432)],
            ..Settings::default()
        },
        &dns,
    )
    .await;
    let round_trip = || async {
        let mut s = TcpStream::connect(router.forward(&db, 5432)).await.unwrap();
        s.write_all(b"t").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
    };
    let a_queries = || dns.count_type(&db, hickory_proto::rr::RecordType::A);
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
    let _g = FD_LOCK.read().await;
    let w = World::new("next").await;
    let down = Netns::create();
    let db = w.name("db");
    // The first address refuses (nothing listens there), the second serves.
    w.dns
        .set(&db, &[IpAddr::V4(down.ns_ip), IpAddr::V4(w.ns.ns_ip)]);
    let accepts = echo_upstream(w.ns.bind(5432));
    let router = TestRouter::start(
        Settings {
            forwards: vec![(db.clone(), 5432)],
            ..Settings::default()
        },
        &w.dns,
    )
    .await;
    let mut s = TcpStream::connect(router.forward(&db, 5432)).await.unwrap();
    let local = s.local_addr().unwrap();
    s.write_all(b"n").await.unwrap();
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    drop(s);
    assert_eq!(accepts.get(), 1);
    let e = connection_event(w.mark, local).await;
    assert_eq!(e["upstream"], format!("{}:5432", w.ns.ns_ip));
}
