//! The opt-in guest probe in the controller (docs/guest-probe.md): its key comes from a Secret
//! of its own (`--probe-credentials`), read every cycle so a rotated or fixed key is picked up;
//! it probes only VMs of Machines this cycle judged, in scopes of the key's endpoint. It steps
//! right after each poll (a first flat sample is the moment to ask) and every few seconds
//! between cycles; when an answer changes what a Machine's verdict would be, the next cycle
//! starts at once instead of at the end of the interval.

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;

use super::credentials::{self, Account};
use super::cycle::Controller;
use super::gather::Gathered;
use crate::cloudstack::client::CloudStackClient;
use crate::k8s::objects::MachineView;
use crate::probe::probe_tick;
use crate::probe::{Prober, ScopeHistories, StepOutcome};
use crate::status::ProbeReport;
use crate::verdict::MachineFacts;

/// What the probe's client was built from: a change rebuilds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProbeKey {
    account: Account,
    id: String,
    verify_tls: bool,
}

impl Probing {
    /// The probe's client and its account, for scopes of the same account to share its budget.
    pub(super) fn client(&self) -> Option<(&Account, &CloudStackClient)> {
        self.prober.as_ref().map(|(k, p)| (&k.account, p.client()))
    }
}

/// A VM's Machine as the probe knows it: which object, and its facts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Probed {
    namespace: String,
    name: String,
    uid: Option<String>,
    facts: MachineFacts,
}

/// `p` with the facts of its Machine as the watch has it now (`None`: gone, or replaced by
/// another object of the same name). Between cycles the probe steps every second or so; a
/// Machine that got its Node since the last cycle is not probed (nor its job read) in the
/// meantime.
fn refreshed(p: &Probed, now: Option<&MachineView>) -> Option<MachineFacts> {
    let m = now.filter(|m| m.uid == p.uid)?;
    Some(MachineFacts {
        has_node: m.has_node_ref,
        deleting: m.deleting,
        unlinked_node: p.facts.unlinked_node.clone(),
    })
}

/// The probe's state between cycles.
#[derive(Default)]
pub struct Probing {
    /// The prober, the account it calls as (its rate-limit budget is the account's) and the
    /// credentials id and `verify-ssl` it was built with.
    prober: Option<(ProbeKey, Prober)>,
    /// Per VM id (a CloudStack UUID, so unique across scopes; the scope's histories say where
    /// it is polled): the Machine it belongs to and its facts, as of the last cycle and brought
    /// up to date from the watch at every step ([`refreshed`]).
    facts: HashMap<String, Probed>,
    /// Why the probe key cannot be used (no Secret values in it).
    problem: Option<String>,
}

