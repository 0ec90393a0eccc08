//! The session plan: the contract between the launcher, the router and the forwarder.
//!
//! Inside the sandbox every allowlisted name resolves to a loopback address. Names without a port entry
//! share [`SHARED_LOOPBACK`]; each host with a port entry gets its own address from
//! [`FIRST_PORT_HOST_LOOPBACK`] on (sorted by name, so the plan is deterministic), because the forwarder
//! relays by destination address and port and must tell `db.a:5432` from `db.b:5432`. 127.0.0.1 is never
//! used: the sandbox's own services live there.
//!
//! The router listens on its session-network address for DNS, 80, 443 and, for the i-th port entry
//! (sorted by host then port), [`FORWARD_PORT_BASE`]` + i`. The forwarder relays, on every loopback
//! address in use, 80 and 443 to the router's 80 and 443, and each port entry's port on its host's
//! address to that entry's router port.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;

use crate::config::{ForwardConfig, ListenConfig, RouterConfig};
use crate::name::HostName;
use crate::policy::Policy;

/// The answer for every allowlisted name without a port entry.
pub const SHARED_LOOPBACK: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The first of the per-host addresses given to hosts with port entries.
pub const FIRST_PORT_HOST_LOOPBACK: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// The router port of the first host:port entry.
pub const FORWARD_PORT_BASE: u16 = 10000;
/// Router port for DNS.
pub const DNS_PORT: u16 = 53;
/// Router port for HTTP.
pub const HTTP_PORT: u16 = 80;
/// Router port for TLS.
pub const HTTPS_PORT: u16 = 443;

/// The most host:port entries a session can have (router ports 10000..=65535).
pub const MAX_PORT_ENTRIES: usize = (u16::MAX - FORWARD_PORT_BASE) as usize + 1;

/// One forwarder relay: connections to `listen` are relayed to `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Relay {
    /// A loopback address and port inside the sandbox.
    pub listen: SocketAddr,
    /// The router's address and port on the session network.
    pub target: SocketAddr,
}

impl fmt::Display for Relay {
    /// The forwarder's argument syntax: `LISTEN=TARGET`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.listen, self.target)
    }
}

/// A forwarder argument that is not `IP:PORT=IP:PORT`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RelayParseError {
    /// No `=`.
    #[error("`{0}` is not LISTEN=TARGET (e.g. 127.0.0.2:443=10.89.3.2:443)")]
    Shape(String),
    /// One side is not an IP:PORT socket address.
    #[error("`{arg}`: `{side}` is not an IP:PORT address (names are not resolved here)")]
    Address {
        /// The whole argument.
        arg: String,
        /// The offending side.
        side: String,
    },
    /// Port 0 on either side.
    #[error("`{0}`: port 0 is not allowed")]
    PortZero(String),
}

impl FromStr for Relay {
    type Err = RelayParseError;
    fn from_str(arg: &str) -> Result<Self, Self::Err> {
        let (l, t) = arg
            .split_once('=')
            .ok_or_else(|| RelayParseError::Shape(arg.to_owned()))?;
        let parse = |side: &str| {
            side.parse::<SocketAddr>()
                .map_err(|_| RelayParseError::Address {
                    arg: arg.to_owned(),
                    side: side.to_owned(),
                })
        };
        let relay = Relay {
            listen: parse(l)?,
            target: parse(t)?,
        };
        if relay.listen.port() == 0 || relay.target.port() == 0 {
            return Err(RelayParseError::PortZero(arg.to_owned()));
        }
        Ok(relay)
    }
}

/// A name's address inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopbackAssignment {
    /// The loopback address.
    pub address: Ipv4Addr,
    /// What resolves to it: `*` for "every allowlisted name without a port entry", or one host.
    pub names: String,
}

/// Planning failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// More port entries than router ports.
    #[error("{0} host:port entries is more than the {MAX_PORT_ENTRIES} a session supports")]
    TooManyPortEntries(usize),
    /// More port hosts than loopback addresses.
    #[error("{0} hosts with port entries is more than the loopback range holds")]
    TooManyPortHosts(usize),
}

