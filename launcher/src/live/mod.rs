//! Changing what a running session may reach, from the host: `allow`, `deny`, `reload`, `sessions` and
//! `blocked` (issue 14).
//!
//! These words are subcommands only as the launcher's first argument; anything else still goes to
//! Claude, and `agent-sandbox -- allow` passes `allow` to Claude. The modules: [`edit`] (the allowlist
//! file's text: append with a dated comment, remove whole lines), [`files`] (a session directory's
//! policy files), [`sessions`] (finding running sessions, applying a policy to one: new plan, files
//! replaced by rename, router and forwarder sent SIGHUP, the router's verdict read from its log) and
//! [`blocked`] (refused names, escaped for the terminal).
//!
//! Everything happens on the host, as the user: the sandbox mounts none of these files and has no way
//! to signal its router or forwarder. Validation is the start-up parser's; nothing is written or applied
//! when any entry is invalid.

pub mod blocked;
pub mod edit;
pub mod files;
pub mod lock;
pub mod sessions;

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};

use agent_sandbox_shared::{groups, Allowlist, Policy};

use crate::podman::Podman;
use crate::settings::Settings;
use sessions::Running;

/// The first arguments that start a live command instead of a session.
pub const WORDS: &[&str] = &["allow", "deny", "reload", "sessions", "blocked"];

/// Live allowlist commands for running sessions.
#[derive(Debug, Parser)]
#[command(name = "agent-sandbox", version)]
pub struct LiveCli {
    /// The command.
    #[command(subcommand)]
    pub command: LiveCommand,
}

/// One live command.
#[derive(Debug, Subcommand, PartialEq, Eq)]
pub enum LiveCommand {
    /// Allow entries (`name`, `.domain`, `host:port`, `@group`): append them to the allowlist file and
    /// apply them to every running session of yours.
    Allow {
        /// Apply to this running session only and leave the file unchanged.
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// List the groups (`@name`) and their hosts.
        #[arg(long, conflicts_with_all = ["session", "entries"])]
        groups: bool,
        /// The entries, in allowlist syntax.
        #[arg(value_name = "ENTRY", required_unless_present = "groups")]
        entries: Vec<String>,
    },
    /// Remove entries' lines from the allowlist file and from running sessions' own entries, and say
    /// what else still allows them (relays and connections already open go on).
    Deny {
        /// The entries, as written in the file.
        #[arg(value_name = "ENTRY", required = true)]
        entries: Vec<String>,
    },
    /// Re-read the allowlist file (after a hand edit) and apply it to running sessions.
    Reload,
    /// List your running sessions.
    Sessions {
        /// JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Names the sandbox was refused, per running session.
    Blocked {
        /// Only this session.
        #[arg(value_name = "ID")]
        id: Option<String>,
        /// Print each new refused name as it happens.
        #[arg(long)]
        follow: bool,
        /// With --follow on a terminal: ask whether to allow each new name.
        #[arg(long, requires = "follow")]
        ask: bool,
    },
}

/// `Some` when `argv` (program name first) is a live command: parses and runs it.
#[must_use]
pub fn main_if_live(argv: &[OsString]) -> Option<ExitCode> {
    let first = argv.get(1)?.to_str()?;
    if !WORDS.contains(&first) {
        return None;
    }
    let cli = match LiveCli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return Some(ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)));
        }
    };
    Some(match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-sandbox: {e:#}");
            ExitCode::FAILURE
        }
    })
}

