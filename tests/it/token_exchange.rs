//! `auth.token_exchange` (issue #18 §2), end to end: the real binary, the OAuth fixture
//! authorization server (tests/fixtures/oauth_as.py, RFC 8693 exchange, counts on
//! `/stats`) and the protected MCP server (tests/fixtures/protected_mcp.py, the Python
//! SDK as a resource server that accepts only tokens of its audience and records every
//! `Authorization` it sees on `/seen`). Callers are identities of `[auth.oauth]`: JWTs
//! signed with the fixture key, issued by the fixture AS.

use crate::auth::rsa_test_key;
use crate::cluster::{replicas, via};
use crate::common::*;
use jsonwebtoken::{Algorithm, Header};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const GW_SECRET: &str = "gw-client-secret-5be1d0";
const STATIC: &str = "static-admin-token-91c2";
const AUDIENCE: &str = "mcp-gateway";

/// A fixture process that prints its URL as the first stdout line. Killed on drop.
struct Fixture {
    child: Child,
    url: String,
}

impl Fixture {
    fn start(script: &str, args: &[&str]) -> Fixture {
        let mut child = Command::new(repo().join(".venv/bin/python"))
            .arg(repo().join("tests/fixtures").join(script))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a fixture");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.starts_with("http://") {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("{script} did not start: {line:?}\n{err}");
        }
        // Its stderr is read away, so it never blocks on a full pipe.
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Fixture {
            child,
            url: line.trim().to_owned(),
        }
    }

    async fn get(&self, path: &str) -> Value {
        fetch_json(&format!("{}{path}", self.url.trim_end_matches("/mcp"))).await
    }

    async fn control(&self, knobs: Value) {
        post_ok(&format!("{}/control", self.url), &knobs).await
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The authorization server and the protected server of audience `docs-api`.
fn fixtures(as_args: &[&str]) -> (Fixture, Fixture) {
    let mut args = vec!["--port", "0", "--client", "mcp-gateway:gw-client-secret-5be1d0"];
    args.extend_from_slice(as_args);
    let idp = Fixture::start("oauth_as.py", &args);
    let docs = Fixture::start(
        "protected_mcp.py",
        &["--port", "0", "--audience", "docs-api", "--issuer", &idp.url],
    );
    (idp, docs)
}

fn jwt(issuer: &str, sub: &str, aud: &str) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("rsa-test".into());
    let claims = json!({"iss": issuer, "sub": sub, "aud": aud, "exp": now + 3600, "iat": now});
    jsonwebtoken::encode(&h, &claims, &rsa_test_key()).unwrap()
}

/// The gateway's config: `[auth.oauth]` trusting the AS, a static admin client, and
/// `docs` with token exchange. `service` is the gateway's own credential for its own
/// connection (handshake and lists).
fn config(idp: &Fixture, docs: &Fixture, service: &str) -> String {
    format!(
        "[clients.ops]\ntoken = \"{STATIC}\"\nadmin = true\n\n\
         [auth.oauth]\nissuer = \"{iss}\"\naudience = \"{AUDIENCE}\"\njwks_url = \"{iss}/jwks\"\n\n\
         [servers.docs]\nurl = \"{url}\"\ntimeout = \"20s\"\n\
         headers = {{ Authorization = \"Bearer {service}\" }}\n\
         auth = {{ token_exchange = {{ token_endpoint = \"{iss}/token\", audience = \"docs-api\", scope = \"docs.read\", \
         client_id = \"mcp-gateway\", client_secret = \"${{GW_SECRET}}\" }} }}\n",
        iss = idp.url,
        url = docs.url,
    )
}

/// [`config`] with the gateway's own service token and its client secret written in, as
/// replicas (which get no environment of the test's) are started with it.
fn shared_config(idp: &Fixture, docs: &Fixture) -> String {
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    config(idp, docs, &service).replace("${GW_SECRET}", GW_SECRET)
}

fn start(cfg: &str) -> Gateway {
    Gateway::start_with_env(cfg, &[("GW_SECRET", GW_SECRET), ("MCP_GATEWAY_LOG", "trace")])
}

