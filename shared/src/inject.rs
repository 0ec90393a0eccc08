//! Credential injection (issue 20): the part of the router's configuration that names the hosts whose TLS
//! the router terminates to put a secret on the wire, and the files the secrets come from.
//!
//! The sandbox only ever holds placeholders. The launcher writes this section (and the files it names)
//! into the session directory, which is mounted into the router and nowhere else; the standalone gateway
//! may be given the same section in its `--config`. Every other SNI is spliced end to end as before.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::name::HostName;

/// The longest placeholder accepted: API keys and OAuth tokens are well under this.
pub const MAX_PLACEHOLDER_LEN: usize = 512;
/// The shortest placeholder accepted: shorter values could occur by chance in a header.
pub const MIN_PLACEHOLDER_LEN: usize = 20;

/// The `[inject]` table of the router's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectConfig {
    /// PEM certificate of the session CA that signs the router's leaf for each terminated host. The
    /// sandbox trusts this CA; it is name-constrained to the terminated hosts.
    pub ca_cert: PathBuf,
    /// PEM (PKCS#8) private key of that CA. In a session it lives only in the session directory,
    /// mounted only into the router.
    pub ca_key: PathBuf,
    /// A PEM file of the roots upstreams are verified against instead of the compiled-in web PKI roots
    /// (tests, or a corporate CA in front of the real hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_roots: Option<PathBuf>,
    /// API key injection (`x-api-key` / `Authorization: Bearer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ApiKeyInject>,
    /// OAuth token injection (subscription sign-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthInject>,
}

/// The API key: the sandbox's `ANTHROPIC_API_KEY` is `placeholder`; the router swaps in the real key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyInject {
    /// Exact hosts whose requests get the key (`api.anthropic.com`).
    pub hosts: Vec<String>,
    /// The value the sandbox holds. A header is rewritten only when its value equals it exactly.
    pub placeholder: String,
    /// The file holding the real key (its first line; surrounding whitespace is trimmed). Never argv or
    /// environment: `podman inspect` shows both.
    pub key_file: PathBuf,
}

/// OAuth: the sandbox's credentials file holds placeholders; the router keeps the real tokens in `store`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthInject {
    /// Exact hosts where `Authorization: Bearer <access placeholder>` becomes the real access token
    /// (`api.anthropic.com`).
    pub api_hosts: Vec<String>,
    /// The token endpoint's host (`platform.claude.com`).
    pub token_host: String,
    /// The token endpoint's path (`/v1/oauth/token`).
    pub token_path: String,
    /// The directory of the host-side token store (`oauth.json` and its lock file `oauth.lock` in it). A
    /// directory, not a file, so that replacing the store by rename is seen through a bind mount.
    pub store_dir: PathBuf,
}

/// [`InjectConfig`] checked: every host parsed and allowed by the policy.
#[derive(Clone, Debug)]
pub struct ValidInject {
    /// The section as configured (its file paths are read by the router at start).
    pub config: InjectConfig,
    /// Every host whose TLS the router terminates: the union of the API key hosts, the OAuth API hosts
    /// and the token host. Any other SNI is spliced.
    pub terminated: BTreeSet<HostName>,
    /// The API key hosts, parsed.
    pub api_key_hosts: BTreeSet<HostName>,
    /// The OAuth API hosts, parsed.
    pub oauth_api_hosts: BTreeSet<HostName>,
    /// The OAuth token host, parsed.
    pub token_host: Option<HostName>,
}

