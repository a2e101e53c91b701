//! Operands of nodes that give their GPUs to virtual machines (`sandboxWorkloads.enabled`): the vGPU host
//! manager and vGPU device manager (`vm-vgpu` nodes), the VFIO manager (`vm-passthrough` nodes), the
//! KubeVirt or Kata sandbox device plugin, and the confidential-computing manager (Kata).
//!
//! The vGPU manager is a driver container: its image is tagged per OS like the driver's, so it is
//! rendered per OS pool the same way (one `nvidia-vgpu-manager-daemonset` for one OS, one per OS tag for
//! several, none before a GPU node is known). The sandbox device plugins start only once the node's
//! workload is proven: they read the `workload-type` status file and wait for `vfio-pci-ready` or
//! `vgpu-devices-ready` accordingly.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuop_api::cluster_policy::DEFAULT_VGPU_DEVICES_CONFIG;
use gpuop_api::driver::DriverManagerSpec;
use gpuop_api::{ImageSection, OperandInfo};
use k8s_openapi::api::core::v1::{
    Container, ExecAction, Lifecycle, LifecycleHandler, PodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::RenderError;
use crate::daemonset::{NAME_SELECTOR, OperandPod, labels};
use crate::image::with_os_suffix;
use crate::inputs::{Inputs, PulledImage, add_pull_secrets, apply_env, apply_host_network, apply_resources};
use crate::manifest::{Objects, Owner};
use crate::operands::driver::{config_map_files, driver_manager, os_targets};
use crate::operands::validator::validator_init_container;
use crate::operands::vgpu_layouts::{DEFAULTS, TYPES};
use crate::operands::{OperandPods, config_map, container, validated_pod};
use crate::pod::{
    HOST_ROOT_VOLUME, Propagation, RUN_NVIDIA_VOLUME, VALIDATIONS_VOLUME, apply_host_paths, cdi_root_mount,
    cdi_root_volume, config_map_volume, driver_install_dir_mount, driver_install_dir_volume, env, field_env,
    host_path, host_root_mount, host_root_volume, mount, mount_with, privileged, privileged_s0,
    run_nvidia_mount, run_nvidia_volume, set_env, status_file_waits, validations_volume,
};
use crate::rbac::access;

/// Name of the default vGPU device layouts ConfigMap.
pub(crate) const DEFAULT_VGPU_DEVICES_CONFIG_MAP: &str = "default-vgpu-devices-config";

/// The driver manager of the vGPU and VFIO managers: it unloads a running driver before they take the
/// GPUs, without evicting or draining (these nodes run no container GPU workloads).
fn sandbox_driver_manager(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
    section: ImageSection,
) -> Result<Container, RenderError> {
    let image = inputs.image(section, info)?;
    Ok(driver_manager(
        &image,
        vec![
            env("ENABLE_GPU_POD_EVICTION", "false"),
            env("ENABLE_AUTO_DRAIN", "false"),
        ],
        Vec::new(),
    ))
}

/// Applies the policy to a vGPU or VFIO manager pod: the operand section's resources and the driver
/// manager's environment to the driver manager, both sections' pull secrets (the manager's first), and the
/// operand section to the main container.
fn apply_manager_sections(
    inputs: &Inputs<'_>,
    pod: &mut PodSpec,
    section: ImageSection,
    manager_section: ImageSection,
    manager: Option<&DriverManagerSpec>,
) {
    let settings = inputs.container(section);
    let resources = settings.resources();
    let env = manager.and_then(|m| m.env.as_deref()).unwrap_or_default();
    for ctr in pod
        .init_containers
        .iter_mut()
        .flatten()
        .filter(|c| c.name == "k8s-driver-manager")
    {
        apply_resources(ctr, resources.as_ref());
        apply_env(ctr, env);
    }
    add_pull_secrets(pod, inputs.pull_secrets(manager_section));
    add_pull_secrets(pod, inputs.pull_secrets(section));
    settings.apply_to(&mut pod.containers[0]);
}

/// The vGPU host manager DaemonSets, one per OS pool.
pub(crate) fn vgpu_manager(inputs: &Inputs<'_>, info: &OperandInfo, _objects: &mut Objects) -> OperandPods {
    let image = inputs.image(info.image_section, info)?;
    let targets = os_targets(info.daemonset, info.image_section, &inputs.facts.driver_pools)?;
    let spec = inputs.spec.vgpu_manager.clone().unwrap_or_default();
    let settings = inputs.container(info.image_section);
    let mut pods = Vec::new();
    for target in targets {
        let tagged = PulledImage {
            image: with_os_suffix(&image.image, &target.os_tag),
            pull_policy: image.pull_policy,
        };
        let manager_ctr = Container {
            command: Some(vec!["nvidia-driver".to_owned()]),
            args: Some(vec!["init".to_owned()]),
            security_context: Some(privileged_s0()),
            volume_mounts: Some(vec![
                run_nvidia_mount(Propagation::Bidirectional),
                mount("host-os-release", "/host-etc/os-release"),
                mount("vfio", "/dev/vfio"),
                mount("cgroup", "/sys/fs/cgroup"),
                mount("var-log", "/var/log"),
                mount("dev-log", "/dev/log"),
                mount(
                    "firmware-search-path",
                    "/sys/module/firmware_class/parameters/path",
                ),
                mount("nv-firmware", "/lib/firmware"),
            ]),
            ..container("nvidia-vgpu-manager-ctr", &tagged)
        };
        let mut pod = PodSpec {
            termination_grace_period_seconds: Some(120),
            service_account_name: Some(access(info.operand).account.to_owned()),
            host_pid: Some(true),
            host_ipc: Some(true),
            init_containers: Some(vec![sandbox_driver_manager(
                inputs,
                info,
                ImageSection::VgpuDriverManager,
            )?]),
            containers: vec![manager_ctr],
            volumes: Some(vec![
                run_nvidia_volume(Some("DirectoryOrCreate")),
                host_path("host-os-release", "/etc/os-release", None),
                host_path("cgroup", "/sys/fs/cgroup", Some("Directory")),
                host_path("vfio", "/dev/vfio", Some("Directory")),
                host_root_volume(),
                host_path("host-sys", "/sys", Some("Directory")),
                host_path("var-log", "/var/log", Some("Directory")),
                host_path("dev-log", "/dev/log", None),
                host_path(
                    "firmware-search-path",
                    "/sys/module/firmware_class/parameters/path",
                    None,
                ),
                host_path(
                    "nv-firmware",
                    "/run/nvidia/driver/lib/firmware",
                    Some("DirectoryOrCreate"),
                ),
            ]),
            ..PodSpec::default()
        };
        apply_host_paths(&mut pod, &inputs.host_paths);
        apply_manager_sections(
            inputs,
            &mut pod,
            info.image_section,
            ImageSection::VgpuDriverManager,
            spec.driver_manager.as_ref(),
        );
        if let Some(name) = spec.kernel_module_config.as_ref().and_then(|c| c.get()) {
            let (mounts, volume) = config_map_files(
                inputs,
                "spec.vgpuManager.kernelModuleConfig.name",
                name,
                "/drivers",
            )?;
            pod.containers[0]
                .volume_mounts
                .get_or_insert_with(Vec::new)
                .extend(mounts);
            pod.volumes.get_or_insert_with(Vec::new).push(volume);
        }
        apply_host_network(&mut pod, settings.host_network());
        let mut operand_pod = OperandPod::named(&target.name, pod);
        operand_pod.selector = labels(&[("app", &target.app)]);
        operand_pod.annotations = labels(&[(
            "kubectl.kubernetes.io/default-container",
            "nvidia-vgpu-manager-ctr",
        )]);
        operand_pod.node_selector = target.node_selector;
        pods.push(operand_pod);
    }
    Ok(pods)
}

/// Renders the default vGPU layouts (unless a custom ConfigMap is named) and returns the vGPU device
/// manager DaemonSet, which creates the vGPU devices of the layout a node's `nvidia.com/vgpu.config`
/// label names.
pub(crate) fn vgpu_device_manager(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
    objects: &mut Objects,
) -> OperandPods {
    let config = inputs
        .spec
        .vgpu_device_manager
        .as_ref()
        .and_then(|m| m.config.clone())
        .unwrap_or_default();
    let name = config
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_VGPU_DEVICES_CONFIG_MAP);
    if name == DEFAULT_VGPU_DEVICES_CONFIG_MAP {
        objects.push(
            Owner::operand(info),
            config_map(
                DEFAULT_VGPU_DEVICES_CONFIG_MAP,
                None,
                &[("config.yaml", default_vgpu_layouts())],
            ),
        );
    }
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let manager = Container {
        env: Some(vec![
            field_env("NAMESPACE", "metadata.namespace"),
            field_env("NODE_NAME", "spec.nodeName"),
            env("CONFIG_FILE", "/vgpu-config/config.yaml"),
        ]),
        security_context: Some(privileged()),
        volume_mounts: Some(vec![
            mount("vgpu-config", "/vgpu-config"),
            mount("host-sys", "/sys"),
            host_root_mount(false),
            driver_install_dir_mount("/driver-root"),
        ]),
        ..container(info.daemonset, &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        init_containers: Some(status_file_waits(info, &validator)),
        containers: vec![manager],
        volumes: Some(vec![
            config_map_volume("vgpu-config", name, None, &[]),
            host_path("host-sys", "/sys", Some("Directory")),
            host_root_volume(),
            driver_install_dir_volume(),
            validations_volume(),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    let ctr = &mut pod.spec.containers[0];
    settings.apply_to(ctr);
    set_env(
        ctr,
        "DEFAULT_VGPU_CONFIG",
        config
            .default
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or(DEFAULT_VGPU_DEVICES_CONFIG),
    );
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(vec![pod])
}

/// The default vGPU layouts, as the vGPU device manager's `config.yaml`.
pub(crate) fn default_vgpu_layouts() -> String {
    let mut text = String::from("version: v1\nvgpu-configs:\n");
    for (kind, count) in TYPES {
        let _ = write!(
            text,
            "  \"{kind}\":\n    - devices: all\n      vgpu-devices:\n        \"{kind}\": {count}\n"
        );
    }
    text.push_str("  default:\n");
    for (filter, kind, count) in DEFAULTS {
        let _ = write!(
            text,
            "    - device-filter: \"{filter}\"\n      devices: all\n      vgpu-devices:\n        \"{kind}\": {count}\n"
        );
    }
    text
}

/// The small default footprint NVIDIA gives its VFIO and CC managers.
fn small_resources() -> ResourceRequirements {
    let quantity = |q: &str| Quantity(q.to_owned());
    ResourceRequirements {
        limits: Some(BTreeMap::from([("memory".to_owned(), quantity("200Mi"))])),
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), quantity("100m")),
            ("memory".to_owned(), quantity("200Mi")),
        ])),
        ..ResourceRequirements::default()
    }
}

