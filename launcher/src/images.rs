//! `agent-sandbox --build-images`: the one way the images are built (`make build` runs it).
//!
//! The router image is `FROM scratch` with the static router and forwarder, so those two are built
//! first with cargo (statically linked for this machine's architecture) and copied into a build context
//! of their own; then podman builds the router image and the sandbox image from `containers/`. The
//! sandbox image's context is `containers/sandbox` plus a tarball of the static nested probe
//! (`nested-probe/`), which `agent-sandbox doctor` imports with nested podman. This needs a source
//! checkout: the path is the one this launcher was compiled from.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

use crate::cli::ImageSet;
use crate::podman::{args, Podman};
use crate::settings::Settings;

/// The source tree this launcher was built from.
fn source_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The target triple of the static router and forwarder.
fn static_target() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// CA bundles a build may use to reach package registries from behind a TLS-inspecting proxy. Passed to
/// the sandbox build as the `ca-bundle` secret: it trusts what this host trusts, and is not kept in
/// the image.
const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// Builds the static binaries and the images, tagged with the configured image names.
pub fn build(
    podman: &Podman,
    settings: &Settings,
    which: ImageSet,
    base_image: Option<&str>,
) -> anyhow::Result<()> {
    let tree = source_tree();
    let router_file = tree.join("containers/router/Containerfile");
    let sandbox_dir = tree.join("containers/sandbox");
    if !router_file.is_file() || !sandbox_dir.join("Containerfile").is_file() {
        bail!(
            "--build-images needs the agent-sandbox source tree this launcher was built from ({}), \
             and it is not there; installed launchers use published images",
            tree.display()
        );
    }

    if which != ImageSet::Sandbox {
        build_router(podman, settings, &tree, &router_file)?;
    }
    if which != ImageSet::Router {
        build_sandbox(podman, settings, &tree, &sandbox_dir, base_image)?;
    }
    Ok(())
}

/// The static router and forwarder, then the router image from a context holding only them.
fn build_router(
    podman: &Podman,
    settings: &Settings,
    tree: &Path,
    router_file: &Path,
) -> anyhow::Result<()> {
    // The forwarder uses the release-small profile to stay within its size budget.
    let router = build_static(tree, "agent-sandbox-router", "release")?;
    let forwarder = build_static(tree, "agent-sandbox-forwarder", "release-small")?;
    // Only the two binaries go to podman: the build context must not be the whole target directory.
    let context = fresh_dir(&target_dir(tree).join("router-image"))?;
    for from in [router, forwarder] {
        let name = from.file_name().unwrap_or_default();
        fs::copy(&from, context.join(name))
            .with_context(|| format!("cannot copy {}", from.display()))?;
    }

    eprintln!("agent-sandbox: building {}", settings.router_image);
    podman
        .run_visible(&args::build(
            router_file,
            &context,
            &settings.router_image,
            &[],
            &[],
        ))
        .map_err(Into::into)
}

/// The cargo target directory of the source tree.
fn target_dir(tree: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| tree.join("target"), PathBuf::from)
}

/// An empty directory at `dir` (whatever was there removed).
fn fresh_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.to_owned())
}

/// Builds `package` statically for this machine's architecture with `profile`; returns the binary.
fn build_static(tree: &Path, package: &str, profile: &str) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let target = static_target();
    eprintln!("agent-sandbox: building a static {package} ({target}, {profile})");
    // An explicit --target keeps build scripts and proc macros dynamic while the binary is static.
    let status = Command::new(&cargo)
        .current_dir(tree)
        .args([
            "build",
            "--locked",
            "--target",
            &target,
            "--profile",
            profile,
            "-p",
            package,
        ])
        .env(
            "RUSTFLAGS",
            format!(
                "{} -C target-feature=+crt-static",
                std::env::var("RUSTFLAGS").unwrap_or_default()
            ),
        )
        .status()
        .with_context(|| format!("cannot run {}", cargo.to_string_lossy()))?;
    if !status.success() {
        bail!("building {package} failed ({status})");
    }
    Ok(target_dir(tree).join(&target).join(profile).join(package))
}

