//! Runs podman: the argument vectors from `args.rs` go in, stdout or a [`PodmanError`] that shows the
//! command and podman's own message comes out.
//!
//! A podman command the launcher waits for does not block it for ever: podman waits without a limit
//! for a lock that another podman command holds (a stuck `podman` process, a hung storage). So each
//! captured command has a [`DEADLINE`], but those that create or start a container, which can
//! legitimately take minutes ([`bounded`]), and a podman that is [`Podman::interruptible`] also
//! gives up its commands [`INTERRUPT_GRACE`] after the launcher is first told to stop. A command that is
//! given up is stopped with its process group (SIGTERM, then SIGKILL) and reported with what to look at.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long a podman command may run: far beyond the tenths of a second such commands take (`podman
/// info`, the slowest, about half a second), and beyond the minutes another podman command may
/// legitimately hold the storage lock for (rootless `podman create` copying a large image for a new
/// user mapping on slow storage), for a podman that waits on a lock that is never released. Commands
/// that create or start a container have none ([`bounded`]), nor do image builds and pulls, or the
/// sandbox's own command.
pub(crate) const DEADLINE: Duration = Duration::from_secs(300);

/// How long the commands of an [`interruptible`](Podman::interruptible) podman may go on once the
/// launcher is first told to stop: time to finish a step that is only slow, not enough to make Ctrl-C
/// look ignored. Counted once, from the stop, for every command that is under way or comes later.
pub(crate) const INTERRUPT_GRACE: Duration = Duration::from_secs(3);

/// How long a stopped podman has between SIGTERM and SIGKILL, and then to be gone.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How long the launcher waits for podman's output once podman has ended (what podman said is in the
/// pipes by then; only something it started and left holding them makes the readers wait).
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// How often a child is looked at where the kernel has no pidfds (Linux before 5.3, or a seccomp
/// profile that denies them).
const POLL_WITHOUT_PIDFD: Duration = Duration::from_millis(20);

/// Whether a podman command gets the [`DEADLINE`]. Those that make or start a container do not: rootless,
/// the first container of an image in a user mapping (the sandbox's and the forwarder's keep-id) makes
/// an ID-mapped copy of the image, in `podman create` or `podman run`, which takes minutes for a large
/// image on slow storage, podman's issue tracker says (cut short, nothing of it is kept, so every later
/// start would be cut short too); `podman init` re-owns a home volume (`:U`), however large; builds and
/// pulls take what they take. Everything else has it: queries, removals, signals, `podman unshare`
/// reads, networks, volumes and pods (the infra container comes from podman's small pause image), and a
/// `podman run --rm` that reads something from an image (no user mapping of its own).
#[must_use]
pub(crate) fn bounded(args: &[OsString]) -> bool {
    let word = |i: usize| args.get(i).and_then(|a| a.to_str()).unwrap_or("");
    let (verb, rest) = if word(0) == "container" || word(0) == "image" {
        (word(1), args.get(2..).unwrap_or_default())
    } else {
        (word(0), args.get(1..).unwrap_or_default())
    };
    match verb {
        "run" => rest.iter().any(|a| a == "--rm"),
        "create" | "init" | "start" | "restart" | "build" | "pull" | "load" | "commit" => false,
        // `pod create`, `network create`, `volume create` among them.
        _ => true,
    }
}

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
    /// podman did not finish within its deadline and was stopped.
    #[error(
        "`{command}` did not finish in {} s and was stopped: another podman command may hold podman's \
         lock (`ps -ef | grep podman` shows what runs), or its storage is very slow",
        .after.as_secs()
    )]
    TimedOut {
        /// The command line.
        command: String,
        /// The deadline it had.
        after: Duration,
    },
    /// The launcher was told to stop, and podman did not finish within [`INTERRUPT_GRACE`] of that: it
    /// was stopped (or, the grace being over, not started).
    #[error("`{command}` was stopped: the launcher was interrupted")]
    Interrupted {
        /// The command line.
        command: String,
    },
    /// podman ended, but something it started kept its output open: what it said was not read whole.
    #[error(
        "`{command}` ended ({status}), but a process it started kept its output open, so its answer was \
         not read whole (what was left of its process group was stopped)"
    )]
    OutputHeld {
        /// The command line.
        command: String,
        /// How podman ended.
        status: ExitStatus,
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
    /// How long a captured command may run ([`DEADLINE`]).
    deadline: Duration,
    /// When this says stop, a captured command gets [`Interrupt::grace`] more, then is stopped.
    interrupt: Option<Interrupt>,
    /// Whether to wait through pidfds where the kernel has them (always, but in the tests of the
    /// polling that stands in for them).
    pidfds: bool,
}

