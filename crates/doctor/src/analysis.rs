//! The analysis: a [`Snapshot`] in, a [`Report`] out, no I/O.
//!
//! Invariants the rest of the doctor relies on:
//! - What a node should run comes from the operand DaemonSets found in the snapshot, judged against the node
//!   with Kubernetes' placement rules ([`gpuop_api::placement`]), never from `desiredNumberScheduled`.
//!   Operands are recognised and ordered with the catalogue ([`gpuop_api::catalogue`]).
//! - A node's findings depend only on that node, the pods on it, and cluster-wide objects (DaemonSets,
//!   RuntimeClasses, ClusterPolicies): adding a node or an unrelated pod never changes another node's
//!   findings.
//! - Findings are problems only; what the API cannot show is said in a check's message or a note.

use std::collections::{BTreeMap, HashMap, HashSet};

use gpuop_api::catalogue::status_file;
use gpuop_api::choice::WorkloadConfig;
use gpuop_api::labels::{self, GPU_PRESENT, GpuDetection, GpuEvidence};
use gpuop_api::placement::{Misfit, daemon_pod_fits};
use gpuop_api::rollout::latest_revision;
use gpuop_api::validate::Sandbox;
use gpuop_api::{ClusterPolicy, ClusterPolicySpec, OPERANDS, Operand};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PodSpec};

use crate::contract;
use crate::node_view::{Cluster, NodeContext, OperandSet, Row, Validation, validation};
use crate::pod_state::PodState;
use crate::report::{
    Advertised, Check, CheckStatus, Expectation, Finding, FindingKind, Link, NodeReport, Report, SCHEMA,
    Summary,
};
use crate::resources::{Side, node_gpu_resources};
use crate::snapshot::{PodFacts, Snapshot};

/// Judges every node of the snapshot, GPU nodes recognised by NFD's labels.
pub fn analyze(snapshot: &Snapshot) -> Report {
    analyze_with(snapshot, &GpuDetection::Nfd)
}

/// Judges every node of the snapshot, GPU nodes recognised as the operator recognises them with this
/// detection (`--gpu-node-selector`).
pub fn analyze_with(snapshot: &Snapshot, detection: &GpuDetection) -> Report {
    let cluster = Cluster::new(snapshot, detection);
    let mut nodes = cluster.judge_all(&snapshot.nodes);
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let findings = cluster.stray_pod_findings();
    Report {
        schema: SCHEMA,
        cluster_policy: cluster.policy.and_then(|p| p.metadata.name.clone()),
        summary: Summary::of(&nodes, &findings),
        findings,
        notes: cluster.notes(),
        nodes,
    }
}

/// The ClusterPolicy the operator acts on (the operator's own rule).
pub fn active_policy(policies: &[ClusterPolicy]) -> Option<&ClusterPolicy> {
    ClusterPolicy::active(policies)
}

