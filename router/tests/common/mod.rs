//! Test harness shared by the router's integration tests: runs the real binary and speaks real DNS.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox_shared::logs::LISTENING_ON;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinEncodable};

/// A running `agent-sandbox-router`; killed on drop, its output printed if the test failed.
pub struct Router {
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
    /// `(address, proto)` from the "listening on ADDR (proto)" lines.
    pub listening: Vec<(SocketAddr, String)>,
    dir: TempDir,
    /// Directories of the test's that the router reads from, removed after it is stopped.
    held: Vec<TempDir>,
}

/// A fresh temporary directory for a test's files, removed with them when dropped (when the test
/// fails too). Declare it before the router that reads from it, so the router is stopped first.
pub fn temp_dir(tag: &str) -> TempDir {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("asr-{tag}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A directory made by [`temp_dir`], removed on drop.
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The flags of a standalone router on loopback: `list` allowed, answers 127.0.0.2, a resolver address
/// where nothing listens, DNS (UDP and TCP), HTTP and TLS on port 0: four listeners.
pub fn loopback_args(list: &Path) -> Vec<String> {
    [
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "127.0.0.2",
        "--resolver",
        "127.0.0.1:9",
        "--dns",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--https",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

impl Router {
    /// Starts the router with `args` and waits (by reading its log, not by sleeping) until it has
    /// reported `expect_listeners` listeners.
    pub fn start(args: &[&str], expect_listeners: usize) -> Router {
        let dir = temp_dir("router");
        let mut child = Command::new(env!("CARGO_BIN_EXE_agent-sandbox-router"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn router");
        let stderr = child.stderr.take().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let out = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split(LISTENING_ON).nth(1) {
                    let (addr, proto) = rest.split_once(' ').unwrap();
                    let proto = proto.trim_matches(|c| c == '(' || c == ')').to_owned();
                    let _ = tx.send((addr.parse::<SocketAddr>().unwrap(), proto));
                }
                out.lock().unwrap().push(line);
            }
        });
        let mut listening = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while listening.len() < expect_listeners {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => listening.push(l),
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "router did not report {expect_listeners} listeners; output:\n{}",
                        output.lock().unwrap().join("\n")
                    );
                }
            }
        }
        Router {
            child,
            output,
            listening,
            dir,
            held: Vec::new(),
        }
    }

    /// Starts the router with [`loopback_args`] for `list` and `extra` flags, once its four listeners
    /// are up.
    pub fn start_loopback(list: &Path, extra: &[&str]) -> Router {
        let mut args = loopback_args(list);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Router::start(&args, 4)
    }

    /// Keeps `dir` (the test's files the router was started with) until the router is stopped.
    #[must_use]
    pub fn holding(mut self, dir: TempDir) -> Router {
        self.held.push(dir);
        self
    }

    /// The address of the first listener whose proto is `proto`.
    pub fn addr(&self, proto: &str) -> SocketAddr {
        self.listening
            .iter()
            .find(|(_, p)| p == proto)
            .unwrap_or_else(|| panic!("no {proto} listener in {:?}", self.listening))
            .0
    }

    /// Everything the router logged so far.
    pub fn log(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// Polls the log until `pred` holds (or panics after 10 s).
    pub fn wait_for_log(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pred(&self.log()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGTERM and returns how long the process took to exit and its status.
    pub fn terminate(&mut self) -> (Duration, std::process::ExitStatus) {
        let start = Instant::now();
        // SAFETY: kill(2) on our own child's pid has no memory-safety implications.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = start + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (start.elapsed(), status);
            }
            assert!(Instant::now() < deadline, "router ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The directory the router's test files live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- router output ---\n{}", self.log());
        }
    }
}

/// A decoded DNS response.
#[derive(Debug)]
pub struct Answer {
    pub code: ResponseCode,
    pub authoritative: bool,
    pub addresses: Vec<std::net::Ipv4Addr>,
    pub records: usize,
    pub question: String,
    pub id: u16,
    pub ttls: Vec<u32>,
}

/// Encodes a standard query.
pub fn query_bytes(name: &str, rtype: RecordType, id: u16) -> Vec<u8> {
    let mut msg = Message::query();
    msg.metadata.id = id;
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    msg.to_bytes().unwrap()
}

/// Decodes a response.
pub fn decode(bytes: &[u8]) -> Answer {
    let msg = Message::from_bytes(bytes).expect("response decodes");
    Answer {
        code: msg.metadata.response_code,
        authoritative: msg.metadata.authoritative,
        addresses: msg
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect(),
        records: msg.answers.len(),
        question: msg
            .queries
            .first()
            .map(|q| q.name().to_ascii())
            .unwrap_or_default(),
        id: msg.metadata.id,
        ttls: msg.answers.iter().map(|r| r.ttl).collect(),
    }
}

/// One query over UDP.
pub fn udp_query(server: SocketAddr, name: &str, rtype: RecordType) -> Answer {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    sock.send_to(&query_bytes(name, rtype, 0x4242), server)
        .unwrap();
    let mut buf = [0u8; 4096];
    let (n, _) = sock.recv_from(&mut buf).expect("a UDP answer");
    decode(&buf[..n])
}

/// One query over TCP (two-byte length prefix).
pub fn tcp_query(server: SocketAddr, name: &str, rtype: RecordType) -> Answer {
    let mut s = TcpStream::connect(server).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let q = query_bytes(name, rtype, 0x4343);
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    decode(&body)
}
