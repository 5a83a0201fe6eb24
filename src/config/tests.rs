use super::*;
use std::time::Duration;

fn env(k: &str) -> Option<String> {
    match k {
        "SET" => Some("value".into()),
        "EMPTY" => Some(String::new()),
        _ => None,
    }
}

#[test]
fn expands() {
    assert_eq!(expand("a${SET}b", &env).unwrap(), "avalueb");
    assert_eq!(expand("${NOPE:-fast}", &env).unwrap(), "fast");
    assert_eq!(expand("${EMPTY:-d}", &env).unwrap(), "d");
    assert_eq!(expand("$$x $y", &env).unwrap(), "$x $y");
    assert_eq!(expand("${NOPE}", &env).unwrap_err(), "NOPE");
}

#[test]
fn globs() {
    assert!(glob("*", "anything"));
    assert!(glob("delete_*", "delete_all"));
    assert!(!glob("delete_*", "create"));
    assert!(glob("a?c", "abc"));
    let f = Filter {
        allow: vec!["*".into()],
        deny: vec!["delete_*".into()],
    };
    assert!(f.permits("create") && !f.permits("delete_x"));
}

#[test]
fn a_servers_max_sessions_of_zero_is_an_error_not_one() {
    let src = "[servers.s]\ncommand = \"x\"\nisolation = \"session\"\nmax_sessions = 0\n";
    let e = Config::parse(Path::new("g.toml"), src, &env)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("servers.s.max_sessions must be at least 1"), "{e}");
    let ok = "[servers.s]\ncommand = \"x\"\nisolation = \"session\"\nmax_sessions = 1\n";
    assert_eq!(
        Config::parse(Path::new("g.toml"), ok, &env).unwrap().servers[0].max_sessions,
        1
    );
}

#[test]
fn max_sessions_per_client_defaults_to_a_tenth_and_is_located_when_zero() {
    let at = |src: &str| Config::parse(Path::new("g.toml"), src, &env);
    let per = |src: &str| at(src).map(|c| c.gateway.max_sessions_per_client).ok();
    assert_eq!(per(""), Some(1_000));
    assert_eq!(per("[gateway]\nmax_sessions = 25\n"), Some(2));
    assert_eq!(per("[gateway]\nmax_sessions = 5\n"), Some(1));
    assert_eq!(
        per("[gateway]\nmax_sessions = 5\nmax_sessions_per_client = 5\n"),
        Some(5)
    );
    let errors = at("[gateway]\nmax_sessions_per_client = 0\n")
        .err()
        .map(|e| e.to_string());
    let errors = errors.unwrap_or_default();
    assert!(
        errors.contains("g.toml:2:27") && errors.contains("at least 1"),
        "{errors}"
    );
}

#[test]
fn max_connections_per_address_has_a_default_and_is_located_when_zero() {
    let at = |src: &str| Config::parse(Path::new("g.toml"), src, &env);
    let per = |src: &str| at(src).map(|c| c.gateway.max_connections_per_address).ok();
    assert_eq!(per(""), Some(crate::config::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS));
    assert_eq!(per("[gateway]\nmax_connections_per_address = 8\n"), Some(8));
    let errors = at("[gateway]\nmax_connections_per_address = 0\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        errors.contains("g.toml:2:31") && errors.contains("gateway.max_connections_per_address must be at least 1"),
        "{errors}"
    );
    let errors = at("[gateway]\nmax_connections_per_address = \"many\"\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(errors.contains("a whole number"), "{errors}");
}

#[test]
fn durations_and_sizes() {
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("5"), None);
    // Past what a Duration holds (it panicked), or infinite: not a duration.
    assert_eq!(parse_duration("99999999999999999999s"), None);
    assert_eq!(parse_duration("5124095576030431h"), None);
    assert_eq!(parse_size("16MiB"), Some(16 << 20));
    assert_eq!(parse_size("x"), None);
}

