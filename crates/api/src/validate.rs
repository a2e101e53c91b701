//! Validation of a `ClusterPolicy` or `NVIDIADriver` beyond what its schema says: enumerations, counts and
//! percentages, images of every enabled operand, cross-field rules, and values the API server would refuse
//! in the objects rendered from the policy (labels, tolerations, paths).
//!
//! [`validate`] returns every problem at once, each naming its field, the bad value and what is accepted;
//! or a [`ValidatedPolicy`] with the parsed values the renderer needs. [`warnings`] lists what is allowed
//! but probably not meant (deprecated fields, pull policies NVIDIA's operator silently replaces).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::OPERANDS;
use crate::choice::{
    CcMode, DriverType, KernelModuleType, MigDefault, MigStrategy, RelabelAction, SandboxMode,
    UpdateStrategy, WorkloadConfig,
};
use crate::cluster_policy::{ClusterPolicy, ClusterPolicySpec, ServiceMonitorConfig};
use crate::component::{ContainerSpec, EnvVar, ImageRef, ImageSpec, non_empty};
use crate::driver::{ContainerProbeSpec, DriverAddonSpec, UpgradeRules};
use crate::field::{FieldError, child, item};
use crate::image_section::ImageSection;
use crate::labels::{
    DRIVER_OWNER, WORKLOAD_CONFIG, dns_subdomain_problem, label_key_problem, label_value_problem,
};
use crate::nvidia_driver::{NVIDIADriver, NVIDIADriverSpec};

/// The format of a Kubernetes quantity (`500m`, `1Gi`, `2`).
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
/// The format of a Prometheus duration (`15s`, `1m30s`).
pub const DURATION_PATTERN: &str =
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$";
/// First GPUDirect Storage version that needs the open kernel modules.
const GDS_OPEN_MODULES_FROM: (u64, u64, u64) = (2, 17, 5);

/// Images the operator takes from its environment when the policy names none (`DRIVER_IMAGE`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageDefaults(BTreeMap<String, String>);

impl ImageDefaults {
    /// Defaults from (environment variable, image) pairs; empty values are ignored.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .filter(|(_, v): &(String, String)| !v.is_empty())
                .collect(),
        )
    }

    /// Names of every environment variable an image can come from.
    pub fn variable_names() -> Vec<&'static str> {
        let mut names: Vec<&str> = OPERANDS.iter().map(|info| info.image_env).collect();
        names.extend([
            "DRIVER_MANAGER_IMAGE",
            "GDS_IMAGE",
            "GDRCOPY_IMAGE",
            "CUDA_BASE_IMAGE",
        ]);
        names.sort_unstable();
        names.dedup();
        names
    }

    fn get(&self, variable: &str) -> Option<&str> {
        self.0.get(variable).map(String::as_str)
    }
}

/// A count or a percentage, as `maxUnavailable` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOrPercent {
    /// An absolute number.
    Count(u32),
    /// A percentage, 0 to 100.
    Percent(u32),
}

impl IntOrPercent {
    /// Parses `3` or `25%`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.strip_suffix('%') {
            Some(percent) => percent.parse().ok().filter(|p| *p <= 100).map(Self::Percent),
            None => text.parse().ok().map(Self::Count),
        }
    }

    /// The count this stands for among `total`, a percentage rounded up (as the upgrade controller does).
    pub fn scaled_up(self, total: u32) -> u32 {
        match self {
            Self::Count(count) => count,
            Self::Percent(percent) => (u64::from(total) * u64::from(percent)).div_ceil(100) as u32,
        }
    }

    /// The Kubernetes representation.
    pub fn to_int_or_string(self) -> IntOrString {
        match self {
            Self::Count(count) => IntOrString::Int(count as i32),
            Self::Percent(percent) => IntOrString::String(format!("{percent}%")),
        }
    }
}

/// Sandbox settings of a policy that turns sandbox workloads on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sandbox {
    /// Virtualisation stack.
    pub mode: SandboxMode,
    /// Workload of GPU nodes without a workload label.
    pub default_workload: WorkloadConfig,
}

impl Sandbox {
    /// The sandbox settings `spec` asks for, `None` when sandbox workloads are off. A value validation would
    /// refuse falls back to its default here (validation reports it); the doctor reads unvalidated policies.
    pub fn of(spec: &ClusterPolicySpec) -> Option<Self> {
        check_sandbox(spec, &mut Vec::new())
    }

    /// A node's workload and the sandbox mode it runs with, the one rule the labeller and the doctor both
    /// follow: `container` unless sandbox workloads are on; then the node's own
    /// `nvidia.com/gpu.workload.config` label when it names a workload, else the policy's default.
    pub fn node_workload(
        sandbox: Option<Self>,
        labels: &(impl crate::read::Labels + ?Sized),
    ) -> (WorkloadConfig, SandboxMode) {
        match sandbox {
            None => (WorkloadConfig::Container, SandboxMode::KubeVirt),
            Some(sandbox) => {
                let own = labels.get_label(WORKLOAD_CONFIG).and_then(WorkloadConfig::parse);
                (own.unwrap_or(sandbox.default_workload), sandbox.mode)
            }
        }
    }
}

/// A ClusterPolicy that passed validation, with its enumerations parsed and its images resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedPolicy {
    /// Name of the ClusterPolicy.
    pub name: String,
    /// Its spec, unchanged.
    pub spec: ClusterPolicySpec,
    /// `spec.mig.strategy`; `None` lets the device plugin decide.
    pub mig_strategy: Option<MigStrategy>,
    /// How operand DaemonSets (all but the driver's) roll out changes.
    pub update_strategy: UpdateStrategy,
    /// `spec.daemonsets.rollingUpdate.maxUnavailable`, when set.
    pub max_unavailable: Option<IntOrPercent>,
    /// Kernel modules the driver loads.
    pub kernel_module_type: KernelModuleType,
    /// Sandbox settings, when sandbox workloads are on.
    pub sandbox: Option<Sandbox>,
    /// Layout stamped on MIG-capable nodes without one.
    pub mig_default_layout: Option<String>,
    /// Resolved image of every enabled section.
    pub images: BTreeMap<ImageSection, String>,
}

impl ValidatedPolicy {
    /// The resolved image of a section (see [`OperandInfo::image_section`](crate::OperandInfo::image_section)).
    pub fn image(&self, section: ImageSection) -> Option<&str> {
        self.images.get(&section).map(String::as_str)
    }
}

/// Validates a ClusterPolicy with no image defaults from the environment.
pub fn validate(policy: &ClusterPolicy) -> Result<ValidatedPolicy, Vec<FieldError>> {
    validate_with(policy, &ImageDefaults::default())
}

