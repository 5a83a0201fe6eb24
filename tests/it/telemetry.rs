//! OpenTelemetry: the real gateway exports spans over OTLP http/protobuf to a receiver
//! in this test process; spans are named and attributed per the MCP semantic
//! conventions, nest (request → downstream call), continue a client's `traceparent`,
//! and the trace context reaches stdio children in `_meta` and HTTP ones as headers.

use crate::common::*;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};
use prost::Message;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

/// An OTLP/HTTP receiver on 127.0.0.1:0 that keeps every span it is sent.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    service_names: Arc<Mutex<Vec<String>>>,
    /// The `Authorization` header of each export that had one.
    authorizations: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let service_names: Arc<Mutex<Vec<String>>> = Arc::default();
        let authorizations: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, n, a) = (spans.clone(), service_names.clone(), authorizations.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (s, n) = (s.clone(), n.clone());
                if let Some(v) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
                    a.lock().unwrap().push(v.to_owned());
                }
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    for rs in req.resource_spans {
                        // Each batch's resource as "name version" ("" for a missing one).
                        let r = rs.resource.as_ref();
                        let get = |key: &str| {
                            r.and_then(|r| r.attributes.iter().find(|kv| kv.key == key))
                                .map(|kv| any_str(kv.value.as_ref()))
                                .unwrap_or_default()
                        };
                        n.lock()
                            .unwrap()
                            .push(format!("{} {}", get("service.name"), get("service.version")));
                        for ss in rs.scope_spans {
                            s.lock().unwrap().extend(ss.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector {
            endpoint: format!("http://{addr}"),
            spans,
            service_names,
            authorizations,
        }
    }

    /// Waits until `pred` holds for the spans received so far; returns them.
    async fn wait(&self, what: &str, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let start = Instant::now();
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if pred(&spans) {
                return spans;
            }
            if start.elapsed() > DEADLINE {
                let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
                panic!("timed out waiting for {what}; spans so far: {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn any_str(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| any_str(kv.value.as_ref()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Option<&'a Span> {
    spans.iter().find(|s| s.name == name)
}

fn config(endpoint: &str, extra_telemetry: &str, servers: &str) -> String {
    format!("[telemetry]\notlp_endpoint = {endpoint:?}\nservice_name = \"gw-under-test\"\n{extra_telemetry}\n{servers}")
}

const FAST: &[(&str, &str)] = &[("OTEL_BSP_SCHEDULE_DELAY", "50")];

/// A tools/call with no client context: a SERVER span named `tools/call calc__echo_meta`
/// with the MCP attributes, and a CLIENT child for the downstream call whose context the
/// stdio child received in `_meta.traceparent`. Arguments are not recorded by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_downstream_spans_nest_and_propagate_to_stdio() {
    let otlp = Collector::start().await;
    let name = unique("calc");
    let gw = Gateway::start_with_env(
        &config(&otlp.endpoint, "", &format!("[servers.calc]\n{}", mock(&name, &[]))),
        FAST,
    );
    let s = gw.session().await;
    let resp = s
        .request(
            json!(7),
            "tools/call",
            json!({"name": "calc__echo_meta", "arguments": {"note": "SECRET-ARGUMENT-42"}}),
        )
        .await;
    let meta: Value = serde_json::from_str(&text(&resp)).unwrap();
    let got = meta["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("no traceparent in {meta}"));

    let spans = otlp
        .wait("request and downstream spans", |s| {
            named(s, "tools/call calc__echo_meta").is_some() && named(s, "tools/call echo_meta").is_some()
        })
        .await;
    let req = named(&spans, "tools/call calc__echo_meta").unwrap();
    let ds = named(&spans, "tools/call echo_meta").unwrap();

    assert_eq!(req.kind, SpanKind::Server as i32);
    assert_eq!(ds.kind, SpanKind::Client as i32);
    assert!(req.parent_span_id.is_empty(), "a root span without client context");
    assert_eq!(ds.trace_id, req.trace_id);
    assert_eq!(
        ds.parent_span_id, req.span_id,
        "downstream span is the request span's child"
    );

    for (k, v) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "calc__echo_meta"),
        ("gen_ai.operation.name", "execute_tool"),
        ("jsonrpc.request.id", "7"),
        ("network.transport", "tcp"),
        ("mcp.protocol.version", "2025-11-25"),
        ("mcp.session.id", &sha256_hex(&s.id)[..16]),
        ("mcp.gateway.outcome", "ok"),
    ] {
        assert_eq!(
            attr(req, k).as_deref(),
            Some(v),
            "request span {k}: {:?}",
            req.attributes
        );
    }
    for (k, v) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "echo_meta"),
        ("mcp.gateway.server", "calc"),
        ("network.transport", "pipe"),
        ("mcp.gateway.outcome", "ok"),
    ] {
        assert_eq!(
            attr(ds, k).as_deref(),
            Some(v),
            "downstream span {k}: {:?}",
            ds.attributes
        );
    }
    assert!(attr(ds, "jsonrpc.request.id").is_some(), "the id the downstream saw");
    assert_eq!(attr(req, "error.type"), None);

    // The child got the downstream span's own context.
    assert_eq!(got, format!("00-{}-{}-01", hex(&req.trace_id), hex(&ds.span_id)));

    // Arguments are recorded only with record_payloads = true.
    let all = format!("{spans:?}");
    assert!(!all.contains("SECRET-ARGUMENT-42"), "arguments leaked into spans");
    assert!(attr(req, "gen_ai.tool.call.arguments").is_none());
    let resources = otlp.service_names.lock().unwrap().clone();
    let expected = format!("gw-under-test {}", env!("CARGO_PKG_VERSION"));
    assert!(
        !resources.is_empty() && resources.iter().all(|n| *n == expected),
        "{resources:?}"
    );
}

