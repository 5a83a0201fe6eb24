//! Who is calling, and what they may see: bearer tokens in, an [`Identity`] out.
//!
//! Two kinds of credential, both sent as `Authorization: Bearer …`:
//! - static tokens of `[clients.NAME]` tables. Only their SHA-256 digests are kept; the
//!   digest of a presented token is compared with every client's, in constant time and
//!   without stopping at a match;
//! - with `[auth.oauth]`, JWTs from one issuer (OAuth 2.1 resource server): the signature
//!   is checked against the issuer's JWKS (fetched once, cached, fetched again for an
//!   unknown `kid` at most every [`REFETCH_EVERY`]), then `iss`, `aud`, `exp` and `nbf`.
//!   The configured claim names the client; a `[clients.NAME]` table of that name (with
//!   or without a token) gives its allowlist and rate limit, else it has full access.
//!
//! An identity's [`Policy`] filters the catalog: lists show only permitted tool and prompt
//! names and resource URIs, and a hidden one is answered exactly like an unknown one.
//! Tokens never reach logs or errors: rejections carry a reason, never the credential.

mod oauth;

use crate::catalog::view::{filter_result, Results, View};
use crate::catalog::Catalog;
use crate::config::{self, Filter, OAuth, Rate, TokenDigest};
use crate::limit::{quota, Limited};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, RateLimiter};
pub use oauth::valid_until;
use oauth::{looks_like_jwt, Jwt};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// The realm named in `WWW-Authenticate`.
pub const REALM: &str = "mcp-gateway";
/// Where the protected-resource metadata (RFC 9728) is served.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// An authenticated caller.
#[derive(Debug)]
pub struct Identity {
    /// The client's name: its `[clients.NAME]` table, or the OAuth claim's value. What
    /// policies, logs, errors, `/status` and the console go by.
    pub name: String,
    /// The key of the caller's own state (exchanged tokens, its connections, its stored
    /// consents): the name for a `[clients.NAME]` token, the name bound to the issuer and
    /// claim for an `[auth.oauth]` JWT ([`oauth_principal`]), so that a name an issuer
    /// gives never finds what another issuer's (or a static client's) caller left. It
    /// holds a NUL: logs show it through [`Shown`].
    pub principal: String,
    /// `None`: full access, no limit of its own.
    pub policy: Option<Arc<Policy>>,
    /// The validated inbound JWT (an `[auth.oauth]` identity): the subject token of
    /// `auth.token_exchange`. Never sent downstream as it is.
    pub bearer: Option<config::Secret>,
    /// The digest of the `[clients.NAME]` token it presented (`None`: it presented none
    /// of theirs): a reload that changes the token ends what the old one opened.
    pub token: Option<TokenDigest>,
}

impl Identity {
    /// The key of its own process or connection of a server (`isolation = "client"`,
    /// `${client:…}`): its name when a `[clients.NAME]` table names it (the operator's
    /// mapping: the process holds that table's secrets, whichever token or issuer the
    /// caller came with, as its policy is that table's), else its principal, so that a
    /// name another issuer gives is another caller with a process of its own.
    pub fn process_key(&self) -> &str {
        if self.policy.is_some() {
            &self.name
        } else {
            &self.principal
        }
    }

    /// Whether it may read the console and `/status*`: its `[clients.NAME]` says
    /// `admin = true` (an OAuth identity through the table of its name).
    pub fn admin(&self) -> bool {
        self.policy.as_ref().is_some_and(|p| p.admin)
    }

    /// Its `[clients.NAME] secrets` (none without a table of its name).
    pub fn secrets(&self) -> &[(String, config::Secret)] {
        self.policy.as_ref().map_or(&[], |p| &p.secrets)
    }

    /// Whether it may see and use a public tool or prompt name, or a resource URI.
    pub fn permits(&self, name: &str) -> bool {
        match &self.policy {
            None => true,
            Some(p) => p.permits(name),
        }
    }

    /// Whether it may see and use public tool or prompt name `name` of `catalog`: as
    /// [`Identity::permits`], and a deny glob of the name the item would have had, had it
    /// not been renamed (a collision), hides it too.
    pub fn permits_in(&self, catalog: &Catalog, name: &str) -> bool {
        match &self.policy {
            None => true,
            Some(p) => p.permits_in(catalog, name),
        }
    }

