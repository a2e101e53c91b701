//! The readiness judge: per enabled operand, the nodes it should run on and the nodes where it is ready,
//! from the rendered DaemonSets and the cached nodes, pods and ControllerRevisions. Pure.
//!
//! "Should run" is decided from the rendered pod templates against each node (selectors, affinity, taints),
//! never from `desiredNumberScheduled`, which silently leaves out nodes whose taints the pods do not
//! tolerate. "Ready" means a pod of the operand's DaemonSet runs on the node, is Ready, and comes from the
//! DaemonSet's latest revision: a node still running an outdated driver is not counted as done.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuop_api::OPERANDS;
use gpuop_api::labels::GpuDetection;
use gpuop_api::placement::{Misfit, daemon_pod_fits};
use gpuop_api::read::NodeRead;
use gpuop_api::rollout::DaemonSetRevision;
use gpuop_api::{Operand, OperandInfo};
use gpuop_render::Rendered;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodTemplateSpec};

use crate::changes::{NodeSet, NodeSource, PodSet, PodSource};
use crate::index::{Judgements, Placement};
use crate::projection::{Interner, NodeKeys, NodeRecord, PodRecord};
use crate::status::OperandObservation;

/// What the cluster looks like to the judge: the caches (their records and what changed in them), and the
/// DaemonSets by name.
#[derive(Debug)]
pub struct Observed<'a, N: ?Sized, P: ?Sized> {
    /// The nodes.
    pub nodes: &'a N,
    /// The pods, by node.
    pub pods: &'a P,
    /// Per DaemonSet name, its uid and latest revision ([`owners`]).
    pub owners: &'a HashMap<String, DaemonSetRevision>,
}

/// Per DaemonSet name, its uid and the hash of its latest revision.
pub fn owners<'a>(
    daemonsets: impl IntoIterator<Item = &'a DaemonSet>,
    revisions: &[&ControllerRevision],
) -> HashMap<String, DaemonSetRevision> {
    daemonsets
        .into_iter()
        .filter_map(|ds| {
            let owner = DaemonSetRevision::of(ds, revisions.iter().copied())?;
            Some((ds.metadata.name.clone()?, owner))
        })
        .collect()
}

/// The rendered DaemonSets' pod templates by operand, and the NFD keys they select on: parsed from the
/// rendered JSON once per rendering, not once per pass.
#[derive(Debug, Default)]
pub struct Templates {
    by_operand: BTreeMap<Operand, Vec<(String, PodSpec)>>,
    keys: NodeKeys,
}

impl Templates {
    /// The templates of the rendered DaemonSets.
    pub fn of(rendered: &Rendered) -> Self {
        let mut templates = Self::default();
        for manifest in rendered.objects.iter().filter(|m| m.kind() == "DaemonSet") {
            let Ok(template) =
                serde_json::from_value::<PodTemplateSpec>(manifest.object["spec"]["template"].clone())
            else {
                continue;
            };
            let spec = template.spec.unwrap_or_default();
            templates.keys.extend_from_pod_spec(&spec);
            if let Some(operand) = manifest.operand {
                templates
                    .by_operand
                    .entry(operand)
                    .or_default()
                    .push((manifest.name().to_owned(), spec));
            }
        }
        templates
    }

    /// The pod templates of DaemonSets read from the cluster, each known as its operand's by the catalogue
    /// ([`Operand::of_daemonset`]): once applied, the rendered templates themselves.
    pub fn of_daemonsets<'a>(daemonsets: impl IntoIterator<Item = &'a DaemonSet>) -> Self {
        let mut templates = Self::default();
        for daemonset in daemonsets {
            let (Some(operand), Some(name)) = (Operand::of_daemonset(daemonset), &daemonset.metadata.name)
            else {
                continue;
            };
            let spec = daemonset
                .spec
                .as_ref()
                .and_then(|spec| spec.template.spec.clone())
                .unwrap_or_default();
            templates.keys.extend_from_pod_spec(&spec);
            templates
                .by_operand
                .entry(operand)
                .or_default()
                .push((name.clone(), spec));
        }
        templates
    }

    /// The NFD label keys the templates select on (node selector, required node affinity): the node cache
    /// must keep them before the pods are judged.
    pub fn keys(&self) -> &NodeKeys {
        &self.keys
    }
}

