use serde_json::{json, Value};

use super::decide::*;
use super::render::render;
use super::{OwnObject, Survey};
use capi_model::apis::ConditionLayout;

/// `ops` (a JSON patch) applied to `doc` as the API server would.
fn apply(doc: &mut Value, ops: &Value) -> Result<(), json_patch::PatchError> {
    let p: json_patch::Patch = serde_json::from_value(ops.clone()).expect("a JSON patch");
    json_patch::patch(doc, &p)
}

const REMEDIATE: &str = "cluster.x-k8s.io/remediate-machine";

fn entry(manager: &str, op: &str, status: bool, version: &str, fields: Value) -> Value {
    let mut e = json!({"manager": manager, "operation": op, "apiVersion": format!("cluster.x-k8s.io/{version}"),
        "fieldsType": "FieldsV1", "fieldsV1": fields, "time": "2026-12-06T03:00:00Z"});
    if status {
        e["subresource"] = json!("status");
    }
    e
}

fn condition_fields(path: &[&str], types: &[&str]) -> Value {
    let mut list = serde_json::Map::new();
    for t in types {
        list.insert(
            format!("k:{{\"type\":\"{t}\"}}"),
            json!({".": {}, "f:type": {}, "f:status": {}, "f:reason": {}}),
        );
    }
    path.iter()
        .rev()
        .fold(Value::Object(list), |inner, k| json!({ *k: inner }))
}

fn annotation_fields(keys: &[&str]) -> Value {
    let mut a = serde_json::Map::from_iter([(".".to_string(), json!({}))]);
    for k in keys {
        a.insert(format!("f:{k}"), json!({}));
    }
    json!({"f:metadata": {"f:annotations": a}})
}

/// A v1beta2 Machine as the shim leaves it in annotate mode, with CAPI's entry and another
/// manager's annotation beside the shim's.
fn machine() -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m1", "namespace": "ns", "uid": "u-1",
            "annotations": {REMEDIATE: "capc-health-shim: VMError", "keep": "1"},
            "managedFields": [
                entry("capi", "Apply", false, "v1beta2", json!({"f:spec": {"f:clusterName": {}}})),
                entry("capc-health-shim", "Apply", true, "v1beta2",
                    condition_fields(&["f:status", "f:conditions"], &["CloudStackVMHealthy"])),
                entry("manager", "Update", true, "v1beta2",
                    condition_fields(&["f:status", "f:conditions"], &["Ready"])),
                entry("capc-health-shim", "Update", false, "v1beta2", annotation_fields(&[REMEDIATE])),
                entry("kubectl", "Update", false, "v1beta2", json!({"f:metadata": {"f:annotations": {"f:keep": {}}}})),
            ]},
        "status": {"conditions": [{"type": "CloudStackVMHealthy"}, {"type": "Ready"}]}})
}

#[test]
fn only_what_the_shims_manager_owns_is_the_shims() {
    let f = machine_findings(&machine()).expect("the shim owns something");
    assert_eq!((f.namespace.as_str(), f.name.as_str()), ("ns", "m1"));
    let types: Vec<_> = f.conditions.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(types, ["CloudStackVMHealthy"], "never CAPI's Ready");
    assert!(f.conditions[0].shared_with.is_empty());
    assert_eq!(f.annotations.len(), 1, "never kubectl's `keep`");
    assert_eq!(f.annotations[0].key, REMEDIATE);
    assert_eq!(
        f.annotations[0].value.as_deref(),
        Some("capc-health-shim: VMError")
    );
    assert!(f.owns_status());
    assert!(f.other_fields.is_empty() && f.kept.is_empty(), "{f:?}");
    assert_eq!(
        f.dropped_entries.iter().map(|e| e.0).collect::<Vec<_>>(),
        [3]
    );
}

#[test]
fn a_machine_without_the_shims_manager_is_not_listed_whatever_it_carries() {
    let mut m = machine();
    // The same condition type and annotation, but set by others.
    let fields = m["metadata"]["managedFields"].as_array_mut().unwrap();
    fields.retain(|e| e["manager"] != "capc-health-shim");
    fields.push(entry(
        "operator",
        "Update",
        true,
        "v1beta2",
        condition_fields(&["f:status", "f:conditions"], &["CloudStackVMHealthy"]),
    ));
    fields.push(entry(
        "kubectl-annotate",
        "Update",
        false,
        "v1beta2",
        annotation_fields(&[REMEDIATE]),
    ));
    assert_eq!(machine_findings(&m), None);
}

