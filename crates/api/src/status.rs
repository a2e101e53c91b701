//! Status of `ClusterPolicy` and `NVIDIADriver`: NVIDIA's `state`, `namespace` and `Ready`/`Error`
//! condition pair, plus per-operand node counts that say which nodes are not ready and why the state is
//! what it is.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most node names listed per operand in `status.operands[].notReadyNodes`; the count is always exact.
pub const MAX_LISTED_NODES: usize = 20;

/// Condition type set when everything the policy asks for runs.
pub const CONDITION_READY: &str = "Ready";
/// Condition type set when reconciling failed.
pub const CONDITION_ERROR: &str = "Error";

/// Condition reasons, with NVIDIA's strings.
pub mod reason {
    /// Everything applied and ready.
    pub const RECONCILED: &str = "Reconciled";
    /// Reconciling failed (invalid policy, API errors).
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
    /// No node carries NFD labels.
    pub const NFD_LABELS_MISSING: &str = "NFDLabelsMissing";
    /// No node has a GPU.
    pub const NO_GPU_NODES: &str = "NoGPUNodes";
    /// Some operand is not ready on some node.
    pub const OPERAND_NOT_READY: &str = "OperandNotReady";
    /// An NVIDIADriver's driver is not ready.
    pub const DRIVER_NOT_READY: &str = "DriverNotReady";
    /// A prerequisite is missing.
    pub const PREREQUISITE_NOT_MET: &str = "PrerequisiteNotMet";
    /// Two NVIDIADrivers select the same node.
    pub const CONFLICTING_NODE_SELECTOR: &str = "ConflictingNodeSelector";
    /// The `Error` condition is false because all is well.
    pub const READY: &str = "Ready";
    /// The `Ready` condition is false because of an error.
    pub const ERROR: &str = "Error";
}

/// Overall state, with NVIDIA's strings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Everything the object asks for runs.
    Ready,
    /// Something it asks for does not run yet.
    #[default]
    NotReady,
    /// Another ClusterPolicy is the active one; this one is not acted on.
    Ignored,
    /// The object is switched off (an NVIDIADriver while `useNvidiaDriverCRD` is false).
    Disabled,
}

/// Status of a ClusterPolicy or NVIDIADriver.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// Overall state.
    pub state: State,
    /// Namespace the operator deploys operands into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The `Ready` and `Error` conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Per operand: on how many nodes it should run, on how many it is ready, and which are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operands: Option<Vec<OperandStatus>>,
}

/// The longest condition message the CRD accepts, in characters (`metav1.Condition`'s limit).
pub const CONDITION_MESSAGE_MAX: usize = 32768;

/// `metav1.Condition` with the limits kube-apiserver's own types and NVIDIA's CRDs declare, so that an API
/// server refuses what a real `metav1.Condition` could not hold.
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "The `Ready` and `Error` conditions.",
        "type": "array",
        "items": {
            "description": "One aspect of the object's state.",
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "When the condition last changed from one status to another.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "Human-readable details of the transition; may be empty.",
                    "type": "string",
                    "maxLength": CONDITION_MESSAGE_MAX
                },
                "observedGeneration": {
                    "description": "The `metadata.generation` the condition was set for.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "Why the condition last changed, in CamelCase.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "type": {
                    "description": "The condition's type, e.g. `Ready`.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}

/// Readiness of one operand across the nodes that should run it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperandStatus {
    /// Operand id, e.g. `device-plugin`.
    pub name: String,
    /// Nodes that should run it.
    pub expected: i32,
    /// Nodes where it runs and is ready.
    pub ready: i32,
    /// Some nodes where it should run and is not ready, at most 20; `expected - ready` is the full count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_nodes: Option<Vec<String>>,
    /// Nodes with GPUs that the operand's pods cannot go to (for example an untolerated taint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded_nodes: Option<Vec<String>>,
}
