//! `gpu-sim bench upgrade --nodes N --max-parallel P`: a rolling driver upgrade of N GPU nodes, each
//! running a GPU workload pod, by the `gpu-operator` binary as its own process against the fake API server.
//! The cluster first converges on the sample ClusterPolicy (automatic upgrades on, `maxParallelUpgrades: P`,
//! `maxUnavailable: 25%`); then the driver version changes, and the benchmark measures the time until every
//! node runs the new driver, labelled `upgrade-done` and uncordoned, the operator's API requests during the
//! upgrade by verb, its peak memory, and, from a watch on every node, the most nodes ever unavailable and
//! upgrading at once (neither may exceed the budget).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;
use gpuop_api::ClusterPolicy;
use gpuop_api::labels::UPGRADE_STATE;
use gpuop_api::upgrade::UpgradeState;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use crate::cli::UpgradeBenchArgs;
use crate::cluster_bench::{FakeServerBench, by_verb, gpu_cluster, peak_rss_mib, verbs_text};
use crate::demo::{DEFAULT_POLICY, apply_policy};
use crate::simulation::Simulation;
use crate::workload::Workload;

/// The version the sample policy's driver moves to.
pub(crate) const NEW_VERSION: &str = "600.10.01";

/// What the node watch saw.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    nodes: BTreeMap<String, (bool, UpgradeState)>,
    pub(crate) max_unavailable: usize,
    pub(crate) max_in_progress: usize,
}

impl Budget {
    pub(crate) fn record(&mut self, node: &Node) {
        let unavailable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
            || !node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let state = UpgradeState::from_label(node.labels().get(UPGRADE_STATE).map(String::as_str));
        self.nodes.insert(node.name_any(), (unavailable, state));
        let unavailable = self.nodes.values().filter(|(u, _)| *u).count();
        let in_progress = self.nodes.values().filter(|(_, s)| s.is_in_progress()).count();
        self.max_unavailable = self.max_unavailable.max(unavailable);
        self.max_in_progress = self.max_in_progress.max(in_progress);
    }

    pub(crate) fn done(&self, count: usize) -> bool {
        self.nodes.len() == count && self.nodes.values().all(|(u, s)| !u && *s == UpgradeState::Done)
    }
}

pub(crate) fn lock(budget: &Mutex<Budget>) -> std::sync::MutexGuard<'_, Budget> {
    budget.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Follows every node from a watch, recording into the [`Budget`] at every change.
pub(crate) fn watch_budget(client: &Client) -> (Arc<Mutex<Budget>>, tokio::task::JoinHandle<()>) {
    let budget = Arc::new(Mutex::new(Budget::default()));
    let nodes: Api<Node> = Api::all(client.clone());
    let recorded = budget.clone();
    let watch = tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(nodes, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = events.next().await {
            if let Ok(node) = event {
                lock(&recorded).record(&node);
            }
        }
    });
    (budget, watch)
}

