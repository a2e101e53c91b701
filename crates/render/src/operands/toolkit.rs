//! The `state-container-toolkit` state: NVIDIA's container toolkit, which installs the NVIDIA runtime on
//! the host, configures the node's container runtime for it (handlers `nvidia`, `nvidia-cdi`,
//! `nvidia-legacy`) and writes the management CDI spec.
//!
//! Its pod first runs the validator's driver step (which waits for a working driver and writes
//! `driver-ready`); the entrypoint then takes over what the validator found and starts the installer.
//! The environment is the installer's contract:
//! - `RUNTIME` (`containerd`, `crio`, `docker`), the runtime's config file, drop-in file and socket as
//!   paths inside the container (`/runtime/config-dir/...`, `/runtime/config-dir.d/...`,
//!   `/runtime/sock-dir/...`) with their host directories mounted there; host paths can be changed
//!   through `toolkit.env` (`CONTAINERD_CONFIG`, `CONTAINERD_SOCKET`, `RUNTIME_DROP_IN_CONFIG`, ...);
//! - `CONTAINERD_RUNTIME_CLASS` = `operator.runtimeClass`, so the handler matches the RuntimeClass;
//! - with CDI: `CDI_ENABLED=true`, `NVIDIA_RUNTIME_SET_AS_DEFAULT=false` (workloads get GPUs through CDI,
//!   not a default runtime), `NVIDIA_CONTAINER_RUNTIME_MODE=cdi`, `CRIO_CONFIG_MODE=config`; without CDI
//!   on CRI-O, `CRIO_CONFIG_MODE=hook` (the OCI hook, as before CDI);
//! - with the NRI plugin: `ENABLE_NRI_PLUGIN=true` and only the NRI socket mounted, since the runtime's
//!   configuration is then left alone.

use gpuop_api::cluster_policy::DEFAULT_TOOLKIT_INSTALL_DIR;
use gpuop_api::labels::CDI_MANAGEMENT_GPU;
use gpuop_api::{ImageSection, OperandInfo};
use k8s_openapi::api::core::v1::{Container, PodSpec, Volume};

use crate::ContainerRuntime;
use crate::inputs::{Inputs, apply_env, apply_host_network};
use crate::manifest::Objects;
use crate::operands::validator::{
    apply_driver_validation_env, driver_validation, toolkit_driver_validation_mounts,
};
use crate::operands::{Entrypoint, OperandPods, validated_pod};
use crate::pod::{
    HOST_DEV_CHAR_VOLUME, VALIDATIONS_VOLUME, cdi_root_mount, cdi_root_volume, driver_install_dir_mount,
    driver_install_dir_volume, env, env_value, field_env, host_path, host_root_mount, host_root_volume,
    mount, privileged_s0, set_env, validations_volume,
};
use crate::rbac::access;

/// The entrypoint script.
const ENTRYPOINT: Entrypoint = Entrypoint {
    config_map: "nvidia-container-toolkit-entrypoint",
    script: include_str!("scripts/toolkit-entrypoint.sh"),
};
/// The toolkit container's name.
const TOOLKIT_CONTAINER: &str = "nvidia-container-toolkit-ctr";
/// Where the runtime's top-level config directory is mounted in the container.
const CONFIG_DIR: &str = "/runtime/config-dir/";
/// Where the runtime's drop-in config directory is mounted.
const DROP_IN_DIR: &str = "/runtime/config-dir.d/";
/// Where the runtime's socket directory is mounted.
const SOCKET_DIR: &str = "/runtime/sock-dir/";
/// Where the runtime's NRI socket directory is mounted.
const NRI_SOCKET_DIR: &str = "/runtime/nri-sock-dir/";

