//! Handshake-era sessions: the table, `initialize` (which opens one), its owner's share
//! of the sessions, expiry, and DELETE (which ends one).

use super::checks::admit_bodyless;
use super::{json_response, refuse, reject, Http, SESSION_HEADER};
use crate::auth::Identity;
use crate::catalog::view::ViewKey;
use crate::error::{code, Error};
use crate::front::replay::Replay;
use crate::message::{self, Id, Outcome};
use crate::router::Client;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// One handshake-era client session.
pub(super) struct Session {
    pub(super) client: Arc<Client>,
    /// The principal of the identity that opened it (`auth::Identity::principal`), when
    /// auth is configured; nobody else may use it, a caller of the same name from another
    /// issuer included.
    pub(super) owner: Option<String>,
    /// Whose share of `gateway.max_sessions_per_client` it is (see [`share_of`]).
    pub(super) share: Arc<str>,
    pub(super) protocol_version: String,
    /// Milliseconds since the gateway started, at the last request.
    pub(super) last_seen: AtomicU64,
    /// A GET stream is open; server-initiated messages go to exactly one stream.
    pub(super) get_open: AtomicBool,
    /// The open GET stream's connection: its number, how to end it (a GET resuming the
    /// stream takes it over from a connection the gateway has not seen die yet), and when
    /// it opened (ms since the epoch: in cluster mode a newer one on another replica ends it).
    pub(super) get_conn: std::sync::Mutex<Option<(u64, CancellationToken, u64)>>,
    /// Its SSE streams' events, for `Last-Event-ID`; made by its first SSE stream.
    pub(super) replay: std::sync::OnceLock<Arc<Replay>>,
    /// Its protocol version (2025-11-25 or later) has priming events and `retry`.
    pub(super) priming: bool,
    /// It counts against this replica's `shares` (it was opened here; a session another
    /// replica opened and this one serves from its record does not).
    pub(super) counted: bool,
}

impl Session {
    /// Ends its open GET stream, if any: a session that ended sends nothing more.
    pub(super) fn close_get_stream(&self) {
        if let Some((_, ended, _)) = crate::sync::lock(&self.get_conn).take() {
            ended.cancel();
        }
    }

    /// Cluster mode: a GET stream of this session opened on another replica at `at`;
    /// this one's ends if it opened before (the client reconnected elsewhere, or holds a
    /// second stream it would hear every notification on twice).
    pub(super) fn stream_taken(&self, at: u64) -> bool {
        // Ended, not taken: the stream's own end clears it (and finishes its events).
        match &*crate::sync::lock(&self.get_conn) {
            Some((_, ended, since)) if *since < at => {
                ended.cancel();
                true
            }
            _ => false,
        }
    }

    /// What another replica needs to serve it (cluster mode).
    pub(super) fn record(&self, id: &str) -> crate::cluster::sessions::Record {
        crate::cluster::sessions::Record {
            id: id.to_owned(),
            owner: self.owner.clone(),
            share: self.share.to_string(),
            protocol_version: self.protocol_version.clone(),
            capabilities: crate::sync::read(&self.client.capabilities).clone(),
            view: self.client.view().map(ViewKey::encode),
        }
    }

    /// Its replay, made on first use with `http`'s id origin.
    pub(super) fn replay(&self, http: &Http) -> Arc<Replay> {
        self.replay
            .get_or_init(|| {
                Arc::new(Replay::new(
                    http.origin.clone(),
                    http.replay_budget.clone(),
                    self.share.clone(),
                ))
            })
            .clone()
    }
}

/// Sessions whose records one pipeline restores (see [`Http::reconcile_records`]).
const RESTORE_BATCH: usize = 256;

/// The first protocol version whose SSE streams start with a priming event.
pub(super) const PRIMING_SINCE: &str = "2025-11-25";

