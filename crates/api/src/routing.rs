//! Which NVIDIADriver installs the driver on each GPU node: a pure function of the GPU nodes' labels and
//! the NVIDIADrivers, with NVIDIA's rules (`internal/nvidiadriver/nvidiadriver.go`, `AssignOwners`):
//!
//! - the one non-default NVIDIADriver whose node selector ([`NVIDIADriverSpec::effective_node_selector`])
//!   matches the node wins;
//! - several match: a conflict, and the node gets no owner from this routing (NVIDIA fails closed; the
//!   operator leaves the node's `nvidia.com/gpu-operator.driver.owner` label and its running driver alone);
//! - none matches: the `default: true` NVIDIADriver, when there is exactly one; with several defaults the
//!   node is a conflict between them, and each default is in error;
//! - no default either: the node is unmatched (the operator removes the routing label).
//!
//! NVIDIADrivers being deleted take no part, as in NVIDIA's operator, so their nodes fall to the others.
//! Validity is not judged here: a driver whose spec fails validation still keeps the nodes it selects, so a
//! typo never hands them to the default driver (which would replace their driver pods).
//!
//! [`NVIDIADriverSpec::effective_node_selector`]: crate::nvidia_driver::NVIDIADriverSpec::effective_node_selector

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::nvidia_driver::NVIDIADriver;

/// The routing of every GPU node to an NVIDIADriver, and what went wrong, by node and by driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverRouting {
    /// The NVIDIADriver of each node that has exactly one, by node name: the value its
    /// `nvidia.com/gpu-operator.driver.owner` label should have.
    pub owners: BTreeMap<String, String>,
    /// Nodes claimed by several NVIDIADrivers (several non-default selectors match, or no selector matches
    /// and there are several defaults), with the names of those drivers, sorted. These nodes keep whatever
    /// owner they have.
    pub conflicts: BTreeMap<String, Vec<String>>,
    /// GPU nodes no NVIDIADriver selects, with no default to fall back to: they should have no owner.
    pub unmatched: BTreeSet<String>,
    /// The default NVIDIADrivers when there are more than one (an error for each of them), sorted.
    pub duplicate_defaults: Vec<String>,
    /// What each NVIDIADriver taking part got, by its name (also drivers that got no node).
    pub drivers: BTreeMap<String, DriverNodes>,
}

/// The routing as one NVIDIADriver sees it: for its status and events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverNodes {
    /// Nodes routed to this driver.
    pub nodes: BTreeSet<String>,
    /// Nodes this driver claims together with others, with the other drivers' names, sorted.
    pub conflicts: BTreeMap<String, Vec<String>>,
    /// The other default NVIDIADrivers, when this one is a default and not the only one.
    pub other_defaults: Vec<String>,
}

/// Something a user must fix for one NVIDIADriver to get all the nodes it selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoutingProblem {
    /// The node is also selected by other NVIDIADrivers.
    NodeAlsoSelectedBy {
        /// The node.
        node: String,
        /// The other drivers.
        others: Vec<String>,
    },
    /// Other NVIDIADrivers are defaults too.
    SeveralDefaults {
        /// The other defaults.
        others: Vec<String>,
    },
}

impl fmt::Display for RoutingProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeAlsoSelectedBy { node, others } => write!(
                f,
                "node {node} is also selected by NVIDIADriver {}; it keeps its current driver until only one \
                 NVIDIADriver's nodeSelector matches it",
                others.join(", ")
            ),
            Self::SeveralDefaults { others } => write!(
                f,
                "NVIDIADriver {} is also default: true; at most one NVIDIADriver may be the default, so nodes \
                 no nodeSelector matches keep their current driver",
                others.join(", ")
            ),
        }
    }
}

impl DriverNodes {
    /// Every problem of this driver, in a stable order: the defaults first, then nodes by name.
    pub fn problems(&self) -> Vec<RoutingProblem> {
        let defaults = (!self.other_defaults.is_empty()).then(|| RoutingProblem::SeveralDefaults {
            others: self.other_defaults.clone(),
        });
        defaults
            .into_iter()
            .chain(
                self.conflicts
                    .iter()
                    .map(|(node, others)| RoutingProblem::NodeAlsoSelectedBy {
                        node: node.clone(),
                        others: others.clone(),
                    }),
            )
            .collect()
    }
}

impl DriverRouting {
    /// The NVIDIADriver a node is routed to, if exactly one.
    pub fn owner(&self, node: &str) -> Option<&str> {
        self.owners.get(node).map(String::as_str)
    }

    /// What a driver got; `None` for a driver that took no part (unknown, or being deleted).
    pub fn driver(&self, name: &str) -> Option<&DriverNodes> {
        self.drivers.get(name)
    }
}

