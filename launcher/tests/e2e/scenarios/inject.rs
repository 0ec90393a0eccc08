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
//! Three sessions:
//! 1. injection: the sandbox holds a placeholder and trusts the session CA; the router terminates TLS
//!    and adds the real key. While it runs, `podman inspect` of every session container and the
//!    router's log must not hold the key, the CA key's directory must be mounted into the router only,
//!    and the secret files must be 0600 and not the invoking user's. Afterwards the stand-in must have
//!    received the real key and never the placeholder, and nothing the sandbox saw (its environment,
//!    its home volume) may hold the key.
//! 2. `--no-inject`: today's behaviour. The key is in the sandbox's environment, the router splices,
//!    and Claude Code trusts the stand-in's test CA through NODE_EXTRA_CA_CERTS (which proves the
//!    pinned Claude Code honours it, and that the canned streamed response is what `-p` needs).
//! 3. OAuth sign-in, no API key: the allowlist holds api.anthropic.com and platform.claude.com, and the
//!    home volume's `.claude/.credentials.json` holds fake "real" tokens before the session. The
//!    launcher must move them into the token store (`XDG_STATE_HOME`) and leave placeholders, and say
//!    so; the store is mounted read-write into the router only. Claude Code's requests must reach the
//!    stand-in with the real access token; a refresh posted from inside the sandbox with the refresh
//!    placeholder must reach the stand-in's token endpoint with the real refresh token, the sandbox must
//!    see only placeholders in the answer, and the store must end up with the stand-in's new tokens.
//!    No real token may be in anything the sandbox saw, in `podman inspect` or in the router's log.

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
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
    let new_tokens = (
        fake_token("sk-ant-oat01-", 95),
        fake_token("sk-ant-ort01-", 95),
    );
    let (standin, standin_ip) = start_standin(s, &new_tokens);
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

    // 3. The OAuth sign-in.
    let before = standin_requests(s, &standin).len();
    oauth(
        s,
        &dir,
        &standin,
        &standin_ip,
        &conf.join("cache"),
        &new_tokens,
        before,
    );
}

/// The sign-in's fake "real" tokens, as the launcher finds them on the home volume.
struct Tokens {
    access: String,
    refresh: String,
}

