//! What in a client config is a credential: by the name it is given (an `env` or `headers`
//! key, a flag, a `NAME=VALUE`, a JSON member, a URL query parameter), by where it is (a
//! URL's password, a UUID in a URL's path, after `Bearer`), and by its shape (a known
//! token prefix, a JWT, JSON in base64, a random-looking run). Used by `import` so that
//! no secret is written out.

use std::ops::Range;

/// Last words of a name that make its value a credential (`GITHUB_TOKEN`, `DB_PASS`,
/// `Authorization`, `SENTRY_DSN`, `X-Amz-Signature`).
const SECRET_WORDS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "pass",
    "pwd",
    "pat",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "cookie",
    "dsn",
    "sig",
    "signature",
    "bearer",
    "jwt",
    "apikey",
];
/// A last word glued to what it is of (`PGPASSWORD`, `githubtoken`).
const SECRET_ENDINGS: &[&str] = &["password", "passwd", "token", "secret", "apikey", "credential"];
/// `…_KEY` is a credential unless the word before it says another kind of key
/// (`SORT_KEY`, `PUBLIC_KEY`).
const NOT_SECRET_KEYS: &[&str] = &[
    "sort",
    "primary",
    "partition",
    "foreign",
    "cache",
    "hash",
    "routing",
    "shard",
    "group",
    "public",
    "lookup",
    "index",
    "map",
    "row",
    "column",
    "field",
    "object",
    "unique",
    "composite",
    "hot",
    "short",
    "idempotency",
    "dedup",
    "order",
    "range",
];
/// Words that make a name a quantity or a setting, not a credential (`MAX_TOKENS`).
const SETTING_WORDS: &[&str] = &["max", "min", "limit", "count", "num", "number", "size", "length"];
/// Values that are a setting even under a credential's name (`ENABLE_AUTH=false`,
/// `--auth oauth`).
const SETTING_VALUES: &[&str] = &[
    "true", "false", "yes", "no", "on", "off", "none", "null", "enabled", "disabled", "required", "optional", "auto",
    "oauth", "oauth2", "basic", "bearer", "token", "apikey", "api_key", "header", "query", "jwt", "env",
];

