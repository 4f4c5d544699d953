//! The shim's three kinds of writes: the status condition (server-side apply of one entry),
//! the remediate annotation (merge patch of one key, with preconditions) and Events. Foreign
//! objects are only ever patched, never replaced.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use serde_json::json;

use crate::verdict::ConditionState;
use capi_model::apis::ConditionLayout;
use capi_model::condition::{apply_body, FIELD_MANAGER};
use capi_model::well_known;

use crate::k8s::kube_error::{within, KubeError};

/// Server-side apply of our one condition entry on the Machine's status, within `timeout`.
pub async fn apply_condition(
    client: &Client,
    machine: &ApiResource,
    layout: ConditionLayout,
    (namespace, name): (&str, &str),
    condition: &ConditionState,
    timeout: Duration,
) -> Result<(), KubeError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, machine);
    let body = apply_body(layout, namespace, name, condition);
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
