//! The terminated connection's only way into the OAuth token store (written by the inject-oauth work,
//! `inject/oauth.rs`): every call the request loop makes into it goes through this file.
//!
//! How it fits: [`OAuthHook`] is the store as the request loop uses it, implemented by the real
//! [`OAuth`](super::oauth::OAuth) (opened by [`open`]) and, for the router's own tests, by `TestStore`
//! (feature `test-support`), so the terminated request loop is tested with fixed tokens and the store
//! with real files, each on its own. The call sites are the functions below.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use agent_sandbox_shared::inject::OAuthInject;

/// A real secret (API key, access or refresh token). Printing it never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Vec<u8>);

impl Secret {
    /// Wraps a value.
    pub(crate) fn new(value: Vec<u8>) -> Secret {
        Secret(value)
    }

    /// The value, for the wire (and the response scan) only.
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// An OAuth failure, as the request loop sees it (the store's own error type replaces it at the merge).
pub(crate) type OAuthError = Box<dyn std::error::Error + Send + Sync>;

/// A token request's rewritten body and the exchange that finishes it.
pub(crate) type Begun = Result<(Vec<u8>, Box<dyn TokenFinish>), OAuthError>;

/// The store as the request loop uses it: the methods of inject-oauth's `OAuth`.
pub(crate) trait OAuthHook: Send + Sync + fmt::Debug {
    /// The real access token when `bearer` is exactly the access-token placeholder.
    fn access_token_for(&self, bearer: &[u8]) -> Option<Secret>;
    /// Whether this request goes to the token endpoint (the host is already the token host).
    fn is_token_request(&self, method: &str, path: &str) -> bool;
    /// Rewrites a token request's body, holding the store lock until the exchange finishes.
    fn begin_token_request<'a>(
        &'a self,
        content_type: Option<&'a str>,
        body: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = Begun> + Send + 'a>>;
    /// Every real secret known now, for the response scan.
    fn secrets(&self) -> Vec<Secret>;
}

/// The second half of a token exchange (inject-oauth's `TokenExchange`).
pub(crate) trait TokenFinish: Send {
    /// Rewrites the token endpoint's response body (real tokens stored, placeholders sent on).
    fn finish(self: Box<Self>, status: u16, body: &[u8]) -> Result<Vec<u8>, OAuthError>;
}

/// Opens the OAuth store the section names; an error stops the router at start.
pub(crate) fn open(config: &OAuthInject) -> Result<Arc<dyn OAuthHook>, OAuthError> {
    let store = super::oauth::OAuth::open(config)?;
    Ok(Arc::new(store))
}

/// The store's secrets in the hook's type.
fn secret(s: &super::oauth::Secret) -> Secret {
    Secret::new(s.expose().to_vec())
}

impl OAuthHook for super::oauth::OAuth {
    fn access_token_for(&self, bearer: &[u8]) -> Option<Secret> {
        super::oauth::OAuth::access_token_for(self, bearer).map(|s| secret(&s))
    }

    fn is_token_request(&self, method: &str, path: &str) -> bool {
        super::oauth::OAuth::is_token_request(self, method, path)
    }

    fn begin_token_request<'a>(
        &'a self,
        content_type: Option<&'a str>,
        body: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = Begun> + Send + 'a>> {
        Box::pin(async move {
            let (body, exchange) =
                super::oauth::OAuth::begin_token_request(self, content_type, body).await?;
            let finish: Box<dyn TokenFinish> = Box::new(exchange);
            Ok((body, finish))
        })
    }

    fn secrets(&self) -> Vec<Secret> {
        super::oauth::OAuth::secrets(self)
            .iter()
            .map(secret)
            .collect()
    }
}

impl TokenFinish for super::oauth::TokenExchange {
    fn finish(self: Box<Self>, status: u16, body: &[u8]) -> Result<Vec<u8>, OAuthError> {
        Ok(super::oauth::TokenExchange::finish(*self, status, body)?)
    }
}

