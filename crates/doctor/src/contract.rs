//! The seven checks of the node contract, as far as the API shows them: host, runtime, resource, labels,
//! positive placement, negative placement and operations.
//!
//! Each check returns its verdict when no finding fails it; problems it finds itself (a missing RuntimeClass,
//! advertised GPUs that disagree with the GPU count, a failed MIG layout) are added as `contract` findings.
//! A check whose evidence the API cannot show says `unknown` and why, rather than guessing.

use std::collections::BTreeMap;

use gpuop_api::catalogue::status_file;
use gpuop_api::choice::{MigStrategy, WorkloadConfig};
use gpuop_api::labels::{
    CUDA_DRIVER_MAJOR, CUDA_DRIVER_MINOR, CUDA_DRIVER_REV, CUDA_DRIVER_VERSION_FULL, DEPLOY_OPERANDS,
    GPU_COUNT, GPU_PRESENT, GPU_PRODUCT, GPU_REPLICAS, MIG_CONFIG, MIG_CONFIG_STATE, MIG_STRATEGY,
    PAUSED_FOR_DRIVER_UPGRADE, PAUSED_FOR_MIG_CHANGE, RESOURCE_GPU, RESOURCE_MIG_PREFIX, UPGRADE_STATE,
};
use gpuop_api::upgrade::UpgradeState;
use gpuop_api::{OPERANDS, Operand};

use crate::node_view::{NodeContext, Validation, not_applicable, validation};
use crate::pod_state::PodState;
use crate::report::{Check, CheckResult, CheckStatus, Finding, FindingKind, Link};
use crate::resources::Side;

/// Upgrade states in which nothing is in progress.
/// MIG manager states.
const MIG_FAILED: &str = "failed";
const MIG_IN_PROGRESS: &[&str] = &["pending", "rebooting"];
/// Suffix GFD gives the product under the single strategy when the MIG layout does not fit it.
const MIG_INVALID_SUFFIX: &str = "-MIG-INVALID";

/// Runs the seven checks on a node.
pub(crate) fn checks(
    context: &NodeContext<'_>,
    findings: &mut Vec<Finding>,
    notes: &mut Vec<String>,
) -> Vec<CheckResult> {
    if !context.gpu {
        let why = format!("the node has no NVIDIA GPU ({})", context.evidence);
        let mut results: Vec<CheckResult> = Check::ALL
            .iter()
            .filter(|c| **c != Check::NegativePlacement)
            .map(|check| not_applicable(*check, &why))
            .collect();
        results.insert(5, negative_placement(context, findings));
        return results;
    }
    let container = context.workload == WorkloadConfig::Container;
    let vm = format!(
        "the node runs virtual machines (workload config {}); only its operand pods are judged",
        context.workload
    );
    vec![
        host(context, notes),
        if container {
            runtime(context, findings)
        } else {
            not_applicable(Check::Runtime, &vm)
        },
        if container {
            resource(context, findings, notes)
        } else {
            not_applicable(Check::Resource, &vm)
        },
        labels(context, findings, notes),
        if container {
            positive_placement(context)
        } else {
            not_applicable(Check::PositivePlacement, &vm)
        },
        negative_placement(context, findings),
        operations(context, findings, notes),
    ]
}

fn result(check: Check, status: CheckStatus, message: String) -> CheckResult {
    CheckResult {
        check,
        status,
        message,
    }
}

fn contract(check: Check, link: Link, operand: Option<Operand>, message: String) -> Finding {
    Finding {
        kind: FindingKind::Contract,
        operand,
        check,
        link,
        message,
        pod: None,
    }
}

/// A finding of the resource check that the device plugin advertises the wrong resources.
fn device_plugin_finding(message: String) -> Finding {
    contract(
        Check::Resource,
        Link::DevicePlugin,
        Some(Operand::DevicePlugin),
        message,
    )
}

