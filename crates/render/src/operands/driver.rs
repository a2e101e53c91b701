//! The `state-driver` state: NVIDIA's driver container, one DaemonSet per GPU node pool.
//!
//! Pools: NVIDIA renders one `nvidia-driver-daemonset` whose image tag carries the OS of the *first* GPU
//! node it finds, so a second OS gets the wrong image. Here:
//! - one OS among the GPU nodes: exactly NVIDIA's `nvidia-driver-daemonset`;
//! - several: one `nvidia-driver-daemonset-<osTag>` per OS, each selecting its nodes by the NFD OS labels
//!   (`system-os_release.ID` and `VERSION_ID`, or `VERSION_ID.major` where the tag has only the major);
//! - precompiled drivers: one `nvidia-driver-daemonset-<kernel>-<ID><VERSION_ID>` per kernel, as NVIDIA
//!   names them, selecting `kernel-version.full`, with each pool's own OS in the tag;
//! - no GPU node known: no driver DaemonSet (the tag cannot be chosen), only RBAC and the probe ConfigMap.
//!
//! Each pod: the `k8s-driver-manager` init container (evicts GPU pods and unloads old modules before an
//! install), the driver container with its startup probe (which writes `.driver-ctr-ready`), and the
//! `nvidia-peermem`, `nvidia-fs` and `nvidia-gdrcopy` containers when RDMA, GPUDirect Storage or GDRCopy
//! are on. `DRIVER_CONFIG_DIGEST` (a hash of everything that affects the installed driver) lets the
//! driver manager and container skip a reinstall when only unrelated settings changed. Pods are replaced
//! only when deleted (`OnDelete`): the upgrade logic decides when a node's driver is replaced.

use std::collections::BTreeMap;

use gpuop_api::choice::KernelModuleType;
use gpuop_api::labels::{
    COMPONENT, NFD_KERNEL_VERSION, NFD_OS_ID, NFD_OS_VERSION, NFD_OS_VERSION_MAJOR, PRECOMPILED,
};
use gpuop_api::{ImageSection, OperandInfo};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvFromSource, EnvVar, ExecAction, KeyToPath, Lifecycle, LifecycleHandler,
    PodAffinityTerm, PodAntiAffinity, PodSpec, Probe, SecretEnvSource, SecretVolumeSource, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::Serialize;

use crate::daemonset::{OperandPod, Rollout, labels};
use crate::image::{is_digest, pool_os_tag, with_os_suffix};
use crate::inputs::{Inputs, PulledImage, add_pull_secrets, apply_env, apply_host_network, apply_resources};
use crate::manifest::Objects;
use crate::operands::{OperandPods, container, push_script};
use crate::pod::{
    HOST_ROOT_VOLUME, Propagation, apply_host_paths, config_map_volume, env, field_env, file_mount,
    host_path, host_root_mount, host_root_volume, mount, mount_with, privileged, privileged_s0,
    run_nvidia_mount, run_nvidia_volume, set_env,
};
use crate::rbac::access;
use crate::{OsPool, RenderError};

/// The startup probe script, mounted into the driver container.
pub(crate) const STARTUP_PROBE: &str = include_str!("scripts/driver-startup-probe.sh");
/// Name of the ConfigMap holding it.
pub(crate) const STARTUP_PROBE_CONFIG_MAP: &str = "nvidia-driver-startup-probe";
/// The driver container's name (images and `kubectl logs` look for it).
pub(crate) const DRIVER_CONTAINER: &str = "nvidia-driver-ctr";
/// The driver manager init container's name.
const MANAGER_CONTAINER: &str = "k8s-driver-manager";
/// Where kernel module parameters and licensing files go in the driver container.
const DRIVERS_DIR: &str = "/drivers";
/// Variable carrying the hash of the install-relevant configuration.
pub(crate) const DRIVER_CONFIG_DIGEST: &str = "DRIVER_CONFIG_DIGEST";

/// One DaemonSet of an operand whose image is tagged per OS (the driver, the vGPU manager).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OsTarget {
    /// DaemonSet name.
    pub name: String,
    /// `app` label of its pods (the selector).
    pub app: String,
    /// OS id of its nodes.
    pub os_id: String,
    /// OS part of the image tag.
    pub os_tag: String,
    /// Kernel, for precompiled drivers.
    pub kernel: Option<String>,
    /// Node labels it selects on besides the deploy label.
    pub node_selector: BTreeMap<String, String>,
}

/// One DaemonSet per OS tag among the pools: the base name alone when there is one, `<base>-<osTag>` with
/// an OS node selector when there are several.
pub(crate) fn os_targets(
    base: &str,
    section: ImageSection,
    pools: &[OsPool],
) -> Result<Vec<OsTarget>, RenderError> {
    let mut sorted: Vec<&OsPool> = pools.iter().collect();
    sorted.sort();
    let mut by_tag: BTreeMap<String, &OsPool> = BTreeMap::new();
    for pool in sorted {
        by_tag.entry(pool_os_tag(pool, section)?).or_insert(pool);
    }
    let several = by_tag.len() > 1;
    Ok(by_tag
        .into_iter()
        .map(|(os_tag, pool)| {
            let (name, node_selector) = if several {
                let version = match pool.os_id.as_str() {
                    "rhel" | "rocky" | "ol" => (
                        NFD_OS_VERSION_MAJOR,
                        pool.os_version.split('.').next().unwrap_or_default(),
                    ),
                    _ => (NFD_OS_VERSION, pool.os_version.as_str()),
                };
                (
                    format!("{base}-{os_tag}"),
                    labels(&[(NFD_OS_ID, &pool.os_id), version]),
                )
            } else {
                (base.to_owned(), BTreeMap::new())
            };
            OsTarget {
                app: name.clone(),
                name,
                os_id: pool.os_id.clone(),
                os_tag,
                kernel: None,
                node_selector,
            }
        })
        .collect())
}

