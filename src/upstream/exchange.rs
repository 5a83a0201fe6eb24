//! RFC 8693 token exchange for `auth.token_exchange` servers: the caller's validated
//! inbound JWT is the `subject_token`; the token the authorization server issues goes
//! downstream as `Authorization: Bearer` (the inbound one never does).
//!
//! Tokens are cached per (principal, server) until shortly before they expire
//! ([`fresh_for`]), with one exchange in flight per key however many calls wait for it.
//! The principal (`auth::Identity::principal`) binds a JWT's name to its issuer and
//! claim: a caller of the same name from another issuer never gets this one's token.
//! In cluster mode the cache is shared through Redis: each token sealed ([`super::seal`])
//! under its principal and server, kept for the token's lifetime; a short Redis lock
//! makes concurrent first calls on several replicas one exchange. The lock's value proves
//! its writer holds the cluster key ([`LockValue`]), and only the one who took it gives it
//! back (compare-and-delete): someone who can write to Redis without the key cannot make
//! callers wait for a lock of theirs, and a holder whose lock expired never deletes the
//! next holder's.
//!
//! Nothing here logs a token, and errors carry the authorization server's error code
//! and description (never its whole body, which could echo a token).

use super::seal::Sealer;
use crate::auth::Shown;
use crate::cluster::Cluster;
use crate::config::{ClientAuth, Secret, TokenExchange};
use reqwest::header::HeaderValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The grant type of RFC 8693.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// How long one exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);
/// `expires_in` absent from the answer: the token is kept this long.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// The sealing key's purpose (see [`Sealer`]).
const PURPOSE: &str = "upstream-token/1";
/// The purpose of the key that signs lock values ([`LockValue`]).
const LOCK_PURPOSE: &str = "upstream-token-lock/1";
/// Gives a lock back only if it still holds this acquisition's value: a holder whose lock
/// expired (an exchange slower than [`EXCHANGE_TIMEOUT`]) leaves the next holder's alone.
const UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
/// How often a replica waiting for another's exchange looks in Redis.
const SHARED_POLL: Duration = Duration::from_millis(25);
/// Callers remembered before those nobody serves are forgotten.
const PRUNE_AT: usize = 4096;
/// The longest token-endpoint answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// The `Authorization` value a per-identity connection sends, swapped when its token is
/// refreshed (the connection and its session stay).
pub type Bearer = Arc<RwLock<Option<HeaderValue>>>;

/// How long a token that lives `lifetime` is used: until 90% of its life, and at least
/// 30 s before it expires (but never less than half its life).
pub fn fresh_for(lifetime: Duration) -> Duration {
    let ninety = lifetime.mul_f64(0.9);
    let margin = lifetime.saturating_sub(Duration::from_secs(30));
    ninety.min(margin).max(lifetime / 2)
}

/// Why no token could be had; the message names the server, never a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    /// The caller has no inbound JWT to exchange (a static `[clients.*]` token, or none).
    #[error("server '{server}' needs the caller's OAuth token (auth.token_exchange): authenticate with a JWT from [auth.oauth], not a static client token")]
    NoSubject { server: String },
    /// The authorization server refused: its error code (and description).
    #[error("token exchange for server '{server}' failed: the authorization server answered {code}{}", description.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        server: String,
        code: String,
        description: Option<String>,
    },
    /// The token endpoint could not be reached, or answered something else.
    #[error("token exchange for server '{server}' failed: {reason}")]
    Failed { server: String, reason: String },
}

/// One cached token.
#[derive(Clone)]
struct Cached {
    token: Secret,
    /// Used until then; exchanged again afterwards.
    fresh_until: Instant,
}

/// One (principal, server)'s place: the single flight's lock, its token, and the header
/// its connection sends.
#[derive(Default)]
struct Slot {
    cached: tokio::sync::Mutex<Option<Cached>>,
    bearer: Bearer,
}

/// The exchanges of one gateway process.
pub struct Exchanger {
    /// Made on first use: loading the system's root certificates takes milliseconds, which
    /// a gateway without token exchange should not spend at start.
    http: std::sync::OnceLock<reqwest::Client>,
    slots: Mutex<HashMap<(String, String), Arc<Slot>>>,
    /// Cluster mode: the shared cache's sealing key, made on first use.
    sealer: std::sync::OnceLock<Sealer>,
    /// Cluster mode: the key lock values are signed with, made on first use.
    lock_key: std::sync::OnceLock<ring::hmac::Key>,
}

