//! Unknown fields, as kube-apiserver treats them for each verb and `fieldValidation` directive: `Strict`
//! refuses a create or update with 400 and a patch with 422, `Warn` (also what an absent directive means)
//! accepts with `Warning: 299` headers, `Ignore` accepts silently; either way the fields are dropped.
//! Server-side apply refuses a configuration with undeclared fields whatever the directive. `metadata` is
//! an ObjectMeta for every kind, custom ones included.

use axum::body::Body;
use gpuop_fakeserver::FakeServer;
use serde_json::{Value, json};

use super::support::{call, clusterpolicy_crd, json_of, server};

const POLICIES: &str = "/apis/nvidia.com/v1/clusterpolicies";

/// Sends `body` as a `method` of `uri`, as a client (`probe/1.0`) would: the answer's code, headers and body.
async fn send(
    server: &FakeServer,
    method: &str,
    uri: &str,
    content_type: &str,
    body: &Value,
) -> (u16, http::HeaderMap, String) {
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .header("user-agent", "probe/1.0")
        .body(Body::from(body.to_string()))
        .expect("request");
    call(server, request).await
}

fn policy(name: &str, spec: &Value) -> Value {
    json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name}, "spec": spec})
}

async fn with_crd() -> FakeServer {
    let server = server();
    server.insert(clusterpolicy_crd()).expect("CRD registered");
    server
}

