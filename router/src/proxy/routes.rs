//! The next hops of the router's routes: the gateways it sends through, which a name may never resolve to
//! for the router to dial it.
//!
//! How it fits: on a session's egress network the gateway is the host, in a pod it is the node. An
//! allowlisted name whose DNS pointed there would reach the host's (or node's) own listeners on 80 and
//! 443 through that address, so [`next_hops`] joins the router's own addresses in the dial check
//! (upstream.rs), re-read with them every second.
//!
//! Where they are read: a route dump over rtnetlink (`RTM_GETROUTE`, both families, every table) and a
//! dump of the kernel's nexthop objects (`RTM_GETNEXTHOP`). That sees what `/proc/net/route` does not:
//! the tables of policy routing, every next hop of a multipath route, an IPv4 route's IPv6 next hop
//! (RFC 5549, `RTA_VIA`) and nexthop objects, used or not. `/proc/net/route` (the main table, one
//! gateway per route) and `/proc/net/ipv6_route` are read too: the kernel leaves out of a dump, without
//! a word, a route too large for one datagram (some 2,000 next hops), which /proc still shows. If the
//! dump fails (a seccomp profile that forbids netlink sockets, say), what it found before and /proc are
//! what is refused, with a warning.
//!
//! The dump is parsed by [`parse_dump`], which trusts nothing it is given: every length is checked
//! against what is left, each dump is capped at [`MAX_DUMP_BYTES`] and all of them together given
//! [`DUMP_DEADLINE`], and a message it cannot parse fails the dump rather than costing its next hops in
//! silence. It runs inline, in the connection that finds the last read a second old: with /proc, about
//! 100 µs with a few routes, 17 ms with 20,000, and (the dump alone) 110 ms at the cap, some 150,000
//! IPv4 routes.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::upstream::normalise;

/// The most of each dump read (IPv4 routes, IPv6 routes, nexthop objects). The gateway of a pod or a
/// session's egress network is among the first routes; a router holding a full internet table has no
/// business here. Past the cap, a warning says so, once.
pub const MAX_DUMP_BYTES: usize = 8 * 1024 * 1024;
/// The most of a /proc routing table read, when the dump failed.
const MAX_ROUTES_TEXT: u64 = 1024 * 1024;
/// How long a whole dump may take (the kernel answers a small table in microseconds).
pub const DUMP_DEADLINE: Duration = Duration::from_secs(2);
/// How often a dump that the kernel marks as interrupted (the tables changed during it) is repeated
/// before its result is taken as it is.
const DUMP_ATTEMPTS: usize = 3;

// rtnetlink's wire constants (linux/netlink.h, linux/rtnetlink.h, linux/nexthop.h).
const NLMSG_HDRLEN: usize = 16;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_GETNEXTHOP: u16 = 106;
/// `struct rtmsg`: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
const RTMSG_LEN: usize = 12;
/// `struct nhmsg`: family, scope, protocol, reserved, flags (u32).
const NHMSG_LEN: usize = 8;
/// `struct rtnexthop`: len (u16), flags, hops, ifindex (i32); its attributes follow.
const RTNEXTHOP_LEN: usize = 8;
const RTA_GATEWAY: u16 = 5;
const RTA_MULTIPATH: u16 = 9;
const RTA_VIA: u16 = 18;
const NHA_GATEWAY: u16 = 6;
/// The attribute type without the nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// Why a dump could not be read or parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DumpError {
    /// The socket calls failed.
    #[error("netlink socket: {0}")]
    Io(String),
    /// The kernel answered the request with an error (errno).
    #[error("the kernel refused the dump: errno {0}")]
    Kernel(i32),
    /// A message is not what rtnetlink sends.
    #[error("malformed netlink message at byte {at} of a datagram: {what}")]
    Malformed {
        /// Where in the datagram.
        at: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// The dump did not end within [`DUMP_DEADLINE`].
    #[error("the dump did not end within {DUMP_DEADLINE:?}")]
    Deadline,
}

/// Where a datagram of a dump left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More datagrams follow.
    More,
    /// The dump ended (`NLMSG_DONE`).
    Done,
}

