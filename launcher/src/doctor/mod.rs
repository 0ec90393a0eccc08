//! `agent-sandbox doctor`: what is wrong with this machine, and proof that the boundary holds on it.
//!
//! ```text
//! cli.rs       doctor's own options (`agent-sandbox doctor [--json] [--no-session] [--reach]`)
//! prereqs.rs   1. prerequisites: podman, its mode, set-up and images, the allowlist, a trial run
//! selftest.rs  2. containment: a real session (session::run_probe) running probe.py in the sandbox,
//!              which runs the static nested probe (nested-probe/) with nested podman
//! report.rs    the table (✓ ✗ ! -) or JSON; exit 0 only when nothing failed
//! ```
//!
//! The self-test's targets are only addresses this machine already uses; see `selftest.rs`.

pub mod cli;
mod host;
pub mod prereqs;
pub mod report;
pub mod selftest;

use std::io::Write as _;

use crate::podman::Podman;
use crate::settings::Settings;
use crate::signals::SignalWatch;

pub use cli::DoctorOptions;
use report::{Report, Section, Status};

/// Environment variable naming the resolv.conf whose nameservers count as the host's DNS servers
/// (default `/etc/resolv.conf`); the tests point it at a file of their own so that no probe is ever
/// aimed at a real resolver.
pub const RESOLV_CONF_VAR: &str = "AGENT_SANDBOX_DOCTOR_RESOLV_CONF";

/// Environment variable naming a hosts file that replaces this host's name resolution (getaddrinfo)
/// when the doctor looks up the first allowlisted name; the tests point it at a file naming an
/// address of their own, so that no lookup leaves the machine.
pub const HOSTS_VAR: &str = "AGENT_SANDBOX_DOCTOR_HOSTS";

/// Runs the doctor; returns the exit code (0 only when every check passed or only warned).
pub fn run(podman: &Podman, settings: &Settings, options: &DoctorOptions) -> anyhow::Result<i32> {
    let text = !options.json;
    let mut report = Report::default();
    let print = |s: &str| {
        if text {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        }
    };
    let started = std::time::Instant::now();
    let progress = |s: &str| {
        eprintln!(
            "agent-sandbox doctor: [{:.1}s] {s}",
            started.elapsed().as_secs_f64()
        )
    };
    print("Prerequisites\n");
    progress("checking podman and this machine");
    let facts = prereqs::gather(podman, settings);
    for check in prereqs::judge(&facts) {
        print(&Report::line(&check));
        report.checks.push(check);
    }
    if options.no_session {
        progress("--no-session: containment self-test skipped");
        // Said in the report too: a script reading `passed` must see that containment was not tested.
        print("Containment\n");
        let check = report::Check::skip(
            Section::Containment,
            "session",
            "not run (--no-session): the boundary was not tested on this machine",
        );
        print(&Report::line(&check));
        report.checks.push(check);
    } else {
        print("Containment (a real session, probed from inside the sandbox)\n");
        let prereqs_ok = report.passed();
        if prereqs_ok {
            let signals = SignalWatch::install()?;
            let selftest = selftest::Options {
                reach: options.reach,
                host_resolv_conf: std::env::var_os(RESOLV_CONF_VAR)
                    .filter(|v| !v.is_empty())
                    .map_or_else(selftest::default_resolv_conf, Into::into),
                upstream_hosts: std::env::var_os(HOSTS_VAR)
                    .filter(|v| !v.is_empty())
                    .map_or(selftest::HostLookup::System, |p| {
                        selftest::HostLookup::HostsFile(p.into())
                    }),
            };
            for check in selftest::run(podman, settings, &selftest, &signals, &progress) {
                print(&Report::line(&check));
                report.checks.push(check);
            }
            if let Some(sig) = signals.received() {
                return Ok(128 + sig);
            }
        } else {
            let check = report::Check::bad(
                Section::Containment,
                Status::Fail,
                "session",
                "not started: a prerequisite failed",
                "fix the prerequisites marked ✗ above, then run `agent-sandbox doctor` again",
            );
            print(&Report::line(&check));
            report.checks.push(check);
        }
    }
    if text {
        print(&report.summary());
    } else {
        println!("{}", report.to_json());
    }
    Ok(if report.passed() { 0 } else { 1 })
}
