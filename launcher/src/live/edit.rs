//! Editing the allowlist file: appending entries with a dated comment, removing lines, and finding the
//! lines that still allow a denied name (by the router's own [`Policy`], line by line). Pure text
//! functions, tested as tables; the caller reads and writes the file.

use std::fmt::Write as _;

use agent_sandbox_shared::allowlist::Entry;
use agent_sandbox_shared::{Allowlist, AllowlistError, Policy};

/// The entries given on the command line, validated with the allowlist parser: the messages are the
/// file's, with `argument N` where a file has a line.
pub fn validate_args(entries: &[String]) -> Result<Vec<String>, AllowlistError> {
    let text: String = entries.iter().map(|e| format!("{e}\n")).collect();
    // Each argument is one line; an argument holding a newline or '#' would become several lines or
    // a comment, so it is rejected by name before parsing.
    for (i, e) in entries.iter().enumerate() {
        if e.contains(['\n', '\r', '#']) || e.trim().is_empty() {
            return Err(AllowlistError::Invalid {
                source_name: "the command line".into(),
                errors: vec![agent_sandbox_shared::allowlist::LineError {
                    line: i + 1,
                    text: e.clone(),
                    error: agent_sandbox_shared::allowlist::EntryError::SeveralWords,
                }],
            });
        }
    }
    Allowlist::parse(&text, "the command line")?;
    Ok(entries.iter().map(|e| e.trim().to_owned()).collect())
}

/// The entries a line's content stands for, as the parser reads them into an allowlist (`@group`
/// expanded, `host:443` the same as `host`), or none for comments, blanks and unreadable lines.
fn line_entries(line: &str) -> Option<(String, Vec<Entry>)> {
    let line = line.strip_prefix('\u{feff}').unwrap_or(line);
    let content = line.split('#').next().unwrap_or_default().trim();
    if content.is_empty() {
        return None;
    }
    Allowlist::parse(content, "")
        .ok()
        .map(|l| (content.to_owned(), l.entries().to_vec()))
}

/// Whether `line`'s entry is the same as `entry` (both written in allowlist syntax).
fn same_entry(line_content: &str, line: &[Entry], entry: &str) -> bool {
    if entry.starts_with('@') || line_content.starts_with('@') {
        return line_content.eq_ignore_ascii_case(entry);
    }
    match Allowlist::parse(entry, "") {
        Ok(e) => e.entries() == line,
        Err(_) => false,
    }
}

