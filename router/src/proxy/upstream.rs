//! Resolving an allowed name and dialling it: the only place the router opens outbound connections.
//!
//! How it fits: once a listener has decided on a name, [`Upstream::connect`] resolves it with
//! hickory-resolver (the configured servers, or the router's own /etc/resolv.conf and /etc/hosts), checks
//! every address it got, and connects to exactly the addresses that passed, one after the other, within
//! the connect timeout. The name is resolved fully qualified (with a trailing dot), so a search domain
//! such as podman's `dns.podman` is never appended, and only when a connection needs it, so names under
//! a wildcard entry never reach the upstream resolver from DNS queries alone. The shared
//! [`ResolveCache`] answers first (filled with hickory's answers until their TTL runs out); a name the
//! cache cannot answer is resolved only if the caller's budget allows (the wildcard lookup budget).
//!
//! The address check is what defeats DNS rebinding: whatever an allowed name resolves to, the router never
//! dials loopback, unspecified, link-local, multicast or broadcast addresses, nor any of its own addresses
//! (which would reach its own listeners or services bound on the host side). IPv4-mapped IPv6 addresses are
//! judged as the IPv4 address they carry. Private ranges stay allowed: internal names must work.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sandbox_shared::HostName;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

use super::cache::ResolveCache;
use super::routes::next_hops;

/// How long the list of the router's own addresses is reused before it is read again (in the
/// background, while dials go on with it).
const OWN_ADDRESSES_TTL: Duration = Duration::from_secs(1);

/// The oldest the list may be for a dial to use it at all: older (after an idle spell, or a re-read
/// that never came back), the dial reads it again itself and waits.
const OWN_ADDRESSES_MAX_AGE: Duration = Duration::from_secs(2);

/// The shortest time given to one connection attempt when several addresses share the budget.
const MIN_ATTEMPT: Duration = Duration::from_millis(500);

/// Why no upstream connection was made.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The name did not resolve (NXDOMAIN, no records, resolver failure).
    #[error("cannot resolve {name}: {message}")]
    Resolve {
        /// The name.
        name: HostName,
        /// hickory's message.
        message: String,
    },
    /// Resolution took longer than the connect timeout.
    #[error("resolving {0} timed out")]
    ResolveTimeout(HostName),
    /// An address the router never dials; nothing was dialled.
    #[error("resolves to a forbidden address {addr} ({why})")]
    Forbidden {
        /// The offending address, as resolved.
        addr: IpAddr,
        /// Which rule it broke.
        why: &'static str,
    },
    /// The name is allowed only under a wildcard entry, the resolver cache has no answer for it, and
    /// the client has used its wildcard lookup budget: nothing was looked up.
    #[error("{name} is allowed only through a wildcard entry and this client has used its {per_minute} lookups of such names this minute (--wildcard-lookups-per-minute)")]
    WildcardBudget {
        /// The name.
        name: HostName,
        /// The budget per client per minute.
        per_minute: u32,
    },
    /// Every address was tried and none connected in time.
    #[error("cannot connect to {name}: {attempts}")]
    Connect {
        /// The name.
        name: HostName,
        /// Each address and its error.
        attempts: String,
    },
}

impl DialError {
    /// True when the failure is a policy refusal (logged as `refused`) rather than an upstream fault.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            DialError::Forbidden { .. } | DialError::WildcardBudget { .. }
        )
    }
}

/// Why an address may never be dialled, or `None` when it may. `own` holds the router's own addresses
/// and the next hops of its routes ([`OwnAddresses`]).
#[must_use]
pub fn forbidden_reason(ip: IpAddr, own: &HashSet<IpAddr>) -> Option<&'static str> {
    let ip = normalise(ip);
    if own.contains(&ip) {
        return Some("one of the router's own addresses, or a gateway its routes go through");
    }
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            let seg = v6.segments();
            if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_loopback() {
                Some("loopback")
            } else if seg[0] & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if seg[..6] == [0; 6] {
                // IPv4-compatible (deprecated): routes nowhere legitimate, and ::127.0.0.1 is a trick.
                Some("IPv4-compatible IPv6")
            } else if seg[..4] == [0xfd00, 0x0ec2, 0, 0] {
                // AWS's IPv6 platform prefix: IMDS at fd00:ec2::254, the DNS resolver at ::253 and the
                // EKS pod identity agent at ::23, which hands out credentials. The whole /64 is AWS's.
                Some("cloud metadata service (fd00:ec2::/64)")
            } else if CLOUD_METADATA_V6.contains(&v6) {
                Some("cloud metadata service")
            } else if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || seg[..3] == [0x64, 0xff9b, 1] {
                // NAT64 (64:ff9b::/96, 64:ff9b:1::/48): a translator on the path turns the embedded IPv4
                // address into a real destination, so that address is judged as if dialled directly.
                let o = v6.octets();
                let inner = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
                if own.contains(&IpAddr::V4(inner)) {
                    Some("NAT64 form of one of the router's own addresses")
                } else {
                    forbidden_v4(inner).map(|_| "NAT64 form of a forbidden IPv4 address")
                }
            } else {
                None
            }
        }
    }
}

