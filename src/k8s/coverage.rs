//! Whether a Machine's verdict will be acted on, and how (pure): the MachineHealthChecks that
//! cover a Machine act on the shim's condition only when they list it under
//! `unhealthyMachineConditions` (CAPI 1.12+), and on the `cluster.x-k8s.io/remediate-machine`
//! annotation on every version. In auto mode a Machine whose MHCs do not list the condition
//! gets the annotation instead (a CAPI upgrade keeps the MHCs written for annotate mode), so a
//! `False` verdict is never left standing by a configuration the shim can see.

use std::fmt;
use std::sync::Arc;

use jiff::SignedDuration;

use super::objects::MachineView;
use super::watched::HealthCheckRecord;
use crate::verdict::Status;
use capi_model::apis::Mode;
use capi_model::well_known;

/// One readable entry of an MHC's `unhealthyMachineConditions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionRule {
    pub type_: String,
    pub status: String,
    /// How long the condition must hold that status; `None` when the MHC's value is unreadable
    /// (MHC itself then refuses the object, so it never validates; kept as "listed").
    pub timeout: Option<SignedDuration>,
}

/// The MHC's rule for `condition_type` at `status`, if it lists one.
pub fn rule_for<'a>(
    mhc: &'a HealthCheckRecord,
    condition_type: &str,
    status: Status,
) -> Option<&'a ConditionRule> {
    mhc.machine_conditions
        .iter()
        .find(|r| r.type_ == condition_type && r.status == status.as_str())
}

/// How a Machine's `False` verdict will be acted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActedOn {
    /// A covering MHC lists the condition with status `False`: it marks the Machine after
    /// `after` (its timeout).
    Condition {
        mhc: String,
        after: Option<SignedDuration>,
    },
    /// The shim sets the remediate annotation (after `--escalation-delay`, with its guards);
    /// `fallback` when that is because the covering MHCs do not list the condition.
    Annotation { fallback: bool },
    /// Nothing will act on it. `deliberate` when an operator chose that (`--mode observe`,
    /// skip-remediation), so it is no gap to alert on.
    None { why: String, deliberate: bool },
}

impl ActedOn {
    /// `condition`, `annotation` or `none` (the `/status` word before any reason).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Condition { .. } => "condition",
            Self::Annotation { .. } => "annotation",
            Self::None { .. } => "none",
        }
    }

    /// Nothing acts on a `False` verdict, and nobody chose that.
    pub fn is_gap(&self) -> bool {
        matches!(
            self,
            Self::None {
                deliberate: false,
                ..
            }
        )
    }
}

impl fmt::Display for ActedOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None { why, .. } => write!(f, "none: {why}"),
            other => f.write_str(other.kind()),
        }
    }
}

/// What decides the path of one Machine.
#[derive(Debug, Clone, Copy)]
pub struct CoverageFacts<'a> {
    pub mode: Mode,
    /// The mode was detected (`--mode auto`), not forced.
    pub auto: bool,
    pub condition_type: &'a str,
    pub machine: &'a MachineView,
    /// The MHCs that cover the Machine ([`super::objects::mhc_covers`]).
    pub covering: &'a [Arc<HealthCheckRecord>],
}

/// Whether the shim's own path to recycling is the annotation: annotate mode, or auto mode on
/// CAPI 1.12+ where no covering MHC lists the condition as `False` (including none covering:
/// the escalation guards then say "not covered").
pub fn annotates(f: &CoverageFacts<'_>) -> bool {
    match f.mode {
        Mode::Annotate => true,
        Mode::Condition => f.auto && listing_false(f).is_none(),
        Mode::Observe => false,
    }
}

fn listing_false<'a>(f: &CoverageFacts<'a>) -> Option<(&'a HealthCheckRecord, &'a ConditionRule)> {
    f.covering
        .iter()
        .find_map(|mhc| Some((&**mhc, rule_for(mhc, f.condition_type, Status::False)?)))
}

