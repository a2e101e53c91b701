//! DCGM: the standalone host engine (`state-dcgm`, `nvidia-dcgm` on port 5555 behind a node-local
//! Service) and the metrics exporter (`state-dcgm-exporter`, `/metrics` on port 9400 behind a Service and,
//! when the Prometheus Operator is installed and `dcgmExporter.serviceMonitor.enabled`, a ServiceMonitor).
//!
//! With the host engine enabled the exporter connects to it (`DCGM_REMOTE_HOSTENGINE_INFO=nvidia-dcgm:5555`)
//! instead of embedding its own. The exporter reads which pod uses which GPU from the kubelet's
//! pod-resources socket under `hostPaths.kubeletRootDir`; labelling metrics with pod labels or UIDs needs
//! read access to pods (ClusterRole `nvidia-dcgm-exporter-read-pods`, rendered only then) and a mounted
//! service-account token, which the exporter otherwise does without.

use std::collections::BTreeMap;

use gpuop_api::OperandInfo;
use gpuop_api::cluster_policy::DEFAULT_HPC_JOB_MAPPING_DIR;
use gpuop_api::component::EnvVar as PolicyEnvVar;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, HTTPGetAction, PodSpec, Probe, Service, ServicePort, ServiceSpec,
    TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::inputs::{Inputs, apply_env, apply_host_network, apply_resources};
use crate::manifest::{Objects, Owner, meta};
use crate::monitoring::ServiceMonitor;
use crate::operands::metrics::metrics_service;
use crate::operands::{OperandPods, container, validated_pod};
use crate::pod::{
    config_map_volume, env, field_env, file_mount, host_path, mount_with, privileged, run_nvidia_volume,
    set_env, status_file_waits,
};
use crate::rbac::{access, push_exporter_read_pods};

/// The host engine's port.
const HOST_ENGINE_PORT: i32 = 5555;
/// The exporter's metrics port.
const EXPORTER_PORT: i32 = 9400;
/// Name of the exporter's metrics port on its Service.
const EXPORTER_PORT_NAME: &str = "gpu-metrics";
/// Where a custom metrics list is mounted.
const METRICS_FILE: &str = "/etc/dcgm-exporter/dcgm-metrics.csv";
/// Exporter variables that make it label metrics with pod metadata.
const POD_METADATA_VARS: &[&str] = &[
    "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS",
    "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID",
];

