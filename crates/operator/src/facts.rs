//! Cluster facts the renderer needs, derived purely from the operator's node cache: the container runtime
//! of the GPU nodes and their OS (and kernel) pools, plus a census of GPU and NFD-labelled nodes for the
//! status conditions.

use std::collections::{BTreeMap, BTreeSet};

use gpuop_api::labels::{GPU_PRESENT, NFD_KERNEL_VERSION, NFD_OS_ID, NFD_OS_VERSION, NFD_PREFIX};
use gpuop_render::{ClusterFacts, ContainerRuntime, OsPool};
use k8s_openapi::api::core::v1::Node;

/// The fields of a cached Node the facts come from, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFacts<'a> {
    /// Node name.
    pub name: &'a str,
    /// All labels.
    pub labels: &'a BTreeMap<String, String>,
    /// `status.nodeInfo.containerRuntimeVersion`, e.g. `containerd://1.7.27`.
    pub runtime_version: Option<&'a str>,
}

impl<'a> NodeFacts<'a> {
    /// The facts of a node.
    pub fn of(node: &'a Node) -> Self {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        Self {
            name: node.metadata.name.as_deref().unwrap_or_default(),
            labels: node.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            runtime_version: node
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.container_runtime_version.as_str()),
        }
    }

    /// Whether the labeller marked the node as having a GPU.
    pub fn has_gpu(&self) -> bool {
        self.labels.get(GPU_PRESENT).is_some_and(|v| v == "true")
    }

    /// The runtime named by `containerRuntimeVersion`, if it is one the toolkit knows.
    pub fn runtime(&self) -> Option<ContainerRuntime> {
        let (name, _) = self.runtime_version?.split_once("://")?;
        match name {
            "containerd" => Some(ContainerRuntime::Containerd),
            "cri-o" => Some(ContainerRuntime::Crio),
            "docker" => Some(ContainerRuntime::Docker),
            _ => None,
        }
    }
}

/// Counts the status conditions are built from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Nodes labelled `nvidia.com/gpu.present=true`.
    pub gpu_nodes: usize,
    /// Whether any node carries an NFD label.
    pub nfd_labels: bool,
    /// GPU nodes without the NFD OS labels a driver image needs.
    pub gpu_nodes_without_os: Vec<String>,
}

/// The facts for rendering, and the census, from the cached nodes.
///
/// The runtime follows NVIDIA's rule: containerd if any GPU node runs it, else CRI-O, else Docker; unknown
/// means containerd. OS pools are the distinct OS releases of the GPU nodes, with the kernel when drivers are
/// precompiled.
pub fn cluster_facts<'a>(
    nodes: impl IntoIterator<Item = NodeFacts<'a>>,
    namespace: &str,
    precompiled: bool,
    service_monitor_crd: bool,
) -> (ClusterFacts, Census) {
    let mut census = Census::default();
    let mut runtimes = Vec::new();
    let mut pools = BTreeSet::new();
    for node in nodes {
        census.nfd_labels |= node.labels.keys().any(|key| key.starts_with(NFD_PREFIX));
        if !node.has_gpu() {
            continue;
        }
        census.gpu_nodes += 1;
        if let Some(runtime) = node.runtime().filter(|runtime| !runtimes.contains(runtime)) {
            runtimes.push(runtime);
        }
        let label = |key: &str| node.labels.get(key).filter(|v| !v.is_empty());
        match (label(NFD_OS_ID), label(NFD_OS_VERSION)) {
            (Some(os_id), Some(os_version)) => {
                let kernel = if precompiled {
                    label(NFD_KERNEL_VERSION)
                } else {
                    None
                };
                // Thousands of nodes share a few releases: copy the strings only for a new one.
                let known = pools.iter().any(|pool: &OsPool| {
                    &pool.os_id == os_id && &pool.os_version == os_version && pool.kernel.as_ref() == kernel
                });
                if !known {
                    pools.insert(OsPool {
                        os_id: os_id.clone(),
                        os_version: os_version.clone(),
                        kernel: kernel.cloned(),
                    });
                }
            }
            _ => census.gpu_nodes_without_os.push(node.name.to_owned()),
        }
    }
    let runtime = [
        ContainerRuntime::Containerd,
        ContainerRuntime::Crio,
        ContainerRuntime::Docker,
    ]
    .into_iter()
    .find(|runtime| runtimes.contains(runtime))
    .unwrap_or_default();
    let facts = ClusterFacts {
        config_map_keys: BTreeMap::new(),
        namespace: namespace.to_owned(),
        runtime,
        driver_pools: pools.into_iter().collect(),
        service_monitor_crd,
    };
    (facts, census)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};

    fn node(name: &str, labels: &[(&str, &str)], runtime: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        node.status = Some(NodeStatus {
            node_info: Some(NodeSystemInfo {
                container_runtime_version: runtime.to_owned(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        });
        node
    }

    fn of(nodes: &[Node]) -> impl Iterator<Item = NodeFacts<'_>> {
        nodes.iter().map(NodeFacts::of)
    }

    fn gpu(name: &str, os: &str, version: &str, kernel: &str, runtime: &str) -> Node {
        node(
            name,
            &[
                (GPU_PRESENT, "true"),
                (NFD_OS_ID, os),
                (NFD_OS_VERSION, version),
                (NFD_KERNEL_VERSION, kernel),
                ("feature.node.kubernetes.io/pci-10de.present", "true"),
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
        let (facts, census) = cluster_facts(of(&nodes), "gpu-operator", false, true);
        assert_eq!(
            facts.driver_pools,
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
            facts.runtime,
            ContainerRuntime::Containerd,
            "any containerd GPU node wins"
        );
        assert_eq!(facts.namespace, "gpu-operator");
        assert!(facts.service_monitor_crd);
        assert_eq!(census.gpu_nodes, 3);
        assert!(census.nfd_labels);
        let (precompiled, _) = cluster_facts(of(&nodes), "gpu-operator", true, false);
        assert_eq!(precompiled.driver_pools.len(), 3, "one pool per kernel");
    }

    #[test]
    fn runtime_follows_nvidias_preference() {
        let crio = [
            gpu("a", "rhel", "9.4", "k", "cri-o://1.30.1"),
            gpu("b", "rhel", "9.4", "k", "docker://27.1"),
        ];
        assert_eq!(
            cluster_facts(of(&crio), "ns", false, false).0.runtime,
            ContainerRuntime::Crio
        );
        let unknown = [gpu("a", "rhel", "9.4", "k", "something://1")];
        assert_eq!(
            cluster_facts(of(&unknown), "ns", false, false).0.runtime,
            ContainerRuntime::Containerd
        );
    }

    #[test]
    fn the_census_sees_missing_nfd_and_missing_os_labels() {
        let nodes = [
            node("a", &[(GPU_PRESENT, "true")], "containerd://1.7.0"),
            node("b", &[], "containerd://1.7.0"),
        ];
        let (facts, census) = cluster_facts(of(&nodes), "ns", false, false);
        assert!(facts.driver_pools.is_empty());
        assert_eq!(census.gpu_nodes_without_os, ["a"]);
        assert!(!census.nfd_labels);
        let (_, empty) = cluster_facts(of(&[]), "ns", false, false);
        assert_eq!(empty.gpu_nodes, 0);
    }
}
