//! The readiness judge: per enabled operand, the nodes it should run on and the nodes where it is ready,
//! from the rendered DaemonSets and the cached nodes, pods and ControllerRevisions. Pure.
//!
//! "Should run" is decided from the rendered pod templates against each node (selectors, affinity, taints),
//! never from `desiredNumberScheduled`, which silently leaves out nodes whose taints the pods do not
//! tolerate. "Ready" means a pod of the operand's DaemonSet runs on the node, is Ready, and comes from the
//! DaemonSet's latest revision: a node still running an outdated driver is not counted as done.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpuop_api::labels::GpuDetection;
use gpuop_api::placement::{Misfit, daemon_pod_fits};
use gpuop_api::upgrade::observe::{is_pod_ready, latest_revision, revision_of};
use gpuop_api::{OPERANDS, Operand};
use gpuop_render::Rendered;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};

use crate::status::OperandObservation;

/// What the cluster looks like to the judge: the caches' contents, shared rather than copied.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// Every node.
    pub nodes: &'a [Arc<Node>],
    /// The operator's DaemonSets.
    pub daemonsets: &'a [Arc<DaemonSet>],
    /// The operand pods.
    pub pods: &'a [Arc<Pod>],
    /// The ControllerRevisions of the operator's DaemonSets.
    pub revisions: &'a [Arc<ControllerRevision>],
}

/// One observation per enabled operand, in catalogue order; `detection` tells which nodes have a GPU.
pub fn observe(
    rendered: &Rendered,
    observed: Observed<'_>,
    detection: &GpuDetection,
) -> Vec<OperandObservation> {
    let mut templates: BTreeMap<Operand, Vec<(&str, PodTemplateSpec)>> = BTreeMap::new();
    for manifest in rendered.objects.iter().filter(|m| m.kind() == "DaemonSet") {
        let Some(operand) = manifest.operand else { continue };
        let Ok(template) =
            serde_json::from_value::<PodTemplateSpec>(manifest.object["spec"]["template"].clone())
        else {
            continue;
        };
        templates
            .entry(operand)
            .or_default()
            .push((manifest.name(), template));
    }
    let ready_by_daemonset = ready_nodes(observed);
    OPERANDS
        .iter()
        .filter_map(|info| {
            let templates = templates.get(&info.operand)?;
            let mut observation = OperandObservation {
                operand: Some(info.operand),
                ..OperandObservation::default()
            };
            for node in observed.nodes {
                let name = node.metadata.name.clone().unwrap_or_default();
                let fits: Vec<(&str, Result<(), Misfit>)> = templates
                    .iter()
                    .map(|(ds, template)| {
                        (
                            *ds,
                            daemon_pod_fits(node, template.spec.as_ref().unwrap_or(&Default::default())),
                        )
                    })
                    .collect();
                match fits.iter().find(|(_, fit)| fit.is_ok()) {
                    Some((ds, _)) => {
                        if ready_by_daemonset
                            .get(*ds)
                            .is_some_and(|ready| ready.contains(&name))
                        {
                            observation.ready.insert(name.clone());
                        }
                        observation.expected.insert(name);
                    }
                    None => {
                        // Wanted here (a GPU node with the deploy switch on) but the pods cannot come.
                        let switched_on = labels(node).get(info.deploy_label).is_some_and(|v| v == "true");
                        let gpu = detection.has_gpu(labels(node));
                        let blocked = fits
                            .iter()
                            .any(|(_, fit)| fit.as_ref().is_err_and(Misfit::excludes));
                        if switched_on && gpu && blocked {
                            observation.excluded.insert(name);
                        }
                    }
                }
            }
            Some(observation)
        })
        .collect()
}

fn labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