/// Renders the entrypoint ConfigMap and returns the toolkit DaemonSet.
pub(crate) fn render(inputs: &Inputs<'_>, info: &OperandInfo, objects: &mut Objects) -> OperandPods {
    ENTRYPOINT.push_config_map(objects, info);
    let validator = inputs.validator_image(info)?;
    let image = inputs.image(ImageSection::Toolkit, info)?;
    let toolkit = Container {
        env: Some(vec![
            env("ROOT", DEFAULT_TOOLKIT_INSTALL_DIR),
            env(
                "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND",
                CDI_MANAGEMENT_GPU,
            ),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env("TOOLKIT_PID_FILE", "/run/nvidia/toolkit/toolkit.pid"),
            field_env("NRI_NAMESPACE", "metadata.namespace"),
        ]),
        security_context: Some(privileged_s0()),
        volume_mounts: Some(vec![
            ENTRYPOINT.mount(),
            mount("toolkit-root", "/run/nvidia/toolkit"),
            mount(VALIDATIONS_VOLUME, "/run/nvidia/validations"),
            mount("toolkit-install-dir", DEFAULT_TOOLKIT_INSTALL_DIR),
            mount("crio-hooks", "/usr/share/containers/oci/hooks.d"),
            driver_install_dir_mount("/driver-root"),
            host_root_mount(true),
            cdi_root_mount(),
        ]),
        ..ENTRYPOINT.container(TOOLKIT_CONTAINER, &image)
    };
    let spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        host_pid: Some(true),
        init_containers: Some(vec![driver_validation(
            inputs,
            &validator,
            toolkit_driver_validation_mounts(),
        )]),
        containers: vec![toolkit],
        volumes: Some(vec![
            ENTRYPOINT.volume(),
            host_path("toolkit-root", "/run/nvidia/toolkit", Some("DirectoryOrCreate")),
            validations_volume(),
            driver_install_dir_volume(),
            host_root_volume(),
            host_path("toolkit-install-dir", DEFAULT_TOOLKIT_INSTALL_DIR, None),
            // CRI-O reads OCI hooks from /usr/share/containers/oci/hooks.d; NVIDIA keeps /run/... for
            // other runtimes (OpenShift's CRI-O reads it).
            host_path(
                "crio-hooks",
                if inputs.facts.runtime == ContainerRuntime::Crio {
                    "/usr/share/containers/oci/hooks.d"
                } else {
                    "/run/containers/oci/hooks.d"
                },
                None,
            ),
            host_path(HOST_DEV_CHAR_VOLUME, "/dev/char", None),
            cdi_root_volume(),
        ]),
        ..PodSpec::default()
    };
    let mut pod = validated_pod(inputs, info, spec);
    apply_driver_validation_env(inputs, &mut pod.spec);

    let settings = inputs.container(ImageSection::Toolkit);
    settings.apply_resources_to_containers(&mut pod.spec);
    let mut volumes = Vec::new();
    {
        let ctr = &mut pod.spec.containers[0];
        if inputs.spec.cdi_enabled() {
            set_env(ctr, "CDI_ENABLED", "true");
            set_env(ctr, "NVIDIA_RUNTIME_SET_AS_DEFAULT", "false");
            set_env(ctr, "NVIDIA_CONTAINER_RUNTIME_MODE", "cdi");
            set_env(ctr, "CRIO_CONFIG_MODE", "config");
            if inputs.spec.nri_plugin_enabled() {
                set_env(ctr, "ENABLE_NRI_PLUGIN", "true");
            }
        } else if inputs.facts.runtime == ContainerRuntime::Crio {
            set_env(ctr, "CRIO_CONFIG_MODE", "hook");
        }
        let install_dir = inputs.spec.toolkit.install_dir();
        if install_dir != DEFAULT_TOOLKIT_INSTALL_DIR {
            set_env(ctr, "ROOT", install_dir);
            for mount in ctr.volume_mounts.iter_mut().flatten() {
                if mount.name == "toolkit-install-dir" {
                    mount.mount_path = install_dir.to_owned();
                }
            }
        }
        apply_env(ctr, settings.env());
        set_env(ctr, "RUNTIME", inputs.facts.runtime.as_str());
        if inputs.spec.nri_plugin_enabled() {
            volumes.extend(nri_socket(ctr));
        } else {
            if inputs.facts.runtime == ContainerRuntime::Containerd {
                set_env(
                    ctr,
                    "CONTAINERD_RUNTIME_CLASS",
                    inputs.spec.operator.runtime_class(),
                );
            }
            volumes.extend(runtime_config(ctr, inputs.facts.runtime));
        }
    }
    let install_dir = inputs.spec.toolkit.install_dir();
    for volume in pod.spec.volumes.iter_mut().flatten() {
        if volume.name == "toolkit-install-dir"
            && let Some(source) = volume.host_path.as_mut()
        {
            source.path = install_dir.to_owned();
        }
    }
    pod.spec.volumes.get_or_insert_with(Vec::new).extend(volumes);
    apply_host_network(&mut pod.spec, settings.host_network());
    Ok(vec![pod])
}

/// Mounts the NRI socket's directory and points `NRI_SOCKET` into it.
fn nri_socket(ctr: &mut Container) -> Vec<Volume> {
    let socket = env_value(ctr, "NRI_SOCKET")
        .filter(|s| !s.is_empty())
        .unwrap_or("/var/run/nri/nri.sock")
        .to_owned();
    let (dir, file) = split_path(&socket);
    set_env(ctr, "NRI_SOCKET", &format!("{NRI_SOCKET_DIR}{file}"));
    ctr.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount("nri-socket", NRI_SOCKET_DIR));
    vec![host_path("nri-socket", dir, Some("DirectoryOrCreate"))]
}

