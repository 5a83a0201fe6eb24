//! What the gateway keeps across sessions, with one owner: the resource subscriptions
//! (refcounted per server and URI), the log levels sessions asked for and the one the
//! downstreams run at, and the tasks sessions created (2025-11-25).
//!
//! Callers ask [`Shared`] through named async methods and get owned answers: nothing hands
//! out a lock or a reference into its maps, and sessions are named by id, never held.
//! In one process everything is in memory. In cluster mode ([`Shared::join`]) the
//! subscriptions and log levels live in Redis, where every replica sees them, with
//! sessions named by the SHA-256 of their id ([`Shared::key`]); while Redis is down the
//! in-memory maps stand in (per replica). Each replica also keeps what sessions did
//! through it, to put back into a Redis that lost it ([`Shared::restore_held`]), and the
//! janitor sweeps what sessions whose record expired left ([`Shared::sweep`]). Tasks stay in memory: a task lives in one
//! replica's downstream. Delivering to a session is not its business: the router keeps
//! the sessions that live in this process.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a public task id leads, and whose task it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRoute {
    pub server: Arc<str>,
    /// The downstream's own task id.
    pub task_id: String,
    /// The session that created it.
    pub owner: String,
    /// Cluster mode: the replica whose downstream holds it (`None`: this one).
    pub replica: Option<String>,
}

/// A task's route as Redis keeps it (cluster mode): the session as its digest.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredTask {
    server: String,
    task_id: String,
    owner: String,
    replica: String,
}

/// The sealing key's purpose (see `Cluster::derive`).
const TASK_PURPOSE: &str = "task-route/1";

/// How long a task's route is kept in Redis (tasks outliving this are not found elsewhere).
const TASK_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// The public id of a downstream's task: its own, namespaced by its server. It is a key
/// in the task table, never split to route.
pub fn public_task_id(server: &str, task_id: &str) -> String {
    format!("{server}/{task_id}")
}

/// The key of a task of a server with a process per caller: its public id and its owner
/// (a NUL never ends a public id's text as a client could write it into a lookup).
fn owned_key(public: &str, owner: &str) -> String {
    format!("{public}\0{owner}")
}

/// The cross-session state (see the module doc).
#[derive(Default)]
pub struct Shared {
    inner: Mutex<Inner>,
    cluster: std::sync::OnceLock<Arc<Cluster>>,
    /// Cluster mode: the mark of the Redis dataset this replica last saw (`P:epoch`); another
    /// one means Redis lost its data (see [`Shared::restore_held`]).
    epoch: Mutex<Option<String>>,
}

/// Cluster mode: what sessions did through this replica (their subscriptions and level),
/// kept beside Redis so it can be put back when Redis lost it.
#[derive(Default)]
struct Held {
    subs: HashSet<(Arc<str>, String)>,
    level: Option<usize>,
    /// Unsubscribes that did not reach Redis (it was unreachable).
    dropped: HashSet<(Arc<str>, String)>,
    /// A change did not reach Redis (it was unreachable): written once it is back.
    pending: bool,
}

use crate::cluster::{digest, Cluster};
use redis::AsyncCommands;

/// The level downstreams run at, when a session chose one: its rank.
const DOWNSTREAM_LEVEL: &str = "downstream-level";

/// The set of the sessions (digests) that have subscriptions or a level in Redis: what
/// [`Shared::sweep`] looks through for sessions whose record is gone.
const WITH_STATE: &str = "with-state";

/// The longest URI a session may subscribe to (bytes).
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// The most subscriptions one session may hold: as many URIs as one 2026-07-28
/// `subscriptions/listen` stream may name (its URIs are its client's subscriptions).
pub const MAX_SUBSCRIPTIONS: usize = crate::stateless::listen::MAX_URIS;

/// A session holds [`MAX_SUBSCRIPTIONS`] already: no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManySubscriptions;

/// Subscribes a session, unless it holds `ARGV[4]` subscriptions already (-1).
/// `KEYS`: the URI's subscribers, the server's URIs, the session's subscriptions, the
/// sessions with state; `ARGV`: the session's digest, the URI, its member, the maximum.
/// 1: the first subscriber to the URI; 0: not the first.
static SUBSCRIBE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 0 and redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[4]) then
  return -1
end
local added = redis.call('SADD', KEYS[1], ARGV[1])
local n = redis.call('SCARD', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[2], 1)
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[1])
if added == 1 and n == 1 then return 1 end
return 0
",
    )
});

