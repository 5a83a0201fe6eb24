//! Consent: the gateway as each user's OAuth client for a server with `auth.oauth`.
//!
//! A call to such a server goes with the caller's own token, on a connection of its own
//! (one per principal and server, opened with `Authorization: Bearer`), so that no two
//! users ever share a downstream session. Everything of a user's here (its stored tokens,
//! its connection, its links) is keyed by its principal (`auth::Identity::principal`):
//! an `[auth.oauth]` identity's name bound to the issuer and claim that named it, so a
//! caller of the same name from another issuer (after a change of `[auth.oauth]`) is
//! asked for its own consent and never gets this one's tokens. Without a token, the
//! caller is asked to consent through URL elicitation ([`Need`]): a link to the
//! gateway's own `/oauth/start?link=…`, an opaque random value bound to the principal,
//! the server, the session that was asked and an expiry, usable once. `/oauth/start` redirects to the
//! authorization server with PKCE (S256) and a second random `state`, and sets a cookie
//! that binds the browser to that state; `/oauth/callback` checks both, exchanges the code,
//! stores the tokens sealed ([`super::store`]), tells the session
//! `notifications/elicitation/complete`, and shows "you can close this page". Tokens are
//! refreshed shortly before they expire, and once when the server answers 401, before the
//! user is asked again.
//!
//! The authorization server is found as the MCP authorization spec says: the server's
//! RFC 9728 metadata (the `resource_metadata` of its 401 challenge, else the well-known
//! URL), then the AS's RFC 8414 metadata. Without a configured `client_id` the gateway
//! registers itself (RFC 7591) once per server and keeps the registration in the store.
//!
//! The server's catalog is listed with the token of a user who consented (the first
//! found); until one has, the server offers one tool, `authorize`, whose call asks for
//! consent. There is one `Consent` per process ([`install`], [`get`]).

use super::exchange::Bearer;
use super::store::{now_secs, Store, Tokens};
use crate::auth::{principal_parts, Shown};
use crate::config::{Config, OAuthClient, Secret};
use crate::downstream::Connection;
use crate::error::Error;
use crate::supervisor::Server;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tracing::{debug, info, warn};

/// JSON-RPC code of "URL elicitation required" (2025-11-25).
pub const URL_ELICITATION_REQUIRED: i64 = -32042;
/// How often the catalog connections' users are looked up in the store
/// ([`Consent::follow_revocations`]): a file's metadata, or one Redis HGET each.
const REVOKED_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a consent link, and the flow it starts, may be used.
pub const LINK_LIFETIME: Duration = Duration::from_secs(600);
/// A token is refreshed when it expires within this many seconds.
const REFRESH_MARGIN: u64 = 60;
/// Links and flows pending at most (older ones are dropped first).
const MAX_PENDING: usize = 10_000;
/// Links and flows pending at most for one user and server: one client cannot fill
/// [`MAX_PENDING`] for everybody.
pub const MAX_PENDING_PER_USER: usize = 32;
/// How long a failed refresh is remembered: calls meanwhile use the token as it is
/// (while it lasts) rather than ask the authorization server again.
const REFRESH_BACKOFF: Duration = Duration::from_secs(30);
/// The name of the one tool a server offers while no user has consented.
pub const PLACEHOLDER: &str = "authorize";
/// The cookie binding the browser that opened a link to the callback.
pub const COOKIE: &str = "mcp_gateway_consent";
/// The store's entry (under no principal a caller can have) holding a dynamic registration.
const REGISTRATION: &str = "\u{0}registration";

static CONSENT: OnceLock<Arc<Consent>> = OnceLock::new();

/// (server, principal).
type Key = (String, String);
/// A digest of a server's url and `auth.oauth` ([`settings_of`]).
type Settings = [u8; 32];

/// Sets up the process's consent (once; later calls keep the first).
pub fn install(config: &Config, cluster: Option<redis::aio::ConnectionManager>) -> Arc<Consent> {
    CONSENT.get_or_init(|| Arc::new(Consent::new(config, cluster))).clone()
}

/// The process's consent, once [`install`]ed.
pub fn get() -> Option<&'static Arc<Consent>> {
    CONSENT.get()
}

/// Who tells a session it was asked (and wakes a server): the router, set by `serve`.
pub trait Notify: Send + Sync {
    /// Sends `line` to the session `session` (here or on another replica).
    fn to_session(&self, session: &str, line: bytes::Bytes);
    /// Sends `line` to the session `session` where another replica holds its stream.
    fn to_session_elsewhere(&self, session: &str, line: bytes::Bytes);
    /// The server named `name` in the current topology.
    fn server(&self, name: &str) -> Option<Arc<Server>>;
}

pub struct Consent {
    /// Opened on first use: a gateway without `auth.oauth` servers never touches
    /// `state_dir` (no key file is made).
    store: OnceLock<Result<Store, String>>,
    opening: (Config, Option<redis::aio::ConnectionManager>),
    /// `gateway.public_url`, else `http://` and the listening address (set by `serve`).
    public: Mutex<Option<String>>,
    /// Made on first use: loading the system's root certificates takes milliseconds, which
    /// a gateway without `auth.oauth` servers should not spend at start.
    http: OnceLock<reqwest::Client>,
    /// Single mode: pending links and flows, `kind:id` → (until, owner, JSON); the owner
    /// is the user and server it is for.
    pending: Mutex<HashMap<String, (u64, String, String)>>,
    /// (server, principal) → when refreshing its token last failed.
    refresh_failed: Mutex<HashMap<Key, std::time::Instant>>,
    /// Each server's authorization server and client, found once per configuration of it
    /// (url and auth.oauth, as [`settings_of`] digests them: a reload that changes them
    /// finds them again).
    providers: tokio::sync::Mutex<HashMap<String, (Settings, Arc<Provider>)>>,
    /// (server, principal) → the `Authorization` its connection sends (the connections
    /// themselves are the server's, kept like per-session processes).
    bearers: Mutex<HashMap<Key, Bearer>>,
    /// One refresh at a time per (server, principal).
    refreshing: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
    notify: OnceLock<Weak<dyn Notify>>,
    /// Set by `serve`: this process serves `/oauth/*`.
    serving: std::sync::atomic::AtomicBool,
    /// server → the user whose token its catalog connection was opened with.
    listing: Mutex<HashMap<String, String>>,
    /// (server, principal) of the OAuth callers told that tokens under their bare name are
    /// not theirs ([`Consent::say_if_kept_by_name`]).
    told: Mutex<std::collections::HashSet<Key>>,
}

