//! Builders for the objects of a GPU cluster, for tests and the benchmark: nodes as NFD, feature discovery and
//! the operator label them ([`NodeFixture`]), and a [`ClusterBuilder`] that produces what a converged cluster
//! has: one DaemonSet per operand the policy enables, made from the operand catalogue, and a ready pod of each
//! on every node it places one on. Faults are planted on the result ([`Snapshot::pod_of_mut`] and the
//! [`PodFacts`] methods below). For driver upgrades: the driver DaemonSet's ControllerRevisions
//! ([`Snapshot::new_driver_revision`]), NVIDIADrivers ([`Snapshot::add_nvidia_driver`]), workload pods with
//! labels and owners, and PodDisruptionBudgets ([`disruption_budget`]).

use std::collections::BTreeMap;

use gpuop_api::catalogue::deploy_labels_for;
use gpuop_api::choice::{SandboxMode, WorkloadConfig};
use gpuop_api::driver::DRIVER_CONFIG_DIGEST;
use gpuop_api::labels::{
    COMPONENT, GPU_COUNT, GPU_FAMILY, GPU_MEMORY, GPU_PRESENT, GPU_PRODUCT, GPU_REPLICAS, GPU_TAINT,
    MANAGED_BY, MANAGED_BY_VALUE, MIG_CAPABLE, NFD_KERNEL_VERSION, NFD_NVIDIA_PCI, NFD_OS_ID, NFD_OS_VERSION,
    RESOURCE_GPU,
};
use gpuop_api::labels::{DRIVER_OWNER, NVIDIA_DRIVER_NAME};
use gpuop_api::placement::daemon_pod_fits;
use gpuop_api::read::controller_ref;
use gpuop_api::rollout::revision_labels;
use gpuop_api::upgrade::observe::REVISION_HASH;
use gpuop_api::{
    ClusterPolicy, ClusterPolicySpec, NVIDIADriver, NVIDIADriverSpec, OPERANDS, Operand, OperandInfo,
};
use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, DaemonSetSpec, DaemonSetStatus, DaemonSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, Node, NodeAffinity, NodeCondition, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, NodeSpec, NodeStatus, NodeSystemInfo, PodSpec, PodTemplateSpec, ResourceRequirements,
    Taint, Toleration,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time};

use crate::analysis::prover_of;
use crate::node_view::validation_container;
use crate::report::Link;
use crate::snapshot::{
    ContainerFacts, ContainerStateFacts, ContainerStatusFacts, KINDS, PodConditionFacts, PodFacts, PodMeta,
    PodSpecFacts, PodStatusFacts, RunningFacts, Snapshot, TerminatedFacts, WaitingFacts,
};
use gpuop_api::labels::CUDA_DRIVER_VERSION_FULL;

/// Namespace the builders put operands in.
pub const NAMESPACE: &str = "gpu-operator";
/// Name of the ClusterPolicy the builders make.
pub const POLICY: &str = "cluster-policy";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Builders for nodes.
pub trait NodeFixture: Sized {
    /// A Ready node with eight A100 GPUs, labelled as NFD, feature discovery and the operator label it for
    /// container workloads, advertising `nvidia.com/gpu: 8`.
    fn gpu(name: &str) -> Self;
    /// A Ready node without GPUs, labelled by NFD.
    fn cpu(name: &str) -> Self;
    /// Sets a label.
    #[must_use]
    fn with_label(self, key: &str, value: &str) -> Self;
    /// Removes a label.
    #[must_use]
    fn without_label(self, key: &str) -> Self;
    /// Adds a taint.
    #[must_use]
    fn with_taint(self, key: &str, value: Option<&str>, effect: &str) -> Self;
    /// Sets the GPU product and count (labels and `nvidia.com/gpu` in capacity and allocatable).
    #[must_use]
    fn with_gpus(self, product: &str, count: i64) -> Self;
    /// Sets one resource's capacity and allocatable; `None` removes it.
    #[must_use]
    fn with_resource(self, name: &str, capacity: Option<i64>, allocatable: Option<i64>) -> Self;
    /// Marks the GPUs MIG-capable, with the MIG manager's deploy switch the operator then adds.
    #[must_use]
    fn mig_capable(self) -> Self;
    /// Cordons the node.
    #[must_use]
    fn cordoned(self) -> Self;
    /// Makes the node NotReady.
    #[must_use]
    fn not_ready(self) -> Self;
}

