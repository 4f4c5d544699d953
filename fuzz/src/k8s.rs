//! `crate::k8s` of the library: the Machine condition (without the k8s-openapi conversions).

#[path = "../../src/k8s/capi.rs"]
pub mod capi;
#[path = "../../src/k8s/conditions.rs"]
pub mod conditions;
