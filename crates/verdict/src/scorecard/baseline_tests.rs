//! Boot baselines: the numbers, the windows, the bounds and the warnings.

use jiff::{SignedDuration, Timestamp};

use super::baseline::{Window, MAX_KEYS};
use super::*;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

const DAY: i64 = 86_400;

fn key(template: &str, zone: &str) -> BootKey {
    BootKey {
        template: template.into(),
        offering: "medium".into(),
        zone: zone.into(),
    }
}

/// A Machine created at `created` whose VM ran `to_running` s later and whose Node came
/// `boot` s after creation.
fn sample(k: &BootKey, created: i64, to_running: i64, boot: i64) -> BootSample {
    BootSample {
        key: k.clone(),
        created: t(created),
        vm_running: Some(t(created + to_running)),
        node_at: t(created + boot),
    }
}

/// A deterministic spread in `lo..hi` (a linear congruential generator).
struct Spread(u64);

impl Spread {
    fn next(&mut self, lo: i64, hi: i64) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        lo + i64::try_from((self.0 >> 33) % u64::try_from(hi - lo).unwrap()).unwrap()
    }
}

fn exact_p95(mut v: Vec<i64>) -> f64 {
    v.sort_unstable();
    let rank = (0.95 * v.len() as f64).ceil() as usize;
    v[rank - 1] as f64
}

fn policy() -> WarnPolicy {
    WarnPolicy {
        margin: 1.5,
        min_samples: 20,
    }
}

fn mhc(name: &str, timeout_secs: i64, covers: &[&BootKey]) -> MhcCoverage {
    MhcCoverage {
        name: name.into(),
        node_startup_timeout: SignedDuration::from_secs(timeout_secs),
        covers: covers.iter().map(|k| (*k).clone()).collect(),
    }
}

#[test]
fn two_hundred_machines_two_templates_one_slow() {
    let fast = key("ubuntu-2404", "zone-a");
    let slow = key("windows-2022", "zone-a");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    let mut spread = Spread(44);
    let (mut fast_boots, mut slow_boots, mut slow_from_running) = (vec![], vec![], vec![]);
    for i in 0..200 {
        let created = i * 60;
        let to_running = spread.next(30, 90);
        if i % 2 == 0 {
            let boot = spread.next(180, 300);
            fast_boots.push(boot);
            b.record(&sample(&fast, created, to_running, boot));
        } else {
            let boot = spread.next(900, 1500);
            slow_boots.push(boot);
            slow_from_running.push(boot - to_running);
            b.record(&sample(&slow, created, to_running, boot));
        }
    }
    let rows = b.rows();
    assert_eq!(rows.len(), 2);
    for (row, boots) in [(&rows[0], &fast_boots), (&rows[1], &slow_boots)] {
        let s = row.from_creation.unwrap();
        assert_eq!(row.count, 100);
        assert_eq!(s.count, 100);
        let want = exact_p95(boots.clone());
        assert!(
            (s.p95 - want).abs() <= 0.10 * want,
            "{:?}: p95 {} vs generated {want}",
            row.key,
            s.p95
        );
        assert_eq!(s.max, *boots.iter().max().unwrap() as f64);
    }
    let running = rows[1].from_running.unwrap();
    let want = exact_p95(slow_from_running);
    assert!((running.p95 - want).abs() <= 0.10 * want);

    let slow_p95 = rows[1].from_creation.unwrap().p95;
    let mhcs = [
        mhc("default/md-ubuntu", 600, &[&fast]),
        mhc("default/md-windows", 1200, &[&slow]),
        mhc("default/everything", 3600, &[&fast, &slow]),
    ];
    let w = warnings(&b, &mhcs, policy());
    assert_eq!(
        w,
        vec![Warning::MhcTimeoutBelowBoot {
            mhc: "default/md-windows".into(),
            timeout_secs: 1200,
            key: slow.clone(),
            p95_secs: slow_p95,
            margin: 1.5,
        }]
    );
    assert!(
        1200.0 < slow_p95,
        "the timeout is below the slow p95 itself"
    );
}

#[test]
fn an_mhc_warning_names_the_slowest_key_it_covers() {
    let (a, b_key, c) = (key("a", "z1"), key("b", "z1"), key("c", "z1"));
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    for i in 0..30 {
        b.record(&sample(&a, i, 10, 100));
        b.record(&sample(&b_key, i, 10, 400));
        b.record(&sample(&c, i, 10, 500));
    }
    let w = warnings(&b, &[mhc("ns/m", 300, &[&a, &b_key, &c])], policy());
    assert_eq!(w.len(), 1);
    let Warning::MhcTimeoutBelowBoot { key, p95_secs, .. } = &w[0] else {
        panic!("{w:?}")
    };
    assert_eq!((key, *p95_secs), (&c, 500.0));
}

