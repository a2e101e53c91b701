//! The non-apply patch types: JSON patch (RFC 6902, with `test`), JSON merge patch (RFC 7386) and strategic
//! merge patch (built-in kinds only; custom resources answer 415, as the real server does). Server-side
//! apply lives in [`crate::ssa`].

use serde_json::Value;

use crate::error::ApiError;
use crate::registry::ResourceInfo;
use crate::shape::Shape;

/// The patch types, by `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

/// The patch types a custom resource accepts; built-in kinds also take strategic merge patches, listed
/// before apply as kube-apiserver's installer lists them.
const ACCEPTED: &str =
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";
const ACCEPTED_BUILTIN: &str = "application/json-patch+json, application/merge-patch+json, \
application/strategic-merge-patch+json, application/apply-patch+yaml";

impl PatchType {
    /// The patch type a request's `Content-Type` names.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, ApiError> {
        let media = content_type
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        match media {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            _ => Err(ApiError::UnsupportedMediaType {
                accepted: ACCEPTED_BUILTIN.into(),
            }),
        }
    }
}

/// Parses a request body, JSON or YAML.
pub(crate) fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(json_error) => {
            let text = std::str::from_utf8(body).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            match serde_saphyr::from_str::<Value>(text) {
                Ok(value) => Ok(value),
                Err(_) => Err(ApiError::BadRequest(format!(
                    "error decoding request body: {json_error}"
                ))),
            }
        }
    }
}

/// The keys a JSON body gives twice in one object, each as its path (`data`, `spec.containers[0].name`), as
/// kube-apiserver's strict decoding names them; none for a body that is not JSON (YAML is checked by its
/// own parser). The value kept is the last, as Go's decoder keeps it.
pub(crate) fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let found = std::cell::RefCell::new(Vec::new());
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let walked = serde::de::DeserializeSeed::deserialize(
        Keys {
            path: String::new(),
            found: &found,
        },
        &mut deserializer,
    );
    match walked {
        Ok(()) => found.into_inner(),
        Err(_) => Vec::new(),
    }
}

/// Walks a JSON value, noting the keys an object repeats.
struct Keys<'a> {
    path: String,
    found: &'a std::cell::RefCell<Vec<String>>,
}