fn pre_stop(command: &[&str]) -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
            }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

/// The VFIO manager DaemonSet: binds the node's GPUs to `vfio-pci` for passthrough, and unbinds them when
/// it stops.
pub(crate) fn vfio_manager(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<OperandPod, RenderError> {
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let manager = Container {
        command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned()]),
        args: Some(vec![
            "vfio-manage bind --all && while true; do sleep 86400; done".to_owned(),
        ]),
        env: Some(vec![env("HOST_ROOT", "/host")]),
        resources: Some(small_resources()),
        volume_mounts: Some(vec![
            mount("host-sys", "/sys"),
            mount_with("host-lib-modules", "/lib/modules", true, None),
            mount(HOST_ROOT_VOLUME, "/host"),
        ]),
        security_context: Some(privileged_s0()),
        lifecycle: Some(pre_stop(&["/bin/sh", "-c", "vfio-manage unbind --all"])),
        ..container(info.daemonset, &image)
    };
    let mut spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        termination_grace_period_seconds: Some(30),
        init_containers: Some(vec![sandbox_driver_manager(
            inputs,
            info,
            ImageSection::VfioDriverManager,
        )?]),
        containers: vec![manager],
        volumes: Some(vec![
            host_path("host-sys", "/sys", Some("Directory")),
            host_path("host-lib-modules", "/lib/modules", Some("Directory")),
            run_nvidia_volume(Some("DirectoryOrCreate")),
            host_root_volume(),
        ]),
        ..PodSpec::default()
    };
    apply_host_paths(&mut spec, &inputs.host_paths);
    let manager = inputs
        .spec
        .vfio_manager
        .as_ref()
        .and_then(|m| m.driver_manager.as_ref());
    apply_manager_sections(
        inputs,
        &mut spec,
        info.image_section,
        ImageSection::VfioDriverManager,
        manager,
    );
    apply_host_network(&mut spec, settings.host_network());
    Ok(OperandPod::new(info, spec).selected_by(&[(NAME_SELECTOR, info.daemonset)]))
}

