//! The CustomResourceDefinitions of `ClusterPolicy` and `NVIDIADriver`, generated from the Rust types.
//!
//! What the types derive is adjusted in one place, here, to match NVIDIA's CRDs: optional fields are not
//! `nullable` (the API server then drops a `null` instead of storing it, as it does with NVIDIA's CRD), and
//! resource quantities get Kubernetes' quantity pattern instead of a page of prose.
//! The generated YAML is committed under `deploy/crds/`; a test fails when it is stale.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use crate::validate::QUANTITY_PATTERN;
use crate::{ClusterPolicy, NVIDIADriver};

/// The ClusterPolicy CRD.
pub fn cluster_policy_crd() -> CustomResourceDefinition {
    tidy(ClusterPolicy::crd())
}

/// The NVIDIADriver CRD.
pub fn nvidia_driver_crd() -> CustomResourceDefinition {
    tidy(NVIDIADriver::crd())
}

/// Both CRDs as one multi-document YAML stream, as `gpu-operator crd` prints it.
pub fn crds_yaml() -> String {
    [cluster_policy_crd(), nvidia_driver_crd()]
        .iter()
        .map(|crd| {
            let yaml = serde_saphyr::to_string(crd).expect("a CRD always serializes");
            format!("---\n{yaml}")
        })
        .collect()
}

/// The `openAPIV3Schema` of a CRD's first version, as JSON.
pub fn openapi_schema(crd: &CustomResourceDefinition) -> Value {
    crd.spec
        .versions
        .first()
        .and_then(|version| version.schema.as_ref())
        .and_then(|validation| validation.open_api_v3_schema.as_ref())
        .map(|schema| serde_json::to_value(schema).expect("a schema always serializes"))
        .unwrap_or(Value::Null)
}

fn tidy(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let mut value = serde_json::to_value(crd).expect("a CRD always serializes");
    tidy_schema(&mut value);
    serde_json::from_value(value).expect("tidying keeps a valid CRD")
}

