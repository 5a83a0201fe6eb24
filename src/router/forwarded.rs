//! Cluster mode: calls to a session's own process (`isolation = "session"`) run on the
//! replica that holds the process, wherever the request landed.
//!
//! A per-session process keeps state (that is why it is per session), and it lives on
//! one replica. Redis names that replica (`P:proc:{server}:{session digest}`, claimed in
//! one script: the first replica to need the process, or any replica once the holder has
//! stopped writing its heartbeat). A call landing elsewhere is sent to the holder over the
//! bus ([`Note::Forward`]); the holder runs it on the session's process, with the session
//! as it knows it, and sends back its steps: related messages (progress, log messages, a
//! server's questions, whose answers reach it through the bus like any other) and the
//! outcome. If the holder no longer serves the session, this replica claims the process
//! and starts one: the old process's state went with it.
//!
//! Why forward rather than move state: the state is inside a process the gateway cannot
//! look into (a browser, a REPL, a connection), so the only way to keep it is to keep
//! talking to that process.

use super::{Call, CallInfo, Gateway};
use crate::cluster::bus::{Forwarded, Note, To};
use crate::cluster::Cluster;
use crate::downstream::Sink;
use crate::error::Error;
use crate::message::{self, Id, Kind, Outcome};
use crate::method::Method;
use crate::stateless::remote::Step;
use bytes::Bytes;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::debug;

/// How often the holder says it is still running a forwarded call.
const ALIVE: Duration = Duration::from_secs(2);
/// Silence for this long: the holder is gone.
const QUIET: Duration = Duration::from_secs(7);

/// Claims the process of (server, session) for `ARGV[1]` unless a replica seen since
/// `ARGV[3]` holds it; returns the holder. `KEYS[1]`: the claim, `KEYS[2]`: the heartbeats.
const CLAIM: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  local seen = redis.call('ZSCORE', KEYS[2], cur)
  if seen and tonumber(seen) >= tonumber(ARGV[3]) then
    return cur
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"#;

fn claim_key(c: &Cluster, server: &str, session: &str) -> String {
    c.name(&format!("proc:{server}:{}", crate::cluster::digest(session)))
}

impl Gateway {
    /// Cluster mode: the replica other than this one that holds `session`'s process of
    /// `server`, if any (this one claims it otherwise). `None` outside cluster mode, when
    /// the process runs here already, or when Redis cannot say (then it starts here).
    pub(super) async fn holder(&self, server: &crate::supervisor::Server, session: &str) -> Option<String> {
        let c = self.cluster.get()?;
        // A process per client identity is not claimed: each replica runs its own. Nor is a
        // token exchange server's: its calls go on the caller's own connection (per identity,
        // `Gateway::connection_as`) whatever its isolation, never on a session's process.
        if server.cfg.isolation != crate::config::Isolation::Session || server.token_exchange().is_some() {
            return None;
        }
        let caller = crate::supervisor::Caller {
            session: Some(session),
            client: None,
            principal: None,
        };
        if server.existing_connection_for(&caller).await.is_some() {
            return None;
        }
        let ttl = u64::try_from(self.config().gateway.session_idle.as_millis()).unwrap_or(u64::MAX);
        let gone = crate::cluster::now_ms()
            .saturating_sub(u64::try_from(crate::cluster::REPLICA_GONE.as_millis()).unwrap_or(u64::MAX));
        let r: redis::RedisResult<String> = redis::Script::new(CLAIM)
            .key(claim_key(c, &server.name, session))
            .key(c.name("replicas"))
            .arg(&c.replica)
            .arg(ttl.max(1))
            .arg(gone)
            .invoke_async(&mut c.conn())
            .await;
        let holder = c.track(r).ok()?;
        (holder != c.replica).then_some(holder)
    }

    /// Takes the process of (server, session) for this replica (its holder no longer has it).
    async fn claim(&self, server: &str, session: &str) {
        let Some(c) = self.cluster.get() else { return };
        let ttl = u64::try_from(self.config().gateway.session_idle.as_millis()).unwrap_or(u64::MAX);
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(claim_key(c, server, session))
            .arg(&c.replica)
            .arg("PX")
            .arg(ttl.max(1))
            .query_async(&mut c.conn())
            .await;
        let _ = c.track(r);
    }

    /// Keeps this replica's claims on the processes of `sessions` (the janitor's refresh).
    pub async fn touch_processes(&self, sessions: &[String]) {
        let Some(c) = self.cluster.get() else { return };
        let ttl = u64::try_from(self.config().gateway.session_idle.as_millis()).unwrap_or(u64::MAX);
        let topo = self.topology();
        let mut pipe = redis::pipe();
        let mut any = false;
        for s in topo
            .servers
            .iter()
            .filter(|s| s.cfg.isolation == crate::config::Isolation::Session)
        {
            for id in sessions {
                let caller = crate::supervisor::Caller {
                    session: Some(id),
                    client: None,
                    principal: None,
                };
                if s.existing_connection_for(&caller).await.is_some() {
                    pipe.cmd("PEXPIRE")
                        .arg(claim_key(c, &s.name, id))
                        .arg(ttl.max(1))
                        .ignore();
                    any = true;
                }
            }
        }
        if any {
            let r: redis::RedisResult<()> = pipe.query_async(&mut c.conn()).await;
            let _ = c.track(r);
        }
    }