/// What makes an [`interruptible`](Podman::interruptible) podman give up a command.
#[derive(Clone)]
struct Interrupt {
    stop: Arc<dyn Fn() -> bool + Send + Sync>,
    grace: Duration,
    /// When `stop` first said so, to any command of this podman or of its clones.
    first: Arc<OnceLock<Instant>>,
}

impl Interrupt {
    /// When the grace ends, once `stop` has said so (looked at now if it had not yet).
    fn until(&self) -> Option<Instant> {
        let first = match self.first.get() {
            Some(at) => *at,
            None if (self.stop)() => *self.first.get_or_init(Instant::now),
            None => return None,
        };
        Some(first + self.grace)
    }
}

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interrupt")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Default for Podman {
    fn default() -> Self {
        Podman {
            program: "podman".into(),
            globals: Vec::new(),
            deadline: DEADLINE,
            interrupt: None,
            pidfds: true,
        }
    }
}

/// How a captured command ended.
enum Ended {
    /// It ended by itself (not reaped yet).
    Exited,
    /// Given up at its deadline.
    TimedOut,
    /// Given up after a stop.
    Interrupted,
}

impl Podman {
    /// Runs `program` instead of podman: a stand-in, for tests of what drives podman.
    #[cfg(test)]
    pub(crate) fn stand_in(program: impl Into<OsString>) -> Podman {
        Podman {
            program: program.into(),
            ..Podman::default()
        }
    }

    /// This podman with another deadline for captured commands (tests).
    #[cfg(test)]
    pub(crate) fn with_deadline(&self, deadline: Duration) -> Podman {
        Podman {
            deadline,
            ..self.clone()
        }
    }

    /// This podman waiting for its commands by polling, as where there are no pidfds (tests).
    #[cfg(test)]
    pub(crate) fn without_pidfds(&self) -> Podman {
        Podman {
            pidfds: false,
            ..self.clone()
        }
    }

    /// This podman, giving up a captured command [`INTERRUPT_GRACE`] after `stop` first says so: for the
    /// steps of a start that a signal abandons (the caller's cleanup removes what exists), never for a
    /// cleanup.
    #[must_use]
    pub fn interruptible(&self, stop: impl Fn() -> bool + Send + Sync + 'static) -> Podman {
        self.interruptible_within(stop, INTERRUPT_GRACE)
    }

    fn interruptible_within(
        &self,
        stop: impl Fn() -> bool + Send + Sync + 'static,
        grace: Duration,
    ) -> Podman {
        Podman {
            interrupt: Some(Interrupt {
                stop: Arc::new(stop),
                grace,
                first: Arc::new(OnceLock::new()),
            }),
            ..self.clone()
        }
    }

