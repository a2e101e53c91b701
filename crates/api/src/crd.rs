//! The CustomResourceDefinitions of `ClusterPolicy` and `NVIDIADriver`, generated from the Rust types.
//!
//! What the types derive is adjusted in one place, here, to match NVIDIA's CRDs: optional fields are not
//! `nullable` (the API server then drops a `null` instead of storing it, as it does with NVIDIA's CRD).
//! The generated YAML is committed under `deploy/crds/`; a test fails when it is stale.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

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
    drop_nullable(&mut value);
    serde_json::from_value(value).expect("removing `nullable` keeps a valid CRD")
}

fn drop_nullable(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("nullable") == Some(&Value::Bool(true)) {
                map.remove("nullable");
            }
            map.values_mut().for_each(drop_nullable);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nullable),
        _ => {}
    }
}
