//! Step 2, the shared objects: leftovers of dead sessions removed (`stale.rs`), the egress network and
//! the home volume ensured. They outlive the session and are shared by every session of this user.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::checks::{Checked, SharedProbes};
use super::user::SandboxUser;
use super::{join, stale};
use crate::podman::json::{Network, VolumeInspect};
use crate::podman::{args, Podman, PodmanError, UserMapping};
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
        let volume =
            ensure_home_volume(podman, &settings.home_volume, &checked.user, probes.volume);
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
/// directory when visible from here. A volume that is not a plain one of podman's is refused
/// (`home_volume_refusal`), and so is, rootful, another user's (`foreign_home`).
fn ensure_home_volume(
    podman: &Podman,
    name: &str,
    user: &SandboxUser,
    probed: Result<String, PodmanError>,
) -> anyhow::Result<(bool, Option<PathBuf>)> {
    let uid = user.host_uid;
    let inspect = match probed {
        Ok(inspect) => inspect,
        Err(_) => {
            if !podman.check(&args::volume_exists(name))? {
                if let Err(e) = podman.run(&args::volume_create(name)) {
                    if !podman.check(&args::volume_exists(name))? {
                        return Err(e.into());
                    }
                }
            }
            podman.run(&args::volume_inspect(name))?
        }
    };
    let volume = VolumeInspect::parse(&inspect)
        .with_context(|| format!("cannot read what the home volume {name} is"))?;
    if let Some(why) = home_volume_refusal(&volume) {
        bail!(
            "the home volume {name} {why}, so a sandbox would see what it mounts. {}",
            home_volume_fix(name)
        );
    }
    let dir = volume.mountpoint;
    Ok(match fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {
            if matches!(user.mapping, UserMapping::Host { .. }) {
                refuse_foreign_home(&dir, meta.uid(), name, uid)?;
            }
            (meta.uid() != uid, Some(dir))
        }
        // Not visible from here: let podman make it right.
        _ => (true, None),
    })
}

