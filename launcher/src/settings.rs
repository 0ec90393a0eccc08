//! Where things are: images, allowlist, home volume, and the defaults compiled into this build.
//!
//! The in-repo build runs the local `:dev` images that `make build` makes; a release build pins the
//! registry images of its tag by setting `AGENT_SANDBOX_DEFAULT_IMAGE` and
//! `AGENT_SANDBOX_DEFAULT_ROUTER_IMAGE` while compiling (the packaging issue). At run time the
//! `AGENT_SANDBOX_*` environment variables override everything.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The sandbox image unless `AGENT_SANDBOX_IMAGE` says otherwise (a build-time setting).
pub const DEFAULT_IMAGE: &str = match option_env!("AGENT_SANDBOX_DEFAULT_IMAGE") {
    Some(image) => image,
    None => "localhost/agent-sandbox:dev",
};

/// The router image unless `AGENT_SANDBOX_ROUTER_IMAGE` says otherwise (a build-time setting).
pub const DEFAULT_ROUTER_IMAGE: &str = match option_env!("AGENT_SANDBOX_DEFAULT_ROUTER_IMAGE") {
    Some(image) => image,
    None => "localhost/agent-sandbox-router:dev",
};

/// The home volume unless `AGENT_SANDBOX_HOME_VOLUME` says otherwise.
pub const DEFAULT_HOME_VOLUME: &str = "agent-sandbox-home";

/// The network every router uses to reach the allowlisted hosts; created if missing, never removed.
pub const EGRESS_NETWORK: &str = "agent-sandbox-egress";

/// Where packages install the default allowlist (an administrator may edit it for their site).
pub const PACKAGED_ALLOWLIST: &str = "/usr/share/agent-sandbox/allowed-hosts";

/// The default allowlist of this source tree, used when [`PACKAGED_ALLOWLIST`] is not installed.
pub const EMBEDDED_ALLOWLIST: &str = include_str!("../../packaging/allowed-hosts");

/// Test hook: the router's resolvers (`IP:PORT`, comma-separated) instead of podman's DNS on the egress
/// network. The end-to-end suite points the router at its own DNS server, so that no test can make the
/// router resolve a real name (podman's DNS forwards to the host's resolvers). Not for users.
pub const TEST_RESOLVERS_VAR: &str = "AGENT_SANDBOX_TEST_ROUTER_RESOLVERS";

/// A setting cannot be worked out from the environment.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// No HOME.
    #[error(
        "HOME is not set: agent-sandbox needs it to find your allowlist and to refuse to run there"
    )]
    NoHome,
    /// HOME is relative.
    #[error("HOME ({0}) is not an absolute path")]
    RelativeHome(PathBuf),
    /// A test hook's value does not parse.
    #[error("{TEST_RESOLVERS_VAR}: `{0}` is not a comma-separated list of IP:PORT")]
    TestResolvers(String),
}

/// Where the allowlist path came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllowlistSource {
    /// `AGENT_SANDBOX_ALLOWLIST`.
    Env,
    /// `$XDG_CONFIG_HOME/agent-sandbox/allowed-hosts`.
    XdgConfigHome,
    /// `~/.config/agent-sandbox/allowed-hosts`.
    HomeConfig,
}

/// The settings of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The sandbox image.
    pub image: String,
    /// The router image (it also holds the forwarder).
    pub router_image: String,
    /// The home volume.
    pub home_volume: String,
    /// The allowlist file.
    pub allowlist: PathBuf,
    /// Where [`Settings::allowlist`] came from.
    pub allowlist_source: AllowlistSource,
    /// The invoking user's home directory (as given; canonicalised where it is compared).
    pub home: PathBuf,
    /// Credential injection (issue 20): the sandbox gets placeholders and the router adds the secrets.
    /// `--no-inject` turns it off.
    pub inject: bool,
    /// Where the launcher keeps per-user state (the API key placeholders):
    /// `$XDG_STATE_HOME/agent-sandbox`, else `~/.local/state/agent-sandbox`.
    pub state_dir: PathBuf,
    /// Where the launcher caches what it can read again (the sandbox image's CA bundle):
    /// `$XDG_CACHE_HOME/agent-sandbox`, else `~/.cache/agent-sandbox`.
    pub cache_dir: PathBuf,
    /// Test hook [`TEST_RESOLVERS_VAR`]: the router's resolvers.
    pub test_resolvers: Option<Vec<SocketAddr>>,
    /// Test hook [`crate::inject::TEST_UPSTREAM_ROOTS_VAR`]: the roots the router verifies upstreams
    /// against.
    pub test_upstream_roots: Option<PathBuf>,
}

