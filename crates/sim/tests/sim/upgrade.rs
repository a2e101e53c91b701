//! Driver upgrades on the simulator (issue 10): the operator upgrading simulated clusters with running GPU
//! workloads, checked the way a cluster admin would watch it — every change of every node, the driver each
//! host runs, the workloads' pods, the policy's status.
//!
//! A node watch records every moment of every upgrade; the budget is judged at each, not sampled. Waits are
//! failure guards, never timings.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpuop_api::labels::{MIG_CONFIG, UPGRADE_FAILURE, UPGRADE_STATE};
use gpuop_api::upgrade::UpgradeState;
use gpuop_api::{ClusterPolicy, NVIDIADriver, Operand};
use gpuop_operator::run::{self, Config, Running};
use gpuop_sim::cluster_spec::{ClusterSpec, GpuSpec, NodePool};
use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install};
use gpuop_sim::hardware::GpuModel;
use gpuop_sim::scenario::{Action, DriverInstallFault};
use gpuop_sim::simulation::Simulation;
use gpuop_testkit::Backend;

use crate::operator::playing;
use gpuop_sim::workload::{WORKLOAD_LABEL, Workload};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// A failure guard for a whole upgrade on a loaded two-core machine, not a performance assertion.
const PATIENCE: Duration = Duration::from_secs(600);
const OLD: &str = "595.91.07";
const NEW: &str = "600.10.01";
const ML: &str = "ml";

fn pool(name: &str, count: u32, model: GpuModel) -> NodePool {
    let mut pool = ClusterSpec::demo().node_pools.remove(1);
    pool.name = name.into();
    pool.count = count;
    pool.gpu = Some(GpuSpec { model, count: 4 });
    pool.labels.insert("pool".into(), name.into());
    pool
}

/// What the node watch saw over the whole test.
#[derive(Debug, Default)]
struct Seen {
    nodes: BTreeMap<String, Node>,
    /// Most nodes unavailable (cordoned or NotReady) at one moment, and most upgrading at one moment, per
    /// pool label value.
    max_unavailable: BTreeMap<String, usize>,
    max_in_progress: BTreeMap<String, usize>,
    /// Per node, every state it entered, in order.
    states: BTreeMap<String, Vec<String>>,
    /// Per node and MIG label (the MIG manager's switch, `nvidia.com/mig.config`), every value it took
    /// (`None`: no label), in order.
    mig_labels: BTreeMap<(String, &'static str), Vec<Option<String>>>,
}

impl Seen {
    fn record(&mut self, node: Node) {
        let name = node.name_any();
        let state = node.labels().get(UPGRADE_STATE).cloned().unwrap_or_default();
        let history = self.states.entry(name.clone()).or_default();
        if history.last() != Some(&state) {
            history.push(state);
        }
        for key in [Operand::MigManager.info().deploy_label, MIG_CONFIG] {
            let value = node.labels().get(key).cloned();
            let values = self.mig_labels.entry((name.clone(), key)).or_default();
            if values.last() != Some(&value) {
                values.push(value);
            }
        }
        self.nodes.insert(name, node);
        let mut unavailable: BTreeMap<String, usize> = BTreeMap::new();
        let mut in_progress: BTreeMap<String, usize> = BTreeMap::new();
        for node in self.nodes.values() {
            let pool = node.labels().get("pool").cloned().unwrap_or_default();
            let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            if cordoned || !node_ready(node) {
                *unavailable.entry(pool.clone()).or_default() += 1;
            }
            let state = UpgradeState::from_label(node.labels().get(UPGRADE_STATE).map(String::as_str));
            if state.is_in_progress() {
                *in_progress.entry(pool).or_default() += 1;
            }
        }
        for (pool, count) in unavailable {
            let max = self.max_unavailable.entry(pool).or_default();
            *max = (*max).max(count);
        }
        for (pool, count) in in_progress {
            let max = self.max_in_progress.entry(pool).or_default();
            *max = (*max).max(count);
        }
    }

