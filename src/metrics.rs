//! Prometheus metrics, served as text at `GET /metrics`. A small registry of our own:
//! counters and histograms keyed by their label values, atomics on the hot path.

use crate::method::Method;
use dashmap::DashMap;
use foldhash::fast::RandomState;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// How a request ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    /// A JSON-RPC error answer.
    Error,
    /// A tool result with `isError: true`.
    ToolError,
    RateLimited,
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::ToolError => "tool_error",
            Outcome::RateLimited => "rate_limited",
            Outcome::Cancelled => "cancelled",
        }
    }
}

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// Labels of a request: method (its [`label`]), server ("" when the gateway answered),
/// tool (public name, "" when not a tool call), outcome.
type RequestKey = (Method, String, String, Outcome);

/// Labels of a latency histogram: method, server.
type LatencyKey = (Method, String);

/// A label set, owned (a map key) or borrowed (a lookup): the hot path finds its
/// counter without allocating the key's strings; they are built once, on first use.
trait Labels {
    fn labels(&self) -> (Method, &str, &str, Option<Outcome>);
}

impl Labels for RequestKey {
    fn labels(&self) -> (Method, &str, &str, Option<Outcome>) {
        (self.0, &self.1, &self.2, Some(self.3))
    }
}

impl Labels for LatencyKey {
    fn labels(&self) -> (Method, &str, &str, Option<Outcome>) {
        (self.0, &self.1, "", None)
    }
}

impl Labels for (Method, &str, &str, Option<Outcome>) {
    fn labels(&self) -> (Method, &str, &str, Option<Outcome>) {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn Labels + 'a> for RequestKey {
    fn borrow(&self) -> &(dyn Labels + 'a) {
        self
    }
}

impl<'a> std::borrow::Borrow<dyn Labels + 'a> for LatencyKey {
    fn borrow(&self) -> &(dyn Labels + 'a) {
        self
    }
}

// Hash and Eq of a borrowed key must agree with the owned key's: tuples hash their fields
// in order, and a trailing `Option<Outcome>` is hashed only when present.
impl std::hash::Hash for dyn Labels + '_ {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let (m, s, t, o) = self.labels();
        m.hash(h);
        s.hash(h);
        if let Some(o) = o {
            t.hash(h);
            o.hash(h);
        }
    }
}

impl PartialEq for dyn Labels + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.labels() == other.labels()
    }
}

impl Eq for dyn Labels + '_ {}

/// The gateway's metrics.
///
/// The maps hash with foldhash (seeded per process), not SipHash: recording is on every
/// request's path, and the keys are label values the gateway chose (methods are bounded
/// by [`label`]), not a peer's to flood.
#[derive(Default)]
pub struct Metrics {
    requests: DashMap<RequestKey, AtomicU64, RandomState>,
    /// Latency by (method, server).
    latency: DashMap<LatencyKey, Histogram, RandomState>,
    in_flight: AtomicI64,
    /// Rate-limited requests by the limit's description.
    rate_limited: DashMap<String, AtomicU64, RandomState>,
    /// Client connections refused at accept (`gateway.max_connections_per_address`).
    connections_refused: AtomicU64,
    /// The console's client rows.
    pub clients: crate::console::Clients,
}

/// The method a request is counted under: its own if it is a request method the gateway
/// knows, else [`Method::Other`] (a notification's name sent as a request included). A
/// client inventing method names must not grow the metrics, and the gateway's memory,
/// without end.
fn label(method: Method) -> Method {
    if method.is_request() {
        method
    } else {
        Method::Other
    }
}

/// Decrements the in-flight gauge when dropped.
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the rest of the gateway reports about itself when scraped.
pub struct Snapshot<'a> {
    pub sessions: usize,
    /// (server, transport, up, restarts)
    pub servers: Vec<(&'a str, &'static str, bool, u64)>,
}

