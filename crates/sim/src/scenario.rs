//! Scenarios: a cluster and a timeline of things that happen to it — nodes joining, leaving or going
//! NotReady, a driver install failing, an XID error taking a GPU away, an operand crash-looping, slow
//! image pulls, a person labelling or tainting a node, or applying, patching or deleting any object (a
//! ClusterPolicy, an NVIDIADriver) as `kubectl` would.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cluster_spec::{ClusterSpec, SpecError};

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

/// Something that happens at a moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
#[serde(rename_all = "camelCase")]
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
    /// Parses a scenario and checks its cluster and that every event names a known pool, operand or node:
    /// a node of the cluster, or one that joined earlier in the timeline and has not left.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let scenario: Scenario = serde_saphyr::from_str(text).map_err(|e| SpecError::Parse(e.to_string()))?;
        let cluster = scenario.cluster();
        cluster.check()?;
        let mut nodes: BTreeSet<String> = cluster.nodes().map(|(name, _)| name).collect();
        // Events happen in time order; at equal times, in the order written (as `gpu-sim up` plays them).
        let mut order: Vec<usize> = (0..scenario.timeline.len()).collect();
        order.sort_by_key(|index| scenario.timeline[*index].at);
        for index in order {
            let action = &scenario.timeline[index].action;
            let problem = match action {
                Action::NodeJoins { pool, count } => {
                    if cluster.node_pools.iter().any(|p| &p.name == pool) {
                        nodes.extend(joining_names(&nodes, pool, *count));
                        None
                    } else {
                        Some(format!("pool {pool:?} is not in the cluster"))
                    }
                }
                Action::CrashLoop { operand, .. } if gpuop_api::Operand::from_id(operand).is_none() => Some(
                    format!("{operand:?} is not an operand id (e.g. device-plugin, gpu-feature-discovery)"),
                ),
                Action::Taint { effect, .. }
                    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect.as_str()) =>
                {
                    Some(format!(
                        "effect {effect:?} is not one of NoSchedule, PreferNoSchedule, NoExecute"
                    ))
                }
                Action::Apply(manifest) => {
                    if manifest.is_object() {
                        ObjectRef::of_manifest(manifest)
                            .missing("metadata.name")
                            .map(|field| format!("apply.{field} is required"))
                    } else {
                        Some("apply: a whole manifest (apiVersion, kind, metadata, ...) is required".into())
                    }
                }
                Action::Patch(patch) => match patch.target().missing("name") {
                    Some(field) => Some(format!("patch.{field} is required")),
                    None if !patch.merge.is_object() => {
                        Some("patch.merge: an object (the JSON merge patch) is required".into())
                    }
                    None => None,
                },
                Action::Delete(object) => object
                    .missing("name")
                    .map(|field| format!("delete.{field} is required")),
                _ => None,
            };
            let problem = problem.or_else(|| {
                let node = action.node()?;
                (!nodes.contains(node)).then(|| {
                    format!(
                        "node {node:?} is not in the cluster at {}",
                        duration_text::format(scenario.timeline[index].at)
                    )
                })
            });
            if let Some(problem) = problem {
                return Err(SpecError::Parse(format!("timeline[{index}]: {problem}")));
            }
            if let Action::NodeLeaves(node) = action {
                nodes.remove(node);
            }
        }
        Ok(scenario)
    }

    /// The scenario's cluster (the demo cluster when none is given).
    pub fn cluster(&self) -> ClusterSpec {
        self.cluster.clone().unwrap_or_else(ClusterSpec::demo)
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
                .contains(r#"timeline[0]: pool "b200" is not in the cluster"#)
        );
        assert!(
            error("timeline: [{at: 1s, crashLoop: {node: x, operand: plugin}}]")
                .contains(r#""plugin" is not an operand id"#)
        );
        assert!(error("timeline: [{at: soon, nodeLeaves: x}]").contains(r#""soon" is not a duration"#));
        assert!(
            error("timeline: [{at: 1s, xid: {node: a100-7, gpu: 0}}]")
                .contains(r#"timeline[0]: node "a100-7" is not in the cluster at 1s"#)
        );
        // A node that joined earlier may be named; one that left may not.
        Scenario::from_yaml(
            "timeline: [{at: 2s, xid: {node: a100-2, gpu: 0}}, {at: 1s, nodeJoins: {pool: a100}}]",
        )
        .unwrap();
        assert!(
            error("timeline: [{at: 1s, nodeLeaves: h100-0}, {at: 1m, nodeReady: h100-0}]")
                .contains(r#"timeline[1]: node "h100-0" is not in the cluster at 1m"#)
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
            error("timeline: [{at: 1s, driverInstallFails: {node: h100-9}}]")
                .contains(r#"timeline[0]: node "h100-9" is not in the cluster at 1s"#)
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
                .contains("timeline[1]: apply.metadata.name is required"),
        );
        assert!(
            error("timeline: [{at: 1s, apply: {kind: ConfigMap, metadata: {name: x}}}]")
                .contains("timeline[0]: apply.apiVersion is required")
        );
        assert!(
            error("timeline: [{at: 1s, patch: {apiVersion: nvidia.com/v1, name: p, merge: {}}}]")
                .contains("timeline[0]: patch.kind is required")
        );
        assert!(
            error("timeline: [{at: 1s, patch: {apiVersion: nvidia.com/v1, kind: ClusterPolicy, name: p}}]")
                .contains("timeline[0]: patch.merge: an object")
        );
        assert!(
            error("timeline: [{at: 1s, delete: {apiVersion: v1, kind: Pod}}]")
                .contains("timeline[0]: delete.name is required")
        );
        assert!(
            error("timeline: [{at: 1s, delete: {apiVersion: v1, kind: Pod, name: p, nmespace: x}}]")
                .contains("nmespace")
        );
    }
}
