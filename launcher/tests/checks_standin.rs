//! The real `agent-sandbox` binary's start against a stand-in `podman` (a shell script first on PATH)
//! that answers only what the checks and the stale sweep ask: a start that must be refused is refused
//! before anything is created, and the sweep removes only what is a session's. Everything but podman is
//! real: the project, the home, the runtime directory, the allowlist, the launcher's messages and exit
//! codes. What a real podman does with a start is the end-to-end suite's business.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use agent_sandbox::liveness;
use agent_sandbox::podman::{LABEL_BOOT, LABEL_PID, LABEL_PROJECT, LABEL_SESSION, LABEL_START};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_agent-sandbox");

/// The stand-in podman: the listings from files the test writes; anything else fails, as a podman
/// that cannot do it would. Every call is logged.
const PODMAN: &str = r#"#!/bin/sh
dir="$(dirname "$0")/.."
printf '%s\n' "$*" >> "$dir/calls"
case "$1 $2" in
"info --format") cat "$dir/info.json" ;;
"network ls") cat "$dir/networks.json" ;;
"pod ps") echo '[]' ;;
"ps --all"|"ps -a") echo '[]' ;;
"image inspect") echo 0123abcd; echo 0123abce ;;
*) echo "stand-in podman: no $*" >&2; exit 125 ;;
esac
"#;

/// A scratch home, runtime directory, project and stand-in podman; removed on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    /// A scratch set-up whose podman stores its images in `graph` (relative: below the root) and
    /// lists `networks` as its session networks.
    fn new(name: &str, graph: &str, networks: &serde_json::Value) -> Scratch {
        let root = std::env::temp_dir().join(format!("as-standin-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for d in ["bin", "home", "run/agent-sandbox", "outer/inner"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        for d in ["run", "run/agent-sandbox"] {
            fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o700)).unwrap();
        }
        let podman = root.join("bin/podman");
        fs::write(&podman, PODMAN).unwrap();
        fs::set_permissions(&podman, fs::Permissions::from_mode(0o755)).unwrap();
        let graph = root.join(graph);
        let info = serde_json::json!({
            "host": {"security": {"rootless": false}, "idMappings": {}},
            "store": {
                "graphRoot": graph,
                "runRoot": root.join("runroot"),
                "volumePath": graph.join("volumes"),
                "configFile": root.join("storage.conf"),
            }
        });
        fs::write(root.join("info.json"), info.to_string()).unwrap();
        fs::write(root.join("networks.json"), networks.to_string()).unwrap();
        Scratch { root }
    }

    /// The launcher, to run in `dir` (below the root) as `agent-sandbox --exec true`.
    fn launcher(&self, dir: &str) -> Command {
        let mut c = Command::new(LAUNCHER);
        c.args(["--exec", "true"])
            .current_dir(self.root.join(dir))
            .env_clear()
            .env("HOME", self.root.join("home"))
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", self.root.join("bin").display()),
            );
        c
    }

    /// [`Scratch::launcher`], run to its end.
    fn start(&self, dir: &str) -> Output {
        self.launcher(dir).output().unwrap()
    }

    /// The podman commands the launcher ran.
    fn calls(&self) -> String {
        fs::read_to_string(self.root.join("calls")).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Nothing was created: no network, pod, container or volume.
fn created_nothing(calls: &str) -> bool {
    !calls
        .lines()
        .any(|l| l.contains("create") || l.starts_with("run "))
}

/// podman's storage below the project, as `podman info` names it (storage.conf may put it anywhere):
/// the sandbox could change what the next session runs, so the start is refused.
#[test]
fn a_project_holding_podmans_storage_is_refused() {
    let s = Scratch::new("storage", "outer/inner/storage", &serde_json::json!([]));
    let out = s.start("outer/inner");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("podman's storage"), "{stderr}");
    assert!(created_nothing(&s.calls()), "{}", s.calls());
}

/// A project inside a running session's project: that session's sandbox could swap it for a symlink
/// between the checks and podman's mount, so the start is refused.
#[test]
fn a_project_inside_a_running_sessions_is_refused() {
    let pid = std::process::id();
    let root = std::env::temp_dir().join(format!("as-standin-inside-{pid}"));
    let networks = serde_json::json!([{
        "name": "agent-sandbox-0123456789ab",
        "labels": {
            LABEL_SESSION: "0123456789ab",
            LABEL_PID: pid.to_string(),
            LABEL_START: liveness::start_time(pid).unwrap().to_string(),
            LABEL_BOOT: liveness::boot_id().unwrap(),
            LABEL_PROJECT: root.join("outer"),
        }
    }]);
    let s = Scratch::new("inside", "storage", &networks);
    assert_eq!(s.root, root);
    let out = s.start("outer/inner");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the project directory of a running"),
        "{stderr}"
    );
    assert!(created_nothing(&s.calls()), "{}", s.calls());
}

