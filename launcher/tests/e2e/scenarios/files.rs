//! Files and powers (tests/e2e/scripts/files.sh): only the project is visible and writable, files
//! created there belong to the invoking user, and the sandbox has no capability, socket, setuid file or
//! host proxy variable. A volume that podman's own configuration would add to every container stops
//! the session before its command runs.

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use crate::mode::{chown_r, current_ids, sh};
use crate::suite::{finish, Suite};

/// Runs the scenario, recording its checks.
pub(crate) fn run(s: &mut Suite<'_>) {
    let dir = s.project("files");
    // Something outside the project that must stay invisible.
    let secret = s.fx.root.join("outside-secret");
    fs::write(&secret, "secret").unwrap();
    // The host's home (rootless: the user's real one) is not the sandbox's: its files stay outside.
    let marker = s.mode.home.join(".as-e2e-host-home-marker");
    fs::write(&marker, "host").unwrap();
    s.copy_script(&dir, "files.sh");
    // A file system mounted below the project on the host stays out: rootful, the project's bind
    // mount is not recursive; rootless, it is, and the file system is covered by an empty tmpfs
    // (needs root to mount; the suite runs as root). Rootless, a mount older than podman's user
    // namespace is locked there, which a non-recursive bind could not leave out; the recursive bind
    // and its cover are the same for it. Making one here would need `podman system migrate`, which
    // stops every container of the user, the suite's own upstreams included.
    let submount = dir.join("submount");
    fs::create_dir_all(&submount).unwrap();
    let mounted = current_ids().0 == 0
        && sh(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "as-e2e-submount"])
            .arg(&submount))
        .status
        .success();
    if mounted {
        fs::write(submount.join("marker"), "below").unwrap();
    }
    // podman would copy the host's proxy variables (with their credentials) into containers.
    let proxy = "http://user:as-e2e-proxy-secret@proxy.invalid:3128".to_owned();
    let r = s.launch_env(
        &dir,
        &[
            "--exec",
            "bash",
            "./files.sh",
            secret.to_str().unwrap(),
            marker.to_str().unwrap(),
        ],
        &[("http_proxy", proxy.clone()), ("HTTPS_PROXY", proxy)],
    );
    if mounted {
        let _ = sh(Command::new("umount").arg(&submount));
    }
    let _ = fs::remove_file(&marker);
    let mode = s.mode.clone();
    s.checks.script(
        &mode,
        &r.stdout,
        &[
            "project-writable",
            "outside-invisible",
            "host-home-invisible",
            "only-expected-host-mounts",
            "home-is-volume",
            "no-address-change",
            "no-route-change",
            "no-nftables",
            "hosts-readonly",
            "resolv-readonly",
            "forwarder-invisible",
            "no-podman-socket",
            "no-setuid-files",
            "no-capabilities",
            "no-host-proxy-variables",
            "ipv6-disabled",
        ],
    );
    if mounted {
        s.checks.script(&mode, &r.stdout, &["submount-invisible"]);
    }
    let created = dir.join("created-in-sandbox");
    let owner = fs::metadata(&created).map(|m| (m.uid(), m.gid()));
    let expect = if mode.rootful() {
        let m = fs::metadata(&dir).unwrap();
        (m.uid(), m.gid())
    } else {
        (mode.uid, mode.gid)
    };
    s.checks.check(
        owner.as_ref().is_ok_and(|o| o.0 == expect.0),
        format!(
            "[{}] a file created in $PWD is owned by the invoking user {expect:?} on the host: {owner:?}",
            mode.name()
        ),
    );
    configured_volume(s);
    configured_hook(s);
    bound_home_volume(s);
    terminal(s);
}

/// The suite's containers.conf with `line` added to its `[section]`, written for `case`.
fn configured(s: &Suite<'_>, case: &str, section: &str, line: &str) -> PathBuf {
    let base = std::env::var("CONTAINERS_CONF")
        .ok()
        .and_then(|p| fs::read_to_string(p).ok())
        .unwrap_or_default();
    let conf = s.fx.root.join(format!("configured-{case}.conf"));
    let header = format!("[{section}]\n");
    let text = if base.contains(&header) {
        base.replacen(&header, &format!("{header}{line}\n"), 1)
    } else {
        format!("{base}\n{header}{line}\n")
    };
    fs::write(&conf, text).unwrap();
    fs::set_permissions(&conf, fs::Permissions::from_mode(0o644)).unwrap();
    conf
}

/// A containers.conf `hooks_dir` holding an OCI hook for every container (it runs on this machine at
/// prestart, and could mount anything into the sandbox or add an interface to the pod's network
/// namespace): the session's podman commands name an empty directory of the session's as the only
/// one, so the session runs and the hook runs for none of its containers.
fn configured_hook(s: &mut Suite<'_>) {
    let name = s.mode.name().to_owned();
    let hooks = s.fx.root.join("configured-hooks");
    fs::create_dir_all(&hooks).unwrap();
    let marker = hooks.join("hook-ran");
    let script = hooks.join("hook.sh");
    fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\n", marker.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        hooks.join("as-e2e.json"),
        format!(
            r#"{{"version":"1.0.0","hook":{{"path":"{}"}},"when":{{"always":true}},"stages":["prestart"]}}"#,
            script.display()
        ),
    )
    .unwrap();
    if !s.mode.rootful() {
        chown_r(&hooks, s.mode.uid, s.mode.gid);
    }
    let conf = configured(
        s,
        "hook",
        "engine",
        &format!("hooks_dir = [\"{}\"]", hooks.display()),
    );
    let t = s.touch_session(
        "configured-hook",
        &[("CONTAINERS_CONF", conf.display().to_string())],
    );
    let hook_ran = marker.exists();
    // The same configuration does run the hook for a container podman starts on its own, so the
    // hook's not running above is the launcher's doing.
    let control = sh(s
        .mode
        .command("podman", &[("CONTAINERS_CONF", conf.display().to_string())])
        .args([
            "run",
            "--rm",
            "--pull=never",
            "--network",
            "none",
            "--label",
            crate::TEST_LABEL,
            crate::SANDBOX_IMAGE,
            "true",
        ]));
    s.checks.check(
        t.run.code == Some(0) && t.ran && !hook_ran && t.left.is_empty(),
        format!(
            "[{name}] a hooks_dir's OCI hook runs for none of the session's containers, and the \
             session runs: code {:?}, ran {}, hook ran {hook_ran}, left {:?}\n{}",
            t.run.code, t.ran, t.left, t.run.stderr
        ),
    );
    s.checks.check(
        control.status.success() && marker.exists(),
        format!(
            "[{name}] the same hooks_dir runs its hook for a container of podman's own: {:?}, hook \
             ran {}\n{}",
            control.status,
            marker.exists(),
            crate::mode::text(&control)
        ),
    );
}

