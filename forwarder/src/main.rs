//! `agent-sandbox-forwarder LISTEN=TARGET...`: parses the relays, sets up logging, a single-threaded
//! runtime and the signals, and hands over to the library.

use std::io::Write as _;
use std::process::ExitCode;

use agent_sandbox_forwarder::cli::{self, Invocation};
use agent_sandbox_forwarder::log::{self, Level};
use agent_sandbox_forwarder::{Forwarder, Options, Relay};
use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};

fn main() -> ExitCode {
    // Written with `writeln!` and the result ignored: `println!` would panic on a closed pipe.
    let relays = match cli::parse(std::env::args_os().skip(1)) {
        Ok(Invocation::Run(relays)) => relays,
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
    match serve(&relays) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            agent_sandbox_forwarder::log!(Level::Error, "{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Binds, then relays until SIGTERM or SIGINT.
fn serve(relays: &[Relay]) -> anyhow::Result<()> {
    // One thread is plenty for a relay on loopback, and keeps the idle footprint small.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        // Installed before binding, so that a stop request during startup is not lost. As PID 1 of its
        // container the forwarder gets no default SIGTERM action from the kernel: without these handlers
        // `podman stop` would wait out its timeout and then SIGKILL.
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let forwarder = Forwarder::bind(relays, Options::default()).await?;
        forwarder
            .run(async {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                agent_sandbox_forwarder::log!(Level::Info, "{name}: exiting");
            })
            .await
    })
    // Dropping the runtime here drops every connection: the stop is immediate.
}
