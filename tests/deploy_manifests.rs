//! `deploy/` as shipped: every YAML file parses, the kustomization lists every base file, the
//! objects say what the README promises (least privilege, hardened pod, probes, selectors that
//! match), the Deployment's arguments are accepted by the real binary, and every manifest
//! applies to the real kube-apiserver by server-side apply — dry-run first (nothing stored), then
//! for real (stored, owned by our field manager), then again without any change — with strict
//! field validation, so a misspelt or unknown field fails the test.

mod kube_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use capc_health_shim::cloudstack::client::RetryPolicy;
use capc_health_shim::controller::config::{parse_override, parse_secret_ref};
use capc_health_shim::verdict::condition::DEFAULT_CONDITION_TYPE;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use kube::Client;
use kube_support::{kube_client, profile, run_args};
use serde_json::{json, Value};

const FIELD_MANAGER: &str = "capc-health-shim-test";

struct Manifest {
    /// Path under `deploy/`, e.g. `base/deployment.yaml`.
    file: String,
    obj: Value,
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("entry").path();
        if path.is_dir() && path == deploy_dir().join("helm") {
            // The Helm chart's templates are not plain YAML; it is generated from deploy/base
            // and rendered, checked and applied by hack/release and tests/release_manifests.rs.
            continue;
        }
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()) == Some("kustomization.yaml")
}

/// Every Kubernetes object in every YAML file under `deploy/` (kustomizations excluded).
fn manifests() -> Vec<Manifest> {
    let root = deploy_dir();
    let mut out = Vec::new();
    for path in yaml_files(&root) {
        if is_kustomization(&path) {
            continue;
        }
        let file = path.strip_prefix(&root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).expect("readable");
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let obj: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{file}: not YAML: {e}"));
            if obj.is_null() {
                continue;
            }
            for key in ["/apiVersion", "/kind", "/metadata/name"] {
                assert!(
                    obj.pointer(key).and_then(Value::as_str).is_some(),
                    "{file}: an object without {key}"
                );
            }
            out.push(Manifest {
                file: file.clone(),
                obj,
            });
        }
    }
    assert!(out.len() >= 10, "only {} objects under deploy/", out.len());
    out
}

fn one<'a>(ms: &'a [Manifest], kind: &str) -> &'a Value {
    let found: Vec<&Manifest> = ms.iter().filter(|m| m.obj["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind} under deploy/");
    &found[0].obj
}

/// The ClusterRole named `name` under deploy/.
fn cluster_role<'a>(ms: &'a [Manifest], name: &str) -> &'a Value {
    let found: Vec<&Manifest> = ms
        .iter()
        .filter(|m| m.obj["kind"] == "ClusterRole" && m.obj["metadata"]["name"] == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "exactly one ClusterRole {name} under deploy/"
    );
    &found[0].obj
}

fn in_file<'a>(ms: &'a [Manifest], file: &str) -> &'a Value {
    &ms.iter()
        .find(|m| m.file == file)
        .unwrap_or_else(|| panic!("deploy/{file}"))
        .obj
}

/// Whether every `key: value` of `selector` is among `labels` (and the selector is not empty).
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object() else {
        return false;
    };
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// Resolves a probe/Service port (a number or a container port name) to the number.
fn port_number(container: &Value, port: &Value) -> i64 {
    if let Some(n) = port.as_i64() {
        return n;
    }
    let name = port.as_str().expect("port is a number or a name");
    container["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

/// CPU in millicores or memory in bytes, for the quantities the manifests use.
fn quantity(q: &Value) -> f64 {
    let s = q
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| q.to_string());
    let units = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("m", 1.0),
    ];
    for (suffix, factor) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<f64>().expect("number") * factor;
        }
    }
    s.parse::<f64>().expect("number") * 1000.0 // whole CPUs → millicores
}

/// Seconds of a Go duration such as `30m`, `300s`, `1h30m`.
fn go_duration_seconds(s: &str) -> u64 {
    let mut total = 0;
    let mut n = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            n.push(ch);
        } else {
            let v: u64 = n.parse().expect("number");
            n.clear();
            total += v * match ch {
                'h' => 3600,
                'm' => 60,
                's' => 1,
                other => panic!("unit {other} in {s}"),
            };
        }
    }
    assert!(n.is_empty(), "{s}: trailing number without unit");
    total
}

