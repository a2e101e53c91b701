//! The actors of a simulated cluster, each an ordinary API client with its own caches:
//! - the **DaemonSet controller** carries out [`daemonset::plan`] for every DaemonSet;
//! - the **ReplicaSet controller** carries out [`replicaset::plan`] for every ReplicaSet (the GPU
//!   workloads' pods);
//! - the **scheduler** binds pods that name no node to a node they fit, GPU requests included;
//! - the **disruption controller** keeps each PodDisruptionBudget's status ([`disruption::status`]);
//! - the **kubelets** advance every pod on a simulated node with [`kubelet::step`], keep each host's state
//!   in line with the operand pods that run there, and report what the node advertises (the device plugin's
//!   resources, feature discovery's labels, the MIG manager's state);
//! - with heartbeats in the timing, the kubelets' **signs of life**: each running node's Lease renewed and
//!   its status reported on the [`crate::heartbeat::Schedule`].
//!
//! Each actor works in passes: a pass reads its caches, decides, then writes; changes in the caches (or a
//! wake-up time a pass asked for) start the next pass, and changes that arrive together make one pass. A
//! change that arrives while a pass runs is not lost: every actor keeps its own mark of the last change it
//! has seen. Writes the caches have not shown yet are remembered for a few seconds so that they are not
//! made twice ("expectations", as the real controllers keep them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpuop_api::Operand;
use gpuop_api::catalogue::status_file;
use gpuop_api::labels::{self, MIG_CONFIG, MIG_CONFIG_STATE};
use gpuop_api::placement::pod_fits;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus, ReplicaSet};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Binding, ConfigMap, Namespace, Node, ObjectReference, Pod, PodCondition, PodSpec,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::daemonset;
use crate::disruption;
use crate::heartbeat::{Heartbeats, LEASE_NAMESPACE, Schedule};
use crate::host::{Host, PluginSettings};
use crate::kubelet::{self, operand_of};
use crate::operands::{config_map_volumes, driver_version, mig_layout, plugin_settings};
use crate::replicaset;
use crate::simulation::{Plays, SimState};

/// How long a write is expected to show in the caches before it is retried.
const EXPECTATION: Duration = Duration::from_secs(10);

/// Changes that arrive this close together are handled by one pass. A pass reads every node and pod, so
/// a pass per change would cost the square of the cluster's size while thousands of pods start at once;
/// an actor whose last pass took longer gathers changes for twice as long (see [`Pace`]).
const COALESCE: Duration = Duration::from_millis(10);

/// The longest an actor gathers changes: a pass that made thousands of writes took long, and the next
/// one should not wait as long.
const GATHER_AT_MOST: Duration = Duration::from_secs(1);

/// Starts the actors of the parts the simulation plays.
pub fn spawn(
    client: Client,
    state: Arc<SimState>,
    plays: Plays,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let changed = Arc::new(watch::Sender::new(()));
    let nodes = cache::<Node>(Api::all(client.clone()), &changed, &shutdown);
    let pods = cache::<Pod>(Api::all(client.clone()), &changed, &shutdown);
    let daemonsets = cache::<DaemonSet>(Api::all(client.clone()), &changed, &shutdown);
    let revisions = cache::<ControllerRevision>(Api::all(client.clone()), &changed, &shutdown);
    let config_maps = cache::<ConfigMap>(Api::all(client.clone()), &changed, &shutdown);
    let (synced_sender, synced) = watch::channel(false);
    let caches = Caches {
        nodes,
        pods,
        daemonsets,
        revisions,
        config_maps,
        synced,
        changed,
    };
    caches.signal_when_synced(synced_sender);
    let mut tasks = Vec::new();
    if plays == Plays::Cluster {
        tasks.push(tokio::spawn(daemonset_controller(
            client.clone(),
            caches.clone(),
            shutdown.clone(),
        )));
        // Only the ReplicaSet controller reads ReplicaSets: playing the nodes of a real cluster needs no
        // right to watch them.
        let replica_sets = cache::<ReplicaSet>(Api::all(client.clone()), &caches.changed, &shutdown);
        tasks.push(tokio::spawn(replicaset_controller(
            client.clone(),
            caches.clone(),
            replica_sets,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(scheduler(
            client.clone(),
            caches.clone(),
            shutdown.clone(),
        )));
        let budgets = cache::<PodDisruptionBudget>(Api::all(client.clone()), &caches.changed, &shutdown);
        tasks.push(tokio::spawn(disruption_controller(
            client.clone(),
            caches.clone(),
            budgets,
            shutdown.clone(),
        )));
    }
    if let Some(heartbeats) = state.timing.heartbeats {
        tasks.push(tokio::spawn(node_heartbeats(
            client.clone(),
            caches.clone(),
            state.clone(),
            heartbeats,
            shutdown.clone(),
        )));
    }
    tasks.push(tokio::spawn(kubelets(client, caches, state, shutdown)));
    tasks
}

#[derive(Clone, Debug)]
struct Caches {
    nodes: Store<Node>,
    pods: Store<Pod>,
    daemonsets: Store<DaemonSet>,
    revisions: Store<ControllerRevision>,
    config_maps: Store<ConfigMap>,
    synced: watch::Receiver<bool>,
    /// Bumped after any cache has applied a change.
    changed: Arc<watch::Sender<()>>,
}

impl Caches {
    /// Waits until every cache has listed once. Any number of actors may wait: kube's
    /// `Store::wait_until_ready` wakes only the last of several concurrent waiters, so one task waits on the
    /// stores and the actors on its signal.
    async fn ready(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|synced| *synced).await;
    }

    /// An actor's own view of the changes: it remembers which change it saw last, so a change made
    /// while the actor was busy still starts its next pass.
    fn changes(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    fn signal_when_synced(&self, synced: watch::Sender<bool>) {
        let stores = self.clone();
        tokio::spawn(async move {
            let _ = stores.nodes.wait_until_ready().await;
            let _ = stores.pods.wait_until_ready().await;
            let _ = stores.daemonsets.wait_until_ready().await;
            let _ = stores.revisions.wait_until_ready().await;
            let _ = stores.config_maps.wait_until_ready().await;
            synced.send_replace(true);
        });
    }
}

fn cache<K>(api: Api<K>, changed: &Arc<watch::Sender<()>>, shutdown: &CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    // Managed fields are most of a stored object and no actor reads them.
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer);
    let changed = changed.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                item = stream.next() => match item {
                    Some(Ok(_)) => {
                        changed.send_replace(());
                    }
                    Some(Err(error)) => debug!(%error, "simulator watch failed; retrying"),
                    None => break,
                },
            }
        }
    });
    reader
}