/// One DaemonSet per kernel, named `<base>-<sanitized kernel>-<ID><VERSION_ID>` and selected by the
/// kernel label, as NVIDIA renders precompiled drivers (all share NVIDIA's `app` label).
fn kernel_targets(base: &str, pools: &[OsPool]) -> Result<Vec<OsTarget>, RenderError> {
    // Sorted, so the same facts in another order give the same DaemonSets (and the same error).
    let mut sorted: Vec<&OsPool> = pools.iter().collect();
    sorted.sort();
    let mut by_kernel: BTreeMap<&str, (&OsPool, String)> = BTreeMap::new();
    for pool in sorted {
        let kernel = pool.kernel.as_deref().filter(|k| !k.is_empty()).ok_or_else(|| {
            RenderError::PoolWithoutKernel {
                os_id: pool.os_id.clone(),
                os_version: pool.os_version.clone(),
            }
        })?;
        let os_tag = pool_os_tag(pool, ImageSection::Driver)?;
        let os = format!("{}{}", pool.os_id, pool.os_version);
        match by_kernel.get(kernel) {
            Some((seen, _)) if format!("{}{}", seen.os_id, seen.os_version) != os => {
                return Err(RenderError::KernelOnSeveralOs {
                    kernel: kernel.to_owned(),
                    first: format!("{}{}", seen.os_id, seen.os_version),
                    second: os,
                });
            }
            Some(_) => {}
            None => {
                by_kernel.insert(kernel, (pool, os_tag));
            }
        }
    }
    Ok(by_kernel
        .into_iter()
        .map(|(kernel, (pool, os_tag))| OsTarget {
            name: format!(
                "{base}-{}-{}{}",
                crate::sanitized_kernel(kernel),
                pool.os_id,
                pool.os_version
            ),
            app: base.to_owned(),
            os_id: pool.os_id.clone(),
            os_tag,
            kernel: Some(kernel.to_owned()),
            node_selector: labels(&[(NFD_KERNEL_VERSION, kernel)]),
        })
        .collect())
}

/// Renders the probe ConfigMap and returns the driver DaemonSets.
pub(crate) fn render(inputs: &Inputs<'_>, info: &OperandInfo, objects: &mut Objects) -> OperandPods {
    push_script(
        objects,
        info,
        STARTUP_PROBE_CONFIG_MAP,
        "startup-probe.sh",
        STARTUP_PROBE.to_owned(),
    );
    let image = inputs.image(ImageSection::Driver, info)?;
    let pools = &inputs.facts.driver_pools;
    let precompiled = inputs.spec.driver.use_precompiled();
    let targets = if precompiled {
        if is_digest(&image.image) {
            return Err(RenderError::PrecompiledDigest { image: image.image });
        }
        kernel_targets(info.daemonset, pools)?
    } else {
        os_targets(info.daemonset, ImageSection::Driver, pools)?
    };
    targets
        .iter()
        .map(|target| driver_pod(inputs, info, &image, target))
        .collect()
}

