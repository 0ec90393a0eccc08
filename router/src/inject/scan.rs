//! The response scan: no byte of a real secret reaches the client.
//!
//! How it fits: every byte the upstream sends on a terminated connection (heads and bodies) passes
//! through one [`Scanner`] before it is written to the client. A secret may be split across reads (or
//! TLS records), so the scanner holds back the end of what it has seen that could begin a secret until
//! the next bytes show they do not complete one; a response's end releases it ([`Scanner::flush`]),
//! and they stay as context for the next response on the connection, so a secret split across two
//! responses is still caught (its first part has gone out then, never the whole).

use super::oauth_hook::Secret;

/// A secret was found in the response: the connection must be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a real secret appeared in the upstream's response")]
pub(crate) struct SecretFound;

/// Scans a byte stream for any of a set of secrets, across chunk boundaries.
#[derive(Debug)]
pub(crate) struct Scanner {
    /// The secrets looked for (empty ones are dropped: they would match everything).
    secrets: Vec<Secret>,
    /// The length of the longest secret.
    longest: usize,
    /// Bytes seen: `held` at the end are not yet released; the rest is context already released.
    window: Vec<u8>,
    /// How many bytes at the end of `window` are not yet released.
    held: usize,
}

impl Scanner {
    /// A scanner for `secrets`.
    pub(crate) fn new(secrets: Vec<Secret>) -> Scanner {
        let secrets: Vec<Secret> = secrets
            .into_iter()
            .filter(|s| !s.expose().is_empty())
            .collect();
        let longest = secrets.iter().map(|s| s.expose().len()).max().unwrap_or(0);
        Scanner {
            secrets,
            longest,
            window: Vec::new(),
            held: 0,
        }
    }

    /// Replaces the secrets (a token refresh learnt new ones), keeping the context seen so far.
    pub(crate) fn set_secrets(&mut self, secrets: Vec<Secret>) {
        let fresh = Scanner::new(secrets);
        self.secrets = fresh.secrets;
        self.longest = fresh.longest;
    }

    /// Takes `data` in; returns the bytes now safe to send, or [`SecretFound`]. What is held back is
    /// only the end of the stream that could begin a secret (the longest suffix that is a proper prefix
    /// of one), so a stream that does not look like the start of a secret is never delayed (a streamed
    /// answer's events reach the client as they come).
    pub(crate) fn push(&mut self, data: &[u8]) -> Result<Vec<u8>, SecretFound> {
        if self.longest == 0 {
            return Ok(data.to_vec());
        }
        self.window.extend_from_slice(data);
        self.held += data.len();
        // A new match must end in the new bytes: look from `longest - 1` bytes before them.
        let from = self
            .window
            .len()
            .saturating_sub(data.len() + self.longest - 1);
        let hay = &self.window[from..];
        if self.secrets.iter().any(|s| contains(hay, s.expose())) {
            return Err(SecretFound);
        }
        let hold = self
            .secrets
            .iter()
            .map(|s| prefix_suffix(&self.window, s.expose()))
            .max()
            .unwrap_or(0)
            .min(self.held);
        let start = self.window.len() - self.held;
        let release = self.held - hold;
        let out = self.window[start..start + release].to_vec();
        self.held = hold;
        self.trim();
        Ok(out)
    }

    /// Releases everything held (the response ended: nothing more will complete a secret in it).
    pub(crate) fn flush(&mut self) -> Vec<u8> {
        let start = self.window.len() - self.held;
        let out = self.window[start..].to_vec();
        self.held = 0;
        self.trim();
        out
    }

    /// Keeps at most `longest - 1` bytes of released context.
    fn trim(&mut self) {
        let keep = self.held + self.longest.saturating_sub(1);
        if self.window.len() > keep {
            self.window.drain(..self.window.len() - keep);
        }
    }
}

/// The length of the longest end of `window` that is a proper prefix of `secret`.
fn prefix_suffix(window: &[u8], secret: &[u8]) -> usize {
    let most = (secret.len() - 1).min(window.len());
    (1..=most)
        .rev()
        .find(|&k| window.ends_with(&secret[..k]))
        .unwrap_or(0)
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    if hay.len() < needle.len() {
        return false;
    }
    let last_start = hay.len() - needle.len();
    let mut i = 0;
    while i <= last_start {
        match hay[i..=last_start].iter().position(|&b| b == first) {
            None => return false,
            Some(p) => {
                let at = i + p;
                if &hay[at + 1..at + needle.len()] == rest {
                    return true;
                }
                i = at + 1;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scanner(secrets: &[&str]) -> Scanner {
        Scanner::new(
            secrets
                .iter()
                .map(|s| Secret::new(s.as_bytes().to_vec()))
                .collect(),
        )
    }

    #[test]
    fn finds_a_secret_in_one_piece_and_releases_clean_bytes() {
        let mut s = scanner(&["sk-real-key"]);
        let mut out = s.push(b"hello ").unwrap();
        out.extend(s.push(b"world").unwrap());
        out.extend(s.flush());
        assert_eq!(out, b"hello world");
        assert_eq!(s.push(b"xx sk-real-key yy"), Err(SecretFound));
    }

    #[test]
    fn holds_back_a_possible_prefix_only() {
        let mut s = scanner(&["abcdef"]);
        let out = s.push(b"123abcde").unwrap();
        // "abcde" could be the start of the secret: not released yet.
        assert_eq!(out, b"123");
        assert_eq!(s.push(b"f"), Err(SecretFound));
        let mut s = scanner(&["abcdef"]);
        assert_eq!(s.push(b"data: {}\n\n").unwrap(), b"data: {}\n\n");
        assert_eq!(s.push(b"xab").unwrap(), b"x");
        assert_eq!(s.push(b"x").unwrap(), b"abx");
    }

    #[test]
    fn a_secret_split_across_responses_is_caught() {
        let mut s = scanner(&["abcdef"]);
        assert_eq!(s.push(b"xxabc").unwrap(), b"xx");
        assert_eq!(s.flush(), b"abc");
        assert_eq!(s.push(b"def"), Err(SecretFound));
    }

    #[test]
    fn no_secrets_passes_everything() {
        let mut s = Scanner::new(Vec::new());
        assert_eq!(s.push(b"anything").unwrap(), b"anything");
        assert_eq!(s.flush(), b"");
    }

    proptest! {
        #[test]
        fn detection_does_not_depend_on_the_split(
            prefix in proptest::collection::vec(any::<u8>(), 0..200),
            suffix in proptest::collection::vec(any::<u8>(), 0..200),
            with_secret in any::<bool>(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let secret = b"sk-ant-api03-REALREALREAL";
            let mut data = prefix.clone();
            if with_secret {
                data.extend_from_slice(secret);
            }
            data.extend_from_slice(&suffix);
            let whole = contains(&data, secret);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
            points.push(0);
            points.push(data.len());
            points.sort_unstable();
            let mut s = Scanner::new(vec![Secret::new(secret.to_vec())]);
            let mut out = Vec::new();
            let mut found = false;
            for w in points.windows(2) {
                match s.push(&data[w[0]..w[1]]) {
                    Ok(b) => out.extend(b),
                    Err(SecretFound) => { found = true; break; }
                }
            }
            prop_assert_eq!(found, whole);
            if found {
                // Never the whole secret released.
                prop_assert!(!contains(&out, secret));
            } else {
                out.extend(s.flush());
                prop_assert_eq!(out, data);
            }
        }
    }
}