/// Waits for `docs__whoami` in the catalog, seen by `token`.
async fn ready(gw: &Gateway, token: &str) -> Session {
    let s = Session::open_as(&gw.url, token).await;
    for _ in 0..200 {
        if s.tool_names().await.iter().any(|n| n == "docs__whoami") {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("docs__whoami never listed; logs:\n{}", gw.logs());
}

async fn whoami(s: &Session) -> Value {
    let r = s.call("docs__whoami", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    serde_json::from_str(&text(&r)).unwrap_or_else(|e| panic!("{e}: {r}"))
}

/// The principal the gateway keeps an `[auth.oauth]` caller's state under: the name, NUL,
/// `oauth:`, and 16 hex digits of the SHA-256 of the issuer and the claim (`sub`), each
/// with its length (8 bytes, big-endian) before it.
fn principal(issuer: &str, name: &str) -> String {
    let mut input = Vec::new();
    for part in [issuer, "sub"] {
        input.extend_from_slice(&(part.len() as u64).to_be_bytes());
        input.extend_from_slice(part.as_bytes());
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, &input);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{name}\0oauth:{}", &hex[..16])
}

/// The second issuer of the tests where `[auth.oauth]` changes: the AS trusts its
/// subject tokens (signed with the same fixture key, whose JWKS is a file).
const ISSUER_B: &str = "https://issuer-b.test";

fn trust_b() -> String {
    format!(
        "{ISSUER_B}={}",
        repo().join("tests/fixtures/jwt_rs256_jwk.json").display()
    )
}

/// The exchanged tokens `docs` has seen (not the gateway's own credential).
async fn exchanged_seen(docs: &Fixture, service: &str) -> Vec<String> {
    let seen: Vec<String> = serde_json::from_value(docs.get("/seen").await).unwrap();
    seen.iter()
        .filter_map(|v| v.strip_prefix("Bearer "))
        .filter(|t| *t != service)
        .map(str::to_owned)
        .collect()
}

async fn exchanges(idp: &Fixture) -> Value {
    idp.get("/stats").await["exchange_subjects"].clone()
}

#[tokio::test]
async fn each_identity_gets_its_own_exchanged_token_cached_until_near_expiry() {
    let (idp, docs) = fixtures(&["--exchange-delay-ms", "200"]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let gw = start(&config(&idp, &docs, &service));
    let alice_jwt = jwt(&idp.url, "alice", AUDIENCE);
    let bob_jwt = jwt(&idp.url, "bob", AUDIENCE);
    let alice = ready(&gw, &alice_jwt).await;
    let bob = Session::open_as(&gw.url, &bob_jwt).await;

    // Each sees its own sub, with the server's audience and the configured scope.
    for _ in 0..3 {
        let me = whoami(&alice).await;
        assert_eq!(me, json!({"sub": "alice", "aud": "docs-api", "scope": "docs.read"}));
    }
    for _ in 0..2 {
        assert_eq!(whoami(&bob).await["sub"], "bob");
    }
    // A 2026-07-28 (sessionless) call of bob's: his cached token, his identity.
    let r = reqwest::Client::new()
        .post(&gw.url)
        .bearer_auth(&bob_jwt)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "docs__whoami")
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "docs__whoami", "arguments": {}, "_meta": stateless_meta("te-test")}}))
        .send()
        .await
        .unwrap();
    let last = read_messages(r).await.pop().expect("an answer");
    let me: Value = serde_json::from_str(&text(&last)).unwrap_or_else(|e| panic!("{e}: {last}"));
    assert_eq!(me["sub"], "bob", "{last}");
    // N calls, one exchange per identity.
    assert_eq!(exchanges(&idp).await, json!({"alice": 1, "bob": 1}));

    // 20 concurrent first calls (on 20 sessions of one identity): one exchange.
    let carol_jwt = jwt(&idp.url, "carol", AUDIENCE);
    let mut carols = Vec::new();
    for _ in 0..20 {
        carols.push(Session::open_as(&gw.url, &carol_jwt).await);
    }
    let answers = futures::future::join_all(carols.iter().map(whoami)).await;
    assert!(answers.iter().all(|a| a["sub"] == "carol"), "{answers:?}");
    assert_eq!(exchanges(&idp).await["carol"], 1);

    // A caller with a static token: a clear error naming the server, no exchange.
    let ops = Session::open_as(&gw.url, STATIC).await;
    let r = ops.call("docs__whoami", json!({})).await;
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("'docs'") && msg.contains("[auth.oauth]"), "{r}");

    // A short-lived token is exchanged again once it is no longer fresh (2 s: 1 s).
    idp.control(json!({"expires_in": 2, "exchange_delay_ms": 0})).await;
    let dave = Session::open_as(&gw.url, &jwt(&idp.url, "dave", AUDIENCE)).await;
    assert_eq!(whoami(&dave).await["sub"], "dave");
    assert_eq!(exchanges(&idp).await["dave"], 1);
    assert_eq!(whoami(&dave).await["sub"], "dave");
    let mut again = false;
    for _ in 0..100 {
        assert_eq!(whoami(&dave).await["sub"], "dave");
        if exchanges(&idp).await["dave"] == 2 {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again, "dave's token was never exchanged again");

    // The inbound tokens never reached the server: it saw only the gateway's own
    // credential and exchanged tokens of its audience.
    let seen: Vec<String> = serde_json::from_value(docs.get("/seen").await).unwrap();
    assert!(!seen.is_empty());
    let inbound = [&alice_jwt, &bob_jwt, &carol_jwt];
    for value in &seen {
        assert!(
            inbound.iter().all(|t| !value.contains(t.as_str())),
            "an inbound token went downstream"
        );
    }
    let exchanged: Vec<&str> = seen
        .iter()
        .filter_map(|v| v.strip_prefix("Bearer "))
        .filter(|t| *t != service)
        .collect();
    assert!(exchanged.len() >= 6, "{seen:?}");

    // No token in the logs (at trace) or on /status: not the inbound ones, not the
    // exchanged ones, not the gateway's secret or its own credential.
    let status = gw.get_json_as("/status", STATIC).await.to_string();
    let logs = gw.logs();
    assert!(logs.contains("exchanged the caller's token"), "the exchange is logged");
    for t in inbound
        .iter()
        .map(|t| t.as_str())
        .chain(exchanged.iter().copied())
        .chain([GW_SECRET, service.as_str()])
    {
        let sig = t.rsplit('.').next().unwrap();
        assert!(!logs.contains(sig), "a token in the logs");
        assert!(!status.contains(sig), "a token on /status");
    }
}