/// One driver pod for a pool: the builder both the ClusterPolicy's driver and every NVIDIADriver use (an
/// NVIDIADriver's spec is first mapped onto a policy's `spec.driver`, see [`crate::nvidia_driver`]).
pub(crate) fn driver_pod(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
    image: &PulledImage,
    target: &OsTarget,
) -> Result<OperandPod, RenderError> {
    let spec = inputs.spec;
    let driver = &spec.driver;
    let settings = inputs.container(ImageSection::Driver);
    let precompiled = target.kernel.is_some();
    let driver_image = PulledImage {
        image: match &target.kernel {
            Some(kernel) => format!("{}-{kernel}-{}", image.image, target.os_tag),
            None => with_os_suffix(&image.image, &target.os_tag),
        },
        pull_policy: image.pull_policy,
    };
    let rdma = driver.rdma.as_ref().filter(|r| r.is_enabled());
    let host_mofed = rdma.is_some_and(|r| r.use_host_mofed == Some(true));

    let mut pod = PodSpec {
        affinity: Some(one_driver_per_node()),
        service_account_name: Some(access(info.operand).account.to_owned()),
        host_pid: Some(true),
        init_containers: Some(vec![manager_container(inputs, info)?]),
        containers: vec![driver_container(&driver_image)],
        volumes: Some(driver_volumes()),
        ..PodSpec::default()
    };
    if rdma.is_some() {
        pod.containers.push(peermem_container(&driver_image));
    }
    // GPUDirect Storage, then GDRCopy: (on, image, container, installer, kernel module).
    let modules = [
        (
            spec.gds_enabled(),
            ImageSection::Gds,
            "nvidia-fs-ctr",
            "nvidia-gds-driver",
            "nvidia_fs",
        ),
        (
            spec.gdrcopy_enabled(),
            ImageSection::Gdrcopy,
            "nvidia-gdrcopy-ctr",
            "nvidia-gdrcopy-driver",
            "gdrdrv",
        ),
    ];
    for (enabled, section, name, installer, module) in modules {
        if enabled {
            let image = inputs.image(section, info)?;
            pod.containers
                .push(module_container(name, &image, &target.os_tag, installer, module));
        }
    }
    apply_host_paths(&mut pod, &inputs.host_paths);

    // The driver manager.
    let resources = settings.resources();
    if let Some(manager) = pod
        .init_containers
        .iter_mut()
        .flatten()
        .find(|c| c.name == MANAGER_CONTAINER)
    {
        apply_resources(manager, resources.as_ref());
        if rdma.is_some() {
            set_env(manager, "GPU_DIRECT_RDMA_ENABLED", "true");
            if host_mofed {
                set_env(manager, "USE_HOST_MOFED", "true");
            }
        }
        apply_env(
            manager,
            driver
                .manager
                .as_ref()
                .and_then(|m| m.env.as_deref())
                .unwrap_or_default(),
        );
    }
    add_pull_secrets(&mut pod, inputs.pull_secrets(ImageSection::DriverManager));

    // The driver container.
    add_pull_secrets(&mut pod, inputs.pull_secrets(ImageSection::Driver));
    let mut extra_volumes: Vec<Volume> = Vec::new();
    {
        let ctr = &mut pod.containers[0];
        apply_resources(ctr, resources.as_ref());
        settings.apply_args(ctr);
        let module_type = inputs.policy.kernel_module_type;
        set_env(ctr, "KERNEL_MODULE_TYPE", module_type.as_str());
        if module_type == KernelModuleType::Open {
            // Older driver images read only this variable.
            set_env(ctr, "OPEN_KERNEL_MODULES_ENABLED", "true");
        }
        if let Some(probe) = &driver.startup_probe
            && let Some(startup) = ctr.startup_probe.as_mut()
        {
            let set = |target: &mut Option<i32>, value: Option<i32>| {
                if let Some(value) = value.filter(|v| *v != 0) {
                    *target = Some(value);
                }
            };
            set(&mut startup.initial_delay_seconds, probe.initial_delay_seconds);
            set(&mut startup.timeout_seconds, probe.timeout_seconds);
            set(&mut startup.failure_threshold, probe.failure_threshold);
            set(&mut startup.success_threshold, probe.success_threshold);
            set(&mut startup.period_seconds, probe.period_seconds);
        }
        if spec.gdrcopy_enabled() {
            set_env(ctr, "GDRCOPY_ENABLED", "true");
        }
        if spec.gds_enabled() {
            set_env(ctr, "GDS_ENABLED", "true");
        }
        if rdma.is_some() {
            set_env(ctr, "GPU_DIRECT_RDMA_ENABLED", "true");
            if host_mofed {
                set_env(ctr, "USE_HOST_MOFED", "true");
            }
        }
        if driver.is_vgpu_licensing_enabled() {
            let (mounts, volume) = licensing(inputs);
            ctr.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
            extra_volumes.push(volume);
        }
        if let Some(name) = driver
            .virtual_topology
            .as_ref()
            .and_then(|t| t.config.as_deref())
            .filter(|n| !n.is_empty())
        {
            let file = "nvidia-topologyd.conf";
            ctr.volume_mounts.get_or_insert_with(Vec::new).push(file_mount(
                "topology-config",
                "/etc/nvidia/nvidia-topologyd.conf",
                file,
            ));
            extra_volumes.push(config_map_volume("topology-config", name, None, &[(file, file)]));
        }
        if let Some(name) = driver.kernel_module_config.as_ref().and_then(|c| c.get()) {
            let (mounts, volume) =
                config_map_files(inputs, "spec.driver.kernelModuleConfig.name", name, DRIVERS_DIR)?;
            ctr.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
            extra_volumes.push(volume);
        }
        apply_env(ctr, settings.env());
        if precompiled && matches!(target.os_id.as_str(), "sles" | "sl-micro") {
            // Precompiled SUSE images load modules from the host's /lib/modules.
            ctr.volume_mounts.get_or_insert_with(Vec::new).push(mount_with(
                "lib-modules",
                "/run/host/lib/modules",
                true,
                None,
            ));
            extra_volumes.push(host_path("lib-modules", "/lib/modules", Some("Directory")));
        }
    }
    // Repository and certificate files are for building modules; precompiled images need neither (and
    // validation keeps GPUDirect Storage and GDRCopy, which build too, away from them).
    let repo_config = driver
        .repo_config
        .as_ref()
        .and_then(|r| r.config_map_name.as_deref())
        .filter(|n| !n.is_empty() && !precompiled);
    let cert_config = driver
        .cert_config
        .as_ref()
        .and_then(|c| c.get())
        .filter(|_| !precompiled);
    let mut build_mounts: Vec<VolumeMount> = Vec::new();
    // Package repositories, then CA certificates: each ConfigMap's files go where the driver image's OS
    // reads them.
    let dirs = build_config_dirs(&target.os_id);
    let build_configs = [
        (
            repo_config,
            "spec.driver.repoConfig.configMapName",
            dirs.map(|d| d.repos),
        ),
        (cert_config, "spec.driver.certConfig.name", dirs.map(|d| d.certs)),
    ];
    for (name, field, dir) in build_configs {
        let Some(name) = name else {
            continue;
        };
        let dir = dir.ok_or_else(|| RenderError::UnsupportedOsForConfig {
            field,
            os_id: target.os_id.clone(),
        })?;
        let (mounts, volume) = config_map_files(inputs, field, name, dir)?;
        build_mounts.extend(mounts);
        extra_volumes.push(volume);
    }
    let secret_env = driver.secret_env.as_deref().filter(|s| !s.is_empty());
    {
        let ctr = &mut pod.containers[0];
        ctr.volume_mounts
            .get_or_insert_with(Vec::new)
            .extend(build_mounts.iter().cloned());
        if let Some(secret) = secret_env {
            add_secret_env(ctr, secret);
        }
        let subscriptions = subscription_mounts(inputs, &target.os_id, repo_config.is_some());
        if !precompiled && !subscriptions.is_empty() {
            for (index, (path, volume)) in subscriptions.into_iter().enumerate() {
                let name = format!("subscription-config-{index}");
                ctr.volume_mounts
                    .get_or_insert_with(Vec::new)
                    .push(mount_with(&name, path, true, None));
                extra_volumes.push(Volume { name, ..volume });
            }
        }
    }

    // The add-on containers.
    let kernel_module_config = driver.kernel_module_config.as_ref().and_then(|c| c.get());
    for ctr in pod.containers.iter_mut().skip(1) {
        match ctr.name.as_str() {
            "nvidia-peermem-ctr" => {
                if host_mofed {
                    set_env(ctr, "USE_HOST_MOFED", "true");
                }
                if let Some(name) = kernel_module_config {
                    let (mounts, _) =
                        config_map_files(inputs, "spec.driver.kernelModuleConfig.name", name, DRIVERS_DIR)?;
                    ctr.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
                }
            }
            name @ ("nvidia-fs-ctr" | "nvidia-gdrcopy-ctr") => {
                let addon = if name == "nvidia-fs-ctr" {
                    spec.gds.as_ref()
                } else {
                    spec.gdrcopy.as_ref()
                };
                apply_env(ctr, addon.and_then(|a| a.env.as_deref()).unwrap_or_default());
                ctr.volume_mounts
                    .get_or_insert_with(Vec::new)
                    .extend(build_mounts.iter().cloned());
                if let Some(secret) = secret_env {
                    add_secret_env(ctr, secret);
                }
            }
            _ => {}
        }
        apply_resources(ctr, resources.as_ref());
    }
    if spec.gds_enabled() {
        add_pull_secrets(&mut pod, inputs.pull_secrets(ImageSection::Gds));
    }
    if spec.gdrcopy_enabled() {
        add_pull_secrets(&mut pod, inputs.pull_secrets(ImageSection::Gdrcopy));
    }
    if let Some(volumes) = pod.volumes.as_mut() {
        if host_mofed {
            // Build nvidia-peermem against the MOFED sources installed on the host.
            for volume in volumes.iter_mut().filter(|v| v.name == "mlnx-ofed-usr-src") {
                if let Some(source) = volume.host_path.as_mut() {
                    source.path = "/usr/src".to_owned();
                }
            }
        }
        for volume in extra_volumes {
            // Two fields may name the same ConfigMap; one volume serves both.
            if !volumes.iter().any(|v| v.name == volume.name) {
                volumes.push(volume);
            }
        }
    }

    let digest = config_digest(&pod);
    for ctr in pod
        .init_containers
        .iter_mut()
        .flatten()
        .filter(|c| c.name == MANAGER_CONTAINER)
    {
        set_env(ctr, DRIVER_CONFIG_DIGEST, &digest);
    }
    for ctr in pod.containers.iter_mut().filter(|c| c.name == DRIVER_CONTAINER) {
        set_env(ctr, DRIVER_CONFIG_DIGEST, &digest);
    }
    apply_host_network(&mut pod, settings.host_network());

    let mut operand_pod = OperandPod::named(&target.name, pod);
    operand_pod.selector = labels(&[("app", &target.app)]);
    // NVIDIA's asset labels driver pods with their component too (its readiness and the upgrade
    // controller find driver pods by it).
    operand_pod.labels = labels(&[
        (PRECOMPILED, if precompiled { "true" } else { "false" }),
        (COMPONENT, gpuop_api::Operand::Driver.info().component),
    ]);
    operand_pod.annotations = labels(&[("kubectl.kubernetes.io/default-container", DRIVER_CONTAINER)]);
    operand_pod.node_selector = target.node_selector.clone();
    operand_pod.rollout = Rollout::OnDelete;
    Ok(operand_pod)
}

