//! A simulated kubelet's decision for one pod, as a pure function: from the pod as it is, the host, the
//! faults and the time, the pod's next status and the status files its validation steps write.
//!
//! Containers are recognised by the contract NVIDIA's images follow, not by name alone: an init container
//! whose command waits for `/run/nvidia/validations/<file>` completes when the file exists; one with a
//! `COMPONENT` environment variable runs the validator's step (with `WITH_WAIT=true` it retries inside the
//! container, otherwise it fails and the kubelet restarts it with a back-off); main containers of operand
//! pods may fail the way the real ones do (a driver container on a host that has a driver, an injected
//! crash loop, a device plugin or feature discovery starting where there is no driver to load NVML from).
//! Pods go Pending, through their init containers one by one, to Running and Ready.

use std::time::Duration;

use gpuop_api::catalogue::status_file;
use gpuop_api::labels::VALIDATIONS_DIR;
use gpuop_api::{OPERANDS, Operand};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::heartbeat::Heartbeats;
use crate::host::Host;

/// How long things take on a simulated node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Pulling a pod's images.
    pub image_pull: Duration,
    /// A container becoming ready after it starts.
    pub ready_after: Duration,
    /// Waiting before restarting a failed container.
    pub crash_backoff: Duration,
    /// How often a waiting container looks again.
    pub poll: Duration,
    /// The kubelets' Lease renewals and status reports, which a real cluster's node lifecycle controller
    /// needs to keep the nodes Ready; `None` gives none (the fake server has no such controller, and the
    /// benchmarks count requests).
    pub heartbeats: Option<Heartbeats>,
}

impl Timing {
    /// The same timing with the kubelets' heartbeats.
    #[must_use]
    pub fn with_heartbeats(self, heartbeats: Heartbeats) -> Self {
        Self {
            heartbeats: Some(heartbeats),
            ..self
        }
    }

    /// Realistic enough to watch: seconds, not minutes.
    pub fn demo() -> Self {
        Self {
            image_pull: Duration::from_millis(800),
            ready_after: Duration::from_millis(400),
            crash_backoff: Duration::from_secs(3),
            poll: Duration::from_millis(250),
            heartbeats: None,
        }
    }

    /// As fast as possible, for tests and benchmarks.
    pub fn instant() -> Self {
        Self {
            image_pull: Duration::ZERO,
            ready_after: Duration::ZERO,
            crash_backoff: Duration::from_millis(200),
            poll: Duration::from_millis(50),
            heartbeats: None,
        }
    }
}

/// Faults that apply to one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFaults {
    /// The main container exits with this message, running or not.
    pub crash: Option<String>,
    /// The main container exits with this message every time it starts; once running it keeps running (a
    /// driver container that has loaded its driver is not touched by a later install fault).
    pub start_crash: Option<String>,
    /// Extra time to pull the images.
    pub slow_pull: Duration,
}

/// What the kubelet does next for a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The pod's new status.
    pub status: PodStatus,
    /// Status files written under `/run/nvidia/validations`.
    pub writes: Vec<&'static str>,
    /// When to look at the pod again even if nothing changes.
    pub wake_after: Option<Duration>,
}

/// What a container does, as the simulator recognises it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Waits until a status file exists (`until [ -f /run/nvidia/validations/<file> ]`).
    WaitsFor(String),
    /// Runs a validator step (`COMPONENT=<component>`), retrying inside when `wait` is set.
    Validates {
        /// `driver`, `toolkit`, `cuda`, `plugin`, ...
        component: String,
        /// `WITH_WAIT=true`.
        wait: bool,
    },
    /// Runs and keeps running.
    Runs,
}

/// How the simulator understands a container.
pub fn behaviour(container: &Container) -> Behaviour {
    let env = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .and_then(|v| v.value.clone())
    };
    if let Some(component) = env("COMPONENT") {
        return Behaviour::Validates {
            component,
            wait: env("WITH_WAIT").as_deref() == Some("true"),
        };
    }
    let script: String = container
        .command
        .iter()
        .chain(container.args.iter())
        .flatten()
        .map(|s| format!("{s} "))
        .collect();
    if let Some(rest) = script.split(&format!("{VALIDATIONS_DIR}/")).nth(1) {
        let file: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
            .collect();
        if !file.is_empty() {
            return Behaviour::WaitsFor(file);
        }
    }
    Behaviour::Runs
}

