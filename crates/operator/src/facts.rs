//! Cluster facts the renderer needs, derived purely from the operator's node cache: the container runtime
//! of the GPU nodes and their OS (and kernel) pools, plus a census of GPU and NFD-labelled nodes for the
//! status conditions.
//!
//! GPU nodes are those [`GpuDetection`] recognises (NFD's labels or the operator's selector), the same rule
//! the labeller follows, never the operator's own `nvidia.com/gpu.present` echo: on a fresh cluster that
//! label arrives a watch round trip after the first pass, which would otherwise render no driver and
//! report a GPU cluster as having no GPU nodes.

use std::collections::{BTreeMap, BTreeSet};

use gpuop_api::labels::{
    GpuDetection, NFD_KERNEL_VERSION, NFD_OS_ID, NFD_OS_VERSION, UPGRADE_FAILURE, UPGRADE_STATE,
};
use gpuop_api::read::NodeRead;
use gpuop_api::upgrade::UpgradeState;
use gpuop_render::{ClusterFacts, ContainerRuntime, OsPool};

use crate::labeler::{DesiredPatches, LabelPolicy};
use crate::projection::{NodeRecord, Text};

/// What one node contributes to the facts and the census: judged once per node ([`judge_node`]) and reused
/// while neither the node's record nor the labeller's inputs change ([`crate::index`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// Whether it carries any NFD label.
    pub nfd_labels: bool,
    /// Whether it has an NVIDIA GPU; the rest is only filled in for GPU nodes.
    pub gpu: bool,
    /// Its labels are not yet what the labeller wants.
    pub unlabelled: bool,
    /// Why its driver upgrade failed, while it did.
    pub upgrade_failure: Option<String>,
    /// Its container runtime, when the toolkit knows it.
    pub runtime: Option<ContainerRuntime>,
    /// NFD's OS id and version, both non-empty.
    pub os: Option<(Text, Text)>,
    /// NFD's full kernel version, non-empty.
    pub kernel: Option<Text>,
}

/// The runtime named by a `containerRuntimeVersion` (`containerd://1.7.27`), if it is one the toolkit knows.
pub fn runtime_of(runtime_version: &str) -> Option<ContainerRuntime> {
    let (name, _) = runtime_version.split_once("://")?;
    match name {
        "containerd" => Some(ContainerRuntime::Containerd),
        "cri-o" => Some(ContainerRuntime::Crio),
        "docker" => Some(ContainerRuntime::Docker),
        _ => None,
    }
}

/// Judges one node: whether it has a GPU and carries NFD labels, and of a GPU node, whether its labels are
/// what the labeller wants, its upgrade failure, runtime, OS and kernel.
pub fn judge_node(
    node: &NodeRecord,
    labelling: &LabelPolicy,
    detection: &GpuDetection,
    desired: &mut DesiredPatches,
) -> NodeFacts {
    let mut facts = NodeFacts {
        nfd_labels: node.nfd_labels,
        gpu: detection.has_gpu(&node.labels),
        unlabelled: false,
        upgrade_failure: None,
        runtime: None,
        os: None,
        kernel: None,
    };
    if !facts.gpu {
        return facts;
    }
    if node.label(UPGRADE_STATE) == Some(UpgradeState::Failed.label()) {
        facts.upgrade_failure = Some(
            node.annotation(UPGRADE_FAILURE)
                .unwrap_or("no reason recorded")
                .to_owned(),
        );
    }
    facts.unlabelled = !desired.of(node, Some(labelling), detection).labels.is_empty();
    facts.runtime = node.runtime_version.as_deref().and_then(runtime_of);
    let label = |key: &str| node.labels.shared(key).filter(|v| !v.is_empty());
    facts.os = label(NFD_OS_ID).zip(label(NFD_OS_VERSION));
    facts.kernel = label(NFD_KERNEL_VERSION);
    facts
}

/// Counts the status conditions are built from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Nodes with an NVIDIA GPU.
    pub gpu_nodes: usize,
    /// GPU nodes whose labels are not yet what the labeller wants (the patch is not written, or its
    /// echo has not reached the cache): their operands cannot be judged yet.
    pub gpu_nodes_unlabelled: Vec<String>,
    /// Whether any node carries an NFD label.
    pub nfd_labels: bool,
    /// With NVIDIADriver objects managing the driver: GPU nodes none of them selects (they get no driver).
    pub gpu_nodes_without_driver: Vec<String>,
    /// GPU nodes whose driver upgrade failed, with the reason the upgrade controller left on them.
    pub upgrade_failures: Vec<(String, String)>,
}

