//! Server-side `Table` output, what `kubectl get` prints: the columns and cells of kube-apiserver v1.36's
//! printers (read off a real one for the same objects), a CRD's printer columns, `includeObject`, and a
//! watch that sends the column definitions with its first event only.

use std::time::Duration;

use axum::body::Body;
use gpuop_fakeserver::{FakeServer, ManualClock};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};

use super::support::{call, clusterpolicy_crd, json_of, merge_patched_status};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// The Table the server answers a GET of `uri` with, asked for as kubectl asks.
async fn table_at(server: &FakeServer, uri: &str) -> Value {
    json_of(&call(server, get(uri, TABLE)).await.2)
}

fn get(uri: &str, accept: &str) -> http::Request<Body> {
    http::Request::get(uri)
        .header("accept", accept)
        .body(Body::empty())
        .expect("request")
}

/// A server whose clock stands still, 90 s after the objects it holds were created.
fn server_with(objects: &[Value]) -> FakeServer {
    let clock = ManualClock::default();
    let server = FakeServer::builder().clock(clock.clone()).build();
    for object in objects {
        server.insert(object.clone()).expect("object stored");
    }
    clock.advance(Duration::from_secs(90));
    server
}

fn names(table: &Value) -> Vec<(String, String, u64)> {
    table["columnDefinitions"]
        .as_array()
        .expect("column definitions")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["type"].as_str().unwrap_or_default().to_owned(),
                c["priority"].as_u64().unwrap_or(9),
            )
        })
        .collect()
}

/// The columns as `Name:type`.
fn typed(table: &Value) -> Vec<String> {
    names(table).iter().map(|(n, t, _)| format!("{n}:{t}")).collect()
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "h100-3", "labels": {"node-role.kubernetes.io/gpu": ""}},
        "spec": {"unschedulable": true},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "h100-3"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Ubuntu 22.04 LTS",
                         "kernelVersion": "5.15.0-105-generic", "architecture": "amd64",
                         "containerRuntimeVersion": "containerd://1.7.0", "machineID": "m", "systemUUID": "s",
                         "bootID": "b", "kubeProxyVersion": "v1.33.0", "operatingSystem": "linux"}
        }
    })
}

#[tokio::test]
async fn nodes_print_as_kubectl_get_nodes_shows_them() {
    let server = server_with(&[node()]);
    let (code, _, body) = call(&server, get("/api/v1/nodes", TABLE)).await;
    assert_eq!(code, 200, "{body}");
    let table = json_of(&body);
    assert_eq!(
        (table["kind"].as_str(), table["apiVersion"].as_str()),
        (Some("Table"), Some("meta.k8s.io/v1"))
    );
    assert!(table["metadata"]["resourceVersion"].is_string());
    assert_eq!(
        names(&table)
            .iter()
            .map(|(n, t, p)| format!("{n}:{t}:{p}"))
            .collect::<Vec<_>>(),
        [
            "Name:string:0",
            "Status:string:0",
            "Roles:string:0",
            "Age:string:0",
            "Version:string:0",
            "Internal-IP:string:1",
            "External-IP:string:1",
            "OS-Image:string:1",
            "Kernel-Version:string:1",
            "Container-Runtime:string:1"
        ]
    );
    assert_eq!(table["columnDefinitions"][0]["format"], "name");
    let row = &table["rows"][0];
    assert_eq!(
        row["cells"],
        json!([
            "h100-3",
            "Ready,SchedulingDisabled",
            "gpu",
            "90s",
            "v1.33.0",
            "10.0.0.5",
            "<none>",
            "Ubuntu 22.04 LTS",
            "5.15.0-105-generic (amd64)",
            "containerd://1.7.0"
        ])
    );
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["metadata"]["name"], "h100-3");
}

#[tokio::test]
async fn rows_carry_what_include_object_asks_and_unknown_forms_are_refused() {
    let server = server_with(&[node()]);
    assert_eq!(
        table_at(&server, "/api/v1/nodes?includeObject=Object").await["rows"][0]["object"]["kind"],
        "Node"
    );
    assert_eq!(
        table_at(&server, "/api/v1/nodes?includeObject=None").await["rows"][0]["object"],
        Value::Null
    );

    let (code, _, body) = call(&server, get("/api/v1/nodes?includeObject=Bogus", TABLE)).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        "Unable to convert to Table as requested: includeObject: Invalid value: \"Bogus\": must be 'Metadata', 'Object', 'None', or empty"
    );
    let (code, _, _) = call(
        &server,
        get("/api/v1/nodes", "application/json;as=Table;v=v2;g=meta.k8s.io"),
    )
    .await;
    assert_eq!(code, 406, "a Table version kube-apiserver does not serve");
    let (code, _, body) = call(
        &server,
        get(
            "/api/v1/nodes",
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
        ),
    )
    .await;
    assert_eq!(
        (code, json_of(&body)["apiVersion"].as_str()),
        (200, Some("meta.k8s.io/v1beta1"))
    );
    let one = table_at(&server, "/api/v1/nodes/h100-3").await;
    assert_eq!(one["rows"].as_array().map(Vec::len), Some(1));
    assert!(one["metadata"]["resourceVersion"].is_string());
}

