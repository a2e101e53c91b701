//! What the doctor reads from a cluster: nodes, operand DaemonSets, pods, RuntimeClasses and ClusterPolicies;
//! for the upgrade plan also NVIDIADrivers, the driver DaemonSets' ControllerRevisions and
//! PodDisruptionBudgets.
//!
//! Nodes, DaemonSets and RuntimeClasses are Kubernetes' own types, trimmed on the way in to the fields the
//! doctor reads (a node's image list or a pod template's environment are dropped), so that the placement
//! rules in [`gpuop_api::placement`] apply to them unchanged. Pods are the bulk of a large cluster (ten per
//! GPU node), so they are kept as [`PodFacts`], a projection with the same JSON shape as a Pod that
//! holds only what the doctor reads; [`PodFacts::to_pod`] turns it back into a Pod for the rules of
//! [`gpuop_api::upgrade::observe`]. Serialized, a snapshot is a `v1 List` that `kubectl` and the file
//! loader read alike.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use gpuop_api::driver::DRIVER_CONFIG_DIGEST;
use gpuop_api::labels::NVIDIA_PREFIX;
use gpuop_api::read::{PodRead, controller_uid, pod_ready_since};
use gpuop_api::{ClusterPolicy, NVIDIADriver};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerStatus, EmptyDirVolumeSource, EnvVar, Node, NodeCondition, NodeSpec,
    NodeStatus, NodeSystemInfo, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec, ResourceRequirements,
    Toleration, Volume,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer, Serialize};

/// Kinds the doctor reads; every other kind in a snapshot file is ignored.
pub const KINDS: &[&str] = &[
    "Node",
    "Pod",
    "DaemonSet",
    "RuntimeClass",
    "ClusterPolicy",
    "NVIDIADriver",
    "ControllerRevision",
    "PodDisruptionBudget",
];

/// The annotation that marks a static pod's mirror, which evicting cannot move (the kubelet owns it).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Everything the analysis looks at. Built by the file loader ([`crate::load`]), the live loader
/// ([`crate::live`]) or the fixtures ([`crate::fixture`]).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every node.
    pub nodes: Vec<Node>,
    /// DaemonSets (only operand DaemonSets matter; others are ignored by the analysis).
    pub daemon_sets: Vec<DaemonSet>,
    /// Pods: those of operand DaemonSets; for `explain`, pods that request GPUs; for the upgrade plan, every
    /// pod on a node a driver upgrade may empty.
    pub pods: Vec<PodFacts>,
    /// RuntimeClasses.
    pub runtime_classes: Vec<RuntimeClass>,
    /// ClusterPolicies.
    pub cluster_policies: Vec<ClusterPolicy>,
    /// NVIDIADrivers.
    pub nvidia_drivers: Vec<NVIDIADriver>,
    /// ControllerRevisions of driver DaemonSets (what tells an outdated driver pod), without their data.
    pub controller_revisions: Vec<ControllerRevision>,
    /// PodDisruptionBudgets: name, namespace, selector and `status.disruptionsAllowed`.
    pub disruption_budgets: Vec<PodDisruptionBudget>,
    /// Kinds known to be complete: listed as a whole from a cluster, so that "none in the snapshot" means
    /// "none in the cluster". A kind with at least one object in the snapshot counts as listed too.
    pub listed: BTreeSet<String>,
    /// What the loader wants the reader to know (objects of other kinds it ignored).
    pub notes: Vec<String>,
}

impl Snapshot {
    /// Whether the snapshot can tell that an object of this kind does not exist.
    pub fn knows_all(&self, kind: &str) -> bool {
        let has_any = match kind {
            "Node" => !self.nodes.is_empty(),
            "Pod" => !self.pods.is_empty(),
            "DaemonSet" => !self.daemon_sets.is_empty(),
            "RuntimeClass" => !self.runtime_classes.is_empty(),
            "ClusterPolicy" => !self.cluster_policies.is_empty(),
            "NVIDIADriver" => !self.nvidia_drivers.is_empty(),
            "ControllerRevision" => !self.controller_revisions.is_empty(),
            "PodDisruptionBudget" => !self.disruption_budgets.is_empty(),
            _ => false,
        };
        has_any || self.listed.contains(kind)
    }

