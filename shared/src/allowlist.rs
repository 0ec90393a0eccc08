//! The allowed-hosts file: the user-facing contract.
//!
//! ```text
//! api.anthropic.com      # exactly this host, ports 80 and 443
//! .example.com           # example.com and every subdomain, ports 80 and 443
//! db.example.com:5432    # this exact host on TCP 5432 too (and on 80/443)
//! @pypi                  # a named group: every host of that vetted list (see `groups`)
//! ```
//!
//! Parsing collects every error in the file (each with its line number, its text and what was expected)
//! rather than stopping at the first, so a user fixes the whole file in one go. Duplicates and entries
//! that a wildcard already covers are warnings. An empty allowlist is valid: nothing gets out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::name::{is_ip_literal, HostName, NameError};

/// The largest allowlist file read, so a mistaken path (a disk image, /dev/zero) fails fast.
pub const MAX_ALLOWLIST_BYTES: u64 = 1024 * 1024;

/// One allowlist entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Entry {
    /// `api.anthropic.com`: exactly this host on 80 and 443.
    Host(HostName),
    /// `.example.com`: the apex and every subdomain at any depth, on 80 and 443.
    Subdomains(HostName),
    /// `db.example.com:5432`: this exact host on this TCP port (and on 80 and 443).
    Port(HostName, u16),
}

impl Entry {
    /// The name the entry is about.
    #[must_use]
    pub fn name(&self) -> &HostName {
        match self {
            Entry::Host(n) | Entry::Subdomains(n) | Entry::Port(n, _) => n,
        }
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::Host(n) => write!(f, "{n}"),
            Entry::Subdomains(n) => write!(f, ".{n}"),
            Entry::Port(n, p) => write!(f, "{n}:{p}"),
        }
    }
}

/// What is wrong with one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// An IP address instead of a name.
    #[error("an allowlist holds host names, not IP addresses: the sandbox only reaches what the router can route by name (SNI, Host header or a named host:port entry)")]
    IpAddress,
    /// `*.example.com`.
    #[error(
        "wildcards are written with a leading dot: write {0} for the domain and all its subdomains"
    )]
    StarWildcard(String),
    /// `.example.com:22`.
    #[error("a port entry needs one exact host (e.g. `db.example.com:{0}`), not a wildcard")]
    WildcardPort(u16),
    /// Port 0.
    #[error("port 0 is not a port; use 1-65535")]
    PortZero,
    /// A port over 65535.
    #[error("port {0} is over 65535")]
    PortTooLarge(String),
    /// A port that is not a number.
    #[error("the port `{0}` is not a number; write HOST:PORT with PORT in 1-65535")]
    PortNotNumeric(String),
    /// Two or more words on one line.
    #[error("one entry per line: found more than one word")]
    SeveralWords,
    /// `@name` where no group has that name.
    #[error("unknown group `@{0}`; the groups are {groups}", groups = crate::groups::names())]
    UnknownGroup(String),
    /// The name itself is invalid.
    #[error("{0}")]
    Name(#[from] NameError),
}

/// One invalid line of an allowlist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number.
    pub line: usize,
    /// The entry as written, without comment and surrounding whitespace.
    pub text: String,
    /// What is wrong and what was expected.
    pub error: EntryError,
}

/// A line that is accepted but probably not what the user meant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// 1-based line number.
    pub line: usize,
    /// The entry as written.
    pub text: String,
    /// Why it is redundant.
    pub message: String,
}

/// Reading or parsing an allowlist failed.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistError {
    /// The file could not be read.
    #[error("cannot read allowlist {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_ALLOWLIST_BYTES`].
    #[error("allowlist {path} is larger than {MAX_ALLOWLIST_BYTES} bytes; is it the right file?")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The path leads to a FIFO, a device or a directory, which is never read (it could block forever).
    #[error("allowlist {path} is not a regular file (a FIFO, device or directory); give the path of a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// One or more lines are invalid; every one of them is listed.
    #[error("{}", format_line_errors(source_name, errors))]
    Invalid {
        /// Where the text came from (a path, or a description).
        source_name: String,
        /// Every invalid line, in file order.
        errors: Vec<LineError>,
    },
}

