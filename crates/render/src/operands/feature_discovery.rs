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
use crate::inputs::{Inputs, PulledImage, add_pull_secrets, apply_env, apply_host_network, apply_resources};
use crate::operands::device_plugin::config_manager;
use crate::operands::{add_validator_pull_secrets, container};
use crate::pod::{
    apply_host_paths, env, field_env, host_path, mount, mount_with, privileged, run_nvidia_volume,
    status_file_waits,
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
    let mut spec = PodSpec {
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
    apply_host_paths(&mut spec, &inputs.host_paths);
    let mut pod = OperandPod::new(info, spec).selected_by(&[
        ("app", info.daemonset),
        ("app.kubernetes.io/part-of", "nvidia-gpu"),
    ]);
    add_validator_pull_secrets(inputs, &mut pod);
    add_pull_secrets(&mut pod.spec, inputs.pull_secrets(info.image_section));
    if let Some(args) = settings.args() {
        pod.spec.containers[0].args = Some(args);
    }
    apply_env(&mut pod.spec.containers[0], settings.env());
    // The config-manager comes from the device plugin's image, as in NVIDIA's operator.
    let manager_image = match inputs.policy.image(ImageSection::DevicePlugin) {
        Some(plugin) => PulledImage {
            image: plugin.to_owned(),
            pull_policy: inputs.pull_policy(ImageSection::DevicePlugin),
        },
        None => image,
    };
    config_manager(
        inputs,
        &mut pod.spec,
        &manager_image,
        CONTAINER,
        settings.resources().as_ref(),
    );
    for ctr in &mut pod.spec.containers {
        apply_resources(ctr, settings.resources().as_ref());
    }
    inputs.gpu_access(&mut pod, CONTAINER);
    inputs.mig_env(&mut pod.spec.containers[0]);
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(pod)
}
