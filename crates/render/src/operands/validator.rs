//! The validators: `nvidia-operator-validator` (state `state-operator-validation`) proves each link of a
//! container node's chain and writes the status files the other operands wait for; the
//! `nvidia-sandbox-validator` does the same for virtual-machine nodes.
//!
//! The operator validator's init containers run NVIDIA's validator image once per component, in chain
//! order: `driver-validation` (waits for a driver, host or container, and writes `driver-ready`),
//! `toolkit-validation` (runs `nvidia-smi` under the NVIDIA RuntimeClass: `toolkit-ready`),
//! `cuda-validation` (a vectorAdd pod: `cuda-ready`) and `plugin-validation` (the node advertises GPUs:
//! `plugin-ready`; left out when the device plugin is disabled, since it would wait forever). Its main
//! container only sleeps, and removes the `*-ready` files when it stops, so a restarted validator proves
//! everything again.

use gpuop_api::cluster_policy::ValidationEnv;
use gpuop_api::component::EnvVar as PolicyEnvVar;
use gpuop_api::{ImageSection, OperandInfo};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, ExecAction, Lifecycle, LifecycleHandler, PodSpec, Volume, VolumeMount,
};

use crate::RenderError;
use crate::daemonset::OperandPod;
use crate::inputs::{Inputs, PulledImage, add_pull_secrets, apply_env, apply_host_network, apply_resources};
use crate::operands::container;
use crate::pod::{
    DRIVER_INSTALL_DIR_VOLUME, HOST_DEV_CHAR_VOLUME, Propagation, VALIDATIONS_VOLUME, apply_host_paths,
    driver_install_dir_mount, env, field_env, host_path, host_root_mount, host_root_volume, mount,
    mount_with, privileged, privileged_s0, run_as_root, set_env, validations_volume,
};
use crate::rbac::access;

/// The validation environment of one component, from `spec.validator.<component>.env`.
fn component_env(
    inputs: &Inputs<'_>,
    pick: fn(&gpuop_api::cluster_policy::ValidatorSpec) -> &Option<ValidationEnv>,
) -> Vec<PolicyEnvVar> {
    inputs
        .spec
        .validator
        .as_ref()
        .and_then(|v| pick(v).as_ref())
        .and_then(|e| e.env.clone())
        .unwrap_or_default()
}

/// A validator init container for one component (`COMPONENT=<component>`), run as root with the
/// validator's resources.
fn validation(
    inputs: &Inputs<'_>,
    image: &PulledImage,
    name: &str,
    vars: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    validator_init_container(inputs, image, name, "nvidia-validator".to_owned(), vars, mounts)
}

/// An init container of the validator image that runs a shell command, as root with the validator's
/// resources.
pub(crate) fn validator_init_container(
    inputs: &Inputs<'_>,
    image: &PulledImage,
    name: &str,
    command: String,
    vars: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    let mut ctr = Container {
        command: Some(vec!["sh".to_owned(), "-c".to_owned()]),
        args: Some(vec![command]),
        env: Some(vars),
        security_context: Some(privileged()),
        volume_mounts: Some(mounts),
        ..container(name, image)
    };
    apply_resources(
        &mut ctr,
        inputs.container(ImageSection::Validator).resources().as_ref(),
    );
    run_as_root(&mut ctr);
    ctr
}

fn validations_mount() -> VolumeMount {
    mount_with(
        VALIDATIONS_VOLUME,
        "/run/nvidia/validations",
        false,
        Some(Propagation::Bidirectional),
    )
}

/// The validator's driver step as an init container (`WITH_WAIT=true`: it waits for a working driver,
/// writes `driver-ready` and creates the `/dev/char` links), with the mounts it needs in this order.
pub(crate) fn driver_validation(
    inputs: &Inputs<'_>,
    image: &PulledImage,
    mounts: Vec<VolumeMount>,
) -> Container {
    let mut ctr = validation(
        inputs,
        image,
        "driver-validation",
        vec![
            env("WITH_WAIT", "true"),
            env("COMPONENT", "driver"),
            field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
        ],
        mounts,
    );
    ctr.security_context = Some(privileged_s0());
    run_as_root(&mut ctr);
    ctr
}

/// Mounts of the driver step in the container toolkit's pod.
pub(crate) fn toolkit_driver_validation_mounts() -> Vec<VolumeMount> {
    vec![
        driver_install_dir_mount("/run/nvidia/driver"),
        validations_mount(),
        host_root_mount(true),
        mount(HOST_DEV_CHAR_VOLUME, "/host-dev-char"),
    ]
}

