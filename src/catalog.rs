//! The merged catalog: every server's tools, prompts, resources and resource templates
//! under public names, with the lookup tables that route calls back.
//!
//! Naming rule, applied to servers in gateway.toml order and to each server's items in
//! the order it lists them:
//! 1. the public name is `{prefix}{separator}{name}`, or `{name}` when the prefix is empty;
//! 2. a name that is longer than 64 characters or uses a character outside
//!    `[A-Za-z0-9_.-]` becomes its first 55 characters (each invalid one replaced by `_`)
//!    plus `_` and 8 hex digits of a hash of (server, original name);
//! 3. a name already taken (by an earlier server, or earlier in the same list) is a
//!    collision: the first keeps the name, the later one gets the hashed form of rule 2.
//!    Collisions are logged and shown by `mcp-gateway check --connect`.
//!
//! Resources keep their URIs. A URI listed by two servers belongs to the first. Routing
//! always goes through these tables; names are never split.

mod overrides;
mod template;
pub mod view;

pub use template::Template;

use crate::config::{name_char, Filter, Override};
use crate::message::{self, short_hash};
use crate::method::{Method, LISTS};
use indexmap::IndexMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// The gateway's own tools of tool search mode (`router/search.rs`). Their names are
/// reserved, search mode or not: a server's tool that would be public under one of them
/// (a server named `gateway` with a tool `search_tools`) gets the hashed form of rule 3.
pub const SEARCH_TOOLS: &str = "gateway__search_tools";
pub const CALL_TOOL: &str = "gateway__call_tool";
pub const RESERVED_TOOLS: [&str; 2] = [SEARCH_TOOLS, CALL_TOOL];

/// Longest public tool or prompt name clients accept (SEP-986).
pub const MAX_NAME: usize = 64;
const HASH_LEN: usize = 8;

/// What one server offers, as it listed it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Lists {
    pub tools: Vec<Map<String, Value>>,
    pub prompts: Vec<Map<String, Value>>,
    pub resources: Vec<Map<String, Value>>,
    pub templates: Vec<Map<String, Value>>,
    /// The 2026-07-28 caching hints a server gave with each list (tools, prompts,
    /// resources, templates); `None` for a handshake-era server, which gives none.
    pub hints: [Option<Hint>; 4],
}

/// A list's 2026-07-28 caching hint: `ttlMs` (the smallest over its pages) and whether
/// any page was `cacheScope: "private"`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Hint {
    pub ttl_ms: u64,
    pub private: bool,
}

impl Hint {
    /// The hint of a result, from its `ttlMs` and `cacheScope` (missing ones: 0, public).
    pub fn of(result: &Map<String, Value>) -> Hint {
        Hint {
            ttl_ms: result.get("ttlMs").and_then(Value::as_u64).unwrap_or(0),
            private: result.get("cacheScope").and_then(Value::as_str) == Some("private"),
        }
    }

    /// Both parts together: the smaller ttl, private if either is.
    pub fn and(self, other: Hint) -> Hint {
        Hint {
            ttl_ms: self.ttl_ms.min(other.ttl_ms),
            private: self.private || other.private,
        }
    }
}

impl Lists {
    /// Replaces what list method `m` (one of [`LISTS`]) returned, and its hint.
    /// Sets one list and its hint; whether either changed.
    pub fn set(&mut self, m: Method, items: Vec<Map<String, Value>>, hint: Option<Hint>) -> bool {
        let list = match m {
            Method::ToolsList => &mut self.tools,
            Method::PromptsList => &mut self.prompts,
            Method::ResourcesList => &mut self.resources,
            Method::ResourcesTemplatesList => &mut self.templates,
            _ => return false,
        };
        let mut changed = *list != items;
        *list = items;
        if let Some(i) = list_index(m) {
            changed |= self.hints[i] != hint;
            self.hints[i] = hint;
        }
        changed
    }
}

/// The place of list method `m` in [`LISTS`] (and in [`Lists::hints`]).
fn list_index(m: Method) -> Option<usize> {
    LISTS.iter().position(|l| *l == m)
}

/// The key of the array in a list method's result: `tools`, `prompts`, `resources` or
/// `resourceTemplates`.
pub fn result_key(m: Method) -> &'static str {
    match m {
        Method::ToolsList => "tools",
        Method::PromptsList => "prompts",
        Method::ResourcesList => "resources",
        Method::ResourcesTemplatesList => "resourceTemplates",
        _ => "",
    }
}