/// What [`Shared::sweep`] removed of sessions whose record expired.
#[derive(Debug, Default)]
pub struct Swept {
    /// Sessions whose subscriptions and level were removed.
    pub sessions: usize,
    /// (server, uri) pairs nobody is subscribed to any more.
    pub unneeded: Vec<(Arc<str>, String)>,
    /// The level downstreams run at now, when it changed.
    pub level: Option<usize>,
}

#[derive(Default)]
struct Inner {
    /// (server, uri) → the sessions subscribed. The downstream is subscribed while at
    /// least one session is.
    subscriptions: HashMap<(Arc<str>, String), HashSet<String>>,
    /// The level each session chose (an index into `downstream::LOG_LEVELS`).
    log_levels: HashMap<String, usize>,
    /// The level every downstream now runs at: the most verbose any session wants.
    downstream_log: Option<usize>,
    /// Public task id → its route.
    tasks: HashMap<String, TaskRoute>,
    /// Cluster mode: by session id, what sessions did through this replica.
    held: HashMap<String, Held>,
}

impl Shared {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every critical section below leaves the maps consistent (see crate::sync).
        crate::sync::lock(&self.inner)
    }

    /// Cluster mode: from now on the state lives in Redis.
    pub fn join(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
    }

    /// How a session is named here and on the bus: its id in one process, the SHA-256 of
    /// its id in cluster mode (session ids are bearer-like; Redis never holds one).
    pub fn key(&self, session: &str) -> String {
        match self.cluster.get() {
            Some(_) => digest(session),
            None => session.to_owned(),
        }
    }

    /// Subscribes `session` to `uri` of `server`; true when it is the first subscriber
    /// (the downstream must be subscribed now; in cluster mode, every replica's). Refused
    /// when the session holds [`MAX_SUBSCRIPTIONS`] others already.
    pub async fn subscribe(&self, server: &Arc<str>, uri: &str, session: &str) -> Result<bool, TooManySubscriptions> {
        if let Some(c) = self.cluster.get() {
            let d = digest(session);
            let r: redis::RedisResult<i64> = subscribe_call(c, server, uri, &d).invoke_async(&mut c.conn()).await;
            let ok = c.track(r);
            let mut inner = self.inner();
            let held = inner.held.entry(session.to_owned()).or_default();
            match ok {
                Ok(n) if n < 0 => return Err(TooManySubscriptions),
                Ok(n) => {
                    held.subs.insert((server.clone(), uri.to_owned()));
                    return Ok(n == 1);
                }
                Err(_)
                    if held.subs.len() >= MAX_SUBSCRIPTIONS
                        && !held.subs.contains(&(server.clone(), uri.to_owned())) =>
                {
                    return Err(TooManySubscriptions)
                }
                Err(_) => {
                    held.dropped.remove(&(server.clone(), uri.to_owned()));
                    held.subs.insert((server.clone(), uri.to_owned()));
                    held.pending = true;
                }
            }
        }
        let mut inner = self.inner();
        let key = (server.clone(), uri.to_owned());
        let holds = inner.subscriptions.get(&key).is_some_and(|s| s.contains(session));
        if !holds && inner.subscriptions.values().filter(|s| s.contains(session)).count() >= MAX_SUBSCRIPTIONS {
            return Err(TooManySubscriptions);
        }
        let sessions = inner.subscriptions.entry(key).or_default();
        let first = sessions.is_empty();
        sessions.insert(session.to_owned());
        Ok(first)
    }

    /// Unsubscribes `session`; true when it was subscribed and was the last (the
    /// downstream may be unsubscribed now).
    pub async fn unsubscribe(&self, server: &Arc<str>, uri: &str, session: &str) -> bool {
        if let Some(c) = self.cluster.get() {
            let r = unsubscribe_in_redis(c, &mut c.conn(), server, uri, &digest(session)).await;
            if let Some(held) = self.inner().held.get_mut(session) {
                let pair = (server.clone(), uri.to_owned());
                held.subs.remove(&pair);
                if r.is_err() {
                    held.dropped.insert(pair);
                    held.pending = true;
                }
            }
            if let Ok(last) = r {
                return last;
            }
        }
        let mut inner = self.inner();
        let key = (server.clone(), uri.to_owned());
        let Some(sessions) = inner.subscriptions.get_mut(&key) else {
            return false;
        };
        if !sessions.remove(session) {
            return false;
        }
        let last = sessions.is_empty();
        if last {
            inner.subscriptions.remove(&key);
        }
        last
    }

    /// The sessions subscribed to `uri` of `server`, by [`key`](Shared::key).
    pub async fn subscribers(&self, server: &Arc<str>, uri: &str) -> Vec<String> {
        if let Some(c) = self.cluster.get() {
            let r: redis::RedisResult<Vec<String>> = c.conn().smembers(sub_key(c, server, uri)).await;
            if let Ok(v) = c.track(r) {
                return v;
            }
        }
        self.inner()
            .subscriptions
            .get(&(server.clone(), uri.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The URIs of `server` some session is subscribed to.
    pub async fn subscribed_uris(&self, server: &str) -> Vec<String> {
        if let Some(c) = self.cluster.get() {
            let r: redis::RedisResult<Vec<String>> = c.conn().hkeys(c.name(&format!("uris:{server}"))).await;
            if let Ok(v) = c.track(r) {
                return v;
            }
        }
        self.inner()
            .subscriptions
            .keys()
            .filter(|(s, _)| &**s == server)
            .map(|(_, uri)| uri.clone())
            .collect()
    }

    /// Records the level `session` chose. Returns the level the downstreams must run at
    /// now when that changed: the most verbose (lowest rank) any session wants.
    pub async fn set_log_level(&self, session: &str, rank: usize) -> Option<usize> {
        if let Some(c) = self.cluster.get() {
            let levels = c.name("levels");
            let mut conn = c.conn();
            let d = digest(session);
            let r: redis::RedisResult<(Vec<usize>,)> = redis::pipe()
                .hset(&levels, &d, rank)
                .ignore()
                .sadd(c.name(WITH_STATE), &d)
                .ignore()
                .hvals(&levels)
                .query_async(&mut conn)
                .await;
            let r = c.track(r);
            {
                let mut inner = self.inner();
                let held = inner.held.entry(session.to_owned()).or_default();
                held.level = Some(rank);
                held.pending |= r.is_err();
            }
            if let Ok((ranks,)) = r {
                let wanted = ranks.into_iter().min()?;
                return match swap_level(c, &mut conn, wanted).await {
                    Ok(false) => None,
                    _ => Some(wanted),
                };
            }
        }
        let mut inner = self.inner();
        inner.log_levels.insert(session.to_owned(), rank);
        let wanted = inner.log_levels.values().copied().min();
        if wanted == inner.downstream_log {
            return None;
        }
        inner.downstream_log = wanted;
        wanted
    }

    /// The level the downstreams run at, once some session chose one.
    pub async fn downstream_log_level(&self) -> Option<usize> {
        if let Some(c) = self.cluster.get() {
            let r: redis::RedisResult<Option<usize>> = c.conn().get(c.name(DOWNSTREAM_LEVEL)).await;
            if let Ok(v) = c.track(r) {
                return v;
            }
        }
        self.inner().downstream_log
    }

    /// The level session `session` chose, if any (cluster mode: for a replica that serves
    /// a session another one opened).
    pub async fn log_level_of(&self, session: &str) -> Option<usize> {
        if let Some(c) = self.cluster.get() {
            let r: redis::RedisResult<Option<usize>> = c.conn().hget(c.name("levels"), digest(session)).await;
            if let Ok(v) = c.track(r) {
                return v;
            }
        }
        self.inner().log_levels.get(session).copied()
    }

    /// Cluster mode: the levels the sessions whose keys ([`Shared::key`]) are `keys`
    /// chose, as Redis has them, in order (none where a session chose none, and for every
    /// key when Redis does not answer or this is not a cluster).
    pub async fn log_levels_by_key(&self, keys: &[&str]) -> Vec<Option<usize>> {
        let Some(c) = self.cluster.get().filter(|_| !keys.is_empty()) else {
            return vec![None; keys.len()];
        };
        let r: redis::RedisResult<Vec<Option<usize>>> = redis::cmd("HMGET")
            .arg(c.name("levels"))
            .arg(keys)
            .query_async(&mut c.conn())
            .await;
        match c.track(r) {
            Ok(v) if v.len() == keys.len() => v,
            _ => vec![None; keys.len()],
        }
    }

    /// Records a task a server created for session `owner`; returns its public id.
    /// `own_process`: the server runs a process (or connection) per caller, whose task
    /// ids are its own, so two callers' processes may both say `task-1`: such a route is
    /// kept under its owner too, and one caller's task never takes another's place.
    pub async fn add_task(&self, server: &Arc<str>, task_id: &str, owner: &str, own_process: bool) -> String {
        let public = public_task_id(server, task_id);
        let key = if own_process {
            owned_key(&public, owner)
        } else {
            public.clone()
        };
        let route = TaskRoute {
            server: server.clone(),
            task_id: task_id.to_owned(),
            owner: owner.to_owned(),
            replica: None,
        };
        self.inner().tasks.insert(key.clone(), route.clone());
        if let Some(c) = self.cluster.get() {
            store_task(c, &key, &public, &route).await;
        }
        public
    }

    /// The task `public` of session `owner`, if it exists and is that session's.
    pub async fn task(&self, public: &str, owner: &str) -> Option<TaskRoute> {
        let owned = owned_key(public, owner);
        let here = {
            let inner = self.inner();
            inner
                .tasks
                .get(public)
                .filter(|r| r.owner == owner)
                .or_else(|| inner.tasks.get(&owned).filter(|r| r.owner == owner))
                .cloned()
        };
        if here.is_some() {
            return here;
        }
        let c = self.cluster.get()?;
        let keys = [
            c.name(&format!("task:{}", digest(public))),
            c.name(&format!("task:{}", digest(&owned))),
        ];
        let r: redis::RedisResult<Vec<Option<String>>> =
            redis::cmd("MGET").arg(&keys[..]).query_async(&mut c.conn()).await;
        let found = c.track(r).ok()?;
        found
            .into_iter()
            .flatten()
            .find_map(|text| self.verified_task(c, public, owner, &text))
    }

    /// A task route read from Redis, if its seal verifies and `owner` owns it.
    fn verified_task(&self, c: &crate::cluster::Cluster, public: &str, owner: &str, text: &str) -> Option<TaskRoute> {
        let (tag, json) = text.split_once('.')?;
        let key = c.derive(TASK_PURPOSE);
        if ring::hmac::verify(
            &key,
            format!("{public}\n{json}").as_bytes(),
            &crate::cluster::unhex(tag)?,
        )
        .is_err()
        {
            tracing::warn!("a task route in Redis does not verify with the cluster key; refusing it");
            return None;
        }
        let stored: StoredTask = serde_json::from_str(json).ok()?;
        (stored.owner == digest(owner)).then(|| TaskRoute {
            server: stored.server.into(),
            task_id: stored.task_id,
            owner: owner.to_owned(),
            replica: (stored.replica != c.replica).then_some(stored.replica),
        })
    }

    /// The route of a downstream's task, by its server and own id.
    /// (A server with a process per caller has no one route by its own id: none.)
    pub async fn task_by_origin(&self, server: &str, task_id: &str) -> Option<TaskRoute> {
        self.inner().tasks.get(&public_task_id(server, task_id)).cloned()
    }

    /// A session ended: forgets its subscriptions, level and tasks. Returns the (server,
    /// uri) pairs no session is subscribed to any more (to unsubscribe downstream).
    pub async fn forget_session(&self, session: &str) -> Vec<(Arc<str>, String)> {
        // Redis forgets it here, or (Redis unreachable) by the janitor's sweep once its
        // record is deleted: nothing to put back.
        self.inner().held.remove(session);
        if let Some(c) = self.cluster.get() {
            if let Some(unneeded) = forget_in_redis(c, &[digest(session)]).await {
                let mut inner = self.inner();
                inner.tasks.retain(|_, r| r.owner != session);
                return unneeded;
            }
        }
        let mut inner = self.inner();
        inner.tasks.retain(|_, r| r.owner != session);
        inner.log_levels.remove(session);
        let mut unneeded = Vec::new();
        inner.subscriptions.retain(|key, sessions| {
            if sessions.remove(session) && sessions.is_empty() {
                unneeded.push(key.clone());
            }
            !sessions.is_empty()
        });
        unneeded
    }

    /// Cluster mode: this replica no longer holds a copy of `session` (it goes on
    /// elsewhere): what it did through this one is no longer this replica's to put back.
    pub fn forget_local(&self, session: &str) {
        self.inner().held.remove(session);
    }

    /// Cluster mode, each time Redis is back or the bus is listened to again: puts back
    /// what sessions did through this replica that Redis does not have. When Redis lost
    /// its data (a restart without persistence: `P:epoch` changed), every held session's
    /// subscriptions and level, and the routes of tasks created here; otherwise those of
    /// sessions whose changes failed while Redis was unreachable, Redis made to match what
    /// this replica holds. `None`: nothing to do, or Redis failed (tried again next time).
    pub async fn restore_held(&self) -> Option<Swept> {
        let c = self.cluster.get()?;
        let mut conn = c.conn();
        let fresh = crate::cluster::random_id();
        let r: redis::RedisResult<(Option<String>,)> = redis::pipe()
            .cmd("SET")
            .arg(c.name("epoch"))
            .arg(&fresh)
            .arg("NX")
            .ignore()
            .get(c.name("epoch"))
            .query_async(&mut conn)
            .await;
        let (now,) = c.track(r).ok()?;
        let lost = {
            let mut seen = crate::sync::lock(&self.epoch);
            let lost = seen.is_some() && *seen != now;
            seen.clone_from(&now);
            lost
        };
        // A session held here: its id, subscriptions, unsubscribes not written, level.
        type HeldCopy = (String, Vec<(Arc<str>, String)>, Vec<(Arc<str>, String)>, Option<usize>);
        let (sessions, tasks): (Vec<HeldCopy>, Vec<(String, TaskRoute)>) = {
            let inner = self.inner();
            let sessions = inner
                .held
                .iter()
                .filter(|(_, h)| lost || h.pending)
                .map(|(id, h)| {
                    let dropped = h.dropped.iter().cloned().collect();
                    (id.clone(), h.subs.iter().cloned().collect(), dropped, h.level)
                })
                .collect();
            let tasks = match lost {
                true => inner
                    .tasks
                    .iter()
                    .filter(|(_, r)| r.replica.is_none())
                    .map(|(k, r)| (k.clone(), r.clone()))
                    .collect(),
                false => Vec::new(),
            };
            (sessions, tasks)
        };
        for (key, route) in &tasks {
            let public = key.split('\0').next().unwrap_or(key);
            store_task(c, key, public, route).await;
        }
        if sessions.is_empty() {
            return None;
        }
        let mut out = Swept::default();
        for (id, subs, dropped, level) in sessions {
            let d = digest(&id);
            // Unsubscribes made while Redis was unreachable; then what this replica holds.
            for (server, uri) in &dropped {
                if unsubscribe_in_redis(c, &mut conn, server, uri, &d).await.ok()? {
                    out.unneeded.push((server.clone(), uri.clone()));
                }
            }
            for (server, uri) in &subs {
                let r: redis::RedisResult<i64> = subscribe_call(c, server, uri, &d).invoke_async(&mut conn).await;
                c.track(r).ok()?;
            }
            if let Some(rank) = level {
                let r: redis::RedisResult<()> = redis::pipe()
                    .hset(c.name("levels"), &d, rank)
                    .ignore()
                    .sadd(c.name(WITH_STATE), &d)
                    .ignore()
                    .query_async(&mut conn)
                    .await;
                c.track(r).ok()?;
            }
            if let Some(h) = self.inner().held.get_mut(&id) {
                h.pending = false;
                h.dropped.retain(|p| !dropped.contains(p));
            }
            out.sessions += 1;
        }
        out.level = self.settle_log_level().await;
        tracing::debug!(
            sessions = out.sessions,
            lost,
            "subscriptions and levels held here put back into Redis"
        );
        Some(out)
    }

    /// The level downstreams must run at now that sessions left: the most verbose any
    /// session still wants, when that changed (`None`: unchanged, or no session wants
    /// one; then the shared level is dropped, and downstreams stay where they are).
    pub async fn settle_log_level(&self) -> Option<usize> {
        if let Some(c) = self.cluster.get() {
            let mut conn = c.conn();
            let r: redis::RedisResult<Vec<usize>> = conn.hvals(c.name("levels")).await;
            let ranks = c.track(r).ok()?;
            let Some(wanted) = ranks.into_iter().min() else {
                let r: redis::RedisResult<()> = conn.del(c.name(DOWNSTREAM_LEVEL)).await;
                let _ = c.track(r);
                return None;
            };
            return swap_level(c, &mut conn, wanted)
                .await
                .ok()
                .filter(|c| *c)
                .map(|_| wanted);
        }
        let mut inner = self.inner();
        let wanted = inner.log_levels.values().copied().min();
        if wanted == inner.downstream_log {
            return None;
        }
        inner.downstream_log = wanted;
        wanted
    }

    /// Cluster mode: removes the subscriptions and levels of sessions whose record is gone
    /// from Redis (it expired: nobody used the session for `session_idle`, whichever
    /// replicas served it, or they died), so nothing a session wrote outlives it. Any
    /// replica may sweep; one at a time does (a lock for `every`; a sweep stops after half
    /// of it, and the next goes on). `None`: nothing swept
    /// (no cluster, another replica's turn, or Redis failed).
    pub async fn sweep(&self, every: std::time::Duration) -> Option<Swept> {
        let c = self.cluster.get()?;
        let mut conn = c.conn();
        let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        let turn: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(c.name("sweeping"))
            .arg(&c.replica)
            .arg("NX")
            .arg("PX")
            .arg(ms)
            .query_async(&mut conn)
            .await;
        c.track(turn).ok()??;
        // Sessions with state, and levels written before `with-state` was kept, a page at a
        // time (SSCAN, HSCAN): a cluster with many sessions neither blocks Redis on one
        // reply of them all nor holds them all here. A digest met twice is looked at twice,
        // which changes nothing.
        // A sweep ends within half its turn, so that the next one (here or on another
        // replica) does not go over the same sessions at once; what is left waits for it.
        let mut swept = Swept::default();
        let now = crate::cluster::now_ms();
        let until = std::time::Instant::now() + every / 2;
        for (scan, key) in [("SSCAN", c.name(WITH_STATE)), ("HSCAN", c.name("levels"))] {
            let mut cursor = 0u64;
            loop {
                if std::time::Instant::now() >= until {
                    break;
                }
                let r: redis::RedisResult<(u64, Vec<String>)> = redis::cmd(scan)
                    .arg(&key)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(SWEEP_PAGE)
                    .query_async(&mut conn)
                    .await;
                let (next, mut page) = c.track(r).ok()?;
                if scan == "HSCAN" {
                    // Field, value, field, value: the fields are the digests.
                    page = page.into_iter().step_by(2).collect();
                }
                page.sort();
                page.dedup();
                sweep_page(c, &mut conn, &page, (now, ms), &mut swept).await?;
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        if swept.sessions > 0 {
            swept.level = self.settle_log_level().await;
        }
        Some(swept)
    }
}

/// Sessions swept from Redis per SSCAN page (a hint to Redis, which may return more).
const SWEEP_PAGE: usize = 256;

/// One page of [`Shared::sweep`]: the digests whose session record is gone, at two sweeps
/// `every` (ms) apart, lose their subscriptions and level. `None`: Redis failed.
async fn sweep_page(
    c: &Cluster,
    conn: &mut redis::aio::ConnectionManager,
    digests: &[String],
    (now, ms): (u64, u64),
    swept: &mut Swept,
) -> Option<()> {
    if digests.is_empty() {
        return Some(());
    }
    let mut pipe = redis::pipe();
    for d in digests {
        pipe.exists(crate::cluster::sessions::Sessions::key_of_digest(c, d));
    }
    let r: redis::RedisResult<Vec<bool>> = pipe.query_async(conn).await;
    let there = c.track(r).ok()?;
    let (mut back, mut gone): (Vec<&String>, Vec<&String>) = (Vec::new(), Vec::new());
    for (d, there) in digests.iter().zip(there) {
        if there {
            back.push(d);
        } else {
            gone.push(d);
        }
    }
    // A record missing at one sweep only may be on its way back (Redis restarted empty,
    // and the replica holding the session writes it again): a session's state goes once
    // its record was missing at two sweeps `every` apart.
    let missing = c.name("missing");
    let mut pipe = redis::pipe();
    for d in &gone {
        pipe.hset_nx(&missing, *d, now).ignore().hget(&missing, *d);
    }
    if !back.is_empty() {
        pipe.hdel(&missing, back).ignore();
    }
    let r: redis::RedisResult<Vec<Option<u64>>> = pipe.query_async(conn).await;
    let since = c.track(r).ok()?;
    let due: Vec<&String> = gone
        .iter()
        .zip(since)
        .filter(|(_, since)| now.saturating_sub(since.unwrap_or(now)) >= ms)
        .map(|(d, _)| *d)
        .collect();
    if due.is_empty() {
        return Some(());
    }
    swept.unneeded.extend(forget_in_redis(c, &due).await?);
    let r: redis::RedisResult<()> = conn.hdel(&missing, &due).await;
    let _ = c.track(r);
    swept.sessions += due.len();
    Some(())
}

/// Stores the route of a task created here under its key (`key`: its public id, with its
/// owner for a process per caller), sealed: other replicas reach it through this one (its
/// downstream holds it). Best effort (a Redis that lost it gets it again, see
/// [`Shared::restore_held`]).
async fn store_task(c: &Cluster, key: &str, public: &str, route: &TaskRoute) {
    let stored = StoredTask {
        server: route.server.to_string(),
        task_id: route.task_id.clone(),
        owner: digest(&route.owner),
        replica: c.replica.clone(),
    };
    // Sealed: a task's route decides whose its results are.
    let json = serde_json::to_string(&stored).unwrap_or_default();
    let tag = ring::hmac::sign(&c.derive(TASK_PURPOSE), format!("{public}\n{json}").as_bytes());
    let json = format!("{}.{json}", crate::cluster::hex(tag.as_ref()));
    let r: redis::RedisResult<()> = redis::cmd("SET")
        .arg(c.name(&format!("task:{}", digest(key))))
        .arg(json)
        .arg("PX")
        .arg(TASK_TTL_MS)
        .query_async(&mut c.conn())
        .await;
    let _ = c.track(r);
}

/// Sets the level downstreams run at to `wanted` with SET … GET, so exactly one replica
/// sees the change: whether it was another before.
async fn swap_level(c: &Cluster, conn: &mut redis::aio::ConnectionManager, wanted: usize) -> redis::RedisResult<bool> {
    let before: redis::RedisResult<Option<usize>> = redis::cmd("SET")
        .arg(c.name(DOWNSTREAM_LEVEL))
        .arg(wanted)
        .arg("GET")
        .query_async(conn)
        .await;
    c.track(before).map(|b| b != Some(wanted))
}

/// Unsubscribes session digest `d` from `uri` of `server` in Redis: whether it was
/// subscribed and the last subscriber (the server's URI is then forgotten too).
async fn unsubscribe_in_redis(
    c: &Cluster,
    conn: &mut redis::aio::ConnectionManager,
    server: &str,
    uri: &str,
    d: &str,
) -> redis::RedisResult<bool> {
    let key = sub_key(c, server, uri);
    let r: redis::RedisResult<(u64, u64)> = redis::pipe()
        .atomic()
        .srem(&key, d)
        .scard(&key)
        .srem(c.name(&format!("subs-of:{d}")), member(server, uri))
        .ignore()
        .query_async(conn)
        .await;
    let last = matches!(c.track(r)?, (1, 0));
    if last {
        let r: redis::RedisResult<()> = conn.hdel(c.name(&format!("uris:{server}")), uri).await;
        let _ = c.track(r);
    }
    Ok(last)
}

/// The [`SUBSCRIBE`] script for session digest `d`'s subscription to `uri` of `server`.
fn subscribe_call(c: &Cluster, server: &str, uri: &str, d: &str) -> redis::ScriptInvocation<'static> {
    let mut call = SUBSCRIBE.prepare_invoke();
    call.key(sub_key(c, server, uri))
        .key(c.name(&format!("uris:{server}")))
        .key(c.name(&format!("subs-of:{d}")))
        .key(c.name(WITH_STATE))
        .arg(d)
        .arg(uri)
        .arg(member(server, uri))
        .arg(MAX_SUBSCRIPTIONS);
    call
}

/// The Redis set of the sessions subscribed to `uri` of `server`.
fn sub_key(c: &Cluster, server: &str, uri: &str) -> String {
    c.name(&format!("sub:{}", digest(&member(server, uri))))
}

/// `(server, uri)` as one string (a server name cannot hold a newline).
fn member(server: &str, uri: &str) -> String {
    format!("{server}\n{uri}")
}

/// Drops sessions' subscriptions and levels from Redis, the sessions named by their
/// digests `ds`, in three round trips however many they are; the (server, uri) pairs
/// nobody is subscribed to any more. `None`: Redis failed.
async fn forget_in_redis<D: AsRef<str>>(c: &Cluster, ds: &[D]) -> Option<Vec<(Arc<str>, String)>> {
    if ds.is_empty() {
        return Some(Vec::new());
    }
    let mut conn = c.conn();
    let of = |d: &str| c.name(&format!("subs-of:{d}"));
    let mut pipe = redis::pipe();
    for d in ds {
        pipe.smembers(of(d.as_ref()));
    }
    let r: redis::RedisResult<Vec<Vec<String>>> = pipe.query_async(&mut conn).await;
    let members = c.track(r).ok()?;
    let pairs: Vec<(&str, &str, &str)> = ds
        .iter()
        .zip(&members)
        .flat_map(|(d, ms)| {
            ms.iter()
                .filter_map(move |m| m.split_once('\n').map(|(server, uri)| (d.as_ref(), server, uri)))
        })
        .collect();
    let mut unneeded = Vec::new();
    if !pairs.is_empty() {
        // Each SREM and the SCARD after it in one transaction: the last subscriber is
        // known for certain.
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (d, server, uri) in &pairs {
            let key = sub_key(c, server, uri);
            pipe.srem(&key, *d).scard(&key);
        }
        let r: redis::RedisResult<Vec<u64>> = pipe.query_async(&mut conn).await;
        let counts = c.track(r).ok()?;
        for ((_, server, uri), n) in pairs.iter().zip(counts.chunks_exact(2)) {
            if n == [1, 0] {
                unneeded.push((Arc::from(*server), (*uri).to_owned()));
            }
        }
    }
    let mut pipe = redis::pipe();
    for (server, uri) in &unneeded {
        pipe.hdel(c.name(&format!("uris:{server}")), uri).ignore();
    }
    for d in ds {
        let d = d.as_ref();
        pipe.del(of(d))
            .ignore()
            .hdel(c.name("levels"), d)
            .ignore()
            .srem(c.name(WITH_STATE), d)
            .ignore();
    }
    let r: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
    c.track(r).ok()?;
    Some(unneeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscriptions_are_refcounted_and_forgotten_with_their_session() {
        let s = Shared::default();
        let calc: Arc<str> = "calc".into();
        assert_eq!(s.subscribe(&calc, "a://1", "s1").await, Ok(true));
        assert_eq!(s.subscribe(&calc, "a://1", "s2").await, Ok(false));
        assert!(!s.unsubscribe(&calc, "a://1", "s3").await, "never subscribed");
        assert!(!s.unsubscribe(&calc, "a://1", "s1").await);
        assert_eq!(s.subscribers(&calc, "a://1").await, vec!["s2".to_owned()]);
        assert_eq!(s.subscribe(&calc, "a://2", "s2").await, Ok(true));
        let mut gone = s.forget_session("s2").await;
        gone.sort();
        assert_eq!(
            gone,
            vec![(calc.clone(), "a://1".into()), (calc.clone(), "a://2".into())]
        );
        assert!(s.subscribed_uris("calc").await.is_empty());
    }

    #[tokio::test]
    async fn a_session_holds_at_most_max_subscriptions() {
        let s = Shared::default();
        let calc: Arc<str> = "calc".into();
        for i in 0..MAX_SUBSCRIPTIONS {
            assert!(s.subscribe(&calc, &format!("a://{i}"), "s1").await.is_ok());
        }
        assert_eq!(s.subscribe(&calc, "a://over", "s1").await, Err(TooManySubscriptions));
        assert_eq!(s.subscribe(&calc, "a://0", "s1").await, Ok(false), "one it holds");
        assert_eq!(
            s.subscribe(&calc, "a://over", "s2").await,
            Ok(true),
            "another session's"
        );
    }

    #[tokio::test]
    async fn the_downstream_level_is_the_most_verbose_and_moves_only_when_it_changes() {
        let s = Shared::default();
        assert_eq!(s.set_log_level("a", 4).await, Some(4));
        assert_eq!(s.set_log_level("b", 6).await, None);
        assert_eq!(s.set_log_level("b", 1).await, Some(1));
        assert_eq!(s.downstream_log_level().await, Some(1));
        s.forget_session("b").await;
        assert_eq!(s.settle_log_level().await, Some(4), "the level of those left");
        assert_eq!(s.settle_log_level().await, None);
    }

    #[tokio::test]
    async fn tasks_are_bound_to_their_session() {
        let s = Shared::default();
        let calc: Arc<str> = "calc".into();
        let public = s.add_task(&calc, "t-1", "s1", false).await;
        assert_eq!(public, "calc/t-1");
        assert!(s.task(&public, "s2").await.is_none());
        assert_eq!(s.task(&public, "s1").await.map(|r| r.task_id), Some("t-1".into()));
        assert_eq!(
            s.task_by_origin("calc", "t-1").await.map(|r| r.owner),
            Some("s1".into())
        );
        s.forget_session("s1").await;
        assert!(s.task_by_origin("calc", "t-1").await.is_none());
    }
}
