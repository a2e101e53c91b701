//! Fixtures (builders for the objects the tests use) and a bounded wait.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStream, TryStreamExt};
use gpuop_fakeserver::{FakeServer, Faults, ManualClock};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tower::ServiceExt;

/// The list and watch parameters a client controls (but `watch` itself).
pub const LIST_PARAMETERS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "sendInitialEvents",
];

/// A server with a stopped clock, so timestamps are predictable.
pub fn server() -> FakeServer {
    FakeServer::builder().clock(ManualClock::default()).build()
}

/// A server on the system clock with `faults` in force from the start.
pub fn with_faults(faults: Faults) -> FakeServer {
    FakeServer::builder().faults(faults).build()
}

/// Fails the test if `future` does not finish in 10 s: a guard against hangs, not a timing assertion.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// What `kube::Api` needs of the objects it reads.
pub trait Object: Clone + DeserializeOwned + std::fmt::Debug {}

impl<K: Clone + DeserializeOwned + std::fmt::Debug> Object for K {}

/// Creates `object`, failing the test if the server refuses it.
pub async fn created<K: Object + Serialize>(api: &Api<K>, object: &K) -> K {
    api.create(&PostParams::default(), object).await.expect("created")
}

/// Server-side applies `object`, found by its own name, as `manager`: the server's answer.
pub async fn apply<K>(api: &Api<K>, manager: &str, object: &K) -> Result<K, kube::Error>
where
    K: Object + Serialize + kube::Resource,
{
    let params = PatchParams::apply(manager);
    api.patch(&object.name_any(), &params, &Patch::Apply(object))
        .await
}

/// [`apply`], failing the test if the server refuses.
pub async fn applied<K: Object + Serialize + kube::Resource>(api: &Api<K>, manager: &str, object: &K) -> K {
    apply(api, manager, object).await.expect("applied")
}

/// Every object `api` lists, failing the test if the server refuses.
pub async fn listed<K: Object>(api: &Api<K>) -> Vec<K> {
    api.list(&ListParams::default()).await.expect("listed").items
}

/// Merge-patches the object `name` with `patch`, failing the test if the server refuses.
pub async fn merge_patched<K: Object>(api: &Api<K>, name: &str, patch: serde_json::Value) -> K {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("merge-patched")
}

/// Merge-patches the `/status` of the object `name` with `patch`, failing the test if the server refuses.
pub async fn merge_patched_status<K: Object>(api: &Api<K>, name: &str, patch: serde_json::Value) -> K {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("status merge-patched")
}

/// A watch of `api` from `version`, failing the test if the server refuses it.
pub async fn watch_from<K>(api: &Api<K>, version: &str) -> BoxStream<'static, kube::Result<WatchEvent<K>>>
where
    K: Object + Send + 'static,
{
    api.watch(&WatchParams::default(), version)
        .await
        .expect("watch")
        .boxed()
}

/// The next item of a watch or watcher `stream`, failing the test on an error, an end, or a wait of
/// [`within`]'s bound (`what` names the wait).
pub async fn next_event<S>(what: &str, stream: &mut S) -> S::Ok
where
    S: TryStream + Unpin,
    S::Error: std::fmt::Debug,
{
    within(what, stream.try_next()).await.expect("ok").expect("event")
}

/// Fails the test unless `written`, the answer to a write of a DaemonSet's `/status` that set both
/// `status.numberReady` and `spec.minReadySeconds`, took the one and ignored the other.
#[track_caller]
pub fn assert_only_status_written(written: &DaemonSet, number_ready: i32) {
    assert_eq!(
        written.status.as_ref().map(|s| s.number_ready),
        Some(number_ready)
    );
    assert_eq!(
        written.spec.as_ref().and_then(|s| s.min_ready_seconds),
        None,
        "spec ignored on /status"
    );
}

/// Fails the test, showing `text`, unless it contains `part`.
#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{text}");
}

/// Fails the test, showing `text`, unless it starts with `prefix`.
#[track_caller]
pub fn assert_starts_with(text: &str, prefix: &str) {
    assert!(text.starts_with(prefix), "{text}");
}

/// Fails the test, showing `text`, unless it ends with `suffix`.
#[track_caller]
pub fn assert_ends_with(text: &str, suffix: &str) {
    assert!(text.ends_with(suffix), "{text}");
}

pub fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

pub fn labelled_configmap(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = configmap(name);
    cm.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect());
    cm
}

pub fn daemonset(name: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpu-operator"}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "main", "image": format!("nvcr.io/nvidia/{name}:v1")}]}}
        }
    }))
    .expect("a valid DaemonSet")
}

pub fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "gpu"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    }))
    .expect("a valid Pod");
    if let Some(node) = node {
        pod.spec.as_mut().expect("spec").node_name = Some(node.into());
    }
    pod
}