impl NodeFixture for Node {
    fn gpu(name: &str) -> Self {
        let mut node = Node::cpu(name)
            .with_label(NFD_NVIDIA_PCI[0], "true")
            .with_label(GPU_PRESENT, "true")
            .with_label(MIG_CAPABLE, "false")
            .with_label(GPU_FAMILY, "ampere")
            .with_label(GPU_MEMORY, "40960")
            .with_label(GPU_REPLICAS, "1")
            .with_label(CUDA_DRIVER_VERSION_FULL, "550.127.05")
            .with_gpus("NVIDIA-A100-SXM4-40GB", 8);
        for label in deploy_labels_for(WorkloadConfig::Container, SandboxMode::KubeVirt, false) {
            node = node.with_label(label, "true");
        }
        node
    }

    fn cpu(name: &str) -> Self {
        let quantities = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect()
        };
        let resources = [("cpu", "64"), ("memory", "512Gi"), ("pods", "110")];
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(format!("uid-node-{name}")),
                labels: Some(labels(&[
                    ("kubernetes.io/hostname", name),
                    (NFD_KERNEL_VERSION, "5.15.0-122-generic"),
                    (NFD_OS_ID, "ubuntu"),
                    (NFD_OS_VERSION, "22.04"),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                capacity: Some(quantities(&resources)),
                allocatable: Some(quantities(&resources)),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".to_owned(),
                    status: "True".to_owned(),
                    reason: Some("KubeletReady".to_owned()),
                    ..NodeCondition::default()
                }]),
                node_info: Some(NodeSystemInfo {
                    kernel_version: "5.15.0-122-generic".to_owned(),
                    os_image: "Ubuntu 22.04.5 LTS".to_owned(),
                    container_runtime_version: "containerd://1.7.22".to_owned(),
                    architecture: "amd64".to_owned(),
                    operating_system: "linux".to_owned(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
        }
    }

    fn with_label(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    fn without_label(mut self, key: &str) -> Self {
        if let Some(labels) = self.metadata.labels.as_mut() {
            labels.remove(key);
        }
        self
    }

    fn with_taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.spec
            .get_or_insert_with(NodeSpec::default)
            .taints
            .get_or_insert_with(Vec::new)
            .push(Taint {
                key: key.to_owned(),
                value: value.map(str::to_owned),
                effect: effect.to_owned(),
                time_added: None,
            });
        self
    }

    fn with_gpus(self, product: &str, count: i64) -> Self {
        self.with_label(GPU_PRODUCT, product)
            .with_label(GPU_COUNT, &count.to_string())
            .with_resource(RESOURCE_GPU, Some(count), Some(count))
    }

    fn with_resource(mut self, name: &str, capacity: Option<i64>, allocatable: Option<i64>) -> Self {
        let status = self.status.get_or_insert_with(NodeStatus::default);
        for (map, value) in [
            (&mut status.capacity, capacity),
            (&mut status.allocatable, allocatable),
        ] {
            let map = map.get_or_insert_with(BTreeMap::new);
            match value {
                Some(value) => {
                    map.insert(name.to_owned(), Quantity(value.to_string()));
                }
                None => {
                    map.remove(name);
                }
            }
        }
        self
    }

    fn mig_capable(self) -> Self {
        self.with_label(MIG_CAPABLE, "true")
            .with_label(Operand::MigManager.info().deploy_label, "true")
    }

    fn cordoned(mut self) -> Self {
        self.spec.get_or_insert_with(NodeSpec::default).unschedulable = Some(true);
        self
    }

    fn not_ready(mut self) -> Self {
        for condition in self
            .status
            .iter_mut()
            .flat_map(|s| s.conditions.iter_mut().flatten())
        {
            if condition.type_ == "Ready" {
                condition.status = "False".to_owned();
                condition.reason = Some("KubeletNotReady".to_owned());
                condition.message = Some("container runtime network not ready".to_owned());
            }
        }
        self
    }
}

/// Builds the snapshot of a converged cluster.
#[derive(Debug)]
pub struct ClusterBuilder {
    policy: ClusterPolicySpec,
    nodes: Vec<Node>,
    runtime_class: bool,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            policy: ClusterPolicySpec::default(),
            nodes: Vec::new(),
            runtime_class: true,
        }
    }
}

