//! Credential injection end to end (issue 20): a real rustls client talks to the in-process router,
//! which terminates TLS for the `[inject]` hosts with a leaf signed by a session CA of the test's own
//! (name-constrained to those hosts, as the launcher makes it), swaps the API key placeholder, and
//! re-originates TLS to a recording HTTPS upstream in the test's network namespace, verified against a
//! test CA given as `upstream_roots`. The router's resolver is the test's DNS server: nothing can reach
//! a real host. Needs root (namespaces).

mod proxy_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sandbox_router::proxy::Proxy;
use agent_sandbox_router::TestStore;
use agent_sandbox_shared::RouterConfig;
use agent_sandbox_testkit::pki::provider;
use proxy_support::{events_since, Scenario, World};
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The sandbox's value of the API key.
const PLACEHOLDER: &str = "sk-ant-api03-placeholder-AAAAAAAAAAAAAAAAAAAA";
/// The real key, in the router's key file only.
const REAL_KEY: &str = "sk-ant-api03-REAL-KEY-BBBBBBBBBBBBBBBBBBBBBBBB";

/// Labels of the scenario: `api` is injected and good; `other` is spliced; the rest are injected but
/// their upstream's certificate is bad.
const LABELS: [&str; 6] = [
    "api",
    "other",
    "selfsigned",
    "wrongname",
    "expired",
    "token",
];

/// The OAuth placeholders and tokens of the token exchange test.
const ACCESS_PH: &str = "sk-ant-oat01-placeholder-CCCCCCCCCCCCCCCCCCCC";
const ACCESS: &str = "sk-ant-oat01-REAL-ACCESS-DDDDDDDDDDDDDDDDDDDD";
const REFRESH_PH: &str = "sk-ant-ort01-placeholder-EEEEEEEEEEEEEEEEEEEE";
const REFRESH: &str = "sk-ant-ort01-REAL-REFRESH-FFFFFFFFFFFFFFFFFFFF";
const ISSUED_ACCESS: &str = "sk-ant-oat01-ISSUED-ACCESS-GGGGGGGGGGGGGGGGGG";
const ISSUED_REFRESH: &str = "sk-ant-ort01-ISSUED-REFRESH-HHHHHHHHHHHHHHHHH";

/// A request as the upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    /// The SNI the upstream saw.
    sni: String,
    /// The head and body, raw.
    bytes: Vec<u8>,
}

/// The test's upstream: one HTTPS server for every name (the certificate chosen by SNI), recording
/// every request; `/echo-key` answers with the x-api-key it got.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn for_sni(&self, sni: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.sni == sni).collect()
    }
}

/// Certificates by SNI.
#[derive(Debug)]
struct BySni(HashMap<String, Arc<rustls::sign::CertifiedKey>>);

impl rustls::server::ResolvesServerCert for BySni {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.get(hello.server_name()?).cloned()
    }
}