/// What one datagram of a dump told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram {
    /// Whether the dump ended with it.
    pub progress: Progress,
    /// Whether the kernel marked a message of it as interrupted (the tables changed during the dump).
    pub interrupted: bool,
}

/// The next hops of this network namespace's routes: the rtnetlink dump and the /proc tables together
/// (see the module's documentation). Never fails: what cannot be read adds nothing, and a dump that
/// fails part-way keeps what it found.
///
/// /proc is read even when the dump works: the kernel cannot put a route or nexthop object larger than
/// one datagram (some 2,000 next hops) into a dump, and says nothing when it leaves one out. /proc still
/// shows such a route's next hop (IPv4: the first; IPv6: each).
#[must_use]
pub fn next_hops() -> HashSet<IpAddr> {
    static FAILING: AtomicBool = AtomicBool::new(false);
    let mut out = proc_next_hops();
    match dump_next_hops(&mut out) {
        Ok(()) => {
            if FAILING.swap(false, Ordering::Relaxed) {
                tracing::info!("the routing tables can be dumped over netlink again");
            }
        }
        Err(error) => {
            if !FAILING.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    %error,
                    "cannot dump the routing tables over netlink: beyond what the dump found before \
                     it failed, only /proc/net/route (the main table, one gateway per route) and \
                     /proc/net/ipv6_route are refused as next hops"
                );
            }
        }
    }
    out
}

/// Adds every next hop of the routes of both families in every table, and of every nexthop object, to
/// `out`; what it found before an error stays there.
pub fn dump_next_hops(out: &mut HashSet<IpAddr>) -> Result<(), DumpError> {
    let deadline = Instant::now() + DUMP_DEADLINE;
    for (kind, family, what) in [
        (RTM_GETROUTE, AF_INET, "IPv4 routes"),
        (RTM_GETROUTE, AF_INET6, "IPv6 routes"),
        (RTM_GETNEXTHOP, 0, "nexthop objects"),
    ] {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match dump(kind, family, what, out, deadline) {
                // A kernel without nexthop objects (before 5.3) has none to refuse.
                Err(DumpError::Kernel(errno))
                    if kind == RTM_GETNEXTHOP
                        && [libc::EOPNOTSUPP, libc::EINVAL, libc::ENOENT].contains(&errno) =>
                {
                    break
                }
                Err(e) => return Err(e),
                Ok(false) => break,
                Ok(true) if attempt >= DUMP_ATTEMPTS => {
                    // Every attempt saw the table change; all of them were added.
                    tracing::warn!(
                        dump = what,
                        attempts = attempt,
                        "the routing tables changed during every dump: next hops added since may \
                         be refused only at the next read (a second from now)"
                    );
                    break;
                }
                Ok(true) => {}
            }
        }
    }
    Ok(())
}

/// A netlink route socket, closed on drop.
struct Socket(OwnedFd);

impl Socket {
    fn open(deadline: Instant) -> Result<Socket, DumpError> {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(last_error("socket"));
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let socket = Socket(unsafe { OwnedFd::from_raw_fd(fd) });
        let left = deadline.saturating_duration_since(Instant::now());
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(1),
            tv_usec: libc::suseconds_t::from(left.subsec_micros().max(1)),
        };
        // SAFETY: a timeval of the right size for SO_RCVTIMEO.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&tv).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last_error("SO_RCVTIMEO"));
        }
        Ok(socket)
    }

    fn send(&self, request: &[u8]) -> Result<(), DumpError> {
        // SAFETY: an all-zero sockaddr_nl is valid; the kernel is port 0.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: the buffer and the address are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
                std::ptr::from_ref(&kernel).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent != request.len() as isize {
            return Err(last_error("sendto"));
        }
        Ok(())
    }

    /// One datagram into `buf`: its length, or None when the call was interrupted or the datagram was
    /// not the kernel's (any socket in the namespace may send to this one), for the caller to check its
    /// deadline and call again. A datagram larger than `buf` is an error.
    fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, DumpError> {
        // SAFETY: as in `send`.
        let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut from_len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: the buffer and the address are valid for the lengths given.
        let n = unsafe {
            libc::recvfrom(
                self.0.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
                std::ptr::from_mut(&mut from).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => return Ok(None),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    return Err(DumpError::Deadline)
                }
                _ => return Err(DumpError::Io(format!("recvfrom: {e}"))),
            }
        }
        let n = n as usize;
        if n > buf.len() {
            return Err(DumpError::Malformed {
                at: 0,
                what: "a datagram larger than the receive buffer",
            });
        }
        if from.nl_pid != 0 {
            return Ok(None);
        }
        Ok(Some(n))
    }
}

