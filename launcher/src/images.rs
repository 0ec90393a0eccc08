//! `agent-sandbox --build-images`: the one way the images are built (`make build` runs it).
//!
//! The router image is `FROM scratch` with the static router and forwarder, so those two are built
//! first with cargo (statically linked for this machine's architecture) and copied into a build context
//! of their own; then podman builds the router image and the sandbox image from `containers/`. This needs a source checkout: the path is the one
//! this launcher was compiled from.

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
        build_sandbox(podman, settings, &sandbox_dir, base_image)?;
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
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let target = static_target();
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| tree.join("target"), PathBuf::from);
    // The forwarder uses the release-small profile to stay within its size budget.
    for (package, profile) in [
        ("agent-sandbox-router", "release"),
        ("agent-sandbox-forwarder", "release-small"),
    ] {
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
    }
    // Only the two binaries go to podman: the build context must not be the whole target directory.
    let context = target_dir.join("router-image");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context).with_context(|| format!("cannot create {}", context.display()))?;
    for (profile, binary) in [
        ("release", "agent-sandbox-router"),
        ("release-small", "agent-sandbox-forwarder"),
    ] {
        let from = target_dir.join(&target).join(profile).join(binary);
        fs::copy(&from, context.join(binary))
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

/// The sandbox image from `containers/sandbox`.
fn build_sandbox(
    podman: &Podman,
    settings: &Settings,
    sandbox_dir: &Path,
    base_image: Option<&str>,
) -> anyhow::Result<()> {
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
        &sandbox_dir.join("Containerfile"),
        sandbox_dir,
        &settings.image,
        &build_args,
        &secrets,
    ))?;
    Ok(())
}
