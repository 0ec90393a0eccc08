//! The real binary: exit codes and messages for bad command lines and bind failures, relaying, SIGTERM
//! and SIGINT, and behaviour when it runs out of file descriptors.

mod support;

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::{free_port, run_to_end, Forwarder, BIN};

/// A blocking echo server on a loopback port, one thread per connection, for as long as the test runs.
fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = stream.try_clone().unwrap();
                let _ = std::io::copy(&mut reader, &mut stream);
                let _ = stream.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

/// Sends `msg` through `addr` and checks it comes back, within `timeout`.
fn echo_through(
    addr: std::net::SocketAddr,
    msg: &[u8],
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(msg)?;
    let mut back = vec![0; msg.len()];
    stream.read_exact(&mut back)?;
    assert_eq!(back, msg);
    Ok(stream)
}

#[test]
fn bad_arguments_exit_2_and_name_the_argument() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "no relays given"),
        (&["127.0.0.1:8080"], "`127.0.0.1:8080` is not LISTEN=TARGET"),
        (
            &["127.0.0.1:8080=router:443"],
            "`router:443` is not an IP:PORT",
        ),
        (&["localhost:80=127.0.0.1:80"], "`localhost:80`"),
        (&["127.0.0.1:8080=10.0.0.1"], "`10.0.0.1`"),
        (&["127.0.0.1:0=127.0.0.1:80"], "port 0"),
        (
            &["--listen", "127.0.0.1:8080=127.0.0.1:80"],
            "unknown option `--listen`",
        ),
        (
            &["127.0.0.1:8080=127.0.0.1:80", "127.0.0.1:8080=127.0.0.1:81"],
            "listen address 127.0.0.1:8080 is given more than once",
        ),
    ];
    for (args, needle) in cases {
        let (status, stderr) = run_to_end(BIN, args);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(
            stderr.contains("Usage: agent-sandbox-forwarder [--relays FILE] [LISTEN=TARGET...]"),
            "{stderr}"
        );
    }
}

#[test]
fn help_and_version_exit_0() {
    for flag in ["--help", "-h", "--version", "-V"] {
        let output = std::process::Command::new(BIN).arg(flag).output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{flag}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            stdout.contains("agent-sandbox-forwarder"),
            "{flag}: {stdout}"
        );
    }
}

#[test]
fn a_bind_failure_exits_1_and_names_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let free = free_port("127.0.0.1");
    let relays = format!("{free}=127.0.0.1:9"); // bound first, then released
    let (status, stderr) = run_to_end(BIN, &[&relays, &format!("{addr}=127.0.0.1:9")]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("listening on"),
        "nothing is announced before all are bound: {stderr}"
    );
}

