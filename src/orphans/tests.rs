use super::*;

const SCOPE: &str = "https://cloud/client/api project=- zone=z1";
const GRACE: SignedDuration = SignedDuration::from_mins(15);

fn at(mins: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
}

/// A CloudStackMachine as the watch shows it, in scope [`SCOPE`].
#[derive(Debug, Clone)]
struct MachineSighting {
    machine: Arc<CloudStackMachineRecord>,
    scope: Option<&'static str>,
}

impl MachineSighting {
    fn borrowed(&self) -> SightingRef<'_> {
        SightingRef {
            machine: &self.machine,
            scope: self.scope,
        }
    }

    fn record(&mut self) -> &mut CloudStackMachineRecord {
        Arc::make_mut(&mut self.machine)
    }
}

fn csm(name: &str, instance: Option<&str>) -> MachineSighting {
    MachineSighting {
        machine: Arc::new(CloudStackMachineRecord {
            namespace: "ns".into(),
            name: name.into(),
            instance_id: instance.map(str::to_string),
            failure_domain_name: Some("fd1".into()),
            instance_state: None,
            instance_state_since: None,
            cluster_name: Some("c1".into()),
            deleting: false,
            moving: false,
        }),
        scope: Some(SCOPE),
    }
}

fn cluster(paused: bool, deleting: bool) -> ClusterSighting {
    ClusterSighting {
        namespace: "ns".into(),
        name: "c1".into(),
        paused,
        deleting,
    }
}

/// One cycle: the minute, the CloudStackMachines and Clusters the watches show, the listing
/// (`None`: not listed completely).
type Cycle = (
    i64,
    Vec<MachineSighting>,
    Vec<ClusterSighting>,
    Option<Vec<ListedVm>>,
);

fn vm(id: &str, name: &str, state: VmState) -> ListedVm {
    ListedVm {
        id: id.into(),
        name: name.into(),
        state,
    }
}

/// Feeds `cycles` of (minute, CloudStackMachines, Clusters, listing or None) to a finder and
/// returns it with every orphan newly reported, with the minute it was reported.
fn run(cycles: &[Cycle]) -> (OrphanFinder, Vec<(i64, OrphanReport)>) {
    let mut f = OrphanFinder::new(GRACE);
    let mut reported = Vec::new();
    for (minute, machines, clusters, listed) in cycles {
        let listings = [ScopeListing {
            scope: SCOPE,
            vms: listed.as_deref(),
        }];
        let machines: Vec<SightingRef<'_>> =
            machines.iter().map(MachineSighting::borrowed).collect();
        for o in f.observe(&machines, clusters, &listings, at(*minute)) {
            reported.push((*minute, o));
        }
    }
    (f, reported)
}

/// Minutes 0..=end, one cycle a minute, with the same listing each time.
fn minutes(
    end: i64,
    machines: impl Fn(i64) -> Vec<MachineSighting>,
    clusters: impl Fn(i64) -> Vec<ClusterSighting>,
    listed: impl Fn(i64) -> Option<Vec<ListedVm>>,
) -> Vec<Cycle> {
    (0..=end)
        .map(|m| (m, machines(m), clusters(m), listed(m)))
        .collect()
}

#[test]
fn a_finalizer_removed_by_hand_leaves_an_instance_reported_after_the_grace() {
    // w-1 owns vm-a until minute 5, then its CloudStackMachine is gone; vm-a runs on.
    let cycles = minutes(
        30,
        |m| {
            if m < 5 {
                vec![csm("w-1", Some("vm-a"))]
            } else {
                vec![]
            }
        },
        |_| vec![cluster(false, false)],
        |_| Some(vec![vm("vm-a", "w-1", VmState::Running)]),
    );
    let (f, reported) = run(&cycles);
    assert_eq!(reported.len(), 1);
    let (minute, o) = &reported[0];
    assert_eq!(
        *minute, 20,
        "first seen owned by nothing at 5, grace 15 min"
    );
    assert_eq!(o.kind, OrphanKind::InstanceOfDeleted);
    assert_eq!(o.since, at(5));
    assert_eq!(o.reported_at, Some(at(20)));
    assert_eq!(o.cluster.as_deref(), Some("ns/c1"));
    assert_eq!(o.cloudstack_machine, "ns/w-1");
    assert!(o
        .why
        .contains("was the instance of CloudStackMachine ns/w-1"));
    assert_eq!(f.orphans().count(), 1);
    assert_eq!(f.suspects(), 0);
}

