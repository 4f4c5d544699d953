//! The release manifests of `make release-manifests` (hack/release, built from deploy/base) on
//! the real kube-apiserver. clusterctl's processing of `addon-components.yaml` — done by
//! clusterctl's own library, variables at their defaults, `--target-namespace` set to a namespace
//! of this test — and the Helm chart's default render and one with another release name,
//! ServiceAccount name and Secrets namespaces (Helm's own library) are server-side
//! applied with strict field validation, dry run first; then the real `capc-health-shim` runs
//! with the generated Deployment's arguments and environment, authenticated as the generated
//! ServiceAccount, until it is ready, leads, and answers `/metrics` to a token the generated
//! reader role admits. And the chart's extra-CA option is checked against an HTTPS CloudStack with
//! the shim's own CloudStack client. hack/release's Go tests check the files themselves
//! (contract, metadata validation, values, the committed chart in sync).

mod kube_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use kube::Client;
use kube_support::{
    free_port, https_accepting_self_signed, kube_client, release_tool, service_account_token,
    token_kubeconfig,
};
use serde_json::{json, Value};

const FIELD_MANAGER: &str = "capc-health-shim-release-test";
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Runs the tool; its stdout. The clusterctl variables are unset, so their defaults apply.
fn tool(args: &[&str]) -> String {
    let out = Command::new(release_tool())
        .args(args)
        .args(["--root", REPO])
        .env_remove("CAPC_HEALTH_SHIM_IMAGE")
        .env_remove("CAPC_HEALTH_SHIM_LOG")
        .output()
        .expect("release tool runs");
    assert!(
        out.status.success(),
        "release {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn docs(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("YAML document");
        if !v.is_null() {
            out.push(v);
        }
    }
    out
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap()
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap()
}

fn gvk_of(obj: &Value) -> GroupVersionKind {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind(obj))
}

fn test_namespace(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

async fn api_for(client: &Client, obj: &Value) -> (Api<DynamicObject>, bool) {
    let (ar, caps) = pinned_kind(client, &gvk_of(obj))
        .await
        .unwrap_or_else(|e| panic!("{} is not served: {e}", kind(obj)));
    match caps.scope {
        Scope::Cluster => (Api::all_with(client.clone(), &ar), false),
        Scope::Namespaced => {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_else(|| panic!("{} {} has no namespace", kind(obj), name(obj)));
            (Api::namespaced_with(client.clone(), ns, &ar), true)
        }
    }
}

/// The release's objects in the cluster, and what the test must remove again.
struct Installed {
    ns: String,
    /// Namespaces of the test besides the release's (the chart's rbac.secrets.namespaces).
    other_ns: Vec<String>,
    cluster_scoped: Vec<Value>,
}

impl Installed {
    async fn cleanup(self, client: &Client) {
        for o in &self.cluster_scoped {
            let (api, _) = api_for(client, o).await;
            let _ = api.delete(name(o), &DeleteParams::default()).await;
        }
        let nss: Api<Namespace> = Api::all(client.clone());
        for ns in std::iter::once(&self.ns).chain(&self.other_ns) {
            let _ = nss.delete(ns, &DeleteParams::default()).await;
        }
    }
}

/// Server-side applies every object with strict field validation, dry run first, then for real.
/// Cluster-scoped objects (the ClusterRoles and the binding, which keep their names under
/// clusterctl and Helm) get this test's namespace as a suffix, so the test does not take over
/// deploy/base's objects on a shared API server; references to them follow.
async fn apply_all(client: &Client, objs: Vec<Value>, ns: &str) -> Installed {
    apply_all_in(client, objs, ns, &[]).await
}

/// apply_all, with objects allowed in `other_ns` too (namespaces the test made).
async fn apply_all_in(
    client: &Client,
    mut objs: Vec<Value>,
    ns: &str,
    other_ns: &[String],
) -> Installed {
    let renamed: BTreeMap<String, String> = objs
        .iter()
        .filter(|o| kind(o) == "ClusterRole")
        .map(|o| (name(o).to_string(), format!("{}-{ns}", name(o))))
        .collect();
    for o in objs.iter_mut() {
        match kind(o) {
            "ClusterRole" | "ClusterRoleBinding" => {
                let n = format!("{}-{ns}", name(o));
                o["metadata"]["name"] = json!(n);
            }
            _ => {}
        }
        if o["roleRef"]["kind"] == "ClusterRole" {
            let r = renamed[o["roleRef"]["name"].as_str().unwrap()].clone();
            o["roleRef"]["name"] = json!(r);
        }
    }
    objs.sort_by_key(|o| kind(o) != "Namespace");
    let pp = PatchParams::apply(FIELD_MANAGER).validation_strict();
    let mut installed = Installed {
        ns: ns.to_string(),
        other_ns: other_ns.to_vec(),
        cluster_scoped: Vec::new(),
    };
    for o in &objs {
        let what = format!("{} {}", kind(o), name(o));
        let (api, namespaced) = api_for(client, o).await;
        if namespaced {
            let in_ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
            assert!(
                in_ns == ns || other_ns.iter().any(|o| o == in_ns),
                "{what} in {in_ns}, want {ns} or one of {other_ns:?}"
            );
        } else if kind(o) != "Namespace" {
            installed.cluster_scoped.push(o.clone());
        }
        api.patch(name(o), &pp.clone().dry_run(), &Patch::Apply(o))
            .await
            .unwrap_or_else(|e| panic!("{what}: server-side apply, dry run, strict: {e}"));
        let stored = api
            .patch(name(o), &pp, &Patch::Apply(o))
            .await
            .unwrap_or_else(|e| panic!("{what}: server-side apply, strict: {e}"));
        assert!(
            stored
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|f| f.manager.as_deref() == Some(FIELD_MANAGER)),
            "{what}: not owned by {FIELD_MANAGER}"
        );
    }
    installed
}

