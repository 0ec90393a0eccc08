//! `agent-sandbox blocked`: what the routers of running sessions refused, now or as it happens.
//!
//! Names come from the sandbox, which controls them completely: every name is printed through
//! [`escape`], so no control character or terminal escape sequence ever reaches the user's screen.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, IsTerminal as _, Write as _};
use std::sync::mpsc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;

use super::files;
use super::sessions::{self, Running};
use crate::podman::{args, logfile, Podman};
use crate::report;

/// `name` safe for a terminal: printable ASCII as is, everything else (control bytes, ESC, DEL, any
/// non-ASCII character, which could be a bidirectional override) as `\xNN` or `\u{N}`. A backslash
/// stays as it is: the router's log already escapes names, and doubling its escapes again would only
/// make them harder to read; what matters is that nothing but printable ASCII reaches the screen.
#[must_use]
pub fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    out
}

/// The sessions `id` selects: that one, or all of them.
fn selected(podman: &Podman, id: Option<&str>) -> anyhow::Result<Vec<Running>> {
    Ok(match id {
        Some(id) => vec![sessions::find(podman, id)?],
        None => sessions::running(podman)?,
    })
}

/// The refusals so far in one session's router log: read from its file when the session says where
/// it is (no podman process), else through `podman logs`.
pub fn refusals(podman: &Podman, s: &Running) -> anyhow::Result<BTreeMap<String, report::Refused>> {
    let file = files::read_log_path(&s.dir.join(files::ROUTER_LOG_PATH_FILE));
    let log = logfile::log_messages(podman, &s.router, file.as_deref(), logfile::MAX_WHOLE_LOG)?;
    Ok(report::refusals(&log))
}

/// Prints the refused names with counts, per session.
pub fn list(podman: &Podman, id: Option<&str>) -> anyhow::Result<()> {
    let all = selected(podman, id)?;
    if all.is_empty() {
        println!("no running sessions");
    }
    for s in &all {
        let refused = refusals(podman, s)?;
        println!(
            "session {} ({}): {} name{} refused",
            s.meta.id,
            escape(&s.meta.project.display().to_string()),
            refused.len(),
            if refused.len() == 1 { "" } else { "s" }
        );
        for (name, r) in &refused {
            println!(
                "  {}  {} × ({})",
                escape(name),
                r.count,
                escape(&r.kinds.join(", "))
            );
        }
    }
    Ok(())
}

/// One refusal seen while following.
struct Seen {
    /// The session's id.
    session: String,
    /// The name as the router logged it.
    name: String,
    /// dns, tls, http or forward.
    kind: String,
}

/// Follows the routers' logs from now on and prints each refused name as it comes; with `ask`, asks
/// whether to allow each new name. Runs until interrupted.
pub fn follow(podman: &Podman, id: Option<&str>, ask: bool) -> anyhow::Result<()> {
    let all = selected(podman, id)?;
    anyhow::ensure!(!all.is_empty(), "no running sessions to follow");
    let ask = ask && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let (tx, rx) = mpsc::channel::<Seen>();
    let mut children = Vec::new();
    for s in &all {
        let mut child = podman.spawn_piped(&args::logs_since(&s.router, since, true))?;
        // The router logs JSON to stdout and stderr may carry podman's own words: read both.
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            let session = s.meta.id.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    for (name, r) in report::refusals(&line) {
                        let seen = Seen {
                            session: session.clone(),
                            name,
                            kind: r.kinds.join(", "),
                        };
                        if tx.send(seen).is_err() {
                            return;
                        }
                    }
                }
            });
        }
        children.push(child);
    }
    drop(tx);
    eprintln!(
        "agent-sandbox: following refusals of {} session{} (Ctrl-C to stop)",
        all.len(),
        if all.len() == 1 { "" } else { "s" }
    );
    let mut asked: BTreeMap<(String, String), ()> = BTreeMap::new();
    let result = (|| -> anyhow::Result<()> {
        for seen in rx {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{}  {}  ({})",
                seen.session,
                escape(&seen.name),
                escape(&seen.kind)
            )
            .context("cannot write to stdout")?;
            out.flush().context("cannot write to stdout")?;
            drop(out);
            if ask
                && asked
                    .insert((seen.session.clone(), seen.name.clone()), ())
                    .is_none()
            {
                ask_and_apply(podman, &all, &seen)?;
            }
        }
        Ok(())
    })();
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    result
}

/// Asks `allow NAME? [s]ession, [a]lways, [N]o` on the terminal and applies the answer.
fn ask_and_apply(podman: &Podman, all: &[Running], seen: &Seen) -> anyhow::Result<()> {
    // Only a name that is a valid allowlist entry can be allowed; anything else is shown, not offered.
    if super::edit::validate_args(std::slice::from_ref(&seen.name)).is_err() {
        eprintln!(
            "  (`{}` is not a valid allowlist entry; not offered)",
            escape(&seen.name)
        );
        return Ok(());
    }
    let name = seen.name.clone();
    eprint!("allow {}? [s]ession, [a]lways, [N]o ", escape(&name));
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("cannot read the answer")?;
    let settings = crate::settings::Settings::from_env(|k| std::env::var_os(k))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "s" | "session" => {
            let s = all
                .iter()
                .find(|s| s.meta.id == seen.session)
                .context("the session is gone")?;
            let _lock = super::lock::acquire(&settings.state_dir, "allowing")?;
            super::allow_session(podman, s, &[name])
        }
        "a" | "always" => {
            let _lock = super::lock::acquire(&settings.state_dir, "allowing")?;
            super::allow_file(podman, &settings, &[name])
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_for_the_terminal() {
        let cases: &[(&str, &str)] = &[
            ("pypi.org", "pypi.org"),
            ("\u{1b}[31mred\u{1b}[0m", "\\x1b[31mred\\x1b[0m"),
            ("a\rb\nc\u{7}\u{7f}", "a\\x0db\\x0ac\\x07\\x7f"),
            ("back\\slash", "back\\slash"),
            ("\u{202e}txt.exe", "\\u{202e}txt.exe"),
            ("\u{9b}31m", "\\u{9b}31m"),
            ("", ""),
        ];
        for (raw, want) in cases {
            let got = escape(raw);
            assert_eq!(got, *want, "{raw:?}");
            assert!(got.chars().all(|c| (' '..='~').contains(&c)), "{got:?}");
        }
    }
}
