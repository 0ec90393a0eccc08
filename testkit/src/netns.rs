//! A network namespace joined to ours by a veth pair (addresses from 198.18.0.0/15, never an outside
//! address), for test hosts the router can dial.
//!
//! The router refuses to dial loopback (that is the point), so upstreams cannot simply listen on
//! 127.0.0.1: they listen on the namespace's address, which the router reaches through the veth.
//! Sockets keep the namespace they were created in, so a helper thread enters the namespace, binds, and
//! hands the listener back to the test's runtime.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// True when the tests can create namespaces (root with `ip`).
pub fn available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("ip").arg("-V").output().is_ok()
}

/// A network namespace with a veth pair: `host_ip` on our side, `ns_ip` inside. Deleted on drop.
#[derive(Debug)]
pub struct Netns {
    /// The namespace's name under /run/netns (`asp<pid>x<n>`: a later run sweeps those of dead pids).
    pub name: String,
    /// Our end of the veth pair.
    host_if: String,
    /// Our end's address: where the router's dials come from.
    pub host_ip: Ipv4Addr,
    /// The address inside the namespace: where test upstreams listen.
    pub ns_ip: Ipv4Addr,
}

impl Netns {
    /// Creates the namespace and the veth pair, with a fresh /30 from 198.18.0.0/15.
    pub fn create() -> Netns {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        static SWEEP: std::sync::Once = std::sync::Once::new();
        // A test binary killed by a timeout runs no destructors: remove namespaces of ours whose
        // process is gone (named asp<pid>x<n>).
        SWEEP.call_once(|| sweep_stale("asp"));
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() as usize;
        let name = format!("asp{pid}x{n}");
        let host_if = format!("vh{}x{n}", pid % 100_000);
        let ns_if = format!("vn{}x{n}", pid % 100_000);
        // One /30 per namespace in 198.18.0.0/15 (32768 of them), spread by pid.
        let block = ((pid * 64 + n) % 32768) as u32;
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + block * 4;
        let host_ip = Ipv4Addr::from(base + 1);
        let ns_ip = Ipv4Addr::from(base + 2);
        let guard = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            host_ip,
            ns_ip,
        };
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{ns_ip}/30"),
            "dev",
            &ns_if,
        ]);
        ip(&["-n", &name, "link", "set", &ns_if, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        guard
    }

    /// A listener bound inside the namespace.
    pub fn bind(&self, port: u16) -> TcpListener {
        let path = format!("/run/netns/{}", self.name);
        let addr = SocketAddr::new(IpAddr::V4(self.ns_ip), port);
        let std_listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open netns");
            // SAFETY: setns on this helper thread only; the fd is valid for the call.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            let l = std::net::TcpListener::bind(addr).expect("bind in netns");
            l.set_nonblocking(true).unwrap();
            l
        })
        .join()
        .unwrap();
        TcpListener::from_std(std_listener).unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair with it; the link delete is a fallback.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
    }
}

/// For a test that needs namespaces: true when it can run; see [`crate::require`] for when not.
#[must_use]
pub fn require() -> bool {
    crate::require(
        "root and iproute2 (to create network namespaces for test hosts)",
        available(),
    )
}

/// Removes the network namespaces named `PREFIX<pid>x...` whose test process is gone: a test binary killed
/// by a timeout runs no destructors. Namespaces of live processes (other tests running now) are left.
pub fn sweep_stale(prefix: &str) {
    for entry in std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|r| r.split_once('x'))
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}
