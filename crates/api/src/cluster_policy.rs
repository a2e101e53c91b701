//! `ClusterPolicy` `nvidia.com/v1`: the one object that says which operands run on GPU nodes and how.
//!
//! Field names are NVIDIA's JSON names, so a manifest written for NVIDIA's operator parses here without
//! losing a field. Where NVIDIA's operator decides a default in code when a field is absent (rather than in
//! the CRD), the section's `is_enabled()` (and similar) methods apply the same rule; the table in
//! `tests` pins each one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSecurityContext, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::choice::{
    CcMode, KernelModuleType, MigDefault, MigStrategy, RelabelAction, SandboxMode, UpdateStrategy,
    WorkloadConfig,
};
use crate::component::{ComponentSpec, ContainerSpec, EnvVar, ImageSpec, NameRef, NamedConfig, flag};
use crate::driver::{
    ClusterPolicyUpgradePolicy, ContainerProbeSpec, DriverAddonSpec, DriverManagerSpec, GpuDirectRdmaSpec,
};
use crate::status::PolicyStatus;

/// Default RuntimeClass (and containerd handler) name for operands that need the NVIDIA runtime.
pub const DEFAULT_RUNTIME_CLASS: &str = "nvidia";
/// Default install directory of the container toolkit on the host.
pub const DEFAULT_TOOLKIT_INSTALL_DIR: &str = "/usr/local/nvidia";
/// Default MPS root directory on the host.
pub const DEFAULT_MPS_ROOT: &str = "/run/nvidia/mps";
/// Default kubelet root directory on the host.
pub const DEFAULT_KUBELET_ROOT_DIR: &str = "/var/lib/kubelet";
/// Default directory where the driver container installs the driver on the host.
pub const DEFAULT_DRIVER_INSTALL_DIR: &str = "/run/nvidia/driver";
/// Default host root.
pub const DEFAULT_ROOT_FS: &str = "/";
/// Default directory of the DCGM exporter's HPC job mapping files.
pub const DEFAULT_HPC_JOB_MAPPING_DIR: &str = "/var/lib/dcgm-exporter/job-mapping";
/// Default directory of Kata artifacts on the host.
pub const DEFAULT_KATA_ARTIFACTS_DIR: &str = "/opt/nvidia-gpu-operator/artifacts/runtimeclasses";
/// Default vGPU device configuration key.
pub const DEFAULT_VGPU_DEVICES_CONFIG: &str = "default";

/// The desired state of GPU support on the cluster's nodes.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1",
    kind = "ClusterPolicy",
    plural = "clusterpolicies",
    singular = "clusterpolicy",
    status = "PolicyStatus",
    derive = "PartialEq",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    doc = "ClusterPolicy configures the GPU operator: which operands run on GPU nodes and how."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend(
    "required" = [
        "operator", "daemonsets", "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm",
        "nodeStatusExporter", "gfd"
    ],
    "x-kubernetes-validations" = [{
        "rule": "!has(self.cdi) || !has(self.cdi.nriPluginEnabled) || !self.cdi.nriPluginEnabled || ((!has(self.cdi.enabled) || self.cdi.enabled) && (!has(self.toolkit.enabled) || self.toolkit.enabled))",
        "message": "cdi.nriPluginEnabled needs cdi.enabled and toolkit.enabled: the NRI plugin runs in the container toolkit and injects devices through CDI",
        "fieldPath": ".cdi.nriPluginEnabled"
    }]
))]
pub struct ClusterPolicySpec {
    /// Settings of the operator itself.
    #[serde(default)]
    pub operator: OperatorSpec,
    /// Settings shared by every operand DaemonSet.
    #[serde(default)]
    pub daemonsets: DaemonsetsSpec,
    /// The NVIDIA driver container.
    #[serde(default)]
    pub driver: DriverSpec,
    /// The NVIDIA container toolkit.
    #[serde(default)]
    pub toolkit: ToolkitSpec,
    /// The NVIDIA device plugin.
    #[serde(default)]
    pub device_plugin: DevicePluginSpec,
    /// The DCGM exporter.
    #[serde(default)]
    pub dcgm_exporter: DcgmExporterSpec,
    /// The standalone DCGM host engine.
    #[serde(default)]
    pub dcgm: DcgmSpec,
    /// The node status exporter.
    #[serde(default)]
    pub node_status_exporter: NodeStatusExporterSpec,
    /// GPU feature discovery.
    #[serde(default, rename = "gfd")]
    pub gpu_feature_discovery: GpuFeatureDiscoverySpec,
    /// MIG settings shared by the device plugin and feature discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigSpec>,
    /// The MIG manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_manager: Option<MigManagerSpec>,
    /// Deprecated PodSecurityPolicy switch; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psp: Option<Switch>,
    /// Pod Security Admission labels on the operator namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psa: Option<Switch>,
    /// The operator validator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validator: Option<ValidatorSpec>,
    /// GPUDirect Storage (nvidia-fs) in the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds: Option<DriverAddonSpec>,
    /// GDRCopy (gdrdrv) in the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy: Option<DriverAddonSpec>,
    /// Virtual-machine workloads (KubeVirt, Kata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_workloads: Option<SandboxWorkloadsSpec>,
    /// The VFIO manager for GPU passthrough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_manager: Option<VfioManagerSpec>,
    /// The KubeVirt sandbox device plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_device_plugin: Option<ComponentSpec>,
    /// The vGPU host manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_manager: Option<VgpuManagerSpec>,
    /// The vGPU device manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_device_manager: Option<VgpuDeviceManagerSpec>,
    /// Container Device Interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdi: Option<CdiSpec>,
    /// Deprecated Kata manager; never deployed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kata_manager: Option<KataManagerSpec>,
    /// The confidential-computing manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cc_manager: Option<CcManagerSpec>,
    /// Host paths the operands use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_paths: Option<HostPathsSpec>,
    /// The Kata sandbox device plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kata_sandbox_device_plugin: Option<ComponentSpec>,
}

