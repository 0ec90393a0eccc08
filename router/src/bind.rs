//! Binding every listener before anything is served: one socket per worker and address.
//!
//! How it fits: [`bind_workers`] runs at start-up, and [`crate::reload`] calls [`bind_forward`] for the
//! `host:port` entries a reload adds, so a bad or busy address fails the start (or the reload) before
//! anything is served on it. Each worker then registers its [`WorkerSockets`] with its own runtime.

use std::net::SocketAddr;

use agent_sandbox_shared::{HostName, ValidConfig};
use anyhow::Context as _;
use tokio::net::{TcpListener, UdpSocket};

use crate::{dns_udp, proxy};

/// Every socket the router serves, bound before anything is served.
#[derive(Debug)]
pub struct Listeners {
    /// DNS over UDP: several sockets on one port (SO_REUSEPORT), one receive loop each.
    pub dns_udp: Vec<UdpSocket>,
    /// DNS over TCP.
    pub dns_tcp: Option<TcpListener>,
    /// HTTP, routed by Host.
    pub http: Option<TcpListener>,
    /// TLS, routed by SNI.
    pub https: Option<TcpListener>,
    /// One listener per host:port entry.
    pub forwards: Vec<(HostName, u16, TcpListener)>,
}

impl Listeners {
    /// Each listener's bound address and protocol, for the "listening on" lines and tests.
    #[must_use]
    pub fn addresses(&self) -> Vec<(SocketAddr, String)> {
        let mut out = Vec::new();
        let mut push = |addr: std::io::Result<SocketAddr>, proto: String| {
            if let Ok(a) = addr {
                out.push((a, proto));
            }
        };
        if let Some(s) = self.dns_udp.first() {
            push(s.local_addr(), "dns/udp".into());
        }
        if let Some(s) = &self.dns_tcp {
            push(s.local_addr(), "dns/tcp".into());
        }
        if let Some(s) = &self.http {
            push(s.local_addr(), "http".into());
        }
        if let Some(s) = &self.https {
            push(s.local_addr(), "https".into());
        }
        for (host, port, l) in &self.forwards {
            push(l.local_addr(), format!("forward {host}:{port}"));
        }
        out
    }
}

/// The sockets of one worker, bound but not yet registered with a runtime: each worker runs its own
/// single-threaded runtime, and a socket belongs to the runtime that registers it.
#[derive(Debug)]
pub struct WorkerSockets {
    /// DNS over UDP (one SO_REUSEPORT socket per worker).
    pub(crate) dns_udp: Vec<std::net::UdpSocket>,
    /// DNS over TCP (the first worker's).
    pub(crate) dns_tcp: Option<std::net::TcpListener>,
    /// HTTP.
    pub(crate) http: Option<std::net::TcpListener>,
    /// TLS.
    pub(crate) https: Option<std::net::TcpListener>,
    /// One per host:port entry.
    pub(crate) forwards: Vec<(HostName, u16, std::net::TcpListener)>,
}

impl WorkerSockets {
    /// Registers the sockets with the current runtime.
    pub fn register(self) -> std::io::Result<Listeners> {
        let tcp = |l: Option<std::net::TcpListener>| l.map(TcpListener::from_std).transpose();
        Ok(Listeners {
            dns_udp: self
                .dns_udp
                .into_iter()
                .map(UdpSocket::from_std)
                .collect::<Result<_, _>>()?,
            dns_tcp: tcp(self.dns_tcp)?,
            http: tcp(self.http)?,
            https: tcp(self.https)?,
            forwards: self
                .forwards
                .into_iter()
                .map(|(h, p, l)| Ok((h, p, TcpListener::from_std(l)?)))
                .collect::<std::io::Result<_>>()?,
        })
    }
}

