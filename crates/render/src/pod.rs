//! Building blocks of operand pods: environment variables, host-path and ConfigMap volumes, mounts,
//! security contexts, the init containers that wait on the node's status files, and the `hostPaths`
//! rewrites (`rootFS`, `driverInstallDir`) that NVIDIA applies to every operand pod before its own
//! settings.

use gpuop_api::catalogue::status_file;
use gpuop_api::cluster_policy::{DEFAULT_DRIVER_INSTALL_DIR, DEFAULT_ROOT_FS, HostPathsSpec};
use gpuop_api::labels::VALIDATIONS_DIR;
use gpuop_api::{Operand, OperandInfo};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource,
    KeyToPath, ObjectFieldSelector, PodSpec, SELinuxOptions, SecurityContext, Volume, VolumeMount,
};

use crate::inputs::PulledImage;

/// Name of the host-path volume of `/run/nvidia/validations`.
pub(crate) const VALIDATIONS_VOLUME: &str = "run-nvidia-validations";
/// Name of the host-path volume of the host's root filesystem (rewritten by `hostPaths.rootFS`).
pub(crate) const HOST_ROOT_VOLUME: &str = "host-root";
/// Name of the host-path volume of the host's `/dev/char` (rewritten by `hostPaths.rootFS`).
pub(crate) const HOST_DEV_CHAR_VOLUME: &str = "host-dev-char";
/// Name of the host-path volume of the driver install directory (rewritten by `hostPaths.driverInstallDir`).
pub(crate) const DRIVER_INSTALL_DIR_VOLUME: &str = "driver-install-dir";

/// A variable with a literal value.
pub(crate) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        // An empty value is stored as none (Go's `omitempty`): rendered as kube-apiserver keeps it, so that
        // comparing with a live object (drift, `render --diff-live`) finds no change where there is none.
        value: (!value.is_empty()).then(|| value.to_owned()),
        value_from: None,
    }
}

/// A variable from a field of the pod (`spec.nodeName`, `metadata.namespace`, ...).
pub(crate) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Sets a variable's value, replacing the variable of that name or appending it (NVIDIA's rule, so a
/// later setting — e.g. the policy's `env` — wins over an earlier one).
pub(crate) fn set_env(container: &mut Container, name: &str, value: &str) {
    let vars = container.env.get_or_insert_with(Vec::new);
    match vars.iter_mut().find(|var| var.name == name) {
        Some(var) => {
            var.value = Some(value.to_owned());
            var.value_from = None;
        }
        None => vars.push(env(name, value)),
    }
}

/// The literal value of a variable, if the container has one.
pub(crate) fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container
        .env
        .as_deref()?
        .iter()
        .find(|var| var.name == name)
        .and_then(|var| var.value.as_deref())
}

/// A host-path volume; `kind` is the hostPath `type` (`Directory`, `DirectoryOrCreate`, ...), if any.
pub(crate) fn host_path(name: &str, path: &str, kind: Option<&str>) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: kind.map(str::to_owned),
        }),
        ..Volume::default()
    }
}

/// A ConfigMap volume; `items` maps keys to paths (all keys when empty).
pub(crate) fn config_map_volume(
    name: &str,
    config_map: &str,
    mode: Option<i32>,
    items: &[(&str, &str)],
) -> Volume {
    Volume {
        name: name.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_owned(),
            default_mode: mode,
            items: (!items.is_empty()).then(|| {
                items
                    .iter()
                    .map(|(key, path)| KeyToPath {
                        key: (*key).to_owned(),
                        path: (*path).to_owned(),
                        mode: None,
                    })
                    .collect()
            }),
            optional: None,
        }),
        ..Volume::default()
    }
}

/// An emptyDir volume.
pub(crate) fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// A read-write mount.
pub(crate) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        ..VolumeMount::default()
    }
}

/// How a mount sees mounts made later on the other side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    /// Mounts made on the host show up in the container.
    HostToContainer,
    /// And the other way round.
    Bidirectional,
}

