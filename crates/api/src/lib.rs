//! The GPU operator's API: `ClusterPolicy` (`nvidia.com/v1`) and `NVIDIADriver` (`nvidia.com/v1alpha1`),
//! API-compatible with NVIDIA's GPU Operator; the defaults NVIDIA applies in code; validation that names
//! every problem at once; the operand catalogue; and the well-known label and annotation keys.
//!
//! This crate does no I/O.

pub mod catalogue;
pub mod choice;
pub mod cluster_policy;
pub mod component;
pub mod crd;
pub mod driver;
pub mod field;
pub mod image_section;
pub mod labels;
pub mod manifest;
pub mod nvidia_driver;
pub mod placement;
pub mod read;
pub mod rollout;
pub mod routing;
pub mod schema;
pub mod selector;
pub mod status;
pub mod upgrade;
pub mod validate;

pub use catalogue::{OPERANDS, Operand, OperandInfo};
pub use cluster_policy::{ClusterPolicy, ClusterPolicySpec};
pub use field::FieldError;
pub use image_section::ImageSection;
pub use nvidia_driver::{NVIDIADriver, NVIDIADriverSpec};
pub use routing::{DriverNodes, DriverRouting, RoutingProblem, route_nodes};
pub use status::{PolicyStatus, State};
pub use validate::{
    ImageDefaults, ValidatedDriver, ValidatedPolicy, validate, validate_driver, validate_driver_with,
    validate_with,
};
