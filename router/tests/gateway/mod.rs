//! The real router binary in standalone gateway mode (`--allowlist`, `--answer`, `--admin`, ...) inside
//! the closed test network of `lab`, for the lifecycle tests: reload, the allowlist watch, the admin
//! endpoint and the drain.
//!
//! Every listener is on R's loopback (port 0, read back from the "listening on" lines), the resolver is
//! the lab's DNS server, and the upstreams live in U: nothing the router does can leave the two
//! namespaces. The child is killed on drop and its log printed when the test failed.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead as _, BufReader, ErrorKind, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

use crate::lab::{Dns, Lab};

/// The address DNS answers with for every allowlisted name.
pub const ANSWER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// How long a test waits for something the router should do promptly before failing.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A scratch directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory unique to this process and call.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "asgw-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `content` to `path` the atomic way: a temporary file renamed over it.
pub fn replace_file(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp-new");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The router, started and ready.
pub struct Gateway {
    /// The child (`ip netns exec` execs the router, so this is the router's pid).
    child: Option<Child>,
    /// Every line it logged, and a signal for each new one.
    output: Arc<(Mutex<Vec<String>>, Condvar)>,
    /// DNS (UDP and TCP), in R.
    pub dns: SocketAddr,
    /// Plain HTTP, in R.
    pub http: SocketAddr,
    /// TLS, in R.
    pub https: SocketAddr,
    /// The admin endpoint, in R.
    pub admin: SocketAddr,
    /// The R namespace's path, for client sockets.
    netns: String,
}

impl Gateway {
    /// Starts the router in `lab`'s R with `allowlist`, resolving through `dns`, admin on, and `extra`
    /// flags (a `--dns` among them replaces the default, 127.0.0.1:0); waits for its DNS, HTTP, TLS and
    /// admin "listening on" lines.
    pub fn start(lab: &Lab, dns: &Dns, allowlist: &Path, extra: &[&str]) -> Gateway {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &lab.r.name])
            .arg(env!("CARGO_BIN_EXE_agent-sandbox-router"))
            .arg("--allowlist")
            .arg(allowlist)
            .args(["--answer", &ANSWER.to_string()])
            .args(if extra.contains(&"--dns") {
                &[][..]
            } else {
                &["--dns", "127.0.0.1:0"][..]
            })
            .args(["--http", "127.0.0.1:0"])
            .args(["--https", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(["--resolver", &dns.addr.to_string()])
            .args(["--log-format", "json"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn router");
        let stderr = child.stderr.take().unwrap();
        let output: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
        let out = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                out.0.lock().unwrap().push(line);
                out.1.notify_all();
            }
        });
        let mut gw = Gateway {
            child: Some(child),
            output,
            dns: unspecified(),
            http: unspecified(),
            https: unspecified(),
            admin: unspecified(),
            netns: lab.r.path(),
        };
        let found = gw.wait_for(PATIENCE, |lines| {
            let mut got = [None; 4];
            for m in lines.iter().filter_map(|l| message(l)) {
                if let Some(a) = m.strip_prefix("admin endpoint listening on ") {
                    got[3] = a.parse::<SocketAddr>().ok();
                }
                let Some((addr, proto)) = listening(&m) else {
                    continue;
                };
                match proto.as_str() {
                    "dns/udp" => got[0] = Some(addr),
                    "http" => got[1] = Some(addr),
                    "https" => got[2] = Some(addr),
                    _ => {}
                }
            }
            got.iter().all(Option::is_some).then_some(got)
        });
        let got = found.unwrap_or_else(|| panic!("router not ready; log:\n{}", gw.log()));
        gw.dns = got[0].unwrap();
        gw.http = got[1].unwrap();
        gw.https = got[2].unwrap();
        gw.admin = got[3].unwrap();
        gw
    }

    /// The router's pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.as_ref().unwrap().id()).unwrap()
    }

    /// Sends `signal` to the router.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory preconditions; the pid is our own live child.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    /// Waits up to `within` for the router to exit; its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        self.output.0.lock().unwrap().join("\n")
    }

    /// The messages logged so far.
    pub fn messages(&self) -> Vec<String> {
        self.output
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| message(l))
            .collect()
    }

    /// The JSON events logged so far whose message starts with `prefix`.
    pub fn events(&self, prefix: &str) -> Vec<serde_json::Value> {
        self.output
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(prefix))
            })
            .collect()
    }

    /// Waits (on each new log line, never by sleeping) until `f` over the log returns something.
    pub fn wait_for<T>(&self, within: Duration, f: impl Fn(&[String]) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + within;
        let (lock, cv) = &*self.output;
        let mut lines = lock.lock().unwrap();
        loop {
            if let Some(t) = f(&lines) {
                return Some(t);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            lines = cv.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Waits until `n` events whose message starts with `prefix` have been logged; returns them.
    pub fn wait_events(&self, prefix: &str, n: usize) -> Vec<serde_json::Value> {
        let found = self.wait_for(PATIENCE, |lines| {
            let count = lines
                .iter()
                .filter_map(|l| message(l))
                .filter(|m| m.starts_with(prefix))
                .count();
            (count >= n).then_some(())
        });
        assert!(
            found.is_some(),
            "no {n} `{prefix}` events within {PATIENCE:?}; log:\n{}",
            self.log()
        );
        self.events(prefix)
    }

    /// Runs `f` on a thread in R (client sockets must be made there).
    pub fn in_r<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_ns(&self.netns, f)
    }

    /// A DNS A query for `name` over UDP from R; the response code and the answer count.
    pub fn query(&self, name: &str) -> (ResponseCode, usize) {
        let server = self.dns;
        let name = name.to_owned();
        self.in_r(move || udp_query(server, &name))
    }

    /// A TCP connection from R to `addr`.
    pub fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.in_r(move || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(20)))?;
            s.set_write_timeout(Some(Duration::from_secs(20)))?;
            Ok(s)
        })
    }

    /// `GET /` with `Host: host` on the HTTP listener; the whole reply (the request asks for a close).
    pub fn http_get(&self, host: &str) -> String {
        let mut s = self
            .connect(self.http)
            .expect("connect to the HTTP listener");
        s.write_all(
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        String::from_utf8_lossy(&read_to_close(&mut s)).into_owned()
    }

    /// `METHOD path` on the admin endpoint: the status and the body.
    pub fn admin(&self, method: &str, path: &str) -> (u16, String) {
        let mut s = self
            .connect(self.admin)
            .expect("connect to the admin endpoint");
        s.write_all(
            format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let reply = String::from_utf8_lossy(&read_to_close(&mut s)).into_owned();
        let status = reply
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {reply:?}"));
        let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, body.to_owned())
    }

    /// One sample of `/metrics` (`name` and its labels as `k="v"` pairs in any order).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let (status, body) = self.admin("GET", "/metrics");
        assert_eq!(status, 200);
        sample(&body, name, labels)
    }

    /// Polls DNS until `name` is answered (or `PATIENCE` passes); how long it took.
    pub fn wait_answered(&self, name: &str) -> Duration {
        let started = Instant::now();
        loop {
            if self.query(name) == (ResponseCode::NoError, 1) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{name} not answered within {PATIENCE:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the `n`th "reload ..." summary line (success or failure) and returns it.
    pub fn wait_reload(&self, n: usize) -> serde_json::Value {
        self.wait_reload_where(n - 1, |_| true)
    }

    /// Waits for a reload summary line, at index `from` or later, for which `pred` holds. (SIGHUP and
    /// the watch both reload after a change, so the tests that send SIGHUP look for the line they
    /// expect rather than count.)
    pub fn wait_reload_where(
        &self,
        from: usize,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let found = self.wait_for(PATIENCE, |lines| {
            lines
                .iter()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| {
                    v["fields"]["message"].as_str().is_some_and(|m| {
                        m.starts_with("reload succeeded") || m.starts_with("reload failed")
                    })
                })
                .skip(from)
                .find(|v| pred(v))
        });
        found.unwrap_or_else(|| {
            panic!(
                "no matching reload after #{from} within {PATIENCE:?}; log:\n{}",
                self.log()
            )
        })
    }

    /// How many reload summary lines have been logged.
    pub fn reloads(&self) -> usize {
        self.messages()
            .iter()
            .filter(|m| m.starts_with("reload succeeded") || m.starts_with("reload failed"))
            .count()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- router output ---\n{}", self.log());
        }
    }
}

