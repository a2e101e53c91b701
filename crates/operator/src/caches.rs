//! The operator's view of the cluster: one watch per kind it reads, each holding only what the decisions
//! need. Nodes and the operator namespace's pods are kept as compact projections ([`NodeCache`],
//! [`PodCache`]; what they keep: [`crate::projection`]; their watches decode each object lean, building only
//! what the projection reads: [`WatchedNode`], [`WatchedPod`]), and only a change of a projection wakes the
//! controllers (and, for a node, the labeller): a heartbeat or an unrelated label wakes nobody. Managed
//! objects of every rendered kind keep only their metadata, with the main resource's managed fields (drift
//! detection, [`crate::drift`]); every change of those, of the policies, NVIDIADrivers, DaemonSets and
//! ControllerRevisions wakes the controllers.
//!
//! Each resource's access is tracked on its own ([`Availability`]): one the API refuses to list (a missing
//! CRD: `NotFound`; a missing permission: `Forbidden`) is reported by name and reason, in the log, on
//! `/readyz` and in the ClusterPolicy's status, while every other cache syncs and the controllers run with
//! what they have. ClusterPolicies are read through [`Decoded`] (kube's `DeserializeGuard`, with the
//! field's path in the error), so one that does not decode is kept as its metadata and the error instead
//! of failing the whole list.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use futures::{StreamExt, TryStreamExt};
use gpuop_api::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_api::read::{NodeRead, PodRead};
use gpuop_api::{ClusterPolicy, NVIDIADriver};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, CustomResourceExt};
use serde::de::Error as _;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::apply::MANAGED_KINDS;
use crate::changes::{Changed, NodeSet, NodeSource, PodSet, PodSource};
use crate::gulps::{GATHER, Gulps};
use crate::index::Judgements;
use crate::projection::{
    Interner, NodeFields, NodeKeys, NodeRecord, PodRecord, Text, WatchedNode, WatchedPod,
};
use crate::trimmed::{MetadataOnly, Statusless, unwrap_event};

/// What the node cache tells the labeller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    /// This node was added, changed or deleted.
    Changed(String),
    /// The cache listed every node anew (at start, or after its watch expired) and its store now holds the
    /// new list: every node is judged again. Nodes seen during the list are not sent one by one, because
    /// until the list ends the store still holds the old ones.
    Relisted,
}

/// Wakes every controller when a cache changes. Each has its own `Notify`, so that one controller's
/// wake-up is never taken by another.
#[derive(Debug, Default)]
pub struct Changes {
    /// The policy reconciler's.
    pub policies: Notify,
    /// The policy reconciler's, for changes that move nothing but readiness (pods): the status counts them
    /// at most once a second, so passes for them come at most that often.
    pub readiness: Notify,
    /// The upgrade controller's.
    pub upgrades: Notify,
}

impl Changes {
    /// Wakes every controller (each keeps one wake-up if it is busy).
    pub fn notify(&self) {
        self.policies.notify_one();
        self.upgrades.notify_one();
    }
}

/// Locks a mutex whose holder may have panicked: what it guards is whole between statements.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every cache the operator reads.
#[derive(Clone, Debug)]
pub struct Caches {
    /// ClusterPolicies, each decoded or, when it does not decode, its metadata and why.
    pub policies: Store<Decoded<ClusterPolicy>>,
    /// NVIDIADrivers.
    pub drivers: Store<NVIDIADriver>,
    /// Nodes, projected.
    pub nodes: NodeCache,
    /// The operator's DaemonSets, whole.
    pub daemonsets: Store<DaemonSet>,
    /// Pods in the operator namespace, projected.
    pub pods: PodCache,
    /// Per node, the judgements made of it, reused while neither it nor their inputs change.
    pub judged: Arc<Mutex<Judgements>>,
    /// ControllerRevisions in the operator namespace.
    pub revisions: Store<ControllerRevision>,
    /// ConfigMaps in the operator namespace, their keys without the values: drivers mount the ones a policy
    /// or an NVIDIADriver names file by file, so the rendering depends on their keys.
    pub config_maps: Store<ConfigMap>,
    /// Managed objects of every rendered kind, metadata only (managed fields trimmed), by kind.
    pub managed: BTreeMap<&'static str, Store<DynamicObject>>,
    /// Which resources can be read.
    pub availability: Availability,
    /// Stops the reflectors.
    shutdown: CancellationToken,
}

