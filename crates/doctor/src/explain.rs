//! `kubectl gpu explain pod`: why a GPU pod is Pending or cannot see its GPU, as far as the objects show it.
//!
//! For a pod not yet bound to a node, every node is tried the way the scheduler filters: readiness, cordon,
//! node selector and required affinity, taints, then the pod's requests against what is free (allocatable
//! less the requests of the pods bound there). Nodes that would fit but for a GPU resource they do not
//! advertise lead to the operand chain on them. For a bound pod, the node's chain and the pod's own status
//! tell. Either way the verdict names the first broken link in one sentence.
//!
//! What is not evaluated, and said so: inter-pod affinity, topology spread, priority and preemption; CPU and
//! memory are compared with allocatable only, because a snapshot keeps only the pods that ask for GPUs.

use std::collections::{BTreeMap, HashMap};

use gpuop_api::choice::MigStrategy;
use gpuop_api::labels::{GpuDetection, RESOURCE_GPU, RESOURCE_MIG_PREFIX, is_gpu_resource};
use gpuop_api::placement::pod_fits;
use serde::Serialize;

use crate::analysis::{active_policy, analyze_with};
use crate::pod_state::PodState;
use crate::report::{Link, NodeReport, Report};
use crate::resources::{
    Side, format_milli, node_gpu_resources, node_resource_milli, pod_gpu_requests, pod_requests,
};
use crate::snapshot::{PodFacts, Snapshot};

/// Version of the `explain -o json` schema.
pub const SCHEMA: &str = "gpu-doctor-explain/v1";

/// Why a pod could not be explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The pod is not in the snapshot (or cluster).
    #[error(
        "pod {namespace}/{name} is not in the snapshot ({pods} pods in it; a snapshot keeps operand pods and pods that ask for GPUs)"
    )]
    PodNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Pods the snapshot holds.
        pods: usize,
    },
}

/// The verdict: the first broken link, in one sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The first broken link; `null` when none is visible.
    pub link: Option<Link>,
    /// One sentence.
    pub sentence: String,
}

/// How one node fares for the pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFit {
    /// Node name.
    pub name: String,
    /// Whether it has an NVIDIA GPU.
    pub gpu: bool,
    /// Whether the pod fits as far as the doctor evaluates.
    pub fits: bool,
    /// Why not, in filter order.
    pub reasons: Vec<String>,
    /// GPU resources free on it (allocatable less what bound pods ask for).
    pub free: BTreeMap<String, i64>,
    /// The first broken link of its operand chain, if any.
    pub first_broken_link: Option<Link>,
    /// What breaks it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
    /// Whether GPU resources are all it lacks.
    #[serde(skip)]
    pub short_of_gpus_only: bool,
    /// Whether it advertises none of a GPU resource the pod asks for.
    #[serde(skip)]
    pub advertises_none: bool,
}

/// Why a pod is Pending or cannot see its GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// `namespace/name`.
    pub pod: String,
    /// Its state as `kubectl get pods` shows it.
    pub status: String,
    /// The node it is bound to.
    pub node: Option<String>,
    /// GPU resources it asks for.
    pub requests: BTreeMap<String, i64>,
    /// The verdict.
    pub verdict: Verdict,
    /// What the scheduler said, when it said something.
    pub scheduler: Option<String>,
    /// The nodes tried (for a bound pod, its node).
    pub nodes: Vec<NodeFit>,
    /// What the doctor does not evaluate.
    pub limits: Vec<String>,
}

/// Explains a pod of the snapshot, GPU nodes recognised by NFD's labels.
pub fn explain(snapshot: &Snapshot, namespace: &str, name: &str) -> Result<Explanation, ExplainError> {
    explain_with(snapshot, &GpuDetection::Nfd, namespace, name)
}

