//! `[servers.NAME] auth`: how the gateway gets a credential for a remote server on behalf
//! of each caller. Two kinds, one of them per server:
//! - `token_exchange`: RFC 8693. The caller's validated inbound JWT (from `[auth.oauth]`)
//!   is traded at `token_endpoint` for a token of the server's audience (`src/upstream/`).
//! - `oauth`: the gateway is the user's own OAuth client (authorization code with PKCE,
//!   consent through URL elicitation); `client_id` unset means dynamic client registration.
//!
//! Only remote servers (`url`) take `auth`. Secrets (`client_secret`) are [`Secret`]s.

use super::errors::Ctx;
use super::values::one_of;
use super::{expand, Secret};
use serde::Deserialize;
use toml::Spanned;

/// `subject_token_type` unset: the caller's JWT is an OAuth access token.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// The other subject token types `subject_token_type` may name.
const TOKEN_TYPES: &[(&str, &str)] = &[
    ("access_token", ACCESS_TOKEN_TYPE),
    ("jwt", "urn:ietf:params:oauth:token-type:jwt"),
    ("id_token", "urn:ietf:params:oauth:token-type:id_token"),
];
/// `client_auth` unset: the client id and secret in an HTTP Basic header.
pub const DEFAULT_CLIENT_AUTH: ClientAuth = ClientAuth::Basic;

/// `auth = { ... }` as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamAuth {
    token_exchange: Option<Spanned<RawTokenExchange>>,
    oauth: Option<Spanned<RawOAuthClient>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTokenExchange {
    token_endpoint: Option<Spanned<String>>,
    audience: Option<Spanned<String>>,
    resource: Option<Spanned<String>>,
    scope: Option<Spanned<String>>,
    client_id: Option<Spanned<String>>,
    client_secret: Option<Spanned<String>>,
    client_auth: Option<Spanned<String>>,
    subject_token_type: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawOAuthClient {
    client_id: Option<Spanned<String>>,
    client_secret: Option<Spanned<String>>,
    #[serde(default)]
    scopes: Vec<Spanned<String>>,
    authorization_server: Option<Spanned<String>>,
    redirect: Option<Spanned<String>>,
}

/// A remote server's `auth`, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamAuth {
    TokenExchange(TokenExchange),
    OAuth(OAuthClient),
}

/// How the gateway authenticates itself to a token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// `client_secret_basic`: `Authorization: Basic` (RFC 6749 §2.3.1).
    Basic,
    /// `client_secret_post`: `client_id` and `client_secret` in the form.
    Post,
}

/// `auth.token_exchange`: RFC 8693 on behalf of each caller.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenExchange {
    /// The authorization server's token endpoint (http or https).
    pub token_endpoint: String,
    /// `audience` sent in the exchange: the logical name of the server's API.
    pub audience: Option<String>,
    /// `resource` sent in the exchange (RFC 8707): the server's URI.
    pub resource: Option<String>,
    /// `scope` sent in the exchange (space-separated, as written).
    pub scope: Option<String>,
    /// The gateway's client id at the authorization server.
    pub client_id: String,
    /// Its secret; `None`: a public client (only `client_id` is sent).
    pub client_secret: Option<Secret>,
    pub client_auth: ClientAuth,
    /// The `subject_token_type` URN (default [`ACCESS_TOKEN_TYPE`]).
    pub subject_token_type: String,
}

/// `auth.oauth`: the gateway as the user's OAuth client.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthClient {
    /// `None`: registered dynamically (RFC 7591) at the authorization server.
    pub client_id: Option<String>,
    pub client_secret: Option<Secret>,
    /// Scopes asked for (none: what the server's metadata or challenge says).
    pub scopes: Vec<String>,
    /// The authorization server (its issuer URL); `None`: discovered from the server's
    /// 401 and its RFC 9728 protected-resource metadata.
    pub authorization_server: Option<String>,
    /// The redirect URI registered for the gateway (its public `/oauth/callback`);
    /// `None`: made from the request's own origin.
    pub redirect: Option<String>,
}

impl UpstreamAuth {
    /// The kind, as written in the file (for messages and `/status`).
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamAuth::TokenExchange(_) => "token_exchange",
            UpstreamAuth::OAuth(_) => "oauth",
        }
    }
}

