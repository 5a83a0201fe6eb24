//! Consent through URL elicitation (`auth.oauth`): the real gateway in front of the
//! protected MCP fixture (`tests/fixtures/protected_mcp.py`, the Python SDK as an OAuth
//! resource server) whose authorization server is `tests/fixtures/oauth_as.py`. The
//! gateway registers itself dynamically, asks each user to consent (-32042 with the
//! official Python SDK client, a tool error for a client without URL elicitation), and the
//! test follows the link as a browser would: gateway → AS → gateway callback.

use crate::common::*;
use crate::interop::{require_deps, venv_python};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

const ALICE: &str = "alice-gw-token-7f3a9c";
const BOB: &str = "bob-gw-token-19c0de";

/// The AS, the protected server behind it, and the gateway in front, fresh for one test.
struct Setup {
    _as: Proc,
    as_base: String,
    _mcp: Proc,
    _port: ReservedPort,
    mcp_base: String,
    gw: Gateway,
    state: tempfile::TempDir,
}

/// The AS and the protected server; the `[clients.*]` and `[servers.docs]` tables for them.
struct Fixtures {
    authz: Proc,
    as_base: String,
    mcp: Proc,
    port: ReservedPort,
    mcp_base: String,
    tables: String,
}

async fn fixtures(as_args: &[&str]) -> Fixtures {
    fixtures_with(as_args, &[]).await
}

/// As [`fixtures`], with more arguments for the protected server.
async fn fixtures_with(as_args: &[&str], mcp_args: &[&str]) -> Fixtures {
    require_deps();
    let py = path_str(&venv_python());
    let mut args = vec!["tests/fixtures/oauth_as.py", "--port", "0"];
    args.extend_from_slice(as_args);
    let authz = Proc::start(&py, &args, &[]).await;
    let as_base = format!("http://127.0.0.1:{}", authz.port);
    let port = ReservedPort::new();
    let mcp_base = format!("http://127.0.0.1:{}", port.port);
    let audience = format!("{mcp_base}/mcp");
    let p = port.port.to_string();
    let mut args = vec![
        "tests/fixtures/protected_mcp.py",
        "--port",
        &p,
        "--audience",
        &audience,
        "--issuer",
        &as_base,
    ];
    args.extend_from_slice(mcp_args);
    let mcp = Proc::start(&py, &args, &[]).await;
    let tables = format!(
        "[clients.alice]\ntoken = {ALICE:?}\n\n[clients.bob]\ntoken = {BOB:?}\n\n\
         [servers.docs]\nurl = \"{audience}\"\nauth = {{ oauth = {{}} }}\n"
    );
    Fixtures {
        authz,
        as_base,
        mcp,
        port,
        mcp_base,
        tables,
    }
}

async fn setup(as_args: &[&str], env: &[(&str, &str)]) -> Setup {
    setup_with(as_args, &[], env).await
}

async fn setup_with(as_args: &[&str], mcp_args: &[&str], env: &[(&str, &str)]) -> Setup {
    setup_on(fixtures_with(as_args, mcp_args).await, "", env)
}

/// A gateway over `f` with a state dir of its own and `extra` TOML before the tables.
fn setup_on(f: Fixtures, extra: &str, env: &[(&str, &str)]) -> Setup {
    let state = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\nstate_dir = {:?}\n\n{extra}\n{}",
        path_str(state.path()),
        f.tables
    );
    let gw = Gateway::start_with_env(&config, env);
    Setup {
        _as: f.authz,
        as_base: f.as_base,
        _mcp: f.mcp,
        _port: f.port,
        mcp_base: f.mcp_base,
        gw,
        state,
    }
}