    /// How often the node entered a state.
    fn entered(&self, node: &str, state: UpgradeState) -> usize {
        self.states
            .get(node)
            .map_or(0, |h| h.iter().filter(|s| s.as_str() == state.label()).count())
    }
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// An API server, a simulated cluster with workloads, the operator, and a watch on every node.
struct Upgrade {
    backend: Backend,
    client: Client,
    simulation: Simulation,
    operator: Option<Running>,
    seen: Arc<Mutex<Seen>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Upgrade {
    async fn start(spec: ClusterSpec) -> Self {
        Self::on(Backend::fake(), spec).await
    }

    async fn on(backend: Backend, spec: ClusterSpec) -> Self {
        let client = backend.client_as(gpuop_sim::USER_AGENT).await;
        install(&client).await.expect("CRDs and namespace install");
        let (timing, plays) = playing(&backend);
        let simulation = Simulation::start_playing(client.clone(), spec, timing, plays)
            .await
            .expect("simulation starts");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let watch = {
            let seen = seen.clone();
            let nodes: Api<Node> = Api::all(client.clone());
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(watcher(nodes, watcher::Config::default()).applied_objects());
                while let Some(node) = stream.next().await {
                    if let Ok(node) = node {
                        lock(&seen).record(node);
                    }
                }
            })
        };
        let mut upgrade = Self {
            backend,
            client,
            simulation,
            operator: None,
            seen,
            watch,
        };
        upgrade.start_operator().await;
        upgrade
    }

    async fn start_operator(&mut self) {
        self.operator = Some(
            run::start(
                self.backend.client_as(gpuop_operator::USER_AGENT).await,
                Config::in_process(NAMESPACE),
            )
            .await
            .expect("operator starts"),
        );
    }

    async fn stop_operator(&mut self) {
        if let Some(operator) = self.operator.take() {
            operator.stop().await;
        }
    }

    async fn stop(mut self) {
        self.stop_operator().await;
        self.watch.abort();
        self.simulation.stop().await;
    }

    /// The sample ClusterPolicy with this upgrade policy (and the old driver version).
    async fn apply_policy(&self, upgrade_policy: Value) {
        apply_policy(&self.client, DEFAULT_POLICY)
            .await
            .expect("policy applies");
        self.patch_policy(json!({ "driver": { "version": OLD, "upgradePolicy": upgrade_policy } }))
            .await;
    }

