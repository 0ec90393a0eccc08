//! The stale sweep: objects of sessions whose launcher is gone (killed, or from before a reboot) are
//! found by their labels and removed at the next start. Objects of live sessions are never touched.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use anyhow::Context as _;

use super::rundir::{labelled_session_dir, log_dir, session_dir};
use super::{say, NAME_PREFIX};
use crate::liveness;
use crate::podman::json::{Container, Network, Pod};
use crate::podman::{
    args, Podman, PodmanError, LABEL_LOG_DIR, LABEL_PROJECT, LABEL_SESSION, LABEL_SESSION_DIR,
};

/// One object of some session, as listed by podman.
#[derive(Debug)]
struct Listed {
    /// What it is, which decides the order of removal.
    kind: Kind,
    /// Its name.
    name: String,
    /// Its labels: the session's id and its launcher's identity.
    labels: HashMap<String, String>,
}

/// The kinds of session object, in their order of removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A pod (its containers go with it).
    Pod,
    /// A container outside a pod (the router), or one whose pod is gone.
    Container,
    /// A session network.
    Network,
}

/// Whether a listing of session networks holds one whose launcher is gone.
pub(super) fn any_stale(networks_json: &str) -> anyhow::Result<bool> {
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    Ok(parse_listing(Kind::Network, networks_json)
        .iter()
        .any(|o| o.labels.contains_key(LABEL_SESSION) && !liveness::is_live(&o.labels, &boot)))
}

/// How many session networks of a listing belong to launchers that are gone, and how many to live ones.
pub(super) fn count(networks_json: &str) -> anyhow::Result<(usize, usize)> {
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    let sessions: Vec<Listed> = parse_listing(Kind::Network, networks_json)
        .into_iter()
        .filter(|o| o.labels.contains_key(LABEL_SESSION))
        .collect();
    let stale = sessions
        .iter()
        .filter(|o| !liveness::is_live(&o.labels, &boot))
        .count();
    Ok((stale, sessions.len() - stale))
}

/// The project directories of the live sessions in a listing of session networks (every session's
/// network carries its project's label, and is created before its sandbox and removed after it).
/// Unlike the sweep, a listing that cannot be read is an error: the caller refuses to start on it.
/// Sessions whose launcher is gone are left out: the sweep removes them before a new sandbox starts.
pub(super) fn live_projects(networks_json: &str) -> anyhow::Result<Vec<std::path::PathBuf>> {
    Ok(live_sessions(networks_json)?
        .into_iter()
        .map(|(_, project)| project)
        .collect())
}

/// [`live_projects`] with each session's id.
pub(super) fn live_sessions(
    networks_json: &str,
) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    Ok(Network::parse_list(networks_json)?
        .into_iter()
        .filter(|n| liveness::is_live(&n.labels, &boot))
        .filter_map(|n| {
            let id = n.labels.get(LABEL_SESSION)?.clone();
            let project = n.labels.get(LABEL_PROJECT).map(std::path::PathBuf::from)?;
            Some((id, project))
        })
        .collect())
}

/// The log directories of a dead session to remove: the one its objects' label names (the state
/// directory of the launcher that started it), if it is exactly a log directory of that session, and
/// the one in this launcher's state directory (a session of an older launcher has no label).
fn log_dirs(session: &str, objects: &[&Listed], state_dir: &Path) -> Vec<std::path::PathBuf> {
    let name = format!("{NAME_PREFIX}{session}");
    let mut dirs = vec![log_dir(state_dir, session)];
    for o in objects {
        let Some(labelled) = o.labels.get(LABEL_LOG_DIR).map(std::path::PathBuf::from) else {
            continue;
        };
        let ours = labelled.is_absolute()
            && labelled.file_name() == Some(std::ffi::OsStr::new(&name))
            && labelled
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == "logs")
            && labelled.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
        if ours && !dirs.contains(&labelled) {
            dirs.push(labelled);
        }
    }
    dirs
}

