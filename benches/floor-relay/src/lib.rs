//! The floor relay: a benchmark reference, never a product. It relays each connection accepted on a
//! listening address to one fixed upstream address, bytes as they come, both ways, until both ends have
//! finished: no name, no parsing, no policy, no resolver, no log, no limits, no timeouts, one thread.
//!
//! What it is for: `benches/floor.sh` runs it beside the router and nginx against the same upstream. A
//! proxy that reads a name, decides and dials cannot do much less work per connection than this does (a
//! few system calls here could go: the `getpeername` after a connect, the first read of a fresh client,
//! the no-Nagle options; it also dials at accept, which such a proxy cannot), so its figures bound, to
//! within a few percent, what any of them can reach on the machine, and the goals of the performance
//! issue can be judged against that bound rather than against hope.
//!
//! What it does, and why each thing is the least:
//! - one thread, epoll through mio (edge-triggered); its listeners are bound as nginx's are in the
//!   benches (a queue of 4,096, SO_REUSEPORT: run one process per core for nginx's shape);
//! - each accepted connection gets a non-blocking connect to the upstream and no-Nagle on both sides;
//! - each direction has one 16 KiB buffer (from a pool, so none is allocated in the steady state);
//! - a read that returns less than it asked for emptied the socket, so the next read waits for the next
//!   edge (no read that fails with EAGAIN), unless the peer's FIN is already known (tokio, under the
//!   router, follows the same rule; neither holds for TCP urgent data, where a read stops at the urgent
//!   mark, which wrk never sends);
//! - end of stream on one side is passed on as a half-close (shutdown of the other side's write), and a
//!   connection is closed once both directions have ended, or at its first error.
//!
//! It is not safe to expose: it relays to its upstream for anyone who connects, holds connections
//! forever and has no cap. The benches bind it to loopback only.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

/// Bytes buffered per direction of a connection.
const BUF: usize = 16 * 1024;

/// The poll token of the stop waker; listeners are tokens `0..n`, connections' sides follow.
const WAKE: Token = Token(usize::MAX);

/// One listening address and the upstream its connections go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// Where to accept.
    pub listen: SocketAddr,
    /// Where every accepted connection is relayed.
    pub upstream: SocketAddr,
}

/// Parses `--pair LISTEN=UPSTREAM` (one or more; socket addresses with ports).
pub fn parse_args(args: &[String]) -> anyhow::Result<Vec<Pair>> {
    let mut pairs = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = match arg.as_str() {
            "--pair" => it
                .next()
                .context("--pair needs a value: LISTEN_ADDR:PORT=UPSTREAM_ADDR:PORT")?,
            other => match other.strip_prefix("--pair=") {
                Some(v) => v,
                None => bail!("unknown argument {other:?}"),
            },
        };
        let (listen, upstream) = value.split_once('=').with_context(|| {
            format!("--pair {value:?}: expected LISTEN_ADDR:PORT=UPSTREAM_ADDR:PORT")
        })?;
        let listen = listen
            .parse()
            .with_context(|| format!("--pair {value:?}: listening address {listen:?}"))?;
        let upstream = upstream
            .parse()
            .with_context(|| format!("--pair {value:?}: upstream address {upstream:?}"))?;
        pairs.push(Pair { listen, upstream });
    }
    if pairs.is_empty() {
        bail!("no --pair given");
    }
    for (i, p) in pairs.iter().enumerate() {
        if pairs[..i].iter().any(|q| q.listen == p.listen) {
            // SO_REUSEPORT would let both bind and split the connections silently.
            bail!("--pair: {} is given twice", p.listen);
        }
    }
    Ok(pairs)
}

/// Binds every pair and relays until the process ends.
pub fn run(pairs: &[Pair], stop: Option<Arc<AtomicBool>>) -> anyhow::Result<()> {
    let relay = Relay::bind(pairs)?;
    relay.serve(stop.unwrap_or_default())
}

/// Stops a serving [`Relay`] from another thread.
#[derive(Debug, Clone)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl StopHandle {
    /// Asks the relay to return from [`Relay::serve`]; it drops every connection it holds.
    pub fn stop(&self) -> io::Result<()> {
        self.flag.store(true, Ordering::SeqCst);
        self.waker.wake()
    }
}

/// One side of a connection with what edge-triggered readiness has told about it.
#[derive(Debug)]
struct Side {
    stream: TcpStream,
    /// The last edge said readable and no read has emptied the socket since.
    readable: bool,
    writable: bool,
    /// The peer's FIN (or an error) was reported: read on to the end even after a short read.
    read_closed: bool,
    /// The upstream's connect has completed (a client side always has).
    connected: bool,
}