/// The words of a name: split at anything but letters and digits, and where a lower-case
/// letter or digit meets an upper-case one (`githubPat`), lower-cased.
pub fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            prev_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && prev_lower {
            out.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        word.push(c.to_ascii_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Whether a key, flag, member or parameter names a credential: its last word is one of
/// [`SECRET_WORDS`] or ends with one of [`SECRET_ENDINGS`], or is `key` after any word but
/// [`NOT_SECRET_KEYS`] (or alone); and no word makes it a quantity ([`SETTING_WORDS`]).
/// `TOKEN_FILE`, `AUTH_MODE`, `KEYCLOAK_URL` and `MAX_TOKENS` are not.
pub fn credential_name(name: &str) -> bool {
    let w = words(name);
    let Some(last) = w.last().map(String::as_str) else {
        return false;
    };
    if w.iter().any(|x| SETTING_WORDS.contains(&x.as_str())) {
        return false;
    }
    if SECRET_WORDS.contains(&last) || SECRET_ENDINGS.iter().any(|e| last.ends_with(e)) {
        return true;
    }
    (last == "key" || last == "keys") && (w.len() < 2 || !NOT_SECRET_KEYS.contains(&w[w.len() - 2].as_str()))
}

/// The longest number under a credential's name that is a setting (`AUTH=0`: a switch or
/// a small count); a longer one is a numeric password or PIN (`123456`), a secret.
const MAX_SETTING_NUMBER: usize = 3;

/// Whether a value under a credential's name is a setting, not a secret: empty, a
/// number of at most [`MAX_SETTING_NUMBER`] characters, a word of [`SETTING_VALUES`], a
/// path, or a reference (`${VAR}`, `$VAR`).
pub fn setting_value(value: &str) -> bool {
    let v = value.trim();
    v.is_empty()
        || (v.len() <= MAX_SETTING_NUMBER
            && v.starts_with(|c: char| c.is_ascii_digit() || c == '-')
            && v.parse::<f64>().is_ok())
        || SETTING_VALUES.iter().any(|s| v.eq_ignore_ascii_case(s))
        || v.starts_with('/')
        || v.starts_with("~/")
        || v.starts_with("./")
        || v.starts_with("../")
        || (v.len() > 2 && v.as_bytes()[1] == b':' && matches!(v.as_bytes()[2], b'\\' | b'/'))
        || reference(v)
}

/// A value that is only a reference another program fills in: `${NAME}` or `$NAME`.
fn reference(v: &str) -> bool {
    if let Some(inner) = v.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        return !inner.contains('}');
    }
    v.strip_prefix('$')
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// An Authorization scheme at the start of a value (`Bearer`, `Basic`, `Token`) with the
/// whitespace after it (RFC 6750 allows any number of spaces; a tab or a no-break space
/// is passed on as typed), and what follows it.
pub fn scheme_split(s: &str) -> (&str, &str) {
    for scheme in ["bearer", "basic", "token"] {
        let Some(head) = s.get(..scheme.len()).filter(|h| h.eq_ignore_ascii_case(scheme)) else {
            continue;
        };
        let rest = s[head.len()..].trim_start();
        if rest.len() < s.len() - head.len() && !rest.is_empty() {
            return s.split_at(s.len() - rest.len());
        }
    }
    ("", s)
}

/// Where the credential after an Authorization scheme word starts: past the whitespace
/// at `at` (one character of it at least), or `None` when there is none.
fn after_scheme(s: &str, at: usize) -> Option<usize> {
    let rest = s.get(at..)?;
    let skipped = rest.len() - rest.trim_start().len();
    (skipped > 0).then_some(at + skipped)
}

/// Prefixes of tokens that services issue (GitHub, GitLab, OpenAI/Anthropic, Stripe,
/// Slack, AWS, Google, Hugging Face, npm, PyPI, Sentry, Linear, Notion, Figma,
/// DigitalOcean, Shopify, Supabase, Groq, xAI, Perplexity, Tavily, Replicate, Atlassian).
const TOKEN_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "gldt-",
    "glptt-",
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "rk_test_",
    "whsec_",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxe-",
    "xoxs-",
    "xapp-",
    "AKIA",
    "ASIA",
    "AIza",
    "hf_",
    "npm_",
    "pypi-",
    "sntrys_",
    "sntryu_",
    "lin_api_",
    "ntn_",
    "secret_",
    "figd_",
    "dop_v1_",
    "shpat_",
    "shpss_",
    "sbp_",
    "gsk_",
    "xai-",
    "pplx-",
    "tvly-",
    "r8_",
    "ATATT",
];

/// Whether a run of letters, digits, `_`, `-` and `.` is a token: a known prefix
/// ([`TOKEN_PREFIXES`]) and 12 more characters with a digit among them (not a package
/// named `sk-mcp-server`), a JWT (`eyJ….eyJ….…`), or (with `random`) a piece between
/// `_`/`-`/`.` that looks random: 20 or more characters mixing upper case, lower case
/// and digits, or 32 or more mixing letters and digits, that change between those kinds
/// at least once every three characters (not `MyCompanyTools2024`, nor words joined by
/// dashes such as `claude-3-5-sonnet-20241022`).
pub fn token_like(run: &str, random: bool) -> bool {
    if TOKEN_PREFIXES.iter().any(|p| {
        run.strip_prefix(p)
            .is_some_and(|rest| rest.len() >= 12 && rest.bytes().any(|b| b.is_ascii_digit()))
    }) {
        return true;
    }
    if run.starts_with("eyJ") && run.matches('.').count() >= 2 && run.len() >= 30 {
        return true;
    }
    random
        && run.split(['_', '-', '.']).any(|piece| {
            let kind = |b: u8| match b {
                b'a'..=b'z' => 0u8,
                b'A'..=b'Z' => 1,
                _ => 2,
            };
            let b = piece.as_bytes();
            let has = |k: u8| b.iter().any(|&c| kind(c) == k);
            let (lower, upper, digit) = (has(0), has(1), has(2));
            let changes = b.windows(2).filter(|w| kind(w[0]) != kind(w[1])).count();
            let mixed = (b.len() >= 20 && upper && lower && digit) || (b.len() >= 32 && digit && (upper || lower));
            mixed && changes * 3 >= b.len()
        })
}

/// `8-4-4-4-12` hexadecimal digits.
fn uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                *c == b'-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// Characters that end a `NAME=VALUE` value or start its name.
fn bound(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            ';' | '&' | '?' | ',' | '\'' | '"' | '=' | '#' | '{' | '}' | '(' | ')' | '[' | ']' | '/' | '|'
        )
}

