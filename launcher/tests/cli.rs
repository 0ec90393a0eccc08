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
fn print_config_shows_the_oauth_injection_and_its_store() {
    let s = Scratch::new("print-oauth");
    let state = s.root.join("state");
    let run = |extra: &[&str]| {
        let o = Command::new(LAUNCHER)
            .arg("--print-config")
            .args(extra)
            .env_clear()
            .env("HOME", s.home())
            .env("XDG_STATE_HOME", &state)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // No allowlist yet: judged by the default, which allows both hosts of the sign-in.
    let out = run(&[]);
    assert!(
        out.contains("terminated: api.anthropic.com, platform.claude.com"),
        "{out}"
    );
    assert!(out.contains("[inject.oauth]"), "{out}");
    assert!(out.contains("token_path = \"/v1/oauth/token\""), "{out}");
    let store = state.join("agent-sandbox/oauth").display().to_string();
    assert!(
        out.contains(&format!(
            "store_dir = \"/etc/agent-sandbox-oauth\"  # {store} on the host"
        )),
        "{out}"
    );
    // Printing makes nothing: the store is the first session's to create.
    assert!(!state.exists());
    let out = run(&["--no-inject"]);
    assert!(!out.contains("[inject.oauth]"), "{out}");
    assert!(
        out.contains("sign-in tokens stay on the home volume"),
        "{out}"
    );
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

/// Refuses the shared temp directories, the home's hidden directories, the runtime directory (inside
/// and above it), podman's configuration and the directory holding this program, through symlinks too;
/// nothing is created (not even the allowlist copy).
#[test]
fn refuses_temp_runtime_podman_hidden_and_launcher_directories() {
    let s = Scratch::new("refuse-more");
    let runtime = s.root.join("run");
    fs::create_dir_all(runtime.join("podman")).unwrap();
    let conf_dir = s.root.join("conf");
    fs::create_dir_all(&conf_dir).unwrap();
    fs::write(conf_dir.join("containers.conf"), "").unwrap();
    let ssh = s.home().join(".ssh/keys");
    fs::create_dir_all(&ssh).unwrap();
    let link = s.root.join("link-to-ssh");
    std::os::unix::fs::symlink(&ssh, &link).unwrap();
    let storage = s.home().join("project/storage");
    fs::create_dir_all(&storage).unwrap();
    let launcher_dir = Path::new(LAUNCHER).parent().unwrap().to_owned();
    let env: &[(&str, &Path)] = &[
        ("XDG_RUNTIME_DIR", &runtime),
        ("CONTAINERS_CONF", &conf_dir.join("containers.conf")),
        ("XDG_DATA_HOME", &s.home().join("project")),
    ];
    for (dir, why) in [
        (PathBuf::from("/tmp"), "shared temporary directory"),
        (std::env::temp_dir(), "shared temporary directory"),
        (s.home().join(".ssh"), "hidden directory of your home"),
        (link, "hidden directory of your home"),
        (runtime.clone(), "runtime directory"),
        (runtime.join("podman"), "runtime directory"),
        (conf_dir, "podman's storage"),
        // $XDG_DATA_HOME/containers is podman's storage: the directory above it is refused.
        (s.home().join("project"), "podman's storage"),
        (launcher_dir, "contains the agent-sandbox program"),
    ] {
        fs::create_dir_all(s.home().join("project/containers")).unwrap();
        // The scratch HOME is in the temp directory: a HOME elsewhere shows the temp refusal itself.
        let elsewhere = Path::new("/nonexistent-as-cli-home");
        let mut env = env.to_vec();
        if why == "shared temporary directory" {
            env.push(("HOME", elsewhere));
        }
        let o = s.run(&dir, &["--exec", "true"], &env);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", dir.display());
        assert!(
            err.contains("refusing to run") && err.contains(why),
            "{}: {err}",
            dir.display()
        );
        assert!(
            !s.home().join(".config/agent-sandbox").exists(),
            "{}: created the allowlist",
            dir.display()
        );
    }
    // A project elsewhere gets as far as podman.
    let project = s.root.join("elsewhere");
    fs::create_dir_all(&project).unwrap();
    let o = s.run(&project, &["--exec", "true"], env);
    assert!(
        stderr(&o).contains("podman is not installed"),
        "{}",
        stderr(&o)
    );
}

/// Under sudo the invoking user's home (from /etc/passwd, by SUDO_UID) is refused like $HOME.
#[test]
fn refuses_the_sudo_users_home() {
    let me = {
        use std::os::unix::fs::MetadataExt as _;
        fs::metadata("/proc/self").unwrap().uid()
    };
    // Another user with an existing home directory that no other rule refuses.
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    let other = passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        let uid: u32 = f.get(2)?.parse().ok()?;
        let home = Path::new(f.get(5)?);
        let ok = uid != me
            && home.is_absolute()
            && home.is_dir()
            && home.canonicalize().ok()? == home
            && ![
                "/", "/tmp", "/var", "/run", "/usr", "/etc", "/var/lib", "/var/run", "/dev",
                "/proc", "/sys",
            ]
            .contains(&f[5])
            && !home.starts_with("/run")
            && !home.starts_with("/tmp");
        ok.then(|| (uid, home.to_owned()))
    });
    let Some((uid, home)) = other else {
        eprintln!("no other user with a usable home directory: skipped");
        return;
    };
    let s = Scratch::new("sudo-home");
    let o = s.run(&home, &["--exec", "true"], &[]);
    assert!(
        !stderr(&o).contains("your home directory"),
        "{}: {}",
        home.display(),
        stderr(&o)
    );
    let uid = uid.to_string();
    let mut c = Command::new(LAUNCHER);
    let o = c
        .args(["--exec", "true"])
        .current_dir(&home)
        .env_clear()
        .env("HOME", s.home())
        .env("PATH", s.root.join("no-bin"))
        .env("SUDO_UID", &uid)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("refusing to run in your home directory"),
        "{}: {}",
        home.display(),
        stderr(&o)
    );
}
