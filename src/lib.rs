//! mcp-gateway: a team's MCP servers behind one endpoint.
//!
//! Where each concern lives, in the order a request travels (one hop each; `src/README.md`
//! explains the two bridges between protocol eras):
//! - **Config**: [`config`] turns gateway.toml into a validated [`config::Config`], one
//!   file per table (`config/gateway.rs`, `servers.rs`, `clients.rs`, `rate_limits.rs`,
//!   `telemetry.rs`, `profiles.rs`); it is the only reader of the environment. `reload` watches the file
//!   (and SIGHUP) and hands each new version to the router.
//! - **Fronts**: `front::http` (Streamable HTTP: POST in `http/post.rs`, sessions in
//!   `http/session.rs`, GET streams in `http/get.rs`, transport checks in `http/checks.rs`,
//!   `/metrics` `/healthz` `/readyz` in `http/status.rs`, the operator's console at `/`
//!   and `/status*` in `http/console.rs` (its page in `http/console/`); resumable SSE in
//!   `front/replay.rs`) and `front::stdio` (the gateway as a stdio server). They only adapt a
//!   transport and render errors (`error::Error`) once each.
//! - **The 2026-07-28 flow**, written once for every front: `stateless` (envelope and
//!   `Mcp-*` headers in `stateless/envelope.rs`, result decoration in `results.rs`,
//!   servers' questions as `input_required` and the parked calls in `rounds.rs`,
//!   `subscriptions/listen` streams in `listen.rs`).
//! - **Who may do what**: `auth` (static tokens, OAuth JWTs in `auth/oauth.rs`, allowlists)
//!   and `limit` (rate limits per IP, client, server and tool).
//! - **A session**: `client` (its requests in flight, capabilities, the questions servers
//!   ask it, its log level).
//! - **Routing**: `router` (`router::Gateway` and its swappable `Topology`): one `match`
//!   on `method::Method`, a file per concern (`router/lists.rs`, `calls.rs`,
//!   `resources.rs` for reads and subscriptions, `tasks.rs`, `logging.rs`, `forward.rs`,
//!   `initialize.rs`, `topology.rs` for reloads and server events).
//! - **Cross-session state**, one owner: `shared` (subscriptions, log levels, tasks, by
//!   session id; async methods, so a second implementation can sit over a shared store).
//! - **The catalog**: `catalog`, the merged tools, prompts and resources; public name ↔
//!   (server, name) by lookup table. `catalog/view.rs`: the views of profiles and `?tags=`
//!   queries (a filter over the catalog with its own cached lists), and whom a
//!   list_changed reaches.
//!   `search` is its tool search index (BM25F, built once
//!   per catalog; `search/text.rs` for words, stems and synonyms, `search/eval.rs` for the
//!   fixture's recall); `router/search.rs` serves search mode's two tools.
//! - **One server's life**: `supervisor` (start, watch, restart, stop), with the handshake
//!   and era probe in `supervisor/handshake.rs`, lists in `lists.rs`, a 2026-07-28 server's
//!   listen stream in `listen.rs`, and the per-session processes in `pool.rs`.
//! - **Connections**: `downstream`, one task owning each: `downstream/pipe.rs` owns a
//!   message stream (`stdio.rs` a child process, `sse.rs` the legacy HTTP+SSE transport),
//!   `http.rs` a Streamable HTTP session, `stateless.rs` the 2026-07-28 envelope toward a
//!   server.
//! - **Messages**: `message` (the JSON-RPC envelope; params and results stay raw JSON), `method`
//!   (the one list of methods and the era rules), `error` (the one error type, whose fault
//!   it is, every code once), `sse` (event-stream parsing).
//! - **Observability**: `metrics` (Prometheus text), `console` (what the console shows:
//!   per-server 15-minute rings, client rows, the events ring) and `telemetry` (the log
//!   subscriber; spans and W3C trace context in `telemetry/spans.rs`).
//! - **Plumbing**: `background` (every spawned task, tracked), `sync` (std locks) and
//!   `runtime` (the async runtime, and its busy poll before a sleep).
//!
//! Layers depend downward only: fronts → stateless → router → supervisor → downstream →
//! telemetry → message/method/error/config. `client` and `shared` sit beside the router,
//! below it; `metrics`, `console`, `sse`, `sync` and `background` are leaves anyone may use.
//!
//! [`serve`], [`stdio`] and [`check`] are the three ways to run it.

