//! Step 4's check before the command starts: the sandbox container mounts what the launcher asked for
//! ([`args::sandbox_mounts`]), podman's own files and kernel file systems, and nothing else.
//!
//! podman's configuration can add mounts to every container: `volumes` in a containers.conf (the
//! system's, the user's, or `$CONTAINERS_CONF`), including `:O` overlays that `podman container
//! inspect` never lists; the files a mounts.conf copies to `/run/secrets` (the host's subscription
//! certificates, on RHEL); `devices`. A line such as `volumes = ["/home/me:/home/me"]` would show the
//! user's home in every sandbox, against the one promise that only the project is visible. So the
//! container is created and initialised (`podman init` prepares its mounts and writes the OCI
//! configuration the runtime will run), that `config.json` is read, and anything it would mount beyond
//! the allowed set stops the session with the list and where to remove it. Only then is it started.
//!
//! The allowed set, by destination:
//! - ours: the same source (a volume: its `_data` directory) and, for a tmpfs cover, a tmpfs;
//! - `/proc`, `/sys`, `/sys/fs/cgroup`, `/dev`, `/dev/pts`, `/dev/mqueue`, `/dev/shm`: the kernel file
//!   system podman mounts there, never as a bind (and rootless podman 4.5 and later: the host's `/sys`,
//!   read-only, at `/sys`);
//! - the files podman writes for this container, each from its own name in this container's
//!   `userdata` directory of podman's storage (`/dev/shm`: the pod's infra container's):
//!   `/etc/hostname`, `/run/.containerenv`, `/etc/passwd`, `/etc/group`, `/etc/localtime` (`tz`),
//!   `/dev/shm`, and `/run/secrets` while it is empty;
//! - `/run/podman-init`: the init binary `--init` asks for (catatonit, tini or dumb-init), read-only.
//!
//! And no device node beyond the runtime's defaults.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::podman::args::{self, SandboxMount};
use crate::podman::json::{ContainerInspect, OciConfig, OciMount};
use crate::podman::{Podman, SandboxSpec, UserMapping};

/// The most of a container's `config.json` read (a real one is a few KiB).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Kernel file systems podman mounts, with their destination.
const KERNEL_MOUNTS: &[(&str, &[&str])] = &[
    ("/proc", &["proc"]),
    ("/sys", &["sysfs"]),
    ("/sys/fs/cgroup", &["cgroup", "cgroup2"]),
    ("/dev", &["tmpfs"]),
    ("/dev/pts", &["devpts"]),
    ("/dev/mqueue", &["mqueue"]),
    ("/dev/shm", &["tmpfs"]),
];

/// Files podman writes for a container, where they show and their path in its `userdata` directory.
const PODMAN_FILES: &[(&str, &str)] = &[
    ("/etc/hostname", "hostname"),
    ("/run/.containerenv", ".containerenv"),
    ("/etc/passwd", "passwd"),
    ("/etc/group", "group"),
    ("/etc/localtime", "localtime"),
    ("/dev/shm", "shm"),
    ("/run/secrets", "run/secrets"),
];

/// Where `--init`'s binary is bound, and the names it may have.
const INIT_PATH: &str = "/run/podman-init";
const INIT_NAMES: &[&str] = &["catatonit", "tini", "tini-static", "dumb-init"];

/// What the check knows of the container: its id and the directories of podman's storage that hold
/// containers (`…/overlay-containers` under the storage root and the run root).
#[derive(Debug)]
struct Container {
    id: String,
    stores: Vec<PathBuf>,
}

