//! Pod Security Admission labels on the operator's namespace (`spec.psa.enabled`), as NVIDIA's operator
//! sets them: the operands run privileged, so a cluster whose default level is `baseline` or `restricted`
//! would refuse their pods unless the namespace says `privileged`.
//!
//! The labels are written with server-side apply, so switching the setting off, or deleting the policy,
//! takes away exactly the labels the operator set, and labels a person set on the namespace stay (a label
//! a person also applied stays too: it is theirs as well).

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpuop_api::labels::FIELD_MANAGER;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::info;

/// The Pod Security level the operands need.
pub const LEVEL: &str = "privileged";

/// The Pod Security modes the operator labels.
pub const MODES: [&str; 3] = ["enforce", "audit", "warn"];

/// The labels the operator wants on its namespace: the level for every mode, or none.
pub fn labels(enabled: bool) -> BTreeMap<String, String> {
    if !enabled {
        return BTreeMap::new();
    }
    MODES
        .iter()
        .map(|mode| (format!("pod-security.kubernetes.io/{mode}"), LEVEL.to_owned()))
        .collect()
}

/// Whether the operator's server-side apply owns labels of the namespace (it labelled it before, maybe
/// before a restart).
pub fn labelled_by_operator(namespace: &Namespace) -> bool {
    namespace.metadata.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(FIELD_MANAGER)
            && entry.operation.as_deref() == Some("Apply")
            && entry
                .fields_v1
                .as_ref()
                .is_some_and(|fields| fields.0.pointer("/f:metadata/f:labels").is_some())
    })
}

/// What was last made true of the namespace's labels: `Some(enabled)`, or `None` before the first pass.
#[derive(Debug, Default)]
pub struct Applied(Mutex<Option<bool>>);

impl Applied {
    fn get(&self) -> Option<bool> {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set(&self, enabled: bool) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(enabled);
    }
}

/// Makes the namespace's Pod Security labels what `enabled` says, writing only when that changes (and
/// reading the namespace once, at the first pass with the setting off, to learn whether labels from an
/// earlier run must go).
pub async fn ensure(
    client: &Client,
    namespace: &str,
    enabled: bool,
    applied: &Applied,
) -> Result<(), kube::Error> {
    if applied.get() == Some(enabled) {
        return Ok(());
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if !enabled && applied.get().is_none() {
        let live = namespaces.get(namespace).await?;
        if !labelled_by_operator(&live) {
            applied.set(false);
            return Ok(());
        }
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": labels(enabled)},
    });
    namespaces
        .patch(
            namespace,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&config),
        )
        .await?;
    info!(
        namespace,
        enabled,
        level = LEVEL,
        "pod security labels of the operator's namespace applied"
    );
    applied.set(enabled);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn enabled_means_privileged_in_every_mode_and_disabled_means_none() {
        let on = labels(true);
        assert_eq!(on.len(), 3);
        assert_eq!(
            on.get("pod-security.kubernetes.io/enforce").map(String::as_str),
            Some("privileged")
        );
        assert_eq!(
            on.get("pod-security.kubernetes.io/warn").map(String::as_str),
            Some("privileged")
        );
        assert!(labels(false).is_empty());
    }

    fn namespace(manager: &str, operation: &str, fields: serde_json::Value) -> Namespace {
        Namespace {
            metadata: ObjectMeta {
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some(manager.into()),
                    operation: Some(operation.into()),
                    fields_v1: Some(FieldsV1(fields)),
                    ..ManagedFieldsEntry::default()
                }]),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        }
    }

    #[test]
    fn only_the_operators_own_applied_labels_count() {
        let labels = json!({"f:metadata": {"f:labels": {"f:pod-security.kubernetes.io/enforce": {}}}});
        assert!(labelled_by_operator(&namespace(
            FIELD_MANAGER,
            "Apply",
            labels.clone()
        )));
        assert!(!labelled_by_operator(&namespace(
            "kubectl",
            "Apply",
            labels.clone()
        )));
        assert!(!labelled_by_operator(&namespace(FIELD_MANAGER, "Update", labels)));
        assert!(!labelled_by_operator(&namespace(
            FIELD_MANAGER,
            "Apply",
            json!({"f:metadata": {}})
        )));
    }
}
