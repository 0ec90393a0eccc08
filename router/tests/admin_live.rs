//! The admin endpoint of the real gateway binary (`--admin`), in a network namespace of the test's own:
//! probes, the metrics exposition with every family issue 13 names, 404/405, and that the client-facing
//! listeners never serve it.

mod gateway;
mod lab;

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr};

use gateway::{Gateway, TempDir};
use lab::{Dns, DnsBehaviour, Lab, Upstream};

/// Fields drop in order: the router goes before its namespace and files.
struct Fixture {
    gw: Gateway,
    lab: Lab,
    dns: Dns,
    _dir: TempDir,
}

fn fixture() -> Option<Fixture> {
    if !lab::require_netns() {
        return None;
    }
    let lab = Lab::new(1);
    let dns = Dns::start(&lab);
    let dir = TempDir::new("admin");
    let list = dir.0.join("allowed-hosts");
    std::fs::write(&list, "a.test\nloop.test\ndb.test:5432\n").unwrap();
    let gw = Gateway::start(
        &lab,
        &dns,
        &list,
        &["--forward", "db.test:5432=127.0.0.1:0"],
    );
    Some(Fixture {
        gw,
        lab,
        dns,
        _dir: dir,
    })
}

#[test]
fn probes_and_routes() {
    let Some(f) = fixture() else { return };
    let gw = &f.gw;
    assert_eq!(gw.admin("GET", "/livez").0, 200);
    // Ready once listening: Gateway::start returned after the "listening on" lines.
    assert_eq!(gw.admin("GET", "/readyz").0, 200);
    assert_eq!(gw.admin("GET", "/nope").0, 404);
    assert_eq!(gw.admin("GET", "/metrics/x").0, 404);
    for method in ["POST", "PUT", "DELETE"] {
        assert_eq!(gw.admin(method, "/metrics").0, 405, "{method}");
        assert_eq!(gw.admin(method, "/livez").0, 405, "{method}");
    }
}