impl Container {
    /// Where podman keeps the container `id` by its storage's layout (`<root>/<driver>-containers/<id>`
    /// under the graph root and the run root, as `podman info` names them), and its `config.json`
    /// there. None for an id that is not one.
    fn from_stores(id: &str, stores: &[PathBuf]) -> Option<(Container, PathBuf)> {
        let config = stores.first()?.join(id).join("userdata/config.json");
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| {
            let container = Container {
                id: id.to_owned(),
                stores: stores.to_vec(),
            };
            (container, config)
        })
    }

    fn from_inspect(inspect: &ContainerInspect) -> anyhow::Result<Container> {
        let store_of = |path: &Path| -> Option<PathBuf> {
            let userdata = path.parent()?;
            let id = userdata.parent()?;
            (userdata.file_name()? == "userdata" && id.file_name()? == OsStr::new(&inspect.id))
                .then(|| id.parent().map(Path::to_owned))?
        };
        let stores: Vec<_> = [&inspect.oci_config_path, &inspect.hostname_path]
            .into_iter()
            .filter_map(|p| store_of(p))
            .collect();
        anyhow::ensure!(
            inspect.id.len() == 64 && !stores.is_empty(),
            "podman container inspect did not say where the sandbox container's files are (id {:?}, \
             {})",
            inspect.id,
            inspect.oci_config_path.display()
        );
        Ok(Container {
            id: inspect.id.clone(),
            stores,
        })
    }

    /// Whether `source` is `<store>/<id>/userdata/<file>` for one of the stores, with this
    /// container's id (any container's, when `any_container`: the pod's infra container's `/dev/shm`).
    fn holds(&self, source: &Path, file: &str, any_container: bool) -> bool {
        self.stores.iter().any(|store| {
            let Ok(rest) = source.strip_prefix(store) else {
                return false;
            };
            let parts: Vec<&OsStr> = rest.iter().collect();
            let id_ok = parts.first().is_some_and(|id| {
                let id = id.to_string_lossy();
                if any_container {
                    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
                } else {
                    id == self.id
                }
            });
            let file_parts: Vec<&OsStr> = Path::new(file).iter().collect();
            id_ok
                && parts.get(1) == Some(&OsStr::new("userdata"))
                && parts.get(2..) == Some(&file_parts[..])
        })
    }
}

