//! Views: the part of the catalog an endpoint shows. `{gateway.path}` shows the whole
//! catalog (no view at all, so nothing here runs for it); `{gateway.path}/{NAME}` shows
//! `[profiles.NAME]`; `{gateway.path}?tags=web,db` shows the servers with any of those
//! tags (`web+db`: both).
//!
//! A view is a filter over the merged catalog, so a tool has the same public name on
//! every endpoint: its servers (by index in gateway.toml order), and for a profile its
//! `tools` globs over public names. Each view has its own list results, made once per
//! catalog ([`View::build`]); [`Views`] holds them for one topology: the profiles' made
//! with the catalog, tag queries' on first use and kept in a bounded cache. A session
//! or request names its view by [`ViewKey`] and looks it up by hash.
//!
//! [`Announcement`] is a list_changed with the views it is about ([`Reach`]), so a
//! session hears only of changes to what it sees.

use super::{Catalog, Route};
use crate::config::{Filter, Profile, Server};
use crate::message;
use crate::method::Method;
use bytes::Bytes;
use indexmap::IndexMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Distinct tag queries whose views one topology keeps at most (the oldest goes first).
pub const MAX_TAG_VIEWS: usize = 64;
/// Longest `?tags=` value accepted, in bytes.
pub const MAX_TAG_QUERY: usize = 512;

/// Which view a session or request sees. `None` in its place: the whole catalog.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ViewKey {
    /// `[profiles.NAME]`, by name.
    Profile(Arc<str>),
    /// A `?tags=` query in its normal form ([`TagQuery::key`]).
    Tags(Arc<str>),
}

impl ViewKey {
    /// Its text in session records and cluster notes: `profile:NAME` or `tags:QUERY`.
    pub fn encode(&self) -> String {
        match self {
            ViewKey::Profile(n) => format!("profile:{n}"),
            ViewKey::Tags(q) => format!("tags:{q}"),
        }
    }

    pub fn decode(s: &str) -> Option<ViewKey> {
        if let Some(n) = s.strip_prefix("profile:") {
            return Some(ViewKey::Profile(n.into()));
        }
        let q = TagQuery::parse(s.strip_prefix("tags:")?).ok()?;
        Some(ViewKey::Tags(q.key()))
    }
}

impl fmt::Display for ViewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewKey::Profile(n) => write!(f, "profile {n}"),
            ViewKey::Tags(q) => write!(f, "tags {q}"),
        }
    }
}

/// A `?tags=` query: servers matching any of its groups; a group matches a server that
/// has every one of its tags. `web,db` is two groups, `web+db` one group of two (a `+`
/// decoded as a space, as forms encode it, joins too).
#[derive(Debug, Clone, PartialEq)]
pub struct TagQuery {
    /// Each group sorted, the groups sorted, nothing twice.
    groups: Vec<Vec<String>>,
}

impl TagQuery {
    /// The value of `tags=` as sent (percent-encoding allowed).
    pub fn parse(raw: &str) -> Result<TagQuery, String> {
        if raw.len() > MAX_TAG_QUERY {
            return Err(format!("?tags= is longer than {MAX_TAG_QUERY} bytes"));
        }
        let text = percent_decode(raw).ok_or("?tags= is not valid percent-encoded UTF-8")?;
        let mut groups: Vec<Vec<String>> = Vec::new();
        for group in text.split(',') {
            let mut tags: Vec<String> = group
                .split(['+', ' '])
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect();
            if tags.is_empty() {
                continue;
            }
            if let Some(bad) = tags.iter().find(|t| !t.chars().all(crate::config::name_char)) {
                return Err(format!("?tags=: {bad:?} is not a tag (tags use [A-Za-z0-9_.-])"));
            }
            tags.sort();
            tags.dedup();
            groups.push(tags);
        }
        if groups.is_empty() {
            return Err("?tags= names no tag: write ?tags=web,db (any of them) or ?tags=web+db (both)".into());
        }
        groups.sort();
        groups.dedup();
        Ok(TagQuery { groups })
    }