impl Http {
    /// After a reload: a session whose credential is gone (its client's `[clients.NAME]`
    /// table or token changed, and no OAuth could name it) ends, its streams with it, as
    /// if its token were revoked; every other session of a client takes the client's new
    /// allowlist at once, not at its next request, so what is delivered to it (resource
    /// updates) follows the new file.
    pub fn follow_reload(&self) {
        let auth = self.gw.topology().auth.clone();
        let mut revoked = Vec::new();
        for s in self.sessions.iter() {
            if s.owner.is_none() {
                continue;
            }
            let Some(was) = s.client.identity() else { continue };
            match auth.reread(&was) {
                Some(now) => s.client.set_identity(Some(now)),
                None => revoked.push(s.key().clone()),
            }
        }
        for id in revoked {
            info!(session = %crate::client::session_tag(&id), "session ended: its client or its token is no longer in gateway.toml");
            self.end_session(&id);
        }
    }

    /// Ends sessions idle for longer than `gateway.session_idle`; run periodically.
    pub fn expire_idle(&self) {
        // Events past their age go from every session, recording or not.
        for s in self.sessions.iter() {
            if let Some(replay) = s.replay.get() {
                replay.trim();
            }
        }
        let now = self.now_ms();
        let idle = u64::try_from(self.gw.config().gateway.session_idle.as_millis()).unwrap_or(u64::MAX);
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|s| {
                !s.get_open.load(Ordering::Relaxed) && now.saturating_sub(s.last_seen.load(Ordering::Relaxed)) >= idle
            })
            .map(|s| s.key().clone())
            .collect();
        if let Some(cluster) = self.gw.cluster().cloned() {
            self.refresh_records(&cluster, now, idle);
            // What sessions whose record expired left in Redis goes, whichever replica
            // served them (they may all have dropped their copies, or died): one replica
            // sweeps per half a janitor's round.
            let gw = self.gw.clone();
            let every = (self.gw.config().gateway.session_idle / 4)
                .clamp(std::time::Duration::from_millis(50), std::time::Duration::from_secs(30));
            crate::background::spawn(async move { gw.sweep(every).await });
            // Another replica may still serve it: this one forgets its copy, and ends the
            // session only when its record is gone too (nobody used it for session_idle).
            for id in expired {
                let http = self.clone();
                let cluster = cluster.clone();
                crate::background::spawn(async move {
                    let gone = matches!(cluster.sessions.load(&cluster, &id).await, Ok(None));
                    if gone {
                        info!(session = %crate::client::session_tag(&id), "session expired");
                        http.end_session(&id);
                    } else {
                        tracing::debug!(session = %crate::client::session_tag(&id), "session idle here; its record stays for the other replicas");
                        http.drop_copy(&id);
                    }
                });
            }
            return;
        }
        for id in expired {
            info!(session = %crate::client::session_tag(&id), "session expired");
            self.end_session(&id);
        }
    }

    /// Cluster mode: extends the records of the sessions this replica served since the
    /// last refresh (and of those with a GET stream open here), in the background. A
    /// record that is gone is written back, unless the session ended on another replica
    /// (a note this one missed): then this copy goes.
    fn refresh_records(&self, cluster: &Arc<crate::cluster::Cluster>, now: u64, idle: u64) {
        let since = self.refreshed.swap(now, Ordering::Relaxed);
        let (ids, shares): (Vec<String>, Vec<Arc<str>>) = self
            .sessions
            .iter()
            .filter(|s| s.get_open.load(Ordering::Relaxed) || s.last_seen.load(Ordering::Relaxed) >= since)
            .map(|s| (s.key().clone(), s.share.clone()))
            .unzip();
        // The GET streams open here, and when each opened.
        let streams: Vec<(String, u64)> = self
            .sessions
            .iter()
            .filter_map(|s| {
                let at = crate::sync::lock(&s.get_conn).as_ref().map(|(_, _, at)| *at)?;
                Some((s.key().clone(), at))
            })
            .collect();
        let unended = !crate::sync::lock(&self.unended).is_empty();
        if ids.is_empty() && !unended {
            return;
        }
        let (cluster, gw, http) = (cluster.clone(), self.gw.clone(), self.clone());
        let ttl = std::time::Duration::from_millis(idle);
        crate::background::spawn(async move {
            if unended {
                http.end_records(&cluster).await;
            }
            if let Ok(there) = cluster.sessions.touch(&cluster, &ids, ttl).await {
                let gone: Vec<&String> = ids.iter().zip(&there).filter(|(_, t)| !**t).map(|(id, _)| id).collect();
                http.restore(&cluster, gone, ttl).await;
            }
            let counted: Vec<(&str, &str)> = ids
                .iter()
                .map(String::as_str)
                .zip(shares.iter().map(|s| &**s))
                .collect();
            cluster.touch_sessions(&counted, ttl).await;
            gw.touch_processes(&ids).await;
            // A stream another replica opened since, whose note was missed here, ends this one.
            if let Some(newest) = gw.newest_streams(&streams).await {
                for ((id, at), newest) in streams.iter().zip(newest) {
                    let session = http.sessions.get(id).map(|s| s.clone());
                    if newest > *at && session.is_some_and(|s| s.stream_taken(newest)) {
                        tracing::debug!(session = %crate::client::session_tag(id), "its GET stream opened on another replica (a note missed here): ended here");
                    }
                }
            }
        });
    }

    /// Cluster mode: after Redis or the bus was unreachable, writes the ends that failed
    /// meanwhile, puts the records of the sessions this replica holds back into Redis
    /// where they are missing (a Redis that restarted empty, or a session opened here
    /// while Redis was down), and forgets the copies of sessions another replica ended
    /// meanwhile (the bus's note of it lost).
    pub async fn reconcile_records(&self) {
        let Some(cluster) = self.gw.cluster().cloned() else {
            return;
        };
        let ttl = self.gw.config().gateway.session_idle;
        if !self.end_records(&cluster).await {
            return;
        }
        let ids: Vec<String> = self.sessions.iter().map(|s| s.key().clone()).collect();
        self.restore(&cluster, ids.iter().collect(), ttl).await;
    }

    /// Restores the records of sessions `ids` held here, or drops the copies of those
    /// that ended elsewhere; a pipeline of [`RESTORE_BATCH`] at a time. Stops at the first
    /// failure.
    async fn restore(&self, cluster: &crate::cluster::Cluster, ids: Vec<&String>, ttl: std::time::Duration) {
        use crate::cluster::sessions::Restored;
        let mut ended = 0;
        for batch in ids.chunks(RESTORE_BATCH) {
            let records: Vec<crate::cluster::sessions::Record> = batch
                .iter()
                .filter_map(|id| self.sessions.get(id.as_str()).map(|s| s.record(s.key())))
                .collect();
            let Ok(found) = cluster.sessions.restore(cluster, &records, ttl).await else {
                return;
            };
            for (record, found) in records.iter().zip(found) {
                if found == Restored::Ended {
                    info!(session = %crate::client::session_tag(&record.id), "session ended on another replica (its note missed); forgetting it here");
                    self.drop_copy(&record.id);
                    ended += 1;
                }
            }
        }
        if !ids.is_empty() {
            tracing::debug!(sessions = ids.len(), ended, "session records reconciled with Redis");
        }
    }

    /// Writes the ends that failed while Redis was unreachable, and tells the bus of them;
    /// false if Redis is still unreachable.
    async fn end_records(&self, cluster: &crate::cluster::Cluster) -> bool {
        let pending: Vec<String> = crate::sync::lock(&self.unended).iter().cloned().collect();
        let ttl = self.gw.config().gateway.session_idle;
        for sid in pending {
            if cluster.sessions.delete(cluster, &sid, ttl).await.is_err() {
                return false;
            }
            // A replica that put the record back before the tombstone was written, and
            // listens again by now, forgets its copy at once.
            self.gw.ended_elsewhere(&sid);
            crate::sync::lock(&self.unended).remove(&sid);
        }
        true
    }

    /// Ends a session: its requests are cancelled and its subscriptions dropped. In
    /// cluster mode every replica forgets it, and its record goes.
    pub fn end_session(&self, sid: &str) {
        let removed = self.sessions.remove(sid);
        if let Some(cluster) = self.gw.cluster().cloned() {
            let sid = sid.to_owned();
            let share = removed.as_ref().map(|(_, s)| s.share.clone());
            let (http, ttl) = (self.clone(), self.gw.config().gateway.session_idle);
            crate::background::spawn(async move {
                // The bus hears of it once the tombstone is written: a replica that put the
                // record back before then (Redis was just back) hears it after.
                if cluster.sessions.delete(&cluster, &sid, ttl).await.is_ok() {
                    http.gw.ended_elsewhere(&sid);
                } else {
                    // Written (and told) once Redis is back, before any record is restored.
                    crate::sync::lock(&http.unended).insert(sid.clone());
                }
                if let Some(share) = share {
                    cluster.release_session(&sid, &share).await;
                }
            });
        }
        if let Some((_, s)) = removed {
            // One event per client's burst: 10 000 sessions ending must not flush the ring.
            crate::console::events().burst(
                "session_ended",
                &format!("ended {}", s.share),
                None,
                format!("{} ended a session", s.share),
            );
            if s.counted {
                self.release_share(&s.share);
            }
            s.client.cancel_all();
            s.close_get_stream();
            let (gw, client) = (self.gw.clone(), s.client.clone());
            crate::background::spawn(async move { gw.forget_client(&client).await });
        }
    }

    /// Cluster mode: forgets this replica's copy of a session that goes on elsewhere (or
    /// that another replica ended): its calls here are cancelled, its processes here end.
    pub fn drop_copy(&self, sid: &str) {
        if let Some((_, s)) = self.sessions.remove(sid) {
            if s.counted {
                self.release_share(&s.share);
            }
            s.client.cancel_all();
            s.close_get_stream();
            let (gw, client) = (self.gw.clone(), s.client.clone());
            crate::background::spawn(async move { gw.forget_copy(&client).await });
        }
    }

    /// Counts one more session for `share`, unless it already has `max`.
    fn take_share(&self, share: &Arc<str>, max: usize) -> bool {
        let mut n = self.shares.entry(share.clone()).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn release_share(&self, share: &Arc<str>) {
        if let Some(mut n) = self.shares.get_mut(share) {
            *n = n.saturating_sub(1);
        }
        self.shares.remove_if(share, |_, n| *n == 0);
    }
}