impl Default for Exchanger {
    fn default() -> Self {
        Exchanger::new()
    }
}

/// A token as shared through Redis (sealed).
#[derive(serde::Serialize, serde::Deserialize)]
struct Shared {
    token: String,
    /// Milliseconds since the epoch: used until then.
    fresh_until_ms: u64,
}

impl Exchanger {
    pub fn new() -> Exchanger {
        Exchanger {
            http: std::sync::OnceLock::new(),
            slots: Mutex::new(HashMap::new()),
            sealer: std::sync::OnceLock::new(),
            lock_key: std::sync::OnceLock::new(),
        }
    }

    fn http(&self) -> &reqwest::Client {
        self.http.get_or_init(|| {
            reqwest::Client::builder()
                .timeout(EXCHANGE_TIMEOUT)
                .connect_timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .use_rustls_tls()
                .build()
                .unwrap_or_default()
        })
    }

    fn slot(&self, principal: &str, server: &str) -> Arc<Slot> {
        let mut slots = crate::sync::lock(&self.slots);
        if slots.len() >= PRUNE_AT {
            // Forget the callers nobody serves now: no call waits on the slot, and no
            // connection holds its header (an idle one is stopped after idle_timeout).
            slots.retain(|_, s| Arc::strong_count(s) > 1 || Arc::strong_count(&s.bearer) > 1);
        }
        slots
            .entry((principal.to_owned(), server.to_owned()))
            .or_default()
            .clone()
    }

    /// The `Authorization` header for the calls to `server` of the caller whose principal
    /// is `principal`, with a token that is fresh (exchanged now if the cached one is
    /// not). `subject` is the caller's validated inbound JWT.
    pub async fn bearer(
        &self,
        server: &str,
        cfg: &TokenExchange,
        principal: &str,
        subject: Option<&Secret>,
        cluster: Option<&Arc<Cluster>>,
    ) -> Result<Bearer, ExchangeError> {
        let Some(subject) = subject else {
            return Err(ExchangeError::NoSubject {
                server: server.to_owned(),
            });
        };
        // A reload that changes what is asked for (audience, scope...) gets new tokens.
        let server_key = format!("{server}:{}", fingerprint(cfg));
        let server_key = server_key.as_str();
        let slot = self.slot(principal, server_key);
        let identity = Shown(principal);
        // The single flight: whoever holds this exchanges; the others find its token.
        let mut cached = slot.cached.lock().await;
        if let Some(c) = cached.as_ref().filter(|c| c.fresh_until > Instant::now()) {
            set_bearer(&slot.bearer, &c.token);
            return Ok(slot.bearer.clone());
        }
        if let Some(c) = self.shared_get(cluster, principal, server_key, Unopened::Warn).await {
            debug!(server, %identity, "token from the cluster's cache");
            set_bearer(&slot.bearer, &c.token);
            *cached = Some(c);
            return Ok(slot.bearer.clone());
        }
        // Across replicas: one exchanges (it holds the Redis lock); the others wait for
        // its token to appear, and exchange themselves if it never does.
        let lock = match cluster {
            Some(c) => match self.shared_lock(c, principal, server_key).await {
                Lock::Held(held) => Some((c, held)),
                Lock::Busy => {
                    if let Some(got) = self.shared_wait(c, principal, server_key).await {
                        debug!(server, %identity, "token from another replica's exchange");
                        set_bearer(&slot.bearer, &got.token);
                        *cached = Some(got);
                        return Ok(slot.bearer.clone());
                    }
                    None
                }
                Lock::Forged => {
                    warn_forged_lock(server, identity);
                    None
                }
                Lock::Unavailable => None,
            },
            None => None,
        };
        let exchanged = self.exchange(server, cfg, subject).await;
        if exchanged.is_err() {
            if let Some((c, held)) = &lock {
                unlock(c, held).await;
            }
        }
        let (token, lifetime) = exchanged?;
        info!(
            server,
            %identity,
            lifetime_s = lifetime.as_secs(),
            "exchanged the caller's token"
        );
        let fresh = fresh_for(lifetime);
        self.shared_put(cluster, principal, server_key, &token, fresh, lifetime)
            .await;
        if let Some((c, held)) = &lock {
            unlock(c, held).await;
        }
        set_bearer(&slot.bearer, &token);
        let now = Instant::now();
        *cached = Some(Cached {
            token,
            fresh_until: now.checked_add(fresh).unwrap_or(now),
        });
        Ok(slot.bearer.clone())
    }

