//! The standard `process_*` metrics (the names every Prometheus client library exports): CPU time,
//! memory, file descriptors and start time, read from `/proc/self` when `/metrics` is scraped.
//!
//! Why the gateway needs them: its capacity is CPU per connection, and the only honest figure for that
//! is the one measured on the nodes it runs on (`rate(process_cpu_seconds_total[5m])` over
//! `rate(agent_sandbox_router_connections_total[5m])`); the lab's figure more than doubled from one
//! machine to another (BENCHMARKS.md). Each connection holds two descriptors and a bulk one up to four
//! pipe ends more, so `process_open_fds` near `process_max_fds` is the limit `--max-connections` must
//! stay under.
//!
//! Cost: listing `/proc/self/fd` takes time in proportion to the open descriptors, milliseconds with
//! thousands open (BENCHMARKS.md, "Process metrics"), so [`sample`] is blocking work: the admin
//! endpoint runs it on tokio's blocking pool, never on a worker that relays connections. Each family
//! is written only when its source could be read (`/proc` not mounted, or mounted with `subset=pid`,
//! leaves some or all of them out), never with a made-up value.

use std::sync::OnceLock;

/// Why the process could not be sampled.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProcError {
    /// A file of `/proc` could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: &'static str,
        /// The I/O error, as text.
        reason: String,
    },
    /// `/proc/self/stat` does not have the layout of proc(5).
    #[error("/proc/self/stat: {0}")]
    Stat(&'static str),
    /// `/proc/stat` has no valid `btime` line.
    #[error("/proc/stat: no valid btime line")]
    BootTime,
}

/// The fields of `/proc/self/stat` the metrics use, in the units the kernel gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    /// Start time after boot, in clock ticks.
    pub start_ticks: u64,
    /// Virtual memory size, in bytes.
    pub vsize_bytes: u64,
    /// Resident set size, in pages.
    pub rss_pages: u64,
}

/// Parses the bytes of `/proc/<pid>/stat` (proc(5)). The command name (field 2) is in parentheses and
/// may itself hold spaces, parentheses and bytes that are not UTF-8 (a multi-byte name cut at 15 bytes),
/// so the fields after it are counted from the last `)`.
pub fn parse_stat(bytes: &[u8]) -> Result<Stat, ProcError> {
    let close = bytes
        .iter()
        .rposition(|&b| b == b')')
        .ok_or(ProcError::Stat("no ')' after the command name"))?;
    // Fields 3 (state) onwards; index i here is field i + 3.
    let fields: Vec<&[u8]> = bytes[close + 1..]
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .collect();
    let field = |n: usize| -> Result<u64, ProcError> {
        let raw = fields
            .get(n - 3)
            .ok_or(ProcError::Stat("fewer than 24 fields"))?;
        std::str::from_utf8(raw)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or(ProcError::Stat("a numeric field is not a number"))
    };
    Ok(Stat {
        cpu_ticks: field(14)?.saturating_add(field(15)?),
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// Parses the `btime` line (boot time, Unix seconds) of `/proc/stat`.
pub fn parse_boot_time(text: &str) -> Result<u64, ProcError> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(ProcError::BootTime)
}

/// One sample of the process, in the units of the exposition; `None` where the source could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// User plus system CPU time, in milliseconds.
    pub cpu_ms: Option<u64>,
    /// Resident set size, in bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors (`RLIMIT_NOFILE`).
    pub max_fds: Option<u64>,
    /// Unix time of the process' start, in milliseconds.
    pub start_ms: Option<u64>,
}

/// The `process_*` samples [`render`] writes when every source can be read.
pub const SERIES: usize = 6;

/// Clock ticks per second and the page size, from sysconf(3) once.
fn units() -> (u64, u64) {
    static UNITS: OnceLock<(u64, u64)> = OnceLock::new();
    *UNITS.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the running system.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        (
            u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100),
            u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
        )
    })
}

/// Reads a file of `/proc` whole.
fn read(path: &'static str) -> Result<Vec<u8>, ProcError> {
    std::fs::read(path).map_err(|e| ProcError::Read {
        path,
        reason: e.to_string(),
    })
}

/// The boot time, Unix seconds: read once, as it does not change while the process runs (nor does a
/// `/proc/stat` that cannot be read start to be readable).
fn boot_time() -> Result<u64, ProcError> {
    static BOOT: OnceLock<Result<u64, ProcError>> = OnceLock::new();
    BOOT.get_or_init(|| {
        let bytes = read("/proc/stat")?;
        parse_boot_time(&String::from_utf8_lossy(&bytes))
    })
    .clone()
}