/// Runs one live command.
pub fn run(command: LiveCommand) -> anyhow::Result<()> {
    let podman = Podman::default();
    let settings = Settings::from_env(|k| std::env::var_os(k))?;
    match command {
        LiveCommand::Allow { groups: true, .. } => {
            print!("{}", groups_text());
            Ok(())
        }
        LiveCommand::Allow {
            session: Some(id),
            entries,
            ..
        } => {
            let _lock = lock::acquire(&settings.state_dir, "allowing")?;
            let s = sessions::find(&podman, &id)?;
            allow_session(&podman, &s, &entries)
        }
        LiveCommand::Allow { entries, .. } => {
            let _lock = lock::acquire(&settings.state_dir, "allowing")?;
            allow_file(&podman, &settings, &entries)
        }
        LiveCommand::Deny { entries } => {
            let _lock = lock::acquire(&settings.state_dir, "denying")?;
            deny(&podman, &settings, &entries)
        }
        LiveCommand::Reload => {
            let _lock = lock::acquire(&settings.state_dir, "reloading")?;
            reload(&podman, &settings)
        }
        LiveCommand::Sessions { json } => list_sessions(&podman, json),
        LiveCommand::Blocked { id, follow, ask } => {
            if follow {
                blocked::follow(&podman, id.as_deref(), ask)
            } else {
                blocked::list(&podman, id.as_deref())
            }
        }
    }
}

/// `allow --groups`.
#[must_use]
pub fn groups_text() -> String {
    let mut out = String::new();
    for g in groups::GROUPS {
        out.push_str(&format!("@{}  {}\n", g.name, g.about));
        let width = g.hosts.iter().map(|h| h.entry.len()).max().unwrap_or(0);
        for h in g.hosts {
            out.push_str(&format!("    {:<width$}  {}\n", h.entry, h.why));
        }
    }
    out
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The allowlist file to edit: the real file behind a symlink (a dotfile manager's link stays a link).
fn real_path(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_owned())
}

/// Reads the allowlist file's text (capped like the parser's `load`).
fn read_allowlist(path: &Path) -> anyhow::Result<String> {
    // One bounded read of a regular file, as a session reads it: a FIFO or device is refused, not
    // waited on, and a file that grows past the cap is refused, not read whole.
    let bytes = Allowlist::read(path)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Replaces the allowlist file with `text` (validated), keeping its mode.
fn write_allowlist(path: &Path, text: &str) -> anyhow::Result<()> {
    let path = real_path(path);
    let mode = std::fs::metadata(&path)
        .with_context(|| format!("cannot read allowlist {}", path.display()))?
        .permissions()
        .mode()
        & 0o7777;
    files::replace_file(&path, text, mode, files::Durability::Synced)
}

/// Applies the allowlist text `text` (of file `path`) to every running session started with that file;
/// prints what happened to each. An error when any session could not take it.
fn apply_to_all(podman: &Podman, path: &Path, text: &str) -> anyhow::Result<()> {
    let (all, unreadable) = sessions::running_all(podman)?;
    if all.is_empty() && unreadable.is_empty() {
        println!("no running sessions; new sessions read {}", path.display());
        return Ok(());
    }
    let name = path.display().to_string();
    let targets: Vec<(&Running, anyhow::Result<Allowlist>)> = all
        .iter()
        .filter(|s| sessions::same_file(&s.meta.allowlist, path))
        .map(|s| {
            let extra = files::read_extra(&s.dir)?;
            Ok((s, Ok(sessions::session_allowlist(text, &name, &extra)?)))
        })
        .collect::<anyhow::Result<_>>()?;
    apply_targets(podman, &all, targets, &unreadable)
}

/// Applies each target's policy to its session (a target whose policy could not be had is that
/// session's failure) and prints every running session's outcome; the others are reported as started
/// with another allowlist; those whose directory cannot be read as not reached. An error when any
/// target could not take it, or any session could not be read.
fn apply_targets(
    podman: &Podman,
    all: &[Running],
    targets: Vec<(&Running, anyhow::Result<Allowlist>)>,
    unreadable: &[sessions::Unreadable],
) -> anyhow::Result<()> {
    let mut ready: Vec<(&Running, Allowlist)> = Vec::new();
    let mut unready: Vec<(&Running, anyhow::Error)> = Vec::new();
    for (s, list) in targets {
        match list {
            Ok(list) => ready.push((s, list)),
            Err(e) => unready.push((s, e)),
        }
    }
    let outcomes = sessions::apply_all(podman, &ready);
    let results: Vec<(&Running, Option<anyhow::Result<sessions::Applied>>)> = all
        .iter()
        .map(|s| {
            let applied = ready
                .iter()
                .position(|(t, _)| t.meta.id == s.meta.id)
                .map(|i| {
                    outcomes[i]
                        .as_ref()
                        .map(|a| a.clone())
                        .map_err(|e| anyhow::anyhow!("{e:#}"))
                });
            let outcome = applied.or_else(|| {
                unready
                    .iter()
                    .find(|(t, _)| t.meta.id == s.meta.id)
                    .map(|(_, e)| Err(anyhow::anyhow!("{e:#}")))
            });
            (s, outcome)
        })
        .collect();
    report_results(&results, unreadable)
}

/// Prints each session's outcome (and each session that could not be read, as not reached); an error
/// naming the sessions that failed.
fn report_results(
    results: &[(&Running, Option<anyhow::Result<sessions::Applied>>)],
    unreadable: &[sessions::Unreadable],
) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for u in unreadable {
        println!("session {}: NOT applied: {}", u.id, u.error);
        failed.push(u.id.clone());
    }
    for (s, r) in results {
        let who = format!(
            "session {} ({})",
            s.meta.id,
            blocked::escape(&s.meta.project.display().to_string())
        );
        match r {
            None => println!(
                "{who}: not changed: it was started with another allowlist, {}",
                blocked::escape(&s.meta.allowlist.display().to_string())
            ),
            Some(Ok(a)) => println!(
                "{who}: applied in {} ms ({} entries in force)",
                a.took.as_millis(),
                a.entries
            ),
            Some(Err(e)) => {
                println!("{who}: NOT applied: {e:#}");
                failed.push(s.meta.id.clone());
            }
        }
    }
    let _ = std::io::stdout().flush();
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("the change did not reach session(s) {}", failed.join(", "))
    }
}

