//! The users' own OAuth tokens for servers, sealed at rest, by (server, principal): a
//! `[clients.NAME]` client's name, or an `[auth.oauth]` identity's name bound to its
//! issuer (`auth::oauth_principal`, which holds a NUL; JSON and Redis keep it as it is).
//!
//! Single mode: one JSON file, `{state_dir}/tokens.json` (0600, written whole to a temporary
//! file and renamed, under an exclusive lock on `{state_dir}/tokens.lock`), `{"version": 1, "tokens": {SERVER: {IDENTITY: SEALED}}}`. It is read
//! again whenever it changed on disk, so `mcp-gateway tokens revoke` takes effect in a
//! running gateway. The key: `gateway.token_key`, else `{state_dir}/token.key` (32 random
//! bytes made on first use, 0600).
//!
//! Cluster mode: one Redis hash per server, `{prefix}:oauth:tokens:{SERVER}`, field IDENTITY,
//! sealed with a key derived from the cluster key, so every replica reads what another
//! stored.
//!
//! Each entry is sealed (`seal::Sealer`, its own purpose key) under its name (server,
//! identity): an entry moved to another identity (or server) does not open.

use super::seal::Sealer;
use crate::config::Config;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the sealing key is derived for.
const PURPOSE: &str = "oauth-tokens";

/// One user's tokens for one server.
#[derive(Clone, Serialize, Deserialize)]
pub struct Tokens {
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Unix seconds; `None`: the server said nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// The server's URL (origin and path) the tokens were got for: after a reload that
    /// changes it they are not sent to the new one. `None`: stored before this was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("refresh_token", &self.refresh_token.as_ref().map(|_| "****"))
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Tokens {
    /// Whether the access token expires within `margin` seconds (or has).
    pub fn expiring(&self, margin: u64) -> bool {
        self.expires_at.is_some_and(|t| t <= now_secs() + margin)
    }
}

pub struct Store {
    seal: Sealer,
    kind: Kind,
}

enum Kind {
    File {
        path: PathBuf,
        /// The file as last read, and its (modified, length) then.
        cache: tokio::sync::Mutex<(Option<(SystemTime, u64)>, FileData)>,
    },
    Redis {
        conn: redis::aio::ConnectionManager,
        prefix: String,
    },
}

#[derive(Default, Serialize, Deserialize)]
struct FileData {
    version: u32,
    tokens: BTreeMap<String, BTreeMap<String, String>>,
}

impl Store {
    /// The store of `config`: Redis in cluster mode (`conn` is the cluster's connection,
    /// or `None` to open one, for the command line), else the file.
    pub fn open(config: &Config, conn: Option<redis::aio::ConnectionManager>) -> Result<Store, String> {
        if let Some(c) = &config.cluster {
            let seal = Sealer::new(c.key.expose().as_bytes(), PURPOSE);
            let conn = match conn {
                Some(c) => c,
                None => {
                    let client = redis::Client::open(c.redis.expose())
                        .map_err(|_| "cluster.redis is not a Redis URL the client accepts".to_owned())?;
                    redis::aio::ConnectionManager::new_lazy_with_config(
                        client,
                        redis::aio::ConnectionManagerConfig::new()
                            .set_response_timeout(Some(std::time::Duration::from_secs(5)))
                            .set_connection_timeout(Some(std::time::Duration::from_secs(5)))
                            .set_number_of_retries(1),
                    )
                    .map_err(|_| "cannot open a connection to cluster.redis".to_owned())?
                }
            };
            return Ok(Store {
                seal,
                kind: Kind::Redis {
                    conn,
                    prefix: c.prefix.clone(),
                },
            });
        }
        let dir = &config.gateway.state_dir;
        warn_if_shared(dir);
        let key = match &config.gateway.token_key {
            Some(k) => k.expose().as_bytes().to_vec(),
            None => key_file(dir)?,
        };
        Ok(Store {
            seal: Sealer::new(&key, PURPOSE),
            kind: Kind::File {
                path: dir.join("tokens.json"),
                cache: tokio::sync::Mutex::new((None, FileData::default())),
            },
        })
    }

