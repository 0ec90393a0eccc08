//! Writes `agent-sandbox.1`, a page for each of its reserved words (`agent-sandbox-allow.1`, ...,
//! `agent-sandbox-doctor.1`) and bash, zsh and fish completions for the launcher into a directory.
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

    // The launcher reads its first word before clap: `allow`, `deny`, `reload`, `sessions`,
    // `blocked` and `doctor` have clap definitions of their own. The documented command carries them
    // as subcommands, so the man page lists them with their options and the completions know them.
    let mut cmd = agent_sandbox::cli::Cli::command().disable_help_subcommand(true);
    for sub in agent_sandbox::live::LiveCli::command().get_subcommands() {
        cmd = cmd.subcommand(sub.clone());
    }
    cmd = cmd.subcommand(
        agent_sandbox::doctor::DoctorOptions::command()
            .name("doctor")
            .bin_name("agent-sandbox doctor"),
    );
    let name = cmd.get_name().to_owned();

    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .context("cannot render the man page")?;
    let man = out.join(format!("{name}.1"));
    std::fs::write(&man, page).with_context(|| format!("cannot write {}", man.display()))?;
    // The pages the main page's SUBCOMMANDS section names: agent-sandbox-allow(1), ...
    let mut pages = vec![man];
    for sub in cmd.get_subcommands() {
        let sub_name = format!("{name}-{}", sub.get_name());
        let mut page = Vec::new();
        let sub = sub
            .clone()
            .display_name(&sub_name)
            .bin_name(format!("{name} {}", sub.get_name()));
        clap_mangen::Man::new(sub)
            .render(&mut page)
            .with_context(|| format!("cannot render the man page of {sub_name}"))?;
        let path = out.join(format!("{sub_name}.1"));
        std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
        pages.push(path);
    }

    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd.clone(), &name, &out)
            .with_context(|| format!("cannot write {shell} completions to {}", out.display()))?;
        println!("{}", path.display());
    }
    for page in pages {
        println!("{}", page.display());
    }
    Ok(())
}