pub(crate) mod auth;
pub(crate) mod background;
pub(crate) mod catalog;
pub(crate) mod client;
pub(crate) mod cluster;
pub mod config;
pub(crate) mod console;
pub(crate) mod downstream;
pub(crate) mod error;
pub(crate) mod front;
pub mod import;
pub(crate) mod limit;
pub(crate) mod message;
pub(crate) mod method;
pub(crate) mod metrics;
pub(crate) mod reload;
pub(crate) mod router;
pub mod runtime;
pub(crate) mod search;
pub(crate) mod shared;
pub(crate) mod sse;
pub(crate) mod stateless;
pub(crate) mod supervisor;
pub(crate) mod sync;
pub(crate) mod telemetry;
pub(crate) mod upstream;

pub use telemetry::{init as init_telemetry, Telemetry};

/// Kills every stdio server process still alive, whatever state its pipes and tasks are
/// in (the last resort of a shutdown that overran its grace). Returns how many.
pub fn kill_servers() -> usize {
    downstream::stdio::kill_all()
}

/// What the fuzz target reaches inside the crate; not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::catalog::Template;
    pub use crate::downstream::{encode_request, progress_token, restore_progress, Params};
    pub use crate::message::{
        cancelled_request_id, empty_object, frame_line, notification, params_object, reading, request_with_members,
        response, Id, Incoming, Kind, Members, Outcome, Peeked,
    };
    pub use crate::sse::Parser;
}

/// Tool search and its fixture, for `mcp-gateway-bench --mode search`; not an API.
#[doc(hidden)]
pub mod searching {
    pub use crate::catalog::Catalog;
    pub use crate::search::eval::{recall, Fixture, Query, Recall, Server};
    pub use crate::search::semantic::Semantic;
    pub use crate::search::{Hit, Index, Tool, Tuning, FIELDS, MAX_QUERY};
}

use anyhow::Context;
use config::Config;
use router::Gateway;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// The janitor's period bounds: see [`serve`].
const JANITOR_MIN: Duration = Duration::from_millis(100);
const JANITOR_MAX: Duration = Duration::from_secs(60);