#[test]
fn busy_poll_defaults_to_200us_may_be_0_and_is_at_most_10ms() {
    let none = |_: &str| None;
    let c = Config::parse(Path::new("g.toml"), "", &none).unwrap();
    assert_eq!(c.gateway.busy_poll, Duration::from_micros(200));
    for (v, want) in [
        ("0us", Duration::ZERO),
        ("0s", Duration::ZERO),
        ("50us", Duration::from_micros(50)),
        ("50µs", Duration::from_micros(50)),
        ("1ms", Duration::from_millis(1)),
        ("10ms", Duration::from_millis(10)),
    ] {
        let src = format!("[gateway]\nbusy_poll = \"{v}\"\n");
        let c = Config::parse(Path::new("g.toml"), &src, &none).unwrap();
        assert_eq!(c.gateway.busy_poll, want, "{v}");
    }
    for bad in ["11ms", "1s", "200", "fast"] {
        let src = format!("[gateway]\nbusy_poll = \"{bad}\"\n");
        let e = Config::parse(Path::new("g.toml"), &src, &none).unwrap_err().to_string();
        assert!(e.contains("g.toml:2:") && e.contains("busy_poll"), "{bad}: {e}");
    }
}

#[test]
fn max_connections_is_a_remote_servers_and_at_least_1() {
    let none = |_: &str| None;
    let remote = |extra: &str| format!("[servers.r]\nurl = \"http://127.0.0.1:9/mcp\"\n{extra}\n");
    let http = |c: &Config| match &c.servers[0].transport {
        Transport::Http(h) => h.max_connections,
        other => panic!("{other:?}"),
    };
    let c = Config::parse(Path::new("g.toml"), &remote(""), &none).unwrap();
    assert_eq!(http(&c), 256);
    let c = Config::parse(Path::new("g.toml"), &remote("max_connections = 8"), &none).unwrap();
    assert_eq!(http(&c), 8);
    let e = Config::parse(Path::new("g.toml"), &remote("max_connections = 0"), &none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("g.toml:3:") && e.contains("servers.r.max_connections must be at least 1"),
        "{e}"
    );
    let stdio = "[servers.s]\ncommand = \"true\"\nmax_connections = 8\n";
    let e = Config::parse(Path::new("g.toml"), stdio, &none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("servers.s.max_connections only applies to remote servers"),
        "{e}"
    );
}

#[test]
fn drain_delay_defaults_to_5s_and_may_be_0s() {
    let none = |_: &str| None;
    let c = Config::parse(Path::new("g.toml"), "", &none).unwrap();
    assert_eq!(c.gateway.drain_delay, Duration::from_secs(5));
    for zero in ["0s", "0ms", "0.0s"] {
        let src = format!("[gateway]\ndrain_delay = \"{zero}\"\n");
        let c = Config::parse(Path::new("g.toml"), &src, &none).unwrap();
        assert_eq!(c.gateway.drain_delay, Duration::ZERO, "{zero}");
    }
    let c = Config::parse(Path::new("g.toml"), "[gateway]\ndrain_delay = \"1500ms\"\n", &none).unwrap();
    assert_eq!(c.gateway.drain_delay, Duration::from_millis(1500));
    for bad in ["0", "-1s", "5"] {
        let src = format!("[gateway]\ndrain_delay = \"{bad}\"\n");
        assert!(Config::parse(Path::new("g.toml"), &src, &none).is_err(), "{bad}");
    }
    // Zero is for drain_delay only: a zero grace is still refused.
    assert!(Config::parse(Path::new("g.toml"), "[gateway]\nshutdown_grace = \"0s\"\n", &none).is_err());
}

