//! The limits kube-apiserver puts on what is written, with its field paths and words: event notes and
//! messages, label and annotation keys and values, the total size of annotations, object names.

use gpuop_fakeserver::FakeServer;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Service};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::support::{assert_contains, assert_ends_with, clusterpolicy_crd, configmap, failure, server};

async fn create<K>(api: &Api<K>, object: Value) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("a well-typed object");
    api.create(&PostParams::default(), &object).await
}

fn event_v1(name: &str, note: &str) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name},
        "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal", "reason": "Started", "action": "Reconcile",
        "reportingController": "nvidia.com/gpu-operator", "reportingInstance": "gpu-operator-0",
        "regarding": {"kind": "Node", "name": "a", "apiVersion": "v1"}, "note": note})
}

#[tokio::test]
async fn event_notes_are_limited_to_1024_characters() {
    let server = server();
    let events: Api<EventV1> = Api::default_namespaced(server.client());
    create(&events, event_v1("fits", &"n".repeat(1024)))
        .await
        .expect("1024 characters fit");
    let refused = failure(create(&events, event_v1("long", &"n".repeat(1025))).await);
    assert_eq!(refused.code, 422);
    assert_eq!(
        refused.message,
        r#"Event.events.k8s.io "long" is invalid: message: Invalid value: "": can have at most 1024 characters"#
    );
    let mut untyped = event_v1("untyped", "n");
    untyped["type"] = json!("Info");
    let refused = failure(create(&events, untyped).await);
    assert_ends_with(
        &refused.message,
        r#"type: Invalid value: "": has invalid value: Info"#,
    );
}

#[tokio::test]
async fn core_event_messages_are_limited_only_when_written_the_new_way() {
    let server = server();
    let events: Api<Event> = Api::default_namespaced(server.client());
    let old_style = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "Old.Style"},
        "involvedObject": {"kind": "Node", "name": "a"}, "reason": "Started", "message": "m".repeat(5000)});
    create(&events, old_style)
        .await
        .expect("an event without eventTime has no length limits (nor a DNS name)");
    let new_style = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "new"},
        "involvedObject": {"kind": "Node", "name": "a"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingComponent": "gpu-operator", "reportingInstance": "i", "action": "Reconcile", "reason": "Started",
        "message": "m".repeat(1025)});
    let refused = failure(create(&events, new_style).await);
    assert_eq!(
        refused.message,
        r#"Event "new" is invalid: message: Invalid value: "": can have at most 1024 characters"#
    );
}

#[tokio::test]
async fn label_keys_and_values_have_their_lengths() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let labelled = |name: &str, key: &str, value: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {key: value}}});
    let longest_prefix = format!(
        "{}.{}.{}.{}",
        "p".repeat(63),
        "p".repeat(63),
        "p".repeat(63),
        "p".repeat(61)
    );
    let fits = labelled(
        "fits",
        &format!("{longest_prefix}/{}", "k".repeat(63)),
        &"v".repeat(63),
    );
    create(&api, fits)
        .await
        .expect("a 253-character prefix, 63-character name and value fit");

    let long_name = "k".repeat(64);
    let refused = failure(create(&api, labelled("a", &long_name, "v")).await);
    assert_eq!(
        refused.message,
        format!(
            r#"ConfigMap "a" is invalid: metadata.labels: Invalid value: "{long_name}": name part must be no more than 63 characters"#
        )
    );
    let refused = failure(create(&api, labelled("b", "k", &"v".repeat(64))).await);
    assert_ends_with(&refused.message, "must be no more than 63 characters");
    let long_prefix = format!("{longest_prefix}p/k");
    let refused = failure(create(&api, labelled("c", &long_prefix, "v")).await);
    assert_ends_with(
        &refused.message,
        "prefix part must be no more than 253 characters",
    );
    // Every reason is given, as kube-apiserver lists them.
    let refused = failure(create(&api, labelled("d", &format!("-{}", "k".repeat(63)), "v")).await);
    assert_eq!(
        refused.details.map(|d| d.causes.len()),
        Some(2),
        "{}",
        refused.message
    );
}

#[tokio::test]
async fn annotations_may_total_256_kibibytes() {
    let server = server();
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let annotated = |name: &str, bytes: usize| {
        // Keys count as well as values: "a" and "b" are two bytes of the total.
        let half = (bytes - 2) / 2;
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name,
            "annotations": {"a": "x".repeat(half), "b": "y".repeat(bytes - 2 - half)}}})
    };
    create(&api, annotated("fits", 262_144))
        .await
        .expect("262144 bytes fit");
    let refused = failure(create(&api, annotated("over", 262_145)).await);
    assert_eq!(
        refused.message,
        r#"ConfigMap "over" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes"#
    );
}

#[tokio::test]
async fn names_follow_each_kinds_rule() {
    let server = server();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client());
    configmaps
        .create(&PostParams::default(), &configmap(&"c".repeat(253)))
        .await
        .expect("a 253-character DNS subdomain fits");
    let refused = failure(
        configmaps
            .create(&PostParams::default(), &configmap(&"c".repeat(254)))
            .await,
    );
    assert_ends_with(&refused.message, "must be no more than 253 characters");

    let namespaces: Api<Namespace> = Api::all(server.client());
    let long = "n".repeat(64);
    let refused = failure(create(&namespaces, json!({"metadata": {"name": long}})).await);
    assert_contains(
        &refused.message,
        &format!(r#"metadata.name: Invalid value: "{long}": must be no more than 63 characters"#),
    );

    // Service names are DNS-1035 labels: they start with a letter.
    let services: Api<Service> = Api::default_namespaced(server.client());
    let refused = failure(
        create(
            &services,
            json!({"metadata": {"name": "1gpu"}, "spec": {"ports": [{"port": 80}]}}),
        )
        .await,
    );
    assert_contains(&refused.message, "a DNS-1035 label must consist of");

    // Custom resources' names are DNS subdomains.
    let policies = policies(&server).await;
    let policy: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "Cluster-Policy"}, "spec": {"driver": {}}}))
        .expect("dynamic object");
    let refused = failure(policies.create(&PostParams::default(), &policy).await);
    assert_contains(&refused.message, "a lowercase RFC 1123 subdomain must consist of");
}

async fn policies(server: &FakeServer) -> Api<DynamicObject> {
    server.insert(clusterpolicy_crd()).expect("CRD registered");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
        "clusterpolicies",
    );
    Api::all_with(server.client(), &resource)
}
