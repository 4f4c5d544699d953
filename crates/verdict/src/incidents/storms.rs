//! Generated fleets and failure storms for the incident finder's benchmark (`make bench`,
//! section "incidents") and its tests: seeded, pure, no I/O. Shared here so that the
//! benchmark and the tests measure the same thing.
//!
//! A fleet of `n` VMs: 1–3 zones, each with 1–2 pods of 1–2 CloudStack clusters; about one
//! host per 20 VMs (at least 4), spread over the clusters; VMs placed on hosts at random (their
//! zone, pod and cluster follow the host); one guest network per about 25 VMs of a zone, nine
//! in ten with a Running virtual router on a random host of the zone; four templates used by
//! 50/25/15/10 % of the VMs and three offerings by 60/30/10 %, independently of everything else.
//!
//! A storm of one [`StormKind`] picks one value with at least [`MIN_CAUSE_VMS`] VMs and fails
//! its VMs, except a random 0–15 % of them that stay healthy (not judged yet, or not hit),
//! then adds 0–5 independent failures among the other VMs as noise. A host storm also turns
//! the host `Offline` or `Disconnected` (or unknown: a key that cannot see hosts); a router
//! storm stops the router (no host); a network storm leaves the router Running (the uplink is
//! gone, not the router). Independent failures: the same fleet shapes with `k` VMs failing
//! at random.

use serde::Serialize;

use super::{find, CauseKind, Policy, RouterFacts, Thing, VmFacts};
use cloudstack_api::model::HostControlState;

/// A cause value needs at least this many VMs to make a storm (twice the default threshold:
/// a smaller one minus its healthy share can fall below the threshold and is no incident).
pub const MIN_CAUSE_VMS: usize = 10;

/// The kinds of storm the benchmark makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StormKind {
    Host,
    Router,
    Network,
    Template,
    Zone,
}

impl StormKind {
    pub const ALL: [StormKind; 5] = [
        Self::Host,
        Self::Router,
        Self::Network,
        Self::Template,
        Self::Zone,
    ];

    pub fn as_str(self) -> &'static str {
        self.cause_kind().as_str()
    }

    pub fn cause_kind(self) -> CauseKind {
        match self {
            Self::Host => CauseKind::Host,
            Self::Router => CauseKind::Router,
            Self::Network => CauseKind::Network,
            Self::Template => CauseKind::Template,
            Self::Zone => CauseKind::Zone,
        }
    }
}

/// SplitMix64: small, seeded, good enough to draw fleets.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index drawn with the given weights.
    fn weighted(&mut self, weights: &[usize]) -> usize {
        let mut x = self.below(weights.iter().sum());
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
}

/// A fleet, all healthy, and the shape a storm needs to pick from.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub vms: Vec<VmFacts>,
    zones: usize,
}

const TEMPLATE_SHARES: [usize; 4] = [50, 25, 15, 10];
const OFFERING_SHARES: [usize; 3] = [60, 30, 10];

/// A healthy fleet of `n` VMs in `min_zones..=3` zones.
pub fn fleet(rng: &mut Rng, n: usize, min_zones: usize) -> Fleet {
    let zones = min_zones.max(1) + rng.below(4 - min_zones.clamp(1, 3));
    // (zone, pod, cluster) per CloudStack cluster.
    let mut clusters = Vec::new();
    for z in 0..zones {
        for p in 0..1 + rng.below(2) {
            for c in 0..1 + rng.below(2) {
                clusters.push((z, p, c));
            }
        }
    }
    let hosts = (n / 20).max(4).max(clusters.len());
    // Host h is in cluster h % clusters (every cluster gets at least one).
    let host_cluster = |h: usize| clusters[h % clusters.len()];
    // Networks per zone, each with its router (or none) on a host of the zone.
    let per_zone = (n / zones / 25).max(1);
    let mut networks: Vec<(usize, Option<usize>)> = Vec::new();
    for z in 0..zones {
        let zone_hosts: Vec<usize> = (0..hosts).filter(|h| host_cluster(*h).0 == z).collect();
        for _ in 0..per_zone {
            let router = (rng.below(10) != 0).then(|| zone_hosts[rng.below(zone_hosts.len())]);
            networks.push((z, router));
        }
    }
    let mut vms = Vec::with_capacity(n);
    for _ in 0..n {
        let h = rng.below(hosts);
        let (z, p, c) = host_cluster(h);
        let zone_nets: Vec<usize> = (0..networks.len())
            .filter(|i| networks[*i].0 == z)
            .collect();
        let net = zone_nets[rng.below(zone_nets.len())];
        let t = rng.weighted(&TEMPLATE_SHARES);
        let o = rng.weighted(&OFFERING_SHARES);
        vms.push(VmFacts {
            failing: false,
            host: Some(Thing::named(format!("host-{h}"), format!("h{h}"))),
            host_state: Some(HostControlState::Enabled),
            cluster: Some(Thing::new(format!("cluster-{z}-{p}-{c}"))),
            pod: Some(Thing::new(format!("pod-{z}-{p}"))),
            network: Some(Thing::new(format!("net-{net}"))),
            router: networks[net].1.map(|rh| RouterFacts {
                router: Thing::named(format!("router-{net}"), format!("r-{net}-VM")),
                state: Some("Running".to_string()),
                host: Some(format!("host-{rh}")),
            }),
            template: Some(Thing::new(format!("template-{t}"))),
            offering: Some(Thing::new(format!("offering-{o}"))),
            zone: Some(Thing::named(format!("zone-{z}"), format!("z{z}"))),
        });
    }
    Fleet { vms, zones }
}

