//! Scenarios: a cluster and a timeline of things that happen to it — nodes joining, leaving or going
//! NotReady, a driver install failing, an XID error taking a GPU away, an operand crash-looping, slow
//! image pulls, a person labelling or tainting a node, or applying, patching or deleting any object (a
//! ClusterPolicy, an NVIDIADriver) as `kubectl` would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, VariantAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::cluster_spec::{ClusterSpec, NodePool};
use crate::spec_file::{self, FileError, Invalid};

/// A cluster and what happens to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// The cluster; the demo cluster when absent.
    #[serde(default)]
    pub cluster: Option<ClusterSpec>,
    /// Events, each at a time after the simulation starts.
    #[serde(default)]
    pub timeline: Vec<Event>,
}

/// Something that happens at a moment. YAML: `{at: 10s, <event>: ...}`, exactly one event per entry
/// (read by hand rather than with `#[serde(flatten)]`, so that an unknown event or two events in one
/// entry are named as such).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// When, after the start: `0s`, `1500ms`, `2m`.
    #[serde(with = "duration_text")]
    pub at: Duration,
    /// What.
    #[serde(flatten)]
    pub action: Action,
}

/// What happens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Action {
    /// Nodes of a pool join the cluster.
    NodeJoins {
        /// Pool name (from the cluster spec).
        pool: String,
        /// How many new nodes.
        #[serde(default = "one")]
        count: u32,
    },
    /// A node is removed from the cluster.
    NodeLeaves(String),
    /// A node's kubelet stops reporting: the node goes NotReady.
    NodeNotReady(String),
    /// A NotReady node comes back.
    NodeReady(String),
    /// Driver containers that start on this node from now on (of one driver version, or of any) fail to
    /// install the driver; one already running is not touched. YAML: `driverInstallFails: h100-1` or
    /// `driverInstallFails: {node: h100-1, version: 580.95.05}`.
    DriverInstallFails(DriverInstallFault),
    /// An XID error marks one GPU of a node unhealthy.
    Xid {
        /// The node.
        node: String,
        /// GPU index.
        gpu: u32,
        /// The XID code.
        #[serde(default = "default_xid")]
        code: u32,
    },
    /// An operand's main container keeps crashing on a node.
    CrashLoop {
        /// The node.
        node: String,
        /// Operand id from the catalogue, e.g. `gpu-feature-discovery`.
        operand: String,
    },
    /// Image pulls on a node take longer.
    SlowImagePulls {
        /// The node.
        node: String,
        /// The extra time.
        #[serde(with = "duration_text")]
        delay: Duration,
    },
    /// A person sets (or, with no value, removes) a node label.
    Label {
        /// The node.
        node: String,
        /// The key.
        key: String,
        /// The value; absent removes the label.
        #[serde(default)]
        value: Option<String>,
    },
    /// A person taints a node.
    Taint {
        /// The node.
        node: String,
        /// Key.
        key: String,
        /// Value.
        #[serde(default)]
        value: Option<String>,
        /// Effect.
        effect: String,
    },
    /// A person applies a whole manifest (server-side apply as [`SCENARIO_MANAGER`], forcing conflicts):
    /// `apply: {apiVersion: nvidia.com/v1, kind: ClusterPolicy, metadata: {name: ...}, spec: {...}}`. A
    /// namespaced object without a namespace goes to `default`.
    Apply(serde_json::Value),
    /// A person changes an object with a JSON merge patch:
    /// `patch: {apiVersion: nvidia.com/v1, kind: ClusterPolicy, name: cluster-policy, merge: {spec: ...}}`.
    Patch(ObjectPatch),
    /// A person deletes an object: `delete: {apiVersion: v1, kind: Pod, name: x, namespace: ml}`.
    Delete(ObjectRef),
}

/// Why a scenario file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioFileError {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file has a mistake (named by file, line, column and field path).
    #[error(transparent)]
    Invalid(FileError),
}

/// The field manager of the objects a scenario applies: `kubectl get -o yaml --show-managed-fields` tells
/// them from the operator's and the simulator's own writes.
pub const SCENARIO_MANAGER: &str = "gpu-sim-scenario";

