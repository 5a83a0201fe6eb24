//! The bus between replicas: Redis pub/sub. Every replica listens on `P:bus` (to all)
//! and `P:r:{replica}` (to it alone). A message is `{MAC hex}.{json}`, the MAC made with
//! a key derived from the cluster key, so a message that makes a replica act (answer a
//! question, cancel a call, end a session) cannot be forged by whoever can only publish
//! to Redis.
//!
//! Pub/sub delivers at most once, to whoever listens at that moment. What must not be
//! lost lives in the keyspace; what rides the bus is idempotent (notifications) or has a
//! waiting owner that times out (a question's answer).

use super::Cluster;
use futures::StreamExt;
use ring::hmac;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// How often the listening connection is pinged: a Redis that went away silently is
/// noticed within this (plus the command timeout).
const PING_EVERY: Duration = Duration::from_secs(2);
/// Waits between attempts to listen again.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Messages from the bus waiting for the gateway to handle them.
const INBOX: usize = 1024;

/// Whom a list_changed is for (`catalog::view::Reach`), views by their encoded keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct WireReach {
    pub main: bool,
    #[serde(default)]
    pub changed: Vec<String>,
    #[serde(default)]
    pub known: Vec<String>,
}

/// What replicas tell each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Note {
    /// A message for session `sid`'s own stream (its GET stream), wherever it is held.
    Deliver { sid: String, line: String },
    /// A message for every session's stream (list_changed), or, with `reach`, for the
    /// sessions of the views it names.
    All {
        line: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reach: Option<WireReach>,
    },
    /// A client's answer to a question a server asked it (a JSON-RPC response).
    Answer { sid: String, line: String },
    /// `notifications/cancelled` of session `sid` (its params).
    Cancel { sid: String, params: Option<String> },
    /// Session `sid` sent `notifications/roots/list_changed`.
    RootsChanged { sid: String },
    /// Session `sid` ended (DELETE, expiry): replicas forget their copy.
    Ended { sid: String },
    /// Session `sid` opened a GET stream at `at` (ms since the epoch): a replica holding
    /// one opened before ends it (one GET stream per session, the newest).
    StreamOpened { sid: String, at: u64 },
    /// Session `sid` chose log level `rank`, and every downstream runs at `downstream`
    /// now when that changed. With `ack`, the receiver says `Applied` once both hold there.
    Level {
        sid: String,
        rank: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        downstream: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack: Option<Ack>,
    },
    /// Every downstream runs at log level `rank` now (from a replica before `Level` carried
    /// it; still understood, no longer sent).
    DownstreamLevel { rank: usize },
    /// What note `corr` asked for holds on the replica that sends this.
    Applied { corr: String },
    /// Some session subscribed to `uri` of `server` (`on`), or the last one left. With
    /// `ack`, the receiver says `Applied` once its downstream followed.
    Subscription {
        server: String,
        uri: String,
        on: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack: Option<Ack>,
    },
    /// To the replica holding parked call `call`: a retry landed on `reply_to`; resume
    /// round `round` with these answers (see `stateless::remote`).
    Resume {
        corr: String,
        reply_to: String,
        call: String,
        round: u64,
        method: String,
        target: String,
        principal: String,
        responses: Option<String>,
    },
    /// A step of the resumed call `corr`, for the retry's replica.
    Step {
        corr: String,
        step: crate::stateless::remote::Step,
    },
    /// The retry's (or forwarded call's) client went away: drop the call.
    Abandon { call: String },
    /// To the replica holding a session's process: run this call on it (see
    /// `router::forwarded`).
    Forward(Forwarded),
}

/// Where a replica answers [`Note::Applied`], and under which correlation id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    pub corr: String,
    pub reply_to: String,
}

/// A call sent to the replica holding session `sid`'s process of `server`; its steps go
/// to `reply_to` under `corr`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forwarded {
    pub corr: String,
    pub reply_to: String,
    pub sid: String,
    pub server: String,
    pub method: String,
    pub params: String,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    from: String,
    /// When it was sent (ms since the epoch) and a random mark: a note seen before, or
    /// older than [`FRESH`], is dropped, so one copied off the bus cannot be played again
    /// (a forwarded call run twice, a question answered twice).
    #[serde(default)]
    at: u64,
    #[serde(default)]
    nonce: String,
    note: Note,
}

