//! Built-in objects pass through their k8s-openapi types on every write, as the API server decodes into Go
//! structs: a value of the wrong type is refused with 400 naming the field, unknown fields fall away (and are
//! reported, for `fieldValidation`), times are truncated to seconds. Custom resources get the same treatment
//! for their `metadata` only; their bodies follow the CRD schema.
//!
//! [`undeclared`] is the other way the API server finds unknown fields: server-side apply types the
//! configuration against the schema before merging and refuses what it does not declare, whatever
//! `fieldValidation` says.

use k8s_openapi::api::{apps, batch, coordination, core, events, node, policy, rbac, scheduling};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fieldset;
use crate::registry::ResourceInfo;
use crate::shape::{ListType, Shape};

/// An object after decoding and encoding, and the fields that did not survive.
#[derive(Debug)]
pub(crate) struct Normalized {
    pub(crate) object: Value,
    pub(crate) unknown: Vec<String>,
}

fn roundtrip<T: DeserializeOwned + Serialize>(
    info: &ResourceInfo,
    object: &Value,
) -> Result<Value, ApiError> {
    let typed: T = serde_path_to_error::deserialize(object).map_err(|error| {
        let path = error.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        ApiError::BadRequest(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {at}{}",
            error.inner(),
            kind = info.kind,
            version = info.version,
        ))
    })?;
    serde_json::to_value(&typed).map_err(|e| ApiError::Internal(e.to_string()))
}

/// `metadata` decoded and re-encoded as an ObjectMeta, as every kind's metadata is.
pub(crate) fn object_meta(info: &ResourceInfo, metadata: &Value) -> Result<Value, ApiError> {
    roundtrip::<ObjectMeta>(info, metadata)
}

/// Decodes and re-encodes `object` through its built-in type (or, for custom resources, its metadata).
pub(crate) fn normalize(info: &ResourceInfo, object: &Value) -> Result<Normalized, ApiError> {
    let normalized = if info.custom.is_some() {
        let mut normalized = object.clone();
        if let Some(metadata) = object.get("metadata") {
            normalized["metadata"] = roundtrip::<ObjectMeta>(info, metadata)?;
        }
        normalized
    } else {
        match (info.group.as_str(), info.kind.as_str()) {
            ("", "Namespace") => roundtrip::<core::v1::Namespace>(info, object)?,
            ("", "Node") => roundtrip::<core::v1::Node>(info, object)?,
            ("", "Pod") => roundtrip::<core::v1::Pod>(info, object)?,
            ("", "ConfigMap") => roundtrip::<core::v1::ConfigMap>(info, object)?,
            ("", "Secret") => roundtrip::<core::v1::Secret>(info, object)?,
            ("", "Service") => roundtrip::<core::v1::Service>(info, object)?,
            ("", "ServiceAccount") => roundtrip::<core::v1::ServiceAccount>(info, object)?,
            ("", "Event") => roundtrip::<core::v1::Event>(info, object)?,
            ("apps", "DaemonSet") => roundtrip::<apps::v1::DaemonSet>(info, object)?,
            ("apps", "Deployment") => roundtrip::<apps::v1::Deployment>(info, object)?,
            ("apps", "ReplicaSet") => roundtrip::<apps::v1::ReplicaSet>(info, object)?,
            ("batch", "Job") => roundtrip::<batch::v1::Job>(info, object)?,
            ("apps", "ControllerRevision") => roundtrip::<apps::v1::ControllerRevision>(info, object)?,
            ("events.k8s.io", "Event") => roundtrip::<events::v1::Event>(info, object)?,
            ("rbac.authorization.k8s.io", "Role") => roundtrip::<rbac::v1::Role>(info, object)?,
            ("rbac.authorization.k8s.io", "RoleBinding") => roundtrip::<rbac::v1::RoleBinding>(info, object)?,
            ("rbac.authorization.k8s.io", "ClusterRole") => roundtrip::<rbac::v1::ClusterRole>(info, object)?,
            ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
                roundtrip::<rbac::v1::ClusterRoleBinding>(info, object)?
            }
            ("policy", "PodDisruptionBudget") => roundtrip::<policy::v1::PodDisruptionBudget>(info, object)?,
            ("scheduling.k8s.io", "PriorityClass") => {
                roundtrip::<scheduling::v1::PriorityClass>(info, object)?
            }
            ("coordination.k8s.io", "Lease") => roundtrip::<coordination::v1::Lease>(info, object)?,
            ("node.k8s.io", "RuntimeClass") => roundtrip::<node::v1::RuntimeClass>(info, object)?,
            ("apiextensions.k8s.io", "CustomResourceDefinition") => {
                roundtrip::<apiextensions::v1::CustomResourceDefinition>(info, object)?
            }
            _ => object.clone(),
        }
    };
    let mut normalized = normalized;
    drop_empty_metadata(&mut normalized);
    let mut unknown = Vec::new();
    dropped(object, &normalized, "", &mut unknown);
    Ok(Normalized {
        object: normalized,
        unknown,
    })
}