impl Metrics {
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Counts a request and its latency. `method` is a [`Method`] or its name.
    pub fn record(&self, method: impl Into<Method>, server: &str, tool: &str, outcome: Outcome, took: Duration) {
        let method = label(method.into());
        let key = (method, server, tool, Some(outcome));
        match self.requests.get(&key as &dyn Labels) {
            Some(n) => n.fetch_add(1, Ordering::Relaxed),
            None => self
                .requests
                .entry((method, server.to_owned(), tool.to_owned(), outcome))
                .or_default()
                .fetch_add(1, Ordering::Relaxed),
        };
        let key = (method, server, "", None);
        match self.latency.get(&key as &dyn Labels) {
            Some(h) => h.observe(took),
            None => self
                .latency
                .entry((method, server.to_owned()))
                .or_default()
                .observe(took),
        }
    }

    pub fn rate_limited(&self, limit: &str) {
        self.rate_limited
            .entry(limit.to_owned())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A client connection was refused: its address had `gateway.max_connections_per_address`
    /// open already.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self, snap: &Snapshot) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP mcp_gateway_requests_total Client requests by method, server, tool and outcome.\n");
        out.push_str("# TYPE mcp_gateway_requests_total counter\n");
        for e in &self.requests {
            let (m, s, t, o) = e.key();
            let _ = writeln!(
                out,
                "mcp_gateway_requests_total{{method=\"{}\",server=\"{}\",tool=\"{}\",outcome=\"{}\"}} {}",
                m.as_str(),
                esc(s),
                esc(t),
                o.as_str(),
                e.value().load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP mcp_gateway_request_duration_seconds Client request latency by method and server.\n");
        out.push_str("# TYPE mcp_gateway_request_duration_seconds histogram\n");
        for e in &self.latency {
            let (m, s) = e.key();
            let labels = format!("method=\"{}\",server=\"{}\"", m.as_str(), esc(s));
            let h = e.value();
            let mut cumulative = 0;
            for (i, b) in BUCKETS.iter().enumerate() {
                cumulative += h.buckets[i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "mcp_gateway_request_duration_seconds_bucket{{{labels},le=\"{b}\"}} {cumulative}"
                );
            }
            let count = h.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "mcp_gateway_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {count}"
            );
            let sum = h.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "mcp_gateway_request_duration_seconds_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "mcp_gateway_request_duration_seconds_count{{{labels}}} {count}");
        }
        out.push_str("# HELP mcp_gateway_requests_in_flight Client requests being handled.\n");
        out.push_str("# TYPE mcp_gateway_requests_in_flight gauge\n");
        let _ = writeln!(
            out,
            "mcp_gateway_requests_in_flight {}",
            self.in_flight.load(Ordering::Relaxed)
        );
        out.push_str("# HELP mcp_gateway_sessions Open client sessions.\n");
        out.push_str("# TYPE mcp_gateway_sessions gauge\n");
        let _ = writeln!(out, "mcp_gateway_sessions {}", snap.sessions);
        out.push_str("# HELP mcp_gateway_downstream_up Whether a server is initialized and reachable.\n");
        out.push_str("# TYPE mcp_gateway_downstream_up gauge\n");
        for (name, transport, up, _) in &snap.servers {
            let _ = writeln!(
                out,
                "mcp_gateway_downstream_up{{server=\"{}\",transport=\"{transport}\"}} {}",
                esc(name),
                u8::from(*up)
            );
        }
        out.push_str(
            "# HELP mcp_gateway_downstream_restarts_total Start attempts after the first, failed ones included.\n",
        );
        out.push_str("# TYPE mcp_gateway_downstream_restarts_total counter\n");
        for (name, _, _, restarts) in &snap.servers {
            let _ = writeln!(
                out,
                "mcp_gateway_downstream_restarts_total{{server=\"{}\"}} {restarts}",
                esc(name)
            );
        }
        out.push_str("# HELP mcp_gateway_rate_limited_total Requests refused by a rate limit.\n");
        out.push_str("# TYPE mcp_gateway_rate_limited_total counter\n");
        for e in &self.rate_limited {
            let _ = writeln!(
                out,
                "mcp_gateway_rate_limited_total{{limit=\"{}\"}} {}",
                esc(e.key()),
                e.value().load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP mcp_gateway_connections_refused_total Client connections refused at accept: their address had gateway.max_connections_per_address open.\n",
        );
        out.push_str("# TYPE mcp_gateway_connections_refused_total counter\n");
        let _ = writeln!(
            out,
            "mcp_gateway_connections_refused_total {}",
            self.connections_refused.load(Ordering::Relaxed)
        );
        let (caught, slept) = crate::runtime::polls();
        out.push_str(
            "# HELP mcp_gateway_busy_poll_total Waits for I/O polled before sleeping (gateway.busy_poll), by whether the I/O came while polling.\n",
        );
        out.push_str("# TYPE mcp_gateway_busy_poll_total counter\n");
        let _ = writeln!(out, "mcp_gateway_busy_poll_total{{outcome=\"caught\"}} {caught}");
        let _ = writeln!(out, "mcp_gateway_busy_poll_total{{outcome=\"slept\"}} {slept}");
        out
    }
}

/// Escapes a label value.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        {
            let _g = m.in_flight();
            m.record(
                "tools/call",
                "calc",
                "calc__add",
                Outcome::Ok,
                Duration::from_micros(300),
            );
            m.record("tools/call", "calc", "calc__add", Outcome::Ok, Duration::from_millis(2));
        }
        m.rate_limited("per_client limit 1/s");
        let text = m.render(&Snapshot {
            sessions: 2,
            servers: vec![("calc", "stdio", true, 1)],
        });
        assert!(text.contains(
            "mcp_gateway_requests_total{method=\"tools/call\",server=\"calc\",tool=\"calc__add\",outcome=\"ok\"} 2"
        ));
        assert!(text.contains(
            "mcp_gateway_request_duration_seconds_bucket{method=\"tools/call\",server=\"calc\",le=\"0.0005\"} 1"
        ));
        assert!(text.contains("mcp_gateway_request_duration_seconds_count{method=\"tools/call\",server=\"calc\"} 2"));
        assert!(text.contains("mcp_gateway_requests_in_flight 0"));
        assert!(text.contains("mcp_gateway_sessions 2"));
        assert!(text.contains("mcp_gateway_downstream_up{server=\"calc\",transport=\"stdio\"} 1"));
        assert!(text.contains("mcp_gateway_rate_limited_total{limit=\"per_client limit 1/s\"} 1"));
    }

    #[test]
    fn borrowed_lookups_find_owned_keys() {
        let m = Metrics::default();
        for _ in 0..3 {
            m.record("tools/call", "a", "a__x", Outcome::Ok, Duration::from_micros(1));
            m.record("tools/call", "a", "a__x", Outcome::Error, Duration::from_micros(1));
            m.record("tools/call", "a", "", Outcome::Ok, Duration::from_micros(1));
            m.record("tools/list", "", "", Outcome::Ok, Duration::from_micros(1));
        }
        assert_eq!(m.requests.len(), 4);
        assert_eq!(m.latency.len(), 2);
        assert!(m.requests.iter().all(|e| e.value().load(Ordering::Relaxed) == 3));
        let h = m
            .latency
            .get(&(Method::ToolsCall, "a", "", None) as &dyn Labels)
            .unwrap();
        assert_eq!(h.count.load(Ordering::Relaxed), 9);
    }

    #[test]
    fn invented_methods_share_one_label() {
        let m = Metrics::default();
        for i in 0..1000 {
            m.record(
                format!("made/up{i}").as_str(),
                "",
                "",
                Outcome::Error,
                Duration::from_micros(1),
            );
        }
        // A notification's name sent as a request is no request method: `other` too.
        m.record(
            "notifications/cancelled",
            "",
            "",
            Outcome::Error,
            Duration::from_micros(1),
        );
        assert_eq!(m.requests.len(), 1);
        assert_eq!(m.latency.len(), 1);
        let text = m.render(&Snapshot {
            sessions: 0,
            servers: vec![],
        });
        assert!(
            text.contains("mcp_gateway_requests_total{method=\"other\",server=\"\",tool=\"\",outcome=\"error\"} 1001")
        );
        // A known method is its own label, given by name or as a Method.
        m.record("tools/call", "", "", Outcome::Ok, Duration::from_micros(1));
        m.record(Method::ToolsCall, "", "", Outcome::Ok, Duration::from_micros(1));
        assert_eq!(m.requests.len(), 2);
    }
}
