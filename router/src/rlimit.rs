//! The process's limit on open file descriptors (`RLIMIT_NOFILE`), read and raised here only: the
//! proxy raises it at start and checks it against `--max-connections`, and `/metrics` reports it as
//! `process_max_fds`.

/// The soft and hard `RLIMIT_NOFILE` now.
pub(crate) fn nofile() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        Ok((limit.rlim_cur, limit.rlim_max))
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one, if it is lower. Best effort: a limit that cannot
/// be read or raised stays as it is, and the check against `--max-connections` says what that costs.
pub(crate) fn raise_nofile_to_hard() {
    if let Ok((soft, hard)) = nofile() {
        if soft < hard {
            let raised = libc::rlimit {
                rlim_cur: hard,
                rlim_max: hard,
            };
            // SAFETY: setrlimit reads the struct it is given.
            let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hard limit as the kernel shows it in `/proc/self/limits` ("Max open files  soft  hard
    /// files"). Only the hard one is compared: another test lowers the soft one for a moment.
    fn hard_limit_from_proc() -> u64 {
        let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("a Max open files line");
        let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
        fields[1].parse().expect("a number")
    }

    #[test]
    fn nofile_reads_the_kernels_limits() {
        let (soft, hard) = nofile().expect("getrlimit");
        assert!(soft <= hard, "soft {soft} above hard {hard}");
        assert_eq!(hard, hard_limit_from_proc());
    }
}
