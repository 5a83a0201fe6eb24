//! What a reload or a catalog change replaces as one: the [`Topology`]; and the events
//! servers report (lists changed, restarted, notifications for sessions).

use super::Gateway;
use crate::auth::Authenticator;
use crate::catalog::view::{Announcement, Reach, Results, View, ViewKey, Views};
use crate::catalog::{Catalog, Source};
use crate::config::{Config, Isolation};
use crate::limit::Limits;
use crate::message;
use crate::supervisor::{Event, ListKind, Server};
use bytes::Bytes;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// Everything a reload may replace, swapped as one. Catalog routes index `servers`.
pub struct Topology {
    /// Some server runs a process per session (so calls carry their session).
    pub isolated: bool,
    pub config: Arc<Config>,
    pub servers: Vec<Arc<Server>>,
    pub catalog: Arc<Catalog>,
    pub limits: Arc<Limits>,
    /// `[clients.*]` and `[auth.oauth]`: tokens to identities, identities to policies.
    pub auth: Arc<Authenticator>,
    /// The profiles' and tag queries' views of `catalog`.
    pub views: Arc<Views>,
}

impl Topology {
    /// The topology before any server has started: an empty catalog.
    pub(super) fn first(config: Config) -> Topology {
        let servers: Vec<Arc<Server>> = config
            .servers
            .iter()
            .cloned()
            .map(|s| Arc::new(Server::new(s)))
            .collect();
        Topology {
            isolated: any_isolated(&servers),
            limits: Arc::new(limits_for(&config)),
            auth: Arc::new(Authenticator::new(&config.auth)),
            views: Arc::new(Views::build(
                &config.profiles,
                &config.servers,
                &Catalog::default(),
                &[],
            )),
            config: Arc::new(config),
            servers,
            catalog: Arc::new(Catalog::default()),
        }
    }

    /// The view `key` names, now (a hash lookup for a profile).
    pub fn view(&self, key: &ViewKey) -> Arc<View> {
        self.views.get(key, &self.config.servers, &self.catalog)
    }

    /// The index of the server named `name`.
    pub(super) fn server_index(&self, name: &str) -> Option<usize> {
        self.servers.iter().position(|s| &*s.name == name)
    }
}

impl Gateway {
    /// Applies a new config: servers that are new or whose entry changed are started
    /// (and the old ones of changed entries stopped); removed ones are stopped; unchanged
    /// ones, and calls in flight to them, are untouched. Clients get list_changed when
    /// the merged lists change. The listen address and path need a restart.
    pub async fn reload(self: &Arc<Gateway>, config: Config) {
        let _one = self.reloading.lock().await;
        let old = self.topology();
        if config.gateway.listen != old.config.gateway.listen || config.gateway.path != old.config.gateway.path {
            warn!("gateway.listen and gateway.path changes take effect after a restart");
        }
        if config.gateway.worker_threads != old.config.gateway.worker_threads {
            warn!("gateway.worker_threads changes take effect after a restart");
        }
        if config.gateway.busy_poll != old.config.gateway.busy_poll {
            warn!("gateway.busy_poll changes take effect after a restart");
        }
        let mut servers = Vec::with_capacity(config.servers.len());
        let mut added = Vec::new();
        for cfg in &config.servers {
            match old.servers.iter().find(|s| s.same_process(cfg)) {
                Some(same) => {
                    // Same process: keep it (and its calls in flight); new prefix, timeout
                    // and tool filter apply from the swap on. Rate limits live in the topology.
                    same.retune(cfg);
                    servers.push(same.clone());
                }
                None => {
                    let s = Arc::new(Server::new(cfg.clone()));
                    added.push(s.clone());
                    servers.push(s);
                }
            }
        }
        let gone: Vec<_> = old
            .servers
            .iter()
            .filter(|s| !servers.iter().any(|n| Arc::ptr_eq(n, s)))
            .cloned()
            .collect();
        info!(
            kept = servers.len() - added.len(),
            started = added.len(),
            stopped = gone.len(),
            "reloading gateway.toml"
        );
        self.start_servers(&added).await;
        crate::console::events().push("reload", None, reload_summary(&old, &config, &added, &gone));
        let limits = if same_limits(&old.config, &config) {
            old.limits.clone()
        } else {
            Arc::new(limits_for(&config))
        };
        // Unchanged auth keeps its JWKS cache and the clients' rate budgets.
        let auth = if old.config.auth == config.auth {
            old.auth.clone()
        } else {
            info!("[clients] or [auth.oauth] changed");
            Arc::new(Authenticator::new(&config.auth))
        };
        let (before, after) = {
            // The catalog routes by position in `servers`: both change in one swap.
            let mut topo = crate::sync::write(&self.topo);
            let catalog = Arc::new(build_catalog(&config, &servers));
            let views = Views::build(&config.profiles, &config.servers, &catalog, &topo.views.tag_keys());
            let before = topo.clone();
            *topo = Arc::new(Topology {
                isolated: any_isolated(&servers),
                config: Arc::new(config),
                servers,
                catalog,
                limits,
                auth,
                views: Arc::new(views),
            });
            (before, topo.clone())
        };
        self.warm_search();
        self.announce(&before, &after, true, None);
        self.reloads.send_modify(|n| *n += 1);
        // A changed server's new process takes over its sessions' subscriptions and log level.
        for s in added.iter().filter(|s| old.servers.iter().any(|o| o.name == s.name)) {
            self.restore(s.name.clone()).await;
        }
        futures::future::join_all(gone.iter().map(|s| s.stop())).await;
        info!("reload done");
    }

