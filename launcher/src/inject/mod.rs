//! Credential injection, the launcher's side (issue 20): secrets never enter the sandbox.
//!
//! The sandbox gets a placeholder where the real API key was; the router, which alone holds the real
//! key, terminates TLS for the hosts that need a credential and swaps the placeholder for the key on
//! the wire. For that the launcher makes, per session:
//!
//! - [`decide`]: which hosts are terminated, and why (shown by `--print-config` and `doctor` too): the
//!   API key's host, and the OAuth sign-in's two hosts, whose host-side token store
//!   (`crate::oauth`) is mounted read-write into the router only;
//! - [`ca`]: a short-lived CA name-constrained to those hosts, which signs the router's leaves;
//! - [`placeholder`]: the placeholder key, stable per home volume;
//! - [`prepare`]: the session directory's `inject/` (`ca.pem`, `ca.key`, `api-key`), mounted read-only
//!   into the router only, and what the sandbox gets instead: the CA certificate, a CA bundle of the
//!   image's roots plus the session CA over the system bundle, and the environment pointing at them.
//!
//! `--no-inject` turns all of it off: the real key goes into the sandbox's environment as before,
//! nothing is terminated, and the sign-in tokens stay wherever they are.

pub mod ca;
pub mod placeholder;

use std::ffi::OsString;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use agent_sandbox_shared::inject::{ApiKeyInject, InjectConfig, OAuthInject};
use agent_sandbox_shared::{HostName, Policy};

use crate::podman::{
    args, Podman, ROUTER_GID, ROUTER_INJECT_DIR, ROUTER_OAUTH_DIR, ROUTER_UID, SANDBOX_SESSION_CA,
    SYSTEM_CA_BUNDLE,
};

/// The host that receives the API key (and the OAuth access token).
pub const API_HOST: &str = "api.anthropic.com";
/// The host of the OAuth token endpoint.
pub const TOKEN_HOST: &str = "platform.claude.com";
/// The OAuth token endpoint's path on [`TOKEN_HOST`].
pub const TOKEN_PATH: &str = "/v1/oauth/token";
/// The host environment variable holding the real API key.
pub const API_KEY_VAR: &str = "ANTHROPIC_API_KEY";

/// Test hook: a PEM file of roots the router verifies upstreams against instead of the web PKI (the
/// end-to-end suite's test CA). Not for users: it lets the router trust whatever the file says.
pub const TEST_UPSTREAM_ROOTS_VAR: &str = "AGENT_SANDBOX_TEST_UPSTREAM_ROOTS";

/// The session directory's subdirectory mounted into the router only.
pub const INJECT_DIR: &str = "inject";
/// The CA certificate's file name (in [`INJECT_DIR`]; the sandbox gets this one file too).
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA key's file name (in [`INJECT_DIR`]; router only).
pub const CA_KEY_FILE: &str = "ca.key";
/// The real API key's file name (in [`INJECT_DIR`]; router only).
pub const API_KEY_FILE: &str = "api-key";
/// The test upstream roots' file name (in [`INJECT_DIR`]).
pub const UPSTREAM_ROOTS_FILE: &str = "upstream-roots.pem";
/// The sandbox's CA bundle (image roots + session CA), in the session directory.
pub const BUNDLE_FILE: &str = "ca-bundle.crt";

/// The largest system CA bundle read from the sandbox image.
const MAX_BUNDLE: usize = 8 << 20;

/// Which hosts a session terminates, and why each host is or is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Hosts that get the API key (terminated).
    pub api_key_hosts: Vec<String>,
    /// The OAuth token store on the host when the sign-in is injected: [`API_HOST`] gets the access
    /// token and [`TOKEN_HOST`]'s token endpoint is rewritten (both terminated). None: not injected.
    pub oauth_store: Option<PathBuf>,
    /// One line per host or credential: what happens and why.
    pub reasons: Vec<String>,
    /// `--no-inject` was given.
    pub disabled: bool,
}

impl Decision {
    /// Every terminated host, sorted, each once.
    #[must_use]
    pub fn terminated(&self) -> Vec<String> {
        let mut hosts = self.api_key_hosts.clone();
        if self.oauth_store.is_some() {
            hosts.extend([API_HOST.to_owned(), TOKEN_HOST.to_owned()]);
        }
        hosts.sort();
        hosts.dedup();
        hosts
    }

    /// One line: which hosts are terminated, and why (`doctor`, `--print-config`).
    #[must_use]
    pub fn summary(&self) -> String {
        let hosts = self.terminated();
        let what = if hosts.is_empty() {
            "no host is terminated".to_owned()
        } else {
            format!("terminated: {}", hosts.join(", "))
        };
        format!("{what} ({})", self.reasons.join("; "))
    }
}