/// The access token for a `Bearer` value, if it is the placeholder.
pub(crate) fn access_token(hook: &dyn OAuthHook, bearer: &[u8]) -> Option<Secret> {
    hook.access_token_for(bearer)
}

/// Whether a request to the token host is a token request.
pub(crate) fn is_token_request(hook: &dyn OAuthHook, method: &str, path: &str) -> bool {
    hook.is_token_request(method, path)
}

/// Whether `method` `path` is a token request to `token_path`: a POST to that path, with or without a
/// query, in any case. The caller normalises the target first (origin form, escapes decoded, dot
/// segments and empty ones resolved).
pub(crate) fn token_request_to(method: &str, path: &str, token_path: &str) -> bool {
    let bare = path.split_once('?').map_or(path, |(p, _)| p);
    method == "POST" && bare.eq_ignore_ascii_case(token_path)
}

/// Starts a token exchange: the rewritten body and what finishes it.
pub(crate) async fn begin(hook: &dyn OAuthHook, content_type: Option<&str>, body: &[u8]) -> Begun {
    hook.begin_token_request(content_type, body).await
}

/// Finishes a token exchange with the upstream's answer.
pub(crate) fn finish(
    exchange: Box<dyn TokenFinish>,
    status: u16,
    body: &[u8],
) -> Result<Vec<u8>, OAuthError> {
    exchange.finish(status, body)
}

/// The real secrets the store knows now.
pub(crate) fn secrets(hook: &dyn OAuthHook) -> Vec<Secret> {
    hook.secrets()
}

/// A token store for tests (the `test-support` feature): fixed placeholders and tokens. A token
/// request's body has the refresh placeholder replaced by the refresh token; a token response's body
/// has the tokens the upstream issues (`issued`) replaced by the placeholders.
#[cfg(feature = "test-support")]
#[derive(Debug, Clone)]
pub struct TestStore {
    /// The access-token placeholder the sandbox holds.
    pub access_placeholder: String,
    /// The real access token.
    pub access_token: String,
    /// The refresh-token placeholder the sandbox holds.
    pub refresh_placeholder: String,
    /// The real refresh token.
    pub refresh_token: String,
    /// The (access, refresh) tokens the test's token endpoint issues.
    pub issued: (String, String),
}

#[cfg(feature = "test-support")]
impl OAuthHook for TestStore {
    fn access_token_for(&self, bearer: &[u8]) -> Option<Secret> {
        (bearer == self.access_placeholder.as_bytes())
            .then(|| Secret::new(self.access_token.clone().into_bytes()))
    }

    fn is_token_request(&self, method: &str, path: &str) -> bool {
        token_request_to(method, path, "/v1/oauth/token")
    }

    fn begin_token_request<'a>(
        &'a self,
        _: Option<&'a str>,
        body: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = Begun> + Send + 'a>> {
        Box::pin(async move {
            let text = std::str::from_utf8(body)?;
            let rewritten = text.replace(&self.refresh_placeholder, &self.refresh_token);
            let finish: Box<dyn TokenFinish> = Box::new(self.clone());
            Ok((rewritten.into_bytes(), finish))
        })
    }

    fn secrets(&self) -> Vec<Secret> {
        [
            &self.access_token,
            &self.refresh_token,
            &self.issued.0,
            &self.issued.1,
        ]
        .into_iter()
        .map(|s| Secret::new(s.clone().into_bytes()))
        .collect()
    }
}

#[cfg(feature = "test-support")]
impl TokenFinish for TestStore {
    fn finish(self: Box<Self>, _: u16, body: &[u8]) -> Result<Vec<u8>, OAuthError> {
        let text = std::str::from_utf8(body)?;
        Ok(text
            .replace(&self.issued.0, &self.access_placeholder)
            .replace(&self.issued.1, &self.refresh_placeholder)
            .into_bytes())
    }
}
