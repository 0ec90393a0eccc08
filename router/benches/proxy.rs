//! Proxy benchmark (not a timed test): the pure parsers, then bulk throughput and connections/s through
//! the router versus connecting directly, against the same upstream in a network namespace reached over
//! a veth pair (the router never dials loopback). Needs root for the namespace; prints a Markdown table.
//! The upstream servers and the namespace come from `agent-sandbox-testkit`, shared with the proxy tests.
//!
//! `cargo bench -p agent-sandbox-router --bench proxy` (BENCH_SECS sets the seconds per row, default 3).
//! Client, router and upstream share this process and the machine's cores, in both columns alike.

#[path = "../tests/proxy_support/router.rs"]
mod test_router;

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use agent_sandbox_router::proxy::http::parse_request_head;
use agent_sandbox_router::proxy::tls::{build, HelloReader};
use agent_sandbox_testkit::dns::TestDns;
use agent_sandbox_testkit::netns::{self, Netns};
use agent_sandbox_testkit::upstream::{bench_http_upstream, traffic_upstream, BULK_HTTP};
use test_router::{Settings, TestRouter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn per_op(what: &str, iters: u32, f: impl Fn()) {
    for _ in 0..iters / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(iters);
    println!("| {what} | {ns:.0} ns |");
}

fn parsers() {
    println!("| parser | time per call |\n| --- | --- |");
    let hello = build::hello_record(&[b"api.anthropic.com"], 1_500);
    per_op("ClientHello 1.6 KB, one read", 20_000, || {
        let mut r = HelloReader::new();
        black_box(r.push(black_box(&hello)).unwrap());
    });
    let big = build::hello_record(&[b"api.anthropic.com"], 20_000);
    per_op("ClientHello 20 KB, 2 records, one read", 5_000, || {
        let mut r = HelloReader::new();
        black_box(r.push(black_box(&big)).unwrap());
    });
    per_op("ClientHello 1.6 KB, one byte per read", 500, || {
        let mut r = HelloReader::new();
        for b in &hello {
            black_box(r.push(std::slice::from_ref(b)).unwrap());
        }
    });
    let head = b"GET /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nUser-Agent: bench/1.0\r\nAccept: */*\r\nContent-Type: application/json\r\nContent-Length: 1234\r\nAuthorization: Bearer xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n\r\n";
    per_op("HTTP request head, 7 fields", 100_000, || {
        black_box(parse_request_head(black_box(head)).unwrap());
    });
}

/// One HTTP download of [`BULK_HTTP`] bytes, in Gbit/s.
async fn http_bulk(addr: SocketAddr, host: &str) -> f64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET /bulk HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let start = Instant::now();
    let mut total = 0u64;
    while total < BULK_HTTP {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        total += n as u64;
    }
    total as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

async fn bulk(addr: SocketAddr, upload: bool, secs: f64) -> f64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(if upload { b"u" } else { b"d" }).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let start = Instant::now();
    let mut total = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        if upload {
            s.write_all(&buf).await.unwrap();
            total += buf.len() as u64;
        } else {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            total += n as u64;
        }
    }
    total as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// Connections/s with `workers` concurrent clients: connect, send `e`, read one byte, close.
async fn connects(addr: SocketAddr, workers: usize, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let done = Arc::clone(&done);
        set.spawn(async move {
            while start.elapsed().as_secs_f64() < secs {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(b"e").await.unwrap();
                let mut b = [0u8; 1];
                s.read_exact(&mut b).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while set.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// New HTTP connections/s: connect, one GET, read the response, close.
async fn http_connects(addr: SocketAddr, host: &str, workers: usize, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
    for _ in 0..workers {
        let done = Arc::clone(&done);
        let req = req.clone();
        set.spawn(async move {
            let mut buf = vec![0u8; 256];
            while start.elapsed().as_secs_f64() < secs {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(req.as_bytes()).await.unwrap();
                let mut got = 0;
                while got < 40 {
                    let n = s.read(&mut buf[got..]).await.unwrap();
                    assert!(n > 0);
                    got += n;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while set.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Kept-alive HTTP requests/s over `workers` connections.
async fn http_requests(addr: SocketAddr, host: &str, workers: usize, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
    for _ in 0..workers {
        let done = Arc::clone(&done);
        let req = req.clone();
        set.spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            let mut buf = vec![0u8; 256];
            while start.elapsed().as_secs_f64() < secs {
                s.write_all(req.as_bytes()).await.unwrap();
                let mut got = 0;
                while got < 40 {
                    let n = s.read(&mut buf[got..]).await.unwrap();
                    assert!(n > 0);
                    got += n;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while set.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // `cargo bench` passes --bench; a plain `cargo test --benches` run passes nothing and should be quick.
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // The router logs as it would in production (one line per connection), into a sink.
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::sink)
        .with_env_filter("info")
        .init();
    parsers();
    if !netns::available() {
        println!("\n(network rows skipped: need root and iproute2)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let ns = Netns::create();
        let dns = TestDns::start(300).await;
        let host = "bench.test";
        dns.set(host, &[std::net::IpAddr::V4(ns.ns_ip)]);
        traffic_upstream(ns.bind(5432));
        bench_http_upstream(ns.bind(80));
        // The direct rows use another port: a client that closes first leaves TIME_WAIT entries, which
        // would otherwise use up the source ports the router needs towards port 80 in the next row.
        bench_http_upstream(ns.bind(8080));
        let router = TestRouter::start(
            Settings {
                hosts: vec![host.to_owned()],
                forwards: vec![(host.to_owned(), 5432)],
                ..Settings::default()
            },
            &dns,
        )
        .await;
        let direct = SocketAddr::new(ns.ns_ip.into(), 5432);
        let via = router.forward(host, 5432);
        let direct_http = SocketAddr::new(ns.ns_ip.into(), 8080);
        let rows: Vec<(&str, String, String)> = vec![
            (
                "bulk upload, 1 stream (Gbit/s)",
                format!("{:.2}", bulk(direct, true, secs).await),
                format!("{:.2}", bulk(via, true, secs).await),
            ),
            (
                "bulk download, 1 stream (Gbit/s)",
                format!("{:.2}", bulk(direct, false, secs).await),
                format!("{:.2}", bulk(via, false, secs).await),
            ),
            (
                "HTTP download, 2 GiB body (Gbit/s)",
                format!("{:.2}", http_bulk(direct_http, host).await),
                format!("{:.2}", http_bulk(router.http, host).await),
            ),
            (
                "new TCP connections/s (host:port entry, 16 clients)",
                format!("{:.0}", connects(direct, 16, secs).await),
                format!("{:.0}", connects(via, 16, secs).await),
            ),
            (
                "new HTTP connections/s (1 GET each, 16 clients)",
                format!("{:.0}", http_connects(direct_http, host, 16, secs).await),
                format!("{:.0}", http_connects(router.http, host, 16, secs).await),
            ),
            (
                "kept-alive HTTP requests/s (16 connections)",
                format!("{:.0}", http_requests(direct_http, host, 16, secs).await),
                format!("{:.0}", http_requests(router.http, host, 16, secs).await),
            ),
        ];
        println!("\n| row | direct | through the router |\n| --- | --- | --- |");
        for (what, d, r) in rows {
            println!("| {what} | {d} | {r} |");
        }
        drop(router);
    });
}
