//! Everything a refused client sees: the TLS alert or the HTTP response, its text, and the gentle close.
//!
//! How it fits: the connection drivers decide *that* a connection is refused (and log it through
//! [`ConnLog`](super::conn_log::ConnLog)); this module says *what the client is told*, in one place. The
//! texts name the allowlist the way the configuration says (`allowlist` in the router configuration: the
//! user's real file in a session, the `--allowlist` file of a standalone router, or no file at all).

use std::time::Duration;

use agent_sandbox_shared::{NameError, Refusal};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::TcpStream;

use super::http::{self, Status};
use super::relay::{read_some, shutdown_write, write_all};
use super::tls::{alert_record, AlertDescription};
use super::upstream::DialError;
use super::PEEK_READ;
use crate::metrics::RefusalReason;

/// How long a refused client gets to read the refusal before the socket is closed.
const LINGER: Duration = Duration::from_secs(1);

/// The most a refused client may still send while it reads the refusal.
const LINGER_DRAIN: usize = 1024 * 1024;

/// The refusal texts of one router.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Refusals {
    /// The allowlist as the texts name it; `None`: they name no file.
    allowlist: Option<String>,
}

impl Refusals {
    /// Texts naming `allowlist` (a path, or a hint such as `~/.config/…`), or no file.
    #[must_use]
    pub(crate) fn new(allowlist: Option<String>) -> Refusals {
        Refusals { allowlist }
    }

    /// The body of a response refusing a host by policy.
    #[must_use]
    pub(crate) fn policy_body(&self, status: Status, shown: &str, reason: &str) -> String {
        if status != Status::Forbidden {
            return self.bad_request_body(shown, reason);
        }
        let how = "one host per line; .example.com allows every subdomain";
        let add = match &self.allowlist {
            Some(path) => format!("To allow it, add it to {path} ({how}) and start a new session."),
            None => format!("To allow it, add it to the router's allowlist ({how})."),
        };
        format!(
            "agent-sandbox: {shown} is not on the sandbox allowlist ({reason}); nothing was forwarded.\n\
             {add}\n"
        )
    }

    /// The body of a response refusing a malformed request.
    #[must_use]
    pub(crate) fn bad_request_body(&self, shown: &str, reason: &str) -> String {
        let host = if shown.is_empty() { "(none)" } else { shown };
        let list = match &self.allowlist {
            Some(path) => format!("its allowlist ({path})"),
            None => "its allowlist".to_owned(),
        };
        format!(
            "agent-sandbox: request refused: {reason} (host {host}); nothing was forwarded.\n\
             The sandbox forwards well-formed HTTP/1.x requests to hosts on {list} only.\n"
        )
    }
}

/// The response to a first request head that did not arrive within the peek timeout.
#[must_use]
pub(crate) fn head_timeout_body(peek_timeout: Duration) -> String {
    format!(
        "agent-sandbox: no complete request head within {} s; nothing was forwarded.\n",
        peek_timeout.as_secs()
    )
}

/// The response to a later request head on a kept-alive connection that did not complete in time.
pub(crate) const LATER_HEAD_TIMEOUT_BODY: &str =
    "agent-sandbox: request head not completed in time.\n";

/// The response to a request whose Host differs from the first one's on a kept-alive connection.
#[must_use]
pub(crate) fn host_changed_body(reason: &str, new: &str) -> String {
    format!("agent-sandbox: {reason}; open a new connection for {new}. Nothing was forwarded.\n")
}

/// Why a client at its connection cap is refused (logged).
#[must_use]
pub(crate) fn client_cap_reason(cap: u32) -> String {
    format!("client holds its cap of {cap} connections (--max-connections-per-client)")
}

/// The response body for a client at its connection cap.
#[must_use]
pub(crate) fn client_cap_body(cap: u32) -> String {
    format!(
        "agent-sandbox: too many connections from this client: it already holds {cap}, the gateway's cap \
         per client (--max-connections-per-client); nothing was forwarded. Close some and try again.\n"
    )
}

/// The status and body when an allowed name could not be dialled.
#[must_use]
pub(crate) fn dial_response(name: &str, e: &DialError) -> (Status, String) {
    if let DialError::WildcardBudget { .. } = e {
        return (
            Status::ServiceUnavailable,
            format!("agent-sandbox: {e}; nothing was forwarded. Try again in a minute.\n"),
        );
    }
    if e.is_refusal() {
        (
            Status::Forbidden,
            format!(
                "agent-sandbox: {name} {e}, which the sandbox never connects to; nothing was forwarded.\n"
            ),
        )
    } else {
        (Status::BadGateway, format!("agent-sandbox: {e}.\n"))
    }
}

/// The alert for an allowed name that could not be dialled.
#[must_use]
pub(crate) fn dial_alert(e: &DialError) -> AlertDescription {
    // A used-up budget is a transient limit, like a client at its connection cap (see the listener's
    // module doc for why that is internal_error).
    if let DialError::WildcardBudget { .. } = e {
        return AlertDescription::InternalError;
    }
    if e.is_refusal() {
        AlertDescription::AccessDenied
    } else {
        AlertDescription::InternalError
    }
}

/// The response when the upstream answered a WebSocket upgrade with a `101` that is not a genuine
/// WebSocket switch.
#[must_use]
pub(crate) fn invalid_switch_body(name: &str, reason: &str) -> String {
    format!("agent-sandbox: {name}: {reason}; the connection is closed.\n")
}

