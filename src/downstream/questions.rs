//! A connection's own requests (questions for a client: sampling, elicitation, roots,
//! ping), answered in the background so that the connection goes on being read: the
//! server may withdraw a question (`notifications/cancelled`), send progress, or ask
//! more. The same for a stdio pipe and a remote server; only how the answer is written
//! differs (the `send` each gives).

use super::Sink;
use crate::error::Error;
use crate::message::{self, Id, Outcome};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tracing::{debug, Instrument};

/// How many of a server's own requests may wait for their answers at once; past it, the
/// server gets an error at once.
pub const MAX_QUESTIONS: usize = 64;

#[derive(Clone)]
pub struct Questions {
    /// Permits for the questions being answered ([`MAX_QUESTIONS`]).
    permits: Arc<tokio::sync::Semaphore>,
    /// The questions a client is being asked, by the server's id: cancelled when the
    /// server withdraws one, which then gets no answer.
    asking: Arc<Mutex<HashMap<String, CancellationToken>>>,
}

impl Default for Questions {
    fn default() -> Questions {
        Questions {
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_QUESTIONS)),
            asking: Arc::default(),
        }
    }
}

impl Questions {
    /// Answers the server's request `id` in the background: for `caller`'s client (none:
    /// refused, saying `why`), the response written by `send` unless the server withdrew
    /// it meanwhile. Past [`MAX_QUESTIONS`] the error goes at once.
    pub fn answer<F, Fut>(
        &self,
        id: Id,
        (method, params): (String, Option<Box<RawValue>>),
        caller: Option<Sink>,
        why: String,
        send: F,
    ) where
        F: FnOnce(Vec<u8>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let error = Error::gateway(format!(
                "mcp-gateway is already answering {MAX_QUESTIONS} requests of this server; ask again once they are answered"
            ));
            let out = message::response(&id, &Outcome::Error(error.object()));
            crate::background::spawn(send(out).in_current_span());
            return;
        };
        let key = message::id_key(&id);
        let (caller, withdrawable) = match caller.map(Sink::for_question) {
            Some((sink, token)) => {
                crate::sync::lock(&self.asking).insert(key.clone(), token);
                (Some(sink), true)
            }
            None => (None, false),
        };
        let asking = self.asking.clone();
        crate::background::spawn(
            async move {
                let _permit = permit;
                let outcome = super::answer_server_request(caller, method, params, &why).await;
                if withdrawable && crate::sync::lock(&asking).remove(&key).is_none() {
                    return;
                }
                send(message::response(&id, &outcome)).await;
            }
            .in_current_span(),
        );
    }

    /// The server's `notifications/cancelled`: the question it names is withdrawn from its
    /// client.
    pub fn withdraw(&self, params: Option<&RawValue>) {
        let asked = message::cancelled_request_id(params).map(|id| message::id_key(&id));
        match asked.and_then(|k| crate::sync::lock(&self.asking).remove(&k)) {
            Some(token) => token.cancel(),
            None => debug!("the server cancelled a request that is not a question it asked; ignoring"),
        }
    }
}
