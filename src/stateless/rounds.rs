//! Rounds of questions and answers (2026-07-28 multi round-trip requests), for
//! handshake-era downstreams.
//!
//! A handshake-era server asks its questions (`elicitation/create`, `sampling/createMessage`,
//! `roots/list`) in the middle of a call; a 2026-07-28 client can only be asked through an
//! `InputRequiredResult`. So a stateless `tools/call`, `prompts/get` or `resources/read`
//! runs as a [`Call`]: a task of its own whose client hands the server's questions to the
//! flow instead of refusing them. A [`Round`] races "question asked" against "call
//! finished": a question answers the client's request with `resultType:
//! "input_required"`, the question(s) in `inputRequests` and a `requestState`, while the
//! downstream call waits, [`Parked`] in this process. The client's retry (a new id, the
//! same method and name/uri, `inputResponses` + the `requestState`) takes the call back:
//! the answers go to the waiting questions and the call goes on, to its result or to
//! further questions.
//!
//! `requestState` is `mcp-gateway.{call}.{round}.{expiry ms}.{HMAC-SHA256}`: the MAC (a
//! random key per process) covers those and the method, name/uri and principal (auth
//! identity, or what the transport knows of the caller) it was issued for, so a state is
//! refused when tampered with, expired, presented for another request or by another
//! principal, or used twice (each round's state is taken once). A parked call expires
//! after `gateway.input_timeout` ([`crate::config::DEFAULT_INPUT_TIMEOUT`]) and is then
//! cancelled downstream (its task is aborted). Parked calls live in one gateway process:
//! a retry reaching another instance is refused. A `requestState` without the
//! `mcp-gateway.` mark is not the gateway's: it is a 2026-07-28 server's own, and the
//! retry goes to that server untouched.

use super::results::{invalid_state, Finish};
use super::Tracked;
use crate::client::Client;
use crate::cluster::{hex, unhex};
use crate::downstream::{Sink, SINK_QUEUE};
use crate::error::{code, Error};
use crate::message::{self, Id, Outcome};
use crate::method::Method;
use crate::router::Gateway;
use bytes::Bytes;
use ring::hmac;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Marks a `requestState` the gateway minted; any other state is a server's own and
/// passes through to it untouched (a 2026-07-28 server's multi round-trip request).
pub const STATE_PREFIX: &str = "mcp-gateway.";

/// Calls parked at once at most; past it a call that asks is failed instead (a bound on
/// what clients that never retry can hold).
pub const MAX_PARKED: usize = 10_000;
/// After a first question, how long other questions of the same moment are awaited, so
/// questions asked together go out in one `inputRequests`.
const SETTLE: Duration = Duration::from_millis(20);

pub use crate::client::Question;

/// Aborts the call's task when the call is dropped (expired, or its client went away).
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What happened next in a call.
pub enum Step {
    /// A message for the client before the answer (progress, a log message).
    Related(Bytes),
    /// The call's outcome; `None` when it was cancelled.
    Done(Option<Outcome>),
    /// The server's open questions, as an `inputRequests` map.
    InputRequired(Map<String, Value>),
}

/// A call's request to the router, as it runs.
type Running = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Outcome>> + Send>>;

/// Where a call runs: in its round (no task of its own) until it is parked, then in a
/// task, so it goes on while its client answers.
enum Progress {
    Inline(Running),
    Detached {
        done: oneshot::Receiver<Option<Outcome>>,
        _task: Abort,
    },
    /// It finished while its questions were being gathered; its outcome waits here.
    Finished(Option<Outcome>),
    Taken,
}

impl Progress {
    /// Waits for the call's outcome (once: it is then taken).
    async fn outcome(&mut self) -> Option<Outcome> {
        let out = match self {
            Progress::Inline(running) => running.await,
            Progress::Detached { done, .. } => done.await.ok().flatten(),
            Progress::Finished(out) => out.take(),
            Progress::Taken => None,
        };
        *self = Progress::Taken;
        out
    }

    /// Moves an inline call into a task of its own.
    fn detach(&mut self) {
        if let Progress::Inline(_) = self {
            let Progress::Inline(running) = std::mem::replace(self, Progress::Taken) else {
                return;
            };
            let (tx, done) = oneshot::channel();
            let task = crate::background::spawn(async move {
                let _ = tx.send(running.await);
            });
            *self = Progress::Detached {
                done,
                _task: Abort(task),
            };
        }
    }
}