/// Which driver installs fail on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DriverInstallFaultText")]
pub struct DriverInstallFault {
    /// The node.
    pub node: String,
    /// Only this driver version (the image tag's, `580.95.05`) fails; absent: every version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl DriverInstallFault {
    /// Every driver that starts on `node` fails to install.
    pub fn on(node: &str) -> Self {
        Self {
            node: node.to_owned(),
            version: None,
        }
    }

    /// Only drivers of `version` that start on `node` fail to install.
    pub fn of_version(node: &str, version: &str) -> Self {
        Self {
            node: node.to_owned(),
            version: Some(version.to_owned()),
        }
    }
}

/// The two ways a scenario writes a [`DriverInstallFault`].
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a node name, or {node: <node>, version: <driver version>}"
)]
enum DriverInstallFaultText {
    Node(String),
    #[serde(rename_all = "camelCase")]
    Version {
        node: String,
        #[serde(default)]
        version: Option<String>,
    },
}

impl From<DriverInstallFaultText> for DriverInstallFault {
    fn from(text: DriverInstallFaultText) -> Self {
        match text {
            DriverInstallFaultText::Node(node) => Self { node, version: None },
            DriverInstallFaultText::Version { node, version } => Self { node, version },
        }
    }
}

/// An object of any kind the server serves, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectRef {
    /// `v1`, `apps/v1`, `nvidia.com/v1`, ...
    #[serde(default)]
    pub api_version: String,
    /// `Pod`, `ClusterPolicy`, `NVIDIADriver`, ...
    #[serde(default)]
    pub kind: String,
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// Its namespace, for a namespaced kind (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A JSON merge patch of one object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectPatch {
    /// `v1`, `apps/v1`, `nvidia.com/v1`, ...
    #[serde(default)]
    pub api_version: String,
    /// `Pod`, `ClusterPolicy`, `NVIDIADriver`, ...
    #[serde(default)]
    pub kind: String,
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// Its namespace, for a namespaced kind (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The patch (RFC 7386): fields set, `null` removes.
    #[serde(default)]
    pub merge: serde_json::Value,
}

impl ObjectPatch {
    /// The object patched.
    pub fn target(&self) -> ObjectRef {
        ObjectRef {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

impl ObjectRef {
    /// The object an `apply` manifest names.
    pub fn of_manifest(manifest: &serde_json::Value) -> Self {
        let text = |pointer: &str| {
            manifest
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            api_version: text("/apiVersion"),
            kind: text("/kind"),
            name: text("/metadata/name"),
            namespace: Some(text("/metadata/namespace")).filter(|n| !n.is_empty()),
        }
    }

    /// The first required field that is empty, if one is, named as a scenario writes it (the name is
    /// `name_field`).
    fn missing(&self, name_field: &str) -> Option<String> {
        [
            ("apiVersion", &self.api_version),
            ("kind", &self.kind),
            (name_field, &self.name),
        ]
        .into_iter()
        .find(|(_, value)| value.is_empty())
        .map(|(field, _)| field.to_owned())
    }
}

fn one() -> u32 {
    1
}

impl Action {
    /// The event's key in a scenario: `nodeJoins`, `xid`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Action::NodeJoins { .. } => "nodeJoins",
            Action::NodeLeaves(_) => "nodeLeaves",
            Action::NodeNotReady(_) => "nodeNotReady",
            Action::NodeReady(_) => "nodeReady",
            Action::DriverInstallFails(_) => "driverInstallFails",
            Action::Xid { .. } => "xid",
            Action::CrashLoop { .. } => "crashLoop",
            Action::SlowImagePulls { .. } => "slowImagePulls",
            Action::Label { .. } => "label",
            Action::Taint { .. } => "taint",
            Action::Apply(_) => "apply",
            Action::Patch(_) => "patch",
            Action::Delete(_) => "delete",
        }
    }

    /// The node the action is about, if it is about one existing node.
    pub fn node(&self) -> Option<&str> {
        match self {
            Action::NodeJoins { .. } | Action::Apply(_) | Action::Patch(_) | Action::Delete(_) => None,
            Action::DriverInstallFails(fault) => Some(&fault.node),
            Action::NodeLeaves(node)
            | Action::NodeNotReady(node)
            | Action::NodeReady(node)
            | Action::Xid { node, .. }
            | Action::CrashLoop { node, .. }
            | Action::SlowImagePulls { node, .. }
            | Action::Label { node, .. }
            | Action::Taint { node, .. } => Some(node),
        }
    }
}

/// Names of `count` nodes joining `pool`: `<pool>-<index>` with the lowest indices not taken, as the
/// simulation names them.
pub fn joining_names(taken: &BTreeSet<String>, pool: &str, count: u32) -> Vec<String> {
    let mut names = Vec::new();
    let mut index = 0;
    while names.len() < count as usize {
        let name = format!("{pool}-{index}");
        if !taken.contains(&name) {
            names.push(name);
        }
        index += 1;
    }
    names
}

fn default_xid() -> u32 {
    79
}

impl Scenario {
    /// Parses a scenario and [checks](Self::check) it; a mistake is named by line, column and field path.
    pub fn from_yaml(text: &str) -> Result<Self, FileError> {
        spec_file::parse(text, Scenario::check)
    }

