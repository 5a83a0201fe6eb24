//! Resumable SSE for handshake-era sessions (Streamable HTTP "Resumability and
//! Redelivery"). Every SSE stream of a session gets a number; every event on it the id
//! `STREAM-SEQ` (unique in the session, and naming its stream). The events are kept, a
//! bounded number for a bounded time per session, so a GET with `Last-Event-ID` replays
//! what came after that id on that stream, then follows the stream live.
//!
//! In cluster mode the events stay in the replica that sent them, so an id also names
//! that replica's process and the stream's kind: `ORIGIN.gSTREAM-SEQ` for a GET stream,
//! `ORIGIN.pSTREAM-SEQ` for a POST answer, ORIGIN being random per process. A replica
//! then tells an id of its own from another's (whose stream numbers mean nothing here),
//! and a GET stream another replica held from a call's answer it cannot replay.
//!
//! A session has a [`Replay`] only once it has sent an SSE stream: a call answered as
//! plain JSON has no id and keeps nothing.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Events kept per session for replay: the newest this many…
pub const REPLAY_EVENTS: usize = 1000;
/// …that are at most this old…
pub const REPLAY_AGE: Duration = Duration::from_secs(300);
/// …and at most this many bytes together (a few large answers do not pin memory).
pub const REPLAY_BYTES: usize = 16 << 20;
/// Every session's kept events together, at most: without it, a client with many
/// sessions (up to `gateway.max_sessions_per_client`) pins `REPLAY_BYTES` in each. Past
/// it the client keeping the most gives up its oldest events (see [`Budget`]).
pub const REPLAY_TOTAL_BYTES: usize = 256 << 20;
/// The `retry` field of priming events: how long a client waits before it reconnects.
pub const RETRY_MS: u64 = 1000;

/// The bytes all sessions' [`Replay`]s keep, against a limit ([`REPLAY_TOTAL_BYTES`]),
/// and the order each client's were kept in.
///
/// Past the limit, the client keeping the most bytes gives up its own oldest events (the
/// client: its identity, else its address, as `gateway.max_sessions_per_client` counts
/// them). So a client that fills the budget sheds its own events, and every other
/// client's stay resumable, until it keeps no more than they do: each client's share is
/// what the others leave, and none is held back for a client that is not there. Shed
/// oldest first across all sessions instead, one client's flood of large answers would
/// push out everyone else's events within seconds.
pub struct Budget {
    used: AtomicUsize,
    /// Events kept, all sessions together.
    events: AtomicUsize,
    limit: usize,
    /// The next event's number: a session's events are numbered in the order it keeps them.
    next: AtomicU64,
    order: Mutex<Order>,
}

/// Every event kept, by client.
#[derive(Default)]
struct Order {
    clients: HashMap<Arc<str>, Held>,
    /// The entries in all clients' `kept`.
    entries: usize,
}

