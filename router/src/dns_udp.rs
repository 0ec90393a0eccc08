//! DNS over UDP without per-query tasks or channels: the hot path.
//!
//! hickory-server spawns a task and goes through a channel for every datagram, which halves the query
//! rate on a two-core machine. A sandbox asks one question at a time, always of the same small shape, so
//! this module parses that shape directly from the datagram (header, one question, at most one EDNS OPT
//! record), asks [`DnsHandler::decide`] (the same decision the TCP path uses), and writes the reply into
//! a reused buffer. Anything else gets FORMERR or NOTIMP; responses (QR set) and runts are dropped, so the
//! router can never be used to reflect traffic. Several sockets share the port with SO_REUSEPORT, one
//! receive loop each, so every core answers.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd as _;
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, RecordType};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::dns::{DnsHandler, Reply};

/// The largest datagram read; anything longer is truncated by the kernel and fails to parse.
pub(crate) const MAX_DATAGRAM: usize = 4096;
/// The header's length.
const HEADER: usize = 12;
/// The UDP payload size we advertise in EDNS replies (the DNS-flag-day value).
const EDNS_PAYLOAD: u16 = 1232;
/// The OPT pseudo-record type.
const TYPE_OPT: u16 = 41;

/// A parsed question: where it ends in the packet and what it asks.
#[derive(Debug, PartialEq, Eq)]
struct Question {
    /// The name as dotted text, with the trailing dot, exactly as asked (case kept).
    name: String,
    qtype: u16,
    qclass: u16,
    /// Offset just past QCLASS: the reply copies `packet[..end]` (header and question).
    end: usize,
    /// The query carried an EDNS OPT record, so the reply must carry one too (RFC 6891).
    edns: bool,
}

/// Why a datagram is not answered normally.
#[derive(Debug, PartialEq, Eq)]
enum Malformed {
    /// No reply at all: shorter than a header, or a response (answering would reflect).
    Drop,
    /// Reply with this code and no question (the question could not be read).
    Code(ResponseCode),
}

/// Reads the one question of a standard query.
fn parse(packet: &[u8]) -> Result<Question, Malformed> {
    if packet.len() < HEADER {
        return Err(Malformed::Drop);
    }
    let flags = u16::from_be_bytes([packet[2], packet[3]]);
    if flags & 0x8000 != 0 {
        return Err(Malformed::Drop);
    }
    let opcode = (flags >> 11) & 0xf;
    if opcode != 0 {
        return Err(Malformed::Code(ResponseCode::NotImp));
    }
    let count = |i: usize| u16::from_be_bytes([packet[i], packet[i + 1]]);
    let (qd, an, ns, ar) = (count(4), count(6), count(8), count(10));
    if qd != 1 || an != 0 || ns != 0 || ar > 1 {
        return Err(Malformed::Code(ResponseCode::FormErr));
    }
    let formerr = Malformed::Code(ResponseCode::FormErr);

    let mut name = String::with_capacity(64);
    let mut at = HEADER;
    loop {
        let len = *packet
            .get(at)
            .ok_or(Malformed::Code(ResponseCode::FormErr))? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        // Compression pointers (0xC0) and the reserved label types have no place in a question.
        if len > 63 {
            return Err(formerr);
        }
        let label = packet
            .get(at..at + len)
            .ok_or(Malformed::Code(ResponseCode::FormErr))?;
        // Bytes outside the hostname alphabet (a dot inside a label, NUL, ...) are kept visible by
        // escaping, so the policy sees them and refuses the name rather than a different name.
        for &b in label {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                name.push(b as char);
            } else {
                name.push_str(&format!("\\{b:03}"));
            }
        }
        name.push('.');
        at += len;
        if at - HEADER > 255 {
            return Err(formerr);
        }
    }
    if name.is_empty() {
        name.push('.');
    }
    let fixed = packet
        .get(at..at + 4)
        .ok_or(Malformed::Code(ResponseCode::FormErr))?;
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
    let end = at + 4;

    let mut edns = false;
    if ar == 1 {
        // The OPT record: root name, type 41, then class/TTL/rdlength and options we ignore.
        let rr = packet
            .get(end..end + 11)
            .ok_or(Malformed::Code(ResponseCode::FormErr))?;
        if rr[0] != 0 || u16::from_be_bytes([rr[1], rr[2]]) != TYPE_OPT {
            return Err(formerr);
        }
        let rdlen = u16::from_be_bytes([rr[9], rr[10]]) as usize;
        if end + 11 + rdlen != packet.len() {
            return Err(formerr);
        }
        edns = true;
    } else if end != packet.len() {
        return Err(formerr);
    }
    Ok(Question {
        name,
        qtype,
        qclass,
        end,
        edns,
    })
}

