//! The judgements made of each node, kept across passes and brought up to date with what changed since
//! the last pass, so that a pass's work follows what changed, not the cluster's size.
//!
//! The caches log which nodes changed, and on which nodes pods changed ([`crate::changes`]); each judgement
//! keeps the mark it read up to and, at the next pass, judges again only the nodes named since. A node's
//! record is replaced in the cache only when something it keeps changed, so a judgement also remembers the
//! record it was made of (`Arc::ptr_eq`): after a relist (when the log says "everything") only the nodes
//! whose records differ are judged again. Inputs that differ from the last pass's drop every judgement made
//! with them: the labeller's inputs and GPU detection for the node's facts ([`judge_node`]), the rendered
//! pod templates of an operand for its placement ([`crate::readiness::judge_placement`]).
//!
//! Per operand, the index keeps the counts the status reports (expected, ready), the nodes not ready (by
//! name, so the first ones are at hand) and those excluded, each updated as one node's entry changes.
//! Each judgement made anew is counted ([`crate::metrics::Metrics::nodes_judged`]); one reused is not.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use gpuop_api::labels::GpuDetection;
use gpuop_api::rollout::DaemonSetRevision;
use gpuop_api::status::MAX_LISTED_NODES;
use gpuop_render::ClusterFacts;
use k8s_openapi::api::core::v1::PodSpec;

use crate::changes::{ByName, Changed, Named, NodeSource, PodSource};
use crate::facts::{Census, FactSums, FactsInput, NodeFacts, judge_node};
use crate::labeler::{DesiredPatches, LabelPolicy};
use crate::projection::{NodeRecord, Text};

/// Where an operand's pods go on one node, against its rendered templates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The pods of this template (by index) belong there.
    Expected(u16),
    /// Wanted there (a GPU node with the deploy switch on) but no template's pods can come (an untolerated
    /// taint, a required affinity).
    Excluded,
    /// Not the operand's node.
    Elsewhere,
}

/// One operand's nodes as the status counts them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Nodes its pods should run on.
    pub expected: usize,
    /// Of those, the ones where a pod of the right DaemonSet and revision is ready.
    pub ready: usize,
    /// The first of the others, by name (at most [`MAX_LISTED_NODES`]).
    pub not_ready: Vec<String>,
    /// Nodes that want it but that its pods cannot go to.
    pub excluded: BTreeSet<String>,
}

/// Every judgement kept, by node.
#[derive(Debug, Default)]
pub struct Judgements {
    facts_inputs: Option<(LabelPolicy, GpuDetection)>,
    facts: HashMap<Text, (Arc<NodeRecord>, NodeFacts)>,
    /// The labeller's patch of each kind of node, for the facts' `unlabelled`.
    desired: DesiredPatches,
    /// The facts summed for the cluster facts and the census, kept with `facts`.
    sums: FactSums,
    /// The node log's mark the facts were brought up to.
    facts_mark: u64,
    /// Counts the changes of any node's facts (the cluster facts are derived again after one).
    facts_version: u64,
    cluster: Option<ClusterMemo>,
    /// By scope (the DaemonSets of one operand of one rendering), the templates judged against and the
    /// judgements.
    scopes: HashMap<String, Scope>,
    pass: u64,
}

/// The cluster facts and census, and what they were derived from.
#[derive(Debug)]
struct ClusterMemo {
    facts_version: u64,
    input: (String, bool, bool),
    facts: ClusterFacts,
    census: Census,
}

/// One operand's judgements against one set of templates.
#[derive(Debug, Default)]
struct Scope {
    templates: Vec<(String, PodSpec)>,
    /// Per template, its DaemonSet as last read (`None`: not created yet).
    owners: Vec<Option<DaemonSetRevision>>,
    node_mark: u64,
    pod_mark: u64,
    /// By node name (an entry is found by its record's name: the name is not kept twice).
    entries: HashSet<ByName<Entry>>,
    expected: usize,
    ready: usize,
    not_ready: BTreeSet<Text>,
    excluded: BTreeSet<Text>,
    used_in: u64,
}

/// One node's place in a scope: 16 bytes, one per node and operand.
#[derive(Debug)]
struct Entry {
    record: Arc<NodeRecord>,
    placement: Placement,
    ready: bool,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 16);

