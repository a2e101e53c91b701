//! Strategic merge patch (`application/strategic-merge-patch+json`) for built-in kinds, as kubectl's
//! client-side apply, `kubectl patch` and lease libraries send it.
//!
//! Maps merge key by key and `null` deletes. Lists merge by their merge key (containers by `name`, ...), sets
//! merge by value, and other lists are replaced. The directives kubectl emits are honoured: `$patch`
//! (`replace`, `delete`, `merge`), `$retainKeys`, `$setElementOrder/<list>` and
//! `$deleteFromPrimitiveList/<list>`.

use serde_json::{Map, Value};

use crate::shape::{ListType, Shape};

/// Why a strategic merge patch could not be applied.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StrategicError {
    /// The patch is not an object.
    #[error("strategic merge patch must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// A directive has a value the server does not understand.
    #[error("unknown patch type: {0}")]
    UnknownDirective(String),
    /// A keyed list item lacks its merge key.
    #[error("map: {item} does not contain declared merge key: {key}")]
    MissingMergeKey { item: String, key: String },
}

/// Applies `patch` to `target` (an object of the built-in kind whose root shape is `shape`).
pub(crate) fn apply(target: &mut Value, patch: &Value, shape: Shape<'_>) -> Result<(), StrategicError> {
    let Value::Object(patch) = patch else {
        return Err(StrategicError::NotAnObject(gpuop_api::field::json_type(patch)));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    merge_map(target, patch, shape)
}

fn merge_map(target: &mut Value, patch: &Map<String, Value>, shape: Shape<'_>) -> Result<(), StrategicError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = Value::Object(strip_directives(patch));
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(StrategicError::UnknownDirective(other.to_owned())),
    }
    if !target.is_object() || shape.atomic_map() {
        *target = Value::Object(strip_nulls(strip_directives(patch)));
        return Ok(());
    }
    let Value::Object(map) = target else {
        unreachable!("made an object above")
    };
    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        let child = shape.field(key);
        match (map.get_mut(key), value) {
            (Some(existing @ Value::Object(_)), Value::Object(inner)) => merge_map(existing, inner, child)?,
            (Some(existing @ Value::Array(_)), Value::Array(items)) => merge_list(existing, items, child)?,
            (_, Value::Object(inner)) => {
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") {
                    map.remove(key);
                } else {
                    let mut fresh = Value::Object(Map::new());
                    merge_map(&mut fresh, inner, child)?;
                    map.insert(key.clone(), fresh);
                }
            }
            (_, Value::Array(items)) => {
                let mut fresh = Value::Array(Vec::new());
                merge_list(&mut fresh, items, child)?;
                map.insert(key.clone(), fresh);
            }
            (_, scalar) => {
                map.insert(key.clone(), scalar.clone());
            }
        }
    }
    for (key, value) in patch {
        if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/")
            && let (Some(Value::Array(items)), Value::Array(doomed)) = (map.get_mut(list), value)
        {
            items.retain(|item| !doomed.contains(item));
        }
    }
    for (key, value) in patch {
        if let Some(list) = key.strip_prefix("$setElementOrder/")
            && let (Some(Value::Array(items)), Value::Array(order)) = (map.get_mut(list), value)
        {
            let keys = shape
                .field(list)
                .list_type()
                .keys()
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>();
            reorder(items, order, &keys);
        }
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        map.retain(|key, _| retain.iter().any(|k| k.as_str() == Some(key)));
    }
    Ok(())
}

