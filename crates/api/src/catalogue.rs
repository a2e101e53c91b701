//! The operand catalogue: every fact about an operand, in one table.
//!
//! For each operand: its id, its deploy switch label, its DaemonSet, the ClusterPolicy state it belongs to,
//! the switch that enables it and the default NVIDIA's operator applies, the workloads that want it, the
//! operands it needs on the same node, the status file that proves it ready, the status files its pods
//! wait for, and where its image comes from. The renderer, the node labeller, the readiness judge, the
//! doctor and the simulator all read this table; nobody hard-codes an operand's label or dependencies
//! elsewhere.
//!
//! The table is in NVIDIA's state order, which is also the order a person reads a node's chain in.
//! `requires` lists what the operand's pods wait for on the node (through init containers and status
//! files), not a display order: feature discovery, the exporter and the MIG manager need the driver and the
//! container toolkit, not the device plugin.

use crate::choice::{SandboxMode, WorkloadConfig};
use crate::cluster_policy::ClusterPolicySpec;
use crate::image_section::ImageSection;

/// An operand the operator can deploy as a DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operand {
    /// NVIDIA's driver container.
    Driver,
    /// The container toolkit: wires the container runtime for NVIDIA GPUs and writes CDI specs.
    ContainerToolkit,
    /// The operator validator: proves driver, toolkit, CUDA and device plugin work on the node.
    OperatorValidator,
    /// The device plugin: advertises GPUs to the kubelet.
    DevicePlugin,
    /// The MPS control daemon, on nodes configured for MPS sharing.
    MpsControlDaemon,
    /// The standalone DCGM host engine.
    Dcgm,
    /// The DCGM metrics exporter.
    DcgmExporter,
    /// GPU feature discovery: labels nodes with GPU properties.
    GpuFeatureDiscovery,
    /// The MIG manager: applies `nvidia.com/mig.config`.
    MigManager,
    /// The node status exporter: exports validation results as metrics.
    NodeStatusExporter,
    /// The vGPU host manager.
    VgpuManager,
    /// The vGPU device manager.
    VgpuDeviceManager,
    /// The sandbox validator: proves passthrough and vGPU setups.
    SandboxValidator,
    /// The VFIO manager: binds GPUs to vfio-pci for passthrough.
    VfioManager,
    /// The KubeVirt sandbox device plugin.
    SandboxDevicePlugin,
    /// The Kata sandbox device plugin.
    KataSandboxDevicePlugin,
    /// The confidential-computing manager.
    CcManager,
}

/// Where an operand is wanted: a node's workload config, and for some the sandbox mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The node's workload config.
    pub workload: WorkloadConfig,
    /// Wanted only under this sandbox mode; `None` means under any.
    pub mode: Option<SandboxMode>,
}

/// Everything there is to know about one operand.
#[derive(Clone, Copy, Debug)]
pub struct OperandInfo {
    /// The operand.
    pub operand: Operand,
    /// Short id used in deploy labels, component labels of our objects, status and the doctor.
    pub id: &'static str,
    /// Node label that switches the operand on for a node (`true`).
    pub deploy_label: &'static str,
    /// Further node labels its DaemonSet selects on.
    pub extra_node_selector: &'static [(&'static str, &'static str)],
    /// Name of its DaemonSet, and of the `app` label of its pods.
    pub daemonset: &'static str,
    /// `app.kubernetes.io/component` of its pods; images look for `nvidia-driver` on driver pods.
    pub component: &'static str,
    /// ClusterPolicy state (NVIDIA's asset directory) it belongs to.
    pub state: &'static str,
    /// ClusterPolicy field that switches it on or off; `None` for operands that always run.
    pub switch: Option<&'static str>,
    /// Whether it runs when its switch is absent.
    pub enabled_by_default: bool,
    /// Whether the policy turns it on: its switch, sandbox gates and driver ownership together.
    pub enabled: fn(&ClusterPolicySpec) -> bool,
    /// Workloads (and modes) that want it.
    pub placements: &'static [Placement],
    /// Only on nodes whose GPUs support MIG.
    pub needs_mig_capable: bool,
    /// Operands that must be ready on the same node before it can be.
    pub requires: &'static [Operand],
    /// Status file under `/run/nvidia/validations` that proves the operand works on the node.
    pub proves: Option<&'static str>,
    /// Status files its pods wait for before they start.
    pub waits_for: &'static [&'static str],
    /// ClusterPolicy section its image comes from.
    pub image_section: ImageSection,
    /// Operator environment variable with the image used when the policy names none.
    pub image_env: &'static str,
}

