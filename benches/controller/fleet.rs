//! The fleet of the controller bench: an in-process `cloudstack-sim` holding N healthy VMs,
//! and in the API server N Machines + CloudStackMachines (the shapes of
//! `tests/kube_support`'s `Fixture`) over [`CLUSTERS`] clusters, each with its failure domain
//! and MachineHealthCheck, all pointing at one endpoint Secret: one CloudStack scope, or one
//! per project when the clusters' failure domains name projects ([`Projects`]: the VMs of
//! cluster `c` in project `c % scopes`). Plus a watch of the Machines that tracks the shim's
//! condition on each.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use capc_health_shim::controller::kube_io::{self, Resources};
use capi_model::apis::{choose, ApiChoice, Mode};
use cloudstack_sim::{self as sim, SimServer, Simulator};
use futures::stream::{self, StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::{json, Value};

pub const SIM_KEY: &str = "bench-key";
pub const SIM_SECRET: &str = "bench-secret";
pub const ZONE_ID: &str = "1d8d87d4-1425-459c-8d81-c6f57dca2bd2";
pub const NAMESPACE: &str = "bench";
pub const CONDITION: &str = "CloudStackVMHealthy";
/// Clusters the Machines are spread over (round robin).
pub const CLUSTERS: usize = 10;
/// The owner uid of the anchor's Machines (a MachineSet that does not exist).
const ABSENT_OWNER_UID: &str = "6a2b7a5e-1a62-4d2f-9d84-0d8c7a1f0b11";
/// Objects created concurrently during set-up.
const CREATE_CONCURRENCY: usize = 24;

/// Which fleet a size is measured with (issue 28): almost every Machine of a running
/// management cluster has its Node (`status.nodeRef`), and the shim then only lists its VM;
/// a fleet being created has none, and every VM is also asked for its traffic statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FleetKind {
    /// Every Machine has its Node: the common case.
    #[default]
    Steady,
    /// No Machine has a Node yet: mass provisioning, the worst case.
    Provisioning,
}

impl FleetKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::Provisioning => "provisioning",
        }
    }

    /// The reason every Machine of this fleet ends at: with a Node the VM only has to run
    /// (`VMRunning`: the Node's health is MHC's); without one the traffic must show a live
    /// guest (`VMHealthy`, after a few stats samples).
    pub fn healthy_reason(self) -> &'static str {
        match self {
            Self::Steady => "VMRunning",
            Self::Provisioning => "VMHealthy",
        }
    }
}

pub fn machine_name(i: usize) -> String {
    format!("m-{i:05}")
}

fn cluster_name(i: usize) -> String {
    format!("c{}", i % CLUSTERS)
}

/// The CloudStack projects of a fleet in more than one scope: their ids, one per scope (none:
/// one scope, no project). A failure domain names its project by id: a name cannot be sent as
/// `projectid`, and the shim would list every project the key sees in each scope.
pub type Projects = Vec<String>;

/// The project (an index into [`Projects`]) of Machine `i`'s cluster.
fn project_of(i: usize, projects: &Projects) -> Option<&String> {
    (!projects.is_empty()).then(|| &projects[(i % CLUSTERS) % projects.len()])
}

/// The simulator: `n` Running healthy VMs `vm-<i>` (ids returned in order), stats every
/// `stats_interval` s, real-time clock; the shim's account is of `account_type`. With
/// `scopes` > 1, that many projects of the account hold the VMs (cluster `c`'s in project
/// `c % scopes`).
pub async fn simulator(
    n: usize,
    stats_interval: u64,
    account_type: &str,
    scopes: usize,
) -> Result<(Simulator, SimServer, Vec<String>, Projects)> {
    let ids: Vec<String> = (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let projects: Projects = if scopes > 1 {
        (0..scopes)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect()
    } else {
        Vec::new()
    };
    let vms: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut vm = json!({"name": format!("vm-{i}"), "id": id, "guest": "healthy", "state": "Running"});
            if let Some(p) = project_of(i, &projects) {
                vm["project"] = json!(project_name(p, &projects));
            }
            vm
        })
        .collect();
    let project_objects: Vec<Value> = projects
        .iter()
        .map(|p| json!({"name": project_name(p, &projects), "id": p, "members": ["admin"]}))
        .collect();
    let scenario = json!({
        "settings": {"stats_interval_seconds": stats_interval, "boot_seconds": 1},
        "accounts": [{"name": "admin", "type": account_type, "api_key": SIM_KEY, "secret_key": SIM_SECRET}],
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "projects": project_objects,
        "vms": vms,
    });
    let world = sim::parse_scenario(
        &scenario.to_string(),
        "bench",
        sim::real_now_ms(),
        (SIM_KEY, SIM_SECRET),
    )
    .map_err(|e| anyhow::anyhow!("scenario: {e:?}"))?;
    let simulator = Simulator::with_time_scale(world, 1.0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = sim::serve(listener, simulator.clone()).await?;
    Ok((simulator, server, ids, projects))
}