#[test]
fn v1beta1_entries_are_read_where_v1beta1_keeps_the_conditions() {
    let m = json!({"metadata": {"name": "m", "namespace": "ns", "managedFields": [
        entry("capc-health-shim", "Apply", true, "v1beta1",
            condition_fields(&["f:status", "f:v1beta2", "f:conditions"], &["CloudStackVMHealthy", "OldType"])),
        // CAPI's legacy (atomic) list and its v1beta2 list.
        entry("manager", "Update", true, "v1beta1", json!({"f:status": {"f:conditions": {}, "f:v1beta2": {"f:conditions": {
            "k:{\"type\":\"Ready\"}": {".": {}, "f:type": {}}}}}})),
    ]}});
    let f = machine_findings(&m).unwrap();
    let types: Vec<_> = f.conditions.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(
        types,
        ["CloudStackVMHealthy", "OldType"],
        "an earlier --condition-type too"
    );
    assert!(f.other_fields.is_empty(), "{f:?}");
    assert_eq!(
        conditions_path("cluster.x-k8s.io/v1beta1"),
        ["f:status", "f:v1beta2", "f:conditions"]
    );
    assert_eq!(
        conditions_path("cluster.x-k8s.io/v1beta2"),
        ["f:status", "f:conditions"]
    );
}

#[test]
fn an_entry_another_manager_owns_too_is_shared_and_its_annotation_stays() {
    let mut m = machine();
    let fields = m["metadata"]["managedFields"].as_array_mut().unwrap();
    fields.push(entry(
        "manager",
        "Update",
        true,
        "v1beta2",
        condition_fields(&["f:status", "f:conditions"], &["CloudStackVMHealthy"]),
    ));
    fields.push(entry(
        "operator",
        "Update",
        false,
        "v1beta2",
        annotation_fields(&[REMEDIATE]),
    ));
    fields.push(entry(
        "capi-fields",
        "Update",
        true,
        "v1beta2",
        json!({"f:status": {"f:conditions": {"k:{\"type\":\"CloudStackVMHealthy\"}": {"f:message": {}}}}}),
    ));
    let f = machine_findings(&m).unwrap();
    assert_eq!(
        f.conditions[0].shared_with,
        ["manager"],
        "owns the entry itself"
    );
    assert_eq!(
        f.conditions[0].fields_also_set_by,
        ["capi-fields"],
        "owns a field in it only"
    );
    let cell = render(
        &Survey {
            machines: vec![f.clone()],
            ..Default::default()
        },
        "CloudStackVMHealthy",
        "shim",
    );
    assert!(
        cell.contains("also owned by manager: stays as manager set it")
            && cell.contains("fields also set by capi-fields"),
        "{cell}"
    );
    assert_eq!(f.annotations[0].shared_with, ["operator"]);
    // The shim's entry is dropped (its claim released), the shared annotation is not removed.
    let ops = metadata_removal(&f).unwrap();
    assert!(
        ops.as_array().unwrap().iter().all(|op| !op["path"]
            .as_str()
            .unwrap()
            .starts_with("/metadata/annotations")),
        "{ops}"
    );
    let mut patched = m.clone();
    apply(&mut patched, &ops).unwrap();
    assert_eq!(
        patched["metadata"]["annotations"][REMEDIATE],
        "capc-health-shim: VMError"
    );
}