/// Finds the session a request names: 400 without the header, 404 when unknown, when
/// it belongs to another identity, or when it was opened on another endpoint (`view`:
/// the request's; a session of `/mcp/a` is not found at `/mcp/b` or `/mcp`). In cluster
/// mode a session this replica does not know is looked up in Redis once, and served
/// from its record.
pub(super) async fn session(
    http: &Http,
    headers: &HeaderMap,
    who: Option<&Arc<Identity>>,
    view: Option<&ViewKey>,
) -> Result<(String, Arc<Session>), Error> {
    let Some(id) = headers.get(&SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
        return Err(reject(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "missing Mcp-Session-Id header: send initialize first",
        ));
    };
    match http.sessions.get(id) {
        Some(s) if s.owner.as_deref() == who.map(|i| i.principal.as_str()) && s.client.view() == view => {
            s.last_seen.store(http.now_ms(), Ordering::Relaxed);
            if who.is_some() {
                // The same name, with the policy of the config now in force.
                s.client.set_identity(who.cloned());
            }
            Ok((id.to_owned(), s.clone()))
        }
        // Boxed: the lookup in Redis is a large future, and inline it would make every
        // request's future that large.
        None if http.gw.cluster().is_some() => Box::pin(adopt(http, id, who, view)).await,
        _ => Err(unknown_session()),
    }
}