/// Decides what a session terminates; nothing with `--no-inject` (`enabled` false). Each credential
/// on its own:
/// - the API key: `api.anthropic.com` when the host has a key and the allowlist allows the host;
/// - the OAuth sign-in: `api.anthropic.com` (access token) and `platform.claude.com` (token endpoint)
///   when the allowlist allows both (signing in needs both) and the token store has a place
///   (`store_dir`, from [`crate::oauth::default_store_dir`]). Decided whether or not anyone is signed
///   in: `/login` inside the sandbox must also end with the tokens in the store.
#[must_use]
pub fn decide(
    policy: &Policy,
    api_key_set: bool,
    store_dir: Option<&Path>,
    enabled: bool,
) -> Decision {
    let mut d = Decision {
        api_key_hosts: Vec::new(),
        oauth_store: None,
        reasons: Vec::new(),
        disabled: !enabled,
    };
    if !enabled {
        d.reasons.push(format!(
            "--no-inject: {API_KEY_VAR} is passed into the sandbox as it is, sign-in tokens stay on the home volume, and every host is spliced"
        ));
        return d;
    }
    let allows = |host: &str| HostName::parse(host).is_ok_and(|h| policy.allows(&h));
    let allowed = allows(API_HOST);
    match (api_key_set, allowed) {
        (true, true) => {
            d.api_key_hosts.push(API_HOST.to_owned());
            d.reasons.push(format!(
                "{API_HOST}: {API_KEY_VAR} is set; the sandbox holds a placeholder and the router adds the key"
            ));
        }
        (true, false) => d.reasons.push(format!(
            "{API_KEY_VAR} is set but {API_HOST} is not on the allowlist: the key is kept out of the sandbox and used nowhere"
        )),
        (false, _) => d.reasons.push(format!("{API_KEY_VAR} is not set: no API key to add")),
    }
    let missing: Vec<&str> = [API_HOST, TOKEN_HOST]
        .into_iter()
        .filter(|h| !allows(h))
        .collect();
    match (missing.is_empty(), store_dir) {
        (true, Some(store)) => {
            d.oauth_store = Some(store.to_owned());
            d.reasons.push(format!(
                "OAuth sign-in ({API_HOST}, {TOKEN_HOST}): the tokens are kept in {}; the sandbox's credentials file holds placeholders and the router adds the tokens",
                store.display()
            ));
        }
        (true, None) => d.reasons.push(
            "OAuth sign-in: not injected: neither XDG_STATE_HOME nor HOME is an absolute path, so the token store has no place; tokens stay on the home volume"
                .to_owned(),
        ),
        (false, _) => d.reasons.push(format!(
            "OAuth sign-in: not injected: {} not on the allowlist (signing in needs {API_HOST} and {TOKEN_HOST})",
            if missing.len() == 1 {
                format!("{} is", missing[0])
            } else {
                format!("{} are", missing.join(" and "))
            }
        )),
    }
    d
}

/// The `[inject]` section as `--print-config` shows it (paths as the router sees them).
#[must_use]
pub fn describe(decision: &Decision, placeholder: Option<&str>, upstream_roots: bool) -> String {
    let mut out = format!("inject:         {}\n", decision.summary());
    let Some(config) = config_for(
        decision,
        placeholder.unwrap_or("<made at the first session>"),
        upstream_roots,
    ) else {
        out.push_str("[inject]:       (none: nothing is terminated)\n");
        return out;
    };
    out.push_str("[inject]\n");
    out.push_str(&format!(
        "ca_cert = {:?}\n",
        config.ca_cert.display().to_string()
    ));
    out.push_str(&format!(
        "ca_key = {:?}\n",
        config.ca_key.display().to_string()
    ));
    if let Some(r) = &config.upstream_roots {
        out.push_str(&format!("upstream_roots = {:?}\n", r.display().to_string()));
    }
    if let Some(k) = &config.api_key {
        out.push_str("[inject.api_key]\n");
        out.push_str(&format!("hosts = {:?}\n", k.hosts));
        out.push_str(&format!("placeholder = {:?}\n", k.placeholder));
        out.push_str(&format!(
            "key_file = {:?}\n",
            k.key_file.display().to_string()
        ));
    }
    if let (Some(o), Some(store)) = (&config.oauth, &decision.oauth_store) {
        out.push_str("[inject.oauth]\n");
        out.push_str(&format!("api_hosts = {:?}\n", o.api_hosts));
        out.push_str(&format!("token_host = {:?}\n", o.token_host));
        out.push_str(&format!("token_path = {:?}\n", o.token_path));
        out.push_str(&format!(
            "store_dir = {:?}  # {} on the host, mounted read-write into the router only\n",
            o.store_dir.display().to_string(),
            store.display()
        ));
    }
    out
}