/// Validates a ClusterPolicy; images the policy leaves unset may come from `defaults`.
pub fn validate_with(
    policy: &ClusterPolicy,
    defaults: &ImageDefaults,
) -> Result<ValidatedPolicy, Vec<FieldError>> {
    let spec = &policy.spec;
    let mut errors = Vec::new();
    let mig_strategy = choice(
        spec.mig_strategy(),
        "spec.mig.strategy",
        MigStrategy::parse,
        MigStrategy::VALUES,
        &mut errors,
    );
    let update_strategy = choice(
        spec.daemonsets.update_strategy.as_deref(),
        "spec.daemonsets.updateStrategy",
        UpdateStrategy::parse,
        UpdateStrategy::VALUES,
        &mut errors,
    )
    .unwrap_or(UpdateStrategy::RollingUpdate);
    let kernel_module_type = choice(
        spec.driver.kernel_module_type.as_deref(),
        "spec.driver.kernelModuleType",
        KernelModuleType::parse,
        KernelModuleType::VALUES,
        &mut errors,
    )
    .unwrap_or(KernelModuleType::Auto);
    let sandbox = check_sandbox(spec, &mut errors);
    let mig_default_layout = check_mig_manager(spec, &mut errors);
    if let Some(mode) = spec.cc_manager.as_ref().and_then(|cc| cc.default_mode.as_deref()) {
        choice(
            Some(mode),
            "spec.ccManager.defaultMode",
            CcMode::parse,
            CcMode::VALUES,
            &mut errors,
        );
    }
    let max_unavailable = check_rolling_update(spec, &mut errors);
    check_daemonsets(spec, &mut errors);
    check_driver(spec, kernel_module_type, &mut errors);
    check_containers(spec, &mut errors);
    check_exporter(spec, &mut errors);
    check_cross_fields(spec, &mut errors);
    let images = resolve_images(spec, defaults, &mut errors);

    if errors.is_empty() {
        Ok(ValidatedPolicy {
            name: policy.metadata.name.clone().unwrap_or_default(),
            spec: spec.clone(),
            mig_strategy,
            update_strategy,
            max_unavailable,
            kernel_module_type,
            sandbox,
            mig_default_layout,
            images,
        })
    } else {
        Err(errors)
    }
}

/// What is allowed but probably not meant: deprecated fields and pull policies replaced by `IfNotPresent`.
pub fn warnings(policy: &ClusterPolicy) -> Vec<FieldError> {
    let spec = &policy.spec;
    let mut found = Vec::new();
    let deprecated = |found: &mut Vec<FieldError>, path: &str, set: bool, instead: &str| {
        if set {
            found.push(FieldError::forbidden(
                path,
                format!("is deprecated and ignored; {instead}"),
            ));
        }
    };
    deprecated(
        &mut found,
        "spec.operator.defaultRuntime",
        spec.operator.default_runtime.is_some(),
        "the runtime is detected from each node",
    );
    deprecated(
        &mut found,
        "spec.operator.initContainer",
        spec.operator.init_container.is_some(),
        "remove it",
    );
    deprecated(
        &mut found,
        "spec.driver.useOpenKernelModules",
        spec.driver.use_open_kernel_modules.is_some(),
        "use spec.driver.kernelModuleType",
    );
    deprecated(
        &mut found,
        "spec.psp",
        spec.psp.as_ref().is_some_and(|psp| psp.enabled == Some(true)),
        "PodSecurityPolicy is gone; use spec.psa",
    );
    deprecated(
        &mut found,
        "spec.kataManager.enabled",
        spec.kata_manager_enabled(),
        "the Kata manager is never deployed",
    );
    deprecated(
        &mut found,
        "spec.cdi.default",
        spec.cdi.as_ref().is_some_and(|cdi| cdi.default.is_some()),
        "remove it",
    );
    deprecated(
        &mut found,
        "spec.dcgm.hostPort",
        spec.dcgm.host_port.is_some(),
        "remove it",
    );
    deprecated(
        &mut found,
        "spec.driver.licensingConfig.configMapName",
        spec.driver
            .licensing_config
            .as_ref()
            .is_some_and(|l| non_empty(&l.config_map_name).is_some()),
        "use spec.driver.licensingConfig.secretName",
    );
    for (section, image) in ImageSection::ALL
        .into_iter()
        .filter_map(|section| Some((section.path(), section.image(spec)?)))
    {
        if let Some(policy) = image.image_pull_policy.as_deref()
            && !["Always", "Never", "IfNotPresent", ""].contains(&policy)
        {
            found.push(FieldError::invalid(
                child(section, "imagePullPolicy"),
                policy,
                "is not Always, Never or IfNotPresent; it is treated as IfNotPresent",
            ));
        }
    }
    found
}

/// A ClusterPolicy's NVIDIADriver counterpart, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidatedDriver {
    /// Name of the NVIDIADriver.
    pub name: String,
    /// Its `metadata.uid`, when it has one (objects read from the API server do); NVIDIA derives the names
    /// of its DaemonSets from it.
    pub uid: Option<String>,
    /// Its spec, unchanged.
    pub spec: NVIDIADriverSpec,
    /// Kind of driver.
    pub driver_type: DriverType,
    /// Kernel modules it loads.
    pub kernel_module_type: KernelModuleType,
    /// The driver image, before the OS (and kernel) suffix is added.
    pub image: String,
    /// The driver manager image: `spec.manager`, else `DRIVER_MANAGER_IMAGE` from the operator's
    /// environment; `None` when neither gives one (rendering then refuses).
    pub manager_image: Option<String>,
    /// The GPUDirect Storage image (before the OS suffix), when GDS is enabled and one resolves
    /// (`spec.gds`, else `GDS_IMAGE`).
    pub gds_image: Option<String>,
    /// The GDRCopy image (before the OS suffix), when GDRCopy is enabled and one resolves (`spec.gdrcopy`,
    /// else `GDRCOPY_IMAGE`).
    pub gdrcopy_image: Option<String>,
}

/// Validates an NVIDIADriver with no image defaults from the environment.
pub fn validate_driver(driver: &NVIDIADriver) -> Result<ValidatedDriver, Vec<FieldError>> {
    validate_driver_with(driver, &ImageDefaults::default())
}

