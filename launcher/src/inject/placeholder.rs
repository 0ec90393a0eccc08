//! The API key placeholder: what the sandbox's `ANTHROPIC_API_KEY` holds instead of the real key.
//!
//! It has the real key's shape (`sk-ant-api03-` and then random characters of the key's alphabet, to
//! the real key's length), so Claude Code accepts it, and it is stable per home volume, kept host-side
//! in `$XDG_STATE_HOME/agent-sandbox/api-key-placeholders/VOLUME` (mode 0600 in a 0700 directory):
//! Claude Code remembers which keys the user approved by a suffix of the key in the home volume, and a
//! new placeholder every session would ask again each time.

use std::ffi::OsString;
use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use agent_sandbox_shared::inject::{MAX_PLACEHOLDER_LEN, MIN_PLACEHOLDER_LEN};

/// The prefix of Anthropic API keys, which every placeholder carries.
pub const PREFIX: &str = "sk-ant-api03-";

/// The shortest placeholder made, whatever the real key's length: a real key is about 108 characters.
const MIN_LEN: usize = 40;

/// The characters after the prefix (a real key's alphabet).
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A placeholder could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum PlaceholderError {
    /// The home volume's name cannot be a file name.
    #[error("home volume name `{0}` is not a podman volume name (letters, digits, `_`, `.`, `-`)")]
    VolumeName(String),
    /// A file or directory of the store could not be read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The real key is not something a header can carry.
    #[error("ANTHROPIC_API_KEY is not a key: it must be printable ASCII with no spaces, at most {MAX_PLACEHOLDER_LEN} characters")]
    BadKey,
}

/// Where the launcher keeps per-user state: `$XDG_STATE_HOME/agent-sandbox` when that is absolute, else
/// `~/.local/state/agent-sandbox`.
#[must_use]
pub fn state_dir(home: &Path, xdg_state_home: Option<OsString>) -> PathBuf {
    match xdg_state_home.map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir.join("agent-sandbox"),
        _ => home.join(".local/state/agent-sandbox"),
    }
}

/// The file holding home volume `volume`'s placeholder under `state`.
pub fn placeholder_file(state: &Path, volume: &str) -> Result<PathBuf, PlaceholderError> {
    let ok = !volume.is_empty()
        && volume.len() <= 255
        && volume.as_bytes()[0].is_ascii_alphanumeric()
        && volume
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(PlaceholderError::VolumeName(volume.to_owned()));
    }
    Ok(state.join("api-key-placeholders").join(volume))
}

/// Checks the real key (surrounding whitespace already trimmed) can be carried in a header.
pub fn check_key(key: &str) -> Result<(), PlaceholderError> {
    if key.len() < MIN_PLACEHOLDER_LEN
        || key.len() > MAX_PLACEHOLDER_LEN
        || !key.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(PlaceholderError::BadKey);
    }
    Ok(())
}

/// The length of the placeholder for a key of `key_len` characters.
fn wanted_len(key_len: usize) -> usize {
    key_len.clamp(MIN_LEN, MAX_PLACEHOLDER_LEN)
}

/// Home volume `volume`'s placeholder for a key of `key_len` characters: the stored one when it has
/// that length, else a new one, stored (by rename) before it is returned.
pub fn placeholder(state: &Path, volume: &str, key_len: usize) -> Result<String, PlaceholderError> {
    let file = placeholder_file(state, volume)?;
    let len = wanted_len(key_len);
    if let Some(stored) = read_stored(&file)? {
        if stored.len() == len && is_placeholder(&stored) {
            return Ok(stored);
        }
    }
    let new = random_placeholder(len)?;
    store(&file, &new)?;
    Ok(new)
}

/// The stored placeholder of home volume `volume`, if one was made (`--print-config` shows it; it
/// creates nothing).
pub fn stored(state: &Path, volume: &str) -> Result<Option<String>, PlaceholderError> {
    read_stored(&placeholder_file(state, volume)?)
}

/// Whether `s` has a placeholder's shape.
fn is_placeholder(s: &str) -> bool {
    s.strip_prefix(PREFIX)
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| ALPHABET.contains(&b)))
}

