//! Time to recycle, not time to a verdict (issue 27, item 6): what a published `False` still
//! waits for before CAPI replaces the Machine, in each mode, at the product's defaults and the
//! recommended MachineHealthChecks — read from their sources, not restated, so the report
//! follows them when they change.

use std::fmt::Write as _;

use capc_health_shim::verdict::condition::DEFAULT_CONDITION_TYPE;
use clap::CommandFactory;

/// The recommended MHC for condition mode (`unhealthyMachineConditions`).
pub const CONDITION_MHC: &str = "deploy/examples/mhc-condition-mode.yaml";

/// CAPI ≥ 1.13 holds each MachineHealthCheck to one reconcile per 15 s
/// (`ReconcilerRateLimiting`, beta, on by default; docs/versions.md): at worst a recycle waits
/// that much longer for the MHC's next look.
pub const MHC_RECONCILER_RATE_LIMIT_SECS: f64 = 15.0;

/// `capc-health-shim run`'s flags, as the binary defines them (read for their defaults only).
#[derive(clap::Parser)]
#[allow(dead_code)]
struct RunFlags {
    #[command(flatten)]
    run: capc_health_shim::controller::RunArgs,
}

/// One added term: seconds and where they come from.
#[derive(Debug, Clone)]
pub struct Term {
    pub seconds: f64,
    pub source: String,
}

/// What a `False` waits for before MHC marks the Machine, by mode.
#[derive(Debug, Clone)]
pub struct RecycleTerms {
    /// Annotate mode: `--escalation-delay` at its default.
    pub escalation_delay: Result<Term, String>,
    /// Condition mode: the recommended MHC's `unhealthyMachineConditions` timeout for `False`.
    pub mhc_condition_timeout: Result<Term, String>,
    /// Condition mode (CAPI ≥ 1.13): the MHC reconciler's rate limit, at worst.
    pub rate_limit: Term,
}

/// `--escalation-delay`'s default, from the flag definition itself.
fn escalation_delay() -> Result<Term, String> {
    let cmd = RunFlags::command();
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some("escalation-delay"))
        .ok_or("capc-health-shim run has no --escalation-delay flag")?;
    let default = arg
        .get_default_values()
        .first()
        .and_then(|v| v.to_str())
        .ok_or("--escalation-delay has no default")?;
    let d = capc_health_shim::cli::parse_duration(default)?;
    Ok(Term {
        seconds: d.as_secs_f64(),
        source: format!(
            "`capc-health-shim run --escalation-delay` default ({default}, \
             src/controller/config.rs)"
        ),
    })
}

/// The recommended condition-mode MHC's timeout for `<condition type> False`.
fn mhc_condition_timeout() -> Result<Term, String> {
    let text =
        std::fs::read_to_string(CONDITION_MHC).map_err(|e| format!("{CONDITION_MHC}: {e}"))?;
    let doc: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{CONDITION_MHC}: {e}"))?;
    let conditions = doc["spec"]["checks"]["unhealthyMachineConditions"]
        .as_array()
        .ok_or_else(|| format!("{CONDITION_MHC} has no spec.checks.unhealthyMachineConditions"))?;
    let seconds = conditions
        .iter()
        .find(|c| c["type"] == DEFAULT_CONDITION_TYPE && c["status"] == "False")
        .and_then(|c| c["timeoutSeconds"].as_f64())
        .ok_or_else(|| {
            format!("{CONDITION_MHC} has no {DEFAULT_CONDITION_TYPE} False timeoutSeconds")
        })?;
    Ok(Term {
        seconds,
        source: format!(
            "the recommended MHC's `unhealthyMachineConditions` timeout for \
             `{DEFAULT_CONDITION_TYPE}` `False` ({seconds:.0} s, {CONDITION_MHC})"
        ),
    })
}

impl RecycleTerms {
    pub fn load() -> Self {
        Self {
            escalation_delay: escalation_delay(),
            mhc_condition_timeout: mhc_condition_timeout(),
            rate_limit: Term {
                seconds: MHC_RECONCILER_RATE_LIMIT_SECS,
                source: "CAPI ≥ 1.13's MachineHealthCheck reconciler rate limit \
                         (`ReconcilerRateLimiting`, one reconcile per MHC per 15 s, on by \
                         default; docs/versions.md), counted at its worst"
                    .to_string(),
            },
        }
    }

    /// Seconds added to time to `False` in annotate mode.
    pub fn annotate(&self) -> Option<f64> {
        self.escalation_delay.as_ref().ok().map(|t| t.seconds)
    }

    /// Seconds added to time to `False` in condition mode.
    pub fn condition(&self) -> Option<f64> {
        self.mhc_condition_timeout
            .as_ref()
            .ok()
            .map(|t| t.seconds + self.rate_limit.seconds)
    }

    /// The terms as a Markdown list, each with its source.
    pub fn explain(&self, poll_interval_secs: i64) -> String {
        let mut md = String::from(
            "Time to recycle = time to `False` + what the `False` then waits for before MHC marks \
             the Machine (the owner's delete and the new VM's creation follow either way and are \
             not counted; MHC's 600 s `nodeStartupTimeout` is counted from the Machine's creation \
             and does not include them either):\n\n",
        );
        match &self.escalation_delay {
            Ok(t) => {
                let _ = writeln!(
                    md,
                    "- annotate mode (CAPI ≤ 1.11): + {:.0} s, {}: the shim sets the remediate \
                     annotation once `False` has stood that long, and MHC marks an annotated Machine \
                     at once. The annotation is written by the first poll cycle at or after it, so \
                     with the `run` loop's ±10 % jitter up to one poll interval ({poll_interval_secs} \
                     s) more; the bench's polls are unjittered, where it is exact.",
                    t.seconds, t.source
                );
            }
            Err(e) => {
                let _ = writeln!(md, "- annotate mode: not computed ({e}).");
            }
        }
        match &self.mhc_condition_timeout {
            Ok(t) => {
                let _ = writeln!(
                    md,
                    "- condition mode (CAPI ≥ 1.12): + {:.0} s, {}, + {:.0} s, {}.",
                    t.seconds, t.source, self.rate_limit.seconds, self.rate_limit.source
                );
            }
            Err(e) => {
                let _ = writeln!(md, "- condition mode: not computed ({e}).");
            }
        }
        md
    }
}

/// `{:.0}` of `base + added`, or `–` when the term is unknown or the base missing.
pub fn plus(base: f64, added: Option<f64>) -> Option<f64> {
    added.filter(|_| base.is_finite()).map(|a| base + a)
}

/// A table cell for an optional number.
pub fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.digits$}"))
}
