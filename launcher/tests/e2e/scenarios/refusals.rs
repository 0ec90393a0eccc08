//! What the launcher refuses before creating anything: $HOME, its parents, /, a directory holding the
//! allowlist (also through a symlink), a bad allowlist (every error with its line).

use std::fs;
use std::path::PathBuf;

use crate::mode::chown_r;
use crate::suite::Suite;

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let before = s.all_session_objects();
    let home = s.mode.home.clone();
    let config = home.join(".config");
    let parent = home.parent().unwrap().to_owned();
    // A project holding an allowlist given through AGENT_SANDBOX_ALLOWLIST, reached via a symlink.
    let proj = s.project("holds-allowlist");
    fs::create_dir_all(proj.join("deep/er")).unwrap();
    fs::write(proj.join("deep/er/list"), "web.test\n").unwrap();
    let link = s.fx.root.join("link-to-holder");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&proj, &link).unwrap();
    if !s.mode.rootful() {
        chown_r(&proj, s.mode.uid, s.mode.gid);
    }
    let list = [(
        "AGENT_SANDBOX_ALLOWLIST",
        proj.join("deep/er/list").display().to_string(),
    )];
    let mode = s.mode.clone();
    for (what, dir, env) in [
        ("$HOME", home.clone(), &[][..]),
        ("a parent of $HOME", parent, &[][..]),
        ("/", PathBuf::from("/"), &[][..]),
        ("a directory holding the allowlist", config, &[][..]),
        (
            "a directory holding AGENT_SANDBOX_ALLOWLIST (via a symlink)",
            link.clone(),
            &list[..],
        ),
    ] {
        let r = s.launch_env(&dir, &["--exec", "true"], env);
        s.checks.check(
            r.code.is_some_and(|c| c != 0) && r.stderr.contains("refusing"),
            format!("[{}] refuses {what}: {}", mode.name(), r.stderr.trim()),
        );
    }
    // A bad allowlist: every error with its line number, nothing created.
    let bad = s.project("bad-allowlist");
    fs::write(bad.join("list"), "web.test\n10.0.0.1\n*.x.test\n").unwrap();
    let bad_list = [(
        "AGENT_SANDBOX_ALLOWLIST",
        bad.join("list").display().to_string(),
    )];
    let other = s.project("uses-bad-allowlist");
    let r = s.launch_env(&other, &["--exec", "true"], &bad_list);
    s.checks.check(
        r.code == Some(1) && r.stderr.contains("list:2:") && r.stderr.contains("list:3:"),
        format!(
            "[{}] a bad allowlist is reported with line numbers: {}",
            mode.name(),
            r.stderr.trim()
        ),
    );
    let after = s.all_session_objects();
    s.checks.check(
        before == after,
        format!(
            "[{}] refusals create nothing: {before:?} -> {after:?}",
            mode.name()
        ),
    );
}
