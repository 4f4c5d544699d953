//! The Kubernetes side's rules, pure: Machines, CloudStackMachines and conditions. The
//! CloudStack side and the verdict engine stay free of Kubernetes types and meet them only
//! through this module; the controller's Kubernetes I/O is `crate::controller::kube_io`. What
//! the CAPI objects are (served versions, our condition entry and its apply body, well-known
//! labels) is the `capi-model` crate's.
//!
//! - [`objects`]: a Machine's facts, MHC selection, Node matching (NodeNotLinked), CRD fields.
//! - [`coverage`]: whether a Machine's MachineHealthChecks act on the verdict, and through what.
//! - [`escalation`]: the remediate-machine annotation and its guards.
//! - [`kube_error`]: the API server's answers as typed errors (the controller's writes, the
//!   HTTP side's token reviews).
//! - [`kubeconfig`]: which workload kubeconfigs the NodeNotLinked lookup may use.
//! - [`lease`]: whether the leader's hold on its Lease still stands.
//! - [`views`]: typed partial views of the watched objects, tolerant field by field.
//! - [`watched`]: what the watches keep of each object (the facts read, as records).

pub mod coverage;
pub mod escalation;
pub mod kube_error;
pub mod kubeconfig;
pub mod lease;
pub mod objects;
pub mod views;
pub mod watched;
