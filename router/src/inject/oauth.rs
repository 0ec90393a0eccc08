//! OAuth token injection (issue 20, step 2): the sandbox signs in and refreshes with placeholders; the
//! router alone holds the real tokens, on the wire only.
//!
//! # Who holds what
//! - **The host-side store** (`$XDG_STATE_HOME/agent-sandbox/oauth/oauth.json`, 0600, see
//!   [`agent_sandbox_shared::oauth_store`]) holds the real access and refresh tokens and the two
//!   placeholders. The launcher creates it, moves tokens it finds on the home volume into it once, and
//!   mounts its directory into the router only (read-write: the router records refreshed tokens).
//! - **The sandbox** holds only the placeholders, in `~/.claude/.credentials.json` on the home volume.
//!   They have the real tokens' prefixes (`sk-ant-oat01-`, `sk-ant-ort01-`), so Claude Code treats them
//!   as tokens, and they are random, so they cannot be guessed or confused with anything else.
//! - **The router** terminates TLS for the API hosts and the token host (inject-router's part), and this
//!   module decides what it rewrites:
//!   - on an API host, `Authorization: Bearer <access placeholder>` becomes the real access token
//!     ([`OAuth::access_token_for`]); any other value passes unchanged;
//!   - on the token endpoint, a request's `refresh_token` equal to the refresh placeholder becomes the
//!     real refresh token ([`OAuth::begin_token_request`]); any other refresh token and every
//!     authorization-code exchange (`/login`) pass unchanged;
//!   - the token endpoint's response: real `access_token` / `refresh_token` are recorded in the store and
//!     replaced with the placeholders ([`TokenExchange::finish`]). So `/login` and refreshes inside the
//!     sandbox keep working, and what Claude Code writes to its credentials file is placeholders.
//!
//! This is Docker Sandboxes' model (placeholders in the sandbox, the real secret added by the proxy on
//! its way out), with the refresh token kept out as well and both directions of the token endpoint
//! masked.
//!
//! # Serialisation
//! A refresh spends the refresh token: two sessions (or two requests of one) refreshing with the same
//! token at once would leave one of them signed out. Each token exchange holds an in-process async mutex
//! and the store's `flock` (taken in `spawn_blocking`, with a deadline) from [`OAuth::begin_token_request`]
//! until [`TokenExchange::finish`] or drop, and reads the store afresh under the lock: the second refresh
//! then sends the token the first one stored.
//!
//! # What a hostile sandbox can and cannot do
//! - It **can** use the tokens through the router while the session runs: any request it sends to an
//!   API host with the access placeholder carries the real token, and it can make the router refresh.
//!   That is the same power Claude Code itself has in the session; it ends when the session ends.
//! - It **cannot** read the tokens: they are never in its files, its environment or any response it
//!   receives (the router replaces them in token responses and refuses, as a 502, a response that carries
//!   a known token anywhere else), so it cannot carry them out through an allowlisted host and use them
//!   after the session or from elsewhere.
//! - It cannot send the real tokens to a host of its choosing: only the configured API hosts and the
//!   token host get them, each on a connection to that exact name, verified against the web PKI.
//! - It can write fake "tokens" into the credentials file; the launcher would move them into the store
//!   at the next start (and tell the user to sign in again), which costs the user a sign-in, not a secret.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_sandbox_shared::inject::OAuthInject;
use agent_sandbox_shared::oauth_store::{self, OAuthStore, Stamp, StoreError, StoreLock};
use serde_json::Value;
use tokio::sync::OwnedMutexGuard;

/// The largest token request or response body rewritten (issue 20: 64 KiB); larger is refused.
pub(crate) const MAX_BODY: usize = 64 * 1024;
/// How many replaced tokens are still scanned for after a refresh: an old access token stays valid
/// upstream for a while, so it must not reach the sandbox either.
const RETIRED_KEPT: usize = 8;
/// How long a token exchange waits for another one (in this router or another session's) to finish.
const LOCK_WAIT: Duration = oauth_store::LOCK_TIMEOUT;

/// A secret value: `Debug` and `Display` print `<redacted>`, so it cannot end up in a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Arc<[u8]>);

impl Secret {
    /// The secret's bytes, to put on the wire or to scan for.
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(Arc::from(s.as_bytes()))
    }
}

