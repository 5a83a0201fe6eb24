//! Authentication and per-client allowlists, end to end: the real binary, real mock
//! children, static tokens, OAuth JWTs checked against a JWKS this test serves on
//! 127.0.0.1:0 (an RS256 key from tests/fixtures/ and a P-256 key made per run), and
//! `stdio --client`.

use crate::common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const ALICE: &str = "alice-token-7f3a9c1e5b";
const BOB: &str = "bob-token-0d2e4f6a8c";
pub(crate) const ISSUER: &str = "https://issuer.test";
pub(crate) const AUDIENCE: &str = "mcp-gateway";

fn sha256_hex(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Two mock servers (`calc`, `docs`) and clients alice (token from the environment,
/// calc only, minus calc__crash), bob (token_sha256, everything), plus `extra` TOML.
fn config(extra: &str) -> String {
    let (n1, n2) = (unique("auth-calc"), unique("auth-docs"));
    format!(
        "{}{}\
         [clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\nallow = [\"calc__*\", \"mock://{n1}/*\"]\ndeny = [\"calc__crash\", \"calc__env\"]\n\n\
         [clients.bob]\ntoken_sha256 = \"{}\"\n\n{extra}",
        server("calc", &n1, &[], ""),
        server("docs", &n2, &[], ""),
        sha256_hex(BOB),
    )
}

fn start(cfg: &str) -> Gateway {
    Gateway::start_with_env(cfg, &[("ALICE_TOKEN", ALICE)])
}

/// A POST to the MCP endpoint with an optional bearer token and session.
async fn post(gw: &Gateway, token: Option<&str>, session: Option<&str>, body: Value) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&body);
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    if let Some(s) = session {
        r = r.header("mcp-session-id", s);
    }
    r.send().await.unwrap()
}

fn initialize_body() -> Value {
    json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"1"}}})
}

/// An initialized session as `token`.
struct As<'a> {
    gw: &'a Gateway,
    token: String,
    sid: String,
}

impl<'a> As<'a> {
    async fn open(gw: &'a Gateway, token: &str) -> As<'a> {
        let r = post(gw, Some(token), None, initialize_body()).await;
        assert_eq!(r.status(), 200, "initialize as {token:.6}…");
        let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let s = As {
            gw,
            token: token.to_owned(),
            sid,
        };
        let r = post(
            gw,
            Some(token),
            Some(&s.sid),
            json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        )
        .await;
        assert_eq!(r.status(), 202);
        s
    }

    async fn request(&self, method: &str, params: Value) -> Value {
        let r = post(
            self.gw,
            Some(&self.token),
            Some(&self.sid),
            json!({"jsonrpc":"2.0","id":1,"method":method,"params":params}),
        )
        .await;
        assert_eq!(r.status(), 200, "{method}");
        read_messages(r).await.pop().unwrap()
    }

    async fn names(&self, method: &str, key: &str, field: &str) -> Vec<String> {
        let r = self.request(method, json!({})).await;
        r["result"][key]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|t| t[field].as_str().unwrap().to_owned())
            .collect()
    }

    async fn call(&self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
            .await
    }
}

async fn assert_401(r: reqwest::Response, invalid: bool) -> (String, Value) {
    assert_eq!(r.status(), 401);
    let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(challenge.starts_with("Bearer realm=\"mcp-gateway\""), "{challenge}");
    assert_eq!(challenge.contains("error=\"invalid_token\""), invalid, "{challenge}");
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert!(body["error"]["code"].is_i64(), "{body}");
    (challenge, body)
}

