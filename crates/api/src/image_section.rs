//! The sections of a ClusterPolicy that name an image, as a type: a section is looked up by the compiler,
//! not by a string, so a misspelt one cannot silently fall back to defaults.

use std::fmt;

use crate::cluster_policy::ClusterPolicySpec;
use crate::component::{ContainerSpec, ImageSpec};

/// A ClusterPolicy section with an image of its own. Ordered by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ImageSection {
    /// `spec.ccManager`.
    CcManager,
    /// `spec.dcgm`.
    Dcgm,
    /// `spec.dcgmExporter`.
    DcgmExporter,
    /// `spec.devicePlugin` (also the MPS control daemon's, and the MIG manager's in feature discovery).
    DevicePlugin,
    /// `spec.driver`.
    Driver,
    /// `spec.driver.manager`: the driver manager init container.
    DriverManager,
    /// `spec.gdrcopy`.
    Gdrcopy,
    /// `spec.gds`.
    Gds,
    /// `spec.gfd`.
    Gfd,
    /// `spec.kataManager`.
    KataManager,
    /// `spec.kataSandboxDevicePlugin`.
    KataSandboxDevicePlugin,
    /// `spec.migManager`.
    MigManager,
    /// `spec.nodeStatusExporter`.
    NodeStatusExporter,
    /// `spec.operator.initContainer`.
    OperatorInitContainer,
    /// `spec.sandboxDevicePlugin`.
    SandboxDevicePlugin,
    /// `spec.toolkit`.
    Toolkit,
    /// `spec.validator`.
    Validator,
    /// `spec.vfioManager`.
    VfioManager,
    /// `spec.vfioManager.driverManager`.
    VfioDriverManager,
    /// `spec.vgpuDeviceManager`.
    VgpuDeviceManager,
    /// `spec.vgpuManager`.
    VgpuManager,
    /// `spec.vgpuManager.driverManager`.
    VgpuDriverManager,
}

impl ImageSection {
    /// Every section, in the order of the ClusterPolicy's fields (the order problems are reported in).
    pub const ALL: [ImageSection; 22] = [
        ImageSection::Driver,
        ImageSection::DriverManager,
        ImageSection::Toolkit,
        ImageSection::DevicePlugin,
        ImageSection::DcgmExporter,
        ImageSection::Dcgm,
        ImageSection::NodeStatusExporter,
        ImageSection::Gfd,
        ImageSection::OperatorInitContainer,
        ImageSection::MigManager,
        ImageSection::Validator,
        ImageSection::Gds,
        ImageSection::Gdrcopy,
        ImageSection::VfioManager,
        ImageSection::VfioDriverManager,
        ImageSection::SandboxDevicePlugin,
        ImageSection::VgpuManager,
        ImageSection::VgpuDriverManager,
        ImageSection::VgpuDeviceManager,
        ImageSection::KataManager,
        ImageSection::CcManager,
        ImageSection::KataSandboxDevicePlugin,
    ];

