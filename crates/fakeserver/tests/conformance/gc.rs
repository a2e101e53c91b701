//! Garbage collection through owner references (background, foreground, orphan), finalizers with
//! kube-runtime's `finalizer` helper under a `Controller`, and namespace cleanup.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::support::{configmap, created, daemonset, failure, merge_patched, pod, server, within};

async fn owned_pods(server: &gpuop_fakeserver::FakeServer) -> (Api<DaemonSet>, Api<Pod>) {
    let daemonsets: Api<DaemonSet> = Api::default_namespaced(server.client());
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let owner = created(&daemonsets, &daemonset("plugin")).await;
    let mut reference = owner.controller_owner_ref(&()).expect("owner reference");
    // As the DaemonSet controller sets it: foreground deletion waits only for blocking dependents.
    reference.block_owner_deletion = Some(true);
    for name in ["plugin-a", "plugin-b"] {
        let mut p = pod(name, Some("gpu-1"));
        p.metadata.owner_references = Some(vec![reference.clone()]);
        created(&pods, &p).await;
    }
    created(&pods, &pod("unowned", Some("gpu-1"))).await;
    (daemonsets, pods)
}

async fn pod_names(pods: &Api<Pod>) -> Vec<String> {
    pods.list(&Default::default())
        .await
        .expect("listed")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect()
}

#[tokio::test]
async fn background_deletion_takes_the_dependents() {
    let server = server();
    let (daemonsets, pods) = owned_pods(&server).await;
    daemonsets
        .delete("plugin", &DeleteParams::background())
        .await
        .expect("deleted");
    assert_eq!(pod_names(&pods).await, ["unowned"]);
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let server = server();
    let (daemonsets, pods) = owned_pods(&server).await;
    merge_patched(
        &pods,
        "plugin-a",
        json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    )
    .await;
    daemonsets
        .delete("plugin", &DeleteParams::foreground())
        .await
        .expect("deleting");
    let owner = daemonsets.get("plugin").await.expect("still there");
    assert!(owner.metadata.deletion_timestamp.is_some());
    assert_eq!(owner.finalizers(), ["foregroundDeletion"]);
    let held = pods.get("plugin-a").await.expect("held by its finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(pod_names(&pods).await, ["plugin-a", "unowned"]);

    merge_patched(&pods, "plugin-a", json!({"metadata": {"finalizers": null}})).await;
    assert!(
        failure(daemonsets.get("plugin").await).is_not_found(),
        "the owner goes with its last dependent"
    );
}

#[tokio::test]
async fn orphan_deletion_leaves_dependents_without_the_owner() {
    let server = server();
    let (daemonsets, pods) = owned_pods(&server).await;
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    daemonsets.delete("plugin", &orphan).await.expect("deleted");
    assert!(failure(daemonsets.get("plugin").await).is_not_found());
    assert_eq!(pod_names(&pods).await, ["plugin-a", "plugin-b", "unowned"]);
    let orphaned = pods.get("plugin-a").await.expect("kept");
    assert_eq!(orphaned.metadata.owner_references, None);
}

#[tokio::test]
async fn a_dependent_with_another_live_owner_only_loses_the_reference() {
    let server = server();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client());
    let first = created(&configmaps, &configmap("first")).await;
    let second = created(&configmaps, &configmap("second")).await;
    let mut shared = configmap("shared");
    shared.metadata.owner_references = Some(vec![
        first.owner_ref(&()).expect("ref"),
        second.owner_ref(&()).expect("ref"),
    ]);
    created(&configmaps, &shared).await;
    configmaps
        .delete("first", &DeleteParams::default())
        .await
        .expect("deleted");
    let kept = configmaps.get("shared").await.expect("kept");
    let owners: Vec<String> = kept.owner_references().iter().map(|o| o.name.clone()).collect();
    assert_eq!(owners, ["second"]);
}

#[tokio::test]
async fn a_controller_with_a_finalizer_cleans_up_before_the_object_goes() {
    let server = server();
    let client = server.client_as("probe-controller");
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cleanups = Arc::new(AtomicUsize::new(0));
    let reconcile_api = api.clone();
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(
            move |cm: Arc<ConfigMap>, cleanups: Arc<AtomicUsize>| {
                let api = reconcile_api.clone();
                async move {
                    finalizer(&api, "example.com/cleanup", cm, move |event| async move {
                        if let Finalizer::Cleanup(_) = event {
                            cleanups.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok::<_, std::convert::Infallible>(Action::await_change())
                    })
                    .await
                }
            },
            |_, _, _| Action::requeue(Duration::from_millis(50)),
            cleanups.clone(),
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);

    let plain: Api<ConfigMap> = Api::default_namespaced(server.client());
    created(&plain, &configmap("watched")).await;
    within("finalizer added", async {
        loop {
            if plain.get("watched").await.expect("exists").finalizers() == ["example.com/cleanup"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    plain
        .delete("watched", &DeleteParams::default())
        .await
        .expect("deleting");
    within("cleanup and removal", async {
        while plain.get_opt("watched").await.expect("readable").is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    handle.abort();
    assert_eq!(cleanups.load(Ordering::SeqCst), 1);
    assert!(
        server.requests().writes_by("probe-controller") >= 2,
        "the controller patched the finalizer in and out"
    );
}

#[tokio::test]
async fn deleting_a_namespace_empties_it_first() {
    let server = server();
    let namespaces: Api<Namespace> = Api::all(server.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "gpu-operator"}})).expect("ns");
    created(&namespaces, &ns).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(server.client(), "gpu-operator");
    let mut held = configmap("held");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    created(&configmaps, &held).await;
    created(&configmaps, &configmap("plain")).await;

    namespaces
        .delete("gpu-operator", &DeleteParams::default())
        .await
        .expect("deleting");
    let terminating = namespaces
        .get("gpu-operator")
        .await
        .expect("waits for its content");
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    assert!(failure(configmaps.get("plain").await).is_not_found());
    let refused = failure(
        configmaps
            .create(&PostParams::default(), &configmap("late"))
            .await,
    );
    assert_eq!(refused.code, 403);

    merge_patched(&configmaps, "held", json!({"metadata": {"finalizers": null}})).await;
    assert!(failure(namespaces.get("gpu-operator").await).is_not_found());
}
