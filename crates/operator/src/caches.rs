//! The operator's view of the cluster: one reflector per kind it reads, each holding only what the
//! decisions need. Nodes keep their labels, annotations, taints, cordon flag and node info (no images, no
//! managed fields); pods of the operator namespace keep their owner, node and readiness; managed objects of
//! every other kind keep only their metadata. Every change wakes the policy reconciler.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use gpuop_api::driver::DRIVER_CONFIG_DIGEST;
use gpuop_api::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_api::upgrade::observe::is_driver;
use gpuop_api::{ClusterPolicy, NVIDIADriver};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DynamicObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
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
    /// ClusterPolicies.
    pub policies: Store<ClusterPolicy>,
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
    /// Managed objects of every rendered kind, metadata only, by kind.
    pub managed: BTreeMap<&'static str, Store<DynamicObject>>,
    /// True once every store has listed.
    synced: watch::Receiver<bool>,
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
        let policies = spawn(
            Api::all(client.clone()),
            watcher::Config::default(),
            |_| {},
            changed,
            shutdown,
        );
        let drivers = spawn(
            Api::all(client.clone()),
            watcher::Config::default(),
            |driver: &mut NVIDIADriver| driver.metadata.managed_fields = None,
            changed,
            shutdown,
        );
        let (node_names, node_events) = mpsc::unbounded_channel();
        let (nodes, node_writer) = reflector::store();
        let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(trim_node)
            .reflect(node_writer)
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
            changed,
            shutdown,
        );
        let pods = spawn(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default(),
            trim_pod,
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
            let stream = watcher(
                kind.api(client.clone(), namespace),
                watcher::Config::default().labels(&managed_label),
            )
            .default_backoff()
            .modify(|object: &mut DynamicObject| {
                object.data = serde_json::Value::Null;
                object.metadata.managed_fields = None;
            })
            .reflect(writer);
            run(stream, changed, shutdown);
            managed.insert(kind.kind, reader);
        }
        let (synced_sender, synced) = watch::channel(false);
        let caches = Self {
            policies,
            drivers,
            nodes,
            daemonsets,
            pods,
            revisions,
            managed,
            synced,
        };
        caches.signal_when_synced(synced_sender);
        (caches, node_events)
    }

    /// Waits until every cache has listed once, and says whether they did: `false` when the caches were
    /// stopped first (shutdown before the API server ever answered), so that nothing acts, or claims to be
    /// ready, on stores that never listed. Any number of tasks may wait.
    pub async fn ready(&self) -> bool {
        let mut synced = self.synced.clone();
        synced.wait_for(|synced| *synced).await.is_ok()
    }

    /// Signals `synced` once every store has listed. kube's `Store::wait_until_ready` wakes only the last
    /// of several concurrent waiters, so exactly one task waits on the stores and the rest on the signal.
    fn signal_when_synced(&self, synced: watch::Sender<bool>) {
        let stores = self.clone();
        // A store whose reflector stopped before listing (shutdown) answers with an error: then `synced` is
        // dropped unset, which tells every waiter the caches never synced.
        tokio::spawn(async move {
            let listed = async {
                stores.policies.wait_until_ready().await?;
                stores.drivers.wait_until_ready().await?;
                stores.nodes.wait_until_ready().await?;
                stores.daemonsets.wait_until_ready().await?;
                stores.pods.wait_until_ready().await?;
                stores.revisions.wait_until_ready().await?;
                for store in stores.managed.values() {
                    store.wait_until_ready().await?;
                }
                Ok::<(), kube::runtime::reflector::store::WriterDropped>(())
            };
            if listed.await.is_ok() {
                synced.send_replace(true);
            }
        });
    }
}

fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: impl FnMut(&mut K) + Send + 'static,
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
        .reflect(writer);
    run(stream, changed, shutdown);
    reader
}

fn run<S, T, E>(stream: S, changed: &Arc<Changes>, shutdown: &CancellationToken)
where
    S: futures::Stream<Item = Result<T, E>> + Send + 'static,
    T: Send,
    E: std::fmt::Display + Send,
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
                    Some(Err(error)) => tracing::warn!(%error, "watch failed; retrying with back-off"),
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
}
