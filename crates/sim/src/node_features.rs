//! What a real cluster writes on a Node besides its kubelet's own labels: the labels of Node Feature
//! Discovery (NFD) and of the cloud provider, and the annotations of the control plane, the CSI drivers and
//! NFD. A real GPU node carries on the order of 150 `feature.node.kubernetes.io/*` labels (a cluster's size
//! in memory and on the wire is mostly these), so a simulated one does too.
//!
//! The labels follow NFD v0.17 with the configuration NVIDIA's operator bundles (PCI labels by vendor only,
//! `deviceClassWhitelist: [02, 0200, 0207, 0300, 0302]`, hence `pci-10de.present`), plus the kernel options
//! GPU and RDMA fleets commonly add to `kernel.configOpts`, and NFD's built-in `custom-rdma.*` rule. The
//! hosts are bare-metal servers in Oracle Cloud's naming (region `iad`, three availability domains, three
//! fault domains each). Everything here is a pure function of the node's name, pool and index, so a node
//! always looks the same.

use std::collections::BTreeMap;

use gpuop_api::labels::{
    NFD_KERNEL_VERSION, NFD_NVIDIA_PCI, NFD_OS_ID, NFD_OS_VERSION, NFD_OS_VERSION_MAJOR, NFD_PREFIX,
};

use crate::cluster_spec::NodePool;
use crate::hardware::HostCpu;

/// `cpu-cpuid.*` flags of an Ice Lake server (bare metal), less NFD's default `attributeBlacklist` (BMI1,
/// BMI2, CLMUL, CMOV, CX16, ERMS, F16C, HTT, LZCNT, MMX, MMXEXT, NX, POPCNT, RDRAND, RDSEED, RDTSCP, SGX,
/// SGXLC, SSE*, SSSE3, TDX_GUEST).
const ICE_LAKE_CPUID: &[&str] = &[
    "ADX",
    "AESNI",
    "AVX",
    "AVX2",
    "AVX512BITALG",
    "AVX512BW",
    "AVX512CD",
    "AVX512DQ",
    "AVX512F",
    "AVX512IFMA",
    "AVX512VBMI",
    "AVX512VBMI2",
    "AVX512VL",
    "AVX512VNNI",
    "AVX512VPOPCNTDQ",
    "CMPXCHG8",
    "FLUSH_L1D",
    "FMA3",
    "FSRM",
    "FXSR",
    "FXSROPT",
    "GFNI",
    "IA32_ARCH_CAP",
    "IBPB",
    "IBRS",
    "LAHF",
    "MD_CLEAR",
    "MOVBE",
    "OSXSAVE",
    "PCONFIG",
    "PPIN",
    "SHA",
    "SPEC_CTRL_SSBD",
    "STIBP",
    "STOSB_SHORT",
    "SYSCALL",
    "SYSEE",
    "TME",
    "VAES",
    "VMX",
    "VPCLMULQDQ",
    "WBNOINVD",
    "X87",
    "XGETBV1",
    "XSAVE",
    "XSAVEC",
    "XSAVEOPT",
    "XSAVES",
];

/// `cpu-cpuid.*` flags Sapphire Rapids adds to Ice Lake's.
const SAPPHIRE_RAPIDS_CPUID: &[&str] = &[
    "AMXBF16",
    "AMXINT8",
    "AMXTILE",
    "AVX512BF16",
    "AVX512FP16",
    "AVXVNNI",
    "BHI_CTRL",
    "CETIBT",
    "CETSS",
    "CLDEMOTE",
    "CMPSB_SCADBS_SHORT",
    "ENQCMD",
    "FZLRM",
    "IA32_CORE_CAP",
    "IBRS_PREFERRED",
    "MOVDIR64B",
    "MOVDIRI",
    "MOVSB_ZL",
    "PSFD",
    "RRSBA_CTRL",
    "RTM_ALWAYS_ABORT",
    "SERIALIZE",
    "STIBP_ALWAYSON",
    "TSXLDTRK",
    "WAITPKG",
];

