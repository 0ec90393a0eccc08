//! Request heads through the proxy in pieces (issue 13: the head is read incrementally): heads sent one
//! byte per TCP segment, on the first request and on a kept-alive connection, are routed as in one
//! piece, and a head that goes wrong early is refused at once, without waiting for the rest.

mod proxy_support;

use std::time::{Duration, Instant};

use agent_sandbox_testkit::client::read_response;
use proxy_support::Scenario;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Writes `bytes` one per segment (no Nagle), with a pause (a timer tick) so that the router mostly reads
/// them apart.
async fn trickle(s: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        s.write_all(std::slice::from_ref(b)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_heads_one_byte_per_segment() {
    require_netns!();
    let w = Scenario::new("trickle")
        .host("ok")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let router = &w.router;

    let s = TcpStream::connect(router.http).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut s = BufReader::new(s);
    let padding = "p".repeat(300);
    for path in ["/first", "/second"] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: {ok}\r\nX-Padding: {padding}\r\n\r\n");
        trickle(s.get_mut(), head.as_bytes()).await;
        let r = tokio::time::timeout(Duration::from_secs(10), read_response(&mut s))
            .await
            .expect("a response in time");
        assert_eq!(r, Some((200, format!("host={ok} path={path} len=0 sum=0"))));
    }
    assert_eq!(
        w.http().get(),
        1,
        "both requests on one upstream connection"
    );

    // A malformed request line is refused as soon as the byte that is wrong arrives: the client,
    // which has not finished its head, gets a 400 long before the 10 s peek timeout would answer 408.
    let mut s = TcpStream::connect(router.http).await.unwrap();
    s.set_nodelay(true).unwrap();
    let start = Instant::now();
    trickle(&mut s, b"GET  /").await;
    let mut s = BufReader::new(s);
    let r = tokio::time::timeout(Duration::from_secs(5), read_response(&mut s))
        .await
        .expect("refused before the head is complete");
    assert_eq!(r.map(|r| r.0), Some(400));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(w.http().get(), 1, "nothing forwarded");
}
