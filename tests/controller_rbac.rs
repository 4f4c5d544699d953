//! The controller runs as a ServiceAccount bound only to the ClusterRole in `deploy/base/rbac.yaml`
//! (applied to the real API server) and still does its whole job; the role has no `delete`
//! verb anywhere, and the ServiceAccount really cannot delete a Machine. With the component
//! `deploy/components/namespaced-secrets` (no cluster-wide Secret access), it reads the Secrets
//! granted in their namespaces, reports a refused one as a problem, and with
//! `--no-workload-node-lookup` never asks for a `<cluster>-kubeconfig`.

mod kube_support;

use capc_health_shim::controller::memory::MemoryStore;
use capc_health_shim::controller::remnants::{discover_remnant_kinds, MetadataWatches};

use std::collections::BTreeMap;
use std::time::Duration;

use capi_model::apis::Mode;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube_support::{ar, create, is, kube_client, merge_patch, Fixture, SIM_KEY, SIM_SECRET};
use serde_json::{json, Value};

const COMPONENT: &str = "deploy/components/namespaced-secrets";

/// The YAML documents of a file of the repository.
fn yaml_docs(path: &str) -> Vec<Value> {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML document"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The one object of `kind` in `path`.
fn object<T: serde::de::DeserializeOwned>(path: &str, kind: &str) -> T {
    let found: Vec<Value> = yaml_docs(path)
        .into_iter()
        .filter(|v| v["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in {path}");
    serde_json::from_value(found[0].clone()).unwrap_or_else(|e| panic!("{kind} in {path}: {e}"))
}

/// The shim's ClusterRole of deploy/base (the one its ClusterRoleBinding grants) and that binding.
fn deploy_rbac() -> (ClusterRole, ClusterRoleBinding) {
    let docs = yaml_docs("deploy/base/rbac.yaml");
    let of_kind = |kind: &'static str| docs.iter().filter(move |v| v["kind"] == kind);
    let bindings: Vec<&Value> = of_kind("ClusterRoleBinding").collect();
    assert_eq!(bindings.len(), 1, "one ClusterRoleBinding");
    let binding: ClusterRoleBinding =
        serde_json::from_value(bindings[0].clone()).expect("ClusterRoleBinding");
    let role = of_kind("ClusterRole")
        .find(|v| v["metadata"]["name"] == binding.role_ref.name.as_str())
        .expect("the ClusterRole the binding grants");
    (
        serde_json::from_value(role.clone()).expect("ClusterRole"),
        binding,
    )
}

/// The ClusterRole of deploy/base as the component leaves it: its JSON patch (RFC 6902, `test`
/// ops included) applied the way kustomize applies it.
fn namespaced_cluster_role() -> ClusterRole {
    let k = &yaml_docs(&format!("{COMPONENT}/kustomization.yaml"))[0];
    assert_eq!(k["kind"], "Component");
    let patches: Vec<&Value> = k["patches"]
        .as_array()
        .expect("patches")
        .iter()
        .filter(|p| p["target"]["kind"] == "ClusterRole")
        .collect();
    assert_eq!(patches.len(), 1, "one patch of the ClusterRole");
    assert_eq!(patches[0]["target"]["name"], "capc-health-shim");
    let ops: Value = serde_yaml_ng::from_str(patches[0]["patch"].as_str().expect("inline patch"))
        .expect("the patch is YAML");
    let ops: json_patch::Patch = serde_json::from_value(ops).expect("a JSON patch");
    let (role, _) = deploy_rbac();
    let mut v = serde_json::to_value(role).unwrap();
    json_patch::patch(&mut v, &ops).expect("the component's patch applies to deploy/base");
    serde_json::from_value(v).unwrap()
}

fn grants_secrets(rule: &k8s_openapi::api::rbac::v1::PolicyRule) -> bool {
    rule.resources.iter().flatten().any(|r| r == "secrets")
}

#[test]
fn the_namespaced_secrets_component_removes_exactly_the_secret_rule() {
    let (base, binding) = deploy_rbac();
    let base_rules = base.rules.unwrap_or_default();
    assert_eq!(
        base_rules.iter().filter(|r| grants_secrets(r)).count(),
        1,
        "deploy/base grants Secrets in one rule"
    );
    let kept: Vec<_> = base_rules
        .iter()
        .filter(|r| !grants_secrets(r))
        .cloned()
        .collect();
    assert_eq!(namespaced_cluster_role().rules.unwrap_or_default(), kept);

    // In the shim's namespace: `get` on exactly the example override Secrets, by name.
    let own: Role = object(&format!("{COMPONENT}/shim-namespace.yaml"), "Role");
    let own_binding: RoleBinding =
        object(&format!("{COMPONENT}/shim-namespace.yaml"), "RoleBinding");
    let examples: Vec<Secret> = [
        "deploy/examples/cloudstack-readonly-secret.yaml",
        "deploy/examples/cloudstack-probe-secret.yaml",
    ]
    .iter()
    .map(|p| object(p, "Secret"))
    .collect();
    let rules = own.rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, ["get"]);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["secrets".to_string()][..])
    );
    let names: Vec<_> = examples
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(rules[0].resource_names.as_deref(), Some(&names[..]));
    for s in &examples {
        assert_eq!(s.metadata.namespace, own.metadata.namespace);
    }
    assert_eq!(own_binding.metadata.namespace, own.metadata.namespace);
    assert_eq!(
        own_binding.role_ref.name,
        own.metadata.name.clone().unwrap()
    );
    assert_eq!(own_binding.subjects, binding.subjects);

    // The per-namespace reader: no namespace of its own, `get` on Secrets only.
    let reader: Role = object(&format!("{COMPONENT}/reader/reader.yaml"), "Role");
    let reader_binding: RoleBinding =
        object(&format!("{COMPONENT}/reader/reader.yaml"), "RoleBinding");
    assert_eq!(reader.metadata.namespace, None);
    assert_eq!(reader_binding.metadata.namespace, None);
    let rules = reader.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, ["get"]);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["secrets".to_string()][..])
    );
    assert_eq!(reader_binding.role_ref.name, reader.metadata.name.unwrap());
    assert_eq!(reader_binding.subjects, binding.subjects);
}

