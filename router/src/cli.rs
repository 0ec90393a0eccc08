//! The command line, and how it merges with `--config` into one [`RouterConfig`].
//!
//! Two ways to run: sandbox mode (`--config FILE`, written by the launcher from the session plan) and
//! standalone gateway mode (`--allowlist FILE --answer IPV4 ...`). Both end in the same validated
//! configuration, so the router has one code path. Flags win over the file.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use agent_sandbox_shared::config::{ConfigError, ForwardConfig, RouterConfig, ValidConfig};
use agent_sandbox_shared::{Allowlist, Entry, HostName, Policy};
use clap::{Parser, ValueEnum};
use tracing::warn;

use crate::reload::{Loaded, Source};
use crate::watch::Fingerprint;

/// Default listeners of the standalone gateway.
const DEFAULT_DNS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 53);
const DEFAULT_HTTP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 80);
const DEFAULT_HTTPS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 443);

/// agent-sandbox's egress router: DNS only for allowlisted names (NXDOMAIN otherwise, never forwarded),
/// TLS routed by SNI and HTTP by Host to allowlisted names only, and one listener per host:port entry.
#[derive(Clone, Debug, Parser)]
#[command(name = "agent-sandbox-router", version, about, max_term_width = 100)]
pub struct Cli {
    /// Router configuration (TOML) written by the launcher for a session.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Allowlist in the allowed-hosts format (required unless --config).
    #[arg(long, value_name = "FILE")]
    pub allowlist: Option<PathBuf>,

    /// The address DNS answers for every allowlisted name (the gateway's own address).
    #[arg(long, value_name = "IPV4")]
    pub answer: Option<Ipv4Addr>,

    /// DNS listen address, UDP and TCP [default: 0.0.0.0:53].
    #[arg(long, value_name = "ADDR")]
    pub dns: Option<SocketAddr>,

    /// HTTP (Host routing) listen address [default: 0.0.0.0:80].
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,

    /// TLS (SNI routing) listen address [default: 0.0.0.0:443].
    #[arg(long, value_name = "ADDR")]
    pub https: Option<SocketAddr>,

    /// Upstream DNS server (IP or IP:PORT, port 53 by default) used to resolve allowlisted names when
    /// connecting; repeatable [default: /etc/resolv.conf and /etc/hosts].
    #[arg(long = "resolver", value_name = "ADDR", value_parser = parse_resolver)]
    pub resolvers: Vec<SocketAddr>,

    /// Listen address for the host:port entry HOST:PORT [default: 0.0.0.0:PORT]; repeatable.
    #[arg(long = "forward", value_name = "HOST:PORT=ADDR", value_parser = parse_forward)]
    pub forwards: Vec<ForwardFlag>,

    /// How long a client may take to send its ClientHello / request head, in seconds [default: 10].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub peek_timeout: Option<u64>,

    /// Cap on connections handled at once [default: 4096].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: Option<u64>,

    /// Cap on connections one client (source address) holds at once, over every listener and worker;
    /// a client at its cap has new connections closed at once [default: a quarter of
    /// --max-connections, at least 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections_per_client: Option<u64>,

    /// Seconds a relay (TLS, HTTP, host:port), or a kept-alive HTTP connection waiting for its next
    /// request, may go with no byte in either direction before it is closed [default: 3600].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout: Option<u64>,

    /// Distinct names under wildcard (.example.com) entries that one client may have the router
    /// resolve per minute, counting only lookups its resolver cache cannot answer, each name once;
    /// past it connections to new such names are refused [default: 120].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub wildcard_lookups_per_minute: Option<u32>,

    /// Workers [default: one per core]: each is a thread with its own event loop and, when there are
    /// several, its own SO_REUSEPORT listening sockets. A session's router serves one sandbox and runs
    /// with 1, leaving the other cores to the sandbox itself.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,

    /// Serve GET /livez, /readyz and /metrics (Prometheus text format) on ADDR [default: off]. Never
    /// reachable through the client-facing listeners.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,

    /// After SIGTERM, stop accepting, answer /readyz with 503, and let connections in flight go on for
    /// up to this many seconds before exiting [default: 0, exit at once]. A second SIGTERM exits at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub drain_seconds: u64,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Load and validate everything, print the effective plan, and exit (0 if valid, 1 otherwise).
    #[arg(long)]
    pub check: bool,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log collectors and the launcher's report).
    Json,
}

