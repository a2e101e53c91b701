//! The simulated cluster's shape, as a person writes it in YAML: node pools with their GPUs, OS, kernel,
//! container runtime, preinstalled driver, taints and labels, and the GPU workloads running on them
//! ([`Workload`]); and the Node objects a real cluster would show for them (labels NFD would add,
//! capacity, node info, conditions, addresses).

use std::collections::BTreeMap;

use gpuop_api::Operand;
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::hardware::GpuModel;
use crate::node_features;
use crate::spec_file::{self, FileError, Invalid};
use crate::workload::Workload;

/// A simulated cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// Whether Node Feature Discovery labels the nodes (PCI, kernel and OS labels).
    #[serde(default = "yes")]
    pub nfd: bool,
    /// The node pools.
    pub node_pools: Vec<NodePool>,
    /// GPU workloads: ReplicaSets of pods asking for GPUs, with optional disruption budgets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<Workload>,
}

fn yes() -> bool {
    true
}

/// Nodes that share a shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePool {
    /// Pool name; nodes are named `<name>-<index>`.
    pub name: String,
    /// Number of nodes.
    #[serde(default = "one")]
    pub count: u32,
    /// GPUs of each node; absent for CPU-only nodes.
    #[serde(default)]
    pub gpu: Option<GpuSpec>,
    /// Operating system, `<id>-<version>`: `ubuntu-22.04`, `ubuntu-24.04`, `rhel-9.4`.
    #[serde(default = "default_os")]
    pub os: String,
    /// Kernel release.
    #[serde(default = "default_kernel")]
    pub kernel: String,
    /// Container runtime, `<name>-<version>`: `containerd-1.7`, `containerd-2.0`, `cri-o-1.30`.
    #[serde(default = "default_runtime")]
    pub runtime: String,
    /// Whether the NVIDIA driver is installed on the host (a driver container then fails to load its own).
    #[serde(default)]
    pub driver_preinstalled: bool,
    /// Taints of each node.
    #[serde(default)]
    pub taints: Vec<TaintSpec>,
    /// Extra labels of each node.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// CPUs of each node.
    #[serde(default = "default_cpu")]
    pub cpu: u32,
    /// Memory of each node in GiB.
    #[serde(default = "default_memory")]
    pub memory_gib: u32,
}

fn one() -> u32 {
    1
}
fn default_os() -> String {
    "ubuntu-22.04".into()
}
fn default_kernel() -> String {
    "5.15.0-105-generic".into()
}
fn default_runtime() -> String {
    "containerd-1.7".into()
}
fn default_cpu() -> u32 {
    64
}
fn default_memory() -> u32 {
    512
}

/// GPUs of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSpec {
    /// The model.
    pub model: GpuModel,
    /// How many.
    #[serde(default = "eight")]
    pub count: u32,
}

fn eight() -> u32 {
    8
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaintSpec {
    /// Key.
    pub key: String,
    /// Value.
    #[serde(default)]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// A cluster spec that cannot be used, with the field and what is accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// A workload's field has a value the simulator cannot use.
    #[error("workloads[{workload}].{field}: {problem}")]
    Workload {
        /// Index of the workload.
        workload: usize,
        /// The field.
        field: &'static str,
        /// What is wrong and what is accepted.
        problem: String,
    },
    /// A field has a value the simulator does not know.
    #[error("nodePools[{pool}].{field}: {problem}")]
    Field {
        /// Index of the pool.
        pool: usize,
        /// The field.
        field: &'static str,
        /// What is wrong and what is accepted.
        problem: String,
    },
}

impl SpecError {
    /// The mistake by field path, for a spec found at `prefix` (`cluster.` in a scenario).
    pub fn invalid(&self, prefix: &str) -> Invalid {
        match self {
            SpecError::Workload {
                workload,
                field,
                problem,
            } => Invalid::at(format!("{prefix}workloads[{workload}].{field}"), problem.clone()),
            SpecError::Field { pool, field, problem } => {
                Invalid::at(format!("{prefix}nodePools[{pool}].{field}"), problem.clone())
            }
        }
    }
}

/// An operating system release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsRelease {
    /// NFD `system-os_release.ID`, e.g. `ubuntu`.
    pub id: String,
    /// NFD `system-os_release.VERSION_ID`, e.g. `22.04`.
    pub version: String,
}

impl OsRelease {
    /// The `osImage` a kubelet reports.
    pub fn image(&self) -> String {
        match self.id.as_str() {
            "ubuntu" => format!("Ubuntu {} LTS", self.version),
            "rhel" => format!("Red Hat Enterprise Linux {} (Plow)", self.version),
            other => format!("{other} {}", self.version),
        }
    }
}

