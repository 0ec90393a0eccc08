//! The admin endpoint of the real gateway binary (`--admin`), in a network namespace of the test's own:
//! probes, the metrics exposition with every family issue 13 names, 404/405, and that the client-facing
//! listeners never serve it.

mod gateway;
mod lab;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use gateway::{Gateway, TempDir};
use lab::{Dns, DnsBehaviour, Lab};

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
