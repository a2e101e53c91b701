//! Sets of field paths, as server-side apply records them in `metadata.managedFields[].fieldsV1`.
//!
//! A path is a list of elements in the `fieldsV1` spelling: `f:name` (a map field), `k:{"name":"c"}` (a keyed
//! list item), `v:"x"` (a set member) and `i:3` (an index). A set holds the paths a manager owns: leaves, and
//! keyed items or sets themselves (written with a `"."` member in `fieldsV1`).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::shape::{ListType, Shape};

/// One step into an object, spelled as in `fieldsV1`.
pub(crate) type Element = String;

/// A path from the object's root.
pub(crate) type Path = Vec<Element>;

/// The set of field paths one manager owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    /// The fields set in `object` (whose root has the given shape).
    pub(crate) fn of(object: &Value, shape: Shape<'_>) -> Self {
        let mut set = Self::default();
        let mut path = Vec::new();
        collect(object, shape, &mut path, &mut set.0);
        set
    }

    /// Reads a `fieldsV1` object.
    pub(crate) fn from_fields_v1(fields: &Value) -> Self {
        let mut set = Self::default();
        let mut path = Vec::new();
        read(fields, &mut path, &mut set.0);
        set
    }

    /// Writes the `fieldsV1` object.
    pub(crate) fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        for path in &self.0 {
            let mut node = &mut root;
            for element in path {
                node = node
                    .entry(element.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
                    .as_object_mut()
                    .expect("fieldsV1 nodes are objects");
            }
        }
        // A path that has owned descendants is itself owned only when it appears in the set: mark it with ".".
        for path in &self.0 {
            let mut node = &mut root;
            for element in path {
                node = node
                    .get_mut(element)
                    .and_then(Value::as_object_mut)
                    .expect("inserted above");
            }
            if !node.is_empty() && !node.contains_key(".") {
                node.insert(".".into(), Value::Object(Map::new()));
            }
        }
        Value::Object(root)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn contains(&self, path: &[Element]) -> bool {
        self.0.contains(path)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter()
    }

    pub(crate) fn insert(&mut self, path: Path) {
        self.0.insert(path);
    }

    /// Whether this set owns `path` or anything under it.
    pub(crate) fn owns_within(&self, path: &[Element]) -> bool {
        self.0
            .range(path.to_vec()..)
            .next()
            .is_some_and(|p| p.starts_with(path))
    }

    /// Whether this set owns anything strictly under `path`.
    pub(crate) fn has_descendants(&self, path: &[Element]) -> bool {
        self.0
            .range(path.to_vec()..)
            .find(|p| p.len() > path.len() || !p.starts_with(path))
            .is_some_and(|p| p.starts_with(path))
    }

    /// Removes `path` and everything under it.
    pub(crate) fn remove_within(&mut self, path: &[Element]) {
        let doomed: Vec<Path> = self
            .0
            .range(path.to_vec()..)
            .take_while(|p| p.starts_with(path))
            .cloned()
            .collect();
        for path in doomed {
            self.0.remove(&path);
        }
    }

    /// The paths in `self` but not in `other`.
    pub(crate) fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }

    /// The paths in both.
    pub(crate) fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }
}