#[test]
fn the_kustomization_lists_exactly_the_base_files() {
    let base = deploy_dir().join("base");
    let k: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(base.join("kustomization.yaml")).unwrap())
            .unwrap();
    assert_eq!(k["kind"], "Kustomization");
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = yaml_files(&base)
        .iter()
        .filter(|p| !is_kustomization(p))
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, present,
        "kustomization.yaml resources vs files in deploy/base"
    );
}

#[test]
fn every_base_object_lives_in_the_shipped_namespace() {
    let ms = manifests();
    let ns = one(&ms, "Namespace")["metadata"]["name"].as_str().unwrap();
    for m in ms.iter().filter(|m| m.file.starts_with("base/")) {
        let cluster_scoped = matches!(
            m.obj["kind"].as_str().unwrap(),
            "Namespace" | "ClusterRole" | "ClusterRoleBinding"
        );
        let declared = m.obj["metadata"]["namespace"].as_str();
        if cluster_scoped {
            assert_eq!(declared, None, "{}: cluster-scoped", m.file);
        } else {
            assert_eq!(declared, Some(ns), "{}: {}", m.file, m.obj["kind"]);
        }
    }
    let namespace = one(&ms, "Namespace");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
        "the namespace enforces the restricted Pod Security Standard"
    );
}

#[test]
fn no_role_grants_delete_or_wildcards() {
    let ms = manifests();
    let roles: Vec<&Manifest> = ms
        .iter()
        .filter(|m| matches!(m.obj["kind"].as_str(), Some("Role" | "ClusterRole")))
        .collect();
    assert!(!roles.is_empty());
    for m in roles {
        for rule in m.obj["rules"].as_array().expect("rules") {
            for verb in rule["verbs"].as_array().expect("verbs") {
                let verb = verb.as_str().unwrap();
                assert!(
                    !matches!(verb, "delete" | "deletecollection" | "*"),
                    "{}: verb {verb} in {rule}",
                    m.file
                );
            }
            for key in ["apiGroups", "resources"] {
                for v in rule[key].as_array().into_iter().flatten() {
                    assert_ne!(v, "*", "{}: wildcard {key} in {rule}", m.file);
                }
            }
        }
    }
    // The binding grants the role to the ServiceAccount the Deployment runs as.
    let binding = one(&ms, "ClusterRoleBinding");
    let role = cluster_role(&ms, "capc-health-shim");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let sa = one(&ms, "ServiceAccount");
    let d = one(&ms, "Deployment");
    let subjects = binding["subjects"].as_array().unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0]["kind"], "ServiceAccount");
    assert_eq!(subjects[0]["name"], sa["metadata"]["name"]);
    assert_eq!(subjects[0]["namespace"], sa["metadata"]["namespace"]);
    assert_eq!(
        d["spec"]["template"]["spec"]["serviceAccountName"],
        sa["metadata"]["name"]
    );
    assert_eq!(d["metadata"]["namespace"], sa["metadata"]["namespace"]);
}