#[tokio::test]
async fn a_refused_exchange_names_the_server_and_the_code_and_no_token() {
    let (idp, docs) = fixtures(&["--fail-exchange", "invalid_grant"]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let gw = start(&config(&idp, &docs, &service));
    let alice_jwt = jwt(&idp.url, "alice", AUDIENCE);
    let alice = ready(&gw, &alice_jwt).await;
    let r = alice.call("docs__whoami", json!({})).await;
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("'docs'") && msg.contains("invalid_grant"), "{r}");
    let body = r.to_string();
    assert!(!body.contains("eyJ"), "no token in the error: {body}");
    assert!(!body.contains(GW_SECRET));
    assert_eq!(idp.get("/stats").await["errors"]["invalid_grant"], 1);
    assert!(
        msg.contains("refused (test knob)"),
        "the AS's description is kept: {msg}"
    );
    // An AS whose description quotes the subject token: the description is left out.
    idp.control(json!({"fail_exchange_echo": true})).await;
    let r = alice.call("docs__whoami", json!({})).await;
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("invalid_grant") && !msg.contains("test knob"), "{r}");
    assert!(!r.to_string().contains(alice_jwt.rsplit('.').next().unwrap()), "{r}");
    assert!(!gw.logs().contains(alice_jwt.rsplit('.').next().unwrap()));
    // A wrong client secret: the AS's invalid_client, named.
    let cfg = config(&idp, &docs, &service);
    let gw2 = Gateway::start_with_env(&cfg, &[("GW_SECRET", "wrong"), ("MCP_GATEWAY_LOG", "trace")]);
    let s = ready(&gw2, &alice_jwt).await;
    let r = s.call("docs__whoami", json!({})).await;
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains("'docs'") && msg.contains("invalid_client"), "{r}");
    assert!(!gw2.logs().contains(alice_jwt.rsplit('.').next().unwrap()));

    // An exchange for the wrong audience: the server refuses the token; the error names
    // the server and its 401, and carries no token.
    let cfg = config(&idp, &docs, &service).replace("audience = \"docs-api\"", "audience = \"other-api\"");
    idp.control(json!({"fail_exchange": null})).await;
    let gw3 = Gateway::start_with_env(&cfg, &[("GW_SECRET", GW_SECRET)]);
    let s = ready(&gw3, &alice_jwt).await;
    let r = s.call("docs__whoami", json!({})).await;
    let msg = error_of(&r)["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        msg.contains("'docs'") && msg.contains("refused this caller's exchanged token (HTTP 401)"),
        "{r}"
    );
    assert!(!r.to_string().contains("eyJ"), "{r}");
}