impl Caches {
    /// Starts every reflector; each change notifies `changed`, and every node that changes, and every
    /// relist of the nodes, is sent on the returned channel (the labeller's queue, see [`node_event`]).
    /// Reflectors stop when `shutdown` is cancelled.
    pub fn start(
        client: &Client,
        namespace: &str,
        service_monitor_crd: bool,
        changed: &Arc<Changes>,
        shutdown: &CancellationToken,
    ) -> (Self, mpsc::UnboundedReceiver<NodeEvent>) {
        let managed_label = format!("{MANAGED_BY}={MANAGED_BY_VALUE}");
        let availability = Availability::default();
        let policies = spawn(
            Api::all(client.clone()),
            watcher::Config::default(),
            |policy: &mut Decoded<ClusterPolicy>| {
                kube::Resource::meta_mut(policy).managed_fields = None;
            },
            |_, _| false,
            availability.track(ClusterPolicy::crd_name(), false),
            changed,
            shutdown,
        );
        let drivers = spawn(
            Api::all(client.clone()),
            watcher::Config::default(),
            |driver: &mut NVIDIADriver| driver.metadata.managed_fields = None,
            |_, _| false,
            availability.track(NVIDIADriver::crd_name(), false),
            changed,
            shutdown,
        );
        let (node_names, node_events) = mpsc::unbounded_channel();
        let interner = Arc::new(Mutex::new(Interner::default()));
        let nodes = NodeCache::new(interner.clone());
        follow_nodes(
            client.clone(),
            nodes.clone(),
            node_names,
            availability.track("nodes", false),
            changed,
            shutdown,
        );
        let daemonsets = spawn_decoded(
            Api::<Statusless<DaemonSet>>::namespaced(client.clone(), namespace),
            |ds| ds.0,
            watcher::Config::default().labels(&managed_label),
            // Nothing reads a DaemonSet's status or version: the DaemonSet controller's status writes,
            // one per pod that changes, wake nobody.
            |ds: &mut DaemonSet| {
                ds.metadata.managed_fields = None;
                ds.metadata.resource_version = None;
                ds.status = None;
            },
            |stored, new| stored == new,
            availability.track("daemonsets.apps", false),
            changed,
            shutdown,
        );
        let pods = PodCache::new(interner);
        follow_pods(
            Api::namespaced(client.clone(), namespace),
            pods.clone(),
            availability.track("pods", false),
            changed,
            shutdown,
        );
        let revisions = spawn(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default(),
            |revision: &mut ControllerRevision| {
                revision.data = None;
                revision.metadata.managed_fields = None;
            },
            |stored, new| stored == new,
            availability.track("controllerrevisions.apps", false),
            changed,
            shutdown,
        );
        let config_maps = spawn(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default(),
            trim_config_map,
            |stored, new| stored == new,
            availability.track(CONFIG_MAP_KEYS, false),
            changed,
            shutdown,
        );
        let mut managed = BTreeMap::new();
        for kind in MANAGED_KINDS {
            if kind.kind == "ServiceMonitor" && !service_monitor_crd {
                continue;
            }
            let writer = reflector::store::Writer::new(kind.api_resource());
            let reader = writer.as_reader();
            let tracker = availability.track(&kind.resource(), kind.kind == "ServiceMonitor");
            let resource = kind.api_resource();
            let api: Api<MetadataOnly> = if kind.namespaced {
                Api::namespaced_with(client.clone(), namespace, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let stream = watcher(api, watcher::Config::default().labels(&managed_label))
                .map_ok(|event| unwrap_event(event, |object| object.0))
                .default_backoff()
                .modify(|object: &mut DynamicObject| {
                    object.data = serde_json::Value::Null;
                    crate::drift::trim_managed_fields(&mut object.metadata.managed_fields);
                })
                // A write to the object's status moves only its version here (the status and the status
                // subresource's managed fields are trimmed): it wakes nobody, and the version kept is that of
                // the last change an apply plan reads.
                .try_filter(news(reader.clone(), kind.api_resource(), same_but_version))
                .reflect(writer)
                .inspect(move |item| tracker.observe(item));
            run(stream, changed, shutdown);
            managed.insert(kind.kind, reader);
        }
        let caches = Self {
            policies,
            drivers,
            nodes,
            daemonsets,
            pods,
            judged: Arc::default(),
            revisions,
            config_maps,
            managed,
            availability,
            shutdown: shutdown.clone(),
        };
        (caches, node_events)
    }

    /// Waits until every cache has listed once or been refused for good (a missing CRD, a forbidden list:
    /// see [`Availability`]), and says whether they did: `false` when the caches were stopped first
    /// (shutdown before the API server ever answered), so that nothing acts, or claims to be ready, on
    /// stores that never listed. Any number of tasks may wait.
    pub async fn ready(&self) -> bool {
        let mut access = self.availability.subscribe();
        tokio::select! {
            biased;
            settled = access.wait_for(settled) => settled.is_ok(),
            () = self.shutdown.cancelled() => false,
        }
    }

    /// The judgements kept across passes (held only between awaits).
    pub fn judgements(&self) -> std::sync::MutexGuard<'_, Judgements> {
        lock(&self.judged)
    }

    /// Resources the operator needs but cannot read, each with the API's reason.
    pub fn unavailable_required(&self) -> Vec<Unavailable> {
        self.availability.unavailable(false)
    }
}

/// An object as read: decoded, or, when it does not decode, its metadata and what does not decode, with
/// the field's path (`spec.driver.enabled: invalid type: string "yes", expected a boolean`). Like kube's
/// `DeserializeGuard`, whose error names no field.
#[derive(Clone, Debug)]
pub struct Decoded<K>(pub Result<K, InvalidObject>);

impl<'de, K: serde::de::DeserializeOwned> serde::Deserialize<'de> for Decoded<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let metadata = value.get("metadata").cloned();
        match serde_path_to_error::deserialize::<_, K>(value) {
            Ok(object) => Ok(Self(Ok(object))),
            Err(error) => {
                let metadata: ObjectMeta = serde_json::from_value(metadata.unwrap_or_default())
                    .map_err(|e| D::Error::custom(format!("metadata: {e}")))?;
                Ok(Self(Err(InvalidObject {
                    error: format!("{}: {}", error.path(), error.inner()),
                    metadata,
                })))
            }
        }
    }
}

impl<K: kube::Resource> kube::Resource for Decoded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.as_ref().map_or_else(|invalid| &invalid.metadata, K::meta)
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0
            .as_mut()
            .map_or_else(|invalid| &mut invalid.metadata, K::meta_mut)
    }
}

/// Whether a resource's cache can be filled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Not listed yet (or the last list failed for a reason that may pass: a timeout, a 5xx).
    Listing,
    /// Listed; its cache follows the watch.
    Listed,
    /// The API refuses it (`NotFound`: the CRD is not installed; `Forbidden`: the operator may not list or
    /// watch it). The reflector keeps retrying with back-off and recovers once it is served.
    Refused {
        /// The API's reason.
        reason: String,
        /// The API's message.
        message: String,
    },
}

/// One resource's access, as tracked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// Whether the operator does its job without it (the ServiceMonitor CRD comes with the Prometheus
    /// Operator, which many clusters do not run).
    pub optional: bool,
    /// Its access.
    pub access: Access,
}

/// A resource the operator cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// The resource, `plural.group` (`nvidiadrivers.nvidia.com`, `pods`).
    pub resource: String,
    /// The API's reason.
    pub reason: String,
    /// The API's message.
    pub message: String,
}