/// One `--forward HOST:PORT=ADDR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardFlag {
    /// The entry's host.
    pub host: HostName,
    /// The entry's port.
    pub port: u16,
    /// Where to listen for it.
    pub listen: SocketAddr,
}

fn parse_resolver(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(s);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("`{s}` is not an IP address or IP:PORT (names are not accepted here)"))
}

fn parse_forward(s: &str) -> Result<ForwardFlag, String> {
    let (entry, listen) = s.split_once('=').ok_or_else(|| {
        format!("`{s}` is not HOST:PORT=ADDR (e.g. db.example.com:5432=0.0.0.0:5432)")
    })?;
    let (host, port) = entry
        .rsplit_once(':')
        .ok_or_else(|| format!("`{entry}` is not HOST:PORT"))?;
    let host = HostName::parse(host).map_err(|e| format!("`{entry}`: {e}"))?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("`{entry}`: the port must be 1-65535"))?;
    let listen = listen
        .parse::<SocketAddr>()
        .map_err(|_| format!("`{listen}` is not an IP:PORT listen address"))?;
    Ok(ForwardFlag { host, port, listen })
}

/// A problem with the command line as a whole (exit status 2), as opposed to bad input files (1).
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// Neither a configuration nor an allowlist.
    #[error("give --allowlist FILE (standalone gateway) or --config FILE (sandbox session)")]
    NoPolicy,
    /// Standalone mode needs an answer address.
    #[error("--answer IPV4 is required without --config: it is the address DNS gives for allowlisted names (this gateway's own address)")]
    NoAnswer,
    /// `--forward` for an entry the allowlist does not have.
    #[error("--forward {0}:{1}=...: the allowlist has no entry {0}:{1}")]
    UnknownForward(HostName, u16),
}

/// What went wrong while building the configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Exit status 2.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// Exit status 1: the allowlist does not parse.
    #[error(transparent)]
    Allowlist(#[from] agent_sandbox_shared::AllowlistError),
    /// Exit status 1: the configuration file is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] agent_sandbox_shared::config::ConfigError),
}

/// The configuration the flags describe, and any allowlist warnings to show.
#[derive(Debug)]
pub struct Built {
    /// The merged configuration (not yet validated).
    pub config: RouterConfig,
    /// Allowlist warnings (duplicates, covered entries), already formatted with file and line.
    pub warnings: Vec<String>,
    /// The files read (`--config`, `--allowlist`), each with the fingerprint of the very content the
    /// configuration was built from: what their watches compare against.
    pub read: Vec<(PathBuf, Fingerprint)>,
    /// The `--config` file and its text, to name its lines in validation errors.
    pub config_file: Option<(PathBuf, String)>,
    /// The configuration keys the flags set (their problems are not the file's).
    pub from_flags: Vec<&'static str>,
}

impl Built {
    /// Validates the merged configuration; with `--config`, each problem names the file and the line
    /// that holds the value it is about.
    pub fn validate(&self) -> Result<ValidConfig, ConfigError> {
        self.config.validate().map_err(|e| match &self.config_file {
            Some((path, text)) => e.in_file(path, text, &self.from_flags),
            None => e,
        })
    }
}

impl Cli {
    /// Merges `--config` and the flags (flags win) into one configuration. A `--forward` for an entry
    /// the allowlist does not have is a usage error (most likely a typo).
    pub fn build_config(&self) -> Result<Built, BuildError> {
        self.build(true)
    }

    /// As [`Cli::build_config`], for a live reload: a `--forward` whose entry the new allowlist no
    /// longer has is a warning, not an error, so that removing the entry is a reload like any other
    /// (the flags cannot change without a restart); the mapping applies again if the entry comes back.
    pub fn build_config_for_reload(&self) -> Result<Built, BuildError> {
        self.build(false)
    }

    /// How a live reload re-reads what this command line names: [`Cli::build_config_for_reload`],
    /// validated, with the fingerprints of the content read. Errors become their message alone: the
    /// parsers' messages already carry their causes (file, line, the I/O error), and the reload log
    /// prints each line of it once. Blocking: the reload calls it on the blocking pool.
    #[must_use]
    pub fn reload_source(&self) -> Source {
        let cli = self.clone();
        Arc::new(move || {
            let built = cli
                .build_config_for_reload()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            for w in &built.warnings {
                warn!("allowlist: {w}");
            }
            let config = built.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(Loaded {
                config,
                read: built.read,
            })
        })
    }

