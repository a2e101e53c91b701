//! One NVIDIADriver's objects: `render_nvidia_driver(&ValidatedDriver, &NvidiaDriverFacts) -> Rendered`,
//! what NVIDIA's NVIDIADriver controller creates for it (`internal/state/driver.go`, `nodepool.go`,
//! `manifests/state-driver/`), built with the same driver pod builder as the ClusterPolicy's driver.
//!
//! How it is built: the NVIDIADriver's spec is mapped onto a policy's `spec.driver` (plus `gds`,
//! `gdrcopy` and `hostPaths.rootFS`) and each pool's pod comes from [`driver_pod`]; only what NVIDIA renders
//! differently for an NVIDIADriver is set here: names, labels, selection, tolerations, the service account,
//! `NVIDIA_VISIBLE_DEVICES=void`, and the vGPU host manager's pod.
//!
//! Pools (NVIDIA's `getNodePools`): the nodes routed to the NVIDIADriver are split by OS tag
//! (`<ID><VERSION_ID>`, major version only for RHEL, Rocky and Oracle Linux), and for precompiled drivers
//! also by kernel. Each pool gets:
//! - a DaemonSet `nvidia-<driverType>-driver-<osTag>-<hash>` (at most 63 characters, the prefix cut), the
//!   hash being NVIDIA's: FNV-1a (32 bit) of `<uid>` or `<uid>-<kernel>`, in decimal, each digit mapped
//!   through Kubernetes' `rand.SafeEncodeString` alphabet; the same name is its `app` label and selector;
//! - a ServiceAccount, Role, ClusterRole and bindings `nvidia-<driverType>-driver-<name>-<osTag>`
//!   (`nvidia-vgpu-manager-<name>-<osTag>` for the host manager), with the driver's rules;
//! - node selector `nvidia.com/gpu.deploy.driver=true` (`gpu.deploy.vgpu-manager` for the host manager),
//!   the NVIDIADriver's `nodeSelector`, `nvidia.com/gpu.present=true`,
//!   `nvidia.com/gpu-operator.driver.owner=<name>`, the NFD OS labels and, when precompiled, the kernel.
//!
//! Every object also carries `nvidia.com/nvidiadriver=<name>`, `app.kubernetes.io/managed-by` and
//! `app.kubernetes.io/component` (`nvidia-driver`, or NVIDIA's `nvidia-vgpu-host-manager`), so the
//! operator prunes one NVIDIADriver's objects by label. No routed node with an OS: nothing is rendered,
//! as in NVIDIA's operator.

use std::collections::{BTreeMap, BTreeSet};

use gpuop_api::choice::{DriverType, UpdateStrategy};
use gpuop_api::cluster_policy::{
    ClusterPolicySpec, ConfigMapNameRef, DEFAULT_ROOT_FS, DriverSpec, HostPathsSpec, LicensingConfigSpec,
    VirtualTopologySpec,
};
use gpuop_api::component::{ContainerSpec, ImageSpec};
use gpuop_api::driver::ContainerProbeSpec;
use gpuop_api::labels::{
    COMPONENT, DRIVER_OWNER, GPU_PRESENT, GPU_TAINT, MANAGED_BY, MANAGED_BY_VALUE, NFD_KERNEL_VERSION,
    NFD_OS_ID, NFD_OS_VERSION, NFD_OS_VERSION_MAJOR, NODE_OS_VERSION, NVIDIA_DRIVER_NAME, PRECOMPILED,
    PRECOMPILED_KERNEL_VERSION, label_value_problem,
};
use gpuop_api::validate::ValidatedDriver;
use gpuop_api::{ImageSection, Operand, ValidatedPolicy};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, PodAffinityTerm, PodAntiAffinity, PodTemplateSpec, Toleration, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::daemonset::{OperandPod, labels};
use crate::image::{is_digest, os_tag, sanitized_kernel};
use crate::inputs::Inputs;
use crate::manifest::{Objects, Owner};
use crate::operands::config_map;
use crate::operands::driver::{
    DRIVER_CONTAINER, OsTarget, STARTUP_PROBE, STARTUP_PROBE_CONFIG_MAP, driver_pod, fnv1a32,
};
use crate::pod::{env, host_path, mount};
use crate::rbac::push_access_named;
use crate::{ClusterFacts, ContainerRuntime, OsPool, RenderError, Rendered};

