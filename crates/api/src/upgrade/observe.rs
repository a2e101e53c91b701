//! From Kubernetes objects to what [`decide`](super::decide) and [`plan`](super::plan) read: the operator
//! builds its views from its caches with these, and `kubectl gpu upgrade-plan` from a cluster or a
//! snapshot, so both see a node, its driver pod and its workloads by the same rules.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use super::{Disruption, DriverPod, NodeView, UpgradeState, WorkloadPod};
use crate::Operand;
use crate::labels::{
    COMPONENT, DRIVER_OWNER, UPGRADE_ENABLED_ANNOTATION, UPGRADE_INITIAL_UNSCHEDULABLE, UPGRADE_REQUESTED,
    UPGRADE_RESTART_ONLY, UPGRADE_SKIP, UPGRADE_STATE, UPGRADE_VALIDATION_START,
    UPGRADE_WAIT_FOR_COMPLETION_START, UPGRADE_WAIT_FOR_SAFE_LOAD,
};
use crate::read::{NodeRead, PodRead};
pub use crate::rollout::{REVISION_HASH, latest_revision, revision_of};
use crate::selector::{LabelSelector, SelectorError};

/// Whether an object's labels make it a driver's: the catalogue's `app.kubernetes.io/component` of the
/// driver, which NVIDIA's driver pods carry for ClusterPolicy and NVIDIADriver alike.
pub fn is_driver(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(COMPONENT)).map(String::as_str) == Some(Operand::Driver.info().component)
}

/// Whether a pod is a driver's ([`is_driver`] on its labels).
pub fn is_driver_pod(pod: &(impl PodRead + ?Sized)) -> bool {
    pod.label(COMPONENT) == Some(Operand::Driver.info().component)
}

/// Whether the upgrade controller reads this pod: a driver's ([`DriverPods`]) or a validator's
/// ([`validators`]). Other operand pods matter to readiness only.
pub fn upgrades_read(pod: &(impl PodRead + ?Sized)) -> bool {
    is_driver_pod(pod) || pod.label("app") == Some(Operand::OperatorValidator.info().daemonset)
}

/// A driver pod, with the DaemonSet that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedDriver {
    /// Name of the owning DaemonSet; empty for an orphan.
    pub daemonset: String,
    /// The pod as the decision sees it.
    pub pod: DriverPod,
}

/// The driver pods of a cluster, by node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverPods {
    /// Per node, its driver pods (usually one; two while one replaces another).
    pub by_node: BTreeMap<String, Vec<OwnedDriver>>,
}

impl DriverPods {
    /// Indexes the driver pods among `pods` (those labelled `app.kubernetes.io/component=nvidia-driver`),
    /// judging each against its DaemonSet's latest revision.
    pub fn index<'a, P: PodRead + 'a>(
        pods: impl IntoIterator<Item = &'a P>,
        daemonsets: &[&DaemonSet],
        revisions: &[&ControllerRevision],
    ) -> Self {
        let mut by_node: BTreeMap<String, Vec<OwnedDriver>> = BTreeMap::new();
        for pod in pods.into_iter().filter(|p| is_driver_pod(*p)) {
            let Some(node) = pod.node_name().map(str::to_owned) else {
                continue;
            };
            let daemonset = pod.daemonset_uid().and_then(|uid| {
                daemonsets
                    .iter()
                    .find(|ds| ds.metadata.uid.as_deref() == Some(uid))
            });
            let (in_sync, restart_only) = match daemonset {
                Some(ds) => {
                    let latest = ds
                        .metadata
                        .uid
                        .as_deref()
                        .and_then(|uid| latest_revision(uid, revisions.iter().copied()));
                    let in_sync = crate::rollout::is_current_revision(revision_of(pod), latest.as_deref());
                    let wanted = ds
                        .spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .and_then(|s| {
                            s.containers
                                .iter()
                                .flat_map(|c| c.env.iter().flatten())
                                .find(|e| e.name == crate::driver::DRIVER_CONFIG_DIGEST)
                        })
                        .and_then(|e| e.value.as_deref());
                    (in_sync, wanted.is_some() && wanted == pod.driver_digest())
                }
                None => (false, false),
            };
            let restarts = pod.restarts();
            by_node.entry(node).or_default().push(OwnedDriver {
                daemonset: daemonset
                    .and_then(|ds| ds.metadata.name.clone())
                    .unwrap_or_default(),
                pod: DriverPod {
                    name: pod.name().to_owned(),
                    in_sync,
                    orphaned: daemonset.is_none(),
                    restart_only,
                    ready_since: pod.ready_since(),
                    restarts,
                    terminating: pod.terminating(),
                },
            });
        }
        // A node has one driver pod, two while one replaces another: a list grown by push holds room for
        // four (a quarter of a kilobyte per node, kept as long as the index is).
        for pods in by_node.values_mut() {
            pods.shrink_to_fit();
        }
        Self { by_node }
    }