/// One stateless call that may ask questions.
pub struct Call {
    questions: mpsc::Receiver<Question>,
    related: mpsc::Receiver<Bytes>,
    progress: Progress,
    /// Questions asked and not answered yet, by their `inputRequests` key.
    open: Vec<(String, Question)>,
    asked: u64,
    binding: Binding,
}

/// What a call's `requestState` is bound to.
#[derive(Clone, PartialEq, Eq)]
pub struct Binding {
    pub method: Method,
    /// `params.name` (tools/call, prompts/get) or `params.uri` (resources/read).
    pub target: String,
    /// The auth identity, or the caller's IP address without auth.
    pub principal: String,
}

impl Call {
    /// Starts `method` for `client` (a stateless client, made here able to be asked).
    pub fn start(
        gw: Arc<Gateway>,
        client: Client,
        id: Id,
        params: message::Incoming,
        parent: Option<opentelemetry::Context>,
        binding: Binding,
    ) -> Call {
        let (qtx, questions) = mpsc::channel(16);
        let client = Arc::new(client.questions(qtx));
        let (sink, related) = mpsc::channel(SINK_QUEUE);
        let method = binding.method;
        let running: Running = Box::pin(async move {
            gw.request(
                &client,
                crate::router::Request::of(&id, method, params),
                Some(Sink::new(sink)),
                parent,
            )
            .await
        });
        Call {
            questions,
            related,
            progress: Progress::Inline(running),
            open: Vec::new(),
            asked: 0,
            binding,
        }
    }

    /// Gives the client's `inputResponses` to the questions they answer (by key). Values
    /// that are not objects, and unknown keys, are ignored; unanswered questions stay open.
    pub fn answer(&mut self, responses: Option<&Value>) {
        let Some(Value::Object(responses)) = responses else {
            return;
        };
        let open = std::mem::take(&mut self.open);
        for (key, q) in open {
            match responses.get(&key) {
                Some(v @ Value::Object(_)) => {
                    debug!(%key, method = %q.method, "answering a server's question with the client's input response");
                    let _ = q.answer.send(Outcome::Result(message::to_raw(v).into()));
                }
                _ => self.open.push((key, q)),
            }
        }
    }

    fn add(&mut self, q: Question) {
        self.asked += 1;
        let key = format!("q{}", self.asked);
        self.open.push((key, q));
    }

    fn input_requests(&self) -> Map<String, Value> {
        self.open
            .iter()
            .map(|(key, q)| {
                let mut r = json!({ "method": q.method });
                if let Some(p) = &q.params {
                    r["params"] = serde_json::from_str(p.get()).unwrap_or(Value::Null);
                }
                (key.clone(), r)
            })
            .collect()
    }

    /// Gathers the questions asked within [`SETTLE`] of each other, the call running on
    /// meanwhile.
    async fn settle(&mut self) {
        loop {
            tokio::select! {
                biased;
                q = tokio::time::timeout(SETTLE, self.questions.recv()) => match q {
                    Ok(Some(q)) => self.add(q),
                    _ => return,
                },
                out = self.progress.outcome(), if matches!(self.progress, Progress::Inline(_)) => {
                    self.progress = Progress::Finished(out);
                    return;
                }
            }
        }
    }

    /// Waits for the next thing to tell the client.
    pub async fn next(&mut self) -> Step {
        if let Ok(m) = self.related.try_recv() {
            return Step::Related(m);
        }
        if !self.open.is_empty() {
            // Asked again: some questions were not answered by the retry.
            return Step::InputRequired(self.input_requests());
        }
        let mut related_open = true;
        let mut questions_open = true;
        loop {
            tokio::select! {
                biased;
                m = self.related.recv(), if related_open => match m {
                    Some(m) => return Step::Related(m),
                    None => related_open = false,
                },
                q = self.questions.recv(), if questions_open => match q {
                    Some(q) => {
                        self.add(q);
                        self.settle().await;
                        return Step::InputRequired(self.input_requests());
                    }
                    None => questions_open = false,
                },
                out = self.progress.outcome() => return Step::Done(out),
            }
        }
    }
}

