//! Issue #16 end to end: three real gateway replicas sharing one real Redis, behind a real
//! nginx balancing round-robin with no stickiness, and the official SDK clients (Python in
//! legacy mode, TypeScript) going through it, each ONE client object for its whole life
//! (tests/interop/py_cluster.py and ts_cluster.mjs, driven one command per line). Every
//! replica runs the two-way mock as `calc` and a per-process mock as `iso` with
//! `isolation = "session"`.

use crate::cluster::cluster_toml;
use crate::common::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const T: Duration = Duration::from_secs(20);
const README: &str = "mock://calc/readme";
const REPLICAS: usize = 3;

/// Three replicas on ports held for them, nginx over the three, one Redis.
struct Cluster {
    redis: Redis,
    nginx: Nginx,
    /// Each replica's port, held while its gateway is down (see [`Gateway::start_listening`]).
    ports: Vec<ReservedPort>,
    live: Vec<Option<Gateway>>,
    /// Replicas that stopped or were killed: their logs still count.
    retired: Vec<Gateway>,
    /// Lines of the `[gateway]` table.
    gateway: String,
    started: usize,
}

impl Cluster {
    fn start(gateway: &str) -> Cluster {
        let redis = Redis::start();
        let ports: Vec<ReservedPort> = (0..REPLICAS).map(|_| ReservedPort::new()).collect();
        let live: Vec<Option<Gateway>> = (0..REPLICAS)
            .map(|i| Some(replica(&redis, gateway, &format!("gw-{i}"), ports[i].port)))
            .collect();
        let nginx = Nginx::start(
            &ports
                .iter()
                .map(|p| format!("127.0.0.1:{}", p.port))
                .collect::<Vec<_>>(),
        );
        Cluster {
            redis,
            nginx,
            ports,
            live,
            retired: Vec::new(),
            gateway: gateway.to_owned(),
            started: REPLICAS,
        }
    }

    fn gw(&self, i: usize) -> &Gateway {
        self.live[i].as_ref().expect("a live replica")
    }

    fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i].port)
    }

    /// Everything every replica, live or gone, wrote so far.
    fn logs(&self) -> String {
        let mut all = String::new();
        for gw in self.live.iter().flatten().chain(&self.retired) {
            all.push_str(&gw.logs());
        }
        all
    }

    /// `initialize`s the replicas answered (each logs `session opened`).
    fn opened(&self) -> usize {
        self.logs().matches("session opened").count()
    }

    /// SIGKILL replica `i`; its port stays held (a connect is refused).
    fn kill(&mut self, i: usize) {
        let mut gw = self.live[i].take().expect("a live replica");
        gw.child.kill().unwrap();
        gw.child.wait().unwrap();
        self.retired.push(gw);
    }

    /// One SIGTERM to replica `i` (the whole drain), its exit awaited, then a new replica
    /// (a new id, as a new pod would have) on the same port, once nginx sends it requests.
    async fn roll(&mut self, i: usize) {
        let mut gw = self.live[i].take().expect("a live replica");
        // SAFETY: kill(2) on a pid this test spawned.
        unsafe {
            libc::kill(gw.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + T;
        let status = loop {
            if let Some(s) = gw.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "replica {i} did not exit:\n{}", gw.logs());
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(status.success(), "replica {i}: {status}\n{}", gw.logs());
        assert!(gw.wait_log("draining", Duration::from_secs(10)).await, "{}", gw.logs());
        self.retired.push(gw);
        let before = self.nginx.upstreams_used().len();
        let id = format!("gw-{i}.{}", self.started);
        self.started += 1;
        let (redis, gateway, port) = (&self.redis, &self.gateway, self.ports[i].port);
        let gw = tokio::task::block_in_place(|| replica(redis, gateway, &id, port));
        self.live[i] = Some(gw);
        let addr = self.addr(i);
        let used = until(T, || {
            self.nginx.upstreams_used()[before..].iter().any(|u| u.ends_with(&addr))
        })
        .await;
        assert!(used, "nginx never sent the new replica {i} a request");
    }
}

/// A replica: `calc` (two-way mock), `iso` (per-process mock, one process per session).
fn replica(redis: &Redis, gateway: &str, id: &str, port: u16) -> Gateway {
    let servers = format!(
        "{}{}",
        server("calc", "calc", &["--two-way"], ""),
        server("iso", "iso", &["--per-process"], "isolation = \"session\"\n")
    );
    let config = format!(
        "{servers}\n[gateway]\n{gateway}\n\n{}",
        cluster_toml(redis, &format!("replica_id = \"{id}\""))
    );
    Gateway::start_listening(
        &config,
        &format!("127.0.0.1:{port}"),
        &[("MCP_GATEWAY_LOG", "info,mcp_gateway::router=debug")],
    )
}

/// An SDK client process, one command per line in, one JSON line per command out.
struct Sdk {
    name: &'static str,
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    /// The session id the client got from `initialize`.
    session: String,
}

impl Sdk {
    async fn python(url: &str) -> Sdk {
        let py = repo().join(".venv/bin/python");
        assert!(py.exists(), "needs {} (scripts/setup-test-deps)", py.display());
        Sdk::spawn("python", &path_str(&py), &["tests/interop/py_cluster.py", url]).await
    }

    async fn typescript(url: &str) -> Sdk {
        let sdk = repo().join("node_modules/@modelcontextprotocol/sdk");
        assert!(sdk.is_dir(), "needs {} (scripts/setup-test-deps)", sdk.display());
        Sdk::spawn("typescript", "node", &["tests/interop/ts_cluster.mjs", url]).await
    }

    async fn spawn(name: &'static str, program: &str, args: &[&str]) -> Sdk {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .current_dir(repo())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot spawn {program}: {e}"));
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
            let stderr = stderr.clone();
            tokio::spawn(async move {
                while let Ok(Some(l)) = err.next_line().await {
                    let mut s = stderr.lock().unwrap();
                    s.push_str(&l);
                    s.push('\n');
                }
            });
        }
        let mut sdk = Sdk {
            name,
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            stderr,
            session: String::new(),
        };
        let ready = sdk.read().await;
        assert_eq!(ready["ready"], true, "{name}: {ready}\n{}", sdk.stderr());
        sdk.session = ready["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no session id: {ready}"))
            .to_owned();
        sdk
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    async fn read(&mut self) -> Value {
        match tokio::time::timeout(Duration::from_secs(30), self.lines.next_line()).await {
            Ok(Ok(Some(l))) => {
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {l}", self.name))
            }
            other => panic!("{}: no answer ({other:?}); stderr:\n{}", self.name, self.stderr()),
        }
    }

    /// Sends one command; its JSON line (`{"error"}` included).
    async fn send(&mut self, command: &str) -> Value {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
        self.read().await
    }

    /// Sends one command that must succeed.
    async fn ok(&mut self, command: &str) -> Value {
        let r = self.send(command).await;
        assert!(
            r.get("error").is_none(),
            "{} `{command}`: {r}\nstderr:\n{}",
            self.name,
            self.stderr()
        );
        r
    }

    /// A tool call that must succeed: its first text.
    async fn call(&mut self, tool: &str, args: Value) -> String {
        let r = self.ok(&format!("call {tool} {args}")).await;
        assert_eq!(r["isError"], false, "{} {tool}: {r}", self.name);
        r["content"][0]["text"].as_str().unwrap_or_default().to_owned()
    }

    async fn notifications(&mut self) -> Vec<Value> {
        self.ok("notifications").await["notifications"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// Waits until the client has received `n` notifications `method` in all.
    async fn await_notes(&mut self, method: &str, n: usize) -> bool {
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            if self
                .notifications()
                .await
                .iter()
                .filter(|m| m["method"] == method)
                .count()
                >= n
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The client still sends the session it opened (it never initialized again).
    async fn same_session(&mut self) {
        let now = self.ok("session").await;
        assert_eq!(now["sessionId"], self.session.as_str(), "{}", self.name);
    }

    async fn quit(mut self) {
        let r = self.ok("quit").await;
        assert_eq!(r["closed"], true, "{}: {r}", self.name);
        let status = tokio::time::timeout(T, self.child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "{}: {status}\n{}", self.name, self.stderr());
    }
}

/// A tool call of a plain client through `s`, not panicking: Err(what went wrong).
async fn try_call(s: &Session, tool: &str, args: Value) -> Result<String, String> {
    let r = s
        .post()
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}}))
        .send()
        .await
        .map_err(|e| format!("send: {e:?}"))?;
    let status = r.status();
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
    let body = r.text().await.map_err(|e| format!("body: {e:?}"))?;
    if status != 200 {
        return Err(format!("HTTP {status}: {body}"));
    }
    let last = if sse {
        parse_sse(&body).into_iter().last()
    } else {
        serde_json::from_str(&body).ok()
    };
    match last {
        Some(m) if m["result"]["content"][0]["text"].is_string() => {
            Ok(m["result"]["content"][0]["text"].as_str().unwrap().to_owned())
        }
        _ => Err(format!("no result: {body}")),
    }
}

