//! The router image, run with podman the way it is documented in containers/router/Containerfile: the
//! router answers DNS from the container (an allowlisted name gets the `--answer` address, an unlisted one
//! NXDOMAIN), and the forwarder from the same image relays a connection to it. Both run as the image's
//! non-root user with `--cap-drop ALL --cap-add NET_BIND_SERVICE` on a read-only root, binding ports below
//! 1024.
//!
//! Needs rootful podman (and root, to enter a container's network namespace) and the image, so it is
//! ignored by plain `cargo test`; `make test` builds the image and runs it (`make image-test`). Everything
//! it creates has a name with this process's id and is removed on drop, pass or fail. Its traffic stays on
//! an --internal network and loopback: it is sent from inside the forwarder container.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The image under test: the launcher's override variable, else the `make build` tag.
fn image() -> String {
    std::env::var("AGENT_SANDBOX_ROUTER_IMAGE")
        .unwrap_or_else(|_| "localhost/agent-sandbox-router:dev".into())
}

/// The only place that runs podman in this test. Uses the project's settings for the test machines
/// (runc, explicit ulimits) unless the caller chose others.
fn podman(args: &[&str]) -> Output {
    let mut cmd = Command::new("podman");
    if std::env::var_os("CONTAINERS_CONF").is_none() {
        cmd.env(
            "CONTAINERS_CONF",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/containers.conf"),
        );
    }
    cmd.args(args)
        .output()
        .unwrap_or_else(|err| panic!("running podman {args:?}: {err}"))
}

/// `podman args...`, which must succeed; returns its trimmed stdout.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// What this test created, removed on drop (and only that).
struct Created {
    /// Prefix of every name: unique per test process.
    prefix: String,
    containers: Vec<String>,
    networks: Vec<String>,
    dir: PathBuf,
}

