//! Rate limits that hold across replicas (issue #16): one real Redis, three real gateway
//! replicas with the same config, each with its own copy of one stdio mock server, and
//! alice with one session on each replica. A burst spread round-robin over the replicas
//! gets through as many calls as one replica alone would let through; with Redis killed,
//! `cluster.on_redis_down` decides (per-replica limits, or 503), and once Redis is back
//! the limits are global again.
//!
//! Each assertion fails on per-process limits: three replicas with 10/s each let ~30 of
//! a burst through, not 10.

use crate::cluster::cluster_toml;
use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ALICE: &str = "alice-limits-token-5c1d9e";
/// An admin's token: it reads `/status`.
const OPS: &str = "ops-limits-token-8a2f4b";
const REPLICAS: usize = 3;
const BURST: usize = 100;

fn sha256_hex(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// What the replicas of a test run with, besides `[cluster]` and the mock server `calc`.
#[derive(Default)]
struct Setup<'a> {
    /// More `[cluster]` lines (`on_redis_down`).
    cluster: &'a str,
    /// More `[servers.calc]` lines (`rate_limits = ...`).
    server: &'a str,
    /// More `[clients.alice]` lines (`rate_limit = ...`).
    alice: &'a str,
    /// More tables (`[rate_limits]`).
    extra: &'a str,
}

/// `n` replicas `gw-0`… sharing `redis`, each with its own copy of one mock.
fn start_replicas(redis: &Redis, n: usize, s: Setup) -> Vec<Gateway> {
    let name = unique("limits");
    (0..n)
        .map(|i| {
            Gateway::start(&format!(
                "{}\n{}\n[clients.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n\n[clients.alice]\ntoken_sha256 = \"{}\"\n{}\n\n{}\n",
                cluster_toml(redis, &format!("replica_id = \"gw-{i}\"\n{}", s.cluster)),
                server("calc", &name, &[], s.server),
                sha256_hex(OPS),
                sha256_hex(ALICE),
                s.alice,
                s.extra,
            ))
        })
        .collect()
}

/// alice's session on one replica.
struct Alice {
    http: reqwest::Client,
    url: String,
    sid: String,
}

impl Alice {
    async fn open(gw: &Gateway) -> Alice {
        let http = reqwest::Client::new();
        let r = http
            .post(&gw.url)
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {ALICE}"))
            .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "initialize as alice");
        let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let a = Alice {
            http,
            url: gw.url.clone(),
            sid,
        };
        let r = a
            .post(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(r.status(), 202);
        a
    }

    async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {ALICE}"))
            .header("mcp-session-id", &self.sid)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A tools/call of `calc__echo`: the HTTP status and the response message.
    async fn echo(&self, id: usize) -> (u16, Value) {
        self.call(id, "calc__echo", json!({"text": "hi"})).await
    }

    /// A tools/call of `calc__add` (1 + 2).
    async fn add(&self) -> (u16, Value) {
        self.call(0, "calc__add", json!({"a": 1, "b": 2})).await
    }

    async fn call(&self, id: usize, tool: &str, args: Value) -> (u16, Value) {
        let r = self
            .post(json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
                "params":{"name":tool,"arguments":args}}))
            .await;
        let status = r.status().as_u16();
        (status, read_messages(r).await.pop().unwrap())
    }
}

async fn sessions(gws: &[Gateway]) -> Vec<Alice> {
    let mut out = Vec::new();
    for gw in gws {
        out.push(Alice::open(gw).await);
    }
    out
}

/// How a burst went.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    /// Tool results saying which limit was hit (`limit` in their text).
    limited: usize,
    /// Anything else: (HTTP status, message).
    other: Vec<(u16, Value)>,
    took: Duration,
}

