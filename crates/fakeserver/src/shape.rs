//! How the lists and maps inside an object merge: which lists are keyed maps (containers by `name`, volume
//! mounts by `mountPath`, ...), which are sets (finalizers) and which are atomic (replaced whole).
//!
//! Strategic merge patch and server-side apply both read this. For built-in kinds it is the table of the
//! Kubernetes API's `patchMergeKey`/`listType` markers for the lists this project touches; for custom
//! resources it is the CRD schema's `x-kubernetes-list-type`, `x-kubernetes-list-map-keys` and
//! `x-kubernetes-map-type`.

use serde_json::Value;

use crate::json;

/// How a list merges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListType {
    /// Replaced as a whole.
    Atomic,
    /// A set of scalars, merged by value.
    Set,
    /// Items identified by these key fields, merged item by item.
    Map(Vec<&'static str>),
    /// Items identified by key fields named in a CRD schema.
    SchemaMap(Vec<String>),
}

impl ListType {
    /// The key fields of a keyed list.
    pub(crate) fn keys(&self) -> Vec<&str> {
        match self {
            Self::Map(keys) => keys.clone(),
            Self::SchemaMap(keys) => keys.iter().map(String::as_str).collect(),
            Self::Atomic | Self::Set => Vec::new(),
        }
    }
}

/// Where in an object a value sits, enough to know how it merges.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape<'a> {
    /// Inside a built-in kind: the field holding this value, its parent field, and the depth from the root.
    Builtin {
        kind: &'a str,
        field: &'a str,
        parent: &'a str,
        depth: u8,
    },
    /// Inside a custom resource, at this schema node; `root` is the object itself.
    Schema { schema: &'a Value, root: bool },
    /// Nothing is known: maps merge, lists are atomic.
    Free,
}

impl<'a> Shape<'a> {
    /// The root of a built-in object of `kind`.
    pub(crate) fn builtin(kind: &'a str) -> Self {
        Shape::Builtin {
            kind,
            field: "",
            parent: "",
            depth: 0,
        }
    }

    /// The root of a custom resource with this schema (or none).
    pub(crate) fn custom(schema: Option<&'a Value>) -> Self {
        schema.map_or(Shape::Free, |schema| Shape::Schema { schema, root: true })
    }

    /// The shape of field `name` of this (object) value.
    pub(crate) fn field(self, name: &'a str) -> Shape<'a> {
        match self {
            Shape::Builtin {
                kind, field, depth, ..
            } => Shape::Builtin {
                kind,
                field: name,
                parent: field,
                depth: depth.saturating_add(1),
            },
            Shape::Schema { root: true, .. } if name == "metadata" => Shape::Builtin {
                kind: "",
                field: "metadata",
                parent: "",
                depth: 1,
            },
            Shape::Schema { schema, .. } => {
                if schema
                    .get("x-kubernetes-embedded-resource")
                    .and_then(Value::as_bool)
                    == Some(true)
                    && name == "metadata"
                {
                    return Shape::Builtin {
                        kind: "",
                        field: "metadata",
                        parent: "",
                        depth: 1,
                    };
                }
                let child = schema
                    .get("properties")
                    .and_then(|p| p.get(name))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
                child.map_or(Shape::Free, |schema| Shape::Schema { schema, root: false })
            }
            Shape::Free => Shape::Free,
        }
    }

    /// The shape of this list's items.
    pub(crate) fn items(self) -> Shape<'a> {
        match self {
            // Items keep the list's field name as their "field", so that their own fields see it as parent.
            Shape::Builtin { .. } => self,
            Shape::Schema { schema, .. } => schema
                .get("items")
                .map_or(Shape::Free, |schema| Shape::Schema { schema, root: false }),
            Shape::Free => Shape::Free,
        }
    }

