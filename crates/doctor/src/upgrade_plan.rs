//! `kubectl gpu upgrade-plan`: what a driver upgrade would do now, per upgrade pool, without doing any of
//! it. A [`Snapshot`] in, an [`UpgradePlan`] out; the table and the JSON (`gpu-upgrade-plan/v1`) are views
//! of it.
//!
//! The plan sees the cluster exactly as the operator's upgrade controller does: the same pools (the
//! ClusterPolicy's driver, each NVIDIADriver), the same scope ([`PoolScope::includes`]), the same node views
//! ([`node_view`], [`DriverPods::on`], [`validators`], [`workload_pod`]) and the same policy defaults
//! ([`UpgradePolicy::new`]); the batches come from [`gpuop_api::upgrade::plan`], which plays the decision's
//! budget forward. Nothing here decides anything of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use gpuop_api::driver::{ClusterPolicyUpgradePolicy, NvidiaDriverUpgradePolicy};
use gpuop_api::labels::{DRIVER_OWNER, GpuDetection, NVIDIA_DRIVER_NAME, UPGRADE_STATE};
use gpuop_api::upgrade::observe::{
    DriverPods, PoolScope, disruption, is_driver, node_view, validators, workload_pod,
};
use gpuop_api::upgrade::{
    DEFAULT_VALIDATION_TIMEOUT_SECONDS, Disruption, NodeView, Plan, UpgradePolicy, UpgradeState, plan,
};
use gpuop_api::{ClusterPolicy, Operand};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::snapshot::Snapshot;

/// The JSON schema of `upgrade-plan -o json`.
pub const SCHEMA: &str = "gpu-upgrade-plan/v1";

/// What the plan says when automatic upgrades are off.
pub const AUTO_UPGRADE_OFF: &str = "automatic upgrades are off: the operator will not start these; the plan shows what it would do with them on";

/// Why no plan can be made from a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Nothing says which pools exist.
    #[error(
        "the snapshot holds no ClusterPolicy and no NVIDIADriver, so it does not say which driver pools exist: \
         add clusterpolicies and nvidiadrivers to `kubectl get`, or use `kubectl gpu snapshot`"
    )]
    NoPolicy,
    /// Without ControllerRevisions an outdated driver pod looks current.
    #[error(
        "the snapshot holds no ControllerRevision, so outdated driver pods cannot be told from current ones: \
         add controllerrevisions to `kubectl get`, or use `kubectl gpu snapshot`"
    )]
    NoRevisions,
}

/// What a driver upgrade would do now, pool by pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpgradePlan {
    /// The pools: the ClusterPolicy's driver first, then each NVIDIADriver by name.
    pub pools: Vec<PoolPlan>,
    /// Cluster-wide facts worth knowing (budgets that could not be read, kinds the snapshot lacks).
    pub notes: Vec<String>,
}

/// One upgrade pool: a ClusterPolicy's driver or an NVIDIADriver, with its own policy and budget.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolPlan {
    /// `ClusterPolicy` or `NVIDIADriver`.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// Its driver DaemonSets, `namespace/name`.
    pub daemon_sets: Vec<String>,
    /// Nodes in the pool.
    pub nodes: usize,
    /// Whether the operator upgrades the pool by itself.
    pub auto_upgrade: bool,
    /// What to know about the pool before reading its plan (upgrades off, the pool ignored).
    pub notes: Vec<String>,
    /// The plan, or why the policy cannot be used.
    pub plan: Result<Plan, String>,
}

