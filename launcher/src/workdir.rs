//! Which directories the sandbox may be given.
//!
//! The project directory is mounted read-write, so launching from `$HOME` (or `/home`, or `/`) would hand
//! the sandbox every dotfile and key, and launching from a directory that holds the allowlist would let
//! it widen its own egress for the next session. The same goes for the other places whose contents
//! steer the host or hold its secrets: the shared temp directories, the user's runtime directory
//! (podman's and D-Bus's sockets), podman's own storage and configuration, the home's hidden
//! directories, and the directory holding this program. These checks run on canonical paths (symlinks
//! resolved) before anything is created.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
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
    /// The directory is, or is inside, a hidden directory of the home (`~/.config`, `~/.ssh`, ...).
    #[error("refusing to run in {dir}: it is inside {hidden}, a hidden directory of your home (configuration, keys and credentials live there), which the sandbox could read and change. cd into a project directory first")]
    HomeDotDir {
        /// The refused directory.
        dir: PathBuf,
        /// The hidden directory of the home it is in.
        hidden: PathBuf,
    },
    /// The directory contains the allowlist, or a symlink followed on the way to it.
    #[error("refusing to run in {dir}: it contains the allowlist or a symlink on the way to it ({allowlist}), which the sandbox could rewrite or re-point to widen its own egress. Run from a directory that does not hold it, or keep the allowlist elsewhere (AGENT_SANDBOX_ALLOWLIST)")]
    ContainsAllowlist {
        /// The refused directory.
        dir: PathBuf,
        /// The allowlist or the symlink, as it resolves.
        allowlist: PathBuf,
    },
    /// The directory is a shared temporary directory, or contains one.
    #[error("refusing to run in {dir}: it is or contains the shared temporary directory {temp}, where other programs and users keep their files. Make a project directory (`mkdir` or `mktemp -d`) and run there")]
    TempDir {
        /// The refused directory.
        dir: PathBuf,
        /// The temporary directory.
        temp: PathBuf,
    },
    /// The directory is, contains or lies inside the user's runtime directory.
    #[error("refusing to run in {dir}: it is, contains or lies inside your runtime directory {runtime}, which holds the sockets of your session (podman, D-Bus, agents). cd into a project directory first")]
    RuntimeDir {
        /// The refused directory.
        dir: PathBuf,
        /// The runtime directory.
        runtime: PathBuf,
    },
    /// The directory is, contains or lies inside podman's storage, configuration or runtime state.
    #[error("refusing to run in {dir}: it is, contains or lies inside {path}, podman's storage, configuration or runtime state, through which the sandbox could change what the next session runs. cd into a project directory first")]
    Podman {
        /// The refused directory.
        dir: PathBuf,
        /// podman's directory or file.
        path: PathBuf,
    },
    /// The directory is, contains or lies inside agent-sandbox's own state: the sign-in token store or
    /// the session directories.
    #[error("refusing to run in {dir}: it is, contains or lies inside {path}, where agent-sandbox keeps the sign-in tokens it adds or each session's router configuration and keys, which the sandbox could read and change. cd into a project directory first")]
    State {
        /// The refused directory.
        dir: PathBuf,
        /// agent-sandbox's directory.
        path: PathBuf,
    },
    /// The directory's path holds a character podman's `--volume` cannot mount: `:` separates its
    /// source, destination and options, and podman refuses a value with more than three parts.
    #[error("cannot run in {dir}: its path contains ':', which podman's --volume takes as a separator, so the project cannot be mounted at the same path. Rename or move the directory so that its path has no ':'")]
    Unmountable {
        /// The refused directory.
        dir: PathBuf,
    },
    /// The directory contains this program.
    #[error("refusing to run in {dir}: it contains the agent-sandbox program {exe}, which the sandbox could replace. Run from a project directory that does not hold it")]
    ContainsLauncher {
        /// The refused directory.
        dir: PathBuf,
        /// The launcher's executable.
        exe: PathBuf,
    },
}

/// The places a project directory must stay clear of. Every path must be canonical (see
/// [`canonicalize_lenient`]); [`check`] only compares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guarded {
    /// Home directories: refused themselves, with their parents and their hidden directories.
    pub homes: Vec<PathBuf>,
    /// The allowlist's locations ([`guarded_locations`]).
    pub allowlist: Vec<Location>,
    /// Shared temporary directories: refused themselves and with every directory containing them.
    pub temp: Vec<PathBuf>,
    /// Runtime directories: refused themselves, inside and with every directory containing them.
    pub runtime: Vec<PathBuf>,
    /// podman's storage, configuration and runtime paths: refused themselves, inside and with every
    /// directory containing them.
    pub podman: Vec<PathBuf>,
    /// agent-sandbox's state: the OAuth token store's directory (`$XDG_STATE_HOME/agent-sandbox`) and
    /// the session directories' fallback root (`agent-sandbox-UID` in a temp directory, when the
    /// runtime directory is unusable): refused themselves, inside and with every directory containing
    /// them.
    pub state: Vec<PathBuf>,
    /// The launcher's executable, canonical, and the locations of the path it was started by (a
    /// symlink to it, say, and every symlink on the way: [`guarded_locations`]), which the sandbox
    /// could otherwise replace.
    pub executables: Vec<Location>,
}