/// Metadata endpoints outside link-local: Alibaba (100.100.100.200), Azure WireServer (168.63.129.16),
/// Oracle Cloud (192.0.0.192).
const CLOUD_METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// IPv6 metadata endpoints inside the unique-local range (`fc00::/7`, which otherwise stays allowed),
/// besides AWS's prefix above: Google Cloud (`fd20:ce::254`), Oracle Cloud (`fd00:c1::a9fe:a9fe`),
/// Scaleway (`fd00:42::42`), Akamai/Linode (`fd00:a9fe:a9fe::1`) and Alibaba Cloud
/// (`fd00:100::100:200`). Each hands out instance credentials to whoever asks.
const CLOUD_METADATA_V6: [Ipv6Addr; 5] = [
    Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xc1, 0, 0, 0, 0, 0xa9fe, 0xa9fe),
    Ipv6Addr::new(0xfd00, 0x42, 0, 0, 0, 0, 0, 0x42),
    Ipv6Addr::new(0xfd00, 0xa9fe, 0xa9fe, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0x100, 0x200),
];

fn forbidden_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let o = v4.octets();
    if o[0] == 0 {
        Some("unspecified (0.0.0.0/8)")
    } else if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_multicast() {
        Some("multicast")
    } else if v4.is_broadcast() {
        Some("broadcast")
    } else if o[0] >= 240 {
        Some("reserved (240.0.0.0/4)")
    } else if CLOUD_METADATA_V4.contains(&v4) {
        // Instance metadata and platform services hand out credentials; link-local ones are covered
        // above, these live in ranges that otherwise stay allowed (private, CGNAT, special-purpose).
        Some("cloud metadata service")
    } else {
        None
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) as the IPv4 address it is.
#[must_use]
pub fn normalise(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// [`local_addresses`] and [`next_hops`]: what a name may never resolve to for the router to dial it.
fn own_and_next_hops() -> std::io::Result<HashSet<IpAddr>> {
    let mut set = local_addresses()?;
    set.extend(next_hops());
    Ok(set)
}

/// The addresses of every local interface (and each interface's IPv4 broadcast address), read with
/// getifaddrs(3).
pub fn local_addresses() -> std::io::Result<HashSet<IpAddr>> {
    let mut out = HashSet::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we own and free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        // SAFETY: the address pointers are null or point to sockaddrs of the family they declare.
        unsafe {
            if let Some(ip) = sockaddr_ip(ifa.ifa_addr) {
                out.insert(normalise(ip));
            }
            if ifa.ifa_flags & libc::IFF_BROADCAST as u32 != 0 {
                if let Some(ip) = sockaddr_ip(ifa.ifa_ifu) {
                    out.insert(normalise(ip));
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IP of a sockaddr, for AF_INET and AF_INET6.
///
/// # Safety
/// `sa` is null or points to a sockaddr whose size matches its `sa_family`.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null and valid per the caller; the casts follow sa_family.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa.cast::<libc::sockaddr_in>());
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa.cast::<libc::sockaddr_in6>());
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// The router's own addresses and the next hops of its routes ([`next_hops`]), re-read when a dial
/// finds them older than [`OWN_ADDRESSES_TTL`] (interfaces can gain addresses after start), plus the
/// listeners' addresses.
///
/// The re-read runs on a thread of its own, and the dial that asked for it goes on with the set it
/// has: it takes about 100 µs, but tens of milliseconds on a node with tens of thousands of routes
/// (110 ms at the route dump's cap), which a connection under steady traffic should not wait for and
/// a runtime worker should not block on. A set older than [`OWN_ADDRESSES_MAX_AGE`] is never used:
/// the dial that finds one (the first after an idle spell) reads it again itself, as every dial did
/// before. So a change reaches the check within two seconds, whenever it happens.
#[derive(Debug)]
struct OwnAddresses {
    /// Addresses of the listeners this router serves (added as each serve_* starts).
    listeners: Mutex<HashSet<IpAddr>>,
    /// The last interface snapshot, when it was taken, and whether a re-read is under way.
    snapshot: Mutex<Snapshot>,
}

#[derive(Debug)]
struct Snapshot {
    /// When the read that made `set` began.
    taken: Instant,
    set: Arc<HashSet<IpAddr>>,
    /// A re-read thread is under way.
    reading: bool,
}

impl OwnAddresses {
    fn new() -> std::io::Result<OwnAddresses> {
        let taken = Instant::now();
        Ok(OwnAddresses {
            listeners: Mutex::new(HashSet::new()),
            snapshot: Mutex::new(Snapshot {
                taken,
                set: Arc::new(own_and_next_hops()?),
                reading: false,
            }),
        })
    }

    /// The current set (interfaces and listeners): read again here when too old to use, else
    /// returned at once, with a re-read started in the background when it is stale.
    fn current(self: &Arc<Self>) -> Arc<HashSet<IpAddr>> {
        let mut snap = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        let age = snap.taken.elapsed();
        if age >= OWN_ADDRESSES_MAX_AGE {
            let started = Instant::now();
            self.install(&mut snap, started, own_and_next_hops());
        } else if age >= OWN_ADDRESSES_TTL && !snap.reading {
            snap.reading = true;
            let me = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("own-addresses".into())
                .spawn(move || me.reread());
            if let Err(error) = spawned {
                // No thread (the process is at its limit): the set is read in a dial once too old.
                snap.reading = false;
                tracing::warn!(%error, "cannot start a thread to re-read the local addresses and routes");
            }
        }
        Arc::clone(&snap.set)
    }

    /// The background re-read: reads the set and installs it unless a dial installed a newer one
    /// meanwhile. `reading` is cleared however it ends (a panic included), so that another can start.
    fn reread(&self) {
        struct Done<'a>(&'a OwnAddresses);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0
                    .snapshot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .reading = false;
            }
        }
        let _done = Done(self);
        let started = Instant::now();
        let read = own_and_next_hops();
        let mut snap = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if started > snap.taken {
            self.install(&mut snap, started, read);
        }
    }

    /// Installs a read that began at `started`, with the listeners' addresses; on an error keeps the
    /// previous set (and retries after the next [`OWN_ADDRESSES_TTL`]) rather than allow everything.
    fn install(
        &self,
        snap: &mut Snapshot,
        started: Instant,
        read: std::io::Result<HashSet<IpAddr>>,
    ) {
        match read {
            Ok(mut set) => {
                set.extend(
                    self.listeners
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .iter(),
                );
                snap.set = Arc::new(set);
            }
            Err(error) => tracing::warn!(%error, "cannot list local addresses"),
        }
        snap.taken = started;
    }

    fn add_listener(&self, ip: IpAddr) {
        if ip.is_unspecified() {
            return;
        }
        let ip = normalise(ip);
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ip);
        let mut snap = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if !snap.set.contains(&ip) {
            let mut set = (*snap.set).clone();
            set.insert(ip);
            snap.set = Arc::new(set);
        }
    }
}

