//! What the API server does for pods beyond storing them: the admission defaults every pod gets (priority
//! from its PriorityClass, the default not-ready/unreachable tolerations, the `default` service account),
//! and the decisions behind the `binding` and `eviction` subresources.
//!
//! These are pure functions of the objects involved; the store reads the objects and applies the result.

use serde_json::{Value, json};

use crate::error::{ApiError, Cause, GroupKind, GroupResource};
use crate::json;
use crate::selector::LabelSelector;

/// Fills in what admission plugins add to a new pod. `class` is the PriorityClass the pod names, if it
/// names one and it exists. Fails when the pod names a PriorityClass that does not exist.
pub(crate) fn admit(pod: &mut Value, class: Option<&Value>) -> Result<(), ApiError> {
    let name = json::text(pod, "/metadata/name").to_owned();
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    match spec.get("priorityClassName").and_then(Value::as_str) {
        Some(wanted) if !wanted.is_empty() => {
            let Some(class) = class else {
                return Err(ApiError::Forbidden {
                    resource: GroupResource::new("", "pods"),
                    name: name.clone(),
                    message: format!(
                        "pods \"{name}\" is forbidden: no PriorityClass with name {wanted} was found"
                    ),
                });
            };
            spec.insert("priority".into(), class.get("value").cloned().unwrap_or(json!(0)));
            let policy = class
                .get("preemptionPolicy")
                .cloned()
                .unwrap_or(json!("PreemptLowerPriority"));
            spec.insert("preemptionPolicy".into(), policy);
        }
        _ => {
            spec.entry("priority").or_insert(json!(0));
        }
    }
    if spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("serviceAccountName".into(), json!("default"));
        spec.insert("serviceAccount".into(), json!("default"));
    }
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(tolerations) = tolerations.as_array_mut() {
        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
            let tolerated = tolerations.iter().any(|t| {
                let effect = t.get("effect").and_then(Value::as_str).unwrap_or_default();
                let matches_key = t.get("key").and_then(Value::as_str).is_none_or(|k| k == key);
                matches_key
                    && (effect.is_empty() || effect == "NoExecute")
                    && (t.get("operator").and_then(Value::as_str) == Some("Exists") || t.get("key").is_some())
            });
            if !tolerated {
                tolerations.push(json!({
                    "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300
                }));
            }
        }
    }
    Ok(())
}

/// Binds a pod to a node: sets `spec.nodeName` and the `PodScheduled` condition.
pub(crate) fn bind(pod: &mut Value, binding: &Value, now: &str) -> Result<(), ApiError> {
    let name = json::text(pod, "/metadata/name").to_owned();
    let node = json::text(binding, "/target/name").to_owned();
    if node.is_empty() {
        return Err(ApiError::invalid_causes(
            GroupKind {
                group: String::new(),
                kind: "Binding".into(),
            },
            &name,
            vec![crate::causes::required("target.name", "")],
        ));
    }
    if let Some(current) = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(ApiError::Conflict {
            resource: GroupResource::new("", "pods/binding"),
            name: name.clone(),
            detail: format!("pod {name} is already assigned to node \"{current}\""),
        });
    }
    pod["spec"]["nodeName"] = json!(node);
    let status = pod
        .as_object_mut()
        .map(|p| p.entry("status").or_insert_with(|| json!({})));
    if let Some(status) = status.and_then(Value::as_object_mut) {
        let conditions = status.entry("conditions").or_insert_with(|| json!([]));
        if let Some(conditions) = conditions.as_array_mut() {
            conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            conditions.push(
                json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
                                   "lastTransitionTime": now}),
            );
        }
    }
    Ok(())
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp")
        .is_none_or(Value::is_null)
        && json::items(pod, "/status/conditions").any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready") && c.get("status") == Some(&json!("True"))
        })
}

/// An `intstr` budget (`3` or `"50%"`) resolved against `total`, rounding up as the disruption controller does.
fn resolve(budget: &Value, total: usize) -> Option<usize> {
    match budget {
        Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
        Value::String(text) => match text.strip_suffix('%') {
            // The budget is client input: a percentage too large to multiply resolves to no budget.
            Some(percent) => percent
                .parse::<usize>()
                .ok()
                .and_then(|p| p.checked_mul(total))
                .map(|p| p.div_ceil(100)),
            None => text.parse().ok(),
        },
        _ => None,
    }
}

