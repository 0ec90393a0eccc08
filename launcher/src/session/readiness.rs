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
    let log = logfile::log_messages(podman, container, log_file, MAX_START_LOG)?;
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
        let full = log_file.and_then(no_room).unwrap_or_default();
        bail!(
            "{container} did not report all its listeners within {}s{full}:\n{}",
            READY_TIMEOUT.as_secs(),
            log.trim_end()
        );
    }
    Ok(false)
}

/// Below this many bytes free, a container's log lines may not have been written.
const LOW_SPACE: u64 = 64 * 1024;

/// What to add to a timeout when the filesystem holding `log` is (nearly) full: conmon could not
/// write the lines the launcher waits for, which looks like a container that never got ready.
fn no_room(log: &Path) -> Option<String> {
    let dir = log.parent()?;
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str())).ok()?;
    // SAFETY: statvfs writes only into the zeroed struct it is given; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // conmon writes as the launcher's user: root (rootful podman) may use the blocks kept for root.
    // SAFETY: geteuid cannot fail and touches no memory.
    let blocks = if unsafe { libc::geteuid() } == 0 {
        st.f_bfree
    } else {
        st.f_bavail
    };
    // The fields are u64 on 64-bit Linux and narrower elsewhere.
    #[allow(clippy::useless_conversion)]
    let free = u64::from(blocks).saturating_mul(u64::from(st.f_frsize));
    room_note(free, dir)
}

/// [`no_room`]'s text for `free` bytes left where `dir` is.
fn room_note(free: u64, dir: &Path) -> Option<String> {
    (free < LOW_SPACE).then(|| {
        format!(
            " (the filesystem holding {} has {free} bytes free: its log could not be written; free some space and start again)",
            dir.display()
        )
    })
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

    #[test]
    fn a_full_disk_is_named_at_the_timeout() {
        let dir = Path::new("/home/me/.local/state/agent-sandbox/logs/agent-sandbox-0123456789ab");
        let note = room_note(4096, dir).unwrap();
        assert!(
            note.contains(&dir.display().to_string()) && note.contains("4096 bytes free"),
            "{note}"
        );
        assert_eq!(room_note(LOW_SPACE, dir), None);
        // This machine's temp directory has room; a path that does not exist says nothing.
        let here = std::env::temp_dir().join("x.log");
        assert_eq!(no_room(&here), None);
        assert_eq!(no_room(Path::new("/nonexistent-as/dir/x.log")), None);
    }
}