    /// Checks (and spends) the client's own `rate_limit`.
    pub fn check_rate(&self) -> Result<(), Limited> {
        self.policy.as_ref().map_or(Ok(()), |p| p.check_rate())
    }

    /// The client's own `rate_limit` and its `[clients.NAME]` name, without spending it.
    pub fn rate_limit(&self) -> Option<(&str, &Rate)> {
        let p = self.policy.as_deref()?;
        p.limiter.as_ref().map(|(_, r)| (p.name.as_str(), r))
    }

    /// The list results this identity sees in `view` (none: the whole catalog); `None`
    /// when it sees the view's (or the catalog's) own.
    pub fn views(&self, catalog: &Arc<Catalog>, view: Option<&Arc<View>>) -> Option<Arc<Views>> {
        self.policy.as_ref().and_then(|p| p.views(catalog, view))
    }
}

/// Filtered list results kept by a policy: at most this many (catalog, view) pairs.
const KEPT_VIEWS: usize = 16;

/// What one `[clients.NAME]` table says about its client.
pub struct Policy {
    pub name: String,
    filter: Filter,
    limiter: Option<(DefaultDirectRateLimiter, Rate)>,
    /// `admin = true`: may read the console and `/status*`.
    pub admin: bool,
    /// `secrets`: what `${client:NAME}` in servers' `env` and `headers` becomes for it.
    pub secrets: Vec<(String, config::Secret)>,
    /// Filtered list results, by the catalog and the view (none: the whole catalog) they
    /// were made from.
    views: Mutex<Vec<Kept>>,
}

/// One entry of [`Policy::views`]'s cache.
struct Kept {
    catalog: Weak<Catalog>,
    view: Option<Weak<View>>,
    lists: Arc<Views>,
}

impl Kept {
    fn of(&self, catalog: &Arc<Catalog>, view: Option<&Arc<View>>) -> bool {
        std::ptr::eq(self.catalog.as_ptr(), Arc::as_ptr(catalog))
            && match (&self.view, view) {
                (None, None) => true,
                (Some(w), Some(v)) => std::ptr::eq(w.as_ptr(), Arc::as_ptr(v)),
                _ => false,
            }
    }

    fn alive(&self) -> bool {
        self.catalog.strong_count() > 0 && self.view.as_ref().is_none_or(|w| w.strong_count() > 0)
    }
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("filter", &self.filter)
            .field("rate_limit", &self.limiter.as_ref().map(|(_, r)| r.to_string()))
            .finish()
    }
}

/// A catalog's (or a view's) four list results as one restricted client sees them.
pub type Views = Results;

impl Policy {
    fn new(spec: &config::ClientSpec) -> Policy {
        Policy {
            name: spec.name.clone(),
            filter: spec.filter.clone(),
            limiter: spec.rate_limit.clone().map(|r| (RateLimiter::direct(quota(&r)), r)),
            admin: spec.admin,
            secrets: spec.secrets.clone(),
            views: Mutex::new(Vec::new()),
        }
    }

    fn restricted(&self) -> bool {
        !self.filter.is_empty()
    }

    pub fn permits(&self, name: &str) -> bool {
        self.filter.permits(name)
    }

    /// [`Identity::permits_in`].
    pub fn permits_in(&self, catalog: &Catalog, name: &str) -> bool {
        self.filter.permits_in(catalog, name)
    }

    pub fn check_rate(&self) -> Result<(), Limited> {
        let Some((l, rate)) = &self.limiter else {
            return Ok(());
        };
        l.check().map_err(|n| Limited {
            what: crate::limit::Which::Client(&self.name).what(rate),
            retry_after: n.wait_time_from(DefaultClock::default().now()),
        })
    }

