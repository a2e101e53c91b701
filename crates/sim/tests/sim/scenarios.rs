//! Scenario tests: the simulator's actors (DaemonSet controller, scheduler, kubelets) on an in-process fake
//! API server, driven by hand-written DaemonSets shaped like the operator's (an `app` label, a
//! `nvidia.com/gpu.deploy.<operand>=true` node selector, the `nvidia.com/gpu` toleration, init containers
//! that wait for status files) and by the events and faults of a scenario timeline.
//!
//! Every assertion is on what a user would see through the API (pods, DaemonSet status, node labels and
//! resources), plus the simulated host where the point is that the API does not show it. Waits are
//! failure guards with a generous limit, never timings.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use gpuop_api::Operand;
use gpuop_api::labels::{GPU_PRODUCT, MIG_CONFIG, MIG_CONFIG_STATE, RESOURCE_GPU, VALIDATIONS_DIR};
use gpuop_fakeserver::FakeServer;
use gpuop_sim::cluster_spec::{ClusterSpec, GpuSpec, NodePool, TaintSpec};
use gpuop_sim::daemonset::is_ready;
use gpuop_sim::hardware::GpuModel;
use gpuop_sim::heartbeat::{Heartbeats, LEASE_NAMESPACE};
use gpuop_sim::kubelet::Timing;
use gpuop_sim::scenario::{Action, DriverInstallFault, Scenario};
use gpuop_sim::simulation::{Plays, Simulation};
use gpuop_testkit::fixture;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerStatus, EnvVar, Namespace, Node, Pod, PodSpec,
    ResourceRequirements, Toleration, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Where the operand DaemonSets go, as the operator deploys them.
