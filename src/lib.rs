//! capc-health-shim: asks CloudStack how the VM behind each CAPC-backed Machine is doing and
//! turns that evidence into a tri-state verdict that CAPI's own remediation can act on.
//!
//! Layout:
//! - [`cloudstack`]: the `cloudstack-api` crate: signed API client, wire model and error
//!   taxonomy (I/O at the edge).
//! - [`verdict`]: the `verdict` crate: pure decisions (history → verdict → guard → condition).
//! - [`scope`]: one listing per scope per poll, matched to tracked VMs by id.
//! - [`probe`]: the opt-in ARP probe from a network's virtual router (`runDiagnostics`), paced
//!   by `verdict::probe`, bounded by a per-scope budget.
//! - [`orphans`]: remnants — VMs no CloudStackMachine owns, found from the watches and the
//!   listings (pure).
//! - [`remnants`]: management-side remnants — objects stuck deleting, or whose owner or
//!   Cluster is gone — found from their metadata (pure; the controller's metadata watches
//!   feed it).
//! - [`check`]: the one-shot `capc-health-shim check` command (client + engine, no Kubernetes).
//! - [`k8s`]: the Kubernetes side's pure rules (Machine views, escalation, Lease hold).
//! - [`controller`]: `capc-health-shim run`, the cycle in named phases and its Kubernetes I/O.
//! - [`status`]: the `/status` document types the controller fills.
//! - [`metrics`]: the Prometheus metrics (`capc_health_*`) and their OpenMetrics encoding.
//! - [`http`]: the `/status`, `/metrics`, `/healthz` and `/readyz` endpoints (axum; HTTPS with
//!   `/status` and `/metrics` behind TokenReview + SubjectAccessReview, or `--insecure-serving`).
//! - [`cli`]: shared flags, and the commands that read a running shim (`status`, `orphans`).
//!
//! The simulator (`crates/cloudstack-sim`) is not part of the product; neither are the developer
//! tools: `examples/demo.rs` (`make demo-sim`) and the docs generator in `tests/docs_gen`.

pub mod check;
pub mod cli;
pub mod controller;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod orphans;
pub mod probe;
pub mod remnants;
pub mod scope;
pub mod status;

pub use cloudstack_api as cloudstack;
pub use verdict;
