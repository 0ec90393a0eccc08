//! Test hosts for the router's integration tests and its proxy benchmark (a dev-only crate, never
//! shipped): a network namespace joined to ours by a veth pair ([`netns`]), a DNS server on loopback that
//! maps test names to addresses ([`dns`]), a test CA ([`pki`]), the upstream servers the tests and the
//! benchmark talk to through the router ([`upstream`]), and the client side of those exchanges
//! ([`client`]).
//!
//! Nothing here depends on the router: the tests drive the router, this crate plays the rest of the
//! world. Addresses are loopback or from 198.18.0.0/15 inside namespaces the tests create, never an
//! outside address.
//!
//! A test that needs what the machine may not have (root, for namespaces) asks [`require`] first: it
//! skips loudly on a developer's machine and fails under CI, so a CI run can never pass by skipping.

pub mod client;
pub mod dns;
pub mod netns;
pub mod pki;
pub mod upstream;

/// True when the `CI` environment variable is set (to anything but empty, `0` or `false`).
#[must_use]
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// Whether a test that needs `what` can run: true when `available`. Otherwise it fails (panics) when
/// [`in_ci`], and says loudly that it is skipped when not, returning false so the caller returns early.
///
/// # Panics
/// When `what` is not available and `CI` is set.
#[must_use]
pub fn require(what: &str, available: bool) -> bool {
    if available {
        return true;
    }
    assert!(
        !in_ci(),
        "this test needs {what}, which is not available, and CI is set: it must run in CI"
    );
    eprintln!("SKIPPED: this test needs {what} (set CI=1 to make that a failure)");
    false
}