/// POSTs tools/list with `s`'s session id to each live replica directly: the statuses.
async fn statuses(c: &Cluster, s: &Session) -> Vec<u16> {
    let mut out = Vec::new();
    for gw in c.live.iter().flatten() {
        let (status, _) = crate::cluster::via(s, gw)
            .post_text(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}"#)
            .await;
        out.push(status);
    }
    out
}

/// A session id of an SDK client as a plain session through `url` (to probe it).
fn as_session(id: &str, url: &str) -> Session {
    Session {
        http: reqwest::Client::new(),
        url: url.to_owned(),
        id: id.to_owned(),
        init: Value::Null,
    }
}

/// TCP connections established to `port` (its accepted side), from /proc/net/tcp: with
/// no upstream keep-alive in nginx and no call in flight, the GET streams it holds.
fn established_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = f.get(1).and_then(|a| a.rsplit(':').next());
            local.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port) && f.get(3) == Some(&"01")
        })
        .count()
}

/// Waits until every live replica's `calc` child follows the subscription to `uri`.
async fn subscribed_everywhere(c: &Cluster, uri: &str) {
    for gw in c.live.iter().flatten() {
        assert!(
            gw.wait_log(&format!("[mock] subscribe {uri}"), T).await,
            "{}",
            gw.logs()
        );
    }
}