/// The inputs to a merge: one per server, in gateway.toml order.
pub struct Source<'a> {
    pub server: &'a str,
    pub prefix: &'a str,
    pub lists: &'a Lists,
    /// Tool filter over the server's own names.
    pub filter: &'a Filter,
    /// What the operator puts in place of some tools' names and descriptions.
    pub overrides: &'a IndexMap<String, Override>,
    /// What the server said of itself at `initialize`, for tool search.
    pub instructions: Option<&'a str>,
}

/// Where a public name leads.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Index of the server in gateway.toml order.
    pub server: usize,
    /// The server's own name for it.
    pub name: String,
    /// The public name it would have had (`{prefix}{separator}{name}`, an override's name
    /// in place) when it is public under another (a collision, or a name too long or
    /// invalid): a deny glob that names it hides it under its new name too, so another
    /// server's listing cannot take a denied tool's name and push it out from under its
    /// deny ([`Catalog::denied_by_former_name`]).
    pub natural: Option<Box<str>>,
}

/// One line of `check --connect` output.
#[derive(Debug, Clone)]
pub struct Entry {
    pub kind: &'static str,
    pub public: String,
    pub server: String,
    pub original: String,
}

/// The merged view, rebuilt whenever a server's lists change; cheap to share.
#[derive(Debug)]
pub struct Catalog {
    pub tools: HashMap<String, Route>,
    pub prompts: HashMap<String, Route>,
    /// Resource URI → server index.
    pub resources: HashMap<String, usize>,
    /// Resource templates in merge order, with their owners.
    pub templates: Vec<(Template, usize)>,
    /// Pre-serialized list results, served as they are.
    pub tools_result: Box<RawValue>,
    pub prompts_result: Box<RawValue>,
    pub resources_result: Box<RawValue>,
    pub templates_result: Box<RawValue>,
    pub entries: Vec<Entry>,
    /// Human-readable notes on collisions and renamed items.
    pub notes: Vec<String>,
    /// Overrides that do not hold against what the servers list: of a tool a server does
    /// not list, or a new name that another tool already has. `check --connect` fails on them.
    pub problems: Vec<String>,
    /// Each merged list's caching hint (in [`LISTS`] order): the smallest `ttlMs`
    /// of its parts, private if any part is; a handshake-era server's part counts as
    /// `ttlMs` 0 (it promises nothing).
    pub hints: [Hint; 4],
    /// The `inputSchema` of each tool whose schema asks for `Mcp-Param-*` headers
    /// ([`asks_param_headers`]), by public name, as its server lists it: what a
    /// 2026-07-28 call's headers are checked against. Usually empty (no lookup at all).
    pub param_schemas: HashMap<String, Value>,
    /// Each server's name, prefix (with the separator) and instructions, for the index.
    servers: Vec<ServerText>,
    /// The server of each tool of `tools_result`, in order (an index into `servers`).
    tool_servers: Vec<usize>,
    /// The tool search index, built on first use ([`Catalog::search_index`]).
    search: std::sync::OnceLock<crate::search::Index>,
}

/// What tool search reads of a server besides its tools.
#[derive(Debug)]
struct ServerText {
    name: String,
    prefix: String,
    instructions: Option<String>,
}

impl Catalog {
    /// Whether `denies` (a deny check of a caller's or a profile's globs) holds for the
    /// name that public tool or prompt `public` would have had, had it not been renamed.
    pub fn denied_by_former_name(&self, public: &str, denies: impl Fn(&str) -> bool) -> bool {
        [&self.tools, &self.prompts]
            .iter()
            .any(|t| t.get(public).and_then(|r| r.natural.as_deref()).is_some_and(&denies))
    }

    /// The tool search index of this catalog's tools: built on first use (one catalog is
    /// built per change of the servers' lists), then shared by every session. Its
    /// documents are the tools as listed, overrides applied, under public names.
    pub fn search_index(&self) -> &crate::search::Index {
        self.search.get_or_init(|| {
            #[derive(serde::Deserialize)]
            struct Tools<'a> {
                #[serde(borrow)]
                tools: Vec<&'a serde_json::value::RawValue>,
            }
            let mut listed =
                serde_json::from_str::<Tools>(self.tools_result.get()).map_or_else(|_| Vec::new(), |t| t.tools);
            listed.truncate(self.tool_servers.len());
            // The list is the servers' tools, a server's one after the other.
            let mut groups = Vec::new();
            let mut start = 0;
            for end in 1..=listed.len() {
                let server = self.tool_servers[start];
                if end == listed.len() || self.tool_servers.get(end) != Some(&server) {
                    if let Some(s) = self.servers.get(server) {
                        groups.push(crate::search::Group {
                            server: &s.name,
                            prefix: &s.prefix,
                            instructions: s.instructions.as_deref(),
                            tools: &listed[start..end],
                        });
                    }
                    start = end;
                }
            }
            crate::search::Index::build_groups(&groups)
        })
    }

    /// The caching hint of a merged list method; `None` for any other method.
    pub fn hint(&self, method: Method) -> Option<Hint> {
        list_index(method).map(|i| self.hints[i])
    }
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog::build("__", &[])
    }
}

