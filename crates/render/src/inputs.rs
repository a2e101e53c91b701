//! What one render works from — the validated policy and the cluster facts — and the decisions every
//! operand shares: resolved images and how they are pulled, container settings of a section, the
//! RuntimeClass rule, the NRI annotation and the MIG environment.

use gpuop_api::choice::MigStrategy;
use gpuop_api::cluster_policy::{ClusterPolicySpec, HostPathsSpec};
use gpuop_api::component::{ContainerSpec, EnvVar as PolicyEnvVar, ImageSpec};
use gpuop_api::labels::CDI_MANAGEMENT_GPU;
use gpuop_api::{ImageSection, OperandInfo, ValidatedPolicy};
use k8s_openapi::api::core::v1::{Container, LocalObjectReference, PodSpec, ResourceRequirements};

use crate::daemonset::OperandPod;
use crate::pod::set_env;
use crate::{ClusterFacts, ContainerRuntime, RenderError};

/// The policy and facts of one render.
#[derive(Debug)]
pub(crate) struct Inputs<'a> {
    /// The validated policy.
    pub policy: &'a ValidatedPolicy,
    /// Its spec.
    pub spec: &'a ClusterPolicySpec,
    /// What is known about the cluster.
    pub facts: &'a ClusterFacts,
    /// Host paths with their defaults.
    pub host_paths: HostPathsSpec,
}

/// A resolved image and how it is pulled.
#[derive(Clone, Debug)]
pub(crate) struct PulledImage {
    /// Image reference.
    pub image: String,
    /// `Always`, `Never` or `IfNotPresent`.
    pub pull_policy: &'static str,
}

impl<'a> Inputs<'a> {
    /// The inputs of a render.
    pub fn new(policy: &'a ValidatedPolicy, facts: &'a ClusterFacts) -> Self {
        Self {
            policy,
            spec: &policy.spec,
            facts,
            host_paths: policy.spec.host_paths(),
        }
    }

    /// The resolved image of a section an operand needs.
    pub fn image(&self, section: ImageSection, info: &OperandInfo) -> Result<PulledImage, RenderError> {
        let image = self
            .policy
            .image(section)
            .ok_or(RenderError::ImageMissing {
                section,
                operand: info.operand,
            })?
            .to_owned();
        Ok(PulledImage {
            image,
            pull_policy: self.pull_policy(section),
        })
    }

    /// The validator image (status-file waits and validations run it).
    pub fn validator_image(&self, info: &OperandInfo) -> Result<PulledImage, RenderError> {
        self.image(ImageSection::Validator, info)
    }

    /// The pull policy of a section: `Always`, `Never`, else `IfNotPresent` (as NVIDIA maps it).
    pub fn pull_policy(&self, section: ImageSection) -> &'static str {
        self.spec
            .image_spec(section)
            .map_or("IfNotPresent", ImageSpec::pull_policy)
    }

    /// The pull secrets of a section.
    pub fn pull_secrets(&self, section: ImageSection) -> &'a [String] {
        self.spec
            .image_spec(section)
            .and_then(|image| image.image_pull_secrets.as_deref())
            .unwrap_or_default()
    }

    /// The container settings of a section (empty when the section is absent).
    pub fn container(&self, section: ImageSection) -> ContainerSettings<'a> {
        ContainerSettings(section.container(self.spec))
    }

    /// The RuntimeClass operand pods that need GPUs run with, or `None` when they must not name one:
    /// CRI-O without CDI uses the OCI hook instead, and the NRI plugin injects devices by annotation.
    pub fn runtime_class(&self) -> Option<&'a str> {
        let crio_without_cdi = !self.spec.cdi_enabled() && self.facts.runtime == ContainerRuntime::Crio;
        if crio_without_cdi || self.spec.nri_plugin_enabled() {
            None
        } else {
            Some(self.spec.operator.runtime_class())
        }
    }

    /// Sets the RuntimeClass and, with the NRI plugin, the annotation that asks it for every GPU in the
    /// named container.
    pub fn gpu_access(&self, pod: &mut OperandPod, container: &str) {
        pod.spec.runtime_class_name = self.runtime_class().map(str::to_owned);
        if self.spec.nri_plugin_enabled() {
            pod.annotations.insert(
                format!("nvidia.cdi.k8s.io/container.{container}"),
                format!("{CDI_MANAGEMENT_GPU}=all"),
            );
        }
    }

    /// The MIG environment of the device plugin, feature discovery and the MPS daemon: no strategy lets
    /// the plugin decide per node (`NVIDIA_MIG_MONITOR_DEVICES=all`); otherwise `MIG_STRATEGY`, plus the
    /// monitor variable unless the strategy is `none`.
    pub fn mig_env(&self, container: &mut Container) {
        match self.policy.mig_strategy {
            None => set_env(container, "NVIDIA_MIG_MONITOR_DEVICES", "all"),
            Some(strategy) => {
                set_env(container, "MIG_STRATEGY", strategy.as_str());
                if strategy != MigStrategy::None {
                    set_env(container, "NVIDIA_MIG_MONITOR_DEVICES", "all");
                }
            }
        }
    }

    /// The MIG strategy as the validator's plugin step takes it (empty when unset).
    pub fn mig_strategy_name(&self) -> &'static str {
        self.policy.mig_strategy.map_or("", MigStrategy::as_str)
    }

    /// `<toolkit installDir>/toolkit/nvidia-cdi-hook`, when the operator installs the toolkit.
    pub fn cdi_hook_path(&self) -> Option<String> {
        self.spec
            .toolkit
            .is_enabled()
            .then(|| format!("{}/toolkit/nvidia-cdi-hook", self.spec.toolkit.install_dir()))
    }
}