impl Named for Entry {
    fn name(&self) -> &str {
        &self.record.name
    }
}

impl Scope {
    /// Brings the entry of `name` up to date with its record (`None`: the node is gone); returns whether
    /// its placement was judged anew.
    fn update(
        &mut self,
        name: &Text,
        record: Option<Arc<NodeRecord>>,
        pods: &(impl PodSource + ?Sized),
        judge: &impl Fn(&NodeRecord) -> Placement,
    ) -> bool {
        let old = self.entries.take(&**name).map(|entry| entry.0);
        if let Some(old) = &old {
            self.count(name, old, false);
        }
        let Some(record) = record else { return false };
        let (placement, judged) = match old {
            Some(old) if Arc::ptr_eq(&old.record, &record) => (old.placement, false),
            _ => (judge(&record), true),
        };
        let ready = match placement {
            Placement::Expected(template) => self
                .owners
                .get(usize::from(template))
                .and_then(Option::as_ref)
                .is_some_and(|owner| pods.on_node(name).iter().any(|pod| owner.counts_ready(&**pod))),
            Placement::Excluded | Placement::Elsewhere => false,
        };
        let entry = Entry {
            record,
            placement,
            ready,
        };
        self.count(name, &entry, true);
        self.entries.insert(ByName(entry));
        judged
    }

    /// Adds an entry to the tallies, or takes it out.
    fn count(&mut self, name: &Text, entry: &Entry, add: bool) {
        match entry.placement {
            Placement::Expected(_) => {
                if add {
                    self.expected += 1;
                } else {
                    self.expected -= 1;
                }
                if entry.ready {
                    if add {
                        self.ready += 1;
                    } else {
                        self.ready -= 1;
                    }
                } else if add {
                    self.not_ready.insert(name.clone());
                } else {
                    self.not_ready.remove(name);
                }
            }
            Placement::Excluded => {
                if add {
                    self.excluded.insert(name.clone());
                } else {
                    self.excluded.remove(name);
                }
            }
            Placement::Elsewhere => {}
        }
    }

    fn tally(&self) -> Tally {
        Tally {
            expected: self.expected,
            ready: self.ready,
            not_ready: self
                .not_ready
                .iter()
                .take(MAX_LISTED_NODES)
                .map(|name| name.to_string())
                .collect(),
            excluded: self.excluded.iter().map(|name| name.to_string()).collect(),
        }
    }
}

impl Judgements {
    /// Starts a pass: the tallies of scopes the last pass did not use are dropped.
    pub fn start_pass(&mut self) {
        self.pass += 1;
        let pass = self.pass;
        self.scopes.retain(|_, scope| scope.used_in + 1 >= pass);
    }

    /// Brings every node's facts up to date with `nodes` and the inputs; returns how many nodes were judged
    /// anew.
    pub fn refresh_facts(
        &mut self,
        nodes: &(impl NodeSource + ?Sized),
        labelling: &LabelPolicy,
        detection: &GpuDetection,
    ) -> usize {
        let same_inputs = self
            .facts_inputs
            .as_ref()
            .is_some_and(|(l, d)| l == labelling && d == detection);
        if !same_inputs {
            self.facts.clear();
            self.sums = FactSums::default();
            self.facts_mark = 0;
            self.facts_inputs = Some((labelling.clone(), detection.clone()));
        }
        let (mark, changed) = nodes.changes(self.facts_mark);
        let mut judged = 0;
        let mut judge = |facts: &mut HashMap<Text, (Arc<NodeRecord>, NodeFacts)>,
                         sums: &mut FactSums,
                         node: Arc<NodeRecord>| {
            let name = node.name.clone();
            match facts.get_mut(&name) {
                Some((record, _)) if Arc::ptr_eq(record, &node) => false,
                Some(kept) => {
                    judged += 1;
                    let new = judge_node(&node, labelling, detection, &mut self.desired);
                    let changed = kept.1 != new;
                    if changed {
                        sums.remove(&name, &kept.1);
                        sums.add(&name, &new);
                    }
                    *kept = (node, new);
                    changed
                }
                None => {
                    judged += 1;
                    let new = judge_node(&node, labelling, detection, &mut self.desired);
                    sums.add(&name, &new);
                    facts.insert(name, (node, new));
                    true
                }
            }
        };
        let mut facts_changed = false;
        match changed {
            Changed::All => {
                let all = nodes.nodes();
                let names: HashSet<&str> = all.iter().map(|node| &*node.name).collect();
                let before = self.facts.len();
                let sums = &mut self.sums;
                self.facts.retain(|name, (_, facts)| {
                    let keep = names.contains(&**name);
                    if !keep {
                        sums.remove(name, facts);
                    }
                    keep
                });
                facts_changed |= self.facts.len() != before;
                drop(names);
                for node in all {
                    facts_changed |= judge(&mut self.facts, &mut self.sums, node);
                }
            }
            Changed::Names(names) => {
                for name in names {
                    match nodes.node(&name) {
                        Some(node) => facts_changed |= judge(&mut self.facts, &mut self.sums, node),
                        None => {
                            if let Some((_, facts)) = self.facts.remove(&name) {
                                self.sums.remove(&name, &facts);
                                facts_changed = true;
                            }
                        }
                    }
                }
            }
        }
        self.facts_mark = mark;
        if facts_changed || !same_inputs {
            self.facts_version += 1;
        }
        judged
    }