/// Routes each GPU node (name and labels) to an NVIDIADriver. Pass every NVIDIADriver in the cluster,
/// valid or not; those with a deletion timestamp are left out.
pub fn route_nodes<'a, L: crate::read::Labels + ?Sized + 'a>(
    gpu_nodes: impl IntoIterator<Item = (&'a str, &'a L)>,
    drivers: &[&NVIDIADriver],
) -> DriverRouting {
    let mut live: Vec<(&str, &NVIDIADriver)> = drivers
        .iter()
        .filter(|driver| driver.metadata.deletion_timestamp.is_none())
        .map(|driver| (driver.metadata.name.as_deref().unwrap_or_default(), *driver))
        .collect();
    live.sort_by_key(|(name, _)| *name);
    let selectors: Vec<(&str, BTreeMap<String, String>)> = live
        .iter()
        .filter(|(_, driver)| !driver.spec.default)
        .map(|(name, driver)| (*name, driver.spec.effective_node_selector()))
        .collect();
    let defaults: Vec<&str> = live
        .iter()
        .filter(|(_, driver)| driver.spec.default)
        .map(|(name, _)| *name)
        .collect();

    let mut routing = DriverRouting {
        drivers: live
            .iter()
            .map(|(name, _)| ((*name).to_owned(), DriverNodes::default()))
            .collect(),
        ..DriverRouting::default()
    };
    if defaults.len() > 1 {
        routing.duplicate_defaults = defaults.iter().map(|d| (*d).to_owned()).collect();
        for name in &defaults {
            if let Some(view) = routing.drivers.get_mut(*name) {
                view.other_defaults = others(&defaults, name);
            }
        }
    }

    for (node, labels) in gpu_nodes {
        let matching: Vec<&str> = selectors
            .iter()
            .filter(|(_, selector)| {
                selector
                    .iter()
                    .all(|(k, v)| labels.get_label(k) == Some(v.as_str()))
            })
            .map(|(name, _)| *name)
            .collect();
        let claimants = if matching.is_empty() { &defaults } else { &matching };
        match claimants.as_slice() {
            [] => {
                routing.unmatched.insert(node.to_owned());
            }
            [owner] => {
                routing.owners.insert(node.to_owned(), (*owner).to_owned());
                if let Some(view) = routing.drivers.get_mut(*owner) {
                    view.nodes.insert(node.to_owned());
                }
            }
            several => {
                routing
                    .conflicts
                    .insert(node.to_owned(), several.iter().map(|d| (*d).to_owned()).collect());
                // Several defaults are reported once per driver, not once per node.
                if !matching.is_empty() {
                    for name in several {
                        if let Some(view) = routing.drivers.get_mut(*name) {
                            view.conflicts.insert(node.to_owned(), others(several, name));
                        }
                    }
                }
            }
        }
    }
    routing
}