fn collect(value: &Value, shape: Shape<'_>, path: &mut Path, out: &mut BTreeSet<Path>) {
    match value {
        Value::Object(map) if !map.is_empty() && !shape.atomic_map() => {
            for (key, child) in map {
                path.push(format!("f:{key}"));
                collect(child, shape.field(key), path, out);
                path.pop();
            }
        }
        Value::Array(items) => match shape.list_type() {
            ListType::Atomic => {
                out.insert(path.clone());
            }
            ListType::Set => {
                out.insert(path.clone());
                for item in items {
                    path.push(format!("v:{item}"));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            list @ (ListType::Map(_) | ListType::SchemaMap(_)) => {
                let keys = list.keys();
                for item in items {
                    path.push(key_element(item, &keys));
                    out.insert(path.clone());
                    if let Value::Object(fields) = item {
                        for (key, child) in fields {
                            path.push(format!("f:{key}"));
                            collect(child, shape.items().field(key), path, out);
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
        },
        _ => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
    }
}

/// The `k:{...}` element naming a keyed list item: its key fields, sorted, as compact JSON.
pub(crate) fn key_element(item: &Value, keys: &[&str]) -> Element {
    let mut identity = Map::new();
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    for key in sorted {
        if let Some(value) = item.get(key) {
            identity.insert(key.to_owned(), value.clone());
        }
    }
    format!("k:{}", Value::Object(identity))
}

fn read(node: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = node.as_object() else { return };
    if !path.is_empty() && (map.is_empty() || map.contains_key(".")) {
        out.insert(path.clone());
    }
    for (key, child) in map {
        if key == "." {
            continue;
        }
        path.push(key.clone());
        read(child, path, out);
        path.pop();
    }
}

/// Whether a list item is the one a path element names.
fn item_matches(item: &Value, element: &str) -> bool {
    if let Some(identity) = element.strip_prefix("k:") {
        let Ok(Value::Object(identity)) = serde_json::from_str::<Value>(identity) else {
            return false;
        };
        identity.iter().all(|(key, value)| item.get(key) == Some(value))
    } else if let Some(member) = element.strip_prefix("v:") {
        serde_json::from_str::<Value>(member).is_ok_and(|member| *item == member)
    } else {
        false
    }
}

fn index_of(items: &[Value], element: &str) -> Option<usize> {
    if let Some(index) = element.strip_prefix("i:") {
        return index.parse().ok().filter(|i| *i < items.len());
    }
    items.iter().position(|item| item_matches(item, element))
}

/// The value at `path`, if present.
pub(crate) fn lookup<'v>(object: &'v Value, path: &[Element]) -> Option<&'v Value> {
    let mut node = object;
    for element in path {
        node = match (node, element.strip_prefix("f:")) {
            (Value::Object(map), Some(key)) => map.get(key)?,
            (Value::Array(items), None) => &items[index_of(items, element)?],
            _ => return None,
        };
    }
    Some(node)
}

/// Removes the value at `path`; returns whether something was removed.
pub(crate) fn remove(object: &mut Value, path: &[Element]) -> bool {
    let Some((last, parent_path)) = path.split_last() else {
        return false;
    };
    let mut node = object;
    for element in parent_path {
        node = match (node, element.strip_prefix("f:")) {
            (Value::Object(map), Some(key)) => match map.get_mut(key) {
                Some(child) => child,
                None => return false,
            },
            (Value::Array(items), None) => match index_of(items, element) {
                Some(index) => &mut items[index],
                None => return false,
            },
            _ => return false,
        };
    }
    match (node, last.strip_prefix("f:")) {
        (Value::Object(map), Some(key)) => map.remove(key).is_some(),
        (Value::Array(items), None) => match index_of(items, last) {
            Some(index) => {
                items.remove(index);
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// Prints a path as the API server does in apply conflicts: `.spec.containers[name="c"].image`.
pub(crate) fn display(path: &[Element]) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(field) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(identity) = element.strip_prefix("k:") {
            let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(identity)
                .map(|identity| identity.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(member) = element.strip_prefix("v:") {
            out.push_str(&format!("[={member}]"));
        } else if let Some(index) = element.strip_prefix("i:") {
            out.push_str(&format!("[{index}]"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({
            "metadata": {"labels": {"app": "a"}, "finalizers": ["x"]},
            "spec": {
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "c", "image": "i", "args": ["a"]}]}}
            }
        })
    }

    #[test]
    fn an_object_owns_its_leaves_keyed_items_and_sets() {
        let set = FieldSet::of(&deployment(), Shape::builtin("Deployment"));
        let fields = set.to_fields_v1();
        assert_eq!(
            fields,
            json!({
                "f:metadata": {"f:labels": {"f:app": {}}, "f:finalizers": {".": {}, "v:\"x\"": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {
                        ".": {}, "f:name": {}, "f:image": {}, "f:args": {}
                    }}}}
                }
            })
        );
        assert_eq!(FieldSet::from_fields_v1(&fields), set);
    }

    #[test]
    fn paths_find_and_remove_values() {
        let mut object = deployment();
        let image: Path = [
            "f:spec",
            "f:template",
            "f:spec",
            "f:containers",
            "k:{\"name\":\"c\"}",
            "f:image",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(lookup(&object, &image), Some(&json!("i")));
        assert_eq!(
            display(&image),
            r#".spec.template.spec.containers[name="c"].image"#
        );
        assert!(remove(&mut object, &image));
        assert_eq!(lookup(&object, &image), None);
        let finalizer: Path = ["f:metadata", "f:finalizers", "v:\"x\""]
            .map(str::to_owned)
            .to_vec();
        assert!(remove(&mut object, &finalizer));
        assert_eq!(object["metadata"]["finalizers"], json!([]));
    }

    #[test]
    fn ownership_within_a_subtree() {
        let set = FieldSet::of(&deployment(), Shape::builtin("Deployment"));
        assert!(set.owns_within(&["f:spec".to_owned()]));
        assert!(!set.owns_within(&["f:status".to_owned()]));
        let mut trimmed = set;
        trimmed.remove_within(&["f:spec".to_owned()]);
        assert!(!trimmed.owns_within(&["f:spec".to_owned()]));
        assert!(trimmed.owns_within(&["f:metadata".to_owned()]));
    }
}
