//! Tool search: a BM25F index over a catalog's tools, built once per catalog and shared by
//! every session; each search keeps only what the caller may see.
//!
//! A tool is a document of seven fields, each with its own weight and length
//! normalization ([`FIELDS`]): the words of its name (the public name without the server's
//! prefix: `create_issue`, `createIssue` and `API-post-search` all split into words), its
//! title, its description, its parameters' names, its parameters' descriptions and enum
//! values, its server's name, and the instructions that server gave at `initialize`. A word
//! nearly every tool of a server has in its name (`browser_`, `API-`) goes to the server's
//! field; so do the words at least half a server's descriptions share (its boilerplate), to its
//! instructions' field. Words go through [`text::terms`]: split, lower-cased, stop words out, lightly
//! stemmed; a compound term whose halves are terms too (`worklog`) also counts as them.
//!
//! Scoring is BM25F: a term's frequency in each field is normalized by that field's length
//! against its average, weighted, and summed into one pseudo-frequency that saturates
//! (`k1`) before it is multiplied by the term's IDF (raised to [`Tuning::idf_power`], so that
//! one rare word does not outweigh the rest of a request). All of that depends on the
//! document and the term only, so it is computed once, when the index is built: a search
//! adds up precomputed weights. Each query word also matches its synonyms
//! ([`text::synonyms`]) at [`Tuning::synonym`] of their weight (never more than the word's own
//! IDF allows), and, when the index does not have it at all, the terms it is a prefix of and
//! its two halves at [`Tuning::prefix`]; a document counts each query word once, by the best
//! of its forms, so a tool that says both `create` and `add` is not counted twice. A request
//! is read first ([`query_text`]): a URL stands for `url`, a path or file name adds `file
//! path`, and two-word verbs (`set up`) are one word. A request that asks a question ranks
//! the tools that change something lower ([`Tuning::asking_writes`]).
//! Two factors multiply a tool's sum: how much of its name the request covers
//! ([`Tuning::name_coverage`]), and whether a word of the request is its server's
//! ([`Tuning::server_match`]). An issue key (`PROJ-88`), a `#channel` and an e-mail address
//! are read as what they stand for.
//!
//! Why not a search crate: tantivy (the well-kept one) is built for segments on disk and
//! millions of documents, adds a large dependency tree, and needs a newer Rust (1.88) than
//! this crate's 1.85; a catalog is about a thousand short documents, searched with a
//! per-caller filter, which this file does in microseconds. After a list_changed only the
//! servers whose tools changed are analyzed again (`segment.rs` keeps one analyzed segment
//! per server); the segments' postings are then merged into one index, the same index a
//! build from nothing gives.
//! `mcp-gateway-search-bench` measures it on a fixture of real tools (BENCHMARKS.md).

mod amx;
mod attention;
mod cosines;
pub mod eval;
mod helper;
mod loose;
pub mod model;
mod segment;
pub mod semantic;
pub mod text;
mod vnni;
pub mod wordpiece;

pub use segment::Group;
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

/// The index's maps hash with foldhash: their keys are the catalog's words, and a build
/// hashes every word of every tool.
type Map32<K, V> = HashMap<K, V, foldhash::fast::FixedState>;
type Set32<K> = HashSet<K, foldhash::fast::FixedState>;

/// A term's documents while building: (document, frequency in each field).
type RawPostings = Vec<(u32, [u16; FIELDS.len()])>;

/// What a document's fields are, and how much each counts.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    /// How much a term found here counts against the same term in the description.
    pub weight: f32,
    /// BM25's `b`: how much a longer field dilutes a term (0: not at all, 1: fully).
    pub b: f32,
}

/// The fields, in the order of `Field`'s index in a document.
pub const FIELDS: [Field; 7] = [
    Field {
        name: "name",
        weight: 4.0,
        b: 0.3,
    },
    Field {
        name: "title",
        weight: 2.0,
        b: 0.3,
    },
    Field {
        name: "description",
        weight: 1.0,
        b: 0.75,
    },
    Field {
        name: "parameter names",
        weight: 0.6,
        b: 0.5,
    },
    Field {
        name: "parameter descriptions",
        weight: 0.3,
        b: 0.75,
    },
    Field {
        name: "server name",
        weight: 2.0,
        b: 0.0,
    },
    Field {
        name: "server instructions",
        weight: 0.2,
        b: 0.75,
    },
];
const NAME: usize = 0;
const TITLE: usize = 1;
const DESCRIPTION: usize = 2;
const PARAM_NAMES: usize = 3;
const PARAM_DESCRIPTIONS: usize = 4;
const SERVER: usize = 5;
const INSTRUCTIONS: usize = 6;

