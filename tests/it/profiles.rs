//! `[profiles.NAME]` and `?tags=`: more endpoints over one set of servers, each with its
//! own lists and its own list_changed, in both eras, over HTTP and `stdio --profile`,
//! with the allowlist applied inside; a session belongs to the endpoint that opened it.
//! The official Python and TypeScript SDK clients list and call through a profile URL.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
/// How long a stream is watched for a notification that must not come.
const QUIET: Duration = Duration::from_millis(800);

/// The mock's tools, by their own names.
const MOCK_TOOLS: &[&str] = &[
    "echo",
    "add",
    "slow",
    "log",
    "big",
    "crash",
    "env",
    "echo_meta",
    "add_tool",
];

/// Servers a (tag web), b (tag db) and c (tags web and db), then `extra`.
fn three(extra: &str) -> String {
    format!(
        "{}{}{}{extra}",
        server("a", &unique("pa"), &[], "tags = [\"web\"]\n"),
        server("b", &unique("pb"), &[], "tags = [\"db\"]\n"),
        server("c", &unique("pc"), &[], "tags = [\"web\", \"db\"]\n"),
    )
}

fn names(items: &[Value], field: &str) -> BTreeSet<String> {
    items
        .iter()
        .map(|i| {
            i[field]
                .as_str()
                .unwrap_or_else(|| panic!("no {field} in {i}"))
                .to_owned()
        })
        .collect()
}

/// Every public tool name of the mock servers `servers` (by table name).
fn tools_of(servers: &[&str]) -> BTreeSet<String> {
    servers
        .iter()
        .flat_map(|s| MOCK_TOOLS.iter().map(move |t| format!("{s}__{t}")))
        .collect()
}

/// Every item of a list, following `nextCursor`.
async fn list_all(s: &Session, method: &str, key: &str) -> (Vec<Value>, usize) {
    let (mut items, mut pages, mut cursor) = (Vec::new(), 0, None::<Value>);
    loop {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({ "cursor": c }));
        let r = s.request(json!(pages), method, params).await;
        let result = &r["result"];
        items.extend(
            result[key]
                .as_array()
                .unwrap_or_else(|| panic!("{method}: {r}"))
                .iter()
                .cloned(),
        );
        pages += 1;
        match result.get("nextCursor") {
            Some(c) => cursor = Some(c.clone()),
            None => return (items, pages),
        }
        assert!(pages < 50, "{method}: no end to the pages");
    }
}

/// POSTs `body` to `url` as session `sid` (none: no session header): status and JSON.
async fn post_as(url: &str, sid: Option<&str>, body: Value) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(sid) = sid {
        r = r.header("mcp-session-id", sid);
    }
    let resp = r.json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let msgs = read_messages(resp).await;
    (status, msgs.into_iter().last().unwrap_or(Value::Null))
}

/// Whether a stream's next message, within `wait`, is `method`.
async fn next_is(stream: &mut Messages, method: &str, wait: Duration) -> bool {
    match stream.next(wait).await {
        Some(m) => {
            assert_eq!(m["method"], method, "{m}");
            true
        }
        None => false,
    }
}

/// Reads `stream` until `method` arrives (within [`T`]), then whatever follows within
/// [`QUIET`]: every method heard.
async fn heard(stream: &mut Messages, method: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + T;
    while !out.contains(method) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(m) = stream.next(left).await else { break };
        out.insert(m["method"].as_str().unwrap_or_default().to_owned());
    }
    while let Some(m) = stream.next(QUIET).await {
        out.insert(m["method"].as_str().unwrap_or_default().to_owned());
    }
    out
}

