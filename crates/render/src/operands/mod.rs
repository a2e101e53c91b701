//! One module per operand (or family of operands), each rendering the objects of its ClusterPolicy state:
//! ServiceAccount and RBAC first, then ConfigMaps, Services, ServiceMonitors and the DaemonSet(s).
//!
//! Each operand's DaemonSet is built the way NVIDIA's asset plus transform builds it: the pod NVIDIA ships,
//! then `hostPaths` rewrites, then the operand's policy settings in NVIDIA's order (so where both set a
//! variable, the same one wins), then the settings every DaemonSet shares ([`crate::daemonset`]).

use gpuop_api::{ImageSection, Operand, OperandInfo};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Volume, VolumeMount};

use crate::RenderError;
use crate::daemonset::{OperandPod, daemonset};
use crate::inputs::{Inputs, PulledImage, add_pull_secrets};
use crate::manifest::{Objects, Owner, meta};
use crate::pod::{apply_host_paths, config_map_volume, file_mount};
use crate::rbac::push_access;

mod dcgm;
mod device_plugin;
pub(crate) mod driver;
mod feature_discovery;
mod metrics;
mod mig_layouts;
mod mig_manager;
mod node_status_exporter;
mod runtime_class;
mod sandbox;
mod toolkit;
mod validator;
mod vgpu_layouts;

pub(crate) use metrics::operator_metrics;
pub(crate) use runtime_class::runtime_classes;

/// What an operand's renderer returns: the pods of its DaemonSets (it pushes its other objects itself).
pub(crate) type OperandPods = Result<Vec<OperandPod>, RenderError>;

/// Renders the objects of an enabled operand's state.
pub(crate) fn operand(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
    objects: &mut Objects,
) -> Result<(), RenderError> {
    push_access(objects, info);
    let owner = Owner::operand(info);
    let pods = match info.operand {
        Operand::Driver => driver::render(inputs, info, objects)?,
        Operand::ContainerToolkit => toolkit::render(inputs, info, objects)?,
        Operand::OperatorValidator => vec![validator::operator_validator(inputs, info)?],
        Operand::DevicePlugin => device_plugin::render(inputs, info, objects)?,
        Operand::MpsControlDaemon => vec![device_plugin::mps_control_daemon(inputs, info)?],
        Operand::Dcgm => dcgm::render_host_engine(inputs, info, objects)?,
        Operand::DcgmExporter => dcgm::render_exporter(inputs, info, objects)?,
        Operand::GpuFeatureDiscovery => vec![feature_discovery::render(inputs, info)?],
        Operand::MigManager => mig_manager::render(inputs, info, objects)?,
        Operand::NodeStatusExporter => node_status_exporter::render(inputs, info, objects)?,
        Operand::VgpuManager => sandbox::vgpu_manager(inputs, info, objects)?,
        Operand::VgpuDeviceManager => sandbox::vgpu_device_manager(inputs, info, objects)?,
        Operand::SandboxValidator => vec![validator::sandbox_validator(inputs, info)?],
        Operand::VfioManager => vec![sandbox::vfio_manager(inputs, info)?],
        Operand::SandboxDevicePlugin | Operand::KataSandboxDevicePlugin => {
            vec![sandbox::sandbox_device_plugin(inputs, info)?]
        }
        Operand::CcManager => vec![sandbox::cc_manager(inputs, info)?],
    };
    for pod in pods {
        objects.push(owner, daemonset(inputs, info, pod));
    }
    Ok(())
}

/// A ConfigMap holding files, with the operand's `app` label as NVIDIA sets it on entrypoint ConfigMaps.
pub(crate) fn config_map(name: &str, app: Option<&str>, files: &[(&str, String)]) -> ConfigMap {
    let labels: Vec<(&str, &str)> = app.map(|app| ("app", app)).into_iter().collect();
    ConfigMap {
        metadata: meta(name, &labels),
        data: Some(
            files
                .iter()
                .map(|(key, text)| ((*key).to_owned(), text.clone()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// Adds the ConfigMap that ships one of an operand's scripts under `key`, with the operand's `app` label.
pub(crate) fn push_script(
    objects: &mut Objects,
    info: &OperandInfo,
    config_map_name: &str,
    key: &str,
    script: String,
) {
    objects.push(
        Owner::operand(info),
        config_map(config_map_name, Some(info.daemonset), &[(key, script)]),
    );
}

/// The lines of an entrypoint script that [`DRIVER_READY_PRELUDE`] stands for.
const DRIVER_READY_INCLUDE: &str = "# @include driver-ready-prelude.sh\n";
/// What the entrypoints of the operands that need a driver start with: wait for the validator's
/// `driver-ready` and export what it found (driver root, device root, host or container driver).
const DRIVER_READY_PRELUDE: &str = include_str!("scripts/driver-ready-prelude.sh");

/// An operand's entrypoint script: shipped in a ConfigMap of its own, mounted at `/bin/entrypoint.sh` and
/// run by `/bin/sh -c` as the main container's command.
pub(crate) struct Entrypoint {
    /// Name of the ConfigMap, and of the volume that mounts it.
    pub config_map: &'static str,
    /// The script, with a `# @include driver-ready-prelude.sh` line where [`DRIVER_READY_PRELUDE`] goes.
    pub script: &'static str,
}

impl Entrypoint {
    /// Adds the script's ConfigMap, labelled as NVIDIA labels entrypoint ConfigMaps.
    pub(crate) fn push_config_map(&self, objects: &mut Objects, info: &OperandInfo) {
        let script = self
            .script
            .replacen(DRIVER_READY_INCLUDE, DRIVER_READY_PRELUDE, 1);
        push_script(objects, info, self.config_map, "entrypoint.sh", script);
    }

    /// A container of an operand image that runs the script.
    pub(crate) fn container(&self, name: &str, image: &PulledImage) -> Container {
        Container {
            command: Some(vec!["/bin/sh".to_owned(), "-c".to_owned()]),
            args: Some(vec!["/bin/entrypoint.sh".to_owned()]),
            ..container(name, image)
        }
    }

    /// The mount of the script at `/bin/entrypoint.sh`.
    pub(crate) fn mount(&self) -> VolumeMount {
        file_mount(self.config_map, "/bin/entrypoint.sh", "entrypoint.sh")
    }

    /// The volume of the script's ConfigMap, its files executable by their owner.
    pub(crate) fn volume(&self) -> Volume {
        config_map_volume(self.config_map, self.config_map, Some(0o700), &[])
    }
}

/// A container of an operand image, with its pull policy.
pub(crate) fn container(name: &str, image: &PulledImage) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.image.clone()),
        image_pull_policy: Some(image.pull_policy.to_owned()),
        ..Container::default()
    }
}

/// The DaemonSet pod of an operand whose init containers run the validator image: the `hostPaths` rewrites
/// applied, and the validator's pull secrets added before the operand's own (NVIDIA's order).
pub(crate) fn validated_pod(inputs: &Inputs<'_>, info: &OperandInfo, mut spec: PodSpec) -> OperandPod {
    apply_host_paths(&mut spec, &inputs.host_paths);
    add_pull_secrets(&mut spec, inputs.pull_secrets(ImageSection::Validator));
    add_pull_secrets(&mut spec, inputs.pull_secrets(info.image_section));
    OperandPod::new(info, spec)
}
