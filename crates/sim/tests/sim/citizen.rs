//! The simulator as a citizen of a real cluster: what a real control plane's own controllers decide about
//! the simulated nodes and their pods. These tests exist only on a real control plane (`..._real_control_plane`,
//! ignored unless asked for): the fake server runs no node lifecycle, DaemonSet or garbage collector
//! controller, so there they could not fail.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::TryStreamExt;
use gpuop_sim::hardware::GpuModel;
use gpuop_testkit::Backend;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::operator::{Cluster, pool};

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