/// A place on the way to a guarded file (the allowlist, the launcher).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The file, or a symlink followed on the way: refused with every directory that is or contains it.
    At(PathBuf),
    /// A directory a `..` leaves on the way: refused with every directory that strictly contains it. A
    /// sandbox can make a directory inside its project a symlink, and `..` would then lead elsewhere;
    /// it cannot re-point the project's own root, so `PROJECT/..` stays the project's parent.
    Left(PathBuf),
}

impl Location {
    /// The path, for messages.
    #[must_use]
    pub fn path(&self) -> &Path {
        match self {
            Location::At(p) | Location::Left(p) => p,
        }
    }

    /// Whether a project at `dir` would hold this place.
    #[must_use]
    pub fn held_by(&self, dir: &Path) -> bool {
        match self {
            Location::At(p) => p.starts_with(dir),
            Location::Left(p) => p.starts_with(dir) && p != dir,
        }
    }
}

impl From<PathBuf> for Location {
    fn from(p: PathBuf) -> Location {
        Location::At(p)
    }
}

/// `a` is `b`, inside it, or contains it.
fn related(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The mount points strictly below `dir` (canonical) in this process's mount table, the topmost of
/// each (one below another is hidden with it), in order.
pub fn mounts_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(mounts_below_in(
        &fs::read("/proc/self/mountinfo")?,
        dir,
        false,
    ))
}

/// [`mounts_below`], and `dir` itself first when something is mounted on it.
pub fn mounts_at_or_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(mounts_below_in(
        &fs::read("/proc/self/mountinfo")?,
        dir,
        true,
    ))
}

/// [`mounts_below`] over the bytes of a `mountinfo` file (not text: the kernel escapes only space,
/// tab, newline and backslash, and a mount point anywhere may hold any other byte).
fn mounts_below_in(mountinfo: &[u8], dir: &Path, with_dir: bool) -> Vec<PathBuf> {
    let mut below: Vec<PathBuf> = mountinfo
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(unescape_mount_point)
        .filter(|point| (with_dir || point != dir) && point.starts_with(dir))
        .collect();
    below.sort();
    below.dedup();
    let mut topmost: Vec<PathBuf> = Vec::new();
    for point in below {
        if !topmost.iter().any(|t| point.starts_with(t)) {
            topmost.push(point);
        }
    }
    topmost
}

