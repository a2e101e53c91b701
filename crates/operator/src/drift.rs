//! Drift: a managed object whose live fields are no longer what the operator applied, because a person
//! (`kubectl edit`, `kubectl set image`, `kubectl apply --server-side --force-conflicts`) or another
//! controller changed or removed them.
//!
//! The API server's own field ownership tells, without reading the object's body: after a server-side
//! apply, every field of the applied object is listed under the field manager `gpu-operator` in
//! `metadata.managedFields`. A write by anyone else that changes one of those fields moves it to the writer's
//! entry; one that removes it drops it from every entry. So an object drifted when a field of the object as
//! rendered is no longer in the operator's `Apply` set. Fields the operator does not set (a label or an
//! annotation a person adds, an env var another tool injects, whatever the server defaults) are in nobody's
//! way and never count.
//!
//! The API server records no field for an empty list, so an empty list never counts. The writer named is
//! the manager that owns a drifted field now, else (a field removed, which leaves no owner) the last other
//! manager that wrote the object after the operator's last apply, if one did. [`crate::apply::Repairs`]
//! makes at most one repair per version of the object, so a field the server would never record as the
//! operator's (none is known) costs one write, not a loop.
//!
//! The cache keeps of `managedFields` only what this needs ([`trim_managed_fields`]): the main resource's
//! entries, without their `apiVersion` and `fieldsType`. Managed objects are counted in operands, not nodes.

use gpuop_api::labels::FIELD_MANAGER;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Map, Value};

/// Event reason of a repaired drift.
pub const REASON: &str = "DriftRepaired";

/// How a live object drifted from what the operator applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The field manager that changed it: the one owning a drifted field, else the last other manager that
    /// wrote the object after the operator's last apply. `None` when nobody owns the drifted fields and no
    /// other manager's write after the operator's is recorded (a removal by a writer with no other field).
    pub manager: Option<String>,
    /// The drifted fields, as paths (`spec.template.spec.containers[name=x].image`), in object order.
    pub fields: Vec<String>,
}

