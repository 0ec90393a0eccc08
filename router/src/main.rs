//! `agent-sandbox-router`: parses the command line, sets up logging and the runtime, and maps the outcome
//! to an exit status (0 ok, 1 bad input or runtime failure, 2 usage). The work is in the library.

use std::process::ExitCode;

use agent_sandbox_router::cli::{BuildError, Cli};
use agent_sandbox_router::{bind_workers, describe, logging, run};
use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);

    let built = match cli.build_config() {
        Ok(b) => b,
        Err(BuildError::Usage(e)) => {
            eprintln!("agent-sandbox-router: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("agent-sandbox-router: {e}");
            return ExitCode::from(1);
        }
    };
    for w in &built.warnings {
        warn!("allowlist: {w}");
    }
    let config = match built.config.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent-sandbox-router: {e}");
            return ExitCode::from(1);
        }
    };
    if cli.check {
        print!("{}", describe(&config));
        return ExitCode::SUCCESS;
    }

    let workers = cli.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        usize::from,
    );
    let served = bind_workers(&config, workers).and_then(|sets| {
        run(config, sets, CancellationToken::new(), |shutdown| {
            // Signal handlers go in before readiness is reported, so a SIGTERM right after the
            // "listening on" lines is a clean shutdown rather than the default disposition.
            tokio::spawn(wait_for_signal(install_signals()?, shutdown));
            Ok(())
        })
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// SIGTERM and SIGINT streams.
fn install_signals() -> anyhow::Result<(Signal, Signal)> {
    let term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    Ok((term, int))
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
async fn wait_for_signal((mut term, mut int): (Signal, Signal), shutdown: CancellationToken) {
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
    shutdown.cancel();
}