/// Explains a pod of the snapshot, GPU nodes recognised with this detection (`--gpu-node-selector`).
pub fn explain_with(
    snapshot: &Snapshot,
    detection: &GpuDetection,
    namespace: &str,
    name: &str,
) -> Result<Explanation, ExplainError> {
    let pod = snapshot
        .pod(namespace, name)
        .ok_or_else(|| ExplainError::PodNotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            pods: snapshot.pods.len(),
        })?;
    let report = analyze_with(snapshot, detection);
    let used = gpus_in_use(snapshot, pod);
    let requests = pod_gpu_requests(pod);
    let state = PodState::of(pod);
    let scheduler = pod
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.message.clone());
    let mut limits = vec![
        "inter-pod affinity, topology spread, priority and preemption are not evaluated".to_owned(),
        "CPU and memory are compared with allocatable only; GPU resources with what bound GPU pods use"
            .to_owned(),
    ];
    if pod
        .spec
        .affinity
        .as_ref()
        .is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
    {
        limits.push("this pod has inter-pod (anti-)affinity, which may be what keeps it Pending".to_owned());
    }
    let nodes: Vec<NodeFit> = match pod.spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        Some(node) => snapshot
            .node(node)
            .map(|n| vec![fit(&report, n, pod, &used)])
            .unwrap_or_default(),
        None => snapshot
            .nodes
            .iter()
            .map(|node| fit(&report, node, pod, &used))
            .collect(),
    };
    let verdict = match pod.spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        Some(node) => bound_verdict(pod, &state, node, &requests, &report),
        None => pending_verdict(snapshot, &requests, &nodes, scheduler.as_deref()),
    };
    Ok(Explanation {
        schema: SCHEMA,
        pod: pod.key(),
        status: state.to_string(),
        node: pod.spec.node_name.clone().filter(|n| !n.is_empty()),
        requests,
        verdict,
        scheduler,
        nodes,
        limits,
    })
}

/// GPU resources asked for by the pods bound to each node, other than `pod`, that have not finished.
fn gpus_in_use(snapshot: &Snapshot, pod: &PodFacts) -> HashMap<String, BTreeMap<String, i64>> {
    let mut used: HashMap<String, BTreeMap<String, i64>> = HashMap::new();
    for other in &snapshot.pods {
        if other.is_finished() || (other.metadata.uid == pod.metadata.uid && other.key() == pod.key()) {
            continue;
        }
        let Some(node) = other.spec.node_name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        for (resource, count) in pod_gpu_requests(other) {
            *used
                .entry(node.to_owned())
                .or_default()
                .entry(resource)
                .or_insert(0) += count;
        }
    }
    used
}

fn fit(
    report: &Report,
    node: &k8s_openapi::api::core::v1::Node,
    pod: &PodFacts,
    used: &HashMap<String, BTreeMap<String, i64>>,
) -> NodeFit {
    let name = node.metadata.name.clone().unwrap_or_default();
    let node_report = report.nodes.iter().find(|n| n.name == name);
    let mut reasons = Vec::new();
    let mut gpu_reasons = 0;
    let mut advertises_none = false;
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True");
    if !ready {
        reasons.push("the node is not Ready".to_owned());
    }
    if let Err(misfit) = pod_fits(node, &pod.placement_spec()) {
        reasons.push(misfit.to_string());
    }
    let allocatable = node_gpu_resources(node, Side::Allocatable);
    let in_use = used.get(&name).cloned().unwrap_or_default();
    let free: BTreeMap<String, i64> = allocatable
        .iter()
        .map(|(resource, total)| {
            (
                resource.clone(),
                total - in_use.get(resource).copied().unwrap_or(0),
            )
        })
        .collect();
    for (resource, milli) in pod_requests(pod) {
        if milli <= 0 {
            continue;
        }
        if is_gpu_resource(&resource) {
            let wanted = i64::try_from(milli.div_euclid(1000)).unwrap_or(i64::MAX);
            let total = allocatable.get(&resource).copied().unwrap_or(0);
            let available = free.get(&resource).copied().unwrap_or(0);
            if total == 0 {
                reasons.push(format!("advertises no {resource}"));
                gpu_reasons += 1;
                advertises_none = true;
            } else if available < wanted {
                reasons.push(format!(
                    "has {available} of {total} {resource} free, the pod asks for {wanted}"
                ));
                gpu_reasons += 1;
            }
        } else if let Some(total) = node_resource_milli(node, Side::Allocatable, &resource) {
            if total < milli {
                reasons.push(format!(
                    "{resource}: the pod asks for {}, the node has {} allocatable",
                    format_milli(&resource, milli),
                    format_milli(&resource, total)
                ));
            }
        } else if resource != "cpu" && resource != "memory" && resource != "ephemeral-storage" {
            reasons.push(format!("advertises no {resource}"));
        }
    }
    NodeFit {
        name,
        gpu: node_report.is_some_and(|n| n.gpu),
        fits: reasons.is_empty(),
        short_of_gpus_only: gpu_reasons > 0 && gpu_reasons == reasons.len(),
        advertises_none,
        reasons,
        free,
        first_broken_link: node_report.and_then(|n| n.first_broken_link),
        chain: node_report.and_then(first_chain_problem),
    }
}