/// `allow ENTRY...`: appended to the file, applied to every running session using it.
pub fn allow_file(podman: &Podman, settings: &Settings, entries: &[String]) -> anyhow::Result<()> {
    let entries = edit::validate_args(entries)?;
    let path = &settings.allowlist;
    // Before the first session there is no file yet: start it from the default, as a session does.
    // Not when a running session was started from it (moved or deleted since): the default would
    // then reach that session, allowing what its user never chose.
    if std::fs::symlink_metadata(path).is_err() {
        let using: Vec<String> = sessions::running(podman)?
            .into_iter()
            .filter(|s| sessions::same_file(&s.meta.allowlist, path))
            .map(|s| s.meta.id)
            .collect();
        if !using.is_empty() {
            bail!(
                "the allowlist {} is gone, but running session(s) {} started from it: put it back \
                 (then `agent-sandbox allow` again); it is not re-created from the default, which \
                 would change what those sessions allow",
                path.display(),
                using.join(", ")
            );
        }
        crate::session::ensure_allowlist(path)?;
    }
    let text = read_allowlist(path)?;
    let (new_text, added) = edit::append(&text, &entries, &edit::utc_date(now_secs()));
    let name = path.display().to_string();
    // The whole new file must parse: a file broken by a hand edit is reported, not half-applied.
    Allowlist::parse(&new_text, &name)?;
    if added.is_empty() {
        println!("already in {name}: {}", entries.join(" "));
    } else {
        write_allowlist(path, &new_text)?;
        println!("added to {name}: {}", added.join(" "));
    }
    apply_to_all(podman, path, &new_text)
}

/// `allow --session ID ENTRY...`: that session only; the file is unchanged.
pub fn allow_session(podman: &Podman, s: &Running, entries: &[String]) -> anyhow::Result<()> {
    let entries = edit::validate_args(entries)?;
    let extra = files::read_extra(&s.dir)?;
    let (new_extra, added) = edit::append(&extra, &entries, &edit::utc_date(now_secs()));
    let path = &s.meta.allowlist;
    let name = path.display().to_string();
    let list = sessions::session_allowlist(&read_allowlist(path)?, &name, &new_extra)?;
    files::write_extra(&s.dir, &new_extra)?;
    if !added.is_empty() {
        println!("added for session {} only: {}", s.meta.id, added.join(" "));
    }
    let r = sessions::apply_all(podman, &[(s, list)]).pop();
    report_results(&[(s, r)], &[])
}

