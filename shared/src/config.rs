//! The router's configuration file: what the launcher writes for a session and `agent-sandbox-router
//! --config FILE` reads.
//!
//! It is parsed with `deny_unknown_fields` (a typo is an error, not a silently ignored setting), then
//! validated into a [`Policy`] and a list of listeners by [`RouterConfig::validate`]. The standalone
//! gateway builds the same type from its command-line flags, so both modes run one code path.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::allowlist::Entry;
use crate::inject::{InjectConfig, ValidInject};
use crate::name::HostName;
use crate::policy::Policy;

/// Default seconds a client may take to send its ClientHello or request head.
pub const DEFAULT_PEEK_TIMEOUT_SECS: u64 = 10;
/// Default seconds allowed for resolving and connecting to an upstream.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 10;
/// Default cap on concurrently handled connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default seconds a relay (or a kept-alive HTTP connection between requests) may go with no byte in
/// either direction before it is closed.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 3600;
/// The longest idle timeout accepted: a day.
pub const MAX_IDLE_TIMEOUT_SECS: u64 = 86_400;
/// Default names under wildcard entries each client may have resolved per minute.
pub const DEFAULT_WILDCARD_LOOKUPS_PER_MINUTE: u32 = 120;
/// The most wildcard lookups per client per minute that may be configured.
pub const MAX_WILDCARD_LOOKUPS_PER_MINUTE: u32 = 1_000_000;
/// Default TTL of DNS answers: short, so an allowlist change is seen quickly by long-lived clients.
pub const DEFAULT_ANSWER_TTL: u32 = 10;

/// The longest timeout accepted: an hour is already far beyond any handshake or connect.
pub const MAX_TIMEOUT_SECS: u64 = 3600;
/// The most connections the router may be told to handle at once.
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// The longest TTL answered: a day (a short TTL is what lets a changed allowlist take effect).
pub const MAX_ANSWER_TTL: u32 = 86_400;

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// The router's whole configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Where the router listens for DNS (UDP and TCP), HTTP and TLS. A missing listener is not started.
    pub listen: ListenConfig,
    /// Names allowed exactly, on ports 80 and 443 (the `api.anthropic.com` entries).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Apexes allowed with all their subdomains (the `.example.com` entries, written without the dot).
    #[serde(default)]
    pub subdomains: Vec<String>,
    /// The host:port entries, each with its own listener; their hosts are also allowed on 80 and 443.
    #[serde(default)]
    pub forwards: Vec<ForwardConfig>,
    /// What DNS answers for allowed names.
    pub answers: AnswerConfig,
    /// Upstream DNS servers used to resolve allowed names when a connection needs them. Empty means the
    /// router's own /etc/resolv.conf and /etc/hosts.
    #[serde(default)]
    pub resolvers: Vec<SocketAddr>,
    /// Seconds a client may take to send its ClientHello or HTTP request head before it is closed.
    #[serde(default = "default_peek_timeout")]
    pub peek_timeout_secs: u64,
    /// Seconds allowed to resolve an upstream name and connect to it.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// Cap on connections handled at once across all listeners; more wait in the kernel's backlog.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Cap on connections one client (source address) holds at once. Absent: a quarter of
    /// `max_connections`, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_client: Option<usize>,
    /// Seconds a relay, or a kept-alive HTTP connection waiting for its next request, may go with no
    /// byte in either direction before it is closed.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_secs: u64,
    /// Names under wildcard (subdomain) entries that one client may have resolved per minute, counting
    /// only lookups the router's resolver cache cannot answer.
    #[serde(default = "default_wildcard_lookups")]
    pub wildcard_lookups_per_minute: u32,
    /// The allowlist file as the refusals clients see should name it: the launcher writes the user's
    /// real path, the standalone router the `--allowlist` file. Absent: the refusals name no file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowlist: Option<String>,
    /// Hosts whose TLS the router terminates to add a credential, and where the secrets are. Absent:
    /// every SNI is spliced end to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject: Option<InjectConfig>,
}