    pub(super) async fn event(&self, ev: Event) {
        match ev {
            Event::ListsChanged { announced } => self.rebuild(true, announced),
            Event::Restarted { server } => self.restore(server).await,
            Event::Notification { server, method, params } if method == "notifications/resources/updated" => {
                self.resource_updated(&server, &method, params.as_deref()).await;
            }
            Event::Notification { server, method, params } if method == "notifications/tasks/status" => {
                self.task_status(&server, &method, params.as_deref()).await;
            }
            Event::Notification { server, method, .. } => {
                debug!(%server, %method, "dropping a server notification no client asked for");
            }
        }
    }

    /// Rebuilds the merged catalog; with `notify`, tells every session which lists changed.
    pub fn rebuild_catalog(&self, notify: bool) {
        self.rebuild(notify, None)
    }

    /// [`Gateway::rebuild_catalog`]; a server's own list_changed (`announced`) is passed on
    /// even when the merged list looks the same (the server may have changed and changed
    /// back: its clients should look again).
    fn rebuild(&self, notify: bool, announced: Option<(Arc<str>, ListKind)>) {
        let (before, after) = {
            // Built under the lock, so a concurrent reload or rebuild cannot be lost.
            let mut topo = crate::sync::write(&self.topo);
            let catalog = Arc::new(build_catalog(&topo.config, &topo.servers));
            let views = Views::build(
                &topo.config.profiles,
                &topo.config.servers,
                &catalog,
                &topo.views.tag_keys(),
            );
            let before = topo.clone();
            *topo = Arc::new(Topology {
                isolated: topo.isolated,
                config: topo.config.clone(),
                servers: topo.servers.clone(),
                catalog,
                limits: topo.limits.clone(),
                auth: topo.auth.clone(),
                views: Arc::new(views),
            });
            (before, topo.clone())
        };
        self.warm_search();
        self.announce(&before, &after, notify, announced);
    }