fn format_line_errors(source_name: &str, errors: &[LineError]) -> String {
    let mut out = format!(
        "{} invalid {} in allowlist {source_name}:",
        errors.len(),
        if errors.len() == 1 {
            "entry"
        } else {
            "entries"
        }
    );
    for e in errors {
        out.push_str(&format!(
            "\n  {source_name}:{}: `{}`: {}",
            e.line,
            e.text.escape_debug(),
            e.error
        ));
    }
    out
}

/// A parsed allowlist: the entries in file order, without duplicates, and the warnings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
    warnings: Vec<Warning>,
}

impl Allowlist {
    /// Reads and parses the allowlist at `path`.
    pub fn load(path: &Path) -> Result<Allowlist, AllowlistError> {
        Allowlist::parse_file(path, &Allowlist::read(path)?)
    }

    /// Reads the allowlist file at `path` without parsing it: a regular file (a FIFO or device is
    /// refused, never waited on) of at most [`MAX_ALLOWLIST_BYTES`]. Blocking: one bounded read.
    pub fn read(path: &Path) -> Result<Vec<u8>, AllowlistError> {
        let bytes = crate::file::read_capped(path, MAX_ALLOWLIST_BYTES).map_err(|e| match e {
            crate::file::ReadError::Io(source) => AllowlistError::Read {
                path: path.to_owned(),
                source,
            },
            crate::file::ReadError::NotAFile => AllowlistError::NotAFile {
                path: path.to_owned(),
            },
        })?;
        if bytes.len() as u64 > MAX_ALLOWLIST_BYTES {
            return Err(AllowlistError::TooLarge {
                path: path.to_owned(),
            });
        }
        Ok(bytes)
    }

    /// Parses the content [`Allowlist::read`] read from `path` (invalid UTF-8 is replaced, so the line
    /// it is on is reported as invalid).
    pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<Allowlist, AllowlistError> {
        Allowlist::parse(&String::from_utf8_lossy(bytes), &path.display().to_string())
    }

    /// Parses allowlist text; `source_name` (usually the path) prefixes every error message. A
    /// byte-order mark at the start (what Notepad and PowerShell 5 write) is not part of line 1.
    pub fn parse(text: &str, source_name: &str) -> Result<Allowlist, AllowlistError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut parsed: Vec<(usize, String, Entry)> = Vec::new();
        let mut errors = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or_default().trim();
            if content.is_empty() {
                continue;
            }
            match parse_line(content) {
                Ok(entries) => {
                    parsed.extend(entries.into_iter().map(|e| (line, content.to_owned(), e)));
                }
                Err(error) => errors.push(LineError {
                    line,
                    text: content.to_owned(),
                    error,
                }),
            }
        }
        if !errors.is_empty() {
            return Err(AllowlistError::Invalid {
                source_name: source_name.to_owned(),
                errors,
            });
        }
        Ok(Allowlist::from_parsed(parsed))
    }

    fn from_parsed(parsed: Vec<(usize, String, Entry)>) -> Allowlist {
        // Each wildcard apex with the position of its first line: an entry is checked against its own
        // parents (a handful of lookups), not against every wildcard, so parsing stays linear.
        let mut wildcards: BTreeMap<String, usize> = BTreeMap::new();
        for (i, (_, _, e)) in parsed.iter().enumerate() {
            if let Entry::Subdomains(n) = e {
                wildcards.entry(n.as_str().to_owned()).or_insert(i);
            }
        }
        // The first wildcard in file order among `candidates`.
        let first_of = |candidates: &mut dyn Iterator<Item = &str>| {
            candidates
                .filter_map(|c| wildcards.get_key_value(c))
                .min_by_key(|(_, i)| **i)
                .map(|(w, _)| w.clone())
        };
        let mut seen = BTreeSet::new();
        let mut out = Allowlist::default();
        for (line, text, entry) in parsed {
            let mut warn = |message: String| {
                out.warnings.push(Warning {
                    line,
                    text: text.clone(),
                    message,
                })
            };
            let entry = match entry {
                Entry::Port(name, 80 | 443) => {
                    warn(format!(
                        "ports 80 and 443 are always allowed for a listed host (routed by Host and SNI); \
                         this is the same entry as `{name}`"
                    ));
                    Entry::Host(name)
                }
                e => e,
            };
            if !seen.insert(entry.clone()) {
                warn("duplicate entry; it is ignored".to_owned());
                continue;
            }
            let covering = match &entry {
                Entry::Host(n) => first_of(&mut std::iter::once(n.as_str()).chain(n.parents())),
                Entry::Subdomains(n) => first_of(&mut n.parents()),
                Entry::Port(..) => None,
            };
            if let Some(w) = covering {
                warn(format!("already covered by `.{w}`"));
            }
            out.entries.push(entry);
        }
        out
    }

    /// The entries in file order, duplicates removed.
    #[must_use]
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Redundant lines worth telling the user about.
    #[must_use]
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `FILE:` goes in front, as for errors: `FILE:LINE: `TEXT`: MESSAGE`.
        write!(f, "{}: `{}`: {}", self.line, self.text, self.message)
    }
}