#[tokio::test]
async fn a_profile_has_its_own_paged_lists_and_hears_only_of_its_own_changes() {
    let cfg =
        three("[gateway]\npage_size = 4\n\n[profiles.front]\nservers = [\"a\"]\ntools = { deny = [\"*crash*\"] }\n");
    let gw = Gateway::start(&cfg);
    let p = Session::open(&format!("{}/front", gw.url)).await;
    let m = gw.session().await;

    // Its own lists, paged like the whole catalog's.
    let (tools, pages) = list_all(&p, "tools/list", "tools").await;
    let mut want = tools_of(&["a"]);
    want.remove("a__crash");
    assert_eq!(names(&tools, "name"), want);
    assert_eq!(pages, 2, "8 tools, 4 a page");
    let (prompts, _) = list_all(&p, "prompts/list", "prompts").await;
    assert_eq!(names(&prompts, "name"), BTreeSet::from(["a__greet".to_owned()]));
    let (resources, _) = list_all(&p, "resources/list", "resources").await;
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert!(
        resources[0]["uri"].as_str().unwrap().starts_with("mock://pa-"),
        "{resources:?}"
    );
    let (templates, _) = list_all(&p, "resources/templates/list", "resourceTemplates").await;
    assert_eq!(templates.len(), 1, "{templates:?}");
    let (all, _) = list_all(&m, "tools/list", "tools").await;
    assert_eq!(
        names(&all, "name"),
        tools_of(&["a", "b", "c"]),
        "/mcp stays the whole catalog"
    );
    assert_eq!(text(&p.call("a__echo", json!({"text": "in"})).await), "in");

    // Outside the profile: answered exactly like a name that does not exist.
    let unknown = |r: &Value, name: &str| {
        let r = r.to_string().replace(name, "NAME");
        serde_json::from_str::<Value>(&r).unwrap()
    };
    let nowhere = p.call("zz__nope", json!({})).await;
    for hidden in ["b__echo", "a__crash"] {
        let r = p.call(hidden, json!({"text": "x"})).await;
        assert_eq!(unknown(&r, hidden), unknown(&nowhere, "zz__nope"), "{r}");
    }
    let r = p.request(json!(5), "prompts/get", json!({"name": "b__greet"})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let complete =
        |name: &str| json!({"ref": {"type": "ref/prompt", "name": name}, "argument": {"name": "name", "value": "a"}});
    let r = p.request(json!(8), "completion/complete", complete("b__greet")).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = p.request(json!(9), "completion/complete", complete("a__greet")).await;
    assert_eq!(r["result"]["completion"]["values"], json!(["alice"]), "{r}");
    let b_readme = m
        .list("resources/list", "resources")
        .await
        .into_iter()
        .filter_map(|r| r["uri"].as_str().map(str::to_owned))
        .find(|u| u.starts_with("mock://pb-"))
        .unwrap();
    // A hidden server's resource is answered as one no server has: by the profile's one
    // resource server (an error to read, as it has no such resource; a subscription it
    // takes), the same words either way.
    for method in ["resources/read", "resources/subscribe"] {
        let r = p.request(json!(6), method, json!({"uri": b_readme})).await;
        if method == "resources/read" {
            assert!(r["error"]["code"].is_i64(), "{r}");
        }
        let nowhere = p.request(json!(6), method, json!({"uri": "mock://nowhere/x"})).await;
        assert_eq!(
            unknown(&r, &b_readme),
            unknown(&nowhere, "mock://nowhere/x"),
            "{method}: {r}"
        );
    }

    // A change outside the profile reaches /mcp's session, not the profile's.
    let mut p_get = p.get_stream().await;
    let mut m_get = m.get_stream().await;
    assert_eq!(text(&m.call("b__add_tool", json!({"name": "b_new"})).await), "added");
    assert!(
        next_is(&mut m_get, "notifications/tools/list_changed", T).await,
        "/mcp's session is told"
    );
    assert!(
        !next_is(&mut p_get, "notifications/tools/list_changed", QUIET).await,
        "the profile's session is not told of b's tool"
    );
    // One inside does.
    assert_eq!(text(&m.call("a__add_tool", json!({"name": "a_new"})).await), "added");
    assert!(
        next_is(&mut p_get, "notifications/tools/list_changed", T).await,
        "the profile's session is told of a's tool"
    );
    assert!(next_is(&mut m_get, "notifications/tools/list_changed", T).await);
    let (tools, _) = list_all(&p, "tools/list", "tools").await;
    assert!(names(&tools, "name").contains("a__a_new"), "{tools:?}");
    assert!(!names(&tools, "name").contains("b__b_new"), "{tools:?}");
    assert_eq!(text(&p.call("a__a_new", json!({"text": "new"})).await), "new");
}

#[tokio::test]
async fn tags_choose_servers_for_profiles_and_for_tag_queries() {
    let cfg = three("[profiles.web]\ntags = [\"web\"]\n\n[profiles.mixed]\nservers = [\"b\"]\ntags = [\"web\"]\n");
    let gw = Gateway::start(&cfg);
    let tools = |s: Session| async move { names(&s.list("tools/list", "tools").await, "name") };
    assert_eq!(
        tools(Session::open(&format!("{}/web", gw.url)).await).await,
        tools_of(&["a", "c"])
    );
    assert_eq!(
        tools(Session::open(&format!("{}/mixed", gw.url)).await).await,
        tools_of(&["a", "b", "c"])
    );
    for (query, want) in [
        ("db", &["b", "c"][..]),
        ("web,db", &["a", "b", "c"]),
        ("web+db", &["c"]),
        ("db%2Bweb", &["c"]),
        ("web", &["a", "c"]),
    ] {
        let s = Session::open(&format!("{}?tags={query}", gw.url)).await;
        assert_eq!(tools(s).await, tools_of(want), "?tags={query}");
    }
    // An unknown tag is 404 naming the tags there are; a broken query is 400.
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let (status, r) = post_as(&format!("{}?tags=nope", gw.url), None, init.clone()).await;
    assert_eq!(status, 404, "{r}");
    assert_eq!(r["id"], 1, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("\"nope\"") && msg.contains("db, web"), "{msg}");
    let (status, r) = post_as(&format!("{}?tags=a/b", gw.url), None, init.clone()).await;
    assert_eq!(status, 400, "{r}");
    let (status, r) = post_as(&format!("{}/web?tags=db", gw.url), None, init.clone()).await;
    assert_eq!(status, 400, "?tags= on a profile: {r}");
    // `tags` twice (which would a proxy in front read?) or without a value: 400, said.
    for q in ["tags=web&tags=db", "tags=&tags=web", "tags"] {
        let (status, r) = post_as(&format!("{}?{q}", gw.url), None, init.clone()).await;
        assert_eq!(status, 400, "?{q}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("?tags"), "?{q}: {r}");
    }

    // A tag query's session is told of its servers' changes only, and stays on its query.
    let db = Session::open(&format!("{}?tags=db", gw.url)).await;
    let other = gw.session().await;
    let mut db_get = db.get_stream().await;
    assert_eq!(text(&other.call("a__add_tool", json!({"name": "x"})).await), "added");
    assert!(!next_is(&mut db_get, "notifications/tools/list_changed", QUIET).await);
    assert_eq!(text(&other.call("c__add_tool", json!({"name": "y"})).await), "added");
    assert!(next_is(&mut db_get, "notifications/tools/list_changed", T).await);
    let list = json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}});
    let (status, _) = post_as(&gw.url, Some(&db.id), list.clone()).await;
    assert_eq!(status, 404, "a ?tags= session is not one of /mcp");
    let (status, r) = post_as(&format!("{}?tags=db,db", gw.url), Some(&db.id), list).await;
    assert_eq!(status, 200, "the same query, written another way: {r}");
}

