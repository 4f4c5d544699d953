//! What the management cluster serves, and what follows from it: which API version the shim
//! writes Machines through, where the condition goes, and the remediation mode (product.md §5).

use std::fmt;

use thiserror::Error;

/// How the shim gets a `False` Machine recycled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// CAPI 1.7–1.11: after the escalation delay, set `cluster.x-k8s.io/remediate-machine`.
    Annotate,
    /// CAPI 1.12+: publish the condition; the operator's MHC lists it under
    /// `unhealthyMachineConditions`. Detected (auto), a Machine whose MHCs do not list it is
    /// annotated as in `Annotate` (`coverage::annotates` of the shim).
    Condition,
    /// Publish only.
    Observe,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Annotate => "annotate",
            Mode::Condition => "condition",
            Mode::Observe => "observe",
        })
    }
}

/// Where the metav1 condition list lives for the Machine API version the shim writes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConditionLayout {
    /// `cluster.x-k8s.io/v1beta1` Machine: `status.v1beta2.conditions` (CAPI 1.9–1.10).
    V1Beta1WithV1Beta2Conditions,
    /// `cluster.x-k8s.io/v1beta2` Machine: `status.conditions` (CAPI 1.11+).
    V1Beta2,
}

impl ConditionLayout {
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1Beta1WithV1Beta2Conditions => "cluster.x-k8s.io/v1beta1",
            Self::V1Beta2 => "cluster.x-k8s.io/v1beta2",
        }
    }

    /// JSON pointer of the metav1 condition list in a Machine of this version.
    pub fn conditions_pointer(self) -> &'static str {
        match self {
            Self::V1Beta1WithV1Beta2Conditions => "/status/v1beta2/conditions",
            Self::V1Beta2 => "/status/conditions",
        }
    }
}

/// The versions served for each kind the shim reads, as discovery found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServedApis {
    pub machine: Vec<String>,
    pub cluster: Vec<String>,
    pub machine_health_check: Vec<String>,
    /// The MHC schema has `unhealthyMachineConditions` (CAPI 1.12+).
    pub mhc_unhealthy_machine_conditions: bool,
    pub cloudstack_machine: Vec<String>,
    pub cloudstack_failure_domain: Vec<String>,
}

