//! Front ends: adapters that turn a transport into calls on [`crate::router::Gateway`].

pub mod http;
pub mod modern;
pub mod stdio;