/// Mounts the runtime's config, drop-in and socket directories and points the installer at them.
fn runtime_config(ctr: &mut Container, runtime: ContainerRuntime) -> Vec<Volume> {
    let name = runtime.as_str();
    let first = |ctr: &Container, keys: &[&str], default: &str| -> String {
        keys.iter()
            .find_map(|key| env_value(ctr, key).filter(|v| !v.is_empty()))
            .unwrap_or(default)
            .to_owned()
    };
    let (config_var, config, drop_in) = match runtime {
        ContainerRuntime::Containerd => (
            "CONTAINERD_CONFIG",
            first(
                ctr,
                &["CONTAINERD_CONFIG", "RUNTIME_CONFIG"],
                "/etc/containerd/config.toml",
            ),
            Some(first(
                ctr,
                &["RUNTIME_DROP_IN_CONFIG"],
                "/etc/containerd/conf.d/99-nvidia.toml",
            )),
        ),
        ContainerRuntime::Crio => (
            "CRIO_CONFIG",
            first(ctr, &["CRIO_CONFIG", "RUNTIME_CONFIG"], "/etc/crio/config.toml"),
            Some(first(
                ctr,
                &["RUNTIME_DROP_IN_CONFIG"],
                "/etc/crio/crio.conf.d/99-nvidia.conf",
            )),
        ),
        ContainerRuntime::Docker => (
            "DOCKER_CONFIG",
            first(
                ctr,
                &["DOCKER_CONFIG", "RUNTIME_CONFIG"],
                "/etc/docker/daemon.json",
            ),
            None,
        ),
    };
    let mut volumes = Vec::new();
    let mut mount_dir = |ctr: &mut Container, volume: String, host_dir: &str, target: &str, kind| {
        ctr.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(&volume, target));
        volumes.push(host_path(&volume, host_dir, kind));
    };

    let (dir, file) = split_path(&config);
    set_env(ctr, "RUNTIME_CONFIG", &format!("{CONFIG_DIR}{file}"));
    set_env(ctr, config_var, &format!("{CONFIG_DIR}{file}"));
    mount_dir(
        ctr,
        format!("{name}-config"),
        dir,
        CONFIG_DIR,
        Some("DirectoryOrCreate"),
    );

    if let Some(drop_in) = drop_in {
        let (dir, file) = split_path(&drop_in);
        set_env(ctr, "RUNTIME_DROP_IN_CONFIG", &format!("{DROP_IN_DIR}{file}"));
        set_env(ctr, "RUNTIME_DROP_IN_CONFIG_HOST_PATH", &drop_in);
        mount_dir(
            ctr,
            format!("{name}-drop-in-config"),
            dir,
            DROP_IN_DIR,
            Some("DirectoryOrCreate"),
        );
    }

    // `file=<host path>` config sources are read through the host root mounted at /host.
    if let Some(sources) = env_value(ctr, "RUNTIME_CONFIG_SOURCE").filter(|s| !s.is_empty()) {
        let rewritten: Vec<String> = sources
            .split(',')
            .map(|source| match source.split_once('=') {
                Some(("file", path)) => format!("file=/host/{}", path.trim_start_matches('/')),
                _ => source.to_owned(),
            })
            .collect();
        set_env(ctr, "RUNTIME_CONFIG_SOURCE", &rewritten.join(","));
    }

    // CRI-O is restarted through systemd, so the toolkit needs no socket for it.
    let socket = match runtime {
        ContainerRuntime::Containerd => Some((
            "CONTAINERD_SOCKET",
            first(ctr, &["CONTAINERD_SOCKET"], "/run/containerd/containerd.sock"),
        )),
        ContainerRuntime::Docker => Some((
            "DOCKER_SOCKET",
            first(ctr, &["DOCKER_SOCKET"], "/var/run/docker.sock"),
        )),
        ContainerRuntime::Crio => None,
    };
    if let Some((socket_var, socket)) = socket {
        let (dir, file) = split_path(&socket);
        set_env(ctr, "RUNTIME_SOCKET", &format!("{SOCKET_DIR}{file}"));
        set_env(ctr, socket_var, &format!("{SOCKET_DIR}{file}"));
        mount_dir(ctr, format!("{name}-socket"), dir, SOCKET_DIR, None);
    }
    volumes
}

/// Directory and file name of a host path (`/etc/containerd/config.toml` → `/etc/containerd`, `config.toml`).
fn split_path(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some(("", file)) => ("/", file),
        Some((dir, file)) => (dir, file),
        None => (".", path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_split_into_directory_and_file() {
        assert_eq!(
            split_path("/etc/containerd/config.toml"),
            ("/etc/containerd", "config.toml")
        );
        assert_eq!(split_path("/nri.sock"), ("/", "nri.sock"));
    }
}