/// Resources, arguments, environment and host network of one policy section.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ContainerSettings<'a>(Option<&'a ContainerSpec>);

impl<'a> ContainerSettings<'a> {
    /// Kubernetes resource requirements, when the section sets any.
    pub fn resources(self) -> Option<ResourceRequirements> {
        let resources = self.0?.resources.as_ref()?;
        Some(ResourceRequirements {
            limits: resources.limits.clone(),
            requests: resources.requests.clone(),
            ..ResourceRequirements::default()
        })
    }

    /// Arguments replacing the main container's, when set and non-empty.
    pub fn args(self) -> Option<Vec<String>> {
        self.0?.args.clone().filter(|args| !args.is_empty())
    }

    /// Extra environment of the main container.
    pub fn env(self) -> &'a [PolicyEnvVar] {
        self.0.and_then(|c| c.env.as_deref()).unwrap_or_default()
    }

    /// Whether the pods run in the host network namespace.
    pub fn host_network(self) -> bool {
        self.0.and_then(|c| c.host_network).unwrap_or(false)
    }

    /// Replaces a container's arguments with the section's, when it sets any.
    pub fn apply_args(self, container: &mut Container) {
        if let Some(args) = self.args() {
            container.args = Some(args);
        }
    }

    /// Gives every container of a pod (sidecars too, init containers not) the section's resources.
    pub fn apply_resources_to_containers(self, pod: &mut PodSpec) {
        let resources = self.resources();
        for container in &mut pod.containers {
            apply_resources(container, resources.as_ref());
        }
    }

    /// Applies the section to the operand's main container: resources, arguments, then environment (so
    /// the section's variables win over those set before).
    pub fn apply_to(self, container: &mut Container) {
        apply_resources(container, self.resources().as_ref());
        self.apply_args(container);
        apply_env(container, self.env());
    }
}

/// Applies the policy's resources to a container (when set).
pub(crate) fn apply_resources(container: &mut Container, resources: Option<&ResourceRequirements>) {
    if let Some(resources) = resources {
        container.resources = Some(resources.clone());
    }
}

/// Sets (or overrides) environment variables given in the policy.
pub(crate) fn apply_env(container: &mut Container, env: &[PolicyEnvVar]) {
    for var in env {
        set_env(container, &var.name, var.value.as_deref().unwrap_or_default());
    }
}

/// Host network, with the DNS policy that keeps cluster DNS working in it.
pub(crate) fn apply_host_network(pod: &mut PodSpec, host_network: bool) {
    if host_network {
        pod.host_network = Some(true);
        pod.dns_policy = Some("ClusterFirstWithHostNet".to_owned());
    }
}

/// Adds pull secrets to a pod, each once, in order.
pub(crate) fn add_pull_secrets(pod: &mut PodSpec, secrets: &[String]) {
    let list = pod.image_pull_secrets.get_or_insert_with(Vec::new);
    for secret in secrets {
        if !list.iter().any(|existing| &existing.name == secret) {
            list.push(LocalObjectReference { name: secret.clone() });
        }
    }
    if list.is_empty() {
        pod.image_pull_secrets = None;
    }
}
