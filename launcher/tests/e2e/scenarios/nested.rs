//! Nested podman inside the sandbox (tests/e2e/scripts/nested.sh): shares the sandbox's DNS and
//! forwarders, and reaches nothing from a network of its own.

use std::fs;

use crate::mode::{chown_r, uid_gid};
use crate::suite::Suite;
use crate::TEST_USER;

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let dir = s.project("nested");
    fs::copy(s.artifacts.join("nested.tar"), dir.join("nested.tar")).unwrap();
    s.copy_script(&dir, "nested.sh");
    if s.mode.rootful() {
        // Rootful podman runs the sandbox as the project's owner; nested podman needs a non-root one.
        let (uid, gid, _) = uid_gid(TEST_USER);
        chown_r(&dir, uid, gid);
    }
    let r = s.launch(&dir, &["--exec", "bash", "./nested.sh"]);
    let mode = s.mode.clone();
    s.checks.script(
        &mode,
        &r.stdout,
        &[
            "nested-import",
            "nested-resolves",
            "nested-reaches-allowlisted",
            "nested-nxdomain",
            "nested-bridge-reaches-nothing",
        ],
    );
    if !r.stdout.contains("ok nested-import") {
        eprintln!("{}\n{}", r.stdout, r.stderr);
    }
}
