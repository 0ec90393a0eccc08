//! `agent-sandbox`: see the library for everything.

fn main() -> std::process::ExitCode {
    agent_sandbox::main()
}