    /// The normal form: groups joined by `,`, a group's tags by `+`, all sorted.
    pub fn key(&self) -> Arc<str> {
        let groups: Vec<String> = self.groups.iter().map(|g| g.join("+")).collect();
        groups.join(",").into()
    }

    /// Every tag it names.
    pub fn tags(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().flatten().map(String::as_str)
    }

    pub fn matches(&self, tags: &[String]) -> bool {
        self.groups.iter().any(|g| g.iter().all(|t| tags.contains(t)))
    }
}

/// `%XX` decoded; `None` when an escape is broken or the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The value of the `tags` parameter of a query string, if any. A `tags` given twice, or
/// without `=`, is refused: which one a proxy in front reads would be a guess.
pub fn tags_param(query: &str) -> Result<Option<&str>, &'static str> {
    let mut found = None;
    for kv in query.split('&') {
        let value = match kv.split_once('=') {
            Some(("tags", v)) => v,
            None if kv == "tags" => return Err("?tags needs a value: ?tags=web,db"),
            _ => continue,
        };
        if found.replace(value).is_some() {
            return Err("?tags= is given more than once: give it once, tags joined by , (any) or + (all)");
        }
    }
    Ok(found)
}

/// A catalog's four list results, as one view (or one restricted client) sees them.
#[derive(Debug)]
pub struct Results {
    pub tools: Box<RawValue>,
    pub prompts: Box<RawValue>,
    pub resources: Box<RawValue>,
    pub templates: Box<RawValue>,
}

impl Results {
    /// The result of list method `m`.
    pub fn of(&self, m: Method) -> &RawValue {
        match m {
            Method::ToolsList => &self.tools,
            Method::PromptsList => &self.prompts,
            Method::ResourcesList => &self.resources,
            _ => &self.templates,
        }
    }

    /// The catalog's own.
    pub fn of_catalog(c: &Catalog) -> [&RawValue; 4] {
        [
            &c.tools_result,
            &c.prompts_result,
            &c.resources_result,
            &c.templates_result,
        ]
    }
}

/// `{key: [items]}` keeping the items `keep` keeps (given each one's place in the list).
pub fn filter_result(result: &RawValue, key: &str, mut keep: impl FnMut(usize, &Value) -> bool) -> Box<RawValue> {
    let mut m: Map<String, Value> = serde_json::from_str(result.get()).unwrap_or_default();
    if let Some(Value::Array(items)) = m.get_mut(key) {
        let mut i = 0;
        items.retain(|item| {
            let kept = keep(i, item);
            i += 1;
            kept
        });
    }
    message::to_raw(&Value::Object(m))
}

/// One view of one catalog: which servers and tools it shows, and its list results.
#[derive(Debug)]
pub struct View {
    pub key: ViewKey,
    /// By server index (gateway.toml order); past the end: not in the view.
    servers: Vec<bool>,
    /// A profile's `tools` globs over public names.
    tools: Filter,
    /// `[profiles.NAME] search`: its `tools/list` is the gateway's search tools.
    pub search: bool,
    pub lists: Results,
    /// How many tools, prompts, resources and templates it shows.
    pub counts: [usize; 4],
}

impl View {
    /// Its name as `/status` and `check` show it: a profile's name, or the tag query.
    pub fn name(&self) -> String {
        match &self.key {
            ViewKey::Profile(n) => n.to_string(),
            other => other.to_string(),
        }
    }

    /// The names of `servers` (the topology's, in order) that are in the view.
    pub fn server_names<'a>(&self, servers: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        servers
            .into_iter()
            .enumerate()
            .filter(|(i, _)| self.has_server(*i))
            .map(|(_, s)| s)
            .collect()
    }
}