#[test]
fn a_vm_deployed_for_a_machine_deleted_before_recording_it_is_found_by_name() {
    // w-2 is being created (no instance id) until minute 3; its VM shows up at minute 4.
    let cycles = minutes(
        25,
        |m| {
            if m < 3 {
                vec![csm("w-2", None)]
            } else {
                vec![]
            }
        },
        |_| vec![cluster(false, false)],
        |m| {
            Some(if m < 4 {
                vec![]
            } else {
                vec![vm("vm-b", "w-2", VmState::Starting)]
            })
        },
    );
    let (_, reported) = run(&cycles);
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].0, 19);
    assert_eq!(reported[0].1.kind, OrphanKind::NameOfDeleted);
    assert!(reported[0].1.why.contains("before CAPC recorded the VM"));
}

#[test]
fn machines_being_created_or_deleted_own_their_vms() {
    let mut deleting = csm("w-3", Some("vm-c"));
    deleting.record().deleting = true;
    let cycles = minutes(
        40,
        |_| vec![csm("w-2", None), deleting.clone()],
        |_| vec![cluster(false, false)],
        |_| {
            Some(vec![
                // Named after a CloudStackMachine still being created: CAPC adopts it by name.
                vm("vm-b", "w-2", VmState::Running),
                vm("vm-c", "w-3", VmState::Stopping),
            ])
        },
    );
    let (f, reported) = run(&cycles);
    assert!(reported.is_empty(), "{reported:?}");
    assert_eq!(f.suspects(), 0);
}

#[test]
fn a_second_vm_of_a_machines_name_is_no_ones() {
    let cycles = minutes(
        20,
        |_| vec![csm("w-4", Some("vm-d"))],
        |_| vec![cluster(false, false)],
        |_| {
            Some(vec![
                vm("vm-d", "w-4", VmState::Running),
                vm("vm-e", "w-4", VmState::Running),
            ])
        },
    );
    let (_, reported) = run(&cycles);
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].1.vm_id, "vm-e");
    assert_eq!(reported[0].1.kind, OrphanKind::NameTaken);
}

#[test]
fn destroyed_expunging_and_foreign_vms_are_no_remnants() {
    let cycles = minutes(
        30,
        |m| {
            if m < 2 {
                vec![csm("w-5", Some("vm-f")), csm("w-6", Some("vm-g"))]
            } else {
                vec![]
            }
        },
        |_| vec![cluster(false, false)],
        |_| {
            Some(vec![
                vm("vm-f", "w-5", VmState::Expunging),
                vm("vm-g", "w-6", VmState::Destroyed),
                // Never a CloudStackMachine's: someone else's VM in the same project.
                vm("vm-h", "jenkins", VmState::Running),
            ])
        },
    );
    let (_, reported) = run(&cycles);
    assert!(reported.is_empty(), "{reported:?}");
}

#[test]
fn a_scope_not_listed_completely_changes_nothing() {
    // Gone at 1; listed at 2 (suspect since 2); listings fail 3..=30; listed again at 31.
    let cycles = minutes(
        31,
        |m| {
            if m < 1 {
                vec![csm("w-1", Some("vm-a"))]
            } else {
                vec![]
            }
        },
        |_| vec![cluster(false, false)],
        |m| (!(3..=30).contains(&m)).then(|| vec![vm("vm-a", "w-1", VmState::Running)]),
    );
    let (f, reported) = run(&cycles);
    // Neither reported during the failed listings (no listing is no evidence) nor dropped.
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].0, 31);
    assert_eq!(reported[0].1.since, at(1));
    assert_eq!(f.orphans().count(), 1);
}

#[test]
fn a_reported_orphan_clears_once_destroyed_and_only_when_listed() {
    let mut cycles = minutes(
        20,
        |m| {
            if m < 1 {
                vec![csm("w-1", Some("vm-a"))]
            } else {
                vec![]
            }
        },
        |_| vec![cluster(false, false)],
        |_| Some(vec![vm("vm-a", "w-1", VmState::Running)]),
    );
    cycles.push((21, vec![], vec![cluster(false, false)], None));
    let (mut f, reported) = run(&cycles);
    assert_eq!(reported.len(), 1);
    assert_eq!(f.orphans().count(), 1, "a failed listing keeps it");
    let listing = [vm("vm-a", "w-1", VmState::Expunging)];
    let listings = [ScopeListing {
        scope: SCOPE,
        vms: Some(&listing),
    }];
    f.observe(&[], &[cluster(false, false)], &listings, at(22));
    assert_eq!(f.orphans().count(), 0);
}

