//! The wire, checked with the router as a plain `tower::Service` and on a socket: kube's `?&` queries,
//! list bodies, discovery and OpenAPI, `/metrics`, metadata-only answers, media types, dry runs and the
//! errors for malformed requests.

use axum::body::Body;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::support::{call, clusterpolicy_crd, configmap, json_of, server};

fn get(uri: &str) -> http::Request<Body> {
    http::Request::get(uri)
        .header("user-agent", "probe/1.0 (test)")
        .body(Body::empty())
        .expect("request")
}

#[tokio::test]
async fn lists_tolerate_empty_query_pairs_and_type_built_in_items_once() {
    let server = server();
    server.insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default"}})).expect("inserted");
    let (code, headers, body) = call(&server, get("/api/v1/namespaces/default/configmaps?&limit=500")).await;
    assert_eq!(code, 200);
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let list = json_of(&body);
    assert_eq!(list["kind"], "ConfigMapList");
    assert!(
        list["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    );
    // As kube-apiserver lists built-in objects: the list names the type once, its items do not.
    assert_eq!(list["items"][0]["metadata"]["name"], "a");
    assert_eq!(list["items"][0].get("apiVersion"), None);
    assert_eq!(list["items"][0].get("kind"), None);

    let metadata = http::Request::get("/api/v1/namespaces/default/configmaps")
        .header(
            "accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
        )
        .body(Body::empty())
        .expect("request");
    let partial = json_of(&call(&server, metadata).await.2);
    assert_eq!(partial["kind"], "PartialObjectMetadataList");
    assert_eq!(partial["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(partial["items"][0]["metadata"]["name"], "a");
}

#[tokio::test]
async fn discovery_and_openapi_follow_the_registry() {
    let server = server();
    let (_, _, api) = call(&server, get("/api")).await;
    assert_eq!(json_of(&api)["versions"], json!(["v1"]));
    let groups = json_of(&call(&server, get("/apis")).await.2);
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["name"].as_str())
        .collect();
    for group in [
        "apps",
        "rbac.authorization.k8s.io",
        "coordination.k8s.io",
        "apiextensions.k8s.io",
        "policy",
    ] {
        assert!(names.contains(&group), "{group} missing from {names:?}");
    }
    assert!(!names.contains(&"nvidia.com"));
    assert_eq!(call(&server, get("/apis/nvidia.com/v1")).await.0, 404);

    server.insert(clusterpolicy_crd()).expect("crd");
    let groups = json_of(&call(&server, get("/apis")).await.2);
    assert!(
        groups["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["name"] == "nvidia.com"))
    );
    let resources = json_of(&call(&server, get("/apis/nvidia.com/v1")).await.2);
    assert_eq!(resources["resources"][0]["name"], "clusterpolicies");
    assert_eq!(resources["resources"][1]["name"], "clusterpolicies/status");
    let openapi = json_of(&call(&server, get("/openapi/v3")).await.2);
    assert!(openapi["paths"]["apis/nvidia.com/v1"]["serverRelativeURL"].is_string());
    let version = json_of(&call(&server, get("/version")).await.2);
    assert_eq!(
        (version["major"].as_str(), version["minor"].as_str()),
        (Some("1"), Some("33"))
    );
}

#[tokio::test]
async fn metrics_count_requests_by_verb_resource_code_and_client() {
    let server = server();
    call(&server, get("/api/v1/namespaces/default/configmaps/missing")).await;
    call(&server, get("/api/v1/nodes")).await;
    let (code, _, text) = call(&server, get("/metrics")).await;
    assert_eq!(code, 200);
    assert!(text.contains(
        r#"apiserver_request_total{verb="GET",group="",version="v1",resource="configmaps",subresource="",scope="resource",code="404",client="probe/1.0"} 1"#
    ), "{text}");
    assert!(text.contains(r#"verb="LIST",group="",version="v1",resource="nodes",subresource="",scope="cluster",code="200",client="probe/1.0"} 1"#));
    assert!(
        text.contains(r#"apiserver_storage_objects{resource="namespaces"} 4"#),
        "{text}"
    );
}

#[tokio::test]
async fn malformed_requests_get_the_servers_answers() {
    let server = server();
    let apply = |query: &str| {
        http::Request::patch(format!("/api/v1/namespaces/default/configmaps/a{query}"))
            .header("content-type", "application/apply-patch+yaml")
            .body(Body::from(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
            ))
            .expect("request")
    };
    let (code, _, body) = call(&server, apply("?")).await;
    assert_eq!(code, 422, "apply needs a field manager: {body}");
    assert!(
        json_of(&body)["message"]
            .as_str()
            .is_some_and(|m| m.contains("fieldManager: Required value"))
    );
    let (code, _, body) = call(&server, apply("?fieldManager=me")).await;
    assert_eq!(code, 201, "apply creates, from YAML: {body}");

    let forced_merge = http::Request::patch("/api/v1/namespaces/default/configmaps/a?force=true")
        .header("content-type", "application/merge-patch+json")
        .body(Body::from("{}"))
        .expect("request");
    assert_eq!(
        call(&server, forced_merge).await.0,
        422,
        "force is for apply only"
    );
    let unknown_type = http::Request::patch("/api/v1/namespaces/default/configmaps/a")
        .header("content-type", "text/plain")
        .body(Body::from("{}"))
        .expect("request");
    assert_eq!(call(&server, unknown_type).await.0, 415);
    let (code, _, body) = call(&server, get("/apis/nope.io/v1/things")).await;
    assert_eq!((code, json_of(&body)["kind"].as_str()), (404, Some("Status")));
    let (code, _, body) = call(&server, get("/api/v1/pods?watch=true&resourceVersion=x")).await;
    assert_eq!(
        (code, json_of(&body)["reason"].as_str()),
        (400, Some("BadRequest"))
    );
}

#[tokio::test]
async fn dry_runs_store_nothing() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let version = server.resource_version();
    let created = api
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &configmap("dry"),
        )
        .await
        .expect("validated");
    assert_eq!(created.metadata.name.as_deref(), Some("dry"));
    assert_eq!(server.resource_version(), version);
    assert!(api.get_opt("dry").await.expect("readable").is_none());
}

#[tokio::test]
async fn the_same_router_serves_a_socket_and_a_kubeconfig() {
    let server = server();
    let running = server
        .serve("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("listening");
    assert!(
        running
            .kubeconfig()
            .contains(&format!("server: {}", running.url()))
    );
    let client = running.client().await.expect("client from the kubeconfig");
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    api.create(&PostParams::default(), &configmap("over-tcp"))
        .await
        .expect("created over TCP");
    assert!(server.get("v1", "ConfigMap", "default", "over-tcp").is_some());
    running.shutdown().await;
}