/// A home volume made as a bind of a host directory (`podman volume create --opt type=none --opt
/// o=bind --opt device=DIR`): its source in the container's configuration is its directory in
/// podman's storage like any volume's, so the launcher reads what the volume is and refuses it before
/// anything of the session exists.
fn bound_home_volume(s: &mut Suite<'_>) {
    let name = s.mode.name().to_owned();
    let outside = s.fx.root.join("bound-home-outside");
    fs::create_dir_all(&outside).unwrap();
    let volume = format!("as-e2e-bound-home-{}", std::process::id());
    s.fx.volumes.push(volume.clone());
    let device = format!("device={}", outside.display());
    s.mode.podman_ok(&[
        "volume",
        "create",
        "--opt",
        "type=none",
        "--opt",
        "o=bind",
        "--opt",
        &device,
        &volume,
    ]);
    let t = s.touch_session(
        "bound-home",
        &[("AGENT_SANDBOX_HOME_VOLUME", volume.clone())],
    );
    let stderr = &t.run.stderr;
    s.checks.check(
        t.run.code != Some(0)
            && stderr.contains(&format!("the home volume {volume} has mount options"))
            && stderr.contains(&device)
            && stderr.contains("AGENT_SANDBOX_HOME_VOLUME")
            && !t.ran
            && fs::read_dir(&outside).is_ok_and(|mut d| d.next().is_none())
            && t.left.is_empty(),
        format!(
            "[{name}] a home volume that binds a host directory stops the session before its \
             command: code {:?}, ran {}, left {:?}\n{stderr}",
            t.run.code, t.ran, t.left
        ),
    );
}

/// On a terminal (a pseudo-terminal `script` gives it), the command gets one too, its exit code is
/// the launcher's, and the created-then-started container is attached to it.
fn terminal(s: &mut Suite<'_>) {
    let name = s.mode.name().to_owned();
    let dir = s.project("terminal");
    let mut c = s.mode.command(
        "script",
        &[("AGENT_SANDBOX_HOME_VOLUME", s.home_volume.clone())],
    );
    c.arg("-qec")
        .arg(format!(
            "cd '{}' && '{}' --exec bash -c 'tty; exit 3'",
            dir.display(),
            crate::LAUNCHER
        ))
        .arg("/dev/null")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let r = finish(c.spawn().unwrap(), Duration::from_secs(300));
    s.checks.check(
        r.code == Some(3) && r.stdout.contains("/dev/pts/"),
        format!(
            "[{name}] on a terminal the command has one and its exit code is the launcher's: \
             code {:?}\n{}{}",
            r.code, r.stdout, r.stderr
        ),
    );
}

/// A containers.conf with `volumes` (the suite's own settings plus one host directory, bound read-only
/// and as an `:O` overlay, which `podman container inspect` does not list) or with `devices`: the
/// launcher refuses to start the sandbox, names what it found and where it comes from, runs nothing
/// in it and leaves no session object behind.
fn configured_volume(s: &mut Suite<'_>) {
    let name = s.mode.name().to_owned();
    let outside = s.fx.root.join("configured-volume-outside");
    fs::create_dir_all(&outside).unwrap();
    let cases = [
        (
            "bind",
            "containers",
            format!("volumes = [\"{}:/as-e2e-outside:ro\"]", outside.display()),
            format!("{} at /as-e2e-outside (bind, read-only)", outside.display()),
        ),
        (
            "overlay",
            "containers",
            format!("volumes = [\"{}:/as-e2e-outside:O\"]", outside.display()),
            "at /as-e2e-outside (overlay".to_owned(),
        ),
        (
            "device",
            "containers",
            "devices = [\"/dev/fuse:/dev/as-e2e-fuse\"]".to_owned(),
            "/dev/as-e2e-fuse".to_owned(),
        ),
    ];
    for (case, section, line, found) in cases {
        let conf = configured(s, case, section, &line);
        let t = s.touch_session(
            &format!("configured-{case}"),
            &[("CONTAINERS_CONF", conf.display().to_string())],
        );
        let (r, ran, left) = (&t.run, t.ran, &t.left);
        s.checks.check(
            r.code != Some(0)
                && r.stderr.contains("refusing to start the sandbox")
                && r.stderr.contains(&found)
                && r.stderr.contains("containers.conf")
                && !ran
                && left.is_empty(),
            format!(
                "[{name}] {case} from containers.conf stops the session before its command: \
                 code {:?}, ran {}, left {left:?}\n{}",
                r.code, ran, r.stderr
            ),
        );
    }
}
