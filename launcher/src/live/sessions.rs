//! Running sessions of this user, and applying a new policy to one of them.
//!
//! A session is running when its router container runs and its launcher is alive (the labels say which
//! process, [`crate::liveness`]). Applying = computing the session's new plan from the allowlist file
//! plus the session's own entries, extended from the addresses it has handed out
//! ([`SessionPlan::extend`]), replacing the router's and the forwarder's files in the session directory
//! ([`files`]) and sending both SIGHUP through podman; the router's log then says whether it took the
//! new policy, and the forwarder's whether it opened the new relays (each reload is whole or nothing).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};

use agent_sandbox_shared::{Allowlist, Policy, SessionPlan};

use super::files::{self, SessionMeta};
use crate::liveness;
use crate::podman::json::Container;
use crate::podman::{args, logfile, Podman, LABEL_SESSION, LABEL_SESSION_DIR};
use crate::session::rundir::{labelled_session_dir, session_dir};

/// How long the router and the forwarder each have to log the outcome of a reload before `allow`
/// reports it as unknown.
const RELOAD_CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// One running session.
#[derive(Clone, Debug)]
pub struct Running {
    /// Who it is (from its session directory).
    pub meta: SessionMeta,
    /// Its session directory.
    pub dir: PathBuf,
    /// Its router container.
    pub router: String,
    /// Its forwarder container.
    pub forwarder: String,
}

/// A session podman lists as running whose directory this command cannot read: it cannot be changed,
/// nor its policy told.
#[derive(Debug)]
pub struct Unreadable {
    /// The session id.
    pub id: String,
    /// Why.
    pub error: String,
}

/// The running sessions of this user, oldest first. Sessions whose directory cannot be read are left
/// out with a note on stderr: for commands that only look (`sessions`, `blocked`).
pub fn running(podman: &Podman) -> anyhow::Result<Vec<Running>> {
    let (out, unreadable) = running_all(podman)?;
    for u in unreadable {
        eprintln!(
            "agent-sandbox: session {} cannot be changed live: {}",
            u.id, u.error
        );
    }
    Ok(out)
}

/// The running sessions of this user, oldest first, and those whose directory cannot be read (a
/// session started by an older launcher, or whose directory was removed): what `allow`, `deny` and
/// `reload` must count as not reached, never as absent.
pub fn running_all(podman: &Podman) -> anyhow::Result<(Vec<Running>, Vec<Unreadable>)> {
    let json = podman.run(&args::ps_running_sessions())?;
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for c in Container::parse_list(&json)? {
        let Some(name) = c.names.first() else {
            continue;
        };
        let Some(id) = c.labels.get(LABEL_SESSION) else {
            continue;
        };
        // Only ever a session id of ours: it becomes a path.
        if name != &format!("agent-sandbox-{id}-router")
            || id.len() != 12
            || !id.chars().all(|ch| ch.is_ascii_hexdigit())
        {
            continue;
        }
        // A router still running after its launcher was killed serves its policy until the next
        // start's sweep removes it: never count it as gone (reviewer Q: deny said "refused").
        if !liveness::is_live(&c.labels, &boot) {
            unreadable.push(Unreadable {
                id: id.clone(),
                error: format!(
                    "its launcher is gone but its router still runs; `podman pod rm --force agent-sandbox-{id}` removes it (so does the next session's start)"
                ),
            });
            continue;
        }
        let dir = labelled_session_dir(c.labels.get(LABEL_SESSION_DIR), id)
            .unwrap_or_else(|| session_dir(id));
        match files::read_meta(&dir) {
            Ok(meta) => out.push(Running {
                meta,
                dir,
                router: name.clone(),
                forwarder: format!("agent-sandbox-{id}-forwarder"),
            }),
            Err(e) => unreadable.push(Unreadable {
                id: id.clone(),
                error: format!(
                    "its directory cannot be read (started by an older launcher, or with another XDG_RUNTIME_DIR?): {e:#}"
                ),
            }),
        }
    }
    out.sort_by(|a, b| (a.meta.started, &a.meta.id).cmp(&(b.meta.started, &b.meta.id)));
    Ok((out, unreadable))
}

