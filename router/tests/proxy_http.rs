//! The HTTP listener end to end: routing by Host, refusals with their status and reason, kept-alive
//! connections that switch hosts, request head hygiene, absolute-form targets, bodies and WebSocket
//! upgrades. Refused requests never reach the upstream or the resolver.
//!
//! Upstream test hosts live in a network namespace reached over a veth pair, with a test DNS server on
//! loopback (`agent-sandbox-testkit`); each test states its set-up as a [`Scenario`]. Needs root.

mod proxy_support;

use std::time::Duration;

use agent_sandbox_testkit::client::{http_exchange, http_once, read_response, websocket_request};
use agent_sandbox_testkit::upstream::websocket_accept;
use proxy_support::{refusal_from, Scenario};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_routing_and_refusals() {
    require_netns!();
    let w = Scenario::new("http")
        .host("www")
        .resolves("evil")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("www");
    let evil = w.name("evil");

    let (_, r) = http_once(
        w.router.http,
        &format!("GET /a HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.unwrap(), (200, format!("host={ok} path=/a len=0 sum=0")));
    let (_, r) = http_once(
        w.router.http,
        &format!("GET /b HTTP/1.1\r\nHost: {}:80\r\n\r\n", ok.to_uppercase()),
    )
    .await;
    assert_eq!(r.unwrap().0, 200);
    let (_, r) = http_once(
        w.router.http,
        &format!("GET http://{ok}/c HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.unwrap().0, 200);
    let (_, r) = http_once(
        w.router.http,
        &format!("GET /d HTTP/1.0\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(r.unwrap().0, 200);
    assert_eq!(w.http().get(), 4);

    let refused: Vec<(&str, String, u16, &str)> = vec![
        ("not listed", format!("GET / HTTP/1.1\r\nHost: {evil}\r\n\r\n"), 403, "not on the allowlist"),
        ("ip literal", format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", w.ns.ns_ip), 403, "IP literal"),
        ("no host 1.0", "GET / HTTP/1.0\r\n\r\n".to_owned(), 400, "no Host header"),
        ("duplicate host", format!("GET / HTTP/1.1\r\nHost: {ok}\r\nHost: {evil}\r\n\r\n"), 400, "several Host headers"),
        (
            "absolute-form mismatch",
            format!("GET http://{evil}/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            400,
            "the request target names",
        ),
        ("connect", format!("CONNECT {ok}:443 HTTP/1.1\r\nHost: {ok}:443\r\n\r\n"), 405, "CONNECT"),
        ("h2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_owned(), 400, "HTTP/2 prior knowledge"),
        ("h2c upgrade", format!("GET / HTTP/1.1\r\nHost: {ok}\r\nUpgrade: h2c\r\nHTTP2-Settings: AA\r\n\r\n"), 400, "upgrade to HTTP/2"),
        (
            "te+cl",
            format!("POST / HTTP/1.1\r\nHost: {ok}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            400,
            "both Transfer-Encoding",
        ),
        ("nul in host", format!("GET / HTTP/1.1\r\nHost: a\0{ok}\r\n\r\n"), 400, "control or non-ASCII"),
        ("at in host", format!("GET / HTTP/1.1\r\nHost: x@{ok}\r\n\r\n"), 400, "invalid name"),
    ];
    for (what, req, status, reason) in refused {
        let (local, r) = http_once(w.router.http, &req).await;
        let (got, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(got, status, "{what}: {body}");
        let (_, logged) = refusal_from(w.mark, local).await;
        assert!(
            logged.contains(reason),
            "{what}: {logged:?} lacks {reason:?}"
        );
        if status == 403 {
            assert!(body.contains("not on the sandbox allowlist"), "{body}");
            // This router's configuration names no allowlist file (tests/cli.rs covers the modes).
            assert!(body.contains("add it to the router's allowlist"), "{body}");
        }
    }
    let (_, r) = http_once(
        w.router.http,
        &format!("GET / HTTP/1.1\r\nHost: {evil}\r\n\r\n"),
    )
    .await;
    assert!(r.unwrap().1.contains(&evil));
    assert_eq!(w.http().get(), 4, "a refused request reached the upstream");
    assert_eq!(w.dns.count(&evil), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_refusal_with_an_unread_body_ends_without_a_reset() {
    require_netns!();
    let w = Scenario::new("httplinger")
        .host("www")
        .resolves("evil")
        .http_upstream()
        .start()
        .await;
    let evil = w.name("evil");
    let mark = proxy_support::log_mark();
    let mut s = TcpStream::connect(w.router.http).await.unwrap();
    let client = s.local_addr().unwrap();
    // A refused request whose body, which the router never reads, follows it at once.
    let mut request =
        format!("POST / HTTP/1.1\r\nHost: {evil}\r\nContent-Length: 65536\r\n\r\n").into_bytes();
    request.resize(request.len() + 65536, b'x');
    s.write_all(&request).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the refusal and the end of the router's side in time")
        .unwrap();
    assert!(
        got.starts_with(b"HTTP/1.1 403 "),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // The client ends its side once it has the answer; the router has read what was left, and
    // closes without a reset (which could have destroyed the answer on its way).
    s.shutdown().await.unwrap();
    proxy_support::connection_event(mark, client).await;
    let error = s.take_error().unwrap();
    assert!(
        error.is_none(),
        "the router reset the connection: {error:?}"
    );
    assert_eq!(w.http().get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_keep_alive_host_switch_is_refused() {
    require_netns!();
    // Both are allowed: switching between two allowed names is still refused.
    let w = Scenario::new("ka")
        .host("ok")
        .host("other")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let other = w.name("other");
    let s = TcpStream::connect(w.router.http).await.unwrap();
    let local = s.local_addr().unwrap();
    let mut s = BufReader::new(s);
    // Two pipelined requests for the same host, then one for another host, all in one write.
    let req = format!(
        "GET /1 HTTP/1.1\r\nHost: {ok}\r\n\r\nPOST /2 HTTP/1.1\r\nHost: {ok}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /3 HTTP/1.1\r\nHost: {other}\r\n\r\n"
    );
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    let r1 = read_response(&mut s).await.unwrap();
    assert_eq!(r1, (200, format!("host={ok} path=/1 len=0 sum=0")));
    let r2 = read_response(&mut s).await.unwrap();
    assert_eq!(r2, (200, format!("host={ok} path=/2 len=3 sum=294")));
    let (status, body) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(&other), "{body}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    let (name, reason) = refusal_from(w.mark, local).await;
    assert_eq!(name, other);
    assert!(reason.contains("Host changed"), "{reason}");
    assert_eq!(w.http().get(), 1);
    assert_eq!(w.dns.count(&other), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_large_post_and_upgrade() {
    require_netns!();
    let w = Scenario::new("post")
        .host("ok")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let body: Vec<u8> = (0..20_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sum = body.iter().fold(0u64, |s, b| s + u64::from(*b));
    let s = TcpStream::connect(w.router.http).await.unwrap();
    let mut s = BufReader::new(s);
    let head = format!(
        "POST /big HTTP/1.1\r\nHost: {ok}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (mut r, mut wr) = s.get_mut().split();
    let send = async {
        wr.write_all(head.as_bytes()).await.unwrap();
        wr.write_all(&body).await.unwrap();
        // A second request on the same connection after the body: chunked.
        wr.write_all(format!("POST /c HTTP/1.1\r\nHost: {ok}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwxyz\r\n0\r\n\r\n").as_bytes())
            .await
            .unwrap();
    };
    let recv = async {
        let mut br = BufReader::new(&mut r);
        let a = read_response(&mut br).await.unwrap();
        let b = read_response(&mut br).await.unwrap();
        (a, b)
    };
    let ((), (a, b)) = tokio::join!(send, recv);
    assert_eq!(
        a,
        (
            200,
            format!("host={ok} path=/big len={} sum={sum}", body.len())
        )
    );
    assert_eq!(
        b.1,
        format!("host={ok} path=/c len=4 sum={}", 119 + 120 + 121 + 122)
    );
    drop(s);

    // WebSocket upgrade on a fresh connection: after the 101, raw bytes both ways.
    let mut s = TcpStream::connect(w.router.http).await.unwrap();
    s.write_all(websocket_request(&ok, "/ws").as_bytes())
        .await
        .unwrap();
    let mut br = BufReader::new(&mut s);
    let mut status = String::new();
    br.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    loop {
        let mut l = String::new();
        br.read_line(&mut l).await.unwrap();
        if l == "\r\n" {
            break;
        }
    }
    // Bytes that would be a request for another host are just data now.
    let smuggled = b"GET / HTTP/1.1\r\nHost: elsewhere\r\n\r\n";
    br.get_mut().write_all(smuggled).await.unwrap();
    let mut echoed = vec![0u8; smuggled.len()];
    br.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, smuggled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_websocket_upgrade_requests_are_validated() {
    require_netns!();
    let w = Scenario::new("wsreq")
        .host("ok")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let good = websocket_request(&ok, "/ws");
    let key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let cases: Vec<(&str, String)> = vec![
        (
            "bare Upgrade",
            format!("GET /ws HTTP/1.1\r\nHost: {ok}\r\nUpgrade: websocket\r\n\r\n"),
        ),
        ("no key", good.replace(key, "")),
        (
            "short key",
            good.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZQ=="),
        ),
        (
            "key not base64",
            good.replace("dGhlIHNhbXBsZSBub25jZQ==", "not-a-websocket-key-at-all"),
        ),
        ("version 8", good.replace("Version: 13", "Version: 8")),
        (
            "no version",
            good.replace("Sec-WebSocket-Version: 13\r\n", ""),
        ),
        (
            "no Connection: upgrade",
            good.replace("Connection: Upgrade", "Connection: keep-alive"),
        ),
        ("POST", good.replace("GET /ws", "POST /ws")),
        (
            "body",
            good.replace("\r\n\r\n", "\r\nContent-Length: 4\r\n\r\nabcd"),
        ),
        (
            "chunked body",
            good.replace(
                "\r\n\r\n",
                "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            ),
        ),
    ];
    for (what, req) in cases {
        let smuggled = format!("{req}GET / HTTP/1.1\r\nHost: elsewhere.invalid\r\n\r\n");
        let (local, r, rest) = http_exchange(w.router.http, smuggled.as_bytes()).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(status, 400, "{what}: {body}");
        assert!(
            rest.is_empty(),
            "{what}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        let (_, reason) = refusal_from(w.mark, local).await;
        assert!(reason.contains("WebSocket"), "{what}: {reason}");
    }
    assert_eq!(w.http().get(), 0, "a refused upgrade reached the upstream");

    // The genuine handshake still switches, and the 101 carries the accept for its key.
    let mut s = TcpStream::connect(w.router.http).await.unwrap();
    s.write_all(good.as_bytes()).await.unwrap();
    let mut br = BufReader::new(&mut s);
    let mut head = String::new();
    loop {
        let mut l = String::new();
        br.read_line(&mut l).await.unwrap();
        head.push_str(&l);
        if l == "\r\n" {
            break;
        }
    }
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains(&format!(
        "Sec-WebSocket-Accept: {}\r\n",
        websocket_accept("dGhlIHNhbXBsZSBub25jZQ==")
    )));
    br.get_mut().write_all(b"frames").await.unwrap();
    let mut echoed = [0u8; 6];
    br.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"frames");
    assert_eq!(w.http().get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_websocket_switch_needs_a_genuine_101() {
    require_netns!();
    let w = Scenario::new("ws101")
        .host("ok")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    // The upstream answers 101 but not as RFC 6455 requires: the router must not go raw, so the
    // request that follows (for another host) is never relayed; the client gets a 502 and a close.
    for path in ["/ws-noaccept", "/ws-badaccept", "/ws-other"] {
        let before = w.http().get();
        let req = format!(
            "{}GET / HTTP/1.1\r\nHost: elsewhere.invalid\r\n\r\n",
            websocket_request(&ok, path)
        );
        let (_, r, rest) = http_exchange(w.router.http, req.as_bytes()).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{path}: no response"));
        assert_eq!(status, 502, "{path}: {body}");
        assert!(body.contains("Sec-WebSocket-Accept"), "{path}: {body}");
        assert!(
            rest.is_empty(),
            "{path}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        assert_eq!(w.http().get(), before + 1);
    }

    // A valid handshake answered without a switch (here a 200): the answer is relayed, but nothing
    // more is forwarded on that connection.
    let req = format!(
        "{}GET /second HTTP/1.1\r\nHost: {ok}\r\n\r\n",
        websocket_request(&ok, "/plain")
    );
    let (_, r, rest) = http_exchange(w.router.http, req.as_bytes()).await;
    assert_eq!(
        r.unwrap(),
        (200, format!("host={ok} path=/plain len=0 sum=0"))
    );
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_head_hygiene() {
    require_netns!();
    let w = Scenario::new("hyg")
        .host("ok")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bare LF",
            format!("GET / HTTP/1.1\nHost: {ok}\n\n").into_bytes(),
            "bare LF",
        ),
        (
            "bare LF in one line",
            format!("GET / HTTP/1.1\r\nHost: {ok}\nX: y\r\n\r\n").into_bytes(),
            "bare LF",
        ),
        (
            "control byte",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a\x1bb\r\n\r\n").into_bytes(),
            "control or non-ASCII",
        ),
        (
            "DEL",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a\x7f\r\n\r\n").into_bytes(),
            "control or non-ASCII",
        ),
        (
            "high byte",
            [
                format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a").as_bytes(),
                &[0xff, 0x80],
                b"\r\n\r\n",
            ]
            .concat(),
            "control or non-ASCII",
        ),
        (
            "nul in host",
            format!("GET / HTTP/1.1\r\nHost: a\0{ok}\r\n\r\n").into_bytes(),
            "control or non-ASCII",
        ),
        (
            "obs-fold",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX: a\r\n b\r\n\r\n").into_bytes(),
            "obsolete line folding",
        ),
        (
            "X-Forwarded-Host",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX-Forwarded-Host: evil.invalid\r\n\r\n")
                .into_bytes(),
            "X-Forwarded-Host",
        ),
        (
            "X-Host",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nx-host: evil.invalid\r\n\r\n").into_bytes(),
            "X-Host",
        ),
        (
            "X-Original-Host",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nX-Original-Host: evil.invalid\r\n\r\n")
                .into_bytes(),
            "X-Original-Host",
        ),
        (
            "Forwarded",
            format!("GET / HTTP/1.1\r\nHost: {ok}\r\nForwarded: host=evil.invalid\r\n\r\n")
                .into_bytes(),
            "Forwarded",
        ),
    ];
    for (what, req, reason) in &cases {
        let (local, r, rest) = http_exchange(w.router.http, req).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(status, 400, "{what}: {body}");
        assert!(rest.is_empty(), "{what}");
        let (_, logged) = refusal_from(w.mark, local).await;
        assert!(
            logged.contains(reason),
            "{what}: {logged:?} lacks {reason:?}"
        );
    }
    assert_eq!(w.http().get(), 0, "a refused head reached the upstream");

    // On a kept-alive connection: the first request is answered, the offending one refused in order,
    // the one after it never forwarded.
    for (what, req, _) in &cases {
        let before = w.http().get();
        let mut all = format!("GET /1 HTTP/1.1\r\nHost: {ok}\r\n\r\n").into_bytes();
        all.extend_from_slice(req);
        all.extend_from_slice(format!("GET /3 HTTP/1.1\r\nHost: {ok}\r\n\r\n").as_bytes());
        let s = TcpStream::connect(w.router.http).await.unwrap();
        let mut s = BufReader::new(s);
        s.get_mut().write_all(&all).await.unwrap();
        let first = read_response(&mut s).await;
        assert_eq!(
            first,
            Some((200, format!("host={ok} path=/1 len=0 sum=0"))),
            "{what}"
        );
        let (status, body) = read_response(&mut s)
            .await
            .unwrap_or_else(|| panic!("{what}: no refusal"));
        assert_eq!(status, 400, "{what}: {body}");
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
        assert!(
            rest.is_empty(),
            "{what}: {:?}",
            String::from_utf8_lossy(&rest)
        );
        assert_eq!(w.http().get(), before + 1);
    }

    // Chunked framing with a bare LF is refused too (and nothing after it is forwarded).
    let req = format!(
        "POST /c HTTP/1.1\r\nHost: {ok}\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\nGET /x HTTP/1.1\r\nHost: {ok}\r\n\r\n"
    );
    let (local, r, rest) = http_exchange(w.router.http, req.as_bytes()).await;
    assert_eq!(r.map(|r| r.0), Some(400));
    assert!(rest.is_empty());
    let (_, logged) = refusal_from(w.mark, local).await;
    assert!(logged.contains("chunk size"), "{logged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_absolute_form_targets_are_strict() {
    require_netns!();
    let w = Scenario::new("abs")
        .host("ok")
        .http_upstream()
        .start()
        .await;
    let ok = w.name("ok");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "port 8080",
            format!("GET http://{ok}:8080/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "port other than 80",
        ),
        (
            "port 443",
            format!("GET http://{ok}:443/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "port other than 80",
        ),
        (
            "empty port",
            format!("GET http://{ok}:/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "port other than 80",
        ),
        (
            "userinfo",
            format!("GET http://evil.invalid@{ok}/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "fragment before path",
            format!("GET http://{ok}#@evil.invalid/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "fragment",
            format!("GET http://{ok}/#x HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "backslash",
            format!("GET http://{ok}\\@evil.invalid/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "malformed request target",
        ),
        (
            "other host",
            format!("GET http://evil.invalid/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
            "the request target names",
        ),
    ];
    for (what, req, reason) in &cases {
        let (local, r) = http_once(w.router.http, req).await;
        let (status, body) = r.unwrap_or_else(|| panic!("{what}: no response"));
        assert_eq!(status, 400, "{what}: {body}");
        let (_, logged) = refusal_from(w.mark, local).await;
        assert!(
            logged.contains(reason),
            "{what}: {logged:?} lacks {reason:?}"
        );
    }
    assert_eq!(w.http().get(), 0, "a refused target reached the upstream");
    let (_, r) = http_once(
        w.router.http,
        &format!("GET http://{ok}:80/p HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
    )
    .await;
    assert_eq!(
        r.unwrap(),
        (200, format!("host={ok} path=http://{ok}:80/p len=0 sum=0"))
    );

    // Later on a kept-alive connection: refused in order, after the first answer.
    let req = format!(
        "GET /1 HTTP/1.1\r\nHost: {ok}\r\n\r\nGET http://{ok}:8080/ HTTP/1.1\r\nHost: {ok}\r\n\r\n"
    );
    let s = TcpStream::connect(w.router.http).await.unwrap();
    let mut s = BufReader::new(s);
    s.get_mut().write_all(req.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.map(|r| r.0), Some(200));
    assert_eq!(read_response(&mut s).await.map(|r| r.0), Some(400));
}