fn last_error(what: &str) -> DumpError {
    DumpError::Io(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// A dump request: a netlink header and a zeroed `rtmsg` or `nhmsg` with `family`.
fn request(kind: u16, family: u16, seq: u32) -> Vec<u8> {
    let mut body = vec![
        0u8;
        if kind == RTM_GETNEXTHOP {
            NHMSG_LEN
        } else {
            RTMSG_LEN
        }
    ];
    body[0] = family as u8;
    message(kind, NLM_F_REQUEST | NLM_F_DUMP, seq, &body)
}

/// One netlink message: header (`kind`, `flags`, `seq`, port 0) and payload, padded to 4 bytes.
fn message(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + payload.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(align4(len), 0);
    out
}

/// One dump over a socket of its own, added to `out`; whether the kernel marked it as interrupted.
fn dump(
    kind: u16,
    family: u16,
    what: &'static str,
    out: &mut HashSet<IpAddr>,
    deadline: Instant,
) -> Result<bool, DumpError> {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let socket = Socket::open(deadline)?;
    // The kernel sends a dump in datagrams of at most 32 KiB: 64 KiB holds one. But it sizes a socket's
    // datagrams by the largest read it has seen, and before any, by a page: a first route or nexthop
    // object larger than about 3.7 KiB would end the dump at once, empty and with no error (routes) or
    // EMSGSIZE (nexthop objects). So the socket is read once first, with the whole buffer: the
    // kernel's acknowledgement of a no-op.
    let mut buf = vec![0u8; 64 * 1024];
    socket.send(&message(NLMSG_NOOP, NLM_F_REQUEST | NLM_F_ACK, seq, &[]))?;
    loop {
        if Instant::now() >= deadline {
            return Err(DumpError::Deadline);
        }
        if let Some(n) = socket.recv(&mut buf)? {
            parse_dump(&buf[..n], seq, out)?;
            break;
        }
    }
    socket.send(&request(kind, family, seq))?;
    let mut budget = MAX_DUMP_BYTES;
    let mut interrupted = false;
    loop {
        if Instant::now() >= deadline {
            return Err(DumpError::Deadline);
        }
        let Some(n) = socket.recv(&mut buf)? else {
            continue;
        };
        if n > budget {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    dump = what,
                    max_bytes = MAX_DUMP_BYTES,
                    "a routing table dump larger than its cap: next hops past it are refused only if \
                     /proc shows them"
                );
            }
            return Ok(interrupted);
        }
        budget -= n;
        let datagram = parse_dump(&buf[..n], seq, out)?;
        interrupted |= datagram.interrupted;
        if datagram.progress == Progress::Done {
            return Ok(interrupted);
        }
    }
}

/// Reads a native-endian u16 at `at` (the caller checked the length).
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