/// `app.kubernetes.io/component` NVIDIA gives the vGPU host manager's NVIDIADriver objects.
const HOST_MANAGER_COMPONENT: &str = "nvidia-vgpu-host-manager";
/// Longest DaemonSet name NVIDIA makes (it is also the `app` label value).
const APP_NAME_MAX: usize = 63;
/// Longest object name.
const NAME_MAX: usize = 253;
/// Kubernetes' `rand.SafeEncodeString` alphabet, which NVIDIA's name hash is written in.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// What rendering an NVIDIADriver needs to know besides its spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaDriverFacts {
    /// Namespace the driver pods run in (the operator's namespace).
    pub namespace: String,
    /// Container runtime of the GPU nodes (RHEL subscription files are mounted except on CRI-O).
    #[serde(default)]
    pub runtime: ContainerRuntime,
    /// The distinct OS releases (and, for a precompiled driver, kernels) of the GPU nodes routed to this
    /// NVIDIADriver (those whose `nvidia.com/gpu-operator.driver.owner` is its name).
    pub pools: Vec<OsPool>,
    /// The host's root filesystem: the ClusterPolicy's `hostPaths.rootFS` when there is a ClusterPolicy,
    /// else `/` ([`NvidiaDriverFacts::host_root_of`]).
    #[serde(default = "default_host_root")]
    pub host_root: String,
    /// Keys of the ConfigMaps the driver mounts file by file (`repoConfig`, `certConfig`,
    /// `kernelModuleConfig`), by name, as for a ClusterPolicy ([`ClusterFacts::config_map_keys`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_map_keys: BTreeMap<String, Vec<String>>,
}

fn default_host_root() -> String {
    DEFAULT_ROOT_FS.to_owned()
}

impl NvidiaDriverFacts {
    /// The host root NVIDIADriver pods mount: the ClusterPolicy's `hostPaths.rootFS` when there is one,
    /// else `/` (as NVIDIA's NVIDIADriver controller decides it).
    pub fn host_root_of(policy: Option<&ClusterPolicySpec>) -> String {
        policy.map_or_else(default_host_root, |spec| spec.host_paths().root_fs().to_owned())
    }
}