impl Controller {
    /// Reads the probe's Secret and (re)builds its client when the Secret changed.
    pub(super) async fn refresh_probe_key(&mut self) {
        let Some(secret) = self.args.probe_credentials.clone() else {
            return;
        };
        // The same way from a Secret to a client as the scopes', without the override: the
        // probe's Secret is already the key the operator chose for it (one that may run
        // diagnostics); an --endpoint-credentials key, read-only for listings, may not.
        let resolved = match credentials::read(
            &self.client,
            &self.args,
            &secret.namespace,
            &secret.name,
            false,
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                // Keep a working prober across a failed read; say why a missing one is off.
                self.probing.problem = Some(format!("probe credentials: {e}"));
                return;
            }
        };
        // The same key at the same endpoint: keep the prober (and its jobs in flight).
        let key = ProbeKey {
            account: resolved.account.clone(),
            id: resolved.id.clone(),
            verify_tls: resolved.cfg.verify_tls,
        };
        if self.probing.prober.as_ref().is_some_and(|(k, _)| *k == key) {
            self.probing.problem = None;
            return;
        }
        // One budget per account: with a scope's key the probe draws on the scope's.
        let built = credentials::client_of_account(
            resolved.cfg,
            &key.account,
            self.scopes.values().map(|s| (&s.account, &s.polled.client)),
        )
        .map_err(|e| format!("probe credentials: Secret {secret}: {e}"));
        match built {
            Ok(client) => {
                tracing::info!(endpoint = client.api_url(), "guest probe key loaded");
                self.probing.prober = Some((key, Prober::new(client, self.args.probe.limits())));
                self.probing.problem = None;
            }
            Err(e) => {
                self.probing.prober = None;
                self.probing.problem = Some(e);
            }
        }
    }

    /// Remembers which VMs belong to Machines, and their facts, for the steps until the next
    /// cycle.
    pub(super) fn note_probe_facts(&mut self, g: &Gathered) {
        self.probing.facts.clear();
        for t in &g.targets {
            let (Some(_), Some(id)) = (g.scope_key(t), t.instance_id()) else {
                continue;
            };
            self.probing.facts.insert(
                id.clone(),
                Probed {
                    namespace: t.machine.namespace.clone(),
                    name: t.machine.name.clone(),
                    uid: t.machine.uid.clone(),
                    facts: MachineFacts {
                        has_node: t.machine.has_node_ref,
                        deleting: t.machine.deleting,
                        unlinked_node: None,
                    },
                },
            );
        }
    }

    /// One probe step over the scopes of the probe key's endpoint.
    pub(super) async fn probe_step(&mut self, now: Timestamp) -> StepOutcome {
        let Some((_, prober)) = self.probing.prober.as_mut() else {
            return StepOutcome::default();
        };
        let machines = &self.stores.machines;
        self.probing.facts.retain(|_, p| {
            let now = machines.get(&p.namespace, &p.name);
            match refreshed(p, now.as_deref().map(|r| &*r.view)) {
                Some(facts) => {
                    p.facts = facts;
                    true
                }
                None => false,
            }
        });
        let facts = &self.probing.facts;
        let mut covered: Vec<ScopeHistories<'_>> = Vec::new();
        for (key, scope) in self.scopes.iter_mut() {
            if !scope.in_use || !prober.covers(scope.polled.client.api_url()) {
                continue;
            }
            covered.push(ScopeHistories {
                scope: key,
                histories: &mut scope.polled.observer.histories,
            });
        }
        let lookup = |vm: &str| facts.get(vm).map(|p| p.facts.clone());
        let outcome = prober.step(&mut covered, &lookup, &self.graces, now).await;
        self.metrics.observe_probe(&prober.report());
        outcome
    }

    /// What `/status` shows of the probe; `None` when it is not configured.
    pub(super) fn probe_report(&self) -> Option<ProbeReport> {
        self.args.probe_credentials.as_ref()?;
        let mut r = match &self.probing.prober {
            Some((_, p)) => p.report(),
            None => ProbeReport::default(),
        };
        if let Some(problem) = &self.probing.problem {
            r.last_error = Some(problem.clone());
        }
        Some(r)
    }

    /// Waits `wait` for the next cycle, stepping the probe meanwhile; returns early when an
    /// answer changed what a verdict would be.
    pub async fn wait_probing(&mut self, wait: Duration) {
        let Some(pg) = self.graces.probe.clone() else {
            tokio::time::sleep(wait).await;
            return;
        };
        if self.probing.prober.is_none() {
            tokio::time::sleep(wait).await;
            return;
        }
        let deadline = tokio::time::Instant::now() + wait;
        let tick = probe_tick(pg.spacing);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(tick)).await;
            if self.probe_step(Timestamp::now()).await.evidence_changed {
                tracing::debug!("a probe answer changed the evidence; deciding now");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probed() -> Probed {
        Probed {
            namespace: "ns".into(),
            name: "m-1".into(),
            uid: Some("uid-1".into()),
            facts: MachineFacts {
                unlinked_node: Some("w-1".into()),
                ..MachineFacts::default()
            },
        }
    }

    fn view(uid: &str, has_node_ref: bool, deleting: bool) -> MachineView {
        MachineView {
            namespace: "ns".into(),
            name: "m-1".into(),
            uid: Some(uid.into()),
            has_node_ref,
            deleting,
            ..MachineView::default()
        }
    }

    #[test]
    fn the_facts_follow_the_watched_machine_between_cycles() {
        let p = probed();
        let same = refreshed(&p, Some(&view("uid-1", false, false))).unwrap();
        assert_eq!(same, p.facts);
        let node = refreshed(&p, Some(&view("uid-1", true, false))).unwrap();
        assert!(node.has_node && !node.deleting);
        assert_eq!(node.unlinked_node.as_deref(), Some("w-1"));
        let deleting = refreshed(&p, Some(&view("uid-1", false, true))).unwrap();
        assert!(deleting.deleting);
        // Gone, or another Machine of the same name: not this VM's Machine any more.
        assert_eq!(refreshed(&p, None), None);
        assert_eq!(refreshed(&p, Some(&view("uid-2", false, false))), None);
    }

    #[test]
    fn ticks_follow_the_spacing_within_bounds() {
        assert_eq!(
            probe_tick(jiff::SignedDuration::from_secs(15)),
            Duration::from_secs(1)
        );
        assert_eq!(
            probe_tick(jiff::SignedDuration::from_millis(500)),
            Duration::from_millis(250)
        );
        assert_eq!(
            probe_tick(jiff::SignedDuration::from_mins(2)),
            Duration::from_secs(5)
        );
    }
}