/// How a `False` verdict of the Machine will be acted on. Lasting facts only: a paused or
/// deleting Machine, a control-plane Machine waiting for another's turn, the delay — those
/// are the escalation's state, not a gap.
pub fn acted_on(f: &CoverageFacts<'_>) -> ActedOn {
    let none = |why: String| ActedOn::None {
        why,
        deliberate: false,
    };
    let m = f.machine;
    if f.mode == Mode::Observe {
        return ActedOn::None {
            why: "--mode observe: the shim only publishes its verdict".into(),
            deliberate: true,
        };
    }
    if m.annotated(well_known::SKIP_REMEDIATION) {
        return ActedOn::None {
            why: format!(
                "the Machine carries {}: MachineHealthCheck leaves it alone",
                well_known::SKIP_REMEDIATION
            ),
            deliberate: true,
        };
    }
    if f.covering.is_empty() {
        return none("no MachineHealthCheck selects this Machine".into());
    }
    match m.owner_kind.as_deref() {
        Some("MachineSet") | Some("KubeadmControlPlane") => {}
        other => {
            return none(format!(
                "owned by {}; only MachineSet and KubeadmControlPlane remediate Machines",
                other.unwrap_or("nothing")
            ))
        }
    }
    if f.mode == Mode::Annotate {
        return ActedOn::Annotation { fallback: false };
    }
    if let Some((mhc, rule)) = listing_false(f) {
        return ActedOn::Condition {
            mhc: format!("{}/{}", mhc.namespace, mhc.name),
            after: rule.timeout,
        };
    }
    if f.auto {
        return ActedOn::Annotation { fallback: true };
    }
    let names: Vec<String> = f
        .covering
        .iter()
        .map(|m| format!("{}/{}", m.namespace, m.name))
        .collect();
    none(format!(
        "--mode condition, and no MachineHealthCheck covering it ({}) lists {}=False under unhealthyMachineConditions",
        names.join(", "),
        f.condition_type
    ))
}

/// A human line on what acts and when, for `/status` next to [`ActedOn`].
pub fn acted_on_detail(f: &CoverageFacts<'_>, acted: &ActedOn) -> Option<String> {
    let unknown = f.covering.iter().find_map(|mhc| {
        rule_for(mhc, f.condition_type, Status::Unknown)
            .map(|r| (format!("{}/{}", mhc.namespace, mhc.name), r.timeout))
    });
    let mut detail = match acted {
        ActedOn::Condition { mhc, after } => format!(
            "MachineHealthCheck {mhc} marks it after {}=False for {}",
            f.condition_type,
            timeout_text(*after)
        ),
        ActedOn::Annotation { fallback: true } => format!(
            "no MachineHealthCheck covering it lists {}=False under unhealthyMachineConditions; the shim sets {} after --escalation-delay",
            f.condition_type,
            well_known::REMEDIATE_MACHINE
        ),
        ActedOn::Annotation { fallback: false } => format!(
            "the shim sets {} after --escalation-delay",
            well_known::REMEDIATE_MACHINE
        ),
        ActedOn::None { .. } => return None,
    };
    if let Some((mhc, after)) = unknown {
        detail.push_str(&format!(
            "; MachineHealthCheck {mhc} also acts on {}=Unknown after {}",
            f.condition_type,
            timeout_text(after)
        ));
    }
    Some(detail)
}

fn timeout_text(t: Option<SignedDuration>) -> String {
    match t {
        Some(d) => format!("{}s", d.as_secs()),
        None => "its (unreadable) timeout".into(),
    }
}

