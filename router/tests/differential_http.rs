//! HTTP differential: generated request sequences full of edge cases go through the real router to two
//! real servers run by the test — nginx and a hyper server — and each server must read exactly the
//! requests the router forwarded, with the Host the router decided, and nothing after a request the
//! router refused. Any difference is a request-smuggling desync.
//!
//! How the three views are lined up: the generator knows what each request means (method, target,
//! Host, body) and how many bytes it takes on the wire; the router's `connection` log event says which
//! name it routed by and how many client bytes it forwarded (`bytes_up`), which picks out the requests it
//! forwarded; each server records what it parsed. Everything runs in the `lab` namespaces: the router in
//! one with no default route, the servers in the other.

mod lab;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use lab::{Dns, DnsBehaviour, Lab, RouterProc};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// Sequences generated per server; each is one client connection.
const CASES: usize = 200;

/// One request as a server read it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    method: String,
    /// The target in origin form (an absolute-form target loses its scheme and authority).
    target: String,
    /// The Host header as received.
    host: String,
    /// The decoded body (the generator only sends ASCII).
    body: String,
}

/// How a request's body is framed on the wire.
#[derive(Clone, Debug)]
enum Framing {
    /// No body and no framing header.
    None,
    /// `Content-Length`, written in one of several legal forms.
    Length(LengthForm),
    /// `Transfer-Encoding: chunked`, chunks of these sizes with extensions and maybe trailers.
    Chunked {
        sizes: Vec<usize>,
        extensions: bool,
        upper_hex: bool,
        trailers: bool,
    },
    /// Both `Content-Length` and chunked (a classic smuggling vector: must be refused or read alike).
    Both,
    /// `Content-Length` twice with the same value.
    DuplicateLength,
}

/// Spellings of a `Content-Length` header.
#[derive(Clone, Copy, Debug)]
enum LengthForm {
    Plain,
    NoSpace,
    TrailingSpace,
    LowerCase,
    /// Leading zeros: legal by the grammar, read differently by some parsers.
    LeadingZeros,
}

/// Spellings of the Host header.
#[derive(Clone, Copy, Debug)]
enum HostForm {
    Plain,
    Upper,
    WithPort,
    /// The Host header sent twice, same value.
    Twice,
    /// A name the router does not allow: must be refused.
    NotAllowed,
    /// The other allowed name: switching Host on a kept-alive connection must be refused.
    Switch,
}

/// One generated request.
#[derive(Clone, Debug)]
struct Req {
    method: &'static str,
    path: String,
    host: HostForm,
    absolute: bool,
    framing: Framing,
    body_len: usize,
    expect_continue: bool,
    http10: bool,
    /// Odd but legal extra headers: empty values, runs of spaces, duplicates, a long line.
    odd_headers: Vec<String>,
    /// A header that parsers disagree on (obsolete line folding, space before the colon, a
    /// `Chunked` spelled in capitals): must be refused, or read alike.
    weird_header: Option<&'static str>,
}

/// What a request should become on the wire and what it means.
struct Encoded {
    bytes: Vec<u8>,
    meaning: Seen,
    /// May be forwarded only if both servers read it exactly as `meaning`.
    ambiguous: bool,
    /// Must never reach a server.
    must_refuse: bool,
}

fn body_bytes(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + ((i + seed) % 26) as u8).collect()
}

