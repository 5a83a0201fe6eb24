//! `docker compose up` without a Docker engine: docker-compose.yml and the Dockerfile
//! are parsed and checked for what the README promises (the gateway built from the
//! Dockerfile on the repo's gateway.toml, beside Jaeger all-in-one receiving its OTLP
//! traces; the gateway on 8080, the Jaeger UI on 16686), and the `scale` profile (three
//! replicas on one cluster config and Redis behind nginx round-robin, tracing to the same
//! Jaeger).

use crate::common::repo;
use serde_norway::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn compose() -> Value {
    let text = std::fs::read_to_string(repo().join("docker-compose.yml")).expect("docker-compose.yml");
    serde_norway::from_str(&text).expect("docker-compose.yml is YAML")
}

fn service<'a>(c: &'a Value, name: &str) -> &'a Value {
    let s = &c["services"][name];
    assert!(s.is_mapping(), "no service {name:?} in docker-compose.yml");
    s
}

fn string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// `environment:` as a map, whether written as a mapping or as a `KEY=VALUE` list.
fn environment(s: &Value) -> BTreeMap<String, String> {
    match &s["environment"] {
        Value::Mapping(m) => m.iter().map(|(k, v)| (string(k), string(v))).collect(),
        Value::Sequence(items) => items
            .iter()
            .map(|i| {
                let i = string(i);
                let (k, v) = i.split_once('=').unwrap_or((&i, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect(),
        Value::Null => BTreeMap::new(),
        other => panic!("environment: {other:?}"),
    }
}

/// Published (host port, container port) pairs, short or long syntax.
fn ports(s: &Value) -> Vec<(u16, u16)> {
    let Value::Sequence(items) = &s["ports"] else {
        return Vec::new();
    };
    items
        .iter()
        .map(|p| match p {
            Value::Mapping(_) => (
                string(&p["published"]).parse().unwrap(),
                string(&p["target"]).parse().unwrap(),
            ),
            other => {
                // [IP:]HOST:CONTAINER[/PROTO]
                let spec = string(other);
                let spec = spec.split('/').next().unwrap();
                let parts: Vec<&str> = spec.rsplitn(3, ':').collect();
                assert!(parts.len() >= 2, "port {spec:?} is not published to the host");
                (parts[1].parse().unwrap(), parts[0].parse().unwrap())
            }
        })
        .collect()
}

/// `depends_on:` as names, list or mapping syntax.
fn depends_on(s: &Value) -> Vec<String> {
    match &s["depends_on"] {
        Value::Sequence(items) => items.iter().map(string).collect(),
        Value::Mapping(m) => m.keys().map(string).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn gateway_is_built_from_the_dockerfile_and_serves_8080() {
    let c = compose();
    let gw = service(&c, "gateway");
    let build = &gw["build"];
    let (context, dockerfile) = match build {
        Value::String(ctx) => (ctx.clone(), "Dockerfile".to_owned()),
        _ => (string(&build["context"]), string(&build["dockerfile"])),
    };
    assert_eq!(context, ".");
    assert_eq!(dockerfile, "Dockerfile");
    assert!(repo().join(&dockerfile).is_file());
    assert!(ports(gw).contains(&(8080, 8080)), "{:?}", ports(gw));
    // It listens on every interface inside the container, on the shipped config.
    let command: Vec<String> = match &gw["command"] {
        Value::Sequence(v) => v.iter().map(string).collect(),
        Value::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    let args = if command.is_empty() {
        dockerfile_cmd(&std::fs::read_to_string(repo().join("Dockerfile")).unwrap())
    } else {
        command
    };
    let after = |flag: &str| args.iter().position(|a| a == flag).map(|i| args[i + 1].clone());
    assert_eq!(args.first().map(String::as_str), Some("serve"), "{args:?}");
    assert_eq!(after("--listen").as_deref(), Some("0.0.0.0:8080"), "{args:?}");
    assert_eq!(after("--config").as_deref(), Some("/app/gateway.toml"), "{args:?}");
    if let Value::Sequence(vols) = &gw["volumes"] {
        for v in vols {
            let v = string(v);
            let host = v.split(':').next().unwrap();
            assert!(repo().join(host).exists(), "volume source {host} is not in the repo");
        }
    }
}

#[test]
fn gateway_sends_otlp_traces_to_jaeger() {
    let c = compose();
    let gw = service(&c, "gateway");
    let env = environment(gw);
    assert_eq!(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT").map(String::as_str),
        Some("http://jaeger:4318"),
        "{env:?}"
    );
    assert_eq!(
        env.get("OTEL_EXPORTER_OTLP_PROTOCOL").map(String::as_str),
        Some("http/protobuf"),
        "{env:?}"
    );
    assert!(depends_on(gw).contains(&"jaeger".to_owned()), "{:?}", depends_on(gw));

    let jaeger = service(&c, "jaeger");
    let image = string(&jaeger["image"]);
    assert!(image.starts_with("jaegertracing/all-in-one"), "{image}");
    let env = environment(jaeger);
    assert_eq!(
        env.get("COLLECTOR_OTLP_ENABLED").map(String::as_str),
        Some("true"),
        "{env:?}"
    );
    let published = ports(jaeger);
    assert!(published.contains(&(16686, 16686)), "the Jaeger UI: {published:?}");
    assert!(published.iter().any(|p| p.1 == 4318), "OTLP/HTTP: {published:?}");
}

/// The `CMD` of the Dockerfile's last stage, exec form.
fn dockerfile_cmd(text: &str) -> Vec<String> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("CMD"))
        .expect("a CMD");
    serde_json::from_str(line.trim_start()["CMD".len()..].trim()).expect("CMD in exec form")
}

#[test]
fn dockerfile_is_multi_stage_and_builds_the_gateway() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.to_ascii_uppercase().starts_with("FROM "))
        .collect();
    assert!(froms.len() >= 2, "{froms:?}");
    let build_stage = froms[0]
        .split_whitespace()
        .skip_while(|w| !w.eq_ignore_ascii_case("AS"))
        .nth(1)
        .expect("the first stage is named");
    assert!(
        text.contains("cargo build") && text.contains("--release") && text.contains("--bin mcp-gateway"),
        "{text}"
    );
    assert!(
        text.contains(&format!("COPY --from={build_stage} /src/target/release/mcp-gateway")),
        "the last stage takes only the binary from {build_stage}"
    );
    assert!(
        froms.last().unwrap().contains("slim"),
        "a small runtime image: {froms:?}"
    );
    // Every COPY source (outside --from) exists, so the build context has what it needs.
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        for src in &words[..words.len() - 1] {
            assert!(repo().join(src).exists(), "{line}: {src} is not in the repo");
        }
    }
    // Cargo loads every workspace member's manifest, even to build one binary.
    let manifest: toml::Value = std::fs::read_to_string(repo().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    for member in manifest["workspace"]["members"].as_array().expect("workspace members") {
        let member = member.as_str().unwrap();
        assert!(
            text.contains(&format!("COPY {member} ./{member}")),
            "the build stage lacks the workspace member {member}"
        );
    }
    // The shipped config's servers run in the image: python3 and the fixtures are there.
    assert!(text.contains("python3"));
    assert!(text.contains("COPY tests/fixtures"));
    assert_eq!(
        dockerfile_cmd(&text),
        ["serve", "--config", "/app/gateway.toml", "--listen", "0.0.0.0:8080"]
    );
    // The build context leaves out what the image never needs.
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap_or_default();
    for dir in ["target", "node_modules", ".venv"] {
        assert!(
            ignore.lines().any(|l| l.trim().trim_matches('/') == dir),
            ".dockerignore lacks {dir}"
        );
    }
}

#[test]
fn the_shipped_config_is_valid_with_the_compose_environment() {
    // The container runs the repo's gateway.toml with the gateway service's environment.
    let c = compose();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-gateway"))
        .args(["check", "--config"])
        .arg(repo().join("gateway.toml"))
        .env_remove("MCP_GATEWAY_CONFIG")
        .envs(environment(service(&c, "gateway")))
        .output()
        .expect("run mcp-gateway check");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let toml = std::fs::read_to_string(repo().join("gateway.toml")).unwrap();
    for line in toml.lines().filter(|l| l.contains("tests/fixtures/")) {
        let path = line.split('"').find(|w| w.starts_with("tests/fixtures/")).unwrap();
        assert!(Path::new(&repo()).join(path).is_file(), "{path}");
    }
}

// ---------------------------------------------------------------- the `scale` profile

/// The services of a compose profile, by name.
fn profile<'a>(c: &'a Value, name: &str) -> BTreeMap<String, &'a Value> {
    let Value::Mapping(services) = &c["services"] else {
        panic!("no services")
    };
    services
        .iter()
        .filter(|(_, s)| match &s["profiles"] {
            Value::Sequence(p) => p.iter().any(|p| p == name),
            _ => false,
        })
        .map(|(k, s)| (string(k), s))
        .collect()
}

/// A compose value as `docker compose` interpolates it with the variable unset:
/// `${VAR:-default}` is its default; a bare `${VAR}` would be empty, so it fails here.
fn interpolated(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find('}').map(|e| i + e).expect("an unterminated ${");
        let inner = &rest[i + 2..end];
        let (_, default) = inner
            .split_once(":-")
            .unwrap_or_else(|| panic!("${{{inner}}} has no default: compose would leave it empty"));
        out.push_str(default);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The services named `gateway-N` of the scale profile, in order.
fn replicas(c: &Value) -> Vec<(String, &Value)> {
    let mut r: Vec<(String, &Value)> = profile(c, "scale")
        .into_iter()
        .filter(|(n, _)| n.starts_with("gateway-"))
        .collect();
    r.sort_by(|a, b| a.0.cmp(&b.0));
    r
}

#[test]
fn scale_profile_runs_three_replicas_of_the_image_on_one_cluster_config() {
    let c = compose();
    let replicas = replicas(&c);
    assert_eq!(
        replicas.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["gateway-1", "gateway-2", "gateway-3"]
    );
    let single = service(&c, "gateway");
    assert!(
        single["profiles"].is_null(),
        "`docker compose up` still runs the single gateway"
    );
    let mut configs = Vec::new();
    for (name, r) in &replicas {
        assert_eq!(r["image"], single["image"], "{name} runs the image compose builds");
        assert_eq!(string(&r["build"]["context"]), ".", "{name}");
        assert!(
            ports(r).is_empty(),
            "{name} is reached through nginx only: {:?}",
            ports(r)
        );
        let command: Vec<String> = r["command"].as_sequence().unwrap().iter().map(string).collect();
        assert_eq!(command[0], "serve", "{name}: {command:?}");
        let config = &command[command.iter().position(|a| a == "--config").unwrap() + 1];
        let Value::Sequence(vols) = &r["volumes"] else {
            panic!("{name} mounts its config")
        };
        let source = vols
            .iter()
            .map(string)
            .find_map(|v| {
                let mut parts = v.split(':');
                let (host, target) = (parts.next()?.to_owned(), parts.next()?.to_owned());
                (&target == config).then_some(host)
            })
            .unwrap_or_else(|| panic!("{name}: nothing mounted at {config}"));
        assert!(repo().join(&source).is_file(), "{source}");
        let deps = depends_on(r);
        assert!(
            deps.contains(&"redis".to_owned()) && deps.contains(&"jaeger".to_owned()),
            "{deps:?}"
        );
        let env: BTreeMap<String, String> = environment(r).into_iter().map(|(k, v)| (k, interpolated(&v))).collect();
        assert_eq!(
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT").map(String::as_str),
            Some("http://jaeger:4318")
        );
        configs.push((source, env, string(&r["stop_grace_period"])));
    }
    // One config and one key for the three (a replica with another key could not read
    // the others' sessions).
    configs.dedup();
    assert_eq!(configs.len(), 1, "{configs:?}");
    let (source, env, stop_grace) = &configs[0];
    let toml = std::fs::read_to_string(repo().join(source)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-gateway"))
        .args(["check", "--config"])
        .arg(repo().join(source))
        .env_remove("MCP_GATEWAY_CONFIG")
        .envs(env)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lookup = |k: &str| env.get(k).cloned();
    let config = mcp_gateway::config::Config::parse(Path::new("/app/gateway.toml"), &toml, &lookup).unwrap();
    let cluster = config.cluster.as_ref().expect("a [cluster] table");
    assert_eq!(cluster.redis.expose(), "redis://redis:6379/0", "the redis service");
    assert!(
        toml.contains("${MCP_GATEWAY_CLUSTER_KEY}"),
        "the key comes from the environment"
    );
    assert_eq!(config.gateway.listen.to_string(), "0.0.0.0:8080");
    let stop = mcp_gateway::config::parse_duration(stop_grace).expect("stop_grace_period");
    assert!(
        stop > config.gateway.drain_delay + config.gateway.shutdown_grace,
        "stop_grace_period {stop_grace} must outlast drain_delay + shutdown_grace"
    );
    for name in profile(&c, "scale").keys().filter(|n| !n.starts_with("gateway-")) {
        assert!(
            ["redis", "nginx"].contains(&name.as_str()),
            "unexpected service {name} in the scale profile"
        );
    }
    let redis = service(&c, "redis");
    let image = string(&redis["image"]);
    assert!(image.starts_with("redis:") || image.starts_with("valkey/"), "{image}");
    // Jaeger is the default profile's, shared: one Jaeger in the file.
    let Value::Mapping(all) = &c["services"] else { panic!() };
    let jaegers = all
        .values()
        .filter(|s| s["image"].as_str().is_some_and(|i| i.starts_with("jaegertracing/")))
        .count();
    assert_eq!(jaegers, 1);
}

#[test]
fn scale_profile_balances_round_robin_with_nginx() {
    let c = compose();
    let nginx = service(&c, "nginx");
    assert!(profile(&c, "scale").contains_key("nginx"));
    assert!(string(&nginx["image"]).starts_with("nginx:"));
    let Value::Sequence(vols) = &nginx["volumes"] else {
        panic!("nginx mounts its config")
    };
    let conf_file = vols
        .iter()
        .map(string)
        .find_map(|v| {
            let (host, target) = v.split_once(':')?;
            target.starts_with("/etc/nginx/conf.d/").then(|| host.to_owned())
        })
        .expect("a conf.d file");
    assert_eq!(conf_file, "./deploy/nginx/mcp-gateway.conf");
    let conf = std::fs::read_to_string(repo().join(&conf_file)).unwrap();
    // Directives, comments left out.
    let lines: Vec<String> = conf
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let has = |d: &str| lines.iter().any(|l| l == d);
    // Every replica is an upstream, on the port it listens on; nothing else is.
    let upstreams: Vec<String> = lines
        .iter()
        .filter(|l| l.ends_with(';'))
        .filter_map(|l| {
            l.strip_prefix("server ")
                .map(|s| s.split_whitespace().next().unwrap().to_owned())
        })
        .collect();
    let expected: Vec<String> = replicas(&c).iter().map(|(n, _)| format!("{n}:8080")).collect();
    assert_eq!(upstreams, expected);
    let mut deps = depends_on(nginx);
    deps.sort();
    assert_eq!(deps, replicas(&c).iter().map(|r| r.0.clone()).collect::<Vec<_>>());
    // Round-robin: no stickiness of any kind, and no reused upstream connections.
    for sticky in ["ip_hash", "hash ", "sticky", "least_conn", "keepalive "] {
        assert!(!lines.iter().any(|l| l.starts_with(sticky)), "{sticky} in {conf_file}");
    }
    // SSE and long calls pass through as they come; connects are retried elsewhere.
    for d in [
        "proxy_buffering off;",
        "proxy_http_version 1.1;",
        "proxy_next_upstream error timeout;",
        "proxy_set_header Host $http_host;",
    ] {
        assert!(has(d), "{conf_file} lacks {d:?}");
    }
    let read_timeout = lines
        .iter()
        .find_map(|l| l.strip_prefix("proxy_read_timeout "))
        .expect("proxy_read_timeout");
    let secs = mcp_gateway::config::parse_duration(read_timeout.trim_end_matches(';')).unwrap();
    assert!(
        secs.as_secs() >= 600,
        "proxy_read_timeout {read_timeout} cuts long SSE streams"
    );
    // It listens where compose publishes it.
    let listen: u16 = lines
        .iter()
        .find_map(|l| l.strip_prefix("listen "))
        .map(|p| p.trim_end_matches(';').parse().unwrap())
        .expect("listen");
    let published = ports(nginx);
    assert!(
        published.iter().any(|p| p.1 == listen),
        "{published:?} vs listen {listen}"
    );
    assert!(
        !published.iter().any(|p| p.0 == 8080),
        "8080 is the single gateway's: {published:?}"
    );
}
