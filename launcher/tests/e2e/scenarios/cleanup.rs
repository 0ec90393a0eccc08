//! Every way a session ends leaves nothing behind: a normal exit, a failing command (its status is
//! the launcher's), and SIGTERM, SIGHUP and SIGINT to the launcher.

use std::fs;
use std::time::{Duration, Instant};

use crate::suite::{finish, Suite};

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let mode = s.mode.clone();
    let dir = s.project("exit-normal");
    let r = s.launch(&dir, &["--exec", "bash", "-c", "echo hello"]);
    s.checks.check(
        r.code == Some(0) && r.stdout.contains("hello") && s.session_objects(&dir).is_empty(),
        format!(
            "[{}] normal exit: status 0, output passed through, nothing left",
            mode.name()
        ),
    );
    let dir = s.project("exit-failing");
    let r = s.launch(&dir, &["--exec", "bash", "-c", "exit 3"]);
    s.checks.check(
        r.code == Some(3) && s.session_objects(&dir).is_empty(),
        format!(
            "[{}] a failing command: its status 3 is the launcher's, nothing left (got {:?})",
            mode.name(),
            r.code
        ),
    );
    // A state directory that cannot be made: the session starts all the same (the logs stay where
    // podman keeps them), says so, and leaves nothing.
    let dir = s.project("exit-no-state-dir");
    let r = s.launch_env(
        &dir,
        &["--no-inject", "--exec", "bash", "-c", "echo hello"],
        &[("XDG_STATE_HOME", "/dev/null/state".to_owned())],
    );
    s.checks.check(
        r.code == Some(0)
            && r.stdout.contains("hello")
            && r.stderr.contains("warning: cannot create /dev/null/state")
            && r.stderr.contains("stay where podman keeps them")
            && s.session_objects(&dir).is_empty(),
        format!(
            "[{}] no state directory: the session runs, with a warning, nothing left (status {:?}): {}",
            mode.name(),
            r.code,
            r.stderr.trim()
        ),
    );
    for (signal, name, code) in [
        (libc::SIGTERM, "SIGTERM", 143),
        (libc::SIGHUP, "SIGHUP", 129),
        (libc::SIGINT, "SIGINT (Ctrl-C)", 130),
    ] {
        let dir = s.project(&format!("exit-signal-{signal}"));
        let child = s
            .launcher_command(&dir, &["--exec", "sleep", "600"], &[])
            .spawn()
            .unwrap();
        let running = s.wait_for_sandbox(&dir);
        let pid: i32 = fs::read_to_string(s.pid_file(&dir))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let t = Instant::now();
        // SAFETY: kill(2) on the launcher this test started.
        unsafe {
            libc::kill(pid, signal);
        }
        let r = finish(child, Duration::from_secs(60));
        let left = s.session_objects(&dir);
        s.checks.check(
            running && r.code == Some(code) && left.is_empty(),
            format!(
                "[{}] {name} to the launcher: the command gets it, status {:?} (want {code}) in {:.1?}, nothing left: {left:?}",
                mode.name(),
                r.code,
                t.elapsed()
            ),
        );
    }
}
