//! The Kubernetes edge: discovery of served versions, watches (reflectors) of the objects the
//! shim reads, and its three kinds of writes — the status condition (server-side apply of one
//! entry), the remediate annotation (merge patch of one key) and Events. Foreign objects are
//! only ever patched, never replaced.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;

use super::joins::{Changed, ChangedKinds, Records};
use crate::k8s::views::{Partial, View};
use crate::k8s::watched::{
    keep_newer, CloudStackMachineRecord, ClusterRecord, ConditionReader, FailureDomainRecord,
    HealthCheckRecord, MachineRecord, Versioned,
};
use crate::verdict::ConditionState;
use capi_model::apis::{ApiChoice, ConditionLayout, ServedApis};
use capi_model::condition::{apply_body, FIELD_MANAGER};
use capi_model::well_known;

use crate::k8s::kube_error::{within, KubeError};

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

/// The watched objects as records ([`crate::k8s::watched`]), kept current by watches. Each
/// watch reads its objects as typed partial views ([`crate::k8s::views`]), tolerant field by
/// field, so a malformed object cannot break it.
#[derive(Clone)]
pub struct Stores {
    pub machines: Watched<MachineRecord>,
    pub cloudstack_machines: Watched<CloudStackMachineRecord>,
    pub failure_domains: Watched<FailureDomainRecord>,
    pub clusters: Watched<ClusterRecord>,
    pub health_checks: Watched<HealthCheckRecord>,
}

/// The records of one kind, from one watch per namespace of `--namespace` (or one watch of
/// the whole cluster without it).
#[derive(Clone)]
pub struct Watched<R: Lookup<DynamicType = ()> + Clone + 'static> {
    stores: Vec<Store<R>>,
    /// What the watches applied since the last [`Watched::take_changed`].
    changed: Arc<std::sync::Mutex<Changed>>,
}

impl<R> Watched<R>
where
    R: Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Every record, over all watched namespaces.
    pub fn state(&self) -> Vec<Arc<R>> {
        match self.stores.as_slice() {
            [one] => one.state(),
            many => many.iter().flat_map(|s| s.state()).collect(),
        }
    }

    /// The record of one object, from the store of its namespace.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<R>> {
        let key = ObjectRef::new(name).within(namespace);
        self.stores.iter().find_map(|s| s.get(&key))
    }

    /// What the watches applied since the last call (and forgets it).
    pub fn take_changed(&self) -> Changed {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn wait_until_ready(&self) {
        for s in &self.stores {
            let _ = s.wait_until_ready().await;
        }
    }
}

impl Records for Stores {
    fn machines(&self) -> Vec<Arc<MachineRecord>> {
        self.machines.state()
    }
    fn machine(&self, namespace: &str, name: &str) -> Option<Arc<MachineRecord>> {
        self.machines.get(namespace, name)
    }
    fn cloudstack_machines(&self) -> Vec<Arc<CloudStackMachineRecord>> {
        self.cloudstack_machines.state()
    }
    fn cloudstack_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<CloudStackMachineRecord>> {
        self.cloudstack_machines.get(namespace, name)
    }
    fn failure_domains(&self) -> Vec<Arc<FailureDomainRecord>> {
        self.failure_domains.state()
    }
    fn clusters(&self) -> Vec<Arc<ClusterRecord>> {
        self.clusters.state()
    }
    fn health_checks(&self) -> Vec<Arc<HealthCheckRecord>> {
        self.health_checks.state()
    }
}

/// Watches `ar` in each of `namespaces` (all namespaces when empty) as the view `V` and keeps,
/// per object, the record `read` takes from it.
fn watch<V, R>(
    client: &Client,
    ar: &ApiResource,
    namespaces: &[String],
    read: impl Fn(V) -> Option<R> + Clone + Send + 'static,
) -> Watched<R>
where
    V: View,
    R: Lookup<DynamicType = ()> + Versioned + Clone + Send + Sync + 'static,
{
    let apis: Vec<Api<Partial<V>>> = if namespaces.is_empty() {
        vec![Api::all_with(client.clone(), ar)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, ar))
            .collect()
    };
    let changed = Arc::new(std::sync::Mutex::new(Changed::default()));
    Watched {
        stores: apis
            .into_iter()
            .map(|api| watch_one(api, ar.kind.clone(), read.clone(), changed.clone()))
            .collect(),
        changed,
    }
}

