//! Front ends: adapters that turn a transport into calls on [`crate::router::Gateway`].

pub mod http;
pub mod replay;
pub mod stdio;