    /// Reads and parses a scenario file; a mistake is named by file, line, column and field path.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ScenarioFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
            .map_err(|error| ScenarioFileError::Invalid(error.in_file(path.display().to_string())))
    }

    /// Checks what the types cannot: the cluster, and that every event fits the cluster at its moment:
    /// pools and operands exist, every node named exists then (one of the cluster's, or one that joined
    /// earlier and has not left), a GPU index is below the node's GPU count, `apply`, `patch` and
    /// `delete` name an object. Events happen in time order; at equal times, in the order written (as
    /// `gpu-sim up` plays them).
    pub fn check(&self) -> Result<(), Invalid> {
        let cluster = self.cluster();
        cluster.check().map_err(|error| error.invalid("cluster."))?;
        let mut nodes: BTreeMap<String, &NodePool> = cluster.nodes().collect();
        let mut left: BTreeMap<String, (Duration, usize)> = BTreeMap::new();
        let mut order: Vec<usize> = (0..self.timeline.len()).collect();
        order.sort_by_key(|index| self.timeline[*index].at);
        for (position, &index) in order.iter().enumerate() {
            let Event { at, action } = &self.timeline[index];
            let path = format!("timeline[{index}].{}", action.kind());
            let invalid = |field: &str, problem: String| {
                let path = if field.is_empty() {
                    path.clone()
                } else {
                    format!("{path}.{field}")
                };
                Err(Invalid::at(path, problem))
            };
            if let Some(node) = action.node()
                && !nodes.contains_key(node)
            {
                let field = if matches!(
                    action,
                    Action::NodeLeaves(_) | Action::NodeNotReady(_) | Action::NodeReady(_)
                ) {
                    ""
                } else {
                    "node"
                };
                let rest: Vec<(usize, &Event)> = order[position + 1..]
                    .iter()
                    .map(|i| (*i, &self.timeline[*i]))
                    .collect();
                let why = match (left.get(node), joins_later(&nodes, &rest, node)) {
                    (Some((when, by)), _) => {
                        format!("it left at {} (timeline[{by}])", duration_text::format(*when))
                    }
                    (None, Some((when, by))) => format!(
                        "it joins only at {} (timeline[{by}])",
                        duration_text::format(when)
                    ),
                    (None, None) => format!("the cluster's nodes are {}", node_ranges(&cluster)),
                };
                return invalid(
                    field,
                    format!(
                        "node {node:?} is not in the cluster at {}: {why}",
                        duration_text::format(*at)
                    ),
                );
            }
            match action {
                Action::NodeJoins { pool, count } => {
                    let Some(pool) = cluster.node_pools.iter().find(|p| &p.name == pool) else {
                        let pools: Vec<&str> = cluster.node_pools.iter().map(|p| p.name.as_str()).collect();
                        return invalid(
                            "pool",
                            format!(
                                "pool {pool:?} is not in the cluster; its pools are {}",
                                pools.join(", ")
                            ),
                        );
                    };
                    if *count == 0 {
                        return invalid("count", "must be at least 1".into());
                    }
                    let taken = nodes.keys().cloned().collect();
                    for name in joining_names(&taken, &pool.name, *count) {
                        left.remove(&name);
                        nodes.insert(name, pool);
                    }
                }
                Action::NodeLeaves(node) => {
                    nodes.remove(node);
                    left.insert(node.clone(), (*at, index));
                }
                Action::Xid { node, gpu, .. } => {
                    let gpus = nodes[node].gpu.as_ref().map_or(0, |spec| spec.count);
                    if *gpu >= gpus {
                        let has = match gpus {
                            0 => "it has no GPUs".to_owned(),
                            1 => "it has 1 GPU, index 0".to_owned(),
                            n => format!("it has {n} GPUs, 0 to {}", n - 1),
                        };
                        return invalid("gpu", format!("GPU {gpu} is not on node {node:?}: {has}"));
                    }
                }
                Action::CrashLoop { operand, .. } if gpuop_api::Operand::from_id(operand).is_none() => {
                    let ids: Vec<&str> = gpuop_api::Operand::all().map(gpuop_api::Operand::id).collect();
                    return invalid(
                        "operand",
                        format!("{operand:?} is not an operand id; the ids are {}", ids.join(", ")),
                    );
                }
                Action::Taint { effect, .. }
                    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect.as_str()) =>
                {
                    return invalid(
                        "effect",
                        format!("effect {effect:?} is not one of NoSchedule, PreferNoSchedule, NoExecute"),
                    );
                }
                Action::Apply(manifest) => {
                    if !manifest.is_object() {
                        return invalid(
                            "",
                            "a whole manifest (apiVersion, kind, metadata, ...) is required".into(),
                        );
                    }
                    if let Some(field) = ObjectRef::of_manifest(manifest).missing("metadata.name") {
                        return invalid(&field, "is required".into());
                    }
                }
                Action::Patch(patch) => {
                    if let Some(field) = patch.target().missing("name") {
                        return invalid(&field, "is required".into());
                    }
                    if !patch.merge.is_object() {
                        return invalid("merge", "an object (the JSON merge patch) is required".into());
                    }
                }
                Action::Delete(object) => {
                    if let Some(field) = object.missing("name") {
                        return invalid(&field, "is required".into());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The scenario's cluster (the demo cluster when none is given).
    pub fn cluster(&self) -> ClusterSpec {
        self.cluster.clone().unwrap_or_else(ClusterSpec::demo)
    }
}

/// When `node`, absent now, joins in the `rest` of the timeline (time and index in the file), if it does.
fn joins_later(
    nodes: &BTreeMap<String, &NodePool>,
    rest: &[(usize, &Event)],
    node: &str,
) -> Option<(Duration, usize)> {
    let mut taken: BTreeSet<String> = nodes.keys().cloned().collect();
    for (index, event) in rest {
        match &event.action {
            Action::NodeJoins { pool, count } => {
                for name in joining_names(&taken, pool, *count) {
                    if name == node {
                        return Some((event.at, *index));
                    }
                    taken.insert(name);
                }
            }
            Action::NodeLeaves(name) => {
                taken.remove(name);
            }
            _ => {}
        }
    }
    None
}

/// The cluster's nodes as a person reads them: `a100-0, a100-1, h100-0 to h100-999`.
fn node_ranges(cluster: &ClusterSpec) -> String {
    let ranges: Vec<String> = cluster
        .node_pools
        .iter()
        .map(|pool| match pool.count {
            0 => format!("none of pool {}", pool.name),
            1 => format!("{}-0", pool.name),
            2 => format!("{0}-0, {0}-1", pool.name),
            n => format!("{0}-0 to {0}-{1}", pool.name, n - 1),
        })
        .collect();
    ranges.join(", ")
}

/// The kinds of event, as a scenario writes them (`nodeJoins`, `xid`, ...): the variants of [`Action`].
pub fn event_kinds() -> &'static [&'static str] {
    /// A deserializer that only records the variants [`Action`]'s derived `Deserialize` asks for.
    struct Probe(&'static [&'static str]);
    impl<'de> Deserializer<'de> for &mut Probe {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("probe"))
        }
        fn deserialize_enum<V: Visitor<'de>>(
            self,
            _: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = variants;
            Err(de::Error::custom("probe"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
            unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
        }
    }
    let mut probe = Probe(&[]);
    let _ = Action::deserialize(&mut probe);
    probe.0
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EventVisitor;
        impl<'de> Visitor<'de> for EventVisitor {
            type Value = Event;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event: `at` and one of ")?;
                f.write_str(&event_kinds().join(", "))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
                let kinds = event_kinds();
                let mut at = None;
                let mut action: Option<(String, Action)> = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "at" {
                        if at.is_some() {
                            return Err(de::Error::duplicate_field("at"));
                        }
                        at = Some(map.next_value::<At>()?.0);
                    } else if let Some((first, _)) = &action {
                        return Err(de::Error::custom(if kinds.contains(&key.as_str()) {
                            format!(
                                "two events in one entry, `{first}` and `{key}`: give each its own entry \
                                 (events at the same time happen in the order written)"
                            )
                        } else {
                            format!("unknown key `{key}`: an entry has `at` and one event")
                        }));
                    } else if kinds.contains(&key.as_str()) {
                        let event = Action::deserialize(OneEvent {
                            kind: &key,
                            map: &mut map,
                        })?;
                        action = Some((key, event));
                    } else {
                        return Err(de::Error::custom(format!(
                            "unknown event `{key}`; the events are {}",
                            kinds.join(", ")
                        )));
                    }
                }
                let Some(at) = at else {
                    return Err(de::Error::custom(
                        "`at` is missing: when the event happens after the start (500ms, 10s, 2m)",
                    ));
                };
                let Some((_, action)) = action else {
                    return Err(de::Error::custom(format!(
                        "no event; give one of {}",
                        kinds.join(", ")
                    )));
                };
                Ok(Event { at, action })
            }
        }
        deserializer.deserialize_map(EventVisitor)
    }
}

