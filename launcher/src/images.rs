//! `agent-sandbox --build-images`: the one way the images are built (`make build` runs it).
//!
//! The router image is `FROM scratch` with the static router and forwarder, so those two are built
//! first with cargo (statically linked for this machine's architecture); then podman builds the router
//! image and the sandbox image from `containers/`. This needs a source checkout: the path is the one
//! this launcher was compiled from.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

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

/// Where the router image's Containerfile finds the static binaries, relative to the source tree (its
/// build context).
fn static_bin_dir() -> PathBuf {
    Path::new("target").join(static_target()).join("release")
}

/// CA bundles a build may use to reach package registries from behind a TLS-inspecting proxy. Passed to
/// the sandbox build as the `ca-bundle` secret: it trusts what this host trusts, and is not kept in
/// the image.
const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// Builds the static binaries and both images, tagged with the configured image names.
pub fn build(podman: &Podman, settings: &Settings, base_image: Option<&str>) -> anyhow::Result<()> {
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

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let target = static_target();
    eprintln!("agent-sandbox: building the static router and forwarder ({target})");
    let status = Command::new(&cargo)
        .current_dir(&tree)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            &target,
            "-p",
            "agent-sandbox-router",
            "-p",
            "agent-sandbox-forwarder",
        ])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status()
        .with_context(|| format!("cannot run {}", cargo.to_string_lossy()))?;
    if !status.success() {
        bail!("building the router and forwarder failed ({status})");
    }

    eprintln!("agent-sandbox: building {}", settings.router_image);
    podman.run_visible(&args::build(
        &router_file,
        &tree,
        &settings.router_image,
        &[(
            "BIN_DIR".to_owned(),
            static_bin_dir().to_string_lossy().into_owned(),
        )],
        &[],
    ))?;

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
        &sandbox_dir,
        &settings.image,
        &build_args,
        &secrets,
    ))?;
    eprintln!(
        "agent-sandbox: built {} and {}",
        settings.router_image, settings.image
    );
    Ok(())
}
