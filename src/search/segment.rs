//! One server's tools analyzed for the index ([`Segment`]), and the cache that keeps the
//! segments between catalogs ([`cached`]).
//!
//! Everything the index knows of a tool but its weights depends on the tool and its own
//! server only: its terms in each field, its fields' lengths, which words its server's
//! tools all share. So a catalog's index is put together from one segment a server
//! ([`super::Index::assemble`]: the terms merged, compounds split, IDF and BM25F weights
//! computed), and after a list_changed only the server whose list changed is analyzed
//! again; the other servers' segments come from the cache, found by their exact text.

use super::{
    entry, parameters, semantic_text, shared_description_words, shared_name_words, text, writes, Doc, Listed, Map32,
    RawPostings, Schema, Tool, DESCRIPTION, FIELDS, INSTRUCTIONS, NAME, PARAM_DESCRIPTIONS, PARAM_NAMES, SCHEMA_DEPTH,
    SERVER, TITLE,
};
use serde_json::value::RawValue;
use std::sync::{Arc, Mutex, Weak};

/// One server's tools, analyzed.
#[derive(Debug)]
pub(super) struct Segment {
    pub docs: Vec<Doc>,
    /// Each tool's text for a sentence-embedding model.
    pub texts: Vec<Box<str>>,
    /// Each tool's number of terms in each field.
    pub lengths: Vec<[u32; FIELDS.len()]>,
    /// Its terms, sorted, each with its documents (numbered within the segment).
    pub terms: Vec<(Box<str>, RawPostings)>,
}

impl Segment {
    /// Analyzes `tools`, all of one server (the same name, prefix and instructions).
    pub fn analyze(tools: &[Tool<'_>]) -> Segment {
        let own_names: Vec<&str> = tools
            .iter()
            .map(|t| {
                t.name
                    .strip_prefix(t.prefix)
                    .filter(|rest| !rest.is_empty())
                    .unwrap_or(t.name)
            })
            .collect();
        let shared = shared_name_words(tools, &own_names);
        // Each description's terms, and the ones most of a server's descriptions say (a
        // server's boilerplate: "It is read-only and does not mutate GitLab data"), which
        // count as the server's instructions rather than as what the tool does.
        let descriptions: Vec<Vec<String>> = tools
            .iter()
            .map(|t| {
                let mut v = Vec::new();
                text::terms(t.description, |term| v.push(term.to_owned()));
                v
            })
            .collect();
        let boilerplate = shared_description_words(tools, &descriptions);
        // The server's instructions are the same words for each of its tools: split once.
        let mut instructions: Vec<String> = Vec::new();
        if let Some(i) = tools.first().and_then(|t| t.instructions) {
            text::terms(i, |term| instructions.push(term.to_owned()));
        }
        // term → (doc, frequency in each field)
        let mut raw: Map32<String, RawPostings> = Map32::default();
        let mut lengths: Vec<[u32; FIELDS.len()]> = Vec::with_capacity(tools.len());
        let mut docs = Vec::with_capacity(tools.len());
        let mut texts = Vec::with_capacity(tools.len());
        for (t, own) in tools.iter().zip(&own_names) {
            let doc = docs.len() as u32;
            let mut len = [0u32; FIELDS.len()];
            let mut add_term = |field: usize, term: &str| {
                len[field] += 1;
                let postings = match raw.get_mut(term) {
                    Some(p) => p,
                    None => raw.entry(term.to_owned()).or_default(),
                };
                match postings.last_mut() {
                    // A name says a word once however often it spells it (`merge_merge_request`).
                    Some((d, tf)) if *d == doc && field == NAME && tf[NAME] > 0 => {}
                    Some((d, tf)) if *d == doc => tf[field] = tf[field].saturating_add(1),
                    _ => {
                        let mut tf = [0u16; FIELDS.len()];
                        tf[field] = 1;
                        postings.push((doc, tf));
                    }
                }
            };
            // A word nearly every tool of the server has in its name (`browser_`,
            // `API-`, `jira_`) says which server, not which tool.
            let mut first_own: Option<String> = None;
            let mut name_terms: Vec<String> = Vec::new();
            text::terms(own, |term| {
                let field = if shared.contains(&(t.server, term.to_owned())) {
                    SERVER
                } else {
                    first_own.get_or_insert_with(|| term.to_owned());
                    if !name_terms.iter().any(|n| n == term) {
                        name_terms.push(term.to_owned());
                    }
                    NAME
                };
                add_term(field, term);
            });
            let writes = writes(t.read_only, first_own.as_deref());
            for term in &descriptions[doc as usize] {
                let field = if boilerplate.contains(&(t.server, term.as_str())) {
                    INSTRUCTIONS
                } else {
                    DESCRIPTION
                };
                add_term(field, term);
            }
            let mut add = |field: usize, text: &str| text::terms(text, |term| add_term(field, term));
            if let Some(title) = t.title {
                add(TITLE, title);
            }
            if let Some(schema) = t
                .input_schema
                .and_then(|s| serde_json::from_str::<Schema>(s.get()).ok())
            {
                parameters(&schema, SCHEMA_DEPTH, &mut |name, desc| {
                    add(PARAM_NAMES, name);
                    if let Some(d) = desc {
                        add(PARAM_DESCRIPTIONS, d);
                    }
                });
            }
            add(SERVER, t.server);
            for term in &instructions {
                add_term(INSTRUCTIONS, term);
            }
            lengths.push(len);
            texts.push(semantic_text(t.server, own, t.title, t.description));
            docs.push(Doc {
                name: t.name.into(),
                entry: Arc::from(entry(t.name, t.description, t.input_schema)),
                writes,
                name_terms: name_terms.len().min(u8::MAX as usize) as u8,
            });
        }
        let mut terms: Vec<(Box<str>, RawPostings)> = raw
            .into_iter()
            .map(|(term, postings)| (term.into_boxed_str(), postings))
            .collect();
        terms.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Segment {
            docs,
            texts,
            lengths,
            terms,
        }
    }
}

/// The segments an index was put together from: it keeps them alive, and so in the cache.
pub(super) struct Held(pub Vec<Arc<Segment>>);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} segments", self.0.len())
    }
}

