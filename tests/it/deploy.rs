//! `deploy/kubernetes/`, rendered by the real `kubectl kustomize` (no cluster needed), and
//! checked for what must agree with its gateway.toml: the config is valid for the binary
//! with the Secret's variables, the pods outlive `drain_delay + shutdown_grace`, the
//! probes and ports are the config's, the PodDisruptionBudget and Services select the
//! right pods, and every secret the pods read exists.

use crate::common::*;
use serde::Deserialize;
use serde_norway::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// Every document of `kubectl kustomize deploy/kubernetes`.
fn rendered() -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("deploy/kubernetes"))
        .output()
        .unwrap_or_else(|e| {
            panic!("kubectl is not installed ({e}); scripts/setup-test-deps installs it (apt-get install kubectl or kubernetes-client)")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let all: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    all.iter()
        .find(|d| d["metadata"]["name"] == name)
        .copied()
        .unwrap_or_else(|| {
            panic!(
                "no {kind} {name:?}; the {kind}s: {:?}",
                all.iter().map(|d| &d["metadata"]["name"]).collect::<Vec<_>>()
            )
        })
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    match v {
        Value::Mapping(m) => m
            .iter()
            .map(|(k, v)| (str_of(k).to_owned(), str_of(v).to_owned()))
            .collect(),
        Value::Null => BTreeMap::new(),
        other => panic!("labels: {other:?}"),
    }
}

/// Whether a selector's labels all appear among a pod's.
fn selects(selector: &BTreeMap<String, String>, pod: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| pod.get(k) == Some(v))
}

/// A probe's or Service's port, named or numbered, as the container's port number.
fn port_number(port: &Value, container: &Value) -> u64 {
    match port {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no container port named {name}"))["containerPort"]
            .as_u64()
            .unwrap(),
        other => panic!("port: {other:?}"),
    }
}

/// A Secret's values (`stringData`: the base keeps its placeholders readable).
fn secret_values(secret: &Value) -> BTreeMap<String, String> {
    assert!(secret["data"].is_null(), "the base's Secret uses stringData only");
    match &secret["stringData"] {
        Value::Mapping(m) => m
            .iter()
            .map(|(k, v)| (str_of(k).to_owned(), str_of(v).to_owned()))
            .collect(),
        other => panic!("stringData: {other:?}"),
    }
}

