//! Driver upgrades, node by node: the per-node state machine that NVIDIA's operator keeps in the
//! `nvidia.com/gpu-driver-upgrade-state` label and its annotations, decided by one pure function,
//! [`decide`], over what the operator's caches show. The operator carries the returned [`Step`]s out;
//! `gpu-operator upgrade plan` prints [`plan`]. Because every state lives in node labels and annotations, a
//! restarted operator resumes where the last one stopped, and NVIDIA's runbooks and dashboards keep working.
//!
//! One decision moves each node at most one state. The label values, annotations, defaults and budget
//! arithmetic are NVIDIA's (`reference/nvidia-gpu-operator.md` §4). Where this differs, it fixes a failure
//! users reported:
//! - the budget (`maxParallelUpgrades`, `maxUnavailable`) is counted once over every managed node, and each
//!   node a decision starts is counted before the next is considered, so one decision never overspends it;
//!   the caller passes its own writes that its cache has not shown yet, so two decisions cannot either;
//! - a node that was up to date by the time its turn came is marked done without being cordoned;
//! - a failed node stays `upgrade-failed` until its driver runs ready on the latest revision *and* a
//!   validator has passed since, or a person asks again (`upgrade-requested`); never a silent jump from
//!   `upgrade-failed` to `upgrade-done` (NVIDIA #2549);
//! - validation counts only a validator that became ready after the new driver did: one that was ready
//!   before the driver was replaced proves nothing about the new driver;
//! - workload pods that can never be evicted under the policy (unmanaged without `force`, emptyDir without
//!   `deleteEmptyDir`) fail the node at once, naming them, instead of after the timeout.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

pub mod observe;

use crate::NVIDIADriver;
use crate::driver::EffectiveUpgradePolicy;
use crate::labels::{
    UPGRADE_ENABLED_ANNOTATION, UPGRADE_FAILURE, UPGRADE_INITIAL_UNSCHEDULABLE, UPGRADE_REQUESTED,
    UPGRADE_RESTART_ONLY, UPGRADE_VALIDATION_START, UPGRADE_WAIT_FOR_COMPLETION_START,
    UPGRADE_WAIT_FOR_SAFE_LOAD,
};
use crate::selector::{LabelSelector, SelectorError};
use crate::validate::{IntOrPercent, ValidatedPolicy};

/// A driver pod restarting more often than this without getting ready fails the upgrade (as NVIDIA's).
pub const DRIVER_RESTART_LIMIT: i32 = 10;
/// Default seconds the validator has to pass on an upgraded node (NVIDIA hard-codes 600).
pub const DEFAULT_VALIDATION_TIMEOUT_SECONDS: u64 = 600;
/// Seconds before an eviction a PodDisruptionBudget refused is tried again.
pub const EVICTION_RETRY_SECONDS: u64 = 5;

/// A node's place in the upgrade, the value of `nvidia.com/gpu-driver-upgrade-state`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UpgradeState {
    /// No label (or one this operator does not know): not looked at yet.
    #[default]
    Unknown,
    /// The driver is outdated; the node waits for a slot in the budget.
    Required,
    /// The node is about to be cordoned.
    CordonRequired,
    /// Waiting for the pods of `waitForCompletion.podSelector` to finish.
    WaitForJobsRequired,
    /// GPU pods are being evicted.
    PodDeletionRequired,
    /// The node is being drained.
    DrainRequired,
    /// The driver pod is being replaced.
    PodRestartRequired,
    /// Waiting for the validator to pass on the new driver.
    ValidationRequired,
    /// About to be uncordoned.
    UncordonRequired,
    /// Up to date.
    Done,
    /// The upgrade failed; the node stays cordoned until it recovers or a person acts.
    Failed,
}

const STATE_LABELS: [(UpgradeState, &str); 11] = [
    (UpgradeState::Unknown, ""),
    (UpgradeState::Required, "upgrade-required"),
    (UpgradeState::CordonRequired, "cordon-required"),
    (UpgradeState::WaitForJobsRequired, "wait-for-jobs-required"),
    (UpgradeState::PodDeletionRequired, "pod-deletion-required"),
    (UpgradeState::DrainRequired, "drain-required"),
    (UpgradeState::PodRestartRequired, "pod-restart-required"),
    (UpgradeState::ValidationRequired, "validation-required"),
    (UpgradeState::UncordonRequired, "uncordon-required"),
    (UpgradeState::Done, "upgrade-done"),
    (UpgradeState::Failed, "upgrade-failed"),
];

impl UpgradeState {
    /// Every state, in the order a node passes through them.
    pub fn all() -> impl Iterator<Item = UpgradeState> {
        STATE_LABELS.iter().map(|(state, _)| *state)
    }

    /// The label value (`""` for [`UpgradeState::Unknown`]).
    pub fn label(self) -> &'static str {
        STATE_LABELS
            .iter()
            .find(|(state, _)| *state == self)
            .map_or("", |(_, label)| label)
    }

    /// The state a label value names; absent or unknown values are [`UpgradeState::Unknown`].
    pub fn from_label(value: Option<&str>) -> Self {
        value
            .and_then(|value| STATE_LABELS.iter().find(|(_, label)| *label == value))
            .map_or(UpgradeState::Unknown, |(state, _)| *state)
    }

    /// Whether the node holds a slot of `maxParallelUpgrades` (a failed node keeps its slot, so failures
    /// slow an upgrade down instead of letting it run on).
    pub fn is_in_progress(self) -> bool {
        !matches!(
            self,
            UpgradeState::Unknown | UpgradeState::Required | UpgradeState::Done
        )
    }
}

impl fmt::Display for UpgradeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpgradeState::Unknown => f.write_str("unknown"),
            state => f.write_str(state.label()),
        }
    }
}

/// How pods are evicted from a node: the `podDeletion` or `drain` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// Evict pods no controller manages (they are gone for good).
    pub force: bool,
    /// Evict pods with emptyDir volumes (their data is lost).
    pub delete_empty_dir: bool,
    /// Seconds to wait for the pods to go; 0 waits forever.
    pub timeout_seconds: u64,
}

/// An upgrade policy ready for [`decide`]: defaults applied, selectors parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpgradePolicy {
    /// Nodes upgraded at once; 0 means no limit.
    pub max_parallel: u32,
    /// Nodes that may be unavailable at once, of the managed nodes, rounded up.
    pub max_unavailable: IntOrPercent,
    /// Evicting GPU pods.
    pub pod_deletion: Eviction,
    /// Pods to wait for, and for how many seconds (0: forever).
    pub wait_for_completion: Option<(LabelSelector, u64)>,
    /// Draining, when enabled: the pods to drain and how.
    pub drain: Option<(LabelSelector, Eviction)>,
    /// Seconds the validator has to pass on an upgraded node.
    pub validation_timeout_seconds: u64,
}

/// An upgrade policy that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A pod selector does not parse.
    #[error("{field}: {source}")]
    Selector {
        /// The field.
        field: &'static str,
        /// Why.
        #[source]
        source: SelectorError,
    },
    /// `maxUnavailable` is neither a count nor a percentage.
    #[error("maxUnavailable: {0:?} must be a count like 2 or a percentage like \"25%\"")]
    MaxUnavailable(String),
}

impl UpgradePolicy {
    /// The upgrade policy of a ClusterPolicy's driver pool; `None` when its upgrades are not automatic
    /// (`autoUpgrade` off or absent, or sandbox workloads, whose state labels NVIDIA's operator removes), an
    /// error when the section cannot be used (upgrades are then paused).
    pub fn of_cluster_policy(
        policy: &ValidatedPolicy,
        validation_timeout_seconds: u64,
    ) -> Option<Result<Self, PolicyError>> {
        policy
            .spec
            .driver
            .upgrade_policy
            .as_ref()
            .filter(|section| section.is_auto_upgrade() && policy.sandbox.is_none())
            .map(|section| Self::new(&section.effective(), validation_timeout_seconds))
    }

    /// The upgrade policy of an NVIDIADriver's pool; `None` when its upgrades are not automatic (they are
    /// unless its `upgradePolicy` turns them off), an error when the section cannot be used.
    pub fn of_nvidia_driver(
        driver: &NVIDIADriver,
        validation_timeout_seconds: u64,
    ) -> Option<Result<Self, PolicyError>> {
        driver.spec.is_auto_upgrade().then(|| {
            let section = driver.spec.upgrade_policy.clone().unwrap_or_default();
            Self::new(&section.effective(), validation_timeout_seconds)
        })
    }