/// How far a note's time may be from this replica's clock (either way).
const FRESH: Duration = Duration::from_secs(30);

/// The notes seen in the last [`FRESH`], by nonce, to drop a replayed one.
#[derive(Default)]
struct Seen {
    marks: std::collections::HashMap<String, u64>,
    pruned: u64,
}

impl Seen {
    /// False when `nonce` was seen already (or the note is stale); records it otherwise.
    fn first(&mut self, nonce: &str, at: u64, now: u64) -> bool {
        let window = u64::try_from(FRESH.as_millis()).unwrap_or(u64::MAX);
        if nonce.is_empty() || at.abs_diff(now) > window {
            return false;
        }
        if now.saturating_sub(self.pruned) > window {
            self.marks.retain(|_, t| now.saturating_sub(*t) <= 2 * window);
            self.pruned = now;
        }
        self.marks.insert(nonce.to_owned(), at).is_none()
    }
}

/// The key's purpose (see [`Cluster::derive`]).
const PURPOSE: &str = "bus/1";

/// Where a note goes.
pub enum To<'a> {
    All,
    Replica(&'a str),
}

/// This replica's end of the bus.
pub struct Bus {
    key: hmac::Key,
}

impl Bus {
    pub fn new(root: &hmac::Key) -> Bus {
        Bus {
            key: super::derive(root, PURPOSE),
        }
    }

    /// Starts listening; notes from other replicas arrive on the receiver (a replica's own
    /// notes are not handed back to it).
    pub fn listen(cluster: &Arc<Cluster>) -> mpsc::Receiver<Note> {
        let (tx, rx) = mpsc::channel(INBOX);
        let key = cluster.bus.key.clone();
        let weak = Arc::downgrade(cluster);
        crate::background::spawn(async move {
            let mut wait = RETRY_MIN;
            let mut again = false;
            loop {
                let Some(cluster) = weak.upgrade() else { return };
                match listen(&cluster, &key, &tx, again).await {
                    Ok(()) => return,
                    Err(e) => {
                        cluster.failed(&e);
                        debug!(error = %e, "the bus connection ended; listening again");
                    }
                }
                drop(cluster);
                again = true;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
        });
        rx
    }

    /// Publishes `note`; how many replicas received it (`None`: Redis failed, and lost it).
    pub async fn publish(&self, cluster: &Cluster, to: To<'_>, note: Note) -> Option<u64> {
        let channel = match to {
            To::All => cluster.name("bus"),
            To::Replica(r) => cluster.name(&format!("r:{r}")),
        };
        let env = Envelope {
            from: cluster.replica.clone(),
            at: super::now_ms(),
            nonce: super::random_id(),
            note,
        };
        let json = serde_json::to_string(&env).unwrap_or_default();
        let tag = hmac::sign(&self.key, json.as_bytes());
        let payload = format!("{}.{json}", super::hex(tag.as_ref()));
        let mut conn = cluster.conn();
        let r: redis::RedisResult<u64> = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(payload)
            .query_async(&mut conn)
            .await;
        cluster.track(r).ok()
    }
}

/// Listens until the connection fails (`Err`) or the gateway is gone (`Ok`). Listening
/// `again`, the notes sent while nobody listened here are lost: the replica is told to
/// reconcile what it holds with Redis, as after an outage.
async fn listen(cluster: &Cluster, key: &hmac::Key, tx: &mpsc::Sender<Note>, again: bool) -> redis::RedisResult<()> {
    let timeout =
        |e: tokio::time::error::Elapsed| redis::RedisError::from((redis::ErrorKind::Io, "timed out", e.to_string()));
    let ps = tokio::time::timeout(super::REDIS_TIMEOUT, cluster.client().get_async_pubsub())
        .await
        .map_err(timeout)??;
    let (mut sink, mut stream) = ps.split();
    let all = cluster.name("bus");
    let own = cluster.name(&format!("r:{}", cluster.replica));
    tokio::time::timeout(super::REDIS_TIMEOUT, sink.subscribe(&[&all, &own]))
        .await
        .map_err(timeout)??;
    cluster.ok();
    if again {
        cluster.reconcile();
    }
    debug!(replica = %cluster.replica, "listening on the bus");
    let mut seen = Seen::default();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else {
                    return Err(redis::RedisError::from((redis::ErrorKind::Io, "the bus connection closed")));
                };
                let Some(note) = open(key, &cluster.replica, msg.get_payload_bytes(), &mut seen) else { continue };
                if tx.send(note).await.is_err() {
                    return Ok(());
                }
            }
            _ = ping.tick() => {
                // In subscribed mode PONG comes as an array: any answer will do.
                let pong: redis::RedisResult<redis::Value> = tokio::time::timeout(super::REDIS_TIMEOUT, sink.ping())
                    .await
                    .map_err(timeout)?;
                pong?;
            }
        }
    }
}