impl NodePool {
    /// The pool's OS release.
    pub fn os_release(&self) -> OsRelease {
        let (id, version) = self.os.split_once('-').unwrap_or((self.os.as_str(), ""));
        OsRelease {
            id: id.to_owned(),
            version: version.to_owned(),
        }
    }

    /// `containerRuntimeVersion` as a kubelet reports it, e.g. `containerd://1.7.27`.
    pub fn runtime_version(&self) -> String {
        let (name, version) = self
            .runtime
            .rsplit_once('-')
            .unwrap_or((self.runtime.as_str(), "1.0"));
        let patch = if version.matches('.').count() >= 2 {
            String::new()
        } else {
            ".0".to_owned()
        };
        format!("{name}://{version}{patch}")
    }

    /// Names of the pool's nodes.
    pub fn node_names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.count).map(move |index| format!("{}-{index}", self.name))
    }
}

impl ClusterSpec {
    /// Parses and checks a cluster spec; a mistake is named by line, column and field path.
    pub fn from_yaml(text: &str) -> Result<Self, FileError> {
        spec_file::parse(text, |spec: &ClusterSpec| spec.check().map_err(|e| e.invalid("")))
    }

    /// Checks the values serde cannot: OS, runtime and taint effects, workload names and budgets.
    pub fn check(&self) -> Result<(), SpecError> {
        for (pool_index, pool) in self.node_pools.iter().enumerate() {
            let field = |field: &'static str, problem: String| SpecError::Field {
                pool: pool_index,
                field,
                problem,
            };
            let os = pool.os_release();
            let known_os = match os.id.as_str() {
                "ubuntu" => ["22.04", "24.04"].contains(&os.version.as_str()),
                "rhel" => os.version.starts_with("9.") && os.version.len() > 2,
                _ => false,
            };
            if !known_os {
                return Err(field(
                    "os",
                    format!(
                        "{:?} is not one of ubuntu-22.04, ubuntu-24.04, rhel-9.<minor>",
                        pool.os
                    ),
                ));
            }
            let runtime_ok = ["containerd-1.", "containerd-2.", "cri-o-1."]
                .iter()
                .any(|p| pool.runtime.starts_with(p));
            if !runtime_ok {
                return Err(field(
                    "runtime",
                    format!(
                        "{:?} is not one of containerd-1.<minor>, containerd-2.<minor>, cri-o-1.<minor>",
                        pool.runtime
                    ),
                ));
            }
            for taint in &pool.taints {
                if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&taint.effect.as_str()) {
                    return Err(field(
                        "taints",
                        format!(
                            "effect {:?} is not one of NoSchedule, PreferNoSchedule, NoExecute",
                            taint.effect
                        ),
                    ));
                }
            }
            if pool.gpu.as_ref().is_some_and(|gpu| gpu.count == 0) {
                return Err(field(
                    "gpu.count",
                    "must be at least 1; leave `gpu` out for CPU-only nodes".into(),
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (pool_index, pool) in self.node_pools.iter().enumerate() {
            if !names.insert(&pool.name) {
                return Err(SpecError::Field {
                    pool: pool_index,
                    field: "name",
                    problem: format!("{:?} is used twice", pool.name),
                });
            }
        }
        let mut workloads = std::collections::BTreeSet::new();
        for (index, workload) in self.workloads.iter().enumerate() {
            let error = |field, problem| SpecError::Workload {
                workload: index,
                field,
                problem,
            };
            if let Some((field, problem)) = workload.problem() {
                return Err(error(field, problem));
            }
            if !workloads.insert((&workload.namespace, &workload.name)) {
                return Err(error(
                    "name",
                    format!(
                        "{:?} is used twice in namespace {:?}",
                        workload.name, workload.namespace
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The built-in cluster of `gpu-sim demo`: two A100 nodes for MIG, two H100, one node with a
    /// preinstalled driver (`gpu.deploy.driver=false`), one GPU node tainted against the operands, and one
    /// CPU-only node.
    pub fn demo() -> Self {
        let gpu_pool = |name: &str, model, count| NodePool {
            name: name.to_owned(),
            count,
            gpu: Some(GpuSpec { model, count: 8 }),
            os: default_os(),
            kernel: default_kernel(),
            runtime: default_runtime(),
            driver_preinstalled: false,
            taints: Vec::new(),
            labels: BTreeMap::new(),
            cpu: 96,
            memory_gib: 1024,
        };
        let mut preinstalled = gpu_pool("l4-host-driver", GpuModel::L4, 1);
        preinstalled.driver_preinstalled = true;
        preinstalled.gpu = Some(GpuSpec {
            model: GpuModel::L4,
            count: 4,
        });
        preinstalled
            .labels
            .insert(Operand::Driver.info().deploy_label.into(), "false".into());
        preinstalled.os = "ubuntu-24.04".into();
        preinstalled.kernel = "6.8.0-45-generic".into();
        let mut tainted = gpu_pool("t4-reserved", GpuModel::T4, 1);
        tainted.gpu = Some(GpuSpec {
            model: GpuModel::T4,
            count: 2,
        });
        tainted.taints.push(TaintSpec {
            key: "dedicated".into(),
            value: Some("batch".into()),
            effect: "NoSchedule".into(),
        });
        let cpu = NodePool {
            gpu: None,
            cpu: 32,
            memory_gib: 128,
            ..gpu_pool("cpu", GpuModel::T4, 1)
        };
        Self {
            nfd: true,
            node_pools: vec![
                gpu_pool("a100", GpuModel::A100_80GB, 2),
                gpu_pool("h100", GpuModel::H100_80GB, 2),
                preinstalled,
                tainted,
                cpu,
            ],
            workloads: Vec::new(),
        }
    }

    /// The cluster with this workload too.
    #[must_use]
    pub fn with_workload(mut self, workload: Workload) -> Self {
        self.workloads.push(workload);
        self
    }

    /// Every node of the cluster, with its pool.
    pub fn nodes(&self) -> impl Iterator<Item = (String, &NodePool)> {
        self.node_pools
            .iter()
            .flat_map(|pool| pool.node_names().map(move |name| (name, pool)))
    }
}

/// The conditions a simulated node's kubelet reports, each with its `lastHeartbeatTime`.
pub const NODE_CONDITIONS: [&str; 4] = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"];

/// The Node object of a simulated node, as its kubelet and NFD would leave it (before any operand runs).
pub fn node_object(name: &str, pool: &NodePool, nfd: bool, index: u32) -> Node {
    let os = pool.os_release();
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), "amd64".to_owned()),
        ("gpu-sim.io/pool".to_owned(), pool.name.clone()),
    ]);
    labels.extend(node_features::provider_labels(pool, index));
    let nfd_labels = if nfd {
        node_features::nfd_labels(pool)
    } else {
        BTreeMap::new()
    };
    let annotations = node_features::annotations(name, &nfd_labels);
    labels.extend(nfd_labels);
    labels.extend(pool.labels.clone());
    let quantity = |text: String| Quantity(text);
    let resources = BTreeMap::from([
        ("cpu".to_owned(), quantity(pool.cpu.to_string())),
        ("memory".to_owned(), quantity(format!("{}Gi", pool.memory_gib))),
        ("pods".to_owned(), quantity("110".into())),
        ("ephemeral-storage".to_owned(), quantity("500Gi".into())),
    ]);
    let taints: Vec<Taint> = pool
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
            ..Taint::default()
        })
        .collect();
    let condition = |type_: &str, status: &str, reason: &str| NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(format!("simulated kubelet: {reason}")),
        ..NodeCondition::default()
    };
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            provider_id: Some(format!("gpu-sim://{name}")),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            conditions: Some(vec![
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ]),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: format!("10.{}.{}.{}", 0, index / 250, index % 250 + 2),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.to_owned(),
                },
            ]),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("boot-{name}"),
                container_runtime_version: pool.runtime_version(),
                kernel_version: pool.kernel.clone(),
                kube_proxy_version: "v1.33.0".into(),
                kubelet_version: "v1.33.0".into(),
                machine_id: format!("machine-{name}"),
                operating_system: "linux".into(),
                os_image: os.image(),
                system_uuid: format!("uuid-{name}"),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::labels::{NFD_OS_ID, NFD_OS_VERSION_MAJOR};

    #[test]
    fn a_spec_parses_with_defaults() {
        let spec = ClusterSpec::from_yaml(
            "nodePools:\n- name: a100\n  count: 3\n  gpu: {model: A100-80GB}\n- name: cpu\n  os: rhel-9.4\n  runtime: cri-o-1.30\n",
        )
        .unwrap();
        assert!(spec.nfd);
        let names: Vec<String> = spec.nodes().map(|(name, _)| name).collect();
        assert_eq!(names, ["a100-0", "a100-1", "a100-2", "cpu-0"]);
        assert_eq!(
            spec.node_pools[0].gpu,
            Some(GpuSpec {
                model: GpuModel::A100_80GB,
                count: 8
            })
        );
        assert_eq!(spec.node_pools[1].runtime_version(), "cri-o://1.30.0");
        assert_eq!(
            spec.node_pools[1].os_release(),
            OsRelease {
                id: "rhel".into(),
                version: "9.4".into()
            }
        );
    }

    #[test]
    fn mistakes_name_the_pool_and_field() {
        let error = |yaml: &str| ClusterSpec::from_yaml(yaml).unwrap_err().to_string();
        assert_eq!(
            error("nodePools:\n- name: a\n  os: debian-12\n"),
            r#"line 3 column 3: nodePools[0].os: "debian-12" is not one of ubuntu-22.04, ubuntu-24.04, rhel-9.<minor>"#
        );
        assert!(error("nodePools:\n- name: a\n  gpu: {model: B200}\n").contains("unknown variant `B200`"));
        assert_eq!(
            error("nodePools:\n- name: a\n  gpus: 2\n"),
            "line 3 column 3: nodePools[0].gpus: unknown field `gpus`, expected one of name, count, gpu, os, \
             kernel, runtime, driverPreinstalled, taints, labels, cpu, memoryGib"
        );
        assert_eq!(
            error("nodePools:\n- name: a\n- name: a\n"),
            r#"line 3 column 3: nodePools[1].name: "a" is used twice"#
        );
        assert_eq!(
            error("nodePools:\n- name: a\n  taints: [{key: x, effect: Never}]\n"),
            r#"line 3 column 3: nodePools[0].taints: effect "Never" is not one of NoSchedule, PreferNoSchedule, NoExecute"#
        );
    }

    #[test]
    fn workloads_parse_with_defaults_and_mistakes_name_the_workload() {
        let spec = ClusterSpec::from_yaml(
            "nodePools: [{name: h100, gpu: {model: H100-80GB}}]
workloads:
  - {name: infer, replicas: 3}
  - name: train
    namespace: ml
    replicas: 4
    gpusPerPod: 2
    nodeSelector: {gpu-sim.io/pool: h100}
    tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
    disruptionBudget: {maxUnavailable: 25%}
",
        )
        .unwrap();
        assert_eq!(spec.workloads[0], Workload::gpu("infer", 3));
        let train = &spec.workloads[1];
        assert_eq!(
            (
                train.namespace.as_str(),
                train.gpus_per_pod,
                train.gpu_resource.as_str()
            ),
            ("ml", 2, "nvidia.com/gpu")
        );
        assert_eq!(train.tolerations[0].key.as_deref(), Some("dedicated"));
        let budget = train.disruption_budget().unwrap().spec.unwrap();
        assert_eq!(
            budget.max_unavailable,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
                "25%".into()
            ))
        );
        let error = |yaml: &str| ClusterSpec::from_yaml(yaml).unwrap_err().to_string();
        assert_eq!(
            error("nodePools: []\nworkloads: [{name: a}, {name: a}]\n"),
            r#"line 2 column 25: workloads[1].name: "a" is used twice in namespace "default""#
        );
        assert_eq!(
            error("nodePools: []\nworkloads: [{name: a, disruptionBudget: {}}]\n"),
            "line 2 column 23: workloads[0].disruptionBudget: give exactly one of minAvailable, maxUnavailable"
        );
        assert!(error("nodePools: []\nworkloads: [{name: a, gpus: 2}]\n").contains("unknown field `gpus`"));
    }

    #[test]
    fn nodes_look_like_real_ones() {
        let spec = ClusterSpec::demo();
        let (name, pool) = spec.nodes().next().unwrap();
        let node = node_object(&name, pool, true, 0);
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["feature.node.kubernetes.io/pci-10de.present"], "true");
        assert_eq!(labels[NFD_OS_ID], "ubuntu");
        assert_eq!(labels[NFD_OS_VERSION_MAJOR], "22");
        let status = node.status.unwrap();
        let info = status.node_info.unwrap();
        assert_eq!(info.container_runtime_version, "containerd://1.7.0");
        assert_eq!(info.os_image, "Ubuntu 22.04 LTS");
        assert_eq!(status.allocatable.unwrap()["cpu"], Quantity("96".into()));
        assert!(
            status
                .conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
        let without_nfd = node_object(&name, pool, false, 0);
        assert!(
            !without_nfd
                .metadata
                .labels
                .unwrap()
                .keys()
                .any(|k| k.starts_with("feature.node"))
        );
    }

    #[test]
    fn the_demo_cluster_has_every_case_the_issue_asks_for() {
        let demo = ClusterSpec::demo();
        demo.check().unwrap();
        let pools: Vec<(&str, u32)> = demo
            .node_pools
            .iter()
            .map(|p| (p.name.as_str(), p.count))
            .collect();
        assert_eq!(
            pools,
            [
                ("a100", 2),
                ("h100", 2),
                ("l4-host-driver", 1),
                ("t4-reserved", 1),
                ("cpu", 1)
            ]
        );
        assert!(demo.node_pools[2].driver_preinstalled);
        assert_eq!(demo.node_pools[2].labels["nvidia.com/gpu.deploy.driver"], "false");
        assert_eq!(demo.node_pools[3].taints.len(), 1);
        assert!(demo.node_pools[4].gpu.is_none());
    }
}
