//! The router's metrics: fixed arrays of atomic counters, and their Prometheus text exposition.
//!
//! How it fits: one [`Metrics`] is shared (behind an `Arc`) by every worker runtime, the reload task and
//! the admin endpoint ([`crate::admin`]). The hot paths (a DNS query, a connection's decision, its bytes,
//! its upstream connect time) do one relaxed atomic add into an array slot chosen by an enum: no lock, no
//! map lookup, no allocation. The text is built only when someone scrapes `/metrics`.
//!
//! Every label value comes from a closed enum in this module, never from a name or an address a client
//! chose: a client that sends a million distinct names must not create a million series (that would be a
//! memory denial of service on the router and on the Prometheus server scraping it). Refused names go to
//! the log instead. The number of series is therefore a constant ([`Metrics::series_count`]).
//!
//! `/metrics` also carries the standard `process_*` families ([`process`]): read from `/proc` at each
//! scrape, on tokio's blocking pool, and appended after these.
//!
//! The encoder is hand-written (text format 0.0.4) rather than `prometheus-client`: that crate's label
//! families are hash maps behind a lock, which the hot path must not touch, and the few hundred lines of
//! encoding here cost the static binary far less than the crate would.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub mod process;

/// Prefix of every metric family name (the standard `process_*` families of [`process`] aside).
const PREFIX: &str = "agent_sandbox_router_";

/// Upper bounds of the upstream connect histogram's buckets, in nanoseconds and as the `le` label
/// (seconds); `+Inf` is implied. From 1 ms (a peer on the same network) to 5 s. Integers throughout,
/// so observing and encoding need no floating point (and the binary no float formatting code).
pub const CONNECT_BUCKETS: [(u64, &str); 12] = [
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
    (2_500_000_000, "2.5"),
    (5_000_000_000, "5"),
];

/// Declares a closed label enum: its variants, their label values, and `ALL` in index order.
macro_rules! label_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in index order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];
            /// How many values there are: the length of the counter array it indexes.
            pub const COUNT: usize = $name::ALL.len();

            /// The label value written in the exposition.
            #[must_use]
            pub const fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }

            /// The array slot of this value.
            const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

label_enum! {
    /// How the DNS server answered a query (`dns_queries_total{result}`).
    DnsResult {
        /// An allowlisted name: an address, or NOERROR with no records for other types.
        Answered => "answered",
        /// A name not on the allowlist: NXDOMAIN.
        Refused => "refused",
        /// Malformed, not a query, or not class IN.
        Rejected => "rejected",
    }
}

label_enum! {
    /// The kind of listener a connection arrived on (`listener` label). All host:port entries share
    /// `forward`: their names come from the operator, but a reload can add and remove them, and the
    /// series count must not depend on the allowlist.
    Listener {
        /// DNS over TCP.
        DnsTcp => "dns_tcp",
        /// Plain HTTP, routed by Host.
        Http => "http",
        /// TLS, routed by SNI.
        Https => "https",
        /// A host:port entry's own listener.
        Forward => "forward",
    }
}

impl Listener {
    /// The listener kind a connection log's `listener` field names.
    #[must_use]
    pub const fn of(kind: agent_sandbox_shared::logs::Kind) -> Listener {
        use agent_sandbox_shared::logs::Kind;
        match kind {
            Kind::Dns => Listener::DnsTcp,
            Kind::Http => Listener::Http,
            Kind::Tls => Listener::Https,
            Kind::Forward => Listener::Forward,
        }
    }
}

label_enum! {
    /// What became of a new connection (`connections_total{decision}`).
    Decision {
        /// The policy allowed it and the upstream connection was made.
        Allowed => "allowed",
        /// The policy (or a limit) refused it.
        Refused => "refused",
        /// Allowed, but it could not be served: the upstream did not resolve or connect, or the client
        /// sent something unparsable or nothing in time.
        Failed => "failed",
    }
}

