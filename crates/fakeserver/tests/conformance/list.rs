//! LIST: resource versions, paging with `limit` and `continue` over a consistent snapshot, exact-version
//! reads, label-selector syntax and its edge cases, field selectors.

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{Api, ListParams, VersionMatch};
use serde_json::json;

use super::support::{
    assert_starts_with, configmap, created, failure, labelled_configmap, merge_patched, pod, server,
};

fn names<K: kube::ResourceExt>(items: &[K]) -> Vec<String> {
    items.iter().map(kube::ResourceExt::name_any).collect()
}

#[tokio::test]
async fn pages_walk_one_consistent_snapshot() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    for i in 0..7 {
        created(&api, &configmap(&format!("cm-{i}"))).await;
    }
    let first = api
        .list(&ListParams::default().limit(3))
        .await
        .expect("first page");
    assert_eq!(names(&first.items), ["cm-0", "cm-1", "cm-2"]);
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    let version = first.metadata.resource_version.clone();
    assert!(
        version.as_deref().is_some_and(|v| !v.is_empty()),
        "lists carry a resource version"
    );
    // A change after the first page is not part of this list.
    created(&api, &configmap("cm-late")).await;
    let token = first.metadata.continue_.clone().expect("more pages");
    let second = api
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .expect("second page");
    assert_eq!(names(&second.items), ["cm-3", "cm-4", "cm-5"]);
    assert_eq!(second.metadata.resource_version, version);
    let token = second.metadata.continue_.clone().expect("more pages");
    let third = api
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .expect("last page");
    assert_eq!(names(&third.items), ["cm-6"]);
    assert_eq!(third.metadata.continue_, None);

    // After compaction the token is too old.
    let again = api
        .list(&ListParams::default().limit(3))
        .await
        .expect("first page");
    server.compact();
    let token = again.metadata.continue_.expect("more pages");
    let expired = failure(
        api.list(&ListParams::default().limit(3).continue_token(&token))
            .await,
    );
    assert_eq!((expired.code, expired.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn resource_version_rules() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = created(&api, &configmap("a")).await;
    let then = a.metadata.resource_version.clone().expect("versioned");
    created(&api, &configmap("b")).await;
    merge_patched(&api, "a", json!({"data": {"k": "v"}})).await;

    // resourceVersion=0 is served from "cache" and ignores limit, as the API server does (kubectl sends
    // `limit=500&resourceVersion=0`; kube drops the version when a limit is set, so ask by hand).
    let request = http::Request::get("/api/v1/namespaces/default/configmaps?limit=1&resourceVersion=0")
        .body(Vec::new())
        .expect("request");
    let any: kube::core::ObjectList<ConfigMap> = server.client().request(request).await.expect("any");
    assert_eq!(names(&any.items), ["a", "b"]);
    assert_eq!(any.metadata.continue_, None);

    // An exact version shows the past.
    let exact = ListParams::default().at(&then).matching(VersionMatch::Exact);
    let past = api.list(&exact).await.expect("exact");
    assert_eq!(names(&past.items), ["a"]);
    assert_eq!(past.items[0].data, None);
    assert_eq!(past.metadata.resource_version.as_deref(), Some(then.as_str()));

    server.compact();
    assert_eq!(failure(api.list(&exact).await).code, 410);
    let future = ListParams::default()
        .at("999999")
        .matching(VersionMatch::NotOlderThan);
    assert_eq!(
        failure(api.list(&future).await).code,
        504,
        "too large resource version"
    );
}

#[tokio::test]
async fn label_selectors_with_every_operator() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let fixtures: [(&str, &[(&str, &str)]); 4] = [
        (
            "gpu-a100",
            &[
                ("nvidia.com/gpu.present", "true"),
                ("nvidia.com/gpu.product", "A100"),
            ],
        ),
        (
            "gpu-h100",
            &[
                ("nvidia.com/gpu.present", "true"),
                ("nvidia.com/gpu.product", "H100"),
            ],
        ),
        ("cpu", &[("nvidia.com/gpu.present", "false")]),
        ("bare", &[]),
    ];
    for (name, labels) in fixtures {
        created(&api, &labelled_configmap(name, labels)).await;
    }
    let select = |selector: &'static str| {
        let api = api.clone();
        async move {
            let mut found = names(
                &api.list(&ListParams::default().labels(selector))
                    .await
                    .expect("listed")
                    .items,
            );
            found.sort();
            found
        }
    };
    assert_eq!(
        select("nvidia.com/gpu.present=true").await,
        ["gpu-a100", "gpu-h100"]
    );
    assert_eq!(
        select("nvidia.com/gpu.present!=true").await,
        ["bare", "cpu"],
        "!= includes objects without the label"
    );
    assert_eq!(
        select("nvidia.com/gpu.product in (A100,V100)").await,
        ["gpu-a100"]
    );
    assert_eq!(
        select("nvidia.com/gpu.product notin (A100)").await,
        ["bare", "cpu", "gpu-h100"]
    );
    assert_eq!(select("!nvidia.com/gpu.present").await, ["bare"]);
    assert_eq!(
        select("nvidia.com/gpu.present,nvidia.com/gpu.product").await,
        ["gpu-a100", "gpu-h100"]
    );
    assert_eq!(
        select("nvidia.com/gpu.present=true,nvidia.com/gpu.product!=A100").await,
        ["gpu-h100"]
    );
    let malformed = failure(api.list(&ListParams::default().labels("a in (b")).await);
    assert_eq!((malformed.code, malformed.reason.as_str()), (400, "BadRequest"));
}

#[tokio::test]
async fn field_selectors_per_resource() {
    let server = server();
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    for (name, node) in [("a", Some("gpu-1")), ("b", Some("gpu-2")), ("c", None)] {
        created(&pods, &pod(name, node)).await;
    }
    let on = |selector: &'static str| {
        let pods = pods.clone();
        async move {
            names(
                &pods
                    .list(&ListParams::default().fields(selector))
                    .await
                    .expect("listed")
                    .items,
            )
        }
    };
    assert_eq!(on("spec.nodeName=gpu-1").await, ["a"]);
    assert_eq!(on("spec.nodeName=").await, ["c"], "unscheduled pods");
    assert_eq!(on("spec.nodeName!=gpu-1,status.phase=Pending").await, ["b", "c"]);
    assert_eq!(on("metadata.name=b").await, ["b"]);
    let all: Api<Pod> = Api::all(server.client());
    let everywhere = all
        .list(&ListParams::default().fields("metadata.namespace=default"))
        .await
        .expect("listed");
    assert_eq!(everywhere.items.len(), 3);
    let unsupported = failure(pods.list(&ListParams::default().fields("spec.priority=1")).await);
    assert_eq!(unsupported.code, 400);
    assert_starts_with(
        &unsupported.message,
        r#""spec.priority" is not a known field selector: only "metadata.name", "#,
    );

    let events: Api<Event> = Api::default_namespaced(server.client());
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "a", "namespace": "default"},
        "reason": "Scheduled", "type": "Normal"
    }))
    .expect("event");
    created(&events, &event).await;
    let about = events
        .list(&ListParams::default().fields("involvedObject.kind=Pod,involvedObject.name=a"))
        .await
        .expect("listed");
    assert_eq!(names(&about.items), ["e1"]);
}
