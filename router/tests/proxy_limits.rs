//! Limits and lifecycle: stalled clients time out, hundreds of connections at once leak nothing, the
//! connection cap holds the rest in the backlog, running out of descriptors backs off and recovers, and
//! shutdown is prompt with relays in flight. The descriptor tests run alone ([`Scenario::alone`]).
//!
//! Upstream test hosts live in a network namespace reached over a veth pair, with a test DNS server on
//! loopback (`agent-sandbox-testkit`); each test states its set-up as a [`Scenario`]. Needs root.

mod proxy_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_router::proxy::tls::build;
use agent_sandbox_testkit::client::{
    http_once, ping, raw_exchange, read_response, read_to_end, tls_connect, ALERT_ACCESS_DENIED,
};
use proxy_support::{events, refusal_from, Scenario};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The process's descriptors and what each refers to (`socket:[inode]`, `pipe:[inode]`, a path, ...), so
/// that a leak check that fails can say what was left open, not only how many.
fn fd_targets() -> std::collections::BTreeMap<u32, String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let fd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((fd, target.display().to_string()))
        })
        .collect()
}

/// Descriptors in `now` that `before` did not have, as `fd -> target`, with each socket's TCP state and
/// addresses where /proc/net/tcp(6) knows its inode.
fn new_fds(
    before: &std::collections::BTreeMap<u32, String>,
    now: &std::collections::BTreeMap<u32, String>,
) -> String {
    let tcp: String = ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    now.iter()
        .filter(|(fd, target)| before.get(fd) != Some(target))
        .map(|(fd, target)| {
            let inode = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'));
            let socket = inode
                .and_then(|i| tcp.lines().find(|l| l.split_whitespace().nth(9) == Some(i)))
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    format!(" (tcp local {} remote {} state {})", f[1], f[2], f[3])
                })
                .unwrap_or_default();
            format!("{fd} -> {target}{socket}")
        })
        .collect::<Vec<_>>()
        .join("; ")
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
async fn stalled_clients_are_closed_after_the_peek_timeout() {
    require_netns!();
    let w = Scenario::new("stall")
        .host("s")
        .peek_timeout_secs(1)
        .echo_upstream(443)
        .http_upstream()
        .start()
        .await;
    let name = w.name("s");
    let hello = build::hello_record(&[name.as_bytes()], 0);
    let start = Instant::now();
    let (local, answer) = raw_exchange(w.router.https, &hello[..hello.len() - 1]).await;
    let took = start.elapsed();
    assert_eq!(answer, ALERT_ACCESS_DENIED);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(refusal_from(w.mark, local).await.1, "peek timeout");
    let start = Instant::now();
    let (local, answer) = raw_exchange(
        w.router.http,
        format!("GET / HTTP/1.1\r\nHost: {name}\r\n").as_bytes(),
    )
    .await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408 "));
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(refusal_from(w.mark, local).await.1, "peek timeout");
    assert_eq!(w.echo().get(), 0);

    // On a kept-alive connection, a later head that stalls half-way is cut off too.
    let s = TcpStream::connect(w.router.http).await.unwrap();
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
    assert_eq!(w.http().get(), 1);

    // An upstream that closes after its response: a client that then sits idle is closed, too.
    let s = TcpStream::connect(w.router.http).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_connections_and_no_leaks() {
    require_netns!();
    // Alone: it counts the process's descriptors.
    let w = Scenario::new("load")
        .host("ok")
        .forward("db", 5432)
        .tls_upstream()
        .echo_upstream(5432)
        .http_upstream()
        .alone()
        .start()
        .await;
    let ok = w.name("ok");
    let db = w.name("db");
    // Warm up (resolver sockets, caches), then take the baseline.
    let (_, mut t) = tls_connect(w.router.https, w.pki.client_config(), &ok)
        .await
        .unwrap();
    ping(&mut t, "warm").await;
    drop(t);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = open_fds();
    let baseline_fds = fd_targets();

    let fwd = w.router.forward(&db, 5432);
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
    // All 400 are open at once through the w.router.
    assert_eq!(open.len(), 400);
    let config = Arc::new(w.pki.client_config());
    let mut tls_set = tokio::task::JoinSet::new();
    for i in 0..100u32 {
        let config = Arc::clone(&config);
        let ok = ok.clone();
        let addr = w.router.https;
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
        let addr = w.router.http;
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
            "descriptors: {now} now, {baseline} before; new since the baseline: {}",
            new_fds(&baseline_fds, &fd_targets())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(w.echo().get(), 400);
    assert_eq!(w.tls().get(), 101);
    assert_eq!(w.http().get(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_returns_promptly_on_shutdown() {
    require_netns!();
    let mut w = Scenario::new("stop")
        .forward("db", 5432)
        .echo_upstream(5432)
        .start()
        .await;
    let db = w.name("db");
    // A long-lived relay in flight must not hold the shutdown back.
    let mut s = TcpStream::connect(w.router.forward(&db, 5432))
        .await
        .unwrap();
    s.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
    let start = Instant::now();
    w.router.stop.cancel();
    for t in w.router.tasks.drain(..) {
        tokio::time::timeout(Duration::from_secs(1), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert!(start.elapsed() < Duration::from_millis(500));
    // The relay was dropped: the client sees the close.
    assert!(read_to_end(&mut s).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_holds_extra_connections_in_the_backlog() {
    require_netns!();
    let w = Scenario::new("cap")
        .forward("db", 5432)
        .max_connections(2)
        .echo_upstream(5432)
        .start()
        .await;
    let db = w.name("db");
    let addr = w.router.forward(&db, 5432);
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
    assert_eq!(w.echo().get(), 2);
    drop(c1);
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), c3.read_exact(&mut b))
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert_eq!(&b, b"x");
    assert_eq!(w.echo().get(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_backs_off_then_recovers() {
    require_netns!();
    // Alone: the descriptor limit is process-wide.
    let w = Scenario::new("emfile")
        .forward("db", 5432)
        .echo_upstream(5432)
        .alone()
        .start()
        .await;
    let db = w.name("db");
    let addr = w.router.forward(&db, 5432);
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
    assert_eq!(w.echo().get(), 0);
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

/// A client sending its ClientHello or request head a byte every 200 ms is still cut off once the
/// peek timeout has passed: the timeout bounds the whole hello or head, not each read (reviewer R).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dribbling_clients_are_closed_after_the_peek_timeout() {
    require_netns!();
    let w = Scenario::new("drip")
        .host("d")
        .peek_timeout_secs(1)
        .echo_upstream(443)
        .http_upstream()
        .start()
        .await;
    let name = w.name("d");
    let hello = build::hello_record(&[name.as_bytes()], 0);
    let head = format!(
        "GET / HTTP/1.1\r\nHost: {name}\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(64)
    );
    for (addr, bytes) in [(w.router.https, hello), (w.router.http, head.into_bytes())] {
        let (mut r, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
        let start = Instant::now();
        let drip = tokio::spawn(async move {
            for b in bytes {
                if wr.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), r.read_to_end(&mut answer))
            .await
            .expect("a dribbling client is closed once the peek timeout has passed")
            .ok();
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        drip.abort();
    }
    assert_eq!(w.echo().get(), 0);
    assert_eq!(w.http().get(), 0);
}
