//! The settings every operand DaemonSet shares, applied the way NVIDIA's `preProcessDaemonSet` applies them:
//! node selector on the operand's deploy label, tolerations (`daemonsets.tolerations` replace the default
//! `nvidia.com/gpu` toleration), priority class, pod security context, update strategy, and labels and
//! annotations on the DaemonSet and its pods.
//!
//! Label rules: the selector is fixed per DaemonSet (NVIDIA's, so existing DaemonSets can be adopted, since
//! a selector cannot change); pods also carry `app=<name>`, `app.kubernetes.io/managed-by` and
//! `app.kubernetes.io/component`; `daemonsets.labels` go on the DaemonSet and its pods except `app` and
//! `app.kubernetes.io/part-of` (selector keys); managed-by and component always win, since pruning and the
//! driver upgrade rely on them.

use std::collections::BTreeMap;

use gpuop_api::OperandInfo;
use gpuop_api::choice::UpdateStrategy;
use gpuop_api::labels::{COMPONENT, GPU_TAINT, MANAGED_BY, MANAGED_BY_VALUE};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::inputs::Inputs;

/// Priority class of operand pods unless `daemonsets.priorityClassName` names another.
pub(crate) const DEFAULT_PRIORITY_CLASS: &str = "system-node-critical";
/// Labels `daemonsets.labels` may not set on pods: they are selector keys.
const RESERVED_POD_LABELS: &[&str] = &["app", "app.kubernetes.io/part-of"];
/// The selector key of the operands NVIDIA selects by `name` instead of `app`.
pub(crate) const NAME_SELECTOR: &str = "name";

/// How an operand DaemonSet replaces its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rollout {
    /// As the policy says (`daemonsets.updateStrategy`, `rollingUpdate.maxUnavailable`).
    Policy,
    /// Only when a pod is deleted: the driver, whose pods are replaced node by node by the upgrade logic.
    OnDelete,
}

/// One operand DaemonSet before the shared settings are applied.
#[derive(Clone, Debug)]
pub(crate) struct OperandPod {
    /// DaemonSet name.
    pub name: String,
    /// The selector's labels (also on the DaemonSet and its pods).
    pub selector: BTreeMap<String, String>,
    /// Further labels on the DaemonSet and its pods (e.g. `nvidia.com/precompiled`).
    pub labels: BTreeMap<String, String>,
    /// Pod annotations the operand needs.
    pub annotations: BTreeMap<String, String>,
    /// Node labels the pods select on besides the operand's deploy label.
    pub node_selector: BTreeMap<String, String>,
    /// The pod.
    pub spec: PodSpec,
    /// How pods are replaced.
    pub rollout: Rollout,
}

impl OperandPod {
    /// The operand's DaemonSet, selected by `app=<name>`.
    pub fn new(info: &OperandInfo, spec: PodSpec) -> Self {
        Self::named(info.daemonset, spec)
    }

    /// A DaemonSet with this name, selected by `app=<name>`.
    pub fn named(name: &str, spec: PodSpec) -> Self {
        Self {
            name: name.to_owned(),
            selector: labels(&[("app", name)]),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            spec,
            rollout: Rollout::Policy,
        }
    }

    /// Replaces the selector labels (NVIDIA selects a few operands by other labels).
    #[must_use]
    pub fn selected_by(mut self, selector: &[(&str, &str)]) -> Self {
        self.selector = labels(selector);
        self
    }

    /// Adds pod annotations.
    pub fn annotate(&mut self, annotations: impl IntoIterator<Item = (String, String)>) {
        self.annotations.extend(annotations);
    }
}

/// A label map.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The DaemonSet of an operand pod, with the settings every operand shares.
pub(crate) fn daemonset(inputs: &Inputs<'_>, info: &OperandInfo, pod: OperandPod) -> DaemonSet {
    let daemonsets = &inputs.spec.daemonsets;
    let user_labels: BTreeMap<String, String> = daemonsets
        .labels
        .iter()
        .flatten()
        .filter(|(key, _)| !RESERVED_POD_LABELS.contains(&key.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();

    // The pod template carries the labels NVIDIA's operator gives it (its asset's, then the policy's
    // `daemonsets.labels`), nothing of ours: a label added there restarts every pod of a cluster that
    // migrates from NVIDIA's operator. Ours go on the object, where pruning and the caches select by them.
    // NVIDIA's assets label the object and the pods with the selector's labels and the object `app=<name>`
    // where the selector has no `app`; the managers selected by `name` (VFIO, CC, Kata) carry that label on
    // their pods only.
    let mut pod_labels = user_labels.clone();
    pod_labels.extend(pod.selector.clone());
    pod_labels.extend(pod.labels.clone());
    let mut object_labels = user_labels;
    object_labels.extend(
        pod.selector
            .iter()
            .filter(|(key, _)| key.as_str() != NAME_SELECTOR)
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    object_labels.extend(pod.labels.clone());
    object_labels
        .entry("app".to_owned())
        .or_insert_with(|| pod.name.clone());
    object_labels.insert(MANAGED_BY.to_owned(), MANAGED_BY_VALUE.to_owned());
    object_labels.insert(COMPONENT.to_owned(), info.component.to_owned());

    let mut annotations = pod.annotations;
    annotations.extend(daemonsets.annotations.clone().unwrap_or_default());

    let mut node_selector = labels(&[(info.deploy_label, "true")]);
    node_selector.extend(labels(info.extra_node_selector));
    node_selector.extend(pod.node_selector);

    let mut spec = pod.spec;
    spec.node_selector = Some(node_selector);
    spec.tolerations = Some(match daemonsets.tolerations.as_deref() {
        Some(tolerations) if !tolerations.is_empty() => tolerations.to_vec(),
        _ => vec![Toleration {
            key: Some(GPU_TAINT.to_owned()),
            operator: Some("Exists".to_owned()),
            effect: Some("NoSchedule".to_owned()),
            ..Toleration::default()
        }],
    });
    spec.priority_class_name = Some(
        daemonsets
            .priority_class_name
            .clone()
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| DEFAULT_PRIORITY_CLASS.to_owned()),
    );
    if let Some(context) = &daemonsets.pod_security_context {
        spec.security_context = Some(context.clone());
    }

    DaemonSet {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            labels: Some(object_labels),
            annotations: daemonsets.annotations.clone().filter(|a| !a.is_empty()),
            ..ObjectMeta::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(pod.selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!annotations.is_empty()).then_some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(spec),
            },
            update_strategy: Some(update_strategy(inputs, pod.rollout)),
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

fn update_strategy(inputs: &Inputs<'_>, rollout: Rollout) -> DaemonSetUpdateStrategy {
    let on_delete = DaemonSetUpdateStrategy {
        type_: Some("OnDelete".to_owned()),
        rolling_update: None,
    };
    if rollout == Rollout::OnDelete || inputs.policy.update_strategy == UpdateStrategy::OnDelete {
        return on_delete;
    }
    DaemonSetUpdateStrategy {
        type_: Some("RollingUpdate".to_owned()),
        rolling_update: inputs.policy.max_unavailable.map(|max| RollingUpdateDaemonSet {
            max_unavailable: Some(max.to_int_or_string()),
            max_surge: None,
        }),
    }
}
