//! `[clients.NAME]` (who may call, and what they may see) and `[auth.oauth]` (the gateway
//! as an OAuth 2.1 resource server). Static tokens are hashed here and only their
//! digests kept.

use super::errors::Ctx;
use super::rate_limits::{rate, Rate};
use super::values::name_char;
use super::values::Filter;
use super::{expand, Secret};
use indexmap::IndexMap;
use serde::Deserialize;
use std::fmt;
use toml::Spanned;

/// `auth.oauth.client_claim` unset: the JWT claim whose value names the client.
pub const DEFAULT_CLIENT_CLAIM: &str = "sub";

/// `[clients.NAME]`: who may call, and what they may see.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    token: Option<Spanned<String>>,
    token_sha256: Option<Spanned<String>>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    rate_limit: Option<Spanned<String>>,
    #[serde(default)]
    admin: bool,
    /// `secrets = { NAME = "${VAR}" }`: what `${client:NAME}` in a server's `env` and
    /// `headers` becomes for this client.
    #[serde(default)]
    secrets: IndexMap<String, Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    oauth: Option<Spanned<RawOAuth>>,
}

/// `[auth.oauth]`: the gateway as an OAuth 2.1 resource server.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOAuth {
    issuer: Spanned<String>,
    audience: Spanned<String>,
    jwks_url: Spanned<String>,
    client_claim: Option<Spanned<String>>,
    resource: Option<Spanned<String>>,
}

/// `[clients.*]` and `[auth.oauth]`. With neither, the endpoint is open.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Auth {
    /// In file order.
    pub clients: Vec<ClientSpec>,
    pub oauth: Option<OAuth>,
}

impl Auth {
    /// Whether requests to the MCP endpoint need a bearer token.
    pub fn required(&self) -> bool {
        !self.clients.is_empty() || self.oauth.is_some()
    }

    pub fn client(&self, name: &str) -> Option<&ClientSpec> {
        self.clients.iter().find(|c| c.name == name)
    }
}

/// One `[clients.NAME]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSpec {
    pub name: String,
    /// SHA-256 of its static bearer token; `None` for a client that only signs in with
    /// OAuth (or only runs `stdio --client`).
    pub token: Option<TokenDigest>,
    /// Globs over public tool and prompt names and resource URIs (empty allow: all).
    pub filter: Filter,
    /// The client's own limit, besides `[rate_limits] per_client`.
    pub rate_limit: Option<Rate>,
    /// `admin = true`: may read the console and `/status*`.
    pub admin: bool,
    /// `secrets`: its values for `${client:NAME}` in servers' `env` and `headers`, by name.
    pub secrets: Vec<(String, Secret)>,
}

impl ClientSpec {
    /// Its secret `name`, if it has one.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Whether it sees everything (no allow and no deny globs).
    pub fn unrestricted(&self) -> bool {
        self.filter.is_empty()
    }
}

/// The SHA-256 digest of a bearer token; never shown (`Debug` prints `sha256:****`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest(pub [u8; 32]);

impl TokenDigest {
    pub fn of(token: &str) -> TokenDigest {
        let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        TokenDigest(out)
    }

    /// From 64 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<TokenDigest> {
        let hex = hex.trim().as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
            let s = std::str::from_utf8(pair).ok()?;
            *o = u8::from_str_radix(s, 16).ok()?;
        }
        Some(TokenDigest(out))
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:****")
    }
}

/// `[auth.oauth]`: JWT bearer tokens from one issuer.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuth {
    pub issuer: String,
    pub audience: String,
    pub jwks_url: String,
    /// The claim whose (string) value names the client; default [`DEFAULT_CLIENT_CLAIM`].
    pub client_claim: String,
    /// The public URL of the MCP endpoint, for the protected-resource metadata; `None`:
    /// derived from each request's Host header (`http://HOST{path}`).
    pub resource: Option<String>,
}

