//! Log setup: text for people, JSON for collectors and the launcher's end-of-session report.
//!
//! `RUST_LOG` overrides the default filter. hickory's own per-query logging is kept at `warn`: it would
//! otherwise log every request, and the router logs the decisions that matter itself.
//!
//! Every connection writes one line, so the line's formatting is on the hot path: the timestamp
//! ([`Clock`]) and the addresses ([`Addr`]) are written the same as tracing-subscriber and std write
//! them, byte for byte, without their general-purpose formatting machinery (measured in instructions per
//! connection in BENCHMARKS.md, issue 18).

use std::cell::Cell;
use std::fmt;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

mod json;

pub use json::JsonLine;

/// The default filter: our decisions at info, dependencies' chatter off.
const DEFAULT_FILTER: &str = "info,hickory_proto=warn,hickory_resolver=warn,hickory_net=warn";

/// Installs the global subscriber, writing to stderr.
///
/// A line that cannot be written (stderr a pipe whose reader has gone) is dropped. tracing-subscriber
/// would otherwise report the failure with `eprintln!` to the same broken stderr, which panics: in
/// whatever task logged, so a DNS worker, a connection or the signal task died with it, and SIGTERM
/// was no longer acted on. The log is for the operator; serving must not depend on it.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_timer(Clock)
        .with_target(false);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().event_format(JsonLine::new()).try_init(),
    };
    // A second init (tests calling in-process) keeps the first subscriber.
    let _ = result;
}

/// The log's timestamp: what tracing-subscriber's default `SystemTime` timer writes (RFC 3339 in UTC
/// with microseconds, `2026-12-01T15:18:12.841259Z`), with the date and time to the second worked out
/// once per second per thread instead of once per line. Outside years 1970–9999 it hands over to
/// tracing-subscriber's own timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock;

/// Seconds since the epoch at the start of year 10000: the fast path's end.
const YEAR_10000: u64 = 253_402_300_800;