fn deployment(objs: &[Value]) -> &Value {
    let ds: Vec<&Value> = objs.iter().filter(|o| kind(o) == "Deployment").collect();
    assert_eq!(ds.len(), 1, "one Deployment");
    ds[0]
}

fn manager(d: &Value) -> &Value {
    d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "manager")
        .expect("the container `manager` (clusterctl's contract)")
}

struct Shim {
    child: Child,
    log: PathBuf,
}

impl Shim {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The release installed by `objs` (already applied into `ns`): the shim runs as the pod would —
/// the Deployment's args and env, the ServiceAccount's token, the Lease in the pod's namespace —
/// on loopback (only --status-addr added), until ready and leading; the generated reader role,
/// bound to that ServiceAccount, opens /metrics.
async fn run_as_the_release(client: &Client, objs: &[Value], installed: &Installed) -> Value {
    run_binary_as_the_release(
        Path::new(env!("CARGO_BIN_EXE_capc-health-shim")),
        client,
        objs,
        installed,
    )
    .await
}

/// [`run_as_the_release`] with another `capc-health-shim` binary (the release bundle's); its
/// `/status` once it leads.
async fn run_binary_as_the_release(
    binary: &Path,
    client: &Client,
    objs: &[Value],
    installed: &Installed,
) -> Value {
    let ns = installed.ns.as_str();
    let d = deployment(objs);
    let c = manager(d);
    let pod = &d["spec"]["template"]["spec"];
    // The Lease the Deployment's flags name (the chart names it after the release).
    let lease_name = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--lease-name="))
        .expect("the Deployment names its Lease (--lease-name)")
        .to_string();

    // The pod the Deployment would create is admitted (Pod Security of the namespace included).
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let pod_obj = json!({"metadata": {"name": "release-pod-check",
        "labels": d["spec"]["template"]["metadata"]["labels"]}, "spec": pod});
    pods.create(&dry, &serde_json::from_value(pod_obj).unwrap())
        .await
        .unwrap_or_else(|e| panic!("the Deployment's pod is refused: {e}"));

    let sa = pod["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let token = service_account_token(client, ns, sa).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = token_kubeconfig(dir.path(), &token);

    let addr = format!("127.0.0.1:{}", free_port());
    let hostname = format!("release-test-{ns}");
    let mut cmd = Command::new(binary);
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args.first(), Some(&"run"), "{args:?}");
    cmd.args(&args).args(["--status-addr", &addr]);
    for e in c["env"].as_array().cloned().unwrap_or_default() {
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.namespace") => ns.to_string(),
            Some(other) => panic!("fieldRef {other}: teach the test"),
            None => e["value"].as_str().expect("a literal value").to_string(),
        };
        cmd.env(e["name"].as_str().unwrap(), value);
    }
    let log = dir.path().join("shim.log");
    let child = cmd
        .env("KUBECONFIG", &kubeconfig)
        .env("HOSTNAME", &hostname)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("capc-health-shim run");
    let mut shim = Shim { child, log };

