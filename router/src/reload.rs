//! Live reload: re-read the configuration, and apply it whole or not at all.
//!
//! How it fits: SIGHUP ([`crate::Handles::reload`]) and the allowlist watch ([`crate::watch`]) wake the
//! reload task on the first worker, which calls [`Reloader::reload`]. A reload (1) re-reads everything the
//! command line names, through the same parsing and validation as at start-up; (2) refuses changes that
//! need a restart (listener addresses, resolvers, limits, `[inject]`); (3) binds the listeners of `host:port` entries
//! the new policy adds, one per worker; and only when all of that succeeded (4) replaces the rules every
//! worker reads ([`crate::live`]), hands the new listeners to the workers and closes the listeners of
//! removed entries. Any failure leaves the old policy whole and serving, logs every error (with file and
//! line, as the parsers give them) and counts it. Connections already relaying keep the rules they were
//! admitted under and go on; a removed entry's listener closes, its open connections finish.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use agent_sandbox_shared::config::ListenConfig;
use agent_sandbox_shared::{HostName, Limits, ValidConfig};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bind::bind_forward;
use crate::live::LiveRules;
use crate::metrics::Metrics;
use crate::workers::Command;

/// Re-reads the configuration the process was started with (files and flags), validated.
pub type Source = Box<dyn FnMut() -> anyhow::Result<ValidConfig> + Send>;

/// What a reload may not change without a restart, as in force.
#[derive(Debug, Clone, PartialEq)]
struct Fixed {
    /// DNS, HTTP and TLS listener addresses: their sockets are bound once, at start-up.
    listen: ListenConfig,
    /// Upstream resolvers: each worker's resolver is built once.
    resolvers: Vec<SocketAddr>,
    /// Timeouts and the connection cap.
    limits: Limits,
    /// Credential injection: its CA, leaf, keys and store are loaded once, at start.
    inject: Option<agent_sandbox_shared::inject::InjectConfig>,
}

impl Fixed {
    fn of(config: &ValidConfig) -> Fixed {
        Fixed {
            listen: config.listen.clone(),
            resolvers: config.resolvers.clone(),
            limits: config.limits,
            inject: config.inject.as_ref().map(|i| i.config.clone()),
        }
    }

    /// What differs from `new`, one line each.
    fn changes(&self, new: &Fixed) -> Vec<String> {
        let mut out = Vec::new();
        let l = (&self.listen, &new.listen);
        for (what, old, new) in [
            ("the DNS listen address", l.0.dns, l.1.dns),
            ("the HTTP listen address", l.0.http, l.1.http),
            ("the TLS listen address", l.0.https, l.1.https),
        ] {
            if old != new {
                out.push(format!("{what} changed ({} -> {})", show(old), show(new)));
            }
        }
        if self.resolvers != new.resolvers {
            out.push("the upstream resolvers changed".into());
        }
        if self.limits != new.limits {
            out.push("the timeouts or the connection cap changed".into());
        }
        if self.inject != new.inject {
            out.push("the [inject] section changed".into());
        }
        out
    }
}

fn show(a: Option<SocketAddr>) -> String {
    a.map_or_else(|| "off".into(), |a| a.to_string())
}

/// A `host:port` entry's listeners, as in force.
#[derive(Debug)]
struct ForwardSlot {
    /// The configured listen address (port 0 stays 0: a kept entry keeps the port it was given).
    listen: SocketAddr,
    /// Cancelled to close the entry's listener on every worker.
    accepting: CancellationToken,
}

/// What a successful reload changed.
#[derive(Debug, PartialEq, Eq)]
pub struct Applied {
    /// Policy entries before.
    pub before: usize,
    /// Policy entries after.
    pub after: usize,
    /// `host:port` entries whose listeners opened.
    pub opened: Vec<String>,
    /// `host:port` entries whose listeners closed.
    pub closed: Vec<String>,
}

