//! The metric names the alerts and the dashboard of deploy/components/monitoring query, and the
//! labels the alerts select on (both listed by hack/monitoring with Prometheus' PromQL parser,
//! kept current by its tests); the samples a /metrics scrape exports, parsed exactly (names,
//! label sets with their values unescaped, values), and what of the alerts' labels a scrape's
//! series do not satisfy. Each test crate that includes it uses a part.
#![allow(dead_code)]

pub mod promtool;

use std::collections::BTreeSet;
use std::path::Path;

/// hack/monitoring/testdata/queried-metrics.txt: one sample name a line (`_total`, `_bucket`).
pub fn queried() -> BTreeSet<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/monitoring/testdata/queried-metrics.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let names: BTreeSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    assert!(
        names.len() >= 10,
        "only {} names in {}",
        names.len(),
        path.display()
    );
    names
}

/// Every sample name of an OpenMetrics (or Prometheus text) exposition, from its samples and its
/// `# TYPE` lines: a counter family `x` exports `x_total`, a histogram `x_bucket`, `x_sum`, `x_count`.
pub fn exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

/// One sample of an exposition: its name, its label set and its value, exactly as exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub value: f64,
}

/// A label value's characters up to its closing quote, unescaped (`\\`, `\"`, `\n`); the rest
/// of the line after the quote.
fn label_value(s: &str) -> Result<(String, &str), String> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &s[i + 1..])),
            '\\' => match chars.next() {
                Some((_, '\\')) => out.push('\\'),
                Some((_, '"')) => out.push('"'),
                Some((_, 'n')) => out.push('\n'),
                other => return Err(format!("bad escape {other:?}")),
            },
            c => out.push(c),
        }
    }
    Err("unterminated label value".into())
}

/// `name{l="v",…} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let end = line.find(['{', ' ']).ok_or("no value")?;
    let name = line[..end].to_string();
    let mut labels = std::collections::BTreeMap::new();
    let mut rest = &line[end..];
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            inner = inner.trim_start_matches(',');
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = inner.find('=').ok_or("a label without '='")?;
            let label = inner[..eq].trim().to_string();
            let quoted = inner[eq + 1..]
                .strip_prefix('"')
                .ok_or("a label value without quotes")?;
            let (value, after) = label_value(quoted)?;
            if labels.insert(label.clone(), value).is_some() {
                return Err(format!("label {label} twice"));
            }
            inner = after;
        }
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or("no value")?
        .parse::<f64>()
        .map_err(|e| e.to_string())?;
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// Every sample of an exposition (comments and `# EOF` skipped); a line that does not parse
/// fails the test that reads it.
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_sample(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// The value of the one sample named `name` whose labels include every `(label, value)`
/// given, each value equal (not contained); `None` when there is none. Two such samples are
/// an error: the caller's labels do not pick one series.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = samples.iter().filter(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    });
    let first = found.next()?;
    assert!(
        found.next().is_none(),
        "{name}{labels:?} picks more than one series"
    );
    Some(first.value)
}

/// How an alert's expression uses a label of a metric (hack/monitoring/testdata/rule-labels.txt,
/// written by hack/monitoring from Prometheus' own PromQL parser).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelUse {
    /// `by (label)` or `on (label)`: every series must carry it.
    Names(String),
    /// `label="value"`: some series must carry exactly that value.
    Equals(String, String),
    /// Another matcher (`!=`, `=~`, `!~`): not checked here, refused.
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleLabel {
    pub alert: String,
    pub metric: String,
    pub label_use: LabelUse,
}

/// The labels the alerts of deploy/components/monitoring select on.
pub fn rule_labels() -> Vec<RuleLabel> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/monitoring/testdata/rule-labels.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rules: Vec<RuleLabel> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let (Some(alert), Some(metric), Some(rest)) = (it.next(), it.next(), it.next()) else {
                panic!("{}: {l:?}", path.display());
            };
            let label_use = match rest.split_once(' ') {
                Some(("by" | "on", label)) => LabelUse::Names(label.to_string()),
                _ => match rest.split_once("=\"") {
                    Some((label, quoted)) if !label.ends_with(['!', '~', '=']) => {
                        let (value, after) = label_value(quoted)
                            .unwrap_or_else(|e| panic!("{}: {l:?}: {e}", path.display()));
                        assert!(after.is_empty(), "{}: {l:?}", path.display());
                        LabelUse::Equals(label.to_string(), value)
                    }
                    _ => LabelUse::Other(rest.to_string()),
                },
            };
            RuleLabel {
                alert: alert.to_string(),
                metric: metric.to_string(),
                label_use,
            }
        })
        .collect();
    assert!(
        rules.len() >= 10,
        "only {} lines in {}",
        rules.len(),
        path.display()
    );
    rules
}

/// Labels Prometheus puts on every series of a target: a ServiceMonitor's targets
/// (deploy/optional/servicemonitor.yaml) carry the Prometheus Operator's `namespace`,
/// `service`, `pod`, `container`, `endpoint`, and Prometheus adds `job` and `instance`. The
/// shim must not export them itself (Prometheus would rename its own to `exported_…`).
pub const TARGET_LABELS: [&str; 7] = [
    "namespace",
    "service",
    "pod",
    "container",
    "endpoint",
    "job",
    "instance",
];

/// What of `rules` the series of a scrape do not satisfy, one line each: a metric with no
/// series; a series without a label its alert groups or matches by (or with it empty); no
/// series with the value a matcher selects; a target label exported by the shim; a matcher
/// this check cannot read. Metrics for which `skip` holds are left out.
pub fn label_problems(
    samples: &[Sample],
    rules: &[RuleLabel],
    skip: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for r in rules.iter().filter(|r| !skip(&r.metric)) {
        let series: Vec<&Sample> = samples.iter().filter(|s| s.name == r.metric).collect();
        let what = format!("{}: {} {:?}", r.alert, r.metric, r.label_use);
        if series.is_empty() {
            problems.push(format!("{what}: no series of {}", r.metric));
            continue;
        }
        match &r.label_use {
            LabelUse::Names(label) if TARGET_LABELS.contains(&label.as_str()) => {
                if let Some(s) = series.iter().find(|s| s.labels.contains_key(label)) {
                    problems.push(format!(
                        "{what}: the shim exports the target label itself: {s:?}"
                    ));
                }
            }
            LabelUse::Names(label) => {
                let lacking: Vec<_> = series
                    .iter()
                    .filter(|s| s.labels.get(label).is_none_or(String::is_empty))
                    .collect();
                if !lacking.is_empty() {
                    problems.push(format!("{what}: series without {label}: {lacking:?}"));
                }
            }
            LabelUse::Equals(label, want) => {
                if !series.iter().any(|s| s.labels.get(label) == Some(want)) {
                    let have: std::collections::BTreeSet<_> =
                        series.iter().map(|s| s.labels.get(label)).collect();
                    problems.push(format!(
                        "{what}: no series with {label}={want:?}; {label} values: {have:?}"
                    ));
                }
            }
            LabelUse::Other(m) => problems.push(format!("{what}: cannot check the matcher {m}")),
        }
    }
    problems
}
