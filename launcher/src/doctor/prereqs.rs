//! The prerequisites: everything a session needs from this machine, each judged from what podman and
//! the kernel say. Gathering ([`gather`]) runs the read-only podman queries at once; judging
//! ([`judge`]) is pure, so every verdict and its fix is unit-tested without podman.

use std::fs;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use agent_sandbox_shared::Allowlist;

use super::report::{Check, Section, Status};
use crate::podman::json::{Image, Info, VolumeInspect};
use crate::podman::{args, Podman, PodmanError, LABEL_VERSION};
use crate::settings::Settings;

/// The oldest podman the launcher supports.
const MIN_PODMAN: (u32, u32) = (4, 3);
/// The newest major version the launcher is known to work with.
const MAX_PODMAN_MAJOR: u32 = 5;

/// Where distributions install aardvark-dns (podman 4.3 does not report it).
const AARDVARK_PATHS: &[&str] = &[
    "/usr/libexec/podman/aardvark-dns",
    "/usr/lib/podman/aardvark-dns",
    "/usr/local/libexec/podman/aardvark-dns",
    "/usr/local/lib/podman/aardvark-dns",
];

/// What the checks look at, gathered before any is judged.
pub(crate) struct Facts {
    /// `podman info --format json`, or why it failed.
    pub(crate) info: Result<String, PodmanError>,
    /// `podman image inspect` of the router image, then of the sandbox image.
    pub(crate) images: [(String, Result<String, PodmanError>); 2],
    /// `podman network ls` of session networks.
    pub(crate) session_networks: Result<String, PodmanError>,
    /// The home volume's name and `podman volume inspect` of it.
    pub(crate) volume: (String, Result<String, PodmanError>),
    /// The allowlist's path.
    pub(crate) allowlist: PathBuf,
    /// The trial run of the router image (only once podman works and the image is present).
    pub(crate) trial: Option<Result<String, PodmanError>>,
    /// The user's name and uid.
    pub(crate) user: (String, u32),
    /// `/etc/subuid` and `/etc/subgid` (empty when unreadable).
    pub(crate) subids: [String; 2],
    /// `/proc/sys/kernel/unprivileged_userns_clone` (Debian) and `/proc/sys/user/max_user_namespaces`.
    pub(crate) userns: [Option<String>; 2],
    /// `/dev/fuse` is a character device this user can open.
    pub(crate) dev_fuse: Result<(), String>,
    /// `XDG_RUNTIME_DIR`, and whether it is a directory this user owns.
    pub(crate) runtime_dir: Option<(PathBuf, bool)>,
    /// An aardvark-dns found in the usual places.
    pub(crate) aardvark: Option<PathBuf>,
    /// `ANTHROPIC_API_KEY` is set (which hosts a session terminates depends on it).
    pub(crate) api_key_set: bool,
    /// The OAuth token store's place (`crate::oauth::default_store_dir`; None: it has none).
    pub(crate) oauth_store: Option<PathBuf>,
}

/// The trial run, started as a session starts its containers: with an empty directory of its own as
/// podman's only OCI hooks directory, so that no hook of podman's configuration runs (one that fails
/// would fail the trial on a machine where sessions work; one that works would be tried on no session).
fn trial_run(podman: &Podman, image: &str) -> Result<String, PodmanError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = crate::workdir::system_temp_dir().join(format!(
        "agent-sandbox-doctor-hooks-{}-{nanos}",
        std::process::id()
    ));
    // Made new (never one that exists) and private; removed below whatever the run did.
    std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o700)
        .create(&dir)
        .map_err(|e| {
            PodmanError::Spawn(std::io::Error::new(
                e.kind(),
                format!(
                    "cannot create an empty hooks directory {}: {e}",
                    dir.display()
                ),
            ))
        })?;
    let out = podman.with_hooks_dir(&dir).run(&args::trial_run(image));
    let _ = fs::remove_dir(&dir);
    out
}

