//! Live reload: re-read the configuration, and apply it whole or not at all.
//!
//! How it fits: SIGHUP ([`crate::Handles::reload`]) and the allowlist watch ([`crate::watch`]) wake the
//! reload task on the first worker, which calls [`Reloader::reload`]. A reload (1) re-reads everything the
//! command line names, on the blocking pool (so a slow file never stalls the worker's DNS), through the
//! same parsing and validation as at start-up; a reload a watch asked for goes on only if every file was
//! read with the content the watch saw settle (otherwise it is skipped, and the watch reports the file
//! again once it settles), while SIGHUP applies the files as they are; (2) refuses changes that
//! need a restart (listener addresses, resolvers, limits, `[inject]`); (3) binds the listeners of `host:port` entries
//! the new policy adds, one per worker; and only when all of that succeeded (4) replaces the rules every
//! worker reads ([`crate::live`]), hands the new listeners to the workers and closes the listeners of
//! removed entries. Any failure leaves the old policy whole and serving, logs every error (with file and
//! line, as the parsers give them) and counts it. Connections already relaying keep the rules they were
//! admitted under and go on; a removed entry's listener closes, its open connections finish.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use agent_sandbox_shared::config::ListenConfig;
use agent_sandbox_shared::{HostName, Limits, ValidConfig};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bind::bind_forward;
use crate::live::LiveRules;
use crate::metrics::Metrics;
use crate::watch::{Fingerprint, Settled};
use crate::workers::Command;

/// What a reload read: the validated configuration, and each file it was built from with the
/// fingerprint of the content read.
#[derive(Debug)]
pub struct Loaded {
    /// The configuration, validated.
    pub config: ValidConfig,
    /// The files read, each with the fingerprint of the content the configuration was built from.
    pub read: Vec<(PathBuf, Fingerprint)>,
}

/// Re-reads the configuration the process was started with (files and flags), validated. Blocking: a
/// reload calls it on the blocking pool.
pub type Source = Arc<dyn Fn() -> anyhow::Result<Loaded> + Send + Sync>;

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
    /// A watch asked for the reload, and the file was read with other content than the watch saw
    /// settle: it changed again (a write in progress), so it is not applied; its watch reports it once
    /// it settles.
    #[error("{} changed again after it settled and was not applied; it is reloaded once it stays the same", .0.display())]
    Unsettled(PathBuf),
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
    /// Where the watches learn what the policy in force was built from (None: no watch).
    files: Option<Settled>,
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
            files: None,
        }
    }

    /// Tells the watches publishing in `files` what each reload put in force (SIGHUP's included), so
    /// they report again content whose reload did not put it in force.
    pub(crate) fn tracking(mut self, files: Settled) -> Reloader {
        self.files = Some(files);
        self
    }

    /// Whether a reload can re-read anything.
    pub(crate) fn can_reload(&self) -> bool {
        self.source.is_some()
    }

    /// Reloads and logs the outcome in one line (and each error on its own line before it). The files
    /// are read on the blocking pool, so a slow file system never stalls this worker's DNS. `settled`:
    /// a watch asked for this reload, and only content the watches saw settle may be applied (SIGHUP
    /// passes `None`: an operator's request applies the files as they are).
    pub(crate) async fn reload(&mut self, settled: Option<&Settled>) {
        let read = match self.source.clone() {
            None => Err(ReloadError::NoSource),
            Some(source) => match tokio::task::spawn_blocking(move || source()).await {
                Ok(read) => read.map_err(ReloadError::Invalid),
                Err(e) => Err(ReloadError::Invalid(anyhow::anyhow!(
                    "reading the configuration failed: {e}"
                ))),
            },
        };
        self.apply(read, settled);
    }

    /// Applies what a reload read, if it is valid (and, with `settled`, was read as it settled), and logs
    /// the outcome.
    fn apply(&mut self, read: Result<Loaded, ReloadError>, settled: Option<&Settled>) {
        let before = self.entries;
        let files_read = read.as_ref().ok().map(|loaded| loaded.read.clone());
        match read.and_then(|loaded| self.try_apply(loaded, settled)) {
            Ok(applied) => {
                if let (Some(files), Some(read)) = (&self.files, &files_read) {
                    files.set_in_force(read);
                }
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
            // Not a failure: the watch reports the file again once it settles.
            Err(error @ ReloadError::Unsettled(_)) => {
                info!(
                    result = "skipped",
                    entries_before = before,
                    "reload skipped: {error}; the current policy ({before} entries) stays in force"
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
    fn try_apply(
        &mut self,
        loaded: Loaded,
        settled: Option<&Settled>,
    ) -> Result<Applied, ReloadError> {
        if let Some(path) = settled.and_then(|s| s.unsettled(&loaded.read)) {
            return Err(ReloadError::Unsettled(path.to_owned()));
        }
        let new = loaded.config;
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

    /// A reload a watch asked for applies the content the watch saw settle, never content that changed
    /// again before the reload read it (a writer that started again: the last line torn, still a valid
    /// name); SIGHUP applies the file as it is.
    #[tokio::test]
    async fn a_watch_reload_applies_only_settled_content() {
        let dir = crate::test_support::TempDir::new("reload-settled");
        let list = dir.join("allowed-hosts");
        std::fs::write(&list, "keep.test\n").unwrap();
        let cli = crate::test_support::loopback_cli(&list);
        let built = cli.build_config().unwrap();
        let config = built.config.validate().unwrap();
        let rules = crate::live::Live::new(config.rules.clone());
        let mut reloader = Reloader::new(
            Some(cli.reload_source()),
            &config,
            rules.clone(),
            Arc::new(BTreeMap::new()),
            CancellationToken::new(),
            Vec::new(),
            Arc::new(Metrics::new()),
        );
        let allows = |name: &str| rules.load().policy.allows(&HostName::parse(name).unwrap());

        // The real watch sees the new content settle and publishes it; it is then stopped, so that
        // nothing but this test decides when the reload reads.
        let settled = Settled::default();
        let (path, loaded) = built.read[0].clone();
        let watch = crate::watch::AllowlistWatch::loaded(path, loaded)
            .with_timing(
                std::time::Duration::from_millis(20),
                std::time::Duration::from_millis(10),
            )
            .publishing(settled.clone());
        let changed = Arc::new(tokio::sync::Notify::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(watch.run(Arc::clone(&changed), stop.clone()));
        std::fs::write(&list, "keep.test\nintranet.mycorp.org.nz\n").unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), changed.notified())
            .await
            .expect("the watch reports the change");
        stop.cancel();
        task.await.unwrap();

        // A writer starts again before the reload reads: the reload sees a torn last line.
        std::fs::write(
            &list,
            "keep.test\nintranet.mycorp.org.nz\nintranet.mycorp.o",
        )
        .unwrap();
        reloader.reload(Some(&settled)).await;
        assert!(!allows("intranet.mycorp.o"), "torn content was applied");
        assert!(!allows("intranet.mycorp.org.nz"), "nothing was applied");
        assert_eq!(reloader.entries, 1);

        // The settled content itself is applied.
        std::fs::write(&list, "keep.test\nintranet.mycorp.org.nz\n").unwrap();
        reloader.reload(Some(&settled)).await;
        assert!(allows("intranet.mycorp.org.nz"));
        assert_eq!(reloader.entries, 2);

        // SIGHUP: the operator's request applies the file as it is.
        std::fs::write(&list, "keep.test\n").unwrap();
        reloader.reload(None).await;
        assert!(!allows("intranet.mycorp.org.nz"));
        assert_eq!(reloader.entries, 1);
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