impl From<Vec<u8>> for Secret {
    fn from(bytes: Vec<u8>) -> Secret {
        Secret(Arc::from(bytes))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What went wrong with the OAuth store or a token exchange. The terminated request loop answers 502
/// for every variant raised during an exchange; none carries a token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OAuthError {
    /// The store could not be read, locked or written (the error names the file).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A token request or response body larger than [`MAX_BODY`].
    #[error("token endpoint {what} body of {len} bytes is larger than {MAX_BODY}")]
    TooLarge {
        /// `request` or `response`.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// A successful token response that is not a JSON object: it cannot be masked, so it is not passed on.
    #[error("token endpoint response (status {status}) is not a JSON object")]
    NotJson {
        /// The upstream's status.
        status: u16,
    },
    /// A token response that would hand the sandbox a real token (in a field not masked, or an error
    /// response quoting one).
    #[error(
        "token endpoint response (status {status}) carries a real token outside the masked fields"
    )]
    SecretInResponse {
        /// The upstream's status.
        status: u16,
    },
    /// The blocking task that takes the store lock failed.
    #[error("the store lock task failed: {0}")]
    LockTask(#[from] tokio::task::JoinError),
}

/// The store as last read, and the tokens it replaced.
#[derive(Debug)]
struct Cached {
    /// The store's contents.
    store: OAuthStore,
    /// Which version of the file `store` came from, to notice another session's write.
    stamp: Stamp,
    /// Tokens replaced by refreshes since the router started, newest last, kept for scanning.
    retired: Vec<Secret>,
}

impl Cached {
    /// Takes a newer version of the store, keeping the tokens it replaces for scanning.
    fn replace(&mut self, store: OAuthStore, stamp: Stamp) {
        for (old, new) in [
            (&self.store.access_token, &store.access_token),
            (&self.store.refresh_token, &store.refresh_token),
        ] {
            if let Some(old) = old {
                if new.as_ref() != Some(old) {
                    let old = Secret::from(old.as_str());
                    if !self.retired.contains(&old) {
                        self.retired.push(old);
                    }
                }
            }
        }
        let excess = self.retired.len().saturating_sub(RETIRED_KEPT);
        self.retired.drain(..excess);
        self.store = store;
        self.stamp = stamp;
    }
}

/// The router's view of the OAuth store: loaded at start from [`OAuthInject::store_dir`].
#[derive(Debug)]
pub(crate) struct OAuth {
    /// The store directory (`oauth.json`, `oauth.lock`).
    dir: PathBuf,
    /// The token endpoint's path (`/v1/oauth/token`).
    token_path: String,
    /// Serialises token exchanges within this router before the flock serialises them across routers:
    /// waiting tasks queue here instead of each occupying a blocking thread on the flock.
    exchange: Arc<tokio::sync::Mutex<()>>,
    /// The last store read; a std mutex, held only for a compare or a swap, never across an await.
    cached: Arc<Mutex<Cached>>,
}

impl OAuth {
    /// Opens the store (creates nothing: the launcher made it); errors name the file.
    pub(crate) fn open(config: &OAuthInject) -> Result<OAuth, OAuthError> {
        let dir = config.store_dir.clone();
        let (store, stamp) = OAuthStore::read(&dir)?;
        // The lock file must be there too: finding out at the first refresh would be too late.
        let lock = oauth_store::lock_path(&dir);
        std::fs::metadata(&lock).map_err(|source| StoreError::Lock { path: lock, source })?;
        Ok(OAuth {
            dir,
            token_path: config.token_path.clone(),
            exchange: Arc::new(tokio::sync::Mutex::new(())),
            cached: Arc::new(Mutex::new(Cached {
                store,
                stamp,
                retired: Vec::new(),
            })),
        })
    }

    /// Re-reads the store when the file changed since the last read (another session refreshed). The
    /// file is small and local: a stat per call and a short read on change do not hold up the runtime.
    /// A store that cannot be read keeps the last good version (and says so, without values).
    fn current(&self) -> std::sync::MutexGuard<'_, Cached> {
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        match oauth_store::stamp(&self.dir) {
            Ok(now) if now == cached.stamp => {}
            Ok(_) => match OAuthStore::read(&self.dir) {
                Ok((store, stamp)) => cached.replace(store, stamp),
                Err(e) => tracing::warn!(error = %e, "keeping the OAuth store as last read"),
            },
            Err(e) => tracing::warn!(error = %e, "keeping the OAuth store as last read"),
        }
        cached
    }