/// Runs the read-only queries (podman's at once) and reads the kernel's settings.
pub(crate) fn gather(podman: &Podman, settings: &Settings) -> Facts {
    let (info, router, sandbox, networks, volume) = std::thread::scope(|s| {
        let info = s.spawn(|| podman.run(&args::info()));
        let router = s.spawn(|| podman.run(&args::image_inspect(&[&settings.router_image])));
        let sandbox = s.spawn(|| podman.run(&args::image_inspect(&[&settings.image])));
        let networks = s.spawn(|| podman.run(&args::network_ls_sessions()));
        let volume = podman.run(&args::volume_inspect(&settings.home_volume));
        (
            join(info),
            join(router),
            join(sandbox),
            join(networks),
            volume,
        )
    });
    let trial = (info.is_ok() && router.is_ok()).then(|| trial_run(podman, &settings.router_image));
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    let name = passwd_name(uid)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| uid.to_string());
    let read = |p: &str| fs::read_to_string(p).ok();
    Facts {
        info,
        images: [
            (settings.router_image.clone(), router),
            (settings.image.clone(), sandbox),
        ],
        session_networks: networks,
        volume: (settings.home_volume.clone(), volume),
        allowlist: settings.allowlist.clone(),
        trial,
        user: (name, uid),
        subids: [
            read("/etc/subuid").unwrap_or_default(),
            read("/etc/subgid").unwrap_or_default(),
        ],
        userns: [
            read("/proc/sys/kernel/unprivileged_userns_clone"),
            read("/proc/sys/user/max_user_namespaces"),
        ],
        dev_fuse: dev_fuse(),
        runtime_dir: std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|v| !v.is_empty())
            .map(|v| {
                let p = PathBuf::from(v);
                let ok = fs::metadata(&p).is_ok_and(|m| m.is_dir() && m.uid() == uid);
                (p, ok)
            }),
        aardvark: AARDVARK_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file()),
        api_key_set: crate::inject::host_api_key().is_some(),
        oauth_store: crate::oauth::default_store_dir(),
    }
}

fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn passwd_name(uid: u32) -> Option<String> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 3 && f[2].parse::<u32>().ok()? == uid).then(|| f[0].to_owned())
    })
}

fn dev_fuse() -> Result<(), String> {
    let meta = fs::metadata("/dev/fuse").map_err(|e| format!("/dev/fuse: {e}"))?;
    if !meta.file_type().is_char_device() {
        return Err("/dev/fuse is not a character device".into());
    }
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map(drop)
        .map_err(|e| format!("/dev/fuse cannot be opened: {e}"))
}

/// Judges the facts: one check per prerequisite, in the order the issue lists them.
pub(crate) fn judge(facts: &Facts) -> Vec<Check> {
    let mut out = Vec::new();
    let info = match &facts.info {
        Ok(json) => match Info::parse(json) {
            Ok(info) => Some(info),
            Err(e) => {
                out.push(fail(
                    "podman",
                    format!("{e}"),
                    "run `podman info` and fix what it reports",
                ));
                None
            }
        },
        Err(PodmanError::NotInstalled) => {
            out.push(fail(
                "podman",
                "podman is not installed (or not on PATH)",
                "install podman 4.3 or later: `sudo dnf install podman` or `sudo apt-get install podman`",
            ));
            None
        }
        Err(e) => {
            out.push(fail(
                "podman",
                format!("podman does not work for this user: {e}"),
                "run `podman info` and fix what it reports (rootless: an /etc/subuid and /etc/subgid range, then `podman system migrate`)",
            ));
            None
        }
    };
    let Some(info) = info else {
        // Everything else is podman's answer: the allowlist can still be judged.
        out.push(allowlist(&facts.allowlist));
        return out;
    };
    let rootless = info.host.security.rootless;
    out.push(version(&info.version.version));
    out.push(mode(rootless));
    out.push(subids(facts, &info));
    out.push(cgroups(&info.host.cgroup_version));
    out.push(network_backend(&info, facts.aardvark.as_deref()));
    out.push(runtime(&info));
    out.push(userns(&facts.userns));
    out.push(fuse(&facts.dev_fuse));
    out.push(runtime_dir(rootless, facts.runtime_dir.as_ref()));
    let mut sandbox_size = None;
    for (i, (image, inspect)) in facts.images.iter().enumerate() {
        let (check, size) = image_check(i, image, inspect);
        out.push(check);
        if i == 1 {
            sandbox_size = size;
        }
    }
    out.push(allowlist(&facts.allowlist));
    out.push(credentials(
        &facts.allowlist,
        facts.api_key_set,
        facts.oauth_store.as_deref(),
    ));
    out.push(home_volume(&facts.volume.0, &facts.volume.1));
    out.push(leftovers(&facts.session_networks));
    out.push(storage(&info.store.graph_driver_name, sandbox_size));
    out.push(trial(facts.trial.as_ref()));
    out
}

fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check::bad(Section::Prerequisites, Status::Fail, name, detail, fix)
}

fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check::bad(Section::Prerequisites, Status::Warn, name, detail, fix)
}

fn pass(name: &str, detail: impl Into<String>) -> Check {
    Check::pass(Section::Prerequisites, name, detail)
}

/// podman 4.3 through 5.x, and what differs between them.
fn version(v: &str) -> Check {
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) else {
        return warn(
            "podman",
            format!("podman reports version `{v}`, which this launcher cannot read"),
            "use podman 4.3 through 5.x",
        );
    };
    if (major, minor) < MIN_PODMAN {
        return fail(
            "podman",
            format!("podman {v} is older than 4.3, the oldest supported"),
            "upgrade podman to 4.3 or later (Debian 12 has 4.3.1, Fedora has 5.x)",
        );
    }
    if major > MAX_PODMAN_MAJOR {
        return warn(
            "podman",
            format!("podman {v} is newer than the 5.x this launcher was tested with"),
            "if sessions fail, report it with this output; podman 5.x is known to work",
        );
    }
    let differs = if major == 4 {
        "4.x: rootless networking by slirp4netns; aardvark-dns before 1.11 forwards queries from internal networks, so session networks are created without DNS"
    } else {
        "5.x: rootless networking by pasta; `podman info` stops naming storage.conf after 5.8"
    };
    pass(
        "podman",
        format!("podman {v} (supported: 4.3 through 5.x; {differs})"),
    )
}

fn mode(rootless: bool) -> Check {
    if rootless {
        pass(
            "mode",
            "rootless: the sandbox runs as you (--userns=keep-id), files it writes are yours, nested podman works",
        )
    } else {
        warn(
            "mode",
            "rootful: the sandbox runs with no user namespace as the sudo user or the project's owner (root with no capabilities if that is root); nested podman needs a non-root sandbox user",
            "run agent-sandbox as your own user (not root or sudo): rootless is the supported mode",
        )
    }
}

/// Whether `/etc/subuid`-style `text` gives `name` or `uid` a range, and its first one.
fn range_of(text: &str, name: &str, uid: u32) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.trim().splitn(3, ':');
        let (who, start, count) = (f.next()?, f.next()?, f.next()?);
        (who == name || who.parse::<u32>().ok() == Some(uid)).then(|| format!("{start}+{count}"))
    })
}

fn subids(facts: &Facts, info: &Info) -> Check {
    let (name, uid) = (&facts.user.0, facts.user.1);
    let found = [
        range_of(&facts.subids[0], name, uid),
        range_of(&facts.subids[1], name, uid),
    ];
    if !info.host.security.rootless {
        return Check::skip(
            Section::Prerequisites,
            "subuid/subgid",
            "rootful podman maps no ranges for the sandbox",
        );
    }
    let fix = format!(
        "sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {name} && podman system migrate"
    );
    match (&found, info.subordinate_ids()) {
        ([Some(u), Some(g)], true) => pass(
            "subuid/subgid",
            format!("{name} has /etc/subuid {u} and /etc/subgid {g}"),
        ),
        ([Some(_), Some(_)], false) => fail(
            "subuid/subgid",
            format!("{name} has ranges in /etc/subuid and /etc/subgid, but podman maps only your own id"),
            "podman system migrate",
        ),
        _ => fail(
            "subuid/subgid",
            format!(
                "{name} has no range in {}",
                match &found {
                    [None, None] => "/etc/subuid or /etc/subgid",
                    [None, _] => "/etc/subuid",
                    _ => "/etc/subgid",
                }
            ),
            fix,
        ),
    }
}

fn cgroups(v: &str) -> Check {
    if v == "v2" {
        pass("cgroups", "cgroups v2")
    } else {
        warn(
            "cgroups",
            format!("cgroups {v} (or hybrid): crun refuses to run (\"cgroups in hybrid mode not supported\") and rootless containers get no resource limits"),
            "boot with systemd.unified_cgroup_hierarchy=1 for cgroups v2, or set runtime = \"runc\" under [engine] in containers.conf",
        )
    }
}