/// Why a reload was refused; the old policy stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The process was started without a way to re-read its configuration.
    #[error("this router was started without a configuration source to re-read")]
    NoSource,
    /// The files do not parse or validate.
    #[error("{0:#}")]
    Invalid(anyhow::Error),
    /// The new configuration changes what only a restart can.
    #[error("{} (restart the router to change {})", .0.join("; "), if .0.len() == 1 { "it" } else { "them" })]
    NeedsRestart(Vec<String>),
    /// A new entry's listener could not be bound.
    #[error("{0:#}")]
    Bind(anyhow::Error),
}

/// Re-reads and applies the configuration.
pub(crate) struct Reloader {
    /// Where the configuration comes from.
    source: Option<Source>,
    /// The rules every worker reads.
    rules: LiveRules,
    /// What needs a restart to change.
    fixed: Fixed,
    /// The entries' listeners in force.
    forwards: BTreeMap<(HostName, u16), ForwardSlot>,
    /// Entries in force.
    entries: usize,
    /// Answer addresses the workers already treat as the router's own.
    own: BTreeSet<IpAddr>,
    /// Parent of new entries' "stop accepting" tokens, so a drain closes them too.
    drain: CancellationToken,
    /// One command channel per worker.
    workers: Vec<UnboundedSender<Command>>,
    /// Reload counters and the entry gauge.
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("entries", &self.entries)
            .field("forwards", &self.forwards.len())
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// A reloader for the configuration `config` that is in force, whose forward listeners close with
    /// `forward_stops`.
    pub(crate) fn new(
        source: Option<Source>,
        config: &ValidConfig,
        rules: LiveRules,
        forward_stops: Arc<BTreeMap<(HostName, u16), CancellationToken>>,
        drain: CancellationToken,
        workers: Vec<UnboundedSender<Command>>,
        metrics: Arc<Metrics>,
    ) -> Reloader {
        let forwards = config
            .forwards
            .iter()
            .map(|(host, port, listen)| {
                let accepting = forward_stops
                    .get(&(host.clone(), *port))
                    .cloned()
                    .unwrap_or_else(|| drain.child_token());
                (
                    (host.clone(), *port),
                    ForwardSlot {
                        listen: *listen,
                        accepting,
                    },
                )
            })
            .collect();
        Reloader {
            source,
            rules,
            fixed: Fixed::of(config),
            forwards,
            entries: config.rules.policy.entries().len(),
            own: answer_addresses(config),
            drain,
            workers,
            metrics,
        }
    }

    /// Whether a reload can re-read anything.
    pub(crate) fn can_reload(&self) -> bool {
        self.source.is_some()
    }