/// A running session as `deny` sees it: its own entries without the denied ones, and the allowlist
/// text its policy is built on.
struct DenySession<'a> {
    /// The session.
    s: &'a Running,
    /// Its own entries (`allow --session`) with the denied lines removed.
    own: edit::Removal,
    /// `None` when it was started with the file `deny` edits (its new text applies); else the text of
    /// the other allowlist it was started with, or why that cannot be read.
    other: Option<anyhow::Result<String>>,
}

impl DenySession<'_> {
    /// Whether `deny` gives this session a new policy: it was started with the file `deny` edits and
    /// that file lost a line, or its own entries changed. Not a session whose file `deny` leaves as it
    /// is: a line edited out by hand and not yet reloaded is still in force there.
    fn reapplied(&self, file: &edit::Removal) -> bool {
        (self.other.is_none() && file.lines > 0) || self.own.lines > 0
    }

    /// The policies the session's router may hold after the deny: the new one for a session that is
    /// re-applied; for any other, the one last confirmed in force and the one last written (a live
    /// change the router refused or did not confirm leaves them different), not what its allowlist
    /// file says now, which may have changed since without a reload.
    fn policies_after(&self, file: &edit::Removal, file_name: &str) -> anyhow::Result<Vec<Policy>> {
        if self.reapplied(file) {
            return Ok(vec![Policy::new(&self.allowlist(&file.text, file_name)?)]);
        }
        files::read_possibly_in_force(&self.s.dir)?
            .into_iter()
            .map(|config| {
                config
                    .validate()
                    .map(|valid| valid.rules.policy)
                    .map_err(|e| anyhow::anyhow!("its router configuration is not valid: {e}"))
            })
            .collect()
    }

    /// The session's policy after the deny: its allowlist's text (`file_text` for the file `deny`
    /// edits) plus its remaining own entries, parsed as a live change parses it.
    fn allowlist(&self, file_text: &str, file_name: &str) -> anyhow::Result<Allowlist> {
        match &self.other {
            None => sessions::session_allowlist(file_text, file_name, &self.own.text),
            Some(Ok(text)) => sessions::session_allowlist(
                text,
                &self.s.meta.allowlist.display().to_string(),
                &self.own.text,
            ),
            Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
        }
    }
}