    /// Where it keeps the tokens, for messages (no secret in it).
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::File { path, .. } => path.display().to_string(),
            Kind::Redis { prefix, .. } => format!("Redis ({prefix}:oauth:tokens:*)"),
        }
    }

    pub async fn get(&self, server: &str, identity: &str) -> Result<Option<Tokens>, String> {
        self.get_as(server, identity).await
    }

    pub async fn put(&self, server: &str, identity: &str, tokens: &Tokens) -> Result<(), String> {
        self.put_as(server, identity, tokens).await
    }

    /// Any sealed record under (server, identity).
    pub async fn get_as<T: serde::de::DeserializeOwned>(
        &self,
        server: &str,
        identity: &str,
    ) -> Result<Option<T>, String> {
        let sealed = match &self.kind {
            Kind::File { path, cache } => {
                let mut c = cache.lock().await;
                refresh_cache(path, &mut c)?;
                c.1.tokens.get(server).and_then(|m| m.get(identity)).cloned()
            }
            Kind::Redis { conn, prefix } => {
                let mut conn = conn.clone();
                redis::cmd("HGET")
                    .arg(hash(prefix, server))
                    .arg(identity)
                    .query_async::<Option<String>>(&mut conn)
                    .await
                    .map_err(|e| format!("the token store (Redis) failed: {}", e.kind_str()))?
            }
        };
        let Some(sealed) = sealed else { return Ok(None) };
        // An entry that does not open (another key, moved, altered) counts as none.
        Ok(self
            .seal
            .open(&[server, identity], &sealed)
            .ok()
            .and_then(|plain| serde_json::from_slice(&plain).ok()))
    }

    pub async fn put_as<T: Serialize>(&self, server: &str, identity: &str, tokens: &T) -> Result<(), String> {
        let plain = serde_json::to_vec(tokens).map_err(|e| e.to_string())?;
        let sealed = self.seal.seal(&[server, identity], &plain).map_err(|e| e.to_string())?;
        match &self.kind {
            Kind::File { path, cache } => {
                let mut c = cache.lock().await;
                // Read, changed and written under the file lock: another process sharing
                // state_dir (a second gateway, `tokens revoke`) loses nothing.
                let _locked = lock_file(path).await?;
                c.0 = None;
                refresh_cache(path, &mut c)?;
                c.1.version = 1;
                c.1.tokens
                    .entry(server.to_owned())
                    .or_default()
                    .insert(identity.to_owned(), sealed);
                write_file(path, &mut c)
            }
            Kind::Redis { conn, prefix } => {
                let mut conn = conn.clone();
                redis::cmd("HSET")
                    .arg(hash(prefix, server))
                    .arg(identity)
                    .arg(sealed)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("the token store (Redis) failed: {}", e.kind_str()))
            }
        }
    }

    /// Forgets one principal's tokens for one server; whether there were any.
    pub async fn remove(&self, server: &str, identity: &str) -> Result<bool, String> {
        match &self.kind {
            Kind::File { path, cache } => {
                let mut c = cache.lock().await;
                let _locked = lock_file(path).await?;
                c.0 = None;
                refresh_cache(path, &mut c)?;
                let had = c.1.tokens.get_mut(server).is_some_and(|m| m.remove(identity).is_some());
                if had {
                    c.1.tokens.retain(|_, m| !m.is_empty());
                    write_file(path, &mut c)?;
                }
                Ok(had)
            }
            Kind::Redis { conn, prefix } => {
                let mut conn = conn.clone();
                redis::cmd("HDEL")
                    .arg(hash(prefix, server))
                    .arg(identity)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(|n| n > 0)
                    .map_err(|e| format!("the token store (Redis) failed: {}", e.kind_str()))
            }
        }
    }
}

impl Store {
    /// Whether it is shared by replicas (Redis).
    pub fn shared(&self) -> bool {
        matches!(self.kind, Kind::Redis { .. })
    }