    /// The pod with this namespace and name.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodFacts> {
        self.pods
            .iter()
            .find(|pod| pod.metadata.namespace.as_deref() == Some(namespace) && pod.metadata.name == name)
    }

    /// The node with this name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|node| node.metadata.name.as_deref() == Some(name))
    }

    /// Keeps one pod per identity (uid, or namespace and name when it has none): the one added last, in the
    /// place of the first. Pods read from several files or lists may repeat.
    pub fn dedup_pods(&mut self) {
        // Most snapshots repeat no pod: finding that out borrows the identities and moves no pod.
        let mut seen: HashSet<(&str, &str, &str)> = HashSet::with_capacity(self.pods.len());
        let repeats = !self.pods.iter().all(|pod| {
            let meta = &pod.metadata;
            seen.insert(if meta.uid.is_empty() {
                ("", meta.namespace.as_deref().unwrap_or_default(), &meta.name)
            } else {
                (&meta.uid, "", "")
            })
        });
        drop(seen);
        if !repeats {
            return;
        }
        let mut position: HashMap<(String, String, String), usize> = HashMap::with_capacity(self.pods.len());
        let mut kept: Vec<PodFacts> = Vec::with_capacity(self.pods.len());
        for pod in std::mem::take(&mut self.pods) {
            let identity = if pod.metadata.uid.is_empty() {
                (
                    String::new(),
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    pod.metadata.name.clone(),
                )
            } else {
                (pod.metadata.uid.clone(), String::new(), String::new())
            };
            match position.get(&identity) {
                Some(index) => kept[*index] = pod,
                None => {
                    position.insert(identity, kept.len());
                    kept.push(pod);
                }
            }
        }
        self.pods = kept;
    }

    /// Writes the snapshot as a `v1 List` of JSON objects, one item a line, saying which kinds it lists as a
    /// whole; `kubectl` and the file loader read it back. Written as a stream: a large snapshot is never
    /// held twice in memory.
    pub fn write_json(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let listed: Vec<&String> = self.listed.iter().collect();
        write!(
            out,
            "{{\"apiVersion\":\"v1\",\"kind\":\"List\",\"metadata\":{{}},\"{SNAPSHOT_FIELD}\":"
        )?;
        serde_json::to_writer(&mut *out, &serde_json::json!({ "listed": listed }))?;
        out.write_all(b",\"items\":[")?;
        let mut first = true;
        let mut item = |out: &mut dyn std::io::Write, value: &dyn erased::Item| -> std::io::Result<()> {
            out.write_all(if first { b"\n" } else { b",\n" })?;
            first = false;
            value.write(out)
        };
        for policy in &self.cluster_policies {
            item(out, policy)?;
        }
        for driver in &self.nvidia_drivers {
            item(out, driver)?;
        }
        for class in &self.runtime_classes {
            item(out, class)?;
        }
        for node in &self.nodes {
            item(out, node)?;
        }
        for daemon_set in &self.daemon_sets {
            item(out, daemon_set)?;
        }
        for revision in &self.controller_revisions {
            item(out, revision)?;
        }
        for budget in &self.disruption_budgets {
            item(out, budget)?;
        }
        for pod in &self.pods {
            item(
                out,
                &Tagged {
                    api_version: "v1",
                    kind: "Pod",
                    object: pod,
                },
            )?;
        }
        out.write_all(b"\n]}\n")
    }
}

/// An object with its `apiVersion` and `kind`, for projections that do not carry them.
#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    #[serde(flatten)]
    object: &'a T,
}

/// Writing differently typed items through one closure.
mod erased {
    /// Something that writes itself as one line of JSON.
    pub(super) trait Item {
        fn write(&self, out: &mut dyn std::io::Write) -> std::io::Result<()>;
    }

    impl<T: serde::Serialize> Item for T {
        fn write(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
            serde_json::to_writer(out, self).map_err(std::io::Error::from)
        }
    }
}

/// Top-level field of a snapshot file (a `v1 List`) that says which kinds it lists as a whole.
pub const SNAPSHOT_FIELD: &str = "gpuDoctorSnapshot";

/// Metadata of a pod: what identifies it and its owner.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMeta {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// UID; owner references point at a DaemonSet's UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Set when the pod is being deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
    /// Labels: PodDisruptionBudgets and the upgrade policy's pod selectors match them; driver and
    /// validator pods are known by them.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    /// Annotations: only [`MIRROR_ANNOTATION`] is kept.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    /// Owners; a DaemonSet pod has its DaemonSet as controller.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub owner_references: Vec<OwnerReference>,
}

