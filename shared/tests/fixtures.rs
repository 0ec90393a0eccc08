//! Allowlist fixtures: every file under tests/data/allowlists/{valid,invalid} is parsed. Expectations are
//! written in the files themselves as comments (`# expect-entries: N`, `# expect-line: N`,
//! `# expect: text`), which the parser ignores.

use std::path::{Path, PathBuf};

use agent_sandbox_shared::Allowlist;

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/allowlists")
        .join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

fn expectations(path: &Path, key: &str) -> Vec<String> {
    let prefix = format!("# {key}: ");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

#[test]
fn valid_allowlists_parse() {
    for path in fixtures("valid") {
        let list = Allowlist::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let want: usize = expectations(&path, "expect-entries")[0].parse().unwrap();
        assert_eq!(list.entries().len(), want, "{}", path.display());
    }
}

#[test]
fn invalid_allowlists_name_the_line() {
    for path in fixtures("invalid") {
        let msg = Allowlist::load(&path).unwrap_err().to_string();
        let line = &expectations(&path, "expect-line")[0];
        let location = format!("{}:{line}: ", path.display());
        assert!(
            msg.contains(&location),
            "{}: expected {location:?} in {msg}",
            path.display()
        );
        for want in expectations(&path, "expect") {
            assert!(
                msg.contains(&want),
                "{}: expected {want:?} in {msg}",
                path.display()
            );
        }
    }
}