#[tokio::test]
async fn bearer_tokens_are_required_and_checked() {
    let gw = start(&config(""));
    // No token: 401 with a challenge and a JSON-RPC error echoing the id.
    let (challenge, body) = assert_401(post(&gw, None, None, initialize_body()).await, false).await;
    assert_eq!(challenge, "Bearer realm=\"mcp-gateway\"");
    assert_eq!(body["id"], 0, "{body}");
    for wrong in ["nope", "alice-token", &format!("{ALICE}x"), &sha256_hex(BOB)] {
        assert_401(post(&gw, Some(wrong), None, initialize_body()).await, true).await;
    }
    // Not a Bearer credential.
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("authorization", format!("Basic {ALICE}"))
        .json(&initialize_body())
        .send()
        .await
        .unwrap();
    assert_401(r, true).await;
    // GET and DELETE on the endpoint need it too.
    let http = reqwest::Client::new();
    let r = http
        .get(&gw.url)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(http.delete(&gw.url).send().await.unwrap().status(), 401);

    // The right tokens: `token` (from the environment) and `token_sha256`.
    let alice = As::open(&gw, ALICE).await;
    assert_eq!(text(&alice.call("calc__add", json!({"a": 2, "b": 3})).await), "5");
    let bob = As::open(&gw, BOB).await;
    assert_eq!(text(&bob.call("docs__echo", json!({"text": "hi"})).await), "hi");
    // A valid session without the token is still refused.
    let r = post(
        &gw,
        None,
        Some(&alice.sid),
        json!({"jsonrpc":"2.0","id":5,"method":"ping"}),
    )
    .await;
    assert_eq!(assert_401(r, false).await.1["id"], 5);

    // Health and metrics stay open, and so does the console's static page (and none
    // shows a token); /status needs an admin's token (tests/it/console.rs).
    for path in ["/healthz", "/readyz", "/metrics", "/"] {
        let r = reqwest::get(format!("{}{path}", gw.base)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let body = r.text().await.unwrap();
        assert!(!body.contains(ALICE) && !body.contains(&sha256_hex(BOB)), "{path}");
    }
    let r = reqwest::get(format!("{}/status", gw.base)).await.unwrap();
    assert_eq!(r.status(), 401);
    // No OAuth: no metadata document.
    let r = reqwest::get(format!("{}/.well-known/oauth-protected-resource", gw.base))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn allowlists_filter_lists_and_calls() {
    let gw = start(&config(""));
    let alice = As::open(&gw, ALICE).await;
    let bob = As::open(&gw, BOB).await;

    // The instructions of a server the allowlist hides entirely are not shown either.
    for (token, docs_shown) in [(ALICE, false), (BOB, true)] {
        let init: Value = post(&gw, Some(token), None, initialize_body())
            .await
            .json()
            .await
            .unwrap();
        let text = init["result"]["instructions"].as_str().unwrap_or_default();
        assert!(text.contains("## calc"), "{init}");
        assert_eq!(text.contains("## docs"), docs_shown, "{init}");
    }

    let tools = alice.names("tools/list", "tools", "name").await;
    assert!(tools.iter().all(|t| t.starts_with("calc__")), "{tools:?}");
    assert!(tools.contains(&"calc__add".to_owned()), "{tools:?}");
    // deny wins over allow.
    assert!(!tools.contains(&"calc__crash".to_owned()) && !tools.contains(&"calc__env".to_owned()));
    let all = bob.names("tools/list", "tools", "name").await;
    assert!(all.contains(&"docs__echo".to_owned()) && all.contains(&"calc__crash".to_owned()));

    let prompts = alice.names("prompts/list", "prompts", "name").await;
    assert_eq!(prompts, ["calc__greet"]);
    let resources = alice.names("resources/list", "resources", "uri").await;
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert!(resources[0].ends_with("/readme") && resources[0].contains("auth-calc"));
    let templates = alice
        .names("resources/templates/list", "resourceTemplates", "uriTemplate")
        .await;
    assert_eq!(templates.len(), 1, "{templates:?}");
    assert_eq!(bob.names("resources/list", "resources", "uri").await.len(), 2);

    // A hidden tool is reported exactly like one that does not exist.
    let unknown = alice.call("calc__no_such_tool", json!({})).await;
    for hidden in ["docs__echo", "calc__crash"] {
        let r = alice.call(hidden, json!({"text": "x"})).await;
        let e = error_of(&r);
        assert_eq!(e["code"], error_of(&unknown)["code"], "{r}");
        assert_eq!(e["message"], format!("unknown tool: {hidden}"), "{r}");
        assert_eq!(e["data"], json!({"tool": hidden}), "{r}");
    }
    let r = alice
        .request(
            "prompts/get",
            json!({"name": "docs__greet", "arguments": {"name": "x"}}),
        )
        .await;
    assert_eq!(error_of(&r)["message"], "unknown prompt: docs__greet", "{r}");
    let docs_readme = bob
        .names("resources/list", "resources", "uri")
        .await
        .into_iter()
        .find(|u| u.contains("auth-docs"))
        .unwrap();
    let r = alice.request("resources/read", json!({"uri": docs_readme})).await;
    assert_eq!(
        error_of(&r)["message"],
        format!("unknown resource: {docs_readme}"),
        "{r}"
    );
    let r = bob.request("resources/read", json!({"uri": docs_readme})).await;
    assert!(r.get("result").is_some(), "{r}");
    let r = alice.request("resources/read", json!({"uri": resources[0]})).await;
    assert!(r.get("result").is_some(), "{r}");
    let r = alice
        .request(
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "docs__greet"}, "argument": {"name": "name", "value": "a"}}),
        )
        .await;
    assert_eq!(error_of(&r)["message"], "unknown prompt: docs__greet", "{r}");
    assert_eq!(
        error_of(&r)["data"],
        json!({"prompt": "docs__greet"}),
        "named as prompts/get names it: {r}"
    );
    // Bob is not restricted.
    assert_eq!(text(&bob.call("docs__echo", json!({"text": "ok"})).await), "ok");
}

