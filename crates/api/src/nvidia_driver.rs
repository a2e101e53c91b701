//! `NVIDIADriver` `nvidia.com/v1alpha1`: one driver configuration per node pool, used instead of
//! `ClusterPolicy.spec.driver` when `driver.useNvidiaDriverCRD` is true.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeAffinity, PodSecurityContext, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::choice::{DriverType, KernelModuleType};
use crate::component::{ContainerSpec, NameRef, flag};
use crate::driver::{
    ContainerProbeSpec, DriverAddonSpec, DriverManagerSpec, GpuDirectRdmaSpec, NvidiaDriverUpgradePolicy,
};
use crate::status::PolicyStatus;

/// Image an NVIDIADriver uses when none is given.
pub const DEFAULT_DRIVER_IMAGE: &str = "nvcr.io/nvidia/driver";
/// PriorityClass of driver pods when none is given.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-node-critical";

/// A driver for the GPU nodes its node selector picks (or for all others, when it is the default).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "NVIDIADriver",
    plural = "nvidiadrivers",
    singular = "nvidiadriver",
    shortname = "nvd",
    shortname = "nvdriver",
    shortname = "nvdrivers",
    status = "PolicyStatus",
    derive = "PartialEq",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Default", type_ = "boolean", json_path = ".spec.default"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    doc = "NVIDIADriver installs one NVIDIA driver configuration on the GPU nodes it selects."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend(
    "required" = ["default", "driverType", "image"],
    "x-kubernetes-validations" = [{
        "rule": "has(self.default) && self.default ? !has(self.nodeSelector) || size(self.nodeSelector) == 0 : true",
        "message": "default NVIDIADriver must not use nodeSelector",
        "fieldPath": ".nodeSelector"
    }]
))]
pub struct NVIDIADriverSpec {
    /// The fallback driver for GPU nodes no other NVIDIADriver selects. It must not have a node selector.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub default: bool,
    /// Kind of driver. Immutable.
    #[serde(default = "default_driver_type")]
    #[schemars(
        schema_with = "DriverType::schema",
        extend(
            "default" = "gpu",
            "x-kubernetes-validations" = [{
                "rule": "self == oldSelf",
                "message": "driverType is an immutable field. Please create a new NvidiaDriver resource instead when you want to change this setting."
            }]
        )
    )]
    pub driver_type: String,
    /// Use driver images with modules precompiled for the node's kernel. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "usePrecompiled is an immutable field. Please create a new NvidiaDriver resource instead when you want to change this setting."
    }]))]
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
    /// GPUDirect Storage (nvidia-fs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds: Option<DriverAddonSpec>,
    /// GDRCopy (gdrdrv).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdrcopy: Option<DriverAddonSpec>,
    /// Registry and path of the driver image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Driver image name, or a full reference when repository and version are empty.
    #[serde(default = "default_driver_image")]
    #[schemars(extend("default" = "nvcr.io/nvidia/driver"))]
    pub image: String,
    /// Driver version (or branch, for precompiled drivers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `Always`, `Never` or `IfNotPresent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Secrets used to pull the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<String>>,
    /// The driver manager init container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager: Option<DriverManagerSpec>,
    /// The driver container's resources, args, env and host network.
    #[serde(flatten)]
    pub container: ContainerSpec,
    /// ConfigMap with package repository configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_config: Option<NameRef>,
    /// ConfigMap with custom certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config: Option<NameRef>,
    /// vGPU guest licensing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub licensing_config: Option<DriverLicensingConfig>,
    /// ConfigMap with the vGPU topology daemon configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_topology_config: Option<NameRef>,
    /// ConfigMap with kernel module parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_module_config: Option<NameRef>,
    /// Secret whose keys become environment variables of the driver container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_env: Option<String>,
    /// Automatic node-by-node driver upgrades.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<NvidiaDriverUpgradePolicy>,
    /// Nodes this driver is for (besides `nvidia.com/gpu.present=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Node affinity of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,
    /// Labels of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Tolerations of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// PriorityClass of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Pod security context of the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
}

fn default_driver_type() -> String {
    DriverType::Gpu.as_str().to_owned()
}

fn default_driver_image() -> String {
    DEFAULT_DRIVER_IMAGE.to_owned()
}

/// vGPU guest licensing of an NVIDIADriver.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverLicensingConfig {
    /// Secret with the licensing configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Deprecated: ConfigMap with the licensing configuration; use `secretName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// License through NVIDIA License System.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nls_enabled: Option<bool>,
}

impl DriverLicensingConfig {
    /// In an NVIDIADriver, NVIDIA License System is on unless turned off (the opposite of ClusterPolicy).
    pub fn is_nls_enabled(&self) -> bool {
        flag(self.nls_enabled, true)
    }
}

impl NVIDIADriverSpec {
    /// Precompiled driver images are used only when asked.
    pub fn use_precompiled(&self) -> bool {
        flag(self.use_precompiled, false)
    }

    /// Automatic upgrades are on unless an upgrade policy turns them off.
    pub fn is_auto_upgrade(&self) -> bool {
        self.upgrade_policy
            .as_ref()
            .is_none_or(NvidiaDriverUpgradePolicy::is_auto_upgrade)
    }

    /// The PriorityClass, `system-node-critical` when absent.
    pub fn priority_class_name(&self) -> &str {
        self.priority_class_name
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_PRIORITY_CLASS)
    }

    /// The node selector: the given one, or `nvidia.com/gpu.present=true` (all GPU nodes) when absent.
    pub fn effective_node_selector(&self) -> BTreeMap<String, String> {
        match &self.node_selector {
            Some(selector) if !selector.is_empty() => selector.clone(),
            _ => BTreeMap::from([(crate::labels::GPU_PRESENT.to_owned(), "true".to_owned())]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> NVIDIADriverSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn defaults_differ_from_cluster_policy_where_nvidia_s_do() {
        let empty = spec("{}");
        assert!(!empty.default);
        assert_eq!(empty.driver_type, "gpu");
        assert_eq!(empty.image, "nvcr.io/nvidia/driver");
        assert!(
            empty.is_auto_upgrade(),
            "absent upgrade policy means auto upgrade"
        );
        assert!(spec("upgradePolicy: {}").is_auto_upgrade());
        assert!(!spec("upgradePolicy: {autoUpgrade: false}").is_auto_upgrade());
        assert!(DriverLicensingConfig::default().is_nls_enabled());
        assert!(!empty.use_precompiled());
        assert_eq!(empty.priority_class_name(), "system-node-critical");
        let effective = NvidiaDriverUpgradePolicy::default().effective();
        assert!(effective.auto_upgrade);
        assert_eq!(effective.max_parallel_upgrades, 1);
    }

    #[test]
    fn node_selector_defaults_to_all_gpu_nodes() {
        assert_eq!(
            spec("{}").effective_node_selector(),
            BTreeMap::from([("nvidia.com/gpu.present".to_owned(), "true".to_owned())])
        );
        assert_eq!(
            spec("nodeSelector: {pool: a}").effective_node_selector(),
            BTreeMap::from([("pool".to_owned(), "a".to_owned())])
        );
    }
}
