//! Server-side `Table` output, what `kubectl get` prints: asked for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, answered as a `meta.k8s.io/v1` `Table` whose
//! rows hold one object each, its cells and (by `includeObject`) its metadata, the whole object or nothing.
//!
//! The columns and cells are kube-apiserver's for the built-in resources this server serves (its printers:
//! a node's status and roles, a pod's ready count, status and restarts, a DaemonSet's counts, ...), a
//! CRD's `additionalPrinterColumns` for custom resources (Age alone when it has none), and Name and
//! Created At for every other resource. Column descriptions are this project's own words, shorter than
//! kube-apiserver's (docs/fakeserver.md lists the difference).

use std::fmt::Write as _;
use std::sync::Arc;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::clock::Clock;
use crate::json::{self, text};
use crate::registry::ResourceInfo;

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata`: what kubectl asks for.
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// From `?includeObject=`; an unknown value is a 400 naming what is accepted.
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("" | "Metadata") => Ok(Self::Metadata),
            Some("None") => Ok(Self::None),
            Some("Object") => Ok(Self::Object),
            Some(other) => Err(format!(
                "includeObject: Invalid value: {other:?}: must be 'Metadata', 'Object', 'None', or empty"
            )),
        }
    }
}

/// How a `Table` is made: what rows carry, and the clock ages are counted on.
#[derive(Clone, Debug)]
pub(crate) struct TableOptions {
    pub(crate) include: IncludeObject,
    pub(crate) clock: Arc<dyn Clock>,
}

/// One column.
struct Column {
    name: String,
    kind: &'static str,
    format: &'static str,
    priority: u8,
    description: String,
    /// For a custom resource's printer column: where its value is.
    path: Option<String>,
}

fn column(name: &str, kind: &'static str, priority: u8, description: &str) -> Column {
    Column {
        name: name.to_owned(),
        kind,
        format: if name == "Name" { "name" } else { "" },
        priority,
        description: description.to_owned(),
        path: None,
    }
}

const NAME: &str = "The object's name.";
const AGE: &str = "How long ago the object was created.";

/// The columns of a resource, in order.
fn columns(info: &ResourceInfo) -> Vec<Column> {
    let s = |name: &str, description: &str| column(name, "string", 0, description);
    let int = |name: &str, description: &str| column(name, "integer", 0, description);
    let wide = |name: &str, description: &str| column(name, "string", 1, description);
    let name = || s("Name", NAME);
    let age = || s("Age", AGE);
    if let Some(custom) = &info.custom {
        let mut columns = vec![name()];
        for printer in &custom.printer_columns {
            let kind = match printer.get("type").and_then(Value::as_str) {
                Some("integer") => "integer",
                Some("number") => "number",
                Some("boolean") => "boolean",
                Some("date") => "date",
                _ => "string",
            };
            let path = printer
                .get("jsonPath")
                .and_then(Value::as_str)
                .unwrap_or_default();
            // Without a description of its own, a column says where its value comes from, as
            // kube-apiserver words it.
            let description = printer.get("description").and_then(Value::as_str).map_or_else(
                || format!("Custom resource definition column (in JSONPath format): {path}"),
                str::to_owned,
            );
            let mut column = column(
                printer.get("name").and_then(Value::as_str).unwrap_or_default(),
                kind,
                u8::try_from(printer.get("priority").and_then(Value::as_u64).unwrap_or(0)).unwrap_or(u8::MAX),
                &description,
            );
            column.path = Some(path.to_owned());
            columns.push(column);
        }
        if custom.printer_columns.is_empty() {
            let mut age = column("Age", "date", 0, AGE);
            age.path = Some(".metadata.creationTimestamp".to_owned());
            columns.push(age);
        }
        return columns;
    }
    let workload = || {
        [
            wide("Containers", "The names of the pod template's containers."),
            wide("Images", "The images of the pod template's containers."),
            wide("Selector", "The label selector of the pods."),
        ]
    };
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "nodes") => vec![
            name(),
            s("Status", "Whether the node is Ready, and schedulable."),
            s("Roles", "The node's roles."),
            age(),
            s("Version", "The kubelet's version."),
            wide("Internal-IP", "The node's internal address."),
            wide("External-IP", "The node's external address."),
            wide("OS-Image", "The node's operating system."),
            wide("Kernel-Version", "The node's kernel and architecture."),
            wide("Container-Runtime", "The node's container runtime."),
        ],
        ("", "pods") => vec![
            name(),
            s("Ready", "Ready containers of all containers."),
            s("Status", "What the pod is doing, or why it is not running."),
            s(
                "Restarts",
                "Container restarts, and how long ago the last one was.",
            ),
            age(),
            wide("IP", "The pod's address."),
            wide("Node", "The node the pod is bound to."),
            wide("Nominated Node", "The node preemption nominated."),
            wide("Readiness Gates", "Readiness gates met of all gates."),
        ],
        ("", "namespaces") => vec![name(), s("Status", "The namespace's phase."), age()],
        ("", "configmaps") => vec![name(), s("Data", "How many keys the ConfigMap holds."), age()],
        ("", "secrets") => vec![
            name(),
            s("Type", "The secret's type."),
            s("Data", "How many keys the secret holds."),
            age(),
        ],
        ("", "serviceaccounts") => vec![name(), age()],
        ("", "services") => vec![
            name(),
            s("Type", "The service's type."),
            s("Cluster-IP", "The service's cluster address."),
            s("External-IP", "The service's external addresses."),
            s("Port(s)", "The service's ports."),
            age(),
            wide("Selector", "The label selector of the service's pods."),
        ],
        ("" | "events.k8s.io", "events") => vec![
            s("Last Seen", "How long ago the event last happened."),
            s("Type", "Normal or Warning."),
            s("Reason", "Why the event happened."),
            s("Object", "What the event is about."),
            wide("Subobject", "The part of the object it is about."),
            wide("Source", "Who reported it."),
            s("Message", "What happened."),
            wide("First Seen", "How long ago the event first happened."),
            wide("Count", "How often it happened."),
            column("Name", "string", 1, NAME),
        ],
        ("apps", "daemonsets") => {
            let mut columns = vec![
                name(),
                int("Desired", "Nodes that should run the daemon pod."),
                int("Current", "Nodes that run it."),
                int("Ready", "Nodes where it is ready."),
                int("Up-to-date", "Nodes that run the latest template."),
                int("Available", "Nodes where it is available."),
                s("Node Selector", "The node selector of the daemon pod."),
                age(),
            ];
            columns.extend(workload());
            columns
        }
        ("apps", "deployments") => {
            let mut columns = vec![
                name(),
                s("Ready", "Ready replicas of those wanted."),
                s("Up-to-date", "Replicas of the latest template."),
                s("Available", "Available replicas."),
                age(),
            ];
            columns.extend(workload());
            columns
        }
        ("apps", "replicasets") => {
            let mut columns = vec![
                name(),
                int("Desired", "Replicas wanted."),
                int("Current", "Replicas there."),
                int("Ready", "Ready replicas."),
                age(),
            ];
            columns.extend(workload());
            columns
        }
        ("apps", "controllerrevisions") => vec![
            name(),
            s("Controller", "The object the revision belongs to."),
            s("Revision", "The revision's number."),
            age(),
        ],
        ("batch", "jobs") => {
            let mut columns = vec![
                name(),
                s("Status", "Whether the job runs, completed or failed."),
                s("Completions", "Succeeded pods of those wanted."),
                s("Duration", "How long the job ran."),
                age(),
            ];
            columns.extend(workload());
            columns
        }
        ("policy", "poddisruptionbudgets") => vec![
            name(),
            s("Min Available", "Pods that must stay available."),
            s("Max Unavailable", "Pods that may be unavailable."),
            int("Allowed Disruptions", "Evictions allowed now."),
            age(),
        ],
        ("coordination.k8s.io", "leases") => vec![name(), s("Holder", "Who holds the lease."), age()],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => vec![
            name(),
            s("Role", "The role bound."),
            age(),
            wide("Users", "The users bound."),
            wide("Groups", "The groups bound."),
            wide("ServiceAccounts", "The service accounts bound."),
        ],
        ("node.k8s.io", "runtimeclasses") => vec![name(), s("Handler", "The runtime handler."), age()],
        ("scheduling.k8s.io", "priorityclasses") => vec![
            name(),
            int("Value", "The priority."),
            column(
                "Global-Default",
                "boolean",
                0,
                "Whether pods without a class get this one.",
            ),
            age(),
            s("PreemptionPolicy", "Whether pods of this class preempt others."),
        ],
        ("resource.k8s.io", "resourceslices") => vec![
            name(),
            s("Node", "The node whose devices the slice lists."),
            s("Driver", "The DRA driver that publishes it."),
            s("Pool", "The pool of devices."),
            age(),
        ],
        ("resource.k8s.io", "resourceclaims") => vec![
            name(),
            s("State", "Whether the claim is allocated, reserved or deleted."),
            age(),
        ],
        ("resource.k8s.io", "deviceclasses" | "resourceclaimtemplates") => vec![name(), age()],
        _ => vec![
            name(),
            column("Created At", "date", 0, "When the object was created."),
        ],
    }
}

/// A `meta.k8s.io/v1` `Table` of `objects`, with `metadata` (resourceVersion, continue...) as a list's.
/// `with_columns` false leaves the column definitions out, as kube-apiserver does for every watch event
/// after the first.
pub(crate) fn table(
    info: &ResourceInfo,
    objects: &[Value],
    metadata: Value,
    options: &TableOptions,
    with_columns: bool,
) -> Value {
    let columns = columns(info);
    let now = options.clock.now();
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "type": c.kind, "format": c.format,
                "description": c.description, "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let embedded = match options.include {
                IncludeObject::None => Value::Null,
                IncludeObject::Metadata => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": object.get("metadata").cloned().unwrap_or_default(),
                }),
                IncludeObject::Object => object.clone(),
            };
            json!({"cells": cells(info, &columns, object, now), "object": embedded})
        })
        .collect();
    let mut table = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": if with_columns { Value::Array(definitions) } else { Value::Null },
        "rows": rows,
    });
    table["metadata"] = metadata;
    table
}

fn int(value: &Value, pointer: &str) -> i64 {
    value.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(text: &str) -> Value {
    Value::from(if text.is_empty() { "<none>" } else { text })
}

fn age(value: &Value, pointer: &str, now: Timestamp) -> Value {
    Value::from(since(value.pointer(pointer).and_then(Value::as_str), now))
}

/// How long ago `time` (RFC 3339) was, as kubectl prints it; `<unknown>` when there is none.
fn since(time: Option<&str>, now: Timestamp) -> String {
    match time.and_then(|t| t.parse::<Timestamp>().ok()) {
        Some(then) => human_duration(now.as_second() - then.as_second()),
        None => "<unknown>".to_owned(),
    }
}

/// A duration in seconds as Kubernetes prints ages: whole seconds up to two minutes, then minutes and
/// seconds up to ten minutes, minutes up to three hours, hours and minutes up to eight, hours up to two
/// days, days and hours up to eight, days up to two years, years and days up to eight, then years.
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let seconds = seconds.max(0);
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

/// `a=b,c=d` of a map, in key order; `<none>` when empty.
fn pairs(map: Option<&Value>) -> String {
    let mut pairs: Vec<(&String, &Value)> = map
        .and_then(Value::as_object)
        .map(|m| m.iter().collect())
        .unwrap_or_default();
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    let joined = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(",");
    if joined.is_empty() {
        "<none>".to_owned()
    } else {
        joined
    }
}

/// A label selector as kubectl prints it: `matchLabels` as `k=v`, then each expression
/// (`k in (a,b)`, `k notin (a)`, `k`, `!k`), comma-separated; `<none>` for an empty one.
fn selector(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return "<none>".to_owned();
    };
    let mut parts = Vec::new();
    let labels = pairs(selector.get("matchLabels"));
    if labels != "<none>" {
        parts.push(labels);
    }
    for expression in json::items(selector, "/matchExpressions") {
        let key = text(expression, "/key");
        let values: Vec<&str> = json::items(expression, "/values")
            .filter_map(Value::as_str)
            .collect();
        parts.push(match text(expression, "/operator") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        });
    }
    if parts.is_empty() {
        "<none>".to_owned()
    } else {
        parts.join(",")
    }
}

/// The containers' names and images of a pod template, comma-separated.
fn containers(template_spec: Option<&Value>) -> (String, String) {
    let list: Vec<&Value> = template_spec
        .and_then(|spec| spec.get("containers"))
        .and_then(Value::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let names = list
        .iter()
        .map(|c| text(c, "/name"))
        .collect::<Vec<_>>()
        .join(",");
    let images = list
        .iter()
        .map(|c| text(c, "/image"))
        .collect::<Vec<_>>()
        .join(",");
    (names, images)
}

fn workload_cells(object: &Value) -> [Value; 3] {
    let (names, images) = containers(object.pointer("/spec/template/spec"));
    [
        Value::from(names),
        Value::from(images),
        Value::from(selector(object.pointer("/spec/selector"))),
    ]
}

/// The cells of one object's row.
fn cells(info: &ResourceInfo, columns: &[Column], object: &Value, now: Timestamp) -> Vec<Value> {
    let name = Value::from(text(object, "/metadata/name"));
    let created = || age(object, "/metadata/creationTimestamp", now);
    if info.custom.is_some() {
        return std::iter::once(name)
            .chain(columns.iter().skip(1).map(|c| printer_cell(c, object, now)))
            .collect();
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "nodes") => node_cells(object, name, created()),
        ("", "pods") => pod_cells(object, name, created(), now),
        ("", "namespaces") => vec![name, Value::from(text(object, "/status/phase")), created()],
        ("", "configmaps") => {
            let count = ["data", "binaryData"]
                .iter()
                .filter_map(|key| object.get(*key).and_then(Value::as_object))
                .map(Map::len)
                .sum::<usize>();
            vec![name, Value::from(count), created()]
        }
        ("", "secrets") => {
            let count = object.get("data").and_then(Value::as_object).map_or(0, Map::len);
            vec![
                name,
                Value::from(text(object, "/type")),
                Value::from(count),
                created(),
            ]
        }
        ("", "serviceaccounts") => vec![name, created()],
        ("", "services") => service_cells(object, name, created()),
        ("" | "events.k8s.io", "events") => event_cells(info, object, name, now),
        ("apps", "daemonsets") => {
            let mut cells = vec![name];
            for field in [
                "desiredNumberScheduled",
                "currentNumberScheduled",
                "numberReady",
                "updatedNumberScheduled",
                "numberAvailable",
            ] {
                cells.push(Value::from(int(object, &format!("/status/{field}"))));
            }
            cells.push(Value::from(pairs(
                object.pointer("/spec/template/spec/nodeSelector"),
            )));
            cells.push(created());
            cells.extend(workload_cells(object));
            cells
        }
        ("apps", "deployments") => {
            let mut cells = vec![
                name,
                Value::from(format!(
                    "{}/{}",
                    int(object, "/status/readyReplicas"),
                    object
                        .pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1)
                )),
                Value::from(int(object, "/status/updatedReplicas")),
                Value::from(int(object, "/status/availableReplicas")),
                created(),
            ];
            cells.extend(workload_cells(object));
            cells
        }
        ("apps", "replicasets") => {
            let mut cells = vec![
                name,
                Value::from(
                    object
                        .pointer("/spec/replicas")
                        .and_then(Value::as_i64)
                        .unwrap_or(1),
                ),
                Value::from(int(object, "/status/replicas")),
                Value::from(int(object, "/status/readyReplicas")),
                created(),
            ];
            cells.extend(workload_cells(object));
            cells
        }
        ("apps", "controllerrevisions") => {
            let controller = object
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .and_then(|owners| {
                    owners
                        .iter()
                        .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
                })
                .map_or_else(
                    || "<none>".to_owned(),
                    |owner| {
                        let group = text(owner, "/apiVersion").split_once('/').map_or("", |(g, _)| g);
                        let kind = text(owner, "/kind").to_ascii_lowercase();
                        let kind = if group.is_empty() {
                            kind
                        } else {
                            format!("{kind}.{group}")
                        };
                        format!("{kind}/{}", text(owner, "/name"))
                    },
                );
            vec![
                name,
                Value::from(controller),
                Value::from(int(object, "/revision")),
                created(),
            ]
        }
        ("batch", "jobs") => job_cells(object, name, created(), now),
        ("policy", "poddisruptionbudgets") => {
            let bound = |field: &str| {
                object.pointer(&format!("/spec/{field}")).map_or_else(
                    || "N/A".to_owned(),
                    |v| v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                )
            };
            vec![
                name,
                Value::from(bound("minAvailable")),
                Value::from(bound("maxUnavailable")),
                Value::from(int(object, "/status/disruptionsAllowed")),
                created(),
            ]
        }
        ("coordination.k8s.io", "leases") => {
            vec![name, Value::from(text(object, "/spec/holderIdentity")), created()]
        }
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            binding_cells(object, name, created())
        }
        ("node.k8s.io", "runtimeclasses") => vec![name, Value::from(text(object, "/handler")), created()],
        ("scheduling.k8s.io", "priorityclasses") => vec![
            name,
            Value::from(int(object, "/value")),
            Value::from(
                object
                    .get("globalDefault")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            ),
            created(),
            Value::from(text(object, "/preemptionPolicy")),
        ],
        ("resource.k8s.io", "resourceslices") => vec![
            name,
            Value::from(text(object, "/spec/nodeName")),
            Value::from(text(object, "/spec/driver")),
            Value::from(text(object, "/spec/pool/name")),
            created(),
        ],
        ("resource.k8s.io", "resourceclaims") => {
            let mut states = Vec::new();
            if object.pointer("/status/allocation").is_some() {
                states.push("allocated");
            }
            if object
                .pointer("/status/reservedFor")
                .and_then(Value::as_array)
                .is_some_and(|r| !r.is_empty())
            {
                states.push("reserved");
            }
            if object.pointer("/metadata/deletionTimestamp").is_some() {
                states.push("deleted");
            }
            let state = if states.is_empty() {
                "pending".to_owned()
            } else {
                states.join(",")
            };
            vec![name, Value::from(state), created()]
        }
        ("resource.k8s.io", "deviceclasses" | "resourceclaimtemplates") => vec![name, created()],
        _ => vec![name, Value::from(text(object, "/metadata/creationTimestamp"))],
    }
}

fn node_cells(node: &Value, name: Value, created: Value) -> Vec<Value> {
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| text(c, "/type") == "Ready"));
    let mut status = vec![match ready {
        Some(c) if text(c, "/status") == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled");
    }
    let mut roles: Vec<String> = node
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(
            |(key, value)| match key.strip_prefix("node-role.kubernetes.io/") {
                Some(role) if !role.is_empty() => Some(role.to_owned()),
                _ if key == "kubernetes.io/role" => {
                    value.as_str().filter(|v| !v.is_empty()).map(str::to_owned)
                }
                _ => None,
            },
        )
        .collect();
    roles.sort();
    roles.dedup();
    let address = |kind: &str| {
        node.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|a| text(a, "/type") == kind))
            .map_or("", |a| text(a, "/address"))
            .to_owned()
    };
    let kernel = text(node, "/status/nodeInfo/kernelVersion");
    let arch = text(node, "/status/nodeInfo/architecture");
    let kernel = match (kernel.is_empty(), arch.is_empty()) {
        (true, _) => String::new(),
        (false, true) => kernel.to_owned(),
        (false, false) => format!("{kernel} ({arch})"),
    };
    vec![
        name,
        Value::from(status.join(",")),
        or_none(&roles.join(",")),
        created,
        Value::from(text(node, "/status/nodeInfo/kubeletVersion")),
        or_none(&address("InternalIP")),
        or_none(&address("ExternalIP")),
        Value::from(text(node, "/status/nodeInfo/osImage")),
        or_none(&kernel),
        Value::from(text(node, "/status/nodeInfo/containerRuntimeVersion")),
    ]
}

/// A pod's Status column, as kubectl works it out: the phase, or the pod's reason, or the first init
/// container not done, or the first container's waiting or terminated reason; `Terminating` once deleted.
fn pod_status(pod: &Value) -> String {
    let mut reason = text(pod, "/status/phase").to_owned();
    if !text(pod, "/status/reason").is_empty() {
        reason = text(pod, "/status/reason").to_owned();
    }
    let statuses = |key: &str| -> Vec<&Value> {
        pod.pointer(&format!("/status/{key}"))
            .and_then(Value::as_array)
            .map(|s| s.iter().collect())
            .unwrap_or_default()
    };
    let init_total = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let mut initializing = false;
    for (index, status) in statuses("initContainerStatuses").into_iter().enumerate() {
        let terminated = status.pointer("/state/terminated");
        if terminated.is_some_and(|t| int(t, "/exitCode") == 0) {
            continue;
        }
        initializing = true;
        reason = match (terminated, status.pointer("/state/waiting")) {
            (Some(t), _) if !text(t, "/reason").is_empty() => format!("Init:{}", text(t, "/reason")),
            (Some(t), _) => format!("Init:ExitCode:{}", int(t, "/exitCode")),
            (None, Some(w)) if !text(w, "/reason").is_empty() && text(w, "/reason") != "PodInitializing" => {
                format!("Init:{}", text(w, "/reason"))
            }
            _ => format!("Init:{index}/{init_total}"),
        };
        break;
    }
    if !initializing {
        let mut running = false;
        for status in statuses("containerStatuses").into_iter().rev() {
            let state = status.get("state");
            let waiting = state.and_then(|s| s.get("waiting"));
            let terminated = state.and_then(|s| s.get("terminated"));
            if let Some(w) = waiting.filter(|w| !text(w, "/reason").is_empty()) {
                reason = text(w, "/reason").to_owned();
            } else if let Some(t) = terminated {
                reason = if !text(t, "/reason").is_empty() {
                    text(t, "/reason").to_owned()
                } else if int(t, "/signal") != 0 {
                    format!("Signal:{}", int(t, "/signal"))
                } else {
                    format!("ExitCode:{}", int(t, "/exitCode"))
                };
            } else if state.and_then(|s| s.get("running")).is_some()
                && status.get("ready").and_then(Value::as_bool) == Some(true)
            {
                running = true;
            }
        }
        if reason == "Completed" && running {
            let ready = pod
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| text(c, "/type") == "Ready" && text(c, "/status") == "True")
                });
            reason = if ready { "Running" } else { "NotReady" }.to_owned();
        }
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        reason = if text(pod, "/status/reason") == "NodeLost" {
            "Unknown"
        } else {
            "Terminating"
        }
        .to_owned();
    }
    reason
}

fn pod_cells(pod: &Value, name: Value, created: Value, now: Timestamp) -> Vec<Value> {
    let total = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let statuses: Vec<&Value> = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts = statuses
        .iter()
        .fold(0_i64, |sum, s| sum.saturating_add(int(s, "/restartCount")));
    let last_restart = statuses
        .iter()
        .filter_map(|s| {
            s.pointer("/lastState/terminated/finishedAt")
                .and_then(Value::as_str)
        })
        .filter_map(|t| t.parse::<Timestamp>().ok())
        .max();
    let mut restarts_cell = restarts.to_string();
    if let (true, Some(at)) = (restarts > 0, last_restart) {
        let _ = write!(
            restarts_cell,
            " ({} ago)",
            human_duration(now.as_second() - at.as_second())
        );
    }
    let gates = pod
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let gates_cell = if gates == 0 {
        "<none>".to_owned()
    } else {
        let met = json::items(pod, "/spec/readinessGates")
            .filter(|gate| {
                pod.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            text(c, "/type") == text(gate, "/conditionType") && text(c, "/status") == "True"
                        })
                    })
            })
            .count();
        format!("{met}/{gates}")
    };
    vec![
        name,
        Value::from(format!("{ready}/{total}")),
        Value::from(pod_status(pod)),
        Value::from(restarts_cell),
        created,
        or_none(text(pod, "/status/podIP")),
        or_none(text(pod, "/spec/nodeName")),
        or_none(text(pod, "/status/nominatedNodeName")),
        Value::from(gates_cell),
    ]
}

fn service_cells(service: &Value, name: Value, created: Value) -> Vec<Value> {
    let kind = match text(service, "/spec/type") {
        "" => "ClusterIP",
        kind => kind,
    };
    let cluster_ip = match text(service, "/spec/clusterIP") {
        "" => "<none>",
        ip => ip,
    };
    let mut external: Vec<String> = json::strings(service, "/spec/externalIPs");
    if kind == "ExternalName" {
        external.push(text(service, "/spec/externalName").to_owned());
    }
    let ports: Vec<String> = json::items(service, "/spec/ports")
        .map(|port| {
            let protocol = match text(port, "/protocol") {
                "" => "TCP",
                p => p,
            };
            match int(port, "/nodePort") {
                0 => format!("{}/{protocol}", int(port, "/port")),
                node => format!("{}:{node}/{protocol}", int(port, "/port")),
            }
        })
        .collect();
    let selector = match pairs(service.pointer("/spec/selector")).as_str() {
        "<none>" => "<none>".to_owned(),
        pairs => pairs.to_owned(),
    };
    vec![
        name,
        Value::from(kind),
        Value::from(cluster_ip),
        or_none(&external.join(",")),
        or_none(&ports.join(",")),
        created,
        Value::from(selector),
    ]
}

fn event_cells(info: &ResourceInfo, event: &Value, name: Value, now: Timestamp) -> Vec<Value> {
    let core = info.group.is_empty();
    let regarding = if core { "/involvedObject" } else { "/regarding" };
    let object = format!(
        "{}/{}",
        text(event, &format!("{regarding}/kind")).to_ascii_lowercase(),
        text(event, &format!("{regarding}/name"))
    );
    let (controller, instance) = if core {
        match text(event, "/reportingComponent") {
            "" => (text(event, "/source/component"), text(event, "/source/host")),
            component => (component, text(event, "/reportingInstance")),
        }
    } else {
        (
            text(event, "/reportingController"),
            text(event, "/reportingInstance"),
        )
    };
    let source = match (controller.is_empty(), instance.is_empty()) {
        (true, _) => String::new(),
        (false, true) => controller.to_owned(),
        (false, false) => format!("{controller}, {instance}"),
    };
    let (message, first, last, count) = if core {
        (
            text(event, "/message"),
            event.get("firstTimestamp").and_then(Value::as_str),
            event
                .get("lastTimestamp")
                .and_then(Value::as_str)
                .or_else(|| event.get("eventTime").and_then(Value::as_str)),
            int(event, "/count"),
        )
    } else {
        let series = event.get("series");
        (
            text(event, "/note"),
            event
                .get("deprecatedFirstTimestamp")
                .and_then(Value::as_str)
                .or_else(|| event.get("eventTime").and_then(Value::as_str)),
            series
                .and_then(|s| s.get("lastObservedTime"))
                .and_then(Value::as_str)
                .or_else(|| event.get("deprecatedLastTimestamp").and_then(Value::as_str))
                .or_else(|| event.get("eventTime").and_then(Value::as_str)),
            series.map_or_else(|| int(event, "/deprecatedCount").max(1), |s| int(s, "/count")),
        )
    };
    let first = first.or(last);
    vec![
        Value::from(since(last, now)),
        Value::from(text(event, "/type")),
        Value::from(text(event, "/reason")),
        Value::from(object),
        Value::from(text(event, &format!("{regarding}/fieldPath"))),
        Value::from(source),
        Value::from(message),
        Value::from(since(first, now)),
        Value::from(count.max(1).to_string()),
        name,
    ]
}

fn job_cells(job: &Value, name: Value, created: Value, now: Timestamp) -> Vec<Value> {
    let condition = |kind: &str| {
        job.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| text(c, "/type") == kind && text(c, "/status") == "True")
            })
    };
    let status = if condition("Complete") {
        "Complete"
    } else if condition("Failed") {
        "Failed"
    } else if job.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if condition("FailureTarget") {
        "FailureTarget"
    } else if condition("Suspended") {
        "Suspended"
    } else if condition("SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let succeeded = int(job, "/status/succeeded");
    let completions = match job.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(wanted) => format!("{succeeded}/{wanted}"),
        None => {
            let parallelism = job
                .pointer("/spec/parallelism")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            if parallelism > 1 {
                format!("{succeeded}/1 of {parallelism}")
            } else {
                format!("{succeeded}/1")
            }
        }
    };
    let start = job.pointer("/status/startTime").and_then(Value::as_str);
    let end = job
        .pointer("/status/completionTime")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or(now);
    let duration = match start.and_then(|t| t.parse::<Timestamp>().ok()) {
        Some(start) => human_duration(end.as_second() - start.as_second()),
        None => String::new(),
    };
    let mut cells = vec![
        name,
        Value::from(status),
        Value::from(completions),
        Value::from(duration),
        created,
    ];
    cells.extend(workload_cells(job));
    cells
}

fn binding_cells(binding: &Value, name: Value, created: Value) -> Vec<Value> {
    let role = format!(
        "{}/{}",
        text(binding, "/roleRef/kind"),
        text(binding, "/roleRef/name")
    );
    let subjects: Vec<&Value> = binding
        .get("subjects")
        .and_then(Value::as_array)
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    let of_kind = |kind: &str| {
        subjects
            .iter()
            .filter(|s| text(s, "/kind") == kind)
            .map(|s| match kind {
                "ServiceAccount" => format!("{}/{}", text(s, "/namespace"), text(s, "/name")),
                _ => text(s, "/name").to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        name,
        Value::from(role),
        created,
        Value::from(of_kind("User")),
        Value::from(of_kind("Group")),
        Value::from(of_kind("ServiceAccount")),
    ]
}

/// A custom resource's printer-column cell: the value at the column's JSONPath (fields, `[n]` and `[*]`;
/// several values joined with commas), an age for a `date` column, null where nothing is found.
fn printer_cell(column: &Column, object: &Value, now: Timestamp) -> Value {
    let Some(path) = column.path.as_deref() else {
        return Value::Null;
    };
    let found = json_path(object, path);
    let value = match found.as_slice() {
        [] => return Value::Null,
        [one] => (*one).clone(),
        many => Value::from(
            many.iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(","),
        ),
    };
    match (column.kind, &value) {
        ("date", Value::String(time)) => Value::from(since(Some(time), now)),
        _ => value,
    }
}

/// The values a simple JSONPath (`.a.b`, `.a[0].b`, `.a[*].b`, with or without `{}`) selects.
fn json_path<'v>(object: &'v Value, path: &str) -> Vec<&'v Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut current = vec![object];
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (field, index) = match segment.split_once('[') {
            Some((field, rest)) => (field, Some(rest.trim_end_matches(']'))),
            None => (segment, None),
        };
        let mut next = Vec::new();
        for value in current {
            let Some(value) = (if field.is_empty() {
                Some(value)
            } else {
                value.get(field)
            }) else {
                continue;
            };
            match index {
                None => next.push(value),
                Some("*") => next.extend(value.as_array().into_iter().flatten()),
                Some(at) => {
                    if let Some(item) = at.parse::<usize>().ok().and_then(|at| value.get(at)) {
                        next.push(item);
                    }
                }
            }
        }
        current = next;
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_print_as_kubectl_prints_them() {
        for (seconds, printed) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (10_799, "179m"),
            (10_800, "3h"),
            (11_100, "3h5m"),
            (8 * 3600, "8h"),
            (47 * 3600 + 59, "47h"),
            (48 * 3600, "2d"),
            (50 * 3600, "2d2h"),
            (8 * 86_400, "8d"),
            (730 * 86_400, "2y"),
            (731 * 86_400, "2y1d"),
            (8 * 365 * 86_400, "8y"),
        ] {
            assert_eq!(human_duration(seconds), printed, "{seconds} s");
        }
    }

    #[test]
    fn pod_status_follows_the_containers() {
        let crashing = json!({
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": false, "restartCount": 3,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
            ]}
        });
        assert_eq!(pod_status(&crashing), "CrashLoopBackOff");
        let initializing = json!({
            "spec": {"initContainers": [{"name": "i"}, {"name": "j"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "state": {"terminated": {"exitCode": 0}}},
                {"name": "j", "state": {"running": {}}}
            ]}
        });
        assert_eq!(pod_status(&initializing), "Init:1/2");
        let deleted = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}});
        assert_eq!(pod_status(&deleted), "Terminating");
    }

    #[test]
    fn selectors_and_paths_read_as_kubectl_shows_them() {
        let selector_value = json!({
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "c", "operator": "In", "values": ["x", "y"]},
                                 {"key": "d", "operator": "DoesNotExist"}]
        });
        assert_eq!(selector(Some(&selector_value)), "a=1,b=2,c in (x,y),!d");
        assert_eq!(selector(Some(&json!({}))), "<none>");
        let object = json!({"status": {"state": "ready", "items": [{"n": 1}, {"n": 2}]}});
        assert_eq!(json_path(&object, ".status.state"), [&json!("ready")]);
        assert_eq!(json_path(&object, "{.status.items[*].n}"), [&json!(1), &json!(2)]);
        assert_eq!(json_path(&object, ".status.items[1].n"), [&json!(2)]);
        assert!(json_path(&object, ".spec.none").is_empty());
    }
}
