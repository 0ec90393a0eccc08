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
//!
//! A running session's allowlist can change ([`SessionPlan::extend`]): addresses and router ports
//! already handed out stay as they are ([`PlanState`]), new hosts and entries take the next free ones.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

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

/// What a session has handed out so far: the loopback address of every host that ever had a port
/// entry, the router port of every host:port entry, and whether the shared address was ever in use,
/// all kept when entries are removed. A live allowlist change ([`SessionPlan::extend`]) starts from
/// it, so an address or port the sandbox has already seen never changes meaning: processes inside
/// keep cached DNS answers and open relays.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanState {
    /// Loopback address per port-entry host (by name).
    #[serde(default)]
    pub hosts: BTreeMap<String, Ipv4Addr>,
    /// Router port per host:port entry, keyed `host:port`.
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    /// True once the shared address ([`SHARED_LOOPBACK`]) has been handed out: its relays stay for
    /// the rest of the session, whatever the policy comes to allow. A state file written before this
    /// field existed does not say, and is read as `true`: it may have (two idle relays at most).
    #[serde(default = "unknown_means_handed_out")]
    pub shared: bool,
}

/// [`PlanState::shared`] for a state file that does not say.
fn unknown_means_handed_out() -> bool {
    true
}

impl PlanState {
    /// The state as JSON, for the session directory.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a map of strings to addresses serializes")
    }

    /// Reads [`PlanState::to_json`]'s output.
    pub fn from_json(text: &str) -> Result<PlanState, serde_json::Error> {
        serde_json::from_str(text)
    }
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
    /// Every address and router port handed out so far, this plan's included.
    pub state: PlanState,
}

impl SessionPlan {
    /// Computes the plan for a policy and the router's session-network address.
    pub fn new(policy: &Policy, router_ip: Ipv4Addr) -> Result<SessionPlan, PlanError> {
        SessionPlan::extend(policy, router_ip, &PlanState::default())
    }

    /// The plan for a new policy in a running session: every host and host:port entry that `previous`
    /// knows keeps its address and router port; new ones get the next free ones (sorted by name, so
    /// the result is deterministic), never one handed out before, even to a host since removed.
    ///
    /// An address once handed out keeps working for as long as the session runs: a host that had its
    /// own address keeps it (and its relays on 80 and 443) when its last port entry goes, for as long
    /// as the policy allows the name at all; the shared address keeps its relays once it has been in
    /// use. A name answered with the shared address that gains a port entry is answered with its own
    /// address from then on, and the shared one still serves it on 80 and 443 (the router decides by
    /// the name the client sends, not the address it came to).
    pub fn extend(
        policy: &Policy,
        router_ip: Ipv4Addr,
        previous: &PlanState,
    ) -> Result<SessionPlan, PlanError> {
        let entries: Vec<(&HostName, u16)> = policy.port_entries().collect();
        let port_hosts: Vec<&HostName> = policy.port_hosts().collect();
        let mut state = previous.clone();

        // 127.0.0.3 ..= 127.255.255.254
        let last_address = u32::from(Ipv4Addr::new(127, 255, 255, 254));
        let mut next_address = state
            .hosts
            .values()
            .map(|a| u32::from(*a) + 1)
            .max()
            .unwrap_or(u32::from(FIRST_PORT_HOST_LOOPBACK))
            .max(u32::from(FIRST_PORT_HOST_LOOPBACK));
        let new_hosts = port_hosts
            .iter()
            .filter(|h| !state.hosts.contains_key(h.as_str()))
            .count();
        if u64::from(next_address) + new_hosts as u64 > u64::from(last_address) + 1 {
            return Err(PlanError::TooManyPortHosts(state.hosts.len() + new_hosts));
        }
        for host in &port_hosts {
            if !state.hosts.contains_key(host.as_str()) {
                state
                    .hosts
                    .insert(host.to_string(), Ipv4Addr::from(next_address));
                next_address += 1;
            }
        }
        let mut next_port = state
            .ports
            .values()
            .map(|p| u32::from(*p) + 1)
            .max()
            .unwrap_or(u32::from(FORWARD_PORT_BASE));
        let new_entries = entries
            .iter()
            .filter(|(h, p)| !state.ports.contains_key(&format!("{h}:{p}")))
            .count();
        if next_port as usize + new_entries > u16::MAX as usize + 1 {
            return Err(PlanError::TooManyPortEntries(
                state.ports.len() + new_entries,
            ));
        }
        for (host, port) in &entries {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                state.ports.entry(format!("{host}:{port}"))
            {
                slot.insert(next_port as u16);
                next_port += 1;
            }
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
        state.shared |= !policy.subdomain_apexes().is_empty()
            || policy.exact_hosts().iter().any(|h| !port_hosts.contains(h));
        if state.shared {
            loopbacks.push(LoopbackAssignment {
                address: SHARED_LOOPBACK,
                names: "*".to_owned(),
            });
            web_relays(&mut relays, SHARED_LOOPBACK);
        }

        // Every host that ever had its own address keeps its relays on 80 and 443 (the router refuses
        // what the policy no longer allows, and logs it, so `blocked` shows it), and is answered with
        // that address while the policy allows the name.
        for (host, &address) in &state.hosts {
            web_relays(&mut relays, address);
            if HostName::parse(host).is_ok_and(|name| policy.allows(&name)) {
                router.answers.hosts.insert(host.clone(), address);
                loopbacks.push(LoopbackAssignment {
                    address,
                    names: host.clone(),
                });
            }
        }
        for (host, port) in &entries {
            let router_port = state.ports[&format!("{host}:{port}")];
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
            state,
        })
    }