/// Creates and initialises the sandbox container of `spec`, and refuses it (it is left to the session's
/// cleanup, which removes the pod) unless its OCI configuration mounts only what is allowed.
///
/// `stores` are where podman keeps containers by its storage's layout (`checks::HostInfo`): the
/// configuration is read from there, and only when it is not there (another layout, a transient
/// store) is podman asked where it is (`podman container inspect`, a tenth of a second rootless).
pub(super) fn create_checked(
    podman: &Podman,
    spec: &SandboxSpec,
    stores: &[PathBuf],
) -> anyhow::Result<()> {
    let created = podman
        .run(&args::sandbox_create(spec))
        .context("creating the sandbox container")?;
    podman
        .run(&args::container_init(&spec.name))
        .context("initialising the sandbox container")?;
    // Rootless, the container's storage belongs to its user namespace's users: read it from there.
    let storage = HostStorage {
        podman,
        rootless: spec.user == UserMapping::KeepId,
    };
    let id = created.lines().map(str::trim).rfind(|l| !l.is_empty());
    let read = id
        .and_then(|id| Container::from_stores(id, stores))
        .and_then(|(c, path)| storage.read(&path, MAX_CONFIG_BYTES).ok().map(|b| (c, b)));
    let (container, bytes) = match read {
        Some(read) => read,
        None => {
            let json = podman
                .run(&args::container_inspect(&spec.name))
                .context("finding the sandbox container's configuration")?;
            let inspect = ContainerInspect::parse(&json)?;
            let container = Container::from_inspect(&inspect)?;
            let path = inspect.oci_config_path;
            let bytes = storage
                .read(&path, MAX_CONFIG_BYTES)
                .with_context(|| format!("reading the sandbox's {}", path.display()))?;
            (container, bytes)
        }
    };
    let config = OciConfig::parse(&String::from_utf8_lossy(&bytes))?;
    let problems = problems(&args::sandbox_mounts(spec), &container, &config, &storage);
    if !problems.is_empty() {
        anyhow::bail!(
            "refusing to start the sandbox: podman would give it mounts, devices, host namespaces or \
             hooks the launcher did not ask for:\n{}\nThey come from podman's configuration: `volumes` (`:O` overlays \
             included), `devices`, `init_path` or `pidns`/`netns`/`ipcns` under [containers], or \
             `hooks_dir` under [engine], in containers.conf \
             ($CONTAINERS_CONF, ~/.config/containers/, /etc/containers/, /usr/share/containers/; \
             `podman --log-level=debug info` names the files it merged), or a mounts.conf (only the \
             first of ~/.config/containers/mounts.conf for rootless podman, \
             /etc/containers/mounts.conf and /usr/share/containers/mounts.conf is read, so an empty one \
             earlier in that list overrides the packaged one). Remove them there: the sandbox must see \
             the project and nothing else of this machine",
            problems
                .iter()
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}

/// What the check reads of podman's storage on the host.
trait Storage {
    /// Whether a directory holds nothing but (at most) an empty regular file named `system-fips`.
    fn only_fips_marker(&self, dir: &Path) -> std::io::Result<bool>;
    /// A file's first `max` bytes (fewer if it is shorter).
    fn read(&self, file: &Path, max: u64) -> std::io::Result<Vec<u8>>;
}

/// The real storage: read directly when rootful, through `podman unshare` when rootless (the files
/// belong to the user namespace's users).
struct HostStorage<'a> {
    podman: &'a Podman,
    rootless: bool,
}

impl Storage for HostStorage<'_> {
    fn only_fips_marker(&self, dir: &Path) -> std::io::Result<bool> {
        if self.rootless {
            return self
                .podman
                .run(&args::unshare_find_not_fips_marker(dir))
                .map(|found| found.trim().is_empty())
                .map_err(std::io::Error::other);
        }
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = std::fs::symlink_metadata(entry.path())?;
            if entry.file_name() != "system-fips" || !meta.is_file() || meta.len() != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn read(&self, file: &Path, max: u64) -> std::io::Result<Vec<u8>> {
        if self.rootless {
            return self
                .podman
                .run(&args::unshare_read(file, max))
                .map(String::into_bytes)
                .map_err(std::io::Error::other);
        }
        let mut out = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(std::fs::File::open(file)?, max),
            &mut out,
        )?;
        Ok(out)
    }
}

/// Every way `config` differs from the allowed set, one line each; `storage` reads what podman wrote
/// (/run/secrets, /etc/localtime; what cannot be read is not taken as harmless).
fn problems(
    expected: &[SandboxMount],
    container: &Container,
    config: &OciConfig,
    storage: &dyn Storage,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for m in &config.mounts {
        let ours = expected
            .iter()
            .find(|e| e.destination() == m.destination)
            .is_some_and(|e| is_ours(e, m));
        if ours {
            if seen.insert(m.destination.clone()) {
                continue;
            }
            out.push(describe(m, "a second time"));
            continue;
        }
        if let Some(reason) = podmans_own(m, container, storage) {
            match reason {
                Ok(()) => continue,
                Err(why) => {
                    out.push(describe(m, why));
                    continue;
                }
            }
        }
        out.push(describe(m, "not asked for"));
    }
    for e in expected {
        if !seen.contains(e.destination()) {
            out.push(format!(
                "{} is missing (asked for: {e:?})",
                e.destination().display()
            ));
        }
    }
    // The same line twice says nothing more (rootless podman binds a device node once per request).
    let mut said = HashSet::new();
    out.retain(|line| said.insert(line.clone()));
    if !config.linux.devices.is_empty() {
        let paths: Vec<String> = config
            .linux
            .devices
            .iter()
            .map(|d| d["path"].as_str().unwrap_or("?").to_owned())
            .collect();
        out.push(format!("device nodes: {}", paths.join(", ")));
    }
    // A kind of namespace the configuration does not list is the host's. The pod gives the network,
    // IPC and UTS namespaces (joined: with a path); process IDs and mounts must be the container's own.
    let ns = |kind: &str| config.linux.namespaces.iter().find(|n| n.kind == kind);
    for kind in ["pid", "mount", "network", "ipc"] {
        match ns(kind) {
            None => out.push(format!("the host's {kind} namespace")),
            Some(n) if !n.path.is_empty() && matches!(kind, "pid" | "mount") => {
                out.push(format!("the {kind} namespace of {}", n.path));
            }
            Some(_) => {}
        }
    }
    let mut stages: Vec<_> = config
        .hooks
        .iter()
        .filter(|(_, hooks)| hooks.as_ref().is_some_and(|h| !h.is_empty()))
        .collect();
    stages.sort_by_key(|(stage, _)| stage.as_str());
    for (stage, hooks) in stages {
        let paths: Vec<&str> = hooks
            .iter()
            .flatten()
            .map(|h| h["path"].as_str().unwrap_or("?"))
            .collect();
        out.push(format!(
            "OCI hooks run on this machine at {stage}: {}",
            paths.join(", ")
        ));
    }
    out
}

