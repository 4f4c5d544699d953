//! An alert of deploy/components/monitoring judged by promtool on a real scrape: the
//! PrometheusRule's groups as a rule file, every sample of the scrape held constant as
//! promtool's input series, and `ALERTS{alertname=…, alertstate="firing"}` read back after
//! the longest `for:` of the rules has passed. promtool is the one `make test-monitoring`
//! builds from the Prometheus module (target/tools/promtool; `make promtool`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::samples;

/// target/tools/promtool, or why it is not there.
pub fn promtool() -> Result<PathBuf, String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/promtool");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} missing: `make promtool` builds it (make test does, before the tests)",
            p.display()
        ))
    }
}

/// The rule file: the PrometheusRule's `spec.groups`.
fn rule_file() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/components/monitoring/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).expect("read the PrometheusRule");
    let rule: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("PrometheusRule YAML");
    let groups = rule["spec"]["groups"].clone();
    let mut file = serde_yaml_ng::Mapping::new();
    file.insert("groups".into(), groups);
    serde_yaml_ng::to_string(&file).expect("rule file")
}

/// A sample as a series selector promtool reads (label values escaped as PromQL strings).
fn series(s: &super::Sample) -> String {
    let labels: Vec<String> = s
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap()))
        .collect();
    format!("{}{{{}}}", s.name, labels.join(","))
}

/// Whether exactly `n` alerts named `alert` with the given labels fire once the scrape's
/// values have held for 30 minutes (every `for:` of the rules is shorter): `Ok`, or promtool's
/// own account of what it saw instead.
pub fn firing_count_is(
    scrape: &str,
    alert: &str,
    labels: &[(&str, &str)],
    n: u64,
) -> Result<(), String> {
    let promtool = promtool()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("rules.yaml"), rule_file()).map_err(|e| e.to_string())?;
    let input: Vec<serde_json::Value> = samples(scrape)
        .iter()
        .filter(|s| s.value.is_finite())
        .map(|s| serde_json::json!({"series": series(s), "values": format!("{}x40", s.value)}))
        .collect();
    if input.is_empty() {
        return Err("the scrape has no sample".into());
    }
    let mut selector = vec![
        format!("alertname={}", serde_json::to_string(alert).unwrap()),
        "alertstate=\"firing\"".to_string(),
    ];
    selector.extend(
        labels
            .iter()
            .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap())),
    );
    let expr = format!("count(ALERTS{{{}}}) or vector(0)", selector.join(","));
    let test = serde_json::json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "promql_expr_test": [{"expr": expr, "eval_time": "30m",
                                  "exp_samples": [{"labels": "{}", "value": n}]}],
        }],
    });
    std::fs::write(dir.path().join("test.yaml"), test.to_string()).map_err(|e| e.to_string())?;
    let out = Command::new(&promtool)
        .args(["test", "rules", "test.yaml"])
        .current_dir(dir.path())
        .output()
        .map_err(|e| format!("{}: {e}", promtool.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool test rules ({expr} == {n}):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
