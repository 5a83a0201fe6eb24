//! The consent endpoints of servers with `auth.oauth` (see `upstream::consent`):
//! `GET /oauth/start?link=…` (the link a client was given: a page that asks for the
//! link's client's token, posted back to `POST /oauth/start`, then a redirect to the
//! authorization server), `GET /oauth/callback` (where the authorization server sends the browser back),
//! and `DELETE /oauth/tokens/{server}` (the caller forgets its own tokens).
//!
//! `/oauth/start` takes exactly one parameter, `link`: the gateway redirects only to the
//! authorization server it discovered, never to a target named in the request (no open
//! redirect). The callback never redirects; it shows a small page.

use super::{checks, reject, Http};
use crate::auth::principal_parts;
use crate::error::code;
use crate::upstream::consent::{self, Started, COOKIE};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Arc;

/// `s` as HTML text or an attribute's value.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn page(status: u16, title: &str, text: &str) -> Response {
    html(
        status,
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head><body><h1>{t}</h1><p>{x}</p></body></html>\n",
            t = esc(title),
            x = esc(text)
        ),
    )
}

/// A page of the consent flow: never cached, never framed, no script, and a form may
/// post only back to the gateway.
fn html(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("default-src 'none'; form-action 'self'; frame-ancestors 'none'"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        ],
        body,
    )
        .into_response()
}

fn query_map(raw: Option<&str>) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for (k, v) in reqwest::Url::parse("http://x/")
        .map(|mut u| {
            u.set_query(raw);
            u.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
    {
        if out.insert(k.clone(), v).is_some() {
            return Err(format!("the parameter {k:?} is given twice"));
        }
    }
    Ok(out)
}

fn servers(http: &Http) -> impl Fn(&str) -> Option<Arc<crate::supervisor::Server>> + '_ {
    move |name| {
        http.gw
            .topology()
            .servers
            .iter()
            .find(|s| &*s.name == name && s.oauth().is_some())
            .cloned()
    }
}

fn no_consent() -> Response {
    page(404, "Not found", "no server of this gateway asks for consent")
}

/// `GET /oauth/start?link=…`: a request that carries the link's client's credential goes
/// on at once; a browser, which carries none, gets [`prove`]'s page.
pub(super) async fn start(State(http): State<Http>, RawQuery(raw): RawQuery, headers: HeaderMap) -> Response {
    let Some(consent) = consent::get() else {
        return no_consent();
    };
    let q = match query_map(raw.as_deref()) {
        Ok(q) => q,
        Err(why) => return page(400, "Bad request", &why),
    };
    if let Some(other) = q.keys().find(|k| k.as_str() != "link") {
        // Nothing a request names is ever redirected to.
        return page(
            400,
            "Bad request",
            &format!("/oauth/start takes only `link`, not {other:?}"),
        );
    }
    let Some(link) = q.get("link") else {
        return page(400, "Bad request", "/oauth/start needs the `link` it was given");
    };
    match headers.get(header::AUTHORIZATION) {
        Some(v) => match http.gw.topology().auth.clone().authenticate(Some(v.as_bytes())).await {
            Ok(identity) => go_on(&http, consent, link, &identity.principal, StatusCode::FOUND).await,
            Err(denied) => page(401, "Not authenticated", &denied.to_string()),
        },
        None => match consent.describe(link).await {
            Ok((principal, server)) => prove(200, link, principal_parts(&principal).0, &server, None),
            Err((status, why)) => page(status, "Consent refused", &why),
        },
    }
}

/// `POST /oauth/start` (the form of [`prove`]'s page): `link`, and the `token` that proves
/// its user is the client the link was made for.
pub(super) async fn prove_and_start(State(http): State<Http>, body: axum::body::Bytes) -> Response {
    let Some(consent) = consent::get() else {
        return no_consent();
    };
    let form = match std::str::from_utf8(&body)
        .map_err(|_| "the form is not UTF-8".to_owned())
        .and_then(|b| query_map(Some(b)))
    {
        Ok(f) => f,
        Err(why) => return page(400, "Bad request", &why),
    };
    if let Some(other) = form.keys().find(|k| !matches!(k.as_str(), "link" | "token")) {
        return page(
            400,
            "Bad request",
            &format!("the form takes only `link` and `token`, not {other:?}"),
        );
    }
    let (Some(link), Some(token)) = (form.get("link"), form.get("token")) else {
        return page(400, "Bad request", "the form needs `link` and `token`");
    };
    let (principal, server) = match consent.describe(link).await {
        Ok(d) => d,
        Err((status, why)) => return page(status, "Consent refused", &why),
    };
    let client = principal_parts(&principal).0;
    let bearer = format!("Bearer {}", token.trim());
    match http
        .gw
        .topology()
        .auth
        .clone()
        .authenticate(Some(bearer.as_bytes()))
        .await
    {
        // The principal, not the name: a token of the same name from another issuer is
        // not this client's.
        Ok(identity) if identity.principal == principal => {
            go_on(&http, consent, link, &identity.principal, StatusCode::SEE_OTHER).await
        }
        Ok(_) | Err(_) => {
            tracing::warn!(%server, "a consent link's page was given a token that is not its client's");
            prove(401, link, client, &server, Some("That is not this client's token."))
        }
    }
}

