//! Step 2, the shared objects: leftovers of dead sessions removed (`stale.rs`), the egress network and
//! the home volume ensured. They outlive the session and are shared by every session of this user.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use super::checks::{Checked, SharedProbes};
use super::{join, stale};
use crate::podman::json::Network;
use crate::podman::{args, Podman, PodmanError};
use crate::settings::{Settings, EGRESS_NETWORK};

/// What the shared objects contribute to a session.
pub(super) struct Shared {
    /// The router's resolvers (podman's DNS on the egress network).
    pub(super) resolvers: Vec<SocketAddr>,
    /// Whether the home volume must be re-owned to the sandbox user when mounted.
    pub(super) chown_home: bool,
    /// The home volume's directory on the host (None: not visible from here, e.g. another volume
    /// driver): where the launcher moves sign-in tokens off the volume.
    pub(super) home_mountpoint: Option<PathBuf>,
}

/// Step 2: leftovers of dead sessions removed; the egress network and the home volume ensured. The three
/// are independent of each other.
pub(super) fn prepare_shared(
    podman: &Podman,
    settings: &Settings,
    checked: &Checked,
    probes: SharedProbes,
) -> anyhow::Result<Shared> {
    let (swept, resolvers, volume) = std::thread::scope(|s| {
        let swept = s.spawn(|| match &probes.session_networks {
            Ok(listing) if !stale::any_stale(listing)? => Ok(()),
            _ => stale::remove_stale_sessions(podman, &settings.state_dir),
        });
        let egress = s.spawn(|| ensure_egress_network(podman, probes.egress));
        let volume = ensure_home_volume(
            podman,
            &settings.home_volume,
            checked.user.host_uid,
            probes.volume,
        );
        (join(swept), join(egress), volume)
    });
    swept?;
    let (chown_home, home_mountpoint) = volume?;
    Ok(Shared {
        resolvers: resolvers?,
        chown_home,
        home_mountpoint,
    })
}

/// Creates the egress network unless it exists (another session may create it at the same moment),
/// and returns the resolver the router should use: podman's DNS server on that network (at its
/// gateway), which answers for the network's containers and forwards everything else to the host's
/// resolvers. Naming it explicitly matters: the router's resolv.conf also lists the host's resolvers,
/// which answer NXDOMAIN for names that only podman knows, and which one answers first is luck.
fn ensure_egress_network(
    podman: &Podman,
    probed: Result<String, PodmanError>,
) -> anyhow::Result<Vec<SocketAddr>> {
    if let Ok(inspect) = probed {
        return Ok(dns_servers(&inspect));
    }
    if !podman.check(&args::network_exists(EGRESS_NETWORK))? {
        if let Err(e) = podman.run(&args::network_create_egress(EGRESS_NETWORK)) {
            if !podman.check(&args::network_exists(EGRESS_NETWORK))? {
                return Err(e.into());
            }
        }
    }
    let inspect = podman.run(&args::network_inspect(EGRESS_NETWORK))?;
    Ok(dns_servers(&inspect))
}

/// The DNS servers podman runs for a network, from its `network inspect`: none when podman's answer
/// cannot be read (the router then uses its own resolv.conf).
fn dns_servers(inspect_json: &str) -> Vec<SocketAddr> {
    Network::parse_inspect(inspect_json)
        .map(|net| net.dns_servers())
        .unwrap_or_default()
}

/// Creates the home volume unless it exists; returns whether it must be re-owned to `uid` on mount
/// (podman's `:U` is recursive, so only when its top directory is not already theirs), and its
/// directory when visible from here.
fn ensure_home_volume(
    podman: &Podman,
    name: &str,
    uid: u32,
    probed: Result<String, PodmanError>,
) -> anyhow::Result<(bool, Option<PathBuf>)> {
    let mountpoint = match probed {
        Ok(mountpoint) => mountpoint,
        Err(_) => {
            if !podman.check(&args::volume_exists(name))? {
                if let Err(e) = podman.run(&args::volume_create(name)) {
                    if !podman.check(&args::volume_exists(name))? {
                        return Err(e.into());
                    }
                }
            }
            podman.run(&args::volume_mountpoint(name))?
        }
    };
    let dir = PathBuf::from(mountpoint.trim());
    Ok(match fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => (meta.uid() != uid, Some(dir)),
        // Not visible from here (another volume driver): let podman make it right.
        _ => (true, None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_dns_is_podmans_resolver_at_the_gateway() {
        let inspect = r#"[{"name":"agent-sandbox-egress","subnets":[{"subnet":"10.89.0.0/24","gateway":"10.89.0.1"}],"dns_enabled":true}]"#;
        assert_eq!(
            dns_servers(inspect),
            ["10.89.0.1:53".parse::<SocketAddr>().unwrap()]
        );
        let no_dns = r#"[{"subnets":[{"subnet":"10.89.0.0/24","gateway":"10.89.0.1"}],"dns_enabled":false}]"#;
        assert!(dns_servers(no_dns).is_empty());
        assert!(dns_servers("garbage").is_empty());
    }
}
