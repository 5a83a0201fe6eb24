//! Config and CLI: `check` on good and bad files, `${VAR}` expansion, the child
//! environment and secret hygiene, and shutdown on SIGTERM.

use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Runs `check` on `config` and asserts exit 64 with exactly located errors: each of
/// `expected` is (line, column, words the message must contain).
fn assert_invalid(config: &str, expected: &[(usize, usize, &[&str])]) {
    let (run, dir) = check(config, &[], &[]);
    assert_eq!(
        run.code,
        Some(64),
        "config:\n{config}\nstdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let file = dir.path().join("gateway.toml").display().to_string();
    for (line, col, words) in expected {
        let prefix = format!("{file}:{line}:{col}: ");
        let found = run.stderr.lines().find(|l| l.starts_with(&prefix));
        let l = found.unwrap_or_else(|| panic!("no error at {prefix} in:\n{}", run.stderr));
        for w in *words {
            assert!(l.contains(w), "{l:?} should mention {w:?}");
        }
    }
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

#[test]
fn check_reports_located_errors_and_exits_64() {
    // Unknown key, in [gateway], in a server, at top level.
    assert_invalid(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nlisten_on = 1\n",
        &[(3, 1, &["listen_on"])],
    );
    assert_invalid("[servers.a]\ncommand = \"x\"\n\nbogus = 1\n", &[(4, 1, &["bogus"])]);
    assert_invalid(
        "[servers.a]\ncommand = \"x\"\ntools = { allow = [], nope = [] }\n",
        &[(3, 23, &["nope"])],
    );
    // Bad server name.
    assert_invalid(
        "[servers.\"bad name\"]\ncommand = \"x\"\nprefix = \"p\"\n",
        &[(1, 10, &["bad name", "A-Za-z0-9-"])],
    );
    assert_invalid("[servers.a_b]\ncommand = \"x\"\n", &[(1, 10, &["a_b"])]);
    // Unset ${VAR}: names server, key and variable.
    assert_invalid(
        "[servers.a]\ncommand = \"x\"\nenv = { OK = \"${HOME:-x}\", K = \"${MCP_GW_TEST_UNSET_VAR}\" }\n",
        &[(3, 32, &["servers.a.env.K", "MCP_GW_TEST_UNSET_VAR"])],
    );
    // Bad durations.
    assert_invalid(
        "[servers.a]\ncommand = \"x\"\ntimeout = \"5 parsecs\"\n",
        &[(3, 11, &["servers.a.timeout", "5 parsecs"])],
    );
    assert_invalid(
        "[gateway]\nrequest_timeout = \"soon\"\n",
        &[(2, 19, &["request_timeout", "soon"])],
    );
    // Several errors are all reported.
    assert_invalid(
        "[gateway]\nrequest_timeout = \"0s\"\n\n[servers.b]\ncommand = \"x\"\ntimeout = \"fast\"\n",
        &[(2, 19, &["request_timeout"]), (6, 11, &["servers.b.timeout"])],
    );
}

/// Every problem in the file comes out in one run, one line each, in whichever table it
/// is: an unknown key, a value of the wrong type and a semantic error, each located,
/// with the key's full path, what was expected and an example.
#[test]
fn check_reports_every_error_in_one_run() {
    let cfg = "[gateway]\nrequest_timeout = 60\n\n[servers.a]\ncomand = \"x\"\ncommand = \"x\"\n\n\
               [servers.b]\ncommand = \"x\"\nrestart = \"sometimes\"\nargs = [\"ok\", 1]\n\n\
               [telemetry]\nrecord_payloads = \"yes\"\n";
    let expected: &[(usize, usize, &[&str])] = &[
        (
            2,
            19,
            &[
                "gateway.request_timeout: expected a duration string like \"60s\"",
                "found integer 60",
            ],
        ),
        (
            5,
            1,
            &[
                "servers.a: unknown key \"comand\"; expected one of command, url, ",
                "did you mean \"command\"?",
            ],
        ),
        (
            10,
            11,
            &["servers.b.restart: \"sometimes\" is not one of on-failure, always, never"],
        ),
        (
            11,
            15,
            &[
                "servers.b.args: expected a list of strings like [",
                "one item is integer 1",
            ],
        ),
        (
            14,
            19,
            &[
                "telemetry.record_payloads: expected a boolean",
                "= true",
                "found string \"yes\"",
            ],
        ),
    ];
    assert_invalid(cfg, expected);
    let (run, _dir) = check(cfg, &[], &[]);
    let errors = run.stderr.lines().filter(|l| l.contains("gateway.toml:")).count();
    assert_eq!(errors, expected.len(), "one line per problem:\n{}", run.stderr);

    // Several unknown keys and wrong types in one table all come out too.
    assert_invalid(
        "[gateway]\nlisten_on = 1\nmax_body = 16\npage_size = \"10\"\nmax_line = \"1MiB\"\n",
        &[
            (2, 1, &["gateway: unknown key \"listen_on\"", "listen, path"]),
            (
                3,
                12,
                &[
                    "gateway.max_body: expected a size string like \"16MiB\"",
                    "found integer 16",
                ],
            ),
            (
                4,
                13,
                &["gateway.page_size: expected a whole number like page_size = 100"],
            ),
        ],
    );
    // A file that is not TOML is one located error.
    assert_invalid(
        "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[servers.a]\ncommand = npx\n",
        &[(5, 11, &["not valid TOML"])],
    );
}

/// A config file that is not there (an mcp.json entry with a relative --config run from
/// another folder): the message names the absolute path tried, the working directory,
/// and both ways to name the file.
#[test]
fn a_missing_config_names_the_path_the_cwd_and_how_to_name_it() {
    let cwd = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--config", "conf/nope.toml"])
        .current_dir(cwd.path())
        .env_remove("MCP_GATEWAY_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let cwd = std::fs::canonicalize(cwd.path()).unwrap();
    let tried = cwd.join("conf/nope.toml").display().to_string();
    for want in [
        tried.as_str(),
        &format!("working directory is {}", cwd.display()),
        "--config",
        "MCP_GATEWAY_CONFIG",
    ] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
    assert!(out.stdout.is_empty());
}

#[test]
fn check_accepts_a_valid_config() {
    let cfg = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nrequest_timeout = \"1500ms\"\nmax_body = \"1MiB\"\n\n{}",
        server(
            "calc",
            &unique("calc"),
            &[],
            "env = { MODE = \"${MCP_GW_TEST_UNSET_MODE:-fast}\" }\ntimeout = \"2m\""
        )
    );
    let (run, dir) = check(&cfg, &[], &[]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let file = dir.path().join("gateway.toml").display().to_string();
    assert_eq!(run.stdout.trim(), format!("{file}: ok (1 servers, 1 enabled)"));
    // The shipped example config is valid too.
    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(repo().join("gateway.toml"))
        .env_remove("MODE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Each child gets the safe inherited set plus its own env, nothing else; `${VAR}` and
/// `${VAR:-default}` expand; the secret never shows in logs, /status or check output.
#[tokio::test]
async fn children_get_only_their_own_env_and_secrets_stay_hidden() {
    let secret = format!("s3cr3t-{}", unique("value"));
    let (k, o) = (unique("keeper"), unique("other"));
    let cfg = [
        server(
            "keeper",
            &k,
            &[],
            "env = { SECRET_X = \"${TEST_SECRET}\", MODE = \"${MCP_GW_TEST_UNSET_MODE:-fast}\", MODE2 = \"${GW_ONLY_VAR:-unused}\" }",
        ),
        server("other", &o, &[], ""),
    ]
    .concat();
    let env = [
        ("TEST_SECRET", secret.as_str()),
        ("GW_ONLY_VAR", "gw-only"),
        ("MCP_GATEWAY_LOG", "debug"),
    ];
    let gw = Gateway::start_with_env(&cfg, &env);
    let s = gw.session().await;
    let get = |server: &'static str, var: &'static str| {
        let s = &s;
        async move { text(&s.call(&format!("{server}__env"), json!({"name": var})).await) }
    };
    assert_eq!(get("keeper", "SECRET_X").await, secret);
    assert_eq!(get("keeper", "MODE").await, "fast");
    assert_eq!(get("keeper", "MODE2").await, "gw-only");
    for server in ["keeper", "other"] {
        for var in ["GW_ONLY_VAR", "TEST_SECRET", "CARGO_MANIFEST_DIR", "MCP_GATEWAY_LOG"] {
            assert_eq!(get(server, var).await, "<unset>", "{server} sees {var}");
        }
        assert_ne!(get(server, "PATH").await, "<unset>", "{server} should inherit PATH");
    }
    assert_eq!(get("other", "SECRET_X").await, "<unset>");
    assert_eq!(get("other", "MODE").await, "<unset>");
    assert_eq!(
        get("keeper", "HOME").await,
        std::env::var("HOME").unwrap_or_else(|_| "<unset>".into())
    );

    let status = gw.get_text("/status").await;
    assert!(status.contains("keeper"), "{status}");
    assert!(!status.contains(&secret), "secret in /status");
    // Debug logging is on: an unknown client notification is logged at debug level.
    s.notify("notifications/whatever", json!({})).await;
    assert!(
        gw.wait_log("DEBUG", Duration::from_secs(5)).await,
        "debug logging not on:\n{}",
        gw.logs()
    );
    assert!(!gw.logs().contains(&secret), "secret in the gateway log");

    let (run, _dir) = check(&cfg, &["--connect"], &env);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("server keeper: ready"), "{}", run.stdout);
    assert!(
        !run.stdout.contains(&secret) && !run.stderr.contains(&secret),
        "secret in check --connect output"
    );
    drop(gw);
}

#[tokio::test]
async fn sigterm_stops_serve_and_its_children() {
    let (a, b) = (unique("term-a"), unique("term-b"));
    let mut gw = Gateway::start(&[server("a", &a, &[], ""), server("b", &b, &[], "")].concat());
    let s = gw.session().await;
    assert_eq!(text(&s.call("a__echo", json!({"text": "x"})).await), "x");
    assert_eq!(text(&s.call("b__echo", json!({"text": "y"})).await), "y");
    let children = [mock_pids(&a), mock_pids(&b)].concat();
    assert_eq!(children.len(), 2, "{children:?}");
    let t0 = Instant::now();
    let status = gw.terminate();
    assert!(status.success(), "{status:?}\n{}", gw.logs());
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert!(
        mock_pids(&a).is_empty() && mock_pids(&b).is_empty(),
        "children left behind"
    );
    assert!(children.iter().all(|&p| !alive(p)));
}

#[tokio::test]
async fn sigterm_with_an_open_get_stream_exits_promptly() {
    let a = unique("term-get");
    let mut gw = Gateway::start(&server("a", &a, &[], ""));
    let s = gw.session().await;
    let mut get = s.get_stream().await;
    let t0 = Instant::now();
    let status = gw.terminate();
    assert!(status.success(), "{status:?}\n{}", gw.logs());
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert!(
        get.next(Duration::from_secs(5)).await.is_none(),
        "GET stream should end"
    );
    assert!(mock_pids(&a).is_empty(), "children left behind");
}

/// A credential given to a stdio server in its `args` (`${VAR}`) reaches the child
/// expanded, and is masked wherever the child's stderr is shown: the log and `check`.
#[test]
fn a_secret_in_args_reaches_the_child_and_is_masked_in_what_it_prints() {
    let config = "[servers.leaky]\ncommand = \"sh\"\n\
                  args = [\"-c\", \"echo my arg is $$0 >&2; exit 3\", \"pw-${LEAKY_SECRET}-end\"]\n\
                  restart = \"never\"\n";
    let (run, _dir) = check(config, &["--connect"], &[("LEAKY_SECRET", "hunter2hunter2")]);
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(
        all.contains("my arg is pw-***-end"),
        "the child got the value, shown masked:\n{all}"
    );
    assert!(!all.contains("hunter2"), "{all}");
    // Unset, it is an error naming the argument, before any child starts.
    check_refuses(
        config,
        "servers.leaky.args[2]: environment variable LEAKY_SECRET is not set",
    );
}