fn encode(req: &Req, name: &str, other: &str, seed: usize) -> Encoded {
    let body = body_bytes(req.body_len, seed);
    let host_value = match req.host {
        HostForm::Plain | HostForm::Twice => name.to_owned(),
        HostForm::Upper => name.to_ascii_uppercase(),
        HostForm::WithPort => format!("{name}:80"),
        HostForm::NotAllowed => "evil.test".to_owned(),
        HostForm::Switch => other.to_owned(),
    };
    let target = if req.absolute {
        format!("http://{host_value}{}", req.path)
    } else {
        req.path.clone()
    };
    let version = if req.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut head = format!(
        "{} {target} {version}\r\nHost: {host_value}\r\n",
        req.method
    );
    if matches!(req.host, HostForm::Twice) {
        let _ = write!(head, "Host: {host_value}\r\n");
    }
    for h in &req.odd_headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    if req.expect_continue {
        head.push_str("Expect: 100-continue\r\n");
    }
    if let Some(w) = req.weird_header {
        head.push_str(w);
        head.push_str("\r\n");
    }
    let mut wire_body = Vec::new();
    let mut sent_body = body.clone();
    match &req.framing {
        Framing::None => sent_body.clear(),
        Framing::Length(form) => {
            let n = body.len();
            head.push_str(&match form {
                LengthForm::Plain => format!("Content-Length: {n}\r\n"),
                LengthForm::NoSpace => format!("Content-Length:{n}\r\n"),
                LengthForm::TrailingSpace => format!("Content-Length: {n}  \r\n"),
                LengthForm::LowerCase => format!("content-length: {n}\r\n"),
                LengthForm::LeadingZeros => format!("Content-Length: 00{n}\r\n"),
            });
            wire_body.extend_from_slice(&body);
        }
        Framing::Chunked {
            sizes,
            extensions,
            upper_hex,
            trailers,
        } => {
            head.push_str("Transfer-Encoding: chunked\r\n");
            let mut at = 0;
            for &s in sizes {
                let s = s.min(body.len() - at);
                if s == 0 {
                    continue;
                }
                let size = if *upper_hex {
                    format!("{s:X}")
                } else {
                    format!("{s:x}")
                };
                wire_body.extend_from_slice(size.as_bytes());
                if *extensions {
                    wire_body.extend_from_slice(b";ext=1; name=\"v\"");
                }
                wire_body.extend_from_slice(b"\r\n");
                wire_body.extend_from_slice(&body[at..at + s]);
                wire_body.extend_from_slice(b"\r\n");
                at += s;
            }
            if at < body.len() {
                let _ = write!(&mut head, "");
                wire_body.extend_from_slice(format!("{:x}\r\n", body.len() - at).as_bytes());
                wire_body.extend_from_slice(&body[at..]);
                wire_body.extend_from_slice(b"\r\n");
            }
            wire_body.extend_from_slice(b"0\r\n");
            if *trailers {
                wire_body.extend_from_slice(b"X-Trailer: t\r\n");
            }
            wire_body.extend_from_slice(b"\r\n");
        }
        Framing::Both => {
            let _ = write!(
                head,
                "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                body.len() + 5
            );
            wire_body.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
            wire_body.extend_from_slice(&body);
            wire_body.extend_from_slice(b"\r\n0\r\n\r\n");
        }
        Framing::DuplicateLength => {
            let n = body.len();
            let _ = write!(head, "Content-Length: {n}\r\nContent-Length: {n}\r\n");
            wire_body.extend_from_slice(&body);
        }
    }
    if matches!(req.framing, Framing::None)
        && req.weird_header == Some("Transfer-Encoding: Chunked")
    {
        // The header makes the message chunked: end its (empty) body, or the request never ends.
        wire_body.extend_from_slice(b"0\r\n\r\n");
    }
    if req.http10 {
        // HTTP/1.0 closes after the response: only ever the last request of a sequence.
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&wire_body);
    Encoded {
        bytes,
        meaning: Seen {
            method: req.method.to_owned(),
            target: req.path.clone(),
            host: host_value.clone(),
            body: String::from_utf8(sent_body).unwrap(),
        },
        ambiguous: matches!(
            req.framing,
            Framing::Both | Framing::DuplicateLength | Framing::Length(LengthForm::LeadingZeros)
        ) || matches!(req.host, HostForm::Twice)
            || req.weird_header.is_some(),
        must_refuse: matches!(req.host, HostForm::NotAllowed | HostForm::Switch),
    }
}

