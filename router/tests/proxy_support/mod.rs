//! Test hosts for the proxy tests: a network namespace joined to ours by a veth pair (addresses from
//! 198.18.0.0/15, never an outside address), upstream servers bound inside it, a DNS server on loopback
//! that maps test names to those hosts, a test CA, and a log capture.
//!
//! The router refuses to dial loopback (that is the point), so upstreams cannot simply listen on
//! 127.0.0.1: they listen on the namespace's address, which the router reaches through the veth.
//! Sockets keep the namespace they were created in, so a helper thread enters the namespace, binds, and
//! hands the listener back to the test's runtime.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_sandbox_router::proxy::Proxy;
use agent_sandbox_shared::{HostName, RouterConfig};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{rdata, Name, RData, Record, RecordType};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// True when the tests can create namespaces (root with `ip`).
pub fn can_netns() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("ip").arg("-V").output().is_ok()
}

/// Skips the calling test (returning early) when namespaces are unavailable.
#[macro_export]
macro_rules! require_netns {
    () => {
        if !proxy_support::can_netns() {
            eprintln!(
                "SKIPPED: needs root and iproute2 to create a network namespace for test hosts"
            );
            return;
        }
    };
}

/// A network namespace with a veth pair: `host_ip` on our side, `ns_ip` inside. Deleted on drop.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    host_if: String,
    pub host_ip: Ipv4Addr,
    pub ns_ip: Ipv4Addr,
}

impl Netns {
    pub fn create() -> Netns {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        static SWEEP: std::sync::Once = std::sync::Once::new();
        // A test binary killed by a timeout runs no destructors: remove namespaces of ours whose
        // process is gone (named asp<pid>x<n>).
        SWEEP.call_once(|| {
            for entry in std::fs::read_dir("/run/netns")
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix("asp")
                    .and_then(|r| r.split_once('x'))
                    .and_then(|(p, _)| p.parse::<u32>().ok())
                else {
                    continue;
                };
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = Command::new("ip").args(["netns", "del", &name]).output();
                }
            }
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() as usize;
        let name = format!("asp{pid}x{n}");
        let host_if = format!("vh{}x{n}", pid % 100_000);
        let ns_if = format!("vn{}x{n}", pid % 100_000);
        // One /30 per namespace in 198.18.0.0/15 (32768 of them), spread by pid.
        let block = ((pid * 64 + n) % 32768) as u32;
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + block * 4;
        let host_ip = Ipv4Addr::from(base + 1);
        let ns_ip = Ipv4Addr::from(base + 2);
        let guard = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            host_ip,
            ns_ip,
        };
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{ns_ip}/30"),
            "dev",
            &ns_if,
        ]);
        ip(&["-n", &name, "link", "set", &ns_if, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        guard
    }

    /// A listener bound inside the namespace.
    pub fn bind(&self, port: u16) -> TcpListener {
        let path = format!("/run/netns/{}", self.name);
        let addr = SocketAddr::new(IpAddr::V4(self.ns_ip), port);
        let std_listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open netns");
            // SAFETY: setns on this helper thread only; the fd is valid for the call.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            let l = std::net::TcpListener::bind(addr).expect("bind in netns");
            l.set_nonblocking(true).unwrap();
            l
        })
        .join()
        .unwrap();
        TcpListener::from_std(std_listener).unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair with it; the link delete is a fallback.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
    }
}

/// A DNS server on 127.0.0.1 that answers test names from a table and counts queries.
#[derive(Clone, Debug)]
pub struct TestDns {
    pub addr: SocketAddr,
    records: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
    pub queries: Arc<Mutex<Vec<(String, RecordType)>>>,
    stop: CancellationToken,
}

