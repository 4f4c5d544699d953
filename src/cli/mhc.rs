//! `capc-health-shim mhc --cluster NS/NAME`: the MachineHealthCheck that makes a Cluster's
//! Machines recycle on the shim's verdict, for the Cluster API version the management cluster
//! runs — or, with `--existing FILE`, the merge patch that adds the shim's condition to an MHC
//! you already have. It prints; it never applies anything. The rendering is pure ([`render`]);
//! only `--capi-version auto` asks the API server (discovery, as `run` does).

use std::path::PathBuf;

use clap::Args;
use jiff::SignedDuration;
use serde_json::{json, Value};

use crate::cli::parse_duration;
use capi_model::well_known;

#[derive(Debug, Clone, Args)]
pub struct MhcArgs {
    /// The Cluster, as `namespace/name`.
    #[arg(long, env = "CAPC_HEALTH_CLUSTER")]
    pub cluster: String,
    /// `auto` (ask the API server of KUBECONFIG or the in-cluster config) or a Cluster API
    /// minor version such as `1.9` or `1.13`.
    #[arg(long, env = "CAPC_HEALTH_CAPI_VERSION", default_value = "auto")]
    pub capi_version: String,
    /// An existing MachineHealthCheck (YAML or JSON, as `kubectl get mhc NAME -o yaml` prints
    /// it): print the merge patch that adds the shim's condition to it instead.
    #[arg(long, env = "CAPC_HEALTH_EXISTING")]
    pub existing: Option<PathBuf>,
    /// The condition the shim writes (`run --condition-type`).
    #[arg(
        long,
        env = "CAPC_HEALTH_CONDITION_TYPE",
        default_value = "CloudStackVMHealthy"
    )]
    pub condition_type: String,
    /// How long the condition must stay `False` before MHC marks the Machine (its
    /// `timeoutSeconds`: the part `--escalation-delay` plays in annotate mode).
    #[arg(long, env = "CAPC_HEALTH_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub timeout: SignedDuration,
}

/// What the management cluster's MachineHealthCheck API can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MhcApi {
    /// CAPI 1.7 – 1.11: no Machine conditions; the shim annotates the Machines an MHC covers.
    AnnotationOnly,
    /// CAPI 1.12: `spec.checks.unhealthyMachineConditions` in v1beta2 only.
    V1Beta2,
    /// CAPI 1.13+: also `spec.unhealthyMachineConditions` (with `timeout`) in v1beta1.
    V1Beta2AndV1Beta1,
}

/// `1.9`, `v1.13.5`, … → what its MHC API can do.
pub fn mhc_api_of(version: &str) -> Result<MhcApi, String> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    let (major, minor) = (parts.next(), parts.next());
    let minor: u32 = match (major, minor.map(str::parse)) {
        (Some("1"), Some(Ok(minor))) => minor,
        _ => {
            return Err(format!(
                "--capi-version {version:?}: expected auto or a Cluster API version such as 1.9 or 1.13"
            ))
        }
    };
    match minor {
        0..=6 => Err(format!(
            "Cluster API {version} has no {} annotation (it came in 1.7): the shim cannot get Machines recycled there",
            well_known::REMEDIATE_MACHINE
        )),
        7..=11 => Ok(MhcApi::AnnotationOnly),
        12 => Ok(MhcApi::V1Beta2),
        _ => Ok(MhcApi::V1Beta2AndV1Beta1),
    }
}

/// What to render for.
#[derive(Debug, Clone)]
pub struct MhcRequest<'a> {
    pub namespace: &'a str,
    pub cluster: &'a str,
    pub api: MhcApi,
    pub condition_type: &'a str,
    pub timeout: SignedDuration,
}

/// The MachineHealthCheck for the Cluster (`existing: None`), or the merge patch that adds the
/// shim's condition to `existing`, as YAML with `#` comments saying what to run. Errors name
/// what is wrong with the request or the existing object.
pub fn render(r: &MhcRequest<'_>, existing: Option<&Value>) -> Result<String, String> {
    match existing {
        None => Ok(new_mhc(r)),
        Some(e) => patch(r, e),
    }
}