/// Every family issue 13 names, parsed by a Prometheus text parser, with the start-up policy counted.
#[test]
fn metrics_carry_every_family() {
    let Some(f) = fixture() else { return };
    let gw = &f.gw;
    // Some traffic, so the counters are not all zero.
    assert_eq!(
        gw.query("a.test").0,
        hickory_proto::op::ResponseCode::NoError
    );
    assert_eq!(
        gw.query("other.test").0,
        hickory_proto::op::ResponseCode::NXDomain
    );
    let (status, body) = gw.admin("GET", "/metrics");
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
        .expect("the exposition parses");
    let names: BTreeSet<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    for family in [
        "agent_sandbox_router_dns_queries_total",
        "agent_sandbox_router_connections_total",
        "agent_sandbox_router_connections_open",
        "agent_sandbox_router_bytes_total",
        "agent_sandbox_router_upstream_connect_seconds",
        "agent_sandbox_router_config_reloads_total",
        "agent_sandbox_router_config_last_reload_success_timestamp_seconds",
        "agent_sandbox_router_allowlist_entries",
        "agent_sandbox_router_build_info",
    ] {
        assert!(names.contains(family), "{family} missing; got {names:#?}");
    }
    // The parser folds a histogram's series into one sample; its lines are there in the text.
    assert!(scrape.samples.iter().any(|s| s.metric
        == "agent_sandbox_router_upstream_connect_seconds"
        && matches!(s.value, prometheus_parse::Value::Histogram(_))));
    for suffix in ["_bucket{le=\"+Inf\"}", "_sum", "_count"] {
        assert!(
            body.contains(&format!(
                "agent_sandbox_router_upstream_connect_seconds{suffix} "
            )),
            "{suffix}"
        );
    }
    let value = |name: &str, labels: &[(&str, &str)]| gateway::sample(&body, name, labels);
    assert_eq!(
        value("agent_sandbox_router_allowlist_entries", &[]),
        Some(3.0)
    );
    assert_eq!(
        value(
            "agent_sandbox_router_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert!(
        value(
            "agent_sandbox_router_config_last_reload_success_timestamp_seconds",
            &[]
        )
        .is_some_and(|t| t > 1.6e9),
        "the start-up load counts as the last successful one"
    );
    for result in ["success", "failure"] {
        assert_eq!(
            value(
                "agent_sandbox_router_config_reloads_total",
                &[("result", result)]
            ),
            Some(0.0)
        );
    }
    for (label, set) in [
        ("listener", &["http", "https", "forward", "dns_tcp"][..]),
        ("decision", &["allowed", "refused", "failed"][..]),
    ] {
        for v in set {
            assert!(
                value("agent_sandbox_router_connections_total", &[(label, v)]).is_some(),
                "connections_total{{{label}=\"{v}\"}}"
            );
        }
    }
    for d in ["upstream", "downstream"] {
        assert!(value("agent_sandbox_router_bytes_total", &[("direction", d)]).is_some());
    }
    // No label carries a name a client chose.
    assert!(!body.contains("other.test"), "{body}");
    // /metrics content type is the 0.0.4 text format.
    let mut s = gw.connect(gw.admin).unwrap();
    std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let raw = String::from_utf8_lossy(&gateway::read_to_close(&mut s)).to_lowercase();
    assert!(
        raw.contains("content-type: text/plain; version=0.0.4"),
        "{raw:.300}"
    );
}

/// The admin address is not reachable through the client listeners: a Host naming it, or an
/// allowlisted name that resolves to the router's loopback, is refused, never answered with metrics.
#[test]
fn client_listeners_never_serve_the_admin_endpoint() {
    let Some(f) = fixture() else { return };
    let gw = &f.gw;
    f.dns.set("loop.test", DnsBehaviour::A(Ipv4Addr::LOCALHOST));
    for host in [
        gw.admin.to_string(),
        format!("127.0.0.1:{}", gw.admin.port()),
        format!("localhost:{}", gw.admin.port()),
        format!("loop.test:{}", gw.admin.port()),
        "loop.test".to_owned(),
    ] {
        let reply = gw.http_get(&host);
        let status = reply.split(' ').nth(1).unwrap_or_default().to_owned();
        assert!(
            status.starts_with('4') || status.starts_with('5'),
            "Host: {host} got {status}: {reply:.300}"
        );
        assert!(
            !reply.contains("agent_sandbox_router_") && !reply.contains("\r\n\r\nok"),
            "Host: {host} reached the admin endpoint: {reply:.300}"
        );
    }
    let _ = &f.lab;
}

/// A TLS ClientHello naming `sni`, as rustls sends it.
fn client_hello(sni: &str) -> Vec<u8> {
    let pki = agent_sandbox_testkit::pki::Pki::new(&["unused.test"]);
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(pki.client_config()), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    hello
}

/// One A query over DNS-over-TCP on `s`; the response code.
fn tcp_query(s: &mut std::net::TcpStream, name: &str) -> hickory_proto::op::ResponseCode {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut q = Message::new(7, MessageType::Query, OpCode::Query);
    q.add_query(Query::query(
        Name::from_ascii(format!("{name}.")).unwrap(),
        RecordType::A,
    ));
    let bytes = q.to_vec().unwrap();
    let mut framed = u16::try_from(bytes.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&bytes);
    s.write_all(&framed).unwrap();
    let len = gateway::read_n(s, 2);
    let reply = gateway::read_n(s, usize::from(u16::from_be_bytes([len[0], len[1]])));
    Message::from_vec(&reply).unwrap().metadata.response_code
}

/// After a known mix of DNS queries and HTTP, TLS and DNS-over-TCP connections (allowed, refused by
/// name and by address, a failed dial), every counter on the connection and DNS paths has exactly the
/// expected value, the open gauges are back at 0, the bytes cover what was sent, and the connect
/// histogram counted each successful dial once.
#[test]
fn connection_and_dns_counters_are_exact() {
    use hickory_proto::op::ResponseCode;
    if !lab::require_netns() {
        return;
    }
    let lab = Lab::new(2);
    let dns = Dns::start(&lab);
    let dir = TempDir::new("admin-counts");
    let list = dir.0.join("allowed-hosts");
    std::fs::write(&list, "a.test\ndown.test\nloop.test\n").unwrap();
    let (up, down_ip) = (lab.upstream_ips[0], lab.upstream_ips[1]);
    dns.set("a.test", DnsBehaviour::A(up));
    // Nothing listens there: the dial is refused by U's kernel at once.
    dns.set("down.test", DnsBehaviour::A(down_ip));
    dns.set("loop.test", DnsBehaviour::A(Ipv4Addr::LOCALHOST));
    const RESPONSE: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let _http = Upstream::start(&lab, SocketAddr::from((up, 80)), |mut s| {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let _ = s.write_all(RESPONSE);
    });
    // A TLS "server" that answers any hello with an alert record: not a retry, so the router relays.
    const ALERT: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];
    let _tls = Upstream::start(&lab, SocketAddr::from((up, 443)), |mut s| {
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let _ = s.write_all(ALERT);
    });
    let gw = Gateway::start(&lab, &dns, &list, &[]);
    let dns_tcp = gw
        .wait_for(gateway::PATIENCE, |lines| {
            lines
                .iter()
                .filter_map(|l| gateway::message(l))
                .find_map(|m| {
                    gateway::listening(&m).and_then(|(a, p)| (p == "dns/tcp").then_some(a))
                })
        })
        .expect("a dns/tcp listener");
    let metrics = || {
        let (status, body) = gw.admin("GET", "/metrics");
        assert_eq!(status, 200);
        body
    };
    let before = metrics();
    let bytes = |body: &str, d: &str| {
        gateway::sample(
            body,
            "agent_sandbox_router_bytes_total",
            &[("direction", d)],
        )
        .unwrap()
    };

    // DNS: two answered and two refused over UDP, one answered over TCP.
    assert_eq!(gw.query("a.test").0, ResponseCode::NoError);
    assert_eq!(gw.query("down.test").0, ResponseCode::NoError);
    assert_eq!(gw.query("other.test").0, ResponseCode::NXDomain);
    assert_eq!(gw.query("another.test").0, ResponseCode::NXDomain);
    let mut t = gw.connect(dns_tcp).unwrap();
    assert_eq!(tcp_query(&mut t, "a.test"), ResponseCode::NoError);
    drop(t);

    // HTTP: allowed, not allowed, refused address, failed dial.
    let mut sent_up = 0usize;
    let mut sent_down = 0usize;
    for (host, want) in [
        ("a.test", "200"),
        ("other.test", "403"),
        ("loop.test", ""),
        ("down.test", "502"),
    ] {
        let reply = gw.http_get(host);
        let status = reply.split(' ').nth(1).unwrap_or_default();
        if want.is_empty() {
            assert!(
                status.starts_with('4') || status.starts_with('5'),
                "{reply}"
            );
        } else {
            assert_eq!(status, want, "{host}: {reply}");
        }
        if host == "a.test" {
            sent_up += format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").len();
            sent_down += RESPONSE.len();
            assert!(reply.ends_with("hello"), "{reply}");
        }
    }

    // TLS: allowed (relayed to the upstream's alert), and not allowed.
    let hello = client_hello("a.test");
    let mut s = gw.connect(gw.https).unwrap();
    s.write_all(&hello).unwrap();
    assert_eq!(gateway::read_to_close(&mut s), ALERT);
    sent_up += hello.len();
    sent_down += ALERT.len();
    // The relay waits for the client's end too: close it, as a finished client would.
    drop(s);
    let mut s = gw.connect(gw.https).unwrap();
    s.write_all(&client_hello("other.test")).unwrap();
    let answer = gateway::read_to_close(&mut s);
    assert_eq!(answer.first(), Some(&0x15), "an alert: {answer:?}");
    drop(s);

    // Connections are counted when they end: wait until none is open and the totals are in.
    let connections = |body: &str, l: &str, d: &str| {
        gateway::sample(
            body,
            "agent_sandbox_router_connections_total",
            &[("listener", l), ("decision", d)],
        )
        .unwrap()
    };
    let open = |body: &str, l: &str| {
        gateway::sample(
            body,
            "agent_sandbox_router_connections_open",
            &[("listener", l)],
        )
        .unwrap()
    };
    let listeners = ["http", "https", "forward", "dns_tcp"];
    let deadline = std::time::Instant::now() + gateway::PATIENCE;
    let body = loop {
        let body = metrics();
        let total: f64 = listeners
            .iter()
            .flat_map(|l| ["allowed", "refused", "failed"].map(|d| connections(&body, l, d)))
            .sum();
        let opened: f64 = listeners.iter().map(|l| open(&body, l)).sum();
        if (total >= 7.0 && opened == 0.0) || std::time::Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    for l in listeners {
        assert_eq!(
            open(&body, l),
            0.0,
            "connections_open{{listener=\"{l}\"}}\n{body}"
        );
    }
    for (l, d, n) in [
        ("http", "allowed", 1.0),
        ("http", "refused", 2.0),
        ("http", "failed", 1.0),
        ("https", "allowed", 1.0),
        ("https", "refused", 1.0),
        ("https", "failed", 0.0),
        ("dns_tcp", "allowed", 1.0),
        ("dns_tcp", "refused", 0.0),
        ("dns_tcp", "failed", 0.0),
        ("forward", "allowed", 0.0),
        ("forward", "refused", 0.0),
        ("forward", "failed", 0.0),
    ] {
        assert_eq!(
            connections(&body, l, d),
            n,
            "connections_total{{{l},{d}}}\n{body}"
        );
    }
    for (r, n) in [("answered", 3.0), ("refused", 2.0), ("rejected", 0.0)] {
        assert_eq!(
            gateway::sample(
                &body,
                "agent_sandbox_router_dns_queries_total",
                &[("result", r)]
            ),
            Some(n),
            "dns_queries_total{{result=\"{r}\"}}"
        );
    }
    for (r, n) in [
        ("not_allowed", 2.0),
        ("refused_address", 1.0),
        ("per_client_limit", 0.0),
        ("wildcard_lookup_limit", 0.0),
        ("bad_hello", 0.0),
        ("bad_request", 0.0),
    ] {
        assert_eq!(
            gateway::sample(
                &body,
                "agent_sandbox_router_refusals_total",
                &[("reason", r)]
            ),
            Some(n),
            "refusals_total{{reason=\"{r}\"}}"
        );
    }
    let grew = |d: &str| bytes(&body, d) - bytes(&before, d);
    assert!(
        grew("upstream") >= sent_up as f64,
        "{} < {sent_up}",
        grew("upstream")
    );
    assert!(
        grew("downstream") >= sent_down as f64,
        "{} < {sent_down}",
        grew("downstream")
    );
    // The two successful dials (HTTP and TLS to a.test), and nothing for the failed or refused ones.
    let count = body
        .lines()
        .find_map(|l| l.strip_prefix("agent_sandbox_router_upstream_connect_seconds_count "))
        .expect("the histogram's _count");
    assert_eq!(count, "2", "{body}");
    // No label carries a name a client chose.
    assert!(
        !body.contains("other.test") && !body.contains("a.test"),
        "{body}"
    );
    drop(gw);
    drop(dir);
}

/// The bounds count by reason: a client over `--max-connections-per-client` is a refused connection and
/// a `per_client_limit` refusal; a client that sends nothing within the peek timeout is a failed
/// connection and a `client_timeout` close.
#[test]
fn bounds_are_counted_by_reason() {
    if !lab::require_netns() {
        return;
    }
    let lab = Lab::new(1);
    let dns = Dns::start(&lab);
    let dir = TempDir::new("admin-bounds");
    let list = dir.0.join("allowed-hosts");
    std::fs::write(&list, "a.test\n").unwrap();
    let gw = Gateway::start(
        &lab,
        &dns,
        &list,
        &["--max-connections-per-client", "1", "--peek-timeout", "1"],
    );
    // Holds the client's one slot, sending nothing.
    let mut held = gw.connect(gw.http).unwrap();
    let deadline = std::time::Instant::now() + gateway::PATIENCE;
    // The held connection is counted open once the router has accepted it.
    while gw.metric(
        "agent_sandbox_router_connections_open",
        &[("listener", "http")],
    ) != Some(1.0)
    {
        assert!(std::time::Instant::now() < deadline, "never open");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let reply = gw.http_get("a.test");
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    // The held one times out (408) and is closed by the router.
    let answer = String::from_utf8_lossy(&gateway::read_to_close(&mut held)).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    drop(held);
    let deadline = std::time::Instant::now() + gateway::PATIENCE;
    let body = loop {
        let (_, body) = gw.admin("GET", "/metrics");
        let failed = gateway::sample(
            &body,
            "agent_sandbox_router_connections_total",
            &[("listener", "http"), ("decision", "failed")],
        );
        // The connection is counted when its log ends, and leaves the open gauge just after.
        let open = gateway::sample(
            &body,
            "agent_sandbox_router_connections_open",
            &[("listener", "http")],
        );
        if (failed == Some(1.0) && open == Some(0.0)) || std::time::Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let value = |name: &str, labels: &[(&str, &str)]| gateway::sample(&body, name, labels);
    for (d, n) in [("allowed", 0.0), ("refused", 1.0), ("failed", 1.0)] {
        assert_eq!(
            value(
                "agent_sandbox_router_connections_total",
                &[("listener", "http"), ("decision", d)]
            ),
            Some(n),
            "{d}\n{body}"
        );
    }
    assert_eq!(
        value(
            "agent_sandbox_router_refusals_total",
            &[("reason", "per_client_limit")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            "agent_sandbox_router_connections_closed_total",
            &[("reason", "client_timeout")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            "agent_sandbox_router_connections_open",
            &[("listener", "http")]
        ),
        Some(0.0)
    );
    drop(gw);
    drop(dir);
}

/// The `process_*` families describe the router's own process: read back against `/proc/<pid>` of the
/// router from outside, and followed as it accepts connections (each accepted connection that waits for
/// the rest of its ClientHello holds exactly one descriptor).
#[test]
fn process_metrics_describe_the_router_process() {
    let Some(f) = fixture() else { return };
    let gw = &f.gw;
    let pid = gw.pid();
    let count_fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let stat = || {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = text[text.rfind(')').unwrap() + 1..]
            .split_ascii_whitespace()
            .collect();
        // utime + stime (fields 14 and 15 of proc(5), counted from the state, field 3), in clock
        // ticks of 10 ms.
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let scrape = || {
        let (status, body) = gw.admin("GET", "/metrics");
        assert_eq!(status, 200);
        body
    };
    let value = |body: &str, name: &str| {
        gateway::sample(body, name, &[]).unwrap_or_else(|| panic!("{name} missing:\n{body}"))
    };

    // While it renders, the router also holds the admin connection the scrape came on, and keeps it
    // until the client closes. The count from outside, taken with no admin connection open, plus that
    // one must equal the metric. The allowlist watch opens the file briefly every second, so a scrape
    // that overlaps it is retried.
    let mut tries = 0;
    let (body, open, cpu_before, cpu_after) = loop {
        let (fds_before, cpu_before) = (count_fds(), stat());
        let body = scrape();
        let cpu_after = stat();
        let open = value(&body, "process_open_fds");
        if open == (fds_before + 1) as f64 {
            break (body, open, cpu_before, cpu_after);
        }
        tries += 1;
        assert!(
            tries < 20,
            "process_open_fds {open}, /proc/{pid}/fd {fds_before} before the scrape"
        );
        // The scrape's connection closed before the next count.
        let deadline = std::time::Instant::now() + gateway::PATIENCE;
        while count_fds() > fds_before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let cpu = value(&body, "process_cpu_seconds_total");
    assert!(
        cpu >= cpu_before as f64 / 100.0 - 1e-9 && cpu <= cpu_after as f64 / 100.0 + 1e-9,
        "process_cpu_seconds_total {cpu}, /proc/{pid}/stat {cpu_before} then {cpu_after} ticks"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: f64 = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_ascii_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(value(&body, "process_max_fds"), soft);
    let rss_pages: f64 = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .unwrap()
        .split_ascii_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: sysconf reads a constant of the running system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    let rss = value(&body, "process_resident_memory_bytes");
    assert!(
        (rss - rss_pages * page).abs() <= 0.25 * rss,
        "process_resident_memory_bytes {rss}, statm {rss_pages} pages"
    );
    assert!(value(&body, "process_virtual_memory_bytes") >= rss);
    let started = value(&body, "process_start_time_seconds");
    let own = value(&body, "agent_sandbox_router_start_time_seconds");
    assert!(
        (own - started).abs() < 5.0,
        "process start {started}, the router's own {own}"
    );
    // HELP and TYPE once per family, counters named _total.
    check_families(&body);

    // 40 clients that send the first byte of a TLS record and wait: accepted (the deferred accept
    // hands a connection over once a byte is in) and held for the rest of the ClientHello.
    const CLIENTS: usize = 40;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut s = gw.connect(gw.https).unwrap();
            s.write_all(&[0x16]).unwrap();
            s
        })
        .collect();
    let deadline = std::time::Instant::now() + gateway::PATIENCE;
    let held = loop {
        let body = scrape();
        let waiting = gateway::sample(
            &body,
            "agent_sandbox_router_connections_open",
            &[("listener", "https")],
        );
        if waiting == Some(CLIENTS as f64) {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the router did not take {CLIENTS} connections: {waiting:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(
        value(&held, "process_open_fds") - open,
        CLIENTS as f64,
        "one descriptor per waiting client"
    );
    drop(clients);
}

/// Every family's HELP and TYPE lines come once, before its samples; counters end in `_total`; the
/// process families have client_golang's types, and the router's own the common prefix.
fn check_families(body: &str) {
    let mut seen = std::collections::BTreeMap::new();
    let mut lines = body.lines();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            let ty = lines.next().unwrap().strip_prefix("# TYPE ").unwrap();
            let (tname, kind) = ty.split_once(' ').unwrap();
            assert_eq!(tname, name);
            assert!(
                seen.insert(name.to_owned(), kind.to_owned()).is_none(),
                "{name} twice"
            );
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            }
            assert!(
                name.starts_with("agent_sandbox_router_") || name.starts_with("process_"),
                "{name}"
            );
        }
    }
    for (family, kind) in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert_eq!(seen.get(family).map(String::as_str), Some(kind), "{family}");
    }
}
