//! `agent-sandbox-forwarder [--relays FILE] [LISTEN=TARGET...]`: parses the relays, sets up logging, a
//! single-threaded runtime and the signals (SIGHUP re-reads the relays file), and hands over to the
//! library.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agent_sandbox_forwarder::cli::{self, Invocation};
use agent_sandbox_forwarder::log::{self, Level};
use agent_sandbox_forwarder::{Forwarder, Options, Relay};
use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};

fn main() -> ExitCode {
    // Written with `writeln!` and the result ignored: `println!` would panic on a closed pipe.
    let (relays, file) = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Invocation::Run { relays, file }) => (relays, file),
        Ok(Invocation::Help) => {
            let _ = writeln!(std::io::stdout(), "{}", cli::HELP);
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Version) => {
            let version = env!("CARGO_PKG_VERSION");
            let _ = writeln!(std::io::stdout(), "agent-sandbox-forwarder {version}");
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            let _ = writeln!(
                std::io::stderr(),
                "agent-sandbox-forwarder: error: {err}\n\n{}\n\nFor more information, try '--help'.",
                cli::USAGE
            );
            return ExitCode::from(2);
        }
    };
    log::set_max_level(
        std::env::var("RUST_LOG")
            .ok()
            .and_then(|level| level.parse().ok())
            .unwrap_or(Level::Info),
    );
    match serve(relays, file) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            agent_sandbox_forwarder::log!(Level::Error, "{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The argument relays plus the file's, checked for listen addresses given twice.
fn all_relays(args: &[Relay], file: Option<&Path>) -> Result<Vec<Relay>, String> {
    let mut relays = args.to_vec();
    if let Some(file) = file {
        relays.extend(cli::read_relays_file(file)?);
    }
    cli::check_unique(&relays)?;
    Ok(relays)
}

/// Binds, then relays until SIGTERM or SIGINT; SIGHUP re-reads the relays file.
fn serve(args: Vec<Relay>, file: Option<PathBuf>) -> anyhow::Result<()> {
    let relays = all_relays(&args, file.as_deref()).map_err(anyhow::Error::msg)?;
    // One thread is plenty for a relay on loopback, and keeps the idle footprint small.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        // Installed before binding, so that a stop request during startup is not lost. As PID 1 of its
        // container the forwarder gets no default SIGTERM action from the kernel: without these handlers
        // `podman stop` would wait out its timeout and then SIGKILL. SIGHUP's default would end it.
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let forwarder = Forwarder::bind(&relays, Options::default()).await?;
        // After the signal handlers: from this line on, SIGHUP reloads instead of ending the process.
        agent_sandbox_forwarder::log!(Level::Info, "ready: {} relays", relays.len());
        let (reload_tx, reloads) = tokio::sync::mpsc::channel(1);
        let stop = async {
            loop {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                    _ = hup.recv() => {
                        let Some(file) = &file else {
                            agent_sandbox_forwarder::log!(Level::Warn, "SIGHUP: no --relays file to re-read; nothing changes");
                            continue;
                        };
                        match all_relays(&args, Some(file)) {
                            // Waits while an earlier reload is still being applied, so lists apply in order.
                            Ok(relays) => {
                                let _ = reload_tx.send(relays).await;
                            }
                            Err(err) => agent_sandbox_forwarder::log!(Level::Error, "SIGHUP: reload refused, relays unchanged: {err}"),
                        }
                        continue;
                    }
                };
                agent_sandbox_forwarder::log!(Level::Info, "{name}: exiting");
                break;
            }
        };
        forwarder.run_with_reloads(reloads, stop).await
    })
    // Dropping the runtime here drops every connection: the stop is immediate.
}
