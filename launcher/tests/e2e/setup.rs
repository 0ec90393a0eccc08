//! What the suite prepares once for both modes: a directory of artifacts (a test CA and server
//! certificate, the upstream server script, the static probe and the tarball nested podman imports), and
//! the unprivileged user of the rootless run with the images in its storage.

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::mode::{chown_r, repo_file, sh, text, uid_gid, Mode};
use crate::{ROUTER_IMAGE, SANDBOX_IMAGE, TEST_USER};

/// The shared artifacts directory (world-readable: the rootless user's containers mount from it),
/// removed on drop.
pub(crate) struct Artifacts {
    /// The directory itself, under the temp dir, named after this process.
    pub(crate) dir: PathBuf,
    /// The test CA's certificate (next to the server's certificate and key in `certs/`).
    pub(crate) ca: PathBuf,
}

impl Artifacts {
    /// Builds the probe, makes the certificates and the nested tarball, copies the upstream script.
    pub(crate) fn prepare() -> Artifacts {
        let dir = std::env::temp_dir().join(format!("as-e2e-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        // Removed by drop from here on, also when a step below fails.
        let mut artifacts = Artifacts {
            dir,
            ca: PathBuf::new(),
        };
        let dir = &artifacts.dir;
        let probe = build_probe(dir);
        let ca = make_certs(dir);
        fs::copy(repo_file("tests/e2e/upstream.py"), dir.join("upstream.py")).unwrap();
        fs::copy(repo_file("tests/e2e/standin.py"), dir.join("standin.py")).unwrap();
        // The busybox + probe tarball the nested test imports (owned by root: nested root is the user).
        let bb = dir.join("bbroot/bin");
        fs::create_dir_all(&bb).unwrap();
        fs::copy("/bin/busybox", bb.join("busybox")).unwrap();
        fs::copy(&probe, bb.join("probe")).unwrap();
        let tar = sh(Command::new("tar").args([
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
            dir.join("bbroot").to_str().unwrap(),
            "-cf",
            dir.join("nested.tar").to_str().unwrap(),
            ".",
        ]));
        assert!(tar.status.success(), "{}", text(&tar));
        for f in ["nested.tar", "upstream.py", "standin.py"] {
            fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o644)).unwrap();
        }
        artifacts.ca = ca;
        artifacts
    }
}

impl Drop for Artifacts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Creates the rootless run's user if missing (and keeps it: its image storage makes reruns fast). The
/// rootful run needs it too: nested podman in a rootful sandbox runs as a non-root project owner.
pub(crate) fn ensure_test_user() {
    if sh(Command::new("id").arg(TEST_USER)).status.code() != Some(0) {
        let o = sh(Command::new("useradd").args(["-m", "-s", "/bin/bash", TEST_USER]));
        assert!(o.status.success(), "useradd: {}", text(&o));
    }
}

/// The unprivileged user for the rootless run, with the images in its storage.
pub(crate) fn rootless_user_mode() -> Mode {
    ensure_test_user();
    // Rootless networking needs the tun device (CI machines ship it root-only).
    if let Ok(meta) = fs::metadata("/dev/net/tun") {
        if meta.mode() & 0o006 != 0o006 {
            let _ = fs::set_permissions("/dev/net/tun", fs::Permissions::from_mode(0o666));
        }
    }
    let (uid, gid, home) = uid_gid(TEST_USER);
    let mode = Mode {
        user: Some(TEST_USER.into()),
        uid,
        gid,
        home,
    };
    // Native overlay storage: the distribution default for rootless podman 4.3 here is vfs, which
    // copies the whole sandbox image for every container.
    let conf_dir = mode.home.join(".config/containers");
    let storage = conf_dir.join("storage.conf");
    if !storage.exists() {
        fs::create_dir_all(&conf_dir).unwrap();
        fs::write(&storage, "[storage]\ndriver = \"overlay\"\n").unwrap();
        chown_r(&mode.home.join(".config"), uid, gid);
    }
    for image in [ROUTER_IMAGE, SANDBOX_IMAGE] {
        let id = |m: Option<&Mode>| -> String {
            let o =
                match m {
                    Some(m) => m.podman(&["image", "inspect", "--format", "{{.Id}}", image]),
                    None => sh(Command::new("podman")
                        .args(["image", "inspect", "--format", "{{.Id}}", image])),
                };
            String::from_utf8_lossy(&o.stdout).trim().to_owned()
        };
        let want = id(None);
        assert!(
            !want.is_empty(),
            "{image} is missing: run `make build` first"
        );
        let had = id(Some(&mode));
        if had != want {
            eprintln!("loading {image} into {TEST_USER}'s storage");
            let mut save = Command::new("podman")
                .args(["save", image])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let load = mode
                .command("podman", &[])
                .args(["load", "--quiet"])
                .stdin(save.stdout.take().unwrap())
                .output()
                .unwrap();
            assert!(save.wait().unwrap().success());
            assert!(load.status.success(), "podman load: {}", text(&load));
            // The copy an earlier run loaded is superseded (and untagged) now: remove it rather than
            // let every rebuild leave a copy of the images behind. Only this user's storage, which
            // holds nothing but what this suite loaded; an image still in use stays.
            if !had.is_empty() {
                let _ = mode.podman(&["rmi", &had]);
            }
        }
    }
    mode
}

/// A static probe for nested containers (see tests/e2e/probe.rs).
fn build_probe(dir: &Path) -> PathBuf {
    let out = dir.join("probe");
    let o = sh(Command::new("rustc").args([
        "--edition",
        "2021",
        "-O",
        "-C",
        "target-feature=+crt-static",
        "--target",
        &format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
        repo_file("tests/e2e/probe.rs").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "building the probe: {}", text(&o));
    out
}

/// A test CA and a server certificate for every test name.
fn make_certs(dir: &Path) -> PathBuf {
    let certs = dir.join("certs");
    fs::create_dir_all(&certs).unwrap();
    let run = |args: &[&str]| {
        let o = sh(Command::new("openssl").current_dir(&certs).args(args));
        assert!(o.status.success(), "openssl {args:?}: {}", text(&o));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=agent-sandbox e2e CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    fs::write(
        certs.join("ext.cnf"),
        "subjectAltName=DNS:web.test,DNS:wild.test,DNS:*.wild.test,DNS:db.test,DNS:blocked.test,DNS:api.anthropic.com,DNS:platform.claude.com\n",
    )
    .unwrap();
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=web.test",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    ]);
    for f in ["ca.crt", "server.crt", "server.key"] {
        fs::set_permissions(certs.join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }
    fs::set_permissions(&certs, fs::Permissions::from_mode(0o755)).unwrap();
    certs.join("ca.crt")
}