/// Listener addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// DNS over UDP and TCP.
    pub dns: Option<SocketAddr>,
    /// Plain HTTP, routed by the Host header.
    pub http: Option<SocketAddr>,
    /// TLS, routed by the ClientHello's SNI.
    pub https: Option<SocketAddr>,
}

/// One host:port entry and where the router listens for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardConfig {
    /// The one host this listener connects to.
    pub host: String,
    /// The port on that host.
    pub port: u16,
    /// The router's listener for this entry.
    pub listen: SocketAddr,
}

/// DNS answers for allowed names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerConfig {
    /// The A record for every allowed name without a more specific answer.
    pub default: Ipv4Addr,
    /// Per-name A records (in a session: each host with a port entry has its own loopback address, so
    /// its forwarder relay can tell the ports apart).
    #[serde(default)]
    pub hosts: BTreeMap<String, Ipv4Addr>,
    /// TTL of the answers, in seconds.
    #[serde(default = "default_ttl")]
    pub ttl: u32,
}

fn default_peek_timeout() -> u64 {
    DEFAULT_PEEK_TIMEOUT_SECS
}
fn default_connect_timeout() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_SECS
}
fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}
fn default_idle_timeout() -> u64 {
    DEFAULT_IDLE_TIMEOUT_SECS
}
fn default_wildcard_lookups() -> u32 {
    DEFAULT_WILDCARD_LOOKUPS_PER_MINUTE
}
fn default_ttl() -> u32 {
    DEFAULT_ANSWER_TTL
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read router configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The path leads to a FIFO, a device or a directory, which is never read (it could block forever).
    #[error("router configuration {path} is not a regular file (a FIFO, device or directory); give the path of a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The TOML does not parse or has unknown fields.
    #[error("router configuration {path} is not valid: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The content parses but does not make sense; every problem is listed.
    #[error("router configuration is not valid:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
    /// [`ConfigError::Invalid`] for a configuration read from a file ([`ConfigError::in_file`]):
    /// each problem as `FILE:LINE: problem`, or `FILE: problem` where no one line holds it (a value
    /// that came from a flag, a default, or several lines).
    #[error("router configuration {path} is not valid:\n  {}", .problems.join("\n  "))]
    InvalidFile {
        /// The file.
        path: PathBuf,
        /// Every problem, each with its file and line.
        problems: Vec<String>,
    },
}

impl ConfigError {
    /// Names the configuration file `path` (whose text is `text`) in an [`ConfigError::Invalid`]'s
    /// problems, each with the line of `text` that holds what it names where exactly one does: the
    /// value in backquotes as a TOML string (`hosts entry `x``), or the key a bound applies to, by its
    /// dotted path (`max_connections is 0`, `answers.ttl is 0`). `from_flags`: the keys the command
    /// line set, whose problems are not the file's. Other errors are returned unchanged (they name
    /// their file already). The text is indexed once, so any number of problems costs one pass.
    #[must_use]
    pub fn in_file(self, path: &Path, text: &str, from_flags: &[&str]) -> ConfigError {
        let ConfigError::Invalid(problems) = self else {
            return self;
        };
        let index = LineIndex::new(text);
        let problems = problems
            .into_iter()
            .map(|problem| match index.problem_line(&problem, from_flags) {
                Some(line) => format!("{}:{line}: {problem}", path.display()),
                None => format!("{}: {problem}", path.display()),
            })
            .collect();
        ConfigError::InvalidFile {
            path: path.to_owned(),
            problems,
        }
    }
}

/// Where the string values and the keys of a TOML text are, to name the line a problem is about.
#[derive(Debug, Default)]
struct LineIndex<'a> {
    /// Every quoted string's content (as written): the first line it is on and how often it occurs.
    strings: HashMap<&'a str, (usize, usize)>,
    /// Every bare `key =` by its dotted path, its `[table]` included: first line and count.
    keys: HashMap<String, (usize, usize)>,
}

