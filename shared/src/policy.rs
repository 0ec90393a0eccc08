//! The policy: the one decision every listener of the router asks.
//!
//! Precedence, in the order [`Policy::decide`] applies it:
//! 1. The raw input is normalised and validated once by [`HostName::parse`]; anything that is not a
//!    valid host name (IP literals, NUL, `/`, `@`, `*`, `%`, spaces, CR/LF, non-ASCII, empty) is refused
//!    as [`Refusal::Invalid`], whatever the allowlist says.
//! 2. An exact entry (`api.anthropic.com`, or the host of a port entry) allows exactly that name.
//! 3. A subdomain entry (`.example.com`) allows its apex and every name below it, compared label by label:
//!    `badexample.com`, `example.com.evil.com` and `example.comx` do not match.
//! 4. Everything else is [`Refusal::NotListed`].
//!
//! DNS, TLS (SNI) and HTTP (Host) share this decision: a name that resolves is a name that connects. HTTP
//! Host headers may carry a `:port`, which is dropped before matching (the router always dials port 80).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::allowlist::{Allowlist, Entry};
use crate::name::{HostName, NameError};

/// The compiled allowlist: hash sets, so a decision is one lookup per label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Names allowed exactly (plain entries and the hosts of port entries).
    exact: HashSet<HostName>,
    /// Apexes of subdomain entries, as strings so a parent suffix can be looked up without allocating.
    subdomains: HashSet<String>,
    /// The host:port entries, sorted, which decide the router's extra listeners.
    ports: BTreeMap<HostName, BTreeSet<u16>>,
}

/// Why a name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The input is not a valid host name.
    #[error("not a valid host name: {0}")]
    Invalid(#[from] NameError),
    /// A valid name that no entry allows.
    #[error("{0} is not on the allowlist")]
    NotListed(HostName),
}

/// The outcome of a policy check.
pub type Decision = Result<HostName, Refusal>;

impl Policy {
    /// Compiles an allowlist.
    #[must_use]
    pub fn new(allowlist: &Allowlist) -> Policy {
        Policy::from_entries(allowlist.entries().iter().cloned())
    }

    /// Compiles entries (order does not matter; duplicates are harmless).
    #[must_use]
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> Policy {
        let mut policy = Policy::default();
        for entry in entries {
            match entry {
                Entry::Host(name) => {
                    policy.exact.insert(name);
                }
                Entry::Subdomains(name) => {
                    policy.subdomains.insert(name.as_str().to_owned());
                }
                Entry::Port(name, port) => {
                    policy.exact.insert(name.clone());
                    policy.ports.entry(name).or_default().insert(port);
                }
            }
        }
        policy
    }

    /// Decides on a raw name (a DNS question, an SNI value): normalise once, match once.
    #[must_use = "a decision that is not checked allows nothing"]
    pub fn decide(&self, raw: &str) -> Decision {
        let name = HostName::parse(raw)?;
        if self.allows(&name) {
            Ok(name)
        } else {
            Err(Refusal::NotListed(name))
        }
    }

    /// Decides on an HTTP Host header value: an optional `:port` is dropped, the name is matched.
    #[must_use = "a decision that is not checked allows nothing"]
    pub fn decide_http_host(&self, raw: &str) -> Decision {
        let name = match raw.rsplit_once(':') {
            Some((name, port))
                if !name.contains(':')
                    && !port.is_empty()
                    && port.len() <= 5
                    && port.bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            _ => raw,
        };
        self.decide(name)
    }

    /// True when an already-normalised name is allowed.
    #[must_use]
    pub fn allows(&self, name: &HostName) -> bool {
        self.exact.contains(name)
            || self.subdomains.contains(name.as_str())
            || name.parents().any(|p| self.subdomains.contains(p))
    }

    /// True when an already-normalised name is itself written in the allowlist: an exact entry, a
    /// host:port entry's host, or a subdomain entry's apex. False for a name allowed only as a name
    /// *below* a subdomain entry (or not at all): such a name's labels were chosen by the client, and
    /// resolving it upstream carries them out, which the router's wildcard lookup budget bounds.
    #[must_use]
    pub fn lists_exactly(&self, name: &HostName) -> bool {
        self.exact.contains(name) || self.subdomains.contains(name.as_str())
    }

    /// True when `name` has its own host:port entry on `port`.
    #[must_use]
    pub fn allows_port(&self, name: &HostName, port: u16) -> bool {
        self.ports.get(name).is_some_and(|p| p.contains(&port))
    }

    /// The host:port entries, sorted by host then port.
    pub fn port_entries(&self) -> impl Iterator<Item = (&HostName, u16)> {
        self.ports
            .iter()
            .flat_map(|(h, ports)| ports.iter().map(move |p| (h, *p)))
    }

    /// Hosts that have at least one port entry, sorted.
    pub fn port_hosts(&self) -> impl Iterator<Item = &HostName> {
        self.ports.keys()
    }

    /// Exact names that have no port entry, sorted.
    #[must_use]
    pub fn exact_hosts(&self) -> Vec<&HostName> {
        let mut v: Vec<&HostName> = self.exact.iter().collect();
        v.sort();
        v
    }

    /// Subdomain apexes, sorted.
    #[must_use]
    pub fn subdomain_apexes(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.subdomains.iter().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Every entry of the policy, in a stable order (used to write configurations).
    #[must_use]
    pub fn entries(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::new();
        for name in self.exact_hosts() {
            if !self.ports.contains_key(name) {
                out.push(Entry::Host(name.clone()));
            }
        }
        for apex in self.subdomain_apexes() {
            if let Ok(n) = HostName::parse(apex) {
                out.push(Entry::Subdomains(n));
            }
        }
        for (h, p) in self.port_entries() {
            out.push(Entry::Port(h.clone(), p));
        }
        out
    }

    /// True when nothing is allowed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.subdomains.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> Policy {
        let list = Allowlist::parse(
            "api.anthropic.com\n.example.com\ndb.other.net:5432\n_internal.corp\n",
            "t",
        )
        .unwrap();
        Policy::new(&list)
    }