/// What the facts depend on besides the nodes.
#[derive(Clone, Copy, Debug)]
pub struct FactsInput<'a> {
    /// Namespace the operands run in.
    pub namespace: &'a str,
    /// Whether drivers are precompiled per kernel.
    pub precompiled: bool,
    /// Whether the ServiceMonitor CRD is installed.
    pub service_monitor_crd: bool,
}

/// The facts for rendering, and the census, from the judged nodes, given by name with their
/// [`NodeFacts`] ([`FactSums::derive`] says how they are derived).
pub fn cluster_facts<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a NodeFacts)>,
    input: FactsInput<'_>,
) -> (ClusterFacts, Census) {
    let mut sums = FactSums::default();
    for (name, node) in nodes {
        sums.add(&Text::from(name), node);
    }
    sums.derive(input)
}

/// What the cluster facts and the census are derived from, summed over the nodes' facts and kept up to
/// date one node at a time ([`Self::add`], [`Self::remove`]): a node whose facts change costs its own
/// facts, not a walk over the cluster's.
#[derive(Debug, Default)]
pub struct FactSums {
    /// Nodes that carry an NFD label.
    nfd_nodes: usize,
    gpu_nodes: usize,
    unlabelled: BTreeSet<Text>,
    upgrade_failures: BTreeMap<Text, String>,
    /// GPU nodes per container runtime the toolkit knows.
    runtimes: Vec<(ContainerRuntime, usize)>,
    /// GPU nodes per OS release and full kernel version.
    releases: BTreeMap<(Text, Text, Option<Text>), usize>,
}

impl FactSums {
    /// Counts in one node's facts.
    pub fn add(&mut self, name: &Text, node: &NodeFacts) {
        self.nfd_nodes += usize::from(node.nfd_labels);
        if !node.gpu {
            return;
        }
        self.gpu_nodes += 1;
        if let Some(why) = &node.upgrade_failure {
            self.upgrade_failures.insert(name.clone(), why.clone());
        }
        if node.unlabelled {
            self.unlabelled.insert(name.clone());
        }
        if let Some(runtime) = node.runtime {
            match self.runtimes.iter_mut().find(|(known, _)| *known == runtime) {
                Some((_, count)) => *count += 1,
                None => self.runtimes.push((runtime, 1)),
            }
        }
        if let Some((os_id, os_version)) = &node.os {
            *self
                .releases
                .entry((os_id.clone(), os_version.clone(), node.kernel.clone()))
                .or_default() += 1;
        }
    }