impl InjectConfig {
    /// Parses and checks the hosts and placeholders; pushes one line per problem.
    ///
    /// A terminated host need not be on the allowlist: the policy decides every SNI before termination
    /// is considered, so a host removed from the allowlist (by a live change during a session) is simply
    /// refused, and the change must not be refused because of this section.
    pub fn validate(&self, problems: &mut Vec<String>) -> Option<ValidInject> {
        let before = problems.len();
        let mut parse = |what: &str, raw: &str| match HostName::parse(raw) {
            Ok(n) => Some(n),
            Err(e) => {
                problems.push(format!("inject: {what} `{}`: {e}", raw.escape_debug()));
                None
            }
        };
        let mut api_key_hosts = BTreeSet::new();
        let mut oauth_api_hosts = BTreeSet::new();
        let mut token_host = None;
        if let Some(k) = &self.api_key {
            api_key_hosts.extend(
                k.hosts
                    .iter()
                    .filter_map(|h| parse("api_key.hosts entry", h)),
            );
        }
        if let Some(o) = &self.oauth {
            oauth_api_hosts.extend(
                o.api_hosts
                    .iter()
                    .filter_map(|h| parse("oauth.api_hosts entry", h)),
            );
            token_host = parse("oauth.token_host", &o.token_host);
        }
        if let Some(k) = &self.api_key {
            if k.hosts.is_empty() {
                problems.push("inject: api_key.hosts is empty".into());
            }
            check_placeholder("api_key.placeholder", &k.placeholder, problems);
        }
        if let Some(o) = &self.oauth {
            if !o.token_path.starts_with('/')
                || o.token_path.len() > 256
                || !o.token_path.bytes().all(|b| b.is_ascii_graphic())
            {
                problems.push(format!(
                    "inject: oauth.token_path `{}` must be an absolute path of printable ASCII",
                    o.token_path.escape_debug()
                ));
            }
        }
        if self.api_key.is_none() && self.oauth.is_none() {
            problems.push("inject: neither api_key nor oauth is configured".into());
        }
        if problems.len() != before {
            return None;
        }
        let mut terminated = BTreeSet::new();
        terminated.extend(api_key_hosts.iter().cloned());
        terminated.extend(oauth_api_hosts.iter().cloned());
        terminated.extend(token_host.iter().cloned());
        Some(ValidInject {
            config: self.clone(),
            terminated,
            api_key_hosts,
            oauth_api_hosts,
            token_host,
        })
    }
}

/// A placeholder is printable ASCII with no spaces, of a length that cannot occur by chance.
fn check_placeholder(what: &str, value: &str, problems: &mut Vec<String>) {
    if value.len() < MIN_PLACEHOLDER_LEN
        || value.len() > MAX_PLACEHOLDER_LEN
        || !value.bytes().all(|b| b.is_ascii_graphic())
    {
        problems.push(format!(
            "inject: {what} must be {MIN_PLACEHOLDER_LEN} to {MAX_PLACEHOLDER_LEN} printable ASCII characters"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> InjectConfig {
        InjectConfig {
            ca_cert: "/s/ca.pem".into(),
            ca_key: "/s/ca.key".into(),
            upstream_roots: None,
            api_key: Some(ApiKeyInject {
                hosts: vec!["api.anthropic.com".into()],
                placeholder: "sk-ant-api03-placeholder-0000000000".into(),
                key_file: "/s/api-key".into(),
            }),
            oauth: Some(OAuthInject {
                api_hosts: vec!["api.anthropic.com".into()],
                token_host: "platform.claude.com".into(),
                token_path: "/v1/oauth/token".into(),
                store_dir: "/s/oauth".into(),
            }),
        }
    }

    #[test]
    fn terminated_is_the_union() {
        let mut problems = Vec::new();
        let v = config().validate(&mut problems).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let names: Vec<_> = v.terminated.iter().map(HostName::as_str).collect();
        assert_eq!(names, ["api.anthropic.com", "platform.claude.com"]);
    }

    #[test]
    fn bad_host_and_short_placeholder_are_refused() {
        let mut c = config();
        c.api_key.as_mut().unwrap().placeholder = "short".into();
        c.oauth.as_mut().unwrap().token_host = "platform..claude.com".into();
        let mut problems = Vec::new();
        assert!(c.validate(&mut problems).is_none());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("token_host"), "{problems:?}");
        assert!(problems[1].contains("placeholder"), "{problems:?}");
    }
}