/// A mount with options.
pub(crate) fn mount_with(
    name: &str,
    path: &str,
    read_only: bool,
    propagation: Option<Propagation>,
) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        mount_propagation: propagation.map(|p| {
            match p {
                Propagation::HostToContainer => "HostToContainer",
                Propagation::Bidirectional => "Bidirectional",
            }
            .to_owned()
        }),
        ..VolumeMount::default()
    }
}

/// A read-only mount of one key of a ConfigMap volume as a file.
pub(crate) fn file_mount(name: &str, path: &str, key: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        sub_path: Some(key.to_owned()),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// `privileged: true`.
pub(crate) fn privileged() -> SecurityContext {
    SecurityContext {
        privileged: Some(true),
        ..SecurityContext::default()
    }
}

/// `privileged: true` with the SELinux level `s0` NVIDIA gives containers that load kernel modules or
/// write host directories.
pub(crate) fn privileged_s0() -> SecurityContext {
    SecurityContext {
        privileged: Some(true),
        se_linux_options: Some(SELinuxOptions {
            level: Some("s0".to_owned()),
            ..SELinuxOptions::default()
        }),
        ..SecurityContext::default()
    }
}

/// Runs a validator container as root: validations chroot into the host and write the status files in a
/// directory the kubelet created.
pub(crate) fn run_as_root(container: &mut Container) {
    container
        .security_context
        .get_or_insert_with(SecurityContext::default)
        .run_as_user = Some(0);
}

/// The host-path volume of the status files.
pub(crate) fn validations_volume() -> Volume {
    host_path(VALIDATIONS_VOLUME, VALIDATIONS_DIR, Some("DirectoryOrCreate"))
}

/// Status files that also satisfy a wait on this one: the validator writes `host-vgpu-manager-ready` instead
/// of `vgpu-manager-ready` when the vGPU manager is installed on the host.
// A status-file protocol fact; it belongs in `gpuop_api::catalogue::status_file` next to the names.
fn alternatives(file: &str) -> &'static [&'static str] {
    if file == status_file::VGPU_MANAGER_READY {
        &["host-vgpu-manager-ready"]
    } else {
        &[]
    }
}

/// The init container name NVIDIA gives a wait on a status file: `toolkit-ready` → `toolkit-validation`.
pub(crate) fn wait_container_name(file: &str) -> String {
    format!("{}-validation", file.trim_end_matches("-ready"))
}

/// Name of the host-path volume of `/run/nvidia`, which some of NVIDIA's assets mount in their waiting init
/// container instead of the status-file directory alone.
pub(crate) const RUN_NVIDIA_VOLUME: &str = "run-nvidia";

/// The host-path volume of `/run/nvidia`, as the asset of the operand that mounts it declares it (`kind` is
/// its hostPath `type`: `Directory` in most, none in the DCGM exporter's).
pub(crate) fn run_nvidia_volume(kind: Option<&str>) -> Volume {
    host_path(RUN_NVIDIA_VOLUME, "/run/nvidia", kind)
}

/// `/run/nvidia` (volume [`RUN_NVIDIA_VOLUME`]) mounted at the same path: `Bidirectional` in the pods that
/// install a driver there, `HostToContainer` in those that use it.
pub(crate) fn run_nvidia_mount(propagation: Propagation) -> VolumeMount {
    mount_with(RUN_NVIDIA_VOLUME, "/run/nvidia", false, Some(propagation))
}

/// The host's root filesystem (volume [`HOST_ROOT_VOLUME`]) mounted at `/host`, seeing the host's later
/// mounts.
pub(crate) fn host_root_mount(read_only: bool) -> VolumeMount {
    mount_with(
        HOST_ROOT_VOLUME,
        "/host",
        read_only,
        Some(Propagation::HostToContainer),
    )
}

/// The host-path volume of the host's root filesystem (rewritten by `hostPaths.rootFS`).
pub(crate) fn host_root_volume() -> Volume {
    host_path(HOST_ROOT_VOLUME, "/", None)
}

/// The driver install directory (volume [`DRIVER_INSTALL_DIR_VOLUME`]) mounted at `path`, seeing the
/// driver container's later mounts.
pub(crate) fn driver_install_dir_mount(path: &str) -> VolumeMount {
    mount_with(
        DRIVER_INSTALL_DIR_VOLUME,
        path,
        false,
        Some(Propagation::HostToContainer),
    )
}

