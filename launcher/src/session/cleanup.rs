//! Cleanup: what this session created, removed on every way out (the normal end, an error, a signal,
//! a panic), in the reverse order of creation.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;

use super::say;
use crate::podman::{args, Podman};

/// Removes what a session created. Recorded as objects come into existence; runs once, on the normal
/// path or from Drop on every other way out.
#[derive(Debug)]
pub(super) struct Cleanup {
    /// Runs the removals.
    podman: Podman,
    /// The pod (with the forwarder and the sandbox in it).
    pub(super) pod: Option<String>,
    /// The router container.
    pub(super) router: Option<String>,
    /// The session network, removed last.
    pub(super) network: Option<String>,
    /// The session directory, removed before the network.
    pub(super) dir: Option<PathBuf>,
    /// The session's log directory (`rundir::log_dir`), removed with the session directory.
    pub(super) log_dir: Option<PathBuf>,
    /// The doctor's throw-away home volume (`doctor_home.rs`), removed once the pod is gone.
    pub(super) volume: Option<String>,
    /// The API key placeholder a session keeps for [`Cleanup::volume`], removed with it.
    pub(super) placeholder: Option<PathBuf>,
}

impl Cleanup {
    pub(super) fn new(podman: Podman) -> Cleanup {
        Cleanup {
            podman,
            pod: None,
            router: None,
            network: None,
            dir: None,
            log_dir: None,
            volume: None,
            placeholder: None,
        }
    }

    /// Removes everything recorded; failures are reported, not fatal (the next start retries them as
    /// stale objects).
    pub(super) fn run(&mut self) {
        let podman = &self.podman;
        let attempt = |what: &str, argv: Vec<OsString>| match podman.run(&argv) {
            Ok(_) => {}
            Err(e) if e.is_missing() => {}
            Err(e) => say!("could not remove {what}: {e}"),
        };
        let (pod, router) = (self.pod.take(), self.router.take());
        std::thread::scope(|s| {
            if let Some(pod) = &pod {
                s.spawn(|| attempt("the pod", args::pod_rm(pod)));
            }
            if let Some(router) = &router {
                attempt("the router", args::rm(router));
            }
        });
        // The directory before the network (see `plan` in start.rs).
        for dir in [self.dir.take(), self.log_dir.take()].into_iter().flatten() {
            let _ = fs::remove_dir_all(dir);
        }
        // After the pod, whose sandbox container had it mounted.
        if let Some(volume) = self.volume.take() {
            attempt("the doctor's home volume", args::volume_rm(&volume));
        }
        if let Some(file) = self.placeholder.take() {
            let _ = fs::remove_file(file);
        }
        if let Some(network) = self.network.take() {
            attempt("the session network", args::network_rm(&network));
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.run();
    }
}