/// The outcome of discovery.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApiChoice {
    pub mode: Mode,
    /// `auto` when detected, `forced` when the flag decided.
    pub mode_source: String,
    pub layout: ConditionLayout,
    pub cluster_version: String,
    pub mhc_version: String,
    pub cloudstack_machine_version: String,
    pub cloudstack_failure_domain_version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DiscoveryError {
    #[error("the Cluster API {kind} API (group cluster.x-k8s.io, v1beta1 or v1beta2) is not served: is Cluster API installed in this cluster?")]
    CapiMissing { kind: &'static str },
    #[error("the CAPC {kind} API (group infrastructure.cluster.x-k8s.io, v1beta3 or v1beta2) is not served: is the CloudStack provider (CAPC) installed?")]
    CapcMissing { kind: &'static str },
    #[error("--mode=condition needs a MachineHealthCheck with unhealthyMachineConditions (Cluster API 1.12+); this cluster's MHC has none — use --mode=annotate or observe")]
    ConditionModeUnsupported,
}

fn pick(served: &[String], preference: &[&str]) -> Option<String> {
    preference
        .iter()
        .find(|v| served.iter().any(|s| s == *v))
        .map(|v| v.to_string())
}

/// Decides the mode and versions from what is served; `forced` is the `--mode` flag.
pub fn choose(served: &ServedApis, forced: Option<Mode>) -> Result<ApiChoice, DiscoveryError> {
    let layout = if served.machine.iter().any(|v| v == "v1beta2") {
        ConditionLayout::V1Beta2
    } else if served.machine.iter().any(|v| v == "v1beta1") {
        ConditionLayout::V1Beta1WithV1Beta2Conditions
    } else {
        return Err(DiscoveryError::CapiMissing { kind: "Machine" });
    };
    let capi = ["v1beta2", "v1beta1"];
    let cluster_version =
        pick(&served.cluster, &capi).ok_or(DiscoveryError::CapiMissing { kind: "Cluster" })?;
    let mhc_version =
        pick(&served.machine_health_check, &capi).ok_or(DiscoveryError::CapiMissing {
            kind: "MachineHealthCheck",
        })?;
    let capc = ["v1beta3", "v1beta2"];
    let cloudstack_machine_version =
        pick(&served.cloudstack_machine, &capc).ok_or(DiscoveryError::CapcMissing {
            kind: "CloudStackMachine",
        })?;
    let cloudstack_failure_domain_version =
        pick(&served.cloudstack_failure_domain, &capc).ok_or(DiscoveryError::CapcMissing {
            kind: "CloudStackFailureDomain",
        })?;
    let detected = if served.mhc_unhealthy_machine_conditions {
        Mode::Condition
    } else {
        Mode::Annotate
    };
    let (mode, mode_source) = match forced {
        Some(Mode::Condition) if !served.mhc_unhealthy_machine_conditions => {
            return Err(DiscoveryError::ConditionModeUnsupported)
        }
        Some(m) => (m, "forced".to_string()),
        None => (detected, "auto".to_string()),
    };
    Ok(ApiChoice {
        mode,
        mode_source,
        layout,
        cluster_version,
        mhc_version,
        cloudstack_machine_version,
        cloudstack_failure_domain_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn capi_1_9() -> ServedApis {
        ServedApis {
            machine: v(&["v1beta1"]),
            cluster: v(&["v1beta1"]),
            machine_health_check: v(&["v1beta1"]),
            mhc_unhealthy_machine_conditions: false,
            cloudstack_machine: v(&["v1beta1", "v1beta2", "v1beta3"]),
            cloudstack_failure_domain: v(&["v1beta2", "v1beta3"]),
        }
    }

    #[test]
    fn capi_1_9_is_annotate_mode_through_v1beta1() {
        let c = choose(&capi_1_9(), None).unwrap();
        assert_eq!(c.mode, Mode::Annotate);
        assert_eq!(c.mode_source, "auto");
        assert_eq!(c.layout, ConditionLayout::V1Beta1WithV1Beta2Conditions);
        assert_eq!(c.layout.conditions_pointer(), "/status/v1beta2/conditions");
        assert_eq!(c.cloudstack_machine_version, "v1beta3");
        assert_eq!(c.cloudstack_failure_domain_version, "v1beta3");
    }

    #[test]
    fn capi_1_11_writes_v1beta2_but_still_annotates() {
        let mut s = capi_1_9();
        s.machine = v(&["v1beta1", "v1beta2"]);
        let c = choose(&s, None).unwrap();
        assert_eq!(
            (c.mode, c.layout),
            (Mode::Annotate, ConditionLayout::V1Beta2)
        );
        assert_eq!(c.layout.api_version(), "cluster.x-k8s.io/v1beta2");
    }

    #[test]
    fn capi_1_12_with_machine_conditions_in_mhc_is_condition_mode() {
        let mut s = capi_1_9();
        s.machine = v(&["v1beta1", "v1beta2"]);
        s.machine_health_check = v(&["v1beta1", "v1beta2"]);
        s.mhc_unhealthy_machine_conditions = true;
        let c = choose(&s, None).unwrap();
        assert_eq!(c.mode, Mode::Condition);
        assert_eq!(c.mhc_version, "v1beta2");
    }

    #[test]
    fn forcing_a_mode_is_honoured_unless_the_cluster_cannot_do_it() {
        let c = choose(&capi_1_9(), Some(Mode::Observe)).unwrap();
        assert_eq!((c.mode, c.mode_source.as_str()), (Mode::Observe, "forced"));
        assert_eq!(
            choose(&capi_1_9(), Some(Mode::Condition)),
            Err(DiscoveryError::ConditionModeUnsupported)
        );
    }

    #[test]
    fn missing_apis_are_clear_errors() {
        let mut s = capi_1_9();
        s.machine.clear();
        let e = choose(&s, None).unwrap_err();
        assert!(e.to_string().contains("is Cluster API installed"), "{e}");
        let mut s = capi_1_9();
        s.cloudstack_machine = v(&["v1alpha3"]);
        let e = choose(&s, None).unwrap_err();
        assert!(
            e.to_string().contains("CloudStackMachine") && e.to_string().contains("CAPC"),
            "{e}"
        );
    }
}
