//! The `mcp-gateway` command: `serve` (default), `stdio`, `check`, `import` and `tokens`.

use clap::{Parser, Subcommand};
use mcp_gateway::config::Config;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "mcp-gateway",
    version,
    about = "A team's MCP servers behind one endpoint",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// The config file.
    #[arg(long, global = true, env = "MCP_GATEWAY_CONFIG", default_value = "gateway.toml")]
    config: PathBuf,
    /// `serve`'s flags, for when the command is left out (`serve` is the default).
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(clap::Args, Default)]
struct ServeArgs {
    /// Listen here instead of gateway.listen (port 0 picks a free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve Streamable HTTP on gateway.listen (the default).
    Serve(ServeArgs),
    /// Serve the merged catalog over stdin/stdout (for an mcp.json "command" entry).
    Stdio {
        /// Act as this [clients.NAME]: its allow/deny and rate_limit apply. Required when
        /// gateway.toml has [clients.*] tables.
        #[arg(long, env = "MCP_GATEWAY_CLIENT")]
        client: Option<String>,
        /// Serve [profiles.NAME] (its servers and tools) instead of the whole catalog.
        #[arg(long, env = "MCP_GATEWAY_PROFILE")]
        profile: Option<String>,
    },
    /// Validate the config; with --connect, start every server and print the catalog.
    Check {
        #[arg(long)]
        connect: bool,
    },
    /// Print [servers.*] tables for the servers of client configs (Claude Desktop, Claude
    /// Code, Cursor, VS Code, Windsurf); secrets become ${VAR} references.
    Import {
        /// The client config files (JSON).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Append the tables to this gateway.toml (after checking the result), instead of
        /// printing them.
        #[arg(long)]
        write: Option<PathBuf>,
        /// The client that wrote the files, when their names do not say (what their ${...}
        /// mean): claude-desktop, claude-code, cursor, vscode or windsurf.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(mcp_gateway::import::Format::NAMES))]
        from: Option<String>,
    },
    /// The users' OAuth tokens for servers with auth.oauth (the token store: a file, or
    /// Redis in cluster mode).
    Tokens {
        #[command(subcommand)]
        action: TokensCmd,
    },
}

#[derive(Subcommand)]
enum TokensCmd {
    /// Forget one client's tokens for one server (its next call asks for consent again).
    Revoke {
        /// The client: its [clients.NAME] name, or its OAuth subject.
        #[arg(long)]
        client: String,
        /// The server ([servers.NAME], with auth.oauth).
        #[arg(long)]
        server: String,
    },
}

