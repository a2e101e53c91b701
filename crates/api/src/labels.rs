//! Well-known label, annotation and resource keys: NVIDIA's node contract, NFD's labels, and the labels
//! every object this project creates carries. Outside this crate's own tests no code spells an
//! `nvidia.com` string anywhere else; a test in `tests/api.rs` fails when one appears.
//!
//! Deploy switches (`nvidia.com/gpu.deploy.<operand>`) live with the operand catalogue
//! ([`crate::catalogue`]).

/// The API group of `ClusterPolicy` and `NVIDIADriver`, and the domain of every key below.
pub const GROUP: &str = "nvidia.com";
/// `apiVersion` of `ClusterPolicy`.
pub const CLUSTER_POLICY_API_VERSION: &str = "nvidia.com/v1";
/// `apiVersion` of `NVIDIADriver`.
pub const NVIDIA_DRIVER_API_VERSION: &str = "nvidia.com/v1alpha1";
/// Prefix of every label and annotation key in NVIDIA's node contract.
pub const NVIDIA_PREFIX: &str = "nvidia.com/";
/// Name of the Lease the operator's replicas elect a leader with: NVIDIA's, so that the two never lead at
/// once.
pub const LEADER_ELECTION_ID: &str = "53822513.nvidia.com";

/// Prefix of the per-operand deploy switches.
pub const DEPLOY_PREFIX: &str = "nvidia.com/gpu.deploy.";
/// `true` on nodes with an NVIDIA GPU; flipped to `false` (not removed) when the GPU goes away.
pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
/// `false` empties the node of every operand.
pub const DEPLOY_OPERANDS: &str = "nvidia.com/gpu.deploy.operands";
/// `container`, `vm-passthrough` or `vm-vgpu`.
pub const WORKLOAD_CONFIG: &str = "nvidia.com/gpu.workload.config";
/// Deploy switches NVIDIA's operator sets although no operand uses them; swept, never set, by this one.
pub const LEGACY_DEPLOY_LABELS: &[&str] = &[
    "nvidia.com/gpu.deploy.client",
    "nvidia.com/gpu.deploy.kata-manager",
    "nvidia.com/gpu.deploy.nvsm",
];
/// Deploy switch value the driver manager writes while it pauses an operand for a driver upgrade.
pub const PAUSED_FOR_DRIVER_UPGRADE: &str = "paused-for-driver-upgrade";
/// Deploy switch value the MIG manager writes while it pauses an operand for a MIG change.
pub const PAUSED_FOR_MIG_CHANGE: &str = "paused-for-mig-change";

/// MIG layout a node should have (a key of the MIG manager's configuration).
pub const MIG_CONFIG: &str = "nvidia.com/mig.config";
/// Progress of applying `nvidia.com/mig.config`: `pending`, `success` or `failed`.
pub const MIG_CONFIG_STATE: &str = "nvidia.com/mig.config.state";
/// `true` on nodes whose GPUs support MIG (written by feature discovery).
pub const MIG_CAPABLE: &str = "nvidia.com/mig.capable";
/// MIG strategy in use on the node (written by feature discovery).
pub const MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
/// `true` on nodes where MPS sharing is configured (written by feature discovery).
pub const MPS_CAPABLE: &str = "nvidia.com/mps.capable";
/// Device plugin configuration a node selects (a key of `devicePlugin.config.name`).
pub const DEVICE_PLUGIN_CONFIG: &str = "nvidia.com/device-plugin.config";
/// Version of a vGPU host driver on the node; such nodes are never MIG-capable.
pub const VGPU_HOST_DRIVER_VERSION: &str = "nvidia.com/vgpu.host-driver-version";