    /// This podman without [`Podman::interruptible`]'s stop: what removes a session's objects, and what
    /// runs while the sandboxed command does (a signal then is meant for the command).
    #[must_use]
    pub fn uninterruptible(&self) -> Podman {
        Podman {
            interrupt: None,
            ..self.clone()
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
            globals: vec!["--hooks-dir".into(), dir.into()],
            ..self.clone()
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
    /// finishes the step, then cleans up). Gives up at the [`DEADLINE`] when [`bounded`], and after a
    /// stop when [`interruptible`](Podman::interruptible).
    pub fn output(&self, args: &[OsString]) -> Result<Output, PodmanError> {
        self.output_within(args, bounded(args).then_some(self.deadline))
    }

    /// [`Podman::output`] without the deadline: for a command that runs as long as what it runs does
    /// (the doctor's probe in its sandbox, which bounds itself).
    pub fn output_unbounded(&self, args: &[OsString]) -> Result<Output, PodmanError> {
        self.output_within(args, None)
    }

    fn output_within(
        &self,
        args: &[OsString],
        deadline: Option<Duration>,
    ) -> Result<Output, PodmanError> {
        let started = Instant::now();
        let gave_up = |ended: Ended| match ended {
            Ended::Interrupted => PodmanError::Interrupted {
                command: self.display(args),
            },
            _ => PodmanError::TimedOut {
                command: self.display(args),
                after: deadline.unwrap_or_default(),
            },
        };
        // Past the grace already: not started at all.
        if let Some(until) = self.interrupt.as_ref().and_then(Interrupt::until) {
            if until <= started {
                return Err(gave_up(Ended::Interrupted));
            }
        }
        let child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(spawn_error)?;
        let mut watch = Watch::new(child, self.pidfds);
        let readers = collect(watch.child.stdout.take())
            .and_then(|out| Ok((out, collect(watch.child.stderr.take())?)));
        let (stdout, stderr) = match readers {
            Ok(readers) => readers,
            Err(e) => {
                watch.stop_group();
                return Err(PodmanError::Spawn(e));
            }
        };
        match self.wait(&mut watch, started, deadline) {
            Ok(Ended::Exited) => {}
            Ok(ended) => {
                watch.stop_group();
                return Err(gave_up(ended));
            }
            Err(e) => {
                watch.stop_group();
                return Err(PodmanError::Spawn(e));
            }
        }
        // podman has ended (not reaped yet). What it started in its group and left holding its pipes
        // gets a few seconds to let go of them (within what is left of the deadline, a second at
        // least, and of the grace after a stop, a tenth at least), then is stopped.
        let mut left = OUTPUT_GRACE;
        if let Some(d) = deadline {
            left = left.min(
                d.saturating_sub(started.elapsed())
                    .max(Duration::from_secs(1)),
            );
        }
        if let Some(until) = self.interrupt.as_ref().and_then(Interrupt::until) {
            let grace = until.saturating_duration_since(Instant::now());
            left = left.min(grace.max(Duration::from_millis(100)));
        }
        let until = Instant::now() + left;
        let take = |rx: &mpsc::Receiver<Vec<u8>>| {
            rx.recv_timeout(until.saturating_duration_since(Instant::now()))
                .ok()
        };
        let (out, err) = (take(&stdout), take(&stderr));
        let held = out.is_none() || err.is_none();
        if held {
            watch.kill_group(libc::SIGKILL);
        }
        let status = watch.child.wait().map_err(PodmanError::Spawn)?;
        match (out, err) {
            (Some(stdout), Some(stderr)) => Ok(Output {
                status,
                stdout,
                stderr,
            }),
            _ => Err(PodmanError::OutputHeld {
                command: self.display(args),
                status,
            }),
        }
    }

    /// Waits for the child to end (without reaping it), at most until `deadline` after `started` and,
    /// when interruptible, until [`Interrupt::until`].
    fn wait(
        &self,
        watch: &mut Watch,
        started: Instant,
        deadline: Option<Duration>,
    ) -> io::Result<Ended> {
        let end = deadline.and_then(|d| started.checked_add(d));
        loop {
            let now = Instant::now();
            let mut wait = end.map_or(Duration::MAX, |e| e.saturating_duration_since(now));
            if wait.is_zero() {
                return Ok(Ended::TimedOut);
            }
            if let Some(interrupt) = &self.interrupt {
                match interrupt.until() {
                    Some(until) if until <= now => return Ok(Ended::Interrupted),
                    Some(until) => wait = wait.min(until - now),
                    // Look at the stop ten times a second.
                    None => wait = wait.min(Duration::from_millis(100)),
                }
            }
            if watch.ended_within(wait)? {
                return Ok(Ended::Exited);
            }
        }
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
        let status = self.command(args).status().map_err(spawn_error)?;
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
            .map_err(spawn_error)
    }

    /// Starts the sandbox's `podman run` with the launcher's terminal: it stays in the launcher's process
    /// group, because with a TTY podman must be in the terminal's foreground group.
    pub fn spawn_foreground(&self, args: &[OsString]) -> Result<Child, PodmanError> {
        self.command(args).spawn().map_err(spawn_error)
    }
}

fn spawn_error(e: io::Error) -> PodmanError {
    match e.kind() {
        io::ErrorKind::NotFound => PodmanError::NotInstalled,
        _ => PodmanError::Spawn(e),
    }
}

/// Reads `pipe` to its end on a thread of its own; the bytes come on the channel (none if the pipe is
/// absent or fails: what was read before a failure still comes).
fn collect(pipe: Option<impl io::Read + Send + 'static>) -> io::Result<mpsc::Receiver<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    match pipe {
        Some(mut pipe) => {
            std::thread::Builder::new()
                .name("podman-output".into())
                .spawn(move || {
                    let mut bytes = Vec::new();
                    let _ = pipe.read_to_end(&mut bytes);
                    let _ = tx.send(bytes);
                })?;
        }
        None => {
            let _ = tx.send(Vec::new());
        }
    }
    Ok(rx)
}

/// A pidfd for `pid`, a child not yet waited for (so the pid cannot have been reused); none where the
/// kernel has no pidfds.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1; no memory is
    // passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A child being waited for, never reaped before [`Child::wait`], so that its pid, which is also its
/// process group's id, stays its own until then and the group can always be signalled: through a pidfd,
/// or, where there are no pidfds, by polling `waitid` with `WNOWAIT`.
struct Watch {
    child: Child,
    pidfd: Option<OwnedFd>,
}

impl Watch {
    fn new(child: Child, pidfds: bool) -> Watch {
        let pidfd = if pidfds { pidfd_open(child.id()) } else { None };
        Watch { child, pidfd }
    }