/// Part 3: the OAuth sign-in moved off the home volume and put on the wire by the router.
fn oauth(
    s: &mut Suite<'_>,
    dir: &Path,
    standin: &str,
    standin_ip: &str,
    cache: &Path,
    (new_access, new_refresh): &(String, String),
    before: usize,
) {
    let m = s.mode.name().to_owned();
    for f in ["ready", "inspected"] {
        let _ = fs::remove_file(dir.join(f));
    }
    let conf = s.fx.root.join("inject-oauth-conf");
    fs::create_dir_all(&conf).unwrap();
    fs::write(
        conf.join("allowed-hosts"),
        "api.anthropic.com\nplatform.claude.com\n",
    )
    .unwrap();
    if !s.mode.rootful() {
        chown_r(&conf, s.mode.uid, s.mode.gid);
    }
    let store_dir = conf.join("state/agent-sandbox/oauth");
    let real = Tokens {
        access: fake_token("sk-ant-oat01-", 95),
        refresh: fake_token("sk-ant-ort01-", 95),
    };
    let creds = put_credentials(s, &real);
    let env = [
        (
            "AGENT_SANDBOX_ALLOWLIST",
            conf.join("allowed-hosts").display().to_string(),
        ),
        (
            "AGENT_SANDBOX_TEST_ROUTER_RESOLVERS",
            format!("{standin_ip}:53"),
        ),
        (
            "AGENT_SANDBOX_TEST_UPSTREAM_ROOTS",
            s.ca.display().to_string(),
        ),
        ("XDG_STATE_HOME", conf.join("state").display().to_string()),
        ("XDG_CACHE_HOME", cache.display().to_string()),
    ];
    let mut child = s
        .launcher_command(dir, &["--exec", "bash", "./inject.sh", "oauth"], &env)
        .spawn()
        .unwrap();
    let ready = wait_for_file(&dir.join("ready"), &mut child, Duration::from_secs(180));
    s.checks.check(
        ready,
        format!("[{m}] oauth: the session starts and its sandbox runs the script"),
    );
    // The store as the launcher left it, before the sandbox does anything.
    let store = read_store(&store_dir);
    let placeholders = (
        store["access_placeholder"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        store["refresh_placeholder"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    );
    s.checks.check(
        store["access_token"] == real.access.as_str()
            && store["refresh_token"] == real.refresh.as_str(),
        format!(
            "[{m}] oauth: the launcher moved the home volume's tokens into the store {}",
            store_dir.display()
        ),
    );
    let on_volume: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("creds-before.json")).unwrap_or_default())
            .unwrap_or_default();
    let on_volume = &on_volume["claudeAiOauth"];
    s.checks.check(
        placeholders.0.starts_with("sk-ant-oat01-")
            && placeholders.1.starts_with("sk-ant-ort01-")
            && on_volume["accessToken"] == placeholders.0.as_str()
            && on_volume["refreshToken"] == placeholders.1.as_str()
            && on_volume["subscriptionType"] == "max",
        format!(
            "[{m}] oauth: the sandbox's credentials file holds the store's placeholders, other fields kept"
        ),
    );
    let moved = fs::read(&creds)
        .map(|b| !contains(&b, real.access.as_bytes()) && !contains(&b, real.refresh.as_bytes()))
        .unwrap_or(false);
    s.checks.check(
        moved,
        format!("[{m}] oauth: the credentials file on the home volume holds no real token"),
    );
    let meta = fs::metadata(&store_dir).and_then(|d| {
        fs::metadata(store_dir.join("oauth.json")).map(|f| (d.uid(), f.uid(), f.mode() & 0o777))
    });
    let owner = if s.mode.rootful() { 65532 } else { s.mode.uid };
    s.checks.check(
        meta.as_ref()
            .is_ok_and(|(d, f, mode)| *d == owner && *f == owner && *mode == 0o600),
        format!(
            "[{m}] oauth: the store is 0600 and owned by {owner} (rootful: the router's user; rootless: the user's own, mapped to the router's): {meta:?}"
        ),
    );
    fs::write(dir.join("store-checked"), "").unwrap();
    let secrets = [
        real.access.as_str(),
        real.refresh.as_str(),
        new_access,
        new_refresh,
    ];
    if ready {
        inspect_oauth_running(s, dir, &secrets, &store_dir);
    }
    fs::write(dir.join("inspected"), "").unwrap();
    let r = finish(child, Duration::from_secs(300));
    s.checks.script(
        &s.mode.clone(),
        &r.stdout,
        &[
            "session-ca-mounted",
            "node-extra-ca-certs",
            "bundle-has-session-ca",
            "ca-key-invisible",
            "token-store-invisible",
            "no-api-key",
        ],
    );
    s.checks.check(
        r.stderr.contains("stored outside the sandbox") && r.stderr.contains("/login"),
        format!(
            "[{m}] oauth: the launcher tells the user the tokens were moved and to sign in again: {}",
            r.stderr
        ),
    );
    let got = standin_requests(s, standin).split_off(before);
    let claude = read(&dir.join("claude-oauth.out"));
    s.checks.check(
        got.iter().any(|l| {
            l.contains("host=api.anthropic.com") && l.contains(&format!("auth=Bearer {} ", real.access))
        }),
        format!(
            "[{m}] oauth: claude -p reaches the stand-in with the real access token, added by the router: {got:?}, claude out {claude:?} err {:?}",
            read(&dir.join("claude-oauth.err"))
        ),
    );
    s.checks.check(
        read(&dir.join("claude-oauth.rc")).trim() == "0" && claude.contains(STANDIN_TEXT),
        format!(
            "[{m}] oauth: claude -p signed in with placeholders gets the stand-in's answer: rc {:?}, out {claude:?}, err {:?}",
            read(&dir.join("claude-oauth.rc")),
            read(&dir.join("claude-oauth.err"))
        ),
    );
    s.checks.check(
        got.iter().any(|l| {
            l.contains("POST /v1/oauth/token host=platform.claude.com")
                && l.ends_with(&format!("refresh={}", real.refresh))
        }),
        format!("[{m}] oauth: the token endpoint receives the real refresh token: {got:?}"),
    );
    s.checks.check(
        !got.is_empty()
            && !got
                .iter()
                .any(|l| l.contains(&placeholders.0) || l.contains(&placeholders.1)),
        format!("[{m}] oauth: no placeholder reaches the stand-in: {got:?}"),
    );
    let answer: serde_json::Value =
        serde_json::from_str(&read(&dir.join("refresh.out"))).unwrap_or_default();
    s.checks.check(
        answer["access_token"] == placeholders.0.as_str()
            && answer["refresh_token"] == placeholders.1.as_str()
            && answer["expires_in"] == 28800,
        format!(
            "[{m}] oauth: the sandbox sees the token endpoint's answer with placeholders only: rc {:?}, err {:?}, {answer}",
            read(&dir.join("refresh.rc")),
            read(&dir.join("refresh.err"))
        ),
    );
    let store = read_store(&store_dir);
    s.checks.check(
        store["access_token"] == new_access.as_str()
            && store["refresh_token"] == new_refresh.as_str()
            && store["access_placeholder"] == placeholders.0.as_str()
            && store["refresh_placeholder"] == placeholders.1.as_str(),
        format!("[{m}] oauth: the store holds the stand-in's new tokens, placeholders unchanged"),
    );
    let seen: Vec<Vec<u8>> = [
        "env-oauth.txt",
        "home-oauth.tar",
        "creds-before.json",
        "creds-after.json",
        "refresh.out",
        "claude-oauth.out",
        "claude-oauth.err",
    ]
    .iter()
    .map(|f| fs::read(dir.join(f)).unwrap_or_default())
    .collect();
    let leaked: Vec<usize> = secrets
        .iter()
        .enumerate()
        .filter(|(_, t)| seen.iter().any(|b| contains(b, t.as_bytes())))
        .map(|(i, _)| i)
        .collect();
    s.checks.check(
        !seen[1].is_empty() && leaked.is_empty(),
        format!(
            "[{m}] oauth: nothing the sandbox saw (environment, home volume, answers) holds a real token (old or new); leaked: {leaked:?}"
        ),
    );
}