fn unknown_session() -> Error {
    reject(StatusCode::NOT_FOUND, code::INVALID_REQUEST, "unknown or ended session")
}

/// Cluster mode: serves a session another replica opened, from its record in Redis.
async fn adopt(
    http: &Http,
    id: &str,
    who: Option<&Arc<Identity>>,
    view: Option<&ViewKey>,
) -> Result<(String, Arc<Session>), Error> {
    let Some(cluster) = http.gw.cluster() else {
        return Err(unknown_session());
    };
    // Not a session id this gateway could have made: no need to ask Redis.
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(unknown_session());
    }
    let record = match cluster.sessions.load(cluster, id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(unknown_session()),
        Err(_) => {
            return Err(match cluster.on_redis_down {
                crate::config::OnRedisDown::Local => unknown_session(),
                crate::config::OnRedisDown::Refuse => reject(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code::INTERNAL_ERROR,
                    "Redis is unreachable, and this replica does not know the session (cluster.on_redis_down = \"refuse\"); try again",
                ),
            })
        }
    };
    // The endpoint it was opened on; a record naming a view this replica cannot read
    // (a newer replica's) is not served here.
    let opened_at = match record.view.as_deref() {
        None => None,
        Some(text) => Some(ViewKey::decode(text).ok_or_else(unknown_session)?),
    };
    if record.owner.as_deref() != who.map(|i| i.principal.as_str()) || opened_at.as_ref() != view {
        return Err(unknown_session());
    }
    let level = http.gw.session_log_level(id).await;
    let share: Arc<str> = record.share.into();
    let client = Arc::new(
        Client::new(id.to_owned())
            .in_view(view.cloned())
            .of_share(share.clone()),
    );
    *crate::sync::write(&client.capabilities) = record.capabilities.clone();
    *crate::sync::write(&client.log_level) = level;
    let _ = client.protocol_version.set(record.protocol_version.clone().into());
    client.set_identity(who.cloned());
    let session = Arc::new(Session {
        client,
        owner: record.owner,
        share,
        priming: record.protocol_version.as_str() >= PRIMING_SINCE,
        protocol_version: record.protocol_version,
        last_seen: AtomicU64::new(http.now_ms()),
        get_open: AtomicBool::new(false),
        get_conn: std::sync::Mutex::new(None),
        replay: std::sync::OnceLock::new(),
        counted: false,
    });
    // Two requests of the session may adopt it at once: the first copy wins.
    let session = http.sessions.entry(id.to_owned()).or_insert(session).clone();
    http.gw.remember(&session.client);
    tracing::debug!(session = %crate::client::session_tag(id), "serving a session another replica opened");
    Ok((id.to_owned(), session))
}

