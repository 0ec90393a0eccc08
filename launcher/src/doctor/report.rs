//! The doctor's table: one line per check, as text for people and as JSON for scripts.

use std::fmt::Write as _;

use serde::Serialize;

use crate::live::blocked::escape;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As it should be.
    Pass,
    /// Broken: sessions cannot start here, or containment does not hold.
    Fail,
    /// Works, at a cost or in a mode that is not the supported one.
    Warn,
    /// Not applicable here (said why).
    Skip,
}

impl Status {
    /// The mark in the text table.
    #[must_use]
    pub fn mark(self) -> &'static str {
        match self {
            Status::Pass => "✓",
            Status::Fail => "✗",
            Status::Warn => "!",
            Status::Skip => "-",
        }
    }
}

/// Which part of the run a check belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    /// What this machine must have for a session to start.
    Prerequisites,
    /// What a real session lets the sandbox do.
    Containment,
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// The part of the run it belongs to.
    pub section: Section,
    /// A short stable name (`podman`, `dns-unlisted-udp`), for scripts and tests.
    pub name: String,
    /// How it came out.
    pub status: Status,
    /// What was found, or what was tried and what happened.
    pub detail: String,
    /// The one thing to do, for every failure and warning (`null` in JSON for the others).
    pub fix: Option<String>,
}