/// A pod, projected to what the doctor reads. Same JSON shape as a Pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodFacts {
    /// Metadata.
    #[serde(default)]
    pub metadata: PodMeta,
    /// Spec.
    #[serde(default)]
    pub spec: PodSpecFacts,
    /// Status.
    #[serde(default)]
    pub status: PodStatusFacts,
}

/// The parts of a pod's spec that decide where it runs and what it asks for. Read as a Pod's spec is, except
/// that a bound pod's node selector, affinity and tolerations are skipped unread once its `nodeName` has been
/// read (the API server and `kubectl gpu snapshot` write it first): [`trim_pod`] would drop them anyway.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecFacts {
    /// The node it is bound to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Node selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// RuntimeClass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Init containers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<ContainerFacts>,
    /// Containers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<ContainerFacts>,
    /// Volumes: only emptyDir ones are kept (evicting the pod loses their data).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeFacts>,
}

impl<'de> Deserialize<'de> for PodSpecFacts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const FIELDS: &[&str] = &[
            "nodeName",
            "nodeSelector",
            "affinity",
            "tolerations",
            "runtimeClassName",
            "initContainers",
            "containers",
            "volumes",
        ];
        deserializer.deserialize_struct("PodSpecFacts", FIELDS, PodSpecVisitor)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum PodSpecField {
    NodeName,
    NodeSelector,
    Affinity,
    Tolerations,
    RuntimeClassName,
    InitContainers,
    Containers,
    Volumes,
    #[serde(other)]
    Other,
}

struct PodSpecVisitor;

impl<'de> serde::de::Visitor<'de> for PodSpecVisitor {
    type Value = PodSpecFacts;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct PodSpecFacts")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<PodSpecFacts, A::Error> {
        use serde::de::IgnoredAny;
        let mut spec = PodSpecFacts::default();
        while let Some(field) = map.next_key::<PodSpecField>()? {
            let bound = spec.node_name.as_deref().is_some_and(|n| !n.is_empty());
            match field {
                PodSpecField::NodeName => spec.node_name = map.next_value()?,
                PodSpecField::NodeSelector | PodSpecField::Affinity | PodSpecField::Tolerations if bound => {
                    map.next_value::<IgnoredAny>()?;
                }
                PodSpecField::NodeSelector => {
                    spec.node_selector = map.next_value::<Option<_>>()?.unwrap_or_default();
                }
                PodSpecField::Affinity => spec.affinity = map.next_value()?,
                PodSpecField::Tolerations => {
                    spec.tolerations = map.next_value::<Option<_>>()?.unwrap_or_default();
                }
                PodSpecField::RuntimeClassName => spec.runtime_class_name = map.next_value()?,
                PodSpecField::InitContainers => {
                    spec.init_containers = map.next_value::<Option<_>>()?.unwrap_or_default();
                }
                PodSpecField::Containers => {
                    spec.containers = map.next_value::<Option<_>>()?.unwrap_or_default();
                }
                PodSpecField::Volumes => spec.volumes = map.next_value::<Option<_>>()?.unwrap_or_default(),
                PodSpecField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(spec)
    }
}

/// An emptyDir volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeFacts {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Set for an emptyDir volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirVolumeSource>,
}

/// A container: its name and what it requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerFacts {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Environment: only the driver's `DRIVER_CONFIG_DIGEST` is kept (it tells a restart from a reinstall).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub env: Vec<EnvFacts>,
}

/// An environment variable with a literal value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvFacts {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// What the kubelet and scheduler report about a pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatusFacts {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why the pod is in this phase (e.g. `UnexpectedAdmissionError`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Details of the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions (`PodScheduled`, `Initialized`, `ContainersReady`, `Ready`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<PodConditionFacts>,
    /// Init container statuses.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub init_container_statuses: Vec<ContainerStatusFacts>,
    /// Container statuses.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub container_statuses: Vec<ContainerStatusFacts>,
}

