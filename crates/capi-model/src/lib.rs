//! capc-health-shim's model of Cluster API and CAPC — facts about their objects, no decisions
//! and no I/O: used by the decisions (`verdict`), the product and the fuzz targets alike.
//!
//! - [`apis`]: what the management cluster serves, and what follows from it: the Machine
//!   version written through, where conditions live, the remediation mode.
//! - [`condition`]: the condition the shim owns on a Machine: its status and entry, reading it
//!   back from either layout, and the server-side-apply body that writes only that entry.
//! - [`well_known`]: the API groups, labels and annotations CAPI and CAPC define that the shim
//!   reads or writes.

pub mod apis;
pub mod condition;

pub use condition::{ConditionState, Status};

/// Groups, labels and annotations Cluster API and CAPC define that the shim reads or writes.
pub mod well_known {
    pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
    pub const INFRA_GROUP: &str = "infrastructure.cluster.x-k8s.io";
    pub const REMEDIATE_MACHINE: &str = "cluster.x-k8s.io/remediate-machine";
    pub const PAUSED: &str = "cluster.x-k8s.io/paused";
    pub const SKIP_REMEDIATION: &str = "cluster.x-k8s.io/skip-remediation";
    pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
    /// clusterctl move sets it on each source object right before deleting it
    /// (`cmd/clusterctl/client/cluster/mover.go` `deleteSourceObject`, CAPI v1.9.6).
    pub const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
    pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
}
