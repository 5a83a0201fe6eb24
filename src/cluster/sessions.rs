//! Handshake-era sessions in Redis: a record per session, sealed with a key derived from
//! the cluster key, so any replica can serve a session it did not open, and nobody who can
//! only write to Redis can mint one or move one to another identity.
//!
//! The record is what a replica needs to serve the session: its owner (the identity's
//! name, compared with each request's), its share of the session limits, its protocol
//! version and the capabilities the client declared. It never changes once written; a
//! session's log level lives beside it (see [`crate::shared`]). It expires after
//! `session_idle`; replicas refresh it in the background for sessions they served since
//! the last refresh, so a request costs no Redis round trip for it.

use super::Cluster;
use ring::hmac;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::Duration;

/// What a replica needs to serve a session it did not open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    /// The principal of the identity that opened it (`None` without auth).
    pub owner: Option<String>,
    /// Whose share of `gateway.max_sessions_per_client` it is.
    pub share: String,
    #[serde(rename = "protocolVersion")]
    pub protocol_version: String,
    /// The capabilities of the client's `initialize`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub capabilities: Option<Map<String, Value>>,
    /// The view of the endpoint it was opened on (`ViewKey::encode`); none: the whole
    /// catalog. The session is served on that endpoint only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub view: Option<String>,
}

/// The sealing key's purpose (see [`Cluster::derive`]).
const PURPOSE: &str = "session-record/1";

fn signed(id: &str, json: &str) -> Vec<u8> {
    format!("mcp-gateway/session/1\n{id}\n{json}").into_bytes()
}

impl Record {
    /// `{MAC hex}.{json}`.
    pub fn seal(&self, key: &hmac::Key) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        let tag = hmac::sign(key, &signed(&self.id, &json));
        format!("{}.{json}", super::hex(tag.as_ref()))
    }

    /// The record sealed in `text` for session `id`; `None` when it does not verify (or is
    /// another session's).
    pub fn open(key: &hmac::Key, id: &str, text: &str) -> Option<Record> {
        let (tag, json) = text.split_once('.')?;
        let tag = super::unhex(tag)?;
        hmac::verify(key, &signed(id, json), &tag).ok()?;
        let r: Record = serde_json::from_str(json).ok()?;
        (r.id == id).then_some(r)
    }
}

/// The sessions' side of Redis.
pub struct Sessions {
    key: hmac::Key,
}

impl Sessions {
    pub fn new(root: &hmac::Key) -> Sessions {
        Sessions {
            key: super::derive(root, PURPOSE),
        }
    }

    fn name(cluster: &Cluster, id: &str) -> String {
        // Session ids are bearer-like: the key names a hash of the id, not the id.
        Self::key_of_digest(cluster, &super::digest(id))
    }

    /// The key of the record of the session whose id's SHA-256 is `digest`.
    pub fn key_of_digest(cluster: &Cluster, digest: &str) -> String {
        cluster.name(&format!("session:{digest}"))
    }

    /// The mark that session `id` ended (see [`Sessions::delete`]).
    fn tombstone(cluster: &Cluster, id: &str) -> String {
        cluster.name(&format!("ended:{}", super::digest(id)))
    }

    /// Stores a new session's record for `ttl`.
    pub async fn save(&self, cluster: &Cluster, r: &Record, ttl: Duration) -> redis::RedisResult<()> {
        let mut conn = cluster.conn();
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let out: redis::RedisResult<()> = redis::cmd("SET")
            .arg(Self::name(cluster, &r.id))
            .arg(r.seal(&self.key))
            .arg("PX")
            .arg(ms)
            .query_async(&mut conn)
            .await;
        cluster.track(out)
    }