label_enum! {
    /// Why a connection was refused (`refusals_total{reason}`), for the operator deciding what to change.
    RefusalReason {
        /// The name is not on the allowlist.
        NotAllowed => "not_allowed",
        /// The name resolved to an address the router never dials (loopback, link-local, metadata, ...).
        RefusedAddress => "refused_address",
        /// The client was at `--max-connections-per-client`.
        PerClientLimit => "per_client_limit",
        /// The router was at `--max-connections`.
        ConnectionLimit => "connection_limit",
        /// The client was past `--wildcard-lookups-per-minute`.
        WildcardLookupLimit => "wildcard_lookup_limit",
        /// A TLS ClientHello the router will not route: no SNI, ECH, a second hello that differs.
        BadHello => "bad_hello",
        /// An HTTP request head the router will not route: malformed, no or several Hosts, h2c, ...
        BadRequest => "bad_request",
        /// A ClientHello or request head larger than usual while the memory all connections share for
        /// those was in use ([`PEEK_BUDGET`](crate::fairness::PEEK_BUDGET)).
        PeekMemory => "peek_memory",
        /// The router is draining after SIGTERM.
        Draining => "draining",
    }
}

label_enum! {
    /// Why a relay or a waiting connection was closed by the router rather than by a peer
    /// (`connections_closed_total{reason}`).
    CloseReason {
        /// No byte in either direction for `--idle-timeout` (or a kept-alive HTTP connection idle as long).
        IdleTimeout => "idle_timeout",
        /// The client did not send its ClientHello, request head or DNS query within the peek timeout.
        ClientTimeout => "client_timeout",
        /// The drain period after SIGTERM ended with the relay still open.
        DrainDeadline => "drain_deadline",
    }
}

label_enum! {
    /// Direction of relayed bytes (`bytes_total{direction}`).
    Direction {
        /// From the client towards the upstream.
        Upstream => "upstream",
        /// From the upstream back to the client.
        Downstream => "downstream",
    }
}

label_enum! {
    /// The credential the router put into a request on a terminated connection
    /// (`injected_requests_total{credential}`).
    Injected {
        /// The API key.
        ApiKey => "api_key",
        /// An OAuth token.
        OAuth => "oauth",
    }
}

label_enum! {
    /// Outcome of a policy reload (`config_reloads_total{result}`).
    ReloadResult {
        /// The new policy was applied whole.
        Success => "success",
        /// The old policy stays: the file was invalid or a listener could not be bound.
        Failure => "failure",
    }
}

/// Keeps groups of counters that different workers update on separate cache lines, so a DNS query on one
/// core does not invalidate the line another core is counting a connection on.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Padded<T>(T);

/// A histogram with fixed buckets: one counter per bucket (not cumulative; summed on scrape), so an
/// observation is one add into its bucket plus one into the sum.
#[derive(Debug)]
struct Histogram {
    /// Observations per bucket of [`CONNECT_BUCKETS`]; the last slot is above the highest bound.
    buckets: [AtomicU64; CONNECT_BUCKETS.len() + 1],
    /// Sum of the observations in nanoseconds (an integer, so it can be an atomic add).
    sum_nanos: AtomicU64,
}