/// An object whose only field is `enabled`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Switch {
    /// Turn the feature on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Settings of the operator itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSpec {
    /// Deprecated: the runtime is detected from the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime: Option<String>,
    /// Name of the RuntimeClass operands use for the NVIDIA runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "nvidia"))]
    pub runtime_class: Option<String>,
    /// Deprecated init container image (`CUDA_BASE_IMAGE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container: Option<ImageSpec>,
    /// Labels added to the operator's own objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations added to the operator's own objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Prometheus scraping of the operator's metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<OperatorMetricsSpec>,
    /// On OpenShift, build drivers with the Driver Toolkit.
    #[serde(
        default,
        rename = "use_ocp_driver_toolkit",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_ocp_driver_toolkit: Option<bool>,
}

impl OperatorSpec {
    /// The RuntimeClass name, `nvidia` when absent or empty.
    pub fn runtime_class(&self) -> &str {
        self.runtime_class
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_RUNTIME_CLASS)
    }

    /// The OpenShift Driver Toolkit is used unless turned off.
    pub fn use_ocp_driver_toolkit(&self) -> bool {
        flag(self.use_ocp_driver_toolkit, true)
    }
}

/// Prometheus scraping of the operator's metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorMetricsSpec {
    /// ServiceMonitor for the operator's metrics Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorConfig>,
}

/// A Prometheus Operator ServiceMonitor the operator creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorConfig {
    /// Create the ServiceMonitor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Scrape interval, e.g. `15s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    ))]
    pub interval: Option<String>,
    /// Scrape timeout, e.g. `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    ))]
    pub scrape_timeout: Option<String>,
    /// Keep the labels of scraped series when they clash with target labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_labels: Option<bool>,
    /// Extra labels on the ServiceMonitor, e.g. to match a Prometheus selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_labels: Option<BTreeMap<String, String>>,
    /// Relabelling rules applied to scraped series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relabelings: Option<Vec<RelabelConfig>>,
}

impl ServiceMonitorConfig {
    /// ServiceMonitors are created only when asked for.
    pub fn is_enabled(&self) -> bool {
        flag(self.enabled, false)
    }
}

/// One Prometheus relabelling rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelabelConfig {
    /// Labels whose values are concatenated and matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_labels: Option<Vec<String>>,
    /// Separator between concatenated source label values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// Label the result is written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
    /// Regular expression matched against the source value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Modulus of the hash for `HashMod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub modulus: Option<i64>,
    /// Replacement value; regex capture groups are available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// What the rule does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "RelabelAction::schema", extend("default" = "replace"))]
    pub action: Option<String>,
}

/// Settings shared by every operand DaemonSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaemonsetsSpec {
    /// Labels added to every operand pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations added to every operand pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Tolerations of every operand pod; they replace the default `nvidia.com/gpu` toleration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// PriorityClass of every operand pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// How operand DaemonSets (all but the driver's) roll out changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "UpdateStrategy::schema", extend("default" = "RollingUpdate"))]
    pub update_strategy: Option<String>,
    /// Rolling update limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateSpec>,
    /// Pod security context of every operand pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
}

/// Rolling update limits of operand DaemonSets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateSpec {
    /// Pods that may be unavailable during an update: a count (`1`) or a percentage (`10%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^([1-9][0-9]*|([1-9]|[1-9][0-9]|100)%)$')",
        "message": "must be a count of at least 1 like \"1\" or a percentage from 1% to 100% like \"10%\""
    }]), length(max = 16))]
    pub max_unavailable: Option<String>,
}