/// One container's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatusFacts {
    /// Container name.
    #[serde(default)]
    pub name: String,
    /// Whether its readiness probe passes (or it runs without one).
    #[serde(default)]
    pub ready: bool,
    /// Restarts so far.
    #[serde(default)]
    pub restart_count: i32,
    /// What it is doing now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerStateFacts>,
    /// How it last ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<ContainerStateFacts>,
}

/// A pod condition: `PodScheduled`, `Initialized`, `ContainersReady`, `Ready`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodConditionFacts {
    /// Which condition.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Why, in a word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (since when a pod has been Ready).
    #[serde(
        rename = "lastTransitionTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub last_transition_time: Option<Time>,
}

/// A container's state; one of the three is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerStateFacts {
    /// Not running yet, or between restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitingFacts>,
    /// Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<RunningFacts>,
    /// Ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<TerminatedFacts>,
}

/// Why a container waits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitingFacts {
    /// `ContainerCreating`, `CrashLoopBackOff`, `ImagePullBackOff`, `PodInitializing`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A running container (when it started is not needed).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunningFacts {}

/// How a container ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminatedFacts {
    /// Exit code.
    #[serde(default)]
    pub exit_code: i32,
    /// `Completed`, `Error`, `OOMKilled`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The pod as the API crate's rules read it (readiness, revisions), straight from the facts kept.
impl PodRead for PodFacts {
    fn name(&self) -> &str {
        &self.metadata.name
    }

    fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.get(key).map(String::as_str)
    }

    fn terminating(&self) -> bool {
        self.is_terminating()
    }

    fn ready_since(&self) -> Option<i64> {
        pod_ready_since(
            self.status.phase.as_deref(),
            self.status.conditions.iter().map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.last_transition_time.as_ref().map(|t| t.0.as_second()),
                )
            }),
        )
    }

    fn daemonset_uid(&self) -> Option<&str> {
        controller_uid(&self.metadata.owner_references, "DaemonSet")
    }

    fn driver_digest(&self) -> Option<&str> {
        self.spec
            .containers
            .iter()
            .flat_map(|c| &c.env)
            .find(|e| e.name == DRIVER_CONFIG_DIGEST)
            .and_then(|e| e.value.as_deref())
    }

    fn restarts(&self) -> i32 {
        self.status
            .container_statuses
            .iter()
            .map(|s| s.restart_count)
            .max()
            .unwrap_or(0)
    }
}

