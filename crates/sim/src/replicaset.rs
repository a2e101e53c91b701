//! The ReplicaSet controller's decisions, as a pure function: for one ReplicaSet, given the pods it
//! controls, which pods to create and delete and what its status is. The rules are the real controller's:
//! it keeps `spec.replicas` pods that are neither terminating nor terminal (`Succeeded`, `Failed`), so a pod
//! that is evicted, deleted or rejected by its kubelet is replaced at once; surplus pods go, those that
//! matter least first (unscheduled, then pending, then not ready, then the youngest); the status counts the
//! same pods. Pods are created with `generateName: <replicaset>-` (the server appends five characters), the
//! template's labels and annotations, and a controller owner reference; the scheduler places them.
//!
//! Not modelled: `minReadySeconds` (a ready pod is available at once), adoption and release of pods by
//! label, status conditions, `terminatingReplicas`.

use std::borrow::Borrow;
use std::cmp::Reverse;

use gpuop_api::read::controller_ref;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::daemonset::is_ready;

/// What the controller does for one ReplicaSet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Pods to create (with `generateName`, not bound to a node).
    pub create: Vec<Pod>,
    /// Names of pods to delete.
    pub delete: Vec<String>,
    /// The ReplicaSet's status after this pass (before the creations and deletions take effect).
    pub status: ReplicaSetStatus,
}

/// Plans one pass of the ReplicaSet controller. `pods` are the pods the ReplicaSet controls (a controller
/// owner reference with its uid), as the caches show them; `unseen` is how many pods it created that the
/// caches do not show yet, which count as there so that they are not created twice.
pub fn plan<P: Borrow<Pod>>(replica_set: &ReplicaSet, pods: &[P], unseen: usize) -> Plan {
    let wanted = replica_set
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
        .max(0) as usize;
    let active: Vec<&Pod> = pods.iter().map(Borrow::borrow).filter(|p| is_active(p)).collect();
    let ready = active.iter().filter(|p| is_ready(p)).count();
    let mut plan = Plan {
        status: ReplicaSetStatus {
            replicas: count(active.len()),
            fully_labeled_replicas: Some(count(active.len())),
            ready_replicas: Some(count(ready)),
            available_replicas: Some(count(ready)),
            observed_generation: replica_set.metadata.generation,
            ..ReplicaSetStatus::default()
        },
        ..Plan::default()
    };
    let there = active.len() + unseen;
    if there < wanted {
        plan.create = (there..wanted).map(|_| pod_object(replica_set)).collect();
    } else if active.len() > wanted {
        let mut surplus = active;
        surplus.sort_by_key(|pod| deletion_rank(pod));
        let extra = surplus.len() - wanted;
        plan.delete = surplus
            .iter()
            .take(extra)
            .filter_map(|pod| pod.metadata.name.clone())
            .collect();
    }
    plan
}

/// Whether a pod counts toward the replicas: neither terminating nor terminal.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// Orders pods as the controller deletes surplus ones: unscheduled before scheduled, pending before
/// running, not ready before ready, younger before older.
fn deletion_rank(pod: &Pod) -> (bool, bool, bool, Reverse<Option<Timestamp>>) {
    let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (scheduled, running, is_ready(pod), Reverse(created))
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn pod_object(replica_set: &ReplicaSet) -> Pod {
    let name = replica_set.metadata.name.clone().unwrap_or_default();
    let template = replica_set
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    let template_meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: replica_set.metadata.namespace.clone(),
            labels: template_meta.labels,
            annotations: template_meta.annotations,
            owner_references: Some(vec![controller_ref(replica_set)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn replica_set(replicas: u32) -> ReplicaSet {
        let mut rs = Workload::gpu("train", replicas).in_namespace("ml").replica_set();
        rs.metadata.uid = Some("rs-uid".into());
        rs.metadata.generation = Some(3);
        rs
    }

    /// A pod of the ReplicaSet: on `node` (or unscheduled), in `phase`, ready or not, created at `second`.
    fn pod(name: &str, node: Option<&str>, phase: &str, ready: bool, second: i64) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                creation_timestamp: Some(Time(Timestamp::from_second(second).unwrap())),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_owned),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.to_owned()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    fn running(name: &str, second: i64) -> Pod {
        pod(name, Some("node"), "Running", true, second)
    }

    #[test]
    fn missing_pods_are_created_from_the_template_owned_by_the_replica_set() {
        let rs = replica_set(3);
        let plan = plan(&rs, &[running("train-a", 1)], 0);
        assert_eq!(plan.create.len(), 2);
        assert!(plan.delete.is_empty());
        let created = &plan.create[0];
        assert_eq!(created.metadata.generate_name.as_deref(), Some("train-"));
        assert_eq!(created.metadata.namespace.as_deref(), Some("ml"));
        let template = rs.spec.as_ref().unwrap().template.as_ref().unwrap();
        assert_eq!(
            created.metadata.labels,
            template.metadata.as_ref().unwrap().labels
        );
        assert_eq!(created.spec, template.spec);
        let owner = &created.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("ReplicaSet", "rs-uid", Some(true))
        );
        assert_eq!(
            created.spec.as_ref().unwrap().node_name,
            None,
            "the scheduler places it"
        );
    }

    #[test]
    fn evicted_terminating_and_failed_pods_are_replaced() {
        let rs = replica_set(3);
        let mut terminating = running("train-b", 2);
        terminating.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(9).unwrap()));
        let failed = pod("train-c", Some("node"), "Failed", false, 3);
        let plan = plan(&rs, &[running("train-a", 1), terminating, failed], 0);
        assert_eq!(plan.create.len(), 2, "only the running pod counts");
        assert!(plan.delete.is_empty(), "terminal pods are left to the pod GC");
        assert_eq!(plan.status.replicas, 1);
    }

    #[test]
    fn pods_created_but_not_seen_yet_are_not_created_again() {
        let rs = replica_set(3);
        assert_eq!(plan(&rs, &[running("train-a", 1)], 2).create.len(), 0);
        assert_eq!(plan(&rs, &[running("train-a", 1)], 1).create.len(), 1);
    }

    #[test]
    fn surplus_pods_go_least_useful_first() {
        let rs = replica_set(2);
        let pods = [
            running("old-ready", 1),
            running("young-ready", 5),
            pod("pending", Some("node"), "Pending", false, 2),
            pod("unscheduled", None, "Pending", false, 3),
        ];
        let plan = plan(&rs, &pods, 0);
        assert_eq!(plan.delete, ["unscheduled", "pending"]);
        assert!(plan.create.is_empty());
        let one = super::plan(&replica_set(1), &pods[..2], 0);
        assert_eq!(one.delete, ["young-ready"], "the younger of two ready pods goes");
    }

    #[test]
    fn status_counts_the_active_pods() {
        let rs = replica_set(3);
        let pods = [
            running("a", 1),
            pod("b", Some("node"), "Running", false, 2),
            pod("c", None, "Pending", false, 3),
            pod("d", Some("node"), "Failed", false, 4),
        ];
        let status = plan(&rs, &pods, 0).status;
        assert_eq!(status.replicas, 3);
        assert_eq!(status.fully_labeled_replicas, Some(3));
        assert_eq!(status.ready_replicas, Some(1));
        assert_eq!(status.available_replicas, Some(1));
        assert_eq!(status.observed_generation, Some(3));
    }
}
