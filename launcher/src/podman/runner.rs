//! Runs podman: the argument vectors from `args.rs` go in, stdout or a [`PodmanError`] that shows the
//! command and podman's own message comes out.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Output, Stdio};

/// A podman invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum PodmanError {
    /// The podman program was not found.
    #[error("podman is not installed (or not on PATH): install it, e.g. `sudo dnf install podman` or `sudo apt-get install podman`")]
    NotInstalled,
    /// podman could not be started for another reason.
    #[error("cannot run podman: {0}")]
    Spawn(#[source] io::Error),
    /// podman ran and failed.
    #[error("`{command}` failed ({status}){}", stderr_suffix(.stderr))]
    Failed {
        /// The command line, for the user to retry by hand.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// What podman said.
        stderr: String,
    },
}

impl PodmanError {
    /// podman's answer for an object that does not exist (any more): nothing to remove.
    #[must_use]
    pub fn is_missing(&self) -> bool {
        matches!(self, PodmanError::Failed { stderr, .. }
            if stderr.contains("no such") || stderr.contains("not found") || stderr.contains("unable to find"))
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim();
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}

/// Runs podman.
#[derive(Clone, Debug)]
pub struct Podman {
    /// The program: `podman` from PATH.
    program: OsString,
    /// Global options given before every command's own ([`Podman::with_hooks_dir`]).
    globals: Vec<OsString>,
}

impl Default for Podman {
    fn default() -> Self {
        Podman {
            program: "podman".into(),
            globals: Vec::new(),
        }
    }
}

impl Podman {
    /// Runs `program` instead of podman: a stand-in, for tests of what drives podman.
    #[cfg(test)]
    pub(crate) fn stand_in(program: impl Into<OsString>) -> Podman {
        Podman {
            program: program.into(),
            globals: Vec::new(),
        }
    }

    /// This podman with `dir` as its only OCI hooks directory (`--hooks-dir`, before each command's
    /// arguments): a session's podman, with an empty directory of the session's, so that no hook of
    /// podman's configuration (`hooks_dir`) runs for the session's containers. Hooks run programs on
    /// this machine as a container starts, and can change anything in it: mount host directories,
    /// add a network interface to the pod's namespace.
    #[must_use]
    pub fn with_hooks_dir(&self, dir: &std::path::Path) -> Podman {
        Podman {
            program: self.program.clone(),
            globals: vec!["--hooks-dir".into(), dir.into()],
        }
    }

    fn command(&self, args: &[OsString]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.globals).args(args);
        c
    }

    /// The command line as a user would type it (for error messages).
    #[must_use]
    pub fn display(&self, args: &[OsString]) -> String {
        std::iter::once(&self.program)
            .chain(&self.globals)
            .chain(args)
            .map(|a| {
                let s = a.to_string_lossy();
                if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '\'') {
                    format!("'{}'", s.replace('\'', r"'\''"))
                } else {
                    s.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs a helper command to completion with output captured, in its own process group so that a
    /// Ctrl-C meant for the launcher does not kill a half-done setup or cleanup step (the launcher
    /// finishes the step, then cleans up).
    pub fn output(&self, args: &[OsString]) -> Result<Output, PodmanError> {
        self.command(args)
            .stdin(Stdio::null())
            .process_group(0)
            .output()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    PodmanError::NotInstalled
                } else {
                    PodmanError::Spawn(e)
                }
            })
    }

    /// Runs a helper command; non-zero exit is an error. Returns stdout.
    pub fn run(&self, args: &[OsString]) -> Result<String, PodmanError> {
        let out = self.output(args)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(PodmanError::Failed {
                command: self.display(args),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// Runs a command whose exit status is the answer (`exists`): Ok(true) on 0, Ok(false) on 1.
    pub fn check(&self, args: &[OsString]) -> Result<bool, PodmanError> {
        let out = self.output(args)?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(PodmanError::Failed {
                command: self.display(args),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }),
        }
    }

    /// Runs a command with the launcher's own stdin, stdout and stderr (image builds and pulls show
    /// their progress; non-zero exit is an error).
    pub fn run_visible(&self, args: &[OsString]) -> Result<(), PodmanError> {
        let status = self.command(args).status().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PodmanError::NotInstalled,
            _ => PodmanError::Spawn(e),
        })?;
        if status.success() {
            Ok(())
        } else {
            Err(PodmanError::Failed {
                command: self.display(args),
                status,
                stderr: String::new(),
            })
        }
    }

    /// Starts a podman command whose stdout and stderr the caller reads (`logs --follow`).
    pub fn spawn_piped(&self, args: &[OsString]) -> Result<Child, PodmanError> {
        self.command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => PodmanError::NotInstalled,
                _ => PodmanError::Spawn(e),
            })
    }

    /// Starts the sandbox's `podman run` with the launcher's terminal: it stays in the launcher's process
    /// group, because with a TTY podman must be in the terminal's foreground group.
    pub fn spawn_foreground(&self, args: &[OsString]) -> Result<Child, PodmanError> {
        self.command(args).spawn().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => PodmanError::NotInstalled,
            _ => PodmanError::Spawn(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_what_needs_it() {
        let p = Podman::default();
        assert_eq!(
            p.display(&["run".into(), "a b".into(), "it's".into()]),
            r"podman run 'a b' 'it'\''s'"
        );
        assert_eq!(
            p.with_hooks_dir(std::path::Path::new("/run/s/no-hooks"))
                .display(&["init".into(), "c".into()]),
            "podman --hooks-dir /run/s/no-hooks init c"
        );
    }
}
