//! The command line: a few options of the launcher's own, then everything else is Claude Code's.
//!
//! `agent-sandbox --continue` must hand `--continue` to Claude, so the trailing arguments are captured
//! verbatim from the first one the launcher does not know (hyphens included). Only `--help`, `--version`,
//! `--exec`, `--build-images` (with its `--base-image`), `--print-config` and `--no-inject` are the
//! launcher's, and only
//! before that point; `agent-sandbox -- --help` passes `--help` to Claude.

use std::ffi::OsString;

use clap::Parser;

/// Runs Claude Code (or any command) in a rootless podman sandbox that sees only the current directory
/// and reaches only the hosts on your allowlist.
#[derive(Debug, Parser)]
#[command(
    name = "agent-sandbox",
    version,
    override_usage = "agent-sandbox [--no-inject] [CLAUDE_ARGS]...\n       agent-sandbox --exec CMD [ARGS]...\n       agent-sandbox doctor [--json] [--no-session] [--reach]\n       agent-sandbox --build-images[=all|router|sandbox] [--base-image IMAGE]",
    after_help = "Arguments after the launcher's options go to Claude Code untouched \
                  (`agent-sandbox --continue`). To pass one that the launcher also knows, put `--` first: \
                  `agent-sandbox -- --help` shows Claude's help.\n\n\
                  Words the launcher reserves as its first argument: allow, deny, reload, sessions, blocked \
                  (change and watch a running session's allowlist; each has --help) and doctor (check this \
                  machine and prove the sandbox confines here; `agent-sandbox doctor --help`). To give one \
                  of them to Claude, put `--` first: `agent-sandbox -- doctor` runs Claude's own doctor.\n\n\
                  Environment: AGENT_SANDBOX_IMAGE, AGENT_SANDBOX_ROUTER_IMAGE, AGENT_SANDBOX_ALLOWLIST, \
                  AGENT_SANDBOX_HOME_VOLUME (see --print-config for what is in effect)."
)]
pub struct Cli {
    /// Run the arguments that follow as a command (CMD [ARGS]...) instead of Claude Code, e.g.
    /// `--exec bash` for a shell.
    #[arg(long, conflicts_with_all = ["build_images", "print_config"])]
    pub exec: bool,

    /// Build the router image and the sandbox image (or only one of them) from this source checkout
    /// with podman, then exit (`make build` runs this).
    #[arg(
        long,
        value_name = "WHICH",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "all",
        conflicts_with = "print_config"
    )]
    pub build_images: Option<ImageSet>,

    /// The Debian base of the sandbox image (`--build-images` only) [default: the Containerfile's].
    #[arg(long, value_name = "IMAGE", requires = "build_images")]
    pub base_image: Option<String>,

    /// Print the images, allowlist and home volume this launcher uses, and which hosts a session would
    /// terminate to add credentials (and why), then exit.
    #[arg(long)]
    pub print_config: bool,

    /// Do not keep secrets out of the sandbox: pass ANTHROPIC_API_KEY into it as it is and terminate no
    /// TLS (every allowlisted host is spliced end to end, as before credential injection).
    #[arg(long, conflicts_with = "build_images")]
    pub no_inject: bool,

    /// Arguments for Claude Code, or with --exec the command and its arguments.
    #[arg(
        value_name = "CLAUDE_ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<OsString>,
}

/// Which images `--build-images` builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageSet {
    /// Both.
    All,
    /// The router image (router and forwarder).
    Router,
    /// The sandbox image.
    Sandbox,
}

/// What the launcher is asked to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Run a command in a sandbox session.
    Session {
        /// The command (Claude Code and its arguments, or `--exec`'s).
        command: Vec<OsString>,
        /// `--no-inject`: the real API key goes into the sandbox; nothing is terminated.
        no_inject: bool,
    },
    /// Build the images.
    BuildImages {
        /// Which images.
        which: ImageSet,
        /// Overrides the Containerfile's BASE.
        base_image: Option<String>,
    },
    /// Print the effective settings.
    PrintConfig {
        /// `--no-inject` was given: show what a session with it would do.
        no_inject: bool,
    },
    /// `agent-sandbox doctor`: check this machine, then prove containment in a real session.
    Doctor(crate::doctor::DoctorOptions),
}

