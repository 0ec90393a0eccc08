//! Helpers shared by the forwarder's integration tests: loopback servers, the real binary as a child
//! process, and waiting without sleeping.
//!
//! Every test file compiles this module separately and uses a different part of it.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox_shared::logs::LISTENING_ON;

/// The forwarder binary built for this test run.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_agent-sandbox-forwarder");

/// A loopback port that was free a moment ago, for the binary (whose relay syntax refuses port 0). The
/// race with other processes is accepted: ephemeral ports are rarely reused this quickly.
pub(crate) fn free_port(ip: &str) -> SocketAddr {
    let listener = StdListener::bind((ip, 0)).expect("binding a probe port");
    listener.local_addr().expect("probe address")
}

/// Raises the soft open-file limit to the hard limit: tests holding hundreds of connections need more
/// than the 1024 descriptors some machines start with.
pub(crate) fn raise_nofile_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

/// Sends `signal` to `pid`.
pub(crate) fn kill(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

/// The real binary running as a child, with its stderr collected line by line. Killed on drop; when the
/// test is failing, everything it logged is printed.
pub(crate) struct Forwarder {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Forwarder {
    /// Starts `program args...` (the binary itself, or a wrapper such as prlimit that execs it).
    pub(crate) fn spawn_command(program: &str, args: &[String]) -> Forwarder {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning the forwarder");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log_writer = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                log_writer.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Forwarder { child, lines, log }
    }

    /// Starts the binary with these relays.
    pub(crate) fn spawn(relays: &[String]) -> Forwarder {
        Forwarder::spawn_command(BIN, relays)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub(crate) fn wait_for_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line with {needle:?} within {timeout:?}"),
            }
        }
    }

    /// Waits for the `listening on ADDR` lines of `count` listeners and returns the addresses.
    pub(crate) fn wait_listening(&self, count: usize) -> Vec<SocketAddr> {
        (0..count)
            .map(|_| {
                let line = self.wait_for_line(LISTENING_ON, Duration::from_secs(10));
                let rest = line.split(LISTENING_ON).nth(1).unwrap();
                rest.split_whitespace().next().unwrap().parse().unwrap()
            })
            .collect()
    }

    /// Everything logged so far.
    pub(crate) fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits for the process to exit, polling; `None` if it is still running after `timeout`.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// User plus system CPU time used so far, in clock ticks, from /proc/PID/stat.
    pub(crate) fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // The command name (field 2) may hold spaces; the fields after its closing parenthesis don't.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        // utime and stime are fields 14 and 15, i.e. 11 and 12 after the state (field 3).
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- forwarder stderr ---");
            for line in self.log() {
                eprintln!("{line}");
            }
        }
    }
}

/// Runs `program args...` to completion and returns its exit status and stderr.
pub(crate) fn run_to_end(program: &str, args: &[&str]) -> (ExitStatus, String) {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running the program");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
