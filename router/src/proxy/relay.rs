//! Moving bytes between the client and the upstream once a connection is decided.
//!
//! How it fits: every listener ends in [`pump`] (one direction) or [`relay`] (both). Each direction runs
//! until its source reaches end of stream, then shuts down the write side of its destination (half-close:
//! the other direction keeps flowing), so protocols that send a FIN and then wait for an answer work.
//!
//! The bytes go through user space: through a small buffer while they come in messages, and in reads of
//! up to 1 MiB once a direction carries bulk data. With `AGENT_SANDBOX_SPLICE` set, bulk directions
//! go through a pipe with splice(2) instead, never entering user space: on this project's benchmark
//! machine that relayed one stream 13-20 % slower than the large copy, for about the same CPU
//! (BENCHMARKS.md, issue 18), but another kernel may differ. Both work on shared `&TcpStream`s with
//! tokio's readiness API, so the two directions need no split and no extra task.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Pipe capacity asked for; the default (64 KiB) is used if the kernel refuses.
const PIPE_SIZE: libc::c_int = 256 * 1024;

/// User-space copy buffer: the most one read takes while data comes in messages.
const COPY_BUF: usize = 16 * 1024;

/// Back-to-back full reads of [`COPY_BUF`] after which a direction is carrying bulk data and switches
/// to splice(2): 64 KiB arriving faster than it is read.
const BULK_STREAK: u32 = 4;

/// The most one read takes once a direction carries bulk data (and does not splice). Fewer, larger reads
/// and writes: 1 GiB over HTTP cost the router 1,610 ms of CPU through 16 KiB reads on an earlier
/// machine and 820 ms through 256 KiB; on the benchmark machine now, 256 KiB reads relayed one stream
/// at 0.87x of a direct connection and 1 MiB reads at 1.04x, for 280 ms of CPU per GiB against 340
/// (BENCHMARKS.md, issue 18). The reads go through the thread's buffer (see [`copy_now`]); a direction
/// holds a buffer of its own only for what its destination did not take at once, and more than
/// [`COPY_BUF`] of that only within [`BULK_HELD_BUDGET`].
const BULK_COPY: usize = 1024 * 1024;

/// The most the whole process holds, across connections, in leftovers larger than [`COPY_BUF`] (what a
/// destination did not take of a [`BULK_COPY`] read). Past it, bulk directions read [`COPY_BUF`] at a
/// time, so clients that stop reading cannot make the router hold 1 MiB per direction each: with
/// this budget, a direction's worst case stays what it was with 16 KiB reads, plus a share of 8 MiB
/// for the process. Checked before each read, so concurrent workers can overshoot it by one read each.
const BULK_HELD_BUDGET: usize = 8 * 1024 * 1024;

/// Bytes held now in leftovers larger than [`COPY_BUF`] (see [`BULK_HELD_BUDGET`]).
static BULK_HELD: AtomicUsize = AtomicUsize::new(0);

/// A leftover's share of [`BULK_HELD`], given back when dropped (written out, failed or cancelled).
struct Held(usize);

impl Held {
    fn new(len: usize) -> Held {
        let len = if len > COPY_BUF { len } else { 0 };
        BULK_HELD.fetch_add(len, Ordering::Relaxed);
        Held(len)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        BULK_HELD.fetch_sub(self.0, Ordering::Relaxed);
    }
}

/// A splice(2) that moves less than this is a small message: for those, the pipe's two system calls
/// (and the read that finds it empty) cost more than one copy through user space.
const SMALL_SPLICE: usize = 16 * 1024;

/// Back-to-back small splices after which a direction goes back to copying (and closes its pipe); and
/// back-to-back reads under [`COPY_BUF`] after which a direction that copies bulk data goes back to
/// reads of that size.
const SMALL_STREAK: u32 = 4;

