//! Cluster mode: a call parked on one replica, resumed by a retry that lands on another.
//!
//! A parked call is a live task of the replica it started on (its downstream call is
//! waiting for the client's answers), and its id names that replica. A retry landing
//! elsewhere verifies its `requestState` (the key is the cluster's, so every replica can)
//! and asks the call's replica over the bus to resume it ([`Note::Resume`]). That replica
//! takes the call from its table (once: that makes a state single-use across replicas),
//! gives it the answers and drives it, sending each step back ([`Note::Step`]): related
//! messages, the outcome, or the next questions (it keeps the call parked for the next
//! round, whose state the retry's replica mints). A replica that goes away mid-round is
//! noticed by its silence ([`QUIET`]): it says it is alive every [`ALIVE`] while it drives.

use super::rounds::{Binding, Call, Parked, Step as Local};
use crate::cluster::bus::{Note, To};
use crate::error::Error;
use crate::message::{self, Id, Kind, Outcome};
use crate::method::Method;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How often the driving replica says it is still at it.
const ALIVE: Duration = Duration::from_secs(2);
/// Silence for this long: the call's replica is gone.
const QUIET: Duration = Duration::from_secs(7);

/// One step of a call driven on another replica, as it crosses the bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "s", rename_all = "snake_case")]
pub enum Step {
    /// A message for the client before the answer (its JSON text).
    Related { line: String },
    /// The outcome, as a JSON-RPC response (`None`: the call was cancelled).
    Done { response: Option<String> },
    /// The next questions (an `inputRequests` map, as JSON); the call stays parked there
    /// as the next round.
    Input { requests: String },
    /// Still driving.
    Alive,
    /// The call is not parked there (used, expired, or never).
    Gone { why: String },
}

/// A round of a call parked on another replica, driven from here.
pub struct Remote {
    rx: mpsc::Receiver<Step>,
    corr: String,
    owner: String,
    call: String,
    parked: Arc<Parked>,
    over: bool,
}

impl Remote {
    /// Asks the replica holding call `id` to resume round `round` with `responses`.
    pub fn resume(
        parked: &Arc<Parked>,
        id: &str,
        round: u64,
        binding: &Binding,
        responses: Option<&Value>,
    ) -> Option<Remote> {
        let cluster = parked.cluster.clone()?;
        let owner = Parked::owner_of(id)?;
        let corr = crate::cluster::random_id();
        let (tx, rx) = mpsc::channel(64);
        crate::sync::lock(&parked.driving).insert(corr.clone(), tx.clone());
        let note = Note::Resume {
            corr: corr.clone(),
            reply_to: cluster.replica.clone(),
            call: id.to_owned(),
            round,
            method: binding.method.as_str().to_owned(),
            target: binding.target.clone(),
            principal: binding.principal.clone(),
            responses: responses.map(Value::to_string),
        };
        let to = owner.clone();
        debug!(call = %id, replica = %owner, "resuming a call parked on another replica");
        let gone = tx;
        crate::background::spawn(async move {
            if cluster.publish(To::Replica(&to), note).await == Some(0) {
                // Nobody listens there: the replica died, and the call with it.
                let why = format!("its replica {to} is gone");
                let _ = gone.try_send(Step::Gone { why });
            }
        });
        Some(Remote {
            rx,
            corr,
            owner,
            call: id.to_owned(),
            parked: parked.clone(),
            over: false,
        })
    }