impl Created {
    fn new() -> Created {
        let prefix = format!("agent-sandbox-imagetest-{}", std::process::id());
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).unwrap();
        Created {
            prefix,
            containers: Vec::new(),
            networks: Vec::new(),
            dir,
        }
    }

    /// An `--internal` network: the containers on it have no route out, whatever they try.
    fn network(&mut self) -> String {
        let name = format!("{}-net", self.prefix);
        podman_ok(&["network", "create", "--internal", "--disable-dns", &name]);
        self.networks.push(name.clone());
        name
    }

    /// Starts a detached container named PREFIX-`role` and returns its name.
    fn run(&mut self, role: &str, options: &[&str], args: &[&str]) -> String {
        let name = format!("{}-{role}", self.prefix);
        // Recorded before starting, so a container that was created but failed to start is removed too.
        self.containers.push(name.clone());
        let image = image();
        let mut all = vec!["run", "--detach", "--name", &name];
        all.extend_from_slice(options);
        all.push(&image);
        all.extend_from_slice(args);
        podman_ok(&all);
        name
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        for name in self.containers.iter().rev() {
            if std::thread::panicking() {
                let logs = podman(&["logs", name]);
                eprintln!(
                    "--- podman logs {name} ---\n{}{}",
                    String::from_utf8_lossy(&logs.stdout),
                    String::from_utf8_lossy(&logs.stderr)
                );
            }
            let _ = podman(&["rm", "--force", "--time", "0", name]);
        }
        for name in &self.networks {
            let _ = podman(&["network", "rm", "--force", name]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the container's log has a line containing every one of `needles`.
fn wait_for_log(container: &str, needles: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = podman(&["logs", container]);
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if needles.iter().all(|n| log.contains(n)) {
            return;
        }
        let running = podman_ok(&["inspect", "--format", "{{.State.Running}}", container]);
        assert!(running == "true", "{container} exited:\n{log}");
        assert!(
            Instant::now() < deadline,
            "{container}: no {needles:?} in:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The container's address on `network`.
fn address(container: &str, network: &str) -> Ipv4Addr {
    let format = format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}");
    podman_ok(&["inspect", "--format", &format, container])
        .parse()
        .unwrap()
}

/// Runs `f` on a thread that has joined the network namespace at `netns` (setns only moves the calling
/// thread), and propagates its panic.
fn in_netns(netns: &str, f: impl FnOnce() + Send + 'static) {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(netns).unwrap_or_else(|err| panic!("{netns}: {err}"));
    let joined = std::thread::spawn(move || {
        // SAFETY: setns only changes this thread's network namespace; `file` is an open namespace file.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f();
    })
    .join();
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
}

/// The options the Containerfile documents for both binaries.
const CONFINED: &[&str] = &[
    "--read-only",
    "--cap-drop",
    "ALL",
    "--cap-add",
    "NET_BIND_SERVICE",
];

#[test]
#[ignore = "needs podman and the router image: run by `make image-test`"]
fn router_and_forwarder_from_the_image() {
    let image = image();
    let exists = podman(&["image", "exists", &image]);
    assert!(
        exists.status.success(),
        "no image {image}: run `make router-image` first"
    );

    // The image itself: small, non-root, the router as entrypoint.
    let facts = podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Size}} {{.Config.User}} {{json .Config.Entrypoint}}",
        &image,
    ]);
    let facts: Vec<&str> = facts.split(' ').collect();
    let size: u64 = facts[0].parse().unwrap();
    assert!(size < 10_000_000, "image is {size} bytes");
    let uid = facts[1].split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|uid| uid != 0),
        "USER {}",
        facts[1]
    );
    assert_eq!(facts[2], r#"["/agent-sandbox-router"]"#);

    let mut created = Created::new();
    let network = created.network();
    let allowlist = created.dir.join("allowed-hosts");
    std::fs::write(&allowlist, "allowed.test\n.wild.test\n").unwrap();
    let mount = format!("{}:/allowed-hosts:ro", allowlist.display());
    let answer = Ipv4Addr::new(192, 0, 2, 10);
    let answer_arg = answer.to_string();

    // The router, standalone mode, DNS on :53 (the default).
    let mut options = vec!["--network", &network, "-v", &mount];
    options.extend_from_slice(CONFINED);
    let router = created.run(
        "router",
        &options,
        &["--allowlist", "/allowed-hosts", "--answer", &answer_arg],
    );
    wait_for_log(
        &router,
        &[
            "listening on 0.0.0.0:53 (dns/udp)",
            "listening on 0.0.0.0:53 (dns/tcp)",
        ],
    );
    let dns = SocketAddr::from((address(&router, &network), 53));

    // The forwarder from the same image, as in the sandbox pod: on a loopback address other than
    // 127.0.0.1, port 443 as non-root, relaying to the router (to its DNS over TCP, which is enough to see
    // a whole exchange relayed).
    let mut options = vec![
        "--network",
        &network,
        "--entrypoint",
        "/agent-sandbox-forwarder",
    ];
    options.extend_from_slice(CONFINED);
    let relay = format!("127.0.0.2:443={dns}");
    let forwarder = created.run("forwarder", &options, &[&relay]);
    wait_for_log(&forwarder, &["listening on 127.0.0.2:443"]);

    // The queries are sent from inside the forwarder's network namespace. The host has no route into an
    // --internal network without a gateway (its packets would take the default route out), and from in
    // there every address is either that network or loopback.
    let netns = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &forwarder]);
    let netns = format!("/proc/{netns}/ns/net");
    let relayed: SocketAddr = "127.0.0.2:443".parse().unwrap();
    in_netns(&netns, move || {
        for name in [
            "allowed.test",
            "ALLOWED.test.",
            "deep.sub.wild.test",
            "wild.test",
        ] {
            let reply = dns::query_udp(dns, name);
            assert_eq!((reply.rcode, reply.a), (0, vec![answer]), "{name}");
        }
        for name in ["unlisted.test", "allowed.test.evil.test", "notwild.test"] {
            let reply = dns::query_udp(dns, name);
            assert_eq!((reply.rcode, reply.a), (dns::NXDOMAIN, vec![]), "{name}");
        }
        let reply = dns::query_tcp(relayed, "allowed.test");
        assert_eq!(
            (reply.rcode, reply.a),
            (0, vec![answer]),
            "through the forwarder"
        );
        let reply = dns::query_tcp(relayed, "unlisted.test");
        assert_eq!(reply.rcode, dns::NXDOMAIN, "through the forwarder");
    });

    // NET_BIND_SERVICE is what makes :443 work for the non-root user: without it the bind fails, and
    // the failure names the address.
    let denied_name = format!("{}-denied", created.prefix);
    created.containers.push(denied_name.clone());
    let denied = podman(&[
        "run",
        "--rm",
        "--name",
        &denied_name,
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--entrypoint",
        "/agent-sandbox-forwarder",
        &image,
        "0.0.0.0:443=127.0.0.1:9",
    ]);
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert_eq!(denied.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot listen on 0.0.0.0:443"), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");

    // As PID 1 the forwarder still stops at once on SIGTERM, with status 0.
    let started = Instant::now();
    podman_ok(&["stop", "--time", "10", &forwarder]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "podman stop took {took:?}");
    let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &forwarder]);
    assert_eq!(code, "0");
}