/// Binds every listener of the configuration once per worker, before anything is served; the error
/// names the address that failed. With several workers each TCP address gets one SO_REUSEPORT socket per
/// worker, so the kernel spreads new connections over the workers (as nginx's `reuseport` does) and no
/// worker steals another's; a single worker gets plain TCP sockets. DNS over UDP gets one SO_REUSEPORT
/// socket per worker; DNS over TCP is served by the first worker.
///
/// An address someone already holds is an error, SO_REUSEPORT or not: each shared address is first
/// bound exclusively, so a second router (or anything else) on the same port is refused rather than
/// joined, and connections are never split between two policies. (Linux lets a socket join a
/// SO_REUSEPORT group only under the same effective uid anyway.)
pub fn bind_workers(config: &ValidConfig, workers: usize) -> anyhow::Result<Vec<WorkerSockets>> {
    let workers = workers.max(1);
    let listen = &config.listen;
    let mut sets: Vec<WorkerSockets> = (0..workers)
        .map(|_| WorkerSockets {
            dns_udp: Vec::new(),
            dns_tcp: None,
            http: None,
            https: None,
            forwards: Vec::new(),
        })
        .collect();
    if let Some(addr) = listen.dns {
        let (udp, tcp) = bind_dns(addr, workers)?;
        for (i, socket) in udp.into_iter().enumerate() {
            sets[i % workers].dns_udp.push(socket);
        }
        sets[0].dns_tcp = Some(tcp);
    }
    if let Some(addr) = listen.http {
        for (set, l) in sets.iter_mut().zip(
            bind_tcp_many(addr, workers, Opening::Client)
                .with_context(|| format!("cannot listen for HTTP on {addr}"))?,
        ) {
            set.http = Some(l);
        }
    }
    if let Some(addr) = listen.https {
        for (set, l) in sets.iter_mut().zip(
            bind_tcp_many(addr, workers, Opening::Client)
                .with_context(|| format!("cannot listen for TLS on {addr}"))?,
        ) {
            set.https = Some(l);
        }
    }
    for (host, port, addr) in &config.forwards {
        for (set, l) in sets
            .iter_mut()
            .zip(bind_forward(host, *port, *addr, workers)?)
        {
            set.forwards.push((host.clone(), *port, l));
        }
    }
    Ok(sets)
}

/// The listeners of one `host:port` entry on `addr`, one per worker.
pub(crate) fn bind_forward(
    host: &HostName,
    port: u16,
    addr: SocketAddr,
    workers: usize,
) -> anyhow::Result<Vec<std::net::TcpListener>> {
    bind_tcp_many(addr, workers.max(1), Opening::Any)
        .with_context(|| format!("cannot listen for the entry {host}:{port} on {addr}"))
}

/// DNS sockets: `count` UDP sockets sharing the port, and TCP on the same port. With port 0 (tests),
/// TCP takes the port UDP was given; if another socket already has that TCP port, try another.
pub(crate) fn bind_dns(
    addr: SocketAddr,
    count: usize,
) -> anyhow::Result<(Vec<std::net::UdpSocket>, std::net::TcpListener)> {
    let attempts = if addr.port() == 0 { 20 } else { 1 };
    if addr.port() != 0 {
        drop(
            std::net::UdpSocket::bind(addr)
                .with_context(|| format!("cannot listen for DNS on {addr} (udp)"))?,
        );
    }
    let mut last_error = None;
    for _ in 0..attempts {
        let udp = dns_udp::bind_many(addr, count)
            .with_context(|| format!("cannot listen for DNS on {addr} (udp)"))?;
        let tcp_addr = udp
            .first()
            .and_then(|s| s.local_addr().ok())
            .unwrap_or(addr);
        match bind_tcp(tcp_addr, false, Opening::Client) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last_error = Some((tcp_addr, e)),
        }
    }
    let (tcp_addr, e) = last_error.expect("the loop runs at least once");
    Err(anyhow::Error::new(e).context(format!("cannot listen for DNS on {tcp_addr} (tcp)")))
}

/// `count` listeners on one address: SO_REUSEPORT when more than one (port 0 takes the port the first
/// was given).
pub(crate) fn bind_tcp_many(
    addr: SocketAddr,
    count: usize,
    opening: Opening,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let shared = count > 1;
    if shared && addr.port() != 0 {
        // Exclusively first: a listener already on the address (another router's SO_REUSEPORT group
        // included) makes this fail with EADDRINUSE instead of letting the group below join it.
        drop(bind_tcp(addr, false, opening)?);
    }
    let first = bind_tcp(addr, shared, opening)?;
    let addr = first.local_addr()?;
    let mut out = vec![first];
    for _ in 1..count {
        out.push(bind_tcp(addr, shared, opening)?);
    }
    Ok(out)
}

