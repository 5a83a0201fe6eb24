//! Cluster mode, the router's side: what this replica tells the others over the bus, and
//! what it does with what they tell it (see [`crate::cluster::bus`]). Sessions are named
//! on the bus by their [`crate::shared::Shared::key`] (a digest, never the id).

use super::Gateway;
use crate::catalog::view::{Announcement, Reach, ViewKey};
use crate::cluster::bus::{Ack, Note, To, WireReach};
use crate::cluster::Cluster;
use crate::downstream::{Params, LOG_LEVELS};
use crate::message::{self, Kind};
use crate::method::Method;
use bytes::Bytes;
use serde_json::json;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// A list_changed from the bus within this long of the same one sent here is the same
/// change seen by another replica's child: it is not sent twice.
const SAME_CHANGE: Duration = Duration::from_millis(500);
/// How long a change the client is answered for (`logging/setLevel`,
/// `resources/subscribe`) waits for the other replicas to apply it.
const SETTLES: Duration = Duration::from_secs(1);

/// Records that a session's GET stream opened at `ARGV[1]` (ms since the epoch) unless a
/// newer one did, and keeps the record `ARGV[2]` ms more; returns the newest.
/// `KEYS[1]`: the session's `stream:{digest}`.
static NEWEST_STREAM: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local at = tonumber(ARGV[1])
if at > cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return at
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return cur
",
    )
});

/// A note's wait for `Applied`: forgotten however the wait ends.
struct Waiting<'a> {
    gw: &'a Gateway,
    corr: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.gw.applied).remove(self.corr);
    }
}

impl Gateway {
    /// Joins the cluster: state goes to Redis from now on, and notes from the other
    /// replicas are handled as they come. Called once, before [`Gateway::start`].
    pub fn join(self: &Arc<Self>, cluster: Arc<Cluster>) {
        if self.cluster.set(cluster.clone()).is_err() {
            return;
        }
        self.shared.join(cluster.clone());
        let mut notes = crate::cluster::bus::Bus::listen(&cluster);
        let gw = Arc::downgrade(self);
        crate::background::spawn(async move {
            while let Some(note) = notes.recv().await {
                let Some(gw) = gw.upgrade() else { return };
                gw.note(note).await;
            }
        });
    }