/// `(driver 550.107.02)`, from feature discovery's labels.
fn driver_version(context: &NodeContext<'_>) -> String {
    if let Some(full) = context.label(CUDA_DRIVER_VERSION_FULL) {
        return format!(" (driver {full})");
    }
    match (
        context.label(CUDA_DRIVER_MAJOR),
        context.label(CUDA_DRIVER_MINOR),
        context.label(CUDA_DRIVER_REV),
    ) {
        (Some(major), Some(minor), Some(rev)) if !rev.is_empty() => {
            format!(" (driver {major}.{minor}.{rev})")
        }
        (Some(major), Some(minor), _) => format!(" (driver {major}.{minor})"),
        (Some(major), None, _) => format!(" (driver {major}.x)"),
        _ => " (driver version unknown: no feature-discovery label)".to_owned(),
    }
}

fn ready_pod_text(context: &NodeContext<'_>, operand: Operand) -> Option<String> {
    context
        .wanted(operand)
        .find(|r| r.is_ready())
        .and_then(|r| r.pod)
        .map(|pod| format!("{operand} pod {} is ready", pod.key()))
}

/// Why a wanted operand is not ready: `container-toolkit is Init:0/1: init container driver-validation ...`.
fn waiting_text(context: &NodeContext<'_>, operand: Operand) -> String {
    match context.wanted(operand).next() {
        Some(row) => format!(
            "{operand} is {}{}",
            row.state_words(),
            row.state
                .as_ref()
                .and_then(PodState::detail)
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        ),
        None => format!("{operand} is not deployed here"),
    }
}

fn host(context: &NodeContext<'_>, notes: &mut Vec<String>) -> CheckResult {
    let version = driver_version(context);
    if context.workload != WorkloadConfig::Container {
        let host_operands: Vec<_> = context
            .rows
            .iter()
            .filter(|r| r.wanted() && Check::of(r.operand) == Check::Host)
            .collect();
        return if !host_operands.is_empty() && host_operands.iter().all(|r| r.is_ready()) {
            result(
                Check::Host,
                CheckStatus::Pass,
                "host operands are ready".to_owned(),
            )
        } else {
            result(
                Check::Host,
                CheckStatus::Unknown,
                "no host operand (vGPU or VFIO manager) is ready here".to_owned(),
            )
        };
    }
    if context.wanted(Operand::Driver).next().is_some() {
        return match ready_pod_text(context, Operand::Driver) {
            Some(text) => result(Check::Host, CheckStatus::Pass, format!("{text}{version}")),
            None => result(
                Check::Host,
                CheckStatus::Fail,
                waiting_text(context, Operand::Driver),
            ),
        };
    }
    let label = Operand::Driver.info().deploy_label;
    let why = match context.label(label) {
        Some(value @ (PAUSED_FOR_DRIVER_UPGRADE | PAUSED_FOR_MIG_CHANGE)) => {
            notes.push(format!("the driver is paused on this node ({label}={value})"));
            format!("{label}={value}")
        }
        Some(value) => format!("{label}={value}"),
        None => match context.cluster.policy_spec() {
            Some(spec) if !(Operand::Driver.info().enabled)(spec) => format!(
                "ClusterPolicy {} does not deploy the driver",
                context.cluster.policy_name()
            ),
            _ => "no driver DaemonSet selects the node".to_owned(),
        },
    };
    match validation(context, status_file::DRIVER_READY) {
        Validation::Passed => result(
            Check::Host,
            CheckStatus::Pass,
            format!(
                "the driver is not deployed by the operator ({why}); the validator's driver validation passed, \
                 so a host driver works{version}"
            ),
        ),
        Validation::Failing(detail) => result(
            Check::Host,
            CheckStatus::Unknown,
            format!("the driver is not deployed by the operator ({why}); {detail}"),
        ),
        Validation::Unknown => {
            if context.wanted(Operand::ContainerToolkit).any(|r| r.is_ready()) {
                result(
                    Check::Host,
                    CheckStatus::Pass,
                    format!(
                        "the driver is not deployed by the operator ({why}); the container toolkit is ready, \
                         which waits for a working driver{version}"
                    ),
                )
            } else {
                result(
                    Check::Host,
                    CheckStatus::Unknown,
                    format!(
                        "the driver is not deployed by the operator ({why}); the API cannot show whether a host \
                         driver works: no validator or toolkit on this node got past driver validation"
                    ),
                )
            }
        }
    }
}