/// Everything a session's processes need to agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionPlan {
    /// The router's address on the session network (the sandbox's only DNS server).
    pub router_ip: Ipv4Addr,
    /// The router's configuration.
    pub router: RouterConfig,
    /// The forwarder's relays, sorted.
    pub relays: Vec<Relay>,
    /// Which names resolve to which loopback address, for humans (`--check`, the launcher's report).
    pub loopbacks: Vec<LoopbackAssignment>,
}

impl SessionPlan {
    /// Computes the plan for a policy and the router's session-network address.
    pub fn new(policy: &Policy, router_ip: Ipv4Addr) -> Result<SessionPlan, PlanError> {
        let entries: Vec<(&HostName, u16)> = policy.port_entries().collect();
        if entries.len() > MAX_PORT_ENTRIES {
            return Err(PlanError::TooManyPortEntries(entries.len()));
        }
        let port_hosts: Vec<&HostName> = policy.port_hosts().collect();
        // 127.0.0.3 ..= 127.255.255.254
        let available = (u32::from(Ipv4Addr::new(127, 255, 255, 254))
            - u32::from(FIRST_PORT_HOST_LOOPBACK)
            + 1) as usize;
        if port_hosts.len() > available {
            return Err(PlanError::TooManyPortHosts(port_hosts.len()));
        }

        let mut router = RouterConfig::from_policy(policy, SHARED_LOOPBACK);
        // A session's router has one client, the sandbox (its forwarder connects from the same pod):
        // the per-client cap, meant to keep a gateway's many clients apart, would only shrink its share.
        router.max_connections_per_client = Some(router.max_connections);
        let at = |port| Some(SocketAddr::V4(SocketAddrV4::new(router_ip, port)));
        router.listen = ListenConfig {
            dns: at(DNS_PORT),
            http: at(HTTP_PORT),
            https: at(HTTPS_PORT),
        };

        let mut loopbacks = Vec::new();
        let mut relays = Vec::new();
        let web_relays = |relays: &mut Vec<Relay>, address: Ipv4Addr| {
            for port in [HTTP_PORT, HTTPS_PORT] {
                relays.push(Relay {
                    listen: SocketAddr::V4(SocketAddrV4::new(address, port)),
                    target: SocketAddr::V4(SocketAddrV4::new(router_ip, port)),
                });
            }
        };
        let shared_in_use = !policy.subdomain_apexes().is_empty()
            || policy.exact_hosts().iter().any(|h| !port_hosts.contains(h));
        if shared_in_use {
            loopbacks.push(LoopbackAssignment {
                address: SHARED_LOOPBACK,
                names: "*".to_owned(),
            });
            web_relays(&mut relays, SHARED_LOOPBACK);
        }

        let first = u32::from(FIRST_PORT_HOST_LOOPBACK);
        for (i, host) in port_hosts.iter().enumerate() {
            let address = Ipv4Addr::from(first + i as u32);
            router.answers.hosts.insert(host.to_string(), address);
            loopbacks.push(LoopbackAssignment {
                address,
                names: host.to_string(),
            });
            web_relays(&mut relays, address);
        }
        for (i, (host, port)) in entries.iter().enumerate() {
            let router_port = FORWARD_PORT_BASE + i as u16;
            let listen = SocketAddr::V4(SocketAddrV4::new(router_ip, router_port));
            router.forwards.push(ForwardConfig {
                host: host.to_string(),
                port: *port,
                listen,
            });
            let address = router.answers.hosts[host.as_str()];
            relays.push(Relay {
                listen: SocketAddr::V4(SocketAddrV4::new(address, *port)),
                target: listen,
            });
        }
        relays.sort();
        Ok(SessionPlan {
            router_ip,
            router,
            relays,
            loopbacks,
        })
    }