    /// The real access token when `bearer` is exactly the access-token placeholder (re-reads the store
    /// when it changed on disk: another session may have refreshed). None: leave the header alone.
    /// A stored token that is not visible ASCII is never used: it goes into a header line as it is,
    /// and the store's tokens may come from the home volume, which the sandbox writes (a CR LF in one
    /// would end the header section early and start a request of the sandbox's making on the
    /// upstream connection, ahead of the next request's real credential).
    pub(crate) fn access_token_for(&self, bearer: &[u8]) -> Option<Secret> {
        let cached = self.current();
        if bearer != cached.store.access_placeholder.as_bytes() {
            return None;
        }
        let token = cached.store.access_token.as_deref()?;
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            tracing::warn!("the stored access token is not a header value; not used");
            return None;
        }
        Some(Secret::from(token))
    }

    /// Whether this request goes to the token endpoint (host already checked == token_host):
    /// [`super::oauth_hook::token_request_to`] the configured path.
    pub(crate) fn is_token_request(&self, method: &str, path: &str) -> bool {
        super::oauth_hook::token_request_to(method, path, &self.token_path)
    }

    /// Rewrites a token request body (JSON or form; refresh_token placeholder -> real). Holds the
    /// store lock (in-process mutex + flock on oauth.lock) in the returned guard until finish(): two
    /// concurrent refreshes are serialised. Body capped at 64 KiB.
    pub(crate) async fn begin_token_request(
        &self,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<(Vec<u8>, TokenExchange), OAuthError> {
        if body.len() > MAX_BODY {
            return Err(OAuthError::TooLarge {
                what: "request",
                len: body.len(),
            });
        }
        // The same deadline as the flock's: a turn queued behind other exchanges does not wait for
        // longer than a session would.
        let turn = tokio::time::timeout(LOCK_WAIT, Arc::clone(&self.exchange).lock_owned())
            .await
            .map_err(|_| StoreError::LockTimeout {
                path: self.dir.join(oauth_store::LOCK_FILE),
            })?;
        let dir = self.dir.clone();
        // Dropping this future while the blocking task waits is safe: the task's lock, if it gets
        // one, is dropped with its unread result.
        let flock = tokio::task::spawn_blocking(move || StoreLock::acquire_within(&dir, LOCK_WAIT))
            .await??;
        // Under the lock, the file is the truth: another session may have refreshed a moment ago.
        let (store, stamp) = OAuthStore::read(&self.dir)?;
        self.cached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(store.clone(), stamp);
        let rewritten = match (&store.refresh_token, body_kind(content_type, body)) {
            (Some(real), BodyKind::Json) => {
                rewrite_json_request(body, &store.refresh_placeholder, real)
            }
            (Some(real), BodyKind::Form) => {
                rewrite_form_request(body, &store.refresh_placeholder, real)
            }
            _ => None,
        };
        let exchange = TokenExchange {
            dir: self.dir.clone(),
            store,
            cached: Arc::clone(&self.cached),
            _flock: flock,
            _turn: turn,
        };
        Ok((rewritten.unwrap_or_else(|| body.to_vec()), exchange))
    }

    /// Every real secret currently known (access + refresh tokens), for response scanning.
    pub(crate) fn secrets(&self) -> Vec<Secret> {
        let cached = self.current();
        let store = &cached.store;
        store
            .access_token
            .iter()
            .chain(store.refresh_token.iter())
            .map(|t| Secret::from(t.as_str()))
            .chain(cached.retired.iter().cloned())
            .collect()
    }
}

/// One token exchange in progress: holds the store lock until [`TokenExchange::finish`] or drop.
#[derive(Debug)]
pub(crate) struct TokenExchange {
    /// The store directory.
    dir: PathBuf,
    /// The store as read under the lock when the exchange began.
    store: OAuthStore,
    /// The router's cached store, updated with what this exchange writes.
    cached: Arc<Mutex<Cached>>,
    /// The flock on `oauth.lock` (other routers, the launcher).
    _flock: StoreLock,
    /// This router's turn (other tasks of this router).
    _turn: OwnedMutexGuard<()>,
}

impl TokenExchange {
    /// Rewrites the token endpoint's response body (JSON, capped at 64 KiB): real access/refresh
    /// tokens are stored (atomically, by rename inside store_dir) and replaced with the placeholders.
    /// A non-2xx response is passed through unchanged (after checking it carries no known secret).
    pub(crate) fn finish(self, status: u16, body: &[u8]) -> Result<Vec<u8>, OAuthError> {
        if body.len() > MAX_BODY {
            return Err(OAuthError::TooLarge {
                what: "response",
                len: body.len(),
            });
        }
        let mut known: Vec<Secret> = self
            .store
            .access_token
            .iter()
            .chain(self.store.refresh_token.iter())
            .map(|t| Secret::from(t.as_str()))
            .collect();
        known.extend(
            self.cached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retired
                .iter()
                .cloned(),
        );
        if !(200..300).contains(&status) {
            // An error response is not recorded, so it must not carry a token of any kind: neither a
            // known one nor a new one in a token field.
            if carries_any(body, &known) || issues_tokens(body, &self.store) {
                return Err(OAuthError::SecretInResponse { status });
            }
            return Ok(body.to_vec());
        }
        let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
            return Err(OAuthError::NotJson { status });
        };
        let mut store = self.store.clone();
        let mut issued = Vec::new();
        for (field, placeholder) in [
            ("access_token", &store.access_placeholder),
            ("refresh_token", &store.refresh_placeholder),
        ] {
            if let Some(Value::String(token)) = fields.get(field) {
                // An upstream echoing the placeholder (or an empty value) issued nothing to record.
                if token.is_empty()
                    || token == &store.access_placeholder
                    || token == &store.refresh_placeholder
                {
                    continue;
                }
                issued.push((field, token.clone()));
                fields.insert(field.to_owned(), Value::String(placeholder.clone()));
            }
        }
        if issued.is_empty() {
            // Nothing to mask: passed unchanged, as long as no token hides in it.
            if carries_any(body, &known) {
                return Err(OAuthError::SecretInResponse { status });
            }
            return Ok(body.to_vec());
        }
        for (field, token) in &issued {
            known.push(Secret::from(token.as_str()));
            match *field {
                "access_token" => store.access_token = Some(token.clone()),
                _ => store.refresh_token = Some(token.clone()),
            }
        }
        if issued.iter().any(|(f, _)| *f == "access_token") {
            store.expires_at = expires_at(fields.get("expires_in"));
        }
        if let Some(Value::String(scope)) = fields.get("scope") {
            store.scopes = scope.split_whitespace().map(str::to_owned).collect();
        }
        let out = serde_json::to_vec(&Value::Object(fields))
            .map_err(|_| OAuthError::NotJson { status })?;
        if carries_any(&out, &known) {
            return Err(OAuthError::SecretInResponse { status });
        }
        store.write(&self.dir)?;
        // The stamp of what was just written, so the next lookup does not read it back.
        match oauth_store::stamp(&self.dir) {
            Ok(stamp) => self
                .cached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(store, stamp),
            Err(e) => tracing::warn!(error = %e, "cannot stat the OAuth store just written"),
        }
        Ok(out)
    }
}