fn watch_one<V, R>(
    api: Api<Partial<V>>,
    kind: String,
    read: impl Fn(V) -> Option<R> + Send + 'static,
    changed: Arc<std::sync::Mutex<Changed>>,
) -> Store<R>
where
    V: View,
    R: Lookup<DynamicType = ()> + Versioned + Clone + Send + Sync + 'static,
{
    let mut writer = reflector::store::Writer::<R>::new(());
    let reader = writer.as_reader();
    let reader_of_writer = writer.as_reader();
    let events = watcher(api, watcher::Config::default().any_semantic()).default_backoff();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    let Some(event) = record_event(event, &read) else {
                        continue;
                    };
                    let (event, stale) =
                        keep_newer(event, |o| reader_of_writer.get(&o.to_object_ref(())));
                    if stale {
                        tracing::debug!(kind = %kind, "a read older than the one kept was ignored (relist from a lagging cache)");
                    }
                    if let Some(event) = event {
                        // The store first, then the note (see `controller::joins`).
                        writer.apply_watcher_event(&event);
                        changed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .note(&event);
                    }
                }
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch error; retrying with back-off")
                }
            }
        }
    });
    reader
}

/// The event with its object replaced by the object's record; `None` for an object that has
/// none (no name: the API server sends no such object).
fn record_event<V, R>(
    event: watcher::Event<Partial<V>>,
    read: impl Fn(V) -> Option<R>,
) -> Option<watcher::Event<R>> {
    use watcher::Event;
    let record = |o: Partial<V>| read(o.view);
    Some(match event {
        Event::Apply(o) => Event::Apply(record(o)?),
        Event::Delete(o) => Event::Delete(record(o)?),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(record(o)?),
        Event::InitDone => Event::InitDone,
    })
}

impl Stores {
    /// What each watch applied since the last call.
    pub fn take_changed(&self) -> ChangedKinds {
        ChangedKinds {
            machines: self.machines.take_changed(),
            cloudstack_machines: self.cloudstack_machines.take_changed(),
            failure_domains: self.failure_domains.take_changed(),
            clusters: self.clusters.take_changed(),
            health_checks: self.health_checks.take_changed(),
        }
    }

    /// Starts the watches in `namespaces` (every namespace when empty: `--namespace` unset);
    /// `reader` says how to read our condition off a Machine.
    pub fn start(
        client: &Client,
        r: &Resources,
        reader: ConditionReader,
        namespaces: &[String],
    ) -> Self {
        let reader = Arc::new(reader);
        Self {
            machines: watch(client, &r.machine, namespaces, move |m| {
                MachineRecord::from_view(m, &reader)
            }),
            cloudstack_machines: watch(
                client,
                &r.cloudstack_machine,
                namespaces,
                CloudStackMachineRecord::from_view,
            ),
            failure_domains: watch(
                client,
                &r.failure_domain,
                namespaces,
                FailureDomainRecord::from_view,
            ),
            clusters: watch(client, &r.cluster, namespaces, ClusterRecord::from_view),
            health_checks: watch(client, &r.mhc, namespaces, HealthCheckRecord::from_view),
        }
    }

    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        let all = async {
            let _ = self.machines.wait_until_ready().await;
            let _ = self.cloudstack_machines.wait_until_ready().await;
            let _ = self.failure_domains.wait_until_ready().await;
            let _ = self.clusters.wait_until_ready().await;
            let _ = self.health_checks.wait_until_ready().await;
        };
        tokio::time::timeout(timeout, all).await.is_ok()
    }
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

