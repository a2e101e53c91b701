//! The software and hardware state of one simulated node's host, which operand pods change as they run:
//! the driver (preinstalled or loaded by the driver container), the container runtime wired for NVIDIA by
//! the toolkit, the CDI spec, the files under `/run/nvidia/validations`, the GPUs' MIG layout and health.
//! From it follow the resources the device plugin advertises and the labels feature discovery writes.

use std::collections::{BTreeMap, BTreeSet};

use gpuop_api::catalogue::status_file;
use gpuop_api::labels;

use crate::hardware::{GpuModel, mig_resource};
use crate::sharing::{Sharing, Strategy, unshared_resource_labels};

/// One node's host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// GPU model, `None` on CPU-only nodes.
    pub model: Option<GpuModel>,
    /// Number of GPUs.
    pub gpu_count: u32,
    /// Version of the driver installed on the host, if any.
    pub preinstalled_driver: Option<String>,
    /// Version of the driver a driver container loaded, if any.
    pub loaded_driver: Option<String>,
    /// The driver pod (uid) that loaded it: a different one taking over is a reload.
    pub driver_pod: Option<String>,
    /// Whether the toolkit configured the container runtime for NVIDIA GPUs.
    pub runtime_wired: bool,
    /// Whether a CDI spec for the GPUs exists.
    pub cdi_spec: bool,
    /// Files present under `/run/nvidia/validations`.
    pub validations: BTreeSet<String>,
    /// MIG instances per GPU (profile → count) when MIG is enabled; empty means MIG disabled.
    pub mig_layout: BTreeMap<String, u32>,
    /// Name of the MIG configuration last applied.
    pub mig_config: Option<String>,
    /// GPU indices an XID error marked unhealthy.
    pub unhealthy: BTreeSet<u32>,
    /// Whether a device plugin has registered with the kubelet since the node started: until then the
    /// node shows no `nvidia.com/*` resources at all; after a plugin goes, the kubelet keeps them at 0.
    pub plugin_registered: bool,
}

/// How the running device plugin advertises GPUs, and feature discovery labels them (both read the same
/// configuration file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginSettings {
    /// `none`, `single` or `mixed`.
    pub mig_strategy: String,
    /// Which resources are shared, how many times and under which name.
    pub sharing: Sharing,
}

impl Default for PluginSettings {
    fn default() -> Self {
        Self {
            mig_strategy: "none".into(),
            sharing: Sharing::default(),
        }
    }
}

impl Host {
    /// A host with `count` GPUs of `model` (or none) and possibly a preinstalled driver.
    pub fn new(model: Option<GpuModel>, count: u32, preinstalled_driver: Option<String>) -> Self {
        Self {
            model,
            gpu_count: if model.is_some() { count } else { 0 },
            preinstalled_driver,
            loaded_driver: None,
            driver_pod: None,
            runtime_wired: false,
            cdi_spec: false,
            validations: BTreeSet::new(),
            mig_layout: BTreeMap::new(),
            mig_config: None,
            unhealthy: BTreeSet::new(),
            plugin_registered: false,
        }
    }

    /// The driver in use: the host's own or the one a container loaded.
    pub fn driver_version(&self) -> Option<&str> {
        self.preinstalled_driver
            .as_deref()
            .or(self.loaded_driver.as_deref())
    }

    /// Whether a status file exists.
    pub fn has_file(&self, name: &str) -> bool {
        self.validations.contains(name)
    }

    /// Whether the validator's check for a component would pass now.
    pub fn validation_passes(&self, component: &str, allocatable_gpus: u64) -> bool {
        match component {
            "driver" => {
                self.preinstalled_driver.is_some() || self.has_file(status_file::DRIVER_CONTAINER_READY)
            }
            "toolkit" => self.driver_version().is_some() && self.runtime_wired,
            "cuda" => self.driver_version().is_some() && self.runtime_wired && self.healthy_gpus() > 0,
            "plugin" => allocatable_gpus > 0,
            _ => true,
        }
    }

    /// GPUs without an XID error.
    pub fn healthy_gpus(&self) -> u32 {
        (0..self.gpu_count)
            .filter(|i| !self.unhealthy.contains(i))
            .count() as u32
    }

    /// Extended resources the device plugin makes allocatable: its healthy devices (all zero when none
    /// runs any more, none before one registered).
    pub fn advertised(&self, plugin: Option<&PluginSettings>) -> BTreeMap<String, u64> {
        self.resources(plugin, u64::from(self.healthy_gpus()))
    }

    /// Extended resources in the node's capacity: the kubelet counts every device the plugin registered,
    /// healthy or not, so an XID lowers allocatable and leaves capacity as it was.
    pub fn capacity(&self, plugin: Option<&PluginSettings>) -> BTreeMap<String, u64> {
        self.resources(plugin, u64::from(self.gpu_count))
    }