/// [`normalize`] for an update of `stored`, a stored object: decodes through the type only the top-level
/// sections the update changed, and keeps the others as stored.
///
/// A stored object came out of [`normalize`] (or a server write that only removes from it, or sets what
/// its type declares), and decoding is idempotent and field by field, so an unchanged section decodes to
/// itself, cannot fail and drops nothing: the result, the unknown fields and the first error are those of
/// the whole object's decoding. Debug builds (every test) decode the whole object too and check that.
/// The one difference is the order of keys inside an unchanged section, which stays as stored (defaults
/// are added after decoding, so a stored section is not in its type's order) where decoding would
/// reorder it; JSON objects are unordered, and no client sees the difference.
/// Only kinds whose top-level fields other than `metadata` are all optional take this path (a section
/// decodes alone), and only when the update brings no section the stored object lacks (the stored
/// top-level order is then kept as it is).
pub(crate) fn normalize_update(
    info: &ResourceInfo,
    stored: &Value,
    object: &Value,
) -> Result<Normalized, ApiError> {
    let fast = normalize_sections(info, stored, object);
    #[cfg(debug_assertions)]
    if let Some(fast) = &fast {
        let whole = normalize(info, object);
        let same = match (fast, &whole) {
            (Ok(fast), Ok(whole)) => fast.unknown == whole.unknown && fast.object == whole.object,
            (Err(fast), Err(whole)) => fast == whole,
            _ => false,
        };
        assert!(
            same,
            "decoding the changed sections differs from decoding the whole object: {fast:?} != {whole:?}"
        );
    }
    fast.unwrap_or_else(|| normalize(info, object))
}