static EMPTY_SPEC: std::sync::LazyLock<PodSpec> = std::sync::LazyLock::new(PodSpec::default);
static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> Cluster<'a> {
    fn new(snapshot: &'a Snapshot, detection: &'a GpuDetection) -> Self {
        let policy = active_policy(&snapshot.cluster_policies);
        let mut sets: Vec<(OperandSet<'a>, &'a DaemonSet)> = snapshot
            .daemon_sets
            .iter()
            .filter_map(|daemon_set| {
                let operand = Operand::of_daemonset(daemon_set)?;
                let spec = daemon_set
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.template.spec.as_ref())
                    .unwrap_or(&EMPTY_SPEC);
                let key = format!(
                    "{}/{}",
                    daemon_set.metadata.namespace.as_deref().unwrap_or_default(),
                    daemon_set.metadata.name.as_deref().unwrap_or_default()
                );
                let latest = daemon_set
                    .metadata
                    .uid
                    .as_deref()
                    .and_then(|uid| latest_revision(uid, &snapshot.controller_revisions));
                Some((
                    OperandSet {
                        operand,
                        key,
                        spec,
                        latest,
                    },
                    daemon_set,
                ))
            })
            .collect();
        sets.sort_by(|(a, _), (b, _)| a.operand.cmp(&b.operand).then_with(|| a.key.cmp(&b.key)));

        let mut by_uid: HashMap<&str, usize> = HashMap::new();
        let mut by_name: HashMap<(&str, &str), usize> = HashMap::new();
        for (index, (_, daemon_set)) in sets.iter().enumerate() {
            let meta = &daemon_set.metadata;
            match meta.uid.as_deref().filter(|uid| !uid.is_empty()) {
                Some(uid) => {
                    by_uid.insert(uid, index);
                }
                None => {
                    // Hand-written snapshots may lack UIDs; then ownership goes by name.
                    by_name.insert(
                        (
                            meta.namespace.as_deref().unwrap_or_default(),
                            meta.name.as_deref().unwrap_or_default(),
                        ),
                        index,
                    );
                }
            }
        }
        let mut pods_by_node: HashMap<&str, Vec<(usize, &PodFacts)>> = HashMap::new();
        let mut homeless = Vec::new();
        for pod in &snapshot.pods {
            let owner = pod
                .metadata
                .owner_references
                .iter()
                .filter(|owner| owner.kind == "DaemonSet")
                .find_map(|owner| {
                    by_uid.get(owner.uid.as_str()).copied().or_else(|| {
                        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
                        by_name.get(&(namespace, owner.name.as_str())).copied()
                    })
                });
            let Some(index) = owner else { continue };
            match pod.target_node() {
                Some(node) => pods_by_node.entry(node).or_default().push((index, pod)),
                None => homeless.push((index, pod)),
            }
        }

        let spec = policy.map(|p| &p.spec);
        let without_daemon_set = match spec {
            Some(spec) => OPERANDS
                .iter()
                .filter(|info| (info.enabled)(spec))
                .filter(|info| !sets.iter().any(|(set, _)| set.operand == info.operand))
                .map(|info| info.operand)
                .collect(),
            None => Vec::new(),
        };
        let runtime_classes = snapshot.knows_all("RuntimeClass").then(|| {
            snapshot
                .runtime_classes
                .iter()
                .filter_map(|class| class.metadata.name.as_deref())
                .collect()
        });
        Cluster {
            snapshot,
            detection,
            policy,
            sets: sets.into_iter().map(|(set, _)| set).collect(),
            pods_by_node,
            homeless,
            without_daemon_set,
            runtime_classes,
        }
    }

    pub fn policy_spec(&self) -> Option<&'a ClusterPolicySpec> {
        self.policy.map(|p| &p.spec)
    }

    pub fn policy_name(&self) -> String {
        self.policy
            .and_then(|p| p.metadata.name.clone())
            .unwrap_or_default()
    }

    /// Judges every node, in their order. Each node is judged on its own, so a large cluster's nodes are
    /// shared among the machine's cores.
    fn judge_all(&self, nodes: &[Node]) -> Vec<NodeReport> {
        /// Fewer nodes than this are judged faster than a thread starts.
        const PER_THREAD: usize = 1000;
        let threads = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(nodes.len() / PER_THREAD)
            .max(1);
        if threads == 1 {
            return nodes.iter().map(|node| self.judge(node)).collect();
        }
        let chunk = nodes.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let parts: Vec<_> = nodes
                .chunks(chunk)
                .map(|part| scope.spawn(move || part.iter().map(|node| self.judge(node)).collect::<Vec<_>>()))
                .collect();
            parts
                .into_iter()
                .flat_map(|part| match part.join() {
                    Ok(reports) => reports,
                    // A panic in judging is a bug; it goes on as it would have on one thread.
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect()
        })
    }

    fn judge(&self, node: &Node) -> NodeReport {
        let context = self.context(node);
        let mut findings = Vec::new();
        let mut notes = Vec::new();
        operand_findings(&context, &mut findings, &mut notes);
        if context.gpu {
            order_findings(&context, &mut findings);
            runtime_findings(&context, &mut findings, &mut notes);
        }
        let mut checks = contract::checks(&context, &mut findings, &mut notes);
        findings.sort_by(|a, b| {
            (a.link, a.operand, a.kind, &a.message).cmp(&(b.link, b.operand, b.kind, &b.message))
        });
        findings.dedup();
        for result in &mut checks {
            let failing: Vec<&Finding> = findings.iter().filter(|f| f.check == result.check).collect();
            if let Some(first) = failing.first() {
                result.status = CheckStatus::Fail;
                result.message = match failing.len() {
                    1 => first.message.clone(),
                    n => format!("{} (and {} more)", first.message, n - 1),
                };
            }
        }
        NodeReport {
            name: context.name.to_owned(),
            gpu: context.gpu,
            gpu_evidence: context.evidence.clone(),
            workload: context.gpu.then(|| context.workload.as_str().to_owned()),
            advertised: advertised(node),
            first_broken_link: findings.iter().map(|f| f.link).min(),
            operands: context.rows.iter().map(Row::summary).collect(),
            checks,
            findings,
            notes,
        }
    }

    fn context<'r>(&'r self, node: &'r Node) -> NodeContext<'r> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let labels = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        let (gpu, evidence, nfd_says_none) = gpu_hardware(labels, self.detection);
        let (workload, mode) = Sandbox::node_workload(self.policy_spec().and_then(Sandbox::of), labels);

        let here = self.pods_by_node.get(name).map(Vec::as_slice).unwrap_or_default();
        let mut rows = Vec::new();
        for (index, set) in self.sets.iter().enumerate() {
            let fit = daemon_pod_fits(node, set.spec);
            let expectation = match &fit {
                Ok(()) => Expectation::Expected,
                Err(misfit) if misfit.excludes() => Expectation::Excluded,
                Err(_) => Expectation::NotSelected,
            };
            let pod = best_pod(here.iter().filter(|(i, _)| *i == index).map(|(_, pod)| *pod));
            if expectation == Expectation::NotSelected && pod.is_none() {
                continue;
            }
            rows.push(Row {
                operand: set.operand,
                set: Some(set),
                expectation,
                misfit: fit.err(),
                state: pod.map(PodState::of),
                pod,
            });
        }
        if gpu && labels.get(labels::DEPLOY_OPERANDS).map(String::as_str) != Some("false") {
            for operand in &self.without_daemon_set {
                let info = operand.info();
                let selected = labels.get(info.deploy_label).map(String::as_str) == Some("true")
                    && info
                        .extra_node_selector
                        .iter()
                        .all(|(key, value)| labels.get(*key).map(String::as_str) == Some(*value));
                if selected {
                    rows.push(Row {
                        operand: *operand,
                        set: None,
                        expectation: Expectation::NoDaemonSet,
                        misfit: None,
                        state: None,
                        pod: None,
                    });
                }
            }
        }
        rows.sort_by_key(|row| row.operand);
        NodeContext {
            cluster: self,
            node,
            name,
            labels,
            gpu,
            evidence,
            nfd_says_none,
            workload,
            mode,
            rows,
        }
    }

    fn stray_pod_findings(&self) -> Vec<Finding> {
        let mut findings = Vec::new();
        let nodes: HashSet<&str> = self
            .snapshot
            .nodes
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        if !nodes.is_empty() {
            let mut strays: Vec<(&str, &Vec<(usize, &PodFacts)>)> = self
                .pods_by_node
                .iter()
                .filter(|(node, _)| !nodes.contains(*node))
                .map(|(node, pods)| (*node, pods))
                .collect();
            strays.sort_by_key(|(node, _)| *node);
            for (node, pods) in strays {
                for (index, pod) in pods {
                    let operand = self.sets[*index].operand;
                    findings.push(Finding {
                        kind: FindingKind::Unexpected,
                        operand: Some(operand),
                        check: Check::NegativePlacement,
                        link: Link::of(operand),
                        message: format!(
                            "pod {} of {operand} is bound to node {node}, which does not exist",
                            pod.key()
                        ),
                        pod: Some(pod.key()),
                    });
                }
            }
        }
        for (index, pod) in &self.homeless {
            let operand = self.sets[*index].operand;
            let state = PodState::of(pod);
            findings.push(Finding {
                kind: FindingKind::NotReady,
                operand: Some(operand),
                check: Check::of(operand),
                link: Link::of(operand),
                message: format!(
                    "pod {} of {operand} is {state} and not bound to any node{}",
                    pod.key(),
                    state.detail().map(|d| format!(": {d}")).unwrap_or_default()
                ),
                pod: Some(pod.key()),
            });
        }
        findings
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = self.snapshot.notes.clone();
        let policies = &self.snapshot.cluster_policies;
        match self.policy {
            Some(active) => {
                let ignored: Vec<&str> = policies
                    .iter()
                    .filter(|p| p.metadata.name != active.metadata.name)
                    .filter_map(|p| p.metadata.name.as_deref())
                    .collect();
                if !ignored.is_empty() {
                    notes.push(format!(
                        "ClusterPolicy {} is the active one (the oldest); the operator ignores {}",
                        self.policy_name(),
                        ignored.join(", ")
                    ));
                }
            }
            None if self.snapshot.knows_all("ClusterPolicy") => notes
                .push("no ClusterPolicy exists: operands are judged by their DaemonSets alone".to_owned()),
            None => notes.push(
                "the snapshot holds no ClusterPolicy: operands are judged by their DaemonSets alone"
                    .to_owned(),
            ),
        }
        if self.sets.is_empty() {
            notes.push("no operand DaemonSet was found".to_owned());
        }
        if !self.snapshot.knows_all("RuntimeClass") {
            notes.push(
                "the snapshot holds no RuntimeClass: whether the runtime class operands use exists is unknown"
                    .to_owned(),
            );
        }
        if self.policy_spec().is_some_and(ClusterPolicySpec::cdi_enabled) {
            notes.push(format!(
                "ClusterPolicy {} turns CDI on; the CDI specs on each host are not visible through the API",
                self.policy_name()
            ));
        }
        for operand in &self.without_daemon_set {
            notes.push(format!(
                "ClusterPolicy {} enables {operand} but no DaemonSet {} exists",
                self.policy_name(),
                operand.info().daemonset
            ));
        }
        notes
    }
}

