//! The host's side of the containment self-test: its own addresses and DNS servers (what the probe
//! aims at), the lookup of the first allowlisted name's outside address, and the listeners that
//! count whatever arrives from the sandbox (which must be nothing).

use std::fs;
use std::net::{IpAddr, Ipv4Addr, TcpListener, ToSocketAddrs as _, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// How long the host's own lookup of the first allowlisted name may take (it runs while the session's
/// router is inspected, so a quick one costs nothing).
pub const LOOKUP_DEADLINE: Duration = Duration::from_secs(3);

/// The most host addresses of the first allowlisted name that are probed.
pub const MAX_UPSTREAM_ADDRESSES: usize = 4;

/// The largest hosts file read for [`Options::upstream_hosts`].
pub(super) const MAX_HOSTS_FILE: u64 = 1024 * 1024;

/// This host's own addresses (loopback and IPv6 link-local left out: inside the sandbox they name the
/// sandbox's own interfaces).
#[must_use]
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that freeifaddrs releases; we only read it between.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(addr.cast::<libc::sockaddr_in>());
                        out.push(IpAddr::from(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(addr.cast::<libc::sockaddr_in6>());
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out.retain(|a| match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
    });
    out.sort();
    out.dedup();
    out
}

/// The nameservers of a resolv.conf, loopback ones left out (inside the sandbox they would be its own
/// loopback).
#[must_use]
pub fn resolvers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|s| s.trim().split('%').next()?.parse::<IpAddr>().ok())
        .filter(|a| !a.is_loopback())
        .collect()
}

/// The addresses a hosts file gives `name`, in file order.
#[must_use]
pub fn hosts_file_addresses(hosts: &str, name: &str) -> Vec<IpAddr> {
    hosts
        .lines()
        .filter_map(|l| {
            let l = l.split('#').next()?;
            let mut f = l.split_whitespace();
            let ip = f.next()?.parse::<IpAddr>().ok()?;
            f.any(|n| n.eq_ignore_ascii_case(name)).then_some(ip)
        })
        .collect()
}

/// How the doctor learns the host's addresses of the first allowlisted name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HostLookup {
    /// As this host resolves names: getaddrinfo (/etc/hosts, then its resolvers, per nsswitch.conf).
    #[default]
    System,
    /// From this hosts file only (tests: no lookup may leave the machine).
    HostsFile(PathBuf),
}

/// A lookup of the first allowlisted name on this host, running while the session is inspected.
pub(super) struct Lookup {
    name: String,
    started: Instant,
    result: mpsc::Receiver<Result<Vec<IpAddr>, String>>,
}

impl Lookup {
    /// Starts looking `name` up.
    pub(super) fn start(name: &str, how: &HostLookup) -> Lookup {
        let (tx, result) = mpsc::channel();
        let (owned, how) = (name.to_owned(), how.clone());
        // A resolver that never answers must not hold the doctor: the thread is left behind after
        // the deadline (and ends with the process).
        std::thread::spawn(move || {
            let found = match how {
                HostLookup::System => (owned.as_str(), 443)
                    .to_socket_addrs()
                    .map(|a| a.map(|a| a.ip()).collect())
                    .map_err(|e| format!("getaddrinfo: {e}")),
                HostLookup::HostsFile(path) => read_capped(&path, MAX_HOSTS_FILE)
                    .map(|text| hosts_file_addresses(&text, &owned))
                    .map_err(|e| format!("{}: {e}", path.display())),
            };
            let _ = tx.send(found);
        });
        Lookup {
            name: name.to_owned(),
            started: Instant::now(),
            result,
        }
    }

    /// The addresses to try from the sandbox: loopback and unspecified ones left out (inside the
    /// sandbox those are its own), at most [`MAX_UPSTREAM_ADDRESSES`]; or why there are none.
    pub(super) fn wait(self) -> Result<Vec<IpAddr>, String> {
        let left = LOOKUP_DEADLINE.saturating_sub(self.started.elapsed());
        let found = match self.result.recv_timeout(left) {
            Ok(found) => found?,
            Err(_) => return Err(format!("no answer within {}s", LOOKUP_DEADLINE.as_secs())),
        };
        let mut out: Vec<IpAddr> = Vec::new();
        for a in found {
            let a = match a {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
                v4 => v4,
            };
            if !a.is_loopback() && !a.is_unspecified() && !out.contains(&a) {
                out.push(a);
            }
        }
        out.truncate(MAX_UPSTREAM_ADDRESSES);
        if out.is_empty() {
            return Err(format!("no address for {} but loopback ones", self.name));
        }
        Ok(out)
    }
}