/// A pipe for splice(2), closed on drop.
#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes in the pipe not yet written out.
    buffered: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_SETPIPE_SZ on a pipe we own; failure just leaves the default size.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
        Ok(Pipe {
            read,
            write,
            buffered: 0,
        })
    }
}

/// splice(2) between two descriptors, non-blocking.
fn splice(from: libc::c_int, to: libc::c_int, len: usize) -> io::Result<usize> {
    // SAFETY: plain syscall on descriptors owned by the caller; null offsets mean "current position".
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// splice(2) for bulk directions only when `AGENT_SANDBOX_SPLICE` is set (read once): a switch for
/// benchmarking the two paths against each other, and for a kernel where splice relays faster than
/// the large copy.
pub(crate) fn splice_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("AGENT_SANDBOX_SPLICE").is_some())
}

/// Waits until the runtime has seen `s` readable (or closed), through the socket's one slot for a
/// reader's waker (`poll_read_ready`) rather than `TcpStream::readable`, whose future joins a list of
/// waiters under the socket's lock when it waits and leaves it when dropped: 730 user-space
/// instructions fewer per kept-alive request, which waits twice (BENCHMARKS.md, issue 18). The slot
/// holds one waker, so only one task may wait on a socket's read side this way: a connection's reads
/// and writes all run in its one task, and nothing hands a `&TcpStream` to another. Unlike `readable`,
/// each wait counts against tokio's per-task budget, so a relay that never has to wait still yields to
/// the other connections on its worker now and then.
async fn read_ready(s: &TcpStream) -> io::Result<()> {
    std::future::poll_fn(|cx| s.poll_read_ready(cx)).await
}

/// [`read_ready`] for the write side (`poll_write_ready`).
async fn write_ready(s: &TcpStream) -> io::Result<()> {
    std::future::poll_fn(|cx| s.poll_write_ready(cx)).await
}

/// Shuts down the write side of `stream`, passing a half-close on. Errors (the peer already gone) are
/// irrelevant: the other direction notices on its own.
pub(crate) fn shutdown_write(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
}

/// Copies `src` to `dst` until `src` ends (the caller passes the half-close on). Returns the bytes
/// copied; `counter` grows as they go, so a connection's log line can report progress even if it is
/// cut short.
///
/// Bytes go through a small buffer while they come in messages (requests, responses, TLS records of a
/// kept-alive exchange). When [`BULK_STREAK`] reads in a row fill it, the direction carries bulk data
/// and its reads become [`BULK_COPY`] large, until [`SMALL_STREAK`] reads in a row come back small
/// (see [`pump_copy`]). With splice on ([`splice_enabled`]), the same streak switches the direction to
/// splice(2) instead, and [`SMALL_STREAK`] splices in a row under [`SMALL_SPLICE`] switch it back to
/// copying and close the pipe: a pipe costs two descriptors and two system calls per message, which
/// pays off only for bulk data. (A fixed switch after the first 64 KiB put every long-lived kept-alive
/// connection on the splice path: 0.64x nginx's kept-alive requests/s.)
pub(crate) async fn pump(src: &TcpStream, dst: &TcpStream, counter: &AtomicU64) -> io::Result<u64> {
    let splice = splice_enabled();
    let mut total = 0u64;
    loop {
        let (copied, ended) = pump_copy(src, dst, counter, splice).await?;
        total += copied;
        if ended {
            return Ok(total);
        }
        match Pipe::new() {
            Ok(pipe) => {
                let (spliced, ended) = pump_splice(src, dst, pipe, counter).await?;
                total += spliced;
                if ended {
                    return Ok(total);
                }
            }
            // Out of descriptors: carry on copying.
            Err(_) => return Ok(total + pump_copy(src, dst, counter, false).await?.0),
        }
    }
}

