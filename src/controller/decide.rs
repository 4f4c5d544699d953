//! Phase 3 of a cycle, decide: each target becomes a [`Subject`] of the one decision pipeline
//! ([`crate::verdict::decide`], the same `check` and the benches run). The only I/O is the
//! NodeNotLinked lookup between the pipeline's two passes: a Node-less Machine about to turn
//! `False` whose VM matches a workload Node must never be published `False` — in condition mode
//! the MHC acts on `False` itself — so the workload clusters of exactly those Machines are asked
//! (each at most once per cycle, all at once within the lookups' share of `--poll-deadline`:
//! [`super::budget`]), and the pipeline runs again with what they said. A cluster that does
//! not answer in time was not asked, as one that cannot be asked at all. With
//! `--no-workload-node-lookup` nobody is asked: the first pass stands, as when a workload
//! cluster cannot be asked — not looking never turns a verdict `False` by itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::stream::{self, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::budget::{self, Phase};
use super::cycle::{Controller, CycleSummary};
use super::gather::Gathered;
use super::kube_io;
use super::targets::{Target, TargetProblem};
use crate::cli::to_std;
use crate::k8s::kube_error::KubeError;
use crate::k8s::objects::matching_node;
use crate::verdict::{
    decide, ConditionState, Decision, Evidence, MachineFacts, Status, Subject, Verdict,
};

/// The reason for Machines whose CloudStack credentials cannot be had.
pub use crate::verdict::reason::CREDENTIALS_UNAVAILABLE;

/// What the decide phase concluded, per target (in target order).
pub(super) struct Decided {
    /// The condition to publish (unchanged ones included).
    pub conditions: Vec<Option<ConditionState>>,
    /// Targets held by the NodeNotLinked guard → the Node that matches their VM.
    pub unlinked: BTreeMap<usize, String>,
    /// Per target: its first condition waits for the traffic samples that decide
    /// ([`Decision::first_writes_held`]); nothing is written for it this cycle.
    pub first_write_held: Vec<bool>,
}

/// A verdict that needs no history: the target cannot be polled. With it, since when its
/// endpoint's Secret has failed to read, when this process knew the endpoint before.
fn unavailable(t: &Target, g: &Gathered) -> Option<(Verdict, Option<Timestamp>)> {
    if let Some(TargetProblem::NoFailureDomain(fd)) = &t.problem {
        let v = Verdict::new(
            Status::Unknown,
            CREDENTIALS_UNAVAILABLE,
            format!(
                "failure domain {fd} (and so the CloudStack endpoint and its Secret) not found"
            ),
        );
        return Some((v, None));
    }
    let (e, since) = g.credential_errors.get(t.endpoint.as_ref()?)?;
    let v = Verdict::new(Status::Unknown, CREDENTIALS_UNAVAILABLE, e.clone());
    Some((v, *since))
}

/// One cycle problem per missing failure domain its Machines need (a missing Secret is
/// reported by the gather phase): while their conditions stand, `/status` says why nothing
/// about them is current.
fn missing_failure_domains(g: &Gathered, graces: &crate::verdict::Graces) -> Vec<String> {
    let missing: std::collections::BTreeSet<&String> = g
        .targets
        .iter()
        .filter_map(|t| match &t.problem {
            Some(TargetProblem::NoFailureDomain(fd)) => Some(fd),
            _ => None,
        })
        .collect();
    missing
        .into_iter()
        .map(|fd| {
            format!(
                "failure domain {fd} (and so the CloudStack endpoint and its Secret) not found: \
                 its Machines keep the conditions they carry for up to {} after this process \
                 first found it missing, then turn Unknown/CredentialsUnavailable",
                crate::verdict::human_duration(graces.stale_after())
            )
        })
        .collect()
}

impl Controller {
    pub(super) async fn decide(
        &mut self,
        g: &Gathered,
        now: Timestamp,
        summary: &mut CycleSummary,
    ) -> Decided {
        self.carry_over_published(g);
        let fixed = g.targets.iter().map(|t| unavailable(t, g)).collect();
        let fixed = self.note_blind(g, fixed, now);
        summary
            .problems
            .extend(missing_failure_domains(g, &self.graces));
        let mut subjects = self.subjects(g, &fixed);
        let mut decision = decide(&subjects, &self.graces, &self.guard, now);
        let unlinked = self
            .unlinked_nodes(g, &decision, &subjects, &mut summary.problems)
            .await;
        if !unlinked.is_empty() {
            for (&i, node) in &unlinked {
                subjects[i].facts.unlinked_node = Some(node.clone());
            }
            decision = decide(&subjects, &self.graces, &self.guard, now);
        }
        let conditions = decision.conditions(&subjects, &self.args.condition_type, now);
        let first_write_held = decision.first_writes_held(&subjects);
        drop(subjects);
        self.record_guard(&decision, summary);
        Decided {
            conditions,
            unlinked,
            first_write_held,
        }
    }

