//! Front ends: adapters that turn a transport into calls on [`crate::router::Gateway`],
//! and for 2026-07-28 requests on the one flow of that revision ([`crate::stateless`]).

pub mod http;
pub mod replay;
pub mod stdio;
