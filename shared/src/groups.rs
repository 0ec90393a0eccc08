//! Named groups of hosts: an allowlist line `@pypi` stands for every host a tool needs.
//!
//! Real tools need several names each (PyPI serves its index and its files from two hosts), and a user
//! who lists one of them gets a half-working tool. The groups are vetted lists compiled into the binary:
//! each host says what uses it, so a reviewer can tell why it is there. `agent-sandbox allow --groups`
//! prints them.
//!
//! `@anthropic` is what the pinned Claude Code needs for login, the API and the features a user expects;
//! hosts it names for telemetry, auto-update, documentation links and opt-in integrations are left out
//! on purpose and listed, with the reason, in `containers/sandbox/claude-hosts-ignore`. The end-to-end
//! scenario `claude_hosts` reads the host names out of the Claude Code in the built image and fails when
//! one is in neither list, so bumping `CLAUDE_CODE_VERSION` cannot silently break login.

/// One host of a group and why it is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupHost {
    /// The host, in allowlist syntax (`name`, `.domain` or `name:port`).
    pub entry: &'static str,
    /// What uses it.
    pub why: &'static str,
}

/// A named group of hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// The name, written `@name` in an allowlist.
    pub name: &'static str,
    /// What the group is for.
    pub about: &'static str,
    /// Its hosts.
    pub hosts: &'static [GroupHost],
}

const fn h(entry: &'static str, why: &'static str) -> GroupHost {
    GroupHost { entry, why }
}

/// Every group, in the order `allow --groups` lists them.
pub const GROUPS: &[Group] = &[
    Group {
        name: "anthropic",
        about: "Claude Code: login and the API (no telemetry, no auto-update)",
        hosts: &[
            h(
                "api.anthropic.com",
                "the Claude API: every model request, the OAuth profile and API-key creation after login",
            ),
            h(
                "platform.claude.com",
                "the login console: OAuth authorize and the token exchange (/v1/oauth/token) at login and refresh",
            ),
            h(
                "claude.ai",
                "Claude subscription login: OAuth client metadata and the account pages login links to",
            ),
        ],
    },
    Group {
        name: "github",
        about: "git over HTTPS, the GitHub API and downloads",
        hosts: &[
            h("github.com", "git clone/fetch/push over HTTPS, web pages"),
            h("api.github.com", "the REST and GraphQL API (gh, actions tooling)"),
            h("codeload.github.com", "source archives (tarball/zipball downloads)"),
            h("raw.githubusercontent.com", "raw file downloads"),
            h("objects.githubusercontent.com", "release assets and Git LFS objects"),
            h("release-assets.githubusercontent.com", "release asset downloads (newer redirect target)"),
        ],
    },
    Group {
        name: "npm",
        about: "the npm registry",
        hosts: &[h(
            "registry.npmjs.org",
            "npm install: package metadata and tarballs",
        )],
    },
    Group {
        name: "pypi",
        about: "the Python Package Index",
        hosts: &[
            h("pypi.org", "pip: the simple index and JSON API"),
            h("files.pythonhosted.org", "pip: the wheel and sdist files the index links to"),
        ],
    },
    Group {
        name: "crates",
        about: "crates.io for cargo",
        hosts: &[
            h("index.crates.io", "cargo: the sparse registry index"),
            h("static.crates.io", "cargo: crate downloads"),
            h("crates.io", "cargo: the web API (search, login, publish)"),
        ],
    },
    Group {
        name: "debian",
        about: "Debian package archives for apt",
        hosts: &[
            h("deb.debian.org", "apt: the main archive (CDN)"),
            h("security.debian.org", "apt: security updates"),
        ],
    },
];

/// The group called `name` (without the `@`), if there is one.
#[must_use]
pub fn find(name: &str) -> Option<&'static Group> {
    GROUPS.iter().find(|g| g.name.eq_ignore_ascii_case(name))
}

/// The known group names, `@`-prefixed and comma-separated, for error messages.
#[must_use]
pub fn names() -> String {
    GROUPS
        .iter()
        .map(|g| format!("@{}", g.name))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allowlist::{parse_entry, Entry};

    #[test]
    fn every_group_host_is_a_valid_plain_entry() {
        assert!(GROUPS.len() >= 6);
        for g in GROUPS {
            assert!(!g.hosts.is_empty(), "@{}", g.name);
            for host in g.hosts {
                let e = parse_entry(host.entry).unwrap_or_else(|e| panic!("@{}: {e}", g.name));
                assert!(matches!(e, Entry::Host(_)), "@{}: {}", g.name, host.entry);
                assert_eq!(e.to_string(), host.entry, "written in canonical form");
                assert!(!host.why.is_empty());
            }
        }
    }

    #[test]
    fn lookup_is_case_insensitive_and_exact() {
        let cases = [
            ("anthropic", Some("anthropic")),
            ("PyPI", Some("pypi")),
            ("github", Some("github")),
            ("git", None),
            ("", None),
        ];
        for (name, want) in cases {
            assert_eq!(find(name).map(|g| g.name), want, "{name}");
        }
        assert!(names().contains("@crates"));
    }

    #[test]
    fn anthropic_covers_login_and_api() {
        let g = find("anthropic").unwrap();
        let hosts: Vec<&str> = g.hosts.iter().map(|h| h.entry).collect();
        for needed in ["api.anthropic.com", "platform.claude.com", "claude.ai"] {
            assert!(hosts.contains(&needed), "{needed}");
        }
    }
}