impl ClusterBuilder {
    /// A cluster with the default ClusterPolicy and no nodes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this ClusterPolicy spec.
    #[must_use]
    pub fn with_policy(mut self, spec: ClusterPolicySpec) -> Self {
        self.policy = spec;
        self
    }

    /// Adds a node.
    #[must_use]
    pub fn with_node(mut self, node: Node) -> Self {
        self.nodes.push(node);
        self
    }

    /// Adds nodes.
    #[must_use]
    pub fn with_nodes(mut self, nodes: impl IntoIterator<Item = Node>) -> Self {
        self.nodes.extend(nodes);
        self
    }

    /// Leaves out the RuntimeClass the operator creates.
    #[must_use]
    pub fn without_runtime_class(mut self) -> Self {
        self.runtime_class = false;
        self
    }

    /// The converged cluster: DaemonSets for every operand the policy enables, and on every node each one
    /// places a pod on, a ready pod.
    pub fn build(self) -> Snapshot {
        let mut policy = ClusterPolicy::new(POLICY, self.policy);
        policy.metadata.uid = Some(format!("uid-{POLICY}"));
        policy.metadata.creation_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let mut snapshot = Snapshot {
            daemon_sets: OPERANDS
                .iter()
                .filter(|info| (info.enabled)(&policy.spec))
                .map(|info| operand_daemon_set(info, &policy.spec))
                .collect(),
            runtime_classes: if self.runtime_class {
                vec![RuntimeClass {
                    metadata: ObjectMeta {
                        name: Some(policy.spec.operator.runtime_class().to_owned()),
                        ..ObjectMeta::default()
                    },
                    handler: policy.spec.operator.runtime_class().to_owned(),
                    ..RuntimeClass::default()
                }]
            } else {
                Vec::new()
            },
            cluster_policies: vec![policy],
            listed: KINDS.iter().map(|k| (*k).to_owned()).collect(),
            ..Snapshot::default()
        };
        snapshot.controller_revisions = snapshot
            .daemon_sets
            .iter()
            .filter(|ds| is_driver(ds))
            .map(revision_of)
            .collect();
        for node in self.nodes {
            snapshot.join(node);
        }
        snapshot
    }
}

fn is_driver(daemon_set: &DaemonSet) -> bool {
    Operand::of_daemonset(daemon_set) == Some(Operand::Driver)
}

/// The `controller-revision-hash` of a DaemonSet's latest revision: the fixtures number revisions by the
/// DaemonSet's generation.
fn revision_hash(daemon_set: &DaemonSet) -> String {
    format!(
        "{}-r{}",
        daemon_set.metadata.name.as_deref().unwrap_or_default(),
        daemon_set.metadata.generation.unwrap_or(1)
    )
}

/// The ControllerRevision of a DaemonSet's current generation, as the DaemonSet controller writes it.
pub fn revision_of(daemon_set: &DaemonSet) -> ControllerRevision {
    let hash = revision_hash(daemon_set);
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(hash.clone()),
            namespace: daemon_set.metadata.namespace.clone(),
            uid: Some(format!("uid-{hash}")),
            labels: Some(revision_labels(daemon_set, &hash)),
            owner_references: Some(vec![controller_ref(daemon_set)]),
            ..ObjectMeta::default()
        },
        revision: daemon_set.metadata.generation.unwrap_or(1),
        data: None,
    }
}