/// At most one driver pod per node, whichever DaemonSet (or NVIDIADriver) it comes from.
fn one_driver_per_node() -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: COMPONENT.to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec!["nvidia-driver".to_owned()]),
                    }]),
                    match_labels: None,
                }),
                topology_key: "kubernetes.io/hostname".to_owned(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// The driver manager: before the driver (re)installs, it evicts GPU pods and unloads the old modules.
pub(crate) fn manager_container(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<Container, RenderError> {
    let image = inputs.image(ImageSection::DriverManager, info)?;
    Ok(driver_manager(
        &image,
        vec![
            env("ENABLE_GPU_POD_EVICTION", "true"),
            env("ENABLE_AUTO_DRAIN", "false"),
            env("DRAIN_USE_FORCE", "false"),
            env("DRAIN_POD_SELECTOR_LABEL", ""),
            env("DRAIN_TIMEOUT_SECONDS", "0s"),
            env("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
        ],
        vec![mellanox_drivers_mount()],
    ))
}

/// The `k8s-driver-manager` init container of a pod that installs a driver (the driver's, the vGPU and
/// VFIO managers'), with what it does to GPU pods (`ENABLE_GPU_POD_EVICTION`, drain settings) and the
/// mounts beyond `/run/nvidia`, the host root and `/sys`.
pub(crate) fn driver_manager(
    image: &PulledImage,
    eviction: Vec<EnvVar>,
    extra_mounts: Vec<VolumeMount>,
) -> Container {
    let mut vars = vec![
        field_env("NODE_NAME", "spec.nodeName"),
        // Driver containers run with runc, never the NVIDIA runtime.
        env("NVIDIA_VISIBLE_DEVICES", "void"),
    ];
    vars.extend(eviction);
    vars.push(field_env("OPERATOR_NAMESPACE", "metadata.namespace"));
    let mut mounts = vec![
        run_nvidia_mount(Propagation::Bidirectional),
        host_root_mount(true),
        mount("host-sys", "/sys"),
    ];
    mounts.extend(extra_mounts);
    Container {
        command: Some(vec!["driver-manager".to_owned()]),
        args: Some(vec!["uninstall_driver".to_owned()]),
        env: Some(vars),
        security_context: Some(privileged()),
        volume_mounts: Some(mounts),
        ..container(MANAGER_CONTAINER, image)
    }
}

fn exec_probe(command: &[&str], initial_delay: i32, period: i32, timeout: i32, failures: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        failure_threshold: Some(failures),
        success_threshold: Some(1),
        ..Probe::default()
    }
}

fn driver_container(image: &PulledImage) -> Container {
    Container {
        command: Some(vec!["nvidia-driver".to_owned()]),
        args: Some(vec!["init".to_owned()]),
        env: Some(vec![
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("NODE_IP", "status.hostIP"),
        ]),
        security_context: Some(privileged_s0()),
        volume_mounts: Some(vec![
            run_nvidia_mount(Propagation::Bidirectional),
            mount("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
            mount("run-nvidia-topologyd", "/run/nvidia-topologyd"),
            mount("var-log", "/var/log"),
            mount("dev-log", "/dev/log"),
            mount_with("host-os-release", "/host-etc/os-release", true, None),
            mount_with(
                "mlnx-ofed-usr-src",
                "/run/mellanox/drivers/usr/src",
                false,
                Some(Propagation::HostToContainer),
            ),
            mellanox_drivers_mount(),
            mount("host-sys-devices-system", "/sys/devices/system"),
            mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
            mount("nv-firmware", "/lib/firmware"),
            VolumeMount {
                sub_path: Some("startup-probe.sh".to_owned()),
                ..mount("driver-startup-probe-script", "/usr/local/bin/startup-probe.sh")
            },
        ]),
        startup_probe: Some(exec_probe(
            &["sh", "/usr/local/bin/startup-probe.sh"],
            60,
            10,
            60,
            120,
        )),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        "/bin/sh".to_owned(),
                        "-c".to_owned(),
                        "rm -f /run/nvidia/validations/.driver-ctr-ready /run/nvidia/validations/.driver-daemons-status"
                            .to_owned(),
                    ]),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        ..container(DRIVER_CONTAINER, image)
    }
}

/// Reloads `nvidia-peermem` whenever a MOFED reinstall unloads it.
fn peermem_container(driver_image: &PulledImage) -> Container {
    let probe_command = ["sh", "-c", "nvidia-driver probe_nvidia_peermem"];
    Container {
        command: Some(vec!["nvidia-driver".to_owned()]),
        args: Some(vec!["reload_nvidia_peermem".to_owned()]),
        security_context: Some(privileged_s0()),
        volume_mounts: Some(vec![
            run_nvidia_mount(Propagation::Bidirectional),
            mount("var-log", "/var/log"),
            mount_with("dev-log", "/dev/log", true, None),
            mellanox_drivers_mount(),
        ]),
        startup_probe: Some(exec_probe(&probe_command, 10, 10, 10, 120)),
        liveness_probe: Some(exec_probe(&probe_command, 30, 30, 10, 1)),
        ..container("nvidia-peermem-ctr", driver_image)
    }
}

/// A container that builds and loads an extra kernel module (`nvidia-fs`, `gdrdrv`) once the driver is
/// installed; its image is tagged per OS like the driver's.
fn module_container(
    name: &str,
    image: &PulledImage,
    os_tag: &str,
    installer: &str,
    module: &str,
) -> Container {
    let tagged = PulledImage {
        image: with_os_suffix(&image.image, os_tag),
        pull_policy: image.pull_policy,
    };
    // NVIDIA's asset text, double space included: a different text restarts the driver pods of a cluster
    // that migrates from NVIDIA's operator.
    let script = format!(
        "until [ -d /run/nvidia/driver/usr/src ] && lsmod | grep nvidia; do echo  Waiting for nvidia-driver to be installed...; sleep 10; done; exec {installer} install"
    );
    Container {
        command: Some(vec!["bash".to_owned(), "-xc".to_owned()]),
        args: Some(vec![script]),
        security_context: Some(privileged_s0()),
        volume_mounts: Some(vec![
            run_nvidia_mount(Propagation::HostToContainer),
            mount("var-log", "/var/log"),
            mount_with("dev-log", "/dev/log", true, None),
        ]),
        startup_probe: Some(exec_probe(
            &["sh", "-c", &format!("lsmod | grep {module}")],
            10,
            10,
            10,
            120,
        )),
        ..container(name, &tagged)
    }
}

/// The MOFED driver directory, where the driver looks for the MOFED modules the host or a MOFED container
/// installs.
fn mellanox_drivers_mount() -> VolumeMount {
    mount_with(
        "run-mellanox-drivers",
        "/run/mellanox/drivers",
        false,
        Some(Propagation::HostToContainer),
    )
}

fn driver_volumes() -> Vec<Volume> {
    vec![
        run_nvidia_volume(Some("DirectoryOrCreate")),
        host_path("var-log", "/var/log", None),
        host_path("dev-log", "/dev/log", None),
        host_path("host-os-release", "/etc/os-release", None),
        host_path(
            "run-nvidia-fabricmanager",
            "/run/nvidia-fabricmanager",
            Some("DirectoryOrCreate"),
        ),
        host_path(
            "run-nvidia-topologyd",
            "/run/nvidia-topologyd",
            Some("DirectoryOrCreate"),
        ),
        host_path(
            "mlnx-ofed-usr-src",
            "/run/mellanox/drivers/usr/src",
            Some("DirectoryOrCreate"),
        ),
        host_path(
            "run-mellanox-drivers",
            "/run/mellanox/drivers",
            Some("DirectoryOrCreate"),
        ),
        crate::pod::validations_volume(),
        host_root_volume(),
        host_path("host-sys", "/sys", Some("Directory")),
        host_path(
            "firmware-search-path",
            "/sys/module/firmware_class/parameters/path",
            None,
        ),
        host_path(
            "host-sys-devices-system",
            "/sys/devices/system",
            Some("Directory"),
        ),
        host_path(
            "nv-firmware",
            "/run/nvidia/driver/lib/firmware",
            Some("DirectoryOrCreate"),
        ),
        config_map_volume(
            "driver-startup-probe-script",
            STARTUP_PROBE_CONFIG_MAP,
            Some(0o755),
            &[],
        ),
    ]
}

/// One read-only file mount per key of a ConfigMap into `dir` (so the image's own files there stay), and
/// the ConfigMap's volume, named after it.
pub(crate) fn config_map_files(
    inputs: &Inputs<'_>,
    field: &'static str,
    name: &str,
    dir: &str,
) -> Result<(Vec<VolumeMount>, Volume), RenderError> {
    let mut keys =
        inputs
            .facts
            .config_map_keys
            .get(name)
            .cloned()
            .ok_or_else(|| RenderError::ConfigMapUnknown {
                field,
                name: name.to_owned(),
                namespace: inputs.facts.namespace.clone(),
            })?;
    keys.sort();
    keys.dedup();
    let mounts = keys
        .iter()
        .map(|key| file_mount(name, &format!("{}/{key}", dir.trim_end_matches('/')), key))
        .collect();
    let items: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), k.as_str())).collect();
    Ok((mounts, config_map_volume(name, name, None, &items)))
}