#[test]
fn telemetry_table_and_otel_env() {
    let none = |_: &str| None;
    let c = Config::parse(Path::new("g.toml"), "", &none).unwrap();
    assert_eq!(c.telemetry.otlp_endpoint, None);
    assert_eq!(c.telemetry.service_name, "mcp-gateway");

    let src =
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/\"\nlog_format = \"json\"\nrecord_payloads = true\n";
    let c = Config::parse(Path::new("g.toml"), src, &none).unwrap();
    let t = &c.telemetry;
    assert_eq!(t.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
    assert_eq!((t.log_format, t.record_payloads), (LogFormat::Json, true));
    // The path goes before a query, and is not added twice.
    for (written, used) in [
        ("http://c:4318/?tenant=a/b", "http://c:4318/v1/traces?tenant=a/b"),
        ("http://c:4318/otlp?k=v", "http://c:4318/otlp/v1/traces?k=v"),
        ("http://c:4318/v1/traces?k=v", "http://c:4318/v1/traces?k=v"),
    ] {
        let src = format!("[telemetry]\notlp_endpoint = {written:?}\n");
        let t = Config::parse(Path::new("g.toml"), &src, &none).unwrap().telemetry;
        assert_eq!(t.otlp_endpoint.as_deref(), Some(used), "{written}");
    }

    let otel = |k: &str| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4317".to_owned()),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".to_owned()),
        "OTEL_SERVICE_NAME" => Some("svc".to_owned()),
        "OTEL_BSP_SCHEDULE_DELAY" => Some("100".to_owned()),
        _ => None,
    };
    let t = Config::parse(Path::new("g.toml"), "", &otel).unwrap().telemetry;
    assert_eq!(t.otlp_endpoint.as_deref(), Some("http://collector:4317"));
    assert_eq!(t.otlp_protocol, OtlpProtocol::Grpc);
    assert_eq!(t.service_name, "svc");
    assert_eq!(t.batch_delay, Some(Duration::from_millis(100)));

    let src = "[telemetry]\notlp_protocol = \"http/json\"\nlog_format = \"xml\"\nsampling = 1\n";
    let e = Config::parse(Path::new("g.toml"), src, &none).unwrap_err();
    assert_eq!((e.0[0].line, e.0[0].column), (4, 1), "{e}");
    assert!(e.to_string().contains("sampling"), "{e}");
    let src = "[telemetry]\notlp_protocol = \"http/json\"\nlog_format = \"xml\"\notlp_endpoint = \"localhost:4318\"\n";
    let e = Config::parse(Path::new("g.toml"), src, &none).unwrap_err();
    let lines: Vec<_> = e.0.iter().map(|e| (e.line, e.column)).collect();
    assert_eq!(lines, [(2, 17), (4, 17), (3, 14)], "{e}");
    assert!(e.to_string().contains("telemetry.otlp_protocol: \"http/json\""), "{e}");
}

#[test]
fn clients_and_oauth() {
    let none = |_: &str| None;
    let c = Config::parse(Path::new("g.toml"), "", &none).unwrap();
    assert!(!c.auth.required());

    let env = |k: &str| (k == "ALICE_TOKEN").then(|| "s3cret-alice".to_owned());
    let digest = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"; // "secret"
    let src = format!(
        "[clients.alice]\ntoken = \"${{ALICE_TOKEN}}\"\nallow = [\"calc__*\"]\nrate_limit = \"5/s\"\n\n\
         [clients.bob]\ntoken_sha256 = \"{}\"\ndeny = [\"calc__delete*\"]\n\n[clients.carol]\n\n\
         [auth.oauth]\nissuer = \"https://issuer.example\"\naudience = \"mcp-gateway\"\n\
         jwks_url = \"https://issuer.example/jwks.json\"\n",
        digest.to_uppercase()
    );
    let c = Config::parse(Path::new("g.toml"), &src, &env).unwrap();
    assert!(c.auth.required());
    let names: Vec<_> = c.auth.clients.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["alice", "bob", "carol"]);
    let alice = c.auth.client("alice").unwrap();
    assert_eq!(alice.token, Some(TokenDigest::of("s3cret-alice")));
    assert_eq!(alice.rate_limit, Rate::parse("5/s"));
    assert!(alice.filter.permits("calc__add") && !alice.filter.permits("docs__x"));
    assert_eq!(c.auth.client("bob").unwrap().token, Some(TokenDigest::of("secret")));
    assert!(c.auth.client("carol").unwrap().token.is_none());
    assert!(c.auth.client("carol").unwrap().unrestricted());
    let o = c.auth.oauth.as_ref().unwrap();
    assert_eq!((o.client_claim.as_str(), o.resource.as_deref()), ("sub", None));
    // Neither the token nor its digest shows.
    let shown = format!("{c:?}");
    assert!(!shown.contains("s3cret") && !shown.contains("2bb80d") && !shown.contains("2BB80D"));

    let bad = "[clients.a]\ntoken = \"${NOPE}\"\n\n[clients.b]\ntoken_sha256 = \"abc\"\n\n\
               [clients.c]\ntoken = \"x\"\ntoken_sha256 = \"y\"\n\n[clients.d]\ntoken = \"same\"\n\n\
               [clients.e]\ntoken = \"same\"\nrate_limit = \"fast\"\n\n\
               [auth.oauth]\nissuer = \"i\"\naudience = \"\"\njwks_url = \"ftp://x\"\n";
    let e = Config::parse(Path::new("g.toml"), bad, &none).unwrap_err();
    let text = e.to_string();
    for want in [
        "g.toml:2:9: clients.a.token: environment variable NOPE is not set",
        "g.toml:5:16: clients.b.token_sha256 is not 64 hex digits",
        "g.toml:9:16: clients.c: give either `token` or `token_sha256`, not both",
        "g.toml:15:9: clients.e.token: client \"d\" has the same token",
        "g.toml:16:14: clients.e.rate_limit: \"fast\" is not a rate",
        "g.toml:20:12: auth.oauth.audience is empty",
        "g.toml:21:12: auth.oauth.jwks_url must start with http:// or https://",
    ] {
        assert!(text.contains(want), "{want}\nnot in\n{text}");
    }
    assert!(!text.contains("same\""), "{text}");

    let e = Config::parse(Path::new("g.toml"), "[clients.a]\ntokn = \"x\"\n", &none).unwrap_err();
    assert!(e.to_string().contains("tokn"), "{e}");
    let e = Config::parse(Path::new("g.toml"), "[auth.oauth]\nissuer = \"x\"\n", &none).unwrap_err();
    assert!(e.to_string().contains("audience"), "{e}");
}

