//! Operations, end to end with the real binary and real children: rate limits (exact
//! answers, refill, checked before any downstream is touched, per-IP before parsing),
//! `/metrics` scraped and parsed, and the health routes (`/healthz`, `/readyz`,
//! `/status`, the HTML page) with no secret in them.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// A mock server table with a rate_limits line.
fn limited_server(table: &str, mock_name: &str, limits: &str) -> String {
    server(table, mock_name, &[], &format!("rate_limits = {limits}\n"))
}

/// The seconds in a rate-limit sentence's "Retry after X s".
fn retry_secs(text: &str) -> f64 {
    let rest = text
        .split_once("Retry after ")
        .unwrap_or_else(|| panic!("no 'Retry after' in {text:?}"))
        .1;
    let n = rest.split_once(" s").unwrap_or_else(|| panic!("no ' s' in {text:?}")).0;
    n.parse().unwrap_or_else(|e| panic!("{n:?} in {text:?}: {e}"))
}

/// Asserts a tools/call answer is the rate-limit tool error naming `what`; returns the
/// advertised wait in seconds.
fn assert_limited_tool(resp: &Value, what: &str) -> f64 {
    assert!(
        resp.get("error").is_none(),
        "a limited tool call is a tool result: {resp}"
    );
    assert_eq!(resp["result"]["isError"], true, "{resp}");
    let t = text(resp);
    assert!(t.contains("Rate limit exceeded"), "{t}");
    assert!(t.contains(what), "{t:?} should name {what:?}");
    let secs = retry_secs(&t);
    assert!(secs > 0.0, "{t}");
    secs
}

