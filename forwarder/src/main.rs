use clap::Parser;

/// Placeholder command line, filled in by its own issue.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
}
