//! What the operator's console (`/`, `/status*`) shows beyond the state the gateway keeps
//! anyway: per-server rings of one-second buckets over 15 minutes ([`Series`]), per-client
//! rows ([`ClientStats`]), and the last events ([`Events`]).
//!
//! A leaf, like `metrics`: anyone may record here. The call path only adds to atomics in
//! memory allocated when a server or client is first seen; nothing is allocated per
//! call, nothing is locked (errors and rate limits, which build a message anyway, take a
//! short lock for a client's last error and the events ring).
//!
//! The buckets are approximate at a second's turn: the first call of a new second resets
//! the bucket it reuses, and an add racing that reset may be lost. The console shows
//! trends, not an audit; `/metrics` keeps the exact counters.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Seconds a server's ring covers: 15 minutes.
pub const SECONDS: u64 = 900;
/// Seconds per point of the charts `/status` gives (90 points over 15 minutes).
pub const STEP: u64 = 10;
/// Latency buckets: bucket `i` counts calls of [2^(i-1), 2^i) µs (0: under 1 µs), the
/// last one everything from about 4 s up.
const LATENCY_BUCKETS: usize = 24;
/// Events kept: this many of the operator's (reloads, servers down, errors...), and as
/// many again of the routine ones (sessions opened and ended), in a ring of their own so
/// that no number of sessions pushes the others out.
pub const EVENTS: usize = 200;
/// The kinds of [`Events::routine`].
const ROUTINE: [&str; 2] = ["session_opened", "session_ended"];
/// Characters kept of what a peer said (a server's error message, a tool's name) where
/// the console records it, as of a stderr line (the rest is cut, and marked so).
pub const PEER_TEXT: usize = 300;
/// Characters kept of any text the console records (an event's, a last error): a
/// server's reason with its stderr tail fits.
pub const TEXT: usize = 2048;
/// Client rows kept at most (past it, new callers share one row).
const CLIENTS: usize = 1024;
/// Events of one burst (the same key) this close together are one event, counted.
const BURST: Duration = Duration::from_secs(10);
/// Seconds `callsPerSecond` averages over.
const RATE_WINDOW: u64 = 10;

static START: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Seconds since the process started, from 1 (a bucket stamped 0 was never used).
fn now_sec() -> u64 {
    second(Instant::now())
}

/// [`now_sec`] at `at`: the call path passes the instant it read anyway, and reads no
/// clock; it computes this once per call for the server's ring and the client's row.
pub fn second(at: Instant) -> u64 {
    at.saturating_duration_since(*START).as_secs() + 1
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `text` cut to its first `max` characters (on a char boundary), marked as cut, so a
/// peer's megabytes never reach an event, a last error or `/status`.
pub fn clip(mut text: String, max: usize) -> String {
    if let Some((at, _)) = text.char_indices().nth(max) {
        let cut = text.len() - at;
        text.truncate(at);
        text.push_str(&format!("… ({cut} more bytes cut)"));
    }
    text
}

/// [`clip`] of a borrowed text.
pub fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}… ({} more bytes cut)", &text[..at], text.len() - at),
        None => text.to_owned(),
    }
}

fn latency_bucket(took: Duration) -> usize {
    // In u64 (`as_micros` is u128): past 584 000 years it saturates.
    let us = took
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(took.subsec_micros()));
    let i = (u64::BITS - us.leading_zeros()) as usize;
    i.min(LATENCY_BUCKETS - 1)
}

/// A bucket's representative latency in milliseconds: the middle of its range.
fn bucket_ms(i: usize) -> f64 {
    if i == 0 {
        0.0005
    } else {
        // [2^(i-1), 2^i) µs: its middle is 1.5 × 2^(i-1).
        1.5 * f64::from(1u32 << (i - 1)) / 1000.0
    }
}

#[derive(Default)]
struct Bucket {
    /// The second (see [`now_sec`]) it holds.
    sec: AtomicU64,
    errors: AtomicU32,
    /// Calls by latency (their sum: the second's calls).
    latency: [AtomicU32; LATENCY_BUCKETS],
}

impl Bucket {
    fn clear(&self) {
        self.errors.store(0, Ordering::Relaxed);
        for l in &self.latency {
            l.store(0, Ordering::Relaxed);
        }
    }
}

/// One server's last 15 minutes: calls, errors and latency per second, in a ring of
/// fixed size (about 100 KiB) allocated once.
pub struct Series {
    buckets: Box<[Bucket]>,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            buckets: (0..SECONDS).map(|_| Bucket::default()).collect(),
        }
    }
}