#[test]
fn every_table_is_checked_on_its_own_and_each_bad_key_once() {
    let src = "servers.i = { command = 5, enabled = \"no\" }\n\n[servers.j]\ncomand = \"x\"\n\
               tools = { allow = \"echo\", nope = [] }\n\n[auth.oauth]\nissuer = 5\naudience = \"a\"\n\
               jwks_url = \"https://x\"\n\n[gatway]\n";
    let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err();
    let got: Vec<_> = e.0.iter().map(|e| (e.line, e.column, e.message.as_str())).collect();
    let starts = |m: &str, s: &str| m.starts_with(s);
    let want: &[(usize, usize, &str)] = &[
        (1, 25, "servers.i.command: expected a string like \"npx\""),
        (1, 38, "servers.i.enabled: expected a boolean"),
        (4, 1, "servers.j: unknown key \"comand\"; expected one of command, url,"),
        (5, 19, "servers.j.tools.allow: expected a list of globs like"),
        (
            5,
            27,
            "servers.j.tools: unknown key \"nope\"; expected one of allow, deny",
        ),
        (8, 10, "auth.oauth.issuer: expected a URL string like"),
        (12, 2, "the top level: unknown key \"gatway\""),
        // Its command was reported as the wrong type: no "needs `command`" for i.
        (3, 10, "servers.j: needs `command` (a stdio server) or `url`"),
    ];
    assert_eq!(got.len(), want.len(), "{e}");
    for ((l, c, m), (wl, wc, wm)) in got.iter().zip(want) {
        assert!(
            (l, c) == (wl, wc) && starts(m, wm),
            "{l}:{c}: {m}\nwanted {wl}:{wc}: {wm}\nall:\n{e}"
        );
    }
    // A missing required key is named.
    let e = Config::parse(Path::new("g.toml"), "[auth.oauth]\nissuer = \"i\"\n", &env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "g.toml:1:1: auth.oauth: missing required key \"audience\" (a string like audience = \"mcp-gateway\")"
    );
}

#[test]
fn errors_are_located_and_secret_free() {
    let src = "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[servers.a]\ncommand = \"x\"\nenv = { K = \"${MISSING}\", S = \"${SET}\" }\n";
    let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err();
    assert_eq!(e.0.len(), 1);
    assert_eq!((e.0[0].line, e.0[0].column), (6, 13));
    assert!(e.0[0].message.contains("servers.a.env.K") && e.0[0].message.contains("MISSING"));
    assert!(!e.to_string().contains("value"));

    let e = Config::parse(Path::new("g.toml"), "[gateway]\nlisten = \"x\"\nbogus = 1\n", &env).unwrap_err();
    assert_eq!(e.0[0].line, 3, "{e}");
    assert!(e.to_string().contains("bogus"), "{e}");

    let ok = Config::parse(
        Path::new("g.toml"),
        "[servers.b]\ncommand = \"x\"\nenv = { S = \"${SET}\" }\n",
        &env,
    )
    .unwrap();
    assert!(!format!("{ok:?}").contains("value"));
    assert_eq!(ok.servers[0].prefix, "b");
}

