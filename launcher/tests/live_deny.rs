//! The real `agent-sandbox` binary's `allow --session` and `deny` against a running session that a
//! stand-in `podman` (a shell script first on PATH) pretends to run: `ps` lists the session's router,
//! `container inspect` names a log file, `kill --signal 1` appends the router's "reload succeeded" line
//! to the router's and the forwarder's "reloaded" line to the forwarder's. Everything else is real: the allowlist file, the session directory under `XDG_RUNTIME_DIR`
//! (made from the shared crate's plan, as a session start makes it), the files the launcher rewrites
//! there, and its messages and exit codes. What podman and the router do with the files is the
//! end-to-end suite's business (`tests/e2e/scenarios/live.rs`); these check that `deny` never says a
//! name is refused while the policy it wrote still allows it.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use agent_sandbox::live::files::SessionMeta;
use agent_sandbox::liveness;
use agent_sandbox::podman::{LABEL_BOOT, LABEL_PID, LABEL_SESSION, LABEL_SESSION_DIR, LABEL_START};
use agent_sandbox_shared::{Allowlist, HostName, Policy, RouterConfig, SessionPlan};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_agent-sandbox");

/// The session every test runs.
const ID: &str = "0123456789ab";

/// The stand-in podman: only the commands a live change runs, anything else fails loudly.
const PODMAN: &str = r#"#!/bin/sh
logs="$(dirname "$0")/../logs"
printf '%s\n' "$*" >> "$logs/calls"
case "$1" in
ps)
    # A test's marker: this one listing is slow (a change caught half-way through).
    if rm "$logs/slow-ps" 2>/dev/null; then sleep 2; fi
    cat "$logs/ps.json" ;;
container)
    # container inspect --format ... NAME
    for last in "$@"; do :; done
    : >> "$logs/$last.log"
    printf '%s\n' "$logs/$last.log" ;;
kill)
    shift 3
    for name in "$@"; do
        case "$name" in
        *-router)
            if [ -e "$logs/refuse" ]; then
                printf '%s\n' '2026-12-02T00:00:00.000000000+00:00 stderr F {"fields":{"message":"reload failed: the current policy (2 entries) stays in force","result":"failure"}}' >> "$logs/$name.log"
            else
                printf '%s\n' '2026-12-02T00:00:00.000000000+00:00 stderr F {"fields":{"message":"reload succeeded: 1 -> 1 entries","result":"success"}}' >> "$logs/$name.log"
            fi ;;
        *-forwarder)
            if [ -e "$logs/forwarder-refuse" ]; then
                printf '%s\n' '2026-12-02T00:00:00.000000000+00:00 stderr F ERROR reload refused, relays unchanged: cannot listen on 127.0.0.3:5432: Address in use (os error 98)' >> "$logs/$name.log"
            else
                printf '%s\n' '2026-12-02T00:00:00.000000000+00:00 stderr F  INFO reloaded: 4 relays, 0 opened, 0 closed' >> "$logs/$name.log"
            fi ;;
        esac
    done ;;
logs) ;;
*) echo "stand-in podman: unexpected: $*" >&2; exit 125 ;;
esac
"#;

/// A scratch home, runtime directory, allowlist file and stand-in podman; removed on drop.
struct Live {
    /// Everything lives below it.
    root: PathBuf,
}