/// Who speaks first on a listener's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    /// Always the client (a TLS ClientHello, an HTTP request head, a DNS query): the kernel completes a
    /// new connection's handshake but hands it to the router only once its first bytes have arrived
    /// (TCP_DEFER_ACCEPT), so accepting it and reading its first bytes take one wake-up, not two. Until
    /// then the connection is one of the kernel's half-open ones (no connection slot, no per-client
    /// cap; past the backlog the kernel falls back to SYN cookies, which are not deferred). A client
    /// that connects and sends nothing is handed over after [`DEFER_ACCEPT_SECS`], once it acknowledges
    /// the SYN-ACK the kernel resends then; the peek timeout runs from then. README, "Bounds".
    Client,
    /// Not known (`host:port` entries carry any protocol, and some servers greet first): handed over
    /// at once.
    Any,
}

/// How long the kernel holds a silent connection on an [`Opening::Client`] listener before handing it
/// over anyway. The kernel turns this into a count of SYN-ACK retransmissions, rounding up to its
/// schedule (1 s, then 3, 7, 15 s in all): 1 is one retransmission, after 1 s. Long enough for any
/// client's first bytes, short enough that a silent one still meets the peek timeout about a second
/// later than it would without.
pub const DEFER_ACCEPT_SECS: u32 = 1;

/// Connections the kernel completes and queues for a listener before the router accepts them. A burst
/// beyond the queue overflows it into SYN cookies (see `TestRouter`'s listeners for what that did to the
/// tests), so the queue is deep. The kernel caps it at `net.core.somaxconn` (4096 by default).
pub(crate) const LISTEN_BACKLOG: i32 = 1024;

/// One TCP listener on `addr`, bound as the router binds its own (see [`bind_tcp`]), for a caller that
/// serves a [`crate::proxy::Proxy`] itself, as the in-process tests do: [`Opening::Client`] for HTTP
/// and TLS, [`Opening::Any`] for a `host:port` entry.
///
/// # Errors
/// The socket cannot be made, set up, bound or put to listen.
pub fn tcp_listener(addr: SocketAddr, opening: Opening) -> std::io::Result<std::net::TcpListener> {
    bind_tcp(addr, false, opening)
}