#[test]
fn the_cluster_role_has_no_delete_verb_and_no_wildcards() {
    let (role, _) = deploy_rbac();
    for rule in role.rules.unwrap_or_default() {
        for verb in &rule.verbs {
            assert!(
                !matches!(verb.as_str(), "delete" | "deletecollection" | "*"),
                "verb {verb} in {rule:?}"
            );
        }
        for r in rule.resources.unwrap_or_default() {
            assert_ne!(r, "*");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_controller_works_as_a_service_account_with_only_the_deploy_role() {
    works_with_only_the_deploy_role(Grant::ClusterWide).await;
}

/// With `--namespace`, the deploy role granted in that namespace only (a RoleBinding to the
/// ClusterRole) is enough: the watches are namespaced, so no cluster-wide list is attempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn with_namespace_the_deploy_role_granted_in_that_namespace_is_enough() {
    works_with_only_the_deploy_role(Grant::InNamespace).await;
}

#[derive(PartialEq)]
enum Grant {
    /// The ClusterRoleBinding of deploy/base.
    ClusterWide,
    /// A RoleBinding in the test namespace to the same ClusterRole.
    InNamespace,
}

async fn works_with_only_the_deploy_role(grant: Grant) {
    let admin = kube_client().await;
    let f = Fixture::new(
        admin.clone(),
        &[
            ("vm-error", "healthy", "Error"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    f.machine("m-error", Some("vm-error"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;

    // The deploy role and binding, renamed per test so parallel runs do not collide.
    let (mut role, mut binding) = deploy_rbac();
    let name = format!("capc-health-shim-{}", f.ns);
    role.metadata.name = Some(name.clone());
    binding.metadata.name = Some(name.clone());
    binding.role_ref.name = name.clone();
    if let Some(subjects) = binding.subjects.as_mut() {
        subjects[0].namespace = Some(f.ns.clone());
    }
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("ClusterRole applies");
    let role_bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &f.ns);
    match grant {
        Grant::ClusterWide => {
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .expect("binding applies");
        }
        Grant::InNamespace => {
            let in_ns: RoleBinding = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": f.ns},
                "roleRef": binding.role_ref,
                "subjects": binding.subjects,
            }))
            .expect("RoleBinding");
            role_bindings
                .create(&PostParams::default(), &in_ns)
                .await
                .expect("RoleBinding applies");
        }
    }
    // The memory Role and its binding, in the test namespace as in the install's.
    let memory_role = memory_role_in(&admin, &f.ns).await;
    let sa_client = service_account_client(&admin, &f.ns).await;

    if grant == Grant::InNamespace {
        // The grant really is namespaced: a cluster-wide list is refused.
        let all: Api<DynamicObject> = Api::all_with(sa_client.clone(), &f.resources.machine);
        match all.list(&Default::default()).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
            other => panic!("a cluster-wide list must be forbidden here: {other:?}"),
        }
    }
    let (controller, report) = f.controller_as(sa_client.clone(), &[]).await;
    // The remnant report's metadata watches of every kind a CAPC cluster is made of: the
    // role grants them all (get/list/watch only).
    let kinds = discover_remnant_kinds(&sa_client).await;
    assert_eq!(kinds.len(), 13, "discovery as the ServiceAccount");
    let mut controller = controller
        .with_remnant_report(MetadataWatches::start(
            &sa_client,
            kinds,
            std::slice::from_ref(&f.ns),
        ))
        .with_memory(MemoryStore::new(&sa_client, &f.ns, &memory_role));
    controller.restore_memory().await;
    let annotate = f.choice.mode == Mode::Annotate;
    let state = f
        .cycle_until(
            &mut controller,
            &["m-error", "m-ok"],
            Duration::from_secs(60),
            |s| {
                is(&s["m-error"], "False", "VMError")
                    && is(&s["m-ok"], "True", "VMHealthy")
                    && (!annotate || s["m-error"].1)
            },
        )
        .await;
    assert!(!state["m-ok"].1);
    // The orphan memory was written to its ConfigMap under the Role.
    let memory = report.read().await.orphan_detection.memory.clone();
    let memory = memory.expect("the memory is kept");
    assert!(
        memory.written_at.is_some() && memory.last_error.is_none(),
        "{memory:?}"
    );
    assert_eq!(memory.stored_machines, 2, "{memory:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let d = report.read().await.remnant_detection.clone();
        if d.kinds.len() == 13 && d.kinds_not_synced.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the remnant watches sync under the deploy role: {d:?}"
        );
        controller.cycle(jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), &f.ns);
    assert!(events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("VMError")));

    // And it cannot delete what it judges.
    let machines: Api<DynamicObject> =
        Api::namespaced_with(sa_client.clone(), &f.ns, &f.resources.machine);
    match machines.delete("m-error", &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the ServiceAccount must not be able to delete a Machine: {other:?}"),
    }

    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = role_bindings.delete(&name, &DeleteParams::default()).await;
    let _ = roles.delete(&name, &DeleteParams::default()).await;
    f.cleanup().await;
}