/// The access of every resource the caches read, by resource; shared by the reflectors (which update it),
/// the controllers (which wait for it to settle) and `/readyz` (which reports it).
#[derive(Clone, Debug, Default)]
pub struct Availability {
    resources: Arc<watch::Sender<BTreeMap<String, Tracked>>>,
}

impl Availability {
    /// Starts tracking a resource, as not listed yet.
    pub fn track(&self, resource: &str, optional: bool) -> Tracker {
        self.resources.send_modify(|resources| {
            resources.insert(
                resource.to_owned(),
                Tracked {
                    optional,
                    access: Access::Listing,
                },
            );
        });
        Tracker {
            resource: resource.to_owned(),
            resources: self.resources.clone(),
        }
    }

    /// Every tracked resource.
    pub fn resources(&self) -> BTreeMap<String, Tracked> {
        self.resources.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Tracked>> {
        self.resources.subscribe()
    }

    /// The resources refused, required ones only unless `optional` too.
    pub fn unavailable(&self, optional: bool) -> Vec<Unavailable> {
        unavailable(&self.resources.borrow(), optional)
    }

    /// What `/readyz` answers now.
    pub fn readiness(&self) -> Readiness {
        readiness(&self.resources.borrow())
    }
}

/// What `/readyz` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Whether every resource the operator needs is listed.
    pub ready: bool,
    /// One line per resource that is not, with its reason; `ok` first when ready.
    pub body: String,
}

/// Ready when every required resource is listed; the body names each one that is not, with the API's
/// reason, and each optional one that is refused.
pub fn readiness(resources: &BTreeMap<String, Tracked>) -> Readiness {
    let mut lines = Vec::new();
    let mut ready = true;
    for (resource, tracked) in resources {
        match (&tracked.access, tracked.optional) {
            (Access::Listed, _) => {}
            (Access::Listing, false) => {
                ready = false;
                lines.push(format!("{resource}: not listed yet"));
            }
            (Access::Listing, true) => {}
            (Access::Refused { reason, message }, false) => {
                ready = false;
                lines.push(format!("{resource}: {reason}: {message}"));
            }
            (Access::Refused { reason, .. }, true) => {
                lines.push(format!("{resource}: {reason} (optional: not used)"));
            }
        }
    }
    if ready {
        lines.insert(0, "ok".to_owned());
    }
    Readiness {
        ready,
        body: lines.join("\n") + "\n",
    }
}

fn unavailable(resources: &BTreeMap<String, Tracked>, optional: bool) -> Vec<Unavailable> {
    resources
        .iter()
        .filter(|(_, tracked)| optional || !tracked.optional)
        .filter_map(|(resource, tracked)| match &tracked.access {
            Access::Refused { reason, message } => Some(Unavailable {
                resource: resource.clone(),
                reason: reason.clone(),
                message: message.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// Whether every resource has listed or been refused.
fn settled(resources: &BTreeMap<String, Tracked>) -> bool {
    resources
        .values()
        .all(|tracked| !matches!(tracked.access, Access::Listing))
}

/// Updates one resource's access from its reflector's stream.
#[derive(Clone, Debug)]
pub struct Tracker {
    resource: String,
    resources: Arc<watch::Sender<BTreeMap<String, Tracked>>>,
}

impl Tracker {
    /// Takes in one item of the reflector's stream: a completed list or a watch event means listed; a
    /// refusal the API will repeat (403, 404) means refused, logged once with the API's reason; any other
    /// error is logged and retried with back-off.
    pub fn observe<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        let access = match item {
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                Access::Listed
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => return,
            Err(error) => match refusal(error) {
                Some((reason, message)) => Access::Refused { reason, message },
                None => {
                    tracing::warn!(resource = %self.resource, %error, "watch failed; retrying with back-off");
                    return;
                }
            },
        };
        self.resources.send_if_modified(|resources| {
            let Some(tracked) = resources.get_mut(&self.resource) else {
                return false;
            };
            if tracked.access == access {
                return false;
            }
            match (&tracked.access, &access) {
                (_, Access::Refused { reason, message }) if tracked.optional => {
                    tracing::info!(resource = %self.resource, %reason, %message, "optional resource not served; not used");
                }
                (_, Access::Refused { reason, message }) => {
                    tracing::warn!(resource = %self.resource, %reason, %message, "cannot list or watch; the operator runs without it and is not ready");
                }
                (Access::Refused { .. }, Access::Listed) => {
                    tracing::info!(resource = %self.resource, "listed again");
                }
                _ => {}
            }
            tracked.access = access;
            true
        });
    }
}

/// The API's reason and message when a watcher error is a refusal that retrying will not change by
/// itself: 404 (the resource is not served: its CRD is missing) or 403 (forbidden).
fn refusal(error: &watcher::Error) -> Option<(String, String)> {
    let (watcher::Error::InitialListFailed(kube::Error::Api(status))
    | watcher::Error::WatchStartFailed(kube::Error::Api(status))
    | watcher::Error::WatchFailed(kube::Error::Api(status))
    | watcher::Error::WatchError(status)) = error
    else {
        return None;
    };
    if !matches!(status.code, 403 | 404) {
        return None;
    }
    let reason = if status.reason.is_empty() {
        if status.code == 403 {
            "Forbidden"
        } else {
            "NotFound"
        }
        .to_owned()
    } else {
        status.reason.clone()
    };
    Some((reason, status.message.clone()))
}

/// What a typed reflector keeps (those of [`spawn`], and the simulator's): a resource of a static kind that
/// decodes and moves between tasks.
pub trait Cached:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Cached for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Starts a reflector whose objects are trimmed by `trim`; an update that leaves the trimmed object as the
/// store holds it (`unchanged`) is dropped, so that it wakes nobody.
fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    unchanged: fn(&K, &K) -> bool,
    tracker: Tracker,
    changed: &Arc<Changes>,
    shutdown: &CancellationToken,
) -> Store<K>
where
    K: Cached,
{
    spawn_decoded(
        api,
        std::convert::identity,
        config,
        trim,
        unchanged,
        tracker,
        changed,
        shutdown,
    )
}

/// [`spawn`], for objects read as `W` (a leaner decoding) and kept as `K`.
#[allow(clippy::too_many_arguments)]
fn spawn_decoded<W, K>(
    api: Api<W>,
    decoded: fn(W) -> K,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    unchanged: fn(&K, &K) -> bool,
    tracker: Tracker,
    changed: &Arc<Changes>,
    shutdown: &CancellationToken,
) -> Store<K>
where
    K: Cached,
    W: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .map_ok(move |event| unwrap_event(event, decoded))
        .default_backoff()
        .modify(trim)
        .try_filter(news(reader.clone(), (), unchanged))
        .reflect(writer)
        .inspect(move |item| tracker.observe(item));
    run(stream, changed, shutdown);
    reader
}

/// A watch filter that passes every event but an applied object that `unchanged` finds the same as `known`
/// holds it: such an update wakes nobody.
fn news<K>(
    known: Store<K>,
    resource: K::DynamicType,
    unchanged: fn(&K, &K) -> bool,
) -> impl FnMut(&watcher::Event<K>) -> std::future::Ready<bool>
where
    K: kube::Resource + Clone,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    move |event| {
        let news = match event {
            watcher::Event::Apply(object) => !known
                .get(&reflector::ObjectRef::from_obj_with(object, resource.clone()))
                .is_some_and(|stored| unchanged(&stored, object)),
            _ => true,
        };
        std::future::ready(news)
    }
}

fn run<S, T, E>(stream: S, changed: &Arc<Changes>, shutdown: &CancellationToken)
where
    S: futures::Stream<Item = Result<T, E>> + Send + 'static,
    T: Send,
    E: Send,
{
    let changed = changed.clone();
    spawn_until_cancelled(stream, shutdown, move |item| {
        // An error the tracker logged, with the resource.
        if item.is_ok() {
            changed.notify();
        }
    });
}

/// Spawns a task that hands each item of `stream` (a watch, usually) to `on_item` until the stream ends or
/// `stop` is cancelled.
pub fn spawn_until_cancelled<S>(
    stream: S,
    stop: &CancellationToken,
    mut on_item: impl FnMut(S::Item) + Send + 'static,
) where
    S: futures::Stream + Send + 'static,
    S::Item: Send,
{
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                item = stream.next() => match item {
                    Some(item) => on_item(item),
                    None => break,
                },
            }
        }
    });
}

