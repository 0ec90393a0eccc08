//! The command line, parsed by hand (no clap: the binary is a whole container's root filesystem).
//! The launcher writes it (`doctor/selftest.rs`); `probe.py` appends `--netns`.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

/// The one-line synopsis, printed with every usage error.
pub const USAGE: &str = "Usage: agent-sandbox-nested-probe --netns NS [--name NAME --expect IPV4] \
                         --unlisted NAME [--tcp|--udp|--dns KIND,IP,PORT]... [--resolv-conf FILE] \
                         [--dns-port PORT] [--http-port PORT]";

/// The most targets of each kind: the doctor names this host's addresses (at most 160 of them), its
/// resolvers and the router's side of the egress network; more is a broken command line.
pub const MAX_TARGETS: usize = 256;

/// What to check. Every address the probe sends to is here or in `resolv_conf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The sandbox's network namespace (`readlink /proc/self/ns/net` there): the nested container's
    /// must be the same one.
    pub netns: String,
    /// An allowlisted name and its address in the sandbox; `None` when the allowlist is empty (the
    /// checks that need one are skipped).
    pub allowed: Option<Allowed>,
    /// A name that is not on the allowlist (NXDOMAIN from the router).
    pub unlisted: String,
    /// Addresses a TCP connection must not reach.
    pub tcp: Vec<Target>,
    /// Addresses a UDP datagram must not reach (the launcher's listener on the host counts arrivals).
    pub udp: Vec<Target>,
    /// DNS servers other than the router, which must not answer.
    pub dns: Vec<Target>,
    /// Where the nameserver is read from: podman gives a `--network host` container the sandbox's.
    pub resolv_conf: PathBuf,
    /// The nameserver's port (53; the tests' own servers listen elsewhere).
    pub dns_port: u16,
    /// The router's HTTP port behind `expect` (80; the tests' own servers listen elsewhere).
    pub http_port: u16,
}

/// An allowlisted name and the loopback address the router's DNS gives it in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// The name.
    pub name: String,
    /// Its address.
    pub expect: Ipv4Addr,
}

/// One address that must stay out of reach, and what it is (for the check's name and line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// What the address is to the doctor (`host`, `router-egress`, `upstream`, ...): `[a-z0-9-]+`.
    pub kind: String,
    /// The address.
    pub ip: IpAddr,
    /// The port.
    pub port: u16,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Run the checks.
    Run(Spec),
    /// Print [`USAGE`].
    Help,
}