impl PodFacts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name
        )
    }

    /// The node the pod is on, or, for a DaemonSet pod the scheduler has not bound yet, the node its
    /// required node affinity pins it to (`matchFields metadata.name In [node]`).
    pub fn target_node(&self) -> Option<&str> {
        if let Some(node) = self.spec.node_name.as_deref().filter(|n| !n.is_empty()) {
            return Some(node);
        }
        let terms = &self
            .spec
            .affinity
            .as_ref()?
            .node_affinity
            .as_ref()?
            .required_during_scheduling_ignored_during_execution
            .as_ref()?
            .node_selector_terms;
        let [term] = terms.as_slice() else {
            return None;
        };
        term.match_fields.iter().flatten().find_map(|field| {
            let values = field.values.as_deref().unwrap_or_default();
            match (field.key.as_str(), field.operator.as_str(), values) {
                ("metadata.name", "In", [node]) => Some(node.as_str()),
                _ => None,
            }
        })
    }

    /// Whether the pod is being deleted.
    pub fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// Whether the pod has finished for good (`Succeeded` or `Failed`).
    pub fn is_finished(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// The pod as Kubernetes' type, holding what the projection keeps, for the rules of
    /// [`gpuop_api::upgrade::observe`] (driver pods, validators, workloads).
    pub fn to_pod(&self) -> Pod {
        let map = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
        let container = |c: &ContainerFacts| Container {
            name: c.name.clone(),
            resources: c.resources.clone(),
            env: (!c.env.is_empty()).then(|| {
                c.env
                    .iter()
                    .map(|e| EnvVar {
                        name: e.name.clone(),
                        value: e.value.clone(),
                        value_from: None,
                    })
                    .collect()
            }),
            ..Container::default()
        };
        let meta = &self.metadata;
        Pod {
            metadata: ObjectMeta {
                name: Some(meta.name.clone()),
                namespace: meta.namespace.clone(),
                uid: (!meta.uid.is_empty()).then(|| meta.uid.clone()),
                labels: map(&meta.labels),
                annotations: map(&meta.annotations),
                owner_references: (!meta.owner_references.is_empty()).then(|| meta.owner_references.clone()),
                // Only whether it is set matters to the rules.
                deletion_timestamp: meta
                    .deletion_timestamp
                    .as_ref()
                    .map(|text| Time(text.parse().unwrap_or(jiff::Timestamp::UNIX_EPOCH))),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: self.spec.node_name.clone(),
                containers: self.spec.containers.iter().map(container).collect(),
                init_containers: (!self.spec.init_containers.is_empty())
                    .then(|| self.spec.init_containers.iter().map(container).collect()),
                volumes: (!self.spec.volumes.is_empty()).then(|| {
                    self.spec
                        .volumes
                        .iter()
                        .map(|v| Volume {
                            name: v.name.clone(),
                            empty_dir: v.empty_dir.clone(),
                            ..Volume::default()
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: self.status.phase.clone(),
                conditions: Some(
                    self.status
                        .conditions
                        .iter()
                        .map(|c| PodCondition {
                            type_: c.type_.clone(),
                            status: c.status.clone(),
                            reason: c.reason.clone(),
                            message: c.message.clone(),
                            last_transition_time: c.last_transition_time.clone(),
                            ..PodCondition::default()
                        })
                        .collect(),
                ),
                container_statuses: Some(
                    self.status
                        .container_statuses
                        .iter()
                        .map(|c| ContainerStatus {
                            name: c.name.clone(),
                            ready: c.ready,
                            restart_count: c.restart_count,
                            ..ContainerStatus::default()
                        })
                        .collect(),
                ),
                ..PodStatus::default()
            }),
        }
    }

    /// The spec fields the placement rules read, as a Kubernetes `PodSpec`.
    pub fn placement_spec(&self) -> PodSpec {
        PodSpec {
            node_name: self.spec.node_name.clone(),
            node_selector: (!self.spec.node_selector.is_empty()).then(|| self.spec.node_selector.clone()),
            affinity: self.spec.affinity.clone(),
            tolerations: Some(self.spec.tolerations.clone()),
            ..PodSpec::default()
        }
    }
}

/// Drops what the doctor never reads from a pod: where a pod may go matters only while it is not bound;
/// of its annotations, environment and volumes only what an eviction or a driver upgrade turns on.
pub fn trim_pod(pod: &mut PodFacts) {
    pod.metadata.annotations.retain(|key, _| key == MIRROR_ANNOTATION);
    for container in pod
        .spec
        .containers
        .iter_mut()
        .chain(&mut pod.spec.init_containers)
    {
        container.env.retain(|e| e.name == DRIVER_CONFIG_DIGEST);
    }
    pod.spec.volumes.retain(|v| v.empty_dir.is_some());
    if pod.spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        pod.spec.affinity = None;
        pod.spec.tolerations = Vec::new();
        pod.spec.node_selector = BTreeMap::new();
    }
    // Read from JSON text, a list has no known length and grows to a spare capacity (four places for one
    // container): across a cluster's pods that is more memory than the pods hold.
    pod.metadata.owner_references.shrink_to_fit();
    for container in pod
        .spec
        .containers
        .iter_mut()
        .chain(&mut pod.spec.init_containers)
    {
        container.env.shrink_to_fit();
    }
    pod.spec.containers.shrink_to_fit();
    pod.spec.init_containers.shrink_to_fit();
    pod.spec.volumes.shrink_to_fit();
    pod.spec.tolerations.shrink_to_fit();
    pod.status.conditions.shrink_to_fit();
    pod.status.init_container_statuses.shrink_to_fit();
    pod.status.container_statuses.shrink_to_fit();
}

/// Drops what the doctor never reads from a node: images, volumes, managed fields, most annotations.
pub fn trim_node(node: &mut Node) {
    trim_meta(&mut node.metadata);
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            allocatable: status.allocatable.take(),
            capacity: status.capacity.take(),
            conditions: status.conditions.take().map(shrunk),
            node_info: status.node_info.take(),
            ..NodeStatus::default()
        };
    }
    if let Some(spec) = node.spec.as_mut() {
        spec.taints = spec.taints.take().map(shrunk);
    }
}

/// A list without spare capacity (see [`trim_pod`]).
fn shrunk<T>(mut list: Vec<T>) -> Vec<T> {
    list.shrink_to_fit();
    list
}

