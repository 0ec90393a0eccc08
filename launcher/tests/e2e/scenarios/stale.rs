//! Stale sessions: the objects of a launcher killed with SIGKILL are removed at the next start.

use std::fs;
use std::process::Stdio;
use std::time::Duration;

use crate::suite::{finish, Suite};

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let mode = s.mode.clone();
    let dir = s.project("killed");
    let child = s
        .launcher_command(&dir, &["--exec", "sleep", "600"], &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = s.wait_for_sandbox(&dir);
    let pid: i32 = fs::read_to_string(s.pid_file(&dir))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let _ = finish(child, Duration::from_secs(30));
    let left = s.session_objects(&dir);
    // Its log directory (named like its network) on the state directory's disk.
    let logs = left
        .iter()
        .find(|n| n.len() == "agent-sandbox-".len() + 12)
        .map(|network| {
            mode.home
                .join(".local/state/agent-sandbox/logs")
                .join(network)
        });
    let logs_left = logs
        .as_ref()
        .is_some_and(|d| d.join("router.log").is_file());
    let other = s.project("after-killed");
    let r = s.launch(&other, &["--exec", "true"]);
    let after = s.session_objects(&dir);
    s.checks.check(
        running && !left.is_empty() && r.code == Some(0) && after.is_empty(),
        format!(
            "[{}] objects of a SIGKILLed launcher ({} of them) are removed at the next start: {}",
            mode.name(),
            left.len(),
            r.stderr.trim()
        ),
    );
    s.checks.check(
        logs_left && logs.as_ref().is_some_and(|d| !d.exists()),
        format!(
            "[{}] the log directory of a SIGKILLed launcher is removed at the next start: {logs:?} (left: {logs_left})",
            mode.name(),
        ),
    );
}
