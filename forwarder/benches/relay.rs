//! Forwarder against socat, the relay it replaces, in the same run on loopback: new connections per
//! second, bulk throughput, and (forwarder only) memory per open connection.
//!
//! `make bench-forwarder` (= `cargo bench -p agent-sandbox-forwarder --bench relay`). Each measurement
//! lasts FORWARDER_BENCH_SECONDS (default 3), about 25 s in all. Every socket is on 127.0.0.1. socat runs
//! as `socat TCP-LISTEN:PORT,fork,reuseaddr TCP:127.0.0.1:TARGET`, as the old forwarder container did; it
//! is skipped with a note if it is not installed. The "direct" row is the same load without a relay.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The forwarder under test: FORWARDER_BIN (`make bench-forwarder` passes the static release-small
/// binary that goes into the image), else the one cargo built for this bench.
fn forwarder() -> String {
    std::env::var("FORWARDER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_agent-sandbox-forwarder").into())
}
/// Clients opening connections at the same time in the connection-rate test.
const CONCURRENCY: usize = 32;
/// Write size in the throughput test.
const CHUNK: usize = 256 * 1024;
/// Idle connections held open to measure the forwarder's memory per connection.
const IDLE_CONNECTIONS: usize = 1000;

fn main() {
    let seconds = std::env::var("FORWARDER_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let duration = Duration::from_secs_f64(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench(duration));
}

/// One way of getting from the client to the servers.
enum Subject {
    Direct,
    Forwarder,
    Socat,
}

impl Subject {
    fn name(&self) -> &'static str {
        match self {
            Subject::Direct => "direct (no relay)",
            Subject::Forwarder => "agent-sandbox-forwarder",
            Subject::Socat => "socat fork",
        }
    }
}

async fn bench(duration: Duration) {
    let echo = echo_server().await;
    let sink = sink_server().await;
    let socat = Command::new("socat").arg("-V").output().is_ok();
    println!("forwarder: {}", forwarder());
    println!(
        "relay benchmark, {:.1} s per measurement, {CONCURRENCY} concurrent clients for connections/s",
        duration.as_secs_f64()
    );
    println!(
        "{:<26} {:>14} {:>16} {:>14}",
        "", "connections/s", "throughput MB/s", "relay CPU s"
    );
    let mut subjects = vec![Subject::Direct, Subject::Forwarder];
    if socat {
        subjects.push(Subject::Socat);
    } else {
        println!("(socat is not installed: its row is skipped)");
    }
    for subject in subjects {
        let relay = Relays::start(&subject, echo, sink).await;
        let rate = connection_rate(relay.echo, duration).await;
        let throughput = throughput(relay.sink, duration).await;
        let cpu = relay.cpu_seconds();
        println!(
            "{:<26} {:>14.0} {:>16.0} {:>14}",
            subject.name(),
            rate,
            throughput / 1e6,
            cpu.map_or("-".into(), |c| format!("{c:.2}")),
        );
    }
    memory_per_connection(echo).await;
}

/// The relay processes for one subject: one to the echo server, one to the sink.
struct Relays {
    echo: SocketAddr,
    sink: SocketAddr,
    children: Vec<Child>,
}