/// A file's text, `cap` bytes at most.
pub(super) fn read_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(fs::File::open(path)?, cap),
        &mut text,
    )?;
    Ok(text)
}

/// Counts what reaches listeners on this host from the sandbox (which must be nothing). The probe
/// sends a datagram to each of this host's addresses and cannot tell whether it arrived: these
/// listeners are the verdict, so there is one for each address family the probe aims at, for TCP too
/// (where the probe also sees a connection get through, or be refused, itself).
pub(super) struct HostListeners {
    /// The ports of the TCP listeners, one per address family.
    pub(super) tcp_ports: Ports,
    /// The ports of the UDP sockets, one per address family.
    pub(super) udp_ports: Ports,
    /// Connections and datagrams received.
    pub(super) hits: Arc<AtomicUsize>,
    /// Tells the thread to stop.
    stop: Arc<AtomicBool>,
    /// Accepts and receives until told to stop.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostListeners {
    pub(super) fn start() -> anyhow::Result<HostListeners> {
        // Two sockets per protocol, each on a port of its own, rather than one dual-stack socket:
        // whether `[::]` also receives IPv4 depends on net.ipv6.bindv6only, and a v6-only socket would
        // miss what is sent to the IPv4 addresses. A host without IPv6 has no IPv6 sockets.
        let tcp_v4 = TcpListener::bind("0.0.0.0:0").context("cannot bind an IPv4 TCP listener")?;
        let tcp_v6 = TcpListener::bind("[::]:0").ok();
        let udp_v4 = UdpSocket::bind("0.0.0.0:0").context("cannot bind an IPv4 UDP socket")?;
        let udp_v6 = UdpSocket::bind("[::]:0").ok();
        let tcp_ports = Ports {
            v4: tcp_v4.local_addr()?.port(),
            v6: match &tcp_v6 {
                Some(s) => Some(s.local_addr()?.port()),
                None => None,
            },
        };
        let udp_ports = Ports {
            v4: udp_v4.local_addr()?.port(),
            v6: match &udp_v6 {
                Some(s) => Some(s.local_addr()?.port()),
                None => None,
            },
        };
        let tcp: Vec<TcpListener> = std::iter::once(tcp_v4).chain(tcp_v6).collect();
        for s in &tcp {
            s.set_nonblocking(true)?;
        }
        let udp: Vec<UdpSocket> = std::iter::once(udp_v4).chain(udp_v6).collect();
        for s in &udp {
            s.set_read_timeout(Some(Duration::from_millis(25)))?;
        }
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (hits, stop) = (Arc::clone(&hits), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                // The UDP reads' timeouts pace the loop; the TCP accepts are non-blocking.
                while !stop.load(Ordering::SeqCst) {
                    for s in &tcp {
                        while s.accept().is_ok() {
                            hits.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    for s in &udp {
                        if s.recv_from(&mut buf).is_ok() {
                            hits.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        };
        Ok(HostListeners {
            tcp_ports,
            udp_ports,
            hits,
            stop,
            thread: Some(thread),
        })
    }

    pub(super) fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.hits.load(Ordering::SeqCst)
    }
}

/// Where what is sent to this host's addresses is counted: the port for each address family.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ports {
    /// For IPv4 addresses.
    pub(super) v4: u16,
    /// For IPv6 addresses (None: no IPv6 socket could be opened).
    pub(super) v6: Option<u16>,
}

impl Ports {
    /// The ports, for the report: `proto` is "TCP" or "UDP".
    pub(super) fn describe(self, proto: &str) -> String {
        match self.v6 {
            Some(v6) => format!("{proto} {} and {v6} (IPv6)", self.v4),
            None => format!("{proto} {}", self.v4),
        }
    }

    /// The port that counts what is sent to `address`, if any does.
    pub(super) fn for_address(self, address: IpAddr) -> Option<u16> {
        match address {
            IpAddr::V4(_) => Some(self.v4),
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Some(self.v4),
            IpAddr::V6(_) => self.v6,
        }
    }
}

/// The default resolv.conf of the host.
#[must_use]
pub fn default_resolv_conf() -> PathBuf {
    Path::new("/etc/resolv.conf").to_owned()
}