#[test]
fn the_metadata_patch_removes_the_annotation_and_the_shims_entry_only_as_read() {
    let m = machine();
    let f = machine_findings(&m).unwrap();
    let ops = metadata_removal(&f).unwrap();
    assert_eq!(
        ops[0],
        json!({"op": "test", "path": "/metadata/uid", "value": "u-1"})
    );
    assert!(
        ops.to_string()
            .contains("/metadata/annotations/cluster.x-k8s.io~1remediate-machine"),
        "{ops}"
    );
    let mut patched = m.clone();
    apply(&mut patched, &ops.clone()).unwrap();
    assert_eq!(patched["metadata"]["annotations"], json!({"keep": "1"}));
    let managers: Vec<_> = patched["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["manager"].as_str().unwrap(),
                e["operation"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        managers,
        [
            ("capi", "Apply"),
            ("capc-health-shim", "Apply"),
            ("manager", "Update"),
            ("kubectl", "Update")
        ],
        "the status apply goes by apply, not by surgery"
    );
    // Changed since read (another value, another Machine): the patch tests fail, nothing goes.
    for (pointer, value) in [
        (
            format!("/metadata/annotations/{}", pointer_escape(REMEDIATE)),
            json!("x"),
        ),
        ("/metadata/uid".to_string(), json!("u-2")),
    ] {
        let mut changed = m.clone();
        *changed.pointer_mut(&pointer).unwrap() = value;
        let before = changed.clone();
        assert!(apply(&mut changed, &ops.clone()).is_err());
        assert_eq!(changed, before, "{pointer}");
    }
    assert_eq!(pointer_escape("a~b/c"), "a~0b~1c");
}

#[test]
fn entries_dropped_from_the_end_and_fields_it_does_not_write_are_kept() {
    let mut m = machine();
    let fields = m["metadata"]["managedFields"].as_array_mut().unwrap();
    // Two update entries (one per Machine version), the second also owning a label.
    fields.push(entry(
        "capc-health-shim",
        "Update",
        false,
        "v1beta1",
        json!({"f:metadata": {"f:annotations": {"f:other": {}}, "f:labels": {"f:x": {}}}}),
    ));
    m["metadata"]["annotations"]["other"] = json!("o");
    let f = machine_findings(&m).unwrap();
    assert_eq!(f.kept, ["metadata.labels.x"]);
    assert_eq!(
        f.dropped_entries.iter().map(|e| e.0).collect::<Vec<_>>(),
        [3],
        "the entry owning a label is not dropped"
    );
    let ops = metadata_removal(&f).unwrap();
    let mut patched = m.clone();
    apply(&mut patched, &ops).unwrap();
    assert_eq!(patched["metadata"]["annotations"], json!({"keep": "1"}));
    assert_eq!(
        patched["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["manager"] == "capc-health-shim")
            .count(),
        2
    );
}

#[test]
fn odd_managed_fields_never_panic_and_count_for_nothing() {
    for odd in [
        json!({}),
        json!({"metadata": {"managedFields": "x"}}),
        json!({"metadata": {"managedFields": [1, null, {"manager": 3}, {"manager": "capc-health-shim"},
            {"manager": "capc-health-shim", "fieldsV1": "f:status"}]}}),
        json!({"metadata": {"managedFields": [{"manager": "capc-health-shim", "operation": "Apply",
            "subresource": "status", "fieldsV1": {"f:status": {"f:conditions": {"k:not json": {}, "k:{\"x\":1}": {}}}}}]}}),
    ] {
        let f = machine_findings(&odd);
        assert!(
            f.as_ref().is_none_or(|f| f.conditions.is_empty()),
            "{odd}: {f:?}"
        );
    }
    assert_eq!(
        readable(&[
            "f:status".into(),
            "f:conditions".into(),
            "k:{\"type\":\"X\"}".into(),
            "f:reason".into()
        ]),
        "status.conditions[{\"type\":\"X\"}].reason"
    );
}

#[test]
fn the_status_release_is_an_empty_list_where_the_layout_keeps_conditions() {
    let b = status_release_body(ConditionLayout::V1Beta1WithV1Beta2Conditions, "ns", "m");
    assert_eq!(b["apiVersion"], "cluster.x-k8s.io/v1beta1");
    assert_eq!(b.pointer("/status/v1beta2/conditions"), Some(&json!([])));
    let b = status_release_body(ConditionLayout::V1Beta2, "ns", "m");
    assert_eq!(b.pointer("/status/conditions"), Some(&json!([])));
    assert_eq!(b["metadata"], json!({"name": "m", "namespace": "ns"}));
}

fn mhc(version: &str, list: Value) -> Value {
    let mut m = json!({"apiVersion": format!("cluster.x-k8s.io/{version}"), "kind": "MachineHealthCheck",
        "metadata": {"name": "c1-mhc", "namespace": "ns"}, "spec": {"clusterName": "c1"}});
    *m.pointer_mut("/spec").unwrap() = if version == "v1beta1" {
        json!({"clusterName": "c1", "unhealthyMachineConditions": list})
    } else {
        json!({"clusterName": "c1", "checks": {"unhealthyMachineConditions": list}})
    };
    m
}

#[test]
fn mhc_entries_naming_the_condition_get_a_patch_keeping_the_others() {
    let other = json!({"type": "Other", "status": "False", "timeoutSeconds": 5});
    let ours = json!({"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 0});
    let m = mhc("v1beta2", json!([other, ours]));
    let h = mhc_finding(&m, "CloudStackVMHealthy").unwrap();
    assert_eq!(h.entries, std::slice::from_ref(&ours));
    assert_eq!(h.resource, "machinehealthchecks.v1beta2.cluster.x-k8s.io");
    let mut patched = m.clone();
    apply(&mut patched, &h.patch.clone()).unwrap();
    assert_eq!(
        patched["spec"]["checks"]["unhealthyMachineConditions"],
        json!([other])
    );
    assert!(
        h.kubectl()
            .starts_with("kubectl -n ns patch machinehealthchecks.v1beta2.cluster.x-k8s.io c1-mhc --type json -p '[{"),
        "{}",
        h.kubectl()
    );
    // A quote in an entry stays inside the shell's single quotes.
    let quoted = mhc(
        "v1beta2",
        json!([ours, {"type": "It's", "status": "False"}]),
    );
    let line = mhc_finding(&quoted, "CloudStackVMHealthy")
        .unwrap()
        .kubectl();
    assert!(line.contains(r#""It'\''s""#), "{line}");
    // Only ours: the list goes; v1beta1 (CAPI 1.13) keeps it at spec.
    let m = mhc("v1beta1", json!([ours]));
    let h = mhc_finding(&m, "CloudStackVMHealthy").unwrap();
    let mut patched = m.clone();
    apply(&mut patched, &h.patch).unwrap();
    assert_eq!(patched["spec"], json!({"clusterName": "c1"}));
    // Changed since read: the test fails.
    let mut changed = mhc("v1beta2", json!([ours, other]));
    let h = mhc_finding(&mhc("v1beta2", json!([other, ours])), "CloudStackVMHealthy").unwrap();
    assert!(apply(&mut changed, &h.patch).is_err());
    // Nothing of ours, or nothing readable: nothing listed.
    assert!(mhc_finding(&mhc("v1beta2", json!([other])), "CloudStackVMHealthy").is_none());
    assert!(mhc_finding(&mhc("v1beta2", json!("x")), "CloudStackVMHealthy").is_none());
    assert!(mhc_finding(&json!({"apiVersion": 1}), "CloudStackVMHealthy").is_none());
}

#[test]
fn the_listing_names_each_thing_and_counts_them() {
    let s = Survey {
        objects: vec![OwnObject {
            kind: "Lease",
            namespace: "shim".into(),
            name: "capc-health-shim".into(),
            uid: None,
            held_by: None,
        }],
        machines: vec![machine_findings(&machine()).unwrap()],
        mhcs: vec![mhc_finding(
            &mhc(
                "v1beta2",
                json!([{"type": "CloudStackVMHealthy", "status": "False"}]),
            ),
            "CloudStackVMHealthy",
        )
        .unwrap()],
        notes: vec!["a hint".into()],
        complete: true,
        layout: Some(ConditionLayout::V1Beta2),
    };
    let out = render(&s, "CloudStackVMHealthy", "shim");
    for want in [
        "Lease      shim/capc-health-shim",
        "ns/m1",
        REMEDIATE,
        "kubectl -n ns patch machinehealthchecks.v1beta2.cluster.x-k8s.io c1-mhc",
        "a hint",
        "TOTAL: 1 object(s), 1 condition entry and 1 annotation(s) (+0 other field(s)) on 1 Machine(s), 1 MachineHealthCheck entry in 1 MachineHealthCheck(s)",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    assert!(!out.contains("INCOMPLETE"));
    assert!(!out.contains("keep"), "not the shim's annotation:\n{out}");
    assert_eq!(s.count(), 3);
    let empty = render(&Survey::default(), "X", "shim");
    assert_eq!(empty.matches("  none\n").count(), 3, "{empty}");
    assert!(
        empty.contains("INCOMPLETE"),
        "a default survey is not complete"
    );
}

#[test]
fn a_lease_renewed_within_its_duration_means_the_shim_still_runs() {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let now: jiff::Timestamp = "2026-12-06T03:00:00Z".parse().unwrap();
    let spec = |holder: Option<&str>, renewed_secs_ago: i64| LeaseSpec {
        holder_identity: holder.map(str::to_string),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(
            now - jiff::SignedDuration::from_secs(renewed_secs_ago),
        )),
        ..Default::default()
    };
    assert_eq!(
        current_holder(Some(&spec(Some("pod-a"), 5)), now).as_deref(),
        Some("pod-a")
    );
    assert_eq!(
        current_holder(Some(&spec(Some("pod-a"), 20)), now),
        None,
        "expired"
    );
    assert_eq!(current_holder(Some(&spec(None, 1)), now), None, "released");
    assert_eq!(current_holder(Some(&spec(Some(""), 1)), now), None);
    assert_eq!(current_holder(None, now), None);
    let mut s = Survey::default();
    assert_eq!(still_running(&s), None);
    s.objects.push(OwnObject {
        kind: "Lease",
        namespace: "shim".into(),
        name: "capc-health-shim".into(),
        uid: None,
        held_by: Some("pod-a".into()),
    });
    assert!(still_running(&s).unwrap().contains("held by pod-a"));
    assert!(render(&s, "X", "shim").contains("the shim still runs"));
}