/// A Go duration as CAPI's v1beta1 `timeout` holds it (`"300s"`, `"5m"`, `"1h30m"`, `"0"`);
/// `None` when it does not read as one.
pub fn go_duration(s: &str) -> Option<SignedDuration> {
    let s = s.trim();
    if s == "0" {
        return Some(SignedDuration::ZERO);
    }
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        nanos += number * scale;
    }
    if !nanos.is_finite() || nanos > i64::MAX as f64 {
        return None;
    }
    let d = SignedDuration::from_nanos(nanos as i64);
    Some(if negative { -d } else { d })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const OURS: &str = "CloudStackVMHealthy";

    fn worker() -> MachineView {
        MachineView {
            namespace: "ns".into(),
            name: "m".into(),
            cluster_name: "c1".into(),
            owner_kind: Some("MachineSet".into()),
            infrastructure_kind: Some("CloudStackMachine".into()),
            ..Default::default()
        }
    }

    fn mhc(name: &str, spec: Value) -> Arc<HealthCheckRecord> {
        let mut spec = spec;
        spec["clusterName"] = json!("c1");
        spec["selector"] = json!({});
        Arc::new(
            HealthCheckRecord::from_json(
                &json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec}),
            )
            .expect("a record"),
        )
    }

    /// A CAPI 1.9-style MHC: Node conditions only.
    fn v1_9_style() -> Arc<HealthCheckRecord> {
        mhc(
            "old",
            json!({"nodeStartupTimeout": "30m",
                "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]}),
        )
    }

    fn v1beta2_listing(status: &str, seconds: i64) -> Arc<HealthCheckRecord> {
        mhc(
            "new",
            json!({"checks": {"unhealthyMachineConditions": [
                {"type": "Ready", "status": "False", "timeoutSeconds": 1},
                {"type": OURS, "status": status, "timeoutSeconds": seconds}]}}),
        )
    }

    fn facts<'a>(
        mode: Mode,
        auto: bool,
        m: &'a MachineView,
        covering: &'a [Arc<HealthCheckRecord>],
    ) -> CoverageFacts<'a> {
        CoverageFacts {
            mode,
            auto,
            condition_type: OURS,
            machine: m,
            covering,
        }
    }

    #[test]
    fn the_rules_read_from_either_api_version_with_their_timeouts() {
        let v1beta2 = v1beta2_listing("False", 60);
        assert_eq!(
            rule_for(&v1beta2, OURS, Status::False).and_then(|r| r.timeout),
            Some(SignedDuration::from_secs(60))
        );
        assert!(rule_for(&v1beta2, OURS, Status::Unknown).is_none());
        assert!(rule_for(&v1beta2, "Other", Status::False).is_none());
        // CAPI 1.13's v1beta1 field, with a Go duration.
        let v1beta1 = mhc(
            "b1",
            json!({"unhealthyMachineConditions": [
                {"type": OURS, "status": "Unknown", "timeout": "1h30m"},
                {"type": OURS, "status": "False", "timeout": "garbage"},
                {"status": "False", "timeout": "1m"},
                "not an entry"]}),
        );
        assert_eq!(v1beta1.machine_conditions.len(), 2, "{v1beta1:?}");
        assert_eq!(
            rule_for(&v1beta1, OURS, Status::Unknown).and_then(|r| r.timeout),
            Some(SignedDuration::from_secs(5400))
        );
        let unreadable = rule_for(&v1beta1, OURS, Status::False).expect("still listed");
        assert_eq!(unreadable.timeout, None);
        // v1beta1's unhealthyConditions are Node conditions: never ours.
        assert!(v1_9_style().machine_conditions.is_empty());
        assert!(mhc(
            "odd",
            json!({"checks": "nonsense", "unhealthyMachineConditions": 7})
        )
        .machine_conditions
        .is_empty());
    }

    #[test]
    fn go_durations_read_as_go_reads_them() {
        let secs = |s: &str| go_duration(s).map(|d| d.as_millis());
        assert_eq!(secs("300s"), Some(300_000));
        assert_eq!(secs("5m"), Some(300_000));
        assert_eq!(secs("1h30m"), Some(5_400_000));
        assert_eq!(secs("1.5h"), Some(5_400_000));
        assert_eq!(secs("250ms"), Some(250));
        assert_eq!(secs("0"), Some(0));
        assert_eq!(secs("-1m"), Some(-60_000));
        for bad in ["", "5", "m", "5x", "1..5s", "-", "1e400h"] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn condition_mode_acts_through_an_mhc_that_lists_false() {
        let m = worker();
        let covering = [v1_9_style(), v1beta2_listing("False", 60)];
        let f = facts(Mode::Condition, true, &m, &covering);
        assert_eq!(
            acted_on(&f),
            ActedOn::Condition {
                mhc: "ns/new".into(),
                after: Some(SignedDuration::from_secs(60))
            }
        );
        assert!(!annotates(&f), "one MHC acting is enough");
        assert_eq!(acted_on(&f).to_string(), "condition");
        let detail = acted_on_detail(&f, &acted_on(&f)).unwrap();
        assert!(
            detail.contains("ns/new") && detail.contains("60s"),
            "{detail}"
        );
    }

    #[test]
    fn auto_condition_mode_falls_back_to_the_annotation_when_no_mhc_lists_false() {
        let m = worker();
        // A v1.9-style MHC left in place after the upgrade, and one listing only Unknown.
        for covering in [vec![v1_9_style()], vec![v1beta2_listing("Unknown", 60)]] {
            let f = facts(Mode::Condition, true, &m, &covering);
            assert_eq!(acted_on(&f), ActedOn::Annotation { fallback: true });
            assert!(annotates(&f));
            let detail = acted_on_detail(&f, &acted_on(&f)).unwrap();
            assert!(detail.contains("remediate-machine"), "{detail}");
        }
        let unknown_only = [v1beta2_listing("Unknown", 90)];
        let f = facts(Mode::Condition, true, &m, &unknown_only);
        let detail = acted_on_detail(&f, &acted_on(&f)).unwrap();
        assert!(detail.contains("Unknown after 90s"), "{detail}");
    }

    #[test]
    fn forced_condition_mode_without_a_listing_mhc_is_a_gap() {
        let m = worker();
        let covering = [v1_9_style()];
        let f = facts(Mode::Condition, false, &m, &covering);
        let acted = acted_on(&f);
        assert!(acted.is_gap());
        assert!(!annotates(&f), "forced condition mode never annotates");
        let text = acted.to_string();
        assert!(
            text.starts_with("none: ") && text.contains("ns/old") && text.contains(OURS),
            "{text}"
        );
        assert_eq!(acted_on_detail(&f, &acted), None);
    }

    #[test]
    fn annotate_mode_needs_coverage_and_an_owner_that_remediates() {
        let mut m = worker();
        let covering = [v1_9_style()];
        let f = facts(Mode::Annotate, false, &m, &covering);
        assert_eq!(acted_on(&f), ActedOn::Annotation { fallback: false });
        assert!(annotates(&f));
        let none = facts(Mode::Annotate, true, &m, &[]);
        assert!(acted_on(&none).is_gap());
        assert!(acted_on(&none)
            .to_string()
            .contains("no MachineHealthCheck"));
        // Auto condition mode with nothing covering: the annotation path, whose guard then
        // says "not covered"; /status says none.
        let uncovered = facts(Mode::Condition, true, &m, &[]);
        assert!(annotates(&uncovered) && acted_on(&uncovered).is_gap());
        m.owner_kind = None;
        let f = facts(Mode::Annotate, false, &m, &covering);
        assert!(acted_on(&f).is_gap());
        assert!(acted_on(&f).to_string().contains("owned by nothing"));
    }

    #[test]
    fn deliberate_choices_are_none_but_no_gap() {
        let mut m = worker();
        let covering = [v1beta2_listing("False", 60)];
        let observe = facts(Mode::Observe, false, &m, &covering);
        assert_eq!(acted_on(&observe).kind(), "none");
        assert!(!acted_on(&observe).is_gap() && !annotates(&observe));
        m.annotations
            .insert(well_known::SKIP_REMEDIATION.into(), String::new());
        let skip = facts(Mode::Condition, true, &m, &covering);
        assert_eq!(acted_on(&skip).kind(), "none");
        assert!(!acted_on(&skip).is_gap());
    }
}