/// A storm: the fleet with its failing VMs, and the cause the finder should name.
#[derive(Debug, Clone)]
pub struct Storm {
    pub vms: Vec<VmFacts>,
    pub kind: StormKind,
    /// The cause's id.
    pub cause: String,
    /// Independent failures added as noise.
    pub noise: usize,
}

fn id_of(vm: &VmFacts, kind: StormKind) -> Option<&str> {
    value_of(vm, kind.cause_kind())
}

fn value_of(vm: &VmFacts, kind: CauseKind) -> Option<&str> {
    vm.attributes()
        .find(|(k, _)| *k == kind)
        .map(|(_, t)| t.id.as_str())
}

/// Whether two values are held by exactly the same VMs: nothing in the listings tells them
/// apart (a zone with one cluster, a cluster with one host, a router and its network).
pub fn same_vms(vms: &[VmFacts], a: (CauseKind, &str), b: (CauseKind, &str)) -> bool {
    vms.iter()
        .all(|v| (value_of(v, a.0) == Some(a.1)) == (value_of(v, b.0) == Some(b.1)))
}

/// How hard the storms are: the most of the cause's VMs that stay healthy and the most
/// independent failures added (each drawn uniformly up to it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Harshness {
    pub max_stay_healthy: f64,
    pub max_noise: usize,
}

/// The benchmark's storms: 0–15 % stay healthy, 0–5 independent failures.
pub const USUAL: Harshness = Harshness {
    max_stay_healthy: 0.15,
    max_noise: 5,
};

/// A storm of `kind` in a fresh fleet of `n` VMs; `None` when the fleet has no value of that
/// kind with [`MIN_CAUSE_VMS`] VMs (the caller draws again).
pub fn storm(rng: &mut Rng, n: usize, kind: StormKind) -> Option<Storm> {
    storm_with(rng, n, kind, &USUAL)
}

/// [`storm`] at another [`Harshness`].
pub fn storm_with(rng: &mut Rng, n: usize, kind: StormKind, h: &Harshness) -> Option<Storm> {
    let mut fleet = fleet(rng, n, if kind == StormKind::Zone { 2 } else { 1 });
    debug_assert!(kind != StormKind::Zone || fleet.zones >= 2);
    // Values with enough VMs, in first-seen order (deterministic).
    let mut counts: Vec<(String, usize)> = Vec::new();
    for vm in &fleet.vms {
        if let Some(id) = id_of(vm, kind) {
            match counts.iter_mut().find(|(v, _)| v == id) {
                Some((_, c)) => *c += 1,
                None => counts.push((id.to_string(), 1)),
            }
        }
    }
    counts.retain(|(_, c)| *c >= MIN_CAUSE_VMS);
    if counts.is_empty() {
        return None;
    }
    let cause = counts[rng.below(counts.len())].0.clone();
    let stay_healthy = rng.unit() * h.max_stay_healthy;
    let host_state = match rng.below(3) {
        0 => Some(HostControlState::Offline),
        1 => Some(HostControlState::Other("Disconnected".to_string())),
        _ => None,
    };
    for vm in &mut fleet.vms {
        if id_of(vm, kind) != Some(cause.as_str()) {
            continue;
        }
        match kind {
            StormKind::Host => vm.host_state = host_state.clone(),
            StormKind::Router => {
                if let Some(r) = &mut vm.router {
                    r.state = Some("Stopped".to_string());
                    r.host = None;
                }
            }
            _ => {}
        }
        vm.failing = rng.unit() >= stay_healthy;
    }
    let noise = rng.below(h.max_noise + 1);
    add_failures(rng, &mut fleet.vms, noise);
    Some(Storm {
        vms: fleet.vms,
        kind,
        cause,
        noise,
    })
}

/// Turns `k` healthy VMs (at random) failing; fewer when there are not that many.
fn add_failures(rng: &mut Rng, vms: &mut [VmFacts], k: usize) {
    let mut healthy: Vec<usize> = (0..vms.len()).filter(|i| !vms[*i].failing).collect();
    for _ in 0..k.min(healthy.len()) {
        let i = healthy.swap_remove(rng.below(healthy.len()));
        vms[i].failing = true;
    }
}

/// A fresh fleet of `n` VMs with `k` failing independently.
pub fn independent(rng: &mut Rng, n: usize, k: usize) -> Vec<VmFacts> {
    let mut fleet = fleet(rng, n, 1);
    add_failures(rng, &mut fleet.vms, k);
    fleet.vms
}

/// Fleet sizes the benchmark draws from, each as often.
pub const SIZES: [usize; 5] = [100, 250, 500, 1_000, 2_000];

