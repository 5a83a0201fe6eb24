//! Connecting to a server: open its transport and learn its era and what it offers,
//! with `initialize` (the handshake era) or the `server/discover` probe (2026-07-28).

use super::{with_stderr, Server};
use crate::config;
use crate::downstream::{self, stateless, Connection, DsError, Incoming, Params};
use crate::message::{self, Outcome};
use crate::method::Method;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// The newest handshake-era revision; offered to every downstream.
pub const DOWNSTREAM_VERSION: &str = "2025-11-25";
/// The longest wait for an answer to the `server/discover` probe (`protocol = "auto"`):
/// a handshake-era server may ignore requests before `initialize`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a server said about itself in the handshake.
#[derive(Debug, Clone, Default)]
pub struct InitInfo {
    pub protocol_version: String,
    /// `None` when the server sent no `capabilities` at all.
    pub capabilities: Option<Map<String, Value>>,
    pub instructions: Option<String>,
    /// Speaks 2026-07-28: every request carries the `_meta` envelope, no session.
    pub stateless: bool,
}

impl InitInfo {
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.as_ref().is_some_and(|c| c.contains_key(capability))
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
enum Handshake {
    #[error("{0}")]
    Call(DsError),
    #[error("{0}")]
    Refused(String),
}

/// Why a server with `auth.oauth` has no catalog connection yet.
pub const NEEDS_CONSENT: &str = "waiting for a user's consent (no user has authorized the gateway for it yet)";

/// `spec` with `Authorization: Bearer {token}` in place of any configured one.
fn with_bearer(spec: &config::HttpSpec, token: &str) -> config::HttpSpec {
    let mut spec = spec.clone();
    spec.headers.retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
    spec.headers.push((
        "Authorization".to_owned(),
        config::Secret::new(format!("Bearer {token}")),
    ));
    spec
}

/// A connected server: its handle, what it said, and the receiver of what it says on
/// its own.
pub(super) type Connected = (Connection, InitInfo, mpsc::Receiver<Incoming>);

impl Server {
    /// Opens the transport and runs the handshake. For `transport = "auto"` a server
    /// that refuses the Streamable HTTP `initialize` with 400, 404 or 405 is tried again
    /// as a legacy HTTP+SSE server, as the spec's backwards-compatibility section says.
    /// `transport` is the server's own, or as filled for one caller (see
    /// [`Server::connection_for`]).
    pub(super) async fn connect(&self, transport: &config::Transport) -> Result<Connected, String> {
        let (tx, rx) = mpsc::channel(64);
        let spec = match transport {
            config::Transport::Stdio(spec) => {
                let probed = !self.skip_probe.load(Ordering::Relaxed);
                let conn = downstream::stdio::spawn(self.name.clone(), spec, tx, self.pipe_watch())
                    .map_err(|e| format!("failed to start: {e}"))?;
                let out = self.handshake_or_close(conn).await.map(|(c, i)| (c, i, rx));
                if out.is_ok() || !probed || !self.skip_probe.load(Ordering::Relaxed) {
                    return out;
                }
                // It exited on the probe: at once again, with initialize alone.
                let (tx, rx) = mpsc::channel(64);
                let conn = downstream::stdio::spawn(self.name.clone(), spec, tx, self.pipe_watch())
                    .map_err(|e| format!("failed to start: {e}"))?;
                return self.handshake_or_close(conn).await.map(|(c, i)| (c, i, rx));
            }
            config::Transport::Http(spec) => spec,
        };
        if self.oauth().is_some() {
            // The catalog of a server that acts for each user is listed with the token of
            // one who consented (see `upstream::consent`); until one has, there is none.
            // A user whose token the server refuses (and cannot be refreshed) is forgotten
            // and the next one is tried: one user's refused token keeps nobody waiting.
            let consent = crate::upstream::consent::get().ok_or_else(|| NEEDS_CONSENT.to_owned())?;
            for identity in consent.catalog_users(self).await {
                for attempt in 0..2 {
                    let Some(token) = consent.catalog_token(self, &identity).await else {
                        break;
                    };
                    match self.connect_http(&with_bearer(spec, &token)).await {
                        Ok(c) => {
                            // Revoked while this connected: not kept (a revoke after this
                            // check finds it listed, and reconnects it).
                            consent.listing_as(&self.name, &identity);
                            if consent.has_tokens(self, &identity).await {
                                return Ok(c);
                            }
                            c.0.shutdown().await;
                            break;
                        }
                        Err(e) if crate::upstream::consent::refused_text(&e) => {
                            info!(server = %self.name, identity = %crate::auth::Shown(&identity), "the server refused this user's token for its catalog");
                            if attempt > 0 || !consent.refused(self, &identity).await {
                                break;
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            return Err(NEEDS_CONSENT.to_owned());
        }
        self.connect_http(spec).await
    }

    async fn connect_http(&self, spec: &config::HttpSpec) -> Result<Connected, String> {
        let (tx, rx) = mpsc::channel(64);
        let timeout = self.settings().timeout;
        if spec.mode != config::HttpMode::Sse {
            let conn = downstream::http::spawn(self.name.clone(), spec, tx)?;
            match self.handshake(&conn).await {
                Ok(info) => return Ok((conn, info, rx)),
                Err(Handshake::Call(DsError::Status {
                    status: 400 | 404 | 405,
                    ..
                })) if spec.mode == config::HttpMode::Auto => {
                    conn.shutdown().await;
                    info!(server = %self.name, "Streamable HTTP refused; trying the legacy HTTP+SSE transport");
                }
                Err(e) => {
                    conn.shutdown().await;
                    return Err(format!("initialize failed: {e}"));
                }
            }
        }
        let (tx, rx) = mpsc::channel(64);
        let conn = downstream::sse::spawn(self.name.clone(), spec, tx)?;
        // HTTP+SSE is a handshake-era transport only: no probe.
        match initialize(&conn, timeout).await {
            Ok(info) => Ok((conn, info, rx)),
            Err(e) => {
                conn.shutdown().await;
                Err(format!("initialize failed: {e}"))
            }
        }
    }

    /// One caller's own Streamable HTTP session (`auth.token_exchange`): every request
    /// carries `bearer`, the caller's exchanged token, and the server binds the session
    /// to that caller.
    pub(super) async fn connect_as(&self, bearer: crate::upstream::exchange::Bearer) -> Result<Connected, String> {
        let config::Transport::Http(spec) = &self.cfg.transport else {
            return Err("auth applies to remote servers only".into());
        };
        if spec.mode == config::HttpMode::Sse {
            return Err("auth needs Streamable HTTP, not transport = \"sse\"".into());
        }
        let (tx, rx) = mpsc::channel(64);
        let conn = downstream::http::spawn_as(self.name.clone(), spec, tx, Some(bearer))?;
        match self.handshake(&conn).await {
            Ok(info) => Ok((conn, info, rx)),
            Err(Handshake::Call(DsError::Status {
                status: status @ (401 | 403),
                ..
            })) => {
                conn.shutdown().await;
                if self.oauth().is_some() {
                    // `upstream::consent` reads "answered HTTP 401" as a refused token: it
                    // refreshes it, or asks the user again.
                    return Err(format!(
                        "server '{}' answered HTTP {status} to this user's token",
                        self.name
                    ));
                }
                Err(format!(
                    "the server refused this caller's exchanged token (HTTP {status}): check auth.token_exchange's audience, resource and scope"
                ))
            }
            Err(e) => {
                conn.shutdown().await;
                Err(format!("initialize failed: {e}"))
            }
        }
    }

    /// When the owner of a child's pipes counts it degraded, and stalled.
    fn pipe_watch(&self) -> downstream::pipe::Watch {
        let timeout = self.settings().timeout;
        downstream::pipe::Watch {
            degraded_after: timeout.min(self.cfg.stall_timeout),
            stall_after: self.cfg.stall_timeout,
        }
    }

    async fn handshake_or_close(&self, conn: Connection) -> Result<(Connection, InitInfo), String> {
        match self.handshake(&conn).await {
            Ok(info) => Ok((conn, info)),
            Err(e) => {
                conn.shutdown().await;
                Err(with_stderr(format!("initialize failed: {e}"), &conn).await)
            }
        }
    }

    /// Learns the server's era and what it offers. `protocol = "auto"` probes with
    /// `server/discover` at 2026-07-28 and falls back to `initialize` on anything but a
    /// discover result naming that version (the spec's rule: no particular error code).
    /// Over stdio the `initialize` is sent right behind the probe, so a handshake-era
    /// server costs no extra round trip; a dual-era server that took the probe refuses it.
    async fn handshake(&self, conn: &Connection) -> Result<InitInfo, Handshake> {
        let timeout = self.settings().timeout;
        match self.cfg.protocol {
            config::Era::Handshake => initialize(conn, timeout).await,
            config::Era::Stateless => match discover(conn, timeout).await? {
                Some(info) => Ok(info),
                None => Err(Handshake::Refused(format!(
                    "server/discover did not name {} (protocol = \"2026-07-28\" in gateway.toml)",
                    stateless::VERSION
                ))),
            },
            config::Era::Auto if self.skip_probe.load(Ordering::Relaxed) => initialize(conn, timeout).await,
            config::Era::Auto if matches!(self.cfg.transport, config::Transport::Stdio(_)) => {
                // A child may take long to start; a handshake-era one that ignores the probe
                // answers the initialize meanwhile, so the probe gets the whole timeout.
                let discover = discover(conn, timeout);
                tokio::pin!(discover);
                // Polled first, so the probe is queued before the initialize.
                let first = futures::poll!(&mut discover);
                let initialize = initialize_call(conn, timeout);
                tokio::pin!(initialize);
                let mut init_out = None;
                let probed = match first {
                    std::task::Poll::Ready(p) => p,
                    std::task::Poll::Pending => loop {
                        tokio::select! {
                            biased;
                            p = &mut discover => break p,
                            i = &mut initialize, if init_out.is_none() => match i? {
                                // Accepted the handshake before answering the probe: a
                                // handshake-era server.
                                ok @ Outcome::Result(_) => return initialized(conn, ok).await,
                                // Refused it (a dual-era server the probe made stateless): wait.
                                refused => init_out = Some(refused),
                            }
                        }
                    },
                };
                match probed {
                    Ok(Some(info)) => Ok(info),
                    Ok(None) | Err(Handshake::Refused(_)) | Err(Handshake::Call(DsError::Timeout { .. })) => {
                        let out = match init_out {
                            Some(o) => o,
                            None => initialize.await?,
                        };
                        initialized(conn, out).await
                    }
                    Err(Handshake::Call(e @ DsError::Exited { .. })) => {
                        // Some handshake-era servers exit on any request before initialize.
                        self.skip_probe.store(true, Ordering::Relaxed);
                        warn!(server = %self.name, "exited on the server/discover probe; starting it again without one");
                        Err(Handshake::Call(e))
                    }
                    Err(e) => Err(e),
                }
            }
            config::Era::Auto => match discover(conn, timeout.min(PROBE_TIMEOUT)).await {
                Ok(Some(info)) => Ok(info),
                Ok(None) | Err(Handshake::Refused(_)) | Err(Handshake::Call(DsError::Timeout { .. })) => {
                    initialize(conn, timeout).await
                }
                // A stateless server refuses a malformed probe with 400; a legacy one may
                // refuse the sessionless POST with 400/404/405 too: try the handshake.
                Err(Handshake::Call(DsError::Status {
                    status: 400 | 404 | 405,
                    ..
                })) => initialize(conn, timeout).await,
                Err(e) => Err(e),
            },
        }
    }
}

/// `server/discover` at 2026-07-28. `Ok(None)`: the answer was not a discover result
/// naming that version (a handshake-era server).
async fn discover(conn: &Connection, timeout: Duration) -> Result<Option<InitInfo>, Handshake> {
    let params = stateless::own_params(Map::new());
    let out = conn
        .call(
            Method::ServerDiscover.as_str(),
            Params::Object { params, progress: None },
            None,
            timeout,
        )
        .await
        .map_err(Handshake::Call)?;
    let Outcome::Result(r) = out else {
        return Ok(None);
    };
    Ok(stateless::discovered(r.get()).map(|d| InitInfo {
        protocol_version: stateless::VERSION.to_owned(),
        capabilities: d.capabilities,
        instructions: d.instructions,
        stateless: true,
    }))
}

async fn initialize(conn: &Connection, timeout: Duration) -> Result<InitInfo, Handshake> {
    let out = initialize_call(conn, timeout).await?;
    initialized(conn, out).await
}

async fn initialize_call(conn: &Connection, timeout: Duration) -> Result<Outcome, Handshake> {
    let params = json!({
        "protocolVersion": DOWNSTREAM_VERSION,
        // Questions a server asks go to the client of the call that caused them; a
        // client that lacks the capability gets the question refused with a reason.
        "capabilities": { "sampling": {}, "elicitation": {}, "roots": { "listChanged": true } },
        "clientInfo": stateless::client_info(),
    });
    conn.call(
        Method::Initialize.as_str(),
        Params::Raw(Some(message::to_raw(&params))),
        None,
        timeout,
    )
    .await
    .map_err(Handshake::Call)
}

/// Reads the `initialize` result and completes the handshake.
async fn initialized(conn: &Connection, out: Outcome) -> Result<InitInfo, Handshake> {
    let result = match out {
        Outcome::Result(r) => r,
        Outcome::Error(e) => {
            return Err(Handshake::Refused(format!(
                "server answered {}",
                crate::console::clipped(&message::error_summary(&e).1, crate::console::PEER_TEXT)
            )))
        }
    };
    let mut r: Map<String, Value> = serde_json::from_str(result.get())
        .map_err(|e| Handshake::Refused(format!("initialize result is not an object: {e}")))?;
    // A version the gateway did not offer and does not speak: it disconnects, as the
    // spec asks of a client.
    let supported = crate::router::initialize::SUPPORTED_VERSIONS;
    if let Some(v) = r
        .get("protocolVersion")
        .filter(|v| !v.as_str().is_some_and(|v| supported.contains(&v)))
    {
        let said = crate::console::clipped(&v.to_string(), 64);
        return Err(Handshake::Refused(format!(
            "server answered protocol version {said}, which mcp-gateway does not speak (it speaks {})",
            supported.join(", ")
        )));
    }
    let info = InitInfo {
        protocol_version: r
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("2024-11-05")
            .to_owned(),
        capabilities: match r.remove("capabilities") {
            Some(Value::Object(c)) => Some(c),
            _ => None,
        },
        instructions: r.get("instructions").and_then(Value::as_str).map(str::to_owned),
        stateless: false,
    };
    conn.notify(Method::Initialized.as_str(), None).await;
    Ok(info)
}