/// A consent link handed to a session, not opened yet.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Link {
    /// Whose it is: a principal (an earlier version's links hold a name, the same thing
    /// for a `[clients.NAME]` client).
    #[serde(rename = "identity")]
    principal: String,
    server: String,
    elicitation_id: String,
    /// The session that was asked (for `notifications/elicitation/complete`).
    session: Option<String>,
    /// Unix seconds (replicas agree on the clock, roughly).
    expires: u64,
}

/// A flow begun at `/oauth/start`, waiting for its callback.
#[derive(serde::Serialize, serde::Deserialize)]
struct Flow {
    link: Link,
    verifier: String,
    /// The cookie's value set on the browser that began it.
    browser: String,
    redirect_uri: String,
}

/// What a call needs before it can go to the server.
pub struct Need {
    pub server: String,
    pub url: String,
    pub elicitation_id: String,
    pub message: String,
}

impl Need {
    /// The -32042 error of 2025-11-25: `data.elicitations` holds the one URL elicitation.
    pub fn error(&self) -> Error {
        Error::client(URL_ELICITATION_REQUIRED, "URL elicitation required").with_data(json!({
            "server": self.server,
            "elicitations": [{
                "mode": "url",
                "elicitationId": self.elicitation_id,
                "url": self.url,
                "message": self.message,
            }],
        }))
    }

    /// For a client that cannot take URL elicitation: a tool error carrying the link.
    pub fn tool_result(&self) -> Value {
        json!({
            "content": [{ "type": "text", "text": format!("{} Open this link to continue, then call the tool again: {}", self.message, self.url) }],
            "isError": true,
        })
    }
}

/// One server's authorization server, as discovered, and the gateway's client there.
struct Provider {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    revocation_endpoint: Option<String>,
    /// RFC 8707 `resource`: the server's own identifier.
    resource: String,
    client_id: String,
    client_secret: Option<Secret>,
    scopes: Vec<String>,
    redirect_uri: String,
}

/// A dynamic registration as kept in the store.
#[derive(serde::Serialize, serde::Deserialize)]
struct Registration {
    issuer: String,
    redirect_uri: String,
    client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
}

/// What `/oauth/start` answers.
pub enum Started {
    /// 302 to this URL, setting [`COOKIE`] to the second value.
    Redirect {
        location: String,
        cookie: String,
    },
    Refused {
        status: u16,
        why: String,
    },
}

fn random_token() -> String {
    let mut b = [0u8; 32];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    base64url(&b)
}

fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len() * 4 / 3 + 2);
    for chunk in bytes.chunks(3) {
        let n = match chunk.len() {
            3 => u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]),
            2 => u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8,
            _ => u32::from(chunk[0]) << 16,
        };
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// RFC 7636 S256: BASE64URL(SHA256(verifier)).
pub fn challenge(verifier: &str) -> String {
    base64url(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref())
}

/// Whether a connection failed because the server refused the token at `initialize`.
fn refused(e: &crate::downstream::DsError) -> bool {
    refused_text(&e.to_string())
}

/// [`refused`], of an error's text.
pub fn refused_text(text: &str) -> bool {
    text.contains("answered HTTP 401") || text.contains("answered HTTP 403")
}

fn unavailable(server: &Server, principal: &str, e: &crate::downstream::DsError) -> Error {
    Error::server(
        &server.name,
        crate::error::code::INTERNAL_ERROR,
        format!("{e} (the connection of {})", principal_parts(principal).0),
    )
}

/// A value a peer chose (an issuer, a resource, an error text), fit for a message, a log
/// line or `/status`: quoted, control characters escaped, at most 80 characters.
pub(crate) fn untrusted(s: &str) -> String {
    let mut out: String = s.chars().take(80).flat_map(char::escape_debug).collect();
    if s.chars().nth(80).is_some() {
        out.push('…');
    }
    format!("\"{out}\"")
}

/// An http(s) URL without userinfo or fragment, or `None`.
fn web_url(s: &str) -> Option<reqwest::Url> {
    let u = reqwest::Url::parse(s).ok()?;
    let ok = matches!(u.scheme(), "https" | "http")
        && u.has_host()
        && u.username().is_empty()
        && u.password().is_none()
        && u.fragment().is_none();
    ok.then_some(u)
}

fn eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// `https://host:port/path` → (`https://host:port`, `/path`), for the well-known URLs.
fn split_origin(url: &reqwest::Url) -> (String, String) {
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/').to_owned();
    (origin, path)
}