/// Parses one line's content (comment and surrounding whitespace stripped): one entry, or a group's
/// entries for `@name`.
pub fn parse_line(content: &str) -> Result<Vec<Entry>, EntryError> {
    let Some(group) = content.strip_prefix('@') else {
        return parse_entry(content).map(|e| vec![e]);
    };
    if content.split_whitespace().nth(1).is_some() {
        return Err(EntryError::SeveralWords);
    }
    let group =
        crate::groups::find(group).ok_or_else(|| EntryError::UnknownGroup(group.to_owned()))?;
    // The group hosts are checked by the groups' own tests; a failure here would be a build defect,
    // reported like any other line rather than a panic.
    group.hosts.iter().map(|h| parse_entry(h.entry)).collect()
}

/// Parses one entry, already stripped of comment and surrounding whitespace.
pub fn parse_entry(content: &str) -> Result<Entry, EntryError> {
    if content.split_whitespace().nth(1).is_some() {
        return Err(EntryError::SeveralWords);
    }
    if looks_like_ip(content) {
        return Err(EntryError::IpAddress);
    }
    if let Some(rest) = content.strip_prefix("*.") {
        // `*.example.com:22` is a wildcard with a port: advising `.example.com:22` would advise
        // another invalid line.
        if let Some((_, port)) = rest.rsplit_once(':') {
            return Err(EntryError::WildcardPort(parse_port(port)?));
        }
        return Err(EntryError::StarWildcard(format!(".{rest}")));
    }
    let (host, port) = match content.rsplit_once(':') {
        Some((host, port)) => (host, Some(parse_port(port)?)),
        None => (content, None),
    };
    if let Some(apex) = host.strip_prefix('.') {
        if let Some(port) = port {
            return Err(EntryError::WildcardPort(port));
        }
        return Ok(Entry::Subdomains(HostName::parse(apex)?));
    }
    let name = HostName::parse(host)?;
    Ok(match port {
        Some(port) => Entry::Port(name, port),
        None => Entry::Host(name),
    })
}

fn looks_like_ip(content: &str) -> bool {
    if is_ip_literal(content) {
        return true;
    }
    // `[::1]:443` and `1.2.3.4:443`
    if let Some((host, _port)) = content.rsplit_once(':') {
        return is_ip_literal(host);
    }
    false
}