/// Asserts a non-tool answer is error -32029 with `data.retryAfterMs`; returns it.
fn assert_limited_error(resp: &Value, what: &str) -> u64 {
    let e = error_of(resp);
    assert_eq!(e["code"], -32029, "{resp}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(what) && msg.contains("Retry after"), "{msg}");
    assert!(e["data"]["limit"].as_str().unwrap().contains(what), "{resp}");
    let ms = e["data"]["retryAfterMs"]
        .as_u64()
        .unwrap_or_else(|| panic!("no retryAfterMs: {resp}"));
    assert!(ms > 0, "{resp}");
    ms
}

async fn add(s: &Session, a: i64, b: i64) -> Value {
    s.call("calc__add", json!({"a": a, "b": b})).await
}

// ---------------------------------------------------------------- rate limits

#[tokio::test]
async fn per_tool_limit_passes_the_burst_then_answers_a_tool_error() {
    let name = unique("calc");
    let gw = Gateway::start(&limited_server("calc", &name, r#"{ per_tool = { add = "3/m" } }"#));
    let s = gw.session().await;
    for i in 0..3 {
        let r = add(&s, i, 1).await;
        assert_eq!(text(&r), (i + 1).to_string(), "call {i} is within the burst: {r}");
    }
    let r = add(&s, 5, 5).await;
    let secs = assert_limited_tool(&r, "limit for tool add 3/m");
    assert!(secs <= 20.0, "3/m refills one call every 20 s: {r}");
    assert!(text(&r).contains("'calc'"), "{r}");
    // The limit is the tool's, across clients; the server's other tools are not limited.
    let other = gw.session().await;
    assert_limited_tool(&add(&other, 1, 1).await, "add 3/m");
    for _ in 0..5 {
        assert_eq!(text(&s.call("calc__echo", json!({"text": "free"})).await), "free");
    }
}

#[tokio::test]
async fn per_client_limit_answers_other_requests_with_32029_and_retry_after_ms() {
    let name = unique("calc");
    let config = format!(
        "[rate_limits]\nper_client = \"2/s\"\n\n{}",
        server("calc", &name, &[], "")
    );
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    for _ in 0..2 {
        let r = s.request(json!(1), "prompts/list", json!({})).await;
        assert!(r["result"]["prompts"].is_array(), "{r}");
    }
    let r = s.request(json!(2), "prompts/list", json!({})).await;
    assert_eq!(r["id"], 2);
    let ms = assert_limited_error(&r, "per_client limit 2/s");
    assert!(ms <= 500, "2/s refills one request every 500 ms, not {ms}");
    // The same limit on a tool call is a tool result a model can read.
    assert_limited_tool(
        &s.call("calc__echo", json!({"text": "x"})).await,
        "per_client limit 2/s",
    );
    // A client is its session: another one has its own budget.
    let other = gw.session().await;
    assert_eq!(text(&other.call("calc__echo", json!({"text": "mine"})).await), "mine");
    let r = other.request(json!(3), "tools/list", json!({})).await;
    assert!(r["result"]["tools"].is_array(), "{r}");
}

#[tokio::test]
async fn waiting_the_advertised_time_is_enough() {
    let name = unique("calc");
    let config = format!(
        "[rate_limits]\nper_client = \"5/s burst 1\"\n\n{}",
        limited_server("calc", &name, r#"{ per_tool = { add = "2/s burst 1" } }"#)
    );
    let gw = Gateway::start(&config);

    // A JSON-RPC error: wait data.retryAfterMs, then the next request passes.
    let s = gw.session().await;
    for round in 0..3 {
        let r = s.request(json!(round), "prompts/list", json!({})).await;
        assert!(r["result"]["prompts"].is_array(), "round {round}: {r}");
        let r = s.request(json!(round), "prompts/list", json!({})).await;
        let ms = assert_limited_error(&r, "per_client limit 5/s burst 1");
        assert!(ms <= 200, "5/s refills one request every 200 ms, not {ms}");
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let r = s.request(json!("last"), "prompts/list", json!({})).await;
    assert!(r["result"]["prompts"].is_array(), "{r}");

    // A tool error: wait "Retry after X s", then the next call passes. Every call is
    // from its own session so the per_client limit stays out of the way.
    let mut sessions = Vec::new();
    for _ in 0..7 {
        sessions.push(gw.session().await);
    }
    for round in 0..3 {
        let (a, b) = (&sessions[2 * round], &sessions[2 * round + 1]);
        let n = round as i64;
        assert_eq!(text(&add(a, n, 2).await), (n + 2).to_string(), "round {round}");
        let secs = assert_limited_tool(&add(b, 1, 1).await, "limit for tool add 2/s burst 1");
        assert!(secs <= 0.5, "2/s refills one call every 500 ms, not {secs}");
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    }
    assert_eq!(text(&add(&sessions[6], 2, 2).await), "4");
}

#[tokio::test]
async fn limits_are_checked_before_the_server_is_touched() {
    let name = unique("fragile");
    let gw = Gateway::start(&limited_server("fragile", &name, r#"{ per_server = "1/m" }"#));
    let pids = mock_pids(&name);
    assert_eq!(pids.len(), 1, "{pids:?}");
    let s = gw.session().await;
    assert_eq!(text(&s.call("fragile__echo", json!({"text": "one"})).await), "one");
    // `crash` would end the child: limited, it never reaches it.
    for _ in 0..3 {
        let r = s.call("fragile__crash", json!({})).await;
        assert_limited_tool(&r, "server 'fragile' limit 1/m");
    }
    // Other requests to that server are limited too, as JSON-RPC errors.
    let r = s
        .request(
            json!(9),
            "prompts/get",
            json!({"name": "fragile__greet", "arguments": {"name": "x"}}),
        )
        .await;
    assert_limited_error(&r, "server 'fragile' limit 1/m");
    let r = s
        .request(
            json!(10),
            "resources/read",
            json!({"uri": format!("mock://{name}/readme")}),
        )
        .await;
    assert_limited_error(&r, "server 'fragile' limit 1/m");
    // Lists are answered by the gateway from its catalog: not limited by a server limit.
    assert!(s.tool_names().await.contains(&"fragile__crash".to_string()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(alive(pids[0]), "the limited crash call reached the child");
    assert_eq!(mock_pids(&name), pids);
    let st = gw.server_status("fragile").await;
    assert_eq!(st["state"], "ready", "{st}");
    assert_eq!(st["pid"], pids[0], "{st}");
    assert!(!gw.logs().contains("crash requested"), "{}", gw.logs());
}

#[tokio::test]
async fn per_ip_flood_gets_429_with_retry_after_before_the_body_is_parsed() {
    let name = unique("calc");
    let config = format!("[rate_limits]\nper_ip = \"5/m\"\n\n{}", server("calc", &name, &[], ""));
    let gw = Gateway::start(&config);
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let r = http
            .post(&gw.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body("this is {not json")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        statuses.push(status);
        if status == 429 {
            let retry: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .expect("Retry-After is whole seconds");
            assert!(
                (1..=12).contains(&retry),
                "5/m refills one request every 12 s, not {retry}"
            );
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], -32029, "{body}");
            assert!(
                body["error"]["message"].as_str().unwrap().contains("per_ip limit 5/m"),
                "{body}"
            );
        } else {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], -32700, "{body}");
        }
    }
    // The burst was parsed (400 parse error); the rest never were.
    assert_eq!(statuses[..5], [400; 5], "{statuses:?}");
    assert_eq!(statuses[5..], [429; 15], "{statuses:?}");
    // A valid initialize from the same address is refused the same way.
    let r = http
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // Health and metrics are not behind the MCP endpoint's limit.
    for path in ["/healthz", "/readyz", "/metrics", "/status"] {
        let r = reqwest::get(format!("{}{path}", gw.base)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let m = scrape(&gw).await;
    assert_eq!(
        m.value("mcp_gateway_rate_limited_total", &[("limit", "per_ip limit 5/m")]),
        Some(16.0)
    );
}

// ---------------------------------------------------------------- /metrics

/// One sample of the Prometheus text format.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed scrape: samples in order and `# TYPE` per family.
#[derive(Debug, Default)]
struct Scrape {
    samples: Vec<Sample>,
    types: HashMap<String, String>,
}

impl Scrape {
    /// Samples named `name` whose labels include every pair of `labels`.
    fn find<'a>(&'a self, name: &'a str, labels: &'a [(&'a str, &'a str)]) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The value of the one sample with exactly these labels (besides none other).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let exact: Vec<_> = self
            .find(name, labels)
            .filter(|s| s.labels.len() == labels.len())
            .collect();
        assert!(exact.len() <= 1, "{name} {labels:?} appears twice: {exact:?}");
        exact.first().map(|s| s.value)
    }

    /// The sum over samples matching `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).map(|s| s.value).sum()
    }
}

/// Parses the Prometheus text exposition format (0.0.4), strictly enough for a test:
/// every sample belongs to a family with a `# TYPE`, label values are quoted with
/// `\\`, `\"` and `\n` escapes, and values are floats (`+Inf`, `-Inf`, `NaN` too).
fn parse_prometheus(text: &str) -> Scrape {
    let mut out = Scrape::default();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let words: Vec<&str> = rest.split_whitespace().collect();
            if words.first() == Some(&"TYPE") {
                assert_eq!(words.len(), 3, "line {n}: {line}");
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&words[2]),
                    "line {n}: {line}"
                );
                let old = out.types.insert(words[1].to_owned(), words[2].to_owned());
                assert!(old.is_none(), "line {n}: a second TYPE for {}", words[1]);
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("line {n}: no value: {line}"));
        let name = &line[..name_end];
        assert!(
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "line {n}: bad metric name {name:?}"
        );
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let end = loop {
                let Some(&(i, c)) = chars.peek() else {
                    panic!("line {n}: unterminated labels: {line}")
                };
                if c == '}' {
                    break i + 1;
                }
                let mut key = String::new();
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                assert!(
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "line {n}: bad label name {key:?}"
                );
                assert_eq!(chars.next().map(|p| p.1), Some('"'), "line {n}: label value not quoted");
                let mut value = String::new();
                loop {
                    match chars.next().map(|p| p.1) {
                        Some('"') => break,
                        Some('\\') => match chars.next().map(|p| p.1) {
                            Some('\\') => value.push('\\'),
                            Some('"') => value.push('"'),
                            Some('n') => value.push('\n'),
                            other => panic!("line {n}: bad escape {other:?}"),
                        },
                        Some(c) => value.push(c),
                        None => panic!("line {n}: unterminated label value"),
                    }
                }
                assert!(labels.insert(key.clone(), value).is_none(), "line {n}: {key} twice");
                if chars.peek().map(|p| p.1) == Some(',') {
                    chars.next();
                }
            };
            rest = &body[end..];
        }
        let mut fields = rest.split_whitespace();
        let raw = fields.next().unwrap_or_else(|| panic!("line {n}: no value: {line}"));
        let value = match raw {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|e| panic!("line {n}: value {v:?}: {e}")),
        };
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .unwrap_or_else(|e| panic!("line {n}: timestamp {ts:?}: {e}"));
        }
        assert!(fields.next().is_none(), "line {n}: trailing fields: {line}");
        out.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    for s in &out.samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suf| {
                s.name
                    .strip_suffix(suf)
                    .filter(|f| out.types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(&s.name);
        assert!(out.types.contains_key(family), "{} has no # TYPE", s.name);
    }
    out
}

