use super::*;

fn at(mins: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + mins * 60).unwrap()
}

fn object(kind: &str, name: &str) -> ObjectRecord {
    let group = match kind {
        "Cluster" | "Machine" | "MachineSet" | "MachineDeployment" => "cluster.x-k8s.io",
        "KubeadmConfig" => "bootstrap.cluster.x-k8s.io",
        _ => "infrastructure.cluster.x-k8s.io",
    };
    ObjectRecord {
        group: group.into(),
        kind: kind.into(),
        namespace: "ns".into(),
        name: name.into(),
        uid: uid_of(&format!("uid-{kind}-{name}")),
        deleting_since: None,
        finalizers: Vec::new(),
        controller: None,
        cluster: (kind != "Cluster").then(|| "c1".to_string()),
        paused: false,
        moving: false,
    }
}

fn owned_by(mut o: ObjectRecord, owner: &ObjectRecord) -> ObjectRecord {
    o.controller = Some(OwnerRef {
        kind: owner.kind.to_string(),
        name: owner.name.clone(),
        uid: owner.uid,
    });
    o
}

fn deleting(mut o: ObjectRecord, since: i64, finalizer: &str) -> ObjectRecord {
    o.deleting_since = Some(at(since));
    o.finalizers = vec![finalizer.to_string()];
    o
}

fn watched() -> HashSet<&'static str> {
    [
        "Cluster",
        "Machine",
        "MachineSet",
        "KubeadmConfig",
        "CloudStackMachine",
    ]
    .into_iter()
    .collect()
}

/// Runs a finder over minutes `0..=end` with the objects of each minute; returns what each
/// minute reported.
fn run(
    end: i64,
    objects: impl Fn(i64) -> Vec<ObjectRecord>,
    vms: &HashMap<String, VmFacts>,
) -> Vec<Vec<Remnant>> {
    let mut f = RemnantFinder::new(DEFAULT_GRACE);
    (0..=end)
        .map(|m| f.observe(&objects(m), &watched(), vms, at(m)))
        .collect()
}

fn names(r: &[Remnant]) -> Vec<(String, RemnantReason)> {
    r.iter()
        .map(|r| (format!("{}/{}", r.kind, r.name), r.reason))
        .collect()
}

#[test]
fn a_cloudstack_machine_whose_destroy_keeps_failing_is_stuck_deleting_after_the_grace() {
    let cluster = object("Cluster", "c1");
    let csm = deleting(
        object("CloudStackMachine", "w-1"),
        0,
        "cloudstackmachine.infrastructure.cluster.x-k8s.io",
    );
    let vms = HashMap::from([(
        format!("{}/{}", csm.namespace, csm.name),
        VmFacts {
            vm_id: "vm-a".into(),
            state: Some("Running".into()),
            last_error: Some("destroyVirtualMachine: 530 host in maintenance".into()),
        },
    )]);
    let out = run(16, |_| vec![cluster.clone(), csm.clone()], &vms);
    assert!(out[14].is_empty(), "within the grace: {:?}", out[14]);
    let r = &out[15];
    assert_eq!(
        names(r),
        [("CloudStackMachine/w-1".into(), RemnantReason::StuckDeleting)]
    );
    assert_eq!(r[0].since, at(0));
    assert_eq!(r[0].related_vm.as_deref(), Some("vm-a"));
    assert_eq!(r[0].cluster.as_deref(), Some("ns/c1"));
    assert!(
        r[0].why
            .contains("last destroy failed: destroyVirtualMachine"),
        "{}",
        r[0].why
    );
    assert_eq!(
        r[0].blocking_finalizers,
        ["cloudstackmachine.infrastructure.cluster.x-k8s.io"]
    );
}

#[test]
fn a_cluster_stuck_behind_one_child_names_it() {
    let cluster = deleting(object("Cluster", "c1"), 0, "cluster.cluster.x-k8s.io");
    let machine = deleting(object("Machine", "m-1"), 0, "machine.cluster.x-k8s.io");
    let out = run(
        20,
        |_| vec![cluster.clone(), machine.clone()],
        &HashMap::new(),
    );
    let r = &out[20];
    assert_eq!(
        names(r),
        [
            ("Cluster/c1".into(), RemnantReason::StuckDeleting),
            ("Machine/m-1".into(), RemnantReason::StuckDeleting)
        ]
    );
    assert!(r[0].why.contains("Machine m-1"), "{}", r[0].why);
    // The Cluster waits for a child: removing its finalizer is not the way; the Machine
    // waits for nothing else, so its finalizer removal is offered, with what it skips.
    assert!(commands(&r[0]).iter().all(|c| c.warning.is_none()));
    let last = commands(&r[1]).pop().unwrap();
    assert!(
        last.line.contains("patch machine.cluster.x-k8s.io m-1"),
        "{}",
        last.line
    );
    assert!(last.warning.unwrap().contains("will not drain the Node"));
}

#[test]
fn without_finalizers_or_within_the_grace_a_deletion_is_no_remnant() {
    // The garbage collector working through a foreground deletion: within the grace.
    let mut fg = deleting(object("MachineSet", "ms"), 0, "foregroundDeletion");
    fg.cluster = Some("c1".into());
    let mut bare = object("Machine", "m-2");
    bare.deleting_since = Some(at(0));
    let cluster = object("Cluster", "c1");
    let out = run(
        14,
        |_| vec![cluster.clone(), fg.clone(), bare.clone()],
        &HashMap::new(),
    );
    assert!(out.iter().all(Vec::is_empty), "{out:?}");
}

