//! Who runs podman and the launcher (rootful root, or a rootless user through runuser), and the small
//! process and file helpers every part of the suite uses.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A file of the source tree.
pub(crate) fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Runs a command to completion, panicking only when it cannot be started.
pub(crate) fn sh(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// A command's stdout and stderr, for messages.
pub(crate) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Who runs podman and the launcher.
#[derive(Clone, Debug)]
pub(crate) struct Mode {
    /// None: this process's user (root: rootful). Some: that user through runuser (rootless).
    pub(crate) user: Option<String>,
    /// The user's id (0 when rootful).
    pub(crate) uid: u32,
    /// The user's primary group.
    pub(crate) gid: u32,
    /// `HOME` for podman and the launcher: where the allowlist and podman's configuration live.
    pub(crate) home: PathBuf,
}

impl Mode {
    /// `rootful` or `rootless`: the first part of every check's and scenario's name.
    pub(crate) fn name(&self) -> &str {
        if self.user.is_some() || self.uid != 0 {
            "rootless"
        } else {
            "rootful"
        }
    }

    /// True when podman runs as root.
    pub(crate) fn rootful(&self) -> bool {
        self.name() == "rootful"
    }

    /// A command run as this mode's user with a clean, explicit environment.
    pub(crate) fn command(&self, program: &str, env: &[(&str, String)]) -> Command {
        let mut vars: Vec<(String, String)> = vec![
            ("HOME".into(), self.home.display().to_string()),
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
        ];
        if let Ok(c) = std::env::var("CONTAINERS_CONF") {
            vars.push(("CONTAINERS_CONF".into(), c));
        }
        let runtime = PathBuf::from(format!("/run/user/{}", self.uid));
        if runtime.is_dir() {
            vars.push(("XDG_RUNTIME_DIR".into(), runtime.display().to_string()));
        }
        if let Some(user) = &self.user {
            vars.push(("USER".into(), user.clone()));
        }
        vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        let mut c = match &self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--", "env", "-i"]);
                c
            }
            None => {
                let mut c = Command::new("env");
                c.arg("-i");
                c
            }
        };
        for (k, v) in vars {
            c.arg(format!("{k}={v}"));
        }
        c.arg(program);
        c
    }

    /// `podman ARGS` as this mode's user.
    pub(crate) fn podman(&self, args: &[&str]) -> Output {
        sh(self.command("podman", &[]).args(args))
    }

    /// `podman ARGS` that must succeed; its stdout.
    pub(crate) fn podman_ok(&self, args: &[&str]) -> String {
        let o = self.podman(args);
        assert!(
            o.status.success(),
            "podman {args:?} ({}) failed: {}",
            self.name(),
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

/// A local user's uid, gid and home directory from /etc/passwd.
pub(crate) fn uid_gid(user: &str) -> (u32, u32, PathBuf) {
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 7 && f[0] == user {
            return (f[2].parse().unwrap(), f[3].parse().unwrap(), f[5].into());
        }
    }
    panic!("no user {user}");
}

/// This process's uid and gid.
pub(crate) fn current_ids() -> (u32, u32) {
    let m = fs::metadata("/proc/self").unwrap();
    (m.uid(), m.gid())
}

/// `chown -R uid:gid path`: files the suite makes for a rootless user must be that user's.
pub(crate) fn chown_r(path: &Path, uid: u32, gid: u32) {
    let o = sh(Command::new("chown").args(["-R", &format!("{uid}:{gid}"), path.to_str().unwrap()]));
    assert!(o.status.success(), "chown: {}", text(&o));
}
