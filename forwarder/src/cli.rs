//! The command line: `agent-sandbox-forwarder LISTEN=TARGET...`.
//!
//! Parsed by hand rather than with clap, which the other binaries use: clap's share of a static build
//! does not fit in the forwarder's budget (under 1.5 MB, most of it static glibc and std; check with
//! `ls -l` on the `release-small` build). The syntax is a list of relays, `--help` and `--version`; the relay syntax itself
//! is [`Relay`]'s, shared with the launcher that writes these arguments.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;

use crate::Relay;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation {
    /// Relay these (at least one, no listen address twice).
    Run(Vec<Relay>),
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
pub const USAGE: &str = "Usage: agent-sandbox-forwarder LISTEN=TARGET...";

/// `--help`.
pub const HELP: &str = "\
Relays TCP connections from local addresses to targets, keeping half-close.

Runs in the agent-sandbox pod: each allowlisted name resolves to a loopback address there, and the
forwarder relays that address to the session router. Addresses are IP:PORT only; no name is ever resolved.

Usage: agent-sandbox-forwarder LISTEN=TARGET...

Arguments:
  LISTEN=TARGET...  relays, both sides IP:PORT, e.g. 127.0.0.2:443=10.89.3.2:443 ([::1]:443 for IPv6)

Options:
  -h, --help     print this help
  -V, --version  print the version

Environment:
  RUST_LOG       error, warn, info (the default) or debug (one line per connection)

Exit status: 0 after SIGTERM or SIGINT, 1 when a listener cannot be bound, 2 for a bad command line.";

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Invocation, UsageError> {
    let mut relays = Vec::new();
    let mut options_done = false;
    for arg in args {
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
                _ => return Err(UsageError(format!("unknown option `{arg}`"))),
            }
            continue;
        }
        let relay: Relay = arg.parse().map_err(|err| UsageError(format!("{err}")))?;
        relays.push(relay);
    }
    if relays.is_empty() {
        return Err(UsageError(
            "no relays given: at least one LISTEN=TARGET is needed".into(),
        ));
    }
    // Two relays on one address can never both bind: a usage error, reported before binding anything.
    let mut seen = HashSet::new();
    if let Some(twice) = relays.iter().find(|relay| !seen.insert(relay.listen)) {
        return Err(UsageError(format!(
            "`{twice}`: listen address {} is given more than once",
            twice.listen
        )));
    }
    Ok(Invocation::Run(relays))
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
        let Invocation::Run(relays) = got else {
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
    fn double_dash_ends_options() {
        // No relay can start with `-`, but `--` is accepted as usual.
        assert!(matches!(
            parse_strs(&["--", "127.0.0.1:80=127.0.0.1:81"]),
            Ok(Invocation::Run(_))
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