    /// The forwarder's command-line arguments.
    #[must_use]
    pub fn forwarder_args(&self) -> Vec<String> {
        self.relays.iter().map(Relay::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allowlist::Allowlist;

    fn plan(text: &str) -> SessionPlan {
        let list = Allowlist::parse(text, "t").unwrap();
        SessionPlan::new(&Policy::new(&list), Ipv4Addr::new(10, 89, 3, 2)).unwrap()
    }

    #[test]
    fn full_plan() {
        let p = plan(
            "api.anthropic.com\n.example.com\nz.net:22\ndb.example.com:5432\ndb.example.com:5433\n",
        );
        assert_eq!(
            p.forwarder_args(),
            [
                "127.0.0.2:80=10.89.3.2:80",
                "127.0.0.2:443=10.89.3.2:443",
                "127.0.0.3:80=10.89.3.2:80",
                "127.0.0.3:443=10.89.3.2:443",
                "127.0.0.3:5432=10.89.3.2:10000",
                "127.0.0.3:5433=10.89.3.2:10001",
                "127.0.0.4:22=10.89.3.2:10002",
                "127.0.0.4:80=10.89.3.2:80",
                "127.0.0.4:443=10.89.3.2:443",
            ]
        );
        let r = &p.router;
        assert_eq!(r.answers.default, SHARED_LOOPBACK);
        assert_eq!(
            r.answers.hosts["db.example.com"],
            Ipv4Addr::new(127, 0, 0, 3)
        );
        assert_eq!(r.answers.hosts["z.net"], Ipv4Addr::new(127, 0, 0, 4));
        assert_eq!(r.listen.dns, Some("10.89.3.2:53".parse().unwrap()));
        assert_eq!(r.forwards.len(), 3);
        assert_eq!(r.forwards[2].host, "z.net");
        assert_eq!(r.forwards[2].listen, "10.89.3.2:10002".parse().unwrap());
        // Deterministic: the same input gives the same plan, whatever the entry order.
        let again = plan(
            "db.example.com:5433\nz.net:22\ndb.example.com:5432\n.example.com\napi.anthropic.com\n",
        );
        assert_eq!(p, again);
        // The router config survives the trip through TOML and validates.
        let back = RouterConfig::from_toml(&p.router.to_toml()).unwrap();
        assert_eq!(back, p.router);
        let valid = back.validate().unwrap();
        // One client, the sandbox: no per-client cap below the global one.
        assert_eq!(
            valid.limits.max_connections_per_client.get(),
            valid.limits.max_connections.get()
        );
    }

    #[test]
    fn never_127_0_0_1() {
        let p = plan("a.com\nb.com:22\n");
        assert!(p
            .relays
            .iter()
            .all(|r| r.listen.ip() != Ipv4Addr::LOCALHOST));
    }

    #[test]
    fn only_port_hosts_leave_shared_unused() {
        let p = plan("db.x.com:5432\n");
        assert_eq!(p.loopbacks.len(), 1);
        assert_eq!(p.loopbacks[0].address, FIRST_PORT_HOST_LOOPBACK);
        assert!(p.relays.iter().all(|r| r.listen.ip() != SHARED_LOOPBACK));
    }

    #[test]
    fn empty_allowlist_has_no_relays() {
        let p = plan("");
        assert!(p.relays.is_empty());
        assert!(p.router.listen.dns.is_some());
    }

    #[test]
    fn relay_syntax() {
        let r: Relay = "127.0.0.2:443=10.89.3.2:443".parse().unwrap();
        assert_eq!(r.to_string(), "127.0.0.2:443=10.89.3.2:443");
        let v6: Relay = "[::1]:80=[fd00::2]:80".parse().unwrap();
        assert_eq!(v6.to_string(), "[::1]:80=[fd00::2]:80");
        for bad in [
            "",
            "127.0.0.2:443",
            "a.com:443=1.2.3.4:443",
            "1.2.3.4:0=1.2.3.4:1",
            "1.2.3.4:1=1.2.3.4",
        ] {
            assert!(bad.parse::<Relay>().is_err(), "{bad}");
        }
        let msg = "x=1.2.3.4:1".parse::<Relay>().unwrap_err().to_string();
        assert!(msg.contains("`x`"), "{msg}");
    }
}