/// Resolves and dials upstreams.
#[derive(Debug)]
pub(crate) struct Upstream {
    /// hickory's resolver, with its TTL-honouring cache.
    resolver: TokioResolver,
    /// What the dial check refuses besides the fixed ranges.
    own: Arc<OwnAddresses>,
    /// Budget for resolving and connecting, together.
    connect_timeout: Duration,
    /// Answers shared by every worker, asked before the resolver.
    cache: Arc<ResolveCache>,
}

/// Socket options both legs get: no Nagle delay (the router adds no latency to small writes) and TCP
/// keepalive, so a peer that vanished does not pin a connection slot for ever. Set on each listening
/// socket once (Linux copies them to every accepted socket) and on each upstream socket before it
/// connects, not per connection after the fact.
pub(crate) fn tune(socket: SockRef<'_>) -> std::io::Result<()> {
    socket.set_tcp_nodelay(true)?;
    let ka = TcpKeepalive::new()
        .with_time(KEEPALIVE_TIME)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    socket.set_tcp_keepalive(&ka)
}

/// Idle time before the first keepalive probe.
pub(crate) const KEEPALIVE_TIME: Duration = Duration::from_secs(60);
/// Time between keepalive probes.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the connection is dropped.
pub(crate) const KEEPALIVE_RETRIES: u32 = 6;

