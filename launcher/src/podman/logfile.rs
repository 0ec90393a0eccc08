//! A container's k8s-file log read straight from the host, without a podman process per look.
//!
//! The router and the forwarder run with `--log-driver k8s-file`: conmon writes their output to a file
//! whose path `container inspect` names (`{{.HostConfig.LogConfig.Path}}`). Reading that file costs a
//! file read; `podman logs` costs a podman process, which podman's lock serialises with every other
//! podman command of this user. Readiness at start and a live change's verdicts read the file; both fall
//! back to `podman logs` when it cannot be read.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

/// A log path from `container inspect`, if it is one that can be read: absolute, and naming a file.
#[must_use]
pub fn usable_path(text: &str) -> Option<PathBuf> {
    let path = PathBuf::from(text.trim_end_matches(['\n', '\r']));
    (path.is_absolute() && std::fs::metadata(&path).is_ok_and(|m| m.is_file())).then_some(path)
}

/// The messages of the log from byte `offset` on (from its start if it is shorter than `offset` now:
/// it was rotated at its size cap), reading at most `max` bytes. Bytes that are not UTF-8 are replaced,
/// never a reason to see nothing.
pub fn read_messages(path: &Path, offset: u64, max: u64) -> std::io::Result<String> {
    read_file_messages(&std::fs::File::open(path)?, offset, max)
}

/// [`read_messages`] from a file already open: the file it was, even once conmon has renamed a new
/// one over its path (its rotation at the size cap).
pub fn read_file_messages(mut f: &std::fs::File, offset: u64, max: u64) -> std::io::Result<String> {
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(if len < offset { 0 } else { offset }))?;
    let mut bytes = Vec::new();
    f.take(max).read_to_end(&mut bytes)?;
    Ok(messages(&String::from_utf8_lossy(&bytes)))
}

/// The most of a whole log read: more than the router's size cap (`ROUTER_LOG_MAX`), past which
/// conmon starts it again.
pub const MAX_WHOLE_LOG: u64 = 64 * 1024 * 1024;

/// The messages of `container`'s log, at most `max` bytes of it: read from `file` (where the session
/// put it) when there is one that can be read, which costs no podman process, else through
/// `podman logs` (its stdout, then its stderr).
pub fn log_messages(
    podman: &super::Podman,
    container: &str,
    file: Option<&Path>,
    max: u64,
) -> Result<String, super::PodmanError> {
    if let Some(log) = file.and_then(|f| read_messages(f, 0, max).ok()) {
        return Ok(log);
    }
    let out = podman.output(&super::args::logs(container))?;
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(log)
}