#[test]
fn profiles_choose_servers_by_name_and_tag_and_keep_search() {
    let none = |_: &str| None;
    let src = "[servers.github]\ncommand = \"x\"\ntags = [\"web\", \"vcs\", \"web\"]\n\
               [servers.db]\ncommand = \"x\"\ntags = [\"db\"]\n\
               [servers.figma]\ncommand = \"x\"\n\
               [profiles.frontend]\nservers = [\"figma\"]\ntags = [\"web\"]\n\
               tools = { allow = [\"github__*\", \"figma__*\"], deny = [\"*delete*\"] }\nsearch = true\n\
               [profiles.all]\n";
    let c = Config::parse(Path::new("g.toml"), src, &none).unwrap();
    assert_eq!(c.servers[0].tags, ["web", "vcs"], "deduplicated");
    let f = c.profile("frontend").unwrap();
    assert!(f.search);
    assert!(f.tools.permits("github__x") && !f.tools.permits("github__delete_x"));
    let chosen: Vec<&str> = c
        .servers
        .iter()
        .filter(|s| f.includes(s))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(chosen, ["github", "figma"]);
    let all = c.profile("all").unwrap();
    assert!(!all.search);
    assert!(
        c.servers.iter().all(|s| all.includes(s)),
        "neither servers nor tags: every server"
    );
}

#[test]
fn profile_errors_are_located() {
    let none = |_: &str| None;
    let src = "[servers.github]\ncommand = \"x\"\ntags = [\"web\", \"a b\"]\n\
               [profiles.\"bad name\"]\n\
               [profiles.status]\n\
               [profiles.ok]\nservers = [\"github\", \"gitlab\"]\ntags = [\"wbe\"]\nsearch = \"yes\"\n\
               [profiles.other]\nnope = 1\n\
               [profiles.shut]\nservers = []\ntags = []\n";
    let e = Config::parse(Path::new("g.toml"), src, &none).unwrap_err().to_string();
    for want in [
        "g.toml:3:16: servers.github.tags: \"a b\" may only use [A-Za-z0-9_.-]",
        "g.toml:4:11: profile name \"bad name\" may only use [A-Za-z0-9_-]",
        "g.toml:5:11: profile name \"status\" is reserved",
        "g.toml:7:22: profiles.ok.servers: no [servers.gitlab] in this file (servers: github)",
        "g.toml:8:9: profiles.ok.tags: no server has the tag \"wbe\" (tags: web)",
        "profiles.ok.search: expected a boolean",
        "profiles.other: unknown key \"nope\"; expected one of servers, tags, tools, search",
        // An emptied list is not "every server": it is said, where it is.
        "g.toml:13:11: profiles.shut.servers is empty: name at least one, or leave `servers` out",
        "g.toml:14:8: profiles.shut.tags is empty",
    ] {
        assert!(e.contains(want), "{want}\nnot in:\n{e}");
    }
}

#[test]
fn client_references_stay_templates_and_fill_per_caller() {
    let t = expand_template("Bearer ${client:GH} for ${SET}$$", &env).unwrap();
    assert_eq!(t.secrets().collect::<Vec<_>>(), ["GH"]);
    let alice = |n: &str| (n == "GH").then(|| "a-token".to_owned());
    assert_eq!(t.fill(&alice).unwrap().expose(), "Bearer a-token for value$");
    assert_eq!(t.fill(&|_| None).unwrap_err(), "GH");
    assert_eq!(format!("{t:?}"), "****");
    assert!(expand_template("plain ${SET}", &env).unwrap().is_plain());
}