fn certified(
    cert: &rcgen::Certificate,
    key: &rcgen::KeyPair,
    chain: &[CertificateDer<'static>],
) -> Arc<rustls::sign::CertifiedKey> {
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signing = provider().key_provider.load_private_key(der).unwrap();
    let mut full = vec![cert.der().clone()];
    full.extend_from_slice(chain);
    Arc::new(rustls::sign::CertifiedKey::new(full, signing))
}

/// Temporary files, removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("asp-inject-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, content: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The whole set-up.
struct Lab {
    /// Namespace, DNS, log mark.
    world: World,
    /// The router's TLS listener.
    https: SocketAddr,
    /// What the upstream received.
    recorder: Recorder,
    /// The session CA (what the sandbox trusts).
    session_ca: CertificateDer<'static>,
    /// The session CA, to sign with in the name-constraint test.
    session_issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The upstream's own certificate for `other` (the spliced name).
    other_leaf: CertificateDer<'static>,
    /// The upstream CA (for a client of the spliced name).
    upstream_ca: CertificateDer<'static>,
    /// Stops the router.
    stop: CancellationToken,
    /// Files.
    _dir: TempDir,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Lab {
    async fn start(tag: &str) -> Lab {
        Lab::start_with(tag, false).await
    }

    /// With `oauth`: an `[inject.oauth]` section (API host `api`, token host `token`) served by a
    /// stand-in store.
    async fn start_with(tag: &str, oauth: bool) -> Lab {
        let mut scenario = Scenario::new(tag);
        for l in LABELS {
            scenario = scenario.host(l);
        }
        let world = scenario.world().await;
        let name = |l: &str| world.name(l);
        let dir = TempDir::new(tag);

        // The upstream CA and the upstream's certificates, one per name.
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "upstream test CA");
        let up_ca =
            rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        let up_chain = vec![up_ca.der().clone()];
        let mut certs = HashMap::new();
        let mut other_leaf = None;
        for l in ["api", "other", "wrongname", "expired", "token"] {
            let key = rcgen::KeyPair::generate().unwrap();
            let san = if l == "wrongname" {
                name("somebody-else")
            } else {
                name(l)
            };
            let mut params = rcgen::CertificateParams::new(vec![san]).unwrap();
            if l == "expired" {
                params.not_before = rcgen::date_time_ymd(2020, 1, 1);
                params.not_after = rcgen::date_time_ymd(2021, 1, 1);
            }
            let cert = params.signed_by(&key, &up_ca).unwrap();
            if l == "other" {
                other_leaf = Some(cert.der().clone());
            }
            certs.insert(name(l), certified(&cert, &key, &up_chain));
        }
        let self_key = rcgen::KeyPair::generate().unwrap();
        let self_signed = rcgen::CertificateParams::new(vec![name("selfsigned")])
            .unwrap()
            .self_signed(&self_key)
            .unwrap();
        certs.insert(name("selfsigned"), certified(&self_signed, &self_key, &[]));
        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(BySni(certs)));
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let recorder = Recorder::default();
        tokio::spawn(upstream(
            world.ns.bind(443),
            Arc::new(server),
            recorder.clone(),
        ));

        // The session CA, name-constrained to the terminated hosts as the launcher makes it.
        let terminated: Vec<String> = ["api", "selfsigned", "wrongname", "expired", "token"]
            .iter()
            .map(|l| name(l))
            .collect();
        let mut sp = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        sp.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        sp.distinguished_name
            .push(rcgen::DnType::CommonName, "agent-sandbox session CA");
        sp.not_before = rcgen::date_time_ymd(2025, 1, 1);
        sp.not_after = rcgen::date_time_ymd(2040, 1, 1);
        sp.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        sp.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: terminated
                .iter()
                .map(|n| rcgen::GeneralSubtree::DnsName(n.clone()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let session_key = rcgen::KeyPair::generate().unwrap();
        let session_key_pem = session_key.serialize_pem();
        let session = rcgen::CertifiedIssuer::self_signed(sp.clone(), session_key).unwrap();
        let session_ca = session.der().clone();
        let ca_cert = dir.write("ca.pem", session.pem().as_bytes());
        let ca_key = dir.write("ca.key", session_key_pem.as_bytes());
        let session_issuer =
            rcgen::Issuer::new(sp, rcgen::KeyPair::from_pem(&session_key_pem).unwrap());
        let roots = dir.write("roots.pem", up_ca.pem().as_bytes());
        let key_file = dir.write(
            "api-key",
            format!("  {REAL_KEY}  \nsecond line\n").as_bytes(),
        );

        let hosts: Vec<String> = LABELS.iter().map(|l| name(l)).collect();
        let api_key_hosts = &terminated[..4];
        let mut toml = format!(
            "hosts = {hosts:?}\nresolvers = [\"{}\"]\npeek_timeout_secs = 5\nconnect_timeout_secs = 3\n\
             [listen]\nhttps = \"127.0.0.1:0\"\n[answers]\ndefault = \"127.0.0.2\"\n\
             [inject]\nca_cert = {ca_cert:?}\nca_key = {ca_key:?}\nupstream_roots = {roots:?}\n\
             [inject.api_key]\nhosts = {api_key_hosts:?}\nplaceholder = \"{PLACEHOLDER}\"\nkey_file = {key_file:?}\n",
            world.dns.addr
        );
        if oauth {
            toml.push_str(&format!(
                "[inject.oauth]\napi_hosts = [\"{}\"]\ntoken_host = \"{}\"\ntoken_path = \"/v1/oauth/token\"\nstore_dir = {:?}\n",
                name("api"),
                name("token"),
                dir.0.join("oauth")
            ));
        }
        let config = RouterConfig::from_toml(&toml)
            .unwrap_or_else(|e| panic!("{e}\n{toml}"))
            .validate()
            .unwrap_or_else(|e| panic!("{e:?}\n{toml}"));
        let proxy = if oauth {
            Proxy::with_test_oauth(
                &config,
                TestStore {
                    access_placeholder: ACCESS_PH.into(),
                    access_token: ACCESS.into(),
                    refresh_placeholder: REFRESH_PH.into(),
                    refresh_token: REFRESH.into(),
                    issued: (ISSUED_ACCESS.into(), ISSUED_REFRESH.into()),
                },
            )
        } else {
            Proxy::new(&config)
        };
        let proxy = Arc::new(proxy.unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let https = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(Arc::clone(&proxy).serve_https(listener, stop.clone()));
        Lab {
            world,
            https,
            recorder,
            session_ca,
            session_issuer,
            other_leaf: other_leaf.unwrap(),
            upstream_ca: up_ca.der().clone(),
            stop,
            _dir: dir,
        }
    }

    /// A client that trusts the session CA (the sandbox's view).
    fn sandbox_client(&self) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.session_ca.clone()).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        c
    }

    async fn connect(&self, label: &str) -> Client {
        let name = self.world.name(label);
        let tcp = TcpStream::connect(self.https).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(self.sandbox_client()))
            .connect(ServerName::try_from(name.clone()).unwrap(), tcp)
            .await
            .unwrap_or_else(|e| panic!("handshake with the router for {name}: {e}"));
        Client {
            tls,
            buf: Vec::new(),
        }
    }
}

/// A client connection through the router.
struct Client {
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    buf: Vec<u8>,
}

/// A response as the client got it.
#[derive(Debug)]
struct Response {
    status: u16,
    body: Vec<u8>,
}

impl Client {
    async fn send(&mut self, bytes: &[u8]) {
        self.tls.write_all(bytes).await.unwrap();
        self.tls.flush().await.unwrap();
    }