/// A PodDisruptionBudget over the pods of a namespace with these labels, allowing `allowed` disruptions now.
pub fn disruption_budget(
    namespace: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    allowed: i32,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: Some(format!("uid-pdb-{namespace}-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(labels(match_labels)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            disruptions_allowed: allowed,
            ..PodDisruptionBudgetStatus::default()
        }),
    }
}

/// The DaemonSet the operator renders for an operand, as far as placement and pod shape go.
pub fn operand_daemon_set(info: &OperandInfo, policy: &ClusterPolicySpec) -> DaemonSet {
    let mut selector = labels(&[(info.deploy_label, "true")]);
    selector.extend(
        info.extra_node_selector
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let mut tolerations = vec![Toleration {
        key: Some(GPU_TAINT.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Toleration::default()
    }];
    tolerations.extend(policy.daemonsets.tolerations.iter().flatten().cloned());
    let container = |name: String| Container {
        name,
        image: Some(format!("nvcr.io/nvidia/{}:test", info.id)),
        ..Container::default()
    };
    let mut main = container(info.id.to_owned());
    if info.operand == Operand::Driver {
        main.env = Some(vec![digest_env(1)]);
    }
    let init_containers: Vec<Container> = init_files(info)
        .into_iter()
        .map(|file| container(validation_container(file)))
        .collect();
    let needs_runtime_class = !matches!(info.operand, Operand::Driver | Operand::ContainerToolkit);
    let app = labels(&[("app", info.daemonset), (COMPONENT, info.component)]);
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(info.daemonset.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            uid: Some(format!("uid-{}", info.daemonset)),
            labels: Some(labels(&[
                (MANAGED_BY, MANAGED_BY_VALUE),
                (COMPONENT, info.component),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", info.daemonset)])),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(app),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    node_selector: Some(selector),
                    tolerations: Some(tolerations),
                    runtime_class_name: (needs_runtime_class && !policy.nri_plugin_enabled())
                        .then(|| policy.operator.runtime_class().to_owned()),
                    init_containers: (!init_containers.is_empty()).then_some(init_containers),
                    containers: vec![main],
                    ..PodSpec::default()
                }),
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some(
                    if info.operand == Operand::Driver {
                        "OnDelete"
                    } else {
                        "RollingUpdate"
                    }
                    .to_owned(),
                ),
                ..DaemonSetUpdateStrategy::default()
            }),
            ..DaemonSetSpec::default()
        }),
        status: Some(DaemonSetStatus::default()),
    }
}

/// The driver's `DRIVER_CONFIG_DIGEST` in the fixtures: one per generation (every new revision reinstalls).
fn digest_env(generation: i64) -> EnvVar {
    EnvVar {
        name: DRIVER_CONFIG_DIGEST.to_owned(),
        value: Some(format!("digest-{generation}")),
        value_from: None,
    }
}

/// Status files an operand's init containers deal with: those it waits for, and for the validator those it
/// writes (each operand it needs, then its own), in chain order.
fn init_files(info: &OperandInfo) -> Vec<&'static str> {
    if info.operand != Operand::OperatorValidator {
        return info.waits_for.to_vec();
    }
    let mut files: Vec<&'static str> = info
        .requires
        .iter()
        .filter_map(|operand| operand.info().proves)
        .chain(info.proves)
        .collect();
    files.sort_by_key(|file| prover_of(file).map(Link::of));
    files
}