/// The router's `[inject]` section for `decision` (None: nothing is terminated).
fn config_for(
    decision: &Decision,
    placeholder: &str,
    upstream_roots: bool,
) -> Option<InjectConfig> {
    if decision.terminated().is_empty() {
        return None;
    }
    let inside = Path::new(ROUTER_INJECT_DIR);
    Some(InjectConfig {
        ca_cert: inside.join(CA_CERT_FILE),
        ca_key: inside.join(CA_KEY_FILE),
        upstream_roots: upstream_roots.then(|| inside.join(UPSTREAM_ROOTS_FILE)),
        api_key: (!decision.api_key_hosts.is_empty()).then(|| ApiKeyInject {
            hosts: decision.api_key_hosts.clone(),
            placeholder: placeholder.to_owned(),
            key_file: inside.join(API_KEY_FILE),
        }),
        oauth: decision.oauth_store.as_ref().map(|_| OAuthInject {
            api_hosts: vec![API_HOST.to_owned()],
            token_host: TOKEN_HOST.to_owned(),
            token_path: TOKEN_PATH.to_owned(),
            store_dir: PathBuf::from(ROUTER_OAUTH_DIR),
        }),
    })
}

/// What a session with injection gives the router and the sandbox.
#[derive(Debug)]
pub(crate) struct SessionInject {
    /// The router's `[inject]` section.
    pub(crate) config: InjectConfig,
    /// `inject/` in the session directory: mounted read-only into the router, and nowhere else.
    pub(crate) router_dir: PathBuf,
    /// The CA certificate, mounted read-only into the sandbox at [`SANDBOX_SESSION_CA`].
    pub(crate) ca_cert: PathBuf,
    /// The image's roots plus the session CA, mounted read-only over [`SYSTEM_CA_BUNDLE`].
    pub(crate) bundle: PathBuf,
    /// The OAuth token store's directory on the host: mounted read-write into the router only (None:
    /// the sign-in is not injected).
    pub(crate) oauth_store: Option<PathBuf>,
    /// What the user must be told before the session (tokens moved off the home volume, a
    /// credentials file that was in the way).
    pub(crate) notices: Vec<String>,
    /// The sandbox's environment for it: the CA variables and the placeholder key.
    pub(crate) env: Vec<(String, String)>,
}

/// What [`prepare`] needs from the session.
pub(crate) struct Request<'a> {
    /// The session id (the CA's common name).
    pub(crate) session: &'a str,
    /// The session directory.
    pub(crate) dir: &'a Path,
    /// The hosts to terminate.
    pub(crate) decision: &'a Decision,
    /// The real API key (when the decision adds it).
    pub(crate) api_key: Option<&'a str>,
    /// The home volume (the placeholder is its own).
    pub(crate) home_volume: &'a str,
    /// Where the placeholder store is.
    pub(crate) state_dir: &'a Path,
    /// Where the image's CA bundle is cached.
    pub(crate) cache_dir: &'a Path,
    /// The sandbox image.
    pub(crate) image: &'a str,
    /// Rootless podman (the router's user is a subordinate id of this user's).
    pub(crate) rootless: bool,
    /// The test hook's upstream roots file ([`TEST_UPSTREAM_ROOTS_VAR`]).
    pub(crate) upstream_roots: Option<&'a Path>,
    /// The home volume's directory on the host, where Claude Code's credentials file is (None: not
    /// visible from here, e.g. another volume driver).
    pub(crate) home_mountpoint: Option<&'a Path>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The real key never reaches a message by way of `{:?}`.
        f.debug_struct("Request")
            .field("session", &self.session)
            .field("dir", &self.dir)
            .field("decision", &self.decision)
            .field("api_key", &self.api_key.map(|_| "<redacted>"))
            .field("home_volume", &self.home_volume)
            .field("home_mountpoint", &self.home_mountpoint)
            .finish_non_exhaustive()
    }
}

/// Writes the session's CA, key files and bundle (None when nothing is terminated).
pub(crate) fn prepare(podman: &Podman, req: &Request<'_>) -> anyhow::Result<Option<SessionInject>> {
    if req.decision.terminated().is_empty() {
        return Ok(None);
    }
    let system = image_bundle(podman, req.image, req.cache_dir)?;
    let (mut inject, secret_files) = write_session_files(req, &system)?;
    give_to_router(&secret_files, req.rootless)?;
    if let Some(store) = &req.decision.oauth_store {
        inject.notices = prepare_oauth(store, req.home_mountpoint)?;
        if !req.rootless {
            give_store_to_router(store)?;
        }
    }
    Ok(Some(inject))
}

