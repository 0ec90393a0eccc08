//! Helpers for this crate's unit tests.

use std::path::{Path, PathBuf};

/// A fresh directory for one test under the temp directory, removed however the test ends.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates `asr-unit-TAG-PID` (emptied first, should a killed run have left it).
    pub(crate) fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("asr-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The standalone gateway's command line on loopback, allowing what `list` holds: answers 127.0.0.2,
/// a resolver address where nothing listens, DNS, HTTP and TLS on port 0.
pub(crate) fn loopback_cli(list: &Path) -> crate::cli::Cli {
    use clap::Parser as _;
    crate::cli::Cli::parse_from([
        "agent-sandbox-router",
        "--allowlist",
        list.to_str().unwrap(),
        "--answer",
        "127.0.0.2",
        "--resolver",
        "127.0.0.1:9",
        "--dns",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--https",
        "127.0.0.1:0",
    ])
}