/// Writes `.claude/.credentials.json` with `real` onto the suite's home volume, owned like the
/// volume's top directory (the sandbox user), as Claude Code leaves it after a sign-in. Returns its
/// path on the host.
fn put_credentials(s: &Suite<'_>, real: &Tokens) -> PathBuf {
    let mountpoint = s.mode.podman_ok(&[
        "volume",
        "inspect",
        "--format",
        "{{.Mountpoint}}",
        &s.home_volume,
    ]);
    let home = PathBuf::from(mountpoint.trim());
    let owner = fs::metadata(&home).unwrap();
    let claude_dir = home.join(".claude");
    fs::create_dir_all(&claude_dir).unwrap();
    std::os::unix::fs::chown(&claude_dir, Some(owner.uid()), Some(owner.gid())).unwrap();
    let creds = claude_dir.join(".credentials.json");
    let json = serde_json::json!({
        "claudeAiOauth": {
            "accessToken": real.access,
            "refreshToken": real.refresh,
            "expiresAt": 4_102_444_800_000u64,
            "scopes": ["user:inference", "user:profile"],
            "subscriptionType": "max",
        }
    });
    fs::write(&creds, serde_json::to_vec(&json).unwrap()).unwrap();
    std::os::unix::fs::chown(&creds, Some(owner.uid()), Some(owner.gid())).unwrap();
    fs::set_permissions(&creds, fs::Permissions::from_mode(0o600)).unwrap();
    creds
}