/// Finds objects of sessions whose launcher is gone and removes them (pods, then containers, then
/// networks). Objects of live sessions are never touched.
pub(super) fn remove_stale_sessions(podman: &Podman, state_dir: &Path) -> anyhow::Result<()> {
    let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
    let mut objects = Vec::new();
    for (kind, argv) in [
        (Kind::Pod, args::pod_ps_sessions()),
        (Kind::Container, args::ps_sessions()),
        (Kind::Network, args::network_ls_sessions()),
    ] {
        objects.extend(parse_listing(kind, &podman.run(&argv)?));
    }
    let mut stale: BTreeMap<String, Vec<&Listed>> = BTreeMap::new();
    for o in &objects {
        let Some(session) = o.labels.get(LABEL_SESSION) else {
            continue;
        };
        if !liveness::is_live(&o.labels, &boot) {
            stale.entry(session.clone()).or_default().push(o);
        }
    }
    for (session, mut list) in stale {
        list.sort_by_key(|o| o.kind);
        say!(
            "removing {} object(s) left by session {session}, whose launcher is gone",
            list.len()
        );
        // The session directory before the network, as in `Cleanup::run`: should this launcher die
        // midway, the network is still there for the next start to find. The name comes from a label:
        // only ever a session id of ours.
        if session.len() == 12 && session.chars().all(|c| c.is_ascii_hexdigit()) {
            let _ = fs::remove_dir_all(session_dir(&session));
            // And where the session's launcher put it, when its XDG_RUNTIME_DIR was another.
            for o in &list {
                if let Some(dir) = labelled_session_dir(o.labels.get(LABEL_SESSION_DIR), &session) {
                    let _ = fs::remove_dir_all(dir);
                }
            }
            for dir in log_dirs(&session, &list, state_dir) {
                let _ = fs::remove_dir_all(dir);
            }
        }
        for o in list {
            let argv = match o.kind {
                Kind::Pod => args::pod_rm(&o.name),
                Kind::Container => args::rm(&o.name),
                Kind::Network => args::network_rm(&o.name),
            };
            match podman.run(&argv) {
                Ok(_) => {}
                // Gone already (removed with its pod or network).
                Err(e) if e.is_missing() => {}
                // A signal: the start is abandoned, and the next one sweeps again.
                Err(e @ PodmanError::Interrupted { .. }) => return Err(e.into()),
                Err(e) => say!("could not remove {}: {e}", o.name),
            }
        }
    }
    Ok(())
}