impl PoolPlan {
    /// `ClusterPolicy/<name>` or `NVIDIADriver/<name>`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// A pool before it is planned.
struct Pool {
    kind: &'static str,
    name: String,
    scope: PoolScope,
    daemon_sets: Vec<String>,
    auto_upgrade: bool,
    notes: Vec<String>,
    policy: Result<UpgradePolicy, String>,
}

/// Plans every pool of the snapshot, GPU nodes recognised by NFD's labels.
pub fn upgrade_plan(snapshot: &Snapshot) -> Result<UpgradePlan, PlanError> {
    upgrade_plan_with(snapshot, &GpuDetection::Nfd)
}

/// Plans every pool of the snapshot, GPU nodes recognised with this detection (`--gpu-node-selector`), as
/// the operator routes them to NVIDIADrivers.
pub fn upgrade_plan_with(snapshot: &Snapshot, detection: &GpuDetection) -> Result<UpgradePlan, PlanError> {
    if !snapshot.knows_all("ClusterPolicy") && !snapshot.knows_all("NVIDIADriver") {
        return Err(PlanError::NoPolicy);
    }
    let pools = pools(snapshot, detection);
    let has_drivers = pools.iter().any(|p| !p.daemon_sets.is_empty());
    if has_drivers && !snapshot.knows_all("ControllerRevision") {
        return Err(PlanError::NoRevisions);
    }
    let mut notes = Vec::new();
    if !snapshot.knows_all("PodDisruptionBudget") {
        notes.push(
            "the snapshot holds no PodDisruptionBudget, so none is shown blocking an eviction: add \
             poddisruptionbudgets to `kubectl get`, or use `kubectl gpu snapshot`"
                .to_owned(),
        );
    }
    let mut disruptions: Vec<Disruption> = Vec::new();
    for budget in &snapshot.disruption_budgets {
        match disruption(budget) {
            Ok(Some(budget)) => disruptions.push(budget),
            Ok(None) => {}
            Err(error) => notes.push(format!(
                "PodDisruptionBudget {}/{} is left out: {error}",
                budget.metadata.namespace.as_deref().unwrap_or_default(),
                budget.metadata.name.as_deref().unwrap_or_default()
            )),
        }
    }

    // Read once, as the operator reads its caches once per pass.
    let pods: Vec<Pod> = snapshot.pods.iter().map(|p| p.to_pod()).collect();
    let daemon_sets: Vec<&DaemonSet> = snapshot.daemon_sets.iter().collect();
    let revisions: Vec<_> = snapshot.controller_revisions.iter().collect();
    let drivers = DriverPods::index(&pods, &daemon_sets, &revisions);
    let validators = validators(&pods);
    let mut on_node: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in &pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            on_node.entry(node).or_default().push(pod);
        }
    }
    let mut nodes: Vec<_> = snapshot.nodes.iter().collect();
    nodes.sort_by_key(|n| n.metadata.name.clone());

    let pools = pools
        .into_iter()
        .map(|pool| {
            let views: Vec<NodeView> = nodes
                .iter()
                .filter(|node| pool.scope.includes(node, &drivers))
                .map(|node| {
                    let name = node.metadata.name.as_deref().unwrap_or_default();
                    let mut view = node_view(
                        node,
                        drivers.on(name, &pool.scope.daemonsets),
                        validators.get(name).copied().flatten(),
                    );
                    view.pods = on_node
                        .get(name)
                        .into_iter()
                        .flatten()
                        .map(|pod| workload_pod(pod))
                        .collect();
                    view
                })
                .collect();
            PoolPlan {
                kind: pool.kind,
                name: pool.name,
                daemon_sets: pool.daemon_sets,
                nodes: views.len(),
                auto_upgrade: pool.auto_upgrade,
                notes: pool.notes,
                plan: pool.policy.map(|policy| plan(&policy, &views, &disruptions)),
            }
        })
        .collect();
    Ok(UpgradePlan { pools, notes })
}