/// The spans' resource names the service (from `[telemetry]`, else `OTEL_SERVICE_NAME`)
/// and its version, also after a reload points the export at another receiver, and a
/// reload's `service_name` and `log_format` apply without a restart.
/// A session id lets whoever holds it act in the session, so neither the logs (at debug)
/// nor the spans carry it: they name the session by its tag, the start of its SHA-256.
#[tokio::test]
async fn session_ids_never_reach_logs_or_spans_only_their_tags_do() {
    let otlp = Collector::start().await;
    let name = unique("calc");
    let gw = Gateway::start_with_env(
        &config(&otlp.endpoint, "", &format!("[servers.calc]\n{}", mock(&name, &[]))),
        &[FAST[0], ("MCP_GATEWAY_LOG", "debug")],
    );
    let s = gw.session().await;
    let tag = sha256_hex(&s.id)[..16].to_owned();
    let r = s
        .request(
            json!(1),
            "tools/call",
            json!({"name": "calc__add", "arguments": {"a": 1, "b": 2}}),
        )
        .await;
    assert_eq!(text(&r), "3", "{r}");
    // Lines that name the session: a notification nobody handles, a cancellation, a
    // response to no question, the end.
    s.notify("notifications/whatever", json!({})).await;
    s.notify("notifications/cancelled", json!({"requestId": 99})).await;
    let (status, _) = s
        .post_text(r#"{"jsonrpc":"2.0","id":"nobody-asked","result":{}}"#)
        .await;
    assert_eq!(status, 202);
    assert_eq!(s.end().await, 200);
    assert!(
        gw.wait_log("session ended by the client", Duration::from_secs(10))
            .await
    );
    let spans = otlp
        .wait("the call's span", |sp| named(sp, "tools/call calc__add").is_some())
        .await;
    let logs = gw.logs();
    assert!(!logs.contains(&s.id), "a session id in the logs:\n{logs}");
    for needle in [
        "session opened",
        "ignoring client notification",
        "dropping a client response",
        "session ended by the client",
    ] {
        assert!(
            logs.lines().any(|l| l.contains(needle) && l.contains(&tag)),
            "no '{needle}' line with the tag {tag}:\n{logs}"
        );
    }
    for span in &spans {
        for kv in &span.attributes {
            let v = any_str(kv.value.as_ref());
            assert!(!v.contains(&s.id), "{} = {v} carries the session id", kv.key);
        }
    }
    let req = named(&spans, "tools/call calc__add").unwrap();
    assert_eq!(attr(req, "mcp.session.id").as_deref(), Some(tag.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_carry_the_service_name_and_version_across_reloads() {
    let version = env!("CARGO_PKG_VERSION");
    let (first, second) = (Collector::start().await, Collector::start().await);
    let name = unique("calc");
    let servers = format!("[servers.calc]\n{}", mock(&name, &[]));
    let plain = |endpoint: &str, extra: &str| format!("[telemetry]\notlp_endpoint = {endpoint:?}\n{extra}\n{servers}");
    let env = [FAST[0], ("OTEL_SERVICE_NAME", "from-env")];
    let gw = Gateway::start_with_env(&plain(&first.endpoint, ""), &env);
    let s = gw.session().await;
    s.call("calc__echo_meta", json!({})).await;
    first
        .wait("spans", |s| named(s, "tools/call calc__echo_meta").is_some())
        .await;
    let seen = first.service_names.lock().unwrap().clone();
    assert!(seen.iter().all(|n| *n == format!("from-env {version}")), "{seen:?}");

    // Another receiver, a service name of the config's own, and JSON log lines.
    let reloads = gw.logs().matches("telemetry reconfigured").count();
    std::fs::write(
        gw.config_path(),
        plain(&second.endpoint, "service_name = \"renamed\"\nlog_format = \"json\""),
    )
    .unwrap();
    assert!(
        until(DEADLINE, || gw.logs().matches("telemetry reconfigured").count()
            > reloads)
        .await,
        "no reload:\n{}",
        gw.logs()
    );
    s.call("calc__echo_meta", json!({})).await;
    second
        .wait("spans after the reload", |s| {
            named(s, "tools/call calc__echo_meta").is_some()
        })
        .await;
    let seen = second.service_names.lock().unwrap().clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|n| *n == format!("renamed {version}")),
        "{seen:?}"
    );
    let logs = gw.logs();
    let last = logs.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    let line: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {last}"));
    assert!(line["fields"].is_object() || line["level"].is_string(), "{line}");
}

/// The trace context goes into a call's `_meta` without rewriting the client's other
/// members there: the child gets their bytes as sent (`1.50` stays `1.50`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_joins_meta_without_rewriting_it() {
    let otlp = Collector::start().await;
    let name = unique("calc");
    let gw = Gateway::start_with_env(
        &config(
            &otlp.endpoint,
            "",
            &format!("[servers.calc]\n{}", mock(&name, &["--quirk", "log-lines"])),
        ),
        FAST,
    );
    let s = gw.session().await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"calc__echo","arguments":{"text":"tc\u0021"},"_meta":{"k":[ 1.50 ],"big":1e400}}}"#;
    let (status, answer) = s.post_text(body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(gw.wait_log("tc\\u0021", Duration::from_secs(10)).await, "{}", gw.logs());
    let logs = gw.logs();
    let line = logs.lines().find(|l| l.contains("tc\\u0021")).unwrap_or_default();
    assert!(
        line.contains(r#""_meta":{"k":[ 1.50 ],"big":1e400,"traceparent":"00-"#),
        "the server got {line}"
    );
}

/// A client's `traceparent` header is continued: same trace id, parented on the
/// client's span; the downstream call stays in that trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_traceparent_header_is_continued() {
    let otlp = Collector::start().await;
    let name = unique("calc");
    let gw = Gateway::start_with_env(
        &config(&otlp.endpoint, "", &format!("[servers.calc]\n{}", mock(&name, &[]))),
        FAST,
    );
    let s = gw.session().await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let r = s
        .post()
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .header("tracestate", "vendor=abc")
        .json(&json!({"jsonrpc":"2.0","id":"a","method":"tools/call",
            "params":{"name":"calc__echo_meta","arguments":{}}}))
        .send()
        .await
        .unwrap();
    let resp = read_messages(r).await.pop().unwrap();
    let meta: Value = serde_json::from_str(&text(&resp)).unwrap();
    assert_eq!(meta["tracestate"], "vendor=abc", "tracestate travels on: {meta}");

    let spans = otlp
        .wait("the continued trace", |s| {
            s.iter()
                .any(|x| hex(&x.trace_id) == trace && x.name == "tools/call echo_meta")
                && s.iter()
                    .any(|x| hex(&x.trace_id) == trace && x.name == "tools/call calc__echo_meta")
        })
        .await;
    let req = named(&spans, "tools/call calc__echo_meta").unwrap();
    let ds = named(&spans, "tools/call echo_meta").unwrap();
    assert_eq!(hex(&req.trace_id), trace);
    assert_eq!(
        hex(&req.parent_span_id),
        parent,
        "request span's parent is the client's span"
    );
    assert_eq!(ds.parent_span_id, req.span_id);
    assert_eq!(attr(req, "jsonrpc.request.id").as_deref(), Some("a"));
    let tp = meta["traceparent"].as_str().unwrap();
    assert_eq!(tp, format!("00-{trace}-{}-01", hex(&ds.span_id)));
}

