//! The home of the doctor's probe session: a volume of its own, new and empty, removed with the
//! session. The user's home volume is where the agent of every earlier session could write, and what
//! is in a home decides what the probe's python3 and the sandbox's nested podman do before the probe's
//! first line runs (`~/.local/lib/python3.*/site-packages`, `~/.config/containers`): a probe run there
//! could only report what an earlier agent chose. Everything else about the session is as a real one,
//! the home volume's mount included (as the user's first session mounted theirs).

use std::fs;
use std::path::Path;

use anyhow::Context as _;

use super::cleanup::Cleanup;
use super::rundir::new_session_id;
use super::{say, NAME_PREFIX};
use crate::inject::placeholder::placeholder_file;
use crate::liveness;
use crate::podman::json::Volume;
use crate::podman::{args, Podman, PodmanError, SessionLabels};

/// The doctor's throw-away home volume, before it exists.
#[derive(Debug)]
pub(super) struct DoctorHome {
    /// Its random part (also its label's session id).
    id: String,
    /// The volume's name.
    pub(super) volume: String,
}

/// The beginning of every throw-away home's name: only volumes named so are ever removed as leftovers.
fn prefix() -> String {
    format!("{NAME_PREFIX}doctor-home-")
}

impl DoctorHome {
    /// A new name; nothing is created.
    pub(super) fn new() -> anyhow::Result<DoctorHome> {
        let id = new_session_id()?;
        Ok(DoctorHome {
            volume: format!("{}{id}", prefix()),
            id,
        })
    }

    /// Creates the volume, recorded in `cleanup` before it exists (so its removal, and that of the
    /// API key placeholder a session keeps for it under `state_dir`, go with the session's however
    /// the run ends), after removing the throw-away homes of doctors that were killed. Returns its
    /// mount point, as the shared step's probe of the home volume.
    pub(super) fn create(
        &self,
        podman: &Podman,
        state_dir: &Path,
        project: &Path,
        cleanup: &mut Cleanup,
    ) -> anyhow::Result<Result<String, PodmanError>> {
        let boot = liveness::boot_id().context("cannot read the boot id from /proc")?;
        remove_left_by_killed(podman, state_dir, &boot);
        let labels = SessionLabels {
            session: self.id.clone(),
            pid: std::process::id(),
            start: liveness::start_time(std::process::id())
                .context("cannot read this process's start time from /proc")?,
            boot,
            project: project.to_owned(),
            log_dir: None,
            session_dir: None,
        };
        cleanup.volume = Some(self.volume.clone());
        cleanup.placeholder = placeholder_file(state_dir, &self.volume).ok();
        podman
            .run(&args::volume_create_doctor_home(&self.volume, &labels))
            .with_context(|| format!("cannot create the doctor's home volume {}", self.volume))?;
        Ok(podman.run(&args::volume_inspect(&self.volume)))
    }
}

