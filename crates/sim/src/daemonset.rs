//! The DaemonSet controller's decisions, as a pure function: for one DaemonSet, given the nodes, its pods
//! and its ControllerRevisions, which pods to create and delete and what its status is. The rules are the
//! real controller's: one pod per node the pod template fits (node selector, required node affinity, taints
//! against the automatic DaemonSet tolerations; cordoned nodes still get pods), pods on nodes that stopped
//! matching the selector or affinity, or that gained a `NoExecute` taint the pod does not tolerate, are
//! deleted (a new `NoSchedule` taint only stops new pods: the running one stays, counted as misscheduled),
//! template changes roll out by `RollingUpdate` (`maxUnavailable` at a time) or wait for deletion
//! (`OnDelete`), and the status counts are computed from the pods themselves.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};

use gpuop_api::placement::{DAEMONSET_TOLERATIONS, Misfit, daemon_pod_fits};
use gpuop_api::read::{PodRead, controller_ref};
use gpuop_api::rollout::revision_labels;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use gpuop_api::rollout::REVISION_HASH;

/// What the controller does for one DaemonSet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// A ControllerRevision to create for the current template, if none exists yet.
    pub new_revision: Option<ControllerRevision>,
    /// The existing ControllerRevision of the current template when it is not the newest (a rollback to an
    /// earlier template), and the number it takes: the newest + 1, as the real controller renumbers it.
    pub renumber_revision: Option<(String, i64)>,
    /// Pods to create (with `generateName`, bound to their node).
    pub create: Vec<Pod>,
    /// Names of pods to delete.
    pub delete: Vec<String>,
    /// The DaemonSet's status after this pass (before the creations and deletions take effect).
    pub status: DaemonSetStatus,
}

/// Plans one pass of the DaemonSet controller over the whole cluster. Nodes and pods may be owned or shared
/// (`Arc`), so that the controller can plan over its caches without copying them. It is [`plan_node`] for
/// every node that has a Node object or pods of the DaemonSet, summed up by a fresh [`Rollout`].
pub fn plan<N: Borrow<Node>, P: Borrow<Pod>>(
    daemonset: &DaemonSet,
    nodes: &[N],
    pods: &[P],
    revisions: &[ControllerRevision],
) -> Plan {
    let template = Template::new(daemonset);
    let (new_revision, renumber_revision) = template.revisions(revisions);
    let mut by_node: BTreeMap<&str, (Option<&Node>, Vec<&Pod>)> = BTreeMap::new();
    for node in nodes.iter().map(Borrow::borrow) {
        if let Some(name) = node.metadata.name.as_deref() {
            by_node.entry(name).or_default().0 = Some(node);
        }
    }
    for pod in pods.iter().map(Borrow::borrow) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            by_node.entry(node).or_default().1.push(pod);
        }
    }
    let mut rollout = Rollout::default();
    let mut create = Vec::new();
    let mut delete = Vec::new();
    for (name, (node, node_pods)) in by_node {
        let on_node = plan_node(&template, node, &node_pods);
        if on_node.create {
            create.push(template.pod_for(name));
        }
        delete.extend(on_node.delete.iter().cloned());
        rollout.record(name, on_node);
    }
    let (status, replace) = rollout.status_and_replacements(&template);
    delete.extend(replace.into_iter().map(|(_, pod)| pod));
    delete.sort();
    delete.dedup();
    Plan {
        new_revision,
        renumber_revision,
        create,
        delete,
        status,
    }
}

/// One DaemonSet's pod template, read once for a pass over its nodes.
#[derive(Clone, Debug)]
pub struct Template<'a> {
    daemonset: &'a DaemonSet,
    name: String,
    spec: PodSpec,
    hash: String,
}

impl<'a> Template<'a> {
    /// Reads the DaemonSet's template and its hash.
    pub fn new(daemonset: &'a DaemonSet) -> Self {
        let template = daemonset.spec.as_ref().map(|s| &s.template);
        Self {
            daemonset,
            name: daemonset.metadata.name.clone().unwrap_or_default(),
            spec: template.and_then(|t| t.spec.clone()).unwrap_or_default(),
            hash: template
                .map(template_hash)
                .unwrap_or_else(|| template_hash(&k8s_openapi::api::core::v1::PodTemplateSpec::default())),
        }
    }