/// A command line the probe cannot run; the message names the offending argument.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsageError {
    /// An option this probe does not have.
    #[error("unknown argument {0:?}")]
    Unknown(String),
    /// An option given without its value.
    #[error("{0} needs a value")]
    MissingValue(&'static str),
    /// A required option that is absent.
    #[error("{0} is required")]
    Required(&'static str),
    /// A value that does not parse.
    #[error("{option}: {value:?} is not {what}")]
    Invalid {
        /// The option.
        option: &'static str,
        /// Its value.
        value: String,
        /// What it should have been.
        what: &'static str,
    },
    /// More targets than [`MAX_TARGETS`].
    #[error("{0}: more than {MAX_TARGETS} targets")]
    TooMany(&'static str),
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Invocation, UsageError> {
    let mut netns = None;
    let mut name = None;
    let mut expect = None;
    let mut unlisted = None;
    let mut spec = Spec {
        netns: String::new(),
        allowed: None,
        unlisted: String::new(),
        tcp: Vec::new(),
        udp: Vec::new(),
        dns: Vec::new(),
        resolv_conf: PathBuf::from("/etc/resolv.conf"),
        dns_port: 53,
        http_port: 80,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| UsageError::Unknown(a.to_string_lossy().into_owned()))?;
        let option: &'static str = match arg.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            "--netns" => "--netns",
            "--name" => "--name",
            "--expect" => "--expect",
            "--unlisted" => "--unlisted",
            "--tcp" => "--tcp",
            "--udp" => "--udp",
            "--dns" => "--dns",
            "--resolv-conf" => "--resolv-conf",
            "--dns-port" => "--dns-port",
            "--http-port" => "--http-port",
            _ => return Err(UsageError::Unknown(arg)),
        };
        let value = args
            .next()
            .and_then(|v| v.into_string().ok())
            .ok_or(UsageError::MissingValue(option))?;
        let invalid = |what| UsageError::Invalid {
            option,
            value: value.clone(),
            what,
        };
        match option {
            "--netns" => netns = Some(value),
            "--name" | "--unlisted" => {
                if !is_dns_name(&value) {
                    return Err(invalid("a DNS name"));
                }
                if option == "--name" {
                    name = Some(value);
                } else {
                    unlisted = Some(value);
                }
            }
            "--expect" => expect = Some(value.parse().map_err(|_| invalid("an IPv4 address"))?),
            "--tcp" | "--udp" | "--dns" => {
                let target = parse_target(&value).ok_or_else(|| invalid("KIND,IP,PORT"))?;
                let list = match option {
                    "--tcp" => &mut spec.tcp,
                    "--udp" => &mut spec.udp,
                    _ => &mut spec.dns,
                };
                if list.len() == MAX_TARGETS {
                    return Err(UsageError::TooMany(option));
                }
                list.push(target);
            }
            "--resolv-conf" => spec.resolv_conf = PathBuf::from(value),
            _ => {
                let port = value.parse().map_err(|_| invalid("a port"))?;
                if option == "--dns-port" {
                    spec.dns_port = port;
                } else {
                    spec.http_port = port;
                }
            }
        }
    }
    spec.netns = netns.ok_or(UsageError::Required("--netns"))?;
    spec.allowed = match (name, expect) {
        (Some(name), Some(expect)) => Some(Allowed { name, expect }),
        (None, None) => None,
        // One without the other is a broken command line, not an empty allowlist.
        (Some(_), None) => return Err(UsageError::Required("--expect")),
        (None, Some(_)) => return Err(UsageError::Required("--name")),
    };
    spec.unlisted = unlisted.ok_or(UsageError::Required("--unlisted"))?;
    Ok(Invocation::Run(spec))
}

/// `KIND,IP,PORT`.
fn parse_target(value: &str) -> Option<Target> {
    let mut parts = value.split(',');
    let (kind, ip, port) = (parts.next()?, parts.next()?, parts.next()?);
    let kind_ok = !kind.is_empty()
        && kind.len() <= 32
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    (kind_ok && parts.next().is_none()).then_some(())?;
    Some(Target {
        kind: kind.to_owned(),
        ip: ip.parse().ok()?,
        port: port.parse().ok()?,
    })
}

/// A name the DNS query can carry: labels of 1 to 63 letters, digits, `-` or `_`, 253 bytes at most.
#[must_use]
pub fn is_dns_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    const BASE: &[&str] = &[
        "--netns",
        "net:[4026532]",
        "--name",
        "api.example.com",
        "--expect",
        "127.0.0.2",
        "--unlisted",
        "x.invalid",
    ];

    #[test]
    fn a_full_command_line() {
        let mut a = BASE.to_vec();
        a.extend([
            "--tcp",
            "host,10.0.0.5,41000",
            "--tcp",
            "upstream,2001:db8::1,443",
            "--udp",
            "host,10.0.0.5,41001",
            "--dns",
            "host-resolver,10.0.0.1,53",
            "--dns-port",
            "5353",
        ]);
        let Invocation::Run(spec) = parse(args(&a)).unwrap() else {
            panic!("not a run");
        };
        assert_eq!(spec.netns, "net:[4026532]");
        let allowed = spec.allowed.expect("an allowlisted name");
        assert_eq!(allowed.name, "api.example.com");
        assert_eq!(allowed.expect, Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(spec.tcp.len(), 2);
        assert_eq!(spec.tcp[1].ip, "2001:db8::1".parse::<IpAddr>().unwrap());
        assert_eq!(spec.dns[0].kind, "host-resolver");
        assert_eq!((spec.dns_port, spec.http_port), (5353, 80));
        assert_eq!(spec.resolv_conf, PathBuf::from("/etc/resolv.conf"));
        assert_eq!(parse(args(&["--help"])).unwrap(), Invocation::Help);
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        let with = |extra: &[&str]| {
            let mut a = BASE.to_vec();
            a.extend(extra);
            parse(args(&a)).unwrap_err().to_string()
        };
        assert_eq!(with(&["--frob"]), r#"unknown argument "--frob""#);
        assert_eq!(with(&["--tcp"]), "--tcp needs a value");
        assert_eq!(
            with(&["--tcp", "Host,1.2.3.4,5"]),
            r#"--tcp: "Host,1.2.3.4,5" is not KIND,IP,PORT"#
        );
        assert!(with(&["--udp", "host,1.2.3.4"]).contains("KIND,IP,PORT"));
        assert!(with(&["--dns", "host,1.2.3.4,5,6"]).contains("KIND,IP,PORT"));
        assert!(with(&["--dns", "host,example.com,53"]).contains("KIND,IP,PORT"));
        assert!(with(&["--http-port", "99999"]).contains("a port"));
        assert!(with(&["--name", "a..b"]).contains("a DNS name"));
        assert!(with(&["--unlisted", &"a".repeat(64)]).contains("a DNS name"));
        assert!(with(&["--expect", "::1"]).contains("an IPv4 address"));
        assert_eq!(
            parse(args(&BASE[2..])).unwrap_err(),
            UsageError::Required("--netns")
        );
        // An empty allowlist: neither --name nor --expect. One without the other is an error.
        let none: Vec<&str> = [&BASE[..2], &BASE[6..]].concat();
        let Invocation::Run(spec) = parse(args(&none)).unwrap() else {
            panic!("not a run");
        };
        assert_eq!(spec.allowed, None);
        let no_expect: Vec<&str> = [&BASE[..4], &BASE[6..]].concat();
        assert_eq!(
            parse(args(&no_expect)).unwrap_err(),
            UsageError::Required("--expect")
        );
        let no_name: Vec<&str> = [&BASE[..2], &BASE[4..]].concat();
        assert_eq!(
            parse(args(&no_name)).unwrap_err(),
            UsageError::Required("--name")
        );
        let mut many = BASE.to_vec();
        for _ in 0..=MAX_TARGETS {
            many.extend(["--tcp", "host,10.0.0.5,1"]);
        }
        assert_eq!(
            parse(args(&many)).unwrap_err(),
            UsageError::TooMany("--tcp")
        );
    }

    #[test]
    fn dns_names() {
        for ok in ["a", "web.test", "web.test.", "_dmarc.x-y.example", "A1.b"] {
            assert!(is_dns_name(ok), "{ok}");
        }
        let long = ["a"; 128].join(".");
        for bad in ["", ".", "a..b", ".a", "a b", "a/b", "é.test", &long, "a\0b"] {
            assert!(!is_dns_name(bad), "{bad}");
        }
        assert!(!is_dns_name(&format!("{}.x", "a".repeat(64))));
    }
}