/// `text` with `entries` appended under a comment `# added by agent-sandbox allow on DATE`, leaving
/// out entries the text already has as a line of their own. Returns the new text and the entries
/// actually added.
#[must_use]
pub fn append(text: &str, entries: &[String], date: &str) -> (String, Vec<String>) {
    let present: Vec<(String, Vec<Entry>)> = text.lines().filter_map(line_entries).collect();
    let mut added: Vec<String> = Vec::new();
    for e in entries {
        let known = present.iter().any(|(c, l)| same_entry(c, l, e))
            || added.iter().any(|a| a.eq_ignore_ascii_case(e));
        if !known {
            added.push(e.clone());
        }
    }
    if added.is_empty() {
        return (text.to_owned(), added);
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(out, "\n# added by `agent-sandbox allow` on {date}");
    for a in &added {
        let _ = writeln!(out, "{a}");
    }
    (out, added)
}

/// What `deny` took out of one allowlist text (the file's, or a session's own entries).
#[derive(Debug, PartialEq, Eq)]
pub struct Removal {
    /// The text without the removed lines; everything else (comments too) as it was.
    pub text: String,
    /// How many lines went.
    pub lines: usize,
    /// Per denied entry, in order: whether it had a line of its own here.
    pub found: Vec<bool>,
}

/// `text` without the lines that are exactly one of `entries` (`A.com.` is `a.com`, `a.com:443` is
/// `a.com`, as the parser reads them). A wildcard, group or host:port line that allows an entry's name
/// is not such a line and stays: [`allowing`] finds it.
#[must_use]
pub fn remove(text: &str, entries: &[String]) -> Removal {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let parsed: Vec<Option<(String, Vec<Entry>)>> = lines.iter().map(|l| line_entries(l)).collect();
    let mut drop = vec![false; lines.len()];
    let mut found = vec![false; entries.len()];
    for (e, found) in entries.iter().zip(&mut found) {
        for (i, p) in parsed.iter().enumerate() {
            if let Some((content, line)) = p {
                if same_entry(content, line, e) {
                    drop[i] = true;
                    *found = true;
                }
            }
        }
    }
    Removal {
        text: lines
            .iter()
            .zip(&drop)
            .filter(|(_, d)| !**d)
            .map(|(l, _)| *l)
            .collect(),
        lines: drop.iter().filter(|d| **d).count(),
        found,
    }
}

/// What a denied entry stood for, each part with the name it is reported by: the entry as written, or
/// for a group each of its hosts. Empty for an entry the parser refuses (arguments are validated first).
fn denied_parts(entry: &str) -> Vec<(String, Entry)> {
    let Ok(list) = Allowlist::parse(entry, "the command line") else {
        return Vec::new();
    };
    let group = entry.trim_start().starts_with('@');
    list.entries()
        .iter()
        .map(|e| {
            let name = if group {
                e.to_string()
            } else {
                entry.trim().to_owned()
            };
            (name, e.clone())
        })
        .collect()
}

/// Whether `policy` still allows `part` of a denied entry, by the router's own matching: a name
/// through [`Policy::allows`] (an exact line, a host:port line of that host, a wildcard over it, a
/// group holding it), a host:port entry through [`Policy::allows_port`], and a wildcard when the
/// policy's wildcards alone still allow its apex (a wildcard at or above it still lets every name below
/// through; an exact line of the apex alone does not undo the deny of the names below).
fn policy_allows(policy: &Policy, part: &Entry) -> bool {
    match part {
        Entry::Host(n) => policy.allows(n),
        Entry::Port(n, port) => policy.allows_port(n, *port),
        Entry::Subdomains(n) => Policy::from_entries(
            policy
                .entries()
                .into_iter()
                .filter(|e| matches!(e, Entry::Subdomains(_))),
        )
        .allows(n),
    }
}

/// The parts of denied `entry` (see [`denied_parts`]) that `policy` still allows, by the names they are
/// reported by.
#[must_use]
pub fn still_allowed(policy: &Policy, entry: &str) -> Vec<String> {
    denied_parts(entry)
        .into_iter()
        .filter(|(_, part)| policy_allows(policy, part))
        .map(|(name, _)| name)
        .collect()
}

/// The lines of `text` with an entry at or below the domain of denied wildcard `entry` (`.example.com`):
/// names the wildcard covered that lines of their own keep allowing once it is gone (`www.example.com`,
/// `.sub.example.com`, `example.com`, `db.example.com:5432`). Each as its content and line number; none
/// when `entry` is not a wildcard.
#[must_use]
pub fn kept_below(text: &str, entry: &str) -> Vec<(String, usize)> {
    // The denied wildcards alone, compiled as the router compiles them: what they allow is at or below.
    let wildcards = Policy::from_entries(
        denied_parts(entry)
            .into_iter()
            .map(|(_, part)| part)
            .filter(|part| matches!(part, Entry::Subdomains(_))),
    );
    text.lines()
        .enumerate()
        .filter_map(|(i, raw)| {
            let (content, line) = line_entries(raw)?;
            line.iter()
                .any(|e| wildcards.allows(e.name()))
                .then_some((content, i + 1))
        })
        .collect()
}

/// A line of allowlist text that still allows part of a denied entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowing {
    /// The part still allowed: the denied entry as written, or one host of a denied group.
    pub name: String,
    /// The line's entry as written.
    pub by: String,
    /// Its line number.
    pub line: usize,
    /// The line is a host:port entry of the name's host: it allows the host on ports 80 and 443 too,
    /// which is easy to miss.
    pub through_port: bool,
}

