//! What the analysis and the node checks both read of one node: the operand DaemonSets, each operand's row
//! on the node (its DaemonSet, placement and pod), the node's context, and what the validator's pod shows.
//! [`crate::analysis`] builds it; [`crate::contract`] judges the node contract from it.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuop_api::choice::{SandboxMode, WorkloadConfig};
use gpuop_api::placement::Misfit;
use gpuop_api::rollout::{ready_on_latest, revision_of};
use gpuop_api::{ClusterPolicy, Operand};
use k8s_openapi::api::core::v1::{Node, PodSpec};

use crate::pod_state::{PodState, StateName, init_progress};
use crate::report::{Check, CheckResult, CheckStatus, Expectation, OperandOnNode};
use crate::resources::{Side, node_gpu_resources};
use crate::snapshot::{PodFacts, Snapshot};
use gpuop_api::labels::GpuDetection;

/// An operand DaemonSet.
pub(crate) struct OperandSet<'a> {
    pub operand: Operand,
    /// `namespace/name`.
    pub key: String,
    pub spec: &'a PodSpec,
    /// The hash of its latest ControllerRevision, when the snapshot holds its revisions.
    pub latest: Option<String>,
}

/// Cluster-wide facts, computed once.
pub(crate) struct Cluster<'a> {
    pub snapshot: &'a Snapshot,
    /// How GPU nodes are recognised.
    pub detection: &'a GpuDetection,
    pub policy: Option<&'a ClusterPolicy>,
    pub sets: Vec<OperandSet<'a>>,
    /// Pods of operand DaemonSets per node: (index into `sets`, pod).
    pub(crate) pods_by_node: HashMap<&'a str, Vec<(usize, &'a PodFacts)>>,
    /// Operand pods whose node could not be told.
    pub(crate) homeless: Vec<(usize, &'a PodFacts)>,
    /// Operands the policy enables that have no DaemonSet.
    pub without_daemon_set: Vec<Operand>,
    /// RuntimeClass names, when the snapshot knows them all.
    pub runtime_classes: Option<HashSet<&'a str>>,
}

/// One operand on one node, as the analysis sees it.
pub(crate) struct Row<'r> {
    pub operand: Operand,
    pub set: Option<&'r OperandSet<'r>>,
    pub expectation: Expectation,
    pub misfit: Option<Misfit>,
    pub pod: Option<&'r PodFacts>,
    pub state: Option<PodState>,
}

impl Row<'_> {
    /// Whether the operand should be (or would be, but for a taint) on the node.
    pub fn wanted(&self) -> bool {
        self.expectation != Expectation::NotSelected
    }

    /// Whether the operand is ready here, by the operator's own rule ([`ready_on_latest`]): its pod is
    /// Ready, not being deleted, and of its DaemonSet's latest revision. The status counts it the same way.
    pub fn is_ready(&self) -> bool {
        self.pod.is_some_and(|pod| ready_on_latest(pod, self.latest()))
    }

    /// The latest revision of the row's DaemonSet, when known.
    pub(crate) fn latest(&self) -> Option<&str> {
        self.set.and_then(|set| set.latest.as_deref())
    }

    /// The pod's revision, when it is not its DaemonSet's latest: its rollout has not replaced it yet.
    pub fn outdated(&self) -> Option<&str> {
        let pod = self.pod?;
        let latest = self.latest()?;
        let revision = revision_of(pod);
        (revision != Some(latest)).then_some(revision.unwrap_or("none"))
    }

    /// The state in a few words: `CrashLoopBackOff`, `missing`, `excluded by a taint`.
    pub fn state_words(&self) -> String {
        match (&self.state, self.expectation) {
            (Some(state), _) => state.to_string(),
            (None, Expectation::Excluded) => match self.misfit {
                Some(Misfit::NodeAffinity) => "kept off the node by its node affinity".to_owned(),
                _ => "kept off the node by a taint".to_owned(),
            },
            (None, Expectation::NoDaemonSet) => "missing (no DaemonSet)".to_owned(),
            (None, _) => "missing".to_owned(),
        }
    }

    pub(crate) fn summary(&self) -> OperandOnNode {
        OperandOnNode {
            operand: self.operand,
            daemon_set: self.set.map(|set| set.key.clone()),
            placement: self.expectation,
            state: self.state.as_ref().map_or(StateName::Absent, PodState::name),
            ready: self.is_ready(),
            status: self.state.as_ref().map(ToString::to_string),
            pod: self.pod.map(PodFacts::key),
            detail: self.state.as_ref().and_then(PodState::detail),
        }
    }
}

/// Everything about one node the checks read.
pub(crate) struct NodeContext<'r> {
    pub cluster: &'r Cluster<'r>,
    pub node: &'r Node,
    pub name: &'r str,
    pub labels: &'r BTreeMap<String, String>,
    pub gpu: bool,
    pub evidence: String,
    /// NFD labels the node and found no NVIDIA device.
    pub nfd_says_none: bool,
    pub workload: WorkloadConfig,
    pub mode: SandboxMode,
    pub rows: Vec<Row<'r>>,
}

impl<'r> NodeContext<'r> {
    /// Rows of one operand that are wanted here.
    pub fn wanted(&self, operand: Operand) -> impl Iterator<Item = &Row<'r>> {
        self.rows
            .iter()
            .filter(move |r| r.operand == operand && r.wanted())
    }

    /// The operand's pod here, if any (whatever its DaemonSet thinks).
    pub fn pod_of(&self, operand: Operand) -> Option<&'r PodFacts> {
        self.rows
            .iter()
            .filter(|r| r.operand == operand)
            .find_map(|r| r.pod)
    }

    pub fn label(&self, key: &str) -> Option<&'r str> {
        self.labels.get(key).map(String::as_str)
    }

    /// Non-zero GPU resources on one side.
    pub fn gpu_resources(&self, side: Side) -> BTreeMap<String, i64> {
        node_gpu_resources(self.node, side)
    }
}

/// The init container that waits for (or, in the validator, writes) a status file: `toolkit-ready` ->
/// `toolkit-validation`, NVIDIA's naming.
pub fn validation_container(file: &str) -> String {
    format!("{}-validation", file.trim_end_matches("-ready"))
}

/// What a validator pod shows about one validation (status file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Validation {
    /// Its init container finished successfully.
    Passed,
    /// Its init container is the one the pod is stuck in, and it fails or waits: why.
    Failing(String),
    /// The pod has not got that far, or has no such init container, or there is no validator pod.
    Unknown,
}

/// What the validator's pod on the node shows about the validation that writes `file`.
pub(crate) fn validation(context: &NodeContext<'_>, file: &str) -> Validation {
    let Some(pod) = context.pod_of(Operand::OperatorValidator) else {
        return Validation::Unknown;
    };
    let container = validation_container(file);
    match crate::pod_state::init_container_passed(pod, &container) {
        Some(true) => Validation::Passed,
        Some(false) => match init_progress(pod) {
            Some(progress) if progress.current.as_deref() == Some(container.as_str()) => {
                let state = PodState::of(pod);
                Validation::Failing(format!(
                    "validator pod {} is {state}{}",
                    pod.key(),
                    state.detail().map(|d| format!(": {d}")).unwrap_or_default()
                ))
            }
            _ => Validation::Unknown,
        },
        None => Validation::Unknown,
    }
}

/// A check that does not apply to the node, with why.
pub(crate) fn not_applicable(check: Check, why: &str) -> CheckResult {
    CheckResult {
        check,
        status: CheckStatus::NotApplicable,
        message: why.to_owned(),
    }
}
