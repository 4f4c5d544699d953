//! `capc-health-shim cleanup` against a real kube-apiserver with the CAPI/CAPC CRDs: the shim
//! (`run`, as a process, leader election on) writes its verdicts — and in annotate mode
//! (CAPI 1.9) the remediate annotation — and its Lease and memory ConfigMap, then stops, as
//! after `helm uninstall`. CAPI's own condition entries, another manager's annotations and a
//! Machine carrying the shim's condition type and annotation set by someone else sit beside
//! them. `cleanup` lists exactly what the shim's field manager owns (checked against every
//! Machine's managedFields) and the MHC entry naming the condition (CAPI 1.13); `cleanup --yes`
//! leaves 0 fields owned by `capc-health-shim` and everything else as it was; the MHC entry goes
//! only with `--remove-mhc-entries`.
//!
//! Checked failing without the feature: with the status release left out of `remove`, the
//! test stops at "0 shim-owned fields" (the shim's status entry still on m-error and m-ok);
//! with the managedFields entry of the annotation's merge patch not dropped, at the same place
//! (the claim on metadata.annotations stays).

mod kube_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube_support::{annotate_mode, get, is, kube_client, Fixture};
use serde_json::{json, Value};

const SHIM: &str = "capc-health-shim";
const REMEDIATE: &str = "cluster.x-k8s.io/remediate-machine";
const TYPE: &str = "CloudStackVMHealthy";

/// `capc-health-shim cleanup ARGS` with the test API server's kubeconfig: exit code, stdout.
fn cleanup(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .arg("cleanup")
        .args(args)
        .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
        .output()
        .expect("run cleanup");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "$ capc-health-shim cleanup {}\n{stdout}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), stdout)
}

/// Every Machine of the namespace as JSON, by name.
async fn machines(f: &Fixture) -> BTreeMap<String, Value> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &f.resources.machine);
    api.list(&ListParams::default())
        .await
        .expect("list Machines")
        .items
        .into_iter()
        .map(|m| {
            let v = serde_json::to_value(&m).unwrap();
            (m.metadata.name.unwrap(), v)
        })
        .collect()
}

/// The managedFields entries of the shim's field manager on `m`.
fn shim_entries(m: &Value) -> Vec<Value> {
    m["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["manager"] == SHIM)
        .cloned()
        .collect()
}

fn conditions<'a>(m: &'a Value, pointer: &str) -> Vec<&'a Value> {
    m.pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect()
}

/// A status merge patch by field manager `manager` (CAPI's controllers patch as `manager`).
async fn patch_status(f: &Fixture, name: &str, manager: &str, patch: Value) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &f.resources.machine);
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    api.patch_status(name, &params, &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("status patch of {name} by {manager}: {e}"));
}

async fn patch(f: &Fixture, name: &str, manager: &str, patch: Value) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &f.resources.machine);
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch of {name} by {manager}: {e}"));
}

/// `pointer`'s list with `entry` appended, as a merge patch of `status` (a merge patch
/// replaces a list whole, as CAPI's patch helper sends it: the other entries unchanged).
fn with_entry(m: &Value, pointer: &str, entry: Value) -> Value {
    let mut list: Vec<Value> = conditions(m, pointer).into_iter().cloned().collect();
    list.push(entry);
    let mut patch = json!({});
    let mut node = &mut patch;
    for key in pointer.trim_start_matches('/').split('/') {
        node = &mut node[key];
    }
    *node = Value::Array(list);
    patch
}

