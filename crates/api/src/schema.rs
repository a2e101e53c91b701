//! What the Kubernetes API server does with a custom resource and its CRD's structural `openAPIV3Schema`:
//! drop unknown fields and `null`s ([`prune`]), fill in defaults ([`apply_defaults`]), and check types,
//! enums, patterns, bounds and required fields ([`validate`]).
//!
//! `gpu-operator check` uses it to show a person what the API server would reject or silently drop; the fake
//! API server uses it to behave like the real one. Schemas are plain JSON (`serde_json::Value`), so any CRD
//! works, not only ours. [`check_rules`] evaluates the CEL rules (`x-kubernetes-validations`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use regex::Regex;
use serde_json::{Map, Value};

use crate::field::{FieldError, child, closest, item, json_type};

/// Top-level fields of every object that the schema does not describe.
const OBJECT_ENVELOPE: &[&str] = &["apiVersion", "kind", "metadata"];

/// Checks an object (with `apiVersion`, `kind` and `metadata`) against its CRD schema; returns every problem.
///
/// Unknown fields are reported as [`FieldErrorKind::Unknown`](crate::field::FieldErrorKind::Unknown);
/// `null`s are ignored, as the API server drops them before validating.
pub fn validate(schema: &Value, object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check(schema, object, "", true, &mut errors);
    errors
}

/// Removes what the API server would drop before storing the object: fields the schema does not know
/// and `null`s where the schema does not allow them. Returns the paths of what was removed.
pub fn prune(schema: &Value, object: &mut Value) -> Vec<String> {
    let mut removed = Vec::new();
    prune_at(schema, object, "", true, &mut removed);
    removed
}

/// Fills in every `default` the schema gives for an absent field, recursively, as the API server does.
pub fn apply_defaults(schema: &Value, object: &mut Value) {
    match object {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (key, property) in properties {
                    if !map.contains_key(key)
                        && let Some(default) = property.get("default")
                    {
                        map.insert(key.clone(), default.clone());
                    }
                }
                for (key, value) in map.iter_mut() {
                    if let Some(property) = properties.get(key) {
                        apply_defaults(property, value);
                    }
                }
            } else if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                map.values_mut()
                    .for_each(|value| apply_defaults(additional, value));
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items
                    .iter_mut()
                    .for_each(|value| apply_defaults(item_schema, value));
            }
        }
        _ => {}
    }
}

/// Removes every value whose JSON type the schema does not allow (a number where a string is expected,
/// ...), recursively, so that the rest of an object can still be read into its Rust type and judged by
/// the operator's own rules. Returns how many values were removed. The API server would refuse such an
/// object outright; [`validate`] reports each removed value as a wrong type.
pub fn remove_wrong_types(schema: &Value, object: &mut Value) -> usize {
    let wrong = |schema: &Value, value: &Value| {
        !value.is_null()
            && if flag(schema, "x-kubernetes-int-or-string") {
                !(value.is_string() || is_integer(value))
            } else {
                schema
                    .get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|expected| !type_matches(expected, value))
            }
    };
    let mut removed = 0;
    match object {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            map.retain(|key, value| {
                let Some(property) = properties.and_then(|p| p.get(key)).or(additional) else {
                    return true;
                };
                if wrong(property, value) {
                    removed += 1;
                    false
                } else {
                    removed += remove_wrong_types(property, value);
                    true
                }
            });
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items.retain_mut(|value| {
                    if wrong(item_schema, value) {
                        removed += 1;
                        false
                    } else {
                        removed += remove_wrong_types(item_schema, value);
                        true
                    }
                });
            }
        }
        _ => {}
    }
    removed
}

/// Evaluates the schema's CEL rules (`x-kubernetes-validations`) on an object, as the API server does after
/// defaulting; `old` is the stored object on an update (rules using `oldSelf` need it and are skipped
/// without it). A rule that fails or errors while evaluating refuses the object, as on the API server. A
/// rule that cannot be compiled or uses what client-side CEL lacks is not reported: that is a fault of the
/// CRD, not of the object, and [`rule_faults`] finds it.
pub fn check_rules(schema: &Value, object: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let Err(failures) = kube_cel::validate(schema, object, old) else {
        return Vec::new();
    };
    failures
        .into_vec()
        .into_iter()
        .filter(|failure| {
            matches!(
                failure.kind,
                kube_cel::ErrorKind::ValidationFailure | kube_cel::ErrorKind::EvaluationError
            )
        })
        .map(|failure| {
            let value_type = value_at(object, &failure.field_path).map_or("object", json_type);
            FieldError {
                path: failure.field_path.clone(),
                kind: crate::field::FieldErrorKind::Rule {
                    value_type: value_type.to_owned(),
                    message: failure.message,
                },
            }
        })
        .collect()
}