    /// Stores records again where they are missing (after Redis lost its data), unless
    /// their session ended: [`Restored::Ended`] when a replica ended it, whose note on the
    /// bus this replica may have missed (pub/sub is at most once). One pipeline, one
    /// answer per record, in order.
    pub async fn restore(
        &self,
        cluster: &Cluster,
        records: &[Record],
        ttl: Duration,
    ) -> redis::RedisResult<Vec<Restored>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut pipe = redis::pipe();
        for r in records {
            pipe.cmd("EVAL")
                .arg(RESTORE)
                .arg(2)
                .arg(Self::name(cluster, &r.id))
                .arg(Self::tombstone(cluster, &r.id))
                .arg(r.seal(&self.key))
                .arg(ms);
        }
        let mut conn = cluster.conn();
        let out: redis::RedisResult<Vec<i64>> = pipe.query_async(&mut conn).await;
        Ok(cluster
            .track(out)?
            .into_iter()
            .map(|n| match n {
                -1 => Restored::Ended,
                1 => Restored::Written,
                _ => Restored::There,
            })
            .collect())
    }

    /// The record of session `id`: `Ok(None)` when there is none, or it does not verify
    /// (logged: someone wrote to Redis who should not have).
    pub async fn load(&self, cluster: &Cluster, id: &str) -> redis::RedisResult<Option<Record>> {
        let mut conn = cluster.conn();
        let text: redis::RedisResult<Option<String>> = redis::cmd("GET")
            .arg(Self::name(cluster, id))
            .query_async(&mut conn)
            .await;
        let Some(text) = cluster.track(text)? else {
            return Ok(None);
        };
        let r = Record::open(&self.key, id, &text);
        if r.is_none() {
            tracing::warn!("a session record in Redis does not verify with the cluster key; refusing it");
        }
        Ok(r)
    }

    /// Forgets session `id`, leaving a tombstone for `ttl` (at least [`TOMBSTONE_MIN`]):
    /// a replica that missed the bus's note that it ended finds it there, rather than
    /// serving its copy on or writing the record back.
    pub async fn delete(&self, cluster: &Cluster, id: &str, ttl: Duration) -> redis::RedisResult<()> {
        let mut conn = cluster.conn();
        let ms = u64::try_from(ttl.max(TOMBSTONE_MIN).as_millis()).unwrap_or(u64::MAX);
        let out: redis::RedisResult<()> = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(Self::name(cluster, id))
            .ignore()
            .cmd("SET")
            .arg(Self::tombstone(cluster, id))
            .arg("1")
            .arg("PX")
            .arg(ms)
            .ignore()
            .query_async(&mut conn)
            .await;
        cluster.track(out)
    }

    /// Extends the records of sessions `ids` to `ttl` from now (one pipeline); for each,
    /// whether its record was there.
    pub async fn touch(&self, cluster: &Cluster, ids: &[String], ttl: Duration) -> redis::RedisResult<Vec<bool>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("PEXPIRE").arg(Self::name(cluster, id)).arg(ms);
        }
        let mut conn = cluster.conn();
        let out: redis::RedisResult<Vec<i64>> = pipe.query_async(&mut conn).await;
        cluster.track(out).map(|v| v.into_iter().map(|n| n == 1).collect())
    }
}

/// What [`Sessions::restore`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The record was missing, and is written again.
    Written,
    /// The record was there.
    There,
    /// A replica ended the session: its copies must go.
    Ended,
}

/// The shortest life of a tombstone: longer than the janitor's longest wait between two
/// refreshes (a minute), so a replica that missed the note finds it.
pub const TOMBSTONE_MIN: Duration = Duration::from_secs(300);

/// KEYS[1] the record, KEYS[2] its tombstone; ARGV[1] the sealed record, ARGV[2] its
/// life in ms. -1: ended; 1: written again; 0: there already.
const RESTORE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_opens_only_untouched_and_for_its_own_id() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"0123456789abcdef0123456789abcdef");
        let r = Record {
            id: "s1".into(),
            owner: Some("alice".into()),
            share: "client 'alice'".into(),
            protocol_version: "2025-11-25".into(),
            capabilities: None,
            view: Some("profile:frontend".into()),
        };
        let sealed = r.seal(&key);
        assert_eq!(Record::open(&key, "s1", &sealed), Some(r.clone()));
        assert_eq!(Record::open(&key, "s2", &sealed), None, "another session's");
        let forged = sealed.replace("alice", "bob__");
        assert_eq!(Record::open(&key, "s1", &forged), None, "another owner");
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"another key of thirty-two bytes!");
        assert_eq!(Record::open(&other, "s1", &sealed), None, "another cluster's");
        assert_eq!(Record::open(&key, "s1", "zz.{}"), None);
        assert_eq!(Record::open(&key, "s1", ""), None);
    }
}