/// `params._meta.traceparent` is continued too; errors and tool errors are marked, and
/// record_payloads = true records arguments and results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_traceparent_errors_and_payloads() {
    let otlp = Collector::start().await;
    let name = unique("calc");
    let gw = Gateway::start_with_env(
        &config(
            &otlp.endpoint,
            "record_payloads = true",
            &format!("[servers.calc]\n{}", mock(&name, &[])),
        ),
        FAST,
    );
    let s = gw.session().await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let parent = "b7ad6b7169203331";
    let resp = s
        .request(
            json!(1),
            "tools/call",
            json!({"name": "calc__echo", "arguments": {"text": "PAYLOAD-1"},
                   "_meta": {"traceparent": format!("00-{trace}-{parent}-01")}}),
        )
        .await;
    assert_eq!(text(&resp), "PAYLOAD-1");
    let unknown = s
        .request(json!(2), "tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(unknown["error"]["code"], -32602);
    let _ = s.request(json!(3), "tools/list", json!({})).await;

    let spans = otlp
        .wait("three request spans", |s| {
            named(s, "tools/call calc__echo").is_some()
                && named(s, "tools/call nope").is_some()
                && named(s, "tools/list").is_some()
        })
        .await;
    let echo = named(&spans, "tools/call calc__echo").unwrap();
    assert_eq!(hex(&echo.trace_id), trace);
    assert_eq!(hex(&echo.parent_span_id), parent);
    assert!(attr(echo, "gen_ai.tool.call.arguments").unwrap().contains("PAYLOAD-1"));
    assert!(attr(echo, "gen_ai.tool.call.result").unwrap().contains("PAYLOAD-1"));

    let nope = named(&spans, "tools/call nope").unwrap();
    assert_eq!(attr(nope, "error.type").as_deref(), Some("-32602"));
    assert_eq!(attr(nope, "mcp.gateway.outcome").as_deref(), Some("error"));
    assert_eq!(
        nope.status.as_ref().map(|s| s.code),
        Some(opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32)
    );
    let list = named(&spans, "tools/list").unwrap();
    assert_eq!(attr(list, "mcp.gateway.outcome").as_deref(), Some("ok"));
    assert_eq!(list.parent_span_id, Vec::<u8>::new());
}