/// The token store ready and the home volume holding placeholders only (`crate::oauth::prepare`);
/// returns what the user must be told. Only a store that cannot be used stops the session: a
/// credentials file in the way (which the sandbox could have put there) is reported and left alone,
/// as the sandbox then holds no token this step would have moved.
fn prepare_oauth(store: &Path, home: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let Some(home) = home else {
        drop(
            agent_sandbox_shared::oauth_store::init(store).with_context(|| {
                format!("cannot prepare the OAuth token store {}", store.display())
            })?,
        );
        return Ok(vec![format!(
            "warning: the home volume's directory is not visible from here, so its {}/{} was not checked for sign-in tokens to move into {}",
            crate::oauth::CREDENTIALS_DIR,
            crate::oauth::CREDENTIALS_FILE,
            store.display()
        )]);
    };
    match crate::oauth::prepare(store, home) {
        Ok(p) if p.moved_tokens => Ok(vec![crate::oauth::MOVED_TOKENS_NOTICE.to_owned()]),
        Ok(_) => Ok(Vec::new()),
        Err(e) if e.store_is_ready() => Ok(vec![format!(
            "warning: {e}: left as it is; Claude Code in the sandbox may not be signed in (run /login: the router keeps the new tokens in {})",
            store.display()
        )]),
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "cannot prepare the OAuth token store {}",
            store.display()
        ))),
    }
}

/// Rootful: gives the token store (its directory, the store and its lock file) to the router's user,
/// which writes refreshed tokens into it; the launcher, root, still reads it. Links are not followed:
/// a store the router could write must not make root re-own another file.
fn give_store_to_router(store: &Path) -> anyhow::Result<()> {
    use agent_sandbox_shared::oauth_store::{lock_path, store_path};
    for p in [store.to_owned(), store_path(store), lock_path(store)] {
        std::os::unix::fs::lchown(&p, Some(ROUTER_UID), Some(ROUTER_GID))
            .with_context(|| format!("cannot give {} to the router's user", p.display()))?;
    }
    Ok(())
}

/// The files of [`prepare`], given the image's system bundle: `inject/` with the CA (0644), its key
/// and the real key (0600; returned for [`give_to_router`]), and the sandbox's bundle (0644).
fn write_session_files(
    req: &Request<'_>,
    system_bundle: &str,
) -> anyhow::Result<(SessionInject, Vec<PathBuf>)> {
    let hosts = req.decision.terminated();
    let placeholder = match (req.decision.api_key_hosts.is_empty(), req.api_key) {
        (true, _) => None,
        (false, Some(key)) => {
            placeholder::check_key(key)?;
            Some(placeholder::placeholder(
                req.state_dir,
                req.home_volume,
                key.len(),
            )?)
        }
        (false, None) => bail!("{API_KEY_VAR} is not set"),
    };
    let config = config_for(
        req.decision,
        placeholder.as_deref().unwrap_or_default(),
        req.upstream_roots.is_some(),
    )
    .context("nothing to terminate")?;

    let authority = ca::generate(req.session, &hosts, time::OffsetDateTime::now_utc())?;
    let router_dir = req.dir.join(INJECT_DIR);
    // 0711: the router's user (another uid) opens the files by name; nobody lists the directory.
    fs::DirBuilder::new()
        .mode(0o711)
        .create(&router_dir)
        .with_context(|| format!("cannot create {}", router_dir.display()))?;
    fs::set_permissions(&router_dir, fs::Permissions::from_mode(0o711))
        .with_context(|| format!("cannot set permissions on {}", router_dir.display()))?;
    let ca_cert = router_dir.join(CA_CERT_FILE);
    write_new(&ca_cert, authority.cert_pem.as_bytes(), 0o644)?;
    let mut secret_files = vec![router_dir.join(CA_KEY_FILE)];
    write_new(&secret_files[0], authority.key_pem.as_bytes(), 0o600)?;
    if let (Some(key), false) = (req.api_key, req.decision.api_key_hosts.is_empty()) {
        let path = router_dir.join(API_KEY_FILE);
        write_new(&path, format!("{key}\n").as_bytes(), 0o600)?;
        secret_files.push(path);
    }
    if let Some(roots) = req.upstream_roots {
        let text = fs::read(roots).with_context(|| {
            format!("cannot read {TEST_UPSTREAM_ROOTS_VAR} {}", roots.display())
        })?;
        write_new(&router_dir.join(UPSTREAM_ROOTS_FILE), &text, 0o644)?;
    }

    let bundle = req.dir.join(BUNDLE_FILE);
    let mut combined = system_bundle.to_owned();
    if !combined.ends_with('\n') {
        combined.push('\n');
    }
    combined.push_str(&format!("# {}\n", ca::common_name(req.session)));
    combined.push_str(&authority.cert_pem);
    write_new(&bundle, combined.as_bytes(), 0o644)?;

    let mut env = vec![
        (
            "NODE_EXTRA_CA_CERTS".to_owned(),
            SANDBOX_SESSION_CA.to_owned(),
        ),
        ("SSL_CERT_FILE".to_owned(), SYSTEM_CA_BUNDLE.to_owned()),
        ("REQUESTS_CA_BUNDLE".to_owned(), SYSTEM_CA_BUNDLE.to_owned()),
    ];
    if let Some(p) = placeholder {
        env.push((API_KEY_VAR.to_owned(), p));
    }
    let inject = SessionInject {
        config,
        router_dir,
        ca_cert,
        bundle,
        oauth_store: req.decision.oauth_store.clone(),
        notices: Vec::new(),
        env,
    };
    Ok((inject, secret_files))
}

