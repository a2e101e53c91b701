//! How much memory the operator's node and pod caches take at fleet scale: fills them with `--nodes`
//! realistic GPU nodes (about 150 NFD labels, 45 others, a few annotations, as a cloud provider, NFD, GPU
//! feature discovery and the operator leave them) and seven operand pods per node, and prints the growth of
//! the process's resident memory (`VmRSS`). `projected` fills the operator's projected caches and the
//! judgements of one pass; `k8s` keeps the same objects as `k8s_openapi` types, trimmed as the caches
//! trimmed them before the projections. Run each in its own process:
//!
//! ```text
//! cargo run -p gpuop-operator --example cache_memory -- projected 10000
//! cargo run -p gpuop-operator --example cache_memory -- k8s 10000
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpuop_api::Operand;
use gpuop_api::labels::GpuDetection;
use gpuop_operator::caches::{NodeTable, PodTable};
use gpuop_operator::index::Judgements;
use gpuop_operator::labeler::LabelPolicy;
use gpuop_operator::projection::Interner;
use gpuop_operator::readiness::{Observed, Templates, observe};
use gpuop_render::{Manifest, Rendered};
use gpuop_testkit::fixture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use serde_json::json;

/// The operands that run a pod on every GPU node.
const PER_NODE: [Operand; 7] = [
    Operand::Driver,
    Operand::ContainerToolkit,
    Operand::OperatorValidator,
    Operand::DevicePlugin,
    Operand::DcgmExporter,
    Operand::GpuFeatureDiscovery,
    Operand::NodeStatusExporter,
];

