//! The Kubernetes edge: discovery of served versions, Secret reads and workload Node lookups
//! here; the watches of the objects the shim reads in [`watches`], its three kinds of writes
//! (condition, remediate annotation, Events) in [`writes`].

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, GroupVersionKind, ListParams};
use kube::Client;

use capi_model::apis::{ApiChoice, ConditionLayout, ServedApis};

use crate::k8s::kube_error::{within, KubeError};

mod watches;
mod writes;
pub use watches::{Stores, Watched};
pub use writes::{
    annotate_for_remediation, annotation_patch, apply_condition, Events, Precondition,
};

const CAPI_GROUP: &str = "cluster.x-k8s.io";
const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// The API resources the shim uses, at the versions discovery chose.
#[derive(Debug, Clone)]
pub struct Resources {
    pub machine: ApiResource,
    pub cluster: ApiResource,
    pub mhc: ApiResource,
    pub cloudstack_machine: ApiResource,
    pub failure_domain: ApiResource,
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

impl Resources {
    pub fn for_choice(c: &ApiChoice) -> Self {
        let machine_version = match c.layout {
            ConditionLayout::V1Beta2 => "v1beta2",
            ConditionLayout::V1Beta1WithV1Beta2Conditions => "v1beta1",
        };
        Self {
            machine: resource(CAPI_GROUP, machine_version, "Machine", "machines"),
            cluster: resource(CAPI_GROUP, &c.cluster_version, "Cluster", "clusters"),
            mhc: resource(
                CAPI_GROUP,
                &c.mhc_version,
                "MachineHealthCheck",
                "machinehealthchecks",
            ),
            cloudstack_machine: resource(
                INFRA_GROUP,
                &c.cloudstack_machine_version,
                "CloudStackMachine",
                "cloudstackmachines",
            ),
            failure_domain: resource(
                INFRA_GROUP,
                &c.cloudstack_failure_domain_version,
                "CloudStackFailureDomain",
                "cloudstackfailuredomains",
            ),
        }
    }
}

async fn served_versions(
    client: &Client,
    group: &str,
    kinds: &[&str],
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> =
        kinds.iter().map(|k| (k.to_string(), Vec::new())).collect();
    // A missing group is an empty answer here; `choose` turns it into the operator's error.
    let Ok(g) = kube::discovery::group(client, group).await else {
        return out;
    };
    for version in g.versions() {
        for (ar, _) in g.versioned_resources(version) {
            if let Some(v) = out.get_mut(&ar.kind) {
                v.push(version.to_string());
            }
        }
    }
    out
}

/// What is served, including whether the MHC schema has `unhealthyMachineConditions`.
/// A problem that does not stop discovery (e.g. no permission to read CRDs) is returned too.
pub async fn discover(client: &Client) -> (ServedApis, Vec<String>) {
    let capi = served_versions(
        client,
        CAPI_GROUP,
        &["Machine", "Cluster", "MachineHealthCheck"],
    )
    .await;
    let infra = served_versions(
        client,
        INFRA_GROUP,
        &["CloudStackMachine", "CloudStackFailureDomain"],
    )
    .await;
    let mut problems = Vec::new();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let unhealthy_machine_conditions = match crds
        .get_opt("machinehealthchecks.cluster.x-k8s.io")
        .await
    {
        Ok(Some(crd)) => {
            crate::k8s::objects::crd_declares_spec_field(&crd, "unhealthyMachineConditions")
        }
        Ok(None) => false,
        Err(e) => {
            problems.push(format!(
                "cannot read the MachineHealthCheck CRD to detect unhealthyMachineConditions ({e}); assuming it is absent"
            ));
            false
        }
    };
    let take = |m: &BTreeMap<String, Vec<String>>, k: &str| m.get(k).cloned().unwrap_or_default();
    (
        ServedApis {
            machine: take(&capi, "Machine"),
            cluster: take(&capi, "Cluster"),
            machine_health_check: take(&capi, "MachineHealthCheck"),
            mhc_unhealthy_machine_conditions: unhealthy_machine_conditions,
            cloudstack_machine: take(&infra, "CloudStackMachine"),
            cloudstack_failure_domain: take(&infra, "CloudStackFailureDomain"),
        },
        problems,
    )
}

/// The data of a Secret as strings, read within `timeout`; errors name the Secret, never its
/// content.
pub async fn secret_data(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, KubeError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{name}");
    let secret = within(timeout, what.clone(), async {
        api.get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), &e))
    })
    .await?
    .ok_or_else(|| KubeError::NotFound { what: what.clone() })?;
    let mut out = BTreeMap::new();
    for (k, v) in secret.data.unwrap_or_default() {
        out.insert(k, String::from_utf8_lossy(&v.0).into_owned());
    }
    for (k, v) in secret.string_data.unwrap_or_default() {
        out.entry(k).or_insert(v);
    }
    Ok(out)
}

/// Nodes of a workload cluster, read through its `<cluster>-kubeconfig` Secret (key `value`),
/// bounded by `timeout`. `Err` means "could not look" and never blocks a verdict by itself.
pub async fn workload_nodes(
    client: &Client,
    namespace: &str,
    cluster: &str,
    timeout: Duration,
) -> Result<Vec<k8s_openapi::api::core::v1::Node>, KubeError> {
    let secret = format!("{cluster}-kubeconfig");
    let data = secret_data(client, namespace, &secret, timeout).await?;
    let unusable = |message: String| KubeError::Unusable {
        what: format!("workload kubeconfig of {namespace}/{cluster}"),
        message,
    };
    let raw = data
        .get("value")
        .ok_or_else(|| unusable(format!("Secret {namespace}/{secret} has no key `value`")))?;
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(raw).map_err(|e| unusable(e.to_string()))?;
    crate::k8s::kubeconfig::refuse_local_credentials(&kubeconfig).map_err(|message| {
        KubeError::Refused {
            what: format!("workload kubeconfig Secret {namespace}/{secret}"),
            message,
        }
    })?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| unusable(e.to_string()))?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    let workload = Client::try_from(config).map_err(|e| unusable(e.to_string()))?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(workload);
    let what = format!("Nodes of workload cluster {namespace}/{cluster}");
    let list = within(timeout, what.clone(), async {
        nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), &e))
    })
    .await?;
    Ok(list.items)
}