    /// The filtered lists of `view` (none: the whole catalog), made once per catalog
    /// and view: the intersection of the view and the allowlist. `None` when nothing is
    /// filtered.
    pub fn views(&self, catalog: &Arc<Catalog>, view: Option<&Arc<View>>) -> Option<Arc<Views>> {
        if !self.restricted() {
            return None;
        }
        let mut cached = crate::sync::lock(&self.views);
        if let Some(k) = cached.iter().find(|k| k.of(catalog, view)) {
            return Some(k.lists.clone());
        }
        let [tools, prompts, resources, templates] = match view {
            Some(v) => [
                &*v.lists.tools,
                &*v.lists.prompts,
                &*v.lists.resources,
                &*v.lists.templates,
            ],
            None => Results::of_catalog(catalog),
        };
        let f = &self.filter;
        let field = |name: &'static str| {
            move |_: usize, item: &Value| item.get(name).and_then(Value::as_str).is_some_and(|n| f.permits(n))
        };
        let named = |_: usize, item: &Value| {
            item.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| f.permits_in(catalog, n))
        };
        let v = Arc::new(Views {
            tools: filter_result(tools, "tools", named),
            prompts: filter_result(prompts, "prompts", named),
            resources: filter_result(resources, "resources", field("uri")),
            templates: filter_result(templates, "resourceTemplates", field("uriTemplate")),
        });
        cached.retain(Kept::alive);
        if cached.len() >= KEPT_VIEWS {
            cached.remove(0);
        }
        cached.push(Kept {
            catalog: Arc::downgrade(catalog),
            view: view.map(Arc::downgrade),
            lists: v.clone(),
        });
        Some(v)
    }
}

/// Why a request was refused. The text is for logs and the 401 body; it never holds
/// the credential.
#[derive(Debug, Clone, PartialEq)]
pub enum Denied {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// A credential that is not accepted, and why.
    Invalid(String),
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Missing => f.write_str("authentication required: send Authorization: Bearer <token>"),
            Denied::Invalid(why) => write!(f, "invalid bearer token: {why}"),
        }
    }
}

/// Turns credentials into identities; built from the config, shared by every front end.
pub struct Authenticator {
    /// Every `[clients.*]` table, by name.
    policies: HashMap<String, Arc<Policy>>,
    /// Static token digests and the identity each one is.
    tokens: Vec<(TokenDigest, Arc<Identity>)>,
    oauth: Option<Jwt>,
    required: bool,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("clients", &self.policies.keys().collect::<Vec<_>>())
            .field("oauth", &self.oauth.as_ref().map(|o| &o.cfg.issuer))
            .finish()
    }
}

impl Authenticator {
    pub fn new(auth: &config::Auth) -> Authenticator {
        let policies: HashMap<String, Arc<Policy>> = auth
            .clients
            .iter()
            .map(|c| (c.name.clone(), Arc::new(Policy::new(c))))
            .collect();
        let tokens = auth
            .clients
            .iter()
            .filter_map(|c| {
                let identity = Arc::new(Identity {
                    name: c.name.clone(),
                    principal: c.name.clone(),
                    policy: policies.get(&c.name).cloned(),
                    bearer: None,
                    token: c.token,
                });
                c.token.map(|d| (d, identity))
            })
            .collect();
        Authenticator {
            policies,
            tokens,
            oauth: auth.oauth.clone().map(Jwt::new),
            required: auth.required(),
        }
    }

