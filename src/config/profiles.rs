//! `[profiles.NAME]`: more endpoints over the same servers. A profile picks servers (by
//! name, or by their `tags`) and tools (globs over public names); it is served at
//! `{gateway.path}/{NAME}` and by `stdio --profile NAME`.

use super::errors::Ctx;
use super::servers::Server;
use super::values::Filter;
use serde::Deserialize;
use toml::Spanned;

/// Names a profile may not have: the gateway's own routes, which `{gateway.path}/{NAME}`
/// would shadow (or be shadowed by) with `path = "/"`.
pub const RESERVED_PROFILES: &[&str] = &["status", "healthz", "readyz", "metrics"];

/// One `[profiles.NAME]` table as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    /// `None` when left out (with `tags` left out too: every server); an empty list is an
    /// error, not "every server".
    servers: Option<Spanned<Vec<Spanned<String>>>>,
    tags: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    tools: RawProfileTools,
    #[serde(default)]
    search: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProfileTools {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

/// One `[profiles.NAME]`: a subset of the catalog with an endpoint of its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// `[A-Za-z0-9_-]+`; the last part of its endpoint's path.
    pub name: String,
    /// Servers chosen by name.
    pub servers: Vec<String>,
    /// Servers with any of these tags are chosen too. With neither `servers` nor `tags`,
    /// every server is.
    pub tags: Vec<String>,
    /// Globs over public tool names (after prefixes and overrides); empty: all.
    pub tools: Filter,
    /// `tools/list` is the gateway's search tools instead of the profile's tools.
    pub search: bool,
}

impl Profile {
    /// Whether `server` belongs to the profile: named, or tagged with one of its tags;
    /// every server when the profile names neither.
    pub fn includes(&self, server: &Server) -> bool {
        (self.servers.is_empty() && self.tags.is_empty())
            || self.servers.contains(&server.name)
            || server.tags.iter().any(|t| self.tags.contains(t))
    }
}

/// A profile name: `[A-Za-z0-9_-]+`.
pub fn profile_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
}

/// Every `[profiles.NAME]`, in file order. `known` is every `[servers.NAME]` as written
/// (a server with problems of its own still counts as named), with its tags.
pub(super) fn parse(
    cx: &mut Ctx,
    raw: indexmap::IndexMap<Spanned<String>, RawProfile>,
    known: &[(String, Vec<String>)],
) -> Vec<Profile> {
    let mut out = Vec::new();
    for (name, p) in raw {
        let at = name.span().start;
        let name = name.into_inner();
        if name.is_empty() || !name.chars().all(profile_char) {
            cx.at(at, format!("profile name {name:?} may only use [A-Za-z0-9_-]"));
        } else if RESERVED_PROFILES.contains(&name.as_str()) {
            cx.at(
                at,
                format!(
                    "profile name {name:?} is reserved (the gateway's own paths: {}); choose another",
                    RESERVED_PROFILES.join(", ")
                ),
            );
        }
        let mut list = |key: &str, v: Option<Spanned<Vec<Spanned<String>>>>| match v {
            Some(v) if v.get_ref().is_empty() => {
                cx.at(
                    v.span().start,
                    format!("profiles.{name}.{key} is empty: name at least one, or leave `{key}` out (with `servers` and `tags` both left out, a profile has every server)"),
                );
                Vec::new()
            }
            Some(v) => v.into_inner(),
            None => Vec::new(),
        };
        let (servers, tags) = (list("servers", p.servers), list("tags", p.tags));
        for s in &servers {
            if !known.iter().any(|(n, _)| n == s.get_ref()) {
                let names: Vec<&str> = known.iter().map(|(n, _)| n.as_str()).collect();
                cx.at(
                    s.span().start,
                    format!(
                        "profiles.{name}.servers: no [servers.{}] in this file (servers: {})",
                        s.get_ref(),
                        if names.is_empty() {
                            "none".to_owned()
                        } else {
                            names.join(", ")
                        }
                    ),
                );
            }
        }
        for t in &tags {
            if !known.iter().any(|(_, tags)| tags.contains(t.get_ref())) {
                let mut all: Vec<&str> = known
                    .iter()
                    .flat_map(|(_, t)| t.iter().map(String::as_str))
                    .filter(|t| !t.is_empty() && t.chars().all(super::values::name_char))
                    .collect();
                all.sort_unstable();
                all.dedup();
                cx.at(
                    t.span().start,
                    format!(
                        "profiles.{name}.tags: no server has the tag {:?} (tags: {})",
                        t.get_ref(),
                        if all.is_empty() {
                            "none".to_owned()
                        } else {
                            all.join(", ")
                        }
                    ),
                );
            }
        }
        out.push(Profile {
            name,
            servers: servers.into_iter().map(Spanned::into_inner).collect(),
            tags: tags.into_iter().map(Spanned::into_inner).collect(),
            tools: Filter {
                allow: p.tools.allow,
                deny: p.tools.deny,
            },
            search: p.search,
        });
    }
    out
}
