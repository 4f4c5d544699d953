//! `capc-health-shim run`: the controller. Watches CAPC-backed Machines and the objects they
//! hang off, polls CloudStack once per scope per interval, and publishes the verdicts on the
//! Machines (condition; remediate annotation in annotate mode).
//!
//! - [`targets`]: watched objects → Machines to judge (pure).
//! - [`config`]: the flags of `run`.
//! - [`cycle`]: one poll cycle: credentials, listings, verdicts, writes, `/status`.
//! - [`kube_io`]: discovery, watches and the writes to the API server.
//! - [`run`]: wiring: HTTP side, discovery, watches, leader Lease, the poll loop, shutdown.

pub mod config;
pub mod cycle;
pub mod kube_io;
pub mod run;
pub mod targets;

pub use config::RunArgs;
