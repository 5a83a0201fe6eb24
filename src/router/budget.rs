//! A request's rate limits, spent once.
//!
//! One process: governor, as it always did: the client's limits (`per_client`, its own
//! `rate_limit`) when the request comes in, its server's (`per_server`, `per_tool`) once
//! the route is known.
//!
//! A cluster: the client's limits become a [`Budget`] carried with the call, and are
//! spent together with its server's in **one** Redis round trip (one GCRA script over
//! every bucket, all or nothing) where the route is known: tools/call and prompts/get in
//! [`calls`](super::calls), everything else [`forward`](super::forward)ed. A request that
//! never reaches a server (lists, ping, an unknown name) spends its budget once it is
//! answered (or first, for those that change state before any server is involved:
//! see [`defers`]). A request with no limit configured makes no round trip at all
//! (see [`crate::cluster::limits`]). With Redis unreachable, `cluster.on_redis_down`
//! applies: `local` spends on this replica's own governor limiters, `refuse` answers 503.

use super::{Call, Gateway, Topology};
use crate::auth::Identity;
use crate::cluster::limits::{unreachable_message, Bucket};
use crate::cluster::Cluster;
use crate::config::{OnRedisDown, Rate};
use crate::error::Error;
use crate::limit::{Limited, Which};
use crate::message::Outcome;
use crate::method::Method;

/// The client's limits of a request, not spent yet (cluster mode only).
#[derive(Clone, Copy)]
pub(crate) struct Budget<'a> {
    /// `[rate_limits] per_client`'s key: the identity's name, or else the session id.
    pub key: &'a str,
    pub identity: Option<&'a Identity>,
}

/// Why a budget was not spent.
pub(crate) enum Refusal {
    Limited(Limited),
    /// Redis is unreachable and `cluster.on_redis_down = "refuse"`.
    Unavailable,
}

/// Whether a request's client budget waits for its route in cluster mode, to be spent
/// with the server's limits in one round trip: requests that go to one server, and
/// change nothing before they do. resources/subscribe and unsubscribe change the
/// session's subscriptions first (and may not reach the server at all): their client
/// budget is spent when they come in.
pub(crate) fn defers(method: Method) -> bool {
    use Method::*;
    matches!(
        method,
        ToolsCall | PromptsGet | ResourcesRead | CompletionComplete | TasksGet | TasksResult | TasksCancel
    )
}

impl Gateway {
    /// Spends the limits of a call to server number `server` (and to its tool `tool`)
    /// with the client's, if still unspent. Err: the answer to give instead.
    pub(super) async fn spend_route(
        &self,
        cx: &mut Call<'_>,
        method: Method,
        server: usize,
        tool: Option<&str>,
    ) -> Result<(), Outcome> {
        cx.route_spent = true;
        match self.cluster() {
            None => cx
                .topo
                .limits
                .check_server(server, tool)
                .map_err(|l| self.limited(method, &l, &mut cx.info, cx.client)),
            // Boxed: the one-process path's futures stay as small as they were.
            Some(c) => {
                let budget = cx.budget.take();
                let spent = Box::pin(spend(c, cx.topo, budget, Some((server, tool)))).await;
                spent.map_err(|r| self.refused(method, r, &mut cx.info, cx.client))
            }
        }
    }

    /// Spends what is left of the call's budget (cluster mode): for a request answered
    /// without reaching a server, or not deferred at all. Err: the answer to give instead.
    pub(super) async fn spend_budget(&self, cx: &mut Call<'_>, method: Method) -> Result<(), Outcome> {
        let (Some(c), Some(budget)) = (self.cluster(), cx.budget.take()) else {
            return Ok(());
        };
        let spent = Box::pin(spend(c, cx.topo, Some(budget), None)).await;
        spent.map_err(|r| self.refused(method, r, &mut cx.info, cx.client))
    }

    /// `initialize` as a configured client, counted against its limits over the cluster
    /// (`[rate_limits] per_client` by name and its own `rate_limit`), in one round trip;
    /// without a cluster exactly [`Gateway::admit_initialize`]. For the HTTP front's
    /// `initialize` once it is async (it calls the sync one until then).
    #[cfg_attr(not(test), allow(dead_code))]
    pub async fn admit_initialize_shared(&self, identity: Option<&Identity>) -> Result<(), Outcome> {
        let (Some(c), Some(identity)) = (self.cluster(), identity) else {
            return self.admit_initialize(identity);
        };
        let topo = self.topology();
        let budget = Budget {
            key: &identity.name,
            identity: Some(identity),
        };
        let spent = Box::pin(spend(c, &topo, Some(budget), None)).await;
        spent.map_err(|r| match r {
            Refusal::Limited(l) => self.rate_limited(Method::Initialize, &l),
            Refusal::Unavailable => Error::unavailable(unreachable_message()).into(),
        })
    }

    fn refused(
        &self,
        method: Method,
        r: Refusal,
        info: &mut super::CallInfo,
        client: &crate::client::Client,
    ) -> Outcome {
        match r {
            Refusal::Limited(l) => self.limited(method, &l, info, client),
            Refusal::Unavailable => Error::unavailable(unreachable_message()).into(),
        }
    }
}

