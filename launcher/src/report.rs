//! The end-of-session report: what the router refused, from its JSON log.
//!
//! The router logs every refusal at info as an event whose message is exactly [`logs::REFUSED`], with
//! the fields [`logs::KIND`] (dns, tls, http, forward) and [`logs::NAME`] (the contract is
//! [`agent_sandbox_shared::logs`]). The launcher counts them per name so that a user who wonders why
//! something did not work sees which names to add to the allowlist. The router folds repeated refusals
//! into one line carrying [`logs::COUNT`] (absent = 1): the counts here are the sums.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use agent_sandbox_shared::logs;

/// Refusals of one name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refused {
    /// How many times.
    pub count: usize,
    /// Which kinds of request (dns, tls, http, forward), sorted.
    pub kinds: Vec<String>,
}

/// Counts the `refused` events in the router's log, per name. Lines that are not JSON (or not refusals)
/// are ignored: the log also holds start-up lines and, on error, plain text.
#[must_use]
pub fn refusals(log: &str) -> BTreeMap<String, Refused> {
    let mut out: BTreeMap<String, Refused> = BTreeMap::new();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line.trim()) else {
            continue;
        };
        let fields = &event["fields"];
        if fields[logs::MESSAGE] != logs::REFUSED {
            continue;
        }
        let name = match &fields[logs::NAME] {
            // One trailing dot is how DNS names arrive; the allowlist is written without it.
            serde_json::Value::String(s) if !s.is_empty() && s != "." => {
                s.strip_suffix('.').unwrap_or(s).to_owned()
            }
            serde_json::Value::Null => "(no name)".to_owned(),
            serde_json::Value::String(_) => "(empty name)".to_owned(),
            other => other.to_string(),
        };
        let kind = fields[logs::KIND].as_str().unwrap_or("?").to_owned();
        // A malformed count still stands for at least the one line.
        let count = fields[logs::COUNT]
            .as_u64()
            .map_or(1, |c| usize::try_from(c).unwrap_or(usize::MAX).max(1));
        let entry = out.entry(name).or_default();
        entry.count = entry.count.saturating_add(count);
        if !entry.kinds.contains(&kind) {
            entry.kinds.push(kind);
            entry.kinds.sort();
        }
    }
    out
}

/// Whether the log lost its beginning: the router's log is capped, and conmon keeps the latest part once
/// the cap is reached, so the start-up events are gone. Only an event's message counts (a client's name
/// in a refusal can be any text).
#[must_use]
pub fn truncated(log: &str) -> bool {
    !log.lines().any(|line| {
        serde_json::from_str::<serde_json::Value>(line.trim()).is_ok_and(|event| {
            event["fields"][logs::MESSAGE]
                .as_str()
                .is_some_and(|m| m.starts_with(logs::LISTENING_ON))
        })
    })
}