    /// The forwarder's command-line arguments.
    #[must_use]
    pub fn forwarder_args(&self) -> Vec<String> {
        self.relays.iter().map(Relay::to_string).collect()
    }

    /// The forwarder's relays file (`--relays FILE`): one `LISTEN=TARGET` per line.
    #[must_use]
    pub fn relays_file(&self) -> String {
        self.relays.iter().map(|r| format!("{r}\n")).collect()
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
        // Every listener on the session network's address only: the router is also on the shared
        // egress network, where nothing may reach its listeners.
        assert_eq!(r.listen.dns, Some("10.89.3.2:53".parse().unwrap()));
        assert_eq!(r.listen.http, Some("10.89.3.2:80".parse().unwrap()));
        assert_eq!(r.listen.https, Some("10.89.3.2:443".parse().unwrap()));
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

    fn policy(text: &str) -> Policy {
        Policy::new(&Allowlist::parse(text, "t").unwrap())
    }

    const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 89, 3, 2);

    /// Host addresses, and (host, port, router port) per entry.
    type HandedOut = (Vec<(String, Ipv4Addr)>, Vec<(String, u16, u16)>);

    /// The address each port host resolves to and the router port of each entry.
    fn handed_out(p: &SessionPlan) -> HandedOut {
        let hosts = p
            .router
            .answers
            .hosts
            .iter()
            .map(|(h, a)| (h.clone(), *a))
            .collect();
        let ports = p
            .router
            .forwards
            .iter()
            .map(|f| (f.host.clone(), f.port, f.listen.port()))
            .collect();
        (hosts, ports)
    }

