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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use gpuop_api::Operand;
use gpuop_api::catalogue::status_file;
use gpuop_api::labels::{self, MIG_CONFIG, MIG_CONFIG_STATE};
use gpuop_api::placement::pod_fits;
use gpuop_operator::caches::{Cached, spawn_until_cancelled};
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
use kube::runtime::reflector::{self, ObjectRef, Store};
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
use crate::heartbeat::{Heartbeats, LEASE_NAMESPACE, Pipeline, Schedule};
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

/// Starts the actors of the parts the simulation plays; returns their tasks and a view of the cluster
/// through the actors' caches.
pub fn spawn(
    client: Client,
    state: Arc<SimState>,
    plays: Plays,
    shutdown: CancellationToken,
) -> (Vec<JoinHandle<()>>, ClusterView) {
    let changed = Arc::new(watch::Sender::new(()));
    let index = Arc::new(Mutex::new(NodeIndex::default()));
    let nodes = {
        let index = index.clone();
        cache_observed::<Node>(Api::all(client.clone()), &changed, &shutdown, move |event| {
            lock(&index).node_event(event);
        })
    };
    let pods = {
        let index = index.clone();
        cache_observed::<Pod>(Api::all(client.clone()), &changed, &shutdown, move |event| {
            lock(&index).pod_event(event);
        })
    };
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
        index,
    };
    caches.signal_when_synced(synced_sender);
    let mut tasks = Vec::new();
    if plays == Plays::Cluster {
        // Only the ReplicaSet controller reads ReplicaSets: playing the nodes of a real cluster needs no
        // right to watch them.
        let replica_sets = cache::<ReplicaSet>(Api::all(client.clone()), &caches.changed, &shutdown);
        let budgets = cache::<PodDisruptionBudget>(Api::all(client.clone()), &caches.changed, &shutdown);
        // The control plane's controllers, which a real cluster runs itself.
        let controllers: [BoxFuture<'static, ()>; 5] = [
            daemonset_controller(client.clone(), caches.clone(), shutdown.clone()).boxed(),
            replicaset_controller(client.clone(), caches.clone(), replica_sets, shutdown.clone()).boxed(),
            scheduler(client.clone(), caches.clone(), shutdown.clone()).boxed(),
            disruption_controller(client.clone(), caches.clone(), budgets, shutdown.clone()).boxed(),
            pod_garbage_collector(client.clone(), caches.clone(), shutdown.clone()).boxed(),
        ];
        tasks.extend(controllers.map(tokio::spawn));
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
    let view = ClusterView {
        caches: caches.clone(),
    };
    tasks.push(tokio::spawn(kubelets(client, caches, state, shutdown)));
    (tasks, view)
}

/// The simulated cluster as the actors' caches see it, for whoever watches it converge without listing it.
#[derive(Clone, Debug)]
pub struct ClusterView {
    caches: Caches,
}

impl ClusterView {
    /// Follows every node's progress with the operand DaemonSets and pods of `namespace`.
    pub fn convergence(&self, namespace: &str) -> Convergence {
        Convergence {
            changes: lock(&self.caches.index).subscribe(),
            caches: self.caches.clone(),
            namespace: namespace.to_owned(),
            daemonsets: Vec::new(),
            with_operands: BTreeSet::new(),
            unconverged: BTreeSet::new(),
        }
    }
}

/// Whether every node runs every operand it should, Ready: each look works out the rows of the nodes
/// that changed since the last one (all of them when an operand DaemonSet changed), so that looking
/// costs what changed, not the cluster's size.
#[derive(Debug)]
pub struct Convergence {
    changes: Arc<Mutex<NodeChanges>>,
    caches: Caches,
    namespace: String,
    /// The operand DaemonSets' uid and generation the rows were worked out for.
    daemonsets: Vec<(String, Option<i64>)>,
    /// Nodes that should run at least one operand.
    with_operands: BTreeSet<String>,
    /// Nodes with an operand they should run missing or not Ready.
    unconverged: BTreeSet<String>,
}