/// What one client keeps: its bytes, and its events about oldest first (each is added
/// just after its session keeps it), as its number and its session's events; an entry
/// whose event its session dropped already (its own bounds, its end) is skipped.
struct Held {
    /// Counted by its sessions under their own locks; each of its [`Replay`]s holds it.
    used: Arc<AtomicUsize>,
    kept: VecDeque<(u64, Weak<Mutex<Inner>>)>,
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            events: AtomicUsize::new(0),
            limit,
            next: AtomicU64::new(0),
            order: Mutex::default(),
        }
    }

    /// The bytes kept now, all sessions together.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The count of `client`'s bytes, shared by its sessions' replays.
    fn join(&self, client: &Arc<str>) -> Arc<AtomicUsize> {
        let mut order = crate::sync::lock(&self.order);
        order
            .clients
            .entry(client.clone())
            .or_insert_with(|| Held {
                used: Arc::default(),
                kept: VecDeque::new(),
            })
            .used
            .clone()
    }

    fn add(&self, client: &AtomicUsize, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
        client.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub(&self, client: &AtomicUsize, bytes: usize, events: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
        self.events.fetch_sub(events, Ordering::Relaxed);
        client.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Until the kept bytes are within the limit, the client keeping the most drops its
    /// oldest event, whichever of its sessions'; then, if entries of events already gone
    /// outnumber the kept ones, forgets them. Called with `order` locked, and no
    /// session's events. Finding that client is one pass over the clients keeping events,
    /// only while over the limit (a record sheds about one event).
    fn shed(&self, order: &mut Order) {
        let Order { clients, entries } = order;
        while self.used() > self.limit {
            let Some(held) = clients
                .values_mut()
                .filter(|h| !h.kept.is_empty())
                .max_by_key(|h| h.used.load(Ordering::Relaxed))
            else {
                break;
            };
            while let Some((n, events)) = held.kept.pop_front() {
                *entries -= 1;
                let dropped = events
                    .upgrade()
                    .is_some_and(|e| crate::sync::lock(&e).drop_oldest_since(n, self, &held.used));
                if dropped {
                    break;
                }
            }
        }
        if *entries > 2 * self.events.load(Ordering::Relaxed) + 1024 {
            *entries = 0;
            clients.retain(|_, held| {
                held.kept.retain(|(n, events)| {
                    events
                        .upgrade()
                        .is_some_and(|e| crate::sync::lock(&e).kept.front().is_some_and(|k| k.n <= *n))
                });
                *entries += held.kept.len();
                // A client none of whose sessions keeps a replay any more is forgotten.
                !held.kept.is_empty() || Arc::strong_count(&held.used) > 1
            });
        }
    }

    /// `client`'s replay (`used`, its count) ended: if it was the client's last, the
    /// client is forgotten (its entries are all of events gone). Called with no lock held.
    fn leave(&self, client: &Arc<str>, used: &Arc<AtomicUsize>) {
        let mut order = crate::sync::lock(&self.order);
        let Order { clients, entries } = &mut *order;
        // Its count is held by the table and by each of its replays, this one included.
        if Arc::strong_count(used) == 2 {
            if let Some(held) = clients.remove(client) {
                *entries -= held.kept.len();
            }
        }
    }
}

/// The events of one session's SSE streams, for replay.
pub struct Replay {
    inner: Arc<Mutex<Inner>>,
    /// This process's part of the ids, in cluster mode (see the module's doc).
    origin: Option<Arc<str>>,
    /// Shared by every session's replay.
    budget: Arc<Budget>,
    /// Whose share of the budget it is (see [`Budget`]), and that client's count of
    /// bytes kept.
    client: Arc<str>,
    used: Arc<AtomicUsize>,
}

impl Default for Replay {
    /// A replay with a budget of its own (tests).
    fn default() -> Replay {
        Replay::new(None, Arc::new(Budget::new(REPLAY_TOTAL_BYTES)), "a client".into())
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        // Emptied as it is given back: the budget's shedding may hold these events a
        // moment longer (it upgraded its weak reference first), and must find nothing
        // left to give back twice.
        {
            let mut inner = self.lock();
            self.budget.sub(&self.used, inner.bytes, inner.kept.len());
            inner.kept.clear();
            inner.bytes = 0;
        }
        self.budget.leave(&self.client, &self.used);
    }
}

#[derive(Default)]
struct Inner {
    next_stream: u64,
    streams: HashMap<u64, Stream>,
    kept: VecDeque<Kept>,
    bytes: usize,
}

struct Stream {
    /// The seq of the last event sent on it (0: none yet; the priming event's id).
    last: u64,
    /// Every event with a seq up to this one is no longer kept.
    gone: u64,
    /// How many of its events are kept.
    kept: usize,
    /// The connection it is sent on now (a POST answer, or a GET resuming it).
    live: Option<mpsc::Sender<Bytes>>,
    /// A POST stream: its answer was sent. A GET stream: no connection carries it.
    done: bool,
    /// The session's GET stream (server-initiated messages), not a POST answer.
    get: bool,
}

struct Kept {
    /// Its place in the order of all sessions' events ([`Budget`]).
    n: u64,
    stream: u64,
    seq: u64,
    at: Instant,
    frame: Bytes,
}

/// Why a `Last-Event-ID` cannot be resumed.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// Not an id of the form this gateway sends.
    Malformed,
    /// Its stream is unknown, or the events after it are no longer kept.
    Gone,
}

/// What a GET with `Last-Event-ID` continues.
pub enum Resumed {
    /// A POST answer: the events after the id, then the rest live on `live` (none: the
    /// stream already ended with its answer).
    Post {
        frames: Vec<Bytes>,
        live: Option<mpsc::Receiver<Bytes>>,
    },
    /// The session's GET stream, numbered `stream`: the events after the id; the caller
    /// carries on sending on it.
    Get { stream: u64, frames: Vec<Bytes> },
}

