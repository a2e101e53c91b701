//! Whether a pod can go to a node, with Kubernetes' rules: node selector, required node affinity, taints
//! and tolerations, cordoned nodes. The operator counts the nodes an operand should run on with it, the
//! simulator's DaemonSet controller and scheduler place pods with it, and the doctor judges with it; none of
//! them counts from `desiredNumberScheduled`. The rules read a node through [`NodeRead`]: a `k8s_openapi`
//! Node or the operator's cache projection.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration};

use crate::read::NodeRead;

/// Why a pod cannot go to a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Misfit {
    /// The node lacks a label the pod's `nodeSelector` asks for, or has another value.
    NodeSelector {
        /// The label.
        key: String,
        /// The value the pod asks for.
        wanted: String,
        /// The node's value, if it has the label.
        found: Option<String>,
    },
    /// No term of the pod's required node affinity matches the node.
    NodeAffinity,
    /// The node has a taint the pod does not tolerate.
    Taint(Taint),
    /// The node is cordoned (only DaemonSet pods still go there).
    Unschedulable,
}

impl Misfit {
    /// Whether the node is *excluded*: the pod's node selector picks it, but a taint the pod does not tolerate
    /// or its required node affinity keeps the pod off. The DaemonSet controller does not count such a node
    /// (`desiredNumberScheduled` leaves it out); the operator's status and the doctor both name it.
    pub fn excludes(&self) -> bool {
        matches!(self, Misfit::Taint(_) | Misfit::NodeAffinity)
    }
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misfit::NodeSelector {
                key,
                wanted,
                found: Some(found),
            } => {
                write!(
                    f,
                    "node selector wants {key}={wanted}, the node has {key}={found}"
                )
            }
            Misfit::NodeSelector {
                key,
                wanted,
                found: None,
            } => {
                write!(f, "node selector wants {key}={wanted}, the node lacks the label")
            }
            Misfit::NodeAffinity => f.write_str("no term of the required node affinity matches the node"),
            Misfit::Taint(taint) => {
                let value = taint
                    .value
                    .as_deref()
                    .map(|v| format!("={v}"))
                    .unwrap_or_default();
                write!(f, "untolerated taint {}{value}:{}", taint.key, taint.effect)
            }
            Misfit::Unschedulable => f.write_str("the node is cordoned"),
        }
    }
}

/// Tolerations (taint key, effect) the DaemonSet controller adds to every DaemonSet pod, so that DaemonSets
/// run on nodes that are not ready, unreachable, under pressure or cordoned.
pub const DAEMONSET_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

/// The toleration the DaemonSet controller adds to host-network DaemonSet pods only; [`daemon_pod_fits`]
/// grants it to every DaemonSet pod.
pub const NETWORK_UNAVAILABLE_TOLERATION: (&str, &str) =
    ("node.kubernetes.io/network-unavailable", "NoSchedule");

/// Whether a DaemonSet pod with this spec belongs on the node (the DaemonSet controller's rule: cordoned
/// nodes still get DaemonSet pods).
pub fn daemon_pod_fits(node: &(impl NodeRead + ?Sized), spec: &PodSpec) -> Result<(), Misfit> {
    selectors_fit(node, spec)?;
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    for taint in node.taints() {
        let automatic = DAEMONSET_TOLERATIONS
            .iter()
            .chain([&NETWORK_UNAVAILABLE_TOLERATION])
            .any(|(key, effect)| taint.key == *key && taint.effect == *effect);
        if blocks(taint) && !automatic && !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Err(Misfit::Taint(taint.clone()));
        }
    }
    Ok(())
}

/// Whether an ordinary pod with this spec may be scheduled to the node (resources aside).
pub fn pod_fits(node: &(impl NodeRead + ?Sized), spec: &PodSpec) -> Result<(), Misfit> {
    selectors_fit(node, spec)?;
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if node.unschedulable() {
        let cordon = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        if !tolerations.iter().any(|t| tolerates(t, &cordon)) {
            return Err(Misfit::Unschedulable);
        }
    }
    for taint in node.taints() {
        if blocks(taint) && !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Err(Misfit::Taint(taint.clone()));
        }
    }
    Ok(())
}

/// Whether a toleration tolerates a taint.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_matches = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or_default();
    let operator = toleration
        .operator
        .as_deref()
        .filter(|o| !o.is_empty())
        .unwrap_or("Equal");
    if key.is_empty() {
        // An empty key with `Exists` tolerates everything (of the effect).
        return operator == "Exists" && effect_matches;
    }
    effect_matches
        && key == taint.key
        && match operator {
            "Exists" => true,
            _ => {
                toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
            }
        }
}