    /// The policy of a ClusterPolicy or NVIDIADriver section, with defaults applied.
    pub fn new(
        effective: &EffectiveUpgradePolicy,
        validation_timeout_seconds: u64,
    ) -> Result<Self, PolicyError> {
        let selector = |field: &'static str, text: &Option<String>| -> Result<LabelSelector, PolicyError> {
            text.as_deref()
                .unwrap_or_default()
                .parse()
                .map_err(|source| PolicyError::Selector { field, source })
        };
        let max_unavailable = match &effective.max_unavailable {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(count) => {
                IntOrPercent::Count(u32::try_from(*count).unwrap_or(0))
            }
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(text) => {
                IntOrPercent::parse(text).ok_or_else(|| PolicyError::MaxUnavailable(text.clone()))?
            }
        };
        let seconds = |value: i64| u64::try_from(value).unwrap_or(0);
        let wait_for_completion = match &effective.wait_for_completion_pod_selector {
            Some(_) => Some((
                selector(
                    "waitForCompletion.podSelector",
                    &effective.wait_for_completion_pod_selector,
                )?,
                seconds(effective.wait_for_completion_timeout_seconds),
            )),
            None => None,
        };
        let drain = if effective.drain_enabled {
            Some((
                selector("drain.podSelector", &effective.drain_pod_selector)?,
                Eviction {
                    force: effective.drain_force,
                    delete_empty_dir: effective.drain_delete_empty_dir,
                    timeout_seconds: seconds(effective.drain_timeout_seconds),
                },
            ))
        } else {
            None
        };
        Ok(Self {
            max_parallel: u32::try_from(effective.max_parallel_upgrades).unwrap_or(0),
            max_unavailable,
            pod_deletion: Eviction {
                force: effective.pod_deletion_force,
                delete_empty_dir: effective.pod_deletion_delete_empty_dir,
                timeout_seconds: seconds(effective.pod_deletion_timeout_seconds),
            },
            wait_for_completion,
            drain,
            validation_timeout_seconds,
        })
    }
}

/// The driver pod on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverPod {
    /// Its name (in the operator namespace).
    pub name: String,
    /// It comes from its DaemonSet's latest revision.
    pub in_sync: bool,
    /// No DaemonSet owns it any more (left behind when NVIDIADriver objects took over the driver).
    pub orphaned: bool,
    /// Only settings that need no reinstall differ from the latest revision (equal `DRIVER_CONFIG_DIGEST`):
    /// restarting it does not unload the driver, so the node's workloads may stay.
    pub restart_only: bool,
    /// Since when it has been Ready (seconds), if it is.
    pub ready_since: Option<i64>,
    /// Restarts of its containers.
    pub restarts: i32,
    /// It is being deleted.
    pub terminating: bool,
}

impl DriverPod {
    fn is_current(&self) -> bool {
        self.in_sync && !self.orphaned
    }
}

/// A pod on a node that an upgrade may have to move away (any pod but the operator's own operands).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// It requests `nvidia.com/gpu*` or `nvidia.com/mig-*` resources.
    pub uses_gpu: bool,
    /// A DaemonSet owns it (eviction would only bring it back: left alone, as `kubectl drain` does).
    pub daemon: bool,
    /// A controller owns it (something will recreate it elsewhere).
    pub controlled: bool,
    /// It has emptyDir volumes.
    pub empty_dir: bool,
    /// It has Succeeded or Failed.
    pub finished: bool,
    /// It is being deleted.
    pub terminating: bool,
}

impl WorkloadPod {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What one decision needs to know about a managed node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// The node.
    pub name: String,
    /// Its state label.
    pub state: UpgradeState,
    /// `nvidia.com/gpu-driver-upgrade.skip=true`.
    pub skip: bool,
    /// Cordoned.
    pub unschedulable: bool,
    /// Its Ready condition is True.
    pub ready: bool,
    /// The node was cordoned before its upgrade began (annotation).
    pub initially_unschedulable: bool,
    /// A person asked for an upgrade of this node (annotation).
    pub requested: bool,
    /// A driver pod waits for permission to load (annotation).
    pub waiting_for_safe_load: bool,
    /// `nvidia.com/gpu-driver-upgrade-enabled` is `true`.
    pub upgrade_enabled_annotation: bool,
    /// The upgrade under way only restarts the driver pod (annotation).
    pub restart_only: bool,
    /// When waiting for jobs began (annotation, seconds).
    pub wait_started: Option<i64>,
    /// When validation began (annotation, seconds).
    pub validation_started: Option<i64>,
    /// Since when the caller has seen the node in its state (seconds); eviction timeouts count from it.
    /// A restarted operator sees every state anew, so a timeout can only grow, never cut a wait short.
    pub state_since: i64,
    /// The node's driver pod.
    pub driver: Option<DriverPod>,
    /// Since when the validator pod on the node has been Ready, if it is.
    pub validator_ready_since: Option<i64>,
    /// Every other pod bound to the node.
    pub pods: Vec<WorkloadPod>,
}

impl NodeView {
    /// Cordoned or not Ready: taking it out costs no capacity.
    fn unavailable(&self) -> bool {
        self.unschedulable || !self.ready
    }

    fn needs_upgrade(&self) -> bool {
        self.requested
            || self.waiting_for_safe_load
            || self.driver.as_ref().is_some_and(|driver| !driver.is_current())
    }

    /// The driver runs ready on the latest revision and a validator has passed since (or, when only the
    /// driver pod restarted and the driver itself stayed, a validator is ready).
    fn validated(&self) -> bool {
        let Some(driver) = self.driver.as_ref().filter(|d| d.is_current() && !d.terminating) else {
            return false;
        };
        match (driver.ready_since, self.validator_ready_since) {
            (Some(driver), Some(validator)) => self.restart_only || validator >= driver,
            _ => false,
        }
    }
}

/// An Event for a cluster admin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// A Warning (else Normal).
    pub warning: bool,
    /// The Event reason.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// What to do to one node now. Every field that is set is part of the same move.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The node.
    pub node: String,
    /// Its state now.
    pub from: UpgradeState,
    /// Its next state, if it moves.
    pub to: Option<UpgradeState>,
    /// Cordon (`true`) or uncordon (`false`) it.
    pub unschedulable: Option<bool>,
    /// Annotations to set (`Some`) or remove (`None`).
    pub annotations: BTreeMap<&'static str, Option<String>>,
    /// Pods to evict (`namespace/name`).
    pub evict: Vec<String>,
    /// The driver pod to delete, so that its DaemonSet recreates it from the latest revision.
    pub restart_driver: Option<String>,
    /// An Event for the node.
    pub note: Option<Note>,
}

impl Step {
    /// A step of `node` that does nothing yet. Its name is left for [`decide`] to set on the steps it keeps:
    /// most nodes have none, and a decision is made for every node of a pool again and again.
    fn new(node: &NodeView) -> Self {
        Self {
            from: node.state,
            ..Self::default()
        }
    }

    /// Whether the node object itself changes (labels, annotations or cordon).
    pub fn patches_node(&self) -> bool {
        self.to.is_some() || self.unschedulable.is_some() || !self.annotations.is_empty()
    }

    /// Whether the step does anything at all.
    pub fn is_empty(&self) -> bool {
        !self.patches_node() && self.evict.is_empty() && self.restart_driver.is_none() && self.note.is_none()
    }

    fn to(mut self, state: UpgradeState) -> Self {
        self.to = Some(state);
        self
    }

    fn annotate(mut self, key: &'static str, value: Option<String>) -> Self {
        self.annotations.insert(key, value);
        self
    }

    fn note(mut self, warning: bool, reason: &'static str, message: String) -> Self {
        self.note = Some(Note {
            warning,
            reason,
            message,
        });
        self
    }
}

/// Nodes per state and what the budget allows, for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeCounts {
    /// Managed nodes.
    pub managed: usize,
    /// Waiting for a slot (`upgrade-required`).
    pub pending: usize,
    /// Being upgraded (every state between required and done, failed included).
    pub in_progress: usize,
    /// Up to date.
    pub done: usize,
    /// Failed.
    pub failed: usize,
    /// More nodes the budget lets start now.
    pub available: usize,
    /// Nodes unavailable (cordoned, not Ready, or about to be cordoned).
    pub unavailable: usize,
    /// `maxUnavailable` as a count of the managed nodes.
    pub max_unavailable: usize,
}

/// A decision: the steps, the counts after them, and when to look again if nothing changes before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// One step per node that has something to do, in node name order.
    pub steps: Vec<Step>,
    /// Nodes that wait, and for what.
    pub waiting: Vec<(String, String)>,
    /// The counts once the steps are carried out.
    pub counts: UpgradeCounts,
    /// Seconds until a timeout or a retry is due, if one is.
    pub recheck_in: Option<u64>,
}

/// The budget of one decision.
struct Budget {
    max_parallel: u32,
    max_unavailable: usize,
    in_progress: usize,
    unavailable: usize,
}

impl Budget {
    fn of<V: Borrow<NodeView>>(policy: &UpgradePolicy, nodes: &[V]) -> Self {
        let managed = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
        let nodes = || nodes.iter().map(Borrow::borrow);
        Self {
            max_parallel: policy.max_parallel,
            max_unavailable: policy.max_unavailable.scaled_up(managed) as usize,
            in_progress: nodes().filter(|n| n.state.is_in_progress()).count(),
            unavailable: nodes()
                .filter(|n| n.unavailable() || n.state == UpgradeState::CordonRequired)
                .count(),
        }
    }