/// Renders one NVIDIADriver's objects for the GPU nodes routed to it: per pool its RBAC and DaemonSet,
/// and one startup-probe ConfigMap.
pub fn render_nvidia_driver(
    driver: &ValidatedDriver,
    facts: &NvidiaDriverFacts,
) -> Result<Rendered, RenderError> {
    let name = driver.name.as_str();
    let invalid = |field: &'static str, problem: String| RenderError::NvidiaDriverField {
        driver: name.to_owned(),
        field,
        problem,
    };
    if let Some(problem) =
        label_value_problem(name).or_else(|| name.is_empty().then(|| "is empty".to_owned()))
    {
        return Err(invalid(
            "metadata.name",
            format!("{problem}; it must fit a label value ({DRIVER_OWNER} on nodes)"),
        ));
    }
    let uid = driver.uid.as_deref().ok_or_else(|| {
        invalid(
            "metadata.uid",
            "is missing; DaemonSet names are derived from it, so render an NVIDIADriver read from the API server"
                .to_owned(),
        )
    })?;
    let spec = &driver.spec;
    let precompiled = spec.use_precompiled();
    let gds = spec.gds.as_ref().is_some_and(|gds| gds.is_enabled());
    let gdrcopy = spec.gdrcopy.as_ref().is_some_and(|gdrcopy| gdrcopy.is_enabled());
    if precompiled {
        for (field, on) in [("spec.gds.enabled", gds), ("spec.gdrcopy.enabled", gdrcopy)] {
            if on {
                return Err(invalid(
                    field,
                    "cannot be true with usePrecompiled: precompiled images carry no sources to build it against; \
                     turn it off or use a non-precompiled NVIDIADriver"
                        .to_owned(),
                ));
            }
        }
        if is_digest(&driver.image) {
            return Err(invalid(
                "spec.version",
                format!(
                    "resolves to the digest {:?}; usePrecompiled needs a driver branch (e.g. \"580\") to build \
                     per-kernel tags",
                    driver.image
                ),
            ));
        }
    }
    let manager_image = driver.manager_image.clone().ok_or_else(|| {
        invalid(
            "spec.manager.image",
            "resolves to no image: set repository, image and version, or DRIVER_MANAGER_IMAGE in the operator's \
             environment"
                .to_owned(),
        )
    })?;
    let mut images = BTreeMap::from([
        (ImageSection::Driver, driver.image.clone()),
        (ImageSection::DriverManager, manager_image),
    ]);
    for (on, image, section, field, variable) in [
        (
            gds,
            &driver.gds_image,
            ImageSection::Gds,
            "spec.gds.image",
            "GDS_IMAGE",
        ),
        (
            gdrcopy,
            &driver.gdrcopy_image,
            ImageSection::Gdrcopy,
            "spec.gdrcopy.image",
            "GDRCOPY_IMAGE",
        ),
    ] {
        if on {
            let image = image.clone().ok_or_else(|| {
                invalid(
                    field,
                    format!(
                        "resolves to no image: set repository, image and version, or {variable} in the \
                         operator's environment"
                    ),
                )
            })?;
            images.insert(section, image);
        }
    }

    let flavour = Flavour::of(driver.driver_type);
    let pools = pools(driver, uid, &flavour, &facts.pools)?;
    if pools.is_empty() {
        return Ok(Rendered::default());
    }
    let policy = as_policy(driver, facts, images);
    let cluster = ClusterFacts {
        namespace: facts.namespace.clone(),
        runtime: facts.runtime,
        driver_pools: Vec::new(),
        service_monitor_crd: false,
        config_map_keys: facts.config_map_keys.clone(),
    };
    let inputs = Inputs::new(&policy, &cluster);
    let info = Operand::Driver.info();
    let image = inputs.image(ImageSection::Driver, info)?;
    let owner = Owner {
        state: info.state,
        operand: Some(flavour.operand),
        component: flavour.component,
    };

    let mut objects = Objects::new(&facts.namespace);
    let mut accounts = BTreeSet::new();
    for pool in &pools {
        // Precompiled pools of one OS share their account, as in NVIDIA's operator.
        if accounts.insert(pool.account.as_str()) {
            push_access_named(&mut objects, owner, Operand::Driver, &pool.account);
        }
    }
    let probe = probe_config_map_name(name);
    objects.push(
        owner,
        config_map(&probe, None, &[("startup-probe.sh", STARTUP_PROBE.to_owned())]),
    );
    for pool in &pools {
        let pod = driver_pod(&inputs, info, &image, &pool.target).map_err(|error| in_driver(name, error))?;
        objects.push(owner, daemonset(driver, &flavour, pool, pod, &probe));
    }
    let mut manifests = objects.into_manifests();
    for manifest in &mut manifests {
        label(&mut manifest.object["metadata"], NVIDIA_DRIVER_NAME, name);
    }
    Ok(Rendered { objects: manifests })
}

/// The per-NVIDIADriver startup probe ConfigMap. NVIDIA names it `nvidia-driver-startup-probe` for every
/// NVIDIADriver, so two NVIDIADrivers would own (and prune) one object; here each has its own.
fn probe_config_map_name(driver: &str) -> String {
    format!("{STARTUP_PROBE_CONFIG_MAP}-{driver}")
}

/// Adds a label to rendered metadata, keeping the labels sorted as every other label map.
fn label(metadata: &mut Value, key: &str, value: &str) {
    let mut sorted: BTreeMap<String, Value> = metadata["labels"]
        .as_object()
        .map(|labels| labels.clone().into_iter().collect())
        .unwrap_or_default();
    sorted.insert(key.to_owned(), Value::String(value.to_owned()));
    metadata["labels"] = Value::Object(sorted.into_iter().collect());
}

/// What differs between a driver and the vGPU host manager.
#[derive(Clone, Copy, Debug)]
struct Flavour {
    driver_type: DriverType,
    operand: Operand,
    deploy_label: &'static str,
    component: &'static str,
    host_manager: bool,
}

impl Flavour {
    fn of(driver_type: DriverType) -> Self {
        let host_manager = driver_type == DriverType::VgpuHostManager;
        let operand = if host_manager {
            Operand::VgpuManager
        } else {
            Operand::Driver
        };
        Self {
            driver_type,
            operand,
            deploy_label: operand.info().deploy_label,
            component: if host_manager {
                HOST_MANAGER_COMPONENT
            } else {
                Operand::Driver.info().component
            },
            host_manager,
        }
    }
}

