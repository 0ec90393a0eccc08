//! The real router binary, configured by file, logging JSON: the wiring, the log contract the launcher
//! parses (event names and fields), and SIGTERM with a relay in flight.
//!
//! Upstream test hosts live in a network namespace reached over a veth pair, with a test DNS server on
//! loopback (`agent-sandbox-testkit`); each test states its set-up as a [`Scenario`]. Needs root.

mod proxy_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_router::proxy::tls::build;
use agent_sandbox_testkit::client::{ping, raw_exchange, tls_connect, ALERT_ACCESS_DENIED};
use proxy_support::{uniq, Scenario};

/// The real binary, configured by file, with `--log-format json`: the wiring, the logging contract the
/// launcher parses, and SIGTERM with a relay in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_binary_json_log_contract() {
    require_netns!();
    let w = Scenario::new("bin")
        .resolves("ok")
        .tls_upstream()
        .world()
        .await;
    let ok = w.name("ok");
    let evil = w.name("evil");
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

    let (_, mut tls) = tls_connect(https, w.pki.client_config(), &ok)
        .await
        .unwrap();
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
        "reason",
        "upstream",
        "bytes_up",
        "bytes_down",
        "duration_ms",
    ] {
        assert!(conn.get(field).is_some(), "{field} missing in {conn}");
    }
    assert_eq!(conn["decision"], "refused");
    // The connection line says why on its own (issue 4: "decision and reason"), so a refusal folded
    // into a later `refused` summary still has its reason at once.
    assert_eq!(conn["reason"], "not on the allowlist");

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
    assert_eq!(w.tls().get(), 1);
    drop(tls);
    let _ = std::fs::remove_dir_all(&dir);
}
