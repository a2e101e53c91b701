//! Driver settings that `ClusterPolicy.spec.driver` and `NVIDIADriver.spec` share: probes, the driver
//! manager init container, RDMA, GPUDirect Storage and GDRCopy, and the upgrade policy.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::component::{EnvVar, ImageSpec, flag};

/// Environment variable of the driver containers: a hash of every setting that needs a reinstall. Two
/// revisions with the same digest differ only in what a restart picks up.
pub const DRIVER_CONFIG_DIGEST: &str = "DRIVER_CONFIG_DIGEST";

/// Kernel module flavours NVIDIA's driver container can load.
pub const KERNEL_MODULE_TYPES: &[&str] = &["auto", "open", "proprietary"];

/// Timing of one of the driver container's probes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerProbeSpec {
    /// Seconds after the container starts before the probe runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Seconds after which one probe attempt times out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<i32>,
    /// Seconds between probe attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub period_seconds: Option<i32>,
    /// Consecutive successes after a failure before the probe counts as passing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub success_threshold: Option<i32>,
    /// Consecutive failures before the probe counts as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub failure_threshold: Option<i32>,
}

/// The `k8s-driver-manager` init container that prepares a node before a driver (re)install.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverManagerSpec {
    /// The driver manager's image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Environment of the driver manager (drain and eviction settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
}

/// GPUDirect RDMA.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuDirectRdmaSpec {
    /// Load `nvidia-peermem` with the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Use the MOFED drivers installed on the host instead of a MOFED container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_host_mofed: Option<bool>,
}

impl GpuDirectRdmaSpec {
    /// RDMA is off unless asked for.
    pub fn is_enabled(&self) -> bool {
        flag(self.enabled, false)
    }
}

/// An extra kernel-module container next to the driver (`gds` for nvidia-fs, `gdrcopy` for gdrdrv).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverAddonSpec {
    /// Run this container in the driver pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The container's image.
    #[serde(flatten)]
    pub image: ImageSpec,
    /// Extra arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
}

impl DriverAddonSpec {
    /// Add-ons are off unless asked for.
    pub fn is_enabled(&self) -> bool {
        flag(self.enabled, false)
    }
}

/// How workload pods that use GPUs are removed from a node before its driver is replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDeletionSpec {
    /// Delete pods that are not managed by a controller too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub force: Option<bool>,
    /// Seconds to wait for the pods to go; 0 waits forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 300), range(min = 0))]
    pub timeout_seconds: Option<i64>,
    /// Delete pods that use emptyDir volumes (their data is lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub delete_empty_dir: Option<bool>,
}

/// Waiting for jobs to finish on a node before its driver is replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitForCompletionSpec {
    /// Label selector of the pods to wait for; empty means do not wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// Seconds to wait before going on anyway; 0 waits forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0), range(min = 0))]
    pub timeout_seconds: Option<i64>,
}

/// Draining a node before its driver is replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Drain the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub enable: Option<bool>,
    /// Drain pods that are not managed by a controller too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub force: Option<bool>,
    /// Label selector of the pods to drain; empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// Seconds to wait for the drain; 0 waits forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 300), range(min = 0))]
    pub timeout_seconds: Option<i64>,
    /// Drain pods that use emptyDir volumes (their data is lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub delete_empty_dir: Option<bool>,
}

/// A count (`2`) or a percentage (`"25%"`), defaulting to `25%`.
fn count_or_percent_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Nodes with a driver that may be unavailable at once: a count or a percentage of the nodes, rounded up.",
        "default": "25%",
        "x-kubernetes-int-or-string": true,
        "anyOf": [{ "type": "integer", "minimum": 0 }, { "type": "string", "maxLength": 4 }],
        "x-kubernetes-validations": [{
            // No `type()`: client-side CEL (kube-cel) cannot evaluate it. A number equals its own string
            // form parsed back; a string never equals an int.
            "rule": "string(self).endsWith('%') ? string(self).matches('^([0-9]|[1-9][0-9]|100)%$') : (self == int(string(self)) && int(string(self)) >= 0)",
            "message": "must be a count like 2 or a percentage from 0% to 100% like \"25%\""
        }]
    })
}

/// How many nodes may be upgraded at once and how their workloads are moved away.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeRules {
    /// Nodes upgraded in parallel; 0 means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1), range(min = 0))]
    pub max_parallel_upgrades: Option<i32>,
    /// Nodes with a driver that may be unavailable at once: a count or a percentage of the nodes, rounded up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "count_or_percent_schema")]
    pub max_unavailable: Option<IntOrString>,
    /// Removing GPU pods before the upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_deletion: Option<PodDeletionSpec>,
    /// Waiting for jobs to finish before the upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_completion: Option<WaitForCompletionSpec>,
    /// Draining the node before the upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
}