/// What [`Series::summary`] reads.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Summary {
    /// Over the whole window.
    pub calls: u64,
    pub errors: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Over the last [`RATE_WINDOW`] whole seconds.
    pub calls_per_second: f64,
    /// One point per [`STEP`] seconds, oldest first, the last one the current.
    pub calls_series: Vec<u64>,
    pub errors_series: Vec<u64>,
    pub p50_series: Vec<Option<f64>>,
    pub p99_series: Vec<Option<f64>>,
}

fn percentile(h: &[u64; LATENCY_BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return None;
    }
    // The rank of the q-quantile, 1-based: at least the first call.
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in h.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bucket_ms(i));
        }
    }
    None
}

impl Series {
    /// Counts one call: a few atomic adds (and, for the first call of a second, the
    /// reset of the bucket it reuses).
    /// `sec`: the [`second`] the call ended in.
    pub fn record(&self, sec: u64, error: bool, took: Duration) {
        self.record_at(sec, error, took);
    }

    fn record_at(&self, now: u64, error: bool, took: Duration) {
        let Some(b) = self.buckets.get((now % SECONDS) as usize) else {
            return;
        };
        let seen = b.sec.load(Ordering::Acquire);
        if seen != now
            && b.sec
                .compare_exchange(seen, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            b.clear();
        }
        if error {
            b.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(l) = b.latency.get(latency_bucket(took)) {
            l.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn summary(&self) -> Summary {
        self.summary_at(now_sec())
    }

    fn summary_at(&self, now: u64) -> Summary {
        let points = (SECONDS / STEP) as usize;
        let mut out = Summary {
            calls_series: vec![0; points],
            errors_series: vec![0; points],
            p50_series: vec![None; points],
            p99_series: vec![None; points],
            ..Summary::default()
        };
        let mut all = [0u64; LATENCY_BUCKETS];
        let mut point = [0u64; LATENCY_BUCKETS];
        let mut recent = 0u64;
        // Oldest second first: `now - SECONDS + 1 ..= now` (before the start: none).
        for k in 0..SECONDS as usize {
            let p = k / STEP as usize;
            let sec = (now + 1 + k as u64).saturating_sub(SECONDS);
            if let Some(b) = self.buckets.get((sec % SECONDS) as usize).filter(|_| sec > 0) {
                if b.sec.load(Ordering::Acquire) == sec {
                    let calls: u64 = b.latency.iter().map(|l| u64::from(l.load(Ordering::Relaxed))).sum();
                    let errors = u64::from(b.errors.load(Ordering::Relaxed));
                    out.calls += calls;
                    out.errors += errors;
                    out.calls_series[p] += calls;
                    out.errors_series[p] += errors;
                    if sec < now && sec + RATE_WINDOW >= now {
                        recent += calls;
                    }
                    for (i, l) in b.latency.iter().enumerate() {
                        let n = u64::from(l.load(Ordering::Relaxed));
                        all[i] += n;
                        point[i] += n;
                    }
                }
            }
            if (k + 1) % STEP as usize == 0 {
                out.p50_series[p] = percentile(&point, 0.5);
                out.p99_series[p] = percentile(&point, 0.99);
                point = [0; LATENCY_BUCKETS];
            }
        }
        out.p50_ms = percentile(&all, 0.5);
        out.p99_ms = percentile(&all, 0.99);
        out.calls_per_second = recent as f64 / RATE_WINDOW as f64;
        out
    }
}

/// One client's row: an identity's name (`client 'NAME'`), or with no auth an address.
pub struct ClientStats {
    pub key: Arc<str>,
    calls: AtomicU64,
    errors: AtomicU64,
    /// The reader's samples of `calls` (when, how many), for calls/s: the call path only
    /// adds to `calls`.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    /// By the limit's description: how many requests it refused.
    limited: Mutex<Vec<(String, u64)>>,
    /// When (Unix ms) and what.
    last_error: Mutex<Option<(u64, String)>>,
}

/// What a client row says, read.
#[derive(Debug, Clone)]
pub struct ClientRow {
    pub key: Arc<str>,
    pub calls: u64,
    pub errors: u64,
    pub calls_per_second: f64,
    pub limited: Vec<(String, u64)>,
    pub last_error: Option<(u64, String)>,
}

impl ClientStats {
    fn new(key: Arc<str>) -> ClientStats {
        ClientStats {
            key,
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            // Its start counts as a sample: the first read already has a rate.
            samples: Mutex::new(VecDeque::from([(Instant::now(), 0)])),
            limited: Mutex::new(Vec::new()),
            last_error: Mutex::new(None),
        }
    }

    /// Counts a call: one atomic add.
    pub fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// A call that failed, and why (cut to [`TEXT`] characters).
    pub fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let what = clip(what, TEXT);
        *crate::sync::lock(&self.last_error) = Some((unix_ms(), what));
    }

    /// A request a rate limit refused.
    pub fn limited(&self, limit: &str) {
        let mut l = crate::sync::lock(&self.limited);
        let len = l.len();
        match l.iter_mut().find(|(w, _)| w == limit) {
            Some((_, n)) => *n += 1,
            // A client is refused by its few configured limits: the list stays short.
            None if len < 16 => l.push((limit.to_owned(), 1)),
            None => {}
        }
    }

    /// Its row. Calls/s: the calls since the oldest sample of the last
    /// [`RATE_WINDOW`] seconds, over the time since (readers take a sample each time).
    pub fn row(&self) -> ClientRow {
        let now = Instant::now();
        let calls = self.calls.load(Ordering::Relaxed);
        let window = Duration::from_secs(RATE_WINDOW);
        let calls_per_second = {
            let mut samples = crate::sync::lock(&self.samples);
            while samples.len() > 1 && samples.get(1).is_some_and(|(t, _)| now.duration_since(*t) >= window) {
                samples.pop_front();
            }
            let rate = match samples.front() {
                Some((t, n)) if now.duration_since(*t) >= Duration::from_millis(500) => {
                    calls.saturating_sub(*n) as f64 / now.duration_since(*t).as_secs_f64()
                }
                _ => 0.0,
            };
            if samples
                .back()
                .is_none_or(|(t, _)| now.duration_since(*t) >= Duration::from_secs(1))
            {
                samples.push_back((now, calls));
            }
            // A sample a second at most, and only the window's kept: at most a dozen.
            while samples.len() > RATE_WINDOW as usize + 2 {
                samples.pop_front();
            }
            rate
        };
        ClientRow {
            key: self.key.clone(),
            calls,
            errors: self.errors.load(Ordering::Relaxed),
            calls_per_second,
            limited: crate::sync::lock(&self.limited).clone(),
            last_error: crate::sync::lock(&self.last_error).clone(),
        }
    }
}

/// Every client row, by key; looked up when a session opens, never per call.
#[derive(Default)]
pub struct Clients {
    rows: Mutex<HashMap<Arc<str>, Arc<ClientStats>>>,
}

impl Clients {
    /// The row of `key`, made on first use. Past [`CLIENTS`] rows, new keys share one.
    pub fn row(&self, key: &Arc<str>) -> Arc<ClientStats> {
        let mut rows = crate::sync::lock(&self.rows);
        if let Some(r) = rows.get(key) {
            return r.clone();
        }
        let key = if rows.len() >= CLIENTS {
            Arc::from("others (too many clients to show each)")
        } else {
            key.clone()
        };
        rows.entry(key.clone())
            .or_insert_with(|| Arc::new(ClientStats::new(key)))
            .clone()
    }

    pub fn rows(&self) -> Vec<ClientRow> {
        let rows: Vec<Arc<ClientStats>> = crate::sync::lock(&self.rows).values().cloned().collect();
        let mut out: Vec<ClientRow> = rows.iter().map(|r| r.row()).collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// One thing that happened.
#[derive(Debug, Clone)]
pub struct Event {
    /// Rising; a burst that grows gets a new one (and moves to the front).
    pub seq: u64,
    /// Unix ms of its last occurrence.
    pub at: u64,
    /// `reload`, `restart`, `down`, `crash_loop`, `list_changed`, `session_opened`,
    /// `session_ended`, `rate_limited`, `error`.
    pub kind: &'static str,
    pub server: Option<String>,
    pub text: String,
    /// How many times it happened (a coalesced burst: more than 1).
    pub count: u64,
    /// A burst's key (coalesces what has the same one).
    burst: Option<String>,
    /// When the burst last grew.
    last: Instant,
}

/// The last [`EVENTS`] events, newest first, and the last [`EVENTS`] routine ones.
#[derive(Default)]
pub struct Events {
    ring: Mutex<VecDeque<Event>>,
    /// Sessions opened and ended: any client (without auth, any address) may make them.
    routine: Mutex<VecDeque<Event>>,
    seq: AtomicU64,
}

impl Events {
    /// Adds an event.
    pub fn push(&self, kind: &'static str, server: Option<&str>, text: impl Into<String>) {
        self.add(kind, server, text.into(), None);
    }

    /// Adds an event, or counts it into the last one of the same `key` if that was less
    /// than [`BURST`] ago (a rate-limit burst, a server failing calls).
    pub fn burst(&self, kind: &'static str, key: &str, server: Option<&str>, text: impl Into<String>) {
        self.add(kind, server, text.into(), Some(key));
    }

    fn add(&self, kind: &'static str, server: Option<&str>, text: String, burst: Option<&str>) {
        let now = Instant::now();
        let text = clip(text, TEXT);
        let mut ring = crate::sync::lock(if ROUTINE.contains(&kind) {
            &self.routine
        } else {
            &self.ring
        });
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(key) = burst {
            let open = ring
                .iter()
                .position(|e| e.burst.as_deref() == Some(key) && now.duration_since(e.last) < BURST);
            if let Some(e) = open.and_then(|i| ring.remove(i)) {
                ring.push_front(Event {
                    seq,
                    at: unix_ms(),
                    count: e.count + 1,
                    text,
                    last: now,
                    ..e
                });
                return;
            }
        }
        ring.push_front(Event {
            seq,
            at: unix_ms(),
            kind,
            server: server.map(str::to_owned),
            text,
            count: 1,
            burst: burst.map(str::to_owned),
            last: now,
        });
        ring.truncate(EVENTS);
    }

    /// Events with a `seq` above `since`, newest first (both rings, merged).
    pub fn since(&self, since: u64) -> Vec<Event> {
        let newer = |ring: &Mutex<VecDeque<Event>>| -> Vec<Event> {
            crate::sync::lock(ring)
                .iter()
                .take_while(|e| e.seq > since)
                .cloned()
                .collect()
        };
        let mut out = newer(&self.ring);
        out.extend(newer(&self.routine));
        out.sort_by_key(|e| std::cmp::Reverse(e.seq));
        out
    }

    /// The newest event's `seq` (0: none yet).
    pub fn last(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }
}

/// The process's events: supervisors, reloads, sessions and the router all add to it.
pub fn events() -> &'static Events {
    static EVENTS: LazyLock<Events> = LazyLock::new(Events::default);
    &EVENTS
}

/// In-flight calls of one server, counted while a guard lives.
pub struct Busy<'a>(&'a AtomicI64);

impl<'a> Busy<'a> {
    pub fn new(n: &'a AtomicI64) -> Busy<'a> {
        n.fetch_add(1, Ordering::Relaxed);
        Busy(n)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_roll_over_and_summarize() {
        let s = Series::default();
        s.record_at(5, false, Duration::from_micros(100));
        s.record_at(5, true, Duration::from_millis(40));
        s.record_at(6, false, Duration::from_micros(100));
        let sum = s.summary_at(7);
        assert_eq!((sum.calls, sum.errors), (3, 1));
        assert_eq!(sum.calls_per_second, 0.3);
        // 100 µs is bucket 7 ([64, 128) µs): its middle is 96 µs.
        assert_eq!(sum.p50_ms, Some(0.096));
        assert!(sum.p99_ms.is_some_and(|p| p > 20.0 && p < 50.0));
        assert_eq!(sum.calls_series.iter().sum::<u64>(), 3);
        assert_eq!(
            *sum.calls_series.last().unwrap_or(&0),
            3,
            "the newest point is the last"
        );
        // 15 minutes later the same slot holds a new second: the old one is gone.
        s.record_at(5 + SECONDS, false, Duration::from_micros(1));
        let sum = s.summary_at(5 + SECONDS);
        assert_eq!(sum.calls, 2, "seconds 5 is out of the window, 6 is not");
        assert_eq!(sum.calls_series.len(), (SECONDS / STEP) as usize);
    }

    #[test]
    fn bursts_coalesce_and_the_ring_is_bounded() {
        let e = Events::default();
        e.push("reload", None, "a");
        e.burst("rate_limited", "per_ip", None, "1");
        e.burst("rate_limited", "per_ip", None, "2");
        let all = e.since(0);
        assert_eq!(all.len(), 2);
        assert_eq!(
            (all[0].kind, all[0].count, all[0].text.as_str()),
            ("rate_limited", 2, "2")
        );
        assert_eq!(e.since(all[0].seq).len(), 0);
        for i in 0..500 {
            e.push("session_opened", None, format!("{i}"));
        }
        // Routine events have their own ring: the reload and the burst stay.
        let all = e.since(0);
        assert_eq!(all.len(), EVENTS + 2);
        assert!(all.windows(2).all(|w| w[0].seq > w[1].seq), "newest first");
        assert!(all.iter().any(|e| e.kind == "reload"));
        for i in 0..500 {
            e.push("down", None, format!("{i}"));
        }
        assert_eq!(e.since(0).len(), 2 * EVENTS);
    }

    #[test]
    fn texts_are_clipped_on_char_boundaries() {
        assert_eq!(clip("abc".into(), 3), "abc");
        assert_eq!(clip("aé€x".into(), 2), "aé… (4 more bytes cut)");
        assert_eq!(clipped("aé€x", 3), "aé€… (1 more bytes cut)");
        let e = Events::default();
        e.push("error", None, "x".repeat(1 << 20));
        assert!(e.since(0)[0].text.len() < TEXT + 40);
    }

    #[test]
    fn client_rows_are_bounded() {
        let c = Clients::default();
        for i in 0..(CLIENTS + 10) {
            c.row(&Arc::from(format!("address 10.0.0.{i}"))).call();
        }
        assert_eq!(c.rows().len(), CLIENTS + 1);
    }
}