#[test]
fn too_few_samples_warn_about_nothing() {
    let k = key("a", "z1");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    for i in 0..19 {
        b.record(&sample(&k, i, 10, 1000));
    }
    assert_eq!(warnings(&b, &[mhc("ns/m", 300, &[&k])], policy()), vec![]);
    b.record(&sample(&k, 19, 10, 1000));
    assert_eq!(warnings(&b, &[mhc("ns/m", 300, &[&k])], policy()).len(), 1);
}

#[test]
fn the_margin_counts() {
    let k = key("a", "z1");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    for i in 0..40 {
        b.record(&sample(&k, i, 10, 400));
    }
    // p95 400 s × 1.5 = 600 s: a 600 s timeout is enough, 599 s is not.
    assert_eq!(warnings(&b, &[mhc("ns/m", 600, &[&k])], policy()), vec![]);
    assert_eq!(warnings(&b, &[mhc("ns/m", 599, &[&k])], policy()).len(), 1);
}

#[test]
fn a_template_twice_as_slow_as_in_the_previous_window() {
    let (za, zb) = (key("ubuntu", "zone-a"), key("ubuntu", "zone-b"));
    let other = key("flatcar", "zone-a");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    for i in 0..30 {
        b.record(&sample(&za, i * 100, 10, 200));
        b.record(&sample(&other, i * 100, 10, 200));
    }
    assert_eq!(
        warnings(&b, &[], policy()),
        vec![],
        "no previous window yet"
    );
    for i in 0..30 {
        // The next day: ubuntu doubles (split over two zones), flatcar gets 50 % slower.
        let k = if i % 2 == 0 { &za } else { &zb };
        b.record(&sample(k, DAY + i * 100, 10, 400));
        b.record(&sample(&other, DAY + i * 100, 10, 300));
    }
    assert_eq!(b.current.start, t(DAY));
    assert_eq!(
        warnings(&b, &[], policy()),
        vec![Warning::TemplateSlower {
            template: "ubuntu".into(),
            p95_secs: 400.0,
            previous_p95_secs: 200.0,
        }]
    );
}

#[test]
fn windows_roll_and_a_gap_forgets_the_previous_one() {
    let k = key("a", "z1");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    b.record(&sample(&k, 0, 10, 100));
    b.roll(t(DAY - 1));
    assert!(b.previous.is_none());
    b.roll(t(DAY + 5));
    assert_eq!(b.current.start, t(DAY));
    assert_eq!(b.previous.as_ref().map(|w| w.keys.len()), Some(1));
    assert!(b.rows().is_empty(), "the new window starts empty");
    b.record(&sample(&k, 3 * DAY + 7, 10, 100));
    assert_eq!(b.current.start, t(3 * DAY), "aligned to whole windows");
    assert!(
        b.previous.is_none(),
        "the window before was empty of time: skipped"
    );
}

#[test]
fn keys_per_window_are_bounded() {
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    for i in 0..MAX_KEYS + 76 {
        b.record(&sample(&key(&format!("tpl-{i}"), "z"), 0, 10, 100));
    }
    assert_eq!(b.current.keys.len(), MAX_KEYS);
    assert_eq!(b.current.dropped, 76);
    // A key already there still counts.
    b.record(&sample(&key("tpl-0", "z"), 0, 10, 100));
    assert_eq!(b.rows()[0].count, 2);
}

#[test]
fn a_machine_without_a_running_time_has_no_running_row() {
    let k = key("a", "z1");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    b.record(&BootSample {
        key: k.clone(),
        created: t(0),
        vm_running: None,
        node_at: t(250),
    });
    let row = &b.rows()[0];
    assert_eq!(row.from_running, None);
    let s = row.from_creation.unwrap();
    assert_eq!((s.count, s.p50, s.p95, s.max), (1, 250.0, 250.0, 250.0));
}

#[test]
fn a_node_before_its_machine_reads_zero() {
    let k = key("a", "z1");
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    b.record(&sample(&k, 100, 10, -5));
    assert_eq!(b.rows()[0].from_creation.unwrap().max, 0.0);
}

#[test]
fn baselines_survive_a_json_round_trip() {
    let mut b = Baselines::new(t(0), SignedDuration::from_secs(DAY));
    for i in 0..50 {
        b.record(&sample(&key("a", "z1"), i, 10, 100 + i));
    }
    for i in 0..50 {
        b.record(&sample(&key("b", "z2"), DAY + i, 20, 300 + i));
    }
    assert!(b.previous.is_some());
    let json = serde_json::to_string(&b).unwrap();
    let back: Baselines = serde_json::from_str(&json).unwrap();
    assert_eq!(back, b);
    assert_eq!(back.rows(), b.rows());
    let w: &Window = back.previous.as_ref().unwrap();
    assert_eq!(w.keys.len(), 1);
}