    /// One exchange at the token endpoint: the token and its lifetime.
    async fn exchange(
        &self,
        server: &str,
        cfg: &TokenExchange,
        subject: &Secret,
    ) -> Result<(Secret, Duration), ExchangeError> {
        let failed = |reason: String| ExchangeError::Failed {
            server: server.to_owned(),
            reason,
        };
        let mut form: Vec<(&str, &str)> = vec![
            ("grant_type", GRANT_TYPE),
            ("subject_token", subject.expose()),
            ("subject_token_type", &cfg.subject_token_type),
            ("requested_token_type", crate::config::ACCESS_TOKEN_TYPE),
        ];
        for (k, v) in [
            ("audience", &cfg.audience),
            ("resource", &cfg.resource),
            ("scope", &cfg.scope),
        ] {
            if let Some(v) = v {
                form.push((k, v));
            }
        }
        let mut req = self
            .http()
            .post(&cfg.token_endpoint)
            .header("accept", "application/json");
        match (&cfg.client_secret, cfg.client_auth) {
            (Some(secret), ClientAuth::Basic) => {
                // RFC 6749 §2.3.1: each part form-urlencoded before the Basic encoding.
                let user = form_encode(&cfg.client_id);
                let pass = form_encode(secret.expose());
                let mut value =
                    HeaderValue::from_str(&format!("Basic {}", base64(format!("{user}:{pass}").as_bytes())))
                        .map_err(|_| failed("the client credentials do not fit in a header".into()))?;
                value.set_sensitive(true);
                req = req.header("authorization", value);
            }
            (Some(secret), ClientAuth::Post) => {
                form.push(("client_id", &cfg.client_id));
                form.push(("client_secret", secret.expose()));
            }
            (None, _) => form.push(("client_id", &cfg.client_id)),
        }
        let body = form
            .iter()
            .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let resp = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| failed(format!("cannot reach the token endpoint: {}", e.without_url())))?;
        let status = resp.status();
        let bytes = read_limited(resp)
            .await
            .map_err(|e| failed(format!("reading the token endpoint's answer: {e}")))?;
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        if !status.is_success() {
            let code = answer.get("error").and_then(|v| v.as_str()).map(clean);
            // A description that could quote a token (32 base64url characters in a row) is left out.
            let description = answer
                .get("error_description")
                .and_then(|v| v.as_str())
                .map(clean)
                .filter(|d| !token_like(d));
            warn!(
                server,
                status = status.as_u16(),
                error = code.as_deref().unwrap_or("-"),
                "token exchange refused"
            );
            return Err(match code {
                Some(code) => ExchangeError::Refused {
                    server: server.to_owned(),
                    code,
                    description,
                },
                None => failed(format!("the token endpoint answered HTTP {status}")),
            });
        }
        let token = answer
            .get("access_token")
            .and_then(|v| v.as_str())
            .filter(|t| bearer_value(t).is_some())
            .ok_or_else(|| failed("the token endpoint's answer has no usable access_token".into()))?;
        if let Some(t) = answer.get("token_type").and_then(|v| v.as_str()) {
            // RFC 8693 §2.2.1: N_A for a token that is not an access token.
            if !t.eq_ignore_ascii_case("bearer") {
                return Err(failed(format!(
                    "the issued token is of type {:?}, not Bearer",
                    clean(t)
                )));
            }
        }
        // Capped: a peer's 2^64-1 would overflow an Instant (ten years is as good as forever).
        let lifetime = answer
            .get("expires_in")
            .and_then(|v| v.as_u64())
            .map_or(DEFAULT_LIFETIME, |s| {
                Duration::from_secs(s).min(crate::config::values::MAX_DURATION)
            });
        Ok((Secret::new(token), lifetime))
    }

    fn sealer(&self, cluster: &Cluster) -> &Sealer {
        self.sealer.get_or_init(|| Sealer::from_cluster(cluster, PURPOSE))
    }

    fn lock_key(&self, cluster: &Cluster) -> &ring::hmac::Key {
        self.lock_key.get_or_init(|| cluster.derive(LOCK_PURPOSE))
    }

    fn redis_key(cluster: &Cluster, principal: &str, server: &str) -> String {
        // The principal digested: a client name is the caller's to choose.
        cluster.name(&format!(
            "upstream-token:{server}:{}",
            crate::cluster::digest(principal)
        ))
    }

    fn lock_name(cluster: &Cluster, principal: &str, server: &str) -> String {
        format!("{}:lock", Self::redis_key(cluster, principal, server))
    }

    /// Takes the cluster-wide lock of one exchange (it expires by itself after
    /// [`EXCHANGE_TIMEOUT`], should its holder die), with a value of its own
    /// ([`LockValue`]). A lock already there is another replica's ([`Lock::Busy`]) only if
    /// its value verifies.
    async fn shared_lock(&self, c: &Cluster, principal: &str, server: &str) -> Lock {
        let name = Self::lock_name(c, principal, server);
        let ttl = u64::try_from(EXCHANGE_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        let Some(value) = LockValue::make(self.lock_key(c), &name, crate::cluster::now_ms().saturating_add(ttl)) else {
            return Lock::Unavailable;
        };
        let mut conn = c.conn();
        let r: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(&name)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(ttl)
            .query_async(&mut conn)
            .await;
        match c.track(r) {
            Ok(Some(_)) => Lock::Held(Held { name, value }),
            Ok(None) => match self.lock_state(c, &name).await {
                LockState::Forged => Lock::Forged,
                // Gone meanwhile: waiting finds its token, or exchanges.
                LockState::Held | LockState::Gone => Lock::Busy,
            },
            Err(_) => Lock::Unavailable,
        }
    }

    /// What the lock `name` is now: held by someone with the cluster key, gone (or Redis
    /// did not answer), or a value that does not verify.
    async fn lock_state(&self, c: &Cluster, name: &str) -> LockState {
        let mut conn = c.conn();
        let got: redis::RedisResult<Option<String>> = redis::cmd("GET").arg(name).query_async(&mut conn).await;
        match c.track(got) {
            Ok(Some(v)) if LockValue::verify(self.lock_key(c), name, &v, crate::cluster::now_ms()) => LockState::Held,
            Ok(Some(_)) => LockState::Forged,
            Ok(None) | Err(_) => LockState::Gone,
        }
    }

    /// Waits (polling Redis) for the token another replica is exchanging; `None` when
    /// its lock goes away without one, turns out not to be a replica's (then it is said),
    /// or it takes longer than an exchange may.
    async fn shared_wait(&self, c: &Arc<Cluster>, principal: &str, server: &str) -> Option<Cached> {
        let lock = Self::lock_name(c, principal, server);
        let until = Instant::now() + EXCHANGE_TIMEOUT;
        while Instant::now() < until {
            tokio::time::sleep(SHARED_POLL).await;
            if let Some(got) = self.shared_get(Some(c), principal, server, Unopened::Quiet).await {
                return Some(got);
            }
            match self.lock_state(c, &lock).await {
                LockState::Held => {}
                LockState::Gone => {
                    // One last look: the token is written before the lock goes.
                    return self.shared_get(Some(c), principal, server, Unopened::Quiet).await;
                }
                LockState::Forged => {
                    let server = server.split_once(':').map_or(server, |(name, _)| name);
                    warn_forged_lock(server, Shown(principal));
                    return None;
                }
            }
        }
        None
    }

    /// The token shared in Redis for (principal, server), if one is there, opens and is
    /// fresh. A record that does not open (forged, another caller's or server's moved
    /// here, sealed with another cluster key) is never used: the caller's own token is
    /// exchanged and written over it. `unopened` says whether that is logged (once per
    /// call, not once per poll of [`Exchanger::shared_wait`]).
    async fn shared_get(
        &self,
        cluster: Option<&Arc<Cluster>>,
        principal: &str,
        server: &str,
        unopened: Unopened,
    ) -> Option<Cached> {
        let c = cluster?;
        let mut conn = c.conn();
        let got: Option<String> = c
            .track(
                redis::cmd("GET")
                    .arg(Self::redis_key(c, principal, server))
                    .query_async(&mut conn)
                    .await,
            )
            .ok()?;
        let plain = match self.sealer(c).open(&[principal, server], &got?) {
            Ok(p) => p,
            Err(_) => {
                if unopened == Unopened::Warn {
                    warn!(
                        // `server` is the cache's key, `{name}:{fingerprint}`; names have no ':'.
                        server = server.split_once(':').map_or(server, |(name, _)| name),
                        identity = %Shown(principal),
                        "an exchanged token's record in Redis does not open with the cluster key (written by someone without it, or moved from another caller's key); not using it, exchanging again"
                    );
                }
                return None;
            }
        };
        let shared: Shared = serde_json::from_slice(&plain).ok()?;
        let left = shared.fresh_until_ms.checked_sub(crate::cluster::now_ms())?;
        let now = Instant::now();
        let left = Duration::from_millis(left).min(crate::config::values::MAX_DURATION);
        (!left.is_zero()).then(|| Cached {
            token: Secret::new(shared.token),
            fresh_until: now.checked_add(left).unwrap_or(now),
        })
    }

    async fn shared_put(
        &self,
        cluster: Option<&Arc<Cluster>>,
        principal: &str,
        server: &str,
        token: &Secret,
        fresh: Duration,
        lifetime: Duration,
    ) {
        let Some(c) = cluster else { return };
        let record = Shared {
            token: token.expose().to_owned(),
            fresh_until_ms: crate::cluster::now_ms()
                .saturating_add(u64::try_from(fresh.as_millis()).unwrap_or(u64::MAX)),
        };
        let Ok(json) = serde_json::to_vec(&record) else { return };
        let Ok(sealed) = self.sealer(c).seal(&[principal, server], &json) else {
            return;
        };
        let mut conn = c.conn();
        let ttl = u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX).max(1);
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(Self::redis_key(c, principal, server))
            .arg(sealed)
            .arg("PX")
            .arg(ttl)
            .query_async(&mut conn)
            .await;
        if let Err(e) = c.track(r) {
            debug!(server, error = %e, "cannot share the exchanged token");
        }
    }
}