/// GPU product name, e.g. `NVIDIA-A100-SXM4-40GB` (written by feature discovery).
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Number of GPUs on the node.
pub const GPU_COUNT: &str = "nvidia.com/gpu.count";
/// Memory of one GPU in MiB.
pub const GPU_MEMORY: &str = "nvidia.com/gpu.memory";
/// GPU architecture family, e.g. `ampere`.
pub const GPU_FAMILY: &str = "nvidia.com/gpu.family";
/// Replicas each GPU is advertised as (time-slicing or MPS).
pub const GPU_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// `time-slicing`, `mps` or `none`.
pub const GPU_SHARING_STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
/// Installed driver version, major part.
pub const CUDA_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver.major";
/// Installed driver version, minor part.
pub const CUDA_DRIVER_MINOR: &str = "nvidia.com/cuda.driver.minor";
/// Installed driver version, revision part.
pub const CUDA_DRIVER_REV: &str = "nvidia.com/cuda.driver.rev";
/// Installed driver version in full, e.g. `570.124.06`.
pub const CUDA_DRIVER_VERSION_FULL: &str = "nvidia.com/cuda.driver-version.full";
/// CUDA compute capability, major part.
pub const GPU_COMPUTE_MAJOR: &str = "nvidia.com/gpu.compute.major";
/// CUDA compute capability, minor part.
pub const GPU_COMPUTE_MINOR: &str = "nvidia.com/gpu.compute.minor";
/// The machine's product name as the BIOS reports it.
pub const GPU_MACHINE: &str = "nvidia.com/gpu.machine";
/// When feature discovery last labelled the node; it changes on every run, so nothing compares it.
pub const GFD_TIMESTAMP: &str = "nvidia.com/gfd.timestamp";

/// OS id and version of the node, e.g. `ubuntu22.04`, as the NVIDIADriver renderer labels the nodes of a
/// driver DaemonSet.
pub const NODE_OS_VERSION: &str = "nvidia.com/node.os-version";
/// `true` on the nodes of a precompiled driver DaemonSet.
pub const PRECOMPILED: &str = "nvidia.com/precompiled";
/// Kernel version a precompiled driver DaemonSet is built for.
pub const PRECOMPILED_KERNEL_VERSION: &str = "nvidia.com/precompiled.kernel-version";

/// Annotation on every object the operator applies: the hash of what it applied last, so an unchanged
/// object is not sent again. NVIDIA's operator uses the same key.
pub const APPLIED_HASH: &str = "nvidia.com/last-applied-hash";
/// Node annotation recording the labels the operator wrote on the node and their values, as `key=value`
/// pairs separated by commas (label values never contain commas), so that it removes only those.
pub const OWNED_LABELS: &str = "nvidia.com/gpu-operator.owned-labels";

/// NVIDIADriver that owns the driver on this node (the routing label NVIDIA's operator writes).
pub const DRIVER_OWNER: &str = "nvidia.com/gpu-operator.driver.owner";
/// On every object rendered for an NVIDIADriver: its name, so the objects of one NVIDIADriver can be pruned
/// by label. NVIDIA's operator has no such label (it finds them by ownerReference).
pub const NVIDIA_DRIVER_NAME: &str = "nvidia.com/nvidiadriver";
/// State of the node in the driver upgrade state machine.
pub const UPGRADE_STATE: &str = "nvidia.com/gpu-driver-upgrade-state";
/// `true` excludes the node from automatic driver upgrades.
pub const UPGRADE_SKIP: &str = "nvidia.com/gpu-driver-upgrade.skip";
/// Pod label: `true` keeps a pod from being drained during driver upgrades.
pub const UPGRADE_DRAIN_SKIP: &str = "nvidia.com/gpu-driver-upgrade-drain.skip";
/// Node annotation: the operator, not the driver manager, handles upgrades on this node.
pub const UPGRADE_ENABLED_ANNOTATION: &str = "nvidia.com/gpu-driver-upgrade-enabled";
/// Node annotation set by a driver pod waiting for permission to load.
pub const UPGRADE_WAIT_FOR_SAFE_LOAD: &str = "nvidia.com/gpu-driver-upgrade.driver-wait-for-safe-load";
/// Node annotation: the node was already cordoned when its upgrade began.
pub const UPGRADE_INITIAL_UNSCHEDULABLE: &str =
    "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable";
/// Node annotation: when waiting for job completion began.
pub const UPGRADE_WAIT_FOR_COMPLETION_START: &str =
    "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time";
/// Node annotation: when post-upgrade validation began.
pub const UPGRADE_VALIDATION_START: &str = "nvidia.com/gpu-driver-upgrade-validation-start-time";
/// Node annotation: force an upgrade of this node.
pub const UPGRADE_REQUESTED: &str = "nvidia.com/gpu-driver-upgrade-requested";
/// Node annotation (this operator's): why the node's driver upgrade failed, while it is `upgrade-failed`.
pub const UPGRADE_FAILURE: &str = "nvidia.com/gpu-driver-upgrade.failure";
/// Node annotation (this operator's): the upgrade under way only restarts the driver pod, without a
/// reinstall, so the validator that ran before still vouches for the driver.
pub const UPGRADE_RESTART_ONLY: &str = "nvidia.com/gpu-driver-upgrade.restart-only";