/// Open descriptors: the entries of `/proc/self/fd`, less the one the listing itself holds open.
fn open_fds() -> Result<u64, ProcError> {
    let entries = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| ProcError::Read {
            path: "/proc/self/fd",
            reason: e.to_string(),
        })?
        .count();
    Ok(u64::try_from(entries.saturating_sub(1)).unwrap_or(u64::MAX))
}

/// The soft RLIMIT_NOFILE.
fn max_fds() -> Result<u64, ProcError> {
    crate::rlimit::nofile()
        .map(|(soft, _)| soft)
        .map_err(|e| ProcError::Read {
            path: "getrlimit(RLIMIT_NOFILE)",
            reason: e.to_string(),
        })
}

/// Samples this process now, each value from its own source (blocking: see the module's doc). What
/// could not be read is logged at debug (a scrape every few seconds must not flood the log).
#[must_use]
pub fn sample() -> Sample {
    fn keep<T>(r: Result<T, ProcError>) -> Option<T> {
        r.map_err(|error| tracing::debug!(%error, "a process_* metric left out"))
            .ok()
    }
    let (ticks, page) = units();
    let to_ms =
        |t: u64| u64::try_from(u128::from(t) * 1000 / u128::from(ticks)).unwrap_or(u64::MAX);
    let stat = keep(read("/proc/self/stat").and_then(|b| parse_stat(&b)));
    let boot_s = stat.and_then(|_| keep(boot_time()));
    Sample {
        cpu_ms: stat.map(|s| to_ms(s.cpu_ticks)),
        resident_bytes: stat.map(|s| s.rss_pages.saturating_mul(page)),
        virtual_bytes: stat.map(|s| s.vsize_bytes),
        open_fds: keep(open_fds()),
        max_fds: keep(max_fds()),
        start_ms: stat
            .zip(boot_s)
            .map(|(s, b)| b.saturating_mul(1000).saturating_add(to_ms(s.start_ticks))),
    }
}

