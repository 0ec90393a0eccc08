//! The admin endpoint over real sockets on 127.0.0.1, and its metrics exposition read back by a
//! Prometheus text parser.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_router::admin::{self, AdminState, METRICS_CONTENT_TYPE};
use agent_sandbox_router::metrics::{
    CloseReason, Decision, Direction, DnsResult, Listener, Metrics, RefusalReason, CONNECT_BUCKETS,
};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running admin endpoint; cancels and joins it when dropped.
struct Server {
    addr: SocketAddr,
    state: Arc<AdminState>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Server {
    async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(AdminState::new(Arc::new(Metrics::new())));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(admin::serve(listener, Arc::clone(&state), shutdown.clone()));
        Server {
            addr,
            state,
            shutdown,
            task: Some(task),
        }
    }

    fn ready(&self) {
        self.state.set_listeners_bound(true);
        self.state.set_policy_loaded(true);
    }

    /// Sends `raw` and reads the whole response (the server closes after it).
    async fn raw(&self, raw: &[u8]) -> Reply {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(raw).await.unwrap();
        read_reply(&mut s).await
    }

    async fn get(&self, path: &str) -> Reply {
        self.raw(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A parsed response.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

async fn read_reply(s: &mut TcpStream) -> Reply {
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut bytes))
        .await
        .expect("the server closes after its response")
        .unwrap();
    parse_reply(&bytes)
}

fn parse_reply(bytes: &[u8]) -> Reply {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status = status_line[9..12].parse().unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_ascii_lowercase(), v.to_owned())
        })
        .collect::<BTreeMap<_, _>>();
    assert_eq!(headers["connection"], "close");
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

#[tokio::test]
async fn probes_and_routes() {
    let server = Server::start().await;
    assert_eq!(server.get("/livez").await.status, 200);
    assert_eq!(server.get("/readyz").await.status, 503, "nothing bound yet");
    server.ready();
    assert_eq!(server.get("/readyz").await.status, 200);
    assert_eq!(
        server.get("/readyz?full=1").await.status,
        200,
        "query ignored"
    );
    server.state.start_draining();
    let r = server.get("/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (503, "draining\n"));
    assert_eq!(
        server.get("/livez").await.status,
        200,
        "alive while draining"
    );

    assert_eq!(server.get("/").await.status, 404);
    assert_eq!(server.get("/metricsx").await.status, 404);
    let r = server
        .raw(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "GET, HEAD");
    assert_eq!(server.raw(b"PUT /livez HTTP/1.0\r\n\r\n").await.status, 405);
    // A body the server never reads does not cost the client its response (no reset on close).
    let mut post = b"POST /livez HTTP/1.1\r\nContent-Length: 50000\r\n\r\n".to_vec();
    post.resize(post.len() + 50_000, b'x');
    assert_eq!(server.raw(&post).await.status, 405);
    assert_eq!(
        server
            .raw(b"\x16\x03\x01\x00\x05hello\r\n\r\n")
            .await
            .status,
        400
    );
    // Bare LF line ends are accepted, as RFC 9112 lets a recipient do.
    assert_eq!(server.raw(b"GET /livez HTTP/1.1\n\n").await.status, 200);
}

#[tokio::test]
async fn metrics_and_head() {
    let server = Server::start().await;
    server.state.metrics.dns_query(DnsResult::Refused);
    let r = server.get("/metrics?name[]=x").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], METRICS_CONTENT_TYPE);
    assert_eq!(r.headers["content-length"], r.body.len().to_string());
    assert!(r
        .body
        .contains("agent_sandbox_router_dns_queries_total{result=\"refused\"} 1\n"));

    let h = server.raw(b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.body, "", "HEAD gets no body");
    assert_eq!(h.headers["content-type"], METRICS_CONTENT_TYPE);
    let len: usize = h.headers["content-length"].parse().unwrap();
    assert!(len > 1000, "HEAD announces the GET body's length, {len}");
}

