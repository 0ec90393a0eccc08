//! `agent-sandbox-nested-probe`: parses the command line and prints one JSON line per check.
//! Exit status 0 when every check ran (whatever they found), 2 for a bad command line.

use std::io::Write as _;
use std::process::ExitCode;

use agent_sandbox_nested_probe::spec::{self, Invocation};

fn main() -> ExitCode {
    // Written with `writeln!` and the result ignored: `println!` would panic on a closed pipe.
    let spec = match spec::parse(std::env::args_os().skip(1)) {
        Ok(Invocation::Run(spec)) => spec,
        Ok(Invocation::Help) => {
            let _ = writeln!(std::io::stdout(), "{}", spec::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "agent-sandbox-nested-probe: error: {e}\n{}",
                spec::USAGE
            );
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    for line in agent_sandbox_nested_probe::run(&spec) {
        let _ = writeln!(out, "{}", line.to_json());
    }
    let _ = out.flush();
    ExitCode::SUCCESS
}