fn runtime(context: &NodeContext<'_>, findings: &mut Vec<Finding>) -> CheckResult {
    let mut parts = Vec::new();
    let mut status = CheckStatus::Pass;
    if context.wanted(Operand::ContainerToolkit).next().is_some() {
        match ready_pod_text(context, Operand::ContainerToolkit) {
            Some(text) => parts.push(text),
            None => {
                status = CheckStatus::Fail;
                parts.push(waiting_text(context, Operand::ContainerToolkit));
            }
        }
    } else {
        match validation(context, status_file::TOOLKIT_READY) {
            Validation::Passed => parts.push(
                "the container toolkit is not deployed by the operator; the validator's toolkit validation \
                 passed, so the runtime injects GPUs"
                    .to_owned(),
            ),
            _ => {
                status = CheckStatus::Unknown;
                parts.push(
                    "the container toolkit is not deployed by the operator (installed on the host?); the API \
                     cannot show whether the runtime injects GPUs"
                        .to_owned(),
                );
            }
        }
    }

    // RuntimeClasses the node's operands need: the policy's, and those their pod templates name.
    let mut needed: Vec<(String, String)> = Vec::new();
    if let Some(spec) = context.cluster.policy_spec()
        && !spec.nri_plugin_enabled()
    {
        needed.push((
            spec.operator.runtime_class().to_owned(),
            format!(
                "spec.operator.runtimeClass of ClusterPolicy {}",
                context.cluster.policy_name()
            ),
        ));
    }
    for row in context.rows.iter().filter(|r| r.wanted()) {
        if let Some(set) = row.set
            && let Some(class) = set.spec.runtime_class_name.as_deref()
            && !needed.iter().any(|(name, _)| name == class)
        {
            needed.push((class.to_owned(), format!("pod template of DaemonSet {}", set.key)));
        }
    }
    match context.cluster.runtime_classes.as_ref() {
        Some(known) => {
            for (class, source) in &needed {
                if !known.contains(class.as_str()) {
                    findings.push(contract(
                        Check::Runtime,
                        Link::Toolkit,
                        None,
                        format!(
                            "RuntimeClass {class} ({source}) does not exist: pods that name it are refused and \
                             operand pods cannot start"
                        ),
                    ));
                }
            }
            if !needed.is_empty() {
                let names: Vec<&str> = needed.iter().map(|(name, _)| name.as_str()).collect();
                parts.push(format!("RuntimeClass {} exists", names.join(", ")));
            }
        }
        None if !needed.is_empty() => {
            parts.push("whether the RuntimeClass exists is unknown (not in the snapshot)".to_owned());
        }
        None => {}
    }
    result(Check::Runtime, status, parts.join("; "))
}

/// A count label as a number.
fn count_label(context: &NodeContext<'_>, key: &str) -> Option<i64> {
    context.label(key)?.parse().ok()
}

