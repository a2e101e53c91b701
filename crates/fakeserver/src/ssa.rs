//! Server-side apply, and the `metadata.managedFields` bookkeeping every write does.
//!
//! Each manager (the `fieldManager` parameter, else the client's user agent) owns a set of field paths per
//! operation (`Apply` or `Update`) and subresource. An apply:
//! 1. fails with conflicts where the applied value differs from a value another manager owns, unless forced
//!    (then ownership moves to the applier);
//! 2. removes the fields this manager applied before and no longer applies, unless someone else owns them;
//! 3. merges the applied configuration in (keyed lists item by item, atomic lists whole);
//! 4. records exactly the applied fields as the manager's `Apply` set.
//!
//! Other writes take ownership of the fields whose values they change, as `Update` entries.

use serde_json::{Map, Value, json};

use crate::fieldset::{self, Element, FieldSet, Path, same_values};
use crate::json;
use crate::shape::{ListType, Shape};

/// How a manager wrote its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write.
    Update,
}

/// Which part of an object a write may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The main resource; `status` is excluded when the resource has a status subresource.
    Main { status_subresource: bool },
    /// The `/status` subresource: only `status`.
    Status,
}

impl Scope {
    fn subresource(self) -> &'static str {
        match self {
            Scope::Main { .. } => "",
            Scope::Status => "status",
        }
    }
}

/// One entry of `metadata.managedFields`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ManagedEntry {
    pub(crate) manager: String,
    pub(crate) operation: Operation,
    pub(crate) api_version: String,
    pub(crate) time: String,
    pub(crate) subresource: String,
    pub(crate) fields: FieldSet,
}

impl ManagedEntry {
    fn is(&self, manager: &str, operation: Operation, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    fn to_json(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager,
            "operation": match self.operation { Operation::Apply => "Apply", Operation::Update => "Update" },
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_fields_v1(),
        });
        if !self.subresource.is_empty() {
            entry["subresource"] = Value::from(self.subresource.as_str());
        }
        entry
    }
}

/// Reads `metadata.managedFields`.
pub(crate) fn read_entries(object: &Value) -> Vec<ManagedEntry> {
    json::items(object, "/metadata/managedFields")
        .filter_map(read_entry)
        .collect()
}

/// Reads one entry of `metadata.managedFields`; `None` for an operation that is neither `Apply` nor `Update`.
fn read_entry(entry: &Value) -> Option<ManagedEntry> {
    let text = |pointer: &str| json::text(entry, pointer).to_owned();
    let operation = match entry.get("operation").and_then(Value::as_str) {
        Some("Apply") => Operation::Apply,
        Some("Update") => Operation::Update,
        _ => return None,
    };
    Some(ManagedEntry {
        manager: text("/manager"),
        operation,
        api_version: text("/apiVersion"),
        time: text("/time"),
        subresource: text("/subresource"),
        fields: entry
            .get("fieldsV1")
            .map(FieldSet::from_fields_v1)
            .unwrap_or_default(),
    })
}

/// Writes `metadata.managedFields`, dropping entries that own nothing.
pub(crate) fn write_entries(object: &mut Value, entries: &[ManagedEntry]) {
    let entries: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(ManagedEntry::to_json)
        .collect();
    set_managed_fields(object, entries);
}

/// Stores `entries` as `metadata.managedFields`, or removes the field where there are none.
fn set_managed_fields(object: &mut Value, entries: Vec<Value>) {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

/// The part of an object that field ownership covers in this scope.
pub(crate) fn scoped(object: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    let Some(map) = object.as_object() else {
        return Value::Object(out);
    };
    for (key, value) in map {
        let keep = match (key.as_str(), scope) {
            ("apiVersion" | "kind", _) => false,
            ("metadata", Scope::Main { .. }) => {
                let tracked: Map<String, Value> = value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| {
                        matches!(
                            k.as_str(),
                            "labels" | "annotations" | "finalizers" | "ownerReferences"
                        )
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !tracked.is_empty() {
                    out.insert(key.clone(), Value::Object(tracked));
                }
                false
            }
            ("status", Scope::Main { status_subresource }) => !status_subresource,
            ("status", Scope::Status) => true,
            (_, Scope::Status) => false,
            (_, Scope::Main { .. }) => key != "metadata",
        };
        if keep {
            out.insert(key.clone(), value.clone());
        }
    }
    Value::Object(out)
}

/// Who is applying, and how.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Applier<'a> {
    pub(crate) manager: &'a str,
    pub(crate) force: bool,
    pub(crate) scope: Scope,
    pub(crate) shape: Shape<'a>,
    pub(crate) api_version: &'a str,
    pub(crate) now: &'a str,
}

/// A field another manager owns with a different value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub(crate) manager: String,
    pub(crate) operation: Operation,
    pub(crate) api_version: String,
    pub(crate) path: Path,
}