fn node(i: usize) -> Node {
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    let mut label = |k: &str, v: &str| {
        labels.insert(k.to_owned(), v.to_owned());
    };
    // NFD: CPU features, kernel config, PCI and USB devices, memory, storage, system.
    for j in 0..110 {
        label(
            &format!("feature.node.kubernetes.io/cpu-cpuid.FEATURE{j:03}"),
            "true",
        );
    }
    for j in 0..20 {
        label(
            &format!("feature.node.kubernetes.io/kernel-config.OPTION{j:02}"),
            "true",
        );
    }
    for (key, value) in [
        ("pci-10de.present", "true"),
        ("pci-0302_10de.present", "true"),
        ("pci-1d0f.present", "true"),
        ("pci-8086.present", "true"),
        ("usb-ef_0b1f_03ee.present", "true"),
        ("kernel-version.full", "5.15.0-1048-aws"),
        ("kernel-version.major", "5"),
        ("kernel-version.minor", "15"),
        ("kernel-version.revision", "0"),
        ("system-os_release.ID", "ubuntu"),
        ("system-os_release.VERSION_ID", "22.04"),
        ("system-os_release.VERSION_ID.major", "22"),
        ("system-os_release.VERSION_ID.minor", "04"),
        ("memory-numa", "true"),
        ("memory-nv.present", "true"),
        ("storage-nonrotationaldisk", "true"),
        ("cpu-model.vendor_id", "AMD"),
        ("cpu-model.family", "25"),
        ("cpu-model.id", "1"),
        ("cpu-hardware_multithreading", "true"),
    ] {
        label(&format!("feature.node.kubernetes.io/{key}"), value);
    }
    // Kubernetes and the cloud provider.
    let zone = ["us-east-1a", "us-east-1b", "us-east-1c"][i % 3];
    for (key, value) in [
        (
            "kubernetes.io/hostname",
            format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250),
        ),
        ("kubernetes.io/os", "linux".into()),
        ("kubernetes.io/arch", "amd64".into()),
        ("beta.kubernetes.io/os", "linux".into()),
        ("beta.kubernetes.io/arch", "amd64".into()),
        ("beta.kubernetes.io/instance-type", "p5.48xlarge".into()),
        ("node.kubernetes.io/instance-type", "p5.48xlarge".into()),
        ("topology.kubernetes.io/region", "us-east-1".into()),
        ("topology.kubernetes.io/zone", zone.into()),
        ("failure-domain.beta.kubernetes.io/region", "us-east-1".into()),
        ("failure-domain.beta.kubernetes.io/zone", zone.into()),
        ("topology.ebs.csi.aws.com/zone", zone.into()),
        ("topology.k8s.aws/zone-id", format!("use1-az{}", i % 3)),
        ("eks.amazonaws.com/nodegroup", format!("gpu-{}", i % 20)),
        (
            "eks.amazonaws.com/nodegroup-image",
            "ami-0123456789abcdef0".into(),
        ),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND".into()),
        (
            "k8s.io/cloud-provider-aws",
            "0123456789abcdef0123456789abcdef".into(),
        ),
    ] {
        label(key, &value);
    }
    // GPU feature discovery and the operator.
    for (key, value) in [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.machine", "p5.48xlarge"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/gpu.replicas", "1"),
        ("nvidia.com/gpu.sharing-strategy", "none"),
        ("nvidia.com/cuda.driver.major", "550"),
        ("nvidia.com/cuda.driver.minor", "90"),
        ("nvidia.com/cuda.driver.rev", "07"),
        ("nvidia.com/cuda.runtime.major", "12"),
        ("nvidia.com/cuda.runtime.minor", "4"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/mig.strategy", "single"),
        ("nvidia.com/mig.config", "all-disabled"),
        ("nvidia.com/mig.config.state", "success"),
        ("nvidia.com/mps.capable", "false"),
        ("nvidia.com/gpu.present", "true"),
    ] {
        label(key, value);
    }
    label("nvidia.com/gfd.timestamp", &format!("{}", 1_733_000_000 + i));
    for operand in PER_NODE {
        label(operand.info().deploy_label, "true");
    }
    let owned: Vec<String> = PER_NODE
        .iter()
        .map(|o| format!("{}=true", o.info().deploy_label))
        .chain(["nvidia.com/gpu.present=true".to_owned()])
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250),
            "uid": format!("5f0c6e1a-{i:04x}-4a8e-9d3b-2c6f1e0a{i:04x}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-0{i:016x}\"}}"),
                "nfd.node.kubernetes.io/master.version": "v0.16.6",
                "nvidia.com/gpu-driver-upgrade-enabled": "true",
                "nvidia.com/gpu-operator.owned-labels": owned.join(","),
            },
        },
        "spec": {
            "providerID": format!("aws:///{zone}/i-0{i:016x}"),
            "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-12-01T18:00:00Z",
                            "lastTransitionTime": "2026-11-01T18:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 250, i % 250)},
                          {"type": "Hostname", "address": format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250)}],
            "capacity": {"cpu": "192", "memory": "2097152000Ki", "nvidia.com/gpu": "8", "pods": "110",
                         "ephemeral-storage": "1000000000Ki", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "191450m", "memory": "2090000000Ki", "nvidia.com/gpu": "8", "pods": "110",
                            "ephemeral-storage": "920000000000", "hugepages-2Mi": "0"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": format!("ec2{i:029x}"), "systemUUID": format!("ec2{i:05x}-0000-0000-0000-000000000000"),
                "bootID": format!("{i:08x}-1111-2222-3333-444455556666"), "kernelVersion": "5.15.0-1048-aws",
                "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.27",
                "kubeletVersion": "v1.33.1", "kubeProxyVersion": "v1.33.1", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }))
    .expect("a node")
}

