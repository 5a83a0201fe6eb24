//! The operator's console at `/`, driven in real headless Chromium against the real
//! binary: servers with their calls and charts, the catalog and its search, events after
//! a reload; and who may read it (admins with auth, loopback peers without, nobody when
//! it is off).

use crate::common::{server, unique, Gateway};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const ADMIN: &str = "console-admin-token-5b1d";
const USER: &str = "console-user-token-9c2e";

/// Headless Chromium's DOM of `url` after its scripts ran: `--virtual-time-budget` lets
/// the page's fetches and timers run before the dump. Asked again (up to 10 times) until
/// the page says it rendered its data (`data-ready`), since a budget is no promise.
pub fn dom(profile: &Path, url: &str) -> String {
    let mut last = String::new();
    for _ in 0..10 {
        last = chromium(profile, &["--virtual-time-budget=3000", "--dump-dom", url]);
        // Rendered, or showing the login box (the token was missing or refused).
        if last.contains("data-ready=\"1\"") || last.contains("<form id=\"login\">") {
            return last;
        }
    }
    panic!("the page never rendered its data:\n{last}");
}

fn chromium(profile: &Path, args: &[&str]) -> String {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run chromium (scripts/setup-test-deps installs it): {e}"));
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The markup of one server's card.
pub fn card<'a>(dom: &'a str, name: &str) -> &'a str {
    let start = dom
        .find(&format!("data-server=\"{name}\""))
        .unwrap_or_else(|| panic!("no card for {name}:\n{dom}"));
    let rest = &dom[start..];
    &rest[..rest.find("</article>").unwrap_or(rest.len())]
}

/// The number a card shows under `label`.
fn fact(card: &str, label: &str) -> u64 {
    let at = card
        .find(&format!("<span>{label}</span><b>"))
        .unwrap_or_else(|| panic!("no {label}: {card}"));
    let rest = &card[at + label.len() + 16..];
    rest[..rest.find('<').unwrap_or(0)]
        .parse()
        .unwrap_or_else(|_| panic!("{label} is not a number: {card}"))
}