    /// The hash naming the template's revision.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The template's pod spec (before the controller binds it and adds its tolerations).
    pub fn spec(&self) -> &PodSpec {
        &self.spec
    }

    /// The ControllerRevision to create for the template, or the existing one to renumber as the newest.
    pub fn revisions(
        &self,
        revisions: &[ControllerRevision],
    ) -> (Option<ControllerRevision>, Option<(String, i64)>) {
        let existing = revisions
            .iter()
            .find(|r| r.metadata.labels.as_ref().and_then(|l| l.get(REVISION_HASH)) == Some(&self.hash));
        let newest = revisions.iter().map(|r| r.revision).max().unwrap_or(0);
        match existing {
            None => (
                Some(revision_object(self.daemonset, &self.hash, newest + 1)),
                None,
            ),
            Some(existing) if existing.revision < newest => {
                let name = existing.metadata.name.clone().unwrap_or_default();
                (None, Some((name, newest + 1)))
            }
            Some(_) => (None, None),
        }
    }

    /// The pod to create on `node`.
    pub fn pod_for(&self, node: &str) -> Pod {
        pod_object(
            self.daemonset,
            &self.name,
            self.daemonset.metadata.namespace.as_deref(),
            node,
            &self.spec,
            &self.hash,
        )
    }

    fn rolling(&self) -> bool {
        self.daemonset
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|s| s.type_.as_deref())
            .unwrap_or("RollingUpdate")
            == "RollingUpdate"
    }

    fn max_unavailable(&self, desired: i32) -> i32 {
        self.daemonset
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|s| s.rolling_update.as_ref())
            .and_then(|r| r.max_unavailable.as_ref())
            .map_or(1, |value| scaled(value, desired))
    }
}

/// The DaemonSet on one node: what the node adds to its status, and what to do there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// The node should run a pod (it counts in `desiredNumberScheduled`).
    pub fits: bool,
    /// A pod runs where it should not (`numberMisscheduled`).
    pub misscheduled: bool,
    /// The pod kept on a fitting node: whether it is Ready and whether it has the current template.
    pub kept: Option<Kept>,
    /// A pod is to be created here.
    pub create: bool,
    /// Names of this node's pods to delete (failed, duplicate, or on a node they no longer fit).
    pub delete: Vec<String>,
}

/// The one pod a fitting node keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The pod's name.
    pub name: String,
    /// Running and Ready.
    pub ready: bool,
    /// Made from the current template.
    pub updated: bool,
}

/// Plans the DaemonSet on one node (`None` when the Node object is gone), given the DaemonSet's pods bound
/// to it. Pods being deleted are not counted, as the real controller does not count them.
pub fn plan_node<P: Borrow<Pod>>(template: &Template<'_>, node: Option<&Node>, pods: &[P]) -> NodePlan {
    let pods: Vec<&Pod> = pods
        .iter()
        .map(Borrow::borrow)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    // `fits`: the node should run a pod; `keeping`: its pod may go on running although no new one would be
    // placed there (a NoSchedule taint added later).
    let (fits, keeping) = match node.map(|node| (node, daemon_pod_fits(node, &template.spec))) {
        Some((_, Ok(()))) => (true, false),
        Some((node, Err(Misfit::Taint(_)))) => (false, !evicted_by_taints(node, &template.spec)),
        _ => (false, false),
    };
    let mut plan = NodePlan {
        fits,
        ..NodePlan::default()
    };
    if !fits {
        if !pods.is_empty() {
            plan.misscheduled = true;
            if !keeping {
                plan.delete
                    .extend(pods.iter().filter_map(|p| p.metadata.name.clone()));
            }
        }
        return plan;
    }
    // One pod per node: keep the newest-looking (a ready one if any), delete the rest and failed ones.
    let mut keep: Option<&Pod> = None;
    for pod in &pods {
        if phase(pod) == "Failed" {
            plan.delete.extend(pod.metadata.name.clone());
        } else if keep.is_none() || (is_ready(pod) && !keep.is_some_and(is_ready)) {
            if let Some(previous) = keep.replace(pod) {
                plan.delete.extend(previous.metadata.name.clone());
            }
        } else {
            plan.delete.extend(pod.metadata.name.clone());
        }
    }
    plan.create = pods.iter().all(|p| phase(p) == "Failed");
    plan.kept = keep.map(|pod| Kept {
        name: pod.metadata.name.clone().unwrap_or_default(),
        ready: is_ready(pod),
        updated: pod_hash(pod) == Some(template.hash.as_str()),
    });
    plan
}