#[tokio::test]
async fn head_size_cap() {
    let server = Server::start().await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let mut head = b"GET /livez HTTP/1.1\r\nX: ".to_vec();
    head.resize(admin::MAX_HEAD_BYTES + 100, b'a');
    // The server may answer and close before it has read everything: a failed write is fine.
    let _ = s.write_all(&head).await;
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut bytes))
        .await
        .expect("answered at the cap, without waiting for more");
    assert!(
        bytes.starts_with(b"HTTP/1.1 431 "),
        "{:?}",
        String::from_utf8_lossy(&bytes)
    );
    // Just under the cap is served.
    let mut head = b"GET /livez HTTP/1.1\r\nX: ".to_vec();
    head.resize(admin::MAX_HEAD_BYTES - 4, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    assert_eq!(server.raw(&head).await.status, 200);
}

/// A client that never finishes its head gets 408 at the read deadline (the clock is paused and jumps
/// forward whenever every task waits, so this takes no real 5 s).
#[tokio::test(start_paused = true)]
async fn read_deadline() {
    let server = Server::start().await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
    let started = tokio::time::Instant::now();
    let r = read_reply(&mut s).await;
    assert_eq!(r.status, 408);
    assert!(started.elapsed() >= admin::READ_TIMEOUT);
}

/// A connection from `source` (a loopback address) to `server`.
async fn connect_from(source: [u8; 4], server: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from((source, 0)))
        .unwrap();
    socket.connect(server).await.unwrap()
}

/// `count` connections from `source`, each with one byte sent, so the server is known to be reading
/// them (not just holding them in its backlog) once a request after them is answered.
async fn hold(source: [u8; 4], server: std::net::SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..count {
        let mut s = connect_from(source, server).await;
        s.write_all(b"G").await.unwrap();
        held.push(s);
    }
    held
}

/// A connection the server closes at once, without an answer (not after the read deadline).
async fn closed_at_once(mut s: TcpStream) {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(4), s.read_to_end(&mut buf))
        .await
        .expect("closed at once, not after the read deadline");
    assert!(read.is_err() || buf.is_empty(), "{buf:?}");
}

/// `GET /livez` from `source`, retried until it is answered 200 (a slot freed by a close comes back
/// once the server has seen that close): polls, within 4 s.
async fn served(source: [u8; 4], server: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        let mut s = connect_from(source, server).await;
        s.write_all(b"GET /livez HTTP/1.1\r\n\r\n").await.unwrap();
        let mut bytes = Vec::new();
        let _ = s.read_to_end(&mut bytes).await;
        if bytes.starts_with(b"HTTP/1.1 200 ") {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "not served");
        tokio::task::yield_now().await;
    }
}

/// At the connection cap a new connection is closed at once; once one closes, requests are served again.
#[tokio::test]
async fn connection_cap() {
    let server = Server::start().await;
    let per = admin::MAX_PER_SOURCE as usize;
    let mut idle = Vec::new();
    for i in 0..admin::MAX_CONNECTIONS / per {
        idle.extend(hold([127, 0, 1, u8::try_from(i + 1).unwrap()], server.addr, per).await);
    }
    assert_eq!(idle.len(), admin::MAX_CONNECTIONS);
    closed_at_once(connect_from([127, 0, 2, 1], server.addr).await).await;
    drop(idle.pop());
    served([127, 0, 2, 1], server.addr).await;
}

/// One address holding connections open cannot lock others out (reviewer N: 64 idle connections from
/// one client failed the kubelet's probes): past its own cap its next connection is closed at once,
/// while another address is served.
#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let server = Server::start().await;
    let mut idle = hold([127, 0, 3, 1], server.addr, admin::MAX_PER_SOURCE as usize).await;
    closed_at_once(connect_from([127, 0, 3, 1], server.addr).await).await;
    served([127, 0, 3, 2], server.addr).await;
    drop(idle.pop());
    served([127, 0, 3, 1], server.addr).await;
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let mut server = Server::start().await;
    let idle = TcpStream::connect(server.addr).await.unwrap();
    server.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(2), server.task.take().unwrap())
        .await
        .expect("serve returns on shutdown, open connections or not")
        .unwrap();
    drop(idle);
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "no longer accepting"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Garbage over a real socket gets an error status or a close, never a hang, and the server goes on.
    #[test]
    fn garbage_over_the_socket(bytes in proptest::collection::vec(any::<u8>(), 1..2048)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let server = Server::start().await;
            let mut s = TcpStream::connect(server.addr).await.unwrap();
            let _ = s.write_all(&bytes).await;
            let _ = s.write_all(b"\r\n\r\n").await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
                .await
                .expect("an answer or a close");
            if !out.is_empty() {
                let status = parse_reply(&out).status;
                assert!(matches!(status, 200 | 400 | 404 | 405 | 431 | 503), "{status}");
            }
            assert_eq!(server.get("/livez").await.status, 200);
        });
    }
}