/// One server's tools as a catalog lists them: what its segment is made from, and what
/// finds the segment again in the cache.
pub struct Group<'a> {
    pub server: &'a str,
    /// Its prefix and separator.
    pub prefix: &'a str,
    pub instructions: Option<&'a str>,
    /// Its tools as the merged list has them (public names, overrides applied).
    pub tools: &'a [&'a RawValue],
}

impl Group<'_> {
    fn analyze(&self) -> Segment {
        // A tool that is not an object is left out (a catalog lists none such).
        let listed: Vec<Listed<'_>> = self
            .tools
            .iter()
            .filter_map(|t| serde_json::from_str::<Listed>(t.get()).ok())
            .collect();
        let tools: Vec<Tool<'_>> = listed
            .iter()
            .map(|l| l.tool(self.prefix, self.server, self.instructions))
            .collect();
        Segment::analyze(&tools)
    }
}

/// A segment made earlier, the exact text it was made from, and the segment while some
/// index still uses it.
struct Cached {
    server: Box<str>,
    prefix: Box<str>,
    instructions: Option<Box<str>>,
    tools: Vec<Box<str>>,
    segment: Weak<Segment>,
}

impl Cached {
    fn is(&self, g: &Group<'_>) -> bool {
        *self.server == *g.server
            && *self.prefix == *g.prefix
            && self.instructions.as_deref() == g.instructions
            && self.tools.len() == g.tools.len()
            && self.tools.iter().zip(g.tools).all(|(a, b)| **a == *b.get())
    }
}

/// The segments of the indexes alive (each index holds its own), and those of the last
/// build even when its index is gone (a new catalog's index may be built after the old
/// catalog was dropped). So it holds no more than what is in use, whatever a server does
/// to its list, and a segment nothing uses is forgotten at the next build.
struct Cache {
    entries: Vec<Cached>,
    last: Vec<Arc<Segment>>,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    entries: Vec::new(),
    last: Vec::new(),
});