    fn resources(&self, plugin: Option<&PluginSettings>, healthy: u64) -> BTreeMap<String, u64> {
        let mut resources = BTreeMap::new();
        let Some(model) = self.model else { return resources };
        let Some(plugin) = plugin else {
            if !self.plugin_registered {
                return resources;
            }
            resources.insert(labels::RESOURCE_GPU.to_owned(), 0);
            for profile in model.mig_profiles() {
                resources.insert(mig_resource(profile.name), 0);
            }
            return resources;
        };
        // The devices per resource name, as the plugin groups them before sharing.
        let mut devices = BTreeMap::new();
        let mig_on = !self.mig_layout.is_empty();
        match (plugin.mig_strategy.as_str(), mig_on) {
            ("single", true) => {
                let per_gpu: u64 = self.mig_layout.values().map(|c| u64::from(*c)).sum();
                devices.insert(labels::RESOURCE_GPU.to_owned(), healthy * per_gpu);
            }
            ("mixed", true) => {
                devices.insert(labels::RESOURCE_GPU.to_owned(), 0);
                for profile in model.mig_profiles() {
                    let count = u64::from(self.mig_layout.get(profile.name).copied().unwrap_or(0));
                    devices.insert(mig_resource(profile.name), healthy * count);
                }
            }
            _ => {
                devices.insert(labels::RESOURCE_GPU.to_owned(), healthy);
            }
        }
        plugin.sharing.advertise(&devices)
    }