/// The benchmark's numbers for one storm kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KindScore {
    pub storms: usize,
    /// Storms with a cause named, and with the right one: the true cause, or a value held by
    /// exactly the same VMs ([`same_vms`]: nothing the finder sees tells them apart).
    pub named: usize,
    pub correct: usize,
    /// Of the right ones, those naming the true cause itself.
    pub exact: usize,
    /// The first few wrong or missing answers, for the report.
    pub misses: Vec<String>,
    /// Failing VMs per storm (min, max).
    pub failing_min: usize,
    pub failing_max: usize,
}

/// The benchmark's numbers for one policy.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Score {
    pub kinds: Vec<(StormKind, KindScore)>,
    /// Sets of independent failures, one per storm, of the storm's size in a fleet of its size.
    pub independent_sets: usize,
    /// Of those, sets where a cause was named (must be 0).
    pub false_causes: usize,
    /// Storms that declared no incident at all (fewer failing than the threshold).
    pub no_incident: usize,
    /// Sets of exactly the threshold's number of independent failures (the smallest
    /// incident, where chance sharing is likeliest), `per_kind` per fleet size, and those
    /// where a cause was named.
    pub threshold_sets: usize,
    pub threshold_false_causes: usize,
}

impl Score {
    pub fn named(&self) -> usize {
        self.kinds.iter().map(|(_, k)| k.named).sum()
    }

    pub fn correct(&self) -> usize {
        self.kinds.iter().map(|(_, k)| k.correct).sum()
    }

    pub fn exact(&self) -> usize {
        self.kinds.iter().map(|(_, k)| k.exact).sum()
    }

    pub fn storms(&self) -> usize {
        self.kinds.iter().map(|(_, k)| k.storms).sum()
    }

    /// Right causes among the named ones (1 when none was named).
    pub fn precision(&self) -> f64 {
        match self.named() {
            0 => 1.0,
            n => self.correct() as f64 / n as f64,
        }
    }

    /// Storms whose cause was named, of all storms.
    pub fn recall(&self) -> f64 {
        match self.storms() {
            0 => 0.0,
            n => self.correct() as f64 / n as f64,
        }
    }
}

/// Runs `per_kind` storms of every kind (sizes cycling through [`SIZES`]) and as many sets of
/// independent failures of the same sizes through [`find`] with `policy`.
pub fn evaluate(seed: u64, per_kind: usize, policy: &Policy) -> Score {
    evaluate_with(seed, per_kind, policy, &USUAL)
}

/// [`evaluate`] with storms of another [`Harshness`].
pub fn evaluate_with(seed: u64, per_kind: usize, policy: &Policy, h: &Harshness) -> Score {
    let mut rng = Rng::new(seed);
    let mut score = Score::default();
    for kind in StormKind::ALL {
        let mut ks = KindScore {
            failing_min: usize::MAX,
            ..KindScore::default()
        };
        let mut i = 0;
        while ks.storms < per_kind {
            let n = SIZES[i % SIZES.len()];
            i += 1;
            let Some(s) = storm_with(&mut rng, n, kind, h) else {
                continue;
            };
            ks.storms += 1;
            let failing = s.vms.iter().filter(|v| v.failing).count();
            ks.failing_min = ks.failing_min.min(failing);
            ks.failing_max = ks.failing_max.max(failing);
            let truth = (kind.cause_kind(), s.cause.as_str());
            let miss = match find(&s.vms, policy, false) {
                None => {
                    score.no_incident += 1;
                    Some(format!("{n} VMs, {failing} failing: no incident"))
                }
                Some(inc) => match &inc.cause {
                    Some(c) if (c.kind, c.id.as_str()) == truth => {
                        ks.named += 1;
                        ks.correct += 1;
                        ks.exact += 1;
                        None
                    }
                    Some(c) if same_vms(&s.vms, (c.kind, &c.id), truth) => {
                        ks.named += 1;
                        ks.correct += 1;
                        None
                    }
                    Some(_) => {
                        ks.named += 1;
                        Some(format!("{n} VMs, noise {}: {}", s.noise, inc.summary()))
                    }
                    None => Some(format!("{n} VMs, noise {}: {}", s.noise, inc.summary())),
                },
            };
            if let Some(m) = miss {
                if ks.misses.len() < 5 {
                    ks.misses.push(m);
                }
            }
            // The same number of failures, independent, in a fleet of the same size.
            let ind = independent(&mut rng, n, failing);
            score.independent_sets += 1;
            if find(&ind, policy, true).is_some_and(|inc| inc.cause.is_some()) {
                score.false_causes += 1;
            }
        }
        if ks.storms == 0 {
            ks.failing_min = 0;
        }
        score.kinds.push((kind, ks));
    }
    for n in SIZES {
        for _ in 0..per_kind {
            let ind = independent(&mut rng, n, policy.min_failing.max(1));
            score.threshold_sets += 1;
            if find(&ind, policy, false).is_some_and(|inc| inc.cause.is_some()) {
                score.threshold_false_causes += 1;
            }
        }
    }
    score
}
