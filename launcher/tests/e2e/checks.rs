//! The suite's verdicts: every check prints `ok`/`FAIL` as it goes, and one run reports all failures at
//! the end instead of stopping at the first.

use crate::mode::Mode;

/// Collects failed checks so one run reports all of them.
#[derive(Default)]
pub(crate) struct Checks {
    /// What failed, with the detail to act on.
    pub(crate) failures: Vec<String>,
    /// How many passed (the suite's total is reported and compared across changes).
    pub(crate) passed: usize,
}

impl Checks {
    /// Records one check.
    pub(crate) fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.passed += 1;
            eprintln!("  ok   {what}");
        } else {
            eprintln!("  FAIL {what}");
            self.failures.push(what);
        }
    }

    /// Every `ok NAME` / `FAIL NAME` line a sandbox script printed, and that each expected name passed.
    pub(crate) fn script(&mut self, mode: &Mode, output: &str, expected: &[&str]) {
        for name in expected {
            let ok = output.lines().any(|l| l.trim() == format!("ok {name}"));
            let detail = output
                .lines()
                .find(|l| l.starts_with(&format!("FAIL {name}")))
                .unwrap_or("no result line");
            self.check(
                ok,
                format!(
                    "[{}] {name}{}",
                    mode.name(),
                    if ok {
                        String::new()
                    } else {
                        format!(": {detail}")
                    }
                ),
            );
        }
    }
}