/// [`parse`]'s outcome for the fuzz targets: the question, or the response code (`None`: dropped).
#[cfg(feature = "fuzzing")]
pub type FuzzQuestion = Result<(String, u16, u16, usize, bool), Option<u16>>;

/// [`parse`], for the fuzz targets (`fuzz_api`).
#[cfg(feature = "fuzzing")]
pub fn fuzz_parse(packet: &[u8]) -> FuzzQuestion {
    match parse(packet) {
        Ok(q) => Ok((q.name, q.qtype, q.qclass, q.end, q.edns)),
        Err(Malformed::Drop) => Err(None),
        Err(Malformed::Code(code)) => Err(Some(u16::from(code))),
    }
}

/// Writes the reply to `packet` into `out`; returns false when nothing is to be sent.
pub(crate) fn respond(
    handler: &DnsHandler,
    packet: &[u8],
    client: SocketAddr,
    out: &mut Vec<u8>,
) -> bool {
    out.clear();
    let question = match parse(packet) {
        Ok(q) => q,
        Err(Malformed::Drop) => {
            handler.reject(client, "a runt or a response");
            return false;
        }
        Err(Malformed::Code(code)) => {
            handler.reject(client, "not one standard question");
            // Header only: id, opcode and RD echoed, QR set, no sections.
            out.extend_from_slice(&packet[..2]);
            let flags = (u16::from_be_bytes([packet[2], packet[3]]) & 0x7900)
                | 0x8000
                | u16::from(code.low());
            out.extend_from_slice(&flags.to_be_bytes());
            out.extend_from_slice(&[0; 8]);
            return true;
        }
    };
    let reply = handler.decide(
        &question.name,
        RecordType::from(question.qtype),
        DNSClass::from(question.qclass),
        client,
    );
    let (code, answer, authoritative) = match reply {
        Reply::Address(a, ttl) => (ResponseCode::NoError, Some((a, ttl)), true),
        Reply::NoData => (ResponseCode::NoError, None, true),
        Reply::Error(code) => (code, None, code == ResponseCode::NXDomain),
    };
    out.extend_from_slice(&packet[..question.end]);
    // QR, opcode 0, AA as decided, TC 0, RD echoed, RA 0, Z/AD 0, CD echoed, RCODE.
    let request_flags = u16::from_be_bytes([packet[2], packet[3]]);
    let flags = 0x8000
        | if authoritative { 0x0400 } else { 0 }
        | (request_flags & 0x0110)
        | u16::from(code.low());
    out[2..4].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&u16::from(answer.is_some()).to_be_bytes());
    out[8..10].copy_from_slice(&[0, 0]);
    out[10..12].copy_from_slice(&u16::from(question.edns).to_be_bytes());
    if let Some((address, ttl)) = answer {
        write_a(out, ttl, address);
    }
    if question.edns {
        out.push(0);
        out.extend_from_slice(&TYPE_OPT.to_be_bytes());
        out.extend_from_slice(&EDNS_PAYLOAD.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    }
    true
}

/// An A record whose name points at the question's name (offset 12).
fn write_a(out: &mut Vec<u8>, ttl: u32, address: Ipv4Addr) {
    out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&[0, 4]);
    out.extend_from_slice(&address.octets());
}

/// Datagrams read (and replies sent) per system call under load: one `recvmmsg(2)` takes whatever is
/// queued up to this many, and their replies leave in one `sendmmsg(2)`. A lone query costs the same two
/// calls as `recv_from` and `send_to`.
const BATCH: usize = 32;