fn project_name(id: &str, projects: &Projects) -> String {
    let i = projects.iter().position(|p| p == id).unwrap_or(0);
    format!("scope-{i}")
}

pub struct Kube {
    pub client: Client,
    pub choice: ApiChoice,
    pub resources: Resources,
}

impl Kube {
    pub async fn connect(kubeconfig: &std::path::Path) -> Result<Self> {
        let client = test_support::apiserver::client_from_kubeconfig(kubeconfig).await;
        let (served, _) = kube_io::discover(&client).await;
        let choice = choose(&served, None).map_err(|e| anyhow::anyhow!("{e}"))?;
        let resources = Resources::for_choice(&choice);
        Ok(Self {
            client,
            choice,
            resources,
        })
    }

    /// Creates the object (one that exists already is kept); its uid.
    async fn create(&self, r: &ApiResource, body: Value) -> Result<String> {
        let api: Api<DynamicObject> = if r.kind == "Namespace" {
            Api::all_with(self.client.clone(), r)
        } else {
            Api::namespaced_with(self.client.clone(), NAMESPACE, r)
        };
        let obj: DynamicObject = serde_json::from_value(body)?;
        let mut attempt = 0;
        loop {
            match api.create(&PostParams::default(), &obj).await {
                Ok(o) => return Ok(o.metadata.uid.unwrap_or_default()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let name = obj.metadata.name.as_deref().unwrap_or_default();
                    return Ok(api.get(name).await?.metadata.uid.unwrap_or_default());
                }
                Err(e) if attempt < 5 => {
                    attempt += 1;
                    eprintln!("  create {} retry {attempt}: {e}", r.kind);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("create {}", r.kind)),
            }
        }
    }