fn merge_list(target: &mut Value, patch: &[Value], shape: Shape<'_>) -> Result<(), StrategicError> {
    let replace_all = patch
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"));
    let Value::Array(items) = target else {
        unreachable!("callers pass arrays")
    };
    if replace_all {
        *items = patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(());
    }
    match shape.list_type() {
        ListType::Atomic => *items = patch.iter().map(|v| strip_nulls_value(v.clone())).collect(),
        ListType::Set => {
            for value in patch {
                if !items.contains(value) {
                    items.push(value.clone());
                }
            }
        }
        list @ (ListType::Map(_) | ListType::SchemaMap(_)) => {
            let key = list.keys().first().map(|k| (*k).to_owned()).unwrap_or_default();
            for patch_item in patch {
                let Some(patch_map) = patch_item.as_object() else {
                    items.push(patch_item.clone());
                    continue;
                };
                let Some(identity) = patch_map.get(&key) else {
                    return Err(StrategicError::MissingMergeKey {
                        item: patch_item.to_string(),
                        key,
                    });
                };
                let position = items.iter().position(|item| item.get(&key) == Some(identity));
                let delete = patch_map.get("$patch").and_then(Value::as_str) == Some("delete");
                match (position, delete) {
                    (Some(_), true) => items.retain(|item| item.get(&key) != Some(identity)),
                    (None, true) => {}
                    (Some(at), false) => merge_map(&mut items[at], patch_map, shape.items())?,
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        merge_map(&mut fresh, patch_map, shape.items())?;
                        items.push(fresh);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Orders `items` as `order` lists them; items not listed keep their relative order after those listed.
fn reorder(items: &mut [Value], order: &[Value], keys: &[String]) {
    let rank = |item: &Value| {
        order
            .iter()
            .position(|entry| {
                if keys.is_empty() {
                    entry == item
                } else {
                    keys.iter()
                        .filter(|k| entry.get(k.as_str()).is_some())
                        .all(|k| entry.get(k.as_str()) == item.get(k.as_str()))
                }
            })
            .unwrap_or(usize::MAX)
    };
    items.sort_by_key(|item| rank(item));
}

fn strip_directives(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn strip_nulls(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k, strip_nulls_value(v)))
        .collect()
}

fn strip_nulls_value(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(strip_nulls(map)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(mut target: Value, patch: &Value, kind: &str) -> Value {
        apply(&mut target, patch, Shape::builtin(kind)).expect("patch applies");
        target
    }

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let ds = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
            {"name": "b", "image": "b:1"}
        ]}}}});
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "3"}, {"name": "Z", "value": "4"}]}
        ]}}}});
        let result = patched(ds, &patch, "DaemonSet");
        assert_eq!(
            result["spec"]["template"]["spec"]["containers"],
            json!([
                {"name": "a", "image": "a:2", "env": [
                    {"name": "X", "value": "1"}, {"name": "Y", "value": "3"}, {"name": "Z", "value": "4"}]},
                {"name": "b", "image": "b:1"}
            ])
        );
    }

    #[test]
    fn atomic_lists_are_replaced_and_nulls_delete() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
            "spec": {"tolerations": [{"key": "x"}], "containers": [{"name": "c", "args": ["1", "2"]}]}});
        let patch = json!({"metadata": {"labels": {"a": null}},
            "spec": {"tolerations": [{"key": "y"}], "containers": [{"name": "c", "args": ["3"]}]}});
        let result = patched(pod, &patch, "Pod");
        assert_eq!(result["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(result["spec"]["tolerations"], json!([{"key": "y"}]));
        assert_eq!(result["spec"]["containers"][0]["args"], json!(["3"]));
    }

    #[test]
    fn owner_references_merge_field_by_field_by_uid() {
        let owned = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": "w"}
        ]}});
        let patch = json!({"metadata": {"ownerReferences": [{"uid": "u", "blockOwnerDeletion": true}]}});
        let result = patched(owned, &patch, "ConfigMap");
        assert_eq!(
            result["metadata"]["ownerReferences"],
            json!([
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u", "blockOwnerDeletion": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": "w"}
            ])
        );
    }

    #[test]
    fn directives_delete_replace_and_order() {
        let pod = json!({"metadata": {"finalizers": ["a", "b"]},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
                     "volumes": [{"name": "v", "hostPath": {"path": "/x"}}]}});
        let patch = json!({
            "metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {
                "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
                "containers": [{"name": "b", "$patch": "delete"}],
                "volumes": [{"name": "v", "emptyDir": {}, "$retainKeys": ["emptyDir", "name"]}]
            }
        });
        let result = patched(pod, &patch, "Pod");
        assert_eq!(result["metadata"]["finalizers"], json!(["b", "c"]));
        assert_eq!(
            result["spec"]["containers"],
            json!([{"name": "c"}, {"name": "a"}])
        );
        assert_eq!(result["spec"]["volumes"], json!([{"name": "v", "emptyDir": {}}]));
    }

    #[test]
    fn a_keyed_item_without_its_key_is_refused() {
        let mut pod = json!({"spec": {"containers": []}});
        let error = apply(
            &mut pod,
            &json!({"spec": {"containers": [{"image": "x"}]}}),
            Shape::builtin("Pod"),
        );
        assert_eq!(
            error,
            Err(StrategicError::MissingMergeKey {
                item: r#"{"image":"x"}"#.into(),
                key: "name".into()
            })
        );
    }
}