#[tokio::test]
async fn replicas_share_one_exchange_through_redis_sealed() {
    let redis = Redis::start();
    let (idp, docs) = fixtures(&[]);
    let servers = shared_config(&idp, &docs);
    let gws = replicas(2, &redis, &servers, "");
    let alice_jwt = jwt(&idp.url, "alice", AUDIENCE);
    let on_a = ready(&gws[0], &alice_jwt).await;
    assert_eq!(whoami(&on_a).await["sub"], "alice");
    let on_b = ready(&gws[1], &alice_jwt).await;
    assert_eq!(whoami(&on_b).await["sub"], "alice");
    assert_eq!(whoami(&on_b).await["sub"], "alice");
    assert_eq!(
        exchanges(&idp).await,
        json!({"alice": 1}),
        "one exchange for both replicas"
    );

    // bob's first calls on both replicas at once, the exchange slow: still one.
    idp.control(json!({"exchange_delay_ms": 300})).await;
    let bob_jwt = jwt(&idp.url, "bob", AUDIENCE);
    let (b0, b1) = tokio::join!(
        Session::open_as(&gws[0].url, &bob_jwt),
        Session::open_as(&gws[1].url, &bob_jwt)
    );
    let (w0, w1) = tokio::join!(whoami(&b0), whoami(&b1));
    assert_eq!((&w0["sub"], &w1["sub"]), (&json!("bob"), &json!("bob")));
    assert_eq!(
        exchanges(&idp).await["bob"],
        1,
        "one exchange for concurrent first calls on two replicas"
    );

    // What Redis holds is sealed: no token in it, and it has the token's lifetime.
    let keys = redis.cli(&["--scan", "--pattern", "*upstream-token*"]);
    let key = keys
        .lines()
        .find(|k| !k.ends_with(":lock"))
        .unwrap_or_else(|| panic!("no shared token in Redis: {keys:?}"));
    assert!(!key.contains("alice"), "the identity is digested in the key: {key}");
    let stored = redis.cli(&["GET", key]);
    assert!(stored.starts_with("1.") && !stored.contains("eyJ"), "{stored}");
    let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 300_000, "{ttl}");
}