/// Spends `budget` (the client's limits) and the limits of `route` (a server, and its
/// tool) on the cluster: one round trip if any limit applies, none otherwise.
pub(crate) async fn spend(
    cluster: &Cluster,
    topo: &Topology,
    budget: Option<Budget<'_>>,
    route: Option<(usize, Option<&str>)>,
) -> Result<(), Refusal> {
    let mut limits: Vec<(Which, &Rate)> = Vec::new();
    if let Some(b) = budget {
        if let Some(r) = topo.limits.per_client() {
            let named = b.identity.is_some();
            limits.push((Which::PerClient { key: b.key, named }, r));
        }
        if let Some((name, r)) = b.identity.and_then(Identity::rate_limit) {
            limits.push((Which::Client(name), r));
        }
    }
    if let Some((server, tool)) = route {
        limits.extend(topo.limits.of_server(server, tool));
    }
    if limits.is_empty() {
        return Ok(());
    }
    let buckets: Vec<Bucket> = limits
        .iter()
        .map(|(which, rate)| Bucket {
            key: cluster.bucket_key(which),
            rate,
        })
        .collect();
    match cluster.spend(&buckets).await {
        Ok(None) => Ok(()),
        Ok(Some((i, retry_after))) => {
            let what = limits.get(i).map(|(which, rate)| which.what(rate)).unwrap_or_default();
            Err(Refusal::Limited(Limited { what, retry_after }))
        }
        Err(_) => match cluster.on_redis_down {
            OnRedisDown::Refuse => Err(Refusal::Unavailable),
            // This replica's own limiters, as one process spends them.
            OnRedisDown::Local => {
                if let Some(b) = budget {
                    super::check_client_rates(topo, b.key, b.identity).map_err(Refusal::Limited)?;
                }
                match route {
                    Some((server, tool)) => topo.limits.check_server(server, tool).map_err(Refusal::Limited),
                    None => Ok(()),
                }
            }
        },
    }
}

/// The cluster path in-process: two gateways (replicas) joined to one real Redis.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::limits::tests::Server;
    use crate::config::Config;
    use crate::message::Id;
    use crate::router::{Client, Request};
    use std::sync::Arc;

    fn replica(toml: &str, redis: &Server) -> Arc<Gateway> {
        let none = |_: &str| None;
        let gw = Gateway::new(Config::parse(std::path::Path::new("g.toml"), toml, &none).unwrap());
        gw.join(redis.cluster());
        gw
    }

    fn alice() -> Arc<Identity> {
        Arc::new(Identity {
            name: "alice".into(),
            principal: "alice".into(),
            policy: None,
            bearer: None,
            token: None,
        })
    }

    async fn ask(gw: &Gateway, client: &Arc<Client>, method: &str) -> String {
        let id = Id::from(1u64);
        let params = Some(crate::message::to_raw(&serde_json::json!({})));
        match gw.request(client, Request::new(&id, method, params), None, None).await {
            Some(Outcome::Result(r)) => r.get().to_owned(),
            Some(Outcome::Error(e)) => e.get().to_owned(),
            None => "cancelled".into(),
        }
    }

    #[tokio::test]
    async fn replicas_share_a_client_s_budget_initialize_included() {
        let redis = Server::start();
        let toml = "[rate_limits]\nper_client = \"4/m\"\n";
        let (a, b) = (replica(toml, &redis), replica(toml, &redis));
        let who = alice();
        assert!(a.admit_initialize_shared(Some(&who)).await.is_ok());
        assert!(b.admit_initialize_shared(Some(&who)).await.is_ok());
        let (ca, cb) = (Arc::new(Client::new("s1")), Arc::new(Client::new("s2")));
        ca.set_identity(Some(who.clone()));
        cb.set_identity(Some(who.clone()));
        assert_eq!(ask(&a, &ca, "ping").await, "{}");
        assert_eq!(ask(&b, &cb, "ping").await, "{}");
        // 4/m spent over two replicas: both refuse now, naming the limit.
        for (gw, c) in [(&a, &ca), (&b, &cb)] {
            let e = ask(gw, c, "tools/list").await;
            assert!(e.contains("-32029") && e.contains("per_client limit 4/m"), "{e}");
        }
        let refused = b.admit_initialize_shared(Some(&who)).await;
        assert!(matches!(refused, Err(Outcome::Error(_))));
        // A call that never reaches a server (no such tool) still spends its budget
        // (here a session's: no identity), after it is answered.
        let anon = Arc::new(Client::new("s3"));
        for gw in [&a, &b, &a, &b] {
            let e = ask(gw, &anon, "tools/call").await;
            assert!(e.contains("-32602"), "{e}");
        }
        let r = ask(&a, &anon, "tools/call").await;
        assert!(
            r.contains("\"isError\":true") && r.contains("per_client limit 4/m"),
            "{r}"
        );
    }
}