/// Makes the secret files (0600) readable by the router's non-root user and nobody else. Rootful, the
/// launcher is root and gives them to that user; rootless, the router runs with the invoking user
/// mapped to its uid (`RouterSpec::keep_id`), so the user's own files are already its. The directory
/// stays this user's, so the session's cleanup removes them.
fn give_to_router(files: &[PathBuf], rootless: bool) -> anyhow::Result<()> {
    if rootless {
        return Ok(());
    }
    for f in files {
        std::os::unix::fs::chown(f, Some(ROUTER_UID), Some(ROUTER_GID))
            .with_context(|| format!("cannot give {} to the router's user", f.display()))?;
    }
    Ok(())
}

/// The sandbox image's system CA bundle, read once per image id with `cat` in a container with no
/// network, then cached in `cache_dir` (named by the image id, so a rebuilt image is read again).
fn image_bundle(podman: &Podman, image: &str, cache_dir: &Path) -> anyhow::Result<String> {
    let id = podman.run(&args::image_ids(&[image]))?;
    let id = id.trim();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        bail!(
            "podman gave image {image} the unexpected id `{}`",
            id.escape_debug()
        );
    }
    let cached = cache_dir.join("ca-bundles").join(format!("{id}.crt"));
    if let Ok(text) = fs::read_to_string(&cached) {
        if is_bundle(&text) {
            return Ok(text);
        }
    }
    let out = podman
        .output(&args::read_image_file(image, Path::new(SYSTEM_CA_BUNDLE)))
        .with_context(|| format!("cannot read {SYSTEM_CA_BUNDLE} from {image}"))?;
    if !out.status.success() {
        bail!(
            "cannot read {SYSTEM_CA_BUNDLE} from {image}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if out.stdout.len() > MAX_BUNDLE {
        bail!("{SYSTEM_CA_BUNDLE} in {image} is larger than {MAX_BUNDLE} bytes");
    }
    let text = String::from_utf8(out.stdout)
        .with_context(|| format!("{SYSTEM_CA_BUNDLE} in {image} is not text"))?;
    if !is_bundle(&text) {
        bail!("{SYSTEM_CA_BUNDLE} in {image} holds no certificate");
    }
    // The cache is an optimisation: failing to write it costs the next session a container run.
    let _ = write_cache(&cached, &text);
    Ok(text)
}

fn is_bundle(text: &str) -> bool {
    text.len() <= MAX_BUNDLE && text.contains("-----BEGIN CERTIFICATE-----")
}

fn write_cache(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".tmp.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    fs::write(&tmp, text)?;
    fs::rename(&tmp, path)
}

/// Creates `path` (never through an existing name) with `mode`, holding `bytes`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set permissions on {}", path.display()))
}

/// The cache directory: `$XDG_CACHE_HOME/agent-sandbox` when absolute, else `~/.cache/agent-sandbox`.
#[must_use]
pub fn cache_dir(home: &Path, xdg_cache_home: Option<OsString>) -> PathBuf {
    match xdg_cache_home.map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("agent-sandbox"),
        _ => home.join(".cache/agent-sandbox"),
    }
}