/// The sandbox image from `containers/sandbox`, in a build context of its own that also holds
/// [`NESTED_PROBE_TARBALL`]: the files of `containers/sandbox` and the tarball the doctor's nested
/// podman check imports.
fn build_sandbox(
    podman: &Podman,
    settings: &Settings,
    tree: &Path,
    sandbox_dir: &Path,
    base_image: Option<&str>,
) -> anyhow::Result<()> {
    let probe = build_static(tree, NESTED_PROBE_PACKAGE, "release-small")?;
    let context = fresh_dir(&target_dir(tree).join("sandbox-image"))?;
    for entry in fs::read_dir(sandbox_dir)
        .with_context(|| format!("cannot read {}", sandbox_dir.display()))?
    {
        let from = entry?.path();
        if from.is_file() {
            let to = context.join(from.file_name().unwrap_or_default());
            fs::copy(&from, &to).with_context(|| format!("cannot copy {}", from.display()))?;
        }
    }
    let binary = fs::read(&probe).with_context(|| format!("cannot read {}", probe.display()))?;
    let tarball = context.join(NESTED_PROBE_TARBALL);
    fs::write(&tarball, probe_tarball(&binary)?)
        .with_context(|| format!("cannot write {}", tarball.display()))?;

    eprintln!("agent-sandbox: building {}", settings.image);
    let build_args: Vec<(String, String)> = base_image
        .map(|b| vec![("BASE".to_owned(), b.to_owned())])
        .unwrap_or_default();
    let secrets: Vec<(String, PathBuf)> = CA_BUNDLES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(|p| vec![("ca-bundle".to_owned(), p.to_owned())])
        .unwrap_or_default();
    podman.run_visible(&args::build(
        &context.join("Containerfile"),
        &context,
        &settings.image,
        &build_args,
        &secrets,
    ))?;
    Ok(())
}

/// The package of the nested probe (`nested-probe/`).
const NESTED_PROBE_PACKAGE: &str = "agent-sandbox-nested-probe";

/// The tarball's name in the sandbox build context (the Containerfile copies it to
/// [`crate::doctor::selftest::NESTED_PROBE_IN_IMAGE`]).
pub const NESTED_PROBE_TARBALL: &str = "nested-probe.tar";

/// The probe's path inside the nested container's root filesystem.
pub const NESTED_PROBE_PATH: &str = "/nested-probe";

/// A tar archive (ustar) whose only file is the probe at [`NESTED_PROBE_PATH`], owned by root, mode
/// 0755, dated 1970: the same binary always gives the same bytes, so the image layer that holds it
/// stays cached until the probe changes. Written here rather than with tar(1), whose options differ
/// between GNU and BSD.
pub fn probe_tarball(binary: &[u8]) -> anyhow::Result<Vec<u8>> {
    const BLOCK: usize = 512;
    let name = NESTED_PROBE_PATH.trim_start_matches('/');
    // ustar's size field: 11 octal digits.
    if binary.len() as u64 >= 8u64.pow(11) {
        bail!(
            "the probe is too large for a tar entry ({} bytes)",
            binary.len()
        );
    }
    let mut header = [0u8; BLOCK];
    let mut put = |at: usize, field: &[u8]| header[at..at + field.len()].copy_from_slice(field);
    put(0, name.as_bytes());
    put(100, b"0000755\0");
    put(108, b"0000000\0");
    put(116, b"0000000\0");
    put(124, format!("{:011o}\0", binary.len()).as_bytes());
    put(136, b"00000000000\0");
    put(148, b"        ");
    put(156, b"0");
    put(257, b"ustar\0");
    put(263, b"00");
    put(265, b"root");
    put(297, b"root");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let padded = binary.len().div_ceil(BLOCK) * BLOCK;
    let mut out = Vec::with_capacity(BLOCK + padded + 2 * BLOCK);
    out.extend_from_slice(&header);
    out.extend_from_slice(binary);
    out.resize(BLOCK + padded + 2 * BLOCK, 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_tarball_is_one_root_owned_executable_that_tar_reads() {
        let binary: Vec<u8> = (0..1300u32).map(|i| (i % 251) as u8).collect();
        let tar = probe_tarball(&binary).unwrap();
        assert_eq!(tar.len() % 512, 0);
        assert_eq!(tar, probe_tarball(&binary).unwrap(), "deterministic");
        let dir = std::env::temp_dir().join(format!("as-probe-tar-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.tar");
        fs::write(&file, &tar).unwrap();
        let list = Command::new("tar")
            .args(["--numeric-owner", "-tvf"])
            .arg(&file)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&list.stdout).into_owned();
        let out = dir.join("out");
        fs::create_dir_all(&out).unwrap();
        let x = Command::new("tar")
            .arg("-xf")
            .arg(&file)
            .arg("-C")
            .arg(&out)
            .status()
            .unwrap();
        let extracted = fs::read(out.join("nested-probe"));
        let _ = fs::remove_dir_all(&dir);
        assert!(list.status.success() && x.success(), "{listing}");
        assert!(
            listing.starts_with("-rwxr-xr-x 0/0") && listing.contains(" 1300 1970-01-01"),
            "{listing}"
        );
        assert!(listing.trim_end().ends_with(" nested-probe"), "{listing}");
        assert_eq!(extracted.unwrap(), binary);
    }
}