/// An event's time.
struct At(Duration);

impl<'de> Deserialize<'de> for At {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        duration_text::deserialize(deserializer).map(At)
    }
}

/// The value of an entry's event key, read as the [`Action`] variant the key names, so that the
/// variant's own fields are checked as they are written (unknown ones refused) and errors keep their
/// place in the file.
struct OneEvent<'a, A> {
    kind: &'a str,
    map: &'a mut A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for OneEvent<'_, A> {
    type Error = A::Error;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> EnumAccess<'de> for OneEvent<'_, A> {
    type Error = A::Error;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), A::Error> {
        let variant = seed.deserialize(de::value::StrDeserializer::<A::Error>::new(self.kind))?;
        Ok((variant, self))
    }
}

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for OneEvent<'_, A> {
    type Error = A::Error;
    fn unit_variant(self) -> Result<(), A::Error> {
        self.map.next_value::<de::IgnoredAny>().map(|_| ())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(Shaped { fields: &[], visitor })
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(Shaped { fields, visitor })
    }
}

/// A struct variant's value, read as a struct with its fields.
struct Shaped<V> {
    fields: &'static [&'static str],
    visitor: V,
}

impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Shaped<V> {
    type Value = V::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        if self.fields.is_empty() {
            deserializer.deserialize_seq(self.visitor)
        } else {
            deserializer.deserialize_struct("", self.fields, self.visitor)
        }
    }
}