#[test]
fn the_deployment_is_two_hardened_replicas_with_leader_election_and_probes() {
    let ms = manifests();
    let d = one(&ms, "Deployment");
    assert_eq!(d["spec"]["replicas"], 2);
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    assert!(selects(&d["spec"]["selector"]["matchLabels"], pod_labels));
    let pod = &d["spec"]["template"]["spec"];
    let c = container(d);

    // Non-root, read-only root filesystem, no privilege escalation, no capabilities, seccomp.
    let psc = &pod["securityContext"];
    let csc = &c["securityContext"];
    assert!(psc["runAsNonRoot"] == true || csc["runAsNonRoot"] == true);
    let uid = csc["runAsUser"].as_i64().or(psc["runAsUser"].as_i64());
    assert!(uid.is_some_and(|u| u > 0), "a numeric non-root user");
    assert_eq!(csc["readOnlyRootFilesystem"], true);
    assert_eq!(csc["allowPrivilegeEscalation"], false);
    assert_eq!(csc["capabilities"]["drop"], json!(["ALL"]));
    assert!(csc["capabilities"].get("add").is_none());
    assert!(
        psc["seccompProfile"]["type"] == "RuntimeDefault"
            || csc["seccompProfile"]["type"] == "RuntimeDefault"
    );
    assert!(csc.get("privileged").is_none_or(|p| p == false));

    // The shim, leader election on (the default), status listener on the default port.
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"run"));
    assert!(!args.iter().any(|a| a.starts_with("--no-leader-election")));
    let env = c["env"].as_array().cloned().unwrap_or_default();
    assert!(!env
        .iter()
        .any(|e| e["name"] == "CAPC_HEALTH_NO_LEADER_ELECTION"));
    assert!(!args.iter().any(|a| a.starts_with("--status-addr")));
    let status_port: i64 = run_args(&[])
        .status_addr
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let https = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "https")
        .expect("a container port named https");
    assert_eq!(https["containerPort"], status_port);

    // Probes on the shim's endpoints, on its listener, which serves HTTPS (no token needed).
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(port_number(c, &get["port"]), status_port, "{probe}");
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
    }

    // Requests and limits for CPU and memory, requests within limits.
    for res in ["cpu", "memory"] {
        let req = quantity(&c["resources"]["requests"][res]);
        let lim = quantity(&c["resources"]["limits"][res]);
        assert!(req > 0.0 && req <= lim, "{res}: request {req} limit {lim}");
    }

    // A SIGTERM is acted on after the running cycle: the grace period covers one CloudStack call
    // with every retry at the default request timeout, plus the Lease release and HTTP drain.
    let per_call =
        RetryPolicy::default().max_attempts as u64 * run_args(&[]).request_timeout.as_secs() as u64;
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace");
    assert!(
        grace > per_call + 10,
        "terminationGracePeriodSeconds {grace} ≤ {per_call}s + 10s"
    );

    let image = c["image"].as_str().unwrap();
    assert!(
        image.contains(':') && !image.ends_with(":latest"),
        "{image}"
    );
}

