//! How simulated operands read their configuration, through the same contract as NVIDIA's images: the
//! device plugin's MIG strategy from `MIG_STRATEGY` and its sharing from the selected key of its config
//! ConfigMap; the MIG manager's layouts from its mig-parted ConfigMap; the driver's version from its image
//! tag. Pure functions over the pod spec, node labels and ConfigMap data.

use std::collections::BTreeMap;

use gpuop_api::labels::DEVICE_PLUGIN_CONFIG;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde::Deserialize;

use crate::hardware::GpuModel;
use crate::host::PluginSettings;
use crate::sharing::{Sharing, SharingConfig};

/// The value of an environment variable of a container, if set literally.
pub fn env<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container
        .env
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .and_then(|v| v.value.as_deref())
}

/// The driver version a driver image carries in its tag: `driver:595.91.07-ubuntu22.04` → `595.91.07`;
/// `unknown` for an image named by digest.
pub fn driver_version(image: &str) -> String {
    let tag = if image.contains('@') {
        ""
    } else {
        image.rsplit_once(':').map_or("", |(_, tag)| tag)
    };
    let version: String = tag
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    if version.is_empty() {
        "unknown".to_owned()
    } else {
        version.trim_end_matches('.').to_owned()
    }
}

/// Names of the ConfigMaps a pod mounts, by volume name.
pub fn config_map_volumes(spec: &PodSpec) -> BTreeMap<String, String> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|volume| Some((volume.name.clone(), volume.config_map.as_ref()?.name.clone())))
        .collect()
}

/// A device plugin configuration file (`version: v1`), the parts that change what is advertised.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PluginConfig {
    #[serde(default)]
    flags: PluginFlags,
    #[serde(default)]
    sharing: SharingConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PluginFlags {
    mig_strategy: Option<String>,
}

/// The device plugin's settings for a node: `MIG_STRATEGY` from the main container, sharing from the config
/// key the node selects (`nvidia.com/device-plugin.config`, else the config manager's `DEFAULT_CONFIG`).
/// A sharing section the real plugin refuses shares nothing here ([`Sharing::from_config`] says why).
///
/// `config_maps` holds the data of the ConfigMaps the pod mounts, by ConfigMap name.
pub fn plugin_settings(
    spec: &PodSpec,
    node_labels: &BTreeMap<String, String>,
    config_maps: &BTreeMap<String, BTreeMap<String, String>>,
) -> PluginSettings {
    let main = spec.containers.first();
    let mut settings = PluginSettings::default();
    let default_key = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find_map(|c| env(c, "DEFAULT_CONFIG"))
        .filter(|key| !key.is_empty());
    let key = node_labels
        .get(DEVICE_PLUGIN_CONFIG)
        .map(String::as_str)
        .filter(|k| !k.is_empty())
        .or(default_key);
    let config: PluginConfig = key
        .and_then(|key| config_maps.values().find_map(|data| data.get(key)))
        .and_then(|text| serde_saphyr::from_str(text).ok())
        .unwrap_or_default();
    let strategy = main
        .and_then(|c| env(c, "MIG_STRATEGY"))
        .map(str::to_owned)
        .or(config.flags.mig_strategy);
    if let Some(strategy) = strategy {
        settings.mig_strategy = strategy;
    }
    settings.sharing = Sharing::from_config(&config.sharing).unwrap_or_default();
    settings
}

/// A mig-parted configuration file.
#[derive(Debug, Deserialize)]
struct MigPartedConfig {
    #[serde(rename = "mig-configs")]
    mig_configs: BTreeMap<String, Vec<MigConfigEntry>>,
}

