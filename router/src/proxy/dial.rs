//! The one way a connection driver reaches its upstream.
//!
//! How it fits: after the decision, the TLS, HTTP and host:port drivers all call [`Proxy::dial`] with the
//! decided name and port; it dials through [`Upstream`](super::upstream::Upstream) (resolve, address
//! check, connect within the timeout) and records the outcome on the connection's log, so the three
//! drivers log dials the same way and only choose what the client sees on failure.
//!
//! The wildcard lookup budget is spent here: a name that the allowlist does not list itself (one below a
//! subdomain entry, whose labels the client chose) and that the resolver cache cannot answer costs its
//! client one lookup of [`WildcardBudget`](crate::fairness::WildcardBudget); with none left the
//! connection is refused before anything is looked up.

use std::time::Instant;

use agent_sandbox_shared::logs::Decision;
use agent_sandbox_shared::HostName;
use tokio::net::TcpStream;

use super::conn_log::ConnLog;
use super::upstream::DialError;
use super::Proxy;

impl Proxy {
    /// Dials `name:port` for the connection logged by `log`. On success the upstream address is logged
    /// and the connection counts as allowed; on failure it is logged as a refusal (the address check
    /// refused every address) or an upstream error, and the error is returned for the driver to answer.
    pub(crate) async fn dial(
        &self,
        name: &HostName,
        port: u16,
        log: &ConnLog,
    ) -> Result<TcpStream, DialError> {
        let listed = self.rules.load().policy.lists_exactly(name);
        let client = log.client.ip();
        let may_resolve = || {
            if listed {
                return Ok(());
            }
            if self
                .bounds
                .budget
                .spend(client, name.as_str(), Instant::now())
            {
                self.bounds.metrics.wildcard_lookup();
                Ok(())
            } else {
                // Counted as a refusal by reason when the log records it (`dial_failed`).
                Err(DialError::WildcardBudget {
                    name: name.clone(),
                    per_minute: self.bounds.wildcard_per_minute,
                })
            }
        };
        let started = Instant::now();
        match self.upstream.connect(name, port, may_resolve).await {
            Ok((stream, addr)) => {
                self.bounds.metrics.upstream_connect(started.elapsed());
                log.set_upstream(addr);
                log.set_decision(Decision::Allowed);
                Ok(stream)
            }
            Err(e) => {
                log.dial_failed(name.as_str(), &e);
                Err(e)
            }
        }
    }
}