    async fn patch_policy(&self, spec: Value) {
        Api::<ClusterPolicy>::all(self.client.clone())
            .patch(
                "cluster-policy",
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await
            .expect("policy patches");
    }

    async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let started = tokio::time::Instant::now();
        loop {
            match check().await {
                Ok(value) => return value,
                Err(last) if started.elapsed() > PATIENCE => {
                    panic!("{what}: still not so after {PATIENCE:?}: {last}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The driver version each GPU node's host runs.
    fn drivers(&self, nodes: &[String]) -> BTreeMap<String, Option<String>> {
        nodes
            .iter()
            .map(|n| (n.clone(), self.simulation.host(n).and_then(|h| h.loaded_driver)))
            .collect()
    }

    /// Waits until every named node runs `version`, labelled `upgrade-done`, uncordoned.
    async fn all_on(&self, nodes: &[String], version: &str) {
        self.all_on_with_cordons(nodes, version, &[]).await;
    }

    /// As [`Upgrade::all_on`], the nodes of `cordoned` cordoned (a person's cordon, kept).
    async fn all_on_with_cordons(&self, nodes: &[String], version: &str, cordoned: &[&str]) {
        let nodes = nodes.to_vec();
        let kept: BTreeSet<String> = cordoned.iter().map(|n| (*n).to_owned()).collect();
        self.until(&format!("every node upgraded to {version}"), || {
            let client = self.client.clone();
            let drivers = self.drivers(&nodes);
            let nodes = nodes.clone();
            let version = version.to_owned();
            let kept = kept.clone();
            async move {
                let api: Api<Node> = Api::all(client);
                let mut lagging = Vec::new();
                for name in &nodes {
                    let node = api.get(name).await.map_err(|e| e.to_string())?;
                    let state = node.labels().get(UPGRADE_STATE).cloned().unwrap_or_default();
                    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                    let driver = drivers.get(name).cloned().flatten();
                    if state != "upgrade-done"
                        || cordoned != kept.contains(name)
                        || driver.as_deref() != Some(version.as_str())
                    {
                        lagging.push(format!("{name}: {state:?} cordoned={cordoned} driver={driver:?}"));
                    }
                }
                if lagging.is_empty() {
                    Ok(())
                } else {
                    Err(lagging.join("; "))
                }
            }
        })
        .await;
    }

    /// Waits until every workload's ReplicaSet has all its pods ready.
    async fn workloads_ready(&self) {
        self.until("every workload pod ready", || {
            let client = self.client.clone();
            async move {
                let sets = Api::<ReplicaSet>::all(client)
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let lagging: Vec<String> = sets
                    .items
                    .iter()
                    .filter(|rs| {
                        let wanted = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                        rs.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0) < wanted
                    })
                    .map(|rs| format!("{} {:?}", rs.name_any(), rs.status))
                    .collect();
                if lagging.is_empty() {
                    Ok(())
                } else {
                    Err(lagging.join("; "))
                }
            }
        })
        .await;
    }

    /// Names of the workload's running pods.
    async fn workload_pods(&self, workload: &str) -> BTreeSet<String> {
        let selected = ListParams::default().labels(&format!("{WORKLOAD_LABEL}={workload}"));
        crate::pods::live(&self.client, ML, &selected)
            .await
            .map(|p| p.name_any())
            .collect()
    }

    /// Names of the running pods of an operand, in the operator's namespace.
    async fn operand_pods(&self, operand: Operand) -> BTreeSet<String> {
        crate::pods::live(&self.client, NAMESPACE, &ListParams::default())
            .await
            .filter(|p| gpuop_sim::kubelet::operand_of(p) == Some(operand))
            .map(|p| p.name_any())
            .collect()
    }

    async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .expect("node exists")
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn names(prefix: &str, count: u32) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// Waits until the cluster runs `version` on every node and is done: the starting line of an upgrade.
async fn converged_on(upgrade: &Upgrade, nodes: &[String], version: &str) {
    upgrade.all_on(nodes, version).await;
    upgrade.workloads_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_upgrade_within_the_budget_and_their_workloads_move() {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![pool("gpu", 50, GpuModel::H100_80GB)],
        workloads: vec![
            Workload::gpu("train", 40)
                .in_namespace(ML)
                .with_max_unavailable(IntOrString::String("25%".into())),
        ],
    };
    let upgrade = Upgrade::start(spec).await;
    upgrade
        .apply_policy(json!({ "autoUpgrade": true, "maxParallelUpgrades": 3, "maxUnavailable": "10%" }))
        .await;
    let nodes = names("gpu", 50);
    converged_on(&upgrade, &nodes, OLD).await;
    let before = upgrade.workload_pods("train").await;

    upgrade
        .patch_policy(json!({ "driver": { "version": NEW } }))
        .await;
    upgrade.all_on(&nodes, NEW).await;
    upgrade.workloads_ready().await;

    {
        let seen = lock(&upgrade.seen);
        let unavailable = seen.max_unavailable.get("gpu").copied().unwrap_or(0);
        assert!(
            unavailable <= 5,
            "10% of 50 is 5; {unavailable} nodes were unavailable at once"
        );
        assert_eq!(
            seen.max_in_progress.get("gpu").copied().unwrap_or(0),
            3,
            "maxParallelUpgrades, used and never exceeded"
        );
        for node in &nodes {
            assert_eq!(
                seen.entered(node, UpgradeState::CordonRequired),
                1,
                "{node} upgraded once: {:?}",
                seen.states[node]
            );
        }
    }
    let after = upgrade.workload_pods("train").await;
    assert_eq!(after.len(), 40);
    assert!(
        before.is_disjoint(&after),
        "every GPU pod was evicted from its node and replaced: {:?}",
        before.intersection(&after).collect::<Vec<_>>()
    );
    upgrade.stop().await;
}

gpuop_testkit::two_backends!(
    sixteen_nodes_upgrade_within_the_budget_through_evictions_keeping_a_persons_cordon
);

/// A driver upgrade of sixteen MIG-capable nodes running GPU workloads behind a PodDisruptionBudget, as a
/// cluster admin watches it: at no observed moment more nodes unavailable than the budget (a person's cordon
/// counts) or more upgrading than the parallelism; the workloads' pods leave through evictions the budget
/// allows; the node a person cordoned is upgraded and stays cordoned; and no node's MIG manager switch or
/// MIG configuration goes and comes back while its driver restarts (feature discovery's labels vanish
/// meanwhile; the driver manager restarts the MIG manager pod once, a label that went would delete it again).
async fn sixteen_nodes_upgrade_within_the_budget_through_evictions_keeping_a_persons_cordon(
    backend: Backend,
) {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![pool("gpu", 16, GpuModel::H100_80GB)],
        workloads: vec![
            Workload::gpu("train", 12)
                .in_namespace(ML)
                .with_max_unavailable(IntOrString::String("25%".into())),
        ],
    };
    let upgrade = Upgrade::on(backend, spec).await;
    upgrade
        .apply_policy(json!({ "autoUpgrade": true, "maxParallelUpgrades": 2, "maxUnavailable": "25%" }))
        .await;
    let nodes = names("gpu", 16);
    converged_on(&upgrade, &nodes, OLD).await;
    // The MIG manager follows feature discovery's `mig.capable`, after the rest of the stack.
    upgrade
        .until("a MIG manager on every node", || async {
            let pods = upgrade.operand_pods(Operand::MigManager).await;
            if pods.len() == 16 {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        })
        .await;
    let person = "gpu-7";
    Api::<Node>::all(upgrade.client.clone())
        .patch(
            person,
            &PatchParams::apply("kubectl-cordon").force(),
            &Patch::Apply(&json!({"apiVersion": "v1", "kind": "Node", "spec": {"unschedulable": true}})),
        )
        .await
        .expect("a person cordons a node");
    let before = upgrade.backend.requests().await;

    upgrade
        .patch_policy(json!({ "driver": { "version": NEW } }))
        .await;
    upgrade.all_on_with_cordons(&nodes, NEW, &[person]).await;
    upgrade.workloads_ready().await;

    let requests = upgrade.backend.requests().await.since(&before);
    let operator = gpuop_sim::product_token(gpuop_operator::USER_AGENT);
    let evictions = requests.matching(|key| {
        key.resource == "pods"
            && key.subresource == "eviction"
            && key.code == 201
            && key.client.starts_with(operator)
    });
    assert!(evictions >= 12, "{evictions} evictions accepted for 12 GPU pods");
    {
        let seen = lock(&upgrade.seen);
        let unavailable = seen.max_unavailable.get("gpu").copied().unwrap_or(0);
        assert!(
            unavailable <= 4,
            "25% of 16 is 4; {unavailable} nodes were unavailable at once"
        );
        let in_progress = seen.max_in_progress.get("gpu").copied().unwrap_or(0);
        assert!(
            in_progress <= 2,
            "maxParallelUpgrades 2; {in_progress} upgraded at once"
        );
        for node in &nodes {
            assert_eq!(
                seen.entered(node, UpgradeState::CordonRequired),
                1,
                "{node} upgraded once: {:?}",
                seen.states[node]
            );
            for ((_, key), values) in seen.mig_labels.range((node.clone(), "")..).take(2) {
                let first = values.iter().position(Option::is_some);
                assert!(
                    first.is_some_and(|at| values.iter().skip(at).all(|v| *v == values[at])),
                    "{node}'s {key} went and came back: {values:?}"
                );
            }
        }
    }
    upgrade.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_new_driver_fails_stays_failed_and_cordoned_while_the_others_finish() {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![pool("gpu", 6, GpuModel::H100_80GB)],
        workloads: vec![],
    };
    let upgrade = Upgrade::start(spec).await;
    upgrade
        .apply_policy(json!({ "autoUpgrade": true, "maxParallelUpgrades": 2, "maxUnavailable": "50%" }))
        .await;
    let nodes = names("gpu", 6);
    converged_on(&upgrade, &nodes, OLD).await;
    upgrade
        .simulation
        .apply(&Action::DriverInstallFails(DriverInstallFault::of_version(
            "gpu-2", NEW,
        )))
        .await
        .expect("fault");
    upgrade
        .patch_policy(json!({ "driver": { "version": NEW } }))
        .await;

    let others: Vec<String> = nodes.iter().filter(|n| *n != "gpu-2").cloned().collect();
    upgrade.all_on(&others, NEW).await;
    let failed = upgrade
        .until("gpu-2 fails its upgrade", || async {
            let node = upgrade.node("gpu-2").await;
            match node.labels().get(UPGRADE_STATE).map(String::as_str) {
                Some("upgrade-failed") => Ok(node),
                state => Err(format!("{state:?}")),
            }
        })
        .await;
    let why = failed
        .annotations()
        .get(UPGRADE_FAILURE)
        .cloned()
        .unwrap_or_default();
    assert!(
        why.contains("without getting ready"),
        "the reason is on the node: {why:?}"
    );
    assert_eq!(
        failed.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "a failed node stays cordoned"
    );
    upgrade
        .until("the policy names the failed node and why", || async {
            let policy = Api::<ClusterPolicy>::all(upgrade.client.clone())
                .get("cluster-policy")
                .await
                .map_err(|e| e.to_string())?;
            let message = policy
                .status
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.message)
                .unwrap_or_default();
            if message.contains("driver upgrade failed on 1 node(s): gpu-2 (") {
                Ok(())
            } else {
                Err(message)
            }
        })
        .await;
    let events = Api::<Event>::all(upgrade.client.clone())
        .list(&ListParams::default())
        .await
        .expect("events list");
    assert!(
        events.items.iter().any(
            |e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-2")
                && e.reason.as_deref() == Some("DriverUpgradeFailed")
                && e.type_.as_deref() == Some("Warning")
        ),
        "a Warning event on the node says why"
    );
    // Failed is not a resting place the operator leaves by itself while the driver stays broken.
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW).await;
    let still = upgrade.node("gpu-2").await;
    assert_eq!(
        still.labels().get(UPGRADE_STATE).map(String::as_str),
        Some("upgrade-failed")
    );
    {
        let seen = lock(&upgrade.seen);
        assert!(
            seen.max_unavailable.get("gpu").copied().unwrap_or(0) <= 3,
            "50% of 6"
        );
        assert!(seen.max_in_progress.get("gpu").copied().unwrap_or(0) <= 2);
    }
    upgrade.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_upgrade_resumes_from_the_labels_without_redoing_nodes() {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![pool("gpu", 12, GpuModel::A100_80GB)],
        workloads: vec![Workload::gpu("train", 12).in_namespace(ML)],
    };
    let mut upgrade = Upgrade::start(spec).await;
    upgrade
        .apply_policy(json!({ "autoUpgrade": true, "maxParallelUpgrades": 2, "maxUnavailable": 2 }))
        .await;
    let nodes = names("gpu", 12);
    converged_on(&upgrade, &nodes, OLD).await;
    upgrade
        .patch_policy(json!({ "driver": { "version": NEW } }))
        .await;
    upgrade
        .until("a few nodes are done and others in flight", || async {
            let seen = lock(&upgrade.seen);
            let done = seen
                .states
                .values()
                .filter(|h| {
                    h.iter().any(|s| s == "upgrade-required")
                        && h.last().map(String::as_str) == Some("upgrade-done")
                })
                .count();
            if done >= 3 {
                Ok(())
            } else {
                Err(format!("{done} done"))
            }
        })
        .await;
    upgrade.stop_operator().await;
    upgrade.start_operator().await;
    upgrade.all_on(&nodes, NEW).await;
    upgrade.workloads_ready().await;
    {
        let seen = lock(&upgrade.seen);
        assert!(
            seen.max_unavailable.get("gpu").copied().unwrap_or(0) <= 2,
            "the budget held across the restart"
        );
        assert!(seen.max_in_progress.get("gpu").copied().unwrap_or(0) <= 2);
        for node in &nodes {
            assert_eq!(
                seen.entered(node, UpgradeState::CordonRequired),
                1,
                "{node} was upgraded exactly once: {:?}",
                seen.states[node]
            );
        }
    }
    upgrade.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disruption_budget_blocks_the_evictions_until_the_timeout_and_the_node_fails() {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![pool("gpu", 2, GpuModel::H100_80GB)],
        workloads: vec![
            Workload::gpu("pinned", 2)
                .in_namespace(ML)
                .with_min_available(IntOrString::Int(2)),
        ],
    };
    let upgrade = Upgrade::start(spec).await;
    upgrade
        .apply_policy(json!({
            "autoUpgrade": true, "maxParallelUpgrades": 1, "maxUnavailable": 1,
            "podDeletion": { "timeoutSeconds": 3 },
            "drain": { "enable": true, "timeoutSeconds": 3 },
        }))
        .await;
    let nodes = names("gpu", 2);
    converged_on(&upgrade, &nodes, OLD).await;
    let before = upgrade.workload_pods("pinned").await;
    upgrade
        .patch_policy(json!({ "driver": { "version": NEW } }))
        .await;
    let (node, why) = upgrade
        .until(
            "the first node to start fails once its evictions time out",
            || async {
                let api: Api<Node> = Api::all(upgrade.client.clone());
                let list = api
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                list.items
                    .iter()
                    .find(|n| n.labels().get(UPGRADE_STATE).map(String::as_str) == Some("upgrade-failed"))
                    .map(|n| {
                        (
                            n.name_any(),
                            n.annotations().get(UPGRADE_FAILURE).cloned().unwrap_or_default(),
                        )
                    })
                    .ok_or_else(|| "none failed yet".to_owned())
            },
        )
        .await;
    assert!(why.contains("still on the node after 3s"), "{why}");
    // The list above may be ahead of the test's own watch of the states: wait for the watch to see it.
    upgrade
        .until("the state watch sees the failure", || async {
            let seen = lock(&upgrade.seen);
            match seen.states.get(&node) {
                Some(states) if states.iter().any(|s| s == "upgrade-failed") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    {
        let seen = lock(&upgrade.seen);
        assert_eq!(
            seen.states[&node]
                .iter()
                .map(String::as_str)
                .filter(|s| ["pod-deletion-required", "drain-required", "upgrade-failed"].contains(s))
                .collect::<Vec<_>>(),
            ["pod-deletion-required", "drain-required", "upgrade-failed"],
            "eviction, then the drain, then failure"
        );
    }
    assert_eq!(
        upgrade.workload_pods("pinned").await,
        before,
        "the budget allowed no disruption: every pod still runs where it ran"
    );
    upgrade.stop().await;
}

/// An NVIDIADriver for the nodes labelled `pool=<pool>`, with its own upgrade budget.
fn nvidia_driver(name: &str, pool: &str, version: &str, parallel: u32) -> NVIDIADriver {
    serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": { "name": name },
        "spec": {
            "default": false,
            "driverType": "gpu",
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": version,
            "manager": {
                "repository": "nvcr.io/nvidia/cloud-native",
                "image": "k8s-driver-manager",
                "version": "v0.12.0",
            },
            "nodeSelector": { "pool": pool },
            "upgradePolicy": { "maxParallelUpgrades": parallel, "maxUnavailable": "100%" },
        }
    }))
    .expect("an NVIDIADriver")
}

async fn driver_status(client: &Client, name: &str) -> (String, String, String) {
    let driver = Api::<NVIDIADriver>::all(client.clone())
        .get(name)
        .await
        .expect("NVIDIADriver");
    let status = driver.status.unwrap_or_default();
    let (reason, message) = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.reason, c.message))
        .unwrap_or_default();
    (format!("{:?}", status.state), reason, message)
}

gpuop_testkit::two_backends!(
    two_nvidia_driver_pools_upgrade_independently_and_overlapping_ones_touch_nothing
);

async fn two_nvidia_driver_pools_upgrade_independently_and_overlapping_ones_touch_nothing(backend: Backend) {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![
            pool("a100", 4, GpuModel::A100_80GB),
            pool("h100", 4, GpuModel::H100_80GB),
        ],
        workloads: vec![],
    };
    let upgrade = Upgrade::on(backend, spec).await;
    let handed_over = DEFAULT_POLICY.replace("useNvidiaDriverCRD: false", "useNvidiaDriverCRD: true");
    assert_ne!(handed_over, DEFAULT_POLICY);
    apply_policy(&upgrade.client, &handed_over)
        .await
        .expect("policy applies");
    let drivers: Api<NVIDIADriver> = Api::all(upgrade.client.clone());
    for driver in [
        nvidia_driver("a100", "a100", OLD, 1),
        nvidia_driver("h100", "h100", OLD, 2),
    ] {
        drivers
            .create(&PostParams::default(), &driver)
            .await
            .expect("NVIDIADriver created");
    }
    let a100 = names("a100", 4);
    let h100 = names("h100", 4);
    let all: Vec<String> = a100.iter().chain(&h100).cloned().collect();
    upgrade.all_on(&all, OLD).await;
    upgrade
        .until("both NVIDIADrivers ready", || async {
            let a = driver_status(&upgrade.client, "a100").await;
            let h = driver_status(&upgrade.client, "h100").await;
            if a.0 == "Ready" && h.0 == "Ready" {
                Ok(())
            } else {
                Err(format!("{a:?} {h:?}"))
            }
        })
        .await;
    assert_eq!(
        driver_status(&upgrade.client, "a100").await.2,
        "the driver is ready on all 4 node(s) routed to this NVIDIADriver"
    );