    /// Every node's facts, as last refreshed.
    #[cfg(test)]
    pub fn facts(&self) -> impl Iterator<Item = (&str, &NodeFacts)> {
        self.facts.values().map(|(record, facts)| (&*record.name, facts))
    }

    /// The facts of one node, as last refreshed.
    pub fn facts_of(&self, name: &str) -> Option<&NodeFacts> {
        self.facts.get(name).map(|(_, facts)| facts)
    }

    /// The cluster facts and census of the facts as last refreshed, derived again only when a node's facts
    /// or `input` changed (from the sums: the cost follows the unlabelled and failed nodes and the OS
    /// releases, not the cluster).
    pub fn cluster(&mut self, input: FactsInput<'_>) -> (ClusterFacts, Census) {
        let key = (
            input.namespace.to_owned(),
            input.precompiled,
            input.service_monitor_crd,
        );
        let fresh = self
            .cluster
            .as_ref()
            .is_some_and(|memo| memo.facts_version == self.facts_version && memo.input == key);
        if !fresh {
            let (facts, census) = self.sums.derive(input);
            self.cluster = Some(ClusterMemo {
                facts_version: self.facts_version,
                input: key,
                facts,
                census,
            });
        }
        let memo = self.cluster.as_ref().expect("derived above");
        (memo.facts.clone(), memo.census.clone())
    }

    /// One operand's tally against `templates` (the operand's, named by `scope`), whose DaemonSets are
    /// `owners` (one per template): judges anew only the nodes that changed since the last pass (or all,
    /// when the templates did), reads the pods again only on the nodes where they changed (or everywhere,
    /// when a DaemonSet or its latest revision did). Returns the tally and how many nodes were judged anew.
    pub fn tally(
        &mut self,
        scope: &str,
        templates: &[(String, PodSpec)],
        owners: Vec<Option<DaemonSetRevision>>,
        nodes: &(impl NodeSource + ?Sized),
        pods: &(impl PodSource + ?Sized),
        judge: impl Fn(&NodeRecord) -> Placement,
    ) -> (Tally, usize) {
        let pass = self.pass;
        let scope = self.scopes.entry(scope.to_owned()).or_default();
        scope.used_in = pass;
        if scope.templates != templates {
            *scope = Scope {
                templates: templates.to_vec(),
                used_in: pass,
                ..Scope::default()
            };
        }
        let every_pod = scope.owners != owners;
        scope.owners = owners;
        let (node_mark, node_changes) = nodes.changes(scope.node_mark);
        let (pod_mark, pod_changes) = pods.changes(scope.pod_mark);
        let mut judged = 0;
        match node_changes {
            Changed::All => {
                let all = nodes.nodes();
                let names: HashSet<Text> = all.iter().map(|node| node.name.clone()).collect();
                let gone: Vec<Text> = scope
                    .entries
                    .iter()
                    .map(|entry| &entry.0.record.name)
                    .filter(|name| !names.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    scope.update(&name, None, pods, &judge);
                }
                for node in all {
                    let name = node.name.clone();
                    judged += usize::from(scope.update(&name, Some(node), pods, &judge));
                }
            }
            Changed::Names(changed_nodes) => {
                let mut again: HashSet<Text> = changed_nodes.into_iter().collect();
                match pod_changes {
                    Changed::Names(names) if !every_pod => again.extend(names),
                    _ => again.extend(scope.entries.iter().map(|entry| entry.0.record.name.clone())),
                }
                for name in again {
                    let record = nodes.node(&name);
                    judged += usize::from(scope.update(&name, record, pods, &judge));
                }
            }
        }
        scope.node_mark = node_mark;
        scope.pod_mark = pod_mark;
        (scope.tally(), judged)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::changes::NodeSet;
    use crate::projection::{Interner, NodeKeys};
    use k8s_openapi::api::core::v1::Node;

    /// A node with these labels.
    pub(crate) fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        gpuop_testkit::fixture::node(name).labels(labels).build()
    }