/// The pools the operator upgrades: the active ClusterPolicy's driver unless NVIDIADriver objects manage
/// it, and each NVIDIADriver.
fn pools(snapshot: &Snapshot, detection: &GpuDetection) -> Vec<Pool> {
    let mut pools = Vec::new();
    let active = ClusterPolicy::active(&snapshot.cluster_policies);
    let uses_crd = active.is_some_and(|p| p.spec.driver.use_nvidia_driver_crd());
    if let Some(policy) = active.filter(|_| !uses_crd) {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let daemon_sets = driver_daemon_sets(snapshot, |ds| {
            label(ds, NVIDIA_DRIVER_NAME).is_none()
                && ds
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|o| o.kind == "ClusterPolicy")
                    .all(|o| o.name == name)
        });
        let section = policy.spec.driver.upgrade_policy.clone().unwrap_or_default();
        let mut notes = Vec::new();
        if !section.is_auto_upgrade() {
            notes.push(AUTO_UPGRADE_OFF.to_owned());
        } else if policy.spec.sandbox_enabled() {
            notes.push(
                "sandbox workloads are on: the operator does not upgrade drivers automatically; the plan \
                 shows what it would do if it did"
                    .to_owned(),
            );
        }
        pools.push(Pool {
            kind: "ClusterPolicy",
            scope: PoolScope {
                routed_to: None,
                daemonsets: daemon_sets.iter().map(|(_, name)| name.clone()).collect(),
                held: BTreeSet::new(),
            },
            daemon_sets: keys(&daemon_sets),
            auto_upgrade: section.is_auto_upgrade() && !policy.spec.sandbox_enabled(),
            notes,
            policy: policy_of_cluster(&section),
            name,
        });
    }
    let mut drivers: Vec<_> = snapshot.nvidia_drivers.iter().collect();
    drivers.sort_by_key(|d| d.metadata.name.clone());
    // Nodes several NVIDIADrivers claim are left as they are, as the operator leaves them.
    let routing = gpuop_api::route_nodes(
        snapshot.nodes.iter().filter_map(|node| {
            let labels = node.metadata.labels.as_ref()?;
            detection
                .has_gpu(labels)
                .then(|| (node.metadata.name.as_deref().unwrap_or_default(), labels))
        }),
        &drivers.iter().map(|d| &**d).collect::<Vec<_>>(),
    );
    for driver in drivers {
        let name = driver.metadata.name.clone().unwrap_or_default();
        let daemon_sets = driver_daemon_sets(snapshot, |ds| label(ds, NVIDIA_DRIVER_NAME) == Some(&name));
        let section: NvidiaDriverUpgradePolicy = driver.spec.upgrade_policy.clone().unwrap_or_default();
        let mut notes = Vec::new();
        if !section.is_auto_upgrade() {
            notes.push(AUTO_UPGRADE_OFF.to_owned());
        }
        if let Some(policy) = active.filter(|_| !uses_crd) {
            notes.push(format!(
                "ClusterPolicy {} does not set driver.useNvidiaDriverCRD: the operator does not act on \
                 NVIDIADriver objects",
                policy.metadata.name.as_deref().unwrap_or_default()
            ));
        }
        pools.push(Pool {
            kind: "NVIDIADriver",
            scope: PoolScope {
                routed_to: Some(name.clone()),
                daemonsets: daemon_sets.iter().map(|(_, name)| name.clone()).collect(),
                held: routing
                    .driver(&name)
                    .map(|r| r.conflicts.keys().cloned().collect())
                    .unwrap_or_default(),
            },
            daemon_sets: keys(&daemon_sets),
            auto_upgrade: section.is_auto_upgrade(),
            notes,
            policy: UpgradePolicy::new(&section.effective(), DEFAULT_VALIDATION_TIMEOUT_SECONDS)
                .map_err(|error| format!("spec.upgradePolicy.{error}")),
            name,
        });
    }
    pools
}

fn policy_of_cluster(section: &ClusterPolicyUpgradePolicy) -> Result<UpgradePolicy, String> {
    UpgradePolicy::new(&section.effective(), DEFAULT_VALIDATION_TIMEOUT_SECONDS)
        .map_err(|error| format!("spec.driver.upgradePolicy.{error}"))
}

/// The driver DaemonSets ([`Operand::of_daemonset`]) that `belongs` accepts, as (namespace, name).
fn driver_daemon_sets(snapshot: &Snapshot, belongs: impl Fn(&DaemonSet) -> bool) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = snapshot
        .daemon_sets
        .iter()
        .filter(|ds| Operand::of_daemonset(ds) == Some(Operand::Driver) && belongs(ds))
        .map(|ds| {
            (
                ds.metadata.namespace.clone().unwrap_or_default(),
                ds.metadata.name.clone().unwrap_or_default(),
            )
        })
        .collect();
    found.sort();
    found
}

fn keys(daemon_sets: &[(String, String)]) -> Vec<String> {
    daemon_sets
        .iter()
        .map(|(namespace, name)| format!("{namespace}/{name}"))
        .collect()
}

fn label<'a>(daemon_set: &'a DaemonSet, key: &str) -> Option<&'a String> {
    daemon_set.metadata.labels.as_ref()?.get(key)
}

/// Nodes a driver upgrade may empty, a superset of every pool's nodes: those routed to an NVIDIADriver,
/// those with an upgrade state, and those running a driver pod. The live loader keeps every pod on them.
pub fn may_be_upgraded(snapshot: &Snapshot) -> BTreeSet<String> {
    let labelled = snapshot.nodes.iter().filter(|node| {
        node.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(DRIVER_OWNER) || l.contains_key(UPGRADE_STATE))
    });
    let driving = snapshot
        .pods
        .iter()
        .filter(|pod| is_driver(Some(&pod.metadata.labels)))
        .filter_map(|pod| pod.spec.node_name.clone());
    labelled
        .filter_map(|node| node.metadata.name.clone())
        .chain(driving)
        .collect()
}