/// An HTTP downstream receives the downstream span's context as `traceparent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_downstream_gets_traceparent_header() {
    let otlp = Collector::start().await;
    let remote = Remote::start(&[]);
    let gw = Gateway::start_with_env(
        &config(&otlp.endpoint, "", &remote_table("web", &remote.url(), "")),
        FAST,
    );
    let s = gw.session().await;
    let resp = s.call("web__echo", json!({"text": "hi"})).await;
    assert_eq!(text(&resp), "hi", "{resp}");
    let spans = otlp
        .wait("the downstream span", |s| named(s, "tools/call echo").is_some())
        .await;
    let ds = named(&spans, "tools/call echo").unwrap();
    assert_eq!(attr(ds, "network.transport").as_deref(), Some("tcp"));
    assert_eq!(attr(ds, "mcp.gateway.server").as_deref(), Some("web"));
    let call = remote.posts_of("tools/call").pop().expect("the fixture saw the call");
    assert_eq!(
        call["headers"]["traceparent"],
        format!("00-{}-{}-01", hex(&ds.trace_id), hex(&ds.span_id)),
        "{call}"
    );
}

/// Without [telemetry] nothing changes on the wire: the child's _meta has no traceparent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_no_propagation() {
    let name = unique("calc");
    let gw = Gateway::start(&format!("[servers.calc]\n{}", mock(&name, &[])));
    let s = gw.session().await;
    let resp = s.call("calc__echo_meta", json!({})).await;
    assert_eq!(text(&resp), "{}");
}

