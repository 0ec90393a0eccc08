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
    let mut env = Vec::new();
    if s.mode.rootful() {
        // Rootful podman runs the sandbox as the project's owner; nested podman needs a non-root one.
        let (uid, gid, _) = uid_gid(TEST_USER);
        chown_r(&dir, uid, gid);
        // Rootful podman's volumes are every user's: that user gets a home volume of their own (the
        // suite's belongs to root's sandboxes).
        let volume = format!("as-e2e-home-nested-{}", std::process::id());
        s.fx.volumes.push(volume.clone());
        env.push(("AGENT_SANDBOX_HOME_VOLUME", volume));
    }
    let r = s.launch_env(&dir, &["--exec", "bash", "./nested.sh"], &env);
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
    if s.mode.rootful() {
        another_users_home(s, &env);
    }
}

/// Rootful: the home volume the nested session's user now owns is not handed to a root sandbox (a
/// root-owned project): the session is refused before anything of it exists, and says what to do.
fn another_users_home(s: &mut Suite<'_>, env: &[(&str, String)]) {
    let t = s.touch_session("another-users-home", env);
    s.checks.check(
        t.run.code != Some(0)
            && t.run.stderr.contains("belongs to uid")
            && t.run.stderr.contains("AGENT_SANDBOX_HOME_VOLUME")
            && !t.ran
            && t.left.is_empty(),
        format!(
            "[rootful] another user's home volume is not handed to this sandbox: code {:?}, ran {}, \
             left {:?}\n{}",
            t.run.code, t.ran, t.left, t.run.stderr
        ),
    );
}