    fn parallel_left(&self) -> usize {
        match self.max_parallel {
            0 => usize::MAX,
            max => (max as usize).saturating_sub(self.in_progress),
        }
    }

    fn unavailable_left(&self) -> usize {
        self.max_unavailable.saturating_sub(self.unavailable)
    }

    /// Takes a slot for a node if the budget has one; `costs_capacity` when the node is schedulable and
    /// Ready now.
    fn take(&mut self, costs_capacity: bool) -> Result<(), String> {
        if self.parallel_left() == 0 {
            return Err(format!(
                "maxParallelUpgrades: {} nodes are being upgraded",
                self.in_progress
            ));
        }
        if costs_capacity && self.unavailable_left() == 0 {
            return Err(format!(
                "maxUnavailable: {} of at most {} nodes are unavailable",
                self.unavailable, self.max_unavailable
            ));
        }
        self.in_progress += 1;
        if costs_capacity {
            self.unavailable += 1;
        }
        Ok(())
    }
}

/// Decides the next move of every managed node of one pool (a ClusterPolicy's or an NVIDIADriver's), at
/// `now` (seconds). Auto upgrade must be on: with it off the caller removes the state labels instead.
pub fn decide<V: Borrow<NodeView>>(policy: &UpgradePolicy, nodes: &[V], now: i64) -> Decision {
    let mut budget = Budget::of(policy, nodes);
    let mut decision = Decision::default();
    let mut recheck = Recheck::default();
    let nodes: Vec<&NodeView> = nodes.iter().map(Borrow::borrow).collect();
    // Nodes waiting for a slot: those that cost no capacity first, then by name.
    let mut candidates: Vec<&NodeView> = nodes
        .iter()
        .copied()
        .filter(|n| n.state == UpgradeState::Required)
        .collect();
    candidates.sort_by_key(|n| (!n.unavailable(), n.name.as_str()));
    let mut started: BTreeMap<&str, Step> = BTreeMap::new();
    for node in candidates {
        match start(node, &mut budget) {
            Ok(step) => {
                started.insert(node.name.as_str(), step);
            }
            Err(why) => decision.waiting.push((node.name.clone(), why)),
        }
    }
    let mut sorted = nodes.clone();
    // Callers keep their nodes by name: the sort is for those that do not.
    if !sorted.is_sorted_by_key(|n| n.name.as_str()) {
        sorted.sort_by_key(|n| n.name.as_str());
    }
    for node in sorted {
        let step = match started.remove(node.name.as_str()) {
            Some(step) => step,
            None if node.state == UpgradeState::Required => Step::new(node),
            None => advance(policy, node, now, &mut recheck, &mut decision.waiting),
        };
        let mut step = if node.upgrade_enabled_annotation {
            step
        } else {
            step.annotate(UPGRADE_ENABLED_ANNOTATION, Some("true".to_owned()))
        };
        // Why a node failed stays on it, for the status and the doctor, until it leaves the state.
        match (step.from, step.to) {
            (_, Some(UpgradeState::Failed)) => {
                let why = step.note.as_ref().map(|n| n.message.clone());
                step = step.annotate(UPGRADE_FAILURE, why);
            }
            (UpgradeState::Failed, Some(_)) => step = step.annotate(UPGRADE_FAILURE, None),
            _ => {}
        }
        if !step.is_empty() {
            step.node.clone_from(&node.name);
            decision.steps.push(step);
        }
    }
    decision.counts = counts(&nodes, &decision.steps, &budget);
    decision.recheck_in = recheck.0;
    decision
}

/// When the next timeout or retry is due.
#[derive(Default)]
struct Recheck(Option<u64>);

impl Recheck {
    fn within(&mut self, seconds: u64) {
        let seconds = seconds.max(1);
        self.0 = Some(self.0.map_or(seconds, |current| current.min(seconds)));
    }

    /// Notes a timeout of `timeout` seconds from `since`; true when it has passed.
    fn timed_out(&mut self, since: i64, timeout: u64, now: i64) -> bool {
        if timeout == 0 {
            return false;
        }
        let elapsed = u64::try_from(now.saturating_sub(since)).unwrap_or(0);
        if elapsed >= timeout {
            return true;
        }
        self.within(timeout - elapsed);
        false
    }
}

/// An `upgrade-required` node's first move, if the budget lets it start.
fn start(node: &NodeView, budget: &mut Budget) -> Result<Step, String> {
    let step = Step::new(node);
    if node.skip {
        return Err("skipped: the node has nvidia.com/gpu-driver-upgrade.skip=true".to_owned());
    }
    if !node.needs_upgrade() {
        return Ok(step.to(UpgradeState::Done));
    }
    budget.take(!node.unavailable())?;
    let step = if node.requested {
        step.annotate(UPGRADE_REQUESTED, None)
    } else {
        step
    };
    let restart_only = node
        .driver
        .as_ref()
        .is_some_and(|d| d.restart_only && !d.orphaned)
        && !node.waiting_for_safe_load;
    Ok(if restart_only {
        let mut step = step
            .to(UpgradeState::PodRestartRequired)
            .annotate(UPGRADE_RESTART_ONLY, Some("true".to_owned()));
        if !node.unschedulable {
            step.unschedulable = Some(true);
        }
        step
    } else {
        step.to(UpgradeState::CordonRequired)
    })
}

/// The move of a node in any state but `upgrade-required`.
fn advance(
    policy: &UpgradePolicy,
    node: &NodeView,
    now: i64,
    recheck: &mut Recheck,
    waiting: &mut Vec<(String, String)>,
) -> Step {
    let step = Step::new(node);
    let mut wait = |why: String| waiting.push((node.name.clone(), why));
    match node.state {
        UpgradeState::Unknown | UpgradeState::Done => {
            if node.needs_upgrade() {
                let step = step.to(UpgradeState::Required);
                if node.unschedulable && !node.initially_unschedulable {
                    step.annotate(UPGRADE_INITIAL_UNSCHEDULABLE, Some("true".to_owned()))
                } else {
                    step
                }
            } else if node.state == UpgradeState::Unknown && node.driver.is_some() {
                step.to(UpgradeState::Done)
            } else {
                step
            }
        }
        UpgradeState::Required => step,
        UpgradeState::CordonRequired => {
            let mut step = step.to(UpgradeState::WaitForJobsRequired);
            if !node.unschedulable {
                step.unschedulable = Some(true);
            }
            step
        }
        UpgradeState::WaitForJobsRequired => {
            let Some((selector, timeout)) = &policy.wait_for_completion else {
                return step.to(UpgradeState::PodDeletionRequired);
            };
            let running: Vec<String> = node
                .pods
                .iter()
                .filter(|p| !p.finished && selector.matches(&p.labels))
                .map(WorkloadPod::key)
                .collect();
            if running.is_empty() {
                return step
                    .to(UpgradeState::PodDeletionRequired)
                    .annotate(UPGRADE_WAIT_FOR_COMPLETION_START, None);
            }
            match node.wait_started {
                None => {
                    wait(format!("waiting for {} to complete", listed(&running)));
                    if *timeout > 0 {
                        recheck.within(*timeout);
                    }
                    step.annotate(UPGRADE_WAIT_FOR_COMPLETION_START, Some(now.to_string()))
                }
                Some(started) if recheck.timed_out(started, *timeout, now) => step
                    .to(UpgradeState::PodDeletionRequired)
                    .annotate(UPGRADE_WAIT_FOR_COMPLETION_START, None)
                    .note(
                        false,
                        "DriverUpgradeWaitTimedOut",
                        format!(
                            "gave up waiting after {timeout}s for {} to complete",
                            listed(&running)
                        ),
                    ),
                Some(_) => {
                    wait(format!("waiting for {} to complete", listed(&running)));
                    step
                }
            }
        }
        UpgradeState::PodDeletionRequired => {
            let pods: Vec<&WorkloadPod> = node.pods.iter().filter(|p| p.uses_gpu).collect();
            let failed = if policy.drain.is_some() {
                UpgradeState::DrainRequired
            } else {
                UpgradeState::Failed
            };
            evict(
                step,
                node,
                &pods,
                &policy.pod_deletion,
                "GPU pods",
                failed,
                now,
                recheck,
                &mut wait,
            )
        }
        UpgradeState::DrainRequired => match &policy.drain {
            None => step.to(UpgradeState::PodRestartRequired),
            Some((selector, eviction)) => {
                let pods: Vec<&WorkloadPod> = node
                    .pods
                    .iter()
                    .filter(|p| {
                        selector.matches(&p.labels)
                            && p.labels
                                .get(crate::labels::UPGRADE_DRAIN_SKIP)
                                .map(String::as_str)
                                != Some("true")
                    })
                    .collect();
                evict(
                    step,
                    node,
                    &pods,
                    eviction,
                    "pods",
                    UpgradeState::Failed,
                    now,
                    recheck,
                    &mut wait,
                )
            }
        },
        UpgradeState::PodRestartRequired => {
            let Some(driver) = &node.driver else {
                wait("waiting for the driver DaemonSet to create a driver pod".to_owned());
                return step;
            };
            if !driver.is_current() {
                if driver.terminating {
                    wait(format!("waiting for driver pod {} to go", driver.name));
                    return step;
                }
                let mut step = step;
                step.restart_driver = Some(driver.name.clone());
                return step;
            }
            let step = if node.waiting_for_safe_load {
                step.annotate(UPGRADE_WAIT_FOR_SAFE_LOAD, None)
            } else {
                step
            };
            if driver.ready_since.is_some() && !driver.terminating {
                step.to(UpgradeState::ValidationRequired)
            } else if driver.restarts > DRIVER_RESTART_LIMIT {
                step.to(UpgradeState::Failed).note(
                    true,
                    "DriverUpgradeFailed",
                    format!(
                        "driver pod {} restarted {} times without getting ready",
                        driver.name, driver.restarts
                    ),
                )
            } else {
                wait(format!("waiting for driver pod {} to get ready", driver.name));
                step
            }
        }
        UpgradeState::ValidationRequired => {
            if node.driver.as_ref().is_some_and(|d| !d.is_current()) {
                // The policy changed again under the upgrade: replace the driver once more.
                return step
                    .to(UpgradeState::PodRestartRequired)
                    .annotate(UPGRADE_VALIDATION_START, None);
            }
            if node.validated() {
                return finish(step.annotate(UPGRADE_VALIDATION_START, None), node);
            }
            let timeout = policy.validation_timeout_seconds;
            match node.validation_started {
                None => {
                    wait("waiting for the validator to pass on the new driver".to_owned());
                    recheck.within(timeout);
                    step.annotate(UPGRADE_VALIDATION_START, Some(now.to_string()))
                }
                Some(started) if recheck.timed_out(started, timeout, now) => step
                    .to(UpgradeState::Failed)
                    .annotate(UPGRADE_VALIDATION_START, None)
                    .note(
                        true,
                        "DriverUpgradeFailed",
                        format!("the validator did not pass within {timeout}s of the new driver"),
                    ),
                Some(_) => {
                    wait("waiting for the validator to pass on the new driver".to_owned());
                    step
                }
            }
        }
        UpgradeState::UncordonRequired => finish(step, node),
        UpgradeState::Failed => {
            if node.requested {
                step.to(UpgradeState::Required)
            } else if node.validated() {
                finish(step, node).note(
                    false,
                    "DriverUpgradeRecovered",
                    "the driver runs ready on the latest revision and the validator passed".to_owned(),
                )
            } else {
                wait("upgrade failed: fix the node, or set the upgrade-requested annotation".to_owned());
                step
            }
        }
    }
}