/// How long an actor's passes take, so that changes are gathered for twice as long as a pass took (between
/// [`COALESCE`] and [`GATHER_AT_MOST`]): an actor over thousands of nodes then spends at most a third of its
/// time in passes while changes pour in (at 10,000 nodes the DaemonSet controller's passes took 43% of the
/// process's CPU in a profile when it gathered for as long as a pass took, leaving the API server and the
/// kubelets the rest), and one over a few nodes answers within [`COALESCE`].
#[derive(Debug)]
struct Pace {
    pass_began: Instant,
}

impl Pace {
    fn new() -> Self {
        Self {
            pass_began: Instant::now(),
        }
    }

    /// How long to gather changes after the first one, given that the last pass has just ended.
    fn gather(&self) -> Duration {
        (self.pass_began.elapsed() * 2).clamp(COALESCE, GATHER_AT_MOST)
    }

    fn begin_pass(&mut self) {
        self.pass_began = Instant::now();
    }
}

/// Waits for a change not seen yet, a wake-up time or shutdown; returns false on shutdown. The change is
/// marked seen before the pass reads the caches, so one made during the pass starts another.
async fn next_pass(
    changed: &mut watch::Receiver<()>,
    wake: Option<Duration>,
    pace: &mut Pace,
    shutdown: &CancellationToken,
) -> bool {
    let wake = wake.unwrap_or(Duration::from_secs(5));
    let gather = pace.gather();
    let proceed = tokio::select! {
        () = shutdown.cancelled() => false,
        _ = changed.changed() => gather_changes(gather, shutdown).await,
        () = tokio::time::sleep(wake) => true,
    };
    changed.borrow_and_update();
    pace.begin_pass();
    proceed
}

/// Lets the changes that follow one change arrive; returns false on shutdown.
async fn gather_changes(gather: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(gather) => true,
    }
}

/// Writes made recently that the caches have not shown yet.
#[derive(Debug, Default)]
struct Expectations<K: Ord> {
    pending: BTreeMap<K, Instant>,
}

impl<K: Ord> Expectations<K> {
    fn expect(&mut self, key: K) {
        self.pending.insert(key, Instant::now());
    }

    /// Forgets writes made too long ago, so that they are made again; once per pass, not per key
    /// (thousands of pods are expected at once when a DaemonSet fans out).
    fn expire(&mut self) {
        let now = Instant::now();
        self.pending.retain(|_, at| now.duration_since(*at) < EXPECTATION);
    }

    fn pending(&self, key: &K) -> bool {
        self.pending.contains_key(key)
    }

    fn observed(&mut self, key: &K) {
        self.pending.remove(key);
    }

    /// How many writes are pending among those `matching`.
    fn count(&self, matching: impl Fn(&K) -> bool) -> usize {
        self.pending.keys().filter(|key| matching(key)).count()
    }
}

async fn daemonset_controller(client: Client, caches: Caches, shutdown: CancellationToken) {
    caches.ready().await;
    let mut changed = caches.changes();
    let mut creating: Expectations<(String, String)> = Expectations::default();
    let mut deleting: Expectations<String> = Expectations::default();
    let mut wake = Some(Duration::ZERO);
    let mut pace = Pace::new();
    while next_pass(&mut changed, wake, &mut pace, &shutdown).await {
        wake = None;
        creating.expire();
        deleting.expire();
        // The caches' objects are shared, not copied: a pass over thousands of nodes and pods reads them.
        // Keyed by names borrowed from the pods, not copied: a pass groups every pod of the cluster.
        let nodes = caches.nodes.state();
        let all_pods = caches.pods.state();
        let mut pods_by_owner: HashMap<&str, Vec<Arc<Pod>>> = HashMap::new();
        let mut pods_by_node: HashMap<&str, Vec<Arc<Pod>>> = HashMap::new();
        for pod in &all_pods {
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                pods_by_node.entry(node).or_default().push(pod.clone());
            }
            if let Some(owner) = pod.owner_references().iter().find(|o| o.controller == Some(true)) {
                pods_by_owner
                    .entry(owner.uid.as_str())
                    .or_default()
                    .push(pod.clone());
            }
        }
        let mut revisions_by_owner: BTreeMap<String, Vec<ControllerRevision>> = BTreeMap::new();
        for revision in caches.revisions.state() {
            if let Some(owner) = revision.owner_references().first() {
                revisions_by_owner
                    .entry(owner.uid.clone())
                    .or_default()
                    .push((*revision).clone());
            }
        }
        for ds in caches.daemonsets.state() {
            if ds.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let uid = ds.metadata.uid.clone().unwrap_or_default();
            let namespace = ds.namespace().unwrap_or_default();
            let pods = pods_by_owner.remove(uid.as_str()).unwrap_or_default();
            for pod in &pods {
                if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    creating.observed(&(uid.clone(), node));
                }
            }
            let revisions = revisions_by_owner.remove(&uid).unwrap_or_default();
            let plan = daemonset::plan(&ds, &nodes, &pods, &revisions);
            let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            if let Some(revision) = &plan.new_revision {
                let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
                if let Err(error) = api.create(&PostParams::default(), revision).await
                    && !matches!(&error, kube::Error::Api(s) if s.code == 409)
                {
                    warn!(daemonset = %ds.name_any(), %error, "cannot create a ControllerRevision");
                }
            }
            if let Some((name, revision)) = &plan.renumber_revision {
                let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
                let patch = serde_json::json!({ "revision": revision });
                if let Err(error) = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    warn!(daemonset = %ds.name_any(), %error, "cannot renumber a ControllerRevision");
                }
            }
            for pod in &plan.create {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                let key = (uid.clone(), node.clone());
                if creating.pending(&key) {
                    continue;
                }
                let others: &[Arc<Pod>] = pods_by_node.get(node.as_str()).map_or(&[], Vec::as_slice);
                if let Some(spec) = pod.spec.as_ref()
                    && daemonset::repelled(spec, others)
                {
                    debug!(daemonset = %ds.name_any(), %node, "pod anti-affinity: waiting for the node to be free");
                    continue;
                }
                match pod_api.create(&PostParams::default(), pod).await {
                    Ok(_) => creating.expect(key),
                    Err(error) => {
                        warn!(daemonset = %ds.name_any(), %node, %error, "cannot create a DaemonSet pod");
                        wake = Some(Duration::from_secs(1));
                    }
                }
            }
            for name in &plan.delete {
                if deleting.pending(name) {
                    continue;
                }
                match pod_api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => deleting.expect(name.clone()),
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => warn!(pod = %name, %error, "cannot delete a DaemonSet pod"),
                }
            }
            if ds.status.as_ref() != Some(&plan.status) {
                let api: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
                let patch = json!({ "status": status_patch(&plan.status) });
                if let Err(error) = api
                    .patch_status(&ds.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    warn!(daemonset = %ds.name_any(), %error, "cannot update DaemonSet status");
                }
            }
        }
    }
}