/// One observation per enabled operand, in catalogue order; `detection` tells which nodes have a GPU.
/// The tallies are kept in `judgements` and brought up to date with what changed since the last pass;
/// returns how many placements were judged anew too.
pub fn observe<N: NodeSource + ?Sized, P: PodSource + ?Sized>(
    templates: &Templates,
    observed: &Observed<'_, N, P>,
    detection: &GpuDetection,
    judgements: &mut Judgements,
) -> (Vec<OperandObservation>, usize) {
    let templates = &templates.by_operand;
    let mut judged = 0;
    let observations = OPERANDS
        .iter()
        .filter_map(|info| {
            let templates = templates.get(&info.operand)?;
            let scope: Vec<&str> = templates.iter().map(|(ds, _)| ds.as_str()).collect();
            let owners = templates
                .iter()
                .map(|(ds, _)| observed.owners.get(ds).cloned())
                .collect();
            let (tally, judged_now) = judgements.tally(
                &format!("{}/{}", info.operand.id(), scope.join(",")),
                templates,
                owners,
                observed.nodes,
                observed.pods,
                |node| judge_placement(node, templates, info, detection),
            );
            judged += judged_now;
            Some(OperandObservation {
                operand: Some(info.operand),
                expected: tally.expected,
                ready: tally.ready,
                not_ready: tally.not_ready,
                excluded: tally.excluded,
            })
        })
        .collect();
    (observations, judged)
}

/// What [`observe`] reports for caches that hold exactly these objects, judged afresh: the status's readiness
/// of one snapshot of a cluster, for a check that compares it with another judge of the same snapshot.
pub fn observe_objects(
    templates: &Templates,
    nodes: &[Node],
    pods: &[Pod],
    daemonsets: &[DaemonSet],
    revisions: &[ControllerRevision],
    detection: &GpuDetection,
) -> Vec<OperandObservation> {
    let mut interner = Interner::default();
    let keys = NodeKeys::of_detection(detection).union(templates.keys());
    let nodes: NodeSet = nodes
        .iter()
        .map(|node| Arc::new(NodeRecord::project(node, &keys, &mut interner)))
        .collect();
    let mut pod_set = PodSet::default();
    for pod in pods {
        pod_set.put(PodRecord::project(pod, &mut interner));
    }
    let owners = owners(daemonsets, &revisions.iter().collect::<Vec<_>>());
    let observed = Observed {
        nodes: &nodes,
        pods: &pod_set,
        owners: &owners,
    };
    observe(templates, &observed, detection, &mut Judgements::default()).0
}