/// 128 bits from the OS CSPRNG, as 32 hex characters.
pub(super) fn new_session_id() -> String {
    use rand::RngCore;
    // ThreadRng is a CSPRNG (ChaCha12) seeded from the OS.
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whose share of the sessions one belongs to: the authenticated client's name, or with
/// no auth the caller's address (behind a proxy, every caller has the proxy's).
pub(super) fn share_of(who: Option<&Identity>, peer: Option<std::net::IpAddr>) -> Arc<str> {
    match (who, peer) {
        (Some(i), _) => format!("client '{}'", i.name).into(),
        (None, Some(ip)) => format!("{}{ip}", crate::client::ADDRESS_SHARE).into(),
        (None, None) => "an unknown address".into(),
    }
}

pub(super) async fn initialize(
    http: &Http,
    id: &Id,
    params: Option<&serde_json::value::RawValue>,
    who: Option<Arc<Identity>>,
    peer: Option<std::net::IpAddr>,
    view: Option<ViewKey>,
) -> Response {
    // Like any other request of the client: over its rate limits, the same -32029.
    // In cluster mode, over every replica's requests (one Redis round trip).
    if let Err(limited) = http.gw.admit_initialize_shared(who.as_deref()).await {
        return json_response(message::response(id, &limited));
    }
    let config = http.gw.config();
    let max = config.gateway.max_sessions;
    if http.sessions.len() >= max {
        return refuse(
            id,
            reject(
                StatusCode::SERVICE_UNAVAILABLE,
                code::INTERNAL_ERROR,
                format!("the gateway has {max} open sessions, its limit (gateway.max_sessions); end one or try later"),
            ),
        );
    }
    let share = share_of(who.as_deref(), peer);
    let per_client = config.gateway.max_sessions_per_client;
    if !http.take_share(&share, per_client) {
        return refuse(id, reject(
            StatusCode::SERVICE_UNAVAILABLE,
            code::INTERNAL_ERROR,
            format!(
                "{share} has {per_client} open sessions, its limit (gateway.max_sessions_per_client); end one or try later"
            ),
        ));
    }
    let sid = new_session_id();
    if let Some(cluster) = http.gw.cluster() {
        // The limits hold over every replica's sessions.
        use crate::cluster::limits::SessionLimit;
        let ttl = config.gateway.session_idle;
        match cluster.take_session(&sid, &share, max, per_client, ttl).await {
            Ok(()) => {}
            Err(SessionLimit::Unreachable) if cluster.on_redis_down == crate::config::OnRedisDown::Local => {}
            Err(limit) => {
                http.release_share(&share);
                let e = reject(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code::INTERNAL_ERROR,
                    limit.message(&share),
                );
                return refuse(id, e);
            }
        }
    }
    let outcome = http.gw.initialize_result_for(params, who.as_deref(), view.as_ref());
    let version = match &outcome {
        Outcome::Result(r) => serde_json::from_str::<Value>(r.get())
            .ok()
            .and_then(|v| v.get("protocolVersion").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default(),
        Outcome::Error(_) => String::new(),
    };
    let owner = who.as_ref().map(|i| i.principal.clone());
    let client_name = who.as_ref().map(|i| i.name.clone());
    let session = Session {
        client: {
            let c = Arc::new(Client::new(sid.clone()).in_view(view.clone()).of_share(share.clone()));
            c.set_capabilities(params);
            let _ = c.protocol_version.set(version.clone().into());
            c.set_identity(who);
            let _ = c.stats.set(http.gw.metrics.clients.row(&share));
            c
        },
        owner,
        share,
        protocol_version: version.clone(),
        last_seen: AtomicU64::new(http.now_ms()),
        get_open: AtomicBool::new(false),
        get_conn: std::sync::Mutex::new(None),
        replay: std::sync::OnceLock::new(),
        priming: version.as_str() >= PRIMING_SINCE,
        counted: true,
    };
    if let Some(cluster) = http.gw.cluster() {
        let saved = cluster
            .sessions
            .save(cluster, &session.record(&sid), config.gateway.session_idle)
            .await;
        if saved.is_err() && cluster.on_redis_down == crate::config::OnRedisDown::Refuse {
            http.release_share(&session.share);
            cluster.release_session(&sid, &session.share).await;
            return refuse(
                id,
                reject(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code::INTERNAL_ERROR,
                    "Redis is unreachable, so no session can be opened (cluster.on_redis_down = \"refuse\"); try again",
                ),
            );
        }
    }
    if http.gw.cluster().is_some() {
        // Other replicas deliver to it, answer its questions and cancel its calls by key.
        http.gw.remember(&session.client);
    }
    let opened_by = session.share.clone();
    http.sessions.insert(sid.clone(), Arc::new(session));
    let endpoint = view.as_ref().map_or(String::new(), ViewKey::to_string);
    crate::console::events().burst(
        "session_opened",
        &format!("opened {opened_by}"),
        None,
        format!(
            "{} opened a session ({version}{}{endpoint})",
            opened_by,
            if endpoint.is_empty() { "" } else { ", " }
        ),
    );
    match &client_name {
        Some(client) => {
            info!(session = %crate::client::session_tag(&sid), %version, %client, %endpoint, "session opened")
        }
        None => info!(session = %crate::client::session_tag(&sid), %version, %endpoint, "session opened"),
    }
    let mut resp = json_response(message::response(id, &outcome));
    if let Ok(v) = HeaderValue::from_str(&sid) {
        resp.headers_mut().insert(SESSION_HEADER.clone(), v);
    }
    resp
}

pub(super) async fn delete(State(http): State<Http>, req: axum::extract::Request) -> Response {
    let (headers, who, view) = match admit_bodyless(&http, req).await {
        Ok(a) => (a.headers, a.who, a.view),
        Err(resp) => return resp,
    };
    let (sid, _) = match session(&http, &headers, who.as_ref(), view.as_ref()).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    info!(session = %crate::client::session_tag(&sid), "session ended by the client");
    http.end_session(&sid);
    StatusCode::OK.into_response()
}
