//! The relay in-process, with real loopback sockets: both directions, half-close each way, bulk
//! transfers, hundreds of concurrent connections, unreachable targets, bind failures and shutdown.

mod support;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_forwarder::{Forwarder, Options, Relay};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Long enough for a loaded CI machine, short enough that a hang fails the test rather than the run.
const PROMPTLY: Duration = Duration::from_secs(5);

/// A forwarder running in this test's runtime.
struct Running {
    /// The listen addresses as bound (port 0 resolved), in relay order.
    listen: Vec<SocketAddr>,
    /// Completing this stops the forwarder.
    stop: Option<oneshot::Sender<()>>,
    /// `run`'s result.
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PROMPTLY, self.task)
            .await
            .expect("the forwarder stops promptly")
            .expect("the forwarder task did not panic")
    }
}

/// Starts a forwarder relaying a fresh 127.0.0.1 port to each target.
async fn start(targets: &[SocketAddr], options: Options) -> Running {
    let relays: Vec<Relay> = targets
        .iter()
        .map(|&target| Relay {
            listen: "127.0.0.1:0".parse().unwrap(),
            target,
        })
        .collect();
    let forwarder = Forwarder::bind(&relays, options).await.expect("binding");
    let listen = forwarder.relays().iter().map(|r| r.listen).collect();
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(forwarder.run(async {
        let _ = stopped.await;
    }));
    Running {
        listen,
        stop: Some(stop),
        task,
    }
}

async fn target_listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// An echo server: each connection gets back what it sends, and a FIN after the client's FIN.
async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
    let (listener, addr) = target_listener().await;
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    (addr, task)
}

/// A loopback port with nothing listening on it.
async fn closed_port() -> SocketAddr {
    let (listener, addr) = target_listener().await;
    drop(listener);
    addr
}

/// Reads until the stream ends, with a deadline; a reset counts as an end and is returned as the error.
async fn read_to_end(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut got = Vec::new();
    tokio::time::timeout(PROMPTLY, stream.read_to_end(&mut got))
        .await
        .expect("the stream ends promptly")?;
    Ok(got)
}

