//! Create, get, update, patch and delete: server-set fields, preconditions, errors as the API server
//! words them, defaults, validation.

use gpuop_fakeserver::Verb;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::support::{
    assert_contains, assert_starts_with, call, configmap, created, daemonset, failure, json_of, pod, server,
    within,
};

#[tokio::test]
async fn the_server_sets_identity_and_versions() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let mut cm = configmap("a");
    cm.data = Some([("k".to_owned(), "v".to_owned())].into());
    let stored = created(&api, &cm).await;
    let meta = &stored.metadata;
    assert_eq!(meta.uid.as_ref().map(String::len), Some(36));
    assert_eq!(
        meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        Some("2025-01-01T00:00:00Z".into())
    );
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert_eq!(meta.generation, None, "configmaps do not track generation");
    let fetched = api.get("a").await.expect("found");
    assert_eq!(fetched.metadata.resource_version, meta.resource_version);
    assert_eq!(
        fetched
            .metadata
            .managed_fields
            .as_ref()
            .and_then(|m| m.first())
            .and_then(|m| m.manager.clone()),
        Some("unknown".into()),
        "a client without a user agent or fieldManager"
    );

    let daemonsets: Api<DaemonSet> = Api::default_namespaced(server.client());
    let ds = created(&daemonsets, &daemonset("plugin")).await;
    assert_eq!(ds.metadata.generation, Some(1));
}

#[tokio::test]
async fn errors_carry_the_reasons_clients_branch_on() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    created(&api, &configmap("a")).await;

    let exists = failure(api.create(&PostParams::default(), &configmap("a")).await);
    assert_eq!((exists.code, exists.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(exists.message, r#"configmaps "a" already exists"#);

    let missing = failure(api.get("nope").await);
    assert!(missing.is_not_found());
    assert_eq!(missing.message, r#"configmaps "nope" not found"#);

    let elsewhere: Api<ConfigMap> = Api::namespaced(server.client(), "nope");
    let no_namespace = failure(elsewhere.create(&PostParams::default(), &configmap("a")).await);
    assert_eq!(
        (no_namespace.code, no_namespace.message.as_str()),
        (404, r#"namespaces "nope" not found"#)
    );
}

#[tokio::test]
async fn generate_name_picks_a_free_name() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let mut template = configmap("");
    template.metadata.name = None;
    template.metadata.generate_name = Some("probe-".into());
    let first = created(&api, &template).await;
    let second = created(&api, &template).await;
    let (a, b) = (
        first.metadata.name.expect("named"),
        second.metadata.name.expect("named"),
    );
    assert!(a.starts_with("probe-") && a.len() == "probe-".len() + 5, "{a}");
    assert_ne!(a, b);
}

#[tokio::test]
async fn updates_are_conditional_on_the_resource_version() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let created = created(&api, &configmap("a")).await;

    let mut fresh = created.clone();
    fresh.data = Some([("k".to_owned(), "1".to_owned())].into());
    let updated = api
        .replace("a", &PostParams::default(), &fresh)
        .await
        .expect("current version");
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );

    let stale = failure(api.replace("a", &PostParams::default(), &fresh).await);
    assert!(stale.is_conflict());
    assert_eq!(
        stale.message,
        r#"Operation cannot be fulfilled on configmaps "a": the object has been modified; please apply your changes to the latest version and try again"#
    );

    // A write that changes nothing stores nothing: same version, no new event.
    let version = server.resource_version();
    let same = api
        .replace("a", &PostParams::default(), &updated)
        .await
        .expect("no-op");
    assert_eq!(same.metadata.resource_version, updated.metadata.resource_version);
    assert_eq!(server.resource_version(), version);
}

#[tokio::test]
async fn patches_of_every_kind() {
    let server = server();
    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut p = pod("p", None);
    p.metadata.finalizers = Some(vec!["example.com/a".into()]);
    created(&pods, &p).await;
    let pp = PatchParams::default();

    // JSON patch with a failing `test` changes nothing and answers 422.
    let wrong: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/b"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .expect("patch");
    let failed = failure(pods.patch("p", &pp, &Patch::<()>::Json(wrong)).await);
    assert_eq!(failed.code, 422);

    // Merge patch: null deletes, lists are replaced.
    let merged = pods
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"app": null, "tier": "gpu"}}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(
        merged.metadata.labels,
        Some([("tier".to_owned(), "gpu".to_owned())].into())
    );

    // Strategic merge: containers merge by name.
    let patch = json!({"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}});
    let strategic = pods
        .patch("p", &pp, &Patch::Strategic(patch))
        .await
        .expect("strategic patch");
    let containers = strategic.spec.expect("spec").containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].image.as_deref(), Some("busybox:1.37"));
    assert_eq!(
        containers[0].termination_message_path.as_deref(),
        Some("/dev/termination-log"),
        "kept"
    );
}