/// The projected nodes ([`NodeRecord`]), shared by the controllers: what the node watch delivered, each
/// record replaced only when what it keeps changed, so that a record's identity (`Arc::ptr_eq`) says
/// whether the node changed since it was last judged ([`crate::index`]).
#[derive(Clone, Debug)]
pub struct NodeCache {
    table: Arc<RwLock<NodeTable>>,
    /// Restarts the node watch (a relist) when the keys to keep grew.
    relist: Arc<Notify>,
    interner: Arc<Mutex<Interner>>,
}

/// The nodes and what they were projected with.
#[derive(Debug, Default)]
pub struct NodeTable {
    nodes: NodeSet,
    versions: HashMap<Text, Box<str>>,
    /// The NFD keys every record in `nodes` was projected with.
    keys: NodeKeys,
    /// The NFD keys new events are projected with (a superset of `keys`).
    wanted: NodeKeys,
    /// A relist under way.
    relist: Option<NodeRelist>,
}

/// A relist under way: the keys it projects with, and the records and versions so far.
#[derive(Debug, Default)]
struct NodeRelist {
    keys: NodeKeys,
    nodes: HashMap<Text, Arc<NodeRecord>>,
    versions: HashMap<Text, Box<str>>,
}

impl NodeTable {
    /// A node's resourceVersion as last seen.
    pub fn version(&self, name: &str) -> Option<&str> {
        self.versions.get(name).map(|v| &**v)
    }

    /// Every record.
    pub fn records(&self) -> Vec<Arc<NodeRecord>> {
        self.nodes.nodes()
    }

    /// Takes in one event of the node watch; says what the labeller is to hear of it: a node whose record
    /// changed, or a completed relist (once the table holds the new list, so that nothing is judged
    /// against the old one). An event that changes nothing a record keeps tells nothing.
    pub fn apply<N: NodeFields + kube::Resource>(
        &mut self,
        event: &watcher::Event<N>,
        interner: &mut Interner,
    ) -> Option<NodeEvent> {
        match event {
            watcher::Event::Apply(node) => {
                let record = NodeRecord::project(node, &self.wanted, interner);
                let name = record.name.clone();
                if let Some(version) = node.meta().resource_version.as_deref() {
                    self.versions.insert(name.clone(), version.into());
                }
                self.nodes
                    .put(record)
                    .then(|| NodeEvent::Changed(name.to_string()))
            }
            watcher::Event::Delete(node) => {
                let name = NodeRead::name(node);
                self.versions.remove(name);
                self.nodes
                    .remove(name)
                    .then(|| NodeEvent::Changed(name.to_owned()))
            }
            watcher::Event::Init => {
                self.relist = Some(NodeRelist {
                    keys: self.wanted.clone(),
                    ..NodeRelist::default()
                });
                None
            }
            watcher::Event::InitApply(node) => {
                let relist = self.relist.get_or_insert_with(Default::default);
                let record = NodeRecord::project(node, &relist.keys, interner);
                let name = record.name.clone();
                if let Some(version) = node.meta().resource_version.as_deref() {
                    relist.versions.insert(name.clone(), version.into());
                }
                // An unchanged node keeps its record, and the judgements made of it.
                let record = match self.nodes.get(&name) {
                    Some(old) if **old == record => old.clone(),
                    _ => Arc::new(record),
                };
                relist.nodes.insert(name, record);
                None
            }
            watcher::Event::InitDone => {
                let relist = self.relist.take().unwrap_or_default();
                self.nodes.replace_all(relist.nodes);
                self.versions = relist.versions;
                self.keys = relist.keys;
                Some(NodeEvent::Relisted)
            }
        }
    }
}