fn resource(context: &NodeContext<'_>, findings: &mut Vec<Finding>, notes: &mut Vec<String>) -> CheckResult {
    let capacity = context.gpu_resources(Side::Capacity);
    let advertised = capacity
        .iter()
        .map(|(name, count)| format!("{name}={count}"))
        .collect::<Vec<_>>()
        .join(", ");
    let policy_strategy = context
        .cluster
        .policy_spec()
        .and_then(|s| s.mig_strategy())
        .and_then(MigStrategy::parse);
    let node_strategy = context.label(MIG_STRATEGY).and_then(MigStrategy::parse);
    let strategy = node_strategy.or(policy_strategy);

    match context.label(MIG_CONFIG_STATE) {
        Some(MIG_FAILED) => findings.push(contract(
            Check::Resource,
            Link::DevicePlugin,
            Some(Operand::MigManager),
            format!(
                "{MIG_CONFIG_STATE}={MIG_FAILED}: the MIG manager could not apply {MIG_CONFIG}={}; the GPUs keep \
                 their previous layout and the advertised MIG devices may not be what was asked for",
                context.label(MIG_CONFIG).unwrap_or("(absent)")
            ),
        )),
        Some(state) if MIG_IN_PROGRESS.contains(&state) => notes.push(format!(
            "MIG reconfiguration in progress ({MIG_CONFIG_STATE}={state}, {MIG_CONFIG}={})",
            context.label(MIG_CONFIG).unwrap_or("(absent)")
        )),
        _ => {}
    }
    if let Some(product) = context.label(GPU_PRODUCT)
        && product.ends_with(MIG_INVALID_SUFFIX)
    {
        findings.push(contract(
            Check::Resource,
            Link::DevicePlugin,
            Some(Operand::GpuFeatureDiscovery),
            format!(
                "feature discovery labels the product {product}: the MIG layout does not fit the single strategy \
                 (every GPU MIG-enabled with one profile), so no MIG device is advertised"
            ),
        ));
    }
    if strategy != Some(MigStrategy::Mixed)
        && let Some(mig) = capacity.keys().find(|name| name.starts_with(RESOURCE_MIG_PREFIX))
    {
        findings.push(device_plugin_finding(format!(
            "the node advertises {mig} although the MIG strategy is {}: only the mixed strategy advertises \
             {RESOURCE_MIG_PREFIX}* resources",
            strategy.map_or("not set", MigStrategy::as_str)
        )));
    }

    let plugin_wanted = context.wanted(Operand::DevicePlugin).next().is_some();
    let plugin_ready = context.wanted(Operand::DevicePlugin).any(|r| r.is_ready());
    if !plugin_wanted {
        return if capacity.is_empty() {
            result(
                Check::Resource,
                CheckStatus::Unknown,
                "the device plugin is not deployed by the operator here and the node advertises no GPU"
                    .to_owned(),
            )
        } else {
            result(
                Check::Resource,
                CheckStatus::Pass,
                format!("advertises {advertised}, from a device plugin the operator does not deploy"),
            )
        };
    }
    if !plugin_ready {
        return result(
            Check::Resource,
            CheckStatus::Fail,
            waiting_text(context, Operand::DevicePlugin),
        );
    }
    if capacity.is_empty() {
        findings.push(device_plugin_finding(format!(
            "the device plugin is ready but the node advertises no GPU resource (no {RESOURCE_GPU} or \
             {RESOURCE_MIG_PREFIX}* in its capacity)"
        )));
        return result(Check::Resource, CheckStatus::Fail, String::new());
    }
    let Some(count) = count_label(context, GPU_COUNT) else {
        return result(
            Check::Resource,
            CheckStatus::Unknown,
            format!(
                "advertises {advertised}; no {GPU_COUNT} label (feature discovery not running?), so the count \
                 cannot be compared"
            ),
        );
    };
    let replicas = count_label(context, GPU_REPLICAS).unwrap_or(1).max(1);
    let strategy_text = strategy.map_or("not set".to_owned(), |s| s.as_str().to_owned());
    if strategy == Some(MigStrategy::Mixed) {
        for (key, value) in context.labels {
            let Some(profile) = key
                .strip_prefix(RESOURCE_MIG_PREFIX)
                .and_then(|rest| rest.strip_suffix(".count"))
            else {
                continue;
            };
            let Ok(devices) = value.parse::<i64>() else {
                continue;
            };
            let profile_replicas = count_label(context, &format!("{RESOURCE_MIG_PREFIX}{profile}.replicas"))
                .unwrap_or(1)
                .max(1);
            let resource = advertised_name(&capacity, format!("{RESOURCE_MIG_PREFIX}{profile}"));
            let expected = devices * profile_replicas;
            let actual = capacity.get(&resource).copied().unwrap_or(0);
            if actual != expected {
                findings.push(device_plugin_finding(format!(
                    "the node's capacity has {resource}={actual}, but feature discovery counts {devices} \
                     such MIG devices x {profile_replicas} replicas = {expected}"
                )));
            }
        }
        let whole_resource = advertised_name(&capacity, RESOURCE_GPU.to_owned());
        let whole = capacity.get(&whole_resource).copied().unwrap_or(0);
        if whole > count * replicas {
            findings.push(device_plugin_finding(
                format!(
                    "the node's capacity has {whole_resource}={whole}, more than its {count} GPUs x {replicas} replicas"
                ),
            ));
        }
    } else {
        let resource = advertised_name(&capacity, RESOURCE_GPU.to_owned());
        let expected = count * replicas;
        let actual = capacity.get(&resource).copied().unwrap_or(0);
        if actual != expected {
            findings.push(device_plugin_finding(format!(
                "the node's capacity has {resource}={actual}, but feature discovery counts {count} GPUs x \
                 {replicas} replicas = {expected} (MIG strategy {strategy_text})"
            )));
        }
    }
    result(
        Check::Resource,
        CheckStatus::Pass,
        format!(
            "advertises {advertised}, matching {count} GPUs x {replicas} replicas (MIG strategy {strategy_text})"
        ),
    )
}