/// NFD labels that mark an NVIDIA PCI device (vendor 0x10de), in any of the forms NFD writes.
pub const NFD_NVIDIA_PCI: &[&str] = &[
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
];
/// Prefix of every NFD label.
pub const NFD_PREFIX: &str = "feature.node.kubernetes.io/";
/// Full kernel version.
pub const NFD_KERNEL_VERSION: &str = "feature.node.kubernetes.io/kernel-version.full";
/// OS id, e.g. `ubuntu`, `rhel`.
pub const NFD_OS_ID: &str = "feature.node.kubernetes.io/system-os_release.ID";
/// OS version, e.g. `22.04`.
pub const NFD_OS_VERSION: &str = "feature.node.kubernetes.io/system-os_release.VERSION_ID";
/// OS major version, e.g. `9`.
pub const NFD_OS_VERSION_MAJOR: &str = "feature.node.kubernetes.io/system-os_release.VERSION_ID.major";
/// RHCOS OSTree version (OpenShift).
pub const NFD_OSTREE_VERSION: &str = "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION";

/// Every object this project creates carries this label, with value [`MANAGED_BY_VALUE`].
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "gpu-operator";
/// The operand (catalogue id) an object belongs to.
pub const COMPONENT: &str = "app.kubernetes.io/component";
/// Field manager of every server-side apply this project makes.
pub const FIELD_MANAGER: &str = "gpu-operator";

/// Extended resource of whole (or single-strategy MIG, or shared) GPUs.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
/// Prefix of the mixed-strategy MIG resources, e.g. `nvidia.com/mig-1g.10gb`.
pub const RESOURCE_MIG_PREFIX: &str = "nvidia.com/mig-";
/// Taint key and toleration every operand carries.
pub const GPU_TAINT: &str = "nvidia.com/gpu";
/// The CDI device name the container toolkit gives management containers: every GPU on the node.
pub const CDI_MANAGEMENT_GPU: &str = "management.nvidia.com/gpu";

/// Directory of the on-node status files.
pub const VALIDATIONS_DIR: &str = "/run/nvidia/validations";

/// Whether the node's GPUs support MIG, as NVIDIA's operator decides it: never on vGPU hosts; feature
/// discovery's `nvidia.com/mig.capable` when present; else the product is an A100, A30 or H100.
///
/// While feature discovery's labels are away (it removes them as the driver restarts, in every driver
/// upgrade) the earlier verdict stands: a node whose MIG manager is switched on keeps it, rather than
/// having it removed and put back a second later with every MIG manager pod deleted and recreated. Only
/// feature discovery saying `mig.capable=false` (or a product that is not MIG-capable) takes it away.
pub fn is_mig_capable(labels: &(impl crate::read::Labels + ?Sized)) -> bool {
    if labels
        .get_label(VGPU_HOST_DRIVER_VERSION)
        .is_some_and(|v| !v.is_empty())
    {
        return false;
    }
    if let Some(capable) = labels.get_label(MIG_CAPABLE) {
        return capable == "true";
    }
    if let Some(product) = labels.get_label(GPU_PRODUCT) {
        let product = product.to_lowercase();
        return ["h100", "a100", "a30"]
            .iter()
            .any(|model| product.contains(model));
    }
    labels.get_label(crate::Operand::MigManager.info().deploy_label) == Some("true")
}

/// Whether a node's labels show an NVIDIA GPU, as NFD reports it.
pub fn has_nfd_gpu<'a>(mut labels: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
    labels.any(|(key, value)| value == "true" && NFD_NVIDIA_PCI.contains(&key))
}

/// How GPU nodes are recognised: the one rule the labeller, the facts for rendering and the status judge
/// share. Never by the operator's own `nvidia.com/gpu.present` echo, which lags the node by a watch round
/// trip and would make a fresh cluster look GPU-less.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum GpuDetection {
    /// By NFD's NVIDIA PCI labels (the default, as NVIDIA's operator does).
    #[default]
    Nfd,
    /// By NFD's labels or a label selector, for clusters without NFD.
    NfdOrSelector(crate::selector::LabelSelector),
}

/// Why [`GpuDetection`] says a node has a GPU, or has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuEvidence {
    /// NFD's NVIDIA PCI label, this one, is `true`.
    Nfd(&'static str),
    /// The node matches `--gpu-node-selector`.
    Selector,
    /// NFD labels the node and found no NVIDIA PCI device.
    NfdFoundNone,
    /// No NFD label at all, and no selector that matches.
    NoNfd,
}