/// An `expires_in` of 2^64-1 s is capped (ten years), not an overflow: the token is used
/// and kept.
#[tokio::test]
async fn a_huge_expires_in_is_capped_not_an_overflow() {
    let (idp, docs) = fixtures(&[]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let gw = start(&config(&idp, &docs, &service));
    idp.control(json!({"answer": {"expires_in": u64::MAX}})).await;
    let alice = ready(&gw, &jwt(&idp.url, "alice", AUDIENCE)).await;
    for _ in 0..3 {
        assert_eq!(whoami(&alice).await["sub"], "alice", "{}", gw.logs());
    }
    assert_eq!(exchanges(&idp).await["alice"], 1, "exchanged once, then cached");
    assert!(!gw.logs().contains("panicked"), "{}", gw.logs());
}

/// A token exchange server with `isolation = "session"` still serves each caller on its own
/// connection, on whichever replica the call lands: a session's calls are not claimed in
/// Redis as a session's process, nor sent over the bus to the replica that served it first
/// (which had no such process, and sent each of them back).
#[tokio::test]
async fn a_session_isolated_exchange_server_is_not_forwarded_between_replicas() {
    let redis = Redis::start();
    let (idp, docs) = fixtures(&[]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let servers = config(&idp, &docs, &service)
        .replace("${GW_SECRET}", GW_SECRET)
        .replace("timeout = \"20s\"\n", "timeout = \"20s\"\nisolation = \"session\"\n");
    assert!(servers.contains("isolation = \"session\""), "{servers}");
    let gws = replicas(2, &redis, &servers, "");
    let alice = ready(&gws[0], &jwt(&idp.url, "alice", AUDIENCE)).await;
    assert_eq!(whoami(&alice).await["sub"], "alice");
    let on_b = via(&alice, &gws[1]);
    for _ in 0..2 {
        assert_eq!(whoami(&on_b).await["sub"], "alice");
        assert_eq!(whoami(&alice).await["sub"], "alice");
    }
    assert_eq!(exchanges(&idp).await, json!({"alice": 1}));
    let claims = redis.cli(&["--scan", "--pattern", "*:proc:*"]);
    assert!(claims.trim().is_empty(), "claimed as a session's process: {claims:?}");
    for gw in &gws {
        assert!(
            !gw.logs().contains("forwarding the call"),
            "a call went over the bus:\n{}",
            gw.logs()
        );
    }
}

/// A record in Redis that does not open is never used, and is said: bob's sealed token
/// copied under alice's key (by someone who can write to Redis but has no cluster key)
/// gets alice her own token on the replica that finds it, a warning in its log, and her
/// own record written over it.
#[tokio::test]
async fn another_callers_record_moved_in_redis_is_refused_and_said() {
    let redis = Redis::start();
    let (idp, docs) = fixtures(&[]);
    let servers = shared_config(&idp, &docs);
    let gws = replicas(2, &redis, &servers, "");
    let alice_jwt = jwt(&idp.url, "alice", AUDIENCE);
    let bob = ready(&gws[0], &jwt(&idp.url, "bob", AUDIENCE)).await;
    assert_eq!(whoami(&bob).await["sub"], "bob");
    let alice = Session::open_as(&gws[0].url, &alice_jwt).await;
    assert_eq!(whoami(&alice).await["sub"], "alice");
    let key_of = |who: &str| {
        let digest = ring::digest::digest(&ring::digest::SHA256, principal(&idp.url, who).as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        let keys = redis.cli(&["--scan", "--pattern", &format!("*upstream-token:docs:*:{hex}")]);
        keys.lines()
            .next()
            .unwrap_or_else(|| panic!("no record of {who}: {keys:?}"))
            .to_owned()
    };
    let (alice_key, bob_key) = (key_of("alice"), key_of("bob"));
    let bobs = redis.cli(&["GET", &bob_key]).trim().to_owned();
    assert_eq!(redis.cli(&["SET", &alice_key, &bobs, "PX", "60000"]).trim(), "OK");

    let on_b = ready(&gws[1], &alice_jwt).await;
    assert_eq!(whoami(&on_b).await["sub"], "alice", "bob's token served to alice");
    assert_eq!(exchanges(&idp).await, json!({"alice": 2, "bob": 1}));
    assert!(
        gws[1].logs().contains("does not open with the cluster key"),
        "{}",
        gws[1].logs()
    );
    let now = redis.cli(&["GET", &alice_key]).trim().to_owned();
    assert!(
        now.starts_with("1.") && now != bobs,
        "alice's own record is written over it"
    );
}

/// The same `sub` from another issuer is another caller: after a reload that changes
/// `[auth.oauth] issuer`, a JWT of the new issuer naming the same `sub` gets an exchange
/// of its own, and its calls carry the token exchanged for it, never the one exchanged
/// for the former issuer's caller of that name (which the cache, keyed by the name alone,
/// used to hand it until it expired).
#[tokio::test]
async fn the_same_sub_from_a_new_issuer_gets_its_own_exchange_after_a_reload() {
    let trust = trust_b();
    let (idp, docs) = fixtures(&["--trust", &trust]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let cfg = config(&idp, &docs, &service);
    let gw = start(&cfg);
    let under_a = ready(&gw, &jwt(&idp.url, "xavier", AUDIENCE)).await;
    assert_eq!(whoami(&under_a).await["sub"], "xavier");
    assert_eq!(exchanges(&idp).await, json!({"xavier": 1}));
    let a_tokens = exchanged_seen(&docs, &service).await;
    assert!(!a_tokens.is_empty());

    let moved = cfg.replace(
        &format!("issuer = \"{}\"", idp.url),
        &format!("issuer = \"{ISSUER_B}\""),
    );
    assert_ne!(moved, cfg);
    gw.rewrite_config(&moved).await;

    let under_b = ready(&gw, &jwt(ISSUER_B, "xavier", AUDIENCE)).await;
    assert_eq!(whoami(&under_b).await["sub"], "xavier");
    assert_eq!(
        exchanges(&idp).await,
        json!({"xavier": 2}),
        "the new issuer's xavier got the former one's exchanged token"
    );
    let now = exchanged_seen(&docs, &service).await;
    let last = now.last().unwrap();
    assert!(
        !a_tokens.contains(last),
        "the new issuer's call carried the token exchanged for the former one's"
    );
    assert!(!gw.logs().contains('\0'), "a principal's NUL in the log");
}

/// A process per client identity (`isolation = "client"`) of a JWT caller without a
/// `[clients.NAME]` table is its principal's: after a reload names another issuer, the
/// same `sub` from it gets a process of its own, never the one (and the memory) the former
/// issuer's caller of that name left running. (One with a table is that client, whatever
/// its issuer: `client_secrets::an_oauth_caller_is_its_claims_identity_with_that_tables_secrets`.)
#[tokio::test]
async fn the_same_sub_from_a_new_issuer_gets_its_own_client_process() {
    let trust = trust_b();
    let (idp, docs) = fixtures(&["--trust", &trust]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let cfg = format!(
        "{}\n{}",
        config(&idp, &docs, &service),
        server(
            "iso",
            &unique("iso-principal"),
            &["--per-process"],
            "isolation = \"client\""
        )
    );
    let gw = start(&cfg);
    async fn pid(s: &Session) -> i32 {
        let r = s.call("iso__pid", json!({})).await;
        text(&r).parse::<i32>().unwrap_or_else(|e| panic!("{e}: {r}"))
    }
    let under_a = ready(&gw, &jwt(&idp.url, "xavier", AUDIENCE)).await;
    let again_a = ready(&gw, &jwt(&idp.url, "xavier", AUDIENCE)).await;
    let pid_a = pid(&under_a).await;
    assert_eq!(pid(&again_a).await, pid_a, "one process for one caller");

    let moved = cfg.replace(
        &format!("issuer = \"{}\"", idp.url),
        &format!("issuer = \"{ISSUER_B}\""),
    );
    gw.rewrite_config(&moved).await;
    let under_b = ready(&gw, &jwt(ISSUER_B, "xavier", AUDIENCE)).await;
    assert_ne!(
        pid(&under_b).await,
        pid_a,
        "the new issuer's xavier was served by the former one's process"
    );
    assert!(!gw.logs().contains('\0'), "a principal's NUL in the log");
}

/// The same across replicas, through Redis: a gateway whose `[auth.oauth]` names another
/// issuer does not open (nor find) the record another replica shared for the same `sub`
/// of its issuer.
#[tokio::test]
async fn a_replica_of_another_issuer_does_not_use_a_shared_token_of_the_same_sub() {
    let redis = Redis::start();
    let trust = trust_b();
    let (idp, docs) = fixtures(&["--trust", &trust]);
    let service = jwt(&idp.url, "the-gateway", "docs-api");
    let servers = config(&idp, &docs, &service).replace("${GW_SECRET}", GW_SECRET);
    let on_b = servers.replace(
        &format!("issuer = \"{}\"", idp.url),
        &format!("issuer = \"{ISSUER_B}\""),
    );
    let a = replicas(1, &redis, &servers, "").pop().unwrap();
    let b = replicas(1, &redis, &on_b, "replica_id = \"gw-b\"").pop().unwrap();
    let s = ready(&a, &jwt(&idp.url, "xavier", AUDIENCE)).await;
    assert_eq!(whoami(&s).await["sub"], "xavier");
    let a_tokens = exchanged_seen(&docs, &service).await;
    let s = ready(&b, &jwt(ISSUER_B, "xavier", AUDIENCE)).await;
    assert_eq!(whoami(&s).await["sub"], "xavier");
    assert_eq!(
        exchanges(&idp).await,
        json!({"xavier": 2}),
        "the shared record of A's xavier was used"
    );
    let last = exchanged_seen(&docs, &service).await.pop().unwrap();
    assert!(!a_tokens.contains(&last));
}

/// The Redis lock of an exchange, given back late: its holder's exchange outlived it and
/// another holder took it meanwhile (here the test, as that holder); the first one's
/// release leaves the new holder's lock where it is (compare-and-delete, not `DEL`).
#[tokio::test]
async fn a_late_release_leaves_the_next_holders_lock() {
    let redis = Redis::start();
    let (idp, docs) = fixtures(&["--exchange-delay-ms", "1500"]);
    let servers = shared_config(&idp, &docs);
    let gw = replicas(1, &redis, &servers, "").pop().unwrap();
    let s = ready(&gw, &jwt(&idp.url, "xavier", AUDIENCE)).await;
    let call = tokio::spawn(async move { whoami(&s).await });
    let mut lock = String::new();
    for _ in 0..100 {
        lock = redis
            .cli(&["--scan", "--pattern", "*upstream-token:docs:*:lock"])
            .trim()
            .to_owned();
        if !lock.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!lock.is_empty(), "the exchange took no lock");
    // It "expires" and the next holder takes it.
    redis.cli(&["DEL", &lock]);
    assert_eq!(
        redis.cli(&["SET", &lock, "the-next-holder", "PX", "60000"]).trim(),
        "OK"
    );
    let me = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(me["sub"], "xavier");
    assert_eq!(
        redis.cli(&["GET", &lock]).trim(),
        "the-next-holder",
        "the late holder deleted the next holder's lock"
    );
}

/// Someone who can write to Redis but has no cluster key squats an exchange's lock
/// (`SET` with a value of theirs, no expiry): a call that finds it does not wait for it
/// (15 s, the longest an exchange may take) but exchanges at once, and says so.
#[tokio::test]
async fn a_lock_squatted_without_the_cluster_key_is_not_waited_for() {
    let redis = Redis::start();
    let (idp, docs) = fixtures(&[]);
    let servers = shared_config(&idp, &docs);
    let gws = replicas(2, &redis, &servers, "");
    let xavier = jwt(&idp.url, "xavier", AUDIENCE);
    let on_a = ready(&gws[0], &xavier).await;
    assert_eq!(whoami(&on_a).await["sub"], "xavier");
    let keys = redis.cli(&["--scan", "--pattern", "*upstream-token:docs:*"]);
    let record = keys
        .lines()
        .find(|k| !k.ends_with(":lock"))
        .unwrap_or_else(|| panic!("no shared token: {keys:?}"))
        .to_owned();
    // The shared token gone, its lock squatted: the other replica has neither in memory.
    redis.cli(&["DEL", &record]);
    let lock = format!("{record}:lock");
    assert_eq!(redis.cli(&["SET", &lock, "gw-0"]).trim(), "OK");

    let on_b = ready(&gws[1], &xavier).await;
    let me = tokio::time::timeout(Duration::from_secs(5), whoami(&on_b))
        .await
        .expect("the call waited for a squatted lock");
    assert_eq!(me["sub"], "xavier");
    assert_eq!(exchanges(&idp).await, json!({"xavier": 2}));
    assert!(
        gws[1].logs().contains("not written with the cluster key"),
        "{}",
        gws[1].logs()
    );
}