/// Rules of a schema that cannot be compiled, or that use what client-side CEL cannot evaluate, when run
/// on `object`; empty for a sound CRD.
pub fn rule_faults(schema: &Value, object: &Value) -> Vec<String> {
    let compiled = kube_cel::compile_schema(schema);
    let mut faults: Vec<String> = compiled
        .compilation_errors()
        .iter()
        .map(|error| error.to_string())
        .collect();
    if let Err(failures) = kube_cel::validate(schema, object, Some(object)) {
        faults.extend(
            failures
                .into_vec()
                .into_iter()
                .filter(|failure| {
                    !matches!(
                        failure.kind,
                        kube_cel::ErrorKind::ValidationFailure | kube_cel::ErrorKind::EvaluationError
                    )
                })
                .map(|failure| format!("{}: {}", failure.rule, failure.message)),
        );
    }
    faults
}

/// The value at a path like `spec.items[2].name`.
fn value_at<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut value = object;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (name, indices) = segment
            .split_once('[')
            .map_or((segment, ""), |(n, rest)| (n, rest));
        value = value.get(name)?;
        for index in indices
            .split('[')
            .map(|i| i.trim_end_matches(']'))
            .filter(|i| !i.is_empty())
        {
            value = value.get(index.parse::<usize>().ok()?)?;
        }
    }
    Some(value)
}

fn check(schema: &Value, value: &Value, path: &str, root: bool, errors: &mut Vec<FieldError>) {
    if value.is_null() {
        return;
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(value.is_string() || is_integer(value)) {
            errors.push(FieldError::wrong_type(path, value.clone(), "integer or string"));
            return;
        }
    } else if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !type_matches(expected, value)
    {
        errors.push(FieldError::wrong_type(path, value.clone(), expected));
        return;
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let supported: Vec<String> = allowed
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect();
        let supported: Vec<&str> = supported.iter().map(String::as_str).collect();
        errors.push(FieldError::unsupported(path, value.clone(), &supported));
    }
    match value {
        Value::String(text) => check_string(schema, text, value, path, errors),
        Value::Number(_) => check_number(schema, value, path, errors),
        Value::Object(map) => check_object(schema, map, path, root, errors),
        Value::Array(items) => check_array(schema, items, value, path, errors),
        _ => {}
    }
}