/// Uncordons the node (unless a person had cordoned it before) and marks it done.
fn finish(step: Step, node: &NodeView) -> Step {
    let mut step = step.to(UpgradeState::Done);
    if node.restart_only {
        step = step.annotate(UPGRADE_RESTART_ONLY, None);
    }
    if node.initially_unschedulable {
        step = step.annotate(UPGRADE_INITIAL_UNSCHEDULABLE, None);
    } else if node.unschedulable {
        step.unschedulable = Some(false);
    }
    step
}

/// Node annotations that driver upgrades leave on a node: the upgrade controller's own, and the driver
/// pod's request to load (`driver-wait-for-safe-load`), which nobody answers once the operator is gone. A
/// person's `upgrade-requested` and `upgrade.skip` are theirs and stay.
pub const UPGRADE_ANNOTATIONS: &[&str] = &[
    UPGRADE_ENABLED_ANNOTATION,
    UPGRADE_INITIAL_UNSCHEDULABLE,
    UPGRADE_WAIT_FOR_COMPLETION_START,
    UPGRADE_VALIDATION_START,
    UPGRADE_FAILURE,
    UPGRADE_RESTART_ONLY,
    UPGRADE_WAIT_FOR_SAFE_LOAD,
];

/// What undoing driver upgrades on one node takes once no operator manages them (the ClusterPolicy is
/// gone): the state label and [`UPGRADE_ANNOTATIONS`] go, and a node the upgrade cordoned is uncordoned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Release {
    /// Labels to remove.
    pub labels: Vec<&'static str>,
    /// Annotations to remove.
    pub annotations: Vec<&'static str>,
    /// Uncordon the node.
    pub uncordon: bool,
}

impl Release {
    /// Whether the node carries nothing of an upgrade.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty() && !self.uncordon
    }
}

/// Decides [`Release`] for a node from its labels, annotations and cordon.
///
/// A cordoned node is uncordoned only when the upgrade cordoned it: its state is one the controller enters
/// after cordoning (`wait-for-jobs-required` through `uncordon-required`, and `upgrade-failed`), and it was
/// not cordoned before its upgrade began (no `node-initial-state.unschedulable`). Nobody would ever lift
/// such a cordon otherwise: the state machine that meant to is gone.
pub fn release(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    unschedulable: bool,
) -> Release {
    use crate::labels::UPGRADE_STATE;
    let state = UpgradeState::from_label(labels.get(UPGRADE_STATE).map(String::as_str));
    let cordoned_by_upgrade = state.is_in_progress() && state != UpgradeState::CordonRequired;
    Release {
        labels: if labels.contains_key(UPGRADE_STATE) {
            vec![UPGRADE_STATE]
        } else {
            Vec::new()
        },
        annotations: UPGRADE_ANNOTATIONS
            .iter()
            .copied()
            .filter(|key| annotations.contains_key(*key))
            .collect(),
        uncordon: unschedulable
            && cordoned_by_upgrade
            && !annotations.contains_key(UPGRADE_INITIAL_UNSCHEDULABLE),
    }
}

/// Evicts `pods` as `eviction` allows; moves on once they are gone, or to `failed` when some can never be
/// evicted or the timeout passes.
#[allow(clippy::too_many_arguments)]
fn evict(
    step: Step,
    node: &NodeView,
    pods: &[&WorkloadPod],
    eviction: &Eviction,
    what: &str,
    failed: UpgradeState,
    now: i64,
    recheck: &mut Recheck,
    wait: &mut impl FnMut(String),
) -> Step {
    let remaining: Vec<&&WorkloadPod> = pods.iter().filter(|p| !p.daemon && !p.finished).collect();
    if remaining.is_empty() {
        return step.to(UpgradeState::PodRestartRequired);
    }
    let refused: Vec<String> = remaining
        .iter()
        .filter_map(|p| {
            if !p.controlled && !eviction.force {
                Some(format!("{} (no controller; needs force)", p.key()))
            } else if p.empty_dir && !eviction.delete_empty_dir {
                Some(format!("{} (emptyDir; needs deleteEmptyDir)", p.key()))
            } else {
                None
            }
        })
        .collect();
    if !refused.is_empty() {
        return step.to(failed).note(
            true,
            "DriverUpgradeEvictionRefused",
            format!("cannot evict {what}: {}", refused.join(", ")),
        );
    }
    let keys: Vec<String> = remaining.iter().map(|p| p.key()).collect();
    if recheck.timed_out(node.state_since, eviction.timeout_seconds, now) {
        return step.to(failed).note(
            true,
            "DriverUpgradeEvictionTimedOut",
            format!(
                "{what} still on the node after {}s: {}",
                eviction.timeout_seconds,
                listed(&keys)
            ),
        );
    }
    wait(format!("evicting {}", listed(&keys)));
    let mut step = step;
    step.evict = remaining
        .iter()
        .filter(|p| !p.terminating)
        .map(|p| p.key())
        .collect();
    // A refused eviction is tried again; pods on their way out wake the caller by themselves (it watches
    // the pods of the nodes being emptied).
    if !step.evict.is_empty() {
        recheck.within(EVICTION_RETRY_SECONDS);
    }
    step
}

fn listed(items: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = items.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

fn counts(nodes: &[&NodeView], steps: &[Step], budget: &Budget) -> UpgradeCounts {
    let moved: BTreeMap<&str, UpgradeState> = steps
        .iter()
        .filter_map(|s| Some((s.node.as_str(), s.to?)))
        .collect();
    let mut counts = UpgradeCounts {
        managed: nodes.len(),
        unavailable: budget.unavailable,
        max_unavailable: budget.max_unavailable,
        ..UpgradeCounts::default()
    };
    for node in nodes {
        let state = moved.get(node.name.as_str()).copied().unwrap_or(node.state);
        match state {
            UpgradeState::Required => counts.pending += 1,
            UpgradeState::Done => counts.done += 1,
            UpgradeState::Failed => {
                counts.failed += 1;
                counts.in_progress += 1;
            }
            UpgradeState::Unknown => {}
            _ => counts.in_progress += 1,
        }
    }
    counts.available = budget.parallel_left().min(budget.unavailable_left());
    counts
}

/// A PodDisruptionBudget, as far as a plan needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disruption {
    /// `namespace/name`.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its selector.
    pub selector: LabelSelector,
    /// `status.disruptionsAllowed`.
    pub allowed: i32,
}