/// Where the driver image of an OS family reads the files a module build takes from ConfigMaps.
#[derive(Clone, Copy, Debug)]
struct BuildConfigDirs {
    /// Package repository files.
    repos: &'static str,
    /// CA certificates.
    certs: &'static str,
}

/// The build configuration directories of the driver image, by OS id.
fn build_config_dirs(os_id: &str) -> Option<BuildConfigDirs> {
    let (repos, certs) = match os_id {
        "centos" | "rhcos" | "rhel" | "rocky" | "ol" => {
            ("/etc/yum.repos.d", "/etc/pki/ca-trust/extracted/pem")
        }
        "debian" | "ubuntu" => ("/etc/apt/sources.list.d", "/usr/local/share/ca-certificates"),
        "sles" | "sl-micro" => ("/etc/zypp/repos.d", "/etc/pki/trust/anchors"),
        _ => return None,
    };
    Some(BuildConfigDirs { repos, certs })
}

/// The host's subscription files a driver build needs on RHEL (unless the runtime is CRI-O, which mounts
/// them itself, or a repository ConfigMap replaces them) and SLES, by mount path.
fn subscription_mounts(inputs: &Inputs<'_>, os_id: &str, repo_config: bool) -> Vec<(&'static str, Volume)> {
    let host = |path: &str, kind: &str| host_path("", path, Some(kind));
    match os_id {
        "rhel" if inputs.facts.runtime != crate::ContainerRuntime::Crio && !repo_config => vec![
            (
                "/run/secrets/etc-pki-entitlement",
                host("/etc/pki/entitlement", "Directory"),
            ),
            (
                "/run/secrets/redhat.repo",
                host("/etc/yum.repos.d/redhat.repo", "File"),
            ),
            ("/run/secrets/rhsm", host("/etc/rhsm", "Directory")),
        ],
        "sles" | "sl-micro" => vec![
            ("/etc/SUSEConnect", host("/etc/SUSEConnect", "FileOrCreate")),
            (
                "/etc/zypp/credentials.d",
                host("/etc/zypp/credentials.d", "Directory"),
            ),
        ],
        _ => Vec::new(),
    }
}

