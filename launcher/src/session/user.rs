//! Who the sandbox user is: the invoking user under rootless podman (`keep-id`), the sudo user or the
//! project's owner under rootful podman, with the home the sandbox mounts the home volume on.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::say;
use crate::podman::UserMapping;

/// The sandbox user, its home inside the container and the host uid that should own the home volume.
#[derive(Debug)]
pub(super) struct SandboxUser {
    /// How podman maps the user.
    pub(super) mapping: UserMapping,
    /// The `/etc/passwd` line that names the user in the sandbox (none for root).
    pub(super) passwd_entry: Option<String>,
    /// The home directory inside the sandbox, where the home volume goes.
    pub(super) home: PathBuf,
    /// The host uid that should own the home volume.
    pub(super) host_uid: u32,
}

/// Rootless: keep-id, so the sandbox user is you (same uid, name and home path). Rootful podman refuses
/// keep-id, and a user namespace that maps a non-root sandbox user to the invoking user breaks podman
/// 4's overlay storage, so rootful runs without a user namespace as the invoking user: the sudo user
/// when run through sudo, else the owner of the project directory. When that is root, the sandbox user
/// is root with no capabilities and nested podman is not available; rootless is the supported mode.
pub(super) fn sandbox_user(
    rootless: bool,
    project: &Path,
    home: &Path,
) -> anyhow::Result<SandboxUser> {
    // SAFETY: getuid/getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let entry = |name: &str, uid: u32, gid: u32, home: &Path| {
        Some(format!(
            "{name}:*:{uid}:{gid}:{name}:{}:/bin/bash",
            home.display()
        ))
    };
    if rootless {
        let name = passwd_lookup(uid)
            .map(|(n, _)| n)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "sandbox".to_owned());
        return Ok(SandboxUser {
            mapping: UserMapping::KeepId,
            passwd_entry: entry(&name, uid, gid, home),
            home: home.to_owned(),
            host_uid: uid,
        });
    }
    let sudo = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    let (uid, gid) = match (sudo("SUDO_UID"), sudo("SUDO_GID")) {
        (Some(u), Some(g)) if u != 0 => (u, g),
        _ => {
            let meta = fs::metadata(project)
                .with_context(|| format!("cannot stat {}", project.display()))?;
            (meta.uid(), meta.gid())
        }
    };
    if uid == 0 {
        say!(
            "podman is rootful and {} belongs to root: the sandbox runs as root without capabilities, \
             and nested podman is not available. Rootless podman is the supported mode.",
            project.display()
        );
        return Ok(SandboxUser {
            mapping: UserMapping::Host { uid: 0, gid: 0 },
            passwd_entry: None,
            home: PathBuf::from("/root"),
            host_uid: 0,
        });
    }
    let (name, home) = passwd_lookup(uid).unwrap_or_else(|| {
        (
            "sandbox".to_owned(),
            PathBuf::from(format!("/home/sandbox-{uid}")),
        )
    });
    Ok(SandboxUser {
        mapping: UserMapping::Host { uid, gid },
        passwd_entry: entry(&name, uid, gid, &home),
        home,
        host_uid: uid,
    })
}

/// The name and home of a uid from /etc/passwd.
pub(super) fn passwd_lookup(uid: u32) -> Option<(String, PathBuf)> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 7 && f[2].parse::<u32>().ok()? == uid && !f[5].is_empty())
            .then(|| (f[0].to_owned(), PathBuf::from(f[5])))
    })
}