    /// The cluster this replica belongs to, if any.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.get()
    }

    /// Where notes about parked calls go (the HTTP front's stateless flow).
    pub fn on_rounds(&self, tx: tokio::sync::mpsc::UnboundedSender<Note>) {
        let _ = self.rounds.set(tx);
    }

    /// Sessions this process tells the fronts to forget (another replica ended them), by id.
    pub fn ended(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.ended.subscribe()
    }

    fn publish(&self, to: To<'static>, note: Note) {
        let Some(c) = self.cluster.get().cloned() else { return };
        crate::background::spawn(async move {
            c.publish(to, note).await;
        });
    }

    /// [`Gateway::publish`] to one replica.
    fn publish_to(&self, replica: String, note: Note) {
        let Some(c) = self.cluster.get().cloned() else { return };
        crate::background::spawn(async move {
            c.publish(To::Replica(&replica), note).await;
        });
    }

    /// Cluster mode: `line` for session `key` also goes to whichever replica holds its
    /// GET stream.
    pub(super) fn deliver_elsewhere(&self, key: &str, line: Bytes) {
        if self.cluster.get().is_none() {
            return;
        }
        let Ok(line) = String::from_utf8(line.to_vec()) else {
            return;
        };
        self.publish(
            To::All,
            Note::Deliver {
                sid: key.to_owned(),
                line,
            },
        );
    }

    /// Cluster mode: a list_changed goes to every replica's streams (of the sessions it
    /// reaches).
    pub(super) fn announce_elsewhere(&self, line: &Bytes, reach: &Reach) {
        if self.cluster.get().is_none() {
            return;
        }
        let wire = wire(reach);
        crate::sync::lock(&self.announced).insert(same_change(line, &wire), Instant::now());
        let Ok(line) = String::from_utf8(line.to_vec()) else {
            return;
        };
        self.publish(
            To::All,
            Note::All {
                line,
                reach: Some(wire),
            },
        );
    }

    /// Cluster mode: a client's answer to a question no call here asked goes to the
    /// replica whose call did (every replica's ids are their own: see `Client::ask`).
    pub fn answer_elsewhere(&self, session: &str, line: &[u8]) {
        if self.cluster.get().is_none() {
            return;
        }
        let Ok(line) = String::from_utf8(line.to_vec()) else {
            return;
        };
        let sid = self.shared.key(session);
        self.publish(To::All, Note::Answer { sid, line });
    }

    /// Cluster mode: a cancellation of a request no call here runs goes to every replica.
    pub(super) fn cancel_elsewhere(&self, client: &super::Client, params: Option<&RawValue>) {
        if self.cluster.get().is_none() {
            return;
        }
        let sid = self.shared.key(&client.id);
        let params = params.map(|p| p.get().to_owned());
        self.publish(To::All, Note::Cancel { sid, params });
    }

    /// Cluster mode: the servers a session's calls reached on other replicas hear that its
    /// roots changed.
    pub(super) fn roots_changed_elsewhere(&self, client: &super::Client) {
        if self.cluster.get().is_none() {
            return;
        }
        let sid = self.shared.key(&client.id);
        self.publish(To::All, Note::RootsChanged { sid });
    }

    /// Cluster mode: tells the other replicas that session `id` ended.
    pub fn ended_elsewhere(&self, id: &str) {
        if self.cluster.get().is_none() {
            return;
        }
        let sid = self.shared.key(id);
        self.publish(To::All, Note::Ended { sid });
    }

    /// GET streams opened on other replicas, which end this replica's (see
    /// [`Gateway::stream_opened_elsewhere`]): (session id, when).
    pub fn streams_taken(&self) -> tokio::sync::broadcast::Receiver<(String, u64)> {
        self.streams_taken.subscribe()
    }

    /// Cluster mode: session `id` opened a GET stream here at `at` (ms since the epoch):
    /// a stream of it another replica opened before ends.
    pub fn stream_opened_elsewhere(&self, id: &str, at: u64) {
        if self.cluster.get().is_none() {
            return;
        }
        let sid = self.shared.key(id);
        self.publish(To::All, Note::StreamOpened { sid: sid.clone(), at });
        // Also in Redis, for a replica that misses the note (`newest_streams`).
        if let Some(c) = self.cluster.get().cloned() {
            let ttl = self.stream_record_ttl();
            crate::background::spawn(async move {
                let r: redis::RedisResult<u64> = NEWEST_STREAM
                    .key(c.name(&format!("stream:{sid}")))
                    .arg(at)
                    .arg(ttl)
                    .invoke_async(&mut c.conn())
                    .await;
                let _ = c.track(r);
            });
        }
    }

    /// Cluster mode: for GET streams open here (session id, when opened), the newest
    /// stream of each session over every replica, as Redis has it (after recording these
    /// where they are the newest, and keeping the records). A stream of a session whose
    /// newest is newer ends: the note that said so was missed here (pub/sub is at most
    /// once). `None`: not a cluster, or Redis failed.
    pub async fn newest_streams(&self, streams: &[(String, u64)]) -> Option<Vec<u64>> {
        let c = self.cluster.get()?;
        if streams.is_empty() {
            return Some(Vec::new());
        }
        let ttl = self.stream_record_ttl();
        let mut pipe = redis::pipe();
        for (id, at) in streams {
            let key = c.name(&format!("stream:{}", self.shared.key(id)));
            pipe.invoke_script(NEWEST_STREAM.key(key).arg(*at).arg(ttl));
        }
        let r: redis::RedisResult<Vec<u64>> = pipe.query_async(&mut c.conn()).await;
        c.track(r).ok()
    }

    /// How long a GET stream's record lives past its last refresh: two janitor rounds.
    fn stream_record_ttl(&self) -> u64 {
        u64::try_from(self.config().gateway.session_idle.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(2)
            .max(1_000)
    }

    /// The level session `id` chose, as the cluster knows it.
    pub async fn session_log_level(&self, id: &str) -> Option<usize> {
        self.shared.log_level_of(id).await
    }

    /// Cluster mode: tells the other replicas a session's level, and the downstreams'
    /// when it changed; returns once it holds there (see [`Gateway::applied_everywhere`]).
    pub(super) async fn level_elsewhere(&self, session: &str, rank: usize, downstream: Option<usize>) {
        let sid = self.shared.key(session);
        self.applied_everywhere(|ack| Note::Level {
            sid,
            rank,
            downstream,
            ack,
        })
        .await;
    }

    /// Publishes the note `make` gives to every replica, and returns once every other
    /// replica listening on the bus said it holds there (or after [`SETTLES`]: a replica too
    /// old to say so, or one gone mid-way). No wait without a cluster, or with Redis down.
    async fn applied_everywhere(&self, make: impl FnOnce(Option<Ack>) -> Note) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let corr = crate::cluster::random_id();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        crate::sync::lock(&self.applied).insert(corr.clone(), tx);
        let _waiting = Waiting { gw: self, corr: &corr };
        let note = make(Some(Ack {
            corr: corr.clone(),
            reply_to: cluster.replica.clone(),
        }));
        // Every listener on the bus counts, this replica's own among them.
        let others = cluster.publish(To::All, note).await.unwrap_or(0).saturating_sub(1);
        let all = async {
            for _ in 0..others {
                if rx.recv().await.is_none() {
                    return;
                }
            }
        };
        if tokio::time::timeout(SETTLES, all).await.is_err() {
            debug!(replicas = others, "not every replica said a change holds there");
        }
    }

    /// Says `Applied` for a note that asked for it.
    fn ack(&self, ack: Option<Ack>) {
        if let Some(Ack { corr, reply_to }) = ack {
            self.publish_to(reply_to, Note::Applied { corr });
        }
    }

    /// Cluster mode: every replica's downstream subscribes to `uri` (or unsubscribes);
    /// returns once they did (see [`Gateway::applied_everywhere`]).
    pub(super) async fn subscription_elsewhere(&self, server: &str, uri: &str, on: bool) {
        self.applied_everywhere(|ack| Note::Subscription {
            server: server.to_owned(),
            uri: uri.to_owned(),
            on,
            ack,
        })
        .await;
    }

    /// This replica's copy of a session goes (another replica serves it on, or ended it):
    /// no delivery to it, and its per-session processes here end.
    pub async fn forget_copy(&self, client: &super::Client) {
        crate::sync::lock(&self.live).remove(&self.shared.key(&client.id));
        self.shared.forget_local(&client.id);
        let topo = self.topology();
        for s in topo
            .servers
            .iter()
            .filter(|s| s.cfg.isolation == crate::config::Isolation::Session)
        {
            s.end_session(&client.id).await;
        }
    }

    /// Sets every downstream here, and (cluster mode) on the other replicas, to level `rank`.
    pub(super) async fn downstream_level_everywhere(&self, rank: usize) {
        super::logging::apply_log_level(&self.topology(), rank).await;
        self.publish(To::All, Note::DownstreamLevel { rank });
    }

    /// Cluster mode: removes what sessions whose record expired left in Redis (their
    /// subscriptions and levels: see [`crate::shared::Shared::sweep`]); downstreams here
    /// and on the other replicas unsubscribe from what nobody needs any more, and run at
    /// the level of the sessions left. Run by the janitor, every `every`.
    pub async fn sweep(&self, every: Duration) {
        let Some(swept) = self.shared.sweep(every).await else {
            return;
        };
        if swept.sessions == 0 {
            return;
        }
        debug!(
            sessions = swept.sessions,
            uris = swept.unneeded.len(),
            "removed the subscriptions and levels of expired sessions"
        );
        for (server, uri) in &swept.unneeded {
            self.publish(
                To::All,
                Note::Subscription {
                    server: server.to_string(),
                    uri: uri.clone(),
                    on: false,
                    ack: None,
                },
            );
        }
        self.unsubscribe_unneeded(&self.topology(), swept.unneeded).await;
        if let Some(rank) = swept.level {
            self.downstream_level_everywhere(rank).await;
        }
    }

    /// Subscribes this replica's downstreams to what sessions subscribed to, and sets
    /// them to the level sessions chose (a replica joining, or Redis back); and sets each
    /// session copy here to the level its session chose, which a missed note left behind.
    pub async fn catch_up(&self) {
        // First what sessions did here that Redis lost (or never got): then it is among
        // what the downstreams below are subscribed to.
        if let Some(put_back) = self.shared.restore_held().await {
            self.unsubscribe_unneeded(&self.topology(), put_back.unneeded).await;
            if let Some(rank) = put_back.level {
                self.downstream_level_everywhere(rank).await;
            }
        }
        let names: Vec<Arc<str>> = self.topology().servers.iter().map(|s| s.name.clone()).collect();
        for name in names {
            self.restore(name).await;
        }
        let copies: Vec<(String, Arc<super::Client>)> = crate::sync::lock(&self.live)
            .iter()
            .filter_map(|(k, c)| Some((k.clone(), c.upgrade()?)))
            .collect();
        for batch in copies.chunks(256) {
            let keys: Vec<&str> = batch.iter().map(|(k, _)| k.as_str()).collect();
            let levels = self.shared.log_levels_by_key(&keys).await;
            for ((_, c), rank) in batch.iter().zip(levels) {
                if let Some(rank) = rank.filter(|r| *r < LOG_LEVELS.len()) {
                    *crate::sync::write(&c.log_level) = Some(rank);
                }
            }
        }
    }

    async fn note(self: &Arc<Self>, note: Note) {
        match note {
            Note::Deliver { sid, line } => {
                // The replica that heard the update may hold no copy of the session to
                // check its allowlist against: this one, which streams to it, checks.
                if let Some(c) = self.live(&sid).filter(|c| !super::resources::hidden_update(c, &line)) {
                    c.send_own(Bytes::from(line));
                }
            }
            Note::All { line, reach } => {
                let line = Bytes::from(line);
                let recent = {
                    let mut seen = crate::sync::lock(&self.announced);
                    seen.retain(|_, t| t.elapsed() < SAME_CHANGE);
                    seen.contains_key(&same_change(&line, &reach.clone().unwrap_or_default()))
                };
                if !recent {
                    // A note without `reach` (a replica that knows no views) is for everyone.
                    let reach = reach.map(|w| Arc::new(unwire(&w)));
                    let _ = self.broadcast.send(Announcement { line, reach });
                }
            }
            Note::Answer { sid, line } => {
                let Some(c) = self.live(&sid) else { return };
                if let Ok(Kind::Response { id, outcome }) = Kind::parse(line.as_bytes()) {
                    if c.answer(id.as_ref(), outcome) {
                        debug!(session = %crate::client::session_tag(&c.id), "a client's answer reached its question through another replica");
                    }
                }
            }
            Note::Cancel { sid, params } => {
                let Some(c) = self.live(&sid) else { return };
                let params = params.and_then(|p| RawValue::from_string(p).ok());
                let Some(id) = message::cancelled_request_id(params.as_deref()) else {
                    return;
                };
                let token = c.inflight().get(&message::id_key(&id)).cloned();
                if let Some(t) = token {
                    debug!(session = %crate::client::session_tag(&c.id), request = %id, "a client cancelled a request through another replica");
                    t.cancel();
                }
            }
            Note::RootsChanged { sid } => {
                if let Some(c) = self.live(&sid) {
                    self.roots_changed(&c);
                }
            }
            Note::Ended { sid } => {
                if let Some(c) = self.live(&sid) {
                    let _ = self.ended.send(c.id.clone());
                }
            }
            Note::StreamOpened { sid, at } => {
                if let Some(c) = self.live(&sid) {
                    let _ = self.streams_taken.send((c.id.clone(), at));
                }
            }
            Note::Level {
                sid,
                rank,
                downstream,
                ack,
            } => {
                if let Some(c) = self.live(&sid) {
                    *crate::sync::write(&c.log_level) = Some(rank);
                }
                if let Some(rank) = downstream.filter(|r| *r < LOG_LEVELS.len()) {
                    super::logging::apply_log_level(&self.topology(), rank).await;
                }
                self.ack(ack);
            }
            Note::Applied { corr } => {
                if let Some(tx) = crate::sync::lock(&self.applied).get(&corr) {
                    let _ = tx.send(());
                }
            }
            Note::DownstreamLevel { rank } => {
                if rank < LOG_LEVELS.len() {
                    super::logging::apply_log_level(&self.topology(), rank).await;
                }
            }
            Note::Subscription { server, uri, on, ack } => {
                self.subscribe_here(&server, &uri, on).await;
                self.ack(ack);
            }
            Note::Forward(f) => self.serve_forwarded(f),
            Note::Step { corr, step } => {
                // A forwarded call's, or else a parked call's (the stateless flow's).
                if let Err(step) = self.forwarded_step(&corr, step) {
                    if let Some(tx) = self.rounds.get() {
                        let _ = tx.send(Note::Step { corr, step });
                    }
                }
            }
            Note::Abandon { call } => {
                if !self.abandon_forwarded(&call) {
                    if let Some(tx) = self.rounds.get() {
                        let _ = tx.send(Note::Abandon { call });
                    }
                }
            }
            note @ Note::Resume { .. } => {
                if let Some(tx) = self.rounds.get() {
                    let _ = tx.send(note);
                }
            }
        }
    }

    /// Subscribes (or unsubscribes) this replica's downstream `server` to `uri`.
    async fn subscribe_here(&self, server: &str, uri: &str, on: bool) {
        let topo = self.topology();
        let Some(s) = topo.servers.iter().find(|s| &*s.name == server) else {
            return;
        };
        if s.stateless() {
            s.listen_uri(uri, on);
            return;
        }
        let Ok(conn) = s.connection() else { return };
        let method = if on {
            Method::ResourcesSubscribe
        } else {
            Method::ResourcesUnsubscribe
        };
        let params = message::to_raw(&json!({ "uri": uri }));
        if let Err(e) = conn
            .call(method.as_str(), Params::Raw(Some(params)), None, s.settings().timeout)
            .await
        {
            warn!(server = %s.name, %uri, error = %e, "following another replica's {method} failed");
        }
    }
}

/// A [`Reach`] as it rides the bus.
fn wire(r: &Reach) -> WireReach {
    let mut changed: Vec<String> = r.changed.iter().map(ViewKey::encode).collect();
    let mut known: Vec<String> = r.known.iter().map(ViewKey::encode).collect();
    changed.sort();
    known.sort();
    WireReach {
        main: r.main,
        changed,
        known,
    }
}

fn unwire(w: &WireReach) -> Reach {
    let keys = |v: &[String]| v.iter().filter_map(|k| ViewKey::decode(k)).collect();
    Reach {
        main: w.main,
        changed: keys(&w.changed),
        known: keys(&w.known),
    }
}

/// What makes two list_changed the same change: the line and whom it reaches.
fn same_change(line: &Bytes, w: &WireReach) -> Bytes {
    let mut key = line.to_vec();
    key.push(b'\n');
    key.extend_from_slice(format!("{}|{}|{}", w.main, w.changed.join(","), w.known.join(",")).as_bytes());
    Bytes::from(key)
}
