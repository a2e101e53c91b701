//! The device plugin (`state-device-plugin`) and the MPS control daemon (`state-mps-control-daemon`), and
//! the `config-manager` they and feature discovery share.
//!
//! Device plugin environment (NVIDIA's plugin image): `PASS_DEVICE_SPECS`, `FAIL_ON_INIT_ERROR`,
//! `DEVICE_ID_STRATEGY=uuid`, `MPS_ROOT`; the MIG variables (`MIG_STRATEGY`, or
//! `NVIDIA_MIG_MONITOR_DEVICES=all` to let the plugin decide per node); with CDI `CDI_ENABLED=true`,
//! `DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri`, `CDI_ANNOTATION_PREFIX=cdi.k8s.io/` and, when the
//! operator installs the toolkit, `NVIDIA_CDI_HOOK_PATH=<installDir>/toolkit/nvidia-cdi-hook`; GDS and
//! GDRCopy device switches when those are on.
//!
//! Per-node configuration (`devicePlugin.config.name`): the named ConfigMap is mounted at
//! `/available-configs`, a `config-manager-init` init container picks the node's key
//! (`nvidia.com/device-plugin.config`, else `devicePlugin.config.default`) into `/config/config.yaml`
//! before the plugin starts, and a `config-manager` sidecar follows label changes and sends the plugin
//! SIGHUP (the pod shares its process namespace for that). Without a name, neither container is rendered.

use gpuop_api::OperandInfo;
use gpuop_api::cluster_policy::DEFAULT_MPS_ROOT;
use gpuop_api::labels::DEVICE_PLUGIN_CONFIG;
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};

use crate::RenderError;
use crate::daemonset::OperandPod;
use crate::inputs::{ContainerSettings, Inputs, PulledImage, apply_env, apply_host_network, apply_resources};
use crate::manifest::Objects;
use crate::operands::{Entrypoint, OperandPods, container, validated_pod};
use crate::pod::{
    Propagation, VALIDATIONS_VOLUME, cdi_root_mount, cdi_root_volume, config_map_volume,
    driver_install_dir_mount, driver_install_dir_volume, empty_dir, env, field_env, host_path,
    host_root_mount, host_root_volume, mount, mount_with, privileged, run_nvidia_volume, set_env,
    status_file_waits, validations_volume,
};
use crate::rbac::access;

/// The entrypoint script.
const ENTRYPOINT: Entrypoint = Entrypoint {
    config_map: "nvidia-device-plugin-entrypoint",
    script: include_str!("scripts/device-plugin-entrypoint.sh"),
};
/// The plugin container's name.
const PLUGIN_CONTAINER: &str = "nvidia-device-plugin";
/// Where the selected configuration is written.
const CONFIG_FILE: &str = "/config/config.yaml";