/// Whether a node has an NVIDIA GPU, on what evidence, and whether NFD positively says it has none.
///
/// The operator's rule decides ([`GpuDetection::evidence`]): NFD's PCI label, or the selector. Without a
/// selector and without NFD, `nvidia.com/gpu.present` (the operator's earlier conclusion) is trusted, so that
/// a cluster whose NFD went away is still judged as a GPU cluster.
fn gpu_hardware(labels: &BTreeMap<String, String>, detection: &GpuDetection) -> (bool, String, bool) {
    match (detection.evidence(labels), detection) {
        (GpuEvidence::Nfd(key), _) => (true, format!("NFD: {key}=true"), false),
        (GpuEvidence::Selector, GpuDetection::NfdOrSelector(selector)) => {
            (true, format!("matches --gpu-node-selector {selector}"), false)
        }
        (GpuEvidence::NfdFoundNone, _) => (false, "NFD found no NVIDIA PCI device".to_owned(), true),
        (_, GpuDetection::NfdOrSelector(selector)) => (
            false,
            format!("no NFD labels and no match of --gpu-node-selector {selector}"),
            false,
        ),
        (_, GpuDetection::Nfd) if labels.get(GPU_PRESENT).map(String::as_str) == Some("true") => {
            (true, format!("{GPU_PRESENT}=true (no NFD labels)"), false)
        }
        (_, GpuDetection::Nfd) => (false, format!("no NFD labels and no {GPU_PRESENT}=true"), false),
    }
}