/// Server-side apply of our one condition entry on the Machine's status, within `timeout`.
pub async fn apply_condition(
    client: &Client,
    machine: &ApiResource,
    layout: ConditionLayout,
    (namespace, name, uid): (&str, &str, Option<&str>),
    condition: &ConditionState,
    timeout: Duration,
) -> Result<(), KubeError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, machine);
    let body = apply_body(layout, namespace, name, uid, condition);
    let what = format!("condition on Machine {namespace}/{name}");
    within(timeout, what.clone(), async {
        api.patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(|_| ())
        .map_err(|e| KubeError::from_kube(what.clone(), &e))
    })
    .await
}

/// The Machine an annotation was decided on: it is written only to that one.
pub struct Precondition<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
    pub resource_version: Option<&'a str>,
}

/// The merge patch that sets `cluster.x-k8s.io/remediate-machine`, with the Machine's `uid`
/// and `resourceVersion` as preconditions: the API server refuses it (409) when the Machine
/// was recreated under the same name or changed since the cycle read it — the next cycle
/// then decides again from what it is. A `resourceVersion` can cost a cycle when something
/// else updated the Machine meanwhile; a Machine whose VM has failed for the escalation delay
/// rarely changes, and a recycle on a stale reading costs a whole VM.
pub fn annotation_patch(p: &Precondition<'_>, why: &str) -> serde_json::Value {
    let mut metadata =
        json!({"annotations": {well_known::REMEDIATE_MACHINE: format!("capc-health-shim: {why}")}});
    if let Some(uid) = p.uid {
        metadata["uid"] = json!(uid);
    }
    if let Some(rv) = p.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": metadata })
}

/// Sets `cluster.x-k8s.io/remediate-machine` (a merge patch of that one key, under the
/// preconditions of [`annotation_patch`]), within `timeout`.
pub async fn annotate_for_remediation(
    client: &Client,
    machine: &ApiResource,
    p: Precondition<'_>,
    why: &str,
    timeout: Duration,
) -> Result<(), KubeError> {
    let (namespace, name) = (p.namespace, p.name);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, machine);
    let patch = annotation_patch(&p, why);
    let what = format!("annotation on Machine {namespace}/{name}");
    within(timeout, what.clone(), async {
        // Under the shim's field manager, so metadata.managedFields says who asked for the
        // remediation (the e2e's causality check reads it).
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        api.patch(name, &params, &Patch::Merge(patch))
            .await
            .map(|_| ())
            .map_err(|e| KubeError::from_kube(what.clone(), &e))
    })
    .await
}

/// Publishes Events about Machines (and Clusters: the orphan report).
#[derive(Clone)]
pub struct Events {
    recorder: Arc<Recorder>,
    machine: ApiResource,
}

impl Events {
    pub fn new(client: &Client, machine: &ApiResource) -> Self {
        let reporter = Reporter {
            controller: "capc-health-shim".into(),
            instance: std::env::var("HOSTNAME").ok(),
        };
        Self {
            recorder: Arc::new(Recorder::new(client.clone(), reporter)),
            machine: machine.clone(),
        }
    }

    /// Publishes one Event about Machine `namespace/name` (with its `uid`, so that `kubectl
    /// describe machine` lists it), within `timeout`.
    pub async fn publish(
        &self,
        (namespace, name, uid): (&str, &str, Option<&str>),
        warning: bool,
        reason: &str,
        note: String,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let reference = self.machine_reference(namespace, name, uid);
        self.publish_about(reference, None, warning, reason, note, timeout)
            .await
    }

    /// The reference an Event about a Machine names.
    fn machine_reference(&self, namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.machine.api_version.clone()),
            kind: Some("Machine".into()),
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            uid: uid.map(str::to_string),
            ..Default::default()
        }
    }

    /// Publishes one Event about the object `reference` names (and `related`, a second object
    /// it concerns), within `timeout`. The recorder folds Events of the same reason about the
    /// same objects into one series; a distinct `related` keeps them apart.
    pub async fn publish_about(
        &self,
        reference: ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        note: String,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let mut note = note;
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(note),
            action: "HealthCheck".into(),
            secondary: related,
        };
        let what = format!(
            "Event on {} {}/{}",
            reference.kind.as_deref().unwrap_or("object"),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        within(timeout, what.clone(), async {
            self.recorder
                .publish(&event, &reference)
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await
    }
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
