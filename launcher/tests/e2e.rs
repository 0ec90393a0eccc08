//! End-to-end suite: the real launcher, real podman, the real images, as root and rootless.
//!
//! Run by `make e2e` (part of `make test`), which builds the images first and sets
//! `AGENT_SANDBOX_E2E=1`; without that variable this test only says it was skipped, so a plain
//! `cargo test` needs neither podman nor root.
//!
//! Upstream "internet" hosts are the suite's own containers on `agent-sandbox-egress`, reached by
//! `--network-alias` names under `.test`; traffic only ever goes to this machine or those containers.
//! As root the suite runs twice: rootful, then rootless as the user `agent-sandbox-e2e` (created if
//! missing and kept, so its image storage makes reruns fast). As another user it runs rootless only.
//! Everything else it creates (containers, volumes, the egress network if it was missing, temp dirs) is
//! removed at the end, also when a check fails.

use std::collections::BTreeSet;
use std::fs;

use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_agent-sandbox");
const SANDBOX_IMAGE: &str = "localhost/agent-sandbox:dev";
const ROUTER_IMAGE: &str = "localhost/agent-sandbox-router:dev";
const EGRESS: &str = "agent-sandbox-egress";
const TEST_USER: &str = "agent-sandbox-e2e";
/// Label on every container the suite starts itself.
const TEST_LABEL: &str = "agent-sandbox-e2e";
const SESSION_LABEL: &str = "agent-sandbox.session";
const PROJECT_LABEL: &str = "agent-sandbox.project";

const ALLOWLIST: &str = "\
# end-to-end allowlist
web.test
.wild.test
db.test:5432
";