/// The operand a pod belongs to, from its labels (`app.kubernetes.io/component`, else `app`).
pub fn operand_of(pod: &Pod) -> Option<Operand> {
    let labels = pod.metadata.labels.as_ref()?;
    if let Some(component) = labels.get(gpuop_api::labels::COMPONENT)
        && let Some(info) = OPERANDS.iter().find(|info| info.component == component)
    {
        return Some(info.operand);
    }
    // Operand pods carry NVIDIA's `app` label (`name` for the VFIO, CC and Kata managers): the DaemonSet's
    // name, or for drivers per OS or kernel the name with a suffix. The longest matching name wins
    // (`nvidia-dcgm-exporter` is not `nvidia-dcgm`).
    let app = labels.get("app").or_else(|| labels.get("name"))?;
    OPERANDS
        .iter()
        .filter(|info| app == info.daemonset || app.starts_with(&format!("{}-", info.daemonset)))
        .max_by_key(|info| info.daemonset.len())
        .map(|info| info.operand)
}

/// The status file a validator component writes when it passes.
fn validation_file(component: &str) -> Option<&'static str> {
    match component {
        "driver" => Some(status_file::DRIVER_READY),
        "toolkit" => Some(status_file::TOOLKIT_READY),
        "cuda" => Some(status_file::CUDA_READY),
        "plugin" => Some(status_file::PLUGIN_READY),
        _ => None,
    }
}

/// Why an operand's main container fails on this host, if it does.
pub fn main_container_failure(operand: Option<Operand>, host: &Host, faults: &PodFaults) -> Option<String> {
    if let Some(message) = &faults.crash {
        return Some(message.clone());
    }
    match operand {
        Some(Operand::Driver) if host.preinstalled_driver.is_some() => Some(format!(
            "NVIDIA driver {} is already loaded on the host; the driver container cannot load its own",
            host.preinstalled_driver.as_deref().unwrap_or_default()
        )),
        Some(Operand::Driver) if host.model.is_none() => Some("no NVIDIA GPU found on this node".to_owned()),
        _ => None,
    }
}

/// Why an operand's main container exits as it starts on this host, if it does. Unlike
/// [`main_container_failure`] this does not touch a container already running: the device plugin, feature
/// discovery and the DCGM pair load NVML at start (`FAIL_ON_INIT_ERROR=true` in the operator's DaemonSets)
/// and exit when no driver is there, but one that started keeps running if the driver goes later.
pub fn start_failure(operand: Option<Operand>, host: &Host) -> Option<String> {
    match operand {
        Some(
            Operand::DevicePlugin
            | Operand::GpuFeatureDiscovery
            | Operand::MpsControlDaemon
            | Operand::Dcgm
            | Operand::DcgmExporter,
        ) if host.driver_version().is_none() => Some(
            "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND (no NVIDIA driver on the host)".to_owned(),
        ),
        _ => None,
    }
}