/// One pool of nodes and its DaemonSet.
#[derive(Clone, Debug)]
struct Pool {
    target: OsTarget,
    account: String,
}

/// The pools of the routed nodes, sorted, one per OS tag (and kernel, when precompiled).
fn pools(
    driver: &ValidatedDriver,
    uid: &str,
    flavour: &Flavour,
    facts: &[OsPool],
) -> Result<Vec<Pool>, RenderError> {
    let precompiled = driver.spec.use_precompiled();
    let mut sorted: Vec<&OsPool> = facts.iter().collect();
    sorted.sort();
    let mut by_key: BTreeMap<(String, Option<String>), &OsPool> = BTreeMap::new();
    for pool in sorted {
        if pool.os_id.is_empty() || pool.os_version.is_empty() {
            return Err(RenderError::NvidiaDriverPool {
                driver: driver.name.clone(),
                problem: format!(
                    "GPU nodes with OS {:?} version {:?} lack feature.node.kubernetes.io/system-os_release.ID or \
                     .VERSION_ID, which the image tag needs (is node-feature-discovery running?)",
                    pool.os_id, pool.os_version
                ),
            });
        }
        let kernel = if precompiled {
            Some(pool.kernel.clone().filter(|k| !k.is_empty()).ok_or_else(|| {
                RenderError::NvidiaDriverPool {
                    driver: driver.name.clone(),
                    problem: format!(
                        "spec.usePrecompiled is true but GPU nodes with OS {}{} have no \
                         feature.node.kubernetes.io/kernel-version.full label; the precompiled image tag needs it",
                        pool.os_id, pool.os_version
                    ),
                }
            })?)
        } else {
            None
        };
        by_key
            .entry((os_tag(&pool.os_id, &pool.os_version), kernel))
            .or_insert(pool);
    }
    Ok(by_key
        .into_iter()
        .map(|((tag, kernel), pool)| {
            let mut node_selector = driver.spec.node_selector.clone().unwrap_or_default();
            node_selector.insert(GPU_PRESENT.to_owned(), "true".to_owned());
            node_selector.insert(DRIVER_OWNER.to_owned(), driver.name.clone());
            node_selector.insert(NFD_OS_ID.to_owned(), pool.os_id.clone());
            if tag.ends_with(&pool.os_version) {
                node_selector.insert(NFD_OS_VERSION.to_owned(), pool.os_version.clone());
            } else {
                let major = pool.os_version.split('.').next().unwrap_or_default();
                node_selector.insert(NFD_OS_VERSION_MAJOR.to_owned(), major.to_owned());
            }
            if let Some(kernel) = &kernel {
                node_selector.insert(NFD_KERNEL_VERSION.to_owned(), kernel.clone());
            }
            let app = app_name(flavour.driver_type, &tag, uid, kernel.as_deref());
            Pool {
                account: account_name(flavour, &driver.name, &tag),
                target: OsTarget {
                    name: app.clone(),
                    app,
                    os_id: pool.os_id.clone(),
                    os_tag: tag,
                    kernel,
                    node_selector,
                },
            }
        })
        .collect())
}

/// NVIDIA's DaemonSet (and `app`) name: `nvidia-<driverType>-driver-<osTag>-<hash>`, the prefix cut so the
/// whole fits 63 characters; the hash is of the NVIDIADriver's uid, plus `-<kernel>` for precompiled pools.
pub(crate) fn app_name(driver_type: DriverType, os_tag: &str, uid: &str, kernel: Option<&str>) -> String {
    let prefix = format!("nvidia-{}-driver-{os_tag}", driver_type.as_str());
    let input = match kernel {
        Some(kernel) => format!("{uid}-{kernel}"),
        None => uid.to_owned(),
    };
    let hash = name_hash(&input);
    let room = APP_NAME_MAX - hash.len() - 1;
    let prefix: String = prefix.chars().take(room).collect();
    format!("{prefix}-{hash}")
}

/// The hash NVIDIA's driver DaemonSet names end in: FNV-1a (32 bit) of `input` (an NVIDIADriver's uid, or
/// `<uid>-<kernel>`), its decimal digits written in `rand.SafeEncodeString`'s alphabet.
pub fn name_hash(input: &str) -> String {
    fnv1a32(input.as_bytes())
        .to_string()
        .bytes()
        .map(|digit| char::from(SAFE_ALPHABET[usize::from(digit) % SAFE_ALPHABET.len()]))
        .collect()
}