/// Calls waiting for their client's retry, and the key that signs their states.
pub struct Parked {
    key: hmac::Key,
    ttl: Duration,
    calls: Mutex<HashMap<String, Waiting>>,
    /// Cluster mode: the replicas, which resume each other's parked calls (see
    /// [`super::remote`]). The key is then derived from the cluster key.
    pub(super) cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Cluster mode: rounds of calls parked on other replicas, driven from here, by
    /// correlation id.
    pub(super) driving: Mutex<HashMap<String, mpsc::Sender<super::remote::Step>>>,
    /// Cluster mode: this replica's calls driven for another replica's retry, by call id.
    pub(super) serving: Mutex<HashMap<String, CancellationToken>>,
}

struct Waiting {
    round: u64,
    call: Call,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Parked {
    /// A table with a fresh random key (in cluster mode one derived from the cluster key,
    /// so every replica verifies the states); parked calls expire after `ttl`.
    pub fn new(ttl: Duration, cluster: Option<Arc<crate::cluster::Cluster>>) -> Arc<Parked> {
        use rand::RngCore;
        let key = match &cluster {
            Some(c) => c.derive("request-state/1"),
            None => {
                let mut key = [0u8; 32];
                rand::rng().fill_bytes(&mut key);
                hmac::Key::new(hmac::HMAC_SHA256, &key)
            }
        };
        Arc::new(Parked {
            key,
            ttl,
            calls: Mutex::new(HashMap::new()),
            cluster,
            driving: Mutex::new(HashMap::new()),
            serving: Mutex::new(HashMap::new()),
        })
    }

    /// The replica a call id names (cluster mode): `{random}-{hex of the replica}`.
    pub(super) fn owner_of(id: &str) -> Option<String> {
        let (_, replica) = id.rsplit_once('-')?;
        String::from_utf8(crate::cluster::unhex(replica)?).ok()
    }

    /// Whether call `id` is parked in this process (always, outside cluster mode).
    pub(super) fn is_here(&self, id: &str) -> bool {
        match &self.cluster {
            None => true,
            Some(c) => Self::owner_of(id).is_none_or(|o| o == c.replica),
        }
    }

    /// The `requestState` of round `round` of call `id`, bound to `binding`.
    pub(super) fn mint(&self, id: &str, round: u64, binding: &Binding) -> String {
        let expires = now_ms().saturating_add(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX));
        let tag = hmac::sign(&self.key, &Self::signed(id, round, expires, binding));
        format!("{STATE_PREFIX}{id}.{round}.{expires}.{}", hex(tag.as_ref()))
    }

    fn signed(call: &str, round: u64, expires: u64, b: &Binding) -> Vec<u8> {
        // Fields that cannot contain a newline first; the rest are length-prefixed.
        let mut m = format!("mcp-gateway/request-state/1\n{call}\n{round}\n{expires}\n").into_bytes();
        for f in [b.method.as_str(), b.target.as_str(), b.principal.as_str()] {
            m.extend_from_slice(format!("{}:", f.len()).as_bytes());
            m.extend_from_slice(f.as_bytes());
            m.push(b'\n');
        }
        m
    }

    /// Parks a call that asked questions; returns its `requestState`, or `None` (the call
    /// dropped, so cancelled) when [`MAX_PARKED`] calls are waiting already.
    pub fn park(self: &Arc<Self>, call: Call, previous: Option<(String, u64)>) -> Option<String> {
        let (id, round) = match previous {
            Some((id, round)) => (id, round + 1),
            None => {
                use rand::RngCore;
                let mut b = [0u8; 16];
                rand::rng().fill_bytes(&mut b);
                match &self.cluster {
                    // The replica that holds it, in its id (covered by the MAC).
                    Some(c) => (format!("{}-{}", hex(&b), hex(c.replica.as_bytes())), 1),
                    None => (hex(&b), 1),
                }
            }
        };
        let state = self.mint(&id, round, &call.binding);
        self.keep(id, round, call).then_some(state)
    }