/// Kernel options NFD reports by default (`NO_HZ`, `NO_HZ_IDLE`, `NO_HZ_FULL`, `PREEMPT`: the ones a
/// distribution's generic kernel sets) and those GPU and RDMA fleets add to `kernel.configOpts` to select
/// nodes for GPUDirect RDMA, VFIO passthrough, huge pages and the open driver's HMM (`DEVICE_PRIVATE`,
/// `HMM_MIRROR`). Both Ubuntu's and RHEL's kernels set all of these.
const KERNEL_CONFIG: &[&str] = &[
    "NO_HZ",
    "NO_HZ_FULL",
    "BLK_DEV_NVME",
    "BPF_SYSCALL",
    "CGROUPS",
    "CGROUP_HUGETLB",
    "CPUSETS",
    "DEVICE_PRIVATE",
    "EDAC",
    "HMM_MIRROR",
    "HUGETLBFS",
    "INFINIBAND",
    "INFINIBAND_USER_ACCESS",
    "INFINIBAND_USER_MEM",
    "INTEL_IOMMU",
    "IOMMU_SUPPORT",
    "MEMCG",
    "MLX5_CORE",
    "MLX5_EN",
    "MLX5_ESWITCH",
    "MLX5_INFINIBAND",
    "NUMA",
    "NUMA_BALANCING",
    "NET_DEVLINK",
    "NVME_MULTIPATH",
    "NVME_CORE",
    "OVERLAY_FS",
    "PCIEAER",
    "PCI_IOV",
    "PCI_MSI",
    "PCI_P2PDMA",
    "TRANSPARENT_HUGEPAGE",
    "VFIO",
    "VFIO_IOMMU_TYPE1",
    "VFIO_PCI",
    "ZONE_DEVICE",
];

/// Cloud region of every simulated node (Oracle Cloud's short name for us-ashburn-1).
const REGION: &str = "iad";

/// The feature labels NFD writes on a node of `pool`: CPU, kernel, memory, network, PCI, storage, OS and
/// USB. Names the operator reads keep their exact names and values: `kernel-version.full`,
/// `system-os_release.ID`, `.VERSION_ID`, `.VERSION_ID.major`, `cpu-model.vendor_id` and, on GPU nodes,
/// `pci-10de.present`.
pub fn nfd_labels(pool: &NodePool) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut put = |name: &str, value: &str| {
        labels.insert(format!("{NFD_PREFIX}{name}"), value.to_owned());
    };
    let cpu = pool
        .gpu
        .as_ref()
        .map_or(HostCpu::IceLake, |gpu| gpu.model.host_cpu());
    let extra: &[&str] = match cpu {
        HostCpu::IceLake => &[],
        HostCpu::SapphireRapids => SAPPHIRE_RAPIDS_CPUID,
    };
    for flag in ICE_LAKE_CPUID.iter().chain(extra) {
        put(&format!("cpu-cpuid.{flag}"), "true");
    }
    put("cpu-cstate.enabled", "true");
    put("cpu-hardware_multithreading", "true");
    put("cpu-model.family", "6");
    put("cpu-model.id", &cpu.model_id().to_string());
    put("cpu-model.vendor_id", "Intel");
    put("cpu-power.sst_bf.enabled", "true");
    put("cpu-pstate.scaling_governor", "performance");
    put("cpu-pstate.status", "active");
    put("cpu-pstate.turbo", "true");
    for rdt in ["RDTCMT", "RDTL2CA", "RDTL3CA", "RDTMBA", "RDTMBM", "RDTMON"] {
        put(&format!("cpu-rdt.{rdt}"), "true");
    }
    put("cpu-rdt.RDTL3CA_NUM_CLOSID", "15");
    for option in KERNEL_CONFIG {
        put(&format!("kernel-config.{option}"), "true");
    }
    let os = pool.os_release();
    if os.id == "rhel" {
        put("kernel-selinux.enabled", "true");
    }
    let numbers: Vec<&str> = pool
        .kernel
        .split(['-', '+'])
        .next()
        .unwrap_or_default()
        .split('.')
        .collect();
    let is_number = |part: &&str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    for (name, part) in ["major", "minor", "revision"].iter().zip(&numbers) {
        if is_number(part) {
            put(&format!("kernel-version.{name}"), part);
        }
    }
    put("memory-numa", "true");
    put("network-sriov.capable", "true");
    // The host's BMC display (ASPEED), its NICs (Mellanox ConnectX-7, Intel E810, Broadcom for the
    // management network), and the GPUs.
    put("pci-1a03.present", "true");
    put("pci-14e4.present", "true");
    put("pci-15b3.present", "true");
    put("pci-15b3.sriov.capable", "true");
    put("pci-8086.present", "true");
    put("pci-8086.sriov.capable", "true");
    if pool.gpu.is_some() {
        // NFD's built-in rule for RDMA: ConnectX cards with their modules loaded.
        put("custom-rdma.available", "true");
        put("custom-rdma.capable", "true");
    }
    put("storage-nonrotationaldisk", "true");
    // The BMC's virtual media: a composite USB gadget of class ef (miscellaneous).
    put("usb-ef_1d6b_0104.present", "true");
    labels.insert(NFD_KERNEL_VERSION.to_owned(), pool.kernel.clone());
    labels.insert(NFD_OS_ID.to_owned(), os.id.clone());
    labels.insert(NFD_OS_VERSION.to_owned(), os.version.clone());
    let mut version = os.version.split('.');
    let major = version.next().unwrap_or_default().to_owned();
    labels.insert(NFD_OS_VERSION_MAJOR.to_owned(), major);
    if let Some(minor) = version.next().filter(|minor| !minor.is_empty()) {
        labels.insert(format!("{NFD_OS_VERSION}.minor"), minor.to_owned());
    }
    if pool.gpu.is_some() {
        labels.insert(NFD_NVIDIA_PCI[0].to_owned(), "true".to_owned());
    }
    labels
}

