//! Text into terms: identifiers split into words, stop words dropped, a light English
//! suffix stemmer, and the synonym table for the words tool names are made of.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Calls `each` with every term of `text`, in order: words of letters and digits, a
/// camelCase or `snake_case` or `kebab-case` identifier split into its words, lower-cased,
/// stop words and bare numbers left out, each stemmed ([`stem`]).
pub fn terms(text: &str, mut each: impl FnMut(&str)) {
    let mut word = String::with_capacity(32);
    let mut stemmed = String::with_capacity(32);
    let mut flush = |word: &mut String| {
        if word.len() >= 2 && !word.bytes().all(|b| b.is_ascii_digit()) && !is_stop(word) {
            stemmed.clear();
            stem_into(word, &mut stemmed);
            each(&stemmed);
        }
        word.clear();
    };
    // The previous character's class: 0 none, 1 lower, 2 upper, 3 digit (other letters: 1).
    let mut prev = 0u8;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii() {
            i += 1;
            let class = match b {
                b'a'..=b'z' => 1,
                b'A'..=b'Z' => 2,
                b'0'..=b'9' => 3,
                _ => {
                    flush(&mut word);
                    prev = 0;
                    continue;
                }
            };
            // createIssue | HTTPServer (the last capital starts the next word) | v2Api
            let next_lower = bytes.get(i).is_some_and(u8::is_ascii_lowercase);
            if (prev == 1 && class == 2) || (prev == 2 && class == 2 && next_lower) || (prev == 3 && class == 2) {
                flush(&mut word);
            }
            word.push(b.to_ascii_lowercase() as char);
            prev = class;
            continue;
        }
        // Anything else, one character at a time.
        let Some(c) = text[i..].chars().next() else { break };
        i += c.len_utf8();
        if c.is_alphanumeric() {
            if prev == 1 && c.is_uppercase() {
                flush(&mut word);
            }
            word.extend(c.to_lowercase());
            prev = if c.is_uppercase() { 2 } else { 1 };
        } else {
            flush(&mut word);
            prev = 0;
        }
    }
    flush(&mut word);
}

/// Words too common in requests and tool descriptions to say which tool is meant.
const STOP: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been",
    "before", "being", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "each", "either", "else",
    "etc", "eg", "for", "from", "had", "has", "have", "having", "he", "her", "here", "him", "his", "how", "ie", "if",
    "in", "into", "is", "it", "its", "itself", "just", "let", "lets", "like", "may", "me", "might", "more", "most",
    "must", "my", "no", "nor", "not", "now", "of", "off", "on", "once", "one", "only", "or", "other", "our", "ours",
    "out", "over", "own", "please", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their",
    "them", "then", "there", "these", "they", "this", "those", "through", "to", "too", "tool", "tools", "under",
    "until", "up", "us", "use", "used", "using", "very", "via", "was", "we", "were", "what", "when", "where",
    "whether", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "i", "im",
    "want", "need", "s", "t",
];

fn is_stop(word: &str) -> bool {
    static SET: OnceLock<std::collections::HashSet<&'static str, foldhash::fast::FixedState>> = OnceLock::new();
    word.len() <= 8 && SET.get_or_init(|| STOP.iter().copied().collect()).contains(word)
}

/// A light, conservative English stemmer for the vocabulary of tools: it folds plurals
/// (`issues`, `entities`, `searches`), `-ing` and `-ed` (undoubling `stopped`), `-tion`
/// and `-sion` after their stem (`creation`, `deletion`), and a final silent `e`, so that
/// `create`, `creates`, `created`, `creating` and `creation` all become `creat`. Words of
/// three letters or fewer are left as they are, and no rule leaves fewer than three.
/// Porter's stemmer (Snowball English, as the `rust-stemmers` crate has it, whose last
/// release is years old) goes further: `general` and `generate` both become `gener`,
/// `organization` `organ`, which merges words tools keep apart.
pub fn stem(word: &str) -> String {
    let mut out = String::new();
    stem_into(word, &mut out);
    out
}

