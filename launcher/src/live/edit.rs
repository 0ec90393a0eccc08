//! Editing the allowlist file: appending entries with a dated comment, removing lines, and the
//! atomic replacement that keeps the file's mode. Pure text functions, tested as tables; the caller
//! reads and writes the file.

use std::fmt::Write as _;

use agent_sandbox_shared::allowlist::{parse_line, Entry};
use agent_sandbox_shared::{Allowlist, AllowlistError};

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

/// The entries a line's content stands for (`@group` expanded), or none for comments and blanks.
fn line_entries(line: &str) -> Option<(String, Vec<Entry>)> {
    let content = line.split('#').next().unwrap_or_default().trim();
    if content.is_empty() {
        return None;
    }
    parse_line(content).ok().map(|e| (content.to_owned(), e))
}

/// Whether `line`'s entry is the same as `entry` (both written in allowlist syntax).
fn same_entry(line_content: &str, line: &[Entry], entry: &str) -> bool {
    if entry.starts_with('@') || line_content.starts_with('@') {
        return line_content.eq_ignore_ascii_case(entry);
    }
    match parse_line(entry) {
        Ok(e) => e == line,
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

/// Why `deny` cannot remove an entry.
#[derive(Debug, PartialEq, Eq)]
pub enum DenyProblem {
    /// The name is allowed only by a wildcard or a group line, which `deny NAME` does not remove.
    CoveredBy {
        /// The name asked for.
        name: String,
        /// The covering line's entry as written.
        by: String,
        /// Its line number.
        line: usize,
    },
    /// Nothing in the text allows it.
    NotListed(String),
}

impl std::fmt::Display for DenyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DenyProblem::CoveredBy { name, by, line } => write!(
                f,
                "`{name}` is allowed by `{by}` (line {line}), not by a line of its own: deny removes whole lines, so remove or narrow that line by hand (then `agent-sandbox reload`)"
            ),
            DenyProblem::NotListed(name) => write!(f, "`{name}` is not on the allowlist"),
        }
    }
}

/// `text` without the lines that are exactly `entries`, and how many lines went; or, when any entry
/// has no line of its own, what stands in the way (nothing is removed then).
pub fn remove(text: &str, entries: &[String]) -> Result<(String, usize), Vec<DenyProblem>> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let parsed: Vec<Option<(String, Vec<Entry>)>> = lines.iter().map(|l| line_entries(l)).collect();
    let mut drop = vec![false; lines.len()];
    let mut problems = Vec::new();
    for e in entries {
        let mut found = false;
        for (i, p) in parsed.iter().enumerate() {
            if let Some((content, line)) = p {
                if same_entry(content, line, e) {
                    drop[i] = true;
                    found = true;
                }
            }
        }
        if found {
            continue;
        }
        problems.push(covering(&parsed, e).unwrap_or_else(|| DenyProblem::NotListed(e.clone())));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let removed = drop.iter().filter(|d| **d).count();
    let kept: String = lines
        .iter()
        .zip(&drop)
        .filter(|(_, d)| !**d)
        .map(|(l, _)| *l)
        .collect();
    Ok((kept, removed))
}

/// The first line that allows `entry`'s name without being `entry` itself: a wildcard over it, or a
/// group holding it.
fn covering(parsed: &[Option<(String, Vec<Entry>)>], entry: &str) -> Option<DenyProblem> {
    let Ok(wanted) = parse_line(entry) else {
        return None;
    };
    let wanted = wanted.first()?.name().clone();
    for (i, p) in parsed.iter().enumerate() {
        let Some((content, line)) = p else { continue };
        let covers = line.iter().any(|l| match l {
            Entry::Subdomains(apex) => {
                wanted == *apex || wanted.parents().any(|p| p == apex.as_str())
            }
            Entry::Host(n) | Entry::Port(n, _) => content.starts_with('@') && *n == wanted,
        });
        if covers {
            return Some(DenyProblem::CoveredBy {
                name: entry.to_owned(),
                by: content.clone(),
                line: i + 1,
            });
        }
    }
    None
}

/// Removes `entries` from the session-only list, ignoring those it does not hold.
#[must_use]
pub fn remove_lenient(text: &str, entries: &[String]) -> String {
    text.split_inclusive('\n')
        .filter(|l| match line_entries(l) {
            Some((content, line)) => !entries.iter().any(|e| same_entry(&content, &line, e)),
            None => true,
        })
        .collect()
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
            (&["*.x.com"], Some("write `.x.com`")),
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
    fn remove_takes_whole_lines_or_says_what_allows_the_name() {
        let file = "# top\na.com\nA.com. # again\n.wild.com\ndb.com:5432\n@pypi\n";
        assert_eq!(
            remove(file, &strings(&["a.com"])).unwrap(),
            ("# top\n.wild.com\ndb.com:5432\n@pypi\n".to_owned(), 2)
        );
        assert_eq!(
            remove(file, &strings(&["db.com:5432", ".wild.com", "@PYPI"])).unwrap(),
            ("# top\na.com\nA.com. # again\n".to_owned(), 3)
        );
        let cases: &[(&str, &str)] = &[
            (
                "x.wild.com",
                "`x.wild.com` is allowed by `.wild.com` (line 4)",
            ),
            ("wild.com", "allowed by `.wild.com` (line 4)"),
            ("pypi.org", "`pypi.org` is allowed by `@pypi` (line 6)"),
            ("db.com", "`db.com` is not on the allowlist"),
            ("other.com", "`other.com` is not on the allowlist"),
        ];
        for (name, want) in cases {
            let problems = remove(file, &strings(&["a.com", name])).unwrap_err();
            assert_eq!(problems.len(), 1, "{name}");
            assert!(
                problems[0].to_string().contains(want),
                "{name}: {}",
                problems[0]
            );
        }
        assert_eq!(
            remove_lenient("a.com\nb.com\n", &strings(&["b.com", "z.com"])),
            "a.com\n"
        );
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_date(1_796_035_844), "2026-11-30 10:50 UTC");
    }
}