fn check_string(schema: &Value, text: &str, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && !matches_pattern(pattern, text)
    {
        errors.push(FieldError::invalid(
            path,
            value.clone(),
            format!("should match '{pattern}'"),
        ));
    }
    let length = text.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && length > max
    {
        errors.push(FieldError::invalid(
            path,
            value.clone(),
            format!("may not be longer than {max}"),
        ));
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && length < min
    {
        errors.push(FieldError::invalid(
            path,
            value.clone(),
            format!("should be at least {min} chars long"),
        ));
    }
}

fn check_number(schema: &Value, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let Some(number) = value.as_f64() else { return };
    if let Some(minimum) = schema.get("minimum").and_then(Value::as_f64) {
        let exclusive = flag(schema, "exclusiveMinimum");
        if number < minimum || (exclusive && number == minimum) {
            let relation = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errors.push(FieldError::invalid(
                path,
                value.clone(),
                format!("should be {relation} {}", trim(minimum)),
            ));
        }
    }
    if let Some(maximum) = schema.get("maximum").and_then(Value::as_f64) {
        let exclusive = flag(schema, "exclusiveMaximum");
        if number > maximum || (exclusive && number == maximum) {
            let relation = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errors.push(FieldError::invalid(
                path,
                value.clone(),
                format!("should be {relation} {}", trim(maximum)),
            ));
        }
    }
    if schema.get("format").and_then(Value::as_str) == Some("int32")
        && let Some(integer) = value.as_i64()
        && i32::try_from(integer).is_err()
    {
        errors.push(FieldError::invalid(path, value.clone(), "should fit in 32 bits"));
    }
}

fn check_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    root: bool,
    errors: &mut Vec<FieldError>,
) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(schema, "x-kubernetes-embedded-resource");
    for (key, value) in map {
        let key_path = child(path, key);
        if (root || embedded) && OBJECT_ENVELOPE.contains(&key.as_str()) {
            // The envelope is the API server's own (`metadata` is an ObjectMeta whatever the schema says);
            // a schema may only restrict `metadata.name` and `metadata.generateName`.
            let meta_schema = properties.and_then(|p| p.get(key)).filter(|_| key == "metadata");
            for field in ["name", "generateName"] {
                if let (Some(field_schema), Some(field_value)) = (
                    meta_schema.and_then(|m| m.pointer(&format!("/properties/{field}"))),
                    value.get(field),
                ) {
                    check(field_schema, field_value, &child(&key_path, field), false, errors);
                }
            }
        } else if let Some(property) = properties.and_then(|p| p.get(key)) {
            check(property, value, &key_path, false, errors);
        } else if let Some(additional) = additional {
            check(additional, value, &key_path, false, errors);
        } else if (root || embedded) && OBJECT_ENVELOPE.contains(&key.as_str()) || preserve {
            // Always kept: the envelope of an object, or anything under preserve-unknown-fields.
        } else {
            let known = properties.into_iter().flat_map(|p| p.keys().map(String::as_str));
            errors.push(FieldError::unknown(
                key_path,
                closest(key, known).map(str::to_owned),
            ));
        }
    }
    if let Some(Value::Array(required)) = schema.get("required") {
        for key in required.iter().filter_map(Value::as_str) {
            if map.get(key).is_none_or(Value::is_null) {
                errors.push(FieldError::required(child(path, key)));
            }
        }
    }
}

fn check_array(schema: &Value, items: &[Value], value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if let Some(item_schema) = schema.get("items") {
        for (index, element) in items.iter().enumerate() {
            check(item_schema, element, &item(path, index), false, errors);
        }
    }
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        errors.push(FieldError::invalid(
            path,
            value.clone(),
            format!("must have at most {max} items"),
        ));
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        errors.push(FieldError::invalid(
            path,
            value.clone(),
            format!("should have at least {min} items"),
        ));
    }
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map")
        && let Some(Value::Array(keys)) = schema.get("x-kubernetes-list-map-keys")
    {
        let mut seen = Vec::new();
        for (index, element) in items.iter().enumerate() {
            let identity: Vec<Option<&Value>> = keys
                .iter()
                .filter_map(Value::as_str)
                .map(|key| element.get(key))
                .collect();
            if seen.contains(&identity) {
                errors.push(FieldError::invalid(
                    item(path, index),
                    element.clone(),
                    "duplicates an earlier entry's keys",
                ));
            }
            seen.push(identity);
        }
    }
}

fn prune_at(schema: &Value, value: &mut Value, path: &str, root: bool, removed: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let embedded = flag(schema, "x-kubernetes-embedded-resource");
            let mut drop = Vec::new();
            for (key, child_value) in map.iter_mut() {
                let key_path = child(path, key);
                // The envelope is never pruned by the schema, even one that declares `metadata`: the API
                // server decodes it as ObjectMeta, which drops (and reports) unknown fields of its own.
                if (root || embedded) && OBJECT_ENVELOPE.contains(&key.as_str()) {
                    continue;
                }
                let child_schema = properties.and_then(|p| p.get(key)).or(additional);
                match child_schema {
                    Some(child_schema) => {
                        if child_value.is_null() && !flag(child_schema, "nullable") {
                            drop.push(key.clone());
                            removed.push(key_path);
                        } else {
                            prune_at(child_schema, child_value, &key_path, false, removed);
                        }
                    }
                    None if preserve => {}
                    None => {
                        drop.push(key.clone());
                        removed.push(key_path);
                    }
                }
            }
            for key in drop {
                map.remove(&key);
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, element) in items.iter_mut().enumerate() {
                    prune_at(item_schema, element, &item(path, index), false, removed);
                }
            }
        }
        _ => {}
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => is_integer(value),
        "number" => value.is_number(),
        _ => true,
    }
}

