//! Watches (reflectors) of the objects the shim reads, kept as records: one watch per
//! namespace of `--namespace` (or one of the whole cluster), each noting what changed for the
//! cycle's joins and ignoring a read older than the record it holds.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource};
use kube::runtime::reflector::{self, Lookup, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

use crate::controller::joins::{Changed, ChangedKinds, Records};
use crate::k8s::views::{Partial, View};
use crate::k8s::watched::{
    keep_newer, CloudStackMachineRecord, ClusterRecord, ConditionReader, FailureDomainRecord,
    HealthCheckRecord, MachineRecord, Versioned,
};

use super::Resources;

/// The watched objects as records ([`crate::k8s::watched`]), kept current by watches. Each
/// watch reads its objects as typed partial views ([`crate::k8s::views`]), tolerant field by
/// field, so a malformed object cannot break it.
#[derive(Clone)]
pub struct Stores {
    pub machines: Watched<MachineRecord>,
    pub cloudstack_machines: Watched<CloudStackMachineRecord>,
    pub failure_domains: Watched<FailureDomainRecord>,
    pub clusters: Watched<ClusterRecord>,
    pub health_checks: Watched<HealthCheckRecord>,
}

/// The records of one kind, from one watch per namespace of `--namespace` (or one watch of
/// the whole cluster without it).
#[derive(Clone)]
pub struct Watched<R: Lookup<DynamicType = ()> + Clone + 'static> {
    stores: Vec<Store<R>>,
    /// What the watches applied since the last [`Watched::take_changed`].
    changed: Arc<std::sync::Mutex<Changed>>,
    /// The objects deleted since the last [`Watched::take_departed`], as they last were (at
    /// most [`DEPARTED_MAX`]): what an object looked like when it went, which a cycle that
    /// never saw it deleting cannot tell otherwise (the scorecard: who recycled a Machine).
    departed: Arc<std::sync::Mutex<Vec<R>>>,
}

/// Deleted objects kept between two cycles; past it the oldest are dropped.
pub const DEPARTED_MAX: usize = crate::controller::joins::NOTED_KEYS_MAX;

impl<R> Watched<R>
where
    R: Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Every record, over all watched namespaces.
    pub fn state(&self) -> Vec<Arc<R>> {
        match self.stores.as_slice() {
            [one] => one.state(),
            many => many.iter().flat_map(|s| s.state()).collect(),
        }
    }

    /// The record of one object, from the store of its namespace.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<R>> {
        let key = ObjectRef::new(name).within(namespace);
        self.stores.iter().find_map(|s| s.get(&key))
    }

    /// The objects deleted since the last call, as they last were (and forgets them).
    pub fn take_departed(&self) -> Vec<R> {
        std::mem::take(&mut *self.departed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What the watches applied since the last call (and forgets it).
    pub fn take_changed(&self) -> Changed {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    async fn wait_until_ready(&self) {
        for s in &self.stores {
            let _ = s.wait_until_ready().await;
        }
    }
}

impl Records for Stores {
    fn machines(&self) -> Vec<Arc<MachineRecord>> {
        self.machines.state()
    }
    fn machine(&self, namespace: &str, name: &str) -> Option<Arc<MachineRecord>> {
        self.machines.get(namespace, name)
    }
    fn cloudstack_machines(&self) -> Vec<Arc<CloudStackMachineRecord>> {
        self.cloudstack_machines.state()
    }
    fn cloudstack_machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<CloudStackMachineRecord>> {
        self.cloudstack_machines.get(namespace, name)
    }
    fn failure_domains(&self) -> Vec<Arc<FailureDomainRecord>> {
        self.failure_domains.state()
    }
    fn clusters(&self) -> Vec<Arc<ClusterRecord>> {
        self.clusters.state()
    }
    fn health_checks(&self) -> Vec<Arc<HealthCheckRecord>> {
        self.health_checks.state()
    }
}

/// Watches `ar` in each of `namespaces` (all namespaces when empty) as the view `V` and keeps,
/// per object, the record `read` takes from it.
fn watch<V, R>(
    client: &Client,
    ar: &ApiResource,
    namespaces: &[String],
    read: impl Fn(V) -> Option<R> + Clone + Send + 'static,
) -> Watched<R>
where
    V: View,
    R: Lookup<DynamicType = ()> + Versioned + Clone + Send + Sync + 'static,
{
    let apis: Vec<Api<Partial<V>>> = if namespaces.is_empty() {
        vec![Api::all_with(client.clone(), ar)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced_with(client.clone(), ns, ar))
            .collect()
    };
    let changed = Arc::new(std::sync::Mutex::new(Changed::default()));
    let departed = Arc::new(std::sync::Mutex::new(Vec::new()));
    Watched {
        stores: apis
            .into_iter()
            .map(|api| {
                watch_one(
                    api,
                    ar.kind.clone(),
                    read.clone(),
                    changed.clone(),
                    departed.clone(),
                )
            })
            .collect(),
        changed,
        departed,
    }
}

fn watch_one<V, R>(
    api: Api<Partial<V>>,
    kind: String,
    read: impl Fn(V) -> Option<R> + Send + 'static,
    changed: Arc<std::sync::Mutex<Changed>>,
    departed: Arc<std::sync::Mutex<Vec<R>>>,
) -> Store<R>
where
    V: View,
    R: Lookup<DynamicType = ()> + Versioned + Clone + Send + Sync + 'static,
{
    let mut writer = reflector::store::Writer::<R>::new(());
    let reader = writer.as_reader();
    let reader_of_writer = writer.as_reader();
    let events = watcher(api, watcher::Config::default().any_semantic()).default_backoff();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    let Some(event) = record_event(event, &read) else {
                        continue;
                    };
                    let (event, stale) =
                        keep_newer(event, |o| reader_of_writer.get(&o.to_object_ref(())));
                    if stale {
                        tracing::debug!(kind = %kind, "a read older than the one kept was ignored (relist from a lagging cache)");
                    }
                    if let Some(event) = event {
                        // The store first, then the note (see `controller::joins`).
                        writer.apply_watcher_event(&event);
                        changed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .note(&event);
                        if let watcher::Event::Delete(gone) = &event {
                            let mut d = departed.lock().unwrap_or_else(|e| e.into_inner());
                            if d.len() == DEPARTED_MAX {
                                d.remove(0);
                            }
                            d.push(gone.clone());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(kind = %kind, error = %e, "watch error; retrying with back-off")
                }
            }
        }
    });
    reader
}