/// The alert for a policy refusal of an SNI.
#[must_use]
pub(crate) fn policy_alert(r: &Refusal) -> AlertDescription {
    match r {
        Refusal::NotListed(_) => AlertDescription::AccessDenied,
        Refusal::Invalid(_) => AlertDescription::UnrecognizedName,
    }
}

/// The status for a policy refusal of a Host.
#[must_use]
pub(crate) fn policy_status(r: &Refusal) -> Status {
    match r {
        Refusal::NotListed(_) | Refusal::Invalid(NameError::IpLiteral(_)) => Status::Forbidden,
        Refusal::Invalid(_) => Status::BadRequest,
    }
}

/// The metrics' reason for a policy refusal: a name not allowed (an IP literal included), else `bad`
/// (the name the client sent is not a hostname: a bad hello or request).
#[must_use]
pub(crate) fn policy_refusal(r: &Refusal, bad: RefusalReason) -> RefusalReason {
    match r {
        Refusal::NotListed(_) | Refusal::Invalid(NameError::IpLiteral(_)) => {
            RefusalReason::NotAllowed
        }
        Refusal::Invalid(_) => bad,
    }
}

/// The metrics' reason for an HTTP refusal answered with `status`: 403 is the policy's "not allowed",
/// anything else a request the router will not route.
#[must_use]
pub(crate) fn http_refusal(status: Status) -> RefusalReason {
    if status == Status::Forbidden {
        RefusalReason::NotAllowed
    } else {
        RefusalReason::BadRequest
    }
}

/// A short, actionable reason for a policy refusal (logged, and shown to HTTP clients).
#[must_use]
pub(crate) fn policy_reason(r: &Refusal) -> String {
    match r {
        Refusal::NotListed(_) => "not on the allowlist".to_owned(),
        Refusal::Invalid(NameError::IpLiteral(_)) => "IP literal".to_owned(),
        Refusal::Invalid(NameError::Empty) => "empty name".to_owned(),
        Refusal::Invalid(e) => format!("invalid name: {e}"),
    }
}

/// Sends a fatal alert, then closes gently.
pub(crate) async fn refuse_tls(client: &TcpStream, alert: AlertDescription) {
    let _ = write_all(client, &alert_record(alert)).await;
    close_gently(client).await;
}

/// Sends an HTTP response, then closes gently.
pub(crate) async fn refuse_http(client: &TcpStream, status: Status, body: &str) {
    send_and_close(client, &http::response(status, body)).await;
}

/// Sends a response already encoded, then closes gently.
pub(crate) async fn send_and_close(client: &TcpStream, response: &[u8]) {
    let _ = write_all(client, response).await;
    close_gently(client).await;
}

/// Ends the client's stream, then reads and discards what the client still sends, briefly, so closing
/// does not reset the connection (and destroy the refusal) while unread bytes sit in the receive buffer.
async fn close_gently(client: &TcpStream) {
    shutdown_write(client);
    let drain = async {
        let mut buf = Vec::with_capacity(PEEK_READ);
        let mut total = 0usize;
        while total < LINGER_DRAIN {
            buf.clear();
            match read_some(client, &mut buf, PEEK_READ).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// What [`close_gently`] does after the end of the stream, for a stream that is not a bare socket (a
/// terminated TLS connection, whose end the caller has already sent): reads and discards what the client
/// still sends, for at most [`LINGER`] and [`LINGER_DRAIN`] bytes, until it ends or fails.
pub(crate) async fn discard_briefly<R: AsyncRead + Unpin>(client: &mut R) {
    let drain = async {
        let mut buf = vec![0u8; PEEK_READ];
        let mut total = 0usize;
        while total < LINGER_DRAIN {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_name_the_configured_allowlist_or_none() {
        let session = Refusals::new(Some("/home/me/.config/agent-sandbox/allowed-hosts".into()));
        let body = session.policy_body(Status::Forbidden, "evil.test", "not on the allowlist");
        assert!(
            body.contains("evil.test is not on the sandbox allowlist"),
            "{body}"
        );
        assert!(
            body.contains("add it to /home/me/.config/agent-sandbox/allowed-hosts ("),
            "{body}"
        );
        let bad = session.bad_request_body("", "CONNECT");
        assert!(bad.contains("(host (none))"), "{bad}");
        assert!(
            bad.contains("on its allowlist (/home/me/.config/agent-sandbox/allowed-hosts) only"),
            "{bad}"
        );

        let none = Refusals::new(None);
        for body in [
            none.policy_body(Status::Forbidden, "evil.test", "not on the allowlist"),
            none.bad_request_body("a.test", "x"),
        ] {
            assert!(
                !body.contains("allowed-hosts") && !body.contains('~'),
                "{body}"
            );
            assert!(body.contains("allowlist"), "{body}");
        }
        // A client at its cap, and a used-up wildcard budget: 503s that say which flag bounds them.
        assert!(
            client_cap_body(4).contains("holds 4")
                && client_cap_body(4).contains("--max-connections-per-client")
        );
        let budget = DialError::WildcardBudget {
            name: agent_sandbox_shared::HostName::parse("x.wild.test").unwrap(),
            per_minute: 7,
        };
        let (status, body) = dial_response("x.wild.test", &budget);
        assert_eq!(status, Status::ServiceUnavailable);
        assert!(
            body.contains("7 lookups") && body.contains("--wildcard-lookups-per-minute"),
            "{body}"
        );
        assert_eq!(dial_alert(&budget), AlertDescription::InternalError);
        // A 400 for a policy refusal is the malformed-request text.
        assert_eq!(
            none.policy_body(Status::BadRequest, "a", "b"),
            none.bad_request_body("a", "b")
        );
    }
}