    /// Reloads and logs the outcome in one line (and each error on its own line before it).
    pub(crate) fn reload(&mut self) {
        let before = self.entries;
        match self.try_reload() {
            Ok(applied) => {
                self.metrics.reload_succeeded(applied.after);
                info!(
                    result = "success",
                    entries_before = applied.before,
                    entries_after = applied.after,
                    opened = %applied.opened.join(" "),
                    closed = %applied.closed.join(" "),
                    "reload succeeded: {} -> {} entries{}{}",
                    applied.before,
                    applied.after,
                    if applied.opened.is_empty() { String::new() } else { format!("; listening for {}", applied.opened.join(", ")) },
                    if applied.closed.is_empty() { String::new() } else { format!("; closed {} (open connections go on)", applied.closed.join(", ")) },
                );
            }
            Err(error) => {
                self.metrics.reload_failed();
                let text = error.to_string();
                for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    warn!(error = %line, "reload error");
                }
                warn!(
                    result = "failure",
                    entries_before = before,
                    entries_after = before,
                    "reload failed: the current policy ({before} entries) stays in force"
                );
            }
        }
    }

    /// The reload proper: everything that can fail happens before anything is applied.
    fn try_reload(&mut self) -> Result<Applied, ReloadError> {
        let source = self.source.as_mut().ok_or(ReloadError::NoSource)?;
        let new = source().map_err(ReloadError::Invalid)?;
        let changes = self.fixed.changes(&Fixed::of(&new));
        if !changes.is_empty() {
            return Err(ReloadError::NeedsRestart(changes));
        }
        // Entries to open: new ones, and kept ones whose listen address changed.
        let wanted: BTreeMap<(HostName, u16), SocketAddr> = new
            .forwards
            .iter()
            .map(|(h, p, a)| ((h.clone(), *p), *a))
            .collect();
        let to_open: Vec<_> = wanted
            .iter()
            .filter(|(key, listen)| {
                self.forwards
                    .get(*key)
                    .map_or(true, |s| s.listen != **listen)
            })
            .collect();
        let to_close: Vec<(HostName, u16)> = self
            .forwards
            .iter()
            .filter(|(key, slot)| wanted.get(*key) != Some(&slot.listen))
            .map(|(key, _)| key.clone())
            .collect();
        let workers = self.workers.len();
        let mut bound = Vec::new();
        for ((host, port), listen) in to_open {
            let sockets = bind_forward(host, *port, *listen, workers).map_err(ReloadError::Bind)?;
            bound.push((host.clone(), *port, *listen, sockets));
        }

        // Nothing below fails: apply.
        let before = self.entries;
        let after = new.rules.policy.entries().len();
        for ip in answer_addresses(&new) {
            if self.own.insert(ip) {
                for w in &self.workers {
                    let _ = w.send(Command::OwnAddress(ip));
                }
            }
        }
        self.rules.store(new.rules);
        let mut closed = Vec::new();
        for key in to_close {
            if let Some(slot) = self.forwards.remove(&key) {
                slot.accepting.cancel();
                closed.push(format!("{}:{}", key.0, key.1));
            }
        }
        let mut opened = Vec::new();
        for (host, port, listen, sockets) in bound {
            let accepting = self.drain.child_token();
            for (worker, socket) in self.workers.iter().zip(sockets) {
                let _ = worker.send(Command::Forward {
                    host: host.clone(),
                    port,
                    socket,
                    accepting: accepting.clone(),
                });
            }
            opened.push(format!("{host}:{port}"));
            self.forwards
                .insert((host, port), ForwardSlot { listen, accepting });
        }
        self.entries = after;
        Ok(Applied {
            before,
            after,
            opened,
            closed,
        })
    }
}

/// Every address DNS answers with.
fn answer_addresses(config: &ValidConfig) -> BTreeSet<IpAddr> {
    let answers = &config.rules.answers;
    std::iter::once(answers.default)
        .chain(answers.hosts.values().copied())
        .map(IpAddr::V4)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_shared::RouterConfig;

    fn config(placeholder: Option<&str>) -> ValidConfig {
        let mut toml =
            "hosts = [\"api.example.test\"]\n[listen]\n[answers]\ndefault = \"127.0.0.2\"\n"
                .to_owned();
        if let Some(p) = placeholder {
            toml.push_str(&format!(
                "[inject]\nca_cert = \"/s/ca.pem\"\nca_key = \"/s/ca.key\"\n[inject.api_key]\nhosts = [\"api.example.test\"]\nplaceholder = \"{p}\"\nkey_file = \"/s/key\"\n"
            ));
        }
        RouterConfig::from_toml(&toml).unwrap().validate().unwrap()
    }

    #[test]
    fn an_inject_change_needs_a_restart() {
        let none = Fixed::of(&config(None));
        let one = Fixed::of(&config(Some("sk-ant-api03-placeholder-1111111111")));
        let two = Fixed::of(&config(Some("sk-ant-api03-placeholder-2222222222")));
        assert!(one.changes(&one.clone()).is_empty());
        for (a, b) in [(&none, &one), (&one, &none), (&one, &two)] {
            assert_eq!(a.changes(b), ["the [inject] section changed"]);
        }
    }
}