/// Keeps every PodDisruptionBudget's status as [`disruption::status`] computes it from the pods.
async fn disruption_controller(
    client: Client,
    caches: Caches,
    budgets: Store<PodDisruptionBudget>,
    shutdown: CancellationToken,
) {
    caches.ready().await;
    let _ = budgets.wait_until_ready().await;
    let mut changed = caches.changes();
    let mut wake = Some(Duration::ZERO);
    let mut pace = Pace::new();
    while next_pass(&mut changed, wake, &mut pace, &shutdown).await {
        wake = None;
        // Most clusters have no budget: then there is nothing to read the pods for.
        let budgets = budgets.state();
        if budgets.is_empty() {
            continue;
        }
        let pods = caches.pods.state();
        for budget in budgets {
            let namespace = budget.namespace().unwrap_or_default();
            let in_namespace: Vec<&Pod> = pods
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
                .map(|p| &**p)
                .collect();
            let Some(status) = disruption::status(&budget, &in_namespace) else {
                continue;
            };
            if budget.status.as_ref() == Some(&status) {
                continue;
            }
            let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
            let patch = json!({ "status": status });
            if let Err(error) = api
                .patch_status(&budget.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                debug!(budget = %budget.name_any(), %error, "cannot report a disruption budget's status");
                wake = Some(Duration::from_secs(1));
            }
        }
    }
}

async fn replicaset_controller(
    client: Client,
    caches: Caches,
    replica_sets: Store<ReplicaSet>,
    shutdown: CancellationToken,
) {
    caches.ready().await;
    let _ = replica_sets.wait_until_ready().await;
    let mut changed = caches.changes();
    // (ReplicaSet uid, pod name) of pods created or deleted that the caches do not show so yet.
    let mut creating: Expectations<(String, String)> = Expectations::default();
    let mut deleting: Expectations<(String, String)> = Expectations::default();
    let mut wake = Some(Duration::ZERO);
    let mut pace = Pace::new();
    while next_pass(&mut changed, wake, &mut pace, &shutdown).await {
        wake = None;
        creating.expire();
        deleting.expire();
        // Without ReplicaSets (a cluster of operands alone) there is nothing to read the pods for.
        let replica_sets = replica_sets.state();
        if replica_sets.is_empty() {
            continue;
        }
        let mut pods_by_owner: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in caches.pods.state() {
            if let Some(owner) = pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet")
            {
                pods_by_owner
                    .entry(owner.uid.clone())
                    .or_default()
                    .push(pod.clone());
            }
        }
        for rs in replica_sets {
            if rs.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let uid = rs.metadata.uid.clone().unwrap_or_default();
            let namespace = rs.namespace().unwrap_or_default();
            let mut pods = pods_by_owner.remove(&uid).unwrap_or_default();
            for pod in &pods {
                creating.observed(&(uid.clone(), pod.name_any()));
                if pod.metadata.deletion_timestamp.is_some() {
                    deleting.observed(&(uid.clone(), pod.name_any()));
                }
            }
            // A pod it has asked to delete is gone for the controller, as the real one counts it.
            pods.retain(|pod| !deleting.pending(&(uid.clone(), pod.name_any())));
            let unseen = creating.count(|(owner, _)| *owner == uid);
            let plan = replicaset::plan(&rs, &pods, unseen);
            let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            for pod in &plan.create {
                match pod_api.create(&PostParams::default(), pod).await {
                    Ok(created) => {
                        debug!(replicaset = %rs.name_any(), %namespace, pod = %created.name_any(), "created a workload pod");
                        creating.expect((uid.clone(), created.name_any()));
                    }
                    Err(error) => {
                        warn!(replicaset = %rs.name_any(), %error, "cannot create a ReplicaSet pod");
                        wake = Some(Duration::from_secs(1));
                    }
                }
            }
            for name in &plan.delete {
                match pod_api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => deleting.expect((uid.clone(), name.clone())),
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => warn!(pod = %name, %error, "cannot delete a ReplicaSet pod"),
                }
            }
            if rs.status.as_ref() != Some(&plan.status) {
                let api: Api<ReplicaSet> = Api::namespaced(client.clone(), &namespace);
                let patch = json!({ "status": plan.status });
                if let Err(error) = api
                    .patch_status(&rs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    warn!(replicaset = %rs.name_any(), %error, "cannot update ReplicaSet status");
                }
            }
        }
    }
}