impl<'a> LineIndex<'a> {
    /// Indexes `text` in one pass (basic strings only; a `#` outside a string starts a comment).
    fn new(text: &'a str) -> LineIndex<'a> {
        let mut index = LineIndex::default();
        let mut table = String::new();
        fn note<K: std::hash::Hash + Eq>(
            map: &mut HashMap<K, (usize, usize)>,
            key: K,
            line: usize,
        ) {
            map.entry(key)
                .and_modify(|(_, n)| *n += 1)
                .or_insert((line, 1));
        }
        for (i, line) in text.lines().enumerate() {
            let number = i + 1;
            let mut code_end = line.len();
            let mut open: Option<usize> = None;
            let mut escaped = false;
            for (at, c) in line.char_indices() {
                match (open, c) {
                    (Some(_), '\\') if !escaped => {
                        escaped = true;
                        continue;
                    }
                    (Some(from), '"') if !escaped => {
                        note(&mut index.strings, &line[from..at], number);
                        open = None;
                    }
                    (None, '"') => open = Some(at + 1),
                    (None, '#') => {
                        code_end = at;
                        break;
                    }
                    _ => {}
                }
                escaped = false;
            }
            let code = line[..code_end].trim();
            if let Some(header) = code.strip_prefix('[') {
                table = header
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .trim()
                    .to_owned();
            } else if let Some((key, _)) = code.split_once('=') {
                let key = key.trim();
                if !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                {
                    let path = if table.is_empty() {
                        key.to_owned()
                    } else {
                        format!("{table}.{key}")
                    };
                    note(&mut index.keys, path, number);
                }
            }
        }
        index
    }

    /// The line `problem` is about, when exactly one line can be.
    fn problem_line(&self, problem: &str, from_flags: &[&str]) -> Option<usize> {
        let unique = |found: Option<&(usize, usize)>| match found {
            Some(&(line, 1)) => Some(line),
            _ => None,
        };
        if let Some((what, rest)) = problem.split_once(" `") {
            let value = rest.split_once('`')?.0;
            // A subdomains entry's problem names the apex; the file may have it with its dot.
            if what.ends_with("subdomains entry") {
                if let Some(line) = unique(self.strings.get(format!(".{value}").as_str())) {
                    return Some(line);
                }
            }
            return unique(self.strings.get(value));
        }
        let (key, _) = problem.split_once(" is ")?;
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || matches!(c, '_' | '.'))
            || from_flags.contains(&key)
        {
            return None;
        }
        unique(self.keys.get(key))
    }
}

/// A validated configuration, typed for the router's run time: nothing downstream reads the TOML numbers.
#[derive(Clone, Debug)]
pub struct ValidConfig {
    /// What a live reload replaces as one piece: the policy and the DNS answers.
    pub rules: Rules,
    /// The DNS, HTTP and TLS listener addresses.
    pub listen: ListenConfig,
    /// Forward entries with their normalised host and their listen address.
    pub forwards: Vec<(HostName, u16, SocketAddr)>,
    /// Upstream DNS servers; empty means the system's /etc/resolv.conf and /etc/hosts.
    pub resolvers: Vec<SocketAddr>,
    /// Timeouts and the connection cap, checked against their bounds.
    pub limits: Limits,
    /// The allowlist as refusals name it (see [`RouterConfig::allowlist`]).
    pub allowlist: Option<String>,
    /// Credential injection, checked; `None`: nothing is terminated.
    pub inject: Option<ValidInject>,
}

/// The parts of the configuration that decide each DNS query and each connection.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The policy compiled from hosts, subdomains and forwards.
    pub policy: Policy,
    /// What DNS answers for allowed names.
    pub answers: Answers,
}

/// DNS answers for allowed names, normalised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answers {
    /// The A record for every allowed name without a per-name answer.
    pub default: Ipv4Addr,
    /// Per-name A records.
    pub hosts: BTreeMap<HostName, Ipv4Addr>,
    /// TTL of the answers, in seconds (1 to [`MAX_ANSWER_TTL`]).
    pub ttl: NonZeroU32,
}

