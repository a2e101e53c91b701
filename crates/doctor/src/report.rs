//! The doctor's verdict: per node, the operands expected there and their state, the seven checks of the
//! node contract, and the findings. Serialized, this is the documented JSON schema of `kubectl gpu doctor
//! -o json` (`docs/doctor.md`); field and value names here are a stable interface.
//!
//! Findings are problems only: a healthy node has none. Notes say what is true and worth knowing but not
//! wrong (a driver installed on the host, an upgrade in progress, what the API cannot show).

use std::fmt;

use gpuop_api::Operand;
use serde::{Serialize, Serializer};

use crate::pod_state::StateName;

/// Version of the JSON schema; changes only when a field changes meaning or disappears.
pub const SCHEMA: &str = "gpu-doctor/v1";

/// A link of the chain through which a GPU reaches a container, in chain order. The first broken link on a
/// node is the earliest link any of its findings names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Link {
    /// The NVIDIA driver on the host.
    #[serde(rename = "driver")]
    Driver,
    /// The container runtime wired for NVIDIA GPUs (toolkit, CDI specs, RuntimeClass).
    #[serde(rename = "toolkit")]
    Toolkit,
    /// The device plugin advertising GPUs in the node's allocatable.
    #[serde(rename = "device-plugin")]
    DevicePlugin,
    /// Pods being placed on the node (labels, taints, readiness, cordon).
    #[serde(rename = "scheduling")]
    Scheduling,
    /// CUDA working inside a container.
    #[serde(rename = "cuda")]
    Cuda,
    /// GPU health and monitoring.
    #[serde(rename = "health")]
    Health,
}

impl Link {
    /// The link as a person reads it in the chain `driver -> toolkit/CDI -> device plugin/allocatable ->
    /// scheduling -> CUDA in the container -> health`.
    pub fn title(self) -> &'static str {
        match self {
            Link::Driver => "driver",
            Link::Toolkit => "toolkit/CDI",
            Link::DevicePlugin => "device plugin/allocatable",
            Link::Scheduling => "scheduling",
            Link::Cuda => "CUDA in the container",
            Link::Health => "health",
        }
    }

    /// The link an operand serves.
    pub fn of(operand: Operand) -> Link {
        use Operand::*;
        match operand {
            Driver | VgpuManager | VfioManager | CcManager => Link::Driver,
            ContainerToolkit => Link::Toolkit,
            DevicePlugin
            | MpsControlDaemon
            | MigManager
            | VgpuDeviceManager
            | SandboxDevicePlugin
            | KataSandboxDevicePlugin => Link::DevicePlugin,
            GpuFeatureDiscovery => Link::Scheduling,
            OperatorValidator | SandboxValidator => Link::Cuda,
            Dcgm | DcgmExporter | NodeStatusExporter => Link::Health,
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.title())
    }
}

/// The seven checks of the node contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// The driver is ready (or installed on the host), and which version.
    Host,
    /// The container toolkit is ready and the RuntimeClass exists.
    Runtime,
    /// Allocatable GPUs or MIG devices agree with the GPU count, sharing replicas and MIG strategy.
    Resource,
    /// Product, MIG strategy and deploy-switch labels are there and agree with the policy.
    Labels,
    /// The validator proved CUDA and the device plugin work on the node.
    PositivePlacement,
    /// Nodes without GPUs advertise none and run no operands; no operand runs where it is not placed.
    NegativePlacement,
    /// The exporter is ready, the node is Ready and schedulable, and no upgrade failed.
    Operations,
}

impl Check {
    /// All checks, in the order they are reported.
    pub const ALL: [Check; 7] = [
        Check::Host,
        Check::Runtime,
        Check::Resource,
        Check::Labels,
        Check::PositivePlacement,
        Check::NegativePlacement,
        Check::Operations,
    ];

    /// The check an operand's pods count towards.
    pub fn of(operand: Operand) -> Check {
        use Operand::*;
        match operand {
            Driver | VgpuManager | VfioManager | CcManager => Check::Host,
            ContainerToolkit => Check::Runtime,
            DevicePlugin
            | MpsControlDaemon
            | MigManager
            | VgpuDeviceManager
            | SandboxDevicePlugin
            | KataSandboxDevicePlugin => Check::Resource,
            GpuFeatureDiscovery => Check::Labels,
            OperatorValidator | SandboxValidator => Check::PositivePlacement,
            Dcgm | DcgmExporter | NodeStatusExporter => Check::Operations,
        }
    }