fn request() -> impl Strategy<Value = Req> {
    let method = prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]);
    let path = "/[a-z0-9]{0,8}(\\?[a-z]{1,4}=[a-z0-9%]{0,6})?";
    let host = prop_oneof![
        10 => Just(HostForm::Plain),
        2 => Just(HostForm::Upper),
        2 => Just(HostForm::WithPort),
        1 => Just(HostForm::Twice),
        1 => Just(HostForm::NotAllowed),
        1 => Just(HostForm::Switch),
    ];
    let length_form = prop::sample::select(vec![
        LengthForm::Plain,
        LengthForm::NoSpace,
        LengthForm::TrailingSpace,
        LengthForm::LowerCase,
        LengthForm::LeadingZeros,
    ]);
    let framing = prop_oneof![
        3 => Just(Framing::None),
        4 => length_form.prop_map(Framing::Length),
        4 => (proptest::collection::vec(1usize..40, 0..5), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(sizes, extensions, upper_hex, trailers)| Framing::Chunked { sizes, extensions, upper_hex, trailers }),
        1 => Just(Framing::Both),
        1 => Just(Framing::DuplicateLength),
    ];
    let odd = prop::sample::select(vec![
        "X-Empty:".to_owned(),
        "X-Spaces:    v  w   ".to_owned(),
        "x-lower: v".to_owned(),
        "X-Dup: 1\r\nX-Dup: 2".to_owned(),
        "Accept: */*".to_owned(),
        "X-Tab:\tv".to_owned(),
        format!("X-Long: {}", "l".repeat(4000)),
        "Cache-Control: no-cache, no-store".to_owned(),
    ]);
    (
        method,
        path,
        host,
        any::<bool>(),
        framing,
        0usize..200,
        prop::bool::weighted(0.15),
        proptest::collection::vec(odd, 0..3),
        prop::option::weighted(
            0.1,
            prop::sample::select(vec![
                "X-Fold: a\r\n  folded",
                "X-Space : v",
                "Transfer-Encoding: Chunked",
                "Transfer-Encoding: identity",
                "Content-Length: +0",
            ]),
        ),
    )
        .prop_map(
            |(
                method,
                path,
                host,
                absolute,
                framing,
                body_len,
                expect_continue,
                odd_headers,
                weird_header,
            )| Req {
                method,
                path,
                host,
                // Absolute-form targets now and then.
                absolute: absolute && body_len % 5 == 0,
                body_len: if matches!(framing, Framing::None) {
                    0
                } else {
                    body_len
                },
                framing,
                expect_continue,
                http10: false,
                odd_headers,
                weird_header,
            },
        )
}

/// A connection's worth of requests; the last one is sometimes HTTP/1.0.
fn sequence() -> impl Strategy<Value = Vec<Req>> {
    (
        proptest::collection::vec(request(), 1..6),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(mut reqs, http10)| {
            // The first request picks the connection's name: switching only exists after it.
            if matches!(reqs[0].host, HostForm::Switch) {
                reqs[0].host = HostForm::Plain;
            }
            if http10 {
                let last = reqs.last_mut().unwrap();
                last.http10 = true;
                last.framing = Framing::Length(LengthForm::Plain);
            }
            reqs
        })
}

/// nginx, run by the test in U as a single foreground process, logging every request it reads.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Nginx {
    fn start(lab: &Lab, ip: IpAddr) -> Nginx {
        let dir = std::env::temp_dir().join(format!("asl-nginx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tmp")).unwrap();
        let d = dir.display();
        // The front server reads the whole body (the proxy module buffers it) so $request_body holds it;
        // the back server on U's loopback only answers.
        let conf = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 64; }}
