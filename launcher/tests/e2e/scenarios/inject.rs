//! Credential injection (issue 20) end to end: the pinned Claude Code from the sandbox image runs
//! `claude -p hello` against a stand-in api.anthropic.com (tests/e2e/standin.py: a container of the
//! suite's own on the egress network, with a certificate from the suite's test CA).
//!
//! Nothing can reach the real host: the allowlist holds only api.anthropic.com, so the router's DNS
//! answers NXDOMAIN for everything else Claude Code tries (telemetry and the like); the router resolves
//! through the stand-in's own DNS (the launcher's test hook `AGENT_SANDBOX_TEST_ROUTER_RESOLVERS`),
//! which knows no other name and forwards nothing; and the router verifies upstreams against the test
//! CA (`AGENT_SANDBOX_TEST_UPSTREAM_ROOTS`). The API key is the suite's own fake.
//!
//! Two sessions:
//! 1. injection: the sandbox holds a placeholder and trusts the session CA; the router terminates TLS
//!    and adds the real key. While it runs, `podman inspect` of every session container and the
//!    router's log must not hold the key, the CA key's directory must be mounted into the router only,
//!    and the secret files must be 0600 and not the invoking user's. Afterwards the stand-in must have
//!    received the real key and never the placeholder, and nothing the sandbox saw (its environment,
//!    its home volume) may hold the key.
//! 2. `--no-inject`: today's behaviour. The key is in the sandbox's environment, the router splices,
//!    and Claude Code trusts the stand-in's test CA through NODE_EXTRA_CA_CERTS (which proves the
//!    pinned Claude Code honours it, and that the canned streamed response is what `-p` needs).

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mode::{chown_r, text};
use crate::suite::{finish, Suite};
use crate::{EGRESS, PROJECT_LABEL, SANDBOX_IMAGE, TEST_LABEL};