    /// The next step, as a local call's.
    pub async fn next(&mut self) -> Local {
        loop {
            let step = match tokio::time::timeout(QUIET, self.rx.recv()).await {
                Ok(Some(step)) => step,
                _ => {
                    self.over = true;
                    let e = Error::gateway(format!(
                        "the replica {} holding this call went away before it finished",
                        self.owner
                    ));
                    return Local::Done(Some(e.into()));
                }
            };
            return match step {
                Step::Alive => continue,
                Step::Related { line } => Local::Related(Bytes::from(line)),
                Step::Done { response } => {
                    self.over = true;
                    let out = response.and_then(|r| match Kind::parse(r.as_bytes()) {
                        Ok(Kind::Response { outcome, .. }) => Some(outcome),
                        _ => None,
                    });
                    Local::Done(out)
                }
                Step::Input { requests } => {
                    self.over = true;
                    let requests: Map<String, Value> = serde_json::from_str(&requests).unwrap_or_default();
                    Local::InputRequired(requests)
                }
                Step::Gone { why } => {
                    self.over = true;
                    tracing::warn!(call = %self.call, reason = %why, "requestState refused by the call's replica");
                    Local::Done(Some(super::results::invalid_state().into()))
                }
            };
        }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        crate::sync::lock(&self.parked.driving).remove(&self.corr);
        if self.over {
            return;
        }
        // The client went away mid-round: the call's replica drops the call (which
        // cancels it downstream), as a local round would.
        if let Some(cluster) = self.parked.cluster.clone() {
            let (to, call) = (self.owner.clone(), self.call.clone());
            crate::background::spawn(async move {
                cluster.publish(To::Replica(&to), Note::Abandon { call }).await;
            });
        }
    }
}

/// Handles the bus's notes about parked calls (this replica's, and those it drives).
pub fn handle(parked: &Arc<Parked>, note: Note) {
    match note {
        Note::Step { corr, step } => {
            let tx = crate::sync::lock(&parked.driving).get(&corr).cloned();
            if let Some(tx) = tx {
                let _ = tx.try_send(step);
            }
        }
        Note::Abandon { call } => {
            if let Some(stop) = crate::sync::lock(&parked.serving).remove(&call) {
                stop.cancel();
            }
        }
        Note::Resume {
            corr,
            reply_to,
            call,
            round,
            method,
            target,
            principal,
            responses,
        } => {
            let binding = Binding {
                method: Method::parse(&method),
                target,
                principal,
            };
            let parked = parked.clone();
            crate::background::spawn(async move {
                drive(parked, corr, reply_to, call, round, binding, responses).await;
            });
        }
        _ => {}
    }
}

/// Resumes round `round` of this replica's call `id` for another replica's retry, and
/// drives it to its outcome or next questions, reporting each step.
async fn drive(
    parked: Arc<Parked>,
    corr: String,
    reply_to: String,
    id: String,
    round: u64,
    binding: Binding,
    responses: Option<String>,
) {
    let Some(cluster) = parked.cluster.clone() else { return };
    let send = |step: Step| {
        let (cluster, to, corr) = (cluster.clone(), reply_to.clone(), corr.clone());
        async move {
            cluster.publish(To::Replica(&to), Note::Step { corr, step }).await;
        }
    };
    let mut call: Call = match parked.take(&id, round, &binding) {
        Ok(c) => c,
        Err(why) => return send(Step::Gone { why: why.to_owned() }).await,
    };
    let responses: Option<Value> = responses.and_then(|r| serde_json::from_str(&r).ok());
    call.answer(responses.as_ref());
    let stop = CancellationToken::new();
    crate::sync::lock(&parked.serving).insert(id.clone(), stop.clone());
    let mut alive = tokio::time::interval(ALIVE);
    alive.tick().await;
    let last = loop {
        tokio::select! {
            step = call.next() => match step {
                Local::Related(m) => send(Step::Related { line: String::from_utf8_lossy(&m).into_owned() }).await,
                Local::Done(out) => {
                    let response = out.map(|o| String::from_utf8_lossy(&message::response(&Id::NULL, &o)).into_owned());
                    break Step::Done { response };
                }
                Local::InputRequired(requests) => {
                    let requests = Value::Object(requests).to_string();
                    crate::sync::lock(&parked.serving).remove(&id);
                    if parked.keep(id.clone(), round + 1, call) {
                        break Step::Input { requests };
                    }
                    let e: Outcome = Error::gateway("the server asked for input, but too many calls are waiting for input in mcp-gateway; try again later").into();
                    break Step::Done { response: Some(String::from_utf8_lossy(&message::response(&Id::NULL, &e)).into_owned()) };
                }
            },
            _ = alive.tick() => send(Step::Alive).await,
            () = stop.cancelled() => {
                debug!(call = %id, "the retry's replica gave up on the call; dropping it");
                return;
            }
        }
    };
    crate::sync::lock(&parked.serving).remove(&id);
    send(last).await;
}
