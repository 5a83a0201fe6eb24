//! Credentials the gateway gets for remote servers on behalf of each caller
//! (`[servers.NAME] auth`, issue #18): RFC 8693 token exchange (`exchange`), the tokens'
//! cache, shared and sealed in cluster mode (`seal`); and the users' own OAuth tokens,
//! got through their consent (`consent`), kept sealed in `store`.

pub mod consent;
pub mod exchange;
pub mod seal;
pub mod store;