#[test]
fn the_test_parser_reads_the_text_format() {
    let m = parse_prometheus(
        "# HELP x_total A counter.\n# TYPE x_total counter\nx_total{a=\"q\\\"uo\\\\te\\n\",b=\"\"} 3\n\
         # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2 1700000000\nh_sum 0.5\nh_count 2\n# TYPE g gauge\ng -1\n",
    );
    assert_eq!(m.value("x_total", &[("a", "q\"uo\\te\n"), ("b", "")]), Some(3.0));
    assert_eq!(m.value("h_bucket", &[("le", "+Inf")]), Some(2.0));
    assert_eq!(m.value("h_count", &[]), Some(2.0));
    assert_eq!(m.value("g", &[]), Some(-1.0));
    assert_eq!(m.types["h"], "histogram");
}

async fn scrape(gw: &Gateway) -> Scrape {
    let r = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/plain") && ct.contains("version=0.0.4"), "{ct}");
    parse_prometheus(&r.text().await.unwrap())
}

/// Checks every latency histogram: buckets ascend in `le`, counts are cumulative, the
/// `+Inf` bucket equals `_count`, and `_sum` is there. Returns `_count` per (method, server).
fn check_histograms(m: &Scrape) -> BTreeMap<(String, String), f64> {
    const H: &str = "mcp_gateway_request_duration_seconds";
    assert_eq!(m.types[H], "histogram");
    let mut counts = BTreeMap::new();
    for c in m.find("mcp_gateway_request_duration_seconds_count", &[]) {
        let (method, server) = (&c.labels["method"], &c.labels["server"]);
        let sel = [("method", method.as_str()), ("server", server.as_str())];
        let buckets: Vec<&Sample> = m.find("mcp_gateway_request_duration_seconds_bucket", &sel).collect();
        assert!(buckets.len() >= 2, "{method} {server}: {buckets:?}");
        let mut last = (f64::NEG_INFINITY, 0.0);
        for b in &buckets {
            let le = match b.labels["le"].as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap(),
            };
            assert!(le > last.0, "{method} {server}: le not ascending: {buckets:?}");
            assert!(
                b.value >= last.1,
                "{method} {server}: buckets not cumulative: {buckets:?}"
            );
            last = (le, b.value);
        }
        assert_eq!(last.0, f64::INFINITY, "{method} {server}: no +Inf bucket");
        assert_eq!(last.1, c.value, "{method} {server}: +Inf bucket != _count");
        let sum = m
            .value("mcp_gateway_request_duration_seconds_sum", &sel)
            .expect("a _sum");
        assert!(sum >= 0.0 && sum.is_finite(), "{sum}");
        counts.insert((method.clone(), server.clone()), c.value);
    }
    counts
}