/// Waits until `s` (a session on `gw`) lists `tool`; panics with `gw`'s log after 30 s.
async fn wait_listed(s: &Session, tool: &str, gw: &Gateway) {
    for _ in 0..300 {
        if s.tool_names().await.iter().any(|t| t == tool) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{tool} never listed; gateway log:\n{}", gw.logs());
}

impl Setup {
    async fn stats(&self) -> Value {
        fetch_json(&format!("{}/stats", self.as_base)).await
    }

    async fn control(&self, knobs: Value) {
        post_ok(&format!("{}/control", self.as_base), &knobs).await
    }

    /// Every `Authorization` value the protected server received.
    async fn seen(&self) -> Vec<String> {
        reqwest::get(format!("{}/seen", self.mcp_base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A session of `token` declaring URL elicitation.
    async fn url_session(&self, token: &str) -> Session {
        let http = bearer_client(token);
        Session::open_on(http, &self.gw.url, json!({"elicitation": {"url": {}}})).await
    }

    /// Waits until `s` sees `tool` in its list (the catalog is listed once a user consented).
    async fn wait_tool(&self, s: &Session, tool: &str) {
        wait_listed(s, tool, &self.gw).await
    }

    /// Asks `s` (a session of `token`) to call `tool`, expects -32042, and consents in a
    /// browser whose user types `token` into the gateway's page: the callback's page.
    async fn consent(&self, s: &Session, token: &str, tool: &str) -> Browsed {
        let r = s.call(tool, json!({})).await;
        let url = elicitation_url(&r);
        let b = browse(&url, None, Some(token)).await;
        assert_eq!(b.status, 200, "{b:?}\n{}", self.gw.logs());
        b
    }
}

/// What a refused call says: its error's message, or its tool error's text.
fn said(r: &Value) -> String {
    match r["error"]["message"].as_str() {
        Some(m) => m.to_owned(),
        None => text(r),
    }
}

/// What `whoami` answered: the claims of the token the server got.
fn who(r: &Value) -> Value {
    serde_json::from_str(&text(r)).unwrap_or_else(|_| panic!("not whoami's answer: {r}"))
}

fn bearer_client(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    reqwest::Client::builder().default_headers(headers).build().unwrap()
}

/// The URL of a -32042 answer's one URL elicitation.
fn elicitation_url(r: &Value) -> String {
    let e = &r["error"];
    assert_eq!(e["code"], -32042, "{r}");
    assert_eq!(e["message"], "URL elicitation required");
    let el = &e["data"]["elicitations"][0];
    assert_eq!(el["mode"], "url", "{r}");
    assert!(el["elicitationId"].as_str().is_some_and(|s| s.len() >= 32), "{r}");
    assert!(el["message"].as_str().unwrap().contains("docs"), "{r}");
    el["url"].as_str().unwrap().to_owned()
}

/// What a browser did: each URL it went to, and the last answer.
#[derive(Debug)]
struct Browsed {
    visited: Vec<String>,
    status: u16,
    body: String,
    /// The gateway's cookies it held at the end.
    cookies: HashMap<String, String>,
}

/// Follows redirects from `url` as a browser would, keeping the cookies each origin sets
/// (by host:port) and sending them back; `auth` goes with the first request only. When
/// the gateway's page asks for a token, its user types `typed` (if given) and sends the
/// form.
async fn browse(url: &str, auth: Option<&str>, typed: Option<&str>) -> Browsed {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut jar: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut visited = Vec::new();
    let mut next = url.to_owned();
    let mut form: Option<String> = None;
    for hop in 0..10 {
        let u = reqwest::Url::parse(&next).unwrap();
        let origin = format!("{}:{}", u.host_str().unwrap(), u.port().unwrap_or(80));
        let mut req = match form.take() {
            Some(body) => http
                .post(u.clone())
                .header("content-type", "application/x-www-form-urlencoded")
                .body(body),
            None => http.get(u.clone()),
        };
        if let Some(c) = jar.get(&origin) {
            let v = c.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
            req = req.header("cookie", v);
        }
        if let (0, Some(t)) = (hop, auth) {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let r = req.send().await.unwrap();
        visited.push(next.clone());
        for sc in r.headers().get_all("set-cookie") {
            let kv = sc.to_str().unwrap().split(';').next().unwrap();
            let (k, v) = kv.split_once('=').unwrap();
            jar.entry(origin.clone()).or_default().insert(k.into(), v.into());
        }
        let status = r.status().as_u16();
        if status == 302 || status == 303 {
            let loc = r.headers()["location"].to_str().unwrap();
            next = u.join(loc).unwrap().to_string();
            continue;
        }
        let body = r.text().await.unwrap();
        if let (200, Some(t), true) = (status, typed, body.contains("name=\"token\"")) {
            let link = query_of(&next)["link"].clone();
            let encoded =
                reqwest::Url::parse_with_params("http://x/", &[("link", link.as_str()), ("token", t)]).unwrap();
            form = Some(encoded.query().unwrap().to_owned());
            next = u.join("start").unwrap().to_string();
            continue;
        }
        let gw_origin = jar.keys().next().cloned().unwrap_or_default();
        return Browsed {
            visited,
            status,
            body,
            cookies: jar.remove(&gw_origin).unwrap_or_default(),
        };
    }
    panic!("too many redirects: {visited:?}");
}

fn query_of(url: &str) -> HashMap<String, String> {
    reqwest::Url::parse(url).unwrap().query_pairs().into_owned().collect()
}

/// The Python SDK client (`tests/interop/py_consent.py`), one JSON line each way.
struct PyClient {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl PyClient {
    fn start(url: &str, token: &str, ask: &str, then: &str) -> PyClient {
        let mut child = Command::new(venv_python())
            .arg(repo().join("tests/interop/py_consent.py"))
            .args([url, "--token", token, "--ask", ask, "--then", then])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        PyClient { child, lines }
    }

    fn next(&self, event: &str) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("py_consent said nothing while waiting for {event}"));
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["event"], event, "{v}");
        v
    }
}

impl Drop for PyClient {
    fn drop(&mut self) {
        drop(self.child.stdin.take().map(|mut s| s.flush()));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_client_consents_through_url_elicitation_and_then_calls_with_its_own_token() {
    let s = setup(&[], &[("MCP_GATEWAY_LOG", "trace")]).await;
    // No user has consented yet: the server offers only the tool that asks.
    let probe = Session::open_as(&s.gw.url, ALICE).await;
    assert_eq!(probe.tool_names().await, vec!["docs__authorize".to_owned()]);

    let py = PyClient::start(&s.gw.url, ALICE, "docs__authorize", "docs__whoami");
    let el = py.next("elicitation");
    assert_eq!(el["code"], -32042);
    assert_eq!(el["mode"], "url");
    let url = el["url"].as_str().unwrap();
    assert!(url.starts_with(&format!("{}/oauth/start?link=", s.gw.base)), "{url}");
    let browsed = browse(url, None, Some(ALICE)).await;
    assert_eq!(browsed.status, 200, "{browsed:?}");
    assert!(browsed.body.contains("You can close this page"), "{}", browsed.body);
    // gateway's page → its form, with alice's token → AS (PKCE S256, its own state, the
    // registered callback) → gateway callback.
    assert_eq!(browsed.visited.len(), 4, "{:?}", browsed.visited);
    let authorize = query_of(&browsed.visited[2]);
    assert!(browsed.visited[2].starts_with(&format!("{}/authorize?", s.as_base)));
    assert_eq!(authorize["code_challenge_method"], "S256");
    assert_eq!(authorize["redirect_uri"], format!("{}/oauth/callback", s.gw.base));
    assert_eq!(authorize["resource"], format!("{}/mcp", s.mcp_base));
    assert!(!url.contains(&authorize["state"]), "the AS's state is not the link");
    let done = py.next("complete");
    assert_eq!(done["elicitationId"], el["elicitationId"]);
    let result = py.next("result");
    assert_eq!(result["isError"], false, "{result}");
    let me: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(me["sub"], "alice", "{result}");
    assert_eq!(me["aud"], format!("{}/mcp", s.mcp_base));

    // The server saw only tokens the AS issued, never the gateway's own client token.
    let seen = s.seen().await;
    assert!(!seen.is_empty());
    for v in &seen {
        let t = v.strip_prefix("Bearer ").unwrap_or_else(|| panic!("{v}"));
        assert_eq!(t.split('.').count(), 3, "a JWT of the AS: {v}");
        assert!(!v.contains(ALICE) && !v.contains(BOB));
    }
    let stats = s.stats().await;
    assert_eq!(stats["register"], 1, "{stats}");
    assert_eq!(stats["authorize"], 1, "{stats}");
    assert_eq!(stats["token"]["authorization_code"], 1, "{stats}");

    // No token at trace level, on /status, or in the store's file in clear.
    let code = query_of(&browsed.visited[3])["code"].clone();
    let link = query_of(url)["link"].clone();
    let logs = s.gw.logs();
    assert!(logs.contains("TRACE") || logs.contains("trace"), "trace logging is on");
    let status = reqwest::Client::new()
        .get(format!("{}/status", s.gw.base))
        .header("authorization", format!("Bearer {ALICE}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let file = std::fs::read_to_string(s.state.path().join("tokens.json")).unwrap();
    for v in &seen {
        let t = &v["Bearer ".len()..];
        let sig = t.rsplit('.').next().unwrap();
        assert!(!logs.contains(sig), "an access token in the gateway's log");
        assert!(!status.contains(sig), "an access token on /status");
        assert!(!file.contains(sig), "an access token in clear in tokens.json");
    }
    for (what, secret) in [
        ("the code", &code),
        ("the link", &link),
        ("alice's token", &ALICE.to_owned()),
    ] {
        assert!(!logs.contains(secret.as_str()), "{what} in the gateway's log");
    }
    use std::os::unix::fs::PermissionsExt;
    for f in ["tokens.json", "token.key"] {
        let mode = std::fs::metadata(s.state.path().join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
}

/// The protected server speaks 2026-07-28, so it asks with an `input_required` result: a
/// handshake-era client is asked by the gateway (elicitation/create on the call's own
/// stream) and gets the call's final result, as from any other 2026-07-28 server.
#[tokio::test(flavor = "multi_thread")]
async fn a_consented_servers_input_required_is_asked_of_a_handshake_client() {
    let s = setup(&[], &[]).await;
    let caps = json!({"elicitation": {"form": {}, "url": {}}});
    let alice = Session::open_on(bearer_client(ALICE), &s.gw.url, caps).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__greet").await;
    let t = Duration::from_secs(20);
    let mut m = alice
        .start(
            json!("greet"),
            "tools/call",
            json!({"name": "docs__greet", "arguments": {}}),
        )
        .await;
    let q = m.next(t).await.expect("the server's question");
    assert_eq!(q["method"], "elicitation/create", "{q}");
    assert_eq!(q["params"]["message"], "Your name?", "{q}");
    let answer = json!({"jsonrpc": "2.0", "id": q["id"], "result": {"action": "accept", "content": {"name": "Ada"}}});
    let (status, body) = alice.post_text(answer.to_string()).await;
    assert_eq!(status, 202, "{body}");
    let (_, r) = m.response(t).await;
    assert_eq!(text(&r), "Hello, Ada!", "{r}\n{}", s.gw.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_without_url_elicitation_gets_a_tool_error_with_the_link() {
    let s = setup(&[], &[]).await;
    let bob = Session::open_as(&s.gw.url, BOB).await;
    let r = bob.call("docs__authorize", json!({})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = text(&r);
    let at = text.find("/oauth/start?link=").unwrap_or_else(|| panic!("{text}"));
    let url = format!("{}{}", s.gw.base, text[at..].split_whitespace().next().unwrap());
    let b = browse(&url, None, Some(BOB)).await;
    assert_eq!(b.status, 200, "{b:?}");
    // bob's own next call goes with bob's token (his catalog came with the consent).
    s.wait_tool(&bob, "docs__whoami").await;
    let r = bob.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "the AS's one user: {r}");
    // An unauthenticated caller cannot consent: the endpoint refuses it (401).
    let anon = reqwest::Client::new()
        .post(&s.gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}))
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn stolen_replayed_and_redirected_consents_are_refused() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    let url = elicitation_url(&alice.call("docs__authorize", json!({})).await);
    let link = query_of(&url)["link"].clone();

    // An open-redirect attempt: /oauth/start takes nothing but the link.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for extra in [
        "redirect_uri=https://evil.example/cb",
        "next=https://evil.example/",
        "link=again",
    ] {
        let r = http.get(format!("{url}&{extra}")).send().await.unwrap();
        assert_eq!(r.status(), 400, "{extra}");
        assert!(r.headers().get("location").is_none(), "{extra}");
    }
    // Stolen: bob (authenticated as bob) opens alice's link.
    let stolen = browse(&url, Some(BOB), None).await;
    assert_eq!(stolen.status, 403, "{stolen:?}");
    assert!(stolen.body.contains("another client"), "{}", stolen.body);
    assert_eq!(stolen.visited.len(), 1, "no redirect for a stolen link");
    assert_eq!(s.stats().await["authorize"], 0);

    // The link still works once for alice's browser; the callback in another browser
    // (no cookie) is refused, and the flow it began is spent.
    let http2 = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // A browser carries no credentials: the link's page names its client and asks for
    // that client's token. Opening it uses nothing up.
    let page = http2.get(&url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
    let body = page.text().await.unwrap();
    assert!(
        body.contains("<strong>alice</strong>") && body.contains("name=\"token\""),
        "{body}"
    );
    let form = |token: &str| {
        let encoded =
            reqwest::Url::parse_with_params("http://x/", &[("link", link.as_str()), ("token", token)]).unwrap();
        http2
            .post(format!("{}/oauth/start", s.gw.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(encoded.query().unwrap().to_owned())
    };
    // Phished: the link reaches bob, who types his own token. Nothing is authorized, and
    // the link stays alice's.
    let phished = form(BOB).send().await.unwrap();
    assert_eq!(phished.status(), 401);
    assert!(phished.headers().get("location").is_none());
    assert!(phished.text().await.unwrap().contains("not this client"));
    assert_eq!(s.stats().await["authorize"], 0);
    let start = form(ALICE).send().await.unwrap();
    assert_eq!(start.status(), 303);
    let to_as = start.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        to_as.starts_with(&format!("{}/authorize?", s.as_base)),
        "only to the AS: {to_as}"
    );
    let cookie = start.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    let back = http2.get(&to_as).send().await.unwrap();
    assert_eq!(back.status(), 302);
    let callback = back.headers()["location"].to_str().unwrap().to_owned();
    assert!(callback.starts_with(&format!("{}/oauth/callback?", s.gw.base)));
    let other_browser = http2.get(&callback).send().await.unwrap();
    assert_eq!(other_browser.status(), 403);
    assert!(other_browser.headers().get("location").is_none());
    // The state alone, without the code or the cookie: refused, and the flow is left to
    // the browser that began it.
    let state = query_of(&callback)["state"].clone();
    let bare = http2
        .get(format!("{}/oauth/callback?state={state}", s.gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 403);
    assert_eq!(s.stats().await["token_requests"], 0, "no code was exchanged");
    let own = http2
        .get(&callback)
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200, "the browser that began it completes it");
    let again = http2
        .get(&callback)
        .header("cookie", cookie.split(';').next().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 400, "a spent flow");
    // The link was used once: a second start is refused.
    assert_eq!(http2.get(&url).send().await.unwrap().status(), 404);
    assert_eq!(s.stats().await["token"]["authorization_code"], 1);

    // A fresh link (alice's tokens forgotten first), completed properly, then its callback
    // replayed.
    let del = bearer_client(ALICE)
        .delete(format!("{}/oauth/tokens/docs", s.gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    // (Nobody else consented: the server offers `authorize` again.)
    s.wait_tool(&alice, "docs__authorize").await;
    let url = elicitation_url(&alice.call("docs__authorize", json!({})).await);
    assert_ne!(query_of(&url)["link"], link);
    let b = browse(&url, Some(ALICE), None).await;
    assert_eq!(b.status, 200, "{b:?}");
    let cookie = b
        .cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ");
    let replay = http2.get(&b.visited[2]).header("cookie", cookie).send().await.unwrap();
    assert_eq!(replay.status(), 400, "a replayed callback");
    assert_eq!(s.stats().await["token"]["authorization_code"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_refresh_token_is_used_before_the_user_is_asked_again() {
    // Tokens live 30 s: each is within the gateway's refresh margin at once.
    let s = setup(&["--expires-in", "30"], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    s.control(json!({"reset_stats": true, "expires_in": 3600})).await;
    let r = alice.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "{r}");
    let stats = s.stats().await;
    assert!(stats["token"]["refresh_token"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(stats["authorize"], 0, "not asked again: {stats}");
    // A refreshed token lives an hour now: the next call uses it as it is.
    let before = s.stats().await["token_requests"].clone();
    let r = alice.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "{r}");
    assert_eq!(s.stats().await["token_requests"], before);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_revoked_by_delete_and_by_the_command_line() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    let r = alice.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "{r}");

    let del = |token: &'static str, server: &'static str| {
        let url = format!("{}/oauth/tokens/{server}", s.gw.base);
        async move {
            let r = bearer_client(token).delete(url).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.text().await.unwrap())
        }
    };
    assert_eq!(del(BOB, "docs").await.0, 404, "bob has none");
    let (status, body) = del(ALICE, "nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("nope"), "{body}");
    assert_eq!(del(ALICE, "docs").await.0, 204);
    assert_eq!(s.stats().await["revoke"], 1, "the refresh token was revoked at the AS");
    elicitation_url(&alice.call("docs__whoami", json!({})).await);
    assert_eq!(del(ALICE, "docs").await.0, 404, "gone already");
    let unauthenticated = reqwest::Client::new()
        .delete(format!("{}/oauth/tokens/docs", s.gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);

    // Again, then revoked on the command line (the store's file, read by the running gateway).
    s.consent(&alice, ALICE, "docs__whoami").await;
    let r = alice.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "{r}");
    let cli = |client: &str| {
        Command::new(BIN)
            .args(["tokens", "revoke", "--client", client, "--server", "docs", "--config"])
            .arg(s.gw.config_path())
            .output()
            .unwrap()
    };
    let out = cli("alice");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked alice's tokens for server 'docs'"));
    elicitation_url(&alice.call("docs__whoami", json!({})).await);
    let out = cli("alice");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("alice has no tokens"));
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_the_users_tokens_through_redis_sealed() {
    let redis = Redis::start();
    let f = fixtures(&[]).await;
    let gws = crate::cluster::replicas(2, &redis, &f.tables, "");
    let on_a = Session::open_on(bearer_client(ALICE), &gws[0].url, json!({"elicitation": {"url": {}}})).await;
    let mut stream = on_a.get_stream().await;
    // The server's catalog (its `authorize` tool, once its authorization server is found)
    // may come after the replica listens.
    wait_listed(&on_a, "docs__authorize", &gws[0]).await;
    let r = on_a.call("docs__authorize", json!({})).await;
    let url = elicitation_url(&r);
    let eid = r["error"]["data"]["elicitations"][0]["elicitationId"].clone();
    assert!(url.starts_with(&format!("{}/oauth/start?", gws[0].base)), "{url}");
    // The browser reaches the other replica (a balancer without sticky sessions): the
    // link and the flow are in Redis, and the session asked hears of it over the bus.
    let url = url.replace(&gws[0].base, &gws[1].base);
    let b = browse(&url, None, Some(ALICE)).await;
    assert_eq!(b.status, 200, "{b:?}\n{}", gws[1].logs());
    assert!(
        b.visited[3].starts_with(&format!("{}/oauth/callback?", gws[1].base)),
        "{b:?}"
    );
    let note = loop {
        let m = stream
            .next(Duration::from_secs(10))
            .await
            .expect("notifications/elicitation/complete on the GET stream");
        if m["method"] == "notifications/elicitation/complete" {
            break m;
        }
    };
    assert_eq!(note["params"]["elicitationId"], eid);
    // Single use across replicas: the same link on replica a is spent.
    let again = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(url.replace(&gws[1].base, &gws[0].base))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);

    // Replica b finds alice's tokens in Redis: no new consent.
    let on_b = Session::open_on(bearer_client(ALICE), &gws[1].url, json!({"elicitation": {"url": {}}})).await;
    // (It served the callback, so it lists the server's catalog at once.)
    for _ in 0..300 {
        if on_b.tool_names().await.iter().any(|t| t == "docs__whoami") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = on_b.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "{r}");
    // Replica a, where alice was asked, uses the tokens replica b stored.
    let r = if on_a.tool_names().await.iter().any(|t| t == "docs__whoami") {
        let r = on_a.call("docs__whoami", json!({})).await;
        assert_eq!(who(&r)["sub"], "alice", "{r}");
        r
    } else {
        let r = on_a.call("docs__authorize", json!({})).await;
        assert!(text(&r).contains("You have authorized"), "{r}");
        r
    };
    assert!(r.get("error").is_none(), "{r}");
    let stats: Value = reqwest::get(format!("{}/stats", f.as_base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["authorize"], 1, "one consent for both replicas: {stats}");

    // What Redis holds is sealed.
    let stored = redis.cli(&["HGET", "mcpgw:oauth:tokens:docs", "alice"]);
    assert!(stored.starts_with("1.") && !stored.contains("eyJ"), "{stored}");

    // The command line revokes in Redis: both replicas ask again.
    let out = Command::new(BIN)
        .args(["tokens", "revoke", "--client", "alice", "--server", "docs", "--config"])
        .arg(gws[1].config_path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Redis"));
    // (Replica a may still list only `docs__authorize`: it lists the catalog on its next
    // start, up to 30 s later; replica b was woken by the consent it served.)
    let tool = if on_a.tool_names().await.iter().any(|t| t == "docs__whoami") {
        "docs__whoami"
    } else {
        "docs__authorize"
    };
    elicitation_url(&on_a.call(tool, json!({})).await);
    elicitation_url(&on_b.call("docs__whoami", json!({})).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stdio_gateway_uses_the_stored_tokens_but_cannot_ask() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    let config = std::fs::read_to_string(s.gw.config_path()).unwrap();
    let mut as_alice = StdioGateway::start(&config, &[("MCP_GATEWAY_CLIENT", "alice")]);
    as_alice.initialize();
    let (_, r) = as_alice.request(json!(2), "tools/call", json!({"name": "docs__whoami", "arguments": {}}));
    assert_eq!(who(&r)["sub"], "alice", "{r}\n{}", as_alice.logs());
    let mut as_bob = StdioGateway::start(&config, &[("MCP_GATEWAY_CLIENT", "bob")]);
    as_bob.initialize();
    let (_, r) = as_bob.request(json!(2), "tools/call", json!({"name": "docs__whoami", "arguments": {}}));
    let e = r["error"]["message"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(e.contains("mcp-gateway serve"), "{r}");
    assert!(
        as_bob.stdout.lock().unwrap().iter().all(|l| l.starts_with('{')),
        "stdout: JSON-RPC only"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_without_oauth_servers_keeps_no_state() {
    let state = tempfile::tempdir().unwrap();
    let xdg = path_str(state.path());
    let gw = Gateway::start_with_env(
        &server("calc", &unique("calc"), &[], ""),
        &[("XDG_STATE_HOME", xdg.as_str())],
    );
    let s = gw.session().await;
    assert!(!s.tool_names().await.is_empty());
    assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0, "no token.key made");
}

/// RFC 9728 §3.3: a server whose protected-resource metadata names another resource (here
/// another host's API) is refused: no token is asked for that resource, none goes to it.
#[tokio::test(flavor = "multi_thread")]
async fn metadata_about_another_resource_is_refused() {
    let s = setup_with(&[], &["--prm-resource", "https://payroll.internal.example/api"], &[]).await;
    let alice = s.url_session(ALICE).await;
    let r = alice.call("docs__authorize", json!({})).await;
    assert!(!r.to_string().contains("/oauth/start"), "no consent link: {r}");
    let e = said(&r);
    assert!(e.contains("'docs'"), "{e}");
    assert!(
        e.contains("another resource") && e.contains("payroll.internal.example") && e.contains("RFC 9728"),
        "{e}"
    );
    let stats = s.stats().await;
    assert_eq!(stats["register"], 0, "{stats}");
    assert_eq!(stats["authorize"], 0, "{stats}");
}

/// An authorization server the server named (not gateway.toml) keeps its endpoints on its
/// own origin, and what it says goes into errors escaped and cut.
#[tokio::test(flavor = "multi_thread")]
async fn a_discovered_authorization_server_cannot_send_the_gateway_elsewhere() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    for key in ["token_endpoint", "registration_endpoint", "revocation_endpoint"] {
        s.control(json!({"metadata": {key: "http://127.0.0.1:9/elsewhere"}}))
            .await;
        let r = alice.call("docs__authorize", json!({})).await;
        assert!(!r.to_string().contains("/oauth/start"), "no consent link: {r}");
        let e = said(&r);
        assert!(
            e.contains("'docs'") && e.contains(key) && e.contains("another origin"),
            "{e}"
        );
    }
    assert_eq!(s.stats().await["register"], 0, "nothing registered");
    let hostile = format!("http://evil.example/\u{1b}[2J\nforged line {}", "A".repeat(5000));
    s.control(json!({"metadata": {"issuer": hostile}})).await;
    let r = alice.call("docs__authorize", json!({})).await;
    let e = said(&r);
    assert!(e.contains("'docs'") && e.contains("another issuer"), "{e}");
    assert!(!e.contains('\u{1b}') && !e.contains('\n') && e.len() < 600, "{e}");
    assert!(!s.gw.logs().contains('\u{1b}'), "no raw escape in the log");
    // Its own origin is fine.
    s.control(json!({"metadata": {}})).await;
    elicitation_url(&alice.call("docs__authorize", json!({})).await);
}

/// A client secret goes only to an authorization server named in gateway.toml: `check`
/// (and a start) refuse it without `authorization_server`.
#[test]
fn a_client_secret_needs_a_pinned_authorization_server() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gateway.toml");
    let run = |pin: &str| {
        std::fs::write(
            &cfg,
            format!(
                "[servers.wiki]\nurl = \"https://wiki.example/mcp\"\n\
                 auth = {{ oauth = {{ client_id = \"gw\", client_secret = \"s3cret-value-xyz\"{pin} }} }}\n"
            ),
        )
        .unwrap();
        let out = Command::new(BIN)
            .args(["check", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains("s3cret-value-xyz"), "{all}");
        (out.status.success(), all)
    };
    let (ok, all) = run("");
    assert!(!ok, "{all}");
    assert!(
        all.contains("servers.wiki.auth.oauth.client_secret needs servers.wiki.auth.oauth.authorization_server"),
        "{all}"
    );
    let (ok, all) = run(", authorization_server = \"https://login.example\"");
    assert!(ok, "{all}");
}

/// alice consents first (the catalog connection is opened with her token), then bob, who
/// calls once; what the server saw of alice's tokens.
async fn alice_lists_then_bob_calls() -> (Setup, Session, Vec<String>) {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    let alices = s.seen().await;
    assert!(!alices.is_empty());
    let bob = Session::open_on(
        bearer_client(BOB),
        &s.gw.url,
        json!({"elicitation": {"url": {}}, "roots": {"listChanged": true}}),
    )
    .await;
    s.consent(&bob, BOB, "docs__whoami").await;
    let r = bob.call("docs__whoami", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    (s, bob, alices)
}

/// The catalog connection was opened with alice's token. After alice's DELETE, what goes to
/// the server on it (bob's roots notification) never carries her revoked token: it is
/// opened again with bob's.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_users_token_leaves_the_catalog_connection() {
    let (s, bob, alices) = alice_lists_then_bob_calls().await;
    let bobs: Vec<String> = s.seen().await.into_iter().filter(|v| !alices.contains(v)).collect();

    let del = bearer_client(ALICE)
        .delete(format!("{}/oauth/tokens/docs", s.gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    reqwest::get(format!("{}/seen?reset=1", s.mcp_base)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    bob.notify("notifications/roots/list_changed", json!({})).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = s.seen().await;
    assert!(!after.is_empty(), "nothing reached the server after the DELETE");
    for v in &after {
        assert!(!alices.contains(v), "alice's revoked token was sent after her DELETE");
        assert!(bobs.contains(v), "only bob's token now: {v}");
    }
    // bob's calls go on.
    let r = bob.call("docs__whoami", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
}

/// The same, revoked by `mcp-gateway tokens revoke` (another process, which changes the
/// store's file): the running gateway sees it and opens the catalog connection again with
/// bob's token at once, not when alice's would next be refreshed (an hour on).
#[tokio::test(flavor = "multi_thread")]
async fn a_token_revoked_on_the_command_line_leaves_the_catalog_connection() {
    let (s, bob, alices) = alice_lists_then_bob_calls().await;
    let out = Command::new(BIN)
        .args(["tokens", "revoke", "--client", "alice", "--server", "docs", "--config"])
        .arg(s.gw.config_path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        s.gw.wait_log(
            "the catalog connection used this user's token: opening it again",
            Duration::from_secs(20)
        )
        .await,
        "{}",
        s.gw.logs()
    );
    assert!(s
        .gw
        .logs()
        .contains("the user's tokens were revoked outside this process"));
    s.wait_tool(&bob, "docs__whoami").await;
    reqwest::get(format!("{}/seen?reset=1", s.mcp_base)).await.unwrap();
    // What goes to the server on the catalog connection now (bob's roots notification,
    // then a list) carries bob's token.
    bob.notify("notifications/roots/list_changed", json!({})).await;
    let mut after = Vec::new();
    for _ in 0..200 {
        after = s.seen().await;
        if !after.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!after.is_empty(), "nothing reached the server after the revoke");
    for v in &after {
        assert!(!alices.contains(v), "alice's revoked token was sent after the revoke");
    }
}

/// The first stored user's token is refused by the server (and cannot be refreshed): a
/// gateway starting then lists the catalog with the next user's, at once, and the refused
/// user is asked again.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_token_does_not_keep_the_catalog_down() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    let alices = s.seen().await;
    let bob = s.url_session(BOB).await;
    s.consent(&bob, BOB, "docs__whoami").await;
    post_ok(&format!("{}/refuse", s.mcp_base), &json!(alices)).await;
    s.control(json!({"fail_token": "invalid_grant"})).await;

    let config = std::fs::read_to_string(s.gw.config_path()).unwrap();
    let gw2 = Gateway::start_with_env(&config, &[]);
    let bob2 = Session::open_on(bearer_client(BOB), &gw2.url, json!({"elicitation": {"url": {}}})).await;
    let mut listed = false;
    for _ in 0..50 {
        if bob2.tool_names().await.iter().any(|t| t == "docs__whoami") {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(listed, "the catalog stayed down; log:\n{}", gw2.logs());
    let r = bob2.call("docs__whoami", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    let alice2 = Session::open_on(bearer_client(ALICE), &gw2.url, json!({"elicitation": {"url": {}}})).await;
    elicitation_url(&alice2.call("docs__whoami", json!({})).await);
}

/// A token answer the gateway could not use is refused at the callback, with a clear error,
/// and nothing is stored: a token with CR/LF (it would break every request's header), one
/// of another type than Bearer. A lifetime of 2^64-1 s is capped, not an overflow.
#[tokio::test(flavor = "multi_thread")]
async fn unusable_token_answers_are_refused_at_the_callback() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    for (answer, why) in [
        (
            json!({"access_token": "abc\r\nX-Injected: 1"}),
            "cannot be sent as a header",
        ),
        (json!({"token_type": "DPoP"}), "not Bearer"),
    ] {
        s.control(json!({"answer": answer})).await;
        let url = elicitation_url(&alice.call("docs__authorize", json!({})).await);
        let b = browse(&url, None, Some(ALICE)).await;
        assert_eq!(b.status, 502, "{answer}: {b:?}");
        assert!(b.body.contains("docs") && b.body.contains(why), "{}", b.body);
    }
    s.control(json!({"answer": {"expires_in": u64::MAX}})).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    let r = alice.call("docs__whoami", json!({})).await;
    assert_eq!(who(&r)["sub"], "alice", "{r}");
    assert!(!s.gw.logs().contains("panicked"), "{}", s.gw.logs());
}

/// One client asking for link after link is bounded on its own (per user and server): it
/// cannot fill the gateway's pending consents for everybody.
#[tokio::test(flavor = "multi_thread")]
async fn pending_consents_are_bounded_per_user() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    let mut refused = None;
    for i in 0..40 {
        let r = alice.call("docs__authorize", json!({})).await;
        if r["error"]["code"] != -32042 {
            refused = Some((i, r));
            break;
        }
    }
    let (i, r) = refused.expect("alice was never refused a link");
    assert_eq!(i, 32, "{r}");
    let e = said(&r);
    assert!(
        e.contains("'docs'") && e.contains("too many consents") && e.contains("alice"),
        "{e}"
    );
    // bob is not held up by alice's links.
    let bob = s.url_session(BOB).await;
    let url = elicitation_url(&bob.call("docs__authorize", json!({})).await);
    let b = browse(&url, None, Some(BOB)).await;
    assert_eq!(b.status, 200, "{b:?}");
}

/// A dynamic registration's refusal reaches the client printable and cut.
#[tokio::test(flavor = "multi_thread")]
async fn a_registration_refusal_is_filtered() {
    let s = setup(&[], &[]).await;
    let hostile = format!("bad\n\u{1b}[31mforged {}", "X".repeat(200_000));
    s.control(json!({"register_error": hostile})).await;
    let alice = s.url_session(ALICE).await;
    let r = alice.call("docs__authorize", json!({})).await;
    let e = said(&r);
    assert!(e.contains("'docs'") && e.contains("registration was refused"), "{e}");
    assert!(!e.contains('\u{1b}') && !e.contains('\n') && e.len() < 400, "{e}");
    let status = bearer_client(ALICE)
        .get(format!("{}/status", s.gw.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!status.contains(&"X".repeat(100)), "the refusal's text on /status");
}

/// A refresh that fails is not tried again on every call: for 30 s the token is used as
/// it is (while it lasts).
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_refresh_is_not_retried_on_every_call() {
    // Tokens live 90 s: within the 60 s refresh margin after 30 s... so a short-lived one
    // (70 s) is refreshed on the next call, and still valid when that fails.
    let s = setup(&["--expires-in", "70"], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    s.control(json!({"reset_stats": true, "fail_token": "temporarily_unavailable"}))
        .await;
    tokio::time::sleep(Duration::from_secs(11)).await;
    for _ in 0..4 {
        let r = alice.call("docs__whoami", json!({})).await;
        assert_eq!(who(&r)["sub"], "alice", "{r}");
    }
    let stats = s.stats().await;
    assert_eq!(stats["token"]["refresh_token"], 1, "one try, then the backoff: {stats}");
}

/// A corrupt token store: the error a client gets does not show the gateway's file
/// system; the log names the file.
#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_store_error_keeps_its_path_in_the_log() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    let file = s.state.path().join("tokens.json");
    std::fs::write(&file, "{ not json").unwrap();
    let r = alice.call("docs__whoami", json!({})).await;
    let all = r.to_string();
    let dir = path_str(s.state.path());
    assert!(all.contains("token store is not valid"), "{r}");
    assert!(!all.contains(&dir) && !all.contains("tokens.json"), "{r}");
    // The log line is written as the answer goes out; the test reads stderr in the background.
    assert!(
        s.gw.wait_log(&path_str(&file), Duration::from_secs(10)).await,
        "the log names the file"
    );
}

/// The store's temporary file cannot be planted: a symlink at the name the gateway once
/// used (`.tokens.json.PID`) is not written through, and a state_dir others may write to
/// is warned about.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_never_writes_through_a_planted_symlink() {
    let f = fixtures(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let victim = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(victim.path(), "precious").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = format!("[gateway]\nstate_dir = {:?}\n\n{}", path_str(state.path()), f.tables);
    let gw = Gateway::start_with_env(&config, &[]);
    let pid = gw.child.id();
    std::os::unix::fs::symlink(victim.path(), state.path().join(format!(".tokens.json.{pid}"))).unwrap();
    let alice = Session::open_on(bearer_client(ALICE), &gw.url, json!({"elicitation": {"url": {}}})).await;
    let url = elicitation_url(&alice.call("docs__authorize", json!({})).await);
    let b = browse(&url, None, Some(ALICE)).await;
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(std::fs::read_to_string(victim.path()).unwrap(), "precious");
    let stored = std::fs::read_to_string(state.path().join("tokens.json")).unwrap();
    assert!(stored.contains("alice"), "{stored}");
    let mode = std::fs::metadata(state.path().join("tokens.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        gw.logs().contains("state_dir may be written by others"),
        "{}",
        gw.logs()
    );
    drop((f.authz, f.mcp, f.port));
}

/// Two gateways sharing one state_dir store their users' tokens at the same time: the
/// store's file is read, changed and written under a file lock, so no user's tokens are
/// lost to the other process's write.
#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_sharing_state_dir_lose_no_tokens() {
    const USERS: usize = 24;
    let f = fixtures(&[]).await;
    let state = tempfile::tempdir().unwrap();
    let mut config = format!("[gateway]\nstate_dir = {:?}\n\n{}", path_str(state.path()), f.tables);
    for i in 0..USERS {
        config.push_str(&format!("\n[clients.u{i}]\ntoken = \"user-{i}-token-5d1e9a\"\n"));
    }
    let gws = [
        Gateway::start_with_env(&config, &[]),
        Gateway::start_with_env(&config, &[]),
    ];
    // Each replica lists `authorize` once the server's authorization server is found.
    for gw in &gws {
        let probe = Session::open_on(bearer_client("user-0-token-5d1e9a"), &gw.url, json!({})).await;
        wait_listed(&probe, "docs__authorize", gw).await;
    }
    // Every link first (the first consent replaces `authorize` with the real tools), then
    // every consent at once.
    let mut links = Vec::new();
    for i in 0..USERS {
        let token = format!("user-{i}-token-5d1e9a");
        let s = Session::open_on(
            bearer_client(&token),
            &gws[i % 2].url,
            json!({"elicitation": {"url": {}}}),
        )
        .await;
        links.push((token, elicitation_url(&s.call("docs__authorize", json!({})).await)));
    }
    let consents = links.iter().map(|(token, url)| async move {
        let b = browse(url, None, Some(token)).await;
        assert_eq!(b.status, 200, "{token}: {b:?}");
    });
    futures::future::join_all(consents).await;
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(state.path().join("tokens.json")).unwrap()).unwrap();
    let users: Vec<&String> = file["tokens"]["docs"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with('u'))
        .collect();
    assert_eq!(users.len(), USERS, "tokens lost: {users:?}");
    drop((f.authz, f.mcp, f.port));
}

/// A reload moves `docs` to another URL and changes its scopes: its OAuth client is found
/// again (the new resource, the new scope), and the tokens got for the old URL never go to
/// the new one: the user is asked again.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_moves_the_server_asks_again_and_keeps_old_tokens_away() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    assert_eq!(who(&alice.call("docs__whoami", json!({})).await)["sub"], "alice");
    let old = s.seen().await;

    let py = path_str(&venv_python());
    let port = ReservedPort::new();
    let url2 = format!("http://127.0.0.1:{}/mcp", port.port);
    let p = port.port.to_string();
    let args = [
        "tests/fixtures/protected_mcp.py",
        "--port",
        &p,
        "--audience",
        &url2,
        "--issuer",
        &s.as_base,
    ];
    let _mcp2 = Proc::start(&py, &args, &[]).await;
    let config = std::fs::read_to_string(s.gw.config_path()).unwrap();
    let moved = config
        .replace(&format!("{}/mcp", s.mcp_base), &url2)
        .replace("oauth = {}", "oauth = { scopes = [\"fresh\"] }");
    assert_ne!(moved, config);
    let before = s.gw.logs().matches("reload done").count();
    std::fs::write(s.gw.config_path(), moved).unwrap();
    for _ in 0..100 {
        if s.gw.logs().matches("reload done").count() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(s.gw.logs().matches("reload done").count() > before, "{}", s.gw.logs());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let url = elicitation_url(&alice.call("docs__whoami", json!({})).await);
    let b = browse(&url, None, Some(ALICE)).await;
    assert_eq!(b.status, 200, "{b:?}");
    let authorize = query_of(&b.visited[2]);
    assert_eq!(authorize["resource"], url2, "{:?}", b.visited);
    assert_eq!(authorize["scope"], "fresh", "{:?}", b.visited);
    s.wait_tool(&alice, "docs__whoami").await;
    assert_eq!(who(&alice.call("docs__whoami", json!({})).await)["aud"], url2);
    let seen2: Vec<String> = reqwest::get(url2.replace("/mcp", "/seen"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!seen2.is_empty());
    for v in &seen2 {
        assert!(!old.contains(v), "a token got for the old url went to the new one");
    }
}

/// A user's own connection whose token the server refuses at `initialize` (revoked at the
/// server): the token is refreshed, or (here: the second gateway registered a client of its
/// own, so the refresh token is not its) the user is asked again, rather than the call
/// failing.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_refused_at_initialize_is_refreshed_or_asked_again() {
    let s = setup(&[], &[]).await;
    let alice = s.url_session(ALICE).await;
    s.consent(&alice, ALICE, "docs__authorize").await;
    s.wait_tool(&alice, "docs__whoami").await;
    let alices = s.seen().await;
    let bob = s.url_session(BOB).await;
    s.consent(&bob, BOB, "docs__whoami").await;
    assert!(bob.call("docs__whoami", json!({})).await.get("result").is_some());
    let bobs: Vec<String> = s.seen().await.into_iter().filter(|v| !alices.contains(v)).collect();
    post_ok(&format!("{}/refuse", s.mcp_base), &json!(bobs)).await;

    // A second gateway on the same store: bob's own connection is new there.
    let config = std::fs::read_to_string(s.gw.config_path()).unwrap();
    let gw2 = Gateway::start_with_env(&config, &[]);
    let bob2 = Session::open_on(bearer_client(BOB), &gw2.url, json!({"elicitation": {"url": {}}})).await;
    for _ in 0..50 {
        if bob2.tool_names().await.iter().any(|t| t == "docs__whoami") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.control(json!({"reset_stats": true})).await;
    let r = bob2.call("docs__whoami", json!({})).await;
    elicitation_url(&r);
    assert_eq!(
        s.stats().await["token"]["refresh_token"],
        1,
        "a refresh was tried first"
    );
}

/// A JWT of `issuer` naming `sub`, for the gateway's `[auth.oauth]` (audience
/// `mcp-gateway`), signed with the fixture key the AS's JWKS holds.
fn jwt(issuer: &str, sub: &str) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    h.kid = Some("rsa-test".into());
    let claims = json!({"iss": issuer, "sub": sub, "aud": "mcp-gateway", "exp": now + 3600, "iat": now});
    jsonwebtoken::encode(&h, &claims, &crate::auth::rsa_test_key()).unwrap()
}

/// An `[auth.oauth]` caller's consent is its own, not its name's: after a reload that
/// changes the issuer, a JWT of the new issuer with the same `sub` is asked to consent
/// (the former issuer's caller's stored tokens are never used for it), gets tokens of its
/// own, and `tokens revoke --client NAME` takes away that name's tokens under both.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_sub_from_a_new_issuer_is_asked_for_its_own_consent() {
    let f = fixtures(&[]).await;
    let oauth = format!(
        "[auth.oauth]\nissuer = \"{iss}\"\naudience = \"mcp-gateway\"\njwks_url = \"{iss}/jwks\"\n",
        iss = f.as_base
    );
    let s = setup_on(f, &oauth, &[]);
    let xena_a = jwt(&s.as_base, "xena");
    let under_a = s.url_session(&xena_a).await;
    s.consent(&under_a, &xena_a, "docs__authorize").await;
    s.wait_tool(&under_a, "docs__whoami").await;
    let r = under_a.call("docs__whoami", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    let a_seen = s.seen().await;

    let config = std::fs::read_to_string(s.gw.config_path()).unwrap();
    let moved = config.replace(
        &format!("issuer = \"{}\"", s.as_base),
        "issuer = \"https://issuer-b.test\"",
    );
    assert_ne!(moved, config);
    s.gw.rewrite_config(&moved).await;

    let xena_b = jwt("https://issuer-b.test", "xena");
    let under_b = s.url_session(&xena_b).await;
    s.wait_tool(&under_b, "docs__whoami").await;
    let r = under_b.call("docs__whoami", json!({})).await;
    let url = elicitation_url(&r);
    assert_eq!(
        s.seen().await,
        a_seen,
        "the former issuer's xena's token went out for the new one's"
    );
    // The link is the new xena's: the former one's token does not open it.
    let b = browse(&url, None, Some(&xena_a)).await;
    assert_eq!(b.status, 401, "{b:?}");
    let url = elicitation_url(&under_b.call("docs__whoami", json!({})).await);
    let b = browse(&url, None, Some(&xena_b)).await;
    assert_eq!(b.status, 200, "{b:?}\n{}", s.gw.logs());
    let r = under_b.call("docs__whoami", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    let last = s.seen().await.pop().unwrap();
    assert!(
        !a_seen.contains(&last),
        "the new xena's call carried the former one's token"
    );

    // Both kept, under two principals; the operator's revoke of "xena" takes both.
    let stored = |s: &Setup| -> usize {
        let text = std::fs::read_to_string(s.state.path().join("tokens.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["tokens"]["docs"]
            .as_object()
            .map_or(0, |m| m.keys().filter(|k| k.starts_with("xena\u{0}oauth:")).count())
    };
    assert_eq!(stored(&s), 2);
    let out = Command::new(BIN)
        .args(["tokens", "revoke", "--client", "xena", "--server", "docs", "--config"])
        .arg(s.gw.config_path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("revoked xena's tokens") && !said.contains('\0'), "{said}");
    assert_eq!(stored(&s), 0);
    elicitation_url(&under_b.call("docs__whoami", json!({})).await);
    assert!(!s.gw.logs().contains('\0'), "a principal's NUL in the log");
}