const OPERATORS: &str = "gpu-operator";
/// Where workload pods go.
const WORKLOADS: &str = "ml";
/// How long a wait lasts before the test fails: a guard against hanging, not a measure of speed.
const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` until it succeeds; fails the test with what it saw last once [`PATIENCE`] is spent.
pub(crate) async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen = match check().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < deadline,
            "{what}: still not so after {PATIENCE:?}; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------------
// Fixtures: node pools, operand DaemonSets, workloads.

/// A node pool of the simulated cluster.
struct Pool(NodePool);

impl Pool {
    /// `count` nodes with `gpus` GPUs of `model` each, no driver on the host.
    fn gpu(name: &str, count: u32, model: GpuModel, gpus: u32) -> Self {
        Self(NodePool {
            name: name.to_owned(),
            count,
            gpu: Some(GpuSpec { model, count: gpus }),
            os: "ubuntu-22.04".to_owned(),
            kernel: "5.15.0-105-generic".to_owned(),
            runtime: "containerd-1.7".to_owned(),
            driver_preinstalled: false,
            taints: Vec::new(),
            labels: BTreeMap::new(),
            cpu: 64,
            memory_gib: 512,
        })
    }

    /// `count` H100 nodes with 8 GPUs each.
    fn h100(name: &str, count: u32) -> Self {
        Self::gpu(name, count, GpuModel::H100_80GB, 8)
    }

    /// A CPU-only node.
    fn cpu(name: &str) -> Self {
        let mut pool = Self::h100(name, 1);
        pool.0.gpu = None;
        pool
    }

    /// The NVIDIA driver is installed on the hosts.
    fn with_host_driver(mut self) -> Self {
        self.0.driver_preinstalled = true;
        self
    }

    /// Sets `nvidia.com/gpu.deploy.<operand>=true` for each operand, as the operator's labeller would.
    fn deploying(mut self, operands: &[Operand]) -> Self {
        for operand in operands {
            self.0
                .labels
                .insert(operand.info().deploy_label.to_owned(), "true".to_owned());
        }
        self
    }

    fn with_label(mut self, key: &str, value: &str) -> Self {
        self.0.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    fn with_taint(mut self, key: &str, effect: &str) -> Self {
        self.0.taints.push(TaintSpec {
            key: key.to_owned(),
            value: None,
            effect: effect.to_owned(),
        });
        self
    }
}

/// A DaemonSet of one operand, shaped as the operator renders it.
struct OperandSet {
    operand: Operand,
    image: String,
    inits: Vec<Container>,
    env: Vec<EnvVar>,
    volumes: Vec<Volume>,
}

impl OperandSet {
    fn of(operand: Operand) -> Self {
        let image = match operand {
            Operand::Driver => "nvcr.io/nvidia/driver:570.124.06-ubuntu22.04".to_owned(),
            other => format!("nvcr.io/nvidia/{}:v1", other.id()),
        };
        Self {
            operand,
            image,
            inits: Vec::new(),
            env: Vec::new(),
            volumes: Vec::new(),
        }
    }

    /// The DaemonSet's name, which is also its pods' `app` label.
    fn name(&self) -> &'static str {
        self.operand.info().daemonset
    }

    /// An init container that loops until `/run/nvidia/validations/<file>` exists, as NVIDIA's do.
    fn waiting_for(mut self, file: &str) -> Self {
        self.inits.push(Container {
            name: format!("wait-for-{}", file.trim_start_matches('.')),
            image: Some(self.image.clone()),
            command: Some(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                format!("until [ -f {VALIDATIONS_DIR}/{file} ]; do echo waiting for {file}; sleep 5; done"),
            ]),
            ..Container::default()
        });
        self
    }

    /// An init container running the validator's step for `component` (`COMPONENT`, `WITH_WAIT`).
    fn validating(mut self, component: &str, wait: bool) -> Self {
        let env = [
            ("COMPONENT", component),
            ("WITH_WAIT", if wait { "true" } else { "false" }),
        ];
        self.inits.push(Container {
            name: format!("{component}-validation"),
            image: Some(self.image.clone()),
            command: Some(vec!["nvidia-validator".to_owned()]),
            env: Some(env.iter().map(|(name, value)| env_var(name, value)).collect()),
            ..Container::default()
        });
        self
    }

    fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push(env_var(name, value));
        self
    }

    /// Mounts a ConfigMap, as the MIG manager mounts its mig-parted configuration.
    fn mounting(mut self, config_map: &str) -> Self {
        self.volumes.push(Volume {
            name: config_map.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map.to_owned(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        self
    }

    /// A pod of the DaemonSet bound to `node`, as a real cluster's DaemonSet controller makes it.
    fn pod_on(self, node: &str) -> Pod {
        let daemonset = self.build();
        let template = daemonset.spec.expect("a spec").template;
        let mut spec = template.spec.expect("a pod spec");
        spec.node_name = Some(node.to_owned());
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("{}-{node}", daemonset.metadata.name.unwrap_or_default())),
                namespace: Some(OPERATORS.to_owned()),
                ..template.metadata.unwrap_or_default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    fn build(self) -> DaemonSet {
        let info = self.operand.info();
        let mut daemonset = fixture::daemonset(info.daemonset)
            .namespace(OPERATORS)
            .selecting(&[("app", info.daemonset)])
            .node_selector(&[(info.deploy_label, "true")])
            .container(info.id, &self.image)
            .build();
        let template = daemonset.spec.as_mut().and_then(|s| s.template.spec.as_mut());
        let spec = template.expect("the builder set a pod spec");
        spec.tolerations = Some(vec![Toleration {
            key: Some(RESOURCE_GPU.to_owned()),
            operator: Some("Exists".to_owned()),
            effect: Some("NoSchedule".to_owned()),
            ..Toleration::default()
        }]);
        spec.priority_class_name = Some("system-node-critical".to_owned());
        spec.init_containers = (!self.inits.is_empty()).then_some(self.inits);
        spec.containers[0].env = (!self.env.is_empty()).then_some(self.env);
        spec.volumes = (!self.volumes.is_empty()).then_some(self.volumes);
        daemonset
    }
}

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..EnvVar::default()
    }
}

/// A workload pod (no node named) that asks for `gpus` GPUs.
fn workload(name: &str, gpus: u32) -> Pod {
    let gpus = BTreeMap::from([(RESOURCE_GPU.to_owned(), Quantity(gpus.to_string()))]);
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(WORKLOADS.to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), "training".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "train".to_owned(),
                image: Some("nvcr.io/nvidia/pytorch:25.01-py3".to_owned()),
                resources: Some(ResourceRequirements {
                    limits: Some(gpus),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The mig-parted configuration the MIG manager mounts: a layout an A100 holds and one it cannot.
const MIG_PARTED_CONFIG: &str = include_str!("../testdata/mig-parted-config.yaml");

// ---------------------------------------------------------------------------------------------------
// The cluster under test and what a user reads from it.

/// A fake API server with a simulated cluster on it; the test's own requests are made as a separate
/// client from the simulator's.
struct Cluster {
    client: Client,
    sim: Simulation,
}

impl Cluster {
    async fn start(pools: impl IntoIterator<Item = Pool>) -> Self {
        Self::start_playing(pools, Plays::Cluster).await
    }

    /// `count` H100 nodes, `h100-0` on, whose hosts have their driver, with `operands` switched on.
    async fn h100s(count: u32, operands: &[Operand]) -> Self {
        Self::start([Pool::h100("h100", count).with_host_driver().deploying(operands)]).await
    }

    async fn start_playing(pools: impl IntoIterator<Item = Pool>, plays: Plays) -> Self {
        Self::start_with(pools, plays, Timing::instant()).await
    }

    async fn start_with(pools: impl IntoIterator<Item = Pool>, plays: Plays, timing: Timing) -> Self {
        let server = FakeServer::new();
        let client = server.client_as("scenario-test");
        for name in [OPERATORS, WORKLOADS] {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &namespace)
                .await
                .expect("namespace created");
        }
        let spec = ClusterSpec {
            nfd: true,
            node_pools: pools.into_iter().map(|pool| pool.0).collect(),
            workloads: Vec::new(),
        };
        spec.check().expect("a valid cluster spec");
        let sim = Simulation::start_playing(server.client_as(gpuop_sim::USER_AGENT), spec, timing, plays)
            .await
            .expect("the simulation starts");
        Self { client, sim }
    }

    async fn act(&self, action: Action) {
        self.sim
            .apply(&action)
            .await
            .unwrap_or_else(|error| panic!("{action:?}: {error}"));
    }

    async fn create<K>(&self, object: &K) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + Serialize
            + DeserializeOwned,
    {
        let namespace = object.namespace().expect("a namespaced object");
        Api::<K>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), object)
            .await
            .unwrap_or_else(|error| panic!("create {}: {error}", object.name_any()))
    }

    async fn deploy(&self, set: OperandSet) {
        self.create(&set.build()).await;
    }

    async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .unwrap_or_else(|error| panic!("get node {name}: {error}"))
    }

    async fn pods(&self, app: &str) -> Vec<Pod> {
        let selected = ListParams::default().labels(&format!("app={app}"));
        crate::pods::listed(&self.client, OPERATORS, &selected).await
    }

    /// The pod of a DaemonSet on a node, or what there is instead.
    async fn pod_on(&self, app: &str, node: &str) -> Result<Pod, String> {
        let pods = self.pods(app).await;
        let mut on_node = pods.iter().filter(|pod| node_of(pod) == Some(node));
        match (on_node.next(), on_node.next()) {
            (Some(pod), None) => Ok(pod.clone()),
            (None, _) => Err(format!("no {app} pod on {node}; pods: {}", summary(&pods))),
            (Some(_), Some(_)) => Err(format!("several {app} pods on {node}: {}", summary(&pods))),
        }
    }

    /// Waits until the DaemonSet's pod on `node` is Running and Ready.
    async fn ready_pod(&self, app: &str, node: &str) -> Pod {
        eventually(&format!("{app} ready on {node}"), async || {
            let pod = self.pod_on(app, node).await?;
            if is_ready(&pod) {
                Ok(pod)
            } else {
                Err(describe(&pod))
            }
        })
        .await
    }

    async fn workload(&self, name: &str) -> Pod {
        Api::<Pod>::namespaced(self.client.clone(), WORKLOADS)
            .get(name)
            .await
            .unwrap_or_else(|error| panic!("get pod {name}: {error}"))
    }

    async fn daemonset(&self, name: &str) -> DaemonSetStatus {
        Api::<DaemonSet>::namespaced(self.client.clone(), OPERATORS)
            .get_status(name)
            .await
            .unwrap_or_else(|error| panic!("get DaemonSet {name}: {error}"))
            .status
            .unwrap_or_default()
    }

    /// Waits until the DaemonSet's status says its pods are ready on exactly `nodes` nodes, the way
    /// `kubectl rollout status` and the operator judge it (nothing unavailable, all updated).
    async fn rolled_out(&self, name: &str, nodes: i32) -> DaemonSetStatus {
        eventually(
            &format!("DaemonSet {name} rolled out to {nodes} nodes"),
            async || {
                let status = self.daemonset(name).await;
                let done = status.desired_number_scheduled == nodes
                    && status.current_number_scheduled == nodes
                    && status.number_ready == nodes
                    && status.number_available.unwrap_or(0) == nodes
                    && status.number_unavailable.unwrap_or(0) == 0
                    && status.updated_number_scheduled.unwrap_or(0) == nodes;
                if done {
                    Ok(status)
                } else {
                    Err(format!("{status:?}"))
                }
            },
        )
        .await
    }

    /// Waits until the node's allocatable `resource` is `count`.
    async fn allocatable_becomes(&self, node: &str, resource: &str, count: u64) -> Node {
        eventually(&format!("{node} allocatable {resource}={count}"), async || {
            let found = self.node(node).await;
            match allocatable(&found, resource) {
                Some(n) if n == count => Ok(found),
                other => Err(format!("{resource}: {other:?}")),
            }
        })
        .await
    }

    /// Asserts that the node shows no `nvidia.com/gpu` at all, as a node where no device plugin has ever
    /// registered does.
    async fn advertises_no_gpu(&self, name: &str) {
        let node = self.node(name).await;
        let resources = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        assert_eq!(
            allocatable(&node, RESOURCE_GPU),
            None,
            "{name} advertises {resources:?}"
        );
    }

    async fn stop(self) {
        self.sim.stop().await;
    }
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("(no status)")
}

fn main_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

/// The status of the pod's init container at `index`, in the order they run.
fn init_container(pod: &Pod, index: usize) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.init_container_statuses.as_ref()?.get(index)
}

fn waiting_reason(status: &ContainerStatus) -> Option<&str> {
    status.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

fn last_exit_message(status: &ContainerStatus) -> Option<&str> {
    status
        .last_state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .as_deref()
}

/// A pod as `kubectl get pods` would show it, for failure messages.
fn describe(pod: &Pod) -> String {
    let containers: Vec<String> = pod
        .status
        .iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .map(|c| {
            let state = c.state.as_ref();
            let what = if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
                waiting.reason.clone().unwrap_or_default()
            } else if state.and_then(|s| s.running.as_ref()).is_some() {
                "Running".to_owned()
            } else if let Some(done) = state.and_then(|s| s.terminated.as_ref()) {
                done.reason.clone().unwrap_or_default()
            } else {
                "?".to_owned()
            };
            format!("{}={what}/restarts={}", c.name, c.restart_count)
        })
        .collect();
    format!(
        "{} on {}: {}{} [{}]",
        pod.name_any(),
        node_of(pod).unwrap_or("-"),
        phase(pod),
        if is_ready(pod) { "/Ready" } else { "" },
        containers.join(", ")
    )
}

fn summary(pods: &[Pod]) -> String {
    let described: Vec<String> = pods.iter().map(describe).collect();
    format!("[{}]", described.join("; "))
}

fn allocatable(node: &Node, resource: &str) -> Option<u64> {
    node.status
        .as_ref()?
        .allocatable
        .as_ref()?
        .get(resource)?
        .0
        .parse()
        .ok()
}

fn capacity(node: &Node, resource: &str) -> Option<u64> {
    node.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get(resource)?
        .0
        .parse()
        .ok()
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.labels().get(key).map(String::as_str)
}

fn set_label(node: &str, key: &str, value: Option<&str>) -> Action {
    Action::Label {
        node: node.to_owned(),
        key: key.to_owned(),
        value: value.map(str::to_owned),
    }
}

fn taint(node: &str, key: &str, effect: &str) -> Action {
    Action::Taint {
        node: node.to_owned(),
        key: key.to_owned(),
        value: None,
        effect: effect.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------------
// Placement: deploy labels, taints, joining nodes.

#[tokio::test]
async fn a_node_with_the_driver_switched_off_gets_no_driver_pod() {
    let driver_label = Operand::Driver.info().deploy_label;
    let cluster = Cluster::start([
        Pool::h100("h100", 1).deploying(&[Operand::Driver]),
        Pool::h100("host-driver", 1)
            .with_host_driver()
            .deploying(&[Operand::Driver])
            .with_label(driver_label, "false"),
    ])
    .await;
    let driver = OperandSet::of(Operand::Driver);
    let app = driver.name();
    cluster.deploy(driver).await;

    let status = cluster.rolled_out(app, 1).await;
    assert_eq!(status.number_misscheduled, 0);
    let pods = cluster.pods(app).await;
    assert_eq!(pods.len(), 1, "exactly one driver pod: {}", summary(&pods));
    assert_eq!(node_of(&pods[0]), Some("h100-0"));
    // The kubelet updates the host at the end of the pass that reported the pod ready.
    let loaded = eventually("the driver container loads its driver", async || {
        let host = cluster.sim.host("h100-0").unwrap();
        host.loaded_driver.ok_or_else(|| "no driver loaded".to_owned())
    })
    .await;
    assert_eq!(loaded, "570.124.06", "the version of the image's tag");
    assert_eq!(cluster.sim.host("host-driver-0").unwrap().loaded_driver, None);
    cluster.stop().await;
}

#[tokio::test]
async fn removing_a_deploy_label_deletes_the_pod_and_adding_it_back_recreates_it() {
    let plugin_label = Operand::DevicePlugin.info().deploy_label;
    let cluster = Cluster::h100s(1, &[Operand::DevicePlugin]).await;
    let plugin = OperandSet::of(Operand::DevicePlugin);
    let app = plugin.name();
    cluster.deploy(plugin).await;
    let first = cluster.ready_pod(app, "h100-0").await;
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 8).await;

    cluster.act(set_label("h100-0", plugin_label, None)).await;
    eventually("the device plugin pod deleted", async || {
        let pods = cluster.pods(app).await;
        if pods.is_empty() {
            Ok(())
        } else {
            Err(summary(&pods))
        }
    })
    .await;
    cluster.rolled_out(app, 0).await;
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 0).await;

    cluster.act(set_label("h100-0", plugin_label, Some("true"))).await;
    let second = cluster.ready_pod(app, "h100-0").await;
    assert_ne!(first.uid(), second.uid(), "a new pod, not the old one");
    cluster.rolled_out(app, 1).await;
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 8).await;
    cluster.stop().await;
}

#[tokio::test]
async fn a_tainted_node_drops_out_of_desired_number_scheduled() {
    let discovery = [Operand::GpuFeatureDiscovery];
    let cluster = Cluster::start([
        Pool::h100("h100", 2).with_host_driver().deploying(&discovery),
        Pool::h100("gpu-tainted", 1)
            .with_host_driver()
            .deploying(&discovery)
            .with_taint(RESOURCE_GPU, "NoSchedule"),
        Pool::h100("reserved", 1)
            .with_host_driver()
            .deploying(&discovery)
            .with_taint("dedicated", "NoSchedule"),
    ])
    .await;
    let set = OperandSet::of(Operand::GpuFeatureDiscovery);
    let app = set.name();
    cluster.deploy(set).await;

    // The DaemonSet tolerates nvidia.com/gpu and nothing else.
    cluster.rolled_out(app, 3).await;
    let pods = cluster.pods(app).await;
    let mut nodes: Vec<&str> = pods.iter().filter_map(node_of).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["gpu-tainted-0", "h100-0", "h100-1"]);
    let running = cluster.ready_pod(app, "h100-1").await;

    // A NoSchedule taint added later stops new pods; the real controller leaves the running one where it
    // is and counts it as misscheduled.
    cluster.act(taint("h100-1", "dedicated", "NoSchedule")).await;
    let status = cluster.rolled_out(app, 2).await;
    assert_eq!(status.number_misscheduled, 1, "{status:?}");
    let still = cluster
        .pod_on(app, "h100-1")
        .await
        .expect("NoSchedule evicts nothing");
    assert_eq!(still.uid(), running.uid());

    // A NoExecute taint it does not tolerate evicts it.
    cluster.act(taint("h100-1", "maintenance", "NoExecute")).await;
    eventually("the pod on the NoExecute-tainted node goes", async || {
        let status = cluster.daemonset(app).await;
        match cluster.pod_on(app, "h100-1").await {
            Err(_) if status.number_misscheduled == 0 => Ok(()),
            Err(_) => Err(format!("{status:?}")),
            Ok(pod) => Err(describe(&pod)),
        }
    })
    .await;
    cluster.rolled_out(app, 2).await;
    cluster.stop().await;
}

#[tokio::test]
async fn a_joining_node_gets_its_pods_and_a_leaving_one_takes_them_along() {
    let cluster = Cluster::h100s(1, &[Operand::DevicePlugin, Operand::GpuFeatureDiscovery]).await;
    for operand in [Operand::DevicePlugin, Operand::GpuFeatureDiscovery] {
        cluster.deploy(OperandSet::of(operand)).await;
    }
    cluster.rolled_out("nvidia-device-plugin-daemonset", 1).await;
    cluster.rolled_out("gpu-feature-discovery", 1).await;

    cluster
        .act(Action::NodeJoins {
            pool: "h100".to_owned(),
            count: 2,
        })
        .await;
    for app in ["nvidia-device-plugin-daemonset", "gpu-feature-discovery"] {
        cluster.rolled_out(app, 3).await;
        for node in ["h100-1", "h100-2"] {
            cluster.ready_pod(app, node).await;
        }
    }
    for node in ["h100-1", "h100-2"] {
        let joined = cluster.allocatable_becomes(node, RESOURCE_GPU, 8).await;
        let product = eventually(&format!("feature discovery labels {node}"), async || {
            let found = cluster.node(node).await;
            label(&found, GPU_PRODUCT)
                .map(str::to_owned)
                .ok_or_else(|| format!("labels: {:?}", found.labels()))
        })
        .await;
        assert_eq!(product, "NVIDIA-H100-80GB-HBM3");
        assert_eq!(
            label(&joined, "feature.node.kubernetes.io/pci-10de.present"),
            Some("true"),
            "NFD labelled the new node"
        );
    }

    // A node that leaves takes its pods with it.
    cluster.act(Action::NodeLeaves("h100-1".to_owned())).await;
    for app in ["nvidia-device-plugin-daemonset", "gpu-feature-discovery"] {
        cluster.rolled_out(app, 2).await;
        eventually(&format!("{app} gone from h100-1"), async || {
            let pods = cluster.pods(app).await;
            let left = pods.iter().any(|pod| node_of(pod) == Some("h100-1"));
            if left { Err(summary(&pods)) } else { Ok(()) }
        })
        .await;
    }
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// The node contract: status files, the order of the chain, the silent failure.

#[tokio::test]
async fn a_device_plugin_without_the_toolkit_advertises_gpus_the_runtime_cannot_give() {
    // A person labels a node for the device plugin only; the plugin's DaemonSet does not wait for the
    // toolkit. The host has its driver, so the plugin finds the GPUs and advertises them.
    let cluster = Cluster::start([Pool::gpu("l4", 1, GpuModel::L4, 4)
        .with_host_driver()
        .deploying(&[Operand::DevicePlugin])])
    .await;
    let plugin = OperandSet::of(Operand::DevicePlugin);
    let app = plugin.name();
    cluster.deploy(plugin).await;
    cluster.ready_pod(app, "l4-0").await;
    cluster.allocatable_becomes("l4-0", RESOURCE_GPU, 4).await;

    let host = cluster.sim.host("l4-0").unwrap();
    assert!(
        !host.runtime_wired,
        "no toolkit ran: the runtime cannot inject GPUs"
    );
    assert!(!host.has_file("toolkit-ready"));

    // So GPU pods are scheduled there and start, without a GPU inside.
    cluster.create(&workload("train", 2)).await;
    let pod = running(&cluster, "train").await;
    assert_eq!(node_of(&pod), Some("l4-0"));
    cluster.stop().await;
}

#[tokio::test]
async fn a_device_plugin_on_a_node_without_a_driver_crash_loops_and_advertises_nothing() {
    let cluster = Cluster::start([Pool::h100("h100", 1).deploying(&[Operand::DevicePlugin])]).await;
    let plugin = OperandSet::of(Operand::DevicePlugin);
    let app = plugin.name();
    cluster.deploy(plugin).await;
    let pod = eventually("the device plugin restarts", async || {
        let pod = cluster.pod_on(app, "h100-0").await?;
        match main_container(&pod) {
            Some(main) if main.restart_count >= 2 => Ok(pod),
            _ => Err(describe(&pod)),
        }
    })
    .await;
    let main = main_container(&pod).unwrap();
    assert_eq!(
        waiting_reason(main),
        Some("CrashLoopBackOff"),
        "{}",
        describe(&pod)
    );
    assert!(
        last_exit_message(main).is_some_and(|m| m.contains("failed to initialize NVML")),
        "{main:?}"
    );
    assert!(!is_ready(&pod));
    cluster.advertises_no_gpu("h100-0").await;
    cluster.stop().await;
}

#[tokio::test]
async fn the_chain_comes_up_in_order_through_the_status_files() {
    let everything = [
        Operand::ContainerToolkit,
        Operand::OperatorValidator,
        Operand::DevicePlugin,
    ];
    let cluster = Cluster::start([Pool::gpu("l4", 1, GpuModel::L4, 4)
        .with_host_driver()
        .deploying(&everything)])
    .await;
    let plugin = OperandSet::of(Operand::DevicePlugin).waiting_for("toolkit-ready");
    let plugin_app = plugin.name();
    let validator = OperandSet::of(Operand::OperatorValidator)
        .validating("driver", true)
        .validating("toolkit", false)
        .validating("cuda", false)
        .validating("plugin", false);
    let validator_app = validator.name();
    cluster.deploy(plugin).await;
    cluster.deploy(validator).await;

    // Without the toolkit the plugin waits in Init and the node advertises no GPU; the validator has
    // proved the host driver and keeps failing its toolkit step.
    let waiting = eventually("the device plugin waits for toolkit-ready", async || {
        let pod = cluster.pod_on(plugin_app, "l4-0").await?;
        let init = init_container(&pod, 0);
        let looping = init.is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        if looping { Ok(pod) } else { Err(describe(&pod)) }
    })
    .await;
    assert_eq!(phase(&waiting), "Pending");
    cluster.advertises_no_gpu("l4-0").await;
    let validator_pod = eventually("the validator's toolkit step fails", async || {
        let pod = cluster.pod_on(validator_app, "l4-0").await?;
        let toolkit_step = init_container(&pod, 1).filter(|c| c.restart_count >= 1);
        match toolkit_step {
            Some(_) => Ok(pod),
            None => Err(describe(&pod)),
        }
    })
    .await;
    assert!(!is_ready(&validator_pod));
    let host = cluster.sim.host("l4-0").unwrap();
    assert!(host.has_file("driver-ready") && !host.has_file("toolkit-ready"));

    // The toolkit wires the runtime; the validator proves it, the plugin starts, the validator proves the
    // plugin too.
    cluster
        .deploy(OperandSet::of(Operand::ContainerToolkit).validating("driver", true))
        .await;
    for app in ["nvidia-container-toolkit-daemonset", plugin_app, validator_app] {
        cluster.ready_pod(app, "l4-0").await;
    }
    cluster.allocatable_becomes("l4-0", RESOURCE_GPU, 4).await;
    let host = cluster.sim.host("l4-0").unwrap();
    assert!(host.runtime_wired);
    for file in ["driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"] {
        assert!(host.has_file(file), "{file}: {:?}", host.validations);
    }
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// Faults of the timeline.

#[tokio::test]
async fn a_driver_that_fails_to_install_crash_loops() {
    let cluster = Cluster::start([Pool::h100("h100", 2).deploying(&[Operand::Driver])]).await;
    cluster
        .act(Action::DriverInstallFails(DriverInstallFault::on("h100-1")))
        .await;
    let driver = OperandSet::of(Operand::Driver);
    let app = driver.name();
    cluster.deploy(driver).await;

    cluster.ready_pod(app, "h100-0").await;
    let restarted = async |more_than: i32| {
        eventually("the driver on h100-1 restarts", async || {
            let pod = cluster.pod_on(app, "h100-1").await?;
            match main_container(&pod) {
                Some(main) if main.restart_count > more_than => Ok(pod),
                _ => Err(describe(&pod)),
            }
        })
        .await
    };
    let first = restarted(0).await;
    let failing = restarted(main_container(&first).unwrap().restart_count).await;
    // The kubelet waits out its back-off between restarts, as `kubectl describe` shows in the exit times.
    let exited = |pod: &Pod| {
        let main = main_container(pod).unwrap();
        let at = gpuop_sim::kubelet::last_finished(main)?;
        Some((main.restart_count, at))
    };
    let ((before, first_exit), (after, last_exit)) = (exited(&first).unwrap(), exited(&failing).unwrap());
    let apart = last_exit.duration_since(first_exit).as_secs();
    assert!(
        apart >= i64::from(after - before),
        "{} restarts within {apart} s",
        after - before
    );
    let main = main_container(&failing).unwrap();
    assert!(!is_ready(&failing));
    assert_eq!(waiting_reason(main), Some("CrashLoopBackOff"));
    assert!(
        last_exit_message(main).is_some_and(|m| m.contains("failed to install the NVIDIA driver")),
        "{main:?}"
    );
    let status = eventually("the DaemonSet counts one unavailable", async || {
        let status = cluster.daemonset(app).await;
        if status.number_ready == 1 && status.number_unavailable == Some(1) {
            Ok(status)
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await;
    assert_eq!(status.desired_number_scheduled, 2);
    assert_eq!(cluster.sim.host("h100-1").unwrap().loaded_driver, None);
    cluster.stop().await;
}

#[tokio::test]
async fn an_xid_error_takes_one_gpu_out_of_allocatable() {
    let cluster = Cluster::h100s(1, &[Operand::DevicePlugin]).await;
    cluster.deploy(OperandSet::of(Operand::DevicePlugin)).await;
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 8).await;

    cluster
        .act(Action::Xid {
            node: "h100-0".to_owned(),
            gpu: 3,
            code: 79,
        })
        .await;
    let node = cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 7).await;
    assert_eq!(
        capacity(&node, RESOURCE_GPU),
        Some(8),
        "the kubelet keeps the unhealthy GPU in capacity"
    );
    cluster.stop().await;
}

#[tokio::test]
async fn a_crash_looping_operand_stops_being_ready() {
    let cluster = Cluster::h100s(2, &[Operand::GpuFeatureDiscovery]).await;
    let discovery = OperandSet::of(Operand::GpuFeatureDiscovery);
    let app = discovery.name();
    cluster.deploy(discovery).await;
    cluster.rolled_out(app, 2).await;

    cluster
        .act(Action::CrashLoop {
            node: "h100-1".to_owned(),
            operand: "gpu-feature-discovery".to_owned(),
        })
        .await;
    let crashing = eventually("feature discovery on h100-1 restarts", async || {
        let pod = cluster.pod_on(app, "h100-1").await?;
        match main_container(&pod) {
            Some(main) if main.restart_count >= 2 && !is_ready(&pod) => Ok(pod),
            _ => Err(describe(&pod)),
        }
    })
    .await;
    assert!(
        last_exit_message(main_container(&crashing).unwrap())
            .is_some_and(|m| m.contains("injected crash loop"))
    );
    let status = eventually("the DaemonSet counts h100-1 unavailable", async || {
        let status = cluster.daemonset(app).await;
        if status.number_ready == 1 {
            Ok(status)
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await;
    assert_eq!(status.number_unavailable, Some(1));
    let healthy = cluster.ready_pod(app, "h100-0").await;
    assert_eq!(
        main_container(&healthy).unwrap().restart_count,
        0,
        "the other node is untouched"
    );
    cluster.stop().await;
}

#[tokio::test]
async fn slow_image_pulls_keep_a_pod_pending() {
    let cluster = Cluster::h100s(2, &[Operand::DevicePlugin]).await;
    cluster
        .act(Action::SlowImagePulls {
            node: "h100-1".to_owned(),
            delay: Duration::from_secs(3600),
        })
        .await;
    let plugin = OperandSet::of(Operand::DevicePlugin);
    let app = plugin.name();
    cluster.deploy(plugin).await;

    // The kubelet handles every node in the same pass: once the fast node's pod is ready, the slow
    // node's pod has been seen and is pulling.
    cluster.ready_pod(app, "h100-0").await;
    let pulling = eventually("the pod on h100-1 pulls its images", async || {
        let pod = cluster.pod_on(app, "h100-1").await?;
        let started = pod.status.as_ref().is_some_and(|s| s.start_time.is_some());
        if started { Ok(pod) } else { Err(describe(&pod)) }
    })
    .await;
    assert_eq!(phase(&pulling), "Pending", "{}", describe(&pulling));
    assert_eq!(
        main_container(&pulling).and_then(waiting_reason),
        Some("ContainerCreating")
    );
    eventually("the DaemonSet counts the pulling pod unavailable", async || {
        let status = cluster.daemonset(app).await;
        match (status.number_ready, status.number_unavailable) {
            (1, Some(1)) => Ok(()),
            _ => Err(format!("{status:?}")),
        }
    })
    .await;
    cluster.advertises_no_gpu("h100-1").await;
    cluster.stop().await;
}

#[tokio::test]
async fn a_node_that_goes_not_ready_keeps_its_daemon_pods_and_runs_no_new_ones() {
    let cluster = Cluster::h100s(2, &[Operand::DevicePlugin, Operand::GpuFeatureDiscovery]).await;
    let plugin = OperandSet::of(Operand::DevicePlugin);
    let plugin_app = plugin.name();
    cluster.deploy(plugin).await;
    cluster.rolled_out(plugin_app, 2).await;
    let before = cluster.ready_pod(plugin_app, "h100-1").await;

    cluster.act(Action::NodeNotReady("h100-1".to_owned())).await;
    let node = cluster.node("h100-1").await;
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .expect("a Ready condition");
    assert_eq!(ready.status, "Unknown");
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute"),
        "{taints:?}"
    );

    // DaemonSet pods tolerate the unreachable taint: the running one stays, a new DaemonSet still gets a
    // pod there, but no kubelet starts it.
    let discovery = OperandSet::of(Operand::GpuFeatureDiscovery);
    let discovery_app = discovery.name();
    cluster.deploy(discovery).await;
    cluster.ready_pod(discovery_app, "h100-0").await;
    let stranded = eventually("a pod for the NotReady node", async || {
        cluster.pod_on(discovery_app, "h100-1").await
    })
    .await;
    assert!(
        stranded.status.as_ref().is_none_or(|s| s.start_time.is_none()),
        "no kubelet has seen it: {}",
        describe(&stranded)
    );
    let kept = cluster
        .pod_on(plugin_app, "h100-1")
        .await
        .expect("the plugin pod stays");
    assert_eq!(kept.uid(), before.uid());

    cluster.act(Action::NodeReady("h100-1".to_owned())).await;
    cluster.ready_pod(discovery_app, "h100-1").await;
    cluster.rolled_out(discovery_app, 2).await;
    let node = cluster.node("h100-1").await;
    assert!(
        !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/unreachable")),
        "the unreachable taint is gone"
    );
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// MIG.

/// Collects the distinct values a node's `nvidia.com/mig.config.state` takes, in order, from a watch.
async fn watch_mig_state(client: &Client, node: &str) -> mpsc::UnboundedReceiver<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&format!("kubernetes.io/hostname={node}"));
    let (sender, receiver) = mpsc::unbounded_channel();
    let (listening, listened) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(nodes, config).applied_objects());
        let mut listening = Some(listening);
        let mut last: Option<String> = None;
        while let Some(Ok(node)) = stream.next().await {
            if let Some(listening) = listening.take() {
                let _ = listening.send(());
            }
            let state = label(&node, MIG_CONFIG_STATE).map(str::to_owned);
            if state != last {
                if let Some(state) = &state
                    && sender.send(state.clone()).is_err()
                {
                    return;
                }
                last = state;
            }
        }
    });
    listened.await.expect("the watch lists the node");
    receiver
}

async fn next_state(states: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(PATIENCE, states.recv())
        .await
        .expect("the MIG state changes")
        .expect("the watch goes on")
}

/// Chooses the MIG layout `config` for `a100-0` and asserts that the MIG manager reports `pending`, then
/// `outcome`.
async fn choose_mig_config(
    cluster: &Cluster,
    states: &mut mpsc::UnboundedReceiver<String>,
    config: &str,
    outcome: &str,
) {
    cluster.act(set_label("a100-0", MIG_CONFIG, Some(config))).await;
    assert_eq!(next_state(states).await, "pending");
    assert_eq!(next_state(states).await, outcome, "after choosing {config}");
}

/// An A100 node with its host driver, a MIG manager mounting a mig-parted configuration and a device
/// plugin with the mixed strategy; and a watch of the node's MIG state from then on.
async fn mig_cluster() -> (Cluster, mpsc::UnboundedReceiver<String>) {
    let cluster = Cluster::start([Pool::gpu("a100", 1, GpuModel::A100_80GB, 8)
        .with_host_driver()
        .deploying(&[Operand::MigManager, Operand::DevicePlugin])])
    .await;
    let config = mig_parted_config();
    cluster.create(&config).await;
    cluster
        .deploy(OperandSet::of(Operand::MigManager).mounting("default-mig-parted-config"))
        .await;
    cluster
        .deploy(OperandSet::of(Operand::DevicePlugin).with_env("MIG_STRATEGY", "mixed"))
        .await;
    cluster.ready_pod("nvidia-mig-manager", "a100-0").await;
    cluster
        .ready_pod("nvidia-device-plugin-daemonset", "a100-0")
        .await;
    let states = watch_mig_state(&cluster.client, "a100-0").await;
    (cluster, states)
}

#[tokio::test]
async fn the_mig_manager_applies_a_valid_layout_through_pending_to_success() {
    let (cluster, mut states) = mig_cluster().await;
    choose_mig_config(&cluster, &mut states, "all-1g.10gb", "success").await;

    assert_eq!(
        cluster.sim.host("a100-0").unwrap().mig_layout,
        BTreeMap::from([("1g.10gb".to_owned(), 7)])
    );
    // The device plugin (mixed strategy) advertises the instances: 7 on each of 8 GPUs.
    cluster
        .allocatable_becomes("a100-0", "nvidia.com/mig-1g.10gb", 56)
        .await;
    cluster.stop().await;
}

#[tokio::test]
async fn the_mig_manager_reports_failed_for_a_layout_the_gpu_cannot_hold() {
    let (cluster, mut states) = mig_cluster().await;
    // Three 3g.40gb instances need more memory slices than an A100 has.
    choose_mig_config(&cluster, &mut states, "three-halves", "failed").await;
    let host = cluster.sim.host("a100-0").unwrap();
    assert!(host.mig_layout.is_empty(), "MIG stays off: {:?}", host.mig_layout);
    // The whole GPUs stay as they were.
    cluster.allocatable_becomes("a100-0", RESOURCE_GPU, 8).await;

    // A later valid choice still applies.
    choose_mig_config(&cluster, &mut states, "all-1g.10gb", "success").await;
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// Sharing.

/// The time-slicing ConfigMap of `deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml`.
fn sample_time_slicing_config() -> ConfigMap {
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(include_str!(
        "../../../../deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml"
    ))
    .expect("the sample parses");
    let config_map = documents
        .into_iter()
        .find(|document| document["kind"] == "ConfigMap")
        .expect("the sample has a ConfigMap");
    serde_json::from_value(config_map).expect("a ConfigMap")
}

/// Waits until the node's label `key` is `value`.
async fn label_becomes(cluster: &Cluster, node: &str, key: &str, value: &str) {
    eventually(&format!("{node} labelled {key}={value}"), async || {
        let found = cluster.node(node).await;
        match label(&found, key) {
            Some(v) if v == value => Ok(()),
            other => Err(format!("{key}: {other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn the_mig_mixed_time_slicing_sample_shares_each_resource_by_its_own_replicas() {
    let operands = [Operand::DevicePlugin, Operand::GpuFeatureDiscovery];
    let cluster = Cluster::start([
        Pool::gpu("a100", 1, GpuModel::A100_80GB, 8)
            .with_host_driver()
            .deploying(&operands)
            .deploying(&[Operand::MigManager]),
        Pool::h100("h100", 1).with_host_driver().deploying(&operands),
    ])
    .await;
    let mig_config = mig_parted_config();
    cluster.create(&mig_config).await;
    cluster.create(&sample_time_slicing_config()).await;
    cluster
        .deploy(OperandSet::of(Operand::MigManager).mounting("default-mig-parted-config"))
        .await;
    // The plugin and discovery read the sample's key `any` (the ClusterPolicy's devicePlugin.config.default),
    // MIG strategy included: no MIG_STRATEGY in their environment.
    for operand in operands {
        cluster
            .deploy(
                OperandSet::of(operand)
                    .mounting("time-slicing-config")
                    .with_env("DEFAULT_CONFIG", "any"),
            )
            .await;
    }
    cluster
        .act(set_label("a100-0", MIG_CONFIG, Some("all-1g.10gb")))
        .await;

    // 8 GPUs × 7 instances of 1g.10gb, each advertised twice (its own replicas, not the 4 of nvidia.com/gpu).
    cluster
        .allocatable_becomes("a100-0", "nvidia.com/mig-1g.10gb", 112)
        .await;
    let a100 = cluster.node("a100-0").await;
    assert_eq!(
        allocatable(&a100, RESOURCE_GPU),
        Some(0),
        "every GPU is in MIG mode"
    );
    assert_eq!(capacity(&a100, "nvidia.com/mig-1g.10gb"), Some(112));
    for (key, value) in [
        ("nvidia.com/mig-1g.10gb.count", "56"),
        ("nvidia.com/mig-1g.10gb.replicas", "2"),
        ("nvidia.com/mig-1g.10gb.sharing-strategy", "time-slicing"),
        (
            "nvidia.com/mig-1g.10gb.product",
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED",
        ),
        ("nvidia.com/mig.strategy", "mixed"),
        // GPUs in MIG mode are labelled without sharing.
        ("nvidia.com/gpu.replicas", "0"),
        (GPU_PRODUCT, "NVIDIA-A100-SXM4-80GB"),
    ] {
        label_becomes(&cluster, "a100-0", key, value).await;
    }

    // Whole GPUs: nvidia.com/gpu four times each.
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 32).await;
    for (key, value) in [
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.replicas", "4"),
        ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        (GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3-SHARED"),
    ] {
        label_becomes(&cluster, "h100-0", key, value).await;
    }
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// Node heartbeats.

/// A node's Lease in `kube-node-lease`, if it has one.
async fn node_lease(cluster: &Cluster, node: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(cluster.client.clone(), LEASE_NAMESPACE)
        .get_opt(node)
        .await
        .expect("leases read")
}

/// The `lastHeartbeatTime` of a node's Ready condition.
fn ready_heartbeat(node: &Node) -> Option<Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
}

#[tokio::test]
async fn kubelets_keep_a_lease_per_node_and_report_ready_heartbeats() {
    let heartbeats = Heartbeats {
        lease_duration: Duration::from_secs(4),
        renew_every: Duration::from_millis(300),
        report_every: Duration::from_secs(1),
    };
    let cluster = Cluster::start_with(
        [Pool::h100("h100", 2), Pool::cpu("cpu")],
        Plays::Cluster,
        Timing::instant().with_heartbeats(heartbeats),
    )
    .await;
    for name in ["h100-0", "h100-1", "cpu-0"] {
        let node = cluster.node(name).await;
        let lease = eventually(&format!("{name} has a Lease"), async || {
            node_lease(&cluster, name)
                .await
                .ok_or_else(|| "no Lease".to_owned())
        })
        .await;
        let spec = lease.spec.clone().expect("a Lease spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(name), "held by its node");
        assert_eq!(spec.lease_duration_seconds, Some(4));
        let owners = lease.metadata.owner_references.clone().unwrap_or_default();
        assert!(
            owners.len() == 1
                && owners[0].kind == "Node"
                && owners[0].api_version == "v1"
                && owners[0].name == name
                && Some(&owners[0].uid) == node.metadata.uid.as_ref(),
            "owned by its Node: {owners:?}"
        );
        let renewed = spec.renew_time.expect("renewed").0;
        eventually(&format!("{name}'s Lease is renewed"), async || {
            let now = node_lease(&cluster, name).await.and_then(|l| l.spec?.renew_time);
            match now {
                Some(time) if time.0 > renewed => Ok(()),
                other => Err(format!("renewTime {other:?}, first {renewed}")),
            }
        })
        .await;
        let first = eventually(&format!("{name} reports a Ready heartbeat"), async || {
            let node = cluster.node(name).await;
            ready_heartbeat(&node).ok_or_else(|| format!("{:?}", node.status))
        })
        .await;
        eventually(
            &format!("{name}'s Ready heartbeat moves on"),
            async || match ready_heartbeat(&cluster.node(name).await) {
                Some(time) if time > first => Ok(()),
                other => Err(format!("lastHeartbeatTime {other:?}, first {first}")),
            },
        )
        .await;
        assert_eq!(
            ready_status(&cluster.node(name).await),
            Some("True".to_owned()),
            "still Ready"
        );
    }
    // A node that leaves takes its Lease along (its owner is gone).
    cluster.act(Action::NodeLeaves("h100-1".to_owned())).await;
    eventually("h100-1's Lease goes with its Node", async || {
        match node_lease(&cluster, "h100-1").await {
            None => Ok(()),
            Some(lease) => Err(format!("still there: {:?}", lease.spec)),
        }
    })
    .await;
    cluster.stop().await;
}

/// The status of a node's Ready condition.
fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

// ---------------------------------------------------------------------------------------------------
// Workloads.

/// Waits until the workload pod runs and is ready; returns it.
async fn running(cluster: &Cluster, name: &str) -> Pod {
    eventually(&format!("{name} runs"), async || {
        let pod = cluster.workload(name).await;
        if is_ready(&pod) {
            Ok(pod)
        } else {
            Err(describe(&pod))
        }
    })
    .await
}

/// Waits until the scheduler reports the workload pod unschedulable; returns it and the message.
async fn unschedulable(cluster: &Cluster, name: &str) -> (Pod, String) {
    eventually(&format!("{name} reported unschedulable"), async || {
        let pod = cluster.workload(name).await;
        let condition = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"));
        match condition {
            Some(condition) => {
                let message = condition.message.clone().unwrap_or_default();
                Ok((pod, message))
            }
            None => Err(describe(&pod)),
        }
    })
    .await
}

#[tokio::test]
async fn gpu_workloads_are_scheduled_only_where_gpus_are_free() {
    let cluster = Cluster::start([
        Pool::h100("h100", 1)
            .with_host_driver()
            .deploying(&[Operand::DevicePlugin]),
        Pool::cpu("cpu"),
    ])
    .await;
    cluster.deploy(OperandSet::of(Operand::DevicePlugin)).await;
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 8).await;

    cluster.create(&workload("too-big", 16)).await;
    let (pod, message) = unschedulable(&cluster, "too-big").await;
    assert_eq!(phase(&pod), "Pending");
    assert_eq!(node_of(&pod), None);
    assert_eq!(message, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");

    cluster.create(&workload("fits", 8)).await;
    let running = running(&cluster, "fits").await;
    assert_eq!(node_of(&running), Some("h100-0"));

    // Its GPUs are taken now: one more GPU is nowhere to be had.
    cluster.create(&workload("one-more", 1)).await;
    let (_, message) = unschedulable(&cluster, "one-more").await;
    assert_eq!(message, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// Next to a real cluster (`gpu-sim up --kubeconfig`).

#[tokio::test]
async fn next_to_a_real_cluster_it_plays_only_the_nodes() {
    let cluster = Cluster::start_playing(
        [Pool::h100("h100", 1)
            .with_host_driver()
            .deploying(&[Operand::DevicePlugin])],
        Plays::NodesOnly,
    )
    .await;
    // The real cluster's controllers place pods; the simulated kubelet runs what is bound to its node.
    cluster.deploy(OperandSet::of(Operand::DevicePlugin)).await;
    cluster
        .create(&OperandSet::of(Operand::DevicePlugin).pod_on("h100-0"))
        .await;
    cluster.create(&workload("unbound", 1)).await;
    let pod = cluster
        .ready_pod("nvidia-device-plugin-daemonset", "h100-0")
        .await;
    cluster.allocatable_becomes("h100-0", RESOURCE_GPU, 8).await;

    assert_eq!(pod.name_any(), "nvidia-device-plugin-daemonset-h100-0");
    assert_eq!(
        cluster.pods("nvidia-device-plugin-daemonset").await.len(),
        1,
        "no second pod from a simulated DaemonSet controller"
    );
    assert_eq!(
        cluster.daemonset("nvidia-device-plugin-daemonset").await,
        DaemonSetStatus::default(),
        "the DaemonSet's status is the real controller's to write"
    );
    let unbound = cluster.workload("unbound").await;
    assert_eq!(node_of(&unbound), None, "binding is the real scheduler's");
    assert!(
        unbound
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_none()
    );
    cluster.stop().await;
}

// ---------------------------------------------------------------------------------------------------
// The example scenarios shipped in deploy/scenarios.

#[test]
fn every_example_scenario_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/scenarios");
    let mut parsed = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|ext| ext != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        let scenario =
            Scenario::from_yaml(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert!(
            !scenario.timeline.is_empty(),
            "{}: nothing happens",
            path.display()
        );
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        parsed.insert(name, scenario);
    }
    let names: Vec<&str> = parsed.keys().map(String::as_str).collect();
    assert!(
        names.contains(&"faults.yaml")
            && names.contains(&"scale-1000.yaml")
            && names.contains(&"upgrade.yaml"),
        "{names:?}"
    );
    let upgrade = parsed["upgrade.yaml"].cluster();
    assert_eq!(upgrade.nodes().count(), 12);
    assert!(upgrade.workloads.iter().all(|w| w.disruption_budget.is_some()));
    assert_eq!(parsed["faults.yaml"].cluster(), ClusterSpec::demo());
    assert_eq!(parsed["scale-1000.yaml"].cluster().nodes().count(), 1000);
}

/// The MIG manager's layouts, as the ConfigMap `default-mig-parted-config` the operator renders.
fn mig_parted_config() -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("default-mig-parted-config".to_owned()),
            namespace: Some(OPERATORS.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "config.yaml".to_owned(),
            MIG_PARTED_CONFIG.to_owned(),
        )])),
        ..ConfigMap::default()
    }
}