    /// Reads one response with a Content-Length body; `None` when the connection ends first.
    async fn response(&mut self) -> Option<Response> {
        let read = async {
            loop {
                if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&self.buf[..end + 4]).into_owned();
                    let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while self.buf.len() < end + 4 + len {
                        if self.fill().await == 0 {
                            return None;
                        }
                    }
                    let body = self.buf[end + 4..end + 4 + len].to_vec();
                    self.buf.drain(..end + 4 + len);
                    return Some(Response { status, body });
                }
                if self.fill().await == 0 {
                    return None;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("a response or the end in time")
    }

    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        let n = self.tls.read(&mut chunk).await.unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Everything until the connection ends.
    async fn rest(&mut self) -> Vec<u8> {
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while self.fill().await > 0 {}
        })
        .await;
        std::mem::take(&mut self.buf)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn contains(hay: &[u8], needle: &str) -> bool {
    find(hay, needle.as_bytes()).is_some()
}

/// A refresh-token exchange with the token host `token`, as Claude Code sends it, holding the refresh
/// placeholder; `client_id` tells the test's token endpoint how to answer.
fn refresh_request(token: &str, client_id: &str) -> String {
    let body = format!(
        "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"{REFRESH_PH}\",\"client_id\":\"{client_id}\"}}"
    );
    format!(
        "POST /v1/oauth/token HTTP/1.1\r\nHost: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The recording upstream.
async fn upstream(listener: TcpListener, config: Arc<rustls::ServerConfig>, recorder: Recorder) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let (acceptor, recorder) = (acceptor.clone(), recorder.clone());
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let sni = tls.get_ref().1.server_name().unwrap_or_default().to_owned();
            let mut buf = Vec::new();
            loop {
                let end = loop {
                    if let Some(end) = find(&buf, b"\r\n\r\n") {
                        break end;
                    }
                    let mut chunk = [0u8; 4096];
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                let header = |name: &str| {
                    head.lines().find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                    })
                };
                let chunked =
                    header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
                let body_end = loop {
                    let rest = &buf[end + 4..];
                    let found = if chunked {
                        find(rest, b"0\r\n\r\n").map(|i| end + 4 + i + 5)
                    } else {
                        let len: usize = header("content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        (rest.len() >= len).then_some(end + 4 + len)
                    };
                    if let Some(e) = found {
                        break e;
                    }
                    let mut chunk = [0u8; 4096];
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let request: Vec<u8> = buf.drain(..body_end).collect();
                recorder.0.lock().unwrap().push(Seen {
                    sni: sni.clone(),
                    bytes: request.clone(),
                });
                let target = head.split(' ').nth(1).unwrap_or_default();
                // A server must accept the absolute form too (RFC 9112, 3.2.2); other spellings of
                // a path (escapes, dot segments) it may or may not resolve.
                let path = match target.get(..8) {
                    Some(scheme) if scheme.eq_ignore_ascii_case("https://") => {
                        let rest = &target[8..];
                        rest.find('/').map_or("/", |i| &rest[i..])
                    }
                    _ => target,
                };
                let path = path.split('?').next().unwrap_or_default().to_owned();
                let key = header("x-api-key").unwrap_or_default();
                if path == "/stream" || path == "/stream-key" {
                    // A chunked answer in separate writes; `/stream-key` splits the key it got across two
                    // chunks.
                    let (a, b) = key.split_at(key.len() / 2);
                    let parts: Vec<String> = if path == "/stream-key" {
                        vec![format!("data: {a}"), format!("{b}\n\n")]
                    } else {
                        vec!["data: one\n\n".into(), "data: two\n\n".into()]
                    };
                    let _ = tls
                        .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                        .await;
                    for p in parts {
                        let _ = tls
                            .write_all(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes())
                            .await;
                        let _ = tls.flush().await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    if tls.write_all(b"0\r\n\r\n").await.is_err() {
                        return;
                    }
                    continue;
                }
                if path == "/te-gzip" {
                    // A transfer coding the router did not ask for: the content the client would
                    // decode (a gzip member; here its magic and stand-in bytes) is not what the scan
                    // reads.
                    let content = b"\x1f\x8b\x08\x00compressed-bytes";
                    let mut response = format!(
                        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{:x}\r\n",
                        content.len()
                    )
                    .into_bytes();
                    response.extend_from_slice(content);
                    response.extend_from_slice(b"\r\n0\r\n\r\n");
                    if tls.write_all(&response).await.is_err() {
                        return;
                    }
                    continue;
                }
                if path == "/v1/oauth/token" && contains(&request, "encoded-error") {
                    // A token endpoint that ignores `Accept-Encoding: identity` on an error: what the
                    // client would decompress is not what the router's checks read (stand-in bytes,
                    // UTF-8 so that the test store's own checks pass them).
                    let content = b"compressed-bytes";
                    let mut response = format!(
                        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
                        content.len()
                    )
                    .into_bytes();
                    response.extend_from_slice(content);
                    if tls.write_all(&response).await.is_err() {
                        return;
                    }
                    continue;
                }
                if path == "/v1/oauth/token" && contains(&request, "never-answer") {
                    // A token endpoint that takes the request and never answers.
                    tokio::time::sleep(Duration::from_secs(120)).await;
                    return;
                }
                if path == "/v1/oauth/token" {
                    // The token endpoint answers chunked, with freshly issued tokens.
                    let json = format!(
                        "{{\"access_token\":\"{ISSUED_ACCESS}\",\"refresh_token\":\"{ISSUED_REFRESH}\",\"expires_in\":3600}}"
                    );
                    let (a, b) = json.split_at(json.len() / 2);
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                        a.len(),
                        b.len()
                    );
                    if tls.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                    continue;
                }
                if path == "/extra" {
                    // A response, and at once a second one nobody asked for.
                    let response = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale";
                    if tls.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                    continue;
                }
                if path == "/big-head" {
                    // A response head of 40 KB: more than one read's room in the router.
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nX-Pad: {}\r\nContent-Length: 7\r\n\r\nbig ok\n",
                        "b".repeat(40_000)
                    );
                    if tls.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                    continue;
                }
                let body = if path == "/echo-key" {
                    format!("{{\"error\":\"bad key {key}\"}}")
                } else {
                    format!("ok {path}")
                };
                let close = if path == "/close" {
                    "Connection: close\r\n"
                } else {
                    ""
                };
                let response = format!(
                    "HTTP/1.1 200 OK\r\n{close}Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if tls.write_all(response.as_bytes()).await.is_err() || !close.is_empty() {
                    return;
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_becomes_the_real_key_and_never_comes_back() {
    require_netns!();
    let lab = Lab::start("injkey").await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    // x-api-key, then Authorization: Bearer on the same kept-alive connection; a placeholder in the
    // body and in another header passes unchanged.
    let body = format!("{{\"note\":\"{PLACEHOLDER}\"}}");
    c.send(
        format!(
            "POST /v1/messages HTTP/1.1\r\nHost: {api}\r\nx-api-key: {PLACEHOLDER}\r\nX-Copy: {PLACEHOLDER}\r\nAccept-Encoding: gzip\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let r = c.response().await.expect("a response");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"ok /v1/messages");
    c.send(
        format!(
            "GET /second HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let r = c.response().await.expect("a second response");
    assert_eq!(r.body, b"ok /second");
    let seen = lab.recorder.for_sni(&api);
    assert_eq!(seen.len(), 2, "{seen:?}");
    let first = String::from_utf8_lossy(&seen[0].bytes).into_owned();
    assert!(
        first.contains(&format!("x-api-key: {REAL_KEY}\r\n")),
        "{first}"
    );
    assert!(
        first.contains(&format!("X-Copy: {PLACEHOLDER}\r\n")),
        "{first}"
    );
    assert!(first.ends_with(&body), "{first}");
    // Identity only, so that the response scan reads what the client reads.
    assert!(
        first.contains("Accept-Encoding: identity\r\n") && !first.contains("gzip"),
        "{first}"
    );
    let second = String::from_utf8_lossy(&seen[1].bytes).into_owned();
    assert!(
        second.contains(&format!("Authorization: Bearer {REAL_KEY}\r\n")),
        "{second}"
    );
    drop(c);
    // The log: terminated, one request event per request naming the credential, never the key.
    let mark = lab.world.mark;
    // Every test of this binary logs to the same capture: only this test's names count.
    let requests = poll(|| {
        let r: Vec<_> = events_since(mark, "request")
            .into_iter()
            .filter(|e| e["name"] == api.as_str())
            .collect();
        (r.len() >= 2).then_some(r)
    })
    .await;
    assert!(
        requests.iter().all(|e| e["credential"] == "api_key"),
        "{requests:?}"
    );
    let conns = poll(|| {
        let c: Vec<_> = events_since(mark, "connection")
            .into_iter()
            .filter(|e| e["name"] == api.as_str())
            .collect();
        (!c.is_empty()).then_some(c)
    })
    .await;
    assert_eq!(conns[0]["decision"], "terminated", "{conns:?}");
    for message in ["request", "connection", "refused", "upstream failed"] {
        for e in events_since(mark, message) {
            assert!(
                !e.to_string().contains(REAL_KEY),
                "the key in a log line: {e}"
            );
        }
    }
}

/// Polls `f` for up to 5 s.
async fn poll<T>(mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..500 {
        if let Some(t) = f() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not seen in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_key_cuts_the_connection() {
    require_netns!();
    let lab = Lab::start("injecho").await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    c.send(
        format!("GET /echo-key HTTP/1.1\r\nHost: {api}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let got = c.rest().await;
    assert!(!contains(&got, REAL_KEY), "the client got the key");
    assert!(
        !contains(&got, "bad key"),
        "the response went through: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(lab.recorder.for_sni(&api).len(), 1);
    let mark = lab.world.mark;
    let cut = poll(|| {
        events_since(mark, "secret_in_response")
            .into_iter()
            .find(|e| e["name"] == api.as_str())
    })
    .await;
    assert!(!cut.to_string().contains(REAL_KEY));
    // The connection line says why it failed (reviewer G: its reason was empty).
    let line = poll(|| {
        events_since(mark, "connection")
            .into_iter()
            .find(|e| e["name"] == api.as_str())
    })
    .await;
    assert_eq!(line["decision"], "upstream-error", "{line}");
    assert_eq!(line["reason"], "a real secret in the response", "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_other_than_the_sni_is_misdirected_and_nothing_is_sent() {
    require_netns!();
    let lab = Lab::start("inj421").await;
    let api = lab.world.name("api");
    let other = lab.world.name("other");
    // On the first request: nothing dialled, nothing sent.
    let mut c = lab.connect("api").await;
    c.send(
        format!("GET / HTTP/1.1\r\nHost: {other}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n").as_bytes(),
    )
    .await;
    let r = c.response().await.expect("a 421");
    assert_eq!(r.status, 421, "{r:?}");
    assert!(c.rest().await.is_empty());
    assert!(lab.recorder.seen().is_empty(), "{:?}", lab.recorder.seen());
    // A Host switch on a kept-alive connection: the first request goes, the second does not.
    let mut c = lab.connect("api").await;
    c.send(
        format!(
            "GET /one HTTP/1.1\r\nHost: {api}\r\n\r\nGET /two HTTP/1.1\r\nHost: {other}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(c.response().await.expect("first").body, b"ok /one");
    assert_eq!(c.response().await.expect("421").status, 421);
    let seen = lab.recorder.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(String::from_utf8_lossy(&seen[0].bytes).starts_with("GET /one "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_with_unread_bytes_behind_it_ends_without_a_reset() {
    require_netns!();
    let lab = Lab::start("injlinger").await;
    let other = lab.world.name("other");
    let mut c = lab.connect("api").await;
    let client = c.tls.get_ref().0.local_addr().unwrap();
    // A refused request whose body, which the router never reads, follows it at once.
    let mut request =
        format!("POST / HTTP/1.1\r\nHost: {other}\r\nContent-Length: 65536\r\n\r\n").into_bytes();
    request.resize(request.len() + 65536, b'x');
    c.send(&request).await;
    assert_eq!(c.response().await.expect("a 421").status, 421);
    assert!(c.rest().await.is_empty());
    // The client ends its side once it has the answer. Closing with the body unread would reset the
    // connection, and a reset can destroy the answer on its way; the router reads what is left first.
    let _ = c.tls.get_mut().0.shutdown().await;
    proxy_support::connection_event(lab.world.mark, client).await;
    let error = c.tls.get_ref().0.take_error().unwrap();
    assert!(
        error.is_none(),
        "the router reset the connection: {error:?}"
    );
    assert!(lab.recorder.seen().is_empty());
}

/// Reviewer K: bytes the upstream sends past its response were kept and served as the answer to the
/// client's next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_after_a_response_end_the_connection() {
    require_netns!();
    let lab = Lab::start("injextra").await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    c.send(format!("GET /extra HTTP/1.1\r\nHost: {api}\r\n\r\n").as_bytes())
        .await;
    assert_eq!(c.response().await.expect("the first response").body, b"ok");
    // The next request on the connection gets no stale answer: the connection has ended.
    let _ = c
        .tls
        .write_all(format!("GET /second HTTP/1.1\r\nHost: {api}\r\n\r\n").as_bytes())
        .await;
    let _ = c.tls.flush().await;
    assert!(c.response().await.is_none(), "a stale answer was served");
    let mark = lab.world.mark;
    poll(|| {
        events_since(mark, "upstream failed").into_iter().find(|e| {
            e["name"] == api.as_str()
                && e["error"]
                    .as_str()
                    .is_some_and(|r| r.contains("bytes after its response"))
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_preface_upgrade_and_connect_are_refused() {
    require_netns!();
    let lab = Lab::start("injh2").await;
    let api = lab.world.name("api");
    for (request, status) in [
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_owned(), 505),
        (
            format!("GET / HTTP/1.1\r\nHost: {api}\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"),
            505,
        ),
        (format!("CONNECT {api}:443 HTTP/1.1\r\nHost: {api}\r\n\r\n"), 501),
        (
            format!(
                "GET /chat HTTP/1.1\r\nHost: {api}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ),
            501,
        ),
    ] {
        let mut c = lab.connect("api").await;
        c.send(request.as_bytes()).await;
        let r = c.response().await.expect("a refusal");
        assert_eq!(r.status, status, "{request:?}: {r:?}");
    }
    assert!(lab.recorder.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_upstream_certificates_get_502_and_nothing_is_sent() {
    require_netns!();
    let lab = Lab::start("inj502").await;
    for (label, why) in [
        ("selfsigned", "unknownissuer"),
        ("wrongname", "not valid for name"),
        ("expired", "expired"),
    ] {
        let name = lab.world.name(label);
        let mut c = lab.connect(label).await;
        c.send(
            format!("GET / HTTP/1.1\r\nHost: {name}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n")
                .as_bytes(),
        )
        .await;
        let r = c.response().await.expect("a 502");
        assert_eq!(r.status, 502, "{label}: {r:?}");
        let text = String::from_utf8_lossy(&r.body);
        assert!(!text.contains(REAL_KEY));
        let mark = lab.world.mark;
        let failed = poll(|| {
            events_since(mark, "upstream failed")
                .into_iter()
                .find(|e| e["name"] == name.as_str())
        })
        .await;
        let error = failed["error"].as_str().unwrap_or_default().to_owned();
        // The verifier's reason is in the log.
        assert!(error.to_lowercase().contains(why), "{label}: {error}");
        assert!(lab.recorder.for_sni(&name).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_names_are_spliced_end_to_end() {
    require_netns!();
    let lab = Lab::start("injsplice").await;
    let other = lab.world.name("other");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(lab.upstream_ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(lab.https).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(other.clone()).unwrap(), tcp)
        .await
        .unwrap();
    let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(
        peer, lab.other_leaf,
        "the client sees the upstream's own certificate"
    );
    tls.write_all(
        format!("GET /x HTTP/1.1\r\nHost: {other}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut c = Client {
        tls,
        buf: Vec::new(),
    };
    assert_eq!(c.response().await.unwrap().body, b"ok /x");
    // Spliced: the placeholder went as it was.
    let seen = lab.recorder.for_sni(&other);
    assert!(String::from_utf8_lossy(&seen[0].bytes).contains(PLACEHOLDER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaf_verifies_and_the_name_constraint_rejects_other_names() {
    require_netns!();
    let lab = Lab::start("injca").await;
    // The router's leaf verified in the handshake (with the session CA as the only root).
    let c = lab.connect("api").await;
    let leaf = c.tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(lab.session_ca.clone()).unwrap();
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .unwrap();
    let api = ServerName::try_from(lab.world.name("api")).unwrap();
    verifier
        .verify_server_cert(&leaf, &[], &api, &[], UnixTime::now())
        .unwrap();
    // A leaf the same CA signs for another name is refused by its name constraint.
    let key = rcgen::KeyPair::generate().unwrap();
    let evil = rcgen::CertificateParams::new(vec!["evil.example.test".to_owned()])
        .unwrap()
        .signed_by(&key, &lab.session_issuer)
        .unwrap();
    let evil_name = ServerName::try_from("evil.example.test").unwrap();
    let err = verifier
        .verify_server_cert(evil.der(), &[], &evil_name, &[], UnixTime::now())
        .unwrap_err();
    assert!(format!("{err:?}").contains("NameConstraint"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_streams_pipelining_and_close() {
    require_netns!();
    let lab = Lab::start("injchunk").await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    // A chunked request body, then a pipelined request in the same write.
    c.send(
        format!(
            "POST /stream HTTP/1.1\r\nHost: {api}\r\nx-api-key: {PLACEHOLDER}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: {api}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    // The streamed answer arrives framed as the upstream framed it.
    let mut got = Vec::new();
    while find(&got, b"0\r\n\r\n").is_none() {
        assert!(c.fill().await > 0, "{:?}", String::from_utf8_lossy(&c.buf));
        got = c.buf.clone();
    }
    let end = find(&got, b"0\r\n\r\n").unwrap() + 5;
    let text = String::from_utf8_lossy(&got[..end]).into_owned();
    assert!(
        text.contains("data: one") && text.contains("data: two"),
        "{text}"
    );
    c.buf.drain(..end);
    assert_eq!(
        c.response().await.expect("the pipelined one").body,
        b"ok /after"
    );
    let seen = lab.recorder.for_sni(&api);
    assert_eq!(seen.len(), 2);
    assert!(String::from_utf8_lossy(&seen[0].bytes).ends_with("5\r\nhello\r\n0\r\n\r\n"));
    // The upstream closing after a response closes the client's connection too.
    c.send(format!("GET /close HTTP/1.1\r\nHost: {api}\r\n\r\n").as_bytes())
        .await;
    assert_eq!(c.response().await.expect("last").body, b"ok /close");
    assert!(c.rest().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_split_across_chunks_is_caught() {
    require_netns!();
    let lab = Lab::start("injsplit").await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    c.send(
        format!("GET /stream-key HTTP/1.1\r\nHost: {api}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let got = c.rest().await;
    // The first half is a prefix of the key: held back, never sent; then the second half completes it
    // (across the upstream's chunk boundary) and the connection is cut.
    let half = &REAL_KEY[..REAL_KEY.len() / 2];
    assert!(!contains(&got, half), "{:?}", String::from_utf8_lossy(&got));
    let mark = lab.world.mark;
    let api_name = api.clone();
    poll(|| {
        events_since(mark, "secret_in_response")
            .into_iter()
            .find(|e| e["name"] == api_name.as_str())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_tokens_are_swapped_both_ways() {
    require_netns!();
    let lab = Lab::start_with("injoauth", true).await;
    let api = lab.world.name("api");
    let token = lab.world.name("token");
    // The access placeholder becomes the access token on the API host.
    let mut c = lab.connect("api").await;
    c.send(
        format!("GET /v1/me HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {ACCESS_PH}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert_eq!(c.response().await.expect("a response").body, b"ok /v1/me");
    let seen = lab.recorder.for_sni(&api);
    assert!(
        String::from_utf8_lossy(&seen[0].bytes)
            .contains(&format!("Authorization: Bearer {ACCESS}\r\n")),
        "{seen:?}"
    );
    // A refresh: the upstream gets the real refresh token, the client only placeholders back.
    let mut c = lab.connect("token").await;
    c.send(refresh_request(&token, "x").as_bytes()).await;
    let r = c.response().await.expect("the token response");
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 200);
    assert!(
        text.contains(ACCESS_PH) && text.contains(REFRESH_PH),
        "{text}"
    );
    assert!(!text.contains("ISSUED"), "{text}");
    let seen = lab.recorder.for_sni(&token);
    let sent = String::from_utf8_lossy(&seen[0].bytes).into_owned();
    assert!(
        sent.contains(REFRESH) && !sent.contains(REFRESH_PH),
        "{sent}"
    );
    let mark = lab.world.mark;
    for name in [&api, &token] {
        let requests = poll(|| {
            let r: Vec<_> = events_since(mark, "request")
                .into_iter()
                .filter(|e| e["name"] == name.as_str())
                .collect();
            (!r.is_empty()).then_some(r)
        })
        .await;
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(requests[0]["credential"], "oauth", "{requests:?}");
    }
}

/// A token request is one however its target is written (the absolute form every server accepts,
/// escapes, dot segments, doubled slashes, case): the real refresh token goes up and only placeholders
/// come back. Before, only `/v1/oauth/token` itself was, and an absolute-form exchange brought newly
/// issued real tokens into the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_requests_are_recognised_however_the_target_is_written() {
    require_netns!();
    let lab = Lab::start_with("injtokform", true).await;
    let token = lab.world.name("token");
    let body = format!(
        "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"{REFRESH_PH}\",\"client_id\":\"x\"}}"
    );
    let targets = [
        format!("https://{token}/v1/oauth/token"),
        format!("HTTPS://{token}/v1/oauth/token?x=1"),
        "/v1/oauth/%74oken".to_owned(),
        "/v1/./oauth//token".to_owned(),
        "/v1/x/../oauth/token/".to_owned(),
        "/V1/OAuth/Token".to_owned(),
    ];
    for (i, target) in targets.iter().enumerate() {
        let mut c = lab.connect("token").await;
        c.send(
            format!(
                "POST {target} HTTP/1.1\r\nHost: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
        let r = c.response().await.expect("a response");
        let text = String::from_utf8_lossy(&r.body).into_owned();
        assert!(!text.contains("ISSUED"), "{target}: {text}");
        let seen = lab.recorder.for_sni(&token);
        let sent = String::from_utf8_lossy(&seen[i].bytes).into_owned();
        assert!(
            sent.contains(REFRESH) && !sent.contains(REFRESH_PH),
            "{target}: {sent}"
        );
        if i < 2 {
            // The absolute form reaches the test's token endpoint: new tokens, masked.
            assert_eq!(r.status, 200, "{target}: {text}");
            assert!(
                text.contains(ACCESS_PH) && text.contains(REFRESH_PH),
                "{target}: {text}"
            );
        }
    }
}

/// With the sign-in the router adds, creating an API key would bring a real key back into the sandbox
/// (the scan cannot know it): such a request is refused with 403 and nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_is_not_minted_with_the_added_sign_in() {
    require_netns!();
    let lab = Lab::start_with("injmint", true).await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    c.send(
        format!(
            "POST /api/oauth/claude_cli/create%5Fapi_key HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {ACCESS_PH}\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .as_bytes(),
    )
    .await;
    let got = c.rest().await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(text.starts_with("HTTP/1.1 403 "), "{text}");
    assert!(text.contains("ANTHROPIC_API_KEY"), "{text}");
    assert!(
        lab.recorder.for_sni(&api).is_empty(),
        "the upstream saw the request"
    );
    // With the API key placeholder too, in x-api-key or a second Authorization line (the key would
    // label the request, and the access token would still go to the minting endpoint): refused before
    // the minting check, on any path, and nothing reaches the upstream.
    for (target, credentials) in [
        (
            "/api/oauth/claude_cli/create_api_key",
            format!("x-api-key: {PLACEHOLDER}\r\nAuthorization: Bearer {ACCESS_PH}"),
        ),
        (
            "/api/oauth/claude_cli/create_api_key",
            format!("Authorization: Bearer {ACCESS_PH}\r\nAuthorization: Bearer {PLACEHOLDER}"),
        ),
        (
            "/v1/messages",
            format!("x-api-key: {PLACEHOLDER}\r\nAuthorization: Bearer {ACCESS_PH}"),
        ),
    ] {
        let mut c = lab.connect("api").await;
        c.send(
            format!(
                "POST {target} HTTP/1.1\r\nHost: {api}\r\n{credentials}\r\nContent-Length: 2\r\n\r\n{{}}"
            )
            .as_bytes(),
        )
        .await;
        let got = c.rest().await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(text.starts_with("HTTP/1.1 400 "), "{credentials}: {text}");
        assert!(text.contains("send one credential"), "{text}");
        assert!(!text.contains(REAL_KEY) && !text.contains(ACCESS), "{text}");
    }
    assert!(
        lab.recorder.for_sni(&api).is_empty(),
        "the upstream saw a request"
    );
}

/// A response in a transfer coding other than chunked (say `gzip, chunked`, which a client that sent
/// `TE: gzip` decodes) would carry content the scan cannot read, like a content-encoded one: the
/// router answers 502 and passes none of it; and `TE` does not reach the upstream, so it has no
/// reason to choose one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coded_response_is_refused() {
    require_netns!();
    let lab = Lab::start("injte").await;
    let api = lab.world.name("api");
    let mut c = lab.connect("api").await;
    c.send(
        format!(
            "GET /te-gzip HTTP/1.1\r\nHost: {api}\r\nx-api-key: {PLACEHOLDER}\r\nTE: gzip\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let got = c.rest().await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(text.starts_with("HTTP/1.1 502 "), "{text}");
    assert!(!contains(&got, "compressed-bytes"), "{text}");
    let seen = lab.recorder.for_sni(&api);
    assert_eq!(seen.len(), 1, "{seen:?}");
    let sent = String::from_utf8_lossy(&seen[0].bytes).to_ascii_lowercase();
    assert!(!sent.contains("\r\nte:"), "{sent}");
}

/// A terminated connection's request heads draw on the router-wide memory budget for large heads, as
/// the listeners' do: past it, clients sending unfinished 60 KB heads are refused (a 503 that says why,
/// and the log), an ordinary request is still served, and once they go large heads are served again.
/// Without the charge, 900 such connections held about 57 MiB more than small heads (reviewer D).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_heads_on_terminated_connections_share_the_memory_budget() {
    require_netns!();
    let lab = Lab::start("injpeek").await;
    let api = lab.world.name("api");
    let unfinished = format!(
        "GET / HTTP/1.1\r\nHost: {api}\r\nX-Pad: {}",
        "a".repeat(60_000)
    );
    let mark = lab.world.mark;
    let mut holders = Vec::new();
    // Each holds a 64 KiB buffer, 40 KiB of it charged: 250 of them need 10 MiB.
    for _ in 0..250 {
        let mut c = lab.connect("api").await;
        // Refused holders are closed: their writes may fail.
        let _ = c.tls.write_all(unfinished.as_bytes()).await;
        let _ = c.tls.flush().await;
        holders.push(c);
    }
    let request = |pad: usize| {
        format!(
            "GET / HTTP/1.1\r\nHost: {api}\r\nx-api-key: {PLACEHOLDER}\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(pad)
        )
    };
    let status = |pad: usize| {
        let lab = &lab;
        let request = request(pad);
        async move {
            let mut c = lab.connect("api").await;
            let _ = c.tls.write_all(request.as_bytes()).await;
            let _ = c.tls.flush().await;
            c.response().await
        }
    };
    // The holders past the budget are refused. (Their 503 is written, but a client still sending
    // when the router closes may see a reset first: the log is what tells.)
    let spent = poll(|| {
        events_since(mark, "refused").into_iter().find(|e| {
            e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("memory for large ClientHellos"))
        })
    })
    .await;
    assert_eq!(spent["name"], api.as_str(), "{spent}");
    // A large head now is not served; an ordinary request is.
    let r = status(40_000).await;
    assert!(r.as_ref().is_none_or(|r| r.status == 503), "{r:?}");
    let r = status(10).await.expect("an ordinary request is answered");
    assert_eq!(r.status, 200, "{r:?}");
    // The upstream's large response head is charged to the same budget: not held, a 502.
    let big_request = format!("GET /big-head HTTP/1.1\r\nHost: {api}\r\n\r\n");
    let big_head = || {
        let (lab, request) = (&lab, &big_request);
        async move {
            let mut c = lab.connect("api").await;
            c.send(request.as_bytes()).await;
            c.response().await
        }
    };
    let r = big_head().await.expect("a 502");
    assert_eq!(r.status, 502, "{r:?}");
    assert!(
        String::from_utf8_lossy(&r.body).contains("memory for large heads"),
        "{r:?}"
    );
    let failed = poll(|| {
        events_since(mark, "upstream failed").into_iter().find(|e| {
            e["error"]
                .as_str()
                .is_some_and(|r| r.contains("response head: the router's memory"))
        })
    })
    .await;
    assert_eq!(failed["name"], api.as_str(), "{failed}");
    drop(holders);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while status(40_000).await.is_none_or(|r| r.status != 200) {
        assert!(
            std::time::Instant::now() < deadline,
            "the budget was not given back"
        );
    }
    // With room again, the large response head is relayed.
    let r = big_head().await.expect("the large head relayed");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"big ok\n"[..]));
}

/// A token endpoint's answer in a content coding (which the router asked it not to use) could carry a
/// real token the router's checks cannot read, as an ordinary answer could: 502, none of it passed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_token_response_is_refused() {
    require_netns!();
    let lab = Lab::start_with("injtokgz", true).await;
    let token = lab.world.name("token");
    let mut c = lab.connect("token").await;
    c.send(refresh_request(&token, "encoded-error").as_bytes())
        .await;
    let got = c.rest().await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(text.starts_with("HTTP/1.1 502 "), "{text}");
    assert!(!contains(&got, "compressed-bytes"), "{text}");
    let seen = lab.recorder.for_sni(&token);
    assert_eq!(seen.len(), 1, "{seen:?}");
}

/// The token exchange rewrites the head a second time, with its new body's length: a head the first
/// rewrite left at the field cap got one more field (`Content-Length`, which it did not have) and was
/// closed without an answer or a log line (reviewer G). It is refused with 431 like the first
/// rewrite's, and nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_request_at_the_field_cap_gets_431() {
    require_netns!();
    let lab = Lab::start_with("injtokcap", true).await;
    let token = lab.world.name("token");
    // Host, Content-Type and 125 more: 127 fields, 128 with the router's Accept-Encoding.
    let fields: String = (0..125).map(|i| format!("X-{i}: y\r\n")).collect();
    let request = format!(
        "POST /v1/oauth/token HTTP/1.1\r\nHost: {token}\r\nContent-Type: application/json\r\n{fields}\r\n"
    );
    let mut c = lab.connect("token").await;
    c.send(request.as_bytes()).await;
    let got = c.rest().await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
    assert!(lab.recorder.for_sni(&token).is_empty());
}

/// A token exchange holds the store's lock (this router's and, through the flock, every other
/// session's) from the rewritten request until the answer: a token endpoint that never answers must
/// not keep it for the idle timeout (an hour by default) while other sessions' refreshes give up after
/// 30 s. The exchange has the peek timeout (5 s here): 504, and the next exchange goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_token_endpoint_gets_a_deadline() {
    require_netns!();
    let lab = Lab::start_with("injslowtok", true).await;
    let token = lab.world.name("token");
    let exchange = |note: &str| refresh_request(&token, note);
    let mut c = lab.connect("token").await;
    c.send(exchange("never-answer").as_bytes()).await;
    // Client::response gives up after 10 s.
    let r = c
        .response()
        .await
        .expect("an answer before the idle timeout");
    assert_eq!(r.status, 504, "{r:?}");
    assert!(!contains(&r.body, REFRESH), "{r:?}");
    let mut c = lab.connect("token").await;
    c.send(exchange("x").as_bytes()).await;
    let r = c.response().await.expect("the next token response");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(contains(&r.body, ACCESS_PH), "{r:?}");
}

/// The API key goes only to its own hosts: another terminated host (the token endpoint's) gets the
/// placeholder as written, never the real key (reviewer R).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_goes_only_to_its_own_hosts() {
    require_netns!();
    let lab = Lab::start_with("injkeyhosts", true).await;
    let token = lab.world.name("token");
    let mut c = lab.connect("token").await;
    c.send(
        format!("GET /elsewhere HTTP/1.1\r\nHost: {token}\r\nx-api-key: {PLACEHOLDER}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let _ = c.response().await;
    let seen = poll(|| {
        let s = lab.recorder.for_sni(&token);
        (!s.is_empty()).then_some(s)
    })
    .await;
    let up = String::from_utf8_lossy(&seen[0].bytes);
    assert!(
        !up.contains(REAL_KEY),
        "the token host got the API key: {up}"
    );
    assert!(
        up.contains(&format!("x-api-key: {PLACEHOLDER}\r\n")),
        "{up}"
    );
}
