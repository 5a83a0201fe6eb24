//! `[servers.NAME.overrides.TOOL]`: the operator's name, description, title and
//! annotations for a server's tool; calls by the new name reach the tool by its own.

use crate::common::*;
use serde_json::json;

fn overrides(n: &str, extra: &str) -> String {
    server(
        "m",
        n,
        &[],
        &format!(
            "[servers.m.overrides.echo]\nname = \"say\"\ndescription = \"Say it back (our words).\"\n\
             title = \"Say\"\nannotations = {{ readOnlyHint = true }}\n{extra}"
        ),
    )
}

#[tokio::test]
async fn an_overridden_tool_is_listed_as_the_operator_wrote_it_and_called_by_its_new_name() {
    let gw = Gateway::start(&overrides(&unique("ovr"), ""));
    let s = gw.session().await;
    let tools = s.list("tools/list", "tools").await;
    let say = tools.iter().find(|t| t["name"] == "m__say").expect("m__say listed");
    assert_eq!(say["description"], "Say it back (our words).");
    assert_eq!(say["title"], "Say");
    assert_eq!(say["annotations"]["readOnlyHint"], true);
    assert!(
        say["inputSchema"]["properties"]["text"].is_object(),
        "the schema stays the server's: {say}"
    );
    assert!(
        !tools.iter().any(|t| t["name"] == "m__echo"),
        "the old public name is gone"
    );
    // Other tools are untouched.
    let add = tools.iter().find(|t| t["name"] == "m__add").unwrap();
    assert_eq!(add["description"], "Add two numbers.");
    assert_eq!(text(&s.call("m__say", json!({"text": "hi"})).await), "hi");
    let r = s.call("m__echo", json!({"text": "hi"})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[test]
fn check_connect_refuses_an_override_of_a_tool_not_listed_or_a_name_taken() {
    let cfg = overrides(
        &unique("ovr-bad"),
        "[servers.m.overrides.nope]\ndescription = \"x\"\n\n[servers.m.overrides.add]\nname = \"log\"\n",
    );
    let (run, _dir) = check(&cfg, &[], &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("tool overrides are checked"), "{}", run.stdout);
    let (run, _dir) = check(&cfg, &["--connect"], &[]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("servers.m.overrides.nope: server 'm' lists no tool \"nope\""),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("servers.m.overrides.add.name: m__log is already another tool's public name"),
        "{}",
        run.stdout
    );
}

#[test]
fn two_tools_given_one_name_is_a_config_error() {
    let cfg = overrides(&unique("ovr-dup"), "[servers.m.overrides.add]\nname = \"say\"\n");
    let (run, _dir) = check(&cfg, &[], &[]);
    assert_eq!(run.code, Some(64), "{}", run.stderr);
    assert!(
        run.stderr.contains("\"say\" is already the new name of \"echo\""),
        "{}",
        run.stderr
    );
}
