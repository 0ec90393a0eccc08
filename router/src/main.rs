//! `agent-sandbox-router`: parses the command line, sets up logging and the runtime, and maps the outcome
//! to an exit status (0 ok, 1 bad input or runtime failure, 2 usage). The work is in the library.

use std::process::ExitCode;
use std::sync::Arc;

use agent_sandbox_router::cli::{BuildError, Cli};
use agent_sandbox_router::{bind_workers, describe, logging, run_worker, DnsStats, WorkerSockets};
use agent_sandbox_shared::ValidConfig;
use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::Semaphore;
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

    // nginx's model: one single-threaded event loop per worker, each accepting on its own SO_REUSEPORT
    // sockets. A current-thread runtime drives I/O and every task from its own thread, with no
    // cross-thread wake-ups or work stealing; measured, that costs less per connection than tokio's
    // multi-threaded scheduler, at one worker and at several.
    let workers = cli.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        usize::from,
    );
    let sets = match bind_workers(&config, workers) {
        Ok(s) => s,
        Err(e) => {
            error!("{e:#}");
            return ExitCode::from(1);
        }
    };
    let shutdown = CancellationToken::new();
    let stats = Arc::new(DnsStats::default());
    let limit = Arc::new(Semaphore::new(config.raw.max_connections.max(1)));
    let mut sets = sets.into_iter();
    let Some(first) = sets.next() else {
        error!("no worker sockets were bound");
        return ExitCode::from(1);
    };
    let mut others = Vec::new();
    let mut outcome: anyhow::Result<()> = Ok(());
    for (i, set) in sets.enumerate() {
        let (config, stats, stop, limit) = (
            config.clone(),
            Arc::clone(&stats),
            shutdown.clone(),
            Arc::clone(&limit),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("worker-{}", i + 1))
            .spawn(move || worker(set, config, stats, stop, limit));
        match spawned {
            Ok(handle) => others.push(handle),
            Err(e) => {
                outcome = Err(anyhow::Error::new(e).context("cannot start a worker thread"));
                shutdown.cancel();
                break;
            }
        }
    }
    if outcome.is_ok() {
        outcome = match runtime() {
            Ok(runtime) => {
                let served = runtime.block_on(async {
                    // Signal handlers go in before readiness is reported, so a SIGTERM right after
                    // the "listening on" lines is a clean shutdown rather than the default disposition.
                    let signals =
                        tokio::spawn(wait_for_signal(install_signals()?, shutdown.clone()));
                    let listeners = first
                        .register()
                        .context("cannot register the listeners with the runtime")?;
                    for (addr, proto) in listeners.addresses() {
                        info!("listening on {addr} ({proto})");
                    }
                    let served =
                        run_worker(config, listeners, stats, shutdown.clone(), limit).await;
                    signals.abort();
                    served
                });
                // Detached connection tasks must not hold the exit back past the grace period.
                runtime.shutdown_background();
                served
            }
            Err(e) => Err(e),
        };
    }
    // Whatever ended this worker ends them all.
    shutdown.cancel();
    for handle in others {
        let result = handle
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker thread panicked")));
        if outcome.is_ok() {
            outcome = result;
        }
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// A single-threaded runtime for one worker.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

/// One worker besides the first: serves its sockets until `shutdown`; an error ends every worker.
fn worker(
    set: WorkerSockets,
    config: ValidConfig,
    stats: Arc<DnsStats>,
    shutdown: CancellationToken,
    limit: Arc<Semaphore>,
) -> anyhow::Result<()> {
    let runtime = runtime()?;
    let served = runtime.block_on(async {
        let listeners = set
            .register()
            .context("cannot register the listeners with the runtime")?;
        run_worker(config, listeners, stats, shutdown.clone(), limit).await
    });
    runtime.shutdown_background();
    if served.is_err() {
        shutdown.cancel();
    }
    served
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