    /// Keeps `call` as round `round` of call `id` until its retry, or its expiry.
    pub(super) fn keep(self: &Arc<Self>, id: String, round: u64, mut call: Call) -> bool {
        // From here it runs on while its client answers.
        call.progress.detach();
        {
            let mut calls = crate::sync::lock(&self.calls);
            if calls.len() >= MAX_PARKED {
                tracing::warn!(
                    max = MAX_PARKED,
                    "too many calls waiting for their clients' input; failing one"
                );
                return false;
            }
            calls.insert(id.clone(), Waiting { round, call });
        }
        let table: Weak<Parked> = Arc::downgrade(self);
        let ttl = self.ttl;
        crate::background::spawn(async move {
            tokio::time::sleep(ttl).await;
            let Some(table) = table.upgrade() else { return };
            let mut calls = crate::sync::lock(&table.calls);
            if calls.get(&id).is_some_and(|w| w.round == round) {
                debug!(call = %id, "a parked call expired; cancelling it");
                // Dropped: its task is aborted, which cancels the downstream call.
                calls.remove(&id);
            }
        });
        true
    }

    /// Takes back the call a `requestState` names, if it verifies for `binding`. Returns
    /// the call and its (id, round) for the next [`park`](Parked::park); the error is a
    /// reason for the log only.
    #[cfg(test)]
    pub fn resume(&self, state: &str, binding: &Binding) -> Result<(Call, (String, u64)), &'static str> {
        let (id, round) = self.verify(state, binding)?;
        let call = self.take(&id, round, binding)?;
        Ok((call, (id, round)))
    }

    /// The call and round a `requestState` names, if it verifies for `binding` and has not
    /// expired (whether the call is still parked is not known yet).
    pub(super) fn verify(&self, state: &str, binding: &Binding) -> Result<(String, u64), &'static str> {
        let Some(state) = state.strip_prefix(STATE_PREFIX) else {
            return Err("malformed");
        };
        let mut parts = state.split('.');
        let (Some(id), Some(round), Some(expires), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("malformed");
        };
        let (Ok(round), Ok(expires), Some(tag)) = (round.parse::<u64>(), expires.parse::<u64>(), unhex(tag)) else {
            return Err("malformed");
        };
        hmac::verify(&self.key, &Self::signed(id, round, expires, binding), &tag)
            .map_err(|_| "bad signature, or issued for another request or principal")?;
        if now_ms() >= expires {
            return Err("expired");
        }
        Ok((id.to_owned(), round))
    }

    /// Takes round `round` of the parked call `id` (once: that is what makes a state
    /// single-use, on every replica, since only the call's own replica holds it).
    pub(super) fn take(&self, id: &str, round: u64, binding: &Binding) -> Result<Call, &'static str> {
        let mut calls = crate::sync::lock(&self.calls);
        match calls.get(id) {
            Some(w) if w.round == round && w.call.binding == *binding => {}
            Some(_) => return Err("already used"),
            None => return Err("unknown call (used, expired, or from another gateway process)"),
        }
        calls.remove(id).map(|w| w.call).ok_or("unknown call")
    }
}

/// One round of a stateless call that may ask: a new call, or a parked one a
/// `requestState` names, until its result or its next questions.
pub struct Round {
    pub gw: Arc<Gateway>,
    pub parked: Arc<Parked>,
    pub id: Id,
    /// Who may resume the call: the auth identity, or what the transport knows of the caller.
    pub principal: String,
    /// Decorates the result, and the `input_required` that stands for it.
    pub finish: Finish,
    /// Cancelled: the round ends, which cancels the call, and nothing more is sent.
    pub stop: Option<CancellationToken>,
    /// Held until the round ends (its entry in a table of requests in flight).
    pub(super) _held: Option<Tracked>,
    /// Its place among its caller's requests in flight, until the round ends.
    pub(super) _slot: super::Slot,
}