/// The status counts of one DaemonSet, summed over its nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    desired: i32,
    current: i32,
    ready: i32,
    updated: i32,
    misscheduled: i32,
}

impl Counts {
    fn of(plan: &NodePlan) -> Self {
        let kept = plan.kept.as_ref();
        Self {
            desired: i32::from(plan.fits),
            current: i32::from(kept.is_some()),
            ready: i32::from(kept.is_some_and(|k| k.ready)),
            updated: i32::from(kept.is_some_and(|k| k.updated)),
            misscheduled: i32::from(plan.misscheduled),
        }
    }

    fn add(&mut self, other: Self, sign: i32) {
        self.desired += sign * other.desired;
        self.current += sign * other.current;
        self.ready += sign * other.ready;
        self.updated += sign * other.updated;
        self.misscheduled += sign * other.misscheduled;
    }
}

/// One DaemonSet across its nodes: each node's latest [`NodePlan`] (as counts and its outdated pod), so that
/// the status and the rolling update are known after planning only the nodes that changed. The controller
/// keeps one per DaemonSet between passes; [`plan`] fills a fresh one.
#[derive(Clone, Debug, Default)]
pub struct Rollout {
    counts: Counts,
    nodes: HashMap<String, (Counts, Option<(String, bool)>)>,
    /// Outdated pods on fitting nodes by node, in node order: (pod name, Ready).
    outdated: BTreeMap<String, (String, bool)>,
}

impl Rollout {
    /// Takes `plan` as the node's latest, in place of the one recorded before.
    pub fn record(&mut self, node: &str, plan: NodePlan) {
        let counts = Counts::of(&plan);
        let outdated = plan
            .kept
            .filter(|kept| !kept.updated)
            .map(|kept| (kept.name, kept.ready));
        if let Some((before, _)) = self.nodes.remove(node) {
            self.counts.add(before, -1);
        }
        self.outdated.remove(node);
        if let Some(outdated) = &outdated {
            self.outdated.insert(node.to_owned(), outdated.clone());
        }
        if counts != Counts::default() || outdated.is_some() {
            self.counts.add(counts, 1);
            self.nodes.insert(node.to_owned(), (counts, outdated));
        }
    }

    /// The nodes recorded (those where the DaemonSet has a pod or should have one).
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The DaemonSet's status, and the outdated pods a rolling update replaces now, as (node, pod name):
    /// every one that is not Ready, and Ready ones while fewer than `maxUnavailable` nodes are unavailable.
    pub fn status_and_replacements(
        &self,
        template: &Template<'_>,
    ) -> (DaemonSetStatus, Vec<(String, String)>) {
        let counts = self.counts;
        let some = |n: i32| (n > 0).then_some(n);
        let unavailable = counts.desired - counts.ready;
        let status = DaemonSetStatus {
            desired_number_scheduled: counts.desired,
            current_number_scheduled: counts.current,
            number_ready: counts.ready,
            number_available: some(counts.ready),
            number_unavailable: some(unavailable),
            updated_number_scheduled: some(counts.updated),
            number_misscheduled: counts.misscheduled,
            observed_generation: template.daemonset.metadata.generation,
            ..DaemonSetStatus::default()
        };
        let mut replace = Vec::new();
        if template.rolling() && !self.outdated.is_empty() {
            // Pods already missing or not ready use up the budget; outdated pods that are not ready go first.
            let mut budget = template.max_unavailable(counts.desired).max(1) - unavailable;
            let not_ready = self.outdated.iter().filter(|(_, (_, ready))| !ready);
            let ready = self.outdated.iter().filter(|(_, (_, ready))| *ready);
            for (node, (name, ready)) in not_ready.chain(ready) {
                if !ready {
                    replace.push((node.clone(), name.clone()));
                } else if budget > 0 {
                    replace.push((node.clone(), name.clone()));
                    budget -= 1;
                }
            }
        }
        (status, replace)
    }
}