/// A CRD like NVIDIA's ClusterPolicy, small: enums, minimums, patterns, required fields, a status
/// subresource, a selectable field and the `metadata: {type: object}` that generated CRDs carry.
pub fn clusterpolicy_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusterpolicies.nvidia.com"},
        "spec": {
            "group": "nvidia.com", "scope": "Cluster",
            "names": {"plural": "clusterpolicies", "singular": "clusterpolicy", "kind": "ClusterPolicy",
                      "listKind": "ClusterPolicyList", "shortNames": ["cp"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "selectableFields": [{"jsonPath": ".spec.mig.strategy"}],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        // controller-gen declares metadata like this in every CRD, NVIDIA's included.
                        "metadata": {"type": "object"},
                        "spec": {"type": "object", "required": ["driver"], "properties": {
                            "driver": {"type": "object", "properties": {
                                "enabled": {"type": "boolean"},
                                "version": {"type": "string", "pattern": "^[0-9.]+$"},
                                "replicas": {"type": "integer", "minimum": 1}
                            }, "x-kubernetes-validations": [
                                {"rule": "!has(self.replicas) || self.replicas <= 8", "message": "at most 8 replicas"}
                            ]},
                            "mig": {"type": "object", "properties": {
                                "strategy": {"type": "string", "enum": ["none", "single", "mixed"], "default": "single",
                                             "x-kubernetes-validations": [
                                                 {"rule": "self == oldSelf", "message": "the MIG strategy cannot change"}
                                             ]}
                            }},
                            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                        }},
                        "status": {"type": "object", "properties": {"state": {"type": "string"}}}
                    }
                }}
            }]
        }
    })
}

/// Sends `request` to the router as a `tower::Service`: the status code, headers and body.
pub async fn call(server: &FakeServer, request: http::Request<Body>) -> (u16, http::HeaderMap, String) {
    let response = server.router().oneshot(request).await.expect("infallible");
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

pub fn json_of(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The `Status` of a request that must have failed.
pub fn failure<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The reasons kube-apiserver gives with each code a client can cause (`metav1.StatusReason`); a 500 is
/// unclassified (no reason), as server-side apply's typed-patch failure. An `InternalError` would be a
/// bug here but for the one a client can cause, an eviction under two disruption budgets.
fn reasons_for(code: u16) -> &'static [&'static str] {
    match code {
        400 => &["BadRequest"],
        401 => &["Unauthorized"],
        403 => &["Forbidden"],
        404 => &["NotFound"],
        405 => &["MethodNotAllowed"],
        406 => &["NotAcceptable"],
        409 => &["AlreadyExists", "Conflict"],
        410 => &["Expired", "Gone"],
        413 => &["RequestEntityTooLarge"],
        415 => &["UnsupportedMediaType"],
        422 => &["Invalid"],
        429 => &["TooManyRequests"],
        500 => &[""],
        504 => &["Timeout"],
        _ => &[],
    }
}

/// Why a failed request's answer is not a well-formed `metav1.Status` for its HTTP code (`None` if it is).
pub fn status_problem(code: u16, body: &str) -> Option<String> {
    let Ok(status) = serde_json::from_str::<serde_json::Value>(body) else {
        return Some(format!("the body is not JSON: {body:?}"));
    };
    let reason = status
        .get("reason")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    let message = status
        .get("message")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    if status["kind"] != "Status" || status["apiVersion"] != "v1" || status["status"] != "Failure" {
        Some(format!("not a failure Status: {body}"))
    } else if status["code"] != code {
        Some(format!("the Status code is not the HTTP code {code}: {body}"))
    } else if !(reasons_for(code).contains(&reason)
        || (reason == "InternalError" && message.contains("more than one PodDisruptionBudget")))
    {
        Some(format!("reason {reason:?} does not go with {code}: {body}"))
    } else if message.is_empty() {
        Some(format!("the Status has no message: {body}"))
    } else {
        None
    }
}

/// A server as the robustness tests find it: nodes n1, n2, n3, ConfigMap default/seeded and a Pod
/// default/p with one container, `main`.
pub fn seeded_server() -> FakeServer {
    let server = server();
    seed(&server);
    server
}

/// Gives `server` what [`seeded_server`] holds.
pub fn seed(server: &FakeServer) {
    for node in ["n1", "n2", "n3"] {
        server
            .insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"app": "gpu"}}}))
            .expect("node");
    }
    server
        .insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "seeded", "namespace": "default"}, "data": {"a": "b"}}))
        .expect("configmap");
    let mut pod = serde_json::to_value(pod("p", Some("n1"))).expect("pod");
    pod["metadata"]["namespace"] = json!("default");
    server.insert(pod).expect("pod");
}