/// The NVIDIA driver container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverSpec {
    /// Deploy the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Manage drivers with NVIDIADriver objects instead of this section.
    #[serde(
        default,
        rename = "useNvidiaDriverCRD",
        skip_serializing_if = "Option::is_none"
    )]
    pub use_nvidia_driver_crd: Option<bool>,
    /// Use driver images with modules precompiled for the node's kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_precompiled: Option<bool>,
    /// Deprecated: use `kernelModuleType`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_open_kernel_modules: Option<bool>,
    /// Which kernel modules to load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "KernelModuleType::schema", extend("default" = "auto"))]
    pub kernel_module_type: Option<String>,
    /// Startup probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_probe: Option<ContainerProbeSpec>,
    /// Liveness probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ContainerProbeSpec>,
    /// Readiness probe of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ContainerProbeSpec>,
    /// GPUDirect RDMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<GpuDirectRdmaSpec>,
    /// Automatic node-by-node driver upgrades.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<ClusterPolicyUpgradePolicy>,
    /// The driver image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// The driver manager init container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<DriverManagerSpec>,
    /// The driver container's settings.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// ConfigMap with package repository configuration for the driver build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_config: Option<ConfigMapNameRef>,
    /// ConfigMap with custom certificates for the driver build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<NameRef>,
    /// vGPU guest licensing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licensing_config: Option<LicensingConfigSpec>,
    /// vGPU topology daemon configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_topology: Option<VirtualTopologySpec>,
    /// ConfigMap with kernel module parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_config: Option<NameRef>,
    /// Secret whose keys become environment variables of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
}

impl DriverSpec {
    /// The driver container is deployed unless turned off.
    pub fn is_enabled(&self) -> bool {
        flag(self.enabled, true)
    }

    /// NVIDIADriver objects take over the driver only when asked.
    pub fn use_nvidia_driver_crd(&self) -> bool {
        flag(self.use_nvidia_driver_crd, false)
    }

    /// Precompiled driver images are used only when asked.
    pub fn use_precompiled(&self) -> bool {
        flag(self.use_precompiled, false)
    }

    /// Automatic upgrades run only when an upgrade policy turns them on.
    pub fn is_auto_upgrade(&self) -> bool {
        self.upgrade_policy
            .as_ref()
            .is_some_and(ClusterPolicyUpgradePolicy::is_auto_upgrade)
    }

    /// vGPU licensing is configured when a ConfigMap or Secret is named.
    pub fn is_vgpu_licensing_enabled(&self) -> bool {
        self.licensing_config.as_ref().is_some_and(|config| {
            [&config.config_map_name, &config.secret_name]
                .into_iter()
                .any(|name| name.as_deref().is_some_and(|n| !n.is_empty()))
        })
    }
}

/// A ConfigMap named by `configMapName`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapNameRef {
    /// Name of the ConfigMap in the operator namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
}

/// vGPU guest licensing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LicensingConfigSpec {
    /// Deprecated: ConfigMap with the licensing configuration; use `secretName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    /// Secret with the licensing configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// License through NVIDIA License System.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nls_enabled: Option<bool>,
}

impl LicensingConfigSpec {
    /// In a ClusterPolicy, NVIDIA License System is off unless turned on.
    pub fn is_nls_enabled(&self) -> bool {
        flag(self.nls_enabled, false)
    }
}

/// vGPU topology daemon configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct VirtualTopologySpec {
    /// Name of the ConfigMap with the topology daemon configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

/// The NVIDIA container toolkit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolkitSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Where the toolkit is installed on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "/usr/local/nvidia"))]
    pub install_dir: Option<String>,
}

impl ToolkitSpec {
    /// The toolkit is deployed unless turned off.
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(true)
    }

    /// The install directory, `/usr/local/nvidia` when absent.
    pub fn install_dir(&self) -> &str {
        self.install_dir
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_TOOLKIT_INSTALL_DIR)
    }
}

/// The NVIDIA device plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// ConfigMap of named device plugin configurations (time-slicing, MPS) and the default one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<NamedConfig>,
    /// MPS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsSpec>,
}

impl DevicePluginSpec {
    /// The device plugin is deployed unless turned off.
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(true)
    }

    /// The MPS root, `/run/nvidia/mps` when absent.
    pub fn mps_root(&self) -> &str {
        self.mps
            .as_ref()
            .and_then(|mps| mps.root.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_MPS_ROOT)
    }
}

/// MPS settings of the device plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MpsSpec {
    /// Host directory for MPS pipes, logs and shared memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "/run/nvidia/mps"))]
    pub root: Option<String>,
}