fn unspecified() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}

/// The message of a JSON log line.
pub fn message(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v["fields"]["message"].as_str().map(str::to_owned)
}

/// `listening on ADDR (PROTO)` → (ADDR, PROTO).
pub fn listening(message: &str) -> Option<(SocketAddr, String)> {
    let rest = message.strip_prefix("listening on ")?;
    let (addr, proto) = rest.split_once(' ')?;
    let proto = proto.strip_prefix('(')?.strip_suffix(')')?;
    Some((addr.parse().ok()?, proto.to_owned()))
}

/// Runs `f` on a fresh thread inside the namespace at `path`.
fn in_ns<T: Send + 'static>(path: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::fd::AsRawFd as _;
    let path = path.to_owned();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on this helper thread only; the fd is valid for the call.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// One A query over UDP; retried once on a lost datagram.
fn udp_query(server: SocketAddr, name: &str) -> (ResponseCode, usize) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut q = Message::new(0x5a5a, MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(
        Name::from_ascii(format!("{name}.")).unwrap(),
        RecordType::A,
    ));
    let bytes = q.to_vec().unwrap();
    let mut buf = [0u8; 4096];
    for _ in 0..2 {
        sock.send_to(&bytes, server).unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let r = Message::from_vec(&buf[..n]).unwrap();
            return (r.metadata.response_code, r.answers.len());
        }
    }
    panic!("no DNS answer for {name} from {server}");
}

