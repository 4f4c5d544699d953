//! `capc-health-shim cleanup`: after uninstalling, what the shim left behind, with the user's
//! kubeconfig — its leader Lease and memory ConfigMap (made at run time, so no uninstall
//! removes them), its condition entries and annotations on Machines (only what
//! `metadata.managedFields` says its field manager owns: never CAPI's), and the
//! MachineHealthCheck entries naming its condition. It lists; with `--yes` it removes the
//! shim's own; the MHC entries only with `--remove-mhc-entries` too (they are the operator's:
//! by default their patch is printed). What counts as the shim's is [`decide`]; here is I/O.

mod decide;
mod render;
#[cfg(test)]
mod tests;

use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, Preconditions,
};
use kube::Client;
use serde::Serialize;
use serde_json::Value;

use crate::cli::OutputFormat;
use crate::controller::config::parse_object_name;
use capi_model::apis::ConditionLayout;
use capi_model::condition::{DEFAULT_CONDITION_TYPE, FIELD_MANAGER};
pub use decide::{machine_findings, mhc_finding, MachineFindings, MhcFinding, Owned};

#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// Remove what is listed: the Lease and memory ConfigMap, the shim's condition entries and
    /// annotations on Machines. Without it nothing is changed.
    #[arg(long)]
    pub yes: bool,
    /// With --yes, also remove the MachineHealthChecks' unhealthyMachineConditions entries
    /// naming the condition. They are the operator's objects: without this flag their patch
    /// is printed, never applied.
    #[arg(long)]
    pub remove_mhc_entries: bool,
    /// The condition type the shim wrote (`run --condition-type`).
    #[arg(long, default_value = DEFAULT_CONDITION_TYPE)]
    pub condition_type: String,
    /// Namespaces whose Machines and MachineHealthChecks are looked at (repeatable; default:
    /// all).
    #[arg(long = "namespace", value_delimiter = ',', value_name = "NAMESPACE")]
    pub namespaces: Vec<String>,
    /// The leader Lease's name (`run --lease-name`).
    #[arg(long, default_value = "capc-health-shim", value_parser = parse_object_name)]
    pub lease_name: String,
    /// The shim's own namespace, where its Lease and memory ConfigMap are (`run
    /// --lease-namespace`, the pod's namespace) [default: the kubeconfig context's namespace].
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// The orphan report's memory ConfigMap (`run --orphan-memory-configmap`).
    #[arg(long, default_value = "capc-health-shim-memory", value_parser = parse_object_name)]
    pub orphan_memory_configmap: String,
    /// A table for people, or JSON (`survey`, and `removal` after `--yes`).
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// Everything the shim left behind, as found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Survey {
    /// The Lease and the memory ConfigMap, where they exist.
    pub objects: Vec<OwnObject>,
    /// Machines the shim's field manager owns something on.
    pub machines: Vec<MachineFindings>,
    /// MachineHealthChecks listing the condition.
    pub mhcs: Vec<MhcFinding>,
    /// What could not be looked at, or hints (a Lease of that name in another namespace).
    pub notes: Vec<String>,
    /// Whether everything could be looked at.
    pub complete: bool,
    /// The Machine API version the conditions are released through.
    #[serde(skip)]
    pub layout: Option<ConditionLayout>,
}

/// The Lease or the memory ConfigMap.
#[derive(Debug, Clone, Serialize)]
pub struct OwnObject {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    #[serde(skip)]
    pub uid: Option<String>,
    /// The Lease's holder while its hold is current: the shim still runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

impl Survey {
    /// How many things `--yes` removes (MHC entries counted apart).
    pub fn count(&self) -> usize {
        self.objects.len()
            + self
                .machines
                .iter()
                .map(|m| m.conditions.len() + m.annotations.len() + m.other_fields.len())
                .sum::<usize>()
    }
}

fn resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(capi_model::well_known::CAPI_GROUP, version, kind),
        plural,
    )
}

