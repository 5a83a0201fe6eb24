//! Remote (HTTP) downstreams for tests: the stdlib Streamable HTTP fixture
//! (`tests/fixtures/http_server.py`) and other real servers started on a free port.

use super::repo;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago (bind port 0, read it, release it).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().unwrap().port()
}

/// Waits until something accepts TCP connections on 127.0.0.1:`port`.
pub async fn wait_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A `[servers.NAME]` table for a remote server, with a 20 s timeout and extra TOML lines.
pub fn remote_table(name: &str, url: &str, extra: &str) -> String {
    format!("[servers.{name}]\nurl = {url:?}\ntimeout = \"20s\"\n{extra}\n")
}

/// The fixture HTTP server, recording every request. Killed on drop.
pub struct Remote {
    child: Option<Child>,
    pub port: u16,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

impl Remote {
    /// Starts the fixture on a port of its own choosing with extra switches.
    pub fn start(args: &[&str]) -> Remote {
        Self::start_on(0, args)
    }

    /// Starts the fixture on `port` (0: any).
    pub fn start_on(port: u16, args: &[&str]) -> Remote {
        let mut r = Remote {
            child: None,
            port,
            args: args.iter().map(|s| s.to_string()).collect(),
            dir: tempfile::tempdir().unwrap(),
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let record = self.record_path();
        let mut child = Command::new("python3")
            .arg(repo().join("tests/fixtures/http_server.py"))
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--record")
            .arg(&record)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tests/fixtures/http_server.py");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(port) = line.trim().strip_prefix("listening on ") else {
            let mut err = String::new();
            let _ = child.kill();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("http fixture did not start (port {}): {line:?}\n{err}", self.port);
        };
        self.port = port.parse().unwrap();
        self.child = Some(child);
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn record_path(&self) -> PathBuf {
        self.dir.path().join("requests.jsonl")
    }

    /// Every request recorded so far: `{"http", "path", "rpc", "headers"}`.
    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(self.record_path())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Recorded POSTs of JSON-RPC method `rpc`.
    pub fn posts_of(&self, rpc: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["http"] == "POST" && r["rpc"] == rpc)
            .collect()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same switches and record file.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Another real server process (an SDK server), with its output in a log file. Killed on drop.
pub struct Proc {
    child: Child,
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proc {
    /// Starts `program args` from the repo root with `env`, then waits until `port` accepts.
    pub async fn start(program: &str, args: &[&str], env: &[(&str, &str)], port: u16) -> Proc {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(repo())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let p = Proc {
            child,
            port,
            log,
            _dir: dir,
        };
        assert!(
            wait_port(port, Duration::from_secs(20)).await,
            "{program} {args:?} did not listen on {port}; output:\n{}",
            p.output()
        );
        p
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