fn network_backend(info: &Info, aardvark: Option<&Path>) -> Check {
    let backend = &info.host.network_backend;
    if backend != "netavark" {
        return fail(
            "network backend",
            format!("`{backend}`: only netavark with aardvark-dns is supported (CNI is not: its internal networks and DNS behave differently)"),
            "install netavark and aardvark-dns, set network_backend = \"netavark\" under [network] in containers.conf, then `podman system reset` (it deletes all containers and images)",
        );
    }
    let dns = &info.host.network_backend_info.dns;
    let dns = if !dns.version.is_empty() {
        Some(dns.version.clone())
    } else {
        aardvark.map(|p| format!("aardvark-dns at {}", p.display()))
    };
    match dns {
        Some(dns) => pass("network backend", format!("netavark with {dns}")),
        None => fail(
            "network backend",
            "netavark, but aardvark-dns is not installed: the router cannot resolve upstream names",
            "install aardvark-dns (`sudo dnf install aardvark-dns` or `sudo apt-get install aardvark-dns`)",
        ),
    }
}

fn runtime(info: &Info) -> Check {
    let rt = &info.host.oci_runtime;
    let version = rt.version.lines().next().unwrap_or("").trim();
    if rt.name.is_empty() {
        return warn(
            "OCI runtime",
            "podman names no OCI runtime",
            "install crun or runc",
        );
    }
    pass("OCI runtime", format!("{} ({version})", rt.name))
}

fn userns(values: &[Option<String>; 2]) -> Check {
    let n = |v: &Option<String>| v.as_deref().and_then(|s| s.trim().parse::<u64>().ok());
    if n(&values[0]) == Some(0) {
        return fail(
            "user namespaces",
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0): rootless and nested podman cannot run",
            "sudo sysctl -w kernel.unprivileged_userns_clone=1 (and set it in /etc/sysctl.d/)",
        );
    }
    if n(&values[1]) == Some(0) {
        return fail(
            "user namespaces",
            "user.max_user_namespaces = 0: rootless and nested podman cannot run",
            "sudo sysctl -w user.max_user_namespaces=28633 (and set it in /etc/sysctl.d/)",
        );
    }
    pass(
        "user namespaces",
        "unprivileged user namespaces are enabled (nested podman can run)",
    )
}

fn fuse(found: &Result<(), String>) -> Check {
    match found {
        Ok(()) => pass(
            "/dev/fuse",
            "present: rootless and nested podman can use fuse-overlayfs",
        ),
        Err(e) => warn(
            "/dev/fuse",
            format!("{e}: rootless podman may fall back to the vfs storage driver, and nested podman to vfs"),
            "sudo modprobe fuse (and make /dev/fuse mode 0666)",
        ),
    }
}

fn runtime_dir(rootless: bool, dir: Option<&(PathBuf, bool)>) -> Check {
    match (rootless, dir) {
        (false, _) => Check::skip(
            Section::Prerequisites,
            "XDG_RUNTIME_DIR",
            "not needed by rootful podman",
        ),
        (true, Some((p, true))) => pass("XDG_RUNTIME_DIR", format!("{}", p.display())),
        (true, Some((p, false))) => fail(
            "XDG_RUNTIME_DIR",
            format!("{} is not a directory you own", p.display()),
            "log in as yourself (not `su`; `su - USER` or `machinectl shell USER@`) so that systemd creates /run/user/UID",
        ),
        (true, None) => warn(
            "XDG_RUNTIME_DIR",
            "not set: podman keeps its runtime state in /tmp, which a reboot or tmp cleaner may remove under a running session",
            "log in with a login session (`su - USER`, `machinectl shell USER@`), or `sudo loginctl enable-linger USER`",
        ),
    }
}