/// A merge patch that makes a DaemonSet's status exactly `status`: counts that went back to zero are
/// absent from it (as the real controller omits them) and must be removed, not left at their old value.
fn status_patch(status: &DaemonSetStatus) -> serde_json::Value {
    let mut patch = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(fields) = patch.as_object_mut() {
        for key in [
            "numberAvailable",
            "numberUnavailable",
            "updatedNumberScheduled",
            "observedGeneration",
            "collisionCount",
            "conditions",
        ] {
            fields.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    patch
}

/// Total extended resources (GPUs) requested by a pod's containers.
fn gpu_requests(pod: &Pod) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let resources = container.resources.as_ref();
        let requests = resources
            .and_then(|r| r.requests.as_ref())
            .or(resources.and_then(|r| r.limits.as_ref()));
        for (name, Quantity(amount)) in requests.into_iter().flatten() {
            if labels::is_gpu_resource(name) {
                *total.entry(name.clone()).or_insert(0) += amount.parse::<u64>().unwrap_or(0);
            }
        }
    }
    total
}

fn allocatable(node: &Node, resource: &str) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(resource))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0)
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// GPU resources used on each node by pods bound there.
fn used_by_node(pods: &[Arc<Pod>]) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut used: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| !is_terminal(p)) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            for (resource, amount) in gpu_requests(pod) {
                *used.entry(node.clone()).or_default().entry(resource).or_insert(0) += amount;
            }
        }
    }
    used
}

async fn scheduler(client: Client, caches: Caches, shutdown: CancellationToken) {
    caches.ready().await;
    let mut changed = caches.changes();
    let mut binding: Expectations<String> = Expectations::default();
    // Where pods whose binding the caches do not show yet were bound: their GPUs are taken there, or the
    // next pass would give them to another pod as well.
    let mut bound_to: BTreeMap<String, String> = BTreeMap::new();
    let mut wake = Some(Duration::ZERO);
    let mut pace = Pace::new();
    while next_pass(&mut changed, wake, &mut pace, &shutdown).await {
        wake = None;
        binding.expire();
        let waiting = |p: &Pod| {
            p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
                && !is_terminal(p)
                && p.metadata.deletion_timestamp.is_none()
        };
        // Most passes have nothing to schedule: look for one waiting pod before copying the cache.
        if caches.pods.find(waiting).is_none() {
            continue;
        }
        let pods = caches.pods.state();
        let unbound: Vec<&Arc<Pod>> = pods.iter().filter(|p| waiting(p)).collect();
        // Most passes (DaemonSet pods are bound by their controller) have nothing to schedule; adding up
        // what every bound pod uses is then wasted work.
        if unbound.is_empty() {
            continue;
        }
        let nodes = caches.nodes.state();
        let mut used = used_by_node(&pods);
        bound_to.retain(|key, _| binding.pending(key));
        for pod in &unbound {
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            if let Some(node) = bound_to.get(&key) {
                for (resource, amount) in gpu_requests(pod) {
                    *used.entry(node.clone()).or_default().entry(resource).or_insert(0) += amount;
                }
            }
        }
        for pod in unbound {
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            if binding.pending(&key) {
                continue;
            }
            let spec = pod.spec.clone().unwrap_or_default();
            let wanted = gpu_requests(pod);
            let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
            let mut chosen: Option<(&Node, u64)> = None;
            for node in nodes.iter() {
                if let Err(misfit) = pod_fits(node, &spec) {
                    *reasons.entry(misfit_reason(&misfit)).or_default() += 1;
                    continue;
                }
                let node_used = used.get(&node.name_any());
                let short = wanted.iter().find(|(resource, amount)| {
                    let in_use = node_used.and_then(|u| u.get(*resource)).copied().unwrap_or(0);
                    allocatable(node, resource) < in_use + **amount
                });
                if let Some((resource, _)) = short {
                    *reasons.entry(format!("Insufficient {resource}")).or_default() += 1;
                    continue;
                }
                let free: u64 = wanted.keys().map(|r| allocatable(node, r)).sum();
                if chosen.is_none_or(|(_, best)| free > best) {
                    chosen = Some((node, free));
                }
            }
            let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
            match chosen {
                Some((node, _)) => {
                    let target = node.name_any();
                    let bind = Binding {
                        metadata: ObjectMeta {
                            name: Some(pod.name_any()),
                            ..ObjectMeta::default()
                        },
                        target: ObjectReference {
                            kind: Some("Node".into()),
                            name: Some(target.clone()),
                            ..ObjectReference::default()
                        },
                    };
                    match api
                        .create_subresource::<Binding, serde_json::Value>(
                            "binding",
                            &pod.name_any(),
                            &PostParams::default(),
                            &bind,
                        )
                        .await
                    {
                        Ok(_) => {
                            binding.expect(key.clone());
                            bound_to.insert(key, target.clone());
                            for (resource, amount) in &wanted {
                                *used
                                    .entry(target.clone())
                                    .or_default()
                                    .entry(resource.clone())
                                    .or_insert(0) += amount;
                            }
                        }
                        Err(error) => warn!(pod = %pod.name_any(), %error, "cannot bind pod"),
                    }
                }
                None => {
                    let summary: Vec<String> = reasons
                        .iter()
                        .map(|(reason, count)| format!("{count} {reason}"))
                        .collect();
                    let message = format!("0/{} nodes are available: {}.", nodes.len(), summary.join(", "));
                    let current = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
                    if current.and_then(|c| c.message.as_deref()) != Some(message.as_str()) {
                        let condition = PodCondition {
                            type_: "PodScheduled".into(),
                            status: "False".into(),
                            reason: Some("Unschedulable".into()),
                            message: Some(message),
                            ..PodCondition::default()
                        };
                        let patch = json!({ "status": { "phase": "Pending", "conditions": [condition] } });
                        if let Err(error) = api
                            .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                        {
                            warn!(pod = %pod.name_any(), %error, "cannot report the pod unschedulable");
                        }
                    }
                    wake = Some(Duration::from_secs(2));
                }
            }
        }
    }
}