impl Catalog {
    pub fn build(separator: &str, sources: &[Source]) -> Catalog {
        let mut notes = Vec::new();
        let mut entries = Vec::new();
        let (tools, tools_list, tool_servers) =
            merge_named(separator, sources, "tool", &mut notes, &mut entries, |l| &l.tools, true);
        let (prompts, prompts_list, _) = merge_named(
            separator,
            sources,
            "prompt",
            &mut notes,
            &mut entries,
            |l| &l.prompts,
            false,
        );

        let mut resources: HashMap<String, usize> = HashMap::new();
        let mut resources_list = JsonArray::default();
        for (i, s) in sources.iter().enumerate() {
            for r in &s.lists.resources {
                let Some(uri) = r.get("uri").and_then(Value::as_str) else {
                    continue;
                };
                if let Some(&owner) = resources.get(uri) {
                    notes.push(format!(
                        "resource {} of server '{}' is hidden: server '{}' lists it first",
                        crate::error::echo(uri),
                        s.server,
                        sources[owner].server
                    ));
                    continue;
                }
                if !resources_list.push(r) {
                    continue;
                }
                resources.insert(uri.to_owned(), i);
                entries.push(Entry {
                    kind: "resource",
                    public: uri.into(),
                    server: s.server.into(),
                    original: uri.into(),
                });
            }
        }
        let mut templates = Vec::new();
        let mut templates_list = JsonArray::default();
        for (i, s) in sources.iter().enumerate() {
            for t in &s.lists.templates {
                let Some(uri) = t.get("uriTemplate").and_then(Value::as_str) else {
                    continue;
                };
                if !templates_list.push(t) {
                    continue;
                }
                templates.push((Template::parse(uri), i));
                entries.push(Entry {
                    kind: "template",
                    public: uri.into(),
                    server: s.server.into(),
                    original: uri.into(),
                });
            }
        }
        let problems = overrides::problems(separator, sources, &tools);
        let mut param_schemas = HashMap::new();
        for (i, s) in sources.iter().enumerate() {
            for t in &s.lists.tools {
                let Some(schema) = t.get("inputSchema").filter(|s| asks_param_headers(s)) else {
                    continue;
                };
                let name = t.get("name").and_then(Value::as_str);
                if let Some((public, _)) = tools
                    .iter()
                    .find(|(_, r)| r.server == i && Some(r.name.as_str()) == name)
                {
                    param_schemas.insert(public.clone(), schema.clone());
                }
            }
        }
        Catalog {
            tools,
            prompts,
            resources,
            templates,
            tools_result: tools_list.result(result_key(Method::ToolsList)),
            prompts_result: prompts_list.result(result_key(Method::PromptsList)),
            resources_result: resources_list.result(result_key(Method::ResourcesList)),
            templates_result: templates_list.result(result_key(Method::ResourcesTemplatesList)),
            entries,
            notes,
            problems,
            param_schemas,
            servers: sources
                .iter()
                .map(|s| ServerText {
                    name: s.server.to_owned(),
                    prefix: join(s.prefix, separator, ""),
                    instructions: s.instructions.map(str::to_owned),
                })
                .collect(),
            tool_servers,
            search: std::sync::OnceLock::new(),
            hints: std::array::from_fn(|i| {
                sources
                    .iter()
                    .map(|s| s.lists.hints[i].unwrap_or_default())
                    .reduce(Hint::and)
                    .filter(|h| h.ttl_ms != u64::MAX)
                    .unwrap_or_default()
            }),
        }
    }