#[test]
fn a_clusterctl_move_leaves_nothing_behind() {
    let mut marked = csm("w-1", Some("vm-a"));
    marked.record().moving = true;
    // (a) the CloudStackMachine carried delete-for-move when last seen.
    let (_, reported) = run(&minutes(
        30,
        |m| if m < 2 { vec![marked.clone()] } else { vec![] },
        |_| vec![cluster(false, false)],
        |_| Some(vec![vm("vm-a", "w-1", VmState::Running)]),
    ));
    assert!(reported.is_empty());
    // (b) its Cluster is paused (clusterctl pauses it before moving).
    let (_, reported) = run(&minutes(
        30,
        |m| {
            if m < 2 {
                vec![csm("w-1", Some("vm-a"))]
            } else {
                vec![]
            }
        },
        |m| vec![cluster(m >= 1, false)],
        |_| Some(vec![vm("vm-a", "w-1", VmState::Running)]),
    ));
    assert!(reported.is_empty());
    // (c) the whole cluster vanished at once, never seen deleting.
    let (_, reported) = run(&minutes(
        30,
        |m| {
            if m < 2 {
                vec![csm("w-1", Some("vm-a"))]
            } else {
                vec![]
            }
        },
        |m| {
            if m < 2 {
                vec![cluster(false, false)]
            } else {
                vec![]
            }
        },
        |_| Some(vec![vm("vm-a", "w-1", VmState::Running)]),
    ));
    assert!(reported.is_empty());
    // A real deletion (the Cluster seen deleting) that leaves a VM running is reported.
    let (_, reported) = run(&minutes(
        30,
        |m| {
            if m < 2 {
                vec![csm("w-1", Some("vm-a"))]
            } else {
                vec![]
            }
        },
        |m| {
            if m < 3 {
                vec![cluster(false, m >= 1)]
            } else {
                vec![]
            }
        },
        |_| Some(vec![vm("vm-a", "w-1", VmState::Running)]),
    ));
    assert_eq!(reported.len(), 1);
}

#[test]
fn memory_is_bounded_but_kept_while_a_vm_is_suspect() {
    let mut f = OrphanFinder::new(GRACE);
    let none: [ScopeListing<'_>; 1] = [ScopeListing {
        scope: SCOPE,
        vms: Some(&[]),
    }];
    f.observe(&[csm("w-1", None).borrowed()], &[], &none, at(0));
    assert_eq!(f.remembered(), 1);
    assert_eq!(f.scopes_watched().len(), 0, "nothing gone yet");
    f.observe(&[], &[], &none, at(1));
    assert_eq!(f.scopes_watched().into_iter().collect::<Vec<_>>(), [SCOPE]);
    f.observe(&[], &[], &none, at(61));
    assert_eq!(f.remembered(), 0, "forgotten after MEMORY");
    assert!(f.scopes_watched().is_empty());
    // A suspect keeps its CloudStackMachine remembered past MEMORY.
    let mut f = OrphanFinder::new(SignedDuration::from_hours(3));
    let listed = [vm("vm-a", "w-1", VmState::Running)];
    let some = [ScopeListing {
        scope: SCOPE,
        vms: Some(&listed),
    }];
    f.observe(&[csm("w-1", Some("vm-a")).borrowed()], &[], &some, at(0));
    for m in 1..=90 {
        f.observe(&[], &[], &some, at(m));
    }
    assert_eq!(f.suspects(), 1);
    assert_eq!(f.remembered(), 1);
}

