//! What a chaos run injects and when: a pure function of the seed, the run's length and the cluster's
//! starting nodes. The planner keeps its own model of the nodes (joins, leaves, taints) and the policy's
//! switches, so every step names its target; the same seed gives the same schedule on every machine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use gpuop_api::Operand;
use gpuop_fakeserver::Verb;

use crate::scenario::joining_names;

/// A small deterministic generator (splitmix64): the schedule must not depend on a library's algorithm.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A duration from `low` to `high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }

    /// One of `items` (`None` when empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let index = usize::try_from(self.below(items.len() as u64)).unwrap_or(0);
        items.get(index)
    }
}

/// Which operator replica a kill hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillTarget {
    /// Whichever replica holds the Lease when the kill comes (a leader failover).
    Leader,
    /// Whichever replica does not.
    Follower,
}

/// An error the API answers the operator with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// 500 InternalError.
    Internal,
    /// 429 TooManyRequests, with `Retry-After: 1`.
    TooManyRequests,
}

/// A change to the ClusterPolicy, as a person makes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyEdit {
    /// `spec.<switch>.enabled` set to this value.
    Switch {
        /// The switch: `dcgmExporter`, `gfd`, `nodeStatusExporter`.
        field: &'static str,
        /// The new value.
        enabled: bool,
    },
    /// `spec.devicePlugin.env` set to one variable with this value: the device plugin's pods roll.
    DevicePluginEnv(u64),
}