/// Reads a native-endian u32 at `at` (the caller checked the length).
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Netlink's 4-byte alignment.
const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Parses one datagram of a route or nexthop dump whose request had sequence number `seq`, adding the
/// next hops of its routes (`RTA_GATEWAY`, `RTA_VIA`, and both inside each `RTA_MULTIPATH` entry) and
/// of its nexthop objects (`NHA_GATEWAY`) to `out`. Messages of other types are skipped; one whose
/// lengths do not fit, or that answers another request, fails the datagram.
pub fn parse_dump(
    datagram: &[u8],
    seq: u32,
    out: &mut HashSet<IpAddr>,
) -> Result<Datagram, DumpError> {
    let mut at = 0;
    let mut interrupted = false;
    while at < datagram.len() {
        let rest = &datagram[at..];
        let bad = |what| DumpError::Malformed { at, what };
        if rest.len() < NLMSG_HDRLEN {
            return Err(bad("a message header cut short"));
        }
        let len = u32_at(rest, 0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(bad("a message length outside the datagram"));
        }
        let (kind, flags) = (u16_at(rest, 4), u16_at(rest, 6));
        if u32_at(rest, 8) != seq {
            return Err(bad("a message answering another request"));
        }
        interrupted |= flags & NLM_F_DUMP_INTR != 0;
        let payload = &rest[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => {
                // A dump that failed part-way ends with the error in its DONE message.
                if let Some(b) = payload.get(..4) {
                    let errno = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                    if errno < 0 {
                        return Err(DumpError::Kernel(errno.saturating_neg()));
                    }
                }
                return Ok(Datagram {
                    progress: Progress::Done,
                    interrupted,
                });
            }
            NLMSG_ERROR => {
                if payload.len() < 4 {
                    return Err(bad("an error message cut short"));
                }
                let errno = i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]);
                if errno != 0 {
                    return Err(DumpError::Kernel(errno.saturating_neg()));
                }
            }
            NLMSG_OVERRUN => return Err(bad("the kernel lost part of the dump (overrun)")),
            RTM_NEWROUTE => {
                if payload.len() < RTMSG_LEN {
                    return Err(bad("a route message cut short"));
                }
                let family = u16::from(payload[0]);
                route_next_hops(family, &payload[RTMSG_LEN..], out).map_err(bad)?;
            }
            RTM_NEWNEXTHOP => {
                if payload.len() < NHMSG_LEN {
                    return Err(bad("a nexthop message cut short"));
                }
                let family = u16::from(payload[0]);
                for (ty, data) in attributes(&payload[NHMSG_LEN..]).map_err(bad)? {
                    if ty == NHA_GATEWAY {
                        out.extend(address(family, data));
                    }
                }
            }
            _ => {}
        }
        at += align4(len).min(rest.len());
    }
    Ok(Datagram {
        progress: Progress::More,
        interrupted,
    })
}

/// The next hops among a route's attributes (`family` is the route's).
fn route_next_hops(
    family: u16,
    attrs: &[u8],
    out: &mut HashSet<IpAddr>,
) -> Result<(), &'static str> {
    for (ty, data) in attributes(attrs)? {
        match ty {
            RTA_GATEWAY => out.extend(address(family, data)),
            RTA_VIA => out.extend(via(data)),
            RTA_MULTIPATH => {
                let mut rest = data;
                while !rest.is_empty() {
                    if rest.len() < RTNEXTHOP_LEN {
                        return Err("a multipath next hop cut short");
                    }
                    let len = usize::from(u16_at(rest, 0));
                    if len < RTNEXTHOP_LEN || len > rest.len() {
                        return Err("a multipath next hop's length outside its attribute");
                    }
                    for (ty, data) in attributes(&rest[RTNEXTHOP_LEN..len])? {
                        match ty {
                            RTA_GATEWAY => out.extend(address(family, data)),
                            RTA_VIA => out.extend(via(data)),
                            _ => {}
                        }
                    }
                    rest = &rest[align4(len).min(rest.len())..];
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The attributes (type without flags, data) of a run of `rtattr`/`nlattr`s.
fn attributes(mut b: &[u8]) -> Result<Vec<(u16, &[u8])>, &'static str> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 4 {
            return Err("an attribute header cut short");
        }
        let len = usize::from(u16_at(b, 0));
        if len < 4 || len > b.len() {
            return Err("an attribute length outside its message");
        }
        out.push((u16_at(b, 2) & NLA_TYPE_MASK, &b[4..len]));
        b = &b[align4(len).min(b.len())..];
    }
    Ok(out)
}

/// An address of `family` (IPv4 or IPv6; others, MPLS labels say, are no IP next hop).
fn address(family: u16, data: &[u8]) -> Option<IpAddr> {
    let ip = match family {
        AF_INET => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?)),
        AF_INET6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(data).ok()?)),
        _ => return None,
    };
    Some(normalise(ip)).filter(|ip| !ip.is_unspecified())
}