/// The messages of a k8s-file log, one per line. Its lines are `TIME STREAM TAG MESSAGE`, and a
/// message the container wrote in several pieces may be split over several lines: tag `P` (partial)
/// for each piece but the last, `F` (full) for the last. Pieces are joined again; a partial message
/// at the end (the rest not written yet) is left out, and so is a last line without its newline (a
/// read that cut it: conmon ends every line with one).
#[must_use]
pub fn messages(text: &str) -> String {
    let mut out = String::new();
    let mut pending = String::new();
    for line in text.split_inclusive('\n') {
        let Some(line) = line.strip_suffix('\n') else {
            break;
        };
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut parts = line.splitn(4, ' ');
        let (Some(_time), Some(_stream), Some(tag), message) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next().unwrap_or(""),
        ) else {
            continue;
        };
        pending.push_str(message);
        if tag != "P" {
            out.push_str(&pending);
            out.push('\n');
            pending.clear();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own, removed when dropped (even when the test fails).
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("as-logfile-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            Scratch(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The forwarder wrote each line in pieces (one write per formatted part), and conmon can read
    /// a line in two: the k8s-file log then holds it as a `P` line and an `F` line. Read line by
    /// line, the verdict was never seen (CI: "the forwarder did not confirm the reload within 3s"
    /// while its relays had opened).
    #[test]
    fn k8s_file_pieces_are_joined() {
        let log =
            "2026-12-02T12:31:00.1+00:00 stderr F  INFO listening on 127.0.0.4:80 to=10.0.0.2:80\n\
                   2026-12-02T12:31:00.2+00:00 stderr P  INFO reloa\n\
                   2026-12-02T12:31:00.3+00:00 stderr F ded: 9 relays, 3 opened, 0 closed\n\
                   2026-12-02T12:31:00.4+00:00 stderr P  INFO half\n";
        assert_eq!(
            messages(log),
            " INFO listening on 127.0.0.4:80 to=10.0.0.2:80\n INFO reloaded: 9 relays, 3 opened, 0 closed\n"
        );
        assert_eq!(messages("garbage\n\n"), "");
    }

    /// The log comes from the file when there is one (no podman process), else from
    /// `podman logs`, stdout then stderr.
    #[test]
    fn the_log_comes_from_the_file_else_from_podman_logs() {
        let dir = Scratch::new("whole");
        let path = dir.path().join("router.log");
        std::fs::write(
            &path,
            "2026-12-02T12:31:00.1+00:00 stderr F {\"refused\":1}\n",
        )
        .unwrap();
        // A podman that must not run: a program that does not exist.
        let absent = super::super::Podman::stand_in(dir.path().join("no-podman"));
        assert_eq!(
            log_messages(&absent, "ctr", Some(&path), MAX_WHOLE_LOG).unwrap(),
            "{\"refused\":1}\n"
        );
        assert!(log_messages(
            &absent,
            "ctr",
            Some(&dir.path().join("gone.log")),
            MAX_WHOLE_LOG
        )
        .is_err());
        // A stand-in podman that prints what `podman logs` would, on both streams.
        let script = dir.path().join("podman");
        std::fs::write(
            &script,
            "#!/bin/sh\n[ \"$1 $2\" = \"logs ctr\" ] || exit 3\necho out\necho err >&2\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let stand_in = super::super::Podman::stand_in(&script);
        assert_eq!(
            log_messages(&stand_in, "ctr", None, MAX_WHOLE_LOG).unwrap(),
            "out\nerr\n"
        );
        assert_eq!(
            log_messages(
                &stand_in,
                "ctr",
                Some(&dir.path().join("gone.log")),
                MAX_WHOLE_LOG
            )
            .unwrap(),
            "out\nerr\n"
        );
    }

    /// Read from an offset; from the start once the file is shorter than the offset (rotated); a
    /// byte that is not UTF-8 does not hide the lines around it.
    #[test]
    fn reads_from_an_offset_and_after_a_rotation() {
        let dir = Scratch::new("offset");
        let path = dir.path().join("ctr.log");
        let first = "2026-12-02T12:31:00.1+00:00 stdout F one\n";
        let mut bytes = first.as_bytes().to_vec();
        bytes.extend_from_slice(b"2026-12-02T12:31:00.2+00:00 stdout F tw\xffo\n");
        std::fs::write(&path, &bytes).unwrap();
        let at = first.len() as u64;
        assert_eq!(
            read_messages(&path, 0, 1 << 20).unwrap(),
            "one\ntw\u{fffd}o\n"
        );
        assert_eq!(read_messages(&path, at, 1 << 20).unwrap(), "tw\u{fffd}o\n");
        assert_eq!(
            read_messages(&path, at, 10).unwrap(),
            "",
            "capped, and a cut line is no message"
        );
        std::fs::write(&path, "2026-12-02T12:31:01.0+00:00 stdout F three\n").unwrap();
        assert_eq!(read_messages(&path, 1 << 20, 1 << 20).unwrap(), "three\n");
        assert!(read_messages(&dir.path().join("gone"), 0, 10).is_err());
    }

    #[test]
    fn only_absolute_paths_of_files_are_used() {
        let dir = Scratch::new("usable");
        let path = dir.path().join("ctr.log");
        std::fs::write(&path, "").unwrap();
        assert_eq!(
            usable_path(&format!("{}\n", path.display())),
            Some(path.clone())
        );
        assert_eq!(usable_path(""), None);
        assert_eq!(usable_path("ctr.log"), None);
        assert_eq!(usable_path(&dir.path().display().to_string()), None);
        assert_eq!(usable_path(&format!("{}.x", path.display())), None);
    }
}