    fn pending_key(prefix: &str, kind: &str, id: &str) -> String {
        // A digest: the id is a bearer value (a link, a state), not kept as a key.
        format!("{prefix}:oauth:{kind}:{}", crate::cluster::digest(id))
    }

    /// Redis only: a sealed record that expires after `ttl`.
    pub async fn put_pending<T: Serialize>(
        &self,
        kind: &str,
        id: &str,
        v: &T,
        ttl: std::time::Duration,
    ) -> Result<(), String> {
        let Kind::Redis { conn, prefix } = &self.kind else {
            return Err("not a shared store".into());
        };
        let plain = serde_json::to_vec(v).map_err(|e| e.to_string())?;
        let key = Self::pending_key(prefix, kind, id);
        let sealed = self.seal.seal(&[kind, &key], &plain).map_err(|e| e.to_string())?;
        let mut conn = conn.clone();
        redis::cmd("SET")
            .arg(&key)
            .arg(sealed)
            .arg("EX")
            .arg(ttl.as_secs().max(1))
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| format!("the token store (Redis) failed: {}", e.kind_str()))
    }

    /// Redis only: counts one more pending record of `owner` (expiring `ttl` after the
    /// first); how many there are now.
    pub async fn count_pending(&self, owner: &str, ttl: std::time::Duration) -> Result<u64, String> {
        let Kind::Redis { conn, prefix } = &self.kind else {
            return Err("not a shared store".into());
        };
        let key = Self::pending_key(prefix, "count", owner);
        let mut conn = conn.clone();
        let failed = |e: redis::RedisError| format!("the token store (Redis) failed: {}", e.kind_str());
        let n: u64 = redis::cmd("INCR")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(failed)?;
        if n == 1 {
            redis::cmd("EXPIRE")
                .arg(&key)
                .arg(ttl.as_secs().max(1))
                .query_async::<i64>(&mut conn)
                .await
                .map_err(failed)?;
        }
        Ok(n)
    }

    pub async fn get_pending<T: serde::de::DeserializeOwned>(&self, kind: &str, id: &str) -> Result<Option<T>, String> {
        self.pending(kind, id, "GET").await
    }

    /// Takes it out (`GETDEL`): of two replicas taking one record, one gets it.
    pub async fn take_pending<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
    ) -> Result<Option<T>, String> {
        self.pending(kind, id, "GETDEL").await
    }

    async fn pending<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
        cmd: &str,
    ) -> Result<Option<T>, String> {
        let Kind::Redis { conn, prefix } = &self.kind else {
            return Err("not a shared store".into());
        };
        let key = Self::pending_key(prefix, kind, id);
        let mut conn = conn.clone();
        let sealed: Option<String> = redis::cmd(cmd)
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("the token store (Redis) failed: {}", e.kind_str()))?;
        Ok(sealed
            .and_then(|s| self.seal.open(&[kind, &key], &s).ok())
            .and_then(|p| serde_json::from_slice(&p).ok()))
    }
}

fn hash(prefix: &str, server: &str) -> String {
    format!("{prefix}:oauth:tokens:{server}")
}

trait KindStr {
    fn kind_str(&self) -> String;
}

impl KindStr for redis::RedisError {
    /// The error's kind only: a Redis error's text may quote the command, and so a token.
    fn kind_str(&self) -> String {
        format!("{:?}", self.kind())
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Reads the file again if it changed on disk since it was last read.
fn refresh_cache(path: &Path, c: &mut (Option<(SystemTime, u64)>, FileData)) -> Result<(), String> {
    let now = stamp(path);
    if now.is_some() && now == c.0 {
        return Ok(());
    }
    c.1 = match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| failed("the token store is not valid", path, &e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileData::default(),
        Err(e) => return Err(failed("cannot read the token store", path, &e)),
    };
    c.0 = now;
    Ok(())
}

fn write_file(path: &Path, c: &mut (Option<(SystemTime, u64)>, FileData)) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    make_dir(dir)?;
    let bytes = serde_json::to_vec_pretty(&c.1).map_err(|e| e.to_string())?;
    // A name nobody can guess, made new (O_EXCL, O_NOFOLLOW): a file or symlink planted in
    // state_dir is never written through.
    let mut r = [0u8; 12];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut r)
        .map_err(|_| "no randomness for the token store's temporary file".to_owned())?;
    let tmp = dir.join(format!(".tokens.json.{}", crate::cluster::hex(&r)));
    write_private(&tmp, &bytes, true)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed("cannot write the token store", path, &e));
    }
    c.0 = stamp(path);
    Ok(())
}

