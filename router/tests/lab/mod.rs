//! A closed test network for the fault and differential tests: the real router binary runs inside a
//! network namespace of the test's own ("R": loopback plus one veth, no default route), its upstreams
//! listen in a second namespace ("U") on the other end of the veth, and its resolver is a DNS server of
//! the test's own on R's loopback. Nothing here can reach an address outside the two namespaces: a
//! router bug that dials elsewhere finds no route instead of sending a packet off the machine.
//!
//! Sockets keep the namespace they were created in, so a short-lived thread enters the namespace,
//! creates the socket and hands it back; everything else runs on the test's own threads.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{rdata, Name, RData, Record, RecordType};

/// The veth's address on the router's side; upstream addresses are the same /24 from .2 up.
pub const ROUTER_SIDE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);

/// Whether the calling test can run: namespaces need root and iproute2. Without them the test is
/// skipped with a loud `SKIPPED` line, and fails instead when `CI` is set (the README's rule for
/// every test that needs root, through [`agent_sandbox_testkit::netns::require`]).
pub fn require_netns() -> bool {
    agent_sandbox_testkit::netns::require()
}

/// Runs a command, panicking with its stderr on failure.
pub fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a fresh thread inside the namespace at `path`.
fn in_ns<T: Send + 'static>(path: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
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

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    /// Its name under /run/netns.
    pub name: String,
}