/// What a token is asked for with, digested (16 hex digits): part of its cache key.
fn fingerprint(cfg: &TokenExchange) -> String {
    let what = format!(
        "{}\n{:?}\n{:?}\n{:?}\n{}\n{}",
        cfg.token_endpoint, cfg.audience, cfg.resource, cfg.scope, cfg.client_id, cfg.subject_token_type
    );
    crate::cluster::digest(&what)[..16].to_owned()
}

/// Whether [`Exchanger::shared_get`] logs a record that does not open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unopened {
    Warn,
    Quiet,
}

/// The cluster-wide lock of one exchange.
enum Lock {
    /// This replica holds it.
    Held(Held),
    /// Another replica is exchanging.
    Busy,
    /// A lock is there whose value was not written with the cluster key: not waited
    /// for, exchange without it.
    Forged,
    /// Redis did not answer: exchange without it.
    Unavailable,
}

/// A lock this replica took: its Redis key, and the value of this acquisition.
struct Held {
    name: String,
    value: String,
}

/// A lock as a waiter finds it ([`Exchanger::lock_state`]).
enum LockState {
    Held,
    Gone,
    Forged,
}

/// A lock's value: `{until}.{nonce}.{mac}`, when it expires (ms since the epoch), 16
/// random bytes and the HMAC-SHA256 (keyed from the cluster key, [`LOCK_PURPOSE`]) of the
/// lock's name, the expiry and the nonce, all hex. Only a holder of the cluster key can
/// write one that verifies; the nonce makes each acquisition's value its own (what
/// [`unlock`] compares), and the expiry makes an old value copied back (a replay) not
/// count past the lock's life. Replicas' clocks are assumed to agree within seconds: one
/// whose clock runs ahead takes a lock for expired early, and exchanges once more.
struct LockValue;

