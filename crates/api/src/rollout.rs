//! Which revision of a DaemonSet a pod runs, and the rule every crate uses to count an operand ready on a
//! node: a Ready pod of the operand's DaemonSet, not being deleted, on the DaemonSet's latest revision. The
//! operator's status and `kubectl gpu doctor` both judge with [`DaemonSetRevision::counts_ready`], so the
//! two cannot disagree about a node in the middle of a rollout.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};

use crate::read::PodRead;

/// Label naming the revision a DaemonSet pod or ControllerRevision belongs to.
pub const REVISION_HASH: &str = "controller-revision-hash";

/// The `controller-revision-hash` of the newest ControllerRevision of the DaemonSet with this uid.
pub fn latest_revision<'a>(
    uid: &str,
    revisions: impl IntoIterator<Item = &'a ControllerRevision>,
) -> Option<String> {
    revisions
        .into_iter()
        .filter(|r| r.metadata.owner_references.iter().flatten().any(|o| o.uid == uid))
        .max_by_key(|r| r.revision)
        .and_then(|r| r.metadata.labels.as_ref()?.get(REVISION_HASH).cloned())
}

/// The labels the DaemonSet controller gives the ControllerRevision `hash` of a DaemonSet: its pod template's
/// labels and [`REVISION_HASH`].
pub fn revision_labels(daemonset: &DaemonSet, hash: &str) -> BTreeMap<String, String> {
    let mut labels = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(REVISION_HASH.to_owned(), hash.to_owned());
    labels
}

/// The pod's revision hash.
pub fn revision_of<P: PodRead + ?Sized>(pod: &P) -> Option<&str> {
    pod.label(REVISION_HASH)
}

/// Whether a pod of this revision runs the DaemonSet's latest one. An unknown latest revision (its
/// ControllerRevisions not read, or not written yet) takes every pod as current.
pub fn is_current_revision(pod: Option<&str>, latest: Option<&str>) -> bool {
    latest.is_none() || pod == latest
}

/// A DaemonSet as readiness reads it: its uid (its pods' owner) and its latest revision's hash, if known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSetRevision {
    /// `metadata.uid`.
    pub uid: String,
    /// The `controller-revision-hash` of its latest ControllerRevision.
    pub latest: Option<String>,
}

impl DaemonSetRevision {
    /// The DaemonSet's uid and latest revision among `revisions`; `None` for a DaemonSet without a uid.
    pub fn of<'a>(
        daemonset: &DaemonSet,
        revisions: impl IntoIterator<Item = &'a ControllerRevision>,
    ) -> Option<Self> {
        let uid = daemonset.metadata.uid.as_deref().filter(|uid| !uid.is_empty())?;
        Some(Self {
            uid: uid.to_owned(),
            latest: latest_revision(uid, revisions),
        })
    }

    /// Whether `pod` makes its operand ready on its node: this DaemonSet controls it, and
    /// [`ready_on_latest`].
    pub fn counts_ready(&self, pod: &(impl PodRead + ?Sized)) -> bool {
        pod.daemonset_uid() == Some(self.uid.as_str()) && ready_on_latest(pod, self.latest.as_deref())
    }
}

/// Whether a pod of a DaemonSet whose latest revision is `latest` makes its operand ready on its node: it is
/// Ready (see [`PodRead::ready_since`]) and not being deleted, and it runs the latest revision when that is
/// known.
pub fn ready_on_latest(pod: &(impl PodRead + ?Sized), latest: Option<&str>) -> bool {
    !pod.terminating() && pod.ready_since().is_some() && is_current_revision(revision_of(pod), latest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn pod(owner: &str, revision: &str, phase: &str, ready: &str, deleted: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                labels: Some([(REVISION_HASH.to_owned(), revision.to_owned())].into()),
                owner_references: Some(vec![OwnerReference {
                    kind: "DaemonSet".into(),
                    uid: owner.into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                deletion_timestamp: deleted.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_pod_counts_when_it_is_the_daemonsets_ready_live_and_current() {
        let set = DaemonSetRevision {
            uid: "ds".into(),
            latest: Some("new".into()),
        };
        assert!(set.counts_ready(&pod("ds", "new", "Running", "True", false)));
        assert!(
            !set.counts_ready(&pod("ds", "old", "Running", "True", false)),
            "an earlier revision"
        );
        assert!(
            !set.counts_ready(&pod("other", "new", "Running", "True", false)),
            "another DaemonSet's"
        );
        assert!(
            !set.counts_ready(&pod("ds", "new", "Running", "False", false)),
            "not Ready"
        );
        assert!(
            !set.counts_ready(&pod("ds", "new", "Pending", "True", false)),
            "not running"
        );
        assert!(
            !set.counts_ready(&pod("ds", "new", "Running", "True", true)),
            "being deleted"
        );
        let unknown = DaemonSetRevision { latest: None, ..set };
        assert!(
            unknown.counts_ready(&pod("ds", "old", "Running", "True", false)),
            "no revision known"
        );
    }
}