/// Removes the throw-away homes (and their placeholders) whose doctor is gone; best effort.
fn remove_left_by_killed(podman: &Podman, state_dir: &Path, boot: &str) {
    let Ok(listing) = podman.run(&args::volume_ls_doctor_homes()) else {
        return;
    };
    for v in Volume::parse_list(&listing).unwrap_or_default() {
        if !v.name.starts_with(&prefix()) || liveness::is_live(&v.labels, boot) {
            continue;
        }
        match podman.run(&args::volume_rm(&v.name)) {
            Ok(_) => {}
            Err(e) if e.is_missing() => {}
            Err(e) => {
                say!(
                    "could not remove {}, left by a doctor that was killed: {e}",
                    v.name
                );
                continue;
            }
        }
        if let Ok(file) = placeholder_file(state_dir, &v.name) {
            let _ = fs::remove_file(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::podman::{LABEL_BOOT, LABEL_PID, LABEL_START};

    #[test]
    fn the_doctors_home_is_new_labelled_and_removed_with_the_session() {
        /// Removes the test's directory however the test ends.
        struct Scratch(std::path::PathBuf);
        impl Drop for Scratch {
            fn drop(&mut self) {
                let _ = fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("as-doctor-home-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let _scratch = Scratch(dir.clone());
        let state = dir.join("state");
        // Three doctor homes already there: one of a killed doctor (this pid, another start time),
        // one of a live one (this very process) and a volume of someone else's with dead labels.
        let me = std::process::id();
        let start = liveness::start_time(me).unwrap();
        let boot = liveness::boot_id().unwrap();
        let volume = |name: &str, start: u64| {
            serde_json::json!({"Name": name, "Labels": {
                LABEL_PID: me.to_string(), LABEL_START: start.to_string(), LABEL_BOOT: boot,
            }})
        };
        let (dead, live) = (
            "agent-sandbox-doctor-home-dead00000000",
            "agent-sandbox-doctor-home-live00000000",
        );
        let listing = serde_json::json!([
            volume(dead, start + 1),
            volume(live, start),
            volume("someone-elses", start + 1),
        ]);
        fs::write(dir.join("listing.json"), listing.to_string()).unwrap();
        for name in [dead, live, "someone-elses"] {
            let file = placeholder_file(&state, name).unwrap();
            fs::create_dir_all(file.parent().unwrap()).unwrap();
            fs::write(file, "x").unwrap();
        }
        // The stand-in for podman logs each command line and answers what this step asks.
        let podman = dir.join("podman");
        fs::write(
            &podman,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{log}'\ncase \"$1 $2\" in\n'volume ls') cat '{listing}' ;;\n'volume inspect') echo /volumes/x/_data ;;\nesac\n",
                log = dir.join("log").display(),
                listing = dir.join("listing.json").display(),
            ),
        )
        .unwrap();
        fs::set_permissions(&podman, fs::Permissions::from_mode(0o755)).unwrap();
        let podman = Podman::stand_in(&podman);

        let home = DoctorHome::new().unwrap();
        let other = DoctorHome::new().unwrap();
        assert_ne!(home.volume, other.volume, "a new name each run");
        assert!(home.volume.starts_with("agent-sandbox-doctor-home-"));
        assert_ne!(home.volume, crate::settings::DEFAULT_HOME_VOLUME);
        let mut cleanup = Cleanup::new(podman.clone());
        let mountpoint = home
            .create(&podman, &state, Path::new("/tmp/project"), &mut cleanup)
            .unwrap();
        assert_eq!(mountpoint.unwrap().trim(), "/volumes/x/_data");
        let log = fs::read_to_string(dir.join("log")).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(
            lines[0],
            "volume ls --filter label=agent-sandbox.doctor-home --format json"
        );
        assert_eq!(lines[1], format!("volume rm --force {dead}"), "{log}");
        let create = format!(
            "volume create --label agent-sandbox.session={} --label agent-sandbox.launcher-pid={me} --label agent-sandbox.launcher-start={start} --label agent-sandbox.boot-id={boot} --label agent-sandbox.project=/tmp/project --label agent-sandbox.doctor-home=1 {}",
            home.id, home.volume
        );
        assert_eq!(lines[2], create);
        assert_eq!(lines[3], format!("volume inspect {}", home.volume));
        assert_eq!(lines.len(), 4, "{log}");
        assert!(!placeholder_file(&state, dead).unwrap().exists());
        assert!(placeholder_file(&state, live).unwrap().exists());
        assert!(placeholder_file(&state, "someone-elses").unwrap().exists());

        // A session would keep an API key placeholder for the volume: both go with the session.
        let placeholder = placeholder_file(&state, &home.volume).unwrap();
        fs::write(&placeholder, "x").unwrap();
        drop(cleanup);
        let log = fs::read_to_string(dir.join("log")).unwrap();
        let last = log.lines().last().unwrap().to_owned();
        assert_eq!(last, format!("volume rm --force {}", home.volume));
        assert!(!placeholder.exists());
    }
}