    /// Whether the child ends within `wait`.
    fn ended_within(&self, wait: Duration) -> io::Result<bool> {
        if let Some(fd) = &self.pidfd {
            return exited_within(fd, wait);
        }
        let until = Instant::now().checked_add(wait);
        loop {
            if self.ended()? {
                return Ok(true);
            }
            let left = until.map_or(Duration::MAX, |u| {
                u.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Ok(false);
            }
            std::thread::sleep(left.min(POLL_WITHOUT_PIDFD));
        }
    }

    /// Whether the child has ended, leaving it to be reaped.
    fn ended(&self) -> io::Result<bool> {
        let pid = libc::id_t::from(self.child.id());
        loop {
            // SAFETY: an all-zero siginfo_t is a valid value for waitid(2) to fill in.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid(2) on our own child, writing only `info`; WNOWAIT leaves it unreaped.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            if r == 0 {
                // SAFETY: filled in by waitid for a child (WNOHANG leaves the pid 0 when none ended).
                return Ok(unsafe { info.si_pid() } != 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Sends `signal` to the child's process group (the child is not reaped yet, so the group's id is
    /// still its own).
    fn kill_group(&self, signal: libc::c_int) {
        let Ok(pgid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill(2) on the group of a child not reaped yet: no memory effects.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }

    /// Stops a child that is being given up, with its process group (podman and what it started
    /// there): SIGTERM; then SIGKILL to whatever of the group is left after [`STOP_GRACE`] or once the
    /// child has gone (what it started may ignore SIGTERM); reaped if it goes within another (a podman
    /// that not even SIGKILL ends, in uninterruptible sleep on hung storage, is left to the kernel).
    fn stop_group(&mut self) {
        self.kill_group(libc::SIGTERM);
        let ended = self.ended_within(STOP_GRACE).unwrap_or(false);
        self.kill_group(libc::SIGKILL);
        if ended || self.ended_within(STOP_GRACE).unwrap_or(false) {
            let _ = self.child.wait();
        }
    }
}

/// Whether the process behind `pidfd` exits within `wait` (a pidfd polls readable once it has).
fn exited_within(pidfd: &OwnedFd, wait: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let until = Instant::now().checked_add(wait);
    loop {
        let left = until.map_or(Duration::MAX, |u| {
            u.saturating_duration_since(Instant::now())
        });
        // poll(2) counts in milliseconds: round up, and wait a minute at a time.
        let capped = left.min(Duration::from_secs(60));
        let ms = libc::c_int::try_from(capped.as_micros().div_ceil(1000)).unwrap_or(60_000);
        // SAFETY: one valid pollfd, its count, a timeout; the kernel writes only `revents`.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else if capped == left {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A directory of this test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("as-runner-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        /// A stand-in podman running `body` (sh), with `$DIR` this directory.
        fn podman(&self, body: &str) -> Podman {
            let script = self.0.join("podman");
            std::fs::write(
                &script,
                format!("#!/bin/sh\nDIR='{}'\n{body}\n", self.0.display()),
            )
            .unwrap();
            std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            Podman::stand_in(script)
        }

        /// The pid the stand-in wrote to `$DIR/pid`, once it has.
        fn pid(&self) -> libc::pid_t {
            let file = self.0.join("pid");
            let t = Instant::now();
            loop {
                if let Some(pid) = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                {
                    return pid;
                }
                assert!(t.elapsed() < Duration::from_secs(10), "no pid written");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Whether `pid` is gone (or a zombie waiting for init), polled for up to five seconds.
    fn gone(pid: libc::pid_t) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat)
                    if stat
                        .rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z') =>
                {
                    return true
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        false
    }

    fn kill(pid: libc::pid_t) {
        // SAFETY: kill(2) on a test's own stray process; no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }

    #[test]
    fn a_command_that_ends_gives_all_its_output_and_status() {
        let dir = Scratch::new("output");
        // More than a pipe holds on each stream, so both must be read while it runs.
        let podman = dir.podman("head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2; exit 3");
        let out = podman.output(&["x".into()]).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!((out.stdout.len(), out.stderr.len()), (300_000, 200_000));
        let err = podman.run(&["x".into()]).unwrap_err();
        assert!(matches!(err, PodmanError::Failed { .. }), "{err}");
    }

    /// What `body`, run as podman with `deadline`, ended in: the error, how long the launcher waited,
    /// and whether the process whose pid it wrote to `$DIR/pid` was gone soon after (it is killed
    /// either way).
    fn given_up(name: &str, body: &str, deadline: Duration) -> (PodmanError, Duration, bool) {
        given_up_by(name, body, |p| p.with_deadline(deadline))
    }

    /// [`given_up`] with the stand-in podman made ready by `ready`.
    fn given_up_by(
        name: &str,
        body: &str,
        ready: impl Fn(Podman) -> Podman,
    ) -> (PodmanError, Duration, bool) {
        let dir = Scratch::new(name);
        let podman = ready(dir.podman(body));
        let t = Instant::now();
        let err = podman.output(&["network".into(), "ls".into()]).unwrap_err();
        let took = t.elapsed();
        let pid = dir.pid();
        let stopped = gone(pid);
        kill(pid);
        (err, took, stopped)
    }

    #[test]
    fn a_command_past_its_deadline_is_stopped_with_its_process_group() {
        let (err, took, stopped) = given_up(
            "deadline",
            "sleep 60 & echo $! > \"$DIR/pid\"; wait",
            Duration::from_millis(300),
        );
        assert!(
            matches!(&err, PodmanError::TimedOut { command, .. } if command.ends_with(" network ls")),
            "{err}"
        );
        assert!(err.to_string().contains("lock"), "{err}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(
            stopped,
            "what the command started in its group is still running"
        );
    }

    #[test]
    fn a_command_that_ignores_sigterm_is_killed() {
        let (err, took, stopped) = given_up(
            "sigterm",
            "trap '' TERM; sleep 60 & echo $! > \"$DIR/pid\"; wait; wait",
            Duration::from_millis(200),
        );
        assert!(matches!(err, PodmanError::TimedOut { .. }), "{err}");
        assert!(took < STOP_GRACE * 2, "took {took:?}");
        assert!(stopped, "SIGKILL did not follow");
    }

    /// The two ways of waiting: through pidfds, and by polling where there are none.
    const MODES: [fn(Podman) -> Podman; 2] = [|p| p, |p| p.without_pidfds()];

    #[test]
    fn a_group_member_that_ignores_sigterm_is_killed_when_the_command_goes() {
        for mode in MODES {
            let (err, took, stopped) = given_up_by(
                "member",
                "(trap '' TERM; exec sleep 60) & echo $! > \"$DIR/pid\"; wait",
                |p| mode(p).with_deadline(Duration::from_millis(200)),
            );
            assert!(matches!(err, PodmanError::TimedOut { .. }), "{err}");
            assert!(took < STOP_GRACE * 2, "took {took:?}");
            assert!(stopped, "what the command started outlived it");
        }
    }

    #[test]
    fn without_pidfds_the_deadline_and_the_stop_still_hold() {
        let (err, took, stopped) =
            given_up_by("nopidfd", "sleep 60 & echo $! > \"$DIR/pid\"; wait", |p| {
                p.without_pidfds().with_deadline(Duration::from_millis(200))
            });
        assert!(matches!(err, PodmanError::TimedOut { .. }), "{err}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(stopped);
        let (err, took, stopped) = given_up_by(
            "nopidfd-stop",
            "echo $$ > \"$DIR/pid\"; exec sleep 60",
            |p| {
                p.without_pidfds()
                    .interruptible_within(|| true, Duration::from_millis(200))
            },
        );
        assert!(matches!(err, PodmanError::Interrupted { .. }), "{err}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(stopped);
        // And what ends by itself is read whole.
        let dir = Scratch::new("nopidfd-ok");
        let out = dir
            .podman("head -c 100000 /dev/zero; exit 2")
            .without_pidfds()
            .output(&["x".into()])
            .unwrap();
        assert_eq!((out.status.code(), out.stdout.len()), (Some(2), 100_000));
    }

    #[test]
    fn pipes_held_after_the_command_ended_do_not_hang_it() {
        // The command ends at once, but what it started in its group keeps its stdout open: reported
        // as such, and stopped.
        for mode in MODES {
            let (err, took, stopped) =
                given_up_by("pipes", "sleep 60 & echo $! > \"$DIR/pid\"; exit 0", |p| {
                    mode(p).with_deadline(Duration::from_millis(100))
                });
            assert!(matches!(err, PodmanError::OutputHeld { .. }), "{err}");
            assert!(took < Duration::from_secs(3), "took {took:?}");
            assert!(stopped, "the process holding the pipes was left running");
        }
        // A command without a deadline waits for its pipes a few seconds at most, and after a stop no
        // longer than the grace.
        let dir = Scratch::new("pipes-create");
        let podman = dir
            .podman("sleep 60 & echo $! > \"$DIR/pid\"; exit 0")
            .interruptible_within(|| true, Duration::from_millis(300));
        let t = Instant::now();
        let err = podman.output(&["create".into(), "img".into()]).unwrap_err();
        let took = t.elapsed();
        let stopped = gone(dir.pid());
        kill(dir.pid());
        assert!(matches!(err, PodmanError::OutputHeld { .. }), "{err}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(stopped);
    }

    #[test]
    fn the_grace_after_a_stop_is_counted_once_for_every_command() {
        let dir = Scratch::new("once");
        let podman = dir
            .podman("echo $$ >> \"$DIR/started\"; exec sleep 60")
            .interruptible_within(|| true, Duration::from_millis(300));
        let t = Instant::now();
        let first = podman.output(&["x".into()]).unwrap_err();
        let clone = podman.with_hooks_dir(Path::new("/h"));
        let later: Vec<PodmanError> = (0..3)
            .map(|_| clone.output(&["y".into()]).unwrap_err())
            .collect();
        let took = t.elapsed();
        let started = std::fs::read_to_string(dir.0.join("started")).unwrap_or_default();
        assert!(matches!(first, PodmanError::Interrupted { .. }), "{first}");
        assert!(
            later
                .iter()
                .all(|e| matches!(e, PodmanError::Interrupted { .. })),
            "{later:?}"
        );
        // Only the first was started; the others came after the grace and were not.
        assert_eq!(started.lines().count(), 1, "{started}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    #[test]
    fn what_makes_or_starts_something_has_no_deadline() {
        let words = |w: &str| -> Vec<OsString> { w.split(' ').map(OsString::from).collect() };
        for unbounded in [
            "create --name x img",
            "init x",
            "run --detach --pod p img",
            "start --attach x",
            "container create img",
            "container run -d img",
            "image pull img",
            "build -f f .",
        ] {
            assert!(!bounded(&words(unbounded)), "{unbounded}");
        }
        for bounded_ in [
            "info --format json",
            "network ls",
            "volume inspect v",
            "image inspect img",
            "pod rm --force p",
            "rm --force x",
            "network rm --force n",
            "kill x",
            "unshare head -c 9 f",
            "logs x",
            "container inspect x",
            "pod create --name p",
            "network create --internal n",
            "volume create v",
            "run --rm --pull=never --entrypoint cat img /etc/ssl/certs/ca.pem",
        ] {
            assert!(bounded(&words(bounded_)), "{bounded_}");
        }
    }

    #[test]
    fn an_interruptible_command_is_given_up_after_the_grace_once_told_to_stop() {
        let dir = Scratch::new("interrupt");
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let podman = dir
            .podman("echo $$ > \"$DIR/pid\"; exec sleep 60")
            .interruptible_within(move || s.load(Ordering::SeqCst), Duration::from_millis(200));
        let t = Instant::now();
        let (err, told) = std::thread::scope(|scope| {
            let run = scope.spawn(|| podman.output(&["volume".into(), "inspect".into()]));
            let _ = dir.pid();
            let told = Instant::now();
            stop.store(true, Ordering::SeqCst);
            (run.join().unwrap().unwrap_err(), told)
        });
        let after_stop = told.elapsed();
        assert!(matches!(err, PodmanError::Interrupted { .. }), "{err}");
        assert!(err.to_string().contains("interrupted"), "{err}");
        assert!(
            after_stop < Duration::from_secs(2) && t.elapsed() < Duration::from_secs(10),
            "took {after_stop:?} after the stop"
        );
        assert!(gone(dir.pid()));
    }

    #[test]
    fn a_command_that_finishes_within_the_grace_after_a_stop_is_kept() {
        let dir = Scratch::new("grace");
        let podman = dir
            .podman("sleep 0.3; echo done")
            .interruptible_within(|| true, Duration::from_secs(5));
        assert_eq!(podman.run(&["x".into()]).unwrap(), "done\n");
        // And without the stop, once made uninterruptible again.
        let podman = podman.uninterruptible();
        assert_eq!(podman.run(&["x".into()]).unwrap(), "done\n");
    }

    #[test]
    fn the_hooks_directory_keeps_the_deadline_and_the_stop() {
        let p = Podman::default()
            .with_deadline(Duration::from_secs(7))
            .interruptible(|| false)
            .with_hooks_dir(Path::new("/h"));
        assert_eq!(p.deadline, Duration::from_secs(7));
        assert!(p.interrupt.is_some());
        assert!(p.uninterruptible().interrupt.is_none());
    }

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