/// The DCGM exporter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DcgmExporterSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Annotations on the exporter's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// ConfigMap with the metrics to export (`dcgm-metrics.csv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<NameRef>,
    /// ServiceMonitor for the exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorConfig>,
    /// The exporter's Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<DcgmExporterServiceSpec>,
    /// Run in the host PID namespace (needed to attribute processes to pods on some setups).
    #[serde(default, rename = "hostPID", skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<bool>,
    /// Map GPU metrics to HPC jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpc_job_mapping: Option<HpcJobMappingSpec>,
    /// Add the labels of the pod using a GPU to its metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_pod_labels: Option<bool>,
    /// Add the UID of the pod using a GPU to its metrics.
    #[serde(default, rename = "enablePodUID", skip_serializing_if = "Option::is_none")]
    pub enable_pod_uid: Option<bool>,
    /// Regular expressions of the pod labels that may become metric labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_label_allowlist_regex: Option<Vec<String>>,
}

impl DcgmExporterSpec {
    /// The exporter is deployed unless turned off.
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(true)
    }

    /// Host PID namespace only when asked.
    pub fn is_host_pid(&self) -> bool {
        flag(self.host_pid, false)
    }

    /// HPC job mapping only when asked.
    pub fn is_hpc_job_mapping_enabled(&self) -> bool {
        self.hpc_job_mapping
            .as_ref()
            .is_some_and(|mapping| flag(mapping.enabled, false))
    }

    /// The exporter needs to read pods when it labels metrics with pod labels or UIDs.
    pub fn needs_pod_metadata(&self) -> bool {
        flag(self.enable_pod_labels, false) || flag(self.enable_pod_uid, false)
    }
}

/// The DCGM exporter's Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DcgmExporterServiceSpec {
    /// Service type, e.g. `ClusterIP`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// `Cluster` or `Local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
}

/// HPC job mapping of the DCGM exporter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HpcJobMappingSpec {
    /// Map metrics to jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Host directory with the job mapping files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
}

/// The standalone DCGM host engine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DcgmSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Deprecated host port of the host engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<i32>,
}

impl DcgmSpec {
    /// As in NVIDIA's operator, the host engine is deployed unless turned off (its Helm chart turns it off).
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(true)
    }
}

/// The node status exporter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeStatusExporterSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
}

impl NodeStatusExporterSpec {
    /// The node status exporter is off unless turned on.
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(false)
    }
}

/// GPU feature discovery.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuFeatureDiscoverySpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
}

impl GpuFeatureDiscoverySpec {
    /// Feature discovery is deployed unless turned off.
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(true)
    }
}

/// MIG settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MigSpec {
    /// How MIG devices are advertised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "MigStrategy::schema")]
    pub strategy: Option<String>,
}

/// The MIG manager.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigManagerSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// ConfigMap of MIG layouts, and the layout stamped on MIG-capable nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<MigPartedConfigSpec>,
    /// ConfigMap listing host processes to stop while MIG is reconfigured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_clients_config: Option<NameRef>,
}

impl MigManagerSpec {
    /// The MIG manager is deployed unless turned off.
    pub fn is_enabled(&self) -> bool {
        self.component.enabled_or(true)
    }

    /// The layout stamped on MIG-capable nodes without one: `config.default` when it is `all-disabled`,
    /// else none, as NVIDIA's operator decides it. The CRD defaults `config.default` to `all-disabled` only
    /// where `config` is given, so a policy without `migManager.config` stamps nothing.
    pub fn default_layout(&self) -> Option<&str> {
        self.config
            .as_ref()
            .and_then(|config| config.default.as_deref())
            .filter(|layout| *layout == MigDefault::AllDisabled.as_str())
    }
}

/// MIG layout configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MigPartedConfigSpec {
    /// Name of a ConfigMap with MIG layouts (key `config.yaml`); the built-in one when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Layout stamped on MIG-capable nodes that have none: `all-disabled`, or `""` for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "MigDefault::schema", extend("default" = "all-disabled"))]
    pub default: Option<String>,
}

/// Environment for one validation step of the operator validator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ValidationEnv {
    /// Environment variables of this validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
}

/// The operator validator. It is always deployed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidatorSpec {
    /// The device plugin validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<ValidationEnv>,
    /// The container toolkit validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolkit: Option<ValidationEnv>,
    /// The driver validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<ValidationEnv>,
    /// The CUDA workload validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<ValidationEnv>,
    /// The VFIO-PCI validation (passthrough nodes).
    #[serde(default, rename = "vfioPCI", skip_serializing_if = "Option::is_none")]
    pub vfio_pci: Option<ValidationEnv>,
    /// The vGPU manager validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_manager: Option<ValidationEnv>,
    /// The vGPU devices validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_devices: Option<ValidationEnv>,
    /// The validator's image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// The validator's container settings.
    #[serde(flatten)]
    pub container: ContainerSpec,
}