/// Durations written as `250ms`, `10s`, `2m` or `1h`.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Parses `250ms`, `10s`, `2m`, `1h`.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: u64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s, 2m"))?;
        match unit {
            "ms" => Ok(Duration::from_millis(number)),
            "s" | "" => Ok(Duration::from_secs(number)),
            "m" => Ok(Duration::from_secs(number * 60)),
            "h" => Ok(Duration::from_secs(number * 3600)),
            _ => Err(format!(
                "{text:?} has an unknown unit {unit:?}; use ms, s, m or h"
            )),
        }
    }

    /// Writes a duration as a person would: `1500ms`, `10s`, `2m`.
    pub fn format(duration: Duration) -> String {
        let millis = duration.as_millis();
        if millis > 0 && millis.is_multiple_of(60_000) {
            format!("{}m", millis / 60_000)
        } else if millis.is_multiple_of(1000) {
            format!("{}s", millis / 1000)
        } else {
            format!("{millis}ms")
        }
    }

    /// Serde: deserializes a duration from its text.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// Serde: serializes a duration as milliseconds.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{}ms", duration.as_millis()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_event_parses() {
        let scenario = Scenario::from_yaml(
            "timeline:
  - {at: 0s, driverInstallFails: h100-0}
  - {at: 500ms, slowImagePulls: {node: h100-1, delay: 30s}}
  - {at: 5s, crashLoop: {node: a100-0, operand: gpu-feature-discovery}}
  - {at: 10s, nodeJoins: {pool: a100, count: 2}}
  - {at: 20s, xid: {node: a100-1, gpu: 3}}
  - {at: 30s, nodeNotReady: h100-1}
  - {at: 40s, nodeReady: h100-1}
  - {at: 50s, label: {node: a100-0, key: nvidia.com/gpu.deploy.device-plugin, value: 'false'}}
  - {at: 55s, label: {node: a100-0, key: nvidia.com/gpu.deploy.device-plugin}}
  - {at: 1m, taint: {node: a100-1, key: maintenance, effect: NoSchedule}}
  - {at: 2m, nodeLeaves: a100-1}
",
        )
        .unwrap();
        assert_eq!(scenario.cluster(), ClusterSpec::demo());
        assert_eq!(scenario.timeline.len(), 11);
        assert_eq!(scenario.timeline[1].at, Duration::from_millis(500));
        assert_eq!(
            scenario.timeline[4].action,
            Action::Xid {
                node: "a100-1".into(),
                gpu: 3,
                code: 79
            }
        );
        assert_eq!(scenario.timeline[9].at, Duration::from_secs(60));
        assert_eq!(
            scenario.timeline[8].action,
            Action::Label {
                node: "a100-0".into(),
                key: "nvidia.com/gpu.deploy.device-plugin".into(),
                value: None
            }
        );
    }

    #[test]
    fn mistakes_are_named() {
        let error = |yaml: &str| Scenario::from_yaml(yaml).unwrap_err().to_string();
        assert!(
            error("timeline: [{at: 1s, nodeJoins: {pool: b200}}]")
                .contains(r#"timeline[0].nodeJoins.pool: pool "b200" is not in the cluster; its pools are a100, h100, l4-host-driver, t4-reserved, cpu"#)
        );
        assert!(
            error("timeline: [{at: 1s, crashLoop: {node: a100-0, operand: plugin}}]")
                .contains(r#""plugin" is not an operand id"#)
        );
        assert!(error("timeline: [{at: soon, nodeLeaves: x}]").contains(r#""soon" is not a duration"#));
        assert!(
            error("timeline: [{at: 1s, xid: {node: a100-7, gpu: 0}}]")
                .contains(r#"timeline[0].xid.node: node "a100-7" is not in the cluster at 1s"#)
        );
        // A node that joined earlier may be named; one that left may not.
        Scenario::from_yaml(
            "timeline: [{at: 2s, xid: {node: a100-2, gpu: 0}}, {at: 1s, nodeJoins: {pool: a100}}]",
        )
        .unwrap();
        assert!(
            error("timeline: [{at: 1s, nodeLeaves: h100-0}, {at: 1m, nodeReady: h100-0}]")
                .contains(r#"timeline[1].nodeReady: node "h100-0" is not in the cluster at 1m: it left at 1s (timeline[0])"#)
        );
        assert!(error("timeline: [{at: 1s, explode: x}]").contains("explode"));
    }

    #[test]
    fn a_driver_install_fault_names_a_node_and_optionally_a_version() {
        let scenario = Scenario::from_yaml(
            "timeline:
  - {at: 0s, driverInstallFails: h100-0}
  - {at: 1s, driverInstallFails: {node: h100-1, version: 580.95.05}}
",
        )
        .unwrap();
        assert_eq!(
            scenario.timeline[0].action,
            Action::DriverInstallFails(DriverInstallFault {
                node: "h100-0".into(),
                version: None
            })
        );
        assert_eq!(
            scenario.timeline[1].action,
            Action::DriverInstallFails(DriverInstallFault {
                node: "h100-1".into(),
                version: Some("580.95.05".into())
            })
        );
        let error = |yaml: &str| Scenario::from_yaml(yaml).unwrap_err().to_string();
        assert!(
            error("timeline: [{at: 1s, driverInstallFails: {node: h100-9}}]").contains(
                r#"timeline[0].driverInstallFails.node: node "h100-9" is not in the cluster at 1s"#
            )
        );
        assert!(
            error("timeline: [{at: 1s, driverInstallFails: [h100-0]}]")
                .contains("a node name, or {node: <node>, version: <driver version>}")
        );
    }

    #[test]
    fn objects_are_applied_patched_and_deleted_by_kind_and_name() {
        let scenario = Scenario::from_yaml(
            "timeline:
  - at: 0s
    apply:
      apiVersion: nvidia.com/v1
      kind: ClusterPolicy
      metadata: {name: cluster-policy}
      spec:
        driver: {version: 570.124.06, upgradePolicy: {autoUpgrade: true, maxParallelUpgrades: 3, maxUnavailable: 25%}}
  - at: 90s
    patch:
      apiVersion: nvidia.com/v1
      kind: ClusterPolicy
      name: cluster-policy
      merge: {spec: {driver: {version: 580.95.05}}}
  - {at: 2m, delete: {apiVersion: v1, kind: ConfigMap, name: x, namespace: ml}}
",
        )
        .unwrap();
        let Action::Apply(manifest) = &scenario.timeline[0].action else {
            panic!("{:?}", scenario.timeline[0].action)
        };
        assert_eq!(
            manifest["spec"]["driver"]["upgradePolicy"]["maxParallelUpgrades"],
            3
        );
        assert_eq!(
            manifest["spec"]["driver"]["upgradePolicy"]["maxUnavailable"],
            "25%"
        );
        assert_eq!(
            ObjectRef::of_manifest(manifest),
            ObjectRef {
                api_version: "nvidia.com/v1".into(),
                kind: "ClusterPolicy".into(),
                name: "cluster-policy".into(),
                namespace: None
            }
        );
        let Action::Patch(patch) = &scenario.timeline[1].action else {
            panic!("{:?}", scenario.timeline[1].action)
        };
        assert_eq!(patch.target().kind, "ClusterPolicy");
        assert_eq!(patch.merge["spec"]["driver"]["version"], "580.95.05");
        assert_eq!(
            scenario.timeline[2].action,
            Action::Delete(ObjectRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "x".into(),
                namespace: Some("ml".into())
            })
        );
    }

    #[test]
    fn object_actions_missing_what_names_an_object_are_refused() {
        let error = |yaml: &str| Scenario::from_yaml(yaml).unwrap_err().to_string();
        assert!(
            error("timeline: [{at: 1s, nodeLeaves: h100-0}, {at: 2s, apply: {apiVersion: v1, kind: ConfigMap, metadata: {}}}]")
                .contains("timeline[1].apply.metadata.name: is required"),
        );
        assert!(
            error("timeline: [{at: 1s, apply: {kind: ConfigMap, metadata: {name: x}}}]")
                .contains("timeline[0].apply.apiVersion: is required")
        );
        assert!(
            error("timeline: [{at: 1s, patch: {apiVersion: nvidia.com/v1, name: p, merge: {}}}]")
                .contains("timeline[0].patch.kind: is required")
        );
        assert!(
            error("timeline: [{at: 1s, patch: {apiVersion: nvidia.com/v1, kind: ClusterPolicy, name: p}}]")
                .contains("timeline[0].patch.merge: an object")
        );
        assert!(
            error("timeline: [{at: 1s, delete: {apiVersion: v1, kind: Pod}}]")
                .contains("timeline[0].delete.name: is required")
        );
        assert!(
            error("timeline: [{at: 1s, delete: {apiVersion: v1, kind: Pod, name: p, nmespace: x}}]")
                .contains("timeline[0].delete.nmespace: unknown field `nmespace`, expected one of apiVersion, kind, name, namespace")
        );
    }

    /// The newcomer's mistakes from issue 12: each names the line and column, the entry, what was found
    /// and what is accepted.
    #[test]
    fn timeline_mistakes_name_the_place_what_was_found_and_what_is_accepted() {
        let error = |yaml: &str| Scenario::from_yaml(yaml).unwrap_err().to_string();
        let kinds = "nodeJoins, nodeLeaves, nodeNotReady, nodeReady, driverInstallFails, xid, crashLoop, \
                     slowImagePulls, label, taint, apply, patch, delete";
        assert_eq!(event_kinds().join(", "), kinds);
        assert_eq!(
            error("timeline:\n  - {at: 5s, nodeReboots: a100-0}\n"),
            format!("line 2 column 5: timeline[0]: unknown event `nodeReboots`; the events are {kinds}")
        );
        assert_eq!(
            error("timeline:\n  - {at: 5s, nodeLeaves: a100-0, nodeJoins: {pool: a100}}\n"),
            "line 2 column 5: timeline[0]: two events in one entry, `nodeLeaves` and `nodeJoins`: give each \
             its own entry (events at the same time happen in the order written)"
        );
        assert_eq!(
            error("timeline:\n  - {at: 5s, xid: {node: a100-0, gpu: 1, cod: 3}}\n"),
            "line 2 column 42: timeline[0].xid.cod: unknown field `cod`, expected one of node, gpu, code"
        );
        assert_eq!(
            error("timline: []\n"),
            "line 1 column 1: timline: unknown field `timline`, expected one of cluster, timeline"
        );
        assert_eq!(
            error("timeline:\n  - {nodeLeaves: a100-0}\n"),
            "line 2 column 5: timeline[0]: `at` is missing: when the event happens after the start (500ms, 10s, 2m)"
        );
        assert_eq!(
            error("timeline:\n  - {at: 1s}\n"),
            format!("line 2 column 5: timeline[0]: no event; give one of {kinds}")
        );
        assert_eq!(
            error("cluster:\n  nodePools:\n    - name: a\n      os: debian-12\n"),
            r#"line 4 column 7: cluster.nodePools[0].os: "debian-12" is not one of ubuntu-22.04, ubuntu-24.04, rhel-9.<minor>"#
        );
    }

    #[test]
    fn values_that_do_not_fit_the_cluster_at_that_moment_are_refused() {
        let error = |yaml: &str| Scenario::from_yaml(yaml).unwrap_err().to_string();
        assert_eq!(
            error("timeline:\n  - {at: 5s, xid: {node: a100-0, gpu: 9}}\n"),
            r#"line 2 column 34: timeline[0].xid.gpu: GPU 9 is not on node "a100-0": it has 8 GPUs, 0 to 7"#
        );
        assert_eq!(
            error("timeline: [{at: 5s, xid: {node: l4-host-driver-0, gpu: 4}}]"),
            r#"line 1 column 51: timeline[0].xid.gpu: GPU 4 is not on node "l4-host-driver-0": it has 4 GPUs, 0 to 3"#
        );
        assert!(
            error("timeline: [{at: 5s, xid: {node: cpu-0, gpu: 0}}]")
                .ends_with(r#"GPU 0 is not on node "cpu-0": it has no GPUs"#)
        );
        Scenario::from_yaml("timeline: [{at: 5s, xid: {node: a100-0, gpu: 7}}]").unwrap();
        // A joined node has its pool's GPUs.
        Scenario::from_yaml(
            "timeline: [{at: 1s, nodeJoins: {pool: l4-host-driver}}, {at: 2s, xid: {node: l4-host-driver-1, gpu: 3}}]",
        )
        .unwrap();
        assert_eq!(
            error(
                "timeline:\n  - {at: 2s, xid: {node: a100-2, gpu: 0}}\n  - {at: 3s, nodeJoins: {pool: a100}}\n"
            ),
            r#"line 2 column 20: timeline[0].xid.node: node "a100-2" is not in the cluster at 2s: it joins only at 3s (timeline[1])"#
        );
        assert_eq!(
            error("timeline:\n  - {at: 2s, label: {node: a100-7, key: k}}\n"),
            "line 2 column 22: timeline[0].label.node: node \"a100-7\" is not in the cluster at 2s: the cluster's \
             nodes are a100-0, a100-1, h100-0, h100-1, l4-host-driver-0, t4-reserved-0, cpu-0"
        );
        assert!(
            error("timeline: [{at: 1s, nodeJoins: {pool: a100, count: 0}}]")
                .ends_with("timeline[0].nodeJoins.count: must be at least 1")
        );
    }

    #[test]
    fn a_scenario_file_names_itself_in_its_mistakes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reboot.yaml");
        std::fs::write(&path, "timeline:\n  - {at: 5s, nodeReboots: a100-0}\n").unwrap();
        let error = Scenario::from_file(&path).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "{}:2:5: timeline[0]: unknown event `nodeReboots`",
                path.display()
            )),
            "{error}"
        );
    }
}
