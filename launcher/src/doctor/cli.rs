//! `agent-sandbox doctor`'s own options. `doctor` is reserved only as the very first argument: after
//! `--` (`agent-sandbox -- doctor`) or after any other argument it is Claude's again.

use std::ffi::OsString;

use clap::Parser;

/// The word that starts the doctor.
pub const WORD: &str = "doctor";

/// Checks this machine's set-up, then starts a real session and proves from inside the sandbox that
/// it reaches only what the allowlist names. Exit status 0 only when nothing failed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Parser)]
#[command(
    name = "agent-sandbox doctor",
    bin_name = "agent-sandbox doctor",
    after_help = "`agent-sandbox -- doctor` runs Claude Code's own `claude doctor` in the sandbox.\n\n\
                  Environment: as for a session, and AGENT_SANDBOX_DOCTOR_RESOLV_CONF, the resolv.conf \
                  whose nameservers count as this host's DNS servers [default: /etc/resolv.conf]; \
                  AGENT_SANDBOX_DOCTOR_HOSTS, a hosts file to take the first allowlisted name's \
                  addresses from instead of resolving it as this host does [default: getaddrinfo]."
)]
pub struct DoctorOptions {
    /// Print one JSON object ({"passed": bool, "checks": [...]}) instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Only the prerequisites: start no session.
    #[arg(long)]
    pub no_session: bool,

    /// Also complete one HTTPS handshake with each exact allowlisted name (contacts those hosts).
    #[arg(long, conflicts_with = "no_session")]
    pub reach: bool,
}

/// The doctor's options when `argv` (the program name first) starts the doctor, or `None` when it does
/// not (then the launcher's own parser takes the whole line).
pub fn parse(argv: &[OsString]) -> Option<Result<DoctorOptions, clap::Error>> {
    (argv.get(1).is_some_and(|a| a == WORD)).then(|| DoctorOptions::try_parse_from(&argv[1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<OsString> {
        std::iter::once("agent-sandbox")
            .chain(a.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn doctor_is_reserved_only_as_the_first_word() {
        assert_eq!(
            parse(&argv(&["doctor"])).unwrap().unwrap(),
            DoctorOptions::default()
        );
        let o = parse(&argv(&["doctor", "--json", "--no-session"]))
            .unwrap()
            .unwrap();
        assert!(o.json && o.no_session && !o.reach);
        assert!(parse(&argv(&["doctor", "--reach"])).unwrap().unwrap().reach);
        assert!(parse(&argv(&["doctor", "--no-session", "--reach"]))
            .unwrap()
            .is_err());
        assert!(parse(&argv(&["doctor", "extra"])).unwrap().is_err());
        // Claude's: after `--`, after another argument, or under --exec.
        assert!(parse(&argv(&["--", "doctor"])).is_none());
        assert!(parse(&argv(&["--continue", "doctor"])).is_none());
        assert!(parse(&argv(&["--exec", "doctor"])).is_none());
        assert!(parse(&argv(&[])).is_none());
    }
}
