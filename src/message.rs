//! The JSON-RPC envelope and typed views of the few fields the gateway rewrites.
//!
//! A message is parsed into a [`Kind`]: `id` and `method` are read, while
//! `params`, `result` and `error` stay as raw JSON text ([`RawValue`](serde_json::value::RawValue)) until some
//! code needs to look inside. A large tool result is never re-serialized nor copied
//! here: it stays a slice of the message it came in ([`Raw`], [`Kind::parse_shared`])
//! and goes out from that buffer ([`Answer`]). Fields the gateway does not know pass
//! through untouched. Pure: no I/O.
//!
//! The bottom of the crate: it uses nothing of the gateway's but [`crate::error`] and
//! [`crate::method`]. In parts, each re-exported here:
//! - `id`: [`Id`], an id (or progress token) as the peer wrote it;
//! - `envelope`: [`Kind::parse`], the input limits, [`Request`] (a request typed);
//! - `answer`: results and errors ([`Outcome`], [`Raw`]) and the response that carries
//!   them ([`Answer`]);
//! - `members`: params opened one level ([`Members`]);
//! - `peek`: a field or two read from raw JSON without opening it;
//! - `write`: the lines the gateway writes, their framing, small builders.

use std::fmt::Write as _;

/// JSON-RPC error codes: defined once, in [`crate::error::code`].
pub use crate::error::code;

mod answer;
mod envelope;
mod id;
mod members;
mod memo;
mod peek;
mod write;

#[cfg(test)]
pub use answer::LARGE_RESULT;
pub use answer::{response, Answer, Outcome, Raw};
pub use envelope::{lanes_of, Kind, MAX_NAME_LEN};
pub use id::{id_key, Id};
pub use members::{Incoming, Members, Peeked};
#[doc(hidden)]
pub use memo::reading;
pub(crate) use peek::Finder;
pub use peek::{cancelled_request_id, error_summary, is_tool_error, progress_token_of};
pub use write::{
    blank_line_breaks, empty_object, error_object, frame_line, has_line_breaks, notification,
    notification_with_members, params_object, request, request_with_members, request_with_object, to_raw,
};

/// A short, stable hex hash (FNV-1a, 64 bit), used to shorten names deterministically.
pub fn short_hash(parts: &[&str], hex_len: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            // A separator byte that never occurs in UTF-8, so ("ab","c") != ("a","bc").
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut s = String::with_capacity(16);
    let _ = write!(s, "{h:016x}");
    s.truncate(hex_len);
    s
}

/// The 2026-07-28 (stateless) revision and the `_meta` keys of its envelope, for both
/// sides: the public endpoint and the downstream connections.
pub mod meta {
    /// The stateless revision.
    pub const VERSION: &str = "2026-07-28";
    pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    pub const META_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
    pub const META_INFO: &str = "io.modelcontextprotocol/clientInfo";
    pub const META_LOG: &str = "io.modelcontextprotocol/logLevel";
    pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    pub const META_SUBSCRIPTION: &str = "io.modelcontextprotocol/subscriptionId";
    /// Relates a message (a server's question, a result) to a task.
    pub const META_RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
}