http {{
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    client_body_buffer_size 64k;
    client_body_in_single_buffer on;
    log_format diff escape=json '{{"m":"$request_method","u":"$request_uri","h":"$http_host","b":"$request_body","s":"$status"}}';
    access_log {d}/access.log diff;
    server {{
        listen {ip}:80;
        # The client half-closes after its last request: that is not an abort.
        proxy_ignore_client_abort on;
        location / {{ proxy_pass http://127.0.0.1:8081; }}
    }}
    server {{
        listen 127.0.0.1:8081;
        access_log off;
        location / {{ return 200 "ok\n"; }}
    }}
}}
"#
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &lab.u.name, "nginx", "-p"])
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx (apt-get install nginx-light)");
        let nginx = Nginx { child, dir };
        // Ready when it accepts a connection (polled from inside U).
        let addr = SocketAddr::new(ip, 80);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lab
            .u
            .enter(move || TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
        {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}",
                std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        nginx
    }

    /// Every request logged so far, with its status.
    fn seen(&self) -> Vec<(Seen, String)> {
        std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("nginx log line");
                let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
                (
                    Seen {
                        method: s("m"),
                        target: s("u"),
                        host: s("h"),
                        body: s("b"),
                    },
                    s("s"),
                )
            })
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- nginx error log ---\n{}",
                std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A hyper HTTP/1 server in U recording every request it reads (status "200", or "error" when the body
/// could not be read).
fn start_hyper(
    lab: &Lab,
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
) -> Arc<Mutex<Vec<(Seen, String)>>> {
    let listener = lab.listen(addr);
    listener.set_nonblocking(true).unwrap();
    let seen: Arc<Mutex<Vec<(Seen, String)>>> = Arc::default();
    let record = Arc::clone(&seen);
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let record = Arc::clone(&record);
                        async move {
                            let (parts, body) = req.into_parts();
                            let host = parts
                                .headers
                                .get_all(hyper::header::HOST)
                                .iter()
                                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                                .collect::<Vec<_>>()
                                .join(",");
                            let target = parts
                                .uri
                                .path_and_query()
                                .map(|p| p.as_str().to_owned())
                                .unwrap_or_default();
                            let (body, status) = match body.collect().await {
                                Ok(b) => {
                                    (String::from_utf8_lossy(&b.to_bytes()).into_owned(), "200")
                                }
                                Err(_) => (String::new(), "error"),
                            };
                            record.lock().unwrap().push((
                                Seen {
                                    method: parts.method.as_str().to_owned(),
                                    target,
                                    host,
                                    body,
                                },
                                status.to_owned(),
                            ));
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(
                                Bytes::from_static(b"ok\n"),
                            )))
                        }
                    },
                );
                // The client half-closes after its last request; by default hyper drops the
                // connection on that EOF even mid-request.
                let _ = hyper::server::conn::http1::Builder::new()
                    .half_close(true)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    seen
}

