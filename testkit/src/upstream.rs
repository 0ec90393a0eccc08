//! The upstream servers behind the router. For the tests: a TLS line echo that names the SNI it saw, a
//! TCP echo, and an HTTP/1.1 server that describes each request it got (and plays WebSocket peers, good
//! and bad). For the benchmark: a traffic server (sink, source, one-byte echo) and a minimal keep-alive
//! HTTP server with a bulk download. The tests' servers count the connections they accept; the
//! benchmark's do nothing per connection beyond their work.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Counts accepted connections of a test upstream.
#[derive(Clone, Debug, Default)]
pub struct Accepts(pub Arc<AtomicUsize>);

impl Accepts {
    /// How many connections the upstream has accepted so far.
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

/// A benchmark upstream, by the first byte a client sends: `u` → sink (reads, discards), `d` → source
/// (writes until the client closes), anything else (`e`) → one byte back, then close.
pub fn traffic_upstream(listener: TcpListener) {
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut mode = [0u8; 1];
                if s.read_exact(&mut mode).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 256 * 1024];
                match mode[0] {
                    b'u' => while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {},
                    b'd' => while s.write_all(&buf).await.is_ok() {},
                    _ => {
                        let _ = s.write_all(b"e").await;
                    }
                }
            });
        }
    });
}

/// A keep-alive HTTP upstream answering every request with a tiny 200 (40 bytes in all), and
/// `GET /bulk` with a body of [`BULK_HTTP`] bytes.
pub fn bench_http_upstream(listener: TcpListener) {
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let (r, mut w) = s.into_split();
                let mut r = BufReader::new(r);
                let mut head = Vec::new();
                loop {
                    head.clear();
                    loop {
                        let mut line = Vec::new();
                        match tokio::io::AsyncBufReadExt::read_until(&mut r, b'\n', &mut line).await
                        {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        let end = line == b"\r\n";
                        head.extend_from_slice(&line);
                        if end {
                            break;
                        }
                    }
                    if head.starts_with(b"GET /bulk ") {
                        let chunk = vec![b'x'; 256 * 1024];
                        let head =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {BULK_HTTP}\r\n\r\n");
                        if w.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        let mut left = BULK_HTTP;
                        while left > 0 {
                            let n = left.min(chunk.len() as u64) as usize;
                            if w.write_all(&chunk[..n]).await.is_err() {
                                return;
                            }
                            left -= n as u64;
                        }
                        continue;
                    }
                    if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
}

/// Bytes of the `/bulk` HTTP response.
pub const BULK_HTTP: u64 = 2 << 30;
