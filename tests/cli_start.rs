//! How the command starts: `serve`'s flags without the word `serve`, and the port bound
//! before any server is started.

mod common;
use common::*;
use std::process::Stdio;

#[tokio::test]
async fn listen_works_without_the_serve_word() {
    let name = unique("noserve");
    let (_dir, mut cmd) = gateway_command(&server("a", &name, &[], ""), &["--listen", "127.0.0.1:0"], &[]);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("mcp-gateway listening on ") || l.contains("error"))
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = line.unwrap_or_default();
    assert!(line.starts_with("mcp-gateway listening on http://127.0.0.1:"), "{line}");
}

#[test]
fn a_port_in_use_is_reported_before_any_server_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let name = unique("portinuse");
    let (_dir, mut cmd) = gateway_command(
        &server("a", &name, &[], ""),
        &["--listen", &format!("127.0.0.1:{port}")],
        &[],
    );
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    // Not one child was spawned: the mock logs its start on stderr, the gateway its handshake.
    assert!(!stderr.contains("started (quirks"), "{stderr}");
    assert!(!stderr.contains("initialized"), "{stderr}");
    assert!(pids_matching(&name).is_empty());
}