    /// The check's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Check::Host => "host",
            Check::Runtime => "runtime",
            Check::Resource => "resource",
            Check::Labels => "labels",
            Check::PositivePlacement => "positive-placement",
            Check::NegativePlacement => "negative-placement",
            Check::Operations => "operations",
        }
    }
}

/// What kind of problem a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// The operand should run on the node and no pod of it is there.
    Missing,
    /// An operand pod runs where it should not: its DaemonSet no longer selects the node, or the node has
    /// no GPU.
    Unexpected,
    /// The operand's pod is there but not running and ready.
    NotReady,
    /// The node matches the operand's selectors but a taint it does not tolerate keeps it out, so the
    /// DaemonSet does not even count the node.
    Excluded,
    /// An operand runs while an operand it requires on the node is missing or not ready.
    Order,
    /// The node advertises GPUs while the container toolkit is not ready: pods schedule and get no GPU.
    GpuWithoutRuntime,
    /// Two DaemonSets of the same operand select the node.
    Conflict,
    /// A node-contract check failed for a reason other than an operand's pod.
    Contract,
}

impl FindingKind {
    /// The kind's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            FindingKind::Missing => "missing",
            FindingKind::Unexpected => "unexpected",
            FindingKind::NotReady => "not-ready",
            FindingKind::Excluded => "excluded",
            FindingKind::Order => "order",
            FindingKind::GpuWithoutRuntime => "gpu-without-runtime",
            FindingKind::Conflict => "conflict",
            FindingKind::Contract => "contract",
        }
    }
}

/// One problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// What kind of problem.
    pub kind: FindingKind,
    /// The operand concerned, when one is.
    #[serde(serialize_with = "operand_id", skip_serializing_if = "Option::is_none")]
    pub operand: Option<Operand>,
    /// The node-contract check it fails.
    pub check: Check,
    /// The link of the chain it breaks.
    pub link: Link,
    /// What is wrong, in a sentence that names the objects.
    pub message: String,
    /// The pod concerned (`namespace/name`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Whether a check passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckStatus {
    /// Everything the API shows agrees.
    Pass,
    /// Some finding fails it.
    Fail,
    /// The API does not show enough to say.
    Unknown,
    /// Does not apply to this node (a node without GPUs has no driver to check).
    NotApplicable,
}

/// The outcome of one check on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Which check.
    pub check: Check,
    /// Its outcome.
    pub status: CheckStatus,
    /// Why, in a sentence.
    pub message: String,
}

/// Whether and why a node should run an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expectation {
    /// Its DaemonSet places a pod on the node.
    Expected,
    /// Its DaemonSet's selectors match the node but a taint keeps it out.
    Excluded,
    /// Its DaemonSet does not select the node.
    NotSelected,
    /// The ClusterPolicy enables it and the node's labels select it, but no DaemonSet exists.
    NoDaemonSet,
}

/// One operand on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperandOnNode {
    /// The operand.
    #[serde(serialize_with = "operand_id_required")]
    pub operand: Operand,
    /// Its DaemonSet (`namespace/name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_set: Option<String>,
    /// Whether it should run here.
    pub placement: Expectation,
    /// The state of its pod here (`absent` when there is none).
    pub state: StateName,
    /// Whether it counts as ready here, by the rule of the ClusterPolicy's status: its pod is Ready, not
    /// being deleted, and of its DaemonSet's latest revision.
    pub ready: bool,
    /// The state as `kubectl get pods` shows it (`Init:1/4`, `CrashLoopBackOff`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Its pod (`namespace/name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Why, where the objects show it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The verdict on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Node name.
    pub name: String,
    /// Whether the node has an NVIDIA GPU.
    pub gpu: bool,
    /// What that judgement rests on (NFD's PCI label, `nvidia.com/gpu.present`).
    pub gpu_evidence: String,
    /// Workload config (`container`, `vm-passthrough`, `vm-vgpu`) of a GPU node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// GPU resources the node reports (non-zero on at least one side).
    pub advertised: Vec<Advertised>,
    /// The earliest link any finding names; `null` when there are none.
    pub first_broken_link: Option<Link>,
    /// Operands expected here, excluded from here, or running here, in catalogue (chain) order.
    pub operands: Vec<OperandOnNode>,
    /// The seven node-contract checks, in order.
    pub checks: Vec<CheckResult>,
    /// Problems, earliest link first.
    pub findings: Vec<Finding>,
    /// Things worth knowing that are not problems.
    pub notes: Vec<String>,
}