/// The name a resource is advertised under: `<resource>.shared` when sharing with `renameByDefault`
/// renamed it, else its own.
fn advertised_name(capacity: &BTreeMap<String, i64>, resource: String) -> String {
    let shared = format!("{resource}.shared");
    if capacity.contains_key(&shared) {
        shared
    } else {
        resource
    }
}

/// Whether the node's GPUs support MIG, by the operator's rule (so the MIG manager is expected where the
/// operator switches it on).
fn mig_capable(context: &NodeContext<'_>) -> bool {
    gpuop_api::labels::is_mig_capable(context.labels)
}

/// The node's upgrade state label, while the upgrade holds the node (the API's rule: a failed upgrade holds
/// it too, cordoned, until a person acts).
fn upgrade_in_progress<'r>(context: &NodeContext<'r>) -> Option<&'r str> {
    context
        .label(UPGRADE_STATE)
        .filter(|state| UpgradeState::from_label(Some(state)).is_in_progress())
}

fn labels(context: &NodeContext<'_>, findings: &mut Vec<Finding>, notes: &mut Vec<String>) -> CheckResult {
    let mut parts = Vec::new();
    if context.label(GPU_PRESENT) != Some("true") {
        findings.push(contract(
            Check::Labels,
            Link::Driver,
            None,
            format!(
                "{} but {GPU_PRESENT} is {}: the operator has not labelled this node, so no operand is placed here",
                context.evidence,
                context.label(GPU_PRESENT).unwrap_or("absent")
            ),
        ));
    }
    if context.label(DEPLOY_OPERANDS) == Some("false") {
        notes.push(format!(
            "operands are switched off on this node ({DEPLOY_OPERANDS}=false)"
        ));
        parts.push(format!("{DEPLOY_OPERANDS}=false"));
    } else {
        deploy_switches(context, findings, notes);
    }
    let discovery_ready = context.wanted(Operand::GpuFeatureDiscovery).any(|r| r.is_ready());
    match context.label(GPU_PRODUCT) {
        Some(product) => parts.push(format!("product {product}")),
        None if discovery_ready => findings.push(contract(
            Check::Labels,
            Link::Scheduling,
            Some(Operand::GpuFeatureDiscovery),
            format!("feature discovery is ready but the node has no {GPU_PRODUCT} label: workloads that select a GPU model skip it"),
        )),
        None => parts.push(format!("no {GPU_PRODUCT} label yet")),
    }
    let policy_strategy = context.cluster.policy_spec().and_then(|s| s.mig_strategy());
    if let (Some(wanted), Some(actual)) = (policy_strategy, context.label(MIG_STRATEGY))
        && wanted != actual
    {
        findings.push(contract(
            Check::Labels,
            Link::DevicePlugin,
            Some(Operand::GpuFeatureDiscovery),
            format!(
                "the node reports {MIG_STRATEGY}={actual} but ClusterPolicy {} sets spec.mig.strategy={wanted}: \
                 feature discovery and the device plugin run an old configuration",
                context.cluster.policy_name()
            ),
        ));
    }
    if let Some(strategy) = context.label(MIG_STRATEGY) {
        parts.push(format!("MIG strategy {strategy}"));
    }
    parts.insert(0, format!("{GPU_PRESENT}=true, deploy switches consistent"));
    result(Check::Labels, CheckStatus::Pass, parts.join(", "))
}

