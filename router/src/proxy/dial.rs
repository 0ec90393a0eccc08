//! The one way a connection driver reaches its upstream.
//!
//! How it fits: after the decision, the TLS, HTTP and host:port drivers all call [`Proxy::dial`] with the
//! decided name and port; it dials through [`Upstream`](super::upstream::Upstream) (resolve, address
//! check, connect within the timeout) and records the outcome on the connection's log, so the three
//! drivers log dials the same way and only choose what the client sees on failure.

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
    pub(super) async fn dial(
        &self,
        name: &HostName,
        port: u16,
        log: &ConnLog,
    ) -> Result<TcpStream, DialError> {
        match self.upstream.connect(name, port).await {
            Ok((stream, addr)) => {
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
