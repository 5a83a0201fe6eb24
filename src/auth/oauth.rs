//! `[auth.oauth]`: JWT bearer tokens from one issuer, the gateway as an OAuth 2.1
//! resource server. The signature is checked against the issuer's JWKS (fetched once,
//! cached, fetched again for an unknown `kid` at most every [`REFETCH_EVERY`]), then
//! `iss`, `aud`, `exp` and `nbf`; the configured claim names the client.

use crate::config::OAuth;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// An unknown `kid` makes the JWKS be fetched again, but not more often than this.
pub const REFETCH_EVERY: Duration = Duration::from_secs(30);
/// After a failed fetch (and no keys at all), the next try waits this long.
const RETRY_FAILED_FETCH: Duration = Duration::from_secs(5);
/// Keys older than this are fetched again on the next token (old ones kept on failure).
const MAX_KEY_AGE: Duration = Duration::from_secs(3600);
/// Clock skew allowed on `exp` and `nbf`, in seconds.
const LEEWAY: u64 = 30;
/// How long one JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Signature algorithms accepted on JWTs (never `none`, never HMAC).
const ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// When a JWT that was validated stops being accepted: its `exp` plus the leeway, on the
/// runtime's clock. `None` when it is no JWT with a numeric `exp` (validation requires
/// one). Its signature is not checked again here: call this only on a token
/// [`Jwt::verify`] took. A stream opened with the token ends then ([`crate::front`]).
pub fn valid_until(jwt: &str) -> Option<tokio::time::Instant> {
    let header = jsonwebtoken::decode_header(jwt).ok()?;
    let mut v = Validation::new(header.alg);
    v.insecure_disable_signature_validation();
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    v.required_spec_claims.clear();
    let data = jsonwebtoken::decode::<Map<String, Value>>(jwt, &DecodingKey::from_secret(&[]), &v).ok()?;
    let exp = data
        .claims
        .get("exp")?
        .as_f64()
        .filter(|e| e.is_finite() && *e >= 0.0)?;
    let at = std::time::UNIX_EPOCH.checked_add(Duration::from_secs_f64(exp.min(1e12)))?;
    let at = at.checked_add(Duration::from_secs(LEEWAY))?;
    let left = at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or(Duration::ZERO);
    let now = tokio::time::Instant::now();
    Some(
        now.checked_add(left.min(crate::config::values::MAX_DURATION))
            .unwrap_or(now),
    )
}

/// Three dot-separated parts: worth checking as a JWT.
pub(super) fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3
}

/// One issuer's JWTs: its configuration and its cached keys.
pub(super) struct Jwt {
    pub(super) cfg: OAuth,
    /// What follows a name in the principal of this issuer's identities
    /// ([`super::oauth_principal`] of an empty name).
    pub(super) binding: String,
    http: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    /// Held while fetching, so concurrent unknown `kid`s cause one fetch.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct KeySet {
    keys: Vec<Key>,
    /// When the last fetch was tried, and whether it worked.
    last_try: Option<(Instant, bool)>,
    fetched: Option<Instant>,
}