/// What the stand-in answers (tests/e2e/standin.py).
const STANDIN_TEXT: &str = "stand-in says hello";

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let mode = s.mode.clone();
    let m = mode.name().to_owned();
    let (standin, standin_ip) = start_standin(s);
    let dir = s.project("inject");
    s.copy_script(&dir, "inject.sh");
    // The allowlist (api.anthropic.com only) and the launcher's state and cache, outside the project.
    let conf = s.fx.root.join("inject-conf");
    fs::create_dir_all(&conf).unwrap();
    fs::write(conf.join("allowed-hosts"), "api.anthropic.com\n").unwrap();
    if !mode.rootful() {
        chown_r(&conf, mode.uid, mode.gid);
    }
    let key = fake_key();
    let env = [
        (
            "AGENT_SANDBOX_ALLOWLIST",
            conf.join("allowed-hosts").display().to_string(),
        ),
        ("ANTHROPIC_API_KEY", key.clone()),
        (
            "AGENT_SANDBOX_TEST_ROUTER_RESOLVERS",
            format!("{standin_ip}:53"),
        ),
        (
            "AGENT_SANDBOX_TEST_UPSTREAM_ROOTS",
            s.ca.display().to_string(),
        ),
        ("XDG_STATE_HOME", conf.join("state").display().to_string()),
        ("XDG_CACHE_HOME", conf.join("cache").display().to_string()),
    ];

    // 1. Injection.
    let mut child = s
        .launcher_command(&dir, &["--exec", "bash", "./inject.sh", "inject"], &env)
        .spawn()
        .unwrap();
    let ready = wait_for_file(&dir.join("ready"), &mut child, Duration::from_secs(180));
    s.checks.check(
        ready,
        format!("[{m}] the injecting session starts and its sandbox runs the script"),
    );
    if ready {
        inspect_running(s, &dir, &key);
    }
    fs::write(dir.join("inspected"), "").unwrap();
    let r = finish(child, Duration::from_secs(300));
    s.checks.script(
        &mode,
        &r.stdout,
        &[
            "session-ca-mounted",
            "node-extra-ca-certs",
            "ssl-cert-file",
            "bundle-has-session-ca",
            "bundle-keeps-system-roots",
            "bundle-read-only",
            "ca-key-invisible",
            "placeholder-key",
        ],
    );
    let got = standin_requests(s, &standin);
    let claude = read(&dir.join("claude-inject.out"));
    s.checks.check(
        r.code == Some(0) && claude.contains(STANDIN_TEXT),
        format!(
            "[{m}] claude -p trusts the session CA and gets the stand-in's answer through the terminating router: code {:?}, out {claude:?}, err {:?}, launcher {}",
            r.code,
            read(&dir.join("claude-inject.err")),
            r.stderr
        ),
    );
    s.checks.check(
        got.iter()
            .any(|l| l.contains("POST /v1/messages") && l.contains(&format!("key={key}"))),
        format!("[{m}] the stand-in receives the real key, added by the router: {got:?}"),
    );
    let sandbox_env = read(&dir.join("env-inject.txt"));
    let placeholder = sandbox_env
        .lines()
        .find_map(|l| l.strip_prefix("ANTHROPIC_API_KEY="))
        .unwrap_or_default()
        .to_owned();
    s.checks.check(
        placeholder.starts_with("sk-ant-api03-") && placeholder.len() == key.len() && placeholder != key,
        format!("[{m}] the sandbox's ANTHROPIC_API_KEY is a placeholder of the key's shape: {placeholder:?}"),
    );
    s.checks.check(
        !placeholder.is_empty() && !got.is_empty() && !got.iter().any(|l| l.contains(&placeholder)),
        format!("[{m}] requests reach the stand-in, and the placeholder never does: {got:?}"),
    );
    let home = fs::read(dir.join("home-inject.tar")).unwrap_or_default();
    s.checks.check(
        !sandbox_env.contains(&key) && !home.is_empty() && !contains(&home, key.as_bytes()),
        format!(
            "[{m}] neither the sandbox's environment nor its home volume ({} bytes) holds the real key",
            home.len()
        ),
    );
    let before = got.len();

    // 2. --no-inject: as before injection (second: the home volume the first part checked never held
    // the key).
    let r = s.launch_env(
        &dir,
        &["--no-inject", "--exec", "bash", "./inject.sh", "no-inject"],
        &env,
    );
    let got = standin_requests(s, &standin).split_off(before);
    let claude = read(&dir.join("claude-no-inject.out"));
    s.checks.check(
        r.code == Some(0) && claude.contains(STANDIN_TEXT),
        format!(
            "[{m}] --no-inject: claude -p answers through the splicing router with the stand-in's text: code {:?}, out {claude:?}, err {:?}, launcher {}",
            r.code,
            read(&dir.join("claude-no-inject.err")),
            r.stderr
        ),
    );
    s.checks.check(
        got.iter()
            .any(|l| l.contains("POST /v1/messages") && l.contains(&format!("key={key}"))),
        format!("[{m}] --no-inject: the stand-in receives the key from the sandbox: {got:?}"),
    );
    s.checks.check(
        read(&dir.join("env-no-inject.txt")).contains(&format!("ANTHROPIC_API_KEY={key}")),
        format!("[{m}] --no-inject: the sandbox's environment holds the key as before"),
    );
}