fn new_mhc(r: &MhcRequest<'_>) -> String {
    let selector = json!({"matchLabels": {well_known::CLUSTER_NAME_LABEL: r.cluster}});
    let meta = json!({"name": format!("{}-capc-health", r.cluster), "namespace": r.namespace,
        "labels": {"app.kubernetes.io/name": "capc-health-shim"}});
    let (head, body) = match r.api {
        MhcApi::AnnotationOnly => (
            format!(
                "# Cluster API <= 1.11: MachineHealthCheck cannot read Machine conditions. The shim sets\n\
                 # {} on the Machines this MHC covers once {} has been False for\n\
                 # --escalation-delay; MHC acts on that annotation at once.\n",
                well_known::REMEDIATE_MACHINE, r.condition_type
            ),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
                "metadata": meta,
                "spec": {"clusterName": r.cluster, "selector": selector,
                    "nodeStartupTimeout": "30m", "maxUnhealthy": "100%",
                    "unhealthyConditions": [
                        {"type": "Ready", "status": "False", "timeout": "300s"},
                        {"type": "Ready", "status": "Unknown", "timeout": "300s"}]}}),
        ),
        MhcApi::V1Beta2 | MhcApi::V1Beta2AndV1Beta1 => (
            format!(
                "# Cluster API >= 1.12: MachineHealthCheck marks a Machine once {}=False has stood for\n\
                 # {}s. Status Unknown is deliberately not listed: the shim says Unknown when it cannot\n\
                 # tell (a CloudStack outage), and recycling then would replace healthy VMs.\n",
                r.condition_type,
                r.timeout.as_secs()
            ),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
                "metadata": meta,
                "spec": {"clusterName": r.cluster, "selector": selector,
                    "checks": {"nodeStartupTimeoutSeconds": 1800,
                        "unhealthyNodeConditions": [
                            {"type": "Ready", "status": "False", "timeoutSeconds": 300},
                            {"type": "Ready", "status": "Unknown", "timeoutSeconds": 300}],
                        "unhealthyMachineConditions": [our_rule(r, false)]},
                    "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": "100%"}}}}),
        ),
    };
    format!("{head}# kubectl apply -f <this file>\n{}", to_yaml(&body))
}

/// The shim's entry: v1beta1 spells the timeout as a duration, v1beta2 in seconds.
fn our_rule(r: &MhcRequest<'_>, v1beta1: bool) -> Value {
    let secs = r.timeout.as_secs();
    if v1beta1 {
        json!({"type": r.condition_type, "status": "False", "timeout": format!("{secs}s")})
    } else {
        json!({"type": r.condition_type, "status": "False", "timeoutSeconds": secs})
    }
}

fn patch(r: &MhcRequest<'_>, e: &Value) -> Result<String, String> {
    let kind = e["kind"].as_str().unwrap_or_default();
    let name = e["metadata"]["name"].as_str().unwrap_or_default();
    if kind != "MachineHealthCheck" || name.is_empty() {
        return Err("--existing is not a MachineHealthCheck with a name".into());
    }
    if e["spec"]["clusterName"].as_str() != Some(r.cluster) {
        return Err(format!(
            "MachineHealthCheck {name} is for cluster {:?}, not {}",
            e["spec"]["clusterName"].as_str().unwrap_or(""),
            r.cluster
        ));
    }
    match e["metadata"]["namespace"].as_str() {
        Some(ns) if ns != r.namespace => {
            return Err(format!(
                "MachineHealthCheck {name} is in namespace {ns}, the Cluster in {}",
                r.namespace
            ))
        }
        _ => {}
    }
    let version = e["apiVersion"].as_str().unwrap_or_default();
    let v1beta1 = version == "cluster.x-k8s.io/v1beta1";
    if r.api == MhcApi::AnnotationOnly {
        return Ok(format!(
            "# Nothing to patch: on Cluster API <= 1.11 MachineHealthCheck cannot read Machine conditions.\n\
             # The shim sets {} on the Machines {name} covers; MHC acts on it as it is.\n",
            well_known::REMEDIATE_MACHINE
        ));
    }
    // CAPI 1.12's v1beta1 has no such field (it round-trips through an annotation): patch v1beta2.
    let through_v1beta1 = v1beta1 && r.api == MhcApi::V1Beta2AndV1Beta1;
    let listed = if through_v1beta1 {
        &e["spec"]["unhealthyMachineConditions"]
    } else {
        &e["spec"]["checks"]["unhealthyMachineConditions"]
    };
    let mut rules: Vec<Value> = listed.as_array().cloned().unwrap_or_default();
    let ours = |rule: &Value| rule["type"] == r.condition_type && rule["status"] == "False";
    if rules.iter().any(ours) {
        return Ok(format!(
            "# Nothing to patch: MachineHealthCheck {name} already lists {}=False.\n",
            r.condition_type
        ));
    }
    let mut note = String::new();
    if v1beta1 && !through_v1beta1 {
        rules.clear();
        note = "# The file is v1beta1, which on Cluster API 1.12 does not show unhealthyMachineConditions:\n\
                # read it as v1beta2 (kubectl get machinehealthchecks.v1beta2.cluster.x-k8s.io) if it may list\n\
                # some already, as this patch replaces the list.\n"
            .into();
    }
    rules.push(our_rule(r, through_v1beta1));
    let (resource, body) = if through_v1beta1 {
        (
            "machinehealthchecks.v1beta1.cluster.x-k8s.io",
            json!({"spec": {"unhealthyMachineConditions": rules}}),
        )
    } else {
        (
            "machinehealthchecks.v1beta2.cluster.x-k8s.io",
            json!({"spec": {"checks": {"unhealthyMachineConditions": rules}}}),
        )
    };
    Ok(format!(
        "# Adds {}=False to MachineHealthCheck {name} (the list is replaced as a whole: its entries are kept).\n\
         {note}# kubectl -n {} patch {resource} {name} --type merge --patch-file <this file>\n{}",
        r.condition_type,
        r.namespace,
        to_yaml(&body)
    ))
}