/// The event with its object replaced by the object's record; `None` for an object that has
/// none (no name: the API server sends no such object).
fn record_event<V, R>(
    event: watcher::Event<Partial<V>>,
    read: impl Fn(V) -> Option<R>,
) -> Option<watcher::Event<R>> {
    use watcher::Event;
    let record = |o: Partial<V>| read(o.view);
    Some(match event {
        Event::Apply(o) => Event::Apply(record(o)?),
        Event::Delete(o) => Event::Delete(record(o)?),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(record(o)?),
        Event::InitDone => Event::InitDone,
    })
}

impl Stores {
    /// What each watch applied since the last call.
    pub fn take_changed(&self) -> ChangedKinds {
        ChangedKinds {
            machines: self.machines.take_changed(),
            cloudstack_machines: self.cloudstack_machines.take_changed(),
            failure_domains: self.failure_domains.take_changed(),
            clusters: self.clusters.take_changed(),
            health_checks: self.health_checks.take_changed(),
        }
    }

    /// Starts the watches in `namespaces` (every namespace when empty: `--namespace` unset);
    /// `reader` says how to read our condition off a Machine.
    pub fn start(
        client: &Client,
        r: &Resources,
        reader: ConditionReader,
        namespaces: &[String],
    ) -> Self {
        let reader = Arc::new(reader);
        Self {
            machines: watch(client, &r.machine, namespaces, move |m| {
                MachineRecord::from_view(m, &reader)
            }),
            cloudstack_machines: watch(
                client,
                &r.cloudstack_machine,
                namespaces,
                CloudStackMachineRecord::from_view,
            ),
            failure_domains: watch(
                client,
                &r.failure_domain,
                namespaces,
                FailureDomainRecord::from_view,
            ),
            clusters: watch(client, &r.cluster, namespaces, ClusterRecord::from_view),
            health_checks: watch(client, &r.mhc, namespaces, HealthCheckRecord::from_view),
        }
    }

    pub async fn wait_until_ready(&self, timeout: Duration) -> bool {
        let all = async {
            let _ = self.machines.wait_until_ready().await;
            let _ = self.cloudstack_machines.wait_until_ready().await;
            let _ = self.failure_domains.wait_until_ready().await;
            let _ = self.clusters.wait_until_ready().await;
            let _ = self.health_checks.wait_until_ready().await;
        };
        tokio::time::timeout(timeout, all).await.is_ok()
    }
}