impl Drift {
    /// One line for the event and the log: the fields (at most three named) and who changed them.
    pub fn note(&self, kind: &str, name: &str) -> String {
        const NAMED: usize = 3;
        let mut fields = self
            .fields
            .iter()
            .take(NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if self.fields.len() > NAMED {
            fields.push_str(&format!(" and {} more", self.fields.len() - NAMED));
        }
        let by = self
            .manager
            .as_deref()
            .map_or_else(|| "another writer".to_owned(), |m| format!("field manager {m:?}"));
        format!("{kind} {name}: {fields} changed by {by}; restored the rendered value")
    }
}

/// Keeps of an object's `metadata.managedFields` what [`drift`] reads: the entries of the main resource
/// (a status writer never touches what the operator applies), without `apiVersion` and `fieldsType`.
pub fn trim_managed_fields(entries: &mut Option<Vec<ManagedFieldsEntry>>) {
    if let Some(list) = entries.as_mut() {
        list.retain(|e| e.subresource.as_deref().unwrap_or_default().is_empty() && e.fields_v1.is_some());
        for entry in list.iter_mut() {
            entry.api_version = None;
            entry.fields_type = None;
        }
        if list.is_empty() {
            *entries = None;
        }
    }
}

/// Whether the live object drifted from `desired` (the object as rendered and last applied, with its
/// applied-hash annotation), judged from the live `managedFields`. `None` when the operator's `Apply`
/// entry covers every field of `desired`, or when there is no `Apply` entry of the operator at all (an
/// object it has not applied yet is written anyway).
pub fn drift(desired: &Value, entries: &[ManagedFieldsEntry]) -> Option<Drift> {
    let is_main = |e: &&ManagedFieldsEntry| e.subresource.as_deref().unwrap_or_default().is_empty();
    let ours = entries
        .iter()
        .filter(is_main)
        .find(|e| e.manager.as_deref() == Some(FIELD_MANAGER) && e.operation.as_deref() == Some("Apply"))?;
    let ours_set = ours.fields_v1.as_ref()?.0.as_object()?;
    let mut missing = Vec::new();
    uncovered_object(desired, ours_set, &mut Vec::new(), &mut missing);
    if missing.is_empty() {
        return None;
    }
    let others: Vec<&ManagedFieldsEntry> = entries
        .iter()
        .filter(is_main)
        .filter(|e| e.manager.as_deref().is_some_and(|m| m != FIELD_MANAGER))
        .collect();
    let owner = missing.iter().find_map(|path| {
        others.iter().find(|e| {
            e.fields_v1
                .as_ref()
                .and_then(|set| set.0.as_object())
                .is_some_and(|set| owns(set, path))
        })
    });
    let manager = match owner {
        Some(entry) => entry.manager.clone(),
        // Removed, not taken: nobody owns the field now. The remover is a write after ours, if one shows.
        None => others
            .iter()
            .filter(|e| matches!(e.operation.as_deref(), Some("Update" | "Apply")))
            .filter(|e| e.time.is_some() && e.time > ours.time)
            .max_by(|a, b| a.time.cmp(&b.time))
            .and_then(|latest| latest.manager.clone()),
    };
    Some(Drift {
        manager,
        fields: missing.iter().map(|path| spell(path)).collect(),
    })
}

/// One step from an object into one of its fields or list items.
#[derive(Clone, Copy, Debug)]
enum Step<'d> {
    /// A map field.
    Field(&'d str),
    /// A list item, found in a field set by its key fields (`k:`), its value (`v:`) or its index (`i:`).
    Item(usize, &'d Value),
}

/// Metadata fields the API server tracks in managed fields (name and namespace identify the object).
const TRACKED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// Collects the paths of `desired`'s fields that `set` (a `fieldsV1` node) does not reach.
fn uncovered_object<'d>(
    desired: &'d Value,
    set: &Map<String, Value>,
    path: &mut Vec<Step<'d>>,
    out: &mut Vec<Vec<Step<'d>>>,
) {
    let Value::Object(fields) = desired else {
        return;
    };
    for (name, value) in fields {
        let tracked = match path.as_slice() {
            [] => !matches!(name.as_str(), "apiVersion" | "kind" | "status"),
            [Step::Field("metadata")] => TRACKED_METADATA.contains(&name.as_str()),
            _ => true,
        };
        if !tracked || value.is_null() {
            continue;
        }
        path.push(Step::Field(name));
        match set.get(&format!("f:{name}")) {
            None if value.as_array().is_some_and(Vec::is_empty) => {}
            // Name the fields of a map that is gone: a map's node is there only for its fields.
            None if value.as_object().is_some_and(|m| !m.is_empty()) => {
                uncovered_object(value, &Map::new(), path, out);
            }
            None => out.push(path.clone()),
            Some(Value::Object(child)) => uncovered_value(value, child, path, out),
            Some(_) => {}
        }
        path.pop();
    }
}

/// Walks a value whose field-set node exists: maps field by field, granular lists item by item. A node with
/// nothing under it owns the value whole (a scalar, an atomic map or list).
fn uncovered_value<'d>(
    desired: &'d Value,
    set: &Map<String, Value>,
    path: &mut Vec<Step<'d>>,
    out: &mut Vec<Vec<Step<'d>>>,
) {
    let owned_whole = set.keys().all(|k| k == ".");
    match desired {
        Value::Object(_) if !owned_whole => uncovered_object(desired, set, path, out),
        Value::Array(items) if !owned_whole => {
            for (index, item) in items.iter().enumerate() {
                path.push(Step::Item(index, item));
                match item_node(set, index, item) {
                    None => out.push(path.clone()),
                    // An item node with nothing under it, not even `.`, owns the item whole: an atomic item,
                    // as kube-apiserver records an owner reference (`k:{"uid":"..."}: {}`).
                    Some(child) if item.is_object() && !child.is_empty() => {
                        uncovered_object(item, child, path, out);
                    }
                    Some(_) => {}
                }
                path.pop();
            }
        }
        _ => {}
    }
}

/// The field-set node of a list item: `k:` whose key fields the item has with the same values (a key field
/// the item leaves out is one the server defaulted, like a port's `protocol`), `v:` equal to it, or `i:`.
fn item_node<'s>(set: &'s Map<String, Value>, index: usize, item: &Value) -> Option<&'s Map<String, Value>> {
    set.iter()
        .find(|(element, _)| {
            if let Some(key) = element.strip_prefix("k:") {
                let Ok(Value::Object(key)) = serde_json::from_str::<Value>(key) else {
                    return false;
                };
                item.is_object()
                    && key
                        .iter()
                        .all(|(field, value)| item.get(field).is_none_or(|mine| same_value(mine, value)))
            } else if let Some(member) = element.strip_prefix("v:") {
                serde_json::from_str::<Value>(member).is_ok_and(|member| same_value(item, &member))
            } else if let Some(at) = element.strip_prefix("i:") {
                at.parse::<usize>().is_ok_and(|at| at == index)
            } else {
                false
            }
        })
        .and_then(|(_, node)| node.as_object())
}

/// Whether a field set owns `path` itself, something under it, or a value that holds it whole.
fn owns(set: &Map<String, Value>, path: &[Step<'_>]) -> bool {
    let mut node = set;
    for step in path {
        let next = match step {
            Step::Field(name) => node.get(&format!("f:{name}")).and_then(Value::as_object),
            Step::Item(index, item) => item_node(node, *index, item),
        };
        match next {
            // A node with nothing under it owns its value whole: everything below the path too.
            Some(child) if child.keys().all(|k| k == ".") => return true,
            Some(child) => node = child,
            None => return false,
        }
    }
    true
}

/// Numbers compare by value (`1` and `1.0` are one value to the API server).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        _ => a == b,
    }
}

