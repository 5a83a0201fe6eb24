//! `[cluster]`: replicas sharing one Redis. Without the table the gateway is one process
//! with all its state in memory (nothing here is read).

use super::errors::Ctx;
use super::values::one_of;
use super::{expand, Secret};
use serde::Deserialize;
use toml::Spanned;

/// `cluster.on_redis_down` unset.
pub const DEFAULT_ON_REDIS_DOWN: OnRedisDown = OnRedisDown::Local;
/// The shortest `cluster.key`, in bytes.
pub const MIN_CLUSTER_KEY: usize = 32;
/// The Redis key prefix every replica of one cluster shares (`cluster.prefix` unset).
pub const DEFAULT_CLUSTER_PREFIX: &str = "mcpgw";

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    redis: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    on_redis_down: Option<Spanned<String>>,
    prefix: Option<Spanned<String>>,
    replica_id: Option<Spanned<String>>,
    advertise: Option<Spanned<String>>,
}

/// What a replica does while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRedisDown {
    /// Serve with this replica's own state and limits, with a warning (logged once, and
    /// on `/status`).
    Local,
    /// Refuse requests that need shared state with 503.
    Refuse,
}

/// `[cluster]`, validated.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// `redis://` or `rediss://` URL, `${VAR}` expanded; a secret (it may hold a password).
    pub redis: Secret,
    /// Shared by every replica: authenticates what they store in Redis and the ids they
    /// hand to clients (session ids, requestStates). At least [`MIN_CLUSTER_KEY`] bytes.
    pub key: Secret,
    pub on_redis_down: OnRedisDown,
    /// Prefix of every Redis key and channel (several clusters may share one Redis).
    pub prefix: String,
    /// This replica's name in Redis and on `/status`; default: the host name and pid.
    pub replica_id: Option<String>,
    /// Accepted and unused: replicas reach each other through Redis, never directly
    /// (a warning says so at start).
    pub advertise: Option<String>,
}

/// `None` without the table (or with errors, reported in `cx`).
pub(super) fn parse(cx: &mut Ctx, raw: Option<RawCluster>, env: &dyn Fn(&str) -> Option<String>) -> Option<Cluster> {
    let raw = raw?;
    let mut value = |v: Option<&Spanned<String>>, key: &str| -> Option<String> {
        let Some(v) = v else {
            cx.at(0, format!("cluster.{key} is required in [cluster]"));
            return None;
        };
        match expand(v.get_ref(), env) {
            Ok(s) => Some(s),
            Err(var) => {
                cx.at(
                    v.span().start,
                    format!("cluster.{key}: the environment variable {var} is not set"),
                );
                None
            }
        }
    };
    let redis = value(raw.redis.as_ref(), "redis");
    let key = value(raw.key.as_ref(), "key");
    if let (Some(r), Some(v)) = (&redis, &raw.redis) {
        if !(r.starts_with("redis://") || r.starts_with("rediss://") || r.starts_with("redis+unix://")) {
            cx.at(
                v.span().start,
                "cluster.redis must be a redis:// or rediss:// URL".to_owned(),
            );
        }
    }
    if let (Some(k), Some(v)) = (&key, &raw.key) {
        if k.len() < MIN_CLUSTER_KEY {
            cx.at(
                v.span().start,
                format!(
                    "cluster.key is {} bytes; it must be at least {MIN_CLUSTER_KEY} (e.g. `openssl rand -hex 32`)",
                    k.len()
                ),
            );
        }
    }
    let on_redis_down = one_of(
        cx,
        raw.on_redis_down.as_ref(),
        "cluster.on_redis_down",
        DEFAULT_ON_REDIS_DOWN,
        &[("local", OnRedisDown::Local), ("refuse", OnRedisDown::Refuse)],
    );
    let prefix = raw
        .prefix
        .as_ref()
        .map_or(DEFAULT_CLUSTER_PREFIX.to_owned(), |p| p.get_ref().clone());
    if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
        let at = raw.prefix.as_ref().map_or(0, |p| p.span().start);
        cx.at(at, format!("cluster.prefix: {prefix:?} may only use [A-Za-z0-9_.-]"));
    }
    let replica_id = raw.replica_id.map(Spanned::into_inner);
    if let Some(r) = &replica_id {
        if r.is_empty() || r.len() > 128 || !r.chars().all(|c| c.is_ascii_graphic()) {
            let at = 0;
            cx.at(
                at,
                format!("cluster.replica_id: {r:?} must be 1 to 128 visible ASCII characters"),
            );
        }
    }
    Some(Cluster {
        redis: Secret::new(redis?),
        key: Secret::new(key?),
        on_redis_down,
        prefix,
        replica_id,
        advertise: raw.advertise.map(Spanned::into_inner),
    })
}