impl Round {
    /// Starts the call (or resumes the one `params.requestState` names, giving it
    /// `params.inputResponses`). Its [`Rounds`] give what to send, in order: related
    /// messages, then the response: the decorated result, or `input_required` with the
    /// call parked. Dropping them before their end cancels the call. A state that does not
    /// verify is the error to answer with.
    pub fn start(
        mut self,
        client: Client,
        params: message::Incoming,
        retry: super::envelope::Retry,
        parent: Option<opentelemetry::Context>,
    ) -> Result<Rounds, Error> {
        let method = self.finish.method;
        let super::envelope::Retry {
            target,
            state,
            responses,
        } = retry;
        let binding = Binding {
            method,
            target,
            principal: std::mem::take(&mut self.principal),
        };
        let (call, previous) = match state {
            None | Some(Value::Null) => {
                // A new call: its params go on untouched (a server that reads
                // `inputResponses` itself, for stateless retries, still sees them).
                let call = Call::start(self.gw.clone(), client, self.id.clone(), params, parent, binding);
                (Driving::Here(call), None)
            }
            // Not the gateway's: a 2026-07-28 server's own state, for it to check.
            Some(Value::String(s)) if !s.starts_with(STATE_PREFIX) => {
                let call = Call::start(self.gw.clone(), client, self.id.clone(), params, parent, binding);
                (Driving::Here(call), None)
            }
            Some(Value::String(s)) => {
                let taken = self.parked.verify(&s, &binding).and_then(|(id, round)| {
                    if self.parked.is_here(&id) {
                        let mut call = self.parked.take(&id, round, &binding)?;
                        call.answer(responses.as_ref());
                        Ok((Driving::Here(call), Some((id, round))))
                    } else {
                        // Parked on another replica: it drives the call, this one relays.
                        let remote =
                            super::remote::Remote::resume(&self.parked, &id, round, &binding, responses.as_ref())
                                .ok_or("the call's replica is not named in its state")?;
                        Ok((Driving::There(remote, binding.clone()), Some((id, round))))
                    }
                });
                match taken {
                    Ok(t) => t,
                    Err(reason) => {
                        tracing::warn!(%method, reason, "requestState refused");
                        return Err(invalid_state());
                    }
                }
            }
            Some(_) => {
                tracing::warn!(%method, "requestState refused: not a string");
                return Err(invalid_state());
            }
        };
        Ok(Rounds {
            round: self,
            state: Some((call, previous)),
        })
    }
}

/// A request's rounds, as they run: [`Rounds::next`] gives what to send, in order
/// (related messages, then the response). Dropping it before its end cancels the call.
/// The usual request is answered by its first `next` (no stream, nothing boxed); a
/// front that streams related messages makes it a stream ([`Rounds::into_stream`]).
pub struct Rounds {
    round: Round,
    /// The call, and the call and round a retry resumed; none once answered.
    state: Option<(Driving, Option<(String, u64)>)>,
}

impl Rounds {
    /// The next thing to send: a related message, or (last) the response; none after
    /// the response, or once the round is stopped.
    pub async fn next(&mut self) -> Option<super::Sent> {
        let (mut call, previous) = self.state.take()?;
        let round = &self.round;
        let step = match &round.stop {
            None => call.next().await,
            Some(stop) => tokio::select! {
                step = call.next() => step,
                () = stop.cancelled() => return None,
            },
        };
        let out = match step {
            Step::Related(m) => {
                self.state = Some((call, previous));
                return Some(super::Sent::Related(m));
            }
            Step::Done(out) => {
                let out = out.unwrap_or_else(|| Error::client(code::REQUEST_CANCELLED, "request cancelled").into());
                // A large result's bytes go on shared, as on the session path.
                return Some(super::Sent::Answer(round.finish.answer(&round.id, out)));
            }
            Step::InputRequired(requests) => {
                let state = match call {
                    Driving::Here(call) => round.parked.park(call, previous),
                    // Its replica keeps it parked as the next round; the state is
                    // minted here, with the key every replica shares.
                    Driving::There(_, binding) => previous.map(|(id, r)| round.parked.mint(&id, r + 1, &binding)),
                };
                match state {
                    Some(state) => round.finish.input_required(requests, state),
                    None => Error::gateway(
                        "the server asked for input, but too many calls are waiting for input in mcp-gateway; try again later",
                    )
                    .into(),
                }
            }
        };
        Some(super::Sent::Answer(message::Answer::new(&round.id, out)))
    }

    /// The rest of the rounds as a stream.
    pub fn into_stream(self) -> impl futures::Stream<Item = super::Sent> + Send {
        futures::stream::unfold(self, |mut rounds| async move {
            let sent = rounds.next().await?;
            Some((sent, rounds))
        })
    }
}

/// A round's call: parked here, or on another replica that drives it for this one.
enum Driving {
    Here(Call),
    There(super::remote::Remote, Binding),
}