#[test]
fn a_vm_in_two_overlapping_listings_counts_as_owned_if_either_says_so() {
    let other = "https://cloud/client/api project=-1 zone=z1";
    let mut f = OrphanFinder::new(SignedDuration::from_secs(1));
    let listed = [vm("vm-a", "w-1", VmState::Running)];
    let listings = [
        ScopeListing {
            scope: other,
            vms: Some(&listed),
        },
        ScopeListing {
            scope: SCOPE,
            vms: Some(&listed),
        },
    ];
    for m in 0..5 {
        let out = f.observe(
            &[csm("w-1", Some("vm-a")).borrowed()],
            &[],
            &listings,
            at(m),
        );
        assert!(out.is_empty());
    }
    // Gone: reported once, in one scope.
    f.observe(&[], &[], &listings, at(5));
    let out = f.observe(&[], &[], &listings, at(6));
    assert_eq!(out.len(), 1);
    assert_eq!(f.orphans().count(), 1);
}

/// The same endpoint before and after its key was rotated: the scope key names the key.
const OLD_KEY: &str = "https://cloud/client/api project=- zone=z1 key=aaaaaaaaaaaa";
const NEW_KEY: &str = "https://cloud/client/api project=- zone=z1 key=bbbbbbbbbbbb";

/// One cycle after a rotation: the old scope still exists (kept for an hour) but is no longer
/// polled; the new one lists `vms`.
fn after_rotation<'a>(vms: &'a [ListedVm]) -> [ScopeListing<'a>; 2] {
    [
        ScopeListing {
            scope: OLD_KEY,
            vms: None,
        },
        ScopeListing {
            scope: NEW_KEY,
            vms: Some(vms),
        },
    ]
}

#[test]
fn a_key_rotation_keeps_name_based_detection_of_machines_gone_under_the_old_key() {
    let mut f = OrphanFinder::new(GRACE);
    let mut w3 = csm("w-3", None);
    w3.scope = Some(OLD_KEY);
    let old = [ScopeListing {
        scope: OLD_KEY,
        vms: Some(&[]),
    }];
    // w-3 is being created under the old key, and deleted before CAPC recorded its VM.
    f.observe(&[w3.borrowed()], &[cluster(false, false)], &old, at(0));
    f.observe(&[], &[cluster(false, false)], &old, at(1));
    // The key is rotated; the VM deployed for w-3 shows up in the new key's listing.
    f.rotated(OLD_KEY, NEW_KEY);
    assert!(
        f.scopes_watched().contains(NEW_KEY),
        "the new scope is listed for the gone CloudStackMachine: {:?}",
        f.scopes_watched()
    );
    let listed = [vm("vm-c", "w-3", VmState::Running)];
    let mut reported = Vec::new();
    for m in 2..=20 {
        reported.extend(
            f.observe(
                &[],
                &[cluster(false, false)],
                &after_rotation(&listed),
                at(m),
            )
            .into_iter()
            .map(|o| (m, o)),
        );
    }
    assert_eq!(reported.len(), 1, "{reported:?}");
    let (minute, o) = &reported[0];
    assert_eq!(
        *minute, 17,
        "the grace runs from the first sighting under the new key"
    );
    assert_eq!(
        (o.kind, o.scope.as_str()),
        (OrphanKind::NameOfDeleted, NEW_KEY)
    );

    // A new leader given the memory knows the rotation too.
    let mut restored = OrphanFinder::new(GRACE);
    assert_eq!(restored.restore(f.memory()), Ok(1));
    let mut again = Vec::new();
    for m in 30..=46 {
        again.extend(restored.observe(
            &[],
            &[cluster(false, false)],
            &after_rotation(&listed),
            at(m),
        ));
    }
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].kind, OrphanKind::NameOfDeleted);
}

#[test]
fn a_rotation_is_forgotten_with_the_machines_remembered_under_the_old_key() {
    let mut f = OrphanFinder::new(GRACE);
    let mut w3 = csm("w-3", None);
    w3.scope = Some(OLD_KEY);
    let nothing = after_rotation(&[]);
    f.observe(&[w3.borrowed()], &[], &nothing, at(0));
    f.rotated(OLD_KEY, NEW_KEY);
    // Rotated back: the walk ends, and both keys stay reachable.
    f.rotated(NEW_KEY, OLD_KEY);
    f.observe(&[], &[], &nothing, at(1));
    assert_eq!(f.memory().rotations.len(), 2);
    assert_eq!(
        f.scopes_watched().into_iter().collect::<Vec<_>>(),
        [OLD_KEY, NEW_KEY]
    );
    f.observe(&[], &[], &nothing, at(62));
    assert_eq!(f.remembered(), 0);
    let m = f.memory();
    assert!(m.rotations.is_empty() && m.scopes.is_empty(), "{m:?}");
}
