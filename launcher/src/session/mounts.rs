//! Step 4's check before the command starts: the sandbox container, created and not yet started, has
//! exactly the mounts the launcher asked for ([`args::sandbox_mounts`]).
//!
//! podman's own configuration can add mounts to every container: `volumes` and `mounts` under
//! `[containers]` in a containers.conf (the system's, the user's, or `$CONTAINERS_CONF`). A line there
//! such as `volumes = ["/home/me:/home/me"]` would show the user's home in every sandbox, against the
//! one promise that only the project is visible. So the container is created, `podman container
//! inspect` is read, and anything else (another host path, a volume, a tmpfs, one of ours from another
//! source or writable where it was asked read-only, one of ours missing) stops the session with the
//! list and where to remove it. What mounts.conf adds at start (`/run/secrets` from the host's
//! subscription files) is not in the inspect; `agent-sandbox doctor` reports it from inside.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context as _;

use crate::podman::args::{self, SandboxMount};
use crate::podman::json::{ContainerInspect, InspectMount};
use crate::podman::{Podman, SandboxSpec};

/// Creates the sandbox container of `spec` and refuses it (it is left to the session's cleanup,
/// which removes the pod) unless it has exactly the mounts asked for.
pub(super) fn create_checked(podman: &Podman, spec: &SandboxSpec) -> anyhow::Result<()> {
    podman
        .run(&args::sandbox_create(spec))
        .context("creating the sandbox container")?;
    let json = podman
        .run(&args::container_inspect(&spec.name))
        .context("reading the sandbox container's mounts")?;
    let inspect = ContainerInspect::parse(&json)?;
    let problems = problems(&args::sandbox_mounts(spec), &inspect);
    if !problems.is_empty() {
        anyhow::bail!(
            "refusing to start the sandbox: podman would give it mounts the launcher did not ask \
             for:\n{}\nThey come from podman's configuration: `volumes` or `mounts` under \
             [containers] in containers.conf ($CONTAINERS_CONF, ~/.config/containers/, \
             /etc/containers/, /usr/share/containers/; `podman --log-level=debug info` names the \
             files it merged). Remove them there: the sandbox must see the project and nothing else of this \
             machine",
            problems
                .iter()
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}

/// Every way the inspected mounts differ from `expected`, one line each.
fn problems(expected: &[SandboxMount], got: &ContainerInspect) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let asked = |destination: &Path| expected.iter().find(|e| e.destination() == destination);
    for m in &got.mounts {
        let matches = match asked(&m.destination) {
            Some(SandboxMount::Bind {
                source, writable, ..
            }) => m.kind == "bind" && same_path(&m.source, source) && (*writable || !m.rw),
            Some(SandboxMount::Volume { name, .. }) => m.kind == "volume" && m.name == *name,
            Some(SandboxMount::Tmpfs { .. }) => m.kind == "tmpfs",
            None => false,
        };
        if matches && seen.insert(m.destination.clone()) {
            continue;
        }
        out.push(describe(m));
    }
    let mut tmpfs: Vec<_> = got.host_config.tmpfs.keys().collect();
    tmpfs.sort();
    for destination in tmpfs {
        if matches!(asked(destination), Some(SandboxMount::Tmpfs { .. }))
            && (seen.insert(destination.clone())
                || got.mounts.iter().any(|m| &m.destination == destination))
        {
            continue;
        }
        out.push(format!("a tmpfs at {}", destination.display()));
    }
    for e in expected {
        if !seen.contains(e.destination()) {
            out.push(format!(
                "{} is missing (asked for: {e:?})",
                e.destination().display()
            ));
        }
    }
    out
}

/// One inspected mount, for the user.
fn describe(m: &InspectMount) -> String {
    let access = if m.rw { "read-write" } else { "read-only" };
    match m.kind.as_str() {
        "volume" => format!(
            "volume {} at {} ({access})",
            m.name,
            m.destination.display()
        ),
        "bind" => format!(
            "{} at {} ({access})",
            m.source.display(),
            m.destination.display()
        ),
        kind => format!(
            "a {kind} mount of {} at {} ({access})",
            m.source.display(),
            m.destination.display()
        ),
    }
}

/// The same path as given, or after symbolic links are resolved (podman may report either).
fn same_path(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// What podman 4.3.1 answered for a sandbox created with a covered directory and a covered file,
    /// and a containers.conf with `volumes = ["/srv/extra:/extra:ro"]` (captured, trimmed to the keys
    /// read).
    const INSPECT: &str = r#"[{"Mounts":[
        {"Type":"volume","Name":"home-vol","Source":"/var/lib/containers/storage/volumes/home-vol/_data","Destination":"/home/u","RW":true},
        {"Type":"bind","Source":"/p","Destination":"/p","RW":true},
        {"Type":"bind","Source":"/dev/null","Destination":"/p/key","RW":false},
        {"Type":"bind","Source":"/run/s/hosts","Destination":"/etc/hosts","RW":false},
        {"Type":"bind","Source":"/run/s/resolv","Destination":"/etc/resolv.conf","RW":false},
        {"Type":"bind","Source":"/srv/extra","Destination":"/extra","RW":false}],
        "HostConfig":{"Tmpfs":{"/p/usb":"size=4096,ro,rprivate,nosuid,nodev,notmpcopyup"}}}]"#;

    fn expected() -> Vec<SandboxMount> {
        let bind = |s: &str, d: &str, writable| SandboxMount::Bind {
            source: s.into(),
            destination: d.into(),
            writable,
            volume_opts: Some(":ro"),
        };
        vec![
            bind("/p", "/p", true),
            bind("/dev/null", "/p/key", false),
            SandboxMount::Tmpfs {
                destination: "/p/usb".into(),
            },
            SandboxMount::Volume {
                name: "home-vol".into(),
                destination: "/home/u".into(),
                volume_opts: "",
            },
            bind("/run/s/hosts", "/etc/hosts", false),
            bind("/run/s/resolv", "/etc/resolv.conf", false),
        ]
    }

    #[test]
    fn a_mount_from_podmans_configuration_is_found() {
        let got = ContainerInspect::parse(INSPECT).unwrap();
        assert_eq!(
            problems(&expected(), &got),
            ["/srv/extra at /extra (read-only)"]
        );
    }

    #[test]
    fn exactly_what_was_asked_passes() {
        let mut got = ContainerInspect::parse(INSPECT).unwrap();
        got.mounts.retain(|m| m.destination != Path::new("/extra"));
        assert!(problems(&expected(), &got).is_empty());
    }

    #[test]
    fn ours_changed_or_missing_is_found() {
        let with = |f: &dyn Fn(&mut ContainerInspect)| {
            let mut got = ContainerInspect::parse(INSPECT).unwrap();
            got.mounts.retain(|m| m.destination != Path::new("/extra"));
            f(&mut got);
            problems(&expected(), &got)
        };
        // Another source at one of our destinations; writable where read-only was asked; another
        // volume for the home; an extra tmpfs; the cover of a directory missing; our mount twice.
        let p = with(&|g| g.mounts[3].source = PathBuf::from("/home/me/.ssh"));
        assert_eq!(
            p,
            [
                "/home/me/.ssh at /etc/hosts (read-only)",
                "/etc/hosts is missing (asked for: Bind { source: \"/run/s/hosts\", destination: \"/etc/hosts\", writable: false, volume_opts: Some(\":ro\") })"
            ]
        );
        let p = with(&|g| g.mounts[4].rw = true);
        assert_eq!(p[0], "/run/s/resolv at /etc/resolv.conf (read-write)");
        let p = with(&|g| g.mounts[0].name = "other".into());
        assert_eq!(p[0], "volume other at /home/u (read-write)");
        let p = with(&|g| {
            g.host_config.tmpfs.insert("/tmp".into(), String::new());
        });
        assert_eq!(p, ["a tmpfs at /tmp"]);
        let p = with(&|g| g.host_config.tmpfs.clear());
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("/p/usb is missing"), "{p:?}");
        let p = with(&|g| {
            let again = g.mounts[1].clone();
            g.mounts.push(again);
        });
        assert_eq!(p, ["/p at /p (read-write)"]);
    }

    #[test]
    fn an_answer_of_not_one_container_is_an_error() {
        assert!(ContainerInspect::parse("[]").is_err());
        assert!(ContainerInspect::parse("null").is_err());
        assert!(ContainerInspect::parse("{").is_err());
    }
}
