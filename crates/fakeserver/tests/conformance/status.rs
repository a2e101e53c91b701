//! Status subresources and generation: main writes ignore status, status writes ignore the rest, and
//! `metadata.generation` moves only when the spec does (or deletion starts). Also the pod subresources
//! `binding` and `eviction`.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::support::{
    assert_only_status_written, created, daemonset, failure, merge_patched, merge_patched_status, pod, server,
};

#[tokio::test]
async fn main_writes_ignore_status_and_status_writes_ignore_the_rest() {
    let server = server();
    let api: Api<DaemonSet> = Api::default_namespaced(server.client());
    let mut both = created(&api, &daemonset("plugin")).await;
    both.status.as_mut().expect("status").number_ready = 5;
    both.metadata
        .labels
        .get_or_insert_default()
        .insert("touched".into(), "yes".into());
    let main = api
        .replace("plugin", &PostParams::default(), &both)
        .await
        .expect("replaced");
    assert_eq!(
        main.status.as_ref().map(|s| s.number_ready),
        Some(0),
        "status ignored on the main resource"
    );
    assert_eq!(main.metadata.generation, Some(1), "a label is not a spec change");

    let mut status_write = main.clone();
    status_write.status.as_mut().expect("status").number_ready = 5;
    status_write.spec.as_mut().expect("spec").min_ready_seconds = Some(30);
    let status = api
        .replace_status("plugin", &PostParams::default(), &status_write)
        .await
        .expect("status replaced");
    assert_only_status_written(&status, 5);
    assert_eq!(status.metadata.generation, Some(1));

    let spec = merge_patched(&api, "plugin", json!({"spec": {"minReadySeconds": 30}})).await;
    assert_eq!(
        spec.metadata.generation,
        Some(2),
        "a spec change moves the generation"
    );
    assert_eq!(
        spec.status.as_ref().map(|s| s.number_ready),
        Some(5),
        "and keeps the status"
    );
}

#[tokio::test]
async fn nodes_keep_the_status_they_are_created_with() {
    let server = server();
    let api: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("node");
    let created = created(&api, &node).await;
    let capacity = created.status.and_then(|s| s.capacity).expect("capacity");
    assert_eq!(capacity.get("nvidia.com/gpu").map(|q| q.0.as_str()), Some("8"));
}

#[tokio::test]
async fn deletion_with_finalizers_sets_a_timestamp_and_waits() {
    let server = server();
    let api: Api<DaemonSet> = Api::default_namespaced(server.client());
    let mut ds = daemonset("plugin");
    ds.metadata.finalizers = Some(vec!["nvidia.com/cleanup".into()]);
    created(&api, &ds).await;
    let pending = api
        .delete("plugin", &DeleteParams::default())
        .await
        .expect("deleting");
    let pending = pending.left().expect("the object, still there");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(
        pending.metadata.generation,
        Some(2),
        "deletion moves the generation"
    );
    let refused = failure(
        api.patch(
            "plugin",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["nvidia.com/cleanup", "x.io/new"]}})),
        )
        .await,
    );
    assert_eq!(refused.code, 422, "no new finalizers once deleting");
    merge_patched(&api, "plugin", json!({"metadata": {"finalizers": null}})).await;
    assert!(failure(api.get("plugin").await).is_not_found());
}

#[tokio::test]
async fn binding_places_a_pod_once() {
    let server = server();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    created(&api, &pod("p", None)).await;
    let client = server.client();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "gpu-1"}});
    let request = http::Request::post("/api/v1/namespaces/default/pods/p/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding).expect("json"))
        .expect("request");
    client
        .request::<kube::core::Status>(request)
        .await
        .expect("bound");
    let bound = api.get("p").await.expect("found");
    assert_eq!(bound.spec.and_then(|s| s.node_name).as_deref(), Some("gpu-1"));
    let again = http::Request::post("/api/v1/namespaces/default/pods/p/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding).expect("json"))
        .expect("request");
    assert!(failure(client.request::<kube::core::Status>(again).await).is_conflict());
}

#[tokio::test]
async fn eviction_honours_disruption_budgets() {
    let server = server();
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    for name in ["a", "b"] {
        created(&pods, &pod(name, Some("gpu-1"))).await;
        let ready =
            json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        merge_patched_status(&pods, name, ready).await;
    }
    let budgets: Api<PodDisruptionBudget> = Api::default_namespaced(server.client());
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "gpu"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "gpu"}}}
    }))
    .expect("pdb");
    created(&budgets, &budget).await;
    pods.evict("a", &EvictParams::default())
        .await
        .expect("one may go");
    let refused = failure(pods.evict("b", &EvictParams::default()).await);
    assert_eq!((refused.code, refused.reason.as_str()), (429, "TooManyRequests"));
    assert!(pods.get("b").await.is_ok());
}