/// One image: present, and built by this launcher's version. Returns its size too.
fn image_check(
    which: usize,
    image: &str,
    inspect: &Result<String, PodmanError>,
) -> (Check, Option<u64>) {
    let (name, variable) = if which == 0 {
        ("router image", "AGENT_SANDBOX_ROUTER_IMAGE")
    } else {
        ("sandbox image", "AGENT_SANDBOX_IMAGE")
    };
    let missing_fix = if image.starts_with("localhost/") {
        format!("run `make build` in the agent-sandbox source tree (it runs `agent-sandbox --build-images`), or set {variable} to an image you have")
    } else {
        format!("podman pull {image} (a session pulls it too)")
    };
    let parsed = match inspect {
        Err(e) if e.is_missing() => {
            return (fail(name, format!("{image} is missing"), missing_fix), None)
        }
        Err(e) => return (fail(name, format!("{image}: {e}"), missing_fix), None),
        Ok(json) => Image::parse_inspect(json),
    };
    let img = match parsed {
        Ok(mut list) if !list.is_empty() => list.swap_remove(0),
        Ok(_) => return (fail(name, format!("{image} is missing"), missing_fix), None),
        Err(e) => return (fail(name, format!("{image}: {e}"), missing_fix), None),
    };
    let ours = env!("CARGO_PKG_VERSION");
    let rebuild = if image.starts_with("localhost/") {
        "rebuild it with `make build` in this launcher's source tree"
    } else {
        "use the launcher and images of one release"
    };
    let check = match img.labels.get(LABEL_VERSION) {
        Some(v) if v == ours => pass(
            name,
            format!("{image} (built for {ours}, {} MB)", img.size >> 20),
        ),
        // The router is the boundary: one of another release may lack this launcher's fixes, and the
        // containment checks would then describe it. The sandbox image only holds the agent.
        Some(v) if which == 0 => fail(
            name,
            format!("{image} was built for agent-sandbox {v}, this launcher is {ours}"),
            rebuild,
        ),
        Some(v) => warn(
            name,
            format!("{image} was built for agent-sandbox {v}, this launcher is {ours}"),
            rebuild,
        ),
        None => warn(
            name,
            format!(
                "{image} carries no agent-sandbox version label (built before {ours}, or by hand)"
            ),
            rebuild,
        ),
    };
    (check, Some(img.size))
}

fn allowlist(path: &Path) -> Check {
    if fs::symlink_metadata(path).is_err() {
        return Check::pass(
            Section::Prerequisites,
            "allowlist",
            format!(
                "{} does not exist yet: the first session creates it from the default",
                path.display()
            ),
        );
    }
    match Allowlist::load(path) {
        Ok(list) => {
            let n = list.entries().len();
            let warnings = list.warnings().len();
            if warnings == 0 {
                pass("allowlist", format!("{} ({n} entries)", path.display()))
            } else {
                let lines: Vec<String> = list
                    .warnings()
                    .iter()
                    .map(|w| format!("line {}: `{}`: {}", w.line, w.text, w.message))
                    .collect();
                warn(
                    "allowlist",
                    format!("{} ({n} entries): {}", path.display(), lines.join("; ")),
                    format!("edit {}", path.display()),
                )
            }
        }
        Err(e) => fail(
            "allowlist",
            e.to_string(),
            format!("edit {}", path.display()),
        ),
    }
}

/// Which hosts a session would terminate to add credentials, and why, with the OAuth token store's
/// place (information: never a failure; never a token).
fn credentials(path: &Path, api_key_set: bool, oauth_store: Option<&Path>) -> Check {
    let policy = match Allowlist::load(path) {
        Ok(list) => agent_sandbox_shared::Policy::new(&list),
        Err(_) => match Allowlist::parse(crate::settings::EMBEDDED_ALLOWLIST, "default") {
            // No allowlist yet (the first session copies the default): judge by the default.
            Ok(list) if fs::symlink_metadata(path).is_err() => {
                agent_sandbox_shared::Policy::new(&list)
            }
            _ => {
                return pass(
                    "credential injection",
                    "depends on the allowlist, which does not load (see above)",
                )
            }
        },
    };
    let decision = crate::inject::decide(&policy, api_key_set, oauth_store, true);
    pass("credential injection", decision.summary())
}

fn home_volume(name: &str, inspect: &Result<String, PodmanError>) -> Check {
    match inspect.as_ref().map(|json| VolumeInspect::parse(json)) {
        Ok(Ok(volume)) => match crate::session::home_volume_refusal(&volume) {
            None => pass(
                "home volume",
                format!("{name} at {}", volume.mountpoint.display()),
            ),
            Some(why) => fail(
                "home volume",
                format!("{name} {why}: sessions refuse it"),
                crate::session::home_volume_fix(name),
            ),
        },
        Ok(Err(e)) => fail(
            "home volume",
            format!("{name}: {e}"),
            format!("podman volume inspect {name}"),
        ),
        Err(e) if e.is_missing() => pass(
            "home volume",
            format!("{name} does not exist yet: the first session creates it"),
        ),
        Err(e) => fail(
            "home volume",
            format!("{name}: {e}"),
            format!("podman volume inspect {name}; remove it with `podman volume rm {name}` if it is broken (it holds the sandbox's home)"),
        ),
    }
}