    /// How many tools, prompts and resources of each of `servers` servers (by index, in
    /// gateway.toml order) clients see: after its `tools` filter, without the items lost
    /// to another server (a resource URI listed first elsewhere, a name with no free form).
    pub fn visible(&self, servers: usize) -> Vec<[usize; 3]> {
        let mut out = vec![[0; 3]; servers];
        let owners = (self.tools.values().map(|r| (0, r.server)))
            .chain(self.prompts.values().map(|r| (1, r.server)))
            .chain(self.resources.values().map(|&s| (2, s)));
        for (kind, server) in owners {
            if let Some(c) = out.get_mut(server) {
                c[kind] += 1;
            }
        }
        out
    }

    /// The server that owns a resource URI: listed URIs first, then templates in order.
    pub fn resource_owner(&self, uri: &str) -> Option<usize> {
        self.resource_owner_among(uri, |_| true)
    }

    /// [`Catalog::resource_owner`] among the servers `keep` says yes to (a view's): a URI
    /// of a server outside them is one this catalog does not have.
    pub fn resource_owner_among(&self, uri: &str, keep: impl Fn(usize) -> bool) -> Option<usize> {
        if let Some(&s) = self.resources.get(uri).filter(|&&s| keep(s)) {
            return Some(s);
        }
        self.templates
            .iter()
            .find(|&&(ref t, s)| keep(s) && (t.source == uri || t.matches(uri)))
            .map(|&(_, s)| s)
    }
}

/// The routes by public name, the merged list, and each item's server (by index).
type Merged = (HashMap<String, Route>, JsonArray, Vec<usize>);

/// A list result's array, written as JSON item by item: no item is copied into a `Value`
/// first (a tool's schema is most of a catalog's bytes).
#[derive(Default)]
struct JsonArray(Vec<u8>);

impl JsonArray {
    /// Writes `item`; false, and nothing written, should it not serialize (a map of JSON
    /// values always does).
    fn push(&mut self, item: &impl serde::Serialize) -> bool {
        let start = self.0.len();
        self.0.push(if start == 0 { b'[' } else { b',' });
        if serde_json::to_writer(&mut self.0, item).is_err() {
            self.0.truncate(start);
            return false;
        }
        true
    }

    /// `{"key":[...]}`.
    fn result(self, key: &str) -> Box<RawValue> {
        let array = if self.0.is_empty() { &b"["[..] } else { &self.0[..] };
        let mut out = Vec::with_capacity(array.len() + key.len() + 6);
        out.extend_from_slice(b"{\"");
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(array);
        out.extend_from_slice(b"]}");
        String::from_utf8(out)
            .ok()
            .and_then(|t| RawValue::from_string(t).ok())
            .unwrap_or_else(message::empty_object)
    }
}

fn merge_named(
    separator: &str,
    sources: &[Source],
    kind: &'static str,
    notes: &mut Vec<String>,
    entries: &mut Vec<Entry>,
    pick: fn(&Lists) -> &Vec<Map<String, Value>>,
    filtered: bool,
) -> Merged {
    let mut table: HashMap<String, Route> = HashMap::new();
    let mut list = JsonArray::default();
    let mut owners = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        let mut own: HashSet<&str> = HashSet::new();
        for item in pick(s.lists) {
            let Some(name) = item.get("name").and_then(Value::as_str) else {
                continue;
            };
            if filtered && !s.filter.permits(name) {
                continue;
            }
            // The server's name as the notes (log lines) say it: by its start when long.
            let said = crate::error::echo(name);
            if !own.insert(name) {
                notes.push(format!(
                    "{kind} {said} of server '{}' is listed twice; the second is ignored",
                    s.server
                ));
                continue;
            }
            // An override's name makes the public name; the route keeps the server's own.
            let overridden = if filtered { s.overrides.get(name) } else { None };
            let shown = overridden.and_then(|o| o.name.as_deref()).unwrap_or(name);
            let natural = join(s.prefix, separator, shown);
            let mut public = public_name(s.prefix, separator, shown, s.server);
            if public != natural {
                notes.push(format!(
                    "{kind} {said} of server '{}' is public as {public} (name too long or invalid)",
                    s.server
                ));
            }
            let reserved = filtered && RESERVED_TOOLS.contains(&public.as_str());
            if reserved || table.contains_key(&public) {
                let hashed = hashed_name(&sanitize(&join(s.prefix, separator, name)), s.server, name);
                let owner = match table.get(&public) {
                    Some(owner) => format!(
                        "server '{}'s {}",
                        sources[owner.server].server,
                        crate::error::echo(&owner.name)
                    ),
                    None => "the gateway's own (tool search)".to_owned(),
                };
                notes.push(format!(
                    "{kind} name collision: {public} is {owner}; server '{}'s {said} is public as {hashed}",
                    s.server
                ));
                public = hashed;
                if table.contains_key(&public) {
                    notes.push(format!(
                        "{kind} {said} of server '{}' is dropped: no free name",
                        s.server
                    ));
                    continue;
                }
            }
            // The public name in the name's place; the item is copied only for an override.
            let written = match overridden {
                Some(o) => {
                    let mut item = item.clone();
                    item.insert("name".into(), Value::String(public.clone()));
                    overrides::apply(&mut item, o);
                    list.push(&item)
                }
                None => list.push(&Renamed(item, &public)),
            };
            if !written {
                continue;
            }
            owners.push(i);
            entries.push(Entry {
                kind,
                public: public.clone(),
                server: s.server.into(),
                original: name.into(),
            });
            let natural = (public != natural).then(|| natural.into_boxed_str());
            table.insert(
                public,
                Route {
                    server: i,
                    name: name.to_owned(),
                    natural,
                },
            );
        }
    }
    (table, list, owners)
}