/// The sections-only decoding of [`normalize_update`], or `None` where it does not apply.
fn normalize_sections(
    info: &ResourceInfo,
    stored: &Value,
    object: &Value,
) -> Option<Result<Normalized, ApiError>> {
    let decode: fn(&ResourceInfo, &Value) -> Result<Value, ApiError> =
        match (info.custom.is_some(), info.group.as_str(), info.kind.as_str()) {
            (false, "", "Pod") => roundtrip::<core::v1::Pod>,
            (false, "", "Node") => roundtrip::<core::v1::Node>,
            (false, "apps", "DaemonSet") => roundtrip::<apps::v1::DaemonSet>,
            (false, "apps", "ReplicaSet") => roundtrip::<apps::v1::ReplicaSet>,
            (false, "coordination.k8s.io", "Lease") => roundtrip::<coordination::v1::Lease>,
            _ => return None,
        };
    let (stored, sent) = (stored.as_object()?, object.as_object()?);
    if sent.keys().any(|key| !stored.contains_key(key)) {
        return None;
    }
    let identity = |key: &str| matches!(key, "apiVersion" | "kind");
    let changed = |key: &str| !identity(key) && stored.get(key) != sent.get(key);
    let partial: Map<String, Value> = sent
        .iter()
        .filter(|(key, _)| identity(key) || changed(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let decoded = match decode(info, &Value::Object(partial)) {
        Ok(decoded) => decoded,
        Err(error) => return Some(Err(error)),
    };
    let mut out = Map::new();
    for key in stored.keys() {
        // An unchanged section is taken as stored: equal to the one sent, and in the type's key order.
        let value = if identity(key) || changed(key) {
            decoded.get(key)
        } else {
            sent.get(key).and(stored.get(key))
        };
        if let Some(value) = value {
            out.insert(key.clone(), value.clone());
        }
    }
    let mut normalized = Value::Object(out);
    drop_empty_metadata(&mut normalized);
    let mut unknown = Vec::new();
    for (key, value) in sent.iter().filter(|(key, _)| changed(key)) {
        match normalized.get(key) {
            Some(kept) => dropped(value, kept, key, &mut unknown),
            None if !is_empty(value) => unknown.push(key.clone()),
            None => {}
        }
    }
    Some(Ok(Normalized {
        object: normalized,
        unknown,
    }))
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::String(text) => text.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// Every `ObjectMeta` field is `omitempty` in Go: empty labels, finalizers, owner references and the like
/// are not stored.
pub(crate) fn drop_empty_metadata(object: &mut Value) {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.retain(|_, value| !is_empty(value));
    }
}

/// Collects the paths present (and not null) in `before` but gone from `after`.
fn dropped(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => {
            for (key, value) in before {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match after.get(key) {
                    Some(kept) => dropped(value, kept, &child, out),
                    None if !is_empty(value) => out.push(child),
                    None => {}
                }
            }
        }
        (Value::Array(before), Value::Array(after)) => {
            for (index, (value, kept)) in before.iter().zip(after).enumerate() {
                dropped(value, kept, &format!("{path}[{index}]"), out);
            }
        }
        _ => {}
    }
}

/// The fields of a server-side apply configuration that the type does not declare, spelled as the API
/// server's field manager spells them (`.spec.containers[name="c"].bogus`): the paths of `config` that did
/// not survive into `decoded`, the merged object after decoding and pruning. The stored object has no
/// unknown fields, so whatever went missing came from the configuration.
pub(crate) fn undeclared(config: &Value, decoded: &Value, shape: Shape<'_>) -> Vec<String> {
    let mut out = Vec::new();
    walk_undeclared(config, decoded, shape, &mut String::new(), &mut out);
    out
}

fn walk_undeclared(
    config: &Value,
    decoded: &Value,
    shape: Shape<'_>,
    path: &mut String,
    out: &mut Vec<String>,
) {
    match (config, decoded) {
        (Value::Object(config), Value::Object(decoded)) => {
            for (key, value) in config {
                if value.is_null() {
                    continue;
                }
                let before = path.len();
                path.push('.');
                path.push_str(key);
                match decoded.get(key) {
                    Some(kept) => walk_undeclared(value, kept, shape.field(key), path, out),
                    // Empty metadata collections are declared, only not stored.
                    None if path.starts_with(".metadata.") && is_empty(value) => {}
                    None => out.push(path.clone()),
                }
                path.truncate(before);
            }
        }
        (Value::Array(config), Value::Array(decoded)) => {
            let items = shape.items();
            match shape.list_type() {
                ListType::Set => {}
                ListType::Atomic => {
                    for (index, (value, kept)) in config.iter().zip(decoded).enumerate() {
                        let before = path.len();
                        path.push_str(&format!("[{index}]"));
                        walk_undeclared(value, kept, items, path, out);
                        path.truncate(before);
                    }
                }
                keyed @ (ListType::Map(_) | ListType::SchemaMap(_)) => {
                    let keys = keyed.keys();
                    for value in config {
                        let same = |kept: &&Value| keys.iter().all(|k| kept.get(k) == value.get(k));
                        if let Some(kept) = decoded.iter().find(same) {
                            let before = path.len();
                            path.push_str(&fieldset::display(&[fieldset::key_element(value, &keys)]));
                            walk_undeclared(value, kept, items, path, out);
                            path.truncate(before);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    /// [`normalize`] of `object` as the built-in resource `plural` of `group`/`version`.
    fn normalize_as(
        group: &str,
        version: &str,
        plural: &str,
        object: &Value,
    ) -> Result<Normalized, ApiError> {
        let registry = Registry::builtin();
        let info = registry
            .find(group, version, plural)
            .expect("a built-in resource");
        normalize(&info, object)
    }

    #[test]
    fn wrong_types_are_refused_naming_the_field() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": "two"}});
        let error = normalize_as("apps", "v1", "deployments", &deployment).expect_err("refused");
        assert_eq!(error.code(), 400);
        let message = error.to_string();
        assert!(
            message.starts_with(
                r#"Deployment in version "v1" cannot be handled as a Deployment: spec.replicas: invalid type"#
            ),
            "{message}"
        );
    }

    #[test]
    fn unknown_fields_are_dropped_and_reported() {
        let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "bogus": 1},
                               "data": {"k": "v"}, "spec": {"x": 1}});
        let normalized = normalize_as("", "v1", "configmaps", &configmap).expect("decodes");
        assert_eq!(normalized.unknown, ["metadata.bogus", "spec"]);
        assert_eq!(
            normalized.object,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn apply_paths_name_keyed_items_by_their_keys() {
        let config = json!({"metadata": {"name": "d", "labels": {}, "bogus": 1},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "imagePullPolcy": "x"}],
                                           "tolerations": [{"key": "k", "nope": true}]}}}});
        let decoded = json!({"metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": [{"name": "other"}, {"name": "c", "image": "i"}],
                                           "tolerations": [{"key": "k"}]}}}});
        assert_eq!(
            undeclared(&config, &decoded, Shape::builtin("Deployment")),
            [
                ".metadata.bogus",
                r#".spec.template.spec.containers[name="c"].imagePullPolcy"#,
                ".spec.template.spec.tolerations[0].nope",
            ]
        );
    }
}
