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
        Value::Object(map) if !map.is_empty() && !shape.applied_whole() => {
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
                    if let Value::Object(fields) = item
                        && !shape.items().applied_whole()
                    {
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

/// What a non-apply write changed, as [`changes`] finds it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Paths of the new object whose value differs from the old one's (or that the old one lacks).
    pub(crate) changed: FieldSet,
    /// Paths of the old object that the new one lacks.
    pub(crate) removed: FieldSet,
}

/// The fields a write from `old` to `new` changed and removed: exactly what comparing
/// `FieldSet::of(new)` with `FieldSet::of(old)` path by path gives, found by walking both objects together
/// and passing over equal subtrees, so a write costs what it changed rather than the object's size (a Node
/// with hundreds of labels, a pod status patch that moves one container on).
pub(crate) fn changes(new: &Value, old: &Value, shape: Shape<'_>) -> Changes {
    let mut out = Changes::default();
    let mut path = Vec::new();
    diff(Some(new), Some(old), shape, &mut path, &mut out);
    out
}

fn diff<'a>(
    new: Option<&'a Value>,
    old: Option<&'a Value>,
    shape: Shape<'a>,
    path: &mut Path,
    out: &mut Changes,
) {
    match (new, old) {
        (Some(new), Some(old)) if new == old => {}
        (Some(Value::Object(new)), Some(Value::Object(old)))
            if !new.is_empty() && !old.is_empty() && !shape.applied_whole() =>
        {
            for (key, child) in new {
                path.push(format!("f:{key}"));
                diff(Some(child), old.get(key), shape.field(key), path, out);
                path.pop();
            }
            for (key, child) in old.iter().filter(|(key, _)| !new.contains_key(*key)) {
                path.push(format!("f:{key}"));
                diff(None, Some(child), shape.field(key), path, out);
                path.pop();
            }
        }
        (Some(Value::Array(new_items)), Some(Value::Array(old_items)))
            if matches!(shape.list_type(), ListType::Map(_) | ListType::SchemaMap(_)) =>
        {
            let keys = shape
                .list_type()
                .keys()
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let (Some(new_elements), Some(old_elements)) =
                (own_elements(new_items, &keys), own_elements(old_items, &keys))
            else {
                // Items that share a key: compare path by path, as the sets do.
                compare(new, old, shape, path, out);
                return;
            };
            // The old item a new one is compared with is the one `lookup` finds for its element; when that
            // is an item with another element (key fields a new item leaves out), compare path by path.
            let mut before = Vec::with_capacity(new_items.len());
            for element in &new_elements {
                let index = index_of(old_items, element);
                if index.is_some_and(|i| old_elements.get(i) != Some(element)) {
                    compare(new, old, shape, path, out);
                    return;
                }
                before.push(index.and_then(|i| old_items.get(i)));
            }
            for ((item, element), before) in new_items.iter().zip(&new_elements).zip(before) {
                path.push(element.clone());
                keyed_item(item, before, shape, path, out);
                path.pop();
            }
            for (item, element) in old_items.iter().zip(&old_elements) {
                if !new_elements.contains(element) {
                    path.push(element.clone());
                    keyed_item_removed(item, shape, path, out);
                    path.pop();
                }
            }
        }
        _ => compare(new, old, shape, path, out),
    }
}

/// A keyed list's items' elements, when each item is the first its element names (as `lookup` finds
/// items); `None` when two items answer to one element.
fn own_elements(items: &[Value], keys: &[&str]) -> Option<Vec<Element>> {
    let elements: Vec<Element> = items.iter().map(|item| key_element(item, keys)).collect();
    for (index, element) in elements.iter().enumerate() {
        if index_of(items, element) != Some(index) {
            return None;
        }
    }
    Some(elements)
}

