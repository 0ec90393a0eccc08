//! Helpers shared by the fuzz targets: read splits that do not depend on a fuzzer-chosen layout, and a
//! work bound for "parsing is linear".
//!
//! The targets take raw bytes, so the checked-in seeds (real ClientHellos and request heads, see
//! `corpus/README.md`) are used as they are; the ways the bytes are split into reads are derived from the
//! bytes themselves, so every mutation also tries new splits.

use std::time::Duration;

/// Ways to cut `len` bytes into reads: each is a list of read lengths that add up to `len`. Always the
/// whole input at once and one byte at a time; then several pseudo-random splits seeded from `seed`
/// (small reads, large reads, and a mix).
#[must_use]
pub fn splits(len: usize, seed: &[u8]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![len], vec![1; len]];
    let mut state = fnv(seed) | 1;
    for max in [3usize, 17, 300, 2000] {
        let mut cuts = Vec::new();
        let mut left = len;
        while left > 0 {
            state = xorshift(state);
            let n = (state as usize % max + 1).min(left);
            cuts.push(n);
            left -= n;
        }
        out.push(cuts);
    }
    out
}

/// The input cut at `cuts` (read lengths, as from [`splits`]).
pub fn pieces<'a>(data: &'a [u8], cuts: &'a [usize]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut at = 0;
    cuts.iter().map(move |&n| {
        let piece = &data[at..at + n];
        at += n;
        piece
    })
}

/// `len` bytes cut into pieces of the sizes in `sizes` (taken in turn, cycled; each clamped to
/// `1..=max`; none: pieces of `max`), for the structured targets, whose input chooses its record and
/// read sizes. The lengths add up to `len`.
#[must_use]
pub fn cut(len: usize, sizes: &[u16], max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = len;
    let mut i = 0;
    while left > 0 {
        let n = sizes
            .get(i % sizes.len().max(1))
            .map_or(max, |&s| usize::from(s).clamp(1, max))
            .min(left);
        out.push(n);
        left -= n;
        i += 1;
    }
    out
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// CPU time of the calling thread: unlike wall time it does not grow when other processes take the
/// machine's cores, so a bound on it holds on a busy machine.
#[must_use]
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Fails when the work since `start` (thread CPU time) is more than linear in `bytes`: a fixed 250 ms
/// plus 20 µs a byte. A linear parser, sanitizer-instrumented and fed one byte at a time, spends well
/// under 1 µs a byte; re-scanning the buffer on every read of a 64 KiB input costs seconds. The fixed
/// part absorbs the sanitizer allocator's occasional housekeeping (a 62-byte DNS query once measured
/// 34 ms on a loaded machine); the deterministic counts in the targets catch smaller blow-ups.
pub fn assert_linear(what: &str, bytes: usize, start: Duration) {
    let spent = thread_cpu().saturating_sub(start);
    let budget = Duration::from_millis(250) + Duration::from_micros(20) * bytes as u32;
    assert!(
        spent <= budget,
        "{what}: {spent:?} of CPU for {bytes} bytes (budget {budget:?}): not linear"
    );
}
