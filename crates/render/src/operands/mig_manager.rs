//! The `state-mig-manager` state: the MIG manager applies the layout a node's `nvidia.com/mig.config`
//! label names, pausing the GPU operands on the node meanwhile, and reports `nvidia.com/mig.config.state`.
//!
//! Layouts come from `migManager.config.name` (key `config.yaml`, passed as `CONFIG_FILE`) or, without one,
//! from the `default-mig-parted-config` ConfigMap rendered here, mounted as `config-default.yaml` and passed
//! as `DEFAULT_CONFIG_FILE` (newer MIG managers generate layouts from the hardware and fall back to it).
//! The host services to stop while MIG changes (when the driver is on the host:
//! `WITH_SHUTDOWN_HOST_GPU_CLIENTS`, set by the entrypoint from `driver-ready`) come from
//! `migManager.gpuClientsConfig.name` or the `default-gpu-clients` ConfigMap rendered here. Default
//! ConfigMaps are rendered only when no custom one is named.

use std::fmt::Write as _;

use gpuop_api::OperandInfo;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::inputs::{Inputs, apply_env, apply_host_network};
use crate::manifest::{Objects, Owner};
use crate::operands::mig_layouts::LAYOUTS;
use crate::operands::{Entrypoint, OperandPods, config_map, validated_pod};
use crate::pod::{
    VALIDATIONS_VOLUME, cdi_root_mount, cdi_root_volume, config_map_volume, driver_install_dir_mount,
    driver_install_dir_volume, field_env, host_path, host_root_mount, host_root_volume, mount, privileged,
    set_env, status_file_waits, validations_volume,
};
use crate::rbac::access;

/// The entrypoint script.
const ENTRYPOINT: Entrypoint = Entrypoint {
    config_map: "nvidia-mig-manager-entrypoint",
    script: include_str!("scripts/mig-manager-entrypoint.sh"),
};
/// Name of the default layouts ConfigMap.
pub(crate) const DEFAULT_LAYOUTS_CONFIG_MAP: &str = "default-mig-parted-config";
/// Name of the default GPU clients ConfigMap.
pub(crate) const DEFAULT_GPU_CLIENTS_CONFIG_MAP: &str = "default-gpu-clients";
/// Host services that hold GPUs and are stopped while MIG is reconfigured.
const HOST_GPU_CLIENTS: &[&str] = &[
    "nvsm.service",
    "nvsm-mqtt.service",
    "nvsm-core.service",
    "nvsm-api-gateway.service",
    "nvsm-notifier.service",
    "nv_peer_mem.service",
    "nvidia-dcgm.service",
    "dcgm.service",
    "dcgm-exporter.service",
];

/// The ConfigMap a setting names, and whether it is a custom one (named, and not the default's name).
fn configured<'a>(name: Option<&'a str>, default: &'a str) -> (&'a str, bool) {
    match name.filter(|n| !n.is_empty()) {
        Some(name) => (name, name != default),
        None => (default, false),
    }
}