/// The numbers ranking depends on; [`Tuning::default`] is what the gateway uses.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub fields: [Field; 7],
    /// BM25's `k1`: how fast more occurrences of a term stop adding to its score.
    pub k1: f32,
    /// What a synonym of a query word counts, against the word itself.
    pub synonym: f32,
    /// What a longer term counts when the query word is only its prefix (and not a term),
    /// and each half of a compound.
    pub prefix: f32,
    /// What a tool that writes counts when the request asks a question (`asks`).
    pub asking_writes: f32,
    /// A term's IDF is raised to this power (1: BM25's own; less: rare words dominate less).
    pub idf_power: f32,
    /// How much a tool gains when the request covers the words of its name: its score is
    /// multiplied by `1 + name_coverage × (share of its name's words the request has, itself
    /// or by a synonym)`. `delete_branch` for "delete the stale branch" beats
    /// `stop_stale_environments`, which matches one rare word of the request.
    pub name_coverage: f32,
    /// How much a tool gains when a word of the request is its server's (the server's name,
    /// or a word nearly all its tools' names share): "in GitLab", "the Notion page". Its score
    /// is multiplied by `1 + server_match`.
    pub server_match: f32,
    /// With a model: what the cosine counts against the lexical score over the best one
    /// (`lexical / best + semantic × cosine`), [`semantic::WEIGHT`].
    pub semantic: f32,
    /// With a model: how near in meaning a tool no word of the request matches must be to
    /// be a result at all, [`semantic::MIN_COSINE`].
    pub min_cosine: f32,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            fields: FIELDS,
            k1: 1.2,
            synonym: 0.7,
            prefix: 0.5,
            asking_writes: 0.75,
            idf_power: 0.5,
            name_coverage: 0.5,
            server_match: 0.5,
            semantic: semantic::WEIGHT,
            min_cosine: semantic::MIN_COSINE,
        }
    }
}
/// The longest query `gateway__search_tools` takes, in bytes: a request in words is far
/// shorter, and a longer one would only cost CPU on the thread that serves every other
/// request (BENCHMARKS.md has what a query this long costs).
pub const MAX_QUERY: usize = 2048;
/// The shortest query word tried as a prefix.
const MIN_PREFIX: usize = 4;
/// The shortest part of a compound word ([`Index::split`]).
const MIN_PART: usize = 3;
/// The longest query word tried as a compound of two terms: each split point stems and
/// looks up both halves, so this bounds a word's cost (no compound of tool names is
/// near it).
const MAX_COMPOUND: usize = 40;
/// A word in the names of at least this share of a server's tools counts as the server's.
const SHARED_NAME_SHARE: f32 = 0.6;
/// A word in the descriptions of at least this share of a server's tools is the server's
/// boilerplate.
const SHARED_DESCRIPTION_SHARE: f32 = 0.5;
/// ...of a server with at least this many tools.
const SHARED_NAME_MIN_TOOLS: usize = 4;
/// Nested parameters are read this deep (1: the top-level properties only).
const SCHEMA_DEPTH: usize = 3;

/// One tool to index.
pub struct Tool<'a> {
    /// Its public name.
    pub name: &'a str,
    /// Its server's prefix and separator, stripped from the public name for the name field.
    pub prefix: &'a str,
    pub server: &'a str,
    pub instructions: Option<&'a str>,
    /// `title`, or `annotations.title`.
    pub title: Option<&'a str>,
    pub description: &'a str,
    /// `inputSchema` as listed.
    pub input_schema: Option<&'a RawValue>,
    /// `annotations.readOnlyHint`.
    pub read_only: Option<bool>,
}

/// A tool as a list result carries it: what the index reads, borrowed from the list's text
/// where it has no escapes.
/// A member of another type than the index reads (a `title` that is a number) is read as
/// absent, never as a failure of the list.
#[derive(serde::Deserialize)]
pub struct Listed<'a> {
    #[serde(borrow, default)]
    name: loose::Str<'a>,
    #[serde(borrow, default)]
    title: loose::Str<'a>,
    #[serde(borrow, default)]
    description: loose::Str<'a>,
    #[serde(borrow, default, rename = "inputSchema")]
    input_schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    annotations: loose::Object<Annotations<'a>>,
}

#[derive(serde::Deserialize)]
struct Annotations<'a> {
    #[serde(borrow, default)]
    title: loose::Str<'a>,
    #[serde(default, rename = "readOnlyHint")]
    read_only: loose::Bool,
}

impl<'a> Listed<'a> {
    /// Its name ("" when it has none).
    pub fn name(&self) -> &str {
        self.name.0.as_deref().unwrap_or_default()
    }

    /// The tool to index, of a server with that name, prefix and instructions.
    pub fn tool(&'a self, prefix: &'a str, server: &'a str, instructions: Option<&'a str>) -> Tool<'a> {
        let annotations = self.annotations.0.as_ref();
        Tool {
            name: self.name(),
            prefix,
            server,
            instructions,
            title: self
                .title
                .0
                .as_deref()
                .or_else(|| annotations.and_then(|a| a.title.0.as_deref())),
            description: self.description.0.as_deref().unwrap_or_default(),
            input_schema: self.input_schema,
            read_only: annotations.and_then(|a| a.read_only.0),
        }
    }
}

/// A tool's text for a sentence-embedding model: `server: name words. title. description`
/// (the name split as the index splits it, lower-cased).
fn semantic_text(server: &str, own_name: &str, title: Option<&str>, description: &str) -> Box<str> {
    let mut out = String::with_capacity(server.len() + own_name.len() + description.len() + 8);
    out.push_str(server);
    out.push(':');
    let mut prev: Option<char> = None;
    for c in own_name.chars() {
        let split = matches!(c, '_' | '-' | '.' | '/' | ' ')
            || (c.is_uppercase() && prev.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit()));
        if (split || prev.is_none()) && !out.ends_with(' ') {
            out.push(' ');
        }
        if !matches!(c, '_' | '-' | '.' | '/' | ' ') {
            out.extend(c.to_lowercase());
        }
        prev = Some(c);
    }
    out.push('.');
    if let Some(t) = title.filter(|t| !t.trim().is_empty()) {
        out.push(' ');
        out.push_str(t);
        out.push('.');
    }
    if !description.is_empty() {
        out.push(' ');
        out.push_str(description);
    }
    out.into_boxed_str()
}

/// One indexed tool.
#[derive(Debug, Clone)]
struct Doc {
    name: std::sync::Arc<str>,
    /// `{"name", "description", "inputSchema"}`, written once, for search results.
    entry: std::sync::Arc<RawValue>,
    /// It changes something: its `readOnlyHint` is false, or (without one) its name
    /// starts with a verb that writes.
    writes: bool,
    /// How many distinct terms its name field has (the server's shared words left out).
    name_terms: u8,
}