/// Validates an NVIDIADriver; the driver manager, GPUDirect Storage and GDRCopy images it leaves unset
/// may come from `defaults`. An image that resolves nowhere is not an error here (a file checked offline
/// cannot know the operator's environment); rendering refuses it, naming the field.
pub fn validate_driver_with(
    driver: &NVIDIADriver,
    defaults: &ImageDefaults,
) -> Result<ValidatedDriver, Vec<FieldError>> {
    let spec = &driver.spec;
    let mut errors = Vec::new();
    let driver_type = choice(
        Some(&spec.driver_type),
        "spec.driverType",
        DriverType::parse,
        DriverType::VALUES,
        &mut errors,
    );
    let kernel_module_type = choice(
        spec.kernel_module_type.as_deref(),
        "spec.kernelModuleType",
        KernelModuleType::parse,
        KernelModuleType::VALUES,
        &mut errors,
    )
    .unwrap_or(KernelModuleType::Auto);
    if let Some(selector) = &spec.node_selector {
        if spec.default && !selector.is_empty() {
            errors.push(FieldError::forbidden(
                "spec.nodeSelector",
                "must be empty on the default NVIDIADriver: it serves the GPU nodes no other NVIDIADriver selects",
            ));
        }
        if selector.contains_key(DRIVER_OWNER) {
            errors.push(FieldError::forbidden(
                child("spec.nodeSelector", DRIVER_OWNER),
                "is reserved: the operator sets it to route nodes to NVIDIADrivers",
            ));
        }
        check_labels("spec.nodeSelector", Some(selector), &mut errors);
    }
    if let Some(name) = driver.metadata.name.as_deref()
        && let Some(problem) = label_value_problem(name)
    {
        errors.push(FieldError::invalid(
            "metadata.name",
            name,
            format!("{problem}: the name is the value of the node label {DRIVER_OWNER}"),
        ));
    }
    check_labels("spec.labels", spec.labels.as_ref(), &mut errors);
    check_annotations("spec.annotations", spec.annotations.as_ref(), &mut errors);
    check_tolerations("spec.tolerations", spec.tolerations.as_deref(), &mut errors);
    check_container("spec", &spec.container, &mut errors);
    for (name, probe) in [
        ("startupProbe", &spec.startup_probe),
        ("livenessProbe", &spec.liveness_probe),
        ("readinessProbe", &spec.readiness_probe),
    ] {
        check_probe(&child("spec", name), probe.as_ref(), &mut errors);
    }
    if let Some(policy) = &spec.upgrade_policy {
        check_upgrade_rules("spec.upgradePolicy", &policy.rules, &mut errors);
    }
    let image_spec = ImageSpec {
        repository: spec.repository.clone(),
        image: Some(spec.image.clone()),
        version: spec.version.clone(),
        ..ImageSpec::default()
    };
    let image = match image_spec.reference() {
        ImageRef::Resolved(image) => Some(image),
        ImageRef::Unset => {
            errors.push(FieldError::required("spec.image"));
            None
        }
        ImageRef::Partial => {
            partial_image_errors("spec", &image_spec, &mut errors);
            None
        }
    };
    if spec.use_precompiled() && spec.version.as_deref().is_some_and(|v| v.starts_with("sha256:")) {
        errors.push(FieldError::invalid(
            "spec.version",
            spec.version.clone().unwrap_or_default(),
            "must be a driver branch, not a digest, when usePrecompiled is true",
        ));
    }
    check_driver_addons(
        "spec",
        spec.use_precompiled(),
        kernel_module_type,
        spec.gds.as_ref(),
        spec.gdrcopy.as_ref(),
        &mut errors,
    );

    let mut optional_image = |section: &str, image: Option<&ImageSpec>, variable: &str| match image
        .map(ImageSpec::reference)
        .unwrap_or(ImageRef::Unset)
    {
        ImageRef::Resolved(reference) => Some(reference),
        ImageRef::Unset => defaults.get(variable).map(str::to_owned),
        ImageRef::Partial => {
            partial_image_errors(section, image.unwrap_or(&ImageSpec::default()), &mut errors);
            None
        }
    };
    let manager_image = optional_image(
        "spec.manager",
        spec.manager.as_ref().map(|m| &m.image),
        "DRIVER_MANAGER_IMAGE",
    );
    let gds = spec.gds.as_ref().filter(|gds| gds.is_enabled());
    let gds_image = gds.and_then(|gds| optional_image("spec.gds", Some(&gds.image), "GDS_IMAGE"));
    let gdrcopy = spec.gdrcopy.as_ref().filter(|gdrcopy| gdrcopy.is_enabled());
    let gdrcopy_image =
        gdrcopy.and_then(|gdrcopy| optional_image("spec.gdrcopy", Some(&gdrcopy.image), "GDRCOPY_IMAGE"));

    match (errors.is_empty(), driver_type, image) {
        (true, Some(driver_type), Some(image)) => Ok(ValidatedDriver {
            name: driver.metadata.name.clone().unwrap_or_default(),
            uid: driver.metadata.uid.clone().filter(|uid| !uid.is_empty()),
            spec: spec.clone(),
            driver_type,
            kernel_module_type,
            image,
            manager_image,
            gds_image,
            gdrcopy_image,
        }),
        _ => Err(errors),
    }
}

/// Parses an enumerated field; records an error naming the accepted values when it is not one of them.
fn choice<T>(
    value: Option<&str>,
    path: &str,
    parse: fn(&str) -> Option<T>,
    accepted: &[&str],
    errors: &mut Vec<FieldError>,
) -> Option<T> {
    let value = value?;
    let parsed = parse(value);
    if parsed.is_none() {
        errors.push(FieldError::unsupported(path, value, accepted));
    }
    parsed
}

fn check_sandbox(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) -> Option<Sandbox> {
    let sandbox = spec.sandbox_workloads.as_ref()?;
    let mode = choice(
        sandbox.mode.as_deref().filter(|m| !m.is_empty()),
        "spec.sandboxWorkloads.mode",
        SandboxMode::parse,
        SandboxMode::VALUES,
        errors,
    );
    let default_workload = choice(
        sandbox.default_workload.as_deref().filter(|w| !w.is_empty()),
        "spec.sandboxWorkloads.defaultWorkload",
        WorkloadConfig::parse,
        WorkloadConfig::VALUES,
        errors,
    );
    sandbox.is_enabled().then(|| Sandbox {
        mode: mode.unwrap_or(SandboxMode::KubeVirt),
        default_workload: default_workload.unwrap_or(WorkloadConfig::Container),
    })
}

fn check_mig_manager(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) -> Option<String> {
    let manager = spec.mig_manager.as_ref()?;
    if let Some(default) = manager.config.as_ref().and_then(|c| c.default.as_deref()) {
        choice(
            Some(default),
            "spec.migManager.config.default",
            MigDefault::parse,
            MigDefault::VALUES,
            errors,
        );
    }
    manager.default_layout().map(str::to_owned)
}

fn check_rolling_update(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) -> Option<IntOrPercent> {
    let text = spec
        .daemonsets
        .rolling_update
        .as_ref()?
        .max_unavailable
        .as_deref()?;
    let path = "spec.daemonsets.rollingUpdate.maxUnavailable";
    match IntOrPercent::parse(text) {
        Some(IntOrPercent::Count(0) | IntOrPercent::Percent(0)) => {
            errors.push(FieldError::invalid(
                path,
                text,
                "must not be 0: a DaemonSet could never replace a pod",
            ));
            None
        }
        Some(parsed) => Some(parsed),
        None => {
            errors.push(FieldError::invalid(
                path,
                text,
                "must be a count like \"1\" or a percentage like \"10%\" (at most 100%)",
            ));
            None
        }
    }
}

