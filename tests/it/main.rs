//! The integration tests, as one test binary: the harness (`common`) is compiled and
//! linked once, and each module is one concern. Most run the real `mcp-gateway` binary on
//! port 0 against real child processes. One module: `cargo test --test it MODULE::`.

// Test code: a failed unwrap is the test failing, and the harness signals child
// processes through libc.
#![allow(clippy::unwrap_used, unsafe_code)]

mod auth;
mod balancer;
mod cli_start;
mod client_secrets;
mod cluster;
mod cluster_e2e;
mod cluster_limits;
mod common;
mod compose;
mod config_cli;
mod consent;
mod console;
mod core_catalog;
mod core_http;
mod core_http_input;
mod core_quirks;
mod core_stdio;
mod deploy;
mod docs;
mod drain;
mod exhaustion;
mod hardening;
mod hostile_http;
mod hostile_message;
mod hostile_ops;
mod hostile_pipe;
mod hostile_replay;
mod hostile_stateless;
mod import;
mod interop;
mod isolation;
mod operations;
mod overrides;
mod pagination;
mod profiles;
mod reload;
mod remote;
mod remote_interop;
mod remote_pool;
mod search;
mod smoke;
mod sse_resume;
mod stateless;
mod stateless_downstream;
mod stateless_listen;
mod stateless_rounds;
mod stateless_stdio;
mod supervision;
mod tasks;
mod telemetry;
mod token_exchange;
mod two_way;
