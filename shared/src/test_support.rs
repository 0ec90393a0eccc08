//! Helpers for this crate's unit tests.

use std::path::{Path, PathBuf};

/// A fresh directory for one test under the temp directory, removed however the test ends.
pub(crate) struct TestDir(PathBuf);

impl TestDir {
    /// Creates `as-shared-TAG-PID` (emptied first, should a killed run have left it).
    pub(crate) fn new(tag: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("as-shared-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes a FIFO at `path`.
pub(crate) fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
}