/// Renders the entrypoint ConfigMap and returns the device plugin DaemonSet.
pub(crate) fn render(inputs: &Inputs<'_>, info: &OperandInfo, objects: &mut Objects) -> OperandPods {
    ENTRYPOINT.push_config_map(objects, info);
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let plugin = Container {
        security_context: Some(privileged()),
        env: Some(vec![
            env("PASS_DEVICE_SPECS", "true"),
            env("FAIL_ON_INIT_ERROR", "true"),
            env("DEVICE_LIST_STRATEGY", "envvar"),
            env("DEVICE_ID_STRATEGY", "uuid"),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "all"),
            env("MPS_ROOT", DEFAULT_MPS_ROOT),
        ]),
        volume_mounts: Some(vec![
            ENTRYPOINT.mount(),
            mount("device-plugin", "/var/lib/kubelet/device-plugins"),
            mount(VALIDATIONS_VOLUME, "/run/nvidia/validations"),
            driver_install_dir_mount("/driver-root"),
            host_root_mount(true),
            cdi_root_mount(),
            // The daemon's /dev/shm, for health-checking MPS.
            mount("mps-shm", "/dev/shm"),
            mount("mps-root", "/mps"),
        ]),
        ..ENTRYPOINT.container(PLUGIN_CONTAINER, &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        init_containers: Some(status_file_waits(info, &validator)),
        containers: vec![plugin],
        volumes: Some(vec![
            ENTRYPOINT.volume(),
            host_path("device-plugin", "/var/lib/kubelet/device-plugins", None),
            validations_volume(),
            driver_install_dir_volume(),
            host_root_volume(),
            cdi_root_volume(),
            host_path("mps-root", DEFAULT_MPS_ROOT, Some("DirectoryOrCreate")),
            host_path("mps-shm", &format!("{DEFAULT_MPS_ROOT}/shm"), None),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);

    let settings = inputs.container(info.image_section);
    settings.apply_args(&mut pod.spec.containers[0]);
    {
        let ctr = &mut pod.spec.containers[0];
        if inputs.spec.gds_enabled() {
            set_env(ctr, "GDS_ENABLED", "true");
            set_env(ctr, "MOFED_ENABLED", "true");
        }
        if inputs.spec.gdrcopy_enabled() {
            set_env(ctr, "GDRCOPY_ENABLED", "true");
        }
    }
    config_manager(inputs, &mut pod.spec, &image, "nvidia-device-plugin", settings);
    settings.apply_resources_to_containers(&mut pod.spec);
    inputs.gpu_access(&mut pod, PLUGIN_CONTAINER);
    let custom_mps_root = custom_mps_root(inputs);
    {
        let ctr = &mut pod.spec.containers[0];
        inputs.mig_env(ctr);
        if inputs.spec.cdi_enabled() {
            set_env(ctr, "CDI_ENABLED", "true");
            set_env(ctr, "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri");
            set_env(ctr, "CDI_ANNOTATION_PREFIX", "cdi.k8s.io/");
            if let Some(hook) = inputs.cdi_hook_path() {
                set_env(ctr, "NVIDIA_CDI_HOOK_PATH", &hook);
            }
        }
        if let Some(root) = custom_mps_root {
            set_env(ctr, "MPS_ROOT", root);
        }
        apply_env(ctr, settings.env());
    }
    if let Some(root) = custom_mps_root {
        move_mps_root(&mut pod.spec, root);
    }
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(vec![pod])
}

/// `devicePlugin.mps.root` when it differs from the default.
fn custom_mps_root<'a>(inputs: &Inputs<'a>) -> Option<&'a str> {
    let root = inputs.spec.device_plugin.mps_root();
    (root != DEFAULT_MPS_ROOT).then_some(root)
}

/// Points the `mps-root` and `mps-shm` volumes at a custom MPS root.
fn move_mps_root(pod: &mut PodSpec, root: &str) {
    for volume in pod.volumes.iter_mut().flatten() {
        let Some(source) = volume.host_path.as_mut() else {
            continue;
        };
        match volume.name.as_str() {
            "mps-root" => source.path = root.to_owned(),
            "mps-shm" => source.path = format!("{}/shm", root.trim_end_matches('/')),
            _ => {}
        }
    }
}

/// One config-manager container: `ONESHOT` for the init container, a signalling sidecar otherwise.
fn config_manager_container(
    image: &PulledImage,
    oneshot: bool,
    process: &str,
    default: &str,
    config: &str,
) -> Container {
    let (name, send, signal, process) = if oneshot {
        ("config-manager-init", "false", "", "")
    } else {
        // Signal 1 is SIGHUP: the process reloads its configuration.
        ("config-manager", "true", "1", process)
    };
    Container {
        command: Some(vec!["config-manager".to_owned()]),
        security_context: (!oneshot).then(privileged),
        env: Some(vec![
            env("ONESHOT", if oneshot { "true" } else { "false" }),
            env("KUBECONFIG", ""),
            field_env("NODE_NAME", "spec.nodeName"),
            env("NODE_LABEL", DEVICE_PLUGIN_CONFIG),
            env("CONFIG_FILE_SRCDIR", "/available-configs"),
            env("CONFIG_FILE_DST", CONFIG_FILE),
            env("DEFAULT_CONFIG", default),
            env("SEND_SIGNAL", send),
            env("SIGNAL", signal),
            env("PROCESS_TO_SIGNAL", process),
            env("FALLBACK_STRATEGIES", "empty"),
        ]),
        volume_mounts: Some(vec![
            mount("config", "/config"),
            mount(config, "/available-configs"),
        ]),
        ..container(name, image)
    }
}