#[tokio::test]
async fn pods_daemonsets_and_a_crds_printer_columns() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plugin-x", "namespace": "gpu-operator"},
        "spec": {"nodeName": "h100-3", "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "j"}]}
    });
    let pod_status = json!({
        "status": {"phase": "Running", "podIP": "10.244.0.7", "containerStatuses": [
            {"name": "a", "ready": true, "restartCount": 0, "image": "i", "imageID": "", "state": {"running": {}}},
            {"name": "b", "ready": false, "restartCount": 2, "image": "j", "imageID": "",
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        ]}
    });
    let daemonset = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"},
        "spec": {
            "selector": {"matchLabels": {"app": "nvidia-device-plugin-daemonset"}},
            "template": {"metadata": {"labels": {"app": "nvidia-device-plugin-daemonset"}},
                         "spec": {"nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
                                  "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}]}}
        }
    });
    let daemonset_status = json!({"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                                  "updatedNumberScheduled": 3, "numberAvailable": 2, "numberMisscheduled": 0});
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}});
    let server = server_with(&[namespace, pod, daemonset, clusterpolicy_crd()]);
    // Status is the kubelet's and the DaemonSet controller's to write, through `/status`.
    let pods: Api<Pod> = Api::namespaced(server.client(), "gpu-operator");
    merge_patched_status(&pods, "plugin-x", pod_status).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(server.client(), "gpu-operator");
    let status = json!({"status": daemonset_status});
    merge_patched_status(&daemonsets, "nvidia-device-plugin-daemonset", status).await;

    let table = table_at(&server, "/api/v1/namespaces/gpu-operator/pods").await;
    assert_eq!(
        table["rows"][0]["cells"],
        json!([
            "plugin-x",
            "1/2",
            "CrashLoopBackOff",
            "2",
            "90s",
            "10.244.0.7",
            "h100-3",
            "<none>",
            "<none>"
        ])
    );

    let table = table_at(&server, "/apis/apps/v1/namespaces/gpu-operator/daemonsets").await;
    assert_eq!(
        typed(&table).into_iter().take(8).collect::<Vec<_>>(),
        [
            "Name:string",
            "Desired:integer",
            "Current:integer",
            "Ready:integer",
            "Up-to-date:integer",
            "Available:integer",
            "Node Selector:string",
            "Age:string"
        ]
    );
    assert_eq!(
        table["rows"][0]["cells"],
        json!([
            "nvidia-device-plugin-daemonset",
            3,
            3,
            2,
            3,
            2,
            "nvidia.com/gpu.deploy.device-plugin=true",
            "90s",
            "plugin",
            "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
            "app=nvidia-device-plugin-daemonset"
        ])
    );

    // A CRD without printer columns: Name and Age; the CRD itself: Name and Created At.
    let table = table_at(&server, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions").await;
    assert_eq!(typed(&table), ["Name:string", "Created At:date"]);
    assert_eq!(table["rows"][0]["cells"][0], "clusterpolicies.nvidia.com");
    let policy = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
                        "spec": {"driver": {"enabled": true}}});
    server.insert(policy).expect("policy stored");
    let table = table_at(&server, "/apis/nvidia.com/v1/clusterpolicies").await;
    assert_eq!(typed(&table), ["Name:string", "Age:date"]);
    assert_eq!(table["rows"][0]["cells"], json!(["p", "0s"]));
}

#[tokio::test]
async fn a_watch_sends_the_columns_with_its_first_event_only() {
    let server = server_with(&[node()]);
    let mut second = node();
    second["metadata"]["name"] = json!("h100-4");
    let watching = tokio::spawn({
        let server = server.clone();
        async move { call(&server, get("/api/v1/nodes?watch=true&timeoutSeconds=1", TABLE)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.insert(second).expect("second node stored");
    let (code, _, body) = watching.await.expect("the watch ends");
    assert_eq!(code, 200);
    let events: Vec<Value> = body.lines().map(json_of).collect();
    assert!(events.len() >= 2, "{body}");
    assert_eq!(events[0]["object"]["kind"], "Table");
    assert!(events[0]["object"]["columnDefinitions"].is_array(), "{body}");
    assert_eq!(events[1]["object"]["columnDefinitions"], Value::Null, "{body}");
    assert_eq!(events[1]["object"]["rows"][0]["cells"][0], "h100-4");
}
