//! Rendering: `render(&ValidatedPolicy, &ClusterFacts) -> Rendered`, every object the operator wants in the
//! cluster for a policy, in NVIDIA's state order. Pure: no client, no clock, no environment; the same inputs
//! always give the same objects, byte for byte.
//!
//! The objects are the ones NVIDIA's GPU Operator creates for the same ClusterPolicy, with the same names,
//! containers, environment variables, volumes and status-file wiring, so NVIDIA's operand images run
//! unchanged under them. Where this renderer deliberately differs (one driver DaemonSet per OS pool, no
//! ownerReferences or hash annotations, explicit defaults) `docs/render.md` says so and why.
//!
//! Layout:
//! - `inputs`: the policy and facts one render works from, and the decisions every operand
//!   shares (images, pull policies, the RuntimeClass rule, MIG environment).
//! - `manifest`: typed Kubernetes objects to [`Manifest`]s, with the labels every object carries.
//! - `pod`: building blocks of operand pods (environment, volumes, status-file waits, host-path rewrites).
//! - `daemonset`: the settings every operand DaemonSet shares (selectors, tolerations, priority, update
//!   strategy, pod labels and annotations).
//! - `monitoring`: the Prometheus Operator's ServiceMonitor.
//! - `rbac`: the ServiceAccount and RBAC of each operand.
//! - `image`: image sections of the policy, and the driver image tag for an OS pool or kernel.
//! - `operands`: one module per operand (or family of operands), in state order.
//! - `nvidia_driver`: one NVIDIADriver's objects (`render_nvidia_driver`), with the driver's pod builder.
//!
//! Invariants: disabled operands render nothing; every object carries `app.kubernetes.io/managed-by:
//! gpu-operator` and `app.kubernetes.io/component`; namespaced objects carry the operator namespace.

use std::collections::BTreeMap;

use gpuop_api::{ImageSection, OPERANDS, Operand, ValidatedPolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod adopt;
mod daemonset;
mod image;
mod inputs;
mod manifest;
mod monitoring;
mod nvidia_driver;
mod operands;
mod pod;
mod rbac;

pub use adopt::keep_live_driver_digest;
pub use image::{os_tag, sanitized_kernel};
pub use nvidia_driver::{NvidiaDriverFacts, name_hash, render_nvidia_driver};

use inputs::Inputs;
use manifest::Objects;

/// What the renderer needs to know about the cluster besides the policy. Read from a file by
/// `gpu-operator render --facts` (docs/render.md): unknown keys are refused, so a typo is named rather
/// than mistaken for a missing key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterFacts {
    /// Namespace the operands run in (the operator's namespace).
    pub namespace: String,
    /// Container runtime of the GPU nodes, which the toolkit configures.
    pub runtime: ContainerRuntime,
    /// Distinct operating systems (and kernels, for precompiled drivers) among the GPU nodes; one driver
    /// DaemonSet is rendered per pool. Empty when no GPU node is known: then no driver (or vGPU manager)
    /// DaemonSet is rendered, because its image tag depends on the nodes' OS.
    pub driver_pools: Vec<OsPool>,
    /// Whether the Prometheus Operator's ServiceMonitor CRD is installed.
    pub service_monitor_crd: bool,
    /// The keys of the ConfigMaps in the operator namespace that the driver mounts file by file
    /// (`driver.repoConfig.configMapName`, `driver.certConfig.name`, `driver.kernelModuleConfig.name`,
    /// `vgpuManager.kernelModuleConfig.name`), by ConfigMap name. Each key becomes a file next to the
    /// image's own files, so the renderer must know them; a named ConfigMap missing here is an error.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_map_keys: BTreeMap<String, Vec<String>>,
}

/// A container runtime the toolkit can configure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerRuntime {
    /// containerd (also the choice when the runtime is unknown).
    #[default]
    Containerd,
    /// CRI-O.
    Crio,
    /// Docker.
    Docker,
}

impl ContainerRuntime {
    /// The name the toolkit's `RUNTIME` variable takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Crio => "crio",
            Self::Docker => "docker",
        }
    }
}

/// GPU nodes that share an OS release (and, for precompiled drivers, a kernel).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsPool {
    /// `feature.node.kubernetes.io/system-os_release.ID`, e.g. `ubuntu`.
    pub os_id: String,
    /// `feature.node.kubernetes.io/system-os_release.VERSION_ID`, e.g. `22.04`.
    pub os_version: String,
    /// `feature.node.kubernetes.io/kernel-version.full`, set only for precompiled drivers.
    pub kernel: Option<String>,
}

/// Every object a policy wants, in the order they are applied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    /// The objects, in NVIDIA's state order and, within a state, in dependency order (service accounts and
    /// RBAC before the DaemonSet that uses them).
    pub objects: Vec<Manifest>,
}

impl Rendered {
    /// The object of this kind and name, if rendered.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Manifest> {
        self.objects.iter().find(|m| m.kind() == kind && m.name() == name)
    }
}