/// Per DaemonSet name, the nodes where one of its pods of the latest revision is Running and Ready.
fn ready_nodes(observed: Observed<'_>) -> BTreeMap<String, BTreeSet<String>> {
    let mut ready = BTreeMap::new();
    for daemonset in observed.daemonsets {
        let Some(uid) = daemonset.metadata.uid.as_deref() else {
            continue;
        };
        let name = daemonset.metadata.name.clone().unwrap_or_default();
        let latest = latest_revision(uid, observed.revisions.iter().map(|r| &**r));
        let nodes: BTreeSet<String> = observed
            .pods
            .iter()
            .filter(|pod| {
                pod.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            })
            .filter(|pod| pod.metadata.deletion_timestamp.is_none() && is_pod_ready(pod))
            .filter(|pod| latest.is_none() || revision_of(pod) == latest.as_deref())
            .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
            .collect();
        ready.insert(name, nodes);
    }
    ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::upgrade::observe::REVISION_HASH;

    fn arcs<T, const N: usize>(items: [T; N]) -> Vec<Arc<T>> {
        items.into_iter().map(Arc::new).collect()
    }
    use gpuop_render::Manifest;
    use k8s_openapi::api::core::v1::{NodeSpec, PodCondition, PodSpec, PodStatus, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use serde_json::json;

    fn node(name: &str, labels: &[(&str, &str)], taint: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: taint.map(|key| {
                    vec![Taint {
                        key: key.into(),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    }]
                }),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    fn rendered_daemonset(operand: Operand) -> Manifest {
        let info = operand.info();
        Manifest {
            state: info.state,
            operand: Some(operand),
            object: json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": info.daemonset, "namespace": "gpu-operator"},
                "spec": {"template": {"spec": {
                    "nodeSelector": {info.deploy_label: "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "main"}]
                }}}
            }),
        }
    }

    fn daemonset(operand: Operand) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some(operand.info().daemonset.into()),
                uid: Some(format!("uid-{operand}")),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        }
    }

    fn pod(operand: Operand, node: &str, ready: bool, hash: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("{operand}-{node}")),
                labels: Some([(REVISION_HASH.to_owned(), hash.to_owned())].into()),
                owner_references: Some(vec![OwnerReference {
                    uid: format!("uid-{operand}"),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn revision(operand: Operand, hash: &str, number: i64) -> ControllerRevision {
        ControllerRevision {
            metadata: ObjectMeta {
                labels: Some([(REVISION_HASH.to_owned(), hash.to_owned())].into()),
                owner_references: Some(vec![OwnerReference {
                    uid: format!("uid-{operand}"),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            revision: number,
            data: None,
        }
    }

    const ON: (&str, &str) = ("nvidia.com/gpu.deploy.device-plugin", "true");
    const GPU: (&str, &str) = ("feature.node.kubernetes.io/pci-10de.present", "true");

    #[test]
    fn expected_nodes_come_from_the_templates_and_tainted_ones_are_excluded() {
        let rendered = Rendered {
            objects: vec![rendered_daemonset(Operand::DevicePlugin)],
        };
        let nodes = arcs([
            node("a", &[ON, GPU], None),
            node("b", &[ON, GPU], None),
            node("tainted", &[ON, GPU], Some("dedicated")),
            node(
                "off",
                &[("nvidia.com/gpu.deploy.device-plugin", "false"), GPU],
                None,
            ),
            node("cpu", &[], None),
        ]);
        let daemonsets = arcs([daemonset(Operand::DevicePlugin)]);
        let pods = arcs([
            pod(Operand::DevicePlugin, "a", true, "h1"),
            pod(Operand::DevicePlugin, "b", false, "h1"),
        ]);
        let observations = observe(
            &rendered,
            Observed {
                nodes: &nodes,
                daemonsets: &daemonsets,
                pods: &pods,
                revisions: &[],
            },
            &GpuDetection::Nfd,
        );
        assert_eq!(observations.len(), 1);
        let plugin = &observations[0];
        assert_eq!(plugin.operand, Some(Operand::DevicePlugin));
        assert_eq!(plugin.expected, ["a", "b"].map(String::from).into());
        assert_eq!(plugin.ready, ["a"].map(String::from).into());
        assert_eq!(plugin.excluded, ["tainted"].map(String::from).into());
    }

    #[test]
    fn pods_of_an_older_revision_are_not_ready() {
        let rendered = Rendered {
            objects: vec![rendered_daemonset(Operand::Driver)],
        };
        let nodes = arcs([
            node("a", &[("nvidia.com/gpu.deploy.driver", "true")], None),
            node("b", &[("nvidia.com/gpu.deploy.driver", "true")], None),
        ]);
        let daemonsets = arcs([daemonset(Operand::Driver)]);
        let pods = arcs([
            pod(Operand::Driver, "a", true, "new"),
            pod(Operand::Driver, "b", true, "old"),
        ]);
        let revisions = arcs([
            revision(Operand::Driver, "old", 1),
            revision(Operand::Driver, "new", 2),
        ]);
        let observations = observe(
            &rendered,
            Observed {
                nodes: &nodes,
                daemonsets: &daemonsets,
                pods: &pods,
                revisions: &revisions,
            },
            &GpuDetection::Nfd,
        );
        assert_eq!(observations[0].ready, ["a"].map(String::from).into());
    }

    #[test]
    fn operands_that_were_not_rendered_are_not_observed() {
        let rendered = Rendered::default();
        let observations = observe(
            &rendered,
            Observed {
                nodes: &[],
                daemonsets: &[],
                pods: &[],
                revisions: &[],
            },
            &GpuDetection::Nfd,
        );
        assert!(observations.is_empty());
    }
}