#[test]
fn an_object_whose_owner_is_gone_is_reported_a_grace_after_it_was_first_seen_so() {
    let cluster = object("Cluster", "c1");
    let ms = object("MachineSet", "ms");
    let machine = owned_by(object("Machine", "m-1"), &ms);
    // The owner exists for 5 minutes, then it is gone.
    let out = run(
        21,
        |m| {
            let mut v = vec![cluster.clone(), machine.clone()];
            if m < 5 {
                v.push(ms.clone());
            }
            v
        },
        &HashMap::new(),
    );
    assert!(out[19].is_empty(), "{:?}", out[19]);
    assert_eq!(
        names(&out[20]),
        [("Machine/m-1".into(), RemnantReason::OwnerGone)]
    );
    assert_eq!(out[20][0].since, at(5));
    assert!(commands(&out[20][0]).iter().all(|c| c.warning.is_none()));
}

#[test]
fn an_owner_that_comes_back_or_that_the_shim_does_not_watch_is_not_gone() {
    let cluster = object("Cluster", "c1");
    let ms = object("MachineSet", "ms");
    let machine = owned_by(object("Machine", "m-1"), &ms);
    // Missing for 10 minutes, back, missing again for 10: never a grace in a row.
    let out = run(
        40,
        |m| {
            let mut v = vec![cluster.clone(), machine.clone()];
            if (10..12).contains(&m) || m < 1 {
                v.push(ms.clone());
            }
            v
        },
        &HashMap::new(),
    );
    assert!(out.iter().take(27).all(Vec::is_empty));
    // An owner of a kind not watched (here a KubeadmControlPlane) is never called gone.
    let kcp = object("KubeadmControlPlane", "kcp");
    let cp = owned_by(object("Machine", "cp-1"), &kcp);
    let out = run(40, |_| vec![cluster.clone(), cp.clone()], &HashMap::new());
    assert!(out.iter().all(Vec::is_empty), "{out:?}");
}

#[test]
fn an_object_labelled_for_a_cluster_that_does_not_exist_is_dangling() {
    let config = object("KubeadmConfig", "cfg");
    let out = run(15, |_| vec![config.clone()], &HashMap::new());
    assert!(out[14].is_empty());
    assert_eq!(
        names(&out[15]),
        [("KubeadmConfig/cfg".into(), RemnantReason::ClusterGone)]
    );
    // Created before its Cluster (applied together, the Cluster a few minutes later).
    let out = run(
        30,
        |m| {
            let mut v = vec![config.clone()];
            if m >= 3 {
                v.push(object("Cluster", "c1"));
            }
            v
        },
        &HashMap::new(),
    );
    assert!(out.iter().all(Vec::is_empty), "{out:?}");
}

#[test]
fn a_clusterctl_move_leaves_nothing_behind() {
    // The source objects carry delete-for-move while they go.
    let mut cluster = deleting(object("Cluster", "c1"), 0, "cluster.cluster.x-k8s.io");
    cluster.moving = true;
    let mut machine = deleting(object("Machine", "m-1"), 0, "machine.cluster.x-k8s.io");
    machine.moving = true;
    let out = run(
        30,
        |_| vec![cluster.clone(), machine.clone()],
        &HashMap::new(),
    );
    assert!(out.iter().all(Vec::is_empty), "{out:?}");
    // In the target, objects are created with the Cluster paused, before their owners are
    // linked again.
    let mut paused = object("Cluster", "c1");
    paused.paused = true;
    let ms = object("MachineSet", "ms");
    let orphaned = owned_by(object("Machine", "m-2"), &ms);
    let out = run(
        30,
        |_| vec![paused.clone(), orphaned.clone()],
        &HashMap::new(),
    );
    assert!(out.iter().all(Vec::is_empty), "{out:?}");
}

#[test]
fn a_stuck_deletion_in_a_paused_cluster_says_so() {
    let mut cluster = object("Cluster", "c1");
    cluster.paused = true;
    let machine = deleting(object("Machine", "m-1"), 0, "machine.cluster.x-k8s.io");
    let out = run(
        15,
        |_| vec![cluster.clone(), machine.clone()],
        &HashMap::new(),
    );
    assert_eq!(
        names(&out[15]),
        [("Machine/m-1".into(), RemnantReason::StuckDeleting)]
    );
    assert!(
        out[15][0].why.contains("Cluster is paused"),
        "{}",
        out[15][0].why
    );
}

#[test]
fn the_memory_holds_only_what_dangles_now() {
    let ms = object("MachineSet", "ms");
    let machine = owned_by(object("Machine", "m-1"), &ms);
    let mut f = RemnantFinder::new(DEFAULT_GRACE);
    f.observe(
        std::slice::from_ref(&machine),
        &watched(),
        &HashMap::new(),
        at(0),
    );
    assert_eq!(f.dangling_since.len(), 2, "owner and Cluster missing");
    f.observe::<ObjectRecord>(&[], &watched(), &HashMap::new(), at(1));
    assert!(f.dangling_since.is_empty());
}