impl LockValue {
    /// A fresh value for lock `name`, expiring at `until_ms`; `None` without randomness.
    fn make(key: &ring::hmac::Key, name: &str, until_ms: u64) -> Option<String> {
        let mut nonce = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce).ok()?;
        let nonce = crate::cluster::hex(&nonce);
        let mac = ring::hmac::sign(key, Self::signed(name, until_ms, &nonce).as_bytes());
        Some(format!("{until_ms}.{nonce}.{}", crate::cluster::hex(mac.as_ref())))
    }

    fn signed(name: &str, until_ms: u64, nonce: &str) -> String {
        // The name last: it is the only part that could hold a '\n'.
        format!("{until_ms}\n{nonce}\n{name}")
    }

    /// Whether `value` of lock `name` was written with the cluster key and has not expired
    /// at `now_ms`.
    fn verify(key: &ring::hmac::Key, name: &str, value: &str, now_ms: u64) -> bool {
        let mut parts = value.splitn(3, '.');
        let (Some(until), Some(nonce), Some(mac)) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let (Ok(until_ms), Some(mac)) = (until.parse::<u64>(), crate::cluster::unhex(mac)) else {
            return false;
        };
        until_ms > now_ms && ring::hmac::verify(key, Self::signed(name, until_ms, nonce).as_bytes(), &mac).is_ok()
    }
}