/// `[telemetry]` reloads: a gateway started without an endpoint starts exporting (and
/// propagating) once gateway.toml gains one, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_an_endpoint_on_reload_starts_export() {
    let otlp = Collector::start().await;
    let name = unique("calc");
    let servers = format!("[servers.calc]\n{}", mock(&name, &[]));
    let gw = Gateway::start_with_env(&servers, FAST);
    let s = gw.session().await;
    assert_eq!(text(&s.call("calc__echo_meta", json!({})).await), "{}");

    std::fs::write(gw.config_path(), config(&otlp.endpoint, "", &servers)).unwrap();
    let start = Instant::now();
    while !gw.logs().contains("telemetry reconfigured") {
        assert!(start.elapsed() < DEADLINE, "no reload:\n{}", gw.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let meta: Value = serde_json::from_str(&text(&s.call("calc__echo_meta", json!({})).await)).unwrap();
    assert!(meta["traceparent"].is_string(), "{meta}");
    otlp.wait("spans after the reload", |s| {
        named(s, "tools/call calc__echo_meta").is_some()
    })
    .await;
}

/// A client's names, URIs and task ids are its own input: however long, neither a span
/// attribute nor an error answer carries more than a bounded part of one (an OTLP batch
/// over the collector's limit would be dropped whole, every other request's spans with
/// it; an answer twice the size of the request is an amplifier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_and_uris_are_clipped_in_spans_and_answers() {
    const LIMIT: usize = 4 << 10;
    let otlp = Collector::start().await;
    // Two servers: with one, a URI no server lists goes to it, and its answer is its own.
    let servers = format!(
        "{}{}",
        server("calc", &unique("calc"), &[], ""),
        server("other", &unique("other"), &[], "")
    );
    let gw = Gateway::start_with_env(&config(&otlp.endpoint, "", &servers), FAST);
    let s = gw.session().await;
    let big = format!("MARK{}", "u".repeat(1 << 20));
    let completion = |r: Value| json!({"ref": r, "argument": {"name": "a", "value": "b"}});
    for (id, method, params) in [
        (1, "tools/call", json!({"name": big, "arguments": {}})),
        (2, "prompts/get", json!({"name": big})),
        (3, "resources/read", json!({"uri": big})),
        (4, "resources/unsubscribe", json!({"uri": big})),
        (
            5,
            "completion/complete",
            completion(json!({"type": "ref/prompt", "name": big})),
        ),
        (
            6,
            "completion/complete",
            completion(json!({"type": "ref/resource", "uri": big})),
        ),
        (7, "completion/complete", completion(json!({"type": big}))),
        (8, "tasks/get", json!({"taskId": big})),
        (9, "tasks/cancel", json!({"taskId": big})),
        (10, "tasks/result", json!({"taskId": big})),
    ] {
        let r = s.request(json!(id), method, params).await;
        assert!(r["error"]["code"].is_i64(), "{method}: {r:.300}");
        let len = r.to_string().len();
        assert!(
            len < LIMIT,
            "{method}: an answer of {len} bytes echoes the request: {:.300}",
            r.to_string()
        );
    }
    assert_eq!(text(&s.call("calc__echo", json!({"text": "after"})).await), "after");
    let spans = otlp
        .wait("the hostile requests' spans", |s| {
            // Ten refused, and the echo that followed them.
            s.iter().filter(|s| s.kind == SpanKind::Server as i32).count() >= 11
        })
        .await;
    for span in &spans {
        assert!(span.name.len() < LIMIT, "a span named with {} bytes", span.name.len());
        for kv in &span.attributes {
            let v = any_str(kv.value.as_ref());
            assert!(
                v.len() < LIMIT,
                "{} of span {:.80} is {} bytes",
                kv.key,
                span.name,
                v.len()
            );
        }
    }
    // Clipped, not dropped: the start is still there to tell what was asked.
    let read = spans
        .iter()
        .find(|s| attr(s, "mcp.method.name").as_deref() == Some("resources/read"))
        .expect("the read's span");
    assert!(
        attr(read, "mcp.resource.uri").is_some_and(|u| u.starts_with("MARK")),
        "{read:?}"
    );
}