impl TestDns {
    pub async fn start(ttl: u32) -> TestDns {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let dns = TestDns {
            addr: sock.local_addr().unwrap(),
            records: Arc::default(),
            queries: Arc::default(),
            stop: CancellationToken::new(),
        };
        let d = dns.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = tokio::select! {
                    () = d.stop.cancelled() => return,
                    r = sock.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
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
                let qtype = query.query_type();
                d.queries.lock().unwrap().push((name.clone(), qtype));
                let mut resp = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
                resp.metadata.recursion_desired = q.metadata.recursion_desired;
                resp.metadata.recursion_available = true;
                resp.metadata.authoritative = true;
                resp.add_query(query.clone());
                match d.records.lock().unwrap().get(&name) {
                    None => resp.metadata.response_code = ResponseCode::NXDomain,
                    Some(addrs) => {
                        for a in addrs {
                            let rdata = match (a, qtype) {
                                (IpAddr::V4(v4), RecordType::A) => RData::A(rdata::A(*v4)),
                                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(rdata::AAAA(*v6)),
                                _ => continue,
                            };
                            resp.add_answer(Record::from_rdata(
                                Name::from_ascii(format!("{name}.")).unwrap(),
                                ttl,
                                rdata,
                            ));
                        }
                    }
                }
                if let Ok(bytes) = resp.to_vec() {
                    let _ = sock.send_to(&bytes, peer).await;
                }
            }
        });
        dns
    }

    pub fn set(&self, name: &str, addrs: &[IpAddr]) {
        self.records
            .lock()
            .unwrap()
            .insert(name.to_owned(), addrs.to_vec());
    }

    /// How many queries of `rtype` named `name`.
    pub fn count_type(&self, name: &str, rtype: RecordType) -> usize {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, t)| n == name && *t == rtype)
            .count()
    }

    /// How many queries named `name`.
    pub fn count(&self, name: &str) -> usize {
        self.queries
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .count()
    }
}

/// A router (just the proxy) serving on loopback, stopped on drop.
#[derive(Debug)]
pub struct TestRouter {
    pub https: SocketAddr,
    pub http: SocketAddr,
    pub forwards: Vec<(String, u16, SocketAddr)>,
    pub stop: CancellationToken,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Router settings for a test.
#[derive(Debug, Clone)]
pub struct Settings {
    pub hosts: Vec<String>,
    pub subdomains: Vec<String>,
    pub forwards: Vec<(String, u16)>,
    pub peek_timeout_secs: u64,
    pub connect_timeout_secs: u64,
    pub max_connections: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            hosts: Vec::new(),
            subdomains: Vec::new(),
            forwards: Vec::new(),
            peek_timeout_secs: 10,
            connect_timeout_secs: 3,
            max_connections: 4096,
        }
    }
}

impl TestRouter {
    pub async fn start(settings: Settings, dns: &TestDns) -> TestRouter {
        let mut toml = format!(
            "hosts = {:?}\nsubdomains = {:?}\nresolvers = [\"{}\"]\npeek_timeout_secs = {}\nconnect_timeout_secs = {}\nmax_connections = {}\nmax_connections_per_client = {}\n",
            settings.hosts,
            settings.subdomains,
            dns.addr,
            settings.peek_timeout_secs,
            settings.connect_timeout_secs,
            settings.max_connections,
            // Every test client is 127.0.0.1: the per-client cap is tested with the real binary.
            settings.max_connections
        );
        toml.push_str("[listen]\nhttp = \"127.0.0.1:0\"\nhttps = \"127.0.0.1:0\"\n");
        for (host, port) in &settings.forwards {
            toml.push_str(&format!(
                "[[forwards]]\nhost = \"{host}\"\nport = {port}\nlisten = \"127.0.0.1:0\"\n"
            ));
        }
        toml.push_str("[answers]\ndefault = \"127.0.0.2\"\n");
        let config = RouterConfig::from_toml(&toml)
            .unwrap_or_else(|e| panic!("{e}\n{toml}"))
            .validate()
            .unwrap();
        let proxy = Arc::new(Proxy::new(&config).unwrap());
        let stop = CancellationToken::new();
        let https = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut router = TestRouter {
            https: https.local_addr().unwrap(),
            http: http.local_addr().unwrap(),
            forwards: Vec::new(),
            stop: stop.clone(),
            tasks: Vec::new(),
        };
        router.tasks.push(tokio::spawn(
            Arc::clone(&proxy).serve_https(https, stop.clone()),
        ));
        router.tasks.push(tokio::spawn(
            Arc::clone(&proxy).serve_http(http, stop.clone()),
        ));
        for (host, port) in &settings.forwards {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            router
                .forwards
                .push((host.clone(), *port, l.local_addr().unwrap()));
            router
                .tasks
                .push(tokio::spawn(Arc::clone(&proxy).serve_forward(
                    l,
                    HostName::parse(host).unwrap(),
                    *port,
                    stop.clone(),
                )));
        }
        router
    }

