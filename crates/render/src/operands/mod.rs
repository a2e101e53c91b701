//! One module per operand (or family of operands), each rendering the objects of its ClusterPolicy state:
//! ServiceAccount and RBAC first, then ConfigMaps, Services, ServiceMonitors and the DaemonSet(s).
//!
//! Each operand's DaemonSet is built the way NVIDIA's asset plus transform builds it: the pod NVIDIA ships,
//! then `hostPaths` rewrites, then the operand's policy settings in NVIDIA's order (so where both set a
//! variable, the same one wins), then the settings every DaemonSet shares ([`crate::daemonset`]).

use gpuop_api::{ImageSection, Operand, OperandInfo};
use k8s_openapi::api::core::v1::{ConfigMap, Container};

use crate::RenderError;
use crate::daemonset::{OperandPod, daemonset};
use crate::inputs::{Inputs, PulledImage, add_pull_secrets};
use crate::manifest::{Objects, Owner, meta};
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

/// A container of an operand image, with its pull policy.
pub(crate) fn container(name: &str, image: &PulledImage) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.image.clone()),
        image_pull_policy: Some(image.pull_policy.to_owned()),
        ..Container::default()
    }
}

/// Adds the validator's pull secrets to a pod whose init containers run the validator image (NVIDIA adds
/// them before the operand's own).
pub(crate) fn add_validator_pull_secrets(inputs: &Inputs<'_>, pod: &mut OperandPod) {
    add_pull_secrets(&mut pod.spec, inputs.pull_secrets(ImageSection::Validator));
}