    /// Runs `method` on `holder`, the replica with the session's process of server
    /// `server`; `None` when the holder no longer serves the session (the caller starts a
    /// process here, which this has claimed).
    pub(super) async fn forward_to(
        &self,
        holder: String,
        cx: &mut Call<'_>,
        server: usize,
        method: Method,
        params: Map<String, Value>,
    ) -> Option<Outcome> {
        let c = self.cluster.get()?.clone();
        let s = cx.topo.servers.get(server)?;
        let corr = crate::cluster::random_id();
        let (tx, mut rx) = mpsc::channel(64);
        crate::sync::lock(&self.forwarding).insert(corr.clone(), tx);
        let guard = Pending {
            gw: self,
            corr: corr.clone(),
            holder: holder.clone(),
            over: false,
        };
        let note = Note::Forward(Forwarded {
            corr: corr.clone(),
            reply_to: c.replica.clone(),
            sid: self.shared.key(&cx.client.id),
            server: s.name.to_string(),
            method: method.as_str().to_owned(),
            params: Value::Object(params).to_string(),
        });
        debug!(server = %s.name, %holder, "the session's process runs on another replica; forwarding the call");
        let mut guard = guard;
        if c.publish(To::Replica(&holder), note).await == Some(0) {
            // Nobody listens on the holder's channel: it died (a killed replica's
            // connection closes at once). Its process went with it.
            guard.over = true;
            drop(guard);
            debug!(server = %s.name, %holder, "the replica holding the session's process is gone; starting one here");
            if s.cfg.isolation == crate::config::Isolation::Session {
                self.claim(&s.name, &cx.client.id).await;
            }
            return None;
        }
        let sink = cx.sink.take();
        loop {
            let step = match tokio::time::timeout(QUIET, rx.recv()).await {
                Ok(Some(step)) => step,
                _ => {
                    guard.over = true;
                    return Some(Outcome::Error(
                        Error::server(
                            &s.name,
                            crate::error::code::INTERNAL_ERROR,
                            format!("the replica {holder} running this session's process of server '{}' went away before the call finished", s.name),
                        )
                        .object(),
                    ));
                }
            };
            match step {
                Step::Alive => {}
                Step::Related { line } => {
                    if let Some(sink) = &sink {
                        sink.send(Bytes::from(line)).await;
                    }
                }
                Step::Done { response } => {
                    guard.over = true;
                    let out = response.and_then(|r| match Kind::parse(r.as_bytes()) {
                        Ok(Kind::Response { outcome, .. }) => Some(outcome),
                        _ => None,
                    });
                    return Some(out.unwrap_or_else(|| {
                        Error::client(crate::error::code::REQUEST_CANCELLED, "request cancelled").into()
                    }));
                }
                Step::Input { .. } | Step::Gone { .. } => {
                    guard.over = true;
                    drop(guard);
                    debug!(server = %s.name, %holder, "the holder no longer serves the session; starting its process here");
                    if s.cfg.isolation == crate::config::Isolation::Session {
                        self.claim(&s.name, &cx.client.id).await;
                    }
                    return None;
                }
            }
        }
    }