impl Conflict {
    /// The manager as kube-apiserver names it in a conflict: `"name"` for an applier, `"name" using v1` for
    /// an updater.
    pub(crate) fn who(&self) -> String {
        match self.operation {
            Operation::Apply => format!("{:?}", self.manager),
            Operation::Update => format!("{:?} using {}", self.manager, self.api_version),
        }
    }
}

/// Applies `config` onto `live` (the stored object, or a skeleton when creating); returns the new object with
/// its managed fields, or the conflicts.
pub(crate) fn apply(live: &Value, config: &Value, applier: &Applier<'_>) -> Result<Value, Vec<Conflict>> {
    let subresource = applier.scope.subresource();
    let mut entries = read_entries(live);
    let config = scoped(config, applier.scope);
    let applied = FieldSet::of(&config, applier.shape);
    let is_own = |e: &ManagedEntry| e.is(applier.manager, Operation::Apply, subresource);

    let mut conflicts = Vec::new();
    for entry in entries.iter().filter(|e| !is_own(e)) {
        for path in applied.iter().filter(|p| entry.fields.contains(p)) {
            let wanted = fieldset::lookup(&config, path);
            let leaf = wanted.is_some_and(is_leaf) && !applied.has_descendants(path);
            if leaf && !same_values(fieldset::lookup(live, path), wanted) {
                conflicts.push(Conflict {
                    manager: entry.manager.clone(),
                    operation: entry.operation,
                    api_version: entry.api_version.clone(),
                    path: path.clone(),
                });
            }
        }
    }
    if !conflicts.is_empty() {
        if !applier.force {
            return Err(conflicts);
        }
        for conflict in &conflicts {
            for entry in entries.iter_mut().filter(|e| !is_own(e)) {
                entry.fields.remove_within(&conflict.path);
            }
        }
    }

    let previous = entries
        .iter()
        .find(|e| is_own(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut result = live.clone();
    let dropped = previous.difference(&applied);
    let others: Vec<&FieldSet> = entries.iter().filter(|e| !is_own(e)).map(|e| &e.fields).collect();
    for path in dropped.iter() {
        if others.iter().any(|set| set.owns_within(path)) {
            continue;
        }
        if fieldset::remove(&mut result, path) {
            prune_empty_parents(&mut result, path, &applied, &others);
        }
    }
    merge(&mut result, &config, applier.shape);

    match entries.iter_mut().find(|e| is_own(e)) {
        Some(entry) => {
            if entry.fields != applied {
                entry.fields = applied;
                entry.time = applier.now.to_owned();
                applier.api_version.clone_into(&mut entry.api_version);
            }
        }
        None => entries.push(ManagedEntry {
            manager: applier.manager.to_owned(),
            operation: Operation::Apply,
            api_version: applier.api_version.to_owned(),
            time: applier.now.to_owned(),
            subresource: subresource.to_owned(),
            fields: applied,
        }),
    }
    write_entries(&mut result, &entries);
    Ok(result)
}

/// Whether an applied value is compared as a whole for conflicts (not a map or keyed item walked into).
fn is_leaf(value: &Value) -> bool {
    value.as_object().is_none_or(Map::is_empty)
}

fn prune_empty_parents(object: &mut Value, removed: &[Element], applied: &FieldSet, others: &[&FieldSet]) {
    let mut path = removed.to_vec();
    while path.len() > 1 {
        path.pop();
        let empty = match fieldset::lookup(object, &path) {
            Some(Value::Object(map)) => map.is_empty(),
            Some(Value::Array(items)) => items.is_empty(),
            _ => false,
        };
        let owned = applied.owns_within(&path) || others.iter().any(|set| set.owns_within(&path));
        if !empty || owned || !path.last().is_some_and(|e| e.starts_with("f:")) {
            return;
        }
        fieldset::remove(object, &path);
    }
}

/// Merges an applied configuration into an object, list by list as the shape says.
fn merge(target: &mut Value, config: &Value, shape: Shape<'_>) {
    match (target, config) {
        (Value::Object(target), Value::Object(config)) if !shape.applied_whole() => {
            for (key, value) in config {
                if value.is_null() {
                    target.remove(key);
                    continue;
                }
                match target.get_mut(key) {
                    Some(existing) => merge(existing, value, shape.field(key)),
                    None => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(target), Value::Array(config)) => match shape.list_type() {
            ListType::Atomic => target.clone_from(config),
            ListType::Set => {
                for value in config {
                    if !target.contains(value) {
                        target.push(value.clone());
                    }
                }
            }
            list @ (ListType::Map(_) | ListType::SchemaMap(_)) => {
                let keys = list.keys();
                for item in config {
                    let element = fieldset::key_element(item, &keys);
                    match target
                        .iter_mut()
                        .find(|t| fieldset::key_element(t, &keys) == element)
                    {
                        Some(existing) => merge(existing, item, shape.items()),
                        None => target.push(item.clone()),
                    }
                }
            }
        },
        (target, config) => *target = config.clone(),
    }
}

/// Who made a non-apply write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Updater<'a> {
    pub(crate) manager: &'a str,
    pub(crate) scope: Scope,
    pub(crate) shape: Shape<'a>,
    pub(crate) api_version: &'a str,
    pub(crate) now: &'a str,
}

/// Records a create or update in `new`'s managed fields: the updater takes the fields whose values it changed.
///
/// A request that sends managed fields different from the stored ones replaces them (a single empty entry
/// clears them), as the API server allows.
pub(crate) fn record_update(old: Option<&Value>, new: &mut Value, updater: &Updater<'_>) {
    const POINTER: &str = "/metadata/managedFields";
    let stored = old.and_then(|o| o.pointer(POINTER));
    // Whether `new` carries the stored entries as they are (a patch or status write starts from the stored
    // object): then they are moved out of it rather than copied.
    let same = new
        .pointer(POINTER)
        .is_some_and(|entries| entries.is_array() && Some(entries) == stored);
    // `Some(cleared)` when the request sent managed fields of its own (a single empty entry clears them).
    let sent = match new.pointer(POINTER) {
        Some(Value::Array(entries)) if !same => {
            Some(entries.len() == 1 && entries[0].as_object().is_some_and(Map::is_empty))
        }
        _ => None,
    };
    let subresource = updater.scope.subresource();
    let new_scoped = scoped(new, updater.scope);
    let old_scoped = old
        .map(|o| scoped(o, updater.scope))
        .unwrap_or_else(|| Value::Object(Map::new()));
    let fieldset::Changes { changed, removed } = fieldset::changes(&new_scoped, &old_scoped, updater.shape);
    // The maps the write created are owned themselves; those it removed are owned by nobody any more.
    let changed = changed.union(&fieldset::created_maps(
        &new_scoped,
        Some(&old_scoped),
        updater.shape,
    ));
    let removed = removed.union(&fieldset::created_maps(
        &old_scoped,
        Some(&new_scoped),
        updater.shape,
    ));
    let unchanged = changed.is_empty() && removed.is_empty() && old.is_some();
    if unchanged && sent.is_none() {
        // The stored entries stay as they are: they were written by `write_entries`, so reading and writing
        // them again would give them back unchanged.
        if !same && let Some(metadata) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            match stored {
                Some(stored) => metadata.insert("managedFields".into(), stored.clone()),
                None => metadata.remove("managedFields"),
            };
        }
        return;
    }
    let own = |entry: &ManagedEntry| entry.is(updater.manager, Operation::Update, subresource);
    let mut entries: Vec<Entry> = match (sent, old) {
        (Some(true), _) => Vec::new(),
        (Some(false), _) => read_entries(new).into_iter().map(Entry::Read).collect(),
        // Stored entries that own none of what changed stay as they are, unread: on a Node with hundreds
        // of labels or a pod with a long spec, reading and writing every entry would cost more than the rest
        // of the write.
        (None, Some(_)) => {
            // The place the entries are taken from is left `null`, and written again below.
            let raws = match new.pointer_mut(POINTER).filter(|_| same).map(Value::take) {
                Some(Value::Array(raws)) => raws,
                _ => stored.and_then(Value::as_array).cloned().unwrap_or_default(),
            };
            raws.into_iter()
                .filter_map(|raw| {
                    let touched = raw_is(&raw, updater.manager, "Update", subresource)
                        || removed
                            .iter()
                            .chain(changed.iter())
                            .any(|path| reaches(raw.get("fieldsV1"), path));
                    if touched {
                        read_entry(&raw).map(Entry::Read)
                    } else {
                        raw_is_valid(&raw).then_some(Entry::Kept(raw))
                    }
                })
                .collect()
        }
        (None, None) => Vec::new(),
    };
    if unchanged {
        write(new, entries);
        return;
    }
    for entry in entries.iter_mut().filter_map(Entry::read_mut) {
        for path in removed.iter() {
            entry.fields.remove_within(path);
        }
        if !own(entry) {
            for path in changed.iter() {
                if entry.fields.contains(path) {
                    entry.fields.remove_within(path);
                }
            }
        }
    }
    match entries
        .iter_mut()
        .filter_map(Entry::read_mut)
        .find(|entry| own(entry))
    {
        Some(entry) => {
            let fields = entry.fields.union(&changed);
            if fields != entry.fields {
                entry.fields = fields;
                entry.time = updater.now.to_owned();
                updater.api_version.clone_into(&mut entry.api_version);
            }
        }
        None => entries.push(Entry::Read(ManagedEntry {
            manager: updater.manager.to_owned(),
            operation: Operation::Update,
            api_version: updater.api_version.to_owned(),
            time: updater.now.to_owned(),
            subresource: subresource.to_owned(),
            fields: changed,
        })),
    }
    write(new, entries);
}

/// An entry of `metadata.managedFields` during an update: read, or kept as stored.
enum Entry {
    Read(ManagedEntry),
    /// A stored entry the update does not touch. Stored entries were written by [`write_entries`], so
    /// reading and writing this one again would give it back unchanged.
    Kept(Value),
}

impl Entry {
    fn read_mut(&mut self) -> Option<&mut ManagedEntry> {
        match self {
            Entry::Read(entry) => Some(entry),
            Entry::Kept(_) => None,
        }
    }
}

/// [`write_entries`] for entries some of which are kept as stored.
fn write(object: &mut Value, entries: Vec<Entry>) {
    let entries: Vec<Value> = entries
        .into_iter()
        .filter_map(|entry| match entry {
            Entry::Read(entry) => (!entry.fields.is_empty()).then(|| entry.to_json()),
            Entry::Kept(raw) => Some(raw),
        })
        .collect();
    set_managed_fields(object, entries);
}

/// Whether a stored entry is this manager's, for this operation and subresource.
fn raw_is(raw: &Value, manager: &str, operation: &str, subresource: &str) -> bool {
    let text = |key: &str| raw.get(key).and_then(Value::as_str).unwrap_or_default();
    text("manager") == manager && text("operation") == operation && text("subresource") == subresource
}

/// Whether [`read_entries`] would read a stored entry, and [`write_entries`] write it back.
fn raw_is_valid(raw: &Value) -> bool {
    matches!(
        raw.get("operation").and_then(Value::as_str),
        Some("Apply" | "Update")
    ) && raw
        .get("fieldsV1")
        .and_then(Value::as_object)
        .is_some_and(|fields| !fields.is_empty())
}

/// Whether a `fieldsV1` object has a node at `path`: only then does the entry own `path` or anything under it.
fn reaches(fields: Option<&Value>, path: &[Element]) -> bool {
    let mut node = fields;
    for element in path {
        node = node.and_then(|n| n.get(element));
    }
    node.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2025-01-01T00:00:00Z";

    fn applier(manager: &str, force: bool) -> Applier<'_> {
        Applier {
            manager,
            force,
            scope: Scope::Main {
                status_subresource: true,
            },
            shape: Shape::builtin("Deployment"),
            api_version: "apps/v1",
            now: NOW,
        }
    }

    fn managers(object: &Value) -> Vec<(String, Operation)> {
        read_entries(object)
            .into_iter()
            .map(|e| (e.manager, e.operation))
            .collect()
    }

    fn skeleton() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "default"}})
    }

    #[test]
    fn apply_creates_then_removes_what_it_no_longer_applies() {
        let first = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "c", "image": "i", "args": ["x"]}, {"name": "sidecar", "image": "s"}]}}}});
        let created = apply(&skeleton(), &first, &applier("op", false)).expect("no conflicts");
        assert_eq!(created["spec"]["replicas"], 2);
        assert_eq!(managers(&created), [("op".to_owned(), Operation::Apply)]);

        let second = json!({"metadata": {"labels": {"a": "1"}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i2"}]}}}});
        let updated = apply(&created, &second, &applier("op", false)).expect("no conflicts");
        assert_eq!(updated["metadata"]["labels"], json!({"a": "1"}));
        assert_eq!(updated["spec"].get("replicas"), None);
        assert_eq!(
            updated["spec"]["template"]["spec"]["containers"],
            json!([{"name": "c", "image": "i2"}])
        );

        let third = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i2"}]}}}});
        let trimmed = apply(&updated, &third, &applier("op", false)).expect("no conflicts");
        assert_eq!(
            trimmed["metadata"].get("labels"),
            None,
            "an emptied label map goes too"
        );
    }

    #[test]
    fn numbers_are_compared_by_value() {
        assert!(crate::fieldset::same_value(
            &json!({"minimum": [1, 0.5]}),
            &json!({"minimum": [1.0, 0.5]})
        ));
        assert!(!crate::fieldset::same_value(
            &json!({"minimum": 1}),
            &json!({"minimum": 1.5})
        ));
        assert!(!crate::fieldset::same_value(&json!([1]), &json!(["1"])));
    }

    #[test]
    fn another_managers_differing_value_conflicts_unless_forced() {
        let mine = json!({"spec": {"replicas": 2}});
        let object = apply(&skeleton(), &mine, &applier("op", false)).expect("created");
        let theirs = json!({"spec": {"replicas": 3}});
        let conflicts = apply(&object, &theirs, &applier("hpa", false)).expect_err("conflict");
        assert_eq!(
            conflicts,
            [Conflict {
                manager: "op".into(),
                operation: Operation::Apply,
                api_version: "apps/v1".into(),
                path: vec!["f:spec".into(), "f:replicas".into()]
            }]
        );
        // The same value is shared ownership, not a conflict.
        let shared = apply(&object, &mine, &applier("hpa", false)).expect("shared");
        assert_eq!(read_entries(&shared).len(), 2);
        let forced = apply(&object, &theirs, &applier("hpa", true)).expect("forced");
        assert_eq!(forced["spec"]["replicas"], 3);
        assert_eq!(
            managers(&forced),
            [("hpa".to_owned(), Operation::Apply)],
            "op lost its only field"
        );
        // Having lost the field, op's next apply without it does not remove it.
        let after = apply(
            &forced,
            &json!({"metadata": {"labels": {"x": "y"}}}),
            &applier("op", false),
        )
        .expect("ok");
        assert_eq!(after["spec"]["replicas"], 3);
    }

    #[test]
    fn fields_shared_with_another_manager_survive_removal() {
        let both = json!({"metadata": {"labels": {"a": "1"}}});
        let object = apply(&skeleton(), &both, &applier("one", false)).expect("ok");
        let object = apply(&object, &both, &applier("two", false)).expect("ok");
        let object = apply(&object, &json!({}), &applier("one", false)).expect("ok");
        assert_eq!(object["metadata"]["labels"], json!({"a": "1"}));
    }

    #[test]
    fn updates_take_ownership_of_what_they_change() {
        let object = apply(
            &skeleton(),
            &json!({"spec": {"replicas": 2, "paused": false}}),
            &applier("op", false),
        )
        .expect("ok");
        let mut edited = object.clone();
        edited["spec"]["replicas"] = json!(5);
        let updater = Updater {
            manager: "kubectl-edit",
            scope: Scope::Main {
                status_subresource: true,
            },
            shape: Shape::builtin("Deployment"),
            api_version: "apps/v1",
            now: NOW,
        };
        record_update(Some(&object), &mut edited, &updater);
        let entries = read_entries(&edited);
        assert_eq!(entries.len(), 2);
        assert!(
            !entries[0]
                .fields
                .contains(&["f:spec".into(), "f:replicas".into()])
        );
        assert!(
            entries[1]
                .fields
                .contains(&["f:spec".into(), "f:replicas".into()])
        );
        // op now conflicts on nothing it still owns, but re-applying its old value conflicts with the editor.
        let conflicts =
            apply(&edited, &json!({"spec": {"replicas": 2}}), &applier("op", false)).expect_err("conflict");
        assert_eq!(conflicts[0].manager, "kubectl-edit");
    }

    #[test]
    fn identical_applies_change_nothing() {
        let config = json!({"spec": {"replicas": 2}});
        let once = apply(&skeleton(), &config, &applier("op", false)).expect("ok");
        let twice = apply(&once, &config, &applier("op", false)).expect("ok");
        assert_eq!(once, twice);
    }
}
