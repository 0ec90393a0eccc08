//! Which directories the sandbox may be given.
//!
//! The project directory is mounted read-write, so launching from `$HOME` (or `/home`, or `/`) would hand
//! the sandbox every dotfile and key, and launching from a directory that holds the allowlist would let
//! it widen its own egress for the next session. These checks run on canonical paths (symlinks
//! resolved) before anything is created.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Why a directory is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The directory is the home directory.
    #[error("refusing to run in your home directory {0}: the sandbox would see and could change everything in it. cd into a project directory first")]
    Home(PathBuf),
    /// The directory contains the home directory.
    #[error("refusing to run in {dir}: it contains your home directory {home}, which the sandbox would see and could change. cd into a project directory first")]
    ParentOfHome {
        /// The refused directory.
        dir: PathBuf,
        /// The home directory.
        home: PathBuf,
    },
    /// The directory contains the allowlist.
    #[error("refusing to run in {dir}: it contains the allowlist {allowlist}, which the sandbox could rewrite to widen its own egress. Run from a directory that does not hold it, or keep the allowlist elsewhere (AGENT_SANDBOX_ALLOWLIST)")]
    ContainsAllowlist {
        /// The refused directory.
        dir: PathBuf,
        /// The allowlist, as it resolves.
        allowlist: PathBuf,
    },
}

/// Refuses `dir` if it is `home` or above it, or if any of `allowlist_paths` lies inside it.
///
/// Every path must already be canonical (see [`canonicalize_lenient`]); this function only compares.
pub fn check(dir: &Path, home: &Path, allowlist_paths: &[PathBuf]) -> Result<(), Refusal> {
    if dir == home {
        return Err(Refusal::Home(dir.to_owned()));
    }
    if home.starts_with(dir) {
        return Err(Refusal::ParentOfHome {
            dir: dir.to_owned(),
            home: home.to_owned(),
        });
    }
    if let Some(a) = allowlist_paths.iter().find(|a| a.starts_with(dir)) {
        return Err(Refusal::ContainsAllowlist {
            dir: dir.to_owned(),
            allowlist: a.clone(),
        });
    }
    Ok(())
}

/// Canonicalises the longest existing prefix of `path` and appends the rest, so that a path that does
/// not exist yet (an allowlist about to be created) is still compared with symlinks resolved.
pub fn canonicalize_lenient(path: &Path) -> io::Result<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    let parts: Vec<Component<'_>> = absolute.components().collect();
    for n in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..n].iter().collect();
        if let Ok(canonical) = prefix.canonicalize() {
            let mut rest = canonical;
            rest.extend(&parts[n..]);
            return Ok(normalize(&rest));
        }
    }
    Ok(normalize(&absolute))
}

/// Removes `.` and resolves `..` lexically: the canonical prefix has no symlinks left, and the missing
/// tail cannot contain any.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The allowlist's locations that must stay outside the sandbox: the path as configured (its directory
/// resolved: a sandbox that can replace a symlink can redirect it) and, if it is a symlink, its target.
pub fn allowlist_locations(allowlist: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let as_named = match (allowlist.parent(), allowlist.file_name()) {
        (Some(parent), Some(name)) => canonicalize_lenient(parent)?.join(name),
        _ => canonicalize_lenient(allowlist)?,
    };
    out.push(as_named);
    let target = canonicalize_lenient(allowlist)?;
    if !out.contains(&target) {
        out.push(target);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn table() {
        let home = p("/home/me");
        let list = vec![p("/home/me/.config/agent-sandbox/allowed-hosts")];
        let cases: &[(&str, bool)] = &[
            ("/home/me", false),
            ("/home", false),
            ("/", false),
            ("/home/me/.config", false),
            ("/home/me/.config/agent-sandbox", false),
            ("/home/me/src/project", true),
            ("/home/me/src", true),
            ("/home/meow", true),
            ("/tmp/x", true),
            ("/home/me/.config/other", true),
        ];
        for (dir, ok) in cases {
            assert_eq!(check(Path::new(dir), &home, &list).is_ok(), *ok, "{dir}");
        }
        assert_eq!(check(&home, &home, &list), Err(Refusal::Home(home.clone())));
        assert!(matches!(
            check(Path::new("/"), &home, &list),
            Err(Refusal::ParentOfHome { .. })
        ));
        // An allowlist kept in a project (AGENT_SANDBOX_ALLOWLIST) refuses that project and its parents.
        let inside = vec![p("/work/proj/conf/allowed")];
        assert!(matches!(
            check(Path::new("/work/proj"), &home, &inside),
            Err(Refusal::ContainsAllowlist { .. })
        ));
        assert!(check(Path::new("/work/proj/src"), &home, &inside).is_ok());
    }

    #[test]
    fn lenient_canonicalisation_resolves_symlinks_and_keeps_missing_tails() {
        let tmp = std::env::temp_dir().join(format!("as-workdir-test-{}", std::process::id()));
        let real = tmp.join("real");
        std::fs::create_dir_all(&real).unwrap();
        let link = tmp.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real = real.canonicalize().unwrap();
        assert_eq!(canonicalize_lenient(&link).unwrap(), real);
        assert_eq!(
            canonicalize_lenient(&link.join("missing/./a/../b")).unwrap(),
            real.join("missing/b")
        );
        // A symlinked allowlist is guarded at both ends.
        let target = real.join("list");
        std::fs::write(&target, "").unwrap();
        let named = tmp.join("named");
        std::fs::create_dir_all(&named).unwrap();
        let named_link = named.join("allowed-hosts");
        let _ = std::fs::remove_file(&named_link);
        std::os::unix::fs::symlink(&target, &named_link).unwrap();
        let locations = allowlist_locations(&named_link).unwrap();
        assert_eq!(
            locations,
            [named.canonicalize().unwrap().join("allowed-hosts"), target]
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
