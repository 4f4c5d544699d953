//! What `cleanup` counts as the shim's, read from the objects alone (pure; the I/O is
//! [`super`]'s):
//!
//! - on a Machine, only what `metadata.managedFields` says the field manager
//!   [`FIELD_MANAGER`] owns: its condition entries (its server-side apply on the `status`
//!   subresource) and its annotations (its merge patch on the Machine). An entry another
//!   manager owns too (CAPI's, an operator's) is listed as shared: releasing the shim's claim
//!   leaves it standing (or the API server refuses, when it would be left incomplete);
//! - on a MachineHealthCheck, the `unhealthyMachineConditions` entries naming the shim's
//!   condition type: the operator's object, so only a patch is proposed.
//!
//! And how each is removed: an apply of an empty conditions list (server-side apply then
//! deletes the fields only the shim owned), a JSON patch that tests before it removes. The
//! listing for people is [`super::render`].

use serde::Serialize;
use serde_json::{json, Map, Value};

use k8s_openapi::api::coordination::v1::LeaseSpec;

use crate::k8s::lease::{hold, Hold};
use capi_model::apis::ConditionLayout;
use capi_model::condition::FIELD_MANAGER;

/// What the shim's field manager owns on one Machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MachineFindings {
    pub namespace: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Condition entries its server-side apply on `status` owns.
    pub conditions: Vec<Owned>,
    /// Other fields it owns that `cleanup` releases: `status` fields of its apply (deleted
    /// unless another manager owns them too), the annotations map it created (kept).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_fields: Vec<String>,
    /// Annotations it set (by key, with the value now on the Machine).
    pub annotations: Vec<Owned>,
    /// Fields it owns that `cleanup` does not remove (none the shim writes today): named so
    /// that an operator sees them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// The managedFields entries (index, as read) of its merge patches that own nothing but
    /// annotations: dropped when the annotations are removed.
    #[serde(skip)]
    pub dropped_entries: Vec<(usize, Value)>,
    /// Whether a server-side apply of its own owns fields on `status` (to release).
    #[serde(skip)]
    pub status_applied: bool,
}

/// One condition entry (by type) or annotation (by key) the shim owns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Owned {
    pub key: String,
    /// The annotation's value (annotations only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Other managers owning it too (the condition entry itself, not only fields in it): it
    /// stays, with what they set, after the shim lets go.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<String>,
    /// Other managers owning only fields inside the condition entry (the API server may then
    /// refuse the release, as it would leave an incomplete entry: the command says so).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields_also_set_by: Vec<String>,
}

impl MachineFindings {
    /// Whether the shim owns anything on this Machine.
    pub fn is_empty(&self) -> bool {
        self.conditions.is_empty()
            && self.other_fields.is_empty()
            && self.annotations.is_empty()
            && self.kept.is_empty()
    }

    /// Whether the shim's apply on `status` owns anything (to release).
    pub fn owns_status(&self) -> bool {
        self.status_applied
    }
}

/// One `metadata.managedFields` entry, read tolerantly.
struct Entry<'a> {
    index: usize,
    raw: &'a Value,
    manager: &'a str,
    operation: &'a str,
    status: bool,
    api_version: &'a str,
    fields: &'a Value,
}

fn entries(machine: &Value) -> Vec<Entry<'_>> {
    let Some(list) = machine
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .filter_map(|(index, e)| {
            Some(Entry {
                index,
                raw: e,
                manager: e.get("manager")?.as_str()?,
                operation: e.get("operation").and_then(Value::as_str).unwrap_or(""),
                status: e.get("subresource").and_then(Value::as_str) == Some("status"),
                api_version: e.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                fields: e.get("fieldsV1").filter(|f| f.is_object())?,
            })
        })
        .collect()
}

/// Where a Machine of `api_version` keeps the metav1 conditions list, as fieldsV1 keys:
/// `status.v1beta2.conditions` in v1beta1, `status.conditions` from v1beta2 on.
pub fn conditions_path(api_version: &str) -> &'static [&'static str] {
    if api_version.ends_with("/v1beta1") {
        &["f:status", "f:v1beta2", "f:conditions"]
    } else {
        &["f:status", "f:conditions"]
    }
}

