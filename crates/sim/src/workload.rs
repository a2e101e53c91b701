//! GPU workloads of a simulated cluster, as a person writes them in the cluster spec (`workloads:`):
//! Deployment-like sets of pods that each ask for GPUs, with an optional disruption budget; and the objects
//! that stand for them on the API server, an `apps/v1` ReplicaSet and a `policy/v1` PodDisruptionBudget.
//!
//! The simulation creates these objects at the start; the ReplicaSet controller ([`crate::replicaset`])
//! keeps the pods, the scheduler places them on nodes with free GPUs, the kubelets run them. A pod evicted
//! or deleted (by a driver upgrade, by a person) is replaced, and the replacement goes wherever GPUs are
//! free on an uncordoned node.
//!
//! Invariant: a workload's pods carry [`WORKLOAD_LABEL`] with the workload's name, and its ReplicaSet and
//! budget select them by that label alone, so workloads of one namespace never select each other's pods.

use std::collections::BTreeMap;

use gpuop_api::labels::{self, RESOURCE_GPU};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements, Toleration};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

/// The label on a workload's pods (and its ReplicaSet) naming the workload; its ReplicaSet and disruption
/// budget select by it.
pub const WORKLOAD_LABEL: &str = "app.kubernetes.io/name";

/// The image of workload pods. Nothing pulls it; `kubectl get pods -o wide` shows it.
pub const WORKLOAD_IMAGE: &str = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04";

/// A set of identical pods that each ask for GPUs, kept at `replicas` by a ReplicaSet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// The ReplicaSet's name; pods are named `<name>-<5 characters>`.
    pub name: String,
    /// The namespace, created when missing.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Pods kept running.
    #[serde(default = "one")]
    pub replicas: u32,
    /// The extended resource each pod asks for.
    #[serde(default = "default_gpu_resource")]
    pub gpu_resource: String,
    /// How many of it each pod asks for.
    #[serde(default = "one")]
    pub gpus_per_pod: u32,
    /// Node labels the pods need.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate, as in a pod spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// A PodDisruptionBudget over the pods, named after the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<DisruptionBudget>,
}

/// How many of a workload's pods evictions must leave: one of the two fields, a count or a percentage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DisruptionBudget {
    /// Pods that must stay available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    /// Pods that may be unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

fn default_namespace() -> String {
    "default".into()
}
fn one() -> u32 {
    1
}
fn default_gpu_resource() -> String {
    RESOURCE_GPU.into()
}

impl Workload {
    /// `replicas` pods of one `nvidia.com/gpu` each, in `default`, without a budget.
    pub fn gpu(name: &str, replicas: u32) -> Self {
        Self {
            name: name.to_owned(),
            namespace: default_namespace(),
            replicas,
            gpu_resource: default_gpu_resource(),
            gpus_per_pod: 1,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            disruption_budget: None,
        }
    }

    /// In this namespace.
    #[must_use]
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.to_owned();
        self
    }

    /// Each pod asks for `count` of `resource` (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, ...).
    #[must_use]
    pub fn asking_for(mut self, resource: &str, count: u32) -> Self {
        resource.clone_into(&mut self.gpu_resource);
        self.gpus_per_pod = count;
        self
    }

    /// The pods need this node label.
    #[must_use]
    pub fn on_nodes_labelled(mut self, key: &str, value: &str) -> Self {
        self.node_selector.insert(key.to_owned(), value.to_owned());
        self
    }

    /// The pods tolerate every taint with this key.
    #[must_use]
    pub fn tolerating(mut self, key: &str) -> Self {
        self.tolerations.push(Toleration {
            key: Some(key.to_owned()),
            operator: Some("Exists".to_owned()),
            ..Toleration::default()
        });
        self
    }

    /// A budget keeping at least `min_available` (`2`, or `"50%"` as a string) of the pods.
    #[must_use]
    pub fn with_min_available(mut self, min_available: IntOrString) -> Self {
        self.disruption_budget = Some(DisruptionBudget {
            min_available: Some(min_available),
            max_unavailable: None,
        });
        self
    }

    /// A budget letting at most `max_unavailable` of the pods be unavailable.
    #[must_use]
    pub fn with_max_unavailable(mut self, max_unavailable: IntOrString) -> Self {
        self.disruption_budget = Some(DisruptionBudget {
            min_available: None,
            max_unavailable: Some(max_unavailable),
        });
        self
    }

    /// What is wrong with the workload, as (field, problem), if anything.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if let Some(problem) = name_problem(&self.name, 57) {
            return Some(("name", format!("{:?} {problem}", self.name)));
        }
        if let Some(problem) = name_problem(&self.namespace, 63) {
            return Some(("namespace", format!("{:?} {problem}", self.namespace)));
        }
        if !labels::is_gpu_resource(&self.gpu_resource) {
            return Some((
                "gpuResource",
                format!(
                    "{:?} is not a GPU resource: {RESOURCE_GPU}, {RESOURCE_GPU}.shared or {}<profile>",
                    self.gpu_resource,
                    labels::RESOURCE_MIG_PREFIX
                ),
            ));
        }
        if self.gpus_per_pod == 0 {
            return Some(("gpusPerPod", "must be at least 1".into()));
        }
        for toleration in &self.tolerations {
            let operator = toleration.operator.as_deref().unwrap_or("Equal");
            if !["Exists", "Equal"].contains(&operator) {
                return Some((
                    "tolerations",
                    format!("operator {operator:?} is not one of Exists, Equal"),
                ));
            }
            let effect = toleration.effect.as_deref().unwrap_or_default();
            if !["", "NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                return Some((
                    "tolerations",
                    format!("effect {effect:?} is not one of NoSchedule, PreferNoSchedule, NoExecute"),
                ));
            }
        }
        let budget = self.disruption_budget.as_ref()?;
        let ((Some(value), None) | (None, Some(value))) = (&budget.min_available, &budget.max_unavailable)
        else {
            return Some((
                "disruptionBudget",
                "give exactly one of minAvailable, maxUnavailable".into(),
            ));
        };
        let valid = match value {
            IntOrString::Int(count) => *count >= 0,
            IntOrString::String(text) => text
                .strip_suffix('%')
                .and_then(|percent| percent.parse::<u32>().ok())
                .is_some_and(|percent| percent <= 100),
        };
        (!valid).then(|| {
            (
                "disruptionBudget",
                format!("{value:?} is not a count like 2 or a percentage like \"25%\""),
            )
        })
    }

    /// The labels of the workload's pods, which its ReplicaSet and budget select.
    pub fn pod_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(WORKLOAD_LABEL.to_owned(), self.name.clone())])
    }

    fn selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.pod_labels()),
            ..LabelSelector::default()
        }
    }

    /// The ReplicaSet that keeps the workload's pods.
    pub fn replica_set(&self) -> ReplicaSet {
        let limits = BTreeMap::from([(self.gpu_resource.clone(), Quantity(self.gpus_per_pod.to_string()))]);
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.pod_labels()),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(i32::try_from(self.replicas).unwrap_or(i32::MAX)),
                selector: self.selector(),
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(self.pod_labels()),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "cuda".into(),
                            image: Some(WORKLOAD_IMAGE.into()),
                            command: Some(vec!["sleep".into(), "infinity".into()]),
                            resources: Some(ResourceRequirements {
                                limits: Some(limits),
                                ..ResourceRequirements::default()
                            }),
                            ..Container::default()
                        }],
                        node_selector: (!self.node_selector.is_empty()).then(|| self.node_selector.clone()),
                        tolerations: (!self.tolerations.is_empty()).then(|| self.tolerations.clone()),
                        ..PodSpec::default()
                    }),
                }),
                ..ReplicaSetSpec::default()
            }),
            status: None,
        }
    }

    /// The budget over the workload's pods, if it has one.
    pub fn disruption_budget(&self) -> Option<PodDisruptionBudget> {
        let budget = self.disruption_budget.as_ref()?;
        Some(PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.pod_labels()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                min_available: budget.min_available.clone(),
                max_unavailable: budget.max_unavailable.clone(),
                selector: Some(self.selector()),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: None,
        })
    }
}

