//! What the sandbox reaches (tests/e2e/scripts/reach.sh): allowlisted names by DNS, HTTPS, HTTP and a
//! host:port entry; unlisted names, look-alikes, SNI and Host spoofing refused; the launcher's report
//! of blocked names.

use crate::suite::Suite;

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let dir = s.project("reach");
    s.copy_script(&dir, "reach.sh");
    let r = s.launch(&dir, &["--exec", "bash", "./reach.sh"]);
    let mode = s.mode.clone();
    s.checks.script(
        &mode,
        &r.stdout,
        &[
            "resolve-exact",
            "resolve-wildcard",
            "resolve-apex",
            "resolve-port-host",
            "https-exact",
            "https-wildcard",
            "http-exact",
            "http-wildcard",
            "tcp-port-entry",
            "nxdomain-unlisted",
            "unlisted-connect-fails",
            "nxdomain-lookalike",
            "sni-spoof-refused",
            "host-spoof-refused",
            "aaaa-empty",
        ],
    );
    s.checks.check(
        r.stderr.contains("blocked.test") && r.stderr.contains("refused"),
        format!(
            "[{}] the blocked report lists a refused name: {}",
            mode.name(),
            r.stderr.trim()
        ),
    );
    s.checks.check(
        r.stderr.contains(".config/agent-sandbox/allowed-hosts"),
        format!("[{}] the blocked report names the allowlist", mode.name()),
    );
}
