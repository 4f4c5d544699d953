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

/// The probe's state between cycles.
#[derive(Default)]
pub struct Probing {
    /// The prober, the account it calls as (its rate-limit budget is the account's) and the
    /// credentials id and `verify-ssl` it was built with.
    prober: Option<(ProbeKey, Prober)>,
    /// Per VM id (a CloudStack UUID, so unique across scopes; the scope's histories say where
    /// it is polled): the facts of the Machine it belongs to, as of the last cycle.
    facts: HashMap<String, MachineFacts>,
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
                MachineFacts {
                    has_node: t.machine.has_node_ref,
                    deleting: t.machine.deleting,
                    unlinked_node: None,
                },
            );
        }
    }

    /// One probe step over the scopes of the probe key's endpoint.
    pub(super) async fn probe_step(&mut self, now: Timestamp) -> StepOutcome {
        let Some((_, prober)) = self.probing.prober.as_mut() else {
            return StepOutcome::default();
        };
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
        let lookup = |vm: &str| facts.get(vm).cloned();
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