/// Whether `m` is the mount `e` asks for.
fn is_ours(e: &SandboxMount, m: &OciMount) -> bool {
    let read_only = m.options.iter().any(|o| o == "ro");
    match e {
        SandboxMount::Bind {
            source, writable, ..
        } => m.kind == "bind" && same_path(&m.source, source) && (*writable || read_only),
        SandboxMount::Volume { name, .. } => {
            m.kind == "bind"
                && m.source
                    .ends_with(Path::new("volumes").join(name).join("_data"))
                && m.source.file_name() == Some(OsStr::new("_data"))
        }
        SandboxMount::Tmpfs { .. } => m.kind == "tmpfs" && read_only,
    }
}

/// None: `m` is none of podman's own mounts. Some(Ok): it is one. Some(Err): it is at the place of
/// one but not what podman puts there (why).
fn podmans_own(
    m: &OciMount,
    container: &Container,
    storage: &dyn Storage,
) -> Option<Result<(), &'static str>> {
    let destination = m.destination.to_str()?;
    let read_only = m.options.iter().any(|o| o == "ro");
    let bind = m.kind == "bind" || m.options.iter().any(|o| o == "bind" || o == "rbind");
    if !bind
        && KERNEL_MOUNTS
            .iter()
            .any(|(d, kinds)| *d == destination && kinds.contains(&m.kind.as_str()))
    {
        return Some(Ok(()));
    }
    // Rootless podman 4.5 and later binds the host's /sys read-only into a container that shares its
    // pod's user and network namespaces.
    if destination == "/sys" && m.kind == "bind" && m.source == Path::new("/sys") && read_only {
        return Some(Ok(()));
    }
    if destination == INIT_PATH {
        let named = m
            .source
            .file_name()
            .and_then(OsStr::to_str)
            .is_some_and(|n| INIT_NAMES.contains(&n));
        return Some(if m.kind == "bind" && read_only && named {
            Ok(())
        } else {
            Err("not a read-only init binary (catatonit, tini or dumb-init): see init_path in containers.conf")
        });
    }
    let (_, file) = PODMAN_FILES.iter().find(|(d, _)| *d == destination)?;
    if m.kind != "bind" || !container.holds(&m.source, file, destination == "/dev/shm") {
        return Some(Err("not the file podman writes there"));
    }
    if destination == "/run/secrets" {
        // On a FIPS host older podman puts an empty `system-fips` marker there; anything else is a copy
        // of this machine's files.
        return Some(match storage.only_fips_marker(&m.source) {
            Ok(true) => Ok(()),
            Ok(false) => Err("holding files a mounts.conf copied from this machine"),
            Err(_) => Err("which cannot be read to tell it is empty"),
        });
    }
    // `tz` in containers.conf: a copy of a zone file (podman 4.3 would copy any file a `tz` with `..`
    // named).
    if destination == "/etc/localtime" {
        return Some(match storage.read(&m.source, 4) {
            Ok(magic) if magic == b"TZif" => Ok(()),
            _ => Err("not a time zone file"),
        });
    }
    Some(Ok(()))
}