/// `BURST` tools/call at once, round-robin over `sessions`. `limit` is the text every
/// rate-limited answer names.
async fn burst(sessions: &[Alice], limit: &str) -> Tally {
    let started = Instant::now();
    let calls = (0..BURST).map(|i| sessions[i % sessions.len()].echo(i + 1));
    let answers = futures::future::join_all(calls).await;
    let mut t = Tally {
        took: started.elapsed(),
        ..Tally::default()
    };
    for (status, m) in answers {
        let r = &m["result"];
        let text = r["content"][0]["text"].as_str().unwrap_or_default();
        if status == 200 && r["isError"] != true && text == "hi" {
            t.ok += 1;
        } else if status == 200 && r["isError"] == true && text.starts_with("Rate limit exceeded") {
            assert!(text.contains(limit), "the limit hit is {limit}: {m}");
            t.limited += 1;
        } else {
            t.other.push((status, m));
        }
    }
    t
}

/// `rate` per second with a burst of `rate`: what a burst that took `took` may let
/// through, ±2 (it refills while the burst runs).
fn assert_about(t: &Tally, rate: usize, what: &str) {
    let refill = (rate as f64 * t.took.as_secs_f64()).floor() as usize;
    assert!(t.other.is_empty(), "{what}: unexpected answers {:?}", t.other);
    assert!(
        t.ok + 2 >= rate && t.ok <= rate + refill + 2,
        "{what}: {} of {BURST} passed in {:?} (expected {rate}±2, +{refill} refilled); {} limited",
        t.ok,
        t.took,
        t.limited
    );
}

/// Lets every bucket refill (the tests are about time: a burst of 10/s is full after 1 s).
async fn refill() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