    /// How the list at this position merges.
    pub(crate) fn list_type(self) -> ListType {
        match self {
            Shape::Builtin {
                kind,
                field,
                parent,
                depth,
            } => builtin_list(kind, field, parent, depth),
            Shape::Schema { schema, .. } => {
                match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("set") => ListType::Set,
                    Some("map") => ListType::SchemaMap(json::strings(schema, "/x-kubernetes-list-map-keys")),
                    _ => ListType::Atomic,
                }
            }
            Shape::Free => ListType::Atomic,
        }
    }

    /// Whether server-side apply owns the map at this position whole: an atomic map, or an
    /// `OwnerReference` (a `structType=atomic`, which strategic merge still merges field by field by its
    /// `uid`, as kube-apiserver does; items keep their list's field name).
    pub(crate) fn applied_whole(self) -> bool {
        self.atomic_map()
            || matches!(
                self,
                Shape::Builtin {
                    field: "ownerReferences",
                    parent: "metadata",
                    ..
                }
            )
    }

    /// Whether the map at this position is replaced whole rather than merged key by key.
    pub(crate) fn atomic_map(self) -> bool {
        match self {
            // `LabelSelector` is a `structType=atomic`, and so is a Service's selector map.
            Shape::Builtin { field, .. } => field == "selector",
            Shape::Schema { schema, .. } => {
                matches!(
                    schema.get("x-kubernetes-map-type").and_then(Value::as_str),
                    Some("atomic")
                )
            }
            Shape::Free => false,
        }
    }
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

fn builtin_list(kind: &str, field: &str, parent: &str, depth: u8) -> ListType {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => ListType::Map(vec!["name"]),
        "volumeMounts" => ListType::Map(vec!["mountPath"]),
        "volumeDevices" => ListType::Map(vec!["devicePath"]),
        "ports" if kind == "Service" && parent == "spec" && depth == 2 => {
            ListType::Map(vec!["port", "protocol"])
        }
        "ports" if CONTAINER_LISTS.contains(&parent) => ListType::Map(vec!["containerPort", "protocol"]),
        "ownerReferences" if parent == "metadata" => ListType::Map(vec!["uid"]),
        "finalizers" if parent == "metadata" => ListType::Set,
        "conditions" => ListType::Map(vec!["type"]),
        "addresses" if kind == "Node" => ListType::Map(vec!["type"]),
        "hostAliases" => ListType::Map(vec!["ip"]),
        "topologySpreadConstraints" => ListType::Map(vec!["topologyKey", "whenUnsatisfiable"]),
        // Tolerations, taints, args, RBAC rules and subjects, and everything else: atomic, as in the API.
        _ => ListType::Atomic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_lists_follow_the_api_markers() {
        let ds = Shape::builtin("DaemonSet");
        let pod_spec = ds.field("spec").field("template").field("spec");
        let containers = pod_spec.field("containers");
        assert_eq!(containers.list_type(), ListType::Map(vec!["name"]));
        let container = containers.items();
        assert_eq!(
            container.field("ports").list_type(),
            ListType::Map(vec!["containerPort", "protocol"])
        );
        assert_eq!(
            container.field("volumeMounts").list_type(),
            ListType::Map(vec!["mountPath"])
        );
        assert_eq!(container.field("args").list_type(), ListType::Atomic);
        assert_eq!(pod_spec.field("tolerations").list_type(), ListType::Atomic);
        let service_ports = Shape::builtin("Service").field("spec").field("ports");
        assert_eq!(service_ports.list_type(), ListType::Map(vec!["port", "protocol"]));
        assert_eq!(
            ds.field("metadata").field("finalizers").list_type(),
            ListType::Set
        );
        assert!(ds.field("spec").field("selector").atomic_map());
    }

    #[test]
    fn custom_lists_follow_the_schema() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "pools": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                          "items": {"type": "object"}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}},
                "labels": {"type": "object", "x-kubernetes-map-type": "atomic"}
            }}
        }});
        let spec = Shape::custom(Some(&schema)).field("spec");
        assert_eq!(
            spec.field("pools").list_type(),
            ListType::SchemaMap(vec!["name".into()])
        );
        assert_eq!(spec.field("tags").list_type(), ListType::Set);
        assert_eq!(spec.field("args").list_type(), ListType::Atomic);
        assert!(spec.field("labels").atomic_map());
        let metadata = Shape::custom(Some(&schema)).field("metadata");
        assert_eq!(metadata.field("finalizers").list_type(), ListType::Set);
    }
}