/// Whether `body` is a JSON object with a token field that is not a placeholder.
fn issues_tokens(body: &[u8], store: &OAuthStore) -> bool {
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    ["access_token", "refresh_token"].iter().any(|f| {
        matches!(fields.get(*f), Some(Value::String(t))
            if !t.is_empty() && *t != store.access_placeholder && *t != store.refresh_placeholder)
    })
}

/// When an access token issued now with `expires_in` seconds expires, in ms since the epoch.
fn expires_at(expires_in: Option<&Value>) -> Option<u64> {
    let secs = expires_in?.as_u64()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(now.as_millis())
        .ok()?
        .checked_add(secs.checked_mul(1000)?)
}

/// Whether `haystack` contains any of `secrets` anywhere.
fn carries_any(haystack: &[u8], secrets: &[Secret]) -> bool {
    secrets.iter().any(|s| {
        let needle = s.expose();
        !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
    })
}

/// How a token request body is encoded.
#[derive(Debug, PartialEq, Eq)]
enum BodyKind {
    /// `application/json`.
    Json,
    /// `application/x-www-form-urlencoded`.
    Form,
    /// Anything else: passed unchanged (no placeholder is replaced in a body not understood).
    Other,
}

/// The body's encoding from its Content-Type; without one, an object-looking body is JSON and anything
/// else a form (OAuth's default encoding).
fn body_kind(content_type: Option<&str>, body: &[u8]) -> BodyKind {
    let Some(ct) = content_type else {
        return match body.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => BodyKind::Json,
            _ => BodyKind::Form,
        };
    };
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        BodyKind::Json
    } else if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        BodyKind::Form
    } else {
        BodyKind::Other
    }
}

/// A JSON object whose top-level `refresh_token` is exactly the placeholder, with it replaced by the
/// real token and every other field kept; `None` to send the body unchanged.
fn rewrite_json_request(body: &[u8], placeholder: &str, real: &str) -> Option<Vec<u8>> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    match fields.get("refresh_token") {
        Some(Value::String(t)) if t == placeholder => {}
        _ => return None,
    }
    fields.insert("refresh_token".into(), Value::String(real.to_owned()));
    serde_json::to_vec(&Value::Object(fields)).ok()
}

/// A form whose `refresh_token` pair is exactly the placeholder, with its value replaced and every
/// other pair kept byte for byte; `None` to send the body unchanged.
fn rewrite_form_request(body: &[u8], placeholder: &str, real: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + real.len());
    let mut replaced = false;
    for (i, pair) in body.split(|&b| b == b'&').enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        let (key, value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], Some(&pair[eq + 1..])),
            None => (pair, None),
        };
        let is_refresh = form_decode(key).as_deref() == Some(b"refresh_token".as_slice());
        match value {
            Some(v) if is_refresh && form_decode(v).as_deref() == Some(placeholder.as_bytes()) => {
                out.extend_from_slice(key);
                out.push(b'=');
                form_encode(real.as_bytes(), &mut out);
                replaced = true;
            }
            _ => out.extend_from_slice(pair),
        }
    }
    replaced.then_some(out)
}

/// application/x-www-form-urlencoded decoding of one key or value; `None` for a bad escape.
fn form_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = raw.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

