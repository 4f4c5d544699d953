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