/// Whether two trimmed managed objects differ in nothing but their `resourceVersion`. Their `apiVersion` and
/// `kind` are not compared: they are the cache's own, and kube-apiserver sends them with watch events but
/// not with the items of a list, so a relisted object would otherwise count as changed.
fn same_but_version(stored: &DynamicObject, new: &DynamicObject) -> bool {
    // Field by field, so that a field ObjectMeta gains is compared too (this does not compile without it).
    let ObjectMeta {
        annotations,
        creation_timestamp,
        deletion_grace_period_seconds,
        deletion_timestamp,
        finalizers,
        generate_name,
        generation,
        labels,
        managed_fields,
        name,
        namespace,
        owner_references,
        resource_version: _,
        self_link,
        uid,
    } = &stored.metadata;
    let other = &new.metadata;
    stored.data == new.data
        && *name == other.name
        && *namespace == other.namespace
        && *uid == other.uid
        && *generation == other.generation
        && *labels == other.labels
        && *annotations == other.annotations
        && *owner_references == other.owner_references
        && *finalizers == other.finalizers
        && *deletion_timestamp == other.deletion_timestamp
        && *deletion_grace_period_seconds == other.deletion_grace_period_seconds
        && *creation_timestamp == other.creation_timestamp
        && *generate_name == other.generate_name
        && *self_link == other.self_link
        && *managed_fields == other.managed_fields
}

/// How the ConfigMap keys' watch is named in the availability (the managed ConfigMaps' watch is
/// `configmaps`): both need the same permission.
pub const CONFIG_MAP_KEYS: &str = "configmaps (keys of those drivers mount)";

/// Keeps the name and the keys: the values are the user's, and nothing the operator decides reads them.
fn trim_config_map(config_map: &mut ConfigMap) {
    config_map.metadata = ObjectMeta {
        name: config_map.metadata.name.take(),
        namespace: config_map.metadata.namespace.take(),
        resource_version: config_map.metadata.resource_version.take(),
        ..ObjectMeta::default()
    };
    for value in config_map.data.iter_mut().flat_map(|data| data.values_mut()) {
        value.clear();
    }
    for value in config_map
        .binary_data
        .iter_mut()
        .flat_map(|data| data.values_mut())
    {
        value.0.clear();
    }
}

impl NodeCache {
    fn new(interner: Arc<Mutex<Interner>>) -> Self {
        Self {
            table: Arc::default(),
            relist: Arc::default(),
            interner,
        }
    }

    /// The table, read-locked: what is read through it is one consistent view (hold it briefly).
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, NodeTable> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, NodeTable> {
        self.table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every node.
    pub fn state(&self) -> Vec<Arc<NodeRecord>> {
        self.read().nodes.nodes()
    }

    /// A node by name.
    pub fn get(&self, name: &str) -> Option<Arc<NodeRecord>> {
        self.read().nodes.node(name)
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.read().nodes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.read().nodes.is_empty()
    }

    /// The node's resourceVersion as last seen.
    pub fn resource_version(&self, name: &str) -> Option<String> {
        self.read().versions.get(name).map(|v| v.to_string())
    }

    /// Whether the records keep every key of `needed`. When they do not, the keys are added and the node
    /// watch relists (its completion wakes the controllers); until then no decision may read them.
    pub fn covers(&self, needed: &NodeKeys) -> bool {
        if self.read().keys.covers(needed) {
            return true;
        }
        let mut table = self.write();
        if !table.wanted.covers(needed) {
            table.wanted = table.wanted.union(needed);
            tracing::info!("a selector reads NFD labels the node cache does not keep; relisting the nodes");
            self.relist.notify_one();
        }
        false
    }

    /// The projection of a node read from the API (after a write), with the keys the cache keeps.
    pub fn project(&self, node: &impl NodeFields) -> NodeRecord {
        let keys = self.read().wanted.clone();
        NodeRecord::project(node, &keys, &mut lock(&self.interner))
    }
}

/// Nodes per page of the node list (kube's default is 500: 11 MiB of body at a time, twice over while it
/// is collected, for nodes of ~190 labels).
const NODE_PAGE: u32 = 100;

/// Follows the node watch into `cache`: every node whose record changed, and every relist, goes to the
/// labeller's queue; controllers are woken only by a change of a record.
fn follow_nodes(
    client: Client,
    cache: NodeCache,
    labeller: mpsc::UnboundedSender<NodeEvent>,
    tracker: Tracker,
    changed: &Arc<Changes>,
    shutdown: &CancellationToken,
) {
    let changed = changed.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        loop {
            // Decoded lean: only what the projection reads is built (see `WatchedNode`). Listed a hundred
            // at a time: a page is held whole while it is read, and a node of a real fleet is ~20 KB.
            let stream = watcher(
                Api::<WatchedNode>::all(client.clone()),
                watcher::Config::default().page_size(NODE_PAGE),
            )
            .default_backoff();
            let stream = std::pin::pin!(stream);
            let mut stream = Gulps::new(stream, GATHER);
            loop {
                let item = tokio::select! {
                    () = shutdown.cancelled() => return,
                    // A new watch lists every node again, projected with the keys now wanted.
                    () = cache.relist.notified() => break,
                    item = stream.next() => item,
                };
                let Some(item) = item else { return };
                tracker.observe(&item);
                let Ok(event) = item else { continue };
                let told = cache.write().apply(&event, &mut lock(&cache.interner));
                if let Some(told) = told {
                    let _ = labeller.send(told);
                    changed.notify();
                }
            }
        }
    });
}

/// The projected pods of the operator namespace ([`PodRecord`]), by name.
#[derive(Clone, Debug)]
pub struct PodCache {
    table: Arc<RwLock<PodTable>>,
    interner: Arc<Mutex<Interner>>,
}

/// The pods, and a relist under way.
#[derive(Debug, Default)]
pub struct PodTable {
    pods: PodSet,
    relist: Option<HashMap<Text, Arc<PodRecord>>>,
}