/// One thing done to the cluster.
#[derive(Clone, Debug, PartialEq)]
pub enum Injection {
    /// The operator's requests (of one verb and resource, or all) fail at a rate for a while.
    ApiErrors {
        /// Only this verb.
        verb: Option<Verb>,
        /// Only this plural resource.
        resource: Option<&'static str>,
        /// Share of matching requests failed.
        rate: f64,
        /// What they get.
        error: ApiError,
        /// For how long.
        lasts: Duration,
    },
    /// The operator's requests are slowed for a while.
    ApiLatency {
        /// Only this verb.
        verb: Option<Verb>,
        /// Added to each request.
        latency: Duration,
        /// For how long.
        lasts: Duration,
    },
    /// Every open watch stream ends.
    DropWatches,
    /// Every open watch stream ends and every resource version expires: watches resume with `410 Gone`.
    Compact,
    /// A replica is killed (`SIGKILL`) and started again after a while.
    KillReplica {
        /// Which one.
        target: KillTarget,
        /// When it starts again.
        restart_after: Duration,
    },
    /// The leading replica's Lease requests hang (each is answered only this long after it was sent),
    /// longer than the Lease lasts: the other replica takes over while the stalled one still runs.
    LeaseStalls {
        /// How long each of its Lease requests hangs, and for how long new ones do.
        lasts: Duration,
    },
    /// A GPU node joins.
    NodeJoins {
        /// Its name.
        node: String,
    },
    /// A node is deleted.
    NodeLeaves {
        /// Its name.
        node: String,
    },
    /// The driver container of a node restarts and fails to install the driver from now on.
    DriverFails {
        /// The node.
        node: String,
    },
    /// An XID error marks a GPU of a node unhealthy.
    Xid {
        /// The node.
        node: String,
        /// The GPU.
        gpu: u32,
    },
    /// A person sets a node label.
    PersonLabels {
        /// The node.
        node: String,
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// A person taints a node `NoSchedule` with a taint no operand tolerates.
    PersonTaints {
        /// The node.
        node: String,
    },
    /// A person removes the taint again.
    PersonUntaints {
        /// The node.
        node: String,
    },
    /// A person sets the image of a managed DaemonSet's first container (drift the operator must repair).
    PersonEditsDaemonSet {
        /// The operand's component label (`app.kubernetes.io/component`).
        component: &'static str,
    },
    /// A person deletes a managed DaemonSet.
    PersonDeletesDaemonSet {
        /// The operand's component label.
        component: &'static str,
    },
    /// A person edits the ClusterPolicy.
    PolicyEdit(PolicyEdit),
}

/// The taint a person puts on nodes: no operand tolerates it.
pub const PERSON_TAINT: &str = "example.com/chaos";

/// The image a person's edit of a managed DaemonSet sets.
pub const EDITED_IMAGE: &str = "registry.example.com/edited-by-a-person:chaos";

/// Node labels a person sets: values the operator must never overwrite.
fn person_labels() -> [(&'static str, &'static [&'static str]); 3] {
    [
        (Operand::DcgmExporter.info().deploy_label, &["false", "true"]),
        (
            Operand::GpuFeatureDiscovery.info().deploy_label,
            &["false", "true"],
        ),
        ("example.com/team", &["ml", "research", "infra"]),
    ]
}

/// Components (`app.kubernetes.io/component`) of DaemonSets a person edits or deletes: those the default
/// policy always deploys.
const EDITED_COMPONENTS: [&str; 3] = ["device-plugin", "container-toolkit", "operator-validator"];

impl fmt::Display for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scope = |verb: &Option<Verb>, resource: &Option<&str>| {
            format!(
                "{} {}",
                verb.map_or("every verb".to_owned(), |v| v.metric_label().to_owned()),
                resource.unwrap_or("of every resource")
            )
        };
        match self {
            Self::ApiErrors {
                verb,
                resource,
                rate,
                error,
                lasts,
            } => write!(
                f,
                "API answers {} to {:.0}% of the operator's {} for {:.1}s",
                match error {
                    ApiError::Internal => "500",
                    ApiError::TooManyRequests => "429",
                },
                rate * 100.0,
                scope(verb, resource),
                lasts.as_secs_f64()
            ),
            Self::ApiLatency { verb, latency, lasts } => write!(
                f,
                "API latency {} ms on the operator's {} for {:.1}s",
                latency.as_millis(),
                scope(verb, &None),
                lasts.as_secs_f64()
            ),
            Self::DropWatches => f.write_str("every watch dropped"),
            Self::Compact => f.write_str("every watch dropped and every version expired (410 Gone)"),
            Self::KillReplica {
                target,
                restart_after,
            } => write!(
                f,
                "kill -9 the {} replica, restart it after {:.1}s",
                match target {
                    KillTarget::Leader => "leading",
                    KillTarget::Follower => "following",
                },
                restart_after.as_secs_f64()
            ),
            Self::LeaseStalls { lasts } => write!(
                f,
                "the leading replica's Lease requests hang for {:.1}s",
                lasts.as_secs_f64()
            ),
            Self::NodeJoins { node } => write!(f, "node {node} joins"),
            Self::NodeLeaves { node } => write!(f, "node {node} leaves"),
            Self::DriverFails { node } => {
                write!(f, "the driver on {node} restarts and fails to install")
            }
            Self::Xid { node, gpu } => write!(f, "XID 79 on {node} GPU {gpu}"),
            Self::PersonLabels { node, key, value } => {
                write!(f, "a person labels {node} {key}={value}")
            }
            Self::PersonTaints { node } => {
                write!(f, "a person taints {node} {PERSON_TAINT}:NoSchedule")
            }
            Self::PersonUntaints { node } => write!(f, "a person removes the taint of {node}"),
            Self::PersonEditsDaemonSet { component } => {
                write!(f, "a person sets the image of DaemonSet {component}")
            }
            Self::PersonDeletesDaemonSet { component } => {
                write!(f, "a person deletes DaemonSet {component}")
            }
            Self::PolicyEdit(PolicyEdit::Switch { field, enabled }) => {
                write!(f, "a person sets ClusterPolicy spec.{field}.enabled={enabled}")
            }
            Self::PolicyEdit(PolicyEdit::DevicePluginEnv(value)) => write!(
                f,
                "a person sets ClusterPolicy spec.devicePlugin.env CHAOS_EDIT={value}"
            ),
        }
    }
}

/// One step of a schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// When, from the start of the run.
    pub at: Duration,
    /// What.
    pub injection: Injection,
}

