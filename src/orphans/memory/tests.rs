use super::*;
use crate::orphans::{ClusterSighting, ScopeListing, SightingRef};
use crate::scope::ListedVm;
use jiff::SignedDuration;

const SCOPE: &str = "https://cloud/client/api project=- zone=z1 key=abc";

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn csm(name: &str, id: &str) -> Arc<CloudStackMachineRecord> {
    Arc::new(CloudStackMachineRecord {
        namespace: "ns".into(),
        name: name.into(),
        instance_id: Some(id.into()),
        failure_domain_name: Some("fd1".into()),
        instance_state: None,
        instance_state_since: None,
        cluster_name: Some("c1".into()),
        deleting: false,
        moving: false,
    })
}

fn vm(id: &str, name: &str) -> ListedVm {
    ListedVm {
        id: id.into(),
        name: name.into(),
        state: crate::cloudstack::model::VmState::Running,
    }
}

fn cluster() -> Vec<ClusterSighting> {
    vec![ClusterSighting {
        namespace: "ns".into(),
        name: "c1".into(),
        paused: false,
        deleting: false,
    }]
}

fn cycle(
    f: &mut OrphanFinder,
    csms: &[Arc<CloudStackMachineRecord>],
    vms: &[ListedVm],
    now: Timestamp,
) -> usize {
    let sightings: Vec<SightingRef<'_>> = csms
        .iter()
        .map(|c| SightingRef {
            machine: c,
            scope: Some(SCOPE),
        })
        .collect();
    f.observe(
        &sightings,
        &cluster(),
        &[ScopeListing {
            scope: SCOPE,
            vms: Some(vms),
        }],
        now,
    );
    f.orphans().count()
}

#[test]
fn a_new_finder_given_the_memory_reports_the_vm_of_a_machine_deleted_while_no_shim_watched() {
    let grace = SignedDuration::from_secs(60);
    let (keep, gone) = (csm("m-keep", "id-keep"), csm("m-gone", "id-gone"));
    let vms = [vm("id-keep", "m-keep"), vm("id-gone", "m-gone")];
    let mut before = OrphanFinder::new(grace);
    assert_eq!(
        cycle(&mut before, &[keep.clone(), gone.clone()], &vms, at(0)),
        0
    );
    let stored = encode(&before.memory(), 1 << 20).bytes;

    // The shim is down while m-gone is deleted (its finalizer removed by hand); a new
    // process starts with only m-keep to see.
    let mut fresh = OrphanFinder::new(grace);
    assert_eq!(
        cycle(&mut fresh, std::slice::from_ref(&keep), &vms, at(100)),
        0
    );
    assert_eq!(
        cycle(&mut fresh, std::slice::from_ref(&keep), &vms, at(200)),
        0,
        "without the memory, nothing"
    );

    let mut after = OrphanFinder::new(grace);
    assert_eq!(after.restore(decode(&stored).unwrap()), Ok(2));
    assert_eq!(
        cycle(&mut after, std::slice::from_ref(&keep), &vms, at(100)),
        0,
        "within the grace"
    );
    assert_eq!(cycle(&mut after, &[keep], &vms, at(161)), 1);
    let o = after.orphans().next().unwrap();
    assert_eq!(
        (o.vm_id.as_str(), o.kind),
        ("id-gone", crate::status::OrphanKind::InstanceOfDeleted)
    );
    assert_eq!(o.cluster.as_deref(), Some("ns/c1"));
}

#[test]
fn the_bound_leaves_out_the_longest_gone_first_and_says_how_many() {
    let mut m = Memory {
        version: VERSION,
        scopes: vec![SCOPE.into()],
        ..Default::default()
    };
    for i in 0..2000 {
        m.machines.push(MachineEntry {
            namespace: "ns".into(),
            name: format!("m-{i}"),
            instance_id: Some(format!(
                "{:08x}-1111-2222-3333-{:012x}",
                i * 7919,
                i * 104729
            )),
            cluster: Some("c1".into()),
            scope: Some(0),
            gone_since: (i % 2 == 1).then(|| at(i)),
            deleting: false,
            moving: false,
        });
    }
    let whole = encode(&m, 1 << 20).bytes;
    assert_eq!(decode(&whole).unwrap().dropped, 0);
    let bound = whole.len() * 3 / 4;
    let bounded = encode(&m, bound).bytes;
    assert!(bounded.len() <= bound);
    let back = decode(&bounded).unwrap();
    assert!(back.dropped > 0 && back.dropped + back.machines.len() == 2000);
    // Every present one was kept; of the gone ones, the most recently gone.
    assert_eq!(
        back.machines
            .iter()
            .filter(|e| e.gone_since.is_none())
            .count(),
        1000
    );
    let kept: std::collections::HashSet<&str> =
        back.machines.iter().map(|e| e.name.as_str()).collect();
    let oldest_kept = back.machines.iter().filter_map(|e| e.gone_since).min();
    for e in m
        .machines
        .iter()
        .filter(|e| !kept.contains(e.name.as_str()))
    {
        assert!(
            e.gone_since.is_some() && e.gone_since < oldest_kept,
            "{e:?} left out"
        );
    }
}

