//! One connection on a host:port entry's listener: no peeking, the entry decides; dial, relay.
//!
//! How it fits: the accept loop ([`super::listener`]) runs [`Proxy::handle_forward`] per connection with
//! the listener's entry. The policy is still asked, so an entry a reload removed is refused even while
//! its listener is still open.

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sandbox_shared::logs::Kind;
use agent_sandbox_shared::HostName;
use tokio::net::TcpStream;
use tracing::debug;

use super::conn_log::ConnLog;
use super::relay;
use super::Proxy;
use crate::metrics::RefusalReason;

impl Proxy {
    /// One host:port connection.
    pub(super) async fn handle_forward(
        self: Arc<Self>,
        client: TcpStream,
        peer: SocketAddr,
        host: Arc<HostName>,
        port: u16,
    ) {
        let log = ConnLog::new(
            peer,
            Kind::Forward,
            self.coalesce,
            Arc::clone(&self.bounds.metrics),
        );
        log.set_name(host.as_str());
        if !self.rules.load().policy.allows_port(&host, port) {
            log.refuse(
                host.as_str(),
                &format!("port {port} is not allowed for this host"),
                RefusalReason::NotAllowed,
            );
            return;
        }
        let Ok(upstream) = self.dial(&host, port, &log).await else {
            return;
        };
        let relaying = relay::relay(&client, &upstream, &log.bytes_up, &log.bytes_down);
        if let Some(Err(error)) = self.until_idle(&log, relaying).await {
            debug!(%error, "relay ended with an error");
        }
    }
}