fn pod(i: usize, n: usize) -> Pod {
    let operand = PER_NODE[n];
    let info = operand.info();
    let node = format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250);
    let driver = operand == Operand::Driver;
    let env = if driver {
        json!([{"name": gpuop_api::driver::DRIVER_CONFIG_DIGEST, "value": "3f2a9c"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{}-{:05x}", info.daemonset, i * 7 + n),
            "namespace": "gpu-operator",
            "uid": format!("9a1b2c3d-{i:04x}-4e5f-8a9b-{n:012x}"),
            "resourceVersion": format!("{}", 200_000 + i),
            "labels": {
                "app": info.daemonset,
                "app.kubernetes.io/component": info.component,
                "app.kubernetes.io/managed-by": "gpu-operator",
                "controller-revision-hash": "7d9f8b6c5d",
                "pod-template-generation": "1",
            },
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": info.daemonset,
                                 "uid": format!("ds-{}", info.daemonset), "controller": true,
                                 "blockOwnerDeletion": true}],
        },
        "spec": {
            "nodeName": node,
            "containers": if driver { json!([{"name": "", "env": env}]) } else { json!([]) },
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-01T18:00:00Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T18:01:00Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-12-01T18:01:00Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T18:00:00Z"},
            ],
            "hostIP": format!("10.0.{}.{}", i / 250, i % 250),
            "podIP": format!("10.1.{}.{}", i / 250, i % 250),
            "startTime": "2026-12-01T18:00:00Z",
            "qosClass": "BestEffort",
            "containerStatuses": if driver {
                json!([{"name": "nvidia-driver-ctr", "ready": true, "restartCount": 0, "image": "", "imageID": ""}])
            } else {
                json!(null)
            },
        },
    }))
    .expect("a pod")
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn rendered() -> Rendered {
    let objects = PER_NODE
        .iter()
        .map(|operand| {
            let info = operand.info();
            let daemonset = fixture::daemonset(info.daemonset)
                .namespace("gpu-operator")
                .node_selector(&[(info.deploy_label, "true")])
                .tolerate("nvidia.com/gpu")
                .container("main", "main")
                .build();
            Manifest {
                state: info.state,
                operand: Some(*operand),
                object: serde_json::to_value(daemonset).expect("a DaemonSet serializes"),
            }
        })
        .collect();
    Rendered { objects }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "projected".to_owned());
    let nodes: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let pods = nodes * PER_NODE.len();
    let sample = node(0);
    let labels = sample.metadata.labels.as_ref().map_or(0, BTreeMap::len);
    let start = rss_kib();
    match mode.as_str() {
        "k8s" => {
            let nodes: Vec<Arc<Node>> = (0..nodes).map(|i| Arc::new(node(i))).collect();
            let pods: Vec<Arc<Pod>> = (0..nodes.len())
                .flat_map(|i| (0..PER_NODE.len()).map(move |n| Arc::new(pod(i, n))))
                .collect();
            let held = rss_kib();
            println!(
                "k8s_openapi objects: {} nodes ({labels} labels each), {} pods: {:.1} MiB",
                nodes.len(),
                pods.len(),
                mib(held - start)
            );
        }
        _ => {
            let mut interner = Interner::default();
            let mut node_table = NodeTable::default();
            for i in 0..nodes {
                node_table.apply(&watcher::Event::Apply(node(i)), &mut interner);
            }
            let nodes_kib = rss_kib();
            println!("  of which nodes: {:.1} MiB", mib(nodes_kib - start));
            let mut pod_table = PodTable::default();
            for i in 0..nodes {
                for n in 0..PER_NODE.len() {
                    pod_table.apply(&watcher::Event::Apply(pod(i, n)), &mut interner);
                }
            }
            let cached = rss_kib();
            println!(
                "projected caches: {nodes} nodes ({labels} labels each), {pods} pods, {} strings interned: {:.1} MiB",
                interner.len(),
                mib(cached - start)
            );
            // One pass's judgements, kept for the next: facts per node and placement per node and operand.
            let mut judgements = Judgements::default();
            let judged = judgements.refresh_facts(&node_table, &LabelPolicy::default(), &GpuDetection::Nfd);
            let owners = HashMap::new();
            let observed = Observed {
                nodes: &node_table,
                pods: &pod_table,
                owners: &owners,
            };
            let (observations, placed) = observe(
                &Templates::of(&rendered()),
                &observed,
                &GpuDetection::Nfd,
                &mut judgements,
            );
            drop(observations);
            let judged_kib = rss_kib();
            println!(
                "judgements kept ({judged} nodes' facts, {placed} placements): {:.1} MiB",
                mib(judged_kib - cached)
            );
            println!("total: {:.1} MiB", mib(judged_kib - start));
        }
    }
}