fn to_yaml(v: &Value) -> String {
    // A JSON value always serializes; the fallback (JSON is YAML) is never expected.
    serde_yaml_ng::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// Reads `--existing` as YAML (JSON is YAML).
fn read_existing(path: &std::path::Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_yaml_ng::from_str(&text).map_err(|e| format!("{} is not YAML: {e}", path.display()))
}

/// The command: exit 0 with the YAML on stdout, 2 on bad flags or input, 1 when discovery
/// fails.
pub async fn main(args: MhcArgs) -> u8 {
    let Some((namespace, cluster)) = args
        .cluster
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
    else {
        eprintln!("--cluster {:?}: expected namespace/name", args.cluster);
        return 2;
    };
    let api = if args.capi_version == "auto" {
        match discover().await {
            Ok(api) => api,
            Err(e) => {
                eprintln!("{e}");
                return 1;
            }
        }
    } else {
        match mhc_api_of(&args.capi_version) {
            Ok(api) => api,
            Err(e) => {
                eprintln!("{e}");
                return 2;
            }
        }
    };
    let existing = match args.existing.as_deref().map(read_existing).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let request = MhcRequest {
        namespace,
        cluster,
        api,
        condition_type: &args.condition_type,
        timeout: args.timeout,
    };
    match render(&request, existing.as_ref()) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("{e}");
            2
        }
    }
}

