use crate::common::*;
use serde_json::json;

#[tokio::test]
async fn smoke_merged_call() {
    let gw = Gateway::start(&format!("[servers.calc]\n{}", mock("calc", &[])));
    let s = gw.session().await;
    assert!(s.tool_names().await.contains(&"calc__add".to_string()));
    let r = s.call("calc__add", json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&r), "5");
}