/// Sends one sequence as a single pipelined write, half-closes, and reads until the router closes.
fn send(lab: &Lab, router: &RouterProc, bytes: &[u8]) -> Vec<u8> {
    let mut c = lab.connect(router.http);
    c.write_all(bytes).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// The router's `connection` event for the `n`th connection (its name, decision and bytes_up),
/// polled until it is logged.
fn connection_event(router: &RouterProc, n: usize) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = router.events("connection");
        if events.len() > n {
            return events[n].clone();
        }
        assert!(Instant::now() < deadline, "no connection event #{n}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn servers_read_exactly_what_the_router_forwarded() {
    if !lab::require_netns() {
        return;
    }
    if Command::new("nginx").arg("-v").output().is_err() {
        panic!("nginx is not installed (apt-get install nginx-light)");
    }
    let lab = Lab::new(2);
    let dns = Dns::start(&lab);
    let servers = [
        ("ng.test", lab.upstream_ips[0]),
        ("hy.test", lab.upstream_ips[1]),
    ];
    for (name, ip) in servers {
        dns.set(name, DnsBehaviour::A(ip));
    }
    dns.set("evil.test", DnsBehaviour::A(lab.upstream_ips[0]));
    let router = RouterProc::start(
        &lab,
        &format!(
            "hosts = [\"ng.test\", \"hy.test\"]\nresolvers = [\"{}\"]\npeek_timeout_secs = 5\nconnect_timeout_secs = 3\n",
            dns.addr
        ),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let nginx = Nginx::start(&lab, IpAddr::V4(lab.upstream_ips[0]));
    let hyper_seen = start_hyper(
        &lab,
        &rt,
        SocketAddr::new(IpAddr::V4(lab.upstream_ips[1]), 80),
    );

    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = sequence();
    let mut connections = 0;
    let mut forwarded_total = 0;
    let mut refused_total = 0;
    for case in 0..CASES {
        let reqs = strategy.new_tree(&mut runner).unwrap().current();
        for (server, (name, _)) in servers.iter().enumerate() {
            let other = servers[1 - server].0;
            let encoded: Vec<Encoded> = reqs
                .iter()
                .enumerate()
                .map(|(i, r)| encode(r, name, other, case * 7 + i))
                .collect();
            let wire: Vec<u8> = encoded.iter().flat_map(|e| e.bytes.clone()).collect();
            let before = match server {
                0 => nginx.seen().len(),
                _ => hyper_seen.lock().unwrap().len(),
            };
            let reply = send(&lab, &router, &wire);
            let event = connection_event(&router, connections);
            connections += 1;
            // The requests the router forwarded: the longest prefix whose bytes add up to bytes_up.
            let bytes_up = event["fields"]["bytes_up"].as_u64().unwrap_or(0) as usize;
            let mut k = 0;
            let mut sum = 0;
            while k < encoded.len() && sum + encoded[k].bytes.len() <= bytes_up {
                sum += encoded[k].bytes.len();
                k += 1;
            }
            let context = || {
                format!(
                    "case {case} via {name}: router event {event}\nsent:\n{}\nreply:\n{}",
                    String::from_utf8_lossy(&wire),
                    String::from_utf8_lossy(&reply)
                )
            };
            assert_eq!(
                sum,
                bytes_up,
                "the router forwarded part of a request\n{}",
                context()
            );
            // Clean requests before the first odd one must all be forwarded; nothing at or after a
            // request that must be refused may be.
            let first_odd = encoded
                .iter()
                .position(|e| e.ambiguous || e.must_refuse)
                .unwrap_or(encoded.len());
            let first_refuse = encoded
                .iter()
                .position(|e| e.must_refuse)
                .unwrap_or(encoded.len());
            assert!(
                k >= first_odd,
                "a clean request was not forwarded\n{}",
                context()
            );
            assert!(
                k <= first_refuse,
                "a request that must be refused was forwarded\n{}",
                context()
            );
            if k > 0 {
                // The event's name is the refused one when a later request was refused; the upstream
                // it dialled says where the forwarded requests went.
                let upstream = event["fields"]["upstream"].as_str().unwrap_or_default();
                assert_eq!(
                    upstream,
                    format!("{}:80", servers[server].1),
                    "{}",
                    context()
                );
                if event["fields"]["decision"] == "allowed" {
                    assert_eq!(event["fields"]["name"], *name, "{}", context());
                }
            }
            // What the server read must be exactly the forwarded requests, all answered normally.
            let deadline = Instant::now() + Duration::from_secs(5);
            let seen = loop {
                let all = match server {
                    0 => nginx.seen(),
                    _ => hyper_seen.lock().unwrap().clone(),
                };
                let now: Vec<(Seen, String)> = all[before..].to_vec();
                if now.len() >= k || Instant::now() > deadline {
                    break now;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let expected: Vec<(Seen, String)> = encoded[..k]
                .iter()
                .map(|e| (e.meaning.clone(), "200".to_owned()))
                .collect();
            assert_eq!(
                seen,
                expected,
                "desync: {name} read other requests than the router forwarded\n{}",
                context()
            );
            forwarded_total += k;
            refused_total += usize::from(k < encoded.len());
        }
    }
    eprintln!(
        "{connections} connections, {forwarded_total} requests forwarded and read alike, {refused_total} connections cut short by a refusal"
    );
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    for e in router.events("refused") {
        let reason = e["fields"]["reason"].as_str().unwrap_or_default();
        // Group by the reason's wording, not the names in it.
        let key: String = reason.split(" from ").next().unwrap_or(reason).to_owned();
        *reasons.entry(key).or_default() += 1;
    }
    eprintln!("refusals by reason: {reasons:#?}");
    assert!(
        forwarded_total > CASES,
        "too few requests got through to compare"
    );
    assert!(refused_total > 0, "no refusal was exercised");
    drop(rt);
}