fn misfit_reason(misfit: &gpuop_api::placement::Misfit) -> String {
    use gpuop_api::placement::Misfit;
    match misfit {
        Misfit::NodeSelector { .. } | Misfit::NodeAffinity => {
            "node(s) didn't match Pod's node affinity/selector".into()
        }
        Misfit::Taint(taint) => format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.clone().unwrap_or_default()
        ),
        Misfit::Unschedulable => "node(s) were unschedulable".into(),
    }
}

/// What the kubelets derive for one node from the pods running there.
#[derive(Debug, Default)]
struct NodeWork {
    ready: BTreeSet<Operand>,
    plugin: Option<PluginSettings>,
    feature_discovery: Option<PluginSettings>,
    driver_image: Option<String>,
    driver_pod: Option<String>,
    validator_present: bool,
    mig_manager: Option<Arc<Pod>>,
}

async fn kubelets(client: Client, caches: Caches, state: Arc<SimState>, shutdown: CancellationToken) {
    caches.ready().await;
    let mut changed = caches.changes();
    let mut validator_seen: BTreeSet<String> = BTreeSet::new();
    let mut mig_started: BTreeMap<String, Instant> = BTreeMap::new();
    let mut wake = Some(Duration::ZERO);
    loop {
        // Most of the kubelets' pass is writes that move pods on, not reading: they gather changes only
        // briefly, so that pods move as fast as the API server takes the writes.
        let proceed = tokio::select! {
            () = shutdown.cancelled() => false,
            _ = changed.changed() => gather_changes(COALESCE, &shutdown).await,
            () = state.changed.notified() => true,
            () = tokio::time::sleep(wake.unwrap_or(Duration::from_secs(5))) => true,
        };
        if !proceed {
            break;
        }
        changed.borrow_and_update();
        wake = None;
        let mut soonest = |duration: Option<Duration>| {
            if let Some(duration) = duration {
                wake = Some(wake.map_or(duration, |current| current.min(duration)));
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let nodes: BTreeMap<String, Arc<Node>> = caches
            .nodes
            .state()
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        let config_maps: BTreeMap<(String, String), BTreeMap<String, String>> = caches
            .config_maps
            .state()
            .iter()
            .map(|c| {
                (
                    (c.namespace().unwrap_or_default(), c.name_any()),
                    c.data.clone().unwrap_or_default(),
                )
            })
            .collect();
        let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
        for pod in caches.pods.state() {
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                by_node.entry(node).or_default().push(pod);
            }
        }
        let hosts: Vec<String> = state.hosts().keys().cloned().collect();
        let faults = state.faults().clone();
        for node_name in hosts {
            let Some(node) = nodes.get(&node_name) else {
                continue;
            };
            let pods = by_node.remove(&node_name).unwrap_or_default();
            if faults.not_ready.contains(&node_name) {
                continue;
            }
            let allocatable_gpus: u64 = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| {
                    a.iter()
                        .filter(|(k, _)| labels::is_gpu_resource(k))
                        .map(|(_, q)| q.0.parse::<u64>().unwrap_or(0))
                        .sum()
                })
                .unwrap_or(0);
            let mut work = NodeWork::default();
            // The kubelet admits a pod once, before it starts: pods it runs keep their GPUs when
            // allocatable drops later (an XID, a device plugin restarting while its driver is replaced).
            let mut used: BTreeMap<String, u64> = BTreeMap::new();
            for pod in pods
                .iter()
                .filter(|pod| operand_of(pod).is_none() && admitted(pod))
            {
                for (resource, amount) in gpu_requests(pod) {
                    *used.entry(resource).or_insert(0) += amount;
                }
            }
            for pod in &pods {
                let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
                if pod.metadata.deletion_timestamp.is_some() {
                    // The containers are stopped; the kubelet confirms the deletion.
                    let _ = api
                        .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                        .await;
                    continue;
                }
                if is_terminal(pod) {
                    continue;
                }
                let operand = operand_of(pod);
                if operand.is_none() && !admitted(pod) && !admit(&api, pod, node, &mut used).await {
                    continue;
                }
                let host = state.hosts().get(&node_name).cloned();
                let Some(host) = host else { continue };
                let step = kubelet::step(
                    pod,
                    &host,
                    allocatable_gpus,
                    &faults.for_pod(
                        &node_name,
                        operand,
                        pod.spec
                            .as_ref()
                            .and_then(|s| s.containers.first())
                            .and_then(|c| c.image.as_deref()),
                    ),
                    state.timing,
                    now,
                );
                if !step.writes.is_empty() {
                    if let Some(host) = state.hosts().get_mut(&node_name) {
                        host.validations
                            .extend(step.writes.iter().map(|f| (*f).to_owned()));
                    }
                    // Other pods on the node may be waiting for these files.
                    soonest(Some(Duration::ZERO));
                }
                soonest(step.wake_after);
                if pod.status.as_ref() != Some(&step.status) {
                    let patch = json!({ "status": step.status });
                    if let Err(error) = api
                        .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        debug!(pod = %pod.name_any(), %error, "cannot report pod status");
                    }
                }
                let ready = step
                    .status
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if operand == Some(Operand::OperatorValidator) {
                    work.validator_present = true;
                }
                let Some(operand) = operand else { continue };
                if !ready {
                    continue;
                }
                work.ready.insert(operand);
                let no_spec = PodSpec::default();
                let spec = pod.spec.as_ref().unwrap_or(&no_spec);
                // The ConfigMaps a pod mounts, read only for the operands whose settings come from them.
                let mounted = || -> BTreeMap<String, BTreeMap<String, String>> {
                    config_map_volumes(spec)
                        .into_values()
                        .filter_map(|name| {
                            Some((
                                name.clone(),
                                config_maps
                                    .get(&(pod.namespace().unwrap_or_default(), name))?
                                    .clone(),
                            ))
                        })
                        .collect()
                };
                match operand {
                    Operand::Driver => {
                        work.driver_image = spec.containers.first().and_then(|c| c.image.clone());
                        work.driver_pod = pod.metadata.uid.clone();
                    }
                    Operand::DevicePlugin => {
                        work.plugin = Some(plugin_settings(spec, node.labels(), &mounted()))
                    }
                    Operand::GpuFeatureDiscovery => {
                        work.feature_discovery = Some(plugin_settings(spec, node.labels(), &mounted()))
                    }
                    Operand::MigManager => work.mig_manager = Some(pod.clone()),
                    _ => {}
                }
            }
            // The host follows the operands that run on it.
            let mut reloaded = false;
            let host = {
                let mut hosts = state.hosts();
                let Some(host) = hosts.get_mut(&node_name) else {
                    continue;
                };
                host.loaded_driver = if host.preinstalled_driver.is_none() {
                    work.driver_image.as_deref().map(driver_version)
                } else {
                    None
                };
                if work.driver_pod.is_some() && host.preinstalled_driver.is_none() {
                    reloaded = host.driver_pod.is_some() && host.driver_pod != work.driver_pod;
                    host.driver_pod = work.driver_pod.clone();
                }
                if host.loaded_driver.is_some() {
                    host.validations
                        .insert(status_file::DRIVER_CONTAINER_READY.to_owned());
                } else {
                    host.validations.remove(status_file::DRIVER_CONTAINER_READY);
                }
                host.runtime_wired = work.ready.contains(&Operand::ContainerToolkit);
                host.plugin_registered |= work.plugin.is_some();
                host.cdi_spec = host.runtime_wired;
                // The validator's preStop hook removes the status files when its pod goes.
                if validator_seen.contains(&node_name) && !work.validator_present {
                    for file in [
                        status_file::DRIVER_READY,
                        status_file::TOOLKIT_READY,
                        status_file::CUDA_READY,
                        status_file::PLUGIN_READY,
                    ] {
                        host.validations.remove(file);
                    }
                }
                host.clone()
            };
            if work.validator_present {
                validator_seen.insert(node_name.clone());
            } else {
                validator_seen.remove(&node_name);
            }
            if reloaded {
                restart_driver_clients(&client, &node_name, &pods).await;
            }
            let mig_state = mig_manager(
                &client,
                &state,
                &host,
                node,
                work.mig_manager.as_deref(),
                &config_maps,
                &mut mig_started,
            )
            .await;
            soonest(mig_state);
            report_node(
                &client,
                &state,
                node,
                work.plugin.as_ref(),
                work.feature_discovery.as_ref(),
            )
            .await;
        }
    }
}

