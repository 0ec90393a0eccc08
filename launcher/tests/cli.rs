//! The real `agent-sandbox` binary, for everything that happens before podman is involved: help,
//! version, settings, refusals and allowlist errors. PATH holds no podman here, so a test that got as
//! far as podman would fail with "podman is not installed" instead of the message it expects; these
//! need neither podman nor root.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_agent-sandbox");

/// A scratch HOME with a project directory, removed on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root = std::env::temp_dir().join(format!("as-cli-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("home/project")).unwrap();
        Scratch { root }
    }

    fn home(&self) -> PathBuf {
        self.root.join("home")
    }

    fn run(&self, cwd: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
        let mut c = Command::new(LAUNCHER);
        c.args(args)
            .current_dir(cwd)
            .env_clear()
            .env("HOME", self.home())
            .env("PATH", self.root.join("no-bin"));
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_says_how_to_reach_claudes_help() {
    let s = Scratch::new("help");
    let o = s.run(&s.home(), &["--help"], &[]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("agent-sandbox -- --help"), "{out}");
    assert!(out.contains("--exec"), "{out}");
    assert!(out.contains("AGENT_SANDBOX_IMAGE"), "{out}");
    let o = s.run(&s.home(), &["--version"], &[]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("agent-sandbox "));
}

#[test]
fn print_config_shows_overrides() {
    let s = Scratch::new("print");
    let list = s.root.join("elsewhere/list");
    let mut c = Command::new(LAUNCHER);
    let o = c
        .arg("--print-config")
        .env_clear()
        .env("HOME", s.home())
        .env("AGENT_SANDBOX_IMAGE", "reg.example/sandbox:9")
        .env("AGENT_SANDBOX_ALLOWLIST", &list)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("reg.example/sandbox:9"), "{out}");
    assert!(out.contains("localhost/agent-sandbox-router:dev"), "{out}");
    assert!(out.contains(&list.display().to_string()), "{out}");
    assert!(out.contains("agent-sandbox-home"), "{out}");
}

#[test]
fn refuses_home_its_parents_and_the_allowlists_directory() {
    let s = Scratch::new("refuse");
    let config = s.home().join(".config/agent-sandbox");
    fs::create_dir_all(&config).unwrap();
    fs::write(config.join("allowed-hosts"), "example.com\n").unwrap();
    // Through a symlink too: the check runs on the resolved path.
    let link = s.root.join("link-to-home");
    std::os::unix::fs::symlink(s.home(), &link).unwrap();
    for dir in [
        s.home(),
        link,
        s.root.clone(),
        PathBuf::from("/"),
        s.home().join(".config"),
        config,
    ] {
        let o = s.run(&dir, &["--exec", "true"], &[]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}: {}",
            dir.display(),
            stderr(&o)
        );
        assert!(
            stderr(&o).contains("refusing to run"),
            "{}: {}",
            dir.display(),
            stderr(&o)
        );
    }
}

#[test]
fn a_missing_allowlist_is_copied_and_then_podman_is_needed() {
    let s = Scratch::new("copy");
    let o = s.run(&s.home().join("project"), &["--exec", "true"], &[]);
    let err = stderr(&o);
    let copied = s.home().join(".config/agent-sandbox/allowed-hosts");
    assert!(err.contains("created"), "{err}");
    assert!(fs::read_to_string(&copied)
        .unwrap()
        .contains("api.anthropic.com"));
    assert!(err.contains("podman is not installed"), "{err}");
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn allowlist_errors_come_with_line_numbers() {
    let s = Scratch::new("bad");
    let list = s.root.join("list");
    fs::write(&list, "ok.example\n10.1.2.3\n*.bad.example\n").unwrap();
    let o = s.run(
        &s.home().join("project"),
        &["--exec", "true"],
        &[("AGENT_SANDBOX_ALLOWLIST", &list)],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("{}:2:", list.display())), "{err}");
    assert!(err.contains(&format!("{}:3:", list.display())), "{err}");
    assert!(!err.contains("podman"), "{err}");
}

#[test]
fn usage_errors() {
    let s = Scratch::new("usage");
    let o = s.run(&s.home(), &["--exec"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--exec needs a command"));
    let o = s.run(&s.home(), &["--build-images=nonsense"], &[]);
    assert_eq!(o.status.code(), Some(2));
}
