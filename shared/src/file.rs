//! Reading a small input file (the allowlist, the router's configuration) without ever blocking on it.
//!
//! The path is opened non-blocking, so a FIFO put at the path opens at once instead of waiting for a
//! writer; the opened descriptor (not the path, which may be swapped in between) must be a regular file,
//! which rules out FIFOs, devices such as `/dev/zero` and directories; and at most one byte past the
//! caller's cap is read, so a file that grows while it is read cannot make the read unbounded.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Why [`read_capped`] read nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening, inspecting or reading the file failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The path leads to a FIFO, a device, a directory or a socket.
    #[error("not a regular file (a FIFO, device or directory cannot be read as one)")]
    NotAFile,
}

/// Reads the regular file at `path` (following symlinks), at most `max + 1` bytes: a result longer than
/// `max` means the file is larger than `max`, which the caller refuses in its own words.
pub fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    let mut bytes =
        Vec::with_capacity(usize::try_from(meta.len().min(max.saturating_add(1))).unwrap_or(0));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_directories_are_refused_and_reads_are_capped() {
        let guard = crate::test_support::TestDir::new("file");
        let dir: &std::path::Path = &guard;
        let fifo = dir.join("fifo");
        crate::test_support::mkfifo(&fifo);
        let zero = dir.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for path in [&fifo, &zero, dir] {
            assert!(
                matches!(read_capped(path, 10), Err(ReadError::NotAFile)),
                "{}",
                path.display()
            );
        }
        let file = dir.join("file");
        std::fs::write(&file, "0123456789abc").unwrap();
        assert_eq!(read_capped(&file, 100).unwrap(), b"0123456789abc");
        assert_eq!(
            read_capped(&file, 4).unwrap(),
            b"01234",
            "one byte past the cap"
        );
    }
}