/// `spec.template.spec.containers[name=x].image`; items without a `name` by index.
fn spell(path: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Step::Item(index, item) => match item.get("name").and_then(Value::as_str) {
                Some(name) => out.push_str(&format!("[name={name}]")),
                None => match item {
                    Value::String(value) => out.push_str(&format!("[{value:?}]")),
                    _ => out.push_str(&format!("[{index}]")),
                },
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
    use serde_json::json;

    fn daemonset(image: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ds", "namespace": "gpu-operator",
                         "labels": {"app.kubernetes.io/managed-by": "gpu-operator"},
                         "annotations": {"nvidia.com/last-applied-hash": "h"},
                         "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                              "name": "p", "uid": "u", "controller": true}]},
            "spec": {
                "selector": {"matchLabels": {"app": "ds"}},
                "template": {
                    "metadata": {"labels": {"app": "ds"}},
                    "spec": {
                        "tolerations": [{"operator": "Exists"}],
                        "volumes": [],
                        "containers": [{
                            "name": "c", "image": image, "args": ["--x"],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                            "ports": [{"containerPort": 9400, "name": "metrics"}],
                            "securityContext": {"privileged": true},
                        }],
                    },
                },
            },
        })
    }

    /// The operator's `Apply` set of [`daemonset`], as kube-apiserver v1.36 records it (ports keyed with
    /// the defaulted protocol; selector, tolerations and each owner reference atomic).
    fn applied_set() -> Value {
        json!({
            "f:metadata": {
                "f:labels": {"f:app.kubernetes.io/managed-by": {}},
                "f:annotations": {"f:nvidia.com/last-applied-hash": {}},
                "f:ownerReferences": {"k:{\"uid\":\"u\"}": {}},
            },
            "f:spec": {
                "f:selector": {},
                "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {
                        "f:tolerations": {},
                        "f:containers": {"k:{\"name\":\"c\"}": {
                            ".": {}, "f:name": {}, "f:image": {}, "f:args": {},
                            "f:env": {
                                "k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}},
                                "k:{\"name\":\"B\"}": {".": {}, "f:name": {}, "f:value": {}},
                            },
                            "f:ports": {"k:{\"containerPort\":9400,\"protocol\":\"TCP\"}": {
                                ".": {}, "f:containerPort": {}, "f:name": {}}},
                            "f:securityContext": {"f:privileged": {}},
                        }},
                    },
                },
            },
        })
    }

    fn entry(manager: &str, operation: &str, second: u32, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            time: Some(Time(format!("2026-12-01T12:00:{second:02}Z").parse().unwrap())),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    /// Moves a path out of the operator's set into a set of its own, as an Update that changes the field
    /// does.
    fn take(set: &mut Value, pointer: &str) -> Value {
        let (parent, last) = pointer.rsplit_once('/').unwrap();
        let last = last.replace("~1", "/");
        let taken = set
            .pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove(&last)
            .unwrap();
        let mut theirs = json!({});
        let mut node = &mut theirs;
        for element in parent.split('/').skip(1) {
            node = node.as_object_mut().unwrap().entry(element).or_insert(json!({}));
        }
        node[&last] = taken;
        // A map left with no fields is no longer in the set at all (`{}` would mean "owned whole").
        let mut parent = parent.to_owned();
        while set
            .pointer(&parent)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            let (grand, name) = parent.rsplit_once('/').unwrap();
            let name = name.replace("~1", "/");
            set.pointer_mut(grand)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .remove(&name);
            parent = grand.to_owned();
        }
        theirs
    }

    #[test]
    fn an_object_as_applied_has_not_drifted_and_server_defaults_do_not_count() {
        let entries = [
            entry("gpu-operator", "Apply", 0, applied_set()),
            entry("kube-controller-manager", "Update", 30, json!({"f:status": {}})),
        ];
        assert_eq!(drift(&daemonset("i:1"), &entries), None);
        assert_eq!(
            drift(&daemonset("i:1"), &[]),
            None,
            "no managed fields: nothing to judge"
        );
    }

    #[test]
    fn a_changed_image_is_drift_named_with_the_editor() {
        let mut ours = applied_set();
        let theirs = take(
            &mut ours,
            "/f:spec/f:template/f:spec/f:containers/k:{\"name\":\"c\"}/f:image",
        );
        let entries = [
            entry("gpu-operator", "Apply", 0, ours),
            entry("kubectl-edit", "Update", 5, theirs),
        ];
        let drift = drift(&daemonset("i:1"), &entries).expect("drifted");
        assert_eq!(drift.manager.as_deref(), Some("kubectl-edit"));
        assert_eq!(drift.fields, ["spec.template.spec.containers[name=c].image"]);
        assert_eq!(
            drift.note("DaemonSet", "ds"),
            "DaemonSet ds: spec.template.spec.containers[name=c].image changed by field manager \"kubectl-edit\"; restored the rendered value"
        );
    }

    #[test]
    fn an_atomic_list_or_a_label_taken_by_a_forced_apply_is_drift() {
        let mut ours = applied_set();
        let theirs = take(&mut ours, "/f:spec/f:template/f:spec/f:tolerations");
        let entries = [
            entry("gpu-operator", "Apply", 0, ours),
            entry("argocd", "Apply", 0, theirs),
        ];
        let found = drift(&daemonset("i:1"), &entries).expect("drifted");
        assert_eq!(
            found.manager.as_deref(),
            Some("argocd"),
            "ownership names it, whatever the times"
        );
        assert_eq!(found.fields, ["spec.template.spec.tolerations"]);

        let mut ours = applied_set();
        let theirs = take(&mut ours, "/f:metadata/f:labels/f:app.kubernetes.io~1managed-by");
        let entries = [
            entry("gpu-operator", "Apply", 0, ours),
            entry("kubectl-label", "Update", 9, theirs),
        ];
        assert_eq!(
            drift(&daemonset("i:1"), &entries).expect("drifted").fields,
            ["metadata.labels.app.kubernetes.io/managed-by"]
        );
    }

    #[test]
    fn a_removed_field_is_drift_named_with_the_last_writer_after_the_operator() {
        let mut ours = applied_set();
        // `kubectl edit` deleting env var A: the API server drops it from every set; nobody owns it.
        ours["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]["f:env"]
            .as_object_mut()
            .unwrap()
            .remove("k:{\"name\":\"A\"}");
        let removed = drift(
            &daemonset("i:1"),
            &[
                entry("gpu-operator", "Apply", 0, ours.clone()),
                entry(
                    "kubectl-edit",
                    "Update",
                    7,
                    json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
                ),
            ],
        )
        .expect("drifted");
        assert_eq!(removed.manager.as_deref(), Some("kubectl-edit"));
        assert_eq!(
            removed.fields,
            ["spec.template.spec.containers[name=c].env[name=A]"]
        );
        let unnamed = drift(
            &daemonset("i:1"),
            &[
                entry("gpu-operator", "Apply", 8, ours),
                entry(
                    "kubectl-edit",
                    "Update",
                    7,
                    json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
                ),
            ],
        )
        .expect("drifted");
        assert_eq!(
            unnamed.manager, None,
            "a write before the operator's last apply removed nothing of it"
        );
        assert!(
            unnamed
                .note("DaemonSet", "ds")
                .contains("changed by another writer")
        );
    }

    #[test]
    fn what_the_operator_does_not_set_is_left_alone() {
        // A person adds a label and an annotation to the object, an env var and a template annotation
        // (`kubectl rollout restart`), and co-owns a field with the same value.
        let entries = [
            entry("gpu-operator", "Apply", 0, applied_set()),
            entry(
                "kubectl-edit",
                "Update",
                9,
                json!({
                    "f:metadata": {"f:labels": {"f:team": {}}, "f:annotations": {"f:note": {}}},
                    "f:spec": {"f:template": {
                        "f:metadata": {"f:annotations": {"f:kubectl.kubernetes.io/restartedAt": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {
                            "f:env": {"k:{\"name\":\"EXTRA\"}": {".": {}, "f:name": {}, "f:value": {}}}}}}}},
                }),
            ),
            entry(
                "kubectl",
                "Apply",
                9,
                json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {"f:image": {}}}}}}}),
            ),
        ];
        assert_eq!(drift(&daemonset("i:1"), &entries), None);
    }

    #[test]
    fn trimming_keeps_the_main_resources_entries() {
        let mut entries = Some(vec![
            ManagedFieldsEntry {
                api_version: Some("apps/v1".into()),
                fields_type: Some("FieldsV1".into()),
                ..entry("gpu-operator", "Apply", 0, applied_set())
            },
            ManagedFieldsEntry {
                subresource: Some("status".into()),
                ..entry("kube-controller-manager", "Update", 0, json!({"f:status": {}}))
            },
        ]);
        trim_managed_fields(&mut entries);
        let kept = entries.expect("ours stays");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].api_version, None);
        let mut status_only = Some(vec![ManagedFieldsEntry {
            subresource: Some("status".into()),
            ..entry("kube-controller-manager", "Update", 0, json!({"f:status": {}}))
        }]);
        trim_managed_fields(&mut status_only);
        assert_eq!(status_only, None);
    }
}