/// Whether the labels satisfy a node selector term's expressions (`matchFields` on `metadata.name` too).
pub fn term_matches(term: &NodeSelectorTerm, name: &str, labels: &BTreeMap<String, String>) -> bool {
    term_matches_with(term, name, |key| labels.get(key).map(String::as_str))
}

/// [`term_matches`], reading each label through `label`.
pub fn term_matches_with<'a>(
    term: &NodeSelectorTerm,
    name: &str,
    label: impl Fn(&str) -> Option<&'a str>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // A term with no requirements matches nothing, as in Kubernetes.
    (!expressions.is_empty() || !fields.is_empty())
        && expressions.iter().all(|r| requirement_matches(r, label(&r.key)))
        && fields
            .iter()
            .all(|r| requirement_matches(r, (r.key == "metadata.name").then_some(name)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

fn selectors_fit(node: &(impl NodeRead + ?Sized), spec: &PodSpec) -> Result<(), Misfit> {
    for (key, wanted) in spec.node_selector.iter().flatten() {
        let found = node.label(key);
        if found != Some(wanted.as_str()) {
            return Err(Misfit::NodeSelector {
                key: key.clone(),
                wanted: wanted.clone(),
                found: found.map(str::to_owned),
            });
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(required) = required
        && !required
            .node_selector_terms
            .iter()
            .any(|term| term_matches_with(term, node.name(), |key| node.label(key)))
    {
        return Err(Misfit::NodeAffinity);
    }
    Ok(())
}

/// Taints that keep pods off a node; `PreferNoSchedule` only discourages.
fn blocks(taint: &Taint) -> bool {
    taint.effect == "NoSchedule" || taint.effect == "NoExecute"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::label_map;
    use k8s_openapi::api::core::v1::{Affinity, Node, NodeAffinity, NodeSelector, NodeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(labels: &[(&str, &str)], taints: &[(&str, Option<&str>, &str)], cordoned: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(label_map(labels)),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                taints: Some(
                    taints
                        .iter()
                        .map(|(key, value, effect)| Taint {
                            key: (*key).to_owned(),
                            value: value.map(str::to_owned),
                            effect: (*effect).to_owned(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    fn toleration(
        key: Option<&str>,
        operator: &str,
        value: Option<&str>,
        effect: Option<&str>,
    ) -> Toleration {
        Toleration {
            key: key.map(str::to_owned),
            operator: Some(operator.to_owned()),
            value: value.map(str::to_owned),
            effect: effect.map(str::to_owned),
            ..Toleration::default()
        }
    }

    fn spec(selector: &[(&str, &str)], tolerations: Vec<Toleration>) -> PodSpec {
        PodSpec {
            node_selector: Some(label_map(selector)),
            tolerations: Some(tolerations),
            ..PodSpec::default()
        }
    }

    #[test]
    fn toleration_semantics_follow_kubernetes() {
        let taint = Taint {
            key: "nvidia.com/gpu".into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        let cases = [
            (
                toleration(Some("nvidia.com/gpu"), "Exists", None, Some("NoSchedule")),
                true,
            ),
            (toleration(Some("nvidia.com/gpu"), "Exists", None, None), true),
            (
                toleration(Some("nvidia.com/gpu"), "Equal", Some("true"), Some("NoSchedule")),
                true,
            ),
            (
                toleration(Some("nvidia.com/gpu"), "Equal", Some("false"), Some("NoSchedule")),
                false,
            ),
            (
                toleration(Some("nvidia.com/gpu"), "Exists", None, Some("NoExecute")),
                false,
            ),
            (toleration(None, "Exists", None, None), true),
            (toleration(None, "Equal", None, None), false),
            (toleration(Some("other"), "Exists", None, None), false),
        ];
        for (toleration, expected) in cases {
            assert_eq!(tolerates(&toleration, &taint), expected, "{toleration:?}");
        }
    }

    #[test]
    fn daemon_pods_ignore_cordons_and_node_conditions_but_not_other_taints() {
        let gpu_selector = [("nvidia.com/gpu.deploy.driver", "true")];
        let operand = spec(
            &gpu_selector,
            vec![toleration(
                Some("nvidia.com/gpu"),
                "Exists",
                None,
                Some("NoSchedule"),
            )],
        );
        let labelled = [("nvidia.com/gpu.deploy.driver", "true")];
        assert_eq!(
            daemon_pod_fits(&node(&labelled, &[], true), &operand),
            Ok(()),
            "cordoned nodes keep DaemonSet pods"
        );
        let not_ready = [("node.kubernetes.io/not-ready", None, "NoExecute")];
        assert_eq!(
            daemon_pod_fits(&node(&labelled, &not_ready, false), &operand),
            Ok(())
        );
        let gpu_taint = [("nvidia.com/gpu", Some("present"), "NoSchedule")];
        assert_eq!(
            daemon_pod_fits(&node(&labelled, &gpu_taint, false), &operand),
            Ok(())
        );
        let dedicated = [("dedicated", Some("training"), "NoSchedule")];
        let misfit = daemon_pod_fits(&node(&labelled, &dedicated, false), &operand).unwrap_err();
        assert_eq!(
            misfit.to_string(),
            "untolerated taint dedicated=training:NoSchedule"
        );
        let soft = [("dedicated", Some("training"), "PreferNoSchedule")];
        assert_eq!(daemon_pod_fits(&node(&labelled, &soft, false), &operand), Ok(()));
        let misfit = daemon_pod_fits(
            &node(&[("nvidia.com/gpu.deploy.driver", "false")], &[], false),
            &operand,
        )
        .unwrap_err();
        assert_eq!(
            misfit.to_string(),
            "node selector wants nvidia.com/gpu.deploy.driver=true, the node has nvidia.com/gpu.deploy.driver=false"
        );
    }

    #[test]
    fn ordinary_pods_respect_cordons() {
        let pod = spec(&[], vec![]);
        assert_eq!(pod_fits(&node(&[], &[], true), &pod), Err(Misfit::Unschedulable));
        assert_eq!(pod_fits(&node(&[], &[], false), &pod), Ok(()));
        let not_ready = [("node.kubernetes.io/not-ready", None, "NoExecute")];
        assert!(matches!(
            pod_fits(&node(&[], &not_ready, false), &pod),
            Err(Misfit::Taint(_))
        ));
    }

    #[test]
    fn required_node_affinity_terms_are_ored_and_expressions_anded() {
        let requirement = |key: &str, operator: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        };
        let term = |expressions: Vec<NodeSelectorRequirement>| NodeSelectorTerm {
            match_expressions: Some(expressions),
            match_fields: None,
        };
        let with_affinity = |terms: Vec<NodeSelectorTerm>| PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms,
                    }),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        };
        let gpu_node = node(&[("pool", "a100"), ("gpus", "8")], &[], false);
        let fits = |terms| daemon_pod_fits(&gpu_node, &with_affinity(terms)).is_ok();
        assert!(fits(vec![term(vec![
            requirement("pool", "In", &["a100", "h100"]),
            requirement("gpus", "Gt", &["4"])
        ])]));
        assert!(!fits(vec![term(vec![
            requirement("pool", "In", &["a100"]),
            requirement("gpus", "Lt", &["4"])
        ])]));
        assert!(fits(vec![
            term(vec![requirement("pool", "NotIn", &["a100"])]),
            term(vec![requirement("gpus", "Exists", &[])])
        ]));
        assert!(fits(vec![term(vec![requirement("zone", "DoesNotExist", &[])])]));
        assert!(
            !fits(vec![NodeSelectorTerm::default()]),
            "an empty term matches nothing"
        );
        let by_name = NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![requirement("metadata.name", "In", &["n1"])]),
        };
        assert!(fits(vec![by_name]));
    }

    #[test]
    fn only_a_node_the_selector_picks_can_be_excluded() {
        let tainted = node(&[("gpu", "true")], &[("dedicated", None, "NoSchedule")], false);
        let selecting = PodSpec {
            node_selector: Some(BTreeMap::from([("gpu".to_owned(), "true".to_owned())])),
            ..PodSpec::default()
        };
        let excluded = |node: &Node, spec: &PodSpec| daemon_pod_fits(node, spec).is_err_and(|m| m.excludes());
        assert!(excluded(&tainted, &selecting), "a taint keeps the pod off");
        let other = node(&[("gpu", "false")], &[("dedicated", None, "NoSchedule")], false);
        assert!(!excluded(&other, &selecting), "not selected is not excluded");
        assert!(Misfit::NodeAffinity.excludes());
        assert!(!Misfit::Unschedulable.excludes());
    }
}