/// Samples `prometheus-parse` reports: one per series, except that a histogram's buckets are one sample
/// (its `_sum` and `_count` are samples of their own).
const PARSED_SAMPLES: usize = Metrics::series_count() - (CONNECT_BUCKETS.len() + 1) + 1;

/// Parses the exposition with `prometheus-parse` and returns the samples as (name, labels, value).
fn parse_exposition(text: &str) -> Vec<(String, BTreeMap<String, String>, String)> {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    scrape
        .samples
        .into_iter()
        .map(|s| {
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (s.metric, labels, format!("{:?}", s.value))
        })
        .collect()
}

/// A strict check of the text format as written: HELP then TYPE once per family, before its samples;
/// sample names belong to the family; label values quoted; values numbers.
fn check_format_strictly(text: &str) -> BTreeSet<String> {
    assert!(text.ends_with('\n'));
    let mut families = BTreeSet::new();
    let mut current: Option<(String, String)> = None;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            assert!(!help.is_empty());
            let ty = lines.next().unwrap().strip_prefix("# TYPE ").unwrap();
            let (tname, kind) = ty.split_once(' ').unwrap();
            assert_eq!(tname, name);
            assert!(matches!(kind, "counter" | "gauge" | "histogram"), "{kind}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            }
            assert!(families.insert(name.to_owned()), "{name} twice");
            current = Some((name.to_owned(), kind.to_owned()));
            continue;
        }
        let (family, kind) = current.as_ref().expect("samples after HELP/TYPE");
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(
            value == "+Inf" || value.parse::<f64>().is_ok_and(f64::is_finite),
            "{line}"
        );
        let name = series.split('{').next().unwrap();
        let ok = if kind == "histogram" {
            ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name == format!("{family}{s}"))
        } else {
            name == family
        };
        assert!(ok, "{line} outside its family {family}");
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                let inner = labels.strip_prefix('{').unwrap().strip_suffix('}').unwrap();
                for pair in inner.split(',') {
                    let (k, v) = pair.split_once('=').unwrap();
                    assert!(k.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{k}");
                    assert!(
                        v.len() >= 2 && v.starts_with('"') && v.ends_with('"'),
                        "{v}"
                    );
                }
            }
        }
    }
    families
}