/// The report text, or `None` when nothing was refused. `truncated`: the counts cover only the latest
/// part of the session.
#[must_use]
pub fn render(
    refused: &BTreeMap<String, Refused>,
    allowlist: &Path,
    truncated: bool,
) -> Option<String> {
    if refused.is_empty() {
        return None;
    }
    let total: usize = refused.values().map(|r| r.count).sum();
    let mut text = format!(
        "agent-sandbox: the router refused {total} request{} for {} name{} not on the allowlist:\n",
        if total == 1 { "" } else { "s" },
        refused.len(),
        if refused.len() == 1 { "" } else { "s" },
    );
    let width = refused.keys().map(|k| k.len()).max().unwrap_or(0);
    for (name, r) in refused {
        let _ = writeln!(
            text,
            "  {name:<width$}  {} × ({})",
            r.count,
            r.kinds.join(", ")
        );
    }
    if truncated {
        let _ = writeln!(
            text,
            "(The router's log reached its size cap during the session: these counts cover its latest part.)"
        );
    }
    let _ = writeln!(
        text,
        "To allow a name, add it to {} (read at the start of every session), or run \
         `agent-sandbox allow NAME` (it also applies to running sessions).",
        allowlist.display()
    );
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"timestamp":"t","level":"INFO","fields":{"message":"listening on 10.89.0.2:53 (udp)"},"target":"router"}
{"timestamp":"t","level":"INFO","fields":{"message":"refused","kind":"dns","name":"evil.example.","reason":"not allowlisted","client":"10.89.0.3:4000"},"target":"router::dns"}
{"timestamp":"t","level":"INFO","fields":{"message":"refused","kind":"dns","name":"evil.example","reason":"not allowlisted","client":"10.89.0.3:4001"}}
{"timestamp":"t","level":"INFO","fields":{"message":"refused","kind":"tls","name":"other.test","reason":"not allowlisted","client":"10.89.0.3:4002"}}
{"timestamp":"t","level":"INFO","fields":{"message":"refused","kind":"http","name":"evil.example","reason":"x","client":"c"}}
{"timestamp":"t","level":"INFO","fields":{"message":"refused","kind":"tls","reason":"no SNI","client":"c"}}
not json at all
{"timestamp":"t","level":"INFO","fields":{"message":"connection","name":"api.anthropic.com"}}
"#;

    #[test]
    fn counts_per_name() {
        let r = refusals(LOG);
        assert_eq!(r.len(), 3);
        assert_eq!(
            r["evil.example"],
            Refused {
                count: 3,
                kinds: vec!["dns".into(), "http".into()]
            }
        );
        assert_eq!(r["other.test"].count, 1);
        assert_eq!(r["(no name)"].kinds, ["tls"]);
        assert!(!truncated(LOG));
        let text = render(
            &r,
            Path::new("/home/me/.config/agent-sandbox/allowed-hosts"),
            truncated(LOG),
        )
        .unwrap();
        assert!(!text.contains("size cap"), "{text}");
        assert!(text.contains("refused 5 requests for 3 names"), "{text}");
        assert!(text.contains("evil.example  3 × (dns, http)"), "{text}");
        assert!(text.contains("/home/me/.config/agent-sandbox/allowed-hosts"));
    }

    /// Coalesced lines: each stands for its `count` refusals; absent is 1.
    #[test]
    fn counts_of_coalesced_lines_are_summed() {
        let log = r#"{"fields":{"message":"refused","kind":"dns","name":"evil.example.","reason":"r","client":"10.0.0.3:1","count":1}}
{"fields":{"message":"refused","kind":"dns","name":"evil.example","reason":"r","client":"10.0.0.3","count":41}}
{"fields":{"message":"refused","kind":"tls","name":"evil.example","reason":"r","client":"10.0.0.3:2"}}
{"fields":{"message":"refused","kind":"http","name":"odd.example","reason":"r","client":"c","count":"x"}}
"#;
        let r = refusals(log);
        assert_eq!(r["evil.example"].count, 43);
        assert_eq!(r["evil.example"].kinds, ["dns", "tls"]);
        assert_eq!(r["odd.example"].count, 1);
    }

    #[test]
    fn nothing_refused_prints_nothing() {
        assert_eq!(render(&refusals(""), Path::new("/x"), false), None);
        assert_eq!(
            render(
                &refusals(LOG.lines().next().unwrap()),
                Path::new("/x"),
                false
            ),
            None
        );
    }

    #[test]
    fn a_log_cut_by_its_cap_is_said_to_be_partial() {
        let cut: String = LOG.lines().skip(1).map(|l| format!("{l}\n")).collect();
        assert!(truncated(&cut));
        // A refused name that reads like a start-up line does not make the log whole.
        let spoof = format!(
            "{cut}{}\n",
            r#"{"fields":{"message":"refused","kind":"http","name":"listening on 10.0.0.1:80 (http)"}}"#
        );
        assert!(truncated(&spoof));
        let text = render(&refusals(&cut), Path::new("/x"), truncated(&cut)).unwrap();
        assert!(text.contains("size cap"), "{text}");
    }
}
