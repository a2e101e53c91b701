//! What the doctor reads from a cluster: nodes, operand DaemonSets, pods, RuntimeClasses and ClusterPolicies.
//!
//! Nodes, DaemonSets and RuntimeClasses are Kubernetes' own types, trimmed on the way in to the fields the
//! doctor reads (a node's image list or a pod template's environment are dropped), so that the placement
//! rules in [`gpuop_api::placement`] apply to them unchanged. Pods are the bulk of a large cluster (ten per
//! GPU node), so they are kept as [`PodFacts`], a projection with the same JSON shape as a Pod that
//! holds only what the doctor reads. Serialized, a snapshot is a `v1 List` that `kubectl` and the file
//! loader read alike.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpuop_api::ClusterPolicy;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeStatus, PodSpec, PodTemplateSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Deserializer, Serialize};

/// Kinds the doctor reads; every other kind in a snapshot file is ignored.
pub const KINDS: &[&str] = &["Node", "Pod", "DaemonSet", "RuntimeClass", "ClusterPolicy"];

/// Everything the analysis looks at. Built by the file loader ([`crate::load`]), the live loader
/// ([`crate::live`]) or the fixtures ([`crate::fixture`]).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every node.
    pub nodes: Vec<Node>,
    /// DaemonSets (only operand DaemonSets matter; others are ignored by the analysis).
    pub daemon_sets: Vec<DaemonSet>,
    /// Pods: those of operand DaemonSets, and for `explain`, pods that request GPUs.
    pub pods: Vec<PodFacts>,
    /// RuntimeClasses.
    pub runtime_classes: Vec<RuntimeClass>,
    /// ClusterPolicies.
    pub cluster_policies: Vec<ClusterPolicy>,
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
        for class in &self.runtime_classes {
            item(out, class)?;
        }
        for node in &self.nodes {
            item(out, node)?;
        }
        for daemon_set in &self.daemon_sets {
            item(out, daemon_set)?;
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

/// The parts of a pod's spec that decide where it runs and what it asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecFacts {
    /// The node it is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Node selector.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tolerations: Vec<Toleration>,
    /// RuntimeClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Init containers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub init_containers: Vec<ContainerFacts>,
    /// Containers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub containers: Vec<ContainerFacts>,
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

/// Drops what the doctor never reads from a pod: where a pod may go matters only while it is not bound.
pub fn trim_pod(pod: &mut PodFacts) {
    if pod.spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        pod.spec.affinity = None;
        pod.spec.tolerations = Vec::new();
        pod.spec.node_selector = BTreeMap::new();
    }
}

/// Drops what the doctor never reads from a node: images, volumes, managed fields, most annotations.
pub fn trim_node(node: &mut Node) {
    trim_meta(&mut node.metadata);
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            allocatable: status.allocatable.take(),
            capacity: status.capacity.take(),
            conditions: status.conditions.take(),
            node_info: status.node_info.take(),
            ..NodeStatus::default()
        };
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

fn trim_container(container: k8s_openapi::api::core::v1::Container) -> k8s_openapi::api::core::v1::Container {
    k8s_openapi::api::core::v1::Container {
        name: container.name,
        image: container.image,
        ..Default::default()
    }
}

fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        // Only NVIDIA's annotations (upgrade state) may matter; others can be large.
        annotations.retain(|key, _| key.starts_with("nvidia.com/"));
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
    fn a_pod_reads_from_kubectl_json_and_keeps_only_what_the_doctor_needs() {
        let pod: PodFacts = serde_json::from_value(serde_json::json!({
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
