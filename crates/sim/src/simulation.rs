//! A running simulated cluster: the nodes and workloads of a [`ClusterSpec`], the nodes' hosts, and the
//! actors that play the parts of a cluster that are not the API server (the DaemonSet and ReplicaSet
//! controllers, the scheduler, the kubelets).
//! Every actor is an ordinary API client, so a simulation drives the fake API server or a real one alike.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpuop_api::Operand;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeCondition, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::actors;
use crate::churn::{Churn, Churning};
use crate::cluster_spec::{ClusterSpec, NodePool, node_object};
use crate::host::Host;
use crate::kubelet::{PodFaults, Timing};
use crate::operands::driver_version;
use crate::scenario::{Action, ObjectRef, SCENARIO_MANAGER, joining_names};
use crate::workload::Workload;

/// Field manager of the simulator's own writes.
pub const SIM_MANAGER: &str = "gpu-sim";

/// Faults injected by a scenario.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// (node, driver version or every version) where driver containers that start fail to install the
    /// driver.
    pub driver_install_fails: BTreeSet<(String, Option<String>)>,
    /// (node, operand id) whose main container crash-loops.
    pub crash_loops: BTreeSet<(String, String)>,
    /// Extra image pull time per node.
    pub slow_pulls: BTreeMap<String, Duration>,
    /// Nodes whose kubelet stopped reporting.
    pub not_ready: BTreeSet<String>,
}

impl Faults {
    /// The faults that apply to a pod of `operand` on `node` whose main container runs `image`.
    pub fn for_pod(&self, node: &str, operand: Option<Operand>, image: Option<&str>) -> PodFaults {
        let id = operand.map(Operand::id).unwrap_or_default();
        let crash = self
            .crash_loops
            .contains(&(node.to_owned(), id.to_owned()))
            .then(|| format!("{id} exited: injected crash loop"));
        let version = image.map(driver_version);
        let install_fails = operand == Some(Operand::Driver)
            && self
                .driver_install_fails
                .iter()
                .any(|(at, only)| at == node && (only.is_none() || only.as_ref() == version.as_ref()));
        let start_crash = install_fails.then(|| {
            format!(
                "failed to install the NVIDIA driver {}: kernel headers for this kernel not found (injected)",
                version.as_deref().unwrap_or("unknown")
            )
        });
        PodFaults {
            crash,
            start_crash,
            slow_pull: self.slow_pulls.get(node).copied().unwrap_or_default(),
        }
    }
}

/// What every actor shares.
#[derive(Debug)]
pub struct SimState {
    /// The cluster's shape.
    pub spec: Mutex<ClusterSpec>,
    /// Host state per simulated node.
    pub hosts: Mutex<BTreeMap<String, Host>>,
    /// Injected faults.
    pub faults: Mutex<Faults>,
    /// How long things take.
    pub timing: Timing,
    /// Woken when hosts or faults change outside the kubelets.
    pub changed: Notify,
}

impl SimState {
    /// The hosts.
    pub fn hosts(&self) -> MutexGuard<'_, BTreeMap<String, Host>> {
        self.hosts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The faults.
    pub fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Why a simulation could not start or act.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What the simulator was doing.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An action names something the cluster does not have.
    #[error("{0}")]
    Unknown(String),
}

/// A running simulation.
pub struct Simulation {
    client: Client,
    state: Arc<SimState>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    view: actors::ClusterView,
}

impl std::fmt::Debug for Simulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("nodes", &self.state.hosts().len())
            .finish_non_exhaustive()
    }
}

/// Which parts of a cluster a simulation plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plays {
    /// Everything the fake API server lacks: the DaemonSet controller, the scheduler and the nodes.
    Cluster,
    /// Only the nodes (kubelets, NFD, the hardware and the operands' effects on it), next to a real
    /// cluster's own DaemonSet controller and scheduler, which would otherwise be doubled.
    NodesOnly,
}

impl Simulation {
    /// Creates the cluster's nodes (and the built-in PriorityClasses a real cluster has) and starts every
    /// actor: the simulation plays the whole cluster on the fake API server.
    pub async fn start(client: Client, spec: ClusterSpec, timing: Timing) -> Result<Self, SimError> {
        Self::start_playing(client, spec, timing, Plays::Cluster).await
    }