fn stem_into(word: &str, out: &mut String) {
    out.push_str(word);
    if !word.is_ascii() || word.len() <= 3 {
        return;
    }
    // Plurals.
    if let Some(s) = out.strip_suffix("ies").filter(|s| s.len() >= 2) {
        let n = s.len();
        out.truncate(n);
        out.push('y');
    } else if ["sses", "ches", "shes", "xes", "zes"].iter().any(|e| out.ends_with(e)) {
        out.truncate(out.len() - 2);
    } else if out.ends_with('s') && !out.ends_with("ss") && !out.ends_with("us") && !out.ends_with("is") {
        out.truncate(out.len() - 1);
    }
    // -ing, -ed.
    for suffix in ["ing", "ed"] {
        if out.ends_with(suffix) && out.len() - suffix.len() >= 3 {
            let stem_len = out.len() - suffix.len();
            let stem = &out[..stem_len];
            // A stem needs a vowel: `thing`, `red`, `need` stay.
            if stem.bytes().any(is_vowel) {
                out.truncate(stem_len);
                undouble(out);
            }
            break;
        }
    }
    // -tion, -sion: the t or s stays (`creation` → `creat`, `session` → `sess`).
    if (out.ends_with("tion") || out.ends_with("sion")) && out.len() >= 6 {
        out.truncate(out.len() - 3);
    }
    // A final silent e: `create` → `creat`, `update` → `updat`.
    if out.ends_with('e') && out.len() >= 4 && !out.ends_with("ee") {
        out.pop();
    }
}

fn is_vowel(b: u8) -> bool {
    matches!(b, b'a' | b'e' | b'i' | b'o' | b'u' | b'y')
}

/// `stopp` → `stop`, `runn` → `run`; `ll`, `ss`, `zz` stay (`install`, `access`).
fn undouble(out: &mut String) {
    let b = out.as_bytes();
    let n = b.len();
    if n >= 3 && b[n - 1] == b[n - 2] && !is_vowel(b[n - 1]) && !matches!(b[n - 1], b'l' | b's' | b'z') {
        out.pop();
    }
}

