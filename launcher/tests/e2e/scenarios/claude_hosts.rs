//! `@anthropic` covers what the pinned Claude Code needs: every host name under Anthropic's domains
//! (and the telemetry vendors') that the Claude Code in the sandbox image names is either in the group
//! or in the reviewed ignore list `containers/sandbox/claude-hosts-ignore`. A `CLAUDE_CODE_VERSION`
//! bump that starts naming a new host fails here until someone decides which list it belongs to.
//!
//! The names are read from the image's files with `grep` in a container with no network: Claude Code
//! itself is never run.

use std::collections::BTreeSet;

use agent_sandbox_shared::groups;

use crate::mode::repo_file;
use crate::suite::Suite;
use crate::SANDBOX_IMAGE;

/// Where the image's npm install puts Claude Code (its native binary and JavaScript).
const CLAUDE_DIR: &str = "/usr/local/lib/node_modules/@anthropic-ai/claude-code";

/// Names under these domains are first-party or telemetry: each must be decided on.
const DOMAINS: &[&str] = &[
    "anthropic.com",
    "claude.ai",
    "claude.com",
    "claudeusercontent.com",
    "claudemcpcontent.com",
    "datadoghq.com",
    "statsig.com",
    "sentry.io",
];

/// Names outside [`DOMAINS`] that Claude Code was seen to look up when it starts (issue 14's trial):
/// each must be decided on too, wherever the grep finds it.
const SEEN_AT_START: &[&str] = &["raw.githubusercontent.com"];

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let mode = s.mode.clone();
    let domains = DOMAINS
        .iter()
        .map(|d| d.replace('.', "\\."))
        .collect::<Vec<_>>()
        .join("|");
    let pattern = format!("([a-z0-9-]+\\.)*({domains})");
    let out = mode.podman_ok(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "grep",
        SANDBOX_IMAGE,
        "-rhoaiE",
        &pattern,
        CLAUDE_DIR,
    ]);
    let named: BTreeSet<String> = out
        .lines()
        .map(|l| l.trim().to_ascii_lowercase())
        .filter(|l| !l.is_empty())
        .collect();
    s.checks.check(
        named.contains("api.anthropic.com"),
        format!(
            "[{}] the image's Claude Code names api.anthropic.com ({} names read)",
            mode.name(),
            named.len()
        ),
    );

    let group: BTreeSet<&str> = groups::find("anthropic")
        .expect("@anthropic exists")
        .hosts
        .iter()
        .map(|h| h.entry)
        .collect();
    let ignore_file = repo_file("containers/sandbox/claude-hosts-ignore");
    let ignore_text = std::fs::read_to_string(&ignore_file).expect("read the ignore list");
    let ignored: BTreeSet<&str> = ignore_text
        .lines()
        .filter_map(|l| l.split('#').next())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let undecided: Vec<&str> = named
        .iter()
        .map(String::as_str)
        .chain(SEEN_AT_START.iter().copied())
        .filter(|n| !group.contains(n) && !ignored.contains(n))
        .collect();
    s.checks.check(
        undecided.is_empty(),
        format!(
            "[{}] every host the pinned Claude Code names is in @anthropic or in {}; undecided: {undecided:?}",
            mode.name(),
            ignore_file.display()
        ),
    );
    let both: Vec<&&str> = group.intersection(&ignored).collect();
    s.checks.check(
        both.is_empty(),
        format!(
            "[{}] no host is both in @anthropic and ignored: {both:?}",
            mode.name()
        ),
    );
}
