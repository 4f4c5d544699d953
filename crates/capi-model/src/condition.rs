//! The shim's condition on a Machine: its status and entry, reading it back from whichever
//! layout the served API uses, and the server-side-apply body that writes exactly one entry of
//! the metav1 map list (CAPI-owned entries are never part of the patch).

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

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

/// The shim's condition as currently published on `machine`, if it is there and readable.
pub fn read(
    machine: &Value,
    layout: ConditionLayout,
    condition_type: &str,
) -> Option<ConditionState> {
    let list = machine.pointer(layout.conditions_pointer())?.as_array()?;
    let c = list
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(condition_type))?;
    let status = match c.get("status").and_then(Value::as_str)? {
        "True" => Status::True,
        "False" => Status::False,
        "Unknown" => Status::Unknown,
        _ => return None,
    };
    let last_transition_time = c
        .get("lastTransitionTime")
        .and_then(Value::as_str)?
        .parse::<jiff::Timestamp>()
        .ok()?;
    Some(ConditionState {
        type_: condition_type.to_string(),
        status,
        reason: c
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        message: c
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        last_transition_time,
    })
}

/// The SSA body for the Machine's `status` subresource carrying only our condition.
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
    }

    #[test]
    fn reading_back_finds_our_entry_among_capis() {
        let m = json!({"status": {"v1beta2": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "X", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "CloudStackVMHealthy", "status": "True", "reason": "VMHealthy", "message": "ok",
             "lastTransitionTime": "2026-01-02T00:00:00Z"}]}}});
        let c = read(
            &m,
            ConditionLayout::V1Beta1WithV1Beta2Conditions,
            "CloudStackVMHealthy",
        )
        .unwrap();
        assert_eq!((c.status, c.reason.as_str()), (Status::True, "VMHealthy"));
        assert_eq!(c.last_transition_time.to_string(), "2026-01-02T00:00:00Z");
        assert!(read(&m, ConditionLayout::V1Beta2, "CloudStackVMHealthy").is_none());
        let broken =
            json!({"status": {"conditions": [{"type": "CloudStackVMHealthy", "status": "Maybe"}]}});
        assert!(read(&broken, ConditionLayout::V1Beta2, "CloudStackVMHealthy").is_none());
    }
}