impl Cli {
    /// The action, or a usage error message.
    pub fn action(self) -> Result<Action, String> {
        if let Some(which) = self.build_images {
            if !self.args.is_empty() {
                return Err("--build-images takes no other arguments".into());
            }
            return Ok(Action::BuildImages {
                which,
                base_image: self.base_image,
            });
        }
        if self.print_config {
            if !self.args.is_empty() {
                return Err("--print-config takes no other arguments".into());
            }
            return Ok(Action::PrintConfig {
                no_inject: self.no_inject,
            });
        }
        if self.exec {
            if self.args.is_empty() {
                return Err("--exec needs a command, e.g. `agent-sandbox --exec bash`".into());
            }
            return Ok(Action::Session {
                command: self.args,
                no_inject: self.no_inject,
            });
        }
        let mut command = vec![OsString::from("claude")];
        command.extend(self.args);
        Ok(Action::Session {
            command,
            no_inject: self.no_inject,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn parse(args: &[&str]) -> Result<Action, String> {
        let argv = std::iter::once("agent-sandbox").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .action()
    }

    fn session(args: &[&str]) -> Vec<String> {
        match parse(args).unwrap() {
            Action::Session { command, .. } => command
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verify_definition() {
        Cli::command().debug_assert();
    }

    #[test]
    fn claude_gets_its_arguments_untouched() {
        assert_eq!(session(&[]), ["claude"]);
        assert_eq!(session(&["--continue"]), ["claude", "--continue"]);
        assert_eq!(
            session(&["-p", "hello world", "--model", "x"]),
            ["claude", "-p", "hello world", "--model", "x"]
        );
        // Once Claude's arguments start, the launcher's names are Claude's too.
        assert_eq!(
            session(&["--continue", "--help", "--exec", "--version"]),
            ["claude", "--continue", "--help", "--exec", "--version"]
        );
        assert_eq!(session(&["--", "--help"]), ["claude", "--help"]);
        assert_eq!(session(&["--", "--version"]), ["claude", "--version"]);
        assert_eq!(session(&["resume", "-x"]), ["claude", "resume", "-x"]);
        // `doctor` is the launcher's only as the first word (lib.rs); `--` hands it to Claude.
        assert_eq!(session(&["--", "doctor"]), ["claude", "doctor"]);
    }

    #[test]
    fn exec_runs_the_command_instead() {
        assert_eq!(session(&["--exec", "bash"]), ["bash"]);
        assert_eq!(
            session(&["--exec", "bash", "-c", "echo --help; exit 3"]),
            ["bash", "-c", "echo --help; exit 3"]
        );
        assert_eq!(session(&["--exec", "ls", "--version"]), ["ls", "--version"]);
        assert_eq!(session(&["--exec", "--", "-weird"]), ["-weird"]);
        assert!(parse(&["--exec"]).unwrap_err().contains("needs a command"));
    }

    #[test]
    fn help_and_version_are_the_launchers() {
        let help = Cli::try_parse_from(["agent-sandbox", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        let text = help.to_string();
        assert!(text.contains("agent-sandbox -- --help"), "{text}");
        assert!(text.contains("--exec"), "{text}");
        assert!(
            text.contains("reserves as its first argument: allow, deny, reload, sessions, blocked"),
            "{text}"
        );
        assert!(text.contains("and doctor (check this"), "{text}");
        assert!(
            text.contains("`agent-sandbox -- doctor` runs Claude's own doctor"),
            "{text}"
        );
        let version = Cli::try_parse_from(["agent-sandbox", "--version"]).unwrap_err();
        assert_eq!(version.kind(), clap::error::ErrorKind::DisplayVersion);
    }

    #[test]
    fn build_images() {
        let all = |base_image: Option<&str>| Action::BuildImages {
            which: ImageSet::All,
            base_image: base_image.map(str::to_owned),
        };
        assert_eq!(parse(&["--build-images"]).unwrap(), all(None));
        assert_eq!(
            parse(&[
                "--build-images",
                "--base-image",
                "localhost/debian:bookworm"
            ])
            .unwrap(),
            all(Some("localhost/debian:bookworm"))
        );
        assert_eq!(
            parse(&["--build-images=router"]).unwrap(),
            Action::BuildImages {
                which: ImageSet::Router,
                base_image: None
            }
        );
        assert!(parse(&["--build-images=nope"]).is_err());
        assert!(parse(&["--base-image", "x"]).is_err());
        assert!(parse(&["--build-images", "--exec", "bash"]).is_err());
        assert_eq!(
            parse(&["--print-config"]).unwrap(),
            Action::PrintConfig { no_inject: false }
        );
        assert_eq!(
            parse(&["--no-inject", "--print-config"]).unwrap(),
            Action::PrintConfig { no_inject: true }
        );
    }

    #[test]
    fn no_inject_is_the_launchers_before_claudes_arguments() {
        assert_eq!(
            parse(&["--no-inject", "-p", "hi"]).unwrap(),
            Action::Session {
                command: vec!["claude".into(), "-p".into(), "hi".into()],
                no_inject: true
            }
        );
        assert_eq!(
            parse(&["--no-inject", "--exec", "env"]).unwrap(),
            Action::Session {
                command: vec!["env".into()],
                no_inject: true
            }
        );
        // After Claude's arguments start it is Claude's (and Claude rejects it).
        assert_eq!(
            session(&["-p", "--no-inject"]),
            ["claude", "-p", "--no-inject"]
        );
        assert!(parse(&["--no-inject", "--build-images"]).is_err());
    }
}