impl Driving {
    async fn next(&mut self) -> Step {
        match self {
            Driving::Here(call) => call.next().await,
            Driving::There(remote, _) => remote.next().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(target: &str) -> Binding {
        Binding {
            method: Method::ToolsCall,
            target: target.into(),
            principal: "alice".into(),
        }
    }

    /// A call whose questions, related messages and outcome the test sends by hand.
    fn call() -> (Call, mpsc::Sender<Question>, oneshot::Sender<Option<Outcome>>) {
        let (qtx, questions) = mpsc::channel(16);
        let (_rtx, related) = mpsc::channel(4);
        let (dtx, done) = oneshot::channel();
        let call = Call {
            questions,
            related,
            progress: Progress::Detached {
                done,
                _task: Abort(crate::background::spawn(async {})),
            },
            open: Vec::new(),
            asked: 0,
            binding: binding("s0__ask"),
        };
        (call, qtx, dtx)
    }

    fn question(method: &str) -> (Question, oneshot::Receiver<Outcome>) {
        let (tx, rx) = oneshot::channel();
        let q = Question {
            method: method.into(),
            params: Some(message::to_raw(&json!({ "message": method }))),
            answer: tx,
        };
        (q, rx)
    }

    #[tokio::test]
    async fn questions_asked_together_go_out_together_and_are_asked_again_until_answered() {
        let (mut c, qtx, dtx) = call();
        let (q1, mut a1) = question("elicitation/create");
        let (q2, mut a2) = question("roots/list");
        qtx.send(q1).await.unwrap();
        qtx.send(q2).await.unwrap();
        let Step::InputRequired(reqs) = c.next().await else {
            panic!("expected input_required")
        };
        assert_eq!(
            Value::Object(reqs),
            json!({
                "q1": {"method": "elicitation/create", "params": {"message": "elicitation/create"}},
                "q2": {"method": "roots/list", "params": {"message": "roots/list"}},
            })
        );
        // Only q2 answered (and junk ignored): q1 is asked again, alone.
        c.answer(Some(&json!({"q2": {"roots": []}, "q9": {}, "q1": "not an object"})));
        assert!(matches!(a2.try_recv(), Ok(Outcome::Result(_))));
        assert!(a1.try_recv().is_err());
        let Step::InputRequired(reqs) = c.next().await else {
            panic!("expected input_required")
        };
        assert_eq!(reqs.keys().collect::<Vec<_>>(), vec!["q1"]);
        c.answer(Some(&json!({"q1": {"action": "decline"}})));
        assert!(matches!(a1.try_recv(), Ok(Outcome::Result(_))));
        let _ = dtx.send(Some(Outcome::Result(message::empty_object().into())));
        assert!(matches!(c.next().await, Step::Done(Some(Outcome::Result(_)))));
    }

    #[tokio::test]
    async fn states_verify_once_for_their_binding_only() {
        let parked = Parked::new(Duration::from_secs(60), None);
        let (c, _q, _d) = call();
        let state = parked.park(c, None).unwrap();
        // Tampered anywhere, or presented for another target or principal: refused, and
        // the call stays parked.
        let mut bad = state.clone();
        let last = bad.pop().unwrap();
        bad.push(if last == '0' { '1' } else { '0' });
        assert!(parked.resume(&bad, &binding("s0__ask")).is_err());
        let later = state.replacen(".1.", ".2.", 1);
        assert!(parked.resume(&later, &binding("s0__ask")).is_err());
        assert!(parked.resume(&state, &binding("s0__other")).is_err());
        let mut bob = binding("s0__ask");
        bob.principal = "bob".into();
        assert!(parked.resume(&state, &bob).is_err());
        assert!(parked.resume("", &binding("s0__ask")).is_err());
        let (c, previous) = parked.resume(&state, &binding("s0__ask")).expect("verifies");
        assert!(parked.resume(&state, &binding("s0__ask")).is_err(), "used once");
        // The next round's state is a different one; the old one stays spent.
        let next = parked.park(c, Some(previous)).unwrap();
        assert_ne!(next, state);
        assert!(parked.resume(&state, &binding("s0__ask")).is_err());
        assert!(parked.resume(&next, &binding("s0__ask")).is_ok());
    }

    #[tokio::test]
    async fn expired_calls_are_dropped() {
        let parked = Parked::new(Duration::from_millis(50), None);
        let (c, qtx, _d) = call();
        let state = parked.park(c, None).unwrap();
        // The call is dropped at expiry: its question channel closes.
        tokio::time::timeout(Duration::from_secs(5), qtx.closed())
            .await
            .expect("dropped at expiry");
        assert!(parked.resume(&state, &binding("s0__ask")).is_err());
    }
}
