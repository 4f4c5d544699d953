//! What the tests of capc-health-shim share that is not the product itself (a dev-dependency
//! only; it never depends on the product, so the product is compiled once for its tests):
//!
//! - [`apiserver`]: the real kube-apiserver `make test` starts, and a visible refusal to pass
//!   silently without it.
//! - [`binaries`]: binaries of other workspace members (`cloudstack-sim`) for process tests.
//! - [`proxy`]: a TCP proxy whose connection can be cut and restored (a partition).
//! - [`secrets`]: the scan for leaked secret keys and request signatures.

pub mod apiserver;
pub mod binaries;
pub mod proxy;
pub mod secrets;
