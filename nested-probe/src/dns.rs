//! One A query over UDP: built and parsed by hand, because a static binary in a scratch image has no
//! name-service modules for getaddrinfo, and a probe that used it would test the wrong thing.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

/// The largest answer read: one UDP datagram without EDNS is 512 bytes; anything up to an Ethernet
/// frame is accepted.
pub const MAX_ANSWER: usize = 1500;

/// The largest resolv.conf read.
pub const MAX_RESOLV_CONF: u64 = 64 * 1024;

/// An answer to our query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The response code (0 NOERROR, 3 NXDOMAIN, ...).
    pub rcode: u8,
    /// The A records in the answer section.
    pub addresses: Vec<Ipv4Addr>,
}

/// Why no answer came.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The socket could not be opened or the query not sent: nothing left.
    #[error("{0}")]
    Unsent(io::Error),
    /// The query was sent, and the wait for its answer ended in an error: a timeout, or an ICMP error
    /// that came back for it (the socket asks for them, `IP_RECVERR`), with its sender.
    #[error("{0}")]
    Unanswered(io::Error, Option<IpAddr>),
    /// Something came back that is not an answer to our query.
    #[error("not an answer to the query: {0}")]
    Malformed(&'static str),
}

impl DnsError {
    /// The I/O error underneath, if that is what it was.
    #[must_use]
    pub fn io(&self) -> Option<&io::Error> {
        match self {
            DnsError::Unsent(e) | DnsError::Unanswered(e, _) => Some(e),
            DnsError::Malformed(_) => None,
        }
    }
}

/// The first `nameserver` line of a resolv.conf (a zone index such as `%eth0` dropped).
pub fn nameserver(resolv_conf: &Path) -> io::Result<Option<IpAddr>> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(resolv_conf)?
        .take(MAX_RESOLV_CONF)
        .read_to_string(&mut text)?;
    Ok(text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some("nameserver"))
            .then(|| f.next()?.split('%').next()?.parse().ok())
            .flatten()
    }))
}

/// The query for the A records of `name` (already checked with [`crate::spec::is_dns_name`]).
#[must_use]
pub fn query(name: &str, id: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    // Recursion desired, one question.
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63).min(63));
        q.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Reads the answer to the query with `id`.
