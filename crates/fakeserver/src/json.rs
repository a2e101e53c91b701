//! Reading fields of a stored object the lenient way the server's own bookkeeping needs: every reader takes
//! a JSON pointer (`/spec/names/plural`), and a field that is missing or of another type reads as empty.
//! Validation decides what is malformed; these readers never refuse. Imports nothing of the crate.

use serde_json::{Map, Value};

/// The string at `pointer`, or `""`.
pub(crate) fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// The elements of the array at `pointer`: none where there is no array.
pub(crate) fn items<'v>(value: &'v Value, pointer: &str) -> std::slice::Iter<'v, Value> {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(|items| items.iter())
        .unwrap_or_default()
}

/// The elements of `array` that are objects, for filling in or changing in place: none where `array` is
/// missing or not an array.
pub(crate) fn objects_mut(array: Option<&mut Value>) -> impl Iterator<Item = &mut Map<String, Value>> {
    array
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// The strings in the array at `pointer`, skipping elements that are not strings.
pub(crate) fn strings(value: &Value, pointer: &str) -> Vec<String> {
    items(value, pointer)
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// The entries of the object at `pointer` (labels, annotations) in key order, a value that is not a
/// string reading as `""`.
pub(crate) fn string_entries(value: &Value, pointer: &str) -> Vec<(String, String)> {
    value
        .pointer(pointer)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.as_str().unwrap_or_default().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn missing_or_mistyped_fields_read_as_empty() {
        let object = json!({"metadata": {"name": 7, "labels": {"a": "x", "b": 1}, "finalizers": ["f", 2]}});
        assert_eq!(text(&object, "/metadata/name"), "");
        assert_eq!(text(&object, "/metadata/labels/a"), "x");
        assert_eq!(items(&object, "/metadata/labels").count(), 0);
        assert_eq!(strings(&object, "/metadata/finalizers"), ["f"]);
        assert_eq!(strings(&object, "/spec/nothing"), Vec::<String>::new());
        assert_eq!(
            string_entries(&object, "/metadata/labels"),
            [("a".to_owned(), "x".to_owned()), ("b".to_owned(), String::new())]
        );
        assert!(string_entries(&object, "/metadata/annotations").is_empty());
        let mut list = json!([{"a": 1}, "b", {"c": 2}]);
        assert_eq!(objects_mut(Some(&mut list)).count(), 2);
        assert_eq!(objects_mut(None).count(), 0);
    }
}