/// The cloud provider's labels of a node: region, availability domain (by index, three of them), fault
/// domain, instance type, and their deprecated `beta` and `failure-domain` forms, which clouds still write.
pub fn provider_labels(pool: &NodePool, index: u32) -> BTreeMap<String, String> {
    let zone = format!("US-ASHBURN-AD-{}", index % 3 + 1);
    let fault_domain = format!("FAULT-DOMAIN-{}", (index / 3) % 3 + 1);
    let instance_type = pool.gpu.as_ref().map_or_else(
        || "BM.Standard3.64".to_owned(),
        |gpu| gpu.model.instance_type(gpu.count),
    );
    BTreeMap::from([
        ("topology.kubernetes.io/region".to_owned(), REGION.to_owned()),
        ("topology.kubernetes.io/zone".to_owned(), zone.clone()),
        (
            "failure-domain.beta.kubernetes.io/region".to_owned(),
            REGION.to_owned(),
        ),
        ("failure-domain.beta.kubernetes.io/zone".to_owned(), zone),
        ("oci.oraclecloud.com/fault-domain".to_owned(), fault_domain),
        (
            "node.kubernetes.io/instance-type".to_owned(),
            instance_type.clone(),
        ),
        ("beta.kubernetes.io/instance-type".to_owned(), instance_type),
    ])
}