#[test]
fn the_bound_holds_when_what_is_not_a_machine_alone_exceeds_it() {
    let bound = 4 * 1024;
    let mut m = Memory {
        version: VERSION,
        ..Default::default()
    };
    // Scopes no CloudStackMachine refers to any more, and Clusters by the thousand (random
    // enough names that gzip cannot fold them away): far over the bound on their own.
    let noise = |i: usize| {
        format!(
            "{:016x}",
            (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        )
    };
    m.scopes.push(SCOPE.into());
    for i in 0..500 {
        m.scopes.push(format!(
            "https://cloud-{}/client/api project=- zone=z key=k",
            noise(i)
        ));
    }
    for i in 0..2000 {
        m.clusters.push(ClusterEntry {
            namespace: "ns".into(),
            name: format!("c-{}", noise(i + 1000)),
            paused: false,
            deleting_seen: i % 3 == 0,
            gone_since: (i % 2 == 1).then(|| at(i as i64)),
        });
    }
    m.clusters.push(ClusterEntry {
        namespace: "ns".into(),
        name: "c1".into(),
        paused: false,
        deleting_seen: true,
        gone_since: None,
    });
    m.machines.push(MachineEntry {
        namespace: "ns".into(),
        name: "m-gone".into(),
        instance_id: Some("id-gone".into()),
        cluster: Some("c1".into()),
        scope: Some(0),
        gone_since: Some(at(5)),
        deleting: false,
        moving: false,
    });
    assert!(
        gzip(&Memory {
            machines: vec![],
            ..m.clone()
        })
        .len()
            > 4 * bound
    );
    let e = encode(&m, bound);
    assert!(
        e.bytes.len() <= bound,
        "{} bytes over {bound}",
        e.bytes.len()
    );
    let back = decode(&e.bytes).unwrap();
    // What the CloudStackMachine needs is kept: it, its scope and its Cluster.
    assert_eq!((back.machines.len(), back.dropped), (1, 0));
    assert_eq!(back.scopes, vec![SCOPE.to_string()]);
    assert_eq!(back.machines[0].scope, Some(0));
    assert!(back
        .clusters
        .iter()
        .any(|c| c.name == "c1" && c.deleting_seen));

    // Without CloudStackMachines, the Clusters alone: still within the bound, the present
    // ones kept before the gone ones.
    m.machines.clear();
    for bound in [512, 2048, 16 * 1024] {
        let e = encode(&m, bound);
        assert!(
            e.bytes.len() <= bound,
            "{} bytes over {bound}",
            e.bytes.len()
        );
        let back = decode(&e.bytes).unwrap();
        assert!(back.clusters.len() < m.clusters.len());
        let present = back
            .clusters
            .iter()
            .filter(|c| c.gone_since.is_none())
            .count();
        assert!(
            present == back.clusters.len() || present == 1001,
            "a gone Cluster kept before a present one: {present} of {}",
            back.clusters.len()
        );
    }
}

#[test]
fn what_cannot_be_read_back_is_a_clear_error() {
    assert!(matches!(
        decode(b"<html>proxy</html>"),
        Err(MemoryError::NotGzip(_))
    ));
    let v2 = gzip_json(br#"{"v": 2, "m": []}"#);
    assert_eq!(decode(&v2), Err(MemoryError::UnknownVersion { found: 2 }));
    assert!(matches!(
        decode(&gzip_json(b"[1, 2")),
        Err(MemoryError::NotJson(_))
    ));
    let bad_scope = decode(&gzip_json(
        br#"{"v": 1, "s": [], "m": [{"n": "ns", "m": "a", "s": 3}]}"#,
    ))
    .unwrap();
    assert_eq!(
        OrphanFinder::new(SignedDuration::from_secs(1)).restore(bad_scope),
        Err(MemoryError::BadScope(3))
    );
}

#[test]
fn a_decode_error_does_not_quote_the_memory() {
    // serde's own message would quote the offending value ("a-machine-name").
    let e = decode(&gzip_json(
        br#"{"v": 1, "m": [{"n": "ns", "m": 98765, "i": "a-machine-name"}]}"#,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("line 1"), "{e}");
    assert!(!e.contains("a-machine-name") && !e.contains("98765"), "{e}");
    let e = decode(&gzip_json(br#"{"v": "v-secret-ish"}"#))
        .unwrap_err()
        .to_string();
    assert!(!e.contains("secret-ish"), "{e}");
}

fn gzip_json(json: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(json).unwrap();
    z.finish().unwrap()
}