    /// The labels feature discovery writes for this host (none without GPUs or without a driver).
    pub fn feature_labels(&self, plugin: &PluginSettings) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let (Some(model), Some(driver)) = (self.model, self.driver_version()) else {
            return out;
        };
        let mut put = |key: &str, value: String| {
            out.insert(key.to_owned(), value);
        };
        let gpu = labels::RESOURCE_GPU;
        let product = model.product();
        let mig_on = !self.mig_layout.is_empty();
        let gpus = u64::from(self.gpu_count);
        // GPUs with MIG enabled are labelled "without sharing" (replicas 0): their devices are the MIG
        // instances, whatever the configuration says of nvidia.com/gpu.
        let whole = if mig_on {
            unshared_resource_labels(gpu, gpus, &[product])
        } else {
            plugin.sharing.resource_labels(gpu, gpus, &[product])
        };
        for (key, value) in whole {
            put(&key, value);
        }
        put(labels::GPU_MEMORY, model.memory_mib().to_string());
        put(labels::GPU_FAMILY, model.family().to_owned());
        let (major, minor) = model.compute_capability();
        put(labels::GPU_COMPUTE_MAJOR, major.to_string());
        put(labels::GPU_COMPUTE_MINOR, minor.to_string());
        put(labels::MIG_CAPABLE, model.mig_capable().to_string());
        put(
            labels::MPS_CAPABLE,
            (plugin.sharing.strategy == Strategy::Mps).to_string(),
        );
        put(labels::GPU_MACHINE, "gpu-sim".to_owned());
        let mut parts = driver.split('.');
        put(
            labels::CUDA_DRIVER_MAJOR,
            parts.next().unwrap_or_default().to_owned(),
        );
        put(labels::CUDA_DRIVER_VERSION_FULL, driver.to_owned());
        if model.mig_capable() && plugin.mig_strategy != "none" {
            put(labels::MIG_STRATEGY, plugin.mig_strategy.clone());
        }
        let instances: Vec<(&String, u64)> = self
            .mig_layout
            .iter()
            .filter(|(_, per_gpu)| **per_gpu > 0)
            .map(|(profile, per_gpu)| (profile, u64::from(*per_gpu) * gpus))
            .collect();
        let profile_memory = |profile: &str| {
            model
                .mig_profiles()
                .iter()
                .find(|p| p.name == profile)
                .map_or(0, |p| p.memory_mib)
        };
        match (plugin.mig_strategy.as_str(), mig_on, instances.as_slice()) {
            // Under the single strategy the MIG instances are nvidia.com/gpu, so they take over its labels;
            // a node with no instances or several profiles is labelled invalid.
            ("single", true, [(profile, count)]) => {
                let name = profile.replace('+', ".");
                for (key, value) in plugin
                    .sharing
                    .resource_labels(gpu, *count, &[product, "MIG", &name])
                {
                    put(&key, value);
                }
                put(labels::GPU_MEMORY, profile_memory(profile).to_string());
            }
            ("single", true, _) => {
                put(labels::GPU_PRODUCT, format!("{product}-MIG-INVALID"));
                put(labels::GPU_COUNT, "0".to_owned());
                put(labels::GPU_REPLICAS, "0".to_owned());
                put(labels::GPU_SHARING_STRATEGY, String::new());
                put(labels::GPU_MEMORY, "0".to_owned());
            }
            ("mixed", true, instances) => {
                for (profile, count) in instances {
                    let resource = mig_resource(profile);
                    let name = profile.replace('+', ".");
                    for (key, value) in
                        plugin
                            .sharing
                            .resource_labels(&resource, *count, &[product, "MIG", &name])
                    {
                        put(&key, value);
                    }
                    put(&format!("{resource}.memory"), profile_memory(profile).to_string());
                }
            }
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::Shared;

    fn a100(count: u32) -> Host {
        Host::new(Some(GpuModel::A100_80GB), count, None)
    }

    /// Time-slicing of these resources, renamed to `<resource>.shared` when `rename`.
    fn time_sliced(strategy: &str, resources: &[(&str, u32)], rename: bool) -> PluginSettings {
        PluginSettings {
            mig_strategy: strategy.into(),
            sharing: Sharing {
                strategy: Strategy::TimeSlicing,
                resources: resources
                    .iter()
                    .map(|(name, replicas)| {
                        (
                            (*name).to_owned(),
                            Shared {
                                replicas: *replicas,
                                renamed: rename.then(|| format!("{name}.shared")),
                            },
                        )
                    })
                    .collect(),
                fail_requests_greater_than_one: false,
            },
        }
    }

    #[test]
    fn the_plugin_advertises_whole_gpus_times_replicas() {
        let mut host = a100(8);
        assert!(
            host.advertised(None).is_empty(),
            "nothing before a device plugin registers"
        );
        host.plugin_registered = true;
        assert_eq!(
            host.advertised(None)["nvidia.com/gpu"],
            0,
            "zero once the plugin has gone"
        );
        let plain = PluginSettings::default();
        assert_eq!(host.advertised(Some(&plain))["nvidia.com/gpu"], 8);
        let shared = time_sliced("none", &[("nvidia.com/gpu", 4)], false);
        assert_eq!(host.advertised(Some(&shared))["nvidia.com/gpu"], 32);
        let renamed = time_sliced("none", &[("nvidia.com/gpu", 4)], true);
        assert_eq!(
            host.advertised(Some(&renamed)),
            BTreeMap::from([("nvidia.com/gpu.shared".to_owned(), 32)])
        );
        let mut sick = a100(8);
        sick.unhealthy.insert(3);
        assert_eq!(
            sick.advertised(Some(&plain))["nvidia.com/gpu"],
            7,
            "an XID takes a GPU away"
        );
        assert_eq!(
            sick.capacity(Some(&plain))["nvidia.com/gpu"],
            8,
            "but not from the capacity"
        );
        assert!(Host::new(None, 0, None).advertised(Some(&plain)).is_empty());
    }

    #[test]
    fn mig_strategies_advertise_as_the_device_plugin_does() {
        let mut host = a100(2);
        host.mig_layout = [
            ("1g.10gb".to_owned(), 2),
            ("2g.20gb".to_owned(), 1),
            ("3g.40gb".to_owned(), 1),
        ]
        .into();
        let single = PluginSettings {
            mig_strategy: "single".into(),
            ..PluginSettings::default()
        };
        assert_eq!(host.advertised(Some(&single))["nvidia.com/gpu"], 8);
        let mixed = PluginSettings {
            mig_strategy: "mixed".into(),
            ..PluginSettings::default()
        };
        let advertised = host.advertised(Some(&mixed));
        assert_eq!(advertised["nvidia.com/mig-1g.10gb"], 4);
        assert_eq!(advertised["nvidia.com/mig-3g.40gb"], 2);
        assert_eq!(advertised["nvidia.com/mig-7g.80gb"], 0);
        assert_eq!(advertised["nvidia.com/gpu"], 0);
        let none = PluginSettings::default();
        assert_eq!(
            host.advertised(Some(&none))["nvidia.com/gpu"],
            2,
            "strategy none ignores MIG"
        );
    }

    #[test]
    fn each_resource_is_shared_by_its_own_replicas() {
        // deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml on 8 A100s with all-1g.10gb.
        let mut host = a100(8);
        host.mig_layout = [("1g.10gb".to_owned(), 7)].into();
        let sample = time_sliced(
            "mixed",
            &[
                ("nvidia.com/gpu", 4),
                ("nvidia.com/mig-1g.10gb", 2),
                ("nvidia.com/mig-2g.20gb", 4),
            ],
            false,
        );
        let advertised = host.advertised(Some(&sample));
        assert_eq!(
            advertised["nvidia.com/mig-1g.10gb"], 112,
            "56 instances × 2, not × 4"
        );
        assert_eq!(advertised["nvidia.com/mig-2g.20gb"], 0);
        assert_eq!(advertised["nvidia.com/gpu"], 0);
        host.loaded_driver = Some("595.91.07".into());
        let labels = host.feature_labels(&sample);
        assert_eq!(labels["nvidia.com/mig-1g.10gb.count"], "56");
        assert_eq!(labels["nvidia.com/mig-1g.10gb.replicas"], "2");
        assert_eq!(labels["nvidia.com/mig-1g.10gb.sharing-strategy"], "time-slicing");
        assert_eq!(
            labels["nvidia.com/mig-1g.10gb.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
        );
        assert_eq!(labels["nvidia.com/mig-1g.10gb.memory"], "9856");
        assert!(
            !labels.contains_key("nvidia.com/mig-2g.20gb.count"),
            "no labels for a profile the GPUs do not have"
        );
        assert_eq!(
            labels["nvidia.com/gpu.replicas"], "0",
            "MIG-enabled GPUs are labelled without sharing"
        );
        assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
        assert_eq!(labels["nvidia.com/gpu.sharing-strategy"], "none");

        // The same configuration on whole GPUs: nvidia.com/gpu × 4.
        let mut whole = Host::new(Some(GpuModel::H100_80GB), 8, Some("580.82.07".into()));
        whole.plugin_registered = true;
        assert_eq!(whole.advertised(Some(&sample))["nvidia.com/gpu"], 32);
        let labels = whole.feature_labels(&sample);
        assert_eq!(labels["nvidia.com/gpu.replicas"], "4");
        assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-SHARED");
        assert_eq!(labels["nvidia.com/gpu.sharing-strategy"], "time-slicing");
    }

    #[test]
    fn the_single_strategy_labels_the_mig_instances_as_the_gpus() {
        let mut host = a100(8);
        host.loaded_driver = Some("595.91.07".into());
        host.mig_layout = [("1g.10gb".to_owned(), 7)].into();
        let single = time_sliced("single", &[("nvidia.com/gpu", 2)], false);
        assert_eq!(host.advertised(Some(&single))["nvidia.com/gpu"], 112);
        let labels = host.feature_labels(&single);
        assert_eq!(
            labels["nvidia.com/gpu.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"
        );
        assert_eq!(labels["nvidia.com/gpu.count"], "56");
        assert_eq!(labels["nvidia.com/gpu.replicas"], "2");
        assert_eq!(labels["nvidia.com/gpu.memory"], "9856");
        host.mig_layout = [("1g.10gb".to_owned(), 2), ("3g.40gb".to_owned(), 1)].into();
        let labels = host.feature_labels(&single);
        assert_eq!(
            labels["nvidia.com/gpu.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
        );
        assert_eq!(labels["nvidia.com/gpu.count"], "0");
    }

    #[test]
    fn validations_follow_the_chain() {
        let mut host = a100(1);
        assert!(!host.validation_passes("driver", 0));
        host.validations.insert(".driver-ctr-ready".into());
        host.loaded_driver = Some("595.91.07".into());
        assert!(host.validation_passes("driver", 0));
        assert!(
            !host.validation_passes("toolkit", 0),
            "the runtime is not wired yet"
        );
        host.runtime_wired = true;
        assert!(host.validation_passes("toolkit", 0) && host.validation_passes("cuda", 0));
        assert!(!host.validation_passes("plugin", 0));
        assert!(host.validation_passes("plugin", 8));
        let preinstalled = Host::new(Some(GpuModel::L4), 1, Some("580.82.07".into()));
        assert!(preinstalled.validation_passes("driver", 0));
    }

    #[test]
    fn feature_discovery_labels_need_a_driver() {
        let mut host = a100(8);
        assert!(host.feature_labels(&PluginSettings::default()).is_empty());
        host.loaded_driver = Some("595.91.07".into());
        let shared = time_sliced("single", &[("nvidia.com/gpu", 2)], false);
        let labels = host.feature_labels(&shared);
        assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB-SHARED");
        assert_eq!(labels["nvidia.com/gpu.count"], "8");
        assert_eq!(labels["nvidia.com/gpu.memory"], "81920");
        assert_eq!(labels["nvidia.com/gpu.family"], "ampere");
        assert_eq!(labels["nvidia.com/gpu.replicas"], "2");
        assert_eq!(labels["nvidia.com/gpu.sharing-strategy"], "time-slicing");
        assert_eq!(labels["nvidia.com/mig.capable"], "true");
        assert_eq!(labels["nvidia.com/mig.strategy"], "single");
        assert_eq!(labels["nvidia.com/cuda.driver.major"], "595");
        let renamed = host.feature_labels(&time_sliced("none", &[("nvidia.com/gpu", 2)], true));
        assert_eq!(
            renamed["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB",
            "a resource shared as nvidia.com/gpu.shared has no -SHARED"
        );
        assert_eq!(renamed["nvidia.com/gpu.replicas"], "2");
    }
}