/// A client's `tracestate` is kept only within the W3C bound of 32 list-members: past it
/// (the spec lets a parser discard it whole) it is dropped, from `_meta` or a header
/// alike. Kept, it would ride on every span of the trace and on every downstream call: a
/// tracestate of thousands of members made each span as large, and a batch of them is
/// refused by the collector, other requests' spans with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracestate_past_the_w3c_bound_is_dropped() {
    let otlp = Collector::start().await;
    let gw = Gateway::start_with_env(
        &config(&otlp.endpoint, "", &server("calc", &unique("calc"), &[], "")),
        FAST,
    );
    let s = gw.session().await;
    let state = |n: usize| (0..n).map(|i| format!("k{i}=v{i}")).collect::<Vec<_>>().join(",");
    let trace = "5bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
    let huge = state(40_000);
    let r = s
        .request(
            json!("meta"),
            "tools/call",
            json!({"name": "calc__echo_meta", "arguments": {},
                "_meta": {"traceparent": traceparent, "tracestate": huge}}),
        )
        .await;
    let meta: Value = serde_json::from_str(&text(&r)).unwrap();
    assert!(meta.get("tracestate").is_none(), "{:.300}", meta.to_string());
    // Over HTTP, as a header (a smaller one, within the gateway's header limits).
    let r = s
        .post()
        .header("traceparent", &traceparent)
        .header("tracestate", state(2_000))
        .json(&json!({"jsonrpc":"2.0","id":"header","method":"tools/call",
            "params":{"name":"calc__echo_meta","arguments":{}}}))
        .send()
        .await
        .unwrap();
    let resp = read_messages(r).await.pop().unwrap();
    let meta: Value = serde_json::from_str(&text(&resp)).unwrap();
    assert!(meta.get("tracestate").is_none(), "{:.300}", meta.to_string());
    // Within the bound it travels on, as before.
    let within = state(32);
    let r = s
        .request(
            json!("within"),
            "tools/call",
            json!({"name": "calc__echo_meta", "arguments": {},
                "_meta": {"traceparent": traceparent, "tracestate": within}}),
        )
        .await;
    let meta: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(meta["tracestate"], within.as_str(), "{meta}");

    // Every span of the trace arrived: three calls, each a request span and a downstream one.
    let spans = otlp
        .wait("the six spans of the trace", |s| {
            s.iter().filter(|x| hex(&x.trace_id) == trace).count() >= 6
        })
        .await;
    for span in spans.iter().filter(|x| hex(&x.trace_id) == trace) {
        assert!(
            span.trace_state.len() <= within.len(),
            "{} bytes",
            span.trace_state.len()
        );
    }
}

/// An OTLP endpoint with a query (a tenant, a key) gets `/v1/traces` added to its path,
/// before the query: spans reach the collector. (It was added after the query, as part
/// of its last value, and every export went to `/`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_endpoint_with_a_query_gets_the_traces_path_before_it() {
    let otlp = Collector::start().await;
    let endpoint = format!("{}/?tenant=team-a", otlp.endpoint);
    let gw = Gateway::start_with_env(&config(&endpoint, "", &server("calc", &unique("calc"), &[], "")), FAST);
    let s = gw.session().await;
    assert_eq!(text(&s.call("calc__echo", json!({"text": "q"})).await), "q");
    otlp.wait("the call's span", |s| named(s, "tools/call calc__echo").is_some())
        .await;
}

/// Credentials in the OTLP endpoint (a password in its user info, a key in its query,
/// from the environment) never reach the log, even at trace level: the startup line shows
/// the endpoint masked, and the user info goes to the collector as a Basic header (the
/// HTTP client logs the address it connects to, user info included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_endpoint_credentials_never_reach_the_log() {
    const PASSWORD: &str = "otlp-pass-5d1c9e";
    const KEY: &str = "otlp-key-7a2b4f";
    let otlp = Collector::start().await;
    let endpoint = otlp.endpoint.replace("http://", "http://collector:${OTLP_PASSWORD}@") + "/?api_key=${OTLP_KEY}";
    let gw = Gateway::start_with_env(
        &config(&endpoint, "", &server("calc", &unique("calc"), &[], "")),
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("MCP_GATEWAY_LOG", "trace"),
            ("OTLP_PASSWORD", PASSWORD),
            ("OTLP_KEY", KEY),
        ],
    );
    let s = gw.session().await;
    assert_eq!(text(&s.call("calc__echo", json!({"text": "c"})).await), "c");
    otlp.wait("the call's span", |s| named(s, "tools/call calc__echo").is_some())
        .await;
    // base64("collector:otlp-pass-5d1c9e")
    let basic = "Basic Y29sbGVjdG9yOm90bHAtcGFzcy01ZDFjOWU=".to_owned();
    assert!(
        otlp.authorizations.lock().unwrap().contains(&basic),
        "the user info was sent as Basic"
    );
    assert!(gw.wait_log("exporting traces", DEADLINE).await);
    let logs = gw.logs();
    assert!(logs.contains("api_key=****"), "{logs:.3000}");
    for secret in [PASSWORD, KEY] {
        let at = logs.find(secret).unwrap_or(0);
        assert!(
            !logs.contains(secret),
            "{secret} in the log: …{}…",
            &logs[at.saturating_sub(300)..at]
        );
    }
}