/// The exclusive lock (flock) on `{state_dir}/tokens.lock`, held while the store's file is
/// read, changed and written; released when dropped. Waited for (without blocking the
/// runtime) up to 10 s.
async fn lock_file(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    make_dir(dir)?;
    let lock = dir.join("tokens.lock");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock)
        .map_err(|e| failed("cannot open the token store's lock", &lock, &e))?;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Err(e) => return Err(failed("cannot lock the token store", &lock, &e)),
        }
    }
}

/// An error of the store's file: the path and the cause go to the log only (an error
/// reaches MCP clients, who need not learn the gateway's file system).
fn failed(what: &str, path: &Path, e: &dyn std::fmt::Display) -> String {
    tracing::warn!(path = %path.display(), error = %e, "{what}");
    format!("{what} (the gateway's log says why)")
}

fn make_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| failed("cannot create the state directory", dir, &e))
}

/// Writes `bytes` to a file only its owner may read (0600); `new`: only if it does not exist.
fn write_private(path: &Path, bytes: &[u8], new: bool) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    if new {
        o.create_new(true);
    } else {
        o.create(true).truncate(true);
    }
    let mut f = o.open(path).map_err(|e| failed("cannot write", path, &e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| failed("cannot write", path, &e))
}

/// The key in `{dir}/token.key`, made (32 random bytes, hex, 0600) when there is none.
fn key_file(dir: &Path) -> Result<Vec<u8>, String> {
    let path = dir.join("token.key");
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            check_private(&path)?;
            return crate::cluster::unhex(s.trim())
                .filter(|k| k.len() >= 32)
                .ok_or_else(|| failed("the token key file is not a token key (64 hex digits)", &path, &"-"));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed("cannot read the token key file", &path, &e)),
    }
    make_dir(dir)?;
    let mut key = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| "no randomness for the token key".to_owned())?;
    match write_private(&path, crate::cluster::hex(&key).as_bytes(), true) {
        Ok(()) => Ok(key.to_vec()),
        // Another process made it first: use that one.
        Err(_) if path.exists() => key_file(dir),
        Err(e) => Err(e),
    }
}

/// A state_dir others may write to is warned about: they could replace what is in it.
pub fn warn_if_shared(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(dir) {
        let mode = m.permissions().mode();
        if mode & 0o022 != 0 {
            tracing::warn!(
                state_dir = %dir.display(),
                mode = format!("{:o}", mode & 0o777),
                "state_dir may be written by others (group or world): chmod 700 it"
            );
        }
    }
}

/// A key file others may read is refused: whoever can read it can open every token.
fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| failed("cannot read the token key file", path, &e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        let why = format!("mode {:o}", mode & 0o777);
        return Err(failed(
            "the token key file may be read by others: chmod 600 it",
            path,
            &why,
        ));
    }
    Ok(())
}

/// The principals with tokens for `server` (the file's, or Redis's with HKEYS).
pub async fn principals(store: &Store, server: &str) -> Result<Vec<String>, String> {
    match &store.kind {
        Kind::File { path, cache } => {
            let mut c = cache.lock().await;
            refresh_cache(path, &mut c)?;
            Ok(c.1
                .tokens
                .get(server)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default())
        }
        Kind::Redis { conn, prefix } => {
            let mut conn = conn.clone();
            redis::cmd("HKEYS")
                .arg(hash(prefix, server))
                .query_async::<Vec<String>>(&mut conn)
                .await
                .map_err(|e| format!("the token store (Redis) failed: {}", e.kind_str()))
        }
    }
}