    drivers
        .patch(
            "a100",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "version": NEW } })),
        )
        .await
        .expect("a100 patched");
    upgrade.all_on(&a100, NEW).await;
    {
        let seen = lock(&upgrade.seen);
        assert_eq!(
            seen.max_in_progress.get("a100").copied().unwrap_or(0),
            1,
            "a100's own budget"
        );
        for node in &h100 {
            assert_eq!(
                seen.entered(node, UpgradeState::CordonRequired),
                0,
                "{node} is another pool's"
            );
        }
    }
    assert!(upgrade.drivers(&h100).values().all(|v| v.as_deref() == Some(OLD)));

    // A second NVIDIADriver selecting the H100 nodes: they get neither, keep what runs, and both say so.
    let pods: Api<Pod> = Api::namespaced(upgrade.client.clone(), NAMESPACE);
    let driver_pods = |list: kube::core::ObjectList<Pod>| -> BTreeSet<String> {
        list.items
            .into_iter()
            .filter(|p| {
                p.labels().get("app.kubernetes.io/component").map(String::as_str) == Some("nvidia-driver")
            })
            .filter_map(|p| p.metadata.uid)
            .collect()
    };
    let running = driver_pods(pods.list(&ListParams::default()).await.expect("pods"));
    drivers
        .create(&PostParams::default(), &nvidia_driver("h100-new", "h100", NEW, 4))
        .await
        .expect("overlapping NVIDIADriver created");
    upgrade
        .until("both overlapping NVIDIADrivers name the shared nodes", || async {
            let h = driver_status(&upgrade.client, "h100").await;
            let n = driver_status(&upgrade.client, "h100-new").await;
            if h.1 == "ConflictingNodeSelector"
                && n.1 == "ConflictingNodeSelector"
                && h.2.contains("h100-0 is also selected by NVIDIADriver h100-new")
                && n.2.contains("h100-0 is also selected by NVIDIADriver h100")
            {
                Ok(())
            } else {
                Err(format!("{h:?} {n:?}"))
            }
        })
        .await;
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW).await;
    assert_eq!(
        driver_pods(pods.list(&ListParams::default()).await.expect("pods")),
        running,
        "no driver pod was touched"
    );
    for node in &h100 {
        assert_eq!(
            upgrade
                .node(node)
                .await
                .labels()
                .get(gpuop_api::labels::DRIVER_OWNER)
                .map(String::as_str),
            Some("h100"),
            "{node} keeps its owner"
        );
    }
    assert!(upgrade.drivers(&h100).values().all(|v| v.as_deref() == Some(OLD)));
    upgrade.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_the_driver_to_an_nvidia_driver_replaces_it_node_by_node() {
    let spec = ClusterSpec {
        nfd: true,
        node_pools: vec![pool("gpu", 4, GpuModel::L4)],
        workloads: vec![Workload::gpu("infer", 4).in_namespace(ML)],
    };
    let upgrade = Upgrade::start(spec).await;
    upgrade
        .apply_policy(json!({ "autoUpgrade": true, "maxParallelUpgrades": 1, "maxUnavailable": 1 }))
        .await;
    let nodes = names("gpu", 4);
    converged_on(&upgrade, &nodes, OLD).await;

    // Each node's ready driver pods, at every change: at most one node may be without one at a time.
    let pods: Api<Pod> = Api::namespaced(upgrade.client.clone(), NAMESPACE);
    let worst = Arc::new(Mutex::new(0usize));
    let watch = {
        let worst = worst.clone();
        let nodes = nodes.clone();
        tokio::spawn(async move {
            let mut ready: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let stream = watcher(
                pods,
                watcher::Config::default().labels("app.kubernetes.io/component=nvidia-driver"),
            );
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                let (pod, gone) = match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => (pod, false),
                    watcher::Event::Delete(pod) => (pod, true),
                    _ => continue,
                };
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                let serving = !gone
                    && pod.metadata.deletion_timestamp.is_none()
                    && pod
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let set = ready.entry(node).or_default();
                if serving {
                    set.insert(pod.name_any());
                } else {
                    set.remove(&pod.name_any());
                }
                let without = nodes
                    .iter()
                    .filter(|n| ready.get(*n).is_none_or(BTreeSet::is_empty))
                    .count();
                let mut worst = worst.lock().unwrap_or_else(|p| p.into_inner());
                *worst = (*worst).max(without);
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    *worst.lock().unwrap_or_else(|p| p.into_inner()) = 0;

    let mut default: NVIDIADriver = nvidia_driver("default", "unused", NEW, 1);
    default.spec.default = true;
    default.spec.node_selector = None;
    default.spec.upgrade_policy =
        Some(serde_json::from_value(json!({ "maxParallelUpgrades": 1, "maxUnavailable": 1 })).unwrap());
    Api::<NVIDIADriver>::all(upgrade.client.clone())
        .create(&PostParams::default(), &default)
        .await
        .expect("NVIDIADriver created");
    upgrade
        .patch_policy(json!({ "driver": { "useNvidiaDriverCRD": true } }))
        .await;
    upgrade.all_on(&nodes, NEW).await;
    upgrade.workloads_ready().await;
    watch.abort();
    assert!(
        *worst.lock().unwrap_or_else(|p| p.into_inner()) <= 1,
        "never more than one node without a ready driver"
    );
    {
        let seen = lock(&upgrade.seen);
        assert!(seen.max_unavailable.get("gpu").copied().unwrap_or(0) <= 1);
        for node in &nodes {
            assert_eq!(
                seen.entered(node, UpgradeState::CordonRequired),
                1,
                "{node}: {:?}",
                seen.states[node]
            );
        }
    }
    upgrade.stop().await;
}