/// vGPU licensing: `gridd.conf` (and the NLS client token when NLS is on) from the named Secret, or from
/// the deprecated ConfigMap.
fn licensing(inputs: &Inputs<'_>) -> (Vec<VolumeMount>, Volume) {
    let config = inputs.spec.driver.licensing_config.clone().unwrap_or_default();
    let mut files = vec![("gridd.conf", "/drivers/gridd.conf")];
    if config.is_nls_enabled() {
        files.push((
            "client_configuration_token.tok",
            "/drivers/ClientConfigToken/client_configuration_token.tok",
        ));
    }
    let mounts = files
        .iter()
        .map(|(key, path)| file_mount("licensing-config", path, key))
        .collect();
    let items: Vec<KeyToPath> = files
        .iter()
        .map(|(key, _)| KeyToPath {
            key: (*key).to_owned(),
            path: (*key).to_owned(),
            mode: None,
        })
        .collect();
    let volume = match config.secret_name.as_deref().filter(|s| !s.is_empty()) {
        Some(secret) => Volume {
            name: "licensing-config".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_owned()),
                items: Some(items),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        None => {
            let name = config.config_map_name.unwrap_or_default();
            let pairs: Vec<(&str, &str)> = files.iter().map(|(key, _)| (*key, *key)).collect();
            config_map_volume("licensing-config", &name, None, &pairs)
        }
    };
    (mounts, volume)
}