impl View {
    /// The view of `catalog` with `servers` (by index) and `tools` (public-name globs).
    pub fn build(key: ViewKey, servers: Vec<bool>, tools: Filter, search: bool, catalog: &Catalog) -> View {
        let has = |i: usize| servers.get(i).copied().unwrap_or(false);
        let route = |table: &HashMap<String, Route>, item: &Value| -> Option<(String, usize)> {
            let n = item.get("name").and_then(Value::as_str)?;
            table.get(n).map(|r| (n.to_owned(), r.server))
        };
        let tools_list = filter_result(&catalog.tools_result, "tools", |_, item| {
            route(&catalog.tools, item).is_some_and(|(n, s)| has(s) && tools.permits_in(catalog, &n))
        });
        let prompts = filter_result(&catalog.prompts_result, "prompts", |_, item| {
            route(&catalog.prompts, item).is_some_and(|(_, s)| has(s))
        });
        let resources = filter_result(&catalog.resources_result, "resources", |_, item| {
            item.get("uri")
                .and_then(Value::as_str)
                .and_then(|u| catalog.resources.get(u))
                .is_some_and(|&s| has(s))
        });
        // Templates keep the catalog's order: the n-th item is the n-th template.
        let templates = filter_result(&catalog.templates_result, "resourceTemplates", |i, _| {
            catalog.templates.get(i).is_some_and(|&(_, s)| has(s))
        });
        let count = |r: &RawValue, key: &str| {
            serde_json::from_str::<Map<String, Value>>(r.get())
                .ok()
                .and_then(|m| m.get(key).and_then(Value::as_array).map(Vec::len))
                .unwrap_or(0)
        };
        let counts = [
            count(&tools_list, "tools"),
            count(&prompts, "prompts"),
            count(&resources, "resources"),
            count(&templates, "resourceTemplates"),
        ];
        View {
            key,
            servers,
            tools,
            search,
            lists: Results {
                tools: tools_list,
                prompts,
                resources,
                templates,
            },
            counts,
        }
    }

    /// A view that shows nothing: a session's profile that a reload removed.
    pub fn empty(key: ViewKey) -> View {
        View::build(key, Vec::new(), Filter::default(), false, &Catalog::default())
    }

    /// Whether server `i` (gateway.toml order) is in the view.
    pub fn has_server(&self, i: usize) -> bool {
        self.servers.get(i).copied().unwrap_or(false)
    }

    /// Whether the view shows tool `name` of `catalog`, routed to server `server`.
    pub fn has_tool(&self, catalog: &Catalog, name: &str, server: usize) -> bool {
        self.has_server(server) && self.tools.permits_in(catalog, name)
    }

    /// The view of `[profiles.NAME]` over `catalog`, its servers chosen from `servers`.
    pub fn of_profile(p: &Profile, servers: &[Server], catalog: &Catalog) -> View {
        let chosen = servers.iter().map(|s| p.includes(s)).collect();
        View::build(
            ViewKey::Profile(p.name.as_str().into()),
            chosen,
            p.tools.clone(),
            p.search,
            catalog,
        )
    }

    /// The view of a tag query over `catalog`.
    pub fn of_tags(q: &TagQuery, servers: &[Server], catalog: &Catalog) -> View {
        let chosen = servers.iter().map(|s| q.matches(&s.tags)).collect();
        View::build(ViewKey::Tags(q.key()), chosen, Filter::default(), false, catalog)
    }
}

/// Why a `?tags=` query has no view.
#[derive(Debug, Clone, PartialEq)]
pub enum TagRefusal {
    /// It is not a tag query.
    Malformed(String),
    /// It names a tag no server has.
    Unknown(String),
}

/// The views of one topology: every profile's, made with its catalog, and the tag
/// queries' asked for so far (at most [`MAX_TAG_VIEWS`]).
#[derive(Debug, Default)]
pub struct Views {
    /// By name; config order is `order`.
    profiles: HashMap<Arc<str>, Arc<View>>,
    order: Vec<Arc<str>>,
    tags: Mutex<TagViews>,
}

