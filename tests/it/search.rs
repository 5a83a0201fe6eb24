//! Tool search mode (`[gateway] search = true`): `tools/list` has the gateway's two tools;
//! `gateway__search_tools` finds tools (only those the client may see), `gateway__call_tool`
//! calls them as `tools/call` would, and every public name stays callable directly. Real
//! binary, real mock servers, and the official Python and TypeScript SDK clients.

use crate::common::*;
use crate::interop::{require_deps, run_client, venv_python};
use serde_json::{json, Value};

const ALICE: &str = "alice-search-token-4b1d";
const BOB: &str = "bob-search-token-93ce";

/// Two mock servers, `calc` and `docs`, in search mode; alice may use calc only.
fn config(clients: bool) -> String {
    let clients = if clients {
        format!("[clients.alice]\ntoken = {ALICE:?}\nallow = [\"calc__*\"]\n\n[clients.bob]\ntoken = {BOB:?}\n\n")
    } else {
        String::new()
    };
    format!(
        "[gateway]\nsearch = true\n\n{clients}[servers.calc]\n{}\n[servers.docs]\n{}",
        mock(&unique("calc"), &[]),
        mock(&unique("docs"), &[])
    )
}

/// `gateway__search_tools` with `args`: the whole response.
async fn search(s: &Session, args: Value) -> Value {
    s.call("gateway__search_tools", args).await
}

