//! Per-client secrets (`[clients.NAME] secrets`, `${client:NAME}` in a server's `env` and
//! `headers`, `isolation = "client"`) end to end, with the real binary: alice and bob, each
//! with their own secret, reach a stdio server and an HTTP server and see only their own
//! value (the stdio one also through the official Python SDK client); a client without the
//! secret gets an error naming it; `check` refuses `${client:…}` on a shared stdio server
//! and warns of clients that lack a secret; and no secret value reaches the gateway's log
//! at trace level, `/status` or an error.

use crate::common::*;
use crate::interop::{require_deps, venv_python};
use serde_json::{json, Value};
use std::time::Duration;

const ALICE: &str = "alice-bearer-7f3a";
const BOB: &str = "bob-bearer-91c2";
const CAROL: &str = "carol-bearer-5d0e";
const ALICE_GH: &str = "alice-gh-secret-0a1b2c";
const BOB_GH: &str = "bob-gh-secret-3d4e5f";

/// The env the gateway runs with: the clients' tokens and secrets, and trace logging.
fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("ALICE_TOKEN", ALICE),
        ("BOB_TOKEN", BOB),
        ("CAROL_TOKEN", CAROL),
        ("ALICE_GH", ALICE_GH),
        ("BOB_GH", BOB_GH),
        ("MCP_GATEWAY_LOG", "trace"),
    ]
}

/// alice (admin) and bob have a GH secret; carol has none.
fn clients() -> &'static str {
    r#"
[clients.alice]
token = "${ALICE_TOKEN}"
admin = true
secrets = { GH = "${ALICE_GH}" }

[clients.bob]
token = "${BOB_TOKEN}"
secrets = { GH = "${BOB_GH}" }

[clients.carol]
token = "${CAROL_TOKEN}"
"#
}

/// Server `gh`: the mock, one process per client identity, whose GITHUB_TOKEN is the
/// caller's GH secret inside other text.
fn stdio_config(mock_name: &str) -> String {
    format!(
        "{}\n{}",
        clients(),
        server(
            "gh",
            mock_name,
            &["--per-process", "--two-way"],
            "isolation = \"client\"\nenv = { GITHUB_TOKEN = \"token ${client:GH}!\", PLAIN = \"same\" }\n"
        )
    )
}

async fn ok_text(s: &Session, tool: &str, args: Value) -> String {
    let r = s.call(tool, args).await;
    assert!(
        r.get("error").is_none() && r["result"]["isError"] != true,
        "{tool} failed: {r}"
    );
    text(&r)
}

async fn token_of(s: &Session) -> String {
    ok_text(s, "gh__env", json!({"name": "GITHUB_TOKEN"})).await
}

async fn pid_of(s: &Session) -> String {
    ok_text(s, "gh__pid", json!({})).await
}

/// Asserts no secret value (nor a bearer token) is in `what`.
fn secret_free(label: &str, what: &str) {
    for v in [ALICE_GH, BOB_GH, ALICE, BOB, CAROL] {
        assert!(!what.contains(v), "{label} shows {v}:\n{what}");
    }
}