/// The segments of `groups`: each from the cache when a segment was made from exactly
/// its text, else analyzed now (outside the cache's lock) and kept.
pub(super) fn cached(groups: &[Group<'_>]) -> Vec<Arc<Segment>> {
    let found: Vec<Option<Arc<Segment>>> = {
        let cache = crate::sync::lock(&CACHE);
        groups
            .iter()
            .map(|g| cache.entries.iter().find(|c| c.is(g)).and_then(|c| c.segment.upgrade()))
            .collect()
    };
    let mut made = Vec::new();
    let out: Vec<Arc<Segment>> = found
        .into_iter()
        .zip(groups)
        .map(|(hit, g)| {
            hit.unwrap_or_else(|| {
                let segment = Arc::new(g.analyze());
                made.push((g, Arc::downgrade(&segment)));
                segment
            })
        })
        .collect();
    let mut cache = crate::sync::lock(&CACHE);
    cache.last = out.clone();
    cache.entries.retain(|c| c.segment.strong_count() > 0);
    for (g, segment) in made {
        if let Some(c) = cache.entries.iter_mut().find(|c| c.is(g)) {
            c.segment = segment;
            continue;
        }
        cache.entries.push(Cached {
            server: g.server.into(),
            prefix: g.prefix.into(),
            instructions: g.instructions.map(Box::from),
            tools: g.tools.iter().map(|t| Box::from(t.get())).collect(),
            segment,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: serde_json::Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    #[test]
    fn a_server_whose_tools_are_unchanged_is_not_analyzed_again() {
        let a = [raw(
            serde_json::json!({"name": "segtest__create_ticket", "description": "Open a ticket."}),
        )];
        let b = [raw(
            serde_json::json!({"name": "segtest2__close_ticket", "description": "Close a ticket."}),
        )];
        let b2 = [raw(
            serde_json::json!({"name": "segtest2__close_ticket", "description": "Close a zeppelin ticket."}),
        )];
        let (a, b, b2): (Vec<&RawValue>, Vec<&RawValue>, Vec<&RawValue>) = (
            a.iter().map(|r| &**r).collect(),
            b.iter().map(|r| &**r).collect(),
            b2.iter().map(|r| &**r).collect(),
        );
        let group = |server, prefix, tools| Group {
            server,
            prefix,
            instructions: None,
            tools,
        };
        let first = cached(&[group("segtest", "segtest__", &a), group("segtest2", "segtest2__", &b)]);
        let again = cached(&[group("segtest", "segtest__", &a), group("segtest2", "segtest2__", &b2)]);
        assert!(Arc::ptr_eq(&first[0], &again[0]), "unchanged: the cached segment");
        assert!(!Arc::ptr_eq(&first[1], &again[1]), "changed: analyzed again");
        assert!(again[1].terms.iter().any(|(t, _)| &**t == "zeppelin"));
        // The same tools under another server's name are that server's: never the cached one.
        let other = cached(&[group("segtest3", "segtest__", &a)]);
        assert!(!Arc::ptr_eq(&first[0], &other[0]));
        assert!(other[0].terms.iter().any(|(t, _)| &**t == "segtest3"));
        let instructed = cached(&[Group {
            instructions: Some("Tickets of the help desk."),
            ..group("segtest", "segtest__", &a)
        }]);
        assert!(!Arc::ptr_eq(&first[0], &instructed[0]));
    }

    #[test]
    fn a_segment_no_index_uses_is_forgotten_at_the_next_build() {
        let a = [raw(serde_json::json!({"name": "segforget__x", "description": "A."}))];
        let b = [raw(serde_json::json!({"name": "segforget2__y", "description": "B."}))];
        let group = |server, tools| Group {
            server,
            prefix: "",
            instructions: None,
            tools,
        };
        let (a, b): ([&RawValue; 1], [&RawValue; 1]) = ([&a[0]], [&b[0]]);
        let gone = cached(&[group("segforget", &a)]);
        drop(gone);
        let _kept = cached(&[group("segforget2", &b)]);
        let cache = crate::sync::lock(&CACHE);
        assert!(!cache.entries.iter().any(|c| &*c.server == "segforget"));
        assert!(cache.entries.iter().any(|c| &*c.server == "segforget2"));
    }
}