/// NVIDIA's name of a pool's ServiceAccount and RBAC.
fn account_name(flavour: &Flavour, driver: &str, os_tag: &str) -> String {
    let name = if flavour.host_manager {
        format!("nvidia-vgpu-manager-{driver}-{os_tag}")
    } else {
        format!("nvidia-{}-driver-{driver}-{os_tag}", flavour.driver_type.as_str())
    };
    name.chars().take(NAME_MAX).collect()
}

/// The NVIDIADriver as a policy's driver section, so the ClusterPolicy's pod builder renders it.
fn as_policy(
    driver: &ValidatedDriver,
    facts: &NvidiaDriverFacts,
    images: BTreeMap<ImageSection, String>,
) -> ValidatedPolicy {
    let spec = &driver.spec;
    // NVIDIA's NVIDIADriver keeps `init` and appends the arguments (a ClusterPolicy's replace them).
    let args = spec
        .container
        .args
        .clone()
        .filter(|args| !args.is_empty())
        .map(|args| std::iter::once("init".to_owned()).chain(args).collect());
    // Precompiled modules load at once, so NVIDIA probes them sooner.
    let startup_probe = spec.startup_probe.clone().or_else(|| {
        spec.use_precompiled().then(|| ContainerProbeSpec {
            initial_delay_seconds: Some(5),
            ..ContainerProbeSpec::default()
        })
    });
    let policy_spec = ClusterPolicySpec {
        driver: DriverSpec {
            enabled: Some(true),
            use_precompiled: spec.use_precompiled,
            kernel_module_type: spec.kernel_module_type.clone(),
            startup_probe,
            liveness_probe: spec.liveness_probe.clone(),
            readiness_probe: spec.readiness_probe.clone(),
            rdma: spec.rdma.clone(),
            image: ImageSpec {
                image_pull_policy: spec.image_pull_policy.clone(),
                image_pull_secrets: spec.image_pull_secrets.clone(),
                ..ImageSpec::default()
            },
            manager: spec.manager.clone(),
            container: ContainerSpec {
                args,
                ..spec.container.clone()
            },
            repo_config: spec.repo_config.as_ref().map(|config| ConfigMapNameRef {
                config_map_name: config.name.clone(),
            }),
            cert_config: spec.cert_config.clone(),
            // NLS is on by default in an NVIDIADriver and off in a ClusterPolicy: say it explicitly.
            licensing_config: spec.licensing_config.as_ref().map(|config| LicensingConfigSpec {
                config_map_name: config.name.clone(),
                secret_name: config.secret_name.clone(),
                nls_enabled: Some(config.is_nls_enabled()),
            }),
            virtual_topology: spec
                .virtual_topology_config
                .as_ref()
                .map(|config| VirtualTopologySpec {
                    config: config.name.clone(),
                }),
            kernel_module_config: spec.kernel_module_config.clone(),
            secret_env: spec.secret_env.clone(),
            ..DriverSpec::default()
        },
        gds: spec.gds.clone(),
        gdrcopy: spec.gdrcopy.clone(),
        host_paths: Some(HostPathsSpec {
            root_fs: Some(facts.host_root.clone()),
            ..HostPathsSpec::default()
        }),
        ..ClusterPolicySpec::default()
    };
    ValidatedPolicy {
        name: driver.name.clone(),
        spec: policy_spec,
        mig_strategy: None,
        update_strategy: UpdateStrategy::OnDelete,
        max_unavailable: None,
        kernel_module_type: driver.kernel_module_type,
        sandbox: None,
        mig_default_layout: None,
        images,
    }
}