/// Both SDK clients through nginx: every kind of request works wherever it lands, the
/// level and the per-session process hold across replicas, an elicitation's answer crosses
/// replicas, the GET stream gets what any replica's child saw, and no client initializes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_clients_through_nginx_keep_one_session_on_every_replica() {
    let c = Cluster::start("");
    let mut py = Sdk::python(&c.nginx.url).await;
    let mut ts = Sdk::typescript(&c.nginx.url).await;
    // A second client, through nginx too, makes the servers' changes happen.
    let other = Session::open(&c.nginx.url).await;
    for sdk in [&mut py, &mut ts] {
        let tools = sdk.ok("list").await;
        for t in ["calc__add", "calc__ask_elicit", "iso__counter"] {
            assert!(
                tools["tools"].as_array().unwrap().iter().any(|n| n == t),
                "{}: {tools}",
                sdk.name
            );
        }
        assert_eq!(sdk.call("calc__add", json!({"a": 2, "b": 3})).await, "5");
        assert_eq!(sdk.ok(&format!("subscribe {README}")).await["ok"], true);
        // The level set through one replica holds on the others: three calls, three replicas.
        sdk.ok("level error").await;
        for n in 0..3 {
            assert_eq!(
                sdk.call("calc__log", json!({"message": format!("quiet-{n}")})).await,
                "logged"
            );
        }
        sdk.ok("level info").await;
        for n in 0..3 {
            assert_eq!(
                sdk.call("calc__log", json!({"message": format!("loud-{n}")})).await,
                "logged"
            );
        }
        let notes = sdk.notifications().await;
        let logged: Vec<&Value> = notes
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .map(|m| &m["params"]["data"])
            .collect();
        assert_eq!(logged, ["loud-0", "loud-1", "loud-2"], "{}: {notes:?}", sdk.name);
        // Elicitation: the client's answer is a POST of its own, so through nginx it lands
        // on the next replica, not the one running the call.
        let crossed = format!("session={}", &sha256_hex(&sdk.session)[..16]);
        let across = |logs: String| {
            logs.lines()
                .filter(|l| l.contains("answer reached its question through another replica") && l.contains(&crossed))
                .count()
        };
        let before = across(c.logs());
        let r = sdk.ok("elicit").await;
        assert_eq!(r["asked"], 1, "{}: {r}", sdk.name);
        let got: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(
            got,
            json!({"action": "accept", "content": {"name": "Ada"}}),
            "{}",
            sdk.name
        );
        // The replica logs the crossing after it handed the answer over, and the test reads
        // each replica's stderr on a thread of its own: the line may come after the result.
        let crossed_once = until(T, || across(c.logs()) == before + 1).await;
        assert!(crossed_once, "{}: {}", sdk.name, c.logs());
        // Progress, on the call's own stream.
        let r = sdk.ok("progress").await;
        assert_eq!(r["content"][0]["text"], "done", "{}: {r}", sdk.name);
        assert_eq!(r["progress"], 3, "{}: {r}", sdk.name);
        // The session's own process keeps its count whichever replica each call lands on.
        let before = c.nginx.upstreams_used().len();
        for n in 1..=4 {
            assert_eq!(sdk.call("iso__counter", json!({})).await, n.to_string(), "{}", sdk.name);
        }
        let used = c.nginx.upstreams_of(before + 4, T).await[before..].to_vec();
        let distinct: std::collections::HashSet<&String> = used.iter().collect();
        assert!(distinct.len() >= 2, "the calls spread over the replicas: {used:?}");
    }
    let forwarded = until(T, || c.logs().contains("forwarding the call")).await;
    assert!(forwarded, "{}", c.logs());
    // Changes the other client causes, on replicas round-robin: each client's GET stream
    // gets them, whichever replica holds it.
    subscribed_everywhere(&c, README).await;
    for _ in 0..REPLICAS {
        let r = try_call(&other, "calc__update_resource", json!({"uri": README})).await;
        assert_eq!(r, Ok(format!("updated {README}")));
    }
    assert_eq!(
        try_call(&other, "calc__add_tool", json!({"name": "fresh"})).await,
        Ok("added".into())
    );
    for sdk in [&mut py, &mut ts] {
        let updated = sdk.await_notes("notifications/resources/updated", REPLICAS).await;
        let changed = sdk.await_notes("notifications/tools/list_changed", 1).await;
        let notes = sdk.notifications().await;
        assert!(updated && changed, "{}: {notes:?}\n{}", sdk.name, sdk.stderr());
        for m in notes
            .iter()
            .filter(|m| m["method"] == "notifications/resources/updated")
        {
            assert_eq!(m["params"]["uri"], README, "{m}");
        }
        sdk.same_session().await;
    }
    // Neither client ever initialized again: three sessions in all.
    assert_eq!(c.opened(), 3, "{}", c.logs());
    // Closing DELETEs the session, wherever it lands: gone on every replica.
    let ids = [py.session.clone(), ts.session.clone()];
    py.quit().await;
    ts.quit().await;
    for id in ids {
        let s = as_session(&id, &c.nginx.url);
        let mut gone = false;
        for _ in 0..100 {
            if statuses(&c, &s).await.iter().all(|s| *s == 404) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "{id} ended everywhere: {:?}", statuses(&c, &s).await);
    }
}