/// One direction's buffer and state.
#[derive(Debug)]
struct Dir {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The source reached end of stream.
    eof: bool,
    /// The end of stream was passed on to the destination.
    done: bool,
}

#[derive(Debug)]
struct Conn {
    client: Side,
    upstream: Side,
    /// Client to upstream.
    up: Dir,
    /// Upstream to client.
    down: Dir,
}

/// The relay's listeners and connections.
#[derive(Debug)]
pub struct Relay {
    poll: Poll,
    listeners: Vec<(TcpListener, SocketAddr)>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    pool: Vec<Box<[u8]>>,
    /// Listeners whose accept ran out of descriptors: accepted from again at the next close.
    starved: Vec<usize>,
    waker: Arc<Waker>,
    flag: Arc<AtomicBool>,
}

impl Relay {
    /// Binds every pair's listening address (see [`listen`]).
    pub fn bind(pairs: &[Pair]) -> anyhow::Result<Relay> {
        let poll = Poll::new().context("creating the epoll instance")?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE).context("creating the stop waker")?);
        let mut listeners = Vec::with_capacity(pairs.len());
        for (i, pair) in pairs.iter().enumerate() {
            let mut l = listen(pair.listen).with_context(|| format!("binding {}", pair.listen))?;
            poll.registry()
                .register(&mut l, Token(i), Interest::READABLE)
                .with_context(|| format!("registering the listener on {}", pair.listen))?;
            listeners.push((l, pair.upstream));
        }
        Ok(Relay {
            poll,
            listeners,
            conns: Vec::new(),
            free: Vec::new(),
            pool: Vec::new(),
            starved: Vec::new(),
            waker,
            flag: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The bound listening addresses, in the order of the pairs (to learn ports bound as 0).
    pub fn local_addrs(&self) -> io::Result<Vec<SocketAddr>> {
        self.listeners.iter().map(|(l, _)| l.local_addr()).collect()
    }

    /// A handle that stops [`Relay::serve`].
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            flag: self.flag.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Relays until stopped (by `stop` or a [`StopHandle`]).
    pub fn serve(mut self, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            match self.poll.poll(&mut events, None) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("waiting for events"),
            }
            for event in &events {
                let token = event.token();
                if token == WAKE {
                    continue;
                }
                if token.0 < self.listeners.len() {
                    self.accept(token.0)?;
                    continue;
                }
                let k = token.0 - self.listeners.len();
                let (index, upstream_side) = (k / 2, k % 2 == 1);
                let Some(Some(conn)) = self.conns.get_mut(index) else {
                    continue;
                };
                let side = if upstream_side {
                    &mut conn.upstream
                } else {
                    &mut conn.client
                };
                side.readable |= event.is_readable() || event.is_read_closed() || event.is_error();
                side.writable |= event.is_writable() || event.is_error();
                side.read_closed |= event.is_read_closed() || event.is_error();
                let open = drive(conn).unwrap_or(false);
                if !open {
                    self.close(index)?;
                }
            }
            if stop.load(Ordering::SeqCst) || self.flag.load(Ordering::SeqCst) {
                return Ok(());
            }
        }
    }

    fn accept(&mut self, which: usize) -> anyhow::Result<()> {
        loop {
            let (listener, upstream_addr) = &self.listeners[which];
            let upstream_addr = *upstream_addr;
            let client = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors or memory: the queue keeps the rest, and no new edge may come
                // for them (the listener is edge-triggered), so the next close accepts again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    eprintln!(
                        "agent-sandbox-floor-relay: accept: {e}; accepting again after a close"
                    );
                    self.starved.push(which);
                    return Ok(());
                }
                // One connection's failure (reset before it was accepted, and the like): the next.
                Err(e) => {
                    eprintln!("agent-sandbox-floor-relay: accept: {e}");
                    continue;
                }
            };
            let upstream = match TcpStream::connect(upstream_addr) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("agent-sandbox-floor-relay: connect {upstream_addr}: {e}");
                    continue;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let index = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            let base = self.listeners.len() + index * 2;
            let mut conn = Conn {
                client: Side {
                    stream: client,
                    readable: true,
                    writable: true,
                    read_closed: false,
                    connected: true,
                },
                upstream: Side {
                    stream: upstream,
                    readable: false,
                    writable: false,
                    read_closed: false,
                    connected: false,
                },
                up: Dir::new(self.pool.pop()),
                down: Dir::new(self.pool.pop()),
            };
            let both = Interest::READABLE | Interest::WRITABLE;
            let registry = self.poll.registry();
            if registry
                .register(&mut conn.client.stream, Token(base), both)
                .and_then(|()| registry.register(&mut conn.upstream.stream, Token(base + 1), both))
                .is_err()
            {
                self.pool.push(conn.up.buf);
                self.pool.push(conn.down.buf);
                self.free.push(index);
                continue;
            }
            self.conns[index] = Some(conn);
        }
    }

    fn close(&mut self, index: usize) -> anyhow::Result<()> {
        if let Some(Conn {
            client,
            upstream,
            up,
            down,
        }) = self.conns[index].take()
        {
            // Closing the descriptors removes them from the epoll set, and frees two for a starved
            // listener.
            drop((client, upstream));
            self.pool.push(up.buf);
            self.pool.push(down.buf);
            self.free.push(index);
            for which in std::mem::take(&mut self.starved) {
                self.accept(which)?;
            }
        }
        Ok(())
    }
}

