//! Replicas sharing one Redis (`[cluster]`): the connection, the keys derived from the
//! cluster key, this replica's name and heartbeat, and whether Redis is reachable.
//!
//! Without `[cluster]` nothing here runs: the gateway keeps all its state in memory.
//! With it, what crosses replicas goes through Redis: sealed session records
//! ([`sessions`]), the bus between replicas (pub/sub, [`bus`]) and global rate limits
//! ([`limits`], GCRA in one Lua script). docs/cluster.md has the design and the keyspace.
//!
//! Redis is reached through redis-rs's `ConnectionManager` (one multiplexed connection
//! that reconnects by itself), made lazily, so a replica starts while Redis is down.
//! Every command has a short response timeout: a Redis that does not answer counts as
//! down, and `cluster.on_redis_down` decides what requests get meanwhile.

pub mod bus;
pub mod limits;
pub mod sessions;

use crate::config::{self, OnRedisDown};
use redis::aio::ConnectionManager;
use ring::hmac;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{info, warn};

/// How long one Redis command may take before Redis counts as down.
pub const REDIS_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a replica writes its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica not heard from for this long is not counted as seen.
pub const REPLICA_GONE: Duration = Duration::from_secs(5);

/// This replica's view of the cluster.
pub struct Cluster {
    /// This replica's name (in Redis, on the bus, on `/status`).
    pub replica: String,
    pub on_redis_down: OnRedisDown,
    prefix: String,
    conn: ConnectionManager,
    client: redis::Client,
    /// The cluster key: what other keys are derived from (see [`Cluster::derive`]).
    root: hmac::Key,
    up: AtomicBool,
    /// A warning was logged for the current outage.
    warned: AtomicBool,
    /// Redis answers but refuses writes (out of memory: `maxmemory` with `noeviction`).
    /// Reads that succeed meanwhile do not make it reachable again: only a write does
    /// (the heartbeat's), so a full Redis is one outage, not one per read.
    full: AtomicBool,
    replicas_seen: AtomicU64,
    /// The bus between replicas (see [`bus`]).
    pub bus: bus::Bus,
    /// Session records (see [`sessions`]).
    pub sessions: sessions::Sessions,
    /// This process's mark in its heartbeat: a replica id two processes share is noticed.
    nonce: String,
    duplicate: AtomicBool,
    /// Told each time Redis is reachable again after an outage (it may have lost its data),
    /// or the bus is listened to again.
    recovered: tokio::sync::broadcast::Sender<()>,
    /// When the shared limits last failed to reach Redis (see [`limits`]).
    limits: limits::Health,
}