/// deploy/base's Role in the shim's own namespace (its Lease and orphan memory) and its
/// RoleBinding, created in `ns` (the test's stand-in for the install's namespace); the
/// ConfigMap name the Role grants.
async fn memory_role_in(admin: &kube::Client, ns: &str) -> String {
    let docs = yaml_docs("deploy/base/rbac.yaml");
    let of_kind = |kind: &str| {
        docs.iter()
            .find(|v| v["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("a {kind} in deploy/base/rbac.yaml"))
    };
    let mut role: Role = serde_json::from_value(of_kind("Role")).expect("Role");
    role.metadata.namespace = Some(ns.to_string());
    let name = role
        .rules
        .as_ref()
        .expect("rules")
        .iter()
        .find(|r| r.resources.as_deref() == Some(&["configmaps".to_string()][..]))
        .and_then(|r| r.resource_names.as_ref())
        .expect("the Role grants one ConfigMap by name")[0]
        .clone();
    let mut binding: RoleBinding =
        serde_json::from_value(of_kind("RoleBinding")).expect("RoleBinding");
    binding.metadata.namespace = Some(ns.to_string());
    if let Some(subjects) = binding.subjects.as_mut() {
        subjects[0].namespace = Some(ns.to_string());
    }
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("Role applies");
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding applies");
    name
}

/// A client of the test API server authenticated as the ServiceAccount `capc-health-shim`
/// (created in `ns`): same server and CA as the admin kubeconfig, a fresh token.
async fn service_account_client(admin: &kube::Client, ns: &str) -> kube::Client {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "capc-health-shim"}})).unwrap(),
    )
    .await
    .expect("ServiceAccount");
    let token = kube_support::service_account_token(admin, ns, "capc-health-shim").await;

    // Same server and CA as the admin kubeconfig, authenticated as the ServiceAccount.
    let mut cfg = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(
            &std::fs::read_to_string(test_support::apiserver::kubeconfig_path()).unwrap(),
        )
        .unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    kube::Client::try_from(cfg).expect("ServiceAccount client")
}

