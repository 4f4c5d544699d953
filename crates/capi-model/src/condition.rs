//! The shim's condition on a Machine: its status and entry, reading it back from whichever
//! layout the served API uses, and the server-side-apply body that writes exactly one entry of
//! the metav1 map list (CAPI-owned entries are never part of the patch).

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use serde_with::{As, DefaultOnError};

use crate::apis::ConditionLayout;

/// The default condition type on the Machine.
pub const DEFAULT_CONDITION_TYPE: &str = "CloudStackVMHealthy";

/// The condition status the shim publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Status {
    /// Evidence of health.
    True,
    /// Evidence of failure: the Machine should be recycled.
    False,
    /// The shim cannot tell; must never cause a recycle.
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Machine condition as the shim publishes it (no Kubernetes types here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConditionState {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: Status,
    pub reason: String,
    pub message: String,
    #[serde(rename = "lastTransitionTime")]
    pub last_transition_time: Timestamp,
}

/// Kubernetes stores condition times with second precision; so does the shim, so that a
/// condition read back from the API server equals the one it computed.
pub fn whole_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// The field manager of every write the shim makes.
pub const FIELD_MANAGER: &str = "capc-health-shim";

/// One entry of a conditions list as the API server sends it, every field optional and read
/// tolerantly: a field of another shape reads as absent, so an odd entry never makes its
/// Machine unreadable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConditionEntry {
    #[serde(rename = "type", with = "As::<DefaultOnError>")]
    pub type_: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub status: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub reason: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub message: Option<String>,
    #[serde(with = "As::<DefaultOnError>")]
    pub last_transition_time: Option<String>,
}

/// The shim's condition among `entries` (the list the served layout keeps it in), if it is
/// there and readable: a known status and a time.
pub fn find(entries: &[ConditionEntry], condition_type: &str) -> Option<ConditionState> {
    let c = entries
        .iter()
        .find(|c| c.type_.as_deref() == Some(condition_type))?;
    let status = match c.status.as_deref()? {
        "True" => Status::True,
        "False" => Status::False,
        "Unknown" => Status::Unknown,
        _ => return None,
    };
    Some(ConditionState {
        type_: condition_type.to_string(),
        status,
        reason: c.reason.clone().unwrap_or_default(),
        message: c.message.clone().unwrap_or_default(),
        last_transition_time: c.last_transition_time.as_deref()?.parse().ok()?,
    })
}

/// [`find`] over a Machine held as JSON: our condition in the list where `layout` keeps it.
pub fn read(
    machine: &Value,
    layout: ConditionLayout,
    condition_type: &str,
) -> Option<ConditionState> {
    let entries: Vec<ConditionEntry> = machine
        .pointer(layout.conditions_pointer())?
        .as_array()?
        .iter()
        .filter_map(|e| ConditionEntry::deserialize(e).ok())
        .collect();
    find(&entries, condition_type)
}

/// The SSA body for the Machine's `status` subresource carrying only our condition. It names
/// no `metadata.uid`: kube-apiserver does not check it on a custom resource's `status`
/// subresource (its status strategy keeps the stored metadata; seen on v1.34), so the shim's
/// writer checks the Machine's uid itself right before sending (`controller::writer`).
pub fn apply_body(
    layout: ConditionLayout,
    namespace: &str,
    name: &str,
    condition: &ConditionState,
) -> Value {
    let entry = json!({
        "type": condition.type_,
        "status": condition.status.as_str(),
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": whole_seconds(condition.last_transition_time).to_string(),
    });
    let status = match layout {
        ConditionLayout::V1Beta1WithV1Beta2Conditions => {
            json!({"v1beta2": {"conditions": [entry]}})
        }
        ConditionLayout::V1Beta2 => json!({"conditions": [entry]}),
    };
    json!({
        "apiVersion": layout.api_version(),
        "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apply_body_holds_only_our_entry_in_the_right_place() {
        let now: Timestamp = "2026-11-30T06:00:00.123Z".parse().unwrap();
        let c = ConditionState {
            type_: DEFAULT_CONDITION_TYPE.into(),
            status: Status::False,
            reason: "VMError".into(),
            message: "e".into(),
            last_transition_time: now,
        };
        let b = apply_body(ConditionLayout::V1Beta1WithV1Beta2Conditions, "ns", "m", &c);
        assert_eq!(b["apiVersion"], "cluster.x-k8s.io/v1beta1");
        let list = b
            .pointer("/status/v1beta2/conditions")
            .unwrap()
            .as_array()
            .unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["lastTransitionTime"], "2026-11-30T06:00:00Z");
        assert!(
            b.pointer("/status/conditions").is_none(),
            "never the atomic legacy list"
        );
        let b = apply_body(ConditionLayout::V1Beta2, "ns", "m", &c);
        assert_eq!(b.pointer("/status/conditions/0/reason").unwrap(), "VMError");
        assert_eq!(b["metadata"], json!({"name": "m", "namespace": "ns"}));
    }

    #[test]
    fn reading_back_finds_our_entry_among_capis() {
        let entries: Vec<ConditionEntry> = serde_json::from_value(json!([
            {"type": "Ready", "status": "False", "reason": "X", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "CloudStackVMHealthy", "status": "True", "reason": "VMHealthy", "message": "ok",
             "lastTransitionTime": "2026-01-02T00:00:00Z"}]))
        .unwrap();
        let c = find(&entries, "CloudStackVMHealthy").unwrap();
        assert_eq!((c.status, c.reason.as_str()), (Status::True, "VMHealthy"));
        assert_eq!(c.last_transition_time.to_string(), "2026-01-02T00:00:00Z");
        assert!(find(&entries[..1], "CloudStackVMHealthy").is_none());
        let read = |v: Value| find(&[serde_json::from_value(v).unwrap()], "CloudStackVMHealthy");
        assert!(read(json!({"type": "CloudStackVMHealthy", "status": "Maybe"})).is_none());
        assert!(
            read(json!({"type": "CloudStackVMHealthy", "status": "False"})).is_none(),
            "no time, no condition"
        );
        // A reason or message of another shape reads as empty, the rest stands.
        let odd = read(
            json!({"type": "CloudStackVMHealthy", "status": "False", "reason": 7,
            "message": {"x": 1}, "lastTransitionTime": "2026-01-02T00:00:00Z"}),
        )
        .unwrap();
        assert_eq!(
            (odd.status, odd.reason.as_str(), odd.message.as_str()),
            (Status::False, "", "")
        );
    }
}