#[tokio::test]
async fn objects_read_back_with_the_servers_defaults() {
    let server = server();
    let daemonsets: Api<DaemonSet> = Api::default_namespaced(server.client());
    let ds = created(&daemonsets, &daemonset("plugin")).await;
    let spec = ds.spec.expect("spec");
    let strategy = spec.update_strategy.expect("defaulted");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(spec.revision_history_limit, Some(10));
    let container = &spec.template.spec.expect("pod spec").containers[0];
    assert_eq!(container.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(ds.status.expect("status").number_ready, 0);

    let pods: Api<Pod> = Api::default_namespaced(server.client());
    let mut critical = pod("critical", None);
    critical.spec.as_mut().expect("spec").priority_class_name = Some("system-node-critical".into());
    let created = created(&pods, &critical).await;
    assert_eq!(
        created.spec.as_ref().and_then(|s| s.priority),
        Some(2_000_001_000)
    );
    assert_eq!(created.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    let mut unknown = pod("unknown", None);
    unknown.spec.as_mut().expect("spec").priority_class_name = Some("nope".into());
    let refused = failure(pods.create(&PostParams::default(), &unknown).await);
    assert_eq!((refused.code, refused.reason.as_str()), (403, "Forbidden"));
}

/// Jobs (Helm's hooks) are served with the Job defaults, and a pod template that would restart forever is
/// refused as the real server refuses it.
#[tokio::test]
async fn jobs_are_defaulted_and_need_a_restart_policy_that_ends() {
    let server = server();
    let jobs: Api<kube::api::DynamicObject> = Api::default_namespaced_with(
        server.client(),
        &kube::api::ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&()),
    );
    let job = |name: &str, restart: &str| -> kube::api::DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": restart,
                "containers": [{"name": "c", "image": "ghcr.io/gpuop/gpu-operator:0.1.0"}]}}},
        }))
        .expect("job")
    };
    let created = created(&jobs, &job("hook", "Never")).await;
    assert_eq!(created.data["spec"]["backoffLimit"], 6);
    assert_eq!(created.data["spec"]["completions"], 1);
    let refused = failure(
        jobs.create(&PostParams::default(), &job("forever", "Always"))
            .await,
    );
    assert!(refused.is_invalid());
    assert_contains(
        &refused.message,
        "spec.template.spec.restartPolicy: Unsupported value: \"Always\"",
    );
}