/// Renders the default and entrypoint ConfigMaps and returns the MIG manager DaemonSet.
pub(crate) fn render(inputs: &Inputs<'_>, info: &OperandInfo, objects: &mut Objects) -> OperandPods {
    let manager = inputs.spec.mig_manager.clone().unwrap_or_default();
    let layouts_name = manager.config.as_ref().and_then(|c| c.name.as_deref());
    let has_layouts = layouts_name.is_some_and(|n| !n.is_empty());
    let (layouts, custom_layouts) = configured(layouts_name, DEFAULT_LAYOUTS_CONFIG_MAP);
    let (clients, custom_clients) = configured(
        manager.gpu_clients_config.as_ref().and_then(|c| c.get()),
        DEFAULT_GPU_CLIENTS_CONFIG_MAP,
    );
    let owner = Owner::operand(info);
    if !custom_layouts {
        objects.push(
            owner,
            config_map(
                DEFAULT_LAYOUTS_CONFIG_MAP,
                None,
                &[("config.yaml", default_layouts())],
            ),
        );
    }
    if !custom_clients {
        objects.push(
            owner,
            config_map(
                DEFAULT_GPU_CLIENTS_CONFIG_MAP,
                None,
                &[("clients.yaml", default_gpu_clients())],
            ),
        );
    }
    ENTRYPOINT.push_config_map(objects, info);

    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let main = Container {
        env: Some(vec![
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            crate::pod::env("GPU_CLIENTS_FILE", "/gpu-clients/clients.yaml"),
            field_env("DEFAULT_GPU_CLIENTS_NAMESPACE", "metadata.namespace"),
        ]),
        security_context: Some(privileged()),
        volume_mounts: Some(vec![
            ENTRYPOINT.mount(),
            mount(VALIDATIONS_VOLUME, "/run/nvidia/validations"),
            mount("host-sys", "/sys"),
            host_root_mount(false),
            mount("gpu-clients", "/gpu-clients"),
            mount("mig-parted-config", "/mig-parted-config"),
            driver_install_dir_mount("/driver-root"),
            cdi_root_mount(),
        ]),
        ..ENTRYPOINT.container(info.daemonset, &image)
    };
    // The default layouts are mounted as config-default.yaml, so the manager tells them from a user's.
    let layout_items: &[(&str, &str)] = if has_layouts {
        &[]
    } else {
        &[("config.yaml", "config-default.yaml")]
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        host_pid: Some(true),
        host_ipc: Some(true),
        init_containers: Some(status_file_waits(info, &validator)),
        containers: vec![main],
        volumes: Some(vec![
            ENTRYPOINT.volume(),
            host_path("host-sys", "/sys", Some("Directory")),
            validations_volume(),
            driver_install_dir_volume(),
            host_root_volume(),
            config_map_volume("gpu-clients", clients, None, &[]),
            config_map_volume("mig-parted-config", layouts, None, layout_items),
            cdi_root_volume(),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    settings.apply_resources_to_containers(&mut pod.spec);
    settings.apply_args(&mut pod.spec.containers[0]);
    inputs.gpu_access(&mut pod, info.daemonset);
    let ctr = &mut pod.spec.containers[0];
    if has_layouts {
        set_env(ctr, "CONFIG_FILE", "/mig-parted-config/config.yaml");
    } else {
        set_env(
            ctr,
            "DEFAULT_CONFIG_FILE",
            "/mig-parted-config/config-default.yaml",
        );
    }
    if inputs.spec.cdi_enabled() {
        set_env(ctr, "CDI_ENABLED", "true");
        if let Some(hook) = inputs.cdi_hook_path() {
            set_env(ctr, "NVIDIA_CDI_HOOK_PATH", &hook);
        }
    }
    apply_env(ctr, settings.env());
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(vec![pod])
}

/// The default layouts, as mig-parted's `config.yaml` (`version: v1`, `mig-configs`).
pub(crate) fn default_layouts() -> String {
    let mut text = String::from("version: v1\nmig-configs:\n");
    for (name, entries) in LAYOUTS {
        let _ = writeln!(text, "  {name}:");
        for entry in *entries {
            let mut first = true;
            let mut line = |text: &mut String, body: &str| {
                let prefix = if first { "    - " } else { "      " };
                first = false;
                let _ = writeln!(text, "{prefix}{body}");
            };
            if !entry.filter.is_empty() {
                let filters: Vec<String> = entry.filter.iter().map(|f| format!("\"{f}\"")).collect();
                line(&mut text, &format!("device-filter: [{}]", filters.join(", ")));
            }
            line(&mut text, "devices: all");
            line(&mut text, &format!("mig-enabled: {}", entry.enabled));
            if entry.enabled {
                if entry.devices.is_empty() {
                    line(&mut text, "mig-devices: {}");
                } else {
                    line(&mut text, "mig-devices:");
                    for (profile, count) in entry.devices {
                        let _ = writeln!(text, "        \"{profile}\": {count}");
                    }
                }
            }
        }
    }
    text
}

/// The default GPU clients, as the MIG manager's `clients.yaml`.
fn default_gpu_clients() -> String {
    let mut text = String::from("version: v1\nsystemd-services:\n");
    for service in HOST_GPU_CLIENTS {
        let _ = writeln!(text, "  - {service}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layouts_are_valid_yaml_with_the_layouts_users_select() {
        let parsed: serde_json::Value = serde_saphyr::from_str(&default_layouts()).unwrap();
        assert_eq!(parsed["version"], "v1");
        let layouts = parsed["mig-configs"].as_object().unwrap();
        assert_eq!(layouts.len(), LAYOUTS.len());
        assert_eq!(
            parsed["mig-configs"]["all-disabled"],
            serde_json::json!([{"devices": "all", "mig-enabled": false}])
        );
        assert_eq!(
            parsed["mig-configs"]["all-enabled"][0]["mig-devices"],
            serde_json::json!({})
        );
        let a100_80 = parsed["mig-configs"]["all-1g.10gb"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| {
                entry["device-filter"]
                    .as_array()
                    .is_some_and(|f| f.contains(&serde_json::json!("0x20B210DE")))
            })
            .unwrap();
        assert_eq!(a100_80["mig-devices"]["1g.10gb"], 7);
        assert!(layouts.contains_key("all-balanced"));
    }

    #[test]
    fn gpu_clients_list_the_host_services() {
        let parsed: serde_json::Value = serde_saphyr::from_str(&default_gpu_clients()).unwrap();
        assert_eq!(parsed["systemd-services"][0], "nvsm.service");
        assert_eq!(
            parsed["systemd-services"].as_array().unwrap().len(),
            HOST_GPU_CLIENTS.len()
        );
    }
}
