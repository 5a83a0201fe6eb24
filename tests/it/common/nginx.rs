//! A real nginx for cluster tests: Debian's `nginx`, run from
//! tests/fixtures/nginx-cluster.conf.template as a foreground process whose files all live
//! in a temporary folder, balancing round-robin over gateways. Killed on drop.
//!
//! nginx binds its own port (it cannot take a descriptor from us, unlike the fixtures of
//! [`super::ReservedPort`]): a port the kernel picked is freed and handed to nginx, and
//! if another process took it meanwhile, nginx fails to bind and is started again on a
//! new one.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nginx {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// `http://127.0.0.1:PORT/mcp`: the gateways' endpoint, through nginx.
    pub url: String,
}

const TEMPLATE: &str = include_str!("../../fixtures/nginx-cluster.conf.template");

fn binary() -> &'static str {
    for b in ["nginx", "/usr/sbin/nginx"] {
        if Command::new(b).arg("-v").output().is_ok_and(|o| o.status.success()) {
            return b;
        }
    }
    panic!("nginx is not installed (scripts/setup-test-deps installs it with apt-get)");
}

impl Nginx {
    /// nginx balancing over `upstreams` (`"127.0.0.1:port"` each), once it accepts.
    pub fn start(upstreams: &[String]) -> Nginx {
        assert!(!upstreams.is_empty(), "nginx needs an upstream");
        let servers: String = upstreams
            .iter()
            .map(|u| format!("        server {u} max_fails=1 fail_timeout=1s;\n"))
            .collect();
        Nginx::run(|port, dir| {
            TEMPLATE
                .replace("{DIR}", dir)
                .replace("{PORT}", &port.to_string())
                .replace("{UPSTREAMS}\n", &servers)
        })
    }

    /// nginx on the configuration `render(port, dir)` returns: it must listen on
    /// 127.0.0.1:`port` and keep its files (pid, logs, temp paths) in `dir`.
    pub fn run(render: impl Fn(u16, &str) -> String) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        // Run as root, nginx's workers drop to `nobody`: they must reach the temp paths.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let dir_str = dir.path().display().to_string();
        for _attempt in 0..20 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, render(port, &dir_str)).unwrap();
            let error_log = dir.path().join("error.log");
            let _ = std::fs::remove_file(&error_log);
            let child = Command::new(binary())
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(&error_log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("spawn nginx");
            let mut child = Some(child);
            match wait_accepting(&mut child, port, &error_log) {
                Ok(()) => {
                    let base = format!("http://127.0.0.1:{port}");
                    return Nginx {
                        child,
                        dir,
                        url: format!("{base}/mcp"),
                        base,
                    };
                }
                // Another process took the port between our probe and nginx's bind.
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("nginx did not start:\n{log}"),
            }
        }
        panic!("nginx found no free port in 20 attempts");
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.path("error.log")).unwrap_or_default()
    }

    /// The upstream (`127.0.0.1:port`) that served each request so far, in order; a
    /// request retried on another upstream lists both (`a, b`), as nginx logs it.
    /// [`Nginx::upstreams_used`] once it lists `n` requests (nginx writes a request's
    /// line after its response is sent, so a client may see the answer first), or what
    /// it lists after `timeout`.
    pub async fn upstreams_of(&self, n: usize, timeout: Duration) -> Vec<String> {
        super::until(timeout, || self.upstreams_used().len() >= n).await;
        self.upstreams_used()
    }

    pub fn upstreams_used(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
            .collect()
    }
}

/// Ok once nginx listens on `port` and accepts; Err(its error log) once it exited.
fn wait_accepting(child: &mut Option<Child>, port: u16, error_log: &std::path::Path) -> Result<(), String> {
    let log = || std::fs::read_to_string(error_log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Some(c) = child.as_mut() else {
            return Err(log());
        };
        if c.try_wait().unwrap().is_some() {
            *child = None;
            return Err(log());
        }
        // Ours, not another process's that took the port: nginx's master holds it.
        if super::listening_port(c.id()) == Some(port) && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            stop(child);
            panic!("nginx did not accept on {port}:\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGTERM (nginx's fast shutdown), then SIGKILL to whatever is left of its group.
fn stop(child: &mut Option<Child>) {
    let Some(mut c) = child.take() else {
        return;
    };
    let pgid = c.id() as i32;
    // SAFETY: signals to the process group this fixture spawned (process_group(0)).
    unsafe {
        libc::kill(pgid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above; a worker left behind goes too.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
    let _ = c.wait();
}

impl Drop for Nginx {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}