#[test]
fn exposition_has_the_issues_families_and_parses() {
    let m = Arc::new(Metrics::new());
    m.policy_loaded(3);
    m.connection(Listener::Https, Decision::Allowed);
    m.upstream_connect(Duration::from_millis(3));
    m.bytes(Direction::Upstream, 517);
    let guard = m.open(Listener::Http);
    let text = m.render();
    drop(guard);

    let families = check_format_strictly(&text);
    let p = "agent_sandbox_router_";
    for (family, labels) in [
        ("dns_queries_total", &["result"][..]),
        ("connections_total", &["listener", "decision"]),
        ("connections_open", &["listener"]),
        ("bytes_total", &["direction"]),
        ("upstream_connect_seconds", &[]),
        ("config_reloads_total", &["result"]),
        ("config_last_reload_success_timestamp_seconds", &[]),
        ("allowlist_entries", &[]),
        ("build_info", &["version"]),
    ] {
        assert!(families.contains(&format!("{p}{family}")), "{family}");
        if family == "upstream_connect_seconds" {
            continue;
        }
        for line in text
            .lines()
            .filter(|l| l.starts_with(&format!("{p}{family}")))
        {
            let names: Vec<&str> = line
                .split(['{', ','])
                .skip(1)
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                .collect();
            assert_eq!(names, labels, "{line}");
        }
    }
    let decisions: BTreeSet<String> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{p}connections_total{{listener=\"https\"")))
        .map(|l| {
            l.split("decision=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        decisions,
        ["allowed", "failed", "refused"].map(str::to_owned).into()
    );

    let samples = parse_exposition(&text);
    assert_eq!(samples.len(), PARSED_SAMPLES);
    let find = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} {labels:?}"))
    };
    assert_eq!(
        find(
            &format!("{p}connections_total"),
            &[("listener", "https"), ("decision", "allowed")]
        ),
        "Counter(1.0)"
    );
    assert_eq!(
        find(&format!("{p}bytes_total"), &[("direction", "upstream")]),
        "Counter(517.0)"
    );
    assert_eq!(find(&format!("{p}allowlist_entries"), &[]), "Gauge(3.0)");
    assert_eq!(
        find(
            &format!("{p}build_info"),
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        "Gauge(1.0)"
    );
    let histogram = find(&format!("{p}upstream_connect_seconds"), &[]);
    assert!(histogram.starts_with("Histogram("), "{histogram}");
    assert!(
        histogram.contains("less_than: inf, count: 1.0"),
        "{histogram}"
    );
    assert_eq!(
        find(&format!("{p}upstream_connect_seconds_count"), &[]),
        "Untyped(1.0)"
    );
}

/// Every operation the router can do on its metrics, with its arguments.
#[derive(Clone, Debug)]
enum Op {
    Dns(usize),
    Connection(usize, usize),
    Refusal(usize),
    Closed(usize),
    Bytes(usize, u64),
    Connect(u64),
    Open(usize),
    Loaded(usize),
    Reload(bool, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..DnsResult::COUNT).prop_map(Op::Dns),
        (0..Listener::COUNT, 0..Decision::COUNT).prop_map(|(l, d)| Op::Connection(l, d)),
        (0..RefusalReason::COUNT).prop_map(Op::Refusal),
        (0..CloseReason::COUNT).prop_map(Op::Closed),
        (0..Direction::COUNT, any::<u64>()).prop_map(|(d, n)| Op::Bytes(d, n)),
        any::<u64>().prop_map(Op::Connect),
        (0..Listener::COUNT).prop_map(Op::Open),
        any::<usize>().prop_map(Op::Loaded),
        (any::<bool>(), any::<usize>()).prop_map(|(ok, n)| Op::Reload(ok, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever happens, the exposition has the same fixed set of series: no operation can add one.
    #[test]
    fn series_are_bounded_whatever_happens(ops in proptest::collection::vec(op(), 0..400)) {
        let m = Arc::new(Metrics::new());
        let series = |text: &str| -> BTreeSet<String> {
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| l.rsplit_once(' ').unwrap().0.to_owned())
                .collect()
        };
        let before = series(&m.render());
        prop_assert_eq!(before.len(), Metrics::series_count());
        let mut guards = Vec::new();
        for op in ops {
            match op {
                Op::Dns(i) => m.dns_query(DnsResult::ALL[i]),
                Op::Connection(l, d) => m.connection(Listener::ALL[l], Decision::ALL[d]),
                Op::Refusal(i) => m.refusal(RefusalReason::ALL[i]),
                Op::Closed(i) => m.closed(CloseReason::ALL[i]),
                Op::Bytes(d, n) => m.bytes(Direction::ALL[d], n),
                Op::Connect(n) => m.upstream_connect(Duration::from_nanos(n)),
                Op::Open(l) => guards.push(m.open(Listener::ALL[l])),
                Op::Loaded(n) => m.policy_loaded(n),
                Op::Reload(true, n) => m.reload_succeeded(n),
                Op::Reload(false, _) => m.reload_failed(),
            }
        }
        let text = m.render();
        prop_assert_eq!(series(&text), before);
        check_format_strictly(&text);
        prop_assert_eq!(parse_exposition(&text).len(), PARSED_SAMPLES);
    }
}