fn descend<'a>(fields: &'a Value, path: &[&str]) -> Option<&'a Map<String, Value>> {
    path.iter()
        .try_fold(fields, |node, key| node.get(*key))?
        .as_object()
}

/// The condition types whose entries `fields` (of a Machine of `api_version`) owns: the
/// `k:{"type":"…"}` keys of the conditions list.
pub fn condition_types(api_version: &str, fields: &Value) -> Vec<String> {
    let Some(list) = descend(fields, conditions_path(api_version)) else {
        return Vec::new();
    };
    list.keys()
        .filter_map(|k| k.strip_prefix("k:"))
        .filter_map(|k| serde_json::from_str::<Value>(k).ok())
        .filter_map(|k| k.get("type")?.as_str().map(str::to_string))
        .collect()
}

/// The condition types whose entries `fields` owns as such (the `.` of the entry, not only
/// fields in it): server-side apply keeps such an entry when another manager lets go of it.
pub fn condition_items(api_version: &str, fields: &Value) -> Vec<String> {
    let Some(list) = descend(fields, conditions_path(api_version)) else {
        return Vec::new();
    };
    list.iter()
        .filter(|(_, node)| node.get(".").is_some())
        .filter_map(|(k, _)| k.strip_prefix("k:"))
        .filter_map(|k| serde_json::from_str::<Value>(k).ok())
        .filter_map(|k| k.get("type")?.as_str().map(str::to_string))
        .collect()
}