/// Who a changed pod record concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodChange {
    /// A pod the upgrade controller reads (a driver's or a validator's), or a whole new list: everyone.
    UpgradesRead,
    /// Another operand's pod: only the policy reconciler (readiness) reads it.
    PoliciesOnly,
}

impl PodChange {
    fn of(pod: &PodRecord) -> Self {
        if gpuop_api::upgrade::observe::upgrades_read(pod) {
            Self::UpgradesRead
        } else {
            Self::PoliciesOnly
        }
    }
}

impl PodTable {
    /// Takes in one event of the pod watch; says whom a changed record concerns (`None`: nothing changed).
    pub fn apply<P: PodRead>(
        &mut self,
        event: &watcher::Event<P>,
        interner: &mut Interner,
    ) -> Option<PodChange> {
        match event {
            watcher::Event::Apply(pod) => {
                let record = PodRecord::project(pod, interner);
                self.pods.put(record).map(|record| PodChange::of(&record))
            }
            watcher::Event::Delete(pod) => self
                .pods
                .remove(PodRead::name(pod))
                .map(|record| PodChange::of(&record)),
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(pod) => {
                let record = PodRecord::project(pod, interner);
                let record = match self.pods.get(&record.name) {
                    Some(old) if **old == record => old.clone(),
                    _ => Arc::new(record),
                };
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(record.name.clone(), record);
                None
            }
            watcher::Event::InitDone => {
                self.pods.replace_all(self.relist.take().unwrap_or_default());
                Some(PodChange::UpgradesRead)
            }
        }
    }
}

impl PodCache {
    fn new(interner: Arc<Mutex<Interner>>) -> Self {
        Self {
            table: Arc::default(),
            interner,
        }
    }

    /// The table, read-locked: what is read through it is one consistent view (hold it briefly).
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, PodTable> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every pod.
    pub fn state(&self) -> Vec<Arc<PodRecord>> {
        self.read().pods.values().cloned().collect()
    }
}

impl NodeSource for NodeTable {
    fn changes(&self, mark: u64) -> (u64, Changed) {
        self.nodes.changes(mark)
    }

    fn node(&self, name: &str) -> Option<Arc<NodeRecord>> {
        self.nodes.node(name)
    }

    fn nodes(&self) -> Vec<Arc<NodeRecord>> {
        self.nodes.nodes()
    }
}

impl PodSource for PodTable {
    fn changes(&self, mark: u64) -> (u64, Changed) {
        self.pods.changes(mark)
    }

    fn on_node(&self, node: &str) -> Vec<Arc<PodRecord>> {
        self.pods.on_node(node)
    }
}

impl PodSource for PodCache {
    fn changes(&self, mark: u64) -> (u64, Changed) {
        self.read().pods.changes(mark)
    }

    fn on_node(&self, node: &str) -> Vec<Arc<PodRecord>> {
        self.read().pods.on_node(node)
    }
}

impl NodeSource for NodeCache {
    fn changes(&self, mark: u64) -> (u64, Changed) {
        self.read().nodes.changes(mark)
    }

    fn node(&self, name: &str) -> Option<Arc<NodeRecord>> {
        self.read().nodes.node(name)
    }

    fn nodes(&self) -> Vec<Arc<NodeRecord>> {
        self.read().nodes.nodes()
    }
}