/// Virtual-machine workloads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWorkloadsSpec {
    /// Support GPUs in virtual machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Workload of GPU nodes without a `nvidia.com/gpu.workload.config` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "WorkloadConfig::schema", extend("default" = "container"))]
    pub default_workload: Option<String>,
    /// Virtualisation stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "SandboxMode::schema", extend("default" = "kubevirt"))]
    pub mode: Option<String>,
}

impl SandboxWorkloadsSpec {
    /// Sandbox workloads are off unless turned on.
    pub fn is_enabled(&self) -> bool {
        flag(self.enabled, false)
    }
}

/// The VFIO manager.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VfioManagerSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// The driver manager init container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_manager: Option<DriverManagerSpec>,
}

/// The vGPU host manager.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VgpuManagerSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// The driver manager init container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_manager: Option<DriverManagerSpec>,
    /// ConfigMap with kernel module parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_config: Option<NameRef>,
}

/// The vGPU device manager.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VgpuDeviceManagerSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// ConfigMap of vGPU device layouts and the default one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<VgpuDevicesConfig>,
}

/// vGPU device layouts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct VgpuDevicesConfig {
    /// Name of the ConfigMap with the layouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Layout used on nodes that do not select one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "default"))]
    pub default: Option<String>,
}

/// Container Device Interface.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    /// Inject GPUs into containers through CDI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub enabled: Option<bool>,
    /// Deprecated; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub default: Option<bool>,
    /// Inject management devices through the NRI plugin instead of the `nvidia` RuntimeClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub nri_plugin_enabled: Option<bool>,
}

impl CdiSpec {
    /// CDI is on unless turned off.
    pub fn is_enabled(&self) -> bool {
        flag(self.enabled, true)
    }

    /// The NRI plugin is off unless turned on.
    pub fn is_nri_plugin_enabled(&self) -> bool {
        flag(self.nri_plugin_enabled, false)
    }
}

/// Deprecated Kata manager.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KataManagerSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Kata runtime classes and their artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<KataConfig>,
}

/// Kata runtime classes and their artifacts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KataConfig {
    /// Host directory for the artifacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "/opt/nvidia-gpu-operator/artifacts/runtimeclasses"))]
    pub artifacts_dir: Option<String>,
    /// Runtime classes to install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_classes: Option<Vec<KataRuntimeClass>>,
}

/// One Kata runtime class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KataRuntimeClass {
    /// Name of the runtime class.
    pub name: String,
    /// Nodes the runtime class applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Where its artifacts come from.
    pub artifacts: KataArtifacts,
}

/// Where Kata artifacts come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KataArtifacts {
    /// OCI reference of the artifacts.
    pub url: String,
    /// Secret for pulling them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
}

/// The confidential-computing manager.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CcManagerSpec {
    /// Image, container settings and the `enabled` switch.
    #[serde(flatten)]
    pub component: ComponentSpec,
    /// Mode set on GPUs of nodes that do not choose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "CcMode::schema")]
    pub default_mode: Option<String>,
}

/// Host paths the operands use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathsSpec {
    /// The host's root filesystem as seen by the node (where `nvidia-smi` of a host driver lives).
    #[serde(default, rename = "rootFS", skip_serializing_if = "Option::is_none")]
    pub root_fs: Option<String>,
    /// Where the driver container installs the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_install_dir: Option<String>,
    /// The kubelet's root directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "/var/lib/kubelet"))]
    pub kubelet_root_dir: Option<String>,
}

impl HostPathsSpec {
    /// The host root, `/` when absent.
    pub fn root_fs(&self) -> &str {
        self.root_fs
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_ROOT_FS)
    }

    /// The driver install directory, `/run/nvidia/driver` when absent.
    pub fn driver_install_dir(&self) -> &str {
        self.driver_install_dir
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_DRIVER_INSTALL_DIR)
    }

    /// The kubelet root directory, `/var/lib/kubelet` when absent.
    pub fn kubelet_root_dir(&self) -> &str {
        self.kubelet_root_dir
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_KUBELET_ROOT_DIR)
    }
}

/// Defaults for the optional sections, as NVIDIA's operator applies them when a section is absent.
impl ClusterPolicy {
    /// The order in which ClusterPolicies claim the cluster: the oldest first, the name breaking ties; one
    /// without a creation time (never stored by an API server, e.g. in a hand-written snapshot) counts as
    /// the newest. The first of them not being deleted is the one the operator acts on.
    pub fn activation_order(a: &ClusterPolicy, b: &ClusterPolicy) -> std::cmp::Ordering {
        Self::activation_order_of(&a.metadata, &b.metadata)
    }