#[tokio::test]
async fn an_allowlist_applies_inside_a_profile_as_the_intersection() {
    let cfg = three(
        "[clients.alice]\ntoken = \"alice-token\"\nallow = [\"a__echo\", \"a__add\", \"a__log\", \"b__*\"]\n\n\
         [profiles.p]\nservers = [\"a\"]\ntools = { deny = [\"*add*\"] }\n",
    );
    let gw = Gateway::start(&cfg);
    let http = reqwest::Client::new();
    let url = format!("{}/p", gw.url);
    let post = |body: Value, sid: Option<String>| {
        let mut r = http
            .post(&url)
            .bearer_auth("alice-token")
            .header("accept", "application/json, text/event-stream");
        if let Some(sid) = sid {
            r = r.header("mcp-session-id", sid);
        }
        r.json(&body).send()
    };
    let resp = post(
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    let sid = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let ask = |id: u64, method: &str, params: Value| {
        let body = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
        let sid = Some(sid.clone());
        let post = &post;
        async move { read_messages(post(body, sid).await.unwrap()).await.pop().unwrap() }
    };
    let r = ask(1, "tools/list", json!({})).await;
    assert_eq!(
        names(r["result"]["tools"].as_array().unwrap(), "name"),
        BTreeSet::from(["a__echo".to_owned(), "a__log".to_owned()]),
        "allowed and in the profile: {r}"
    );
    let r = ask(2, "tools/call", json!({"name": "a__echo", "arguments": {"text": "ok"}})).await;
    assert_eq!(text(&r), "ok");
    for hidden in ["a__add", "b__echo", "a__slow"] {
        let r = ask(3, "tools/call", json!({"name": hidden, "arguments": {}})).await;
        assert_eq!(r["error"]["code"], -32602, "{hidden}: {r}");
        assert_eq!(r["error"]["data"], json!({"tool": hidden}), "{r}");
    }
    // Without a token, 401 comes before any profile name is given away.
    let r = http
        .post(format!("{}/nope", gw.url))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Without the credential, no path under the endpoint names the profiles.
    for path in ["/nope", "/p/extra", "/", "//p"] {
        let r = http
            .post(format!("{}{path}", gw.url))
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path}");
        let body = r.text().await.unwrap();
        assert!(!body.contains("profiles"), "{path}: {body}");
    }
}