#[tokio::test]
async fn relays_both_ways() {
    let (listener, target) = target_listener().await;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut ping = [0; 4];
        s.read_exact(&mut ping).await.unwrap();
        assert_eq!(&ping, b"ping");
        s.write_all(b"pong").await.unwrap();
    });
    let fwd = start(&[target], Options::default()).await;
    let mut client = TcpStream::connect(fwd.listen[0]).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    assert_eq!(read_to_end(&mut client).await.unwrap(), b"pong");
    server.await.unwrap();
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn client_half_close_keeps_the_answer_flowing() {
    // The client sends a request and shuts down its write half; the target answers only after it has
    // seen the end of the request.
    let (listener, target) = target_listener().await;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        s.read_to_end(&mut request).await.unwrap();
        assert_eq!(request, b"request");
        s.write_all(b"answer after EOF").await.unwrap();
        s.shutdown().await.unwrap();
    });
    let fwd = start(&[target], Options::default()).await;
    let mut client = TcpStream::connect(fwd.listen[0]).await.unwrap();
    client.write_all(b"request").await.unwrap();
    client.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut client).await.unwrap(), b"answer after EOF");
    server.await.unwrap();
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn target_half_close_keeps_the_client_flowing() {
    // The target sends a banner and shuts down its write half at once; the client reads the end of the
    // banner and only then sends its data, which must still arrive.
    let (listener, target) = target_listener().await;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"banner").await.unwrap();
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        rest
    });
    let fwd = start(&[target], Options::default()).await;
    let mut client = TcpStream::connect(fwd.listen[0]).await.unwrap();
    assert_eq!(read_to_end(&mut client).await.unwrap(), b"banner");
    client
        .write_all(b"sent after the target's EOF")
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    let rest = tokio::time::timeout(PROMPTLY, server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest, b"sent after the target's EOF");
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn bulk_both_directions_at_once() {
    // More than every socket buffer on the path holds, in both directions at once: the relay must keep
    // reading one side while the other is blocked, or this deadlocks.
    const SIZE: usize = 16 * 1024 * 1024;
    let (target, _echo) = echo_server().await;
    let fwd = start(&[target], Options::default()).await;
    let client = TcpStream::connect(fwd.listen[0]).await.unwrap();
    let (mut r, mut w) = client.into_split();
    let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let expected = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut got = Vec::with_capacity(SIZE);
    tokio::time::timeout(Duration::from_secs(30), r.read_to_end(&mut got))
        .await
        .expect("the bulk transfer finishes")
        .unwrap();
    writer.await.unwrap();
    assert!(
        got == expected,
        "echoed bytes differ ({} bytes back)",
        got.len()
    );
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn hundreds_of_concurrent_connections() {
    const CONNECTIONS: usize = 500;
    support::raise_nofile_limit();
    // A target that counts how many connections are open at the same time.
    let (listener, target) = target_listener().await;
    let open = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (open_s, peak_s) = (Arc::clone(&open), Arc::clone(&peak));
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let now = open_s.fetch_add(1, Ordering::SeqCst) + 1;
            peak_s.fetch_max(now, Ordering::SeqCst);
            let open_c = Arc::clone(&open_s);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
                open_c.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    let fwd = start(&[target], Options::default()).await;

    // Open all of them and check each is relayed, keeping every one open ...
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let mut c = TcpStream::connect(fwd.listen[0]).await.unwrap();
        let msg = format!("connection {i:04}");
        c.write_all(msg.as_bytes()).await.unwrap();
        let mut back = vec![0; msg.len()];
        tokio::time::timeout(PROMPTLY, c.read_exact(&mut back))
            .await
            .expect("echo arrives")
            .unwrap();
        assert_eq!(back, msg.as_bytes());
        clients.push(c);
    }
    assert_eq!(peak.load(Ordering::SeqCst), CONNECTIONS);

    // ... then close them all at once and check every one ends cleanly.
    let closing: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                c.shutdown().await.unwrap();
                read_to_end(&mut c).await.unwrap()
            })
        })
        .collect();
    for c in closing {
        assert!(c.await.unwrap().is_empty());
    }
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn refused_target_closes_the_client_promptly() {
    let target = closed_port().await;
    let fwd = start(&[target], Options::default()).await;
    for _ in 0..3 {
        let started = Instant::now();
        let mut client = TcpStream::connect(fwd.listen[0]).await.unwrap();
        match read_to_end(&mut client).await {
            Err(err) => assert_eq!(err.kind(), io::ErrorKind::ConnectionReset),
            Ok(got) => panic!("expected a reset, got EOF after {got:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn unresponsive_target_times_out() {
    // A listener whose accept queue is full and never drained: the kernel drops further SYNs, so a
    // connection attempt hangs, as it would toward a host that has gone away.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let target = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    // Connect until one attempt stalls: the queue is full from then on.
    loop {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(target)).await {
            Ok(Ok(stream)) => fillers.push(stream),
            Ok(Err(err)) => panic!("filling the accept queue: {err}"),
            Err(_) => break,
        }
        assert!(fillers.len() < 64, "the accept queue never filled");
    }

    let options = Options {
        connect_timeout: Duration::from_millis(300),
        ..Options::default()
    };
    let fwd = start(&[target], options).await;
    let started = Instant::now();
    let mut client = TcpStream::connect(fwd.listen[0]).await.unwrap();
    assert!(
        read_to_end(&mut client).await.is_err(),
        "closed with a reset"
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    fwd.stop().await.unwrap();
    drop(listener);
}

#[tokio::test]
async fn a_target_reset_reaches_the_client_as_a_reset() {
    // A cut stream must not look like a complete one: the client gets a reset, not a clean EOF.
    let (listener, target) = target_listener().await;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut byte = [0; 1];
        s.read_exact(&mut byte).await.unwrap();
        s.write_all(b"partial").await.unwrap();
        s.set_zero_linger().unwrap();
        drop(s);
    });
    let fwd = start(&[target], Options::default()).await;
    let mut client = TcpStream::connect(fwd.listen[0]).await.unwrap();
    client.write_all(b"x").await.unwrap();
    server.await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0; 64];
    let end = loop {
        match tokio::time::timeout(PROMPTLY, client.read(&mut buf))
            .await
            .unwrap()
        {
            Ok(0) => break Ok(()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(err) => break Err(err),
        }
    };
    assert_eq!(
        end.unwrap_err().kind(),
        io::ErrorKind::ConnectionReset,
        "got {got:?}"
    );
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn several_listeners_each_to_its_own_target() {
    let (a, _ea) = echo_server().await;
    let (listener_b, b) = target_listener().await;
    tokio::spawn(async move {
        let (mut s, _) = listener_b.accept().await.unwrap();
        s.write_all(b"this is b").await.unwrap();
    });
    let fwd = start(&[a, b], Options::default()).await;
    let mut to_a = TcpStream::connect(fwd.listen[0]).await.unwrap();
    to_a.write_all(b"this is a").await.unwrap();
    to_a.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut to_a).await.unwrap(), b"this is a");
    let mut to_b = TcpStream::connect(fwd.listen[1]).await.unwrap();
    assert_eq!(read_to_end(&mut to_b).await.unwrap(), b"this is b");
    fwd.stop().await.unwrap();
}

#[tokio::test]
async fn a_bind_failure_is_fatal_and_names_the_address() {
    let (taken, taken_addr) = target_listener().await;
    let free: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let target = closed_port().await;
    let relays = [
        Relay {
            listen: free,
            target,
        },
        Relay {
            listen: taken_addr,
            target,
        },
    ];
    let err = Forwarder::bind(&relays, Options::default())
        .await
        .expect_err("the second address is taken");
    let msg = format!("{err:#}");
    assert!(msg.contains(&taken_addr.to_string()), "{msg}");
    assert!(msg.contains("in use"), "{msg}");
    drop(taken);
}

#[tokio::test]
async fn shutdown_closes_listeners_and_connections() {
    let (target, _echo) = echo_server().await;
    let fwd = start(&[target], Options::default()).await;
    let listen = fwd.listen[0];
    let mut client = TcpStream::connect(listen).await.unwrap();
    client.write_all(b"hello").await.unwrap();
    let mut back = [0; 5];
    client.read_exact(&mut back).await.unwrap();

    let started = Instant::now();
    fwd.stop().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    // The relayed connection is gone (EOF or reset, either way it ends) ...
    let _ = read_to_end(&mut client).await;
    // ... and nothing listens any more.
    let err = TcpStream::connect(listen).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
}
