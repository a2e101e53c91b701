//! The disruption controller's decision: a PodDisruptionBudget's status from the pods it selects, as
//! Kubernetes' computes it (`expectedPods`, `currentHealthy`, `desiredHealthy`, `disruptionsAllowed`), so
//! that `kubectl get pdb` and `kubectl gpu upgrade-plan` see what the eviction subresource will allow.
//!
//! Simplified: the expected count is the number of selected pods that are not terminating (Kubernetes reads
//! the scale of the pods' controller), and no `disruptedPods` bookkeeping is kept (the fake server's eviction
//! subresource judges each eviction from the pods themselves).

use std::collections::BTreeMap;

use gpuop_api::selector::LabelSelector;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::daemonset::is_ready;

/// The budget's status given the pods of its namespace; `None` when its selector cannot be read.
pub fn status(budget: &PodDisruptionBudget, pods: &[&Pod]) -> Option<PodDisruptionBudgetStatus> {
    let spec = budget.spec.as_ref()?;
    let selector = LabelSelector::from_api(spec.selector.as_ref()?).ok()?;
    let empty = BTreeMap::new();
    let selected: Vec<&&Pod> = pods
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            !matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|pod| selector.matches(pod.metadata.labels.as_ref().unwrap_or(&empty)))
        .collect();
    let expected = i32::try_from(selected.len()).unwrap_or(i32::MAX);
    let healthy = i32::try_from(selected.iter().filter(|pod| is_ready(pod)).count()).unwrap_or(i32::MAX);
    let scaled = |value: &IntOrString| match value {
        IntOrString::Int(count) => *count,
        IntOrString::String(text) => text
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(0, |percent| {
                i32::try_from((i64::from(expected) * percent + 99) / 100).unwrap_or(i32::MAX)
            }),
    };
    let desired = match (&spec.min_available, &spec.max_unavailable) {
        (Some(min), _) => scaled(min),
        (None, Some(max)) => (expected - scaled(max)).max(0),
        (None, None) => expected,
    };
    Some(PodDisruptionBudgetStatus {
        current_healthy: healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: (healthy - desired).max(0),
        observed_generation: budget.metadata.generation,
        ..PodDisruptionBudgetStatus::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_testkit::fixture;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as Selector;

    fn pod(app: &str, ready: bool) -> Pod {
        fixture::pod(app).labels(&[("app", app)]).running(ready).build()
    }

    fn budget(min: Option<IntOrString>, max: Option<IntOrString>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(Selector {
                    match_labels: Some(BTreeMap::from([("app".to_owned(), "train".to_owned())])),
                    ..Selector::default()
                }),
                min_available: min,
                max_unavailable: max,
                ..PodDisruptionBudgetSpec::default()
            }),
            ..PodDisruptionBudget::default()
        }
    }

    #[test]
    fn disruptions_allowed_follow_the_healthy_pods_and_the_budget() {
        let pods = [
            pod("train", true),
            pod("train", true),
            pod("train", true),
            pod("train", false),
            pod("web", true),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let min = status(&budget(Some(IntOrString::Int(2)), None), &refs).unwrap();
        assert_eq!(
            (
                min.expected_pods,
                min.current_healthy,
                min.desired_healthy,
                min.disruptions_allowed
            ),
            (4, 3, 2, 1)
        );
        let max = status(&budget(None, Some(IntOrString::String("25%".into()))), &refs).unwrap();
        assert_eq!(
            (max.desired_healthy, max.disruptions_allowed),
            (3, 0),
            "25% of 4 rounds up to 1"
        );
        let all = status(&budget(Some(IntOrString::String("100%".into())), None), &refs).unwrap();
        assert_eq!(all.disruptions_allowed, 0);
    }
}
