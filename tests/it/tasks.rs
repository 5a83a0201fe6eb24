//! Tasks (2025-11-25, experimental) through the gateway: namespaced ids, bound to the
//! session that created them, merged tasks/list, status notifications to the owner only.
use crate::common::*;
use serde_json::{json, Value};

fn config() -> String {
    format!(
        "[servers.calc]\n{}\n[servers.jobs]\ncommand = \"python3\"\nargs = [\"tests/fixtures/task_server.py\"]\ncwd = {:?}\n",
        mock(&unique("calc"), &[]),
        repo().display().to_string()
    )
}

#[tokio::test]
async fn tasks_are_namespaced_bound_and_listed_per_session() {
    let gw = Gateway::start(&config());
    let a = gw.session().await;
    let b = gw.session().await;
    assert!(
        a.init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"].is_object(),
        "{}",
        a.init
    );

    // A task-augmented call gets a CreateTaskResult whose id names its server.
    let created = a
        .request(
            json!(1),
            "tools/call",
            json!({"name": "jobs__work", "arguments": {"seconds": 0.3, "text": "hi"}, "task": {"ttl": 60000}}),
        )
        .await;
    let id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    assert_eq!(id, "jobs/task-1");

    // tasks/get and tasks/result route through the table; the result's related-task is rewritten.
    let got = a.request(json!(2), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["taskId"], id.as_str(), "{got}");
    let result = a.request(json!(3), "tasks/result", json!({"taskId": id})).await;
    assert_eq!(text(&result), "hi");
    assert_eq!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str()
    );

    // Another session cannot see or touch it.
    let foreign = b.request(json!(4), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    let listed_b = b.request(json!(5), "tasks/list", json!({})).await;
    assert_eq!(listed_b["result"]["tasks"], json!([]), "{listed_b}");
    let listed_a = a.request(json!(6), "tasks/list", json!({})).await;
    let ids: Vec<&str> = listed_a["result"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["taskId"].as_str())
        .collect();
    assert_eq!(ids, vec![id.as_str()]);

    // The task param is not sent to a server that does not support tasks: a plain result.
    let plain = a
        .request(
            json!(7),
            "tools/call",
            json!({"name": "calc__echo", "arguments": {"text": "x"}, "task": {}}),
        )
        .await;
    assert_eq!(text(&plain), "x");
    // An unknown task id is -32602.
    let unknown = a
        .request(json!(8), "tasks/cancel", json!({"taskId": "jobs/nope"}))
        .await;
    assert_eq!(unknown["error"]["code"], -32602);
    let _: Value = unknown;
}

#[tokio::test]
async fn status_notifications_reach_the_owner_only() {
    let gw = Gateway::start(&config());
    let a = gw.session().await;
    let b = gw.session().await;
    let mut ga = a.get_stream().await;
    let mut gb = b.get_stream().await;
    let created = a
        .request(
            json!(1),
            "tools/call",
            json!({"name": "jobs__work", "arguments": {"seconds": 0.2}, "task": {}}),
        )
        .await;
    let id = created["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let note = ga
        .next(std::time::Duration::from_secs(10))
        .await
        .expect("a status notification");
    assert_eq!(note["method"], "notifications/tasks/status", "{note}");
    assert_eq!(note["params"]["taskId"], id.as_str());
    assert_eq!(note["params"]["status"], "completed");
    assert!(
        gb.next(std::time::Duration::from_millis(500)).await.is_none(),
        "B must not see A's task"
    );
}

/// A shared server's question about a task (`_meta` related-task) goes to the session
/// waiting on that task's result, under the gateway's name for the task, though another
/// session has a call in flight on the same pipe; its answer goes back to the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_about_a_task_goes_to_the_session_that_waits_on_it() {
    let gw = Gateway::start(&config());
    let caps = json!({"elicitation": {}});
    let a = Session::open_with(&gw.url, caps.clone()).await;
    let b = Session::open_with(&gw.url, caps).await;
    let created = a
        .request(
            json!(1),
            "tools/call",
            json!({"name": "jobs__work", "arguments": {"ask": true}, "task": {"ttl": 60000}}),
        )
        .await;
    let id = created["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    // B's call is in flight on the same pipe when the task asks.
    let mut b_call = b
        .start(
            json!(1),
            "tools/call",
            json!({"name": "jobs__work", "arguments": {"seconds": 3, "text": "b"}}),
        )
        .await;
    let mut waiting = a.start(json!(2), "tasks/result", json!({"taskId": id})).await;
    let q = waiting
        .next(std::time::Duration::from_secs(20))
        .await
        .expect("the task's question");
    assert_eq!(q["method"], "elicitation/create", "{q}");
    assert_eq!(
        q["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str(),
        "{q}"
    );
    let answer = json!({"jsonrpc": "2.0", "id": q["id"], "result": {"action": "accept", "content": {"key": "from-a"}}});
    assert_eq!(a.post().json(&answer).send().await.unwrap().status(), 202);
    let (_, result) = waiting.response(std::time::Duration::from_secs(20)).await;
    assert!(text(&result).contains("from-a"), "{result}");
    let (notes, done) = b_call.response(std::time::Duration::from_secs(20)).await;
    assert!(notes.is_empty(), "B was asked about A's task: {notes:?}");
    assert_eq!(text(&done), "inline b");
}

/// Each session's own process numbers its tasks from 1: both sessions hold `jobs/task-1`,
/// each its own, and neither takes the other's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_two_sessions_own_processes_with_the_same_id_stay_each_their_own() {
    let config = format!(
        "[servers.jobs]\ncommand = \"python3\"\nargs = [\"tests/fixtures/task_server.py\"]\ncwd = {:?}\nisolation = \"session\"\n",
        repo().display().to_string()
    );
    let gw = Gateway::start(&config);
    let (a, b) = (gw.session().await, gw.session().await);
    let mut ids = Vec::new();
    for (s, text) in [(&a, "for a"), (&b, "for b")] {
        let created = s
            .request(
                json!(1),
                "tools/call",
                json!({"name": "jobs__work", "arguments": {"seconds": 0.1, "text": text}, "task": {"ttl": 60000}}),
            )
            .await;
        ids.push(
            created["result"]["task"]["taskId"]
                .as_str()
                .unwrap_or_else(|| panic!("{created}"))
                .to_owned(),
        );
    }
    assert_eq!(ids, ["jobs/task-1", "jobs/task-1"], "each process numbers its own");
    for (s, text) in [(&a, "for a"), (&b, "for b")] {
        let r = s
            .request(json!(2), "tasks/result", json!({"taskId": "jobs/task-1"}))
            .await;
        assert_eq!(crate::common::text(&r), text, "{r}");
        let got = s.request(json!(3), "tasks/get", json!({"taskId": "jobs/task-1"})).await;
        assert_eq!(got["result"]["status"], "completed", "{got}");
    }
}