const CONTAINER: &[Placement] = &[Placement {
    workload: WorkloadConfig::Container,
    mode: None,
}];
const VM_ANY: &[Placement] = &[
    Placement {
        workload: WorkloadConfig::VmPassthrough,
        mode: None,
    },
    Placement {
        workload: WorkloadConfig::VmVgpu,
        mode: None,
    },
];
const VM_PASSTHROUGH: &[Placement] = &[Placement {
    workload: WorkloadConfig::VmPassthrough,
    mode: None,
}];
const VM_VGPU: &[Placement] = &[Placement {
    workload: WorkloadConfig::VmVgpu,
    mode: None,
}];

/// Status file names under `/run/nvidia/validations`.
pub mod status_file {
    /// The driver works (written by the validator's driver step).
    pub const DRIVER_READY: &str = "driver-ready";
    /// The container runtime injects GPUs (written by the validator's toolkit step).
    pub const TOOLKIT_READY: &str = "toolkit-ready";
    /// A CUDA workload ran (written by the validator's CUDA step).
    pub const CUDA_READY: &str = "cuda-ready";
    /// The node advertises GPUs (written by the validator's plugin step).
    pub const PLUGIN_READY: &str = "plugin-ready";
    /// GPUs are bound to vfio-pci.
    pub const VFIO_PCI_READY: &str = "vfio-pci-ready";
    /// The vGPU manager works.
    pub const VGPU_MANAGER_READY: &str = "vgpu-manager-ready";
    /// vGPU devices exist.
    pub const VGPU_DEVICES_READY: &str = "vgpu-devices-ready";
    /// The CC manager set the GPUs' mode.
    pub const CC_MANAGER_READY: &str = "cc-manager-ready";
    /// The driver container loaded the modules (written by the driver container's startup probe).
    pub const DRIVER_CONTAINER_READY: &str = ".driver-ctr-ready";
}

use Operand::*;
use status_file::*;