/// The index of one catalog's tools.
#[derive(Debug)]
pub struct Index {
    docs: Vec<Doc>,
    /// Terms, sorted (for prefix look-ups), each with its IDF and postings.
    terms: Vec<Term>,
    tuning: Tuning,
    /// The tools' vectors, once [`Index::attach`] has computed them.
    dense: std::sync::OnceLock<semantic::Dense>,
    /// The segments it was put together from, which the next catalog's index may reuse;
    /// they hold each tool's text for a sentence-embedding model ([`semantic_text`]).
    segments: segment::Held,
}

#[derive(Debug)]
struct Term {
    text: Box<str>,
    idf: f32,
    postings: Vec<Posting>,
}

/// A document holding a term, and the term's whole BM25F weight in it (IDF included).
#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    weight: f32,
    /// The term is a word of the document's name.
    name: bool,
    /// The term is a word of the document's server.
    server: bool,
}

/// One match.
#[derive(Debug, Clone)]
pub struct Hit<'a> {
    pub name: &'a str,
    pub score: f32,
    /// `{"name", "description", "inputSchema"}` of the tool.
    pub entry: &'a RawValue,
}

impl Index {
    /// Indexes `tools`. Their order breaks ties between equal scores.
    pub fn build<'a>(tools: impl IntoIterator<Item = Tool<'a>>) -> Index {
        Index::build_tuned(tools, Tuning::default())
    }

    /// [`Index::build`] with other numbers. A server's tools come one after the other.
    pub fn build_tuned<'a>(tools: impl IntoIterator<Item = Tool<'a>>, tuning: Tuning) -> Index {
        let tools: Vec<Tool<'a>> = tools.into_iter().collect();
        let mut segments = Vec::new();
        let mut start = 0;
        for end in 1..=tools.len() {
            let same =
                |a: &Tool, b: &Tool| a.server == b.server && a.prefix == b.prefix && a.instructions == b.instructions;
            if end == tools.len() || !same(&tools[start], &tools[end]) {
                segments.push(std::sync::Arc::new(segment::Segment::analyze(&tools[start..end])));
                start = end;
            }
        }
        Index::assemble(&segments, tuning)
    }

    /// Indexes a catalog's tools, a [`Group`] a server, in the catalog's order. A server
    /// whose tools are as they were at an earlier build (the same text to the byte) is not
    /// analyzed again: after a list_changed, only the server that changed is.
    pub fn build_groups(groups: &[Group<'_>]) -> Index {
        Index::assemble(&segment::cached(groups), Tuning::default())
    }

    /// The index of `segments`, in order: their terms merged, compounds split, weights
    /// computed.
    fn assemble(segments: &[std::sync::Arc<segment::Segment>], tuning: Tuning) -> Index {
        let count: usize = segments.iter().map(|s| s.docs.len()).sum();
        let mut docs = Vec::with_capacity(count);
        let mut lengths: Vec<[u32; FIELDS.len()]> = Vec::with_capacity(count);
        // Each segment's first document; each term of each segment, merged in order.
        let mut offsets = Vec::with_capacity(segments.len());
        let mut all: Vec<(&str, u32, u32)> = Vec::new();
        for (s, seg) in segments.iter().enumerate() {
            offsets.push(docs.len() as u32);
            docs.extend(seg.docs.iter().cloned());
            lengths.extend_from_slice(&seg.lengths);
            all.extend(
                seg.terms
                    .iter()
                    .enumerate()
                    .map(|(t, (term, _))| (&**term, s as u32, t as u32)),
            );
        }
        // Stable: a term's postings come in segment order, so by document.
        all.sort_by(|a, b| a.0.cmp(b.0));
        let mut raw: Vec<(&str, RawPostings)> = Vec::new();
        for (term, s, t) in all {
            let offset = offsets[s as usize];
            let postings = &segments[s as usize].terms[t as usize].1;
            let list = match raw.last_mut() {
                Some((last, list)) if *last == term => list,
                _ => {
                    raw.push((term, Vec::with_capacity(postings.len())));
                    &mut raw.last_mut().expect("just pushed").1
                }
            };
            list.extend(postings.iter().map(|&(d, tf)| (d + offset, tf)));
        }
        decompound(&mut raw);
        let n = docs.len().max(1) as f32;
        let mut average = [0f32; FIELDS.len()];
        for l in &lengths {
            for (a, x) in average.iter_mut().zip(l) {
                *a += *x as f32;
            }
        }
        for a in &mut average {
            *a = (*a / n).max(1.0);
        }
        let terms: Vec<Term> = raw
            .into_iter()
            .map(|(term, postings)| {
                let df = postings.len() as f32;
                let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln().powf(tuning.idf_power);
                let postings = postings
                    .into_iter()
                    .map(|(doc, tf)| {
                        let len = &lengths[doc as usize];
                        let mut pseudo = 0.0;
                        for (f, field) in tuning.fields.iter().enumerate() {
                            if tf[f] > 0 {
                                let norm = 1.0 - field.b + field.b * len[f] as f32 / average[f];
                                pseudo += field.weight * tf[f] as f32 / norm;
                            }
                        }
                        Posting {
                            doc,
                            weight: idf * pseudo / (tuning.k1 + pseudo),
                            name: tf[NAME] > 0,
                            server: tf[SERVER] > 0,
                        }
                    })
                    .collect();
                Term {
                    text: term.into(),
                    idf,
                    postings,
                }
            })
            .collect();
        Index {
            docs,
            terms,
            tuning,
            dense: std::sync::OnceLock::new(),
            segments: segment::Held(segments.to_vec()),
        }
    }

    /// Computes the tools' vectors with `semantic`'s model (from its cache where a tool's
    /// text is unchanged), after which searches rank by meaning too. Slow the first time (the
    /// model runs once per tool): call it off the request path. A second call does nothing.
    /// At most [`semantic::MAX_MODEL_TOOLS`] tools get vectors, the first in the
    /// catalog's order; the rest are ranked by words only.
    pub fn attach(&self, semantic: &std::sync::Arc<semantic::Semantic>) {
        self.attach_first(semantic, semantic::MAX_MODEL_TOOLS);
    }

    fn attach_first(&self, semantic: &std::sync::Arc<semantic::Semantic>, most: usize) {
        if self.dense.get().is_some() {
            return;
        }
        if self.docs.len() > most {
            tracing::warn!(
                tools = self.docs.len(),
                "tool search: the model ranks the first {most} tools of the catalog; the other {} by words only",
                self.docs.len() - most
            );
        }
        let vectors = semantic.vectors(self.segments.0.iter().flat_map(|s| &s.texts).take(most));
        let _ = self.dense.set(semantic::Dense {
            semantic: semantic.clone(),
            vectors,
        });
    }

    /// Whether searches rank by meaning too ([`Index::attach`] is done).
    pub fn is_semantic(&self) -> bool {
        self.dense.get().is_some()
    }

    /// How many tools it holds.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// The `limit` best matches for `query` among the tools `visible` keeps (by public
    /// name), best first; ties keep catalog order. Tools no query word matches are not
    /// returned.
    pub fn search(&self, query: &str, limit: usize, visible: impl Fn(&str) -> bool) -> Vec<Hit<'_>> {
        self.search_by(query, None, limit, visible)
    }

    /// The model that ranks by meaning, once [`Index::attach`] is done.
    pub fn semantic(&self) -> Option<std::sync::Arc<semantic::Semantic>> {
        self.dense.get().map(|d| d.semantic.clone())
    }

    /// The cosine of `query`'s vector with each tool that has a vector (see
    /// [`semantic::MAX_MODEL_TOOLS`]), once [`Index::attach`] is done: milliseconds of
    /// CPU, so a caller makes them off the thread that serves requests, then passes them
    /// to [`Index::search_by`].
    pub fn cosines(&self, query: &str) -> Option<Vec<f32>> {
        let dense = self.dense.get()?;
        Some(dense.semantic.model.embed_now_with_dots(query, &dense.vectors).1)
    }

    /// [`Index::search`], with [`Index::cosines`] already made (so a caller can make them
    /// off its thread): `None` makes them here if the index has vectors; cosines of
    /// another length (none were made: `&[]`) rank by words only, never running the
    /// model on the caller's thread.
    pub fn search_by(
        &self,
        query: &str,
        cosines: Option<&[f32]>,
        limit: usize,
        visible: impl Fn(&str) -> bool,
    ) -> Vec<Hit<'_>> {
        let words = Self::words(query);
        let mut scores = vec![0f32; self.docs.len()];
        let mut best = vec![0f32; self.docs.len()];
        // Per document: whether the current word is in its name; how many words were.
        let mut in_name = vec![false; self.docs.len()];
        let mut named = vec![0u8; self.docs.len()];
        let mut of_server = vec![false; self.docs.len()];
        let mut touched: Vec<u32> = Vec::new();
        for word in &words {
            touched.clear();
            for (term, factor) in self.forms(word) {
                for p in &self.terms[term].postings {
                    let d = p.doc as usize;
                    let w = p.weight * factor;
                    if best[d] == 0.0 {
                        touched.push(p.doc);
                    }
                    if w > best[d] {
                        best[d] = w;
                    }
                    in_name[d] |= p.name;
                    of_server[d] |= p.server && factor >= 1.0;
                }
            }
            for &d in &touched {
                let d = d as usize;
                scores[d] += best[d];
                best[d] = 0.0;
                named[d] = named[d].saturating_add(u8::from(in_name[d]));
                in_name[d] = false;
            }
        }
        for (((score, doc), &n), &server) in scores.iter_mut().zip(&self.docs).zip(&named).zip(&of_server) {
            if n > 0 && doc.name_terms > 0 {
                let share = (f32::from(n) / f32::from(doc.name_terms)).min(1.0);
                *score *= 1.0 + self.tuning.name_coverage * share;
            }
            if server {
                *score *= 1.0 + self.tuning.server_match;
            }
        }
        if asks(query) {
            for (score, doc) in scores.iter_mut().zip(&self.docs) {
                if doc.writes {
                    *score *= self.tuning.asking_writes;
                }
            }
        }
        let made;
        let cosines = match (self.dense.get(), cosines) {
            (None, _) => None,
            (Some(dense), None) => {
                made = dense.semantic.model.embed_now_with_dots(query, &dense.vectors).1;
                Some(&made[..])
            }
            (Some(dense), Some(c)) => {
                Some(c).filter(|c| c.len() == dense.vectors.len() / dense.semantic.model.dim().max(1))
            }
        };
        let mut hits: Vec<(u32, f32)> = match cosines {
            // `lexical / best + semantic · cosine`, over the tools a word of the request
            // matches and those near enough in meaning.
            Some(cosines) => {
                let best = scores.iter().copied().fold(0f32, f32::max);
                let scale = if best > 0.0 { 1.0 / best } else { 0.0 };
                scores
                    .iter()
                    .zip(cosines.iter().copied().chain(std::iter::repeat(0.0)))
                    .enumerate()
                    .filter(|(_, (s, cos))| **s > 0.0 || *cos >= self.tuning.min_cosine)
                    .map(|(d, (s, cos))| (d as u32, s * scale + self.tuning.semantic * cos))
                    .collect()
            }
            None => scores
                .iter()
                .enumerate()
                .filter(|(_, s)| **s > 0.0)
                .map(|(d, s)| (d as u32, *s))
                .collect(),
        };
        hits.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        hits.into_iter()
            .filter(|(d, _)| visible(&self.docs[*d as usize].name))
            .take(limit)
            .map(|(d, score)| {
                let doc = &self.docs[d as usize];
                Hit {
                    name: &doc.name,
                    score,
                    entry: &doc.entry,
                }
            })
            .collect()
    }

    /// The words of a query, each once, in order: a scan of the few words of a request,
    /// a set once there are many (a query of many different words stays linear).
    fn words(query: &str) -> Vec<String> {
        const SCAN: usize = 16;
        let mut words: Vec<String> = Vec::new();
        let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
        text::terms(&query_text(query), |t| {
            let new = if words.len() < SCAN {
                !words.iter().any(|w| w == t)
            } else {
                if seen.is_empty() {
                    seen.extend(words.iter().cloned());
                }
                seen.insert(t.to_owned())
            };
            if new {
                words.push(t.to_owned());
            }
        });
        words
    }

    /// The terms a query word matches, with their postings and how much each counts:
    /// the word itself; else the terms it is a prefix of, and the two halves of a compound;
    /// and its synonyms.
    fn forms(&self, word: &str) -> Vec<(usize, f32)> {
        let mut forms = Vec::new();
        let own = self.term_index(word);
        match own {
            Some(i) => forms.push((i, 1.0)),
            None if word.len() >= MIN_PREFIX => {
                let start = self.terms.partition_point(|t| &*t.text < word);
                let prefixed = self.terms[start..]
                    .iter()
                    .take_while(|t| t.text.starts_with(word))
                    .count();
                forms.extend((start..start + prefixed).map(|i| (i, self.tuning.prefix)));
                // A compound the tools spell as two words (`subpages`, `codebase`).
                if let Some((a, b)) = self.split(word) {
                    forms.push((a, self.tuning.prefix));
                    forms.push((b, self.tuning.prefix));
                }
            }
            None => {}
        }
        for s in text::synonyms(word) {
            if let Some(i) = self.term_index(s) {
                // A synonym never says more than the word itself: a rarer one (higher IDF)
                // counts with the word's IDF.
                let cap = own.map_or(1.0, |o| (self.terms[o].idf / self.terms[i].idf).min(1.0));
                forms.push((i, self.tuning.synonym * cap));
            }
        }
        forms
    }

    /// Why `name` scores what it does for `query`: each query word's best form and weight.
    #[cfg(test)]
    pub fn explain(&self, query: &str, name: &str) -> Vec<(String, String, f32)> {
        let Some(d) = self.docs.iter().position(|doc| &*doc.name == name) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for word in Self::words(query) {
            let best = self
                .forms(&word)
                .into_iter()
                .filter_map(|(t, f)| {
                    let term = &self.terms[t];
                    term.postings
                        .iter()
                        .find(|x| x.doc as usize == d)
                        .map(|x| (term.text.to_string(), x.weight * f))
                })
                .max_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((t, w)) = best {
                out.push((word.clone(), t, w));
            }
        }
        out
    }

    /// `word` as two terms of the index, each at least [`MIN_PART`] long (the longest
    /// first part wins).
    fn split(&self, word: &str) -> Option<(usize, usize)> {
        if word.len() > MAX_COMPOUND {
            return None;
        }
        (MIN_PART..=word.len().saturating_sub(MIN_PART))
            .rev()
            .filter(|&i| word.is_char_boundary(i))
            .find_map(|i| {
                let (a, b) = word.split_at(i);
                Some((self.term_index(&text::stem(a))?, self.term_index(&text::stem(b))?))
            })
    }

    fn term_index(&self, term: &str) -> Option<usize> {
        self.terms.binary_search_by(|t| (*t.text).cmp(term)).ok()
    }
}