struct Key {
    kid: Option<String>,
    /// The key's own `alg`, when the JWKS says.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

impl Jwt {
    pub(super) fn new(cfg: OAuth) -> Jwt {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .unwrap_or_default();
        Jwt {
            binding: super::oauth_principal("", &cfg.issuer, &cfg.client_claim),
            cfg,
            http,
            keys: RwLock::new(Arc::new(KeySet::default())),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    fn keys(&self) -> Arc<KeySet> {
        crate::sync::read(&self.keys).clone()
    }

    /// Checks a JWT and returns the client claim's value.
    pub(super) async fn verify(&self, token: &str) -> Result<String, String> {
        // The parser's own messages may quote bytes of the token: say only that it failed.
        let header = jsonwebtoken::decode_header(token).map_err(|_| "malformed JWT".to_owned())?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(format!("algorithm {:?} is not accepted", header.alg));
        }
        let kid = header.kid.as_deref();
        let mut keys = self.keys();
        let stale = match keys.fetched {
            Some(t) => t.elapsed() >= MAX_KEY_AGE,
            None => true,
        };
        if stale || candidates(&keys, kid, header.alg).is_empty() {
            // An unknown key: maybe the issuer rotated its keys.
            self.refresh(!stale).await;
            keys = self.keys();
        }
        let found = candidates(&keys, kid, header.alg);
        if found.is_empty() {
            return Err(match kid {
                Some(k) => format!("no key {k:?} in the issuer's JWKS"),
                None => "no key in the issuer's JWKS fits".to_owned(),
            });
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.cfg.issuer]);
        validation.set_audience(&[&self.cfg.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY;
        let mut last = String::new();
        for key in found {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => {
                    return match data.claims.get(&self.cfg.client_claim) {
                        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                        _ => Err(format!("no string claim {:?} names the client", self.cfg.client_claim)),
                    };
                }
                Err(e) => last = describe(&e),
            }
        }
        Err(last)
    }

    /// Fetches the JWKS unless another task just did, or (with `throttle`) unless the
    /// last fetch is younger than [`REFETCH_EVERY`]. Failures keep the old keys.
    pub(super) async fn refresh(&self, throttle: bool) {
        let before = self.keys().last_try;
        let _one = self.fetching.lock().await;
        let now = self.keys();
        if now.last_try != before {
            return; // someone fetched while we waited
        }
        if let Some((at, ok)) = now.last_try {
            let wait = if ok { REFETCH_EVERY } else { RETRY_FAILED_FETCH };
            if (throttle || !ok) && at.elapsed() < wait {
                return;
            }
        }
        let started = Instant::now();
        let next = match self.fetch().await {
            Ok(keys) => {
                info!(url = %self.cfg.jwks_url, keys = keys.len(), "fetched the issuer's JWKS");
                KeySet {
                    keys,
                    last_try: Some((started, true)),
                    fetched: Some(started),
                }
            }
            Err(e) => {
                warn!(url = %self.cfg.jwks_url, error = %e, "cannot fetch the issuer's JWKS");
                KeySet {
                    keys: now.clone_keys(),
                    last_try: Some((started, false)),
                    fetched: now.fetched,
                }
            }
        };
        *crate::sync::write(&self.keys) = Arc::new(next);
    }

    async fn fetch(&self) -> Result<Vec<Key>, String> {
        let resp = self
            .http
            .get(&self.cfg.jwks_url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let body = resp.bytes().await.map_err(|e| e.without_url().to_string())?;
        parse_jwks(&body)
    }
}

impl KeySet {
    fn clone_keys(&self) -> Vec<Key> {
        self.keys
            .iter()
            .map(|k| Key {
                kid: k.kid.clone(),
                alg: k.alg,
                key: k.key.clone(),
            })
            .collect()
    }
}

/// Keys that may have signed a token with this `kid` (any, when it has none) and `alg`.
fn candidates<'a>(keys: &'a KeySet, kid: Option<&str>, alg: Algorithm) -> Vec<&'a Key> {
    keys.keys
        .iter()
        .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
        .filter(|k| k.alg.is_none() || k.alg == Some(alg))
        .collect()
}

/// The signing keys of a JWKS document; keys it cannot use (encryption keys, symmetric
/// keys, unknown types) are skipped.
fn parse_jwks(body: &[u8]) -> Result<Vec<Key>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut out = Vec::new();
    for v in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(v) else {
            debug!("skipping a JWKS key of an unknown type");
            continue;
        };
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_))
            || matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption))
        {
            continue;
        }
        let alg = match jwk.common.key_algorithm.map(|a| a.to_string().parse::<Algorithm>()) {
            None => None,
            Some(Ok(a)) if ALGORITHMS.contains(&a) => Some(a),
            Some(_) => continue,
        };
        match DecodingKey::from_jwk(&jwk) {
            Ok(key) => out.push(Key {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
            }),
            Err(e) => debug!(error = %e, "skipping an unusable JWKS key"),
        }
    }
    Ok(out)
}