/// `struct rtvia`: the next hop's family (u16) and address.
fn via(data: &[u8]) -> Option<IpAddr> {
    (data.len() >= 2).then(|| address(u16_at(data, 0), &data[2..]))?
}

/// The next hops `/proc` shows: the main table's first gateway of each IPv4 route, and every IPv6 next
/// hop.
fn proc_next_hops() -> HashSet<IpAddr> {
    let read = |path: &str| -> String {
        let mut bytes = Vec::new();
        if let Ok(f) = std::fs::File::open(path) {
            let _ = std::io::Read::read_to_end(
                &mut std::io::Read::take(f, MAX_ROUTES_TEXT + 1),
                &mut bytes,
            );
        }
        table_text(bytes, path)
    };
    let mut out = route_gateways_v4(&read("/proc/thread-self/net/route"));
    out.extend(route_gateways_v6(&read("/proc/thread-self/net/ipv6_route")));
    out
}

/// A routing table's text as read (at most [`MAX_ROUTES_TEXT`] bytes and one more, to tell a longer
/// one, which is said once). Interface names may hold any byte but '/' and NUL: such a line must not
/// cost the others, so bytes that are not UTF-8 are replaced.
fn table_text(mut bytes: Vec<u8>, path: &str) -> String {
    if bytes.len() as u64 > MAX_ROUTES_TEXT {
        bytes.truncate(MAX_ROUTES_TEXT as usize);
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                path,
                "routing table longer than 1 MiB: next hops of the routes past it are not refused"
            );
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The non-zero gateways of `/proc/net/route` (a header line, then `Iface Destination Gateway ...`,
/// each address as the hexadecimal of its in-memory bytes read as a native integer).
fn route_gateways_v4(text: &str) -> HashSet<IpAddr> {
    text.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(2))
        .filter_map(|hex| u32::from_str_radix(hex, 16).ok())
        .filter(|&v| v != 0)
        .map(|v| IpAddr::V4(Ipv4Addr::from(v.to_ne_bytes())))
        .collect()
}

/// The non-zero next hops of `/proc/net/ipv6_route` (`dest plen src plen next_hop ...`, each address
/// as 32 hexadecimal digits in network order).
fn route_gateways_v6(text: &str) -> HashSet<IpAddr> {
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .filter_map(|hex| {
            u128::from_str_radix(hex, 16)
                .ok()
                .filter(|_| hex.len() == 32)
        })
        .filter(|&v| v != 0)
        .map(|v| normalise(IpAddr::V6(Ipv6Addr::from(v))))
        .collect()
}

/// Builds dump datagrams for the tests.
#[cfg(test)]
mod wire {
    /// One netlink message: header (`kind`, `flags`, `seq`) and payload, padded to 4 bytes.
    #[must_use]
    pub(super) fn message(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        super::message(kind, flags, seq, payload)
    }

    /// One attribute, padded to 4 bytes.
    #[must_use]
    pub(super) fn attribute(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(data);
        out.resize(super::align4(out.len()), 0);
        out
    }

    /// A route message's payload: an `rtmsg` of `family`, then `attrs`.
    #[must_use]
    pub(super) fn route(family: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut out = vec![0u8; super::RTMSG_LEN];
        out[0] = family;
        out.extend(attrs.concat());
        out
    }

    /// One `rtnexthop` entry of a multipath attribute.
    #[must_use]
    pub(super) fn multipath_entry(attrs: &[Vec<u8>]) -> Vec<u8> {
        let body = attrs.concat();
        let mut out = Vec::new();
        out.extend_from_slice(&((super::RTNEXTHOP_LEN + body.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        out.extend(body);
        out
    }

    /// `RTA_VIA`'s data: a family and an address.
    #[must_use]
    pub(super) fn via(family: u16, addr: &[u8]) -> Vec<u8> {
        let mut out = family.to_ne_bytes().to_vec();
        out.extend_from_slice(addr);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{attribute, message, multipath_entry, route, via};
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn parse(datagram: &[u8], seq: u32) -> (Result<Datagram, DumpError>, HashSet<IpAddr>) {
        let mut out = HashSet::new();
        (parse_dump(datagram, seq, &mut out), out)
    }

    #[test]
    fn every_kind_of_next_hop_is_read() {
        let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap().octets();
        let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap().octets();
        let datagram = [
            // A plain gateway.
            message(
                RTM_NEWROUTE,
                0,
                7,
                &route(2, &[attribute(RTA_GATEWAY, &v4("10.0.0.1"))]),
            ),
            // Multipath: a gateway, and an IPv6 next hop of an IPv4 route (RFC 5549).
            message(
                RTM_NEWROUTE,
                NLM_F_DUMP_INTR,
                7,
                &route(
                    2,
                    &[attribute(
                        RTA_MULTIPATH,
                        &[
                            multipath_entry(&[attribute(RTA_GATEWAY, &v4("10.0.0.2"))]),
                            multipath_entry(&[attribute(RTA_VIA, &via(AF_INET6, &v6("fd00::2")))]),
                        ]
                        .concat(),
                    )],
                ),
            ),
            // RFC 5549 outside multipath, and an IPv6 route's gateway.
            message(
                RTM_NEWROUTE,
                0,
                7,
                &route(2, &[attribute(RTA_VIA, &via(AF_INET6, &v6("fd00::3")))]),
            ),
            message(
                RTM_NEWROUTE,
                0,
                7,
                &route(10, &[attribute(RTA_GATEWAY, &v6("fd00::4"))]),
            ),
            // An IPv4-mapped gateway is judged as the IPv4 address.
            message(
                RTM_NEWROUTE,
                0,
                7,
                &route(10, &[attribute(RTA_GATEWAY, &v6("::ffff:10.0.0.5"))]),
            ),
            // A nexthop object.
            message(
                RTM_NEWNEXTHOP,
                0,
                7,
                &[
                    vec![2, 0, 0, 0, 0, 0, 0, 0],
                    attribute(NHA_GATEWAY, &v4("10.0.0.6")),
                ]
                .concat(),
            ),
            // A route with no gateway, an MPLS via, and another message type: nothing.
            message(
                RTM_NEWROUTE,
                0,
                7,
                &route(2, &[attribute(1, &v4("10.9.9.9"))]),
            ),
            message(
                RTM_NEWROUTE,
                0,
                7,
                &route(2, &[attribute(RTA_VIA, &via(28, &[0, 0, 1, 0]))]),
            ),
            message(20, 0, 7, &[0; 8]),
        ]
        .concat();
        let (result, out) = parse(&datagram, 7);
        assert_eq!(
            result,
            Ok(Datagram {
                progress: Progress::More,
                interrupted: true
            })
        );
        assert_eq!(
            out,
            HashSet::from([
                ip("10.0.0.1"),
                ip("10.0.0.2"),
                ip("fd00::2"),
                ip("fd00::3"),
                ip("fd00::4"),
                ip("10.0.0.5"),
                ip("10.0.0.6"),
            ])
        );
        let done = message(NLMSG_DONE, 0, 7, &0i32.to_ne_bytes());
        assert_eq!(parse(&done, 7).0.unwrap().progress, Progress::Done);
        // A dump that failed part-way: its DONE carries the error, which fails it.
        let failed = message(NLMSG_DONE, 0, 7, &(-libc::EMSGSIZE).to_ne_bytes());
        assert_eq!(parse(&failed, 7).0, Err(DumpError::Kernel(libc::EMSGSIZE)));
        assert!(parse(&message(NLMSG_OVERRUN, 0, 7, &[]), 7).0.is_err());
    }

    #[test]
    fn what_does_not_fit_fails_the_datagram() {
        let good = message(
            RTM_NEWROUTE,
            0,
            1,
            &route(2, &[attribute(RTA_GATEWAY, &[10, 0, 0, 1])]),
        );
        // Another request's answer, a header cut short, and lengths that point past the end.
        assert!(matches!(
            parse(&good, 2).0,
            Err(DumpError::Malformed { .. })
        ));
        assert!(parse(&good[..10], 1).0.is_err());
        let mut long = good.clone();
        long[0] = 200;
        assert!(parse(&long, 1).0.is_err());
        let mut attr_long = good.clone();
        attr_long[NLMSG_HDRLEN + RTMSG_LEN] = 60;
        assert!(parse(&attr_long, 1).0.is_err());
        let mut mp = message(
            RTM_NEWROUTE,
            0,
            1,
            &route(
                2,
                &[attribute(
                    RTA_MULTIPATH,
                    &multipath_entry(&[attribute(RTA_GATEWAY, &[10, 0, 0, 2])]),
                )],
            ),
        );
        // The rtnexthop's own length, past its attribute.
        mp[NLMSG_HDRLEN + RTMSG_LEN + 4] = 40;
        assert!(parse(&mp, 1).0.is_err());
        // The kernel's error and a short route message.
        let error = message(NLMSG_ERROR, 0, 1, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse(&error, 1).0, Err(DumpError::Kernel(libc::EPERM)));
        assert!(parse(&message(RTM_NEWROUTE, 0, 1, &[2, 0, 0]), 1)
            .0
            .is_err());
        // A trailing message header with no room for its padding is fine.
        let mut unpadded = good.clone();
        unpadded
            .extend(message(RTM_NEWROUTE, 0, 1, &route(2, &[]))[..NLMSG_HDRLEN + RTMSG_LEN].iter());
        assert!(parse(&unpadded, 1).0.is_ok());
    }

    /// Dumps a Linux 6.18 kernel sent (`fuzz/corpus/netlink_routes/`, captured in a namespace with a
    /// nexthop object and a group of two, routes through each, an IPv4 route via an IPv6 address, IPv4
    /// and IPv6 multipath routes, and a route in table 100): every next hop is found.
    #[test]
    #[cfg(target_endian = "little")]
    fn captured_dumps_parse() {
        let corpus = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/corpus/netlink_routes/"
        );
        let mut out = HashSet::new();
        for (file, progress) in [
            ("dump-26-2-0", Progress::More),
            ("dump-26-2-1", Progress::Done),
            ("dump-26-10-0", Progress::More),
            ("dump-26-10-1", Progress::Done),
            ("dump-106-0-0", Progress::Done),
        ] {
            let bytes = std::fs::read(format!("{corpus}{file}")).unwrap();
            let seq = u32_at(&bytes, 8);
            let datagram = parse_dump(&bytes, seq, &mut out).unwrap();
            assert_eq!(datagram.progress, progress, "{file}");
        }
        let want: HashSet<IpAddr> = [
            "198.19.5.3",
            "198.19.5.4",
            "198.19.5.5",
            "198.19.5.8",
            "198.19.5.9",
            "2001:db8:5::7",
            "2001:db8:5::8",
            "2001:db8:5::9",
        ]
        .iter()
        .map(|s| ip(s))
        .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn this_namespaces_tables_dump() {
        // Whatever this machine's tables hold, the dump ends and holds every IPv4 gateway /proc shows.
        let mut dumped = HashSet::new();
        dump_next_hops(&mut dumped).expect("a netlink route dump");
        for hop in proc_next_hops() {
            assert!(dumped.contains(&hop), "{hop} is in /proc but not the dump");
        }
        let _ = next_hops();
    }

    #[test]
    fn next_hops_are_read_from_both_proc_tables() {
        // 10.89.0.1 as /proc/net/route prints it on this machine's byte order.
        let gw = u32::from_ne_bytes([10, 89, 0, 1]);
        let v4 = format!(
            "Iface\tDestination\tGateway \tFlags\n\
             eth0\t00000000\t{gw:08X}\t0003\n\
             eth0\t0000590A\t00000000\t0001\n\
             bad\tline\n"
        );
        assert_eq!(
            route_gateways_v4(&v4),
            HashSet::from([IpAddr::V4(Ipv4Addr::new(10, 89, 0, 1))])
        );
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n\
                  fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
                  short line\n";
        assert_eq!(
            route_gateways_v6(v6),
            HashSet::from(["fd00::1".parse::<IpAddr>().unwrap()])
        );
        // An interface name that is not UTF-8 costs nothing but its own line.
        let mut raw = v4.into_bytes();
        raw.extend_from_slice(b"g\xff\t00000000\t01010101\t0003\n");
        assert_eq!(
            route_gateways_v4(&table_text(raw, "/proc/net/route")).len(),
            2
        );
    }
}