/// The planner's model of the cluster.
struct Model {
    pool: String,
    nodes: BTreeSet<String>,
    tainted: BTreeSet<String>,
    driver_failed: BTreeSet<String>,
    switches: BTreeMap<&'static str, bool>,
}

impl Model {
    fn node(&self, rng: &mut Rng) -> Option<String> {
        let nodes: Vec<&String> = self.nodes.iter().collect();
        rng.pick(&nodes).map(|n| (*n).clone())
    }
}

/// The first step comes this long after the start, so that the replicas are up and one leads.
const FIRST_STEP: Duration = Duration::from_secs(3);

/// The schedule of a run of `duration` on a cluster that starts with `nodes` of `pool`: a step every 0.5
/// to 4 seconds, each drawn from the seed. Nodes never fall below one.
pub fn plan(seed: u64, duration: Duration, pool: &str, nodes: &[String]) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut model = Model {
        pool: pool.to_owned(),
        nodes: nodes.iter().cloned().collect(),
        tainted: BTreeSet::new(),
        driver_failed: BTreeSet::new(),
        switches: BTreeMap::from([
            ("dcgmExporter", true),
            ("gfd", true),
            ("nodeStatusExporter", false),
        ]),
    };
    let mut steps = Vec::new();
    let mut at = FIRST_STEP;
    while at < duration {
        if let Some(injection) = draw(&mut rng, &mut model) {
            steps.push(Step { at, injection });
        }
        at += rng.millis(500, 4_000);
    }
    steps
}