/// Renders the host engine's Service and returns its DaemonSet.
pub(crate) fn render_host_engine(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
    objects: &mut Objects,
) -> OperandPods {
    let name = info.daemonset;
    objects.push(
        Owner::operand(info),
        Service {
            metadata: meta(name, &[("app", name)]),
            spec: Some(ServiceSpec {
                internal_traffic_policy: Some("Local".to_owned()),
                ports: Some(vec![ServicePort {
                    name: Some("dcgm".to_owned()),
                    port: HOST_ENGINE_PORT,
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                }]),
                selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
                type_: Some("ClusterIP".to_owned()),
                ..ServiceSpec::default()
            }),
            status: None,
        },
    );
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let tcp_probe = || Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(HOST_ENGINE_PORT),
            host: None,
        }),
        initial_delay_seconds: Some(15),
        ..Probe::default()
    };
    let engine = Container {
        security_context: Some(privileged()),
        ports: Some(vec![ContainerPort {
            name: Some("dcgm".to_owned()),
            container_port: HOST_ENGINE_PORT,
            // The API server\'s default, written out: server-side apply keys container ports by port
            // and protocol, and an applied port without one is another list item than the stored port.
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(tcp_probe()),
        readiness_probe: Some(tcp_probe()),
        ..container("nvidia-dcgm-ctr", &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        init_containers: Some(status_file_waits(info, &validator)),
        containers: vec![engine],
        volumes: Some(vec![run_nvidia_volume(Some("Directory"))]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    settings.apply_to(&mut pod.spec.containers[0]);
    inputs.gpu_access(&mut pod, "nvidia-dcgm-ctr");
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(vec![pod])
}

/// Whether a variable the user set turns on pod metadata.
fn env_enables_pod_metadata(vars: &[PolicyEnvVar]) -> bool {
    vars.iter().any(|var| {
        POD_METADATA_VARS.contains(&var.name.as_str())
            && var
                .value
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    })
}

/// Whether a variable the user set makes the exporter read the API (pod metadata, or metrics from a
/// ConfigMap).
fn env_reads_api(vars: &[PolicyEnvVar]) -> bool {
    env_enables_pod_metadata(vars)
        || vars.iter().any(|var| {
            var.name == "DCGM_EXPORTER_CONFIGMAP_DATA"
                && var.value.as_deref().is_some_and(|v| !v.is_empty() && v != "none")
        })
}

/// Renders the exporter's pod-reading RBAC (when needed), Service and ServiceMonitor, and returns its
/// DaemonSet.
pub(crate) fn render_exporter(inputs: &Inputs<'_>, info: &OperandInfo, objects: &mut Objects) -> OperandPods {
    let exporter = &inputs.spec.dcgm_exporter;
    let settings = inputs.container(info.image_section);
    let pod_metadata = exporter.needs_pod_metadata() || env_enables_pod_metadata(settings.env());
    if pod_metadata {
        push_exporter_read_pods(objects, info);
    }
    let owner = Owner::operand(info);
    let mut service = metrics_service(info.daemonset, EXPORTER_PORT_NAME, EXPORTER_PORT);
    if let (Some(config), Some(spec)) = (&exporter.service, service.spec.as_mut()) {
        if let Some(kind) = config.type_.as_deref().filter(|t| !t.is_empty()) {
            spec.type_ = Some(kind.to_owned());
        }
        if let Some(policy) = &config.internal_traffic_policy {
            spec.internal_traffic_policy = Some(policy.clone());
        }
    }
    objects.push(owner, service);
    let monitor = exporter.service_monitor.as_ref().filter(|m| m.is_enabled());
    if inputs.facts.service_monitor_crd
        && let Some(config) = monitor
    {
        let namespace = objects.namespace().to_owned();
        let monitor = ServiceMonitor::new(
            info.daemonset,
            info.daemonset,
            EXPORTER_PORT_NAME,
            "app",
            &namespace,
        );
        objects.push(owner, monitor.configured(Some(config)));
    }

    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let health = |period| Probe {
        http_get: Some(HTTPGetAction {
            port: IntOrString::Int(EXPORTER_PORT),
            path: Some("/health".to_owned()),
            ..HTTPGetAction::default()
        }),
        initial_delay_seconds: Some(45),
        period_seconds: period,
        ..Probe::default()
    };
    let main = Container {
        env: Some(vec![
            env("DCGM_EXPORTER_LISTEN", &format!(":{EXPORTER_PORT}")),
            env("DCGM_EXPORTER_KUBERNETES", "true"),
            env(
                "DCGM_EXPORTER_COLLECTORS",
                "/etc/dcgm-exporter/dcp-metrics-included.csv",
            ),
            field_env("NODE_NAME", "spec.nodeName"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".to_owned()),
            container_port: EXPORTER_PORT,
            // The API server\'s default, written out: server-side apply keys container ports by port
            // and protocol, and an applied port without one is another list item than the stored port.
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(health(Some(5))),
        readiness_probe: Some(health(None)),
        volume_mounts: Some(vec![mount_with(
            "pod-gpu-resources",
            "/var/lib/kubelet/pod-resources",
            true,
            None,
        )]),
        security_context: Some(privileged()),
        ..container(info.daemonset, &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        automount_service_account_token: Some(false),
        init_containers: Some(status_file_waits(info, &validator)),
        containers: vec![main],
        volumes: Some(vec![
            host_path(
                "pod-gpu-resources",
                &format!(
                    "{}/pod-resources",
                    inputs.host_paths.kubelet_root_dir().trim_end_matches('/')
                ),
                None,
            ),
            run_nvidia_volume(None),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    pod.annotate(exporter.annotations.clone().unwrap_or_default());
    {
        let ctr = &mut pod.spec.containers[0];
        apply_resources(ctr, settings.resources().as_ref());
        settings.apply_args(ctr);
        if inputs.spec.dcgm.is_enabled() {
            set_env(
                ctr,
                "DCGM_REMOTE_HOSTENGINE_INFO",
                &format!("nvidia-dcgm:{HOST_ENGINE_PORT}"),
            );
        }
    }
    // A host engine on the host itself (DGX OS) is reached on localhost, so from the host network.
    let host_engine_on_host = !inputs.spec.dcgm.is_enabled()
        && settings.env().iter().any(|var| {
            var.name == "DCGM_REMOTE_HOSTENGINE_INFO"
                && var.value.as_deref().is_some_and(|v| v.starts_with("localhost"))
        });
    apply_host_network(&mut pod.spec, host_engine_on_host || settings.host_network());
    inputs.gpu_access(&mut pod, info.daemonset);
    if exporter.is_host_pid() {
        pod.spec.host_pid = Some(true);
    }
    let ctr = &mut pod.spec.containers[0];
    let mut extra_volumes = Vec::new();
    if exporter.is_hpc_job_mapping_enabled() {
        let dir = exporter
            .hpc_job_mapping
            .as_ref()
            .and_then(|m| m.directory.as_deref())
            .filter(|d| !d.is_empty())
            .unwrap_or(DEFAULT_HPC_JOB_MAPPING_DIR);
        set_env(ctr, "DCGM_HPC_JOB_MAPPING_DIR", dir);
        ctr.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount_with("hpc-job-mapping", dir, true, None));
        extra_volumes.push(host_path("hpc-job-mapping", dir, Some("DirectoryOrCreate")));
    }
    if exporter.enable_pod_labels == Some(true) {
        set_env(ctr, POD_METADATA_VARS[0], "true");
    }
    if exporter.enable_pod_uid == Some(true) {
        set_env(ctr, POD_METADATA_VARS[1], "true");
    }
    if let Some(allow) = exporter
        .pod_label_allowlist_regex
        .as_ref()
        .filter(|a| !a.is_empty())
    {
        set_env(
            ctr,
            "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
            &allow.join(","),
        );
    }
    if let Some(name) = exporter.config.as_ref().and_then(|c| c.get()) {
        let file = "dcgm-metrics.csv";
        ctr.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(file_mount("metrics-config", METRICS_FILE, file));
        extra_volumes.push(config_map_volume("metrics-config", name, None, &[(file, file)]));
        set_env(ctr, "DCGM_EXPORTER_COLLECTORS", METRICS_FILE);
    }
    apply_env(ctr, settings.env());
    if exporter.needs_pod_metadata() || env_reads_api(settings.env()) {
        pod.spec.automount_service_account_token = Some(true);
    }
    pod.spec
        .volumes
        .get_or_insert_with(Vec::new)
        .extend(extra_volumes);
    Ok(vec![pod])
}