impl Histogram {
    /// An empty histogram.
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    fn observe(&self, value: Duration) {
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        let slot = CONNECT_BUCKETS
            .iter()
            .position(|&(bound, _)| nanos <= bound)
            .unwrap_or(CONNECT_BUCKETS.len());
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Builds an array of zeroed counters.
fn zeroed<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

/// Every metric the router keeps. Create one with [`Metrics::new`], share it as `Arc<Metrics>`.
#[derive(Debug)]
pub struct Metrics {
    /// DNS queries by result.
    dns_queries: Padded<[AtomicU64; DnsResult::COUNT]>,
    /// New connections by listener and decision.
    connections: Padded<[[AtomicU64; Decision::COUNT]; Listener::COUNT]>,
    /// Connections being handled now, by listener. Signed: an increment and its decrement may land in
    /// either order as seen by a scrape, which must never see a wrapped-around huge number.
    open: Padded<[AtomicI64; Listener::COUNT]>,
    /// Refusals by reason.
    refusals: Padded<[AtomicU64; RefusalReason::COUNT]>,
    /// Router-initiated closes by reason.
    closes: Padded<[AtomicU64; CloseReason::COUNT]>,
    /// Relayed bytes by direction.
    bytes: Padded<[AtomicU64; Direction::COUNT]>,
    /// Time to connect to an upstream.
    upstream_connect: Padded<Histogram>,
    /// TLS connections the router terminated to add a credential (issue 20).
    terminated: AtomicU64,
    /// Requests on terminated connections that got a credential, by which.
    injected: [AtomicU64; Injected::COUNT],
    /// Reloads by result.
    reloads: [AtomicU64; ReloadResult::COUNT],
    /// Unix time in milliseconds of the last successful load (start-up or reload); 0 before any.
    last_reload_success_ms: AtomicU64,
    /// Entries in the policy in force.
    allowlist_entries: AtomicU64,
    /// Lookups of names under wildcard entries that spent a unit of a client's budget (resolver cache
    /// misses). Not exposed (the refusals past the budget are); summed up in the log at exit.
    wildcard_lookups: AtomicU64,
    /// Unix time in milliseconds when this `Metrics` was created (process start, for uptime graphs).
    start_ms: u64,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// Milliseconds since the Unix epoch now (0 if the clock is before it).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Metrics {
    /// All counters at zero, the start time now.
    #[must_use]
    pub fn new() -> Metrics {
        Metrics {
            dns_queries: Padded(zeroed()),
            connections: Padded(std::array::from_fn(|_| zeroed())),
            open: Padded(std::array::from_fn(|_| AtomicI64::new(0))),
            refusals: Padded(zeroed()),
            closes: Padded(zeroed()),
            bytes: Padded(zeroed()),
            upstream_connect: Padded(Histogram::new()),
            terminated: AtomicU64::new(0),
            injected: zeroed(),
            reloads: zeroed(),
            last_reload_success_ms: AtomicU64::new(0),
            allowlist_entries: AtomicU64::new(0),
            wildcard_lookups: AtomicU64::new(0),
            start_ms: now_ms(),
        }
    }

    /// Counts one DNS query by how it was answered.
    pub fn dns_query(&self, result: DnsResult) {
        self.dns_queries.0[result.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a new connection's decision. A refusal also wants [`Metrics::refusal`] with its reason.
    pub fn connection(&self, listener: Listener, decision: Decision) {
        self.connections.0[listener.index()][decision.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal by its reason (in addition to the connection's decision).
    pub fn refusal(&self, reason: RefusalReason) {
        self.refusals.0[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection the router closed, by why.
    pub fn closed(&self, reason: CloseReason) {
        self.closes.0[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `count` connections the router closed at once, by why (the end of a drain).
    pub fn closed_many(&self, reason: CloseReason, count: u64) {
        self.closes.0[reason.index()].fetch_add(count, Ordering::Relaxed);
    }

    /// Counts relayed bytes. Call it per read, or once per direction when the relay ends.
    pub fn bytes(&self, direction: Direction, count: u64) {
        self.bytes.0[direction.index()].fetch_add(count, Ordering::Relaxed);
    }

    /// Records how long a successful upstream connect took.
    pub fn upstream_connect(&self, took: Duration) {
        self.upstream_connect.0.observe(took);
    }

    /// Counts a TLS connection the router terminated (its handshake with the client completed).
    pub fn terminated(&self) {
        self.terminated.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request that got `credential` on a terminated connection.
    pub fn injected(&self, credential: Injected) {
        self.injected[credential.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Terminated connections so far.
    #[must_use]
    pub fn terminated_connections(&self) -> u64 {
        self.terminated.load(Ordering::Relaxed)
    }

    /// Requests that got `credential` so far.
    #[must_use]
    pub fn injected_requests(&self, credential: Injected) -> u64 {
        self.injected[credential.index()].load(Ordering::Relaxed)
    }

    /// Counts a lookup under a wildcard entry that spent a unit of its client's budget.
    pub fn wildcard_lookup(&self) {
        self.wildcard_lookups.fetch_add(1, Ordering::Relaxed);
    }

    /// DNS queries so far with `result`.
    #[must_use]
    pub fn dns_queries(&self, result: DnsResult) -> u64 {
        self.dns_queries.0[result.index()].load(Ordering::Relaxed)
    }

    /// Refusals so far for `reason`.
    #[must_use]
    pub fn refusals(&self, reason: RefusalReason) -> u64 {
        self.refusals.0[reason.index()].load(Ordering::Relaxed)
    }

    /// Router-initiated closes so far for `reason`.
    #[must_use]
    pub fn closes(&self, reason: CloseReason) -> u64 {
        self.closes.0[reason.index()].load(Ordering::Relaxed)
    }

    /// Wildcard lookups that spent budget so far (see [`Metrics::wildcard_lookup`]).
    #[must_use]
    pub fn wildcard_lookups(&self) -> u64 {
        self.wildcard_lookups.load(Ordering::Relaxed)
    }

    /// Counts a connection as open on `listener` until the returned guard is dropped, so every path out
    /// of a connection's task (return, error, panic, cancellation) decrements it.
    #[must_use = "the connection counts as open only while the guard lives"]
    pub fn open(self: &Arc<Self>, listener: Listener) -> OpenGuard {
        self.open.0[listener.index()].fetch_add(1, Ordering::Relaxed);
        OpenGuard {
            metrics: Arc::clone(self),
            listener,
        }
    }

    /// Records the policy loaded at start-up: sets the entry count and the last-success time, without
    /// counting a reload.
    pub fn policy_loaded(&self, entries: usize) {
        self.allowlist_entries.store(
            u64::try_from(entries).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.last_reload_success_ms
            .store(now_ms(), Ordering::Relaxed);
    }

    /// Counts a successful reload that put `entries` entries in force.
    pub fn reload_succeeded(&self, entries: usize) {
        self.policy_loaded(entries);
        self.reloads[ReloadResult::Success.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed reload (the old policy, its entry count and its timestamp stay).
    pub fn reload_failed(&self) {
        self.reloads[ReloadResult::Failure.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// How many samples (lines that are not comments) the exposition has. A constant: it depends only
    /// on the label enums, never on traffic or on the policy.
    #[must_use]
    pub const fn series_count() -> usize {
        DnsResult::COUNT
            + Listener::COUNT * Decision::COUNT
            + Listener::COUNT
            + RefusalReason::COUNT
            + CloseReason::COUNT
            + Direction::COUNT
            + (CONNECT_BUCKETS.len() + 1 + 2)
            + 1 // terminated connections
            + Injected::COUNT
            + ReloadResult::COUNT
            + 1 // last reload success timestamp
            + 1 // allowlist entries
            + 1 // build info
            + 1 // start time
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric, as served on `/metrics`.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = Encoder(String::with_capacity(8 * 1024));
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);

        out.family(
            "dns_queries_total",
            "DNS queries received, by how they were answered.",
            "counter",
        );
        for &r in DnsResult::ALL {
            out.sample_u64(
                "dns_queries_total",
                &[("result", r.label())],
                load(&self.dns_queries.0[r.index()]),
            );
        }

        out.family(
            "connections_total",
            "New TCP connections (TLS, HTTP, host:port forwards, DNS over TCP), by listener and decision.",
            "counter",
        );
        for &l in Listener::ALL {
            for &d in Decision::ALL {
                out.sample_u64(
                    "connections_total",
                    &[("listener", l.label()), ("decision", d.label())],
                    load(&self.connections.0[l.index()][d.index()]),
                );
            }
        }

        out.family(
            "connections_open",
            "Connections being handled now, by listener.",
            "gauge",
        );
        for &l in Listener::ALL {
            let n = self.open.0[l.index()].load(Ordering::Relaxed).max(0);
            out.sample_u64(
                "connections_open",
                &[("listener", l.label())],
                n.unsigned_abs(),
            );
        }

        out.family(
            "refusals_total",
            "Connections refused, by reason (the names refused are in the log, never in labels).",
            "counter",
        );
        for &r in RefusalReason::ALL {
            out.sample_u64(
                "refusals_total",
                &[("reason", r.label())],
                load(&self.refusals.0[r.index()]),
            );
        }

        out.family(
            "connections_closed_total",
            "Connections the router closed itself, by reason.",
            "counter",
        );
        for &r in CloseReason::ALL {
            out.sample_u64(
                "connections_closed_total",
                &[("reason", r.label())],
                load(&self.closes.0[r.index()]),
            );
        }

        out.family(
            "bytes_total",
            "Bytes relayed between clients and upstreams, by direction.",
            "counter",
        );
        for &d in Direction::ALL {
            out.sample_u64(
                "bytes_total",
                &[("direction", d.label())],
                load(&self.bytes.0[d.index()]),
            );
        }

        self.render_histogram(&mut out);

        out.family(
            "terminated_connections_total",
            "TLS connections the router terminated to add a credential (the rest are spliced).",
            "counter",
        );
        out.sample_u64("terminated_connections_total", &[], load(&self.terminated));

        out.family(
            "injected_requests_total",
            "Requests on terminated connections that got a credential, by credential.",
            "counter",
        );
        for &c in Injected::ALL {
            out.sample_u64(
                "injected_requests_total",
                &[("credential", c.label())],
                load(&self.injected[c.index()]),
            );
        }

        out.family(
            "config_reloads_total",
            "Policy reloads (SIGHUP or a changed allowlist file), by result.",
            "counter",
        );
        for &r in ReloadResult::ALL {
            out.sample_u64(
                "config_reloads_total",
                &[("result", r.label())],
                load(&self.reloads[r.index()]),
            );
        }

        out.family(
            "config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful policy load (start-up or reload).",
            "gauge",
        );
        out.sample_decimal(
            "config_last_reload_success_timestamp_seconds",
            load(&self.last_reload_success_ms),
            1_000,
        );

        out.family(
            "allowlist_entries",
            "Entries in the policy in force.",
            "gauge",
        );
        out.sample_u64("allowlist_entries", &[], load(&self.allowlist_entries));

        out.family(
            "build_info",
            "Always 1; the label carries the router's version.",
            "gauge",
        );
        out.sample_u64("build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);

        out.family(
            "start_time_seconds",
            "Unix time when the router started.",
            "gauge",
        );
        out.sample_decimal("start_time_seconds", self.start_ms, 1_000);

        out.0
    }

    /// The upstream connect histogram: cumulative buckets, `+Inf` equal to `_count`, then `_sum`.
    fn render_histogram(&self, out: &mut Encoder) {
        const NAME: &str = "upstream_connect_seconds";
        let h = &self.upstream_connect.0;
        out.family(
            NAME,
            "Time to connect to an upstream, successful connects only.",
            "histogram",
        );
        // One snapshot of the buckets, so the cumulative counts and `_count` agree with each other even
        // while workers keep observing.
        let counts: Vec<u64> = h
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let mut cumulative = 0u64;
        let bucket_name = format!("{NAME}_bucket");
        for ((_, le), count) in CONNECT_BUCKETS.iter().zip(&counts) {
            cumulative = cumulative.saturating_add(*count);
            out.sample_u64(&bucket_name, &[("le", le)], cumulative);
        }
        cumulative = cumulative.saturating_add(counts[CONNECT_BUCKETS.len()]);
        out.sample_u64(&bucket_name, &[("le", "+Inf")], cumulative);
        out.sample_decimal(
            &format!("{NAME}_sum"),
            h.sum_nanos.load(Ordering::Relaxed),
            1_000_000_000,
        );
        out.sample_u64(&format!("{NAME}_count"), &[], cumulative);
    }
}

/// `value / scale` as an exact decimal (`scale` a power of ten), trailing zeros dropped: `1500, 1000`
/// is `1.5`, `2000, 1000` is `2`.
fn decimal(value: u64, scale: u64) -> String {
    let whole = value / scale;
    let frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = scale.ilog10() as usize;
    let frac = format!("{frac:0digits$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// Decrements a listener's open-connection gauge when dropped (see [`Metrics::open`]).
#[derive(Debug)]
pub struct OpenGuard {
    /// The metrics the increment went to.
    metrics: Arc<Metrics>,
    /// The listener whose gauge to decrement.
    listener: Listener,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.metrics.open.0[self.listener.index()].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Writes the text format: `# HELP`, `# TYPE`, and samples with escaped label values.
struct Encoder(String);

impl Encoder {
    /// The HELP and TYPE lines of a family (name without the common prefix).
    fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.0, "# HELP {PREFIX}{name} {}", escape_help(help));
        let _ = writeln!(self.0, "# TYPE {PREFIX}{name} {kind}");
    }

    /// The start of a sample line: name and labels.
    fn head(&mut self, name: &str, labels: &[(&str, &str)]) {
        let _ = write!(self.0, "{PREFIX}{name}");
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (key, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{key}=\"{}\"", escape_label(value));
            }
            self.0.push('}');
        }
    }

    /// A sample with an integer value.
    fn sample_u64(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.head(name, labels);
        let _ = writeln!(self.0, " {value}");
    }

    /// A sample without labels whose value is `value / scale` (see [`decimal`]).
    fn sample_decimal(&mut self, name: &str, value: u64, scale: u64) {
        self.head(name, &[]);
        let _ = writeln!(self.0, " {}", decimal(value, scale));
    }
}

/// HELP text escaping: backslash and line feed.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Label value escaping: backslash, double quote and line feed.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_follows_the_text_format() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        assert_eq!(escape_help("a\\b\"c\nd"), "a\\\\b\"c\\nd");
        assert_eq!(decimal(0, 1_000), "0");
        assert_eq!(decimal(1_500, 1_000), "1.5");
        assert_eq!(decimal(2_000, 1_000), "2");
        assert_eq!(decimal(1_764_497_000_007, 1_000), "1764497000.007");
        assert_eq!(decimal(60_031_500_000, 1_000_000_000), "60.0315");
        assert_eq!(decimal(u64::MAX, 1_000_000_000), "18446744073.709551615");
        for (nanos, label) in CONNECT_BUCKETS {
            assert_eq!(decimal(nanos, 1_000_000_000), label);
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_inf_equals_count() {
        let m = Metrics::new();
        m.upstream_connect(Duration::from_micros(500)); // first bucket
        m.upstream_connect(Duration::from_millis(1)); // on the bound: still the first bucket (le)
        m.upstream_connect(Duration::from_millis(30)); // 0.05
        m.upstream_connect(Duration::from_secs(60)); // above every bound
        let text = m.render();
        let value = |series: &str| -> String {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        };
        let b = "agent_sandbox_router_upstream_connect_seconds_bucket";
        assert_eq!(value(&format!("{b}{{le=\"0.001\"}}")), "2");
        assert_eq!(value(&format!("{b}{{le=\"0.025\"}}")), "2");
        assert_eq!(value(&format!("{b}{{le=\"0.05\"}}")), "3");
        assert_eq!(value(&format!("{b}{{le=\"5\"}}")), "3");
        assert_eq!(value(&format!("{b}{{le=\"+Inf\"}}")), "4");
        assert_eq!(
            value("agent_sandbox_router_upstream_connect_seconds_count"),
            "4"
        );
        assert_eq!(
            value("agent_sandbox_router_upstream_connect_seconds_sum"),
            "60.0315"
        );
    }

    #[test]
    fn open_gauge_follows_guards() {
        let m = Arc::new(Metrics::new());
        let a = m.open(Listener::Https);
        let b = m.open(Listener::Https);
        let c = m.open(Listener::Forward);
        assert!(m
            .render()
            .contains("agent_sandbox_router_connections_open{listener=\"https\"} 2\n"));
        drop((a, b, c));
        assert!(m
            .render()
            .contains("agent_sandbox_router_connections_open{listener=\"https\"} 0\n"));
    }

    #[test]
    fn reload_failure_keeps_the_last_success() {
        let m = Metrics::new();
        m.policy_loaded(7);
        let stamp = m.last_reload_success_ms.load(Ordering::Relaxed);
        assert!(stamp > 0);
        m.reload_failed();
        assert_eq!(m.last_reload_success_ms.load(Ordering::Relaxed), stamp);
        let text = m.render();
        assert!(text.contains("agent_sandbox_router_allowlist_entries 7\n"));
        assert!(text.contains("agent_sandbox_router_config_reloads_total{result=\"failure\"} 1\n"));
        assert!(text.contains("agent_sandbox_router_config_reloads_total{result=\"success\"} 0\n"));
        m.reload_succeeded(9);
        let text = m.render();
        assert!(text.contains("agent_sandbox_router_allowlist_entries 9\n"));
        assert!(text.contains("agent_sandbox_router_config_reloads_total{result=\"success\"} 1\n"));
    }
}