#[tokio::test]
async fn invalid_objects_are_refused_with_every_field_named() {
    let server = server();
    let daemonsets: Api<DaemonSet> = Api::default_namespaced(server.client());
    let mut ds = daemonset("plugin");
    let spec = ds.spec.as_mut().expect("spec");
    spec.template.metadata.as_mut().expect("metadata").labels =
        Some([("app".to_owned(), "other".to_owned())].into());
    spec.template.spec.as_mut().expect("pod spec").containers[0].image = None;
    let invalid = failure(daemonsets.create(&PostParams::default(), &ds).await);
    assert!(invalid.is_invalid());
    let fields: Vec<String> = invalid
        .details
        .expect("details")
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(
        fields,
        [
            "spec.template.metadata.labels",
            "spec.template.spec.containers[0].image"
        ]
    );
    assert_starts_with(&invalid.message, r#"DaemonSet.apps "plugin" is invalid: ["#);

    // A wrong type is a 400 naming the field.
    let raw: Api<kube::api::DynamicObject> =
        Api::default_namespaced_with(server.client(), &kube::api::ApiResource::erase::<DaemonSet>(&()));
    let mut typo: kube::api::DynamicObject =
        serde_json::from_value(serde_json::to_value(daemonset("typo")).expect("json")).expect("dynamic");
    typo.data["spec"]["revisionHistoryLimit"] = json!("ten");
    let bad = failure(raw.create(&PostParams::default(), &typo).await);
    assert_eq!(bad.code, 400);
    assert_contains(&bad.message, "spec.revisionHistoryLimit");
}

#[tokio::test]
async fn deletes_answer_as_the_api_server_does() {
    let server = server();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client());
    created(&configmaps, &configmap("a")).await;
    let wrong_uid = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("x".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert!(failure(configmaps.delete("a", &wrong_uid).await).is_conflict());
    let deleted = configmaps
        .delete("a", &DeleteParams::default())
        .await
        .expect("deleted");
    assert!(deleted.is_right(), "configmaps answer a Status");
    assert!(failure(configmaps.get("a").await).is_not_found());

    let pods: Api<Pod> = Api::default_namespaced(server.client());
    created(&pods, &pod("p", Some("n1"))).await;
    let deleted = pods.delete("p", &DeleteParams::default()).await.expect("deleted");
    assert!(deleted.is_left(), "pods answer the deleted object");

    let namespaces: Api<Namespace> = Api::all(server.client());
    let refused = failure(namespaces.delete("default", &DeleteParams::default()).await);
    assert_eq!(refused.code, 403);
    within("counted", async {
        assert_eq!(server.requests().count(Verb::Delete, "namespaces"), 1)
    })
    .await;
}

#[tokio::test]
async fn the_event_recorder_creates_then_counts_repeats() {
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let server = server();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(server.client());
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(json!({"metadata": {"name": "gpu-1"}})).expect("node");
    let node = created(&nodes, &node).await;
    let recorder = Recorder::new(server.client_as("gpu-operator"), Reporter::from("gpu-operator"));
    let event = Event {
        type_: EventType::Warning,
        reason: "DriverNotReady".into(),
        note: Some("driver pod is not ready".into()),
        action: "Validate".into(),
        secondary: None,
    };
    let reference = node.object_ref(&());
    recorder.publish(&event, &reference).await.expect("created");
    recorder
        .publish(&event, &reference)
        .await
        .expect("a repeat becomes a series");
    let events: Api<NewEvent> = Api::namespaced(server.client(), "default");
    let stored = events.list(&Default::default()).await.expect("listed").items;
    assert_eq!(
        stored.len(),
        1,
        "cluster-scoped objects' events go to default, repeats merge"
    );
    assert_eq!(stored[0].reason.as_deref(), Some("DriverNotReady"));
    assert_eq!(
        stored[0].regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("gpu-1")
    );
    assert_eq!(stored[0].series.as_ref().map(|s| s.count), Some(2));
    let counts = server.requests();
    assert_eq!(counts.count(Verb::Create, "events"), 1);
    assert_eq!(counts.count(Verb::Patch, "events"), 1);
}

fn post(uri: &str, body: &serde_json::Value) -> http::Request<axum::body::Body> {
    http::Request::post(uri)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .expect("request")
}

/// `resource.k8s.io/v1` is served: a claim gets its request defaults and an empty status, a slice that
/// says nowhere its devices are is refused as kube-apiserver refuses it.
#[tokio::test]
async fn dynamic_resource_allocation_objects_are_served_defaulted_and_checked() {
    let server = server();
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "one-gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    });
    let (code, _, body) = call(
        &server,
        post(
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
            &claim,
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let stored = json_of(&body);
    assert_eq!(
        stored["spec"]["devices"]["requests"][0]["exactly"],
        json!({"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1})
    );
    assert_eq!(stored["status"], json!({}));

    let nowhere = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
        "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}},
    });
    let (code, _, body) = call(&server, post("/apis/resource.k8s.io/v1/resourceslices", &nowhere)).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        "ResourceSlice.resource.k8s.io \"s\" is invalid: spec: Required value: exactly one of `nodeName`, \
         `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    );
}

/// An update owns the maps it creates (`.` beside their keys), as kube-apiserver records them, and no longer
/// the ones it removes.
#[tokio::test]
async fn an_update_owns_the_maps_it_creates_and_lets_go_of_those_it_removes() {
    let server = server();
    let created = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m", "labels": {"a": "1"}}, "data": {"k": "v"}});
    let (code, _, body) = call(&server, post("/api/v1/namespaces/default/configmaps", &created)).await;
    assert_eq!(code, 201, "{body}");
    let fields = |body: &str| json_of(body)["metadata"]["managedFields"][0]["fieldsV1"].clone();
    assert_eq!(
        fields(&body),
        json!({"f:data": {".": {}, "f:k": {}}, "f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
    );
    let replaced = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "m", "resourceVersion": json_of(&body)["metadata"]["resourceVersion"]},
        "data": {"k": "v"}});
    let put = http::Request::put("/api/v1/namespaces/default/configmaps/m")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(replaced.to_string()))
        .expect("request");
    let (code, _, body) = call(&server, put).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(fields(&body), json!({"f:data": {".": {}, "f:k": {}}}));
}
