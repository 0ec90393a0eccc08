//! The checks. Each one is a [`Line`] saying what was tried and what happened; `ok` is whether the
//! sandbox held (for the reachability checks: whether the path through the router works). The
//! connection attempts run side by side, so the whole run takes about one [`TIMEOUT`].

use std::fmt::Write as _;
use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use crate::dns;
use crate::icmp;
use crate::spec::{Spec, Target};

/// How long each attempt waits: inside the sandbox a blocked address fails at once (no route), so
/// this bounds only what would be a breach or a router that does not answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The most bytes of the router's HTTP response read.
pub const MAX_RESPONSE: u64 = 4096;

/// One check's outcome, printed as one JSON line (`probe.py`'s format).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The check's stable name, `nested-…`.
    pub name: String,
    /// Whether it came out as a sandbox requires.
    pub ok: bool,
    /// What was tried.
    pub tried: String,
    /// What happened.
    pub got: String,
    /// Not run, and `got` says why (an empty allowlist has no name to resolve).
    pub skip: bool,
}

impl Line {
    fn new(
        name: impl Into<String>,
        ok: bool,
        tried: impl Into<String>,
        got: impl Into<String>,
    ) -> Line {
        Line {
            name: name.into(),
            ok,
            tried: tried.into(),
            got: got.into(),
            skip: false,
        }
    }

    /// A check that was not run, and why.
    fn skipped(name: &str, tried: &str, why: &str) -> Line {
        Line {
            skip: true,
            ..Line::new(name, true, tried, why)
        }
    }

    /// The JSON object, on one line.
    #[must_use]
    pub fn to_json(&self) -> String {
        format!(
            r#"{{"name":{},"ok":{},"tried":{},"got":{}{}}}"#,
            json_string(&self.name),
            self.ok,
            json_string(&self.tried),
            json_string(&self.got),
            if self.skip { r#","skip":true"# } else { "" }
        )
    }
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Every check of `spec`, in a fixed order: the network namespace, DNS, the router, then each target.
#[must_use]
pub fn run(spec: &Spec) -> Vec<Line> {
    // Another DNS server is asked for the allowlisted name (what an agent would want answered), or for
    // the unlisted one when the allowlist is empty: any answer at all is the failure.
    let asked = spec
        .allowed
        .as_ref()
        .map_or(spec.unlisted.as_str(), |a| a.name.as_str());
    std::thread::scope(|s| {
        let side: Vec<_> = spec
            .tcp
            .iter()
            .map(|t| (t, true))
            .chain(spec.dns.iter().map(|t| (t, false)))
            .map(|(t, tcp)| {
                let check = move || {
                    if tcp {
                        tcp_blocked(t)
                    } else {
                        dns_unanswered(t, asked)
                    }
                };
                // A thread per target, with a small stack (up to MAX_TARGETS of each kind). No thread
                // to be had: the check runs in turn, after the others.
                std::thread::Builder::new()
                    .stack_size(THREAD_STACK)
                    .spawn_scoped(s, check)
                    .map_err(|_| check)
            })
            .collect();
        let mut out = vec![netns(spec)];
        out.extend(dns_checks(spec));
        out.push(router(spec));
        out.extend(spec.udp.iter().map(udp_sent));
        out.extend(side.into_iter().map(|h| {
            match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Line::new("nested-probe", false, "a check", "it panicked")),
                Err(check) => check(),
            }
        }));
        out
    })
}

/// Each target's thread's stack: its check holds a few buffers of at most 1,500 bytes.
const THREAD_STACK: usize = 128 * 1024;

/// Why the checks that need an allowlisted name are not run.
const EMPTY_ALLOWLIST: &str =
    "skipped: the allowlist is empty, so no name resolves in the sandbox and no address of the router's carries a connection (add a name to test these)";

/// The nested container's network namespace is the sandbox's.
fn netns(spec: &Spec) -> Line {
    let tried = "this container's network namespace (/proc/self/ns/net) against the sandbox's";
    match std::fs::read_link("/proc/self/ns/net") {
        Ok(ns) => {
            let ns = ns.to_string_lossy().into_owned();
            let same = ns == spec.netns;
            let got = if same {
                format!("{ns}, the sandbox's")
            } else {
                format!("{ns}, not the sandbox's {}", spec.netns)
            };
            Line::new("nested-netns", same, tried, got)
        }
        Err(e) => Line::new("nested-netns", false, tried, describe(&e)),
    }
}