/// The table a person reads: each pool, then its plan in the order it would run.
pub fn table(plan: &UpgradePlan) -> String {
    let mut out = String::new();
    if plan.pools.is_empty() {
        out.push_str(
            "no driver upgrade pool: no active ClusterPolicy deploys the driver and no NVIDIADriver exists\n",
        );
    }
    for (index, pool) in plan.pools.iter().enumerate() {
        if index > 0 {
            out.push('\n');
        }
        let daemon_sets = match pool.daemon_sets.as_slice() {
            [] => "no driver DaemonSet".to_owned(),
            list => format!("driver DaemonSets {}", list.join(", ")),
        };
        let _ = writeln!(out, "{} ({daemon_sets}; {} node(s))", pool.id(), pool.nodes);
        for note in &pool.notes {
            let _ = writeln!(out, "  {note}");
        }
        match &pool.plan {
            Ok(plan) => {
                for line in plan.to_string().lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
            Err(error) => {
                let _ = writeln!(
                    out,
                    "  the upgrade policy cannot be used: {error}; the operator does not upgrade this pool until it is fixed"
                );
            }
        }
    }
    if !plan.notes.is_empty() {
        out.push_str("\nNotes:\n");
        for note in &plan.notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    out
}

/// The plan as `gpu-upgrade-plan/v1` JSON.
pub fn json(plan: &UpgradePlan) -> serde_json::Value {
    let pools: Vec<JsonPool> = plan.pools.iter().map(JsonPool::of).collect();
    serde_json::json!({
        "schema": SCHEMA,
        "pools": pools,
        "notes": plan.notes,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonPool {
    pool: String,
    kind: &'static str,
    name: String,
    daemon_sets: Vec<String>,
    nodes: usize,
    auto_upgrade: bool,
    notes: Vec<String>,
    error: Option<String>,
    budget: Option<JsonBudget>,
    up_to_date: usize,
    in_progress: Vec<JsonInProgress>,
    failed: Vec<String>,
    batches: Vec<Vec<JsonNode>>,
    skipped: Vec<JsonSkipped>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonBudget {
    max_parallel_upgrades: u32,
    max_unavailable: usize,
}

#[derive(Serialize)]
struct JsonInProgress {
    node: String,
    state: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonNode {
    node: String,
    restart_only: bool,
    evict: Vec<String>,
    blocked_by: Vec<JsonBlocked>,
    refused: Vec<JsonRefused>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonBlocked {
    pod_disruption_budget: String,
    pods: Vec<String>,
}

#[derive(Serialize)]
struct JsonRefused {
    pod: String,
    reason: String,
}

#[derive(Serialize)]
struct JsonSkipped {
    node: String,
    reason: String,
}

impl JsonPool {
    fn of(pool: &PoolPlan) -> Self {
        let empty = Plan::default();
        let plan = pool.plan.as_ref().unwrap_or(&empty);
        JsonPool {
            pool: pool.id(),
            kind: pool.kind,
            name: pool.name.clone(),
            daemon_sets: pool.daemon_sets.clone(),
            nodes: pool.nodes,
            auto_upgrade: pool.auto_upgrade,
            notes: pool.notes.clone(),
            error: pool.plan.as_ref().err().cloned(),
            budget: pool.plan.as_ref().ok().map(|plan| JsonBudget {
                max_parallel_upgrades: plan.max_parallel,
                max_unavailable: plan.max_unavailable,
            }),
            up_to_date: plan.up_to_date,
            in_progress: plan
                .in_progress
                .iter()
                .map(|(node, state)| JsonInProgress {
                    node: node.clone(),
                    state: state_name(*state),
                })
                .collect(),
            failed: plan.failed.clone(),
            batches: plan
                .batches
                .iter()
                .map(|batch| {
                    batch
                        .iter()
                        .map(|node| JsonNode {
                            node: node.node.clone(),
                            restart_only: node.restart_only,
                            evict: node.evicted.clone(),
                            blocked_by: node
                                .blocked_by
                                .iter()
                                .map(|(budget, pods)| JsonBlocked {
                                    pod_disruption_budget: budget.clone(),
                                    pods: pods.clone(),
                                })
                                .collect(),
                            refused: node.refused.iter().map(|text| refused(text)).collect(),
                        })
                        .collect()
                })
                .collect(),
            skipped: plan
                .skipped
                .iter()
                .map(|(node, reason)| JsonSkipped {
                    node: node.clone(),
                    reason: reason.clone(),
                })
                .collect(),
        }
    }
}

fn state_name(state: UpgradeState) -> String {
    state.to_string()
}

/// `namespace/name (why)` as the plan writes a refused pod; a pod's key has no space in it.
fn refused(text: &str) -> JsonRefused {
    match text.split_once(" (") {
        Some((pod, why)) => JsonRefused {
            pod: pod.to_owned(),
            reason: why.strip_suffix(')').unwrap_or(why).to_owned(),
        },
        None => JsonRefused {
            pod: text.to_owned(),
            reason: String::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_pod_splits_into_pod_and_reason() {
        let split = refused("ml/bare (no controller; needs podDeletion.force)");
        assert_eq!(
            (split.pod.as_str(), split.reason.as_str()),
            ("ml/bare", "no controller; needs podDeletion.force")
        );
    }
}