/// A short, stable suffix for a pod name, like the DaemonSet controller's random one.
fn suffix(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|i| ALPHABET[((hash >> (i * 8)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

/// A ready pod of a DaemonSet on a node.
pub fn daemon_pod(daemon_set: &DaemonSet, node: &str) -> PodFacts {
    let name = daemon_set.metadata.name.clone().unwrap_or_default();
    let template = daemon_set.spec.as_ref().map(|s| &s.template);
    let spec = template.and_then(|t| t.spec.as_ref());
    let names = |containers: Option<&Vec<Container>>| -> Vec<ContainerFacts> {
        containers
            .into_iter()
            .flatten()
            .map(|c| ContainerFacts {
                name: c.name.clone(),
                resources: None,
                env: c
                    .env
                    .iter()
                    .flatten()
                    .map(|e| crate::snapshot::EnvFacts {
                        name: e.name.clone(),
                        value: e.value.clone(),
                    })
                    .collect(),
            })
            .collect()
    };
    let mut pod_labels = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    pod_labels.insert(REVISION_HASH.to_owned(), revision_hash(daemon_set));
    let init_containers = names(spec.and_then(|s| s.init_containers.as_ref()));
    let containers = names(spec.map(|s| &s.containers));
    let mut pod = PodFacts {
        metadata: PodMeta {
            name: format!("{name}-{}", suffix(&format!("{name}/{node}"))),
            namespace: daemon_set.metadata.namespace.clone(),
            uid: format!("uid-{name}-{node}"),
            deletion_timestamp: None,
            labels: pod_labels,
            annotations: BTreeMap::new(),
            owner_references: vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "DaemonSet".to_owned(),
                name,
                uid: daemon_set.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }],
        },
        spec: PodSpecFacts {
            node_name: Some(node.to_owned()),
            affinity: Some(pinned_to(node)),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            runtime_class_name: spec.and_then(|s| s.runtime_class_name.clone()),
            init_containers,
            containers,
            ..PodSpecFacts::default()
        },
        status: PodStatusFacts::default(),
    };
    pod.ready();
    pod
}

/// The affinity the DaemonSet controller gives each of its pods: this node, by name.
fn pinned_to(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec![node.to_owned()]),
                    }]),
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    }
}

fn condition(type_: &str, status: bool, reason: Option<&str>, message: Option<&str>) -> PodConditionFacts {
    PodConditionFacts {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.map(str::to_owned),
        message: message.map(str::to_owned),
        last_transition_time: None,
    }
}

fn running() -> Option<ContainerStateFacts> {
    Some(ContainerStateFacts {
        running: Some(RunningFacts {}),
        ..ContainerStateFacts::default()
    })
}

fn waiting(reason: &str) -> Option<ContainerStateFacts> {
    Some(ContainerStateFacts {
        waiting: Some(WaitingFacts {
            reason: Some(reason.to_owned()),
            message: None,
        }),
        ..ContainerStateFacts::default()
    })
}

fn terminated(exit_code: i32, reason: &str) -> Option<ContainerStateFacts> {
    Some(ContainerStateFacts {
        terminated: Some(TerminatedFacts {
            exit_code,
            reason: Some(reason.to_owned()),
            message: None,
        }),
        ..ContainerStateFacts::default()
    })
}

/// Faults and states to plant on pods.
impl PodFacts {
    /// A workload pod (owned by a ReplicaSet) that is not scheduled yet.
    pub fn workload(namespace: &str, name: &str) -> PodFacts {
        PodFacts {
            metadata: PodMeta {
                name: name.to_owned(),
                namespace: Some(namespace.to_owned()),
                uid: format!("uid-{namespace}-{name}"),
                deletion_timestamp: None,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
                owner_references: vec![OwnerReference {
                    api_version: "apps/v1".to_owned(),
                    kind: "ReplicaSet".to_owned(),
                    name: format!("{name}-rs"),
                    uid: format!("uid-rs-{name}"),
                    controller: Some(true),
                    block_owner_deletion: None,
                }],
            },
            spec: PodSpecFacts {
                containers: vec![ContainerFacts {
                    name: "main".to_owned(),
                    resources: Some(ResourceRequirements::default()),
                    env: Vec::new(),
                }],
                ..PodSpecFacts::default()
            },
            status: PodStatusFacts {
                phase: Some("Pending".to_owned()),
                ..PodStatusFacts::default()
            },
        }
    }

    /// Asks for `count` of a resource (request and limit).
    #[must_use]
    pub fn requesting(mut self, resource: &str, count: i64) -> PodFacts {
        let quantity = Quantity(count.to_string());
        if let Some(resources) = self
            .spec
            .containers
            .first_mut()
            .and_then(|c| c.resources.as_mut())
        {
            resources
                .limits
                .get_or_insert_with(BTreeMap::new)
                .insert(resource.to_owned(), quantity.clone());
            resources
                .requests
                .get_or_insert_with(BTreeMap::new)
                .insert(resource.to_owned(), quantity);
        }
        self
    }