/// The token store's JSON (Null when unreadable).
fn read_store(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(dir.join("oauth.json")).unwrap_or_default())
        .unwrap_or_default()
}

/// While the OAuth session runs: the store is mounted read-write into the router only, and neither
/// `podman inspect` nor the router's log holds a token.
fn inspect_oauth_running(s: &mut Suite<'_>, dir: &Path, secrets: &[&str], store: &Path) {
    let m = s.mode.name().to_owned();
    let names = s.mode.podman_ok(&[
        "ps",
        "--filter",
        &format!("label={PROJECT_LABEL}={}", dir.display()),
        "--format",
        "{{.Names}}",
    ]);
    let names: Vec<&str> = names.lines().filter(|l| !l.is_empty()).collect();
    let mut router_has_store = false;
    for name in &names {
        let json = s.mode.podman_ok(&["inspect", name]);
        s.checks.check(
            !secrets.iter().any(|t| json.contains(t)),
            format!("[{m}] oauth: `podman inspect {name}` holds no token"),
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
        let mounts = v[0]["Mounts"].as_array().cloned().unwrap_or_default();
        let of_store: Vec<&serde_json::Value> = mounts
            .iter()
            .filter(|mnt| {
                mnt["Source"]
                    .as_str()
                    .is_some_and(|src| Path::new(src) == store)
                    || mnt["Destination"] == "/etc/agent-sandbox-oauth"
            })
            .collect();
        if name.ends_with("-router") {
            router_has_store = of_store.len() == 1
                && of_store[0]["Destination"] == "/etc/agent-sandbox-oauth"
                && of_store[0]["RW"] == true;
            let logs = text(&s.mode.podman(&["logs", name]));
            s.checks.check(
                !secrets.iter().any(|t| logs.contains(t)),
                format!("[{m}] oauth: the router's log holds no token"),
            );
        } else {
            s.checks.check(
                of_store.is_empty(),
                format!("[{m}] oauth: {name} does not have the token store: {mounts:?}"),
            );
        }
    }
    s.checks.check(
        router_has_store,
        format!("[{m}] oauth: the router has the token store, read-write: {names:?}"),
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
    // Rootful: given to the router's user. Rootless: the user's own, which the router's user is
    // mapped to (`--userns=keep-id:uid=65532`).
    let owner = if s.mode.rootful() { 65532 } else { s.mode.uid };
    for f in ["ca.key", "api-key"] {
        let got = meta(f);
        s.checks.check(
            got.as_ref()
                .is_ok_and(|(mode, uid)| mode == "600" && *uid == owner),
            format!("[{m}] {f} is 0600 and owned by {owner}, the router's user: {got:?}"),
        );
    }
    let got = meta("ca.pem");
    s.checks.check(
        got.as_ref().is_ok_and(|(mode, _)| mode == "644"),
        format!("[{m}] ca.pem is 0644: {got:?}"),
    );
}

/// The stand-in on the egress network; returns its name and address once it says it is ready.
fn start_standin(s: &mut Suite<'_>, (access, refresh): &(String, String)) -> (String, String) {
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
        "--env",
        &format!("STANDIN_NEW_ACCESS={access}"),
        "--env",
        &format!("STANDIN_NEW_REFRESH={refresh}"),
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
    format!("{}AA", fake_token("sk-ant-api03-", 93))
}

/// A fake credential: `prefix` and `len` random base64url characters.
fn fake_token(prefix: &str, len: usize) -> String {
    let mut bytes = vec![0u8; len];
    fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let body: String = bytes
        .iter()
        .map(|b| char::from(alphabet[usize::from(b & 63)]))
        .collect();
    format!("{prefix}{body}")
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