/// The host-path volume of the driver install directory, created when missing (rewritten by
/// `hostPaths.driverInstallDir`).
pub(crate) fn driver_install_dir_volume() -> Volume {
    host_path(
        DRIVER_INSTALL_DIR_VOLUME,
        "/run/nvidia/driver",
        Some("DirectoryOrCreate"),
    )
}

/// Name of the host-path volume of the CDI spec directory.
const CDI_ROOT_VOLUME: &str = "cdi-root";

/// The host's CDI spec directory mounted at the same path.
pub(crate) fn cdi_root_mount() -> VolumeMount {
    mount(CDI_ROOT_VOLUME, "/var/run/cdi")
}

/// The host-path volume of the CDI spec directory, created when missing.
pub(crate) fn cdi_root_volume() -> Volume {
    host_path(CDI_ROOT_VOLUME, "/var/run/cdi", Some("DirectoryOrCreate"))
}

/// How NVIDIA's asset of an operand spells its waiting init container: the echo text, and what it mounts.
/// Matched word for word because the pod template is compared whole: a different text or mount restarts
/// every pod of a cluster that migrates from NVIDIA's operator (docs/migrate.md).
struct WaitStyle {
    /// What the loop prints; `None` for operands whose NVIDIA asset has no such container to match.
    echo: Option<&'static str>,
    /// Mounts `/run/nvidia` (volume [`RUN_NVIDIA_VOLUME`]) rather than `/run/nvidia/validations`.
    run_nvidia: bool,
    /// The propagation of the mount.
    propagation: Propagation,
}

fn wait_style(operand: Operand) -> WaitStyle {
    const STACK: Option<&str> = Some("waiting for nvidia container stack to be setup");
    let style = |echo, run_nvidia, propagation| WaitStyle {
        echo,
        run_nvidia,
        propagation,
    };
    match operand {
        Operand::DevicePlugin => style(STACK, false, Propagation::HostToContainer),
        Operand::MpsControlDaemon | Operand::GpuFeatureDiscovery | Operand::Dcgm | Operand::DcgmExporter => {
            style(STACK, true, Propagation::HostToContainer)
        }
        Operand::MigManager => style(
            Some("waiting for nvidia container toolkit to be setup"),
            false,
            Propagation::HostToContainer,
        ),
        Operand::VgpuDeviceManager => style(
            Some("waiting for NVIDIA vGPU Manager to be setup"),
            false,
            Propagation::Bidirectional,
        ),
        _ => style(None, false, Propagation::HostToContainer),
    }
}

/// The status files an operand's pod waits on in init containers. The catalogue's chain is what the
/// operand needs; NVIDIA's MIG manager asset waits only for the toolkit in an init container, its
/// entrypoint script waits for `driver-ready` itself.
fn init_waits(info: &OperandInfo) -> &'static [&'static str] {
    if info.operand == Operand::MigManager {
        &[status_file::TOOLKIT_READY]
    } else {
        info.waits_for
    }
}

/// One init container per status file the operand waits on (see [`init_waits`]), in order: a shell loop in
/// the validator image that polls `/run/nvidia/validations` (mounted with `HostToContainer` propagation,
/// so files written by other pods show up) every five seconds, spelled as NVIDIA's asset spells it.
pub(crate) fn status_file_waits(info: &OperandInfo, validator: &PulledImage) -> Vec<Container> {
    let style = wait_style(info.operand);
    init_waits(info)
        .iter()
        .map(|file| {
            let test = std::iter::once(*file)
                .chain(alternatives(file).iter().copied())
                .map(|f| format!("[ -f {VALIDATIONS_DIR}/{f} ]"))
                .collect::<Vec<_>>()
                .join(" || ");
            let echo = style
                .echo
                .map_or_else(|| format!("waiting for {file} on this node"), str::to_owned);
            let script = format!("until {test}; do echo {echo}; sleep 5; done");
            let (volume, path) = if style.run_nvidia {
                (RUN_NVIDIA_VOLUME, "/run/nvidia")
            } else {
                (VALIDATIONS_VOLUME, VALIDATIONS_DIR)
            };
            let mut container = Container {
                name: wait_container_name(file),
                image: Some(validator.image.clone()),
                image_pull_policy: Some(validator.pull_policy.to_owned()),
                command: Some(vec!["sh".to_owned(), "-c".to_owned()]),
                args: Some(vec![script]),
                security_context: Some(privileged()),
                volume_mounts: Some(vec![mount_with(volume, path, false, Some(style.propagation))]),
                ..Container::default()
            };
            run_as_root(&mut container);
            container
        })
        .collect()
}