/// `[clients.*]` and `[auth.oauth]`. Tokens are hashed here and only their digests kept.
pub(super) fn parse(
    cx: &mut Ctx,
    clients: IndexMap<Spanned<String>, RawClient>,
    raw: RawAuth,
    env: &dyn Fn(&str) -> Option<String>,
) -> Auth {
    let mut out = Vec::new();
    let mut seen: Vec<(TokenDigest, String)> = Vec::new();
    for (name, c) in clients {
        let at = name.span().start;
        let name = name.into_inner();
        if name.trim().is_empty() || name.chars().any(char::is_control) {
            cx.at(
                at,
                format!("client name {name:?} must not be empty or hold control characters"),
            );
        }
        let token = match (&c.token, &c.token_sha256) {
            (Some(_), Some(h)) => {
                cx.at(
                    h.span().start,
                    format!("clients.{name}: give either `token` or `token_sha256`, not both"),
                );
                None
            }
            (Some(t), None) => match expand(t.get_ref(), env) {
                Ok(v) if v.trim().is_empty() => {
                    cx.at(t.span().start, format!("clients.{name}.token is empty"));
                    None
                }
                Ok(v) => Some((TokenDigest::of(&v), t.span().start, "token")),
                Err(var) => {
                    cx.at(
                        t.span().start,
                        format!("clients.{name}.token: environment variable {var} is not set"),
                    );
                    None
                }
            },
            (None, Some(h)) => match TokenDigest::from_hex(h.get_ref()) {
                Some(d) => Some((d, h.span().start, "token_sha256")),
                None => {
                    cx.at(
                        h.span().start,
                        format!("clients.{name}.token_sha256 is not 64 hex digits (a SHA-256 digest)"),
                    );
                    None
                }
            },
            (None, None) => None,
        };
        let token = token.map(|(digest, at, key)| {
            if let Some((_, other)) = seen.iter().find(|(d, _)| *d == digest) {
                cx.at(at, format!("clients.{name}.{key}: client {other:?} has the same token"));
            }
            seen.push((digest, name.clone()));
            digest
        });
        let rate_limit = rate(cx, c.rate_limit.as_ref(), &format!("clients.{name}.rate_limit"));
        let mut secrets = Vec::new();
        for (key, value) in c.secrets {
            let at = value.span().start;
            if key.is_empty() || !key.chars().all(name_char) {
                cx.at(
                    at,
                    format!("clients.{name}.secrets: {key:?} may only use [A-Za-z0-9_.-] and must not be empty"),
                );
                continue;
            }
            match expand(value.get_ref(), env) {
                Ok(v) if v.is_empty() => cx.at(at, format!("clients.{name}.secrets.{key} is empty")),
                Ok(v) => secrets.push((key, Secret(v))),
                Err(var) => cx.at(
                    at,
                    format!("clients.{name}.secrets.{key}: environment variable {var} is not set"),
                ),
            }
        }
        out.push(ClientSpec {
            name,
            token,
            filter: Filter {
                allow: c.allow,
                deny: c.deny,
            },
            rate_limit,
            admin: c.admin,
            secrets,
        });
    }
    let oauth = raw.oauth.map(|o| {
        let o = o.into_inner();
        let mut value = |v: &Spanned<String>, key: &str| match expand(v.get_ref(), env) {
            Ok(s) if s.trim().is_empty() => {
                cx.at(v.span().start, format!("auth.oauth.{key} is empty"));
                String::new()
            }
            Ok(s) => s.trim().to_owned(),
            Err(var) => {
                cx.at(
                    v.span().start,
                    format!("auth.oauth.{key}: environment variable {var} is not set"),
                );
                String::new()
            }
        };
        let issuer = value(&o.issuer, "issuer");
        let audience = value(&o.audience, "audience");
        let jwks_url = value(&o.jwks_url, "jwks_url");
        let client_claim = o
            .client_claim
            .as_ref()
            .map_or(DEFAULT_CLIENT_CLAIM.to_owned(), |c| value(c, "client_claim"));
        let resource = o.resource.as_ref().map(|r| value(r, "resource"));
        let urls = [(Some(&jwks_url), &o.jwks_url, "jwks_url")]
            .into_iter()
            .chain(o.resource.as_ref().map(|r| (resource.as_ref(), r, "resource")));
        for (v, raw, key) in urls {
            let v = v.map_or("", String::as_str);
            if !(v.is_empty() || v.starts_with("http://") || v.starts_with("https://")) {
                cx.at(
                    raw.span().start,
                    format!("auth.oauth.{key} must start with http:// or https://"),
                );
            }
        }
        OAuth {
            issuer,
            audience,
            jwks_url,
            client_claim,
            resource,
        }
    });
    Auth { clients: out, oauth }
}