    /// [`Self::activation_order`] by metadata alone, for policies whose spec cannot be read: one that does
    /// not decode still takes its place, so that it never hands the cluster to a newer one.
    pub fn activation_order_of(
        a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> std::cmp::Ordering {
        let created = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.creation_timestamp.as_ref().map(|t| t.0)
        };
        let by_age = match (created(a), created(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        by_age.then_with(|| a.name.cmp(&b.name))
    }

    /// The ClusterPolicy the operator acts on: the first in [`Self::activation_order`] not being deleted.
    pub fn active<'a>(policies: impl IntoIterator<Item = &'a ClusterPolicy>) -> Option<&'a ClusterPolicy> {
        policies
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .min_by(|a, b| Self::activation_order(a, b))
    }
}

impl ClusterPolicySpec {
    /// MIG strategy as written (validation checks it is one of the accepted values).
    pub fn mig_strategy(&self) -> Option<&str> {
        self.mig
            .as_ref()
            .and_then(|mig| mig.strategy.as_deref())
            .filter(|s| !s.is_empty())
    }

    /// The MIG manager is deployed unless turned off.
    pub fn mig_manager_enabled(&self) -> bool {
        self.mig_manager.as_ref().is_none_or(MigManagerSpec::is_enabled)
    }

    /// Pod Security Admission labels are off unless turned on.
    pub fn psa_enabled(&self) -> bool {
        self.psa.as_ref().is_some_and(|psa| flag(psa.enabled, false))
    }

    /// GPUDirect Storage is off unless turned on.
    pub fn gds_enabled(&self) -> bool {
        self.gds.as_ref().is_some_and(DriverAddonSpec::is_enabled)
    }

    /// GDRCopy is off unless turned on.
    pub fn gdrcopy_enabled(&self) -> bool {
        self.gdrcopy.as_ref().is_some_and(DriverAddonSpec::is_enabled)
    }

    /// Sandbox (VM) workloads are off unless turned on.
    pub fn sandbox_enabled(&self) -> bool {
        self.sandbox_workloads
            .as_ref()
            .is_some_and(SandboxWorkloadsSpec::is_enabled)
    }

