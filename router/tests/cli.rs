//! The router's command line: `--check`, exit statuses and error messages, run as the real binary.

mod common;

use std::process::{Command, Output};

use common::{temp_dir, write_file};

fn router(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-sandbox-router"))
        .args(args)
        .output()
        .expect("run router")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_prints_the_effective_plan() {
    let dir = temp_dir("cli");
    let list = write_file(
        &dir,
        "allowed-hosts",
        "api.anthropic.com\n.example.com\ndb.example.com:5432\n",
    );
    let out = router(&[
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "192.0.2.1",
        "--forward",
        "db.example.com:5432=127.0.0.1:15432",
        "--resolver",
        "192.0.2.53",
        "--peek-timeout",
        "3",
        "--check",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for needle in [
        "dns    0.0.0.0:53",
        "http   0.0.0.0:80",
        "https  0.0.0.0:443",
        "127.0.0.1:15432  -> db.example.com:5432",
        "api.anthropic.com",
        ".example.com (and subdomains)",
        "A 192.0.2.1",
        "upstream resolvers: 192.0.2.53:53",
        "peek timeout 3s",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
}

#[test]
fn bad_allowlist_exits_1_with_every_error_and_its_line() {
    let dir = temp_dir("cli");
    let list = write_file(
        &dir,
        "allowed-hosts",
        "ok.example\n10.0.0.1\n*.example.com\n.x.com:22\n",
    );
    let out = router(&[
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "192.0.2.1",
        "--check",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let path = list.display().to_string();
    for line in [2, 3, 4] {
        assert!(
            stderr.contains(&format!("{path}:{line}:")),
            "line {line} missing:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("write .example.com for the domain"),
        "{stderr}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let dir = temp_dir("cli");
    let list = write_file(&dir, "allowed-hosts", "db.example.com:5432\n");
    let l = list.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "--bogus"),
        (&[], "--allowlist"),
        (&["--allowlist", l], "--answer"),
        (&["--allowlist", l, "--answer", "not-an-ip"], "not-an-ip"),
        (
            &[
                "--allowlist",
                l,
                "--answer",
                "192.0.2.1",
                "--forward",
                "other.example.com:5432=127.0.0.1:1",
            ],
            "no entry other.example.com:5432",
        ),
        (
            &[
                "--allowlist",
                l,
                "--answer",
                "192.0.2.1",
                "--forward",
                "garbage",
            ],
            "HOST:PORT=ADDR",
        ),
        (
            &[
                "--allowlist",
                l,
                "--answer",
                "192.0.2.1",
                "--resolver",
                "dns.google",
            ],
            "dns.google",
        ),
        (
            &[
                "--allowlist",
                l,
                "--answer",
                "192.0.2.1",
                "--peek-timeout",
                "0",
            ],
            "peek-timeout",
        ),
        (
            &[
                "--allowlist",
                l,
                "--answer",
                "192.0.2.1",
                "--log-format",
                "xml",
            ],
            "xml",
        ),
        (
            &["--allowlist", l, "--answer", "192.0.2.1", "--threads", "0"],
            "--threads",
        ),
    ];
    for (args, needle) in cases {
        let out = router(args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} missing from {stderr}"
        );
    }
}

#[test]
fn conflicting_listeners_exit_1() {
    let dir = temp_dir("cli");
    let list = write_file(
        &dir,
        "allowed-hosts",
        "db.example.com:443\nssh.example.com:22\n",
    );
    let out = router(&[
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "192.0.2.1",
        "--forward",
        "ssh.example.com:22=0.0.0.0:443",
        "--check",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("would both listen on 0.0.0.0:443"),
        "{stderr}"
    );
}

#[test]
fn bind_failure_names_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = temp_dir("cli");
    let list = write_file(&dir, "allowed-hosts", "api.anthropic.com\n");
    let out = router(&[
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "192.0.2.1",
        "--dns",
        "127.0.0.1:0",
        "--http",
        &addr,
        "--https",
        "127.0.0.1:0",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen for HTTP on {addr}")),
        "{stderr}"
    );
}

#[test]
fn bad_config_file_exits_1() {
    let dir = temp_dir("cli");
    let cfg = write_file(&dir, "router.toml", "hosts = [\"a.com\"]\nbogus = true\n");
    let out = router(&["--config", cfg.to_str().unwrap(), "--check"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&cfg.display().to_string()), "{stderr}");
    let missing = router(&["--config", "/nonexistent/router.toml", "--check"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing).1.contains("/nonexistent/router.toml"));
}

/// A configuration that parses but does not validate: every problem is listed with the file and the
/// line that holds it (issue 3: "print every error with file and line"; an auditor found the file and
/// lines missing from these, where TOML syntax errors had them).
#[test]
fn invalid_config_values_name_the_file_and_line() {
    use agent_sandbox_shared::config::RouterConfig;
    use agent_sandbox_shared::{Allowlist, Policy};
    let dir = temp_dir("cli");
    let list = Allowlist::parse("ok.example\n", "t").unwrap();
    let mut config =
        RouterConfig::from_policy(&Policy::new(&list), std::net::Ipv4Addr::new(192, 0, 2, 1));
    config.hosts.push("1.2.3.4".into());
    config.max_connections = 0;
    let toml = config.to_toml();
    let lines: Vec<&str> = toml.lines().collect();
    let line_of = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap() + 1;
    let cfg = write_file(&dir, "router.toml", &toml);
    let out = router(&["--config", cfg.to_str().unwrap(), "--check"]);
    let (_, stderr) = text(&out);
    let path = cfg.display().to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("router configuration {path} is not valid")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{path}:{}: hosts entry `1.2.3.4`",
            line_of("\"1.2.3.4\"")
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{path}:{}: max_connections is 0",
            line_of("max_connections =")
        )),
        "{stderr}"
    );
}

/// The body of the router's answer to a request for a name not on the allowlist.
fn refusal_body(router: &common::Router) -> String {
    use std::io::{Read as _, Write as _};
    let mut c = std::net::TcpStream::connect(router.addr("http")).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: refused.test\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    answer
}

/// Refused clients are told which allowlist to edit: the one the launcher names in the configuration,
/// the `--allowlist` file of a standalone router, or (configuration without one) no file at all.
#[test]
fn refusals_name_the_allowlist_in_use() {
    let dir = temp_dir("cli");
    let list = write_file(&dir, "gateway-hosts", "allowed.test\n");
    let standalone = common::Router::start_loopback(&list, &[]);
    let body = refusal_body(&standalone);
    assert!(
        body.contains(&format!("add it to {} (", list.display())),
        "{body}"
    );
    drop(standalone);

    let config = |allowlist: &str| {
        format!(
            "hosts = [\"allowed.test\"]\nresolvers = [\"127.0.0.1:9\"]\n{allowlist}\
             [listen]\nhttp = \"127.0.0.1:0\"\n[answers]\ndefault = \"127.0.0.2\"\n"
        )
    };
    let session = write_file(
        &dir,
        "session.toml",
        &config("allowlist = \"/home/me/.config/elsewhere/allowed-hosts\"\n"),
    );
    let launched = common::Router::start(&["--config", session.to_str().unwrap()], 1);
    let body = refusal_body(&launched);
    assert!(
        body.contains("add it to /home/me/.config/elsewhere/allowed-hosts ("),
        "{body}"
    );
    drop(launched);

    let bare = write_file(&dir, "bare.toml", &config(""));
    let bare = common::Router::start(&["--config", bare.to_str().unwrap()], 1);
    let body = refusal_body(&bare);
    assert!(
        body.contains("add it to the router's allowlist ("),
        "{body}"
    );
    assert!(!body.contains("allowed-hosts"), "{body}");
    drop(bare);
}

/// An `[inject]` section whose files cannot be read stops the router at start, naming the file: it
/// must not serve with placeholders it cannot swap (issue 20).
#[test]
fn unreadable_inject_files_stop_the_start() {
    let dir = temp_dir("cli");
    let ca = dir.join("missing-ca.pem");
    let cfg = write_file(
        &dir,
        "router.toml",
        &format!(
            "hosts = [\"api.example.test\"]\n[listen]\ndns = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nhttps = \"127.0.0.1:0\"\n\
             [answers]\ndefault = \"127.0.0.2\"\n\
             [inject]\nca_cert = {ca:?}\nca_key = {:?}\n\
             [inject.api_key]\nhosts = [\"api.example.test\"]\nplaceholder = \"sk-ant-api03-placeholder-0000000000\"\nkey_file = {:?}\n",
            dir.join("missing-ca.key"),
            dir.join("key"),
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-sandbox-router"))
        .args(["--config", cfg.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run router");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the router started despite an unreadable [inject] section");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("credential injection") && stderr.contains(ca.to_str().unwrap()),
        "{stderr}"
    );
}

/// A router process, killed however the test ends (a failed assertion included).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The router on loopback (DNS, HTTP and TLS on port 0, a resolver address where nothing listens),
/// allowing `a.test` from a list written to `dir`, logging at info to a pipe.
fn loopback_router(dir: &std::path::Path) -> Command {
    let list = write_file(dir, "allowed-hosts", "a.test\n");
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-sandbox-router"));
    command
        .args(common::loopback_args(&list))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    command
}

/// The router, started with its hard and soft descriptor limits at `nofile` and `--max-connections
/// max`, bulk data spliced or not, until it has logged `what` (or its listeners, which come after the
/// check): the log so far.
fn start_with_nofile(nofile: u64, max: &str, what: &str, splice: bool) -> String {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    let dir = temp_dir("nofile");
    let mut command = loopback_router(&dir);
    command.args(["--max-connections", max]);
    if splice {
        command.env("AGENT_SANDBOX_SPLICE", "1");
    } else {
        command.env_remove("AGENT_SANDBOX_SPLICE");
    }
    // SAFETY: setrlimit is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = Killed(command.spawn().expect("run router"));
    let stderr = child.0.stderr.take().unwrap();
    let mut log = String::new();
    // The listeners are reported after the check; the reader ends when the router is killed.
    for line in std::io::BufReader::new(stderr).lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains(what) || line.contains("(https)") {
            break;
        }
    }
    drop(child);
    log
}

/// A descriptor limit too low for `--max-connections` is said at start, with what to raise it to; a
/// large enough one is not mentioned. Bulk data is copied by default (two descriptors a connection); with
/// `AGENT_SANDBOX_SPLICE` a limit that holds every connection but not every pipe is noted.
#[test]
fn a_low_descriptor_limit_is_reported_at_start() {
    for splice in [false, true] {
        let log = start_with_nofile(512, "1024", "descriptor limit", splice);
        assert!(
            log.contains("WARN")
                && log
                    .contains("the descriptor limit (RLIMIT_NOFILE) is 512, but 1024 connections")
                && log.contains("need about 2176")
                && log.contains("lower --max-connections to 192"),
            "splice {splice}: {log}"
        );
    }
    // Copying: every connection fits, and no pipe is ever asked for.
    let log = start_with_nofile(4000, "1024", "descriptor limit", false);
    assert!(log.contains("(https)"), "{log}");
    assert!(!log.contains("descriptor limit"), "{log}");
    let log = start_with_nofile(4000, "1024", "descriptor limit", true);
    assert!(
        log.contains("INFO") && log.contains("room for 912 splice pipes"),
        "{log}"
    );
    let log = start_with_nofile(6272, "1024", "descriptor limit", true);
    assert!(log.contains("(https)"), "{log}");
    assert!(!log.contains("descriptor limit"), "{log}");
}

/// A stderr whose reader has gone (a log pipe whose consumer died) does not stop the router: DNS still
/// answers, and refuses, with lines it cannot write, and SIGTERM still stops it with status 0. Before,
/// tracing-subscriber reported each failed line with `eprintln!` to the same stderr, which panicked in
/// whatever task logged: the signal task's panic left SIGTERM unanswered.
#[test]
fn a_broken_log_pipe_stops_neither_serving_nor_shutdown() {
    use std::io::BufRead as _;
    let dir = temp_dir("epipe");
    let mut child = Killed(loopback_router(&dir).spawn().expect("run router"));
    let stderr = child.0.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    let dns: std::net::SocketAddr = loop {
        let line = lines.next().expect("the router's log").unwrap();
        if let Some(rest) = line.split(agent_sandbox_shared::logs::LISTENING_ON).nth(1) {
            if let Some(addr) = rest.strip_suffix(" (dns/udp)") {
                break addr.parse().unwrap();
            }
        }
    };
    // The reader goes: every line from now on fails to be written.
    drop(lines);
    for round in 0..3 {
        let allowed = common::udp_query(dns, "a.test", hickory_proto::rr::RecordType::A);
        assert_eq!(
            allowed.code,
            hickory_proto::op::ResponseCode::NoError,
            "round {round}"
        );
        // A refusal is logged: the line that used to take the DNS task down.
        let refused = common::udp_query(dns, "b.test", hickory_proto::rr::RecordType::A);
        assert_eq!(
            refused.code,
            hickory_proto::op::ResponseCode::NXDomain,
            "round {round}"
        );
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(i32::try_from(child.0.id()).unwrap(), libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGTERM was not acted on with the log pipe broken"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}