    /// Namespace, endpoint Secret, per cluster the Cluster, failure domain and MHC, then the
    /// Machines + CloudStackMachines (Machine `i` → VM `ids[i]`), [`CREATE_CONCURRENCY`] in
    /// flight. With `owners` (the shim's rows), also what CAPI makes around them — per cluster
    /// the MachineSet that owns its Machines, per Machine its KubeadmConfig — so that the remnant
    /// report watches as many objects as in a real fleet and finds every owner present;
    /// without (the CAPI core anchor, whose MachineSet controller would act on a MachineSet),
    /// the Machines' owner is a MachineSet that does not exist.
    pub async fn populate(
        &self,
        api_url: &str,
        ids: &[String],
        kind: FleetKind,
        owners: bool,
        projects: &Projects,
    ) -> Result<()> {
        let ar = |g: &str, v: &str, k: &str, p: &str| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), p)
        };
        self.create(
            &ar("", "v1", "Namespace", "namespaces"),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        .await?;
        self.create(&ar("", "v1", "Secret", "secrets"), json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "acs", "namespace": NAMESPACE},
            "stringData": {"api-url": api_url, "api-key": SIM_KEY, "secret-key": SIM_SECRET, "verify-ssl": "false"}}))
            .await?;
        let r = &self.resources;
        for c in 0..CLUSTERS {
            let cluster = cluster_name(c);
            let fd = &r.failure_domain;
            let mut fd_spec = json!({"name": "fd1", "zone": {"name": "zone-a", "id": ZONE_ID, "network": {"name": "capi-shared"}},
                         "acsEndpoint": {"name": "acs", "namespace": NAMESPACE}});
            if let Some(p) = project_of(c, projects) {
                fd_spec["project"] = json!(p);
            }
            self.create(fd, json!({"apiVersion": fd.api_version, "kind": "CloudStackFailureDomain",
                "metadata": {"name": format!("{cluster}-fd1-hash"), "namespace": NAMESPACE, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
                "spec": fd_spec})).await?;
            self.create(
                &r.cluster,
                json!({"apiVersion": r.cluster.api_version, "kind": "Cluster",
                "metadata": {"name": cluster, "namespace": NAMESPACE},
                "spec": {"controlPlaneEndpoint": {"host": "10.1.1.2", "port": 6443}}}),
            )
            .await?;
            let mut mhc = json!({"apiVersion": r.mhc.api_version, "kind": "MachineHealthCheck",
                "metadata": {"name": format!("{cluster}-mhc"), "namespace": NAMESPACE},
                "spec": {"clusterName": cluster, "selector": {}}});
            if self.choice.mode == Mode::Condition {
                mhc["spec"]["checks"] = json!({"unhealthyMachineConditions": [{"type": CONDITION, "status": "False", "timeoutSeconds": 0}]});
            }
            self.create(&r.mhc, mhc).await?;
        }
        let mut machine_sets = Vec::new();
        for c in 0..CLUSTERS {
            machine_sets.push(if owners {
                self.machine_set(&cluster_name(c)).await?
            } else {
                ABSENT_OWNER_UID.to_string()
            });
        }
        let machine_sets = &machine_sets;
        stream::iter(ids.iter().enumerate())
            .map(|(i, id)| self.machine(i, id, kind, &machine_sets[i % CLUSTERS], owners))
            .buffer_unordered(CREATE_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// The MachineSet `<cluster>-md-0` (no replicas: nothing in the bench reconciles it); its
    /// uid.
    async fn machine_set(&self, cluster: &str) -> Result<String> {
        let r = &self.resources;
        let ms = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&r.machine.group, &r.machine.version, "MachineSet"),
            "machinesets",
        );
        let template_ref = if r.machine.version == "v1beta2" {
            json!({"apiGroup": r.cloudstack_machine.group, "kind": "CloudStackMachineTemplate", "name": format!("{cluster}-md-0")})
        } else {
            json!({"apiVersion": r.cloudstack_machine.api_version, "kind": "CloudStackMachineTemplate", "name": format!("{cluster}-md-0")})
        };
        let labels = json!({"cluster.x-k8s.io/cluster-name": cluster, "pool": "md-0"});
        self.create(&ms, json!({
            "apiVersion": ms.api_version, "kind": "MachineSet",
            "metadata": {"name": format!("{cluster}-md-0"), "namespace": NAMESPACE, "labels": labels},
            "spec": {"clusterName": cluster, "replicas": 0, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": "bootstrap"}, "infrastructureRef": template_ref}}}
        }))
        .await
        .context("MachineSet")
    }

    /// Machine `m-<i>` owned by MachineSet `owner_uid`, its CloudStackMachine with instance
    /// `id` (and with `owners` its KubeadmConfig); in the steady fleet the Machine's status
    /// names its Node (as CAPI's Machine controller writes it).
    async fn machine(
        &self,
        i: usize,
        id: &str,
        kind: FleetKind,
        owner_uid: &str,
        owners: bool,
    ) -> Result<()> {
        let name = machine_name(i);
        let cluster = cluster_name(i);
        let r = &self.resources;
        let csm = &r.cloudstack_machine;
        let infra_ref = if r.machine.version == "v1beta2" {
            json!({"apiGroup": csm.group, "kind": "CloudStackMachine", "name": format!("{name}-csm")})
        } else {
            json!({"apiVersion": csm.api_version, "kind": "CloudStackMachine", "name": format!("{name}-csm")})
        };
        let machine_uid = self.create(&r.machine, json!({
            "apiVersion": r.machine.api_version, "kind": "Machine",
            "metadata": {"name": name, "namespace": NAMESPACE,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster, "pool": "md-0"},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": format!("{cluster}-md-0"),
                    "uid": owner_uid, "controller": true}]},
            "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": "bootstrap"}, "infrastructureRef": infra_ref}
        })).await?;
        if owners {
            let kc = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(
                    "bootstrap.cluster.x-k8s.io",
                    &r.machine.version,
                    "KubeadmConfig",
                ),
                "kubeadmconfigs",
            );
            self.create(&kc, json!({
                "apiVersion": kc.api_version, "kind": "KubeadmConfig",
                "metadata": {"name": name, "namespace": NAMESPACE,
                    "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                    "ownerReferences": [{"apiVersion": r.machine.api_version, "kind": "Machine", "name": name,
                        "uid": machine_uid, "controller": true}]},
                "spec": {"format": "cloud-config"}
            }))
            .await?;
        }
        if kind == FleetKind::Steady {
            // v1beta1's nodeRef is an ObjectReference, v1beta2's names the Node only: the API
            // server prunes the fields its version does not have.
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), NAMESPACE, &r.machine);
            let status =
                json!({"status": {"nodeRef": {"apiVersion": "v1", "kind": "Node", "name": name}}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("status.nodeRef of {name}"))?;
        }
        self.create(csm, json!({
            "apiVersion": csm.api_version, "kind": "CloudStackMachine",
            "metadata": {"name": format!("{name}-csm"), "namespace": NAMESPACE, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {"offering": {"name": "small"}, "template": {"name": "ubuntu"}, "failureDomainName": "fd1", "instanceID": id}
        })).await?;
        Ok(())
    }
}