/// The allowlisted name resolves to its loopback address; the unlisted one is NXDOMAIN.
fn dns_checks(spec: &Spec) -> Vec<Line> {
    let server = match dns::nameserver(&spec.resolv_conf) {
        Ok(Some(ip)) => SocketAddr::new(ip, spec.dns_port),
        found => {
            let got = match found {
                Err(e) => describe(&e),
                _ => "no nameserver".to_owned(),
            };
            let tried = format!("the nameserver of {}", spec.resolv_conf.display());
            let allowed = match spec.allowed {
                Some(_) => Line::new("nested-dns-allowlisted", false, tried.clone(), got.clone()),
                None => Line::skipped("nested-dns-allowlisted", &tried, EMPTY_ALLOWLIST),
            };
            return vec![allowed, Line::new("nested-dns-unlisted", false, tried, got)];
        }
    };
    let allowed = match &spec.allowed {
        Some(allowed) => {
            let tried = format!(
                "A {} from {} (this container's resolver)",
                allowed.name,
                server.ip()
            );
            match dns::ask(server, &allowed.name, TIMEOUT) {
                Ok(a) => {
                    let ok = a.rcode == 0 && a.addresses == [allowed.expect];
                    let got = format!(
                        "rcode {}, {} (want {}, as in the sandbox)",
                        a.rcode,
                        list(&a.addresses),
                        allowed.expect
                    );
                    Line::new("nested-dns-allowlisted", ok, tried, got)
                }
                Err(e) => Line::new("nested-dns-allowlisted", false, tried, dns_error(&e)),
            }
        }
        None => Line::skipped(
            "nested-dns-allowlisted",
            &format!("an allowlisted name from {}", server.ip()),
            EMPTY_ALLOWLIST,
        ),
    };
    let tried = format!("A {} from {}", spec.unlisted, server.ip());
    let unlisted = match dns::ask(server, &spec.unlisted, TIMEOUT) {
        Ok(a) if a.rcode == 3 && a.addresses.is_empty() => {
            Line::new("nested-dns-unlisted", true, tried, "NXDOMAIN")
        }
        Ok(a) => Line::new(
            "nested-dns-unlisted",
            false,
            tried,
            format!("rcode {}, {}", a.rcode, list(&a.addresses)),
        ),
        Err(e) => Line::new("nested-dns-unlisted", false, tried, dns_error(&e)),
    };
    vec![allowed, unlisted]
}

/// The allowlisted name's loopback address carries a connection to the router: asked for an unlisted
/// Host, the router answers 403 naming it (so no upstream is contacted).
fn router(spec: &Spec) -> Line {
    let Some(allowed) = &spec.allowed else {
        return Line::skipped(
            "nested-router",
            "HTTP to an allowlisted name's address",
            EMPTY_ALLOWLIST,
        );
    };
    let addr = SocketAddr::new(IpAddr::V4(allowed.expect), spec.http_port);
    let tried = format!(
        "HTTP to {}'s address {addr} with Host {} (the router must answer 403)",
        allowed.name, spec.unlisted
    );
    let exchange = || -> io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.set_write_timeout(Some(TIMEOUT))?;
        // One write: a router that answers after the head and closes must not meet a second one.
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            spec.unlisted
        );
        s.write_all(request.as_bytes())?;
        let mut r = Vec::new();
        s.take(MAX_RESPONSE).read_to_end(&mut r)?;
        Ok(String::from_utf8_lossy(&r).into_owned())
    };
    match exchange() {
        Ok(r) => {
            let status = r.split("\r\n").next().unwrap_or_default();
            let ok = status.split(' ').nth(1) == Some("403") && r.contains(&spec.unlisted);
            let got = if status.is_empty() {
                "nothing".to_owned()
            } else if ok {
                format!("the router: {status}, naming {}", spec.unlisted)
            } else {
                status.to_owned()
            };
            Line::new("nested-router", ok, tried, got)
        }
        Err(e) => Line::new("nested-router", false, tried, describe(&e)),
    }
}

/// A direct TCP connection to `t` fails before it gets anywhere.
fn tcp_blocked(t: &Target) -> Line {
    let addr = SocketAddr::new(t.ip, t.port);
    let name = format!("nested-tcp-{}-{}", t.kind, t.ip);
    let tried = format!("TCP to {} {addr}", t.kind);
    let socket = match socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .and_then(|s| icmp::report(&s, addr.is_ipv4()).map(|()| s))
    {
        Ok(s) => s,
        // Only a sandbox without the address family passes: any other failure tried nothing.
        Err(e) => {
            let ok = e.raw_os_error() == Some(libc::EAFNOSUPPORT);
            return Line::new(name, ok, tried, format!("no socket: {}", describe(&e)));
        }
    };
    match socket.connect_timeout(&addr.into(), TIMEOUT) {
        Ok(()) => Line::new(name, false, tried, "connected"),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Line::new(
            name,
            false,
            tried,
            "refused by the target: the packet got there",
        ),
        // An unreachable that the network sent back (not the sandbox's own kernel) went somewhere.
        Err(e) => match icmp::sender(&socket) {
            Some(ip) => Line::new(
                name,
                false,
                tried,
                format!(
                    "{}, reported by {ip}: the packet left the sandbox",
                    describe(&e)
                ),
            ),
            None => Line::new(name, blocked(&e), tried, describe(&e)),
        },
    }
}