impl Settings {
    /// Works the settings out from environment variables (`var` is `std::env::var_os` outside tests).
    /// Empty variables count as unset.
    pub fn from_env(var: impl Fn(&str) -> Option<OsString>) -> Result<Settings, SettingsError> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let text = |name: &str, default: &str| {
            get(name)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_else(|| default.to_owned())
        };
        let home = PathBuf::from(get("HOME").ok_or(SettingsError::NoHome)?);
        if !home.is_absolute() {
            return Err(SettingsError::RelativeHome(home));
        }
        let (allowlist, allowlist_source) = if let Some(p) = get("AGENT_SANDBOX_ALLOWLIST") {
            (PathBuf::from(p), AllowlistSource::Env)
        } else if let Some(x) = get("XDG_CONFIG_HOME").filter(|x| Path::new(x).is_absolute()) {
            // The XDG spec says relative values are invalid and to be ignored.
            (
                PathBuf::from(x).join("agent-sandbox/allowed-hosts"),
                AllowlistSource::XdgConfigHome,
            )
        } else {
            (
                home.join(".config/agent-sandbox/allowed-hosts"),
                AllowlistSource::HomeConfig,
            )
        };
        let test_resolvers = match get(TEST_RESOLVERS_VAR) {
            None => None,
            Some(v) => {
                let v = v.to_string_lossy().into_owned();
                let parsed: Result<Vec<SocketAddr>, _> =
                    v.split(',').map(|a| a.trim().parse()).collect();
                Some(parsed.map_err(|_| SettingsError::TestResolvers(v))?)
            }
        };
        Ok(Settings {
            inject: true,
            state_dir: crate::inject::placeholder::state_dir(&home, get("XDG_STATE_HOME")),
            cache_dir: crate::inject::cache_dir(&home, get("XDG_CACHE_HOME")),
            test_resolvers,
            test_upstream_roots: get(crate::inject::TEST_UPSTREAM_ROOTS_VAR).map(PathBuf::from),
            image: text("AGENT_SANDBOX_IMAGE", DEFAULT_IMAGE),
            router_image: text("AGENT_SANDBOX_ROUTER_IMAGE", DEFAULT_ROUTER_IMAGE),
            home_volume: text("AGENT_SANDBOX_HOME_VOLUME", DEFAULT_HOME_VOLUME),
            allowlist,
            allowlist_source,
            home,
        })
    }

    /// The `--print-config` report.
    #[must_use]
    pub fn describe(&self) -> String {
        let source = match self.allowlist_source {
            AllowlistSource::Env => "AGENT_SANDBOX_ALLOWLIST",
            AllowlistSource::XdgConfigHome => "XDG_CONFIG_HOME",
            AllowlistSource::HomeConfig => "default",
        };
        format!(
            "sandbox image:  {}\nrouter image:   {}\nhome volume:    {}\nallowlist:      {} ({source})\negress network: {EGRESS_NETWORK}\nversion:        {}\n",
            self.image,
            self.router_image,
            self.home_volume,
            self.allowlist.display(),
            env!("CARGO_PKG_VERSION"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        Settings::from_env(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let s = settings(&[("HOME", "/home/me")]).unwrap();
        assert_eq!(s.image, DEFAULT_IMAGE);
        assert_eq!(s.router_image, DEFAULT_ROUTER_IMAGE);
        assert_eq!(s.home_volume, "agent-sandbox-home");
        assert_eq!(
            s.allowlist,
            Path::new("/home/me/.config/agent-sandbox/allowed-hosts")
        );
        assert_eq!(s.allowlist_source, AllowlistSource::HomeConfig);
    }

    #[test]
    fn in_repo_defaults_are_the_local_dev_images() {
        if option_env!("AGENT_SANDBOX_DEFAULT_IMAGE").is_none() {
            assert_eq!(DEFAULT_IMAGE, "localhost/agent-sandbox:dev");
        }
        if option_env!("AGENT_SANDBOX_DEFAULT_ROUTER_IMAGE").is_none() {
            assert_eq!(DEFAULT_ROUTER_IMAGE, "localhost/agent-sandbox-router:dev");
        }
    }

    #[test]
    fn overrides() {
        let s = settings(&[
            ("HOME", "/home/me"),
            ("AGENT_SANDBOX_IMAGE", "reg/sb:1"),
            ("AGENT_SANDBOX_ROUTER_IMAGE", "reg/rt:1"),
            ("AGENT_SANDBOX_HOME_VOLUME", "vol"),
            ("AGENT_SANDBOX_ALLOWLIST", "/etc/list"),
            ("XDG_CONFIG_HOME", "/xdg"),
        ])
        .unwrap();
        assert_eq!(
            (
                s.image.as_str(),
                s.router_image.as_str(),
                s.home_volume.as_str()
            ),
            ("reg/sb:1", "reg/rt:1", "vol")
        );
        assert_eq!(s.allowlist, Path::new("/etc/list"));
        assert_eq!(s.allowlist_source, AllowlistSource::Env);
    }

    #[test]
    fn xdg_config_home() {
        let s = settings(&[("HOME", "/home/me"), ("XDG_CONFIG_HOME", "/xdg")]).unwrap();
        assert_eq!(s.allowlist, Path::new("/xdg/agent-sandbox/allowed-hosts"));
        // Relative or empty values are ignored.
        for bad in ["rel/dir", ""] {
            let s = settings(&[("HOME", "/home/me"), ("XDG_CONFIG_HOME", bad)]).unwrap();
            assert_eq!(s.allowlist_source, AllowlistSource::HomeConfig);
        }
        let s = settings(&[("HOME", "/home/me"), ("AGENT_SANDBOX_IMAGE", "")]).unwrap();
        assert_eq!(s.image, DEFAULT_IMAGE);
    }

    #[test]
    fn home_is_required() {
        assert!(matches!(settings(&[]), Err(SettingsError::NoHome)));
        assert!(matches!(
            settings(&[("HOME", "rel")]),
            Err(SettingsError::RelativeHome(_))
        ));
    }

    #[test]
    fn embedded_default_allows_claude() {
        let list = agent_sandbox_shared::Allowlist::parse(EMBEDDED_ALLOWLIST, "embedded").unwrap();
        assert!(list
            .entries()
            .iter()
            .any(|e| e.to_string() == "api.anthropic.com"));
    }
}
