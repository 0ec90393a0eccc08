//! The `agent-sandbox` launcher: runs Claude Code (or any command) in a podman sandbox that sees only
//! the project directory and reaches only the allowlisted hosts, through a per-session router.
//!
//! `main.rs` only calls [`main`]. The modules: [`cli`] (what the user asked), [`settings`] (images,
//! allowlist, home volume), [`workdir`] (directories the sandbox may not be given), [`podman`] (every
//! podman command line), [`session`] (the topology and its lifecycle), [`liveness`] (stale sessions),
//! [`report`] (what the router refused), [`signals`], [`images`] (`--build-images`), [`inject`] (the
//! session CA and the placeholders that keep secrets out of the sandbox), [`oauth`] (the OAuth token
//! store and the home volume's placeholders), [`live`] (`allow`, `deny`, `reload`, `sessions`,
//! `blocked`: changing a running session's allowlist) and [`doctor`] (`agent-sandbox doctor`).

pub mod cli;
pub mod doctor;
pub mod images;
pub mod inject;
pub mod live;
pub mod liveness;
pub mod oauth;
pub mod podman;
pub mod report;
pub mod session;
pub mod settings;
pub mod signals;
pub mod workdir;

use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Action, Cli};
use crate::podman::Podman;
use crate::settings::Settings;
use crate::signals::SignalWatch;

/// Runs the launcher for an already parsed command line; returns the exit code.
pub fn run(action: Action) -> anyhow::Result<i32> {
    let mut settings = Settings::from_env(|k| std::env::var_os(k))?;
    let podman = Podman::default();
    match action {
        Action::Doctor(options) => doctor::run(&podman, &settings, &options),
        Action::PrintConfig { no_inject } => {
            settings.inject = !no_inject;
            print!("{}", settings.describe());
            print!("{}", inject_report(&settings));
            Ok(0)
        }
        Action::BuildImages { which, base_image } => {
            images::build(&podman, &settings, which, base_image.as_deref())?;
            Ok(0)
        }
        Action::Session { command, no_inject } => {
            settings.inject = !no_inject;
            let signals = SignalWatch::install()?;
            match session::run(&podman, &settings, command, &signals) {
                Ok(code) => Ok(code),
                Err(e) => match e.interrupted_exit_code() {
                    Some(code) => {
                        eprintln!("agent-sandbox: {e}");
                        Ok(code)
                    }
                    None => Err(e.into()),
                },
            }
        }
    }
}

/// `--print-config`'s part on credential injection: which hosts a session started now would
/// terminate, why, and the router's `[inject]` section (with the placeholder, if one was made).
fn inject_report(settings: &Settings) -> String {
    let loaded = if settings.allowlist.exists() {
        agent_sandbox_shared::Allowlist::load(&settings.allowlist)
    } else {
        // The first session copies the default: judge by it.
        agent_sandbox_shared::Allowlist::parse(settings::EMBEDDED_ALLOWLIST, "default")
    };
    let policy = match loaded {
        Ok(list) => agent_sandbox_shared::Policy::new(&list),
        Err(e) => return format!("inject:         unknown: the allowlist does not load: {e}\n"),
    };
    let store = oauth::default_store_dir();
    let decision = inject::decide(
        &policy,
        inject::host_api_key().is_some(),
        store.as_deref(),
        settings.inject,
    );
    let placeholder =
        inject::placeholder::stored(&settings.state_dir, &settings.home_volume).unwrap_or(None);
    inject::describe(
        &decision,
        placeholder.as_deref(),
        settings.test_upstream_roots.is_some(),
    )
}

/// The whole program: parse, run, report errors (with their causes) on stderr.
#[must_use]
pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = live::main_if_live(&argv) {
        return code;
    }
    let action = match doctor::cli::parse(&argv) {
        Some(Ok(options)) => Ok(Action::Doctor(options)),
        Some(Err(e)) => e.exit(),
        None => Cli::parse_from(argv).action(),
    };
    let action = match action {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("agent-sandbox: {msg}");
            return ExitCode::from(2);
        }
    };
    match run(action) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("agent-sandbox: {e:#}");
            ExitCode::FAILURE
        }
    }
}