/// The maps a non-apply write created, owned themselves beside their fields (`.` in `fieldsV1`), as
/// kube-apiserver records an update: it compares the new object with the old one, or with an empty object
/// of the kind on create, and owns every node that was absent there. An empty built-in object already
/// holds its non-pointer structs (`spec`, `template`), so only its free-form maps ([`CREATED_MAPS`]) count;
/// an empty custom resource holds nothing, so every map of one counts. Lists are not entered.
pub(crate) fn created_maps(new: &Value, old: Option<&Value>, shape: Shape<'_>) -> FieldSet {
    let mut out = FieldSet::default();
    let mut path = Vec::new();
    walk_created(new, old, shape, &mut path, &mut out.0);
    out
}

/// The free-form maps of built-in kinds, absent from an empty object (Go's `omitempty` maps).
const CREATED_MAPS: [&str; 10] = [
    "labels",
    "annotations",
    "data",
    "binaryData",
    "stringData",
    "nodeSelector",
    "limits",
    "requests",
    "capacity",
    "allocatable",
];

fn walk_created(
    new: &Value,
    old: Option<&Value>,
    shape: Shape<'_>,
    path: &mut Path,
    out: &mut BTreeSet<Path>,
) {
    let Value::Object(fields) = new else { return };
    if fields.is_empty() || shape.applied_whole() || old == Some(new) {
        return;
    }
    let old_fields = old.and_then(Value::as_object);
    if !path.is_empty() && old_fields.is_none() {
        let counts = match shape {
            Shape::Builtin { field, .. } => CREATED_MAPS.contains(&field),
            Shape::Schema { .. } | Shape::Free => true,
        };
        if counts {
            out.insert(path.clone());
        }
    }
    for (key, child) in fields {
        path.push(format!("f:{key}"));
        walk_created(
            child,
            old_fields.and_then(|o| o.get(key)),
            shape.field(key),
            path,
            out,
        );
        path.pop();
    }
}

/// A keyed item of the new object (at `path`), against the old object's item of the same key, if any.
fn keyed_item<'a>(
    item: &'a Value,
    before: Option<&'a Value>,
    shape: Shape<'a>,
    path: &mut Path,
    out: &mut Changes,
) {
    if before == Some(item) {
        return;
    }
    // The item itself is a path of both sets.
    let differs = match item {
        Value::Object(map) if !map.is_empty() => before.is_none(),
        _ => !same_values(before, Some(item)),
    };
    if differs {
        out.changed.insert(path.clone());
    }
    let empty = Map::new();
    let fields = item.as_object().unwrap_or(&empty);
    let old_fields = before.and_then(Value::as_object);
    for (key, child) in fields {
        path.push(format!("f:{key}"));
        // A field of an item that was no object in the old list has no old value.
        diff(
            Some(child),
            old_fields.and_then(|o| o.get(key)),
            shape.items().field(key),
            path,
            out,
        );
        path.pop();
    }
    if let Some(old_fields) = old_fields {
        for (key, child) in old_fields.iter().filter(|(key, _)| !fields.contains_key(*key)) {
            path.push(format!("f:{key}"));
            diff(None, Some(child), shape.items().field(key), path, out);
            path.pop();
        }
    }
}

/// A keyed item only the old object has: it and every path under it are removed.
fn keyed_item_removed(item: &Value, shape: Shape<'_>, path: &mut Path, out: &mut Changes) {
    out.removed.insert(path.clone());
    if let Value::Object(fields) = item {
        for (key, child) in fields {
            path.push(format!("f:{key}"));
            let mut under = BTreeSet::new();
            collect(child, shape.items().field(key), path, &mut under);
            out.removed.0.extend(under);
            path.pop();
        }
    }
}

/// The general comparison, for one subtree at `path`: every path of the new subtree whose value differs
/// from the old subtree's, and the old subtree's paths the new one lacks.
fn compare(new: Option<&Value>, old: Option<&Value>, shape: Shape<'_>, path: &mut Path, out: &mut Changes) {
    let depth = path.len();
    let mut new_paths = BTreeSet::new();
    if let Some(new) = new {
        collect(new, shape, path, &mut new_paths);
    }
    let mut old_paths = BTreeSet::new();
    if let Some(old) = old {
        collect(old, shape, path, &mut old_paths);
    }
    for full in &new_paths {
        let relative = full.get(depth..).unwrap_or_default();
        let now = new.and_then(|new| lookup(new, relative));
        let before = old.and_then(|old| lookup(old, relative));
        let differs = match now {
            Some(Value::Object(map)) if !map.is_empty() => before.is_none(),
            _ => !same_values(before, now),
        };
        if differs {
            out.changed.0.insert(full.clone());
        }
    }
    out.removed
        .0
        .extend(old_paths.into_iter().filter(|p| !new_paths.contains(p)));
}