    /// Whether one of the node's driver pods comes from one of these DaemonSets.
    pub fn runs_one_of(&self, node: &str, daemonsets: &BTreeSet<String>) -> bool {
        self.by_node
            .get(node)
            .is_some_and(|pods| pods.iter().any(|p| daemonsets.contains(&p.daemonset)))
    }

    /// The node's driver pod as a pool with these DaemonSets sees it. While an outdated or foreign pod
    /// still runs, that one (it must go first); then the live one; then one being deleted. A pod of
    /// another DaemonSet counts as orphaned: the pool must replace it.
    pub fn on(&self, node: &str, daemonsets: &BTreeSet<String>) -> Option<DriverPod> {
        let pods = self.by_node.get(node)?;
        let current =
            |p: &&OwnedDriver| p.pod.in_sync && !p.pod.orphaned && daemonsets.contains(&p.daemonset);
        let pick = pods
            .iter()
            .find(|p| !p.pod.terminating && !current(p))
            .or_else(|| pods.iter().find(|p| !p.pod.terminating))
            .or_else(|| pods.first())?;
        let mut pod = pick.pod.clone();
        if !daemonsets.contains(&pick.daemonset) {
            pod.orphaned = true;
        }
        Some(pod)
    }
}

/// The nodes and driver DaemonSets of one upgrade pool: a ClusterPolicy's driver, or an NVIDIADriver's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolScope {
    /// For an NVIDIADriver, its name: its nodes carry `nvidia.com/gpu-operator.driver.owner` with it. A
    /// ClusterPolicy's pool has the nodes that carry no such label.
    pub routed_to: Option<String>,
    /// Names of the pool's driver DaemonSets (in the operator namespace).
    pub daemonsets: BTreeSet<String>,
    /// Nodes left alone: claimed by several NVIDIADrivers, they keep the driver they run.
    pub held: BTreeSet<String>,
}

impl PoolScope {
    /// Whether the node is the pool's: routed to its NVIDIADriver; or, for a ClusterPolicy, routed to none
    /// and running a driver pod (its own, or one left behind by an NVIDIADriver, which it must replace) or
    /// in the middle of an upgrade (its driver pod may be gone for a moment, and the node still holds
    /// budget).
    pub fn includes(&self, node: &(impl NodeRead + ?Sized), drivers: &DriverPods) -> bool {
        let owner = node.label(DRIVER_OWNER);
        if self.held.contains(node.name()) {
            return false;
        }
        match &self.routed_to {
            Some(name) => owner == Some(name.as_str()),
            None => {
                owner.is_none()
                    && (drivers.by_node.contains_key(node.name())
                        || UpgradeState::from_label(node.label(UPGRADE_STATE)).is_in_progress())
            }
        }
    }
}

/// The decision's view of a node, from its labels, annotations, cordon and Ready condition. The caller
/// adds the time it has seen the state since, and the pods when the node is being emptied.
pub fn node_view(
    node: &(impl NodeRead + ?Sized),
    driver: Option<DriverPod>,
    validator_ready_since: Option<i64>,
) -> NodeView {
    let annotation = |key: &str| node.annotation(key);
    let time = |key: &str| annotation(key).and_then(|v| v.parse::<i64>().ok());
    NodeView {
        name: node.name().to_owned(),
        state: UpgradeState::from_label(node.label(UPGRADE_STATE)),
        skip: node.label(UPGRADE_SKIP) == Some("true"),
        unschedulable: node.unschedulable(),
        ready: node.ready(),
        initially_unschedulable: annotation(UPGRADE_INITIAL_UNSCHEDULABLE).is_some(),
        requested: annotation(UPGRADE_REQUESTED) == Some("true"),
        waiting_for_safe_load: annotation(UPGRADE_WAIT_FOR_SAFE_LOAD) == Some("true"),
        upgrade_enabled_annotation: annotation(UPGRADE_ENABLED_ANNOTATION) == Some("true"),
        restart_only: annotation(UPGRADE_RESTART_ONLY) == Some("true"),
        wait_started: time(UPGRADE_WAIT_FOR_COMPLETION_START),
        validation_started: time(UPGRADE_VALIDATION_START),
        state_since: 0,
        driver,
        validator_ready_since,
        pods: Vec::new(),
    }
}