    /// Sets a label.
    #[must_use]
    pub fn labelled(mut self, key: &str, value: &str) -> PodFacts {
        self.metadata.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// No controller owns it (a bare pod: evicting it loses it for good).
    #[must_use]
    pub fn unmanaged(mut self) -> PodFacts {
        self.metadata.owner_references.clear();
        self
    }

    /// Adds a node selector entry.
    #[must_use]
    pub fn selecting(mut self, key: &str, value: &str) -> PodFacts {
        self.spec.node_selector.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds a toleration.
    #[must_use]
    pub fn tolerating(mut self, key: &str, effect: Option<&str>) -> PodFacts {
        self.spec.tolerations.push(Toleration {
            key: Some(key.to_owned()),
            operator: Some("Exists".to_owned()),
            effect: effect.map(str::to_owned),
            ..Toleration::default()
        });
        self
    }

    /// Bound to a node and running, ready.
    #[must_use]
    pub fn running_on(mut self, node: &str) -> PodFacts {
        self.spec.node_name = Some(node.to_owned());
        self.ready();
        self
    }

    /// Not scheduled: the scheduler's message.
    #[must_use]
    pub fn unschedulable(mut self, message: &str) -> PodFacts {
        self.spec.node_name = None;
        self.status = unschedulable_status(message);
        self
    }

    /// Running with every container ready, init containers done.
    pub fn ready(&mut self) -> &mut Self {
        self.metadata.deletion_timestamp = None;
        self.status = PodStatusFacts {
            phase: Some("Running".to_owned()),
            conditions: vec![
                condition("PodScheduled", true, None, None),
                condition("Initialized", true, None, None),
                condition("ContainersReady", true, None, None),
                condition("Ready", true, None, None),
            ],
            init_container_statuses: self
                .spec
                .init_containers
                .iter()
                .map(|c| ContainerStatusFacts {
                    name: c.name.clone(),
                    ready: true,
                    restart_count: 0,
                    state: terminated(0, "Completed"),
                    last_state: None,
                })
                .collect(),
            container_statuses: self
                .spec
                .containers
                .iter()
                .map(|c| ContainerStatusFacts {
                    name: c.name.clone(),
                    ready: true,
                    restart_count: 0,
                    state: running(),
                    last_state: None,
                })
                .collect(),
            ..PodStatusFacts::default()
        };
        self
    }

    /// Its first container crash-loops.
    pub fn crash_loop(&mut self, restarts: i32) -> &mut Self {
        self.ready();
        if let Some(status) = self.status.container_statuses.first_mut() {
            status.ready = false;
            status.restart_count = restarts;
            status.state = waiting("CrashLoopBackOff");
            status.last_state = terminated(1, "Error");
        }
        self.set_not_ready_conditions();
        self
    }

    /// Running, but its first container is not ready.
    pub fn not_ready(&mut self) -> &mut Self {
        self.ready();
        if let Some(status) = self.status.container_statuses.first_mut() {
            status.ready = false;
        }
        self.set_not_ready_conditions();
        self
    }

    /// Waits in the named init container (earlier ones done); with `restarts`, that one crash-loops.
    pub fn stuck_in_init(&mut self, container: &str, restarts: Option<i32>) -> &mut Self {
        self.ready();
        self.status.phase = Some("Pending".to_owned());
        let mut reached = false;
        for status in &mut self.status.init_container_statuses {
            if status.name == container {
                reached = true;
                status.ready = false;
                match restarts {
                    Some(restarts) => {
                        status.restart_count = restarts;
                        status.state = waiting("CrashLoopBackOff");
                        status.last_state = terminated(1, "Error");
                    }
                    None => status.state = running(),
                }
            } else if reached {
                status.ready = false;
                status.state = waiting("PodInitializing");
            }
        }
        for status in &mut self.status.container_statuses {
            status.ready = false;
            status.state = waiting("PodInitializing");
        }
        self.set_not_ready_conditions();
        if let Some(initialized) = self
            .status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == "Initialized")
        {
            initialized.status = "False".to_owned();
        }
        self
    }

    /// Being deleted.
    pub fn terminating(&mut self) -> &mut Self {
        self.metadata.deletion_timestamp = Some("2026-01-01T00:00:00Z".to_owned());
        self
    }

    /// A DaemonSet pod the scheduler has not bound to its node (pinned by `matchFields`).
    pub fn unbound(&mut self, message: &str) -> &mut Self {
        let node = self.spec.node_name.take().unwrap_or_default();
        self.spec.affinity = Some(pinned_to(&node));
        self.status = unschedulable_status(message);
        self
    }

    fn set_not_ready_conditions(&mut self) {
        for condition in &mut self.status.conditions {
            if condition.type_ == "Ready" || condition.type_ == "ContainersReady" {
                condition.status = "False".to_owned();
            }
        }
    }
}

/// A pending pod's status carrying the scheduler's `Unschedulable` message.
fn unschedulable_status(message: &str) -> PodStatusFacts {
    PodStatusFacts {
        phase: Some("Pending".to_owned()),
        conditions: vec![condition(
            "PodScheduled",
            false,
            Some("Unschedulable"),
            Some(message),
        )],
        ..PodStatusFacts::default()
    }
}

/// Changes to a converged cluster.
impl Snapshot {
    /// A node joins and converges: every operand DaemonSet that places a pod on it gets a ready one.
    pub fn join(&mut self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        for daemon_set in &mut self.daemon_sets {
            let fits = daemon_set
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .is_some_and(|spec| daemon_pod_fits(&node, spec).is_ok());
            if fits {
                self.pods.push(daemon_pod(daemon_set, &name));
                let status = daemon_set.status.get_or_insert_with(DaemonSetStatus::default);
                status.desired_number_scheduled += 1;
                status.current_number_scheduled += 1;
                status.number_ready += 1;
                status.number_available = Some(status.number_ready);
                status.updated_number_scheduled = Some(status.number_ready);
            }
        }
        self.nodes.push(node);
    }