/// The host's API key, trimmed (None when unset or empty).
#[must_use]
pub fn host_api_key() -> Option<String> {
    std::env::var(API_KEY_VAR)
        .ok()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_shared::allowlist::Entry;

    fn policy(names: &[&str]) -> Policy {
        Policy::from_entries(
            names
                .iter()
                .map(|n| Entry::Host(HostName::parse(n).unwrap())),
        )
    }

    #[test]
    fn decisions_say_what_is_terminated_and_why() {
        let allowed = policy(&["api.anthropic.com", "platform.claude.com"]);
        let d = decide(&allowed, true, None, true);
        assert_eq!(d.terminated(), ["api.anthropic.com"]);
        assert!(
            d.summary().starts_with("terminated: api.anthropic.com ("),
            "{}",
            d.summary()
        );
        assert!(d.summary().contains("placeholder"), "{}", d.summary());

        let d = decide(&allowed, false, None, true);
        assert!(d.terminated().is_empty());
        assert!(
            d.summary().starts_with("no host is terminated"),
            "{}",
            d.summary()
        );
        assert!(
            d.summary().contains("ANTHROPIC_API_KEY is not set"),
            "{}",
            d.summary()
        );

        let d = decide(&policy(&["example.com"]), true, None, true);
        assert!(d.terminated().is_empty());
        assert!(
            d.summary().contains("not on the allowlist"),
            "{}",
            d.summary()
        );

        let d = decide(&allowed, true, None, false);
        assert!(d.disabled && d.terminated().is_empty());
        assert!(d.summary().contains("--no-inject"), "{}", d.summary());
    }

    #[test]
    fn oauth_is_injected_when_both_of_its_hosts_are_allowed() {
        let store = Path::new("/home/me/.local/state/agent-sandbox/oauth");
        let both = policy(&["api.anthropic.com", "platform.claude.com"]);
        let d = decide(&both, false, Some(store), true);
        assert_eq!(d.oauth_store.as_deref(), Some(store));
        assert!(d.api_key_hosts.is_empty());
        assert_eq!(d.terminated(), ["api.anthropic.com", "platform.claude.com"]);
        assert!(
            d.summary().contains(&store.display().to_string()),
            "{}",
            d.summary()
        );
        // With the key too: api.anthropic.com is terminated once, for both credentials.
        let d = decide(&both, true, Some(store), true);
        assert_eq!(d.api_key_hosts, ["api.anthropic.com"]);
        assert_eq!(d.terminated(), ["api.anthropic.com", "platform.claude.com"]);

        // One host missing: not injected, and the line says which.
        for (list, missing) in [
            (&["api.anthropic.com"][..], "platform.claude.com is not"),
            (&["platform.claude.com"][..], "api.anthropic.com is not"),
            (
                &["example.com"][..],
                "api.anthropic.com and platform.claude.com are not",
            ),
        ] {
            let d = decide(&policy(list), false, Some(store), true);
            assert!(
                d.oauth_store.is_none() && d.terminated().is_empty(),
                "{d:?}"
            );
            assert!(d.summary().contains(missing), "{list:?}: {}", d.summary());
        }
        // Nowhere to keep the store: not injected.
        let d = decide(&both, false, None, true);
        assert!(d.oauth_store.is_none() && d.terminated().is_empty());
        assert!(d.summary().contains("no place"), "{}", d.summary());
        // --no-inject: nothing.
        let d = decide(&both, true, Some(store), false);
        assert!(d.disabled && d.oauth_store.is_none() && d.terminated().is_empty());
        assert!(
            d.summary().contains("sign-in tokens stay"),
            "{}",
            d.summary()
        );

        // The router's section: the token endpoint, and the store as the router sees it.
        let d = decide(&both, false, Some(store), true);
        let config = config_for(&d, "", false).unwrap();
        assert!(config.api_key.is_none());
        assert_eq!(
            config.oauth,
            Some(OAuthInject {
                api_hosts: vec!["api.anthropic.com".into()],
                token_host: "platform.claude.com".into(),
                token_path: "/v1/oauth/token".into(),
                store_dir: "/etc/agent-sandbox-oauth".into(),
            })
        );
        let mut problems = Vec::new();
        let valid = config.validate(&mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(valid.terminated.len(), 2);
        let text = describe(&d, None, false);
        assert!(text.contains("[inject.oauth]"), "{text}");
        assert!(
            text.contains("token_host = \"platform.claude.com\""),
            "{text}"
        );
        assert!(
            text.contains("store_dir = \"/etc/agent-sandbox-oauth\"  # /home/me/.local/state/agent-sandbox/oauth on the host"),
            "{text}"
        );
        assert!(!text.contains("[inject.api_key]"), "{text}");
    }

    #[test]
    fn the_store_is_prepared_and_given_to_the_router_rootful() {
        use std::os::unix::fs::MetadataExt as _;
        let tmp = std::env::temp_dir().join(format!("as-inject-oauth-{}", std::process::id()));
        let store = tmp.join("state/agent-sandbox/oauth");
        let home = tmp.join("volume/_data");
        fs::create_dir_all(home.join(".claude")).unwrap();
        let creds = home.join(".claude/.credentials.json");
        fs::write(
            &creds,
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-REAL","refreshToken":"sk-ant-ort01-REAL","expiresAt":1,"scopes":[]}}"#,
        )
        .unwrap();
        let notices = prepare_oauth(&store, Some(&home)).unwrap();
        assert_eq!(notices, [crate::oauth::MOVED_TOKENS_NOTICE]);
        assert!(!fs::read_to_string(&creds).unwrap().contains("REAL"));
        // The next session has nothing to say.
        assert!(prepare_oauth(&store, Some(&home)).unwrap().is_empty());
        // A credentials file in the way is reported, and the session goes on.
        fs::write(&creds, "not json").unwrap();
        let notices = prepare_oauth(&store, Some(&home)).unwrap();
        assert!(
            notices.len() == 1
                && notices[0].starts_with("warning: ")
                && notices[0].contains(".credentials.json"),
            "{notices:?}"
        );
        // A home volume not visible from here: the store is still made, and the user told.
        let other = tmp.join("other-state/oauth");
        let notices = prepare_oauth(&other, None).unwrap();
        assert!(notices[0].contains("not visible"), "{notices:?}");
        assert!(agent_sandbox_shared::oauth_store::store_path(&other).is_file());
        // A store that cannot be made stops the session.
        fs::write(tmp.join("file"), "").unwrap();
        assert!(prepare_oauth(&tmp.join("file/oauth"), Some(&home)).is_err());

        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // A link in the store (the router can write there) is re-owned itself, never its target.
            let target = tmp.join("target");
            fs::write(&target, "").unwrap();
            let lock = agent_sandbox_shared::oauth_store::lock_path(&store);
            fs::remove_file(&lock).unwrap();
            std::os::unix::fs::symlink(&target, &lock).unwrap();
            give_store_to_router(&store).unwrap();
            for p in [
                store.clone(),
                agent_sandbox_shared::oauth_store::store_path(&store),
            ] {
                let m = fs::metadata(&p).unwrap();
                assert_eq!(
                    (m.uid(), m.gid()),
                    (ROUTER_UID, ROUTER_GID),
                    "{}",
                    p.display()
                );
            }
            assert_eq!(fs::symlink_metadata(&lock).unwrap().uid(), ROUTER_UID);
            assert_eq!(fs::metadata(&target).unwrap().uid(), 0);
            // The launcher (root) still reads the store.
            agent_sandbox_shared::oauth_store::OAuthStore::read(&store).unwrap();
        } else {
            eprintln!("not root: re-owning to the router's user is checked by the rootful e2e run");
        }
        fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn the_section_validates() {
        let allowed = policy(&["api.anthropic.com"]);
        let d = decide(&allowed, true, None, true);
        let placeholder = format!("{}{}", placeholder::PREFIX, "a".repeat(90));
        let config = config_for(&d, &placeholder, true).unwrap();
        assert_eq!(config.ca_key, Path::new("/etc/agent-sandbox-inject/ca.key"));
        assert_eq!(
            config.upstream_roots.as_deref(),
            Some(Path::new("/etc/agent-sandbox-inject/upstream-roots.pem"))
        );
        let mut problems = Vec::new();
        let valid = config.validate(&mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(valid.terminated.len(), 1);
        assert!(config_for(&decide(&allowed, false, None, true), &placeholder, false).is_none());

        let text = describe(&d, Some(&placeholder), false);
        assert!(text.contains("[inject.api_key]"), "{text}");
        assert!(
            text.contains("ca_key = \"/etc/agent-sandbox-inject/ca.key\""),
            "{text}"
        );
        assert!(text.contains(&placeholder), "{text}");
        assert!(!text.contains("upstream_roots"), "{text}");
        let none = describe(&decide(&allowed, false, None, true), None, false);
        assert!(none.contains("nothing is terminated"), "{none}");
    }

    #[test]
    fn session_files_have_their_modes_and_no_secret_reaches_the_sandbox() {
        use std::os::unix::fs::MetadataExt as _;
        let tmp = std::env::temp_dir().join(format!("as-inject-files-{}", std::process::id()));
        let dir = tmp.join("session");
        fs::create_dir_all(&dir).unwrap();
        let key = format!("{}{}AA", placeholder::PREFIX, "k".repeat(93));
        let allowed = policy(&["api.anthropic.com"]);
        let decision = decide(&allowed, true, None, true);
        let roots = tmp.join("roots.pem");
        fs::write(&roots, "-----BEGIN CERTIFICATE-----\ntest\n").unwrap();
        let req = Request {
            session: "0123456789ab",
            dir: &dir,
            decision: &decision,
            api_key: Some(&key),
            home_volume: "agent-sandbox-home",
            state_dir: &tmp.join("state"),
            cache_dir: &tmp.join("cache"),
            image: "localhost/agent-sandbox:dev",
            rootless: true,
            upstream_roots: Some(&roots),
            home_mountpoint: None,
        };
        let system = "-----BEGIN CERTIFICATE-----\nsystem root\n-----END CERTIFICATE-----";
        assert!(!format!("{req:?}").contains(&key));
        let (inject, secrets) = write_session_files(&req, system).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(inject.router_dir, dir.join("inject"));
        assert_eq!(mode(&inject.router_dir), 0o711);
        assert_eq!(mode(&dir.join("inject/ca.pem")), 0o644);
        assert_eq!(mode(&dir.join("inject/ca.key")), 0o600);
        assert_eq!(mode(&dir.join("inject/api-key")), 0o600);
        assert_eq!(mode(&dir.join("inject/upstream-roots.pem")), 0o644);
        assert_eq!(mode(&dir.join("ca-bundle.crt")), 0o644);
        assert_eq!(
            secrets,
            [dir.join("inject/ca.key"), dir.join("inject/api-key")]
        );
        assert_eq!(
            fs::read_to_string(dir.join("inject/api-key")).unwrap(),
            format!("{key}\n")
        );
        // The sandbox's bundle: the image's roots, then the session CA; the CA file is the same CA.
        let bundle = fs::read_to_string(&inject.bundle).unwrap();
        let ca_pem = fs::read_to_string(&inject.ca_cert).unwrap();
        assert!(bundle.starts_with(system));
        assert!(bundle.ends_with(&ca_pem));
        assert!(!bundle.contains("PRIVATE KEY"));
        // The router's section points inside its mount and validates.
        let mut problems = Vec::new();
        inject.config.validate(&mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");

        // What the sandbox is given: no real key and no CA key in any argument or variable.
        let spec = crate::podman::SandboxSpec {
            name: "s".into(),
            labels: crate::podman::SessionLabels {
                session: "0123456789ab".into(),
                pid: 1,
                start: 1,
                boot: "b".into(),
                project: "/p".into(),
                log_dir: None,
                session_dir: None,
            },
            pod: "p".into(),
            image: "i".into(),
            user: crate::podman::UserMapping::KeepId,
            passwd_entry: None,
            project: "/p".into(),
            covered: Vec::new(),
            home_volume: "v".into(),
            home: "/home/me".into(),
            chown_home: false,
            hosts_file: "/s/hosts".into(),
            resolv_file: "/s/resolv.conf".into(),
            tty: false,
            ca: Some(crate::podman::SandboxCa {
                cert: inject.ca_cert.clone(),
                bundle: inject.bundle.clone(),
            }),
            env: inject.env.clone(),
            pass_env: vec!["TERM".into()],
            command: vec!["claude".into()],
        };
        let argv: Vec<String> = args::sandbox_create(&spec)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let key_body = &key[placeholder::PREFIX.len()..];
        assert!(!argv.iter().any(|a| a.contains(key_body)), "{argv:?}");
        assert!(!argv
            .iter()
            .any(|a| a.contains("ca.key") || a.contains("api-key") || a.ends_with("/inject")));
        let placeholder = inject
            .env
            .iter()
            .find(|(k, _)| k == API_KEY_VAR)
            .map(|(_, v)| v.clone())
            .unwrap();
        assert!(argv.contains(&format!("ANTHROPIC_API_KEY={placeholder}")));
        assert_eq!(placeholder.len(), key.len());
        let router = crate::podman::RouterSpec {
            name: "r".into(),
            labels: spec.labels.clone(),
            image: "r".into(),
            session_network: "n".into(),
            session_ip: std::net::Ipv4Addr::new(10, 0, 0, 2),
            egress_network: "e".into(),
            config_dir: dir.join("router"),
            inject_dir: Some(inject.router_dir.clone()),
            oauth_store: None,
            keep_id: true,
            log_path: None,
        };
        let argv: Vec<String> = args::router_run(&router)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert!(!argv.iter().any(|a| a.contains(key_body)), "{argv:?}");
        assert!(argv.contains(&format!(
            "{}:/etc/agent-sandbox-inject:ro",
            inject.router_dir.display()
        )));
        // A second session directory is written afresh, never through existing files.
        assert!(write_session_files(&req, system).is_err());
        fs::remove_dir_all(&tmp).unwrap();
    }
}