/// The lines of `text` that still allow part of denied `entry`: each line compiled alone into the
/// router's [`Policy`] and asked as the whole policy is asked ([`still_allowed`]), so this says which
/// lines make a name allowed without a second matcher. A line unreadable to the parser allows nothing
/// here (the whole text is validated before anything is written).
#[must_use]
pub fn allowing(text: &str, entry: &str) -> Vec<Allowing> {
    let parts = denied_parts(entry);
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let Some((content, line)) = line_entries(raw) else {
            continue;
        };
        let policy = Policy::from_entries(line.iter().cloned());
        for (name, part) in &parts {
            if policy_allows(&policy, part) {
                out.push(Allowing {
                    name: name.clone(),
                    by: content.clone(),
                    line: i + 1,
                    through_port: matches!(part, Entry::Host(_))
                        && line
                            .iter()
                            .any(|l| matches!(l, Entry::Port(h, _) if h == part.name())),
                });
            }
        }
    }
    out
}

/// Where an entry that still allows a denied name is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// A line of the allowlist file `deny` edits (its path).
    File(String),
    /// A running session's own entries (`allow --session`; its id).
    Session(String),
    /// A line of the other allowlist file a running session was started with.
    SessionFile {
        /// The session id.
        id: String,
        /// That file.
        path: String,
    },
}

/// Why a denied name is not refused (yet): `deny` removes whole lines that are exactly the entry, and
/// reports whatever else allows the name instead of claiming it is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum DenyProblem {
    /// Another line still allows it: a wildcard over it, a group holding it, a host:port line of it.
    StillAllowed {
        /// What allows it.
        allowing: Allowing,
        /// Where that line is.
        place: Place,
    },
    /// A session's router still holds a policy that allows it, but no line of the allowlist or of the
    /// session's own entries says so now: a change not yet applied (a hand edit without `reload`, or
    /// a reload the router refused).
    StillAllowedUnexplained {
        /// The name.
        name: String,
        /// The session id.
        id: String,
    },
    /// A session's policy could not be had (the other allowlist it was started with cannot be read),
    /// so whether it still allows the name cannot be told.
    Unchecked {
        /// The name.
        name: String,
        /// The session id.
        id: String,
        /// Why.
        error: String,
    },
    /// Nothing allowed it and no line was it.
    NotListed(String),
}

impl DenyProblem {
    /// The name a policy in force may still allow, or `None` when it is refused everywhere.
    #[must_use]
    pub fn still_allowed(&self) -> Option<&str> {
        match self {
            DenyProblem::StillAllowed { allowing, .. } => Some(&allowing.name),
            DenyProblem::StillAllowedUnexplained { name, .. }
            | DenyProblem::Unchecked { name, .. } => Some(name),
            DenyProblem::NotListed(_) => None,
        }
    }
}

impl std::fmt::Display for DenyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DenyProblem::StillAllowed { allowing: a, place } => {
                let name = &a.name;
                let by = &a.by;
                let port = if a.through_port {
                    format!(", which allows `{name}` on ports 80 and 443 too")
                } else {
                    String::new()
                };
                match place {
                    Place::File(path) => write!(
                        f,
                        "`{name}` is still allowed by `{by}` ({path} line {}{port}): deny removes only lines that are exactly the entry; `agent-sandbox deny {by}` removes that line, or narrow it by hand and run `agent-sandbox reload`",
                        a.line
                    ),
                    Place::Session(id) => write!(
                        f,
                        "`{name}` is still allowed in session {id} by its own entry `{by}` (from `allow --session`{port}): `agent-sandbox deny {by}` removes it"
                    ),
                    Place::SessionFile { id, path } => write!(
                        f,
                        "`{name}` is still allowed in session {id} by `{by}` ({path} line {}, the allowlist that session was started with{port}): edit that file and run `AGENT_SANDBOX_ALLOWLIST={path} agent-sandbox reload`",
                        a.line
                    ),
                }
            }
            DenyProblem::StillAllowedUnexplained { name, id } => write!(
                f,
                "`{name}` is still allowed in session {id} by the policy its router holds, though no line deny can name allows it now (an edit not yet applied?): `agent-sandbox reload` applies the allowlist as it is; `agent-sandbox sessions` names the allowlist the session was started with"
            ),
            DenyProblem::Unchecked { name, id, error } => write!(
                f,
                "cannot tell whether session {id} still allows `{name}`: {error}"
            ),
            DenyProblem::NotListed(name) => write!(f, "`{name}` is not on the allowlist"),
        }
    }
}

