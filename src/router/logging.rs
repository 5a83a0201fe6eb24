//! `logging/setLevel`: each session keeps its own level (its messages are filtered to it
//! on the way out); every downstream that offers logging runs at the most verbose level
//! any session wants.

use super::{empty, Call, Gateway, Topology};
use crate::downstream::{log_rank, Params, LOG_LEVELS};
use crate::error::Error;
use crate::message::{self, Outcome};
use crate::method::Method;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tracing::debug;

impl Gateway {
    pub(super) async fn set_level(&self, cx: &mut Call<'_>, params: Option<Box<RawValue>>) -> Outcome {
        let level = message::params_object(params.as_deref())
            .ok()
            .and_then(|p| p.get("level").and_then(Value::as_str).map(str::to_owned));
        let Some(rank) = level.as_deref().and_then(log_rank) else {
            let e = format!("logging/setLevel needs params.level, one of {}", LOG_LEVELS.join(", "));
            return Error::invalid_params(e).into();
        };
        *crate::sync::write(&cx.client.log_level) = Some(rank);
        let downstream = self.shared.set_log_level(&cx.client.id, rank).await;
        // Answered once the level holds here and on the other replicas: the client's next
        // request may land on any of them.
        let here = async {
            if let Some(rank) = downstream {
                apply_log_level(cx.topo, rank).await;
            }
        };
        tokio::join!(here, self.level_elsewhere(&cx.client.id, rank, downstream));
        empty()
    }
}

/// Sets every downstream that offers logging to level `rank`. A 2026-07-28 server gets
/// the level with each request instead.
pub(super) async fn apply_log_level(topo: &Topology, rank: usize) {
    let level = LOG_LEVELS[rank];
    let calls = topo.servers.iter().filter_map(|s| {
        let logs = s
            .state()
            .info
            .as_ref()
            .is_some_and(|i| i.has("logging") && !i.stateless);
        let conn = s.connection().ok().filter(|_| logs)?;
        let params = message::to_raw(&json!({ "level": level }));
        Some(async move {
            let method = Method::LoggingSetLevel.as_str();
            if let Err(e) = conn
                .call(method, Params::Raw(Some(params)), None, s.settings().timeout)
                .await
            {
                debug!(server = %s.name, error = %e, "setting the log level failed");
            }
        })
    });
    futures::future::join_all(calls).await;
}