/// `deny ENTRY...`: the lines that are exactly the entries removed from the file and from every running
/// session's own entries, and applied to the sessions that changed; then each denied entry is checked
/// again against the file's and every session's resulting policy (the router's own [`Policy`]).
/// Whatever still allows one (a wildcard, a group, a host:port line, another allowlist a session was
/// started with) is named with where it is, and the command fails: it never says a name is refused
/// while a policy in force still allows it. Nothing is written when no line matches anywhere.
pub fn deny(podman: &Podman, settings: &Settings, entries: &[String]) -> anyhow::Result<()> {
    let entries = edit::validate_args(entries)?;
    let path = &settings.allowlist;
    let name = path.display().to_string();
    let text = read_allowlist(path)?;
    let file = edit::remove(&text, &entries);
    let file_list = Allowlist::parse(&file.text, &name)?;
    let (all, unreadable) = sessions::running_all(podman)?;
    // Everything is read before anything is written: the sessions' own entries go too, or a denied
    // name would stay allowed where it was allowed once (`reload` keeps them).
    let mut denied: Vec<DenySession<'_>> = Vec::new();
    for s in &all {
        let own = edit::remove(&files::read_extra(&s.dir)?, &entries);
        let other = (!sessions::same_file(&s.meta.allowlist, path)).then(|| {
            read_allowlist(&s.meta.allowlist)
                .with_context(|| format!("session {} was started with that allowlist", s.meta.id))
        });
        denied.push(DenySession { s, own, other });
    }

    let mut problems = deny_problems(&entries, &file, &file_list, &name, &denied);
    // A running session whose directory cannot be read may allow anything: never "refused" then.
    for u in &unreadable {
        for e in &entries {
            problems.push(edit::DenyProblem::Unchecked {
                name: e.clone(),
                id: u.id.clone(),
                error: u.error.clone(),
            });
        }
    }
    let removed_anywhere = file.lines > 0 || denied.iter().any(|d| d.own.lines > 0);
    if !removed_anywhere {
        for p in &problems {
            eprintln!("agent-sandbox: {p}");
        }
        bail!("nothing was changed");
    }

    for d in denied.iter().filter(|d| d.own.lines > 0) {
        files::write_extra(&d.s.dir, &d.own.text)?;
    }
    if file.lines > 0 {
        write_allowlist(path, &file.text)?;
        println!(
            "removed {} line{} from {name}",
            file.lines,
            if file.lines == 1 { "" } else { "s" }
        );
    }
    for d in denied.iter().filter(|d| d.own.lines > 0) {
        println!(
            "removed {} of session {}'s own entr{}",
            d.own.lines,
            d.s.meta.id,
            if d.own.lines == 1 { "y" } else { "ies" }
        );
    }
    let applied = if all.is_empty() && unreadable.is_empty() {
        println!("no running sessions; new sessions read {name}");
        Ok(())
    } else {
        // Every session started with the file, and any other whose own entries changed.
        let targets: Vec<(&Running, anyhow::Result<Allowlist>)> = denied
            .iter()
            .filter(|d| d.reapplied(&file))
            .map(|d| (d.s, d.allowlist(&file.text, &name)))
            .collect();
        apply_targets(podman, &all, targets, &unreadable)
    };
    // The names some policy in force still allows, in order, once each.
    let mut still: Vec<&str> = Vec::new();
    for p in &problems {
        if let Some(n) = p.still_allowed() {
            if !still.contains(&n) {
                still.push(n);
            }
        }
    }
    if applied.is_ok() && still.is_empty() {
        println!(
            "new lookups and connections are refused, relays and connections already open go on until they close"
        );
        // A wildcard's names that lines of their own still allow: not a failure (each is a line the
        // user wrote), but "refused" must not read as covering them.
        for e in &entries {
            let mut kept: Vec<String> = edit::kept_below(&file.text, e)
                .into_iter()
                .map(|(by, line)| format!("`{by}` ({name} line {line})"))
                .collect();
            for d in &denied {
                kept.extend(
                    edit::kept_below(&d.own.text, e)
                        .into_iter()
                        .map(|(by, _)| format!("`{by}` (session {}'s own entry)", d.s.meta.id)),
                );
            }
            if !kept.is_empty() {
                println!(
                    "note: these lines under `{}` are lines of their own and still allow their names: {}",
                    e.trim_start_matches('.'),
                    kept.join(", ")
                );
            }
        }
    }
    for p in &problems {
        eprintln!("agent-sandbox: {p}");
    }
    applied?;
    if !still.is_empty() {
        bail!(
            "not refused: {} still allowed (see above)",
            still
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !problems.is_empty() {
        bail!("the other entries' lines were removed");
    }
    Ok(())
}

/// What stands between each denied entry and its refusal, after the lines are removed: the lines of the
/// file (`file`, parsed as `file_list`) and of each session's policy that still allow it, checked with
/// the router's [`Policy`] as a whole and then line by line to say which; and the entries that had no
/// line anywhere and are allowed nowhere.
fn deny_problems(
    entries: &[String],
    file: &edit::Removal,
    file_list: &Allowlist,
    name: &str,
    denied: &[DenySession<'_>],
) -> Vec<edit::DenyProblem> {
    use edit::{DenyProblem, Place};
    let file_policy = Policy::new(file_list);
    let mut problems = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let before = problems.len();
        let in_file = edit::allowing(&file.text, e);
        if !edit::still_allowed(&file_policy, e).is_empty() {
            problems.extend(in_file.iter().map(|a| DenyProblem::StillAllowed {
                allowing: a.clone(),
                place: Place::File(name.to_owned()),
            }));
        }
        for d in denied {
            let id = &d.s.meta.id;
            let policies = match d.policies_after(file, name) {
                Ok(policies) => policies,
                Err(err) => {
                    // A session whose policy cannot be had cannot be said to refuse the name.
                    problems.push(DenyProblem::Unchecked {
                        name: e.clone(),
                        id: id.clone(),
                        error: format!("{err:#}"),
                    });
                    continue;
                }
            };
            let mut names: Vec<String> = Vec::new();
            for policy in &policies {
                for n in edit::still_allowed(policy, e) {
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
            if names.is_empty() {
                continue;
            }
            let mut explained = d.other.is_none() && !in_file.is_empty();
            let mut add = |text: &str, place: Place| {
                for a in edit::allowing(text, e) {
                    explained = true;
                    problems.push(DenyProblem::StillAllowed {
                        allowing: a,
                        place: place.clone(),
                    });
                }
            };
            if let Some(Ok(other)) = &d.other {
                add(
                    other,
                    Place::SessionFile {
                        id: id.clone(),
                        path: blocked::escape(&d.s.meta.allowlist.display().to_string()),
                    },
                );
            }
            add(&d.own.text, Place::Session(id.clone()));
            if !explained {
                problems.extend(
                    names
                        .into_iter()
                        .map(|n| DenyProblem::StillAllowedUnexplained {
                            name: n,
                            id: id.clone(),
                        }),
                );
            }
        }
        let found = file.found[i] || denied.iter().any(|d| d.own.found[i]);
        if problems.len() == before && !found {
            problems.push(DenyProblem::NotListed(e.clone()));
        }
    }
    problems
}

/// `reload`: the file re-read and applied; invalid lines are reported and nothing is applied.
pub fn reload(podman: &Podman, settings: &Settings) -> anyhow::Result<()> {
    let path = &settings.allowlist;
    let text = read_allowlist(path)?;
    let list = Allowlist::parse(&text, &path.display().to_string())?;
    for w in list.warnings() {
        eprintln!("agent-sandbox: warning: {}:{w}", path.display());
    }
    apply_to_all(podman, path, &text)
}

/// One line of `sessions --json`.
#[derive(Debug, serde::Serialize)]
struct SessionInfo {
    /// The session id.
    id: String,
    /// The project directory.
    project: PathBuf,
    /// Start, seconds since the epoch.
    started: u64,
    /// Start, as `YYYY-MM-DD HH:MM UTC`.
    started_utc: String,
    /// The allowlist file it was started with.
    allowlist: PathBuf,
    /// Hosts, wildcards and host:port entries in force.
    entries: usize,
    /// Refused requests so far.
    refusals: usize,
}

/// `sessions [--json]`.
fn list_sessions(podman: &Podman, json: bool) -> anyhow::Result<()> {
    let mut infos = Vec::new();
    for s in sessions::running(podman)? {
        let config = files::read_router_config(&s.dir)?;
        let refusals = blocked::refusals(podman, &s)?
            .values()
            .map(|r| r.count)
            .sum();
        infos.push(SessionInfo {
            id: s.meta.id.clone(),
            project: s.meta.project.clone(),
            started: s.meta.started,
            started_utc: edit::utc_date(s.meta.started),
            allowlist: s.meta.allowlist.clone(),
            entries: config.hosts.len() + config.subdomains.len() + config.forwards.len(),
            refusals,
        });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&infos)?);
        return Ok(());
    }
    if infos.is_empty() {
        println!("no running sessions");
        return Ok(());
    }
    println!(
        "{:<12}  {:<20}  {:>7}  {:>7}  PROJECT",
        "ID", "STARTED", "ENTRIES", "REFUSED"
    );
    for i in &infos {
        println!(
            "{:<12}  {:<20}  {:>7}  {:>7}  {}",
            i.id,
            i.started_utc,
            i.entries,
            i.refusals,
            blocked::escape(&i.project.display().to_string())
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Option<Result<LiveCommand, String>> {
        let argv: Vec<OsString> = std::iter::once("agent-sandbox")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let first = argv.get(1)?.to_str()?;
        if !WORDS.contains(&first) {
            return None;
        }
        Some(
            LiveCli::try_parse_from(&argv)
                .map(|c| c.command)
                .map_err(|e| e.to_string()),
        )
    }

    #[test]
    fn verify_definition() {
        use clap::CommandFactory as _;
        LiveCli::command().debug_assert();
    }

    /// `allow`, `deny` and `reload` read the allowlist as a session does: a file past the cap and a FIFO
    /// are refused (the FIFO without waiting for a writer), a regular file read whole.
    #[test]
    fn the_allowlist_is_read_bounded_and_never_waited_on() {
        let dir = std::env::temp_dir().join(format!("as-live-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(agent_sandbox_shared::allowlist::MAX_ALLOWLIST_BYTES + 1)
            .unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let fine = dir.join("fine");
        std::fs::write(&fine, "a.example\n").unwrap();
        let (big, fifo, fine) = (
            read_allowlist(&big).map_err(|e| format!("{e:#}")),
            read_allowlist(&fifo).map_err(|e| format!("{e:#}")),
            read_allowlist(&fine).map_err(|e| format!("{e:#}")),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            big.as_ref().is_err_and(|e| e.contains("larger than")),
            "{big:?}"
        );
        assert!(
            fifo.as_ref()
                .is_err_and(|e| e.contains("not a regular file")),
            "{fifo:?}"
        );
        assert_eq!(fine.as_deref(), Ok("a.example\n"));
    }

    #[test]
    fn live_words_only_as_the_first_argument() {
        // Claude's: after `--`, after another argument, or not a live word.
        for args in [
            &["--", "allow", "x.com"][..],
            &["--continue", "allow"],
            &["resume"],
            &[],
        ] {
            assert!(parse(args).is_none(), "{args:?}");
        }
        assert_eq!(
            parse(&["allow", "a.com", ".b.com"]).unwrap().unwrap(),
            LiveCommand::Allow {
                session: None,
                groups: false,
                entries: vec!["a.com".into(), ".b.com".into()]
            }
        );
        assert_eq!(
            parse(&["allow", "--session", "0123", "a.com"])
                .unwrap()
                .unwrap(),
            LiveCommand::Allow {
                session: Some("0123".into()),
                groups: false,
                entries: vec!["a.com".into()]
            }
        );
        assert!(matches!(
            parse(&["allow", "--groups"]).unwrap().unwrap(),
            LiveCommand::Allow { groups: true, .. }
        ));
        assert_eq!(
            parse(&["blocked", "abc", "--follow", "--ask"])
                .unwrap()
                .unwrap(),
            LiveCommand::Blocked {
                id: Some("abc".into()),
                follow: true,
                ask: true
            }
        );
        assert_eq!(
            parse(&["sessions", "--json"]).unwrap().unwrap(),
            LiveCommand::Sessions { json: true }
        );
        assert_eq!(parse(&["reload"]).unwrap().unwrap(), LiveCommand::Reload);
        for bad in [
            &["allow"][..],
            &["deny"],
            &["blocked", "--ask"],
            &["allow", "--groups", "a.com"],
            &["reload", "extra"],
        ] {
            assert!(parse(bad).unwrap().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn groups_are_listed_with_their_hosts() {
        let text = groups_text();
        for needle in [
            "@anthropic",
            "platform.claude.com",
            "@pypi",
            "files.pythonhosted.org",
            "@github",
            "@npm",
            "@crates",
            "@debian",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }
}