/// Why `name` is not a DNS label of at most `longest` characters, if it is not.
fn name_problem(name: &str, longest: usize) -> Option<String> {
    let valid_characters = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() || !valid_characters || !ends(name.chars().next()) || !ends(name.chars().last()) {
        Some("must be lowercase letters, digits and '-', starting and ending with a letter or digit".into())
    } else if name.len() > longest {
        Some(format!("is longer than {longest} characters"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_becomes_a_replica_set_and_a_budget_selecting_its_pods() {
        let workload = Workload::gpu("train", 4)
            .in_namespace("ml")
            .asking_for("nvidia.com/gpu", 2)
            .on_nodes_labelled("gpu-sim.io/pool", "h100")
            .with_min_available(IntOrString::String("50%".into()));
        let rs = workload.replica_set();
        let spec = rs.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(4));
        assert_eq!(rs.metadata.namespace.as_deref(), Some("ml"));
        let template = spec.template.as_ref().unwrap();
        let pod_labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(spec.selector.match_labels.as_ref(), Some(pod_labels));
        let pod = template.spec.as_ref().unwrap();
        let limits = pod.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap();
        assert_eq!(limits["nvidia.com/gpu"], Quantity("2".into()));
        assert_eq!(pod.node_selector.as_ref().unwrap()["gpu-sim.io/pool"], "h100");
        let budget = workload.disruption_budget().unwrap();
        let budget_spec = budget.spec.unwrap();
        assert_eq!(budget_spec.selector.as_ref(), Some(&spec.selector));
        assert_eq!(budget_spec.min_available, Some(IntOrString::String("50%".into())));
        assert!(Workload::gpu("infer", 1).disruption_budget().is_none());
    }

    #[test]
    fn mistakes_are_named_by_field() {
        let problem = |w: Workload| w.problem().map(|(field, problem)| format!("{field}: {problem}"));
        assert_eq!(problem(Workload::gpu("train", 2)), None);
        assert!(
            problem(Workload::gpu("Train", 1))
                .unwrap()
                .starts_with("name: \"Train\" must be lowercase")
        );
        assert!(
            problem(Workload::gpu("a", 1).asking_for("cpu", 1))
                .unwrap()
                .starts_with("gpuResource: \"cpu\" is not a GPU resource")
        );
        assert_eq!(
            problem(Workload::gpu("a", 1).asking_for(RESOURCE_GPU, 0)).unwrap(),
            "gpusPerPod: must be at least 1"
        );
        let mut both = Workload::gpu("a", 1).with_min_available(IntOrString::Int(1));
        both.disruption_budget.as_mut().unwrap().max_unavailable = Some(IntOrString::Int(1));
        assert_eq!(
            problem(both).unwrap(),
            "disruptionBudget: give exactly one of minAvailable, maxUnavailable"
        );
        assert!(
            problem(Workload::gpu("a", 1).with_max_unavailable(IntOrString::String("half".into())))
                .unwrap()
                .contains("is not a count like 2 or a percentage")
        );
    }
}