#[test]
fn the_service_pdb_and_service_monitor_select_the_deployments_pods() {
    let ms = manifests();
    let d = one(&ms, "Deployment");
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let c = container(d);

    let svc = one(&ms, "Service");
    assert!(selects(&svc["spec"]["selector"], pod_labels));
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert!(!ports.is_empty());
    for p in ports {
        assert_eq!(
            p["targetPort"], "https",
            "the Service targets the named port"
        );
        port_number(c, &p["targetPort"]);
    }

    let pdb = one(&ms, "PodDisruptionBudget");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    assert_eq!(pdb["metadata"]["namespace"], d["metadata"]["namespace"]);
    // One replica can always be evicted (a drain never blocks), one always stays.
    let min = pdb["spec"]["minAvailable"].as_i64().expect("minAvailable");
    let replicas = d["spec"]["replicas"].as_i64().unwrap();
    assert!(min >= 1 && min < replicas, "minAvailable {min}");

    let sm = one(&ms, "ServiceMonitor");
    assert_eq!(sm["metadata"]["namespace"], svc["metadata"]["namespace"]);
    assert!(selects(
        &sm["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    ));
    let endpoints = sm["spec"]["endpoints"].as_array().unwrap();
    assert!(endpoints.iter().any(|e| e["path"] == "/metrics"));
    for e in endpoints {
        assert!(
            ports.iter().any(|p| p["name"] == e["port"]),
            "ServiceMonitor port {} is a Service port",
            e["port"]
        );
    }
}

/// /status and /metrics are locked by default (docs/status-and-metrics.md): the shim may ask the
/// API server who a token is and what it may do, a separate role grants reading the two paths
/// (bound by nobody in the base), the Deployment never turns the lock off, and the
/// ServiceMonitor scrapes over HTTPS with Prometheus' own token.
#[test]
fn the_status_listener_is_locked_and_a_reader_role_opens_it() {
    let ms = manifests();
    let shim = cluster_role(&ms, "capc-health-shim");
    let grants = |group: &str, resource: &str| {
        shim["rules"].as_array().unwrap().iter().any(|r| {
            r["apiGroups"]
                .as_array()
                .is_some_and(|g| g.iter().any(|g| g == group))
                && r["resources"]
                    .as_array()
                    .is_some_and(|x| x.iter().any(|x| x == resource))
                && r["verbs"] == json!(["create"])
        })
    };
    assert!(grants("authentication.k8s.io", "tokenreviews"));
    assert!(grants("authorization.k8s.io", "subjectaccessreviews"));

    let reader = cluster_role(&ms, "capc-health-shim-metrics-reader");
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": ["/metrics", "/status"], "verbs": ["get"]}]),
        "the reader role grants exactly GET of the two paths"
    );
    assert!(
        !ms.iter().any(|m| m.file.starts_with("base/")
            && m.obj["roleRef"]["name"] == "capc-health-shim-metrics-reader"),
        "the base binds the reader role to nobody"
    );

    let d = one(&ms, "Deployment");
    let c = container(d);
    let args = c["args"].as_array().unwrap();
    assert!(!args
        .iter()
        .any(|a| a.as_str().unwrap().starts_with("--insecure-serving")));
    let env = c["env"].as_array().cloned().unwrap_or_default();
    assert!(!env
        .iter()
        .any(|e| e["name"] == "CAPC_HEALTH_INSECURE_SERVING"));
    assert!(
        !run_args(&[]).serving.insecure_serving,
        "secured by default"
    );

    let sm = one(&ms, "ServiceMonitor");
    for e in sm["spec"]["endpoints"].as_array().unwrap() {
        assert_eq!(e["scheme"], "https", "{e}");
        assert!(
            e["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
                || e["authorization"]["credentials"].is_object(),
            "the scrape sends a token: {e}"
        );
        assert_eq!(e["tlsConfig"]["insecureSkipVerify"], true, "{e}");
    }
}

/// The NetworkPolicy (docs/install.md, "Network policy"): it selects the shim's pods; ingress is
/// exactly the container's serving port(s); egress is DNS and the TCP ports of the API servers
/// and CloudStack, to any address by default (an install must not break before the operator
/// narrows it), and no rule opens every port.
#[test]
fn the_network_policy_admits_only_the_listener_and_reaches_dns_apiservers_and_cloudstack() {
    let ms = manifests();
    let d = one(&ms, "Deployment");
    let c = container(d);
    let np = one(&ms, "NetworkPolicy");
    assert_eq!(np["metadata"]["namespace"], d["metadata"]["namespace"]);
    assert!(selects(
        &np["spec"]["podSelector"]["matchLabels"],
        &d["spec"]["template"]["metadata"]["labels"]
    ));
    let types: BTreeSet<&str> = np["spec"]["policyTypes"]
        .as_array()
        .expect("policyTypes")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, BTreeSet::from(["Ingress", "Egress"]));

    let container_ports: BTreeSet<i64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    let mut ingress_ports = BTreeSet::new();
    for rule in np["spec"]["ingress"].as_array().expect("ingress rules") {
        let ports = rule["ports"]
            .as_array()
            .expect("an ingress rule without ports opens every port");
        for p in ports {
            assert_eq!(p["protocol"], "TCP", "{p}");
            ingress_ports.insert(port_number(c, &p["port"]));
        }
    }
    assert_eq!(
        ingress_ports, container_ports,
        "ingress is exactly the serving port(s)"
    );

    let mut egress: BTreeSet<(String, i64)> = BTreeSet::new();
    for rule in np["spec"]["egress"].as_array().expect("egress rules") {
        assert!(
            rule.get("to").is_none(),
            "the default must reach any address: {rule}"
        );
        for p in rule["ports"]
            .as_array()
            .expect("an egress rule without ports opens every port")
        {
            egress.insert((
                p["protocol"].as_str().unwrap().to_string(),
                p["port"].as_i64().expect("a numeric port"),
            ));
        }
    }
    let tcp = |port: i64| ("TCP".to_string(), port);
    let want = BTreeSet::from([
        ("UDP".to_string(), 53), // DNS
        tcp(53),
        tcp(443),  // the `kubernetes` Service, and CloudStack over HTTPS
        tcp(6443), // the API servers' own port (after the Service), workload clusters
        tcp(8080), // CloudStack's management server, plain HTTP
        tcp(8443), // CloudStack over HTTPS on its own port
    ]);
    assert_eq!(egress, want);
}

#[test]
fn the_examples_say_what_each_mode_needs() {
    let ms = manifests();
    let annotate = in_file(&ms, "examples/mhc-annotate-mode.yaml");
    assert_eq!(annotate["apiVersion"], "cluster.x-k8s.io/v1beta1");
    assert!(annotate["spec"].get("unhealthyMachineConditions").is_none());
    let startup = go_duration_seconds(annotate["spec"]["nodeStartupTimeout"].as_str().unwrap());
    assert!(startup >= 30, "webhook minimum");
    assert_eq!(annotate["spec"]["maxUnhealthy"], "100%");

    let condition = in_file(&ms, "examples/mhc-condition-mode.yaml");
    assert_eq!(condition["apiVersion"], "cluster.x-k8s.io/v1beta2");
    let checks = &condition["spec"]["checks"];
    assert!(checks["nodeStartupTimeoutSeconds"].as_u64().unwrap() >= 30);
    let ours: Vec<&Value> = checks["unhealthyMachineConditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == DEFAULT_CONDITION_TYPE)
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "the shim's condition, False only (never Unknown)"
    );
    assert_eq!(ours[0]["status"], "False");
    assert_eq!(
        condition["spec"]["remediation"]["triggerIf"]["unhealthyLessThanOrEqualTo"],
        "100%"
    );
    // Both select every Machine of their cluster.
    for mhc in [annotate, condition] {
        assert_eq!(
            mhc["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/cluster-name"],
            mhc["spec"]["clusterName"]
        );
    }

    // The read-only key Secret has the keys the shim takes from an override, and nothing else.
    let secret = in_file(&ms, "examples/cloudstack-readonly-secret.yaml");
    let keys: BTreeSet<&str> = secret["stringData"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert!(keys.contains("api-key") && keys.contains("secret-key"));
    assert!(keys.is_subset(&BTreeSet::from(["api-key", "secret-key", "verify-ssl"])));
}

/// Every `--endpoint-credentials=` example in `deploy/` parses and names the example Secret.
#[test]
fn the_endpoint_credentials_examples_parse_and_name_the_example_secret() {
    let ms = manifests();
    let secret = in_file(&ms, "examples/cloudstack-readonly-secret.yaml");
    let mut seen = 0;
    let mut files = yaml_files(&deploy_dir());
    files.push(deploy_dir().join("README.md"));
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices("--endpoint-credentials=") {
            let value: String = text[at + "--endpoint-credentials=".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !matches!(c, '`' | '"' | '\''))
                .collect();
            let o = parse_override(&value)
                .unwrap_or_else(|e| panic!("{}: {value}: {e}", path.display()));
            assert_eq!(
                o.namespace,
                secret["metadata"]["namespace"].as_str().unwrap()
            );
            assert_eq!(o.name, secret["metadata"]["name"].as_str().unwrap());
            seen += 1;
        }
    }
    assert!(
        seen >= 2,
        "examples in the Secret, the Deployment and the README"
    );
}

/// Every `--probe-credentials=` example in `deploy/` parses and names the probe's example
/// Secret, which carries the three keys the probe reads.
#[test]
fn the_probe_credentials_examples_parse_and_name_the_probe_secret() {
    let ms = manifests();
    let secret = in_file(&ms, "examples/cloudstack-probe-secret.yaml");
    for key in ["api-url", "api-key", "secret-key"] {
        assert!(secret["stringData"][key].is_string(), "{key}");
    }
    let mut seen = 0;
    for path in yaml_files(&deploy_dir()) {
        let text = std::fs::read_to_string(&path).unwrap();
        for (at, _) in text.match_indices("--probe-credentials=") {
            let value: String = text[at + "--probe-credentials=".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !matches!(c, '`' | '"' | '\''))
                .collect();
            let r = parse_secret_ref(&value)
                .unwrap_or_else(|e| panic!("{}: {value}: {e}", path.display()));
            assert_eq!(
                r.namespace,
                secret["metadata"]["namespace"].as_str().unwrap()
            );
            assert_eq!(r.name, secret["metadata"]["name"].as_str().unwrap());
            seen += 1;
        }
    }
    assert!(seen >= 2, "examples in the Secret and the Deployment");
}

/// The real binary accepts the Deployment's arguments and environment: it gets past flag
/// parsing (clap exits 2 on a bad flag) and stops where only a cluster can help.
#[test]
fn the_binary_accepts_the_deployments_arguments() {
    let ms = manifests();
    let d = one(&ms, "Deployment");
    let c = container(d);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"));
    for a in c["args"].as_array().unwrap() {
        cmd.arg(a.as_str().unwrap());
    }
    for e in c["env"].as_array().cloned().unwrap_or_default() {
        let name = e["name"].as_str().unwrap();
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.namespace") => d["metadata"]["namespace"].as_str().unwrap(),
            Some(other) => panic!("fieldRef {other}"),
            None => e["value"].as_str().unwrap(),
        };
        cmd.env(name, value);
    }
    let out = cmd
        .env("CAPC_HEALTH_STATUS_ADDR", "127.0.0.1:0")
        .env(
            "KUBECONFIG",
            "/nonexistent/capc-health-shim-test-kubeconfig",
        )
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no Kubernetes configuration"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// The real API server.

async fn apply(
    client: &Client,
    gvk: &GroupVersionKind,
    ns: Option<&str>,
    obj: &Value,
    dry_run: bool,
) -> Result<DynamicObject, kube::Error> {
    let (ar, _) = pinned_kind(client, gvk).await?;
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let mut pp = PatchParams::apply(FIELD_MANAGER).validation_strict();
    if dry_run {
        pp = pp.dry_run();
    }
    let name = obj["metadata"]["name"].as_str().unwrap();
    api.patch(name, &pp, &Patch::Apply(obj)).await
}

async fn get(
    client: &Client,
    gvk: &GroupVersionKind,
    ns: Option<&str>,
    name: &str,
) -> Option<DynamicObject> {
    let (ar, _) = pinned_kind(client, gvk).await.ok()?;
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.get_opt(name).await.expect("GET")
}

fn gvk_of(obj: &Value) -> GroupVersionKind {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap())
}

async fn is_served(client: &Client, gvk: &GroupVersionKind) -> bool {
    pinned_kind(client, gvk).await.is_ok()
}

/// Whether objects of `gvk` are stored as sent: a built-in kind, or a CRD whose storage version
/// is `gvk`'s (the test server runs no conversion webhooks).
async fn round_trips(client: &Client, gvk: &GroupVersionKind) -> bool {
    let (ar, _) = pinned_kind(client, gvk).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Some(crd) = crds
        .get_opt(&format!("{}.{}", ar.plural, ar.group))
        .await
        .expect("GET CRD")
    else {
        return true;
    };
    crd.spec
        .versions
        .iter()
        .any(|v| v.storage && v.name == gvk.version)
}

async fn ensure_monitoring_crds(client: &Client) {
    kube_support::monitoring_crds::ensure_monitoring_crds(client, FIELD_MANAGER).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn every_manifest_applies_server_side_dry_run_then_for_real() {
    let client = kube_client().await;
    ensure_monitoring_crds(&client).await;

    // The MHC versions this profile serves: each example applies where its version is served,
    // and the profile decides which that is (so a test that applied nothing cannot pass).
    let mhc = |v: &str| GroupVersionKind::gvk("cluster.x-k8s.io", v, "MachineHealthCheck");
    let served_v1beta1 = is_served(&client, &mhc("v1beta1")).await;
    let served_v1beta2 = is_served(&client, &mhc("v1beta2")).await;
    match profile().as_str() {
        "capi-1.9" => assert_eq!((served_v1beta1, served_v1beta2), (true, false)),
        "capi-1.13" => assert_eq!((served_v1beta1, served_v1beta2), (true, true)),
        other => panic!("unknown CAPC_HEALTH_TEST_PROFILE {other}"),
    }

    // The examples (no namespace of their own) go into namespaces of this test.
    let test_ns = format!("deploy-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut example_files: Vec<String> = Vec::new();
    let mut created_ns: Vec<String> = Vec::new();

    // Namespaces first, so the namespaced objects have somewhere to go.
    let mut ms = manifests();
    ms.sort_by_key(|m| m.obj["kind"] != "Namespace");
    let mut applied = Vec::new();
    let mut skipped = Vec::new();
    for m in &ms {
        let gvk = gvk_of(&m.obj);
        let what = format!("{} {} ({})", gvk.kind, m.obj["metadata"]["name"], m.file);
        if !is_served(&client, &gvk).await {
            // Only the condition-mode example may be unavailable, and only before CAPI 1.12.
            assert!(
                m.file == "examples/mhc-condition-mode.yaml" && !served_v1beta2,
                "{what}: {}/{} is not served",
                gvk.group,
                gvk.version
            );
            skipped.push(what);
            continue;
        }
        let (_, caps) = pinned_kind(&client, &gvk).await.unwrap();
        let mut obj = m.obj.clone();
        let ns = match caps.scope {
            Scope::Cluster => None,
            Scope::Namespaced => {
                if obj["metadata"]["namespace"].is_null() {
                    // One namespace per example file: both MHC examples name the same object.
                    let idx = example_files
                        .iter()
                        .position(|f| f == &m.file)
                        .unwrap_or_else(|| {
                            example_files.push(m.file.clone());
                            example_files.len() - 1
                        });
                    let ns = format!("{test_ns}-{idx}");
                    if idx == created_ns.len() {
                        create_namespace(&client, &ns).await;
                        created_ns.push(ns.clone());
                    }
                    obj["metadata"]["namespace"] = json!(ns);
                }
                Some(obj["metadata"]["namespace"].as_str().unwrap().to_string())
            }
        };
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let existed = get(&client, &gvk, ns.as_deref(), &name).await.is_some();

        let dry = apply(&client, &gvk, ns.as_deref(), &obj, true)
            .await
            .unwrap_or_else(|e| panic!("{what}: server-side apply, dry run: {e}"));
        assert_eq!(dry.metadata.name.as_deref(), Some(name.as_str()));
        if !existed {
            assert!(
                get(&client, &gvk, ns.as_deref(), &name).await.is_none(),
                "{what}: the dry run stored the object"
            );
        }

        let real = apply(&client, &gvk, ns.as_deref(), &obj, false)
            .await
            .unwrap_or_else(|e| panic!("{what}: server-side apply: {e}"));
        let stored = get(&client, &gvk, ns.as_deref(), &name)
            .await
            .unwrap_or_else(|| panic!("{what}: not stored"));
        assert!(
            stored
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|f| f.manager.as_deref() == Some(FIELD_MANAGER)
                    && f.operation.as_deref() == Some("Apply")),
            "{what}: not owned by {FIELD_MANAGER}"
        );
        // Applying the same manifest again changes nothing — except where the test server
        // cannot round-trip: a CRD version that is not the storage version, with no conversion
        // webhook (the v1beta1 MHC on CAPI 1.13 loses its v1beta1-only fields in storage).
        let again = apply(&client, &gvk, ns.as_deref(), &obj, false)
            .await
            .unwrap_or_else(|e| panic!("{what}: second server-side apply: {e}"));
        if round_trips(&client, &gvk).await {
            assert_eq!(
                again.metadata.resource_version, real.metadata.resource_version,
                "{what}: a second apply of the same manifest changed the object"
            );
        } else {
            eprintln!("{what}: no-op re-apply not checked ({} is not the storage version and the test server has no conversion webhook)", gvk.version);
        }
        applied.push(what);
    }
    eprintln!(
        "applied ({}): {applied:#?}\nnot served here: {skipped:?}",
        profile()
    );
    let mhcs = applied
        .iter()
        .filter(|a| a.starts_with("MachineHealthCheck"))
        .count();
    assert_eq!(mhcs, if served_v1beta2 { 2 } else { 1 });
    assert_eq!(applied.len() + skipped.len(), ms.len());

    // The pod the Deployment would create passes the namespace's Pod Security enforcement
    // (restricted), as judged by the API server's PodSecurity admission, and the enforcement is
    // real: the same pod with privilege escalation allowed is refused.
    let d = one(&ms, "Deployment");
    let ns = d["metadata"]["namespace"].as_str().unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let mut pod = json!({"metadata": {"name": "capc-health-shim-pss-check",
        "labels": d["spec"]["template"]["metadata"]["labels"]},
        "spec": d["spec"]["template"]["spec"]});
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry, &serde_json::from_value(pod.clone()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("the Deployment's pod is refused: {e}"));
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
    match pods
        .create(&dry, &serde_json::from_value(pod).unwrap())
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(s.message.contains("PodSecurity"), "{}", s.message);
        }
        other => panic!("a pod allowing privilege escalation must be refused: {other:?}"),
    }

    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    // Only this test's own namespace goes: the ones the manifests name may be in use by the
    // other tests of this API server (deploy/base's, applied for real above).
    let _ = ns_api.delete(&test_ns, &Default::default()).await;
    eprintln!("namespaces created: {created_ns:?}");
}