#[test]
fn relays_then_exits_at_once_on_sigterm_and_sigint() {
    let target = echo_server();
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let listen = free_port("127.0.0.1");
        let mut fwd = Forwarder::spawn(&[format!("{listen}={target}")]);
        assert_eq!(fwd.wait_listening(1), [listen]);
        // A connection in flight does not delay the exit.
        let _open = echo_through(listen, b"hello", Duration::from_secs(5)).unwrap();
        let started = Instant::now();
        support::kill(fwd.pid(), signal);
        let status = fwd.wait_exit(Duration::from_secs(5)).expect("exits");
        assert_eq!(status.code(), Some(0), "signal {signal}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
}

#[test]
fn loopback_addresses_other_than_127_0_0_1() {
    // The sandbox's relays listen on 127.0.0.2, 127.0.0.3, ...
    let target = echo_server();
    let (a, b) = (free_port("127.0.0.2"), free_port("127.0.0.3"));
    let fwd = Forwarder::spawn(&[format!("{a}={target}"), format!("{b}={target}")]);
    assert_eq!(fwd.wait_listening(2), [a, b]);
    echo_through(a, b"via 127.0.0.2", Duration::from_secs(5)).unwrap();
    echo_through(b, b"via 127.0.0.3", Duration::from_secs(5)).unwrap();
}

#[test]
fn out_of_file_descriptors_backs_off_then_recovers() {
    // With a tiny descriptor limit the forwarder runs out after a few connections. It must neither spin
    // on the failing accept nor stay stuck once connections close. Depending on whether the last free
    // descriptor count is even or odd, the exhaustion shows up in accept (EMFILE, backoff) or in the
    // connect to the target (the client is reset); two limits of different parity cover both.
    let target = echo_server();
    let mut backed_off = false;
    for limit in [24, 25] {
        let listen = free_port("127.0.0.1");
        let fwd = Forwarder::spawn_command(
            "prlimit",
            &[
                format!("--nofile={limit}:{limit}"),
                "--".into(),
                BIN.into(),
                format!("{listen}={target}"),
            ],
        );
        fwd.wait_listening(1);

        // Fill it up: keep every relayed connection open until one is no longer served.
        let mut held = Vec::new();
        let mut pending = Vec::new();
        loop {
            match echo_through(listen, b"x", Duration::from_millis(500)) {
                Ok(stream) => held.push(stream),
                Err(err) => {
                    assert!(
                        matches!(
                            err.kind(),
                            ErrorKind::WouldBlock
                                | ErrorKind::TimedOut
                                | ErrorKind::ConnectionReset
                                | ErrorKind::UnexpectedEof
                        ),
                        "{err}"
                    );
                    // Several waiting in the backlog make a spin visible if there is one.
                    for _ in 0..4 {
                        pending.push(TcpStream::connect(listen).unwrap());
                    }
                    break;
                }
            }
            assert!(held.len() < limit, "the limit never bit");
        }
        assert!(!held.is_empty(), "nothing was relayed under limit {limit}");

        // While exhausted, the forwarder is (nearly) idle.
        let before = fwd.cpu_ticks();
        std::thread::sleep(Duration::from_millis(500));
        let used = fwd.cpu_ticks() - before;
        assert!(
            used < 10,
            "{used} ticks of CPU in 0.5 s while out of descriptors (limit {limit})"
        );

        // Give the descriptors back: new connections are relayed again, promptly. The forwarder frees
        // them as it notices the closes, so the first attempts may still be reset.
        drop(held);
        drop(pending);
        let deadline = Instant::now() + Duration::from_secs(3);
        while let Err(err) = echo_through(listen, b"after", Duration::from_secs(1)) {
            assert!(
                Instant::now() < deadline,
                "not relaying again after 3 s: {err}"
            );
        }
        backed_off |= fwd
            .log()
            .iter()
            .any(|l| l.contains("accept failed, backing off"));
    }
    assert!(backed_off, "neither limit made accept fail");
}

/// Replaces `path` the way the launcher does: a temporary file renamed over it.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn sighup_rereads_the_relays_file() {
    let target = echo_server();
    let dir = std::env::temp_dir().join(format!("as-fwd-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("relays");
    let (a, b) = (free_port("127.0.0.2"), free_port("127.0.0.3"));
    // An argument relay stays through every reload.
    let fixed = free_port("127.0.0.4");
    replace_file(&file, &format!("# session relays\n{a}={target}\n"));
    let fwd = Forwarder::spawn(&[
        "--relays".to_owned(),
        file.display().to_string(),
        format!("{fixed}={target}"),
    ]);
    let mut up = fwd.wait_listening(2);
    up.sort();
    assert_eq!(up, [a, fixed]);
    fwd.wait_for_line("ready: 2 relays", Duration::from_secs(5));
    let mut open = echo_through(a, b"before", Duration::from_secs(5)).unwrap();

    // b added, a removed: b relays, a refuses new connections, the connection open through a goes on.
    replace_file(&file, &format!("{b}={target}\n"));
    support::kill(fwd.pid(), libc::SIGHUP);
    let line = fwd.wait_for_line("reloaded:", Duration::from_secs(5));
    assert!(line.contains("2 relays, 1 opened, 1 closed"), "{line}");
    echo_through(b, b"after", Duration::from_secs(5)).unwrap();
    echo_through(fixed, b"fixed", Duration::from_secs(5)).unwrap();
    let err = TcpStream::connect_timeout(&a, Duration::from_secs(5)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    open.write_all(b"still").unwrap();
    let mut back = [0; 5];
    open.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still");

    // An invalid file, and one whose new address is taken, change nothing.
    let taken = TcpListener::bind("127.0.0.5:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    for (text, needle) in [
        (format!("{b}={target}\nnot a relay\n"), "line 2"),
        (format!("{b}={target}\n{b}={target}\n"), "more than once"),
        (
            format!("{b}={target}\n{taken_addr}={target}\n"),
            "cannot listen on",
        ),
    ] {
        replace_file(&file, &text);
        support::kill(fwd.pid(), libc::SIGHUP);
        let line = fwd.wait_for_line("reload refused", Duration::from_secs(5));
        assert!(line.contains(needle), "{line}");
        echo_through(b, b"unchanged", Duration::from_secs(5)).unwrap();
    }
    // A missing file too.
    std::fs::remove_file(&file).unwrap();
    support::kill(fwd.pid(), libc::SIGHUP);
    fwd.wait_for_line("reload refused", Duration::from_secs(5));
    echo_through(b, b"unchanged", Duration::from_secs(5)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_empty_relays_file_starts_and_grows() {
    let target = echo_server();
    let dir = std::env::temp_dir().join(format!("as-fwd-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("relays");
    replace_file(&file, "");
    let fwd = Forwarder::spawn(&["--relays".to_owned(), file.display().to_string()]);
    // SIGHUP's handler is installed before this line: a signal sent earlier would end the process.
    fwd.wait_for_line("ready: 0 relays", Duration::from_secs(10));
    let a = free_port("127.0.0.2");
    replace_file(&file, &format!("{a}={target}\n"));
    support::kill(fwd.pid(), libc::SIGHUP);
    let line = fwd.wait_for_line("reloaded:", Duration::from_secs(5));
    assert!(line.contains("1 relays, 1 opened, 0 closed"), "{line}");
    echo_through(a, b"grown", Duration::from_secs(5)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
