//! The scorecard's decisions, pure (issue 44): what the shim did, or would have done, on each
//! Machine, and how long the operator's VMs take to become Nodes. What survives a leader
//! change is `Serialize + Deserialize`.
//!
//! - [`card`]: the scorecard: observations per cycle → stories → counted outcomes.
//! - [`outcome`]: one Machine's story, folded event by event, and its outcome when it ends.
//! - [`baseline`]: boot times per (template, offering, zone) over a window, and the warnings.
//! - [`sketch`]: the fixed-size quantile sketch the baselines keep per key.

pub mod baseline;
pub mod card;
pub mod outcome;
pub mod sketch;

#[cfg(test)]
mod baseline_tests;
#[cfg(test)]
mod card_tests;
#[cfg(test)]
mod outcome_props;
#[cfg(test)]
mod outcome_tests;

use serde::{Deserialize, Serialize};

pub use baseline::{
    warnings, BaselineRow, Baselines, BootKey, BootSample, MhcCoverage, Summary, WarnPolicy,
    Warning,
};
pub use card::{Departed, Kept, Observation, Scorecard, Seen, Total, DEFAULT_WARN_POLICY};
pub use outcome::{
    Deleter, Event, MhcTrigger, Outcome, OutcomeKind, Recycler, ShimSaid, Story, Timing, OUTCOMES,
};
pub use sketch::Sketch;

/// What an outcome is grouped by on `/status` and in the `scorecard` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Labels {
    pub cluster: String,
    pub zone: String,
    pub template: String,
    pub offering: String,
    pub hypervisor: String,
}