async fn redis_state_everywhere(gws: &[Gateway], want: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut all = true;
        for gw in gws {
            all &= gw.get_json_as("/status", OPS).await["cluster"]["redis"] == want;
        }
        if all {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const PER_CLIENT_10: Setup = Setup {
    cluster: "",
    server: "",
    alice: "",
    extra: "[rate_limits]\nper_client = \"10/s\"\n",
};

#[tokio::test]
async fn per_client_holds_across_three_replicas() {
    let redis = Redis::start();
    let gws = start_replicas(&redis, REPLICAS, PER_CLIENT_10);
    let alice = sessions(&gws).await;
    refill().await;
    let t = burst(&alice, "per_client limit 10/s").await;
    assert_about(&t, 10, "per_client over 3 replicas");
    // More requests of hers, on any replica: refused with -32029 and when to retry, as on
    // one process. (The bucket refills one every 100 ms, which a loaded machine may take
    // between the burst and the next request: requests back to back outrun the refill.)
    let mut m = Value::Null;
    for id in 5..40 {
        let r = alice[id % alice.len()]
            .post(json!({"jsonrpc":"2.0","id":id,"method":"prompts/list"}))
            .await;
        m = read_messages(r).await.pop().unwrap();
        if m["error"]["code"] == -32029 {
            break;
        }
    }
    assert_eq!(error_of(&m)["code"], -32029, "{m}");
    assert_eq!(error_of(&m)["data"]["limit"], "per_client limit 10/s", "{m}");
    let ms = error_of(&m)["data"]["retryAfterMs"].as_u64().unwrap();
    assert!(ms > 0 && ms <= 100, "10/s refills one every 100 ms, not {ms}");
    // Keys name the client by a digest, never by a token.
    let keys = redis.cli(&["--scan", "--pattern", "mcpgw:rl:*"]);
    let key = keys.lines().find(|k| k.starts_with("mcpgw:rl:c:"));
    assert!(!keys.contains(ALICE) && !keys.contains("alice"), "{keys}");
    let ttl: i64 = redis
        .cli(&["PTTL", key.expect("a per_client key")])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 2100, "a TTL just over the bucket's period: {ttl} ms");
}

#[tokio::test]
async fn per_server_holds_across_three_replicas() {
    let redis = Redis::start();
    let setup = Setup {
        server: "rate_limits = { per_server = \"10/s\" }\n",
        ..Setup::default()
    };
    let gws = start_replicas(&redis, REPLICAS, setup);
    let alice = sessions(&gws).await;
    let t = burst(&alice, "server 'calc' limit 10/s").await;
    assert_about(&t, 10, "per_server over 3 replicas");
}

#[tokio::test]
async fn per_tool_holds_across_three_replicas() {
    let redis = Redis::start();
    let setup = Setup {
        server: "rate_limits = { per_tool = { echo = \"10/s\" } }\n",
        ..Setup::default()
    };
    let gws = start_replicas(&redis, REPLICAS, setup);
    let alice = sessions(&gws).await;
    let t = burst(&alice, "server 'calc' limit for tool echo 10/s").await;
    assert_about(&t, 10, "per_tool over 3 replicas");
    // Another tool of the server is not limited, on any replica.
    for a in &alice {
        assert_eq!(text(&a.add().await.1), "3");
    }
}

#[tokio::test]
async fn a_client_s_own_rate_limit_holds_across_three_replicas() {
    let redis = Redis::start();
    let setup = Setup {
        alice: "rate_limit = \"10/s\"",
        ..Setup::default()
    };
    let gws = start_replicas(&redis, REPLICAS, setup);
    let alice = sessions(&gws).await;
    refill().await;
    let t = burst(&alice, "client 'alice' limit 10/s").await;
    assert_about(&t, 10, "alice's rate_limit over 3 replicas");
}

#[tokio::test]
async fn a_refused_call_spends_none_of_its_limits() {
    // per_client 10/s and per_tool 5/s: the tool's limit binds the burst, and the calls it
    // refuses spend nothing of alice's per_client budget, so she still has about 5 calls
    // of another tool right after (per-process limits, spent one by one, leave her none).
    let redis = Redis::start();
    let setup = Setup {
        server: "rate_limits = { per_tool = { echo = \"5/s\" } }\n",
        ..PER_CLIENT_10
    };
    let gws = start_replicas(&redis, REPLICAS, setup);
    let alice = sessions(&gws).await;
    refill().await;
    let t = burst(&alice, "server 'calc' limit for tool echo 5/s").await;
    assert_about(&t, 5, "per_tool binds");
    let mut ok = 0;
    for (i, a) in alice.iter().cycle().take(20).enumerate() {
        let (_, m) = a.add().await;
        match m["result"]["isError"] == true {
            false => ok += 1,
            true => assert!(text(&m).contains("per_client limit 10/s"), "call {i}: {m}"),
        }
    }
    let refilled = (10.0 * t.took.as_secs_f64()).floor() as usize + 2;
    assert!(
        ok >= 4 && ok <= 5 + refilled + 2,
        "alice's per_client budget lost only the {} calls that passed: {ok} more passed",
        t.ok
    );
}

#[tokio::test]
async fn with_redis_down_local_limits_apply_per_replica_and_global_ones_come_back() {
    let mut redis = Redis::start();
    let setup = Setup {
        cluster: "on_redis_down = \"local\"",
        ..PER_CLIENT_10
    };
    let gws = start_replicas(&redis, REPLICAS, setup);
    let alice = sessions(&gws).await;
    refill().await;
    assert_about(&burst(&alice, "per_client limit 10/s").await, 10, "with Redis up");

    redis.kill();
    refill().await;
    let t = burst(&alice, "per_client limit 10/s").await;
    assert!(t.other.is_empty(), "calls keep working: {:?}", t.other);
    let refilled = (10.0 * t.took.as_secs_f64()).floor() as usize * REPLICAS;
    assert!(
        t.ok + 3 >= REPLICAS * 10 && t.ok <= REPLICAS * 10 + refilled + 3,
        "each replica applies its own 10/s: {t:?}"
    );
    assert!(redis_state_everywhere(&gws, "down").await);
    for gw in &gws {
        assert!(gw.wait_log("Redis is unreachable", Duration::from_secs(5)).await);
        let logs = gw.logs();
        assert_eq!(
            logs.matches("Redis is unreachable").count(),
            1,
            "one warning per outage: {logs}"
        );
        assert!(logs.contains("own state and limits"), "{logs}");
    }

    redis.restart();
    assert!(
        redis_state_everywhere(&gws, "up").await,
        "every replica sees Redis again"
    );
    refill().await;
    assert_about(&burst(&alice, "per_client limit 10/s").await, 10, "with Redis back");
}

#[tokio::test]
async fn with_redis_down_refuse_answers_503_until_it_is_back() {
    let mut redis = Redis::start();
    let setup = Setup {
        cluster: "on_redis_down = \"refuse\"",
        server: "rate_limits = { per_server = \"10/s\" }\n",
        ..Setup::default()
    };
    let gws = start_replicas(&redis, REPLICAS, setup);
    let alice = sessions(&gws).await;
    assert_about(&burst(&alice, "server 'calc' limit 10/s").await, 10, "with Redis up");

    redis.kill();
    let started = Instant::now();
    for (i, a) in alice.iter().cycle().take(9).enumerate() {
        let (status, m) = a.echo(1000 + i).await;
        assert_eq!(status, 503, "{m}");
        let msg = error_of(&m)["message"].as_str().unwrap_or_default().to_owned();
        assert!(msg.contains("Redis is unreachable"), "{m}");
        assert!(msg.contains("cluster.on_redis_down"), "{m}");
    }
    assert!(started.elapsed() < Duration::from_secs(3), "refusing never hangs");
    // A request no limit applies to needs no Redis: it still works.
    let r = alice[0]
        .post(json!({"jsonrpc":"2.0","id":5,"method":"tools/list"}))
        .await;
    assert_eq!(r.status(), 200);
    assert!(read_messages(r).await[0]["result"]["tools"].is_array());

    redis.restart();
    assert!(redis_state_everywhere(&gws, "up").await);
    refill().await;
    let t = burst(&alice, "server 'calc' limit 10/s").await;
    if !t.other.is_empty() {
        eprintln!("{}", gws[0].logs());
    }
    assert_about(&t, 10, "with Redis back");
}

/// The cost rule: a call with no limits configured makes no Redis round trip, and one
/// with limits makes exactly one (one EVALSHA for all its limits).
#[tokio::test]
async fn calls_without_limits_make_no_redis_round_trip_and_with_limits_one() {
    let redis = Redis::start();
    let commands = || -> std::collections::BTreeMap<String, u64> {
        redis
            .cli(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    };
    let grown = |before: &std::collections::BTreeMap<String, u64>, after: &std::collections::BTreeMap<String, u64>| {
        after
            .iter()
            .map(|(c, n)| (c.clone(), n - before.get(c).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let gws = start_replicas(&redis, 1, Setup::default());
    let alice = Alice::open(&gws[0]).await;
    let before = commands();
    for i in 0..50 {
        assert_eq!(text(&alice.echo(i).await.1), "hi");
    }
    let grew = grown(&before, &commands());
    // The heartbeat's commands, and this test's INFO.
    let heartbeat = ["zadd", "zremrangebyscore", "zcard", "info"];
    assert!(
        grew.keys().all(|c| heartbeat.contains(&c.as_str())),
        "50 calls without limits ran {grew:?}"
    );
    drop(gws);

    let setup = Setup {
        server: "rate_limits = { per_tool = { echo = \"1000/s\" } }\n",
        ..PER_CLIENT_10
    };
    let setup = Setup {
        extra: "[rate_limits]\nper_client = \"1000/s\"\n",
        ..setup
    };
    let gws = start_replicas(&redis, 1, setup);
    let alice = Alice::open(&gws[0]).await;
    let before = commands();
    for i in 0..50 {
        assert_eq!(text(&alice.echo(i).await.1), "hi");
    }
    let grew = grown(&before, &commands());
    // Two limits, one EVALSHA each call; the very first may find the script not loaded
    // yet (one more EVALSHA after a SCRIPT LOAD).
    let evalsha = grew.get("evalsha").copied().unwrap_or(0);
    assert!((50..=51).contains(&evalsha), "one EVALSHA per limited call: {grew:?}");
    assert!(!grew.contains_key("eval"), "{grew:?}");
    // Inside the script: one TIME, and a GET and a SET per bucket.
    assert_eq!(grew.get("time"), Some(&50), "{grew:?}");
}