/// Whether a pod of this spec may not join the pods already on its node: a required pod anti-affinity term
/// on the hostname topology selects one of them (the driver's "one driver per node", so that a new driver
/// DaemonSet's pod waits until the node's old driver pod is gone). The real scheduler leaves such a pod
/// Pending; the simulated controller does not create it until the node is free.
pub fn repelled<P: Borrow<Pod>>(spec: &PodSpec, others: &[P]) -> bool {
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    terms.into_iter().flatten().any(|term| {
        term.topology_key == "kubernetes.io/hostname"
            && term
                .label_selector
                .as_ref()
                .and_then(|selector| gpuop_api::selector::LabelSelector::from_api(selector).ok())
                .is_some_and(|selector| {
                    others.iter().map(Borrow::borrow).any(|pod| {
                        pod.metadata.deletion_timestamp.is_none()
                            && pod.metadata.labels.as_ref().is_some_and(|l| selector.matches(l))
                    })
                })
    })
}

/// Whether the node has a `NoExecute` taint that a pod of this spec (with the tolerations the controller
/// adds) does not tolerate: such a taint evicts a running pod; `NoSchedule` taints do not.
fn evicted_by_taints(node: &Node, spec: &PodSpec) -> bool {
    let mut tolerant = spec.clone();
    tolerant
        .tolerations
        .get_or_insert_with(Vec::new)
        .extend(["NoSchedule", "PreferNoSchedule"].map(|effect| Toleration {
            operator: Some("Exists".to_owned()),
            effect: Some(effect.to_owned()),
            ..Toleration::default()
        }));
    matches!(daemon_pod_fits(node, &tolerant), Err(Misfit::Taint(_)))
}

/// The hash naming a pod template's revision: FNV-1a of its JSON, as the real controller hashes it (the
/// value differs from Kubernetes', the behaviour does not).
pub fn template_hash(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> String {
    let json = serde_json::to_vec(template).expect("a pod template serializes");
    let hash = json.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:x}")
}

/// The revision hash a pod was created from.
pub fn pod_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(REVISION_HASH)
        .map(String::as_str)
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Whether a pod is Running with its `Ready` condition true: the API crate's rule
/// ([`PodRead::ready_since`]).
pub fn is_ready(pod: &Pod) -> bool {
    pod.ready_since().is_some()
}

fn scaled(value: &IntOrString, total: i32) -> i32 {
    match value {
        IntOrString::Int(count) => *count,
        IntOrString::String(text) => match text.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            // DaemonSets round maxUnavailable percentages up.
            Some(percent) => ((i64::from(total) * percent + 99) / 100) as i32,
            None => text.parse().unwrap_or(1),
        },
    }
}

fn revision_object(daemonset: &DaemonSet, hash: &str, revision: i64) -> ControllerRevision {
    let name = daemonset.metadata.name.clone().unwrap_or_default();
    let template = daemonset
        .spec
        .as_ref()
        .map(|s| serde_json::json!({ "spec": { "template": s.template } }));
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{hash}")),
            namespace: daemonset.metadata.namespace.clone(),
            labels: Some(revision_labels(daemonset, hash)),
            owner_references: Some(vec![controller_ref(daemonset)]),
            ..ObjectMeta::default()
        },
        data: template.map(RawExtension),
        revision,
    }
}

