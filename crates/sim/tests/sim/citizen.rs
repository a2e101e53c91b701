//! The simulator as a citizen of a real cluster: what a real control plane's own controllers decide about
//! the simulated nodes and their pods. The DaemonSet, ReplicaSet and pod garbage collection judgements run
//! on both backends (on the fake server the simulator plays those controllers); the node lifecycle test
//! exists only on a real control plane (`..._real_control_plane`, ignored unless asked for): the fake server
//! runs no node lifecycle controller, so there it could not fail.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::TryStreamExt;
use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE};
use gpuop_sim::hardware::GpuModel;
use gpuop_sim::scenario::Action;
use gpuop_testkit::Backend;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::operator::{Cluster, pool, until_within};

/// The node lifecycle controller's default `--node-monitor-grace-period`: a node whose Lease is older is
/// marked Unknown.
const GRACE_PERIOD: Duration = Duration::from_secs(50);

/// What a node has shown since it was first Ready: a Ready condition other than True, or the unreachable
/// taint.
fn lapse(node: &Node) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    if let Some(ready) = ready.filter(|c| c.status != "True") {
        return Some(format!(
            "Ready {} ({})",
            ready.status,
            ready.reason.as_deref().unwrap_or_default()
        ));
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints
        .into_iter()
        .flatten()
        .find(|t| t.key == "node.kubernetes.io/unreachable")
        .map(|t| format!("tainted {}:{}", t.key, t.effect))
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A thousand nodes join at once on this two-core machine, the control plane and the simulator sharing it;
/// from the moment each is Ready it stays Ready and is never tainted unreachable, through the join and for
/// longer than the grace period after: no Lease renewal waits behind the join's other requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on a real control plane: set KUBE_BINARIES and run `cargo test -- --ignored real_control_plane`"]
async fn a_thousand_joining_nodes_stay_ready_real_control_plane() {
    const NODES: usize = 1_000;
    let backend = Backend::real().await;
    let watcher_client = backend.client_as("node-watch").await;
    let (lapses_tx, mut lapses) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let (ready_tx, mut ready_count) = tokio::sync::watch::channel(0_usize);
    let watch = tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(watcher_client);
        let mut ready = BTreeSet::new();
        let mut events = std::pin::pin!(
            watcher(nodes, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        loop {
            let node = match events.try_next().await {
                Ok(Some(node)) => node,
                Ok(None) => return,
                Err(_) => continue,
            };
            let name = node.metadata.name.clone().unwrap_or_default();
            if ready.contains(&name) {
                if let Some(lapse) = lapse(&node) {
                    let _ = lapses_tx.send((name, lapse));
                }
            } else if is_ready(&node) && lapse(&node).is_none() {
                ready.insert(name);
                let _ = ready_tx.send(ready.len());
            }
        }
    });

    let started = tokio::time::Instant::now();
    let mut cluster = Cluster::on(
        backend,
        vec![pool("h100", NODES as u32, Some(GpuModel::H100_80GB))],
    )
    .await;
    cluster.start_operator().await;
    cluster.apply(gpuop_sim::demo::DEFAULT_POLICY).await;
    let all_ready = tokio::time::timeout(Duration::from_secs(600), ready_count.wait_for(|n| *n == NODES))
        .await
        .map(|waited| waited.is_ok());
    assert!(
        all_ready == Ok(true),
        "{} of {NODES} nodes Ready after 600 s",
        *ready_count.borrow()
    );
    let joined = started.elapsed();
    // Longer than the grace period, and than the controller's 5 s look at the Leases.
    tokio::time::sleep(GRACE_PERIOD + Duration::from_secs(20)).await;
    watch.abort();
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    while let Ok((node, lapse)) = lapses.try_recv() {
        seen.entry(node).or_default().push(lapse);
    }
    assert!(
        seen.is_empty(),
        "{} of {NODES} nodes lapsed after they were Ready (joined in {joined:?}): {:?}",
        seen.len(),
        seen.iter().take(10).collect::<Vec<_>>()
    );
    cluster.stop().await;
}

gpuop_testkit::two_backends!(
    the_controllers_find_simulated_pods_rolled_out_available_and_gone_with_their_node
);

/// The pods the simulated kubelets run satisfy the cluster's controllers as a real kubelet's do: every
/// operand DaemonSet with a rolling update is rolled out as `kubectl rollout status` judges it, a workload
/// ReplicaSet has all its replicas available; when a node is deleted, its pods are garbage collected, the
/// ReplicaSet replaces its pod elsewhere and the DaemonSets count one node fewer, rolled out again.
async fn the_controllers_find_simulated_pods_rolled_out_available_and_gone_with_their_node(backend: Backend) {
    const REPLICAS: i32 = 3;
    let mut cluster = Cluster::on(backend, vec![pool("gpu", 3, Some(GpuModel::T4))]).await;
    let web: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }))
    .expect("a ReplicaSet");
    let replica_sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), "default");
    replica_sets
        .create(&PostParams::default(), &web)
        .await
        .expect("the workload is created");
    cluster.start_operator().await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    let patience = Duration::from_secs(60);
    judged_by_the_controllers(&cluster, REPLICAS, 3, patience).await;

    // A node is deleted (the cloud took it back): the pod garbage collector removes its pods (a real one
    // after a quarantine of 40 s, checking every 20 s).
    let pods: Api<Pod> = Api::all(cluster.client.clone());
    let web_pods = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("pods listed");
    let node = web_pods
        .items
        .iter()
        .find_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .expect("a workload pod runs on some node");
    cluster
        .simulation
        .apply(&Action::NodeLeaves(node.clone()))
        .await
        .expect("the node leaves");
    let gc_patience = Duration::from_secs(180);
    until_within(
        &format!("the pods of deleted node {node} are collected"),
        gc_patience,
        Duration::from_secs(1),
        || async {
            let left = pods
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await
                .map_err(|e| e.to_string())?;
            let names: Vec<String> = left.items.iter().map(ResourceExt::name_any).collect();
            names.is_empty().then_some(()).ok_or(format!("{names:?}"))
        },
    )
    .await;
    judged_by_the_controllers(&cluster, REPLICAS, 2, patience).await;
    cluster.stop().await;
}