/// Words that stand for one another in requests and tool names: the verbs of tool names,
/// and a few nouns with a common other name. A word may be in more than one group. Kept
/// general on purpose: nothing here names a product.
const SYNONYMS: &[&[&str]] = &[
    // Making things.
    &[
        "create", "new", "add", "make", "open", "insert", "generate", "declare", "setup",
    ],
    &["add", "append", "insert", "stage"],
    // Looking for things.
    &[
        "list",
        "show",
        "find",
        "search",
        "browse",
        "enumerate",
        "lookup",
        "query",
        "discover",
        "filter",
    ],
    // Reading one thing.
    &[
        "get", "read", "fetch", "view", "retrieve", "show", "display", "describe", "inspect", "detail", "open", "give",
    ],
    // Removing things.
    &[
        "delete",
        "remove",
        "drop",
        "destroy",
        "erase",
        "purge",
        "forget",
        "discard",
        "unset",
        "clear",
        "uninstall",
    ],
    // Changing things.
    &[
        "update", "edit", "modify", "change", "set", "patch", "alter", "adjust", "rename", "replace", "revise",
    ],
    &["write", "save", "store", "persist"],
    // Running things.
    &[
        "run", "execute", "exec", "trigger", "invoke", "launch", "start", "kick", "rerun", "dispatch",
    ],
    &["stop", "cancel", "halt", "abort", "terminate", "kill", "end"],
    &["close", "resolve", "finish", "complete", "done"],
    &["send", "post", "submit", "publish", "push", "deliver"],
    &["comment", "note", "reply", "remark", "annotate"],
    &["assign", "allocate", "delegate"],
    &["move", "transfer", "relocate", "transition", "rename"],
    &["copy", "duplicate", "clone"],
    &["download", "fetch", "export"],
    &["upload", "attach"],
    &["install", "deploy", "setup"],
    &["check", "verify", "validate", "test", "assert"],
    &["connect", "link", "associate", "relate"],
    &["restore", "recover", "undo", "revert", "rollback"],
    &["wait", "pause", "sleep"],
    &["diff", "compare", "difference"],
    &["navigate", "go", "visit", "browse"],
    &["press", "hit", "tap"],
    &["request", "ask"],
    &["sum", "add", "total", "plus"],
    &["now", "current", "latest", "newest", "recent", "last"],
    &["balance", "funds", "money"],
    &["watch", "watcher", "follow", "subscribe", "subscription"],
    &["enable", "activate"],
    &["disable", "deactivate"],
    // Nouns with another common name.
    &["issue", "ticket", "bug", "defect"],
    &["pr", "pull"],
    &["repo", "repository"],
    &["directory", "folder", "dir"],
    &["image", "picture", "screenshot", "photo", "png", "jpeg"],
    &["error", "exception", "crash", "failure", "fault"],
    &["log", "logs", "logging"],
    &["doc", "docs", "documentation", "manual", "guide"],
    &[
        "user",
        "member",
        "people",
        "person",
        "account",
        "everyone",
        "collaborator",
    ],
    &["message", "msg"],
    &["database", "db"],
    &["kubernetes", "k8s", "kube", "cluster"],
    &["config", "configuration", "settings", "setting", "preference"],
    &["credential", "secret", "password", "token", "key"],
    &["metric", "measurement", "stat", "statistic"],
    &["schedule", "calendar", "rota", "roster"],
    &["bill", "invoice"],
    &["coupon", "promo", "promotion", "discount", "voucher"],
    &["link", "url"],
    &[
        "address",
        "location",
        "place",
        "coordinate",
        "geocode",
        "latitude",
        "longitude",
    ],
    &["distance", "far", "apart", "travel"],
    &["elevation", "altitude", "height", "high"],
    &["size", "resize", "dimension", "width"],
    &["batch", "bulk", "many", "multiple", "several"],
    &["restart", "rollout", "redeploy", "reboot"],
    &["deploy", "deployment"],
    &["reset", "unstage"],
    &["flaky", "random", "intermittent", "unstable"],
    &["blame", "author", "wrote"],
    &["time", "hour", "worklog", "spent", "effort"],
    &["output", "log", "print", "console"],
    &["artifact", "output", "binary"],
    &["aggregate", "group", "total", "sum"],
    &["schema", "field", "structure", "shape"],
    &["accept", "handle", "dismiss"],
    &["remember", "memory", "observation", "fact", "know", "knowledge"],
    &["view", "look", "seen", "visit"],
    &["spreadsheet", "csv", "table"],
    &["switch", "checkout", "context"],
    &["readme", "file", "content"],
    &["whoami", "self", "myself", "authenticated"],
    &["page", "webpage", "site"],
    &["tab", "window"],
    &["team", "group"],
    &["version", "release"],
    &["tag", "label"],
    &["child", "children", "sub", "nested"],
    // The vocabulary of the services teams put behind a gateway.
    &["workflow", "pipeline", "ci", "action", "job", "build"],
    &["release", "ship", "rollout"],
    &["alert", "alarm", "notification", "warning"],
    &["incident", "outage", "emergency"],
    &["payment", "charge", "pay", "transaction", "money"],
    &["customer", "client", "buyer"],
    &["price", "pricing", "cost"],
    &["dispute", "chargeback"],
    &["subscription", "plan", "membership"],
    &["email", "mail"],
    &["conversation", "chat", "thread"],
    &["screenshot", "capture"],
    &["key", "keystroke", "keyboard"],
    &["dropdown", "select", "option", "combobox"],
    &["dialog", "popup", "modal", "prompt", "confirm"],
    &["form", "field", "input"],
    &["scroll", "wheel"],
    &["container", "pod"],
    &["vulnerability", "vulnerable", "advisory", "cve"],
    &["dependency", "package", "library"],
    &["star", "favorite", "bookmark"],
    &["review", "approve"],
    &["history", "log"],
    &["content", "contents", "text", "body"],
    &["timezone", "zone"],
    &["think", "reason", "reflect"],
    &["echo", "repeat"],
    &["environment", "env", "variable"],
    &["compress", "gzip", "zip"],
    &["remember", "memorize"],
    &["relation", "relationship", "connection"],
    &["knowledge", "memory", "graph"],
    &["replica", "instance"],
    &["manifest", "yaml", "spec"],
    &["dashboard", "panel"],
    &["datasource", "source"],
    &["latency", "duration", "slow", "performance"],
    &["oncall", "pager", "duty", "shift"],
    &["silence", "mute", "snooze", "suppress"],
    &["annotation", "marker"],
    &["trace", "span"],
    &["profile", "flamegraph", "cpu"],
    &["sprint", "iteration"],
    &["issue", "story", "task", "epic"],
    &["assignee", "owner"],
    &["attachment", "file"],
    &["restriction", "permission", "access", "lock", "restrict", "protect"],
    &["bucket", "storage"],
    &["migration", "ddl", "schema"],
    &["column", "field"],
    &["organization", "org", "company"],
    &["pause", "suspend"],
    &["resume", "unpause", "restore"],
];

