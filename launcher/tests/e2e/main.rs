//! End-to-end suite: the real launcher, real podman, the real images, as root and rootless.
//!
//! Run by `make e2e` (part of `make test`), which builds the images first and sets
//! `AGENT_SANDBOX_E2E=1`; without that variable the suite says loudly that it was not requested and
//! runs nothing, so a plain `cargo test` needs neither podman nor root (CI runs `make e2e` itself).
//!
//! Upstream "internet" hosts are the suite's own containers on `agent-sandbox-egress`, reached by
//! `--network-alias` names under `.test`; traffic only ever goes to this machine or those containers.
//! As root the suite runs twice: rootful, then rootless as the user `agent-sandbox-e2e` (created if
//! missing and kept, so its image storage makes reruns fast). As another user it runs rootless only.
//! Everything else it creates (containers, volumes, the egress network if it was missing, temp dirs) is
//! removed at the end, also when a check fails.
//!
//! The scenarios (`scenarios/`, one module each; the scripts they run in the sandbox are
//! `tests/e2e/scripts/*.sh`) run in order under this file's own `main` (`harness = false`), not as one
//! `#[test]` each: they share set-up that is slow to make and machine-wide (the rootless user's image
//! storage, the upstream containers, the egress network, the CA), podman state means they cannot run
//! in parallel, and libtest has no per-binary fixture that is torn down at the end. Each scenario's
//! checks are counted and reported together; a scenario that panics is one failed check and the
//! others still run.
//!
//! Selecting scenarios works like libtest's filters, on names `MODE::SCENARIO` (`rootful::reach`,
//! `rootless::nested`, …): `make e2e E2E=reach` runs `reach` in both modes, `E2E=rootless::` every
//! scenario rootless only; `--exact`, `--skip NAME` and `--list` work too.

mod checks;
mod mode;
mod scenarios;
mod setup;
mod suite;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use checks::Checks;
use mode::{current_ids, Mode};
use scenarios::Scenario;
use setup::{ensure_test_user, rootless_user_mode, Artifacts};
use suite::Suite;

/// The launcher under test.
pub(crate) const LAUNCHER: &str = env!("CARGO_BIN_EXE_agent-sandbox");
/// The sandbox image `make build` made (also the upstreams' image: it has python3).
pub(crate) const SANDBOX_IMAGE: &str = "localhost/agent-sandbox:dev";
/// The router image `make build` made.
pub(crate) const ROUTER_IMAGE: &str = "localhost/agent-sandbox-router:dev";
/// The shared egress network the launcher attaches routers to.
pub(crate) const EGRESS: &str = "agent-sandbox-egress";
/// The unprivileged user of the rootless run.
pub(crate) const TEST_USER: &str = "agent-sandbox-e2e";
/// Label on every container the suite starts itself.
pub(crate) const TEST_LABEL: &str = "agent-sandbox-e2e";
/// The launcher's label on every session object.
pub(crate) const SESSION_LABEL: &str = "agent-sandbox.session";
/// The launcher's label naming a session object's project directory.
pub(crate) const PROJECT_LABEL: &str = "agent-sandbox.project";

/// The allowlist every session of the suite reads.
pub(crate) const ALLOWLIST: &str = "\
# end-to-end allowlist
web.test
.wild.test
db.test:5432
";

/// Which scenarios to run: libtest's filter arguments, read from the command line.
#[derive(Debug, Default)]
struct Selection {
    /// Run names containing any of these (all when empty; equal to one with `exact`).
    filters: Vec<String>,
    /// Leave out names containing any of these.
    skip: Vec<String>,
    /// Filters match whole names.
    exact: bool,
    /// Print the names and run nothing.
    list: bool,
}