#[test]
fn the_kustomize_base_agrees_with_its_gateway_toml() {
    let docs = rendered();
    let deployment = find(&docs, "Deployment", "mcp-gateway");
    let pod = &deployment["spec"]["template"];
    let pod_labels = labels(&pod["metadata"]["labels"]);
    let containers = pod["spec"]["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let c = &containers[0];

    // The config: the ConfigMap the pod mounts, at the path its args name.
    let volumes = pod["spec"]["volumes"].as_sequence().unwrap();
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(str_of).collect();
    assert_eq!(args.first(), Some(&"serve"), "{args:?}");
    assert!(!args.contains(&"--listen"), "gateway.listen decides the port: {args:?}");
    let config_path = args[args.iter().position(|a| *a == "--config").expect("--config") + 1];
    let (dir, file) = config_path.rsplit_once('/').unwrap();
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = volumes
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let configmap = find(&docs, "ConfigMap", str_of(&volume["configMap"]["name"]));
    let toml = str_of(&configmap["data"][file]);

    // Every variable the pod gets: a value, or a key of a Secret that has it.
    let mut env = BTreeMap::new();
    for e in c["env"].as_sequence().unwrap() {
        let name = str_of(&e["name"]).to_owned();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else {
            let r = &e["valueFrom"]["secretKeyRef"];
            let secret = find(&docs, "Secret", str_of(&r["name"]));
            let values = secret_values(secret);
            values
                .get(str_of(&r["key"]))
                .unwrap_or_else(|| panic!("{name}: the Secret has no {:?}: {values:?}", r["key"]))
                .clone()
        };
        env.insert(name, value);
    }
    for var in ["MCP_GATEWAY_CLUSTER_KEY", "ALICE_TOKEN"] {
        assert!(env.contains_key(var), "{var} is not in the pod's env: {env:?}");
        assert!(
            toml.contains(&format!("${{{var}}}")),
            "gateway.toml does not use ${{{var}}}"
        );
    }

    // The binary accepts it once the key is a real one, and refuses the placeholder key.
    let placeholder = env["MCP_GATEWAY_CLUSTER_KEY"].clone();
    let mut real = env.clone();
    real.insert("MCP_GATEWAY_CLUSTER_KEY".into(), "0123456789abcdef".repeat(4));
    let pairs = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
    let real = pairs(&real);
    let refs: Vec<(&str, &str)> = real.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (run, _dir) = check(toml, &[], &refs);
    assert_eq!(run.code, Some(0), "check:\n{}{}", run.stdout, run.stderr);
    let shipped = pairs(&env);
    let refs: Vec<(&str, &str)> = shipped.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (run, _dir) = check(toml, &[], &refs);
    assert_ne!(
        run.code,
        Some(0),
        "the placeholder key {placeholder:?} must not start a cluster"
    );
    assert!(run.stderr.contains("at least 32"), "{}", run.stderr);

    let lookup = |k: &str| real.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let config =
        mcp_gateway::config::Config::parse(std::path::Path::new("/etc/mcp-gateway/gateway.toml"), toml, &lookup)
            .unwrap_or_else(|e| panic!("{e}"));
    let g = &config.gateway;
    let cluster = config.cluster.as_ref().expect("a [cluster] table");
    assert!(toml.contains("[clients."), "tokens guard the endpoint");
    assert_eq!(cluster.redis.expose(), "redis://redis:6379/0");

    // The pods outlive the drain and the grace.
    let budget = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        toml.contains("drain_delay") && toml.contains("shutdown_grace"),
        "both are set explicitly"
    );
    assert!(
        Duration::from_secs(budget) > g.drain_delay + g.shutdown_grace + Duration::from_secs(1),
        "terminationGracePeriodSeconds {budget} <= drain_delay {:?} + shutdown_grace {:?} (+1 s)",
        g.drain_delay,
        g.shutdown_grace
    );

    // The port and the probes are the config's.
    assert!(
        g.listen.ip().is_unspecified(),
        "listen on every interface: {}",
        g.listen
    );
    let port = u64::from(g.listen.port());
    assert!(
        c["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p["containerPort"] == port),
        "containerPort {port}: {:?}",
        c["ports"]
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(port_number(&get["port"], c), port, "{probe}");
    }
    assert_ne!(g.path, "/readyz");

    // Three replicas, rolled one at a time without going under three.
    assert_eq!(deployment["spec"]["replicas"], 3);
    let rolling = &deployment["spec"]["strategy"]["rollingUpdate"];
    assert_eq!(
        (&rolling["maxUnavailable"], &rolling["maxSurge"]),
        (&Value::from(0), &Value::from(1))
    );
    assert!(selects(
        &labels(&deployment["spec"]["selector"]["matchLabels"]),
        &pod_labels
    ));
    assert!(c["resources"]["requests"].is_mapping(), "resource requests");
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);

    // The Service reaches the pods on the config's port, under a name the Host check allows.
    let service = find(&docs, "Service", "mcp-gateway");
    assert!(selects(&labels(&service["spec"]["selector"]), &pod_labels));
    let sp = &service["spec"]["ports"].as_sequence().unwrap()[0];
    assert_eq!(port_number(&sp["targetPort"], c), port);
    assert!(
        g.allowed_hosts.iter().any(|h| h == "mcp-gateway"),
        "allowed_hosts lacks the Service's name: {:?}",
        g.allowed_hosts
    );

    // The PodDisruptionBudget keeps two of the three, and only counts gateway pods.
    let pdb = docs
        .iter()
        .find(|d| d["kind"] == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget");
    let pdb_selector = labels(&pdb["spec"]["selector"]["matchLabels"]);
    assert!(
        selects(&pdb_selector, &pod_labels),
        "{pdb_selector:?} vs {pod_labels:?}"
    );
    assert!(
        pdb["spec"]["minAvailable"] == 2 || pdb["spec"]["maxUnavailable"] == 1,
        "{:?}",
        pdb["spec"]
    );

    // The Redis of cluster.redis: the Service `redis` on 6379, selecting the Redis pod only.
    let redis = find(&docs, "Deployment", "redis");
    let redis_labels = labels(&redis["spec"]["template"]["metadata"]["labels"]);
    assert_eq!(redis["spec"]["replicas"], 1);
    let redis_service = find(&docs, "Service", "redis");
    assert!(selects(&labels(&redis_service["spec"]["selector"]), &redis_labels));
    assert!(!selects(&labels(&redis_service["spec"]["selector"]), &pod_labels));
    assert!(!selects(&pdb_selector, &redis_labels), "the PDB counts Redis too");
    assert!(!selects(&labels(&service["spec"]["selector"]), &redis_labels));
    assert_eq!(redis_service["spec"]["ports"][0]["port"], 6379);

    // The image docker compose builds.
    let compose: Value =
        serde_norway::from_str(&std::fs::read_to_string(repo().join("docker-compose.yml")).unwrap()).unwrap();
    assert_eq!(
        c["image"], compose["services"]["gateway"]["image"],
        "the image compose builds"
    );
}