/// Two-word verbs of requests, read as one word (`set up` is not `set`).
pub const PHRASES: &[(&str, &str)] = &[
    ("set up", "setup"),
    ("sign in", "login"),
    ("log in", "login"),
    ("sign up", "signup"),
    ("sign out", "logout"),
    ("log out", "logout"),
    ("roll back", "rollback"),
    ("kick off", "start"),
    ("spin up", "create"),
    ("start up", "start"),
    ("shut down", "stop"),
    ("take down", "stop"),
    ("clean up", "delete"),
    ("look up", "lookup"),
    ("look for", "find"),
    ("turn on", "enable"),
    ("turn off", "disable"),
    ("check out", "checkout"),
    ("fill in", "fill"),
    ("fill out", "fill"),
    ("back up", "backup"),
    ("look at", "view"),
    ("up to", "update"),
    ("how long", "duration"),
    ("how many", "count"),
    ("how much", "amount"),
    ("get rid", "delete"),
    ("who am", "whoami"),
    ("tear down", "delete"),
    ("went out", "deploy"),
    ("to-do list", "todo"),
];

/// Each stemmed word of [`SYNONYMS`] and the other stems of its groups.
pub fn synonyms(stemmed: &str) -> &'static [Box<str>] {
    type Table = HashMap<String, Vec<Box<str>>, foldhash::fast::FixedState>;
    static TABLE: OnceLock<Table> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = Table::default();
        for group in SYNONYMS {
            let stems: Vec<String> = group.iter().map(|w| stem(w)).collect();
            for s in &stems {
                let others = table.entry(s.clone()).or_default();
                for o in &stems {
                    if o != s && !others.iter().any(|x| &**x == o.as_str()) {
                        others.push(o.as_str().into());
                    }
                }
            }
        }
        table
    });
    table.get(stemmed).map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        terms(text, |t| out.push(t.to_owned()));
        out
    }

    #[test]
    fn identifiers_split_into_words() {
        assert_eq!(all("github__create_issue"), ["github", "creat", "issu"]);
        assert_eq!(all("createPullRequest"), ["creat", "pull", "request"]);
        assert_eq!(all("API-post-search"), ["api", "post", "search"]);
        assert_eq!(all("HTTPServer s3Protocol"), ["http", "server", "s3", "protocol"]);
        assert_eq!(all("the 42 pods, in a namespace"), ["pod", "namespac"]);
    }

    #[test]
    fn the_stemmer_folds_a_word_family_and_keeps_short_words() {
        for w in ["create", "creates", "created", "creating", "creation"] {
            assert_eq!(stem(w), "creat", "{w}");
        }
        for (w, s) in [
            ("issues", "issu"),
            ("entities", "entity"),
            ("searches", "search"),
            ("stopped", "stop"),
            ("running", "run"),
            ("listing", "list"),
            ("configuration", "configurat"),
            ("validate", "validat"),
            ("validation", "validat"),
            ("deletion", "delet"),
            ("status", "status"),
            ("analysis", "analysis"),
            ("access", "access"),
            ("user", "user"),
            ("logs", "log"),
            ("thing", "thing"),
            ("watchers", "watcher"),
            ("customers", "customer"),
            ("need", "need"),
        ] {
            assert_eq!(stem(w), s, "{w}");
        }
    }

    #[test]
    fn synonyms_are_looked_up_by_stem() {
        assert!(synonyms(&stem("ticket")).iter().any(|s| &**s == "issu"));
        assert!(synonyms(&stem("remove")).iter().any(|s| &**s == "delet"));
        assert!(synonyms("nothing-like-it").is_empty());
    }
}
