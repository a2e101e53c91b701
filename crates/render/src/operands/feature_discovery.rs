//! The `gpu-feature-discovery` state: GPU feature discovery labels each node with its GPUs' model, memory,
//! MIG and sharing properties (`nvidia.com/gpu.product`, `nvidia.com/mig.capable`,
//! `nvidia.com/mps.capable`, ...), through NFD's NodeFeature API.
//!
//! It runs from the device plugin's image, takes the same per-node configuration (config-manager, so its
//! sharing labels follow the plugin's configuration) and the same MIG environment.

use gpuop_api::{ImageSection, OperandInfo};
use k8s_openapi::api::core::v1::{Container, PodSpec};

use crate::RenderError;
use crate::daemonset::OperandPod;
use crate::inputs::{Inputs, PulledImage, apply_env, apply_host_network};
use crate::operands::device_plugin::config_manager;
use crate::operands::{container, validated_pod};
use crate::pod::{
    env, field_env, host_path, mount, mount_with, privileged, run_nvidia_volume, status_file_waits,
};
use crate::rbac::access;

/// The main container's name (and the process the config-manager signals).
const CONTAINER: &str = "gpu-feature-discovery";
/// NFD's feature-file directory on the host.
const FEATURES_DIR: &str = "/etc/kubernetes/node-feature-discovery/features.d";

/// The feature discovery DaemonSet.
pub(crate) fn render(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<OperandPod, RenderError> {
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let discovery = Container {
        command: Some(vec![CONTAINER.to_owned()]),
        env: Some(vec![
            env("GFD_SLEEP_INTERVAL", "60s"),
            env("GFD_FAIL_ON_INIT_ERROR", "true"),
            field_env("NAMESPACE", "metadata.namespace"),
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("POD_NAME", "metadata.name"),
        ]),
        volume_mounts: Some(vec![
            mount("output-dir", FEATURES_DIR),
            mount_with("host-sys", "/sys", true, None),
        ]),
        security_context: Some(privileged()),
        ..container(CONTAINER, &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        init_containers: Some(status_file_waits(info, &validator)),
        containers: vec![discovery],
        volumes: Some(vec![
            host_path("output-dir", FEATURES_DIR, None),
            host_path("host-sys", "/sys", None),
            run_nvidia_volume(Some("Directory")),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec).selected_by(&[
        ("app", info.daemonset),
        ("app.kubernetes.io/part-of", "nvidia-gpu"),
    ]);
    settings.apply_args(&mut pod.spec.containers[0]);
    apply_env(&mut pod.spec.containers[0], settings.env());
    // The config-manager comes from the device plugin's image, as in NVIDIA's operator.
    let manager_image = match inputs.policy.image(ImageSection::DevicePlugin) {
        Some(plugin) => PulledImage {
            image: plugin.to_owned(),
            pull_policy: inputs.pull_policy(ImageSection::DevicePlugin),
        },
        None => image,
    };
    config_manager(inputs, &mut pod.spec, &manager_image, CONTAINER, settings);
    settings.apply_resources_to_containers(&mut pod.spec);
    inputs.gpu_access(&mut pod, CONTAINER);
    inputs.mig_env(&mut pod.spec.containers[0]);
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(pod)
}
