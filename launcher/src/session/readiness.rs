//! Readiness: a detached container is ready once its log names every address it must listen on.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{interrupted, SessionError};
use crate::podman::{args, logfile, Podman};
use crate::signals::SignalWatch;

/// How long the router and forwarder may take to report their listeners.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until a detached container has logged `listening on ADDR` for every address; fails with its
/// log if it exits first. Signals are checked between looks.
pub(super) fn wait_listening(
    podman: &Podman,
    container: &str,
    log_file: Option<&Path>,
    addrs: &[String],
    signals: &SignalWatch,
) -> Result<(), SessionError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut delay = Duration::from_millis(10);
    loop {
        interrupted(signals)?;
        if look(podman, container, log_file, addrs, deadline).map_err(SessionError::Start)? {
            return Ok(());
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

/// One look at the container: whether it is ready; an error with its log once it has stopped or the
/// deadline has passed. The log is read from its file (`log_file`, where the launcher had podman put
/// it), so a look that finds the container ready costs no podman process; `podman logs` without one,
/// or if it cannot be read.
fn look(
    podman: &Podman,
    container: &str,
    log_file: Option<&Path>,
    addrs: &[String],
    deadline: Instant,
) -> anyhow::Result<bool> {
    let log = match log_file.and_then(|f| logfile::read_messages(f, 0, MAX_START_LOG).ok()) {
        Some(messages) => messages,
        None => {
            let out = podman.output(&args::logs(container))?;
            let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
            log.push_str(&String::from_utf8_lossy(&out.stderr));
            log
        }
    };
    if all_listening(&log, addrs) {
        return Ok(true);
    }
    let state = podman.run(&args::container_state(container))?;
    if state.trim_start().starts_with("false") {
        bail!(
            "{container} stopped while starting (exit {}):\n{}",
            state.split_whitespace().nth(1).unwrap_or("?"),
            log.trim_end()
        );
    }
    if Instant::now() > deadline {
        bail!(
            "{container} did not report all its listeners within {}s:\n{}",
            READY_TIMEOUT.as_secs(),
            log.trim_end()
        );
    }
    Ok(false)
}

/// The most of a starting container's log read at one look: what it logs before its listeners is a
/// few lines.
const MAX_START_LOG: u64 = 4 * 1024 * 1024;

/// Whether the log has a `listening on ADDR` line for every address (`ADDR` not followed by a digit, so
/// port 80 is not taken for 8080's prefix).
fn all_listening(log: &str, addrs: &[String]) -> bool {
    addrs.iter().all(|a| {
        let needle = format!("{}{a}", agent_sandbox_shared::logs::LISTENING_ON);
        log.lines().any(|l| {
            l.split(needle.as_str())
                .nth(1)
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_must_be_listed_exactly() {
        let log = "{\"fields\":{\"message\":\"listening on 10.89.0.2:53\"}}\n\
                   {\"fields\":{\"message\":\"listening on 10.89.0.2:8080\"}}\n";
        let addrs = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(all_listening(
            log,
            &addrs(&["10.89.0.2:53", "10.89.0.2:8080"])
        ));
        assert!(
            !all_listening(log, &addrs(&["10.89.0.2:80"])),
            "8080 is not 80"
        );
        assert!(!all_listening(
            log,
            &addrs(&["10.89.0.2:53", "10.89.0.2:443"])
        ));
        assert!(all_listening("", &[]));
    }
}