#[test]
fn client_secrets_in_a_shared_stdio_servers_env_are_refused() {
    let src = "[clients.alice]\ntoken = \"${SET}\"\nsecrets = { GH = \"${SET}\" }\n\n\
               [servers.gh]\ncommand = \"x\"\nenv = { GITHUB_TOKEN = \"${client:GH}\" }\n";
    let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err().to_string();
    assert!(
        e.contains("servers.gh.env.GITHUB_TOKEN") && e.contains("isolation = \"client\""),
        "{e}"
    );
    for isolation in ["client", "session"] {
        let ok = format!("{src}isolation = \"{isolation}\"\n");
        let c = Config::parse(Path::new("g.toml"), &ok, &env).unwrap();
        let Transport::Stdio(spec) = &c.servers[0].transport else {
            panic!()
        };
        assert!(spec.env.is_empty() && spec.per_client());
        let filled = spec.for_client(&|n| (n == "GH").then(|| "t".to_owned())).unwrap();
        assert_eq!(filled.env.len(), 1);
        assert_eq!(filled.env[0].1.expose(), "t");
        assert_eq!(spec.for_client(&|_| None).unwrap_err().0, "GH");
        assert_eq!(c.auth.clients[0].secret("GH").map(Secret::expose), Some("value"));
        assert!(!format!("{c:?}").contains("value"));
    }
}

#[test]
fn client_secrets_are_checked_by_name_and_value() {
    let src = "[clients.a]\ntoken = \"${SET}\"\nsecrets = { \"bad name\" = \"x\", EMPTY = \"${EMPTY}\", GONE = \"${NOPE}\" }\n\n\
               [servers.h]\nurl = \"http://h\"\nheaders = { Authorization = \"Bearer ${client:}\" }\n";
    let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err().to_string();
    for want in [
        "clients.a.secrets: \"bad name\"",
        "clients.a.secrets.EMPTY is empty",
        "clients.a.secrets.GONE: environment variable NOPE",
        "servers.h.headers.Authorization: ${client:}",
    ] {
        assert!(e.contains(want), "{want} not in {e}");
    }
}

#[test]
fn a_client_reference_in_a_url_is_refused_clearly() {
    let src = "[servers.h]\nurl = \"https://h/mcp?key=${client:K}\"\n";
    let e = Config::parse(Path::new("g.toml"), src, &env).unwrap_err().to_string();
    assert!(e.contains("servers.h.url: ${client:K} cannot be in a url"), "{e}");
}

#[test]
fn the_consent_keys_of_gateway_are_checked() {
    let at = |src: &str| Config::parse(Path::new("/etc/gw/g.toml"), src, &env);
    let errors = |src: &str| at(src).err().map(|e| e.to_string()).unwrap_or_default();
    let g = at("[gateway]\npublic_url = \"https://gw.example/\"\nstate_dir = \"state\"\n")
        .unwrap()
        .gateway;
    assert_eq!(g.public_url.as_deref(), Some("https://gw.example"));
    assert!(
        g.state_dir.ends_with("state") && g.state_dir.is_absolute(),
        "{:?}",
        g.state_dir
    );
    assert!(g.token_key.is_none());
    for bad in ["ftp://x", "https://gw.example/?next=evil", "https://gw example"] {
        let e = errors(&format!("[gateway]\npublic_url = {bad:?}\n"));
        assert!(e.contains("public_url"), "{bad}: {e}");
    }
    assert!(errors("[gateway]\ntoken_key = \"short\"\n").contains("token_key must be at least 32"));
    let e = errors("[gateway]\ntoken_key = \"${NOPE}\"\n");
    assert!(e.contains("token_key: environment variable NOPE is not set"), "{e}");
    let k = at("[gateway]\ntoken_key = \"${SET}${SET}${SET}${SET}${SET}${SET}${SET}\"\n").unwrap();
    assert_eq!(format!("{:?}", k.gateway.token_key), "Some(****)", "a secret");
}

