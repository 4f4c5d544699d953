//! What the probe last learnt of each network's virtual router, so `listRouters` is asked at
//! most once per poll interval per network (and less often for a network without a Running
//! router). Pure: the lookup itself is the prober's.

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};

/// Poll intervals a network's "no Running router" answer is kept.
pub(super) const NO_ROUTER_KEPT_POLLS: i32 = 5;

/// A network's router (id, name) as last looked up.
#[derive(Debug, Clone)]
struct RouterSeen {
    router: Option<(String, String)>,
    at: Timestamp,
}

#[derive(Debug, Default)]
pub(super) struct RouterSightings {
    by_network: HashMap<String, RouterSeen>,
}

impl RouterSightings {
    /// The router last seen on `network_id`, while that answer is fresh enough to use: one
    /// poll interval for a router, a few for "none" (a network without a Running router
    /// rarely gets one soon).
    pub(super) fn fresh(
        &self,
        network_id: &str,
        poll_interval: SignedDuration,
        now: Timestamp,
    ) -> Option<Option<(String, String)>> {
        let seen = self.by_network.get(network_id)?;
        let keep = if seen.router.is_some() {
            poll_interval
        } else {
            poll_interval * NO_ROUTER_KEPT_POLLS
        };
        (now.duration_since(seen.at) < keep).then(|| seen.router.clone())
    }

    pub(super) fn record(
        &mut self,
        network_id: &str,
        router: Option<(String, String)>,
        now: Timestamp,
    ) {
        self.by_network
            .insert(network_id.to_string(), RouterSeen { router, at: now });
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.by_network.is_empty()
    }

    /// Drops sightings too old to be used again (networks come and go with clusters).
    pub(super) fn forget_old(&mut self, poll_interval: SignedDuration, now: Timestamp) {
        let kept = poll_interval * NO_ROUTER_KEPT_POLLS;
        self.by_network
            .retain(|_, seen| now.duration_since(seen.at) < kept);
    }
}