    /// The operand's pod on a node.
    pub fn pod_of(&self, operand: Operand, node: &str) -> Option<&PodFacts> {
        let daemon_set = operand.info().daemonset;
        self.pods.iter().find(|pod| {
            pod.target_node() == Some(node)
                && pod.metadata.owner_references.iter().any(|o| o.name == daemon_set)
        })
    }

    /// The operand's pod on a node, to plant a fault on.
    pub fn pod_of_mut(&mut self, operand: Operand, node: &str) -> Option<&mut PodFacts> {
        let daemon_set = operand.info().daemonset;
        self.pods.iter_mut().find(|pod| {
            pod.target_node() == Some(node)
                && pod.metadata.owner_references.iter().any(|o| o.name == daemon_set)
        })
    }

    /// Removes the operand's pod from a node.
    pub fn remove_pod_of(&mut self, operand: Operand, node: &str) -> Option<PodFacts> {
        let daemon_set = operand.info().daemonset;
        let index = self.pods.iter().position(|pod| {
            pod.target_node() == Some(node)
                && pod.metadata.owner_references.iter().any(|o| o.name == daemon_set)
        })?;
        Some(self.pods.remove(index))
    }

    /// Puts a ready pod of the operand's DaemonSet on a node, whether or not the DaemonSet places one there.
    pub fn place_pod_of(&mut self, operand: Operand, node: &str) {
        if let Some(daemon_set) = self.daemon_set_of(operand) {
            let pod = daemon_pod(daemon_set, node);
            self.pods.push(pod);
        }
    }

    /// The operand's DaemonSet.
    pub fn daemon_set_of(&self, operand: Operand) -> Option<&DaemonSet> {
        let name = operand.info().daemonset;
        self.daemon_sets
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
    }

