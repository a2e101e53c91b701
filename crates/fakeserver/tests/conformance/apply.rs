//! Server-side apply: create on apply, per-manager managed fields, removal of fields a manager stops
//! applying, conflicts and force, ownership taken by other writers, and applies that change nothing.

use gpuop_fakeserver::Verb;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::support::{
    applied, apply, assert_contains, assert_only_status_written, daemonset, failure, server,
};

fn managers(ds: &DaemonSet) -> Vec<(String, String)> {
    ds.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn image(ds: &DaemonSet) -> String {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers[0].image.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn apply_creates_updates_and_removes_what_is_no_longer_applied() {
    let server = server();
    let api: Api<DaemonSet> = Api::default_namespaced(server.client());
    let mut desired = daemonset("plugin");
    desired
        .metadata
        .labels
        .get_or_insert_default()
        .insert("extra".into(), "yes".into());
    let created = applied(&api, "gpu-operator", &desired).await;
    assert_eq!(
        managers(&created),
        [("gpu-operator".to_owned(), "Apply".to_owned())]
    );
    assert_eq!(
        created
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("extra"))
            .map(String::as_str),
        Some("yes")
    );

    let trimmed = daemonset("plugin");
    let updated = applied(&api, "gpu-operator", &trimmed).await;
    assert_eq!(
        updated.metadata.labels.as_ref().and_then(|l| l.get("extra")),
        None,
        "removed when no longer applied"
    );
    assert_eq!(
        updated.metadata.generation,
        Some(1),
        "labels are metadata: no new generation"
    );

    // The steady state: applying the same thing again writes nothing.
    let version = server.resource_version();
    let again = applied(&api, "gpu-operator", &trimmed).await;
    assert_eq!(again.metadata.resource_version, updated.metadata.resource_version);
    assert_eq!(server.resource_version(), version);
    assert_eq!(server.requests().count(Verb::Apply, "daemonsets"), 3);
}

#[tokio::test]
async fn another_managers_field_conflicts_until_forced() {
    let server = server();
    let api: Api<DaemonSet> = Api::default_namespaced(server.client());
    applied(&api, "gpu-operator", &daemonset("plugin")).await;

    let mut theirs = daemonset("plugin");
    theirs
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .expect("pod spec")
        .containers[0]
        .image = Some("mine:v2".into());
    let conflict = failure(apply(&api, "someone", &theirs).await);
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        conflict.message,
        r#"Apply failed with 1 conflict: conflict with "gpu-operator": .spec.template.spec.containers[name="main"].image"#
    );
    let cause = &conflict.details.expect("details").causes[0];
    assert_eq!(cause.reason, "FieldManagerConflict");
    assert_eq!(
        cause.field,
        r#".spec.template.spec.containers[name="main"].image"#
    );

    let forced = api
        .patch(
            "plugin",
            &PatchParams::apply("someone").force(),
            &Patch::Apply(&theirs),
        )
        .await
        .expect("forced");
    assert_eq!(image(&forced), "mine:v2");
    // The operator lost the image: its next apply of the old image conflicts with the new owner.
    let back = failure(apply(&api, "gpu-operator", &daemonset("plugin")).await);
    assert_contains(&back.message, r#"conflict with "someone""#);
}

#[tokio::test]
async fn other_writes_take_ownership_of_what_they_change() {
    let server = server();
    let operator: Api<DaemonSet> = Api::default_namespaced(server.client());
    applied(&operator, "gpu-operator", &daemonset("plugin")).await;
    let person: Api<DaemonSet> = Api::default_namespaced(server.client_as("kubectl-edit/v1.32.4"));
    let edit =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "hotfix:1"}]}}}});
    let edited = person
        .patch("plugin", &PatchParams::default(), &Patch::Strategic(edit))
        .await
        .expect("edited");
    assert!(
        managers(&edited).contains(&("kubectl-edit".to_owned(), "Update".to_owned())),
        "{:?}",
        managers(&edited)
    );
    let conflict = failure(apply(&operator, "gpu-operator", &daemonset("plugin")).await);
    assert_contains(&conflict.message, r#"conflict with "kubectl-edit""#);
}

#[tokio::test]
async fn apply_to_status_touches_only_status() {
    let server = server();
    let api: Api<DaemonSet> = Api::default_namespaced(server.client());
    applied(&api, "gpu-operator", &daemonset("plugin")).await;
    let status = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "spec": {"minReadySeconds": 99},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberMisscheduled": 0, "numberReady": 2}});
    let written = api
        .patch_status(
            "plugin",
            &PatchParams::apply("sim-daemonset-controller"),
            &Patch::Apply(status),
        )
        .await
        .expect("applied");
    assert_only_status_written(&written, 2);
    let entry = written
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|m| m.manager.as_deref() == Some("sim-daemonset-controller"));
    assert_eq!(entry.and_then(|e| e.subresource.as_deref()), Some("status"));
}