/// Gives each document holding a compound term (`worklog`, `datasource`, `username`) its
/// two parts too, in the same fields, when both are terms of the index on their own:
/// a request says "log work" or "data source" as often as the tool says it as one word.
/// `raw` is sorted by term, and stays so.
fn decompound(raw: &mut [(&str, RawPostings)]) {
    let find = |raw: &[(&str, RawPostings)], term: &str| raw.binary_search_by(|(t, _)| (*t).cmp(term)).ok();
    let mut parts: Vec<(usize, RawPostings)> = Vec::new();
    for (term, postings) in raw.iter() {
        if term.len() < 2 * MIN_PART + 1 || !term.is_ascii() {
            continue;
        }
        let split = (MIN_PART + 1..=term.len() - MIN_PART)
            .rev()
            .map(|i| term.split_at(i))
            .find_map(|(a, b)| Some((find(raw, a)?, find(raw, b)?)));
        if let Some((a, b)) = split {
            parts.push((a, postings.clone()));
            parts.push((b, postings.clone()));
        }
    }
    for (part, postings) in parts {
        let list = &mut raw[part].1;
        for (doc, tf) in postings {
            match list.iter_mut().find(|(d, _)| *d == doc) {
                Some((_, have)) => {
                    for (h, t) in have.iter_mut().zip(tf) {
                        *h = h.saturating_add(t);
                    }
                }
                None => list.push((doc, tf)),
            }
        }
        list.sort_unstable_by_key(|(d, _)| *d);
    }
}

