//! The one error type of the gateway's own answers, and every JSON-RPC code it uses.
//!
//! An [`Error`] is made where something goes wrong and rendered by the front that
//! answers: a JSON-RPC error object on every front ([`Error::object`]), and over HTTP a
//! status as well ([`Error::status`]). It records whose fault it is ([`Source`]), as
//! pingora-error's `ErrorSource` does: the client's (a bad request), a downstream
//! server's (named), or the gateway's own. A server's own JSON-RPC error is not one of
//! these: it reaches the client byte for byte as the server wrote it.

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::Arc;

/// The most of a peer's own value (a URI, a name, a task id a client sent; a name a
/// server listed) that an answer, a span or a log line repeats, in bytes: enough to tell
/// which value it was. A message is bounded only by `max_body`/`max_line`, so a value
/// repeated whole would make an answer (twice its size: message and data), a span
/// attribute or a log line as large.
pub const MAX_ECHO: usize = 256;

/// `value` as an answer or a span repeats it: whole up to [`MAX_ECHO`] bytes, else its
/// start and its length, `mock://a/xxx… (1048576 bytes)`.
pub fn echo(value: &str) -> Cow<'_, str> {
    if value.len() <= MAX_ECHO {
        return Cow::Borrowed(value);
    }
    let mut end = MAX_ECHO;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &value[..end], value.len()))
}

/// JSON-RPC error codes: each has its one definition here.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Used by the official SDKs for a request that timed out.
    pub const REQUEST_TIMEOUT: i64 = -32001;
    /// Resource not found (handshake-era revisions).
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// 2026-07-28: an `Mcp-*` header disagrees with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: the protocol version asked for is not one the gateway speaks.
    pub const UNSUPPORTED_VERSION: i64 = -32022;
    /// A rate limit was hit; `data.retryAfterMs` says when to try again. Also a client's
    /// calls in flight to a child past `max_calls_per_client` (no `retryAfterMs`: the
    /// limit frees as soon as one of its calls ends).
    pub const RATE_LIMITED: i64 = -32029;
    /// The gateway cannot serve the request for now: what it needs is unreachable (a
    /// cluster's Redis, with `cluster.on_redis_down = "refuse"`). HTTP 503.
    pub const UNAVAILABLE: i64 = -32030;
    /// The request was cancelled (LSP's code, which the SDKs use).
    pub const REQUEST_CANCELLED: i64 = -32800;
}

/// Whose fault an error is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The client sent something wrong: fix the request.
    Client,
    /// The named downstream server failed, timed out or is unavailable.
    Server(Arc<str>),
    /// The gateway itself could not do what it should (a bug, or a resource exhausted).
    Gateway,
}

impl Source {
    /// A short label for logs: `client`, `server` or `gateway`.
    pub fn label(&self) -> &'static str {
        match self {
            Source::Client => "client",
            Source::Server(_) => "server",
            Source::Gateway => "gateway",
        }
    }
}

/// An error the gateway answers with itself.
#[derive(Clone, Debug)]
pub struct Error {
    pub code: i64,
    pub message: String,
    /// `error.data`: for a server's error `{"server": name}` at least. Boxed, so that an
    /// `Error` stays small in the `Result`s of the request path.
    pub data: Option<Box<Value>>,
    pub source: Source,
    /// Over HTTP, the status to answer with instead of the one [`Error::status`] derives
    /// from the code (406, 413, 415, a session's 404 …).
    pub http_status: Option<u16>,
}