/// kill -9 of the replica holding the clients' GET streams: only its call in flight fails;
/// the same client objects' next calls succeed within a second, and their GET streams,
/// reopened by the SDKs on other replicas, get the next change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_fails_only_its_calls_in_flight() {
    let mut c = Cluster::start("");
    let mut py = Sdk::python(&c.nginx.url).await;
    let mut ts = Sdk::typescript(&c.nginx.url).await;
    let other = Session::open(&c.nginx.url).await;
    for sdk in [&mut py, &mut ts] {
        sdk.ok(&format!("subscribe {README}")).await;
        for n in 0..REPLICAS {
            assert_eq!(
                sdk.call("calc__add", json!({"a": n, "b": 1})).await,
                (n + 1).to_string()
            );
        }
    }
    subscribed_everywhere(&c, README).await;
    // The replica to kill holds a GET stream (the one holding most, when both are on one).
    let mut held = [0; REPLICAS];
    let found = until(T, || {
        held = std::array::from_fn(|i| established_to(c.ports[i].port));
        held.iter().sum::<usize>() == 2
    })
    .await;
    assert!(found, "two GET streams: {held:?}");
    let victim = (0..REPLICAS).max_by_key(|i| held[*i]).unwrap();
    let spare = (victim + 1) % REPLICAS;
    eprintln!("GET streams per replica: {held:?}; killing replica {victim}");
    // A call in flight on the replica about to die, and one on another.
    let slow = |id: &str, seconds: u64| {
        json!({"name": "calc__slow", "arguments": {"seconds": seconds, "steps": seconds * 2},
               "_meta": {"progressToken": id}})
    };
    let doomed_on = crate::cluster::via(&other, c.gw(victim));
    let mut doomed = doomed_on.start(json!("doomed"), "tools/call", slow("d", 10)).await;
    let spared_on = crate::cluster::via(&other, c.gw(spare));
    let mut spared = spared_on.start(json!("spared"), "tools/call", slow("s", 3)).await;
    assert_eq!(
        doomed.next(T).await.expect("progress")["method"],
        "notifications/progress"
    );
    assert_eq!(
        spared.next(T).await.expect("progress")["method"],
        "notifications/progress"
    );
    c.kill(victim);
    // The same client objects' next calls succeed within a second.
    for sdk in [&mut py, &mut ts] {
        for n in 0..REPLICAS {
            let began = Instant::now();
            assert_eq!(
                sdk.call("calc__add", json!({"a": n, "b": 2})).await,
                (n + 2).to_string()
            );
            assert!(
                began.elapsed() < Duration::from_secs(1),
                "{}: {:?}",
                sdk.name,
                began.elapsed()
            );
        }
    }
    // Only the call in flight on the dead replica failed: its stream ended, unanswered.
    while let Some(m) = doomed.next(T).await {
        assert!(m.get("id").is_none(), "the dead replica answered: {m}");
    }
    let (_, r) = spared.response(T).await;
    assert_eq!(text(&r), "done", "{r}");
    // A GET stream the dead replica held is reopened by the SDK elsewhere: the next
    // change reaches both clients.
    let counts = {
        let mut v = Vec::new();
        for sdk in [&mut py, &mut ts] {
            let n = sdk.notifications().await;
            v.push(
                n.iter()
                    .filter(|m| m["method"] == "notifications/resources/updated")
                    .count(),
            );
        }
        v
    };
    let deadline = Instant::now() + T;
    let mut reached = [false, false];
    while !reached.iter().all(|r| *r) && Instant::now() < deadline {
        let r = try_call(&other, "calc__update_resource", json!({"uri": README})).await;
        assert_eq!(r, Ok(format!("updated {README}")));
        for (i, sdk) in [&mut py, &mut ts].into_iter().enumerate() {
            let n = sdk.notifications().await;
            reached[i] = n
                .iter()
                .filter(|m| m["method"] == "notifications/resources/updated")
                .count()
                > counts[i];
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        reached.iter().all(|r| *r),
        "{reached:?}\npy:\n{}\nts:\n{}",
        py.stderr(),
        ts.stderr()
    );
    for sdk in [&mut py, &mut ts] {
        sdk.same_session().await;
    }
    assert_eq!(c.opened(), 3, "no client initialized again:\n{}", c.logs());
    py.quit().await;
    ts.quit().await;
}