#[derive(Debug, Default)]
struct TagViews {
    /// By normal form, oldest first.
    views: IndexMap<Arc<str>, Arc<View>>,
    /// A query as sent → its normal form (the same few strings, sent again and again).
    aliases: IndexMap<Box<str>, Arc<str>>,
}

impl Views {
    /// The views of `catalog`: each profile's, and those of the tag queries `tags` (in
    /// normal form: the ones the topology before had, so their sessions hear of changes).
    pub fn build(profiles: &[Profile], servers: &[Server], catalog: &Catalog, tags: &[Arc<str>]) -> Views {
        let mut out = Views::default();
        for p in profiles {
            let v = Arc::new(View::of_profile(p, servers, catalog));
            let name: Arc<str> = p.name.as_str().into();
            out.order.push(name.clone());
            out.profiles.insert(name, v);
        }
        let mut cache = TagViews::default();
        for key in tags.iter().take(MAX_TAG_VIEWS) {
            if let Ok(q) = TagQuery::parse(key) {
                cache
                    .views
                    .insert(key.clone(), Arc::new(View::of_tags(&q, servers, catalog)));
            }
        }
        out.tags = Mutex::new(cache);
        out
    }

    /// The profile named `name`.
    pub fn profile(&self, name: &str) -> Option<&Arc<View>> {
        self.profiles.get(name)
    }

    /// Every profile's view, in config order.
    pub fn profiles(&self) -> impl Iterator<Item = &Arc<View>> {
        self.order.iter().filter_map(|n| self.profiles.get(n))
    }

    /// The profile names, in config order.
    pub fn names(&self) -> Vec<&str> {
        self.order.iter().map(|n| &**n).collect()
    }

    /// The tag queries whose views are kept, in normal form.
    pub fn tag_keys(&self) -> Vec<Arc<str>> {
        crate::sync::lock(&self.tags).views.keys().cloned().collect()
    }

    /// The view of a tag query as sent (`raw`, the value of `tags=`): from the cache,
    /// or made now.
    pub fn tags(&self, raw: &str, servers: &[Server], catalog: &Catalog) -> Result<Arc<View>, TagRefusal> {
        {
            let cache = crate::sync::lock(&self.tags);
            if let Some(v) = cache.aliases.get(raw).and_then(|k| cache.views.get(k)) {
                return Ok(v.clone());
            }
        }
        let q = TagQuery::parse(raw).map_err(TagRefusal::Malformed)?;
        if let Some(unknown) = q
            .tags()
            .find(|t| !servers.iter().any(|s| s.tags.iter().any(|x| x == t)))
        {
            let mut all: Vec<&str> = servers.iter().flat_map(|s| s.tags.iter().map(String::as_str)).collect();
            all.sort_unstable();
            all.dedup();
            return Err(TagRefusal::Unknown(format!(
                "no server has the tag {unknown:?} (tags: {})",
                if all.is_empty() {
                    "none".to_owned()
                } else {
                    all.join(", ")
                }
            )));
        }
        let key = q.key();
        let view = self.tag_view(&key, &q, servers, catalog);
        let mut cache = crate::sync::lock(&self.tags);
        if cache.aliases.len() >= MAX_TAG_VIEWS * 4 {
            cache.aliases.shift_remove_index(0);
        }
        cache.aliases.insert(raw.into(), key);
        Ok(view)
    }