fn parse_port(port: &str) -> Result<u16, EntryError> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EntryError::PortNotNumeric(port.to_owned()));
    }
    match port.parse::<u32>() {
        Ok(0) => Err(EntryError::PortZero),
        Ok(p) if p <= u32::from(u16::MAX) => Ok(p as u16),
        _ => Err(EntryError::PortTooLarge(port.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> HostName {
        HostName::parse(s).unwrap()
    }

    /// A byte-order mark at the start of the file is not part of its first line, whatever that line
    /// holds; anywhere else it is the non-ASCII character it is.
    #[test]
    fn a_leading_byte_order_mark_is_ignored() {
        for text in [
            "\u{feff}# comment\na.example\n",
            "\u{feff}a.example\n",
            "\u{feff}a.example",
        ] {
            let list = Allowlist::parse(text, "f").unwrap();
            assert_eq!(
                list.entries(),
                &[Entry::Host(host("a.example"))],
                "{text:?}"
            );
        }
        let err = Allowlist::parse("a.example\n\u{feff}b.example\n", "f")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\n  f:2: "), "{err}");
    }

    /// A FIFO at the path (or a symlink to a device) fails at once with an error naming the path, rather
    /// than waiting for a writer (or reading without end); an oversized file is refused.
    #[test]
    fn a_fifo_or_device_is_refused_at_once() {
        let guard = crate::test_support::TestDir::new("allowlist-fifo");
        let dir: &std::path::Path = &guard;
        let fifo = dir.join("allowed-hosts");
        crate::test_support::mkfifo(&fifo);
        let zero = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for path in [fifo, zero] {
            let (tx, rx) = std::sync::mpsc::channel();
            let p = path.clone();
            std::thread::spawn(move || {
                let _ = tx.send(Allowlist::load(&p).map_err(|e| e.to_string()));
            });
            let err = rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .expect("Allowlist::load returns at once")
                .unwrap_err();
            assert_eq!(
                err,
                format!(
                    "allowlist {} is not a regular file (a FIFO, device or directory); give the path of a regular file",
                    path.display()
                )
            );
        }
        let big = dir.join("big");
        std::fs::write(&big, vec![b'a'; 2 * 1024 * 1024]).unwrap();
        let err = Allowlist::load(&big).unwrap_err().to_string();
        assert!(err.contains("is larger than 1048576 bytes"), "{err}");
    }

    #[test]
    fn entries_parse() {
        let text = "\
# comment line
api.anthropic.com
   .Example.COM.   # trailing comment

db.example.com:5432
";
        let list = Allowlist::parse(text, "t").unwrap();
        assert_eq!(
            list.entries(),
            [
                Entry::Host(host("api.anthropic.com")),
                Entry::Subdomains(host("example.com")),
                Entry::Port(host("db.example.com"), 5432),
            ]
        );
        assert!(list.warnings().is_empty());
    }

    #[test]
    fn groups_expand_in_place() {
        let list = Allowlist::parse("web.test\n@PyPI  # python\n@anthropic\n", "t").unwrap();
        let names: Vec<String> = list.entries().iter().map(Entry::to_string).collect();
        assert_eq!(
            names,
            [
                "web.test",
                "pypi.org",
                "files.pythonhosted.org",
                "api.anthropic.com",
                "platform.claude.com",
                "claude.ai",
            ]
        );
        // A host both listed and in a group is a duplicate, reported on the group's line.
        let list = Allowlist::parse("pypi.org\n@pypi\n", "t").unwrap();
        assert_eq!(list.entries().len(), 2);
        assert_eq!(list.warnings().len(), 1);
        assert_eq!(list.warnings()[0].line, 2);
        assert_eq!(list.warnings()[0].text, "@pypi");
    }

    #[test]
    fn empty_is_valid() {
        assert!(Allowlist::parse("", "t").unwrap().entries().is_empty());
        assert!(Allowlist::parse("# nothing\n\n  \n", "t")
            .unwrap()
            .entries()
            .is_empty());
    }

    #[test]
    fn every_error_class_names_its_line() {
        let cases: &[(&str, &str)] = &[
            ("1.2.3.4", "not IP addresses"),
            ("10.0.0.1:22", "not IP addresses"),
            ("::1", "not IP addresses"),
            ("[2001:db8::1]:443", "not IP addresses"),
            ("[2001:db8::1]", "not IP addresses"),
            ("*.example.com", "write .example.com for the domain"),
            (".example.com:22", "a port entry needs one exact host"),
            ("*.example.com:22", "a port entry needs one exact host"),
            ("*.example.com:0", "port 0"),
            ("db.example.com:0", "port 0"),
            ("db.example.com:65536", "over 65535"),
            ("db.example.com:ssh", "not a number"),
            ("db.example.com:", "not a number"),
            (".", "empty"),
            (":22", "empty"),
            ("bad_-.com", "begins or ends with '-'"),
            ("a..b.com", "empty label"),
            ("bücher.de", "punycode"),
            ("a.com b.com", "one entry per line"),
            ("exa$mple.com", "not allowed in a host name"),
            (
                "@nosuchgroup",
                "unknown group `@nosuchgroup`; the groups are @anthropic",
            ),
            ("@", "unknown group `@`"),
            ("@pypi extra", "one entry per line"),
        ];
        for (entry, expect) in cases {
            let text = format!("ok.example\n\n{entry}  # comment\n");
            let err = Allowlist::parse(&text, "/home/u/allowed-hosts").unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!(
                    "/home/u/allowed-hosts:3: `{}`",
                    entry.escape_debug()
                )),
                "{entry}: {msg}"
            );
            assert!(
                msg.contains(expect),
                "{entry}: expected {expect:?} in {msg}"
            );
        }
    }

    #[test]
    fn all_errors_are_collected() {
        let err = Allowlist::parse("1.2.3.4\ngood.com\n*.x.com\nx.com:0\n", "f").unwrap_err();
        match err {
            AllowlistError::Invalid { errors, .. } => {
                assert_eq!(errors.iter().map(|e| e.line).collect::<Vec<_>>(), [1, 3, 4]);
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn duplicates_and_covered_entries_warn() {
        let text = "a.com\nA.com.\n.example.com\nwww.example.com\n.sub.example.com\nexample.com\n\
                    db.example.com:5432\nweb.com:443\n";
        let list = Allowlist::parse(text, "t").unwrap();
        let lines: Vec<usize> = list.warnings().iter().map(|w| w.line).collect();
        assert_eq!(lines, [2, 4, 5, 6, 8]);
        assert!(list.warnings()[0].message.contains("duplicate"));
        // Shown after the file's path as errors are: `FILE:LINE: `TEXT`: MESSAGE`.
        assert!(
            list.warnings()[0].to_string().starts_with("2: `A.com.`: "),
            "{}",
            list.warnings()[0]
        );
        assert!(list.warnings()[1]
            .message
            .contains("covered by `.example.com`"));
        assert!(list.warnings()[4].message.contains("always allowed"));
        assert!(list.entries().contains(&Entry::Host(host("web.com"))));
        assert!(list
            .entries()
            .contains(&Entry::Port(host("db.example.com"), 5432)));
        assert_eq!(list.entries().len(), 7);
    }

    /// Found while writing the allowlist fuzz target's linear-work invariant: the "already covered"
    /// check compared every entry with every wildcard, so a file of many `.apex` lines cost entries × wildcards (a 1 MiB file
    /// took minutes). The check must look up the entry's own parents instead.
    #[test]
    fn many_wildcards_parse_in_linear_time() {
        let text: String = (0..30_000)
            .map(|i| format!(".w{i}.test\nh.w{i}.test\n"))
            .collect();
        let started = std::time::Instant::now();
        let list = Allowlist::parse(&text, "t").unwrap();
        let spent = started.elapsed();
        assert_eq!(list.entries().len(), 60_000);
        assert_eq!(list.warnings().len(), 30_000);
        assert!(list.warnings()[0].message.contains("covered by `.w0.test`"));
        assert!(
            spent < std::time::Duration::from_secs(30),
            "{spent:?} for 60000 lines"
        );
    }

    #[test]
    fn load_reads_files_and_reports_missing() {
        let guard = crate::test_support::TestDir::new("allowlist");
        let dir: &std::path::Path = &guard;
        let p = dir.join("allowed-hosts");
        std::fs::write(&p, "api.anthropic.com\n").unwrap();
        assert_eq!(Allowlist::load(&p).unwrap().entries().len(), 1);
        let missing = dir.join("nope");
        let err = Allowlist::load(&missing).unwrap_err().to_string();
        assert!(
            err.contains("cannot read allowlist") && err.contains("nope"),
            "{err}"
        );
    }
}