/// The annotation keys `fields` owns.
pub fn annotation_keys(fields: &Value) -> Vec<String> {
    descend(fields, &["f:metadata", "f:annotations"])
        .map(|a| {
            a.keys()
                .filter_map(|k| k.strip_prefix("f:"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Every owned leaf of `fields` as a path of fieldsV1 keys.
pub fn leaves(fields: &Value) -> Vec<Vec<String>> {
    fn walk(node: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        let Some(map) = node.as_object() else { return };
        for (k, child) in map {
            if k == "." {
                continue;
            }
            prefix.push(k.clone());
            let inner = child
                .as_object()
                .is_some_and(|m| m.keys().any(|k| k != "."));
            if inner {
                walk(child, prefix, out);
            } else {
                out.push(prefix.clone());
            }
            prefix.pop();
        }
    }
    let mut out = Vec::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

/// A fieldsV1 path for people: `status.v1beta2.conditions[{"type":"X"}].reason`.
pub fn readable(path: &[String]) -> String {
    let mut out = String::new();
    for k in path {
        if let Some(f) = k.strip_prefix("f:") {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(f);
        } else {
            let inner = k.get(2..).unwrap_or(k);
            out.push_str(&format!("[{inner}]"));
        }
    }
    out
}

fn starts_with(path: &[String], prefix: &[&str]) -> bool {
    path.len() >= prefix.len() && path.iter().zip(prefix).all(|(a, b)| a == b)
}

/// What the shim's field manager owns on `machine` (a Machine as the API server sends it),
/// `None` when it owns nothing there.
pub fn machine_findings(machine: &Value) -> Option<MachineFindings> {
    let all = entries(machine);
    let theirs: Vec<&Entry<'_>> = all.iter().filter(|e| e.manager != FIELD_MANAGER).collect();
    // Who else owns it: the annotation key, the condition entry itself, or fields in the entry.
    #[derive(Clone, Copy, PartialEq)]
    enum Claim {
        Annotation,
        Entry,
        FieldsOnly,
    }
    let sharing = |key: &str, claim: Claim| -> Vec<String> {
        let mut who: Vec<String> = theirs
            .iter()
            .filter(|e| {
                let has = |list: Vec<String>| list.iter().any(|t| t == key);
                match claim {
                    Claim::Annotation => !e.status && has(annotation_keys(e.fields)),
                    Claim::Entry => has(condition_items(e.api_version, e.fields)),
                    Claim::FieldsOnly => {
                        has(condition_types(e.api_version, e.fields))
                            && !has(condition_items(e.api_version, e.fields))
                    }
                }
            })
            .map(|e| e.manager.to_string())
            .collect();
        who.sort();
        who.dedup();
        who
    };
    let meta = |p: &str| machine.pointer(p).and_then(Value::as_str);
    let mut f = MachineFindings {
        namespace: meta("/metadata/namespace").unwrap_or_default().to_string(),
        name: meta("/metadata/name").unwrap_or_default().to_string(),
        uid: meta("/metadata/uid").map(str::to_string),
        ..Default::default()
    };
    for e in all.iter().filter(|e| e.manager == FIELD_MANAGER) {
        if e.status && e.operation == "Apply" {
            // The status apply: all of it goes with an apply that claims nothing.
            f.status_applied = true;
            let conditions = conditions_path(e.api_version);
            for leaf in leaves(e.fields) {
                let in_conditions = starts_with(&leaf, conditions)
                    && leaf
                        .get(conditions.len())
                        .is_some_and(|k| k.starts_with("k:"));
                if !in_conditions {
                    f.other_fields.push(readable(&leaf));
                }
            }
            for t in condition_types(e.api_version, e.fields) {
                f.conditions.push(Owned {
                    shared_with: sharing(&t, Claim::Entry),
                    fields_also_set_by: sharing(&t, Claim::FieldsOnly),
                    key: t,
                    value: None,
                });
            }
            continue;
        }
        // An update (the annotation's merge patch): its annotations are removed and its
        // managedFields entry dropped, unless it owns something else.
        let mut only_annotations = !e.status;
        for leaf in leaves(e.fields) {
            let under_annotations =
                !e.status && starts_with(&leaf, &["f:metadata", "f:annotations"]);
            match (under_annotations, leaf.len()) {
                (true, 3) => {
                    let key = leaf[2].trim_start_matches("f:").to_string();
                    let value = machine
                        .pointer("/metadata/annotations")
                        .and_then(|a| a.get(&key))
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    f.annotations.push(Owned {
                        shared_with: sharing(&key, Claim::Annotation),
                        fields_also_set_by: Vec::new(),
                        key,
                        value,
                    });
                }
                // The annotations map itself (it created it): released, never removed.
                (true, 2) => f.other_fields.push(readable(&leaf)),
                _ => {
                    only_annotations = false;
                    f.kept.push(readable(&leaf));
                }
            }
        }
        if only_annotations {
            f.dropped_entries.push((e.index, e.raw.clone()));
        }
    }
    (!f.is_empty()).then_some(f)
}

/// The apply body that releases every `status` field the shim's apply owns: the conditions
/// list of `layout`, empty, by the same manager. Server-side apply then deletes what only the
/// shim owned and keeps what another manager (CAPI) owns too; the managedFields entry goes
/// with it (the API server converts between Machine versions when the entry is of another).
pub fn status_release_body(layout: ConditionLayout, namespace: &str, name: &str) -> Value {
    let status = match layout {
        ConditionLayout::V1Beta1WithV1Beta2Conditions => json!({"v1beta2": {"conditions": []}}),
        ConditionLayout::V1Beta2 => json!({"conditions": []}),
    };
    json!({
        "apiVersion": layout.api_version(),
        "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    })
}

/// `~` and `/` escaped for a JSON pointer (RFC 6901).
pub fn pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON patch that removes the shim's annotations from the Machine and drops the
/// managedFields entries of its merge patches (they would keep claiming the annotations map
/// it created). Each step only while it still holds what was read: the uid, every entry as it
/// was, every annotation's value; an annotation another manager owns too stays. `None` when
/// there is nothing to do.
pub fn metadata_removal(f: &MachineFindings) -> Option<Value> {
    let mut ops = Vec::new();
    if let Some(uid) = &f.uid {
        ops.push(json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    }
    let tests = ops.len();
    let mut dropped = f.dropped_entries.clone();
    dropped.sort_by_key(|d| std::cmp::Reverse(d.0)); // from the end: indexes stay valid
    for (i, entry) in dropped {
        let path = format!("/metadata/managedFields/{i}");
        ops.push(json!({"op": "test", "path": path, "value": entry}));
        ops.push(json!({"op": "remove", "path": path}));
    }
    for a in f.annotations.iter().filter(|a| a.shared_with.is_empty()) {
        let Some(value) = &a.value else { continue };
        let path = format!("/metadata/annotations/{}", pointer_escape(&a.key));
        ops.push(json!({"op": "test", "path": path, "value": value}));
        ops.push(json!({"op": "remove", "path": path}));
    }
    (ops.len() > tests).then_some(Value::Array(ops))
}

/// The Lease's holder while its hold is current (renewed within its duration at `now`).
pub fn current_holder(spec: Option<&LeaseSpec>, now: jiff::Timestamp) -> Option<String> {
    let holder = spec?.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    matches!(hold(spec, holder, now), Hold::Ours { .. }).then(|| holder.to_string())
}

/// Why `--yes` must wait: a shim that still holds its Lease would write again what is
/// removed. `None` when no Lease of the survey is held.
pub fn still_running(s: &super::Survey) -> Option<String> {
    s.objects.iter().find_map(|o| {
        let holder = o.held_by.as_deref()?;
        Some(format!(
            "the shim still runs: its Lease {}/{} is held by {holder}; uninstall it first (a stopped \
             shim releases its Lease, a killed one's expires within 15 s)",
            o.namespace, o.name
        ))
    })
}

/// A MachineHealthCheck listing the shim's condition type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MhcFinding {
    pub namespace: String,
    pub name: String,
    /// `machinehealthchecks.<version>.cluster.x-k8s.io`, for kubectl.
    pub resource: String,
    /// The list's JSON pointer in that version.
    pub pointer: String,
    /// The entries naming the shim's condition.
    pub entries: Vec<Value>,
    /// The JSON patch that removes them (and keeps the others): it tests the list first.
    pub patch: Value,
}

impl MhcFinding {
    /// The command an operator runs to remove the entries.
    pub fn kubectl(&self) -> String {
        // Single-quoted for a POSIX shell: a quote inside is closed, escaped and reopened.
        let patch = self.patch.to_string().replace('\'', r"'\''");
        format!(
            "kubectl -n {} patch {} {} --type json -p '{patch}'",
            self.namespace, self.resource, self.name
        )
    }
}

/// Where an MHC of `api_version` lists Machine conditions: v1beta2 under `spec.checks`,
/// v1beta1 (CAPI 1.13+) at `spec`.
pub fn mhc_pointer(api_version: &str) -> &'static str {
    if api_version.ends_with("/v1beta1") {
        "/spec/unhealthyMachineConditions"
    } else {
        "/spec/checks/unhealthyMachineConditions"
    }
}

/// The shim's entries on `mhc` (as the API server sends it), if it lists any.
pub fn mhc_finding(mhc: &Value, condition_type: &str) -> Option<MhcFinding> {
    let api_version = mhc.get("apiVersion")?.as_str()?;
    let pointer = mhc_pointer(api_version);
    let list = mhc.pointer(pointer)?.as_array()?;
    let ours = |e: &Value| e.get("type").and_then(Value::as_str) == Some(condition_type);
    let entries: Vec<Value> = list.iter().filter(|e| ours(e)).cloned().collect();
    if entries.is_empty() {
        return None;
    }
    let rest: Vec<Value> = list.iter().filter(|e| !ours(e)).cloned().collect();
    let change = if rest.is_empty() {
        json!({"op": "remove", "path": pointer})
    } else {
        json!({"op": "replace", "path": pointer, "value": rest})
    };
    let version = api_version.rsplit('/').next().unwrap_or(api_version);
    Some(MhcFinding {
        namespace: mhc.pointer("/metadata/namespace")?.as_str()?.to_string(),
        name: mhc.pointer("/metadata/name")?.as_str()?.to_string(),
        resource: format!("machinehealthchecks.{version}.cluster.x-k8s.io"),
        pointer: pointer.to_string(),
        entries,
        patch: json!([{"op": "test", "path": pointer, "value": list}, change]),
    })
}