impl Upstream {
    /// `resolvers` empty: the system configuration (/etc/resolv.conf and /etc/hosts).
    pub(crate) fn new(
        resolvers: &[SocketAddr],
        connect_timeout: Duration,
        cache: Arc<ResolveCache>,
    ) -> anyhow::Result<Upstream> {
        use anyhow::Context as _;
        let mut builder = if resolvers.is_empty() {
            TokioResolver::builder_tokio()
                .context("cannot read the system resolver configuration (/etc/resolv.conf)")?
        } else {
            let servers = resolvers
                .iter()
                .map(|addr| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = addr.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = addr.port();
                    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                })
                .collect();
            let mut b = TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, vec![], servers),
                TokioRuntimeProvider::default(),
            );
            // Explicit servers are the whole truth: the router's /etc/hosts is not consulted.
            b.options_mut().use_hosts_file = ResolveHosts::Never;
            b
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        // Names are always given fully qualified; never append search domains.
        opts.ndots = 0;
        // IPv4 first, AAAA only when there is no A: egress networks (podman's included) are often
        // IPv4-only, and hickory's default (AAAA first, in parallel) would dial unroutable addresses
        // first and query twice per name.
        opts.ip_strategy = LookupIpStrategy::Ipv4thenIpv6;
        opts.timeout = connect_timeout.min(Duration::from_secs(3));
        let resolver = builder
            .build()
            .context("cannot build the upstream resolver")?;
        Ok(Upstream {
            resolver,
            own: Arc::new(
                OwnAddresses::new()
                    .map_err(|e| anyhow::anyhow!("cannot list local addresses: {e}"))?,
            ),
            connect_timeout,
            cache,
        })
    }

    /// Remembers a listener address as one of the router's own.
    pub(crate) fn add_own_address(&self, ip: IpAddr) {
        self.own.add_listener(ip);
    }

    /// Resolves `name` (the cache first; on a miss, `may_resolve` decides whether the resolver may be
    /// asked), checks every address, and connects to `name:port`. Returns the stream and the address it
    /// is connected to.
    pub(crate) async fn connect(
        &self,
        name: &HostName,
        port: u16,
        may_resolve: impl FnOnce() -> Result<(), DialError>,
    ) -> Result<(TcpStream, SocketAddr), DialError> {
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let addrs = match self.cache.get(name, Instant::now()) {
            Some(addrs) => addrs,
            None => {
                may_resolve()?;
                self.resolve(name, deadline).await?
            }
        };
        if addrs.is_empty() {
            return Err(DialError::Resolve {
                name: name.clone(),
                message: "no addresses".into(),
            });
        }
        // Every address is checked before any is dialled: one forbidden answer means the name is being
        // used for rebinding, and none of its addresses is trusted.
        let own = self.own.current();
        for &ip in addrs.iter() {
            if let Some(why) = forbidden_reason(ip, &own) {
                return Err(DialError::Forbidden { addr: ip, why });
            }
        }
        let mut attempts = Vec::new();
        for (i, &ip) in addrs.iter().enumerate() {
            let addr = SocketAddr::new(normalise(ip), port);
            let now = tokio::time::Instant::now();
            if now >= deadline {
                attempts.push(format!("{addr}: no time left"));
                break;
            }
            let left = deadline - now;
            let remaining = (addrs.len() - i) as u32;
            let budget = (left / remaining).max(MIN_ATTEMPT).min(left);
            match tokio::time::timeout(budget, dial(addr)).await {
                Ok(Ok(stream)) => return Ok((stream, addr)),
                Ok(Err(e)) => attempts.push(format!("{addr}: {e}")),
                Err(_) => attempts.push(format!("{addr}: timed out")),
            }
        }
        Err(DialError::Connect {
            name: name.clone(),
            attempts: attempts.join("; "),
        })
    }
}