#[derive(Debug, Deserialize)]
struct MigConfigEntry {
    #[serde(rename = "device-filter", default)]
    device_filter: Option<DeviceFilter>,
    #[serde(rename = "mig-enabled")]
    mig_enabled: bool,
    #[serde(rename = "mig-devices", default)]
    mig_devices: BTreeMap<String, u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DeviceFilter {
    One(String),
    Many(Vec<String>),
}

impl DeviceFilter {
    fn matches(&self, device: &str) -> bool {
        match self {
            DeviceFilter::One(filter) => filter.eq_ignore_ascii_case(device),
            DeviceFilter::Many(filters) => filters.iter().any(|f| f.eq_ignore_ascii_case(device)),
        }
    }
}

/// The MIG instances per GPU a named layout gives this model (empty: MIG disabled), or why it cannot apply.
pub fn mig_layout(config_yaml: &str, name: &str, model: GpuModel) -> Result<BTreeMap<String, u32>, String> {
    let config: MigPartedConfig = serde_saphyr::from_str(config_yaml)
        .map_err(|error| format!("the MIG configuration does not parse: {error}"))?;
    let entries = config.mig_configs.get(name).ok_or_else(|| {
        format!(
            "MIG configuration {name:?} is not defined; defined: {}",
            names(&config)
        )
    })?;
    let entry = entries
        .iter()
        .find(|entry| {
            entry
                .device_filter
                .as_ref()
                .is_none_or(|filter| filter.matches(model.pci_device_id()))
        })
        .ok_or_else(|| {
            format!(
                "MIG configuration {name:?} has no entry for {} ({})",
                model,
                model.pci_device_id()
            )
        })?;
    if !entry.mig_enabled {
        return Ok(BTreeMap::new());
    }
    if !model.mig_capable() {
        return Err(format!("{model} does not support MIG"));
    }
    model.fits(&entry.mig_devices)?;
    Ok(entry.mig_devices.clone())
}

fn names(config: &MigPartedConfig) -> String {
    config.mig_configs.keys().cloned().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::Strategy;
    use k8s_openapi::api::core::v1::EnvVar;

    const MIG_CONFIG: &str = "version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - device-filter: [\"0x20B210DE\", \"0x233010DE\"]
      devices: all
      mig-enabled: true
      mig-devices:
        \"1g.10gb\": 7
  all-balanced:
    - device-filter: \"0x233010DE\"
      devices: all
      mig-enabled: true
      mig-devices: {\"1g.10gb\": 2, \"2g.20gb\": 1, \"3g.40gb\": 1}
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices: {\"3g.40gb\": 3}
";

    #[test]
    fn mig_layouts_come_from_the_config_for_the_gpu_model() {
        assert_eq!(
            mig_layout(MIG_CONFIG, "all-disabled", GpuModel::H100_80GB),
            Ok(BTreeMap::new())
        );
        assert_eq!(
            mig_layout(MIG_CONFIG, "all-1g.10gb", GpuModel::A100_80GB).unwrap()["1g.10gb"],
            7
        );
        assert_eq!(
            mig_layout(MIG_CONFIG, "all-balanced", GpuModel::H100_80GB)
                .unwrap()
                .len(),
            3
        );
        for (config, model, says) in [
            ("all-balanced", GpuModel::A100_80GB, "no entry for A100-80GB"),
            ("nope", GpuModel::A100_80GB, "defined: all-1g.10gb, all-balanced"),
            ("too-much", GpuModel::A100_80GB, "at most 2"),
            ("all-1g.10gb", GpuModel::L4, "no entry"),
        ] {
            let error = mig_layout(MIG_CONFIG, config, model).unwrap_err();
            assert!(error.contains(says), "{config} on {model:?}: {error}");
        }
    }

    fn plugin_spec(env_pairs: &[(&str, &str)], default_config: Option<&str>) -> PodSpec {
        let container = |name: &str, env_pairs: &[(&str, &str)]| Container {
            name: name.to_owned(),
            env: Some(
                env_pairs
                    .iter()
                    .map(|(n, v)| EnvVar {
                        name: (*n).into(),
                        value: Some((*v).into()),
                        ..EnvVar::default()
                    })
                    .collect(),
            ),
            ..Container::default()
        };
        let mut containers = vec![container("nvidia-device-plugin", env_pairs)];
        if let Some(default) = default_config {
            containers.push(container("config-manager", &[("DEFAULT_CONFIG", default)]));
        }
        PodSpec {
            containers,
            ..PodSpec::default()
        }
    }

    #[test]
    fn the_plugin_reads_its_strategy_and_the_selected_sharing_config() {
        let config_maps = BTreeMap::from([(
            "time-slicing-config".to_owned(),
            BTreeMap::from([
                ("any".to_owned(), "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n".to_owned()),
                ("mps".to_owned(), "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n".to_owned()),
            ]),
        )]);
        let spec = plugin_spec(&[("MIG_STRATEGY", "mixed")], Some("any"));
        let settings = plugin_settings(&spec, &BTreeMap::new(), &config_maps);
        assert_eq!(settings.mig_strategy, "mixed");
        assert_eq!(settings.sharing.strategy, Strategy::TimeSlicing);
        assert_eq!(settings.sharing.replicas("nvidia.com/gpu"), 4);
        let labelled = BTreeMap::from([(DEVICE_PLUGIN_CONFIG.to_owned(), "mps".to_owned())]);
        let settings = plugin_settings(&spec, &labelled, &config_maps);
        assert_eq!(settings.sharing.strategy, Strategy::Mps);
        assert_eq!(settings.sharing.replicas("nvidia.com/gpu"), 2);
        let plain = plugin_settings(&plugin_spec(&[], None), &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(plain, PluginSettings::default());
    }

    #[test]
    fn driver_versions_come_from_the_tag() {
        assert_eq!(
            driver_version("nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"),
            "595.91.07"
        );
        assert_eq!(
            driver_version("nvcr.io/nvidia/driver:580-5.15.0-105-generic-ubuntu22.04"),
            "580"
        );
        assert_eq!(driver_version("registry:5000/driver@sha256:abc"), "unknown");
    }
}