/// Applies `spec.validator.driver.env` to the driver step, after the `hostPaths` rewrites.
pub(crate) fn apply_driver_validation_env(inputs: &Inputs<'_>, pod: &mut PodSpec) {
    let vars = component_env(inputs, |v| &v.driver);
    for ctr in pod
        .init_containers
        .iter_mut()
        .flatten()
        .filter(|c| c.name == "driver-validation")
    {
        apply_env(ctr, &vars);
    }
}

/// The container that stays up once the init containers passed; removing status files when it stops.
fn sleeper(image: &PulledImage, name: &str, cleanup: &str) -> Container {
    Container {
        command: Some(vec!["sh".to_owned(), "-c".to_owned()]),
        args: Some(vec![
            "echo all validations are successful; while true; do sleep 86400; done".to_owned(),
        ]),
        security_context: Some(privileged()),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec!["sh".to_owned(), "-c".to_owned(), cleanup.to_owned()]),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        volume_mounts: Some(vec![validations_mount()]),
        ..container(name, image)
    }
}

/// A validator DaemonSet's pod, with the `hostPaths` rewrites and the settings of `spec.validator` its main
/// container and the pod take.
fn validator_pod(
    inputs: &Inputs<'_>,
    info: &OperandInfo,
    init: Vec<Container>,
    main: Container,
    volumes: Vec<Volume>,
) -> OperandPod {
    let mut spec = PodSpec {
        service_account_name: Some(access(info.operand).account.to_owned()),
        init_containers: Some(init),
        containers: vec![main],
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    apply_host_paths(&mut spec, &inputs.host_paths);
    let settings = inputs.container(ImageSection::Validator);
    add_pull_secrets(&mut spec, inputs.pull_secrets(ImageSection::Validator));
    settings.apply_resources_to_containers(&mut spec);
    let main = &mut spec.containers[0];
    settings.apply_args(main);
    apply_env(main, settings.env());
    run_as_root(main);
    apply_host_network(&mut spec, settings.host_network());
    OperandPod::new(info, spec).selected_by(&[
        ("app", info.daemonset),
        ("app.kubernetes.io/part-of", "gpu-operator"),
    ])
}

/// Tells the validator which image, pull policy, secrets and RuntimeClass its workload pods (CUDA, plugin)
/// use.
fn workload_env(inputs: &Inputs<'_>, ctr: &mut Container, image: &PulledImage) {
    set_env(ctr, "VALIDATOR_IMAGE", &image.image);
    set_env(ctr, "VALIDATOR_IMAGE_PULL_POLICY", image.pull_policy);
    let secrets = inputs.pull_secrets(ImageSection::Validator);
    if !secrets.is_empty() {
        set_env(ctr, "VALIDATOR_IMAGE_PULL_SECRETS", &secrets.join(","));
    }
    if let Some(class) = inputs.runtime_class() {
        set_env(ctr, "VALIDATOR_RUNTIME_CLASS", class);
    }
}

/// The `nvidia-operator-validator` DaemonSet.
pub(crate) fn operator_validator(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<OperandPod, RenderError> {
    let image = inputs.validator_image(info)?;
    let mut init = vec![driver_validation(
        inputs,
        &image,
        vec![
            host_root_mount(true),
            driver_install_dir_mount("/run/nvidia/driver"),
            validations_mount(),
            mount(HOST_DEV_CHAR_VOLUME, "/host-dev-char"),
        ],
    )];
    init.push(validation(
        inputs,
        &image,
        "toolkit-validation",
        vec![
            env("NVIDIA_VISIBLE_DEVICES", "all"),
            env("WITH_WAIT", "false"),
            env("COMPONENT", "toolkit"),
        ],
        vec![validations_mount()],
    ));
    init.push(validation(
        inputs,
        &image,
        "cuda-validation",
        vec![
            env("WITH_WAIT", "false"),
            env("COMPONENT", "cuda"),
            field_env("NODE_NAME", "spec.nodeName"),
            field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
        ],
        vec![validations_mount()],
    ));
    if inputs.spec.device_plugin.is_enabled() {
        init.push(validation(
            inputs,
            &image,
            "plugin-validation",
            vec![
                env("COMPONENT", "plugin"),
                env("WITH_WAIT", "false"),
                env("WITH_WORKLOAD", "false"),
                env("MIG_STRATEGY", inputs.mig_strategy_name()),
                field_env("NODE_NAME", "spec.nodeName"),
                field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
            ],
            vec![validations_mount()],
        ));
    }
    let main = sleeper(
        &image,
        "nvidia-operator-validator",
        "rm -f /run/nvidia/validations/*-ready",
    );
    let volumes = vec![
        validations_volume(),
        host_path(DRIVER_INSTALL_DIR_VOLUME, "/run/nvidia/driver", None),
        host_root_volume(),
        host_path(HOST_DEV_CHAR_VOLUME, "/dev/char", None),
    ];
    let mut pod = validator_pod(inputs, info, init, main, volumes);
    inputs.gpu_access(&mut pod, "toolkit-validation");
    for ctr in pod.spec.init_containers.iter_mut().flatten() {
        match ctr.name.as_str() {
            "driver-validation" => apply_env(ctr, &component_env(inputs, |v| &v.driver)),
            "toolkit-validation" => apply_env(ctr, &component_env(inputs, |v| &v.toolkit)),
            "cuda-validation" => {
                workload_env(inputs, ctr, &image);
                apply_env(ctr, &component_env(inputs, |v| &v.cuda));
            }
            "plugin-validation" => {
                workload_env(inputs, ctr, &image);
                apply_env(ctr, &component_env(inputs, |v| &v.plugin));
            }
            _ => {}
        }
    }
    Ok(pod)
}

/// The `nvidia-sandbox-validator` DaemonSet: proves the confidential-computing mode, vfio-pci binding, the
/// vGPU manager and vGPU devices, each only where the node's workload needs it (the validator reads the
/// node's workload config; `DEFAULT_GPU_WORKLOAD_CONFIG` covers nodes without one).
pub(crate) fn sandbox_validator(inputs: &Inputs<'_>, info: &OperandInfo) -> Result<OperandPod, RenderError> {
    let image = inputs.validator_image(info)?;
    let waiting = |component: &str| {
        vec![
            env("WITH_WAIT", "true"),
            env("COMPONENT", component),
            field_env("NODE_NAME", "spec.nodeName"),
        ]
    };
    let mut init = Vec::new();
    if inputs.spec.cc_manager_enabled() {
        let mut ctr = validation(
            inputs,
            &image,
            "cc-manager-validation",
            waiting("cc-manager"),
            vec![validations_mount()],
        );
        ctr.security_context = Some(privileged_s0());
        run_as_root(&mut ctr);
        init.push(ctr);
    }
    let mut vfio = validation(
        inputs,
        &image,
        "vfio-pci-validation",
        waiting("vfio-pci"),
        vec![host_root_mount(true), validations_mount()],
    );
    vfio.security_context = Some(privileged_s0());
    run_as_root(&mut vfio);
    init.push(vfio);
    let mut vgpu_manager = validation(
        inputs,
        &image,
        "vgpu-manager-validation",
        waiting("vgpu-manager"),
        vec![
            host_root_mount(true),
            mount_with(
                "driver-install-path",
                "/run/nvidia/driver",
                false,
                Some(Propagation::HostToContainer),
            ),
            validations_mount(),
        ],
    );
    vgpu_manager.security_context = Some(privileged_s0());
    run_as_root(&mut vgpu_manager);
    init.push(vgpu_manager);
    init.push(validation(
        inputs,
        &image,
        "vgpu-devices-validation",
        waiting("vgpu-devices"),
        vec![validations_mount()],
    ));
    let main = sleeper(
        &image,
        "nvidia-sandbox-validator",
        "rm -f /run/nvidia/validations/*",
    );
    let volumes = vec![
        validations_volume(),
        host_path("driver-install-path", "/run/nvidia/driver", None),
        host_root_volume(),
    ];
    let mut pod = validator_pod(inputs, info, init, main, volumes);
    let default_workload = inputs.spec.default_workload();
    for ctr in pod.spec.init_containers.iter_mut().flatten() {
        let vars = match ctr.name.as_str() {
            "vfio-pci-validation" => component_env(inputs, |v| &v.vfio_pci),
            "vgpu-manager-validation" => component_env(inputs, |v| &v.vgpu_manager),
            "vgpu-devices-validation" => component_env(inputs, |v| &v.vgpu_devices),
            _ => continue,
        };
        set_env(ctr, "DEFAULT_GPU_WORKLOAD_CONFIG", default_workload);
        apply_env(ctr, &vars);
    }
    Ok(pod)
}