/// Answers datagrams on `socket` until `shutdown` is cancelled.
pub(crate) async fn serve(
    socket: Arc<UdpSocket>,
    handler: Arc<DnsHandler>,
    shutdown: CancellationToken,
) {
    // A socket on the unspecified address answers from the address each query was sent to.
    let pktinfo = socket.local_addr().is_ok_and(|a| a.ip().is_unspecified());
    let mut batch = Batch::new(pktinfo);
    loop {
        let received = tokio::select! {
            r = socket.async_io(Interest::READABLE, || batch.receive(&socket)) => r,
            () = shutdown.cancelled() => return,
        };
        let count = match received {
            Ok(n) => n,
            Err(error) => {
                // ICMP errors from earlier replies surface here (ECONNREFUSED): not fatal.
                warn!(%error, "DNS receive error");
                continue;
            }
        };
        batch.answer(count, &handler);
        let mut sent = 0;
        while sent < batch.replies {
            match socket
                .async_io(Interest::WRITABLE, || batch.send(&socket, sent))
                .await
            {
                Ok(n) => sent += n,
                Err(error) => {
                    // The reply that failed is skipped; the others still go.
                    let client = batch.reply_peer(sent);
                    warn!(%client, %error, "cannot send DNS reply");
                    sent += 1;
                }
            }
        }
    }
}

/// Room for an `IP_PKTINFO` and an `IPV6_PKTINFO` control message together (32 + 40 bytes: an IPv4
/// datagram on a dual-stack socket carries both), aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Control([u8; 128]);

/// The address a datagram was sent to, from its `IP_PKTINFO` / `IPV6_PKTINFO` (only on a socket bound
/// to the unspecified address): its reply leaves from there. Without it the kernel picks the source by
/// the route back, and on a host with several addresses a client that asked any but the primary one
/// would get its answer from another address, which resolvers discard.
#[derive(Clone, Copy)]
enum Local {
    /// Not known (a socket bound to one address, or no control message): the kernel picks.
    Unknown,
    /// IPv4: the received `in_pktinfo`, whose `ipi_spec_dst` is the local address to answer from.
    V4(libc::in_pktinfo),
    /// IPv6: the received `in6_pktinfo`.
    V6(libc::in6_pktinfo),
    /// IPv4 on a dual-stack socket: the local address to answer from (`ipi_spec_dst` of its
    /// `IP_PKTINFO`, a unicast address even for a broadcast query), sent as an IPv4-mapped
    /// `IPV6_PKTINFO`.
    Mapped(libc::in_addr),
}

/// The buffers of one worker's batched receive loop, reused for every batch.
struct Batch {
    /// The socket is bound to the unspecified address and asked for each datagram's destination.
    pktinfo: bool,
    /// One control buffer per datagram received (used only with `pktinfo`).
    controls: [Control; BATCH],
    /// Each datagram's destination, from its control message.
    locals: [Local; BATCH],
    /// One control buffer per reply sent (used only with `pktinfo`).
    send_controls: [Control; BATCH],
    /// One receive buffer per datagram.
    packets: Vec<[u8; MAX_DATAGRAM]>,
    /// The received lengths.
    lengths: [usize; BATCH],
    /// The senders, as the kernel wrote them.
    peers: [libc::sockaddr_storage; BATCH],
    /// The senders' address lengths.
    peer_lengths: [libc::socklen_t; BATCH],
    /// The replies of the current batch, in order; `replies` of them are valid.
    out: Vec<Vec<u8>>,
    /// Which datagram each reply answers (its index in `peers`).
    reply_to: [usize; BATCH],
    /// The number of replies to send.
    replies: usize,
}

impl Batch {
    fn new(pktinfo: bool) -> Batch {
        Batch {
            pktinfo,
            controls: [Control([0; 128]); BATCH],
            locals: [Local::Unknown; BATCH],
            send_controls: [Control([0; 128]); BATCH],
            packets: vec![[0u8; MAX_DATAGRAM]; BATCH],
            lengths: [0; BATCH],
            // SAFETY: sockaddr_storage is plain data for which all-zero bytes are a valid value.
            peers: unsafe { std::mem::zeroed() },
            peer_lengths: [0; BATCH],
            out: (0..BATCH).map(|_| Vec::with_capacity(512)).collect(),
            reply_to: [0; BATCH],
            replies: 0,
        }
    }