/// `servers.NAME.auth`, validated; `None` with errors (reported in `cx`).
pub(super) fn parse(
    cx: &mut Ctx,
    server: &str,
    raw: Spanned<RawUpstreamAuth>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<UpstreamAuth> {
    let at = raw.span().start;
    let raw = raw.into_inner();
    match (raw.token_exchange, raw.oauth) {
        (Some(t), None) => token_exchange(cx, server, t, env).map(UpstreamAuth::TokenExchange),
        (None, Some(o)) => oauth(cx, server, o, env).map(UpstreamAuth::OAuth),
        (Some(_), Some(_)) => {
            cx.at(
                at,
                format!("servers.{server}.auth: give one of `token_exchange` or `oauth`, not both"),
            );
            None
        }
        (None, None) => {
            cx.at(
                at,
                format!("servers.{server}.auth: give `token_exchange = {{ ... }}` or `oauth = {{ ... }}`"),
            );
            None
        }
    }
}

/// One string value, `${VAR}` expanded; an unset variable or an empty value is reported.
fn value(cx: &mut Ctx, key: &str, v: Option<Spanned<String>>, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let v = v?;
    match expand(v.get_ref(), env) {
        Ok(s) if s.trim().is_empty() => {
            cx.at(v.span().start, format!("{key} is empty"));
            None
        }
        Ok(s) if s.bytes().any(|b| b.is_ascii_control()) => {
            cx.at(v.span().start, format!("{key} contains a control character"));
            None
        }
        Ok(s) => Some(s),
        Err(var) => {
            cx.at(
                v.span().start,
                format!("{key}: environment variable {var} is not set (write ${{{var}:-default}} for a default)"),
            );
            None
        }
    }
}

/// An http(s) URL, or an error at its key.
fn url(cx: &mut Ctx, key: &str, at: usize, u: &str) -> bool {
    let ok = (u.starts_with("https://") || u.starts_with("http://")) && !u.contains(char::is_whitespace);
    if !ok {
        cx.at(at, format!("{key} must be an http:// or https:// URL"));
    }
    ok
}

fn token_exchange(
    cx: &mut Ctx,
    server: &str,
    raw: Spanned<RawTokenExchange>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<TokenExchange> {
    let errors = cx.errors.len();
    let at = raw.span().start;
    let raw = raw.into_inner();
    let key = |k: &str| format!("servers.{server}.auth.token_exchange.{k}");
    let endpoint_at = raw.token_endpoint.as_ref().map_or(at, |v| v.span().start);
    let token_endpoint = value(cx, &key("token_endpoint"), raw.token_endpoint, env);
    match &token_endpoint {
        None if cx.errors.len() == errors => cx.at(at, format!("{} is required", key("token_endpoint"))),
        None => {}
        Some(u) => {
            url(cx, &key("token_endpoint"), endpoint_at, u);
        }
    }
    let had_client_id = raw.client_id.is_some();
    let client_id = value(cx, &key("client_id"), raw.client_id, env);
    if !had_client_id {
        cx.at(at, format!("{} is required", key("client_id")));
    }
    let audience = value(cx, &key("audience"), raw.audience, env);
    let resource_at = raw.resource.as_ref().map_or(at, |v| v.span().start);
    let resource = value(cx, &key("resource"), raw.resource, env);
    if let Some(r) = &resource {
        url(cx, &key("resource"), resource_at, r);
    }
    let scope = value(cx, &key("scope"), raw.scope, env);
    let client_secret = value(cx, &key("client_secret"), raw.client_secret, env).map(Secret);
    let client_auth = one_of(
        cx,
        raw.client_auth.as_ref(),
        &key("client_auth"),
        DEFAULT_CLIENT_AUTH,
        &[
            ("client_secret_basic", ClientAuth::Basic),
            ("client_secret_post", ClientAuth::Post),
        ],
    );
    let subject_token_type = match &raw.subject_token_type {
        None => ACCESS_TOKEN_TYPE.to_owned(),
        Some(t) => match TOKEN_TYPES
            .iter()
            .find(|(short, urn)| t.get_ref() == short || t.get_ref() == urn)
        {
            Some((_, urn)) => (*urn).to_owned(),
            None => {
                let names: Vec<&str> = TOKEN_TYPES.iter().map(|(s, _)| *s).collect();
                cx.at(
                    t.span().start,
                    format!(
                        "{}: {:?} is not one of {} (or its urn:ietf:params:oauth:token-type: URN)",
                        key("subject_token_type"),
                        t.get_ref(),
                        names.join(", ")
                    ),
                );
                String::new()
            }
        },
    };
    if cx.errors.len() != errors {
        return None;
    }
    Some(TokenExchange {
        token_endpoint: token_endpoint?,
        audience,
        resource,
        scope,
        client_id: client_id?,
        client_secret,
        client_auth,
        subject_token_type,
    })
}

fn oauth(
    cx: &mut Ctx,
    server: &str,
    raw: Spanned<RawOAuthClient>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<OAuthClient> {
    let errors = cx.errors.len();
    let at = raw.span().start;
    let raw = raw.into_inner();
    let key = |k: &str| format!("servers.{server}.auth.oauth.{k}");
    let client_id = value(cx, &key("client_id"), raw.client_id, env);
    let secret_at = raw.client_secret.as_ref().map_or(at, |v| v.span().start);
    let client_secret = value(cx, &key("client_secret"), raw.client_secret, env).map(Secret);
    if client_secret.is_some() && client_id.is_none() && cx.errors.len() == errors {
        cx.at(
            secret_at,
            format!(
                "{} needs {} (without one the gateway registers itself dynamically and gets its own secret)",
                key("client_secret"),
                key("client_id")
            ),
        );
    }
    let mut scopes = Vec::new();
    for s in raw.scopes {
        let scope = s.get_ref();
        // RFC 6749 §3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
        if scope.is_empty()
            || !scope
                .bytes()
                .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
        {
            cx.at(
                s.span().start,
                format!(
                    "{}: {scope:?} is not a scope (no spaces, quotes or backslashes)",
                    key("scopes")
                ),
            );
        } else if !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    let mut url_value = |k: &str, v: Option<Spanned<String>>| {
        let at = v.as_ref().map_or(at, |v| v.span().start);
        let s = value(cx, &key(k), v, env)?;
        url(cx, &key(k), at, &s).then_some(s)
    };
    let authorization_server = url_value("authorization_server", raw.authorization_server);
    let redirect = url_value("redirect", raw.redirect);
    if client_secret.is_some() && client_id.is_some() && authorization_server.is_none() && cx.errors.len() == errors {
        // The secret goes to the token endpoint of the authorization server: one named
        // here, never one the server's own metadata names (the server would choose where
        // the gateway sends it).
        cx.at(
            secret_at,
            format!(
                "{} needs {}: the secret is sent only to an authorization server named in gateway.toml, never to one the server's metadata names",
                key("client_secret"),
                key("authorization_server")
            ),
        );
    }
    if let Some(r) = &redirect {
        if r.contains('#') {
            cx.at(at, format!("{} must not have a #fragment", key("redirect")));
        }
    }
    (cx.errors.len() == errors).then_some(OAuthClient {
        client_id,
        client_secret,
        scopes,
        authorization_server,
        redirect,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Config, Transport};
    use super::*;
    use std::path::Path;

    fn env(k: &str) -> Option<String> {
        (k == "GW_SECRET").then(|| "hunter2-secret".to_owned())
    }

    const OAUTH: &str = "[auth.oauth]\nissuer = \"https://idp\"\naudience = \"gw\"\njwks_url = \"https://idp/jwks\"\n";

    fn parse(src: &str) -> Result<Config, String> {
        Config::parse(Path::new("g.toml"), src, &env).map_err(|e| e.to_string())
    }

    fn auth_of(c: &Config) -> Option<UpstreamAuth> {
        match &c.servers[0].transport {
            Transport::Http(h) => h.auth.clone(),
            Transport::Stdio(_) => None,
        }
    }

    #[test]
    fn token_exchange_parses_with_defaults_and_masks_the_secret() {
        let src = format!(
            "{OAUTH}[servers.docs]\nurl = \"https://docs/mcp\"\n\
             auth = {{ token_exchange = {{ token_endpoint = \"https://idp/token\", audience = \"docs-api\", \
             scope = \"docs.read\", client_id = \"mcp-gateway\", client_secret = \"${{GW_SECRET}}\" }} }}\n"
        );
        let c = parse(&src).unwrap();
        let Some(UpstreamAuth::TokenExchange(t)) = auth_of(&c) else {
            panic!("no token_exchange")
        };
        assert_eq!(t.token_endpoint, "https://idp/token");
        assert_eq!(t.audience.as_deref(), Some("docs-api"));
        assert_eq!(t.client_secret.as_ref().map(Secret::expose), Some("hunter2-secret"));
        assert_eq!(t.client_auth, ClientAuth::Basic);
        assert_eq!(t.subject_token_type, ACCESS_TOKEN_TYPE);
        assert!(!format!("{c:?}").contains("hunter2"), "the secret is masked in Debug");

        let post = src.replace(
            "client_id =",
            "client_auth = \"client_secret_post\", subject_token_type = \"jwt\", client_id =",
        );
        let Some(UpstreamAuth::TokenExchange(t)) = auth_of(&parse(&post).unwrap()) else {
            panic!("no token_exchange")
        };
        assert_eq!(t.client_auth, ClientAuth::Post);
        assert_eq!(t.subject_token_type, "urn:ietf:params:oauth:token-type:jwt");
    }

    #[test]
    fn oauth_parses() {
        let src = "[servers.docs]\nurl = \"https://docs/mcp\"\n\
                   auth = { oauth = { client_id = \"gw\", client_secret = \"${GW_SECRET}\", authorization_server = \"https://idp\", scopes = [\"a\", \"b:c\", \"a\"] } }\n";
        let Some(UpstreamAuth::OAuth(o)) = auth_of(&parse(src).unwrap()) else {
            panic!("no oauth")
        };
        assert_eq!(o.client_id.as_deref(), Some("gw"));
        assert_eq!(o.scopes, ["a", "b:c"]);
        assert_eq!(o.authorization_server.as_deref(), Some("https://idp"));
        let dynamic = "[servers.docs]\nurl = \"https://docs/mcp\"\nauth = { oauth = { } }\n";
        let Some(UpstreamAuth::OAuth(o)) = auth_of(&parse(dynamic).unwrap()) else {
            panic!("no oauth")
        };
        assert_eq!(o.client_id, None);
    }

    #[test]
    fn errors_name_the_server_and_key_and_never_the_secret() {
        let cases: &[(&str, &str)] = &[
            (
                "[servers.s]\ncommand = \"x\"\nauth = { oauth = {} }\n",
                "servers.s.auth only applies to remote servers",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { }\n",
                "servers.s.auth: give `token_exchange",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { oauth = {}, token_exchange = {} }\n",
                "not both",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { token_exchange = { token_endpoint = \"https://t\", client_id = \"c\" } }\n",
                "servers.s.auth.token_exchange needs [auth.oauth]",
            ),
            (
                &format!("{OAUTH}[servers.s]\nurl = \"https://s\"\nauth = {{ token_exchange = {{ client_id = \"c\" }} }}\n"),
                "servers.s.auth.token_exchange.token_endpoint is required",
            ),
            (
                &format!("{OAUTH}[servers.s]\nurl = \"https://s\"\nauth = {{ token_exchange = {{ token_endpoint = \"ftp://t\", client_id = \"c\" }} }}\n"),
                "servers.s.auth.token_exchange.token_endpoint must be an http:// or https:// URL",
            ),
            (
                &format!("{OAUTH}[servers.s]\nurl = \"https://s\"\nauth = {{ token_exchange = {{ token_endpoint = \"https://t\" }} }}\n"),
                "servers.s.auth.token_exchange.client_id is required",
            ),
            (
                &format!("{OAUTH}[servers.s]\nurl = \"https://s\"\nauth = {{ token_exchange = {{ token_endpoint = \"https://t\", client_id = \"c\", client_secret = \"${{NOPE}}\" }} }}\n"),
                "servers.s.auth.token_exchange.client_secret: environment variable NOPE is not set",
            ),
            (
                &format!("{OAUTH}[servers.s]\nurl = \"https://s\"\nauth = {{ token_exchange = {{ token_endpoint = \"https://t\", client_id = \"c\", subject_token_type = \"saml\" }} }}\n"),
                "servers.s.auth.token_exchange.subject_token_type: \"saml\" is not one of",
            ),
            (
                &format!("{OAUTH}[servers.s]\nurl = \"https://s\"\nauth = {{ token_exchange = {{ token_endpoint = \"https://t\", client_id = \"c\", bogus = 1 }} }}\n"),
                "bogus",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { oauth = { client_secret = \"${GW_SECRET}\" } }\n",
                "servers.s.auth.oauth.client_secret needs servers.s.auth.oauth.client_id",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { oauth = { client_id = \"c\", client_secret = \"${GW_SECRET}\" } }\n",
                "servers.s.auth.oauth.client_secret needs servers.s.auth.oauth.authorization_server",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { oauth = { scopes = [\"a b\"] } }\n",
                "servers.s.auth.oauth.scopes: \"a b\" is not a scope",
            ),
            (
                "[servers.s]\nurl = \"https://s\"\nauth = { oauth = { redirect = \"javascript:x\" } }\n",
                "servers.s.auth.oauth.redirect must be an http:// or https:// URL",
            ),
        ];
        for (src, want) in cases {
            let e = parse(src).err().unwrap_or_default();
            assert!(e.contains(want), "{src}\nwant {want:?} in:\n{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