/// Splices until `src` ends (`true`) or the data comes in small messages again (`false`, the pipe
/// empty).
async fn pump_splice(
    src: &TcpStream,
    dst: &TcpStream,
    mut pipe: Pipe,
    counter: &AtomicU64,
) -> io::Result<(u64, bool)> {
    let mut total = 0u64;
    let mut small = 0u32;
    loop {
        // Fill only an empty pipe: then EAGAIN can only mean "socket not readable", which is what
        // try_io needs to clear the right readiness.
        let n = loop {
            match src.try_io(Interest::READABLE, || {
                splice(src.as_raw_fd(), pipe.write.as_raw_fd(), PIPE_SIZE as usize)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => read_ready(src).await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok((total, true));
        }
        small = if n < SMALL_SPLICE { small + 1 } else { 0 };
        pipe.buffered = n;
        while pipe.buffered > 0 {
            match dst.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), dst.as_raw_fd(), pipe.buffered)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    pipe.buffered -= n;
                    total += n as u64;
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => write_ready(dst).await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if small >= SMALL_STREAK {
            return Ok((total, false));
        }
    }
}

/// Copies until `src` ends (`true`) or, when `to_bulk`, until [`BULK_STREAK`] reads in a row filled
/// [`COPY_BUF`] (`false`: the caller splices from there). Without `to_bulk` (no splice) such a streak
/// makes the reads [`BULK_COPY`] large instead, until [`SMALL_STREAK`] reads in a row come back under
/// [`COPY_BUF`] (the data comes in messages again), and while [`BULK_HELD_BUDGET`] is spent. A relay
/// holds a buffer of its own only while `dst` makes it wait (see [`copy_now`]), so an idle relay holds
/// none. `counter` grows with every write, partial ones included, so a slow reader's progress keeps
/// the connection from counting as idle.
///
/// A poll moves at most one read's worth before the next wait, and tokio's per-task budget makes a
/// relay whose two ends never make it wait yield after 128 of them (32 MiB at 256 KiB a read; the
/// splice path moves similar amounts).
async fn pump_copy(
    src: &TcpStream,
    dst: &TcpStream,
    counter: &AtomicU64,
    to_bulk: bool,
) -> io::Result<(u64, bool)> {
    let mut total = 0u64;
    // Reads in a row of at least COPY_BUF, and (while reads are BULK_COPY large) under it.
    let (mut full, mut small) = (0u32, 0u32);
    let mut max = COPY_BUF;
    loop {
        if to_bulk && full >= BULK_STREAK {
            return Ok((total, false));
        }
        read_ready(src).await?;
        let size = if max == BULK_COPY && BULK_HELD.load(Ordering::Relaxed) >= BULK_HELD_BUDGET {
            COPY_BUF
        } else {
            max
        };
        let (n, unsent) = match copy_now(src, dst, size) {
            Ok(copied) => copied,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok((total, true));
        }
        if n < COPY_BUF {
            full = 0;
            small = small.saturating_add(1);
            if small >= SMALL_STREAK {
                max = COPY_BUF;
            }
        } else {
            full = full.saturating_add(1);
            small = 0;
            if full >= BULK_STREAK && !to_bulk {
                max = BULK_COPY;
            }
        }
        let rest = unsent.as_deref().unwrap_or_default();
        counter.fetch_add((n - rest.len()) as u64, Ordering::Relaxed);
        if !rest.is_empty() {
            let _held = Held::new(rest.len());
            write_all_counted(dst, rest, Some(counter)).await?;
        }
        total += n as u64;
    }
}

thread_local! {
    /// The copy buffer of every relay on this thread: a relay only holds it between a read and the
    /// write that follows at once, with no wait in between.
    static COPY_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One read of at most `max` bytes from `src` (as [`read_drain`]) and, at once, as much of it written
/// to `dst` as `dst` takes without waiting. Returns the bytes read (0: end of stream) and what `dst` did
/// not take, which the caller writes once `dst` is writable: only then does a relay hold a buffer of its
/// own, of at most `max` bytes.
///
/// The bytes go through one buffer per thread instead of one taken from and given back to the
/// allocator per message (a kept-alive exchange's requests and responses each take one read). It keeps
/// the largest size asked of it: [`BULK_COPY`] once the thread has copied bulk data.
fn copy_now(src: &TcpStream, dst: &TcpStream, max: usize) -> io::Result<(usize, Option<Vec<u8>>)> {
    COPY_SCRATCH.with(|scratch| {
        // Nothing here waits, so nothing else on this thread can be holding the buffer.
        let mut buf = scratch.borrow_mut();
        buf.clear();
        let n = read_drain(src, &mut buf, max)?;
        let sent = write_now(dst, &buf[..n])?;
        Ok((n, (sent < n).then(|| buf[sent..n].to_vec())))
    })
}

/// Reads once from `src` into `buf` (appending at most `max` bytes) if tokio has seen it readable;
/// `WouldBlock` if not. A read that returns less than it asked for emptied the socket's receive queue
/// (TCP copies until the queue or the buffer runs out), so the readiness it ran on is cleared in the same
/// step, without the read that would fail with EAGAIN, as nginx does: one system call less per read,
/// about a third fewer per relayed message.
///
/// Safe against lost wake-ups on any runtime: the readiness (and its event tick) is taken before the
/// read, and tokio clears it only if no newer event has been seen since, so data that arrives during or
/// after the read (seen by a driver on another thread) keeps the socket readable; a seen end of stream is
/// never cleared. (Taking it after the read, as an earlier version did, lost such an event when another
/// thread ran the driver: a relay then waited for ever with bytes in its socket.)
fn read_drain(src: &TcpStream, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    use bytes::BufMut as _;
    buf.reserve(max);
    let mut got = 0;
    let read = src.try_io(Interest::READABLE, || {
        let n = src.try_read_buf(&mut buf.limit(max))?;
        got = n;
        if n > 0 && n < max {
            // Not an error: tells try_io to clear the readiness this read ran on.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match read {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        read => read,
    }
}

/// Writes as much of `data` to a shared stream as it takes without waiting; returns how much.
fn write_now(dst: &TcpStream, data: &[u8]) -> io::Result<usize> {
    let mut sent = 0;
    while sent < data.len() {
        match dst.try_write(&data[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// Writes all of `data` to a shared stream.
pub(crate) async fn write_all(dst: &TcpStream, data: &[u8]) -> io::Result<()> {
    write_all_counted(dst, data, None).await
}

/// [`write_all`], adding what each write sends to `counter`.
async fn write_all_counted(
    dst: &TcpStream,
    mut data: &[u8],
    counter: Option<&AtomicU64>,
) -> io::Result<()> {
    loop {
        let sent = write_now(dst, data)?;
        if let Some(counter) = counter {
            counter.fetch_add(sent as u64, Ordering::Relaxed);
        }
        data = &data[sent..];
        if data.is_empty() {
            return Ok(());
        }
        write_ready(dst).await?;
    }
}

/// The first read of a connection's side: tried at once with recv(2), without waiting for the runtime,
/// then as [`read_some`]. tokio learns a freshly registered socket's readiness only at its next turn of
/// the event loop, which under load is a good fraction of a millisecond, while the bytes a client sends
/// right after connecting (a ClientHello, a request head) are usually there by the time its connection
/// is first polled. Reading outside tokio's readiness is safe: it is never cleared here, so at worst
/// the next wait finds a stale readiness, retries and clears it. Costs one failed recv(2) when nothing
/// is there yet.
pub(crate) async fn read_first(
    src: &TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(max);
    match socket2::SockRef::from(src).recv_with_flags(&mut spare[..len], libc::MSG_DONTWAIT) {
        Ok(n) => {
            // SAFETY: recv initialised the first `n` (<= len) bytes after the vector's length.
            unsafe { buf.set_len(buf.len() + n) };
            Ok(n)
        }
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            read_some(src, buf, max).await
        }
        Err(e) => Err(e),
    }
}

/// [`read_first`] if `first` (a side's first read), otherwise [`read_some`].
pub(crate) async fn read_maybe_first(
    src: &TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
    first: bool,
) -> io::Result<usize> {
    if first {
        read_first(src, buf, max).await
    } else {
        read_some(src, buf, max).await
    }
}

/// Writes all of `data` to a side that has not been written to yet: the first attempt goes out at once
/// with send(2), without waiting for the runtime to report the fresh socket writable (see
/// [`read_first`]); whatever the socket does not take goes through [`write_all`].
pub(crate) async fn write_first(dst: &TcpStream, data: &[u8]) -> io::Result<()> {
    let sent = match socket2::SockRef::from(dst)
        .send_with_flags(data, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    {
        Ok(n) => n,
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            0
        }
        Err(e) => return Err(e),
    };
    write_all(dst, &data[sent..]).await
}

/// Reads once from a shared stream into `buf` (appending at most `max` bytes); `Ok(0)` is end of stream.
/// The buffer only grows once data is there, so an idle connection waiting here holds no buffer; the
/// read goes into spare capacity without zeroing it first, so a client sending one byte per segment costs
/// one byte of work per read, not `max`.
pub(crate) async fn read_some(src: &TcpStream, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    loop {
        read_ready(src).await?;
        match read_drain(src, buf, max) {
            Ok(n) => return Ok(n),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Relays both directions until both have ended (or one fails). Returns bytes client→upstream and
/// upstream→client.
pub(crate) async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    up: &AtomicU64,
    down: &AtomicU64,
) -> io::Result<()> {
    let a = async {
        pump(client, upstream, up).await?;
        shutdown_write(upstream);
        io::Result::Ok(())
    };
    let b = async {
        pump(upstream, client, down).await?;
        shutdown_write(client);
        io::Result::Ok(())
    };
    tokio::pin!(a, b);
    // The first error ends both directions: a reset on one side means the conversation is over.
    let (mut a_done, mut b_done) = (false, false);
    while !(a_done && b_done) {
        tokio::select! {
            r = &mut a, if !a_done => { r?; a_done = true; }
            r = &mut b, if !b_done => { r?; b_done = true; }
        }
    }
    Ok(())
}

/// Resolves once no byte has moved in either direction (the `up` and `down` counters a relay advances)
/// for `limit`; a connection runs its relay beside it (`Proxy::until_idle`) to close idle connections. It looks every quarter of `limit`,
/// so it resolves between `limit` and 1.25 × `limit` after the last byte, and an active connection
/// costs one timer wake-up per quarter: nothing per byte.
pub(crate) async fn idle(up: &AtomicU64, down: &AtomicU64, limit: Duration) {
    let tick = (limit / 4).max(Duration::from_millis(10));
    let total = || {
        up.load(Ordering::Relaxed)
            .wrapping_add(down.load(Ordering::Relaxed))
    };
    let mut seen = total();
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = tokio::time::Instant::now();
        let current = total();
        if current != seen {
            seen = current;
            quiet_since = now;
        } else if now.duration_since(quiet_since) >= limit {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// The tests that use [`BULK_HELD`], which the whole process shares, one at a time.
    static BULK_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Two loopback connections: `feed` writes into `src`, and `dst` writes to `out`; `dst`'s send
    /// buffer and `out`'s receive buffer small, so a relay to a slow `out` must wait early.
    async fn relay_ends() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let feed = TcpStream::connect(addr).await.unwrap();
        let (src, _) = listener.accept().await.unwrap();
        let out = tokio::net::TcpSocket::new_v4().unwrap();
        out.set_recv_buffer_size(32 * 1024).unwrap();
        let out = out.connect(addr).await.unwrap();
        let (dst, _) = listener.accept().await.unwrap();
        socket2::SockRef::from(&dst)
            .set_send_buffer_size(32 * 1024)
            .unwrap();
        (feed, src, dst, out)
    }

    /// A bulk direction copying to a slow reader: each write that the reader makes room for counts as
    /// progress, so the idle timeout does not close a connection that is still moving bytes (before,
    /// the counter moved only once a whole leftover of up to 256 KiB was out).
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_reader_of_a_bulk_copy_is_not_idle() {
        let _one = BULK_TESTS.lock().await;
        let (mut feed, src, dst, mut out) = relay_ends().await;
        let feeding = tokio::spawn(async move {
            let chunk = vec![7u8; 64 * 1024];
            while feed.write_all(&chunk).await.is_ok() {}
        });
        // About 50 KiB/s: a 256 KiB leftover would take five seconds to go out.
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if matches!(out.read(&mut buf).await, Ok(0) | Err(_)) {
                    break;
                }
            }
        });
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let limit = Duration::from_secs(1);
        let outcome = tokio::select! {
            r = pump_copy(&src, &dst, &down, false) => format!("the relay ended: {r:?}"),
            () = idle(&up, &down, limit) => format!("idle with {} bytes out", down.load(Ordering::Relaxed)),
            () = tokio::time::sleep(limit * 3) => String::from("busy"),
        };
        feeding.abort();
        reading.abort();
        assert_eq!(outcome, "busy");
        assert_eq!(
            BULK_HELD.load(Ordering::Relaxed),
            0,
            "a cancelled relay gave its share back"
        );
    }

    /// Clients that stop reading cannot make the process hold more than [`BULK_HELD_BUDGET`] (plus one
    /// read) in leftovers of bulk reads: past it, directions read 16 KiB at a time. Cancelled relays
    /// give their share back.
    #[tokio::test(flavor = "current_thread")]
    async fn stalled_bulk_copies_stay_within_the_budget() {
        let _one = BULK_TESTS.lock().await;
        let mut tasks = tokio::task::JoinSet::new();
        // More stalled directions than the budget has room for at the smallest leftover that counts.
        for _ in 0..BULK_HELD_BUDGET / COPY_BUF / 4 {
            let (mut feed, src, dst, out) = relay_ends().await;
            tasks.spawn(async move {
                let chunk = vec![7u8; 256 * 1024];
                while feed.write_all(&chunk).await.is_ok() {}
            });
            tasks.spawn(async move {
                let _ = pump_copy(&src, &dst, &AtomicU64::new(0), false).await;
                drop(out);
            });
            tokio::task::yield_now().await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let now = BULK_HELD.load(Ordering::Relaxed);
            assert!(now < BULK_HELD_BUDGET + BULK_COPY, "{now} bytes held");
            if now >= BULK_HELD_BUDGET {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stalled relays held only {now} bytes: the test did not reach the budget"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Every relay gets its turns after the budget is spent, and none adds to it.
        for _ in 0..50 {
            tokio::task::yield_now().await;
            let now = BULK_HELD.load(Ordering::Relaxed);
            assert!(now < BULK_HELD_BUDGET + BULK_COPY, "{now} bytes held");
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        assert_eq!(BULK_HELD.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_resolves_after_quiet_and_not_while_bytes_move() {
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let limit = Duration::from_secs(100);
        let start = tokio::time::Instant::now();
        let busy = async {
            // A byte every 60 s for 10 minutes: never 100 s quiet.
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(60)).await;
                down.fetch_add(1, Ordering::Relaxed);
            }
        };
        tokio::select! {
            () = idle(&up, &down, limit) => panic!("closed while active"),
            () = busy => {}
        }
        let quiet_from = tokio::time::Instant::now();
        idle(&up, &down, limit).await;
        let waited = quiet_from.duration_since(start);
        assert!(waited >= Duration::from_secs(600));
        let quiet = tokio::time::Instant::now().duration_since(quiet_from);
        assert!(quiet >= limit && quiet <= limit + limit / 4, "{quiet:?}");
    }
}