/// The catalogue, in NVIDIA's state order.
pub const OPERANDS: &[OperandInfo] = &[
    OperandInfo {
        operand: Driver,
        id: "driver",
        deploy_label: "nvidia.com/gpu.deploy.driver",
        extra_node_selector: &[],
        daemonset: "nvidia-driver-daemonset",
        component: "nvidia-driver",
        state: "state-driver",
        switch: Some("spec.driver.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.driver.is_enabled() && !spec.driver.use_nvidia_driver_crd(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[],
        proves: Some(DRIVER_READY),
        waits_for: &[],
        image_section: ImageSection::Driver,
        image_env: "DRIVER_IMAGE",
    },
    OperandInfo {
        operand: ContainerToolkit,
        id: "container-toolkit",
        deploy_label: "nvidia.com/gpu.deploy.container-toolkit",
        extra_node_selector: &[],
        daemonset: "nvidia-container-toolkit-daemonset",
        component: "container-toolkit",
        state: "state-container-toolkit",
        switch: Some("spec.toolkit.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.toolkit.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver],
        proves: Some(TOOLKIT_READY),
        waits_for: &[DRIVER_READY],
        image_section: ImageSection::Toolkit,
        image_env: "CONTAINER_TOOLKIT_IMAGE",
    },
    OperandInfo {
        operand: OperatorValidator,
        id: "operator-validator",
        deploy_label: "nvidia.com/gpu.deploy.operator-validator",
        extra_node_selector: &[],
        daemonset: "nvidia-operator-validator",
        component: "operator-validator",
        state: "state-operator-validation",
        switch: None,
        enabled_by_default: true,
        enabled: |_| true,
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver, ContainerToolkit, DevicePlugin],
        proves: Some(CUDA_READY),
        waits_for: &[],
        image_section: ImageSection::Validator,
        image_env: "VALIDATOR_IMAGE",
    },
    OperandInfo {
        operand: DevicePlugin,
        id: "device-plugin",
        deploy_label: "nvidia.com/gpu.deploy.device-plugin",
        extra_node_selector: &[],
        daemonset: "nvidia-device-plugin-daemonset",
        component: "device-plugin",
        state: "state-device-plugin",
        switch: Some("spec.devicePlugin.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.device_plugin.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver, ContainerToolkit],
        proves: Some(PLUGIN_READY),
        waits_for: &[TOOLKIT_READY],
        image_section: ImageSection::DevicePlugin,
        image_env: "DEVICE_PLUGIN_IMAGE",
    },
    OperandInfo {
        operand: MpsControlDaemon,
        id: "mps-control-daemon",
        deploy_label: "nvidia.com/gpu.deploy.device-plugin",
        extra_node_selector: &[("nvidia.com/mps.capable", "true")],
        daemonset: "nvidia-device-plugin-mps-control-daemon",
        component: "mps-control-daemon",
        state: "state-mps-control-daemon",
        switch: Some("spec.devicePlugin.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.device_plugin.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver, ContainerToolkit],
        proves: None,
        waits_for: &[TOOLKIT_READY],
        image_section: ImageSection::DevicePlugin,
        image_env: "DEVICE_PLUGIN_IMAGE",
    },
    OperandInfo {
        operand: Dcgm,
        id: "dcgm",
        deploy_label: "nvidia.com/gpu.deploy.dcgm",
        extra_node_selector: &[],
        daemonset: "nvidia-dcgm",
        component: "dcgm",
        state: "state-dcgm",
        switch: Some("spec.dcgm.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.dcgm.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver, ContainerToolkit],
        proves: None,
        waits_for: &[TOOLKIT_READY],
        image_section: ImageSection::Dcgm,
        image_env: "DCGM_IMAGE",
    },
    OperandInfo {
        operand: DcgmExporter,
        id: "dcgm-exporter",
        deploy_label: "nvidia.com/gpu.deploy.dcgm-exporter",
        extra_node_selector: &[],
        daemonset: "nvidia-dcgm-exporter",
        component: "dcgm-exporter",
        state: "state-dcgm-exporter",
        switch: Some("spec.dcgmExporter.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.dcgm_exporter.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver, ContainerToolkit],
        proves: None,
        waits_for: &[TOOLKIT_READY],
        image_section: ImageSection::DcgmExporter,
        image_env: "DCGM_EXPORTER_IMAGE",
    },
    OperandInfo {
        operand: GpuFeatureDiscovery,
        id: "gpu-feature-discovery",
        deploy_label: "nvidia.com/gpu.deploy.gpu-feature-discovery",
        extra_node_selector: &[],
        daemonset: "gpu-feature-discovery",
        component: "gpu-feature-discovery",
        state: "gpu-feature-discovery",
        switch: Some("spec.gfd.enabled"),
        enabled_by_default: true,
        enabled: |spec| spec.gpu_feature_discovery.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[Driver, ContainerToolkit],
        proves: None,
        waits_for: &[TOOLKIT_READY],
        image_section: ImageSection::Gfd,
        image_env: "GFD_IMAGE",
    },
    OperandInfo {
        operand: MigManager,
        id: "mig-manager",
        deploy_label: "nvidia.com/gpu.deploy.mig-manager",
        extra_node_selector: &[],
        daemonset: "nvidia-mig-manager",
        component: "mig-manager",
        state: "state-mig-manager",
        switch: Some("spec.migManager.enabled"),
        enabled_by_default: true,
        enabled: ClusterPolicySpec::mig_manager_enabled,
        placements: CONTAINER,
        needs_mig_capable: true,
        requires: &[Driver, ContainerToolkit],
        proves: None,
        waits_for: &[DRIVER_READY, TOOLKIT_READY],
        image_section: ImageSection::MigManager,
        image_env: "MIG_MANAGER_IMAGE",
    },
    OperandInfo {
        operand: NodeStatusExporter,
        id: "node-status-exporter",
        deploy_label: "nvidia.com/gpu.deploy.node-status-exporter",
        extra_node_selector: &[],
        daemonset: "nvidia-node-status-exporter",
        component: "node-status-exporter",
        state: "state-node-status-exporter",
        switch: Some("spec.nodeStatusExporter.enabled"),
        enabled_by_default: false,
        enabled: |spec| spec.node_status_exporter.is_enabled(),
        placements: CONTAINER,
        needs_mig_capable: false,
        requires: &[],
        proves: None,
        waits_for: &[],
        image_section: ImageSection::NodeStatusExporter,
        image_env: "VALIDATOR_IMAGE",
    },
    OperandInfo {
        operand: VgpuManager,
        id: "vgpu-manager",
        deploy_label: "nvidia.com/gpu.deploy.vgpu-manager",
        extra_node_selector: &[],
        daemonset: "nvidia-vgpu-manager-daemonset",
        component: "nvidia-vgpu-manager",
        state: "state-vgpu-manager",
        switch: Some("spec.vgpuManager.enabled"),
        enabled_by_default: false,
        enabled: |spec| {
            spec.sandbox_enabled() && spec.vgpu_manager_enabled() && !spec.driver.use_nvidia_driver_crd()
        },
        placements: VM_VGPU,
        needs_mig_capable: false,
        requires: &[],
        proves: Some(VGPU_MANAGER_READY),
        waits_for: &[],
        image_section: ImageSection::VgpuManager,
        image_env: "VGPU_MANAGER_IMAGE",
    },
    OperandInfo {
        operand: VgpuDeviceManager,
        id: "vgpu-device-manager",
        deploy_label: "nvidia.com/gpu.deploy.vgpu-device-manager",
        extra_node_selector: &[],
        daemonset: "nvidia-vgpu-device-manager",
        component: "vgpu-device-manager",
        state: "state-vgpu-device-manager",
        switch: Some("spec.vgpuDeviceManager.enabled"),
        enabled_by_default: false,
        enabled: |spec| spec.sandbox_enabled() && spec.vgpu_device_manager_enabled(),
        placements: VM_VGPU,
        needs_mig_capable: false,
        requires: &[VgpuManager],
        proves: Some(VGPU_DEVICES_READY),
        waits_for: &[VGPU_MANAGER_READY],
        image_section: ImageSection::VgpuDeviceManager,
        image_env: "VGPU_DEVICE_MANAGER_IMAGE",
    },
    OperandInfo {
        operand: SandboxValidator,
        id: "sandbox-validator",
        deploy_label: "nvidia.com/gpu.deploy.sandbox-validator",
        extra_node_selector: &[],
        daemonset: "nvidia-sandbox-validator",
        component: "sandbox-validator",
        state: "state-sandbox-validation",
        switch: Some("spec.sandboxWorkloads.enabled"),
        enabled_by_default: false,
        enabled: ClusterPolicySpec::sandbox_enabled,
        placements: VM_ANY,
        needs_mig_capable: false,
        requires: &[VfioManager, VgpuManager],
        proves: Some(VFIO_PCI_READY),
        waits_for: &[],
        image_section: ImageSection::Validator,
        image_env: "VALIDATOR_IMAGE",
    },
    OperandInfo {
        operand: VfioManager,
        id: "vfio-manager",
        deploy_label: "nvidia.com/gpu.deploy.vfio-manager",
        extra_node_selector: &[],
        daemonset: "nvidia-vfio-manager",
        component: "vfio-manager",
        state: "state-vfio-manager",
        switch: Some("spec.vfioManager.enabled"),
        enabled_by_default: false,
        enabled: |spec| spec.sandbox_enabled() && spec.vfio_manager_enabled(),
        placements: VM_PASSTHROUGH,
        needs_mig_capable: false,
        requires: &[],
        proves: None,
        waits_for: &[],
        image_section: ImageSection::VfioManager,
        image_env: "VFIO_MANAGER_IMAGE",
    },
    OperandInfo {
        operand: SandboxDevicePlugin,
        id: "sandbox-device-plugin",
        deploy_label: "nvidia.com/gpu.deploy.sandbox-device-plugin",
        extra_node_selector: &[],
        daemonset: "nvidia-sandbox-device-plugin-daemonset",
        component: "sandbox-device-plugin",
        state: "state-sandbox-device-plugin",
        switch: Some("spec.sandboxDevicePlugin.enabled"),
        enabled_by_default: false,
        enabled: |spec| {
            spec.sandbox_enabled()
                && spec.sandbox_device_plugin_enabled()
                && spec.sandbox_mode() == SandboxMode::KubeVirt.as_str()
        },
        placements: &[
            Placement {
                workload: WorkloadConfig::VmPassthrough,
                mode: Some(SandboxMode::KubeVirt),
            },
            Placement {
                workload: WorkloadConfig::VmVgpu,
                mode: None,
            },
        ],
        needs_mig_capable: false,
        requires: &[SandboxValidator],
        proves: None,
        waits_for: &[],
        image_section: ImageSection::SandboxDevicePlugin,
        image_env: "SANDBOX_DEVICE_PLUGIN_IMAGE",
    },
    OperandInfo {
        operand: KataSandboxDevicePlugin,
        id: "kata-sandbox-device-plugin",
        deploy_label: "nvidia.com/gpu.deploy.kata-sandbox-device-plugin",
        extra_node_selector: &[],
        daemonset: "nvidia-kata-sandbox-device-plugin-daemonset",
        component: "kata-sandbox-device-plugin",
        state: "state-kata-device-plugin",
        switch: Some("spec.kataSandboxDevicePlugin.enabled"),
        enabled_by_default: false,
        enabled: |spec| {
            spec.sandbox_enabled()
                && spec.kata_sandbox_device_plugin_enabled()
                && spec.sandbox_mode() == SandboxMode::Kata.as_str()
        },
        placements: &[Placement {
            workload: WorkloadConfig::VmPassthrough,
            mode: Some(SandboxMode::Kata),
        }],
        needs_mig_capable: false,
        requires: &[SandboxValidator],
        proves: None,
        waits_for: &[],
        image_section: ImageSection::KataSandboxDevicePlugin,
        image_env: "KATA_SANDBOX_DEVICE_PLUGIN_IMAGE",
    },
    OperandInfo {
        operand: CcManager,
        id: "cc-manager",
        deploy_label: "nvidia.com/gpu.deploy.cc-manager",
        extra_node_selector: &[],
        daemonset: "nvidia-cc-manager",
        component: "cc-manager",
        state: "state-cc-manager",
        switch: Some("spec.ccManager.enabled"),
        enabled_by_default: false,
        enabled: |spec| {
            spec.sandbox_enabled()
                && spec.cc_manager_enabled()
                && spec.sandbox_mode() == SandboxMode::Kata.as_str()
        },
        placements: VM_ANY,
        needs_mig_capable: false,
        requires: &[],
        proves: Some(CC_MANAGER_READY),
        waits_for: &[],
        image_section: ImageSection::CcManager,
        image_env: "CC_MANAGER_IMAGE",
    },
];

impl Operand {
    /// Every operand, in catalogue order.
    pub fn all() -> impl Iterator<Item = Operand> {
        OPERANDS.iter().map(|info| info.operand)
    }

    /// The operand's catalogue entry.
    pub fn info(self) -> &'static OperandInfo {
        // The table is in declaration order of the enum; the test `table_is_in_enum_order` keeps it so.
        &OPERANDS[self as usize]
    }

    /// The operand with this id.
    pub fn from_id(id: &str) -> Option<Operand> {
        OPERANDS
            .iter()
            .find(|info| info.id == id)
            .map(|info| info.operand)
    }

    /// The operand a DaemonSet runs, recognised by the catalogue: its name, or its `app.kubernetes.io/component`
    /// label (the DaemonSet's or its pod template's), which is how per-kernel driver DaemonSets are known.
    pub fn of_daemonset(daemon_set: &k8s_openapi::api::apps::v1::DaemonSet) -> Option<Operand> {
        if let Some(operand) = daemon_set
            .metadata
            .name
            .as_deref()
            .and_then(Operand::from_daemonset)
        {
            return Some(operand);
        }
        let template_labels = daemon_set
            .spec
            .as_ref()
            .and_then(|spec| spec.template.metadata.as_ref())
            .and_then(|meta| meta.labels.as_ref());
        [daemon_set.metadata.labels.as_ref(), template_labels]
            .into_iter()
            .flatten()
            .filter_map(|labels| labels.get(crate::labels::COMPONENT))
            .find_map(|component| {
                OPERANDS
                    .iter()
                    .find(|info| info.component == component || info.id == component)
                    .map(|info| info.operand)
            })
    }

    /// The operand whose DaemonSet has this name.
    pub fn from_daemonset(name: &str) -> Option<Operand> {
        OPERANDS
            .iter()
            .find(|info| info.daemonset == name)
            .map(|info| info.operand)
    }

    /// Short id, e.g. `device-plugin`.
    pub fn id(self) -> &'static str {
        self.info().id
    }

    /// Operands this one needs on the same node, directly or through others, in catalogue order.
    pub fn requires_transitively(self) -> Vec<Operand> {
        let mut needed = Vec::new();
        let mut stack: Vec<Operand> = self.info().requires.to_vec();
        while let Some(operand) = stack.pop() {
            if !needed.contains(&operand) {
                needed.push(operand);
                stack.extend_from_slice(operand.info().requires);
            }
        }
        needed.sort();
        needed
    }
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl OperandInfo {
    /// Whether a node with this workload config (under this sandbox mode) wants the operand.
    pub fn wanted_for(&self, workload: WorkloadConfig, mode: SandboxMode) -> bool {
        self.placements
            .iter()
            .any(|p| p.workload == workload && p.mode.is_none_or(|m| m == mode))
    }
}

/// The deploy labels a node with this workload config should carry, in catalogue order, without duplicates.
///
/// `mig_capable` adds the MIG manager's label on container nodes.
pub fn deploy_labels_for(
    workload: WorkloadConfig,
    mode: SandboxMode,
    mig_capable: bool,
) -> Vec<&'static str> {
    let mut labels: Vec<&'static str> = Vec::new();
    for info in OPERANDS {
        if info.wanted_for(workload, mode)
            && (!info.needs_mig_capable || mig_capable)
            && !labels.contains(&info.deploy_label)
        {
            labels.push(info.deploy_label);
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_daemon_sets_are_known_by_name_or_component_label() {
        let named = |name: &str, labels: &[(&str, &str)]| k8s_openapi::api::apps::v1::DaemonSet {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(crate::labels::label_map(labels)),
                ..k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default()
            },
            ..k8s_openapi::api::apps::v1::DaemonSet::default()
        };
        assert_eq!(
            Operand::of_daemonset(&named("nvidia-dcgm-exporter", &[])),
            Some(Operand::DcgmExporter)
        );
        // Precompiled drivers get one DaemonSet per kernel; the component label names the operand.
        let precompiled = named(
            "nvidia-driver-daemonset-5.15.0-122-generic-ubuntu22.04",
            &[(crate::labels::COMPONENT, "nvidia-driver")],
        );
        assert_eq!(Operand::of_daemonset(&precompiled), Some(Operand::Driver));
        assert_eq!(
            Operand::of_daemonset(&named("mine", &[(crate::labels::COMPONENT, "device-plugin")])),
            Some(Operand::DevicePlugin)
        );
        assert_eq!(
            Operand::of_daemonset(&named("kube-proxy", &[(crate::labels::COMPONENT, "proxy")])),
            None
        );
    }
    use crate::labels::DEPLOY_PREFIX;

    #[test]
    fn table_is_in_enum_order() {
        for (index, info) in OPERANDS.iter().enumerate() {
            assert_eq!(info.operand as usize, index, "{} is out of place", info.id);
            assert_eq!(info.operand.info().id, info.id);
        }
    }

    #[test]
    fn names_match_nvidias() {
        // (id, DaemonSet, state), from NVIDIA's state table.
        let expected = [
            ("driver", "nvidia-driver-daemonset", "state-driver"),
            (
                "container-toolkit",
                "nvidia-container-toolkit-daemonset",
                "state-container-toolkit",
            ),
            (
                "operator-validator",
                "nvidia-operator-validator",
                "state-operator-validation",
            ),
            (
                "device-plugin",
                "nvidia-device-plugin-daemonset",
                "state-device-plugin",
            ),
            (
                "mps-control-daemon",
                "nvidia-device-plugin-mps-control-daemon",
                "state-mps-control-daemon",
            ),
            ("dcgm", "nvidia-dcgm", "state-dcgm"),
            ("dcgm-exporter", "nvidia-dcgm-exporter", "state-dcgm-exporter"),
            (
                "gpu-feature-discovery",
                "gpu-feature-discovery",
                "gpu-feature-discovery",
            ),
            ("mig-manager", "nvidia-mig-manager", "state-mig-manager"),
            (
                "node-status-exporter",
                "nvidia-node-status-exporter",
                "state-node-status-exporter",
            ),
            (
                "vgpu-manager",
                "nvidia-vgpu-manager-daemonset",
                "state-vgpu-manager",
            ),
            (
                "vgpu-device-manager",
                "nvidia-vgpu-device-manager",
                "state-vgpu-device-manager",
            ),
            (
                "sandbox-validator",
                "nvidia-sandbox-validator",
                "state-sandbox-validation",
            ),
            ("vfio-manager", "nvidia-vfio-manager", "state-vfio-manager"),
            (
                "sandbox-device-plugin",
                "nvidia-sandbox-device-plugin-daemonset",
                "state-sandbox-device-plugin",
            ),
            (
                "kata-sandbox-device-plugin",
                "nvidia-kata-sandbox-device-plugin-daemonset",
                "state-kata-device-plugin",
            ),
            ("cc-manager", "nvidia-cc-manager", "state-cc-manager"),
        ];
        let actual: Vec<_> = OPERANDS.iter().map(|i| (i.id, i.daemonset, i.state)).collect();
        assert_eq!(actual, expected);
    }

    #[test]
    fn deploy_labels_are_the_prefix_plus_the_id_except_mps() {
        for info in OPERANDS {
            let expected = if info.operand == MpsControlDaemon {
                "nvidia.com/gpu.deploy.device-plugin".to_owned()
            } else {
                format!("{DEPLOY_PREFIX}{}", info.id)
            };
            assert_eq!(info.deploy_label, expected, "{}", info.id);
        }
        assert_eq!(
            MpsControlDaemon.info().extra_node_selector,
            &[("nvidia.com/mps.capable", "true")]
        );
    }

    #[test]
    fn driver_pods_keep_the_component_label_images_look_for() {
        assert_eq!(Driver.info().component, "nvidia-driver");
    }

    #[test]
    fn dependency_graph_is_acyclic_with_the_driver_at_the_root() {
        for info in OPERANDS {
            assert!(
                !info.operand.requires_transitively().contains(&info.operand),
                "{} depends on itself",
                info.id
            );
            for required in info.requires {
                let shares_a_workload = info.placements.iter().any(|p| {
                    [SandboxMode::KubeVirt, SandboxMode::Kata]
                        .into_iter()
                        .any(|mode| required.info().wanted_for(p.workload, mode))
                });
                assert!(
                    shares_a_workload,
                    "{} requires {}, which never runs where it does",
                    info.id,
                    required.id()
                );
            }
        }
        assert!(Driver.info().requires.is_empty());
        for operand in [
            ContainerToolkit,
            DevicePlugin,
            GpuFeatureDiscovery,
            DcgmExporter,
            MigManager,
            OperatorValidator,
        ] {
            assert!(
                operand.requires_transitively().contains(&Driver),
                "{operand} must need the driver"
            );
        }
        assert_eq!(
            DevicePlugin.requires_transitively(),
            vec![Driver, ContainerToolkit]
        );
        assert_eq!(
            OperatorValidator.requires_transitively(),
            vec![Driver, ContainerToolkit, DevicePlugin]
        );
    }

    #[test]
    fn status_files_follow_the_validator_protocol() {
        assert_eq!(Driver.info().proves, Some("driver-ready"));
        assert_eq!(ContainerToolkit.info().proves, Some("toolkit-ready"));
        assert_eq!(DevicePlugin.info().proves, Some("plugin-ready"));
        assert_eq!(OperatorValidator.info().proves, Some("cuda-ready"));
        for operand in [
            DevicePlugin,
            GpuFeatureDiscovery,
            Dcgm,
            DcgmExporter,
            MigManager,
            MpsControlDaemon,
        ] {
            assert!(
                operand.info().waits_for.contains(&"toolkit-ready"),
                "{operand} waits for toolkit-ready"
            );
        }
        // Every file waited for is proven by some operand.
        for info in OPERANDS {
            for file in info.waits_for {
                assert!(
                    OPERANDS.iter().any(|other| other.proves == Some(file)),
                    "nobody writes {file}"
                );
            }
        }
    }

    #[test]
    fn workload_tables_match_nvidias_labeller() {
        let container = deploy_labels_for(WorkloadConfig::Container, SandboxMode::KubeVirt, false);
        let ids: Vec<_> = container
            .iter()
            .map(|l| l.trim_start_matches(DEPLOY_PREFIX))
            .collect();
        assert_eq!(
            ids,
            [
                "driver",
                "container-toolkit",
                "operator-validator",
                "device-plugin",
                "dcgm",
                "dcgm-exporter",
                "gpu-feature-discovery",
                "node-status-exporter"
            ]
        );
        assert!(
            deploy_labels_for(WorkloadConfig::Container, SandboxMode::KubeVirt, true)
                .contains(&"nvidia.com/gpu.deploy.mig-manager")
        );
        let passthrough = deploy_labels_for(WorkloadConfig::VmPassthrough, SandboxMode::KubeVirt, true);
        let ids: Vec<_> = passthrough
            .iter()
            .map(|l| l.trim_start_matches(DEPLOY_PREFIX))
            .collect();
        assert_eq!(
            ids,
            [
                "sandbox-validator",
                "vfio-manager",
                "sandbox-device-plugin",
                "cc-manager"
            ]
        );
        let kata = deploy_labels_for(WorkloadConfig::VmPassthrough, SandboxMode::Kata, false);
        assert!(kata.contains(&"nvidia.com/gpu.deploy.kata-sandbox-device-plugin"));
        assert!(!kata.contains(&"nvidia.com/gpu.deploy.sandbox-device-plugin"));
        let vgpu = deploy_labels_for(WorkloadConfig::VmVgpu, SandboxMode::Kata, false);
        let ids: Vec<_> = vgpu.iter().map(|l| l.trim_start_matches(DEPLOY_PREFIX)).collect();
        assert_eq!(
            ids,
            [
                "vgpu-manager",
                "vgpu-device-manager",
                "sandbox-validator",
                "sandbox-device-plugin",
                "cc-manager"
            ]
        );
    }

    #[test]
    fn enablement_follows_nvidias_state_rules() {
        let spec = |yaml: &str| -> ClusterPolicySpec { serde_saphyr::from_str(yaml).unwrap() };
        let enabled = |spec: &ClusterPolicySpec| -> Vec<&str> {
            OPERANDS
                .iter()
                .filter(|info| (info.enabled)(spec))
                .map(|info| info.id)
                .collect()
        };
        assert_eq!(
            enabled(&spec("{}")),
            [
                "driver",
                "container-toolkit",
                "operator-validator",
                "device-plugin",
                "mps-control-daemon",
                "dcgm",
                "dcgm-exporter",
                "gpu-feature-discovery",
                "mig-manager"
            ]
        );
        assert!(!enabled(&spec("driver: {useNvidiaDriverCRD: true}")).contains(&"driver"));
        // Sandbox operands need the sandbox switch and their own, and the right mode.
        let sandbox = spec(
            "sandboxWorkloads: {enabled: true, mode: kata}\n\
             sandboxDevicePlugin: {enabled: true}\nkataSandboxDevicePlugin: {enabled: true}\n\
             ccManager: {enabled: true}\nvfioManager: {enabled: true}",
        );
        let ids = enabled(&sandbox);
        assert!(ids.contains(&"kata-sandbox-device-plugin") && ids.contains(&"cc-manager"));
        assert!(!ids.contains(&"sandbox-device-plugin"));
        assert!(ids.contains(&"sandbox-validator") && ids.contains(&"vfio-manager"));
        assert!(!enabled(&spec("vfioManager: {enabled: true}")).contains(&"vfio-manager"));
        // Switch defaults in the table agree with the policy's own defaults.
        for info in OPERANDS {
            if info.switch.is_some()
                && !info.id.contains("sandbox")
                && ![
                    "vgpu-manager",
                    "vgpu-device-manager",
                    "vfio-manager",
                    "cc-manager",
                ]
                .contains(&info.id)
            {
                assert_eq!(
                    (info.enabled)(&spec("{}")),
                    info.enabled_by_default,
                    "{}",
                    info.id
                );
            }
        }
    }

    #[test]
    fn lookups_by_id_and_daemonset() {
        for info in OPERANDS {
            assert_eq!(Operand::from_id(info.id), Some(info.operand));
            assert_eq!(Operand::from_daemonset(info.daemonset), Some(info.operand));
        }
        assert_eq!(Operand::from_id("nope"), None);
    }
}
