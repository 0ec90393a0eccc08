//! The first sessions: one runs `true` and exits 0. The first session after images are loaded pays for
//! podman's one-time id-mapped copy of the image (rootless); it is timed apart (with a bare `podman run`
//! for comparison) so later timings mean something.

use std::time::Instant;

use crate::suite::Suite;
use crate::SANDBOX_IMAGE;

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let dir = s.project("warm-up");
    let t = Instant::now();
    let r = s.launch(&dir, &["--exec", "true"]);
    let first = t.elapsed();
    let t = Instant::now();
    let r2 = s.launch(&dir, &["--exec", "true"]);
    let second = t.elapsed();
    eprintln!(
        "  first session {first:.1?}, second {second:.1?} ({})",
        s.mode.name()
    );
    let name = s.mode.name().to_owned();
    s.checks.check(
        r.code == Some(0) && r2.code == Some(0),
        format!(
            "[{name}] a session runs `true` and exits 0: {}",
            r.stderr.trim()
        ),
    );
    // Bare podman for comparison: the same image, no topology.
    let t = Instant::now();
    let _ = s
        .mode
        .podman(&["run", "--rm", "--network", "none", SANDBOX_IMAGE, "true"]);
    eprintln!("  bare `podman run --rm IMAGE true`: {:.1?}", t.elapsed());
}
