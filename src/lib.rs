//! capc-health-shim: asks CloudStack how the VM behind each CAPC-backed Machine is doing and
//! turns that evidence into a tri-state verdict that CAPI's own remediation can act on.
//!
//! Layout:
//! - [`cloudstack`]: signed API client, wire model and error taxonomy (I/O at the edge).
//! - [`verdict`]: the pure verdict engine (observation history → True/False/Unknown).
//! - [`scope`]: one listing per scope per poll, matched to tracked VMs by id.
//! - [`check`]: the one-shot `capc-health-shim check` command (client + engine, no Kubernetes).
//! - [`k8s`]: the Kubernetes side (conversions now; the controller comes next).
//! - [`status`]: the `/status` document types the controller fills.
//! - [`metrics`]: the Prometheus metrics (`capc_health_*`) and their OpenMetrics encoding.
//! - [`http`]: the `/status`, `/metrics`, `/healthz` and `/readyz` endpoints (axum).
//! - [`status_cmd`]: `capc-health-shim status --url URL`, a running shim's `/status` for humans.
//! - [`docs_gen`]: the flags table of `docs/configuration.md`, generated from the clap definitions.
//! - [`sim`]: `cloudstack-sim`, a CloudStack API simulator used by tests, the demo and benchmarks.

pub mod check;
pub mod cli;
pub mod cloudstack;
pub mod controller;
pub mod demo;
pub mod docs_gen;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod scope;
pub mod sim;
pub mod status;
pub mod status_cmd;
pub mod verdict;