/// A mount point as the kernel writes it in `mountinfo`: space, tab, newline and backslash as octal
/// escapes (`\040`).
fn unescape_mount_point(bytes: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(value) = escaped {
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(<OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// Refuses `dir` if it comes too close to anything in `guarded` (see [`Guarded`]).
///
/// Every path must already be canonical (see [`canonicalize_lenient`]); this function only compares.
pub fn check(dir: &Path, guarded: &Guarded) -> Result<(), Refusal> {
    let refuse_dir = || dir.to_owned();
    // Before anything is created: podman would refuse the mount only at the last step of a start.
    if dir.as_os_str().as_bytes().contains(&b':') {
        return Err(Refusal::Unmountable { dir: refuse_dir() });
    }
    for home in &guarded.homes {
        if dir == home {
            return Err(Refusal::Home(refuse_dir()));
        }
        if home.starts_with(dir) {
            return Err(Refusal::ParentOfHome {
                dir: refuse_dir(),
                home: home.clone(),
            });
        }
        if let Ok(below) = dir.strip_prefix(home) {
            if let Some(Component::Normal(first)) = below.components().next() {
                if first.as_bytes().starts_with(b".") {
                    return Err(Refusal::HomeDotDir {
                        dir: refuse_dir(),
                        hidden: home.join(first),
                    });
                }
            }
        }
    }
    if let Some(a) = guarded.allowlist.iter().find(|a| a.held_by(dir)) {
        return Err(Refusal::ContainsAllowlist {
            dir: refuse_dir(),
            allowlist: a.path().to_owned(),
        });
    }
    if let Some(t) = guarded.temp.iter().find(|t| t.starts_with(dir)) {
        return Err(Refusal::TempDir {
            dir: refuse_dir(),
            temp: t.clone(),
        });
    }
    if let Some(r) = guarded.runtime.iter().find(|r| related(dir, r)) {
        return Err(Refusal::RuntimeDir {
            dir: refuse_dir(),
            runtime: r.clone(),
        });
    }
    check_podman_paths(dir, &guarded.podman)?;
    if let Some(path) = guarded.state.iter().find(|s| related(dir, s)) {
        return Err(Refusal::State {
            dir: refuse_dir(),
            path: path.clone(),
        });
    }
    if let Some(exe) = guarded.executables.iter().find(|e| e.held_by(dir)) {
        return Err(Refusal::ContainsLauncher {
            dir: refuse_dir(),
            exe: exe.path().to_owned(),
        });
    }
    Ok(())
}

/// Refuses `dir` if it is, contains or lies inside any of podman's `paths` (canonical). Also used once
/// `podman info` has named its actual storage directories.
pub fn check_podman_paths(dir: &Path, paths: &[PathBuf]) -> Result<(), Refusal> {
    match paths.iter().find(|p| related(dir, p)) {
        Some(p) => Err(Refusal::Podman {
            dir: dir.to_owned(),
            path: p.clone(),
        }),
        None => Ok(()),
    }
}

/// What the process knows about its user, for [`Guarded::from_env`].
#[derive(Clone, Debug, Default)]
pub struct Identity {
    /// The real uid.
    pub uid: u32,
    /// Home directories of users the sandbox might be or act for, besides `$HOME`: the passwd home of
    /// this uid and, under sudo or as root, of `SUDO_UID` and of the project's owner.
    pub other_homes: Vec<PathBuf>,
    /// The launcher's executable (`std::env::current_exe`).
    pub executable: Option<PathBuf>,
    /// The path the launcher was started by ([`invoked_path`]), absolute.
    pub invoked: Option<PathBuf>,
}

impl Guarded {
    /// The guarded places from `$HOME`, the allowlist's locations, the environment (`var` is
    /// `std::env::var_os` outside tests) and `id`; every path is resolved leniently.
    pub fn from_env(
        home: &Path,
        allowlist: Vec<Location>,
        var: impl Fn(&str) -> Option<OsString>,
        id: &Identity,
    ) -> io::Result<Guarded> {
        let get = |name: &str| {
            var(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        let canon = |p: &Path| canonicalize_lenient(p);
        let mut homes = vec![canon(home)?];
        for h in &id.other_homes {
            let h = canon(h)?;
            if !homes.contains(&h) {
                homes.push(h);
            }
        }
        let mut temp_dirs = vec![
            PathBuf::from("/tmp"),
            PathBuf::from("/var/tmp"),
            PathBuf::from("/dev/shm"),
        ];
        temp_dirs.extend(get("TMPDIR"));
        let mut runtime = vec![PathBuf::from(format!("/run/user/{}", id.uid))];
        runtime.extend(get("XDG_RUNTIME_DIR"));
        let mut podman = vec![
            PathBuf::from("/var/lib/containers"),
            PathBuf::from("/etc/containers"),
            PathBuf::from("/usr/share/containers"),
            PathBuf::from("/run/containers"),
            PathBuf::from("/var/run/containers"),
            PathBuf::from("/run/libpod"),
        ];
        for t in &temp_dirs {
            podman.push(t.join(format!("containers-user-{}", id.uid)));
            podman.push(t.join(format!("podman-run-{}", id.uid)));
        }
        for h in &homes {
            podman.push(h.join(".local/share/containers"));
            podman.push(h.join(".config/containers"));
        }
        podman.extend(get("XDG_DATA_HOME").map(|d| d.join("containers")));
        podman.extend(get("XDG_CONFIG_HOME").map(|d| d.join("containers")));
        for file in [
            "CONTAINERS_CONF",
            "CONTAINERS_STORAGE_CONF",
            "CONTAINERS_REGISTRIES_CONF",
        ] {
            podman.extend(get(file));
        }
        // The token store (`crate::oauth::default_store_dir`) and the session directories when they
        // fall back to a temp directory (`crate::session::rundir`); with a usable runtime directory
        // they are in it, which is guarded above.
        let state_home = get("XDG_STATE_HOME").unwrap_or_else(|| home.join(".local/state"));
        let mut state = vec![state_home.join("agent-sandbox")];
        // (`system_temp_dir`, where they go, is `$TMPDIR` when absolute, else /tmp: both are here.)
        for t in &temp_dirs {
            state.push(t.join(format!("agent-sandbox-{}", id.uid)));
        }
        let all = |v: Vec<PathBuf>| -> io::Result<Vec<PathBuf>> {
            let mut out: Vec<PathBuf> = Vec::new();
            for p in v {
                let p = canon(&p)?;
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            Ok(out)
        };
        Ok(Guarded {
            homes,
            allowlist,
            temp: all(temp_dirs)?,
            runtime: all(runtime)?,
            podman: all(podman)?,
            state: all(state)?,
            executables: {
                let mut exes = Vec::new();
                if let Some(e) = &id.executable {
                    exes.push(Location::At(canon(e)?));
                }
                // The path as the shell found it, and every symlink on the way (a PATH entry that is a
                // link to a directory, say), as for the allowlist. A path that cannot be followed
                // (a loop) still has its name guarded.
                if let Some(invoked) = &id.invoked {
                    let found = guarded_locations(invoked).or_else(|_| {
                        match (invoked.parent(), invoked.file_name()) {
                            (Some(dir), Some(name)) => {
                                Ok(vec![Location::At(canon(dir)?.join(name))])
                            }
                            _ => canon(invoked).map(|p| vec![Location::At(p)]),
                        }
                    })?;
                    for p in found {
                        if !exes.contains(&p) {
                            exes.push(p);
                        }
                    }
                }
                exes
            },
        })
    }
}

/// The path the launcher was started by, from its `argv[0]`: as given when it names a directory
/// (made absolute from `cwd`), else the first `PATH` entry holding an executable of that name, as the
/// shell found it (bash expands a `~` or `~/` that starts an entry, with `home`). `None` when it cannot
/// be told.
#[must_use]
pub fn invoked_path(
    argv0: &OsStr,
    path: Option<&OsStr>,
    cwd: &Path,
    home: Option<&Path>,
) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    if argv0.is_empty() {
        return None;
    }
    let given = Path::new(argv0);
    if argv0.as_bytes().contains(&b'/') {
        return Some(cwd.join(given));
    }
    std::env::split_paths(path?).find_map(|entry| {
        // An empty entry is the current directory, as in the shell.
        let bytes = entry.as_os_str().as_bytes();
        let entry = if bytes.is_empty() {
            cwd.to_owned()
        } else if let (Some(home), true) = (home, bytes == b"~" || bytes.starts_with(b"~/")) {
            home.join(OsStr::from_bytes(bytes.get(2..).unwrap_or_default()))
        } else {
            cwd.join(entry)
        };
        let candidate = entry.join(given);
        std::fs::metadata(&candidate)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .then_some(candidate)
    })
}

/// The temp directory session directories fall back to (`crate::session::rundir`):
/// `std::env::temp_dir()` (`$TMPDIR`) when it is absolute, else `/tmp`. An empty or relative `$TMPDIR`
/// would otherwise be taken from the current directory: the project's.
#[must_use]
pub fn system_temp_dir() -> PathBuf {
    Some(std::env::temp_dir())
        .filter(|t| t.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
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

/// The locations of a file that must stay outside the sandbox (the allowlist, the launcher as it was
/// started): the path as named (its directory resolved: a sandbox that can replace a symlink can
/// redirect it), every symlink met on the way to the file (in the path's directories too: a sandbox that
/// can replace any of them can point the next session at an allowlist, or the next start at a program,
/// of its own), and the file at the end.
pub fn guarded_locations(allowlist: &Path) -> io::Result<Vec<Location>> {
    let mut out = Vec::new();
    let as_named = match (allowlist.parent(), allowlist.file_name()) {
        (Some(parent), Some(name)) => canonicalize_lenient(parent)?.join(name),
        _ => canonicalize_lenient(allowlist)?,
    };
    out.push(Location::At(as_named));
    let (target, links) = resolve_recording_links(allowlist)?;
    for place in links.into_iter().chain([Location::At(target)]) {
        if !out.contains(&place) {
            out.push(place);
        }
    }
    Ok(out)
}

/// At most this many symlinks on one path, as the kernel's `ELOOP` limit.
const MAX_SYMLINKS: usize = 40;

/// Resolves `path` one component at a time, as the kernel does: returns where it leads (a missing tail
/// kept as it is, like [`canonicalize_lenient`]) and what on the way a sandbox could re-point: where
/// each symlink followed lies (its directory resolved), and each directory that `..` leaves. A loop is
/// an error.
fn resolve_recording_links(path: &Path) -> io::Result<(PathBuf, Vec<Location>)> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut pending: Vec<OsString> = components_reversed(&absolute);
    let mut resolved = PathBuf::from("/");
    let mut links = Vec::new();
    // Symlinks followed, for the loop limit (`links` also holds the directories `..` leaves).
    let mut followed = 0usize;
    let mut missing = false;
    while let Some(part) = pending.pop() {
        match part.to_str() {
            Some("/") => resolved = PathBuf::from("/"),
            Some(".") => {}
            Some("..") => {
                // The directory left is on the way too: were it inside a project, its sandbox could
                // make it a symlink, and `..` would then lead elsewhere.
                links.push(Location::Left(resolved.clone()));
                resolved.pop();
            }
            _ => {
                let candidate = resolved.join(&part);
                if !missing {
                    match fs::symlink_metadata(&candidate) {
                        Ok(meta) if meta.file_type().is_symlink() => {
                            if followed >= MAX_SYMLINKS {
                                return Err(io::Error::other(format!(
                                    "more than {MAX_SYMLINKS} symlinks on the way to {}",
                                    path.display()
                                )));
                            }
                            let target = fs::read_link(&candidate)?;
                            followed += 1;
                            links.push(Location::At(candidate));
                            pending.extend(components_reversed(&target));
                            continue;
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => missing = true,
                        Err(e) => return Err(e),
                    }
                }
                resolved = candidate;
            }
        }
    }
    Ok((resolved, links))
}

/// A path's components as strings, last first (`/` for the root), for [`resolve_recording_links`]'s
/// stack.
fn components_reversed(path: &Path) -> Vec<OsString> {
    path.components()
        .rev()
        .map(|c| c.as_os_str().to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the test's own in the temp directory, emptied first and removed however the
    /// test ends.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("as-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn guarded() -> Guarded {
        Guarded {
            homes: vec![p("/home/me")],
            allowlist: vec![p("/home/me/.config/agent-sandbox/allowed-hosts").into()],
            ..Guarded::default()
        }
    }

    /// Mount points below a directory, from a mountinfo text: strictly below, topmost of each stack,
    /// escapes undone, a sibling with a common prefix left out.
    #[test]
    fn mounts_below_a_directory() {
        let info = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:40 / /home/me/src/p rw - tmpfs t rw
31 30 0:41 / /home/me/src/p/usb rw - vfat /dev/sdb1 rw
32 31 0:42 / /home/me/src/p/usb/inner rw - tmpfs t rw
33 30 0:43 / /home/me/src/p/a\\040b rw - fuse.sshfs h:/ rw
34 22 0:44 / /home/me/src/pp rw - tmpfs t rw
35 30 0:45 / /home/me/src/p/usb rw - tmpfs t rw
36 30 0:46 / /home/me/src/p/back\\134slash rw - tmpfs t rw
";
        let info = info.as_bytes();
        assert_eq!(
            mounts_below_in(info, Path::new("/home/me/src/p"), false),
            vec![
                p("/home/me/src/p/a b"),
                p("/home/me/src/p/back\\slash"),
                p("/home/me/src/p/usb")
            ]
        );
        assert!(mounts_below_in(info, Path::new("/home/me/src/pp"), false).is_empty());
        // With the directory itself: it is mounted on, which hides what is below.
        assert_eq!(
            mounts_below_in(info, Path::new("/home/me/src/p"), true),
            vec![p("/home/me/src/p")]
        );
        assert_eq!(
            mounts_below_in(info, Path::new("/home/me/src/p/usb/inner"), true),
            vec![p("/home/me/src/p/usb/inner")]
        );
        assert!(mounts_below_in(info, Path::new("/home/me/src/p/a"), true).is_empty());
        assert_eq!(unescape_mount_point(b"/x\\0"), p("/x\\0"));
        assert_eq!(unescape_mount_point(b"/x\\777"), p("/x\\777"));
        // A mount point that is not UTF-8, anywhere in the table, is read like any other.
        let latin1 = b"40 22 0:50 / /home/me/src/p/caf\xe9 rw - vfat /dev/sdc1 rw\n";
        assert_eq!(
            mounts_below_in(latin1, Path::new("/home/me/src/p"), false),
            vec![PathBuf::from(
                <OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                    b"/home/me/src/p/caf\xe9".to_vec()
                )
            )]
        );
        // This process's own table reads.
        assert!(mounts_below(Path::new("/")).is_ok());
    }

    #[test]
    fn table() {
        let g = guarded();
        let home = p("/home/me");
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
            ("/home/me/.config/other", false),
            ("/home/me/.ssh", false),
            ("/home/me/.local/share/x", false),
            ("/home/me/src/.hidden", true),
            ("/home/me/..x", false),
            ("/home/me/src/2024-01-01T10:00", false),
            ("/home/me/src/a,b", true),
        ];
        for (dir, ok) in cases {
            assert_eq!(check(Path::new(dir), &g).is_ok(), *ok, "{dir}");
        }
        assert_eq!(check(&home, &g), Err(Refusal::Home(home.clone())));
        // Reviewer O: podman splits --volume on every ':', so such a project failed at the sandbox's
        // own `podman run`, after the network, router, pod and forwarder were made.
        let colon = p("/home/me/src/2024-01-01T10:00");
        assert_eq!(
            check(&colon, &g),
            Err(Refusal::Unmountable { dir: colon.clone() })
        );
        assert!(check(&colon, &g)
            .unwrap_err()
            .to_string()
            .contains("Rename or move the directory"));
        assert!(matches!(
            check(Path::new("/"), &g),
            Err(Refusal::ParentOfHome { .. })
        ));
        assert_eq!(
            check(Path::new("/home/me/.cargo/registry"), &g),
            Err(Refusal::HomeDotDir {
                dir: p("/home/me/.cargo/registry"),
                hidden: p("/home/me/.cargo")
            })
        );
        // An allowlist kept in a project (AGENT_SANDBOX_ALLOWLIST) refuses that project and its parents.
        let inside = Guarded {
            allowlist: vec![p("/work/proj/conf/allowed").into()],
            ..guarded()
        };
        assert!(matches!(
            check(Path::new("/work/proj"), &inside),
            Err(Refusal::ContainsAllowlist { .. })
        ));
        assert!(check(Path::new("/work/proj/src"), &inside).is_ok());
    }

    #[test]
    fn temp_runtime_podman_and_launcher_directories() {
        let g = Guarded {
            temp: vec![p("/tmp"), p("/var/tmp")],
            runtime: vec![p("/run/user/1000")],
            podman: vec![
                p("/var/lib/containers"),
                p("/etc/containers/containers.conf"),
            ],
            executables: vec![p("/opt/as/bin/agent-sandbox").into()],
            ..guarded()
        };
        let refused = |dir: &str| check(Path::new(dir), &g).err();
        // Temp directories: themselves and what contains them; a project inside is fine.
        assert!(matches!(refused("/tmp"), Some(Refusal::TempDir { .. })));
        assert!(matches!(refused("/var/tmp"), Some(Refusal::TempDir { .. })));
        assert!(matches!(refused("/var"), Some(Refusal::TempDir { .. })));
        assert_eq!(refused("/tmp/project"), None);
        // The runtime directory: itself, inside and above.
        for dir in [
            "/run/user/1000",
            "/run/user/1000/podman",
            "/run/user",
            "/run",
        ] {
            assert!(
                matches!(refused(dir), Some(Refusal::RuntimeDir { .. })),
                "{dir}"
            );
        }
        assert_eq!(refused("/run/user/1001"), None);
        // podman's paths: itself, inside and above; a configuration file refuses what contains it.
        for dir in [
            "/var/lib/containers",
            "/var/lib/containers/storage/overlay",
            "/var/lib",
            "/etc/containers",
            "/etc",
        ] {
            assert!(
                matches!(refused(dir), Some(Refusal::Podman { .. })),
                "{dir}"
            );
        }
        assert_eq!(refused("/var/lib/other"), None);
        // The launcher's directory and its parents.
        for dir in ["/opt/as/bin", "/opt/as", "/opt"] {
            assert!(
                matches!(refused(dir), Some(Refusal::ContainsLauncher { .. })),
                "{dir}"
            );
        }
        assert_eq!(refused("/opt/as/src"), None);
        assert!(check_podman_paths(Path::new("/srv/x"), &[p("/srv/x/storage")]).is_err());
        assert!(check_podman_paths(Path::new("/srv/y"), &[p("/srv/x/storage")]).is_ok());
    }

    #[test]
    fn guarded_from_the_environment() {
        let vars = |k: &str| -> Option<OsString> {
            match k {
                "XDG_RUNTIME_DIR" => Some("/nonexistent-as/run".into()),
                "TMPDIR" => Some("/nonexistent-as/tmp".into()),
                "XDG_CONFIG_HOME" => Some("/nonexistent-as/cfg".into()),
                "CONTAINERS_CONF" => Some("/nonexistent-as/c/containers.conf".into()),
                "CONTAINERS_STORAGE_CONF" => Some("/nonexistent-as/c/storage.conf".into()),
                "CONTAINERS_REGISTRIES_CONF" => Some("/nonexistent-as/c/registries.conf".into()),
                "XDG_DATA_HOME" => Some("relative/ignored".into()),
                "XDG_STATE_HOME" => Some("/nonexistent-as/state".into()),
                _ => None,
            }
        };
        let id = Identity {
            uid: 4242,
            other_homes: vec![p("/nonexistent-as/home/sudoer")],
            executable: Some(p("/nonexistent-as/bin/agent-sandbox")),
            invoked: Some(p("/nonexistent-as/proj/tools/agent-sandbox")),
        };
        let g = Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], vars, &id).unwrap();
        assert_eq!(
            g.homes,
            [
                p("/nonexistent-as/home/me"),
                p("/nonexistent-as/home/sudoer")
            ]
        );
        assert!(g.temp.contains(&p("/nonexistent-as/tmp")));
        assert!(g.runtime.contains(&p("/run/user/4242")));
        assert!(g.runtime.contains(&p("/nonexistent-as/run")));
        for path in [
            "/nonexistent-as/cfg/containers",
            "/nonexistent-as/c/containers.conf",
            "/nonexistent-as/home/sudoer/.local/share/containers",
            "/nonexistent-as/tmp/containers-user-4242",
            // podman's runtime directory when XDG_RUNTIME_DIR is not set, in /tmp and in $TMPDIR.
            "/tmp/podman-run-4242",
            "/nonexistent-as/tmp/podman-run-4242",
            "/nonexistent-as/c/storage.conf",
            "/nonexistent-as/c/registries.conf",
        ] {
            assert!(g.podman.contains(&p(path)), "{path}: {:?}", g.podman);
        }
        assert!(!g.podman.iter().any(|x| x.starts_with("relative")));
        // A sudo user's home and its parents are refused like $HOME.
        assert!(matches!(
            check(Path::new("/nonexistent-as/home/sudoer"), &g),
            Err(Refusal::Home(_))
        ));
        assert!(matches!(
            check(Path::new("/nonexistent-as/home"), &g),
            Err(Refusal::ParentOfHome { .. })
        ));
        assert!(matches!(
            check(Path::new("/nonexistent-as/bin"), &g),
            Err(Refusal::ContainsLauncher { .. })
        ));
        // The path it was started by (a symlink in a project, say) is guarded too.
        assert!(matches!(
            check(Path::new("/nonexistent-as/proj"), &g),
            Err(Refusal::ContainsLauncher { exe, .. }) if exe == p("/nonexistent-as/proj/tools/agent-sandbox")
        ));
        assert!(check(Path::new("/nonexistent-as/home/sudoer/project"), &g).is_ok());
        // agent-sandbox's state: the token store's directory and the session directories' fallback,
        // themselves, inside and above; a sibling is fine.
        for dir in [
            "/nonexistent-as/state",
            "/nonexistent-as/state/agent-sandbox",
            "/nonexistent-as/state/agent-sandbox/oauth",
            "/nonexistent-as/tmp/agent-sandbox-4242",
            "/nonexistent-as/tmp/agent-sandbox-4242/agent-sandbox-s1/inject",
        ] {
            assert!(
                matches!(check(Path::new(dir), &g), Err(Refusal::State { .. })),
                "{dir}: {:?}",
                check(Path::new(dir), &g)
            );
        }
        assert!(check(Path::new("/nonexistent-as/state/other"), &g).is_ok());
        assert!(check(Path::new("/nonexistent-as/tmp/agent-sandbox-4243"), &g).is_ok());
        // An empty or relative TMPDIR is not a place session directories go (they fall back to
        // /tmp), so it guards nothing relative to the project: such a project is not refused.
        for tmpdir in ["", "tmp", "."] {
            let vars = |k: &str| (k == "TMPDIR").then(|| OsString::from(tmpdir));
            let g =
                Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], vars, &id).unwrap();
            assert!(
                g.state.contains(&p("/tmp/agent-sandbox-4242")),
                "{:?}",
                g.state
            );
            assert!(g
                .state
                .iter()
                .all(|s| s.is_absolute() && s.starts_with("/")));
            assert!(
                !g.state
                    .iter()
                    .any(|s| s.starts_with(std::env::current_dir().unwrap())),
                "{tmpdir:?}: {:?}",
                g.state
            );
        }
        // Without XDG_STATE_HOME, the default under the home.
        let g =
            Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], |_| None, &id).unwrap();
        assert!(g
            .state
            .contains(&p("/nonexistent-as/home/me/.local/state/agent-sandbox")));
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
        let locations = guarded_locations(&named_link).unwrap();
        assert_eq!(
            locations,
            [
                Location::At(named.canonicalize().unwrap().join("allowed-hosts")),
                Location::At(target)
            ]
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn every_symlink_on_the_way_to_the_allowlist_is_guarded() {
        // ~/.config/agent-sandbox/allowed-hosts -> ~/src/links/al/allowed-hosts, and ~/src/links/al ->
        // /srv: a project at ~/src/links holds the `al` link, which its sandbox could point elsewhere.
        let scratch = Scratch::new("workdir-hops");
        let tmp = scratch.0.clone();
        let home = tmp.join("home");
        let config = home.join(".config/agent-sandbox");
        let links = home.join("src/links");
        let srv = tmp.join("srv");
        for d in [&config, &links, &srv] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(srv.join("allowed-hosts"), "example.com\n").unwrap();
        std::os::unix::fs::symlink(&srv, links.join("al")).unwrap();
        let named = config.join("allowed-hosts");
        std::os::unix::fs::symlink(links.join("al/allowed-hosts"), &named).unwrap();
        let (home, links, srv) = (
            home.canonicalize().unwrap(),
            links.canonicalize().unwrap(),
            srv.canonicalize().unwrap(),
        );
        let locations = guarded_locations(&named).unwrap();
        assert_eq!(
            locations,
            [
                Location::At(home.join(".config/agent-sandbox/allowed-hosts")),
                Location::At(links.join("al")),
                Location::At(srv.join("allowed-hosts")),
            ]
        );
        let guarded = Guarded {
            homes: vec![home.clone()],
            allowlist: locations,
            ..Guarded::default()
        };
        assert!(matches!(
            check(&links, &guarded),
            Err(Refusal::ContainsAllowlist { allowlist, .. }) if allowlist == links.join("al")
        ));
        assert!(check(&home.join("src/other"), &guarded).is_ok());

        // A relative link, `..` after a link, and a missing tail resolve as the kernel would; the
        // directories `..` leaves are on the way too.
        let tmp_c = tmp.canonicalize().unwrap();
        let rel = tmp.join("rel");
        std::os::unix::fs::symlink("srv/../srv", &rel).unwrap();
        let (target, met) = resolve_recording_links(&rel.join("./missing/../x")).unwrap();
        assert_eq!(target, srv.join("x"));
        assert_eq!(
            met,
            [
                Location::At(tmp_c.join("rel")),
                Location::Left(srv.clone()),
                Location::Left(srv.join("missing"))
            ]
        );
        // A link down through a project and back up: the project holds a directory on the way (which
        // its sandbox could replace with a symlink), so it is refused.
        let proj = home.join("proj");
        std::fs::create_dir_all(proj.join("sub")).unwrap();
        let down_and_up = config.join("via-proj");
        std::os::unix::fs::symlink("../../proj/sub/../../shared/allowed-hosts", &down_and_up)
            .unwrap();
        let locations = guarded_locations(&down_and_up).unwrap();
        assert!(
            locations.contains(&Location::Left(proj.join("sub"))),
            "{locations:?}"
        );
        let guarded = Guarded {
            homes: vec![home.clone()],
            allowlist: locations,
            ..Guarded::default()
        };
        assert!(matches!(
            check(&proj, &guarded),
            Err(Refusal::ContainsAllowlist { .. })
        ));
        // A loop is an error, not a hang.
        let a = tmp.join("loop-a");
        std::os::unix::fs::symlink(tmp.join("loop-b"), &a).unwrap();
        std::os::unix::fs::symlink(&a, tmp.join("loop-b")).unwrap();
        let err = guarded_locations(&a.join("allowed-hosts")).unwrap_err();
        assert!(err.to_string().contains("symlinks"), "{err}");
    }

    #[test]
    fn the_invoked_path_is_found_as_the_shell_found_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let scratch = Scratch::new("invoked");
        let dir = scratch.0.clone();
        for sub in ["a", "b", "c"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // a: not executable; b: executable; c: a symlink to b's (kept as the link).
        fs::write(dir.join("a/agent-sandbox"), "").unwrap();
        fs::write(dir.join("b/agent-sandbox"), "").unwrap();
        fs::set_permissions(
            dir.join("b/agent-sandbox"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink(dir.join("b/agent-sandbox"), dir.join("c/agent-sandbox"))
            .unwrap();
        let name = OsStr::new("agent-sandbox");
        let path = |entries: &[&str]| {
            std::env::join_paths(entries.iter().map(|e| {
                if e.is_empty() {
                    PathBuf::new()
                } else {
                    dir.join(e)
                }
            }))
            .unwrap()
        };
        assert_eq!(
            invoked_path(name, Some(&path(&["a", "b", "c"])), &dir, None),
            Some(dir.join("b/agent-sandbox"))
        );
        assert_eq!(
            invoked_path(name, Some(&path(&["c", "b"])), &dir, None),
            Some(dir.join("c/agent-sandbox"))
        );
        // An empty entry is the current directory.
        assert_eq!(
            invoked_path(name, Some(&path(&["a", ""])), &dir.join("b"), None),
            Some(dir.join("b/agent-sandbox"))
        );
        assert_eq!(invoked_path(name, Some(&path(&["a"])), &dir, None), None);
        assert_eq!(invoked_path(name, None, &dir, None), None);
        // A path with a slash is taken as given, from the current directory.
        assert_eq!(
            invoked_path(OsStr::new("./c/agent-sandbox"), None, &dir, None),
            Some(dir.join("./c/agent-sandbox"))
        );
        assert_eq!(
            invoked_path(OsStr::new("/usr/bin/agent-sandbox"), None, &dir, None),
            Some(p("/usr/bin/agent-sandbox"))
        );
        assert_eq!(
            invoked_path(OsStr::new(""), Some(&path(&["b"])), &dir, None),
            None
        );
        // Guarded: the link's directory resolved, its name kept, so a project holding the link is
        // refused while the target is elsewhere.
        let id = Identity {
            uid: 4242,
            other_homes: vec![],
            executable: Some(dir.join("b/agent-sandbox")),
            invoked: Some(dir.join("c/./agent-sandbox")),
        };
        let g =
            Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], |_| None, &id).unwrap();
        let canon_dir = dir.canonicalize().unwrap();
        assert!(
            g.executables
                .contains(&Location::At(canon_dir.join("c/agent-sandbox"))),
            "{:?}",
            g.executables
        );
        assert!(matches!(
            check(&canon_dir.join("c"), &g),
            Err(Refusal::ContainsLauncher { exe, .. }) if exe == canon_dir.join("c/agent-sandbox")
        ));
        assert!(check(&canon_dir.join("a"), &g).is_ok());
        // A PATH entry inside a project that is a symlink to the directory holding the launcher
        // (reviewer J): the sandbox could swap the link for a directory of its own.
        fs::create_dir_all(dir.join("proj")).unwrap();
        std::os::unix::fs::symlink(dir.join("b"), dir.join("proj/tools")).unwrap();
        let id = Identity {
            invoked: invoked_path(name, Some(&path(&["proj/tools"])), &dir, None),
            ..id
        };
        assert_eq!(id.invoked, Some(dir.join("proj/tools/agent-sandbox")));
        let g =
            Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], |_| None, &id).unwrap();
        assert!(matches!(
            check(&canon_dir.join("proj"), &g),
            Err(Refusal::ContainsLauncher { .. })
        ));
        assert!(check(&canon_dir.join("a"), &g).is_ok());
        // Reviewer K: a PATH entry starting with `~`, which bash expands.
        let home = dir.join("home-k");
        fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::symlink(dir.join("b"), home.join("tools")).unwrap();
        let tilde = std::env::join_paths(["~/tools", "/nonexistent-as"]).unwrap();
        assert_eq!(
            invoked_path(name, Some(&tilde), &dir, Some(&home)),
            Some(home.join("tools/agent-sandbox"))
        );
        // Reviewer K: started as `../b/agent-sandbox` from a project beside it. `..` leaves the
        // project's own root, which its sandbox cannot re-point: the project is not refused.
        fs::create_dir_all(dir.join("myproj/sub")).unwrap();
        let id = Identity {
            invoked: invoked_path(
                OsStr::new("../b/agent-sandbox"),
                None,
                &dir.join("myproj"),
                None,
            ),
            ..id
        };
        let g =
            Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], |_| None, &id).unwrap();
        assert!(
            check(&canon_dir.join("myproj"), &g).is_ok(),
            "{:?}",
            g.executables
        );
        // From a directory inside the project, `..` leaves a directory the sandbox could replace.
        let id = Identity {
            invoked: invoked_path(
                OsStr::new("../../b/agent-sandbox"),
                None,
                &dir.join("myproj/sub"),
                None,
            ),
            ..id
        };
        let g =
            Guarded::from_env(Path::new("/nonexistent-as/home/me"), vec![], |_| None, &id).unwrap();
        assert!(matches!(
            check(&canon_dir.join("myproj"), &g),
            Err(Refusal::ContainsLauncher { .. })
        ));
        assert!(check(&canon_dir.join("myproj/sub"), &g).is_ok());
    }

    /// Reviewer K: a loop that passes `..` on each turn never made the entries recorded equal the
    /// limit, and resolving it ran for ever.
    #[test]
    fn a_loop_through_dot_dot_is_an_error_not_a_hang() {
        let scratch = Scratch::new("loop");
        let dir = scratch.0.clone();
        fs::create_dir_all(dir.join("d")).unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
        std::os::unix::fs::symlink(format!("../../{name}/d/L"), dir.join("d/L")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.join("d/L/agent-sandbox");
        std::thread::spawn(move || {
            let _ = tx.send(guarded_locations(&path).is_err());
        });
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true),
            "a loop must end in an error"
        );
    }
}