/// Runs controller cycles until `done` holds for the current verdicts (deadline), keeping every
/// cycle's problems.
async fn cycles_until(
    f: &Fixture,
    controller: &mut capc_health_shim::controller::cycle::Controller,
    names: &[&str],
    deadline: Duration,
    done: impl Fn(&BTreeMap<String, (Option<(String, String)>, bool)>, &[String]) -> bool,
) -> (
    BTreeMap<String, (Option<(String, String)>, bool)>,
    Vec<String>,
) {
    let until = std::time::Instant::now() + deadline;
    let mut problems = Vec::new();
    loop {
        let summary = controller.cycle(jiff::Timestamp::now()).await;
        problems.extend(summary.problems);
        let mut state = BTreeMap::new();
        for n in names {
            state.insert(n.to_string(), f.verdict(n).await);
        }
        if done(&state, &problems) {
            return (state, problems);
        }
        assert!(
            std::time::Instant::now() < until,
            "not reached within {deadline:?}: {state:#?}\nproblems: {problems:#?}"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
}

/// deploy/base's ClusterRole with the component applied, the component's own-namespace Role and
/// its per-namespace reader (limited by `resourceNames` to the endpoint Secret, as
/// deploy/examples/namespaced-secrets does), all moved to the test's namespace: the endpoint
/// Secret and the operator's read-only key are read; a failure domain whose Secret lives in a
/// namespace without a grant turns Unknown with the refusal as a problem; with
/// `--no-workload-node-lookup` the Cluster's kubeconfig is never asked for, and with the lookup
/// on the same situation asks for it at once (a problem naming the way out; the verdict stands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn with_the_namespaced_secrets_component_secrets_are_read_only_where_granted() {
    let admin = kube_client().await;
    let f = Fixture::new(
        admin.clone(),
        &[
            ("vm-error", "healthy", "Error"),
            ("vm-ok", "healthy", "Starting"),
            ("vm-far", "healthy", "Starting"),
        ],
    )
    .await;
    let secret_ar = ar("", "v1", "Secret", "secrets");
    // CAPC's Secret holds a wrong key: verdicts prove the operator's read-only key was read.
    merge_patch(
        &admin,
        &f.ns,
        &secret_ar,
        "acs",
        json!({"stringData": {"api-key": "not-the-key", "secret-key": "not-the-secret"}}),
    )
    .await;
    f.secret(
        "capc-health-shim-cloudstack-readonly",
        &[("api-key", SIM_KEY), ("secret-key", SIM_SECRET)],
    )
    .await;
    f.secret("c1-kubeconfig", &[("value", "what CAPI would write")])
        .await;
    // A second failure domain whose endpoint Secret lives in a namespace without a grant.
    let far_ns = format!("{}-far", f.ns);
    create(
        &admin,
        "",
        &ar("", "v1", "Namespace", "namespaces"),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": far_ns}}),
    )
    .await;
    create(&admin, &far_ns, &secret_ar, json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "acs-far", "namespace": far_ns},
        "stringData": {"api-url": f.server.api_url(), "api-key": SIM_KEY, "secret-key": SIM_SECRET}})).await;
    let fd = &f.resources.failure_domain;
    create(&admin, &f.ns, fd, json!({"apiVersion": fd.api_version, "kind": "CloudStackFailureDomain",
        "metadata": {"name": "fd2-hash", "namespace": f.ns, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {"name": "fd2", "zone": {"name": "zone-a", "id": kube_support::ZONE_ID, "network": {"name": "capi-shared"}},
                 "acsEndpoint": {"name": "acs-far", "namespace": far_ns}}})).await;
    f.machine("m-error", Some("vm-error"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    f.machine("m-far", Some("vm-far"), false, "fd2").await;

    // The RBAC, renamed or moved into the test's namespace so parallel runs do not collide.
    let name = format!("capc-health-shim-{}", f.ns);
    let mut role = namespaced_cluster_role();
    let (_, mut binding) = deploy_rbac();
    role.metadata.name = Some(name.clone());
    binding.metadata.name = Some(name.clone());
    binding.role_ref.name = name.clone();
    for subject in binding.subjects.iter_mut().flatten() {
        subject.namespace = Some(f.ns.clone());
    }
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("ClusterRole applies");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding applies");
    let ns_roles: Api<Role> = Api::namespaced(admin.clone(), &f.ns);
    let ns_bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &f.ns);
    let own = format!("{COMPONENT}/shim-namespace.yaml");
    let mut reader: Role = object(&format!("{COMPONENT}/reader/reader.yaml"), "Role");
    if let Some(rules) = reader.rules.as_mut() {
        rules[0].resource_names = Some(vec!["acs".into()]);
    }
    for (mut r, mut b) in [
        (
            object::<Role>(&own, "Role"),
            object::<RoleBinding>(&own, "RoleBinding"),
        ),
        (
            reader,
            object(&format!("{COMPONENT}/reader/reader.yaml"), "RoleBinding"),
        ),
    ] {
        r.metadata.namespace = Some(f.ns.clone());
        b.metadata.namespace = Some(f.ns.clone());
        for subject in b.subjects.iter_mut().flatten() {
            subject.namespace = Some(f.ns.clone());
        }
        ns_roles
            .create(&PostParams::default(), &r)
            .await
            .expect("Role applies");
        ns_bindings
            .create(&PostParams::default(), &b)
            .await
            .expect("RoleBinding applies");
    }
    let sa_client = service_account_client(&admin, &f.ns).await;

    // What the grants allow, asked directly.
    let refused = |ns: &str, secret: &str| {
        let api: Api<Secret> = Api::namespaced(sa_client.clone(), ns);
        let secret = secret.to_string();
        async move {
            match api.get(&secret).await {
                Err(kube::Error::Api(s)) => s.code == 403,
                Ok(_) => false,
                Err(e) => panic!("GET Secret {secret}: {e}"),
            }
        }
    };
    assert!(
        !refused(&f.ns, "acs").await,
        "the endpoint Secret is granted"
    );
    assert!(!refused(&f.ns, "capc-health-shim-cloudstack-readonly").await);
    assert!(
        refused(&far_ns, "acs-far").await,
        "no cluster-wide Secret access"
    );
    assert!(
        refused(&f.ns, "c1-kubeconfig").await,
        "granted by name only"
    );

    // Lookup off: the verdicts come, m-far's Secret is refused, no kubeconfig is asked for —
    // although m-error, a Node-less Machine turning False, is what the lookup is for.
    let names = ["m-error", "m-ok", "m-far"];
    let far_refused = format!("Secret {far_ns}/acs-far: forbidden (403)");
    let (mut off, _) = f
        .controller_as(
            sa_client.clone(),
            &[
                "--no-workload-node-lookup",
                &format!(
                    "--endpoint-credentials={}={}/capc-health-shim-cloudstack-readonly",
                    f.server.api_url(),
                    f.ns
                ),
            ],
        )
        .await;
    let (_, problems) = cycles_until(&f, &mut off, &names, Duration::from_secs(60), |s, _| {
        is(&s["m-error"], "False", "VMError")
            && is(&s["m-ok"], "True", "VMHealthy")
            && is(&s["m-far"], "Unknown", "CredentialsUnavailable")
    })
    .await;
    // And three more cycles with m-error False.
    let mut problems = problems;
    for _ in 0..3 {
        problems.extend(off.cycle(jiff::Timestamp::now()).await.problems);
    }
    assert!(
        problems.iter().any(|p| p.contains(&far_refused)),
        "{problems:#?}"
    );
    assert!(
        !problems.iter().any(|p| p.contains("kubeconfig")),
        "{problems:#?}"
    );
    drop(off);

    // Lookup on, same situation: the kubeconfig is asked for and refused; the verdict stands.
    let (mut on, report) = f
        .controller_as(
            sa_client.clone(),
            &[&format!(
                "--endpoint-credentials={}={}/capc-health-shim-cloudstack-readonly",
                f.server.api_url(),
                f.ns
            )],
        )
        .await;
    let kubeconfig_refused = format!("Secret {}/c1-kubeconfig: forbidden (403)", f.ns);
    let (state, problems) = cycles_until(&f, &mut on, &names, Duration::from_secs(60), |_, p| {
        p.iter().any(|p| p.contains(&kubeconfig_refused))
    })
    .await;
    let p = problems
        .iter()
        .find(|p| p.contains(&kubeconfig_refused))
        .unwrap();
    assert!(
        p.contains("NodeNotLinked") && p.contains("--no-workload-node-lookup"),
        "{p}"
    );
    assert!(is(&state["m-error"], "False", "VMError"), "{state:#?}");
    assert!(
        is(&state["m-far"], "Unknown", "CredentialsUnavailable"),
        "{state:#?}"
    );
    let status = report.read().await.problems.clone();
    assert!(
        status.iter().any(|p| p.contains(&far_refused)),
        "/status: {status:#?}"
    );
    assert!(
        status.iter().any(|p| p.contains(&kubeconfig_refused)),
        "/status: {status:#?}"
    );

    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = roles.delete(&name, &DeleteParams::default()).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let _ = namespaces.delete(&far_ns, &Default::default()).await;
    f.cleanup().await;
}