/// `ClusterPolicy.spec.driver.upgradePolicy`: automatic upgrades are off unless asked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPolicyUpgradePolicy {
    /// Let the operator upgrade drivers node by node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub auto_upgrade: Option<bool>,
    /// Limits and workload handling.
    #[serde(flatten)]
    pub rules: UpgradeRules,
}

/// `NVIDIADriver.spec.upgradePolicy`: automatic upgrades are on unless turned off.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverUpgradePolicy {
    /// Let the operator upgrade drivers node by node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub auto_upgrade: Option<bool>,
    /// Limits and workload handling.
    #[serde(flatten)]
    pub rules: UpgradeRules,
}

/// An upgrade policy with every default applied.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveUpgradePolicy {
    /// Upgrades run automatically.
    pub auto_upgrade: bool,
    /// Nodes upgraded in parallel; 0 means no limit.
    pub max_parallel_upgrades: i32,
    /// Nodes that may be unavailable at once.
    pub max_unavailable: IntOrString,
    /// Delete pods not managed by a controller.
    pub pod_deletion_force: bool,
    /// Seconds to wait for GPU pods to go.
    pub pod_deletion_timeout_seconds: i64,
    /// Delete pods with emptyDir volumes.
    pub pod_deletion_delete_empty_dir: bool,
    /// Pods to wait for, if any.
    pub wait_for_completion_pod_selector: Option<String>,
    /// Seconds to wait for them; 0 waits forever.
    pub wait_for_completion_timeout_seconds: i64,
    /// Drain the node.
    pub drain_enabled: bool,
    /// Drain unmanaged pods too.
    pub drain_force: bool,
    /// Pods to drain, if not all.
    pub drain_pod_selector: Option<String>,
    /// Seconds to wait for the drain.
    pub drain_timeout_seconds: i64,
    /// Drain pods with emptyDir volumes.
    pub drain_delete_empty_dir: bool,
}

impl UpgradeRules {
    /// The rules with the defaults of NVIDIA's CRDs applied to every absent field.
    pub fn effective(&self, auto_upgrade: bool) -> EffectiveUpgradePolicy {
        let deletion = self.pod_deletion.clone().unwrap_or_default();
        let wait = self.wait_for_completion.clone().unwrap_or_default();
        let drain = self.drain.clone().unwrap_or_default();
        let selector = |s: Option<String>| s.filter(|s| !s.is_empty());
        EffectiveUpgradePolicy {
            auto_upgrade,
            max_parallel_upgrades: self.max_parallel_upgrades.unwrap_or(1),
            max_unavailable: self
                .max_unavailable
                .clone()
                .unwrap_or(IntOrString::String("25%".into())),
            pod_deletion_force: flag(deletion.force, false),
            pod_deletion_timeout_seconds: deletion.timeout_seconds.unwrap_or(300),
            pod_deletion_delete_empty_dir: flag(deletion.delete_empty_dir, false),
            wait_for_completion_pod_selector: selector(wait.pod_selector),
            wait_for_completion_timeout_seconds: wait.timeout_seconds.unwrap_or(0),
            drain_enabled: flag(drain.enable, false),
            drain_force: flag(drain.force, false),
            drain_pod_selector: selector(drain.pod_selector),
            drain_timeout_seconds: drain.timeout_seconds.unwrap_or(300),
            drain_delete_empty_dir: flag(drain.delete_empty_dir, false),
        }
    }
}

impl ClusterPolicyUpgradePolicy {
    /// Whether the operator upgrades drivers itself (absent means no, as in NVIDIA's operator).
    pub fn is_auto_upgrade(&self) -> bool {
        flag(self.auto_upgrade, false)
    }

    /// The policy with every default applied.
    pub fn effective(&self) -> EffectiveUpgradePolicy {
        self.rules.effective(self.is_auto_upgrade())
    }
}

impl NvidiaDriverUpgradePolicy {
    /// Whether the operator upgrades drivers itself (absent means yes, as in NVIDIA's operator).
    pub fn is_auto_upgrade(&self) -> bool {
        flag(self.auto_upgrade, true)
    }

    /// The policy with every default applied.
    pub fn effective(&self) -> EffectiveUpgradePolicy {
        self.rules.effective(self.is_auto_upgrade())
    }
}