/// The kubelet's next step for a pod bound to this node.
pub fn step(
    pod: &Pod,
    host: &Host,
    allocatable_gpus: u64,
    faults: &PodFaults,
    timing: Timing,
    now: Timestamp,
) -> Step {
    // Read, not copied: the kubelets step every pod of a large cluster on each pass.
    let no_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&no_spec);
    let mut status = pod.status.clone().unwrap_or_default();
    let mut writes = Vec::new();
    let started = status.start_time.as_ref().map(|t| t.0);
    let Some(started) = started else {
        // Just bound: start pulling images.
        status.phase = Some("Pending".into());
        status.start_time = Some(Time(now));
        status.host_ip = Some("10.0.0.1".into());
        status.conditions = Some(vec![condition("PodScheduled", true, now)]);
        status.init_container_statuses = waiting_all(
            spec.init_containers.as_deref().unwrap_or_default(),
            "PodInitializing",
        );
        status.container_statuses =
            Some(waiting_all(&spec.containers, "ContainerCreating").unwrap_or_default());
        return Step {
            status,
            writes,
            wake_after: Some(timing.image_pull + faults.slow_pull),
        };
    };
    let pulled_at = started + (timing.image_pull + faults.slow_pull);
    if now < pulled_at {
        return Step {
            status,
            writes,
            wake_after: Some(until(now, pulled_at)),
        };
    }

    // Init containers, one at a time.
    let inits: &[Container] = spec.init_containers.as_deref().unwrap_or_default();
    let mut init_statuses = status
        .init_container_statuses
        .clone()
        .unwrap_or_else(|| waiting_all(inits, "PodInitializing").unwrap_or_default());
    init_statuses.resize_with(inits.len(), ContainerStatus::default);
    for (container, container_status) in inits.iter().zip(init_statuses.iter_mut()) {
        container_status.name.clone_from(&container.name);
        container_status.image = container.image.clone().unwrap_or_default();
        if succeeded(container_status) {
            continue;
        }
        // A failed init container waits out its back-off before it runs again, however often the
        // kubelet looks at the pod meanwhile.
        let backoff = backoff_end(container_status, timing).filter(|ends| now < *ends);
        let wake = if let Some(ends) = backoff {
            until(now, ends)
        } else {
            let outcome = match behaviour(container) {
                Behaviour::WaitsFor(file) => {
                    if host.has_file(&file) {
                        Some(Ok(()))
                    } else {
                        None
                    }
                }
                Behaviour::Validates { component, wait } => {
                    if host.validation_passes(&component, allocatable_gpus) {
                        writes.extend(validation_file(&component));
                        Some(Ok(()))
                    } else if wait {
                        None
                    } else {
                        Some(Err(format!("{component} validation failed")))
                    }
                }
                Behaviour::Runs => Some(Ok(())),
            };
            match outcome {
                Some(Ok(())) => {
                    container_status.state = Some(terminated(0, "Completed", None, now));
                    container_status.ready = true;
                    continue;
                }
                // Still waiting inside the container.
                None => {
                    if !is_running(container_status) {
                        container_status.state = Some(running(now));
                    }
                    timing.poll
                }
                Some(Err(message)) => crash(container_status, &message, timing, now),
            }
        };
        status.init_container_statuses = Some(init_statuses);
        status.phase = Some("Pending".into());
        set_conditions(&mut status, false, false, now);
        return Step {
            status,
            writes,
            wake_after: Some(wake),
        };
    }
    if !inits.is_empty() {
        status.init_container_statuses = Some(init_statuses);
    }

    // Main containers.
    let operand = operand_of(pod);
    let failure = main_container_failure(operand, host, faults);
    let at_start = start_failure(operand, host).or_else(|| faults.start_crash.clone());
    let mut statuses = status.container_statuses.clone().unwrap_or_default();
    statuses.resize_with(spec.containers.len(), ContainerStatus::default);
    let mut wake = None;
    let mut all_ready = true;
    for (index, (container, container_status)) in spec.containers.iter().zip(statuses.iter_mut()).enumerate()
    {
        container_status.name.clone_from(&container.name);
        container_status.image = container.image.clone().unwrap_or_default();
        // Only the first (main) container of an operand pod carries the operand's failure.
        let starting = running_since(container_status).is_none();
        let fails = match index {
            0 => failure.as_deref().or(at_start.as_deref().filter(|_| starting)),
            _ => None,
        };
        match (fails, running_since(container_status)) {
            (Some(message), _) => {
                if let Some(backoff_ends) = backoff_end(container_status, timing)
                    && now < backoff_ends
                {
                    wake = Some(until(now, backoff_ends));
                    all_ready = false;
                    continue;
                }
                wake = Some(crash(container_status, message, timing, now));
                all_ready = false;
            }
            (None, None) => {
                container_status.state = Some(running(now));
                container_status.started = Some(true);
                container_status.ready = timing.ready_after.is_zero();
                all_ready &= container_status.ready;
                if !container_status.ready {
                    wake = Some(timing.ready_after);
                }
            }
            (None, Some(since)) => {
                let ready_at = since + timing.ready_after;
                if now >= ready_at {
                    container_status.ready = true;
                } else {
                    all_ready = false;
                    wake = Some(until(now, ready_at));
                }
            }
        }
    }
    status.container_statuses = Some(statuses);
    status.phase = Some("Running".into());
    status.pod_ip.get_or_insert_with(|| "10.244.0.10".into());
    set_conditions(&mut status, true, all_ready, now);
    Step {
        status,
        writes,
        wake_after: wake,
    }
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now)).unwrap_or(Duration::ZERO)
}

fn condition(type_: &str, true_: bool, now: Timestamp) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: if true_ { "True" } else { "False" }.to_owned(),
        last_transition_time: Some(Time(now)),
        ..PodCondition::default()
    }
}

fn set_conditions(status: &mut PodStatus, initialized: bool, ready: bool, now: Timestamp) {
    let wanted = [
        ("PodScheduled", true),
        ("Initialized", initialized),
        ("ContainersReady", ready),
        ("Ready", ready),
    ];
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for (type_, value) in wanted {
        let value_text = if value { "True" } else { "False" };
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(existing) if existing.status == value_text => {}
            Some(existing) => *existing = condition(type_, value, now),
            None => conditions.push(condition(type_, value, now)),
        }
    }
}

