//! The merged catalog over real children: prefixes, filters, collisions, long names,
//! downstream pagination, and calls of every kind routed to every server.

use crate::common::*;
use serde_json::{json, Value};

struct Names {
    alpha: String,
    first: String,
    second: String,
    long: String,
}

const LONG_PREFIX_LEN: usize = 60;

/// Four servers: `alpha` (prefix "a", deny globs), `first` and `second` (both unprefixed,
/// so they collide), and `long` (a 60-character prefix, paginating 2 items per page).
fn config() -> (String, Names) {
    let n = Names {
        alpha: unique("alpha"),
        first: unique("first"),
        second: unique("second"),
        long: unique("long"),
    };
    let long_prefix = "g".repeat(LONG_PREFIX_LEN);
    let cfg = [
        server(
            "alpha",
            &n.alpha,
            &[],
            "prefix = \"a\"\ntools = { allow = [\"*\"], deny = [\"crash\", \"b?g\", \"add_*\"] }",
        ),
        server(
            "first",
            &n.first,
            &[],
            "prefix = \"\"\nenv = { WHO = \"first\" }\ntools = { allow = [\"e*\", \"add\"] }",
        ),
        server(
            "second",
            &n.second,
            &[],
            "prefix = \"\"\nenv = { WHO = \"second\" }\ntools = { allow = [\"e*\"], deny = [\"echo_meta\"] }",
        ),
        server(
            "long",
            &n.long,
            &["--page-size", "2", "--tools", "7"],
            &format!("prefix = \"{long_prefix}\""),
        ),
    ]
    .concat();
    (cfg, n)
}

fn names(list: &[Value]) -> Vec<String> {
    list.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

fn is_hashed_form(name: &str, stem: &str) -> bool {
    let Some(rest) = name.strip_prefix(stem).and_then(|r| r.strip_prefix('_')) else {
        return false;
    };
    rest.len() == 8 && rest.chars().all(|c| c.is_ascii_hexdigit())
}

#[tokio::test]
async fn lists_are_merged_with_prefixes_filters_collisions_and_long_names() {
    let (cfg, n) = config();
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let tools = s.list("tools/list", "tools").await;
    let tool_names = names(&tools);
    let has = |n: &str| tool_names.iter().any(|t| t == n);

    // Prefixed, with deny globs applied ("crash", "b?g" = big, "add_*" = add_tool).
    for t in ["a__echo", "a__add", "a__slow", "a__log", "a__env", "a__echo_meta"] {
        assert!(has(t), "{t} missing from {tool_names:?}");
    }
    for t in ["a__crash", "a__big", "a__add_tool"] {
        assert!(!has(t), "{t} should be filtered out");
    }
    // prefix = "" gives bare names; allow globs keep only e* and add.
    for t in ["echo", "add", "env", "echo_meta"] {
        assert!(has(t), "{t} missing from {tool_names:?}");
    }
    assert!(
        !has("slow") && !has("crash") && !has("log"),
        "allow list not applied: {tool_names:?}"
    );

    // Collision: `first` (earlier in the file) keeps echo/env; `second` gets hashed names.
    let second_echo = tool_names
        .iter()
        .find(|t| is_hashed_form(t, "echo"))
        .expect("hashed echo of second")
        .clone();
    let second_env = tool_names
        .iter()
        .find(|t| is_hashed_form(t, "env"))
        .expect("hashed env of second")
        .clone();
    assert!(second_echo.len() <= 64 && second_env.len() <= 64);
    assert!(
        !tool_names.iter().any(|t| is_hashed_form(t, "echo_meta")),
        "second's echo_meta is denied"
    );
    assert_eq!(text(&s.call("env", json!({"name": "WHO"})).await), "first");
    assert_eq!(text(&s.call(&second_env, json!({"name": "WHO"})).await), "second");
    assert_eq!(text(&s.call(&second_echo, json!({"text": "hi"})).await), "hi");

    // Long prefix: every name is shortened to exactly 64 characters, unique, callable;
    // and all 16 tools (9 built-in + 7) arrived through pages of 2.
    let stem = "g".repeat(55);
    let long: Vec<&Value> = tools
        .iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with(&stem))
        .collect();
    assert_eq!(
        long.len(),
        16,
        "pagination not followed: {:?}",
        names(&long.iter().map(|v| (*v).clone()).collect::<Vec<_>>())
    );
    let mut seen = std::collections::HashSet::new();
    for t in &long {
        let name = t["name"].as_str().unwrap();
        assert_eq!(name.len(), 64, "{name}");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)),
            "{name}"
        );
        assert!(seen.insert(name.to_string()), "duplicate {name}");
    }
    for i in 0..7 {
        let desc = format!("Trivial tool {i}: echoes its arguments as JSON.");
        assert!(
            long.iter().any(|t| t["description"] == desc.as_str()),
            "tool_{i} of long missing"
        );
    }
    let long_add = long.iter().find(|t| t["description"] == "Add two numbers.").unwrap()["name"]
        .as_str()
        .unwrap();
    assert_eq!(text(&s.call(long_add, json!({"a": 2, "b": 40})).await), "42");
    let long_t6 = long
        .iter()
        .find(|t| t["description"].as_str().unwrap().starts_with("Trivial tool 6"))
        .unwrap();
    assert_eq!(
        text(&s.call(long_t6["name"].as_str().unwrap(), json!({"k": 1})).await),
        "{\"k\":1}"
    );
    // Nothing else: 6 + 4 + 2 + 16.
    assert_eq!(tools.len(), 28, "{tool_names:?}");

    // Prompts, resources and templates are merged too.
    let prompts = names(&s.list("prompts/list", "prompts").await);
    assert_eq!(prompts.len(), 4, "{prompts:?}");
    assert!(
        prompts.contains(&"a__greet".into()) && prompts.contains(&"greet".into()),
        "{prompts:?}"
    );
    assert!(prompts.iter().any(|p| is_hashed_form(p, "greet")), "{prompts:?}");
    assert!(
        prompts.iter().any(|p| p.starts_with(&stem) && p.len() == 64),
        "{prompts:?}"
    );
    let resources = s.list("resources/list", "resources").await;
    let uris: Vec<&str> = resources.iter().map(|r| r["uri"].as_str().unwrap()).collect();
    let templates = s.list("resources/templates/list", "resourceTemplates").await;
    let tpls: Vec<&str> = templates.iter().map(|r| r["uriTemplate"].as_str().unwrap()).collect();
    for m in [&n.alpha, &n.first, &n.second, &n.long] {
        assert!(uris.contains(&format!("mock://{m}/readme").as_str()), "{uris:?}");
        assert!(tpls.contains(&format!("mock://{m}/items/{{id}}").as_str()), "{tpls:?}");
    }
    assert_eq!((uris.len(), tpls.len()), (4, 4));

    // A denied tool is not routed even when called by its would-be name.
    let r = s.call("a__crash", json!({})).await;
    assert!(error_of(&r)["message"].as_str().unwrap().contains("a__crash"), "{r}");
}