fn tidy_schema(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("nullable") == Some(&Value::Bool(true)) {
                map.remove("nullable");
            }
            let is_quantity = map
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|description| description.starts_with("Quantity is a fixed-point"));
            if is_quantity {
                map.insert(
                    "description".into(),
                    "A quantity, such as `500m` or `1Gi`.".into(),
                );
                map.insert(
                    "anyOf".into(),
                    json!([{ "type": "integer" }, { "type": "string" }]),
                );
                map.insert("pattern".into(), QUANTITY_PATTERN.into());
            }
            map.values_mut().for_each(tidy_schema);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy_schema),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    fn has_key(value: &Value, key: &str) -> bool {
        match value {
            Value::Object(map) => map.contains_key(key) || map.values().any(|v| has_key(v, key)),
            Value::Array(items) => items.iter().any(|v| has_key(v, key)),
            _ => false,
        }
    }

    #[test]
    fn crds_have_nvidias_names_scope_and_columns() {
        let policy = cluster_policy_crd();
        assert_eq!(
            policy.metadata.name.as_deref(),
            Some("clusterpolicies.nvidia.com")
        );
        assert_eq!(policy.spec.scope, "Cluster");
        let version = &policy.spec.versions[0];
        assert_eq!(version.name, "v1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let columns: Vec<_> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.json_path.as_str())
            .collect();
        assert_eq!(columns, [".status.state", ".metadata.creationTimestamp"]);
        let driver = nvidia_driver_crd();
        assert_eq!(driver.metadata.name.as_deref(), Some("nvidiadrivers.nvidia.com"));
        assert_eq!(driver.spec.versions[0].name, "v1alpha1");
        assert_eq!(
            driver.spec.names.short_names.as_deref(),
            Some(&["nvd".to_owned(), "nvdriver".into(), "nvdrivers".into()][..])
        );
    }

    #[test]
    fn schemas_are_not_nullable_and_quantities_are_patterned() {
        for crd in [cluster_policy_crd(), nvidia_driver_crd()] {
            let schema = openapi_schema(&crd);
            assert!(!has_key(&schema, "nullable"));
            let limits = &schema["properties"]["spec"]["properties"]["driver"]["properties"]["resources"];
            if !limits.is_null() {
                let quantity = &limits["properties"]["limits"]["additionalProperties"];
                assert_eq!(quantity["pattern"], QUANTITY_PATTERN);
                assert_eq!(quantity["x-kubernetes-int-or-string"], true);
            }
        }
    }

    #[test]
    fn the_schema_rejects_what_nvidias_does() {
        let schema = openapi_schema(&cluster_policy_crd());
        let policy = json!({
            "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"},
            "spec": {
                "operator": {}, "daemonsets": {"updateStrategy": "Sometimes"}, "driver": {"kernelModuleType": "closed"},
                "toolkit": {}, "devicePlugin": {"resources": {"limits": {"cpu": "lots"}}}, "dcgmExporter": {}, "dcgm": {},
                "nodeStatusExporter": {}, "gfd": {"enabled": "yes"}, "mig": {"strategy": "double"},
                "driver2": {}
            }
        });
        let messages: Vec<String> = schema::validate(&schema, &policy)
            .iter()
            .map(ToString::to_string)
            .collect();
        let expected = [
            r#"spec.daemonsets.updateStrategy: "Sometimes" is not one of [RollingUpdate, OnDelete]"#,
            r#"spec.driver.kernelModuleType: "closed" is not one of [auto, open, proprietary]"#,
            r#"spec.gfd.enabled: "yes" is a string, expected a boolean"#,
            r#"spec.mig.strategy: "double" is not one of [none, single, mixed]"#,
            r#"spec.driver2: unknown field; the API server would silently drop it (did you mean "driver"?)"#,
        ];
        schema::assert_reports(&messages, &expected);
        assert!(
            messages
                .iter()
                .any(|m| m.starts_with(r#"spec.devicePlugin.resources.limits.cpu: "lots" should match"#)),
            "{messages:#?}"
        );
    }

    /// Every field path of a schema, as `spec.driver.env[].name`; core types are not expanded.
    fn field_paths(schema: &Value, path: &str, out: &mut Vec<String>) {
        if !path.is_empty() {
            out.push(path.to_owned());
        }
        let last = path
            .rsplit('.')
            .next()
            .unwrap_or_default()
            .trim_end_matches(['[', ']', '{', '}']);
        if ["tolerations", "podSecurityContext", "nodeAffinity", "conditions"].contains(&last) {
            return;
        }
        for (key, property) in schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let child = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            field_paths(property, &child, out);
        }
        if let Some(items) = schema.get("items") {
            field_paths(items, &format!("{path}[]"), out);
        }
        if let Some(values) = schema
            .get("additionalProperties")
            .filter(|v| v.get("properties").is_some())
        {
            field_paths(values, &format!("{path}{{}}"), out);
        }
    }

    fn compare_with_nvidia(crd: &CustomResourceDefinition, nvidia_fields: &str) {
        let schema = openapi_schema(crd);
        let mut ours = Vec::new();
        field_paths(&schema, "", &mut ours);
        let nvidia: Vec<&str> = nvidia_fields
            .lines()
            .filter(|line| !line.starts_with('#'))
            .collect();
        let missing: Vec<_> = nvidia
            .iter()
            .filter(|path| !ours.iter().any(|ours| ours == *path))
            .collect();
        assert!(
            missing.is_empty(),
            "fields of NVIDIA's CRD missing here (manifests would lose them): {missing:#?}"
        );
        let extra: Vec<_> = ours
            .iter()
            .filter(|path| path.starts_with("spec") && !nvidia.contains(&path.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "spec fields NVIDIA's CRD does not have: {extra:#?}"
        );
    }

    #[test]
    fn every_field_of_nvidias_cluster_policy_is_here_and_no_other() {
        compare_with_nvidia(
            &cluster_policy_crd(),
            include_str!("../testdata/nvidia-clusterpolicy-fields.txt"),
        );
    }

    #[test]
    fn every_field_of_nvidias_nvidia_driver_is_here_and_no_other() {
        compare_with_nvidia(
            &nvidia_driver_crd(),
            include_str!("../testdata/nvidia-nvidiadriver-fields.txt"),
        );
    }

    #[test]
    fn every_cel_rule_compiles_and_evaluates() {
        let policy: Value =
            serde_saphyr::from_str(include_str!("../../../deploy/samples/clusterpolicy.yaml")).unwrap();
        let drivers: Vec<Value> =
            serde_saphyr::from_multiple(include_str!("../../../deploy/samples/nvidiadrivers.yaml")).unwrap();
        let crd = cluster_policy_crd();
        assert_eq!(
            schema::rule_faults(&openapi_schema(&crd), &policy),
            Vec::<String>::new()
        );
        let crd = nvidia_driver_crd();
        for driver in &drivers {
            assert_eq!(
                schema::rule_faults(&openapi_schema(&crd), driver),
                Vec::<String>::new()
            );
        }
    }

    /// The CEL rules stop at the API server what the operator's validation would refuse later.
    #[test]
    fn cel_rules_agree_with_the_operators_validation() {
        let schema = openapi_schema(&cluster_policy_crd());
        let policy = |spec: Value| {
            let mut base = json!({"operator": {}, "daemonsets": {}, "driver": {}, "toolkit": {}, "devicePlugin": {},
                                  "dcgmExporter": {}, "dcgm": {}, "nodeStatusExporter": {}, "gfd": {}});
            for (key, value) in spec.as_object().unwrap() {
                base[key] = value.clone();
            }
            json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": base})
        };
        let paths = |object: &Value| -> Vec<String> {
            schema::check_rules(&schema, object, None)
                .into_iter()
                .map(|e| e.path)
                .collect()
        };
        let rolling = "spec.daemonsets.rollingUpdate.maxUnavailable";
        for bad in ["0", "0%", "101%", "-1", "1.5", "x"] {
            let object = policy(json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": bad}}}));
            assert_eq!(paths(&object), [rolling], "{bad:?} must be refused");
        }
        for good in ["1", "10", "1%", "100%"] {
            let object = policy(json!({"daemonsets": {"rollingUpdate": {"maxUnavailable": good}}}));
            assert_eq!(paths(&object), Vec::<String>::new(), "{good:?} must be accepted");
        }
        let upgrade = "spec.driver.upgradePolicy.maxUnavailable";
        for bad in [json!("3"), json!("101%"), json!(-1)] {
            let object = policy(json!({"driver": {"upgradePolicy": {"maxUnavailable": bad}}}));
            assert_eq!(paths(&object), [upgrade], "{bad} must be refused");
        }
        for good in [json!("25%"), json!("0%"), json!(0), json!(3)] {
            let object = policy(json!({"driver": {"upgradePolicy": {"maxUnavailable": good}}}));
            assert_eq!(paths(&object), Vec::<String>::new(), "{good} must be accepted");
        }
        let nri = policy(json!({"cdi": {"enabled": false, "nriPluginEnabled": true}}));
        assert_eq!(paths(&nri), ["spec.cdi.nriPluginEnabled"]);
        let nri = policy(json!({"cdi": {"nriPluginEnabled": true}, "toolkit": {"enabled": false}}));
        assert_eq!(paths(&nri), ["spec.cdi.nriPluginEnabled"]);
        assert_eq!(
            paths(&policy(json!({"cdi": {"nriPluginEnabled": true}}))),
            Vec::<String>::new()
        );

        let schema = openapi_schema(&nvidia_driver_crd());
        let driver = |spec: Value| json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": "d"}, "spec": spec});
        let default_with_selector =
            driver(json!({"default": true, "driverType": "gpu", "image": "d", "nodeSelector": {"a": "b"}}));
        let errors = schema::check_rules(&schema, &default_with_selector, None);
        assert_eq!(
            errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.nodeSelector: default NVIDIADriver must not use nodeSelector"]
        );
        let old = driver(json!({"default": false, "driverType": "gpu", "image": "d"}));
        let changed = driver(json!({"default": false, "driverType": "vgpu", "image": "d"}));
        let errors = schema::check_rules(&schema, &changed, Some(&old));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "spec.driverType");
    }

    #[test]
    fn required_sections_are_nvidias() {
        let schema = openapi_schema(&cluster_policy_crd());
        let required = &schema["properties"]["spec"]["required"];
        assert_eq!(
            required,
            &json!([
                "daemonsets",
                "dcgm",
                "dcgmExporter",
                "devicePlugin",
                "driver",
                "gfd",
                "nodeStatusExporter",
                "operator",
                "toolkit"
            ])
        );
        let driver = openapi_schema(&nvidia_driver_crd());
        assert_eq!(
            driver["properties"]["spec"]["required"],
            json!(["default", "driverType", "image"])
        );
    }

    #[test]
    fn status_conditions_have_the_limits_of_a_metav1_condition() {
        let schema = openapi_schema(&cluster_policy_crd());
        let policy = |message: String, reason: &str| {
            serde_json::json!({
                "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                "metadata": {"name": "cluster-policy"},
                "spec": {},
                "status": {"state": "notReady", "conditions": [{
                    "type": "Ready", "status": "False", "reason": reason, "message": message,
                    "lastTransitionTime": "2026-12-01T00:00:00Z"
                }]}
            })
        };
        let problems = |object: &Value| -> Vec<String> {
            schema::validate(&schema, object)
                .iter()
                .map(ToString::to_string)
                .filter(|problem| problem.starts_with("status."))
                .collect()
        };
        let longest = "é".repeat(crate::status::CONDITION_MESSAGE_MAX);
        let accepted = problems(&policy(longest.clone(), "OperandNotReady"));
        assert!(accepted.is_empty(), "{accepted:?}");
        let refused = problems(&policy(format!("{longest}x"), "OperandNotReady"));
        assert!(
            refused.iter().any(|p| p.contains("status.conditions[0].message")),
            "{refused:?}"
        );
        let refused = problems(&policy(String::new(), "not a reason"));
        assert!(
            refused.iter().any(|p| p.contains("status.conditions[0].reason")),
            "{refused:?}"
        );
    }
}
