//! The judgements made of each node, kept across passes and reused while neither the node nor what the
//! judgement depends on changed, so that a pass's work follows what changed, not the cluster's size.
//!
//! A node's record ([`NodeRecord`]) is replaced in the cache only when something it keeps changed; a
//! judgement remembers the record it was made of (`Arc::ptr_eq`) and the inputs it was made with: the
//! labeller's inputs and GPU detection for the node's facts ([`judge_node`]), the rendered pod templates of
//! an operand for its placement ([`crate::readiness::judge_placement`]). Inputs that differ from the last
//! pass's drop every judgement made with them. Each judgement made anew is counted
//! ([`crate::metrics::Metrics::nodes_judged`]); one reused is not.

use std::collections::HashMap;
use std::sync::Arc;

use gpuop_api::labels::GpuDetection;
use k8s_openapi::api::core::v1::PodSpec;

use crate::facts::{NodeFacts, judge_node};
use crate::labeler::LabelPolicy;
use crate::projection::{NodeRecord, Text};

/// Where an operand's pods go on one node, against its rendered templates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The pods of this template (by index) belong there.
    Expected(usize),
    /// Wanted there (a GPU node with the deploy switch on) but no template's pods can come (an untolerated
    /// taint, a required affinity).
    Excluded,
    /// Not the operand's node.
    Elsewhere,
}

/// Every judgement kept, by node.
#[derive(Debug, Default)]
pub struct Judgements {
    facts_inputs: Option<(LabelPolicy, GpuDetection)>,
    facts: HashMap<Text, (Arc<NodeRecord>, NodeFacts)>,
    /// By scope (the DaemonSets of one operand of one rendering), the templates judged against and the
    /// judgements.
    placements: HashMap<String, Placements>,
    pass: u64,
}

#[derive(Debug, Default)]
struct Placements {
    templates: Vec<(String, PodSpec)>,
    nodes: HashMap<Text, (Arc<NodeRecord>, Placement)>,
    used_in: u64,
}

impl Judgements {
    /// Brings every node's facts up to date with `nodes` and the inputs; returns how many nodes were judged
    /// anew. Starts a pass: placements of scopes the last pass did not use are dropped.
    pub fn refresh_facts(
        &mut self,
        nodes: &[Arc<NodeRecord>],
        labelling: &LabelPolicy,
        detection: &GpuDetection,
    ) -> usize {
        self.pass += 1;
        let pass = self.pass;
        self.placements.retain(|_, p| p.used_in + 1 >= pass);
        let same_inputs = self
            .facts_inputs
            .as_ref()
            .is_some_and(|(l, d)| l == labelling && d == detection);
        if !same_inputs {
            self.facts.clear();
            self.facts_inputs = Some((labelling.clone(), detection.clone()));
        }
        let mut old = std::mem::take(&mut self.facts);
        let mut judged = 0;
        self.facts.reserve(nodes.len());
        for node in nodes {
            let facts = match old.remove(&node.name) {
                Some((record, facts)) if Arc::ptr_eq(&record, node) => facts,
                _ => {
                    judged += 1;
                    judge_node(node, labelling, detection)
                }
            };
            self.facts.insert(node.name.clone(), (node.clone(), facts));
        }
        judged
    }

    /// Every node's facts, as last refreshed.
    pub fn facts(&self) -> impl Iterator<Item = (&str, &NodeFacts)> {
        self.facts.values().map(|(record, facts)| (&*record.name, facts))
    }

    /// The facts of one node, as last refreshed.
    pub fn facts_of(&self, name: &str) -> Option<&NodeFacts> {
        self.facts.get(name).map(|(_, facts)| facts)
    }

    /// Each node's placement against `templates` (one operand's, named by `scope`), judging anew only
    /// the nodes that changed (or all, when the templates did); calls `each` per node and returns how many
    /// were judged anew.
    pub fn placements(
        &mut self,
        scope: &str,
        templates: &[(String, PodSpec)],
        nodes: &[Arc<NodeRecord>],
        judge: impl Fn(&NodeRecord) -> Placement,
        mut each: impl FnMut(&Text, Placement),
    ) -> usize {
        let pass = self.pass;
        let memo = self.placements.entry(scope.to_owned()).or_default();
        memo.used_in = pass;
        if memo.templates != templates {
            memo.templates = templates.to_vec();
            memo.nodes.clear();
        }
        let mut old = std::mem::take(&mut memo.nodes);
        memo.nodes.reserve(nodes.len());
        let mut judged = 0;
        for node in nodes {
            let placement = match old.remove(&node.name) {
                Some((record, placement)) if Arc::ptr_eq(&record, node) => placement,
                _ => {
                    judged += 1;
                    judge(node)
                }
            };
            each(&node.name, placement);
            memo.nodes.insert(node.name.clone(), (node.clone(), placement));
        }
        judged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{Interner, NodeKeys};
    use k8s_openapi::api::core::v1::Node;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        node
    }

    /// At 2,000 nodes: every node is judged once, then none while nothing changes, then the one whose
    /// labels changed, then all when the labeller's inputs change.
    #[test]
    fn facts_are_judged_again_only_for_the_node_that_changed() {
        let gpu = ("feature.node.kubernetes.io/pci-10de.present", "true");
        let mut interner = Interner::default();
        let keys = NodeKeys::default();
        let mut nodes: Vec<Arc<NodeRecord>> = (0..2000)
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
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 0);

        // The labeller's patch reaches one node.
        let patch = crate::labeler::desired_labels(
            &nodes[3].labels,
            &nodes[3].annotations,
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
        nodes[3] = Arc::new(NodeRecord::project(&labelled, &keys, &mut interner));
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 1);
        assert_eq!(judgements.facts().filter(|(_, f)| f.unlabelled).count(), 1999);
        assert!(!judgements.facts_of("gpu-0003").unwrap().unlabelled);

        // A node that goes is forgotten.
        nodes.pop();
        assert_eq!(judgements.refresh_facts(&nodes, &labelling, &detection), 0);
        assert_eq!(judgements.facts().count(), 1999);

        let migrating = LabelPolicy {
            mig_manager: true,
            ..LabelPolicy::default()
        };
        assert_eq!(judgements.refresh_facts(&nodes, &migrating, &detection), 1999);
    }
}