/// What an init container of [`workload_wait`] waits for: the workload type that needs it, the status
/// file, and the words its loop prints (NVIDIA's, so that the pod templates are the same).
struct WorkloadWait {
    workload: &'static str,
    file: &'static str,
    skipped: &'static str,
    waiting: &'static str,
}

const VFIO_PCI_WAIT: WorkloadWait = WorkloadWait {
    workload: "vm-passthrough",
    file: "vfio-pci-ready",
    skipped: "vfio-pci",
    waiting: "vfio-pci driver ...",
};
const KATA_VFIO_PCI_WAIT: WorkloadWait = WorkloadWait {
    skipped: "kata",
    ..VFIO_PCI_WAIT
};
const VGPU_DEVICES_WAIT: WorkloadWait = WorkloadWait {
    workload: "vm-vgpu",
    file: "vgpu-devices-ready",
    skipped: "vgpu-devices",
    waiting: "vGPU devices...",
};

/// An init container that waits for a status file, but only on nodes whose `workload-type` needs it.
fn workload_wait(inputs: &Inputs<'_>, validator: &PulledImage, name: &str, wait: &WorkloadWait) -> Container {
    let dir = gpuop_api::labels::VALIDATIONS_DIR;
    let WorkloadWait {
        workload,
        file,
        skipped,
        waiting,
    } = wait;
    let script = format!(
        "until [ -f {dir}/workload-type ]; do echo waiting for workload type status file; sleep 5; done; \
         if [ \"$(cat {dir}/workload-type)\" != \"{workload}\" ]; then echo {skipped} not needed, skipping validation; exit 0; fi; \
         until [ -f {dir}/{file} ]; do echo waiting for {waiting}; sleep 5; done;"
    );
    validator_init_container(
        inputs,
        validator,
        name,
        script,
        vec![env("NVIDIA_VISIBLE_DEVICES", "void")],
        vec![mount_with(
            VALIDATIONS_VOLUME,
            dir,
            false,
            Some(Propagation::HostToContainer),
        )],
    )
}