/// The annotations a real node carries: the attach-detach and TTL controllers' marks, the CSI drivers' node
/// ids and, with NFD, the names of the labels NFD owns (without its prefix, comma-separated, sorted), by
/// which NFD removes the labels of features that went.
pub fn annotations(name: &str, nfd_labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([
        ("node.alpha.kubernetes.io/ttl".to_owned(), "0".to_owned()),
        (
            "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
            "true".to_owned(),
        ),
        (
            "csi.volume.kubernetes.io/nodeid".to_owned(),
            serde_json::json!({
                "blockvolume.csi.oraclecloud.com": name,
                "fss.csi.oraclecloud.com": name,
            })
            .to_string(),
        ),
    ]);
    if !nfd_labels.is_empty() {
        let names: Vec<&str> = nfd_labels
            .keys()
            .filter_map(|key| key.strip_prefix(NFD_PREFIX))
            .collect();
        annotations.insert(
            "nfd.node.kubernetes.io/feature-labels".to_owned(),
            names.join(","),
        );
    }
    annotations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_bench::gpu_cluster;
    use crate::cluster_spec::{ClusterSpec, node_object};

    fn nfd_count(labels: &BTreeMap<String, String>) -> usize {
        labels.keys().filter(|k| k.starts_with(NFD_PREFIX)).count()
    }

    #[test]
    fn a_gpu_node_carries_as_many_feature_labels_as_a_real_one() {
        let spec = gpu_cluster(3);
        let (name, pool) = spec.nodes().next().unwrap();
        let node = node_object(&name, pool, true, 0);
        let labels = node.metadata.labels.as_ref().unwrap();
        let count = nfd_count(labels);
        assert!(
            (140..=200).contains(&count),
            "an H100 node has {count} NFD labels"
        );
        // What the operator, the doctor and the tests read, unchanged.
        for (key, value) in [
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
            (NFD_KERNEL_VERSION, "5.15.0-105-generic"),
            (NFD_OS_ID, "ubuntu"),
            (NFD_OS_VERSION, "22.04"),
            (NFD_OS_VERSION_MAJOR, "22"),
            ("feature.node.kubernetes.io/cpu-model.vendor_id", "Intel"),
            ("feature.node.kubernetes.io/kernel-version.minor", "15"),
            (
                "feature.node.kubernetes.io/system-os_release.VERSION_ID.minor",
                "04",
            ),
            ("feature.node.kubernetes.io/cpu-cpuid.AMXTILE", "true"),
            ("node.kubernetes.io/instance-type", "BM.GPU.H100.8"),
            ("topology.kubernetes.io/zone", "US-ASHBURN-AD-1"),
            ("kubernetes.io/hostname", name.as_str()),
        ] {
            assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
        }
        assert!(
            !labels.keys().any(|k| k.starts_with("nvidia.com/")),
            "NFD writes no NVIDIA labels; feature discovery (an operand) does"
        );
        let annotations = node.metadata.annotations.as_ref().unwrap();
        let listed = annotations["nfd.node.kubernetes.io/feature-labels"]
            .split(',')
            .count();
        assert_eq!(listed, count, "the annotation names every NFD label");
        assert_eq!(annotations["node.alpha.kubernetes.io/ttl"], "0");
    }

    #[test]
    fn nodes_are_the_same_every_time_and_differ_where_real_ones_do() {
        let spec = gpu_cluster(4);
        let nodes: Vec<_> = spec.nodes().collect();
        let (first, pool) = &nodes[0];
        assert_eq!(
            node_object(first, pool, true, 0),
            node_object(first, pool, true, 0)
        );
        let zones: std::collections::BTreeSet<String> = nodes
            .iter()
            .zip(0u32..)
            .map(|((name, pool), index)| {
                node_object(name, pool, true, index).metadata.labels.unwrap()["topology.kubernetes.io/zone"]
                    .clone()
            })
            .collect();
        assert_eq!(zones.len(), 3, "spread over three availability domains");
        let demo = ClusterSpec::demo();
        let cpu_pool = demo.node_pools.iter().find(|p| p.gpu.is_none()).unwrap();
        let cpu = nfd_labels(cpu_pool);
        assert!(!cpu.contains_key(NFD_NVIDIA_PCI[0]));
        // The counts docs/sim.md gives.
        assert_eq!(count_of(&gpu_cluster(1)), 146);
        let a100 = demo.node_pools.iter().find(|p| p.name == "a100").unwrap();
        assert_eq!(nfd_count(&nfd_labels(a100)), 121, "no AMX on Ice Lake");
        assert_eq!(nfd_count(&cpu), 118);
        assert_eq!(
            provider_labels(cpu_pool, 0)["node.kubernetes.io/instance-type"],
            "BM.Standard3.64"
        );
        let mut rhel = cpu_pool.clone();
        rhel.os = "rhel-9.4".into();
        let rhel = nfd_labels(&rhel);
        assert_eq!(rhel["feature.node.kubernetes.io/kernel-selinux.enabled"], "true");
        assert_eq!(rhel[NFD_OS_VERSION_MAJOR], "9");
        assert_eq!(
            rhel["feature.node.kubernetes.io/system-os_release.VERSION_ID.minor"],
            "4"
        );
    }

    fn count_of(spec: &ClusterSpec) -> usize {
        let (_, pool) = spec.nodes().next().unwrap();
        nfd_count(&nfd_labels(pool))
    }

    #[test]
    fn a_kernel_release_that_is_not_numbers_gives_no_version_parts() {
        let mut pool = gpu_cluster(1).node_pools.remove(0);
        pool.kernel = "custom".into();
        let labels = nfd_labels(&pool);
        assert_eq!(labels[NFD_KERNEL_VERSION], "custom");
        assert!(!labels.contains_key("feature.node.kubernetes.io/kernel-version.major"));
        pool.kernel = "6.8.0-45-generic".into();
        let labels = nfd_labels(&pool);
        assert_eq!(labels["feature.node.kubernetes.io/kernel-version.major"], "6");
        assert_eq!(labels["feature.node.kubernetes.io/kernel-version.revision"], "0");
    }

    /// The fake server checks label keys and values and annotation sizes as a real API server does: every
    /// node of every pool of the demo cluster, and a benchmark node, is accepted.
    #[tokio::test]
    async fn the_api_server_accepts_every_node() {
        use k8s_openapi::api::core::v1::Node;
        use kube::Api;
        use kube::api::PostParams;

        let server = gpuop_fakeserver::FakeServer::new();
        let nodes: Api<Node> = Api::all(server.client_as("test"));
        let demo = ClusterSpec::demo();
        let bench = gpu_cluster(1);
        for (index, (name, pool)) in (0u32..).zip(demo.nodes().chain(bench.nodes())) {
            let node = node_object(&name, pool, true, index);
            let created = nodes
                .create(&PostParams::default(), &node)
                .await
                .unwrap_or_else(|error| panic!("node {name} refused: {error}"));
            assert_eq!(created.metadata.labels, node.metadata.labels);
            assert_eq!(created.metadata.annotations, node.metadata.annotations);
        }
    }
}