fn pod_object(
    daemonset: &DaemonSet,
    name: &str,
    namespace: Option<&str>,
    node: &str,
    template_spec: &PodSpec,
    hash: &str,
) -> Pod {
    let template_meta = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.clone())
        .unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(REVISION_HASH.to_owned(), hash.to_owned());
    labels.insert(
        "pod-template-generation".to_owned(),
        daemonset.metadata.generation.unwrap_or(1).to_string(),
    );
    let mut spec = template_spec.clone();
    spec.node_name = Some(node.to_owned());
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for &(key, effect) in DAEMONSET_TOLERATIONS {
        if !tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect))
        {
            tolerations.push(Toleration {
                key: Some(key.to_owned()),
                operator: Some("Exists".to_owned()),
                effect: Some(effect.to_owned()),
                ..Toleration::default()
            });
        }
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: namespace.map(str::to_owned),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![controller_ref(daemonset)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_testkit::fixture;
    use k8s_openapi::api::core::v1::Taint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn node(name: &str, labels: &[(&str, &str)], taint: Option<&str>, cordoned: bool) -> Node {
        fixture::node(name)
            .labels(labels)
            .no_schedule(taint)
            .unschedulable(cordoned)
            .build()
    }

    fn daemonset(image: &str, strategy: &str, max_unavailable: Option<IntOrString>) -> DaemonSet {
        fixture::daemonset("plugin")
            .namespace("gpu-operator")
            .uid("ds-uid")
            .generation(2)
            .selecting(&[("app", "plugin")])
            .node_selector(&[("gpu", "true")])
            .container("main", image)
            .update_strategy(strategy, max_unavailable)
            .build()
    }

    /// A pod of the DaemonSet's current template on a node, ready or not.
    fn pod(name: &str, node: &str, hash: &str, ready: bool) -> Pod {
        fixture::pod(name)
            .labels(&[(REVISION_HASH, hash)])
            .on(node)
            .phase(if ready { "Running" } else { "Pending" })
            .ready(ready)
            .build()
    }

    fn hash_of(ds: &DaemonSet) -> String {
        template_hash(&ds.spec.as_ref().unwrap().template)
    }

    fn nodes_of(created: &[Pod]) -> Vec<&str> {
        created
            .iter()
            .map(|p| p.spec.as_ref().unwrap().node_name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn one_pod_per_fitting_node_including_cordoned_ones() {
        let ds = daemonset("v1", "RollingUpdate", None);
        let nodes = [
            node("gpu-a", &[("gpu", "true")], None, false),
            node("gpu-cordoned", &[("gpu", "true")], None, true),
            node("gpu-tainted", &[("gpu", "true")], Some("dedicated"), false),
            node("cpu", &[], None, false),
        ];
        let plan = plan(&ds, &nodes, &[] as &[Pod], &[]);
        assert_eq!(nodes_of(&plan.create), ["gpu-a", "gpu-cordoned"]);
        assert_eq!(
            plan.status.desired_number_scheduled, 2,
            "the tainted node is not counted"
        );
        assert_eq!(plan.status.number_unavailable, Some(2));
        let created = &plan.create[0];
        assert_eq!(created.metadata.generate_name.as_deref(), Some("plugin-"));
        assert_eq!(
            created.metadata.owner_references.as_ref().unwrap()[0].uid,
            "ds-uid"
        );
        assert_eq!(pod_hash(created), Some(hash_of(&ds).as_str()));
        let revision = plan.new_revision.unwrap();
        assert_eq!(revision.revision, 1);
        assert_eq!(revision.metadata.name, Some(format!("plugin-{}", hash_of(&ds))));
    }

    #[test]
    fn a_rollback_renumbers_the_earlier_templates_revision_as_the_newest() {
        let v1 = daemonset("v1", "RollingUpdate", None);
        let v2 = daemonset("v2", "RollingUpdate", None);
        let first = plan(&v1, &[] as &[Node], &[] as &[Pod], &[])
            .new_revision
            .unwrap();
        let second = plan(&v2, &[] as &[Node], &[] as &[Pod], std::slice::from_ref(&first))
            .new_revision
            .unwrap();
        assert_eq!(second.revision, 2);
        let back = plan(
            &v1,
            &[] as &[Node],
            &[] as &[Pod],
            &[first.clone(), second.clone()],
        );
        assert_eq!(back.new_revision, None, "the revision exists");
        assert_eq!(
            back.renumber_revision,
            Some((first.metadata.name.clone().unwrap(), 3)),
            "and becomes the newest, or pods of the current template would count as outdated"
        );
        let current = plan(&v2, &[] as &[Node], &[] as &[Pod], &[first, second]);
        assert_eq!((current.new_revision, current.renumber_revision), (None, None));
    }

    #[test]
    fn status_counts_come_from_the_pods() {
        let ds = daemonset("v1", "RollingUpdate", None);
        let hash = hash_of(&ds);
        let nodes = [
            node("a", &[("gpu", "true")], None, false),
            node("b", &[("gpu", "true")], None, false),
            node("c", &[], None, false),
        ];
        let pods = [
            pod("p-a", "a", &hash, true),
            pod("p-b", "b", "old", false),
            pod("p-c", "c", &hash, true),
        ];
        let plan = plan(&ds, &nodes, &pods, &[]);
        let status = &plan.status;
        assert_eq!(status.desired_number_scheduled, 2);
        assert_eq!(status.current_number_scheduled, 2);
        assert_eq!(status.number_misscheduled, 1);
        assert_eq!(status.number_ready, 1);
        assert_eq!(status.number_available, Some(1));
        assert_eq!(status.number_unavailable, Some(1));
        assert_eq!(status.updated_number_scheduled, Some(1));
        assert_eq!(status.observed_generation, Some(2));
        assert!(
            plan.delete.contains(&"p-c".to_owned()),
            "a node that stopped matching loses its pod"
        );
    }

    #[test]
    fn a_later_no_schedule_taint_keeps_the_running_pod_and_no_execute_evicts_it() {
        let ds = daemonset("v1", "RollingUpdate", None);
        let hash = hash_of(&ds);
        let no_schedule = node("a", &[("gpu", "true")], Some("maintenance"), false);
        let mut no_execute = node("b", &[("gpu", "true")], None, false);
        no_execute.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: "maintenance".into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        }]);
        let pods = [pod("p-a", "a", &hash, true), pod("p-b", "b", &hash, true)];
        let plan = plan(&ds, &[no_schedule, no_execute], &pods, &[]);
        assert_eq!(plan.delete, ["p-b"], "only NoExecute evicts a running pod");
        assert!(plan.create.is_empty());
        assert_eq!(plan.status.desired_number_scheduled, 0);
        assert_eq!(
            plan.status.number_misscheduled, 2,
            "both run where they should not"
        );
    }

    #[test]
    fn rolling_update_replaces_at_most_max_unavailable_at_a_time() {
        let ds = daemonset("v2", "RollingUpdate", Some(IntOrString::Int(1)));
        let nodes: Vec<Node> = ["a", "b", "c"]
            .iter()
            .map(|n| node(n, &[("gpu", "true")], None, false))
            .collect();
        let old: Vec<Pod> = ["a", "b", "c"]
            .iter()
            .map(|n| pod(&format!("p-{n}"), n, "old", true))
            .collect();
        let first = plan(&ds, &nodes, &old, &[]);
        assert_eq!(first.delete.len(), 1, "one outdated pod at a time");
        assert!(first.create.is_empty());
        // With one node already unavailable the budget is spent.
        let mut waiting = old.clone();
        waiting[0] = pod("p-a", "a", "old", false);
        let second = plan(&ds, &nodes, &waiting, &[]);
        assert_eq!(
            second.delete,
            ["p-a"],
            "the unavailable outdated pod goes, no healthy one"
        );
        let percent = daemonset("v2", "RollingUpdate", Some(IntOrString::String("50%".into())));
        assert_eq!(
            plan(&percent, &nodes, &old, &[]).delete.len(),
            2,
            "50% of 3 rounds up to 2"
        );
    }

    #[test]
    fn a_rollout_kept_node_by_node_says_what_a_whole_plan_says() {
        let ds = daemonset("v2", "RollingUpdate", Some(IntOrString::Int(1)));
        let hash = hash_of(&ds);
        let template = Template::new(&ds);
        let mut nodes: Vec<Node> = ["a", "b", "c"]
            .iter()
            .map(|n| node(n, &[("gpu", "true")], None, false))
            .collect();
        let mut pods: Vec<Pod> = ["a", "b", "c"]
            .iter()
            .map(|n| pod(&format!("p-{n}"), n, "old", true))
            .collect();
        let mut rollout = Rollout::default();
        for (node, pod) in nodes.iter().zip(&pods) {
            let name = node.metadata.name.as_deref().unwrap();
            rollout.record(name, plan_node(&template, Some(node), std::slice::from_ref(pod)));
        }
        let kept = |rollout: &Rollout| {
            let (status, replace) = rollout.status_and_replacements(&template);
            (
                status,
                replace.into_iter().map(|(_, pod)| pod).collect::<Vec<_>>(),
            )
        };
        let whole = |nodes: &[Node], pods: &[Pod]| {
            let plan = plan(&ds, nodes, pods, &[]);
            (plan.status, plan.delete)
        };
        assert_eq!(kept(&rollout), whole(&nodes, &pods));
        assert_eq!(kept(&rollout).1, ["p-a"], "one outdated pod at a time");

        // Only node a changes: its new pod is not ready yet, so no other outdated pod goes.
        pods[0] = pod("p-a2", "a", &hash, false);
        rollout.record("a", plan_node(&template, Some(&nodes[0]), &pods[..1]));
        assert_eq!(kept(&rollout), whole(&nodes, &pods));
        assert_eq!(kept(&rollout).0.updated_number_scheduled, Some(1));
        assert!(kept(&rollout).1.is_empty(), "the budget is spent on node a");

        // Node c stops matching: its pod goes and it no longer counts.
        nodes[2] = node("c", &[], None, false);
        let on_c = plan_node(&template, Some(&nodes[2]), &pods[2..]);
        assert_eq!(on_c.delete, ["p-c"]);
        rollout.record("c", on_c);
        assert_eq!(kept(&rollout).0, whole(&nodes, &pods).0);
        assert_eq!(kept(&rollout).0.desired_number_scheduled, 2);
        assert_eq!(kept(&rollout).0.number_misscheduled, 1);

        // Node c's pod is gone and the Node with it: nothing is left of it.
        rollout.record("c", plan_node(&template, None, &[] as &[Pod]));
        assert_eq!(kept(&rollout), whole(&nodes[..2], &pods[..2]));
        assert_eq!(rollout.nodes().count(), 2);
    }

    #[test]
    fn on_delete_only_recreates_deleted_pods_with_the_new_template() {
        let ds = daemonset("v2", "OnDelete", None);
        let nodes = [
            node("a", &[("gpu", "true")], None, false),
            node("b", &[("gpu", "true")], None, false),
        ];
        let pods = [pod("p-a", "a", "old", true)];
        let plan = plan(&ds, &nodes, &pods, &[]);
        assert!(
            plan.delete.is_empty(),
            "outdated pods stay until someone deletes them"
        );
        assert_eq!(nodes_of(&plan.create), ["b"]);
        assert_eq!(pod_hash(&plan.create[0]), Some(hash_of(&ds).as_str()));
        assert_eq!(plan.status.updated_number_scheduled, None);
    }

    #[test]
    fn failed_and_duplicate_pods_are_replaced() {
        let ds = daemonset("v1", "RollingUpdate", None);
        let hash = hash_of(&ds);
        let nodes = [node("a", &[("gpu", "true")], None, false)];
        let mut failed = pod("p-failed", "a", &hash, false);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let first = plan(&ds, &nodes, &[failed], &[]);
        assert_eq!(first.delete, ["p-failed"]);
        assert_eq!(first.create.len(), 1);
        let duplicates = [pod("p-1", "a", &hash, false), pod("p-2", "a", &hash, true)];
        let second = plan(&ds, &nodes, &duplicates, &[]);
        assert_eq!(second.delete, ["p-1"], "the ready one stays");
        assert!(second.create.is_empty());
    }

    #[test]
    fn a_required_anti_affinity_keeps_a_second_driver_off_a_node() {
        use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm, PodAntiAffinity};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let spec = PodSpec {
            affinity: Some(Affinity {
                pod_anti_affinity: Some(PodAntiAffinity {
                    required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                        topology_key: "kubernetes.io/hostname".into(),
                        label_selector: Some(LabelSelector {
                            match_expressions: Some(vec![LabelSelectorRequirement {
                                key: "app.kubernetes.io/component".into(),
                                operator: "In".into(),
                                values: Some(vec!["nvidia-driver".into()]),
                            }]),
                            ..LabelSelector::default()
                        }),
                        ..PodAffinityTerm::default()
                    }]),
                    ..PodAntiAffinity::default()
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        };
        let mut old_driver = pod("orphan", "n", "h", true);
        old_driver
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("app.kubernetes.io/component".into(), "nvidia-driver".into());
        assert!(
            repelled(&spec, &[old_driver.clone()]),
            "the old driver still runs there"
        );
        old_driver.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!repelled(&spec, &[old_driver]), "it is going");
        assert!(
            !repelled(&spec, &[pod("plugin", "n", "h", true)]),
            "other pods do not repel it"
        );
        assert!(!repelled(&PodSpec::default(), &[pod("x", "n", "h", true)]));
    }
}
