//! The GPU operator: reconciles `ClusterPolicy` and `NVIDIADriver` objects into operands on GPU nodes.
//!
//! The `gpu-operator` binary is a thin wrapper around [`cli`]; each subcommand lives in its own module.

pub mod check;
pub mod cli;