    /// The sandbox mode as written, `kubevirt` when absent.
    pub fn sandbox_mode(&self) -> &str {
        self.sandbox_workloads
            .as_ref()
            .and_then(|sandbox| sandbox.mode.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or(SandboxMode::KubeVirt.as_str())
    }

    /// The default workload as written, `container` when absent.
    pub fn default_workload(&self) -> &str {
        self.sandbox_workloads
            .as_ref()
            .and_then(|sandbox| sandbox.default_workload.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or(WorkloadConfig::Container.as_str())
    }

    /// The VFIO manager is off unless turned on.
    pub fn vfio_manager_enabled(&self) -> bool {
        self.vfio_manager
            .as_ref()
            .is_some_and(|spec| spec.component.enabled_or(false))
    }

    /// The KubeVirt sandbox device plugin is off unless turned on.
    pub fn sandbox_device_plugin_enabled(&self) -> bool {
        self.sandbox_device_plugin
            .as_ref()
            .is_some_and(|spec| spec.enabled_or(false))
    }

    /// The Kata sandbox device plugin is off unless turned on.
    pub fn kata_sandbox_device_plugin_enabled(&self) -> bool {
        self.kata_sandbox_device_plugin
            .as_ref()
            .is_some_and(|spec| spec.enabled_or(false))
    }

    /// The vGPU manager is off unless turned on.
    pub fn vgpu_manager_enabled(&self) -> bool {
        self.vgpu_manager
            .as_ref()
            .is_some_and(|spec| spec.component.enabled_or(false))
    }

    /// The vGPU device manager is off unless turned on.
    pub fn vgpu_device_manager_enabled(&self) -> bool {
        self.vgpu_device_manager
            .as_ref()
            .is_some_and(|spec| spec.component.enabled_or(false))
    }

    /// The deprecated Kata manager switch (the manager itself is never deployed).
    pub fn kata_manager_enabled(&self) -> bool {
        self.kata_manager
            .as_ref()
            .is_some_and(|spec| spec.component.enabled_or(false))
    }

    /// The CC manager is off unless turned on.
    pub fn cc_manager_enabled(&self) -> bool {
        self.cc_manager
            .as_ref()
            .is_some_and(|spec| spec.component.enabled_or(false))
    }

    /// CDI is on unless turned off, also when the `cdi` section is absent.
    pub fn cdi_enabled(&self) -> bool {
        self.cdi.as_ref().is_none_or(CdiSpec::is_enabled)
    }

    /// The NRI plugin is off unless turned on.
    pub fn nri_plugin_enabled(&self) -> bool {
        self.cdi.as_ref().is_some_and(CdiSpec::is_nri_plugin_enabled)
    }

    /// Host paths with defaults for the absent ones.
    pub fn host_paths(&self) -> HostPathsSpec {
        self.host_paths.clone().unwrap_or_default()
    }

    /// The kernel module type as written, `auto` when absent.
    pub fn kernel_module_type(&self) -> &str {
        self.driver
            .kernel_module_type
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(KernelModuleType::Auto.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> ClusterPolicySpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    /// One row per switch: (section, enabled when the field is absent, the accessor).
    type Row = (&'static str, bool, fn(&ClusterPolicySpec) -> bool);

    const SWITCHES: &[Row] = &[
        ("driver", true, |s| s.driver.is_enabled()),
        ("toolkit", true, |s| s.toolkit.is_enabled()),
        ("devicePlugin", true, |s| s.device_plugin.is_enabled()),
        ("dcgmExporter", true, |s| s.dcgm_exporter.is_enabled()),
        ("dcgm", true, |s| s.dcgm.is_enabled()),
        ("gfd", true, |s| s.gpu_feature_discovery.is_enabled()),
        ("migManager", true, ClusterPolicySpec::mig_manager_enabled),
        ("nodeStatusExporter", false, |s| {
            s.node_status_exporter.is_enabled()
        }),
        ("psa", false, ClusterPolicySpec::psa_enabled),
        ("gds", false, ClusterPolicySpec::gds_enabled),
        ("gdrcopy", false, ClusterPolicySpec::gdrcopy_enabled),
        ("sandboxWorkloads", false, ClusterPolicySpec::sandbox_enabled),
        ("vfioManager", false, ClusterPolicySpec::vfio_manager_enabled),
        (
            "sandboxDevicePlugin",
            false,
            ClusterPolicySpec::sandbox_device_plugin_enabled,
        ),
        (
            "kataSandboxDevicePlugin",
            false,
            ClusterPolicySpec::kata_sandbox_device_plugin_enabled,
        ),
        ("vgpuManager", false, ClusterPolicySpec::vgpu_manager_enabled),
        (
            "vgpuDeviceManager",
            false,
            ClusterPolicySpec::vgpu_device_manager_enabled,
        ),
        ("kataManager", false, ClusterPolicySpec::kata_manager_enabled),
        ("ccManager", false, ClusterPolicySpec::cc_manager_enabled),
        ("cdi", true, ClusterPolicySpec::cdi_enabled),
    ];

    #[test]
    fn absent_enabled_uses_nvidias_default_per_component() {
        for (section, default, enabled) in SWITCHES {
            assert_eq!(
                enabled(&spec("{}")),
                *default,
                "{section} with the section absent"
            );
            assert_eq!(
                enabled(&spec(&format!("{section}: {{}}"))),
                *default,
                "{section} with `enabled` absent"
            );
            assert!(
                enabled(&spec(&format!("{section}: {{enabled: true}}"))),
                "{section}: enabled: true"
            );
            assert!(
                !enabled(&spec(&format!("{section}: {{enabled: false}}"))),
                "{section}: enabled: false"
            );
        }
    }

    #[test]
    fn flags_off_unless_set() {
        let empty = spec("{}");
        assert!(!empty.nri_plugin_enabled());
        assert!(!empty.driver.use_nvidia_driver_crd());
        assert!(!empty.driver.use_precompiled());
        assert!(!empty.driver.is_auto_upgrade());
        assert!(!empty.driver.is_vgpu_licensing_enabled());
        assert!(spec("cdi: {nriPluginEnabled: true}").nri_plugin_enabled());
        assert!(
            spec("driver: {licensingConfig: {secretName: lic}}")
                .driver
                .is_vgpu_licensing_enabled()
        );
        assert!(
            !spec("driver: {licensingConfig: {secretName: ''}}")
                .driver
                .is_vgpu_licensing_enabled()
        );
        assert!(!LicensingConfigSpec::default().is_nls_enabled());
    }

    #[test]
    fn upgrade_policy_defaults_match_the_crd_markers() {
        assert!(!spec("driver: {upgradePolicy: {}}").driver.is_auto_upgrade());
        assert!(
            spec("driver: {upgradePolicy: {autoUpgrade: true}}")
                .driver
                .is_auto_upgrade()
        );
        let effective = ClusterPolicyUpgradePolicy::default().effective();
        assert!(!effective.auto_upgrade);
        assert_eq!(effective.max_parallel_upgrades, 1);
        assert_eq!(
            effective.max_unavailable,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("25%".into())
        );
        assert_eq!(effective.pod_deletion_timeout_seconds, 300);
        assert_eq!(effective.drain_timeout_seconds, 300);
        assert_eq!(effective.wait_for_completion_timeout_seconds, 0);
        assert!(!effective.drain_enabled && !effective.drain_force && !effective.pod_deletion_force);
    }

    #[test]
    fn path_and_name_defaults_apply_when_absent_or_empty() {
        let empty = spec("{}");
        assert_eq!(empty.operator.runtime_class(), "nvidia");
        assert_eq!(
            spec("operator: {runtimeClass: ''}").operator.runtime_class(),
            "nvidia"
        );
        assert_eq!(
            spec("operator: {runtimeClass: nv}").operator.runtime_class(),
            "nv"
        );
        assert_eq!(empty.toolkit.install_dir(), "/usr/local/nvidia");
        assert_eq!(empty.device_plugin.mps_root(), "/run/nvidia/mps");
        assert_eq!(empty.host_paths().root_fs(), "/");
        assert_eq!(empty.host_paths().driver_install_dir(), "/run/nvidia/driver");
        assert_eq!(empty.host_paths().kubelet_root_dir(), "/var/lib/kubelet");
        assert_eq!(empty.kernel_module_type(), "auto");
        assert_eq!(empty.sandbox_mode(), "kubevirt");
        assert_eq!(empty.default_workload(), "container");
        assert!(empty.operator.use_ocp_driver_toolkit());
    }

    #[test]
    fn mig_default_layout_follows_config_default_as_nvidia_reads_it() {
        let manager = |yaml: &str| spec(yaml).mig_manager.unwrap_or_default();
        assert_eq!(manager("{}").default_layout(), None);
        assert_eq!(
            manager("migManager: {config: {name: custom}}").default_layout(),
            None,
            "no default given (the API server's CRD default fills it in where config is given)"
        );
        assert_eq!(
            manager("migManager: {config: {default: all-disabled}}").default_layout(),
            Some("all-disabled")
        );
        assert_eq!(
            manager("migManager: {config: {default: ''}}").default_layout(),
            None
        );
    }

    #[test]
    fn json_names_are_nvidias() {
        let spec = spec(
            "operator: {use_ocp_driver_toolkit: false}\n\
             driver: {useNvidiaDriverCRD: true, repository: r, image: i, version: v, hostNetwork: true}\n\
             gfd: {enabled: false}\n\
             dcgmExporter: {hostPID: true, enablePodUID: true}\n\
             validator: {vfioPCI: {env: [{name: A, value: b}]}}\n\
             hostPaths: {rootFS: /host}\n",
        );
        assert!(!spec.operator.use_ocp_driver_toolkit());
        assert!(spec.driver.use_nvidia_driver_crd());
        assert_eq!(spec.driver.image.image.as_deref(), Some("i"));
        assert_eq!(spec.driver.container.host_network, Some(true));
        assert!(!spec.gpu_feature_discovery.is_enabled());
        assert!(spec.dcgm_exporter.is_host_pid() && spec.dcgm_exporter.needs_pod_metadata());
        assert_eq!(
            spec.validator.unwrap().vfio_pci.unwrap().env.unwrap()[0],
            EnvVar::new("A", "b")
        );
        assert_eq!(spec.host_paths.unwrap().root_fs(), "/host");
    }

    fn policy(name: &str, created: Option<&str>, deleting: bool) -> ClusterPolicy {
        let mut policy = ClusterPolicy::new(name, ClusterPolicySpec::default());
        let time = |t: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap());
        policy.metadata.creation_timestamp = created.map(time);
        policy.metadata.deletion_timestamp = deleting.then(|| time("2026-11-30T00:00:00Z"));
        policy
    }

    #[test]
    fn the_oldest_live_policy_is_active_and_names_break_ties() {
        let policies = [
            policy("hand-written", None, false),
            policy("newer", Some("2026-11-02T00:00:00Z"), false),
            policy("b-first", Some("2026-11-01T00:00:00Z"), false),
            policy("a-first", Some("2026-11-01T00:00:00Z"), false),
            policy("oldest-but-deleting", Some("2026-10-01T00:00:00Z"), true),
        ];
        let active = ClusterPolicy::active(&policies).unwrap();
        assert_eq!(active.metadata.name.as_deref(), Some("a-first"));

        let mut order: Vec<&ClusterPolicy> = policies.iter().collect();
        order.sort_by(|a, b| ClusterPolicy::activation_order(a, b));
        let names: Vec<&str> = order
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "oldest-but-deleting",
                "a-first",
                "b-first",
                "newer",
                "hand-written"
            ]
        );
        assert!(ClusterPolicy::active(&policies[4..]).is_none());
    }
}