impl Relays {
    async fn start(subject: &Subject, echo: SocketAddr, sink: SocketAddr) -> Relays {
        match subject {
            Subject::Direct => Relays {
                echo,
                sink,
                children: Vec::new(),
            },
            Subject::Forwarder => {
                let (a, b) = (free_port(), free_port());
                let mut child = Command::new(forwarder())
                    .args([format!("{a}={echo}"), format!("{b}={sink}")])
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("starting the forwarder");
                // Ready once both listeners are announced; the rest of its log is drained and dropped.
                let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
                let mut listening = 0;
                while listening < 2 {
                    let line = lines.next().expect("forwarder exited").unwrap();
                    listening += usize::from(line.contains("listening on"));
                }
                std::thread::spawn(move || lines.for_each(drop));
                Relays {
                    echo: a,
                    sink: b,
                    children: vec![child],
                }
            }
            Subject::Socat => {
                let mut children = Vec::new();
                let mut listen = Vec::new();
                for target in [echo, sink] {
                    let port = free_port();
                    children.push(
                        Command::new("socat")
                            .arg(format!(
                                "TCP-LISTEN:{},bind=127.0.0.1,fork,reuseaddr",
                                port.port()
                            ))
                            .arg(format!("TCP:{target}"))
                            .spawn()
                            .expect("starting socat"),
                    );
                    wait_connectable(port).await;
                    listen.push(port);
                }
                Relays {
                    echo: listen[0],
                    sink: listen[1],
                    children,
                }
            }
        }
    }

    /// CPU time of the relay processes themselves (socat's forked children are not counted: they
    /// have exited and been reaped by socat, whose own cutime holds them).
    fn cpu_seconds(&self) -> Option<f64> {
        if self.children.is_empty() {
            return None;
        }
        let ticks: u64 = self.children.iter().map(|c| cpu_ticks(c.id(), true)).sum();
        Some(ticks as f64 / 100.0)
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// utime + stime (+ cutime + cstime, for socat's children) from /proc/PID/stat, in clock ticks.
fn cpu_ticks(pid: u32, children: bool) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    let fields: Vec<u64> = stat[close + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // Fields 14..=17 of stat(5), counted from the state (field 3) at index 0.
    let own = fields[11] + fields[12];
    if children {
        own + fields[13] + fields[14]
    } else {
        own
    }
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// Polls until something accepts connections on `addr` (socat announces nothing).
async fn wait_connectable(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Echoes each connection until the client's FIN, then closes.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Reads and discards everything.
async fn sink_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; CHUNK];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// Complete exchanges per second: connect, send a byte, read it back, close, read the close.
async fn connection_rate(addr: SocketAddr, duration: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (done, stop) = (Arc::clone(&done), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if exchange(addr).await.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for c in clients {
        let _ = c.await;
    }
    done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

async fn exchange(addr: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(b"x").await?;
    let mut byte = [0; 1];
    s.read_exact(&mut byte).await?;
    s.shutdown().await?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await?;
    Ok(())
}

/// Bytes per second through one connection into the sink.
async fn throughput(addr: SocketAddr, duration: Duration) -> f64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let chunk = vec![0x5a; CHUNK];
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < duration {
        s.write_all(&chunk).await.unwrap();
        sent += CHUNK as u64;
    }
    // What is still in buffers at the end is small against seconds of traffic.
    sent as f64 / started.elapsed().as_secs_f64()
}

/// The forwarder's resident memory with many idle relayed connections open, per connection.
async fn memory_per_connection(echo: SocketAddr) {
    let listen = free_port();
    let mut child = Command::new(forwarder())
        .arg(format!("{listen}={echo}"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the forwarder");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    while !lines
        .next()
        .expect("forwarder exited")
        .unwrap()
        .contains("listening on")
    {}
    std::thread::spawn(move || lines.for_each(drop));
    let idle = rss_kib(child.id());
    let mut open = Vec::with_capacity(IDLE_CONNECTIONS);
    for _ in 0..IDLE_CONNECTIONS {
        // One round trip each, so that every connection is relayed (buffers allocated) before measuring.
        let mut s = TcpStream::connect(listen).await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut byte = [0; 1];
        s.read_exact(&mut byte).await.unwrap();
        open.push(s);
    }
    let loaded = rss_kib(child.id());
    println!(
        "forwarder RSS: {idle} KiB idle, {loaded} KiB with {IDLE_CONNECTIONS} open connections \
         ({:.1} KiB per connection)",
        (loaded.saturating_sub(idle)) as f64 / IDLE_CONNECTIONS as f64
    );
    drop(open);
    let _ = child.kill();
    let _ = child.wait();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