/// The words that at least [`SHARED_NAME_SHARE`] of a server's tools (of a server with at
/// least [`SHARED_NAME_MIN_TOOLS`]) have in their names, by (server, term).
fn shared_name_words<'a>(tools: &[Tool<'a>], own_names: &[&str]) -> Set32<(&'a str, String)> {
    let mut per_server: Map32<&str, (usize, Map32<String, usize>)> = Map32::default();
    for (t, own) in tools.iter().zip(own_names) {
        let (count, words) = per_server.entry(t.server).or_default();
        *count += 1;
        let mut seen = Set32::default();
        text::terms(own, |term| {
            if seen.insert(term.to_owned()) {
                *words.entry(term.to_owned()).or_default() += 1;
            }
        });
    }
    let mut out = Set32::default();
    for (server, (count, words)) in per_server {
        if count < SHARED_NAME_MIN_TOOLS {
            continue;
        }
        for (word, n) in words {
            if n as f32 >= SHARED_NAME_SHARE * count as f32 {
                out.insert((server, word));
            }
        }
    }
    // The server's own name is found through its field already.
    out.retain(|(s, _)| tools.iter().any(|t| t.server == *s));
    out
}

/// The terms at least [`SHARED_DESCRIPTION_SHARE`] of a server's descriptions (of a server
/// with at least [`SHARED_NAME_MIN_TOOLS`] tools) have, by (server, term).
fn shared_description_words<'a, 'b>(tools: &[Tool<'a>], descriptions: &'b [Vec<String>]) -> Set32<(&'a str, &'b str)> {
    let mut per_server: Map32<&str, (usize, Map32<&str, usize>)> = Map32::default();
    for (t, terms) in tools.iter().zip(descriptions) {
        let (count, words) = per_server.entry(t.server).or_default();
        *count += 1;
        let mut seen = Set32::default();
        for term in terms {
            if seen.insert(term.as_str()) {
                *words.entry(term.as_str()).or_default() += 1;
            }
        }
    }
    let mut out = Set32::default();
    for (server, (count, words)) in per_server {
        if count < SHARED_NAME_MIN_TOOLS {
            continue;
        }
        for (word, n) in words {
            if n as f32 >= SHARED_DESCRIPTION_SHARE * count as f32 {
                out.insert((server, word));
            }
        }
    }
    out.into_iter()
        .filter_map(|(s, w)| tools.iter().find(|t| t.server == s).map(|t| (t.server, w)))
        .collect()
}

/// A request's text as the index reads it: a URL stands for the word `url` (its host and
/// path words would match at random), and a file name or path (`notes.txt`,
/// `src/main.rs`, `build/output`) also says `file path`.
fn query_text(query: &str) -> String {
    let mut out = String::with_capacity(query.len() + 16);
    let chunks: Vec<&str> = query.split_whitespace().collect();
    let mut i = 0;
    while i < chunks.len() {
        let chunk = chunks[i];
        i += 1;
        if let Some(next) = chunks.get(i) {
            let pair = |w: &str| w.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();
            let two = format!("{} {}", pair(chunk), pair(next));
            if let Some((_, one)) = text::PHRASES.iter().find(|(p, _)| *p == two) {
                out.push(' ');
                out.push_str(one);
                i += 1;
                continue;
            }
        }
        let bare = chunk.trim_matches(|c: char| !c.is_alphanumeric() && c != '/' && c != '.');
        if bare.contains("://") || bare.starts_with("www.") {
            out.push_str(" url");
            continue;
        }
        // An issue key (`PROJ-88`) is a ticket; `#releases` a channel; an e-mail address
        // is a person's.
        if is_issue_key(bare) {
            out.push_str(" issue key");
            continue;
        }
        if chunk.starts_with('#')
            && chunk.len() > 1
            && chunk[1..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            out.push_str(" channel ");
            out.push_str(&chunk[1..]);
            continue;
        }
        if bare.contains('@') && bare.contains('.') && !bare.starts_with('@') {
            out.push_str(" email");
            continue;
        }
        out.push(' ');
        out.push_str(chunk);
        let extension = bare.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
        let file = extension.is_some_and(|e| FILE_EXTENSIONS.contains(&e.as_str()));
        if file || (bare.contains('/') && bare.len() > 1) {
            out.push_str(" file path");
        }
    }
    out
}

/// `ABC-123`: capitals (and digits after the first), a dash, digits.
fn is_issue_key(word: &str) -> bool {
    let Some((project, number)) = word.split_once('-') else {
        return false;
    };
    project.len() >= 2
        && project.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && project.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a request asks for something rather than asks for a change: it starts with a
/// question word or a verb that reads ("what's in the sprint", "who is on call", "show
/// the logs").
fn asks(query: &str) -> bool {
    let first: String = query
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .chars()
        .take_while(|c| c.is_alphabetic())
        .flat_map(char::to_lowercase)
        .collect();
    ASKING.contains(&first.as_str())
}

const ASKING: &[&str] = &[
    "what", "whats", "which", "who", "whos", "whose", "how", "where", "when", "why", "is", "are", "was", "were",
    "does", "do", "did", "has", "have", "list", "show", "find", "get", "search", "view", "display", "give", "tell",
    "fetch", "read", "look", "see", "inspect", "describe", "count",
];

/// Whether a tool changes something: its `readOnlyHint` says so, or, without one, the first
/// word of its own name (the server's words left out: `jira_create_sprint` → `create`) is a
/// verb that writes.
fn writes(read_only: Option<bool>, first_name_term: Option<&str>) -> bool {
    if let Some(read_only) = read_only {
        return !read_only;
    }
    first_name_term.is_some_and(|f| WRITING.iter().any(|w| text::stem(w) == f))
}

const WRITING: &[&str] = &[
    "create",
    "add",
    "update",
    "delete",
    "remove",
    "set",
    "write",
    "edit",
    "modify",
    "patch",
    "put",
    "post",
    "insert",
    "upload",
    "push",
    "merge",
    "move",
    "cancel",
    "close",
    "assign",
    "install",
    "uninstall",
    "deploy",
    "apply",
    "execute",
    "run",
    "trigger",
    "send",
    "submit",
    "rename",
    "replace",
    "reset",
    "restore",
    "pause",
    "star",
    "unstar",
    "fork",
    "transition",
    "link",
    "unlink",
    "drop",
    "clear",
    "mark",
    "dismiss",
    "resolve",
    "reopen",
    "start",
    "stop",
];

/// File name extensions a request may mention.
const FILE_EXTENSIONS: &[&str] = &[
    "txt", "md", "json", "yaml", "yml", "toml", "ini", "conf", "cfg", "xml", "csv", "tsv", "log", "rs", "py", "js",
    "ts", "go", "java", "c", "h", "cpp", "rb", "sh", "html", "css", "pdf", "png", "jpg", "jpeg", "gif", "svg", "docx",
    "xlsx", "pptx", "zip", "gz", "tar", "sql", "lock",
];

/// What the index reads of a JSON Schema: properties, their descriptions and enums, and
/// nested schemas. Anything else in it is skipped unread.
#[derive(serde::Deserialize, Default)]
struct Schema<'a> {
    #[serde(borrow, default)]
    description: loose::Str<'a>,
    #[serde(borrow, default)]
    properties: Option<Map32<Cow<'a, str>, Schema<'a>>>,
    #[serde(default, rename = "enum")]
    values: Option<Vec<Value>>,
    #[serde(borrow, default)]
    items: Option<Box<Items<'a>>>,
    #[serde(borrow, default, rename = "anyOf")]
    any_of: Option<Vec<Schema<'a>>>,
    #[serde(borrow, default, rename = "oneOf")]
    one_of: Option<Vec<Schema<'a>>>,
    #[serde(borrow, default, rename = "allOf")]
    all_of: Option<Vec<Schema<'a>>>,
}

/// `items`: a schema, or (old style) a list of them; anything else is ignored.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Items<'a> {
    One(#[serde(borrow)] Schema<'a>),
    Many(#[serde(borrow)] Vec<Schema<'a>>),
    Other(serde::de::IgnoredAny),
}

/// Calls `each` with the name and description of every property of a schema, nested ones
/// (objects, array items, `anyOf`/`oneOf`/`allOf` branches) down to `depth` levels, and
/// with the values of enums.
fn parameters(schema: &Schema, depth: usize, each: &mut dyn FnMut(&str, Option<&str>)) {
    if depth == 0 {
        return;
    }
    if let Some(props) = &schema.properties {
        for (name, prop) in props {
            each(name, prop.description.0.as_deref());
            // An enum's values are words of the tool's (`APPROVE`, `REQUEST_CHANGES`).
            for v in prop.values.iter().flatten().filter_map(Value::as_str) {
                each("", Some(v));
            }
            parameters(prop, depth - 1, each);
        }
    }
    match schema.items.as_deref() {
        Some(Items::One(items)) => parameters(items, depth, each),
        Some(Items::Many(list)) => list.iter().for_each(|s| parameters(s, depth, each)),
        Some(Items::Other(_)) | None => {}
    }
    for branches in [&schema.any_of, &schema.one_of, &schema.all_of].into_iter().flatten() {
        for b in branches {
            if let Some(d) = b.description.0.as_deref() {
                each("", Some(d));
            }
            parameters(b, depth, each);
        }
    }
}

/// A search result's entry: `{"name", "description", "inputSchema"}`, the schema as listed.
fn entry(name: &str, description: &str, schema: Option<&RawValue>) -> Box<RawValue> {
    let text = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    let json = format!(
        r#"{{"name":{},"description":{},"inputSchema":{}}}"#,
        text(name),
        text(description),
        schema.map_or(r#"{"type":"object"}"#, RawValue::get)
    );
    RawValue::from_string(json).unwrap_or_else(|_| crate::message::empty_object())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_querys_words_are_each_once_in_order_past_the_scan() {
        let q: String = (0..40).map(|i| format!("kq{i}k ")).collect();
        let once = Index::words(&q);
        assert_eq!(once.len(), 40, "{once:?}");
        assert_eq!(Index::words(&format!("{q}{q}")), once);
        assert_eq!(Index::words("open open the issue open"), ["open", "issu"]);
    }

    /// The request's vector and cosines on 1,000 tools, as a search made them before
    /// session 22 (the cosines on the searching thread alone, after the vector) and as
    /// now ([`model::Model::embed_now_with_dots`]), alternated request by request so
    /// that both see the same moments of a noisy machine.
    /// `cargo test --release --lib search::tests::speed -- --ignored --nocapture`
    #[test]
    #[ignore = "prints timings; needs the search model"]
    fn speed_of_the_cosines() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/search");
        let f = eval::Fixture::load(&dir).expect("fixture");
        let catalog = eval::Fixture::catalog(&f.padded(1000));
        let index = catalog.search_index();
        let semantic = semantic::Semantic::shared(&model::tests::model_dir()).expect("model");
        index.attach(&semantic);
        let dense = index.dense.get().expect("vectors");
        let model = &dense.semantic.model;
        let requests: Vec<&str> = f.queries.iter().chain(&f.heldout).map(|q| q.query.as_str()).collect();
        let (mut before, mut now, mut rest) = (vec![], vec![], vec![]);
        for round in 0..6 {
            for (i, r) in requests.iter().enumerate() {
                let old = (round + i) % 2 == 0;
                let t0 = std::time::Instant::now();
                let cosines = if old {
                    let v = model.embed_now(r);
                    let mut c = vec![0f32; dense.vectors.len() / v.len()];
                    model::dots_into(&dense.vectors, &v, &mut c);
                    c
                } else {
                    model.embed_now_with_dots(r, &dense.vectors).1
                };
                let took = t0.elapsed().as_secs_f64() * 1e6;
                // What the gateway's I/O thread then does: the words, and the ranking.
                let t0 = std::time::Instant::now();
                std::hint::black_box(index.search_by(r, Some(&cosines), 8, |_| true));
                rest.push(t0.elapsed().as_secs_f64() * 1e6);
                if old {
                    before.push(took);
                } else {
                    now.push(took);
                }
            }
        }
        let p50 = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        eprintln!(
            "{} requests x 3, vector and cosines: p50 {:.0} us before, {:.0} us now; the rest of the search {:.0} us",
            requests.len(),
            p50(&mut before),
            p50(&mut now),
            p50(&mut rest),
        );
    }

    fn tool(v: Value) -> String {
        v.to_string()
    }

    fn index(tools: &[(&str, &str, String)]) -> Index {
        let listed: Vec<Listed> = tools.iter().map(|(_, _, t)| serde_json::from_str(t).unwrap()).collect();
        Index::build(tools.iter().zip(&listed).map(|((name, server, _), l)| Tool {
            name,
            ..l.tool("", server, None)
        }))
    }

    #[test]
    fn tools_past_the_models_cap_are_still_found_by_words() {
        let ix = index(&[
            ("a__nap", "a", tool(json!({"description": "Sleep for a few seconds"}))),
            (
                "a__weather",
                "a",
                tool(json!({"description": "Get the forecast for a city"})),
            ),
            (
                "b__zebra_lookup",
                "b",
                tool(json!({"description": "Find a zebra by its stripes"})),
            ),
        ]);
        let semantic = std::sync::Arc::new(semantic::Semantic::new(
            model::Model::load(&model::tests::model_dir()).expect("model"),
        ));
        ix.attach_first(&semantic, 2);
        let dense = ix.dense.get().expect("attached");
        assert_eq!(dense.vectors.len(), 2 * semantic.model.dim());
        let names = |q: &str| -> Vec<String> { ix.search(q, 3, |_| true).iter().map(|h| h.name.to_owned()).collect() };
        // The third tool has no vector: words find it, and meaning ranks the first two.
        assert_eq!(
            names("zebra stripes").first().map(String::as_str),
            Some("b__zebra_lookup")
        );
        assert_eq!(names("take a short nap").first().map(String::as_str), Some("a__nap"));
    }

    #[test]
    fn the_name_counts_most_and_synonyms_count_too() {
        let ix = index(&[
            (
                "gh__create_issue",
                "gh",
                tool(
                    json!({"description": "Open a new issue in a repository", "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}}}),
                ),
            ),
            (
                "gh__list_issues",
                "gh",
                tool(json!({"description": "List issues in a repository"})),
            ),
            (
                "fs__delete_file",
                "fs",
                tool(json!({"description": "Remove a file from disk"})),
            ),
        ]);
        let top = |q: &str| ix.search(q, 3, |_| true).first().map(|h| h.name.to_owned());
        assert_eq!(top("create an issue").as_deref(), Some("gh__create_issue"));
        assert_eq!(
            top("open a ticket").as_deref(),
            Some("gh__create_issue"),
            "ticket ~ issue, open ~ create"
        );
        assert_eq!(top("show every issue").as_deref(), Some("gh__list_issues"));
        assert_eq!(top("erase a file").as_deref(), Some("fs__delete_file"));
        assert!(ix.search("kangaroo", 3, |_| true).is_empty());
    }

    #[test]
    fn hidden_tools_never_appear_and_the_limit_holds() {
        let t = tool(json!({"name": "x", "description": "Read a thing"}));
        let listed: Listed = serde_json::from_str(&t).unwrap();
        let names: Vec<String> = (0..20).map(|i| format!("s__read_{i}")).collect();
        let ix = Index::build(names.iter().map(|n| Tool {
            name: n,
            ..listed.tool("s__", "s", None)
        }));
        let hits = ix.search("read", 5, |n| n != "s__read_0" && n != "s__read_1");
        assert_eq!(hits.len(), 5);
        assert!(hits.iter().all(|h| h.name != "s__read_0" && h.name != "s__read_1"));
        // Equal scores keep catalog order.
        assert_eq!(hits[0].name, "s__read_2");
        let e: Value = serde_json::from_str(hits[0].entry.get()).unwrap();
        assert_eq!(
            e,
            json!({"name": "s__read_2", "description": "Read a thing", "inputSchema": {"type": "object"}})
        );
    }

    #[test]
    fn a_tool_with_members_of_odd_types_is_still_indexed() {
        let ix = index(&[(
            "s__odd_tool",
            "s",
            tool(
                json!({"title": 5, "description": "Count the widgets", "annotations": "no",
                        "inputSchema": {"type": "object", "properties": {"n": {"description": ["x"]}}}}),
            ),
        )]);
        assert_eq!(ix.search("count widgets", 1, |_| true).len(), 1);
    }

    #[test]
    fn a_word_the_index_lacks_matches_as_a_prefix() {
        let ix = index(&[(
            "k__kubectl_get",
            "kubernetes",
            tool(json!({"description": "Get Kubernetes resources"})),
        )]);
        assert_eq!(ix.search("kubect", 1, |_| true).len(), 1);
    }
}