fn deploy_switches(context: &NodeContext<'_>, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    let spec = context.cluster.policy_spec();
    let mut seen: Vec<&str> = Vec::new();
    for info in OPERANDS {
        if seen.contains(&info.deploy_label) || !info.wanted_for(context.workload, context.mode) {
            continue;
        }
        if info.needs_mig_capable && !mig_capable(context) {
            continue;
        }
        let enabled = spec.is_some_and(|spec| (info.enabled)(spec));
        let label = info.deploy_label;
        let link = Link::of(info.operand);
        match context.label(label) {
            Some("true" | "false") => {}
            Some(PAUSED_FOR_DRIVER_UPGRADE) => match upgrade_in_progress(context) {
                Some(state) => notes.push(format!(
                    "{} is paused for a driver upgrade ({UPGRADE_STATE}={state})",
                    info.operand
                )),
                None => findings.push(contract(
                    Check::Labels,
                    link,
                    Some(info.operand),
                    format!(
                        "{label}={PAUSED_FOR_DRIVER_UPGRADE}, but no driver upgrade is in progress ({UPGRADE_STATE} \
                         is {}): {} stays off this node",
                        context.label(UPGRADE_STATE).unwrap_or("absent"),
                        info.operand
                    ),
                )),
            },
            Some(PAUSED_FOR_MIG_CHANGE) => match context.label(MIG_CONFIG_STATE) {
                Some(state) if MIG_IN_PROGRESS.contains(&state) => notes.push(format!(
                    "{} is paused for a MIG change ({MIG_CONFIG_STATE}={state})",
                    info.operand
                )),
                state => findings.push(contract(
                    Check::Labels,
                    link,
                    Some(info.operand),
                    format!(
                        "{label}={PAUSED_FOR_MIG_CHANGE}, but no MIG change is in progress ({MIG_CONFIG_STATE} is \
                         {}): {} stays off this node",
                        state.unwrap_or("absent"),
                        info.operand
                    ),
                )),
            },
            Some(value) if !value.is_empty() => findings.push(contract(
                Check::Labels,
                link,
                Some(info.operand),
                format!(
                    "{label}={value} is neither true nor false: the DaemonSet selects {label}=true, so {} is not \
                     placed on this node",
                    info.operand
                ),
            )),
            _ if enabled => findings.push(contract(
                Check::Labels,
                link,
                Some(info.operand),
                format!(
                    "deploy switch {label} is absent although ClusterPolicy {} enables {}: it is not placed on \
                     this node",
                    context.cluster.policy_name(),
                    info.operand
                ),
            )),
            _ => {}
        }
        seen.push(label);
    }
}

fn positive_placement(context: &NodeContext<'_>) -> CheckResult {
    if context.wanted(Operand::OperatorValidator).next().is_none() {
        return result(
            Check::PositivePlacement,
            CheckStatus::Unknown,
            "no validator runs on this node: nothing proved that CUDA works in a container here".to_owned(),
        );
    }
    match ready_pod_text(context, Operand::OperatorValidator) {
        Some(text) => result(
            Check::PositivePlacement,
            CheckStatus::Pass,
            format!("{text}: driver, toolkit, CUDA and device plugin validations passed"),
        ),
        None => result(
            Check::PositivePlacement,
            CheckStatus::Fail,
            waiting_text(context, Operand::OperatorValidator),
        ),
    }
}