/// application/x-www-form-urlencoded encoding: unreserved bytes as they are, the rest percent-encoded.
fn form_encode(value: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'*') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;
    use std::path::Path;

    use super::*;

    const REAL_ACCESS: &str = "sk-ant-oat01-REAL-access-0001";
    const REAL_REFRESH: &str = "sk-ant-ort01-REAL-refresh-0001";

    /// A store directory under the system temp dir, removed on drop.
    struct TempStore(PathBuf);
    impl TempStore {
        /// A store with real tokens, as the launcher leaves it.
        fn new(tag: &str) -> TempStore {
            let p = std::env::temp_dir().join(format!(
                "oauth-router-{tag}-{}-{}",
                std::process::id(),
                oauth_store::placeholder("x").unwrap()
            ));
            let (_lock, mut store) = oauth_store::init(&p).unwrap();
            store.access_token = Some(REAL_ACCESS.into());
            store.refresh_token = Some(REAL_REFRESH.into());
            store.write(&p).unwrap();
            TempStore(p)
        }
        fn config(&self) -> OAuthInject {
            OAuthInject {
                api_hosts: vec!["api.anthropic.com".into()],
                token_host: "platform.claude.com".into(),
                token_path: "/v1/oauth/token".into(),
                store_dir: self.0.clone(),
            }
        }
        fn store(&self) -> OAuthStore {
            OAuthStore::read(&self.0).unwrap().0
        }
    }
    impl Drop for TempStore {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn json(v: &serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }

    fn parse(b: &[u8]) -> serde_json::Value {
        serde_json::from_slice(b).unwrap()
    }

    #[tokio::test]
    async fn json_refresh_is_masked_both_ways() {
        let tmp = TempStore::new("json");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let s = tmp.store();
        let request = json(&serde_json::json!({
            "grant_type": "refresh_token",
            "refresh_token": s.refresh_placeholder,
            "client_id": "9d1c250a",
            "scope": "user:inference",
        }));
        let (sent, exchange) = oauth
            .begin_token_request(Some("application/json"), &request)
            .await
            .unwrap();
        assert_eq!(
            parse(&sent),
            serde_json::json!({
                "grant_type": "refresh_token",
                "refresh_token": REAL_REFRESH,
                "client_id": "9d1c250a",
                "scope": "user:inference",
            })
        );
        let response = json(&serde_json::json!({
            "token_type": "Bearer",
            "access_token": "sk-ant-oat01-NEW-access-0002",
            "refresh_token": "sk-ant-ort01-NEW-refresh-0002",
            "expires_in": 28800,
            "scope": "user:inference user:profile",
            "account": {"uuid": "a-1"},
        }));
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let out = exchange.finish(200, &response).unwrap();
        assert_eq!(
            parse(&out),
            serde_json::json!({
                "token_type": "Bearer",
                "access_token": s.access_placeholder,
                "refresh_token": s.refresh_placeholder,
                "expires_in": 28800,
                "scope": "user:inference user:profile",
                "account": {"uuid": "a-1"},
            })
        );
        let after = tmp.store();
        assert_eq!(
            after.access_token.as_deref(),
            Some("sk-ant-oat01-NEW-access-0002")
        );
        assert_eq!(
            after.refresh_token.as_deref(),
            Some("sk-ant-ort01-NEW-refresh-0002")
        );
        assert_eq!(after.scopes, ["user:inference", "user:profile"]);
        let expires = after.expires_at.unwrap();
        assert!(expires >= before + 28_800_000 && expires < before + 28_900_000);
        assert_eq!(after.access_placeholder, s.access_placeholder);
        let token = oauth
            .access_token_for(s.access_placeholder.as_bytes())
            .unwrap();
        assert_eq!(token.expose(), b"sk-ant-oat01-NEW-access-0002");
        // The replaced tokens are still scanned for.
        let secrets: Vec<Vec<u8>> = oauth
            .secrets()
            .iter()
            .map(|s| s.expose().to_vec())
            .collect();
        for t in [REAL_ACCESS, REAL_REFRESH, "sk-ant-oat01-NEW-access-0002"] {
            assert!(secrets.contains(&t.as_bytes().to_vec()), "{t} missing");
        }
    }

    #[tokio::test]
    async fn form_refresh_is_masked_and_other_pairs_kept_byte_for_byte() {
        let tmp = TempStore::new("form");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let s = tmp.store();
        let request = format!(
            "grant_type=refresh_token&refresh_token={}&client_id=abc%2Fdef&scope=user%3Ainference+x",
            s.refresh_placeholder
        );
        let (sent, exchange) = oauth
            .begin_token_request(
                Some("application/x-www-form-urlencoded; charset=utf-8"),
                request.as_bytes(),
            )
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(sent).unwrap(),
            format!(
                "grant_type=refresh_token&refresh_token={REAL_REFRESH}&client_id=abc%2Fdef&scope=user%3Ainference+x"
            )
        );
        drop(exchange);
        // A token with characters outside the unreserved set is percent-encoded.
        let mut out = Vec::new();
        form_encode(b"a b/c+d", &mut out);
        assert_eq!(out, b"a%20b%2Fc%2Bd");
        assert_eq!(form_decode(b"a+b%2Fc").unwrap(), b"a b/c");
        assert!(form_decode(b"bad%2").is_none());
    }

    #[tokio::test]
    async fn unknown_tokens_code_exchanges_and_other_bodies_pass_unchanged() {
        let tmp = TempStore::new("unknown");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let s = tmp.store();
        let bodies: Vec<(Option<&str>, Vec<u8>)> = vec![
            (
                Some("application/json"),
                br#"{"grant_type":"refresh_token","refresh_token":"sk-ant-ort01-someone-else"}"#
                    .to_vec(),
            ),
            (
                Some("application/json"),
                br#"{"grant_type":"authorization_code","code":"c","redirect_uri":"r","code_verifier":"v","state":"s"}"#
                    .to_vec(),
            ),
            (
                None,
                b"grant_type=refresh_token&refresh_token=sk-ant-ort01-someone-else".to_vec(),
            ),
            // The placeholder elsewhere than the refresh_token field, or in a body not understood.
            (
                Some("application/json"),
                format!(r#"{{"note":"{}"}}"#, s.refresh_placeholder).into_bytes(),
            ),
            (
                Some("text/plain"),
                format!("refresh_token={}", s.refresh_placeholder).into_bytes(),
            ),
            (Some("application/json"), b"{not json".to_vec()),
        ];
        for (ct, body) in bodies {
            let (sent, exchange) = oauth.begin_token_request(ct, &body).await.unwrap();
            assert_eq!(sent, body, "{}", String::from_utf8_lossy(&body));
            drop(exchange);
        }
        // An authorization code exchange's response is recorded and masked like a refresh's.
        let (_, exchange) = oauth
            .begin_token_request(
                Some("application/json"),
                br#"{"grant_type":"authorization_code"}"#,
            )
            .await
            .unwrap();
        let out = exchange
            .finish(
                200,
                br#"{"access_token":"sk-ant-oat01-LOGIN","refresh_token":"sk-ant-ort01-LOGIN","expires_in":60}"#,
            )
            .unwrap();
        assert!(!String::from_utf8_lossy(&out).contains("LOGIN"));
        assert_eq!(
            tmp.store().refresh_token.as_deref(),
            Some("sk-ant-ort01-LOGIN")
        );
        assert!(oauth.access_token_for(b"sk-ant-oat01-LOGIN").is_none());
        assert!(oauth.access_token_for(b"").is_none());
    }

    #[tokio::test]
    async fn responses_that_would_leak_or_cannot_be_masked_are_errors() {
        let tmp = TempStore::new("errors");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let begin = || oauth.begin_token_request(Some("application/json"), b"{}");
        // Error responses pass unchanged unless they quote a known token.
        let (_, x) = begin().await.unwrap();
        let err = br#"{"error":"invalid_grant"}"#;
        assert_eq!(x.finish(400, err).unwrap(), err);
        let (_, x) = begin().await.unwrap();
        let quoted = format!(r#"{{"error":"bad token {REAL_REFRESH}"}}"#);
        assert!(matches!(
            x.finish(400, quoted.as_bytes()),
            Err(OAuthError::SecretInResponse { status: 400 })
        ));
        // An error response handing out a token is not passed on either: it would not be recorded.
        let (_, x) = begin().await.unwrap();
        assert!(matches!(
            x.finish(
                401,
                br#"{"error":"odd","access_token":"sk-ant-oat01-UNRECORDED"}"#
            ),
            Err(OAuthError::SecretInResponse { status: 401 })
        ));
        // A 2xx that is not JSON, or too large.
        let (_, x) = begin().await.unwrap();
        assert!(matches!(
            x.finish(200, b"<html>"),
            Err(OAuthError::NotJson { .. })
        ));
        let (_, x) = begin().await.unwrap();
        assert!(matches!(
            x.finish(200, &vec![b' '; MAX_BODY + 1]),
            Err(OAuthError::TooLarge { .. })
        ));
        // A new token echoed in another field is refused, and nothing is stored.
        let (_, x) = begin().await.unwrap();
        let echo = br#"{"access_token":"sk-ant-oat01-ECHO","debug":"sk-ant-oat01-ECHO"}"#;
        assert!(matches!(
            x.finish(200, echo),
            Err(OAuthError::SecretInResponse { .. })
        ));
        assert_eq!(tmp.store().access_token.as_deref(), Some(REAL_ACCESS));
        // A request body over the cap.
        assert!(matches!(
            oauth
                .begin_token_request(None, &vec![b'a'; MAX_BODY + 1])
                .await,
            Err(OAuthError::TooLarge { .. })
        ));
        let shown = format!("{:?}", oauth.secrets());
        assert!(!shown.contains("REAL"), "{shown}");
    }

    #[tokio::test]
    async fn concurrent_refreshes_are_serialised() {
        let tmp = TempStore::new("serial");
        let oauth = Arc::new(OAuth::open(&tmp.config()).unwrap());
        let s = tmp.store();
        let request = json(&serde_json::json!({
            "grant_type": "refresh_token",
            "refresh_token": s.refresh_placeholder,
        }));
        let (first_sent, first) = oauth
            .begin_token_request(Some("application/json"), &request)
            .await
            .unwrap();
        assert_eq!(parse(&first_sent)["refresh_token"], REAL_REFRESH);
        let second = tokio::spawn({
            let (oauth, request) = (Arc::clone(&oauth), request.clone());
            async move {
                let (sent, x) = oauth
                    .begin_token_request(Some("application/json"), &request)
                    .await
                    .unwrap();
                drop(x);
                sent
            }
        });
        // The second cannot get past the first's turn.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert!(!second.is_finished(), "the second refresh did not wait");
        first
            .finish(
                200,
                br#"{"access_token":"sk-ant-oat01-ROTATED","refresh_token":"sk-ant-ort01-ROTATED"}"#,
            )
            .unwrap();
        // ...and then sends the refresh token the first one stored, not the spent one.
        let second_sent = second.await.unwrap();
        assert_eq!(parse(&second_sent)["refresh_token"], "sk-ant-ort01-ROTATED");
    }

    /// Every exchange of this router waits for its turn at most as long as for the flock: a turn that
    /// is not released (a stalled exchange) fails the next ones instead of holding them for as long as
    /// their connections live.
    #[tokio::test]
    async fn waiting_for_this_routers_turn_has_the_lock_deadline() {
        let tmp = TempStore::new("turn");
        let oauth = Arc::new(OAuth::open(&tmp.config()).unwrap());
        let request = b"grant_type=authorization_code&code=c".to_vec();
        let (_, held) = oauth.begin_token_request(None, &request).await.unwrap();
        tokio::time::pause();
        let started = tokio::time::Instant::now();
        let e = oauth
            .begin_token_request(None, &request)
            .await
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(e, OAuthError::Store(StoreError::LockTimeout { .. })),
            "{e}"
        );
        let waited = started.elapsed();
        assert!(
            waited >= LOCK_WAIT && waited < LOCK_WAIT + Duration::from_secs(1),
            "{waited:?}"
        );
        tokio::time::resume();
        drop(held);
        assert!(oauth.begin_token_request(None, &request).await.is_ok());
    }

    #[tokio::test]
    async fn two_routers_on_one_store_are_serialised_by_the_flock() {
        let tmp = TempStore::new("flock");
        let a = OAuth::open(&tmp.config()).unwrap();
        let b = Arc::new(OAuth::open(&tmp.config()).unwrap());
        let s = tmp.store();
        let request = format!(
            "grant_type=refresh_token&refresh_token={}",
            s.refresh_placeholder
        );
        let (_, first) = a
            .begin_token_request(None, request.as_bytes())
            .await
            .unwrap();
        let mut second = tokio::spawn({
            let (b, request) = (Arc::clone(&b), request.clone());
            async move {
                b.begin_token_request(None, request.as_bytes())
                    .await
                    .map(|(sent, _)| sent)
            }
        });
        // Waiting for something that must not happen: a short bounded wait is the only way to see it.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut second)
                .await
                .is_err(),
            "the other router did not wait for the lock"
        );
        first
            .finish(200, br#"{"refresh_token":"sk-ant-ort01-OTHER"}"#)
            .unwrap();
        let sent = second.await.unwrap().unwrap();
        assert_eq!(
            String::from_utf8(sent).unwrap(),
            "grant_type=refresh_token&refresh_token=sk-ant-ort01-OTHER"
        );
        // Router b sees a's refresh through the file: the access token is unchanged, the refresh
        // token rotated.
        let got = b.access_token_for(s.access_placeholder.as_bytes()).unwrap();
        assert_eq!(got.expose(), REAL_ACCESS.as_bytes());
    }

    #[tokio::test]
    async fn the_store_is_replaced_atomically_with_mode_0600() {
        let tmp = TempStore::new("atomic");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let path = oauth_store::store_path(&tmp.0);
        let ino = std::fs::metadata(&path).unwrap().ino();
        let (_, x) = oauth
            .begin_token_request(None, b"grant_type=x")
            .await
            .unwrap();
        x.finish(200, br#"{"access_token":"sk-ant-oat01-ATOMIC"}"#)
            .unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_ne!(meta.ino(), ino, "replaced by rename, not written in place");
        assert_eq!(meta.mode() & 0o777, 0o600);
        let mut names: Vec<_> = std::fs::read_dir(&tmp.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, [oauth_store::STORE_FILE, oauth_store::LOCK_FILE]);
    }

    /// A token planted in the store (the launcher moves what the home volume holds) that would split
    /// the header it goes into is not put on the wire.
    #[test]
    fn an_access_token_that_is_not_a_header_value_is_not_used() {
        let tmp = TempStore::new("crlf");
        let mut s = tmp.store();
        for planted in [
            "x\r\nContent-Length: 0\r\n\r\nPOST /v1/files HTTP/1.1\r\nHost: a\r\n",
            "sk-ant-oat01-a b",
            "sk-ant-oat01-\u{e9}",
        ] {
            s.access_token = Some(planted.into());
            s.write(&tmp.0).unwrap();
            let oauth = OAuth::open(&tmp.config()).unwrap();
            assert!(
                oauth
                    .access_token_for(s.access_placeholder.as_bytes())
                    .is_none(),
                "{planted:?}"
            );
        }
    }

    #[test]
    fn access_token_follows_another_sessions_write() {
        let tmp = TempStore::new("reread");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let mut s = tmp.store();
        let ph = s.access_placeholder.clone();
        assert_eq!(
            oauth.access_token_for(ph.as_bytes()).unwrap().expose(),
            REAL_ACCESS.as_bytes()
        );
        assert!(oauth.access_token_for(REAL_ACCESS.as_bytes()).is_none());
        assert!(oauth
            .access_token_for(s.refresh_placeholder.as_bytes())
            .is_none());
        s.access_token = Some("sk-ant-oat01-FROM-ANOTHER-SESSION".into());
        s.write(&tmp.0).unwrap();
        assert_eq!(
            oauth.access_token_for(ph.as_bytes()).unwrap().expose(),
            b"sk-ant-oat01-FROM-ANOTHER-SESSION"
        );
        let secret = oauth.access_token_for(ph.as_bytes()).unwrap();
        assert_eq!(format!("{secret} {secret:?}"), "<redacted> <redacted>");
    }

    #[test]
    fn secrets_lists_both_tokens_and_nothing_before_sign_in() {
        let tmp = TempStore::new("secrets");
        let oauth = OAuth::open(&tmp.config()).unwrap();
        let mut got: Vec<Vec<u8>> = oauth
            .secrets()
            .iter()
            .map(|s| s.expose().to_vec())
            .collect();
        got.sort();
        assert_eq!(got, [REAL_ACCESS.as_bytes(), REAL_REFRESH.as_bytes()]);
        let empty = OAuthStore {
            access_token: None,
            refresh_token: None,
            ..tmp.store()
        };
        empty.write(&tmp.0).unwrap();
        let fresh = OAuth::open(&tmp.config()).unwrap();
        assert!(fresh.secrets().is_empty());
        assert!(fresh
            .access_token_for(empty.access_placeholder.as_bytes())
            .is_none());
    }

    #[test]
    fn open_names_the_missing_file_and_token_requests_are_posts_to_the_path() {
        let tmp = TempStore::new("open");
        let mut config = tmp.config();
        config.store_dir = tmp.0.join("absent");
        let e = OAuth::open(&config).unwrap_err().to_string();
        assert!(
            e.contains(&Path::new("absent").join("oauth.json").display().to_string()),
            "{e}"
        );
        std::fs::remove_file(oauth_store::lock_path(&tmp.0)).unwrap();
        let e = OAuth::open(&tmp.config()).unwrap_err().to_string();
        assert!(e.contains("oauth.lock"), "{e}");
        std::fs::write(oauth_store::lock_path(&tmp.0), b"").unwrap();
        let oauth = OAuth::open(&tmp.config()).unwrap();
        assert!(oauth.is_token_request("POST", "/v1/oauth/token"));
        assert!(oauth.is_token_request("POST", "/v1/oauth/token?x=1"));
        assert!(!oauth.is_token_request("GET", "/v1/oauth/token"));
        assert!(!oauth.is_token_request("POST", "/v1/oauth/token/x"));
        assert!(oauth.is_token_request("POST", "/V1/OAuth/Token"));
        assert!(!oauth.is_token_request("POST", "/v1/messages"));
    }

    #[test]
    fn content_types_are_recognised() {
        assert_eq!(
            body_kind(Some("Application/JSON; charset=utf-8"), b""),
            BodyKind::Json
        );
        assert_eq!(
            body_kind(Some("application/x-www-form-urlencoded"), b"{"),
            BodyKind::Form
        );
        assert_eq!(body_kind(Some("multipart/form-data"), b""), BodyKind::Other);
        assert_eq!(body_kind(None, b"  {\"a\":1}"), BodyKind::Json);
        assert_eq!(body_kind(None, b"a=1"), BodyKind::Form);
    }
}