    /// CAPC's record of when the VM state last changed feeds the fresh histories of a
    /// restarted shim or a new leader, so graces do not start over. (The condition the
    /// Machine carries stands by itself until evidence contradicts it: `verdict::standing`.)
    fn carry_over_published(&mut self, g: &Gathered) {
        for t in &g.targets {
            let (Some(key), Some(id)) = (g.scope_key(t), t.instance_id()) else {
                continue;
            };
            let Some(history) = self
                .scopes
                .get_mut(key)
                .and_then(|s| s.polled.observer.histories.get_mut(id))
            else {
                continue;
            };
            if let (Some(state), Some(since), Some(seen)) =
                (t.csm_state(), t.csm_state_since(), &history.sighting)
            {
                if seen.state.as_str() == state {
                    history.anchor_state_since(since);
                }
            }
        }
    }

    /// Per target that cannot be polled at all (its verdict `fixed`): the verdict, and since
    /// when this process has found it so — the first cycle it did (or the first failed read of
    /// its endpoint's Secret, if earlier), kept until the target can be polled again. A new
    /// process counts afresh, so the grace after a restart is never shorter than without one.
    fn note_blind(
        &mut self,
        g: &Gathered,
        fixed: Vec<Option<(Verdict, Option<Timestamp>)>>,
        now: Timestamp,
    ) -> Vec<Option<(Verdict, Timestamp)>> {
        let live: std::collections::HashSet<&String> = g
            .targets
            .iter()
            .zip(&fixed)
            .filter(|(_, v)| v.is_some())
            .filter_map(|(t, _)| t.machine.uid.as_ref())
            .collect();
        self.blind_since.retain(|uid, _| live.contains(uid));
        g.targets
            .iter()
            .zip(fixed)
            .map(|(t, v)| {
                let (v, endpoint_since) = v?;
                let first = endpoint_since.map_or(now, |e| e.min(now));
                // A Machine without a uid (the API server always sets one) is blind from now.
                let since = match &t.machine.uid {
                    Some(uid) => *self.blind_since.entry(uid.clone()).or_insert(first),
                    None => first,
                };
                Some((v, since))
            })
            .collect()
    }