    pub fn forward(&self, host: &str, port: u16) -> SocketAddr {
        self.forwards
            .iter()
            .find(|(h, p, _)| h == host && *p == port)
            .unwrap()
            .2
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A test CA and a server certificate for the given names.
pub struct Pki {
    pub ca_der: rustls::pki_types::CertificateDer<'static>,
    pub server: Arc<rustls::ServerConfig>,
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Pki {
    pub fn new(names: &[&str]) -> Pki {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "agent-sandbox test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf_params = rcgen::CertificateParams::new(
            names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
        )
        .unwrap();
        let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der()),
        );
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
            .unwrap();
        Pki {
            ca_der: ca.der().clone(),
            server: Arc::new(server),
        }
    }

    pub fn client_config(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).unwrap();
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    }
}

/// Counts accepted connections of a test upstream.
#[derive(Clone, Debug, Default)]
pub struct Accepts(pub Arc<AtomicUsize>);

impl Accepts {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A TLS upstream: answers each line with `upstream <sni> <line>`.
pub fn tls_upstream(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> Accepts {
    let accepts = Accepts::default();
    let count = accepts.clone();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            count.0.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("-").to_owned();
                let (r, mut w) = tokio::io::split(tls);
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("upstream {sni} {line}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let _ = w.shutdown().await;
            });
        }
    });
    accepts
}

/// A TCP echo upstream (for host:port entries and raw tests).
pub fn echo_upstream(listener: TcpListener) -> Accepts {
    let accepts = Accepts::default();
    let count = accepts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            count.0.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    accepts
}

/// An HTTP/1.1 upstream with keep-alive. Every response body is
/// `host=<Host> path=<target> len=<body bytes> sum=<byte sum>`. A request with `Upgrade` for `/ws`
/// gets a genuine WebSocket `101` (the RFC 6455 `Sec-WebSocket-Accept` for its key) and then raw echo;
/// `/ws-noaccept`, `/ws-badaccept` and `/ws-other` get a `101` without the accept, with a wrong one,
/// or switching to another protocol, then raw echo too (what a misbehaving or hostile upstream does).
pub fn http_upstream(listener: TcpListener) -> Accepts {
    let accepts = Accepts::default();
    let count = accepts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            count.0.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve_http_conn(stream));
        }
    });
    accepts
}

async fn serve_http_conn(stream: TcpStream) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            match r.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let end = line == b"\r\n";
            head.extend_from_slice(&line);
            if end {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let target = request_line
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let mut host = String::new();
        let mut length = 0usize;
        let mut chunked = false;
        let mut upgrade = false;
        let mut ws_key = String::new();
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                let v = v.trim();
                match k.to_ascii_lowercase().as_str() {
                    "host" => host = v.to_owned(),
                    "content-length" => length = v.parse().unwrap_or(0),
                    "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                    "upgrade" => upgrade = true,
                    "sec-websocket-key" => ws_key = v.to_owned(),
                    _ => {}
                }
            }
        }
        let mut body_len = 0u64;
        let mut sum = 0u64;
        let mut consume = |data: &[u8]| {
            body_len += data.len() as u64;
            sum = data.iter().fold(sum, |s, b| s.wrapping_add(u64::from(*b)));
        };
        if chunked {
            loop {
                let mut size_line = String::new();
                if r.read_line(&mut size_line).await.unwrap_or(0) == 0 {
                    return;
                }
                let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap(), 16)
                    .unwrap_or(0);
                if size == 0 {
                    let mut crlf = String::new();
                    let _ = r.read_line(&mut crlf).await;
                    break;
                }
                let mut data = vec![0u8; size + 2];
                if r.read_exact(&mut data).await.is_err() {
                    return;
                }
                consume(&data[..size]);
            }
        } else {
            let mut left = length;
            let mut buf = vec![0u8; 64 * 1024];
            while left > 0 {
                let n = left.min(buf.len());
                if r.read_exact(&mut buf[..n]).await.is_err() {
                    return;
                }
                consume(&buf[..n]);
                left -= n;
            }
        }
        let switch = match target.as_str() {
            "/ws" => Some(format!(
                "Upgrade: websocket\r\nSec-WebSocket-Accept: {}\r\n",
                websocket_accept(&ws_key)
            )),
            "/ws-noaccept" => Some("Upgrade: websocket\r\n".to_owned()),
            "/ws-badaccept" => Some(format!(
                "Upgrade: websocket\r\nSec-WebSocket-Accept: {}\r\n",
                websocket_accept("AAAAAAAAAAAAAAAAAAAAAA==")
            )),
            "/ws-other" => Some(format!(
                "Upgrade: h2c\r\nSec-WebSocket-Accept: {}\r\n",
                websocket_accept(&ws_key)
            )),
            _ => None,
        };
        if let (true, Some(fields)) = (upgrade, switch) {
            let _ = w
                .write_all(
                    format!(
                        "HTTP/1.1 101 Switching Protocols\r\n{fields}Connection: Upgrade\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await;
            let mut r = r;
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
            return;
        }
        let body = format!("host={host} path={target} len={body_len} sum={sum}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if w.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        if target == "/close" {
            return;
        }
    }
}