/// The server's URL without query or fragment: its RFC 8707 resource by default.
fn canonical(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// A digest of what a server's provider is found from: its url and its `auth.oauth`
/// (the secret included).
fn settings_of(server: &Server) -> Settings {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    if let crate::config::Transport::Http(h) = &server.cfg.transport {
        ctx.update(h.url.expose().as_bytes());
    }
    ctx.update(b"\0");
    if let Some(o) = server.oauth() {
        let parts = [
            o.client_id.as_deref().unwrap_or("-"),
            o.client_secret.as_ref().map_or("-", Secret::expose),
            &o.scopes.join(" "),
            o.authorization_server.as_deref().unwrap_or("-"),
            o.redirect.as_deref().unwrap_or("-"),
        ];
        for p in parts {
            ctx.update(p.as_bytes());
            ctx.update(b"\0");
        }
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The server's URL as its tokens are bound to: origin and path.
fn bound_url(server: &Server) -> Option<String> {
    let crate::config::Transport::Http(h) = &server.cfg.transport else {
        return None;
    };
    let u = reqwest::Url::parse(h.url.expose()).ok()?;
    Some(format!("{}{}", u.origin().ascii_serialization(), u.path()))
}

/// `resource_metadata="…"` of a `WWW-Authenticate: Bearer …` challenge.
fn resource_metadata(challenge: &str) -> Option<String> {
    let i = challenge.find("resource_metadata=")?;
    let rest = &challenge[i + "resource_metadata=".len()..];
    let v = match rest.strip_prefix('"') {
        Some(q) => &q[..q.find('"')?],
        None => rest.split([',', ' ']).next()?,
    };
    Some(v.to_owned())
}

impl Consent {
    fn new(config: &Config, cluster: Option<redis::aio::ConnectionManager>) -> Consent {
        Consent {
            store: OnceLock::new(),
            opening: (config.clone(), cluster),
            public: Mutex::new(config.gateway.public_url.clone()),
            http: OnceLock::new(),
            pending: Mutex::default(),
            refresh_failed: Mutex::default(),
            providers: tokio::sync::Mutex::default(),
            bearers: Mutex::default(),
            refreshing: Mutex::default(),
            notify: OnceLock::new(),
            serving: std::sync::atomic::AtomicBool::new(false),
            listing: Mutex::default(),
            told: Mutex::default(),
        }
    }

    fn http(&self) -> &reqwest::Client {
        self.http.get_or_init(|| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(30))
                .use_rustls_tls()
                .build()
                .unwrap_or_default()
        })
    }

    /// Who to tell when a consent completes.
    /// Who tells sessions (the router), once `serve` set it.
    pub fn notifier(&self) -> Option<Arc<dyn Notify>> {
        self.notify.get().and_then(Weak::upgrade)
    }

    pub fn set_notify(&self, n: Weak<dyn Notify>) {
        let _ = self.notify.set(n);
    }

    /// `serve` listens on `local`: links can be followed (without `gateway.public_url`,
    /// they point there).
    pub fn set_listening(&self, local: SocketAddr) {
        self.serving.store(true, std::sync::atomic::Ordering::Release);
        let mut p = crate::sync::lock(&self.public);
        if p.is_none() {
            *p = Some(format!("http://{local}"));
        }
    }

    /// Whether browsers reach the gateway over https (the cookie is `Secure` then).
    pub fn public_is_https(&self) -> bool {
        crate::sync::lock(&self.public)
            .as_deref()
            .is_some_and(|p| p.starts_with("https://"))
    }

    fn public(&self) -> Result<String, String> {
        if !self.serving.load(std::sync::atomic::Ordering::Acquire) {
            // stdio: nothing here serves /oauth/*, whatever public_url says.
            return Err("a user consents through the HTTP endpoint (`mcp-gateway serve`); this gateway (stdio) can only use tokens stored there".into());
        }
        crate::sync::lock(&self.public)
            .clone()
            .ok_or_else(|| "consent needs the HTTP endpoint (gateway.public_url)".to_owned())
    }

    pub fn store(&self) -> Result<&Store, String> {
        self.store
            .get_or_init(|| {
                let (config, cluster) = &self.opening;
                let store = Store::open(config, cluster.clone());
                if let Err(e) = &store {
                    warn!(error = %e, "the OAuth token store cannot be opened: servers with auth.oauth refuse calls");
                }
                store
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    // ------------------------------------------------------------------ the call path

    /// The connection on which `principal` calls `server`, with its own token; `Err(Ok)`:
    /// consent is needed first; `Err(Err)`: an error naming the server.
    pub async fn connection(
        &self,
        server: &Server,
        principal: Option<&str>,
        session: Option<&str>,
    ) -> Result<Connection, Result<Need, Error>> {
        let name = server.name.to_string();
        let Some(principal) = principal else {
            return Err(Err(Error::invalid_request(format!(
                "server '{name}' acts with each user's own authorization, and this caller is not authenticated: configure [clients.*] or [auth.oauth] so that a user can consent"
            ))));
        };
        let tokens = match self.tokens(server, principal).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                self.say_if_kept_by_name(server, principal).await;
                return Err(self.ask(server, principal, session).await);
            }
            Err(e) => return Err(Err(Error::server(&server.name, crate::error::code::INTERNAL_ERROR, e))),
        };
        let open = |tokens: Tokens| {
            let bearer = self.bearer(&server.name, principal, &tokens.access_token);
            server.user_connection(principal, bearer)
        };
        match open(tokens).await {
            Ok(c) => Ok(c),
            Err(e) if refused(&e) => {
                // Refused at initialize: a refreshed token once, else the user's consent again.
                if !self.refused(server, principal).await {
                    return Err(self.ask(server, principal, session).await);
                }
                let fresh = match self.store() {
                    Ok(store) => store.get(&name, principal).await.ok().flatten(),
                    Err(_) => None,
                };
                let Some(tokens) = fresh else {
                    return Err(self.ask(server, principal, session).await);
                };
                open(tokens).await.map_err(|e| Err(unavailable(server, principal, &e)))
            }
            Err(e) => Err(Err(unavailable(server, principal, &e))),
        }
    }

    /// The `Authorization` value of `principal`'s connection to `server`, set to `token`
    /// (a refreshed token replaces it in the session already open).
    fn bearer(&self, server: &str, principal: &str, token: &str) -> Bearer {
        let mut bearers = crate::sync::lock(&self.bearers);
        let b = bearers
            .entry((server.to_owned(), principal.to_owned()))
            .or_default()
            .clone();
        *crate::sync::write(&b) = super::exchange::bearer_value(token);
        b
    }

    /// The server refused `principal`'s token (401): refresh it now, or forget it. Returns
    /// whether a new token is there to try.
    pub async fn refused(&self, server: &Server, principal: &str) -> bool {
        let key = (server.name.to_string(), principal.to_owned());
        let Ok(store) = self.store() else { return false };
        let Ok(Some(tokens)) = store.get(&server.name, principal).await else {
            return false;
        };
        let lock = self.lock(&key);
        let _held = lock.lock().await;
        if let Ok(Some(now)) = store.get(&server.name, principal).await {
            if now.access_token != tokens.access_token {
                return true; // someone else refreshed it meanwhile
            }
        }
        match self.refresh(server, principal, &tokens).await {
            Ok(Some(_)) => true,
            _ => {
                let _ = store.remove(&server.name, principal).await;
                self.forgotten(server, principal).await;
                false
            }
        }
    }

    /// `principal`'s tokens for `server` are gone (revoked, refused): its connection's
    /// header goes, and a catalog connection opened with its token is opened again with
    /// another user's (or none): a forgotten token is never sent again.
    async fn forgotten(&self, server: &Server, principal: &str) {
        if let Some(b) = crate::sync::lock(&self.bearers).remove(&(server.name.to_string(), principal.to_owned())) {
            *crate::sync::write(&b) = None;
        }
        let listing = {
            let mut l = crate::sync::lock(&self.listing);
            let mine = l.get(server.name.as_ref()).is_some_and(|i| i == principal);
            if mine {
                l.remove(server.name.as_ref());
            }
            mine
        };
        if listing {
            info!(server = %server.name, identity = %Shown(principal), "the catalog connection used this user's token: opening it again");
            server.reconnect().await;
        }
    }

    /// Follows the store for the catalog connections' users: one whose tokens left it from
    /// outside (`mcp-gateway tokens revoke` in another process, or another replica's
    /// DELETE) is forgotten here too, so its connection is opened again with another
    /// user's token at once, not when its token would next be refreshed. A store that
    /// cannot be read is tried again on the next round (no connection is dropped for it).
    pub async fn follow_revocations(self: Arc<Self>) {
        let mut every = tokio::time::interval(REVOKED_CHECK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let listing: Vec<(String, String)> = crate::sync::lock(&self.listing)
                .iter()
                .map(|(s, i)| (s.clone(), i.clone()))
                .collect();
            if listing.is_empty() {
                continue;
            }
            let (Some(n), Ok(store)) = (self.notifier(), self.store()) else {
                continue;
            };
            for (name, principal) in listing {
                if let (Some(server), Ok(None)) = (n.server(&name), store.get(&name, &principal).await) {
                    info!(server = %name, identity = %Shown(&principal), "the user's tokens were revoked outside this process");
                    self.forgotten(&server, &principal).await;
                }
            }
        }
    }

    /// Whether `principal` still has tokens for `server` in the store.
    pub async fn has_tokens(&self, server: &Server, principal: &str) -> bool {
        match self.store() {
            Ok(store) => store.get(&server.name, principal).await.ok().flatten().is_some(),
            Err(_) => false,
        }
    }

    /// The catalog connection of `server` was opened with `principal`'s token.
    pub fn listing_as(&self, server: &str, principal: &str) {
        crate::sync::lock(&self.listing).insert(server.to_owned(), principal.to_owned());
    }

    fn lock(&self, key: &(String, String)) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = crate::sync::lock(&self.refreshing);
        if m.len() > MAX_PENDING {
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry(key.clone()).or_default().clone()
    }

    /// `principal`'s valid tokens for `server`, refreshed first when they are about to expire;
    /// `None`: it has none (or they could not be refreshed).
    async fn tokens(&self, server: &Server, principal: &str) -> Result<Option<Tokens>, String> {
        let store = self.store()?;
        let Some(tokens) = store.get(&server.name, principal).await? else {
            return Ok(None);
        };
        if tokens.resource.is_some() && tokens.resource != bound_url(server) {
            // Got for the server's former url (changed by a reload): never sent to the new
            // one; the user is asked again.
            info!(server = %server.name, identity = %Shown(principal), "the user's tokens were got for the server's former url: asking again");
            return Ok(None);
        }
        if !tokens.expiring(REFRESH_MARGIN) {
            return Ok(Some(tokens));
        }
        let key = (server.name.to_string(), principal.to_owned());
        let lock = self.lock(&key);
        let _held = lock.lock().await;
        // Another call may have refreshed it while this one waited.
        let Some(tokens) = store
            .get(&server.name, principal)
            .await?
            .filter(|t| t.resource.is_none() || t.resource == bound_url(server))
        else {
            return Ok(None);
        };
        if !tokens.expiring(REFRESH_MARGIN) {
            return Ok(Some(tokens));
        }
        let failed = crate::sync::lock(&self.refresh_failed)
            .get(&key)
            .is_some_and(|t| t.elapsed() < REFRESH_BACKOFF);
        if failed && !tokens.expiring(0) {
            // It failed a moment ago: the token as it is while it lasts, not one more try.
            return Ok(Some(tokens));
        }
        let refreshed = self.refresh(server, principal, &tokens).await;
        {
            let mut f = crate::sync::lock(&self.refresh_failed);
            match &refreshed {
                Ok(Some(_)) => {
                    f.remove(&key);
                }
                _ => {
                    if f.len() >= MAX_PENDING {
                        f.retain(|_, t| t.elapsed() < REFRESH_BACKOFF);
                    }
                    f.insert(key.clone(), std::time::Instant::now());
                }
            }
        }
        match refreshed {
            Ok(Some(t)) => Ok(Some(t)),
            Ok(None) | Err(_) if !tokens.expiring(0) => Ok(Some(tokens)),
            _ => {
                store.remove(&server.name, principal).await?;
                self.forgotten(server, principal).await;
                Ok(None)
            }
        }
    }

    /// Uses the refresh token; `Ok(None)`: there is none, or the AS refused it.
    async fn refresh(&self, server: &Server, principal: &str, tokens: &Tokens) -> Result<Option<Tokens>, String> {
        let Some(refresh) = &tokens.refresh_token else {
            return Ok(None);
        };
        let p = self.provider(server).await?;
        let mut form = vec![
            ("grant_type", "refresh_token".to_owned()),
            ("refresh_token", refresh.clone()),
            ("resource", p.resource.clone()),
        ];
        if !p.scopes.is_empty() {
            form.push(("scope", p.scopes.join(" ")));
        }
        match self.token_request(&server.name, &p, form).await {
            Ok(mut t) => {
                if t.refresh_token.is_none() {
                    t.refresh_token = Some(refresh.clone());
                }
                t.resource = bound_url(server);
                self.store()?.put(&server.name, principal, &t).await?;
                info!(server = %server.name, identity = %Shown(principal), "refreshed the user's token");
                Ok(Some(t))
            }
            Err(e) => {
                warn!(server = %server.name, identity = %Shown(principal), error = %e, "refreshing the user's token failed");
                Ok(None)
            }
        }
    }

    /// The users who consented to `server`, in order: whose token its catalog is listed
    /// with (the first whose token the server takes).
    pub async fn catalog_users(&self, server: &Server) -> Vec<String> {
        // Opened again: with whoever comes first now.
        crate::sync::lock(&self.listing).remove(server.name.as_ref());
        let Ok(store) = self.store() else { return Vec::new() };
        let mut ids = super::store::principals(store, &server.name).await.unwrap_or_default();
        ids.retain(|i| i.as_str() != REGISTRATION);
        ids
    }

    /// `principal`'s valid token for `server`, for its catalog connection.
    pub async fn catalog_token(&self, server: &Server, principal: &str) -> Option<String> {
        match self.tokens(server, principal).await {
            Ok(Some(t)) => Some(t.access_token),
            _ => None,
        }
    }

    /// A consent link for `principal` and `server`.
    async fn ask(&self, server: &Server, principal: &str, session: Option<&str>) -> Result<Need, Error> {
        let name = server.name.to_string();
        let public = self.public().map_err(|e| {
            Error::server(
                &server.name,
                crate::error::code::INTERNAL_ERROR,
                format!("server '{name}': {e}"),
            )
        })?;
        // Found now, so that a server whose authorization server cannot be found fails here
        // with its reason rather than at the browser.
        self.provider(server)
            .await
            .map_err(|e| Error::server(&server.name, crate::error::code::INTERNAL_ERROR, e))?;
        let link = random_token();
        let elicitation_id = random_token();
        let record = Link {
            principal: principal.to_owned(),
            server: name.clone(),
            elicitation_id: elicitation_id.clone(),
            session: session.map(str::to_owned),
            expires: now_secs() + LINK_LIFETIME.as_secs(),
        };
        self.keep("link", &link, &record, (&name, principal))
            .await
            .map_err(|e| Error::server(&server.name, crate::error::code::INTERNAL_ERROR, e))?;
        debug!(server = %name, identity = %Shown(principal), "asking the user's consent");
        Ok(Need {
            url: format!("{public}/oauth/start?link={link}"),
            message: format!(
                "Server '{name}' needs your authorization. The link works once, for {} minutes.",
                LINK_LIFETIME.as_secs() / 60
            ),
            server: name,
            elicitation_id,
        })
    }

    // ------------------------------------------------------------------ pending links and flows

    /// Keeps a link or flow for [`LINK_LIFETIME`]: in Redis in cluster mode (any replica
    /// may serve the browser), else here. At most [`MAX_PENDING_PER_USER`] for one
    /// `owner` (server, principal) at a time.
    async fn keep<T: serde::Serialize>(&self, kind: &str, id: &str, v: &T, owner: (&str, &str)) -> Result<(), String> {
        let (server, principal) = owner;
        let too_many = || {
            format!(
                "server '{server}': too many consents of {} are pending ({MAX_PENDING_PER_USER}); use a link given already, or try again in {} minutes",
                untrusted(principal_parts(principal).0),
                LINK_LIFETIME.as_secs() / 60
            )
        };
        let store = self.store()?;
        if store.shared() {
            if store
                .count_pending(&format!("{kind}:{server}\0{principal}"), LINK_LIFETIME)
                .await?
                > MAX_PENDING_PER_USER as u64
            {
                return Err(too_many());
            }
            return store.put_pending(kind, id, v, LINK_LIFETIME).await;
        }
        let text = serde_json::to_string(v).map_err(|e| e.to_string())?;
        let owner = format!("{kind}:{server}\0{principal}");
        let mut m = crate::sync::lock(&self.pending);
        let now = now_secs();
        m.retain(|_, (until, _, _)| *until > now);
        if m.values().filter(|(_, o, _)| *o == owner).count() >= MAX_PENDING_PER_USER {
            return Err(too_many());
        }
        if m.len() >= MAX_PENDING {
            return Err(format!(
                "too many consents are pending ({MAX_PENDING}); try again later"
            ));
        }
        m.insert(format!("{kind}:{id}"), (now + LINK_LIFETIME.as_secs(), owner, text));
        Ok(())
    }

    async fn peek<T: serde::de::DeserializeOwned>(&self, kind: &str, id: &str) -> Result<Option<T>, String> {
        let store = self.store()?;
        if store.shared() {
            return store.get_pending(kind, id).await;
        }
        let m = crate::sync::lock(&self.pending);
        Ok(m.get(&format!("{kind}:{id}"))
            .and_then(|(_, _, t)| serde_json::from_str(t).ok()))
    }

    /// Takes a link or flow out (once: a second take finds nothing).
    async fn take<T: serde::de::DeserializeOwned>(&self, kind: &str, id: &str) -> Result<Option<T>, String> {
        let store = self.store()?;
        if store.shared() {
            return store.take_pending(kind, id).await;
        }
        let mut m = crate::sync::lock(&self.pending);
        Ok(m.remove(&format!("{kind}:{id}"))
            .and_then(|(_, _, t)| serde_json::from_str(&t).ok()))
    }

    // ------------------------------------------------------------------ the browser's side

    /// `/oauth/start?link=…`: `caller` is who the request authenticated as, if it carried
    /// credentials (a browser carries none).
    /// Whom a link was made for (a principal: its name is what a page shows), and for
    /// which server, without using it: the page that asks whoever opened it to prove they
    /// are that client.
    pub async fn describe(&self, link: &str) -> Result<(String, String), (u16, String)> {
        match self.peek::<Link>("link", link).await {
            Ok(Some(l)) if l.expires > now_secs() => Ok((l.principal, l.server)),
            Ok(_) => Err((
                404,
                "this consent link is unknown, was used already, or has expired: call the tool again for a new one"
                    .into(),
            )),
            Err(e) => Err((503, e)),
        }
    }

    /// Uses `link` for `caller` (a principal), who proved to be a client of the gateway:
    /// the link's own, or it is refused (a link forwarded to someone else, or to a caller
    /// of the same name from another issuer, binds nobody's account to it).
    pub async fn start(
        &self,
        link: &str,
        caller: &str,
        servers: &(dyn Fn(&str) -> Option<Arc<Server>> + Sync),
    ) -> Started {
        let refused = |status: u16, why: &str| Started::Refused {
            status,
            why: why.to_owned(),
        };
        let l: Link =
            match self.peek::<Link>("link", link).await {
                Ok(Some(l)) if l.expires > now_secs() => l,
                Ok(_) => return refused(
                    404,
                    "this consent link is unknown, was used already, or has expired: call the tool again for a new one",
                ),
                Err(e) => return refused(503, &e),
            };
        if caller != l.principal {
            // A stolen or forwarded link: it stays usable by the one it was made for.
            warn!(server = %l.server, "a consent link was opened by another client than it was made for");
            return refused(403, "this consent link was made for another client");
        }
        // Single use: whoever takes it out first goes on.
        match self.take::<Link>("link", link).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return refused(
                    404,
                    "this consent link was used already: call the tool again for a new one",
                )
            }
            Err(e) => return refused(503, &e),
        }
        let Some(server) = servers(&l.server) else {
            return refused(404, "the server this link was for is no longer configured");
        };
        let p = match self.provider(&server).await {
            Ok(p) => p,
            Err(e) => return refused(502, &e),
        };
        let state = random_token();
        let verifier = random_token();
        let browser = random_token();
        let mut url = match reqwest::Url::parse(&p.authorization_endpoint) {
            Ok(u) => u,
            Err(_) => return refused(502, "the authorization server's authorization_endpoint is not a URL"),
        };
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &p.client_id)
                .append_pair("redirect_uri", &p.redirect_uri)
                .append_pair("state", &state)
                .append_pair("code_challenge", &challenge(&verifier))
                .append_pair("code_challenge_method", "S256")
                .append_pair("resource", &p.resource);
            if !p.scopes.is_empty() {
                q.append_pair("scope", &p.scopes.join(" "));
            }
        }
        let flow = Flow {
            link: l,
            verifier,
            browser: browser.clone(),
            redirect_uri: p.redirect_uri.clone(),
        };
        let owner = (flow.link.server.clone(), flow.link.principal.clone());
        if let Err(e) = self.keep("flow", &state, &flow, (&owner.0, &owner.1)).await {
            return refused(503, &e);
        }
        Started::Redirect {
            location: url.to_string(),
            cookie: browser,
        }
    }

    /// `/oauth/callback?code=…&state=…`: `Ok(server)` once the tokens are stored.
    pub async fn callback(
        &self,
        query: &HashMap<String, String>,
        cookie: Option<&str>,
        servers: &(dyn Fn(&str) -> Option<Arc<Server>> + Sync),
    ) -> Result<String, (u16, String)> {
        let Some(state) = query.get("state") else {
            return Err((400, "the callback has no state".into()));
        };
        let unknown = || {
            (
                400,
                "this consent is unknown, was completed already, or has expired".to_owned(),
            )
        };
        // The browser is checked before the flow is used up: a request without its cookie
        // (someone who learnt the state) leaves the flow to the browser that began it.
        let flow: Option<Flow> = self.peek("flow", state).await.map_err(|e| (503, e))?;
        let Some(flow) = flow else { return Err(unknown()) };
        if !cookie.is_some_and(|c| eq(c, &flow.browser)) {
            warn!(server = %flow.link.server, "a consent callback came from another browser than the one that began it");
            return Err((403, "this consent was begun in another browser".into()));
        }
        // Single use: taken out whatever happens next.
        let browser = flow.browser;
        let flow: Option<Flow> = self.take("flow", state).await.map_err(|e| (503, e))?;
        let Some(flow) = flow.filter(|f| eq(&f.browser, &browser)) else {
            return Err(unknown());
        };
        if flow.link.expires <= now_secs() {
            return Err((
                400,
                "this consent has expired: call the tool again for a new link".into(),
            ));
        }
        if let Some(e) = query.get("error") {
            let e: String = e
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(64)
                .collect();
            return Err((400, format!("the authorization server refused: {e}")));
        }
        let Some(code) = query.get("code") else {
            return Err((400, "the callback has no code".into()));
        };
        let Some(server) = servers(&flow.link.server) else {
            return Err((404, "the server this consent was for is no longer configured".into()));
        };
        let p = self.provider(&server).await.map_err(|e| (502, e))?;
        if let Some(iss) = query.get("iss") {
            // RFC 9207: the answer must come from the AS the flow went to (mix-up defence).
            if iss.trim_end_matches('/') != p.issuer.trim_end_matches('/') {
                return Err((
                    400,
                    "the callback names another authorization server than the one asked".into(),
                ));
            }
        }
        let form = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.clone()),
            ("redirect_uri", flow.redirect_uri.clone()),
            ("code_verifier", flow.verifier.clone()),
            ("resource", p.resource.clone()),
        ];
        let mut tokens = self.token_request(&server.name, &p, form).await.map_err(|e| (502, e))?;
        tokens.resource = bound_url(&server);
        let l = &flow.link;
        let store = self.store().map_err(|e| (500, e))?;
        store
            .put(&l.server, &l.principal, &tokens)
            .await
            .map_err(|e| (500, e))?;
        info!(server = %l.server, identity = %Shown(&l.principal), "the user consented; tokens stored");
        if let Some(n) = self.notify.get().and_then(Weak::upgrade) {
            if let Some(session) = &l.session {
                let params = crate::message::to_raw(&json!({ "elicitationId": l.elicitation_id }));
                let line = crate::message::notification("notifications/elicitation/complete", Some(&params));
                n.to_session(session, bytes::Bytes::from(line));
            }
            // A server still waiting for a first consent can now list its catalog.
            if let Some(s) = n.server(&l.server) {
                s.wake();
            }
        }
        Ok(l.server.clone())
    }

    /// `DELETE /oauth/tokens/{server}`: forgets the tokens kept under each of `principals`
    /// (and asks the AS to revoke each refresh token, best effort). Whether there were any.
    pub async fn revoke(&self, server: Option<&Server>, name: &str, principals: &[&str]) -> Result<bool, String> {
        let store = self.store()?;
        let mut had = false;
        for principal in principals {
            let old = store.get(name, principal).await.ok().flatten();
            had |= store.remove(name, principal).await?;
            if let Some(s) = server {
                s.end_user(principal).await;
                self.forgotten(s, principal).await;
            }
            crate::sync::lock(&self.bearers).remove(&(name.to_owned(), (*principal).to_owned()));
            if let (Some(server), Some(old)) = (server, old) {
                if let (Ok(p), Some(rt)) = (self.provider(server).await, old.refresh_token) {
                    if let Some(ep) = &p.revocation_endpoint {
                        let form = vec![("token", rt), ("token_type_hint", "refresh_token".to_owned())];
                        let _ = self.post_form(ep, &p, form).await;
                    }
                }
            }
        }
        Ok(had)
    }

    /// An `[auth.oauth]` caller with no tokens of its own for `server`, whose bare name has
    /// some: kept by an earlier version (which kept an OAuth identity's tokens under its
    /// name alone), or a `[clients.NAME]` client's of that name. Either way not this
    /// caller's: said once per (server, principal), at `info`.
    async fn say_if_kept_by_name(&self, server: &Server, principal: &str) {
        let (name, Some(_)) = principal_parts(principal) else {
            return;
        };
        let key = (server.name.to_string(), principal.to_owned());
        if crate::sync::lock(&self.told).contains(&key) {
            return;
        }
        let Ok(store) = self.store() else { return };
        if !matches!(store.get(&server.name, name).await, Ok(Some(_))) {
            return;
        }
        {
            let mut told = crate::sync::lock(&self.told);
            if told.len() >= MAX_PENDING {
                told.clear();
            }
            if !told.insert(key) {
                return;
            }
        }
        info!(
            server = %server.name,
            identity = %Shown(principal),
            "tokens are stored under this caller's bare name (by a version before tokens were bound to the [auth.oauth] issuer, or a [clients.*] client's of this name): not used for it; asking for its own consent"
        );
    }

    // ------------------------------------------------------------------ the AS

    async fn post_form(
        &self,
        url: &str,
        p: &Provider,
        mut form: Vec<(&'static str, String)>,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut req = self
            .http()
            .post(url)
            .header(reqwest::header::ACCEPT, "application/json");
        match &p.client_secret {
            Some(secret) => req = req.basic_auth(&p.client_id, Some(secret.expose())),
            None => form.push(("client_id", p.client_id.clone())),
        }
        req.form(&form).send().await
    }

    /// A token request; the error names the server and the AS's error code, never a token.
    async fn token_request(
        &self,
        server: &str,
        p: &Provider,
        form: Vec<(&'static str, String)>,
    ) -> Result<Tokens, String> {
        let resp = self.post_form(&p.token_endpoint, p, form).await.map_err(|e| {
            format!(
                "server '{server}': the authorization server's token endpoint cannot be reached: {}",
                e.without_url()
            )
        })?;
        let status = resp.status();
        let body: Value = resp.json_value().await;
        if !status.is_success() {
            let code = body.get("error").and_then(Value::as_str).unwrap_or("no error code");
            let code: String = code.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
            return Err(format!(
                "server '{server}': the authorization server refused the token request (HTTP {}): {code}",
                status.as_u16()
            ));
        }
        let Some(access) = body.get("access_token").and_then(Value::as_str) else {
            return Err(format!(
                "server '{server}': the authorization server's answer has no access_token"
            ));
        };
        if super::exchange::bearer_value(access).is_none() {
            // It would go in every request's header: one that cannot is refused here, not
            // stored to fail each call (and the catalog) later.
            return Err(format!(
                "server '{server}': the authorization server's access_token cannot be sent as a header (empty, or control characters): refused"
            ));
        }
        if let Some(t) = body.get("token_type").and_then(Value::as_str) {
            // Sent as `Authorization: Bearer`: a token of another type (DPoP, MAC...) is not one.
            if !t.eq_ignore_ascii_case("bearer") {
                return Err(format!(
                    "server '{server}': the authorization server issued a token of type {}, not Bearer: refused",
                    untrusted(t)
                ));
            }
        }
        let refresh_token = body.get("refresh_token").and_then(Value::as_str).map(str::to_owned);
        // Capped (a peer's 2^64-1 would overflow): ten years is as good as forever.
        let max = crate::config::values::MAX_DURATION.as_secs();
        let expires_at = body
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(|s| now_secs().saturating_add(s.min(max)));
        Ok(Tokens {
            access_token: access.to_owned(),
            refresh_token,
            expires_at,
            resource: None,
        })
    }

    /// `server`'s authorization server and the gateway's client there, found (and, without
    /// a client_id, registered) on first use.
    async fn provider(&self, server: &Server) -> Result<Arc<Provider>, String> {
        let name = server.name.to_string();
        let settings = settings_of(server);
        let mut providers = self.providers.lock().await;
        if let Some((s, p)) = providers.get(&name) {
            if *s == settings {
                return Ok(p.clone());
            }
        }
        let p = Arc::new(
            self.discover(server)
                .await
                .map_err(|e| format!("server '{name}': {e}"))?,
        );
        providers.insert(name, (settings, p.clone()));
        Ok(p)
    }

    async fn discover(&self, server: &Server) -> Result<Provider, String> {
        let (Some(oauth), crate::config::Transport::Http(h)) = (server.oauth(), &server.cfg.transport) else {
            return Err("it has no auth.oauth".into());
        };
        let url = reqwest::Url::parse(h.url.expose()).map_err(|_| "its url is not a URL".to_owned())?;
        let pinned = oauth.authorization_server.is_some();
        if !pinned && oauth.client_secret.is_some() {
            // `check` refuses this too: the secret goes only to an AS named in gateway.toml.
            return Err("auth.oauth.client_secret needs auth.oauth.authorization_server".into());
        }
        let (issuer, resource) = match &oauth.authorization_server {
            Some(i) => (i.clone(), canonical(&url)),
            None => self.resource_metadata(&url).await?,
        };
        let meta = self.as_metadata(&issuer, &url, pinned).await?;
        let issuer_url = web_url(&issuer).ok_or("the authorization server is not an http(s) URL")?;
        // The endpoints the gateway itself sends requests to (and the browser is sent to):
        // an http(s) URL each; for an authorization server the server's metadata named
        // (not gateway.toml), on that authorization server's own origin.
        let endpoint = |k: &str| -> Result<Option<String>, String> {
            let Some(v) = meta.get(k) else { return Ok(None) };
            let u = v
                .as_str()
                .and_then(web_url)
                .ok_or_else(|| format!("the authorization server's metadata has a {k} that is not an http(s) URL"))?;
            if !pinned && u.origin() != issuer_url.origin() {
                return Err(format!(
                    "the authorization server's metadata puts its {k} on another origin ({}) than its issuer's: \
                     refused for an authorization server the server named (set auth.oauth.authorization_server to trust it)",
                    untrusted(&u.origin().ascii_serialization())
                ));
            }
            Ok(Some(u.to_string()))
        };
        let authorization_endpoint = endpoint("authorization_endpoint")?
            .ok_or("the authorization server's metadata has no authorization_endpoint")?;
        let token_endpoint =
            endpoint("token_endpoint")?.ok_or("the authorization server's metadata has no token_endpoint")?;
        let registration_endpoint = endpoint("registration_endpoint")?;
        let revocation_endpoint = endpoint("revocation_endpoint")?;
        let s256 = meta
            .get("code_challenge_methods_supported")
            .and_then(Value::as_array)
            .is_some_and(|m| m.iter().any(|v| v.as_str() == Some("S256")));
        if !s256 {
            return Err(
                "the authorization server does not offer PKCE with S256 (code_challenge_methods_supported)".into(),
            );
        }
        let redirect_uri = match &oauth.redirect {
            Some(r) => r.clone(),
            None => format!("{}/oauth/callback", self.public()?),
        };
        let (client_id, client_secret) = self
            .client(server, oauth, &issuer, &redirect_uri, registration_endpoint)
            .await?;
        Ok(Provider {
            issuer,
            authorization_endpoint,
            token_endpoint,
            revocation_endpoint,
            resource,
            client_id,
            client_secret,
            scopes: oauth.scopes.clone(),
            redirect_uri,
        })
    }

    /// RFC 9728: (authorization server, resource) of the server at `url`. The document
    /// must be about that server: its `resource` is the server's URL (§3.3; for the
    /// origin's own document, `/.well-known/oauth-protected-resource`, the origin), else
    /// it is refused: a token asked for another resource would go to this server.
    async fn resource_metadata(&self, url: &reqwest::Url) -> Result<(String, String), String> {
        let (origin, path) = split_origin(url);
        let want = canonical(url);
        // (document, whether it is the origin's own)
        let mut candidates = Vec::new();
        // The challenge of an unauthenticated request names the document.
        if let Ok(r) = self
            .http()
            .post(url.clone())
            .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#)
            .send()
            .await
        {
            if let Some(m) = r
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .and_then(resource_metadata)
            {
                // Only a document on the server's own origin is believed.
                if reqwest::Url::parse(&m).is_ok_and(|u| u.origin() == url.origin()) {
                    candidates.push((m, false));
                }
            }
        }
        candidates.push((
            format!("{origin}/.well-known/oauth-protected-resource{path}"),
            path.is_empty(),
        ));
        if !path.is_empty() {
            candidates.push((format!("{origin}/.well-known/oauth-protected-resource"), true));
        }
        for (c, root) in candidates {
            let Some(doc) = self.get_json(&c).await else { continue };
            let Some(issuer) = doc
                .get("authorization_servers")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
            else {
                continue;
            };
            let named = doc.get("resource").and_then(Value::as_str).unwrap_or_default();
            let own_origin = |r: &str| root && r == format!("{origin}/");
            let resource = match web_url(named).map(|u| u.to_string()) {
                Some(r) if r == want || own_origin(&r) => r,
                _ => {
                    return Err(format!(
                        "its OAuth protected-resource metadata (RFC 9728) is about another resource ({}) than its url ({}{}): refused (RFC 9728 §3.3)",
                        untrusted(named),
                        origin,
                        url.path()
                    ))
                }
            };
            if web_url(issuer).is_none() {
                return Err(format!(
                    "its OAuth protected-resource metadata (RFC 9728) names an authorization server that is not an http(s) URL ({})",
                    untrusted(issuer)
                ));
            }
            return Ok((issuer.to_owned(), resource));
        }
        Err(
            "its OAuth protected-resource metadata (RFC 9728) cannot be found; set auth.oauth.authorization_server"
                .into(),
        )
    }

    /// RFC 8414 (then OpenID Connect discovery) metadata of `issuer`, whose `issuer` must
    /// match. An authorization server the server's metadata named (not `pinned` in
    /// gateway.toml) must be https when the server is.
    async fn as_metadata(&self, issuer: &str, server: &reqwest::Url, pinned: bool) -> Result<Value, String> {
        let url = web_url(issuer)
            .ok_or_else(|| format!("the authorization server ({}) is not an http(s) URL", untrusted(issuer)))?;
        if !pinned && server.scheme() == "https" && url.scheme() != "https" {
            return Err(format!(
                "its metadata names an authorization server without https ({}): refused",
                untrusted(issuer)
            ));
        }
        let (origin, path) = split_origin(&url);
        for c in [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/')),
        ] {
            let Some(doc) = self.get_json(&c).await else { continue };
            let named = doc.get("issuer").and_then(Value::as_str).unwrap_or_default();
            if named.trim_end_matches('/') != issuer.trim_end_matches('/') {
                return Err(format!(
                    "the authorization server's metadata names another issuer ({}) than {}",
                    untrusted(named),
                    untrusted(issuer)
                ));
            }
            return Ok(doc);
        }
        Err(format!(
            "the metadata of the authorization server {} (RFC 8414) cannot be fetched",
            untrusted(issuer)
        ))
    }

    async fn get_json(&self, url: &str) -> Option<Value> {
        let r = self
            .http()
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        Some(r.json_value().await).filter(Value::is_object)
    }

    /// The configured client, else the one registered before (kept in the store), else a
    /// new registration (RFC 7591).
    async fn client(
        &self,
        server: &Server,
        oauth: &OAuthClient,
        issuer: &str,
        redirect_uri: &str,
        registration_endpoint: Option<String>,
    ) -> Result<(String, Option<Secret>), String> {
        if let Some(id) = &oauth.client_id {
            return Ok((id.clone(), oauth.client_secret.clone()));
        }
        let store = self.store()?;
        if let Some(r) = store.get_as::<Registration>(&server.name, REGISTRATION).await? {
            if r.issuer == issuer && r.redirect_uri == redirect_uri {
                return Ok((r.client_id, r.client_secret.map(Secret::new)));
            }
        }
        let Some(ep) = registration_endpoint else {
            return Err(
                "no auth.oauth.client_id is configured and the authorization server offers no dynamic registration"
                    .into(),
            );
        };
        let body = json!({
            "client_name": "mcp-gateway",
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            "scope": oauth.scopes.join(" "),
        });
        let resp = self
            .http()
            .post(&ep)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("dynamic client registration failed: {}", e.without_url()))?;
        let status = resp.status();
        let doc = resp.json_value().await;
        if !status.is_success() {
            // The AS's own text: printable, cut (as the token endpoint's).
            let code = doc.get("error").and_then(Value::as_str).unwrap_or("no error code");
            let code: String = code.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
            return Err(format!(
                "dynamic client registration was refused (HTTP {}): {code}",
                status.as_u16()
            ));
        }
        let id = doc
            .get("client_id")
            .and_then(Value::as_str)
            .ok_or("the dynamic client registration's answer has no client_id")?;
        let reg = Registration {
            issuer: issuer.to_owned(),
            redirect_uri: redirect_uri.to_owned(),
            client_id: id.to_owned(),
            client_secret: doc.get("client_secret").and_then(Value::as_str).map(str::to_owned),
        };
        store.put_as(&server.name, REGISTRATION, &reg).await?;
        info!(server = %server.name, "registered the gateway with the authorization server");
        Ok((reg.client_id, reg.client_secret.map(Secret::new)))
    }
}