async fn create_namespace(client: &Client, name: &str) {
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .expect("test namespace");
}

/// Every `kustomization.yaml` under deploy/, as the directory it is in.
fn kustomizations(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("deploy/")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            kustomizations(&p, out);
        } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
            out.push(dir.to_path_buf());
        }
    }
}

/// Issue 43 (6): every kustomization under deploy/ builds with kustomize's own library (as
/// `kubectl apply -k` does) — each Component through an overlay of deploy/base — and every
/// object it makes is accepted by the real API server with strict field validation (server-side
/// apply, dry run; the namespaces the objects name are created for real). A broken line in any
/// of them (as the namespaced-secrets example once had) fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn every_kustomization_builds_and_its_objects_apply_strictly() {
    let client = kube_client().await;
    ensure_monitoring_crds(&client).await;
    let mut dirs = Vec::new();
    kustomizations(&deploy_dir(), &mut dirs);
    let base = deploy_dir().join("base");
    // Objects without a namespace of their own (a kustomization meant to be included with
    // `namespace:` set) go into one of this test's.
    let test_ns = format!(
        "kustomize-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    create_namespace(&client, &test_ns).await;
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut created_ns = vec![test_ns.clone()];
    let mut built = Vec::new();
    for dir in &dirs {
        let rel = dir
            .strip_prefix(deploy_dir())
            .unwrap()
            .display()
            .to_string();
        let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        let head: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let mut args = vec!["kustomize".to_string(), "--dir".to_string()];
        if head["kind"] == "Component" {
            args.extend([base.display().to_string(), "--component".into()]);
        }
        args.push(dir.display().to_string());
        let out = Command::new(kube_support::release_tool())
            .args(&args)
            .output()
            .expect("release tool runs");
        assert!(
            out.status.success(),
            "kustomize build {rel}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut objs = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_slice(&out.stdout) {
            let v: Value = serde::Deserialize::deserialize(doc).expect("YAML document");
            if !v.is_null() {
                objs.push(v);
            }
        }
        assert!(!objs.is_empty(), "{rel} built no object");
        objs.sort_by_key(|o| o["kind"] != "Namespace");
        for obj in &mut objs {
            let gvk = gvk_of(obj);
            let name = obj["metadata"]["name"].as_str().unwrap().to_string();
            let what = format!("{rel}: {} {name}", gvk.kind);
            if gvk.kind == "Namespace" {
                if get(&client, &gvk, None, &name).await.is_none() {
                    create_namespace(&client, &name).await;
                    created_ns.push(name);
                }
                continue;
            }
            let (_, caps) = pinned_kind(&client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{what}: not served: {e}"));
            let ns = match caps.scope {
                Scope::Cluster => None,
                Scope::Namespaced => {
                    if obj["metadata"]["namespace"].is_null() {
                        obj["metadata"]["namespace"] = json!(test_ns);
                    }
                    let ns = obj["metadata"]["namespace"].as_str().unwrap().to_string();
                    if get(
                        &client,
                        &GroupVersionKind::gvk("", "v1", "Namespace"),
                        None,
                        &ns,
                    )
                    .await
                    .is_none()
                    {
                        create_namespace(&client, &ns).await;
                        created_ns.push(ns.clone());
                    }
                    Some(ns)
                }
            };
            apply(&client, &gvk, ns.as_deref(), obj, true)
                .await
                .unwrap_or_else(|e| panic!("{what}: server-side apply, dry run, strict: {e}"));
        }
        built.push(format!("{rel} ({} objects)", objs.len()));
    }
    eprintln!("built and applied: {built:#?}");
    // The base, both components and the example overlay with its parts, at least.
    for want in [
        "base",
        "components/monitoring",
        "components/namespaced-secrets",
        "examples/namespaced-secrets",
    ] {
        assert!(
            built.iter().any(|b| b.starts_with(&format!("{want} ("))),
            "{want} was not built: {built:?}"
        );
    }
    // Only this test's own namespace goes: the ones the manifests name may be in use by the
    // other tests of this API server (deploy/base's, applied for real above).
    let _ = ns_api.delete(&test_ns, &Default::default()).await;
    eprintln!("namespaces created: {created_ns:?}");
}
