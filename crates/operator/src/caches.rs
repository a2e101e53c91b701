//! The operator's view of the cluster: one reflector per kind it reads, each holding only what the
//! decisions need. Nodes keep their labels, annotations, taints, cordon flag and node info (no images, no
//! managed fields); pods of the operator namespace keep their owner, node and readiness; managed objects of
//! every rendered kind keep only their metadata, with the main resource's managed fields (drift detection,
//! [`crate::drift`]). Every change wakes the policy reconciler.
//!
//! Each resource's access is tracked on its own ([`Availability`]): one the API refuses to list (a missing
//! CRD: `NotFound`; a missing permission: `Forbidden`) is reported by name and reason, in the log, on
//! `/readyz` and in the ClusterPolicy's status, while every other cache syncs and the controllers run with
//! what they have. ClusterPolicies are read through [`Decoded`] (kube's `DeserializeGuard`, with the
//! field's path in the error), so one that does not decode is kept as its metadata and the error instead
//! of failing the whole list.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use gpuop_api::driver::DRIVER_CONFIG_DIGEST;
use gpuop_api::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_api::upgrade::observe::is_driver;
use gpuop_api::{ClusterPolicy, NVIDIADriver};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::de::Error as _;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::apply::MANAGED_KINDS;
use crate::label_queue::NodeEvent;

/// Wakes every controller when a cache changes. Each has its own `Notify`, so that one controller's
/// wake-up is never taken by another.
#[derive(Debug, Default)]
pub struct Changes {
    /// The policy reconciler's.
    pub policies: Notify,
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

/// Every cache the operator reads.
#[derive(Clone, Debug)]
pub struct Caches {
    /// ClusterPolicies, each decoded or, when it does not decode, its metadata and why.
    pub policies: Store<Decoded<ClusterPolicy>>,
    /// NVIDIADrivers.
    pub drivers: Store<NVIDIADriver>,
    /// Nodes, trimmed.
    pub nodes: Store<Node>,
    /// The operator's DaemonSets, whole.
    pub daemonsets: Store<DaemonSet>,
    /// Pods in the operator namespace, trimmed.
    pub pods: Store<Pod>,
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
            availability.track("clusterpolicies.nvidia.com", false),
            changed,
            shutdown,
        );
        let drivers = spawn(
            Api::all(client.clone()),
            watcher::Config::default(),
            |driver: &mut NVIDIADriver| driver.metadata.managed_fields = None,
            availability.track("nvidiadrivers.nvidia.com", false),
            changed,
            shutdown,
        );
        let (node_names, node_events) = mpsc::unbounded_channel();
        let (nodes, node_writer) = reflector::store();
        let node_tracker = availability.track("nodes", false);
        let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(trim_node)
            .reflect(node_writer)
            .inspect(move |item| node_tracker.observe(item))
            .map(move |event| {
                if let Some(event) = event.as_ref().ok().and_then(node_event) {
                    let _ = node_names.send(event);
                }
                event
            });
        run(node_stream, changed, shutdown);
        let daemonsets = spawn(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default().labels(&managed_label),
            |ds: &mut DaemonSet| ds.metadata.managed_fields = None,
            availability.track("daemonsets.apps", false),
            changed,
            shutdown,
        );
        let pods = spawn(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default(),
            trim_pod,
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
            availability.track("controllerrevisions.apps", false),
            changed,
            shutdown,
        );
        let config_maps = spawn(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default(),
            trim_config_map,
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
            let stream = watcher(
                kind.api(client.clone(), namespace),
                watcher::Config::default().labels(&managed_label),
            )
            .default_backoff()
            .modify(|object: &mut DynamicObject| {
                object.data = serde_json::Value::Null;
                crate::drift::trim_managed_fields(&mut object.metadata.managed_fields);
            })
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

fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
    tracker: Tracker,
    changed: &Arc<Changes>,
    shutdown: &CancellationToken,
) -> Store<K>
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
    let stream = watcher(api, config)
        .default_backoff()
        .modify(trim)
        .reflect(writer)
        .inspect(move |item| tracker.observe(item));
    run(stream, changed, shutdown);
    reader
}

fn run<S, T, E>(stream: S, changed: &Arc<Changes>, shutdown: &CancellationToken)
where
    S: futures::Stream<Item = Result<T, E>> + Send + 'static,
    T: Send,
    E: Send,
{
    let changed = changed.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                item = stream.next() => match item {
                    Some(Ok(_)) => changed.notify(),
                    // The tracker logged it, with the resource.
                    Some(Err(_)) => {}
                    None => break,
                },
            }
        }
    });
}