/// The note in `payload`, unless it fails to verify (logged), or is `replica`'s own.
fn open(key: &hmac::Key, replica: &str, payload: &[u8], seen: &mut Seen) -> Option<Note> {
    let text = std::str::from_utf8(payload).ok()?;
    let verified = text.split_once('.').and_then(|(tag, json)| {
        let tag = super::unhex(tag)?;
        hmac::verify(key, json.as_bytes(), &tag).ok()?;
        Some(json)
    });
    let Some(json) = verified else {
        warn!("a message on the bus does not verify with the cluster key; dropping it");
        return None;
    };
    let Ok(env) = serde_json::from_str::<Envelope>(json) else {
        // Sealed with the cluster key, but of a kind this replica does not know: a newer
        // replica's (a rolling upgrade), which older ones ignore.
        debug!("a note on the bus of a kind this replica does not know; ignoring it");
        return None;
    };
    if env.from == replica {
        return None;
    }
    if !seen.first(&env.nonce, env.at, super::now_ms()) {
        warn!(from = %env.from, "a note on the bus was seen before, or is stale; dropping it");
        return None;
    }
    Some(env.note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_open_only_with_the_key_once_fresh_and_not_for_their_sender() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"0123456789abcdef0123456789abcdef");
        let seal = |at: u64, nonce: &str| {
            let env = Envelope {
                from: "a".into(),
                at,
                nonce: nonce.into(),
                note: Note::Ended { sid: "s1".into() },
            };
            let json = serde_json::to_string(&env).unwrap();
            let tag = super::super::hex(hmac::sign(&key, json.as_bytes()).as_ref());
            format!("{tag}.{json}")
        };
        let now = super::super::now_ms();
        let payload = seal(now, "n1");
        let mut seen = Seen::default();
        assert_eq!(
            open(&key, "b", payload.as_bytes(), &mut seen),
            Some(Note::Ended { sid: "s1".into() })
        );
        assert_eq!(open(&key, "b", payload.as_bytes(), &mut seen), None, "played again");
        assert_eq!(open(&key, "a", seal(now, "n2").as_bytes(), &mut seen), None, "its own");
        let stale = seal(now - 60_000, "n3");
        assert_eq!(open(&key, "b", stale.as_bytes(), &mut seen), None, "stale");
        assert_eq!(open(&key, "b", seal(now, "").as_bytes(), &mut seen), None, "no mark");
        let forged = seal(now, "n4").replace("s1", "s2");
        assert_eq!(open(&key, "b", forged.as_bytes(), &mut seen), None);
        assert_eq!(open(&key, "b", b"not a note", &mut seen), None);
        // A newer replica's kind of note, sealed: ignored.
        let json = format!(r#"{{"from":"a","at":{now},"nonce":"n5","note":{{"t":"from_the_future"}}}}"#);
        let tag = super::super::hex(hmac::sign(&key, json.as_bytes()).as_ref());
        assert_eq!(open(&key, "b", format!("{tag}.{json}").as_bytes(), &mut seen), None);
    }
}
