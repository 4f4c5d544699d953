//! The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs on the test API server (not
//! part of its profiles), so that the monitoring manifests — deploy/'s and the Helm chart's — are
//! applied with strict field validation against the real schema.

use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::Client;
use serde_json::Value;

/// The Prometheus Operator release whose CRDs the monitoring manifests are applied against.
/// Its Go module carries them (example/prometheus-operator-crd); the Go module proxy serves it,
/// as it serves the CAPI and CAPC modules the test API server takes its CRDs from.
pub const PROMETHEUS_OPERATOR_MODULE: &str =
    "github.com/prometheus-operator/prometheus-operator@v0.87.1";

/// The Prometheus Operator's own ServiceMonitor and PrometheusRule CRDs. `go mod download`
/// checks the module against the Go checksum database and reuses the module cache after the
/// first run.
pub fn prometheus_operator_crds() -> Vec<Value> {
    let out = Command::new("go")
        .args(["mod", "download", "-json", PROMETHEUS_OPERATOR_MODULE])
        // Outside any module or workspace: nothing here may touch a go.mod or go.sum.
        .current_dir(std::env::temp_dir())
        .env("GOWORK", "off")
        .env("GOFLAGS", "-modcacherw")
        .output()
        .expect("run go mod download");
    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "go mod download {PROMETHEUS_OPERATOR_MODULE}: {e}; stdout {}; stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && info.get("Error").is_none(),
        "go mod download {PROMETHEUS_OPERATOR_MODULE}: {info}"
    );
    let dir = std::path::Path::new(info["Dir"].as_str().expect("Dir"))
        .join("example/prometheus-operator-crd");
    ["servicemonitors", "prometheusrules"]
        .iter()
        .map(|plural| {
            let path = dir.join(format!("monitoring.coreos.com_{plural}.yaml"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// Applies the CRDs (server-side, strict) and waits until their kinds are served.
pub async fn ensure_monitoring_crds(client: &Client, field_manager: &str) {
    let crd_gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    let (ar, _) = pinned_kind(client, &crd_gvk)
        .await
        .expect("CRDs are served");
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    for crd in prometheus_operator_crds() {
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .expect("CRD kind")
            .to_string();
        let name = crd["metadata"]["name"].as_str().expect("CRD name");
        crds.patch(
            name,
            &PatchParams::apply(field_manager).validation_strict(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("the Prometheus Operator's {kind} CRD: {e}"));
        let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", &kind);
        let until = Instant::now() + Duration::from_secs(30);
        while pinned_kind(client, &gvk).await.is_err() {
            assert!(Instant::now() < until, "{kind} CRD not served");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