fn waiting_all(containers: &[Container], reason: &str) -> Option<Vec<ContainerStatus>> {
    (!containers.is_empty()).then(|| {
        containers
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                state: Some(ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.to_owned()),
                        message: None,
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            })
            .collect()
    })
}

fn running(now: Timestamp) -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(Time(now)),
        }),
        ..ContainerState::default()
    }
}

fn terminated(exit_code: i32, reason: &str, message: Option<&str>, now: Timestamp) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            reason: Some(reason.to_owned()),
            message: message.map(str::to_owned),
            finished_at: Some(Time(now)),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}

fn succeeded(status: &ContainerStatus) -> bool {
    status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

fn is_running(status: &ContainerStatus) -> bool {
    status.state.as_ref().and_then(|s| s.running.as_ref()).is_some()
}

fn running_since(status: &ContainerStatus) -> Option<Timestamp> {
    status
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0)
}

/// When the back-off after the last failure ends, if the container is waiting in one.
///
/// The exit time comes back from the API server in whole seconds, so the back-off counts from the end of
/// that second: it lasts between `crash_backoff` and a second more, never less. (Counted from the
/// truncated time, a back-off under a second would be over before it began, and a crash-looping container
/// would restart, and be reported, at every look.)
fn backoff_end(status: &ContainerStatus, timing: Timing) -> Option<Timestamp> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    if waiting.reason.as_deref() != Some("CrashLoopBackOff") {
        return None;
    }
    Some(last_finished(status)? + (API_TIME_PRECISION + timing.crash_backoff))
}

/// When the container last exited, as its last terminated state says.
pub fn last_finished(status: &ContainerStatus) -> Option<Timestamp> {
    Some(
        status
            .last_state
            .as_ref()?
            .terminated
            .as_ref()?
            .finished_at
            .as_ref()?
            .0,
    )
}

/// The precision of the times the API server keeps (`metav1.Time` is RFC 3339 in whole seconds).
const API_TIME_PRECISION: Duration = Duration::from_secs(1);