/// Just enough DNS to ask for an A record and read the answer, over UDP or TCP.
mod dns {
    use std::io::{Read as _, Write as _};
    use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
    use std::time::Duration;

    pub(crate) const NXDOMAIN: u8 = 3;

    /// The parts of a reply the test looks at.
    #[derive(Debug)]
    pub(crate) struct Reply {
        pub(crate) rcode: u8,
        pub(crate) a: Vec<Ipv4Addr>,
    }

    fn query(id: u16, name: &str) -> Vec<u8> {
        let mut q = Vec::new();
        q.extend_from_slice(&id.to_be_bytes());
        q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
        for label in name.trim_end_matches('.').split('.') {
            q.push(u8::try_from(label.len()).unwrap());
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]); // root; type A; class IN
        q
    }

    /// Skips a possibly compressed name starting at `at`; returns the offset after it.
    fn skip_name(msg: &[u8], mut at: usize) -> usize {
        loop {
            let len = msg[at];
            if len & 0xc0 == 0xc0 {
                return at + 2;
            }
            at += 1 + usize::from(len);
            if len == 0 {
                return at;
            }
        }
    }

    fn parse(id: u16, msg: &[u8]) -> Reply {
        assert!(msg.len() >= 12, "short reply {msg:?}");
        assert_eq!(u16::from_be_bytes([msg[0], msg[1]]), id, "reply id");
        assert!(msg[2] & 0x80 != 0, "not a response");
        let count = |i: usize| usize::from(u16::from_be_bytes([msg[i], msg[i + 1]]));
        let (questions, answers) = (count(4), count(6));
        let mut at = 12;
        for _ in 0..questions {
            at = skip_name(msg, at) + 4;
        }
        let mut a = Vec::new();
        for _ in 0..answers {
            at = skip_name(msg, at);
            let rtype = count(at);
            let rdlen = count(at + 8);
            at += 10;
            if rtype == 1 && rdlen == 4 {
                a.push(Ipv4Addr::new(
                    msg[at],
                    msg[at + 1],
                    msg[at + 2],
                    msg[at + 3],
                ));
            }
            at += rdlen;
        }
        Reply {
            rcode: msg[3] & 0x0f,
            a,
        }
    }

    fn new_id(name: &str) -> u16 {
        // Distinct per query and process; no randomness needed against our own server.
        let seed = std::process::id() as usize + name.len() * 7919;
        (seed % 65_536) as u16
    }

    pub(crate) fn query_udp(server: SocketAddr, name: &str) -> Reply {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let id = new_id(name);
        let q = query(id, name);
        let mut buf = [0; 1500];
        // UDP may lose a datagram: a few tries before failing.
        for _ in 0..3 {
            socket.send_to(&q, server).unwrap();
            if let Ok((n, _)) = socket.recv_from(&mut buf) {
                return parse(id, &buf[..n]);
            }
        }
        panic!("no DNS reply from {server} for {name}");
    }

    pub(crate) fn query_tcp(server: SocketAddr, name: &str) -> Reply {
        let mut stream = TcpStream::connect_timeout(&server, Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let id = new_id(name);
        let q = query(id, name);
        let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        stream.write_all(&framed).unwrap();
        let mut len = [0; 2];
        stream.read_exact(&mut len).unwrap();
        let mut msg = vec![0; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut msg).unwrap();
        parse(id, &msg)
    }
}