async fn wait_for(timeout: Duration, what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn two_servers() -> String {
    [
        server("calc", &unique("console-calc"), &[], ""),
        server("docs", &unique("console-docs"), &[], ""),
    ]
    .concat()
}

#[tokio::test]
async fn the_console_shows_servers_catalog_and_events_in_chromium() {
    let config = two_servers();
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    for i in 0..20 {
        let r = s.call("calc__add", json!({"a": i, "b": 1})).await;
        assert!(r.get("result").is_some(), "{r}");
        let r = s.call("docs__echo", json!({"text": "hi"})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    // Some failing: tool errors, and a server that exits in the middle of a call (an
    // error naming it, a restart).
    for _ in 0..3 {
        let r = s.call("calc__add", json!({"a": "x", "b": 1})).await;
        assert_eq!(r["result"]["isError"], true, "{r}");
    }
    let r = s.call("docs__crash", json!({})).await;
    assert!(r.get("error").is_some(), "{r}");
    wait_for(Duration::from_secs(20), "docs back", async || {
        let st = gw.server_status("docs").await;
        st["state"] == "ready" && st["restarts"].as_u64() >= Some(1)
    })
    .await;
    let profile = tempfile::tempdir().unwrap();

    let page = dom(profile.path(), &format!("{}/", gw.base));
    for name in ["calc", "docs"] {
        let c = card(&page, name);
        assert!(c.contains("state ready"), "{c}");
        assert!(fact(c, "calls (15 min)") >= 21, "{c}");
        assert!(c.contains("<svg class=\"spark\""), "no chart: {c}");
        assert!(c.contains("<polyline class=\"calls\""), "no calls line: {c}");
    }
    assert!(
        !card(&page, "calc").contains("error rate</span><b>0.0 %"),
        "calc had tool errors"
    );
    // The catalog lists a known tool with its server and original name; the client's
    // row counts its calls and says why the last one failed.
    assert!(page.contains("data-name=\"calc__add\""), "{page}");
    assert!(page.contains("<td>calc</td><td>add</td>"), "{page}");
    assert!(page.contains("data-client=\"address 127.0.0.1\""), "{page}");
    assert!(
        page.contains("docs__crash (server docs)"),
        "the client's last error: {page}"
    );
    // The server's failure is an event naming it, and so is its restart.
    assert!(page.contains("data-kind=\"error\""), "{page}");
    assert!(page.contains("data-kind=\"restart\""), "{page}");
    assert!(fact(card(&page, "docs"), "restarts") >= 1, "{page}");

    // The search narrows the catalog (the page reads ?q=, as it writes it when typed in).
    let found = dom(profile.path(), &format!("{}/?q=echo_meta", gw.base));
    assert!(found.contains("data-name=\"calc__echo_meta\""), "{found}");
    assert!(found.contains("data-name=\"docs__echo_meta\""), "{found}");
    assert!(
        !found.contains("data-name=\"calc__add\""),
        "the search did not narrow: {found}"
    );
    assert!(found.contains("2 of "), "{found}");
    // Over descriptions too.
    let found = dom(profile.path(), &format!("{}/?q=two%20numbers", gw.base));
    assert!(
        found.contains("data-name=\"calc__add\"") && !found.contains("data-name=\"calc__echo\""),
        "{found}"
    );

    // A reload: a third server. The gateway picks the file up on its own.
    let more = unique("console-more");
    std::fs::write(gw.config_path(), format!("{config}{}", server("more", &more, &[], ""))).unwrap();
    wait_for(Duration::from_secs(20), "the reload event", async || {
        gw.get_json("/status/events").await["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["kind"] == "reload"))
    })
    .await;
    let events = gw.get_json("/status/events").await;
    let reload = events["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "reload"))
        .cloned()
        .unwrap_or(Value::Null);
    assert!(
        reload["text"].as_str().unwrap_or("").contains("started more"),
        "{reload}"
    );
    let page = dom(profile.path(), &format!("{}/", gw.base));
    assert!(page.contains("data-kind=\"reload\""), "{page}");
    assert!(page.contains("started more"), "{page}");
    assert!(page.contains("data-kind=\"session_opened\""), "{page}");

    let shot = gw.dir.path().join("console.png");
    chromium(
        profile.path(),
        &[
            "--virtual-time-budget=3000",
            "--window-size=1280,1500",
            &format!("--screenshot={}", shot.display()),
            &format!("{}/", gw.base),
        ],
    );
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "a screenshot of {size} bytes");
    if let Ok(to) = std::env::var("CONSOLE_SCREENSHOT") {
        std::fs::copy(&shot, to).unwrap();
    }
    // The temp folder goes with the gateway: a copy stays (one file, each run overwrites it).
    let kept = std::env::temp_dir().join("mcp-gateway-console.png");
    std::fs::copy(&shot, &kept).unwrap();
    println!("console screenshot: {} (kept at {})", shot.display(), kept.display());
}

/// Text a server (or an override) gives is shown as text: a tool description with markup
/// does not become elements.
#[tokio::test]
async fn tool_text_is_never_markup() {
    let hostile = "<img src=x onerror=alert(1)><script>alert(2)</script> hostile";
    let config = server(
        "calc",
        &unique("console-calc"),
        &[],
        &format!("\n[servers.calc.overrides.echo]\ndescription = {hostile:?}\n"),
    );
    let gw = Gateway::start(&config);
    let profile = tempfile::tempdir().unwrap();
    let page = dom(profile.path(), &format!("{}/?q=hostile", gw.base));
    assert!(page.contains("data-name=\"calc__echo\""), "{page}");
    assert!(
        page.contains("&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<img") && !page.contains("<script>alert"),
        "markup became elements: {page}"
    );
}

fn authed() -> String {
    format!(
        "{}[clients.ops]\ntoken = \"{ADMIN}\"\nadmin = true\n\n[clients.app]\ntoken = \"{USER}\"\n",
        two_servers()
    )
}

async fn get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut r = reqwest::Client::new().get(url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn with_clients_the_console_needs_an_admin_token() {
    let gw = Gateway::start(&authed());
    for path in ["/status", "/status/events", "/status/catalog", "/status/stream"] {
        let url = format!("{}{path}", gw.base);
        assert_eq!(get(&url, None).await.0, 401, "{path} without a token");
        assert_eq!(get(&url, Some("nope")).await.0, 401, "{path} with an unknown token");
        let (code, body) = get(&url, Some(USER)).await;
        assert_eq!(code, 403, "{path} with a client's token that is not an admin's: {body}");
        assert!(body.contains("admin = true"), "{body}");
    }
    let (code, body) = get(&format!("{}/status", gw.base), Some(ADMIN)).await;
    assert_eq!(code, 200, "{body}");
    let st: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["servers"].as_array().map(Vec::len), Some(2), "{st}");
    assert!(
        !body.contains(ADMIN) && !body.contains(USER),
        "a token in /status: {body}"
    );
    let (code, body) = get(&format!("{}/status/catalog", gw.base), Some(ADMIN)).await;
    assert_eq!(code, 200);
    let cat: Value = serde_json::from_str(&body).unwrap();
    let add = cat["items"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["name"] == "calc__add"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(add["clients"], json!(["app", "ops"]), "{add}");
    // Health stays open; the page is static (no data) and asks for the token.
    for path in ["/healthz", "/readyz", "/"] {
        assert_eq!(get(&format!("{}{path}", gw.base), None).await.0, 200, "{path}");
    }
    let profile = tempfile::tempdir().unwrap();
    let page = dom(profile.path(), &format!("{}/", gw.base));
    assert!(page.contains("<form id=\"login\">"), "no login box: {page}");
    assert!(!page.contains("data-server=\"calc\""), "{page}");
    // The token once in the address: the page keeps it (sessionStorage) and shows the data.
    let page = dom(profile.path(), &format!("{}/?token={ADMIN}", gw.base));
    assert!(card(&page, "calc").contains("state ready"), "{page}");
    assert!(!page.contains(ADMIN), "the token stayed in the page: {page}");
}

/// A page that rebinds its own name to the gateway's address reads it from the operator's
/// browser with that name in `Host` (and maybe in `Origin`): the console and `/status*` are
/// refused to it as the endpoint is, from loopback and without auth too. Two
/// `Authorization` headers are refused, not read by the first.
#[tokio::test]
async fn a_rebound_name_reads_neither_the_console_nor_status() {
    let gw = Gateway::start(&two_servers());
    let port = gw.base.rsplit(':').next().unwrap_or_default().to_owned();
    let send = |path: &str, host: Option<String>, origin: Option<&str>| {
        let mut r = reqwest::Client::new().get(format!("{}{path}", gw.base));
        if let Some(h) = host {
            r = r.header("host", h);
        }
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    for path in [
        "/status",
        "/status/events",
        "/status/catalog",
        "/status/stream",
        "/",
        "/console.js",
    ] {
        let rebound = Some(format!("rebind.attacker.example:{port}"));
        assert_eq!(send(path, rebound, None).await, 403, "{path} with a rebound Host");
        let foreign = Some("http://rebind.attacker.example");
        assert_eq!(send(path, None, foreign).await, 403, "{path} with a foreign Origin");
        assert_eq!(send(path, Some(format!("localhost:{port}")), None).await, 200, "{path}");
    }
    let gw = Gateway::start(&authed());
    let r = reqwest::Client::new()
        .get(format!("{}/status", gw.base))
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("authorization", format!("Bearer {USER}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "two Authorization headers");
}

/// A local address that is not loopback, if this host has one (the one a route out uses;
/// nothing is sent).
fn outside_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    s.local_addr()
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

#[tokio::test]
async fn without_auth_the_console_is_for_loopback_peers_only() {
    let gw = Gateway::start_listening(&two_servers(), "0.0.0.0:0", &[]);
    let port = gw.base.rsplit(':').next().unwrap_or_default().to_owned();
    for path in ["/status", "/status/events", "/"] {
        let (code, _) = get(&format!("http://127.0.0.1:{port}{path}"), None).await;
        assert_eq!(code, 200, "{path} from loopback");
    }
    let ip = outside_address().expect("this host has no address but loopback: the test cannot check a remote peer");
    for path in [
        "/status",
        "/status/events",
        "/status/stream",
        "/status/catalog",
        "/",
        "/console.js",
    ] {
        let (code, body) = get(&format!("http://{ip}:{port}{path}"), None).await;
        assert_eq!(code, 403, "{path} from {ip}: {body}");
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(get(&format!("http://{ip}:{port}{path}"), None).await.0, 200, "{path}");
    }
}

#[tokio::test]
async fn the_console_can_be_switched_off() {
    let gw = Gateway::start(&format!("[gateway]\nconsole = false\n\n{}", two_servers()));
    for path in ["/", "/status", "/status/stream", "/console.js"] {
        assert_eq!(get(&format!("{}{path}", gw.base), None).await.0, 404, "{path}");
    }
    assert_eq!(get(&format!("{}/healthz", gw.base), None).await.0, 200);
}

/// A client over its limit: its row says which limit refused it and how often, and the
/// burst is one event with a count (not one per refusal); with profiles, the catalog says
/// which profile shows each tool.
#[tokio::test]
async fn rate_limits_show_on_the_clients_row_as_one_burst() {
    let config = format!(
        "[rate_limits]\nper_client = \"2/m\"\n\n[profiles.math]\nservers = [\"calc\"]\n\n{}",
        two_servers()
    );
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    let mut refused = 0;
    for i in 0..8 {
        let r = s.call("calc__add", json!({"a": i, "b": 1})).await;
        if r["result"]["isError"] == true {
            refused += 1;
        }
    }
    assert!(refused >= 5, "{refused} refused of 8 at 2/m");
    let st = gw.get_json("/status").await;
    let row = &st["clients"][0];
    assert_eq!(row["name"], "address 127.0.0.1", "{st}");
    assert_eq!(row["sessions"], 1, "{row}");
    assert_eq!(row["calls"], 8, "{row}");
    let limited = &row["rateLimited"][0];
    assert!(
        limited["limit"].as_str().is_some_and(|l| l.contains("per_client")),
        "{row}"
    );
    assert_eq!(limited["count"], refused, "{row}");
    let events = gw.get_json("/status/events").await;
    let bursts: Vec<&Value> = events["events"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["kind"] == "rate_limited").collect())
        .unwrap_or_default();
    assert_eq!(bursts.len(), 1, "one event for the burst: {events}");
    assert_eq!(bursts[0]["count"], refused, "{events}");
    // A client's limit refuses before any server is chosen: calc counts only what reached it.
    let calc = gw.server_status("calc").await;
    assert_eq!(calc["calls"], 8 - refused, "{calc}");
    assert_eq!(calc["errors"], 0, "{calc}");

    let cat = gw.get_json("/status/catalog").await;
    let item = |name: &str| {
        cat["items"]
            .as_array()
            .and_then(|i| i.iter().find(|i| i["name"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(item("calc__add")["profiles"], json!(["math"]), "{cat}");
    assert_eq!(item("docs__add")["profiles"], json!([]), "{cat}");
    assert_eq!(item("calc__add")["original"], "add");
    assert_eq!(item("calc__add")["clients"], Value::Null, "no auth: everyone");
    assert!(item("calc__add")["inputSchema"]["properties"]["a"].is_object(), "{cat}");
}

#[tokio::test]
async fn behind_a_trusted_balancer_on_this_host_a_caller_is_not_loopback() {
    let gw = Gateway::start(&format!(
        "[gateway]\ntrusted_proxies = [\"127.0.0.1\"]\n\n{}",
        two_servers()
    ));
    let status = |xff: &'static str| {
        let url = format!("{}/status", gw.base);
        async move {
            reqwest::Client::new()
                .get(url)
                .header("x-forwarded-for", xff)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("203.0.113.5").await, 403, "a remote caller through the balancer");
    assert_eq!(status("127.0.0.1").await, 200, "a local one");
}

fn console_server(table: &str) -> String {
    server(table, &unique("console-peer"), &["--console"], "")
}

fn event_texts(events: &Value, kind: &str) -> Vec<String> {
    events["events"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| e["kind"] == kind)
                .map(|e| e["text"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A server's megabytes of error message, or a client's megabyte argument echoed in one,
/// are cut where the console records them: the events and the client's last error keep a
/// few hundred characters, marked as cut, and `/status` stays small.
#[tokio::test]
async fn a_huge_error_message_is_cut_where_the_console_records_it() {
    let gw = Gateway::start(&console_server("big"));
    let s = gw.session().await;
    let r = s.call("big__fail", json!({"text": "boom ", "size": 4_000_000})).await;
    assert!(
        r["error"]["message"].as_str().is_some_and(|m| m.len() > 4_000_000),
        "the client gets it whole"
    );
    let echoed = "A".repeat(2_000_000);
    let r = s.call("big__fail", json!({"text": echoed})).await;
    assert!(r.get("error").is_some(), "{}", r.to_string().len());

    let status = gw.get_text("/status").await;
    assert!(status.len() < 16_000, "/status is {} bytes", status.len());
    let st: Value = serde_json::from_str(&status).unwrap();
    let last = st["clients"][0]["lastError"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        last.starts_with("tools/call big__fail (server big): AAAA") && last.ends_with("bytes cut)") && last.len() < 600,
        "{last}"
    );
    let events = gw.get_text("/status/events").await;
    assert!(events.len() < 16_000, "/status/events is {} bytes", events.len());
    let errors = event_texts(&serde_json::from_str(&events).unwrap(), "error");
    assert!(!errors.is_empty(), "{events}");
    assert!(
        errors.iter().all(|t| t.contains("bytes cut)") && t.len() < 600),
        "{errors:?}"
    );
}

/// Without auth every address is a client of its own: sessions opened from 250 loopback
/// addresses fill the routine ring, and the events an operator needs (a server failing,
/// restarting) stay.
#[tokio::test]
async fn sessions_from_many_addresses_do_not_push_out_other_events() {
    let gw = Gateway::start(&two_servers());
    let s = gw.session().await;
    let r = s.call("docs__crash", json!({})).await;
    assert!(r.get("error").is_some(), "{r}");
    wait_for(Duration::from_secs(20), "docs back", async || {
        gw.server_status("docs").await["restarts"].as_u64() >= Some(1)
    })
    .await;
    for batch in 0..5u8 {
        let opens = (0..50u8).map(|i| {
            let ip = std::net::IpAddr::from([127, 0, 1 + batch, 2 + i]);
            let http = reqwest::Client::builder().local_address(ip).build().unwrap();
            crate::common::Session::open_on(http, &gw.url, json!({}))
        });
        futures::future::join_all(opens).await;
    }
    let events = gw.get_json("/status/events").await;
    let opened = event_texts(&events, "session_opened");
    assert!(opened.len() >= 200, "{} session events", opened.len());
    assert!(
        !event_texts(&events, "error").is_empty(),
        "the failed call's event was pushed out"
    );
    assert!(
        !event_texts(&events, "restart").is_empty(),
        "the restart was pushed out"
    );
    let seqs: Vec<u64> = events["events"]
        .as_array()
        .map(|e| e.iter().filter_map(|e| e["seq"].as_u64()).collect())
        .unwrap_or_default();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "newest first: {seqs:?}");
}

/// `/metrics` names servers and tools: a page that rebinds its name to the gateway's
/// address does not read it; a scraper naming the gateway by an address does. The probes
/// say one word and stay open.
#[tokio::test]
async fn metrics_checks_host_and_origin_as_the_console_does() {
    let gw = Gateway::start(&two_servers());
    let port = gw.base.rsplit(':').next().unwrap_or_default().to_owned();
    let send = |path: &str, host: String, origin: Option<&str>| {
        let mut r = reqwest::Client::new()
            .get(format!("{}{path}", gw.base))
            .header("host", host);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let rebound = format!("rebind.attacker.example:{port}");
    let (code, body) = send("/metrics", rebound.clone(), None).await;
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("calc"), "{body}");
    let local = format!("localhost:{port}");
    let foreign = Some("http://rebind.attacker.example");
    assert_eq!(
        send("/metrics", local.clone(), foreign).await.0,
        403,
        "a foreign Origin"
    );
    assert_eq!(send("/metrics", local, None).await.0, 200);
    for ip in ["10.1.2.3:9090", "[fd00::1]:80", "192.0.2.7"] {
        let (code, body) = send("/metrics", ip.to_owned(), None).await;
        assert_eq!(code, 200, "Host {ip}: {body}");
        assert!(body.contains("mcp_gateway_"), "{body}");
    }
    for path in ["/healthz", "/readyz"] {
        let (code, body) = send(path, rebound.clone(), None).await;
        assert_eq!(code, 200, "{path}");
        assert!(body.len() < 16, "{path} says more than a word: {body}");
    }
}

/// A tool's title and annotations show in the catalog (and `/status/catalog`), and format
/// characters (a bidi override, a zero-width space) are shown escaped, never raw: a tool
/// `delete_all` titled `read_file\u202e` is found by `read_file` and visibly so.
#[tokio::test]
async fn the_catalog_shows_titles_annotations_and_hidden_characters() {
    let gw = Gateway::start(&console_server("x"));
    let cat = gw.get_json("/status/catalog").await;
    let item = cat["items"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["name"] == "x__delete_all"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(item["title"], "read_file\u{202e}", "{item}");
    assert_eq!(item["annotations"]["readOnlyHint"], true, "{item}");
    let profile = tempfile::tempdir().unwrap();
    let page = dom(profile.path(), &format!("{}/?q=read_file", gw.base));
    assert!(page.contains("data-name=\"x__delete_all\""), "{page}");
    assert!(page.contains("title: read_file\\u{202e}"), "{page}");
    assert!(page.contains("readOnlyHint: true · destructiveHint: false"), "{page}");
    let page = dom(profile.path(), &format!("{}/", gw.base));
    assert!(page.contains("\\u{202e}eteled_lla"), "{page}");
    assert!(page.contains("Reversed \\u{200b}name."), "{page}");
    for c in ['\u{202e}', '\u{200b}'] {
        assert!(!page.contains(c), "{c:?} shown raw: {page}");
    }
}

/// An `isError` result is an error on the client's row as on the server's card.
#[tokio::test]
async fn tool_errors_count_on_the_clients_row_as_on_the_servers_card() {
    let gw = Gateway::start(&two_servers());
    let s = gw.session().await;
    for _ in 0..5 {
        let r = s.call("calc__add", json!({"a": "x", "b": 1})).await;
        assert_eq!(r["result"]["isError"], true, "{r}");
    }
    let st = gw.get_json("/status").await;
    let calc = st["servers"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "calc"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(calc["errors"], 5, "{calc}");
    let row = &st["clients"][0];
    assert_eq!(row["errors"], 5, "{row}");
    assert_eq!(
        row["lastError"]["text"], "tools/call calc__add (server calc): the tool answered isError: true",
        "{row}"
    );
}

/// `/status/events?since=abc` tells a stranger no more than `/status/events` does; an
/// admin gets the 400.
#[tokio::test]
async fn status_events_checks_access_before_its_query() {
    let gw = Gateway::start(&authed());
    let url = format!("{}/status/events?since=abc", gw.base);
    assert_eq!(get(&url, None).await.0, 401);
    assert_eq!(get(&url, Some(USER)).await.0, 403);
    assert_eq!(get(&url, Some(ADMIN)).await.0, 400);
    assert_eq!(
        get(&format!("{}/status/events?since=0", gw.base), Some(ADMIN)).await.0,
        200
    );
}

/// At most 64 `/status/stream` watchers at once: past it, 503 saying so; a closed one
/// makes room.
#[tokio::test]
async fn status_stream_watchers_are_capped() {
    let gw = Gateway::start(&two_servers());
    let url = format!("{}/status/stream", gw.base);
    let http = reqwest::Client::new();
    let mut open = Vec::new();
    for i in 0..64 {
        let r = http.get(&url).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "watcher {i}");
        open.push(r);
    }
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.text().await.unwrap().contains("64 /status/stream"));
    drop(open.pop());
    wait_for(Duration::from_secs(10), "room for a watcher", async || {
        http.get(&url).send().await.unwrap().status().as_u16() == 200
    })
    .await;
}

/// A server that changes its tools hundreds of times sends as many list_changed: one event
/// per burst, so they do not push out a failure either.
#[tokio::test]
async fn a_flood_of_list_changed_is_one_event_per_burst() {
    let gw = Gateway::start(&two_servers());
    let s = gw.session().await;
    let r = s.call("docs__crash", json!({})).await;
    assert!(r.get("error").is_some(), "{r}");
    for i in 0..250 {
        let r = s.call("calc__add_tool", json!({"name": format!("t{i}")})).await;
        assert!(r.get("result").is_some(), "{r}");
    }
    wait_for(Duration::from_secs(20), "the last tool listed", async || {
        gw.get_json("/status/catalog").await["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|i| i["name"] == "calc__t249"))
    })
    .await;
    let events = gw.get_json("/status/events").await;
    let changed = event_texts(&events, "list_changed");
    assert!(
        !changed.is_empty() && changed.len() < 10,
        "{} list_changed events",
        changed.len()
    );
    assert!(
        !event_texts(&events, "error").is_empty(),
        "the failed call's event was pushed out"
    );
}

/// Reads `/status/stream` until it ends; whether it did within `within`.
async fn ends_within(r: reqwest::Response, within: Duration) -> bool {
    use futures::StreamExt;
    let mut body = r.bytes_stream();
    tokio::time::timeout(within, async { while let Some(Ok(_)) = body.next().await {} })
        .await
        .is_ok()
}

/// Opens `/status/stream` as `token` and reads its first frame.
async fn watching(base: &str, token: &str) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .get(format!("{base}/status/stream"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // The first frame comes at once; the stream stays open after it.
    let mut first = Vec::new();
    while !String::from_utf8_lossy(&first).contains("event: status") {
        first.extend_from_slice(&r.chunk().await.unwrap().expect("a first frame"));
    }
    r
}

/// A `/status/stream` opened with an admin's token ends once a reload takes the token's
/// `admin = true` away: the console's data is refused to it as to a new request, not
/// streamed on for as long as the connection lasts.
#[tokio::test]
async fn a_status_stream_ends_when_a_reload_takes_admin_away() {
    let gw = Gateway::start(&authed());
    let stream = watching(&gw.base, ADMIN).await;
    std::fs::write(gw.config_path(), authed().replace("admin = true\n", "")).unwrap();
    wait_for(Duration::from_secs(20), "the reload", async || {
        get(&format!("{}/status", gw.base), Some(ADMIN)).await.0 == 403
    })
    .await;
    assert!(
        ends_within(stream, Duration::from_secs(10)).await,
        "the stream went on after admin was taken away; logs:\n{}",
        gw.logs()
    );
}

/// An OAuth admin's `/status/stream` ends once its JWT expires (past the leeway), as a
/// new request with it would be refused.
#[tokio::test]
async fn a_status_stream_ends_when_its_jwt_expires() {
    use crate::auth::{keys, serve_jwks, sign, AUDIENCE, ISSUER};
    let k = keys();
    let (jwks_url, _) = serve_jwks(k.jwks.clone()).await;
    let gw = Gateway::start(&format!(
        "{}[clients.boss]\nadmin = true\n\n[auth.oauth]\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\njwks_url = \"{jwks_url}\"\n",
        two_servers()
    ));
    // Expired 27 s ago: within the gateway's 30 s leeway for about 3 s more.
    let now = jsonwebtoken::get_current_timestamp();
    let jwt = sign(
        jsonwebtoken::Algorithm::ES256,
        "ec-1",
        &k.ec,
        &json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "boss", "exp": now - 27, "iat": now - 600}),
    );
    let stream = watching(&gw.base, &jwt).await;
    assert!(
        ends_within(stream, Duration::from_secs(15)).await,
        "the stream went on after its JWT expired; logs:\n{}",
        gw.logs()
    );
    assert_eq!(get(&format!("{}/status", gw.base), Some(&jwt)).await.0, 401);
}