fn check_daemonsets(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) {
    let daemonsets = &spec.daemonsets;
    check_labels("spec.daemonsets.labels", daemonsets.labels.as_ref(), errors);
    check_annotations(
        "spec.daemonsets.annotations",
        daemonsets.annotations.as_ref(),
        errors,
    );
    check_tolerations(
        "spec.daemonsets.tolerations",
        daemonsets.tolerations.as_deref(),
        errors,
    );
    if let Some(name) = daemonsets
        .priority_class_name
        .as_deref()
        .filter(|n| !n.is_empty())
        && let Some(problem) = dns_subdomain_problem(name)
    {
        errors.push(FieldError::invalid(
            "spec.daemonsets.priorityClassName",
            name,
            problem,
        ));
    }
    check_labels("spec.operator.labels", spec.operator.labels.as_ref(), errors);
    check_annotations(
        "spec.operator.annotations",
        spec.operator.annotations.as_ref(),
        errors,
    );
}

fn check_driver(
    spec: &ClusterPolicySpec,
    kernel_module_type: KernelModuleType,
    errors: &mut Vec<FieldError>,
) {
    let driver = &spec.driver;
    for (name, probe) in [
        ("startupProbe", &driver.startup_probe),
        ("livenessProbe", &driver.liveness_probe),
        ("readinessProbe", &driver.readiness_probe),
    ] {
        check_probe(&child("spec.driver", name), probe.as_ref(), errors);
    }
    if let Some(policy) = &driver.upgrade_policy {
        check_upgrade_rules("spec.driver.upgradePolicy", &policy.rules, errors);
    }
    if driver.is_enabled() && !driver.use_nvidia_driver_crd() {
        check_driver_addons(
            "spec",
            driver.use_precompiled(),
            kernel_module_type,
            spec.gds.as_ref(),
            spec.gdrcopy.as_ref(),
            errors,
        );
    }
}

fn check_driver_addons(
    base: &str,
    precompiled: bool,
    kernel_module_type: KernelModuleType,
    gds: Option<&DriverAddonSpec>,
    gdrcopy: Option<&DriverAddonSpec>,
    errors: &mut Vec<FieldError>,
) {
    let gds = gds.filter(|addon| addon.is_enabled());
    let gdrcopy = gdrcopy.filter(|addon| addon.is_enabled());
    if precompiled {
        for (name, addon) in [("gds", gds), ("gdrcopy", gdrcopy)] {
            if addon.is_some() {
                errors.push(FieldError::forbidden(
                    child(&child(base, name), "enabled"),
                    "cannot be true with precompiled drivers (usePrecompiled): they carry no sources to build it against",
                ));
            }
        }
    }
    if let Some(gds) = gds
        && kernel_module_type != KernelModuleType::Open
        && gds_needs_open_modules(gds.image.version.as_deref())
    {
        errors.push(FieldError::forbidden(
            child(&child(base, "gds"), "version"),
            format!(
                "needs kernelModuleType \"open\" (GPUDirect Storage {}.{}.{} and later only work with the open kernel modules)",
                GDS_OPEN_MODULES_FROM.0, GDS_OPEN_MODULES_FROM.1, GDS_OPEN_MODULES_FROM.2
            ),
        ));
    }
}

fn gds_needs_open_modules(version: Option<&str>) -> bool {
    let Some(version) = version.filter(|v| !v.is_empty()) else {
        return false;
    };
    if version.starts_with("sha256") {
        return true;
    }
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let parsed = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    parsed >= GDS_OPEN_MODULES_FROM
}

