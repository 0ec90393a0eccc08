//! Writes `agent-sandbox.1` and bash, zsh and fish completions for the launcher into a directory.
//!
//! They are generated from the launcher's own clap definition at package build time, so the man page and
//! completions can never drift from the real command line. `make rpm` runs this; nothing installs it.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

fn main() -> anyhow::Result<()> {
    let out: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .context("usage: agent-sandbox-docgen OUTPUT_DIR")?;
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    let cmd = agent_sandbox::cli::Cli::command();
    let name = cmd.get_name().to_owned();

    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .context("cannot render the man page")?;
    let man = out.join(format!("{name}.1"));
    std::fs::write(&man, page).with_context(|| format!("cannot write {}", man.display()))?;

    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd.clone(), &name, &out)
            .with_context(|| format!("cannot write {shell} completions to {}", out.display()))?;
        println!("{}", path.display());
    }
    println!("{}", man.display());
    Ok(())
}