    fn build(&self, strict: bool) -> Result<Built, BuildError> {
        let mut warnings = Vec::new();
        let mut read = Vec::new();
        let mut config_file = None;
        // Each file is read once: the configuration is built from those bytes, and their fingerprint is
        // what the file's watch compares against.
        let mut config = match &self.config {
            Some(path) => {
                let bytes = RouterConfig::read(path)?;
                read.push((path.clone(), Fingerprint::of_bytes(&bytes)));
                let parsed = RouterConfig::parse_file(path, &bytes)?;
                config_file = Some((path.clone(), String::from_utf8_lossy(&bytes).into_owned()));
                parsed
            }
            None => {
                if self.allowlist.is_none() {
                    return Err(UsageError::NoPolicy.into());
                }
                let answer = self.answer.ok_or(UsageError::NoAnswer)?;
                let mut c = RouterConfig::from_policy(&Policy::default(), answer);
                c.listen.dns = Some(DEFAULT_DNS);
                c.listen.http = Some(DEFAULT_HTTP);
                c.listen.https = Some(DEFAULT_HTTPS);
                c
            }
        };

        if let Some(path) = &self.allowlist {
            let bytes = Allowlist::read(path)?;
            read.push((path.clone(), Fingerprint::of_bytes(&bytes)));
            let list = Allowlist::parse_file(path, &bytes)?;
            // Refused clients are told which file to edit: the one given here.
            config.allowlist = Some(path.display().to_string());
            warnings.extend(
                list.warnings()
                    .iter()
                    .map(|w| format!("{}:{}", path.display(), w)),
            );
            let policy = Policy::new(&list);
            let previous = std::mem::take(&mut config.forwards);
            let fresh = RouterConfig::from_policy(&policy, config.answers.default);
            config.hosts = fresh.hosts;
            config.subdomains = fresh.subdomains;
            for entry in policy.entries() {
                if let Entry::Port(host, port) = entry {
                    let listen = previous
                        .iter()
                        .find(|f| f.host == host.as_str() && f.port == port)
                        .map_or(
                            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                            |f| f.listen,
                        );
                    config.forwards.push(ForwardConfig {
                        host: host.to_string(),
                        port,
                        listen,
                    });
                }
            }
        }

        if let Some(answer) = self.answer {
            // Flags win: with --answer every allowlisted name gets this one address.
            config.answers.default = answer;
            config.answers.hosts.clear();
        }
        if let Some(a) = self.dns {
            config.listen.dns = Some(a);
        }
        if let Some(a) = self.http {
            config.listen.http = Some(a);
        }
        if let Some(a) = self.https {
            config.listen.https = Some(a);
        }
        if !self.resolvers.is_empty() {
            config.resolvers.clone_from(&self.resolvers);
        }
        for f in &self.forwards {
            let slot = config
                .forwards
                .iter_mut()
                .find(|c| c.host == f.host.as_str() && c.port == f.port);
            match slot {
                Some(slot) => slot.listen = f.listen,
                None if strict => {
                    return Err(UsageError::UnknownForward(f.host.clone(), f.port).into())
                }
                None => warnings.push(format!(
                    "--forward {}:{}={}: the allowlist has no entry {0}:{1} now; the mapping applies \
                     again if the entry comes back",
                    f.host, f.port, f.listen
                )),
            }
        }
        let from_flags = [
            ("peek_timeout_secs", self.peek_timeout.is_some()),
            ("max_connections", self.max_connections.is_some()),
            (
                "max_connections_per_client",
                self.max_connections_per_client.is_some(),
            ),
            ("idle_timeout_secs", self.idle_timeout.is_some()),
            (
                "wildcard_lookups_per_minute",
                self.wildcard_lookups_per_minute.is_some(),
            ),
            ("answers.default", self.answer.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        if let Some(t) = self.peek_timeout {
            config.peek_timeout_secs = t;
        }
        if let Some(n) = self.max_connections {
            config.max_connections = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.max_connections_per_client {
            config.max_connections_per_client = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(t) = self.idle_timeout {
            config.idle_timeout_secs = t;
        }
        if let Some(n) = self.wildcard_lookups_per_minute {
            config.wildcard_lookups_per_minute = n;
        }
        Ok(Built {
            config,
            warnings,
            read,
            config_file,
            from_flags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("agent-sandbox-router").chain(args.iter().copied()))
            .unwrap()
    }

    #[test]
    fn forward_flag_syntax() {
        let f = parse_forward("DB.example.com:5432=127.0.0.1:15432").unwrap();
        assert_eq!(f.host.as_str(), "db.example.com");
        assert_eq!(f.port, 5432);
        assert_eq!(f.listen, "127.0.0.1:15432".parse().unwrap());
        for bad in [
            "db:5432",
            "db.example.com=1.2.3.4:1",
            "db.example.com:0=1.2.3.4:1",
            "1.2.3.4:22=1.2.3.4:1",
            "db.x:22=host:1",
        ] {
            assert!(parse_forward(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resolver_syntax() {
        assert_eq!(
            parse_resolver("10.0.0.1").unwrap(),
            "10.0.0.1:53".parse().unwrap()
        );
        assert_eq!(
            parse_resolver("10.0.0.1:5353").unwrap(),
            "10.0.0.1:5353".parse().unwrap()
        );
        assert_eq!(parse_resolver("::1").unwrap(), "[::1]:53".parse().unwrap());
        assert_eq!(
            parse_resolver("[::1]:54").unwrap(),
            "[::1]:54".parse().unwrap()
        );
        assert!(parse_resolver("dns.google").is_err());
    }

    #[test]
    fn standalone_needs_allowlist_and_answer() {
        assert!(matches!(
            cli(&[]).build_config(),
            Err(BuildError::Usage(UsageError::NoPolicy))
        ));
        assert!(matches!(
            cli(&["--allowlist", "/nonexistent"]).build_config(),
            Err(BuildError::Usage(UsageError::NoAnswer))
        ));
    }

    /// A `--forward` for an entry the allowlist lacks: refused at start-up, a warning on reload.
    #[test]
    fn forward_for_an_absent_entry_is_an_error_at_start_and_a_warning_on_reload() {
        let dir = std::env::temp_dir().join(format!("router-cli-fwd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let list = dir.join("allowed-hosts");
        std::fs::write(&list, "a.test\n").unwrap();
        let c = cli(&[
            "--allowlist",
            list.to_str().unwrap(),
            "--answer",
            "10.0.0.1",
            "--forward",
            "db.test:5432=127.0.0.1:15432",
        ]);
        assert!(matches!(
            c.build_config(),
            Err(BuildError::Usage(UsageError::UnknownForward(..)))
        ));
        let built = c.build_config_for_reload().unwrap();
        assert!(built.config.forwards.is_empty());
        assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
        assert!(
            built.warnings[0].contains("no entry db.test:5432"),
            "{:?}",
            built.warnings
        );
        std::fs::write(&list, "a.test\ndb.test:5432\n").unwrap();
        let built = c.build_config_for_reload().unwrap();
        assert_eq!(
            built.config.forwards[0].listen,
            "127.0.0.1:15432".parse().unwrap()
        );
        assert!(built.warnings.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The refusal texts name the `--allowlist` file; with only `--config` they name what the file says.
    #[test]
    fn the_allowlist_given_is_the_one_refusals_name() {
        let dir = std::env::temp_dir().join(format!("router-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let list = dir.join("gateway-hosts");
        std::fs::write(&list, "a.test\n").unwrap();
        let built = cli(&[
            "--allowlist",
            list.to_str().unwrap(),
            "--answer",
            "10.0.0.1",
        ])
        .build_config()
        .unwrap();
        assert_eq!(built.config.allowlist.as_deref(), list.to_str());

        let config = dir.join("router.toml");
        std::fs::write(&config, built.config.to_toml()).unwrap();
        let from_file = cli(&["--config", config.to_str().unwrap()])
            .build_config()
            .unwrap();
        assert_eq!(from_file.config.allowlist.as_deref(), list.to_str());
        let mut bare = built.config.clone();
        bare.allowlist = None;
        std::fs::write(&config, bare.to_toml()).unwrap();
        let bare = cli(&["--config", config.to_str().unwrap()])
            .build_config()
            .unwrap();
        assert_eq!(bare.config.allowlist, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