/// Why a volume cannot be the sandbox's home, or None for a plain volume of podman's (what
/// `podman volume create NAME` makes, and all the launcher makes). Such a volume's source in the
/// container's configuration is its directory in podman's storage whatever it really shows, so the
/// mount check (`mounts.rs`) cannot tell; this can. Refused: another driver (a plugin mounts whatever
/// it likes), mount options (`--opt type=none --opt o=bind --opt device=/home/me` binds the user's
/// home there on every use), and a directory that is a symbolic link (the runtime's bind follows it).
pub(crate) fn home_volume_refusal(volume: &VolumeInspect) -> Option<String> {
    if !matches!(volume.driver.as_str(), "local" | "") {
        return Some(format!(
            "has the volume driver {:?}, not podman's own (\"local\")",
            volume.driver
        ));
    }
    if !volume.options.is_empty() {
        let options: Vec<String> = volume
            .options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        return Some(format!(
            "has mount options ({}): podman mounts that on it whenever a container uses it",
            options.join(", ")
        ));
    }
    if fs::symlink_metadata(&volume.mountpoint).is_ok_and(|m| m.file_type().is_symlink()) {
        return Some(format!(
            "has a symbolic link for its directory ({}), which the bind would follow",
            volume.mountpoint.display()
        ));
    }
    // Its `NAME/_data` (podman's storage above it may be a link) must be a real directory there, not
    // reached through a link at `NAME`, and nothing may be mounted on `NAME`, on `_data` or below
    // (the runtime binds `_data` with what is mounted below it; a mount on `NAME` replaces `_data`).
    // A mount on the volumes directory itself is not refused: podman's storage may have a file
    // system of its own there.
    let dir = &volume.mountpoint;
    let (Ok(real), Some(Ok(volumes))) = (
        fs::canonicalize(dir),
        dir.parent().and_then(Path::parent).map(fs::canonicalize),
    ) else {
        // Not there (yet) or not visible from here: podman creates and mounts it.
        return None;
    };
    let named = dir.iter().rev().take(2).collect::<Vec<_>>();
    let expected = named.iter().rev().fold(volumes, |p, c| p.join(c));
    if real != expected {
        return Some(format!(
            "has its directory {} at {} through a symbolic link, which the bind would follow",
            dir.display(),
            real.display()
        ));
    }
    match crate::workdir::mounts_at_or_below(real.parent().unwrap_or(&real)) {
        Ok(mounts) if mounts.is_empty() => None,
        Ok(mounts) => Some(format!(
            "has a file system mounted on its directory, below it or on the volume's own directory \
             ({}), which the sandbox would see",
            mounts
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Err(e) => Some(format!(
            "cannot be checked for mounts on its directory (/proc/self/mountinfo: {e})"
        )),
    }
}

/// Rootful, every user's sessions share podman's one set of volumes (root's): under sudo, users A and
/// B both get the home volume of the same name, and re-owning it to B (`:U`, recursive) would hand B's
/// sandbox A's home (shell history, Claude's sessions and notes). So a volume whose top directory
/// belongs to another user than the sandbox's is refused, unless it is a new one: root's and empty.
/// A root sandbox's home (root's, not empty) is not handed to a user either. Rootless, each user has
/// their own volumes.
fn foreign_home(rootful: bool, owner: u32, sandbox_uid: u32, empty: bool) -> Option<String> {
    let taken = owner != 0 || !empty;
    (rootful && owner != sandbox_uid && taken).then(|| {
        format!(
            "belongs to uid {owner}, another user than the sandbox's (uid {sandbox_uid}): rootful \
             podman's volumes are shared by every user, and re-owning it would show uid {owner}'s \
             home to this sandbox. Give uid {sandbox_uid} a volume of its own \
             (AGENT_SANDBOX_HOME_VOLUME=agent-sandbox-home-{sandbox_uid}; the session creates it), or \
             run agent-sandbox as your own user with rootless podman (the supported mode)"
        )
    })
}

/// Rootful: the home volume's directory locked (`flock`) from a last look at its owner until the lock
/// is dropped, which the caller does once the sandbox container is initialised (podman re-owns the
/// volume there, `:U`). Without it two users starting at once on a new volume both found it new, and
/// the second was handed the first's home (reviewer Z). None rootless (each user's own storage) or
/// when the directory is not visible from here. Another launcher holds the lock for a few tenths of a
/// second; one that holds it for a minute is an error.
pub(super) fn lock_home(
    dir: Option<&Path>,
    name: &str,
    mapping: &UserMapping,
) -> anyhow::Result<Option<fs::File>> {
    let (Some(dir), UserMapping::Host { uid, .. }) = (dir, mapping) else {
        return Ok(None);
    };
    let Ok(file) = fs::File::open(dir) else {
        return Ok(None);
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        let locked = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } == 0;
        if locked {
            break;
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "the home volume {name} has been locked by another agent-sandbox start for a minute: \
                 try again, or look for a stuck `podman init`"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let meta = fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    refuse_foreign_home(dir, meta.uid(), name, *uid)?;
    Ok(Some(file))
}

/// Rootful: [`foreign_home`] for the volume directory `dir`, owned by `owner`, as an error.
fn refuse_foreign_home(dir: &Path, owner: u32, name: &str, sandbox_uid: u32) -> anyhow::Result<()> {
    let empty = fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    match foreign_home(true, owner, sandbox_uid, empty) {
        Some(why) => bail!("the home volume {name} {why}"),
        None => Ok(()),
    }
}

/// What to do about a refused home volume.
pub(crate) fn home_volume_fix(name: &str) -> String {
    format!(
        "It was not created by agent-sandbox. Use another volume (AGENT_SANDBOX_HOME_VOLUME=NAME; the \
         session creates it), or remove this one with `podman volume rm {name}` (copy out what you need \
         from it first) and the next session creates a plain one."
    )
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

    /// The home volume as each podman version describes it, then as someone else may have made it.
    #[test]
    fn home_volume_only_a_plain_one_of_podmans() {
        for json in [
            include_str!("../../tests/data/podman/4.3.1/volume-inspect.json"),
            include_str!("../../tests/data/podman/5.8.2/volume-inspect.json"),
        ] {
            let volume = VolumeInspect::parse(json).unwrap();
            assert_eq!(home_volume_refusal(&volume), None);
            let bound = json.replace(
                r#""Options": {}"#,
                r#""Options": {"device": "/home/me", "o": "bind", "type": "none"}"#,
            );
            let why = home_volume_refusal(&VolumeInspect::parse(&bound).unwrap()).unwrap();
            assert!(
                why.contains("mount options (device=/home/me, o=bind, type=none)"),
                "{why}"
            );
            let plugin = json.replace(r#""Driver": "local""#, r#""Driver": "sshfs""#);
            let why = home_volume_refusal(&VolumeInspect::parse(&plugin).unwrap()).unwrap();
            assert!(why.contains(r#"driver "sshfs""#), "{why}");
            // An empty driver is podman's own too; a null `Options` is none.
            let old = json
                .replace(r#""Driver": "local""#, r#""Driver": """#)
                .replace(r#""Options": {}"#, r#""Options": null"#);
            assert_eq!(
                home_volume_refusal(&VolumeInspect::parse(&old).unwrap()),
                None
            );
        }
        assert!(VolumeInspect::parse("[]").is_err());
        assert!(VolumeInspect::parse("garbage").is_err());
    }

    #[test]
    fn rootful_another_users_home_is_refused() {
        // Rootful: a new volume (root's, empty) is taken over; the user's own kept.
        assert_eq!(foreign_home(true, 0, 1000, true), None);
        assert_eq!(foreign_home(true, 1000, 1000, false), None);
        let why = foreign_home(true, 1001, 1000, false).unwrap();
        assert!(
            why.contains("uid 1001") && why.contains("agent-sandbox-home-1000"),
            "{why}"
        );
        assert!(foreign_home(true, 1001, 1000, true).is_some());
        // A root sandbox's home (reviewer Z: its shell history reached the next user's sandbox) is
        // not handed to a user, nor a user's to a root sandbox.
        assert!(foreign_home(true, 0, 1000, false).is_some());
        assert!(foreign_home(true, 1001, 0, false).is_some());
        assert_eq!(foreign_home(true, 0, 0, false), None);
        // Rootless: the user's own storage.
        assert_eq!(foreign_home(false, 1001, 1000, false), None);
    }

    /// A volume's directory reached through a link at `NAME`, or with a file system mounted on it
    /// (reviewer Y: `mount --bind /somewhere .../volumes/NAME/_data` showed /somewhere in the sandbox).
    /// Mounting needs root: skipped otherwise.
    #[test]
    fn home_volume_mounted_on_or_linked_at_its_name_is_refused() {
        struct Undo(PathBuf, Option<PathBuf>);
        impl Drop for Undo {
            fn drop(&mut self) {
                if let Some(m) = &self.1 {
                    let _ = std::process::Command::new("umount").arg(m).status();
                }
                let _ = fs::remove_dir_all(&self.0);
            }
        }
        let base = std::env::temp_dir().join(format!("as-home-mount-{}", std::process::id()));
        let mut undo = Undo(base.clone(), None);
        let volumes = base.join("volumes");
        let data = volumes.join("home").join("_data");
        fs::create_dir_all(&data).unwrap();
        let volume = |dir: &Path| VolumeInspect {
            driver: "local".into(),
            mountpoint: dir.to_owned(),
            options: Default::default(),
        };
        assert_eq!(home_volume_refusal(&volume(&data)), None);
        // `volumes/linked` is a link to a directory holding a `_data`.
        let elsewhere = base.join("elsewhere");
        fs::create_dir_all(elsewhere.join("_data")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, volumes.join("linked")).unwrap();
        let why = home_volume_refusal(&volume(&volumes.join("linked/_data"))).unwrap();
        assert!(why.contains("through a symbolic link"), "{why}");
        // SAFETY: geteuid cannot fail and touches no memory.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let mounted = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&elsewhere)
            .arg(&data)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            return;
        }
        undo.1 = Some(data.clone());
        let why = home_volume_refusal(&volume(&data)).unwrap();
        assert!(why.contains("mounted on its directory"), "{why}");
        // On the volume's own directory, which puts another `_data` in its place (reviewer Z).
        let umount = |m: &Path| std::process::Command::new("umount").arg(m).status();
        assert!(umount(&data).unwrap().success());
        let named = volumes.join("home");
        undo.1 = None;
        assert!(std::process::Command::new("mount")
            .arg("--bind")
            .arg(&elsewhere)
            .arg(&named)
            .status()
            .unwrap()
            .success());
        undo.1 = Some(named);
        let why = home_volume_refusal(&volume(&data)).unwrap();
        assert!(why.contains("mounted on"), "{why}");
    }

    #[test]
    fn home_volume_whose_directory_is_a_link_is_refused() {
        let dir = std::env::temp_dir().join(format!("as-home-link-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let data = dir.join("_data");
        std::os::unix::fs::symlink("/", &data).unwrap();
        let volume = VolumeInspect {
            driver: "local".into(),
            mountpoint: data,
            options: Default::default(),
        };
        let why = home_volume_refusal(&volume);
        fs::remove_dir_all(&dir).unwrap();
        assert!(why.is_some_and(|w| w.contains("symbolic link")));
    }
}