    /// Creates the cluster's nodes and starts the actors of the parts it plays; with [`Plays::NodesOnly`]
    /// it leaves the PriorityClasses, DaemonSet pods and scheduling to the cluster it joins.
    pub async fn start_playing(
        client: Client,
        spec: ClusterSpec,
        timing: Timing,
        plays: Plays,
    ) -> Result<Self, SimError> {
        if plays == Plays::Cluster {
            ensure_priority_classes(&client).await?;
        }
        let state = Arc::new(SimState {
            spec: Mutex::new(spec.clone()),
            hosts: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(Faults::default()),
            timing,
            changed: Notify::new(),
        });
        // The actors first: a node's kubelet gives signs of life from the moment it registers, and a
        // thousand nodes take about a minute to register on a busy machine, longer than a real node
        // lifecycle controller waits for the first ones' Leases.
        let shutdown = CancellationToken::new();
        let (tasks, view) = actors::spawn(client.clone(), state.clone(), plays, shutdown.clone());
        let started = async {
            for (index, (name, pool)) in spec.nodes().enumerate() {
                add_node(&client, &state, &name, pool, spec.nfd, index as u32).await?;
            }
            // Next to a real cluster too: its own ReplicaSet controller and scheduler then run the pods.
            for workload in &spec.workloads {
                add_workload(&client, workload).await?;
            }
            Ok::<(), SimError>(())
        };
        if let Err(error) = started.await {
            shutdown.cancel();
            for task in tasks {
                let _ = task.await;
            }
            return Err(error);
        }
        info!(nodes = state.hosts().len(), "simulated cluster started");
        Ok(Self {
            client,
            state,
            shutdown,
            tasks,
            view,
        })
    }

    /// Follows whether every node runs the operands of `namespace` it should, Ready, through the actors'
    /// caches (see [`actors::Convergence`]).
    pub fn convergence(&self, namespace: &str) -> actors::Convergence {
        self.view.convergence(namespace)
    }

    /// Starts unrelated churn on the simulated nodes ([`crate::churn`]): a share of them changed each
    /// second in ways no GPU operator cares about, until the returned handle is stopped or the simulation
    /// stops.
    pub fn churn(&self, churn: Churn) -> Churning {
        let state = self.state.clone();
        Churning::start(
            self.client.clone(),
            churn,
            move || state.hosts().keys().cloned().collect(),
            &self.shutdown,
        )
    }

    /// The shared state (hosts, faults).
    pub fn state(&self) -> &Arc<SimState> {
        &self.state
    }

    /// A copy of a node's host.
    pub fn host(&self, node: &str) -> Option<Host> {
        self.state.hosts().get(node).cloned()
    }

