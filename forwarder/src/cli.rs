//! The command line: `agent-sandbox-forwarder [--relays FILE] [LISTEN=TARGET...]`.
//!
//! Parsed by hand rather than with clap, which the other binaries use: clap's share of a static build
//! does not fit in the forwarder's budget (under 1.5 MB, most of it static glibc and std; check with
//! `ls -l` on the `release-small` build). The syntax is a list of relays, `--relays FILE`, `--help` and
//! `--version`; the relay syntax itself is [`Relay`]'s, shared with the launcher that writes these
//! arguments and the relays file ([`parse_relays_file`]), which the forwarder re-reads on SIGHUP.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use crate::Relay;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Relay these (at least one unless a relays file is given, no listen address twice).
    Run {
        /// The relays given as arguments: kept across reloads.
        relays: Vec<Relay>,
        /// `--relays FILE`: more relays, read at start and again on every SIGHUP.
        file: Option<PathBuf>,
    },
    /// Print [`HELP`].
    Help,
    /// Print the version.
    Version,
}

/// A command line that is not `LISTEN=TARGET...`; the message names the offending argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The one-line synopsis, printed with every usage error.
pub const USAGE: &str = "Usage: agent-sandbox-forwarder [--relays FILE] [LISTEN=TARGET...]";

/// The largest relays file read: a session's file holds a few lines per allowlisted host.
pub const MAX_RELAYS_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// `--help`.
pub const HELP: &str = "\
Relays TCP connections from local addresses to targets, keeping half-close.

Runs in the agent-sandbox pod: each allowlisted name resolves to a loopback address there, and the
forwarder relays that address to the session router. Addresses are IP:PORT only; no name is ever resolved.

Usage: agent-sandbox-forwarder [--relays FILE] [LISTEN=TARGET...]

Arguments:
  LISTEN=TARGET...  relays, both sides IP:PORT, e.g. 127.0.0.2:443=10.89.3.2:443 ([::1]:443 for IPv6)

Options:
  --relays FILE  more relays, one LISTEN=TARGET per line ('#' comments); re-read on SIGHUP: new relays
                 open, removed ones stop accepting (their open connections go on); a file that cannot be
                 read, is invalid, or whose new addresses cannot all be bound changes nothing
  -h, --help     print this help
  -V, --version  print the version

Environment:
  RUST_LOG       error, warn, info (the default) or debug (one line per connection)

Exit status: 0 after SIGTERM or SIGINT, 1 when a listener cannot be bound or the relays file cannot be
read at start, 2 for a bad command line.";

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Invocation, UsageError> {
    let mut relays = Vec::new();
    let mut file = None;
    let mut options_done = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(arg) = arg.to_str() else {
            return Err(UsageError(format!(
                "`{}` is not valid UTF-8",
                arg.to_string_lossy()
            )));
        };
        if !options_done && arg.starts_with('-') {
            match arg {
                "-h" | "--help" => return Ok(Invocation::Help),
                "-V" | "--version" => return Ok(Invocation::Version),
                "--" => options_done = true,
                "--relays" => {
                    let path = args
                        .next()
                        .ok_or_else(|| UsageError("`--relays` needs a FILE".into()))?;
                    if file.replace(PathBuf::from(path)).is_some() {
                        return Err(UsageError("`--relays` is given more than once".into()));
                    }
                }
                _ => return Err(UsageError(format!("unknown option `{arg}`"))),
            }
            continue;
        }
        let relay: Relay = arg.parse().map_err(|err| UsageError(format!("{err}")))?;
        relays.push(relay);
    }
    if relays.is_empty() && file.is_none() {
        return Err(UsageError(
            "no relays given: at least one LISTEN=TARGET (or --relays FILE) is needed".into(),
        ));
    }
    check_unique(&relays).map_err(UsageError)?;
    Ok(Invocation::Run { relays, file })
}

/// Two relays on one address can never both bind: an error, reported before binding anything.
pub fn check_unique(relays: &[Relay]) -> Result<(), String> {
    let mut seen = HashSet::new();
    match relays.iter().find(|relay| !seen.insert(relay.listen)) {
        Some(twice) => Err(format!(
            "`{twice}`: listen address {} is given more than once",
            twice.listen
        )),
        None => Ok(()),
    }
}