/// One desired object.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// The ClusterPolicy state it belongs to (`pre-requisites`, `state-driver`, ...).
    pub state: &'static str,
    /// The operand it belongs to, if any (RuntimeClasses and the operator's metrics Service belong to none).
    pub operand: Option<Operand>,
    /// The object: `apiVersion`, `kind`, `metadata` (name, namespace for namespaced kinds, labels including
    /// `app.kubernetes.io/managed-by: gpu-operator` and `app.kubernetes.io/component`), and its body.
    pub object: Value,
}

impl Manifest {
    /// The object's `kind`.
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    /// The object's `metadata.name`.
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }
}

/// Why a policy cannot be rendered for these facts. Each names what is wrong and what would be accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    /// The validated policy carries no image for a section an enabled operand needs (validation resolves
    /// every such image, so this means the policy was not validated with this catalogue).
    #[error("no image resolved for {section}, which {operand} needs; validate the policy before rendering")]
    ImageMissing {
        /// Policy section, e.g. `spec.devicePlugin`.
        section: ImageSection,
        /// The operand that needs it.
        operand: Operand,
    },
    /// A GPU node pool lacks the OS labels the driver image tag is built from.
    #[error(
        "GPU nodes with OS {os_id:?} version {os_version:?} cannot get a {section} image: the tag needs both \
         feature.node.kubernetes.io/system-os_release.ID and .VERSION_ID (is node-feature-discovery running?)"
    )]
    PoolWithoutOs {
        /// The section whose image needs the tag.
        section: ImageSection,
        /// The pool's OS id, possibly empty.
        os_id: String,
        /// The pool's OS version, possibly empty.
        os_version: String,
    },
    /// Precompiled drivers need each GPU node's kernel.
    #[error(
        "spec.driver.usePrecompiled is true but GPU nodes with OS {os_id}{os_version} have no \
         feature.node.kubernetes.io/kernel-version.full label; the precompiled image tag needs it"
    )]
    PoolWithoutKernel {
        /// The pool's OS id.
        os_id: String,
        /// The pool's OS version.
        os_version: String,
    },
    /// Precompiled driver images are tagged per kernel; a digest names one image for all kernels.
    #[error(
        "spec.driver resolves to the digest {image:?}, but spec.driver.usePrecompiled needs a driver branch \
         version (e.g. \"580\") to build per-kernel tags"
    )]
    PrecompiledDigest {
        /// The resolved driver image.
        image: String,
    },
    /// One kernel version was found on two OS releases; one precompiled DaemonSet per kernel cannot serve both.
    #[error(
        "kernel {kernel} runs on GPU nodes with {first} and with {second}; precompiled driver DaemonSets are \
         per kernel, so each kernel must belong to one OS release"
    )]
    KernelOnSeveralOs {
        /// The kernel version.
        kernel: String,
        /// One OS (`<ID><VERSION_ID>`).
        first: String,
        /// Another OS.
        second: String,
    },
    /// A ConfigMap the driver mounts file by file is not among the facts.
    #[error(
        "{field} names ConfigMap {name:?}, which is not in namespace {namespace:?} (or its keys are unknown); \
         create it or clear the field"
    )]
    ConfigMapUnknown {
        /// The policy field naming it.
        field: &'static str,
        /// The ConfigMap name.
        name: String,
        /// The operator namespace.
        namespace: String,
    },
    /// An NVIDIADriver field that cannot be rendered.
    #[error("NVIDIADriver {driver}: {field} {problem}")]
    NvidiaDriverField {
        /// The NVIDIADriver's name.
        driver: String,
        /// The field, e.g. `spec.gds.enabled`.
        field: &'static str,
        /// What is wrong and what would be accepted.
        problem: String,
    },
    /// The GPU nodes routed to an NVIDIADriver lack what its image tags need.
    #[error("NVIDIADriver {driver}: {problem}")]
    NvidiaDriverPool {
        /// The NVIDIADriver's name.
        driver: String,
        /// What the nodes lack.
        problem: String,
    },
    /// The driver pod of an NVIDIADriver cannot be built (fields named as in the NVIDIADriver).
    #[error("NVIDIADriver {driver}: {source}")]
    InNvidiaDriver {
        /// The NVIDIADriver's name.
        driver: String,
        /// Why.
        #[source]
        source: Box<RenderError>,
    },
    /// Repository and certificate files go to OS-specific directories; this OS has none NVIDIA knows.
    #[error(
        "{field} is set, but the driver image for OS {os_id:?} has no known directory for it (supported: \
         centos, debian, ubuntu, rhcos, rhel, rocky, ol, sles, sl-micro)"
    )]
    UnsupportedOsForConfig {
        /// The policy field.
        field: &'static str,
        /// The pool's OS id.
        os_id: String,
    },
}

/// Renders every object of every enabled state, in NVIDIA's state order.
pub fn render(policy: &ValidatedPolicy, facts: &ClusterFacts) -> Result<Rendered, RenderError> {
    let inputs = Inputs::new(policy, facts);
    let mut objects = Objects::new(&facts.namespace);
    operands::runtime_classes(&inputs, &mut objects);
    operands::operator_metrics(&inputs, &mut objects);
    for info in OPERANDS.iter().filter(|info| (info.enabled)(&policy.spec)) {
        operands::operand(&inputs, info, &mut objects)?;
    }
    Ok(Rendered {
        objects: objects.into_manifests(),
    })
}