/// One mount of the configuration, for the user.
fn describe(m: &OciMount, why: &str) -> String {
    let access = if m.options.iter().any(|o| o == "ro") {
        "read-only"
    } else {
        "read-write"
    };
    format!(
        "{} at {} ({}, {access}): {why}",
        m.source.display(),
        m.destination.display(),
        m.kind
    )
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

    const ID: &str = "c371764706c4188e0f198195c57be1df108835fd54e1393b4e6c03dcb4decf29";
    const INFRA: &str = "119a99f242d0ddc386878b6df496d90c40db615bb1f6e3ea3596f67bbfb15df6";

    /// The mounts of a rootful sandbox's config.json as podman 4.3.1 wrote it (captured; the session
    /// paths shortened), with a covered directory and a covered file added.
    fn config() -> String {
        let m = |d: &str, t: &str, s: &str, o: &str| {
            format!(
                r#"{{"destination":"{d}","type":"{t}","source":"{s}","options":[{}]}}"#,
                o.split(',')
                    .map(|x| format!("\"{x}\""))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        let store = "/var/lib/containers/storage/overlay-containers";
        let run = "/run/containers/storage/overlay-containers";
        let mounts = [
            m("/proc", "proc", "proc", "nosuid,noexec,nodev"),
            m(
                "/root",
                "bind",
                "/var/lib/containers/storage/volumes/home-vol/_data",
                "rw,rprivate,nosuid,nodev,rbind",
            ),
            m("/sys", "sysfs", "sysfs", "nosuid,noexec,nodev,ro"),
            m(
                "/dev",
                "tmpfs",
                "tmpfs",
                "nosuid,noexec,strictatime,mode=755,size=65536k",
            ),
            m(
                "/etc/resolv.conf",
                "bind",
                "/run/s/resolv.conf",
                "ro,rprivate,rbind",
            ),
            m(
                "/run/podman-init",
                "bind",
                "/usr/libexec/podman/catatonit",
                "bind,ro,rprivate",
            ),
            m("/etc/hosts", "bind", "/run/s/hosts", "ro,rprivate,rbind"),
            m(
                "/dev/pts",
                "devpts",
                "devpts",
                "nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5",
            ),
            m("/dev/mqueue", "mqueue", "mqueue", "nosuid,noexec,nodev"),
            m("/p", "bind", "/p", "rbind,rw,rprivate"),
            m("/p/usb", "tmpfs", "tmpfs", "ro,size=4096,mode=0555"),
            m("/p/key", "bind", "/dev/null", "ro,rprivate,rbind"),
            m(
                "/dev/shm",
                "bind",
                &format!("{store}/{INFRA}/userdata/shm"),
                "bind,rprivate,nosuid,noexec,nodev",
            ),
            m(
                "/run/.containerenv",
                "bind",
                &format!("{run}/{ID}/userdata/.containerenv"),
                "bind,rprivate",
            ),
            m(
                "/etc/hostname",
                "bind",
                &format!("{run}/{ID}/userdata/hostname"),
                "bind,rprivate",
            ),
            m(
                "/sys/fs/cgroup",
                "cgroup",
                "cgroup",
                "rprivate,nosuid,noexec,nodev,relatime,ro",
            ),
        ];
        // The namespaces as podman 4.3.1 wrote them for a rootful sandbox (the pod's infra is pid 1).
        format!(
            r#"{{"mounts":[{}],"linux":{{"devices":null,"namespaces":[{{"type":"pid"}},
                {{"type":"network","path":"/proc/1/ns/net"}},{{"type":"ipc","path":"/proc/1/ns/ipc"}},
                {{"type":"uts","path":"/proc/1/ns/uts"}},{{"type":"mount"}}]}}}}"#,
            mounts.join(",")
        )
    }

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
                destination: "/root".into(),
                volume_opts: "",
            },
            bind("/run/s/hosts", "/etc/hosts", false),
            bind("/run/s/resolv.conf", "/etc/resolv.conf", false),
        ]
    }

    fn container() -> Container {
        Container {
            id: ID.into(),
            stores: vec![
                "/var/lib/containers/storage/overlay-containers".into(),
                "/run/containers/storage/overlay-containers".into(),
            ],
        }
    }

    /// Storage whose /run/secrets and /etc/localtime say what the test wants.
    struct Fake {
        fips_marker_only: Option<bool>,
        magic: &'static [u8],
    }

    impl Storage for Fake {
        fn only_fips_marker(&self, _: &Path) -> std::io::Result<bool> {
            self.fips_marker_only
                .ok_or_else(|| std::io::Error::other("denied"))
        }
        fn read(&self, _: &Path, _: u64) -> std::io::Result<Vec<u8>> {
            Ok(self.magic.to_vec())
        }
    }

    const CLEAN: Fake = Fake {
        fips_marker_only: Some(true),
        magic: b"TZif",
    };

    fn check(config: &OciConfig) -> Vec<String> {
        problems(&expected(), &container(), config, &CLEAN)
    }

    fn with(f: impl Fn(&mut OciConfig)) -> Vec<String> {
        let mut c = OciConfig::parse(&config()).unwrap();
        f(&mut c);
        check(&c)
    }

    fn mount(d: &str, t: &str, s: &str, o: &[&str]) -> OciMount {
        OciMount {
            destination: d.into(),
            kind: t.into(),
            source: s.into(),
            options: o.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn a_real_sandbox_passes() {
        assert_eq!(with(|_| {}), Vec::<String>::new());
    }

    #[test]
    fn what_podmans_configuration_adds_is_found() {
        // A containers.conf volume, an `:O` overlay (never in `podman container inspect`), a device.
        let p = with(|c| {
            c.mounts
                .push(mount("/extra", "bind", "/srv/extra", &["ro", "rbind"]))
        });
        assert_eq!(p, ["/srv/extra at /extra (bind, read-only): not asked for"]);
        let p = with(|c| {
            c.mounts.push(mount(
                "/sec",
                "overlay",
                "overlay",
                &["lowerdir=/home/me/secret"],
            ))
        });
        assert_eq!(p, ["overlay at /sec (overlay, read-write): not asked for"]);
        let p = with(|c| {
            c.linux.devices = vec![serde_json::json!({"path": "/dev/vda", "type": "b"})];
        });
        assert_eq!(p, ["device nodes: /dev/vda"]);
        // mounts.conf: /run/secrets from the container's storage, empty or not.
        let mut c = OciConfig::parse(&config()).unwrap();
        c.mounts.push(mount(
            "/run/secrets",
            "bind",
            &format!("/var/lib/containers/storage/overlay-containers/{ID}/userdata/run/secrets"),
            &["bind", "rprivate"],
        ));
        let secrets = |fips_marker_only| {
            problems(
                &expected(),
                &container(),
                &c,
                &Fake {
                    fips_marker_only,
                    magic: b"TZif",
                },
            )
        };
        assert!(secrets(Some(true)).is_empty());
        let p = secrets(Some(false));
        assert_eq!(p.len(), 1);
        assert!(p[0].ends_with("holding files a mounts.conf copied from this machine"));
    }

    #[test]
    fn ours_or_podmans_changed_is_found() {
        // Another source at one of our destinations, or at one of podman's own files.
        let p = with(|c| c.mounts[6].source = PathBuf::from("/home/me/.ssh/config"));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].starts_with("/home/me/.ssh/config at /etc/hosts"),
            "{p:?}"
        );
        assert!(p[1].starts_with("/etc/hosts is missing"), "{p:?}");
        let p = with(|c| c.mounts[14].source = PathBuf::from("/home/me/hostname"));
        assert_eq!(
            p,
            ["/home/me/hostname at /etc/hostname (bind, read-write): not the file podman writes there"]
        );
        let p = with(|c| {
            c.mounts[14].source =
                PathBuf::from(format!("/var/lib/containers/storage/overlay-containers/{ID}/userdata/../../../../../../home"));
        });
        assert_eq!(p.len(), 1, "{p:?}");
        // Writable where read-only was asked; a volume of another name; a cover that is no tmpfs.
        assert_eq!(
            with(|c| c.mounts[4].options = vec!["rbind".into()]).len(),
            2
        );
        assert_eq!(
            with(|c| c.mounts[1].source = "/var/lib/containers/storage/volumes/other/_data".into())
                .len(),
            2
        );
        assert_eq!(with(|c| c.mounts[10].kind = "bind".into()).len(), 2);
        // A kernel file system at another place, and ours twice.
        let p = with(|c| c.mounts.push(mount("/mnt", "tmpfs", "tmpfs", &[])));
        assert_eq!(p, ["tmpfs at /mnt (tmpfs, read-write): not asked for"]);
        let p = with(|c| {
            let again = c.mounts[9].clone();
            c.mounts.push(again);
        });
        assert_eq!(p, ["/p at /p (bind, read-write): a second time"]);
        // A /run/secrets that cannot be read is not taken as empty.
        let mut c = OciConfig::parse(&config()).unwrap();
        c.mounts.push(mount(
            "/run/secrets",
            "bind",
            &format!("/run/containers/storage/overlay-containers/{ID}/userdata/run/secrets"),
            &[],
        ));
        let p = problems(
            &expected(),
            &container(),
            &c,
            &Fake {
                fips_marker_only: None,
                magic: b"TZif",
            },
        );
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn podmans_files_are_told_by_container_and_name() {
        let store = "/var/lib/containers/storage/overlay-containers";
        let run = "/run/containers/storage/overlay-containers";
        let at = |d: &str, source: String| {
            with(move |c| {
                c.mounts.retain(|m| m.destination != Path::new(d));
                c.mounts
                    .push(mount(d, "bind", &source, &["bind", "rprivate"]));
            })
        };
        // podman's own: its name in this container's userdata, under either root.
        assert!(at("/etc/passwd", format!("{store}/{ID}/userdata/passwd")).is_empty());
        assert!(at("/etc/group", format!("{run}/{ID}/userdata/group")).is_empty());
        assert!(at("/etc/localtime", format!("{run}/{ID}/userdata/localtime")).is_empty());
        // A mounts.conf copy of a host file at /etc/group (userdata/etc/group); another container's
        // files; the same shape outside podman's storage; a way out of it.
        for (d, source) in [
            ("/etc/group", format!("{run}/{ID}/userdata/etc/group")),
            ("/etc/hostname", format!("{run}/{INFRA}/userdata/hostname")),
            (
                "/etc/passwd",
                format!("/home/me/x-containers/{ID}/userdata/passwd"),
            ),
            (
                "/etc/passwd",
                format!("{store}/{ID}/userdata/../../../../../../home/me/passwd"),
            ),
            (
                "/dev/shm",
                format!("/home/me/overlay-containers/{INFRA}/userdata/shm"),
            ),
        ] {
            let p = at(d, source.clone());
            assert_eq!(p.len(), 1, "{source}: {p:?}");
            assert!(p[0].ends_with("not the file podman writes there"), "{p:?}");
        }
    }

    #[test]
    fn kernel_file_systems_and_the_init_binary_are_told_by_their_shape() {
        // Rootless podman 4.5 and later: the host's /sys, read-only.
        let sys = |options: &[&str]| {
            with(|c| {
                c.mounts.retain(|m| m.destination != Path::new("/sys"));
                c.mounts.push(mount("/sys", "bind", "/sys", options));
            })
        };
        assert!(sys(&["rprivate", "nosuid", "noexec", "nodev", "ro", "rbind"]).is_empty());
        assert_eq!(sys(&["rbind"]).len(), 1);
        // A "sysfs" that is a bind of a host directory.
        let p = with(|c| {
            c.mounts.retain(|m| m.destination != Path::new("/sys"));
            c.mounts
                .push(mount("/sys", "sysfs", "/home/me", &["rbind"]));
        });
        assert_eq!(p, ["/home/me at /sys (sysfs, read-write): not asked for"]);
        // init_path naming another program.
        let p = with(|c| c.mounts[5].source = "/home/me/run.sh".into());
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("see init_path"), "{p:?}");
        assert!(with(|c| c.mounts[5].source = "/usr/bin/tini".into()).is_empty());
    }

    #[test]
    fn host_namespaces_hooks_and_other_zone_files_are_found() {
        // pidns = "host": no pid entry (rootful keeps a plain /proc mount); another container's.
        let p = with(|c| c.linux.namespaces.retain(|n| n.kind != "pid"));
        assert_eq!(p, ["the host's pid namespace"]);
        let p = with(|c| c.linux.namespaces[0].path = "/proc/7/ns/pid".into());
        assert_eq!(p, ["the pid namespace of /proc/7/ns/pid"]);
        let p = with(|c| c.linux.namespaces.retain(|n| n.kind != "network"));
        assert_eq!(p, ["the host's network namespace"]);
        // An OCI hook (hooks_dir), however podman found it.
        let mut c = OciConfig::parse(&config()).unwrap();
        c.hooks.insert(
            "createRuntime".into(),
            Some(vec![
                serde_json::json!({"path": "/usr/bin/nvidia-container-toolkit"}),
            ]),
        );
        c.hooks.insert("poststop".into(), Some(Vec::new()));
        assert_eq!(
            check(&c),
            ["OCI hooks run on this machine at createRuntime: /usr/bin/nvidia-container-toolkit"]
        );
        // /etc/localtime (tz): a zone file passes, anything else copied there does not.
        let mut c = OciConfig::parse(&config()).unwrap();
        c.mounts.push(mount(
            "/etc/localtime",
            "bind",
            &format!("/run/containers/storage/overlay-containers/{ID}/userdata/localtime"),
            &["bind"],
        ));
        assert!(check(&c).is_empty());
        let key = Fake {
            fips_marker_only: Some(true),
            magic: b"-----",
        };
        let p = problems(&expected(), &container(), &c, &key);
        assert_eq!(p.len(), 1);
        assert!(p[0].ends_with("not a time zone file"), "{p:?}");
    }

    #[test]
    fn the_containers_stores_come_from_its_own_paths() {
        let inspect = ContainerInspect::parse(&format!(
            r#"[{{"Id":"{ID}","OCIConfigPath":"/var/lib/containers/storage/overlay-containers/{ID}/userdata/config.json",
                "HostnamePath":"/run/containers/storage/overlay-containers/{ID}/userdata/hostname"}}]"#
        ))
        .unwrap();
        let c = Container::from_inspect(&inspect).unwrap();
        assert_eq!(c.stores, container().stores);
        // The same from `podman info`'s layout and the id `podman create` printed.
        let (c, config) = Container::from_stores(ID, &container().stores).unwrap();
        assert_eq!((c.id.as_str(), &c.stores), (ID, &container().stores));
        assert_eq!(config, inspect.oci_config_path);
        assert!(Container::from_stores("not-an-id", &container().stores).is_none());
        assert!(Container::from_stores(ID, &[]).is_none());
        // Paths that are not this container's own say nothing of where its files are.
        let other = ContainerInspect::parse(&format!(
            r#"[{{"Id":"{ID}","OCIConfigPath":"/tmp/config.json","HostnamePath":""}}]"#
        ))
        .unwrap();
        assert!(Container::from_inspect(&other).is_err());
    }

    #[test]
    fn an_answer_of_not_one_container_is_an_error() {
        assert!(ContainerInspect::parse("[]").is_err());
        assert!(ContainerInspect::parse("null").is_err());
        assert!(ContainerInspect::parse("{").is_err());
        assert_eq!(
            ContainerInspect::parse(r#"[{"OCIConfigPath":"/x/config.json"}]"#)
                .unwrap()
                .oci_config_path,
            PathBuf::from("/x/config.json")
        );
    }
}