/// Of several pods of one DaemonSet on one node, the one that says most: a live one over one being deleted,
/// a ready one over one that is not.
fn best_pod<'p>(pods: impl Iterator<Item = &'p PodFacts>) -> Option<&'p PodFacts> {
    pods.max_by_key(|pod| {
        let state = PodState::of(pod);
        (!pod.is_terminating(), state.is_ready(), state.is_running())
    })
}

/// The operand whose readiness a status file proves (`toolkit-ready` -> container toolkit).
pub fn prover_of(file: &str) -> Option<Operand> {
    OPERANDS
        .iter()
        .find(|info| info.proves == Some(file))
        .map(|info| info.operand)
}

/// The status file an init container named `<x>-validation` is about.
fn validated_file(container: &str) -> Option<String> {
    let stem = container.strip_suffix("-validation")?;
    Some(format!("{stem}-ready"))
}

/// Where a not-ready pod is stuck, when it waits in an init container for another operand's status file:
/// that operand, and the file.
fn stuck_on(state: &PodState) -> Option<(Operand, String)> {
    let PodState::Init {
        current: Some(container),
        ..
    } = state
    else {
        return None;
    };
    let file = validated_file(container)?;
    Some((prover_of(&file)?, file))
}

fn operand_findings(context: &NodeContext<'_>, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    let deploy_label = |operand: Operand| operand.info().deploy_label;
    let mut seen_expected: BTreeMap<Operand, Vec<&str>> = BTreeMap::new();
    for row in &context.rows {
        let operand = row.operand;
        let set_key = row.set.map(|s| s.key.as_str()).unwrap_or_default();
        let pod_key = row.pod.map(PodFacts::key);
        let base = |kind: FindingKind, message: String| Finding {
            kind,
            operand: Some(operand),
            check: Check::of(operand),
            link: Link::of(operand),
            message,
            pod: pod_key.clone(),
        };
        if !context.gpu {
            match (row.pod, row.expectation) {
                (Some(pod), Expectation::Expected) => findings.push(Finding {
                    check: Check::NegativePlacement,
                    ..base(
                        FindingKind::Unexpected,
                        format!(
                            "pod {} of {operand} runs on a node without an NVIDIA GPU ({}); DaemonSet {set_key} \
                             selects the node because of its labels ({}={}: set by hand?)",
                            pod.key(),
                            context.evidence,
                            deploy_label(operand),
                            context.label(deploy_label(operand)).unwrap_or("absent"),
                        ),
                    )
                }),
                (Some(pod), _) => findings.push(Finding {
                    check: Check::NegativePlacement,
                    ..base(
                        FindingKind::Unexpected,
                        format!(
                            "pod {} of {operand} runs on a node without an NVIDIA GPU ({}), and DaemonSet {set_key} \
                             does not place it here: {}",
                            pod.key(),
                            context.evidence,
                            misfit_text(row.misfit.as_ref())
                        ),
                    )
                }),
                (None, Expectation::Expected) => notes.push(format!(
                    "DaemonSet {set_key} of {operand} selects this node although it has no GPU; no pod of it is here"
                )),
                (None, _) => {}
            }
            continue;
        }
        if row.expectation == Expectation::Expected {
            seen_expected.entry(operand).or_default().push(set_key);
        }
        match (row.expectation, row.pod, &row.state) {
            (Expectation::Expected, None, _) => {
                let mut message = format!(
                    "{operand} should run here (DaemonSet {set_key} selects the node) but no pod of it is here"
                );
                if let Some(reason) = missing_reason(context, row) {
                    message.push_str(&format!(": {reason}"));
                }
                findings.push(base(FindingKind::Missing, message));
            }
            (Expectation::NoDaemonSet, _, _) => findings.push(base(
                FindingKind::Missing,
                format!(
                    "ClusterPolicy {} enables {operand} and the node's label {}=true selects it, but no DaemonSet {} exists",
                    context.cluster.policy_name(),
                    deploy_label(operand),
                    operand.info().daemonset
                ),
            )),
            (Expectation::Expected, Some(pod), Some(state)) if state.is_ready() && !row.is_ready() => {
                let message = match row.outdated() {
                    Some(revision) => format!(
                        "{operand} pod {} is ready but runs revision {revision}, not DaemonSet {set_key}'s latest \
                         {}: its rollout has not replaced it yet",
                        pod.key(),
                        row.latest().unwrap_or_default()
                    ),
                    None => format!(
                        "{operand} pod {} runs, but its Ready condition is not True: it is not counted ready",
                        pod.key()
                    ),
                };
                findings.push(base(FindingKind::NotReady, message));
            }
            (Expectation::Expected, Some(pod), Some(state)) if !state.is_ready() => {
                let mut finding = base(
                    FindingKind::NotReady,
                    format!(
                        "{operand} pod {} is {state}{}",
                        pod.key(),
                        state.detail().map(|d| format!(": {d}")).unwrap_or_default()
                    ),
                );
                if let Some((prover, file)) = stuck_on(state) {
                    finding.link = Link::of(prover);
                    finding.check = Check::of(prover);
                    if prover != operand {
                        finding
                            .message
                            .push_str(&format!(" (it waits for {file}, which {prover} proves)"));
                    }
                }
                findings.push(finding);
            }
            (Expectation::Excluded, pod, _) => {
                let taint = misfit_text(row.misfit.as_ref());
                let message = match pod {
                    None => format!(
                        "the node matches DaemonSet {set_key}'s selectors but {taint}, so {operand} is kept off \
                         the node and the DaemonSet does not count it (desiredNumberScheduled leaves it out)"
                    ),
                    Some(pod) => format!(
                        "{operand} pod {} still runs, but {taint} of DaemonSet {set_key}: a replacement would not \
                         be placed here",
                        pod.key()
                    ),
                };
                findings.push(base(FindingKind::Excluded, message));
            }
            (Expectation::NotSelected, Some(pod), _) => findings.push(Finding {
                check: Check::NegativePlacement,
                ..base(
                    FindingKind::Unexpected,
                    format!(
                        "pod {} of {operand} runs here but DaemonSet {set_key} does not place it here: {}",
                        pod.key(),
                        misfit_text(row.misfit.as_ref())
                    ),
                )
            }),
            _ => {}
        }
    }
    for (operand, sets) in seen_expected {
        if sets.len() > 1 {
            findings.push(Finding {
                kind: FindingKind::Conflict,
                operand: Some(operand),
                check: Check::of(operand),
                link: Link::of(operand),
                message: format!(
                    "{} DaemonSets of {operand} select this node: {}",
                    sets.len(),
                    sets.join(", ")
                ),
                pod: None,
            });
        }
    }
}