/// EX_USAGE: the config is invalid.
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Import { files, write, from }) = &cli.command {
        return import(files, write.as_deref(), from.as_deref());
    }
    let config = match Config::load(&cli.config, &mcp_gateway::config::process_env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcp-gateway: invalid config:\n{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Some(Cmd::Stdio { client, profile }) = &cli.command {
        if let Err(e) = mcp_gateway::stdio_client(&config, client.as_deref())
            .and_then(|()| mcp_gateway::stdio_profile(&config, profile.as_deref()))
        {
            eprintln!("mcp-gateway: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    }
    // A CPU quota bills the poll's spinning and throttles the process for it: unless the
    // file asks for a busy poll, there is none.
    let quota = if config.gateway.busy_poll_set || config.gateway.busy_poll.is_zero() {
        None
    } else {
        mcp_gateway::runtime::cpu_quota()
    };
    let budget = if quota.is_some() {
        std::time::Duration::ZERO
    } else {
        config.gateway.busy_poll
    };
    let (runtime, busy_poll) = match runtime(config.gateway.worker_threads, budget) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mcp-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Logging starts once the config is read: [telemetry] decides its format and whether
    // spans are exported. The exporter's batch task lives on the runtime.
    let telemetry = {
        let _rt = runtime.enter();
        mcp_gateway::init_telemetry(&config.telemetry, &log_filter())
    };
    if let Some((cpus, file)) = &quota {
        tracing::info!(
            "gateway.busy_poll is off: this process has a CPU quota of {cpus:.2} CPUs ({}), which the poll would spend; set gateway.busy_poll to poll anyway",
            file.display()
        );
    }
    match busy_poll {
        mcp_gateway::runtime::BusyPoll::NotFound(n) => tracing::warn!(
            "gateway.busy_poll is off: building the runtime opened {n} epoll descriptors, not one, so none is known to poll"
        ),
        state => tracing::debug!(?state, "busy poll"),
    }
    let (grace, drain) = (config.gateway.shutdown_grace, config.gateway.drain_delay);
    let result = runtime.block_on(async move {
        match cli.command.unwrap_or(Cmd::Serve(cli.serve)) {
            Cmd::Serve(ServeArgs { listen }) => mcp_gateway::serve(config, listen, shutdown_signal(drain + grace))
                .await
                .map(|_| true),
            // Nothing balances a stdio client: no drain, and a second signal changes nothing.
            Cmd::Stdio { client, profile } => mcp_gateway::stdio(config, client, profile, async move {
                drop(shutdown_signal(grace).await);
            })
            .await
            .map(|_| true),
            Cmd::Check { connect } => {
                let (text, ok) = mcp_gateway::check(config, connect).await?;
                print!("{text}"); // stdout-ok: check's report is its output
                Ok(ok)
            }
            // Answered before any config is read (see the top of main).
            Cmd::Import { .. } => Ok(true),
            Cmd::Tokens {
                action: TokensCmd::Revoke { client, server },
            } => {
                let text = mcp_gateway::revoke_tokens(&config, &client, &server).await?;
                println!("{text}"); // stdout-ok: the command's report is its output
                Ok(true)
            }
        }
    });
    // Send the spans still queued while the runtime that runs the exporter is alive,
    // and driven: with one worker (the current-thread scheduler) only this thread runs
    // it, so the flush waits on a blocking thread while block_on turns the runtime.
    runtime.block_on(async {
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    });
    // Dropping the runtime would wait for its blocking threads, and the one reading
    // stdin (stdio mode) never returns while the client keeps stdin open: a SIGTERM
    // would then leave the gateway hanging after it stopped every server.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mcp-gateway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The most of a client config `import` reads: Claude Code's `~/.claude.json` keeps every
/// project's state and grows to tens of MB; a file past this is not a client config.
const IMPORT_MAX: u64 = 256 << 20;

/// A client config's text: a regular file (a FIFO would block, a device never end) of at
/// most [`IMPORT_MAX`] bytes.
fn read_client_config(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file (a client config is one)".into());
    }
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(IMPORT_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > IMPORT_MAX {
        return Err(format!("larger than {} MiB: not a client config", IMPORT_MAX >> 20));
    }
    Ok(text)
}

/// `import`: the tables on stdout, or appended to `write` once the whole file is a valid
/// config; what was done on stderr. Never prints a secret value.
fn import(files: &[PathBuf], write: Option<&std::path::Path>, from: Option<&str>) -> ExitCode {
    use mcp_gateway::import::{Format, Source};
    let format = from.and_then(Format::from_name);
    let mut inputs = Vec::new();
    for f in files {
        match read_client_config(f) {
            Ok(text) => inputs.push(Source {
                path: f.clone(),
                text,
                format,
            }),
            Err(e) => {
                eprintln!("mcp-gateway import: {}: {e}", f.display());
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    // The file is locked from before it is read until the tables are appended: two
    // imports at once each see the other's tables, so neither adds a server twice.
    let target = match write.map(Target::open) {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            eprintln!(
                "mcp-gateway import: {}: {e}",
                write.map_or(String::new(), |p| p.display().to_string())
            );
            return ExitCode::FAILURE;
        }
        None => None,
    };
    let current = target.as_ref().map(|t| t.text.clone()).unwrap_or_default();
    let result = mcp_gateway::import::existing(&current)
        .map_err(|e| format!("{}: {e}", write.map_or(String::new(), |p| p.display().to_string())))
        .and_then(|existing| {
            let home = mcp_gateway::config::process_env("HOME").map(PathBuf::from);
            mcp_gateway::import::import(&inputs, &existing, home.as_deref())
        });
    let imported = match result {
        Ok(i) => i,
        Err(e) => {
            eprintln!("mcp-gateway import: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    for n in &imported.notes {
        eprintln!("mcp-gateway import: {n}");
    }
    let Some(path) = write else {
        print!("{}", imported.toml); // stdout-ok: import's tables are its output
        return ExitCode::SUCCESS;
    };
    if imported.names.is_empty() {
        eprintln!("mcp-gateway import: nothing to add to {}", path.display());
        return ExitCode::SUCCESS;
    }
    let mut combined = current.clone();
    if !combined.is_empty() && !combined.ends_with("\n\n") {
        combined.push_str(if combined.ends_with('\n') { "\n" } else { "\n\n" });
    }
    combined.push_str(&imported.toml);
    // The servers' variables need not be set yet: any value checks the shape of the file.
    // The gateway's own (OTEL_*, MCP_GATEWAY_*) are read as they are.
    let placeholder = |name: &str| {
        if name.starts_with("OTEL_") || name.starts_with("MCP_GATEWAY_") {
            mcp_gateway::config::process_env(name)
        } else {
            mcp_gateway::config::process_env(name).or_else(|| Some("placeholder-value".to_owned()))
        }
    };
    if let Err(e) = Config::parse(path, &combined, &placeholder) {
        eprintln!(
            "mcp-gateway import: the result would not be a valid config; {} unchanged:\n{e}",
            path.display()
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    // Appended (O_APPEND), not rewritten: the file keeps its mode, owner and links, and
    // what was there stays byte for byte.
    let suffix = &combined[current.len()..];
    let appended = match &target {
        Some(t) => t.append(suffix),
        None => Ok(()),
    };
    if let Err(e) = appended {
        eprintln!("mcp-gateway import: {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    eprintln!(
        "mcp-gateway import: added {} to {}",
        imported
            .names
            .iter()
            .map(|n| format!("[servers.{n}]"))
            .collect::<Vec<_>>()
            .join(", "),
        path.display()
    );
    ExitCode::SUCCESS
}

/// The async runtime. Its worker threads: `gateway.worker_threads`, else
/// `TOKIO_WORKER_THREADS`, else half the CPUs (at least one). The gateway shares its
/// machine with the stdio servers it runs (and often with the client); on 2 cores one
/// worker cut CPU per call and the c=64 tail (BENCHMARKS.md), where a worker per core
/// woke threads across cores for every call. One worker means tokio's current-thread
/// scheduler: the same single thread of work, without the multi-thread scheduler's
/// stealing, injection queue and per-poll clock reads. `gateway.busy_poll`: see
/// `mcp_gateway::runtime`.
fn runtime(
    configured: Option<usize>,
    busy_poll: std::time::Duration,
) -> std::io::Result<(tokio::runtime::Runtime, mcp_gateway::runtime::BusyPoll)> {
    let from_env =
        std::env::var_os("TOKIO_WORKER_THREADS").and_then(|v| v.to_str().and_then(|s| s.trim().parse::<usize>().ok()));
    let workers = match (configured, from_env) {
        (Some(n), _) | (None, Some(n)) => n.max(1),
        (None, None) => (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).max(1),
    };
    mcp_gateway::runtime::build(workers, busy_poll)
}

/// Logs go to stderr only (stdout belongs to JSON-RPC in stdio mode). The level comes
/// from MCP_GATEWAY_LOG (or RUST_LOG), default `info`.
fn log_filter() -> String {
    std::env::var("MCP_GATEWAY_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_owned())
}

/// Completes on SIGINT or SIGTERM, and starts the last resort: if the process is still
/// running `limit` (`drain_delay + shutdown_grace` in serve mode, plus a moment for the
/// exporter's flush) later, whatever the runtime is doing, every child is killed and the
/// process exits. Its output completes on the next SIGINT or SIGTERM (which ends the
/// drain early).
async fn shutdown_signal(limit: std::time::Duration) -> impl std::future::Future<Output = ()> {
    let mut signals = Signals::new();
    signals.next().await;
    let _ = std::thread::Builder::new()
        .name("shutdown-deadline".into())
        .spawn(move || {
            std::thread::sleep(limit + std::time::Duration::from_millis(500));
            let n = mcp_gateway::kill_servers();
            eprintln!("mcp-gateway: still running {limit:?} after the shutdown signal; killed {n} servers and exiting");
            std::process::exit(1);
        });
    async move { signals.next().await }
}

/// SIGINT and SIGTERM, listened to from the start, so a second one is not missed
/// however soon it follows the first.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.int) => {}
                () = recv(&mut self.term) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The file `import --write` appends to, locked (an advisory lock, which another import
/// takes too) while it is open, with the text it held when it was locked.
struct Target {
    file: std::fs::File,
    text: String,
    /// Made by this import: removed again if nothing was appended to it.
    made: Option<PathBuf>,
    appended: std::cell::Cell<bool>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let (Some(path), false) = (&self.made, self.appended.get()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Target {
    /// Refuses a path that is not a regular file (a FIFO would block the read for ever)
    /// and a symlink to nothing: that would create the file where the link points, left
    /// behind if nothing is appended.
    fn open(path: &std::path::Path) -> std::io::Result<Target> {
        use std::io::{Error, ErrorKind};
        let existed = std::fs::symlink_metadata(path).is_ok();
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => {
                return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
            }
            Err(e) if e.kind() == ErrorKind::NotFound && existed => {
                let to = std::fs::read_link(path).map_or_else(|_| "?".into(), |t| t.display().to_string());
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("a symlink to {to}, which does not exist"),
                ));
            }
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        file.lock()?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut file, &mut text)?;
        Ok(Target {
            file,
            text,
            made: (!existed).then(|| path.to_owned()),
            appended: std::cell::Cell::new(false),
        })
    }

    /// Appends `suffix`; on a failure part way (a full disk), the file is cut back to
    /// what it held, so no half table is left in it.
    fn append(&self, suffix: &str) -> std::io::Result<()> {
        let mut f = &self.file;
        std::io::Write::write_all(&mut f, suffix.as_bytes())
            .and_then(|()| f.sync_data())
            .inspect(|()| self.appended.set(true))
            .inspect_err(|_| {
                let _ = self.file.set_len(self.text.len() as u64);
            })
    }
}