/// A lock not written with the cluster key was found: said once per call.
fn warn_forged_lock(server: &str, identity: Shown<'_>) {
    warn!(
        server,
        %identity,
        "an exchange's lock in Redis was not written with the cluster key (someone without it can write to Redis), or has expired; not waiting for it, exchanging at once"
    );
}

/// Gives the lock back if it is still this acquisition's (compare-and-delete, one Lua
/// script): should it have expired and been taken by another replica meanwhile, that
/// one's stays. It expires anyway.
async fn unlock(c: &Cluster, held: &Held) {
    let mut conn = c.conn();
    let r: redis::RedisResult<i64> = redis::Script::new(UNLOCK)
        .key(&held.name)
        .arg(&held.value)
        .invoke_async(&mut conn)
        .await;
    let _ = c.track(r);
}

fn set_bearer(bearer: &Bearer, token: &Secret) {
    if let Some(v) = bearer_value(token.expose()) {
        *crate::sync::write(bearer) = Some(v);
    }
}

/// `token` as the value of an `Authorization` header (sensitive), or `None` when it cannot
/// be one (empty, a space or a control character, a CR/LF among them).
pub(crate) fn bearer_value(token: &str) -> Option<HeaderValue> {
    if token.is_empty() || token.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return None;
    }
    let mut v = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// An authorization server's text, fit for an error message: printable ASCII, short.
fn clean(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(200)
        .collect()
}