/// A node as the loaders read it: its status keeps what [`trim_node`] keeps and its metadata has no managed
/// fields, so the image list, volumes and managed fields of a real node are skipped while reading instead of
/// being built and dropped. [`NodeIn::into_node`] gives the trimmed Node. Like Kubernetes' own type, an
/// `apiVersion` other than `v1` is refused; `kind` is the loader's business.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeIn {
    #[serde(default, rename = "apiVersion", deserialize_with = "core_v1")]
    _api_version: (),
    #[serde(default)]
    metadata: Option<MetaIn>,
    #[serde(default)]
    spec: Option<NodeSpec>,
    #[serde(default)]
    status: Option<NodeStatusIn>,
}

/// The parts of a node's status the doctor reads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStatusIn {
    #[serde(default)]
    allocatable: Option<BTreeMap<String, Quantity>>,
    #[serde(default)]
    capacity: Option<BTreeMap<String, Quantity>>,
    #[serde(default)]
    conditions: Option<Vec<NodeCondition>>,
    #[serde(default)]
    node_info: Option<NodeSystemInfo>,
}

/// `ObjectMeta` without `managedFields`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaIn {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    self_link: Option<String>,
    #[serde(default)]
    uid: Option<String>,
}

impl From<MetaIn> for ObjectMeta {
    fn from(meta: MetaIn) -> ObjectMeta {
        ObjectMeta {
            annotations: meta.annotations,
            creation_timestamp: meta.creation_timestamp,
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            deletion_timestamp: meta.deletion_timestamp,
            finalizers: meta.finalizers,
            generate_name: meta.generate_name,
            generation: meta.generation,
            labels: meta.labels,
            managed_fields: None,
            name: meta.name,
            namespace: meta.namespace,
            owner_references: meta.owner_references,
            resource_version: meta.resource_version,
            self_link: meta.self_link,
            uid: meta.uid,
        }
    }
}

impl NodeIn {
    /// The node, trimmed as [`trim_node`] trims it.
    pub(crate) fn into_node(self) -> Node {
        let mut node = Node {
            metadata: self.metadata.map(ObjectMeta::from).unwrap_or_default(),
            spec: self.spec,
            status: self.status.map(|status| NodeStatus {
                allocatable: status.allocatable,
                capacity: status.capacity,
                conditions: status.conditions,
                node_info: status.node_info,
                ..NodeStatus::default()
            }),
        };
        trim_node(&mut node);
        node
    }
}

/// Refuses an `apiVersion` other than `v1`, in Kubernetes' words.
fn core_v1<'de, D: Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    let version = String::deserialize(deserializer)?;
    if version == "v1" {
        Ok(())
    } else {
        Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(&version),
            &"v1",
        ))
    }
}

/// Drops what the doctor never reads from a DaemonSet: its pod template keeps placement, runtime class and
/// container names only.
pub fn trim_daemon_set(daemon_set: &mut DaemonSet) {
    trim_meta(&mut daemon_set.metadata);
    if let Some(spec) = daemon_set.spec.as_mut() {
        let template = std::mem::take(&mut spec.template);
        let pod_spec = template.spec.map(|pod| PodSpec {
            node_name: pod.node_name,
            node_selector: pod.node_selector,
            affinity: pod.affinity,
            tolerations: pod.tolerations,
            runtime_class_name: pod.runtime_class_name,
            host_network: pod.host_network,
            init_containers: pod
                .init_containers
                .map(|containers| containers.into_iter().map(trim_container).collect()),
            containers: pod.containers.into_iter().map(trim_container).collect(),
            ..PodSpec::default()
        });
        *spec = DaemonSetSpec {
            selector: std::mem::take(&mut spec.selector),
            template: PodTemplateSpec {
                metadata: template.metadata.map(|meta| ObjectMeta {
                    labels: meta.labels,
                    ..ObjectMeta::default()
                }),
                spec: pod_spec,
            },
            update_strategy: spec.update_strategy.take(),
            ..DaemonSetSpec::default()
        };
    }
}