/// The page a browser gets for a link: whom the link was made for and what continuing
/// does, and a form that takes that client's token. Without it, a link forwarded to
/// someone else (phishing) would bind their account at the server to the link's client
/// (the MCP spec's URL elicitation: the user who completes the flow must be the one who
/// started it).
fn prove(status: u16, link: &str, client: &str, server: &str, error: Option<&str>) -> Response {
    let error = error.map_or_else(String::new, |e| format!("<p><strong>{}</strong></p>", esc(e)));
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Authorize server '{server}' for {client}</title></head><body>\
<h1>Authorize server '{server}' for {client}</h1>\
<p>This link was made for the gateway client <strong>{client}</strong>. Continuing lets {client}'s calls to '{server}' use the account you sign in with at the next page.</p>\
<p><strong>If you are not {client}, or did not ask for this just now, close this page.</strong></p>\
{error}<form method=\"post\" action=\"start\">\
<input type=\"hidden\" name=\"link\" value=\"{link}\">\
<label>{client}'s gateway token (the Bearer token your MCP client sends to the gateway): <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> \
<button type=\"submit\">Continue</button></form></body></html>\n",
        server = esc(server),
        client = esc(client),
        link = esc(link),
    );
    html(status, body)
}

/// Uses the link for `client` (a principal): the redirect to the authorization server (`status`: 302,
/// or 303 after the form's POST), with the cookie that binds the flow to this browser.
async fn go_on(http: &Http, consent: &consent::Consent, link: &str, client: &str, status: StatusCode) -> Response {
    let https = consent.public_is_https();
    match consent.start(link, client, &servers(http)).await {
        Started::Redirect { location, cookie } => {
            let Ok(loc) = HeaderValue::from_str(&location) else {
                return page(502, "Bad gateway", "the authorization URL is not a valid header value");
            };
            let secure = if https { "; Secure" } else { "" };
            let cookie = format!(
                "{COOKIE}={cookie}; Path=/oauth/callback; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
                consent::LINK_LIFETIME.as_secs()
            );
            let Ok(cookie) = HeaderValue::from_str(&cookie) else {
                return page(500, "Error", "cannot set the cookie");
            };
            (
                status,
                [
                    (header::LOCATION, loc),
                    (header::SET_COOKIE, cookie),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
                    (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
                ],
            )
                .into_response()
        }
        Started::Refused { status, why } => page(status, "Consent refused", &why),
    }
}

/// The value of our cookie in a `Cookie` header.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

/// `GET /oauth/callback?code=…&state=…`.
pub(super) async fn callback(State(http): State<Http>, RawQuery(raw): RawQuery, headers: HeaderMap) -> Response {
    let Some(consent) = consent::get() else {
        return no_consent();
    };
    let q = match query_map(raw.as_deref()) {
        Ok(q) => q,
        Err(why) => return page(400, "Bad request", &why),
    };
    match consent.callback(&q, cookie(&headers).as_deref(), &servers(&http)).await {
        Ok(server) => page(
            200,
            "Authorized",
            &format!("The gateway may now use server '{server}' for you. You can close this page."),
        ),
        Err((status, why)) => page(status, "Consent failed", &why),
    }
}

/// `DELETE /oauth/tokens/{server}`: the caller's own tokens, authenticated as on the MCP
/// endpoint.
pub(super) async fn revoke(State(http): State<Http>, Path(server): Path<String>, headers: HeaderMap) -> Response {
    let identity = match checks::identify(&http, &headers, b"").await {
        Ok(Some(i)) => i,
        Ok(None) => {
            return reject(
                StatusCode::UNAUTHORIZED,
                code::INVALID_REQUEST,
                "tokens belong to an authenticated caller: configure [clients.*] or [auth.oauth]",
            )
            .into_response()
        }
        Err(resp) => return resp,
    };
    let Some(consent) = consent::get() else {
        return no_consent();
    };
    let topo = http.gw.topology();
    let Some(s) = topo.servers.iter().find(|s| *s.name == *server) else {
        return reject(
            StatusCode::NOT_FOUND,
            code::INVALID_PARAMS,
            format!("no server is named {server:?}"),
        )
        .into_response();
    };
    if s.oauth().is_none() {
        return reject(
            StatusCode::BAD_REQUEST,
            code::INVALID_PARAMS,
            format!("server '{server}' has no auth.oauth: there are no tokens of yours for it"),
        )
        .into_response();
    }
    // Its own tokens, and for an OAuth caller those an earlier version kept under its
    // bare name (which no caller of that name from an issuer uses any more).
    let mut principals = vec![identity.principal.as_str()];
    if identity.principal != identity.name {
        principals.push(&identity.name);
    }
    match consent.revoke(Some(s), &server, &principals).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => reject(
            StatusCode::NOT_FOUND,
            code::INVALID_PARAMS,
            format!("{} has no tokens for server '{server}'", identity.name),
        )
        .into_response(),
        Err(e) => reject(StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL_ERROR, e).into_response(),
    }
}
