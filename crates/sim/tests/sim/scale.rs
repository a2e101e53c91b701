//! Scale tests that guard the design, not the clock: in a converged 2,000-GPU-node cluster the operator's
//! work (passes, node judgements, rendered objects, requests) for one change must not grow with the
//! cluster, and changes no GPU operator reads must cause no work at all.
//!
//! The cluster is played at no cost: the nodes are stored directly, and once the operator has labelled
//! them and applied its DaemonSets the test stores, as the DaemonSet controller and the kubelets would, one
//! Ready pod of each DaemonSet's single revision on every node its template fits. Only the operator does
//! real work, and its counters (`Metrics::work`) and the server's request counts are what is asserted.

use std::time::Duration;

use futures::StreamExt;
use gpuop_api::ClusterPolicy;
use gpuop_api::labels::UPGRADE_STATE;
use gpuop_api::placement::daemon_pod_fits;
use gpuop_api::status::State;
use gpuop_fakeserver::{FakeServer, Verb};
use gpuop_operator::metrics::Work;
use gpuop_operator::run::{self, Config, Running};
use gpuop_sim::churn::{Churn, Churning};
use gpuop_sim::cluster_spec::node_object;
use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::operator::pool;

/// The cluster's size; `SCALE_TEST_NODES` overrides it to look into a failure on a smaller cluster.
fn nodes() -> u32 {
    std::env::var("SCALE_TEST_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000)
}
const REVISION: &str = "rev1";

/// Generous for a debug build of 2,000 nodes on a loaded two-core machine: a failure guard, not a
/// performance assertion (the benchmarks measure time).
const PATIENCE: Duration = Duration::from_secs(600);

/// Waits until the check passes, checking once a second (each check may list 2,000 nodes; polling faster
/// would take the CPU the operator needs); panics with its last answer after [`PATIENCE`].
async fn until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    crate::operator::until_within(what, PATIENCE, Duration::from_secs(1), check).await;
}

struct Converged {
    server: FakeServer,
    client: Client,
    operator: Running,
}

/// Stores `NODES` GPU nodes, starts the operator, applies the sample policy and plays the DaemonSet
/// controller and the kubelets until the policy is `ready` and every node's driver upgrade is done.
async fn converged() -> Converged {
    let server = FakeServer::new();
    let client = server.client_as(gpuop_sim::USER_AGENT);
    install(&client).await.expect("CRDs and namespace install");
    let count = nodes();
    let gpu_pool = pool("gpu", count, Some(gpuop_sim::hardware::GpuModel::H100_80GB));
    let started = tokio::time::Instant::now();
    for index in 0..count {
        let node = node_object(&format!("gpu-{index}"), &gpu_pool, true, index);
        server
            .insert(serde_json::to_value(node).expect("a node serializes"))
            .expect("node stored");
    }
    eprintln!(
        "scale: {count} nodes stored in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let operator = run::start(
        server.client_as(gpuop_operator::USER_AGENT),
        Config::in_process(NAMESPACE),
    )
    .await
    .expect("operator starts");
    apply_policy(&client, DEFAULT_POLICY)
        .await
        .expect("policy applied");

    let nodes: Api<Node> = Api::all(client.clone());
    until("every node carries its deploy switches", || async {
        let unlabelled = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|n| !n.labels().contains_key("nvidia.com/gpu.deploy.driver"))
            .count();
        (unlabelled == 0)
            .then_some(())
            .ok_or(format!("{unlabelled} nodes unlabelled"))
    })
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    until("the operator's DaemonSets exist", || async {
        let count = daemonsets
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        (count >= 7).then_some(()).ok_or(format!("{count} DaemonSets"))
    })
    .await;
    let nodes = nodes
        .list(&ListParams::default())
        .await
        .expect("nodes list")
        .items;
    let started = tokio::time::Instant::now();
    let mut pods = Vec::new();
    for daemonset in daemonsets.list(&ListParams::default()).await.expect("list").items {
        pods.extend(play_daemonset(&server, &daemonset, &nodes));
    }
    // The server starts every pod Pending, as a real one does; its kubelet reports it ready.
    futures::stream::iter(pods)
        .for_each_concurrent(16, |pod| {
            let client = client.clone();
            async move { set_ready(&client, &pod, true).await }
        })
        .await;
    eprintln!("scale: pods stored in {:.1}s", started.elapsed().as_secs_f64());

    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    let all_nodes: Api<Node> = Api::all(client.clone());
    until("the policy is ready and every driver upgrade done", || async {
        let policy = policies.get("cluster-policy").await.map_err(|e| e.to_string())?;
        let status = policy.status.unwrap_or_default();
        if status.state != State::Ready {
            let why: Vec<String> = status
                .conditions
                .iter()
                .flatten()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            return Err(format!("state {:?}: {}", status.state, why.join("; ")));
        }
        let pending = all_nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|n| n.labels().get(UPGRADE_STATE).map(String::as_str) != Some("upgrade-done"))
            .count();
        (pending == 0)
            .then_some(())
            .ok_or(format!("ready, but {pending} nodes not upgrade-done"))
    })
    .await;
    Converged {
        server,
        client,
        operator,
    }
}