/// What the bench's own watch of the Machines has seen of the shim's condition.
#[derive(Debug, Default)]
pub struct Verdicts {
    /// Machine → current status of the condition (absent: no condition yet).
    pub status: HashMap<String, String>,
    /// Every Machine that was `False` at some point, with when that was first seen.
    pub first_false: HashMap<String, Instant>,
    /// `(reason, message)` last seen per Machine.
    pub last: HashMap<String, (String, String)>,
    /// Updates that changed a Machine's existing condition (status, reason or message).
    pub changes: u64,
    /// The condition history of the first Machine (`m-00000`), at most 40 entries.
    pub trace: Vec<(Instant, String, String, String)>,
}

impl Verdicts {
    pub fn with_condition(&self) -> usize {
        self.status.len()
    }

    /// `status/reason` → Machines.
    pub fn census(&self) -> String {
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for (name, st) in &self.status {
            let reason = self.last.get(name).map(|l| l.0.as_str()).unwrap_or("");
            *by.entry(format!("{st}/{reason}")).or_default() += 1;
        }
        by.iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Machines whose condition has this reason.
    pub fn with_reason(&self, reason: &str) -> usize {
        self.last.values().filter(|l| l.0 == reason).count()
    }

    pub fn false_now(&self) -> HashSet<String> {
        self.status
            .iter()
            .filter(|(_, s)| *s == "False")
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// Watches the Machines of [`NAMESPACE`] (directly on the API server, never through the
/// soak's proxy) and keeps [`Verdicts`] current.
pub fn watch_verdicts(kube: &Kube) -> (Arc<Mutex<Verdicts>>, tokio::task::JoinHandle<()>) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(kube.client.clone(), NAMESPACE, &kube.resources.machine);
    let pointer = kube.choice.layout.conditions_pointer();
    let state = Arc::new(Mutex::new(Verdicts::default()));
    let s = state.clone();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects());
        while let Some(ev) = events.next().await {
            let Ok(m) = ev else { continue };
            let name = m.metadata.name.clone().unwrap_or_default();
            let cond = m
                .data
                .pointer(pointer)
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION));
            let text = |c: &Value, k: &str| c[k].as_str().unwrap_or("").to_string();
            let mut v = s.lock().unwrap();
            match cond {
                Some(c) => {
                    let (st, reason, message) =
                        (text(c, "status"), text(c, "reason"), text(c, "message"));
                    if st == "False" {
                        v.first_false
                            .entry(name.clone())
                            .or_insert_with(Instant::now);
                    }
                    let now = (reason.clone(), message.clone());
                    let before_status = v.status.insert(name.clone(), st.clone());
                    let before = v.last.insert(name.clone(), now.clone());
                    let changed =
                        before_status.as_ref() != Some(&st) || before.as_ref() != Some(&now);
                    if before.is_some() && changed {
                        v.changes += 1;
                    }
                    if changed && name == "m-00000" && v.trace.len() < 40 {
                        v.trace.push((Instant::now(), st, reason, message));
                    }
                }
                None => {
                    v.status.remove(&name);
                }
            }
        }
    });
    (state, task)
}
