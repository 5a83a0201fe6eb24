//! Remote (HTTP) downstreams for tests: the stdlib Streamable HTTP fixture
//! (`tests/fixtures/http_server.py`) and other real servers, all on port 0: no port is
//! picked, released and hoped to be still free, as tests share one process and run in
//! parallel.

use super::{repo, until};
use serde_json::Value;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A port of 127.0.0.1 held by a TCP socket that is bound but not listening: a connection
/// to it is refused, and no other socket gets the port while this lives (the kernel never
/// picks it for a port-0 bind; `SO_REUSEADDR` is set, as a listener's, so that the port
/// can be bound again past the TIME_WAIT of its ended connections).
/// [`Remote::start_on`] hands it to the fixture, which listens on it.
pub struct ReservedPort {
    fd: OwnedFd,
    pub port: u16,
}

impl ReservedPort {
    /// A port the kernel chooses (port 0).
    pub fn new() -> ReservedPort {
        Self::bind(0).expect("bind 127.0.0.1:0")
    }

    /// `port` again, right after its listener ended.
    fn again(port: u16) -> ReservedPort {
        Self::bind(port).unwrap_or_else(|e| panic!("bind 127.0.0.1:{port} again: {e}"))
    }

    fn bind(port: u16) -> std::io::Result<ReservedPort> {
        let err = std::io::Error::last_os_error;
        // SAFETY: plain socket calls on a descriptor this function owns.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(err());
            }
            let fd = OwnedFd::from_raw_fd(fd);
            let one: libc::c_int = 1;
            if libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            ) != 0
            {
                return Err(err());
            }
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_port = port.to_be();
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), len) != 0 {
                return Err(err());
            }
            if libc::getsockname(fd.as_raw_fd(), (&mut addr as *mut libc::sockaddr_in).cast(), &mut len) != 0 {
                return Err(err());
            }
            Ok(ReservedPort {
                fd,
                port: u16::from_be(addr.sin_port),
            })
        }
    }
}

/// The TCP port `pid` listens on (IPv4 or IPv6), read from /proc: its socket descriptors
/// matched against the kernel's table of listening sockets.
pub fn listening_port(pid: u32) -> Option<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            let link = link.to_str()?;
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    ["tcp", "tcp6"].iter().find_map(|table| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok()?;
        text.lines().skip(1).find_map(|line| {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            (*state == "0A" && inodes.contains(*inode))
                .then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())?
        })
    })
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
    /// Starts the fixture on a port the kernel picks, with extra switches.
    pub fn start(args: &[&str]) -> Remote {
        Self::start_on(ReservedPort::new(), args)
    }

    /// Starts the fixture listening on the reserved port.
    pub fn start_on(port: ReservedPort, args: &[&str]) -> Remote {
        let mut r = Remote {
            child: None,
            port: port.port,
            args: args.iter().map(|s| s.to_string()).collect(),
            dir: tempfile::tempdir().unwrap(),
        };
        r.spawn(port);
        r
    }

    /// Starts the fixture on `socket`, which only the child keeps.
    fn spawn(&mut self, socket: ReservedPort) {
        let record = self.record_path();
        let fd = socket.fd.as_raw_fd();
        let mut cmd = Command::new("python3");
        cmd.arg(repo().join("tests/fixtures/http_server.py"))
            .arg("--fd")
            .arg(fd.to_string())
            .arg("--record")
            .arg(&record)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: fcntl is async-signal-safe; it clears close-on-exec in the child only.
        unsafe {
            cmd.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
        let mut child = cmd.spawn().expect("spawn tests/fixtures/http_server.py");
        drop(socket);
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
        let port = ReservedPort::again(self.port);
        self.spawn(port);
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
    /// Starts `program args` from the repo root with `env`, then waits until it listens
    /// on a TCP port (the args or env tell it to take port 0): that port is `port`.
    pub async fn start(program: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
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
        let mut p = Proc {
            child,
            port: 0,
            log,
            _dir: dir,
        };
        let pid = p.child.id();
        let listening = until(Duration::from_secs(20), || listening_port(pid).is_some()).await;
        assert!(listening, "{program} {args:?} did not listen; output:\n{}", p.output());
        p.port = listening_port(pid).expect("its port");
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