#[tokio::test]
async fn an_unknown_profile_is_404_naming_the_profiles_and_a_session_stays_on_its_endpoint() {
    let cfg = three("[profiles.a]\nservers = [\"a\"]\n\n[profiles.b]\nservers = [\"b\"]\n");
    let gw = Gateway::start(&cfg);
    let init = json!({"jsonrpc":"2.0","id":"i","method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
    let (status, r) = post_as(&format!("{}/nope", gw.url), None, init).await;
    assert_eq!(status, 404, "{r}");
    assert_eq!(r["id"], "i", "{r}");
    assert_eq!(r["error"]["data"]["profiles"], json!(["a", "b"]), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the profiles are a, b"),
        "{r}"
    );
    let r = reqwest::Client::new()
        .get(format!("{}/nope", gw.url))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Any other path under the endpoint says the same, not an empty 404.
    for path in ["/", "/a/", "/a/extra", "//a"] {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", gw.url))
            .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let body: Value = r.json().await.unwrap_or_default();
        assert_eq!(body["error"]["data"]["profiles"], json!(["a", "b"]), "{path}: {body}");
        assert_eq!(body["id"], 1, "{path}: answered under the request's id: {body}");
    }

    let a = Session::open(&format!("{}/a", gw.url)).await;
    let main = gw.session().await;
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}});
    for url in [format!("{}/b", gw.url), gw.url.clone()] {
        let (status, r) = post_as(&url, Some(&a.id), list.clone()).await;
        assert_eq!(status, 404, "{url}: {r}");
        let r = reqwest::Client::new()
            .get(&url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &a.id)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "GET {url}");
        let r = reqwest::Client::new()
            .delete(&url)
            .header("mcp-session-id", &a.id)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "DELETE {url}");
    }
    let (status, _) = post_as(&format!("{}/a", gw.url), Some(&main.id), list.clone()).await;
    assert_eq!(status, 404, "a session of /mcp is not one of /mcp/a");
    // Each still works where it was opened.
    assert_eq!(names(&a.list("tools/list", "tools").await, "name"), tools_of(&["a"]));
    assert_eq!(main.tool_names().await.len(), 3 * MOCK_TOOLS.len());
    let r = reqwest::Client::new()
        .delete(format!("{}/a", gw.url))
        .header("mcp-session-id", &a.id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A 2026-07-28 request to `url`: its status and response.
async fn stateless(url: &str, id: u64, method: &str, mut params: Value) -> (u16, Value) {
    params["_meta"] = stateless_meta("profiles-test");
    let mut r = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = params.get("name").and_then(Value::as_str) {
        r = r.header("mcp-name", n);
    }
    let resp = r
        .json(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, read_messages(resp).await.pop().unwrap())
}

#[tokio::test]
async fn stateless_requests_see_the_profile_too() {
    let cfg = three("[profiles.p]\nservers = [\"c\"]\n");
    let gw = Gateway::start(&cfg);
    let url = format!("{}/p", gw.url);
    let (status, r) = stateless(&url, 1, "tools/list", json!({})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        names(r["result"]["tools"].as_array().unwrap(), "name"),
        tools_of(&["c"])
    );
    let (_, r) = stateless(
        &url,
        2,
        "tools/call",
        json!({"name": "c__echo", "arguments": {"text": "s"}}),
    )
    .await;
    assert_eq!(text(&r), "s");
    let (_, r) = stateless(
        &url,
        3,
        "tools/call",
        json!({"name": "a__echo", "arguments": {"text": "s"}}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let (_, r) = stateless(&url, 4, "server/discover", json!({})).await;
    let instructions = r["result"]["instructions"].as_str().unwrap_or_default();
    assert!(
        instructions.contains("## c") && !instructions.contains("## a"),
        "only the profile's servers' instructions: {r}"
    );
    let (_, r) = stateless(&gw.url, 5, "tools/list", json!({})).await;
    assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 3 * MOCK_TOOLS.len());
    let (status, r) = stateless(&format!("{}/nope", gw.url), 6, "tools/list", json!({})).await;
    assert_eq!(status, 404, "{r}");
}

#[test]
fn stdio_profile_serves_the_profile_and_an_unknown_one_is_refused() {
    let cfg = three("[profiles.p]\nservers = [\"b\"]\ntools = { allow = [\"b__echo\", \"b__add\"] }\n");
    let mut gw = StdioGateway::start(&cfg, &[("MCP_GATEWAY_PROFILE", "p")]);
    gw.initialize();
    let (_, r) = gw.request(json!(1), "tools/list", json!({}));
    assert_eq!(
        names(r["result"]["tools"].as_array().unwrap(), "name"),
        BTreeSet::from(["b__add".to_owned(), "b__echo".to_owned()]),
        "{r}"
    );
    let (_, r) = gw.request(
        json!(2),
        "tools/call",
        json!({"name": "b__add", "arguments": {"a": 1, "b": 2}}),
    );
    assert_eq!(text(&r), "3");
    let (_, r) = gw.request(
        json!(3),
        "tools/call",
        json!({"name": "a__echo", "arguments": {"text": "x"}}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // The stateless era on the same pipe sees the profile too.
    let (_, r) = gw.request(json!(4), "tools/list", json!({"_meta": stateless_meta("pipe")}));
    assert_eq!(r["result"]["tools"].as_array().unwrap().len(), 2, "{r}");
    gw.close_stdin();
    assert!(gw.wait_exit(T).is_some());

    let (dir, mut cmd) = gateway_command(&cfg, &["stdio", "--profile", "nope"], &[]);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    drop(dir);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--profile nope: no [profiles.nope]") && err.contains("(profiles: p)"),
        "{err}"
    );
    // A name with a newline (or any control character) is repeated escaped: the error
    // stays one line, and no line of stderr is the caller's to write.
    let (dir, mut cmd) = gateway_command(&cfg, &["stdio", "--profile", "x\nFAKE: forged"], &[]);
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    drop(dir);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r#"--profile "x\nFAKE: forged""#), "{err}");
    assert!(!err.lines().any(|l| l.starts_with("FAKE")), "{err}");
}

#[tokio::test]
async fn status_and_check_connect_show_each_profile() {
    let cfg = three("[profiles.front]\nservers = [\"a\"]\ntools = { deny = [\"*crash*\"] }\nsearch = false\n");
    let gw = Gateway::start(&cfg);
    let _s = Session::open(&format!("{}/front", gw.url)).await;
    let st = gw.get_json("/status").await;
    let p = &st["profiles"][0];
    assert_eq!(p["name"], "front", "{st}");
    assert_eq!(p["path"], "/mcp/front");
    assert_eq!(p["servers"], json!(["a"]));
    assert_eq!(p["tools"], MOCK_TOOLS.len() - 1);
    assert_eq!((p["prompts"].clone(), p["resources"].clone()), (json!(1), json!(1)));
    assert_eq!(p["sessions"], 1);

    let (run, _dir) = check(&cfg, &["--connect"], &[]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("profiles: front at /mcp/front"), "{}", run.stdout);
    let row = run
        .stdout
        .lines()
        .find(|l| l.starts_with("front "))
        .unwrap_or_else(|| panic!("no profile row:\n{}", run.stdout));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols, ["front", "8", "1", "1", "1", "a"], "{row}");
    assert!(!run.stdout.contains("shows no tools"), "{}", run.stdout);

    // A profile whose globs let none of its servers' tools through is pointed out.
    let typo = format!("{cfg}\n[profiles.typo]\nservers = [\"a\"]\ntools = {{ allow = [\"a__[ec]*\"] }}\n");
    let (run, _dir) = check(&typo, &["--connect"], &[]);
    assert_eq!(
        run.code,
        Some(0),
        "a note, not an error: {}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout
            .contains("profile typo shows no tools: its servers have some"),
        "{}",
        run.stdout
    );
}

/// Runs an SDK client; returns its one JSON output line.
async fn sdk_client(what: &str, program: &str, args: &[String]) -> Value {
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot spawn {program}: {e}"));
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

#[tokio::test]
async fn the_python_and_typescript_sdk_clients_list_and_call_through_a_profile_url() {
    let py = repo().join(".venv/bin/python");
    assert!(py.exists(), "needs .venv: run scripts/setup-test-deps");
    assert!(
        repo().join("node_modules/@modelcontextprotocol/sdk").is_dir(),
        "needs node_modules: run scripts/setup-test-deps"
    );
    let cfg = three("[profiles.web]\ntags = [\"web\"]\ntools = { allow = [\"*echo*\", \"*add\"] }\n");
    let gw = Gateway::start(&cfg);
    let url = format!("{}/web", gw.url);
    let want: BTreeSet<String> = ["a__echo", "a__add", "a__echo_meta", "c__echo", "c__add", "c__echo_meta"]
        .map(str::to_owned)
        .into();
    let args = json!({"a": 20, "b": 22}).to_string();
    let py_run = |mode: &'static str| {
        let argv: Vec<String> = vec![
            "tests/interop/py_client.py".into(),
            url.clone(),
            "--mode".into(),
            mode.into(),
            "--tool".into(),
            "c__add".into(),
            "--args".into(),
            args.clone(),
        ];
        let py = path_str(&py);
        async move { sdk_client(&format!("py client ({mode})"), &py, &argv).await }
    };
    let ts_argv: Vec<String> = vec![
        "tests/interop/ts_client.mjs".into(),
        "--tool".into(),
        "a__add".into(),
        "--args".into(),
        args.clone(),
        "--url".into(),
        url.clone(),
    ];
    let (legacy, auto, ts) = tokio::join!(
        py_run("legacy"),
        py_run("auto"),
        sdk_client("ts client", "node", &ts_argv)
    );
    for (what, out, version) in [
        ("py legacy", &legacy, "2025-11-25"),
        ("py auto", &auto, "2026-07-28"),
        ("ts", &ts, ""),
    ] {
        let tools: BTreeSet<String> = out["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: {out}"))
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(tools, want, "{what}: {out}");
        assert_eq!(out["isError"], false, "{what}: {out}");
        assert_eq!(out["result"][0]["text"], "42", "{what}: {out}");
        if !version.is_empty() {
            assert_eq!(out["protocolVersion"], version, "{what}: {out}");
        }
    }
}

#[tokio::test]
async fn profiles_follow_a_reload() {
    let (na, nb) = (unique("ra"), unique("rb"));
    let base = format!("{}{}", server("a", &na, &[], ""), server("b", &nb, &[], ""));
    let gw = Gateway::start(&format!("{base}[profiles.p]\nservers = [\"a\"]\n"));
    let p = Session::open(&format!("{}/p", gw.url)).await;
    let mut p_get = p.get_stream().await;
    let reloads = gw.logs().matches("reload done").count();
    // p gains b, q is new.
    std::fs::write(
        gw.config_path(),
        format!("{base}[profiles.p]\nservers = [\"a\", \"b\"]\n\n[profiles.q]\nservers = [\"b\"]\n"),
    )
    .unwrap();
    let log = gw.stderr.clone();
    assert!(until(T, || log.lock().unwrap().matches("reload done").count() > reloads).await);
    let all: BTreeSet<String> = ["tools", "prompts", "resources"]
        .map(|k| format!("notifications/{k}/list_changed"))
        .into();
    assert_eq!(
        heard(&mut p_get, "notifications/tools/list_changed").await,
        all,
        "p's lists changed"
    );
    assert_eq!(
        names(&p.list("tools/list", "tools").await, "name"),
        tools_of(&["a", "b"])
    );
    let q = Session::open(&format!("{}/q", gw.url)).await;
    assert_eq!(names(&q.list("tools/list", "tools").await, "name"), tools_of(&["b"]));
    // p goes: its path is 404, its open stream is told.
    std::fs::write(gw.config_path(), format!("{base}[profiles.q]\nservers = [\"b\"]\n")).unwrap();
    assert!(until(T, || log.lock().unwrap().matches("reload done").count() > reloads + 1).await);
    assert_eq!(
        heard(&mut p_get, "notifications/tools/list_changed").await,
        all,
        "p is gone"
    );
    let (status, r) = post_as(
        &format!("{}/p", gw.url),
        Some(&p.id),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}),
    )
    .await;
    assert_eq!(status, 404, "{r}");
    assert_eq!(r["error"]["data"]["profiles"], json!(["q"]), "{r}");
    assert_eq!(q.tool_names().await.len(), MOCK_TOOLS.len());
}