    /// The driver DaemonSets get a new revision that reinstalls the driver (a new image or configuration):
    /// every driver pod running now is outdated.
    pub fn new_driver_revision(&mut self) {
        for daemon_set in self.daemon_sets.iter_mut().filter(|ds| is_driver(ds)) {
            let generation = daemon_set.metadata.generation.unwrap_or(1) + 1;
            daemon_set.metadata.generation = Some(generation);
            for container in daemon_set
                .spec
                .iter_mut()
                .filter_map(|s| s.template.spec.as_mut())
                .flat_map(|s| s.containers.iter_mut())
            {
                for env in container.env.iter_mut().flatten() {
                    if env.name == DRIVER_CONFIG_DIGEST {
                        *env = digest_env(generation);
                    }
                }
            }
            let revision = revision_of(daemon_set);
            self.controller_revisions.push(revision);
        }
    }

    /// An NVIDIADriver takes over the driver of these nodes: its DaemonSet (`nvidia.com/nvidiadriver=<name>`)
    /// with its revision, its driver pod on each node in place of any other, and the nodes routed to it (labelled
    /// `pool=<name>`, which it selects unless its spec says otherwise).
    pub fn add_nvidia_driver(&mut self, name: &str, mut spec: NVIDIADriverSpec, nodes: &[&str]) {
        // The driver selects its nodes by a pool label of their own, as the operator routes them.
        if spec.node_selector.is_none() && !spec.default {
            spec.node_selector = Some(BTreeMap::from([("pool".to_owned(), name.to_owned())]));
        }
        let mut driver = NVIDIADriver::new(name, spec);
        driver.metadata.uid = Some(format!("uid-nvidiadriver-{name}"));
        self.nvidia_drivers.push(driver);
        let mut daemon_set = operand_daemon_set(Operand::Driver.info(), &ClusterPolicySpec::default());
        let ds_name = format!("nvidia-gpu-driver-ubuntu22.04-{name}");
        daemon_set.metadata.name = Some(ds_name.clone());
        daemon_set.metadata.uid = Some(format!("uid-{ds_name}"));
        daemon_set
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(NVIDIA_DRIVER_NAME.to_owned(), name.to_owned());
        for node in nodes {
            self.pods.retain(|pod| {
                !(pod.spec.node_name.as_deref() == Some(*node)
                    && pod.metadata.labels.get(COMPONENT).map(String::as_str)
                        == Some(Operand::Driver.info().component))
            });
            self.pods.push(daemon_pod(&daemon_set, node));
            if let Some(found) = self.node_mut(node) {
                let routed = std::mem::take(found)
                    .with_label(DRIVER_OWNER, name)
                    .with_label("pool", name);
                *found = routed;
            }
        }
        self.controller_revisions.push(revision_of(&daemon_set));
        self.daemon_sets.push(daemon_set);
    }

    /// A node, to change it.
    pub fn node_mut(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_converged_cluster_follows_the_catalogue() {
        let snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01").mig_capable())
            .with_node(Node::cpu("cpu-01"))
            .build();
        // Default policy: every operand enabled by default has a DaemonSet.
        let names: Vec<_> = snapshot
            .daemon_sets
            .iter()
            .filter_map(|d| d.metadata.name.as_deref())
            .collect();
        assert!(names.contains(&"nvidia-device-plugin-daemonset"));
        assert!(names.contains(&"nvidia-mig-manager"));
        assert!(
            !names.contains(&"nvidia-node-status-exporter"),
            "disabled by default"
        );
        // The GPU node runs every operand but MPS (not MPS-capable); the CPU node none.
        let on_gpu: Vec<_> = snapshot
            .pods
            .iter()
            .filter(|p| p.target_node() == Some("a100-01"))
            .collect();
        assert_eq!(on_gpu.len(), names.len() - 1);
        assert!(snapshot.pod_of(Operand::MpsControlDaemon, "a100-01").is_none());
        assert!(snapshot.pods.iter().all(|p| p.target_node() != Some("cpu-01")));
        let validator = snapshot.pod_of(Operand::OperatorValidator, "a100-01").unwrap();
        let steps: Vec<_> = validator
            .spec
            .init_containers
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            steps,
            [
                "driver-validation",
                "toolkit-validation",
                "plugin-validation",
                "cuda-validation"
            ]
        );
    }
}