/// A listening socket as nginx's is in the benches: SO_REUSEADDR, SO_REUSEPORT (so several processes
/// can each have a queue of their own on one address, one per core, as nginx's workers do), a queue of
/// 4,096.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(TcpListener::from_std(s.into()))
}

impl Dir {
    fn new(buf: Option<Box<[u8]>>) -> Dir {
        Dir {
            buf: buf.unwrap_or_else(|| vec![0u8; BUF].into_boxed_slice()),
            start: 0,
            end: 0,
            eof: false,
            done: false,
        }
    }
}

/// Moves what can be moved now in both directions. `Ok(false)`: the connection is over.
fn drive(conn: &mut Conn) -> io::Result<bool> {
    let up = &mut conn.upstream;
    if !up.connected && (up.writable || up.readable) {
        if let Some(e) = up.stream.take_error()? {
            return Err(e);
        }
        match up.stream.peer_addr() {
            Ok(_) => up.connected = true,
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                up.writable = false;
                up.readable = false;
            }
            Err(e) => return Err(e),
        }
    }
    pump(&mut conn.client, &mut conn.upstream, &mut conn.up)?;
    pump(&mut conn.upstream, &mut conn.client, &mut conn.down)?;
    Ok(!(conn.up.done && conn.down.done))
}

/// Moves bytes from `src` to `dst` until one of them would block or `src` has ended.
fn pump(src: &mut Side, dst: &mut Side, d: &mut Dir) -> io::Result<()> {
    loop {
        while d.start < d.end {
            if !dst.writable || !dst.connected {
                return Ok(());
            }
            match dst.stream.write(&d.buf[d.start..d.end]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    d.start += n;
                    if d.start < d.end {
                        // A short write filled the send buffer: wait for the next edge.
                        dst.writable = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        d.start = 0;
        d.end = 0;
        if d.eof {
            if !d.done && dst.connected {
                // The peer may already be gone; the other direction finds out on its own.
                let _ = dst.stream.shutdown(Shutdown::Write);
                d.done = true;
            }
            return Ok(());
        }
        if !src.readable || !src.connected {
            return Ok(());
        }
        match src.stream.read(&mut d.buf) {
            Ok(0) => d.eof = true,
            Ok(n) => {
                d.end = n;
                if n < d.buf.len() && !src.read_closed {
                    // TCP copies until its queue runs out: this read emptied it.
                    src.readable = false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => src.readable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn pairs_parse_and_bad_ones_say_why() {
        let p = parse_args(&args(&[
            "--pair",
            "127.0.0.1:80=10.0.0.1:8080",
            "--pair=[::1]:443=[::1]:8443",
        ]))
        .unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].listen, "127.0.0.1:80".parse().unwrap());
        assert_eq!(p[1].upstream, "[::1]:8443".parse().unwrap());
        for (bad, says) in [
            (&["--pair"][..], "needs a value"),
            (&["--pair", "127.0.0.1:80"][..], "expected LISTEN"),
            (
                &["--pair", "localhost:80=127.0.0.1:81"][..],
                "listening address",
            ),
            (
                &["--pair", "127.0.0.1:80=127.0.0.1"][..],
                "upstream address",
            ),
            (&["--port", "80"][..], "unknown argument"),
            (
                &[
                    "--pair",
                    "127.0.0.1:80=10.0.0.1:80",
                    "--pair",
                    "127.0.0.1:80=10.0.0.2:80",
                ][..],
                "given twice",
            ),
            (&[][..], "no --pair"),
        ] {
            let e = format!("{:#}", parse_args(&args(bad)).unwrap_err());
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