impl GpuEvidence {
    /// Whether the evidence is of a GPU.
    pub fn has_gpu(self) -> bool {
        matches!(self, GpuEvidence::Nfd(_) | GpuEvidence::Selector)
    }
}

impl GpuDetection {
    /// By NFD's labels, or also by this selector when one is given (`--gpu-node-selector`).
    pub fn from_selector(selector: Option<crate::selector::LabelSelector>) -> Self {
        selector.map_or(GpuDetection::Nfd, GpuDetection::NfdOrSelector)
    }

    /// Why a node with these labels has an NVIDIA GPU or not; its [`GpuEvidence::has_gpu`] is
    /// [`GpuDetection::has_gpu`].
    pub fn evidence(&self, labels: &(impl crate::read::Labels + ?Sized)) -> GpuEvidence {
        if let Some(key) = NFD_NVIDIA_PCI
            .iter()
            .find(|key| labels.get_label(key) == Some("true"))
        {
            return GpuEvidence::Nfd(key);
        }
        if let GpuDetection::NfdOrSelector(selector) = self
            && selector.matches(labels)
        {
            return GpuEvidence::Selector;
        }
        if labels.each_label().any(|(key, _)| key.starts_with(NFD_PREFIX)) {
            GpuEvidence::NfdFoundNone
        } else {
            GpuEvidence::NoNfd
        }
    }

    /// Whether a node with these labels has an NVIDIA GPU.
    pub fn has_gpu(&self, labels: &(impl crate::read::Labels + ?Sized)) -> bool {
        let nfd = NFD_NVIDIA_PCI
            .iter()
            .any(|key| labels.get_label(key) == Some("true"));
        match self {
            GpuDetection::Nfd => nfd,
            GpuDetection::NfdOrSelector(selector) => nfd || selector.matches(labels),
        }
    }

    /// The label keys the rule reads.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        let selector = match self {
            GpuDetection::Nfd => None,
            GpuDetection::NfdOrSelector(selector) => Some(selector),
        };
        NFD_NVIDIA_PCI.iter().copied().chain(
            selector
                .into_iter()
                .flat_map(|s| s.requirements().iter().map(crate::selector::Requirement::key)),
        )
    }
}

/// Whether a resource name is one the NVIDIA device plugin advertises.
pub fn is_gpu_resource(name: &str) -> bool {
    name == RESOURCE_GPU || name.starts_with(RESOURCE_MIG_PREFIX) || name.starts_with("nvidia.com/gpu.")
}

/// Why a label key is not valid, if it is not (Kubernetes' qualified-name rule).
pub fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && let Some(problem) = dns_subdomain_problem(prefix)
    {
        return Some(format!("prefix {prefix:?} {problem}"));
    }
    if name.is_empty() {
        return Some("name part must not be empty".to_owned());
    }
    name_problem(name)
}

/// Why a label value is not valid, if it is not: at most 63 characters, alphanumeric at both ends, and
/// `-`, `_`, `.` in between; empty is valid.
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        None
    } else {
        name_problem(value)
    }
}

/// Why a name is not a valid DNS subdomain (the rule for most object names), if it is not.
pub fn dns_subdomain_problem(name: &str) -> Option<String> {
    let valid_label = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.is_empty() {
        Some("must not be empty".to_owned())
    } else if name.len() > 253 {
        Some("must be no more than 253 characters".to_owned())
    } else if !name.split('.').all(valid_label) {
        Some("must consist of lower case alphanumeric characters, '-' or '.', and start and end with an alphanumeric character".to_owned())
    } else {
        None
    }
}