fn check_probe(path: &str, probe: Option<&ContainerProbeSpec>, errors: &mut Vec<FieldError>) {
    let Some(probe) = probe else { return };
    if let Some(delay) = probe.initial_delay_seconds.filter(|d| *d < 0) {
        errors.push(FieldError::invalid(
            child(path, "initialDelaySeconds"),
            delay,
            "must not be negative",
        ));
    }
    for (name, value) in [
        ("timeoutSeconds", probe.timeout_seconds),
        ("periodSeconds", probe.period_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ] {
        if let Some(value) = value.filter(|v| *v < 1) {
            errors.push(FieldError::invalid(
                child(path, name),
                value,
                "must be at least 1",
            ));
        }
    }
}

fn check_upgrade_rules(path: &str, rules: &UpgradeRules, errors: &mut Vec<FieldError>) {
    if let Some(parallel) = rules.max_parallel_upgrades.filter(|p| *p < 0) {
        errors.push(FieldError::invalid(
            child(path, "maxParallelUpgrades"),
            parallel,
            "must not be negative (0 means no limit)",
        ));
    }
    match &rules.max_unavailable {
        Some(IntOrString::Int(count)) if *count < 0 => {
            errors.push(FieldError::invalid(
                child(path, "maxUnavailable"),
                *count,
                "must not be negative",
            ));
        }
        Some(IntOrString::String(text))
            if !matches!(IntOrPercent::parse(text), Some(IntOrPercent::Percent(_))) =>
        {
            errors.push(FieldError::invalid(
                child(path, "maxUnavailable"),
                text.as_str(),
                "must be a count like 2 or a percentage like \"25%\" (at most 100%)",
            ));
        }
        _ => {}
    }
    let timeouts = [
        (
            "podDeletion",
            rules.pod_deletion.as_ref().and_then(|p| p.timeout_seconds),
        ),
        (
            "waitForCompletion",
            rules.wait_for_completion.as_ref().and_then(|w| w.timeout_seconds),
        ),
        ("drain", rules.drain.as_ref().and_then(|d| d.timeout_seconds)),
    ];
    for (section, timeout) in timeouts {
        if let Some(timeout) = timeout.filter(|t| *t < 0) {
            errors.push(FieldError::invalid(
                child(&child(path, section), "timeoutSeconds"),
                timeout,
                "must not be negative (0 waits forever)",
            ));
        }
    }
    let selectors = [
        (
            "waitForCompletion",
            rules
                .wait_for_completion
                .as_ref()
                .and_then(|w| w.pod_selector.as_deref()),
        ),
        (
            "drain",
            rules.drain.as_ref().and_then(|d| d.pod_selector.as_deref()),
        ),
    ];
    for (section, selector) in selectors {
        if let Some(selector) = selector
            && let Err(error) = selector.parse::<crate::selector::LabelSelector>()
        {
            errors.push(FieldError::invalid(
                child(&child(path, section), "podSelector"),
                selector,
                format!(
                    "must be a label selector like \"app=train,tier!=web\": {}",
                    error.problem
                ),
            ));
        }
    }
}

fn check_containers(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) {
    for section in ImageSection::ALL {
        if let Some(container) = section.container(spec) {
            check_container(section.path(), container, errors);
        }
    }
    let env_lists = [
        (
            "spec.driver.manager.env",
            spec.driver.manager.as_ref().and_then(|m| m.env.as_deref()),
        ),
        ("spec.gds.env", spec.gds.as_ref().and_then(|g| g.env.as_deref())),
        (
            "spec.gdrcopy.env",
            spec.gdrcopy.as_ref().and_then(|g| g.env.as_deref()),
        ),
    ];
    for (path, env) in env_lists {
        check_env(path, env, errors);
    }
    if let Some(validator) = &spec.validator {
        let steps = [
            ("plugin", &validator.plugin),
            ("toolkit", &validator.toolkit),
            ("driver", &validator.driver),
            ("cuda", &validator.cuda),
            ("vfioPCI", &validator.vfio_pci),
            ("vgpuManager", &validator.vgpu_manager),
            ("vgpuDevices", &validator.vgpu_devices),
        ];
        for (step, env) in steps {
            let path = format!("spec.validator.{step}.env");
            check_env(&path, env.as_ref().and_then(|e| e.env.as_deref()), errors);
        }
    }
    let paths = [
        ("spec.toolkit.installDir", spec.toolkit.install_dir.as_deref()),
        (
            "spec.devicePlugin.mps.root",
            spec.device_plugin.mps.as_ref().and_then(|m| m.root.as_deref()),
        ),
        (
            "spec.hostPaths.rootFS",
            spec.host_paths.as_ref().and_then(|h| h.root_fs.as_deref()),
        ),
        (
            "spec.hostPaths.driverInstallDir",
            spec.host_paths
                .as_ref()
                .and_then(|h| h.driver_install_dir.as_deref()),
        ),
        (
            "spec.hostPaths.kubeletRootDir",
            spec.host_paths
                .as_ref()
                .and_then(|h| h.kubelet_root_dir.as_deref()),
        ),
        (
            "spec.dcgmExporter.hpcJobMapping.directory",
            spec.dcgm_exporter
                .hpc_job_mapping
                .as_ref()
                .and_then(|m| m.directory.as_deref()),
        ),
    ];
    for (path, value) in paths {
        if let Some(value) = value.filter(|v| !v.is_empty() && !v.starts_with('/')) {
            errors.push(FieldError::invalid(
                path,
                value,
                "must be an absolute path on the host",
            ));
        }
    }
}

fn check_container(path: &str, container: &ContainerSpec, errors: &mut Vec<FieldError>) {
    check_env(&child(path, "env"), container.env.as_deref(), errors);
    let Some(resources) = &container.resources else {
        return;
    };
    for (kind, list) in [("limits", &resources.limits), ("requests", &resources.requests)] {
        for (name, Quantity(quantity)) in list.iter().flatten() {
            let quantity_path = child(&child(&child(path, "resources"), kind), name);
            if !crate::schema::matches_pattern(QUANTITY_PATTERN, quantity) {
                errors.push(FieldError::invalid(
                    quantity_path,
                    quantity.as_str(),
                    "is not a quantity like \"500m\" or \"1Gi\"",
                ));
            } else if quantity.starts_with('-') {
                errors.push(FieldError::invalid(
                    quantity_path,
                    quantity.as_str(),
                    "must not be negative",
                ));
            }
        }
    }
}

fn check_env(path: &str, env: Option<&[EnvVar]>, errors: &mut Vec<FieldError>) {
    for (index, var) in env.unwrap_or_default().iter().enumerate() {
        if var.name.is_empty() || var.name.contains('=') {
            errors.push(FieldError::invalid(
                child(&item(path, index), "name"),
                var.name.as_str(),
                "must be a non-empty variable name without '='",
            ));
        }
    }
}

fn check_exporter(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) {
    let exporter = &spec.dcgm_exporter;
    check_annotations(
        "spec.dcgmExporter.annotations",
        exporter.annotations.as_ref(),
        errors,
    );
    if let Some(service) = &exporter.service {
        if let Some(kind) = service.type_.as_deref().filter(|t| !t.is_empty()) {
            choice(
                Some(kind),
                "spec.dcgmExporter.service.type",
                |t| {
                    ["ClusterIP", "NodePort", "LoadBalancer"]
                        .contains(&t)
                        .then_some(())
                },
                &["ClusterIP", "NodePort", "LoadBalancer"],
                errors,
            );
        }
        if let Some(policy) = service
            .internal_traffic_policy
            .as_deref()
            .filter(|t| !t.is_empty())
        {
            choice(
                Some(policy),
                "spec.dcgmExporter.service.internalTrafficPolicy",
                |t| ["Cluster", "Local"].contains(&t).then_some(()),
                &["Cluster", "Local"],
                errors,
            );
        }
    }
    for (index, pattern) in exporter.pod_label_allowlist_regex.iter().flatten().enumerate() {
        if regex::Regex::new(pattern).is_err() {
            errors.push(FieldError::invalid(
                item("spec.dcgmExporter.podLabelAllowlistRegex", index),
                pattern.as_str(),
                "is not a valid regular expression",
            ));
        }
    }
    let monitors = [
        (
            "spec.dcgmExporter.serviceMonitor",
            exporter.service_monitor.as_ref(),
        ),
        (
            "spec.operator.metrics.serviceMonitor",
            spec.operator
                .metrics
                .as_ref()
                .and_then(|m| m.service_monitor.as_ref()),
        ),
    ];
    for (path, monitor) in monitors {
        if let Some(monitor) = monitor {
            check_service_monitor(path, monitor, errors);
        }
    }
    if let Some(port) = spec.dcgm.host_port.filter(|p| !(0..=65535).contains(p)) {
        errors.push(FieldError::invalid(
            "spec.dcgm.hostPort",
            port,
            "must be a port number, 1 to 65535",
        ));
    }
}

fn check_service_monitor(path: &str, monitor: &ServiceMonitorConfig, errors: &mut Vec<FieldError>) {
    for (name, value) in [
        ("interval", &monitor.interval),
        ("scrapeTimeout", &monitor.scrape_timeout),
    ] {
        if let Some(value) = value
            .as_deref()
            .filter(|v| !crate::schema::matches_pattern(DURATION_PATTERN, v))
        {
            errors.push(FieldError::invalid(
                child(path, name),
                value,
                "is not a duration like \"15s\" or \"1m30s\"",
            ));
        }
    }
    check_labels(
        &child(path, "additionalLabels"),
        monitor.additional_labels.as_ref(),
        errors,
    );
    for (index, rule) in monitor.relabelings.iter().flatten().enumerate() {
        let rule_path = item(&child(path, "relabelings"), index);
        if let Some(action) = rule.action.as_deref() {
            choice(
                Some(action),
                &child(&rule_path, "action"),
                RelabelAction::parse,
                RelabelAction::VALUES,
                errors,
            );
        }
        if let Some(modulus) = rule.modulus.filter(|m| *m < 0) {
            errors.push(FieldError::invalid(
                child(&rule_path, "modulus"),
                modulus,
                "must not be negative",
            ));
        }
    }
}

fn check_cross_fields(spec: &ClusterPolicySpec, errors: &mut Vec<FieldError>) {
    if spec.nri_plugin_enabled() {
        if !spec.cdi_enabled() {
            errors.push(FieldError::forbidden(
                "spec.cdi.nriPluginEnabled",
                "cannot be true while spec.cdi.enabled is false: the NRI plugin injects devices through CDI",
            ));
        }
        if !spec.toolkit.is_enabled() {
            errors.push(FieldError::forbidden(
                "spec.cdi.nriPluginEnabled",
                "cannot be true while spec.toolkit.enabled is false: the container toolkit runs the NRI plugin",
            ));
        }
    }
    if let Some(config) = &spec.device_plugin.config
        && non_empty(&config.default).is_some()
        && non_empty(&config.name).is_none()
    {
        errors.push(FieldError::required_because(
            "spec.devicePlugin.config.name",
            "when spec.devicePlugin.config.default is set: the default names a key of that ConfigMap",
        ));
    }
}

fn check_labels(path: &str, labels: Option<&BTreeMap<String, String>>, errors: &mut Vec<FieldError>) {
    for (key, value) in labels.into_iter().flatten() {
        if let Some(problem) = label_key_problem(key) {
            errors.push(FieldError::invalid(
                path,
                key.as_str(),
                format!("is not a valid label key: {problem}"),
            ));
        }
        if let Some(problem) = label_value_problem(value) {
            errors.push(FieldError::invalid(
                child(path, key),
                value.as_str(),
                format!("is not a valid label value: {problem}"),
            ));
        }
    }
}

fn check_annotations(
    path: &str,
    annotations: Option<&BTreeMap<String, String>>,
    errors: &mut Vec<FieldError>,
) {
    for key in annotations.into_iter().flatten().map(|(key, _)| key) {
        if let Some(problem) = label_key_problem(key) {
            errors.push(FieldError::invalid(
                path,
                key.as_str(),
                format!("is not a valid annotation key: {problem}"),
            ));
        }
    }
}

fn check_tolerations(path: &str, tolerations: Option<&[Toleration]>, errors: &mut Vec<FieldError>) {
    for (index, toleration) in tolerations.unwrap_or_default().iter().enumerate() {
        let path = item(path, index);
        let operator = toleration.operator.as_deref().unwrap_or("Equal");
        let effect = toleration.effect.as_deref().unwrap_or("");
        let key = toleration.key.as_deref().unwrap_or("");
        let value = toleration.value.as_deref().unwrap_or("");
        if !["Equal", "Exists", ""].contains(&operator) {
            errors.push(FieldError::unsupported(
                child(&path, "operator"),
                operator,
                &["Equal", "Exists"],
            ));
        }
        if !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            errors.push(FieldError::unsupported(
                child(&path, "effect"),
                effect,
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
            ));
        }
        if operator == "Exists" && !value.is_empty() {
            errors.push(FieldError::invalid(
                child(&path, "value"),
                value,
                "must be empty when operator is Exists",
            ));
        }
        if key.is_empty() && operator != "Exists" {
            errors.push(FieldError::invalid(
                child(&path, "operator"),
                operator,
                "must be Exists when key is empty",
            ));
        }
        if let Some(problem) = (!key.is_empty()).then(|| label_key_problem(key)).flatten() {
            errors.push(FieldError::invalid(
                child(&path, "key"),
                key,
                format!("is not a valid taint key: {problem}"),
            ));
        }
        if toleration.toleration_seconds.is_some() && effect != "NoExecute" {
            errors.push(FieldError::forbidden(
                child(&path, "tolerationSeconds"),
                "may be set only when effect is NoExecute",
            ));
        }
    }
}