fn leftovers(listing: &Result<String, PodmanError>) -> Check {
    let json = match listing {
        Ok(json) => json,
        Err(e) => {
            return warn(
                "leftovers",
                format!("cannot list session networks: {e}"),
                "podman network ls",
            )
        }
    };
    match crate::session::stale_networks(json) {
        Ok((0, live)) => pass(
            "leftovers",
            format!("no objects of killed sessions ({live} live session(s))"),
        ),
        Ok((stale, live)) => warn(
            "leftovers",
            format!("{stale} session(s) whose launcher is gone left objects behind ({live} live)"),
            "the next session removes them: run `agent-sandbox --exec true` in a project directory",
        ),
        Err(e) => warn("leftovers", format!("{e:#}"), "podman network ls"),
    }
}

fn storage(driver: &str, sandbox_size: Option<u64>) -> Check {
    if driver == "vfs" {
        let size = sandbox_size.map_or_else(String::new, |s| format!(" ({} MB)", s >> 20));
        return warn(
            "storage driver",
            format!("vfs: every session start copies the whole sandbox image{size}, about 20 s for 1.5 GB"),
            "install fuse-overlayfs (podman 4 on kernels before 5.13; kernels from 5.13 have native rootless overlay), set driver = \"overlay\" in ~/.config/containers/storage.conf, then `podman system reset` (it deletes your containers and images)",
        );
    }
    pass("storage driver", driver.to_owned())
}

fn trial(trial: Option<&Result<String, PodmanError>>) -> Check {
    match trial {
        None => Check::skip(
            Section::Prerequisites,
            "trial run",
            "not tried: podman or the router image is missing",
        ),
        Some(Ok(out)) => pass(
            "trial run",
            format!("podman started the router image: {}", out.trim()),
        ),
        Some(Err(e)) => {
            let text = e.to_string();
            fail("trial run", text.clone(), known_fix(&text))
        }
    }
}