/// Reads until EOF or a reset.
pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e} after {} bytes", out.len()),
        }
    }
}

/// Reads exactly `n` bytes.
pub fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    s.read_exact(&mut out).unwrap();
    out
}

/// The value of one sample in a Prometheus text exposition.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let scrape = prometheus_parse::Scrape::parse(lines.into_iter().map(Ok)).ok()?;
    scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(k).is_some_and(|got| got == *v))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

/// An upstream in U that answers one HTTP request with a response whose body comes in two halves,
/// the second only once `release` is called: a relay the test can hold open as long as it likes.
pub struct SlowBody {
    /// Opened when the second half may go.
    gate: Arc<(Mutex<bool>, Condvar)>,
}

/// Each half of [`SlowBody`]'s body.
pub const HALF: usize = 1000;

impl SlowBody {
    /// A fresh gate, closed.
    pub fn new() -> SlowBody {
        SlowBody {
            gate: Arc::default(),
        }
    }

    /// The connection handler for `lab::Upstream::start`.
    pub fn handler(&self) -> impl Fn(TcpStream) + Send + Sync + 'static {
        let gate = Arc::clone(&self.gate);
        move |mut s: TcpStream| {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                2 * HALF
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&[b'a'; HALF]);
            let (lock, cv) = &*gate;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            let _ = s.write_all(&[b'b'; HALF]);
        }
    }

    /// Lets the second half go.
    pub fn release(&self) {
        *self.gate.0.lock().unwrap() = true;
        self.gate.1.notify_all();
    }
}

impl Drop for SlowBody {
    fn drop(&mut self) {
        // Never leave an upstream thread waiting forever.
        self.release();
    }
}

/// Reads a [`SlowBody`] response head and first half through `s`; panics on anything else.
pub fn read_first_half(s: &mut TcpStream) {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        got.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&got);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head:?}");
    assert_eq!(read_n(s, HALF), vec![b'a'; HALF]);
}

/// Reads the second half of a [`SlowBody`] response, then the close.
pub fn read_second_half(s: &mut TcpStream) {
    assert_eq!(read_n(s, HALF), vec![b'b'; HALF]);
    assert!(read_to_close(s).is_empty());
}