/// Records a failure: the last state is the exit, the container waits in CrashLoopBackOff.
fn crash(status: &mut ContainerStatus, message: &str, timing: Timing, now: Timestamp) -> Duration {
    status.restart_count += 1;
    status.ready = false;
    status.started = Some(false);
    status.last_state = Some(terminated(1, "Error", Some(message), now));
    status.state = Some(ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some("CrashLoopBackOff".into()),
            message: Some(format!(
                "back-off restarting failed container {}: {message}",
                status.name
            )),
        }),
        ..ContainerState::default()
    });
    timing.crash_backoff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::GpuModel;
    use k8s_openapi::api::core::v1::{EnvVar, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn container(name: &str, command: &[&str], env: &[(&str, &str)]) -> Container {
        Container {
            name: name.to_owned(),
            image: Some("img".into()),
            command: (!command.is_empty()).then(|| command.iter().map(|s| (*s).to_owned()).collect()),
            env: (!env.is_empty()).then(|| {
                env.iter()
                    .map(|(n, v)| EnvVar {
                        name: (*n).to_owned(),
                        value: Some((*v).to_owned()),
                        ..EnvVar::default()
                    })
                    .collect()
            }),
            ..Container::default()
        }
    }

    fn pod(app: &str, inits: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(inits),
                containers: vec![container("main", &[], &[])],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn pods_labelled_as_nvidia_labels_them_are_told_apart_by_their_app_label() {
        // NVIDIA's operand pods carry no component label (but the driver's): `app` decides.
        let operand = |app: &str| operand_of(&pod(app, Vec::new()));
        assert_eq!(operand("nvidia-dcgm-exporter"), Some(Operand::DcgmExporter));
        assert_eq!(operand("nvidia-dcgm"), Some(Operand::Dcgm));
        assert_eq!(
            operand("nvidia-driver-daemonset-ubuntu22.04"),
            Some(Operand::Driver)
        );
        assert_eq!(operand("kube-proxy"), None);
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    /// Runs the kubelet on the pod until it stops changing or the time runs out; returns the last step.
    /// The status goes through JSON between steps, as it does through the API server.
    fn run(mut pod: Pod, host: &mut Host, faults: &PodFaults, seconds: i64) -> Step {
        let timing = Timing::instant();
        let mut last = None;
        for tick in 0..seconds * 20 {
            let now = at(1_000) + Duration::from_millis(tick as u64 * 50);
            let step = step(&pod, host, 8, faults, timing, now);
            for file in &step.writes {
                host.validations.insert((*file).to_owned());
            }
            let stored = serde_json::to_value(&step.status).expect("serializes");
            pod.status = Some(serde_json::from_value(stored).expect("deserializes"));
            last = Some(step);
        }
        last.unwrap()
    }

    fn state(status: &PodStatus) -> String {
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        format!(
            "{}{}",
            status.phase.as_deref().unwrap_or("?"),
            if ready { "/Ready" } else { "" }
        )
    }

    #[test]
    fn containers_are_recognised_by_the_operand_contract() {
        let wait = container(
            "toolkit-validation",
            &[
                "sh",
                "-c",
                "until [ -f /run/nvidia/validations/toolkit-ready ]; do sleep 5; done",
            ],
            &[],
        );
        assert_eq!(behaviour(&wait), Behaviour::WaitsFor("toolkit-ready".into()));
        let validate = container(
            "driver-validation",
            &["nvidia-validator"],
            &[("COMPONENT", "driver"), ("WITH_WAIT", "true")],
        );
        assert_eq!(
            behaviour(&validate),
            Behaviour::Validates {
                component: "driver".into(),
                wait: true
            }
        );
        assert_eq!(
            behaviour(&container("main", &["nvidia-device-plugin"], &[])),
            Behaviour::Runs
        );
        assert_eq!(
            operand_of(&pod("nvidia-device-plugin-daemonset", vec![])),
            Some(Operand::DevicePlugin)
        );
        assert_eq!(
            operand_of(&pod("nvidia-driver-daemonset-ubuntu22.04", vec![])),
            Some(Operand::Driver)
        );
        assert_eq!(operand_of(&pod("something-else", vec![])), None);
    }

    #[test]
    fn a_pod_waiting_for_a_status_file_stays_in_init_until_it_exists() {
        let waits = container(
            "toolkit-validation",
            &[
                "sh",
                "-c",
                "until [ -f /run/nvidia/validations/toolkit-ready ]; do sleep 5; done",
            ],
            &[],
        );
        let mut host = Host::new(Some(GpuModel::A100_80GB), 8, Some("580.82.07".into()));
        let stuck = run(
            pod("nvidia-device-plugin-daemonset", vec![waits.clone()]),
            &mut host,
            &PodFaults::default(),
            2,
        );
        assert_eq!(state(&stuck.status), "Pending");
        assert!(
            is_running(&stuck.status.init_container_statuses.as_ref().unwrap()[0]),
            "Init:0/1, running its loop"
        );
        host.validations.insert("toolkit-ready".into());
        let done = run(
            pod("nvidia-device-plugin-daemonset", vec![waits]),
            &mut host,
            &PodFaults::default(),
            2,
        );
        assert_eq!(state(&done.status), "Running/Ready");
    }

    #[test]
    fn validator_steps_write_their_files_in_order() {
        let validator = pod(
            "nvidia-operator-validator",
            vec![
                container(
                    "driver-validation",
                    &[],
                    &[("COMPONENT", "driver"), ("WITH_WAIT", "true")],
                ),
                container(
                    "toolkit-validation",
                    &[],
                    &[("COMPONENT", "toolkit"), ("WITH_WAIT", "false")],
                ),
                container(
                    "cuda-validation",
                    &[],
                    &[("COMPONENT", "cuda"), ("WITH_WAIT", "false")],
                ),
                container(
                    "plugin-validation",
                    &[],
                    &[("COMPONENT", "plugin"), ("WITH_WAIT", "false")],
                ),
            ],
        );
        let mut host = Host::new(Some(GpuModel::H100_80GB), 8, Some("580.82.07".into()));
        // The host driver validates; the toolkit step fails until the runtime is wired, and restarts.
        let blocked = run(validator.clone(), &mut host, &PodFaults::default(), 2);
        assert!(host.has_file("driver-ready") && !host.has_file("toolkit-ready"));
        let toolkit = &blocked.status.init_container_statuses.as_ref().unwrap()[1];
        assert!(toolkit.restart_count >= 1);
        assert_eq!(
            toolkit
                .state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("CrashLoopBackOff")
        );
        assert!(
            toolkit.restart_count <= 2,
            "in 2 s, restarts follow the back-off (at least a second apart), not the kubelet's looks: {}",
            toolkit.restart_count
        );
        host.runtime_wired = true;
        let done = run(validator, &mut host, &PodFaults::default(), 3);
        assert_eq!(state(&done.status), "Running/Ready");
        for file in ["driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"] {
            assert!(host.has_file(file), "{file}");
        }
    }

    #[test]
    fn a_driver_container_on_a_host_with_a_driver_crash_loops() {
        let mut host = Host::new(Some(GpuModel::L4), 4, Some("580.82.07".into()));
        let step = run(
            pod("nvidia-driver-daemonset", vec![]),
            &mut host,
            &PodFaults::default(),
            3,
        );
        let main = &step.status.container_statuses.as_ref().unwrap()[0];
        assert!(main.restart_count >= 2, "it keeps restarting");
        assert!(
            main.last_state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .message
                .as_deref()
                .unwrap()
                .contains("already loaded")
        );
        assert_eq!(
            state(&step.status),
            "Running",
            "Running but never Ready, as kubectl shows CrashLoopBackOff"
        );
        let mut fresh = Host::new(Some(GpuModel::L4), 4, None);
        let ok = run(
            pod("nvidia-driver-daemonset", vec![]),
            &mut fresh,
            &PodFaults::default(),
            1,
        );
        assert_eq!(state(&ok.status), "Running/Ready");
    }

    #[test]
    fn a_device_plugin_without_a_driver_exits_at_start_until_one_is_there() {
        let mut host = Host::new(Some(GpuModel::H100_80GB), 8, None);
        let plugin = pod("nvidia-device-plugin-daemonset", vec![]);
        let crashing = run(plugin.clone(), &mut host, &PodFaults::default(), 1);
        let main = &crashing.status.container_statuses.as_ref().unwrap()[0];
        assert!(main.restart_count >= 1);
        assert!(
            main.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .and_then(|t| t.message.as_deref())
                .is_some_and(|m| m.contains("ERROR_LIBRARY_NOT_FOUND"))
        );
        assert_eq!(state(&crashing.status), "Running");
        host.loaded_driver = Some("580.82.07".into());
        let running = run(plugin, &mut host, &PodFaults::default(), 1);
        assert_eq!(state(&running.status), "Running/Ready");
        // A running plugin is not killed when the driver goes.
        host.loaded_driver = None;
        let mut pod = pod("nvidia-device-plugin-daemonset", vec![]);
        pod.status = Some(running.status);
        let later = step(
            &pod,
            &host,
            8,
            &PodFaults::default(),
            Timing::instant(),
            at(2_000),
        );
        assert_eq!(state(&later.status), "Running/Ready");
    }

    #[test]
    fn injected_crashes_and_slow_pulls() {
        let mut host = Host::new(Some(GpuModel::T4), 1, None);
        let faults = PodFaults {
            crash: Some("segfault".into()),
            ..PodFaults::default()
        };
        let crashing = run(pod("gpu-feature-discovery", vec![]), &mut host, &faults, 2);
        assert!(crashing.status.container_statuses.as_ref().unwrap()[0].restart_count >= 1);
        let slow = PodFaults {
            slow_pull: Duration::from_secs(30),
            ..PodFaults::default()
        };
        let pulling = run(pod("gpu-feature-discovery", vec![]), &mut host, &slow, 2);
        assert_eq!(state(&pulling.status), "Pending");
    }

    #[test]
    fn a_start_crash_fails_a_starting_driver_and_leaves_a_running_one() {
        let mut host = Host::new(Some(GpuModel::H100_80GB), 8, None);
        let install_fails = PodFaults {
            start_crash: Some("failed to install the NVIDIA driver".into()),
            ..PodFaults::default()
        };
        let running = run(
            pod("nvidia-driver-daemonset", vec![]),
            &mut host,
            &PodFaults::default(),
            1,
        );
        assert_eq!(state(&running.status), "Running/Ready");
        let mut loaded = pod("nvidia-driver-daemonset", vec![]);
        loaded.status = Some(running.status);
        let later = step(&loaded, &host, 8, &install_fails, Timing::instant(), at(2_000));
        assert_eq!(
            state(&later.status),
            "Running/Ready",
            "a loaded driver keeps running"
        );
        let starting = run(
            pod("nvidia-driver-daemonset", vec![]),
            &mut host,
            &install_fails,
            2,
        );
        let main = &starting.status.container_statuses.as_ref().unwrap()[0];
        assert!(main.restart_count >= 2, "it fails at every start: {main:?}");
        assert_eq!(state(&starting.status), "Running");
    }
}