/// Whether evicting `pod` is allowed by the disruption budgets of its namespace. `pods` are the namespace's
/// pods. The budgets' status is computed here, as the disruption controller would have.
pub(crate) fn may_evict(pod: &Value, budgets: &[Value], pods: &[Value]) -> Result<(), ApiError> {
    let labels = pod
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let covering: Vec<&Value> = budgets
        .iter()
        .filter(|b| {
            LabelSelector::from_object(b.pointer("/spec/selector"))
                .is_ok_and(|s| !s.is_empty() && s.matches(&labels))
        })
        .collect();
    // A pod that is not running (or not yet ready) can always go: evicting it disrupts nothing.
    let phase = json::text(pod, "/status/phase");
    if covering.is_empty() || matches!(phase, "Succeeded" | "Failed" | "Pending") || !is_ready(pod) {
        return Ok(());
    }
    if covering.len() > 1 {
        return Err(ApiError::Internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
        ));
    }
    let budget = covering[0];
    let selector = LabelSelector::from_object(budget.pointer("/spec/selector")).unwrap_or_default();
    let selected: Vec<&Value> = pods
        .iter()
        .filter(|p| {
            let labels = p
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            selector.matches(&labels)
        })
        .collect();
    let expected = selected.len();
    let healthy = selected.iter().filter(|p| is_ready(p)).count();
    let desired = match (
        budget.pointer("/spec/minAvailable"),
        budget.pointer("/spec/maxUnavailable"),
    ) {
        (Some(min), _) => resolve(min, expected).unwrap_or(expected),
        (None, Some(max)) => expected.saturating_sub(resolve(max, expected).unwrap_or(0)),
        (None, None) => expected,
    };
    let allowed = healthy.saturating_sub(desired);
    if allowed == 0 {
        let budget_name = json::text(budget, "/metadata/name");
        return Err(ApiError::TooManyRequests {
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            retry_after_seconds: None,
            causes: vec![Cause {
                reason: "DisruptionBudget".into(),
                message: format!(
                    "The disruption budget {budget_name} needs {desired} healthy pods and has {healthy} currently"
                ),
                field: String::new(),
            }],
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Value {
        json!({"metadata": {"name": name, "labels": {"app": "a"}},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    #[test]
    fn admission_resolves_priority_and_adds_default_tolerations() {
        let mut p = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "system-node-critical"}});
        let class = json!({"value": 2_000_001_000, "preemptionPolicy": "PreemptLowerPriority"});
        admit(&mut p, Some(&class)).expect("admitted");
        assert_eq!(p["spec"]["priority"], 2_000_001_000);
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert_eq!(p["spec"]["tolerations"].as_array().map(Vec::len), Some(2));
        let mut missing = json!({"metadata": {"name": "p"}, "spec": {"priorityClassName": "nope"}});
        let error = admit(&mut missing, None).expect_err("refused");
        assert_eq!(error.code(), 403);
        assert_eq!(
            error.to_string(),
            r#"pods "p" is forbidden: no PriorityClass with name nope was found"#
        );
    }

    #[test]
    fn binding_sets_the_node_once() {
        let mut p = json!({"metadata": {"name": "p"}, "spec": {}});
        bind(&mut p, &json!({"target": {"kind": "Node", "name": "n1"}}), "t").expect("bound");
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled");
        let error = bind(&mut p, &json!({"target": {"name": "n2"}}), "t").expect_err("already bound");
        assert_eq!(error.code(), 409);
    }

    #[test]
    fn a_budget_blocks_eviction_when_no_disruption_is_allowed() {
        let budget = json!({"metadata": {"name": "b"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "a"}}}});
        let pods = [pod("a", true), pod("b", true), pod("c", true)];
        assert!(may_evict(&pods[0], std::slice::from_ref(&budget), &pods).is_ok());
        let pods = [pod("a", true), pod("b", true), pod("c", false)];
        let error = may_evict(&pods[0], std::slice::from_ref(&budget), &pods).expect_err("blocked");
        assert_eq!(error.code(), 429);
        // The unready pod itself may always go.
        assert!(may_evict(&pods[2], std::slice::from_ref(&budget), &pods).is_ok());
        let percent = json!({"metadata": {"name": "b"}, "spec": {"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "a"}}}});
        let pods = [pod("a", true), pod("b", true)];
        assert!(may_evict(&pods[0], &[percent], &pods).is_ok());
    }
}
