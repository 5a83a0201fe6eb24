//! How the command starts: `serve`'s flags without the word `serve`, and the port bound
//! before any server is started.

use crate::common::*;
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

/// A stdio server that exits before answering `initialize` (here: Python cannot open its
/// script, the usual mistake with a relative path) has its last stderr lines in
/// `/status` `lastError` and in `check --connect`, with the child's secrets masked.
#[tokio::test]
async fn a_child_that_exits_before_initialize_shows_its_stderr() {
    let cfg = format!(
        "[servers.missing]\ncommand = \"python3\"\nargs = [\"no_such_server_script.py\"]\ncwd = {:?}\nrestart = \"never\"\n\n\
         [servers.leaky]\ncommand = \"python3\"\nargs = [\"-c\", \"import os,sys; sys.stderr.write('token is ' + os.environ['TOKEN'] + chr(10)); sys.exit(3)\"]\n\
         env = {{ TOKEN = \"s3cret-token-value\" }}\nrestart = \"never\"\n",
        repo().display().to_string()
    );
    let gw = Gateway::start(&cfg);
    let mut seen = (String::new(), String::new());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let (a, b) = (gw.server_status("missing").await, gw.server_status("leaky").await);
        seen = (
            a["lastError"].as_str().unwrap_or_default().to_owned(),
            b["lastError"].as_str().unwrap_or_default().to_owned(),
        );
        if seen.0.contains("stderr") && seen.1.contains("stderr") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        seen.0.contains("can't open file") && seen.0.contains("no_such_server_script.py"),
        "{}",
        seen.0
    );
    assert!(seen.1.contains("token is ***"), "{}", seen.1);
    assert!(!seen.1.contains("s3cret-token-value"));
    assert!(!gw.logs().contains("s3cret-token-value"), "the secret reached the log");

    let (run, _dir) = check(&cfg, &["--connect"], &[]);
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert!(run.stdout.contains("can't open file"), "{}", run.stdout);
    assert!(!format!("{}{}", run.stdout, run.stderr).contains("s3cret-token-value"));
}
