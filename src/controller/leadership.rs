//! The gate every write passes: the leader confirms its Lease before each condition write,
//! annotation and Event, not once per cycle — a cycle can outlast the Lease (slow CloudStack
//! polls, retries), and a replica that lost it meanwhile must not write a thing.
//!
//! Confirming reads the Lease only when what was last read no longer covers the write
//! ([`lease::may_write`]): a hold renewed at `t` lets writes that end before `t + duration −
//! margin` through without another read, so a cold start's thousands of writes cost a few reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::Mutex;

use crate::k8s::kube_error::{within, KubeError};
use crate::k8s::lease::{self, Hold};

/// Spare time between a write's deadline and the Lease's expiry: clock skew between replicas.
use super::config::LEASE_SKEW_MARGIN as SKEW_MARGIN;

/// How long to wait for the renewer when our hold is too close to its end for a write.
const RENEWAL_WAIT: Duration = Duration::from_secs(1);

/// Why a write may not go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Someone else holds the Lease (or nobody): this replica is done leading.
    Lost(String),
    /// Ours, but not confirmed for long enough (expired, or the Lease could not be read):
    /// nothing is written until it is.
    Unconfirmed(String),
}

impl Refusal {
    pub fn message(&self) -> &str {
        match self {
            Refusal::Lost(why) | Refusal::Unconfirmed(why) => why,
        }
    }
}

/// The Lease this replica leads by.
struct Held {
    leases: Api<Lease>,
    name: String,
    identity: String,
}

/// Confirms leadership before writes. Without leader election every write may go out.
pub struct LeaseGate {
    held: Option<Held>,
    write_timeout: Duration,
    /// The expiry of our hold as last read.
    confirmed_until: Mutex<Option<Timestamp>>,
    lost: AtomicBool,
    /// Why this replica may no longer write at all: the Lease was released (shutdown) or its
    /// renewal failed. Checked before the cached hold, which would still say "ours" — the
    /// Lease's holder is cleared on release, so a successor may already be writing.
    revoked: std::sync::Mutex<Option<String>>,
}

impl LeaseGate {
    /// No leader election (`--no-leader-election`): one replica, every write goes out.
    pub fn unelected(write_timeout: Duration) -> Self {
        Self {
            held: None,
            write_timeout,
            confirmed_until: Mutex::new(None),
            lost: AtomicBool::new(false),
            revoked: std::sync::Mutex::new(None),
        }
    }

    /// Leads by Lease `name` in `leases`'s namespace as `identity`.
    pub fn leading(
        leases: Api<Lease>,
        name: &str,
        identity: &str,
        write_timeout: Duration,
    ) -> Self {
        Self {
            held: Some(Held {
                leases,
                name: name.to_string(),
                identity: identity.to_string(),
            }),
            write_timeout,
            confirmed_until: Mutex::new(None),
            lost: AtomicBool::new(false),
            revoked: std::sync::Mutex::new(None),
        }
    }

    /// No write passes this gate any more, whatever was last read of the Lease: called before
    /// the Lease is released, and when its renewal reports it lost. The first reason stands.
    pub fn revoke(&self, why: &str) {
        let mut revoked = self
            .revoked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        revoked.get_or_insert_with(|| why.to_string());
    }

    fn revoked(&self) -> Option<String> {
        self.revoked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Whether a refusal said the Lease is someone else's.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// `Ok` when a write started now ends before our hold on the Lease can run out; reads the
    /// Lease when what was last read does not cover it. Writers hold the lock while reading,
    /// so concurrent writes share one read.
    pub async fn confirm(&self) -> Result<(), Refusal> {
        if let Some(why) = self.revoked() {
            return Err(Refusal::Lost(why));
        }
        let Some(held) = &self.held else {
            return Ok(());
        };
        if self.lost() {
            return Err(Refusal::Lost("the leader Lease was lost earlier".into()));
        }
        let timeout = SignedDuration::try_from(self.write_timeout).unwrap_or(SignedDuration::MAX);
        let mut until = self.confirmed_until.lock().await;
        if until.is_some_and(|t| lease::may_write(t, Timestamp::now(), timeout, SKEW_MARGIN)) {
            return Ok(());
        }
        // Ours but about to need its renewal: the renewer is due any moment; read once more.
        let mut refusal = self.read(held, timeout, &mut until).await;
        if matches!(&refusal, Err(Refusal::Unconfirmed(why)) if why.contains("too soon")) {
            tokio::time::sleep(RENEWAL_WAIT).await;
            refusal = self.read(held, timeout, &mut until).await;
        }
        // Revoked while the Lease was being read (a release does not wait for this lock).
        if let Some(why) = self.revoked() {
            *until = None;
            return Err(Refusal::Lost(why));
        }
        refusal
    }

    /// Reads the Lease and judges our hold on it, recording its expiry.
    async fn read(
        &self,
        held: &Held,
        timeout: SignedDuration,
        until: &mut Option<Timestamp>,
    ) -> Result<(), Refusal> {
        let what = format!("Lease {}", held.name);
        let read = within(self.write_timeout, what.clone(), async {
            held.leases
                .get(&held.name)
                .await
                .map_err(|e| KubeError::from_kube(what.clone(), &e))
        })
        .await;
        let lease = match read {
            Ok(l) => l,
            Err(e) => {
                return Err(Refusal::Unconfirmed(format!(
                    "cannot confirm the leader Lease: {e}"
                )))
            }
        };
        let now = Timestamp::now();
        match lease::hold(lease.spec.as_ref(), &held.identity, now) {
            Hold::Ours { expires } => {
                *until = Some(expires);
                if lease::may_write(expires, now, timeout, SKEW_MARGIN) {
                    Ok(())
                } else {
                    Err(Refusal::Unconfirmed(format!(
                        "our hold on the leader Lease ends at {}: too soon for a write of up to {}s",
                        crate::verdict::at(expires),
                        self.write_timeout.as_secs()
                    )))
                }
            }
            Hold::Expired(why) => {
                *until = None;
                Err(Refusal::Unconfirmed(why))
            }
            Hold::Lost(why) => {
                *until = None;
                self.lost.store(true, Ordering::SeqCst);
                Err(Refusal::Lost(why))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_revoked_gate_refuses_whatever_it_read_before() {
        let gate = LeaseGate::unelected(Duration::from_secs(5));
        assert_eq!(gate.confirm().await, Ok(()));
        gate.revoke("the leader Lease was released");
        gate.revoke("a later reason");
        assert_eq!(
            gate.confirm().await,
            Err(Refusal::Lost("the leader Lease was released".into()))
        );
    }

    #[tokio::test]
    async fn a_revoked_gate_does_not_trust_its_cached_hold() {
        // A client that reaches nothing: any read of the Lease would fail, so an Ok can only
        // come from the cached expiry.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let gate = LeaseGate::leading(
            Api::namespaced(client, "ns"),
            "l",
            "me",
            Duration::from_secs(1),
        );
        *gate.confirmed_until.lock().await = Some(Timestamp::now() + SignedDuration::from_secs(60));
        assert_eq!(
            gate.confirm().await,
            Ok(()),
            "the cached hold covers a write"
        );
        gate.revoke("the leader Lease was released");
        assert!(matches!(gate.confirm().await, Err(Refusal::Lost(_))));
    }
}