/// Operands that use the driver, which NVIDIA's driver manager evicts from a node before it replaces the
/// driver there (they come back with their DaemonSets, on the new driver).
const DRIVER_CLIENTS: &[Operand] = &[
    Operand::OperatorValidator,
    Operand::DevicePlugin,
    Operand::GpuFeatureDiscovery,
    Operand::Dcgm,
    Operand::DcgmExporter,
    Operand::MigManager,
];

/// A new driver pod took over from another on this node: as NVIDIA's `k8s-driver-manager` does before it
/// unloads the old driver, the operands that use the driver go (their DaemonSets bring them back on the new
/// one, and the validator validates it anew).
async fn restart_driver_clients(client: &Client, node: &str, pods: &[Arc<Pod>]) {
    for pod in pods.iter().filter(|pod| {
        pod.metadata.deletion_timestamp.is_none()
            && operand_of(pod).is_some_and(|o| DRIVER_CLIENTS.contains(&o))
    }) {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        match api.delete(&pod.name_any(), &DeleteParams::default()).await {
            Ok(_) => {
                debug!(%node, pod = %pod.name_any(), "driver replaced: operand pod restarted, as the driver manager does")
            }
            Err(error) => debug!(%node, pod = %pod.name_any(), %error, "cannot restart an operand pod"),
        }
    }
}

/// Whether the kubelet has admitted a pod already: it has started it (and the pod still runs).
fn admitted(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.start_time.is_some())
        && !is_terminal(pod)
        && pod.metadata.deletion_timestamp.is_none()
}

/// Admits a workload pod if the node has the GPUs it asks for; fails it the way the kubelet does otherwise.
async fn admit(api: &Api<Pod>, pod: &Pod, node: &Node, used: &mut BTreeMap<String, u64>) -> bool {
    let wanted = gpu_requests(pod);
    let short = wanted.iter().find(|(resource, amount)| {
        allocatable(node, resource) < used.get(*resource).copied().unwrap_or(0) + **amount
    });
    if let Some((resource, _)) = short {
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Failed") {
            let patch = json!({ "status": {
                "phase": "Failed",
                "reason": format!("OutOf{resource}"),
                "message": format!("Pod was rejected: Node didn't have enough resource: {resource}")
            }});
            let _ = api
                .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
        return false;
    }
    for (resource, amount) in wanted {
        *used.entry(resource).or_insert(0) += amount;
    }
    true
}

