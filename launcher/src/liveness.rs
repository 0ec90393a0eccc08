//! Is the launcher that created a session still running?
//!
//! Every session object carries its launcher's pid, that process's start time and the kernel's boot id.
//! A session is live only if a process with that pid exists *and* started at that time in this boot: a
//! pid reused by another program, or a session left over from before a reboot, is stale. Stale objects
//! are removed at the next start; live ones are never touched.

use std::collections::HashMap;
use std::fs;
use std::io;

use crate::podman::{LABEL_BOOT, LABEL_PID, LABEL_START};

/// This boot's id.
pub fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// A process's start time in clock ticks since boot (field 22 of `/proc/PID/stat`).
pub fn start_time(pid: u32) -> io::Result<u64> {
    parse_start_time(&fs::read_to_string(format!("/proc/{pid}/stat"))?)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/PID/stat"))
}

/// Parses field 22; the command name (field 2) may hold spaces and parentheses, so fields are counted
/// from the last `)`.
fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first; field 22 is the 20th.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the session that labelled an object is still running, judged against the current boot.
/// Objects with missing or unreadable labels cannot belong to a running launcher of this version.
#[must_use]
pub fn is_live(labels: &HashMap<String, String>, current_boot: &str) -> bool {
    is_live_with(labels, current_boot, |pid| start_time(pid).ok())
}

fn is_live_with(
    labels: &HashMap<String, String>,
    current_boot: &str,
    start_of: impl Fn(u32) -> Option<u64>,
) -> bool {
    let (Some(pid), Some(start), Some(boot)) = (
        labels.get(LABEL_PID).and_then(|p| p.parse::<u32>().ok()),
        labels.get(LABEL_START).and_then(|s| s.parse::<u64>().ok()),
        labels.get(LABEL_BOOT),
    ) else {
        return false;
    };
    boot == current_boot && start_of(pid) == Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pid: &str, start: &str, boot: &str) -> HashMap<String, String> {
        [(LABEL_PID, pid), (LABEL_START, start), (LABEL_BOOT, boot)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let stat =
            "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parse_start_time(stat), Some(98765));
        assert_eq!(parse_start_time("garbage"), None);
    }

    #[test]
    fn this_process_is_live() {
        let me = std::process::id();
        let start = start_time(me).unwrap();
        let boot = boot_id().unwrap();
        assert!(is_live(
            &labels(&me.to_string(), &start.to_string(), &boot),
            &boot
        ));
    }

    #[test]
    fn stale_cases() {
        let start_of = |pid: u32| (pid == 10).then_some(500);
        let live = |l: &HashMap<String, String>| is_live_with(l, "b1", start_of);
        assert!(live(&labels("10", "500", "b1")));
        assert!(!live(&labels("10", "499", "b1")), "pid reused");
        assert!(!live(&labels("11", "500", "b1")), "process gone");
        assert!(!live(&labels("10", "500", "b0")), "earlier boot");
        assert!(!live(&labels("x", "500", "b1")), "bad label");
        assert!(!live(&HashMap::new()), "no labels");
    }
}