/// Follows the pod watch into `cache`; controllers are woken only by a change of a record.
fn follow_pods(
    api: Api<WatchedPod>,
    cache: PodCache,
    tracker: Tracker,
    changed: &Arc<Changes>,
    shutdown: &CancellationToken,
) {
    let changed = changed.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let stream = std::pin::pin!(stream);
        let mut stream = Gulps::new(stream, GATHER);
        loop {
            let item = tokio::select! {
                () = shutdown.cancelled() => return,
                item = stream.next() => item,
            };
            let Some(item) = item else { return };
            tracker.observe(&item);
            let Ok(event) = item else { continue };
            let changed_record = cache
                .table
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .apply(&event, &mut lock(&cache.interner));
            match changed_record {
                Some(PodChange::UpgradesRead) => {
                    changed.readiness.notify_one();
                    changed.upgrades.notify_one();
                }
                Some(PodChange::PoliciesOnly) => changed.readiness.notify_one(),
                None => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::read::Labels;
    use gpuop_api::upgrade::observe::DriverPods;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(component: &str) -> Pod {
        use gpuop_api::driver::DRIVER_CONFIG_DIGEST;
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {gpuop_api::labels::COMPONENT: component}, "managedFields": [{"manager": "x"}]},
            "spec": {
                "nodeName": "gpu-0",
                "containers": [
                    {"name": "nvidia-driver-ctr", "image": "driver",
                     "env": [{"name": "A", "value": "1"}, {"name": DRIVER_CONFIG_DIGEST, "value": "d1"}]},
                    {"name": "peermem", "image": "driver"},
                ],
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": "nvidia-driver-ctr", "ready": true, "restartCount": 12, "image": "i", "imageID": ""},
                    {"name": "peermem", "ready": true, "restartCount": 1, "image": "i", "imageID": ""},
                ],
            },
        }))
        .unwrap()
    }

    /// The node `gpu-0` at resource version `version`, with these labels.
    fn node(version: &str, labels: &[(&str, &str)]) -> Node {
        let mut node = gpuop_testkit::fixture::node("gpu-0").labels(labels).build();
        node.metadata.resource_version = Some(version.into());
        node
    }

    /// A relist (after a watch expired) in which a node changed: the labeller hears of it only once the
    /// table holds the new list, and then of every node, so that nothing is judged against the old table.
    #[test]
    fn the_labeller_hears_of_a_relist_once_the_table_holds_the_new_list() {
        let mut table = NodeTable::default();
        let mut interner = Interner::default();
        let before = node("1", &[]);
        let after = node("5", &[("feature.node.kubernetes.io/pci-10de.present", "true")]);
        let events = [
            watcher::Event::Apply(before),
            watcher::Event::Init,
            watcher::Event::InitApply(after),
            watcher::Event::InitDone,
        ];
        let mut heard = Vec::new();
        for event in &events {
            if let Some(told) = table.apply(event, &mut interner) {
                let gpu = table
                    .nodes
                    .get("gpu-0")
                    .unwrap()
                    .label("feature.node.kubernetes.io/pci-10de.present")
                    .is_some();
                heard.push((told, table.versions["gpu-0"].to_string(), gpu));
            }
        }
        assert_eq!(
            heard,
            [
                (NodeEvent::Changed("gpu-0".into()), "1".into(), false),
                (NodeEvent::Relisted, "5".into(), true),
            ]
        );
    }

    /// A heartbeat, an unrelated label or annotation, a status field nobody reads: the record stays as it
    /// was (so nothing judged of it is judged again), the resourceVersion follows, and nobody is told.
    #[test]
    fn an_event_that_changes_nothing_kept_tells_nobody() {
        let mut table = NodeTable::default();
        let mut interner = Interner::default();
        let gpu = ("feature.node.kubernetes.io/pci-10de.present", "true");
        let first = node("1", &[gpu, ("nvidia.com/gpu.deploy.driver", "true")]);
        assert!(
            table
                .apply(&watcher::Event::Apply(first.clone()), &mut interner)
                .is_some()
        );
        let record = table.nodes.get("gpu-0").unwrap().clone();

        let mut heartbeat = first.clone();
        heartbeat.metadata.resource_version = Some("2".into());
        heartbeat.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "MemoryPressure".into(),
                status: "False".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let mut unrelated = heartbeat.clone();
        unrelated.metadata.resource_version = Some("3".into());
        let labels = unrelated.metadata.labels.as_mut().unwrap();
        labels.insert(
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F".into(),
            "true".into(),
        );
        unrelated.metadata.annotations.get_or_insert_default().insert(
            "cluster-autoscaler.kubernetes.io/scale-down-disabled".into(),
            "true".into(),
        );
        for event in [heartbeat, unrelated] {
            assert_eq!(table.apply(&watcher::Event::Apply(event), &mut interner), None);
            assert!(
                Arc::ptr_eq(table.nodes.get("gpu-0").unwrap(), &record),
                "the record is the same"
            );
        }
        assert_eq!(
            &*table.versions["gpu-0"], "3",
            "a label write preconditions on the newest version"
        );

        let mut cordoned = first;
        cordoned.metadata.resource_version = Some("4".into());
        cordoned.spec.get_or_insert_default().unschedulable = Some(true);
        assert_eq!(
            table.apply(&watcher::Event::Apply(cordoned), &mut interner),
            Some(NodeEvent::Changed("gpu-0".into())),
            "a cordon is read"
        );
    }

    /// The projection keeps the labels rules read and none of NFD's hundred others nor the cloud
    /// provider's; an NFD label an NVIDIADriver selects on is kept once the cache is told of it, after a
    /// relist, and only then does the selector match.
    #[test]
    fn an_nfd_key_a_selector_names_is_kept_after_a_relist() {
        let interner = Arc::new(Mutex::new(Interner::default()));
        let cache = NodeCache::new(interner.clone());
        let mut labels: Vec<(String, String)> = (0..150)
            .map(|i| {
                (
                    format!("feature.node.kubernetes.io/cpu-feature-{i}"),
                    "true".to_owned(),
                )
            })
            .collect();
        labels.extend([
            (
                "feature.node.kubernetes.io/pci-10de.present".to_owned(),
                "true".to_owned(),
            ),
            (
                "feature.node.kubernetes.io/system-os_release.ID".to_owned(),
                "ubuntu".to_owned(),
            ),
            (
                "feature.node.kubernetes.io/cpu-model.vendor_id".to_owned(),
                "AMD".to_owned(),
            ),
            ("topology.kubernetes.io/zone".to_owned(), "a".to_owned()),
            ("nvidia.com/gpu.product".to_owned(), "H100".to_owned()),
        ]);
        let pairs: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let listed = node("1", &pairs);
        let apply = |event: watcher::Event<Node>| {
            let mut interner = interner.lock().unwrap();
            cache.write().apply(&event, &mut interner)
        };
        apply(watcher::Event::Apply(listed.clone()));
        let record = cache.get("gpu-0").unwrap();
        let kept: Vec<&str> = record.labels.each_label().map(|(k, _)| k).collect();
        assert_eq!(
            kept,
            [
                "feature.node.kubernetes.io/pci-10de.present",
                "feature.node.kubernetes.io/system-os_release.ID",
                "nvidia.com/gpu.product",
            ]
        );
        assert!(record.nfd_labels);

        // A label the labeller's record names is kept whatever its key: the labeller may remove it.
        let mut recorded = listed.clone();
        recorded.metadata.annotations = Some(
            [(
                gpuop_api::labels::OWNED_LABELS.to_owned(),
                "topology.kubernetes.io/zone=a,nvidia.com/gpu.present=true".to_owned(),
            )]
            .into(),
        );
        let mut scratch = Interner::default();
        let record = NodeRecord::project(&recorded, &NodeKeys::default(), &mut scratch);
        assert_eq!(record.label("topology.kubernetes.io/zone"), Some("a"));

        let driver: NVIDIADriver = serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": "amd-hosts"},
            "spec": {"nodeSelector": {"feature.node.kubernetes.io/cpu-model.vendor_id": "AMD"}},
        }))
        .unwrap();
        let mut keys = NodeKeys::default();
        keys.extend(driver.spec.effective_node_selector().keys().map(String::as_str));
        let route = |cache: &NodeCache| {
            let nodes = cache.state();
            gpuop_api::route_nodes(nodes.iter().map(|n| (&*n.name, &n.labels)), &[&driver])
                .owner("gpu-0")
                .map(str::to_owned)
        };
        assert_eq!(route(&cache), None, "the record lacks the key");
        assert!(!cache.covers(&keys), "so no decision may use it yet");
        // The watch restarts: a new list, projected with the key.
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(listed));
        assert!(!cache.covers(&keys), "not before the list is complete");
        assert_eq!(apply(watcher::Event::InitDone), Some(NodeEvent::Relisted));
        assert!(cache.covers(&keys));
        assert_eq!(route(&cache).as_deref(), Some("amd-hosts"));
    }

    #[tokio::test]
    async fn caches_stopped_before_they_listed_are_not_ready() {
        // Port 1 on loopback: nothing listens, so no list ever succeeds.
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let shutdown = CancellationToken::new();
        let (caches, _nodes) = Caches::start(
            &client,
            "gpu-operator",
            false,
            &Arc::new(Changes::default()),
            &shutdown,
        );
        shutdown.cancel();
        let ready = tokio::time::timeout(std::time::Duration::from_secs(10), caches.ready())
            .await
            .expect("a stop ends the wait");
        assert!(!ready, "no cache ever listed, so they must not count as synced");
    }

    #[test]
    fn driver_pods_keep_their_digest_and_restarts_and_others_only_their_readiness() {
        let mut interner = Interner::default();
        let driver = PodRecord::project(&pod(gpuop_api::Operand::Driver.info().component), &mut interner);
        let seen = DriverPods::index([&driver], &[], &[]);
        let seen = &seen.by_node["gpu-0"][0].pod;
        assert_eq!(seen.restarts, 12, "the highest restart count");
        assert!(seen.ready_since.is_some());
        assert_eq!(driver.driver_digest(), Some("d1"));
        let plugin = PodRecord::project(&pod("nvidia-device-plugin"), &mut interner);
        assert!(plugin.driver.is_none());
        assert!(plugin.ready_since.is_some(), "readiness stays");
        assert_eq!(plugin.node.as_deref(), driver.node.as_deref());
        assert!(
            Arc::ptr_eq(plugin.node.as_ref().unwrap(), driver.node.as_ref().unwrap()),
            "node names are shared"
        );
    }

    /// A pod's status write that changes nothing kept (a new IP, a container's start time) wakes nobody;
    /// it becoming ready does.
    #[test]
    fn a_pod_event_wakes_the_controllers_only_when_what_is_kept_changed() {
        let mut table = PodTable::default();
        let mut interner = Interner::default();
        let mut plugin = pod("nvidia-device-plugin");
        plugin.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        let policies_only = Some(PodChange::PoliciesOnly);
        assert_eq!(
            table.apply(&watcher::Event::Apply(plugin.clone()), &mut interner),
            policies_only
        );
        plugin.metadata.resource_version = Some("2".into());
        plugin.status.as_mut().unwrap().pod_ip = Some("10.1.0.7".into());
        assert_eq!(
            table.apply(&watcher::Event::Apply(plugin.clone()), &mut interner),
            None
        );
        plugin.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        assert_eq!(
            table.apply(&watcher::Event::Apply(plugin), &mut interner),
            policies_only
        );
        // A driver's pod is the upgrade controller's business too.
        let driver = pod("nvidia-driver");
        assert_eq!(
            table.apply(&watcher::Event::Apply(driver), &mut interner),
            Some(PodChange::UpgradesRead)
        );
    }

    fn refused(code: u16, reason: &str) -> Result<watcher::Event<()>, watcher::Error> {
        Err(watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
            kube::core::Status {
                status: Some(kube::core::response::StatusSummary::Failure),
                code,
                message: format!("refused with {code}"),
                reason: reason.into(),
                details: None,
                metadata: None,
            },
        ))))
    }

    #[test]
    fn a_refused_resource_is_named_with_its_reason_and_an_optional_one_keeps_the_operator_ready() {
        let availability = Availability::default();
        let drivers = availability.track("nvidiadrivers.nvidia.com", false);
        let monitors = availability.track("servicemonitors.monitoring.coreos.com", true);
        let pods = availability.track("pods", false);
        let listed: Result<watcher::Event<()>, watcher::Error> = Ok(watcher::Event::InitDone);
        pods.observe(&listed);
        assert!(
            !settled(&availability.resources()),
            "the driver list has not answered"
        );
        monitors.observe(&refused(404, "NotFound"));
        drivers.observe(&refused(500, "InternalError"));
        assert!(
            !settled(&availability.resources()),
            "a 5xx may pass: the controllers keep waiting for the list"
        );
        drivers.observe(&refused(404, "NotFound"));
        assert!(
            settled(&availability.resources()),
            "the controllers run with what they have"
        );
        assert_eq!(
            availability.readiness(),
            Readiness {
                ready: false,
                body: "nvidiadrivers.nvidia.com: NotFound: refused with 404\n\
                       servicemonitors.monitoring.coreos.com: NotFound (optional: not used)\n"
                    .into(),
            }
        );
        assert_eq!(
            availability.unavailable(false),
            [Unavailable {
                resource: "nvidiadrivers.nvidia.com".into(),
                reason: "NotFound".into(),
                message: "refused with 404".into(),
            }]
        );
        drivers.observe(&listed);
        assert_eq!(
            availability.readiness(),
            Readiness {
                ready: true,
                body: "ok\nservicemonitors.monitoring.coreos.com: NotFound (optional: not used)\n".into(),
            },
            "a missing optional CRD never makes the operator unready"
        );
        pods.observe(&refused(403, ""));
        assert_eq!(
            availability.unavailable(false)[0].reason,
            "Forbidden",
            "a forbidden list after the first one is reported too"
        );
    }

    #[test]
    fn a_policy_that_does_not_decode_keeps_its_metadata_and_names_the_field() {
        let decoded: Decoded<ClusterPolicy> = serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"driver": {"enabled": "yes please"}},
        }))
        .expect("the guard itself decodes");
        let invalid = decoded.0.expect_err("the spec does not decode");
        assert_eq!(invalid.metadata.name.as_deref(), Some("p"));
        assert!(
            invalid
                .error
                .starts_with("spec.driver.enabled: invalid type: string"),
            "{}",
            invalid.error
        );
        let fine: Decoded<ClusterPolicy> = serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "q"}, "spec": {},
        }))
        .unwrap();
        assert!(fine.0.is_ok());
    }
}