/// Waits until the workload has `replicas` available, some operand DaemonSet runs on `gpu_nodes` nodes (the
/// MIG manager, say, runs on none of these), and every operand DaemonSet with a rolling update is rolled
/// out: the status the DaemonSet and ReplicaSet controllers computed from the pods.
async fn judged_by_the_controllers(cluster: &Cluster, replicas: i32, gpu_nodes: i32, patience: Duration) {
    let replica_sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), "default");
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    until_within(
        "the controllers find the workload available and the operands rolled out",
        patience,
        Duration::from_millis(200),
        || async {
            let web = replica_sets.get("web").await.map_err(|e| e.to_string())?;
            let status = web.status.clone().unwrap_or_default();
            if status.available_replicas != Some(replicas)
                || status.ready_replicas != Some(replicas)
                || status.observed_generation != web.metadata.generation
            {
                return Err(format!("ReplicaSet web: {status:?}"));
            }
            let listed = daemonsets
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let rolling: Vec<&DaemonSet> = listed
                .items
                .iter()
                .filter(|ds| {
                    ds.spec
                        .as_ref()
                        .and_then(|s| s.update_strategy.as_ref())
                        .and_then(|u| u.type_.as_deref())
                        == Some("RollingUpdate")
                })
                .collect();
            let on_every_gpu_node = rolling
                .iter()
                .filter(|ds| ds.status.as_ref().map(|s| s.desired_number_scheduled) == Some(gpu_nodes))
                .count();
            if on_every_gpu_node == 0 {
                return Err(format!("no operand DaemonSet runs on {gpu_nodes} nodes"));
            }
            for ds in rolling {
                rollout_status(ds).map_err(|waiting| format!("DaemonSet {}: {waiting}", ds.name_any()))?;
            }
            Ok(())
        },
    )
    .await;
}

/// `kubectl rollout status daemonset/NAME`'s verdict: done once the controller has seen the latest
/// generation and every node it should run on has the latest template's pod, available.
fn rollout_status(ds: &DaemonSet) -> Result<(), String> {
    let status = ds.status.clone().unwrap_or_default();
    if ds.metadata.generation > status.observed_generation {
        return Err("waiting for the rollout to be observed".to_owned());
    }
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    if updated < desired {
        return Err(format!("{updated} of {desired} updated pods are scheduled"));
    }
    let available = status.number_available.unwrap_or(0);
    if available < desired {
        return Err(format!("{available} of {desired} updated pods are available"));
    }
    Ok(())
}