/// `gpu-sim bench upgrade`.
pub async fn upgrade(args: UpgradeBenchArgs) -> anyhow::Result<()> {
    let spec = gpu_cluster(args.nodes).with_workload(Workload::gpu("train", args.nodes).in_namespace("ml"));
    let FakeServerBench {
        server,
        running,
        client,
        simulation,
        mut operator,
        pid,
        dir: _dir,
    } = FakeServerBench::start(spec).await?;
    let (budget, node_watch) = watch_budget(&client);
    apply_policy(&client, DEFAULT_POLICY).await?;
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let set = |spec: serde_json::Value| {
        let policies = policies.clone();
        async move {
            policies
                .patch(
                    "cluster-policy",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({ "spec": spec })),
                )
                .await
        }
    };
    set(json!({ "driver": { "upgradePolicy": { "autoUpgrade": true, "maxParallelUpgrades": args.max_parallel, "maxUnavailable": "25%" } } })).await?;
    let count = args.nodes as usize;
    let started = Instant::now();
    wait(&mut operator, started, args.deadline(), "converge", || {
        lock(&budget).done(count) && all_on(&simulation, count, None)
    })
    .await?;
    // Every node runs its GPU pod before the upgrade starts, so that every node has one to evict.
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "ml");
    loop {
        let ready = sets
            .get("train")
            .await?
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        if ready == i32::try_from(args.nodes).unwrap_or(i32::MAX) {
            break;
        }
        if started.elapsed() > args.deadline() {
            bail!("the workload did not run within {:?}", args.deadline());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged = started.elapsed();
    // The upgrade's budget is judged from here on.
    {
        let mut budget = lock(&budget);
        budget.max_unavailable = 0;
        budget.max_in_progress = 0;
    }
    let before = server.requests();
    let upgrading = Instant::now();
    set(json!({ "driver": { "version": NEW_VERSION } })).await?;
    wait(&mut operator, upgrading, args.deadline(), "upgrade", || {
        lock(&budget).done(count) && all_on(&simulation, count, Some(NEW_VERSION))
    })
    .await?;
    let took = upgrading.elapsed();
    let during = server.requests().since(&before);
    let operator_client = crate::product_token(gpuop_operator::USER_AGENT);
    let requests = by_verb(&during, operator_client);
    let mut writes: BTreeMap<String, u64> = BTreeMap::new();
    for (key, count) in during
        .iter()
        .filter(|(key, _)| key.verb.is_write() && crate::product_token(&key.client) == operator_client)
    {
        let resource = if key.subresource.is_empty() {
            key.resource.clone()
        } else {
            format!("{}/{}", key.resource, key.subresource)
        };
        *writes
            .entry(format!("{} {resource}", key.verb.metric_label()).to_lowercase())
            .or_insert(0) += count;
    }
    let peak = peak_rss_mib(&pid).unwrap_or(f64::NAN);
    let _ = operator.kill().await;
    node_watch.abort();
    let (max_unavailable, max_in_progress) = {
        let budget = lock(&budget);
        (budget.max_unavailable, budget.max_in_progress)
    };
    simulation.stop().await;
    running.shutdown().await;
    let allowed_unavailable = count.div_ceil(4);
    println!(
        "| measurement ({} GPU nodes with a GPU pod each, maxParallelUpgrades {}, maxUnavailable 25%, zero latency) | result |",
        args.nodes, args.max_parallel
    );
    println!("| --- | --- |");
    println!(
        "| policy applied → every node `upgrade-done` with a driver, every GPU pod running | {:.2} s |",
        converged.as_secs_f64()
    );
    println!(
        "| driver version changed → every node on it, `upgrade-done`, uncordoned | {:.2} s |",
        took.as_secs_f64()
    );
    println!(
        "| operator requests during the upgrade, by verb | {} |",
        verbs_text(&requests)
    );
    println!(
        "| operator writes during the upgrade, by resource | {} |",
        verbs_text(&writes)
    );
    println!(
        "| most nodes upgrading at once (limit {}) | {max_in_progress} |",
        args.max_parallel
    );
    println!("| most nodes unavailable at once (limit {allowed_unavailable}) | {max_unavailable} |");
    println!("| operator peak memory (its own process) | {peak:.0} MiB |");
    if max_in_progress > args.max_parallel as usize || max_unavailable > allowed_unavailable {
        bail!("the budget was exceeded");
    }
    Ok(())
}

/// Whether every simulated node's host runs a driver (of `version`, if given).
fn all_on(simulation: &Simulation, count: usize, version: Option<&str>) -> bool {
    let hosts = simulation.state().hosts();
    hosts.len() == count
        && hosts.values().all(|host| match (&host.loaded_driver, version) {
            (Some(loaded), Some(version)) => loaded == version,
            (Some(_), None) => true,
            (None, _) => false,
        })
}

async fn wait(
    operator: &mut tokio::process::Child,
    started: Instant,
    deadline: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    while !done() {
        if started.elapsed() > deadline {
            bail!("did not {what} within {deadline:?}");
        }
        if let Some(status) = operator.try_wait()? {
            bail!("gpu-operator exited early: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