/// Runs the MIG manager's reconfiguration when the node's `nvidia.com/mig.config` differs from its layout.
/// Returns when to look again while a reconfiguration is under way.
async fn mig_manager(
    client: &Client,
    state: &SimState,
    host: &Host,
    node: &Node,
    manager: Option<&Pod>,
    config_maps: &BTreeMap<(String, String), BTreeMap<String, String>>,
    started: &mut BTreeMap<String, Instant>,
) -> Option<Duration> {
    let name = node.name_any();
    let (Some(manager), Some(model)) = (manager, host.model) else {
        started.remove(&name);
        return None;
    };
    let wanted = node.labels().get(MIG_CONFIG).filter(|v| !v.is_empty())?;
    let current_state = node.labels().get(MIG_CONFIG_STATE).map(String::as_str);
    if host.mig_config.as_deref() == Some(wanted.as_str())
        && current_state.is_some_and(|s| s == "success" || s == "failed")
    {
        return None;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let set_state = |value: &'static str| {
        let patch = json!({ "metadata": { "labels": { MIG_CONFIG_STATE: value } } });
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            if let Err(error) = nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                warn!(node = %name, %error, "cannot report the MIG state");
            }
        }
    };
    let begun = *started.entry(name.clone()).or_insert_with(Instant::now);
    if current_state != Some("pending") && host.mig_config.as_deref() != Some(wanted.as_str()) {
        set_state("pending").await;
    }
    let takes = state.timing.ready_after * 2;
    if begun.elapsed() < takes {
        return Some(takes - begun.elapsed());
    }
    started.remove(&name);
    let namespace = manager.namespace().unwrap_or_default();
    let spec = manager.spec.clone().unwrap_or_default();
    let config = config_map_volumes(&spec)
        .into_values()
        .filter_map(|cm| config_maps.get(&(namespace.clone(), cm)))
        .find_map(|data| {
            data.get("config.yaml")
                .or_else(|| data.get("config-default.yaml"))
                .cloned()
        });
    let outcome = match config {
        Some(config) => mig_layout(&config, wanted, model),
        None => Err("the MIG manager has no configuration mounted".to_owned()),
    };
    let result = {
        let mut hosts = state.hosts();
        let host = hosts.get_mut(&name)?;
        host.mig_config = Some(wanted.clone());
        match outcome {
            Ok(layout) => {
                host.mig_layout = layout;
                "success"
            }
            Err(problem) => {
                warn!(node = %name, config = %wanted, %problem, "MIG reconfiguration failed");
                "failed"
            }
        }
    };
    info!(node = %name, config = %wanted, state = result, "MIG manager finished");
    set_state(result).await;
    None
}

/// Reports what the node advertises: the device plugin's resources in capacity and allocatable, and the
/// labels feature discovery writes (removed when it no longer runs).
async fn report_node(
    client: &Client,
    state: &SimState,
    node: &Node,
    plugin: Option<&PluginSettings>,
    discovery: Option<&PluginSettings>,
) {
    let name = node.name_any();
    let Some(host) = state.hosts().get(&name).cloned() else {
        return;
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let status = node.status.as_ref();
    // A resource the plugin no longer advertises (`nvidia.com/gpu.shared` after sharing is switched
    // off, a MIG profile after a new layout) stays on the node at 0, as the kubelet keeps it.
    let gone = |mut wanted: BTreeMap<String, u64>, reported: Option<&BTreeMap<String, Quantity>>| {
        for resource in reported.into_iter().flat_map(BTreeMap::keys) {
            if labels::is_gpu_resource(resource) {
                wanted.entry(resource.clone()).or_insert(0);
            }
        }
        wanted
    };
    let allocatable = gone(
        host.advertised(plugin),
        status.and_then(|s| s.allocatable.as_ref()),
    );
    let capacity = gone(host.capacity(plugin), status.and_then(|s| s.capacity.as_ref()));
    let differs = |wanted: &BTreeMap<String, u64>, reported: Option<&BTreeMap<String, Quantity>>| {
        wanted.iter().any(|(resource, count)| {
            reported.and_then(|r| r.get(resource)).map(|q| q.0.as_str()) != Some(count.to_string().as_str())
        })
    };
    if differs(&capacity, status.and_then(|s| s.capacity.as_ref()))
        || differs(&allocatable, status.and_then(|s| s.allocatable.as_ref()))
    {
        let text = |resources: &BTreeMap<String, u64>| -> BTreeMap<String, String> {
            resources
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect()
        };
        let patch = json!({ "status": { "capacity": text(&capacity), "allocatable": text(&allocatable) } });
        if let Err(error) = nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(node = %name, %error, "cannot report GPU resources");
        }
    }
    let wanted = discovery
        .map(|settings| host.feature_labels(settings))
        .unwrap_or_default();
    let every_key = host.feature_labels(&PluginSettings {
        mig_strategy: "mixed".into(),
        ..PluginSettings::default()
    });
    let mut changes = serde_json::Map::new();
    for (key, value) in &wanted {
        if node.labels().get(key) != Some(value) {
            changes.insert(key.clone(), json!(value));
        }
    }
    for key in node.labels().keys() {
        let ours =
            every_key.contains_key(key) || key.starts_with("nvidia.com/mig-") || key == labels::MIG_STRATEGY;
        // Feature discovery publishes its whole label set each time, so a label it no longer writes (a
        // MIG profile's after a new layout) goes, as it does when discovery stops.
        if ours && !wanted.contains_key(key) {
            changes.insert(key.clone(), serde_json::Value::Null);
        }
    }
    if !changes.is_empty() {
        let patch = json!({ "metadata": { "labels": changes } });
        if let Err(error) = nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(node = %name, %error, "cannot write feature-discovery labels");
        }
    }
}

/// Heartbeat writes in flight at once: a batch of a large cluster's renewals goes out together without
/// opening a connection per node.
const HEARTBEATS_IN_FLIGHT: usize = 16;

/// The longest the heartbeat actor sleeps, so that a node that joins, or whose kubelet stops or comes back,
/// is seen promptly even when nothing else is due.
const HEARTBEAT_LOOK_AT_MOST: Duration = Duration::from_millis(500);

/// The kubelets' signs of life: each running simulated node's Lease in `kube-node-lease` created and
/// renewed, and its status reported, when the [`Schedule`] says. A node whose kubelet a scenario stopped
/// (`nodeNotReady`) gives none, so a real node lifecycle controller sees it go as it would.
async fn node_heartbeats(
    client: Client,
    caches: Caches,
    state: Arc<SimState>,
    heartbeats: Heartbeats,
    shutdown: CancellationToken,
) {
    // Stopping must not wait for requests in flight: against a slow API server each may take minutes.
    tokio::select! {
        () = shutdown.cancelled() => {}
        () = renew_and_report(client, caches, state, heartbeats) => {}
    }
}