    /// Every `[clients.*]` table's policy, in no particular order.
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.values()
    }

    /// Whether every request must carry a bearer token.
    pub fn required(&self) -> bool {
        self.required
    }

    pub fn oauth(&self) -> Option<&OAuth> {
        self.oauth.as_ref().map(|o| &o.cfg)
    }

    /// The identity of a configured client, for `stdio --client NAME`.
    pub fn client(&self, name: &str) -> Option<Arc<Identity>> {
        self.policies.get(name).map(|p| {
            Arc::new(Identity {
                name: name.to_owned(),
                principal: name.to_owned(),
                policy: Some(p.clone()),
                bearer: None,
                token: None,
            })
        })
    }

    /// What this (reloaded) configuration makes of an identity authenticated under an
    /// earlier one: the same caller under its table as it is now, or `None` when what it
    /// authenticated with is gone. A static token is gone when its client's table is, or
    /// when the table's token changed (a rotated token ends what the old one opened); a
    /// JWT when `[auth.oauth]` is. The principal stays the one it was given: a JWT that
    /// the former issuer validated keeps that issuer's state, even when the reload names
    /// another issuer (whose callers of the same name have their own).
    pub fn reread(&self, old: &Identity) -> Option<Arc<Identity>> {
        let policy = self.policies.get(&old.name).cloned();
        if old.bearer.is_some() {
            self.oauth.as_ref()?;
        } else {
            policy.as_ref()?;
            if old.token.is_some() && self.token_of(&old.name) != old.token {
                return None;
            }
        }
        Some(Arc::new(Identity {
            name: old.name.clone(),
            principal: old.principal.clone(),
            policy,
            bearer: old.bearer.clone(),
            token: old.token,
        }))
    }

    /// The digest of a client's static token, if its table has one.
    fn token_of(&self, name: &str) -> Option<TokenDigest> {
        self.tokens.iter().find(|(_, i)| i.name == name).map(|(d, _)| *d)
    }

    /// The identity behind an `Authorization` header value (`None`: no header).
    pub async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Arc<Identity>, Denied> {
        let Some(value) = authorization else {
            return Err(Denied::Missing);
        };
        let token = bearer(value).ok_or_else(|| Denied::Invalid("not a Bearer credential".into()))?;
        if let Some(identity) = self.static_token(token) {
            return Ok(identity);
        }
        match &self.oauth {
            Some(jwt) if looks_like_jwt(token) => {
                let name = jwt.verify(token).await.map_err(Denied::Invalid)?;
                let policy = self.policies.get(&name).cloned();
                Ok(Arc::new(Identity {
                    principal: format!("{name}{}", jwt.binding),
                    name,
                    policy,
                    bearer: Some(config::Secret::new(token)),
                    token: None,
                }))
            }
            _ => Err(Denied::Invalid("unknown token".into())),
        }
    }

    /// Compares the token's digest with every client's: constant time per comparison,
    /// and all of them, whatever matches.
    fn static_token(&self, token: &str) -> Option<Arc<Identity>> {
        if self.tokens.is_empty() {
            return None;
        }
        let presented = TokenDigest::of(token);
        let mut found = 0u64;
        for (i, (digest, _)) in self.tokens.iter().enumerate() {
            let hit = digest.0.ct_eq(&presented.0);
            found.conditional_assign(&(i as u64 + 1), hit);
        }
        let index = usize::try_from(found).ok()?.checked_sub(1)?;
        self.tokens.get(index).map(|(_, id)| id.clone())
    }

    /// The `WWW-Authenticate` value for a refusal: the realm, with OAuth the metadata
    /// URL (RFC 9728), and `error="invalid_token"` when a token was sent but refused.
    pub fn challenge(&self, denied: &Denied, resource: &str) -> String {
        let mut out = format!("Bearer realm=\"{REALM}\"");
        if self.oauth.is_some() {
            out.push_str(&format!(", resource_metadata=\"{}\"", metadata_url(resource)));
        }
        if matches!(denied, Denied::Invalid(_)) {
            out.push_str(", error=\"invalid_token\"");
        }
        out
    }

    /// The protected-resource metadata document (RFC 9728) for `resource`.
    pub fn metadata(&self, resource: &str) -> Option<Value> {
        let o = self.oauth()?;
        Some(serde_json::json!({
            "resource": resource,
            "authorization_servers": [o.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "mcp-gateway",
        }))
    }

    /// Fetches the JWKS now (at startup), so the first token does not wait for it.
    pub async fn prefetch(&self) {
        if let Some(jwt) = &self.oauth {
            jwt.refresh(false).await;
        }
    }
}

/// What follows the name in an `[auth.oauth]` identity's principal: this, then the
/// first 16 hex digits of [`issuer_digest`].
const OAUTH_BINDING: &str = "\0oauth:";
/// The length of that suffix: the binding and its 16 hex digits.
const BINDING_LEN: usize = OAUTH_BINDING.len() + 16;