/// What an upgrade would do to one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedNode {
    /// The node.
    pub node: String,
    /// Pods evicted from it (`namespace/name`).
    pub evicted: Vec<String>,
    /// PodDisruptionBudgets that allow no disruption now, with the pods they cover here.
    pub blocked_by: Vec<(String, Vec<String>)>,
    /// Pods that can never be evicted under the policy, and why.
    pub refused: Vec<String>,
    /// Only the driver pod restarts (no reinstall): workloads stay.
    pub restart_only: bool,
}

/// What an upgrade would do now, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes being upgraded now, with their state.
    pub in_progress: Vec<(String, UpgradeState)>,
    /// Batches, in order: the first starts now (or, when the nodes upgrading now hold the whole budget, once
    /// they are done); each next one once the previous is done.
    pub batches: Vec<Vec<PlannedNode>>,
    /// Nodes left out, and why.
    pub skipped: Vec<(String, String)>,
    /// Failed nodes (they hold budget until they recover).
    pub failed: Vec<String>,
    /// Nodes already up to date.
    pub up_to_date: usize,
    /// The budget: nodes at once (0: no limit) and nodes unavailable at once.
    pub max_parallel: u32,
    /// `maxUnavailable` as a count.
    pub max_unavailable: usize,
    /// A node whose GPU pods cannot all be evicted goes on to be drained (else it fails).
    pub drains: bool,
}

/// What an upgrade would do now: which nodes in which batch, which pods each loses, which budgets block.
/// Read-only: the same rules as [`decide`], played forward assuming every started node finishes.
pub fn plan(policy: &UpgradePolicy, nodes: &[NodeView], disruptions: &[Disruption]) -> Plan {
    let mut budget = Budget::of(policy, nodes);
    let mut plan = Plan {
        max_parallel: policy.max_parallel,
        max_unavailable: budget.max_unavailable,
        drains: policy.drain.is_some(),
        ..Plan::default()
    };
    let mut queue: Vec<&NodeView> = Vec::new();
    let mut sorted: Vec<&NodeView> = nodes.iter().collect();
    sorted.sort_by_key(|n| (!n.unavailable(), n.name.as_str()));
    for node in sorted {
        match node.state {
            UpgradeState::Failed => plan.failed.push(node.name.clone()),
            state if state.is_in_progress() => plan.in_progress.push((node.name.clone(), state)),
            _ if !node.needs_upgrade() => plan.up_to_date += 1,
            _ if node.skip => plan.skipped.push((
                node.name.clone(),
                "nvidia.com/gpu-driver-upgrade.skip=true".to_owned(),
            )),
            _ => queue.push(node),
        }
    }
    plan.in_progress.sort();
    plan.failed.sort();
    // Once every started node is done, what stays: failed nodes hold their slots and stay cordoned, and
    // nodes unavailable for other reasons stay unavailable.
    let settled_in_progress = plan.failed.len();
    let settled_unavailable = nodes
        .iter()
        .filter(|n| {
            n.state == UpgradeState::Failed
                || !n.ready
                || (n.unschedulable && (!n.state.is_in_progress() || n.initially_unschedulable))
        })
        .count();
    let mut settled = false;
    while !queue.is_empty() {
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for node in queue {
            if budget.take(!node.unavailable()).is_ok() {
                batch.push(planned(policy, node, disruptions));
            } else {
                rest.push(node);
            }
        }
        if batch.is_empty() && !settled {
            // The nodes upgrading now hold the budget: the first batch starts once they are done.
            budget.in_progress = settled_in_progress;
            budget.unavailable = settled_unavailable;
            settled = true;
            queue = rest;
            continue;
        }
        settled = true;
        if batch.is_empty() {
            // Nothing can start even with every earlier batch done (failed nodes or a zero budget).
            for node in rest {
                plan.skipped.push((
                    node.name.clone(),
                    format!(
                        "no budget: maxParallelUpgrades {} / maxUnavailable {} are held by failed or unavailable nodes",
                        policy.max_parallel, budget.max_unavailable
                    ),
                ));
            }
            break;
        }
        plan.batches.push(batch);
        budget.in_progress = settled_in_progress;
        budget.unavailable = settled_unavailable;
        queue = rest;
    }
    plan
}