impl Error {
    /// A client's error with `code`.
    pub fn client(code: i64, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            data: None,
            source: Source::Client,
            http_status: None,
        }
    }

    pub fn parse(message: impl Into<String>) -> Error {
        Error::client(code::PARSE_ERROR, message)
    }

    pub fn invalid_request(message: impl Into<String>) -> Error {
        Error::client(code::INVALID_REQUEST, message)
    }

    pub fn invalid_params(message: impl Into<String>) -> Error {
        Error::client(code::INVALID_PARAMS, message)
    }

    /// -32601 naming the method.
    pub fn method_not_found(method: &str) -> Error {
        Error::client(code::METHOD_NOT_FOUND, format!("method not found: {method}"))
    }

    /// The named server's error; `data.server` names it.
    pub fn server(server: &Arc<str>, code: i64, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            data: Some(Box::new(Value::Object(Map::from_iter([(
                "server".to_owned(),
                Value::String(server.to_string()),
            )])))),
            source: Source::Server(server.clone()),
            http_status: None,
        }
    }

    /// The gateway's own failure (-32603).
    pub fn gateway(message: impl Into<String>) -> Error {
        Error {
            code: code::INTERNAL_ERROR,
            message: message.into(),
            data: None,
            source: Source::Gateway,
            http_status: None,
        }
    }

    /// The gateway cannot serve the request for now (-32030, HTTP 503): try again later.
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error {
            code: code::UNAVAILABLE,
            message: message.into(),
            data: None,
            source: Source::Gateway,
            http_status: Some(503),
        }
    }

    pub fn with_data(mut self, data: Value) -> Error {
        self.data = Some(Box::new(data));
        self
    }

    /// Over HTTP, answer with `status`.
    pub fn with_status(mut self, status: u16) -> Error {
        self.http_status = Some(status);
        self
    }

    /// The JSON-RPC error object: `{"code", "message", "data"?}`.
    pub fn object(&self) -> Box<RawValue> {
        let mut m = Map::new();
        m.insert("code".into(), self.code.into());
        m.insert("message".into(), Value::String(self.message.clone()));
        if let Some(d) = &self.data {
            m.insert("data".into(), Value::clone(d));
        }
        // A serde_json::Value always serializes, and its text is JSON.
        RawValue::from_string(Value::Object(m).to_string())
            .unwrap_or_else(|_| RawValue::from_string(format!("{{\"code\":{}}}", self.code)).unwrap_or_default())
    }

    /// Logs the error as its source deserves: a client's mistake at debug level, the
    /// gateway's own failure and a server's at warn. Each front calls it where it renders.
    /// The message is written quoted and escaped: it may hold what a client sent (a
    /// method name with a line break must not make a log line of its own).
    pub fn log(&self) {
        let (code, source, message) = (self.code, self.source.label(), &self.message);
        match &self.source {
            Source::Client => tracing::debug!(code, source, ?message, "refused"),
            Source::Server(s) => tracing::warn!(code, source, server = %s, ?message, "refused"),
            Source::Gateway => tracing::warn!(code, source, ?message, "refused"),
        }
    }

    /// The HTTP status an HTTP front answers with: the explicit one, else 400 for a
    /// client's malformed message, 200 (a JSON-RPC error in the body) for the rest.
    pub fn status(&self) -> u16 {
        if let Some(s) = self.http_status {
            return s;
        }
        match self.code {
            code::PARSE_ERROR | code::INVALID_REQUEST => 400,
            code::UNSUPPORTED_VERSION..=code::HEADER_MISMATCH => 400,
            code::UNAVAILABLE => 503,
            _ => 200,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_keeps_short_values_and_clips_long_ones_on_a_char_boundary() {
        assert_eq!(echo("mock://a/b"), "mock://a/b");
        let at_limit = "u".repeat(MAX_ECHO);
        assert_eq!(echo(&at_limit), at_limit.as_str());
        let long = format!("{}é{}", "u".repeat(MAX_ECHO - 1), "v".repeat(1000));
        let shown = echo(&long);
        assert_eq!(shown, format!("{}… ({} bytes)", "u".repeat(MAX_ECHO - 1), long.len()));
    }

    #[test]
    fn objects_and_sources() {
        let e = Error::invalid_params("unknown tool: x").with_data(serde_json::json!({"tool": "x"}));
        assert_eq!(
            e.object().get(),
            r#"{"code":-32602,"message":"unknown tool: x","data":{"tool":"x"}}"#
        );
        assert_eq!(e.source, Source::Client);
        let s: Arc<str> = "calc".into();
        let e = Error::server(&s, code::REQUEST_TIMEOUT, "server 'calc' timed out");
        assert_eq!(e.source.label(), "server");
        assert!(e.object().get().contains(r#""data":{"server":"calc"}"#));
        assert_eq!(Error::parse("x").status(), 400);
        assert_eq!(Error::invalid_params("x").status(), 200);
        assert_eq!(Error::invalid_params("x").with_status(406).status(), 406);
    }
}