/// Where an operand's pods go on a node: the first template whose pods fit; else excluded when the node
/// wants them (a GPU node with the deploy switch on) and a taint or the required affinity keeps them off.
pub fn judge_placement(
    node: &NodeRecord,
    templates: &[(String, PodSpec)],
    info: &OperandInfo,
    detection: &GpuDetection,
) -> Placement {
    let fits: Vec<Result<(), Misfit>> = templates
        .iter()
        .map(|(_, spec)| daemon_pod_fits(node, spec))
        .collect();
    // An operand has a template per DaemonSet: never near 65,536.
    if let Some(template) = fits
        .iter()
        .position(Result::is_ok)
        .and_then(|template| u16::try_from(template).ok())
    {
        return Placement::Expected(template);
    }
    let switched_on = node.label(info.deploy_label) == Some("true");
    let gpu = detection.has_gpu(&node.labels);
    let blocked = fits.iter().any(|fit| fit.as_ref().is_err_and(Misfit::excludes));
    if switched_on && gpu && blocked {
        Placement::Excluded
    } else {
        Placement::Elsewhere
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::changes::{NodeSet, PodSet};
    use crate::projection::{Interner, PodRecord};
    use gpuop_api::read::PodRead;
    use gpuop_api::rollout::latest_revision;
    use gpuop_api::status::MAX_LISTED_NODES;
    use gpuop_api::upgrade::observe::REVISION_HASH;
    use gpuop_api::upgrade::observe::revision_of;
    use gpuop_render::Manifest;
    use gpuop_testkit::fixture;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use serde_json::json;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    /// A small linear congruential generator from `seed`, for the same "random" changes every run: each call
    /// gives a number below its `bound`.
    pub(crate) fn seeded(mut seed: u64) -> impl FnMut(usize) -> usize {
        move |bound| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % bound
        }
    }

    pub(crate) fn node(name: &str, labels: &[(&str, &str)], taint: Option<&str>) -> Node {
        fixture::node(name).labels(labels).no_schedule(taint).build()
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

    pub(crate) fn daemonset(operand: Operand) -> DaemonSet {
        fixture::daemonset(operand.info().daemonset)
            .uid(&format!("uid-{operand}"))
            .build()
    }

    /// A running pod of the operand's DaemonSet on `node`, of the template `hash`.
    pub(crate) fn pod(operand: Operand, node: &str, ready: bool, hash: &str) -> Pod {
        let uid = format!("uid-{operand}");
        let owner = fixture::controller_ref("apps/v1", "DaemonSet", operand.info().daemonset, &uid);
        fixture::pod(&format!("{operand}-{node}"))
            .labels(&[(REVISION_HASH, hash)])
            .owned_by(owner)
            .on(node)
            .running(ready)
            .build()
    }

    pub(crate) fn revision(operand: Operand, hash: &str, number: i64) -> ControllerRevision {
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

    /// The cluster as the caches project it, observed once with fresh judgements.
    fn observe_all(
        rendered: &Rendered,
        nodes: &[Node],
        daemonsets: &[DaemonSet],
        pods: &[Pod],
        revisions: &[ControllerRevision],
    ) -> Vec<OperandObservation> {
        let templates = Templates::of(rendered);
        observe_objects(&templates, nodes, pods, daemonsets, revisions, &GpuDetection::Nfd)
    }

    fn project_nodes(nodes: &[Node], interner: &mut Interner) -> Vec<Arc<NodeRecord>> {
        nodes
            .iter()
            .map(|n| Arc::new(NodeRecord::project(n, &NodeKeys::default(), interner)))
            .collect()
    }

    #[test]
    fn expected_nodes_come_from_the_templates_and_tainted_ones_are_excluded() {
        let rendered = Rendered {
            objects: vec![rendered_daemonset(Operand::DevicePlugin)],
        };
        let nodes = [
            node("a", &[ON, GPU], None),
            node("b", &[ON, GPU], None),
            node("tainted", &[ON, GPU], Some("dedicated")),
            node(
                "off",
                &[("nvidia.com/gpu.deploy.device-plugin", "false"), GPU],
                None,
            ),
            node("cpu", &[], None),
        ];
        let pods = [
            pod(Operand::DevicePlugin, "a", true, "h1"),
            pod(Operand::DevicePlugin, "b", false, "h1"),
        ];
        let observations = observe_all(&rendered, &nodes, &[daemonset(Operand::DevicePlugin)], &pods, &[]);
        assert_eq!(observations.len(), 1);
        let plugin = &observations[0];
        assert_eq!(plugin.operand, Some(Operand::DevicePlugin));
        assert_eq!((plugin.expected, plugin.ready), (2, 1));
        assert_eq!(plugin.not_ready, ["b"]);
        assert_eq!(plugin.excluded, ["tainted"].map(String::from).into());
    }

    #[test]
    fn pods_of_an_older_revision_are_not_ready() {
        let rendered = Rendered {
            objects: vec![rendered_daemonset(Operand::Driver)],
        };
        let nodes = [
            node("a", &[("nvidia.com/gpu.deploy.driver", "true")], None),
            node("b", &[("nvidia.com/gpu.deploy.driver", "true")], None),
        ];
        let pods = [
            pod(Operand::Driver, "a", true, "new"),
            pod(Operand::Driver, "b", true, "old"),
        ];
        let revisions = [
            revision(Operand::Driver, "old", 1),
            revision(Operand::Driver, "new", 2),
        ];
        let observations = observe_all(
            &rendered,
            &nodes,
            &[daemonset(Operand::Driver)],
            &pods,
            &revisions,
        );
        assert_eq!(observations[0].ready, 1);
        assert_eq!(observations[0].not_ready, ["b"]);
    }

    #[test]
    fn operands_that_were_not_rendered_are_not_observed() {
        assert!(observe_all(&Rendered::default(), &[], &[], &[], &[]).is_empty());
    }

    #[test]
    fn the_status_lists_the_first_nodes_by_name_and_counts_them_all() {
        let rendered = Rendered {
            objects: vec![rendered_daemonset(Operand::DevicePlugin)],
        };
        let nodes: Vec<Node> = (0..100)
            .rev()
            .map(|i| node(&format!("gpu-{i:03}"), &[ON, GPU], None))
            .collect();
        let observations = observe_all(&rendered, &nodes, &[], &[], &[]);
        assert_eq!((observations[0].expected, observations[0].ready), (100, 0));
        let first: Vec<String> = (0..MAX_LISTED_NODES).map(|i| format!("gpu-{i:03}")).collect();
        assert_eq!(observations[0].not_ready, first);
    }

    /// The readiness scan as it was before the pod index: per DaemonSet, every pod it owns.
    fn scanned(
        daemonsets: &[DaemonSet],
        pods: &[Pod],
        revisions: &[ControllerRevision],
    ) -> BTreeSet<(String, String)> {
        let mut ready = BTreeSet::new();
        for ds in daemonsets {
            let uid = ds.metadata.uid.as_deref().unwrap();
            let latest = latest_revision(uid, revisions);
            for pod in pods
                .iter()
                .filter(|pod| {
                    pod.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid)
                })
                .filter(|pod| pod.metadata.deletion_timestamp.is_none() && pod.ready_since().is_some())
                .filter(|pod| latest.is_none() || revision_of(*pod) == latest.as_deref())
            {
                let node = pod.node_name().unwrap().to_owned();
                ready.insert((ds.metadata.name.clone().unwrap(), node));
            }
        }
        ready
    }

    #[test]
    fn the_pods_by_node_find_the_same_ready_nodes_as_a_scan_per_daemonset() {
        let operands = [Operand::Driver, Operand::DevicePlugin, Operand::DcgmExporter];
        let daemonsets: Vec<DaemonSet> = operands.iter().map(|o| daemonset(*o)).collect();
        let revisions = [
            revision(Operand::Driver, "old", 1),
            revision(Operand::Driver, "new", 2),
            revision(Operand::DevicePlugin, "p1", 1),
        ];
        let mut pods = Vec::new();
        for i in 0..300 {
            let operand = operands[i % 3];
            let hash = match (operand, i % 7) {
                (Operand::Driver, 0) => "old",
                (Operand::Driver, _) => "new",
                (Operand::DevicePlugin, 3) => "p0",
                _ => "p1",
            };
            let mut pod = pod(operand, &format!("gpu-{}", i % 50), i % 5 != 0, hash);
            pod.metadata.name = Some(format!("pod-{i}"));
            if i % 11 == 0 {
                pod.metadata.deletion_timestamp = Some(time());
            }
            pods.push(pod);
        }
        // A pod of a DaemonSet the operator does not own, on a node its own pods also run on.
        let mut stray = pod(Operand::Driver, "gpu-1", true, "new");
        stray.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        pods.push(stray);
        let mut interner = Interner::default();
        let mut set = PodSet::default();
        for pod in &pods {
            set.put(PodRecord::project(pod, &mut interner));
        }
        let owners = owners(&daemonsets, &revisions.iter().collect::<Vec<_>>());
        let mut indexed = BTreeSet::new();
        for (name, owner) in &owners {
            for node in (0..50).map(|i| format!("gpu-{i}")) {
                if set.on_node(&node).iter().any(|pod| owner.counts_ready(&**pod)) {
                    indexed.insert((name.clone(), node));
                }
            }
        }
        let expected = scanned(&daemonsets, &pods, &revisions);
        assert_eq!(indexed, expected);
        for ds in &daemonsets {
            let name = ds.metadata.name.as_deref().unwrap();
            let ready = indexed.iter().filter(|(d, _)| d == name).count();
            assert!(ready > 0 && ready < 50, "{name}: {ready}");
        }
    }

    fn time() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    /// At 2,000 nodes, a pass with nothing changed judges no node, and one after a node's labels changed
    /// judges that node once per operand; a change of the templates judges every node again.
    #[test]
    fn only_changed_nodes_are_judged_again() {
        let operands = [Operand::Driver, Operand::DevicePlugin, Operand::DcgmExporter];
        let rendered = Rendered {
            objects: operands.iter().map(|o| rendered_daemonset(*o)).collect(),
        };
        let on: Vec<(&str, &str)> = operands
            .iter()
            .map(|o| (o.info().deploy_label, "true"))
            .chain([GPU])
            .collect();
        let nodes: Vec<Node> = (0..2000)
            .map(|i| node(&format!("gpu-{i:04}"), &on, None))
            .collect();
        let mut interner = Interner::default();
        let mut records: NodeSet = project_nodes(&nodes, &mut interner).into_iter().collect();
        let pods = PodSet::default();
        let owners = HashMap::new();
        let mut judgements = Judgements::default();
        let mut pass = |records: &NodeSet, rendered: &Rendered| {
            let observed = Observed {
                nodes: records,
                pods: &pods,
                owners: &owners,
            };
            observe(
                &Templates::of(rendered),
                &observed,
                &GpuDetection::Nfd,
                &mut judgements,
            )
        };
        let (first, judged) = pass(&records, &rendered);
        assert_eq!(judged, 2000 * operands.len());
        assert!(first.iter().all(|o| o.expected == 2000));

        let (again, judged) = pass(&records, &rendered);
        assert_eq!(judged, 0, "nothing changed");
        assert_eq!(again, first);

        // One node's deploy switch goes off: that node is judged again, for each operand.
        let mut changed = nodes[7].clone();
        changed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(Operand::DevicePlugin.info().deploy_label.into(), "false".into());
        records.put(NodeRecord::project(&changed, &NodeKeys::default(), &mut interner));
        let (after, judged) = pass(&records, &rendered);
        assert_eq!(judged, operands.len());
        let plugin = after
            .iter()
            .find(|o| o.operand == Some(Operand::DevicePlugin))
            .unwrap();
        assert_eq!(plugin.expected, 1999);

        // Templates that changed judge every node against them again.
        let mut tolerant = rendered.clone();
        tolerant.objects[0].object["spec"]["template"]["spec"]["tolerations"] =
            json!([{"operator": "Exists"}]);
        let (_, judged) = pass(&records, &tolerant);
        assert_eq!(judged, 2000, "only the driver's templates changed");
    }

    /// Random changes of nodes, pods and revisions, a pass after each batch: the kept tallies are always
    /// those a fresh judgement of the whole cluster finds, and a pass after one pod's change judges no node.
    #[test]
    fn kept_tallies_follow_every_change_as_a_fresh_judgement_would() {
        let operands = [Operand::Driver, Operand::DevicePlugin, Operand::DcgmExporter];
        let rendered = Rendered {
            objects: operands.iter().map(|o| rendered_daemonset(*o)).collect(),
        };
        let daemonsets: Vec<DaemonSet> = operands.iter().map(|o| daemonset(*o)).collect();
        let mut revisions = vec![revision(Operand::Driver, "r1", 1)];
        let mut interner = Interner::default();
        let mut nodes = NodeSet::default();
        let mut pods = PodSet::default();
        let mut next = seeded(12345);
        let labels_of = |switches: usize| -> Vec<(&'static str, &'static str)> {
            operands
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    (
                        o.info().deploy_label,
                        if switches & (1 << i) != 0 { "true" } else { "false" },
                    )
                })
                .chain([GPU])
                .collect()
        };
        for i in 0..60 {
            let labels = labels_of(7);
            nodes.put(NodeRecord::project(
                &node(&format!("gpu-{i:02}"), &labels, None),
                &NodeKeys::default(),
                &mut interner,
            ));
        }
        // A pass with the kept judgements, a fresh judgement of the same cluster, and how many nodes the
        // pass judged anew.
        let pass = |nodes: &NodeSet,
                    pods: &PodSet,
                    owners: &HashMap<String, DaemonSetRevision>,
                    kept: &mut Judgements| {
            let observed = Observed { nodes, pods, owners };
            let templates = Templates::of(&rendered);
            let (incremental, judged) = observe(&templates, &observed, &GpuDetection::Nfd, kept);
            let (fresh, _) = observe(
                &templates,
                &observed,
                &GpuDetection::Nfd,
                &mut Judgements::default(),
            );
            (incremental, fresh, judged)
        };
        let mut kept = Judgements::default();
        for round in 0..200 {
            for _ in 0..next(4) + 1 {
                let name = format!("gpu-{:02}", next(70));
                let operand = operands[next(3)];
                match next(8) {
                    0 => {
                        let labels = labels_of(next(8));
                        let taint = (next(4) == 0).then_some("dedicated");
                        nodes.put(NodeRecord::project(
                            &node(&name, &labels, taint),
                            &NodeKeys::default(),
                            &mut interner,
                        ));
                    }
                    1 => {
                        nodes.remove(&name);
                    }
                    2 => {
                        pods.remove(&format!("{operand}-{name}"));
                    }
                    3 if next(5) == 0 => {
                        let number = revisions.len() as i64 + 1;
                        revisions.push(revision(Operand::Driver, &format!("r{number}"), number));
                    }
                    _ => {
                        let hash = format!("r{}", revisions.len() - next(2).min(revisions.len() - 1));
                        let hash = if operand == Operand::Driver {
                            hash.as_str()
                        } else {
                            "any"
                        };
                        let mut pod = pod(operand, &name, next(3) != 0, hash);
                        if next(10) == 0 {
                            pod.metadata.deletion_timestamp = Some(time());
                        }
                        pods.put(PodRecord::project(&pod, &mut interner));
                    }
                }
            }
            let owners = owners(&daemonsets, &revisions.iter().collect::<Vec<_>>());
            let (incremental, fresh, _) = pass(&nodes, &pods, &owners, &mut kept);
            assert_eq!(incremental, fresh, "round {round}");
        }

        // One pod's readiness changes: its node's tally changes, and no node is judged again.
        let name = nodes.values().next().unwrap().name.to_string();
        let flip = |ready| {
            PodRecord::project(
                &pod(Operand::DevicePlugin, &name, ready, "any"),
                &mut Interner::default(),
            )
        };
        let owners = owners(&daemonsets, &revisions.iter().collect::<Vec<_>>());
        for ready in [true, false] {
            pods.put(flip(ready));
            let (incremental, fresh, judged) = pass(&nodes, &pods, &owners, &mut kept);
            assert_eq!(incremental, fresh);
            assert_eq!(judged, 0);
        }
    }
}