    /// The view of tag query `key` (normal form), made and kept if it is not.
    fn tag_view(&self, key: &Arc<str>, q: &TagQuery, servers: &[Server], catalog: &Catalog) -> Arc<View> {
        if let Some(v) = crate::sync::lock(&self.tags).views.get(key) {
            return v.clone();
        }
        // Made outside the lock; two requests may make it at once, the first is kept.
        let made = Arc::new(View::of_tags(q, servers, catalog));
        let mut cache = crate::sync::lock(&self.tags);
        if let Some(v) = cache.views.get(key) {
            return v.clone();
        }
        if cache.views.len() >= MAX_TAG_VIEWS {
            cache.views.shift_remove_index(0);
        }
        cache.views.insert(key.clone(), made.clone());
        made
    }

    /// The view `key` names now: a profile a reload removed shows nothing; a tag query
    /// the cache let go is made again.
    pub fn get(&self, key: &ViewKey, servers: &[Server], catalog: &Catalog) -> Arc<View> {
        match key {
            ViewKey::Profile(name) => self
                .profiles
                .get(name)
                .cloned()
                .unwrap_or_else(|| Arc::new(View::empty(key.clone()))),
            ViewKey::Tags(q) => match TagQuery::parse(q) {
                Ok(parsed) => self.tag_view(q, &parsed, servers, catalog),
                Err(_) => Arc::new(View::empty(key.clone())),
            },
        }
    }

    /// The kept view of `key`, without making one.
    pub fn kept(&self, key: &ViewKey) -> Option<Arc<View>> {
        match key {
            ViewKey::Profile(name) => self.profiles.get(name).cloned(),
            ViewKey::Tags(q) => crate::sync::lock(&self.tags).views.get(q).cloned(),
        }
    }

    /// Every view kept, profiles first.
    pub fn all(&self) -> Vec<Arc<View>> {
        let mut out: Vec<Arc<View>> = self.profiles().cloned().collect();
        out.extend(crate::sync::lock(&self.tags).views.values().cloned());
        out
    }
}

/// Which sessions a list_changed is for: those of the whole catalog when `main`, and
/// those of the views in `changed`. A view not in `known` (a tag query not kept when the
/// catalog changed) is told whenever the whole catalog's list changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reach {
    pub main: bool,
    pub changed: HashSet<ViewKey>,
    pub known: HashSet<ViewKey>,
}

impl Reach {
    pub fn reaches(&self, view: Option<&ViewKey>) -> bool {
        match view {
            None => self.main,
            Some(k) => self.changed.contains(k) || (self.main && !self.known.contains(k)),
        }
    }
}

/// A server-initiated message for sessions (a list_changed), and whom it is for.
#[derive(Debug, Clone)]
pub struct Announcement {
    pub line: Bytes,
    /// `None`: every session.
    pub reach: Option<Arc<Reach>>,
}

impl Announcement {
    /// Whether a session that sees `view` (none: the whole catalog) is told.
    pub fn reaches(&self, view: Option<&ViewKey>) -> bool {
        self.reach.as_ref().is_none_or(|r| r.reaches(view))
    }
}