fn negative_placement(context: &NodeContext<'_>, findings: &mut Vec<Finding>) -> CheckResult {
    if context.gpu {
        return result(
            Check::NegativePlacement,
            CheckStatus::Pass,
            "no operand pod runs where its DaemonSet does not place it".to_owned(),
        );
    }
    let capacity = context.gpu_resources(Side::Capacity);
    if !capacity.is_empty() {
        let advertised = capacity
            .iter()
            .map(|(name, count)| format!("{name}={count}"))
            .collect::<Vec<_>>()
            .join(", ");
        findings.push(contract(
            Check::NegativePlacement,
            Link::DevicePlugin,
            None,
            format!(
                "the node has no NVIDIA GPU ({}) but advertises {advertised}: pods asking for GPUs will be \
                 scheduled here",
                context.evidence
            ),
        ));
    }
    if context.nfd_says_none && context.label(GPU_PRESENT) == Some("true") {
        findings.push(contract(
            Check::NegativePlacement,
            Link::Scheduling,
            None,
            format!(
                "{GPU_PRESENT}=true but NFD found no NVIDIA PCI device on this node: the label was set by hand or \
                 is stale, and operands may be placed here"
            ),
        ));
    }
    result(
        Check::NegativePlacement,
        CheckStatus::Pass,
        "no GPU resources advertised and no operand pods".to_owned(),
    )
}

fn operations(
    context: &NodeContext<'_>,
    findings: &mut Vec<Finding>,
    notes: &mut Vec<String>,
) -> CheckResult {
    let mut parts = Vec::new();
    let status = context.node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(condition) if condition.status == "True" => parts.push("Ready".to_owned()),
        Some(condition) => findings.push(contract(
            Check::Operations,
            Link::Scheduling,
            None,
            format!(
                "the node is not Ready (Ready={}{}): nothing new starts here",
                condition.status,
                condition
                    .message
                    .as_deref()
                    .or(condition.reason.as_deref())
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ),
        )),
        None => parts.push("readiness unknown (no Ready condition)".to_owned()),
    }
    let cordoned = context
        .node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let upgrading = upgrade_in_progress(context);
    match (cordoned, upgrading) {
        (true, Some(state)) => notes.push(format!("cordoned for a driver upgrade ({UPGRADE_STATE}={state})")),
        (true, None) => findings.push(contract(
            Check::Operations,
            Link::Scheduling,
            None,
            "the node is cordoned (spec.unschedulable): GPU pods are not scheduled here".to_owned(),
        )),
        (false, _) => parts.push("schedulable".to_owned()),
    }
    let label = context.label(UPGRADE_STATE).filter(|state| !state.is_empty());
    match (UpgradeState::from_label(label), label) {
        (UpgradeState::Failed, Some(state)) => findings.push(contract(
            Check::Operations,
            Link::Driver,
            Some(Operand::Driver),
            format!("the driver upgrade failed on this node ({UPGRADE_STATE}={state})"),
        )),
        (UpgradeState::Required, Some(state)) => notes.push(format!(
            "driver upgrade waiting for a slot of maxParallelUpgrades ({UPGRADE_STATE}={state})"
        )),
        (UpgradeState::Unknown, Some(state)) => notes.push(format!(
            "{UPGRADE_STATE}={state} is no state of the driver upgrade: the operator treats the node as not looked at yet"
        )),
        (state, Some(label)) if state.is_in_progress() && !cordoned => {
            notes.push(format!("driver upgrade in progress ({UPGRADE_STATE}={label})"));
        }
        _ => {}
    }
    let capacity = context.gpu_resources(Side::Capacity);
    let allocatable = context.gpu_resources(Side::Allocatable);
    for (resource, total) in &capacity {
        let usable = allocatable.get(resource).copied().unwrap_or(0);
        if usable < *total {
            findings.push(contract(
                Check::Operations,
                Link::Health,
                Some(Operand::DevicePlugin),
                format!(
                    "{} of {total} {resource} are not allocatable: the device plugin reports them unhealthy",
                    total - usable
                ),
            ));
        }
    }
    if let Some(text) = ready_pod_text(context, Operand::DcgmExporter) {
        parts.push(text);
    }
    parts.push(
        "GPU health beyond what the device plugin reports (XID errors) is not visible through the API"
            .to_owned(),
    );
    result(Check::Operations, CheckStatus::Pass, parts.join(", "))
}