/// Serves the HTTP endpoint until `shutdown` completes (SIGTERM), drains, then stops
/// every server.
///
/// The drain: `/readyz` answers 503 at once while everything is still served for
/// `gateway.drain_delay` (so a load balancer stops sending here before the listener
/// closes), or until the future `shutdown` returned completes (a second signal). Then
/// the listener closes, GET streams end, requests in flight get `shutdown_grace`, and
/// the servers are stopped. With `drain_delay = "0s"` the listener closes at once.
pub async fn serve<H>(
    config: Config,
    listen: Option<SocketAddr>,
    shutdown: impl Future<Output = H> + Send + 'static,
) -> anyhow::Result<()>
where
    H: Future<Output = ()> + Send + 'static,
{
    for line in secret_warnings(&config).lines() {
        warn!("{}", line.trim_start_matches("warning: "));
    }
    let grace = config.gateway.shutdown_grace;
    let drain = config.gateway.drain_delay;
    let addr = listen.unwrap_or(config.gateway.listen);
    let path = config.gateway.path.clone();
    // The port first: a port in use is reported before any server is started.
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let cluster = config.cluster.as_ref().map(cluster::Cluster::start).transpose()?;
    // Each user's OAuth consent (`auth.oauth` servers): before the servers start, whose
    // catalogs may be listed with a stored token.
    let consent = upstream::consent::install(&config, cluster.as_ref().map(|c| c.conn()));
    consent.set_listening(local);
    if config.cluster.is_none()
        && config.servers.iter().any(|s| {
            matches!(
                &s.transport,
                config::Transport::Http(config::HttpSpec {
                    auth: Some(config::UpstreamAuth::OAuth(_)),
                    ..
                })
            )
        })
    {
        upstream::store::warn_if_shared(&config.gateway.state_dir);
    }
    let gw = Gateway::new(config);
    consent.set_notify(Arc::downgrade(&(gw.clone() as Arc<dyn upstream::consent::Notify>)));
    crate::background::spawn(consent.clone().follow_revocations());
    if let Some(c) = cluster {
        gw.join(c);
    }
    // The servers start while the port already answers its probes (/healthz, /readyz);
    // every other request waits for the start to be over (see `front::http::app`).
    crate::background::spawn(started(gw.clone(), format!("http://{local}{path}")));

    let http = front::http::Http::new(gw.clone());
    {
        // Sessions follow each reload: a removed client's end, the others' allowlists apply.
        let http = http.clone();
        let mut reloads = gw.reloads.subscribe();
        crate::background::spawn(async move {
            while reloads.changed().await.is_ok() {
                http.follow_reload();
            }
        });
    }
    let janitor = {
        let http = http.clone();
        // Idle sessions are looked for every session_idle / 2 (at most a minute apart), so
        // one ends between session_idle and 1.5 × session_idle after its last use; the
        // rate limiters' tables are shrunk once a minute.
        let every = (gw.config().gateway.session_idle / 2).clamp(JANITOR_MIN, JANITOR_MAX);
        crate::background::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut shrunk = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                http.expire_idle();
                if shrunk.elapsed() >= JANITOR_MAX {
                    shrunk = tokio::time::Instant::now();
                    http.gateway().topology().limits.shrink();
                }
            }
        })
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (header_timeout, keep_alive) = (
        gw.config().gateway.header_timeout,
        gw.config().gateway.keep_alive_timeout,
    );
    let mut server = Box::pin(front::http::serve(
        listener,
        http.clone(),
        header_timeout,
        keep_alive,
        stop_rx.clone(),
    ));
    let hurry = tokio::select! {
        r = &mut server => {
            r?;
            None
        }
        hurry = shutdown => Some(hurry),
    };
    let mut served = hurry.is_none();
    if let Some(hurry) = hurry {
        if !drain.is_zero() {
            http.drain();
            info!("draining: /readyz is 503 for {drain:?}");
            tokio::select! {
                r = &mut server => {
                    r?;
                    served = true;
                }
                () = tokio::time::sleep(drain) => {}
                () = hurry => info!("a second signal: the drain ends early"),
            }
        }
    }
    let deadline = tokio::time::Instant::now() + grace;
    if !served {
        info!("shutting down");
        let _ = stop_tx.send(true);
        // GET streams never finish by themselves: each ends once its session has no
        // call in flight (at once for most), not after the grace.
        http.close_streams();
        if tokio::time::timeout_at(deadline, &mut server).await.is_err() {
            info!("grace period over; closing open streams");
        }
    }
    drop(stop_rx);
    janitor.abort();
    stop_servers(&gw, deadline).await;
    Ok(())
}

