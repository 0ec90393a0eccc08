//! host:port entries: each listener relays to its one host and port, byte for byte, half-close
//! included, and logs the connection.
//!
//! Upstream test hosts live in a network namespace reached over a veth pair, with a test DNS server on
//! loopback (`agent-sandbox-testkit`); each test states its set-up as a [`Scenario`]. Needs root.

mod proxy_support;

use agent_sandbox_testkit::client::read_to_end;
use proxy_support::{connection_event, Scenario};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_port_entries() {
    require_netns!();
    let w = Scenario::new("fwd")
        .forward("db", 5432)
        .echo_upstream(5432)
        .start()
        .await;
    let db = w.name("db");
    let mut s = TcpStream::connect(w.router.forward(&db, 5432))
        .await
        .unwrap();
    let local = s.local_addr().unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    s.write_all(&data).await.unwrap();
    // Half-close: the echo comes back in full after our FIN.
    s.shutdown().await.unwrap();
    let back = read_to_end(&mut s).await;
    assert_eq!(back.len(), data.len());
    assert!(back == data);
    assert_eq!(w.echo().get(), 1);
    let e = connection_event(w.mark, local).await;
    assert_eq!(e["listener"], "forward");
    assert_eq!(e["bytes_up"].as_u64(), Some(1_000_000));
    assert_eq!(e["bytes_down"].as_u64(), Some(1_000_000));
    // The entry's host is also allowed on 443/80 by policy, but the forward goes to its port only.
    assert_eq!(e["upstream"], format!("{}:5432", w.ns.ns_ip));
}

/// A forward listener serves only its entry's exact host:port as the policy has it now: one asked to
/// relay to a port the policy does not list refuses, though the host is allowed on another port
/// (reviewer R: a check on the host alone would relay it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_to_a_port_not_in_the_policy_is_refused() {
    require_netns!();
    let w = Scenario::new("fwdport")
        .forward("db", 5432)
        .echo_upstream(5433)
        .world()
        .await;
    let db = w.name("db");
    let toml = format!(
        "resolvers = [\"{}\"]\npeek_timeout_secs = 2\nconnect_timeout_secs = 2\n\
         [listen]\n\
         [[forwards]]\nhost = \"{db}\"\nport = 5432\nlisten = \"127.0.0.1:0\"\n\
         [answers]\ndefault = \"127.0.0.2\"\n",
        w.dns.addr
    );
    let proxy = proxy_support::proxy_from_toml(&toml);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let host = agent_sandbox_shared::HostName::parse(&db).unwrap();
    let task = tokio::spawn(std::sync::Arc::clone(&proxy).serve_forward(
        listener,
        host,
        5433,
        stop.clone(),
    ));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let local = s.local_addr().unwrap();
    let _ = s.write_all(b"ping").await;
    let back = tokio::time::timeout(std::time::Duration::from_secs(5), read_to_end(&mut s))
        .await
        .expect("refused at once, not relayed");
    assert!(back.is_empty(), "{back:?}");
    let (_, reason) = proxy_support::refusal_from(w.mark, local).await;
    assert!(reason.contains("port 5433 is not allowed"), "{reason}");
    assert_eq!(w.echo().get(), 0);
    stop.cancel();
    let _ = task.await;
}