    #[test]
    fn extending_keeps_every_address_and_port_handed_out() {
        let first = SessionPlan::new(&policy("m.com:22\nz.com:5432\n"), ROUTER).unwrap();
        // (new policy, expected host addresses, expected (host, port, router port))
        type Case = (
            &'static str,
            &'static [(&'static str, [u8; 4])],
            &'static [(&'static str, u16, u16)],
        );
        let cases: &[Case] = &[
            // A host sorting before both gets the next free address, not 127.0.0.3.
            (
                "a.com:1\nm.com:22\nz.com:5432\n",
                &[
                    ("a.com", [127, 0, 0, 5]),
                    ("m.com", [127, 0, 0, 3]),
                    ("z.com", [127, 0, 0, 4]),
                ],
                &[
                    ("a.com", 1, 10002),
                    ("m.com", 22, 10000),
                    ("z.com", 5432, 10001),
                ],
            ),
            // A removed host's address and port are not given to anyone else.
            (
                "b.com:2\nz.com:5432\n",
                &[("b.com", [127, 0, 0, 5]), ("z.com", [127, 0, 0, 4])],
                &[("b.com", 2, 10002), ("z.com", 5432, 10001)],
            ),
            // A second port on a known host: same address, next router port.
            (
                "m.com:22\nm.com:23\nz.com:5432\n",
                &[("m.com", [127, 0, 0, 3]), ("z.com", [127, 0, 0, 4])],
                &[
                    ("m.com", 22, 10000),
                    ("m.com", 23, 10002),
                    ("z.com", 5432, 10001),
                ],
            ),
            // Plain names only: no port host, the shared address comes into use.
            ("x.com\n", &[], &[]),
        ];
        for (text, hosts, ports) in cases {
            let next = SessionPlan::extend(&policy(text), ROUTER, &first.state).unwrap();
            let (got_hosts, got_ports) = handed_out(&next);
            let want_hosts: Vec<(String, Ipv4Addr)> = hosts
                .iter()
                .map(|(h, a)| ((*h).to_owned(), Ipv4Addr::from(*a)))
                .collect();
            let want_ports: Vec<(String, u16, u16)> = ports
                .iter()
                .map(|(h, p, r)| ((*h).to_owned(), *p, *r))
                .collect();
            assert_eq!(got_hosts, want_hosts, "{text}");
            assert_eq!(got_ports, want_ports, "{text}");
            // The state remembers everything, removed hosts included.
            for (h, addr) in &first.state.hosts {
                assert_eq!(next.state.hosts[h], *addr, "{text}");
            }
            assert_eq!(
                RouterConfig::from_toml(&next.router.to_toml()).unwrap(),
                next.router
            );
        }
        // Removing, then adding back: the old address and port come back.
        let removed = SessionPlan::extend(&policy("z.com:5432\n"), ROUTER, &first.state).unwrap();
        let back =
            SessionPlan::extend(&policy("m.com:22\nz.com:5432\n"), ROUTER, &removed.state).unwrap();
        assert_eq!(back.relays, first.relays);
        assert_eq!(back.router, first.router);
        // The state survives its JSON round trip, and a fresh plan equals one extended from nothing.
        assert_eq!(
            PlanState::from_json(&back.state.to_json()).unwrap(),
            back.state
        );
        assert!(PlanState::from_json("{\"hosts\":{},\"extra\":1}").is_err());
        assert_eq!(
            SessionPlan::extend(&policy("m.com:22\n"), ROUTER, &PlanState::default()).unwrap(),
            SessionPlan::new(&policy("m.com:22\n"), ROUTER).unwrap()
        );
    }

    /// The relays listening on `address`, by port.
    fn relay_ports(p: &SessionPlan, address: [u8; 4]) -> Vec<u16> {
        p.relays
            .iter()
            .filter(|r| r.listen.ip() == std::net::IpAddr::from(address))
            .map(|r| r.listen.port())
            .collect()
    }

    #[test]
    fn an_address_handed_out_keeps_working_while_its_name_is_allowed() {
        // `blocked.test` is answered with the shared address, `db.test` with its own.
        let first = SessionPlan::new(&policy("blocked.test\ndb.test:5432\n"), ROUTER).unwrap();
        assert_eq!(relay_ports(&first, [127, 0, 0, 2]), [80, 443]);
        assert_eq!(relay_ports(&first, [127, 0, 0, 3]), [80, 443, 5432]);

        // `blocked.test` gains a port entry: its own address from now on, and the shared address,
        // which the sandbox may have cached for it, keeps its relays although no name needs it now.
        let gained = SessionPlan::extend(
            &policy("blocked.test\nblocked.test:5432\ndb.test:5432\n"),
            ROUTER,
            &first.state,
        )
        .unwrap();
        assert_eq!(
            gained.router.answers.hosts["blocked.test"],
            Ipv4Addr::new(127, 0, 0, 4)
        );
        assert_eq!(relay_ports(&gained, [127, 0, 0, 2]), [80, 443]);
        assert_eq!(relay_ports(&gained, [127, 0, 0, 4]), [80, 443, 5432]);

        // The port entry goes, the name stays: it keeps its own address and its relays on 80 and 443.
        let lost = SessionPlan::extend(
            &policy("blocked.test\ndb.test:5432\n"),
            ROUTER,
            &gained.state,
        )
        .unwrap();
        assert_eq!(
            lost.router.answers.hosts["blocked.test"],
            Ipv4Addr::new(127, 0, 0, 4)
        );
        assert_eq!(relay_ports(&lost, [127, 0, 0, 4]), [80, 443]);
        assert_eq!(relay_ports(&lost, [127, 0, 0, 2]), [80, 443]);
        assert!(lost
            .loopbacks
            .iter()
            .any(|l| l.names == "blocked.test" && l.address == Ipv4Addr::new(127, 0, 0, 4)));

        // A wildcard that still allows the name is enough to keep its answer.
        let wildcard = SessionPlan::extend(&policy(".test\n"), ROUTER, &lost.state).unwrap();
        assert_eq!(
            wildcard.router.answers.hosts["blocked.test"],
            Ipv4Addr::new(127, 0, 0, 4)
        );
        assert_eq!(
            wildcard.router.answers.hosts["db.test"],
            Ipv4Addr::new(127, 0, 0, 3)
        );

        // A name no longer allowed at all gets no answer (the router refuses it), but the relays stay,
        // so a cached address reaches the router and its refusal is logged.
        let gone = SessionPlan::extend(&policy("other.test\n"), ROUTER, &lost.state).unwrap();
        assert!(gone.router.answers.hosts.is_empty());
        assert!(gone.loopbacks.iter().all(|l| l.names != "blocked.test"));
        assert_eq!(relay_ports(&gone, [127, 0, 0, 3]), [80, 443]);
        assert_eq!(relay_ports(&gone, [127, 0, 0, 4]), [80, 443]);
        assert!(gone.router.clone().validate().is_ok());

        // A state file written before `shared` existed still reads, as having handed it out (reviewer
        // F: read as false, a session started before the upgrade lost the shared relays as before).
        let old = PlanState::from_json(
            "{\"hosts\":{\"db.test\":\"127.0.0.3\"},\"ports\":{\"db.test:5432\":10000}}",
        )
        .unwrap();
        assert!(old.shared);
        let upgraded = SessionPlan::extend(
            &policy("blocked.test\nblocked.test:5432\ndb.test:5432\n"),
            ROUTER,
            &old,
        )
        .unwrap();
        assert_eq!(relay_ports(&upgraded, [127, 0, 0, 2]), [80, 443]);
        assert!(!PlanState::default().shared);
    }

    #[test]
    fn extending_past_the_ranges_is_an_error() {
        let mut full = PlanState::default();
        full.hosts
            .insert("last.com".into(), Ipv4Addr::new(127, 255, 255, 254));
        let err = SessionPlan::extend(&policy("new.com:22\n"), ROUTER, &full).unwrap_err();
        assert!(matches!(err, PlanError::TooManyPortHosts(2)), "{err}");
        let mut ports = PlanState::default();
        ports.ports.insert("last.com:1".into(), u16::MAX);
        let err = SessionPlan::extend(&policy("new.com:22\n"), ROUTER, &ports).unwrap_err();
        assert!(matches!(err, PlanError::TooManyPortEntries(2)), "{err}");
    }

    #[test]
    fn relays_file_lists_one_relay_per_line() {
        let p = plan("a.com\n");
        assert_eq!(
            p.relays_file(),
            "127.0.0.2:80=10.89.3.2:80\n127.0.0.2:443=10.89.3.2:443\n"
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