/// The SHA-256 (hex) of an issuer and claim, each length-prefixed: no two different
/// pairs are one input.
fn issuer_digest(issuer: &str, client_claim: &str) -> String {
    let mut input = Vec::new();
    for part in [issuer, client_claim] {
        input.extend_from_slice(&(part.len() as u64).to_be_bytes());
        input.extend_from_slice(part.as_bytes());
    }
    crate::cluster::hex(ring::digest::digest(&ring::digest::SHA256, &input).as_ref())
}

/// The principal of the `[auth.oauth]` identity named `name` by claim `client_claim` of a
/// JWT from `issuer`: `name`, then `\0oauth:`, then 16 hex digits of [`issuer_digest`].
///
/// Why two different (issuer, claim, name) never give one principal, nor a static
/// client's: the suffix has a fixed length, so a principal splits one way only, into its
/// name (all before the last [`BINDING_LEN`] bytes, whatever it holds, NULs included)
/// and its digest; equal principals thus have equal names and equal digests, and equal
/// digests of different (issuer, claim) pairs would be a collision of SHA-256 cut to 64
/// bits, which nobody can aim at: the pairs are the operator's, not the caller's. A
/// `[clients.NAME]` name holds no control character (the config refuses one), so no
/// static client's principal, its bare name, holds the NUL every OAuth one does.
pub fn oauth_principal(name: &str, issuer: &str, client_claim: &str) -> String {
    format!("{name}{OAUTH_BINDING}{}", &issuer_digest(issuer, client_claim)[..16])
}

/// A principal's name and, for an `[auth.oauth]` one, its issuer's 16 hex digits.
pub fn principal_parts(principal: &str) -> (&str, Option<&str>) {
    let Some(at) = principal.len().checked_sub(BINDING_LEN) else {
        return (principal, None);
    };
    match (principal.get(..at), principal.get(at..)) {
        (Some(name), Some(suffix)) => match suffix.strip_prefix(OAUTH_BINDING) {
            Some(digest) if digest.bytes().all(|b| b.is_ascii_hexdigit()) => (name, Some(digest)),
            _ => (principal, None),
        },
        _ => (principal, None),
    }
}

/// Whether `principal` belongs to the client named `name`: its bare name (a static
/// client, or what an earlier version kept an OAuth identity's under), or that name bound
/// to any issuer. What an operator's revoke of a name takes away.
pub fn principal_of_name(principal: &str, name: &str) -> bool {
    principal_parts(principal).0 == name
}

/// A principal as logs show it: its name, and for an `[auth.oauth]` one `@oauth:` and
/// its issuer's digest (never the NUL inside).
#[derive(Clone, Copy)]
pub struct Shown<'a>(pub &'a str);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match principal_parts(self.0) {
            (name, Some(digest)) => write!(f, "{name}@oauth:{digest}"),
            (name, None) => f.write_str(name),
        }
    }
}

/// The public URL of the MCP endpoint: `[auth.oauth] resource`, else `http://HOST{path}`.
pub fn resource_url(oauth: Option<&OAuth>, host: Option<&str>, path: &str) -> String {
    if let Some(r) = oauth.and_then(|o| o.resource.as_ref()) {
        return r.clone();
    }
    format!("http://{}{path}", host.unwrap_or("localhost"))
}

/// `scheme://authority` of `resource` + [`METADATA_PATH`].
pub fn metadata_url(resource: &str) -> String {
    let origin = match resource.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
            format!("{scheme}://{authority}")
        }
        None => resource.trim_end_matches('/').to_owned(),
    };
    format!("{origin}{METADATA_PATH}")
}