impl Answers {
    /// The address an allowed name resolves to.
    #[must_use]
    pub fn for_name(&self, name: &HostName) -> Ipv4Addr {
        self.hosts.get(name).copied().unwrap_or(self.default)
    }
}

/// Timeouts and caps, within their bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send its ClientHello or request head (1 s to an hour).
    pub peek_timeout: Duration,
    /// How long resolving and connecting to an upstream may take (1 s to an hour).
    pub connect_timeout: Duration,
    /// Connections handled at once across all listeners (1 to [`MAX_CONNECTIONS`]).
    pub max_connections: NonZeroUsize,
    /// Connections one client (source address) holds at once (1 to `max_connections`).
    pub max_connections_per_client: NonZeroUsize,
    /// No byte in either direction for this long closes a relay or an idle kept-alive connection.
    pub idle_timeout: Duration,
    /// Wildcard-entry names each client may have resolved (cache misses) per minute.
    pub wildcard_lookups_per_minute: NonZeroU32,
}

impl RouterConfig {
    /// Reads a TOML configuration file.
    pub fn load(path: &Path) -> Result<RouterConfig, ConfigError> {
        RouterConfig::parse_file(path, &RouterConfig::read(path)?)
    }

    /// Reads the configuration file at `path` without parsing it: a regular file (a FIFO or device is
    /// refused, never waited on) of at most [`MAX_CONFIG_BYTES`]. Blocking: one bounded read.
    pub fn read(path: &Path) -> Result<Vec<u8>, ConfigError> {
        let bytes = crate::file::read_capped(path, MAX_CONFIG_BYTES).map_err(|e| match e {
            crate::file::ReadError::Io(source) => ConfigError::Read {
                path: path.to_owned(),
                source,
            },
            crate::file::ReadError::NotAFile => ConfigError::NotAFile {
                path: path.to_owned(),
            },
        })?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::Syntax {
                path: path.to_owned(),
                message: format!("larger than {MAX_CONFIG_BYTES} bytes"),
            });
        }
        Ok(bytes)
    }

    /// Parses the content [`RouterConfig::read`] read from `path`.
    pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<RouterConfig, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?;
        RouterConfig::from_toml(text).map_err(|message| ConfigError::Syntax {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML text; the error is the parser's message (with line and column).
    pub fn from_toml(text: &str) -> Result<RouterConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Serialises to TOML.
    #[must_use]
    pub fn to_toml(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot serialise: {e}\n"))
    }

    /// A configuration with the given policy and answers, no listeners and default limits.
    #[must_use]
    pub fn from_policy(policy: &Policy, default_answer: Ipv4Addr) -> RouterConfig {
        let mut config = RouterConfig {
            listen: ListenConfig::default(),
            hosts: Vec::new(),
            subdomains: Vec::new(),
            forwards: Vec::new(),
            answers: AnswerConfig {
                default: default_answer,
                hosts: BTreeMap::new(),
                ttl: DEFAULT_ANSWER_TTL,
            },
            resolvers: Vec::new(),
            peek_timeout_secs: DEFAULT_PEEK_TIMEOUT_SECS,
            connect_timeout_secs: DEFAULT_CONNECT_TIMEOUT_SECS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: None,
            idle_timeout_secs: DEFAULT_IDLE_TIMEOUT_SECS,
            wildcard_lookups_per_minute: DEFAULT_WILDCARD_LOOKUPS_PER_MINUTE,
            allowlist: None,
            inject: None,
        };
        for entry in policy.entries() {
            match entry {
                Entry::Host(n) => config.hosts.push(n.to_string()),
                Entry::Subdomains(n) => config.subdomains.push(n.to_string()),
                // Forwards need a listen address, which the caller decides.
                Entry::Port(..) => {}
            }
        }
        config
    }

    /// Checks every name, answer and listener; collects every problem.
    pub fn validate(&self) -> Result<ValidConfig, ConfigError> {
        let mut problems = Vec::new();
        let mut entries = Vec::new();
        let name = |problems: &mut Vec<String>, what: &str, raw: &str| match HostName::parse(raw) {
            Ok(n) => Some(n),
            Err(e) => {
                problems.push(format!("{what} `{}`: {e}", raw.escape_debug()));
                None
            }
        };
        for h in &self.hosts {
            if let Some(n) = name(&mut problems, "hosts entry", h) {
                entries.push(Entry::Host(n));
            }
        }
        for s in &self.subdomains {
            let apex = s.strip_prefix('.').unwrap_or(s);
            if let Some(n) = name(&mut problems, "subdomains entry", apex) {
                entries.push(Entry::Subdomains(n));
            }
        }
        let mut forwards = Vec::new();
        for f in &self.forwards {
            if let Some(n) = name(&mut problems, "forwards entry", &f.host) {
                if f.port == 0 {
                    problems.push(format!("forwards entry `{}`: port 0", f.host));
                }
                entries.push(Entry::Port(n.clone(), f.port));
                forwards.push((n, f.port, f.listen));
            }
        }
        let mut host_answers = BTreeMap::new();
        for (h, addr) in &self.answers.hosts {
            if let Some(n) = name(&mut problems, "answers.hosts entry", h) {
                host_answers.insert(n, *addr);
            }
        }
        for (what, value, max) in [
            (
                "peek_timeout_secs",
                self.peek_timeout_secs,
                MAX_TIMEOUT_SECS,
            ),
            (
                "connect_timeout_secs",
                self.connect_timeout_secs,
                MAX_TIMEOUT_SECS,
            ),
            (
                "max_connections",
                self.max_connections as u64,
                MAX_CONNECTIONS as u64,
            ),
            (
                "max_connections_per_client",
                self.per_client() as u64,
                self.max_connections.max(1) as u64,
            ),
            (
                "idle_timeout_secs",
                self.idle_timeout_secs,
                MAX_IDLE_TIMEOUT_SECS,
            ),
            (
                "wildcard_lookups_per_minute",
                u64::from(self.wildcard_lookups_per_minute),
                u64::from(MAX_WILDCARD_LOOKUPS_PER_MINUTE),
            ),
            (
                "answers.ttl",
                u64::from(self.answers.ttl),
                u64::from(MAX_ANSWER_TTL),
            ),
        ] {
            if value == 0 || value > max {
                problems.push(format!("{what} is {value}; it must be between 1 and {max}"));
            }
        }
        problems.extend(listener_conflicts(self));
        let ttl = NonZeroU32::new(self.answers.ttl);
        let max_connections = NonZeroUsize::new(self.max_connections);
        let per_client = NonZeroUsize::new(self.per_client());
        let wildcard = NonZeroU32::new(self.wildcard_lookups_per_minute);
        let policy = Policy::from_entries(entries);
        let inject = self.inject.as_ref().and_then(|i| i.validate(&mut problems));
        let (Some(ttl), Some(max_connections), Some(per_client), Some(wildcard), true) = (
            ttl,
            max_connections,
            per_client,
            wildcard,
            problems.is_empty(),
        ) else {
            return Err(ConfigError::Invalid(problems));
        };
        Ok(ValidConfig {
            rules: Rules {
                policy,
                answers: Answers {
                    default: self.answers.default,
                    hosts: host_answers,
                    ttl,
                },
            },
            listen: self.listen.clone(),
            forwards,
            resolvers: self.resolvers.clone(),
            limits: Limits {
                peek_timeout: Duration::from_secs(self.peek_timeout_secs),
                connect_timeout: Duration::from_secs(self.connect_timeout_secs),
                max_connections,
                max_connections_per_client: per_client,
                idle_timeout: Duration::from_secs(self.idle_timeout_secs),
                wildcard_lookups_per_minute: wildcard,
            },
            allowlist: self.allowlist.clone(),
            inject,
        })
    }
}

impl RouterConfig {
    /// The per-client cap as configured, or its default: a quarter of `max_connections`, at least 1.
    fn per_client(&self) -> usize {
        self.max_connections_per_client
            .unwrap_or((self.max_connections / 4).max(1))
    }
}

/// Two TCP listeners on one address cannot both bind; say which.
fn listener_conflicts(config: &RouterConfig) -> Vec<String> {
    let mut tcp: Vec<(String, SocketAddr)> = Vec::new();
    if let Some(a) = config.listen.dns {
        tcp.push(("dns".into(), a));
    }
    if let Some(a) = config.listen.http {
        tcp.push(("http".into(), a));
    }
    if let Some(a) = config.listen.https {
        tcp.push(("https".into(), a));
    }
    for f in &config.forwards {
        tcp.push((format!("forward {}:{}", f.host, f.port), f.listen));
    }
    let mut problems = Vec::new();
    for (i, (what, addr)) in tcp.iter().enumerate() {
        for (other, other_addr) in &tcp[..i] {
            if overlaps(*addr, *other_addr) {
                problems.push(format!(
                    "{what} and {other} would both listen on {addr}{}",
                    if addr == other_addr {
                        String::new()
                    } else {
                        format!(" / {other_addr}")
                    }
                ));
            }
        }
    }
    problems
}

/// Same port, and the same address or one of them the wildcard of the same family.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which line a problem is about: only a line that holds it alone, by table and key (reviewer F:
    /// a flag's value was put on a file line, a table's `hosts` on the top-level one, a value twice in
    /// the file on its first place, a dotted subdomain on no line).
    #[test]
    fn problems_name_the_one_line_that_holds_them() {
        let text = "hosts = [\"ok.test\",\n  \"1.2.3.4\"]  # a comment with \"1.2.3.4\"\n\
                    subdomains = [\".5.6.7.8\"]\n\
                    max_connections = 0\n\
                    max_connections_per_client = 20\n\
                    [answers]\nttl = 0\n\
                    [answers.hosts]\n\"9.9.9.9\" = \"127.0.0.3\"\n\
                    [inject.api_key]\nhosts = []\n\
                    [[forwards]]\nhost = \"9.9.9.9\"\n";
        let err = ConfigError::Invalid(vec![
            "hosts entry `1.2.3.4`: not a name".into(),
            "subdomains entry `5.6.7.8`: not a name".into(),
            "max_connections is 0; it must be between 1 and 4096".into(),
            "max_connections_per_client is 500; it must be between 1 and 100".into(),
            "answers.ttl is 0; it must be between 1 and 3600".into(),
            "inject: api_key.hosts is empty".into(),
            "answers.hosts entry `9.9.9.9`: not a name".into(),
            "would both listen on 0.0.0.0:443".into(),
        ]);
        let ConfigError::InvalidFile { problems, .. } =
            err.in_file(Path::new("r.toml"), text, &["max_connections_per_client"])
        else {
            panic!("not located");
        };
        let prefixes: Vec<&str> = problems
            .iter()
            .map(|p| p.split_once(' ').unwrap().0)
            .collect();
        assert_eq!(
            prefixes,
            [
                "r.toml:2:", // inside the array, not the comment's copy
                "r.toml:3:", // with its dot
                "r.toml:4:",
                "r.toml:",   // the flag's value, not line 5's
                "r.toml:7:", // ttl in [answers]
                "r.toml:",   // not the top-level hosts
                "r.toml:",   // on two lines: neither
                "r.toml:",
            ],
            "{problems:#?}"
        );
    }

    use crate::allowlist::Allowlist;

    fn sample() -> RouterConfig {
        let list = Allowlist::parse("api.anthropic.com\n.example.com\n", "t").unwrap();
        let mut c = RouterConfig::from_policy(&Policy::new(&list), Ipv4Addr::new(127, 0, 0, 2));
        c.listen.dns = Some("10.0.0.2:53".parse().unwrap());
        c.listen.https = Some("10.0.0.2:443".parse().unwrap());
        c.forwards.push(ForwardConfig {
            host: "db.example.com".into(),
            port: 5432,
            listen: "10.0.0.2:10000".parse().unwrap(),
        });
        c.allowlist = Some("/home/me/.config/agent-sandbox/allowed-hosts".into());
        c
    }

    /// A FIFO given as `--config` fails at once with an error naming the path, rather than waiting for
    /// a writer.
    #[test]
    fn a_fifo_config_is_refused_at_once() {
        let guard = crate::test_support::TestDir::new("config-fifo");
        let dir: &std::path::Path = &guard;
        let fifo = dir.join("router.toml");
        crate::test_support::mkfifo(&fifo);
        let (tx, rx) = std::sync::mpsc::channel();
        let p = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(RouterConfig::load(&p).map_err(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("RouterConfig::load returns at once")
            .unwrap_err();
        assert_eq!(
            err,
            format!(
                "router configuration {} is not a regular file (a FIFO, device or directory); give the path of a regular file",
                fifo.display()
            )
        );
    }

    #[test]
    fn round_trip() {
        let c = sample();
        let text = c.to_toml();
        assert_eq!(RouterConfig::from_toml(&text).unwrap(), c);
    }

    #[test]
    fn unknown_fields_are_errors() {
        let text = format!("{}\nbogus = 1\n", sample().to_toml());
        let err = RouterConfig::from_toml(&text).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn validation_collects_problems() {
        let mut c = sample();
        c.hosts.push("1.2.3.4".into());
        c.subdomains.push("*.x.com".into());
        c.listen.http = Some("0.0.0.0:443".parse().unwrap());
        c.peek_timeout_secs = 0;
        c.max_connections = usize::MAX;
        c.connect_timeout_secs = u64::MAX;
        let err = c.validate().unwrap_err().to_string();
        for needle in [
            "max_connections is",
            "connect_timeout_secs is 18446744073709551615; it must be between 1 and 3600",
            "`1.2.3.4`",
            "`*.x.com`",
            "https and http would both listen on 10.0.0.2:443 / 0.0.0.0:443",
            "peek_timeout",
        ] {
            assert!(err.contains(needle), "{needle} missing in {err}");
        }
    }

    #[test]
    fn valid_config_compiles_policy() {
        let v = sample().validate().unwrap();
        let policy = &v.rules.policy;
        assert!(policy.decide("www.example.com").is_ok());
        assert!(policy.decide("db.example.com").is_ok());
        assert!(policy.allows_port(&HostName::parse("db.example.com").unwrap(), 5432));
        assert!(policy.decide("evil.com").is_err());
        assert_eq!(v.limits.peek_timeout, Duration::from_secs(10));
        assert_eq!(v.rules.answers.ttl.get(), DEFAULT_ANSWER_TTL);
    }

    #[test]
    fn fairness_limits_default_and_bounds() {
        let v = sample().validate().unwrap();
        assert_eq!(
            v.limits.max_connections_per_client.get(),
            DEFAULT_MAX_CONNECTIONS / 4
        );
        assert_eq!(
            v.limits.idle_timeout,
            Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS)
        );
        assert_eq!(
            v.limits.wildcard_lookups_per_minute.get(),
            DEFAULT_WILDCARD_LOOKUPS_PER_MINUTE
        );
        let mut c = sample();
        c.max_connections = 3;
        assert_eq!(
            c.validate()
                .unwrap()
                .limits
                .max_connections_per_client
                .get(),
            1
        );
        c.max_connections_per_client = Some(4);
        c.idle_timeout_secs = 0;
        c.wildcard_lookups_per_minute = 0;
        let err = c.validate().unwrap_err().to_string();
        for needle in [
            "max_connections_per_client is 4; it must be between 1 and 3",
            "idle_timeout_secs is 0",
            "wildcard_lookups_per_minute is 0",
        ] {
            assert!(err.contains(needle), "{needle} missing in {err}");
        }
        // A file that does not mention them still parses (the launcher's older configurations).
        let mut text = sample().to_toml();
        text = text
            .lines()
            .filter(|l| !l.starts_with("idle_timeout_secs") && !l.starts_with("wildcard_"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(RouterConfig::from_toml(&text).unwrap(), sample());
    }
}