/// A session whose replica died and nobody uses again ends after `session_idle`, in Redis
/// and on the replicas that served it; one in use beside it lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_nobody_resumes_after_its_replica_died_expires_after_session_idle() {
    let idle = Duration::from_secs(3);
    let mut c = Cluster::start("session_idle = \"3s\"");
    let abandoned = c.gw(0).session().await;
    let kept = c.gw(0).session().await;
    for i in 0..REPLICAS {
        for s in [&abandoned, &kept] {
            let via = crate::cluster::via(s, c.gw(i));
            assert_eq!(
                try_call(&via, "calc__add", json!({"a": 1, "b": 1})).await,
                Ok("2".into())
            );
        }
    }
    let last_use = Instant::now();
    let records = |r: &Redis| r.cli(&["KEYS", "mcpgw:session:*"]).lines().count();
    assert_eq!(records(&c.redis), 2, "{}", c.redis.cli(&["KEYS", "*"]));
    c.kill(0);
    // One session goes on being used through nginx; the other nobody touches.
    let kept = Session {
        url: c.nginx.url.clone(),
        ..crate::cluster::via(&kept, c.gw(1))
    };
    let deadline = last_use + idle * 3;
    while records(&c.redis) == 2 {
        assert!(Instant::now() < deadline, "the record never expired");
        assert_eq!(
            try_call(&kept, "calc__add", json!({"a": 2, "b": 2})).await,
            Ok("4".into())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expired = last_use.elapsed();
    assert!(expired >= idle, "expired after {expired:?}, before session_idle");
    // The replicas that served it forget it too (their janitor), by session_idle × 1.5:
    // each holds one session then, the one in use.
    let deadline = last_use + idle * 3 / 2 + Duration::from_secs(2);
    loop {
        let mut held = Vec::new();
        for gw in c.live.iter().flatten() {
            held.push(gw.get_json("/status").await["sessions"].as_u64());
        }
        if held.iter().all(|n| *n == Some(1)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still held after {:?}: {held:?}",
            last_use.elapsed()
        );
        assert_eq!(
            try_call(&kept, "calc__add", json!({"a": 2, "b": 2})).await,
            Ok("4".into())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last_use.elapsed() >= idle, "forgotten before session_idle");
    assert_eq!(statuses(&c, &abandoned).await, [404, 404], "gone on the replicas left");
    assert_eq!(statuses(&c, &kept).await, [200, 200], "the session in use lives on");
    assert_eq!(records(&c.redis), 1);
}

/// SIGTERM to each replica in turn (one signal: the whole drain), each replaced on its
/// port, while ten plain sessions and both SDK clients call: no call fails, no session is
/// lost or opened again, and the GET streams the drains ended come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_fails_no_call_and_loses_no_session() {
    let mut c = Cluster::start("drain_delay = \"1s\"");
    let mut py = Sdk::python(&c.nginx.url).await;
    let mut ts = Sdk::typescript(&c.nginx.url).await;
    for sdk in [&mut py, &mut ts] {
        sdk.ok(&format!("subscribe {README}")).await;
    }
    let mut sessions = Vec::new();
    for _ in 0..10 {
        sessions.push(Session::open(&c.nginx.url).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut plain = Vec::new();
    for (i, s) in sessions.into_iter().enumerate() {
        let (stop, failures, calls) = (stop.clone(), failures.clone(), calls.clone());
        plain.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let expected = (i as u64 + n).to_string();
                match try_call(&s, "calc__add", json!({"a": i, "b": n})).await {
                    Ok(t) if t == expected => {}
                    other => failures
                        .lock()
                        .unwrap()
                        .push(format!("session {i} call {n}: {other:?}")),
                }
                calls.fetch_add(1, Ordering::Relaxed);
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            s
        }));
    }
    let mut sdks = Vec::new();
    for mut sdk in [py, ts] {
        let (stop, failures, calls) = (stop.clone(), failures.clone(), calls.clone());
        sdks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = sdk
                    .send(&format!("call calc__add {}", json!({"a": 1000, "b": n})))
                    .await;
                if r["content"][0]["text"].as_str() != Some((1000 + n).to_string().as_str()) {
                    failures.lock().unwrap().push(format!("{} call {n}: {r}", sdk.name));
                }
                calls.fetch_add(1, Ordering::Relaxed);
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sdk
        }));
    }
    until(T, || calls.load(Ordering::Relaxed) >= 50).await;
    for i in 0..REPLICAS {
        c.roll(i).await;
    }
    let at_end = calls.load(Ordering::Relaxed);
    until(T, || calls.load(Ordering::Relaxed) >= at_end + 50).await;
    stop.store(true, Ordering::Relaxed);
    let mut sessions = Vec::new();
    for t in plain {
        sessions.push(t.await.unwrap());
    }
    let mut sdks: Vec<Sdk> = futures::future::join_all(sdks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} of {} calls failed: {failures:#?}\nnginx:\n{}",
        failures.len(),
        calls.load(Ordering::Relaxed),
        c.nginx.error_log()
    );
    // Every session lives on, on every new replica; no client initialized again.
    for s in &sessions {
        assert_eq!(statuses(&c, s).await, [200, 200, 200], "{}", s.id);
    }
    for sdk in &mut sdks {
        sdk.same_session().await;
        assert_eq!(sdk.call("calc__add", json!({"a": 1, "b": 1})).await, "2");
    }
    assert_eq!(c.opened(), 12, "{}", c.logs());
    // Each drain ended the GET streams its replica held; the SDKs opened them again, and
    // the new replicas' children follow the subscriptions made before: a change seen by
    // each new replica reaches both clients.
    subscribed_everywhere(&c, README).await;
    for _ in 0..REPLICAS {
        let r = try_call(&sessions[0], "calc__update_resource", json!({"uri": README})).await;
        assert_eq!(r, Ok(format!("updated {README}")));
    }
    for sdk in &mut sdks {
        let got = sdk.await_notes("notifications/resources/updated", REPLICAS).await;
        let notes = sdk.notifications().await;
        assert!(got, "{}: {notes:?}\n{}", sdk.name, sdk.stderr());
    }
    for sdk in sdks {
        sdk.quit().await;
    }
}

