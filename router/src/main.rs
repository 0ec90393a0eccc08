//! `agent-sandbox-router`: parses the command line, sets up logging and the runtime, and maps the outcome
//! to an exit status (0 ok, 1 bad input or runtime failure, 2 usage). The work is in the library.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use agent_sandbox_router::cli::{BuildError, Cli};
use agent_sandbox_router::{bind_workers, describe, logging, run, Control, Handles};
use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::{error, info, warn};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);

    let built = match cli.build_config() {
        Ok(b) => b,
        Err(BuildError::Usage(e)) => {
            say(&format!("agent-sandbox-router: {e}"));
            return ExitCode::from(2);
        }
        Err(e) => {
            say(&format!("agent-sandbox-router: {e}"));
            return ExitCode::from(1);
        }
    };
    for w in &built.warnings {
        warn!("allowlist: {w}");
    }
    let config = match built.validate() {
        Ok(c) => c,
        Err(e) => {
            say(&format!("agent-sandbox-router: {e}"));
            return ExitCode::from(1);
        }
    };
    if cli.check {
        let mut out = std::io::stdout();
        return match out
            .write_all(describe(&config).as_bytes())
            .and_then(|()| out.flush())
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(1),
        };
    }

    let workers = cli.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        usize::from,
    );
    let served = control(&cli, built.read).and_then(|control| {
        let sets = bind_workers(&config, workers)?;
        run(config, sets, control, |handles| {
            // Signal handlers go in before readiness is reported, so a SIGTERM right after the
            // "listening on" lines is a clean shutdown rather than the default disposition.
            tokio::spawn(wait_for_signals(install_signals()?, handles));
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

/// Writes `message` and a line end to stderr; a stderr that cannot be written is not a reason to panic
/// (`eprintln!` would), as the exit status still says what happened.
fn say(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// The reload source, the files to watch (`read`: each with the fingerprint of the content the policy
/// in force was built from), the drain time and the admin listener, from the flags.
fn control(
    cli: &Cli,
    read: Vec<(std::path::PathBuf, agent_sandbox_router::watch::Fingerprint)>,
) -> anyhow::Result<Control> {
    let admin = match cli.admin {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .with_context(|| format!("cannot listen for the admin endpoint on {addr}"))?;
            l.set_nonblocking(true)
                .with_context(|| format!("cannot set up the admin listener on {addr}"))?;
            Some(l)
        }
        None => None,
    };
    Ok(Control {
        drain_for: Duration::from_secs(cli.drain_seconds),
        reload: Some(cli.reload_source()),
        watch: read,
        admin,
        ..Control::default()
    })
}

/// SIGTERM, SIGINT and SIGHUP streams.
fn install_signals() -> anyhow::Result<[Signal; 3]> {
    let term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
    Ok([term, int, hup])
}

/// SIGTERM and SIGINT stop (draining first when `--drain-seconds` is set); SIGHUP reloads.
async fn wait_for_signals([mut term, mut int, mut hup]: [Signal; 3], handles: Handles) {
    loop {
        tokio::select! {
            _ = term.recv() => { info!("SIGTERM received"); handles.terminate(); }
            _ = int.recv() => { info!("SIGINT received"); handles.terminate(); }
            _ = hup.recv() => { info!("SIGHUP received: reloading"); handles.reload(); }
        }
    }
}