/// RFC 6455's `Sec-WebSocket-Accept` for a key, computed here independently of the router.
pub fn websocket_accept(key: &str) -> String {
    use base64::Engine as _;
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes())
}

/// A valid WebSocket opening handshake for `path` on `host` (RFC 6455's example key).
pub fn websocket_request(host: &str, path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

/// Reads one HTTP response with a Content-Length body: (status, body).
pub async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<(u16, String)> {
    let mut status = 0;
    let mut length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        if first {
            status = line.split(' ').nth(1)?.parse().ok()?;
            first = false;
            continue;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body).await.ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Reads until end of stream (or 10 s).
pub async fn read_to_end(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    out
}

/// Captured log lines (JSON), shared by every test of the binary.
#[derive(Clone, Debug, Default)]
pub struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if std::env::var_os("PROXY_TEST_LOG").is_some() {
            let _ = std::io::stderr().write_all(b);
        }
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

static LOGS: OnceLock<LogBuf> = OnceLock::new();

/// Installs the JSON log capture once.
pub fn capture_logs() -> LogBuf {
    LOGS.get_or_init(|| {
        let buf = LogBuf::default();
        let writer = buf.clone();
        tracing_subscriber::fmt()
            .json()
            .flatten_event(false)
            .with_env_filter("info,hickory_proto=warn,hickory_resolver=warn,hickory_net=warn")
            .with_writer(move || writer.clone())
            .init();
        buf
    })
    .clone()
}

/// A position in the captured log: events after it happened later.
pub fn log_mark() -> usize {
    capture_logs().0.lock().unwrap().len()
}

/// Every captured event whose message is `message`, as the "fields" objects.
pub fn events(message: &str) -> Vec<serde_json::Value> {
    events_since(0, message)
}

/// Every event after `mark` whose message is `message`, newest first.
pub fn events_since(mark: usize, message: &str) -> Vec<serde_json::Value> {
    let buf = capture_logs();
    let bytes = buf.0.lock().unwrap();
    let text = String::from_utf8_lossy(&bytes[mark.min(bytes.len())..]).into_owned();
    drop(bytes);
    let mut found: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("fields").cloned())
        .filter(|f| f.get("message").and_then(|m| m.as_str()) == Some(message))
        .collect();
    found.reverse();
    found
}

/// Waits (up to 5 s) for a `refused` event whose name is `name` and returns its reason.
pub async fn refusal(name: &str) -> String {
    for _ in 0..500 {
        if let Some(e) = events("refused")
            .into_iter()
            .find(|e| e.get("name").and_then(|n| n.as_str()) == Some(name))
        {
            return e["reason"].as_str().unwrap_or_default().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no refusal logged for {name:?}; refusals: {:?}",
        events("refused")
    );
}

/// Waits (up to 5 s) for a `refused` event from `client` and returns (name, reason).
/// Only events after `since` (a [`log_mark`] taken before the connection) count: client ports are
/// reused across the tests of this binary.
pub async fn refusal_from(since: usize, client: SocketAddr) -> (String, String) {
    let want = client.to_string();
    for _ in 0..500 {
        if let Some(e) = events_since(since, "refused")
            .into_iter()
            .find(|e| e.get("client").and_then(|n| n.as_str()) == Some(want.as_str()))
        {
            return (
                e["name"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no refusal logged for {client}; refusals: {:?}",
        events("refused")
    );
}

/// Waits (up to 5 s) for the `connection` event of `client`.
pub async fn connection_event(since: usize, client: SocketAddr) -> serde_json::Value {
    let want = client.to_string();
    for _ in 0..500 {
        if let Some(e) = events_since(since, "connection")
            .into_iter()
            .find(|e| e.get("client").and_then(|n| n.as_str()) == Some(want.as_str()))
        {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no connection event for {client}");
}

/// Writes to stderr without interleaving (for diagnostics).
pub fn note(s: &str) {
    let _ = writeln!(std::io::stderr(), "{s}");
}