impl Keys<'_> {
    fn child(&self, key: &str) -> Self {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Keys {
            path,
            found: self.found,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Keys<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Keys<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(&key);
            if !seen.insert(key) {
                self.found.borrow_mut().push(child.path.clone());
            }
            map.next_value_seed(child)?;
        }
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        let mut index = 0_usize;
        while items
            .next_element_seed(Keys {
                path: format!("{}[{index}]", self.path),
                found: self.found,
            })?
            .is_some()
        {
            index += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Applies a JSON, merge or strategic patch to `target`, an object of resource `info`.
pub(crate) fn apply(
    kind: PatchType,
    target: &mut Value,
    patch: &Value,
    info: &ResourceInfo,
) -> Result<(), ApiError> {
    match kind {
        PatchType::Json => {
            let operations: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            json(target, &operations)
        }
        PatchType::Merge => {
            json_patch::merge(target, patch);
            Ok(())
        }
        PatchType::Strategic => {
            if info.custom.is_some() {
                return Err(ApiError::UnsupportedMediaType {
                    accepted: ACCEPTED.to_owned(),
                });
            }
            crate::strategic::apply(target, patch, Shape::builtin(&info.kind))
                .map_err(|e| ApiError::BadRequest(e.to_string()))
        }
        PatchType::Apply => Err(ApiError::Internal(
            "apply patches are handled by server-side apply".into(),
        )),
    }
}

/// Applies a JSON patch. As in the API server's JSON patch library, `test` with a `null` value passes when
/// the path is absent: kube-runtime's finalizer helper relies on it to add the first finalizer.
fn json(target: &mut Value, operations: &json_patch::Patch) -> Result<(), ApiError> {
    let mut working = target.clone();
    for operation in &operations.0 {
        match operation {
            json_patch::PatchOperation::Test(test) if test.value.is_null() => {
                let found = working.pointer(test.path.as_str()).unwrap_or(&Value::Null);
                if !found.is_null() {
                    return Err(ApiError::Unprocessable(format!(
                        "testing value {} failed: expected null, found {found}",
                        test.path
                    )));
                }
            }
            _ => json_patch::patch(&mut working, std::slice::from_ref(operation))
                .map_err(|e| ApiError::Unprocessable(e.to_string()))?,
        }
    }
    *target = working;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_given_twice_are_named_by_their_paths() {
        let body =
            br#"{"metadata": {"name": "a", "labels": {"x": "1", "x": "2"}}, "data": {}, "data": {"k": "v"},
                        "items": [{"n": 1, "n": 2}]}"#;
        assert_eq!(
            duplicate_fields(body),
            ["metadata.labels.x", "data", "items[0].n"]
        );
        assert!(duplicate_fields(br#"{"a": {"b": 1}, "c": {"b": 2}}"#).is_empty());
        assert!(
            duplicate_fields(b"a: 1\na: 2\n").is_empty(),
            "YAML is its parser's"
        );
    }

    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    #[test]
    fn a_failed_json_patch_test_is_unprocessable() {
        let registry = Registry::builtin();
        let info = registry.find("", "v1", "configmaps").expect("configmaps");
        let mut fresh = json!({"metadata": {}});
        let first = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                           {"op": "add", "path": "/metadata/finalizers", "value": ["a"]}]);
        apply(PatchType::Json, &mut fresh, &first, &info).expect("null tests an absent path");
        assert_eq!(fresh, json!({"metadata": {"finalizers": ["a"]}}));
        let mut object = json!({"metadata": {"finalizers": ["a"]}});
        let patch = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["b"]}
        ]);
        let error = apply(PatchType::Json, &mut object, &patch, &info).expect_err("test fails");
        assert_eq!(error.code(), 422);
        assert_eq!(object["metadata"]["finalizers"], json!(["a"]), "nothing applied");
        let ok = json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "a"},
                        {"op": "remove", "path": "/metadata/finalizers/0"}]);
        apply(PatchType::Json, &mut object, &ok, &info).expect("applies");
        assert_eq!(object["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn strategic_merge_on_a_custom_resource_is_415() {
        let mut registry = Registry::builtin();
        registry.register_crd(
            &json!({"metadata": {"name": "xs.example.com"}, "spec": {"group": "example.com",
            "scope": "Namespaced", "names": {"plural": "xs", "kind": "X"},
            "versions": [{"name": "v1", "served": true, "storage": true}]}}),
        );
        let info = registry.find("example.com", "v1", "xs").expect("registered");
        let error = apply(PatchType::Strategic, &mut json!({}), &json!({}), &info).expect_err("refused");
        assert_eq!(error.code(), 415);
        assert_eq!(
            PatchType::from_content_type(Some("text/plain")).map_err(|e| e.code()),
            Err(415)
        );
        assert_eq!(
            PatchType::from_content_type(Some("application/apply-patch+yaml")),
            Ok(PatchType::Apply)
        );
    }

    #[test]
    fn bodies_may_be_yaml() {
        assert_eq!(
            parse_body(b"a: 1\nb: [x]\n").expect("yaml"),
            json!({"a": 1, "b": ["x"]})
        );
        assert_eq!(parse_body(br#"{"a":1}"#).expect("json"), json!({"a": 1}));
        assert_eq!(parse_body(b"{").map_err(|e| e.code()), Err(400));
    }

    #[test]
    fn yaml_aliases_cannot_expand_a_small_body_into_a_huge_one() {
        // "Billion laughs": nine levels of nine aliases, a few hundred bytes that expand to 9^9 strings.
        let mut yaml = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
        for level in 1..10 {
            let previous = format!("*a{}", level - 1);
            let list = [previous.as_str(); 9].join(", ");
            yaml.push_str(&format!("a{level}: &a{level} [{list}]\n"));
        }
        let error = parse_body(yaml.as_bytes()).expect_err("refused");
        assert_eq!(error.code(), 400);
        // A deep document is refused too (past 128 levels, as JSON or as YAML), not walked into a stack
        // overflow.
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse_body(nested(100).as_bytes()).is_ok());
        for depth in [200, 100_000] {
            assert_eq!(
                parse_body(nested(depth).as_bytes()).map_err(|e| e.code()),
                Err(400)
            );
        }
    }
}
