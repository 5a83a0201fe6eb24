//! Hot reload: gateway.toml is watched, and SIGHUP asks for a reload too. A new
//! version is validated first; an invalid one is logged (file, line, column) and
//! ignored, and the running config stays.

use crate::config::{self, Config};
use crate::router::Gateway;
use notify::{RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

/// Editors write in bursts (truncate, write, rename): wait for quiet before reading.
const SETTLE: Duration = Duration::from_millis(200);

/// Watches `path` and SIGHUP until the gateway is dropped; reloads on each change.
pub fn spawn(gw: &Arc<Gateway>, path: PathBuf) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    // The watcher lives in this task; dropping it stops the watching.
    let watcher = watch_file(&path, tx.clone());
    let hup = tx;
    crate::background::spawn(async move {
        #[cfg(unix)]
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            while s.recv().await.is_some() {
                info!("SIGHUP: reloading");
                let _ = hup.try_send(());
            }
        }
    });
    let gw = Arc::downgrade(gw);
    crate::background::spawn(async move {
        let _watcher = watcher;
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            let Some(gw) = gw.upgrade() else { return };
            reload_from(&gw, &path).await;
        }
    });
}

/// Reads, validates and applies the file once.
pub async fn reload_from(gw: &Arc<Gateway>, path: &Path) {
    match Config::load(path, &config::process_env) {
        Ok(config) => {
            crate::telemetry::reconfigure(&config.telemetry).await;
            gw.reload(config).await
        }
        Err(errors) => {
            for e in &errors.0 {
                error!("invalid config, keeping the running one: {e}");
            }
            // The problems themselves stay in the log: they may quote the file's lines.
            crate::console::events().push(
                "reload",
                None,
                format!(
                    "gateway.toml refused ({} problem(s), see the log); the running config is kept",
                    errors.0.len()
                ),
            );
        }
    }
}

fn watch_file(path: &Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    // Watch the folder: editors often replace the file rather than write into it.
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_owned());
    let handler = move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else { return };
        if ev.kind.is_access() {
            return;
        }
        // Only the config file matters: events for the folder's other files (a log file
        // written there, say) are dropped here, before anything is logged.
        if ev.paths.iter().any(|p| p.file_name() == name.as_deref()) {
            let _ = tx.try_send(());
        }
    };
    let watcher =
        notify::recommended_watcher(handler).and_then(|mut w| w.watch(dir, RecursiveMode::NonRecursive).map(|()| w));
    watcher
        .inspect_err(|e| warn!(error = %e, "cannot watch the config file; SIGHUP still reloads"))
        .ok()
}