    /// The census kept from the sums is the one counted afresh over every node's facts.
    fn census_as_counted_afresh(judgements: &mut Judgements) -> Census {
        let input = FactsInput {
            namespace: "gpu-operator",
            precompiled: true,
            service_monitor_crd: false,
        };
        let (facts, census) = judgements.cluster(input);
        let afresh = crate::facts::cluster_facts(judgements.facts(), input);
        assert_eq!((facts, census.clone()), afresh);
        census
    }

    /// At 2,000 nodes: every node is judged once, then none while nothing changes, then the one whose
    /// labels changed, then all when the labeller's inputs change.
    #[test]
    fn facts_are_judged_again_only_for_the_node_that_changed() {
        let gpu = ("feature.node.kubernetes.io/pci-10de.present", "true");
        let mut interner = Interner::default();
        let keys = NodeKeys::default();
        let mut nodes: NodeSet = (0..2000)
            .map(|i| {
                let node = node(&format!("gpu-{i:04}"), &[gpu]);
                Arc::new(NodeRecord::project(&node, &keys, &mut interner))
            })
            .collect();
        let labelling = LabelPolicy::default();
        let detection = GpuDetection::Nfd;
        let mut judgements = Judgements::default();
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 2000);
        assert_eq!(judgements.facts().filter(|(_, f)| f.unlabelled).count(), 2000);
        assert_eq!(
            census_as_counted_afresh(&mut judgements)
                .gpu_nodes_unlabelled
                .len(),
            2000
        );
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 0);

        // The labeller's patch reaches one node.
        let patch = crate::labeler::desired_labels(
            &nodes.get("gpu-0003").unwrap().labels,
            &nodes.get("gpu-0003").unwrap().annotations,
            Some(&labelling),
            &detection,
        );
        let mut labelled = node("gpu-0003", &[gpu]);
        for (key, value) in patch.labels {
            labelled
                .metadata
                .labels
                .as_mut()
                .unwrap()
                .insert(key, value.unwrap());
        }
        for (key, value) in patch.annotations {
            labelled
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(key, value.unwrap());
        }
        nodes.put(NodeRecord::project(&labelled, &keys, &mut interner));
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 1);
        assert_eq!(judgements.facts().filter(|(_, f)| f.unlabelled).count(), 1999);
        assert!(!judgements.facts_of("gpu-0003").unwrap().unlabelled);
        let census = census_as_counted_afresh(&mut judgements);
        assert_eq!(
            (census.gpu_nodes, census.gpu_nodes_unlabelled.len()),
            (2000, 1999)
        );

        // A node that goes is forgotten.
        nodes.remove("gpu-1999");
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 0);
        assert_eq!(judgements.facts().count(), 1999);
        let census = census_as_counted_afresh(&mut judgements);
        assert_eq!(
            (census.gpu_nodes, census.gpu_nodes_unlabelled.len()),
            (1999, 1998)
        );

        let migrating = LabelPolicy {
            mig_manager: true,
            ..LabelPolicy::default()
        };
        assert_eq!(judgements.refresh_facts(&nodes, &migrating, &detection), 1999);
    }
}