/// Holds a run of 32 or more base64url characters: it might be (part of) a token.
fn token_like(s: &str) -> bool {
    let mut run = 0;
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
            run += 1;
            if run >= 32 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

async fn read_limited(resp: reqwest::Response) -> Result<Vec<u8>, String> {
    use futures::StreamExt;
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| e.without_url().to_string())?;
        if out.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("longer than {MAX_ANSWER} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// application/x-www-form-urlencoded: unreserved bytes as they are, space as `+`, the
/// rest `%XX`.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

pub(crate) fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_nobody_serves_are_forgotten_past_the_bound() {
        let x = Exchanger::new();
        // One caller whose connection holds its header.
        let held = x.slot("kept", "docs").bearer.clone();
        for i in 0..PRUNE_AT - 1 {
            let _ = x.slot(&format!("caller-{i}"), "docs");
        }
        let _ = x.slot("one-more", "docs");
        let slots = crate::sync::lock(&x.slots);
        assert_eq!(slots.len(), 2, "the held one and the new one");
        let kept = &slots[&("kept".to_owned(), "docs".to_owned())];
        assert!(Arc::ptr_eq(&kept.bearer, &held), "a held header is never replaced");
    }

    #[test]
    fn lock_values_verify_only_with_their_key_name_and_life() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"cluster key of thirty-two bytes!");
        let v = LockValue::make(&key, "p:upstream-token:docs:x:lock", 2_000).unwrap();
        assert!(LockValue::verify(&key, "p:upstream-token:docs:x:lock", &v, 1_000));
        assert_ne!(
            v,
            LockValue::make(&key, "p:upstream-token:docs:x:lock", 2_000).unwrap(),
            "a nonce each"
        );
        assert!(
            !LockValue::verify(&key, "p:upstream-token:docs:y:lock", &v, 1_000),
            "another lock's"
        );
        assert!(
            !LockValue::verify(&key, "p:upstream-token:docs:x:lock", &v, 2_000),
            "expired (replayed)"
        );
        let other = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"another key of thirty-two bytes!");
        assert!(!LockValue::verify(&other, "p:upstream-token:docs:x:lock", &v, 1_000));
        let later = v.replacen("2000", "9000", 1);
        assert!(
            !LockValue::verify(&key, "p:upstream-token:docs:x:lock", &later, 1_000),
            "its life is signed"
        );
        for junk in ["", "r-1", "1.2", "9999.ab.zz", "x.y.z"] {
            assert!(!LockValue::verify(&key, "n", junk, 0), "{junk:?}");
        }
    }

    /// Against a real redis-server: a lock given back after it expired and was taken by
    /// another holder stays that holder's; a lock written without the cluster key is not
    /// waited for.
    #[tokio::test]
    async fn a_lock_is_given_back_only_by_its_holder_and_a_forged_one_is_not_held() {
        let server = crate::cluster::limits::tests::Server::start();
        let c = server.cluster();
        let x = Exchanger::new();
        let Lock::Held(mine) = x.shared_lock(&c, "alice", "docs:f").await else {
            panic!("the lock was free");
        };
        assert!(
            matches!(x.shared_lock(&c, "alice", "docs:f").await, Lock::Busy),
            "held by a replica"
        );
        let mut conn = c.conn();
        let get = |conn: &mut redis::aio::ConnectionManager| {
            let name = mine.name.clone();
            let mut conn = conn.clone();
            async move {
                redis::cmd("GET")
                    .arg(&name)
                    .query_async::<Option<String>>(&mut conn)
                    .await
                    .unwrap()
            }
        };
        // It expires, and another replica takes it.
        let _: () = redis::cmd("DEL").arg(&mine.name).query_async(&mut conn).await.unwrap();
        let Lock::Held(theirs) = Exchanger::new().shared_lock(&c, "alice", "docs:f").await else {
            panic!("the lock was free again");
        };
        unlock(&c, &mine).await;
        assert_eq!(
            get(&mut conn).await.as_deref(),
            Some(theirs.value.as_str()),
            "the late holder deleted the next one's"
        );
        unlock(&c, &theirs).await;
        assert_eq!(get(&mut conn).await, None, "its holder gives it back");

        // Squatted by someone who can write to Redis without the cluster key.
        let _: () = redis::cmd("SET")
            .arg(&mine.name)
            .arg("squatter")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(x.shared_lock(&c, "alice", "docs:f").await, Lock::Forged));
        let waited = Instant::now();
        assert!(x.shared_wait(&c, "alice", "docs:f").await.is_none());
        assert!(waited.elapsed() < Duration::from_secs(1), "not waited for");
    }

    #[test]
    fn freshness_and_encodings() {
        assert_eq!(fresh_for(Duration::from_secs(3600)), Duration::from_secs(3240));
        assert_eq!(fresh_for(Duration::from_secs(300)), Duration::from_secs(270));
        assert_eq!(fresh_for(Duration::from_secs(40)), Duration::from_secs(20));
        assert_eq!(fresh_for(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(base64(b"gw:s3cret"), "Z3c6czNjcmV0");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(clean("bad\r\ncode\u{7}"), "badcode");
        assert!(token_like("subject eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9 is bad"));
        assert!(!token_like("the subject_token does not verify (InvalidSignatureError)"));
        let e = ExchangeError::Refused {
            server: "docs".into(),
            code: "invalid_grant".into(),
            description: None,
        };
        assert_eq!(
            e.to_string(),
            "token exchange for server 'docs' failed: the authorization server answered invalid_grant"
        );
    }
}