/// The message of the finding that names the node's first broken link.
fn first_chain_problem(node: &NodeReport) -> Option<String> {
    let link = node.first_broken_link?;
    node.findings
        .iter()
        .find(|f| f.link == link)
        .map(|f| f.message.clone())
}

fn listing(resources: &BTreeMap<String, i64>) -> String {
    resources
        .iter()
        .map(|(name, count)| format!("{count} {name}"))
        .collect::<Vec<_>>()
        .join(" and ")
}

fn bound_verdict(
    pod: &PodFacts,
    state: &PodState,
    node: &str,
    requests: &BTreeMap<String, i64>,
    report: &Report,
) -> Verdict {
    let Some(node_report) = report.nodes.iter().find(|n| n.name == node) else {
        return Verdict {
            link: Some(Link::Scheduling),
            sentence: format!("The pod is bound to node {node}, which is not in the snapshot."),
        };
    };
    if let PodState::Failed {
        reason: Some(reason),
        message,
        ..
    } = state
        && (reason == "UnexpectedAdmissionError" || reason.starts_with("OutOf"))
    {
        return Verdict {
            link: Some(Link::DevicePlugin),
            sentence: format!(
                "The kubelet on {node} refused the pod ({reason}{}): the device plugin could not allocate {}.",
                message.as_deref().map(|m| format!(": {m}")).unwrap_or_default(),
                if requests.is_empty() {
                    "its devices".to_owned()
                } else {
                    listing(requests)
                }
            ),
        };
    }
    // The chain on the node, up to CUDA: what breaks there breaks the pod's GPU.
    let broken = node_report
        .findings
        .iter()
        .filter(|f| f.link <= Link::Cuda)
        .min_by_key(|f| f.link);
    if let Some(finding) = broken {
        return Verdict {
            link: Some(finding.link),
            sentence: format!(
                "The pod is on node {node}, where the chain breaks at {}: {}.",
                finding.link, finding.message
            ),
        };
    }
    if requests.is_empty() {
        return Verdict {
            link: Some(Link::DevicePlugin),
            sentence: format!(
                "The pod asks for no GPU resource ({RESOURCE_GPU} or {RESOURCE_MIG_PREFIX}*), so the device plugin \
                 on {node} gives it no GPU and it cannot see one."
            ),
        };
    }
    let waiting = pod
        .status
        .container_statuses
        .iter()
        .find_map(|c| c.state.as_ref().and_then(|s| s.waiting.as_ref()));
    if let Some(waiting) = waiting {
        let reason = waiting.reason.as_deref().unwrap_or("waiting");
        let message = waiting.message.as_deref().unwrap_or_default();
        let lower = message.to_ascii_lowercase();
        if ["nvidia-container", "cdi", "nvidia"]
            .iter()
            .any(|word| lower.contains(word))
        {
            return Verdict {
                link: Some(Link::Toolkit),
                sentence: format!(
                    "The runtime on {node} fails to create the container ({reason}: {message}): it could not inject \
                     the GPU."
                ),
            };
        }
    }
    if let PodState::CrashLoop { container, last, .. } = state {
        return Verdict {
            link: Some(Link::Cuda),
            sentence: format!(
                "Container {container} keeps crashing{} while every link on {node} is healthy; whether that is a \
                 CUDA error only its logs can show.",
                last.as_deref().map(|l| format!(" ({l})")).unwrap_or_default()
            ),
        };
    }
    if state.is_ready() {
        return Verdict {
            link: None,
            sentence: format!(
                "The pod runs on {node} with {}, and every link of the chain there is healthy; what CUDA does \
                 inside the container is not visible through the API.",
                listing(requests)
            ),
        };
    }
    Verdict {
        link: None,
        sentence: format!(
            "The pod is {state} on {node}{}; the chain there is healthy.",
            state.detail().map(|d| format!(" ({d})")).unwrap_or_default()
        ),
    }
}