    /// Counts out one node's facts, as they were counted in.
    pub fn remove(&mut self, name: &Text, node: &NodeFacts) {
        self.nfd_nodes = self.nfd_nodes.saturating_sub(usize::from(node.nfd_labels));
        if !node.gpu {
            return;
        }
        self.gpu_nodes = self.gpu_nodes.saturating_sub(1);
        self.upgrade_failures.remove(name);
        self.unlabelled.remove(name);
        if let Some(runtime) = node.runtime {
            self.runtimes
                .iter_mut()
                .filter(|(known, _)| *known == runtime)
                .for_each(|(_, count)| *count = count.saturating_sub(1));
            self.runtimes.retain(|(_, count)| *count > 0);
        }
        if let Some((os_id, os_version)) = &node.os {
            let release = (os_id.clone(), os_version.clone(), node.kernel.clone());
            if let Some(count) = self.releases.get_mut(&release) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    self.releases.remove(&release);
                }
            }
        }
    }

    /// The cluster facts and the census of the nodes counted in.
    ///
    /// The runtime follows NVIDIA's rule: containerd if any GPU node runs it, else CRI-O, else Docker;
    /// unknown means containerd. OS pools are the distinct OS releases of the GPU nodes, with the kernel
    /// when drivers are precompiled. Names are listed in name order.
    pub fn derive(&self, input: FactsInput<'_>) -> (ClusterFacts, Census) {
        let census = Census {
            gpu_nodes: self.gpu_nodes,
            gpu_nodes_unlabelled: self.unlabelled.iter().map(|name| name.to_string()).collect(),
            nfd_labels: self.nfd_nodes > 0,
            gpu_nodes_without_driver: Vec::new(),
            upgrade_failures: self
                .upgrade_failures
                .iter()
                .map(|(name, why)| (name.to_string(), why.clone()))
                .collect(),
        };
        let runtime = [
            ContainerRuntime::Containerd,
            ContainerRuntime::Crio,
            ContainerRuntime::Docker,
        ]
        .into_iter()
        .find(|runtime| self.runtimes.iter().any(|(known, _)| known == runtime))
        .unwrap_or_default();
        // Thousands of nodes share a few releases; the kernel tells pools apart only for precompiled drivers.
        let pools: BTreeSet<OsPool> = self
            .releases
            .keys()
            .map(|(os_id, os_version, kernel)| OsPool {
                os_id: os_id.to_string(),
                os_version: os_version.to_string(),
                kernel: kernel
                    .as_ref()
                    .filter(|_| input.precompiled)
                    .map(|k| k.to_string()),
            })
            .collect();
        let facts = ClusterFacts {
            config_map_keys: BTreeMap::new(),
            namespace: input.namespace.to_owned(),
            runtime,
            driver_pools: pools.into_iter().collect(),
            service_monitor_crd: input.service_monitor_crd,
        };
        (facts, census)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labeler::desired_labels;
    use crate::projection::{Interner, NodeKeys};
    use gpuop_api::labels::GPU_PRESENT;
    use k8s_openapi::api::core::v1::{Node, NodeStatus, NodeSystemInfo};

    const NFD_GPU: &str = "feature.node.kubernetes.io/pci-10de.present";

    /// A node with these labels whose kubelet reports the container runtime `runtime`.
    fn node(name: &str, labels: &[(&str, &str)], runtime: &str) -> Node {
        let mut node = gpuop_testkit::fixture::node(name).labels(labels).build();
        node.status = Some(NodeStatus {
            node_info: Some(NodeSystemInfo {
                container_runtime_version: runtime.to_owned(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        });
        node
    }

    fn facts(
        nodes: &[Node],
        namespace: &str,
        precompiled: bool,
        service_monitor_crd: bool,
    ) -> (ClusterFacts, Census) {
        let input = FactsInput {
            namespace,
            precompiled,
            service_monitor_crd,
        };
        let judged = judged(nodes);
        cluster_facts(judged.iter().map(|(name, facts)| (&**name, facts)), input)
    }

    /// Each node's name and facts, judged with the default labeller inputs and NFD detection.
    fn judged(nodes: &[Node]) -> Vec<(Text, NodeFacts)> {
        let mut interner = Interner::default();
        nodes
            .iter()
            .map(|node| {
                let record = NodeRecord::project(node, &NodeKeys::default(), &mut interner);
                let facts = judge_node(
                    &record,
                    &LabelPolicy::default(),
                    &GpuDetection::Nfd,
                    &mut DesiredPatches::default(),
                );
                (record.name, facts)
            })
            .collect()
    }

    fn gpu(name: &str, os: &str, version: &str, kernel: &str, runtime: &str) -> Node {
        node(
            name,
            &[
                (NFD_OS_ID, os),
                (NFD_OS_VERSION, version),
                (NFD_KERNEL_VERSION, kernel),
                (NFD_GPU, "true"),
            ],
            runtime,
        )
    }

    #[test]
    fn one_pool_per_os_release_of_the_gpu_nodes() {
        let nodes = [
            gpu("a", "ubuntu", "22.04", "5.15.0-1", "containerd://1.7.27"),
            gpu("b", "ubuntu", "22.04", "5.15.0-2", "containerd://1.7.27"),
            gpu("c", "rhel", "9.4", "5.14.0-427", "cri-o://1.30.1"),
            node(
                "cpu",
                &[(NFD_OS_ID, "debian"), (NFD_OS_VERSION, "12")],
                "containerd://2.0.0",
            ),
        ];
        let (rendered, census) = facts(&nodes, "gpu-operator", false, true);
        assert_eq!(
            rendered.driver_pools,
            [
                OsPool {
                    os_id: "rhel".into(),
                    os_version: "9.4".into(),
                    kernel: None
                },
                OsPool {
                    os_id: "ubuntu".into(),
                    os_version: "22.04".into(),
                    kernel: None
                },
            ]
        );
        assert_eq!(
            rendered.runtime,
            ContainerRuntime::Containerd,
            "any containerd GPU node wins"
        );
        assert_eq!(rendered.namespace, "gpu-operator");
        assert!(rendered.service_monitor_crd);
        assert_eq!(census.gpu_nodes, 3);
        assert!(census.nfd_labels);
        let (precompiled, _) = facts(&nodes, "gpu-operator", true, false);
        assert_eq!(precompiled.driver_pools.len(), 3, "one pool per kernel");
    }

    #[test]
    fn runtime_follows_nvidias_preference() {
        let crio = [
            gpu("a", "rhel", "9.4", "k", "cri-o://1.30.1"),
            gpu("b", "rhel", "9.4", "k", "docker://27.1"),
        ];
        assert_eq!(facts(&crio, "ns", false, false).0.runtime, ContainerRuntime::Crio);
        let unknown = [gpu("a", "rhel", "9.4", "k", "something://1")];
        assert_eq!(
            facts(&unknown, "ns", false, false).0.runtime,
            ContainerRuntime::Containerd
        );
    }

    #[test]
    fn gpu_nodes_without_os_labels_make_no_driver_pool() {
        let nodes = [
            node("a", &[(NFD_GPU, "true")], "containerd://1.7.0"),
            node("b", &[], "containerd://1.7.0"),
        ];
        let (rendered, census) = facts(&nodes, "ns", false, false);
        assert!(rendered.driver_pools.is_empty());
        assert_eq!(census.gpu_nodes, 1);
        let (_, empty) = facts(&[], "ns", false, false);
        assert_eq!(empty.gpu_nodes, 0);
        assert!(!empty.nfd_labels);
    }

    #[test]
    fn gpu_nodes_are_recognised_by_nfd_not_by_the_operators_own_label() {
        // A fresh cluster: NFD has labelled the node, the operator has not yet.
        let fresh = [gpu("a", "ubuntu", "22.04", "k", "containerd://1.7.27")];
        let (rendered, census) = facts(&fresh, "ns", false, false);
        assert_eq!(census.gpu_nodes, 1);
        assert_eq!(
            rendered.driver_pools.len(),
            1,
            "the first pass renders the driver"
        );
        // The operator's echo alone, without NFD's label, is no GPU.
        let echo_only = [node("b", &[(GPU_PRESENT, "true")], "containerd://1.7.0")];
        assert_eq!(facts(&echo_only, "ns", false, false).1.gpu_nodes, 0);
    }

    #[test]
    fn gpu_nodes_wait_for_their_labels_until_the_cache_shows_them() {
        let mut fresh = gpu("a", "ubuntu", "22.04", "k", "containerd://1.7.27");
        let (_, census) = facts(std::slice::from_ref(&fresh), "ns", false, false);
        assert_eq!(census.gpu_nodes_unlabelled, ["a"]);

        // The labeller's patch, as the cache shows it once echoed.
        let patch = desired_labels(
            fresh.metadata.labels.as_ref().unwrap(),
            &BTreeMap::new(),
            Some(&LabelPolicy::default()),
            &GpuDetection::Nfd,
        );
        let labels = fresh.metadata.labels.get_or_insert_default();
        for (key, value) in patch.labels {
            match value {
                Some(value) => labels.insert(key, value),
                None => labels.remove(&key),
            };
        }
        let (_, census) = facts(std::slice::from_ref(&fresh), "ns", false, false);
        assert!(census.gpu_nodes_unlabelled.is_empty(), "{census:?}");

        // A value a person chose, which the labeller leaves alone, is no reason to wait.
        fresh
            .metadata
            .labels
            .get_or_insert_default()
            .insert("nvidia.com/gpu.deploy.dcgm-exporter".into(), "false".into());
        let (_, census) = facts(std::slice::from_ref(&fresh), "ns", false, false);
        assert!(census.gpu_nodes_unlabelled.is_empty(), "{census:?}");
    }

    /// Counting a node out undoes counting it in: after nodes leave, the sums derive what counting the
    /// rest afresh derives, pools, runtime, failures and all.
    #[test]
    fn sums_follow_nodes_that_leave() {
        let mut failed = gpu("b", "ubuntu", "22.04", "5.15.0-2", "cri-o://1.30.1");
        let labels = failed.metadata.labels.get_or_insert_default();
        labels.insert(UPGRADE_STATE.into(), UpgradeState::Failed.label().into());
        let nodes = [
            gpu("a", "ubuntu", "22.04", "5.15.0-1", "containerd://1.7.27"),
            failed,
            gpu("c", "rhel", "9.4", "5.14.0-427", "cri-o://1.30.1"),
            node("cpu", &[(NFD_OS_ID, "debian")], "containerd://2.0.0"),
        ];
        let judged = judged(&nodes);
        let input = FactsInput {
            namespace: "ns",
            precompiled: true,
            service_monitor_crd: false,
        };
        let mut sums = FactSums::default();
        for (name, facts) in &judged {
            sums.add(name, facts);
        }
        let (all, census) = sums.derive(input);
        assert_eq!(
            (all.driver_pools.len(), all.runtime),
            (3, ContainerRuntime::Containerd)
        );
        assert_eq!(census.upgrade_failures.len(), 1);
        for leaving in ["a", "b"] {
            let (name, facts) = judged.iter().find(|(name, _)| &**name == leaving).unwrap();
            sums.remove(name, facts);
        }
        let rest = judged
            .iter()
            .filter(|(name, _)| !["a", "b"].contains(&&**name))
            .map(|(name, facts)| (&**name, facts));
        let (facts, census) = sums.derive(input);
        assert_eq!((facts.clone(), census.clone()), cluster_facts(rest, input));
        assert_eq!(
            (facts.driver_pools.len(), facts.runtime),
            (1, ContainerRuntime::Crio)
        );
        assert!(census.upgrade_failures.is_empty() && census.nfd_labels);
        assert_eq!(census.gpu_nodes, 1);
    }
}
