//! One mode's run: the fixture it creates (and removes on drop), the upstream "internet" containers, and
//! the helpers scenarios use to make projects, start the launcher in them and look at what podman has.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::checks::Checks;
use crate::mode::{chown_r, repo_file, text, Mode};
use crate::setup::Artifacts;
use crate::{ALLOWLIST, EGRESS, LAUNCHER, PROJECT_LABEL, SANDBOX_IMAGE, SESSION_LABEL, TEST_LABEL};

/// What one suite run created, removed on drop (also when a check panics).
pub(crate) struct Fixture {
    /// Whose podman the objects are in.
    pub(crate) mode: Mode,
    /// The mode's directory of projects.
    pub(crate) root: PathBuf,
    /// Containers the suite started (the upstreams).
    pub(crate) containers: Vec<String>,
    /// Volumes sessions created (the home volume).
    pub(crate) volumes: Vec<String>,
    /// The egress network did not exist before: remove it again.
    pub(crate) created_egress: bool,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = self.mode.podman(&["rm", "--force", "--time", "0", c]);
        }
        // Any session the launcher failed to clean up for one of this suite's projects.
        let out = self.mode.podman(&[
            "ps",
            "--all",
            "--filter",
            &format!("label={SESSION_LABEL}"),
            "--format",
            "{{.Names}} {{.Labels}}",
        ]);
        let root = self.root.display().to_string();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.contains(&root) {
                if let Some(name) = line.split_whitespace().next() {
                    let _ = self.mode.podman(&["rm", "--force", "--time", "0", name]);
                }
            }
        }
        for v in &self.volumes {
            let _ = self.mode.podman(&["volume", "rm", "--force", v]);
        }
        if self.created_egress {
            let _ = self.mode.podman(&["network", "rm", "--force", EGRESS]);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The launcher's result.
pub(crate) struct Run {
    /// Exit status; None when killed by a signal or by the deadline.
    pub(crate) code: Option<i32>,
    /// Everything it wrote to stdout (the sandbox command's output).
    pub(crate) stdout: String,
    /// Everything it wrote to stderr (the launcher's own messages and report).
    pub(crate) stderr: String,
}

/// What [`Suite::touch_session`] saw.
pub(crate) struct Touched {
    /// The launcher's run.
    pub(crate) run: Run,
    /// The command ran (its file exists).
    pub(crate) ran: bool,
    /// The session's objects still there afterwards.
    pub(crate) left: Vec<String>,
}

/// One mode's run: scenarios get it mutably, one after the other.
pub(crate) struct Suite<'a> {
    /// Who runs podman and the launcher.
    pub(crate) mode: Mode,
    /// What to remove at the end.
    pub(crate) fx: Fixture,
    /// The home volume the suite's sessions use (not the user's real one).
    pub(crate) home_volume: String,
    /// Where verdicts go.
    pub(crate) checks: &'a mut Checks,
    /// The test CA's certificate, copied into every project.
    pub(crate) ca: PathBuf,
    /// The shared artifacts directory.
    pub(crate) artifacts: PathBuf,
}

