//! The client side of the tests' exchanges with the router: requests, responses, reading to the end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The TLS alert record a refused ClientHello gets: access_denied.
pub const ALERT_ACCESS_DENIED: [u8; 7] = [0x15, 3, 3, 0, 2, 2, 49];
/// The TLS alert record a ClientHello with an unusable name gets: unrecognized_name.
pub const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [0x15, 3, 3, 0, 2, 2, 112];
/// The TLS alert record for an allowed name whose upstream cannot be reached: internal_error.
pub const ALERT_INTERNAL_ERROR: [u8; 7] = [0x15, 3, 3, 0, 2, 2, 80];

/// A TLS client connection through `router` to `name`: the client's local address and the stream.
///
/// # Errors
/// Any connect or handshake error (a refusal shows as one).
pub async fn tls_connect(
    router: SocketAddr,
    config: rustls::ClientConfig,
    name: &str,
) -> std::io::Result<(SocketAddr, tokio_rustls::client::TlsStream<TcpStream>)> {
    let tcp = TcpStream::connect(router).await?;
    let local = tcp.local_addr()?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await?;
    Ok((local, tls))
}

/// Writes `line` and reads one line back (10 s at most).
///
/// # Panics
/// On an I/O error or no answer in time.
pub async fn ping(tls: &mut tokio_rustls::client::TlsStream<TcpStream>, line: &str) -> String {
    tls.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut reader = BufReader::new(tls);
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut out))
        .await
        .expect("answer in time")
        .unwrap();
    out.trim_end().to_owned()
}

/// Sends raw bytes to the router and returns everything it answers until it closes.
pub async fn raw_exchange(router: SocketAddr, bytes: &[u8]) -> (SocketAddr, Vec<u8>) {
    let mut s = TcpStream::connect(router).await.unwrap();
    let local = s.local_addr().unwrap();
    s.write_all(bytes).await.unwrap();
    (local, read_to_end(&mut s).await)
}

/// Sends one request on a fresh connection and reads one response.
pub async fn http_once(router: SocketAddr, request: &str) -> (SocketAddr, Option<(u16, String)>) {
    let s = TcpStream::connect(router).await.unwrap();
    let local = s.local_addr().unwrap();
    let mut s = BufReader::new(s);
    s.get_mut().write_all(request.as_bytes()).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), read_response(&mut s))
        .await
        .unwrap();
    (local, r)
}

/// Sends `bytes` on a fresh connection; returns the first response and whatever follows it until the
/// router closes.
pub async fn http_exchange(
    router: SocketAddr,
    bytes: &[u8],
) -> (SocketAddr, Option<(u16, String)>, Vec<u8>) {
    let s = TcpStream::connect(router).await.unwrap();
    let local = s.local_addr().unwrap();
    let mut s = BufReader::new(s);
    s.get_mut().write_all(bytes).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), read_response(&mut s))
        .await
        .expect("a response in time");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    (local, r, rest)
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