fn draw(rng: &mut Rng, model: &mut Model) -> Option<Injection> {
    const RESOURCES: [Option<&str>; 5] = [
        None,
        Some("nodes"),
        Some("daemonsets"),
        Some("clusterpolicies"),
        Some("leases"),
    ];
    const VERBS: [Option<Verb>; 4] = [None, Some(Verb::Patch), Some(Verb::Apply), Some(Verb::List)];
    Some(match rng.below(100) {
        0..=14 => Injection::ApiErrors {
            verb: *rng.pick(&VERBS)?,
            resource: *rng.pick(&RESOURCES)?,
            rate: [0.2, 0.5, 1.0][usize::try_from(rng.below(3)).unwrap_or(0)],
            error: if rng.below(2) == 0 {
                ApiError::Internal
            } else {
                ApiError::TooManyRequests
            },
            lasts: rng.millis(2_000, 12_000),
        },
        15..=21 => Injection::ApiLatency {
            verb: *rng.pick(&VERBS)?,
            latency: rng.millis(50, 1_500),
            lasts: rng.millis(1_000, 6_000),
        },
        22..=27 => Injection::DropWatches,
        28..=32 => Injection::Compact,
        38..=40 => Injection::LeaseStalls {
            lasts: rng.millis(16_000, 25_000),
        },
        33..=37 => Injection::KillReplica {
            target: if rng.below(3) == 0 {
                KillTarget::Follower
            } else {
                KillTarget::Leader
            },
            restart_after: rng.millis(500, 5_000),
        },
        41..=46 => {
            let node = joining_names(&model.nodes, &model.pool, 1).pop()?;
            model.nodes.insert(node.clone());
            Injection::NodeJoins { node }
        }
        47..=50 if model.nodes.len() > 1 => {
            let node = model.node(rng)?;
            model.nodes.remove(&node);
            model.tainted.remove(&node);
            model.driver_failed.remove(&node);
            Injection::NodeLeaves { node }
        }
        51..=53 => {
            // At most one node whose driver fails at a time: the rest of the cluster must converge.
            if !model.driver_failed.is_empty() {
                return None;
            }
            let node = model.node(rng)?;
            model.driver_failed.insert(node.clone());
            Injection::DriverFails { node }
        }
        54..=57 => Injection::Xid {
            node: model.node(rng)?,
            gpu: u32::try_from(rng.below(8)).unwrap_or(0),
        },
        58..=67 => {
            let person_labels = person_labels();
            let (key, values) = rng.pick(&person_labels)?;
            Injection::PersonLabels {
                node: model.node(rng)?,
                key: (*key).to_owned(),
                value: (*rng.pick(values)?).to_owned(),
            }
        }
        68..=73 => {
            let node = model.node(rng)?;
            if model.tainted.remove(&node) {
                Injection::PersonUntaints { node }
            } else {
                model.tainted.insert(node.clone());
                Injection::PersonTaints { node }
            }
        }
        74..=79 => Injection::PersonEditsDaemonSet {
            component: rng.pick(&EDITED_COMPONENTS)?,
        },
        80..=84 => Injection::PersonDeletesDaemonSet {
            component: rng.pick(&EDITED_COMPONENTS)?,
        },
        85..=92 => {
            let fields: Vec<&'static str> = model.switches.keys().copied().collect();
            let field = *rng.pick(&fields)?;
            let enabled = !model.switches[field];
            model.switches.insert(field, enabled);
            Injection::PolicyEdit(PolicyEdit::Switch { field, enabled })
        }
        93..=99 => Injection::PolicyEdit(PolicyEdit::DevicePluginEnv(rng.below(1_000))),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<String> {
        (0..4).map(|i| format!("gpu-{i}")).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let one = plan(7, Duration::from_secs(120), "gpu", &nodes());
        assert_eq!(one, plan(7, Duration::from_secs(120), "gpu", &nodes()));
        assert_ne!(one, plan(8, Duration::from_secs(120), "gpu", &nodes()));
        assert!(one.len() >= 40, "a step every 0.5 to 4 s: {}", one.len());
        assert!(
            one.iter()
                .all(|s| s.at >= FIRST_STEP && s.at < Duration::from_secs(120))
        );
        assert!(one.windows(2).all(|w| w[0].at < w[1].at), "in time order");
    }

    #[test]
    fn every_kind_of_injection_comes_up_over_a_few_seeds() {
        let mut kinds = std::collections::HashSet::new();
        for seed in 0..5 {
            for step in plan(seed, Duration::from_secs(300), "gpu", &nodes()) {
                kinds.insert(std::mem::discriminant(&step.injection));
            }
        }
        assert_eq!(kinds.len(), 16, "every variant of Injection");
    }

    #[test]
    fn steps_name_only_nodes_the_cluster_has_then_and_never_empty_it() {
        for seed in 0..20 {
            let mut alive: BTreeSet<String> = nodes().into_iter().collect();
            for step in plan(seed, Duration::from_secs(300), "gpu", &nodes()) {
                match &step.injection {
                    Injection::NodeJoins { node } => assert!(alive.insert(node.clone()), "{node} is new"),
                    Injection::NodeLeaves { node } => {
                        assert!(alive.remove(node), "{node} was there");
                        assert!(!alive.is_empty());
                    }
                    Injection::DriverFails { node }
                    | Injection::Xid { node, .. }
                    | Injection::PersonLabels { node, .. }
                    | Injection::PersonTaints { node }
                    | Injection::PersonUntaints { node } => {
                        assert!(alive.contains(node), "seed {seed}: {node} at {:?}", step.at)
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn a_node_that_left_and_came_back_is_a_new_node_of_the_same_name() {
        let mut model = Model {
            pool: "gpu".into(),
            nodes: ["gpu-0".to_owned(), "gpu-2".to_owned()].into(),
            tainted: BTreeSet::new(),
            driver_failed: BTreeSet::new(),
            switches: BTreeMap::new(),
        };
        // The simulator names joining nodes the same way: the first free index of the pool.
        assert_eq!(joining_names(&model.nodes, &model.pool, 1), ["gpu-1"]);
        model.nodes.insert("gpu-1".into());
        assert_eq!(joining_names(&model.nodes, &model.pool, 1), ["gpu-3"]);
    }
}