/// The heartbeat loop of [`node_heartbeats`]; it runs until dropped.
async fn renew_and_report(client: Client, caches: Caches, state: Arc<SimState>, heartbeats: Heartbeats) {
    caches.ready().await;
    ensure_lease_namespace(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut schedule = Schedule::new(heartbeats);
    // Nodes whose Lease this simulation has created (or found): those are renewed by a patch of
    // `renewTime` alone.
    let mut leased: BTreeSet<String> = BTreeSet::new();
    let started = Instant::now();
    loop {
        let running: BTreeMap<String, Arc<Node>> = {
            let not_ready = state.faults().not_ready.clone();
            let hosts = state.hosts();
            caches
                .nodes
                .state()
                .into_iter()
                .filter_map(|node| {
                    let name = node.name_any();
                    (hosts.contains_key(&name) && !not_ready.contains(&name)).then_some((name, node))
                })
                .collect()
        };
        leased.retain(|name| running.contains_key(name));
        let names: BTreeSet<String> = running.keys().cloned().collect();
        let mut due = schedule.due(&names, started.elapsed());
        // Like kubelet, report at once when the status on the server disagrees with the running kubelet:
        // a node lifecycle controller marked the node Unknown while its Leases were late.
        for (name, node) in &running {
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
            if ready.is_some_and(|c| c.status != "True") && !due.report.contains(name) {
                due.report.push(name.clone());
            }
        }
        let now = Timestamp::now();
        let (leases, nodes_api) = (&leases, &nodes_api);
        let renewals = due.renew.into_iter().filter_map(|name| {
            let node = running.get(&name)?.clone();
            let known = leased.contains(&name);
            Some(async move {
                let there = renew_lease(leases, &node, heartbeats, known, now).await;
                (name, there)
            })
        });
        let renewed: Vec<(String, bool)> = futures::stream::iter(renewals)
            .buffer_unordered(HEARTBEATS_IN_FLIGHT)
            .collect()
            .await;
        for (name, there) in renewed {
            if there {
                leased.insert(name);
            } else {
                leased.remove(&name);
            }
        }
        let reports = due.report.into_iter().filter_map(|name| {
            let node = running.get(&name)?.clone();
            Some(async move { report_heartbeat(nodes_api, &node, now).await })
        });
        futures::stream::iter(reports)
            .buffer_unordered(HEARTBEATS_IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
        let wait = due
            .next
            .map_or(heartbeats.renew_every, |next| {
                next.saturating_sub(started.elapsed())
            })
            .min(HEARTBEAT_LOOK_AT_MOST);
        tokio::time::sleep(wait).await;
    }
}

/// Creates `kube-node-lease` where it is missing (a real cluster has it; the fake server starts empty).
/// Looks first, so that a simulator allowed only to read namespaces works against a real cluster.
async fn ensure_lease_namespace(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.get_opt(LEASE_NAMESPACE).await {
        Ok(Some(_)) => return,
        Ok(None) => {}
        Err(error) => {
            warn!(%error, namespace = LEASE_NAMESPACE, "cannot read the node lease namespace");
            return;
        }
    }
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(LEASE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => info!(namespace = LEASE_NAMESPACE, "created the node lease namespace"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => warn!(%error, namespace = LEASE_NAMESPACE, "cannot create the node lease namespace"),
    }
}

/// The Lease a kubelet keeps for its node: named after it, held by it, owned by the Node (so it goes with
/// the Node), renewed `now`.
fn node_lease(node: &Node, heartbeats: Heartbeats, now: Timestamp) -> Lease {
    let name = node.name_any();
    Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: name.clone(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name),
            lease_duration_seconds: Some(
                i32::try_from(heartbeats.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// Renews a node's Lease, creating it first where this simulation has not; returns whether the Lease is
/// there now.
async fn renew_lease(
    leases: &Api<Lease>,
    node: &Node,
    heartbeats: Heartbeats,
    known: bool,
    now: Timestamp,
) -> bool {
    let name = node.name_any();
    if known {
        let patch = json!({ "spec": { "renewTime": MicroTime(now) } });
        match leases
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return true,
            // Deleted behind the kubelet's back: it creates the Lease again.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                debug!(node = %name, %error, "cannot renew the node lease");
                return true;
            }
        }
    }
    let lease = node_lease(node, heartbeats, now);
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Left by an earlier run: made this kubelet's, owned by this Node.
            let patch = json!({ "metadata": { "ownerReferences": lease.metadata.owner_references }, "spec": lease.spec });
            match leases
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => true,
                Err(error) => {
                    warn!(node = %name, %error, "cannot take over the node lease");
                    false
                }
            }
        }
        Err(error) => {
            warn!(node = %name, %error, "cannot create the node lease");
            false
        }
    }
}

/// Reports a node's status as a kubelet does when nothing changed: every condition's `lastHeartbeatTime`
/// is now, and Ready is True (a running kubelet says so, even after a lifecycle controller marked the
/// node Unknown while it was silent).
async fn report_heartbeat(nodes: &Api<Node>, node: &Node, now: Timestamp) {
    let conditions: Vec<serde_json::Value> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|condition| {
            let mut patch = json!({ "type": condition.type_, "lastHeartbeatTime": Time(now) });
            if condition.type_ == "Ready" && condition.status != "True" {
                patch["status"] = json!("True");
                patch["reason"] = json!("KubeletReady");
                patch["message"] = json!("kubelet is posting ready status");
                patch["lastTransitionTime"] = json!(Time(now));
            }
            patch
        })
        .collect();
    if conditions.is_empty() {
        return;
    }
    // A strategic merge patch touches the conditions by type and leaves the rest of the status alone.
    let patch = json!({ "status": { "conditions": conditions } });
    if let Err(error) = nodes
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        debug!(node = %node.name_any(), %error, "cannot report the node status");
    }
}