    /// A call another replica forwarded to this one's process of a session.
    pub(super) fn serve_forwarded(self: &Arc<Self>, f: Forwarded) {
        let Forwarded {
            corr,
            reply_to,
            sid,
            server,
            method,
            params,
        } = f;
        let gw = self.clone();
        crate::background::spawn(async move {
            let Some(c) = gw.cluster.get().cloned() else { return };
            let send = |step: Step| {
                let (c, to, corr) = (c.clone(), reply_to.clone(), corr.clone());
                async move {
                    c.publish(To::Replica(&to), Note::Step { corr, step }).await;
                }
            };
            let topo = gw.topology();
            let client = gw.live(&sid);
            let index = topo.servers.iter().position(|s| *s.name == *server);
            let (Some(client), Some(index)) = (client, index) else {
                return send(Step::Gone {
                    why: "the session is not served here".into(),
                })
                .await;
            };
            let caller = crate::supervisor::Caller {
                session: Some(&client.id),
                client: None,
                principal: None,
            };
            if topo.servers[index].existing_connection_for(&caller).await.is_none() {
                return send(Step::Gone {
                    why: "no process of the session here".into(),
                })
                .await;
            }
            let params: Map<String, Value> = serde_json::from_str(&params).unwrap_or_default();
            let (stx, mut srx) = mpsc::channel::<Bytes>(crate::downstream::SINK_QUEUE);
            let over = tokio_util::sync::CancellationToken::new();
            let sink = Sink::new(stx).with_peer(client.clone()).until(over.clone());
            let stop = tokio_util::sync::CancellationToken::new();
            crate::sync::lock(&gw.serving).insert(corr.clone(), stop.clone());
            let identity = client.identity();
            let method = Method::parse(&method);
            let run = async {
                let mut cx = Call {
                    topo: &topo,
                    client: &client,
                    identity: identity.as_deref(),
                    view: client.view().map(|k| topo.view(k)),
                    sink: Some(sink),
                    info: CallInfo {
                        session: Some(client.id.clone()),
                        ..CallInfo::default()
                    },
                    // Its limits were spent on the replica it landed on.
                    budget: None,
                    route_spent: true,
                };
                // The caller's allowlist as this replica's config has it now: a reload
                // that narrowed it here holds for calls landing elsewhere too.
                if let Some(refused) = hidden_here(&cx, index, method, &params) {
                    return refused;
                }
                gw.forward(&mut cx, index, method, params).await
            };
            tokio::pin!(run);
            let mut alive = tokio::time::interval(ALIVE);
            alive.tick().await;
            let out = loop {
                tokio::select! {
                    out = &mut run => break Some(out),
                    Some(m) = srx.recv() => send(Step::Related { line: String::from_utf8_lossy(&m).into_owned() }).await,
                    _ = alive.tick() => send(Step::Alive).await,
                    () = stop.cancelled() => break None,
                }
            };
            over.cancel();
            while let Ok(m) = srx.try_recv() {
                send(Step::Related {
                    line: String::from_utf8_lossy(&m).into_owned(),
                })
                .await;
            }
            crate::sync::lock(&gw.serving).remove(&corr);
            let response = out.map(|o| String::from_utf8_lossy(&message::response(&Id::NULL, &o)).into_owned());
            send(Step::Done { response }).await;
        });
    }

    /// A step of a call this replica forwarded; false when none has that correlation id.
    pub(super) fn forwarded_step(&self, corr: &str, step: Step) -> Result<(), Step> {
        let tx = crate::sync::lock(&self.forwarding).get(corr).cloned();
        match tx {
            Some(tx) => {
                let _ = tx.try_send(step);
                Ok(())
            }
            None => Err(step),
        }
    }

    /// The forwarding replica gave up on a call (its client went away): it stops here.
    pub(super) fn abandon_forwarded(&self, corr: &str) -> bool {
        match crate::sync::lock(&self.serving).remove(corr) {
            Some(stop) => {
                stop.cancel();
                true
            }
            None => false,
        }
    }
}

/// A forwarded call waiting for its steps: dropped before its end (its client went away,
/// or cancelled it), the holder stops running it.
struct Pending<'a> {
    gw: &'a Gateway,
    corr: String,
    holder: String,
    over: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.gw.forwarding).remove(&self.corr);
        if self.over {
            return;
        }
        if let Some(c) = self.gw.cluster.get().cloned() {
            let (to, corr) = (self.holder.clone(), self.corr.clone());
            crate::background::spawn(async move {
                c.publish(To::Replica(&to), Note::Abandon { call: corr }).await;
            });
        }
    }
}

/// A forwarded call whose name (a tool's or prompt's public name, a resource's URI) the
/// caller may not see under this replica's config: the answer it gets, as a call landing
/// here would (`unknown tool: NAME`, `-32002` for a URI). `params` are the server's (a
/// tool's or prompt's own name): the public names leading there are looked up.
fn hidden_here(cx: &Call<'_>, server: usize, method: Method, params: &Map<String, Value>) -> Option<Outcome> {
    let (table, what) = match method {
        Method::ToolsCall => (&cx.topo.catalog.tools, "tool"),
        Method::PromptsGet => (&cx.topo.catalog.prompts, "prompt"),
        Method::ResourcesRead => {
            let uri = params.get("uri").and_then(Value::as_str)?;
            if cx.sees(uri, server, false) {
                return None;
            }
            return Some(super::resources::unknown(uri));
        }
        _ => return None,
    };
    let own = params.get("name").and_then(Value::as_str)?;
    let tool = method == Method::ToolsCall;
    let mut public = table
        .iter()
        .filter(|(_, r)| r.server == server && r.name == own)
        .map(|(p, _)| p.as_str());
    let first = public.next()?;
    if cx.sees(first, server, tool) || public.any(|p| cx.sees(p, server, tool)) {
        return None;
    }
    Some(
        Error::invalid_params(format!("unknown {what}: {first}"))
            .with_data(serde_json::json!({ what: first }))
            .into(),
    )
}