pub fn parse(r: &[u8], id: u16) -> Result<Answer, DnsError> {
    let get = |i: usize, n: usize| {
        r.get(i..i + n)
            .ok_or(DnsError::Malformed("it is cut short"))
    };
    let header = get(0, 12)?;
    if header[0..2] != id.to_be_bytes() {
        return Err(DnsError::Malformed("another query's id"));
    }
    if header[2] & 0x80 == 0 {
        return Err(DnsError::Malformed("it is a query, not a response"));
    }
    let rcode = header[3] & 0x0f;
    let questions = u16::from_be_bytes([header[4], header[5]]);
    let answers = u16::from_be_bytes([header[6], header[7]]);
    let mut i = 12;
    for _ in 0..questions {
        i = skip_name(r, i)? + 4;
    }
    let mut addresses = Vec::new();
    for _ in 0..answers {
        i = skip_name(r, i)?;
        let rr = get(i, 10)?;
        let (rtype, len) = (
            u16::from_be_bytes([rr[0], rr[1]]),
            usize::from(u16::from_be_bytes([rr[8], rr[9]])),
        );
        i += 10;
        let data = get(i, len)?;
        if rtype == 1 && len == 4 {
            addresses.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        i += len;
    }
    Ok(Answer { rcode, addresses })
}

/// The index after the name at `i` (labels, ending in a zero byte or a compression pointer).
fn skip_name(r: &[u8], mut i: usize) -> Result<usize, DnsError> {
    loop {
        let n = *r.get(i).ok_or(DnsError::Malformed("a name is cut short"))?;
        match n {
            0 => return Ok(i + 1),
            n if n & 0xc0 == 0xc0 => return Ok(i + 2),
            n if n & 0xc0 != 0 => return Err(DnsError::Malformed("a label of an unknown kind")),
            n => i += usize::from(n) + 1,
        }
    }
}

/// Asks `server` for the A records of `name` over UDP, waiting at most `timeout`.
pub fn ask(server: SocketAddr, name: &str, timeout: Duration) -> Result<Answer, DnsError> {
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(bind).map_err(DnsError::Unsent)?;
    sock.set_read_timeout(Some(timeout))
        .map_err(DnsError::Unsent)?;
    crate::icmp::report(&sock, server.is_ipv4()).map_err(DnsError::Unsent)?;
    let id = random_id();
    // Not connected: an answer counts from whatever address it comes (a host answers from the address
    // its route to us picks, which need not be the one asked), as in probe.py.
    sock.send_to(&query(name, id), server)
        .map_err(DnsError::Unsent)?;
    let mut buf = [0u8; MAX_ANSWER];
    // A stray datagram with another id does not end the wait; the read timeout bounds each read and
    // the count bounds the loop.
    // Once something has come back, that is the outcome even if nothing better follows: a datagram
    // from the server, answer or not, shows that the query got there.
    let mut last = None;
    for _ in 0..4 {
        let n = match sock.recv_from(&mut buf) {
            Ok((n, _)) => n,
            Err(e) => {
                return Err(
                    last.unwrap_or_else(|| DnsError::Unanswered(e, crate::icmp::sender(&sock)))
                )
            }
        };
        match parse(&buf[..n], id) {
            Ok(a) => return Ok(a),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(DnsError::Malformed("no answer")))
}

/// A query id that is not predictable (from the clock and the process id: the probe has no need
/// for more than telling its answers from stray ones).
fn random_id() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = nanos ^ std::process::id().rotate_left(16);
    (mixed ^ (mixed >> 16)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: u16, rcode: u8, records: &[(u16, &[u8])]) -> Vec<u8> {
        let mut q = query("web.test", id);
        q[2] |= 0x80;
        q[3] = rcode;
        q[7] = u8::try_from(records.len()).unwrap();
        for (rtype, data) in records {
            q.extend_from_slice(&[0xc0, 12]);
            q.extend_from_slice(&rtype.to_be_bytes());
            q.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
            q.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
            q.extend_from_slice(data);
        }
        q
    }

    #[test]
    fn queries_carry_the_name() {
        let q = query("web.test.", 0x1234);
        assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
        assert_eq!(&q[12..], b"\x03web\x04test\x00\x00\x01\x00\x01");
    }

    #[test]
    fn answers_and_their_addresses() {
        let a = parse(&answer(7, 0, &[(5, b"\x01x\x00"), (1, &[127, 0, 0, 2])]), 7).unwrap();
        assert_eq!(
            a,
            Answer {
                rcode: 0,
                addresses: vec![Ipv4Addr::new(127, 0, 0, 2)]
            }
        );
        assert_eq!(parse(&answer(7, 3, &[]), 7).unwrap().rcode, 3);
    }

    #[test]
    fn what_is_not_an_answer_is_an_error_never_a_panic() {
        let good = answer(7, 0, &[(1, &[127, 0, 0, 2])]);
        assert!(parse(&good, 8).is_err());
        assert!(parse(&query("web.test", 7), 7).is_err());
        for cut in 0..good.len() {
            assert!(parse(&good[..cut], 7).is_err(), "cut at {cut}");
        }
        let mut bad_label = good.clone();
        bad_label[12] = 0x80;
        assert!(parse(&bad_label, 7).is_err());
        // Every byte of every length, deterministic: no input panics.
        let mut x: u32 = 1;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let _ = parse(&bytes, 0);
        }
    }

    #[test]
    fn the_nameserver_of_a_resolv_conf() {
        let dir = std::env::temp_dir().join(format!("nested-probe-dns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("resolv.conf");
        std::fs::write(
            &f,
            "# x\nsearch dns.podman\nnameserver fe80::1%eth0\nnameserver 10.1.2.3\n",
        )
        .unwrap();
        assert_eq!(nameserver(&f).unwrap(), Some("fe80::1".parse().unwrap()));
        std::fs::write(&f, "search x\n").unwrap();
        assert_eq!(nameserver(&f).unwrap(), None);
        assert!(nameserver(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