fn misfit_text(misfit: Option<&Misfit>) -> String {
    match misfit {
        Some(Misfit::Taint(taint)) => {
            let value = taint
                .value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default();
            format!("its taint {}{value}:{} is not tolerated", taint.key, taint.effect)
        }
        Some(misfit) => misfit.to_string(),
        None => "it does not fit".to_owned(),
    }
}

/// Why an expected pod is absent, where the objects show it.
fn missing_reason(context: &NodeContext<'_>, row: &Row<'_>) -> Option<String> {
    let set = row.set?;
    let class = set.spec.runtime_class_name.as_deref()?;
    let known = context.cluster.runtime_classes.as_ref()?;
    (!known.contains(class)).then(|| {
        format!("its pod template names RuntimeClass {class}, which does not exist, so the API server refuses its pods")
    })
}

fn order_findings(context: &NodeContext<'_>, findings: &mut Vec<Finding>) {
    for row in context.rows.iter().filter(|r| r.wanted()) {
        if !row.state.as_ref().is_some_and(PodState::is_running) {
            continue;
        }
        let mut unmet: Vec<(Operand, String)> = Vec::new();
        for required in row.operand.info().requires {
            let wanted: Vec<&Row<'_>> = context.wanted(*required).collect();
            if wanted.is_empty() || wanted.iter().any(|r| r.is_ready()) {
                continue;
            }
            unmet.push((*required, wanted[0].state_words()));
        }
        let Some((first, _)) = unmet.first() else { continue };
        let what: Vec<String> = unmet
            .iter()
            .map(|(operand, state)| format!("{operand} is {state}"))
            .collect();
        findings.push(Finding {
            kind: FindingKind::Order,
            operand: Some(row.operand),
            check: Check::of(*first),
            link: unmet
                .iter()
                .map(|(o, _)| Link::of(*o))
                .min()
                .unwrap_or(Link::of(*first)),
            message: format!(
                "{} runs while what it requires is not ready: {}",
                row.operand,
                what.join(", ")
            ),
            pod: row.pod.map(PodFacts::key),
        });
    }
}