/// One GPU resource of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Advertised {
    /// `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, ...
    pub resource: String,
    /// In the node's capacity.
    pub capacity: i64,
    /// In its allocatable (less than capacity when devices are unhealthy).
    pub allocatable: i64,
}

/// Counts over the whole report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Nodes judged.
    pub nodes: usize,
    /// Of which with a GPU.
    pub gpu_nodes: usize,
    /// Nodes with at least one finding.
    pub nodes_with_findings: usize,
    /// Findings, on nodes and cluster-wide.
    pub findings: usize,
}

/// The doctor's verdict on a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// The ClusterPolicy the verdict follows, when there is one.
    pub cluster_policy: Option<String>,
    /// Counts.
    pub summary: Summary,
    /// Problems not tied to a node in the snapshot.
    pub findings: Vec<Finding>,
    /// Cluster-wide notes.
    pub notes: Vec<String>,
    /// Every node, by name.
    pub nodes: Vec<NodeReport>,
}

impl Report {
    /// Whether there is any finding.
    pub fn has_findings(&self) -> bool {
        !self.findings.is_empty() || self.nodes.iter().any(|node| !node.findings.is_empty())
    }

    /// Keeps only the named node (cluster-wide findings go too), recounting the summary.
    pub fn retain_node(&mut self, name: &str) -> bool {
        self.nodes.retain(|node| node.name == name);
        self.findings.clear();
        self.summary = Summary::of(&self.nodes, &self.findings);
        !self.nodes.is_empty()
    }
}

impl Summary {
    /// Counts over these nodes and cluster-wide findings.
    pub fn of(nodes: &[NodeReport], findings: &[Finding]) -> Summary {
        Summary {
            nodes: nodes.len(),
            gpu_nodes: nodes.iter().filter(|n| n.gpu).count(),
            nodes_with_findings: nodes.iter().filter(|n| !n.findings.is_empty()).count(),
            findings: findings.len() + nodes.iter().map(|n| n.findings.len()).sum::<usize>(),
        }
    }
}

fn operand_id<S: Serializer>(operand: &Option<Operand>, serializer: S) -> Result<S::Ok, S::Error> {
    match operand {
        Some(operand) => serializer.serialize_str(operand.id()),
        None => serializer.serialize_none(),
    }
}

fn operand_id_required<S: Serializer>(operand: &Operand, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(operand.id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operand_has_a_link_and_a_check_in_chain_order() {
        // The driver's link comes first and the exporters' last, as the chain reads.
        assert!(Link::of(Operand::Driver) < Link::of(Operand::ContainerToolkit));
        assert!(Link::of(Operand::ContainerToolkit) < Link::of(Operand::DevicePlugin));
        assert!(Link::of(Operand::DevicePlugin) < Link::of(Operand::OperatorValidator));
        assert!(Link::of(Operand::OperatorValidator) < Link::of(Operand::DcgmExporter));
        for operand in Operand::all() {
            // Every operand is judged under some check (the match is exhaustive; this pins a few).
            let _ = Check::of(operand);
        }
        assert_eq!(Check::of(Operand::ContainerToolkit), Check::Runtime);
        assert_eq!(Check::of(Operand::OperatorValidator), Check::PositivePlacement);
    }

    #[test]
    fn json_names_are_the_documented_ones() {
        let finding = Finding {
            kind: FindingKind::GpuWithoutRuntime,
            operand: Some(Operand::ContainerToolkit),
            check: Check::Runtime,
            link: Link::Toolkit,
            message: "m".to_owned(),
            pod: None,
        };
        assert_eq!(
            serde_json::to_value(&finding).unwrap(),
            serde_json::json!({"kind": "gpu-without-runtime", "operand": "container-toolkit",
                "check": "runtime", "link": "toolkit", "message": "m"})
        );
        for kind in [
            FindingKind::Missing,
            FindingKind::Unexpected,
            FindingKind::NotReady,
            FindingKind::Excluded,
            FindingKind::Order,
            FindingKind::GpuWithoutRuntime,
            FindingKind::Conflict,
            FindingKind::Contract,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
        }
        for check in Check::ALL {
            assert_eq!(serde_json::to_value(check).unwrap(), check.name());
        }
    }
}