impl Upstream {
    /// Asks the resolver for `name`'s addresses within `deadline`, and keeps the answer in the cache
    /// until its TTL runs out.
    async fn resolve(
        &self,
        name: &HostName,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<[IpAddr]>, DialError> {
        let fqdn = format!("{}.", name.as_str());
        let lookup =
            match tokio::time::timeout_at(deadline, self.resolver.lookup_ip(fqdn.as_str())).await {
                Err(_) => return Err(DialError::ResolveTimeout(name.clone())),
                Ok(Err(e)) => {
                    return Err(DialError::Resolve {
                        name: name.clone(),
                        message: e.to_string(),
                    })
                }
                Ok(Ok(lookup)) => lookup,
            };
        let addrs: Arc<[IpAddr]> = lookup.iter().collect();
        self.cache.insert(
            name.clone(),
            Arc::clone(&addrs),
            lookup.valid_until(),
            Instant::now(),
        );
        Ok(addrs)
    }
}

/// Connects to exactly `addr`.
///
/// On a local or fast link the handshake is often complete by the time connect(2) returns (the SYN's
/// answer is processed in the same system call), so one poll(2) looks before the connection waits for
/// the runtime's next event-loop turn, which under load was the upstream connect's whole cost
/// (measured in BENCHMARKS.md, issue 18).
async fn dial(addr: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    tune(SockRef::from(&socket))?;
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let socket = std::net::TcpStream::from(socket);
    if connected_now(&socket)? {
        return TcpStream::from_std(socket);
    }
    let stream = TcpStream::from_std(socket)?;
    stream.writable().await?;
    match stream.take_error()? {
        Some(e) => Err(e),
        None => Ok(stream),
    }
}

/// Whether a non-blocking connect has already finished: `Ok(true)` connected, `Ok(false)` still in
/// progress, `Err` failed (the socket's pending error).
fn connected_now(socket: &std::net::TcpStream) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    if n == 0 || fd.revents == 0 {
        return Ok(false);
    }
    match socket.take_error()? {
        Some(e) => Err(e),
        None if fd.revents & libc::POLLOUT != 0 => Ok(true),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection failed",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_rules() {
        let own: HashSet<IpAddr> = ["10.88.0.5".parse().unwrap()].into_iter().collect();
        let forbidden = [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "10.88.0.5",
            "::ffff:10.88.0.5",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::7f00:1",
            "64:ff9b::a58:5",
            "100.100.100.200",
            "168.63.129.16",
            "192.0.0.192",
            "::ffff:100.100.100.200",
            "fd00:ec2::254",
            "fd00:ec2::23",
            "fd00:ec2::253",
            "fd00:ec2::ffff:1",
            "fd00:ec2:0:0:1234:5678:9abc:def0",
            "fd20:ce::254",
            "fd00:c1::a9fe:a9fe",
            "fd00:42::42",
            "fd00:a9fe:a9fe::1",
            "fd00:100::100:200",
        ];
        for a in forbidden {
            let ip: IpAddr = a.parse().unwrap();
            assert!(forbidden_reason(ip, &own).is_some(), "{a} was allowed");
        }
        let allowed = [
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "100.64.0.1",
            "198.18.0.2",
            "1.1.1.1",
            "2606:4700::1111",
            "fd00::1",
            "fd00:ec2:0:1::1",
            "fd00:ec3::23",
            "fec0::1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "100.100.100.201",
            "fd20:ce::253",
            "fd00:42::43",
        ];
        for a in allowed {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(forbidden_reason(ip, &own), None, "{a} was refused");
        }
    }

    /// The dial's two ways to learn a connect's outcome (at once, or after waiting for the runtime) both
    /// give a usable stream, and a refused connect is an error, not a stream.
    #[tokio::test]
    async fn dial_connects_or_fails() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = dial(addr).await.unwrap();
        let (mut accepted, _) = listener.accept().await.unwrap();
        super::super::relay::write_first(&stream, b"ping")
            .await
            .unwrap();
        let mut got = [0u8; 4];
        tokio::io::AsyncReadExt::read_exact(&mut accepted, &mut got)
            .await
            .unwrap();
        assert_eq!(&got, b"ping");
        drop(listener);
        let err = dial(addr).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    }

    #[test]
    fn local_addresses_include_loopback() {
        let set = local_addresses().unwrap();
        assert!(set.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{set:?}");
    }
}