impl Check {
    /// A check that passed.
    #[must_use]
    pub fn pass(section: Section, name: &str, detail: impl Into<String>) -> Check {
        Check {
            section,
            name: name.to_owned(),
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A check that does not apply here.
    #[must_use]
    pub fn skip(section: Section, name: &str, detail: impl Into<String>) -> Check {
        Check {
            status: Status::Skip,
            ..Check::pass(section, name, detail)
        }
    }

    /// A failure or a warning, with the one thing to do about it.
    #[must_use]
    pub fn bad(
        section: Section,
        status: Status,
        name: &str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            section,
            name: name.to_owned(),
            status,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Every check of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// In the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether nothing failed (warnings and skipped checks do not fail the run).
    #[must_use]
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// One check as a line of the text table (and its fix on the next line). The name and the detail
    /// are escaped for the terminal ([`escape`]): the containment checks' names and details are what
    /// the probe printed inside the sandbox, which the agent may have run before, and the
    /// prerequisites' details quote podman; no escape sequence of theirs may reach the user's screen.
    /// The fix is always the launcher's own words.
    ///
    /// A prerequisite's detail may hold several lines (an invalid allowlist's errors, one per line):
    /// each is printed on its own line, indented under the detail column. A containment check's
    /// detail never is: the sandbox chose it, and a line of its own could pass for another check.
    #[must_use]
    pub fn line(check: &Check) -> String {
        let detail = match check.section {
            Section::Prerequisites => check
                .detail
                .lines()
                .map(escape)
                .collect::<Vec<_>>()
                .join(&format!("\n{:27}", "")),
            Section::Containment => escape(&check.detail),
        };
        let mut out = format!(
            "  {} {:<22} {}\n",
            check.status.mark(),
            escape(&check.name),
            detail
        );
        if let Some(fix) = &check.fix {
            let _ = writeln!(out, "      → {fix}");
        }
        out
    }

    /// The closing line of the text table.
    #[must_use]
    pub fn summary(&self) -> String {
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        format!(
            "{} passed, {} failed, {} warnings, {} not applicable\n",
            count(Status::Pass),
            count(Status::Fail),
            count(Status::Warn),
            count(Status::Skip)
        )
    }

    /// The whole report as one JSON object: `{"passed": bool, "checks": [...]}`.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::json!({ "passed": self.passed(), "checks": self.checks }).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_fail_the_run_and_warnings_do_not() {
        let mut r = Report::default();
        r.checks
            .push(Check::pass(Section::Prerequisites, "podman", "4.3.1"));
        r.checks.push(Check::bad(
            Section::Prerequisites,
            Status::Warn,
            "storage",
            "vfs",
            "install fuse-overlayfs",
        ));
        r.checks
            .push(Check::skip(Section::Containment, "nested", "rootful"));
        assert!(r.passed());
        assert_eq!(
            Report::line(&r.checks[1]),
            "  ! storage                vfs\n      → install fuse-overlayfs\n"
        );
        r.checks.push(Check::bad(
            Section::Containment,
            Status::Fail,
            "caps",
            "CapEff=1",
            "x",
        ));
        assert!(!r.passed());
        assert_eq!(
            r.summary(),
            "1 passed, 1 failed, 1 warnings, 1 not applicable\n"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["passed"], false);
        assert_eq!(json["checks"][1]["status"], "warn");
        assert_eq!(json["checks"][0]["section"], "prerequisites");
        // Every check has every field: `fix` is null where there is nothing to do.
        assert!(json["checks"][0]["fix"].is_null());
        assert!(json["checks"][0].get("fix").is_some());
        assert_eq!(json["checks"][3]["fix"], "x");
    }

    /// An invalid allowlist's errors, one per line, are printed one per line (an auditor saw them
    /// joined by literal `\x0a`); a containment detail's newline stays escaped.
    #[test]
    fn a_prerequisites_detail_of_several_lines_keeps_its_lines() {
        let errors = "2 invalid entries in allowlist /h/allowed-hosts:\n  /h/allowed-hosts:11: `10.0.0.1`: no\n  /h/allowed-hosts:12: `@bad\u{1b}`: no";
        let check = Check::bad(
            Section::Prerequisites,
            Status::Fail,
            "allowlist",
            errors,
            "edit it",
        );
        let line = Report::line(&check);
        let lines: Vec<&str> = line.lines().collect();
        assert_eq!(lines.len(), 4, "{line}");
        assert_eq!(
            lines[0],
            "  ✗ allowlist              2 invalid entries in allowlist /h/allowed-hosts:"
        );
        assert_eq!(
            lines[1],
            format!("{:27}  /h/allowed-hosts:11: `10.0.0.1`: no", "")
        );
        assert!(lines[2].ends_with("`@bad\\x1b`: no"), "{line}");
        assert!(!line.contains("\\x0a"), "{line}");
        let forged = Check::bad(
            Section::Containment,
            Status::Fail,
            "caps",
            "x\n  ✓ caps ok",
            "y",
        );
        assert_eq!(Report::line(&forged).lines().count(), 2);
    }

    #[test]
    fn what_the_probe_printed_reaches_the_terminal_escaped() {
        // A probe line as a compromised sandbox could print it: clear screen, set the window title,
        // a bidirectional override and a C1 CSI, in the name and in both parts of the detail.
        let stdout = "{\"name\":\"x\\u001b[2J\",\"ok\":false,\"tried\":\"\\u001b]0;owned\\u0007\",\"got\":\"\\u202etxt.exe \\u009b31m\\r\"}";
        let checks = crate::doctor::selftest::parse_output(stdout, &[], &[], false);
        assert_eq!(checks.len(), 1);
        assert!(checks[0].name.contains('\u{1b}'), "{checks:?}");
        let line = Report::line(&checks[0]);
        let (table, fix) = line.split_once("\n      → ").unwrap();
        assert_eq!(
            table,
            "  ✗ x\\x1b[2J               \\x1b]0;owned\\x07: \\u{202e}txt.exe \\u{9b}31m\\x0d"
        );
        assert!(fix.trim_end().chars().all(|c| c == '→' || !c.is_control()));
        // JSON keeps the text as it was, its control characters escaped by serde.
        let json = Report { checks }.to_json();
        assert!(
            !json.contains('\u{1b}') && !json.contains('\u{7}'),
            "{json}"
        );
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["checks"][0]["name"], "x\u{1b}[2J");
    }
}