/// Every object of `api` (paged), as JSON with its managedFields.
async fn list_all(api: &Api<DynamicObject>) -> Result<Vec<Value>, kube::Error> {
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        out.extend(
            page.items
                .iter()
                .filter_map(|o| serde_json::to_value(o).ok()),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

fn apis(client: &Client, r: &ApiResource, namespaces: &[String]) -> Vec<Api<DynamicObject>> {
    if namespaces.is_empty() {
        vec![Api::all_with(client.clone(), r)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, r))
            .collect()
    }
}

/// "cannot list X: forbidden …" with what to grant.
fn explain(what: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => format!(
            "cannot {what}: forbidden ({}): cleanup needs get/list there (and delete/patch with --yes): {}",
            s.code, s.message
        ),
        kube::Error::Api(s) if s.code == 404 => {
            format!("cannot {what}: the API is not served (is the CRD installed?): {}", s.message)
        }
        e => format!("cannot {what}: {e}"),
    }
}

/// Looks for everything the shim left behind.
pub async fn survey(client: &Client, args: &CleanupArgs, own_namespace: &str) -> Survey {
    let mut s = Survey {
        complete: true,
        ..Default::default()
    };
    let problem = |s: &mut Survey, note: String| {
        s.notes.push(note);
        s.complete = false;
    };
    // The Lease and the ConfigMap, in the shim's namespace (elsewhere only as a hint).
    let leases: Api<Lease> = Api::namespaced(client.clone(), own_namespace);
    match leases.get_opt(&args.lease_name).await {
        Ok(Some(l)) => s.objects.push(OwnObject {
            kind: "Lease",
            namespace: own_namespace.to_string(),
            name: args.lease_name.clone(),
            held_by: decide::current_holder(l.spec.as_ref(), jiff::Timestamp::now()),
            uid: l.metadata.uid,
        }),
        Ok(None) => {
            let elsewhere = Api::<Lease>::all(client.clone())
                .list(&ListParams::default().fields(&format!("metadata.name={}", args.lease_name)))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            for l in elsewhere {
                s.notes.push(format!(
                    "no Lease {} in namespace {own_namespace}, but one in {}: is the shim installed there (--lease-namespace {})?",
                    args.lease_name,
                    l.metadata.namespace.as_deref().unwrap_or(""),
                    l.metadata.namespace.as_deref().unwrap_or("")
                ));
            }
        }
        Err(e) => problem(
            &mut s,
            explain(
                &format!("read Lease {own_namespace}/{}", args.lease_name),
                &e,
            ),
        ),
    }
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), own_namespace);
    match maps.get_opt(&args.orphan_memory_configmap).await {
        Ok(Some(cm)) => s.objects.push(OwnObject {
            kind: "ConfigMap",
            namespace: own_namespace.to_string(),
            name: args.orphan_memory_configmap.clone(),
            uid: cm.metadata.uid,
            held_by: None,
        }),
        Ok(None) => {}
        Err(e) => problem(
            &mut s,
            explain(
                &format!(
                    "read ConfigMap {own_namespace}/{}",
                    args.orphan_memory_configmap
                ),
                &e,
            ),
        ),
    }
    // What Cluster API serves: Machines and MHCs are read at their newest version.
    let group = kube::discovery::group(client, capi_model::well_known::CAPI_GROUP).await;
    let served = |kind: &str| -> Vec<String> {
        let Ok(g) = &group else { return Vec::new() };
        g.versions()
            .filter(|v| g.versioned_resources(v).iter().any(|(r, _)| r.kind == kind))
            .map(str::to_string)
            .collect()
    };
    let (machine_versions, mhc_versions) = (served("Machine"), served("MachineHealthCheck"));
    match &group {
        Err(kube::Error::Discovery(_)) => s.notes.push(format!(
            "Cluster API (group {}) is not served: no Machine or MachineHealthCheck to look at",
            capi_model::well_known::CAPI_GROUP
        )),
        Err(e) => problem(&mut s, explain("discover the Cluster API versions", e)),
        Ok(_) => {}
    }
    s.layout = if machine_versions.iter().any(|v| v == "v1beta2") {
        Some(ConditionLayout::V1Beta2)
    } else if machine_versions.iter().any(|v| v == "v1beta1") {
        Some(ConditionLayout::V1Beta1WithV1Beta2Conditions)
    } else {
        None
    };
    if let Some(layout) = s.layout {
        let version = layout.api_version().rsplit('/').next().unwrap_or("v1beta2");
        let r = resource(version, "Machine", "machines");
        for api in apis(client, &r, &args.namespaces) {
            match list_all(&api).await {
                Ok(items) => s.machines.extend(items.iter().filter_map(machine_findings)),
                Err(e) => problem(&mut s, explain("list Machines", &e)),
            }
        }
    } else if group.is_ok() {
        s.notes
            .push("the Machine API is not served: no Machine to look at".into());
    }
    if mhc_versions.iter().any(|v| v == "v1beta2") {
        let r = resource("v1beta2", "MachineHealthCheck", "machinehealthchecks");
        for api in apis(client, &r, &args.namespaces) {
            match list_all(&api).await {
                Ok(items) => s.mhcs.extend(
                    items
                        .iter()
                        .filter_map(|m| mhc_finding(m, &args.condition_type)),
                ),
                Err(e) => problem(&mut s, explain("list MachineHealthChecks", &e)),
            }
        }
    } else if !mhc_versions.is_empty() {
        s.notes.push(
            "MachineHealthCheck v1beta2 is not served (Cluster API < 1.11): no MHC can list a Machine condition"
                .into(),
        );
    }
    s.machines
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    s
}