/// A dead session's objects are swept, but a session id from a label is only ever used as one: a label
/// that climbs out of the runtime directory's session directories removes nothing there.
#[test]
fn the_sweep_takes_only_a_session_id_from_a_label() {
    let pid = std::process::id();
    let networks = serde_json::json!([{
        "name": "agent-sandbox-dead",
        "labels": {
            LABEL_SESSION: "0123456789ab/../../victim",
            LABEL_PID: pid.to_string(),
            // Not this process's start time: its launcher is gone.
            LABEL_START: (liveness::start_time(pid).unwrap() + 1).to_string(),
            LABEL_BOOT: liveness::boot_id().unwrap(),
            LABEL_PROJECT: "/nonexistent-as/p",
        }
    }]);
    let s = Scratch::new("sweep", "storage", &networks);
    let victim: &Path = &s.root.join("run/victim");
    fs::create_dir_all(victim).unwrap();
    fs::write(victim.join("keep"), "a file of the user's").unwrap();
    fs::create_dir_all(s.root.join("run/agent-sandbox/agent-sandbox-0123456789ab")).unwrap();
    let out = s.start("outer/inner");
    let calls = s.calls();
    // The sweep ran (it lists pods), and the start then failed at the stand-in's first create.
    assert!(calls.lines().any(|l| l.starts_with("pod ps")), "{calls}");
    assert_ne!(out.status.code(), Some(0));
    assert!(victim.join("keep").exists(), "{calls}");
}

/// A podman that never answers (stuck on a lock another podman process holds) does not hang the start:
/// Ctrl-C stops it within the launcher's grace, the stuck command's process is stopped too, and nothing
/// was created. Once for a check (`network ls`), once for the stale sweep's removals (six dead sessions'
/// networks, each `network rm` stuck): the grace runs once, from the signal, not once per command.
#[test]
fn ctrl_c_stops_a_start_whose_podman_hangs() {
    let hung_probe = (
        "\"network ls\") cat \"$dir/networks.json\" ;;",
        "\"network ls\") echo $$ > \"$dir/hung.tmp\"; mv \"$dir/hung.tmp\" \"$dir/hung\"; exec sleep 600 ;;",
    );
    ctrl_c_while_podman_hangs("hang", &serde_json::json!([]), hung_probe);
    let pid = std::process::id();
    let dead: Vec<serde_json::Value> = (0..6)
        .map(|i| {
            serde_json::json!({
                "name": format!("agent-sandbox-00000000000{i}"),
                "labels": {
                    LABEL_SESSION: format!("00000000000{i}"),
                    LABEL_PID: pid.to_string(),
                    // Not this process's start time: its launcher is gone.
                    LABEL_START: (liveness::start_time(pid).unwrap() + 1).to_string(),
                    LABEL_BOOT: liveness::boot_id().unwrap(),
                    LABEL_PROJECT: "/nonexistent-as/p",
                }
            })
        })
        .collect();
    let hung_removal = (
        "*) echo \"stand-in podman: no $*\" >&2; exit 125 ;;",
        "\"network rm\") echo $$ > \"$dir/hung.tmp\"; mv \"$dir/hung.tmp\" \"$dir/hung\"; exec sleep 600 ;;\n\
         *) echo \"stand-in podman: no $*\" >&2; exit 125 ;;",
    );
    let calls = ctrl_c_while_podman_hangs("sweep-hang", &serde_json::json!(dead), hung_removal);
    assert_eq!(
        calls
            .lines()
            .filter(|l| l.starts_with("network rm"))
            .count(),
        1,
        "the sweep went on after the signal: {calls}"
    );
}

/// Starts the launcher with the stand-in podman changed by `hang` (a case replaced by one that writes
/// its pid to `hung` and never ends) and the session networks `networks`, sends SIGINT once the stuck
/// command runs, and checks what [`ctrl_c_stops_a_start_whose_podman_hangs`] says. Returns the calls.
fn ctrl_c_while_podman_hangs(
    name: &str,
    networks: &serde_json::Value,
    hang: (&str, &str),
) -> String {
    let s = Scratch::new(name, "storage", networks);
    let hung = s.root.join("hung");
    let podman = PODMAN.replace(hang.0, hang.1);
    assert_ne!(podman, PODMAN);
    fs::write(s.root.join("bin/podman"), podman).unwrap();
    let mut launcher = s
        .launcher("outer")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let stuck: i32 = loop {
        if let Some(pid) = fs::read_to_string(&hung)
            .ok()
            .and_then(|p| p.trim().parse().ok())
        {
            break pid;
        }
        if t.elapsed() > std::time::Duration::from_secs(30) {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!("the stand-in never hung: {}", s.calls());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let pid = i32::try_from(launcher.id()).unwrap();
    // SAFETY: kill(2) on the launcher this test started, which has not been waited for.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    let told = std::time::Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        if told.elapsed() > std::time::Duration::from_secs(20) {
            let _ = launcher.kill();
            // SAFETY: kill(2) on the stand-in this test made; no memory effects.
            unsafe {
                libc::kill(stuck, libc::SIGKILL);
            }
            panic!("the launcher did not stop within 20 s of Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = told.elapsed();
    let out = launcher.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stuck_left = fs::read_to_string(format!("/proc/{stuck}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    });
    if stuck_left {
        // SAFETY: as above.
        unsafe {
            libc::kill(stuck, libc::SIGKILL);
        }
    }
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by signal 2"), "{stderr}");
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    assert!(!stuck_left, "the stuck podman ({stuck}) was left running");
    let calls = s.calls();
    assert!(created_nothing(&calls), "{calls}");
    calls
}
