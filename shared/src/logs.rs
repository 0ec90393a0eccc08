//! The log contract: the events the router and the forwarder write and the launcher (its end-of-session
//! report and its readiness wait) and the tests parse.
//!
//! How it fits: the router logs through `tracing` (JSON in a session), the forwarder through its own line
//! logger; both spell event messages and field names with the constants here, and the launcher reads them
//! back with the same constants and the [`Kind`] and [`Decision`] parsers. Changing a spelling here changes
//! both sides at once.
//!
//! The events:
//! - [`LISTENING_ON`]`ADDR (proto)` (router) or [`LISTENING_ON`]`ADDR to=TARGET` (forwarder): one per
//!   listener, once everything is bound and set up. The launcher starts the sandbox on these lines.
//! - [`REFUSED`]: with [`KIND`], [`NAME`], [`REASON`], [`CLIENT`] and [`COUNT`]: how many refusals the
//!   line stands for (absent = 1). The router logs the first refusal of a (kind, client address, name,
//!   reason) at once and folds repeats within a few seconds into one later line with their count, so
//!   readers that count refusals must sum [`COUNT`].
//! - [`CONNECTION`]: one when a TCP connection ends, however it ends, with [`CLIENT`], [`LISTENER`],
//!   [`NAME`], [`DECISION`], [`REASON`] (empty unless refused or failed), [`UPSTREAM`], [`BYTES_UP`],
//!   [`BYTES_DOWN`], [`DURATION_MS`]. A connection whose TLS the router terminated to add a credential (issue 20) ends [`Decision::Terminated`] (or
//!   [`Decision::UpstreamError`]).
//! - [`REQUEST`]: one per request on a terminated connection, with [`CLIENT`], [`NAME`] and
//!   [`CREDENTIAL`] (a [`Credential`]: which credential the router put in; never its value).
//! - [`SECRET_IN_RESPONSE`]: a real secret appeared in an upstream's response on a terminated
//!   connection, which was cut at once; with [`CLIENT`] and [`NAME`] (never the value).

use std::fmt;
use std::str::FromStr;

/// The prefix of the readiness line logged once per listener: `listening on ADDR …`.
pub const LISTENING_ON: &str = "listening on ";
/// The message of a refusal event.
pub const REFUSED: &str = "refused";
/// The message of the event that ends every TCP connection.
pub const CONNECTION: &str = "connection";
/// The message of the event for each request on a terminated connection.
pub const REQUEST: &str = "request";
/// The message of the event for a response that carried a real secret (the connection was cut).
pub const SECRET_IN_RESPONSE: &str = "secret_in_response";

/// The JSON field that holds an event's message (tracing-subscriber's JSON format, under `fields`).
pub const MESSAGE: &str = "message";
/// The refusal's [`Kind`].
pub const KIND: &str = "kind";
/// The name the client asked for (escaped), or the decided name.
pub const NAME: &str = "name";
/// Why a request was refused; on a [`CONNECTION`] line, why the connection was refused or failed
/// (empty when it was allowed).
pub const REASON: &str = "reason";
/// The client's address.
pub const CLIENT: &str = "client";
/// How many refusals a [`REFUSED`] line stands for; absent means 1.
pub const COUNT: &str = "count";
/// The listener a connection came in on (a [`Kind`] other than DNS).
pub const LISTENER: &str = "listener";
/// How a connection ended: a [`Decision`].
pub const DECISION: &str = "decision";
/// The upstream address dialled, empty when none was.
pub const UPSTREAM: &str = "upstream";
/// Bytes relayed from the client to the upstream.
pub const BYTES_UP: &str = "bytes_up";
/// Bytes relayed from the upstream to the client.
pub const BYTES_DOWN: &str = "bytes_down";
/// The connection's lifetime in milliseconds.
pub const DURATION_MS: &str = "duration_ms";
/// Which credential the router added to a request: a [`Credential`].
pub const CREDENTIAL: &str = "credential";

/// What kind of request a refusal concerns; also the listener a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A DNS query.
    Dns,
    /// A TLS connection (SNI routing).
    Tls,
    /// An HTTP connection (Host routing).
    Http,
    /// A connection to a host:port entry's listener.
    Forward,
}

impl Kind {
    /// Every kind, in log order.
    pub const ALL: [Kind; 4] = [Kind::Dns, Kind::Tls, Kind::Http, Kind::Forward];

    /// The spelling in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Dns => "dns",
            Kind::Tls => "tls",
            Kind::Http => "http",
            Kind::Forward => "forward",
        }
    }
}

/// How a TCP connection ended, as its [`CONNECTION`] event says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decision {
    /// Still undecided when it ended: the router shut down (or the task was dropped) first.
    Cancelled,
    /// The client closed before sending anything.
    Closed,
    /// Refused (a [`REFUSED`] event says why).
    Refused,
    /// Allowed and relayed.
    Allowed,
    /// Allowed, but the upstream could not be reached or misbehaved.
    UpstreamError,
    /// Allowed, and its TLS terminated by the router to add a credential (issue 20).
    Terminated,
}

impl Decision {
    /// Every decision.
    pub const ALL: [Decision; 6] = [
        Decision::Cancelled,
        Decision::Closed,
        Decision::Refused,
        Decision::Allowed,
        Decision::UpstreamError,
        Decision::Terminated,
    ];

    /// The spelling in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Cancelled => "cancelled",
            Decision::Closed => "closed",
            Decision::Refused => "refused",
            Decision::Allowed => "allowed",
            Decision::UpstreamError => "upstream-error",
            Decision::Terminated => "terminated",
        }
    }
}

/// Which credential the router put into a request on a terminated connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Credential {
    /// None: no header held a placeholder (or not on a host that gets one).
    None,
    /// The API key (`x-api-key` or `Authorization: Bearer`).
    ApiKey,
    /// An OAuth access token (`Authorization: Bearer`), or a token request's refresh token.
    OAuth,
}

impl Credential {
    /// Every credential.
    pub const ALL: [Credential; 3] = [Credential::None, Credential::ApiKey, Credential::OAuth];

    /// The spelling in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Credential::None => "none",
            Credential::ApiKey => "api_key",
            Credential::OAuth => "oauth",
        }
    }
}

/// A log value that is not one of the known spellings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}` in a log event")]
pub struct UnknownValue {
    /// Which field (`kind`, `decision`).
    pub what: &'static str,
    /// The value found.
    pub value: String,
}

macro_rules! spelled {
    ($ty:ty, $what:literal) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownValue {
                        what: $what,
                        value: s.to_owned(),
                    })
            }
        }
    };
}

spelled!(Kind, "kind");
spelled!(Decision, "decision");
spelled!(Credential, "credential");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>(), Ok(k));
            assert_eq!(k.to_string(), k.as_str());
        }
        for d in Decision::ALL {
            assert_eq!(d.as_str().parse::<Decision>(), Ok(d));
        }
        for c in Credential::ALL {
            assert_eq!(c.as_str().parse::<Credential>(), Ok(c));
        }
        assert_eq!(
            "nope".parse::<Decision>(),
            Err(UnknownValue {
                what: "decision",
                value: "nope".into()
            })
        );
    }
}