thread_local! {
    /// The last second formatted on this thread and its `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

impl FormatTime for Clock {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) if d.as_secs() < YEAR_10000 => {
                let secs = d.as_secs();
                let (cached, mut prefix) = SECOND.get();
                if cached != secs {
                    prefix = second_prefix(secs);
                    SECOND.set((secs, prefix));
                }
                w.write_str(as_str(&stamp(&prefix, d.subsec_micros())))
            }
            _ => tracing_subscriber::fmt::time::SystemTime.format_time(w),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS` for `secs` after the epoch (before year 10000).
fn second_prefix(secs: u64) -> [u8; 19] {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_date(days);
    let mut out = *b"0000-00-00T00:00:00";
    put_digits(&mut out[0..4], year);
    put_digits(&mut out[5..7], month);
    put_digits(&mut out[8..10], day);
    put_digits(&mut out[11..13], rest / 3600);
    put_digits(&mut out[14..16], rest / 60 % 60);
    put_digits(&mut out[17..19], rest % 60);
    out
}

/// The whole timestamp: the second's prefix, `.`, six digits of microseconds and `Z`.
fn stamp(prefix: &[u8; 19], micros: u32) -> [u8; 27] {
    let mut out = [0u8; 27];
    out[..19].copy_from_slice(prefix);
    out[19] = b'.';
    put_digits(&mut out[20..26], u64::from(micros));
    out[26] = b'Z';
    out
}

/// The proleptic Gregorian (year, month, day) of `days` after 1970-01-01: the usual shift to years that
/// start on 1 March, so the leap day is the last day of its year, and 400-year cycles of 146,097 days.
fn civil_date(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468; // days since 0000-03-01
    let (cycle, day_of_cycle) = (shifted / 146_097, shifted % 146_097);
    let year_of_cycle =
        (day_of_cycle - day_of_cycle / 1460 + day_of_cycle / 36_524 - day_of_cycle / 146_096) / 365;
    let day_of_year =
        day_of_cycle - (365 * year_of_cycle + year_of_cycle / 4 - year_of_cycle / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = cycle * 400 + year_of_cycle + u64::from(month <= 2);
    (year, month, day)
}

/// Writes `value`'s last `out.len()` decimal digits into `out`, zero-padded.
fn put_digits(out: &mut [u8], mut value: u64) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// The ASCII the formatters here produce, as a `str`.
fn as_str(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// A socket address for a log field, written exactly as `SocketAddr`'s `Display` writes it; an IPv4
/// address without `fmt::Write`'s per-number machinery (IPv6 and padded formats go to std).
#[derive(Debug, Clone, Copy)]
pub struct Addr(pub SocketAddr);

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            SocketAddr::V4(a) if f.width().is_none() && f.precision().is_none() => {
                // "255.255.255.255:65535" is 21 bytes.
                let mut out = [0u8; 21];
                let mut len = 0;
                for (i, octet) in a.ip().octets().into_iter().enumerate() {
                    if i > 0 {
                        out[len] = b'.';
                        len += 1;
                    }
                    len += put_number(&mut out[len..], u64::from(octet));
                }
                out[len] = b':';
                len += 1;
                len += put_number(&mut out[len..], u64::from(a.port()));
                f.write_str(as_str(&out[..len]))
            }
            other => fmt::Display::fmt(&other, f),
        }
    }
}

/// An optional socket address: nothing when there is none (a connection that never dialled).
#[derive(Debug, Clone, Copy)]
pub struct MaybeAddr(pub Option<SocketAddr>);

impl fmt::Display for MaybeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(a) => fmt::Display::fmt(&Addr(a), f),
            None => Ok(()),
        }
    }
}

/// Writes `value` in decimal at the start of `out` (which is long enough) and returns how many bytes.
fn put_number(out: &mut [u8], value: u64) -> usize {
    let mut digits = 1;
    let mut rest = value / 10;
    while rest > 0 {
        digits += 1;
        rest /= 10;
    }
    put_digits(&mut out[..digits], value);
    digits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

    /// The date of every day the fast path serves (1970 to 9999), against a day-by-day count with the
    /// leap-year rule.
    #[test]
    fn civil_date_matches_counting_days() {
        let (mut y, mut m, mut d) = (1970u64, 1u64, 1u64);
        for days in 0..YEAR_10000 / 86_400 {
            assert_eq!(civil_date(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let month_len = match m {
                2 if leap => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > month_len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
        assert_eq!((y, m, d), (10_000, 1, 1));
    }

    #[test]
    fn timestamps_at_known_instants() {
        let at = |secs: u64, micros: u32| as_str(&stamp(&second_prefix(secs), micros)).to_owned();
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(1_709_251_199, 999_999), "2024-02-29T23:59:59.999999Z");
        assert_eq!(at(1_796_138_292, 841_259), "2026-12-01T15:18:12.841259Z");
        assert_eq!(at(YEAR_10000 - 1, 123_456), "9999-12-31T23:59:59.123456Z");
    }

    /// The same shape as tracing-subscriber's own timer, and the same text to the second (the two
    /// read the clock apart, so the microseconds differ).
    #[test]
    fn clock_agrees_with_tracing_subscriber() {
        for _ in 0..100 {
            let (mut ours, mut theirs) = (String::new(), String::new());
            Clock.format_time(&mut Writer::new(&mut ours)).unwrap();
            tracing_subscriber::fmt::time::SystemTime
                .format_time(&mut Writer::new(&mut theirs))
                .unwrap();
            assert_eq!(ours.len(), theirs.len(), "{ours} {theirs}");
            if ours[..19] == theirs[..19] {
                assert_eq!(&ours[19..20], ".");
                assert!(ours.ends_with('Z'));
                return;
            }
        }
        panic!("the two clocks never agreed on the second");
    }

    #[test]
    fn addresses_match_std() {
        let mut v4 = vec![0u32, 1, 0x7f00_0001, 0x0a0b_0c0d, 0xc0a8_6401, u32::MAX];
        // Every octet value in each position, and every digit count.
        for o in 0..=255u32 {
            v4.extend([o, o << 8, o << 16, o << 24, o * 0x0101_0101]);
        }
        for ip in v4 {
            for port in [
                0u16, 1, 9, 10, 99, 100, 443, 999, 1000, 9999, 10_000, 65_535,
            ] {
                let a = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port));
                assert_eq!(Addr(a).to_string(), a.to_string());
                assert_eq!(format!("{:>30}", Addr(a)), format!("{a:>30}"));
            }
        }
        let v6 = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 8443, 0, 3));
        assert_eq!(Addr(v6).to_string(), v6.to_string());
        assert_eq!(MaybeAddr(Some(v6)).to_string(), v6.to_string());
        assert_eq!(MaybeAddr(None).to_string(), "");
    }
}
