//! The four list methods, answered from the merged catalog (as the caller's view and
//! allowlist show it), one page at a time.

use super::{Call, Gateway};
use crate::error::Error;
use crate::message::{self, Outcome};
use crate::method::Method;
use serde_json::value::RawValue;
use serde_json::Value;

impl Gateway {
    /// tools/list, prompts/list, resources/list, resources/templates/list.
    pub(super) fn list(&self, cx: &Call<'_>, method: Method, params: Option<Box<RawValue>>) -> Outcome {
        let catalog = &cx.topo.catalog;
        // Search mode: the two tools of the gateway's own, whoever asks. Otherwise the
        // allowlist's lists of the view (or of the whole catalog), else the view's own.
        let search = method == Method::ToolsList && super::search::search_mode(cx);
        let allowed = cx
            .identity
            .filter(|_| !search)
            .and_then(|i| i.views(catalog, cx.view.as_ref()));
        let result = match (method, &allowed, &cx.view) {
            (Method::ToolsList, _, _) if search => super::search::tools_result(),
            (m, Some(a), _) => a.of(m),
            (m, None, Some(v)) => v.lists.of(m),
            (Method::ToolsList, None, None) => &catalog.tools_result,
            (Method::PromptsList, None, None) => &catalog.prompts_result,
            (Method::ResourcesList, None, None) => &catalog.resources_result,
            (_, None, None) => &catalog.templates_result,
        };
        match message::params_object(params.as_deref()) {
            Ok(p) => page(
                result,
                method.as_str(),
                p.get("cursor").filter(|c| !c.is_null()),
                cx.topo.config.gateway.page_size,
            ),
            Err(e) => Error::invalid_params(e).into(),
        }
    }
}

/// One page of a merged list result. With `page_size` 0 the whole list is one page.
/// Cursors are opaque to clients: the list's method and the offset, in hex.
fn page(result: &RawValue, method: &str, cursor: Option<&Value>, page_size: usize) -> Outcome {
    let invalid = || Outcome::from(Error::invalid_params("invalid cursor: list again without one"));
    let offset = match cursor {
        None => 0,
        Some(Value::String(c)) => match decode_cursor(c) {
            Some((m, offset)) if m == method => offset,
            _ => return invalid(),
        },
        Some(_) => return invalid(),
    };
    if page_size == 0 {
        return if offset == 0 {
            Outcome::Result(result.to_owned().into())
        } else {
            invalid()
        };
    }
    let Ok(Value::Object(mut body)) = serde_json::from_str::<Value>(result.get()) else {
        return Outcome::Result(result.to_owned().into());
    };
    let Some((key, Value::Array(items))) = body
        .iter_mut()
        .find(|(_, v)| v.is_array())
        .map(|(k, v)| (k.clone(), v.take()))
    else {
        return Outcome::Result(result.to_owned().into());
    };
    if offset > items.len() {
        return invalid();
    }
    let end = (offset + page_size).min(items.len());
    let more = end < items.len();
    body.insert(
        key,
        Value::Array(items.into_iter().skip(offset).take(end - offset).collect()),
    );
    if more {
        body.insert("nextCursor".into(), Value::String(encode_cursor(method, end)));
    }
    Outcome::Result(message::to_raw(&Value::Object(body)).into())
}

fn encode_cursor(method: &str, offset: usize) -> String {
    let text = format!("{method}\n{offset}");
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_cursor(cursor: &str) -> Option<(String, usize)> {
    if !cursor.len().is_multiple_of(2) || cursor.len() > 256 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (method, offset) = text.split_once('\n')?;
    Some((method.to_owned(), offset.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(v: Value) -> Box<RawValue> {
        message::to_raw(&v)
    }

    #[test]
    fn pages_follow_cursors_to_the_end() {
        let all = raw(json!({ "tools": [1, 2, 3, 4, 5] }));
        let mut cursor: Option<Value> = None;
        let mut seen = Vec::new();
        for _ in 0..10 {
            let Outcome::Result(r) = page(&all, "tools/list", cursor.as_ref(), 2) else {
                panic!("error")
            };
            let v: Value = serde_json::from_str(r.get()).unwrap();
            seen.extend(v["tools"].as_array().unwrap().iter().cloned());
            match v.get("nextCursor") {
                Some(c) => cursor = Some(c.clone()),
                None => break,
            }
        }
        assert_eq!(seen, vec![json!(1), json!(2), json!(3), json!(4), json!(5)]);
        // A cursor of another list, garbage, or a non-string is -32602.
        let other = Value::String(encode_cursor("prompts/list", 2));
        for bad in [other, json!("zz"), json!(7)] {
            assert!(
                matches!(page(&all, "tools/list", Some(&bad), 2), Outcome::Error(_)),
                "{bad}"
            );
        }
        // Without a page size everything is one page, and any cursor is invalid.
        assert!(matches!(page(&all, "tools/list", None, 0), Outcome::Result(_)));
        assert!(matches!(
            page(&all, "tools/list", Some(&json!("00")), 0),
            Outcome::Error(_)
        ));
    }
}