#[tokio::test]
async fn sessions_belong_to_their_identity() {
    let gw = start(&config(""));
    let alice = As::open(&gw, ALICE).await;
    // Bob presenting alice's session id: not found, for every method.
    let r = post(
        &gw,
        Some(BOB),
        Some(&alice.sid),
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let http = reqwest::Client::new();
    let r = http
        .get(&gw.url)
        .header("accept", "text/event-stream")
        .header("authorization", format!("Bearer {BOB}"))
        .header("mcp-session-id", &alice.sid)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .delete(&gw.url)
        .header("authorization", format!("Bearer {BOB}"))
        .header("mcp-session-id", &alice.sid)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Still alice's.
    assert_eq!(text(&alice.call("calc__add", json!({"a": 1, "b": 1})).await), "2");
}

#[tokio::test]
async fn rate_limits_key_by_client_name() {
    let cfg =
        config("[rate_limits]\nper_client = \"6/m\"\n").replace("deny = [", "rate_limit = \"100/m burst 4\"\ndeny = [");
    let gw = start(&cfg);
    // alice's own limit: 4 requests, two initializes (they count too) and two calls over
    // two sessions (the limit is hers, not a session's).
    let (a1, a2) = (As::open(&gw, ALICE).await, As::open(&gw, ALICE).await);
    assert!(a1
        .call("calc__add", json!({"a": 1, "b": 1}))
        .await
        .get("result")
        .is_some());
    assert!(a2
        .call("calc__add", json!({"a": 1, "b": 1}))
        .await
        .get("result")
        .is_some());
    let r = a1.request("ping", json!({})).await;
    assert_eq!(error_of(&r)["code"], -32029, "{r}");
    assert!(
        error_of(&r)["message"].as_str().unwrap().contains("client 'alice'"),
        "{r}"
    );
    // per_client keys by name: bob's three sessions (three initializes) and three pings
    // share 6/m.
    let b = [
        As::open(&gw, BOB).await,
        As::open(&gw, BOB).await,
        As::open(&gw, BOB).await,
    ];
    for s in &b {
        assert!(s.request("ping", json!({})).await.get("result").is_some());
    }
    let r = b[0].request("ping", json!({})).await;
    assert_eq!(error_of(&r)["code"], -32029, "{r}");
    assert!(error_of(&r)["message"].as_str().unwrap().contains("per_client"), "{r}");
}

// ---------------------------------------------------------------- OAuth

fn b64url(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=c.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn b64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' | b'-' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| c.is_ascii_alphanumeric() || b"+/-_".contains(c))
        .collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (u32::from(val(c)) << (18 - 6 * i)));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// The fixed RS256 test key of tests/fixtures/jwt_rs256_key.pem (kid `rsa-test`), the
/// key tests/fixtures/oauth_as.py signs with.
pub(crate) fn rsa_test_key() -> EncodingKey {
    let pem = std::fs::read_to_string(repo().join("tests/fixtures/jwt_rs256_key.pem")).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    EncodingKey::from_rsa_der(&b64_decode(&body))
}

pub(crate) struct Keys {
    rsa: EncodingKey,
    pub(crate) ec: EncodingKey,
    pub(crate) jwks: Value,
}

/// The fixed RS256 test key (kid `rsa-test`) and a P-256 key made now (kid `ec-1`).
pub(crate) fn keys() -> Keys {
    let rsa = rsa_test_key();
    let rsa_jwk: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("tests/fixtures/jwt_rs256_jwk.json")).unwrap())
            .unwrap();
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let ec_jwk = json!({"kty": "EC", "crv": "P-256", "kid": "ec-1", "use": "sig", "alg": "ES256",
                        "x": b64url(&point[1..33]), "y": b64url(&point[33..65])});
    Keys {
        rsa,
        ec: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwks: json!({"keys": [rsa_jwk, ec_jwk]}),
    }
}

