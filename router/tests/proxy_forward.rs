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