/// Whether two field values are the same as the API server compares them: numbers by value, so `1` and
/// `1.0` (a YAML file's float against a typed client's integer) are one value, as Go's decoding makes them.
pub(crate) fn same_values(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same_value(a, b),
        (a, b) => a == b,
    }
}

pub(crate) fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| same_value(x, y)))
        }
        _ => a == b,
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
            "metadata": {
                "labels": {"app": "a"},
                "finalizers": ["x"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"}]
            },
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
                "f:metadata": {
                    "f:labels": {"f:app": {}},
                    "f:finalizers": {".": {}, "v:\"x\"": {}},
                    // An owner reference is atomic: its item owns it whole, as kube-apiserver records it.
                    "f:ownerReferences": {"k:{\"uid\":\"u\"}": {}}
                },
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

    /// `changes` as the sets define it: every path of the new object compared with a lookup in the old.
    fn changes_path_by_path(new: &Value, old: &Value, shape: Shape<'_>) -> Changes {
        let new_set = FieldSet::of(new, shape);
        let old_set = FieldSet::of(old, shape);
        let mut changed = FieldSet::default();
        for path in new_set.iter() {
            let now = lookup(new, path);
            let before = lookup(old, path);
            let differs = match now {
                Some(Value::Object(map)) if !map.is_empty() => before.is_none(),
                _ => !same_values(before, now),
            };
            if differs {
                changed.insert(path.clone());
            }
        }
        Changes {
            changed,
            removed: old_set.difference(&new_set),
        }
    }

    #[test]
    fn changes_are_what_comparing_every_path_gives() {
        let pod = |ready: &str, extra: Value| {
            json!({
                "metadata": {"labels": {"app": "a", "tier": ready}, "finalizers": ["x"]},
                "spec": {"containers": [
                    {"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                     "env": [{"name": "A", "value": "1"}]},
                    {"name": "d", "image": "j"}
                ]},
                "status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": ready}, {"type": "Initialized", "status": "True"}],
                    "containerStatuses": [{"name": "c", "ready": ready == "True", "restartCount": 0}],
                    "extra": extra
                }
            })
        };
        let base = pod("False", json!({"a": 1}));
        let variants = [
            pod("True", json!({"a": 1})),
            pod("False", json!({"a": 1.0})),
            pod("False", json!({})),
            pod("False", json!([1, 2])),
            pod("False", json!("text")),
            pod("False", Value::Null),
            json!({"metadata": {}, "spec": {}}),
            json!({}),
            // Containers reordered, one gone, one new; a finalizer added.
            json!({"metadata": {"labels": {"app": "a"}, "finalizers": ["x", "y"]},
                   "spec": {"containers": [{"name": "e", "image": "k"}, {"name": "c", "image": "i2"}]}}),
            // Two items with one key, and an item naming only part of a compound key.
            json!({"spec": {"containers": [
                {"name": "c", "image": "i", "ports": [{"containerPort": 80}]},
                {"name": "c", "image": "other"}]}}),
            // Keyed items that are not objects, and a keyed list that became a map.
            json!({"spec": {"containers": ["c", 3]}, "status": {"conditions": {"type": "Ready"}}}),
        ];
        let shape = Shape::builtin("Pod");
        for (index, variant) in variants.iter().enumerate() {
            for (new, old) in [(variant, &base), (&base, variant), (variant, variant)] {
                assert_eq!(
                    changes(new, old, shape),
                    changes_path_by_path(new, old, shape),
                    "variant {index}: {new} from {old}"
                );
            }
        }
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