/// A file of the source tree.
fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn sh(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Who runs podman and the launcher.
#[derive(Clone, Debug)]
struct Mode {
    /// None: this process's user (root: rootful). Some: that user through runuser (rootless).
    user: Option<String>,
    uid: u32,
    gid: u32,
    home: PathBuf,
}

impl Mode {
    fn name(&self) -> &str {
        if self.user.is_some() || self.uid != 0 {
            "rootless"
        } else {
            "rootful"
        }
    }

    fn rootful(&self) -> bool {
        self.name() == "rootful"
    }

    /// A command run as this mode's user with a clean, explicit environment.
    fn command(&self, program: &str, env: &[(&str, String)]) -> Command {
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

    fn podman(&self, args: &[&str]) -> Output {
        sh(self.command("podman", &[]).args(args))
    }

    fn podman_ok(&self, args: &[&str]) -> String {
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

/// Collects failed checks so one run reports all of them.
#[derive(Default)]
struct Checks {
    failures: Vec<String>,
    passed: usize,
}

impl Checks {
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.passed += 1;
            eprintln!("  ok   {what}");
        } else {
            eprintln!("  FAIL {what}");
            self.failures.push(what);
        }
    }

    /// Every `ok NAME` / `FAIL NAME` line a sandbox script printed, and that each expected name passed.
    fn script(&mut self, mode: &Mode, output: &str, expected: &[&str]) {
        for name in expected {
            let ok = output.lines().any(|l| l.trim() == format!("ok {name}"));
            let detail = output
                .lines()
                .find(|l| l.starts_with(&format!("FAIL {name}")))
                .unwrap_or("no result line");
            self.check(
                ok,
                format!(
                    "[{}] {name}{}",
                    mode.name(),
                    if ok {
                        String::new()
                    } else {
                        format!(": {detail}")
                    }
                ),
            );
        }
    }
}

/// What one suite run created, removed on drop (also when a check panics).
struct Fixture {
    mode: Mode,
    root: PathBuf,
    containers: Vec<String>,
    volumes: Vec<String>,
    created_egress: bool,
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
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

struct Suite<'a> {
    mode: Mode,
    fx: Fixture,
    home_volume: String,
    checks: &'a mut Checks,
    ca: PathBuf,
    artifacts: PathBuf,
}

fn main_test_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("as-e2e-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn uid_gid(user: &str) -> (u32, u32, PathBuf) {
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 7 && f[0] == user {
            return (f[2].parse().unwrap(), f[3].parse().unwrap(), f[5].into());
        }
    }
    panic!("no user {user}");
}

fn current_ids() -> (u32, u32) {
    let m = fs::metadata("/proc/self").unwrap();
    (m.uid(), m.gid())
}

#[test]
fn end_to_end() {
    if std::env::var("AGENT_SANDBOX_E2E").as_deref() != Ok("1") {
        eprintln!("end-to-end suite skipped: run `make e2e` (sets AGENT_SANDBOX_E2E=1)");
        return;
    }
    let started = Instant::now();
    let artifacts = main_test_dir();
    let probe = build_probe(&artifacts);
    let ca = make_certs(&artifacts);
    fs::copy(
        repo_file("tests/e2e/upstream.py"),
        artifacts.join("upstream.py"),
    )
    .unwrap();
    // The busybox + probe tarball the nested test imports (owned by root: nested root is the user).
    let bb = artifacts.join("bbroot/bin");
    fs::create_dir_all(&bb).unwrap();
    fs::copy("/bin/busybox", bb.join("busybox")).unwrap();
    fs::copy(&probe, bb.join("probe")).unwrap();
    let tar = sh(Command::new("tar").args([
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "-C",
        artifacts.join("bbroot").to_str().unwrap(),
        "-cf",
        artifacts.join("nested.tar").to_str().unwrap(),
        ".",
    ]));
    assert!(tar.status.success(), "{}", text(&tar));
    for f in ["nested.tar", "upstream.py"] {
        fs::set_permissions(artifacts.join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }

    let mut checks = Checks::default();
    let (uid, gid) = current_ids();
    let mut modes = Vec::new();
    if uid == 0 {
        modes.push(Mode {
            user: None,
            uid: 0,
            gid: 0,
            home: artifacts.join("root-home"),
        });
        modes.push(rootless_user_mode());
    } else {
        modes.push(Mode {
            user: None,
            uid,
            gid,
            home: std::env::var_os("HOME").unwrap().into(),
        });
    }
    for mode in modes {
        eprintln!("== {} ({:?})", mode.name(), mode.user);
        let t = Instant::now();
        suite(mode.clone(), &mut checks, &ca, &artifacts);
        eprintln!("== {} done in {:.0?}", mode.name(), t.elapsed());
    }
    let _ = fs::remove_dir_all(&artifacts);
    eprintln!(
        "end-to-end: {} checks passed, {} failed, {:.0?}",
        checks.passed,
        checks.failures.len(),
        started.elapsed()
    );
    assert!(
        checks.failures.is_empty(),
        "failed checks:\n  {}",
        checks.failures.join("\n  ")
    );
}

/// The unprivileged user for the rootless run, with the images in its storage.
fn rootless_user_mode() -> Mode {
    if sh(Command::new("id").arg(TEST_USER)).status.code() != Some(0) {
        let o = sh(Command::new("useradd").args(["-m", "-s", "/bin/bash", TEST_USER]));
        assert!(o.status.success(), "useradd: {}", text(&o));
    }
    // Rootless networking needs the tun device (CI machines ship it root-only).
    if let Ok(meta) = fs::metadata("/dev/net/tun") {
        if meta.mode() & 0o006 != 0o006 {
            let _ = fs::set_permissions("/dev/net/tun", fs::Permissions::from_mode(0o666));
        }
    }
    let (uid, gid, home) = uid_gid(TEST_USER);
    let mode = Mode {
        user: Some(TEST_USER.into()),
        uid,
        gid,
        home,
    };
    // Native overlay storage: the distribution default for rootless podman 4.3 here is vfs, which
    // copies the whole sandbox image for every container.
    let conf_dir = mode.home.join(".config/containers");
    let storage = conf_dir.join("storage.conf");
    if !storage.exists() {
        fs::create_dir_all(&conf_dir).unwrap();
        fs::write(&storage, "[storage]\ndriver = \"overlay\"\n").unwrap();
        chown_r(&mode.home.join(".config"), uid, gid);
    }
    for image in [ROUTER_IMAGE, SANDBOX_IMAGE] {
        let id = |m: Option<&Mode>| -> String {
            let o =
                match m {
                    Some(m) => m.podman(&["image", "inspect", "--format", "{{.Id}}", image]),
                    None => sh(Command::new("podman")
                        .args(["image", "inspect", "--format", "{{.Id}}", image])),
                };
            String::from_utf8_lossy(&o.stdout).trim().to_owned()
        };
        let want = id(None);
        assert!(
            !want.is_empty(),
            "{image} is missing: run `make build` first"
        );
        let had = id(Some(&mode));
        if had != want {
            eprintln!("loading {image} into {TEST_USER}'s storage");
            let mut save = Command::new("podman")
                .args(["save", image])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let load = mode
                .command("podman", &[])
                .args(["load", "--quiet"])
                .stdin(save.stdout.take().unwrap())
                .output()
                .unwrap();
            assert!(save.wait().unwrap().success());
            assert!(load.status.success(), "podman load: {}", text(&load));
            // The copy an earlier run loaded is superseded (and untagged) now: remove it rather than
            // let every rebuild leave a copy of the images behind. Only this user's storage, which
            // holds nothing but what this suite loaded; an image still in use stays.
            if !had.is_empty() {
                let _ = mode.podman(&["rmi", &had]);
            }
        }
    }
    mode
}

fn chown_r(path: &Path, uid: u32, gid: u32) {
    let o = sh(Command::new("chown").args(["-R", &format!("{uid}:{gid}"), path.to_str().unwrap()]));
    assert!(o.status.success(), "chown: {}", text(&o));
}

/// A static probe for nested containers (see tests/e2e/probe.rs).
fn build_probe(dir: &Path) -> PathBuf {
    let out = dir.join("probe");
    let o = sh(Command::new("rustc").args([
        "--edition",
        "2021",
        "-O",
        "-C",
        "target-feature=+crt-static",
        "--target",
        &format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
        repo_file("tests/e2e/probe.rs").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "building the probe: {}", text(&o));
    out
}

/// A test CA and a server certificate for every test name.
fn make_certs(dir: &Path) -> PathBuf {
    let certs = dir.join("certs");
    fs::create_dir_all(&certs).unwrap();
    let run = |args: &[&str]| {
        let o = sh(Command::new("openssl").current_dir(&certs).args(args));
        assert!(o.status.success(), "openssl {args:?}: {}", text(&o));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=agent-sandbox e2e CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    fs::write(
        certs.join("ext.cnf"),
        "subjectAltName=DNS:web.test,DNS:wild.test,DNS:*.wild.test,DNS:db.test,DNS:blocked.test\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=web.test",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    ]);
    for f in ["ca.crt", "server.crt", "server.key"] {
        fs::set_permissions(certs.join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }
    fs::set_permissions(&certs, fs::Permissions::from_mode(0o755)).unwrap();
    certs.join("ca.crt")
}

fn suite(mode: Mode, checks: &mut Checks, ca: &Path, artifacts: &Path) {
    // The suite's own directory: under the user's home when rootless (their files, their paths).
    let root = if mode.rootful() {
        artifacts.join("rootful")
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
        ca: ca.to_owned(),
        artifacts: artifacts.to_owned(),
    };
    s.start_upstreams();
    s.warm_up();
    s.reach();
    s.escapes();
    s.nested();
    s.files_and_powers();
    s.refusals();
    s.cleanup_paths();
    s.concurrent_sessions();
    s.stale_sessions();
}

impl Suite<'_> {
    fn project(&self, name: &str) -> PathBuf {
        let dir = self.fx.root.join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::copy(&self.ca, dir.join("ca.crt")).unwrap();
        if !self.mode.rootful() {
            chown_r(&dir, self.mode.uid, self.mode.gid);
        }
        dir
    }

    fn write_script(&self, dir: &Path, name: &str, body: &str) {
        let path = dir.join(name);
        fs::write(&path, format!("set -u\n{HELPERS}\n{body}")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        if !self.mode.rootful() {
            chown_r(&path, self.mode.uid, self.mode.gid);
        }
    }

    /// The launcher in `dir`: `exec 'CMD'...`, with stdin closed.
    fn launcher_command(&self, dir: &Path, args: &[&str], extra_env: &[(&str, String)]) -> Command {
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
    fn pid_file(&self, dir: &Path) -> PathBuf {
        let name = dir
            .file_name()
            .map_or_else(|| "root".to_owned(), |n| n.to_string_lossy().into_owned());
        self.fx.root.join(format!("{name}.pid"))
    }

    fn launch(&self, dir: &Path, args: &[&str]) -> Run {
        self.launch_env(dir, args, &[])
    }

    fn launch_env(&self, dir: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
        let child = self.launcher_command(dir, args, env).spawn().unwrap();
        finish(child, Duration::from_secs(300))
    }

    /// Session objects (pods, containers, networks) labelled with this project.
    fn session_objects(&self, project: &Path) -> Vec<String> {
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

    fn all_session_objects(&self) -> BTreeSet<String> {
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

    fn upstream_ip(&self, which: usize) -> String {
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

    /// The first session after images are loaded pays for podman's one-time id-mapped copy of the
    /// image (rootless); time it separately so later timings mean something.
    fn warm_up(&mut self) {
        let dir = self.project("warm-up");
        let t = Instant::now();
        let r = self.launch(&dir, &["--exec", "true"]);
        let first = t.elapsed();
        let t = Instant::now();
        let r2 = self.launch(&dir, &["--exec", "true"]);
        let second = t.elapsed();
        eprintln!(
            "  first session {first:.1?}, second {second:.1?} ({})",
            self.mode.name()
        );
        let name = self.mode.name().to_owned();
        self.checks.check(
            r.code == Some(0) && r2.code == Some(0),
            format!(
                "[{name}] a session runs `true` and exits 0: {}",
                r.stderr.trim()
            ),
        );
        // Bare podman for comparison: the same image, no topology.
        let t = Instant::now();
        let _ = self
            .mode
            .podman(&["run", "--rm", "--network", "none", SANDBOX_IMAGE, "true"]);
        eprintln!("  bare `podman run --rm IMAGE true`: {:.1?}", t.elapsed());
    }

    fn reach(&mut self) {
        let dir = self.project("reach");
        self.write_script(&dir, "reach.sh", REACH);
        let r = self.launch(&dir, &["--exec", "bash", "./reach.sh"]);
        let mode = self.mode.clone();
        self.checks.script(
            &mode,
            &r.stdout,
            &[
                "resolve-exact",
                "resolve-wildcard",
                "resolve-apex",
                "resolve-port-host",
                "https-exact",
                "https-wildcard",
                "http-exact",
                "http-wildcard",
                "tcp-port-entry",
                "nxdomain-unlisted",
                "unlisted-connect-fails",
                "nxdomain-lookalike",
                "sni-spoof-refused",
                "host-spoof-refused",
                "aaaa-empty",
            ],
        );
        self.checks.check(
            r.stderr.contains("blocked.test") && r.stderr.contains("refused"),
            format!(
                "[{}] the blocked report lists a refused name: {}",
                mode.name(),
                r.stderr.trim()
            ),
        );
        self.checks.check(
            r.stderr.contains(".config/agent-sandbox/allowed-hosts"),
            format!("[{}] the blocked report names the allowlist", mode.name()),
        );
    }

    fn escapes(&mut self) {
        let dir = self.project("escape");
        self.write_script(&dir, "escape.sh", ESCAPE);
        // Listeners on this machine that the sandbox must not reach.
        let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        tcp.set_nonblocking(true).unwrap();
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        let udp_port = udp.local_addr().unwrap().port();
        udp.set_nonblocking(true).unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let hits = Arc::clone(&hits);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::SeqCst) {
                    if tcp.accept().is_ok() {
                        hits.fetch_add(1, Ordering::SeqCst);
                    }
                    if udp.recv_from(&mut buf).is_ok() {
                        hits.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };

        let child = self
            .launcher_command(&dir, &["--exec", "bash", "./escape.sh"], &[])
            .spawn()
            .unwrap();
        // The script waits for its targets: some only exist once the session does.
        let ready = dir.join("ready");
        let deadline = Instant::now() + Duration::from_secs(120);
        while !ready.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut targets = Vec::new();
        for i in 0..2 {
            targets.push(format!("upstream {} 80", self.upstream_ip(i)));
        }
        let router = self
            .session_objects(&dir)
            .into_iter()
            .find(|n| n.ends_with("-router"));
        if let Some(router) = &router {
            let ip = self.mode.podman_ok(&[
                "inspect",
                "--format",
                &format!("{{{{(index .NetworkSettings.Networks \"{EGRESS}\").IPAddress}}}}"),
                router,
            ]);
            targets.push(format!("router-egress {} 443", ip.trim()));
        }
        let egress = self.mode.podman_ok(&[
            "network",
            "inspect",
            "--format",
            "{{range .Subnets}}{{.Gateway}} {{end}}",
            EGRESS,
        ]);
        for gw in egress.split_whitespace().filter(|g| g.contains('.')) {
            targets.push(format!("egress-gateway {gw} {tcp_port}"));
            targets.push(format!("dns-server {gw} 53"));
        }
        if let Some(net) = self.session_objects(&dir).into_iter().find(|n| {
            !n.ends_with("-router")
                && !n.ends_with("-forwarder")
                && !n.ends_with("-sandbox")
                && !n.ends_with("-infra")
        }) {
            let gw = self.mode.podman(&[
                "network",
                "inspect",
                "--format",
                "{{range .Subnets}}{{.Gateway}} {{end}}",
                &net,
            ]);
            for g in String::from_utf8_lossy(&gw.stdout)
                .split_whitespace()
                .filter(|g| g.contains('.') && !g.contains("nil"))
            {
                targets.push(format!("session-gateway {g} {tcp_port}"));
            }
        }
        let addrs = sh(Command::new("ip").args(["-o", "addr", "show", "scope", "global"]));
        for line in String::from_utf8_lossy(&addrs.stdout).lines() {
            let mut f = line.split_whitespace();
            while let Some(w) = f.next() {
                if w == "inet" || w == "inet6" {
                    if let Some(a) = f.next() {
                        let ip = a.split('/').next().unwrap();
                        let kind = if w == "inet" { "host" } else { "host6" };
                        targets.push(format!("{kind} {ip} {tcp_port}"));
                        if w == "inet" {
                            targets.push(format!("dns-server {ip} 53"));
                            targets.push(format!("udp {ip} {udp_port}"));
                        }
                    }
                }
            }
        }
        let mut body = targets.join("\n");
        body.push('\n');
        let tmp = dir.join("targets.tmp");
        fs::write(&tmp, body).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).unwrap();
        fs::rename(&tmp, dir.join("targets")).unwrap();

        let r = finish(child, Duration::from_secs(300));
        stop.store(true, Ordering::SeqCst);
        watcher.join().unwrap();
        let mode = self.mode.clone();
        eprintln!("  escape targets: {}", targets.join("; "));
        let failed: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
        let oks = r.stdout.lines().filter(|l| l.starts_with("ok")).count();
        self.checks.check(
            router.is_some() && failed.is_empty() && oks >= targets.len(),
            format!(
                "[{}] every escape attempt fails ({oks} attempts; failures: {failed:?}; stderr: {})",
                mode.name(),
                r.stderr.trim()
            ),
        );
        self.checks.script(
            &mode,
            &r.stdout,
            &[
                "router-dns-works",
                "no-ipv6-route",
                "ipv6-loopback-only",
                "no-default-route",
            ],
        );
        self.checks.check(
            hits.load(Ordering::SeqCst) == 0,
            format!(
                "[{}] the host's TCP and UDP listeners saw nothing from the sandbox",
                mode.name()
            ),
        );
    }

    fn nested(&mut self) {
        let dir = self.project("nested");
        fs::copy(self.artifacts.join("nested.tar"), dir.join("nested.tar")).unwrap();
        self.write_script(&dir, "nested.sh", NESTED);
        if self.mode.rootful() {
            // Rootful podman runs the sandbox as the project's owner; nested podman needs a non-root one.
            let (uid, gid, _) = uid_gid(TEST_USER);
            chown_r(&dir, uid, gid);
        }
        let r = self.launch(&dir, &["--exec", "bash", "./nested.sh"]);
        let mode = self.mode.clone();
        self.checks.script(
            &mode,
            &r.stdout,
            &[
                "nested-import",
                "nested-resolves",
                "nested-reaches-allowlisted",
                "nested-nxdomain",
                "nested-bridge-reaches-nothing",
            ],
        );
        if !r.stdout.contains("ok nested-import") {
            eprintln!("{}\n{}", r.stdout, r.stderr);
        }
    }

    fn files_and_powers(&mut self) {
        let dir = self.project("files");
        // Something outside the project that must stay invisible.
        let secret = self.fx.root.join("outside-secret");
        fs::write(&secret, "secret").unwrap();
        // The host's home (rootless: the user's real one) is not the sandbox's: its files stay outside.
        let marker = self.mode.home.join(".as-e2e-host-home-marker");
        fs::write(&marker, "host").unwrap();
        let script = FILES
            .replace("@SECRET@", &secret.display().to_string())
            .replace("@MARKER@", &marker.display().to_string());
        self.write_script(&dir, "files.sh", &script);
        // A file system mounted below the project on the host stays out: the project's bind mount is
        // not recursive (needs root to mount; the suite runs as root).
        let submount = dir.join("submount");
        fs::create_dir_all(&submount).unwrap();
        let mounted = current_ids().0 == 0
            && sh(Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=1m", "as-e2e-submount"])
                .arg(&submount))
            .status
            .success();
        if mounted {
            fs::write(submount.join("marker"), "below").unwrap();
        }
        // podman would copy the host's proxy variables (with their credentials) into containers.
        let proxy = "http://user:as-e2e-proxy-secret@proxy.invalid:3128".to_owned();
        let r = self.launch_env(
            &dir,
            &["--exec", "bash", "./files.sh"],
            &[("http_proxy", proxy.clone()), ("HTTPS_PROXY", proxy)],
        );
        if mounted {
            let _ = sh(Command::new("umount").arg(&submount));
        }
        let _ = fs::remove_file(&marker);
        let mode = self.mode.clone();
        self.checks.script(
            &mode,
            &r.stdout,
            &[
                "project-writable",
                "outside-invisible",
                "host-home-invisible",
                "only-expected-host-mounts",
                "home-is-volume",
                "no-address-change",
                "no-route-change",
                "no-nftables",
                "hosts-readonly",
                "resolv-readonly",
                "forwarder-invisible",
                "no-podman-socket",
                "no-setuid-files",
                "no-capabilities",
                "no-host-proxy-variables",
                "ipv6-disabled",
            ],
        );
        if mounted {
            self.checks
                .script(&mode, &r.stdout, &["submount-invisible"]);
        }
        let created = dir.join("created-in-sandbox");
        let owner = fs::metadata(&created).map(|m| (m.uid(), m.gid()));
        let expect = if mode.rootful() {
            let m = fs::metadata(&dir).unwrap();
            (m.uid(), m.gid())
        } else {
            (mode.uid, mode.gid)
        };
        self.checks.check(
            owner.as_ref().is_ok_and(|o| o.0 == expect.0),
            format!(
                "[{}] a file created in $PWD is owned by the invoking user {expect:?} on the host: {owner:?}",
                mode.name()
            ),
        );
    }

    fn refusals(&mut self) {
        let before = self.all_session_objects();
        let home = self.mode.home.clone();
        let config = home.join(".config");
        let parent = home.parent().unwrap().to_owned();
        // A project holding an allowlist given through AGENT_SANDBOX_ALLOWLIST, reached via a symlink.
        let proj = self.project("holds-allowlist");
        fs::create_dir_all(proj.join("deep/er")).unwrap();
        fs::write(proj.join("deep/er/list"), "web.test\n").unwrap();
        let link = self.fx.root.join("link-to-holder");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&proj, &link).unwrap();
        if !self.mode.rootful() {
            chown_r(&proj, self.mode.uid, self.mode.gid);
        }
        let list = [(
            "AGENT_SANDBOX_ALLOWLIST",
            proj.join("deep/er/list").display().to_string(),
        )];
        let mode = self.mode.clone();
        for (what, dir, env) in [
            ("$HOME", home.clone(), &[][..]),
            ("a parent of $HOME", parent, &[][..]),
            ("/", PathBuf::from("/"), &[][..]),
            ("a directory holding the allowlist", config, &[][..]),
            (
                "a directory holding AGENT_SANDBOX_ALLOWLIST (via a symlink)",
                link.clone(),
                &list[..],
            ),
        ] {
            let r = self.launch_env(&dir, &["--exec", "true"], env);
            self.checks.check(
                r.code.is_some_and(|c| c != 0) && r.stderr.contains("refusing"),
                format!("[{}] refuses {what}: {}", mode.name(), r.stderr.trim()),
            );
        }
        // A bad allowlist: every error with its line number, nothing created.
        let bad = self.project("bad-allowlist");
        fs::write(bad.join("list"), "web.test\n10.0.0.1\n*.x.test\n").unwrap();
        let bad_list = [(
            "AGENT_SANDBOX_ALLOWLIST",
            bad.join("list").display().to_string(),
        )];
        let other = self.project("uses-bad-allowlist");
        let r = self.launch_env(&other, &["--exec", "true"], &bad_list);
        self.checks.check(
            r.code == Some(1) && r.stderr.contains("list:2:") && r.stderr.contains("list:3:"),
            format!(
                "[{}] a bad allowlist is reported with line numbers: {}",
                mode.name(),
                r.stderr.trim()
            ),
        );
        let after = self.all_session_objects();
        self.checks.check(
            before == after,
            format!(
                "[{}] refusals create nothing: {before:?} -> {after:?}",
                mode.name()
            ),
        );
    }

    fn cleanup_paths(&mut self) {
        let mode = self.mode.clone();
        let dir = self.project("exit-normal");
        let r = self.launch(&dir, &["--exec", "bash", "-c", "echo hello"]);
        self.checks.check(
            r.code == Some(0)
                && r.stdout.contains("hello")
                && self.session_objects(&dir).is_empty(),
            format!(
                "[{}] normal exit: status 0, output passed through, nothing left",
                mode.name()
            ),
        );
        let dir = self.project("exit-failing");
        let r = self.launch(&dir, &["--exec", "bash", "-c", "exit 3"]);
        self.checks.check(
            r.code == Some(3) && self.session_objects(&dir).is_empty(),
            format!(
                "[{}] a failing command: its status 3 is the launcher's, nothing left (got {:?})",
                mode.name(),
                r.code
            ),
        );
        for (signal, name, code) in [
            (libc::SIGTERM, "SIGTERM", 143),
            (libc::SIGHUP, "SIGHUP", 129),
            (libc::SIGINT, "SIGINT (Ctrl-C)", 130),
        ] {
            let dir = self.project(&format!("exit-signal-{signal}"));
            let child = self
                .launcher_command(&dir, &["--exec", "sleep", "600"], &[])
                .spawn()
                .unwrap();
            let running = self.wait_for_sandbox(&dir);
            let pid: i32 = fs::read_to_string(self.pid_file(&dir))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let t = Instant::now();
            // SAFETY: kill(2) on the launcher this test started.
            unsafe {
                libc::kill(pid, signal);
            }
            let r = finish(child, Duration::from_secs(60));
            let left = self.session_objects(&dir);
            self.checks.check(
                running && r.code == Some(code) && left.is_empty(),
                format!(
                    "[{}] {name} to the launcher: the command gets it, status {:?} (want {code}) in {:.1?}, nothing left: {left:?}",
                    mode.name(),
                    r.code,
                    t.elapsed()
                ),
            );
        }
    }

    /// Waits until the project's sandbox container is running.
    fn wait_for_sandbox(&self, dir: &Path) -> bool {
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

    fn concurrent_sessions(&mut self) {
        let mode = self.mode.clone();
        let a = self.project("two-a");
        let b = self.project("two-b");
        // Each session publishes its router's address, then tries the other session's router: sessions
        // are on separate internal networks and must not reach each other.
        let script = r#"
router=$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)
echo "$router" > router.tmp && mv router.tmp router
while [ ! -e go ]; do sleep 0.2; done
other=$(cat other)
curl -sS --max-time 10 http://web.test/
f other-router-dns dig +time=2 +tries=1 "@$other" web.test A
f other-router-http timeout 4 bash -c "exec 3<>/dev/tcp/$other/80"
"#;
        for d in [&a, &b] {
            self.write_script(d, "two.sh", script);
        }
        let cmd = ["--exec", "bash", "./two.sh"];
        let ca = self.launcher_command(&a, &cmd, &[]).spawn().unwrap();
        let cb = self.launcher_command(&b, &cmd, &[]).spawn().unwrap();
        let both = self.wait_for_sandbox(&a) && self.wait_for_sandbox(&b);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(a.join("router").exists() && b.join("router").exists()) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let router_of = |d: &Path| fs::read_to_string(d.join("router")).unwrap_or_default();
        fs::write(a.join("other"), router_of(&b)).unwrap();
        fs::write(b.join("other"), router_of(&a)).unwrap();
        for d in [&a, &b] {
            fs::write(d.join("go"), "").unwrap();
        }
        let ra = finish(ca, Duration::from_secs(120));
        let rb = finish(cb, Duration::from_secs(120));
        self.checks.check(
            both && ra.code == Some(0)
                && rb.code == Some(0)
                && ra.stdout.contains("upstream=a")
                && rb.stdout.contains("upstream=a")
                && self.session_objects(&a).is_empty()
                && self.session_objects(&b).is_empty(),
            format!(
                "[{}] two sessions from different directories run at once: {} / {}",
                mode.name(),
                ra.stderr.trim(),
                rb.stderr.trim()
            ),
        );
        for r in [&ra, &rb] {
            self.checks
                .script(&mode, &r.stdout, &["other-router-dns", "other-router-http"]);
        }
    }

    /// A launcher killed with SIGKILL cannot clean up; the next start removes its objects.
    fn stale_sessions(&mut self) {
        let mode = self.mode.clone();
        let dir = self.project("killed");
        let child = self
            .launcher_command(&dir, &["--exec", "sleep", "600"], &[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let running = self.wait_for_sandbox(&dir);
        let pid: i32 = fs::read_to_string(self.pid_file(&dir))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: kill(2) on the launcher this test started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        let _ = finish(child, Duration::from_secs(30));
        let left = self.session_objects(&dir);
        let other = self.project("after-killed");
        let r = self.launch(&other, &["--exec", "true"]);
        let after = self.session_objects(&dir);
        self.checks.check(
            running && !left.is_empty() && r.code == Some(0) && after.is_empty(),
            format!(
                "[{}] objects of a SIGKILLed launcher ({} of them) are removed at the next start: {}",
                mode.name(),
                left.len(),
                r.stderr.trim()
            ),
        );
    }
}

/// Waits for a launcher with a deadline; kills it (and says so) if it hangs. Output is collected by
/// reader threads and awaited only briefly after exit: a launcher killed with SIGKILL leaves its
/// `podman run` holding the pipes.
fn finish(mut child: Child, limit: Duration) -> Run {
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

/// Shell helpers for the scripts run inside the sandbox: `t NAME CMD...` expects success,
/// `f NAME CMD...` expects failure; each prints `ok NAME` or `FAIL NAME ...`.
const HELPERS: &str = r#"
t() { local n=$1; shift; if "$@" >/dev/null 2>&1; then echo "ok $n"; else echo "FAIL $n: $*"; fi; }
f() { local n=$1; shift; if "$@" >/dev/null 2>&1; then echo "FAIL $n (succeeded): $*"; else echo "ok $n"; fi; }
"#;

const REACH: &str = r#"
ip_of() { getent ahostsv4 "$1" | awk 'NR==1{print $1}'; }
t resolve-exact test "$(ip_of web.test)" = 127.0.0.2
t resolve-wildcard test "$(ip_of www.wild.test)" = 127.0.0.2
t resolve-apex test "$(ip_of wild.test)" = 127.0.0.2
t resolve-port-host test "$(ip_of db.test)" = 127.0.0.3
out=$(curl -sS --max-time 10 --cacert ca.crt https://web.test/)
t https-exact grep -q "upstream=a proto=https host=web.test sni=web.test" <<<"$out"
out=$(curl -sS --max-time 10 --cacert ca.crt https://www.wild.test/)
t https-wildcard grep -q "upstream=a proto=https host=www.wild.test sni=www.wild.test" <<<"$out"
out=$(curl -sS --max-time 10 http://web.test/)
t http-exact grep -q "upstream=a proto=http host=web.test" <<<"$out"
out=$(curl -sS --max-time 10 http://www.wild.test/)
t http-wildcard grep -q "upstream=a proto=http host=www.wild.test" <<<"$out"
out=$(timeout 10 bash -c 'exec 3<>/dev/tcp/db.test/5432; echo hello >&3; cat <&3')
t tcp-port-entry grep -q "upstream=b proto=tcp" <<<"$out"
t nxdomain-unlisted bash -c 'dig +time=3 +tries=1 blocked.test A | grep -q "status: NXDOMAIN"'
f unlisted-connect-fails curl -sS --max-time 5 --cacert ca.crt https://blocked.test/
t nxdomain-lookalike bash -c 'dig +time=3 +tries=1 web.test.evil.example A | grep -q "status: NXDOMAIN"'
f sni-spoof-refused curl -sS --max-time 5 --cacert ca.crt --resolve blocked.test:443:127.0.0.2 https://blocked.test/
out=$(curl -sS --max-time 5 -H 'Host: blocked.test' http://127.0.0.2/ 2>&1)
f host-spoof-refused grep -q "upstream=" <<<"$out"
t aaaa-empty bash -c 'r=$(dig +time=3 +tries=1 web.test AAAA); grep -q "status: NOERROR" <<<"$r" && grep -q "ANSWER: 0," <<<"$r"'
"#;

const ESCAPE: &str = r#"
touch ready
for _ in $(seq 600); do [ -e targets ] && break; sleep 0.2; done
router=$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)
t router-dns-works bash -c "dig +time=3 +tries=1 @$router web.test A | grep -q 127.0.0.2"
while read -r kind ip port; do
  case $kind in
    dns-server) f "dns-$ip" dig +time=2 +tries=1 "@$ip" web.test A ;;
    udp) echo probe > "/dev/udp/$ip/$port"; echo "ok udp-$ip-sent" ;;
    host6) f "tcp6-$ip" curl -g -sS --max-time 3 "http://[$ip]:$port/" ;;
    *) f "tcp-$kind-$ip" timeout 4 bash -c "exec 3<>/dev/tcp/$ip/$port" ;;
  esac
done < targets
f no-ipv6-route bash -c 'ip -6 route show | grep -v "^::1 \|^fe80\|^local\|^multicast" | grep -q .'
t ipv6-loopback-only bash -c '! ip -6 addr show scope global | grep -q inet6'
f no-default-route bash -c 'ip route show | grep -q "^default"'
"#;

const NESTED: &str = r#"
t nested-import podman import --quiet nested.tar localhost/as-e2e-nested:1
out=$(podman run --rm localhost/as-e2e-nested:1 /bin/probe dns web.test 2>&1)
t nested-resolves test "$out" = 127.0.0.2
out=$(podman run --rm localhost/as-e2e-nested:1 /bin/probe get web.test 80 2>&1)
t nested-reaches-allowlisted grep -q "upstream=a proto=http host=web.test" <<<"$out"
out=$(podman run --rm localhost/as-e2e-nested:1 /bin/probe dns blocked.test 2>&1)
t nested-nxdomain grep -q NXDOMAIN <<<"$out"
out=$(timeout 60 podman run --rm --network bridge localhost/as-e2e-nested:1 /bin/probe get web.test 80 2>&1)
f nested-bridge-reaches-nothing grep -q "upstream=" <<<"$out"
podman rmi -f localhost/as-e2e-nested:1 >/dev/null 2>&1
"#;

const FILES: &str = r#"
t project-writable bash -c 'echo x > created-in-sandbox'
f outside-invisible test -e "@SECRET@"
f host-home-invisible test -e "@MARKER@"
# Bind mounts from the host: the project, hosts, resolv.conf and podman's own files (hostname,
# .containerenv, the init binary); the home volume lives under the container storage's volumes.
t only-expected-host-mounts bash -c '! awk '"'"'{print $5}'"'"' /proc/self/mountinfo | grep -vxE "$PWD|/|/etc/hosts|/etc/resolv.conf|/etc/hostname|/etc/passwd|/etc/group|/run/.containerenv|/run/podman-init|/dev.*|/proc.*|/sys.*|$HOME" | grep -q .'
t home-is-volume bash -c 'touch "$HOME/.as-e2e" && rm "$HOME/.as-e2e"'
f no-address-change ip addr add 10.99.99.99/32 dev lo
f no-route-change ip route add 10.99.0.0/16 dev lo
f no-nftables nft add table inet as_e2e
f hosts-readonly bash -c 'echo "1.2.3.4 web.test" >> /etc/hosts'
f resolv-readonly bash -c 'echo "nameserver 1.1.1.1" >> /etc/resolv.conf'
f forwarder-invisible bash -c 'ps -eo comm | grep -q forwarder'
f no-podman-socket bash -c 'find / -xdev \( -name podman.sock -o -name docker.sock \) 2>/dev/null | grep -q . || ls /run/podman/podman.sock /run/user/*/podman/podman.sock'
f no-setuid-files bash -c 'find / -xdev -perm /6000 -type f 2>/dev/null | grep -q .'
t no-capabilities bash -c 'grep -q "^CapEff:[[:space:]]*0000000000000000" /proc/self/status && grep -q "^CapBnd:[[:space:]]*0000000000000000" /proc/self/status'
f no-host-proxy-variables bash -c 'env | grep -qi "proxy"'
t ipv6-disabled bash -c 'test "$(cat /proc/sys/net/ipv6/conf/all/disable_ipv6)" = 1'
f submount-invisible test -e submount/marker
"#;