/// A 2026-07-28 (stateless) tools/call as `token`.
async fn stateless_call(gw: &Gateway, token: &str, tool: &str, args: Value) -> Value {
    let r = reqwest::Client::new()
        .post(&gw.url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": args, "_meta": stateless_meta("secrets-test")}}))
        .send()
        .await
        .unwrap();
    read_messages(r).await.into_iter().last().expect("an answer")
}

#[tokio::test]
async fn alice_and_bob_each_reach_their_own_process_with_their_own_secret() {
    let mock_name = unique("secrets");
    let gw = Gateway::start_with_env(&stdio_config(&mock_name), &env());
    let alice = Session::open_as(&gw.url, ALICE).await;
    let alice2 = Session::open_as(&gw.url, ALICE).await;
    let bob = Session::open_as(&gw.url, BOB).await;

    assert_eq!(token_of(&alice).await, format!("token {ALICE_GH}!"));
    assert_eq!(token_of(&bob).await, format!("token {BOB_GH}!"));
    assert_eq!(ok_text(&bob, "gh__env", json!({"name": "PLAIN"})).await, "same");
    // One process per identity: alice's two sessions (and her stateless requests) share
    // hers; bob has his own; neither is the catalog process.
    let (pa, pa2, pb) = (pid_of(&alice).await, pid_of(&alice2).await, pid_of(&bob).await);
    assert_eq!(pa, pa2, "alice's sessions share a process");
    assert_ne!(pa, pb, "bob has a process of his own");
    let sl = stateless_call(&gw, ALICE, "gh__pid", json!({})).await;
    assert_eq!(text(&sl), pa, "alice's stateless request reaches her process: {sl}");
    let sl = stateless_call(&gw, BOB, "gh__env", json!({"name": "GITHUB_TOKEN"})).await;
    assert_eq!(text(&sl), format!("token {BOB_GH}!"), "{sl}");
    let catalog = gw.server_status_as("gh", ALICE).await;
    assert_eq!(catalog["isolation"], "client", "{catalog}");
    assert_eq!(catalog["sessionProcesses"], 2, "{catalog}");
    assert_ne!(catalog["pid"].to_string(), pa);
    assert_ne!(catalog["pid"].to_string(), pb);
    // The catalog process runs without the variable (no catalog_secrets here).
    let env_of = |pid: &str| std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let catalog_env = String::from_utf8_lossy(&env_of(&catalog["pid"].to_string())).into_owned();
    assert!(
        catalog_env.contains("PLAIN=same") && !catalog_env.contains("GITHUB_TOKEN"),
        "{catalog_env:?}"
    );
    assert!(String::from_utf8_lossy(&env_of(&pb)).contains(&format!("GITHUB_TOKEN=token {BOB_GH}!\0")));

    // carol has no GH secret: an error naming it and the server, and no process.
    let carol = Session::open_as(&gw.url, CAROL).await;
    let r = carol.call("gh__env", json!({"name": "GITHUB_TOKEN"})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("'gh'")
            && msg.contains("carol")
            && msg.contains("GH")
            && msg.contains("servers.gh.env.GITHUB_TOKEN"),
        "{msg}"
    );
    secret_free("carol's error", &r.to_string());
    let r = stateless_call(&gw, CAROL, "gh__pid", json!({})).await;
    assert!(
        error_of(&r)["message"].as_str().unwrap().contains("no secret GH"),
        "{r}"
    );
    assert_eq!(gw.server_status_as("gh", ALICE).await["sessionProcesses"], 2);

    // What the child writes to its stderr is masked, the bare secret too.
    ok_text(&alice, "gh__mark", json!({"text": format!("leaking {ALICE_GH}")})).await;
    assert!(
        gw.wait_log("mark leaking ***", Duration::from_secs(10)).await,
        "{}",
        gw.logs()
    );

    let status = gw.get_json_as("/status", ALICE).await.to_string();
    secret_free("/status", &status);
    secret_free("the gateway's trace log", &gw.logs());
    assert!(gw.logs().contains("TRACE"), "the log was not at trace level");
}

#[tokio::test]
async fn the_python_sdk_client_sees_its_own_secret() {
    require_deps();
    let mock_name = unique("secrets-py");
    let gw = Gateway::start_with_env(&stdio_config(&mock_name), &env());
    for (token, want) in [(ALICE, ALICE_GH), (BOB, BOB_GH)] {
        for mode in ["legacy", "auto"] {
            let out = py_whoami(&gw, token, mode).await;
            assert_eq!(out["content"][0]["text"], format!("token {want}!"), "{mode}: {out}");
        }
    }
    let out = py_whoami(&gw, CAROL, "legacy").await;
    let msg = out["error"]
        .as_str()
        .unwrap_or_else(|| panic!("carol got no error: {out}"));
    assert!(msg.contains("no secret GH"), "{msg}");
    secret_free("the gateway's trace log", &gw.logs());
}

/// Runs tests/interop/py_whoami.py as `token`, calling gh__env GITHUB_TOKEN.
async fn py_whoami(gw: &Gateway, token: &str, mode: &str) -> Value {
    let out = tokio::process::Command::new(venv_python())
        .args(["tests/interop/py_whoami.py", &gw.url, "--token", token, "--mode", mode])
        .args(["--tool", "gh__env", "--args", r#"{"name": "GITHUB_TOKEN"}"#])
        .current_dir(repo())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), out)
        .await
        .expect("py_whoami did not finish")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "py_whoami ({mode}): {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

#[tokio::test]
async fn an_http_server_gets_each_clients_own_header_on_a_session_of_its_own() {
    let remote = Remote::start(&[]);
    let config = format!(
        "{}\n{}",
        clients(),
        remote_table(
            "rem",
            &remote.url(),
            "headers = { Authorization = \"Bearer ${client:GH}\", X-Team = \"core\" }"
        )
    );
    let gw = Gateway::start_with_env(&config, &env());
    let alice = Session::open_as(&gw.url, ALICE).await;
    let bob = Session::open_as(&gw.url, BOB).await;
    for (s, who) in [(&alice, "alice"), (&bob, "bob"), (&alice, "alice")] {
        assert_eq!(ok_text(s, "rem__echo", json!({"text": who})).await, who);
    }
    let calls = remote.posts_of("tools/call");
    assert_eq!(calls.len(), 3, "{calls:?}");
    let auth = |r: &Value| r["headers"]["authorization"].as_str().unwrap_or_default().to_owned();
    let sid = |r: &Value| r["headers"]["mcp-session-id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(auth(&calls[0]), format!("Bearer {ALICE_GH}"));
    assert_eq!(auth(&calls[1]), format!("Bearer {BOB_GH}"));
    assert_eq!(auth(&calls[2]), format!("Bearer {ALICE_GH}"));
    assert!(calls.iter().all(|r| r["headers"]["x-team"] == "core"), "{calls:?}");
    // A session per identity: the server never sees one session with two credentials.
    assert_eq!(sid(&calls[0]), sid(&calls[2]));
    assert_ne!(sid(&calls[0]), sid(&calls[1]));
    for r in remote.records() {
        let (a, s) = (auth(&r), sid(&r));
        if s.is_empty() {
            continue;
        }
        let same: Vec<String> = remote.records().iter().filter(|o| sid(o) == s).map(auth).collect();
        assert!(
            same.iter().all(|o| *o == a),
            "session {s} saw two credentials: {same:?}"
        );
    }
    // The catalog's own session goes without any client's header.
    let inits = remote.posts_of("initialize");
    assert!(inits.iter().any(|r| auth(r).is_empty()), "{inits:?}");

    let carol = Session::open_as(&gw.url, CAROL).await;
    let r = carol.call("rem__echo", json!({"text": "x"})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("no secret GH") && msg.contains("servers.rem.headers.Authorization"),
        "{msg}"
    );
    assert_eq!(
        remote.posts_of("tools/call").len(),
        3,
        "carol's call reached the server"
    );
    secret_free("/status", &gw.get_json_as("/status", ALICE).await.to_string());
    secret_free("the gateway's trace log", &gw.logs());
}

#[test]
fn check_refuses_client_secrets_on_a_shared_stdio_server_and_warns_of_missing_ones() {
    let shared = format!(
        "{}\n{}",
        clients(),
        server("gh", "gh", &[], "env = { GITHUB_TOKEN = \"${client:GH}\" }\n")
    );
    let (run, _dir) = check(&shared, &[], &env());
    assert_eq!(run.code, Some(64), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("servers.gh.env.GITHUB_TOKEN") && run.stderr.contains("isolation = \"client\""),
        "{}",
        run.stderr
    );

    let isolated = format!(
        "{}\n{}",
        clients(),
        server(
            "gh",
            "gh",
            &[],
            "isolation = \"session\"\nenv = { GITHUB_TOKEN = \"${client:GH}\", OTHER = \"${client:NOBODY}\" }\n"
        )
    );
    let (run, _dir) = check(&isolated, &[], &env());
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("clients without secret GH get an error calling it: carol"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("${client:NOBODY}, which no [clients.*] table defines"),
        "{}",
        run.stdout
    );
    secret_free("check", &format!("{}{}", run.stdout, run.stderr));

    // A secret too short to be masked is named (never shown) by check.
    let mut short = env();
    short.retain(|(k, _)| *k != "BOB_GH");
    short.push(("BOB_GH", "ab12"));
    let (run, _dir) = check(&isolated, &[], &short);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("the secret GH of bob is shorter than 6 characters, too short to be masked"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("ab12") && !run.stderr.contains("ab12"));
}

#[tokio::test]
async fn a_reload_that_changes_a_secret_replaces_the_clients_process() {
    let mock_name = unique("secrets-reload");
    let config = stdio_config(&mock_name);
    let mut env = env();
    env.push(("ALICE_GH_NEW", "alice-gh-rotated-6a7b8c"));
    let gw = Gateway::start_with_env(&config, &env);
    let alice = Session::open_as(&gw.url, ALICE).await;
    let bob = Session::open_as(&gw.url, BOB).await;
    let (before, bob_before) = (pid_of(&alice).await, pid_of(&bob).await);
    assert_eq!(token_of(&alice).await, format!("token {ALICE_GH}!"));

    let done = gw.logs().matches("reload done").count();
    std::fs::write(gw.config_path(), config.replace("${ALICE_GH}", "${ALICE_GH_NEW}")).unwrap();
    let log = gw.stderr.clone();
    let reloaded = until(Duration::from_secs(10), || {
        log.lock().unwrap().matches("reload done").count() > done
    })
    .await;
    assert!(reloaded, "no reload:\n{}", gw.logs());

    assert_eq!(token_of(&alice).await, "token alice-gh-rotated-6a7b8c!");
    let after = pid_of(&alice).await;
    assert_ne!(before, after, "alice's process still runs with the old secret");
    let old: i32 = before.parse().unwrap();
    assert!(
        until(Duration::from_secs(10), || !alive(old)).await,
        "the process with the old secret was not stopped"
    );
    assert_eq!(pid_of(&bob).await, bob_before, "bob's secret did not change");
    assert!(!gw.logs().contains("alice-gh-rotated-6a7b8c"), "{}", gw.logs());
}

#[tokio::test]
async fn a_caller_without_an_identity_cannot_use_a_client_isolated_server() {
    let mock_name = unique("secrets-open");
    let config = server("solo", &mock_name, &["--per-process"], "isolation = \"client\"\n");
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    let r = s.call("solo__pid", json!({})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("'solo'") && msg.contains("isolation = \"client\"") && msg.contains("no identity"),
        "{msg}"
    );
    assert_eq!(gw.server_status("solo").await["sessionProcesses"], 0);

    let (run, _dir) = check(&config, &[], &[]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("servers.solo has isolation = \"client\", but no [clients.*] or [auth.oauth]"),
        "{}",
        run.stdout
    );
}

#[tokio::test]
async fn catalog_secrets_fill_the_catalog_process_and_no_callers() {
    let mock_name = unique("secrets-catalog");
    let config = format!(
        "{}catalog_secrets = {{ GH = \"${{LISTER_GH}}\" }}\n",
        stdio_config(&mock_name)
    );
    let mut env = env();
    env.push(("LISTER_GH", "lister-gh-secret-9z8y7x"));
    let gw = Gateway::start_with_env(&config, &env);
    let catalog = gw.server_status_as("gh", ALICE).await;
    let environ = std::fs::read(format!("/proc/{}/environ", catalog["pid"])).unwrap();
    let environ = String::from_utf8_lossy(&environ).into_owned();
    assert!(
        environ.contains("GITHUB_TOKEN=token lister-gh-secret-9z8y7x!\0"),
        "{environ:?}"
    );
    let alice = Session::open_as(&gw.url, ALICE).await;
    assert_eq!(token_of(&alice).await, format!("token {ALICE_GH}!"));
    let carol = Session::open_as(&gw.url, CAROL).await;
    let r = carol.call("gh__env", json!({"name": "GITHUB_TOKEN"})).await;
    assert!(
        error_of(&r)["message"].as_str().unwrap().contains("no secret GH"),
        "{r}"
    );
    assert!(!r.to_string().contains("lister-gh"), "{r}");
    let status = gw.get_json_as("/status", ALICE).await.to_string();
    assert!(!status.contains("lister-gh") && !gw.logs().contains("lister-gh"));

    let typo = format!("{}catalog_secrets = {{ GHH = \"x\" }}\n", stdio_config(&mock_name));
    let (run, _dir) = check(&typo, &[], &env);
    assert_eq!(run.code, Some(64), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("servers.gh.catalog_secrets.GHH: the server's env and headers use no ${client:GHH}"),
        "{}",
        run.stderr
    );
}

async fn sess_token(s: &Session) -> String {
    ok_text(s, "sess__env", json!({"name": "GITHUB_TOKEN"})).await
}

/// Every key and value in `redis`, as text.
fn redis_dump(redis: &Redis) -> String {
    let mut out = String::new();
    for key in redis.cli(&["KEYS", "*"]).lines().filter(|k| !k.is_empty()) {
        let kind = redis.cli(&["TYPE", key]);
        let value = match kind.trim() {
            "string" => redis.cli(&["GET", key]),
            "hash" => redis.cli(&["HGETALL", key]),
            "zset" => redis.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
            "set" => redis.cli(&["SMEMBERS", key]),
            "list" => redis.cli(&["LRANGE", key, "0", "-1"]),
            "stream" => redis.cli(&["XRANGE", key, "-", "+"]),
            other => format!("<{other}>"),
        };
        out.push_str(&format!("{key} = {value}\n"));
    }
    out
}

#[tokio::test]
async fn two_replicas_each_run_a_clients_process_and_forward_to_a_sessions() {
    let redis = Redis::start();
    let mock_name = unique("secrets-cluster");
    let sess_name = unique("secrets-cluster-sess");
    let servers = format!(
        "{}{}",
        stdio_config(&mock_name),
        server(
            "sess",
            &sess_name,
            &["--per-process"],
            "isolation = \"session\"\nenv = { GITHUB_TOKEN = \"${client:GH}\" }\n"
        )
    );
    let gws: Vec<Gateway> = (0..2)
        .map(|i| {
            let cluster = crate::cluster::cluster_toml(&redis, &format!("replica_id = \"gw-{i}\""));
            Gateway::start_with_env(&format!("{servers}\n{cluster}"), &env())
        })
        .collect();
    let alice = Session::open_as(&gws[0].url, ALICE).await;
    let alice_there = crate::cluster::via(&alice, &gws[1]);
    let bob = Session::open_as(&gws[1].url, BOB).await;

    // isolation = "client": each replica runs its own process for alice, with her secret.
    assert_eq!(token_of(&alice).await, format!("token {ALICE_GH}!"));
    assert_eq!(token_of(&alice_there).await, format!("token {ALICE_GH}!"));
    assert_ne!(pid_of(&alice).await, pid_of(&alice_there).await);
    assert_eq!(token_of(&bob).await, format!("token {BOB_GH}!"));

    // isolation = "session": one process for alice's session, on the replica that started
    // it; the other forwards to it.
    assert_eq!(sess_token(&alice).await, ALICE_GH);
    let p0 = ok_text(&alice, "sess__pid", json!({})).await;
    assert_eq!(ok_text(&alice_there, "sess__pid", json!({})).await, p0);
    assert_eq!(sess_token(&alice_there).await, ALICE_GH);
    assert_eq!(sess_token(&bob).await, BOB_GH);

    let dump = redis_dump(&redis);
    assert!(!dump.is_empty(), "nothing in Redis");
    secret_free("Redis", &dump);
    for gw in &gws {
        secret_free("a replica's trace log", &gw.logs());
    }
}

#[test]
fn the_stdio_front_runs_as_its_client_with_that_clients_secret() {
    let mock_name = unique("secrets-stdio");
    let config = stdio_config(&mock_name);
    for (client, want) in [
        ("alice", Ok(format!("token {ALICE_GH}!"))),
        ("carol", Err("no secret GH")),
    ] {
        let mut env = env();
        env.push(("MCP_GATEWAY_CLIENT", client));
        let mut gw = StdioGateway::start(&config, &env);
        gw.initialize();
        let (_, r) = gw.request(
            json!(2),
            "tools/call",
            json!({"name": "gh__env", "arguments": {"name": "GITHUB_TOKEN"}}),
        );
        match want {
            Ok(token) => assert_eq!(text(&r), token, "{client}: {r}"),
            Err(why) => assert!(error_of(&r)["message"].as_str().unwrap().contains(why), "{client}: {r}"),
        }
        gw.close_stdin();
        assert!(gw.wait_exit(Duration::from_secs(30)).is_some());
        secret_free("the stdio gateway's trace log", &gw.logs());
        // stdout carries only JSON-RPC.
        for line in gw.stdout.lock().unwrap().iter() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON-RPC: {line}"));
            assert_eq!(v["jsonrpc"], "2.0", "{line}");
        }
    }
}

#[tokio::test]
async fn client_processes_are_bounded_by_max_sessions_and_reaped_when_idle() {
    let mock_name = unique("secrets-bound");
    let config = stdio_config(&mock_name).replace(
        "isolation = \"client\"\n",
        "isolation = \"client\"\nmax_sessions = 1\nidle_timeout = \"1s\"\n",
    );
    let gw = Gateway::start_with_env(&config, &env());
    let alice = Session::open_as(&gw.url, ALICE).await;
    let alice2 = Session::open_as(&gw.url, ALICE).await;
    let bob = Session::open_as(&gw.url, BOB).await;
    let first = pid_of(&alice).await;
    // alice's second session shares her process: no second seat.
    assert_eq!(pid_of(&alice2).await, first);
    let r = bob.call("gh__pid", json!({})).await;
    let why = error_of(&r)["message"].as_str().unwrap().to_owned();
    assert!(why.contains("'gh'") && why.contains("max_sessions"), "{why}");

    // Unused for idle_timeout, alice's process is stopped, and its seat given back.
    let pid: i32 = first.parse().unwrap();
    assert!(
        until(Duration::from_secs(10), || !alive(pid)).await,
        "alice's idle process still runs"
    );
    assert_eq!(token_of(&bob).await, format!("token {BOB_GH}!"));
    assert_ne!(pid_of(&bob).await, first);
}

#[tokio::test]
async fn an_oauth_caller_is_its_claims_identity_with_that_tables_secrets() {
    use crate::auth::{claims, keys, serve_jwks, sign, AUDIENCE, ISSUER};
    let k = keys();
    let (jwks_url, _) = serve_jwks(k.jwks.clone()).await;
    let mock_name = unique("secrets-oauth");
    let config = format!(
        "{}\n[auth.oauth]\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\njwks_url = \"{jwks_url}\"\n",
        stdio_config(&mock_name)
    );
    let gw = Gateway::start_with_env(&config, &env());
    let jwt = |sub: &str| sign(jsonwebtoken::Algorithm::ES256, "ec-1", &k.ec, &claims(sub));
    // A JWT whose sub names [clients.bob] is bob: his secret, his process.
    let bob_static = Session::open_as(&gw.url, BOB).await;
    let bob_oauth = Session::open_as(&gw.url, &jwt("bob")).await;
    assert_eq!(token_of(&bob_oauth).await, format!("token {BOB_GH}!"));
    assert_eq!(pid_of(&bob_oauth).await, pid_of(&bob_static).await);
    // dave has no table, so no secrets: an error naming the secret, no process.
    let dave = Session::open_as(&gw.url, &jwt("dave")).await;
    let r = dave.call("gh__env", json!({"name": "GITHUB_TOKEN"})).await;
    let msg = error_of(&r)["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("\"dave\" has no secret GH"), "{msg}");
    // Whatever the tool, every call to the server needs the secret (stateless ones too).
    let r = stateless_call(&gw, &jwt("dave"), "gh__pid", json!({})).await;
    assert!(
        error_of(&r)["message"].as_str().unwrap().contains("no secret GH"),
        "{r}"
    );
    assert_eq!(gw.server_status_as("gh", ALICE).await["sessionProcesses"], 1);
    secret_free("the gateway's trace log", &gw.logs());
}
