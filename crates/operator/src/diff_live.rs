//! `gpu-operator render --diff-live`: what taking over a cluster would change, object by object, and which
//! pods it would restart, before anything is written.
//!
//! [`diff`] is pure: it compares the objects the operator would apply (already prepared: owner reference,
//! applied-hash annotation, the live driver digest kept) with the live objects and their pods. The
//! prediction follows what [`crate::apply::execute`] does: server-side apply, then the fields NVIDIA's
//! operator wrote taken over, so the live object ends up as the rendered one plus the API server's
//! defaults. A field of the live pod template that is neither rendered nor a server default will be
//! removed, and counts as a change. The defaults come from the API server itself (a dry-run create of each
//! rendered DaemonSet), so the comparison holds on every Kubernetes version without this binary knowing
//! them.
//!
//! Only a pod template change restarts pods (a RollingUpdate DaemonSet replaces them now; an OnDelete one,
//! the driver, when its upgrade controller gets to each node). A different selector is refused by the API
//! server (a DaemonSet's selector is immutable) and is reported as such.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

/// What applying one object would do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The object does not exist: it is created.
    Created,
    /// Applying changes nothing that matters.
    Unchanged,
    /// Only metadata or fields outside a pod template change: nothing restarts.
    MetadataOnly {
        /// The differing fields.
        paths: Vec<String>,
    },
    /// The pod template changes: the listed pods are replaced.
    PodTemplate {
        /// The differing fields (under `spec.template` and elsewhere).
        paths: Vec<String>,
        /// The pods that will restart, as (node, pod).
        restarts: Vec<(String, String)>,
    },
    /// The API server would refuse the change (a DaemonSet's selector cannot change).
    Refused {
        /// Why.
        reason: String,
    },
}

/// One rendered object and what applying it would do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectDiff {
    /// Kind.
    pub kind: String,
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// What changes.
    pub change: Change,
}

/// The whole prediction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiffReport {
    /// One entry per rendered object, in render order.
    pub objects: Vec<ObjectDiff>,
}

/// Exit status of `render --diff-live` when nothing restarts.
pub const EXIT_NOTHING_RESTARTS: u8 = 0;
/// Exit status when pods will restart.
pub const EXIT_PODS_RESTART: u8 = 1;
/// Exit status on an error, including a change the API server would refuse.
pub const EXIT_ERROR: u8 = 2;

impl DiffReport {
    /// The pods that will restart, as (DaemonSet, node, pod).
    pub fn restarts(&self) -> Vec<(&str, &str, &str)> {
        self.objects
            .iter()
            .flat_map(|o| match &o.change {
                Change::PodTemplate { restarts, .. } => restarts
                    .iter()
                    .map(|(node, pod)| (o.name.as_str(), node.as_str(), pod.as_str()))
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// The exit status: [`EXIT_ERROR`] if any change would be refused, else [`EXIT_PODS_RESTART`] if any pod
    /// template changes, else [`EXIT_NOTHING_RESTARTS`].
    pub fn exit_status(&self) -> u8 {
        if self
            .objects
            .iter()
            .any(|o| matches!(o.change, Change::Refused { .. }))
        {
            EXIT_ERROR
        } else if self
            .objects
            .iter()
            .any(|o| matches!(o.change, Change::PodTemplate { .. }))
        {
            EXIT_PODS_RESTART
        } else {
            EXIT_NOTHING_RESTARTS
        }
    }

    /// The report as text: one line per object, then the differing fields and the pods that restart.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for object in &self.objects {
            let id = if object.namespace.is_empty() {
                format!("{} {}", object.kind, object.name)
            } else {
                format!("{} {}/{}", object.kind, object.namespace, object.name)
            };
            let _ = match &object.change {
                Change::Created => writeln!(out, "created            {id}"),
                Change::Unchanged => writeln!(out, "unchanged          {id}"),
                Change::MetadataOnly { paths } => {
                    let _ = writeln!(out, "metadata-only      {id}");
                    write_paths(&mut out, paths)
                }
                Change::PodTemplate { paths, restarts } => {
                    let _ = writeln!(out, "pod template       {id}: {} pod(s) restart", restarts.len());
                    let _ = write_paths(&mut out, paths);
                    for (node, pod) in restarts {
                        let _ = writeln!(out, "    restarts {pod} on node {node}");
                    }
                    Ok(())
                }
                Change::Refused { reason } => writeln!(out, "refused            {id}: {reason}"),
            };
        }
        let restarts = self.restarts();
        let _ = writeln!(
            out,
            "{} object(s); {} pod(s) will restart",
            self.objects.len(),
            restarts.len()
        );
        out
    }
}

fn write_paths(out: &mut String, paths: &[String]) -> std::fmt::Result {
    for path in paths {
        writeln!(out, "    ~ {path}")?;
    }
    Ok(())
}

/// A pod as far as the diff needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivePod {
    /// Name.
    pub name: String,
    /// Node it runs on.
    pub node: String,
    /// UIDs of its owners.
    pub owners: Vec<String>,
}

