//! The nested-container probe of `agent-sandbox doctor`.
//!
//! The doctor's containment self-test runs `probe.py` inside the sandbox; for rootless podman that
//! script also imports `/usr/lib/agent-sandbox/nested-probe.tar` (this binary, statically linked, as the
//! only file of a root filesystem) with the sandbox's own podman and runs it with
//! `podman run --network host`. From there it shows that a nested container shares the sandbox's network
//! namespace, gets the same answers from the router's DNS, reaches the router through the same loopback
//! forwarders, and reaches none of the host-side addresses the doctor names. It prints one JSON line per
//! check, in the format `probe.py` prints its own, which the launcher reads.
//!
//! ```text
//! spec.rs    the command line: what to expect and which addresses must stay out of reach
//! dns.rs     one A query over UDP, built and parsed by hand (no getaddrinfo in a scratch image)
//! icmp.rs    ICMP errors that come back for what a socket sent, and who sent them (IP_RECVERR)
//! checks.rs  the checks, each a `Line`; the slow ones run side by side
//! ```
//!
//! It only ever sends to addresses on its command line and to the nameserver of its resolv.conf.

pub mod checks;
pub mod dns;
pub mod icmp;
pub mod spec;

pub use checks::{run, Line};
pub use spec::{Spec, Target, UsageError};