    /// The section's path in the ClusterPolicy, as field errors name it.
    pub const fn path(self) -> &'static str {
        match self {
            ImageSection::CcManager => "spec.ccManager",
            ImageSection::Dcgm => "spec.dcgm",
            ImageSection::DcgmExporter => "spec.dcgmExporter",
            ImageSection::DevicePlugin => "spec.devicePlugin",
            ImageSection::Driver => "spec.driver",
            ImageSection::DriverManager => "spec.driver.manager",
            ImageSection::Gdrcopy => "spec.gdrcopy",
            ImageSection::Gds => "spec.gds",
            ImageSection::Gfd => "spec.gfd",
            ImageSection::KataManager => "spec.kataManager",
            ImageSection::KataSandboxDevicePlugin => "spec.kataSandboxDevicePlugin",
            ImageSection::MigManager => "spec.migManager",
            ImageSection::NodeStatusExporter => "spec.nodeStatusExporter",
            ImageSection::OperatorInitContainer => "spec.operator.initContainer",
            ImageSection::SandboxDevicePlugin => "spec.sandboxDevicePlugin",
            ImageSection::Toolkit => "spec.toolkit",
            ImageSection::Validator => "spec.validator",
            ImageSection::VfioManager => "spec.vfioManager",
            ImageSection::VfioDriverManager => "spec.vfioManager.driverManager",
            ImageSection::VgpuDeviceManager => "spec.vgpuDeviceManager",
            ImageSection::VgpuManager => "spec.vgpuManager",
            ImageSection::VgpuDriverManager => "spec.vgpuManager.driverManager",
        }
    }

    /// The section's image settings, when the policy has the section.
    pub fn image(self, spec: &ClusterPolicySpec) -> Option<&ImageSpec> {
        Some(match self {
            ImageSection::CcManager => &spec.cc_manager.as_ref()?.component.image,
            ImageSection::Dcgm => &spec.dcgm.component.image,
            ImageSection::DcgmExporter => &spec.dcgm_exporter.component.image,
            ImageSection::DevicePlugin => &spec.device_plugin.component.image,
            ImageSection::Driver => &spec.driver.image,
            ImageSection::DriverManager => &spec.driver.manager.as_ref()?.image,
            ImageSection::Gdrcopy => &spec.gdrcopy.as_ref()?.image,
            ImageSection::Gds => &spec.gds.as_ref()?.image,
            ImageSection::Gfd => &spec.gpu_feature_discovery.component.image,
            ImageSection::KataManager => &spec.kata_manager.as_ref()?.component.image,
            ImageSection::KataSandboxDevicePlugin => &spec.kata_sandbox_device_plugin.as_ref()?.image,
            ImageSection::MigManager => &spec.mig_manager.as_ref()?.component.image,
            ImageSection::NodeStatusExporter => &spec.node_status_exporter.component.image,
            ImageSection::OperatorInitContainer => spec.operator.init_container.as_ref()?,
            ImageSection::SandboxDevicePlugin => &spec.sandbox_device_plugin.as_ref()?.image,
            ImageSection::Toolkit => &spec.toolkit.component.image,
            ImageSection::Validator => &spec.validator.as_ref()?.image,
            ImageSection::VfioManager => &spec.vfio_manager.as_ref()?.component.image,
            ImageSection::VfioDriverManager => &spec.vfio_manager.as_ref()?.driver_manager.as_ref()?.image,
            ImageSection::VgpuDeviceManager => &spec.vgpu_device_manager.as_ref()?.component.image,
            ImageSection::VgpuManager => &spec.vgpu_manager.as_ref()?.component.image,
            ImageSection::VgpuDriverManager => &spec.vgpu_manager.as_ref()?.driver_manager.as_ref()?.image,
        })
    }

    /// The section's container settings (resources, args, env), when it has them and the policy has the
    /// section; the driver managers, GPUDirect Storage, GDRCopy and the init container have none.
    pub fn container(self, spec: &ClusterPolicySpec) -> Option<&ContainerSpec> {
        Some(match self {
            ImageSection::CcManager => &spec.cc_manager.as_ref()?.component.container,
            ImageSection::Dcgm => &spec.dcgm.component.container,
            ImageSection::DcgmExporter => &spec.dcgm_exporter.component.container,
            ImageSection::DevicePlugin => &spec.device_plugin.component.container,
            ImageSection::Driver => &spec.driver.container,
            ImageSection::Gfd => &spec.gpu_feature_discovery.component.container,
            ImageSection::KataManager => &spec.kata_manager.as_ref()?.component.container,
            ImageSection::KataSandboxDevicePlugin => &spec.kata_sandbox_device_plugin.as_ref()?.container,
            ImageSection::MigManager => &spec.mig_manager.as_ref()?.component.container,
            ImageSection::NodeStatusExporter => &spec.node_status_exporter.component.container,
            ImageSection::SandboxDevicePlugin => &spec.sandbox_device_plugin.as_ref()?.container,
            ImageSection::Toolkit => &spec.toolkit.component.container,
            ImageSection::Validator => &spec.validator.as_ref()?.container,
            ImageSection::VfioManager => &spec.vfio_manager.as_ref()?.component.container,
            ImageSection::VgpuDeviceManager => &spec.vgpu_device_manager.as_ref()?.component.container,
            ImageSection::VgpuManager => &spec.vgpu_manager.as_ref()?.component.container,
            ImageSection::DriverManager
            | ImageSection::Gdrcopy
            | ImageSection::Gds
            | ImageSection::OperatorInitContainer
            | ImageSection::VfioDriverManager
            | ImageSection::VgpuDriverManager => return None,
        })
    }
}

impl fmt::Display for ImageSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_section_once_and_ordered_by_path() {
        let mut sorted = ImageSection::ALL;
        sorted.sort();
        let paths: Vec<&str> = sorted.iter().map(|s| s.path()).collect();
        let mut by_text = paths.clone();
        by_text.sort_unstable();
        by_text.dedup();
        assert_eq!(
            paths, by_text,
            "the variants are declared in path order, each once"
        );
        assert_eq!(ImageSection::Driver.to_string(), "spec.driver");
    }

    #[test]
    fn a_default_policy_has_the_required_sections() {
        let spec = ClusterPolicySpec::default();
        for section in [
            ImageSection::Driver,
            ImageSection::Toolkit,
            ImageSection::DevicePlugin,
        ] {
            assert!(section.image(&spec).is_some(), "{section}");
            assert!(section.container(&spec).is_some(), "{section}");
        }
        assert!(ImageSection::DriverManager.container(&spec).is_none());
    }
}