fn runtime_findings(context: &NodeContext<'_>, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
    let advertised = context.gpu_resources(Side::Allocatable);
    if advertised.is_empty() || context.workload != WorkloadConfig::Container {
        return;
    }
    let resources = advertised
        .iter()
        .map(|(name, count)| format!("{name}={count}"))
        .collect::<Vec<_>>()
        .join(", ");
    let toolkit: Vec<&Row<'_>> = context.wanted(Operand::ContainerToolkit).collect();
    let broken = if toolkit.is_empty() {
        match validation(context, status_file::TOOLKIT_READY) {
            Validation::Failing(why) => Some(format!("its toolkit validation fails ({why})")),
            Validation::Passed => None,
            Validation::Unknown => {
                notes.push(
                    "the container toolkit is not deployed by the operator here (installed on the host?): \
                     whether the runtime injects GPUs is not visible through the API"
                        .to_owned(),
                );
                None
            }
        }
    } else if toolkit.iter().any(|r| r.is_ready()) {
        None
    } else {
        Some(format!("the container toolkit is {}", toolkit[0].state_words()))
    };
    if let Some(broken) = broken {
        findings.push(Finding {
            kind: FindingKind::GpuWithoutRuntime,
            operand: Some(Operand::ContainerToolkit),
            check: Check::Runtime,
            link: Link::Toolkit,
            message: format!(
                "the node advertises {resources} in allocatable while {broken}: pods will be scheduled here \
                 and silently get no GPU"
            ),
            pod: toolkit.iter().find_map(|r| r.pod).map(PodFacts::key),
        });
    }
}