    // The generated reader role, bound (by the test) to the ServiceAccount, for /metrics below.
    let reader = installed
        .cluster_scoped
        .iter()
        .find(|o| kind(o) == "ClusterRole" && name(o).contains("metrics-reader"))
        .expect("the release's metrics reader ClusterRole");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("release-test-reader-{ns}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name(reader)},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    });
    let (bindings, _) = api_for(client, &binding).await;
    bindings
        .patch(
            name(&binding),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&binding),
        )
        .await
        .expect("reader binding");

    let http = https_accepting_self_signed(Duration::from_secs(3));
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut ready, mut leading, mut metrics) = (false, false, String::new());
    while !(ready && leading && metrics.contains("capc_health_leader 1")) {
        if let Ok(Some(status)) = shim.child.try_wait() {
            panic!("run exited with {status}:\n{}", shim.logs());
        }
        assert!(
            Instant::now() < deadline,
            "within 90 s: ready={ready} leading={leading} metrics={:?}\n{}",
            metrics
                .lines()
                .find(|l| l.starts_with("capc_health_leader")),
            shim.logs()
        );
        ready = matches!(
            http.get(format!("https://{addr}/readyz")).send().await,
            Ok(r) if r.status().as_u16() == 200
        );
        leading = leases
            .get_opt(&lease_name)
            .await
            .expect("GET Lease")
            .and_then(|l| l.spec?.holder_identity)
            .as_deref()
            == Some(hostname.as_str());
        if ready && leading {
            if let Ok(r) = http
                .get(format!("https://{addr}/metrics"))
                .bearer_auth(&token)
                .send()
                .await
            {
                if r.status().as_u16() == 200 {
                    metrics = r.text().await.unwrap_or_default();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Its /status once a cycle reported (`generated_at`; before that a leader serves the empty
    // report), for what the values set (read with the same token).
    let deadline = Instant::now() + Duration::from_secs(60);
    let status: Value = loop {
        let status: Value = http
            .get(format!("https://{addr}/status"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("GET /status")
            .json()
            .await
            .expect("/status is JSON");
        if !status["generated_at"].is_null() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no cycle reported within 60 s: {status}\n{}",
            shim.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let _ = bindings
        .delete(name(&binding), &DeleteParams::default())
        .await;
    drop(shim);
    grants_no_more_than_documented(client, ns, sa, &lease_name, &installed.other_ns).await;
    status
}

/// Whether the API server would allow ServiceAccount `ns/sa` `verb` on `resource` (what
/// `kubectl auth can-i --as=system:serviceaccount:ns:sa` asks): a SubjectAccessReview.
async fn can(
    client: &Client,
    (ns, sa): (&str, &str),
    verb: &str,
    (group, resource): (&str, &str),
    (namespace, object): (&str, Option<&str>),
) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{ns}:{sa}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                "namespace": namespace, "name": object.unwrap_or_default()},
        }
    }))
    .unwrap();
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

/// Issue 43 (2): the installed ServiceAccount may write its own Lease in its own namespace and
/// no other Lease anywhere; it may `get` Secrets by name (the documented default, so that CAPC's
/// Secrets are read wherever they live) but never list or watch them; it deletes nothing.
///
/// With `secrets_ns` (the chart's rbac.secrets.namespaces) Secrets are readable there only.
async fn grants_no_more_than_documented(
    client: &Client,
    ns: &str,
    sa: &str,
    lease: &str,
    secrets_ns: &[String],
) {
    const LEASES: (&str, &str) = ("coordination.k8s.io", "leases");
    const SECRETS: (&str, &str) = ("", "secrets");
    let who = (ns, sa);
    // What it needs (the checks below could not fail if nothing were granted at all).
    for verb in ["get", "patch", "update"] {
        assert!(
            can(client, who, verb, LEASES, (ns, Some(lease))).await,
            "{verb} its own Lease {lease}"
        );
    }
    assert!(can(client, who, "create", LEASES, (ns, None)).await);
    if secrets_ns.is_empty() {
        assert!(can(client, who, "get", SECRETS, ("default", Some("any"))).await);
    } else {
        for s in secrets_ns {
            assert!(
                can(client, who, "get", SECRETS, (s, Some("any"))).await,
                "get Secrets in {s}"
            );
            for verb in ["list", "watch", "create", "delete"] {
                assert!(
                    !can(client, who, verb, SECRETS, (s, None)).await,
                    "{verb} Secrets in {s} must be refused"
                );
            }
        }
        for other in ["default", "kube-system", ns] {
            assert!(
                !can(client, who, "get", SECRETS, (other, Some("any"))).await,
                "get Secrets in {other} (not listed) must be refused"
            );
        }
    }
    // What it must not do.
    for (verb, namespace, object) in [
        ("create", "kube-system", None),
        ("update", "kube-system", Some("kube-controller-manager")),
        ("patch", "kube-system", Some("kube-scheduler")),
        ("patch", ns, Some("another-controllers-lease")),
        (
            "update",
            "capi-system",
            Some("controller-leader-election-capi"),
        ),
        ("delete", ns, Some(lease)),
    ] {
        assert!(
            !can(client, who, verb, LEASES, (namespace, object)).await,
            "{verb} Lease {namespace}/{object:?} must be refused"
        );
    }
    if lease != "capc-health-shim" {
        // The Role follows the release: the base's Lease name is not this release's.
        assert!(
            !can(
                client,
                who,
                "update",
                LEASES,
                (ns, Some("capc-health-shim"))
            )
            .await,
            "update the base's Lease name must be refused to release {lease}"
        );
    }
    for verb in ["list", "watch", "create", "delete"] {
        assert!(
            !can(client, who, verb, SECRETS, ("default", None)).await,
            "{verb} Secrets must be refused"
        );
    }
    for resource in ["machines", "clusters"] {
        assert!(
            !can(
                client,
                who,
                "delete",
                ("cluster.x-k8s.io", resource),
                ("default", None)
            )
            .await,
            "delete {resource} must be refused"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn clusterctl_components_apply_strictly_and_the_shim_runs_as_their_service_account() {
    let client = kube_client().await;
    let repo = tempfile::tempdir().unwrap();
    let written = tool(&["manifests", "--out", repo.path().to_str().unwrap()]);
    let files: Vec<&str> = written.lines().collect();
    assert_eq!(files.len(), 2, "{written}");
    for (f, want) in files.iter().zip(["addon-components.yaml", "metadata.yaml"]) {
        let p = Path::new(f);
        assert_eq!(p.file_name().unwrap(), want);
        // clusterctl's local repository layout: <provider-label>/<version>/<file>
        let version = p.parent().unwrap();
        assert_eq!(
            version.parent().unwrap().file_name().unwrap(),
            "addon-capc-health-shim"
        );
        assert_eq!(
            version.file_name().unwrap().to_str().unwrap(),
            format!("v{}", env!("CARGO_PKG_VERSION"))
        );
    }

    // What `clusterctl init --addon capc-health-shim --target-namespace <ns>` applies.
    let ns = test_namespace("release-clusterctl");
    let processed = tool(&[
        "clusterctl",
        "--repo",
        repo.path().to_str().unwrap(),
        "--target-namespace",
        &ns,
    ]);
    assert!(!processed.contains("${"), "a variable left: {processed}");
    let objs = docs(&processed);
    let namespaces: Vec<&Value> = objs.iter().filter(|o| kind(o) == "Namespace").collect();
    assert_eq!(namespaces.len(), 1);
    assert_eq!(name(namespaces[0]), ns);
    for o in &objs {
        assert_eq!(
            o["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            "addon-capc-health-shim",
            "{} {}",
            kind(o),
            name(o)
        );
    }
    // Defaults: the base's image and log filter.
    let c = manager(deployment(&objs));
    assert_eq!(
        c["image"],
        "ghcr.io/capc-health-shim/capc-health-shim:v0.1.0"
    );

    let installed = apply_all(&client, objs.clone(), &ns).await;
    run_as_the_release(&client, &objs, &installed).await;
    installed.cleanup(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_helm_charts_default_render_applies_strictly_and_the_shim_runs_as_its_service_account()
{
    let client = kube_client().await;
    let ns = test_namespace("release-helm");
    let rendered = tool(&["helm-template", "--namespace", &ns]);
    let objs = docs(&rendered);
    assert!(
        !objs.iter().any(|o| kind(o) == "Namespace"),
        "the chart creates no Namespace by default (helm install --create-namespace does)"
    );
    for want in [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ] {
        assert!(objs.iter().any(|o| kind(o) == want), "{want} rendered");
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .expect("the release namespace");
    let installed = apply_all(&client, objs.clone(), &ns).await;
    run_as_the_release(&client, &objs, &installed).await;
    installed.cleanup(&client).await;
}

/// target/dist/ as `make dist` wrote it (`make test` builds it): the files SHA256SUMS lists.
fn release_bundle() -> Vec<PathBuf> {
    let dist = Path::new(REPO).join("target/dist");
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS"))
        .unwrap_or_else(|e| panic!("target/dist/SHA256SUMS: {e} (run make dist)"));
    let mut files = vec![dist.join("SHA256SUMS")];
    for line in sums.lines() {
        let (_, name) = line.split_once("  ").expect("sha256sum line");
        files.push(dist.join(name));
    }
    files
}

/// Issue 43's operator path, from the release bundle alone: its files copied into an empty
/// directory (no checkout), checked with `sha256sum -c`; the packaged chart rendered by Helm's
/// library, the clusterctl files processed by clusterctl's and the kustomize tree (unpacked with
/// tar, base + the namespaced-secrets component through an overlay, built by kustomize's library)
/// each applied strictly to the real API server with the image pinned to the bundle's digest;
/// and the bundle's own CLI binary run
/// with the rendered Deployment's arguments and environment, as its ServiceAccount, until it
/// leads and answers /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver and make dist: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_release_bundle_installs_from_an_empty_directory_with_helm_clusterctl_and_kustomize() {
    let client = kube_client().await;
    let dir = tempfile::tempdir().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    for f in release_bundle() {
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap()))
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    let check = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(dir.path())
        .output()
        .expect("sha256sum");
    assert!(check.status.success(), "{check:?}");
    let digest = std::fs::read_to_string(
        dir.path()
            .join(format!("capc-health-shim-v{version}-image-digest")),
    )
    .unwrap();
    let pinned = format!(
        "ghcr.io/capc-health-shim/capc-health-shim:v{version}@{}",
        digest.trim()
    );
    let cli = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("capc-health-shim-v{version}-linux-"))
        })
        .expect("the bundle's CLI");
    let out = Command::new(&cli)
        .arg("--version")
        .output()
        .expect("the CLI runs");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(version),
        "{out:?}"
    );

    // Helm: `helm install <release> capc-health-shim-<version>.tgz -n <ns>`.
    let ns = test_namespace("bundle-helm");
    let chart = dir.path().join(format!("capc-health-shim-{version}.tgz"));
    let objs = docs(&tool(&[
        "helm-template",
        "--chart",
        chart.to_str().unwrap(),
        "--namespace",
        &ns,
    ]));
    assert_eq!(manager(deployment(&objs))["image"], pinned.as_str());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .expect("the release namespace");
    let installed = apply_all(&client, objs.clone(), &ns).await;
    run_binary_as_the_release(&cli, &client, &objs, &installed).await;
    installed.cleanup(&client).await;

    // clusterctl: the two release assets as a provider repository, `--target-namespace`.
    let repo = dir.path().join("repository");
    let vdir = repo.join(format!("addon-capc-health-shim/v{version}"));
    std::fs::create_dir_all(&vdir).unwrap();
    for f in ["addon-components.yaml", "metadata.yaml"] {
        std::fs::copy(dir.path().join(f), vdir.join(f)).unwrap();
    }
    let ns = test_namespace("bundle-clusterctl");
    let processed = tool(&[
        "clusterctl",
        "--repo",
        repo.to_str().unwrap(),
        "--target-namespace",
        &ns,
    ]);
    assert!(!processed.contains("${"), "a variable left: {processed}");
    let objs = docs(&processed);
    assert_eq!(manager(deployment(&objs))["image"], pinned.as_str());
    let installed = apply_all(&client, objs.clone(), &ns).await;
    run_binary_as_the_release(&cli, &client, &objs, &installed).await;
    installed.cleanup(&client).await;

    // kustomize: the tree unpacked with tar; the operator's overlay puts deploy/base with the
    // namespaced-secrets component into a namespace of theirs, and a second one grants Secret
    // reads in the Clusters' namespace with the component's reader (as examples/ shows).
    let tarball = dir
        .path()
        .join(format!("capc-health-shim-v{version}-kustomize.tar.gz"));
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .current_dir(dir.path())
        .output()
        .expect("tar");
    assert!(untar.status.success(), "{untar:?}");
    let tree = dir.path().join("capc-health-shim-kustomize");
    for part in ["base", "components/namespaced-secrets", "examples"] {
        assert!(tree.join(part).is_dir(), "{part}/ in the kustomize archive");
    }
    let ns = test_namespace("bundle-kustomize");
    let clusters_ns = test_namespace("bundle-kustomize-clusters");
    let shim_overlay = dir.path().join("overlay-shim");
    std::fs::create_dir_all(&shim_overlay).unwrap();
    std::fs::write(
        shim_overlay.join("kustomization.yaml"),
        format!(
            "namespace: {ns}\nresources:\n- ../capc-health-shim-kustomize/base\n\
             components:\n- ../capc-health-shim-kustomize/components/namespaced-secrets\n"
        ),
    )
    .unwrap();
    let reader_overlay = dir.path().join("overlay-reader");
    std::fs::create_dir_all(&reader_overlay).unwrap();
    std::fs::write(
        reader_overlay.join("kustomization.yaml"),
        format!(
            "namespace: {clusters_ns}\nresources:\n\
             - ../capc-health-shim-kustomize/components/namespaced-secrets/reader\n\
             patches:\n- target: {{kind: RoleBinding, name: capc-health-shim-secrets}}\n  \
             patch: |-\n    - op: replace\n      path: /subjects/0/namespace\n      value: {ns}\n"
        ),
    )
    .unwrap();
    let mut objs = docs(&tool(&[
        "kustomize",
        "--dir",
        shim_overlay.to_str().unwrap(),
    ]));
    assert_eq!(manager(deployment(&objs))["image"], pinned.as_str());
    let role = objs
        .iter()
        .find(|o| kind(o) == "ClusterRole" && name(o) == "capc-health-shim")
        .expect("the ClusterRole");
    assert!(
        !role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"]
                .as_array()
                .unwrap()
                .contains(&json!("secrets"))),
        "the namespaced-secrets component removes the cluster-wide Secrets rule"
    );
    objs.extend(docs(&tool(&[
        "kustomize",
        "--dir",
        reader_overlay.to_str().unwrap(),
    ])));
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": clusters_ns}})).unwrap(),
    )
    .await
    .expect("the Clusters' namespace");
    let installed = apply_all_in(
        &client,
        objs.clone(),
        &ns,
        std::slice::from_ref(&clusters_ns),
    )
    .await;
    run_binary_as_the_release(&cli, &client, &objs, &installed).await;
    installed.cleanup(&client).await;
}

/// Issue 43 (3): the chart with another release name, an existing ServiceAccount name, Secrets
/// read per namespace, its ServiceMonitor, PrometheusRule and dashboard, and two `config` values
/// (flags as their variables, seen in the running shim's /status) — its render applies
/// strictly (the monitoring kinds against the Prometheus Operator's CRDs), every object is named after the
/// release (so a second release elsewhere collides with nothing), and the shim runs as that
/// ServiceAccount, holding the Lease the release names, with Secrets readable in the listed
/// namespaces only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn the_helm_charts_render_with_other_values_applies_strictly_and_the_shim_runs_as_that_service_account(
) {
    let client = kube_client().await;
    let ns = test_namespace("release-helm-values");
    let secrets_ns = vec![
        test_namespace("release-helm-clusters"),
        test_namespace("release-helm-keys"),
    ];
    let release = "ops";
    let full = "ops-capc-health-shim"; // the release name does not contain the chart's
    let rendered = tool(&[
        "helm-template",
        "--namespace",
        &ns,
        "--release-name",
        release,
        "--set",
        "serviceAccount.name=shim-runner",
        "--set",
        &format!("rbac.secrets.namespaces={{{}}}", secrets_ns.join(",")),
        "--set",
        "podLabels.team=platform",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.dashboard.enabled=true",
        // Flags through the chart's config values (issue 43 (3)), seen below in /status.
        "--set",
        "config.orphanGrace=7m",
        "--set",
        "config.noRemnantReport=true",
    ]);
    let objs = docs(&rendered);
    for want in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(objs.iter().any(|o| kind(o) == want), "{want} rendered");
    }
    for o in &objs {
        let want = if kind(o) == "ServiceAccount" {
            "shim-runner"
        } else {
            full
        };
        assert!(
            name(o).starts_with(want),
            "{} {} is not named after the release ({want})",
            kind(o),
            name(o)
        );
    }
    let roles_in = |n: &str| {
        objs.iter()
            .filter(|o| kind(o) == "Role" && o["metadata"]["namespace"] == n)
            .count()
    };
    for s in &secrets_ns {
        assert_eq!(roles_in(s), 1, "one Secrets Role in {s}");
    }
    let pod = &deployment(&objs)["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "shim-runner");

    // The ServiceMonitor and PrometheusRule against the Prometheus Operator's own schema.
    kube_support::monitoring_crds::ensure_monitoring_crds(&client, FIELD_MANAGER).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    for n in std::iter::once(&ns).chain(&secrets_ns) {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
        )
        .await
        .expect("a namespace of the test");
    }
    let env = manager(deployment(&objs))["env"].clone();
    for (var, value) in [
        ("CAPC_HEALTH_ORPHAN_GRACE", "7m"),
        ("CAPC_HEALTH_NO_REMNANT_REPORT", "true"),
    ] {
        assert!(
            env.as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == var && e["value"] == value),
            "{var}={value} in {env}"
        );
    }
    let installed = apply_all_in(&client, objs.clone(), &ns, &secrets_ns).await;
    let status = run_as_the_release(&client, &objs, &installed).await;
    // The running shim took them: the default orphan grace is 15m, the remnant report on.
    assert_eq!(
        status["orphan_detection"]["grace_seconds"].as_f64(),
        Some(420.0),
        "{}",
        status["orphan_detection"]
    );
    assert_eq!(
        status["remnant_detection"]["enabled"], false,
        "{}",
        status["remnant_detection"]
    );
    installed.cleanup(&client).await;
}