fn capi_condition(t: &str) -> Value {
    json!({"type": t, "status": "True", "reason": "Set", "message": "by CAPI",
        "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn cleanup_lists_and_removes_exactly_what_the_shim_left() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-error", "healthy", "Error"),
            ("vm-ok", "healthy", "Starting"),
        ],
    )
    .await;
    let annotate = annotate_mode(&f);
    let pointer = f.conditions_pointer();
    f.machine("m-error", Some("vm-error"), false, "fd1").await;
    f.machine("m-ok", Some("vm-ok"), false, "fd1").await;
    // No instance id: the shim writes nothing here.
    f.machine("m-other", None, false, "fd1").await;

    // The shim as deployed (leader election, its Lease and memory ConfigMap in its namespace),
    // until it wrote its verdicts and its memory.
    let port = kube_support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
        .args(["run", "--namespace", &f.ns, "--lease-namespace", &f.ns])
        .args(["--poll-interval", "1s", "--stats-interval", "1s"])
        .args(["--escalation-delay", "1s", "--insecure-serving"])
        .args(["--status-addr", &addr])
        .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
        .env("HOSTNAME", "shim-cleanup-test")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start capc-health-shim run");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &f.ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &f.ns);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let err = f.verdict("m-error").await;
        let ok = f.verdict("m-ok").await;
        let lease = leases.get_opt(SHIM).await.unwrap().is_some();
        let memory = maps
            .get_opt("capc-health-shim-memory")
            .await
            .unwrap()
            .is_some();
        if is(&err, "False", "VMError")
            && is(&ok, "True", "VMHealthy")
            && (!annotate || err.1)
            && lease
            && memory
        {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("run exited early with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "not written within 90 s: {err:?} {ok:?} lease={lease} memory={memory}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // While it runs (its Lease held), --yes refuses and removes nothing.
    let flags = ["--namespace", &f.ns, "--lease-namespace", &f.ns];
    let (code, out) = cleanup(&[&flags[..], &["--yes"]].concat());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("held by shim-cleanup-test"), "{out}");
    assert!(f.verdict("m-error").await.0.is_some());
    assert!(maps
        .get_opt("capc-health-shim-memory")
        .await
        .unwrap()
        .is_some());
    // Uninstalled: the process ends (SIGTERM, as a Deployment's pods do).
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "run did not stop within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // CAPI's entries beside the shim's, others' annotations, and on m-other the shim's
    // condition type and annotation set by another manager: none of these is the shim's.
    // (m-ok keeps the shim's entry alone in its list, as on a Machine CAPI wrote none to.)
    let m = get(&client, &f.ns, &f.resources.machine, "m-error").await;
    let ready = with_entry(&m, pointer, capi_condition("Ready"));
    patch_status(&f, "m-error", "manager", ready).await;
    for name in ["m-error", "m-ok"] {
        patch(
            &f,
            name,
            "kubectl-annotate",
            json!({"metadata": {"annotations": {"example.com/keep": name}}}),
        )
        .await;
    }
    let other = get(&client, &f.ns, &f.resources.machine, "m-other").await;
    patch_status(
        &f,
        "m-other",
        "operator",
        with_entry(
            &other,
            pointer,
            json!({"type": TYPE,
        "status": "False", "reason": "ByHand", "message": "set by an operator",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        ),
    )
    .await;
    patch(
        &f,
        "m-other",
        "kubectl-annotate",
        json!({"metadata": {"annotations": {REMEDIATE: "by hand"}}}),
    )
    .await;
    let mhcs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &f.ns, &f.resources.mhc);
    let mhc_list = "/spec/checks/unhealthyMachineConditions";
    if !annotate {
        let other_rule = json!({"type": "Other", "status": "False", "timeoutSeconds": 5});
        let rules = json!([{"type": TYPE, "status": "False", "timeoutSeconds": 0}, other_rule]);
        mhcs.patch(
            "c1-mhc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"checks": {"unhealthyMachineConditions": rules}}})),
        )
        .await
        .expect("MHC patch");
    }
    let before = machines(&f).await;

    // What the shim's manager owns, from managedFields alone (the test's own reading).
    let owned: BTreeMap<&str, Vec<Value>> = before
        .iter()
        .map(|(n, m)| (n.as_str(), shim_entries(m)))
        .filter(|(_, e)| !e.is_empty())
        .collect();
    assert_eq!(
        owned.keys().copied().collect::<Vec<_>>(),
        ["m-error", "m-ok"],
        "positive control: the shim owns fields on the Machines it judged"
    );

    // Listing: exactly those, nothing changed.
    let (code, out) = cleanup(&[&flags[..], &["-o", "json"]].concat());
    assert_eq!(code, Some(0), "{out}");
    let listed: Value = serde_json::from_str(&out).expect("JSON");
    let s = &listed["survey"];
    assert_eq!(
        s["objects"],
        json!([{"kind": "Lease", "namespace": f.ns, "name": SHIM},
               {"kind": "ConfigMap", "namespace": f.ns, "name": "capc-health-shim-memory"}])
    );
    let by_name: BTreeMap<&str, &Value> = s["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m))
        .collect();
    assert_eq!(
        by_name.keys().copied().collect::<Vec<_>>(),
        ["m-error", "m-ok"],
        "{s:#}"
    );
    for (name, m) in &by_name {
        assert_eq!(
            m["conditions"],
            json!([{"key": TYPE}]),
            "{name}: only the shim's entry, unshared"
        );
        let want = if annotate && *name == "m-error" {
            let value = before[*name]["metadata"]["annotations"][REMEDIATE].clone();
            assert!(
                value.as_str().unwrap().starts_with("capc-health-shim: "),
                "{value}"
            );
            json!([{"key": REMEDIATE, "value": value}])
        } else {
            json!([])
        };
        assert_eq!(m["annotations"], want, "{name}");
        assert!(
            m.get("kept").is_none() && m.get("other_fields").is_none(),
            "{m:#}"
        );
        // As the managedFields say: a status apply; an update only where it annotated.
        let ops: BTreeSet<(String, bool)> = owned[name]
            .iter()
            .map(|e| {
                (
                    e["operation"].as_str().unwrap().to_string(),
                    e["subresource"] == "status",
                )
            })
            .collect();
        let mut want_ops = BTreeSet::from([("Apply".to_string(), true)]);
        if annotate && *name == "m-error" {
            want_ops.insert(("Update".to_string(), false));
        }
        assert_eq!(ops, want_ops, "{name}: {:#?}", owned[name]);
    }
    let listed_mhcs: Vec<&str> = s["mhcs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed_mhcs, if annotate { vec![] } else { vec!["c1-mhc"] });
    assert_eq!(s["complete"], true, "{s:#}");
    assert_eq!(machines(&f).await, before, "listing changes nothing");
    // The table says the same for people.
    let (code, table) = cleanup(&flags);
    assert_eq!(code, Some(0));
    for want in [
        "m-error",
        "m-ok",
        "Lease",
        "capc-health-shim-memory",
        "run again with --yes",
    ] {
        assert!(table.contains(want), "{want:?} missing:\n{table}");
    }
    assert!(
        !table.contains("m-other") && !table.contains("example.com/keep"),
        "{table}"
    );
    if !annotate {
        assert!(
            table.contains("kubectl -n"),
            "the MHC patch is printed:\n{table}"
        );
    }
    let (code, _) = cleanup(&[&flags[..], &["--remove-mhc-entries"]].concat());
    assert_eq!(code, Some(2), "--remove-mhc-entries needs --yes");

    // --yes: nothing of the shim's left, everything else as it was.
    let (code, out) = cleanup(&[&flags[..], &["--yes"]].concat());
    assert_eq!(code, Some(0), "{out}");
    let after = machines(&f).await;
    let left: Vec<(&String, Vec<Value>)> = after
        .iter()
        .map(|(n, m)| (n, shim_entries(m)))
        .filter(|(_, e)| !e.is_empty())
        .collect();
    assert!(left.is_empty(), "0 shim-owned fields: {left:#?}");
    for (name, m) in &after {
        let was = &before[name];
        let kept = |m: &Value| -> Vec<Value> {
            conditions(m, pointer)
                .into_iter()
                .filter(|c| !(owned.contains_key(name.as_str()) && c["type"] == TYPE))
                .cloned()
                .collect()
        };
        assert_eq!(kept(m), kept(was), "{name}: the others' condition entries");
        let mut annotations = was["metadata"]["annotations"].clone();
        if owned.contains_key(name.as_str()) {
            if let Some(a) = annotations.as_object_mut() {
                a.remove(REMEDIATE);
            }
        }
        assert_eq!(m["metadata"]["annotations"], annotations, "{name}");
        assert_eq!(m["metadata"]["labels"], was["metadata"]["labels"], "{name}");
        assert_eq!(m["spec"], was["spec"], "{name}");
    }
    for name in ["m-error", "m-ok"] {
        let m = &after[name];
        assert!(
            kube_support::condition(m, pointer).is_none(),
            "{name}: the shim's entry is gone"
        );
        assert_eq!(m["metadata"]["annotations"]["example.com/keep"], name);
        assert!(m
            .pointer(&format!(
                "/metadata/annotations/{}",
                REMEDIATE.replace('/', "~1")
            ))
            .is_none());
    }
    let capi: Vec<_> = conditions(&after["m-error"], pointer);
    assert_eq!(
        capi,
        [&capi_condition("Ready")],
        "CAPI's entry stays as it was"
    );
    assert!(conditions(&after["m-ok"], pointer).is_empty());
    let m_other = &after["m-other"];
    assert_eq!(
        kube_support::condition(m_other, pointer).unwrap()["reason"],
        "ByHand"
    );
    assert_eq!(m_other["metadata"]["annotations"][REMEDIATE], "by hand");
    assert!(
        leases.get_opt(SHIM).await.unwrap().is_none(),
        "the Lease is gone"
    );
    assert!(
        maps.get_opt("capc-health-shim-memory")
            .await
            .unwrap()
            .is_none(),
        "the ConfigMap is gone"
    );

    // Listed again: nothing of the shim's; the MHC entry is still there (the operator's).
    let (code, out) = cleanup(&[&flags[..], &["-o", "json"]].concat());
    assert_eq!(code, Some(0));
    let again: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(again["survey"]["objects"], json!([]));
    assert_eq!(again["survey"]["machines"], json!([]));
    let mhc = get(&client, &f.ns, &f.resources.mhc, "c1-mhc").await;
    if !annotate {
        assert_eq!(again["survey"]["mhcs"].as_array().unwrap().len(), 1);
        assert_eq!(mhc.pointer(mhc_list).unwrap().as_array().unwrap().len(), 2);
        let (code, out) = cleanup(&[&flags[..], &["--yes", "--remove-mhc-entries"]].concat());
        assert_eq!(code, Some(0), "{out}");
        let mhc = get(&client, &f.ns, &f.resources.mhc, "c1-mhc").await;
        assert_eq!(
            mhc.pointer(mhc_list).unwrap(),
            &json!([{"type": "Other", "status": "False", "timeoutSeconds": 5}]),
            "only the entry naming the shim's condition goes"
        );
    } else {
        assert_eq!(again["survey"]["mhcs"], json!([]));
    }
    f.cleanup().await;
}

/// docs/uninstall.md names the flags `cleanup` (and `run`) have, with their defaults.
#[test]
fn the_uninstall_page_names_real_flags_with_their_defaults() {
    use capc_health_shim::cli::cleanup::CleanupArgs;
    use capc_health_shim::controller::RunArgs;
    use clap::CommandFactory;
    #[derive(clap::Parser)]
    struct Cleanup {
        #[command(flatten)]
        args: CleanupArgs,
    }
    #[derive(clap::Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }
    fn flags(cmd: clap::Command) -> BTreeMap<String, Vec<String>> {
        cmd.get_arguments()
            .filter_map(|a| {
                let defaults = a.get_default_values().iter();
                let defaults = defaults.map(|v| v.to_string_lossy().into_owned());
                Some((a.get_long()?.to_string(), defaults.collect()))
            })
            .collect()
    }
    let (cleanup, run) = (flags(Cleanup::command()), flags(Run::command()));
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/uninstall.md");
    let doc = std::fs::read_to_string(&path).expect("docs/uninstall.md");
    let flag_at = |s: &str| -> String {
        s.trim_start_matches("--")
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect()
    };
    let (mut checked, mut table_rows) = (0, 0);
    for line in doc.lines() {
        // `capc-health-shim cleanup …` commands and `run --flag` mentions.
        if let Some(rest) = line.split("capc-health-shim cleanup").nth(1) {
            for word in rest.split_whitespace().filter(|w| w.starts_with("--")) {
                let flag = flag_at(word);
                assert!(
                    cleanup.contains_key(&flag),
                    "cleanup has no --{flag}: {line}"
                );
                checked += 1;
            }
        }
        for mention in line.split("`run --").skip(1) {
            let flag = flag_at(mention);
            assert!(run.contains_key(&flag), "run has no --{flag}: {line}");
            checked += 1;
        }
        // The flags table: | `--flag` | default | what |
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 4 && cells[1].contains("`--") {
            let flag = flag_at(cells[1].rsplit("`--").next().unwrap());
            let known = cleanup
                .get(&flag)
                .unwrap_or_else(|| panic!("cleanup has no --{flag}: {line}"));
            let written = cells[2].trim_matches('`');
            if cells[2].starts_with('`') {
                assert_eq!(known, &[written.to_string()], "--{flag}'s default: {line}");
            } else {
                assert!(
                    known.is_empty() || written == "off",
                    "--{flag}'s default is {known:?}: {line}"
                );
            }
            table_rows += 1;
        }
    }
    // Positive control: the page has the commands and the table this reads.
    assert!(
        checked >= 6,
        "only {checked} flags found in {}",
        path.display()
    );
    let documented = cleanup.keys().filter(|f| *f != "help").count();
    assert_eq!(table_rows, documented, "one row per flag");
}

/// A condition entry the shim's manager shares with another (which wrote that type first and
/// still owns the entry itself): releasing the shim's fields would leave it incomplete, the API
/// server refuses, and `cleanup --yes` says so — naming the Machine and the by-hand fix — exits 1,
/// changes nothing there and still cleans the other Machines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_shared_entry_the_api_server_will_not_leave_incomplete_is_reported() {
    use capc_health_shim::controller::kube_io::apply_condition;
    use capi_model::condition::{ConditionState, Status};
    let client = kube_client().await;
    let f = Fixture::new(client.clone(), &[]).await;
    let pointer = f.conditions_pointer();
    f.machine("m-shared", None, false, "fd1").await;
    f.machine("m-plain", None, false, "fd1").await;
    // The operator's entry of that type first, then the shim's writes (its own apply path).
    let m = get(&client, &f.ns, &f.resources.machine, "m-shared").await;
    let theirs = json!({"type": TYPE, "status": "True", "reason": "ByHand", "message": "operator",
        "lastTransitionTime": "2026-01-01T00:00:00Z"});
    patch_status(&f, "m-shared", "operator", with_entry(&m, pointer, theirs)).await;
    let verdict = ConditionState {
        type_: TYPE.into(),
        status: Status::False,
        reason: "VMError".into(),
        message: "the shim's".into(),
        last_transition_time: "2026-01-01T00:00:00Z".parse().unwrap(),
    };
    for name in ["m-shared", "m-plain"] {
        let at = (f.ns.as_str(), name);
        apply_condition(
            &client,
            &f.resources.machine,
            f.choice.layout,
            at,
            &verdict,
            Duration::from_secs(5),
        )
        .await
        .expect("the shim's apply");
    }
    let flags = ["--namespace", &f.ns, "--lease-namespace", &f.ns];
    let (code, out) = cleanup(&[&flags[..], &["-o", "json"]].concat());
    assert_eq!(code, Some(0), "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let shared = listed["survey"]["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "m-shared")
        .cloned()
        .expect("m-shared is listed");
    assert_eq!(
        shared["conditions"],
        json!([{"key": TYPE, "shared_with": ["operator"]}])
    );

    let before = get(&client, &f.ns, &f.resources.machine, "m-shared").await;
    let (code, out) = cleanup(&[&flags[..], &["--yes"]].concat());
    assert_eq!(code, Some(1), "{out}");
    let failed = out
        .split("FAILED")
        .nth(1)
        .unwrap_or_else(|| panic!("no FAILED:\n{out}"));
    assert!(
        failed.contains("m-shared") && failed.contains("--subresource=status"),
        "{out}"
    );
    assert!(!failed.contains("m-plain"), "{out}");
    let after = machines(&f).await;
    assert_eq!(
        after["m-shared"]["status"], before["status"],
        "nothing changed there"
    );
    assert_eq!(
        shim_entries(&after["m-plain"]),
        Vec::<Value>::new(),
        "the other one is clean"
    );
    assert!(kube_support::condition(&after["m-plain"], pointer).is_none());
    f.cleanup().await;
}
