//! Two sessions from different directories at once (tests/e2e/scripts/two.sh): both work, and neither
//! reaches the other's router.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::suite::{finish, Suite};

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let mode = s.mode.clone();
    let a = s.project("two-a");
    let b = s.project("two-b");
    // Each session publishes its router's address, then tries the other session's router: sessions
    // are on separate internal networks and must not reach each other.
    for d in [&a, &b] {
        s.copy_script(d, "two.sh");
    }
    let cmd = ["--exec", "bash", "./two.sh"];
    let ca = s.launcher_command(&a, &cmd, &[]).spawn().unwrap();
    let cb = s.launcher_command(&b, &cmd, &[]).spawn().unwrap();
    let both = s.wait_for_sandbox(&a) && s.wait_for_sandbox(&b);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(a.join("router").exists() && b.join("router").exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let router_of = |d: &Path| fs::read_to_string(d.join("router")).unwrap_or_default();
    fs::write(a.join("other"), router_of(&b)).unwrap();
    fs::write(b.join("other"), router_of(&a)).unwrap();
    for d in [&a, &b] {
        fs::write(d.join("go"), "").unwrap();
    }
    let ra = finish(ca, Duration::from_secs(120));
    let rb = finish(cb, Duration::from_secs(120));
    s.checks.check(
        both && ra.code == Some(0)
            && rb.code == Some(0)
            && ra.stdout.contains("upstream=a")
            && rb.stdout.contains("upstream=a")
            && s.session_objects(&a).is_empty()
            && s.session_objects(&b).is_empty(),
        format!(
            "[{}] two sessions from different directories run at once: {} / {}",
            mode.name(),
            ra.stderr.trim(),
            rb.stderr.trim()
        ),
    );
    for r in [&ra, &rb] {
        s.checks
            .script(&mode, &r.stdout, &["other-router-dns", "other-router-http"]);
    }
}
