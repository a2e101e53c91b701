//! The node labeller against the fake API server: what it does when the node it read changed before its
//! write landed, whether a person did it or the API server says so for no visible reason.

use std::time::Duration;

use gpuop_api::labels::OWNED_LABELS;
use gpuop_api::labels::{DEPLOY_PREFIX, GPU_PRESENT};
use gpuop_fakeserver::{Faults, InjectedError, Verb};
use gpuop_sim::demo::DEFAULT_POLICY;
use gpuop_sim::hardware::GpuModel;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::operator::{Cluster, pool};

const NFD_GPU: &str = "feature.node.kubernetes.io/pci-10de.present";
/// How late the operator's node watch delivers events in the race below.
const LAG: Duration = Duration::from_secs(3);
/// The person's edit follows the node's change this much later: the operator has the changed node and not
/// the edit for this long, and its write comes after the edit, since `GAP` < `LAG`.
const GAP: Duration = Duration::from_secs(2);

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.labels().get(key).map(String::as_str)
}

/// Requests of the operator's client with this verb on nodes and this code.
fn operator_requests(cluster: &Cluster, verb: Verb, code: u16) -> u64 {
    cluster.server().requests().matching(|key| {
        key.verb == verb
            && key.resource == "nodes"
            && key.subresource.is_empty()
            && key.code == code
            && key.client.split('/').next() == gpuop_operator::USER_AGENT.split('/').next()
    })
}

/// Waits until every named node carries the operator's `gpu.present` and driver switch.
async fn labelled(cluster: &Cluster, names: &[&str]) {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    cluster
        .until("the operator labels the GPU nodes", || {
            let nodes = nodes.clone();
            async move {
                for name in names {
                    let node = nodes.get(name).await.map_err(|e| e.to_string())?;
                    let driver = format!("{DEPLOY_PREFIX}driver");
                    if label(&node, GPU_PRESENT) != Some("true") || label(&node, &driver) != Some("true") {
                        return Err(format!("{name}: {:?}", node.labels()));
                    }
                }
                Ok(())
            }
        })
        .await;
}

/// The operator's node cache lags [`LAG`] behind the API server (as an informer does under load). A node
/// becomes a GPU node, and a person switches DCGM's exporter off on it [`GAP`] later: the operator, which
/// sees the node become a GPU node only after the person's edit, and the edit itself [`GAP`] later still,
/// decides on the node as it was before the edit, and must not write over the person's `false`. Before the
/// labeller's writes carried the node's `resourceVersion`, its merge patch set the switch back to `true`.
#[tokio::test]
async fn a_label_a_person_sets_between_the_operators_read_and_write_is_kept() {
    let mut cluster = Cluster::without_operator(vec![pool("gpu", 1, Some(GpuModel::T4))]).await;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "bare-0" } })).unwrap(),
        )
        .await
        .expect("node creates");
    cluster
        .server()
        .set_faults(Faults::new(13).delay_watch_events("nodes", LAG));
    cluster.start_operator().await;
    cluster.apply(DEFAULT_POLICY).await;
    // The labeller has its policy once it has labelled the simulated GPU node.
    labelled(&cluster, &["gpu-0"]).await;

    let exporter = format!("{DEPLOY_PREFIX}dcgm-exporter");
    let person = |labels: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    "bare-0",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "labels": labels } })),
                )
                .await
                .expect("node patches")
        }
    };
    let conflicts_before = operator_requests(&cluster, Verb::Patch, 409);
    person(json!({ NFD_GPU: "true" })).await;
    // Not a wait for a condition: the two writes must reach the operator's cache this far apart.
    tokio::time::sleep(GAP).await;
    person(json!({ exporter.as_str(): "false" })).await;
    labelled(&cluster, &["bare-0"]).await;

    let node = nodes.get("bare-0").await.expect("node reads");
    assert_eq!(
        label(&node, &exporter),
        Some("false"),
        "the person's switch survives: {:?}",
        node.labels()
    );
    let owned = node.annotations().get(OWNED_LABELS).cloned().unwrap_or_default();
    assert!(
        !owned.contains(&exporter),
        "the operator does not claim the person's label: {owned}"
    );
    assert!(
        operator_requests(&cluster, Verb::Patch, 409) > conflicts_before,
        "the operator's write raced the person's (answered 409), as the test intends"
    );
    cluster.stop().await;
}

/// Half the operator's node patches answered 409 (as when the node changed since it was read): each is
/// retried at once on the node as a GET returns it, and every GPU node is labelled.
#[tokio::test]
async fn conflicts_are_retried_on_the_node_as_the_api_server_has_it() {
    let mut cluster = Cluster::without_operator(vec![pool("gpu", 2, Some(GpuModel::T4))]).await;
    cluster.server().set_faults(Faults::new(1).error(
        Some(Verb::Patch),
        Some("nodes"),
        0.5,
        InjectedError::Conflict,
    ));
    cluster.start_operator().await;
    cluster.apply(DEFAULT_POLICY).await;
    labelled(&cluster, &["gpu-0", "gpu-1"]).await;
    cluster.server().set_faults(Faults::new(1));
    let requests: Vec<String> = cluster
        .server()
        .requests()
        .iter()
        .filter(|(key, _)| key.resource == "nodes")
        .map(|(key, n)| format!("{key:?} {n}"))
        .collect();
    assert!(
        operator_requests(&cluster, Verb::Patch, 409) > 0,
        "conflicts were injected: {requests:#?}"
    );
    assert!(
        operator_requests(&cluster, Verb::Get, 200) > 0,
        "a conflict is followed by reading the node afresh"
    );
    cluster.stop().await;
}