fn planned(policy: &UpgradePolicy, node: &NodeView, disruptions: &[Disruption]) -> PlannedNode {
    let restart_only = node
        .driver
        .as_ref()
        .is_some_and(|d| d.restart_only && !d.orphaned);
    let mut planned = PlannedNode {
        node: node.name.clone(),
        evicted: Vec::new(),
        blocked_by: Vec::new(),
        refused: Vec::new(),
        restart_only,
    };
    if restart_only {
        return planned;
    }
    let gpu_pods: Vec<&WorkloadPod> = node
        .pods
        .iter()
        .filter(|p| p.uses_gpu && !p.daemon && !p.finished)
        .collect();
    let mut blocked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in gpu_pods {
        if !pod.controlled && !policy.pod_deletion.force {
            planned
                .refused
                .push(format!("{} (no controller; needs podDeletion.force)", pod.key()));
        } else if pod.empty_dir && !policy.pod_deletion.delete_empty_dir {
            planned.refused.push(format!(
                "{} (emptyDir; needs podDeletion.deleteEmptyDir)",
                pod.key()
            ));
        }
        for budget in disruptions
            .iter()
            .filter(|d| d.namespace == pod.namespace && d.allowed <= 0 && d.selector.matches(&pod.labels))
        {
            blocked.entry(budget.name.clone()).or_default().push(pod.key());
        }
        planned.evicted.push(pod.key());
    }
    planned.blocked_by = blocked.into_iter().collect();
    planned
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parallel = match self.max_parallel {
            0 => "no limit".to_owned(),
            n => n.to_string(),
        };
        writeln!(
            f,
            "budget: {parallel} node(s) at once, at most {} unavailable",
            self.max_unavailable
        )?;
        writeln!(f, "up to date: {} node(s)", self.up_to_date)?;
        for (node, state) in &self.in_progress {
            writeln!(f, "in progress: {node} ({state})")?;
        }
        for node in &self.failed {
            writeln!(
                f,
                "failed: {node} (holds a slot until it recovers or is requested again)"
            )?;
        }
        for (index, batch) in self.batches.iter().enumerate() {
            writeln!(f, "batch {}:", index + 1)?;
            for node in batch {
                if node.restart_only {
                    writeln!(f, "  {}: driver pod restart only, no pods evicted", node.node)?;
                    continue;
                }
                match node.evicted.len() {
                    0 => writeln!(f, "  {}: no GPU pods to evict", node.node)?,
                    _ => writeln!(f, "  {}: evict {}", node.node, node.evicted.join(", "))?,
                }
                for (budget, pods) in &node.blocked_by {
                    writeln!(
                        f,
                        "    blocked by PodDisruptionBudget {budget} (no disruption allowed now): {}",
                        pods.join(", ")
                    )?;
                }
                for refused in &node.refused {
                    let then = if self.drains {
                        "the node would be drained instead"
                    } else {
                        "the node would fail"
                    };
                    writeln!(f, "    cannot evict {refused}: {then}")?;
                }
            }
        }
        for (node, why) in &self.skipped {
            writeln!(f, "skipped: {node}: {why}")?;
        }
        if self.batches.is_empty() && self.in_progress.is_empty() {
            writeln!(f, "nothing to upgrade")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::NvidiaDriverUpgradePolicy;
    use UpgradeState::*;

    const NOW: i64 = 10_000;

    fn policy(yaml: &str) -> UpgradePolicy {
        let section: NvidiaDriverUpgradePolicy = serde_saphyr::from_str(yaml).unwrap();
        UpgradePolicy::new(&section.effective(), DEFAULT_VALIDATION_TIMEOUT_SECONDS).unwrap()
    }

    fn defaults() -> UpgradePolicy {
        policy("{}")
    }

    impl NodeView {
        /// A Ready, schedulable node whose driver runs ready on the latest revision, validated.
        fn test(name: &str) -> Self {
            Self {
                name: name.to_owned(),
                ready: true,
                upgrade_enabled_annotation: true,
                state_since: NOW,
                driver: Some(DriverPod {
                    name: format!("driver-{name}"),
                    in_sync: true,
                    ready_since: Some(100),
                    ..DriverPod::default()
                }),
                validator_ready_since: Some(200),
                ..Self::default()
            }
        }

        fn in_state(mut self, state: UpgradeState) -> Self {
            self.state = state;
            self
        }

        fn outdated(mut self) -> Self {
            if let Some(driver) = self.driver.as_mut() {
                driver.in_sync = false;
            }
            self
        }

        fn cordoned(mut self) -> Self {
            self.unschedulable = true;
            self
        }

        fn with_pod(mut self, pod: WorkloadPod) -> Self {
            self.pods.push(pod);
            self
        }

        fn driver(mut self, change: impl FnOnce(&mut DriverPod)) -> Self {
            if let Some(driver) = self.driver.as_mut() {
                change(driver);
            }
            self
        }
    }

    /// `count` outdated nodes `n0`, `n1`, ... in `state`.
    fn outdated_nodes(count: usize, state: UpgradeState) -> Vec<NodeView> {
        (0..count)
            .map(|i| NodeView::test(&format!("n{i}")).in_state(state).outdated())
            .collect()
    }

    /// The nodes whose upgrade `decision` starts (moves to cordon-required).
    fn started_nodes(decision: &Decision) -> Vec<&str> {
        decision
            .steps
            .iter()
            .filter(|s| s.to == Some(CordonRequired))
            .map(|s| s.node.as_str())
            .collect()
    }

    fn gpu_pod(name: &str) -> WorkloadPod {
        WorkloadPod {
            namespace: "ml".to_owned(),
            name: name.to_owned(),
            labels: BTreeMap::from([("app".to_owned(), "train".to_owned())]),
            uses_gpu: true,
            controlled: true,
            ..WorkloadPod::default()
        }
    }

    fn one(policy: &UpgradePolicy, node: NodeView) -> Step {
        let nodes = [node];
        let decision = decide(policy, &nodes, NOW);
        decision.steps.into_iter().next().unwrap_or_else(|| Step {
            node: nodes[0].name.clone(),
            ..Step::new(&nodes[0])
        })
    }

    fn annotation(step: &Step, key: &str) -> Option<Option<String>> {
        step.annotations.get(key).cloned()
    }

    #[test]
    fn labels_round_trip_and_unknown_values_mean_unknown() {
        for state in UpgradeState::all() {
            let label = state.label();
            assert_eq!(UpgradeState::from_label(Some(label)), state);
        }
        assert_eq!(UpgradeState::from_label(None), Unknown);
        assert_eq!(
            UpgradeState::from_label(Some("node-maintenance-required")),
            Unknown
        );
        assert_eq!(Failed.label(), "upgrade-failed");
        assert!(Failed.is_in_progress(), "a failed node holds its slot");
        assert!(!Required.is_in_progress());
    }

    #[test]
    fn unknown_and_done_nodes() {
        let p = defaults();
        assert_eq!(one(&p, NodeView::test("a")).to, Some(Done), "in sync: done");
        let no_driver = NodeView {
            driver: None,
            ..NodeView::test("a")
        };
        assert!(one(&p, no_driver).is_empty(), "no driver pod yet: nothing to say");
        assert!(
            one(&p, NodeView::test("a").in_state(Done)).is_empty(),
            "steady state writes nothing"
        );
        assert_eq!(
            one(&p, NodeView::test("a").in_state(Done).outdated()).to,
            Some(Required)
        );
        let requested = NodeView {
            requested: true,
            ..NodeView::test("a").in_state(Done)
        };
        assert_eq!(one(&p, requested).to, Some(Required));
        let safe_load = NodeView {
            waiting_for_safe_load: true,
            ..NodeView::test("a")
        };
        assert_eq!(one(&p, safe_load).to, Some(Required));
        let orphan = NodeView::test("a").in_state(Done).driver(|d| d.orphaned = true);
        assert_eq!(
            one(&p, orphan).to,
            Some(Required),
            "an orphaned driver pod is replaced"
        );
        let step = one(&p, NodeView::test("a").in_state(Done).outdated().cordoned());
        assert_eq!(
            annotation(&step, UPGRADE_INITIAL_UNSCHEDULABLE),
            Some(Some("true".to_owned())),
            "a node a person cordoned is remembered as such"
        );
        let unmarked = NodeView {
            upgrade_enabled_annotation: false,
            ..NodeView::test("a").in_state(Done)
        };
        assert_eq!(
            annotation(&one(&p, unmarked), UPGRADE_ENABLED_ANNOTATION),
            Some(Some("true".to_owned()))
        );
    }

    #[test]
    fn required_nodes_start_within_both_limits() {
        let p = policy("{maxParallelUpgrades: 3, maxUnavailable: 25%}");
        let nodes = outdated_nodes(10, Required);
        let decision = decide(&p, &nodes, NOW);
        let started = started_nodes(&decision);
        assert_eq!(
            started,
            ["n0", "n1", "n2"],
            "3 of 10: 25% rounded up is 3, parallel 3"
        );
        assert_eq!(decision.counts.pending, 7);
        assert_eq!(decision.counts.in_progress, 3);
        assert_eq!(decision.counts.available, 0);
        assert_eq!(decision.waiting.len(), 7);

        let tight = policy("{maxParallelUpgrades: 3, maxUnavailable: 1}");
        let decision = decide(&tight, &nodes, NOW);
        assert_eq!(started_nodes(&decision).len(), 1);
        assert!(
            decision
                .waiting
                .iter()
                .any(|(_, why)| why.contains("maxUnavailable: 1 of at most 1"))
        );

        let unlimited = policy("{maxParallelUpgrades: 0, maxUnavailable: 100%}");
        assert_eq!(
            decide(&unlimited, &nodes, NOW).steps.len(),
            10,
            "0 means no parallel limit"
        );
    }

    #[test]
    fn unavailable_nodes_go_first_and_cost_no_capacity() {
        let p = policy("{maxParallelUpgrades: 2, maxUnavailable: 1}");
        let mut nodes = outdated_nodes(4, Required);
        nodes[3].ready = false;
        let decision = decide(&p, &nodes, NOW);
        let started = started_nodes(&decision);
        assert_eq!(
            started,
            ["n3"],
            "the NotReady node already uses the one unavailable slot; it upgrades first, alone"
        );
        // Already over budget (two nodes cordoned by people): only nodes that cost nothing start.
        nodes[0].unschedulable = true;
        nodes[3].ready = true;
        nodes[1].unschedulable = true;
        let decision = decide(&p, &nodes, NOW);
        let started = started_nodes(&decision);
        assert_eq!(started, ["n0", "n1"]);
    }

    #[test]
    fn failed_nodes_hold_their_slots() {
        let p = policy("{maxParallelUpgrades: 2, maxUnavailable: 100%}");
        let nodes = vec![
            NodeView::test("a").in_state(Failed).outdated().cordoned(),
            NodeView::test("b").in_state(Failed).outdated().cordoned(),
            NodeView::test("c").in_state(Required).outdated(),
        ];
        let decision = decide(&p, &nodes, NOW);
        assert!(decision.steps.iter().all(|s| s.to.is_none()));
        assert_eq!(decision.counts.failed, 2);
        assert!(
            decision
                .waiting
                .iter()
                .any(|(n, why)| n == "c" && why.contains("maxParallelUpgrades"))
        );
    }

    #[test]
    fn a_required_node_that_caught_up_or_is_skipped() {
        let p = defaults();
        let step = one(&p, NodeView::test("a").in_state(Required));
        assert_eq!(
            step.to,
            Some(Done),
            "up to date by its turn: done, never cordoned"
        );
        assert_eq!(step.unschedulable, None);
        let skipped = NodeView {
            skip: true,
            ..NodeView::test("a").in_state(Required).outdated()
        };
        let decision = decide(&p, &[skipped], NOW);
        assert!(decision.steps.is_empty());
        assert!(decision.waiting[0].1.contains("skip"));
        let requested = NodeView {
            requested: true,
            ..NodeView::test("a").in_state(Required)
        };
        let step = one(&p, requested);
        assert_eq!(step.to, Some(CordonRequired));
        assert_eq!(
            annotation(&step, UPGRADE_REQUESTED),
            Some(None),
            "the request is taken"
        );
    }

    #[test]
    fn restart_only_changes_skip_the_evictions() {
        let node = NodeView::test("a")
            .in_state(Required)
            .outdated()
            .driver(|d| d.restart_only = true)
            .with_pod(gpu_pod("w"));
        let step = one(&defaults(), node);
        assert_eq!(step.to, Some(PodRestartRequired));
        assert_eq!(step.unschedulable, Some(true));
        assert_eq!(
            annotation(&step, UPGRADE_RESTART_ONLY),
            Some(Some("true".to_owned()))
        );
        assert!(step.evict.is_empty());
        // The validator that was ready before still counts, since the driver itself stayed.
        let validating = NodeView {
            restart_only: true,
            validator_ready_since: Some(50),
            ..NodeView::test("a").in_state(ValidationRequired).cordoned()
        };
        let step = one(&defaults(), validating);
        assert_eq!(step.to, Some(Done));
        assert_eq!(annotation(&step, UPGRADE_RESTART_ONLY), Some(None));
    }

    #[test]
    fn cordon_then_wait_for_jobs() {
        let p = defaults();
        let step = one(&p, NodeView::test("a").in_state(CordonRequired).outdated());
        assert_eq!(
            (step.to, step.unschedulable),
            (Some(WaitForJobsRequired), Some(true))
        );
        assert_eq!(
            one(&p, NodeView::test("a").in_state(WaitForJobsRequired).cordoned()).to,
            Some(PodDeletionRequired),
            "no selector: nothing to wait for"
        );

        let waiting = policy("{waitForCompletion: {podSelector: app=train, timeoutSeconds: 60}}");
        let node = NodeView::test("a")
            .in_state(WaitForJobsRequired)
            .cordoned()
            .with_pod(gpu_pod("job"));
        let decision = decide(&waiting, std::slice::from_ref(&node), NOW);
        let step = &decision.steps[0];
        assert_eq!(step.to, None);
        assert_eq!(
            annotation(step, UPGRADE_WAIT_FOR_COMPLETION_START),
            Some(Some(NOW.to_string()))
        );
        assert_eq!(decision.recheck_in, Some(60));

        let started = NodeView {
            wait_started: Some(NOW - 30),
            ..node.clone()
        };
        let decision = decide(&waiting, std::slice::from_ref(&started), NOW);
        assert!(decision.steps.is_empty(), "still waiting");
        assert_eq!(decision.recheck_in, Some(30));

        let timed_out = NodeView {
            wait_started: Some(NOW - 60),
            ..node.clone()
        };
        let step = one(&waiting, timed_out);
        assert_eq!(step.to, Some(PodDeletionRequired));
        assert_eq!(annotation(&step, UPGRADE_WAIT_FOR_COMPLETION_START), Some(None));
        assert_eq!(
            step.note.as_ref().map(|n| n.reason),
            Some("DriverUpgradeWaitTimedOut")
        );

        let mut finished = node;
        finished.pods[0].finished = true;
        assert_eq!(one(&waiting, finished).to, Some(PodDeletionRequired));
    }

    #[test]
    fn gpu_pods_are_evicted_and_the_rest_stay() {
        let p = defaults();
        let cpu_pod = WorkloadPod {
            uses_gpu: false,
            ..gpu_pod("web")
        };
        let mut leaving = gpu_pod("leaving");
        leaving.terminating = true;
        let node = NodeView::test("a")
            .in_state(PodDeletionRequired)
            .cordoned()
            .with_pod(gpu_pod("train"))
            .with_pod(leaving)
            .with_pod(cpu_pod.clone());
        let decision = decide(&p, std::slice::from_ref(&node), NOW);
        let step = &decision.steps[0];
        assert_eq!(step.evict, ["ml/train"], "terminating pods are not evicted twice");
        assert_eq!(step.to, None);
        assert_eq!(decision.recheck_in, Some(EVICTION_RETRY_SECONDS));

        let emptied = NodeView::test("a")
            .in_state(PodDeletionRequired)
            .cordoned()
            .with_pod(cpu_pod);
        assert_eq!(one(&p, emptied).to, Some(PodRestartRequired));
    }

    #[test]
    fn pods_that_cannot_be_evicted_fail_the_node_or_go_to_drain() {
        let unmanaged = WorkloadPod {
            controlled: false,
            ..gpu_pod("bare")
        };
        let node = NodeView::test("a")
            .in_state(PodDeletionRequired)
            .cordoned()
            .with_pod(unmanaged);
        let step = one(&defaults(), node.clone());
        assert_eq!(step.to, Some(Failed));
        let note = step.note.unwrap();
        assert!(note.warning);
        assert!(
            note.message.contains("ml/bare (no controller; needs force)"),
            "{}",
            note.message
        );
        assert_eq!(
            one(&policy("{drain: {enable: true, force: true}}"), node.clone()).to,
            Some(DrainRequired)
        );
        assert_eq!(
            one(&policy("{podDeletion: {force: true}}"), node).evict,
            ["ml/bare"]
        );

        let scratch = WorkloadPod {
            empty_dir: true,
            ..gpu_pod("scratch")
        };
        let node = NodeView::test("a")
            .in_state(PodDeletionRequired)
            .with_pod(scratch);
        assert_eq!(one(&defaults(), node.clone()).to, Some(Failed));
        assert_eq!(
            one(&policy("{podDeletion: {deleteEmptyDir: true}}"), node)
                .evict
                .len(),
            1
        );
    }

    #[test]
    fn evictions_time_out_from_when_the_state_was_seen() {
        let p = policy("{podDeletion: {timeoutSeconds: 300}}");
        let node = NodeView {
            state_since: NOW - 300,
            ..NodeView::test("a")
                .in_state(PodDeletionRequired)
                .cordoned()
                .with_pod(gpu_pod("pinned"))
        };
        let step = one(&p, node.clone());
        assert_eq!(step.to, Some(Failed));
        assert_eq!(step.note.unwrap().reason, "DriverUpgradeEvictionTimedOut");
        let forever = policy("{podDeletion: {timeoutSeconds: 0}}");
        assert_eq!(one(&forever, node).to, None, "0 waits forever");
    }

    #[test]
    fn drain_takes_selected_pods_but_not_skipped_or_daemon_ones() {
        assert_eq!(
            one(&defaults(), NodeView::test("a").in_state(DrainRequired)).to,
            Some(PodRestartRequired),
            "drain off"
        );
        let p = policy("{drain: {enable: true, podSelector: 'tier!=system'}}");
        let mut skipped = gpu_pod("operator");
        skipped
            .labels
            .insert(crate::labels::UPGRADE_DRAIN_SKIP.to_owned(), "true".to_owned());
        let mut system = gpu_pod("dns");
        system.labels.insert("tier".to_owned(), "system".to_owned());
        let daemon = WorkloadPod {
            daemon: true,
            ..gpu_pod("agent")
        };
        let web = WorkloadPod {
            uses_gpu: false,
            ..gpu_pod("web")
        };
        let node = NodeView::test("a")
            .in_state(DrainRequired)
            .cordoned()
            .with_pod(skipped)
            .with_pod(system)
            .with_pod(daemon)
            .with_pod(web);
        assert_eq!(one(&p, node).evict, ["ml/web"]);
    }

    #[test]
    fn the_driver_pod_is_replaced_then_must_get_ready() {
        let p = defaults();
        let outdated = NodeView::test("a")
            .in_state(PodRestartRequired)
            .cordoned()
            .outdated();
        assert_eq!(
            one(&p, outdated.clone()).restart_driver.as_deref(),
            Some("driver-a")
        );
        let going = outdated.driver(|d| d.terminating = true);
        assert!(one(&p, going).is_empty(), "deleted once, then waited for");

        let starting = NodeView {
            waiting_for_safe_load: true,
            ..NodeView::test("a")
                .in_state(PodRestartRequired)
                .cordoned()
                .driver(|d| d.ready_since = None)
        };
        let step = one(&p, starting.clone());
        assert_eq!(step.to, None);
        assert_eq!(
            annotation(&step, UPGRADE_WAIT_FOR_SAFE_LOAD),
            Some(None),
            "the new driver may load"
        );

        let crashing = starting.driver(|d| d.restarts = DRIVER_RESTART_LIMIT + 1);
        let step = one(&p, crashing);
        assert_eq!(step.to, Some(Failed));
        let why = annotation(&step, UPGRADE_FAILURE).flatten().unwrap();
        assert!(
            why.contains("restarted 11 times"),
            "the reason stays on the node: {why}"
        );

        let ready = NodeView::test("a").in_state(PodRestartRequired).cordoned();
        assert_eq!(one(&p, ready).to, Some(ValidationRequired));
    }

    #[test]
    fn validation_needs_a_validator_younger_than_the_driver() {
        let p = defaults();
        // The validator was ready before the new driver: it proves nothing yet.
        let stale = NodeView {
            validator_ready_since: Some(50),
            ..NodeView::test("a").in_state(ValidationRequired).cordoned()
        };
        let step = one(&p, stale.clone());
        assert_eq!(step.to, None);
        assert_eq!(
            annotation(&step, UPGRADE_VALIDATION_START),
            Some(Some(NOW.to_string()))
        );

        let timed_out = NodeView {
            validation_started: Some(NOW - 600),
            ..stale
        };
        let step = one(&p, timed_out);
        assert_eq!(step.to, Some(Failed));
        assert!(step.note.unwrap().message.contains("within 600s"));

        let passed = NodeView {
            validation_started: Some(NOW - 10),
            ..NodeView::test("a").in_state(ValidationRequired).cordoned()
        };
        let step = one(&p, passed);
        assert_eq!((step.to, step.unschedulable), (Some(Done), Some(false)));
        assert_eq!(annotation(&step, UPGRADE_VALIDATION_START), Some(None));

        let changed_again = NodeView::test("a")
            .in_state(ValidationRequired)
            .cordoned()
            .outdated();
        assert_eq!(one(&p, changed_again).to, Some(PodRestartRequired));
    }

    #[test]
    fn a_node_cordoned_by_a_person_stays_cordoned() {
        let node = NodeView {
            initially_unschedulable: true,
            ..NodeView::test("a").in_state(UncordonRequired).cordoned()
        };
        let step = one(&defaults(), node);
        assert_eq!(step.to, Some(Done));
        assert_eq!(step.unschedulable, None);
        assert_eq!(annotation(&step, UPGRADE_INITIAL_UNSCHEDULABLE), Some(None));
        let step = one(
            &defaults(),
            NodeView::test("a").in_state(UncordonRequired).cordoned(),
        );
        assert_eq!((step.to, step.unschedulable), (Some(Done), Some(false)));
    }

    #[test]
    fn a_failed_node_recovers_only_when_proven_or_asked() {
        let p = defaults();
        let crashing = NodeView::test("a").in_state(Failed).cordoned().driver(|d| {
            d.ready_since = None;
            d.restarts = 30;
        });
        let decision = decide(&p, std::slice::from_ref(&crashing), NOW);
        assert!(decision.steps.is_empty(), "failed stays failed");
        assert!(decision.waiting[0].1.contains("upgrade-requested"));
        // Ready again, but no validator has passed since: still failed (NVIDIA would say done here).
        let unproven = NodeView {
            validator_ready_since: Some(50),
            ..NodeView::test("a").in_state(Failed).cordoned()
        };
        assert!(one(&p, unproven).to.is_none());
        let proven = one(&p, NodeView::test("a").in_state(Failed).cordoned());
        assert_eq!((proven.to, proven.unschedulable), (Some(Done), Some(false)));
        assert_eq!(
            annotation(&proven, UPGRADE_FAILURE),
            Some(None),
            "the reason goes with the state"
        );
        assert_eq!(proven.note.unwrap().reason, "DriverUpgradeRecovered");
        let asked = NodeView {
            requested: true,
            ..crashing
        };
        assert_eq!(one(&p, asked).to, Some(Required));
    }

    /// Plays whole upgrades on a model cluster, a decision at a time, and checks the budget after every
    /// write: the property the operator's tests check on the simulator, here over many shapes.
    #[test]
    fn the_budget_holds_at_every_step_of_whole_upgrades() {
        for (parallel, unavailable, size, down) in [
            (3, "10%", 50, 0),
            (1, "25%", 7, 1),
            (0, "2", 20, 0),
            (5, "3", 12, 2),
            (50, "100%", 30, 0),
        ] {
            let p = policy(&format!(
                "{{maxParallelUpgrades: {parallel}, maxUnavailable: '{unavailable}'}}"
            ));
            let max = p.max_unavailable.scaled_up(size) as usize;
            let mut nodes: Vec<NodeView> = (0..size)
                .map(|i| {
                    let mut node = NodeView::test(&format!("n{i:02}")).in_state(Done).outdated();
                    node.ready = i >= down;
                    node.pods.push(gpu_pod(&format!("w{i}")));
                    node
                })
                .collect();
            for (round, now) in (NOW..NOW + 1000).enumerate() {
                let decision = decide(&p, &nodes, now);
                if decision.steps.is_empty() {
                    break;
                }
                for step in decision.steps {
                    let node = nodes.iter_mut().find(|n| n.name == step.node).unwrap();
                    if let Some(cordon) = step.unschedulable {
                        node.unschedulable = cordon;
                    }
                    if let Some(state) = step.to {
                        node.state = state;
                    }
                    node.upgrade_enabled_annotation = true;
                    node.pods.retain(|pod| !step.evict.contains(&pod.key()));
                    if step.restart_driver.is_some()
                        && let Some(driver) = node.driver.as_mut()
                    {
                        driver.in_sync = true;
                        driver.ready_since = Some(now);
                    }
                    if node.state == ValidationRequired {
                        node.validator_ready_since = Some(now + 1);
                    }
                    let unavailable = nodes
                        .iter()
                        .filter(|n| n.unschedulable || !n.ready || n.state == CordonRequired)
                        .count();
                    assert!(
                        unavailable <= max.max(down as usize),
                        "round {round}: {unavailable} unavailable, at most {max} allowed"
                    );
                    let in_progress = nodes.iter().filter(|n| n.state.is_in_progress()).count();
                    assert!(parallel == 0 || in_progress <= parallel as usize);
                }
            }
            assert!(
                nodes
                    .iter()
                    .all(|n| n.state == Done && n.pods.is_empty() && !n.unschedulable),
                "{parallel}/{unavailable}: every node upgraded and uncordoned"
            );
        }
    }

    #[test]
    fn the_plan_waits_for_the_nodes_upgrading_now_not_gives_up() {
        let p = policy("{maxParallelUpgrades: 2, maxUnavailable: 100%}");
        let nodes = vec![
            NodeView::test("a")
                .in_state(PodDeletionRequired)
                .cordoned()
                .outdated(),
            NodeView::test("b")
                .in_state(PodRestartRequired)
                .cordoned()
                .outdated(),
            NodeView::test("c").in_state(Required).outdated(),
            NodeView::test("d").in_state(Required).outdated(),
            NodeView::test("e").in_state(Required).outdated(),
        ];
        let plan = plan(&p, &nodes, &[]);
        let batches: Vec<Vec<&str>> = plan
            .batches
            .iter()
            .map(|b| b.iter().map(|n| n.node.as_str()).collect())
            .collect();
        assert_eq!(batches, [vec!["c", "d"], vec!["e"]]);
        assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
        let failed = vec![
            NodeView::test("a").in_state(Failed).cordoned().outdated(),
            NodeView::test("b").in_state(Failed).cordoned().outdated(),
            NodeView::test("c").in_state(Required).outdated(),
        ];
        let stuck = super::plan(&p, &failed, &[]);
        assert!(stuck.batches.is_empty());
        assert!(
            stuck.skipped[0].1.starts_with("no budget"),
            "failed nodes hold it for good"
        );
    }

    #[test]
    fn the_plan_lists_batches_evictions_and_blockers() {
        let p = policy("{maxParallelUpgrades: 2, maxUnavailable: 50%}");
        let mut nodes = outdated_nodes(5, Done);
        nodes[0].pods.push(gpu_pod("train-0"));
        nodes[1].skip = true;
        nodes.push(NodeView::test("n5"));
        let disruptions = vec![Disruption {
            name: "ml/train".to_owned(),
            namespace: "ml".to_owned(),
            selector: "app=train".parse().unwrap(),
            allowed: 0,
        }];
        let plan = plan(&p, &nodes, &disruptions);
        let batches: Vec<Vec<&str>> = plan
            .batches
            .iter()
            .map(|b| b.iter().map(|n| n.node.as_str()).collect())
            .collect();
        assert_eq!(batches, [vec!["n0", "n2"], vec!["n3", "n4"]]);
        assert_eq!(plan.up_to_date, 1);
        assert_eq!(plan.skipped[0].0, "n1");
        let text = plan.to_string();
        assert!(text.contains("n0: evict ml/train-0"), "{text}");
        assert!(
            text.contains("blocked by PodDisruptionBudget ml/train (no disruption allowed now): ml/train-0"),
            "{text}"
        );
        assert!(
            text.contains("budget: 2 node(s) at once, at most 3 unavailable"),
            "{text}"
        );
    }

    #[test]
    fn releasing_a_node_lifts_only_the_upgrades_own_cordon() {
        use crate::labels::{UPGRADE_SKIP, UPGRADE_STATE};
        let map = crate::labels::label_map;
        let draining = map(&[(UPGRADE_STATE, "drain-required"), (UPGRADE_SKIP, "false")]);
        let annotations = map(&[(UPGRADE_ENABLED_ANNOTATION, "true"), (UPGRADE_REQUESTED, "true")]);
        let released = release(&draining, &annotations, true);
        assert_eq!(released.labels, [UPGRADE_STATE], "a person's skip label stays");
        assert_eq!(
            released.annotations,
            [UPGRADE_ENABLED_ANNOTATION],
            "a person's request stays"
        );
        assert!(released.uncordon);
        // Cordoned by a person before the upgrade began: it stays cordoned.
        let before = map(&[(UPGRADE_INITIAL_UNSCHEDULABLE, "true")]);
        let released = release(&draining, &before, true);
        assert!(!released.uncordon);
        assert_eq!(released.annotations, [UPGRADE_INITIAL_UNSCHEDULABLE]);
        // Not yet cordoned by the upgrade: a cordon is someone else's.
        for state in ["upgrade-required", "cordon-required", "upgrade-done"] {
            let labels = map(&[(UPGRADE_STATE, state)]);
            assert!(!release(&labels, &BTreeMap::new(), true).uncordon, "{state}");
        }
        assert!(release(&map(&[(UPGRADE_STATE, "upgrade-failed")]), &BTreeMap::new(), true).uncordon);
        assert!(!release(&draining, &BTreeMap::new(), false).uncordon);
        assert!(release(&BTreeMap::new(), &BTreeMap::new(), true).is_empty());
    }
}