/// A short reason for a failed JWT check.
fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => "token expired".into(),
        K::ImmatureSignature => "token not valid yet (nbf)".into(),
        K::InvalidIssuer => "wrong issuer".into(),
        K::InvalidAudience => "wrong audience".into(),
        K::InvalidSignature => "bad signature".into(),
        K::MissingRequiredClaim(c) => format!("missing claim {c}"),
        K::InvalidAlgorithm => "algorithm does not fit the key".into(),
        // Others (base64, JSON, UTF-8 errors) may quote bytes of the token.
        _ => "malformed JWT".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for c in bytes.chunks(3) {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
            for i in 0..=c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    /// A fresh P-256 key: its encoding key and its JWK.
    fn es256_key(kid: &str) -> (EncodingKey, Value) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let point = pair.public_key().as_ref();
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                         "x": b64(&point[1..33]), "y": b64(&point[33..65])});
        (EncodingKey::from_ec_der(pkcs8.as_ref()), jwk)
    }

    fn jwt_with(keys: Vec<Key>) -> Jwt {
        let jwt = Jwt::new(OAuth {
            issuer: "https://issuer.example".into(),
            audience: "mcp-gateway".into(),
            // Nothing listens there: a refetch fails fast and keeps the keys.
            jwks_url: "http://127.0.0.1:1/jwks".into(),
            client_claim: "sub".into(),
            resource: None,
        });
        let now = Instant::now();
        *jwt.keys.write().unwrap() = Arc::new(KeySet {
            keys,
            last_try: Some((now, true)),
            fetched: Some(now),
        });
        jwt
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    #[tokio::test]
    async fn jwts() {
        let (enc, jwk) = es256_key("k1");
        let (other, _) = es256_key("k1");
        let keys = parse_jwks(
            json!({"keys": [jwk, {"kty": "oct", "k": "c2VjcmV0"}]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(keys.len(), 1, "the symmetric key is skipped");
        let jwt = jwt_with(keys);
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("k1".into());
        let sign_as =
            |header: &Header, claims: Value, key: &EncodingKey| jsonwebtoken::encode(header, &claims, key).unwrap();
        let sign = |claims: Value, key: &EncodingKey| sign_as(&header, claims, key);
        let good =
            json!({"iss": "https://issuer.example", "aud": ["x", "mcp-gateway"], "sub": "alice", "exp": now() + 300});
        assert_eq!(jwt.verify(&sign(good.clone(), &enc)).await.unwrap(), "alice");

        let with = |k: &str, v: Value| {
            let mut c = good.clone();
            c[k] = v;
            c
        };
        let cases = [
            (sign(with("exp", json!(now() - 120)), &enc), "token expired"),
            (sign(with("nbf", json!(now() + 120)), &enc), "token not valid yet (nbf)"),
            (sign(with("aud", json!("other")), &enc), "wrong audience"),
            (sign(with("iss", json!("https://evil.example")), &enc), "wrong issuer"),
            (sign(good.clone(), &other), "bad signature"),
            (
                sign(with("sub", json!(7)), &enc),
                "no string claim \"sub\" names the client",
            ),
        ];
        for (token, want) in cases {
            assert_eq!(jwt.verify(&token).await.unwrap_err(), want);
        }
        // Within the leeway.
        assert!(jwt.verify(&sign(with("exp", json!(now() - 5)), &enc)).await.is_ok());
        let mut h2 = header.clone();
        h2.kid = Some("k2".into());
        let unknown = sign_as(&h2, good.clone(), &enc);
        assert_eq!(
            jwt.verify(&unknown).await.unwrap_err(),
            "no key \"k2\" in the issuer's JWKS"
        );
        let hs = jsonwebtoken::encode(&Header::default(), &good, &EncodingKey::from_secret(b"c2VjcmV0")).unwrap();
        assert!(jwt.verify(&hs).await.unwrap_err().contains("not accepted"));
    }
}