impl Live {
    /// A scratch set-up whose allowlist file holds `file`, and one running session started with it
    /// (no own entries).
    fn new(name: &str, file: &str) -> Live {
        let root = std::env::temp_dir().join(format!("as-live-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for d in ["home", "bin", "logs", "runtime/agent-sandbox"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for d in ["runtime", "runtime/agent-sandbox"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o700)).unwrap();
        }
        fs::write(root.join("bin/podman"), PODMAN).unwrap();
        fs::set_permissions(root.join("bin/podman"), fs::Permissions::from_mode(0o755)).unwrap();
        let live = Live { root };
        fs::write(live.allowlist(), file).unwrap();
        live.start_session(&live.allowlist(), file);
        live
    }

    fn allowlist(&self) -> PathBuf {
        self.root.join("home/allowed-hosts")
    }

    fn session_dir(&self) -> PathBuf {
        self.root
            .join(format!("runtime/agent-sandbox/agent-sandbox-{ID}"))
    }

    /// The session directory a session start with `allowlist` (holding `file`) leaves (plan from the file's policy, its meta), and the
    /// router container `podman ps` lists, labelled as belonging to this live process.
    fn start_session(&self, allowlist: &Path, file: &str) {
        self.start_session_labelled(allowlist, file, true);
    }

    /// [`Live::start_session`], with the session directory's label on the router or (as an older
    /// launcher started it) without.
    fn start_session_labelled(&self, allowlist: &Path, file: &str, dir_label: bool) {
        let dir = self.session_dir();
        for d in ["router", "forwarder"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        // As a session start makes it: this user's, no one else's.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let router_ip = Ipv4Addr::new(10, 89, 0, 2);
        let policy = Policy::new(&Allowlist::parse(file, "t").unwrap());
        let plan = SessionPlan::new(&policy, router_ip).unwrap();
        fs::write(dir.join("router/router.toml"), plan.router.to_toml()).unwrap();
        fs::write(dir.join("forwarder/relays"), plan.relays_file()).unwrap();
        fs::write(dir.join("plan-state.json"), plan.state.to_json()).unwrap();
        let meta = SessionMeta {
            id: ID.into(),
            project: self.root.join("home/project"),
            started: 1_796_035_844,
            allowlist: allowlist.to_owned(),
            router_ip,
        };
        fs::write(
            dir.join("session.json"),
            serde_json::to_string(&meta).unwrap(),
        )
        .unwrap();
        let pid = std::process::id();
        let mut labels = serde_json::json!({
            LABEL_SESSION: ID,
            LABEL_PID: pid.to_string(),
            LABEL_START: liveness::start_time(pid).unwrap().to_string(),
            LABEL_BOOT: liveness::boot_id().unwrap(),
        });
        if dir_label {
            labels[LABEL_SESSION_DIR] = dir.display().to_string().into();
        }
        let ps = serde_json::json!([{
            "Names": [format!("agent-sandbox-{ID}-router")],
            "Labels": labels,
        }]);
        fs::write(self.root.join("logs/ps.json"), ps.to_string()).unwrap();
    }

    /// `agent-sandbox ARGS` with the stand-in podman first on PATH.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(&self.allowlist(), args)
    }

    /// [`Live::run`] with `AGENT_SANDBOX_ALLOWLIST` set to `allowlist`.
    fn run_with(&self, allowlist: &Path, args: &[&str]) -> Output {
        self.command(allowlist, args).output().unwrap()
    }

    /// The command [`Live::run_with`] runs.
    fn command(&self, allowlist: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(LAUNCHER);
        command
            .args(args)
            .current_dir(&self.root)
            .env_clear()
            .env("HOME", self.root.join("home"))
            .env("XDG_RUNTIME_DIR", self.root.join("runtime"))
            .env("AGENT_SANDBOX_ALLOWLIST", allowlist)
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.root.join("bin").display()),
            );
        command
    }

    fn file(&self) -> String {
        fs::read_to_string(self.allowlist()).unwrap()
    }

    fn own_entries(&self) -> String {
        fs::read_to_string(self.session_dir().join("session-allowlist")).unwrap_or_default()
    }

    /// Whether the router configuration last written for the session allows `name`, by the policy
    /// the router's own validation compiles from it.
    fn session_allows(&self, name: &str) -> bool {
        let text = fs::read_to_string(self.session_dir().join("router/router.toml")).unwrap();
        RouterConfig::from_toml(&text)
            .unwrap()
            .validate()
            .unwrap()
            .rules
            .policy
            .allows(&HostName::parse(name).unwrap())
    }

    /// How many SIGHUPs the stand-in podman was asked to send.
    fn reloads(&self) -> usize {
        fs::read_to_string(self.root.join("logs/calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("kill --signal 1 "))
            .count()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn allow_session(live: &Live, entry: &str) {
    let o = live.run(&["allow", "--session", ID, entry]);
    assert!(o.status.success(), "allow --session: {}", text(&o));
    assert!(live.own_entries().contains(entry), "{}", live.own_entries());
    assert!(live.session_allows(entry.trim_start_matches('.')));
}

/// (a) A name allowed with `allow --session` only: `deny` takes it out of the session's own entries
/// and applies that, instead of giving up because the file has no such line.
#[test]
fn deny_takes_back_an_allow_session() {
    let live = Live::new("a", "api.anthropic.com\n");
    allow_session(&live, "evil.example");
    let reloads = live.reloads();
    let o = live.run(&["deny", "evil.example"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(&format!("removed 1 of session {ID}'s own entry")),
        "{out}"
    );
    assert!(
        out.contains("new lookups and connections are refused"),
        "{out}"
    );
    assert!(out.contains("applied in"), "{out}");
    assert!(!live.own_entries().contains("evil.example"));
    assert!(!live.session_allows("evil.example"), "{out}");
    assert!(live.session_allows("api.anthropic.com"));
    assert_eq!(live.reloads(), reloads + 1);
    assert_eq!(live.file(), "api.anthropic.com\n");
}

/// (b) A name with a line of its own and a wildcard over it in the file: the line goes, and `deny`
/// says the wildcard still allows the name instead of claiming it is refused.
#[test]
fn deny_says_a_wildcard_in_the_file_still_allows_the_name() {
    let live = Live::new("b", "api.anthropic.com\nx.example.com\n.example.com\n");
    let o = live.run(&["deny", "x.example.com"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(out.contains("removed 1 line from"), "{out}");
    assert!(
        out.contains(&format!(
            "`x.example.com` is still allowed by `.example.com` ({} line 2)",
            live.allowlist().display()
        )),
        "{out}"
    );
    assert!(
        out.contains("not refused: `x.example.com` still allowed"),
        "{out}"
    );
    assert_eq!(live.file(), "api.anthropic.com\n.example.com\n");
    // The removal was applied; the wildcard is left for the user to decide on.
    assert!(out.contains("applied in"), "{out}");
    assert!(live.session_allows("x.example.com"));
}

/// (c) As (b), with the wildcard among the session's own entries: named with the session.
#[test]
fn deny_says_a_session_wildcard_still_allows_the_name() {
    let live = Live::new("c", "api.anthropic.com\nx.example.com\n");
    allow_session(&live, ".example.com");
    let o = live.run(&["deny", "x.example.com"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(
        out.contains(&format!(
            "`x.example.com` is still allowed in session {ID} by its own entry `.example.com`"
        )),
        "{out}"
    );
    assert!(
        out.contains("`agent-sandbox deny .example.com` removes it"),
        "{out}"
    );
    assert_eq!(live.file(), "api.anthropic.com\n");
    assert!(live.own_entries().contains(".example.com"));
    assert!(live.session_allows("x.example.com"));
    // Following the advice takes it away.
    let o = live.run(&["deny", ".example.com"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!live.session_allows("x.example.com"));
}

/// (d) A name allowed on 80 and 443 only through its host:port line: `deny NAME` names that line
/// instead of saying the name is not on the allowlist, and changes nothing.
#[test]
fn deny_says_a_host_port_line_allows_its_host() {
    let file = "api.anthropic.com\ndb.com:5432\n";
    let live = Live::new("d", file);
    let o = live.run(&["deny", "db.com"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(!out.contains("not on the allowlist"), "{out}");
    assert!(
        out.contains(&format!(
            "`db.com` is still allowed by `db.com:5432` ({} line 2, which allows `db.com` on ports 80 and 443 too)",
            live.allowlist().display()
        )),
        "{out}"
    );
    assert!(out.contains("nothing was changed"), "{out}");
    assert_eq!(live.file(), file);
    assert_eq!(live.reloads(), 0);
    assert!(live.session_allows("db.com"));
}

/// Exact lines in the file and in the session's own entries both go, and then it is refused.
#[test]
fn deny_removes_the_name_from_the_file_and_the_session() {
    let live = Live::new("both", "api.anthropic.com\n# mine\nboth.example\n");
    allow_session(&live, "both.example");
    let o = live.run(&["deny", "both.example"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("removed 1 line from"), "{out}");
    assert!(
        out.contains("new lookups and connections are refused"),
        "{out}"
    );
    assert_eq!(live.file(), "api.anthropic.com\n# mine\n");
    assert!(!live.own_entries().contains("both.example"));
    assert!(!live.session_allows("both.example"));
    // Denied again: nowhere any more.
    let o = live.run(&["deny", "both.example"]);
    assert!(
        !o.status.success() && text(&o).contains("`both.example` is not on the allowlist"),
        "{}",
        text(&o)
    );
}

/// A session started with another allowlist that allows the name: named with that file and line.
#[test]
fn deny_names_the_other_allowlist_a_session_was_started_with() {
    let live = Live::new("other", "api.anthropic.com\nx.example.com\n");
    let other = live.root.join("home/other-hosts");
    fs::write(&other, "api.anthropic.com\n.example.com\n").unwrap();
    live.start_session(&other, "api.anthropic.com\n.example.com\n");
    let o = live.run(&["deny", "x.example.com"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(
        out.contains(&format!(
            "`x.example.com` is still allowed in session {ID} by `.example.com` ({} line 2, the allowlist that session was started with)",
            other.display()
        )),
        "{out}"
    );
    assert!(
        out.contains("not changed: it was started with another allowlist"),
        "{out}"
    );
    assert_eq!(live.file(), "api.anthropic.com\n");
}

/// A session started with another allowlist that was edited since without a reload: its router still
/// holds the old policy, and that is what `deny` checks (reviewer D: it read the edited file and said
/// "refused" while the session still allowed the name).
#[test]
fn deny_checks_a_session_against_the_policy_its_router_holds() {
    let live = Live::new("stale", "api.anthropic.com\nx.example.com\n");
    let other = live.root.join("home/other-hosts");
    fs::write(&other, "api.anthropic.com\nx.example.com\n").unwrap();
    live.start_session(&other, "api.anthropic.com\nx.example.com\n");
    // Edited by hand afterwards, not reloaded.
    fs::write(&other, "api.anthropic.com\n").unwrap();
    let o = live.run(&["deny", "x.example.com"]);
    let out = text(&o);
    assert!(live.session_allows("x.example.com"), "the session's router");
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(
        out.contains(&format!("`x.example.com` is still allowed in session {ID}")),
        "{out}"
    );
    assert_eq!(live.file(), "api.anthropic.com\n");
}

/// Denying a wildcard leaves the narrower lines under it (each a line of its own) allowing their names:
/// a success, with a note naming them, so that "refused" does not read as covering them.
#[test]
fn deny_of_a_wildcard_names_the_lines_under_it_that_stay() {
    let live = Live::new(
        "under",
        "api.anthropic.com\n.example.com\n.sub.example.com\nwww.example.com\nnotexample.com\n",
    );
    allow_session(&live, "api.example.com");
    let o = live.run(&["deny", ".example.com"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("connections are refused"), "{out}");
    let file = live.allowlist().display().to_string();
    assert!(
        out.contains(&format!(
            "note: these lines under `example.com` are lines of their own and still allow their names: `.sub.example.com` ({file} line 2), `www.example.com` ({file} line 3), `api.example.com` (session {ID}'s own entry)"
        )),
        "{out}"
    );
    assert!(!out.contains("`notexample.com`"), "{out}");
    assert!(!live.session_allows("other.example.com"));
    assert!(live.session_allows("www.example.com"));
}

/// A live change the router refused leaves its configuration file holding a policy the router does not
/// hold: `deny` then counts what the router last confirmed too (reviewer E: after a refused `reload`,
/// deny read the refused file and said "refused" while the router kept the name).
#[test]
fn deny_counts_the_policy_a_refused_reload_left_in_force() {
    let live = Live::new("refusedreload", "api.anthropic.com\nevil.example\n");
    let other = live.root.join("home/other-hosts");
    fs::write(&other, "api.anthropic.com\nevil.example\n").unwrap();
    live.start_session(&other, "api.anthropic.com\nevil.example\n");
    fs::write(&other, "api.anthropic.com\n").unwrap();
    fs::write(live.root.join("logs/refuse"), "").unwrap();
    let o = live.run_with(&other, &["reload"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("NOT applied"), "{}", text(&o));
    // The file as last written lacks the name; the router keeps the policy it started with.
    assert!(!live.session_allows("evil.example"));
    fs::remove_file(live.root.join("logs/refuse")).unwrap();
    let o = live.run(&["deny", "evil.example"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(
        out.contains(&format!("`evil.example` is still allowed in session {ID}")),
        "{out}"
    );
}

/// The forwarder could not open a new relay (a process in the sandbox holds its address): the router
/// took the policy, but `allow` must not say "applied", because the new name's address has no relay
/// (an auditor: only the router's verdict was read, so this printed "applied in N ms").
#[test]
fn allow_reports_a_forwarder_that_refused_the_new_relays() {
    let live = Live::new("fwdrefuse", "api.anthropic.com\n");
    fs::write(live.root.join("logs/forwarder-refuse"), "").unwrap();
    let o = live.run(&["allow", "--session", ID, "db.example:5432"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(!out.contains("applied in"), "{out}");
    assert!(out.contains("NOT applied"), "{out}");
    assert!(
        out.contains("the forwarder refused the new relays and keeps the old ones: cannot listen on 127.0.0.3:5432"),
        "{out}"
    );
    assert!(out.contains("`agent-sandbox reload` tries again"), "{out}");
    // Once the address is free, the same change goes through.
    fs::remove_file(live.root.join("logs/forwarder-refuse")).unwrap();
    let o = live.run(&["reload"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("applied in"), "{}", text(&o));
}

/// `allow` before the first session: there is no allowlist file yet, so it starts one from the
/// default, as a session start does, and adds the entry to it (an auditor: it failed with "cannot
/// read allowlist").
#[test]
fn allow_before_any_allowlist_starts_one_from_the_default() {
    let live = Live::new("nofile", "api.anthropic.com\n");
    fs::remove_file(live.allowlist()).unwrap();
    // No session running (one started from the file keeps it from being re-created: below).
    fs::write(live.root.join("logs/ps.json"), "[]").unwrap();
    let o = live.run(&["allow", "extra.example"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("no allowlist yet: created"), "{out}");
    let file = live.file();
    assert!(file.contains("@anthropic"), "{file}");
    assert!(file.trim_end().ends_with("extra.example"), "{file}");
}

/// A missing allowlist that a running session was started from is not re-created from the default:
/// the default's names would reach that session (reviewer F).
#[test]
fn allow_does_not_recreate_an_allowlist_a_running_session_uses() {
    let live = Live::new("gone", "api.anthropic.com\n");
    fs::rename(live.allowlist(), live.root.join("home/allowed-hosts.bak")).unwrap();
    let reloads = live.reloads();
    let o = live.run(&["allow", "extra.example"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("is gone, but running session(s) 0123456789ab"),
        "{out}"
    );
    assert!(!live.allowlist().exists());
    assert_eq!(live.reloads(), reloads);
    assert!(!live.session_allows("claude.ai"));
}

/// `allow` and `deny` at once take turns (reviewer N): an `allow` still waiting for podman applied the
/// text it had read before the `deny`, which put the denied name back into the running session while
/// `deny` said it was refused. Now the second command waits for the first, and reads the file after it.
#[test]
fn allow_and_deny_at_once_take_turns() {
    let live = Live::new("turns", "api.anthropic.com\nx.example\n");
    let marker = live.root.join("logs/slow-ps");
    fs::write(&marker, "").unwrap();
    let allow = live
        .command(&live.allowlist(), &["allow", "y.example"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The allow is half-way: its file written, its listing of the sessions under way.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "allow never listed the sessions"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let deny = live.run(&["deny", "x.example"]);
    let allow = allow.wait_with_output().unwrap();
    assert!(allow.status.success(), "allow: {}", text(&allow));
    assert!(deny.status.success(), "deny: {}", text(&deny));
    assert!(
        text(&deny).contains("waiting for another agent-sandbox command or session start"),
        "{}",
        text(&deny)
    );
    assert!(
        !live.session_allows("x.example"),
        "deny undone by the allow"
    );
    assert!(live.session_allows("y.example"));
    assert!(!live.file().contains("x.example"), "{}", live.file());
    assert!(live.file().contains("y.example"), "{}", live.file());
}

/// A name edited out of the file by hand and not reloaded is still in force in the session started
/// with that file: `deny` says so and how to apply the file, instead of "not on the allowlist"
/// (reviewer N: it judged that session by the file's text, since it counted as re-applied even when
/// deny changed nothing).
#[test]
fn deny_after_a_hand_edit_says_the_session_still_allows_the_name() {
    let live = Live::new("handedit", "api.anthropic.com\nx.example\n");
    fs::write(live.allowlist(), "api.anthropic.com\n").unwrap();
    let o = live.run(&["deny", "x.example"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(live.session_allows("x.example"), "the session's router");
    assert!(!out.contains("not on the allowlist"), "{out}");
    assert!(
        out.contains(&format!(
            "`x.example` is still allowed in session {ID} by the policy its router holds"
        )),
        "{out}"
    );
    assert!(out.contains("`agent-sandbox reload`"), "{out}");
    assert_eq!(live.reloads(), 0, "nothing applied: {out}");
    let o = live.run(&["reload"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!live.session_allows("x.example"));
    let o = live.run(&["deny", "x.example"]);
    assert!(
        text(&o).contains("`x.example` is not on the allowlist"),
        "{}",
        text(&o)
    );
}

/// `deny` run where `XDG_RUNTIME_DIR` is not the session's (an ssh login, `su`, cron): the session's
/// directory is found through its router's label, and the name is taken out of it (reviewer P: the
/// session was skipped, and deny said "refused" while it still allowed the name).
#[test]
fn deny_finds_a_session_started_with_another_runtime_directory() {
    let live = Live::new("xdg", "api.anthropic.com\nevil.example\n");
    fs::create_dir_all(live.root.join("tmp")).unwrap();
    let o = live
        .command(&live.allowlist(), &["deny", "evil.example"])
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", live.root.join("tmp"))
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!live.session_allows("evil.example"), "{out}");
    assert_eq!(live.reloads(), 1, "{out}");
}

/// A running session whose directory cannot be found (no label: an older launcher, and another
/// runtime directory): `deny` cannot tell what it allows, so it never says "refused", and `allow`
/// says the change did not reach it; both fail.
#[test]
fn a_session_whose_directory_cannot_be_read_is_never_taken_as_refused() {
    let live = Live::new("xdgold", "api.anthropic.com\nevil.example\n");
    live.start_session_labelled(
        &live.allowlist(),
        "api.anthropic.com\nevil.example\n",
        false,
    );
    fs::create_dir_all(live.root.join("tmp")).unwrap();
    let elsewhere = |args: &[&str]| {
        live.command(&live.allowlist(), args)
            .env_remove("XDG_RUNTIME_DIR")
            .env("TMPDIR", live.root.join("tmp"))
            .output()
            .unwrap()
    };
    let o = elsewhere(&["deny", "evil.example"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(!out.contains("no running sessions"), "{out}");
    assert!(
        out.contains(&format!(
            "cannot tell whether session {ID} still allows `evil.example`"
        )),
        "{out}"
    );
    let o = elsewhere(&["allow", "new.example"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains(&format!("session {ID}: NOT applied")), "{out}");
    let o = elsewhere(&["allow", "--session", ID, "other.example"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("session {ID} cannot be changed live")),
        "{}",
        text(&o)
    );
}

/// A session whose launcher was killed while its router runs on (until the next start's sweep): its
/// router still serves its policy, so `deny` never says the name is refused, and `allow` says the
/// change did not reach it (reviewer Q: such a router was left out, and deny exited 0 with "refused").
#[test]
fn a_session_whose_launcher_is_gone_is_not_taken_as_refused() {
    let live = Live::new("orphan", "api.anthropic.com\nx.example.com\n");
    let ps = live.root.join("logs/ps.json");
    let mut listing: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&ps).unwrap()).unwrap();
    listing[0]["Labels"][LABEL_START] = "1".into();
    fs::write(&ps, listing.to_string()).unwrap();
    let o = live.run(&["deny", "x.example.com"]);
    let out = text(&o);
    assert!(live.session_allows("x.example.com"));
    assert!(!o.status.success(), "{out}");
    assert!(!out.contains("connections are refused"), "{out}");
    assert!(
        out.contains("its launcher is gone but its router still runs"),
        "{out}"
    );
    let o = live.run(&["allow", "new.example"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("session {ID}: NOT applied")),
        "{}",
        text(&o)
    );
}
