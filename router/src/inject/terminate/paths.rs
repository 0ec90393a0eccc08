//! Request targets that mint an API key with the OAuth access token the router adds: refused, since
//! the key would come back in clear text to the sandbox.

/// Paths where an OAuth access token buys a new API key, returned in clear text in the response: with
/// the token the router added, that key would reach the sandbox (which the response scan cannot know
/// to look for), so such requests are refused. Claude Code's Console sign-in calls the first.
const KEY_MINTING_PATHS: &[&str] = &["/api/oauth/claude_cli/create_api_key"];

/// Whether a request target is one of [`KEY_MINTING_PATHS`], compared the way a server may read it:
/// scheme and authority of an absolute-form target dropped, the query and fragment dropped,
/// percent-escapes decoded once, empty and `.` segments dropped, `..` applied, ASCII case ignored.
pub(super) fn mints_api_key(target: &str) -> bool {
    let path = normalised_path(target);
    KEY_MINTING_PATHS
        .iter()
        .any(|p| path.eq_ignore_ascii_case(p))
}

/// See [`mints_api_key`].
pub(super) fn normalised_path(target: &str) -> String {
    let mut rest = target;
    for scheme in ["https://", "http://"] {
        if rest.len() >= scheme.len() && rest[..scheme.len()].eq_ignore_ascii_case(scheme) {
            rest = &rest[scheme.len()..];
            rest = rest.find('/').map_or("", |i| &rest[i..]);
        }
    }
    let path = rest.split(['?', '#']).next().unwrap_or_default();
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                decoded.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_minting_paths_are_recognised_however_written() {
        for t in [
            "/api/oauth/claude_cli/create_api_key",
            "/api/oauth/claude_cli/create_api_key?x=1",
            "/API/OAuth/claude_cli/create_api_key/",
            "//api//oauth/./claude_cli/create_api_key",
            "/api/oauth/x/../claude_cli/create_api_key",
            "/api/oauth/claude_cli/create%5Fapi%5fkey",
            "/api%2Foauth%2Fclaude_cli%2Fcreate_api_key",
            "https://api.anthropic.com/api/oauth/claude_cli/create_api_key",
            "/api\\oauth\\claude_cli\\create_api_key",
        ] {
            assert!(mints_api_key(t), "{t}");
        }
        for t in [
            "/api/oauth/profile",
            "/v1/messages?beta=true",
            "/api/oauth/claude_cli/roles",
            "/api/oauth/claude_cli/create_api_key_x",
            "/x?/api/oauth/claude_cli/create_api_key",
        ] {
            assert!(!mints_api_key(t), "{t}");
        }
    }
}