impl<'a> Suite<'a> {
    /// Sets up one mode: the suite's directory, HOME with the allowlist, the egress network if missing,
    /// and the upstream containers on it.
    pub(crate) fn new(mode: Mode, checks: &'a mut Checks, artifacts: &Artifacts) -> Suite<'a> {
        // The suite's own directory: under the user's home when rootless (their files, their paths).
        let root = if mode.rootful() {
            artifacts.dir.join("rootful")
        } else {
            mode.home.join(format!("as-e2e-{}", std::process::id()))
        };
        fs::create_dir_all(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        if mode.rootful() {
            fs::create_dir_all(&mode.home).unwrap();
        }
        let allowlist_dir = mode.home.join(".config/agent-sandbox");
        fs::create_dir_all(&allowlist_dir).unwrap();
        fs::write(allowlist_dir.join("allowed-hosts"), ALLOWLIST).unwrap();
        if !mode.rootful() {
            chown_r(&root, mode.uid, mode.gid);
            chown_r(&mode.home.join(".config"), mode.uid, mode.gid);
        }

        let created_egress = mode.podman(&["network", "exists", EGRESS]).status.code() != Some(0);
        if created_egress {
            mode.podman_ok(&["network", "create", EGRESS]);
        }
        let home_volume = format!("as-e2e-home-{}", std::process::id());
        let fx = Fixture {
            mode: mode.clone(),
            root,
            containers: Vec::new(),
            volumes: vec![home_volume.clone()],
            created_egress,
        };
        let mut s = Suite {
            mode,
            fx,
            home_volume,
            checks,
            ca: artifacts.ca.clone(),
            artifacts: artifacts.dir.clone(),
        };
        s.start_upstreams();
        s
    }
}

impl Suite<'_> {
    /// A fresh project directory `name` with the CA certificate in it, owned by the mode's user.
    pub(crate) fn project(&self, name: &str) -> PathBuf {
        let dir = self.fx.root.join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::copy(&self.ca, dir.join("ca.crt")).unwrap();
        if !self.mode.rootful() {
            chown_r(&dir, self.mode.uid, self.mode.gid);
        }
        dir
    }

    /// Copies `tests/e2e/scripts/NAME` and the helpers it sources into the project.
    pub(crate) fn copy_script(&self, dir: &Path, name: &str) {
        for (file, mode) in [(name, 0o755), ("helpers.sh", 0o644)] {
            let path = dir.join(file);
            fs::copy(repo_file(&format!("tests/e2e/scripts/{file}")), &path).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            if !self.mode.rootful() {
                chown_r(&path, self.mode.uid, self.mode.gid);
            }
        }
    }

    /// The launcher in `dir`: `exec 'CMD'...`, with stdin closed.
    pub(crate) fn launcher_command(
        &self,
        dir: &Path,
        args: &[&str],
        extra_env: &[(&str, String)],
    ) -> Command {
        let mut env = vec![("AGENT_SANDBOX_HOME_VOLUME", self.home_volume.clone())];
        env.extend(extra_env.iter().cloned());
        // `cd` and exec through sh, so the launcher's pid is the one written to the pid file.
        let mut c = self.mode.command("sh", &env);
        c.arg("-c")
            .arg(r#"cd "$1" && echo $$ > "$2" && shift 2 && exec "$@""#)
            .arg("sh")
            .arg(dir)
            .arg(self.pid_file(dir))
            .arg(LAUNCHER)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Where the launcher started in `dir` writes its pid.
    pub(crate) fn pid_file(&self, dir: &Path) -> PathBuf {
        let name = dir
            .file_name()
            .map_or_else(|| "root".to_owned(), |n| n.to_string_lossy().into_owned());
        self.fx.root.join(format!("{name}.pid"))
    }

    /// Runs the launcher in `dir` to completion (5 minutes at most).
    pub(crate) fn launch(&self, dir: &Path, args: &[&str]) -> Run {
        self.launch_env(dir, args, &[])
    }

    /// A session in a new project `name` whose command touches a file there, with extra environment
    /// variables: what it ended with, whether the command ran, and the session's objects left behind
    /// (for the cases where the launcher must refuse before the command runs).
    pub(crate) fn touch_session(&self, name: &str, env: &[(&str, String)]) -> Touched {
        let dir = self.project(name);
        let ran = dir.join("ran-in-sandbox");
        let run = self.launch_env(&dir, &["--exec", "touch", ran.to_str().unwrap()], env);
        Touched {
            ran: ran.exists(),
            left: self.session_objects(&dir),
            run,
        }
    }

    /// [`Suite::launch`] with extra environment variables.
    pub(crate) fn launch_env(&self, dir: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
        let child = self.launcher_command(dir, args, env).spawn().unwrap();
        finish(child, Duration::from_secs(300))
    }

    /// Session objects (pods, containers, networks) labelled with this project.
    pub(crate) fn session_objects(&self, project: &Path) -> Vec<String> {
        let filter = format!("label={PROJECT_LABEL}={}", project.display());
        let mut out = Vec::new();
        for args in [
            vec!["ps", "--all", "--filter", &filter, "--format", "{{.Names}}"],
            vec!["pod", "ps", "--filter", &filter, "--format", "{{.Name}}"],
            vec![
                "network",
                "ls",
                "--filter",
                &filter,
                "--format",
                "{{.Name}}",
            ],
        ] {
            let o = self.mode.podman(&args);
            out.extend(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(str::to_owned),
            );
        }
        out
    }

    /// Every session object of any project (to see that refusals create nothing).
    pub(crate) fn all_session_objects(&self) -> BTreeSet<String> {
        let filter = format!("label={SESSION_LABEL}");
        let mut out = BTreeSet::new();
        for args in [
            vec!["ps", "--all", "--filter", &filter, "--format", "{{.Names}}"],
            vec!["pod", "ps", "--filter", &filter, "--format", "{{.Name}}"],
            vec![
                "network",
                "ls",
                "--filter",
                &filter,
                "--format",
                "{{.Name}}",
            ],
        ] {
            let o = self.mode.podman(&args);
            out.extend(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::to_owned),
            );
        }
        out
    }

    /// Upstream `a` (web.test, the wildcard names) and `b` (db.test, blocked.test) on the egress
    /// network, serving tests/e2e/upstream.py from the sandbox image; waits until both say ready.
    fn start_upstreams(&mut self) {
        let certs = self.ca.parent().unwrap().display().to_string();
        let script = self.artifacts.join("upstream.py").display().to_string();
        for (name, aliases) in [
            ("a", &["web.test", "www.wild.test", "wild.test"][..]),
            ("b", &["db.test", "blocked.test"][..]),
        ] {
            let cname = format!("as-e2e-up-{name}-{}", std::process::id());
            let _ = self.mode.podman(&["rm", "--force", &cname]);
            let mut args: Vec<String> = vec![
                "run".into(),
                "--detach".into(),
                "--name".into(),
                cname.clone(),
                "--label".into(),
                format!("{TEST_LABEL}=1"),
                "--network".into(),
                EGRESS.into(),
                "--security-opt".into(),
                "label=disable".into(),
                "--env".into(),
                format!("UPSTREAM_NAME={name}"),
                "--volume".into(),
                format!("{certs}:/srv/certs:ro"),
                "--volume".into(),
                format!("{script}:/srv/upstream.py:ro"),
            ];
            for a in aliases {
                args.push("--network-alias".into());
                args.push((*a).into());
            }
            args.extend([
                SANDBOX_IMAGE.into(),
                "python3".into(),
                "/srv/upstream.py".into(),
            ]);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            self.mode.podman_ok(&refs);
            self.fx.containers.push(cname.clone());
        }
        for c in self.fx.containers.clone() {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let logs = text(&self.mode.podman(&["logs", &c]));
                if logs.contains("ready") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "upstream {c} did not start: {logs}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// Upstream `which`'s address on the egress network.
    pub(crate) fn upstream_ip(&self, which: usize) -> String {
        let c = &self.fx.containers[which];
        self.mode
            .podman_ok(&[
                "inspect",
                "--format",
                &format!("{{{{(index .NetworkSettings.Networks \"{EGRESS}\").IPAddress}}}}"),
                c,
            ])
            .trim()
            .to_owned()
    }

    /// Waits until the project's sandbox container is running.
    pub(crate) fn wait_for_sandbox(&self, dir: &Path) -> bool {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let o = self.mode.podman(&[
                "ps",
                "--filter",
                &format!("label={PROJECT_LABEL}={}", dir.display()),
                "--format",
                "{{.Names}}",
            ]);
            if String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.ends_with("-sandbox"))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }
}

/// Waits for a launcher with a deadline; kills it (and says so) if it hangs. Output is collected by
/// reader threads and awaited only briefly after exit: a launcher killed with SIGKILL leaves its
/// `podman run` holding the pipes.
pub(crate) fn finish(mut child: Child, limit: Duration) -> Run {
    let deadline = Instant::now() + limit;
    let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
    for (is_out, pipe) in [
        (
            true,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ),
        (
            false,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut s);
            }
            let _ = tx.send((is_out, s));
        });
    }
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok((true, s)) => stdout = s,
            Ok((false, s)) => stderr = s,
            Err(_) => break,
        }
    }
    if status.is_none() {
        stderr.push_str("\n(timed out and killed)");
    }
    Run {
        code: status.and_then(|s| s.code()),
        stdout,
        stderr,
    }
}
