//! Fuzzes what the gateway does with bytes a peer controls: JSON-RPC parsing, the
//! rewrites on the way to a downstream and back (ids, progress tokens), the SSE parser,
//! and URI template matching. Every message the gateway writes must parse again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_gateway::catalog::Template;
use mcp_gateway::downstream::{encode_request, progress_token, restore_progress, Params};
use mcp_gateway::message::{self, Kind, Outcome};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if let Ok(kind) = Kind::parse(data) {
        match kind {
            Kind::Request { id, method, params } => {
                let answer = message::response(&id, &Outcome::Result(message::empty_object().into()));
                assert!(Kind::parse(&answer).is_ok(), "our response must parse");
                if let Ok(p) = message::params_object(params.as_deref()) {
                    let (line, token) = encode_request(7, &method, Params::Object { params: p, progress: Some(id.clone()) });
                    assert_eq!(token, Some(id));
                    let again = Kind::parse(&line).expect("our request must parse");
                    assert_eq!(again.method(), Some(method.as_str()));
                }
                let (line, _) = encode_request(8, &method, Params::Raw(params));
                assert!(Kind::parse(&line).is_ok(), "a raw passthrough request must parse");
            }
            Kind::Notification { method, params } => {
                let _ = progress_token(params.as_deref());
                if let Some(p) = &params {
                    if let Some(out) = restore_progress(p, &Value::from("token")) {
                        assert!(Kind::parse(&out).is_ok(), "a restored progress notification must parse");
                    }
                }
                let line = message::notification(&method, params.as_deref());
                assert!(Kind::parse(&line).is_ok(), "our notification must parse");
            }
            Kind::Response { id, outcome } => {
                let line = message::response(&id.unwrap_or(Value::Null), &outcome);
                assert!(Kind::parse(&line).is_ok(), "a forwarded response must parse");
            }
        }
    }
    let mut sse = mcp_gateway::sse::Parser::new();
    let _ = sse.feed(data);
    if let Ok(s) = std::str::from_utf8(data) {
        let (template, uri) = s.split_once('\n').unwrap_or((s, s));
        let _ = Template::parse(template).matches(uri);
    }
});