/// The next line on `rx` for a session that sees `view` (none: the whole catalog);
/// the others are skipped. Cancel-safe, as `recv` is.
pub async fn recv_for(
    rx: &mut tokio::sync::broadcast::Receiver<Announcement>,
    view: Option<&ViewKey>,
) -> Result<Bytes, tokio::sync::broadcast::error::RecvError> {
    loop {
        let a = rx.recv().await?;
        if a.reaches(view) {
            return Ok(a.line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Lists, Source};
    use serde_json::json;

    #[test]
    fn tag_queries_have_one_normal_form() {
        let key = |s: &str| TagQuery::parse(s).map(|q| q.key().to_string());
        assert_eq!(key("web,db").unwrap(), "db,web");
        assert_eq!(key("web+db,web").unwrap(), "db+web,web");
        assert_eq!(key("db%2Bweb").unwrap(), "db+web");
        assert_eq!(key("web db").unwrap(), "db+web", "a + decoded as a space");
        assert_eq!(key("web%2Cdb,,web").unwrap(), "db,web");
        assert!(key("").is_err() && key(",+").is_err() && key("a/b").is_err() && key("%zz").is_err());
        let q = TagQuery::parse("web+db,vcs").unwrap();
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(q.matches(&tags(&["db", "web"])) && q.matches(&tags(&["vcs"])));
        assert!(!q.matches(&tags(&["web"])) && !q.matches(&[]));
        assert_eq!(tags_param("a=1&tags=web&b"), Ok(Some("web")));
        assert_eq!(tags_param("tagsx=1"), Ok(None));
        assert!(tags_param("tags=web&tags=db").is_err());
        assert!(tags_param("tags=&tags=web").is_err());
        assert!(tags_param("tags").is_err());
        for k in [ViewKey::Profile("p".into()), ViewKey::Tags("db+web".into())] {
            assert_eq!(ViewKey::decode(&k.encode()), Some(k));
        }
    }

    fn item(k: &str, v: &str) -> Map<String, Value> {
        json!({ k: v }).as_object().cloned().unwrap()
    }

    #[test]
    fn a_view_keeps_its_servers_items_and_its_tools() {
        let lists = |tools: &[&str], uri: &str, template: &str| Lists {
            tools: tools.iter().map(|t| item("name", t)).collect(),
            prompts: vec![item("name", "greet")],
            resources: vec![item("uri", uri)],
            templates: vec![item("uriTemplate", template)],
            ..Lists::default()
        };
        let (a, b) = (
            lists(&["echo", "delete_all"], "a://r", "a://{x}"),
            lists(&["echo"], "b://r", "b://{x}"),
        );
        let all = Filter::default();
        let none = IndexMap::new();
        let src = |server, lists| Source {
            server,
            prefix: server,
            lists,
            filter: &all,
            overrides: &none,
            instructions: None,
        };
        let catalog = Catalog::build("__", &[src("a", &a), src("b", &b)]);
        let tools = Filter {
            allow: vec![],
            deny: vec!["*delete*".into()],
        };
        let v = View::build(ViewKey::Profile("p".into()), vec![true, false], tools, false, &catalog);
        let names = |r: &RawValue, key: &str, field: &str| -> Vec<String> {
            let v: Value = serde_json::from_str(r.get()).unwrap();
            v[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i[field].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names(&v.lists.tools, "tools", "name"), ["a__echo"]);
        assert_eq!(names(&v.lists.prompts, "prompts", "name"), ["a__greet"]);
        assert_eq!(names(&v.lists.resources, "resources", "uri"), ["a://r"]);
        assert_eq!(
            names(&v.lists.templates, "resourceTemplates", "uriTemplate"),
            ["a://{x}"]
        );
        assert_eq!(v.counts, [1, 1, 1, 1]);
        assert!(
            v.has_tool(&catalog, "a__echo", 0)
                && !v.has_tool(&catalog, "a__delete_all", 0)
                && !v.has_tool(&catalog, "b__echo", 1)
        );
        assert_eq!(View::empty(ViewKey::Profile("gone".into())).counts, [0; 4]);
    }

    #[test]
    fn reach_tells_the_views_that_changed_and_unkept_ones_with_the_main_list() {
        let (p, q, t) = (
            ViewKey::Profile("p".into()),
            ViewKey::Profile("q".into()),
            ViewKey::Tags("web".into()),
        );
        let r = Reach {
            main: true,
            changed: [p.clone()].into(),
            known: [p.clone(), q.clone()].into(),
        };
        assert!(r.reaches(None) && r.reaches(Some(&p)) && !r.reaches(Some(&q)) && r.reaches(Some(&t)));
        let quiet = Reach {
            main: false,
            ..r.clone()
        };
        assert!(!quiet.reaches(None) && quiet.reaches(Some(&p)) && !quiet.reaches(Some(&t)));
        let all = Announcement {
            line: Bytes::new(),
            reach: None,
        };
        assert!(all.reaches(None) && all.reaches(Some(&q)));
    }
}