/// The running session `id` (a unique prefix of it is enough).
pub fn find(podman: &Podman, id: &str) -> anyhow::Result<Running> {
    let (all, unreadable) = running_all(podman)?;
    let matching: Vec<&Running> = all.iter().filter(|s| s.meta.id.starts_with(id)).collect();
    let unreadable: Vec<&Unreadable> = unreadable.iter().filter(|u| u.id.starts_with(id)).collect();
    match (matching.as_slice(), unreadable.as_slice()) {
        ([], [one]) => bail!("session {} cannot be changed live: {}", one.id, one.error),
        ([_], []) | ([], []) => {}
        _ => bail!(
            "`{}` matches several sessions; give more of the id",
            id.escape_debug()
        ),
    }
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => bail!(
            "no running session {} of yours (`agent-sandbox sessions` lists them)",
            id.escape_debug()
        ),
        _ => bail!(
            "`{}` matches several sessions; give more of the id",
            id.escape_debug()
        ),
    }
}

/// Whether two allowlist paths are the same file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The session's policy: the allowlist text (the file's) plus the session's own entries. Invalid text
/// is an error with the file's lines (the session entries were validated when added).
pub fn session_allowlist(
    file_text: &str,
    file_name: &str,
    extra: &str,
) -> anyhow::Result<Allowlist> {
    let file = Allowlist::parse(file_text, file_name)?;
    if extra.trim().is_empty() {
        return Ok(file);
    }
    Ok(Allowlist::parse(
        &format!("{file_text}\n{extra}"),
        file_name,
    )?)
}

/// What applying a policy to a session did.
#[derive(Clone, Debug)]
pub struct Applied {
    /// Entries in force after it (hosts, wildcards and host:port entries).
    pub entries: usize,
    /// From the start of the change to the later of the router's and the forwarder's log lines
    /// saying they took it.
    pub took: Duration,
}

/// Writes session `s`'s files for `list`: the new plan, extended from what it has handed out. Returns
/// the number of entries in force.
fn prepare(s: &Running, list: &Allowlist) -> anyhow::Result<usize> {
    let policy = Policy::new(list);
    let state = files::read_state(&s.dir)?;
    if !files::has_in_force(&s.dir) {
        // The first live change: what is written now is the start's configuration, in force.
        files::record_in_force(&s.dir)?;
    }
    let old = files::read_router_config(&s.dir)?;
    let mut plan = SessionPlan::extend(&policy, s.meta.router_ip, &state)?;
    // What the router's reload may not change (it would refuse the whole reload) stays as at start.
    plan.router.resolvers = old.resolvers;
    plan.router.allowlist = old.allowlist;
    // The terminated hosts, CA and key files are the session's for its whole life (the router takes
    // them at start only).
    plan.router.inject = old.inject;
    files::write_plan(&s.dir, &plan)?;
    Ok(plan.router.hosts.len() + plan.router.subdomains.len() + plan.router.forwards.len())
}