#[test]
fn args_expand_variables_and_keep_their_values_hidden() {
    let src = "[servers.pg]\ncommand = \"pg-mcp\"\nargs = [\"--db\", \"postgresql://app:${SET}@db/app\", \"$$5\", \"${NOPE:-none}\", \"$${client:x}\"]\n";
    let c = Config::parse(Path::new("g.toml"), src, &env).unwrap_or_else(|e| panic!("{e}"));
    let Transport::Stdio(spec) = &c.servers[0].transport else {
        panic!("a stdio server")
    };
    let args: Vec<&str> = spec.args.iter().map(Secret::expose).collect();
    assert_eq!(
        args,
        ["--db", "postgresql://app:value@db/app", "$5", "none", "${client:x}"]
    );
    // The variable's value is masked in the child's stderr, and never printed.
    assert_eq!(spec.masked, vec![Secret::new("value")]);
    assert!(!format!("{spec:?}").contains("value@db"), "{spec:?}");

    for (bad, want) in [
        (
            "[\"${NOPE}\"]",
            "servers.pg.args[0]: environment variable NOPE is not set",
        ),
        (
            "[\"a\", \"${client:token}\"]",
            "servers.pg.args[1]: ${client:…} is for `env` and `headers` only",
        ),
    ] {
        let src = format!("[servers.pg]\ncommand = \"pg-mcp\"\nisolation = \"client\"\nargs = {bad}\n");
        let e = Config::parse(Path::new("g.toml"), &src, &env)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want), "{bad}: {e}");
    }
}

#[test]
fn a_url_is_shown_without_the_credentials_written_in_it() {
    use super::servers::shown_url;
    for (written, shown) in [
        ("https://mcp.example.com/mcp", "https://mcp.example.com/mcp"),
        (
            "http://user:sk-PASS-456@host:8080/mcp",
            "http://user:****@host:8080/mcp",
        ),
        ("http://user:${PASS}@host/mcp", "http://user:${PASS}@host/mcp"),
        ("http://user@host/mcp", "http://user@host/mcp"),
        ("http://a:b@c@host/mcp", "http://a:****@host/mcp"),
        (
            "https://h/mcp?api_key=abc123def&region=eu&token=${T}#x",
            "https://h/mcp?api_key=****&region=eu&token=${T}#x",
        ),
        (
            "https://h/mcp?sig=Zm9vYmFyYmF6&auth=true",
            "https://h/mcp?sig=****&auth=true",
        ),
    ] {
        assert_eq!(shown_url(written), shown, "{written}");
    }
}

#[test]
fn the_endpoint_is_not_served_where_the_gateways_own_pages_are() {
    for bad in [
        "/",
        "/status",
        "/status/x",
        "/metrics/",
        "/oauth/callback",
        "/.well-known/x",
        "/a/{b}",
        "/a//b",
        "/a*",
    ] {
        let toml = format!("[gateway]\npath = {bad:?}\n");
        let e = Config::parse(Path::new("g.toml"), &toml, &env).expect_err(bad);
        assert!(e.to_string().contains("path:"), "{bad}: {e}");
    }
    for good in ["/mcp", "/mcp/", "/team/mcp", "/statusx"] {
        let toml = format!("[gateway]\npath = {good:?}\n");
        assert!(Config::parse(Path::new("g.toml"), &toml, &env).is_ok(), "{good}");
    }
}

#[test]
fn an_env_key_that_is_no_variable_name_is_an_error() {
    for bad in ["", "A=B", "A\\u0000B"] {
        let toml = format!("[servers.s]\ncommand = \"x\"\nenv = {{ \"{bad}\" = \"v\" }}\n");
        let e = Config::parse(Path::new("g.toml"), &toml, &env).expect_err(bad);
        assert!(e.to_string().contains("is not a variable name"), "{bad:?}: {e}");
    }
}

#[test]
fn a_duration_past_ten_years_is_an_error_at_its_place() {
    let none = |_: &str| None;
    for (v, says) in [
        ("2777777777777777h", "longer than the longest duration"),
        ("99999999999999999999s", "is not a duration"),
    ] {
        let src = format!("[gateway]\nshutdown_grace = \"{v}\"\n");
        let e = Config::parse(Path::new("g.toml"), &src, &none).unwrap_err().to_string();
        assert!(
            e.contains("g.toml:2:") && e.contains("shutdown_grace") && e.contains(says),
            "{v}: {e}"
        );
    }
    let src = "[gateway]\nshutdown_grace = \"87600h\"\n";
    let c = Config::parse(Path::new("g.toml"), src, &none).unwrap();
    assert_eq!(c.gateway.shutdown_grace, values::MAX_DURATION);
}
