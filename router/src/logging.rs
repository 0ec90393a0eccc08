//! Log setup: text for people, JSON for collectors and the launcher's end-of-session report.
//!
//! `RUST_LOG` overrides the default filter. hickory's own per-query logging is kept at `warn`: it would
//! otherwise log every request, and the router logs the decisions that matter itself.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The default filter: our decisions at info, dependencies' chatter off.
const DEFAULT_FILTER: &str = "info,hickory_proto=warn,hickory_resolver=warn,hickory_net=warn";

/// Installs the global subscriber, writing to stderr.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(false).try_init(),
    };
    // A second init (tests calling in-process) keeps the first subscriber.
    let _ = result;
}