/// Capacity of a live connection's queue; a reader that falls this far behind loses its
/// connection (not its events: it resumes from its last id).
const LIVE_QUEUE: usize = 256;

/// A `Last-Event-ID` taken apart.
#[derive(Debug, PartialEq)]
pub struct EventId {
    /// An id this process sent (false: another replica's, or an earlier process's).
    pub here: bool,
    /// The kind of its stream, when the id says (cluster mode): a GET stream or not.
    pub get: Option<bool>,
    pub stream: u64,
    pub seq: u64,
}

/// Takes `id` apart, for a process whose ids carry `origin` (cluster mode) or none.
pub fn parse_id(id: &str, origin: Option<&str>) -> Result<EventId, Refused> {
    let (s, n) = id.trim().split_once('-').ok_or(Refused::Malformed)?;
    let seq = n.parse().map_err(|_| Refused::Malformed)?;
    let number = |s: &str| s.parse::<u64>().map_err(|_| Refused::Malformed);
    let Some((from, rest)) = s.split_once('.') else {
        return Ok(EventId {
            here: true,
            get: None,
            stream: number(s)?,
            seq,
        });
    };
    let get = match rest.as_bytes().first() {
        Some(b'g') => true,
        Some(b'p') => false,
        _ => return Err(Refused::Malformed),
    };
    if from.is_empty() || !from.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Refused::Malformed);
    }
    Ok(EventId {
        here: origin == Some(from),
        get: Some(get),
        stream: number(&rest[1..])?,
        seq,
    })
}

/// A random origin for this process's ids (cluster mode): 8 hex characters.
pub fn new_origin() -> Arc<str> {
    crate::cluster::hex(&rand::random::<[u8; 4]>()).into()
}

/// One JSON-RPC message as an SSE `message` event, with the id `id` if given.
pub fn message_event(id: Option<&str>, json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + 48);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"event: message\n");
    // A line a `data:` field. SSE ends a line at CR, LF or CRLF, so each of them starts
    // the next field (in valid JSON a raw CR or LF is whitespace between tokens, so the
    // client's join of the fields with LF reads as the same JSON); `memchr2` finds the
    // (rare) breaks, so a 20 MB message costs a copy, not a loop over its bytes.
    let mut rest = json;
    loop {
        let (line, next) = match memchr::memchr2(b'\n', b'\r', rest) {
            Some(at) if rest[at] == b'\r' && rest.get(at + 1) == Some(&b'\n') => (&rest[..at], Some(&rest[at + 2..])),
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.push(b'\n');
        match next {
            Some(next) => rest = next,
            None => break,
        }
    }
    out.push(b'\n');
    out
}

impl Replay {
    /// The replay of a session of `client` (see [`Budget`]); its ids carry `origin`
    /// (cluster mode); what it keeps counts against `budget`, shared by all sessions.
    pub fn new(origin: Option<Arc<str>>, budget: Arc<Budget>, client: Arc<str>) -> Replay {
        let used = budget.join(&client);
        Replay {
            inner: Arc::default(),
            origin,
            budget,
            client,
            used,
        }
    }

    /// Drops the events past the bounds now (the janitor's round: a session that records
    /// nothing more still lets go of its old events).
    pub fn trim(&self) {
        self.lock().evict(Instant::now(), &self.budget, &self.used);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
    }

    /// The id of event `seq` of `stream` (a GET stream if `get`).
    fn id(&self, stream: u64, seq: u64, get: bool) -> String {
        match &self.origin {
            Some(o) => format!("{o}.{}{stream}-{seq}", if get { 'g' } else { 'p' }),
            None => format!("{stream}-{seq}"),
        }
    }

    /// A new POST answer stream; its events go to the returned receiver while that lives.
    pub fn open_post(&self) -> (u64, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(LIVE_QUEUE);
        (self.open(false, Some(tx)), rx)
    }

    /// A new GET stream, sent by its caller (see [`Replay::record`]).
    pub fn open_get(&self) -> u64 {
        self.open(true, None)
    }

