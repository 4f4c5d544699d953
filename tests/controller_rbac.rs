//! The controller runs as a ServiceAccount bound only to the ClusterRole in `deploy/base/rbac.yaml`
//! (applied to the real API server) and still does its whole job; the role has no `delete`
//! verb anywhere, and the ServiceAccount really cannot delete a Machine.

mod kube_support;

use std::time::Duration;

use capc_health_shim::k8s::capi::Mode;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube_support::{is, kube_client, Fixture};
use serde_json::json;

fn deploy_rbac() -> (ClusterRole, ClusterRoleBinding) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/rbac.yaml"
    ))
    .expect("deploy/base/rbac.yaml");
    let mut role = None;
    let mut binding = None;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).expect("YAML document");
        match v["kind"].as_str() {
            Some("ClusterRole") => role = Some(serde_json::from_value(v).expect("ClusterRole")),
            Some("ClusterRoleBinding") => {
                binding = Some(serde_json::from_value(v).expect("ClusterRoleBinding"))
            }
            _ => {}
        }
    }
    (
        role.expect("a ClusterRole"),
        binding.expect("a ClusterRoleBinding"),
    )
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
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &f.ns);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "capc-health-shim"}})).unwrap(),
    )
    .await
    .expect("ServiceAccount");
    let token = sas
        .create_token_request(
            "capc-health-shim",
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("token")
        .status
        .and_then(|s| s.token)
        .expect("a token");

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
    let sa_client = kube::Client::try_from(cfg).expect("ServiceAccount client");

    if grant == Grant::InNamespace {
        // The grant really is namespaced: a cluster-wide list is refused.
        let all: Api<DynamicObject> = Api::all_with(sa_client.clone(), &f.resources.machine);
        match all.list(&Default::default()).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
            other => panic!("a cluster-wide list must be forbidden here: {other:?}"),
        }
    }
    let (mut controller, _) = f.controller_as(sa_client.clone(), &[]).await;
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