/// Stores the DaemonSet's only ControllerRevision and a pod of it on every node it fits; returns the pods'
/// names.
fn play_daemonset(server: &FakeServer, daemonset: &DaemonSet, nodes: &[Node]) -> Vec<String> {
    let name = daemonset.name_any();
    let uid = daemonset.uid().expect("a stored DaemonSet has a uid");
    let owner = json!([{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true,
    }]);
    server
        .insert(json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {
                "name": format!("{name}-{REVISION}"), "namespace": NAMESPACE,
                "labels": {"controller-revision-hash": REVISION}, "ownerReferences": owner,
            },
            "revision": 1,
        }))
        .expect("revision stored");
    let template = &daemonset.spec.as_ref().expect("spec").template;
    let spec = template.spec.clone().expect("template spec");
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert("controller-revision-hash".into(), REVISION.into());
    // What the operator reads of a pod's spec: its node and, of a driver pod, the configuration digest in
    // its containers' environment. The rest of the template would only cost the server time per pod.
    let containers: Vec<serde_json::Value> = spec
        .containers
        .iter()
        .map(|c| json!({"name": c.name, "image": c.image, "env": c.env}))
        .collect();
    let mut pods = Vec::new();
    for node in nodes.iter().filter(|node| daemon_pod_fits(node, &spec).is_ok()) {
        let node_name = node.name_any();
        let pod = format!("{name}-{node_name}");
        let pod_spec = json!({"nodeName": node_name, "containers": containers});
        server
            .insert(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": pod, "namespace": NAMESPACE,
                    "labels": labels, "ownerReferences": owner,
                },
                "spec": pod_spec,
            }))
            .expect("pod stored");
        pods.push(pod);
    }
    pods
}

fn ready_status(ready: bool) -> serde_json::Value {
    let status = if ready { "True" } else { "False" };
    json!({
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": "2026-12-01T00:00:00Z"},
            {"type": "ContainersReady", "status": status, "lastTransitionTime": "2026-12-01T00:00:00Z"},
        ],
    })
}

async fn policy_state(client: &Client) -> Option<State> {
    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    policies
        .get("cluster-policy")
        .await
        .ok()
        .and_then(|p| p.status)
        .map(|s| s.state)
}

async fn set_ready(client: &Client, pod: &str, ready: bool) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.patch_status(
        pod,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": ready_status(ready) })),
    )
    .await
    .expect("pod status patched");
}

/// Waits until the operator has done no work for longer than every trust window: what it did for an
/// earlier change (a status write's event, a count written a second later) is over.
async fn quiet(cluster: &Converged) {
    let mut quiet_since = (tokio::time::Instant::now(), cluster.operator.metrics.work());
    until("the operator is quiet", || {
        let now = cluster.operator.metrics.work();
        if now != quiet_since.1 {
            quiet_since = (tokio::time::Instant::now(), now);
        }
        let quiet = quiet_since.0.elapsed();
        async move {
            (quiet > gpuop_operator::STEADY_STATE_WINDOW)
                .then_some(())
                .ok_or(format!("quiet for {quiet:?}"))
        }
    })
    .await;
}