#[tokio::test]
async fn metrics_count_requests_latency_sessions_and_downstreams() {
    let (m_name, boom_name) = (unique("m"), unique("boom"));
    let config = [
        limited_server("m", &m_name, r#"{ per_tool = { echo = "2/m" } }"#),
        // Not restarted, so it stays down for the scrape.
        server("boom", &boom_name, &[], "restart = \"never\"\n"),
    ]
    .concat();
    let gw = Gateway::start(&config);
    let s = gw.session().await;
    let s2 = gw.session().await;

    let before = scrape(&gw).await;
    assert_eq!(before.value("mcp_gateway_sessions", &[]), Some(2.0));
    assert_eq!(before.value("mcp_gateway_requests_in_flight", &[]), Some(0.0));
    for server in ["m", "boom"] {
        assert_eq!(
            before.value(
                "mcp_gateway_downstream_up",
                &[("server", server), ("transport", "stdio")]
            ),
            Some(1.0),
            "{server}"
        );
        assert_eq!(
            before.value("mcp_gateway_downstream_restarts_total", &[("server", server)]),
            Some(0.0)
        );
    }
    assert_eq!(before.sum("mcp_gateway_requests_total", &[]), 0.0);

    // ok ×2, tool_error ×1 (the mock answers isError for non-numbers), ok ×2 + rate
    // limited ×1 on echo, error ×1 for an unknown tool, one prompts/list.
    assert_eq!(text(&s.call("m__add", json!({"a": 1, "b": 2})).await), "3");
    assert_eq!(text(&s.call("m__add", json!({"a": 3, "b": 4})).await), "7");
    let r = s.call("m__add", json!({"a": "x", "b": 1})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(text(&s.call("m__echo", json!({"text": "a"})).await), "a");
    assert_eq!(text(&s2.call("m__echo", json!({"text": "b"})).await), "b");
    assert_limited_tool(
        &s.call("m__echo", json!({"text": "c"})).await,
        "limit for tool echo 2/m",
    );
    let r = s.call("m__nope", json!({})).await;
    assert!(
        error_of(&r)["message"].as_str().unwrap().contains("unknown tool"),
        "{r}"
    );
    let r = s2.request(json!(5), "prompts/list", json!({})).await;
    assert!(r["result"]["prompts"].is_array());

    let m = scrape(&gw).await;
    let req = |method: &str, server: &str, tool: &str, outcome: &str| {
        m.value(
            "mcp_gateway_requests_total",
            &[
                ("method", method),
                ("server", server),
                ("tool", tool),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(m.types["mcp_gateway_requests_total"], "counter");
    assert_eq!(req("tools/call", "m", "m__add", "ok"), Some(2.0));
    assert_eq!(req("tools/call", "m", "m__add", "tool_error"), Some(1.0));
    assert_eq!(req("tools/call", "m", "m__echo", "ok"), Some(2.0));
    assert_eq!(req("tools/call", "m", "m__echo", "rate_limited"), Some(1.0));
    assert_eq!(req("tools/call", "", "", "error"), Some(1.0), "the unknown tool");
    assert_eq!(req("prompts/list", "", "", "ok"), Some(1.0));
    assert_eq!(m.sum("mcp_gateway_requests_total", &[]), 8.0);
    assert_eq!(
        m.value(
            "mcp_gateway_rate_limited_total",
            &[("limit", "server 'm' limit for tool echo 2/m")]
        ),
        Some(1.0)
    );

    // Histograms: cumulative, +Inf == _count, and _count agrees with the counters.
    let counts = check_histograms(&m);
    for ((method, server), count) in &counts {
        let total = m.sum("mcp_gateway_requests_total", &[("method", method), ("server", server)]);
        assert_eq!(*count, total, "{method} {server}");
    }
    assert_eq!(counts[&("tools/call".to_owned(), "m".to_owned())], 6.0);
    assert_eq!(m.value("mcp_gateway_requests_in_flight", &[]), Some(0.0));
    // The busy poll's counters (gateway.busy_poll, on by default): both outcomes listed,
    // whether or not a wait was polled yet.
    assert_eq!(m.types["mcp_gateway_busy_poll_total"], "counter");
    for outcome in ["caught", "slept"] {
        let n = m.value("mcp_gateway_busy_poll_total", &[("outcome", outcome)]);
        assert!(n.is_some_and(|n| n >= 0.0), "{outcome}: {n:?}");
    }

    // In flight while a call runs, back to 0 after.
    let mut slow = s
        .start(
            json!("slow"),
            "tools/call",
            json!({"name": "m__slow", "arguments": {"seconds": 0.6, "steps": 3}, "_meta": {"progressToken": "p"}}),
        )
        .await;
    assert_eq!(slow.next(T).await.unwrap()["method"], "notifications/progress");
    let during = scrape(&gw).await;
    assert_eq!(during.value("mcp_gateway_requests_in_flight", &[]), Some(1.0));
    let (_, r) = slow.response(T).await;
    assert!(r.get("result").is_some(), "{r}");
    let after_slow = async {
        for _ in 0..100 {
            let m = scrape(&gw).await;
            if m.value("mcp_gateway_requests_in_flight", &[]) == Some(0.0) {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("in flight never returned to 0");
    }
    .await;
    assert_eq!(
        after_slow.value(
            "mcp_gateway_requests_total",
            &[
                ("method", "tools/call"),
                ("server", "m"),
                ("tool", "m__slow"),
                ("outcome", "ok")
            ]
        ),
        Some(1.0)
    );

    // Sessions: one ended by DELETE.
    assert_eq!(s2.end().await, 200);
    assert_eq!(scrape(&gw).await.value("mcp_gateway_sessions", &[]), Some(1.0));

    // A child that dies is down; the other stays up.
    let r = s.call("boom__crash", json!({})).await;
    assert!(r.get("error").is_some(), "{r}");
    let down = async {
        for _ in 0..250 {
            let m = scrape(&gw).await;
            if m.value(
                "mcp_gateway_downstream_up",
                &[("server", "boom"), ("transport", "stdio")],
            ) == Some(0.0)
            {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("boom never went down");
    }
    .await;
    assert_eq!(
        down.value("mcp_gateway_downstream_up", &[("server", "m"), ("transport", "stdio")]),
        Some(1.0)
    );
    assert_eq!(
        down.value(
            "mcp_gateway_requests_total",
            &[
                ("method", "tools/call"),
                ("server", "boom"),
                ("tool", "boom__crash"),
                ("outcome", "error")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(down.value("mcp_gateway_requests_in_flight", &[]), Some(0.0));
    check_histograms(&down);
}

// ---------------------------------------------------------------- health and status

const SECRET: &str = "s3cr3t-TOKEN-7f1c9a";
const EXPANDED: &str = "expanded-SECRET-4be2d0";

/// A mock server table whose env holds a literal secret and one expanded from the
/// gateway's environment.
fn secret_server(table: &str, mock_name: &str) -> String {
    server(
        table,
        mock_name,
        &[],
        &format!("env = {{ API_TOKEN = \"{SECRET}\", OTHER = \"${{OPS_TEST_SECRET}}\" }}\n"),
    )
}

async fn get(gw: &Gateway, path: &str) -> (u16, String, String) {
    let r = reqwest::get(format!("{}{path}", gw.base)).await.unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

fn assert_no_secret(what: &str, body: &str) {
    for s in [SECRET, EXPANDED] {
        assert!(!body.contains(s), "{what} shows a secret: {body}");
    }
}

#[tokio::test]
async fn healthy_gateway_is_ready_and_status_shows_live_servers() {
    let name = unique("good");
    let config = [
        secret_server("good", &name),
        "[servers.off]\ncommand = \"/nonexistent/off-server\"\nenabled = false\n".to_owned(),
    ]
    .concat();
    let gw = Gateway::start_with_env(&config, &[("OPS_TEST_SECRET", EXPANDED)]);
    let s = gw.session().await;
    // The child got its secrets (so they were really there to leak).
    assert_eq!(text(&s.call("good__env", json!({"name": "API_TOKEN"})).await), SECRET);
    assert_eq!(text(&s.call("good__env", json!({"name": "OTHER"})).await), EXPANDED);

    let (code, _, body) = get(&gw, "/healthz").await;
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, _, _) = get(&gw, "/readyz").await;
    assert_eq!(code, 200, "a disabled server does not make the gateway unready");

    let (code, ct, body) = get(&gw, "/status").await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("application/json"), "{ct}");
    assert_no_secret("/status", &body);
    let st: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["sessions"], 1, "{st}");
    let good = &st["servers"][0];
    assert_eq!(good["name"], "good");
    assert_eq!(good["state"], "ready", "{good}");
    assert_eq!(good["transport"], "stdio");
    let pid = good["pid"].as_i64().unwrap_or_else(|| panic!("no pid: {good}")) as i32;
    assert!(alive(pid), "pid {pid} is not a live process");
    assert_eq!(mock_pids(&name), vec![pid]);
    assert!(good["uptimeSeconds"].as_u64().is_some(), "{good}");
    let tools = s.tool_names().await.iter().filter(|t| t.starts_with("good__")).count();
    assert!(tools > 0);
    assert_eq!(good["tools"], tools, "{good}");
    assert_eq!(good["lastError"], Value::Null, "{good}");
    let off = &st["servers"][1];
    assert_eq!(off["state"], "disabled", "{off}");
    assert_eq!(off["pid"], Value::Null);

    // Uptime grows.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let up = gw.server_status("good").await["uptimeSeconds"].as_u64().unwrap();
    assert!(up >= 1, "{up}");

    // Behind a published port (docker compose), the Host is localhost with another
    // port than the one the gateway listens on: allowed.
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("host", "localhost:8080")
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let (code, ct, page) = get(&gw, "/").await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert_no_secret("/", &page);
    // The console's page is static; what it shows comes from /status (tests/it/console.rs
    // drives it in Chromium).
    assert!(
        page.contains("id=\"servers\"") && page.contains("/console.js"),
        "{page}"
    );
}

#[tokio::test]
async fn a_down_server_makes_readyz_503_and_status_says_why() {
    let name = unique("good");
    let config = [
        secret_server("good", &name),
        format!(
            "[servers.broken]\ncommand = \"/nonexistent/mcp-server-{}\"\nrestart = \"never\"\nenv = {{ API_TOKEN = \"{SECRET}\" }}\n",
            std::process::id()
        ),
    ]
    .concat();
    let gw = Gateway::start_with_env(&config, &[("OPS_TEST_SECRET", EXPANDED)]);
    let (_a, _b) = (gw.session().await, gw.session().await);

    let (code, _, _) = get(&gw, "/healthz").await;
    assert_eq!(code, 200, "alive even when not ready");
    let (code, _, body) = get(&gw, "/readyz").await;
    assert_eq!(code, 503, "{body}");

    let (_, _, body) = get(&gw, "/status").await;
    assert_no_secret("/status", &body);
    let st: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["sessions"], 2, "{st}");
    let broken = gw.server_status("broken").await;
    assert_eq!(broken["state"], "down", "{broken}");
    assert_eq!(broken["transport"], "stdio");
    assert_eq!(broken["pid"], Value::Null);
    assert_eq!(broken["uptimeSeconds"], Value::Null);
    assert_eq!(broken["tools"], 0);
    let err = broken["lastError"]
        .as_str()
        .unwrap_or_else(|| panic!("no lastError: {broken}"));
    assert!(
        err.contains("nonexistent") || err.to_lowercase().contains("no such file"),
        "{err}"
    );
    let good = gw.server_status("good").await;
    assert_eq!(good["state"], "ready", "{good}");
    assert!(alive(good["pid"].as_i64().unwrap() as i32));

    let m = scrape(&gw).await;
    assert_eq!(
        m.value(
            "mcp_gateway_downstream_up",
            &[("server", "broken"), ("transport", "stdio")]
        ),
        Some(0.0)
    );
    assert_eq!(
        m.value(
            "mcp_gateway_downstream_up",
            &[("server", "good"), ("transport", "stdio")]
        ),
        Some(1.0)
    );
    assert_eq!(m.value("mcp_gateway_sessions", &[]), Some(2.0));

    let (code, _, page) = get(&gw, "/").await;
    assert_eq!(code, 200);
    assert_no_secret("/", &page);
    assert!(page.contains("id=\"servers\""), "{page}");
    // Why it is down, as the console shows it: the reason beside the state.
    let reason = broken["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no reason: {broken}"));
    assert_eq!(Some(reason), broken["lastError"].as_str(), "{broken}");
    let (_, _, metrics) = get(&gw, "/metrics").await;
    assert_no_secret("/metrics", &metrics);
    assert_no_secret("logs", &gw.logs());
}