/// One secret found in a text: its bytes, a word for its variable's name, and why.
pub type Found = (Range<usize>, String, &'static str);

/// The secrets in a string of text, in order. `random`: also runs that look random (not
/// for a command or a folder, where a hash-named folder is common).
pub fn found_secrets(s: &str, random: bool) -> Vec<Found> {
    // By start: the ranges found never overlap, so the one that starts last before a new
    // range's end is the only one that can overlap it.
    let mut found: std::collections::BTreeMap<usize, (usize, String, &'static str)> = Default::default();
    let mut add = |r: Range<usize>, hint: &str, why: &'static str| {
        let value = &s[r.clone()];
        let overlaps = found
            .range(..r.end)
            .next_back()
            .is_some_and(|(_, (end, ..))| *end > r.start);
        if !r.is_empty() && !reference(value.trim()) && !overlaps {
            found.insert(r.start, (r.end, hint.to_owned(), why));
        }
    };
    // `Name: Bearer X` (an HTTP header as an argument), also joined to its flag
    // (`--header=Name: X`).
    let joined = s
        .strip_prefix('-')
        .and_then(|_| s.split_once('='))
        .map(|(flag, _)| flag.len() + 1);
    for from in std::iter::once(0).chain(joined) {
        let h = &s[from..];
        if let Some((name, _)) = h.split_once(':') {
            if !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !h[name.len()..].starts_with("://")
                && credential_name(name)
            {
                let v = h[name.len() + 1..].trim_start();
                let at = s.len() - v.len();
                let (scheme, rest) = scheme_split(v);
                if !rest.trim().is_empty() && !setting_value(rest) {
                    add(at + scheme.len()..s.len(), name, "a credential in a header");
                }
            }
        }
    }
    // `Bearer X`, `Basic X`, wherever they are (a header written in JSON text).
    // Any whitespace after the scheme, not only one space (`Bearer  X`, `Bearer\tX`).
    let lower = s.to_ascii_lowercase();
    for scheme in ["bearer", "basic"] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(scheme).map(|i| i + from) {
            from = i + scheme.len();
            let before = s[..i].chars().next_back();
            if before.is_some_and(|c| !(c.is_whitespace() || matches!(c, '"' | '\'' | ':' | '='))) {
                continue;
            }
            let Some(start) = after_scheme(s, from) else { continue };
            let end = s[start..]
                .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';'))
                .map_or(s.len(), |e| start + e);
            if !setting_value(&s[start..end]) {
                add(start..end, "token", "an Authorization credential");
            }
        }
    }
    // `NAME=VALUE` anywhere (`--token=X`, `-e GITHUB_TOKEN=X`, `password=X dbname=…`,
    // `Pwd=X;`, `?api_key=X&`, `#access_token=X`) whose name names a credential.
    for (eq, _) in s.match_indices('=') {
        let start = s[..eq].rfind(bound).map_or(0, |i| i + 1);
        let name = s[start..eq].trim_start_matches('-');
        if name.is_empty() || !credential_name(name) {
            continue;
        }
        let v0 = eq + 1;
        let end = s[v0..].find(bound).map_or(s.len(), |e| v0 + e);
        // A value may hold `=` of its own (base64): up to the next bound but `=`.
        let end = s[v0..]
            .find(|c: char| c != '=' && bound(c))
            .map_or(s.len(), |e| v0 + e)
            .max(end);
        let (scheme, _) = scheme_split(&s[v0..end]);
        if !setting_value(&s[v0 + scheme.len()..end]) {
            add(v0 + scheme.len()..end, name, "a credential, by its name");
        }
    }
    // `"name": "value"` (JSON text in an argument or a variable).
    for (colon, _) in s.match_indices(':') {
        let before = s[..colon].trim_end();
        let Some(name) = before.strip_suffix('"').and_then(|b| b.rfind('"').map(|q| &b[q + 1..])) else {
            continue;
        };
        if !credential_name(name) {
            continue;
        }
        let after = &s[colon + 1..];
        let Some(open) = after.find(|c: char| !c.is_whitespace()) else {
            continue;
        };
        // A number (`{"password": 123456}`): the whole number, written where it was.
        if after[open..].starts_with(|c: char| c.is_ascii_digit() || c == '-') {
            let v0 = colon + 1 + open;
            let end = s[v0..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.')))
                .map_or(s.len(), |e| v0 + e);
            if !setting_value(&s[v0..end]) {
                add(v0..end, name, "a credential in JSON text");
            }
            continue;
        }
        if !after[open..].starts_with('"') {
            continue;
        }
        let v0 = colon + 1 + open + 1;
        let mut end = v0;
        let bytes = s.as_bytes();
        while end < s.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        let end = end.min(s.len());
        let (scheme, _) = scheme_split(&s[v0..end]);
        if !setting_value(&s[v0 + scheme.len()..end]) {
            add(v0 + scheme.len()..end, name, "a credential in JSON text");
        }
    }
    // URLs: a password, a token as the user, a UUID in an `http(s)` URL's path.
    let mut from = 0;
    let mut run: (usize, Option<usize>) = (0, None);
    while let Some(i) = s[from..].find("://").map(|i| i + from) {
        let start = i + 3;
        // The scheme: the scheme characters just before `://` (looked back at once per
        // URL, so many URLs in one string stay linear).
        let scheme = &s[s[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |j| j + 1)..i]
            .to_ascii_lowercase();
        let web = scheme.ends_with("http") || scheme.ends_with("https");
        let end_auth = s[start..]
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .map_or(s.len(), |e| start + e);
        let authority = &s[start..end_auth];
        // Where the path starts, and where the next URL is looked for.
        let mut path = end_auth;
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) if colon + 1 < userinfo.len() => {
                    add(start + colon + 1..start + at, "password", "the password of a URL")
                }
                // `https://TOKEN@host` (GitHub and others take a token as the user); a
                // database's `postgresql://postgres@db` is a user name.
                None if !userinfo.is_empty() && (web || token_like(userinfo, true)) => {
                    add(start..start + at, "token", "a token as a URL's user")
                }
                _ => {}
            }
        } else if let Some(colon) = authority.find(':') {
            // `scheme://user:pa/ss@host` or `pa#ss`: a password with a `/`, `?` or `#` left
            // unencoded, which ends the authority early. Taken up to the last `@` before
            // the next space or quote, when what follows the `:` is no port (`host:8080/`).
            let user = &authority[..colon];
            // The run to the next space or quote, and its last `@`: found once a run, so
            // many URLs in one run stay linear.
            if start >= run.0 {
                let end = s[start..]
                    .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
                    .map_or(s.len(), |e| start + e);
                run = (end, s[start..end].rfind('@').map(|a| start + a));
            }
            let rest_end = run.0;
            let pw_start = start + colon + 1;
            let port = s[pw_start..end_auth].bytes().all(|b| b.is_ascii_digit());
            if let Some(at) = run.1.filter(|&a| a >= end_auth) {
                let host = &s[at + 1..rest_end];
                let user_ok = user.chars().all(|c| c.is_ascii_alphanumeric() || "_.-%~".contains(c));
                if !port && user_ok && host.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '[') {
                    add(pw_start..at, "password", "the password of a URL");
                    path = s[at..]
                        .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
                        .map_or(s.len(), |e| at + e);
                }
            }
        }
        // Composio's and Pipedream's server URLs are the credential, by convention, and
        // nothing tells them from an ordinary id. The path ends at the next URL too, which
        // the loop reads next (`https://archive/web/https://…`).
        if web && s[path..].starts_with('/') {
            let end = s[path..]
                .char_indices()
                .find(|&(j, c)| matches!(c, '?' | '#' | '"') || c.is_whitespace() || s[path + j..].starts_with("://"))
                .map_or(s.len(), |(j, _)| path + j);
            let mut at = path;
            for segment in s[path..end].split('/') {
                if uuid(segment) {
                    add(
                        at..at + segment.len(),
                        "id",
                        "a UUID in a URL's path, which may be its credential",
                    );
                }
                at += segment.len() + 1;
            }
        }
        from = path.max(start);
    }
    // `user:password@host` without a scheme (a Go or MySQL DSN).
    if !s.contains("://") {
        if let Some((user, rest)) = s.split_once(':') {
            if let Some(at) = rest.find('@') {
                let (pw, host) = (&rest[..at], &rest[at + 1..]);
                // Not a Windows path (`C:\\…\\@scope\\pkg`): a user name is longer than a drive.
                let user_ok = user.len() > 1 && user.chars().all(|c| c.is_ascii_alphanumeric() || "_.-%".contains(c));
                let pw_ok = !pw.is_empty() && !pw.contains(|c: char| c.is_whitespace() || c == '/' || c == '\\');
                if user_ok && pw_ok && host.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '(' || c == '[') {
                    add(
                        user.len() + 1..user.len() + 1 + at,
                        "password",
                        "the password of a connection string",
                    );
                }
            }
        }
    }
    // JSON in base64 (`eyJ` is `{"`), as Smithery's `?config=` carries a server's whole
    // configuration, its keys with it: taken whole, whatever it holds. In a URL's path a
    // `/` ends it; elsewhere it is of the alphabet, as are `%2B`, `%2F` and `%3D`.
    let (scheme_at, query_at) = (s.find("://"), s.find('?'));
    let mut from = 0;
    while let Some(i) = s[from..].find("eyJ").map(|i| i + from) {
        from = i + 3;
        if s[..i].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let in_path = scheme_at.is_some_and(|a| a < i) && query_at.is_none_or(|q| q > i);
        let b = s.as_bytes();
        let mut end = i;
        while end < b.len() {
            let c = b[end];
            if c.is_ascii_alphanumeric() || matches!(c, b'+' | b'_' | b'-' | b'.') || (c == b'/' && !in_path) {
                end += 1;
            } else if c == b'%'
                && b.get(end + 1..end + 3).is_some_and(|h| {
                    let h = h.to_ascii_uppercase();
                    h == b"2B" || h == b"2F" || h == b"3D"
                })
            {
                end += 3;
            } else {
                break;
            }
        }
        while end > i && b[end - 1] == b'.' {
            end -= 1;
        }
        while end < b.len() && b[end] == b'=' {
            end += 1;
        }
        // A JWT (`eyJ….eyJ….…`) is found by its shape, below.
        if end - i >= 20 && !s[i..end].contains('.') {
            add(i..end, "config", "JSON in base64, which may hold credentials");
        }
        // The rest of this run is judged with it (so a run of `eyJ.eyJ.…` stays linear).
        from = from.max(end);
    }
    // Tokens by their shape, anywhere; not a digest (`@sha256:…`, `@<commit>`).
    let run_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
    let mut i = 0;
    while i < s.len() {
        let Some(c) = s[i..].chars().next() else { break };
        if !run_char(c) {
            i += c.len_utf8();
            continue;
        }
        let end = s[i..].find(|c: char| !run_char(c)).map_or(s.len(), |e| i + e);
        let run = s[i..end].trim_end_matches('.');
        let digest = s[..i].ends_with('@') || ["sha1:", "sha256:", "sha512:"].iter().any(|p| s[..i].ends_with(p));
        if !(digest && run.bytes().all(|b| b.is_ascii_hexdigit())) && token_like(run, random) {
            add(i..i + run.len(), "token", "what looks like a token");
        }
        i = end;
    }
    found
        .into_iter()
        .map(|(start, (end, hint, why))| (start..end, hint, why))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(s: &str) -> Vec<&str> {
        found_secrets(s, true).into_iter().map(|(r, ..)| &s[r]).collect()
    }

    #[test]
    fn credential_names_by_their_last_word() {
        for k in [
            "GITHUB_TOKEN",
            "Authorization",
            "X-Api-Key",
            "apiKey",
            "API_KEY",
            "STRIPE_KEY",
            "GITHUB_PAT",
            "githubPat",
            "DB_PASSWD",
            "PGPASSWORD",
            "SENTRY_DSN",
            "Cookie",
            "client_secret",
            "key",
            "ENABLE_AUTH",
        ] {
            assert!(credential_name(k), "{k}");
        }
        for k in [
            "PATH",
            "MODE",
            "TOKEN_FILE",
            "X-Team",
            "passport",
            "MAX_TOKENS",
            "OPENAI_MAX_TOKENS",
            "TOKENIZERS_PARALLELISM",
            "KEYCLOAK_URL",
            "AUTHOR_NAME",
            "OAUTH_CALLBACK_PORT",
            "PASS_THROUGH",
            "AWS_SECRET_NAME",
            "KEY_PREFIX",
            "PUBLIC_KEY_URL",
            "AUTH_MODE",
            "API_KEY_HEADER",
            "HOTKEY",
            "COOKIE_DOMAIN",
            "sort-key",
            "primary-key",
            "keyword",
            "tokenizer",
        ] {
            assert!(!credential_name(k), "{k}");
        }
        for v in [
            "false",
            "oauth",
            "0",
            "42",
            "~/.ssh/id_ed25519",
            "${AUTH_HEADER}",
            "$TOKEN",
            "",
        ] {
            assert!(setting_value(v), "{v}");
        }
        for v in ["1234", "123456", "4096", "inf", "NaN"] {
            assert!(!setting_value(v), "{v}");
        }
    }

    #[test]
    fn secrets_by_place_and_shape() {
        for (text, want) in [
            ("postgresql://admin:hunter2@db:5432/app", vec!["hunter2"]),
            // A password with `/`, `#` or `?` left unencoded.
            ("postgresql://admin:hun/ter#2@db:5432/app", vec!["hun/ter#2"]),
            ("redis://:pa?ss/w@cache:6379/0", vec!["pa?ss/w"]),
            // A URL in another's path is read as a URL of its own.
            (
                "https://archive.example/web/2020/https://u:pw1@h/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                vec!["pw1", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"],
            ),
            ("https://bot:x#y/z@git.example/r.git", vec!["x#y/z"]),
            ("https://x.example/mcp?api_key=zap123&mode=1", vec!["zap123"]),
            ("https://x.example/mcp#access_token=FragTok1", vec!["FragTok1"]),
            ("Bearer sk-1", vec!["sk-1"]),
            ("Bearer  two1", vec!["two1"]),
            ("x bearer\ttab2", vec!["tab2"]),
            ("Basic\u{a0}nbsp3", vec!["nbsp3"]),
            ("Bearer", vec![]),
            ("https://BasicPw13@api.example.com/mcp", vec!["BasicPw13"]),
            ("Authorization: Bearer abc", vec!["abc"]),
            ("Authorization:${AUTH_HEADER}", vec![]),
            // A header joined to its flag.
            ("--header=X-Api-Key:3f9a7c1e5b2d4f60aa", vec!["3f9a7c1e5b2d4f60aa"]),
            ("--header=Private-Token: 3f9a7c1e5b2d4f60aa", vec!["3f9a7c1e5b2d4f60aa"]),
            (
                "--header=Authorization: token 3f9a7c1e5b2d4f60aa",
                vec!["3f9a7c1e5b2d4f60aa"],
            ),
            ("--header=X-Team: web", vec![]),
            ("--token=tok_1", vec!["tok_1"]),
            ("--env=OPENAI_API_KEY=DockKey7", vec!["DockKey7"]),
            ("GITHUB_TOKEN=ghp_x", vec!["ghp_x"]),
            ("host=db user=app password=KwPlain77 dbname=shop", vec!["KwPlain77"]),
            (
                "Server=tcp:sql;User Id=sa;Password=MsPlainPw9;Encrypt=1",
                vec!["MsPlainPw9"],
            ),
            ("Driver={ODBC};Server=s;Uid=u;Pwd=OdbcPw3;", vec!["OdbcPw3"]),
            ("file:app.db?key=SqlcipherKey1", vec!["SqlcipherKey1"]),
            ("root:MyPlainPw4@tcp(127.0.0.1:3306)/shop", vec!["MyPlainPw4"]),
            (r#"{"apiKey":"JsonArgKey1"}"#, vec!["JsonArgKey1"]),
            (r#"{"password": 1122334, "port": 5432}"#, vec!["1122334"]),
            (r#"{"auth": 1}"#, vec![]),
            (
                r#"{"Authorization": "Bearer secretnotionlowercase", "Notion-Version": "2022-06-28"}"#,
                vec!["secretnotionlowercase"],
            ),
            (
                "ghp_abcdefghijklmnopqrstuvwxyz0123",
                vec!["ghp_abcdefghijklmnopqrstuvwxyz0123"],
            ),
            (
                "key is eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
                vec!["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"],
            ),
            (
                "https://mcp.example/s/Zm9vYmFyQmF6cXV4MTIzNDU2Nzg5MA/mcp",
                vec!["Zm9vYmFyQmF6cXV4MTIzNDU2Nzg5MA"],
            ),
            // Smithery's configuration, base64 as `btoa` writes it (`+`, `/`, `=`), and
            // percent-encoded.
            (
                "https://server.smithery.ai/@x/github/mcp?config=eyJnaXRodWJUb2tlbiI6ImFiYyJ9&profile=p",
                vec!["eyJnaXRodWJUb2tlbiI6ImFiYyJ9"],
            ),
            (
                "https://s.example/mcp?config=eyJrIjoi+/v/Pz8/Pz8/Pz8ifQ==",
                vec!["eyJrIjoi+/v/Pz8/Pz8/Pz8ifQ=="],
            ),
            (
                "https://s.example/mcp?config=eyJrIjoi%2B%2Fv%2FPz8ifQ%3D%3D&x=1",
                vec!["eyJrIjoi%2B%2Fv%2FPz8ifQ%3D%3D"],
            ),
            ("--config eyJhcGlLZXkiOiJ4eXoifQ", vec!["eyJhcGlLZXkiOiJ4eXoifQ"]),
            (
                "https://s.example/eyJhcGlLZXkiOiJ4eXoifQ/mcp",
                vec!["eyJhcGlLZXkiOiJ4eXoifQ"],
            ),
            // Composio's and Pipedream's URLs.
            (
                "https://mcp.composio.dev/composio/server/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/mcp?user_id=u",
                vec!["0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"],
            ),
            (
                "https://mcp.pipedream.net/0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0/gmail",
                vec!["0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0"],
            ),
        ] {
            assert_eq!(secrets(text), want, "{text}");
        }
        for plain in [
            "-y",
            "@modelcontextprotocol/server-filesystem",
            "/Users/alice/Desktop",
            "/Users/alice/Projects/MyCompanyInternalTools2024/index.js",
            "ghcr.io/github/github-mcp-server",
            "ghcr.io/org/img@sha256:4f2e8c1b9a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f",
            "git+https://github.com/org/repo@4f2e8c1b9a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f",
            "claude-3-5-sonnet-20241022",
            "123e4567-e89b-12d3-a456-426614174000",
            "--tools=all",
            "--max-tokens=4096",
            "ENABLE_AUTH=false",
            "http://localhost:3000/mcp",
            "C:\\Users\\alice\\AppData",
            "C:\\Users\\alice\\node_modules\\@modelcontextprotocol\\server-filesystem\\dist\\index.js",
            "pypi-query-mcp-server",
            "secret_manager_mcp_server",
            "sk-mcp-server-tools",
            "ASIA_PACIFIC_SOUTHEAST",
            "git@github.com:org/repo.git",
            "user@example.com",
            "postgresql://postgres@localhost/shop",
            "https://registry.example:8443/@scope/pkg",
            "http://localhost:3000/mcp/@me",
            "https://example.com/a:b/@c",
            "postgresql://db/123e4567-e89b-12d3-a456-426614174000",
            "https://example.com/docs?id=123e4567-e89b-12d3-a456-426614174000",
            "https://example.com/keyJohn/mcp",
            "eyJ",
            "SurveyJsonSchemaForTheTeam",
        ] {
            assert_eq!(secrets(plain), Vec::<&str>::new(), "{plain}");
        }
    }

    #[test]
    fn words_split_case_and_separators() {
        assert_eq!(words("githubPat"), ["github", "pat"]);
        assert_eq!(words("X-API-Key"), ["x", "api", "key"]);
    }
}