/// A pod-builder error, with the NVIDIADriver's field names and its name.
fn in_driver(driver: &str, error: RenderError) -> RenderError {
    let field = |field: &'static str| match field {
        "spec.driver.repoConfig.configMapName" => "spec.repoConfig.name",
        "spec.driver.certConfig.name" => "spec.certConfig.name",
        "spec.driver.kernelModuleConfig.name" => "spec.kernelModuleConfig.name",
        other => other,
    };
    let error = match error {
        RenderError::ConfigMapUnknown {
            field: name_field,
            name,
            namespace,
        } => RenderError::ConfigMapUnknown {
            field: field(name_field),
            name,
            namespace,
        },
        RenderError::UnsupportedOsForConfig { field: config, os_id } => RenderError::UnsupportedOsForConfig {
            field: field(config),
            os_id,
        },
        other => other,
    };
    RenderError::InNvidiaDriver {
        driver: driver.to_owned(),
        source: Box::new(error),
    }
}

/// The pool's DaemonSet, with what NVIDIA renders differently for an NVIDIADriver.
fn daemonset(
    driver: &ValidatedDriver,
    flavour: &Flavour,
    pool: &Pool,
    pod: OperandPod,
    probe: &str,
) -> DaemonSet {
    let spec = &driver.spec;
    let target = &pool.target;
    let mut pod_spec = pod.spec;
    pod_spec.service_account_name = Some(pool.account.clone());
    for source in pod_spec
        .volumes
        .iter_mut()
        .flatten()
        .filter_map(|v| v.config_map.as_mut())
    {
        if source.name == STARTUP_PROBE_CONFIG_MAP {
            source.name = probe.to_owned();
        }
    }
    for container in pod_spec
        .containers
        .iter_mut()
        .filter(|c| c.name == DRIVER_CONTAINER || c.name == "nvidia-peermem-ctr")
    {
        // Driver containers always run with runc, never the NVIDIA runtime.
        let vars = container.env.get_or_insert_with(Vec::new);
        vars.insert(0, env("NVIDIA_VISIBLE_DEVICES", "void"));
        // NVIDIA's NVIDIADriver manifest orders these as below, unlike its ClusterPolicy one: a template
        // that differs only in order still replaces every driver pod of a cluster taken over.
        move_after(
            vars,
            |v| v.name == crate::operands::driver::DRIVER_CONFIG_DIGEST,
            |v| v.name == "NODE_IP",
        );
        if let Some(mounts) = container.volume_mounts.as_mut() {
            move_after(
                mounts,
                |m| m.name == "host-sys-devices-system",
                |m| m.name == "firmware-search-path",
            );
        }
    }
    if flavour.host_manager {
        host_manager_pod(&mut pod_spec);
    }
    pod_spec.affinity = Some(Affinity {
        node_affinity: spec.node_affinity.clone(),
        pod_anti_affinity: Some(one_driver_per_node()),
        ..Affinity::default()
    });
    let mut node_selector = labels(&[(flavour.deploy_label, "true")]);
    node_selector.extend(target.node_selector.clone());
    pod_spec.node_selector = Some(node_selector);
    // An NVIDIADriver's tolerations come on top of the GPU taint's (a ClusterPolicy's replace it).
    let mut tolerations = vec![Toleration {
        key: Some(GPU_TAINT.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoSchedule".to_owned()),
        ..Toleration::default()
    }];
    tolerations.extend(spec.tolerations.iter().flatten().cloned());
    pod_spec.tolerations = Some(tolerations);
    pod_spec.priority_class_name = Some(spec.priority_class_name().to_owned());
    if let Some(context) = &spec.pod_security_context {
        pod_spec.security_context = Some(context.clone());
    }

    // NVIDIA drops `app` and every `app.kubernetes.io/` key from the user's labels: they select pods. The
    // pods carry NVIDIA's labels only: one of ours there would replace every driver pod on a takeover.
    let mut pod_labels: BTreeMap<String, String> = BTreeMap::new();
    let mut object_labels: BTreeMap<String, String> = spec
        .labels
        .iter()
        .flatten()
        .filter(|(key, _)| *key != "app" && !key.starts_with("app.kubernetes.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    object_labels.extend(labels(&[
        ("app", &target.app),
        (NODE_OS_VERSION, &target.os_tag),
        (PRECOMPILED, if spec.use_precompiled() { "true" } else { "false" }),
        (COMPONENT, flavour.component),
        (MANAGED_BY, MANAGED_BY_VALUE),
        (NVIDIA_DRIVER_NAME, &driver.name),
    ]));
    if let Some(kernel) = &target.kernel {
        object_labels.insert(PRECOMPILED_KERNEL_VERSION.to_owned(), sanitized_kernel(kernel));
    }
    pod_labels.extend(
        object_labels
            .iter()
            .filter(|(key, _)| *key != MANAGED_BY && *key != NVIDIA_DRIVER_NAME)
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let user_annotations = spec.annotations.clone().unwrap_or_default();
    let mut object_annotations = labels(&[("openshift.io/scc", &pool.account)]);
    object_annotations.extend(user_annotations.clone());
    let mut pod_annotations = pod.annotations;
    pod_annotations.extend(user_annotations);

    DaemonSet {
        metadata: ObjectMeta {
            name: Some(target.name.clone()),
            labels: Some(object_labels.clone()),
            annotations: Some(object_annotations),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels(&[("app", &target.app)])),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec),
            },
            // The upgrade controller replaces driver pods node by node.
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// Moves the first item that is `moved` to just after the first that is `anchor`, when both are there.
fn move_after<T>(items: &mut Vec<T>, moved: impl Fn(&T) -> bool, anchor: impl Fn(&T) -> bool) {
    let Some(from) = items.iter().position(moved) else {
        return;
    };
    let item = items.remove(from);
    match items.iter().position(anchor) {
        Some(at) => items.insert(at + 1, item),
        None => items.insert(from, item),
    }
}

/// At most one driver or vGPU manager pod per node, whichever NVIDIADriver (or ClusterPolicy) it is from.
fn one_driver_per_node() -> PodAntiAffinity {
    PodAntiAffinity {
        required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: COMPONENT.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![
                        Operand::Driver.info().component.to_owned(),
                        Operand::VgpuManager.info().component.to_owned(),
                    ]),
                }]),
                match_labels: None,
            }),
            topology_key: "kubernetes.io/hostname".to_owned(),
            ..PodAffinityTerm::default()
        }]),
        ..PodAntiAffinity::default()
    }
}