/// Per node, since when its validator pod has been Ready (`None` while it is not).
pub fn validators<'a, P: PodRead + 'a>(
    pods: impl IntoIterator<Item = &'a P>,
) -> BTreeMap<String, Option<i64>> {
    pods.into_iter()
        .filter(|p| p.label("app") == Some(Operand::OperatorValidator.info().daemonset))
        .filter(|p| !p.terminating())
        .filter_map(|p| Some((p.node_name()?.to_owned(), p.ready_since())))
        .collect()
}

/// Whether the pod requests GPUs: `nvidia.com/gpu*` or `nvidia.com/mig-*` in any container's limits or
/// requests (as NVIDIA's pod deletion filter decides).
pub fn uses_gpu(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| r.limits.iter().flatten().chain(r.requests.iter().flatten()))
            .any(|(resource, _)| {
                resource.starts_with("nvidia.com/gpu") || resource.starts_with("nvidia.com/mig-")
            })
    })
}

/// A pod as the eviction rules see it.
pub fn workload_pod(pod: &Pod) -> WorkloadPod {
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    WorkloadPod {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        uses_gpu: uses_gpu(pod),
        // Mirror pods belong to the kubelet; like DaemonSet pods, evicting them achieves nothing.
        daemon: mirror || controller.is_some_and(|o| o.kind == "DaemonSet"),
        controlled: controller.is_some(),
        empty_dir: pod
            .spec
            .as_ref()
            .is_some_and(|s| s.volumes.iter().flatten().any(|v| v.empty_dir.is_some())),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// A PodDisruptionBudget as [`plan`](super::plan) reads it: its namespace, selector and
/// `status.disruptionsAllowed` (absent counts as 0, as the eviction API refuses while a budget has no
/// status). `None` for a budget without a selector: in `policy/v1` it selects no pod (an empty selector `{}`
/// selects every pod of its namespace).
pub fn disruption(pdb: &PodDisruptionBudget) -> Result<Option<Disruption>, SelectorError> {
    let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return Ok(None);
    };
    let namespace = pdb.metadata.namespace.clone().unwrap_or_default();
    Ok(Some(Disruption {
        name: format!("{namespace}/{}", pdb.metadata.name.as_deref().unwrap_or_default()),
        namespace,
        selector: LabelSelector::from_api(selector)?,
        allowed: pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::DRIVER_CONFIG_DIGEST;
    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::Container;
    use k8s_openapi::api::core::v1::{EnvVar, PodCondition, PodSpec, PodStatus, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }

    fn env(digest: &str) -> Vec<Container> {
        vec![Container {
            name: "nvidia-driver-ctr".into(),
            env: Some(vec![EnvVar {
                name: DRIVER_CONFIG_DIGEST.into(),
                value: Some(digest.into()),
                ..EnvVar::default()
            }]),
            ..Container::default()
        }]
    }

    fn driver_pod(
        name: &str,
        node: &str,
        owner_ref: Option<OwnerReference>,
        hash: &str,
        digest: &str,
    ) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    (COMPONENT.to_owned(), Operand::Driver.info().component.to_owned()),
                    (REVISION_HASH.to_owned(), hash.to_owned()),
                ])),
                owner_references: owner_ref.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: env(digest),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn driver_pods_are_judged_against_their_daemonsets_latest_revision() {
        let ds = DaemonSet {
            metadata: ObjectMeta {
                name: Some("nvidia-driver-daemonset".into()),
                uid: Some("ds-uid".into()),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        containers: env("d2"),
                        ..PodSpec::default()
                    }),
                    ..PodTemplateSpec::default()
                },
                ..DaemonSetSpec::default()
            }),
            ..DaemonSet::default()
        };
        let revision = |hash: &str, number: i64| ControllerRevision {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([(REVISION_HASH.to_owned(), hash.to_owned())])),
                owner_references: Some(vec![owner("DaemonSet", "nvidia-driver-daemonset", "ds-uid")]),
                ..ObjectMeta::default()
            },
            revision: number,
            ..ControllerRevision::default()
        };
        let revisions = [revision("old", 1), revision("new", 2)];
        let ds_owner = owner("DaemonSet", "nvidia-driver-daemonset", "ds-uid");
        let pods = [
            driver_pod("a", "node-a", Some(ds_owner.clone()), "new", "d2"),
            driver_pod("b", "node-b", Some(ds_owner.clone()), "old", "d1"),
            driver_pod("c", "node-c", Some(ds_owner), "old", "d2"),
            driver_pod("d", "node-d", None, "old", "d1"),
        ];
        let drivers = DriverPods::index(&pods, &[&ds], &revisions.iter().collect::<Vec<_>>());
        let ours = BTreeSet::from(["nvidia-driver-daemonset".to_owned()]);
        let a = drivers.on("node-a", &ours).unwrap();
        assert!(a.in_sync && !a.orphaned && a.ready_since.is_some());
        let b = drivers.on("node-b", &ours).unwrap();
        assert!(
            !b.in_sync && !b.restart_only,
            "outdated, and the digest differs: a reinstall"
        );
        assert!(
            drivers.on("node-c", &ours).unwrap().restart_only,
            "same digest: a restart will do"
        );
        assert!(drivers.on("node-d", &ours).unwrap().orphaned);
        let theirs = BTreeSet::from(["nvidia-gpu-driver-ubuntu22.04-abc".to_owned()]);
        assert!(
            drivers.on("node-a", &theirs).unwrap().orphaned,
            "another pool's pod must be replaced"
        );
        assert!(drivers.runs_one_of("node-a", &ours) && !drivers.runs_one_of("node-d", &ours));
    }

    #[test]
    fn an_outdated_pod_is_seen_before_its_pending_replacement() {
        let ds_owner = owner("DaemonSet", "new-ds", "new-uid");
        let ds = DaemonSet {
            metadata: ObjectMeta {
                name: Some("new-ds".into()),
                uid: Some("new-uid".into()),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        };
        let pods = [
            driver_pod("replacement", "n", Some(ds_owner), "h", "d"),
            driver_pod("orphan", "n", None, "h", "d"),
        ];
        let drivers = DriverPods::index(&pods, &[&ds], &[]);
        let ours = BTreeSet::from(["new-ds".to_owned()]);
        assert_eq!(
            drivers.on("n", &ours).unwrap().name,
            "orphan",
            "the orphan must go first"
        );
    }

    #[test]
    fn workload_pods_are_classified_as_kubectl_drain_does() {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some("train-0".into()),
                namespace: Some("ml".into()),
                owner_references: Some(vec![owner("ReplicaSet", "train", "rs")]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                        limits: Some(BTreeMap::from([(
                            "nvidia.com/mig-1g.10gb".to_owned(),
                            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let seen = workload_pod(&pod);
        assert!(seen.uses_gpu && seen.controlled && !seen.daemon && !seen.empty_dir);
        assert_eq!(seen.key(), "ml/train-0");
        pod.metadata.owner_references = Some(vec![owner("DaemonSet", "agent", "ds")]);
        assert!(workload_pod(&pod).daemon);
        pod.metadata.owner_references = None;
        assert!(!workload_pod(&pod).controlled);
    }

    #[test]
    fn a_disruption_budget_selects_as_policy_v1_says() {
        let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "train"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["batch", "spot"]},
                                     {"key": "gpu", "operator": "Exists"}]}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2}
        }))
        .unwrap();
        let budget = disruption(&pdb).unwrap().unwrap();
        assert_eq!(
            (budget.name.as_str(), budget.namespace.as_str(), budget.allowed),
            ("ml/train", "ml", 0)
        );
        let labels = crate::labels::label_map;
        assert!(
            budget
                .selector
                .matches(&labels(&[("app", "train"), ("gpu", "1")]))
        );
        assert!(
            !budget
                .selector
                .matches(&labels(&[("app", "train"), ("gpu", "1"), ("tier", "spot")]))
        );
        assert!(
            !budget.selector.matches(&labels(&[("app", "train")])),
            "gpu must exist"
        );

        let mut everything = pdb.clone();
        everything.spec.as_mut().unwrap().selector = Some(Default::default());
        everything.status = None;
        let budget = disruption(&everything).unwrap().unwrap();
        assert!(
            budget.selector.matches(&labels(&[])),
            "{{}} selects every pod of the namespace"
        );
        assert_eq!(budget.allowed, 0, "no status yet: the eviction API refuses");
        let mut nothing = pdb;
        nothing.spec.as_mut().unwrap().selector = None;
        assert_eq!(
            disruption(&nothing).unwrap(),
            None,
            "a null selector selects no pod"
        );
    }
}
