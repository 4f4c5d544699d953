//! The metric names the alerts and the dashboard of deploy/components/monitoring query (listed by
//! hack/monitoring with Prometheus' PromQL parser, kept current by its test), and the sample
//! names a /metrics scrape exports.

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