/// Milliseconds since the Unix epoch (what every replica's clock agrees on, roughly).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Cluster {
    /// Opens (lazily) the connection to Redis and starts the heartbeat. Never fails on
    /// Redis being down: the table was validated, and Redis may come up later.
    pub fn start(cfg: &config::Cluster) -> anyhow::Result<Arc<Cluster>> {
        let client = redis::Client::open(cfg.redis.expose())
            .map_err(|e| anyhow::anyhow!("cluster.redis: {}", redact(&e.to_string(), cfg.redis.expose())))?;
        let mgr = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(REDIS_TIMEOUT))
            .set_connection_timeout(Some(REDIS_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), mgr)
            .map_err(|e| anyhow::anyhow!("cluster.redis: {}", redact(&e.to_string(), cfg.redis.expose())))?;
        let replica = cfg.replica_id.clone().unwrap_or_else(default_replica_id);
        let root = hmac::Key::new(hmac::HMAC_SHA256, cfg.key.expose().as_bytes());
        let cluster = Arc::new(Cluster {
            replica,
            on_redis_down: cfg.on_redis_down,
            prefix: cfg.prefix.clone(),
            conn,
            client,
            bus: bus::Bus::new(&root),
            sessions: sessions::Sessions::new(&root),
            root,
            up: AtomicBool::new(true),
            warned: AtomicBool::new(false),
            full: AtomicBool::new(false),
            replicas_seen: AtomicU64::new(0),
            recovered: tokio::sync::broadcast::channel(4).0,
            nonce: {
                use rand::RngCore;
                let mut b = [0u8; 8];
                rand::rng().fill_bytes(&mut b);
                hex(&b)
            },
            duplicate: AtomicBool::new(false),
            limits: limits::Health::default(),
        });
        let weak = Arc::downgrade(&cluster);
        crate::background::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(c) = weak.upgrade() else { return };
                c.heartbeat().await;
            }
        });
        info!(replica = %cluster.replica, "cluster mode: state shared through Redis");
        if cfg.advertise.is_some() {
            warn!("cluster.advertise is not used: replicas reach each other through Redis (docs/cluster.md)");
        }
        Ok(cluster)
    }

    /// A key for one purpose, derived from the cluster key (see [`derive`]).
    pub fn derive(&self, purpose: &str) -> hmac::Key {
        derive(&self.root, purpose)
    }

    /// Publishes `note` on the bus (best effort); how many replicas received it.
    pub async fn publish(&self, to: bus::To<'_>, note: bus::Note) -> Option<u64> {
        self.bus.publish(self, to, note).await
    }

    /// A Redis key or channel of this cluster: `{prefix}:{rest}`.
    pub fn name(&self, rest: &str) -> String {
        format!("{}:{rest}", self.prefix)
    }

    /// The multiplexed connection (cheap to clone).
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// A client for connections of their own (the bus's pub/sub connection).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Whether the last Redis command succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The number of replicas (this one included) that wrote a heartbeat lately.
    pub fn replicas_seen(&self) -> u64 {
        self.replicas_seen.load(Ordering::Relaxed)
    }

    /// A Redis command succeeded. While Redis refuses writes (see [`Cluster::failed`]),
    /// only a write that succeeds says it is back ([`Cluster::heartbeat`]).
    pub fn ok(&self) {
        if self.full.load(Ordering::Relaxed) {
            return;
        }
        if !self.up.swap(true, Ordering::Relaxed) {
            info!(replica = %self.replica, "Redis is reachable again; shared state and limits are back");
            self.warned.store(false, Ordering::Relaxed);
            let _ = self.recovered.send(());
        }
    }

    /// Asks for what [`Cluster::recovered`] does, without an outage: the bus was listened
    /// to again, and notes sent meanwhile (a session that ended) are lost.
    pub fn reconcile(&self) {
        let _ = self.recovered.send(());
    }

    /// Told each time Redis is back after an outage, or the bus is listened to again:
    /// what this replica holds goes back into it (a Redis that restarted empty has lost
    /// the sessions), and what it missed is caught up with.
    pub fn recovered(&self) -> tokio::sync::broadcast::Receiver<()> {
        self.recovered.subscribe()
    }

    /// A Redis command failed: Redis counts as down until one succeeds. Warns once per
    /// outage, saying what `on_redis_down` does meanwhile. The error never carries the URL.
    /// A Redis out of memory (it refuses writes, answers reads) counts as down until a
    /// write succeeds: reads that succeed meanwhile would otherwise start a reconcile
    /// whose writes fail, again and again.
    pub fn failed(&self, e: &redis::RedisError) {
        if out_of_memory(e) {
            self.full.store(true, Ordering::Relaxed);
        }
        self.up.store(false, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            let what = match self.on_redis_down {
                OnRedisDown::Local => {
                    "serving with this replica's own state and limits (cluster.on_redis_down = \"local\")"
                }
                OnRedisDown::Refuse => "refusing requests that need it with 503 (cluster.on_redis_down = \"refuse\")",
            };
            if out_of_memory(e) {
                warn!(replica = %self.replica, error = %e, "Redis is unreachable: it refuses writes (out of memory: maxmemory with the noeviction policy); {what}");
            } else {
                warn!(replica = %self.replica, error = %e, "Redis is unreachable; {what}");
            }
        }
    }

    /// Records a command's result in the health state.
    pub fn track<T>(&self, r: redis::RedisResult<T>) -> redis::RedisResult<T> {
        match &r {
            Ok(_) => self.ok(),
            Err(e) => self.failed(e),
        }
        r
    }

    async fn heartbeat(&self) {
        let key = self.name("replicas");
        let now = now_ms();
        let gone = now.saturating_sub(u64::try_from(REPLICA_GONE.as_millis()).unwrap_or(u64::MAX));
        let nonces = self.name("replica-nonces");
        let mut conn = self.conn();
        let r: redis::RedisResult<(Option<u64>, Option<String>, u64)> = redis::pipe()
            .zscore(&key, &self.replica)
            .hget(&nonces, &self.replica)
            .zadd(&key, &self.replica, now)
            .ignore()
            .hset(&nonces, &self.replica, &self.nonce)
            .ignore()
            .zrembyscore(&key, "-inf", format!("({gone}"))
            .ignore()
            .zcard(&key)
            .query_async(&mut conn)
            .await;
        if r.is_ok() {
            // A write went through: Redis takes writes again (if it was full).
            self.full.store(false, Ordering::Relaxed);
        }
        if let Ok((seen, nonce, n)) = self.track(r) {
            self.replicas_seen.store(n, Ordering::Relaxed);
            // Another live process wrote a heartbeat under this id since ours.
            let other = nonce.is_some_and(|x| x != self.nonce) && seen.is_some_and(|t| t >= gone);
            if other && !self.duplicate.swap(true, Ordering::Relaxed) {
                warn!(replica = %self.replica, "another running replica has this replica id: give each its own cluster.replica_id (or leave it unset)");
            }
        }
    }

    /// One PING, within [`REDIS_TIMEOUT`].
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
        self.track(r).map(|_| ())
    }

    /// `/status`'s `cluster` object.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "replica": self.replica,
            "redis": if self.is_up() { "up" } else { "down" },
            "onRedisDown": match self.on_redis_down { OnRedisDown::Local => "local", OnRedisDown::Refuse => "refuse" },
            "replicasSeen": self.replicas_seen(),
        })
    }
}

/// Whether `e` is Redis refusing a write because it is out of memory (`OOM command not
/// allowed when used memory > 'maxmemory'`), alone or inside a transaction or pipeline.
fn out_of_memory(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM") || e.to_string().contains("OOM")
}

/// A key for one purpose, derived from the cluster key: HMAC(cluster key, purpose). Each
/// use (session records, the bus, requestStates, ...) has its own, so one never verifies
/// as another.
pub fn derive(root: &hmac::Key, purpose: &str) -> hmac::Key {
    let tag = hmac::sign(root, format!("mcp-gateway/cluster/{purpose}").as_bytes());
    hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref())
}

/// The host name and pid: unique per process, and readable on `/status`.
fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "replica".into());
    format!("{host}-{}", std::process::id())
}

/// A Redis URL fit to show: without its user and password.
pub fn display_url(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://****@{}", &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// `text` with `secret` (the Redis URL, which may hold a password) cut out.
fn redact(text: &str, secret: &str) -> String {
    if secret.is_empty() {
        text.to_owned()
    } else {
        text.replace(secret, "****")
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// The bytes of lower-case or upper-case hex; `None` when it is not hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// 128 random bits in hex: correlation ids of the bus's requests.
pub fn random_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    hex(&b)
}

/// SHA-256 of `s`, in hex: how bearer-like values (session ids, client shares) name keys.
pub fn digest(s: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, s.as_bytes()).as_ref())
}