/// Reads `podman {pod ps,ps,network ls} --format json`: the named objects in it. An answer that cannot
/// be read lists nothing (the sweep is best effort; the next start looks again).
fn parse_listing(kind: Kind, json: &str) -> Vec<Listed> {
    let named: Vec<(String, HashMap<String, String>)> = match kind {
        Kind::Pod => Pod::parse_list(json)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name, p.labels))
            .collect(),
        Kind::Container => Container::parse_list(json)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| Some((c.names.into_iter().next()?, c.labels)))
            .collect(),
        Kind::Network => Network::parse_list(json)
            .unwrap_or_default()
            .into_iter()
            .map(|n| (n.name, n.labels))
            .collect(),
    };
    named
        .into_iter()
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, labels)| Listed { kind, name, labels })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep removes the log directory the session's label names (another launcher's state
    /// directory) and the one in its own state directory; a label that is not exactly a log directory
    /// of that session names nothing to remove.
    #[test]
    fn log_directories_of_a_dead_session() {
        let listed = |dir: &str| Listed {
            kind: Kind::Network,
            name: "agent-sandbox-0123456789ab".into(),
            labels: HashMap::from([(LABEL_LOG_DIR.to_owned(), dir.to_owned())]),
        };
        let here = Path::new("/home/me/.local/state/agent-sandbox");
        let mine = here.join("logs/agent-sandbox-0123456789ab");
        let other = listed("/srv/state/agent-sandbox/logs/agent-sandbox-0123456789ab");
        assert_eq!(
            log_dirs("0123456789ab", &[&other], here),
            vec![
                mine.clone(),
                "/srv/state/agent-sandbox/logs/agent-sandbox-0123456789ab".into()
            ]
        );
        for bad in [
            "/home/me",
            "/srv/state/agent-sandbox/logs/agent-sandbox-ffffffffffff",
            "/srv/state/agent-sandbox/other/agent-sandbox-0123456789ab",
            "/srv/logs/../agent-sandbox-0123456789ab",
            "/srv/state/logs/../logs/agent-sandbox-0123456789ab",
            "relative/logs/agent-sandbox-0123456789ab",
            "",
        ] {
            assert_eq!(
                log_dirs("0123456789ab", &[&listed(bad)], here),
                vec![mine.clone()],
                "{bad}"
            );
        }
        let same = listed(&mine.display().to_string());
        assert_eq!(log_dirs("0123456789ab", &[&same, &same], here), vec![mine]);
    }

    #[test]
    fn listings_of_all_three_kinds() {
        let pods = r#"[{"Name":"agent-sandbox-a","Labels":{"agent-sandbox.session":"a"}}]"#;
        let ctrs =
            r#"[{"Names":["agent-sandbox-a-router"],"Labels":{"agent-sandbox.session":"a"}}]"#;
        let nets = r#"[{"name":"agent-sandbox-a","labels":{"agent-sandbox.session":"a"}}]"#;
        for (kind, json, name) in [
            (Kind::Pod, pods, "agent-sandbox-a"),
            (Kind::Container, ctrs, "agent-sandbox-a-router"),
            (Kind::Network, nets, "agent-sandbox-a"),
        ] {
            let l = parse_listing(kind, json);
            assert_eq!(l.len(), 1);
            assert_eq!(l[0].name, name);
            assert_eq!(l[0].labels[LABEL_SESSION], "a");
        }
        assert!(parse_listing(Kind::Pod, "null").is_empty());
        assert!(parse_listing(Kind::Container, "garbage").is_empty());
        assert!(parse_listing(Kind::Container, r#"[{"Names":[]}]"#).is_empty());
    }

    #[test]
    fn a_session_network_of_a_dead_launcher_is_stale() {
        let me = std::process::id();
        let start = liveness::start_time(me).unwrap();
        let boot = liveness::boot_id().unwrap();
        let net = |pid: u32, start: u64| {
            serde_json::json!([{"name": "agent-sandbox-a", "labels": {
                LABEL_SESSION: "a",
                crate::podman::LABEL_PID: pid.to_string(),
                crate::podman::LABEL_START: start.to_string(),
                crate::podman::LABEL_BOOT: boot,
            }}])
            .to_string()
        };
        assert!(
            !any_stale(&net(me, start)).unwrap(),
            "this process is alive"
        );
        assert!(any_stale(&net(me, start + 1)).unwrap(), "a reused pid");
        assert!(!any_stale("[]").unwrap());
        assert_eq!(count(&net(me, start)).unwrap(), (0, 1));
        assert_eq!(count(&net(me, start + 1)).unwrap(), (1, 0));
        // Labels this version cannot read: not ours to judge live, so swept.
        assert!(any_stale(r#"[{"name":"x","labels":{"agent-sandbox.session":"a"}}]"#).unwrap());
    }

    #[test]
    fn live_sessions_projects() {
        let me = std::process::id();
        let start = liveness::start_time(me).unwrap();
        let boot = liveness::boot_id().unwrap();
        let net = |name: &str, start: u64, project: &str| {
            serde_json::json!({"name": name, "labels": {
                LABEL_SESSION: name,
                crate::podman::LABEL_PID: me.to_string(),
                crate::podman::LABEL_START: start.to_string(),
                crate::podman::LABEL_BOOT: boot,
                LABEL_PROJECT: project,
            }})
        };
        let listing = serde_json::json!([
            net("a", start, "/home/me/src"),
            net("b", start + 1, "/home/me/old"),
            {"name": "c", "labels": {"other": "x"}},
        ])
        .to_string();
        assert_eq!(
            live_projects(&listing).unwrap(),
            [std::path::PathBuf::from("/home/me/src")]
        );
        assert!(live_projects("[]").unwrap().is_empty());
        assert!(live_projects("null").unwrap().is_empty());
        assert!(live_projects("garbage").is_err());
    }
}
