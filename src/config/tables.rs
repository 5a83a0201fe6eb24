//! Reading one table of the spanned TOML document into its serde form, reporting each of
//! its problems rather than only the first.

use super::errors::{explain, Ctx};
use indexmap::IndexMap;
use toml::Spanned;

/// `[servers.NAME]` or `[clients.NAME]`: each entry deserialized on its own.
pub(super) fn named<T: serde::de::DeserializeOwned>(
    cx: &mut Ctx,
    section: &str,
    item: &toml_edit::Item,
    fix: impl Fn(&mut T, &[String]),
) -> IndexMap<Spanned<String>, T> {
    let mut out = IndexMap::new();
    let Some(t) = item.as_table_like() else {
        cx.at(
            start(item),
            format!(
                "{section}: expected tables like [{section}.NAME], found {}",
                item.type_name()
            ),
        );
        return out;
    };
    for (name, v) in t.iter() {
        let span = key_span(t, name).or_else(|| v.span()).unwrap_or(0..0);
        if let Some((mut raw, removed)) = table::<T>(cx, &[section, name], v) {
            fix(&mut raw, &removed);
            out.insert(Spanned::new(span, name.to_owned()), raw);
        }
    }
    out
}

/// Deserializes one table at `path`, reporting each of its problems; on a problem, the
/// key it is about is removed and the rest tried again. Also returns the removed keys
/// directly in the table (their values were wrong; the defaults stand in).
pub(super) fn table<T: serde::de::DeserializeOwned>(
    cx: &mut Ctx,
    path: &[&str],
    item: &toml_edit::Item,
) -> Option<(T, Vec<String>)> {
    let mut item = item.clone();
    let mut removed: Vec<Vec<String>> = Vec::new();
    // Each round removes a key, so this ends; the bound only guards against a surprise.
    for _ in 0..256 {
        let e = match deserialize::<T>(item.clone()) {
            Ok(v) => return Some((v, removed.into_iter().map(|mut p| p.swap_remove(0)).collect())),
            Err(e) => e,
        };
        let offset = e.span().map(|s| s.start);
        let within = offset.and_then(|o| locate(&item, o)).unwrap_or_default();
        let message = e.message();
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'));
        // A required key whose value was wrong (and so removed) was already reported.
        let reported = missing.is_some_and(|f| {
            removed.iter().any(|r| {
                r.split_last()
                    .is_some_and(|(last, parent)| last == f && parent == within)
            })
        });
        if !reported {
            let full: Vec<String> = path.iter().map(|p| (*p).to_owned()).chain(within.clone()).collect();
            cx.at(offset.unwrap_or_else(|| start(&item)), explain(&full, message));
        }
        if within.is_empty() || !remove(&mut item, &within) {
            return None;
        }
        removed.push(within);
    }
    None
}

fn deserialize<T: serde::de::DeserializeOwned>(item: toml_edit::Item) -> Result<T, toml_edit::de::Error> {
    use serde::de::IntoDeserializer;
    match item {
        toml_edit::Item::Table(t) => toml_edit::de::from_document(toml_edit::DocumentMut::from(t)),
        toml_edit::Item::Value(v) => T::deserialize(v.into_deserializer()),
        toml_edit::Item::ArrayOfTables(a) => {
            T::deserialize(toml_edit::Value::Array(a.into_array()).into_deserializer())
        }
        toml_edit::Item::None => toml_edit::de::from_document(toml_edit::DocumentMut::new()),
    }
}

/// The path of keys, below `item`, of the deepest key whose name or value holds `offset`.
fn locate(item: &toml_edit::Item, offset: usize) -> Option<Vec<String>> {
    let t = item.as_table_like()?;
    let holds =
        |r: Option<std::ops::Range<usize>>| r.is_some_and(|r| r.start <= offset && offset < r.end.max(r.start + 1));
    for (k, v) in t.iter() {
        if let Some(mut deeper) = locate(v, offset) {
            deeper.insert(0, k.to_owned());
            return Some(deeper);
        }
        if holds(key_span(t, k)) || holds(v.span()) {
            return Some(vec![k.to_owned()]);
        }
    }
    None
}

fn remove(item: &mut toml_edit::Item, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = item;
    for p in parents {
        match at.as_table_like_mut().and_then(|t| t.get_mut(p)) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_table_like_mut().and_then(|t| t.remove(last)).is_some()
}

pub(super) fn key_span(t: &dyn toml_edit::TableLike, key: &str) -> Option<std::ops::Range<usize>> {
    t.get_key_value(key).and_then(|(k, _)| k.span())
}

/// Where an item starts: its own span, else (an implicit table, an array of tables) its
/// first part's.
pub(super) fn start(item: &toml_edit::Item) -> usize {
    if let Some(s) = item.span() {
        return s.start;
    }
    match item {
        toml_edit::Item::ArrayOfTables(a) => a.iter().find_map(|t| t.span()).map_or(0, |s| s.start),
        _ => item
            .as_table_like()
            .and_then(|t| t.iter().find_map(|(k, v)| key_span(t, k).or_else(|| v.span())))
            .map_or(0, |s| s.start),
    }
}