/// Applies each policy to its session: every session's files written, then one `podman kill --signal
/// HUP` for all their routers and forwarders (one podman process, not two per session: podman's lock
/// makes parallel ones wait for each other), then each router's and forwarder's verdict read from
/// their logs, in parallel. One outcome per session, in order.
pub fn apply_all(
    podman: &Podman,
    targets: &[(&Running, Allowlist)],
) -> Vec<anyhow::Result<Applied>> {
    let started = Instant::now();
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut outcomes: Vec<anyhow::Result<usize>> =
        targets.iter().map(|(s, list)| prepare(s, list)).collect();
    // Where each router's and forwarder's log ends now: their verdicts are read from there on,
    // straight from the files (polling `podman logs` costs a podman process per look).
    let marks: Vec<[Option<LogMark>; 2]> = std::thread::scope(|scope| {
        let handles: Vec<[_; 2]> = targets
            .iter()
            .map(|(s, _)| {
                [Reloader::Router, Reloader::Forwarder]
                    .map(|whose| scope.spawn(move || LogMark::now(podman, s, whose)))
            })
            .collect();
        handles
            .into_iter()
            .map(|pair| pair.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))))
            .collect()
    });
    let names: Vec<&str> = targets
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| o.is_ok())
        .flat_map(|((s, _), _)| [s.router.as_str(), s.forwarder.as_str()])
        .collect();
    if !names.is_empty() && podman.run(&args::kill_many(&names, libc::SIGHUP)).is_err() {
        // One of them is gone (its session ended meanwhile): signal session by session, so each
        // outcome says whose it is.
        for ((s, _), o) in targets.iter().zip(outcomes.iter_mut()) {
            if o.is_ok() {
                if let Err(e) =
                    podman.run(&args::kill_many(&[&s.router, &s.forwarder], libc::SIGHUP))
                {
                    *o = Err(anyhow::Error::new(e).context(format!(
                        "cannot signal the router and forwarder of session {}",
                        s.meta.id
                    )));
                }
            }
        }
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .zip(outcomes)
            .zip(marks)
            .map(|(((s, _), o), [router_mark, forwarder_mark])| {
                scope.spawn(move || {
                    let entries = o?;
                    match router_mark {
                        Some(mark) => mark.wait_reloaded(Reloader::Router, &s.router)?,
                        None => wait_reloaded(podman, Reloader::Router, &s.router, since)?,
                    }
                    // Confirmed: what was written is what the router holds.
                    let _ = files::record_in_force(&s.dir);
                    // The router decides; the forwarder only opens (or closes) the loopback relays to
                    // it. A new name on a new address works only once its relays are open, and a
                    // process in the sandbox can hold that address first: say so, never "applied".
                    match forwarder_mark {
                        Some(mark) => mark.wait_reloaded(Reloader::Forwarder, &s.forwarder),
                        None => wait_reloaded(podman, Reloader::Forwarder, &s.forwarder, since),
                    }
                    .context(
                        "the router took the new policy, but the forwarder in the sandbox's pod did \
                         not open the new loopback relays (a process in the sandbox may be listening \
                         on one of their addresses; `agent-sandbox reload` tries again)",
                    )?;
                    Ok(Applied {
                        entries,
                        took: started.elapsed(),
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// A container whose reload the launcher waits for, and how its log says the outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reloader {
    /// The router: JSON lines, "reload succeeded" or "reload error" lines then "reload failed".
    Router,
    /// The forwarder: plain lines, "reloaded: ..." or "reload refused, relays unchanged: ...".
    Forwarder,
}

impl Reloader {
    /// What it is called in messages.
    fn what(self) -> &'static str {
        match self {
            Reloader::Router => "the router",
            Reloader::Forwarder => "the forwarder",
        }
    }

    /// The session file holding its log's path (written at start, or by the first live change).
    fn log_path_file(self) -> &'static str {
        match self {
            Reloader::Router => files::ROUTER_LOG_PATH_FILE,
            Reloader::Forwarder => files::FORWARDER_LOG_PATH_FILE,
        }
    }

    /// The outcome of the first reload in `log` (its messages, one per line), if any yet.
    fn verdict(self, log: &str) -> Option<Result<(), Vec<String>>> {
        match self {
            Reloader::Router => reload_verdict(log),
            Reloader::Forwarder => forwarder_verdict(log),
        }
    }

    /// The error for a refused reload.
    fn refused(self, errors: &[String]) -> anyhow::Error {
        match self {
            Reloader::Router => anyhow::anyhow!(
                "the router refused the new policy and keeps the old one: {}",
                errors.join("; ")
            ),
            Reloader::Forwarder => anyhow::anyhow!(
                "the forwarder refused the new relays and keeps the old ones: {}",
                errors.join("; ")
            ),
        }
    }

    /// The error for a reload not confirmed in time.
    fn unconfirmed(self, container: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{} did not confirm the reload within {RELOAD_CONFIRM_TIMEOUT:?} (see `podman logs {container}`)",
            self.what()
        )
    }
}

/// A point in a router's or forwarder's log file: its k8s-file log on the host, held open, and the
/// length it had.
struct LogMark {
    /// The log file's path.
    path: PathBuf,
    /// The file at the mark: conmon rotates a full log by renaming a new file over the path, and what
    /// was written to this one before the rename is read from here.
    file: std::fs::File,
    /// Its inode, to tell when the path names a new file.
    ino: u64,
    /// Its length before the signal.
    offset: u64,
}

impl LogMark {
    /// The log's current end, or `None` when its path cannot be had (then `podman logs` is polled
    /// instead).
    fn now(podman: &Podman, s: &Running, whose: Reloader) -> Option<LogMark> {
        let container = match whose {
            Reloader::Router => &s.router,
            Reloader::Forwarder => &s.forwarder,
        };
        let cache = s.dir.join(whose.log_path_file());
        let path = match files::read_log_path(&cache) {
            Some(p) => p,
            None => {
                let p = logfile::usable_path(&podman.run(&args::log_path(container)).ok()?)?;
                let _ = files::write_log_path(&cache, &p);
                p
            }
        };
        LogMark::at(path)
    }

    /// The end of the log at `path` now.
    fn at(path: PathBuf) -> Option<LogMark> {
        use std::os::unix::fs::MetadataExt as _;
        let file = std::fs::File::open(&path).ok()?;
        let meta = file.metadata().ok()?;
        Some(LogMark {
            path,
            ino: meta.ino(),
            offset: meta.len(),
            file,
        })
    }

    /// The messages logged since the mark: the rest of the file at the mark, then, once conmon has
    /// rotated the log, the whole new file (so a verdict either side of the rename is seen).
    fn messages(&self) -> String {
        use std::os::unix::fs::MetadataExt as _;
        let mut text = logfile::read_file_messages(&self.file, self.offset, MAX_VERDICT_READ)
            .unwrap_or_default();
        if std::fs::metadata(&self.path).is_ok_and(|m| m.ino() != self.ino) {
            text.push_str(
                &logfile::read_messages(&self.path, 0, MAX_VERDICT_READ).unwrap_or_default(),
            );
        }
        text
    }

    /// Polls the log from the mark for the reload verdict.
    fn wait_reloaded(&self, whose: Reloader, container: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + RELOAD_CONFIRM_TIMEOUT;
        loop {
            match whose.verdict(&self.messages()) {
                Some(Ok(())) => return Ok(()),
                Some(Err(errors)) => return Err(whose.refused(&errors)),
                None if Instant::now() >= deadline => return Err(whose.unconfirmed(container)),
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

/// The most of a log read for a verdict: the router's refusals may pile up there meanwhile.
const MAX_VERDICT_READ: u64 = 16 * 1024 * 1024;

/// Polls a container's log from `since` for its reload verdict.
fn wait_reloaded(
    podman: &Podman,
    whose: Reloader,
    container: &str,
    since: f64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + RELOAD_CONFIRM_TIMEOUT;
    loop {
        let out = podman.output(&args::logs_since(container, since, false))?;
        let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.push_str(&String::from_utf8_lossy(&out.stderr));
        match whose.verdict(&log) {
            Some(Ok(())) => return Ok(()),
            Some(Err(errors)) => return Err(whose.refused(&errors)),
            None if Instant::now() >= deadline => return Err(whose.unconfirmed(container)),
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The outcome of the first reload in a forwarder log (`LEVEL message` lines): `Ok` once it logged
/// `reloaded: ...`, its error when it logged that it refused the new relays, `None` before either.
/// The forwarder logs nothing a client chooses (connections only as addresses, at debug).
fn forwarder_verdict(log: &str) -> Option<Result<(), Vec<String>>> {
    for line in log.lines() {
        let Some((_level, message)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let message = message.trim_start();
        if message.starts_with("reloaded: ") {
            return Some(Ok(()));
        }
        let unprefixed = message.strip_prefix("SIGHUP: ").unwrap_or(message);
        if let Some(error) = unprefixed.strip_prefix("reload refused, relays unchanged: ") {
            return Some(Err(vec![error.to_owned()]));
        }
        if unprefixed.starts_with("no --relays file") {
            return Some(Err(vec![unprefixed.to_owned()]));
        }
    }
    None
}

/// The outcome of the first reload in a router log: `Ok` on success, its error lines on failure,
/// `None` when no reload outcome is logged yet.
fn reload_verdict(log: &str) -> Option<Result<(), Vec<String>>> {
    let mut errors = Vec::new();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
            continue;
        };
        let fields = &event["fields"];
        let message = fields["message"].as_str().unwrap_or_default();
        if message == "reload error" {
            errors.push(fields["error"].as_str().unwrap_or_default().to_owned());
        }
        match fields["result"].as_str() {
            Some("success") if message.starts_with("reload succeeded") => return Some(Ok(())),
            Some("failure") if message.starts_with("reload failed") => return Some(Err(errors)),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_change_keeps_the_whole_inject_section() {
        use agent_sandbox_shared::inject::{ApiKeyInject, InjectConfig, OAuthInject};
        let dir = std::env::temp_dir().join(format!("as-live-inject-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        files::create_layout(&dir).unwrap();
        let router_ip = std::net::Ipv4Addr::new(10, 0, 0, 2);
        let start = Allowlist::parse("api.anthropic.com\nplatform.claude.com\n", "t").unwrap();
        let mut plan = SessionPlan::new(&Policy::new(&start), router_ip).unwrap();
        let inside = Path::new("/etc/agent-sandbox-inject");
        let inject = InjectConfig {
            ca_cert: inside.join("ca.pem"),
            ca_key: inside.join("ca.key"),
            upstream_roots: None,
            api_key: Some(ApiKeyInject {
                hosts: vec!["api.anthropic.com".into()],
                placeholder: format!("sk-ant-api03-{}", "p".repeat(95)),
                key_file: inside.join("api-key"),
            }),
            oauth: Some(OAuthInject {
                api_hosts: vec!["api.anthropic.com".into()],
                token_host: "platform.claude.com".into(),
                token_path: "/v1/oauth/token".into(),
                store_dir: "/etc/agent-sandbox-oauth".into(),
            }),
        };
        plan.router.inject = Some(inject.clone());
        files::write_plan(&dir, &plan).unwrap();
        let running = Running {
            meta: SessionMeta {
                id: "0123456789ab".into(),
                project: "/p".into(),
                started: 0,
                allowlist: dir.join("allowed-hosts"),
                router_ip,
            },
            dir: dir.clone(),
            router: "r".into(),
            forwarder: "f".into(),
        };
        // Even a change that denies the token host: the section is the session's for its whole life
        // (the policy refuses the host before termination is considered).
        let changed = Allowlist::parse("api.anthropic.com\nexample.com\n", "t").unwrap();
        prepare(&running, &changed).unwrap();
        let after = files::read_router_config(&dir).unwrap();
        assert_eq!(after.inject, Some(inject));
        assert!(after.validate().is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reload_verdicts_from_router_logs() {
        let ok = r#"{"fields":{"message":"listening on 10.0.0.2:53 (udp)"}}
{"fields":{"message":"reload succeeded: 3 -> 4 entries","result":"success"}}"#;
        assert_eq!(reload_verdict(ok), Some(Ok(())));
        let failed = r#"{"fields":{"message":"reload error","error":"cannot listen on 10.0.0.2:10003"}}
{"fields":{"message":"reload failed: the current policy (3 entries) stays in force","result":"failure"}}"#;
        assert_eq!(
            reload_verdict(failed),
            Some(Err(vec!["cannot listen on 10.0.0.2:10003".to_owned()]))
        );
        assert_eq!(reload_verdict("plain text\n{\"fields\":{}}\n"), None);
        // A client's name in a refusal cannot pass for a verdict: only the message and result fields count.
        let spoof = r#"{"fields":{"message":"refused","name":"reload succeeded","result":"x"}}"#;
        assert_eq!(reload_verdict(spoof), None);
    }

    /// conmon rotates a full log by renaming a new file over its path. A verdict written to the old
    /// file just before, or to the new one once it has grown past the mark, is still seen (a reviewer:
    /// reading the path from the mark missed both).
    #[test]
    fn a_verdict_either_side_of_a_rotation_is_seen() {
        let dir = std::env::temp_dir().join(format!("as-logmark-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("router.log");
        let line = |m: &str| format!("2026-12-02T15:00:00.0+00:00 stderr F {m}\n");
        let refused = line(r#"{"fields":{"message":"refused","name":"x.test"}}"#);
        let verdict =
            line(r#"{"fields":{"message":"reload succeeded: 1 -> 2 entries","result":"success"}}"#);
        let rotate = |new: &str| {
            std::fs::write(dir.join("router.log.tmp"), new).unwrap();
            std::fs::rename(dir.join("router.log.tmp"), &path).unwrap();
        };
        let append = |text: &str| {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(text.as_bytes()).unwrap();
        };

        // The verdict in the old file, then a rotation to a new file longer than the mark.
        std::fs::write(&path, refused.repeat(10)).unwrap();
        let mark = LogMark::at(path.clone()).unwrap();
        append(&verdict);
        rotate(&refused.repeat(40));
        assert_eq!(reload_verdict(&mark.messages()), Some(Ok(())));

        // The verdict in the new file, past the old mark's offset.
        std::fs::write(&path, refused.repeat(10)).unwrap();
        let mark = LogMark::at(path.clone()).unwrap();
        rotate(&format!("{}{verdict}", refused.repeat(40)));
        assert_eq!(reload_verdict(&mark.messages()), Some(Ok(())));

        // No rotation: only what follows the mark counts.
        std::fs::write(&path, verdict.clone()).unwrap();
        let mark = LogMark::at(path.clone()).unwrap();
        assert_eq!(reload_verdict(&mark.messages()), None);
        append(&verdict);
        assert_eq!(reload_verdict(&mark.messages()), Some(Ok(())));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reload_verdicts_from_forwarder_logs() {
        let ok = " INFO listening on 127.0.0.4:443 to=10.0.0.2:443\n INFO reloaded: 6 relays, 2 opened, 0 closed\n";
        assert_eq!(forwarder_verdict(ok), Some(Ok(())));
        let refused = " INFO ready: 2 relays\nERROR reload refused, relays unchanged: cannot listen on 127.0.0.4:5432: Address in use (os error 98)\n";
        assert_eq!(
            forwarder_verdict(refused),
            Some(Err(vec![
                "cannot listen on 127.0.0.4:5432: Address in use (os error 98)".to_owned()
            ]))
        );
        let unreadable = "ERROR SIGHUP: reload refused, relays unchanged: cannot read /etc/agent-sandbox-forwarder/relays: x\n";
        assert!(matches!(forwarder_verdict(unreadable), Some(Err(_))));
        // Only the first outcome counts; lines before it that are neither say nothing.
        assert_eq!(
            forwarder_verdict(
                " INFO closed 127.0.0.3:80: no longer relayed (open connections go on)\n"
            ),
            None
        );
        assert_eq!(forwarder_verdict(""), None);
    }

    #[test]
    fn session_entries_extend_the_file() {
        let list = session_allowlist("a.com\n", "f", "b.com\n").unwrap();
        assert_eq!(list.entries().len(), 2);
        let list = session_allowlist("a.com\n", "f", "").unwrap();
        assert_eq!(list.entries().len(), 1);
        let err = session_allowlist("a.com\n1.2.3.4\n", "/home/u/allowed-hosts", "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/home/u/allowed-hosts:2"), "{err}");
    }
}
