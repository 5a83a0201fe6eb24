//! `[servers.NAME] auth`: how the gateway gets a credential of the caller's own for a
//! remote server. (The `exchange` branch owns this file; until it is merged this holds
//! only the `oauth` variant, which the consent flow uses.)

use super::errors::Ctx;
use super::{expand, Secret};
use serde::Deserialize;
use toml::Spanned;

/// `auth = { oauth = { ... } }` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub(super) enum RawUpstreamAuth {
    Oauth(RawOAuthClient),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOAuthClient {
    client_id: Option<Spanned<String>>,
    client_secret: Option<Spanned<String>>,
    #[serde(default)]
    scopes: Vec<String>,
    /// The authorization server's issuer, when the server's RFC 9728 metadata is not to
    /// be asked.
    issuer: Option<Spanned<String>>,
}

/// How the gateway gets a credential for a server, per caller.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamAuth {
    /// The gateway is each user's OAuth client (authorization code with PKCE), and asks
    /// the user's consent through URL elicitation.
    OAuth(OAuthClient),
}

/// `auth.oauth`.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthClient {
    /// `None`: registered dynamically (RFC 7591) on first use.
    pub client_id: Option<String>,
    pub client_secret: Option<Secret>,
    pub scopes: Vec<String>,
    /// `None`: discovered from the server (RFC 9728, then RFC 8414).
    pub issuer: Option<String>,
}

impl UpstreamAuth {
    pub fn oauth(&self) -> Option<&OAuthClient> {
        match self {
            UpstreamAuth::OAuth(o) => Some(o),
        }
    }
}

pub(super) fn parse(
    cx: &mut Ctx,
    server: &str,
    raw: RawUpstreamAuth,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<UpstreamAuth> {
    let RawUpstreamAuth::Oauth(o) = raw;
    let errors = cx.errors.len();
    let mut text = |v: &Option<Spanned<String>>, key: &str| -> Option<String> {
        let v = v.as_ref()?;
        match expand(v.get_ref(), env) {
            Ok(s) if s.trim().is_empty() => {
                cx.at(v.span().start, format!("servers.{server}.auth.oauth.{key} is empty"));
                None
            }
            Ok(s) => Some(s),
            Err(var) => {
                cx.at(
                    v.span().start,
                    format!("servers.{server}.auth.oauth.{key}: environment variable {var} is not set"),
                );
                None
            }
        }
    };
    let client_id = text(&o.client_id, "client_id");
    let client_secret = text(&o.client_secret, "client_secret").map(Secret::new);
    let issuer = text(&o.issuer, "issuer");
    if let (Some(i), Some(v)) = (&issuer, &o.issuer) {
        if !(i.starts_with("https://") || i.starts_with("http://")) {
            cx.at(
                v.span().start,
                format!("servers.{server}.auth.oauth.issuer must start with https:// or http://"),
            );
        }
    }
    if client_secret.is_some() && client_id.is_none() {
        if let Some(v) = &o.client_secret {
            cx.at(
                v.span().start,
                format!("servers.{server}.auth.oauth.client_secret needs a client_id (without one the gateway registers itself)"),
            );
        }
    }
    (cx.errors.len() == errors).then_some(UpstreamAuth::OAuth(OAuthClient {
        client_id,
        client_secret,
        scopes: o.scopes,
        issuer,
    }))
}
