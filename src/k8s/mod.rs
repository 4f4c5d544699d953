//! The Kubernetes side's rules, pure: Machines, CloudStackMachines and conditions. The
//! CloudStack side and the verdict engine stay free of Kubernetes types and meet them only
//! through this module; the controller's Kubernetes I/O is `crate::controller::kube_io`.
//!
//! - [`capi`] (from the `verdict` crate): served API versions → write layout and remediation mode.
//! - [`objects`]: tolerant views of Machines, MHC selection, Node matching (NodeNotLinked).
//! - [`conditions`] (from the `verdict` crate): reading our condition back; the
//!   server-side-apply body for one entry.
//! - [`escalation`]: the remediate-machine annotation and its guards.
//! - [`kubeconfig`]: which workload kubeconfigs the NodeNotLinked lookup may use.
//! - [`lease`]: whether the leader's hold on its Lease still stands.
//! - [`watched`]: what the watches keep of each object (the facts read, as records).

pub mod escalation;
pub mod kubeconfig;
pub mod lease;
pub mod objects;
pub mod watched;

pub use verdict::capi;
pub use verdict::machine_condition as conditions;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::verdict::ConditionState;

/// The shim's condition as a `metav1.Condition` (the map-list entry CAPI's v1beta2
/// conditions use). `observed_generation` is the Machine's generation when known.
pub fn to_metav1_condition(c: &ConditionState, observed_generation: Option<i64>) -> Condition {
    Condition {
        type_: c.type_.clone(),
        status: c.status.as_str().to_string(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        last_transition_time: Time(c.last_transition_time),
        observed_generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::condition::{next_condition, DEFAULT_CONDITION_TYPE};
    use crate::verdict::{reason, Status, Verdict};

    #[test]
    fn a_condition_serialises_as_metav1_with_rfc3339_time() {
        let now: jiff::Timestamp = "2026-11-30T05:00:00Z".parse().unwrap();
        let v = Verdict::new(Status::False, reason::GUEST_NETWORK_SILENT, "flat");
        let c = to_metav1_condition(
            &next_condition(None, DEFAULT_CONDITION_TYPE, &v, now),
            Some(3),
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["type"], "CloudStackVMHealthy");
        assert_eq!(json["status"], "False");
        assert_eq!(json["reason"], "GuestNetworkSilent");
        assert_eq!(json["lastTransitionTime"], "2026-11-30T05:00:00Z");
        assert_eq!(json["observedGeneration"], 3);
    }
}