/// A UDP datagram to `t` is refused here or sent; whether it arrived is for the launcher's listener
/// on the host to say.
fn udp_sent(t: &Target) -> Line {
    let addr = SocketAddr::new(t.ip, t.port);
    let name = format!("nested-udp-{}-{}-sent", t.kind, t.ip);
    let tried = format!("UDP to {} {addr}", t.kind);
    let bind: SocketAddr = if t.ip.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    match UdpSocket::bind(bind).and_then(|s| s.send_to(b"agent-sandbox doctor (nested)", addr)) {
        Ok(_) => Line::new(
            name,
            true,
            tried,
            "sent (the launcher's listener checks it never arrives)",
        ),
        Err(e) => Line::new(name, blocked(&e), tried, describe(&e)),
    }
}

/// A DNS server other than the router does not answer.
fn dns_unanswered(t: &Target, name: &str) -> Line {
    let addr = SocketAddr::new(t.ip, t.port);
    let check = format!("nested-dns-{}-{}", t.kind, t.ip);
    let tried = format!("A {name} from {} {addr} (not the router)", t.kind);
    match dns::ask(addr, name, TIMEOUT) {
        Ok(a) => Line::new(
            check,
            false,
            tried,
            format!("answered: rcode {}, {}", a.rcode, list(&a.addresses)),
        ),
        // Only a query the sandbox refused to send passes. Once sent, any outcome shows that it left:
        // an answer, a datagram that is not one, an ICMP error, or silence.
        Err(dns::DnsError::Unsent(e)) => Line::new(check, blocked(&e), tried, describe(&e)),
        Err(dns::DnsError::Unanswered(e, sender)) => {
            let got = match (e.kind(), sender) {
                (io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock, _) => describe(&e),
                (_, Some(ip)) => format!("{e}, reported by {ip}: the query left the sandbox"),
                (_, None) => format!("{e}, after the query was sent: it left the sandbox"),
            };
            Line::new(check, false, tried, got)
        }
        Err(e) => Line::new(check, false, tried, format!("something came back: {e}")),
    }
}

/// Whether an error means the packet went nowhere: no route or not permitted. With no route off the
/// sandbox's network a blocked address fails at once with one of these; a timeout is not one (the
/// packet was sent somewhere and nothing answered).
#[must_use]
pub fn blocked(e: &io::Error) -> bool {
    e.raw_os_error().is_some_and(|n| {
        [
            libc::ENETUNREACH,
            libc::EHOSTUNREACH,
            libc::EACCES,
            libc::EPERM,
            libc::EADDRNOTAVAIL,
            libc::EAFNOSUPPORT,
        ]
        .contains(&n)
    })
}

fn describe(e: &io::Error) -> String {
    if matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    ) {
        return "timed out: it was sent somewhere (an address the sandbox has no route to fails at once) and nothing answered".to_owned();
    }
    e.to_string()
}

fn dns_error(e: &dns::DnsError) -> String {
    e.io().map_or_else(|| e.to_string(), describe)
}

fn list(addresses: &[std::net::Ipv4Addr]) -> String {
    if addresses.is_empty() {
        return "no address".to_owned();
    }
    addresses
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json() {
        let l = Line::new("nested-x", true, "a \"b\"\\", "c\nd\u{1}é");
        assert_eq!(
            l.to_json(),
            r#"{"name":"nested-x","ok":true,"tried":"a \"b\"\\","got":"c\u000ad\u0001é"}"#
        );
    }

    #[test]
    fn a_query_that_was_sent_fails_whatever_came_back() {
        // Loopback stands in for an address outside, where a blocked query fails at once (no route):
        // one that was sent fails whether an ICMP error comes back (a closed port) or nothing does.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let target = |port| Target {
            kind: "x".into(),
            ip: IpAddr::from([127, 0, 0, 1]),
            port,
        };
        let refused = dns_unanswered(&target(closed_port), "a.test");
        assert!(!refused.ok, "{refused:?}");
        assert!(refused.got.contains("reported by 127.0.0.1"), "{refused:?}");
        let unanswered = dns_unanswered(&target(silent.local_addr().unwrap().port()), "a.test");
        assert!(!unanswered.ok, "{unanswered:?}");
        assert!(unanswered.got.starts_with("timed out"), "{unanswered:?}");
    }

    #[test]
    fn what_counts_as_blocked() {
        for n in [libc::ENETUNREACH, libc::EHOSTUNREACH, libc::EPERM] {
            assert!(blocked(&io::Error::from_raw_os_error(n)));
        }
        assert!(!blocked(&io::Error::from(io::ErrorKind::TimedOut)));
        assert!(!blocked(&io::Error::from(io::ErrorKind::WouldBlock)));
        for n in [libc::ECONNREFUSED, libc::ECONNRESET] {
            assert!(!blocked(&io::Error::from_raw_os_error(n)));
        }
    }
}