    /// One `recvmmsg(2)`, non-blocking: how many datagrams arrived (at least one), or `WouldBlock`.
    fn receive(&mut self, socket: &UdpSocket) -> std::io::Result<usize> {
        // SAFETY: all-zero is a valid iovec and mmsghdr; every pointer is set below.
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..BATCH {
            iov[i].iov_base = self.packets[i].as_mut_ptr().cast();
            iov[i].iov_len = MAX_DATAGRAM;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = std::ptr::addr_of_mut!(self.peers[i]).cast();
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            if self.pktinfo {
                msgs[i].msg_hdr.msg_control = self.controls[i].0.as_mut_ptr().cast();
                msgs[i].msg_hdr.msg_controllen = self.controls[i].0.len() as _;
            }
        }
        // SAFETY: every msghdr points at a live buffer of the stated length and at a sockaddr_storage
        // of the stated size, all owned by `self` or this frame and not moved during the call.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = n as usize;
        for (i, msg) in msgs.iter().take(n).enumerate() {
            self.lengths[i] = msg.msg_len as usize;
            self.peer_lengths[i] = msg.msg_hdr.msg_namelen;
            self.locals[i] = if self.pktinfo {
                // SAFETY: the header's control pointer and the length the kernel wrote describe
                // `self.controls[i]`, which nothing has touched since the call.
                unsafe { local_of(&msg.msg_hdr) }
            } else {
                Local::Unknown
            };
        }
        Ok(n)
    }