/// The known fix for podman's error when it cannot start a container.
fn known_fix(error: &str) -> String {
    if error.contains("setrlimit") || error.contains("RLIMIT_NOFILE") {
        "podman's default ulimits are above your hard limit (rootful podman with runc on Debian 12): \
         add default_ulimits = [\"nofile=20000:20000\", \"nproc=4096:4096\"] under [containers] in \
         /etc/containers/containers.conf (or ~/.config/containers/containers.conf)"
            .into()
    } else if error.contains("hybrid mode") || error.contains("cgroups v1") {
        "crun does not run on hybrid cgroups: install runc and set runtime = \"runc\" under [engine] in containers.conf".into()
    } else if error.contains("newuidmap") || error.contains("newgidmap") {
        "install the uidmap package (newuidmap/newgidmap) and give your user an /etc/subuid and /etc/subgid range".into()
    } else if error.contains("/dev/net/tun") {
        "rootless networking needs /dev/net/tun: sudo modprobe tun".into()
    } else {
        "run the command shown by hand and fix what podman reports".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(stderr: &str) -> PodmanError {
        use std::os::unix::process::ExitStatusExt as _;
        PodmanError::Failed {
            command: "podman x".into(),
            status: std::process::ExitStatus::from_raw(125 << 8),
            stderr: stderr.into(),
        }
    }

    fn info(rootless: bool, uid_size: u64) -> Info {
        Info::parse(&format!(
            r#"{{"host":{{"security":{{"rootless":{rootless}}},"cgroupVersion":"v2","networkBackend":"netavark",
              "idMappings":{{"uidmap":[{{"container_id":0,"host_id":1000,"size":{uid_size}}}],
                             "gidmap":[{{"container_id":0,"host_id":1000,"size":{uid_size}}}]}}}},
              "store":{{"graphDriverName":"overlay"}},"version":{{"Version":"5.8.2"}}}}"#
        ))
        .unwrap()
    }

    fn facts(subuid: &str) -> Facts {
        Facts {
            info: Err(PodmanError::NotInstalled),
            images: [
                ("localhost/r:dev".into(), Err(PodmanError::NotInstalled)),
                ("localhost/s:dev".into(), Err(PodmanError::NotInstalled)),
            ],
            session_networks: Ok("[]".into()),
            volume: ("v".into(), Ok("/v".into())),
            allowlist: "/nonexistent/allowed-hosts".into(),
            trial: None,
            user: ("me".into(), 1000),
            subids: [subuid.into(), subuid.into()],
            userns: [None, Some("100\n".into())],
            dev_fuse: Ok(()),
            runtime_dir: None,
            aardvark: None,
            api_key_set: false,
            oauth_store: None,
        }
    }

    #[test]
    fn credential_injection_names_the_terminated_hosts() {
        let dir = crate::workdir::system_temp_dir()
            .join(format!("as-doctor-inject-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let list = dir.join("allowed-hosts");
        let store = dir.join("state/agent-sandbox/oauth");
        fs::write(&list, "api.anthropic.com\n").unwrap();
        let c = credentials(&list, true, Some(&store));
        assert_eq!(c.status, Status::Pass);
        assert!(
            c.detail.starts_with("terminated: api.anthropic.com ("),
            "{}",
            c.detail
        );
        assert!(
            c.detail
                .contains("platform.claude.com is not on the allowlist"),
            "{}",
            c.detail
        );
        let c = credentials(&list, false, Some(&store));
        assert!(
            c.detail.contains("ANTHROPIC_API_KEY is not set"),
            "{}",
            c.detail
        );
        fs::write(&list, "example.com\n").unwrap();
        assert!(credentials(&list, true, Some(&store))
            .detail
            .contains("not on the allowlist"));
        // Both hosts of the sign-in allowed: both terminated, and the store's place is shown.
        fs::write(&list, "api.anthropic.com\nplatform.claude.com\n").unwrap();
        let c = credentials(&list, false, Some(&store));
        assert!(
            c.detail
                .starts_with("terminated: api.anthropic.com, platform.claude.com ("),
            "{}",
            c.detail
        );
        assert!(
            c.detail.contains(&store.display().to_string()),
            "{}",
            c.detail
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn versions() {
        assert_eq!(version("4.3.1").status, Status::Pass);
        assert!(version("4.3.1").detail.contains("slirp4netns"));
        assert!(version("5.8.2").detail.contains("pasta"));
        assert_eq!(version("4.2.0").status, Status::Fail);
        assert_eq!(version("3.4.4").status, Status::Fail);
        assert_eq!(version("6.0.0-dev").status, Status::Warn);
        assert_eq!(version("garbage").status, Status::Warn);
    }

    #[test]
    fn podman_missing_is_one_failure_with_the_install_command() {
        let checks = judge(&facts(""));
        assert_eq!(checks[0].name, "podman");
        assert_eq!(checks[0].status, Status::Fail);
        assert!(checks[0].fix.as_deref().unwrap().contains("install podman"));
        assert_eq!(checks.len(), 2, "then only the allowlist: {checks:?}");
    }

    #[test]
    fn subordinate_ranges() {
        let f = facts("me:100000:65536\n");
        assert_eq!(subids(&f, &info(true, 65537)).status, Status::Pass);
        // Ranges in the files, but podman was not migrated.
        assert_eq!(subids(&f, &info(true, 1)).status, Status::Fail);
        let none = facts("other:100000:65536\n");
        let c = subids(&none, &info(true, 1));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("no range in /etc/subuid or /etc/subgid"),
            "{c:?}"
        );
        assert!(c.fix.unwrap().contains("usermod --add-subuids"));
        assert_eq!(subids(&none, &info(false, 0)).status, Status::Skip);
        assert_eq!(range_of("1000:5:6\n", "x", 1000).as_deref(), Some("5+6"));
    }

    #[test]
    fn images_missing_old_and_current() {
        let (c, _) = image_check(
            0,
            "localhost/r:dev",
            &Err(failed("Error: r: image not known\nno such image")),
        );
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("make build"));
        let (c, _) = image_check(1, "registry.example/s:1", &Ok("[]".into()));
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("podman pull"));
        let ours = env!("CARGO_PKG_VERSION");
        let json =
            |v: &str| format!(r#"[{{"Size":1048576,"Labels":{{"agent-sandbox.version":"{v}"}}}}]"#);
        let (c, size) = image_check(1, "localhost/s:dev", &Ok(json(ours)));
        assert_eq!((c.status, size), (Status::Pass, Some(1 << 20)));
        let (c, _) = image_check(1, "localhost/s:dev", &Ok(json("0.0.1")));
        assert_eq!(c.status, Status::Warn);
        // The router of another release fails: it is the boundary the containment checks describe.
        let (c, _) = image_check(0, "localhost/r:dev", &Ok(json("0.0.1")));
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("make build"));
        let (c, _) = image_check(1, "localhost/s:dev", &Ok(r#"[{"Labels":null}]"#.into()));
        assert_eq!(c.status, Status::Warn);
    }

    #[test]
    fn allowlist_errors_name_their_lines() {
        let dir =
            crate::workdir::system_temp_dir().join(format!("as-doctor-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("allowed-hosts");
        fs::write(&path, "example.com\n10.0.0.1\n*.bad.com\n").unwrap();
        let c = allowlist(&path);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains(":2:") && c.detail.contains(":3:"),
            "{}",
            c.detail
        );
        fs::write(&path, "example.com\n").unwrap();
        assert_eq!(allowlist(&path).status, Status::Pass);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(allowlist(Path::new("/nonexistent/a")).status, Status::Pass);
    }

    #[test]
    fn storage_backend_runtime_dir_and_userns() {
        let c = storage("vfs", Some(1500 << 20));
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("1500 MB") && c.fix.unwrap().contains("overlay"));
        assert_eq!(storage("overlay", None).status, Status::Pass);
        let mut i = info(true, 2);
        assert_eq!(
            network_backend(&i, Some(Path::new("/a"))).status,
            Status::Pass
        );
        assert_eq!(network_backend(&i, None).status, Status::Fail);
        i.host.network_backend = "cni".into();
        let c = network_backend(&i, Some(Path::new("/a")));
        assert!(c.status == Status::Fail && c.detail.contains("CNI is not"));
        assert_eq!(runtime_dir(false, None).status, Status::Skip);
        assert_eq!(runtime_dir(true, None).status, Status::Warn);
        assert_eq!(
            runtime_dir(true, Some(&("/run/user/1".into(), false))).status,
            Status::Fail
        );
        assert_eq!(userns(&[Some("0\n".into()), None]).status, Status::Fail);
        assert_eq!(userns(&[None, Some("0".into())]).status, Status::Fail);
        assert_eq!(
            userns(&[Some("1".into()), Some("9".into())]).status,
            Status::Pass
        );
        assert_eq!(cgroups("v1").status, Status::Warn);
    }

    /// The trial run names an empty directory of its own as the only hooks directory, and removes it.
    #[test]
    fn the_trial_run_runs_no_hook() {
        let dir = crate::workdir::system_temp_dir()
            .join(format!("as-trial-hooks-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let script = dir.join("podman");
        // Answers with where its hooks directory was, if it was there and empty.
        fs::write(
            &script,
            "#!/bin/sh\n[ \"$1\" = --hooks-dir ] && [ -d \"$2\" ] && [ -z \"$(ls -A \"$2\")\" ] || exit 3\n\
             hooks=\"$2\"; shift 2; [ \"$1\" = run ] || exit 4\nprintf '%s' \"$hooks\"\n",
        )
        .unwrap();
        fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let hooks = trial_run(&Podman::stand_in(&script), "localhost/r:dev");
        let _ = fs::remove_dir_all(&dir);
        let hooks = PathBuf::from(hooks.unwrap());
        assert!(
            hooks.starts_with(std::env::temp_dir()),
            "{}",
            hooks.display()
        );
        assert!(!hooks.exists(), "{} left behind", hooks.display());
    }

    #[test]
    fn trial_run_failures_get_the_known_fix() {
        let c = trial(Some(&Err(failed(
            "Error: OCI runtime error: runc: setrlimit RLIMIT_NOFILE: Operation not permitted",
        ))));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("setrlimit RLIMIT_NOFILE"),
            "podman's own error: {c:?}"
        );
        assert!(c.fix.unwrap().contains("default_ulimits"));
        assert!(known_fix("crun: cgroups in hybrid mode not supported").contains("runc"));
        assert_eq!(
            trial(Some(&Ok("agent-sandbox-router 0.4.0\n".into()))).status,
            Status::Pass
        );
        assert_eq!(trial(None).status, Status::Skip);
    }
}