/// A listed item as JSON with another `name`, in the name's place.
struct Renamed<'a>(&'a Map<String, Value>, &'a str);

impl serde::Serialize for Renamed<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            if k == "name" {
                m.serialize_entry(k, self.1)?;
            } else {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

/// Whether a tool's `inputSchema` asks for any `Mcp-Param-*` header (`x-mcp-header` on a
/// property reached through `properties` keys only; see
/// `stateless::envelope::check_param_headers`).
pub fn asks_param_headers(schema: &Value) -> bool {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return false;
    };
    props.values().any(|prop| match prop.get("x-mcp-header") {
        Some(Value::String(_)) => true,
        _ => prop.get("properties").is_some() && asks_param_headers(prop),
    })
}

fn join(prefix: &str, separator: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}{separator}{name}")
    }
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if name_char(c) { c } else { '_' }).collect()
}

/// The public name of `name` from a server with `prefix` (rules 1 and 2 above).
pub fn public_name(prefix: &str, separator: &str, name: &str, server: &str) -> String {
    let joined = join(prefix, separator, name);
    let clean = sanitize(&joined);
    if clean == joined && !clean.is_empty() && clean.len() <= MAX_NAME {
        clean
    } else {
        hashed_name(&clean, server, name)
    }
}

fn hashed_name(clean: &str, server: &str, name: &str) -> String {
    let keep = MAX_NAME - HASH_LEN - 1;
    let mut out: String = clean.chars().take(keep).collect();
    out.push('_');
    out.push_str(&short_hash(&[server, name], HASH_LEN));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn merged_hints_take_the_smallest_ttl_and_any_private() {
        let stateless = |ttl, private| Lists {
            hints: [Some(Hint { ttl_ms: ttl, private }); 4],
            ..Lists::default()
        };
        let (a, b, legacy) = (stateless(60_000, false), stateless(5_000, true), Lists::default());
        let filter = crate::config::Filter::default();
        let none = IndexMap::new();
        let src = |lists| Source {
            server: "s",
            prefix: "",
            lists,
            filter: &filter,
            overrides: &none,
            instructions: None,
        };
        let both = Catalog::build("__", &[src(&a), src(&b)]);
        assert_eq!(
            both.hint(Method::ToolsList),
            Some(Hint {
                ttl_ms: 5_000,
                private: true
            })
        );
        let one = Catalog::build("__", &[src(&a)]);
        assert_eq!(
            one.hint(Method::PromptsList),
            Some(Hint {
                ttl_ms: 60_000,
                private: false
            })
        );
        let mixed = Catalog::build("__", &[src(&a), src(&legacy)]);
        assert_eq!(
            mixed.hint(Method::ResourcesList),
            Some(Hint {
                ttl_ms: 0,
                private: false
            })
        );
        assert_eq!(mixed.hint(Method::ToolsCall), None);
    }

    #[test]
    fn visible_counts_follow_the_filter_and_leave_out_what_another_server_owns() {
        let item = |k: &str, v: &str| {
            let mut m = Map::new();
            m.insert(k.into(), Value::String(v.into()));
            m
        };
        let lists = |tools: &[&str], uri: &str| Lists {
            tools: tools.iter().map(|t| item("name", t)).collect(),
            prompts: vec![item("name", "greet")],
            resources: vec![item("uri", uri)],
            ..Lists::default()
        };
        let (a, b) = (
            lists(&["echo", "add", "big"], "x://shared"),
            lists(&["echo"], "x://shared"),
        );
        let only = crate::config::Filter {
            allow: vec!["echo".into(), "add".into()],
            deny: vec![],
        };
        let all = crate::config::Filter::default();
        let cat = Catalog::build(
            "__",
            &[
                Source {
                    server: "a",
                    prefix: "",
                    lists: &a,
                    filter: &only,
                    overrides: &IndexMap::new(),
                    instructions: None,
                },
                Source {
                    server: "b",
                    prefix: "",
                    lists: &b,
                    filter: &all,
                    overrides: &IndexMap::new(),
                    instructions: None,
                },
            ],
        );
        // b's echo and greet collide and are renamed (still seen); its resource is a's.
        assert_eq!(cat.visible(2), [[2, 1, 1], [1, 1, 0]]);
        assert_eq!(cat.visible(1), [[2, 1, 1]]);
    }

    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> Map<String, Value> {
        json!({"name": name, "description": "d", "inputSchema": {"type": "object"}, "x-extra": 1})
            .as_object()
            .cloned()
            .unwrap()
    }

    #[test]
    fn names_are_prefixed_and_routed() {
        let a = Lists {
            tools: vec![tool("add"), tool("delete_all")],
            ..Default::default()
        };
        let b = Lists {
            tools: vec![tool("add")],
            ..Default::default()
        };
        let all = Filter::default();
        let no_delete = Filter {
            allow: vec![],
            deny: vec!["delete_*".into()],
        };
        let c = Catalog::build(
            "__",
            &[
                Source {
                    server: "calc",
                    prefix: "calc",
                    lists: &a,
                    filter: &no_delete,
                    overrides: &IndexMap::new(),
                    instructions: None,
                },
                Source {
                    server: "other",
                    prefix: "",
                    lists: &b,
                    filter: &all,
                    overrides: &IndexMap::new(),
                    instructions: None,
                },
            ],
        );
        assert_eq!(
            c.tools["calc__add"],
            Route {
                server: 0,
                name: "add".into(),
                natural: None,
            }
        );
        assert_eq!(
            c.tools["add"],
            Route {
                server: 1,
                name: "add".into(),
                natural: None,
            }
        );
        assert!(!c.tools.contains_key("calc__delete_all"));
        // Each item as listed, its public name in the name's place, nothing else touched.
        let item =
            |name: &str| json!({"name": name, "description": "d", "inputSchema": {"type": "object"}, "x-extra": 1});
        assert_eq!(
            c.tools_result.get(),
            json!({"tools": [item("calc__add"), item("add")]}).to_string()
        );
        let empty = Catalog::build("__", &[]);
        assert_eq!(empty.tools_result.get(), r#"{"tools":[]}"#);
        assert_eq!(empty.prompts_result.get(), r#"{"prompts":[]}"#);
        assert_eq!(empty.resources_result.get(), r#"{"resources":[]}"#);
        assert_eq!(empty.templates_result.get(), r#"{"resourceTemplates":[]}"#);
    }

    #[test]
    fn collisions_and_long_names_are_hashed() {
        let a = Lists {
            tools: vec![tool("x__y")],
            ..Default::default()
        };
        let b = Lists {
            tools: vec![tool("y"), tool(&"n".repeat(80)), tool("has space")],
            ..Default::default()
        };
        let all = Filter::default();
        let c = Catalog::build(
            "__",
            &[
                Source {
                    server: "a",
                    prefix: "",
                    lists: &a,
                    filter: &all,
                    overrides: &IndexMap::new(),
                    instructions: None,
                },
                Source {
                    server: "b",
                    prefix: "x",
                    lists: &b,
                    filter: &all,
                    overrides: &IndexMap::new(),
                    instructions: None,
                },
            ],
        );
        assert_eq!(c.tools["x__y"].server, 0);
        let renamed: Vec<_> = c
            .tools
            .iter()
            .filter(|(_, r)| r.server == 1)
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(renamed.len(), 3);
        for n in &renamed {
            assert!(n.len() <= MAX_NAME && n.chars().all(name_char), "{n}");
        }
        assert!(c.notes.iter().any(|n| n.contains("collision")));
        // Deterministic.
        assert_eq!(
            public_name("x", "__", &"n".repeat(80), "b"),
            public_name("x", "__", &"n".repeat(80), "b")
        );
    }
}