fn read_stored(file: &Path) -> Result<Option<String>, PlaceholderError> {
    let io = |what, source| PlaceholderError::Io {
        what,
        path: file.to_owned(),
        source,
    };
    match fs::File::open(file) {
        Ok(f) => {
            let mut text = String::new();
            // Capped: the file is ours, but a stray huge file must not be read whole.
            f.take(MAX_PLACEHOLDER_LEN as u64 + 2)
                .read_to_string(&mut text)
                .map_err(|e| io("cannot read", e))?;
            Ok(Some(text.trim().to_owned()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("cannot open", e)),
    }
}

fn random_placeholder(len: usize) -> Result<String, PlaceholderError> {
    let mut bytes = vec![0u8; len - PREFIX.len()];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| PlaceholderError::Io {
            what: "cannot read",
            path: "/dev/urandom".into(),
            source,
        })?;
    let mut out = String::from(PREFIX);
    // 64 symbols: each byte's low six bits pick one with no bias.
    out.extend(
        bytes
            .iter()
            .map(|b| char::from(ALPHABET[usize::from(b & 63)])),
    );
    Ok(out)
}

/// Writes `value` to `file` (0600) by rename, creating its directories 0700.
fn store(file: &Path, value: &str) -> Result<(), PlaceholderError> {
    let dir = file
        .parent()
        .expect("the placeholder file is in a directory");
    let io = |what, path: &Path, source| PlaceholderError::Io {
        what,
        path: path.to_owned(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("cannot create", dir, e))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| io("cannot set permissions on", dir, e))?;
    let tmp = dir.join(format!(
        ".{}.{}",
        file.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("cannot create", &tmp, e))?;
    f.write_all(format!("{value}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io("cannot write", &tmp, e))?;
    fs::rename(&tmp, file).map_err(|e| io("cannot replace", file, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn placeholders_have_the_keys_shape_and_are_stable_per_volume() {
        let tmp = std::env::temp_dir().join(format!("as-placeholder-{}", std::process::id()));
        let state = tmp.join("state/agent-sandbox");
        let key = format!("{PREFIX}{}AA", "x".repeat(93));
        let a = placeholder(&state, "agent-sandbox-home", key.len()).unwrap();
        assert!(a.starts_with(PREFIX), "{a}");
        assert_eq!(a.len(), key.len());
        assert!(is_placeholder(&a));
        assert_ne!(a, key);
        // Stable for the volume, different for another.
        assert_eq!(
            placeholder(&state, "agent-sandbox-home", key.len()).unwrap(),
            a
        );
        let b = placeholder(&state, "other.vol_1", key.len()).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            stored(&state, "other.vol_1").unwrap().as_deref(),
            Some(b.as_str())
        );
        assert_eq!(stored(&state, "never-used").unwrap(), None);
        // A key of another length gets a placeholder of that length (shape follows the key).
        let c = placeholder(&state, "agent-sandbox-home", 60).unwrap();
        assert_eq!(c.len(), 60);
        assert_eq!(
            placeholder(&state, "agent-sandbox-home", 5).unwrap().len(),
            MIN_LEN
        );
        // The store is private.
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        let file = placeholder_file(&state, "agent-sandbox-home").unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        // Volume names that are not file names are refused.
        for bad in ["", "../x", "a/b", ".hidden", "x\ny"] {
            assert!(placeholder_file(&state, bad).is_err(), "{bad:?}");
        }
        fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn state_dir_follows_xdg() {
        let home = Path::new("/home/me");
        assert_eq!(
            state_dir(home, None),
            Path::new("/home/me/.local/state/agent-sandbox")
        );
        assert_eq!(
            state_dir(home, Some("/st".into())),
            Path::new("/st/agent-sandbox")
        );
        assert_eq!(
            state_dir(home, Some("rel".into())),
            Path::new("/home/me/.local/state/agent-sandbox")
        );
    }

    #[test]
    fn keys_must_fit_a_header() {
        check_key(&format!("{PREFIX}{}", "a".repeat(90))).unwrap();
        assert!(check_key("short").is_err());
        assert!(check_key(&format!("{PREFIX}a b{}", "c".repeat(30))).is_err());
        assert!(check_key(&"a".repeat(600)).is_err());
    }
}