/// Keeps a container's name and image, and of its environment `DRIVER_CONFIG_DIGEST` (the driver pod's
/// digest is compared with it to tell a restart from a reinstall).
fn trim_container(container: Container) -> Container {
    let env: Option<Vec<EnvVar>> = container
        .env
        .map(|env| {
            env.into_iter()
                .filter(|e| e.name == DRIVER_CONFIG_DIGEST)
                .collect()
        })
        .filter(|env: &Vec<EnvVar>| !env.is_empty());
    Container {
        name: container.name,
        image: container.image,
        env,
        ..Default::default()
    }
}

/// Keeps what tells a DaemonSet's latest revision: owner, revision number and `controller-revision-hash`.
/// The data (a whole pod template) goes.
pub fn trim_revision(revision: &mut ControllerRevision) {
    let meta = std::mem::take(&mut revision.metadata);
    revision.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        labels: meta.labels.map(|labels| {
            labels
                .into_iter()
                .filter(|(key, _)| key == gpuop_api::upgrade::observe::REVISION_HASH)
                .collect()
        }),
        owner_references: meta.owner_references,
        ..ObjectMeta::default()
    };
    revision.data = None;
}

/// Keeps a PodDisruptionBudget's name, namespace, selector and `status.disruptionsAllowed`.
pub fn trim_disruption_budget(budget: &mut PodDisruptionBudget) {
    let meta = std::mem::take(&mut budget.metadata);
    budget.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        ..ObjectMeta::default()
    };
    budget.spec = budget.spec.take().map(|spec| PodDisruptionBudgetSpec {
        selector: spec.selector,
        ..PodDisruptionBudgetSpec::default()
    });
    budget.status = budget.status.take().map(|status| PodDisruptionBudgetStatus {
        disruptions_allowed: status.disruptions_allowed,
        ..PodDisruptionBudgetStatus::default()
    });
}

fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        // Only NVIDIA's annotations (upgrade state) may matter; others can be large.
        annotations.retain(|key, _| key.starts_with(NVIDIA_PREFIX));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Deserializes `null` as the default value, as Kubernetes clients do for absent lists and maps.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_read_twice_is_kept_once_as_last_read_in_its_first_place() {
        let pod = |uid: &str, name: &str, node: &str| {
            let mut pod = PodFacts::workload("ml", name).running_on(node);
            pod.metadata.uid = uid.to_owned();
            pod
        };
        let mut snapshot = Snapshot {
            pods: vec![pod("u1", "a", "n1"), pod("", "b", "n1"), pod("u2", "c", "n1")],
            ..Snapshot::default()
        };
        snapshot.dedup_pods();
        assert_eq!(snapshot.pods.len(), 3, "no repeat, nothing dropped");
        snapshot
            .pods
            .extend([pod("u1", "a", "n2"), pod("", "b", "n3"), pod("u3", "b", "n4")]);
        snapshot.dedup_pods();
        let kept: Vec<(&str, Option<&str>)> = snapshot
            .pods
            .iter()
            .map(|p| (p.metadata.name.as_str(), p.spec.node_name.as_deref()))
            .collect();
        assert_eq!(
            kept,
            [
                ("a", Some("n2")),
                ("b", Some("n3")),
                ("c", Some("n1")),
                ("b", Some("n4"))
            ],
            "by uid, or by namespace and name without one"
        );
    }

    #[test]
    fn a_bound_pods_placement_after_its_node_name_is_skipped_unread() {
        // As the API server and `kubectl gpu snapshot` write a pod: the node name first.
        let spec: PodSpecFacts = serde_json::from_str(
            r#"{"nodeName": "a100-01", "affinity": {"nodeAffinity": 5}, "tolerations": "x",
                "nodeSelector": [1], "containers": [{"name": "plugin"}], "runtimeClassName": "nvidia"}"#,
        )
        .unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("a100-01"));
        assert!(spec.affinity.is_none() && spec.tolerations.is_empty() && spec.node_selector.is_empty());
        assert_eq!(spec.containers[0].name, "plugin");
        assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
        // As kubectl writes it (keys sorted), the placement comes first and is read; so it is for a pod
        // not bound yet, and an error in it names the field.
        let error =
            serde_json::from_str::<PodSpecFacts>(r#"{"affinity": {"nodeAffinity": 5}, "nodeName": "a"}"#)
                .unwrap_err()
                .to_string();
        assert!(error.contains("expected NodeAffinity"), "{error}");
        let spec: PodSpecFacts = serde_json::from_str(
            r#"{"nodeName": "", "tolerations": [{"key": "k", "operator": "Exists"}], "nodeSelector": null}"#,
        )
        .unwrap();
        assert_eq!(spec.tolerations.len(), 1, "not bound: read");
        let error = serde_json::from_str::<PodSpecFacts>(r#"{"containers": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("invalid type: integer `5`, expected a sequence"),
            "{error}"
        );
    }

    #[test]
    fn a_pod_reads_from_kubectl_json_and_keeps_only_what_the_doctor_needs() {
        let mut pod: PodFacts = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "nvidia-device-plugin-daemonset-x7k2p",
                "namespace": "gpu-operator",
                "uid": "1234",
                "labels": null,
                "managedFields": [{"manager": "kubelet"}],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "nvidia-device-plugin-daemonset", "uid": "ds-uid", "controller": true}]
            },
            "spec": {
                "nodeName": null,
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["a100-01"]}]}]}}},
                "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17",
                    "env": [{"name": "A", "value": "b"}]}],
                "volumes": [{"name": "x", "hostPath": {"path": "/"}}]
            },
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available"}]}
        }))
        .unwrap();
        trim_pod(&mut pod);
        assert_eq!(pod.key(), "gpu-operator/nvidia-device-plugin-daemonset-x7k2p");
        assert_eq!(
            pod.target_node(),
            Some("a100-01"),
            "unbound DaemonSet pods target their node"
        );
        assert_eq!(pod.spec.containers[0].name, "plugin");
        let written = serde_json::to_value(&pod).unwrap();
        assert!(written.pointer("/spec/volumes").is_none());
        assert!(written.pointer("/metadata/managedFields").is_none());
        let again: PodFacts = serde_json::from_value(written).unwrap();
        assert_eq!(again, pod, "a written pod reads back the same");
    }

    #[test]
    fn a_pod_keeps_what_the_upgrade_rules_read_and_turns_back_into_a_pod() {
        let mut pod: PodFacts = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0", "namespace": "ml", "uid": "u",
                "labels": {"app": "train"},
                "annotations": {MIRROR_ANNOTATION: "x", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train",
                    "uid": "rs", "controller": true}]},
            "spec": {"nodeName": "a100-01",
                "containers": [{"name": "main", "env": [{"name": "HOME", "value": "/root"},
                        {"name": DRIVER_CONFIG_DIGEST, "value": "42"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "data", "hostPath": {"path": "/"}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:10Z"}]}
        }))
        .unwrap();
        trim_pod(&mut pod);
        assert_eq!(
            pod.metadata.annotations.len(),
            1,
            "only the mirror annotation stays"
        );
        assert_eq!(pod.spec.containers[0].env.len(), 1, "only the digest stays");
        assert_eq!(pod.spec.volumes.len(), 1, "only emptyDir volumes stay");
        let written = serde_json::to_value(&pod).unwrap();
        let again: PodFacts = serde_json::from_value(written).unwrap();
        assert_eq!(again, pod, "a written pod reads back the same");

        let seen = gpuop_api::upgrade::observe::workload_pod(&pod.to_pod());
        assert!(seen.uses_gpu && seen.controlled && seen.empty_dir && seen.terminating);
        assert!(seen.daemon, "a mirror pod is the kubelet's");
        assert_eq!(seen.labels["app"], "train");
        pod.metadata.deletion_timestamp = None;
        assert_eq!(
            gpuop_api::read::PodRead::ready_since(&pod.to_pod()),
            Some(1_767_225_610)
        );
    }

    #[test]
    fn trimming_keeps_placement_and_drops_bulk() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {
                "nvidia.com/gpu-driver-upgrade-enabled": "true", "flannel.alpha.coreos.com/x": "y"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"images": [{"names": ["x"], "sizeBytes": 1}],
                       "allocatable": {"nvidia.com/gpu": "8"}}
        }))
        .unwrap();
        trim_node(&mut node);
        let status = node.status.as_ref().unwrap();
        assert!(status.images.is_none());
        assert_eq!(status.allocatable.as_ref().unwrap()["nvidia.com/gpu"].0, "8");
        assert_eq!(node.metadata.annotations.as_ref().unwrap().len(), 1);
        assert_eq!(node.spec.as_ref().unwrap().taints.as_ref().unwrap().len(), 1);
    }
}
