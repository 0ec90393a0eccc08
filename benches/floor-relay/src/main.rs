//! `agent-sandbox-floor-relay --pair LISTEN=UPSTREAM...`: see the library's documentation.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pairs = match agent_sandbox_floor_relay::parse_args(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("agent-sandbox-floor-relay: {e:#}");
            eprintln!(
                "usage: agent-sandbox-floor-relay --pair LISTEN_ADDR:PORT=UPSTREAM_ADDR:PORT..."
            );
            return ExitCode::from(2);
        }
    };
    match agent_sandbox_floor_relay::run(&pairs, None) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-sandbox-floor-relay: {e:#}");
            ExitCode::FAILURE
        }
    }
}