    fn subjects<'a>(
        &'a self,
        g: &'a Gathered,
        fixed: &'a [Option<(Verdict, Timestamp)>],
    ) -> Vec<Subject<'a>> {
        g.targets
            .iter()
            .zip(fixed)
            .map(|(t, fixed)| {
                let scope = g.scope_key(t);
                let history = scope
                    .zip(t.instance_id())
                    .and_then(|(key, id)| self.scopes.get(key)?.polled.observer.histories.get(id));
                let evidence = match (&t.problem, fixed, history) {
                    (
                        Some(TargetProblem::NoCloudStackMachine(_) | TargetProblem::NoInstanceId),
                        _,
                        _,
                    ) => Evidence::None,
                    (_, Some((verdict, since)), _) => Evidence::Unavailable {
                        verdict,
                        since: *since,
                    },
                    (_, None, Some(h)) => Evidence::Observed(h),
                    (_, None, None) => Evidence::None,
                };
                Subject {
                    scope: scope.map(String::as_str),
                    evidence,
                    facts: MachineFacts {
                        has_node: t.machine.has_node_ref,
                        deleting: t.machine.deleting,
                        unlinked_node: None,
                    },
                    published: t.current.as_deref(),
                }
            })
            .collect()
    }

    /// The NodeNotLinked lookup: for each subject the pipeline would turn `False` without a
    /// Node, a workload Node matching its VM (by name or InternalIP) — index → Node name. When
    /// a workload cluster cannot be asked the verdict stands (the guard holds only on a match);
    /// a refusal by RBAC is a cycle problem (see [`lookup_problem`]). Off: nobody is asked.
    async fn unlinked_nodes(
        &self,
        g: &Gathered,
        decision: &Decision,
        subjects: &[Subject<'_>],
        problems: &mut Vec<String>,
    ) -> BTreeMap<usize, String> {
        let mut out = BTreeMap::new();
        if self.args.no_workload_node_lookup {
            return out;
        }
        let needing: Vec<usize> = decision.needing_node_lookup(subjects).collect();
        let clusters: BTreeSet<(&str, &str)> =
            needing.iter().map(|&i| cluster_of(&g.targets[i])).collect();
        let nodes_of = self.workload_nodes(clusters, problems).await;
        for i in needing {
            let t = &g.targets[i];
            let Some(nodes) = nodes_of.get(&cluster_of(t)) else {
                continue;
            };
            let addresses: Vec<String> = match subjects[i].evidence {
                Evidence::Observed(h) => h
                    .sighting
                    .as_ref()
                    .map(|s| s.addresses.clone())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            if let Some(node) = matching_node(nodes, &t.machine.name, &addresses) {
                out.insert(i, node.to_string());
            }
        }
        out
    }

    /// The Nodes of each workload cluster `(namespace, cluster)`, asked at once, each once,
    /// within the lookups' share of `--poll-deadline` ([`budget`]); the clusters that could
    /// not be asked, or did not answer in time, are left out — alike.
    async fn workload_nodes<'c>(
        &self,
        clusters: BTreeSet<(&'c str, &'c str)>,
        problems: &mut Vec<String>,
    ) -> HashMap<(&'c str, &'c str), Vec<Node>> {
        let client = &self.client;
        let timeout = to_std(self.args.workload_timeout);
        let window = budget::Window::start(Phase::NodeLookups, to_std(self.args.poll_deadline));
        let asked: Vec<_> = stream::iter(clusters)
            .map(|(ns, cluster)| async move {
                let nodes = window
                    .call(kube_io::workload_nodes(client, ns, cluster, timeout))
                    .await;
                ((ns, cluster), nodes)
            })
            .buffer_unordered(budget::CONCURRENT_CALLS)
            .collect()
            .await;
        let mut out = HashMap::new();
        for (cluster, nodes) in asked {
            match nodes {
                Some(Ok(nodes)) => {
                    out.insert(cluster, nodes);
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "NodeNotLinked check skipped");
                    problems.extend(lookup_problem(&e));
                }
                None => tracing::debug!(
                    namespace = cluster.0,
                    cluster = cluster.1,
                    "NodeNotLinked check skipped: the workload cluster did not answer within \
                     the lookups' share of --poll-deadline"
                ),
            }
        }
        out
    }

    /// The mass-failure guard's outcome per scope, into metrics, `/status` and the summary.
    fn record_guard(&mut self, decision: &Decision, summary: &mut CycleSummary) {
        for (key, (outcome, members)) in &decision.scopes {
            self.metrics.set_mass_failure_held(key, outcome.held);
            if let Some(s) = self.scopes.get_mut(key) {
                s.report.held = outcome.held;
                s.report.machines = *members;
            }
            if outcome.held {
                summary.problems.push(format!(
                    "mass-failure guard holds scope {key}: {} of {} Machines failing",
                    outcome.failing, outcome.total
                ));
            }
        }
    }
}

/// The workload cluster a target's Machine belongs to: `(namespace, cluster)`.
fn cluster_of(t: &Target) -> (&str, &str) {
    (&t.machine.namespace, &t.machine.cluster_name)
}

/// The cycle problem for a NodeNotLinked lookup that failed with `e`, if it is one an operator
/// must fix: a refusal (RBAC on the `<cluster>-kubeconfig` Secret, or the workload cluster's
/// own). A missing Secret or an unreachable workload API is normal while a cluster is created
/// and stays a debug log. Either way the verdict stands.
fn lookup_problem(e: &KubeError) -> Option<String> {
    match e {
        KubeError::Forbidden { .. } => Some(format!(
            "NodeNotLinked guard cannot look for the Machine's Node (the verdict stands): {e}; \
             grant `get` on that Secret or run with --no-workload-node-lookup"
        )),
        KubeError::Refused { .. } => Some(format!(
            "NodeNotLinked guard cannot look for the Machine's Node (the verdict stands): {e}"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_lookup_is_a_problem_and_it_names_the_secret_and_the_way_out() {
        let refused = KubeError::Forbidden {
            what: "Secret ns1/c1-kubeconfig".into(),
            code: 403,
            message: "secrets \"c1-kubeconfig\" is forbidden".into(),
        };
        let p = lookup_problem(&refused).expect("a refusal is a problem");
        assert!(
            p.contains("Secret ns1/c1-kubeconfig: forbidden (403)"),
            "{p}"
        );
        assert!(p.contains("--no-workload-node-lookup"), "{p}");
        assert!(p.contains("the verdict stands"), "{p}");
        for normal in [
            KubeError::NotFound {
                what: "Secret ns1/c1-kubeconfig".into(),
            },
            KubeError::Timeout {
                what: "Nodes of workload cluster ns1/c1".into(),
                after: std::time::Duration::from_secs(5),
            },
            KubeError::Transport {
                what: "Nodes of workload cluster ns1/c1".into(),
                message: "connection refused".into(),
            },
        ] {
            assert_eq!(lookup_problem(&normal), None, "{normal}");
        }
    }
}