    /// Carries out a scenario action.
    pub async fn apply(&self, action: &Action) -> Result<(), SimError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let known = |node: &str| -> Result<(), SimError> {
            if self.state.hosts().contains_key(node) {
                Ok(())
            } else {
                Err(SimError::Unknown(format!(
                    "node {node:?} is not a simulated node"
                )))
            }
        };
        match action {
            Action::NodeJoins { pool, count } => {
                let (pool, nfd, start) = {
                    let spec = self.state.spec.lock().unwrap_or_else(|p| p.into_inner());
                    let pool = spec
                        .node_pools
                        .iter()
                        .find(|p| &p.name == pool)
                        .cloned()
                        .ok_or_else(|| SimError::Unknown(format!("pool {pool:?} is not in the cluster")))?;
                    (pool, spec.nfd, self.state.hosts().len())
                };
                let taken: BTreeSet<String> = self.state.hosts().keys().cloned().collect();
                let names = joining_names(&taken, &pool.name, *count);
                for (added, name) in (0u32..).zip(names) {
                    add_node(
                        &self.client,
                        &self.state,
                        &name,
                        &pool,
                        nfd,
                        (start as u32) + added,
                    )
                    .await?;
                    info!(node = %name, "node joined");
                }
            }
            Action::NodeLeaves(node) => {
                known(node)?;
                nodes
                    .delete(node, &DeleteParams::default())
                    .await
                    .map_err(|source| api_error(format!("delete node {node}"), source))?;
                self.state.hosts().remove(node);
                info!(%node, "node left");
            }
            Action::NodeNotReady(node) | Action::NodeReady(node) => {
                known(node)?;
                let ready = matches!(action, Action::NodeReady(_));
                // The kubelet stops (or starts) before the node is marked, so that no heartbeat reports
                // it Ready in between.
                {
                    let mut faults = self.state.faults();
                    if ready {
                        faults.not_ready.remove(node);
                    } else {
                        faults.not_ready.insert(node.clone());
                    }
                }
                set_ready(&nodes, node, ready).await?;
            }
            Action::DriverInstallFails(fault) => {
                known(&fault.node)?;
                self.state
                    .faults()
                    .driver_install_fails
                    .insert((fault.node.clone(), fault.version.clone()));
            }
            Action::Xid { node, gpu, code } => {
                known(node)?;
                if let Some(host) = self.state.hosts().get_mut(node) {
                    host.unhealthy.insert(*gpu);
                }
                info!(%node, gpu, xid = code, "XID error: GPU unhealthy");
            }
            Action::CrashLoop { node, operand } => {
                known(node)?;
                self.state
                    .faults()
                    .crash_loops
                    .insert((node.clone(), operand.clone()));
            }
            Action::SlowImagePulls { node, delay } => {
                known(node)?;
                self.state.faults().slow_pulls.insert(node.clone(), *delay);
            }
            Action::Label { node, key, value } => {
                known(node)?;
                let patch = json!({ "metadata": { "labels": { key: value } } });
                nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| api_error(format!("label node {node}"), source))?;
            }
            Action::Taint {
                node,
                key,
                value,
                effect,
            } => {
                known(node)?;
                let current = nodes
                    .get(node)
                    .await
                    .map_err(|source| api_error(format!("read node {node}"), source))?;
                let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
                taints.retain(|t| !(t.key == *key && t.effect == *effect));
                taints.push(Taint {
                    key: key.clone(),
                    value: value.clone(),
                    effect: effect.clone(),
                    ..Taint::default()
                });
                let patch = json!({ "spec": { "taints": taints } });
                nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| api_error(format!("taint node {node}"), source))?;
            }
            Action::Apply(manifest) => {
                let target = ObjectRef::of_manifest(manifest);
                let (api, namespace) = self.dynamic_api(&target).await?;
                let mut manifest = manifest.clone();
                if let Some(namespace) = &namespace {
                    manifest["metadata"]["namespace"] = json!(namespace);
                }
                api.patch(
                    &target.name,
                    &PatchParams::apply(SCENARIO_MANAGER).force(),
                    &Patch::Apply(&manifest),
                )
                .await
                .map_err(|source| api_error(format!("apply {}", describe(&target)), source))?;
                info!(object = %describe(&target), "applied");
            }
            Action::Patch(patch) => {
                let target = patch.target();
                let (api, _) = self.dynamic_api(&target).await?;
                api.patch(
                    &target.name,
                    &PatchParams {
                        field_manager: Some(SCENARIO_MANAGER.to_owned()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(&patch.merge),
                )
                .await
                .map_err(|source| api_error(format!("patch {}", describe(&target)), source))?;
                info!(object = %describe(&target), "patched");
            }
            Action::Delete(target) => {
                let (api, _) = self.dynamic_api(target).await?;
                api.delete(&target.name, &DeleteParams::default())
                    .await
                    .map_err(|source| api_error(format!("delete {}", describe(target)), source))?;
                info!(object = %describe(target), "deleted");
            }
        }
        self.state.changed.notify_one();
        Ok(())
    }

    /// An API for the kind of `target`, found through discovery (so `ClusterPolicy` is served at
    /// `clusterpolicies` and `NVIDIADriver` at `nvidiadrivers`), and the namespace for a namespaced kind
    /// (`default` when the target names none).
    async fn dynamic_api(
        &self,
        target: &ObjectRef,
    ) -> Result<(Api<DynamicObject>, Option<String>), SimError> {
        let (group, version) = target
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", target.api_version.as_str()));
        let gvk = GroupVersionKind::gvk(group, version, &target.kind);
        let (resource, capabilities) =
            kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map_err(|source| {
                    api_error(
                        format!("find {}/{} on the server", target.api_version, target.kind),
                        source,
                    )
                })?;
        Ok(if capabilities.scope == Scope::Namespaced {
            let namespace = target.namespace.clone().unwrap_or_else(|| "default".to_owned());
            (
                Api::namespaced_with(self.client.clone(), &namespace, &resource),
                Some(namespace),
            )
        } else {
            (Api::all_with(self.client.clone(), &resource), None)
        })
    }

    /// Stops every actor.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

fn api_error(what: String, source: kube::Error) -> SimError {
    SimError::Api { what, source }
}

