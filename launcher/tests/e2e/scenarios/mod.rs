//! The scenarios, one module each, in the order the suite runs them. Each takes the mode's [`Suite`]
//! (set up once per mode: the upstream containers, the CA, the home volume) and records its checks.

use crate::suite::Suite;

mod claude_hosts;
mod cleanup;
mod concurrent;
mod doctor;
mod escapes;
mod files;
mod inject;
mod live;
mod nested;
mod reach;
mod refusals;
mod stale;
mod warm_up;

/// A scenario's name (what `make e2e E2E=NAME` matches) and its body.
pub(crate) type Scenario = (&'static str, fn(&mut Suite<'_>));

/// Every scenario, in running order: `warm_up` first, so that its timing is the one that pays for
/// podman's first-use costs.
pub(crate) const ALL: &[Scenario] = &[
    ("warm_up", warm_up::run),
    ("reach", reach::run),
    ("escapes", escapes::run),
    ("nested", nested::run),
    ("files", files::run),
    ("refusals", refusals::run),
    ("cleanup", cleanup::run),
    ("concurrent", concurrent::run),
    ("stale", stale::run),
    ("claude_hosts", claude_hosts::run),
    ("live", live::run),
    ("doctor", doctor::run),
    ("inject", inject::run),
];