/// A JSON body read whole (bounded by the client's timeout); `null` when it is not JSON.
trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        match self.bytes().await {
            Ok(b) if b.len() <= 1 << 20 => serde_json::from_slice(&b).unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }
}

/// The lists of a server no user has consented to yet: one tool, which asks for consent.
pub fn placeholder_lists(server: &str) -> crate::catalog::Lists {
    let tool = json!({
        "name": PLACEHOLDER,
        "description": format!("Authorize the gateway to use server '{server}' for you (its tools appear once a user has)."),
        "inputSchema": { "type": "object", "properties": {} },
    });
    let mut lists = crate::catalog::Lists::default();
    if let Value::Object(m) = tool {
        lists.tools.push(m);
    }
    lists
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// The value Python's hashlib + base64.urlsafe_b64encode give (unpadded).
    fn s256_is_base64url_of_sha256() {
        assert_eq!(
            challenge("dBjftJeZ4CVP-mJ92K9qLHbwyHbpNMQ2t1ZdA6SN2nA"),
            "xXgv58STzXf4MteKN7DeoGLDDcEsMKQMFKQAHxlABPI"
        );
    }

    #[test]
    fn reads_resource_metadata_from_a_challenge() {
        let c =
            r#"Bearer error="invalid_token", resource_metadata="http://h:1/.well-known/oauth-protected-resource/mcp""#;
        assert_eq!(
            resource_metadata(c).as_deref(),
            Some("http://h:1/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(resource_metadata("Bearer realm=x"), None);
    }
}