/// Starts the servers, then what follows a start: the line saying the gateway listens,
/// the cluster's catch-up, the config file's watcher, the OAuth issuer's keys.
async fn started(gw: Arc<Gateway>, url: String) {
    gw.start().await;
    // A stable line on stderr that scripts and tests wait for: the servers have made their
    // first attempt, and every request is served.
    eprintln!("mcp-gateway listening on {url}");
    info!(%url, "listening");
    if let Some(cluster) = gw.cluster() {
        // What sessions subscribed to on other replicas, and the level they chose: now,
        // and again each time Redis is back or the bus is listened to again (the notes of
        // subscriptions and levels sent meanwhile are lost).
        let mut recovered = cluster.recovered();
        let gw = gw.clone();
        crate::background::spawn(async move {
            loop {
                gw.catch_up().await;
                match recovered.recv().await {
                    Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }
    reload::spawn(&gw, gw.config().file.clone());
    // With OAuth, have the issuer's keys before the first token arrives.
    let auth = gw.topology().auth.clone();
    crate::background::spawn(async move { auth.prefetch().await });
}

/// Stops every server, and once `deadline` (the end of `shutdown_grace`) has passed
/// kills every child still alive, whatever state its pipes and tasks are in.
async fn stop_servers(gw: &Gateway, deadline: tokio::time::Instant) {
    if tokio::time::timeout_at(deadline, gw.stop()).await.is_err() {
        let n = downstream::stdio::kill_all();
        tracing::warn!(children = n, "shutdown_grace is over: killed the servers still running");
    }
    // What is left ends with the runtime: the event loop, idle pools, streams being drained.
    tracing::debug!(tasks = background::running(), "servers stopped");
}

/// `mcp-gateway tokens revoke`: forgets `client`'s tokens for `server` in the token store
/// (the file, or in cluster mode Redis). A running gateway sees it on its next call.
/// `client` is a name: every principal of that name goes, its bare name (a `[clients.NAME]`
/// client, or an OAuth identity's of an earlier version) and that name bound to any
/// `[auth.oauth]` issuer, past or present (an operator revoking "alice" means every alice).
pub async fn revoke_tokens(config: &Config, client: &str, server: &str) -> anyhow::Result<String> {
    let Some(s) = config.servers.iter().find(|s| s.name == server) else {
        anyhow::bail!("no server is named {server:?} in {}", config.file.display());
    };
    let oauth = matches!(
        &s.transport,
        config::Transport::Http(config::HttpSpec {
            auth: Some(config::UpstreamAuth::OAuth(_)),
            ..
        })
    );
    if !oauth {
        anyhow::bail!("server '{server}' has no auth.oauth: there are no users' tokens for it");
    }
    let store = upstream::store::Store::open(config, None).map_err(|e| anyhow::anyhow!(e))?;
    let mut principals = upstream::store::principals(&store, server)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    principals.retain(|p| auth::principal_of_name(p, client));
    let mut removed = Ok(false);
    for p in &principals {
        match store.remove(server, p).await {
            Ok(had) => removed = removed.map(|any| any || had),
            Err(e) => removed = Err(e),
        }
    }
    match removed {
        Ok(true) => Ok(format!(
            "revoked {client}'s tokens for server '{server}' ({})",
            store.describe()
        )),
        Ok(false) => anyhow::bail!("{client} has no tokens for server '{server}' ({})", store.describe()),
        Err(e) => anyhow::bail!(e),
    }
}

/// Serves MCP over this process's stdin/stdout until stdin ends or `shutdown` completes,
/// as the configured client `client` (see [`stdio_client`]), showing `[profiles.NAME]`
/// `profile` (see [`stdio_profile`]) or, without one, the whole catalog.
pub async fn stdio(
    config: Config,
    client: Option<String>,
    profile: Option<String>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    upstream::consent::install(&config, None);
    let gw = Gateway::new(config);
    gw.start().await;
    reload::spawn(&gw, gw.config().file.clone());
    let grace = gw.config().gateway.shutdown_grace;
    let (stdin, stdout) = (tokio::io::stdin(), tokio::io::stdout());
    let view = profile.map(|p| catalog::view::ViewKey::Profile(p.into()));
    front::stdio::serve(gw.clone(), stdin, stdout, shutdown, grace, client, view).await;
    stop_servers(&gw, tokio::time::Instant::now() + grace).await;
    Ok(())
}

/// Checks `stdio --client NAME` against the config: the name must have a `[clients.NAME]`
/// table, and when any such table exists a name is required (the stdio front end then
/// acts as that client). Without tables (open, or OAuth only) no name means full access.
pub fn stdio_client(config: &Config, name: Option<&str>) -> Result<(), String> {
    match name {
        Some(n) if config.auth.client(n).is_none() => {
            let n = shown_name(n);
            Err(format!("--client {n}: no [clients.{n}] in {}", config.file.display()))
        }
        None if !config.auth.clients.is_empty() => Err(format!(
            "{} has [clients.*] tables: name the client with --client NAME (or MCP_GATEWAY_CLIENT)",
            config.file.display()
        )),
        _ => Ok(()),
    }
}

/// A name given on the command line as an error repeats it: as it is when it could be a
/// table's name, else quoted with its control characters escaped (a newline in it would
/// start a line of its own on stderr), and cut when long.
fn shown_name(n: &str) -> String {
    if !n.is_empty() && n.chars().all(config::name_char) {
        crate::error::echo(n).into_owned()
    } else {
        crate::error::echo(&format!("{n:?}")).into_owned()
    }
}

/// Checks `stdio --profile NAME` against the config: the name must have a
/// `[profiles.NAME]` table.
pub fn stdio_profile(config: &Config, name: Option<&str>) -> Result<(), String> {
    match name {
        Some(n) if config.profile(n).is_none() => {
            let n = shown_name(n);
            let names: Vec<&str> = config.profiles.iter().map(|p| p.name.as_str()).collect();
            Err(format!(
                "--profile {n}: no [profiles.{n}] in {} (profiles: {})",
                config.file.display(),
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ))
        }
        _ => Ok(()),
    }
}

/// `check`'s warnings about `${client:NAME}` references some clients cannot fill (their
/// calls to that server get an error naming the secret). Names only, never values.
fn secret_warnings(config: &Config) -> String {
    let mut out = String::new();
    for s in config.servers.iter().filter(|s| s.enabled) {
        if s.isolation == config::Isolation::Client && !config.auth.required() {
            out.push_str(&format!(
                "warning: servers.{} has isolation = \"client\", but no [clients.*] or [auth.oauth] gives callers an identity: every call to it fails\n",
                s.name
            ));
        }
        let mut seen: Vec<&str> = Vec::new();
        for (key, secret) in s.transport.client_secrets() {
            if seen.contains(&secret) {
                continue;
            }
            seen.push(secret);
            let lacking: Vec<&str> = config
                .auth
                .clients
                .iter()
                .filter(|c| c.secret(secret).is_none())
                .map(|c| c.name.as_str())
                .collect();
            let what = format!("servers.{}.{key} uses ${{client:{secret}}}", s.name);
            let short: Vec<&str> = config
                .auth
                .clients
                .iter()
                .filter(|c| {
                    c.secret(secret)
                        .is_some_and(|v| v.expose().len() < downstream::MASKED_MIN)
                })
                .map(|c| c.name.as_str())
                .collect();
            if !short.is_empty() {
                out.push_str(&format!(
                    "warning: {what}; the secret {secret} of {} is shorter than {} characters, too short to be masked in logs and errors: use a longer one\n",
                    short.join(", "),
                    downstream::MASKED_MIN
                ));
            }
            if lacking.len() == config.auth.clients.len() {
                out.push_str(&format!(
                    "warning: {what}, which no [clients.*] table defines in `secrets`: every call to server {} fails\n",
                    s.name
                ));
            } else if !lacking.is_empty() {
                out.push_str(&format!(
                    "warning: {what}; clients without secret {secret} get an error calling it: {}\n",
                    lacking.join(", ")
                ));
            }
        }
    }
    out
}

/// With `connect`, starts every server and returns the merged catalog as text lines
/// (public name, server, original name) plus collision notes; never shows env values.
pub async fn check(config: Config, connect: bool) -> anyhow::Result<(String, bool)> {
    let mut out = String::new();
    let enabled = config.servers.iter().filter(|s| s.enabled).count();
    out.push_str(&format!(
        "{}: ok ({} servers, {} enabled)\n",
        config.file.display(),
        config.servers.len(),
        enabled
    ));
    if config.auth.required() {
        let names: Vec<&str> = config.auth.clients.iter().map(|c| c.name.as_str()).collect();
        out.push_str(&format!("auth: clients [{}]", names.join(", ")));
        if let Some(o) = &config.auth.oauth {
            out.push_str(&format!("; OAuth tokens from {} for audience {}", o.issuer, o.audience));
        }
        out.push('\n');
    }
    if !config.profiles.is_empty() {
        let base = config.gateway.path.trim_end_matches('/');
        let shown: Vec<String> = config
            .profiles
            .iter()
            .map(|p| format!("{} at {base}/{}", p.name, p.name))
            .collect();
        out.push_str(&format!("profiles: {}\n", shown.join(", ")));
    }
    out.push_str(&secret_warnings(&config));
    // The model is read here as the gateway would read it, so a bad folder fails `check`.
    let mut model_ok = true;
    if let Some(dir) = &config.gateway.search_model {
        match search::semantic::Semantic::shared(dir) {
            Ok(s) => out.push_str(&format!(
                "search model: {} ({} dimensions)\n",
                dir.display(),
                s.model.dim()
            )),
            Err(e) => {
                model_ok = false;
                out.push_str(&format!("search model: ERROR: {e}\n"));
            }
        }
    }
    let overrides: usize = config.servers.iter().map(|s| s.overrides.len()).sum();
    if !connect {
        if overrides > 0 {
            out.push_str(&format!(
                "warning: {overrides} tool overrides are checked against the servers' tools only with --connect\n"
            ));
        }
        return Ok((out, model_ok));
    }
    let mut ok = model_ok;
    if let Some(c) = &config.cluster {
        let line = match cluster::Cluster::start(c) {
            Ok(cluster) => match cluster.ping().await {
                Ok(()) => format!("cluster: Redis at {} answers", cluster::display_url(c.redis.expose())),
                Err(e) => {
                    ok = false;
                    format!(
                        "cluster: DOWN: Redis at {} does not answer: {e}",
                        cluster::display_url(c.redis.expose())
                    )
                }
            },
            Err(e) => {
                ok = false;
                format!("cluster: DOWN: {e}")
            }
        };
        out.push_str(&line);
        out.push('\n');
    }
    let gw: Arc<Gateway> = Gateway::new(config);
    gw.start().await;
    for s in &gw.topology().servers {
        let st = s.state();
        let line = match &st.status {
            supervisor::Status::Ready => format!(
                "server {}: ready ({})",
                s.name,
                st.info.as_ref().map_or("", |i| i.protocol_version.as_str())
            ),
            supervisor::Status::Down(why) => {
                ok = false;
                format!("server {}: DOWN: {why}", s.name)
            }
            other => format!("server {}: {other:?}", s.name),
        };
        out.push_str(&line);
        out.push('\n');
    }
    let catalog = gw.catalog();
    let w = catalog
        .entries
        .iter()
        .map(|e| e.public.len())
        .max()
        .unwrap_or(0)
        .max(11);
    out.push_str(&format!(
        "\n{:<9} {:<w$}  {:<16} {}\n",
        "KIND", "PUBLIC NAME", "SERVER", "ORIGINAL NAME"
    ));
    for e in &catalog.entries {
        out.push_str(&format!(
            "{:<9} {:<w$}  {:<16} {}\n",
            e.kind, e.public, e.server, e.original
        ));
    }
    let topo = gw.topology();
    let profiles: Vec<_> = topo.views.profiles().collect();
    let mut notes: Vec<String> = catalog.notes.clone();
    if !profiles.is_empty() {
        let w = topo.views.names().iter().map(|n| n.len()).max().unwrap_or(0).max(7);
        out.push_str(&format!(
            "\n{:<w$}  {:>5} {:>7} {:>9} {:>9}  SERVERS\n",
            "PROFILE", "TOOLS", "PROMPTS", "RESOURCES", "TEMPLATES"
        ));
        for v in profiles {
            let servers = v.server_names(topo.servers.iter().map(|s| &*s.name));
            let name = v.name();
            let [tools, prompts, resources, templates] = v.counts;
            out.push_str(&format!(
                "{name:<w$}  {tools:>5} {prompts:>7} {resources:>9} {templates:>9}  {}{}\n",
                servers.join(", "),
                if v.search { " (search)" } else { "" }
            ));
            // Its servers have tools and its `tools` globs let none through: a typo, most
            // likely (only `*` and `?` are globs).
            let theirs = catalog
                .entries
                .iter()
                .any(|e| e.kind == "tool" && servers.iter().any(|s| *s == e.server));
            if tools == 0 && theirs {
                notes.push(format!(
                    "profile {name} shows no tools: its servers have some, and its tools.allow/deny let none through (globs are * and ?)"
                ));
            }
        }
    }
    if !notes.is_empty() {
        out.push_str("\nnotes:\n");
        for n in &notes {
            out.push_str(&format!("  {n}\n"));
        }
    }
    if !catalog.problems.is_empty() {
        ok = false;
        out.push_str("\nerrors:\n");
        for p in &catalog.problems {
            out.push_str(&format!("  {p}\n"));
        }
    }
    gw.stop().await;
    Ok((out, ok))
}