/// What `--yes` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Removal {
    pub removed: Vec<String>,
    pub failed: Vec<String>,
}

/// Removes what `s` lists (the MHC entries only when `mhc_entries`).
pub async fn remove(client: &Client, s: &Survey, mhc_entries: bool) -> Removal {
    let mut out = Removal::default();
    let mut record = |what: String, r: Result<(), String>| match r {
        Ok(()) => out.removed.push(what),
        Err(e) => out.failed.push(format!("{what}: {e}")),
    };
    for o in &s.objects {
        let dp = DeleteParams {
            preconditions: o.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        let gone = |r: Result<(), kube::Error>| match r {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            r => r.map_err(|e| explain("delete", &e)),
        };
        let r = if o.kind == "Lease" {
            let api: Api<Lease> = Api::namespaced(client.clone(), &o.namespace);
            gone(api.delete(&o.name, &dp).await.map(|_| ()))
        } else {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &o.namespace);
            gone(api.delete(&o.name, &dp).await.map(|_| ()))
        };
        record(format!("{} {}/{}", o.kind, o.namespace, o.name), r);
    }
    if let Some(layout) = s.layout {
        let version = layout.api_version().rsplit('/').next().unwrap_or("v1beta2");
        let r = resource(version, "Machine", "machines");
        for m in &s.machines {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &m.namespace, &r);
            let what = format!("Machine {}/{}", m.namespace, m.name);
            if let Some(ops) = decide::metadata_removal(m) {
                let r = match serde_json::from_value::<json_patch::Patch>(ops) {
                    Ok(p) => api
                        .patch(
                            &m.name,
                            &PatchParams {
                                field_manager: Some(FIELD_MANAGER.into()),
                                ..Default::default()
                            },
                            &Patch::Json::<()>(p),
                        )
                        .await
                        .map_or_else(gone_or, |_| Ok(())),
                    Err(e) => Err(format!("internal: the patch does not parse: {e}")),
                };
                let label = if m.annotations.is_empty() {
                    "its merge patch's claim on metadata.annotations".to_string()
                } else {
                    format!("annotations {}", keys(&m.annotations))
                };
                record(format!("{what}: {label}"), r);
            }
            if m.owns_status() {
                let body = decide::status_release_body(layout, &m.namespace, &m.name);
                let r = api
                    .patch_status(
                        &m.name,
                        &PatchParams::apply(FIELD_MANAGER),
                        &Patch::Apply(body),
                    )
                    .await
                    .map_or_else(
                        |e| match e {
                            kube::Error::Api(s) if s.code == 404 => Ok(()),
                            kube::Error::Api(s) if s.code == 422 => Err(format!(
                                "the API server refuses to release the shim's fields: an entry \
                                 another manager owns too would be left incomplete ({}); edit it \
                                 by hand: kubectl -n {} edit machines.cluster.x-k8s.io {} \
                                 --subresource=status",
                                s.message, m.namespace, m.name
                            )),
                            e => Err(explain("apply", &e)),
                        },
                        |_| Ok(()),
                    );
                record(format!("{what}: conditions {}", keys(&m.conditions)), r);
            }
        }
    }
    if mhc_entries {
        let r = resource("v1beta2", "MachineHealthCheck", "machinehealthchecks");
        for h in &s.mhcs {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &h.namespace, &r);
            let r = match serde_json::from_value::<json_patch::Patch>(h.patch.clone()) {
                Ok(p) => api
                    .patch(&h.name, &PatchParams::default(), &Patch::Json::<()>(p))
                    .await
                    .map_or_else(gone_or, |_| Ok(())),
                Err(e) => Err(format!("internal: the patch does not parse: {e}")),
            };
            record(
                format!(
                    "MachineHealthCheck {}/{}: its entries naming the condition",
                    h.namespace, h.name
                ),
                r,
            );
        }
    }
    out
}