/// The GPU resources a node reports, capacity and allocatable side by side.
fn advertised(node: &Node) -> Vec<Advertised> {
    let capacity = node_gpu_resources(node, Side::Capacity);
    let allocatable = node_gpu_resources(node, Side::Allocatable);
    let mut names: Vec<&String> = capacity.keys().chain(allocatable.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| Advertised {
            resource: name.clone(),
            capacity: capacity.get(name).copied().unwrap_or(0),
            allocatable: allocatable.get(name).copied().unwrap_or(0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{ClusterBuilder, NodeFixture};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn the_oldest_cluster_policy_not_being_deleted_is_active() {
        let policy = |name: &str, seconds: i64, deleting: bool| {
            let mut policy = ClusterPolicy::new(name, ClusterPolicySpec::default());
            let at = Time(jiff::Timestamp::from_second(seconds).unwrap());
            policy.metadata.creation_timestamp = Some(at.clone());
            policy.metadata.deletion_timestamp = deleting.then_some(at);
            policy
        };
        let policies = [
            policy("b", 10, false),
            policy("a", 20, false),
            policy("c", 5, true),
        ];
        assert_eq!(
            active_policy(&policies).unwrap().metadata.name.as_deref(),
            Some("b")
        );
        assert!(active_policy(&[]).is_none());
    }

    #[test]
    fn a_converged_cluster_has_no_findings() {
        let snapshot = ClusterBuilder::new()
            .with_node(Node::gpu("a100-01").mig_capable())
            .with_node(Node::gpu("t4-01").with_gpus("Tesla-T4", 1))
            .with_node(Node::cpu("cpu-01"))
            .build();
        let report = analyze(&snapshot);
        let findings: Vec<_> = report.nodes.iter().flat_map(|n| &n.findings).collect();
        assert!(findings.is_empty(), "{findings:#?}");
        assert!(report.findings.is_empty());
        let a100 = &report.nodes[0];
        assert_eq!(a100.name, "a100-01");
        assert!(
            a100.checks.iter().all(|c| c.status == CheckStatus::Pass),
            "{:#?}",
            a100.checks
        );
        use Operand::*;
        let order: Vec<Operand> = a100.operands.iter().map(|o| o.operand).collect();
        assert_eq!(
            order,
            [
                Driver,
                ContainerToolkit,
                OperatorValidator,
                DevicePlugin,
                Dcgm,
                DcgmExporter,
                GpuFeatureDiscovery,
                MigManager
            ]
        );
        let cpu = &report.nodes[1];
        assert!(!cpu.gpu && cpu.operands.is_empty());
    }
}