fn others(names: &[&str], me: &str) -> Vec<String> {
    names
        .iter()
        .filter(|name| **name != me)
        .map(|name| (*name).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::labels::label_map as labels;
    use crate::nvidia_driver::NVIDIADriverSpec;

    fn driver(name: &str, default: bool, selector: &[(&str, &str)]) -> NVIDIADriver {
        let mut driver = NVIDIADriver::new(
            name,
            NVIDIADriverSpec {
                default,
                node_selector: (!selector.is_empty()).then(|| labels(selector)),
                ..NVIDIADriverSpec::default()
            },
        );
        driver.metadata.uid = Some(format!("uid-{name}"));
        driver
    }

    fn gpu(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut node = labels(&[("nvidia.com/gpu.present", "true")]);
        node.extend(labels(extra));
        node
    }

    fn route(nodes: &[(&str, BTreeMap<String, String>)], drivers: &[NVIDIADriver]) -> DriverRouting {
        let refs: Vec<&NVIDIADriver> = drivers.iter().collect();
        route_nodes(nodes.iter().map(|(name, labels)| (*name, labels)), &refs)
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    /// A table row: (case, drivers, expected outcome per node: the owner, `!a,b` for a conflict between
    /// a and b, or `-` for unmatched).
    type Case = (&'static str, Vec<NVIDIADriver>, Vec<(&'static str, &'static str)>);

    #[test]
    fn nodes_go_to_the_one_selecting_driver_else_the_default() {
        let a100 = ("a100", gpu(&[("pool", "a100")]));
        let h100 = ("h100", gpu(&[("pool", "h100")]));
        let plain = ("plain", gpu(&[]));
        let cases: Vec<Case> = vec![
            (
                "only a default: every GPU node",
                vec![driver("default", true, &[])],
                vec![("a100", "default"), ("h100", "default"), ("plain", "default")],
            ),
            (
                "a selecting driver wins over the default",
                vec![
                    driver("default", true, &[]),
                    driver("a", false, &[("pool", "a100")]),
                ],
                vec![("a100", "a"), ("h100", "default"), ("plain", "default")],
            ),
            (
                "no default: unselected nodes are unmatched",
                vec![driver("a", false, &[("pool", "a100")])],
                vec![("a100", "a"), ("h100", "-"), ("plain", "-")],
            ),
            (
                "a non-default driver without a selector takes every GPU node",
                vec![driver("default", true, &[]), driver("all", false, &[])],
                vec![("a100", "all"), ("h100", "all"), ("plain", "all")],
            ),
            (
                "two selecting drivers conflict; the default does not break the tie",
                vec![
                    driver("default", true, &[]),
                    driver("all", false, &[]),
                    driver("a", false, &[("pool", "a100")]),
                ],
                vec![("a100", "!a,all"), ("h100", "all"), ("plain", "all")],
            ),
            (
                "every selector key must match",
                vec![driver("a", false, &[("pool", "a100"), ("zone", "x")])],
                vec![("a100", "-"), ("h100", "-"), ("plain", "-")],
            ),
            (
                "several defaults: nodes no selector matches are conflicts",
                vec![
                    driver("d2", true, &[]),
                    driver("d1", true, &[]),
                    driver("h", false, &[("pool", "h100")]),
                ],
                vec![("a100", "!d1,d2"), ("h100", "h"), ("plain", "!d1,d2")],
            ),
            (
                "no drivers at all",
                vec![],
                vec![("a100", "-"), ("h100", "-"), ("plain", "-")],
            ),
        ];
        let nodes = [a100, h100, plain];
        for (case, drivers, expected) in cases {
            let routing = route(&nodes, &drivers);
            for (node, want) in expected {
                let got = match (routing.owner(node), routing.conflicts.get(node)) {
                    (Some(owner), None) => owner.to_owned(),
                    (None, Some(names)) => format!("!{}", names.join(",")),
                    (None, None) if routing.unmatched.contains(node) => "-".to_owned(),
                    other => panic!("{case}: node {node} is in several outcomes: {other:?}"),
                };
                assert_eq!(got, want, "{case}: node {node}");
            }
        }
    }

    #[test]
    fn each_driver_sees_its_nodes_and_who_it_conflicts_with() {
        let nodes = [
            ("n1", gpu(&[("pool", "a")])),
            ("n2", gpu(&[("pool", "a"), ("fast", "yes")])),
            ("n3", gpu(&[])),
        ];
        let drivers = [
            driver("default", true, &[]),
            driver("pool-a", false, &[("pool", "a")]),
            driver("fast", false, &[("fast", "yes")]),
            driver("idle", false, &[("pool", "none")]),
        ];
        let routing = route(&nodes, &drivers);

        let pool_a = routing.driver("pool-a").unwrap();
        assert_eq!(pool_a.nodes, BTreeSet::from(["n1".to_owned()]));
        assert_eq!(
            pool_a.conflicts,
            BTreeMap::from([("n2".to_owned(), strings(&["fast"]))])
        );
        assert_eq!(
            pool_a
                .problems()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "node n2 is also selected by NVIDIADriver fast; it keeps its current driver until only one \
              NVIDIADriver's nodeSelector matches it"
            ]
        );
        let fast = routing.driver("fast").unwrap();
        assert!(fast.nodes.is_empty());
        assert_eq!(
            fast.conflicts,
            BTreeMap::from([("n2".to_owned(), strings(&["pool-a"]))])
        );
        assert_eq!(
            routing.driver("default").unwrap().nodes,
            BTreeSet::from(["n3".to_owned()])
        );
        let idle = routing.driver("idle").unwrap();
        assert_eq!(
            idle,
            &DriverNodes::default(),
            "a driver with no node is still listed"
        );
        assert!(idle.problems().is_empty());
    }

    #[test]
    fn several_defaults_are_an_error_for_each_default() {
        let nodes = [("n1", gpu(&[]))];
        let drivers = [
            driver("b", true, &[]),
            driver("a", true, &[]),
            driver("c", true, &[]),
        ];
        let routing = route(&nodes, &drivers);
        assert_eq!(routing.duplicate_defaults, strings(&["a", "b", "c"]));
        assert_eq!(routing.conflicts["n1"], strings(&["a", "b", "c"]));
        let b = routing.driver("b").unwrap();
        assert_eq!(b.other_defaults, strings(&["a", "c"]));
        assert!(
            b.conflicts.is_empty(),
            "several defaults are said once, not per node"
        );
        assert_eq!(
            b.problems(),
            [RoutingProblem::SeveralDefaults {
                others: strings(&["a", "c"])
            }]
        );
    }

    #[test]
    fn drivers_being_deleted_take_no_part() {
        let nodes = [("n1", gpu(&[("pool", "a")]))];
        let mut leaving = driver("pool-a", false, &[("pool", "a")]);
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        let drivers = [driver("default", true, &[]), leaving];
        let routing = route(&nodes, &drivers);
        assert_eq!(routing.owner("n1"), Some("default"));
        assert!(routing.driver("pool-a").is_none());
    }

    #[test]
    fn the_result_does_not_depend_on_the_order_of_the_drivers() {
        let nodes = [("n1", gpu(&[]))];
        let forward = [driver("x", false, &[]), driver("y", false, &[])];
        let backward = [driver("y", false, &[]), driver("x", false, &[])];
        assert_eq!(route(&nodes, &forward), route(&nodes, &backward));
        assert_eq!(route(&nodes, &forward).conflicts["n1"], strings(&["x", "y"]));
    }
}
