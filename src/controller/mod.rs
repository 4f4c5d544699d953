//! `capc-health-shim run`: the controller. Watches CAPC-backed Machines and the objects they
//! hang off, polls CloudStack once per scope per interval, and publishes the verdicts on the
//! Machines (condition; remediate annotation in annotate mode).
//!
//! - [`config`]: the flags of `run`.
//! - [`run`]: wiring: HTTP side, discovery, watches, leader Lease, the poll loop, shutdown.
//! - [`cycle`]: one poll cycle as phases: [`gather`] → [`poll`] → [`decide`] → [`act`] →
//!   [`report`].
//! - [`targets`]: watched objects → Machines to judge (pure); [`joins`] keeps them between
//!   cycles and joins again only what the watches changed.
//! - [`budget`]: how long the Secret reads, destroy-job listings and NodeNotLinked lookups of
//!   a cycle may take, and how many run at once.
//! - [`incidents`]: many Machines of one scope failing at once, and the one thing their VMs
//!   share (decided in `verdict::incidents`).
//! - [`leadership`]: the Lease confirmed before every write.
//! - [`writer`]: the task that sends every write behind a bounded queue, so a slow API
//!   server never holds up a poll.
//! - [`orphans`] and [`remnants`]: the VM-orphan and management-side remnant reports in the
//!   cycle (decided in [`crate::orphans`] and [`crate::remnants`]).
//! - [`kube_io`]: discovery, watches and the writes to the API server (their typed errors are
//!   [`crate::k8s::kube_error`]).

pub mod act;
pub mod budget;
pub mod config;
pub mod credentials;
pub mod cycle;
pub mod decide;
pub mod gather;
pub mod incidents;
pub mod joins;
pub mod kube_io;
pub mod leadership;
pub mod memory;
pub mod orphans;
pub mod poll;
pub mod probing;
pub mod remnant_watch;
pub mod remnants;
pub mod report;
pub mod run;
pub mod scorecard_memory;
pub mod scoring;
pub mod targets;
pub mod writer;

pub use config::RunArgs;