/// What the operator would apply for `owned`, keyed by (kind, namespace, name): each object prepared as
/// [`crate::apply::plan`] prepares it, with the live driver digest kept where the live driver DaemonSet
/// (in `live`) installs the same driver, as the operator's apply does.
pub fn desired_objects(
    owned: &[crate::apply::Owned<'_>],
    live: &BTreeMap<(String, String, String), Value>,
) -> Vec<((String, String, String), Value)> {
    let mut desired = Vec::new();
    for set in owned {
        for manifest in &set.rendered.objects {
            let Some((kind, namespace, name)) = crate::apply::key_of(manifest) else {
                continue;
            };
            let key = (kind.to_owned(), namespace, name);
            let mut manifest = manifest.clone();
            if let Some(pod) = live
                .get(&key)
                .and_then(|l| serde_json::from_value(l["spec"]["template"]["spec"].clone()).ok())
            {
                gpuop_render::keep_live_driver_digest(&mut manifest.object, &pod);
            }
            let (object, _) = crate::apply::prepared(&manifest, set.owner);
            desired.push((key, object));
        }
    }
    desired
}

/// Compares what would be applied (`desired`, each with its kind, namespace and name; a DaemonSet's spec as
/// the API server would store it, with its defaults: see [`crate::render_command::diff_live`]) with the
/// live objects (by the same key) and the pods of the namespace.
pub fn diff(
    desired: &[((String, String, String), Value)],
    live: &BTreeMap<(String, String, String), Value>,
    pods: &[LivePod],
) -> DiffReport {
    let objects = desired
        .iter()
        .map(|((kind, namespace, name), object)| {
            let key = (kind.clone(), namespace.clone(), name.clone());
            let change = match live.get(&key) {
                None => Change::Created,
                Some(live) => change_of(kind, object, live, pods),
            };
            ObjectDiff {
                kind: kind.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                change,
            }
        })
        .collect();
    DiffReport { objects }
}

fn change_of(kind: &str, desired: &Value, live: &Value, pods: &[LivePod]) -> Change {
    let mut paths = Vec::new();
    for key in ["labels", "annotations", "ownerReferences"] {
        let mut live_value = live["metadata"][key].clone();
        if key == "annotations" {
            // Written by the API server on every DaemonSet, not by an operator.
            if let Some(map) = live_value.as_object_mut() {
                map.remove("deprecated.daemonset.template.generation");
                if map.is_empty() {
                    live_value = Value::Null;
                }
            }
        }
        compare(
            &format!("metadata.{key}"),
            &desired["metadata"][key],
            &live_value,
            true,
            &mut paths,
        );
    }
    if kind != "DaemonSet" {
        // Other kinds restart nothing; compare what is rendered (the server fills in much of the rest).
        for (key, value) in desired.as_object().into_iter().flatten() {
            if !["apiVersion", "kind", "metadata", "status"].contains(&key.as_str()) {
                compare(key, value, &live[key], false, &mut paths);
            }
        }
        return if paths.is_empty() {
            Change::Unchanged
        } else {
            Change::MetadataOnly { paths }
        };
    }
    if desired["spec"]["selector"] != live["spec"]["selector"] {
        return Change::Refused {
            reason: format!(
                "spec.selector cannot change (live {}, rendered {})",
                live["spec"]["selector"], desired["spec"]["selector"]
            ),
        };
    }
    let spec = &desired["spec"];
    let mut template_paths = Vec::new();
    compare(
        "spec.template",
        &spec["template"],
        &live["spec"]["template"],
        true,
        &mut template_paths,
    );
    for (key, value) in spec.as_object().into_iter().flatten() {
        if key != "template" {
            compare(
                &format!("spec.{key}"),
                value,
                &live["spec"][key],
                true,
                &mut paths,
            );
        }
    }
    if template_paths.is_empty() {
        return if paths.is_empty() {
            Change::Unchanged
        } else {
            Change::MetadataOnly { paths }
        };
    }
    let uid = live["metadata"]["uid"].as_str().unwrap_or_default();
    let mut restarts: Vec<(String, String)> = pods
        .iter()
        .filter(|pod| !uid.is_empty() && pod.owners.iter().any(|o| o == uid))
        .map(|pod| (pod.node.clone(), pod.name.clone()))
        .collect();
    restarts.sort();
    paths.extend(template_paths);
    Change::PodTemplate { paths, restarts }
}

/// Records the paths where `desired` and `live` differ. With `exact`, a field only the live object has is a
/// difference too; without, only what is rendered is compared.
fn compare(path: &str, desired: &Value, live: &Value, exact: bool, out: &mut Vec<String>) {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => {
            for (key, value) in d {
                compare(
                    &format!("{path}.{key}"),
                    value,
                    l.get(key).unwrap_or(&Value::Null),
                    exact,
                    out,
                );
            }
            if exact {
                for key in l.keys().filter(|k| !d.contains_key(*k)) {
                    out.push(format!("{path}.{key}"));
                }
            }
        }
        (Value::Array(d), Value::Array(l)) if d.len() == l.len() => {
            for (index, (d, l)) in d.iter().zip(l).enumerate() {
                let step = match d["name"].as_str() {
                    Some(name) if l["name"] == d["name"] => format!("{path}[{name}]"),
                    _ => format!("{path}[{index}]"),
                };
                compare(&step, d, l, exact, out);
            }
        }
        // An absent map and an empty one are the same; field by field otherwise.
        (Value::Null, Value::Object(_)) => compare(path, &json!({}), live, exact, out),
        (Value::Object(_), Value::Null) => compare(path, desired, &json!({}), exact, out),
        (d, l) if d != l => out.push(path.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: &str, name: &str) -> (String, String, String) {
        (kind.to_owned(), "gpu-operator".to_owned(), name.to_owned())
    }

    fn daemonset(echo: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "plugin", "labels": {"app": "plugin"}},
            "spec": {
                "selector": {"matchLabels": {"app": "plugin"}},
                "template": {
                    "metadata": {"labels": {"app": "plugin"}},
                    "spec": {"containers": [{
                        "name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
                        "args": [echo],
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
                    }]}
                }
            }
        })
    }

    /// The live form of a DaemonSet created as `desired` is, with the fields the server adds.
    fn stored(desired: &Value, uid: &str) -> Value {
        let mut live = desired.clone();
        live["metadata"]["uid"] = json!(uid);
        live["metadata"]["annotations"]["deprecated.daemonset.template.generation"] = json!("1");
        live
    }

    fn pods() -> Vec<LivePod> {
        vec![
            LivePod {
                name: "plugin-b".into(),
                node: "node-2".into(),
                owners: vec!["ds-uid".into()],
            },
            LivePod {
                name: "plugin-a".into(),
                node: "node-1".into(),
                owners: vec!["ds-uid".into()],
            },
            LivePod {
                name: "other".into(),
                node: "node-1".into(),
                owners: vec!["x".into()],
            },
        ]
    }

    #[test]
    fn the_same_template_restarts_nothing() {
        let desired = daemonset("hello");
        let live = BTreeMap::from([(key("DaemonSet", "plugin"), stored(&desired, "ds-uid"))]);
        let report = diff(&[(key("DaemonSet", "plugin"), desired)], &live, &pods());
        assert_eq!(report.objects[0].change, Change::Unchanged);
        assert_eq!(report.exit_status(), EXIT_NOTHING_RESTARTS);
    }

    #[test]
    fn a_template_change_lists_the_daemonsets_pods_by_node_and_the_fields() {
        let live_object = stored(&daemonset("hello"), "ds-uid");
        let mut desired = daemonset("bye");
        desired["metadata"]["labels"]["app.kubernetes.io/component"] = json!("device-plugin");
        let live = BTreeMap::from([(key("DaemonSet", "plugin"), live_object)]);
        let report = diff(&[(key("DaemonSet", "plugin"), desired)], &live, &pods());
        assert_eq!(
            report.objects[0].change,
            Change::PodTemplate {
                paths: vec![
                    "metadata.labels.app.kubernetes.io/component".into(),
                    "spec.template.spec.containers[plugin].args[0]".into()
                ],
                restarts: vec![
                    ("node-1".into(), "plugin-a".into()),
                    ("node-2".into(), "plugin-b".into())
                ],
            }
        );
        assert_eq!(report.exit_status(), EXIT_PODS_RESTART);
        let text = report.to_text();
        assert!(text.contains("restarts plugin-a on node node-1"), "{text}");
        assert!(text.contains("2 pod(s) will restart"), "{text}");
    }

    #[test]
    fn a_field_only_the_live_template_has_will_be_removed_and_restarts() {
        let desired = daemonset("hello");
        let mut live_object = stored(&desired, "ds-uid");
        live_object["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "EXTRA", "value": "1"}));
        let live = BTreeMap::from([(key("DaemonSet", "plugin"), live_object)]);
        let report = diff(&[(key("DaemonSet", "plugin"), desired)], &live, &pods());
        assert!(matches!(
            &report.objects[0].change,
            Change::PodTemplate { paths, .. } if paths == &["spec.template.spec.containers[plugin].env"]
        ));
    }

    #[test]
    fn metadata_changes_restart_nothing_and_a_new_selector_is_refused() {
        let desired = daemonset("hello");
        let mut live_object = stored(&desired, "ds-uid");
        live_object["metadata"]["annotations"]["openshift.io/scc"] = json!("hostmount-anyuid");
        let live = BTreeMap::from([(key("DaemonSet", "plugin"), live_object.clone())]);
        let report = diff(&[(key("DaemonSet", "plugin"), desired.clone())], &live, &pods());
        assert_eq!(
            report.objects[0].change,
            Change::MetadataOnly {
                paths: vec!["metadata.annotations.openshift.io/scc".into()]
            }
        );
        assert_eq!(report.exit_status(), EXIT_NOTHING_RESTARTS);

        live_object["spec"]["selector"]["matchLabels"]["tier"] = json!("gpu");
        let live = BTreeMap::from([(key("DaemonSet", "plugin"), live_object)]);
        let report = diff(&[(key("DaemonSet", "plugin"), desired)], &live, &pods());
        assert!(matches!(report.objects[0].change, Change::Refused { .. }));
        assert_eq!(report.exit_status(), EXIT_ERROR);
    }

    #[test]
    fn other_kinds_compare_what_is_rendered_and_missing_objects_are_created() {
        let desired = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm"}, "data": {"a": "1"}});
        let live_object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "uid": "u", "resourceVersion": "3"}, "data": {"a": "2"}});
        let live = BTreeMap::from([(key("ConfigMap", "cm"), live_object)]);
        let report = diff(
            &[
                (key("ConfigMap", "cm"), desired),
                (key("ServiceAccount", "new"), json!({})),
            ],
            &live,
            &[],
        );
        assert_eq!(
            report.objects[0].change,
            Change::MetadataOnly {
                paths: vec!["data.a".into()]
            }
        );
        assert_eq!(report.objects[1].change, Change::Created);
        assert_eq!(report.exit_status(), EXIT_NOTHING_RESTARTS);
    }
}