    /// Logs a new catalog's notes and, with `notify`, tells each session which of the
    /// lists it sees changed: the whole catalog's, or its view's.
    fn announce(&self, old: &Topology, new: &Topology, notify: bool, announced: Option<(Arc<str>, ListKind)>) {
        for note in new.catalog.notes.iter().chain(&new.catalog.problems) {
            warn!("{note}");
        }
        if !notify {
            return;
        }
        let (by, said) = match &announced {
            Some((server, kind)) => (new.server_index(server), Some(*kind)),
            None => (None, None),
        };
        let (old_main, new_main) = (Results::of_catalog(&old.catalog), Results::of_catalog(&new.catalog));
        let new_views = new.views.all();
        for kind in [ListKind::Tools, ListKind::Prompts, ListKind::Resources] {
            let mut reach = Reach {
                main: differs(old_main, new_main, kind) || said == Some(kind),
                ..Reach::default()
            };
            for v in &new_views {
                let before = old.views.kept(&v.key);
                let changed = before.is_none_or(|b| differs(lists(&b.lists), lists(&v.lists), kind))
                    || (said == Some(kind) && by.is_some_and(|i| v.has_server(i)));
                reach.known.insert(v.key.clone());
                if changed {
                    reach.changed.insert(v.key.clone());
                }
            }
            // A profile a reload removed: its sessions see nothing now.
            let gone: Vec<&Arc<View>> = old.views.profiles().filter(|v| !reach.known.contains(&v.key)).collect();
            for gone in gone {
                let empty = View::empty(gone.key.clone());
                reach.known.insert(gone.key.clone());
                if differs(lists(&gone.lists), lists(&empty.lists), kind) {
                    reach.changed.insert(gone.key.clone());
                }
            }
            if reach.main || !reach.changed.is_empty() {
                info!(
                    notification = kind.notification(),
                    whole = reach.main,
                    views = reach.changed.len(),
                    "catalog changed; notifying clients"
                );
                let whom = match (reach.main, reach.changed.len()) {
                    (true, 0) => "the whole catalog's sessions".to_owned(),
                    (true, n) => format!("the whole catalog's sessions and {n} view(s)"),
                    (false, n) => format!("{n} view(s)"),
                };
                // One event per burst of a server's (a server may send thousands).
                let server = announced.as_ref().map(|(s, _)| &**s);
                crate::console::events().burst(
                    "list_changed",
                    &format!("list_changed {} {}", server.unwrap_or(""), kind.notification()),
                    server,
                    format!("{} sent to {whom}", kind.notification()),
                );
                let line = Bytes::from(message::notification(kind.notification(), None));
                let reach = Arc::new(reach);
                self.announce_elsewhere(&line, &reach);
                let _ = self.broadcast.send(Announcement {
                    line,
                    reach: Some(reach),
                });
            }
        }
    }
}

/// What a reload changed, in a sentence for the console's events.
fn reload_summary(old: &Topology, new: &Config, added: &[Arc<Server>], gone: &[Arc<Server>]) -> String {
    let names = |v: &[Arc<Server>]| v.iter().map(|s| s.name.to_string()).collect::<Vec<_>>().join(", ");
    let mut parts = Vec::new();
    let (restarted, started): (Vec<Arc<Server>>, Vec<Arc<Server>>) = added
        .iter()
        .cloned()
        .partition(|s| old.servers.iter().any(|o| o.name == s.name));
    let stopped: Vec<Arc<Server>> = gone
        .iter()
        .filter(|s| !restarted.iter().any(|r| r.name == s.name))
        .cloned()
        .collect();
    if !started.is_empty() {
        parts.push(format!("started {}", names(&started)));
    }
    if !restarted.is_empty() {
        parts.push(format!("restarted {} (changed)", names(&restarted)));
    }
    if !stopped.is_empty() {
        parts.push(format!("stopped {}", names(&stopped)));
    }
    if old.config.auth != new.auth {
        parts.push("[clients] or [auth] changed".to_owned());
    }
    let retuned = new.servers.iter().any(|n| {
        old.config
            .servers
            .iter()
            .any(|o| o.name == n.name && o.rate_limits != n.rate_limits)
    });
    if old.config.rate_limits != new.rate_limits || retuned {
        parts.push("rate limits changed".to_owned());
    }
    let profiles = |c: &Config| c.profiles.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    if profiles(&old.config) != profiles(new) {
        parts.push(format!("profiles now: {}", profiles(new).join(", ")));
    }
    if parts.is_empty() {
        "gateway.toml reloaded: no server changed (settings retuned in place)".to_owned()
    } else {
        format!("gateway.toml reloaded: {}", parts.join("; "))
    }
}