impl ClusterPolicySpec {
    /// The image part of a policy section.
    pub fn image_spec(&self, section: ImageSection) -> Option<&ImageSpec> {
        section.image(self)
    }
}

/// Resolves the image of every section an enabled operand needs, recording why one cannot be resolved.
fn resolve_images(
    spec: &ClusterPolicySpec,
    defaults: &ImageDefaults,
    errors: &mut Vec<FieldError>,
) -> BTreeMap<ImageSection, String> {
    // (section, environment fallback, what needs it)
    let mut needed: Vec<(ImageSection, &str, &str)> = Vec::new();
    for info in OPERANDS.iter().filter(|info| (info.enabled)(spec)) {
        needed.push((info.image_section, info.image_env, info.id));
        match info.operand {
            crate::Operand::Driver => {
                needed.push((ImageSection::DriverManager, "DRIVER_MANAGER_IMAGE", "driver"));
                if spec.gds_enabled() {
                    needed.push((ImageSection::Gds, "GDS_IMAGE", "GPUDirect Storage"));
                }
                if spec.gdrcopy_enabled() {
                    needed.push((ImageSection::Gdrcopy, "GDRCOPY_IMAGE", "GDRCopy"));
                }
            }
            crate::Operand::VfioManager => {
                needed.push((ImageSection::VfioDriverManager, "DRIVER_MANAGER_IMAGE", info.id))
            }
            crate::Operand::VgpuManager => {
                needed.push((ImageSection::VgpuDriverManager, "DRIVER_MANAGER_IMAGE", info.id))
            }
            _ => {}
        }
    }
    let mut images = BTreeMap::new();
    let mut seen = Vec::new();
    for (section, variable, user) in needed {
        // Operands that share a section (the device plugin and the MPS daemon) share its image.
        if seen.contains(&section) {
            continue;
        }
        seen.push(section);
        let image = section.image(spec).cloned().unwrap_or_default();
        let resolved = match image.reference() {
            ImageRef::Resolved(reference) => Some(reference),
            ImageRef::Partial => {
                partial_image_errors(section.path(), &image, errors);
                None
            }
            ImageRef::Unset => {
                let fallback = defaults.get(variable).map(str::to_owned);
                if fallback.is_none() {
                    errors.push(FieldError::required_because(
                        child(section.path(), "image"),
                        format!(
                            "(with repository and version) because {user} is enabled, unless {variable} is set in the operator's environment"
                        ),
                    ));
                }
                fallback
            }
        };
        if let Some(resolved) = resolved {
            images.insert(section, resolved);
        }
    }
    images
}