/// The token of `Bearer <token>` (scheme case-insensitive, RFC 7235).
fn bearer(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Lists, Source};
    use crate::config::{ClientSpec, Filter};
    use indexmap::IndexMap;
    use serde_json::json;
    use serde_json::value::RawValue;
    use serde_json::Map;

    fn spec(name: &str, token: Option<&str>, allow: &[&str], deny: &[&str]) -> ClientSpec {
        ClientSpec {
            name: name.into(),
            token: token.map(TokenDigest::of),
            filter: Filter {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
            },
            rate_limit: None,
            admin: false,
            secrets: Vec::new(),
        }
    }

    fn auth(clients: Vec<ClientSpec>) -> Authenticator {
        Authenticator::new(&config::Auth { clients, oauth: None })
    }

    #[tokio::test]
    async fn static_tokens() {
        let a = auth(vec![
            spec("alice", Some("tok-a"), &[], &[]),
            spec("bob", Some("tok-b"), &["x*"], &[]),
            spec("carol", None, &[], &[]),
        ]);
        assert!(a.required());
        let who = |h: &str| {
            let h = h.as_bytes().to_vec();
            let a = &a;
            async move { a.authenticate(Some(&h)).await.map(|i| i.name.clone()) }
        };
        assert_eq!(who("Bearer tok-a").await.unwrap(), "alice");
        assert_eq!(who("bearer   tok-b ").await.unwrap(), "bob");
        assert_eq!(a.authenticate(None).await.unwrap_err(), Denied::Missing);
        for bad in ["Bearer tok-c", "Bearer ", "Basic dG9rLWE=", "tok-a", "Bearer tok-a2"] {
            let e = who(bad).await.unwrap_err();
            assert!(matches!(&e, Denied::Invalid(_)), "{bad}");
            assert!(!e.to_string().contains("tok-"), "{e}");
        }
        assert!(!format!("{a:?}").contains("tok-"));
        assert!(a.client("carol").is_some() && a.client("dave").is_none());
        assert_eq!(
            a.challenge(&Denied::Missing, "http://h/mcp"),
            "Bearer realm=\"mcp-gateway\""
        );
        assert!(!auth(vec![]).required());
    }

    #[test]
    fn urls() {
        assert_eq!(
            metadata_url("https://gw.example:8443/team/mcp"),
            "https://gw.example:8443/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            resource_url(None, Some("127.0.0.1:9"), "/mcp"),
            "http://127.0.0.1:9/mcp"
        );
    }

    fn tool(name: &str) -> Map<String, Value> {
        json!({"name": name, "inputSchema": {"type": "object"}})
            .as_object()
            .cloned()
            .unwrap()
    }

    #[test]
    fn views_filter_and_are_cached_per_catalog() {
        let lists = Lists {
            tools: vec![tool("add"), tool("delete"), tool("search")],
            prompts: vec![tool("greet")],
            resources: vec![json!({"uri": "docs://a", "name": "a"}).as_object().cloned().unwrap()],
            templates: vec![json!({"uriTemplate": "mem://{k}", "name": "m"})
                .as_object()
                .cloned()
                .unwrap()],
            ..Lists::default()
        };
        let all = Filter::default();
        let sources = [Source {
            server: "calc",
            prefix: "calc",
            lists: &lists,
            filter: &all,
            overrides: &IndexMap::new(),
            instructions: None,
        }];
        let catalog = Arc::new(Catalog::build("__", &sources));
        let a = auth(vec![
            spec("alice", None, &["calc__*", "docs://*"], &["calc__delete"]),
            spec("open", None, &[], &[]),
        ]);
        let alice = a.client("alice").unwrap();
        let v = alice.views(&catalog, None).unwrap();
        let names = |raw: &RawValue, key: &str, field: &str| -> Vec<String> {
            let v: Value = serde_json::from_str(raw.get()).unwrap();
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i[field].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names(&v.tools, "tools", "name"), ["calc__add", "calc__search"]);
        assert_eq!(names(&v.prompts, "prompts", "name"), ["calc__greet"]);
        assert_eq!(names(&v.resources, "resources", "uri"), ["docs://a"]);
        assert!(names(&v.templates, "resourceTemplates", "uriTemplate").is_empty());
        assert!(v.tools.get().contains("inputSchema"));
        assert!(Arc::ptr_eq(&v, &alice.views(&catalog, None).unwrap()));
        let rebuilt = Arc::new(Catalog::build("__", &sources));
        assert!(!Arc::ptr_eq(&v, &alice.views(&rebuilt, None).unwrap()));
        assert!(alice.permits("calc__add") && !alice.permits("calc__delete") && !alice.permits("mem://x"));
        // In a view: the intersection of the view and the allowlist, kept per view.
        let only_search = Filter {
            allow: vec!["calc__search".into(), "calc__delete".into()],
            deny: vec![],
        };
        let view = Arc::new(View::build(
            crate::catalog::view::ViewKey::Profile("p".into()),
            vec![true],
            only_search,
            false,
            &catalog,
        ));
        let in_view = alice.views(&catalog, Some(&view)).unwrap();
        assert_eq!(names(&in_view.tools, "tools", "name"), ["calc__search"]);
        assert_eq!(names(&in_view.prompts, "prompts", "name"), ["calc__greet"]);
        assert!(Arc::ptr_eq(&in_view, &alice.views(&catalog, Some(&view)).unwrap()));
        assert!(Arc::ptr_eq(&v, &alice.views(&catalog, None).unwrap()), "both kept");
        assert!(a.client("open").unwrap().views(&catalog, None).is_none());
    }

    #[test]
    fn principals_bind_oauth_names_to_their_issuer_and_claim() {
        let a = oauth_principal("alice", "https://a.example", "sub");
        assert_eq!(a.len(), "alice".len() + BINDING_LEN);
        assert!(a.starts_with("alice\0oauth:"));
        assert_ne!(
            a,
            oauth_principal("alice", "https://b.example", "sub"),
            "another issuer"
        );
        assert_ne!(
            a,
            oauth_principal("alice", "https://a.example", "email"),
            "another claim"
        );
        assert_ne!(a, oauth_principal("bob", "https://a.example", "sub"), "another name");
        assert_ne!(a, "alice", "never a static client's name");
        // The parts are length-prefixed: moving a character between them is another pair.
        assert_ne!(issuer_digest("ab", "c"), issuer_digest("a", "bc"));
        assert_eq!(principal_parts(&a), ("alice", Some(&a[a.len() - 16..])));
        assert_eq!(principal_parts("alice"), ("alice", None));
        assert_eq!(principal_parts("\0registration"), ("\0registration", None));
        // A name that holds a binding of its own still splits one way: the last one.
        let tricky = oauth_principal(&a, "https://b.example", "sub");
        assert_eq!(principal_parts(&tricky).0, a);
        assert!(principal_of_name(&a, "alice") && principal_of_name("alice", "alice"));
        assert!(!principal_of_name(&a, "alic") && !principal_of_name("alicex", "alice"));
        let shown = Shown(&a).to_string();
        assert!(shown.starts_with("alice@oauth:") && !shown.contains('\0'), "{shown}");
        assert_eq!(Shown("ops").to_string(), "ops");
    }

    #[tokio::test]
    async fn a_reread_identity_keeps_the_principal_it_was_given() {
        let a = auth(vec![spec("alice", None, &[], &[])]);
        let bound = Identity {
            name: "alice".into(),
            principal: oauth_principal("alice", "https://old.example", "sub"),
            policy: None,
            bearer: Some(config::Secret::new("eyJ.a.b")),
            token: None,
        };
        // Without [auth.oauth] now, a JWT identity is gone.
        assert!(a.reread(&bound).is_none());
        let with_oauth = Authenticator::new(&config::Auth {
            clients: vec![spec("alice", None, &[], &[])],
            oauth: Some(OAuth {
                issuer: "https://new.example".into(),
                audience: "gw".into(),
                jwks_url: "https://new.example/jwks".into(),
                client_claim: "sub".into(),
                resource: None,
            }),
        });
        let now = with_oauth.reread(&bound).unwrap();
        assert_eq!(now.principal, bound.principal, "the old issuer's, not the new one's");
        assert!(now.policy.is_some(), "the table of its name");
        let static_alice = a.client("alice").unwrap();
        assert_eq!(static_alice.principal, "alice");
    }

    #[test]
    fn client_rate_limit() {
        let mut s = spec("alice", None, &[], &[]);
        s.rate_limit = Rate::parse("2/m");
        let a = auth(vec![s]);
        let alice = a.client("alice").unwrap();
        assert!(alice.check_rate().is_ok() && alice.check_rate().is_ok());
        let l = alice.check_rate().unwrap_err();
        assert_eq!(l.what, "client 'alice' limit 2/m");
    }
}