/// While the injecting session runs: what podman shows of its containers, and the secret files.
fn inspect_running(s: &mut Suite<'_>, dir: &Path, key: &str) {
    let m = s.mode.name().to_owned();
    let names = s.mode.podman_ok(&[
        "ps",
        "--filter",
        &format!("label={PROJECT_LABEL}={}", dir.display()),
        "--format",
        "{{.Names}}",
    ]);
    // The pod's infra container carries the labels too.
    let names: Vec<&str> = names.lines().filter(|l| !l.is_empty()).collect();
    let has = |suffix: &str| names.iter().any(|n| n.ends_with(suffix));
    s.checks.check(
        has("-router") && has("-forwarder") && has("-sandbox"),
        format!("[{m}] the session has its router, forwarder and sandbox: {names:?}"),
    );
    let mut inspected = Vec::new();
    for name in &names {
        let json = s.mode.podman_ok(&["inspect", name]);
        s.checks.check(
            !json.contains(key),
            format!(
                "[{m}] `podman inspect {name}` (arguments, environment, mounts) holds no real key"
            ),
        );
        let mounts: Vec<(String, String)> = serde_json::from_str::<serde_json::Value>(&json)
            .ok()
            .and_then(|v| v[0]["Mounts"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|mnt| {
                (
                    mnt["Source"].as_str().unwrap_or_default().to_owned(),
                    mnt["Destination"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        inspected.push(((*name).to_owned(), mounts));
    }
    let inject_dir = inspected
        .iter()
        .filter(|(name, _)| name.ends_with("-router"))
        .flat_map(|(_, mounts)| mounts.iter())
        .find(|(_, dst)| dst == "/etc/agent-sandbox-inject")
        .map(|(src, _)| PathBuf::from(src));
    s.checks.check(
        inject_dir.is_some(),
        format!("[{m}] the router has the inject directory: {inspected:?}"),
    );
    let Some(inject_dir) = inject_dir else {
        return;
    };
    for (name, mounts) in &inspected {
        if name.ends_with("-router") {
            let logs = text(&s.mode.podman(&["logs", name]));
            s.checks.check(
                !logs.contains(key),
                format!("[{m}] the router's log holds no real key"),
            );
            continue;
        }
        let secret = |src: &str| {
            let src = Path::new(src);
            src == inject_dir
                || src == inject_dir.join("ca.key")
                || src == inject_dir.join("api-key")
        };
        s.checks.check(
            !mounts
                .iter()
                .any(|(src, dst)| secret(src) || dst == "/etc/agent-sandbox-inject"),
            format!("[{m}] {name} has neither the CA key nor the key file: {mounts:?}"),
        );
    }
    let meta = |f: &str| {
        fs::metadata(inject_dir.join(f)).map(|md| (format!("{:o}", md.mode() & 0o777), md.uid()))
    };
    for f in ["ca.key", "api-key"] {
        let got = meta(f);
        s.checks.check(
            got.as_ref()
                .is_ok_and(|(mode, uid)| mode == "600" && *uid != s.mode.uid),
            format!("[{m}] {f} is 0600 and the router user's, not the invoking user's: {got:?}"),
        );
    }
    let got = meta("ca.pem");
    s.checks.check(
        got.as_ref().is_ok_and(|(mode, _)| mode == "644"),
        format!("[{m}] ca.pem is 0644: {got:?}"),
    );
}

/// The stand-in on the egress network; returns its name and address once it says it is ready.
fn start_standin(s: &mut Suite<'_>) -> (String, String) {
    let name = format!("as-e2e-standin-{}", std::process::id());
    let certs = s.ca.parent().unwrap().display().to_string();
    let script = s.artifacts.join("standin.py").display().to_string();
    let _ = s.mode.podman(&["rm", "--force", &name]);
    s.mode.podman_ok(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--label",
        &format!("{TEST_LABEL}=1"),
        "--network",
        EGRESS,
        "--security-opt",
        "label=disable",
        "--volume",
        &format!("{certs}:/srv/certs:ro"),
        "--volume",
        &format!("{script}:/srv/standin.py:ro"),
        SANDBOX_IMAGE,
        "python3",
        "-u",
        "/srv/standin.py",
    ]);
    s.fx.containers.push(name.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs = text(&s.mode.podman(&["logs", &name]));
        if let Some(addr) = logs
            .lines()
            .find_map(|l| l.trim().strip_prefix("ready address="))
        {
            return (name, addr.trim().to_owned());
        }
        assert!(
            Instant::now() < deadline,
            "stand-in {name} did not start: {logs}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The stand-in's request lines so far.
fn standin_requests(s: &Suite<'_>, name: &str) -> Vec<String> {
    let o = s.mode.podman(&["logs", name]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("request "))
        .map(str::to_owned)
        .collect()
}

/// A fake key of a real one's shape: `sk-ant-api03-`, 93 random characters, `AA`.
fn fake_key() -> String {
    let mut bytes = [0u8; 93];
    fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let body: String = bytes
        .iter()
        .map(|b| char::from(alphabet[usize::from(b & 63)]))
        .collect();
    format!("sk-ant-api03-{body}AA")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Polls for `path` until `limit`, or until the launcher has exited without making it.
fn wait_for_file(path: &Path, launcher: &mut std::process::Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        if launcher.try_wait().ok().flatten().is_some() {
            return path.exists();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}