/// The KubeVirt or Kata sandbox device plugin DaemonSet: advertises passthrough GPUs (and, for KubeVirt,
/// vGPU devices) to the kubelet for virtual machines.
pub(crate) fn sandbox_device_plugin(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
) -> Result<OperandPod, RenderError> {
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let kata = info.operand == gpuop_api::Operand::KataSandboxDevicePlugin;
    let vfio_wait = if kata { &KATA_VFIO_PCI_WAIT } else { &VFIO_PCI_WAIT };
    let mut init = vec![workload_wait(
        inputs,
        &validator,
        "vfio-pci-validation",
        vfio_wait,
    )];
    let mut env_vars = vec![
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
    ];
    let mut mounts = vec![mount("device-plugin", "/var/lib/kubelet/device-plugins")];
    let mut volumes = vec![
        host_path("device-plugin", "/var/lib/kubelet/device-plugins", None),
        validations_volume(),
    ];
    if kata {
        env_vars.push(field_env("POD_SERVICE_ACCOUNT", "spec.serviceAccountName"));
    } else {
        init.push(workload_wait(
            inputs,
            &validator,
            "vgpu-devices-validation",
            &VGPU_DEVICES_WAIT,
        ));
        mounts.push(mount("vfio", "/dev/vfio"));
        volumes.push(host_path("vfio", "/dev/vfio", None));
    }
    mounts.push(cdi_root_mount());
    volumes.push(cdi_root_volume());
    let plugin = Container {
        env: Some(env_vars),
        security_context: Some(privileged()),
        volume_mounts: Some(mounts),
        ..container(&format!("{}-ctr", access(info.operand).account), &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        init_containers: Some(init),
        containers: vec![plugin],
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    settings.apply_to(&mut pod.spec.containers[0]);
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(pod)
}

/// The confidential-computing manager DaemonSet: sets the GPUs' CC mode (`DEFAULT_CC_MODE` unless the node
/// asks otherwise) and reports it through `.cc-manager-ctr-ready`.
pub(crate) fn cc_manager(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<OperandPod, RenderError> {
    let image = inputs.image(info.image_section, info)?;
    let settings = inputs.container(info.image_section);
    let manager = Container {
        env: Some(vec![
            field_env("NODE_NAME", "spec.nodeName"),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
        ]),
        resources: Some(small_resources()),
        volume_mounts: Some(vec![
            mount("host-sys", "/sys"),
            mount(RUN_NVIDIA_VOLUME, "/run/nvidia"),
        ]),
        security_context: Some(privileged_s0()),
        lifecycle: Some(pre_stop(&[
            "/bin/rm",
            "-f",
            "/run/nvidia/validations/.cc-manager-ctr-ready",
        ])),
        ..container(info.daemonset, &image)
    };
    let mut spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        termination_grace_period_seconds: Some(30),
        containers: vec![manager],
        volumes: Some(vec![
            host_path("host-sys", "/sys", Some("Directory")),
            run_nvidia_volume(Some("DirectoryOrCreate")),
        ]),
        ..PodSpec::default()
    };
    apply_host_paths(&mut spec, &inputs.host_paths);
    add_pull_secrets(&mut spec, inputs.pull_secrets(info.image_section));
    let ctr = &mut spec.containers[0];
    apply_resources(ctr, settings.resources().as_ref());
    settings.apply_args(ctr);
    if let Some(mode) = inputs
        .spec
        .cc_manager
        .as_ref()
        .and_then(|c| c.default_mode.as_deref())
        .filter(|m| !m.is_empty())
    {
        set_env(ctr, "DEFAULT_CC_MODE", mode);
    }
    apply_env(ctr, settings.env());
    apply_host_network(&mut spec, settings.host_network());
    Ok(OperandPod::new(info, spec).selected_by(&[(NAME_SELECTOR, info.daemonset)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_vgpu_layouts_parse_and_hold_every_type_and_the_default() {
        let parsed: serde_json::Value = serde_saphyr::from_str(&default_vgpu_layouts()).unwrap();
        let layouts = parsed["vgpu-configs"].as_object().unwrap();
        assert_eq!(layouts.len(), TYPES.len() + 1);
        assert_eq!(layouts["A10-12Q"][0]["vgpu-devices"]["A10-12Q"], 2);
        let default = layouts["default"].as_array().unwrap();
        assert_eq!(default.len(), DEFAULTS.len());
        assert!(
            default
                .iter()
                .any(|entry| entry["device-filter"] == "0x223610DE" && entry["vgpu-devices"]["A10-12Q"] == 2)
        );
    }
}