impl Convergence {
    /// Whether, as the caches have it now, some node should run operands and every such node runs them
    /// all Ready.
    pub async fn look(&mut self) -> bool {
        self.caches.ready().await;
        let (all, dirty) = lock(&self.changes).take();
        let daemonsets: Vec<Arc<DaemonSet>> = self
            .caches
            .daemonsets
            .state()
            .into_iter()
            .filter(|ds| ds.metadata.namespace.as_deref() == Some(self.namespace.as_str()))
            .collect();
        let mut seen: Vec<(String, Option<i64>)> = daemonsets
            .iter()
            .map(|ds| {
                (
                    ds.metadata.uid.clone().unwrap_or_default(),
                    ds.metadata.generation,
                )
            })
            .collect();
        seen.sort();
        let nodes: BTreeSet<String> = if all || seen != self.daemonsets {
            self.daemonsets = seen;
            self.with_operands.clear();
            self.unconverged.clear();
            self.caches.nodes.state().iter().map(|n| n.name_any()).collect()
        } else {
            dirty
        };
        for name in nodes {
            self.with_operands.remove(&name);
            self.unconverged.remove(&name);
            let Some(node) = self.caches.nodes.get(&ObjectRef::new(&name)) else {
                continue;
            };
            let pods = self.caches.pods_on(&name);
            let here: Vec<&Pod> = pods
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.metadata.namespace.as_deref() == Some(self.namespace.as_str())
                })
                .map(|p| &**p)
                .collect();
            let row = crate::progress::row(&node, &daemonsets, &here);
            if !row.operands.is_empty() {
                self.with_operands.insert(name.clone());
            }
            if !row.converged() {
                self.unconverged.insert(name);
            }
        }
        !self.with_operands.is_empty() && self.unconverged.is_empty()
    }
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
    /// The pods bound to each node, and which nodes changed, from the node and pod watches.
    index: Arc<Mutex<NodeIndex>>,
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

    /// The pods bound to `node`, as the pod cache has them.
    fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        let keys: Vec<(String, String)> = lock(&self.index).pods_on(node).cloned().collect();
        keys.into_iter()
            .filter_map(|(namespace, name)| self.pods.get(&ObjectRef::new(&name).within(&namespace)))
            .collect()
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
    K: Cached,
{
    cache_observed(api, changed, shutdown, |_| {})
}