/// What the API server's MachineHealthCheck CRD offers, as `run` discovers it.
async fn discover() -> Result<MhcApi, String> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("--capi-version auto needs the API server (KUBECONFIG): {e}"))?;
    let (served, problems) = crate::controller::kube_io::discover(&client).await;
    if served.machine_health_check.is_empty() {
        return Err(format!(
            "the MachineHealthCheck API is not served (is Cluster API installed?){}",
            problems
                .iter()
                .map(|p| format!("; {p}"))
                .collect::<String>()
        ));
    }
    Ok(if !served.mhc_unhealthy_machine_conditions {
        MhcApi::AnnotationOnly
    } else if served.machine_health_check.iter().any(|v| v == "v1beta1") {
        // v1beta1 served next to the field: 1.13+ (1.12's v1beta1 lacks it; either way the
        // v1beta2 rendering is right, this only decides how an existing v1beta1 is patched).
        MhcApi::V1Beta2AndV1Beta1
    } else {
        MhcApi::V1Beta2
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(api: MhcApi) -> MhcRequest<'static> {
        MhcRequest {
            namespace: "ns1",
            cluster: "c1",
            api,
            condition_type: "CloudStackVMHealthy",
            timeout: SignedDuration::from_secs(60),
        }
    }

    fn body(out: &str) -> Value {
        serde_yaml_ng::from_str(out).expect("the output is YAML")
    }

    #[test]
    fn versions_map_to_what_their_mhc_can_do() {
        assert_eq!(mhc_api_of("1.9"), Ok(MhcApi::AnnotationOnly));
        assert_eq!(mhc_api_of("v1.11.3"), Ok(MhcApi::AnnotationOnly));
        assert_eq!(mhc_api_of("1.12"), Ok(MhcApi::V1Beta2));
        assert_eq!(mhc_api_of("1.13"), Ok(MhcApi::V1Beta2AndV1Beta1));
        assert_eq!(mhc_api_of("1.14.2"), Ok(MhcApi::V1Beta2AndV1Beta1));
        assert!(mhc_api_of("1.6").unwrap_err().contains("1.7"));
        for bad in ["", "2.0", "1", "latest", "1.x"] {
            assert!(mhc_api_of(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_new_mhc_for_capi_1_12_and_later_lists_the_condition_false_only() {
        let out = render(&request(MhcApi::V1Beta2), None).unwrap();
        let v = body(&out);
        assert_eq!(v["apiVersion"], "cluster.x-k8s.io/v1beta2");
        assert_eq!(v["metadata"]["namespace"], "ns1");
        assert_eq!(v["spec"]["clusterName"], "c1");
        assert_eq!(
            v["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/cluster-name"],
            "c1"
        );
        assert_eq!(
            v["spec"]["checks"]["unhealthyMachineConditions"],
            json!([{"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 60}])
        );
        assert!(out.starts_with("# Cluster API >= 1.12"), "{out}");
    }

    #[test]
    fn a_new_mhc_for_capi_1_11_and_earlier_relies_on_the_annotation() {
        let out = render(&request(MhcApi::AnnotationOnly), None).unwrap();
        let v = body(&out);
        assert_eq!(v["apiVersion"], "cluster.x-k8s.io/v1beta1");
        assert!(v["spec"].get("unhealthyMachineConditions").is_none());
        assert!(v["spec"].get("checks").is_none());
        assert!(out.contains(well_known::REMEDIATE_MACHINE), "{out}");
    }

    fn v1_9_style(api_version: &str) -> Value {
        json!({"apiVersion": api_version, "kind": "MachineHealthCheck",
            "metadata": {"name": "old", "namespace": "ns1"},
            "spec": {"clusterName": "c1", "selector": {},
                "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}]}})
    }

    #[test]
    fn a_patch_adds_the_condition_and_keeps_what_the_mhc_lists() {
        let mut existing = v1_9_style("cluster.x-k8s.io/v1beta2");
        existing["spec"]["checks"] = json!({"unhealthyMachineConditions": [
            {"type": "Other", "status": "True", "timeoutSeconds": 5},
            {"type": "CloudStackVMHealthy", "status": "Unknown", "timeoutSeconds": 600}]});
        let out = render(&request(MhcApi::V1Beta2), Some(&existing)).unwrap();
        assert!(
            out.contains("kubectl -n ns1 patch machinehealthchecks.v1beta2.cluster.x-k8s.io old --type merge"),
            "{out}"
        );
        let v = body(&out);
        let rules = v["spec"]["checks"]["unhealthyMachineConditions"]
            .as_array()
            .unwrap();
        assert_eq!(rules.len(), 3, "{out}");
        assert_eq!(rules[0]["type"], "Other");
        assert_eq!(
            rules[2],
            json!({"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 60})
        );
        // Applied as a merge patch to the MHC, the result lists the condition.
        let mut patched = existing.clone();
        json_patch::merge(&mut patched, &v);
        assert_eq!(
            patched["spec"]["checks"]["unhealthyMachineConditions"]
                .as_array()
                .map(Vec::len),
            Some(3)
        );
        assert_eq!(
            patched["spec"]["unhealthyConditions"],
            existing["spec"]["unhealthyConditions"]
        );
    }

    #[test]
    fn a_v1beta1_mhc_is_patched_through_v1beta1_on_1_13_and_through_v1beta2_on_1_12() {
        let existing = v1_9_style("cluster.x-k8s.io/v1beta1");
        let out = render(&request(MhcApi::V1Beta2AndV1Beta1), Some(&existing)).unwrap();
        assert_eq!(
            body(&out)["spec"]["unhealthyMachineConditions"],
            json!([{"type": "CloudStackVMHealthy", "status": "False", "timeout": "60s"}]),
            "{out}"
        );
        assert!(out.contains("machinehealthchecks.v1beta1."), "{out}");
        let out = render(&request(MhcApi::V1Beta2), Some(&existing)).unwrap();
        assert!(
            body(&out)["spec"]["checks"]["unhealthyMachineConditions"].is_array(),
            "{out}"
        );
        assert!(
            out.contains("does not show unhealthyMachineConditions"),
            "{out}"
        );
    }

    #[test]
    fn nothing_to_patch_and_wrong_inputs_say_so() {
        let mut listing = v1_9_style("cluster.x-k8s.io/v1beta2");
        listing["spec"]["checks"] = json!({"unhealthyMachineConditions": [
            {"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 300}]});
        let out = render(&request(MhcApi::V1Beta2), Some(&listing)).unwrap();
        assert!(
            out.starts_with("# Nothing to patch") && body(&out).is_null(),
            "{out}"
        );
        let old = v1_9_style("cluster.x-k8s.io/v1beta1");
        let out = render(&request(MhcApi::AnnotationOnly), Some(&old)).unwrap();
        assert!(out.starts_with("# Nothing to patch"), "{out}");
        let mut other = old.clone();
        other["spec"]["clusterName"] = json!("c2");
        assert!(render(&request(MhcApi::V1Beta2), Some(&other))
            .unwrap_err()
            .contains("c2"));
        let mut elsewhere = old.clone();
        elsewhere["metadata"]["namespace"] = json!("ns2");
        assert!(render(&request(MhcApi::V1Beta2), Some(&elsewhere)).is_err());
        assert!(render(&request(MhcApi::V1Beta2), Some(&json!({"kind": "Machine"}))).is_err());
        assert!(render(&request(MhcApi::V1Beta2), Some(&json!("garbage"))).is_err());
    }
}