/// Every key of the Secret becomes a variable of the container.
fn add_secret_env(container: &mut Container, secret: &str) {
    container
        .env_from
        .get_or_insert_with(Vec::new)
        .push(EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: secret.to_owned(),
                optional: None,
            }),
            ..EnvFromSource::default()
        });
}

/// What the installed driver depends on, in a stable form: images, the driver's command, literal
/// environment (sorted), secret environment, mounts and volumes (sorted), and the host root.
#[derive(Debug, Default, Serialize)]
struct InstallState<'a> {
    manager_image: Option<&'a str>,
    manager_env: Vec<(&'a str, &'a str)>,
    driver_image: Option<&'a str>,
    driver_command: Option<&'a [String]>,
    driver_args: Option<&'a [String]>,
    driver_env: Vec<(&'a str, &'a str)>,
    driver_secret_env: Vec<&'a str>,
    driver_mounts: Vec<MountState<'a>>,
    peermem_image: Option<&'a str>,
    gds_image: Option<&'a str>,
    gds_env: Vec<(&'a str, &'a str)>,
    gdrcopy_image: Option<&'a str>,
    gdrcopy_env: Vec<(&'a str, &'a str)>,
    volumes: Vec<VolumeState<'a>>,
    host_root: Option<&'a str>,
}

/// A mount, as far as the install depends on it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
struct MountState<'a> {
    name: &'a str,
    path: &'a str,
    sub_path: Option<&'a str>,
    read_only: bool,
}

/// A volume, as far as the install depends on it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
struct VolumeState<'a> {
    name: &'a str,
    config_map: Option<&'a str>,
    secret: Option<&'a str>,
    host_path: Option<&'a str>,
}

fn literal_env(container: &Container) -> Vec<(&str, &str)> {
    let mut vars: Vec<(&str, &str)> = container
        .env
        .iter()
        .flatten()
        .filter(|var| var.value_from.is_none() && var.name != DRIVER_CONFIG_DIGEST)
        .map(|var| (var.name.as_str(), var.value.as_deref().unwrap_or_default()))
        .collect();
    vars.sort_unstable();
    vars
}