#[tokio::test]
async fn check_connect_reports_the_collision() {
    let (cfg, _) = config();
    let (run, _dir) = check(&cfg, &["--connect"], &[]);
    assert_eq!(run.code, Some(0), "stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    let out = &run.stdout;
    let note = out
        .lines()
        .find(|l| l.contains("collision") && l.contains("echo") && !l.contains("echo_meta"))
        .unwrap_or_else(|| panic!("no collision note:\n{out}"));
    assert!(note.contains("'first'") && note.contains("'second'"), "{note}");
    let hashed = note.rsplit(' ').next().unwrap();
    assert!(is_hashed_form(hashed, "echo"), "{note}");
    // The catalog table lists the hashed name against server second.
    assert!(
        out.lines().any(|l| l.starts_with("tool")
            && l.contains(hashed)
            && l.contains("second")
            && l.trim_end().ends_with("echo")),
        "{out}"
    );
    for s in ["alpha", "first", "second", "long"] {
        assert!(out.contains(&format!("server {s}: ready")), "{out}");
    }
}

#[tokio::test]
async fn every_kind_of_call_reaches_every_server() {
    let (cfg, n) = config();
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let prompts = names(&s.list("prompts/list", "prompts").await);
    let tools = names(&s.list("tools/list", "tools").await);
    let long_stem = "g".repeat(55);
    let second_echo = tools.iter().find(|t| is_hashed_form(t, "echo")).unwrap().clone();
    let second_greet = prompts.iter().find(|p| is_hashed_form(p, "greet")).unwrap().clone();
    let long_greet = prompts.iter().find(|p| p.starts_with(&long_stem)).unwrap().clone();
    let long_echo = {
        let list = s.list("tools/list", "tools").await;
        list.iter()
            .find(|t| t["description"] == "Echo the given text." && t["name"].as_str().unwrap().starts_with(&long_stem))
            .unwrap()["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let cases = [
        (&n.alpha, "a__echo".to_string(), "a__greet".to_string()),
        (&n.first, "echo".into(), "greet".into()),
        (&n.second, second_echo, second_greet),
        (&n.long, long_echo, long_greet),
    ];
    for (i, (mock_name, echo, greet)) in cases.iter().enumerate() {
        let id = json!(100 + i);
        let r = s
            .call_id(id.clone(), echo, json!({"text": format!("to {mock_name}")}))
            .await;
        assert_eq!(r["id"], id);
        assert_eq!(text(&r), format!("to {mock_name}"));

        let r = s
            .request(
                json!(i),
                "prompts/get",
                json!({"name": greet, "arguments": {"name": mock_name}}),
            )
            .await;
        assert_eq!(
            r["result"]["messages"][0]["content"]["text"],
            format!("Hello, {mock_name}!"),
            "{r}"
        );

        let uri = format!("mock://{mock_name}/readme");
        let r = s.request(json!(i), "resources/read", json!({"uri": uri})).await;
        assert_eq!(
            r["result"]["contents"][0]["text"],
            format!("readme of {mock_name}"),
            "{r}"
        );
        assert_eq!(r["result"]["contents"][0]["uri"], uri.as_str());

        let uri = format!("mock://{mock_name}/items/{}", 40 + i);
        let r = s.request(json!(i), "resources/read", json!({"uri": uri})).await;
        assert_eq!(
            r["result"]["contents"][0]["text"],
            format!("item {} of {mock_name}", 40 + i),
            "{r}"
        );

        let r = s
            .request(
                json!(format!("c{i}")),
                "completion/complete",
                json!({"ref": {"type": "ref/prompt", "name": greet}, "argument": {"name": "name", "value": "a"}}),
            )
            .await;
        assert_eq!(r["id"], format!("c{i}"));
        assert_eq!(r["result"]["completion"]["values"], json!(["alice"]), "{r}");
    }
    let r = s.request(json!(7), "ping", json!({})).await;
    assert_eq!(r, json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
}

/// `/status` counts what clients see of each server (its `tools` filter applied, a
/// resource another server lists first left out), with the server's own totals beside
/// them; the status page shows "seen of total" where they differ.
#[tokio::test]
async fn status_counts_what_clients_see_beside_each_servers_totals() {
    let (f, o, d) = (unique("filtered"), unique("open"), unique("dupres"));
    let cfg = [
        server("calc", &f, &[], "tools = { allow = [\"echo\", \"add\"] }"),
        server("open", &o, &[], ""),
        // Lists the same resource URI as `open` (its --name wins): `open` owns it.
        server("dup", &d, &["--name", &o], ""),
    ]
    .concat();
    let gw = Gateway::start(&cfg);
    let s = gw.session().await;
    let tools = s.tool_names().await;
    let seen = |p: &str| tools.iter().filter(|t| t.starts_with(p)).count();
    let total = seen("open__");
    assert!(total > 2, "{tools:?}");
    assert_eq!(seen("calc__"), 2, "{tools:?}");

    let st = gw.server_status("calc").await;
    let counts = |st: &Value| {
        [
            "tools",
            "toolsTotal",
            "prompts",
            "promptsTotal",
            "resources",
            "resourcesTotal",
        ]
        .map(|k| st[k].as_u64())
    };
    let n = |v: usize| Some(v as u64);
    assert_eq!(counts(&st), [n(2), n(total), n(1), n(1), n(1), n(1)], "{st}");
    let st = gw.server_status("open").await;
    assert_eq!(counts(&st), [n(total), n(total), n(1), n(1), n(1), n(1)], "{st}");
    let st = gw.server_status("dup").await;
    assert_eq!(counts(&st), [n(total), n(total), n(1), n(1), n(0), n(1)], "{st}");

    // The console shows "2 of N" where clients see fewer than the server lists.
    let profile = tempfile::tempdir().unwrap();
    let page = crate::console::dom(profile.path(), &format!("{}/", gw.base));
    let calc = crate::console::card(&page, "calc");
    assert!(
        calc.contains(&format!("<span>tools</span><b>2 of {total}</b>")),
        "{calc}"
    );
    let dup = crate::console::card(&page, "dup");
    assert!(dup.contains("<span>resources</span><b>0 of 1</b>"), "{dup}");
}

/// A server that says tools/list_changed without pause (200 times, 5 ms apart) is
/// re-listed at most every 250 ms, and its clients told as often, not 200 times; a real
/// change after it still reaches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_changed_storm_is_not_a_relist_storm() {
    let gw = Gateway::start(&server("calc", "calc", &[], ""));
    let s = gw.session().await;
    let mut stream = s.get_stream().await;
    let started = std::time::Instant::now();
    let r = s
        .call("calc__add_tool", json!({"name": "-", "announce": 200, "every_ms": 5}))
        .await;
    assert_eq!(text(&r), "announced", "{r}");
    let r = s.call("calc__add_tool", json!({"name": "after_storm"})).await;
    assert_eq!(text(&r), "added", "{r}");
    // Told at most every 250 ms: a pause of 600 ms means the re-lists are over.
    let mut heard = 0;
    while let Some(m) = stream.next(std::time::Duration::from_millis(600)).await {
        assert_eq!(m["method"], "notifications/tools/list_changed", "{m}");
        heard += 1;
    }
    let tools = s.list("tools/list", "tools").await;
    assert!(tools.iter().any(|t| t["name"] == "calc__after_storm"), "{tools:?}");
    // One re-list at once, then one every 250 ms at most, over the storm and the wait.
    let most = 2 + (started.elapsed().as_millis() / 250) as usize;
    assert!(
        heard >= 1 && heard <= most,
        "{heard} list_changed in {:?}",
        started.elapsed()
    );
}
