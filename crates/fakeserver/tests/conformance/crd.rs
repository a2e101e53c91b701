//! CRDs: registration in discovery at once, validation of custom resources against the schema with every
//! field named, pruning and defaults, the status subresource, selectable fields, and cleanup on delete.

use gpuop_fakeserver::FakeServer;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::discovery::Discovery;
use serde_json::json;

use super::support::{
    assert_contains, assert_ends_with, assert_starts_with, clusterpolicy_crd, created, failure,
    merge_patched, merge_patched_status, server,
};

/// A server with the ClusterPolicy CRD established through the API, and an `Api` of ClusterPolicies.
async fn with_crd() -> (FakeServer, Api<DynamicObject>) {
    let server = server();
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    let crd: CustomResourceDefinition = serde_json::from_value(clusterpolicy_crd()).expect("crd");
    let created = crds
        .create(&PostParams::default(), &crd)
        .await
        .expect("registered");
    let established = created.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        established
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
        "clusterpolicies",
    );
    let policies = Api::all_with(server.client(), &resource);
    (server, policies)
}

fn policy(name: &str, spec: serde_json::Value) -> DynamicObject {
    let mut object =
        json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name}});
    object["spec"] = spec;
    serde_json::from_value(object).expect("dynamic object")
}

#[tokio::test]
async fn a_crd_is_discovered_and_served_at_once() {
    let (server, policies) = with_crd().await;
    let discovery = Discovery::new(server.client()).run().await.expect("discovery");
    let group = discovery.get("nvidia.com").expect("group discovered");
    let (resource, capabilities) = group.recommended_kind("ClusterPolicy").expect("kind discovered");
    assert_eq!(resource.plural, "clusterpolicies");
    assert_eq!(capabilities.scope, kube::discovery::Scope::Cluster);
    assert!(
        capabilities
            .subresources
            .iter()
            .any(|(r, _)| r.plural == "status")
    );

    let created = created(&policies, &policy("cluster-policy", json!({"driver": {}}))).await;
    assert_eq!(created.metadata.generation, Some(1));
}

#[tokio::test]
async fn invalid_custom_resources_name_every_field() {
    let (_server, policies) = with_crd().await;
    let bad = policy(
        "x",
        json!({"driver": {"version": "v1!", "replicas": 0, "enabled": "yes"}, "mig": {"strategy": "double"}}),
    );
    let invalid = failure(policies.create(&PostParams::default(), &bad).await);
    assert!(invalid.is_invalid());
    let mut fields: Vec<String> = invalid
        .details
        .as_ref()
        .expect("details")
        .causes
        .iter()
        .map(|c| c.field.clone())
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "spec.driver.enabled",
            "spec.driver.replicas",
            "spec.driver.version",
            "spec.mig.strategy"
        ]
    );
    assert_starts_with(&invalid.message, r#"ClusterPolicy.nvidia.com "x" is invalid: ["#);
    assert_contains(
        &invalid.message,
        r#"spec.mig.strategy: Unsupported value: "double": supported values: "none", "single", "mixed""#,
    );

    let missing = failure(
        policies
            .create(&PostParams::default(), &policy("y", json!({})))
            .await,
    );
    assert_eq!(
        missing.message,
        r#"ClusterPolicy.nvidia.com "y" is invalid: spec.driver: Required value"#
    );
}

#[tokio::test]
async fn cel_rules_are_enforced_with_old_self_on_updates() {
    let (_server, policies) = with_crd().await;
    let too_many = failure(
        policies
            .create(
                &PostParams::default(),
                &policy("p", json!({"driver": {"replicas": 9}})),
            )
            .await,
    );
    assert_eq!(
        too_many.message,
        r#"ClusterPolicy.nvidia.com "p" is invalid: spec.driver: Invalid value: "object": at most 8 replicas"#
    );
    policies
        .create(
            &PostParams::default(),
            &policy("p", json!({"driver": {}, "mig": {"strategy": "single"}})),
        )
        .await
        .expect("valid");
    let change = Patch::Merge(json!({"spec": {"mig": {"strategy": "mixed"}}}));
    let refused = failure(policies.patch("p", &PatchParams::default(), &change).await);
    assert_contains(
        &refused.message,
        "spec.mig.strategy: Invalid value: \"string\": the MIG strategy cannot change",
    );
}

#[tokio::test]
async fn unknown_fields_are_pruned_unless_preserved_and_defaults_filled() {
    let (_server, policies) = with_crd().await;
    // Defaults fill absent fields of objects that are present (`mig`), as structural defaulting does.
    let sent = policy(
        "p",
        json!({"driver": {"enabled": true, "bogus": 1}, "free": {"anything": [1]}, "mig": {}, "typo": true}),
    );
    let stored = created(&policies, &sent).await;
    assert_eq!(
        stored.data["spec"],
        json!({"driver": {"enabled": true}, "free": {"anything": [1]}, "mig": {"strategy": "single"}})
    );
    let strict = PatchParams::apply("gpu-operator").validation_strict();
    let refused = failure(
        policies
            .patch(
                "q",
                &strict,
                &Patch::Apply(policy("q", json!({"driver": {}, "typo": 1}))),
            )
            .await,
    );
    // Apply types the configuration before merging: an undeclared field fails it whatever the directive.
    assert_eq!(refused.code, 500);
    assert_ends_with(&refused.message, ".spec.typo: field not declared in schema");
}

#[tokio::test]
async fn the_status_subresource_separates_spec_and_status() {
    let (_server, policies) = with_crd().await;
    let mut sent = policy("p", json!({"driver": {}}));
    sent.data["status"] = json!({"state": "ready"});
    let created = created(&policies, &sent).await;
    assert_eq!(created.data.get("status"), None, "status is dropped on create");
    let both = json!({"status": {"state": "notReady"}, "spec": {"driver": {"enabled": false}}});
    let status = merge_patched_status(&policies, "p", both).await;
    assert_eq!(status.data["status"]["state"], "notReady");
    assert_eq!(
        status.data["spec"]["driver"],
        json!({}),
        "spec ignored on /status"
    );
    assert_eq!(status.metadata.generation, Some(1));
    let spec = merge_patched(&policies, "p", json!({"spec": {"driver": {"enabled": false}}})).await;
    assert_eq!(spec.metadata.generation, Some(2));
    let strategic = failure(
        policies
            .patch(
                "p",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {}})),
            )
            .await,
    );
    assert_eq!(strategic.code, 415, "no strategic merge on custom resources");
}

#[tokio::test]
async fn selectable_fields_and_crd_deletion() {
    let (server, policies) = with_crd().await;
    for (name, strategy) in [("a", "single"), ("b", "mixed")] {
        created(
            &policies,
            &policy(name, json!({"driver": {}, "mig": {"strategy": strategy}})),
        )
        .await;
    }
    let mixed = policies
        .list(&ListParams::default().fields("spec.mig.strategy=mixed"))
        .await
        .expect("listed");
    assert_eq!(
        mixed
            .items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["b"]
    );

    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    crds.delete("clusterpolicies.nvidia.com", &DeleteParams::default())
        .await
        .expect("deleted");
    assert!(failure(crds.get("clusterpolicies.nvidia.com").await).is_not_found());
    assert!(
        failure(policies.list(&ListParams::default()).await).is_not_found(),
        "the resource is gone"
    );
}