/// With `devicePlugin.config.name` set: the config-manager init container (after the other init
/// containers) and sidecar (after the main container), the ConfigMap and shared `config` volumes,
/// `CONFIG_FILE` in the main container, and a shared process namespace unless the pod has the host's. The
/// init container gets the operand section's resources (the sidecar gets them with the pod's other
/// containers).
pub(crate) fn config_manager(
    inputs: &Inputs<'_>,
    pod: &mut PodSpec,
    image: &PulledImage,
    process: &str,
    settings: ContainerSettings<'_>,
) {
    let Some(config) = inputs.spec.device_plugin.config.as_ref() else {
        return;
    };
    let Some(name) = config.name.as_deref().filter(|n| !n.is_empty()) else {
        return;
    };
    let default = config.default.as_deref().unwrap_or_default();
    let main = &mut pod.containers[0];
    set_env(main, "CONFIG_FILE", CONFIG_FILE);
    let mounts = main.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(mount("config", "/config"));
    mounts.push(mount(name, "/available-configs"));
    if pod.host_pid != Some(true) {
        pod.share_process_namespace = Some(true);
    }
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.push(config_map_volume(name, name, None, &[]));
    volumes.push(empty_dir("config"));
    let mut init = config_manager_container(image, true, process, default, name);
    apply_resources(&mut init, settings.resources().as_ref());
    pod.init_containers.get_or_insert_with(Vec::new).push(init);
    pod.containers
        .push(config_manager_container(image, false, process, default, name));
}

/// `NODE_NAME` as NVIDIA's MPS asset spells it, with the field's API version (the server's default).
fn node_name_v1() -> EnvVar {
    let mut var = field_env("NODE_NAME", "spec.nodeName");
    if let Some(field) = var.value_from.as_mut().and_then(|from| from.field_ref.as_mut()) {
        field.api_version = Some("v1".to_owned());
    }
    var
}

/// The MPS control daemon DaemonSet, on nodes feature discovery marks `nvidia.com/mps.capable=true`: it
/// starts one MPS daemon per shared resource under the MPS root, which the device plugin hands to pods.
pub(crate) fn mps_control_daemon(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<OperandPod, RenderError> {
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let mut init = status_file_waits(info, &validator);
    let mut mounts_init = Container {
        command: Some(vec!["mps-control-daemon".to_owned(), "mount-shm".to_owned()]),
        security_context: Some(privileged()),
        volume_mounts: Some(vec![mount_with(
            "mps-root",
            "/mps",
            false,
            Some(Propagation::Bidirectional),
        )]),
        ..container("mps-control-daemon-mounts", &image)
    };
    apply_resources(&mut mounts_init, settings.resources().as_ref());
    init.push(mounts_init);
    let daemon = Container {
        command: Some(vec!["mps-control-daemon".to_owned()]),
        env: Some(vec![
            node_name_v1(),
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ]),
        security_context: Some(privileged()),
        volume_mounts: Some(vec![mount("mps-shm", "/dev/shm"), mount("mps-root", "/mps")]),
        ..container("mps-control-daemon-ctr", &image)
    };
    let spec = PodSpec {
        // NVIDIA runs the daemon under the device plugin's account.
        service_account_name: Some(access(gpuop_api::Operand::DevicePlugin).account.to_owned()),
        host_pid: Some(true),
        init_containers: Some(init),
        containers: vec![daemon],
        volumes: Some(vec![
            run_nvidia_volume(Some("Directory")),
            host_path("mps-root", DEFAULT_MPS_ROOT, Some("DirectoryOrCreate")),
            host_path("mps-shm", &format!("{DEFAULT_MPS_ROOT}/shm"), None),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    config_manager(
        inputs,
        &mut pod.spec,
        &image,
        "/usr/bin/mps-control-daemon",
        settings,
    );
    settings.apply_resources_to_containers(&mut pod.spec);
    inputs.gpu_access(&mut pod, "mps-control-daemon-ctr");
    inputs.mig_env(&mut pod.spec.containers[0]);
    if let Some(root) = custom_mps_root(inputs) {
        move_mps_root(&mut pod.spec, root);
    }
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(pod)
}
