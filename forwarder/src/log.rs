//! Line logging to stderr, at most one line per event.
//!
//! The forwarder's budget is a static binary under 1.5 MB, and static glibc plus std already take most
//! of it: `tracing-subscriber` does not fit, and the forwarder has a handful of
//! messages and no spans to speak of. So this is the whole logger: a level, a line, no timestamps (podman
//! and journald add their own).
//!
//! Logging is off until [`set_max_level`] is called, so the tests that run the library in-process stay
//! quiet; the binary turns it on.

use std::fmt;
use std::io::Write as _;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

/// How important a message is; a message is written when its level is at most the maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The forwarder stops.
    Error = 1,
    /// Something failed that the sandbox will notice (a relay that cannot reach its target).
    Warn = 2,
    /// Start and stop.
    Info = 3,
    /// Every connection.
    Debug = 4,
}

/// 0 is "off".
static MAX_LEVEL: AtomicU8 = AtomicU8::new(0);

/// Writes messages up to `level` from now on.
pub fn set_max_level(level: Level) {
    MAX_LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether a message at `level` would be written (checked before formatting anything).
pub fn enabled(level: Level) -> bool {
    level as u8 <= MAX_LEVEL.load(Ordering::Relaxed)
}

/// Writes one line. Errors writing to stderr are ignored: a forwarder whose log is gone must keep
/// relaying (which is also why this is not `eprintln!`, which panics on a failed write).
///
/// The line is formatted first and written with one call: stderr is unbuffered, and written piece by
/// piece a line reaches the log collector in pieces (podman's k8s-file log then splits it over
/// several records, and a reader looking for a whole line misses it).
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    let line = format!("{level} {args}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Error => "ERROR",
            Level::Warn => " WARN",
            Level::Info => " INFO",
            Level::Debug => "DEBUG",
        })
    }
}

impl FromStr for Level {
    type Err = ();
    /// `error`, `warn`, `info`, `debug` (or `trace`, the same as `debug`), in any case.
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Ok(Level::Error),
            "warn" | "warning" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" | "trace" => Ok(Level::Debug),
            _ => Err(()),
        }
    }
}

/// `log!(Level::Info, "listening on {addr}")`: formats only when the level is enabled.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)+) => {
        if $crate::log::enabled($level) {
            $crate::log::write($level, format_args!($($arg)+));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        for (text, level) in [
            ("error", Level::Error),
            ("WARN", Level::Warn),
            (" info ", Level::Info),
            ("debug", Level::Debug),
            ("trace", Level::Debug),
        ] {
            assert_eq!(text.parse::<Level>(), Ok(level), "{text}");
        }
        assert!("agent_sandbox_forwarder=debug".parse::<Level>().is_err());
        assert!(Level::Error < Level::Debug);
    }
}