/// `DRIVER_CONFIG_DIGEST`: FNV-1a (32 bit, decimal, as NVIDIA prints it) of the install state. It changes
/// exactly when something that affects the installed driver changes; its value differs from NVIDIA's
/// (which hashes Go's printing of its own struct), so pods adopted from NVIDIA's operator reinstall once.
pub(crate) fn config_digest(pod: &PodSpec) -> String {
    let mut state = InstallState::default();
    for ctr in pod.init_containers.iter().flatten() {
        if ctr.name == MANAGER_CONTAINER {
            state.manager_image = ctr.image.as_deref();
            state.manager_env = literal_env(ctr);
        }
    }
    for ctr in &pod.containers {
        match ctr.name.as_str() {
            DRIVER_CONTAINER => {
                state.driver_image = ctr.image.as_deref();
                state.driver_command = ctr.command.as_deref();
                state.driver_args = ctr.args.as_deref();
                state.driver_env = literal_env(ctr);
                state.driver_secret_env = ctr
                    .env_from
                    .iter()
                    .flatten()
                    .filter_map(|source| source.secret_ref.as_ref().map(|s| s.name.as_str()))
                    .collect();
                let mut mounts: Vec<_> = ctr
                    .volume_mounts
                    .iter()
                    .flatten()
                    .map(|m| MountState {
                        name: m.name.as_str(),
                        path: m.mount_path.as_str(),
                        sub_path: m.sub_path.as_deref(),
                        read_only: m.read_only.unwrap_or(false),
                    })
                    .collect();
                mounts.sort_unstable();
                state.driver_mounts = mounts;
            }
            "nvidia-peermem-ctr" => state.peermem_image = ctr.image.as_deref(),
            "nvidia-fs-ctr" => {
                state.gds_image = ctr.image.as_deref();
                state.gds_env = literal_env(ctr);
            }
            "nvidia-gdrcopy-ctr" => {
                state.gdrcopy_image = ctr.image.as_deref();
                state.gdrcopy_env = literal_env(ctr);
            }
            _ => {}
        }
    }
    let mut volumes: Vec<_> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| VolumeState {
            name: v.name.as_str(),
            config_map: v.config_map.as_ref().map(|c| c.name.as_str()),
            secret: v.secret.as_ref().and_then(|s| s.secret_name.as_deref()),
            host_path: v.host_path.as_ref().map(|h| h.path.as_str()),
        })
        .collect();
    volumes.sort_unstable();
    state.host_root = volumes
        .iter()
        .find(|v| v.name == HOST_ROOT_VOLUME)
        .and_then(|v| v.host_path);
    state.volumes = volumes;
    // Serializing plain strings, tuples and vectors cannot fail.
    let text = serde_json::to_string(&state).unwrap_or_default();
    fnv1a32(text.as_bytes()).to_string()
}

/// 32-bit FNV-1a.
pub(crate) fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(os_id: &str, os_version: &str, kernel: Option<&str>) -> OsPool {
        OsPool {
            os_id: os_id.into(),
            os_version: os_version.into(),
            kernel: kernel.map(str::to_owned),
        }
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn one_os_keeps_nvidias_name_and_several_get_one_daemonset_each() {
        let one = os_targets(
            "nvidia-driver-daemonset",
            ImageSection::Driver,
            &[pool("ubuntu", "22.04", None)],
        )
        .unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "nvidia-driver-daemonset");
        assert!(one[0].node_selector.is_empty());

        let two = os_targets(
            "nvidia-driver-daemonset",
            ImageSection::Driver,
            &[
                pool("ubuntu", "22.04", None),
                pool("rhel", "9.4", None),
                pool("rhel", "9.2", None),
            ],
        )
        .unwrap();
        let names: Vec<&str> = two.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia-driver-daemonset-rhel9",
                "nvidia-driver-daemonset-ubuntu22.04"
            ]
        );
        assert_eq!(
            two[0].node_selector,
            labels(&[(NFD_OS_ID, "rhel"), (NFD_OS_VERSION_MAJOR, "9")])
        );
        assert_eq!(
            two[1].node_selector,
            labels(&[(NFD_OS_ID, "ubuntu"), (NFD_OS_VERSION, "22.04")])
        );
    }

    #[test]
    fn precompiled_targets_are_per_kernel_and_refuse_ambiguity() {
        let targets = kernel_targets(
            "nvidia-driver-daemonset",
            &[
                pool("rhel", "9.4", Some("5.14.0-427.13.1.el9_4.x86_64")),
                pool("ubuntu", "22.04", Some("5.15.0-105-generic")),
            ],
        )
        .unwrap();
        let names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia-driver-daemonset-5.14.0-427.13.1.el9.4-rhel9.4",
                "nvidia-driver-daemonset-5.15.0-105-generic-ubuntu22.04",
            ]
        );
        assert!(targets.iter().all(|t| t.app == "nvidia-driver-daemonset"));
        assert_eq!(targets[0].os_tag, "rhel9");

        assert_eq!(
            kernel_targets(
                "nvidia-driver-daemonset",
                &[
                    pool("ubuntu", "22.04", Some("6.8.0")),
                    pool("ubuntu", "24.04", Some("6.8.0"))
                ]
            ),
            Err(RenderError::KernelOnSeveralOs {
                kernel: "6.8.0".into(),
                first: "ubuntu22.04".into(),
                second: "ubuntu24.04".into()
            })
        );
        assert_eq!(
            kernel_targets("nvidia-driver-daemonset", &[pool("ubuntu", "22.04", None)]),
            Err(RenderError::PoolWithoutKernel {
                os_id: "ubuntu".into(),
                os_version: "22.04".into()
            })
        );
    }
}