/// `extraCA` of the chart: the CA Secret's files are mounted and SSL_CERT_DIR names the mount next
/// to the system CAs, which the shim's CloudStack client (rustls with the platform verifier)
/// reads. Checked with `capc-health-shim check`, which builds that client as `run` does, against
/// cloudstack-sim over HTTPS with a certificate of this test: trusted with the chart's
/// SSL_CERT_DIR (the mount path mapped to a directory holding the Secret's key as a file), refused
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Go and the module proxy for hack/release: `make test` runs it"]
async fn the_charts_extra_ca_is_trusted_by_the_shims_cloudstack_client() {
    use cloudstack_sim::{self as sim, Simulator, World};
    let rendered = tool(&[
        "helm-template",
        "--namespace",
        "capc-health-shim-system",
        "--set",
        "extraCA.secretName=corporate-ca",
    ]);
    let objs = docs(&rendered);
    let d = deployment(&objs);
    let c = manager(d);
    let mount = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"] == "extra-ca")
        .expect("the extra CA mount");
    let mount_path = mount["mountPath"].as_str().unwrap();
    let volume = d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "extra-ca")
        .expect("the extra CA volume");
    assert_eq!(volume["secret"]["secretName"], "corporate-ca");
    let cert_dir = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SSL_CERT_DIR")
        .and_then(|e| e["value"].as_str())
        .expect("SSL_CERT_DIR");
    assert!(
        cert_dir.split(':').any(|p| p == mount_path),
        "{cert_dir} names {mount_path}"
    );

    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let tls = sim::tls_config(
        cert.cert.pem().as_bytes(),
        cert.signing_key.serialize_pem().as_bytes(),
    )
    .unwrap();
    let world = World::default_world("ca-key", "ca-secret", sim::real_now_ms());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = sim::serve_tls(listener, Simulator::with_time_scale(world, 0.0), tls)
        .await
        .unwrap();
    assert!(server.api_url().starts_with("https://"));

    // The Secret as the kubelet mounts it: one file per key.
    let secret_dir = tempfile::tempdir().unwrap();
    std::fs::write(secret_dir.path().join("ca.crt"), cert.cert.pem()).unwrap();
    let mapped = cert_dir.replace(mount_path, secret_dir.path().to_str().unwrap());
    let check = |cert_dir: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"));
        cmd.args(["check", "--polls", "1"])
            .env("CLOUDSTACK_API_URL", server.api_url())
            .env("CLOUDSTACK_API_KEY", "ca-key")
            .env("CLOUDSTACK_SECRET_KEY", "ca-secret")
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR");
        if let Some(d) = cert_dir {
            cmd.env("SSL_CERT_DIR", d);
        }
        cmd.output().expect("check runs")
    };
    let trusted = check(Some(&mapped));
    assert_eq!(
        trusted.status.code(),
        Some(0),
        "with the chart's SSL_CERT_DIR: {}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    let refused = check(None);
    let err = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert_eq!(refused.status.code(), Some(3), "unreachable: {err}");
    assert!(err.contains("certificate"), "{err}");
    server.shutdown().await;
}