/// Parses a relays file: one `LISTEN=TARGET` per line, blank lines and `#` comments ignored. The error
/// names the line.
pub fn parse_relays_file(text: &str) -> Result<Vec<Relay>, String> {
    let mut relays = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let content = line.split('#').next().unwrap_or_default().trim();
        if content.is_empty() {
            continue;
        }
        let relay: Relay = content
            .parse()
            .map_err(|err| format!("line {}: {err}", i + 1))?;
        relays.push(relay);
    }
    Ok(relays)
}

/// Reads and parses the relays file at `path` (at most [`MAX_RELAYS_FILE_BYTES`]).
pub fn read_relays_file(path: &std::path::Path) -> Result<Vec<Relay>, String> {
    use std::io::Read as _;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut text = String::new();
    file.take(MAX_RELAYS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if text.len() as u64 > MAX_RELAYS_FILE_BYTES {
        return Err(format!(
            "{shown} is larger than {MAX_RELAYS_FILE_BYTES} bytes"
        ));
    }
    parse_relays_file(&text).map_err(|e| format!("{shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Invocation, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn relays_in_order() {
        let got = parse_strs(&["127.0.0.2:443=10.89.3.2:443", "[::1]:80=[fd00::2]:80"]).unwrap();
        let Invocation::Run { relays, file: None } = got else {
            panic!("{got:?}")
        };
        let shown: Vec<String> = relays.iter().map(Relay::to_string).collect();
        assert_eq!(
            shown,
            ["127.0.0.2:443=10.89.3.2:443", "[::1]:80=[fd00::2]:80"]
        );
    }

    #[test]
    fn help_and_version_win() {
        assert_eq!(parse_strs(&["--help"]), Ok(Invocation::Help));
        assert_eq!(
            parse_strs(&["bad", "-h"]).ok(),
            None,
            "a bad relay before -h is reported"
        );
        assert_eq!(parse_strs(&["-V"]), Ok(Invocation::Version));
        assert_eq!(parse_strs(&["--version", "bad"]), Ok(Invocation::Version));
    }

    #[test]
    fn errors_name_the_argument() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "no relays given"),
            (&["--listen"], "`--listen`"),
            (&["127.0.0.1:80"], "`127.0.0.1:80`"),
            (&["127.0.0.1:80=example.com:80"], "`example.com:80`"),
            (&["localhost:80=127.0.0.1:81"], "`localhost:80`"),
            (&["127.0.0.1:0=127.0.0.1:81"], "port 0"),
            (
                &[
                    "127.0.0.1:80=127.0.0.1:81",
                    "--",
                    "127.0.0.1:80=127.0.0.1:82",
                ],
                "127.0.0.1:80",
            ),
        ];
        for (args, needle) in cases {
            let err = parse_strs(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn relays_file_option() {
        assert_eq!(
            parse_strs(&["--relays", "/run/r"]),
            Ok(Invocation::Run {
                relays: vec![],
                file: Some("/run/r".into())
            })
        );
        let cases: &[(&[&str], &str)] = &[
            (&["--relays"], "needs a FILE"),
            (&["--relays", "a", "--relays", "b"], "more than once"),
        ];
        for (args, needle) in cases {
            let err = parse_strs(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn relays_file_syntax() {
        let text = "# relays\n127.0.0.2:80=10.0.0.2:80\n\n  127.0.0.2:443=10.0.0.2:443  # web\n";
        let relays = parse_relays_file(text).unwrap();
        assert_eq!(relays.len(), 2);
        assert_eq!(relays[1].to_string(), "127.0.0.2:443=10.0.0.2:443");
        assert!(parse_relays_file("").unwrap().is_empty());
        let err = parse_relays_file("127.0.0.2:80=10.0.0.2:80\nbad\n").unwrap_err();
        assert!(err.starts_with("line 2: `bad`"), "{err}");
    }

    #[test]
    fn double_dash_ends_options() {
        // No relay can start with `-`, but `--` is accepted as usual.
        assert!(matches!(
            parse_strs(&["--", "127.0.0.1:80=127.0.0.1:81"]),
            Ok(Invocation::Run { .. })
        ));
        assert!(parse_strs(&["--", "-h"]).is_err());
    }

    #[test]
    fn non_utf8_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStringExt as _;
        let err = parse([OsString::from_vec(vec![0x31, 0xff])]).unwrap_err();
        assert!(err.0.contains("UTF-8"), "{err}");
    }
}