impl Netns {
    fn create(tag: char) -> Netns {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        static SWEEP: std::sync::Once = std::sync::Once::new();
        // A test binary killed by a timeout runs no destructors: remove namespaces of ours whose process
        // is gone (named asl<pid>x<n><tag>).
        SWEEP.call_once(|| agent_sandbox_testkit::netns::sweep_stale("asl"));
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("asl{}x{n}{tag}", std::process::id());
        let ns = Netns { name };
        run("ip", &["netns", "add", &ns.name]);
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// Its path, for setns.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Runs `f` on a thread inside this namespace.
    pub fn enter<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_ns(&self.path(), f)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// The two namespaces and the veth between them.
#[derive(Debug)]
pub struct Lab {
    /// Where the router, its clients and its resolver live.
    pub r: Netns,
    /// Where the upstreams live.
    pub u: Netns,
    /// The upstream addresses on U's end of the veth.
    pub upstream_ips: Vec<Ipv4Addr>,
}

impl Lab {
    /// Two namespaces joined by a veth, with `upstreams` addresses on U's side.
    pub fn new(upstreams: u8) -> Lab {
        let r = Netns::create('r');
        let u = Netns::create('u');
        run(
            "ip",
            &[
                "-n", &r.name, "link", "add", "vr", "type", "veth", "peer", "name", "vu", "netns",
                &u.name,
            ],
        );
        run(
            "ip",
            &["-n", &r.name, "addr", "add", "198.19.0.1/24", "dev", "vr"],
        );
        run("ip", &["-n", &r.name, "link", "set", "vr", "up"]);
        let mut upstream_ips = Vec::new();
        for i in 0..upstreams {
            let ip = Ipv4Addr::new(198, 19, 0, 2 + i);
            run(
                "ip",
                &[
                    "-n",
                    &u.name,
                    "addr",
                    "add",
                    &format!("{ip}/24"),
                    "dev",
                    "vu",
                ],
            );
            upstream_ips.push(ip);
        }
        run("ip", &["-n", &u.name, "link", "set", "vu", "up"]);
        Lab { r, u, upstream_ips }
    }

    /// A listener in U.
    pub fn listen(&self, addr: SocketAddr) -> TcpListener {
        self.u
            .enter(move || TcpListener::bind(addr).expect("bind in U"))
    }

    /// A client connection from R (to the router's loopback listeners).
    pub fn connect(&self, addr: SocketAddr) -> TcpStream {
        let s = self.r.enter(move || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect in R")
        });
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Loads an nftables ruleset into U (for black-holing SYNs).
    pub fn nft_u(&self, ruleset: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.u.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nft");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(ruleset.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// How the test resolver answers one name.
#[derive(Clone, Debug)]
pub enum DnsBehaviour {
    /// An A record.
    A(Ipv4Addr),
    /// No answer at all (a resolver that is down or overloaded for this name).
    Silent,
    /// The A record after a delay.
    Slow(Duration, Ipv4Addr),
    /// SERVFAIL.
    ServFail,
    /// A truncated (TC) answer with no records, and nothing on TCP.
    Truncated,
}

/// A UDP DNS server on R's loopback, answering from a table (NXDOMAIN for names not in it).
#[derive(Debug)]
pub struct Dns {
    /// Its address inside R.
    pub addr: SocketAddr,
    /// Name (lower case, no trailing dot) to behaviour.
    table: Arc<Mutex<HashMap<String, DnsBehaviour>>>,
    /// Set on drop to end the server thread.
    stop: Arc<AtomicBool>,
}

impl Dns {
    /// Starts the server in `lab`'s R.
    pub fn start(lab: &Lab) -> Dns {
        let sock = lab
            .r
            .enter(|| UdpSocket::bind("127.0.0.1:0").expect("bind DNS in R"));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let dns = Dns {
            addr: sock.local_addr().unwrap(),
            table: Arc::default(),
            stop: Arc::default(),
        };
        let table = Arc::clone(&dns.table);
        let stop = Arc::clone(&dns.stop);
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(q) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let Some(query) = q.queries.first().cloned() else {
                    continue;
                };
                let name = query
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                let behaviour = table.lock().unwrap().get(&name).cloned();
                let mut resp = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
                resp.metadata.recursion_desired = q.metadata.recursion_desired;
                resp.metadata.recursion_available = true;
                resp.add_query(query.clone());
                let answer = |resp: &mut Message, ip: Ipv4Addr| {
                    if query.query_type() == RecordType::A {
                        resp.add_answer(Record::from_rdata(
                            Name::from_ascii(format!("{name}.")).unwrap(),
                            5,
                            RData::A(rdata::A(ip)),
                        ));
                    }
                };
                match behaviour {
                    None => resp.metadata.response_code = ResponseCode::NXDomain,
                    Some(DnsBehaviour::A(ip)) => answer(&mut resp, ip),
                    Some(DnsBehaviour::Silent) => continue,
                    Some(DnsBehaviour::Slow(d, ip)) => {
                        // Answered from a thread of its own, so one slow name does not hold up others.
                        answer(&mut resp, ip);
                        let sock = sock.try_clone().unwrap();
                        std::thread::spawn(move || {
                            std::thread::sleep(d);
                            let _ = sock.send_to(&resp.to_vec().unwrap(), peer);
                        });
                        continue;
                    }
                    Some(DnsBehaviour::ServFail) => {
                        resp.metadata.response_code = ResponseCode::ServFail;
                    }
                    Some(DnsBehaviour::Truncated) => resp.metadata.truncation = true,
                }
                let _ = sock.send_to(&resp.to_vec().unwrap(), peer);
            }
        });
        dns
    }

    /// Sets how `name` is answered.
    pub fn set(&self, name: &str, b: DnsBehaviour) {
        self.table.lock().unwrap().insert(name.to_owned(), b);
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The real router binary running inside R; killed on drop, its output printed if the test failed.
pub struct RouterProc {
    child: Child,
    /// Every line it logged.
    output: Arc<Mutex<Vec<String>>>,
    /// The plain-HTTP listener (in R).
    pub http: SocketAddr,
    /// The TLS listener (in R).
    pub https: SocketAddr,
    /// The admin endpoint (in R), when started with one ([`RouterProc::start_with_admin`]).
    pub admin: Option<SocketAddr>,
    /// Its config file's directory.
    dir: PathBuf,
}

impl RouterProc {
    /// Starts the router in `lab`'s R with `toml` plus loopback listeners on port 0, and waits for its
    /// "listening on" lines.
    pub fn start(lab: &Lab, toml: &str) -> RouterProc {
        RouterProc::start_with_env(lab, toml, &[])
    }

    /// [`RouterProc::start`] with `env` added to the router's environment.
    pub fn start_with_env(lab: &Lab, toml: &str, env: &[(&str, &str)]) -> RouterProc {
        RouterProc::spawn(lab, toml, env, false)
    }

    /// [`RouterProc::start_with_env`] with the admin endpoint on a loopback port of R
    /// ([`RouterProc::open_connections`]).
    #[allow(dead_code)] // not every test binary that includes the lab uses it
    pub fn start_with_admin(lab: &Lab, toml: &str, env: &[(&str, &str)]) -> RouterProc {
        RouterProc::spawn(lab, toml, env, true)
    }

    fn spawn(lab: &Lab, toml: &str, env: &[(&str, &str)], admin: bool) -> RouterProc {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "asl-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("router.toml");
        let text = format!(
            "{toml}\n[listen]\nhttp = \"127.0.0.1:0\"\nhttps = \"127.0.0.1:0\"\n[answers]\ndefault = \"127.0.0.2\"\n"
        );
        std::fs::write(&config, text).unwrap();
        // `ip netns exec` execs the router after entering R, so the child's pid is the router's.
        let mut child = Command::new("ip")
            .args(["netns", "exec", &lab.r.name])
            .arg(env!("CARGO_BIN_EXE_agent-sandbox-router"))
            .args(["--config", config.to_str().unwrap(), "--log-format", "json"])
            .args(if admin {
                &["--admin", "127.0.0.1:0"][..]
            } else {
                &[]
            })
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
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
                if let Some(rest) = line.split("admin endpoint listening on ").nth(1) {
                    let addr = rest.split(['"', ' ']).next().unwrap_or_default();
                    if let Ok(addr) = addr.parse::<SocketAddr>() {
                        let _ = tx.send((addr, "admin".to_owned()));
                    }
                } else if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr = rest.split(' ').next().unwrap_or_default();
                    let proto = rest
                        .split_once('(')
                        .and_then(|(_, p)| p.split_once(')'))
                        .map(|(p, _)| p.to_owned())
                        .unwrap_or_default();
                    if let Ok(addr) = addr.parse::<SocketAddr>() {
                        let _ = tx.send((addr, proto));
                    }
                }
                out.lock().unwrap().push(line);
            }
        });
        let mut http = None;
        let mut https = None;
        let mut admin_addr = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        while http.is_none() || https.is_none() || (admin && admin_addr.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((a, p)) if p == "http" => http = Some(a),
                Ok((a, p)) if p == "https" || p == "tls" => https = Some(a),
                Ok((a, p)) if p == "admin" => admin_addr = Some(a),
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "router did not report its listeners; output:\n{}",
                        output.lock().unwrap().join("\n")
                    );
                }
            }
        }
        RouterProc {
            child,
            output,
            http: http.unwrap(),
            https: https.unwrap(),
            admin: admin_addr,
            dir,
        }
    }

    /// The connections the router counts as open now (`agent_sandbox_router_connections_open`, summed
    /// over its listeners), read from its admin endpoint in R. Panics without one.
    #[allow(dead_code)] // not every test binary that includes the lab uses it
    pub fn open_connections(&self, lab: &Lab) -> u64 {
        self.metric_sum(lab, "agent_sandbox_router_connections_open")
    }

    /// The connections the router has finished with (`agent_sandbox_router_connections_total`,
    /// summed over its listeners and decisions). Panics without an admin endpoint.
    #[allow(dead_code)] // not every test binary that includes the lab uses it
    pub fn finished_connections(&self, lab: &Lab) -> u64 {
        self.metric_sum(lab, "agent_sandbox_router_connections_total")
    }

    /// The sum of the samples of the metric `family`, read from the admin endpoint in R.
    fn metric_sum(&self, lab: &Lab, family: &str) -> u64 {
        let admin = self
            .admin
            .expect("a router started with its admin endpoint");
        let mut s = lab.connect(admin);
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        let prefix = format!("{family}{{");
        body.lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| {
                l.rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("a sample: {l}"))
            })
            .sum()
    }

    /// The router's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many descriptors the router holds open now.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Polls until the router holds at most `baseline` descriptors; panics with the difference after
    /// `within`.
    pub fn wait_fds(&self, baseline: usize, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        loop {
            let now = self.fds();
            if now <= baseline {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the router still holds {now} descriptors (baseline {baseline}) after {within:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// The JSON log events whose message is `message`.
    pub fn events(&self, message: &str) -> Vec<serde_json::Value> {
        self.output
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message || v["message"] == message)
            .collect()
    }
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- router output ---\n{}", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An upstream server in U: one thread per connection running `handler`. Stops accepting on drop.
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    /// Set on drop.
    stop: Arc<AtomicBool>,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
}

impl Upstream {
    /// Serves `addr` in `lab`'s U.
    pub fn start(
        lab: &Lab,
        addr: SocketAddr,
        handler: impl Fn(TcpStream) + Send + Sync + 'static,
    ) -> Upstream {
        let listener = lab.listen(addr);
        listener.set_nonblocking(true).unwrap();
        let stop: Arc<AtomicBool> = Arc::default();
        let accepted: Arc<AtomicUsize> = Arc::default();
        let handler = Arc::new(handler);
        let (s, a) = (Arc::clone(&stop), Arc::clone(&accepted));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false).unwrap();
                        a.fetch_add(1, Ordering::Relaxed);
                        let h = Arc::clone(&handler);
                        std::thread::spawn(move || h(conn));
                    }
                    // Non-blocking accept: poll for the stop flag between connections.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Upstream {
            addr,
            stop,
            accepted,
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sets SO_LINGER to zero so that closing `s` sends a reset.
pub fn reset_on_close(s: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a valid socket with a correctly sized linger struct.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}