fn warnings(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn strict_apply_of_a_custom_resource_treats_metadata_as_object_meta() {
    let server = with_crd().await;
    let mut config = policy("p", &json!({"driver": {"enabled": true}}));
    config["metadata"]["labels"] = json!({"app": "gpu"});
    config["metadata"]["annotations"] = json!({"meta.helm.sh/release-name": "gpu"});
    let uri = format!("{POLICIES}/p?fieldManager=helm&fieldValidation=Strict");
    // Twice: the second apply merges into a stored object carrying uid, creationTimestamp, managedFields.
    for round in ["creates", "updates"] {
        let (code, _, body) = send(&server, "PATCH", &uri, "application/apply-patch+yaml", &config).await;
        assert!(code == 201 || code == 200, "the apply {round}: {code} {body}");
        config["metadata"]["labels"]["round"] = json!(round);
    }
    let stored = server
        .get("nvidia.com/v1", "ClusterPolicy", "", "p")
        .expect("stored");
    assert_eq!(
        stored["metadata"]["labels"],
        json!({"app": "gpu", "round": "creates"})
    );
    assert_eq!(
        stored["metadata"]["annotations"]["meta.helm.sh/release-name"],
        "gpu"
    );
    assert!(stored["metadata"]["uid"].is_string() && stored["metadata"]["creationTimestamp"].is_string());
}

#[tokio::test]
async fn strict_create_and_update_refuse_unknown_fields_with_400_naming_each() {
    let server = with_crd().await;
    let mut sent = policy("p", &json!({"driver": {"enabled": true, "bogus": 1}, "foo": "x"}));
    sent["metadata"]["nonsense"] = json!("y");
    let strict = format!("{POLICIES}?fieldValidation=Strict");
    let (code, _, body) = send(&server, "POST", &strict, "application/json", &sent).await;
    assert_eq!(code, 400, "{body}");
    let status = json_of(&body);
    assert_eq!(status["reason"], "BadRequest");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            r#"ClusterPolicy in version "v1" cannot be handled as a ClusterPolicy: strict decoding error: "#
        ),
        "{message}"
    );
    for field in ["metadata.nonsense", "spec.driver.bogus", "spec.foo"] {
        assert!(
            message.contains(&format!(r#"unknown field "{field}""#)),
            "{field} in {message}"
        );
    }
    assert!(
        server.get("nvidia.com/v1", "ClusterPolicy", "", "p").is_none(),
        "nothing stored"
    );

    // The same object is accepted once clean, and a strict update of it is refused the same way.
    let clean = policy("p", &json!({"driver": {}}));
    let (code, _, body) = send(&server, "POST", &strict, "application/json", &clean).await;
    assert_eq!(code, 201, "{body}");
    let strict_update = format!("{POLICIES}/p?fieldValidation=Strict");
    let (code, _, body) = send(&server, "PUT", &strict_update, "application/json", &sent).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains(r#"unknown field \"spec.foo\""#), "{body}");
}

#[tokio::test]
async fn warn_is_the_default_and_ignore_is_silent_both_drop_the_fields() {
    let server = with_crd().await;
    let sent = policy("p", &json!({"driver": {}, "foo": "x"}));
    for (uri, name, expected) in [
        (
            POLICIES.to_owned(),
            "absent",
            vec![r#"299 - "unknown field \"spec.foo\"""#.to_owned()],
        ),
        (
            format!("{POLICIES}?fieldValidation=Warn"),
            "warn",
            vec![r#"299 - "unknown field \"spec.foo\"""#.to_owned()],
        ),
        (format!("{POLICIES}?fieldValidation=Ignore"), "ignore", Vec::new()),
    ] {
        let mut sent = sent.clone();
        sent["metadata"]["name"] = json!(name);
        let (code, headers, body) = send(&server, "POST", &uri, "application/json", &sent).await;
        assert_eq!(code, 201, "{name}: {body}");
        assert_eq!(warnings(&headers), expected, "{name}");
        assert_eq!(json_of(&body)["spec"], json!({"driver": {}}), "{name}: pruned");
    }
}

#[tokio::test]
async fn a_strict_patch_is_refused_with_422_about_the_patch() {
    let server = with_crd().await;
    server
        .insert(policy("p", &json!({"driver": {}})))
        .expect("inserted");
    let uri = format!("{POLICIES}/p?fieldValidation=Strict");
    let patch = json!({"spec": {"foo": 1}});
    let (code, _, body) = send(&server, "PATCH", &uri, "application/merge-patch+json", &patch).await;
    assert_eq!(code, 422, "{body}");
    let status = json_of(&body);
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["details"]["causes"][0]["field"], "patch");
    let message = status["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(r#" "" is invalid: patch: Invalid value: "{"#),
        "{message}"
    );
    assert!(
        message.ends_with(r#": strict decoding error: unknown field "spec.foo""#),
        "{message}"
    );
    // The same patch under Warn is applied, minus the unknown field, with a warning.
    let warn = format!("{POLICIES}/p");
    let (code, headers, body) = send(&server, "PATCH", &warn, "application/merge-patch+json", &patch).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(warnings(&headers), [r#"299 - "unknown field \"spec.foo\"""#]);
}

#[tokio::test]
async fn apply_refuses_undeclared_fields_whatever_the_directive() {
    let server = with_crd().await;
    for directive in ["Strict", "Warn", "Ignore"] {
        let uri = format!("{POLICIES}/p?fieldManager=helm&fieldValidation={directive}");
        let config = policy("p", &json!({"driver": {"enabled": true}, "typo": 1}));
        let (code, _, body) = send(&server, "PATCH", &uri, "application/apply-patch+yaml", &config).await;
        assert_eq!(code, 500, "{directive}: {body}");
        assert_eq!(
            json_of(&body)["message"],
            "failed to create typed patch object (/p; nvidia.com/v1, Kind=ClusterPolicy): .spec.typo: field not declared in schema",
            "{directive}"
        );
    }
    // Status is declared: on the main resource it is ignored, not refused.
    let mut with_status = policy("p", &json!({"driver": {}}));
    with_status["status"] = json!({"state": "ready"});
    let uri = format!("{POLICIES}/p?fieldManager=helm&fieldValidation=Strict");
    let (code, _, body) = send(
        &server,
        "PATCH",
        &uri,
        "application/apply-patch+yaml",
        &with_status,
    )
    .await;
    assert_eq!(code, 201, "{body}");
    // Built-in kinds name keyed list items by their keys, as the field manager does.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}},
                 "template": {"metadata": {"labels": {"app": "d"}},
                              "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolcy": "Always"}]}}}});
    let uri = "/apis/apps/v1/namespaces/default/deployments/d?fieldManager=helm&fieldValidation=Strict";
    let (code, _, body) = send(&server, "PATCH", uri, "application/apply-patch+yaml", &deployment).await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        r#"failed to create typed patch object (/d; apps/v1, Kind=Deployment): .spec.template.spec.containers[name="c"].imagePullPolcy: field not declared in schema"#
    );
}