fn pending_verdict(
    snapshot: &Snapshot,
    requests: &BTreeMap<String, i64>,
    nodes: &[NodeFit],
    scheduler: Option<&str>,
) -> Verdict {
    let said = scheduler
        .map(|m| format!(" (the scheduler says: {m})"))
        .unwrap_or_default();
    let fitting: Vec<&str> = nodes.iter().filter(|n| n.fits).map(|n| n.name.as_str()).collect();
    if !fitting.is_empty() {
        return Verdict {
            link: Some(Link::Scheduling),
            sentence: format!(
                "The pod fits {} as far as selectors, taints and resources go, so something the doctor does not \
                 evaluate keeps it Pending{said}.",
                name_list(&fitting)
            ),
        };
    }
    // GPU nodes that fail only because they advertise none of a requested GPU resource, with a broken
    // chain. A node without a GPU advertising none is no broken link: the pod can never go there.
    let mut starved: Vec<&NodeFit> = nodes
        .iter()
        .filter(|fit| fit.gpu && fit.short_of_gpus_only && fit.advertises_none)
        .filter(|fit| {
            fit.first_broken_link
                .is_some_and(|link| link <= Link::DevicePlugin)
        })
        .collect();
    starved.sort_by_key(|fit| fit.first_broken_link);
    if let Some(first) = starved.first()
        && let Some(link) = first.first_broken_link
    {
        return Verdict {
            link: Some(link),
            sentence: format!(
                "No node can run the pod; {} would, but {}: its first broken link is {link} ({}).",
                first.name,
                first.reasons.join(", "),
                first.chain.as_deref().unwrap_or("see the doctor")
            ),
        };
    }
    for resource in requests.keys() {
        let anywhere = snapshot
            .nodes
            .iter()
            .any(|node| node_gpu_resources(node, Side::Allocatable).contains_key(resource));
        if !anywhere {
            let strategy = active_policy(&snapshot.cluster_policies)
                .and_then(|p| p.spec.mig_strategy())
                .and_then(MigStrategy::parse);
            let hint = if resource.starts_with(RESOURCE_MIG_PREFIX) && strategy != Some(MigStrategy::Mixed) {
                format!(
                    "; only the mixed MIG strategy advertises {RESOURCE_MIG_PREFIX}* resources (the ClusterPolicy's \
                     is {})",
                    strategy.map_or("not set", MigStrategy::as_str)
                )
            } else {
                String::new()
            };
            return Verdict {
                link: Some(Link::DevicePlugin),
                sentence: format!("No node advertises {resource}{hint}{said}."),
            };
        }
    }
    // Where the pod may go: nodes that advertise what it asks for, short only of free GPUs.
    let busy: Vec<&NodeFit> = nodes
        .iter()
        .filter(|fit| fit.short_of_gpus_only && !fit.advertises_none)
        .collect();
    if !busy.is_empty() {
        let names: Vec<&str> = busy.iter().map(|f| f.name.as_str()).collect();
        return Verdict {
            link: Some(Link::Scheduling),
            sentence: format!(
                "No node the pod may go to has enough free GPUs: {} ({}){said}.",
                name_list(&names),
                busy[0].reasons.join(", ")
            ),
        };
    }
    let mut counted: BTreeMap<&str, usize> = BTreeMap::new();
    for fit in nodes {
        if let Some(reason) = fit.reasons.first() {
            *counted.entry(reason.as_str()).or_default() += 1;
        }
    }
    let mut counted: Vec<(&str, usize)> = counted.into_iter().collect();
    counted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let summary: Vec<String> = counted
        .iter()
        .map(|(reason, count)| format!("{count} x {reason}"))
        .collect();
    Verdict {
        link: Some(Link::Scheduling),
        sentence: format!(
            "0/{} nodes can run the pod: {}{said}.",
            nodes.len(),
            if summary.is_empty() {
                "there are no nodes".to_owned()
            } else {
                summary.join("; ")
            }
        ),
    }
}

fn name_list(names: &[&str]) -> String {
    const SHOWN: usize = 5;
    if names.len() <= SHOWN {
        names.join(", ")
    } else {
        format!("{} and {} more", names[..SHOWN].join(", "), names.len() - SHOWN)
    }
}
