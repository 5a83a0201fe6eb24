//! A real Redis for cluster tests: Debian's `redis-server` (or Valkey's), on a unix socket
//! in a temporary folder, so no TCP port is picked and hoped to stay free. Killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Redis {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `redis+unix:///…/redis.sock` for `cluster.redis`.
    pub url: String,
}

fn binary() -> &'static str {
    for b in ["redis-server", "valkey-server"] {
        if Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return b;
        }
    }
    panic!("redis-server is not installed (scripts/setup-test-deps installs it with apt-get)");
}

impl Redis {
    pub fn start() -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("redis+unix://{}", dir.path().join("redis.sock").display());
        let mut r = Redis { child: None, dir, url };
        r.spawn();
        r
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new(binary())
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocketperm",
                "700",
            ])
            .arg("--unixsocket")
            .arg(self.socket())
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            assert!(std::time::Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL: Redis goes away at once, its data with it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A new, empty Redis on the same socket.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs `redis-cli` against it and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .arg("-s")
            .arg(self.socket())
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SHA-256 of `s` in hex (coreutils' `sha256sum`): how the gateway names sessions in Redis.
pub fn sha256_hex(s: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}
