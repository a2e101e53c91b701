//! Scenarios: a cluster and a timeline of things that happen to it — nodes joining, leaving or going
//! NotReady, a driver install failing, an XID error taking a GPU away, an operand crash-looping, slow
//! image pulls, a person labelling or tainting a node.

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
    /// Driver containers on this node fail to install the driver.
    DriverInstallFails(String),
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
}

fn one() -> u32 {
    1
}

impl Action {
    /// The node the action is about, if it is about one existing node.
    pub fn node(&self) -> Option<&str> {
        match self {
            Action::NodeJoins { .. } => None,
            Action::NodeLeaves(node)
            | Action::NodeNotReady(node)
            | Action::NodeReady(node)
            | Action::DriverInstallFails(node)
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
}