    /// The sender of datagram `i`, if the kernel gave an IP address.
    fn peer(&self, i: usize) -> Option<SocketAddr> {
        let storage = &self.peers[i];
        let len = self.peer_lengths[i] as usize;
        match libc::c_int::from(storage.ss_family) {
            libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
                // SAFETY: the kernel wrote a sockaddr_in (family AF_INET, long enough) into storage,
                // which is large and aligned enough for any socket address.
                let a = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in>() };
                Some(SocketAddr::from((
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
                // SAFETY: as above, for a sockaddr_in6.
                let a = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in6>() };
                Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                    std::net::Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }

    /// The client of reply `r`, for the log.
    fn reply_peer(&self, r: usize) -> String {
        self.peer(self.reply_to[r])
            .map_or_else(|| "?".to_owned(), |a| a.to_string())
    }

    /// Decides the first `count` datagrams; fills `out` and `reply_to`.
    fn answer(&mut self, count: usize, handler: &DnsHandler) {
        self.replies = 0;
        for i in 0..count {
            let Some(client) = self.peer(i) else {
                continue;
            };
            let packet = &self.packets[i][..self.lengths[i]];
            if respond(handler, packet, client, &mut self.out[self.replies]) {
                self.reply_to[self.replies] = i;
                self.replies += 1;
            }
        }
    }

    /// One `sendmmsg(2)` of the replies from `from` on, non-blocking: how many left.
    fn send(&mut self, socket: &UdpSocket, from: usize) -> std::io::Result<usize> {
        let count = self.replies - from;
        // SAFETY: all-zero is a valid iovec and mmsghdr; every pointer is set below.
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for k in 0..count {
            let r = from + k;
            let peer = self.reply_to[r];
            iov[k].iov_base = self.out[r].as_mut_ptr().cast();
            iov[k].iov_len = self.out[r].len();
            msgs[k].msg_hdr.msg_iov = &mut iov[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
            msgs[k].msg_hdr.msg_name = std::ptr::addr_of_mut!(self.peers[peer]).cast();
            msgs[k].msg_hdr.msg_namelen = self.peer_lengths[peer];
            let control = &mut self.send_controls[k];
            // SAFETY: `control` is 128 bytes aligned for cmsghdr, room for either message.
            let used = unsafe {
                match self.locals[peer] {
                    Local::Unknown => 0,
                    Local::V4(mut info) => {
                        // The route back chooses the interface; the source is the address asked.
                        info.ipi_ifindex = 0;
                        put_cmsg(control, libc::IPPROTO_IP, libc::IP_PKTINFO, info)
                    }
                    Local::V6(mut info) => {
                        // The interface matters only for a link-local address.
                        if info.ipi6_addr.s6_addr[0] != 0xfe
                            || info.ipi6_addr.s6_addr[1] & 0xc0 != 0x80
                        {
                            info.ipi6_ifindex = 0;
                        }
                        put_cmsg(control, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info)
                    }
                    Local::Mapped(v4) => {
                        let mut addr = [0u8; 16];
                        addr[10] = 0xff;
                        addr[11] = 0xff;
                        addr[12..].copy_from_slice(&v4.s_addr.to_ne_bytes());
                        let info = libc::in6_pktinfo {
                            ipi6_addr: libc::in6_addr { s6_addr: addr },
                            ipi6_ifindex: 0,
                        };
                        put_cmsg(control, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info)
                    }
                }
            };
            if used > 0 {
                msgs[k].msg_hdr.msg_control = control.0.as_mut_ptr().cast();
                msgs[k].msg_hdr.msg_controllen = used as _;
            }
        }
        // SAFETY: every msghdr points at a live reply of the stated length and at the sender's address
        // as recvmmsg wrote it, all owned by `self` or this frame and not moved during the call.
        let n = unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// The destination a received message's `IP_PKTINFO` and `IPV6_PKTINFO` name ([`Local`]). `Unknown`
/// (the kernel picks the source, as without them) when there is neither, when the control data was
/// truncated, or when the destination is one no reply may leave from: IPv6 multicast, or an
/// IPv4-mapped address without the `IP_PKTINFO` that says which unicast address to use.
///
/// # Safety
/// `hdr.msg_control` and `hdr.msg_controllen` must describe control data the kernel wrote.
unsafe fn local_of(hdr: &libc::msghdr) -> Local {
    if hdr.msg_flags & libc::MSG_CTRUNC != 0 {
        return Local::Unknown;
    }
    let mut v4 = None;
    let mut v6 = None;
    // SAFETY: the caller's guarantee; CMSG_FIRSTHDR and CMSG_NXTHDR stay within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            let data = libc::CMSG_DATA(cmsg);
            let len = (*cmsg).cmsg_len as usize;
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO)
                    if len
                        >= libc::CMSG_LEN(std::mem::size_of::<libc::in_pktinfo>() as u32)
                            as usize =>
                {
                    v4 = Some(std::ptr::read_unaligned(data.cast::<libc::in_pktinfo>()));
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                    if len
                        >= libc::CMSG_LEN(std::mem::size_of::<libc::in6_pktinfo>() as u32)
                            as usize =>
                {
                    v6 = Some(std::ptr::read_unaligned(data.cast::<libc::in6_pktinfo>()));
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    match (v4, v6) {
        // An IPv4 datagram on a dual-stack socket: both messages.
        (Some(info), Some(_)) => Local::Mapped(info.ipi_spec_dst),
        (Some(info), None) => Local::V4(info),
        (None, Some(info)) => {
            let a = info.ipi6_addr.s6_addr;
            if a[0] == 0xff || (a[..10] == [0; 10] && a[10..12] == [0xff, 0xff]) {
                Local::Unknown
            } else {
                Local::V6(info)
            }
        }
        (None, None) => Local::Unknown,
    }
}

/// Writes one control message of `level`/`kind` carrying `value` at the start of `control`; returns
/// the length to give `msg_controllen`.
///
/// # Safety
/// `T` must be the plain-data struct the kernel expects for `level`/`kind`, and fit in `control`.
unsafe fn put_cmsg<T>(control: &mut Control, level: i32, kind: i32, value: T) -> usize {
    control.0 = [0; 128];
    let size = std::mem::size_of::<T>() as u32;
    // SAFETY: a msghdr whose control buffer is `control`, so CMSG_FIRSTHDR returns its start, which is
    // aligned for cmsghdr; CMSG_SPACE(size) fits in 128 bytes for both pktinfo structs.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_control = control.0.as_mut_ptr().cast();
        hdr.msg_controllen = libc::CMSG_SPACE(size) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&hdr);
        (*cmsg).cmsg_level = level;
        (*cmsg).cmsg_type = kind;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<T>(), value);
        libc::CMSG_SPACE(size) as usize
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("replies", &self.replies)
            .finish_non_exhaustive()
    }
}

/// Opens `count` UDP sockets on `addr` sharing the port (SO_REUSEPORT), so each worker gets its own
/// receive queue. With `addr` port 0, the first socket's port is reused by the others.
pub(crate) fn bind_many(
    addr: SocketAddr,
    count: usize,
) -> std::io::Result<Vec<std::net::UdpSocket>> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut sockets = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count.max(1) {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        // A deeper receive queue rides out bursts instead of dropping them.
        let _ = socket.set_recv_buffer_size(4 * 1024 * 1024);
        if addr.ip().is_unspecified() {
            // Each datagram's destination, so its reply leaves from the address asked (`Local`). A
            // dual-stack socket asks for both: an IPv4 datagram's IPV6_PKTINFO holds the header's
            // destination (a broadcast address, say), its IP_PKTINFO the unicast one to answer from.
            let mut options = vec![(libc::IPPROTO_IP, libc::IP_PKTINFO)];
            if addr.is_ipv6() {
                options.push((libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO));
            }
            for (level, option) in options {
                let on: libc::c_int = 1;
                // SAFETY: setsockopt with an int option value on a socket this function owns.
                let r = unsafe {
                    libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&socket),
                        level,
                        option,
                        std::ptr::from_ref(&on).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                if r != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        socket.bind(&addr.into())?;
        if addr.port() == 0 {
            if let Some(bound) = socket.local_addr()?.as_socket() {
                addr = bound;
            }
        }
        sockets.push(socket.into());
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn query(name: &[&[u8]], qtype: u16, extra: &[u8], ar: u16) -> Vec<u8> {
        let mut p = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0];
        p.extend_from_slice(&ar.to_be_bytes());
        for l in name {
            p.push(l.len() as u8);
            p.extend_from_slice(l);
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&[0, 1]);
        p.extend_from_slice(extra);
        p
    }

    #[test]
    fn parses_plain_and_edns_queries() {
        let q = parse(&query(&[b"WWW", b"example", b"com"], 1, &[], 0)).unwrap();
        assert_eq!(q.name, "WWW.example.com.");
        assert_eq!((q.qtype, q.qclass, q.edns), (1, 1, false));
        let opt = [0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0];
        let q = parse(&query(&[b"a", b"b"], 28, &opt, 1)).unwrap();
        assert!(q.edns);
        // OPT with an option (a cookie) is skipped whole.
        let mut opt_cookie = vec![0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 12, 0, 10, 0, 8];
        opt_cookie.extend_from_slice(&[1; 8]);
        assert!(
            parse(&query(&[b"a", b"b"], 1, &opt_cookie, 1))
                .unwrap()
                .edns
        );
    }

    #[test]
    fn odd_bytes_are_escaped_not_dropped() {
        let q = parse(&query(&[b"www.evil", b"example", b"com"], 1, &[], 0)).unwrap();
        assert_eq!(q.name, "www\\046evil.example.com.");
        let q = parse(&query(&[b"a\0b", b"com"], 1, &[], 0)).unwrap();
        assert_eq!(q.name, "a\\000b.com.");
    }

    #[test]
    fn malformed_shapes() {
        let good = query(&[b"a", b"com"], 1, &[], 0);
        assert_eq!(parse(&good[..11]), Err(Malformed::Drop));
        let mut response = good.clone();
        response[2] |= 0x80;
        assert_eq!(parse(&response), Err(Malformed::Drop));
        let mut notify = good.clone();
        notify[2] = 0x20;
        assert_eq!(parse(&notify), Err(Malformed::Code(ResponseCode::NotImp)));
        let formerr = Err(Malformed::Code(ResponseCode::FormErr));
        let mut zero = good.clone();
        zero[5] = 0;
        assert_eq!(parse(&zero), formerr);
        let mut two = good.clone();
        two[5] = 2;
        assert_eq!(parse(&two), formerr);
        assert_eq!(parse(&good[..good.len() - 1]), formerr);
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(parse(&trailing), formerr);
        // A compression pointer in the question.
        let mut ptr = good[..12].to_vec();
        ptr.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(parse(&ptr), formerr);
        // A name over 255 bytes.
        let long: Vec<&[u8]> = vec![&[b'a'; 63][..]; 5];
        assert_eq!(parse(&query(&long, 1, &[], 0)), formerr);
        // An additional record that is not OPT.
        let bogus = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse(&query(&[b"a"], 1, &bogus, 1)), formerr);
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn never_panics_on_query_shaped_input(tail in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut p = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1];
            p.extend_from_slice(&tail);
            let _ = parse(&p);
        }
    }
}