    fn open(&self, get: bool, live: Option<mpsc::Sender<Bytes>>) -> u64 {
        let mut inner = self.lock();
        inner.next_stream += 1;
        let n = inner.next_stream;
        inner.streams.insert(
            n,
            Stream {
                last: 0,
                gone: 0,
                kept: 0,
                live,
                done: false,
                get,
            },
        );
        n
    }

    /// The priming event of `stream` for a connection starting now: its id, `retry` and
    /// empty data. The id is the last event sent, so a resume from it misses nothing; on
    /// a connection that resumes after event `resumed`, it is that one's, since the
    /// events replayed after it come next (a client whose connection breaks during the
    /// replay resumes from the last of them it read, or from `resumed` again).
    pub fn priming(&self, stream: u64, resumed: Option<u64>) -> Bytes {
        let (last, get) = self.lock().streams.get(&stream).map_or((0, false), |s| (s.last, s.get));
        let id = self.id(stream, resumed.unwrap_or(last), get);
        Bytes::from(format!("id: {id}\nretry: {RETRY_MS}\ndata: \n\n"))
    }

    /// Frames `json` as the next event of `stream`, keeps it, and sends it on the stream's
    /// live connection, if any. Returns the frame.
    pub fn record(&self, stream: u64, json: &[u8]) -> Bytes {
        let (frame, n) = {
            let mut inner = self.lock();
            let now = Instant::now();
            let Some(s) = inner.streams.get_mut(&stream) else {
                return Bytes::new();
            };
            s.last += 1;
            s.kept += 1;
            let (seq, get) = (s.last, s.get);
            let id = self.id(stream, seq, get);
            let frame = Bytes::from(message_event(Some(&id), json));
            if let Some(tx) = &s.live {
                if tx.try_send(frame.clone()).is_err() {
                    // Gone, or too far behind: it resumes from its last id.
                    s.live = None;
                }
            }
            let n = self.budget.next.fetch_add(1, Ordering::Relaxed);
            inner.bytes += frame.len();
            self.budget.add(&self.used, frame.len());
            inner.kept.push_back(Kept {
                n,
                stream,
                seq,
                at: now,
                frame: frame.clone(),
            });
            inner.evict(now, &self.budget, &self.used);
            (frame, n)
        };
        // The order after the session's events, never while holding them: as the budget
        // sheds.
        let mut order = crate::sync::lock(&self.budget.order);
        let entry = (n, Arc::downgrade(&self.inner));
        match order.clients.get_mut(&self.client) {
            Some(held) => held.kept.push_back(entry),
            // Not forgotten while a replay of it lives; made again all the same.
            None => {
                order.clients.insert(
                    self.client.clone(),
                    Held {
                        used: self.used.clone(),
                        kept: VecDeque::from([entry]),
                    },
                );
            }
        }
        order.entries += 1;
        self.budget.shed(&mut order);
        frame
    }

    /// `stream` is over for now: a POST stream's answer was sent (its connection ends
    /// once it has read it), or a GET stream's connection closed.
    pub fn finish(&self, stream: u64) {
        let mut inner = self.lock();
        if let Some(s) = inner.streams.get_mut(&stream) {
            s.done = true;
            s.live = None;
            if s.kept == 0 {
                inner.streams.remove(&stream);
            }
        }
    }

    /// Resumes after event `after` of `stream`. A POST stream's later events go to the
    /// new connection from now on (an earlier connection still reading it ends).
    pub fn resume(&self, stream: u64, after: u64) -> Result<Resumed, Refused> {
        let mut inner = self.lock();
        inner.evict(Instant::now(), &self.budget, &self.used);
        let s = inner.streams.get(&stream).ok_or(Refused::Gone)?;
        if after < s.gone || after > s.last {
            return Err(Refused::Gone);
        }
        let (get, done) = (s.get, s.done);
        let frames = inner
            .kept
            .iter()
            .filter(|k| k.stream == stream && k.seq > after)
            .map(|k| k.frame.clone())
            .collect();
        if get {
            return Ok(Resumed::Get { stream, frames });
        }
        let live = (!done).then(|| {
            let (tx, rx) = mpsc::channel(LIVE_QUEUE);
            if let Some(s) = inner.streams.get_mut(&stream) {
                s.live = Some(tx);
            }
            rx
        });
        Ok(Resumed::Post { frames, live })
    }

