//! The proxy scenarios' watchdog: a scenario still alive past its deadline ends the test binary with a
//! message naming it, and removes its namespace, instead of hanging CI until its time limit.
//!
//! The hung scenario runs in a child process (this test binary, with a deadline of 2 s), since the
//! watchdog aborts the process it is in.

mod proxy_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proxy_support::{Scenario, HUNG_AFTER_ENV};

/// A scenario that never ends. Run only by [`a_hung_scenario_ends_the_test_binary`], in a child.
#[tokio::test]
#[ignore = "hangs on purpose: run in a child process by a_hung_scenario_ends_the_test_binary"]
async fn hangs_for_ever() {
    // Only in the child below: run by `--include-ignored`, it would hang its binary for 300 s.
    if std::env::var_os(HUNG_AFTER_ENV).is_none() {
        return;
    }
    require_netns!();
    let _running = Scenario::new("hung").host("ok").start().await;
    std::future::pending::<()>().await;
}

/// A scenario alive past its deadline: the binary aborts, saying which scenario hung, and the scenario's
/// namespace is gone.
#[test]
fn a_hung_scenario_ends_the_test_binary() {
    if !agent_sandbox_testkit::netns::require() {
        return;
    }
    // Through sh only to turn core dumps off: the abort is expected, a core file in the tree is not.
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -c 0; exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hangs_for_ever",
            "--ignored",
            "--test-threads",
            "1",
        ])
        .env(HUNG_AFTER_ENV, "2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its own deadline is 2 s; if the watchdog failed it would hang for ever, so give up after 120 s.
    let give_up = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the hung scenario's test binary was still running after 120 s: no watchdog");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("HUNG: the scenario hung"))
        .unwrap_or_else(|| panic!("no HUNG line naming the scenario: {stderr}"));
    assert!(line.contains("after 2 s"), "{line}");
    assert!(line.contains("is removed;"), "{line}");
    // The namespace it names is gone.
    let netns = line
        .split("Its namespace ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no namespace in: {line}"));
    assert!(
        !std::path::Path::new("/run/netns").join(netns).exists(),
        "{netns} is still there"
    );
}
