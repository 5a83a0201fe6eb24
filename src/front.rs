//! Front ends: adapters that turn a transport into calls on [`crate::router::Gateway`].

pub mod http;
pub mod listen;
pub mod modern;
pub mod replay;
pub mod stdio;
