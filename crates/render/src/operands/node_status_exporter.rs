//! The `state-node-status-exporter` state: the validator image in `metrics` mode, exporting each node's
//! validation results (`gpu_operator_node_{driver,toolkit,plugin,cuda}_ready`, ...) on port 8000, behind a
//! Service and, when the Prometheus Operator is installed, a ServiceMonitor.

use gpuop_api::OperandInfo;
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};

use crate::daemonset::OperandPod;
use crate::inputs::{Inputs, add_pull_secrets, apply_host_network};
use crate::manifest::{Objects, Owner};
use crate::monitoring::ServiceMonitor;
use crate::operands::metrics::metrics_service;
use crate::operands::{OperandPods, container};
use crate::pod::{
    Propagation, apply_host_paths, env, field_env, host_root_mount, host_root_volume, privileged,
    run_as_root, run_nvidia_mount, run_nvidia_volume,
};
use crate::rbac::access;

/// The metrics port.
const PORT: i32 = 8000;
/// Name of the metrics port.
const PORT_NAME: &str = "node-status";

/// Renders the exporter's Service and ServiceMonitor and returns its DaemonSet.
pub(crate) fn render(inputs: &Inputs<'_>, info: &OperandInfo, objects: &mut Objects) -> OperandPods {
    let owner = Owner::operand(info);
    objects.push(owner, metrics_service(info.daemonset, PORT_NAME, PORT));
    if inputs.facts.service_monitor_crd {
        let namespace = objects.namespace().to_owned();
        objects.push(
            owner,
            ServiceMonitor::new(info.daemonset, info.daemonset, PORT_NAME, PORT_NAME, &namespace),
        );
    }
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let exporter = Container {
        command: Some(vec!["nvidia-validator".to_owned()]),
        env: Some(vec![
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("COMPONENT", "metrics"),
            env("METRICS_PORT", &PORT.to_string()),
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_owned()),
            container_port: PORT,
            // The API server\'s default, written out: server-side apply keys container ports by port
            // and protocol, and an applied port without one is another list item than the stored port.
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        security_context: Some(privileged()),
        volume_mounts: Some(vec![
            run_nvidia_mount(Propagation::HostToContainer),
            host_root_mount(true),
        ]),
        ..container(info.daemonset, &image)
    };
    let mut spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        containers: vec![exporter],
        volumes: Some(vec![run_nvidia_volume(Some("Directory")), host_root_volume()]),
        ..PodSpec::default()
    };
    apply_host_paths(&mut spec, &inputs.host_paths);
    add_pull_secrets(&mut spec, inputs.pull_secrets(info.image_section));
    let ctr = &mut spec.containers[0];
    settings.apply_to(ctr);
    run_as_root(ctr);
    apply_host_network(&mut spec, settings.host_network());
    Ok(vec![OperandPod::new(info, spec)])
}
