//! ICMP errors that come back for what a socket sent. A blocked address fails in the sandbox's own
//! kernel (no route) and nothing leaves; an ICMP error from the network shows that the packet did. With
//! `IP_RECVERR` (`IPV6_RECVERR`) set, the kernel reports such errors on an unconnected UDP socket too,
//! and queues each with where it came from (`MSG_ERRQUEUE`).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};

/// Asks the kernel to report, and queue, ICMP errors that come back for what `socket` sends.
///
/// # Errors
/// The `setsockopt(2)` error.
pub fn report(socket: &impl AsRawFd, ipv4: bool) -> io::Result<()> {
    let (level, option) = if ipv4 {
        (libc::IPPROTO_IP, libc::IP_RECVERR)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
    };
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a descriptor the socket owns, with a c_int value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            std::ptr::addr_of!(on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The sender of an ICMP error queued for `socket` ([`report`] set), if one came back: `Some` means
/// what the socket sent left the sandbox. An error the sandbox's own kernel made is not one.
#[must_use]
pub fn sender(socket: &impl AsRawFd) -> Option<IpAddr> {
    queued(socket.as_raw_fd())
}

fn queued(fd: RawFd) -> Option<IpAddr> {
    let mut data = [0u8; 64];
    // u64s: the control buffer must be aligned for cmsghdr.
    let mut control = [0u64; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg with buffers described by msg, non-blocking.
    if unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) } < 0 {
        return None;
    }
    // SAFETY: the CMSG_* walk stays within msg_controllen, which the kernel set.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
    while !cmsg.is_null() {
        // SAFETY: cmsg points at a header inside the control buffer.
        let (level, kind, len) =
            unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
        let ours = (level == libc::IPPROTO_IP && kind == libc::IP_RECVERR)
            || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_RECVERR);
        // SAFETY: CMSG_LEN(0) is the header's size, a constant computation.
        let header = unsafe { libc::CMSG_LEN(0) } as usize;
        let have = len.saturating_sub(header);
        let err_len = std::mem::size_of::<libc::sock_extended_err>();
        if ours && have >= err_len {
            // SAFETY: CMSG_DATA points at `have` bytes of this message's data inside the buffer.
            let bytes = unsafe { std::slice::from_raw_parts(libc::CMSG_DATA(cmsg), have) };
            let origin = bytes[4];
            if origin == libc::SO_EE_ORIGIN_ICMP || origin == libc::SO_EE_ORIGIN_ICMP6 {
                return Some(
                    offender(&bytes[err_len..]).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                );
            }
        }
        // SAFETY: as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&raw const msg, cmsg) };
    }
    None
}

/// The address of the sockaddr that follows a `sock_extended_err` (SO_EE_OFFENDER).
fn offender(b: &[u8]) -> Option<IpAddr> {
    let family = i32::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    if family == libc::AF_INET {
        let a: [u8; 4] = b.get(4..8)?.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(a)))
    } else if family == libc::AF_INET6 {
        let a: [u8; 16] = b.get(8..24)?.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(a)))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    #[test]
    fn a_port_unreachable_is_reported_with_its_sender() {
        // Loopback's own ICMP port unreachable comes through the same path as one from the network.
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = closed.local_addr().unwrap();
        drop(closed);
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        report(&s, true).unwrap();
        assert_eq!(sender(&s), None, "nothing sent, nothing queued");
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send_to(b"x", to).unwrap();
        let e = s.recv_from(&mut [0u8; 16]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert_eq!(sender(&s), Some(IpAddr::from([127, 0, 0, 1])));
    }

    #[test]
    fn offenders_of_both_families_and_garbage() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[4..8].copy_from_slice(&[192, 0, 2, 1]);
        assert_eq!(offender(&v4), Some(IpAddr::from([192, 0, 2, 1])));
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        assert_eq!(offender(&v6), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(offender(&[]), None);
        assert_eq!(offender(&v6[..10]), None);
    }
}
