//! Credentials toward servers that act for each user: the users' own OAuth tokens
//! (`consent`, their sealed store in `store`, sealing in `seal`).

pub mod consent;
pub mod seal;
pub mod store;