fn is_integer(value: &Value) -> bool {
    json_type(value) == "integer"
        || value
            .as_f64()
            .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn trim(number: f64) -> String {
    if number.fract() == 0.0 {
        format!("{}", number as i64)
    } else {
        number.to_string()
    }
}

/// Whether `text` matches an OpenAPI `pattern` (unanchored, as Go's `regexp.MatchString`).
///
/// Compiled patterns are cached: the fake API server validates every write against the same few.
pub(crate) fn matches_pattern(pattern: &str, text: &str) -> bool {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let regex = cache
        .entry(pattern.to_owned())
        .or_insert_with(|| Regex::new(pattern).ok());
    // A pattern the regex engine cannot compile cannot reject anything; the API server would have refused
    // the CRD in the first place.
    regex.as_ref().is_none_or(|regex| regex.is_match(text))
}

/// Fails the test unless every `expected` message is among the `found` ones.
#[cfg(test)]
pub(crate) fn assert_reports(found: &[String], expected: &[&str]) {
    for message in expected {
        assert!(
            found.iter().any(|m| m == message),
            "missing {message:?} in {found:#?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::FieldErrorKind;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": { "type": "string", "pattern": "^[a-z]+$", "maxLength": 5 },
                        "mode": { "type": "string", "enum": ["a", "b"], "default": "a" },
                        "count": { "type": "integer", "minimum": 1, "format": "int32" },
                        "enabled": { "type": "boolean" },
                        "limit": { "x-kubernetes-int-or-string": true },
                        "labels": { "type": "object", "additionalProperties": { "type": "string" } },
                        "free": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                        "ports": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {
                                "type": "object",
                                "properties": { "name": { "type": "string" }, "port": { "type": "integer", "default": 80 } }
                            }
                        }
                    }
                }
            }
        })
    }

    fn messages(object: &Value) -> Vec<String> {
        validate(&schema(), object)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_valid_object_has_no_problems() {
        let object = json!({
            "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x"},
            "spec": {"name": "abc", "mode": "b", "count": 3, "enabled": true, "limit": "25%",
                     "labels": {"a": "b"}, "free": {"anything": [1, 2]}, "ports": [{"name": "a"}, {"name": "b"}]}
        });
        assert_eq!(messages(&object), Vec::<String>::new());
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_path() {
        let object = json!({
            "spec": {"name": "ABCDEFG", "mode": "c", "count": 0, "enabled": "yes", "limit": true,
                     "labels": {"a": 1}, "extra": 1, "ports": [{"name": "a"}, {"name": "a"}]}
        });
        let found = messages(&object);
        let expected = [
            r#"spec.name: "ABCDEFG" should match '^[a-z]+$'"#,
            r#"spec.name: "ABCDEFG" may not be longer than 5"#,
            r#"spec.mode: "c" is not one of [a, b]"#,
            "spec.count: 0 should be greater than or equal to 1",
            r#"spec.enabled: "yes" is a string, expected a boolean"#,
            "spec.limit: true is a boolean, expected an integer or string",
            "spec.labels.a: 1 is an integer, expected a string",
            "spec.extra: unknown field; the API server would silently drop it",
            r#"spec.ports[1]: {"name":"a"} duplicates an earlier entry's keys"#,
        ];
        assert_reports(&found, &expected);
        assert_eq!(found.len(), expected.len(), "{found:#?}");
    }

    #[test]
    fn metadata_is_the_api_servers_even_where_the_schema_declares_it() {
        // controller-gen writes `metadata: {type: object}` into every CRD; the API server still keeps and
        // checks metadata as ObjectMeta, restricting only `name` and `generateName` by the schema.
        let schema = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}}},
            "spec": {"type": "object"}}});
        let mut object = json!({"apiVersion": "x/v1", "kind": "X",
            "metadata": {"name": "abcd", "labels": {"a": "b"}, "uid": "u"}, "spec": {}});
        let before = object.clone();
        assert_eq!(prune(&schema, &mut object), Vec::<String>::new());
        assert_eq!(object, before, "nothing in metadata is pruned");
        let found: Vec<String> = validate(&schema, &object)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found, [r#"metadata.name: "abcd" may not be longer than 3"#]);
    }

    #[test]
    fn required_fields_and_nulls() {
        assert_eq!(
            messages(&json!({"spec": {}})),
            ["spec.name: required field is missing"]
        );
        assert_eq!(messages(&json!({})), ["spec: required field is missing"]);
        // A null is dropped by the API server, so it is neither a type error nor a value.
        assert_eq!(
            messages(&json!({"spec": {"name": "a", "count": null}})),
            Vec::<String>::new()
        );
        assert_eq!(
            messages(&json!({"spec": {"name": null}})),
            ["spec.name: required field is missing"]
        );
    }

    #[test]
    fn unknown_fields_come_with_a_suggestion() {
        let errors = validate(&schema(), &json!({"spec": {"name": "a", "enabeld": true}}));
        assert_eq!(
            errors[0].kind,
            FieldErrorKind::Unknown {
                suggestion: Some("enabled".into())
            }
        );
    }

    #[test]
    fn pruning_drops_unknown_fields_and_nulls_but_keeps_the_envelope() {
        let mut object = json!({
            "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x"}, "status": {},
            "spec": {"name": "a", "extra": 1, "count": null, "free": {"kept": true}, "ports": [{"name": "a", "x": 1}]}
        });
        let removed = prune(&schema(), &mut object);
        assert_eq!(removed, ["status", "spec.extra", "spec.count", "spec.ports[0].x"]);
        assert_eq!(
            object,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x"},
                   "spec": {"name": "a", "free": {"kept": true}, "ports": [{"name": "a"}]}})
        );
    }

    #[test]
    fn cel_rules_are_evaluated_with_their_messages() {
        let schema = json!({
            "type": "object",
            "properties": {"spec": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "!has(self.b) || self.a < self.b", "message": "a must be below b"}],
                "properties": {
                    "a": {"type": "integer"},
                    "b": {"type": "integer"},
                    "fixed": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "is immutable"}]}
                }
            }}
        });
        let object = json!({"spec": {"a": 5, "b": 1, "fixed": "x"}});
        assert_eq!(rule_faults(&schema, &object), Vec::<String>::new());
        let errors = check_rules(&schema, &object, None);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].to_string(), "spec: a must be below b");
        assert_eq!(
            errors[0].apiserver_message(),
            "spec: Invalid value: \"object\": a must be below b"
        );
        assert!(check_rules(&schema, &json!({"spec": {"a": 1, "b": 5}}), None).is_empty());
        let old = json!({"spec": {"a": 1, "fixed": "y"}});
        let errors = check_rules(&schema, &json!({"spec": {"a": 1, "fixed": "x"}}), Some(&old));
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.fixed: is immutable"]
        );
    }

    #[test]
    fn rules_client_side_cel_cannot_evaluate_are_faults_not_failures() {
        let schema = json!({"type": "object", "properties": {"m": {
            "x-kubernetes-int-or-string": true,
            "x-kubernetes-validations": [{"rule": "type(self) == int", "message": "m must be a number"}]
        }}});
        let object = json!({"m": "3"});
        assert_eq!(check_rules(&schema, &object, None), Vec::new());
        assert_eq!(rule_faults(&schema, &object).len(), 1);
    }

    #[test]
    fn values_are_found_by_path() {
        let object = json!({"spec": {"list": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(value_at(&object, "spec.list[1].name"), Some(&json!("b")));
        assert_eq!(value_at(&object, "spec.missing"), None);
    }

    #[test]
    fn defaults_fill_absent_fields_only() {
        let mut object =
            json!({"spec": {"name": "a", "ports": [{"name": "a"}, {"name": "b", "port": 8080}]}});
        apply_defaults(&schema(), &mut object);
        assert_eq!(object["spec"]["mode"], "a");
        assert_eq!(object["spec"]["ports"][0]["port"], 80);
        assert_eq!(object["spec"]["ports"][1]["port"], 8080);
        let mut chosen = json!({"spec": {"name": "a", "mode": "b"}});
        apply_defaults(&schema(), &mut chosen);
        assert_eq!(chosen["spec"]["mode"], "b");
    }
}