/// `YYYY-MM-DD HH:MM UTC` for a time in seconds since the epoch.
#[must_use]
pub fn utc_date(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn arguments_are_validated_with_the_file_messages() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["a.com", ".b.com", "c.com:5432", "@pypi"], None),
            (
                &["a.com", "1.2.3.4"],
                Some("the command line:2: `1.2.3.4`: an allowlist holds host names"),
            ),
            (&["*.x.com"], Some("write .x.com for")),
            (&["@nope"], Some("unknown group `@nope`")),
            (&["a.com # hidden"], Some("the command line:1")),
            (&["a.com\nb.com"], Some("the command line:1")),
            (&[""], Some("the command line:1")),
        ];
        for (args, want) in cases {
            let got = validate_args(&strings(args));
            match want {
                None => assert!(got.is_ok(), "{args:?}: {got:?}"),
                Some(needle) => {
                    let msg = got.unwrap_err().to_string();
                    assert!(msg.contains(needle), "{args:?}: {msg}");
                }
            }
        }
    }

    #[test]
    fn append_adds_a_dated_block_of_new_entries_only() {
        let (text, added) = append(
            "a.com\n.b.com # wild\n",
            &strings(&["A.com.", "c.com", "c.com", "x.b.com"]),
            "2026-11-30 10:00 UTC",
        );
        assert_eq!(added, ["c.com", "x.b.com"]);
        assert_eq!(
            text,
            "a.com\n.b.com # wild\n\n# added by `agent-sandbox allow` on 2026-11-30 10:00 UTC\nc.com\nx.b.com\n"
        );
        let (same, none) = append("a.com", &strings(&["a.com"]), "d");
        assert!(none.is_empty());
        assert_eq!(same, "a.com");
        // No trailing newline in the file: the block still starts on a line of its own.
        let (text, _) = append("a.com", &strings(&["@pypi"]), "d");
        assert_eq!(
            text,
            "a.com\n\n# added by `agent-sandbox allow` on d\n@pypi\n"
        );
        let (_, none) = append("@PyPI\n", &strings(&["@pypi"]), "d");
        assert!(none.is_empty());
    }

    #[test]
    fn remove_takes_whole_lines_that_are_the_entry() {
        let file = "# top\na.com\nA.com. # again\n.wild.com\ndb.com:5432\nweb.com:443\n@pypi\n";
        let r = remove(file, &strings(&["a.com", "nope.com"]));
        assert_eq!(
            r.text,
            "# top\n.wild.com\ndb.com:5432\nweb.com:443\n@pypi\n"
        );
        assert_eq!((r.lines, r.found), (2, vec![true, false]));
        let r = remove(
            file,
            &strings(&["db.com:5432", ".wild.com", "@PYPI", "web.com"]),
        );
        assert_eq!(r.text, "# top\na.com\nA.com. # again\n");
        assert_eq!(r.lines, 4);
        // Lines that merely allow the name are not the entry: they stay.
        for name in [
            "x.wild.com",
            "wild.com",
            "pypi.org",
            "db.com",
            "db.com:5433",
        ] {
            let r = remove(file, &strings(&[name]));
            assert_eq!((r.text.as_str(), r.lines), (file, 0), "{name}");
        }
    }

    /// A file saved with a byte-order mark: its first line is still an entry that `deny` finds, `@group`
    /// lines included.
    #[test]
    fn a_byte_order_mark_does_not_hide_the_first_line() {
        for (file, entry) in [
            ("\u{feff}a.com\nb.com\n", "a.com"),
            ("\u{feff}@pypi\nb.com\n", "@pypi"),
        ] {
            let r = remove(file, &strings(&[entry]));
            assert_eq!((r.text.as_str(), r.lines), ("b.com\n", 1), "{file:?}");
            let (_, added) = append(file, &strings(&[entry]), "2026-12-02");
            assert!(added.is_empty(), "{file:?}");
        }
    }

    #[test]
    fn allowing_names_the_lines_that_still_allow_a_denied_entry() {
        let file = "# top\na.com\n.wild.com\ndb.com:5432\n@pypi\n.com\n";
        let at = |name: &str| -> Vec<(String, usize, bool)> {
            allowing(file, name)
                .into_iter()
                .map(|a| (a.by, a.line, a.through_port))
                .collect()
        };
        let by = |v: &[(&str, usize, bool)]| -> Vec<(String, usize, bool)> {
            v.iter()
                .map(|(b, l, p)| ((*b).to_owned(), *l, *p))
                .collect()
        };
        assert_eq!(at("a.com"), by(&[("a.com", 2, false), (".com", 6, false)]));
        assert_eq!(
            at("x.wild.com"),
            by(&[(".wild.com", 3, false), (".com", 6, false)])
        );
        assert_eq!(
            at("db.com"),
            by(&[("db.com:5432", 4, true), (".com", 6, false)])
        );
        assert_eq!(at("db.com:5432"), by(&[("db.com:5432", 4, false)]));
        // A wildcard is still allowed by a wildcard over it, not by an exact line of its apex.
        assert_eq!(at(".a.com"), by(&[(".com", 6, false)]));
        assert_eq!(at("pypi.org"), by(&[("@pypi", 5, false)]));
        assert!(at("other.net").is_empty());
        assert!(at("db.com:5433").is_empty());
        // A group is reported host by host.
        let names: Vec<String> = allowing("pypi.org\n", "@pypi")
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(names, ["pypi.org"]);
    }

    #[test]
    fn still_allowed_asks_the_whole_policy() {
        let policy = |text: &str| Policy::new(&Allowlist::parse(text, "t").unwrap());
        let p = policy(".example.com\ndb.com:5432\n");
        assert_eq!(still_allowed(&p, "x.example.com"), ["x.example.com"]);
        assert_eq!(still_allowed(&p, "db.com"), ["db.com"]);
        assert!(still_allowed(&p, "db.com:5433").is_empty());
        assert!(still_allowed(&p, "other.com").is_empty());
        assert!(still_allowed(&policy("example.com\n"), ".example.com").is_empty());
        assert_eq!(
            still_allowed(&policy(".com\n"), ".example.com"),
            [".example.com"]
        );
    }

    #[test]
    fn deny_problems_say_where_and_what_to_do() {
        let a = |through_port| Allowing {
            name: "db.com".into(),
            by: "db.com:5432".into(),
            line: 4,
            through_port,
        };
        let cases = [
            (
                DenyProblem::StillAllowed {
                    allowing: a(true),
                    place: Place::File("/a".into()),
                },
                "`db.com` is still allowed by `db.com:5432` (/a line 4, which allows `db.com` on ports 80 and 443 too): deny removes only lines that are exactly the entry; `agent-sandbox deny db.com:5432` removes that line, or narrow it by hand and run `agent-sandbox reload`",
            ),
            (
                DenyProblem::StillAllowed {
                    allowing: a(false),
                    place: Place::Session("0123".into()),
                },
                "`db.com` is still allowed in session 0123 by its own entry `db.com:5432` (from `allow --session`): `agent-sandbox deny db.com:5432` removes it",
            ),
            (
                DenyProblem::StillAllowed {
                    allowing: a(false),
                    place: Place::SessionFile {
                        id: "0123".into(),
                        path: "/b".into(),
                    },
                },
                "`db.com` is still allowed in session 0123 by `db.com:5432` (/b line 4, the allowlist that session was started with): edit that file and run `AGENT_SANDBOX_ALLOWLIST=/b agent-sandbox reload`",
            ),
            (
                DenyProblem::NotListed("x.com".into()),
                "`x.com` is not on the allowlist",
            ),
        ];
        for (problem, want) in cases {
            assert_eq!(problem.to_string(), want);
        }
        assert_eq!(DenyProblem::NotListed("x".into()).still_allowed(), None);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_date(1_796_035_844), "2026-11-30 10:50 UTC");
    }
}
