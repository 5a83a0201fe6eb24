//! URL-mode elicitations a server asked (2025-11-25), remembered by `elicitationId` so that
//! its `notifications/elicitation/complete` reaches the client it was asked of, and no
//! other.
//!
//! A server asks in one of two ways: an `elicitation/create` request in `url` mode during a
//! call, or a call's `-32042` error (URL elicitation required) listing them in
//! `data.elicitations`. The completion may come on the call's own stream, on a remote
//! server's GET stream, or after the call is over (the `-32042` flow: the user opens the
//! page, the server says it is done, the client retries). While the call lasts it goes
//! on the call's stream; after, to the session's own stream ([`super::Peer::tell`]), on
//! whichever replica holds it. A stateless (2026-07-28) client has no such stream: a late
//! completion for it is dropped.

use super::Sink;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// URL elicitations remembered per downstream connection; past it, the oldest goes.
const MAX: usize = 256;
/// How long a user may take on the page before the completion finds nobody.
const KEPT: Duration = Duration::from_secs(30 * 60);

#[derive(Default)]
pub struct Elicitations {
    /// By `elicitationId`: the call's sink (its client) and when it was asked.
    asked: HashMap<String, (Sink, Instant)>,
}

impl Elicitations {
    /// Remembers that the call of `sink` was asked `id`.
    pub fn asked(&mut self, id: String, sink: &Sink) {
        let now = Instant::now();
        self.asked.retain(|_, (_, at)| now.duration_since(*at) < KEPT);
        if self.asked.len() >= MAX && !self.asked.contains_key(&id) {
            if let Some(oldest) = self.asked.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone()) {
                self.asked.remove(&oldest);
            }
        }
        self.asked.insert(id, (sink.clone(), now));
    }

    /// A server's request: remembered when it is a URL-mode `elicitation/create`.
    pub fn request(&mut self, method: &str, params: Option<&RawValue>, sink: &Sink) {
        if let Some(id) = url_elicitation(method, params) {
            self.asked(id, sink);
        }
    }

    /// A call's answer: a `-32042` error's URL elicitations are remembered for its client.
    pub fn answer(&mut self, outcome: &crate::message::Outcome, sink: &Sink) {
        let crate::message::Outcome::Error(e) = outcome else {
            return;
        };
        for id in required(e.get()) {
            self.asked(id, sink);
        }
    }

    /// A server's `notifications/elicitation/complete`: the client it was asked of, taken
    /// off the list (one completion each).
    pub fn complete(&mut self, params: Option<&RawValue>) -> Option<Sink> {
        let id = elicitation_id(params)?;
        let (sink, at) = self.asked.remove(&id)?;
        (at.elapsed() < KEPT).then_some(sink)
    }
}

/// Sends a completion to `sink`'s client: on its call's stream while the call lasts, else
/// on its session's own stream. False when neither could take it.
pub fn deliver(sink: &Sink, line: bytes::Bytes) -> bool {
    if !sink.is_over() && sink.try_send(line.clone()) {
        return true;
    }
    sink.peer().is_some_and(|p| p.tell(line))
}

/// The `elicitationId` of a URL-mode `elicitation/create`.
fn url_elicitation(method: &str, params: Option<&RawValue>) -> Option<String> {
    if method != "elicitation/create" {
        return None;
    }
    #[derive(Deserialize)]
    struct P {
        mode: Option<String>,
        #[serde(rename = "elicitationId")]
        id: Option<String>,
    }
    let p: P = serde_json::from_str(params?.get()).ok()?;
    p.id.filter(|_| p.mode.as_deref() == Some("url"))
}

/// The `elicitationId` member of `params`.
fn elicitation_id(params: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize)]
    struct P {
        #[serde(rename = "elicitationId")]
        id: String,
    }
    serde_json::from_str::<P>(params?.get()).ok().map(|p| p.id)
}

/// The URL elicitations' ids of a `-32042` error object (none for any other error).
fn required(error: &str) -> Vec<String> {
    // Most errors are not: no parse for them.
    if !error.contains("-32042") {
        return Vec::new();
    }
    #[derive(Deserialize)]
    struct E {
        code: i64,
        data: Option<D>,
    }
    #[derive(Deserialize)]
    struct D {
        #[serde(default)]
        elicitations: Vec<serde_json::Value>,
    }
    let Ok(e) = serde_json::from_str::<E>(error) else {
        return Vec::new();
    };
    if e.code != crate::upstream::consent::URL_ELICITATION_REQUIRED {
        return Vec::new();
    }
    e.data
        .map(|d| d.elicitations)
        .unwrap_or_default()
        .iter()
        .filter(|el| el.get("mode").and_then(|m| m.as_str()).is_none_or(|m| m == "url"))
        .filter_map(|el| el.get("elicitationId").and_then(|i| i.as_str()).map(str::to_owned))
        .take(MAX)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_required_error_lists_its_url_elicitations_only() {
        let e = r#"{"code":-32042,"message":"URL elicitation required","data":{"elicitations":[
            {"mode":"url","elicitationId":"a","url":"https://x","message":"m"},
            {"mode":"form","elicitationId":"b"},{"elicitationId":"c"},{"mode":"url"}]}}"#;
        assert_eq!(required(e), ["a", "c"]);
        assert!(required(r#"{"code":-32600,"message":"-32042"}"#).is_empty());
        assert!(required(r#"{"code":-32042,"message":"no data"}"#).is_empty());
        assert!(required(r#"{"code":-32042,"message":"x","data":{"elicitations":"no"}}"#).is_empty());
    }

    #[test]
    fn a_completion_goes_once_and_the_list_stays_bounded() {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        let sink = Sink::new(tx);
        let mut e = Elicitations::default();
        for i in 0..MAX + 10 {
            e.asked(format!("e{i}"), &sink);
        }
        assert_eq!(e.asked.len(), MAX);
        let p = crate::message::to_raw(&serde_json::json!({"elicitationId": format!("e{}", MAX + 9)}));
        assert!(e.complete(Some(&p)).is_some());
        assert!(e.complete(Some(&p)).is_none(), "once");
        let p = crate::message::to_raw(&serde_json::json!({"elicitationId": "e0"}));
        assert!(e.complete(Some(&p)).is_none(), "the oldest went");
    }
}