fn name_problem(name: &str) -> Option<String> {
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if name.len() > 63 {
        Some("must be no more than 63 characters".to_owned())
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || !edge_ok(name.chars().next())
        || !edge_ok(name.chars().last())
    {
        Some("must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character".to_owned())
    } else {
        None
    }
}

/// A label (or annotation) map from `(key, value)` pairs, for tests.
#[cfg(test)]
pub(crate) fn label_map(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evidence_and_the_verdict_agree() {
        let labels = label_map;
        let selector = GpuDetection::from_selector(Some("pool=gpu".parse().unwrap()));
        let cases = [
            (
                labels(&[(NFD_NVIDIA_PCI[1], "true")]),
                GpuEvidence::Nfd(NFD_NVIDIA_PCI[1]),
                GpuEvidence::Nfd(NFD_NVIDIA_PCI[1]),
            ),
            (
                labels(&[(NFD_KERNEL_VERSION, "6.8")]),
                GpuEvidence::NfdFoundNone,
                GpuEvidence::NfdFoundNone,
            ),
            (
                labels(&[(NFD_KERNEL_VERSION, "6.8"), ("pool", "gpu")]),
                GpuEvidence::NfdFoundNone,
                GpuEvidence::Selector,
            ),
            (
                labels(&[("pool", "gpu"), (GPU_PRESENT, "true")]),
                GpuEvidence::NoNfd,
                GpuEvidence::Selector,
            ),
            (labels(&[]), GpuEvidence::NoNfd, GpuEvidence::NoNfd),
        ];
        for (labels, nfd, with_selector) in cases {
            assert_eq!(GpuDetection::Nfd.evidence(&labels), nfd, "{labels:?}");
            assert_eq!(selector.evidence(&labels), with_selector, "{labels:?}");
            assert_eq!(nfd.has_gpu(), GpuDetection::Nfd.has_gpu(&labels), "{labels:?}");
            assert_eq!(with_selector.has_gpu(), selector.has_gpu(&labels), "{labels:?}");
        }
    }

    #[test]
    fn group_constants_match_the_resources() {
        use kube::{CustomResourceExt, Resource};
        assert_eq!(crate::ClusterPolicy::api_version(&()), CLUSTER_POLICY_API_VERSION);
        assert_eq!(crate::NVIDIADriver::api_version(&()), NVIDIA_DRIVER_API_VERSION);
        assert_eq!(crate::ClusterPolicy::group(&()), GROUP);
        assert!(crate::NVIDIADriver::crd_name().ends_with(GROUP));
        assert_eq!(format!("{GROUP}/"), NVIDIA_PREFIX);
    }

    #[test]
    fn label_syntax_follows_kubernetes() {
        assert_eq!(label_key_problem("nvidia.com/gpu.deploy.driver"), None);
        assert_eq!(label_key_problem("app"), None);
        assert!(label_key_problem("Bad_Prefix.com/x").is_some());
        assert!(label_key_problem("a/").is_some());
        assert!(label_key_problem("-a").is_some());
        assert!(label_key_problem(&"a".repeat(64)).is_some());
        assert_eq!(label_value_problem(""), None);
        assert_eq!(label_value_problem("true"), None);
        assert!(label_value_problem("has space").is_some());
        assert_eq!(dns_subdomain_problem("cluster-policy"), None);
        assert!(dns_subdomain_problem("Cluster").is_some());
    }

    #[test]
    fn nfd_gpu_detection_accepts_every_form_and_only_true() {
        for key in NFD_NVIDIA_PCI {
            assert!(has_nfd_gpu([(*key, "true")].into_iter()), "{key}");
            assert!(!has_nfd_gpu([(*key, "false")].into_iter()), "{key}=false");
        }
        assert!(!has_nfd_gpu(
            [("feature.node.kubernetes.io/pci-1002.present", "true")].into_iter()
        ));
    }

    #[test]
    fn mig_capability_follows_feature_discovery_and_stands_while_its_labels_are_away() {
        let node = label_map;
        let switch = crate::Operand::MigManager.info().deploy_label;
        assert!(is_mig_capable(&node(&[(MIG_CAPABLE, "true")])));
        assert!(!is_mig_capable(&node(&[
            (MIG_CAPABLE, "false"),
            (switch, "true")
        ])));
        assert!(is_mig_capable(&node(&[(GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3")])));
        assert!(!is_mig_capable(&node(&[
            (GPU_PRODUCT, "Tesla-T4"),
            (switch, "true")
        ])));
        // The driver restarts and feature discovery's labels go: the switch the operator set stands.
        assert!(is_mig_capable(&node(&[(switch, "true")])));
        assert!(!is_mig_capable(&node(&[(switch, "false")])));
        assert!(!is_mig_capable(&node(&[])));
        assert!(!is_mig_capable(&node(&[
            (VGPU_HOST_DRIVER_VERSION, "550.90"),
            (switch, "true")
        ])));
    }

    #[test]
    fn gpu_resources_are_recognised() {
        assert!(is_gpu_resource("nvidia.com/gpu"));
        assert!(is_gpu_resource("nvidia.com/mig-1g.10gb"));
        assert!(is_gpu_resource("nvidia.com/gpu.shared"));
        assert!(!is_gpu_resource("nvidia.com/gpumem"));
        assert!(!is_gpu_resource("amd.com/gpu"));
    }
}