/// The names a search found, checking that the text block holds the same JSON.
fn found(r: &Value) -> Vec<String> {
    let structured = &r["result"]["structuredContent"];
    let text: Value = serde_json::from_str(&text(r)).unwrap();
    assert_eq!(&text, structured, "the text block is the structured content");
    structured["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {r}"))
        .iter()
        .map(|t| {
            assert!(t["inputSchema"].is_object() && t["description"].is_string(), "{t}");
            t["name"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test]
async fn search_mode_lists_two_tools_finds_a_tool_and_calls_it_both_ways() {
    let gw = Gateway::start(&config(false));
    let s = gw.session().await;
    assert_eq!(s.tool_names().await, ["gateway__search_tools", "gateway__call_tool"]);
    let tools = s.list("tools/list", "tools").await;
    assert!(tools[0]["description"].as_str().unwrap().contains("gateway__call_tool"));
    assert_eq!(tools[1]["inputSchema"]["required"], json!(["name", "arguments"]));

    let names = found(&search(&s, json!({"query": "sum two numbers"})).await);
    assert!(
        names.len() >= 2 && names[..2].iter().all(|n| n.ends_with("__add")),
        "both servers' add come first: {names:?}"
    );
    let one = found(&search(&s, json!({"query": "echo some text back", "limit": 1})).await);
    assert_eq!(one.len(), 1);
    assert!(one[0].ends_with("__echo"), "{one:?}");

    let via = s
        .call(
            "gateway__call_tool",
            json!({"name": "calc__add", "arguments": {"a": 2, "b": 3}}),
        )
        .await;
    assert_eq!(text(&via), "5", "{via}");
    assert_eq!(
        text(&s.call("calc__add", json!({"a": 2, "b": 3})).await),
        "5",
        "direct tools/call"
    );

    // Its progress comes as the tool's own would, on the call's stream.
    let all = s
        .request_all(
            json!(9),
            "tools/call",
            json!({"name": "gateway__call_tool", "arguments": {"name": "calc__slow", "arguments": {"seconds": 0.2, "steps": 2}},
                   "_meta": {"progressToken": "p1"}}),
        )
        .await;
    let progress: Vec<&Value> = all.iter().filter(|m| m["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 2, "{all:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "p1");
    assert!(all.last().unwrap()["result"].is_object(), "{all:?}");

    // Errors are tools/call's own, and bad arguments name their field.
    let e = s
        .call("gateway__call_tool", json!({"name": "calc__nope", "arguments": {}}))
        .await;
    assert_eq!(e["error"]["code"], -32602, "{e}");
    assert_eq!(e["error"]["data"], json!({"tool": "calc__nope"}));
    assert_eq!(
        e,
        s.call("calc__nope", json!({})).await,
        "the same error as tools/call's"
    );
    for (args, field) in [
        (json!({"arguments": {}}), "arguments.name"),
        (json!({"name": "calc__add", "arguments": [1]}), "arguments.arguments"),
    ] {
        let e = s.call("gateway__call_tool", args).await;
        assert_eq!(e["error"]["code"], -32602, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(field), "{e}");
    }
    for (args, field) in [
        (json!({}), "arguments.query"),
        (json!({"query": "x", "limit": 51}), "arguments.limit"),
        (json!({"query": "x", "limit": "all"}), "arguments.limit"),
    ] {
        let e = search(&s, args).await;
        assert_eq!(e["error"]["code"], -32602, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(field), "{e}");
    }
    // An object whose text no string can hold (a lone surrogate escape) is said to be one,
    // not to be no object.
    let (_, body) = s
        .post_text(
            r#"{"jsonrpc":"2.0","id":"ls","method":"tools/call","params":{"name":"gateway__search_tools","arguments":{"query":"\ud800"}}}"#,
        )
        .await;
    assert!(
        body.contains("-32602") && body.contains("arguments cannot be read"),
        "{body}"
    );
}

/// A query of many different words, or one long word, costs the gateway's thread time
/// for each: one that long is refused by its size, naming the field, and a query at the
/// limit is still answered (and the gateway with it).
#[tokio::test]
async fn a_huge_query_is_refused_by_its_size_and_one_at_the_limit_is_answered() {
    let gw = Gateway::start(&config(false));
    let s = gw.session().await;
    let distinct: String = (0..40_000u32).map(|i| format!("w{i:x}q ")).collect();
    for q in [distinct, "x".repeat(360_000)] {
        let e = search(&s, json!({"query": q})).await;
        assert_eq!(e["error"]["code"], -32602, "{e}");
        let m = e["error"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("arguments.query is") && m.contains("longer than the 2048 allowed"),
            "{m}"
        );
    }
    let at_limit: String = (0..400u32).map(|i| format!("w{i:x}q ")).collect::<String>()[..2048].to_owned();
    let r = search(&s, json!({"query": at_limit})).await;
    assert!(r["result"]["structuredContent"]["tools"].is_array(), "{r}");
    let names = found(&search(&s, json!({"query": "sum two numbers"})).await);
    assert!(names.iter().any(|n| n.ends_with("__add")), "{names:?}");
}

#[tokio::test]
async fn a_search_shows_only_what_the_client_may_see() {
    let gw = Gateway::start(&config(true));
    let alice = Session::open_as(&gw.url, ALICE).await;
    let bob = Session::open_as(&gw.url, BOB).await;
    // The two tools are listed whatever the allowlist says.
    assert_eq!(
        alice.tool_names().await,
        ["gateway__search_tools", "gateway__call_tool"]
    );
    let q = json!({"query": "add numbers", "limit": 50});
    let seen = found(&search(&alice, q.clone()).await);
    assert!(seen.contains(&"calc__add".to_owned()), "{seen:?}");
    assert!(
        seen.iter().all(|n| n.starts_with("calc__")),
        "alice sees calc only: {seen:?}"
    );
    let all = found(&search(&bob, q).await);
    assert!(all.contains(&"docs__add".to_owned()), "{all:?}");
    // A hidden tool is unknown through the gateway's tool exactly as by tools/call.
    let e = alice
        .call(
            "gateway__call_tool",
            json!({"name": "docs__add", "arguments": {"a": 1, "b": 1}}),
        )
        .await;
    assert_eq!(e["error"]["data"], json!({"tool": "docs__add"}), "{e}");
    assert_eq!(e, alice.call("docs__add", json!({"a": 1, "b": 1})).await);
    let ok = bob
        .call(
            "gateway__call_tool",
            json!({"name": "docs__add", "arguments": {"a": 1, "b": 1}}),
        )
        .await;
    assert_eq!(text(&ok), "2");
}

#[tokio::test]
async fn a_tool_a_server_adds_is_found_after_its_list_changed() {
    let gw = Gateway::start(&config(false));
    let s = gw.session().await;
    assert!(found(&search(&s, json!({"query": "frobnicate widgets"})).await).is_empty());
    let r = s.call("calc__add_tool", json!({"name": "frobnicate_widgets"})).await;
    assert_eq!(text(&r), "added");
    let mut names = Vec::new();
    for _ in 0..100 {
        names = found(&search(&s, json!({"query": "frobnicate widgets"})).await);
        if !names.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        names,
        ["calc__frobnicate_widgets"],
        "the index was rebuilt with the catalog"
    );
    let r = s
        .call(
            "gateway__call_tool",
            json!({"name": "calc__frobnicate_widgets", "arguments": {"text": "w"}}),
        )
        .await;
    assert_eq!(text(&r), "w");
}

#[tokio::test]
async fn without_search_mode_the_catalog_is_listed_and_a_server_named_gateway_cannot_take_the_names() {
    let cfg = format!("[servers.gateway]\n{}", mock(&unique("gw"), &[]));
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let r = s.call("gateway__add_tool", json!({"name": "search_tools"})).await;
    assert_eq!(text(&r), "added");
    let mut names = Vec::new();
    for _ in 0..100 {
        names = s.tool_names().await;
        if names.iter().any(|n| n.starts_with("gateway__search_tools_")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(names.contains(&"gateway__echo".to_owned()), "{names:?}");
    let renamed = names
        .iter()
        .find(|n| n.starts_with("gateway__search_tools_"))
        .unwrap_or_else(|| panic!("the server's search_tools gets the hashed name: {names:?}"));
    assert!(!names.contains(&"gateway__search_tools".to_owned()), "{names:?}");
    assert_eq!(text(&s.call(renamed, json!({"text": "mine"})).await), "mine");
    // Search mode is off: the gateway's own tools do not exist here.
    let e = s.call("gateway__search_tools", json!({"query": "x"})).await;
    assert_eq!(e["error"]["data"], json!({"tool": "gateway__search_tools"}), "{e}");
    assert!(
        gw.logs().contains("gateway__search_tools is the gateway's own"),
        "{}",
        gw.logs()
    );
}

/// The official SDK clients find a tool through search mode and call it both ways.
async fn sdk_client(label: &str, program: &str, argv: Vec<String>, gw: &Gateway) -> Value {
    let ctx = || format!("gateway stderr:\n{}", gw.logs());
    let (out, _) = run_client(label, program, &argv, &ctx).await;
    assert_eq!(
        out["tools"],
        json!(["gateway__search_tools", "gateway__call_tool"]),
        "{label}: {out}"
    );
    let found: Vec<&str> = out["found"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(found[0].ends_with("__add"), "{label}: {out}");
    assert!(out["foundSchema"]["properties"]["a"].is_object(), "{label}: {out}");
    assert_eq!(out["textMatches"], true, "{label}: {out}");
    assert_eq!(out["viaGateway"][0]["text"], "42", "{label}: {out}");
    assert_eq!(out["direct"][0]["text"], "42", "{label}: {out}");
    out
}

#[tokio::test]
async fn python_sdk_client_searches_and_calls_in_both_eras() {
    require_deps();
    let gw = Gateway::start(&config(false));
    for mode in ["legacy", "auto"] {
        let argv = vec![
            "tests/interop/py_search.py".into(),
            gw.url.clone(),
            "--mode".into(),
            mode.into(),
            "--query".into(),
            "add two numbers together".into(),
            "--args".into(),
            json!({"a": 40, "b": 2}).to_string(),
        ];
        let out = sdk_client(&format!("py search ({mode})"), &path_str(&venv_python()), argv, &gw).await;
        let version = if mode == "auto" { "2026-07-28" } else { "2025-11-25" };
        assert_eq!(out["protocolVersion"], version, "{out}");
    }
}

#[tokio::test]
async fn typescript_sdk_client_searches_and_calls() {
    require_deps();
    let gw = Gateway::start(&config(false));
    let argv = vec![
        "tests/interop/ts_search.mjs".into(),
        "--url".into(),
        gw.url.clone(),
        "--query".into(),
        "add two numbers together".into(),
        "--args".into(),
        json!({"a": 40, "b": 2}).to_string(),
    ];
    sdk_client("ts search", "node", argv, &gw).await;
}

#[test]
fn search_mode_holds_over_stdio_too() {
    let mut gw = StdioGateway::start(&config(false), &[]);
    gw.initialize();
    let (_, list) = gw.request(json!(2), "tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}\n{}", gw.logs()))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gateway__search_tools", "gateway__call_tool"]);
    let (_, r) = gw.request(
        json!(3),
        "tools/call",
        json!({"name": "gateway__search_tools", "arguments": {"query": "add numbers", "limit": 2}}),
    );
    assert!(found(&r).iter().all(|n| n.ends_with("__add")), "{r}");
    let (_, r) = gw.request(
        json!(4),
        "tools/call",
        json!({"name": "gateway__call_tool", "arguments": {"name": "docs__add", "arguments": {"a": 1, "b": 2}}}),
    );
    assert_eq!(text(&r), "3", "{r}");
}

#[tokio::test]
async fn a_profile_with_search_finds_only_its_own_tools_and_the_others_list_theirs() {
    let config = format!(
        "[profiles.lean]\nservers = [\"calc\"]\nsearch = true\n\n[profiles.full]\nservers = [\"calc\"]\n\n[servers.calc]\n{}\n[servers.docs]\n{}",
        mock(&unique("calc"), &[]),
        mock(&unique("docs"), &[])
    );
    let gw = Gateway::start(&config);
    let lean = Session::open(&format!("{}/lean", gw.url)).await;
    let names = lean.tool_names().await;
    assert_eq!(names, vec!["gateway__search_tools", "gateway__call_tool"], "{names:?}");
    // Both servers have an echo: only the profile's is found.
    let hits = found(&search(&lean, json!({"query": "echo the given text", "limit": 50})).await);
    assert!(hits.contains(&"calc__echo".to_owned()), "{hits:?}");
    assert!(hits.iter().all(|h| h.starts_with("calc__")), "{hits:?}");
    let r = lean
        .call(
            "gateway__call_tool",
            json!({"name": "docs__echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert!(
        r.get("error").is_some() || r["result"]["isError"] == true,
        "outside the profile: {r}"
    );
    // Another profile and /mcp itself are not in search mode.
    let full = Session::open(&format!("{}/full", gw.url)).await;
    assert!(full.tool_names().await.contains(&"calc__echo".to_owned()));
    assert!(gw.session().await.tool_names().await.contains(&"docs__echo".to_owned()));
}

/// The sentence-embedding model scripts/setup-test-deps installs (or
/// `MCP_GATEWAY_SEARCH_MODEL`); missing, the test fails saying how to get it.
fn model_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("MCP_GATEWAY_SEARCH_MODEL").map_or_else(
        || repo().join(".venv/models/all-MiniLM-L6-v2"),
        std::path::PathBuf::from,
    );
    assert!(
        dir.join("model.safetensors").exists(),
        "no search model at {} (scripts/setup-test-deps installs it; or set MCP_GATEWAY_SEARCH_MODEL)",
        dir.display()
    );
    dir
}

fn model_config(model: &std::path::Path) -> String {
    format!(
        "[gateway]\nsearch = true\nsearch_model = {:?}\n\n[servers.calc]\n{}\n[servers.docs]\n{}",
        model.display().to_string(),
        mock(&unique("calc"), &[]),
        mock(&unique("docs"), &[])
    )
}

/// Waits for the gateway's log to say `needle` (the event the test needs); false after 60 s.
fn wait_log(gw: &Gateway, needle: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if gw.logs().contains(needle) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn with_a_model_a_request_in_other_words_finds_the_tool() {
    // "take a short nap" shares no word with "slow: Sleep for `seconds`, ...".
    let query = json!({"query": "take a short nap", "limit": 3});
    let plain = Gateway::start(&config(false));
    let words = found(&search(&plain.session().await, query.clone()).await);
    assert!(
        !words.first().is_some_and(|n| n.ends_with("__slow")),
        "by words alone slow is not found first: {words:?}"
    );

    let gw = Gateway::start(&model_config(&model_dir()));
    assert!(wait_log(&gw, "tool search vectors ready"), "{}", gw.logs());
    let s = gw.session().await;
    let names = found(&search(&s, query).await);
    assert!(
        names.len() >= 2 && names[..2].iter().all(|n| n.ends_with("__slow")),
        "both servers' slow come first: {names:?}"
    );
    // Words still count: the tool a request names comes first.
    let names = found(&search(&s, json!({"query": "echo some text back", "limit": 1})).await);
    assert!(names[0].ends_with("__echo"), "{names:?}");
    // A request meaning nothing the tools do finds nothing, not the nearest noise.
    let none = found(&search(&s, json!({"query": "zxqv frobnicate quux"})).await);
    assert!(none.is_empty(), "{none:?}");
    // A tool a server adds gets its vector too: found by meaning after list_changed (its
    // description says "echo tool": only its name says multiply).
    let r = s.call("calc__add_tool", json!({"name": "multiply_numbers"})).await;
    assert_eq!(text(&r), "added");
    assert!(wait_log(&gw, "tool search vectors ready tools=19"), "{}", gw.logs());
    let names = found(&search(&s, json!({"query": "compute the product of six and seven", "limit": 5})).await);
    assert!(names.iter().any(|n| n == "calc__multiply_numbers"), "{names:?}");
}

#[tokio::test]
async fn a_folder_that_is_no_model_fails_check_and_search_goes_on_by_words() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"bert\"").unwrap();
    let config = model_config(dir.path());
    let gw = Gateway::start(&config);
    assert!(
        wait_log(&gw, "tool search model not loaded, searching by words only"),
        "{}",
        gw.logs()
    );
    assert!(
        gw.logs().contains("config.json"),
        "the warning names the file: {}",
        gw.logs()
    );
    let s = gw.session().await;
    let one = found(&search(&s, json!({"query": "echo some text back", "limit": 1})).await);
    assert!(one[0].ends_with("__echo"), "{one:?}");

    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(gw.config_path())
        .env_remove("MCP_GATEWAY_CONFIG")
        .output()
        .expect("run mcp-gateway check");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("search model: ERROR") && said.contains("config.json"),
        "{said}"
    );
    let good = tempfile::tempdir().unwrap();
    std::fs::write(good.path().join("gateway.toml"), model_config(&model_dir())).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(good.path().join("gateway.toml"))
        .env_remove("MCP_GATEWAY_CONFIG")
        .output()
        .expect("run mcp-gateway check");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("(384 dimensions)"), "{said}");
}