/// A failed patch: fine when the object is gone since it was read (404: nothing of the
/// shim's is left on it), else what went wrong.
fn gone_or(e: kube::Error) -> Result<(), String> {
    match e {
        kube::Error::Api(s) if s.code == 404 => Ok(()),
        e => Err(changed_or(&e)),
    }
}

/// A failed `test` of a JSON patch is a 422: the object changed since it was read.
fn changed_or(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 422 => format!(
            "it changed since it was read, nothing was removed; run cleanup again ({})",
            s.message
        ),
        e => explain("patch", e),
    }
}

fn keys(owned: &[Owned]) -> String {
    owned
        .iter()
        .map(|o| o.key.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The command: lists (and with `--yes` removes); exit 0 when everything could be looked at
/// (and removed), 1 otherwise, 2 on bad flags.
pub async fn main(args: CleanupArgs) -> u8 {
    if args.remove_mhc_entries && !args.yes {
        eprintln!("--remove-mhc-entries changes the MachineHealthChecks: it needs --yes too");
        return 2;
    }
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cleanup needs the management cluster's API server (KUBECONFIG): {e}");
            return 1;
        }
    };
    let own = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let s = survey(&client, &args, &own).await;
    let running = decide::still_running(&s);
    if let (true, Some(why)) = (args.yes, &running) {
        print!("{}", render::render(&s, &args.condition_type, &own));
        eprintln!("{why}; nothing was removed");
        return 1;
    }
    let removal = if args.yes {
        Some(remove(&client, &s, args.remove_mhc_entries).await)
    } else {
        None
    };
    match args.output {
        OutputFormat::Json => {
            let v = serde_json::json!({"survey": s, "removal": removal});
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        OutputFormat::Table => {
            print!("{}", render::render(&s, &args.condition_type, &own));
            match &removal {
                Some(r) => print!("{}", render::render_removal(&r.removed, &r.failed)),
                None if s.count() > 0 => {
                    println!("Nothing was changed: run again with --yes to remove them.")
                }
                None if !s.mhcs.is_empty() => println!(
                    "Nothing was changed: the MHC entries go with --yes --remove-mhc-entries, or run the patch above."
                ),
                None => {}
            }
        }
    }
    let failed = removal.as_ref().is_some_and(|r| !r.failed.is_empty());
    if s.complete && !failed {
        0
    } else {
        1
    }
}