/// Applies `hostPaths.rootFS` and `hostPaths.driverInstallDir` to a pod that mounts those host paths, as
/// NVIDIA does before an operand's own settings (so the operand's `env` can still override):
/// - a custom root rewrites the `host-root` volume, points `host-dev-char` at `<root>/dev/char`, and sets
///   `HOST_ROOT=<root>` in every container;
/// - a custom driver install directory rewrites the `driver-install-dir` volume and, in the
///   `driver-validation` init container, mounts it at the same path and sets `DRIVER_INSTALL_DIR` and
///   `DRIVER_INSTALL_DIR_CTR_PATH`.
pub(crate) fn apply_host_paths(pod: &mut PodSpec, host_paths: &HostPathsSpec) {
    let root = host_paths.root_fs();
    if root != DEFAULT_ROOT_FS {
        let mut has_host_root = false;
        for volume in pod.volumes.iter_mut().flatten() {
            let Some(source) = volume.host_path.as_mut() else {
                continue;
            };
            if volume.name == HOST_ROOT_VOLUME {
                source.path = root.to_owned();
                has_host_root = true;
            } else if volume.name == HOST_DEV_CHAR_VOLUME {
                source.path = format!("{}/dev/char", root.trim_end_matches('/'));
            }
        }
        if has_host_root {
            let containers = pod
                .init_containers
                .iter_mut()
                .flatten()
                .chain(pod.containers.iter_mut());
            for container in containers {
                set_env(container, "HOST_ROOT", root);
            }
        }
    }
    let install_dir = host_paths.driver_install_dir();
    if install_dir != DEFAULT_DRIVER_INSTALL_DIR {
        let Some(source) = pod
            .volumes
            .iter_mut()
            .flatten()
            .find(|v| v.name == DRIVER_INSTALL_DIR_VOLUME)
            .and_then(|v| v.host_path.as_mut())
        else {
            return;
        };
        source.path = install_dir.to_owned();
        if let Some(validation) = pod
            .init_containers
            .iter_mut()
            .flatten()
            .find(|c| c.name == "driver-validation")
        {
            set_env(validation, "DRIVER_INSTALL_DIR", install_dir);
            set_env(validation, "DRIVER_INSTALL_DIR_CTR_PATH", install_dir);
            for mount in validation.volume_mounts.iter_mut().flatten() {
                if mount.name == DRIVER_INSTALL_DIR_VOLUME {
                    mount.mount_path = install_dir.to_owned();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_env_replaces_in_place_or_appends() {
        let mut container = Container {
            env: Some(vec![env("A", "1"), field_env("B", "spec.nodeName")]),
            ..Container::default()
        };
        set_env(&mut container, "B", "2");
        set_env(&mut container, "C", "3");
        let vars: Vec<(String, Option<String>, bool)> = container
            .env
            .unwrap()
            .into_iter()
            .map(|v| (v.name, v.value, v.value_from.is_some()))
            .collect();
        assert_eq!(
            vars,
            [
                ("A".into(), Some("1".into()), false),
                ("B".into(), Some("2".into()), false),
                ("C".into(), Some("3".into()), false),
            ]
        );
    }

    #[test]
    fn wait_names_follow_nvidia() {
        assert_eq!(wait_container_name("toolkit-ready"), "toolkit-validation");
        assert_eq!(
            wait_container_name("vgpu-manager-ready"),
            "vgpu-manager-validation"
        );
    }
}