/// A cache whose every watch event, once applied to the cache, is shown to `observe` before the actors
/// hear of the change.
fn cache_observed<K>(
    api: Api<K>,
    changed: &Arc<watch::Sender<()>>,
    shutdown: &CancellationToken,
    mut observe: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> Store<K>
where
    K: Cached,
{
    let (reader, writer) = reflector::store();
    // Managed fields are most of a stored object and no actor reads them.
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer);
    let changed = changed.clone();
    spawn_until_cancelled(stream, shutdown, move |item| match item {
        Ok(event) => {
            observe(&event);
            changed.send_replace(());
        }
        Err(error) => debug!(%error, "simulator watch failed; retrying"),
    });
    reader
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Pods by (namespace, name), grouped by the node they are bound to.
type PodsByNode = HashMap<String, BTreeSet<(String, String)>>;

/// The pods bound to each node and which nodes changed (the Node, or a pod bound to it), kept from the
/// watch events: an actor that works node by node reads only the nodes that changed, and a node's pods
/// without going over every pod. A pod's node never changes once it is bound.
#[derive(Debug, Default)]
struct NodeIndex {
    pods_on: PodsByNode,
    /// Pods that name no node (whatever their phase), by (namespace, name).
    unbound: BTreeSet<(String, String)>,
    /// The index being rebuilt while the pod watch relists, swapped in when the list is complete.
    relisting: Option<(PodsByNode, BTreeSet<(String, String)>)>,
    /// One set of changed nodes per actor that subscribed.
    subscribers: Vec<Arc<Mutex<NodeChanges>>>,
}

/// The nodes that changed since an actor last took them; `all` after a watch relisted (events may have
/// been missed) and when the actor starts.
#[derive(Debug, Default)]
struct NodeChanges {
    all: bool,
    nodes: BTreeSet<String>,
}

impl NodeChanges {
    fn take(&mut self) -> (bool, BTreeSet<String>) {
        (std::mem::take(&mut self.all), std::mem::take(&mut self.nodes))
    }
}

impl NodeIndex {
    /// A new subscriber's set of changed nodes, starting with every node.
    fn subscribe(&mut self) -> Arc<Mutex<NodeChanges>> {
        let changes = Arc::new(Mutex::new(NodeChanges {
            all: true,
            nodes: BTreeSet::new(),
        }));
        self.subscribers.push(changes.clone());
        changes
    }

    fn pods_on(&self, node: &str) -> impl Iterator<Item = &(String, String)> {
        self.pods_on.get(node).into_iter().flatten()
    }

    fn nodes_with_pods(&self) -> impl Iterator<Item = String> + '_ {
        self.pods_on.keys().cloned()
    }

    fn mark(&self, node: &str) {
        for subscriber in &self.subscribers {
            lock(subscriber).nodes.insert(node.to_owned());
        }
    }

    fn mark_all(&self) {
        for subscriber in &self.subscribers {
            lock(subscriber).all = true;
        }
    }

    fn node_event(&mut self, event: &watcher::Event<Node>) {
        match event {
            watcher::Event::Apply(node) | watcher::Event::Delete(node) => self.mark(&node.name_any()),
            watcher::Event::InitDone => self.mark_all(),
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn pod_event(&mut self, event: &watcher::Event<Pod>) {
        let bound = |pod: &Pod| {
            let node = pod.spec.as_ref()?.node_name.clone()?;
            Some((node, (pod.namespace().unwrap_or_default(), pod.name_any())))
        };
        let key = |pod: &Pod| (pod.namespace().unwrap_or_default(), pod.name_any());
        match event {
            watcher::Event::Apply(pod) => {
                if let Some((node, key)) = bound(pod) {
                    self.unbound.remove(&key);
                    self.pods_on.entry(node.clone()).or_default().insert(key);
                    self.mark(&node);
                } else {
                    self.unbound.insert(key(pod));
                }
            }
            watcher::Event::Delete(pod) => {
                self.unbound.remove(&key(pod));
                if let Some((node, key)) = bound(pod) {
                    if let Some(pods) = self.pods_on.get_mut(&node) {
                        pods.remove(&key);
                        if pods.is_empty() {
                            self.pods_on.remove(&node);
                        }
                    }
                    self.mark(&node);
                }
            }
            watcher::Event::Init => self.relisting = Some((PodsByNode::new(), BTreeSet::new())),
            watcher::Event::InitApply(pod) => {
                if let Some((pods_on, unbound)) = self.relisting.as_mut() {
                    match bound(pod) {
                        Some((node, key)) => {
                            pods_on.entry(node).or_default().insert(key);
                        }
                        None => {
                            unbound.insert(key(pod));
                        }
                    }
                }
            }
            watcher::Event::InitDone => {
                if let Some((pods_on, unbound)) = self.relisting.take() {
                    self.pods_on = pods_on;
                    self.unbound = unbound;
                }
                self.mark_all();
            }
        }
    }
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
    /// (thousands of pods are expected at once when a DaemonSet fans out). Returns the keys forgotten.
    fn expire(&mut self) -> Vec<K>
    where
        K: Clone,
    {
        let now = Instant::now();
        let mut expired = Vec::new();
        self.pending.retain(|key, at| {
            let keep = now.duration_since(*at) < EXPECTATION;
            if !keep {
                expired.push(key.clone());
            }
            keep
        });
        expired
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
    let changes = lock(&caches.index).subscribe();
    caches.ready().await;
    let mut changed = caches.changes();
    let mut creating: Expectations<(String, String)> = Expectations::default();
    // (node, pod name) of pods asked to go.
    let mut deleting: Expectations<(String, String)> = Expectations::default();
    // Each DaemonSet's nodes as last planned, by uid.
    let mut rollouts: HashMap<String, (Option<i64>, String, daemonset::Rollout)> = HashMap::new();
    // Nodes to plan again although nothing changed there: a write failed.
    let mut retry: BTreeSet<String> = BTreeSet::new();
    let mut wake = Some(Duration::ZERO);
    let mut pace = Pace::new();
    while next_pass(&mut changed, wake, &mut pace, &shutdown).await {
        wake = None;
        // Only the nodes whose Node or pods changed are planned again, and those whose writes the caches
        // have not shown in time: a pass costs what changed, not the cluster's size.
        let (all, mut dirty) = lock(&changes).take();
        dirty.append(&mut retry);
        dirty.extend(creating.expire().into_iter().map(|(_, node)| node));
        dirty.extend(deleting.expire().into_iter().map(|(node, _)| node));
        let daemonsets = caches.daemonsets.state();
        rollouts.retain(|uid, _| {
            daemonsets
                .iter()
                .any(|ds| ds.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        let mut revisions_by_owner: BTreeMap<String, Vec<ControllerRevision>> = BTreeMap::new();
        for revision in caches.revisions.state() {
            if let Some(owner) = revision.owner_references().first() {
                revisions_by_owner
                    .entry(owner.uid.clone())
                    .or_default()
                    .push((*revision).clone());
            }
        }
        // The pods of every node planned in this pass, read once for every DaemonSet.
        let mut pods_on: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        for ds in daemonsets {
            if ds.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let uid = ds.metadata.uid.clone().unwrap_or_default();
            let namespace = ds.namespace().unwrap_or_default();
            let template = daemonset::Template::new(&ds);
            let (planned, hash, rollout) = rollouts.entry(uid.clone()).or_default();
            // A changed DaemonSet (its template, selector or strategy) is planned again on every node.
            let whole = all || *planned != ds.metadata.generation || hash != template.hash();
            let nodes: BTreeSet<String> = if whole {
                *planned = ds.metadata.generation;
                template.hash().clone_into(hash);
                let mut every: BTreeSet<String> = caches.nodes.state().iter().map(|n| n.name_any()).collect();
                every.extend(rollout.nodes().map(str::to_owned));
                every.extend(lock(&caches.index).nodes_with_pods());
                every
            } else {
                dirty.clone()
            };
            let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let (new_revision, renumber_revision) =
                template.revisions(revisions_by_owner.get(&uid).map_or(&[], Vec::as_slice));
            if let Some(revision) = &new_revision {
                let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
                if let Err(error) = api.create(&PostParams::default(), revision).await
                    && !matches!(&error, kube::Error::Api(s) if s.code == 409)
                {
                    warn!(daemonset = %ds.name_any(), %error, "cannot create a ControllerRevision");
                }
            }
            if let Some((name, revision)) = &renumber_revision {
                let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &namespace);
                let patch = serde_json::json!({ "revision": revision });
                if let Err(error) = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    warn!(daemonset = %ds.name_any(), %error, "cannot renumber a ControllerRevision");
                }
            }
            let mut delete: Vec<(String, String)> = Vec::new();
            for node in nodes {
                let here = pods_on
                    .entry(node.clone())
                    .or_insert_with(|| caches.pods_on(&node));
                let mine: Vec<&Pod> = here
                    .iter()
                    .filter(|pod| {
                        pod.owner_references()
                            .iter()
                            .any(|o| o.controller == Some(true) && o.uid == uid)
                    })
                    .map(|pod| &**pod)
                    .collect();
                let key = (uid.clone(), node.clone());
                if !mine.is_empty() {
                    creating.observed(&key);
                }
                let node_object = caches.nodes.get(&ObjectRef::new(&node));
                let on_node = daemonset::plan_node(&template, node_object.as_deref(), &mine);
                delete.extend(on_node.delete.iter().map(|name| (node.clone(), name.clone())));
                if on_node.create && !creating.pending(&key) {
                    if daemonset::repelled(template.spec(), here) {
                        debug!(daemonset = %ds.name_any(), %node, "pod anti-affinity: waiting for the node to be free");
                    } else {
                        match pod_api
                            .create(&PostParams::default(), &template.pod_for(&node))
                            .await
                        {
                            Ok(_) => creating.expect(key),
                            Err(error) => {
                                warn!(daemonset = %ds.name_any(), %node, %error, "cannot create a DaemonSet pod");
                                wake = Some(Duration::from_secs(1));
                                retry.insert(node.clone());
                            }
                        }
                    }
                }
                rollout.record(&node, on_node);
            }
            let (status, replace) = rollout.status_and_replacements(&template);
            delete.extend(replace);
            delete.sort();
            delete.dedup();
            for key in delete {
                if deleting.pending(&key) {
                    continue;
                }
                match pod_api.delete(&key.1, &DeleteParams::default()).await {
                    Ok(_) => deleting.expect(key),
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => {
                        warn!(pod = %key.1, %error, "cannot delete a DaemonSet pod");
                        wake = Some(Duration::from_secs(1));
                        retry.insert(key.0);
                    }
                }
            }
            if ds.status.as_ref() != Some(&status) {
                let api: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
                let patch = json!({ "status": status_patch(&status) });
                if let Err(error) = api
                    .patch_status(&ds.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    warn!(daemonset = %ds.name_any(), %error, "cannot update DaemonSet status");
                    wake = Some(Duration::from_secs(1));
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

/// The pod garbage collector's part a simulated cluster needs: the pods bound to a node that no longer
/// exists are deleted at once, without grace (no kubelet is left to stop them). kube-controller-manager's
/// waits out a quarantine of 40 s first, against a node its cache has not shown yet; this one asks the API
/// server instead, so a pod whose node just joined is never taken for an orphan.
async fn pod_garbage_collector(client: Client, caches: Caches, shutdown: CancellationToken) {
    let changes = lock(&caches.index).subscribe();
    caches.ready().await;
    let mut changed = caches.changes();
    let mut wake = Some(Duration::ZERO);
    let mut pace = Pace::new();
    let nodes: Api<Node> = Api::all(client.clone());
    // Nodes whose orphans a failed request left behind: looked at again on the next pass.
    let mut unfinished: BTreeSet<String> = BTreeSet::new();
    while next_pass(&mut changed, wake, &mut pace, &shutdown).await {
        wake = None;
        let (all, changed_nodes) = lock(&changes).take();
        let mut candidates: BTreeSet<String> = if all {
            lock(&caches.index).nodes_with_pods().collect()
        } else {
            changed_nodes
        };
        candidates.append(&mut unfinished);
        for node in candidates {
            if caches.nodes.get(&ObjectRef::new(&node)).is_some() {
                continue;
            }
            let orphans = caches.pods_on(&node);
            if orphans.is_empty() {
                continue;
            }
            match nodes.get_opt(&node).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(error) => {
                    debug!(%node, %error, "cannot tell whether a node exists");
                    wake = Some(Duration::from_secs(1));
                    unfinished.insert(node);
                    continue;
                }
            }
            for pod in orphans {
                let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
                match api
                    .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => {
                        debug!(pod = %pod.name_any(), %error, "cannot delete a pod of a deleted node");
                        wake = Some(Duration::from_secs(1));
                        unfinished.insert(node.clone());
                    }
                }
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
        // Most passes have nothing to schedule: the index counts the pods that name no node, so a pass
        // looks at the pods only when some wait.
        if lock(&caches.index).unbound.is_empty() {
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
    let changes = lock(&caches.index).subscribe();
    caches.ready().await;
    let mut changed = caches.changes();
    let mut validator_seen: BTreeSet<String> = BTreeSet::new();
    let mut mig_started: BTreeMap<String, Instant> = BTreeMap::new();
    // When each node's kubelet asked to look again (a pod's next step, the MIG manager's progress).
    let mut due: BTreeMap<String, Instant> = BTreeMap::new();
    let mut config_maps: BTreeMap<(String, String), BTreeMap<String, String>> = BTreeMap::new();
    let mut wake = Some(Duration::ZERO);
    loop {
        // Most of the kubelets' pass is writes that move pods on, not reading: they gather changes only
        // briefly, so that pods move as fast as the API server takes the writes.
        let mut every_node = false;
        let proceed = tokio::select! {
            () = shutdown.cancelled() => false,
            _ = changed.changed() => gather_changes(COALESCE, &shutdown).await,
            () = state.changed.notified() => {
                // The scenario changed hosts or faults, which no watch event shows.
                every_node = true;
                true
            }
            () = tokio::time::sleep(wake.unwrap_or(Duration::from_secs(5))) => true,
        };
        if !proceed {
            break;
        }
        changed.borrow_and_update();
        let now = k8s_openapi::jiff::Timestamp::now();
        // A kubelet looks at its node when the Node or a pod bound there changed, when it asked to, or when
        // what every node reads changed: a pass costs the nodes that changed, not the cluster's size.
        let (all, mut dirty) = lock(&changes).take();
        let latest_config_maps: BTreeMap<(String, String), BTreeMap<String, String>> = caches
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
        every_node |= all || latest_config_maps != config_maps;
        config_maps = latest_config_maps;
        let instant = Instant::now();
        due.retain(|node, at| {
            let later = *at > instant;
            if !later {
                dirty.insert(node.clone());
            }
            later
        });
        let hosts: Vec<String> = if every_node {
            state.hosts().keys().cloned().collect()
        } else {
            let hosts = state.hosts();
            dirty.retain(|node| hosts.contains_key(node));
            dirty.into_iter().collect()
        };
        let faults = state.faults().clone();
        for node_name in hosts {
            let Some(node) = caches.nodes.get(&ObjectRef::new(&node_name)) else {
                continue;
            };
            let node = &node;
            if faults.not_ready.contains(&node_name) {
                continue;
            }
            let pods = caches.pods_on(&node_name);
            let mut look_again: Option<Duration> = None;
            let mut soonest = |duration: Option<Duration>| {
                if let Some(duration) = duration {
                    look_again = Some(look_again.map_or(duration, |current| current.min(duration)));
                }
            };
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
                    if let Err(error) = patch_status_unread(&client, &api, &pod.name_any(), &patch).await {
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
            if let Some(after) = look_again {
                let at = Instant::now() + after;
                due.entry(node_name)
                    .and_modify(|due| *due = (*due).min(at))
                    .or_insert(at);
            }
        }
        let instant = Instant::now();
        wake = due.values().min().map(|at| at.saturating_duration_since(instant));
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

/// Sends a merge patch of a pod's status, and reads the answer only for its code: the kubelets learn of
/// the change from their watch, as the real kubelet does, and decoding every answered Pod (managed fields
/// and all) was a share of the simulator's CPU of its own.
async fn patch_status_unread(
    client: &Client,
    api: &Api<Pod>,
    name: &str,
    patch: &serde_json::Value,
) -> kube::Result<()> {
    let mut request = kube::core::Request::new(api.resource_url())
        .patch_subresource("status", name, &PatchParams::default(), &Patch::Merge(patch))
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("patch_status");
    client.request_text(request).await.map(drop)
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
        let ours = every_key.contains_key(key)
            || key.starts_with(labels::RESOURCE_MIG_PREFIX)
            || key == labels::MIG_STRATEGY;
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

/// Heartbeat writes in flight at once, per kind (Lease renewals, status reports): enough for 1,000 nodes'
/// 100 renewals a second while a busy API server takes half a second to answer each, without opening a
/// connection per node.
const HEARTBEATS_IN_FLIGHT: usize = 64;

/// The longest the heartbeat actor sleeps, so that a node that joins, or whose kubelet stops or comes back,
/// is seen promptly even when nothing else is due.
const HEARTBEAT_LOOK_AT_MOST: Duration = Duration::from_millis(500);

/// The kubelets' signs of life: each running simulated node's Lease in `kube-node-lease` created and
/// renewed, and its status reported, when the [`Schedule`] says. A node whose kubelet a scenario stopped
/// (`nodeNotReady`) gives none, so a real node lifecycle controller sees it go as it would.
///
/// Renewals and reports are two loops, as in kubelet: a status report is a large write that a busy API
/// server answers slowly, and a thousand joining nodes each report once, so renewals that waited behind
/// them let Leases expire (a 40 s Lease, measured on a real control plane during a 1,000-node rollout).
/// Each loop sends through a [`Pipeline`], so a slow write holds back only its own node, and each write is
/// given at most one renewal interval.
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
        () = async {
            caches.ready().await;
            ensure_lease_namespace(&client).await;
            tokio::join!(
                renew_leases(client.clone(), caches.clone(), state.clone(), heartbeats),
                report_statuses(client, caches, state, heartbeats),
            );
        } => {}
    }
}

/// The running simulated nodes: those with a host whose kubelet a scenario has not stopped.
fn running_nodes(caches: &Caches, state: &SimState) -> BTreeMap<String, Arc<Node>> {
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
}

/// How long to sleep until the schedule's next look.
fn until_next(next: Option<Duration>, heartbeats: Heartbeats, started: Instant) -> Duration {
    next.map_or(heartbeats.renew_every, |next| {
        next.saturating_sub(started.elapsed())
    })
    .min(HEARTBEAT_LOOK_AT_MOST)
}

/// The Lease loop of [`node_heartbeats`]; it runs until dropped.
async fn renew_leases(client: Client, caches: Caches, state: Arc<SimState>, heartbeats: Heartbeats) {
    let leases: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let mut schedule = Schedule::new(heartbeats);
    // Nodes whose Lease this simulation has created (or found): those are renewed by a patch of
    // `renewTime` alone.
    let mut leased: BTreeSet<String> = BTreeSet::new();
    let mut pipeline = Pipeline::new(HEARTBEATS_IN_FLIGHT);
    let mut running = BTreeMap::new();
    let started = Instant::now();
    let mut look = started;
    loop {
        tokio::select! {
            (name, there) = pipeline.finished() => {
                if there {
                    leased.insert(name);
                } else {
                    leased.remove(&name);
                }
            }
            () = tokio::time::sleep_until(look) => {
                running = running_nodes(&caches, &state);
                leased.retain(|name| running.contains_key(name));
                let names: BTreeSet<String> = running.keys().cloned().collect();
                let due = schedule.due(&names, started.elapsed());
                pipeline.queue(due.renew);
                look = Instant::now() + until_next(due.next, heartbeats, started);
            }
        }
        pipeline.start(|name| {
            let node = running.get(name)?.clone();
            let known = leased.contains(name);
            let leases = leases.clone();
            Some(Box::pin(async move {
                let renewed = renew_lease(&leases, &node, heartbeats, known, Timestamp::now());
                // Timed out: the Lease may or may not have been written; the next renewal finds out.
                tokio::time::timeout(heartbeats.renew_every, renewed)
                    .await
                    .unwrap_or(known)
            }))
        });
    }
}

/// The status loop of [`node_heartbeats`]; it runs until dropped.
async fn report_statuses(client: Client, caches: Caches, state: Arc<SimState>, heartbeats: Heartbeats) {
    let nodes_api: Api<Node> = Api::all(client);
    let mut schedule = Schedule::new(heartbeats);
    let mut pipeline = Pipeline::new(HEARTBEATS_IN_FLIGHT);
    let mut running = BTreeMap::new();
    let started = Instant::now();
    let mut look = started;
    loop {
        tokio::select! {
            _ = pipeline.finished() => {}
            () = tokio::time::sleep_until(look) => {
                running = running_nodes(&caches, &state);
                let names: BTreeSet<String> = running.keys().cloned().collect();
                let due = schedule.due(&names, started.elapsed());
                pipeline.queue(due.report);
                // Like kubelet, report at once when the status on the server disagrees with the running
                // kubelet: a node lifecycle controller marked the node Unknown while its Leases were late.
                pipeline.queue(running.iter().filter_map(|(name, node)| {
                    let ready = node
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
                    ready.is_some_and(|c| c.status != "True").then(|| name.clone())
                }));
                look = Instant::now() + until_next(due.next, heartbeats, started);
            }
        }
        pipeline.start(|name| {
            let node = running.get(name)?.clone();
            let nodes_api = nodes_api.clone();
            Some(Box::pin(async move {
                let reported = report_heartbeat(&nodes_api, &node, Timestamp::now());
                let _ = tokio::time::timeout(heartbeats.renew_every, reported).await;
            }))
        });
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
    match crate::simulation::create_namespace(client, LEASE_NAMESPACE).await {
        Ok(true) => info!(namespace = LEASE_NAMESPACE, "created the node lease namespace"),
        Ok(false) => {}
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