    #[test]
    fn exact_names_and_names_below_a_wildcard() {
        let p = policy();
        let n = |s| HostName::parse(s).unwrap();
        for listed in [
            "api.anthropic.com",
            "example.com",
            "db.other.net",
            "_internal.corp",
        ] {
            assert!(p.lists_exactly(&n(listed)), "{listed}");
        }
        for below in ["www.example.com", "a.b.example.com", "evil.test"] {
            assert!(!p.lists_exactly(&n(below)), "{below}");
        }
    }

    #[test]
    fn table() {
        let p = policy();
        let allowed = [
            "api.anthropic.com",
            "API.ANTHROPIC.COM",
            "api.anthropic.com.",
            "example.com",
            "www.example.com",
            "a.b.c.d.example.com",
            "Deep.Example.Com.",
            "db.other.net",
            "_internal.corp",
        ];
        for n in allowed {
            assert!(p.decide(n).is_ok(), "{n} should be allowed");
        }
        let refused = [
            "anthropic.com",
            "x.api.anthropic.com",
            "api.anthropic.com.evil.com",
            "badexample.com",
            "example.com.evil.com",
            "example.comx",
            "xexample.com",
            "other.net",
            "x.db.other.net",
            "api.anthropic.com..",
            "",
            ".",
            "*.example.com",
            "a*.example.com",
            "www.example.com\0",
            "www.example.com\0.evil.com",
            "evil.com/.example.com",
            "evil.com@www.example.com",
            "evil%2ecom.example.com",
            "www.example.com ",
            " www.example.com",
            "www.example.com\r\nX: y",
            "127.0.0.1",
            "::1",
            "[::1]",
            "93.184.216.34",
            "www.exämple.com",
        ];
        for n in refused {
            assert!(p.decide(n).is_err(), "{n:?} should be refused");
        }
        assert!(matches!(
            p.decide("127.0.0.1"),
            Err(Refusal::Invalid(NameError::IpLiteral(_)))
        ));
        assert!(matches!(p.decide("evil.com"), Err(Refusal::NotListed(_))));
    }

    #[test]
    fn http_host_ports() {
        let p = policy();
        assert!(p.decide_http_host("www.example.com:8080").is_ok());
        assert!(p.decide_http_host("www.example.com:80").is_ok());
        assert!(p.decide_http_host("www.example.com").is_ok());
        assert!(p.decide_http_host("evil.com:80").is_err());
        assert!(p.decide_http_host("[::1]:80").is_err());
        assert!(p.decide_http_host("127.0.0.1:80").is_err());
        assert!(p.decide_http_host("www.example.com:").is_err());
        assert!(p.decide_http_host("www.example.com:80:80").is_err());
        assert!(p.decide_http_host("www.example.com:999999").is_err());
    }

    #[test]
    fn ports() {
        let p = policy();
        let db = HostName::parse("db.other.net").unwrap();
        assert!(p.allows_port(&db, 5432));
        assert!(!p.allows_port(&db, 5433));
        assert!(!p.allows_port(&HostName::parse("www.example.com").unwrap(), 5432));
        assert_eq!(p.port_entries().count(), 1);
        assert_eq!(Policy::from_entries(p.entries()), p);
    }

    #[test]
    fn empty_allows_nothing() {
        let p = Policy::default();
        assert!(p.is_empty());
        assert!(p.decide("example.com").is_err());
    }

    fn hostname_byte(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_'
    }

    proptest! {
        #[test]
        fn nothing_outside_the_alphabet_is_allowed(
            prefix in "[a-z.]{0,12}",
            bad in any::<char>().prop_filter("outside the alphabet", |c| !c.is_ascii() || !hostname_byte(*c as u8)),
            suffix in "[a-z.]{0,12}",
        ) {
            // A policy that allows as much as possible: the apexes the generator can produce.
            let p = Policy::from_entries(
                ["com", "example.com", "a", "b"].map(|n| Entry::Subdomains(HostName::parse(n).unwrap())),
            );
            for candidate in [
                format!("{prefix}{bad}{suffix}.example.com"),
                format!("{prefix}.example.com{bad}"),
                format!("{bad}{prefix}.com"),
            ] {
                // A single trailing dot is the one thing normalisation drops.
                prop_assert!(p.decide(&candidate).is_err(), "{:?} was allowed", candidate);
            }
        }

        #[test]
        fn matching_is_case_insensitive(name in "[a-z0-9]{1,10}(\\.[a-z0-9]{1,10}){0,3}\\.example\\.com", flips in any::<u64>()) {
            let p = Policy::from_entries([Entry::Subdomains(HostName::parse("example.com").unwrap())]);
            let mixed: String = name
                .chars()
                .enumerate()
                .map(|(i, c)| if flips >> (i % 64) & 1 == 1 { c.to_ascii_uppercase() } else { c })
                .collect();
            prop_assert_eq!(p.decide(&name), p.decide(&mixed));
            prop_assert!(p.decide(&mixed).is_ok());
        }

        #[test]
        fn lookalikes_never_match(label in "[a-z0-9]{1,10}") {
            let p = Policy::from_entries([Entry::Subdomains(HostName::parse("example.com").unwrap())]);
            for candidate in [
                format!("{label}example.com"),
                format!("example.com.{label}"),
                format!("example.com{label}"),
            ] {
                prop_assert!(p.decide(&candidate).is_err(), "{} was allowed", candidate);
            }
        }
    }
}