/// The vGPU host manager's pod, as NVIDIA renders it from the driver's: no startup probe or pre-stop hook
/// (it writes no `.driver-ctr-ready`), the host's cgroups and VFIO devices, two minutes to stop.
fn host_manager_pod(pod: &mut k8s_openapi::api::core::v1::PodSpec) {
    pod.termination_grace_period_seconds = Some(120);
    if let Some(ctr) = pod.containers.iter_mut().find(|c| c.name == DRIVER_CONTAINER) {
        ctr.startup_probe = None;
        ctr.lifecycle = None;
        let mounts = ctr.volume_mounts.get_or_insert_with(Vec::new);
        let at = after(mounts, |m: &VolumeMount| m.name == "host-os-release");
        mounts.splice(
            at..at,
            [mount("cgroup", "/sys/fs/cgroup"), mount("vfio", "/dev/vfio")],
        );
    }
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    let at = after(volumes, |v| v.name == "host-os-release");
    volumes.splice(
        at..at,
        [
            host_path("cgroup", "/sys/fs/cgroup", None),
            host_path("vfio", "/dev/vfio", None),
        ],
    );
}

/// The index just after the first item matching, or the end.
fn after<T>(items: &[T], found: impl Fn(&T) -> bool) -> usize {
    items.iter().position(found).map_or(items.len(), |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_names_match_nvidias_hash_and_length() {
        // Expected values from NVIDIA's TestGetDriverAppName (internal/state/driver_test.go).
        let uid = "bfac7359-6033-45ce-88d6-53db0078526e";
        assert_eq!(
            app_name(DriverType::Gpu, "ubuntu20.04", uid, None),
            "nvidia-gpu-driver-ubuntu20.04-67cc6dbb79"
        );
        assert_eq!(
            app_name(DriverType::Gpu, "ubuntu20.04", uid, Some("5.15.0-70-generic")),
            "nvidia-gpu-driver-ubuntu20.04-59b779bcc5"
        );
        let long = app_name(
            DriverType::Gpu,
            "redhatCoreOS4.14-414.92.202309282257",
            uid,
            Some("5.15.0-70-generic"),
        );
        assert_eq!(
            long,
            "nvidia-gpu-driver-redhatCoreOS4.14-414.92.2023092822-59b779bcc5"
        );
        assert_eq!(long.len(), 63);
        assert_eq!(
            app_name(DriverType::Gpu, "rhel10", uid, Some("5.15.0-70-generic")),
            "nvidia-gpu-driver-rhel10-59b779bcc5"
        );
    }
}