/// Serves `jwks` at http://127.0.0.1:PORT/jwks.json; returns the URL and a fetch counter.
pub(crate) async fn serve_jwks(jwks: Value) -> (String, Arc<AtomicUsize>) {
    let fetches = Arc::new(AtomicUsize::new(0));
    let count = fetches.clone();
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let jwks = jwks.clone();
            count.fetch_add(1, Ordering::SeqCst);
            async move { ([("content-type", "application/json")], jwks.to_string()) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/jwks.json"), fetches)
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

pub(crate) fn sign(alg: Algorithm, kid: &str, key: &EncodingKey, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

pub(crate) fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now() + 600, "iat": now()})
}

fn oauth_toml(jwks_url: &str) -> String {
    format!(
        "[clients.carol]\nallow = [\"calc__*\"]\n\n\
         [auth.oauth]\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\njwks_url = \"{jwks_url}\"\n"
    )
}

#[tokio::test]
async fn oauth_jwts() {
    let k = keys();
    let (jwks_url, fetches) = serve_jwks(k.jwks.clone()).await;
    let gw = start(&config(&oauth_toml(&jwks_url)));

    // The challenge points at the metadata, which names the issuer.
    let (challenge, _) = assert_401(post(&gw, None, None, initialize_body()).await, false).await;
    let meta_url = format!("{}/.well-known/oauth-protected-resource", gw.base);
    assert_eq!(
        challenge,
        format!("Bearer realm=\"mcp-gateway\", resource_metadata=\"{meta_url}\"")
    );
    let meta: Value = reqwest::get(&meta_url).await.unwrap().json().await.unwrap();
    assert_eq!(meta["resource"], gw.url, "{meta}");
    assert_eq!(meta["authorization_servers"], json!([ISSUER]), "{meta}");
    assert_eq!(meta["bearer_methods_supported"], json!(["header"]), "{meta}");
    // The path-suffixed form (RFC 9728 section 3.1) too.
    let suffixed: Value = reqwest::get(format!("{meta_url}/mcp"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(suffixed, meta);

    // carol has a [clients.carol] table (no token): its allowlist applies.
    let carol = As::open(&gw, &sign(Algorithm::ES256, "ec-1", &k.ec, &claims("carol"))).await;
    let tools = carol.names("tools/list", "tools", "name").await;
    assert!(
        !tools.is_empty() && tools.iter().all(|t| t.starts_with("calc__")),
        "{tools:?}"
    );
    let r = carol.call("docs__echo", json!({"text": "x"})).await;
    assert_eq!(error_of(&r)["message"], "unknown tool: docs__echo");
    // dave has no table: full access. RS256 with the fixture key.
    let dave = As::open(&gw, &sign(Algorithm::RS256, "rsa-test", &k.rsa, &claims("dave"))).await;
    assert_eq!(text(&dave.call("docs__echo", json!({"text": "hi"})).await), "hi");
    // Sessions are bound to the identity, not the token: carol with a new JWT is carol,
    // dave with carol's session is not.
    let fresh = sign(Algorithm::RS256, "rsa-test", &k.rsa, &claims("carol"));
    let r = post(
        &gw,
        Some(&fresh),
        Some(&carol.sid),
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let r = post(
        &gw,
        Some(&dave.token),
        Some(&carol.sid),
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    // Static tokens still work beside OAuth.
    As::open(&gw, ALICE).await;

    let with = |key: &str, v: Value| {
        let mut c = claims("carol");
        c[key] = v;
        c
    };
    let other_ec = {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        EncodingKey::from_ec_der(pkcs8.as_ref())
    };
    let bad = [
        (
            "expired",
            sign(Algorithm::ES256, "ec-1", &k.ec, &with("exp", json!(now() - 600))),
        ),
        (
            "not yet valid",
            sign(Algorithm::ES256, "ec-1", &k.ec, &with("nbf", json!(now() + 600))),
        ),
        (
            "wrong audience",
            sign(Algorithm::ES256, "ec-1", &k.ec, &with("aud", json!("other"))),
        ),
        (
            "wrong issuer",
            sign(
                Algorithm::ES256,
                "ec-1",
                &k.ec,
                &with("iss", json!("https://evil.test")),
            ),
        ),
        (
            "bad signature",
            sign(Algorithm::ES256, "ec-1", &other_ec, &claims("carol")),
        ),
        ("unknown kid", sign(Algorithm::ES256, "ec-2", &k.ec, &claims("carol"))),
        (
            "HS256 with the RSA modulus as secret",
            jsonwebtoken::encode(
                &Header::new(Algorithm::HS256),
                &claims("carol"),
                &EncodingKey::from_secret(k.jwks["keys"][0]["n"].as_str().unwrap().as_bytes()),
            )
            .unwrap(),
        ),
    ];
    for (what, token) in &bad {
        let r = post(&gw, Some(token), None, initialize_body()).await;
        assert_eq!(r.status(), 401, "{what}");
        let (challenge, _) = assert_401(r, true).await;
        assert!(challenge.contains("resource_metadata="), "{what}: {challenge}");
    }
    // Unknown kids refetch the JWKS, but at most once per 30 s.
    assert!(
        fetches.load(Ordering::SeqCst) <= 2,
        "{}",
        fetches.load(Ordering::SeqCst)
    );
    let logs = gw.logs();
    for (_, token) in &bad {
        assert!(!logs.contains(token.as_str()));
    }
}

/// A deny glob holds for a tool whatever name it is public under: another server that
/// lists a tool of the denied name first (here an override; a hostile server could list
/// it outright) pushes the denied tool out to a hashed name, which the deny still hides
/// from the lists, from calls and from tool search.
#[tokio::test]
async fn a_denied_tool_renamed_by_a_collision_stays_denied() {
    let (n0, n1) = (unique("auth-shadow"), unique("auth-calc"));
    let cfg = format!(
        "{}\n[servers.shadow.overrides.echo]\nname = \"calc__crash\"\n\n{}\
         [clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\nallow = [\"calc__*\", \"gateway__*\"]\ndeny = [\"calc__crash\"]\n\n\
         [clients.bob]\ntoken_sha256 = \"{}\"\n",
        server("shadow", &n0, &[], "prefix = \"\""),
        server("calc", &n1, &[], ""),
        sha256_hex(BOB),
    );
    let gw = start(&cfg);
    let bob = As::open(&gw, BOB).await;
    let all = bob.names("tools/list", "tools", "name").await;
    let renamed = all
        .iter()
        .find(|n| n.starts_with("calc__crash_"))
        .unwrap_or_else(|| panic!("calc's crash is renamed by the collision: {all:?}"))
        .clone();
    let alice = As::open(&gw, ALICE).await;
    let seen = alice.names("tools/list", "tools", "name").await;
    assert!(seen.contains(&"calc__add".to_owned()), "{seen:?}");
    assert!(
        !seen.iter().any(|n| n.starts_with("calc__crash")),
        "a denied tool is listed under another name: {seen:?}"
    );
    let r = alice.call(&renamed, json!({})).await;
    assert_eq!(error_of(&r)["message"], format!("unknown tool: {renamed}"), "{r}");
}

/// The GET stream of a session opened with `token`.
async fn get_stream_as(gw: &Gateway, token: &str) -> Messages {
    Session::open_as(&gw.url, token).await.get_stream().await
}

/// A 2026-07-28 `subscriptions/listen` stream opened with `token`.
async fn listen_as(gw: &Gateway, token: &str) -> Messages {
    let mut params = json!({"notifications": {"toolsListChanged": true}});
    params["_meta"] = stateless_meta("jwt-listen");
    let r = reqwest::Client::new()
        .post(&gw.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .header("authorization", format!("Bearer {token}"))
        .json(&json!({"jsonrpc": "2.0", "id": "l-1", "method": "subscriptions/listen", "params": params}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "listen");
    Messages::new(r)
}

/// Reads `m` until it ends, for at most `within`; every message it carried.
async fn until_ended(m: &mut Messages, within: Duration) -> Option<Vec<Value>> {
    let deadline = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    while let Some(v) = m
        .next(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await
    {
        got.push(v);
    }
    m.ended().then_some(got)
}

/// What a stream opened with a JWT carries never outlives the JWT: the GET stream and a
/// 2026-07-28 listen stream end when it expires (its `exp` plus the 30 s leeway), the
/// listen stream with its response, so the client opens them again with the token it
/// has now. A stream opened with a JWT that lives on stays open.
#[tokio::test]
async fn streams_opened_with_a_jwt_end_when_it_expires() {
    let k = keys();
    let (jwks_url, _) = serve_jwks(k.jwks.clone()).await;
    let gw = start(&config(&oauth_toml(&jwks_url)));
    let long = sign(Algorithm::RS256, "rsa-test", &k.rsa, &claims("dave"));
    let mut lasting = get_stream_as(&gw, &long).await;
    // Expired 25 s ago: still taken (the leeway is 30 s), for about 5 s more.
    let mut c = claims("dave");
    c["exp"] = json!(now() - 25);
    let short = sign(Algorithm::RS256, "rsa-test", &k.rsa, &c);
    let mut get = get_stream_as(&gw, &short).await;
    let mut listen = listen_as(&gw, &short).await;
    let ack = listen.next(Duration::from_secs(5)).await.expect("acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    let carried = until_ended(&mut get, Duration::from_secs(20))
        .await
        .expect("the GET stream ends when its JWT expires");
    assert!(carried.is_empty(), "{carried:?}");
    let carried = until_ended(&mut listen, Duration::from_secs(20))
        .await
        .expect("the listen stream ends when its JWT expires");
    assert_eq!(carried.len(), 1, "{carried:?}");
    assert_eq!(carried[0]["id"], "l-1", "ended with its response: {carried:?}");
    assert!(carried[0]["result"].is_object(), "{carried:?}");
    // The other stream is still open.
    assert!(lasting.next(Duration::from_millis(300)).await.is_none());
    assert!(!lasting.ended(), "a stream whose JWT lives on stays open");
}

#[tokio::test]
async fn oauth_resource_url_from_config() {
    let k = keys();
    let (jwks_url, _) = serve_jwks(k.jwks.clone()).await;
    let toml = oauth_toml(&jwks_url) + "resource = \"https://gw.example/team/mcp\"\n";
    let gw = start(&config(&toml));
    let (challenge, _) = assert_401(post(&gw, None, None, initialize_body()).await, false).await;
    assert!(
        challenge.contains("resource_metadata=\"https://gw.example/.well-known/oauth-protected-resource\""),
        "{challenge}"
    );
    let meta: Value = reqwest::get(format!("{}/.well-known/oauth-protected-resource", gw.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["resource"], "https://gw.example/team/mcp");
}

// ---------------------------------------------------------------- stdio, check, logs

#[test]
fn stdio_acts_as_the_named_client() {
    let cfg = config("");
    let mut gw = StdioGateway::start(&cfg, &[("ALICE_TOKEN", ALICE), ("MCP_GATEWAY_CLIENT", "alice")]);
    gw.initialize();
    let (_, r) = gw.request(json!(1), "tools/list", json!({}));
    let names: Vec<&str> = r["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"calc__add"), "{names:?}");
    assert!(
        names.iter().all(|n| n.starts_with("calc__") && *n != "calc__crash"),
        "{names:?}"
    );
    let (_, r) = gw.request(
        json!(2),
        "tools/call",
        json!({"name": "docs__echo", "arguments": {"text": "x"}}),
    );
    assert_eq!(error_of(&r)["message"], "unknown tool: docs__echo", "{r}");
    gw.close_stdin();
    assert!(gw.wait_exit(Duration::from_secs(30)).is_some());

    // Unknown name, and no name while clients are configured: exit 64, clearly.
    for (env, want) in [
        (vec![("MCP_GATEWAY_CLIENT", "mallory")], "no [clients.mallory]"),
        (vec![], "--client"),
    ] {
        let mut env = env;
        env.push(("ALICE_TOKEN", ALICE));
        let mut gw = StdioGateway::start(&cfg, &env);
        let status = gw.wait_exit(Duration::from_secs(30)).expect("exits");
        assert_eq!(status.code(), Some(64), "{}", gw.logs());
        // The stderr reader may lag the exit a little.
        assert!(
            gw.wait_log_blocking(want, Duration::from_secs(5)),
            "{want} not in {}",
            gw.logs()
        );
    }
}

#[tokio::test]
async fn tokens_never_reach_logs_or_check() {
    let k = keys();
    let (jwks_url, _) = serve_jwks(k.jwks.clone()).await;
    let cfg = config(&oauth_toml(&jwks_url));
    let gw = Gateway::start_with_env(&cfg, &[("ALICE_TOKEN", ALICE), ("MCP_GATEWAY_LOG", "trace")]);
    let jwt = sign(Algorithm::ES256, "ec-1", &k.ec, &claims("carol"));
    let expired = sign(
        Algorithm::ES256,
        "ec-1",
        &k.ec,
        &json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": 1}),
    );
    for t in [ALICE, BOB, &jwt] {
        let s = As::open(&gw, t).await;
        s.call("calc__add", json!({"a": 1, "b": 2})).await;
    }
    for t in ["wrong-token-5e6f", &expired, &format!("{ALICE}-not")] {
        assert_eq!(post(&gw, Some(t), None, initialize_body()).await.status(), 401);
    }
    assert!(gw.wait_log("TRACE", Duration::from_secs(5)).await || gw.logs().contains("trace"));
    let logs = gw.logs();
    for secret in [
        ALICE,
        BOB,
        &sha256_hex(ALICE),
        jwt.as_str(),
        expired.as_str(),
        "wrong-token-5e6f",
    ] {
        assert!(!logs.contains(secret), "a credential is in the log");
    }
    // A JWT's signature part alone must not show either.
    assert!(!logs.contains(jwt.rsplit('.').next().unwrap()));

    let (run, _dir) = check(&cfg, &[], &[("ALICE_TOKEN", ALICE)]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let out = format!("{}{}", run.stdout, run.stderr);
    assert!(!out.contains(ALICE) && !out.contains(&sha256_hex(BOB)), "{out}");
    // A missing token variable is a located config error, without any value.
    check_refuses(&cfg, "clients.alice.token: environment variable ALICE_TOKEN is not set");
}

#[tokio::test]
async fn a_reload_applies_new_client_tables() {
    let cfg = config("");
    let gw = start(&cfg);
    let alice = As::open(&gw, ALICE).await;
    let bob = As::open(&gw, BOB).await;
    assert!(alice
        .names("tools/list", "tools", "name")
        .await
        .iter()
        .all(|t| t.starts_with("calc__")));

    // alice now sees docs only; bob is gone; dave is new.
    let edited = cfg
        .replace("allow = [\"calc__*\"", "allow = [\"docs__*\"")
        .replace(&format!("[clients.bob]\ntoken_sha256 = \"{}\"\n", sha256_hex(BOB)), "")
        + "[clients.dave]\ntoken = \"dave-token-93b1\"\n";
    assert_ne!(edited, cfg);
    std::fs::write(gw.config_path(), edited).unwrap();
    assert!(
        gw.wait_log("reload done", Duration::from_secs(20)).await,
        "{}",
        gw.logs()
    );

    // The same session, the new policy.
    let tools = alice.names("tools/list", "tools", "name").await;
    assert!(
        !tools.is_empty() && tools.iter().all(|t| t.starts_with("docs__")),
        "{tools:?}"
    );
    let r = alice.call("calc__add", json!({"a": 1, "b": 1})).await;
    assert_eq!(error_of(&r)["message"], "unknown tool: calc__add", "{r}");
    // A removed client's token no longer works, even on its open session.
    let r = post(
        &gw,
        Some(BOB),
        Some(&bob.sid),
        json!({"jsonrpc":"2.0","id":1,"method":"ping"}),
    )
    .await;
    assert_401(r, true).await;
    let dave = As::open(&gw, "dave-token-93b1").await;
    assert_eq!(text(&dave.call("docs__echo", json!({"text": "new"})).await), "new");
}