fn partial_image_errors(section: &str, image: &ImageSpec, errors: &mut Vec<FieldError>) {
    for (name, value) in [
        ("repository", &image.repository),
        ("image", &image.image),
        ("version", &image.version),
    ] {
        if non_empty(value).is_none() {
            errors.push(FieldError::required_because(
                child(section, name),
                "when any of repository, image and version is set (or give image alone as a full reference)",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_POLICY: &str = include_str!("../../../deploy/samples/clusterpolicy.yaml");

    fn policy(yaml: &str) -> ClusterPolicy {
        serde_saphyr::from_str(yaml).unwrap()
    }

    /// The default policy with a change to its spec, given as a YAML fragment merged over it.
    fn tweaked(patch: &str) -> ClusterPolicy {
        let mut value: serde_json::Value = serde_saphyr::from_str(DEFAULT_POLICY).unwrap();
        let patch: serde_json::Value = serde_saphyr::from_str(patch).unwrap();
        merge(&mut value["spec"], patch);
        serde_json::from_value(value).unwrap()
    }

    fn merge(target: &mut serde_json::Value, patch: serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(target), serde_json::Value::Object(patch)) => {
                for (key, value) in patch {
                    merge(target.entry(key).or_insert(serde_json::Value::Null), value);
                }
            }
            (target, patch) => *target = patch,
        }
    }

    fn errors(policy: &ClusterPolicy) -> Vec<String> {
        validate(policy)
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn the_default_policy_validates_with_every_image_resolved() {
        let validated = validate(&policy(DEFAULT_POLICY)).unwrap();
        assert_eq!(validated.name, "cluster-policy");
        assert_eq!(validated.mig_strategy, Some(MigStrategy::Single));
        assert_eq!(validated.update_strategy, UpdateStrategy::RollingUpdate);
        assert_eq!(validated.max_unavailable, Some(IntOrPercent::Count(1)));
        assert_eq!(validated.kernel_module_type, KernelModuleType::Auto);
        assert_eq!(validated.sandbox, None);
        assert_eq!(validated.mig_default_layout.as_deref(), Some("all-disabled"));
        let images: Vec<(&str, &str)> = validated
            .images
            .iter()
            .map(|(k, v)| (k.path(), v.as_str()))
            .collect();
        assert_eq!(
            images,
            [
                (
                    "spec.dcgmExporter",
                    "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless"
                ),
                ("spec.devicePlugin", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
                ("spec.driver", "nvcr.io/nvidia/driver:595.91.07"),
                (
                    "spec.driver.manager",
                    "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
                ),
                ("spec.gfd", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
                (
                    "spec.migManager",
                    "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0"
                ),
                ("spec.toolkit", "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"),
                ("spec.validator", "nvcr.io/nvidia/gpu-operator:v26.7.0"),
            ]
        );
        assert_eq!(
            validated.image(ImageSection::DevicePlugin),
            Some("nvcr.io/nvidia/k8s-device-plugin:v0.20.0")
        );
        assert!(warnings(&policy(DEFAULT_POLICY)).is_empty());
    }

    #[test]
    fn images_fall_back_to_the_operators_environment() {
        let without = tweaked("{toolkit: {repository: '', image: '', version: ''}}");
        assert_eq!(
            errors(&without),
            [
                "spec.toolkit.image: required (with repository and version) because container-toolkit is enabled, unless CONTAINER_TOOLKIT_IMAGE is set in the operator's environment"
            ]
        );
        let defaults = ImageDefaults::from_pairs([("CONTAINER_TOOLKIT_IMAGE", "registry.local/toolkit:1")]);
        let validated = validate_with(&without, &defaults).unwrap();
        assert_eq!(
            validated.image(ImageSection::Toolkit),
            Some("registry.local/toolkit:1")
        );
        // A disabled operand needs no image.
        assert!(validate(&tweaked("{toolkit: {enabled: false, image: ''}}")).is_ok());
    }

    #[test]
    fn counts_and_percentages() {
        assert_eq!(IntOrPercent::parse("3"), Some(IntOrPercent::Count(3)));
        assert_eq!(IntOrPercent::parse("25%"), Some(IntOrPercent::Percent(25)));
        assert_eq!(IntOrPercent::parse("101%"), None);
        assert_eq!(IntOrPercent::parse("-1"), None);
        assert_eq!(IntOrPercent::parse("abc"), None);
        assert_eq!(IntOrPercent::Percent(25).scaled_up(10), 3, "rounded up");
        assert_eq!(IntOrPercent::Percent(25).scaled_up(0), 0);
        assert_eq!(IntOrPercent::Count(2).scaled_up(10), 2);
        assert_eq!(
            IntOrPercent::Percent(10).to_int_or_string(),
            IntOrString::String("10%".into())
        );

        assert_eq!(
            errors(&tweaked("{daemonsets: {rollingUpdate: {maxUnavailable: 0%}}}")),
            [
                r#"spec.daemonsets.rollingUpdate.maxUnavailable: "0%" must not be 0: a DaemonSet could never replace a pod"#
            ]
        );
        assert_eq!(
            errors(&tweaked("{driver: {upgradePolicy: {maxUnavailable: '3'}}}")),
            [
                r#"spec.driver.upgradePolicy.maxUnavailable: "3" must be a count like 2 or a percentage like "25%" (at most 100%)"#
            ]
        );
        assert!(validate(&tweaked("{driver: {upgradePolicy: {maxUnavailable: 3}}}")).is_ok());
        assert_eq!(
            errors(&tweaked(
                "{driver: {upgradePolicy: {maxUnavailable: -3, drain: {timeoutSeconds: -1}}}}"
            )),
            [
                "spec.driver.upgradePolicy.maxUnavailable: -3 must not be negative",
                "spec.driver.upgradePolicy.drain.timeoutSeconds: -1 must not be negative (0 waits forever)",
            ]
        );
        let bad_selector = errors(&tweaked(
            "{driver: {upgradePolicy: {drain: {podSelector: 'app in (a'}}}}",
        ));
        assert_eq!(bad_selector.len(), 1);
        assert!(
            bad_selector[0].starts_with(
                "spec.driver.upgradePolicy.drain.podSelector: \"app in (a\" must be a label selector"
            ),
            "{bad_selector:?}"
        );
    }

    #[test]
    fn objects_rendered_from_the_policy_would_be_accepted_by_the_api_server() {
        let found = errors(&tweaked(
            "{daemonsets: {labels: {'bad key!': x, team: 'has space'},
                           tolerations: [{key: a, operator: Exists, value: v}, {operator: Equal, value: v},
                                         {key: b, effect: NoSchedule, tolerationSeconds: 30}]},
              toolkit: {installDir: relative/path, env: [{name: ''}]},
              devicePlugin: {resources: {limits: {cpu: '-1'}}}}",
        ));
        let expected = [
            r#"spec.daemonsets.labels: "bad key!" is not a valid label key: must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character"#,
            r#"spec.daemonsets.labels.team: "has space" is not a valid label value: must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character"#,
            r#"spec.daemonsets.tolerations[0].value: "v" must be empty when operator is Exists"#,
            r#"spec.daemonsets.tolerations[1].operator: "Equal" must be Exists when key is empty"#,
            "spec.daemonsets.tolerations[2].tolerationSeconds: may be set only when effect is NoExecute",
            r#"spec.toolkit.env[0].name: "" must be a non-empty variable name without '='"#,
            r#"spec.devicePlugin.resources.limits.cpu: "-1" must not be negative"#,
            r#"spec.toolkit.installDir: "relative/path" must be an absolute path on the host"#,
        ];
        crate::schema::assert_reports(&found, &expected);
        assert_eq!(found.len(), expected.len(), "{found:#?}");
    }

    #[test]
    fn cross_field_rules() {
        assert_eq!(
            errors(&tweaked("{cdi: {enabled: false, nriPluginEnabled: true}}")),
            [
                "spec.cdi.nriPluginEnabled: cannot be true while spec.cdi.enabled is false: the NRI plugin injects devices through CDI"
            ]
        );
        assert_eq!(
            errors(&tweaked(
                "{cdi: {nriPluginEnabled: true}, toolkit: {enabled: false}}"
            )),
            [
                "spec.cdi.nriPluginEnabled: cannot be true while spec.toolkit.enabled is false: the container toolkit runs the NRI plugin"
            ]
        );
        assert_eq!(
            errors(&tweaked(
                "{driver: {usePrecompiled: true}, gdrcopy: {enabled: true}}"
            )),
            [
                "spec.gdrcopy.enabled: cannot be true with precompiled drivers (usePrecompiled): they carry no sources to build it against"
            ]
        );
        assert_eq!(
            errors(&tweaked("{gds: {enabled: true}}")),
            [
                r#"spec.gds.version: needs kernelModuleType "open" (GPUDirect Storage 2.17.5 and later only work with the open kernel modules)"#
            ]
        );
        assert!(
            validate(&tweaked(
                "{gds: {enabled: true}, driver: {kernelModuleType: open}}"
            ))
            .is_ok()
        );
        assert!(validate(&tweaked("{gds: {enabled: true, version: '2.16.1'}}")).is_ok());
        assert_eq!(
            errors(&tweaked("{devicePlugin: {config: {name: '', default: any}}}")),
            [
                "spec.devicePlugin.config.name: required when spec.devicePlugin.config.default is set: the default names a key of that ConfigMap"
            ]
        );
    }

    #[test]
    fn sandbox_settings_are_parsed_only_when_enabled() {
        assert_eq!(
            validate(&tweaked("{sandboxWorkloads: {mode: kata}}"))
                .unwrap()
                .sandbox,
            None
        );
        let validated = validate(&tweaked(
            "{sandboxWorkloads: {enabled: true, mode: kata, defaultWorkload: vm-passthrough}}",
        ))
        .unwrap();
        assert_eq!(
            validated.sandbox,
            Some(Sandbox {
                mode: SandboxMode::Kata,
                default_workload: WorkloadConfig::VmPassthrough
            })
        );
        assert_eq!(
            errors(&tweaked("{sandboxWorkloads: {mode: qemu}}")),
            [r#"spec.sandboxWorkloads.mode: "qemu" is not one of [kubevirt, kata]"#]
        );
    }

    #[test]
    fn a_nodes_workload_is_its_label_only_with_sandbox_workloads_on() {
        let labels = |value: &str| BTreeMap::from([(WORKLOAD_CONFIG.to_owned(), value.to_owned())]);
        let off = tweaked("{sandboxWorkloads: {mode: kata, defaultWorkload: vm-vgpu}}");
        assert_eq!(
            Sandbox::node_workload(Sandbox::of(&off.spec), &labels("vm-passthrough")),
            (WorkloadConfig::Container, SandboxMode::KubeVirt),
            "a person's label does nothing while sandbox workloads are off"
        );
        let on = tweaked("{sandboxWorkloads: {enabled: true, mode: kata, defaultWorkload: vm-vgpu}}");
        let sandbox = Sandbox::of(&on.spec);
        assert_eq!(
            sandbox,
            validate(&on).unwrap().sandbox,
            "the doctor reads what the operator validates"
        );
        assert_eq!(
            Sandbox::node_workload(sandbox, &labels("vm-passthrough")),
            (WorkloadConfig::VmPassthrough, SandboxMode::Kata)
        );
        assert_eq!(
            Sandbox::node_workload(sandbox, &labels("no-such-workload")),
            (WorkloadConfig::VmVgpu, SandboxMode::Kata),
            "an unknown label means the policy's default"
        );
        let typo = tweaked("{sandboxWorkloads: {enabled: true, mode: qemu}}");
        assert_eq!(
            Sandbox::node_workload(Sandbox::of(&typo.spec), &BTreeMap::new()),
            (WorkloadConfig::Container, SandboxMode::KubeVirt),
            "an invalid policy falls back to the defaults for the doctor"
        );
    }

    #[test]
    fn warnings_name_deprecated_fields_and_replaced_pull_policies() {
        let found: Vec<String> = warnings(&tweaked(
            "{driver: {useOpenKernelModules: true}, psp: {enabled: true}, toolkit: {imagePullPolicy: always}}",
        ))
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            found,
            [
                "spec.driver.useOpenKernelModules: is deprecated and ignored; use spec.driver.kernelModuleType",
                "spec.psp: is deprecated and ignored; PodSecurityPolicy is gone; use spec.psa",
                r#"spec.toolkit.imagePullPolicy: "always" is not Always, Never or IfNotPresent; it is treated as IfNotPresent"#,
            ]
        );
    }

    #[test]
    fn nvidia_driver_image_and_precompiled_rules() {
        let driver = |yaml: &str| -> NVIDIADriver { serde_saphyr::from_str(yaml).unwrap() };
        let base = "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {name: d}\nspec:\n  default: false\n  driverType: gpu\n";
        let validated = validate_driver(&driver(&format!(
            "{base}  image: driver\n  repository: nvcr.io/nvidia\n  version: '595.91.07'\n"
        )))
        .unwrap();
        assert_eq!(validated.image, "nvcr.io/nvidia/driver:595.91.07");
        assert_eq!(validated.driver_type, DriverType::Gpu);
        assert_eq!(validated.manager_image, None, "no manager image and no default");
        let with_addons = format!(
            "{base}  image: d:1\n  kernelModuleType: open\n  gds: {{enabled: true, repository: r, image: gds, version: '2.20.5'}}\n  gdrcopy: {{enabled: true}}\n"
        );
        let defaults = ImageDefaults::from_pairs([
            ("DRIVER_MANAGER_IMAGE", "r/k8s-driver-manager:v1"),
            ("GDRCOPY_IMAGE", "r/gdrdrv:v2"),
        ]);
        let validated = validate_driver_with(&driver(&with_addons), &defaults).unwrap();
        assert_eq!(
            validated.manager_image.as_deref(),
            Some("r/k8s-driver-manager:v1")
        );
        assert_eq!(validated.gds_image.as_deref(), Some("r/gds:2.20.5"));
        assert_eq!(validated.gdrcopy_image.as_deref(), Some("r/gdrdrv:v2"));
        let long_name = format!(
            "apiVersion: nvidia.com/v1alpha1\nkind: NVIDIADriver\nmetadata: {{name: {}}}\nspec: {{image: d:1}}\n",
            "a".repeat(64)
        );
        assert_eq!(
            validate_driver(&driver(&long_name)).unwrap_err()[0].path,
            "metadata.name",
            "the name must fit a label value"
        );
        let messages = |yaml: String| -> Vec<String> {
            validate_driver(&driver(&yaml))
                .err()
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            messages(format!("{base}  image: driver\n  version: '595'\n")),
            [
                "spec.repository: required when any of repository, image and version is set (or give image alone as a full reference)"
            ]
        );
        assert_eq!(
            messages(format!(
                "{base}  image: driver\n  repository: r\n  version: sha256:abc\n  usePrecompiled: true\n"
            )),
            [
                r#"spec.version: "sha256:abc" must be a driver branch, not a digest, when usePrecompiled is true"#
            ]
        );
        assert_eq!(
            messages(format!(
                "{base}  image: d:1\n  nodeSelector: {{nvidia.com/gpu-operator.driver.owner: x}}\n"
            )),
            [
                "spec.nodeSelector.nvidia.com/gpu-operator.driver.owner: is reserved: the operator sets it to route nodes to NVIDIADrivers"
            ]
        );
    }
}
