//! Merged lists page with opaque gateway cursors when `[gateway] page_size` is set.
use crate::common::*;
use serde_json::{json, Value};

async fn all_pages(s: &Session, method: &str, key: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor: Option<Value> = None;
    for i in 0..100 {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let r = s.request(json!(i), method, params).await;
        let page = r["result"][key].as_array().unwrap_or_else(|| panic!("{r}")).clone();
        assert!(page.len() <= 3, "a page is at most page_size long: {r}");
        items.extend(page);
        match r["result"].get("nextCursor") {
            Some(c) => cursor = Some(c.clone()),
            None => return items,
        }
    }
    panic!("too many pages");
}

#[tokio::test]
async fn merged_lists_page_and_bad_cursors_are_refused() {
    let servers = format!(
        "[servers.a]\n{}\n[servers.b]\n{}\n",
        mock(&unique("a"), &["--tools", "4", "--page-size", "2"]),
        mock(&unique("b"), &["--tools", "3"])
    );
    let paged = Gateway::start(&format!("[gateway]\npage_size = 3\n{servers}"));
    let whole = Gateway::start(&servers);
    let (p, w) = (paged.session().await, whole.session().await);

    let one_page = w.request(json!(1), "tools/list", json!({})).await;
    assert!(one_page["result"].get("nextCursor").is_none());
    let expected = one_page["result"]["tools"].as_array().unwrap().clone();
    let got = all_pages(&p, "tools/list", "tools").await;
    assert_eq!(got, expected, "paging loses or reorders nothing");
    assert!(expected.len() > 6);

    // A cursor of another list, a made-up one, or any cursor when paging is off: -32602.
    let first = p.request(json!(2), "tools/list", json!({})).await;
    let cursor = first["result"]["nextCursor"].clone();
    let foreign = p.request(json!(3), "prompts/list", json!({ "cursor": cursor })).await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    let bogus = p.request(json!(4), "tools/list", json!({ "cursor": "not-ours" })).await;
    assert_eq!(bogus["error"]["code"], -32602, "{bogus}");
    let off = w.request(json!(5), "tools/list", json!({ "cursor": cursor })).await;
    assert_eq!(off["error"]["code"], -32602, "{off}");
}