/// A non-blocking TCP listener with SO_REUSEADDR (a restarted router must not wait out TIME_WAIT), a deep
/// backlog ([`LISTEN_BACKLOG`]), the options every accepted connection inherits (no Nagle delay,
/// keepalive), and for [`Opening::Client`] the deferred accept.
pub(crate) fn bind_tcp(
    addr: SocketAddr,
    reuse_port: bool,
    opening: Opening,
) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    proxy::upstream::tune(socket2::SockRef::from(&socket))?;
    if opening == Opening::Client {
        // Only an optimisation: where the kernel lacks it (a user-space network stack, say), the
        // listener works the same and wakes once more per connection.
        if let Err(error) = defer_accept(&socket, DEFER_ACCEPT_SECS) {
            tracing::debug!(%error, %addr, "TCP_DEFER_ACCEPT not available; accepting at once");
        }
    }
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// TCP_DEFER_ACCEPT (socket2 has no call for it).
fn defer_accept(socket: &socket2::Socket, secs: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let value = libc::c_int::try_from(secs).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid descriptor, a pointer to a c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::addr_of!(value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::upstream::{KEEPALIVE_INTERVAL, KEEPALIVE_RETRIES, KEEPALIVE_TIME};

    /// The queue of completed connections a listener holds, as the kernel reports it for a listening
    /// socket (TCP_INFO's `tcpi_sacked`).
    fn listen_queue_limit(listener: &std::net::TcpListener) -> u32 {
        use std::os::fd::AsRawFd as _;
        // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes into it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: a valid descriptor, a buffer of `len` bytes and its length.
        let r = unsafe {
            libc::getsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                std::ptr::addr_of_mut!(info).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        info.tcpi_sacked
    }

    /// Every listener gets the deep queue, the one the in-process tests serve included (tokio's
    /// `TcpListener::bind` gave 128 here, which a burst of 400 connections overflowed into SYN cookies).
    #[test]
    fn listeners_have_the_deep_backlog() {
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .map_or(4096, |s| s.trim().parse().unwrap_or(4096));
        let want = (LISTEN_BACKLOG as u32).min(somaxconn);
        let one = tcp_listener("127.0.0.1:0".parse().unwrap(), Opening::Any).unwrap();
        assert_eq!(listen_queue_limit(&one), want);
        for l in bind_tcp_many("127.0.0.1:0".parse().unwrap(), 2, Opening::Client).unwrap() {
            assert_eq!(listen_queue_limit(&l), want);
        }
    }

    /// Another process's SO_REUSEPORT group on the address (a second router, say) is not joined: the
    /// router refuses to start rather than split connections with it.
    #[test]
    fn an_address_held_by_another_reuseport_group_is_refused() {
        use socket2::{Domain, Protocol, Socket, Type};
        let held = |ty: Type, proto: Protocol| {
            let s = Socket::new(Domain::IPV4, ty, Some(proto)).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
                .unwrap();
            if ty == Type::STREAM {
                s.listen(16).unwrap();
            }
            let addr = s.local_addr().unwrap().as_socket().unwrap();
            (s, addr)
        };
        let (_tcp, addr) = held(Type::STREAM, Protocol::TCP);
        let e = bind_tcp_many(addr, 2, Opening::Any).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        let (_udp, addr) = held(Type::DGRAM, Protocol::UDP);
        let e = bind_dns(addr, 2).unwrap_err();
        assert!(format!("{e:#}").contains("Address already in use"), "{e:#}");
    }

    /// The per-connection options are set once on the listener: accepted sockets must inherit them.
    #[tokio::test]
    async fn accepted_connections_inherit_the_listener_options() {
        let listener = TcpListener::from_std(
            bind_tcp("127.0.0.1:0".parse().unwrap(), false, Opening::Any).unwrap(),
        )
        .unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let sock = socket2::SockRef::from(&accepted);
        assert!(sock.tcp_nodelay().unwrap(), "TCP_NODELAY");
        assert!(sock.keepalive().unwrap(), "SO_KEEPALIVE");
        assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_TIME);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_RETRIES);
    }

    /// Whether `listener` has a connection to hand over within `wait` (poll(2), nothing accepted).
    fn ready_within(listener: &std::net::TcpListener, wait: std::time::Duration) -> bool {
        use std::os::fd::AsRawFd as _;
        let mut fd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(wait.as_millis()).unwrap();
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut fd, 1, ms) };
        assert!(n >= 0, "{}", std::io::Error::last_os_error());
        n == 1
    }

    /// A client-first listener hands a connection over once its first bytes are in, and a silent one
    /// only after about DEFER_ACCEPT_SECS; a listener for any protocol hands over at once.
    #[test]
    fn client_first_listeners_defer_the_accept_until_the_first_bytes() {
        use std::io::Write as _;
        use std::time::{Duration, Instant};
        let any = tcp_listener("127.0.0.1:0".parse().unwrap(), Opening::Any).unwrap();
        let _silent_any = std::net::TcpStream::connect(any.local_addr().unwrap()).unwrap();
        assert!(
            ready_within(&any, Duration::from_secs(5)),
            "not handed over"
        );

        // With `tcp_syncookies` 2 every connection is a SYN cookie, and cookies are never deferred.
        if std::fs::read_to_string("/proc/sys/net/ipv4/tcp_syncookies")
            .is_ok_and(|s| s.trim() == "2")
        {
            eprintln!("skipped: net.ipv4.tcp_syncookies is 2 (cookies for every connection)");
            return;
        }
        let client = tcp_listener("127.0.0.1:0".parse().unwrap(), Opening::Client).unwrap();
        let addr = client.local_addr().unwrap();
        // Before the connect: the kernel's 1 s starts with its SYN-ACK.
        let connecting = Instant::now();
        let silent = std::net::TcpStream::connect(addr).unwrap();
        assert!(
            !ready_within(&client, Duration::from_millis(300)),
            "a silent connection was handed over at once"
        );
        let mut talker = std::net::TcpStream::connect(addr).unwrap();
        talker.write_all(&[0x16]).unwrap();
        assert!(
            ready_within(&client, Duration::from_secs(5)),
            "not handed over"
        );
        let (_, from) = client.accept().unwrap();
        assert_eq!(from, talker.local_addr().unwrap(), "the talker comes first");
        // The silent one after the deferral (the kernel counts it in SYN-ACK retransmissions).
        assert!(
            ready_within(&client, Duration::from_secs(10)),
            "never handed over"
        );
        let waited = connecting.elapsed();
        assert!(
            waited >= Duration::from_millis(900),
            "handed over after {waited:?}"
        );
        let (_, from) = client.accept().unwrap();
        assert_eq!(from, silent.local_addr().unwrap());
    }
}