    /// A resumed GET stream has a connection again.
    pub fn reopen(&self, stream: u64) {
        if let Some(s) = self.lock().streams.get_mut(&stream) {
            s.done = false;
        }
    }
}

impl Inner {
    /// Drops the oldest events past this session's bounds, and streams that ended with
    /// nothing kept. `client` counts its client's bytes.
    fn evict(&mut self, now: Instant, total: &Budget, client: &AtomicUsize) {
        while let Some(k) = self.kept.front() {
            let old = now.duration_since(k.at) > REPLAY_AGE;
            if !old && self.kept.len() <= REPLAY_EVENTS && self.bytes <= REPLAY_BYTES {
                break;
            }
            self.drop_oldest(total, client);
        }
    }

    /// Drops the oldest event if event `n` of all sessions' is still kept here, or one
    /// before it (see [`Budget::shed`]); else event `n` went already, and nothing does.
    /// Returns whether one did.
    fn drop_oldest_since(&mut self, n: u64, total: &Budget, client: &AtomicUsize) -> bool {
        let due = self.kept.front().is_some_and(|k| k.n <= n);
        if due {
            self.drop_oldest(total, client);
        }
        due
    }

    fn drop_oldest(&mut self, total: &Budget, client: &AtomicUsize) {
        let Some(k) = self.kept.pop_front() else { return };
        self.bytes -= k.frame.len();
        total.sub(client, k.frame.len(), 1);
        if let Some(s) = self.streams.get_mut(&k.stream) {
            s.gone = k.seq;
            s.kept -= 1;
            if s.kept == 0 && s.done {
                self.streams.remove(&k.stream);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_data_line_per_line_of_it() {
        assert_eq!(
            message_event(Some("1-2"), b"{\"a\":1}"),
            b"id: 1-2\nevent: message\ndata: {\"a\":1}\n\n"
        );
        assert_eq!(message_event(None, b""), b"event: message\ndata: \n\n");
        // A downstream's pretty-printed JSON: each line its own field, CR dropped, an
        // empty last line kept as the split of the text gives it.
        assert_eq!(
            message_event(None, b"{\r\n\"a\": 1\n}\n"),
            b"event: message\ndata: {\ndata: \"a\": 1\ndata: }\ndata: \n\n"
        );
        // A lone CR ends an SSE line too (two would end the event): each is a break.
        assert_eq!(
            message_event(None, b"{\"a\":1\r\r}"),
            b"event: message\ndata: {\"a\":1\ndata: \ndata: }\n\n"
        );
    }

    #[test]
    fn ids_name_their_stream_and_replay_resumes_after_one() {
        let r = Replay::default();
        let (a, _rx) = r.open_post();
        let b = r.open_get();
        r.record(a, b"{\"n\":1}");
        r.record(b, b"{\"g\":1}");
        r.record(a, b"{\"n\":2}");
        let Ok(Resumed::Post { frames, live }) = r.resume(a, 1) else {
            panic!("not resumed")
        };
        assert_eq!(frames.len(), 1);
        assert!(frames[0].starts_with(format!("id: {a}-2\n").as_bytes()));
        assert!(live.is_some());
        let id = parse_id(&format!("{b}-1"), None);
        assert_eq!(
            id,
            Ok(EventId {
                here: true,
                get: None,
                stream: b,
                seq: 1
            })
        );
        assert_eq!(parse_id("x", None), Err(Refused::Malformed));
        assert!(matches!(r.resume(99, 0), Err(Refused::Gone)));
        assert!(matches!(r.resume(a, 7), Err(Refused::Gone)));
    }

    #[test]
    fn cluster_ids_name_their_process_and_the_kind_of_their_stream() {
        let r = Replay::new(
            Some("0a1b2c3d".into()),
            Arc::new(Budget::new(REPLAY_TOTAL_BYTES)),
            "a client".into(),
        );
        let (a, _rx) = r.open_post();
        let b = r.open_get();
        assert!(r
            .priming(b, None)
            .starts_with(format!("id: 0a1b2c3d.g{b}-0\n").as_bytes()));
        let frame = r.record(a, b"{}");
        assert!(frame.starts_with(format!("id: 0a1b2c3d.p{a}-1\n").as_bytes()));
        let mine = parse_id(&format!("0a1b2c3d.g{b}-4"), Some("0a1b2c3d"));
        assert_eq!(
            mine,
            Ok(EventId {
                here: true,
                get: Some(true),
                stream: b,
                seq: 4
            })
        );
        // Another replica's: its numbers mean nothing here, its kind does.
        let theirs = parse_id(&format!("99999999.p{a}-1"), Some("0a1b2c3d")).unwrap();
        assert_eq!((theirs.here, theirs.get), (false, Some(false)));
        for bad in ["0a1b2c3d.x1-1", ".g1-1", "0a1b2c3d.g-1", "0a:b.g1-1"] {
            assert_eq!(parse_id(bad, Some("0a1b2c3d")), Err(Refused::Malformed), "{bad}");
        }
        assert_eq!(new_origin().len(), 8);
    }

    #[test]
    fn the_count_bound_evicts_the_oldest() {
        let r = Replay::default();
        let (a, _rx) = r.open_post();
        for _ in 0..REPLAY_EVENTS + 5 {
            r.record(a, b"{}");
        }
        assert!(matches!(r.resume(a, 1), Err(Refused::Gone)));
        assert!(matches!(r.resume(a, 5), Ok(Resumed::Post { .. })));
        r.finish(a);
        let Ok(Resumed::Post { frames, live }) = r.resume(a, REPLAY_EVENTS as u64) else {
            panic!("not resumed")
        };
        assert_eq!(frames.len(), 5);
        assert!(live.is_none(), "an answered stream has nothing live");
    }

    #[test]
    fn sessions_share_one_byte_budget_and_give_it_back() {
        let budget = Arc::new(Budget::new(1000));
        let one = |c: &str| Replay::new(None, budget.clone(), c.into());
        let (r1, r2) = (one("a client"), one("a client"));
        let (a, _ra) = r1.open_post();
        let (b, _rb) = r2.open_post();
        let event = [b'x'; 300];
        for _ in 0..3 {
            r1.record(a, &event);
        }
        assert!(budget.used() <= 1000, "{}", budget.used());
        // Over the budget, the oldest events of the client go, whichever session's.
        r2.record(b, &event);
        r2.record(b, &event);
        assert!(budget.used() <= 1000, "{}", budget.used());
        assert!(matches!(r1.resume(a, 0), Err(Refused::Gone)), "r1's first event went");
        assert!(matches!(r1.resume(a, 2), Ok(Resumed::Post { .. })));
        assert!(matches!(r2.resume(b, 0), Ok(Resumed::Post { .. })), "r2's are kept");
        drop(r1);
        drop(r2);
        assert_eq!(budget.used(), 0);
        assert!(
            crate::sync::lock(&budget.order).clients.is_empty(),
            "its client is forgotten"
        );
    }

    #[test]
    fn over_the_budget_the_client_keeping_the_most_sheds_its_own_events() {
        let budget = Arc::new(Budget::new(1000));
        let one = |c: &str| Replay::new(None, budget.clone(), c.into());
        let (light, heavy, heavy2) = (one("client 'bob'"), one("client 'alice'"), one("client 'alice'"));
        let (l, _rl) = light.open_post();
        let (h, _rh) = heavy.open_post();
        let (h2, _rh2) = heavy2.open_post();
        let event = [b'x'; 200];
        light.record(l, &event);
        // Alice floods from two sessions: hers go, oldest first, and Bob's one event,
        // the oldest of all, stays.
        for _ in 0..10 {
            heavy.record(h, &event);
            heavy2.record(h2, &event);
        }
        assert!(budget.used() <= 1000, "{}", budget.used());
        assert!(
            matches!(light.resume(l, 0), Ok(Resumed::Post { .. })),
            "Bob's event went"
        );
        assert!(matches!(heavy.resume(h, 0), Err(Refused::Gone)));
        assert!(
            matches!(heavy2.resume(h2, 9), Ok(Resumed::Post { .. })),
            "Alice's newest went"
        );
        // Bob, now keeping the most, sheds his own.
        for _ in 0..4 {
            light.record(l, &event);
        }
        assert!(matches!(light.resume(l, 0), Err(Refused::Gone)));
        assert!(matches!(heavy2.resume(h2, 9), Ok(Resumed::Post { .. })));
        drop((light, heavy, heavy2));
        assert_eq!(budget.used(), 0);
        assert!(crate::sync::lock(&budget.order).clients.is_empty());
    }
}
