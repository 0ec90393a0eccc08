//! What agent-sandbox's three binaries agree on: the allowlist format, the policy decisions, the session
//! plan (which loopback address each name resolves to inside the sandbox, which ports the router and the
//! forwarder listen on), and the router's configuration file.
//!
//! This crate does no I/O beyond reading the file it is given ([`file`]), so every decision can be tested as a table.
//! The exceptions are behind cargo features: `net`, the accept step both servers share (`net`), and
//! `oauth-store`, the host-side OAuth token store (`oauth_store`).

pub mod allowlist;
pub mod config;
pub mod file;
pub mod groups;
pub mod inject;
pub mod logs;
pub mod name;
#[cfg(feature = "net")]
pub mod net;
#[cfg(feature = "oauth-store")]
pub mod oauth_store;
pub mod plan;
pub mod policy;
#[cfg(test)]
mod test_support;

pub use allowlist::{Allowlist, AllowlistError, Entry};
pub use config::{Answers, Limits, RouterConfig, Rules, ValidConfig};
pub use name::{HostName, NameError};
pub use plan::{Relay, SessionPlan};
pub use policy::{Decision, Policy, Refusal};