impl Selection {
    /// Reads libtest-style arguments; libtest's other options (`--nocapture`, `--test-threads N`, …)
    /// are accepted and ignored, so `cargo test` passes through as it does for any test.
    fn from_args(args: impl IntoIterator<Item = String>) -> Selection {
        let mut sel = Selection::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--exact" => sel.exact = true,
                "--list" => sel.list = true,
                "--skip" => sel.skip.extend(args.next()),
                "--test-threads" | "--format" | "--color" | "--logfile" | "-Z"
                | "--shuffle-seed" => {
                    args.next();
                }
                a if a.starts_with("--skip=") => sel.skip.push(a["--skip=".len()..].to_owned()),
                a if a.starts_with('-') => {}
                _ => sel.filters.push(arg),
            }
        }
        sel
    }

    /// True when `name` (`MODE::SCENARIO`) is selected.
    fn wants(&self, name: &str) -> bool {
        let hit = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(hit)) && !self.skip.iter().any(hit)
    }
}

fn main() {
    let sel = Selection::from_args(std::env::args().skip(1));
    let (uid, gid) = current_ids();
    let mode_names: &[&str] = if uid == 0 {
        &["rootful", "rootless"]
    } else {
        &["rootless"]
    };
    let plan: Vec<(&str, Vec<Scenario>)> = mode_names
        .iter()
        .map(|m| {
            let picked = scenarios::ALL
                .iter()
                .filter(|(name, _)| sel.wants(&format!("{m}::{name}")))
                .copied()
                .collect();
            (*m, picked)
        })
        .collect();
    if sel.list {
        for (m, picked) in &plan {
            for (name, _) in picked {
                println!("{m}::{name}: test");
            }
        }
        return;
    }
    if std::env::var("AGENT_SANDBOX_E2E").as_deref() != Ok("1") {
        eprintln!(
            "SKIPPED: end-to-end suite not requested: run `make e2e` (it builds the images and sets \
             AGENT_SANDBOX_E2E=1)"
        );
        return;
    }
    let total: usize = plan.iter().map(|(_, p)| p.len()).sum();
    if total == 0 {
        let names: Vec<String> = mode_names
            .iter()
            .flat_map(|m| scenarios::ALL.iter().map(move |(n, _)| format!("{m}::{n}")))
            .collect();
        eprintln!(
            "no end-to-end scenario matches {:?}; there are: {}",
            sel.filters,
            names.join(" ")
        );
        std::process::exit(1);
    }

    let started = Instant::now();
    if uid == 0 {
        ensure_test_user();
    }
    let artifacts = Artifacts::prepare();
    let mut checks = Checks::default();
    for (name, picked) in plan.into_iter().filter(|(_, p)| !p.is_empty()) {
        let mode = match name {
            "rootful" => Mode {
                user: None,
                uid: 0,
                gid: 0,
                home: artifacts.dir.join("root-home"),
            },
            _ if uid == 0 => rootless_user_mode(),
            _ => Mode {
                user: None,
                uid,
                gid,
                home: std::env::var_os("HOME").unwrap().into(),
            },
        };
        eprintln!("== {} ({:?})", mode.name(), mode.user);
        let t = Instant::now();
        let mut suite = Suite::new(mode, &mut checks, &artifacts);
        for (scenario, run) in picked {
            eprintln!("-- {name}::{scenario}");
            let t = Instant::now();
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(&mut suite))) {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                suite
                    .checks
                    .check(false, format!("[{name}] {scenario} panicked: {msg}"));
            }
            eprintln!("-- {name}::{scenario} done in {:.0?}", t.elapsed());
        }
        // Removes this mode's containers, sessions, volumes and directories before the next mode.
        drop(suite);
        eprintln!("== {name} done in {:.0?}", t.elapsed());
    }
    drop(artifacts);
    eprintln!(
        "end-to-end: {} checks passed, {} failed, {:.0?}",
        checks.passed,
        checks.failures.len(),
        started.elapsed()
    );
    if !checks.failures.is_empty() {
        eprintln!("failed checks:\n  {}", checks.failures.join("\n  "));
        std::process::exit(1);
    }
}