/// What a node watch event tells the labeller, once the reflector has applied it to the store. Objects
/// of a relist are not passed on one by one: the store swaps the whole list in only at `InitDone`, so a
/// node judged before then would be judged against the old store.
pub(crate) fn node_event(event: &watcher::Event<Node>) -> Option<NodeEvent> {
    match event {
        watcher::Event::Apply(node) | watcher::Event::Delete(node) => {
            Some(NodeEvent::Changed(kube::ResourceExt::name_any(node)))
        }
        watcher::Event::InitDone => Some(NodeEvent::Relisted),
        watcher::Event::Init | watcher::Event::InitApply(_) => None,
    }
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

/// Keeps what the labeller, the facts and placement need.
pub(crate) fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.conditions = status
            .conditions
            .take()
            .map(|conditions| conditions.into_iter().filter(|c| c.type_ == "Ready").collect());
    }
}

/// Keeps owner, labels, node and readiness; of driver pods also the highest restart count and
/// `DRIVER_CONFIG_DIGEST` (which tells the upgrade controller whether a new revision needs a reinstall).
fn trim_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{Container, ContainerStatus, EnvVar, PodSpec};
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    // Only driver pods keep a container (the one with the digest) and their restart count: there are a
    // dozen operand pods per GPU node, and an empty container still costs half a kilobyte.
    let driver = is_driver(pod.metadata.labels.as_ref());
    if let Some(spec) = pod.spec.as_mut() {
        let digest: Option<EnvVar> = driver
            .then(|| {
                spec.containers
                    .iter()
                    .flat_map(|c| c.env.iter().flatten())
                    .find(|e| e.name == DRIVER_CONFIG_DIGEST)
                    .cloned()
            })
            .flatten();
        *spec = PodSpec {
            node_name: spec.node_name.take(),
            containers: digest
                .map(|digest| {
                    vec![Container {
                        env: Some(vec![digest]),
                        ..Container::default()
                    }]
                })
                .unwrap_or_default(),
            ..PodSpec::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        let restarts = status
            .container_statuses
            .iter()
            .flatten()
            .map(|s| s.restart_count)
            .max()
            .filter(|_| driver);
        status.container_statuses = restarts.map(|restart_count| {
            vec![ContainerStatus {
                restart_count,
                ..ContainerStatus::default()
            }]
        });
        status.init_container_statuses = None;
        status.pod_ips = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::upgrade::observe::DriverPods;

    fn pod(component: &str) -> Pod {
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

    /// A relist (after a watch expired) in which a node changed: the labeller hears of it only once the
    /// store holds the new list, and then of every node, so that nothing is judged against the old store.
    #[test]
    fn the_labeller_hears_of_a_relist_once_the_store_holds_the_new_list() {
        let node = |version: &str, labels: &[(&str, &str)]| -> Node {
            let mut node = Node::default();
            node.metadata.name = Some("gpu-0".into());
            node.metadata.resource_version = Some(version.into());
            node.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
            node
        };
        let (store, mut writer) = reflector::store::<Node>();
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
            writer.apply_watcher_event(event);
            if let Some(told) = node_event(event) {
                let stored = store.get(&reflector::ObjectRef::new("gpu-0")).expect("stored");
                heard.push((told, stored.metadata.resource_version.clone()));
            }
        }
        assert_eq!(
            heard,
            [
                (NodeEvent::Changed("gpu-0".into()), Some("1".into())),
                (NodeEvent::Relisted, Some("5".into())),
            ]
        );
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
        let mut driver = pod(gpuop_api::Operand::Driver.info().component);
        trim_pod(&mut driver);
        let seen = DriverPods::index([&driver], &[], &[]);
        let seen = &seen.by_node["gpu-0"][0].pod;
        assert_eq!(seen.restarts, 12, "the highest restart count");
        assert!(seen.ready_since.is_some());
        assert_eq!(
            driver.spec.as_ref().unwrap().containers[0].env.as_ref().unwrap()[0]
                .value
                .as_deref(),
            Some("d1")
        );
        let mut plugin = pod("nvidia-device-plugin");
        trim_pod(&mut plugin);
        assert!(plugin.spec.as_ref().unwrap().containers.is_empty());
        assert!(plugin.status.as_ref().unwrap().container_statuses.is_none());
        assert!(
            plugin.status.as_ref().unwrap().conditions.is_some(),
            "readiness stays"
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