/// Redis killed mid-run (`on_redis_down = "local"`): the clients go on wherever their
/// requests land; once it is back, empty, a session opened meanwhile works on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_and_restarted_mid_run_the_clients_keep_working() {
    let mut c = Cluster::start("");
    let mut py = Sdk::python(&c.nginx.url).await;
    let mut ts = Sdk::typescript(&c.nginx.url).await;
    let plain = Session::open(&c.nginx.url).await;
    // Every replica has served every session before Redis goes.
    for n in 0..REPLICAS {
        for sdk in [&mut py, &mut ts] {
            assert_eq!(
                sdk.call("calc__add", json!({"a": n, "b": 1})).await,
                (n + 1).to_string()
            );
        }
        assert_eq!(
            try_call(&plain, "calc__add", json!({"a": n, "b": 1})).await,
            Ok((n + 1).to_string())
        );
    }
    let redis_is = |state: &'static str| {
        let gws: Vec<String> = c.live.iter().flatten().map(|g| g.base.clone()).collect();
        async move {
            for base in gws {
                let mut ok = false;
                for _ in 0..200 {
                    let st: Value = reqwest::get(format!("{base}/status"))
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    if st["cluster"]["redis"] == state {
                        ok = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert!(ok, "{base}: Redis never {state}");
            }
        }
    };
    c.redis.kill();
    redis_is("down").await;
    // on_redis_down = "local": the clients go on, wherever their requests land.
    for n in 0..2 * REPLICAS {
        for sdk in [&mut py, &mut ts] {
            assert_eq!(
                sdk.call("calc__add", json!({"a": n, "b": 5})).await,
                (n + 5).to_string()
            );
        }
        assert_eq!(
            try_call(&plain, "calc__add", json!({"a": n, "b": 5})).await,
            Ok((n + 5).to_string())
        );
    }
    assert_eq!(
        py.ok("list").await["tools"].as_array().map(Vec::len),
        ts.ok("list").await["tools"].as_array().map(Vec::len)
    );
    // A session opened while Redis is down, known to one replica only.
    let during = c.gw(0).session().await;
    assert_eq!(
        try_call(&during, "calc__add", json!({"a": 3, "b": 3})).await,
        Ok("6".into())
    );
    c.redis.restart();
    redis_is("up").await;
    // Back (empty): the replicas put their sessions back, so every replica serves each.
    let restored = until(T, || c.redis.cli(&["KEYS", "mcpgw:session:*"]).lines().count() == 4).await;
    assert!(restored, "{}", c.redis.cli(&["KEYS", "*"]));
    for i in 0..REPLICAS {
        let on = crate::cluster::via(&during, c.gw(i));
        assert_eq!(
            try_call(&on, "calc__add", json!({"a": i, "b": 7})).await,
            Ok((i + 7).to_string())
        );
    }
    for n in 0..REPLICAS {
        for sdk in [&mut py, &mut ts] {
            assert_eq!(
                sdk.call("calc__add", json!({"a": n, "b": 9})).await,
                (n + 9).to_string()
            );
        }
    }
    for sdk in [&mut py, &mut ts] {
        sdk.same_session().await;
    }
    assert_eq!(c.opened(), 4, "{}", c.logs());
    py.quit().await;
    ts.quit().await;
}