/// The operator's work and requests (verb, resource and subresource, with their count) while `change` runs
/// and until `settled` holds.
async fn work_of<C, S, SF>(cluster: &Converged, change: C, mut settled: S) -> (Work, Vec<(String, u64)>)
where
    C: std::future::Future<Output = ()>,
    S: FnMut() -> SF,
    SF: std::future::Future<Output = Result<(), String>>,
{
    let before = (cluster.operator.metrics.work(), cluster.server.requests());
    change.await;
    until("the operator settles", &mut settled).await;
    let work = cluster.operator.metrics.work() - before.0;
    let requests = cluster
        .server
        .requests()
        .since(&before.1)
        .iter()
        .filter(|(key, _)| key.verb != Verb::Watch && key.client.starts_with("gpu-operator-rs"))
        .map(|(key, count)| {
            (
                format!("{:?} {} {}", key.verb, key.resource, key.subresource),
                count,
            )
        })
        .collect();
    (work, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_2000_node_cluster_the_operators_work_follows_what_changed() {
    let cluster = converged().await;
    let client = cluster.client.clone();
    let pod = format!("nvidia-device-plugin-daemonset-gpu-{}", nodes() / 2);

    // One pod stops being ready: the status says so. Each change is measured from a quiet operator, so
    // that the work of the one before (its status write's event, under load) does not count in it.
    quiet(&cluster).await;
    let (lost, _) = work_of(&cluster, set_ready(&client, &pod, false), || async {
        match policy_state(&client).await {
            Some(State::NotReady) => Ok(()),
            other => Err(format!("state {other:?}")),
        }
    })
    .await;
    // It becomes ready again: that is all the operator may work on.
    quiet(&cluster).await;
    let (regained, requests) = work_of(&cluster, set_ready(&client, &pod, true), || async {
        match policy_state(&client).await {
            Some(State::Ready) => Ok(()),
            other => Err(format!("state {other:?}")),
        }
    })
    .await;
    eprintln!("scale: pod lost {lost:?}; pod regained {regained:?}, requests {requests:?}");
    for (what, work) in [("pod lost", lost), ("pod regained", regained)] {
        assert!(work.policy_passes <= 3, "{what}: {work:?}");
        assert!(work.upgrade_passes <= 3, "{what}: {work:?}");
        assert!(
            work.nodes_judged <= 10,
            "{what}: one pod changed but the operator judged {} nodes: {work:?}",
            work.nodes_judged
        );
        assert_eq!(work.objects_rendered, 0, "{what}: nothing to render: {work:?}");
    }
    let total: u64 = requests.iter().map(|(_, count)| count).sum();
    assert!(
        total <= 2,
        "a status write and its event expected, saw {total} requests (watches not counted): {requests:?}"
    );

    // First the operator goes quiet: writes it made come back for a check within the trust windows.
    quiet(&cluster).await;

    // Unrelated churn on a tenth of the nodes a second (the simulator's churn: heartbeat times, a label and
    // an annotation no GPU operator reads), for longer than every trust window. Nothing may wake.
    let names: Vec<String> = (0..nodes()).map(|index| format!("gpu-{index}")).collect();
    let before = (cluster.operator.metrics.work(), cluster.server.requests());
    let stop = tokio_util::sync::CancellationToken::new();
    let churning = Churning::start(
        client.clone(),
        Churn::new(0.1, 1).expect("a valid share"),
        move || names.clone(),
        &stop,
    );
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW + Duration::from_secs(1)).await;
    let changes = churning.stop().await;
    assert!(changes > 0, "the churn changed no node");
    let work = cluster.operator.metrics.work() - before.0;
    // A watch the server ended (they time out) and the operator started again is no work churn caused.
    let requests = cluster
        .server
        .requests()
        .since(&before.1)
        .matching(|key| key.verb != Verb::Watch && key.client.starts_with("gpu-operator-rs"));
    assert_eq!(
        (work.policy_passes, work.upgrade_passes, work.nodes_judged),
        (0, 0, 0),
        "{changes} unrelated node changes woke the operator: {work:?}"
    );
    assert_eq!(requests, 0, "unrelated churn made the operator send requests");
    cluster.operator.stop().await;
}