/// The `process_*` families of `sample` in the text format (0.0.4), named and described as
/// client_golang does; a family whose value is `None` is left out.
#[must_use]
pub fn render(sample: &Sample) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(1024);
    let families: [(&str, &str, &str, Option<String>); SERIES] = [
        (
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            sample.cpu_ms.map(|ms| super::decimal(ms, 1_000)),
        ),
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
            sample.resident_bytes.map(|v| v.to_string()),
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            "gauge",
            sample.virtual_bytes.map(|v| v.to_string()),
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            "gauge",
            sample.open_fds.map(|v| v.to_string()),
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors.",
            "gauge",
            sample.max_fds.map(|v| v.to_string()),
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            sample.start_ms.map(|ms| super::decimal(ms, 1_000)),
        ),
    ];
    for (name, help, kind, value) in families {
        if let Some(value) = value {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line as Linux 6.x writes it, with a command name that holds a space and both parentheses.
    const LINE: &[u8] = b"4242 (a) (b c) S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 75 0 0 20 0 3 0 \
                          987654 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 17638 0 0 0 17 1 \
                          0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    const PARSED: Stat = Stat {
        cpu_ticks: 325,
        start_ticks: 987_654,
        vsize_bytes: 123_456_789,
        rss_pages: 2048,
    };

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(parse_stat(LINE), Ok(PARSED));
        // A name cut inside a multi-byte character is not UTF-8; the fields after it still are read.
        let cut = [&b"4242 (caf\xc3) S"[..], &LINE[b"4242 (a) (b c) S".len()..]].concat();
        assert_eq!(parse_stat(&cut), Ok(PARSED));
    }

    #[test]
    fn malformed_stat_lines_are_errors() {
        assert_eq!(
            parse_stat(b"4242 a S 1"),
            Err(ProcError::Stat("no ')' after the command name"))
        );
        assert_eq!(
            parse_stat(b"4242 (a) S 1 2 3"),
            Err(ProcError::Stat("fewer than 24 fields"))
        );
        let bad = String::from_utf8_lossy(LINE).replace(" 250 75 ", " 250 x ");
        assert_eq!(
            parse_stat(bad.as_bytes()),
            Err(ProcError::Stat("a numeric field is not a number"))
        );
        assert_eq!(
            parse_stat(b""),
            Err(ProcError::Stat("no ')' after the command name"))
        );
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1764633600\nprocesses 9\n";
        assert_eq!(parse_boot_time(text), Ok(1_764_633_600));
        assert_eq!(parse_boot_time("cpu 1\n"), Err(ProcError::BootTime));
        assert_eq!(parse_boot_time("btime soon\n"), Err(ProcError::BootTime));
    }

    /// Every family with its client_golang type, values as the text format writes them; a family
    /// without a value is left out, HELP and TYPE included.
    #[test]
    fn families_are_typed_and_missing_values_left_out() {
        let full = Sample {
            cpu_ms: Some(1_250),
            resident_bytes: Some(8_388_608),
            virtual_bytes: Some(20_000_000),
            open_fds: Some(17),
            max_fds: Some(20_000),
            start_ms: Some(1_764_633_600_500),
        };
        assert_eq!(
            render(&full),
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total 1.25\n\
             # HELP process_resident_memory_bytes Resident memory size in bytes.\n\
             # TYPE process_resident_memory_bytes gauge\n\
             process_resident_memory_bytes 8388608\n\
             # HELP process_virtual_memory_bytes Virtual memory size in bytes.\n\
             # TYPE process_virtual_memory_bytes gauge\n\
             process_virtual_memory_bytes 20000000\n\
             # HELP process_open_fds Number of open file descriptors.\n\
             # TYPE process_open_fds gauge\n\
             process_open_fds 17\n\
             # HELP process_max_fds Maximum number of open file descriptors.\n\
             # TYPE process_max_fds gauge\n\
             process_max_fds 20000\n\
             # HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
             # TYPE process_start_time_seconds gauge\n\
             process_start_time_seconds 1764633600.5\n"
        );
        let partial = Sample {
            open_fds: None,
            start_ms: None,
            ..full
        };
        let text = render(&partial);
        assert!(!text.contains("process_open_fds") && !text.contains("process_start_time"));
        assert_eq!(text.lines().count(), 3 * (SERIES - 2));
        assert_eq!(render(&Sample::default()), "");
    }

    /// Open descriptors counted without opening one: every descriptor number below 65,536 that
    /// fcntl(2) knows.
    fn fds_by_fcntl() -> u64 {
        // SAFETY: F_GETFD only reads the descriptor's flags; an unused number fails with EBADF.
        (0..65_536)
            .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1)
            .count() as u64
    }

    /// The count is exact: it equals a count that opens no descriptor, taken just before and just
    /// after, whenever those two agree (other tests of this binary open and close descriptors in
    /// parallel, so a few tries may be needed).
    #[test]
    fn open_descriptors_are_counted_exactly() {
        for _ in 0..1000 {
            let before = fds_by_fcntl();
            let sampled = sample().open_fds;
            if fds_by_fcntl() == before {
                assert_eq!(sampled, Some(before));
                return;
            }
        }
        panic!("the descriptor count never held still for a sample");
    }

    /// The limit reported is the soft one: lowered below the hard one here (by one, which no other
    /// test of this binary comes near), it follows.
    #[test]
    fn max_fds_is_the_soft_limit() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit with a valid struct.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let lowered = libc::rlimit {
            rlim_cur: limit.rlim_max.min(1 << 20) - 1,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        let sampled = sample().max_fds;
        // SAFETY: as above; the limit as it was.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        assert_eq!(sampled, Some(lowered.rlim_cur));
    }

    /// The real process: CPU time grows with work, memory is plausible, and the start time is in the
    /// past, within a day.
    #[test]
    fn the_running_process_is_sampled() {
        /// This process's CPU time so far, from the kernel's own clock (not through /proc).
        fn cpu_now() -> std::time::Duration {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes the struct it is given.
            assert_eq!(
                unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) },
                0
            );
            std::time::Duration::new(
                u64::try_from(ts.tv_sec).unwrap(),
                u32::try_from(ts.tv_nsec).unwrap(),
            )
        }
        let before = sample();
        // Spin until this process has used 150 ms of CPU (not of wall time: on a loaded machine the
        // thread gets only part of it), within a generous deadline.
        let from = cpu_now();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut spin = 0u64;
        while cpu_now() - from < std::time::Duration::from_millis(150) {
            assert!(std::time::Instant::now() < deadline, "no CPU time in 60 s");
            for _ in 0..10_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
        }
        let after = sample();
        let (Some(cpu_before), Some(cpu_after)) = (before.cpu_ms, after.cpu_ms) else {
            panic!("/proc is mounted on the test machine: {after:?}");
        };
        assert!(cpu_after >= cpu_before + 100, "{before:?} {after:?}");
        let rss = after.resident_bytes.unwrap();
        assert!(rss > 1024 * 1024, "{after:?}");
        assert!(after.virtual_bytes.unwrap() >= rss, "{after:?}");
        let now_ms = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        let start = after.start_ms.unwrap();
        assert!(start <= now_ms, "{after:?} {now_ms}");
        assert!(
            start + 24 * 3600 * 1000 > now_ms,
            "started within a day: {after:?}"
        );
    }
}