/// A [`Results`]' four lists, as [`Results::of_catalog`] gives a catalog's.
fn lists(r: &Results) -> [&serde_json::value::RawValue; 4] {
    [&r.tools, &r.prompts, &r.resources, &r.templates]
}

/// Whether the list (or lists: resources and templates) of `kind` differ.
fn differs(a: [&serde_json::value::RawValue; 4], b: [&serde_json::value::RawValue; 4], kind: ListKind) -> bool {
    let at = |i: usize| a[i].get() != b[i].get();
    match kind {
        ListKind::Tools => at(0),
        ListKind::Prompts => at(1),
        ListKind::Resources => at(2) || at(3),
    }
}

impl Gateway {
    /// In search mode the index of a new catalog is built at once, so no search waits for
    /// it (and so the first search after a change costs what any other does). With
    /// `search_model`, its vectors are computed by the gateway's model thread; searches
    /// are lexical until they are there.
    fn warm_search(&self) {
        let topo = self.topology();
        let profiles = topo.config.profiles.iter().any(|p| p.search);
        if topo.config.gateway.search || profiles {
            let started = std::time::Instant::now();
            let tools = topo.catalog.search_index().len();
            debug!(
                tools,
                took_us = started.elapsed().as_micros() as u64,
                "tool search index built"
            );
            if let Some(dir) = topo.config.gateway.search_model.clone() {
                let catalog = Arc::downgrade(&topo.catalog);
                self.search_worker
                    .submit(Box::new(move || embed_catalog(&dir, &catalog)));
            }
        }
    }
}

/// Computes the vectors of `catalog`'s tools, unless a newer catalog has replaced it.
fn embed_catalog(dir: &std::path::Path, catalog: &std::sync::Weak<Catalog>) {
    let semantic = match crate::search::semantic::Semantic::shared(dir) {
        Ok(s) => s,
        Err(e) => {
            warn!("tool search model not loaded, searching by words only: {e}");
            return;
        }
    };
    let Some(catalog) = catalog.upgrade() else {
        return;
    };
    let started = std::time::Instant::now();
    let index = catalog.search_index();
    index.attach(&semantic);
    info!(
        tools = index.len(),
        model = %semantic.model.path,
        took_ms = started.elapsed().as_millis() as u64,
        "tool search vectors ready"
    );
}

fn limits_for(config: &Config) -> Limits {
    let per_server: Vec<_> = config
        .servers
        .iter()
        .map(|s| (s.name.clone(), s.rate_limits.clone()))
        .collect();
    Limits::new(&config.rate_limits, &per_server)
}

fn same_limits(a: &Config, b: &Config) -> bool {
    a.rate_limits == b.rate_limits
        && a.servers.len() == b.servers.len()
        && a.servers
            .iter()
            .zip(&b.servers)
            .all(|(x, y)| x.name == y.name && x.rate_limits == y.rate_limits)
}

fn any_isolated(servers: &[Arc<Server>]) -> bool {
    servers.iter().any(|s| s.cfg.isolation == Isolation::Session)
}

/// The merged catalog of `servers` as they are now.
fn build_catalog(config: &Config, servers: &[Arc<Server>]) -> Catalog {
    let states: Vec<_> = servers
        .iter()
        .map(|s| {
            let state = s.state();
            let instructions = state.info.as_ref().and_then(|i| i.instructions.clone());
            (s, s.settings(), state.lists.clone(), instructions)
        })
        .collect();
    let sources: Vec<Source> = states
        .iter()
        .map(|(s, settings, lists, instructions)| Source {
            server: &s.cfg.name,
            prefix: &settings.prefix,
            lists,
            filter: &settings.tools,
            overrides: &settings.overrides,
            instructions: instructions.as_deref(),
        })
        .collect();
    Catalog::build(&config.gateway.separator, &sources)
}