/// An object as `kubectl` names it: `ClusterPolicy cluster-policy`, `Pod ml/train-x2b4k`.
fn describe(target: &ObjectRef) -> String {
    match &target.namespace {
        Some(namespace) => format!("{} {namespace}/{}", target.kind, target.name),
        None => format!("{} {}", target.kind, target.name),
    }
}

/// Creates the namespace `name`: `true` where this call created it, `false` where it already existed.
pub(crate) async fn create_namespace(client: &Client, name: &str) -> Result<bool, kube::Error> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Creates a workload's namespace when missing, and applies its ReplicaSet and disruption budget.
async fn add_workload(client: &Client, workload: &Workload) -> Result<(), SimError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let exists = namespaces
        .get_opt(&workload.namespace)
        .await
        .map_err(|source| api_error(format!("read namespace {}", workload.namespace), source))?
        .is_some();
    if !exists {
        create_namespace(client, &workload.namespace)
            .await
            .map_err(|source| api_error(format!("create namespace {}", workload.namespace), source))?;
    }
    let apply = PatchParams::apply(SIM_MANAGER).force();
    let what = |kind: &str| format!("apply {kind} {}/{}", workload.namespace, workload.name);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &workload.namespace);
    replica_sets
        .patch(&workload.name, &apply, &Patch::Apply(workload.replica_set()))
        .await
        .map_err(|source| api_error(what("ReplicaSet"), source))?;
    if let Some(budget) = workload.disruption_budget() {
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &workload.namespace);
        budgets
            .patch(&workload.name, &apply, &Patch::Apply(budget))
            .await
            .map_err(|source| api_error(what("PodDisruptionBudget"), source))?;
    }
    info!(workload = %workload.name, namespace = %workload.namespace, replicas = workload.replicas, "workload created");
    Ok(())
}

/// Creates a node (if it does not exist) and its host.
async fn add_node(
    client: &Client,
    state: &SimState,
    name: &str,
    pool: &NodePool,
    nfd: bool,
    index: u32,
) -> Result<(), SimError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = node_object(name, pool, nfd, index);
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(source) => return Err(api_error(format!("create node {name}"), source)),
    }
    // The kubelet writes its status through the status subresource; creating a node may drop it.
    let status = json!({ "status": node.status });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|source| api_error(format!("report status of node {name}"), source))?;
    let gpu = pool.gpu.as_ref();
    let driver = pool.driver_preinstalled.then(|| "580.82.07".to_owned());
    state.hosts().insert(
        name.to_owned(),
        Host::new(gpu.map(|g| g.model), gpu.map_or(0, |g| g.count), driver),
    );
    Ok(())
}

/// Sets a node's Ready condition and the taint the node lifecycle controller pairs with it.
async fn set_ready(nodes: &Api<Node>, name: &str, ready: bool) -> Result<(), SimError> {
    let node = nodes
        .get(name)
        .await
        .map_err(|source| api_error(format!("read node {name}"), source))?;
    let mut conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    conditions.retain(|c| c.type_ != "Ready");
    conditions.push(NodeCondition {
        type_: "Ready".into(),
        status: if ready { "True" } else { "Unknown" }.into(),
        reason: Some(
            if ready {
                "KubeletReady"
            } else {
                "NodeStatusUnknown"
            }
            .into(),
        ),
        message: Some(
            if ready {
                "kubelet is posting ready status"
            } else {
                "Kubelet stopped posting node status."
            }
            .into(),
        ),
        ..NodeCondition::default()
    });
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": { "conditions": conditions } })),
        )
        .await
        .map_err(|source| api_error(format!("report status of node {name}"), source))?;
    let mut taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    taints.retain(|t| t.key != "node.kubernetes.io/unreachable");
    if !ready {
        taints.push(Taint {
            key: "node.kubernetes.io/unreachable".into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        });
    }
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "taints": taints } })),
        )
        .await
        .map_err(|source| api_error(format!("taint node {name}"), source))?;
    Ok(())
}

/// The PriorityClasses every real cluster has, which operand pods name.
async fn ensure_priority_classes(client: &Client) -> Result<(), SimError> {
    let api: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [
        ("system-node-critical", 2_000_001_000),
        ("system-cluster-critical", 2_000_000_000),
    ] {
        let class = PriorityClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            value,
            description: Some("Built-in priority class, as every cluster has it.".into()),
            ..PriorityClass::default()
        };
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => return Err(api_error(format!("create PriorityClass {name}"), source)),
        }
    }
    Ok(())
}
