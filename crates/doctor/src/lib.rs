//! `kubectl gpu`: the GPU operator's doctor. It answers, from outside the operator, whether every operand
//! that should run on every node really runs, whether any node's order is broken (a device plugin up while
//! the container toolkit is not), why a pod cannot get its GPU, and what a driver upgrade would do now
//! ([`upgrade_plan`]).
//!
//! The analysis is pure: a [`snapshot::Snapshot`] in, a [`report::Report`] out ([`analysis::analyze`]),
//! or an [`explain::Explanation`] for one pod. Snapshots come from files of `kubectl get -o json|yaml`
//! output ([`load`]) or from a live cluster ([`live`]). [`bundle`] writes a support bundle (the snapshot, the
//! report, Events and bounded logs in one tar.gz that `--snapshot` reads back). The `kubectl-gpu` binary is a
//! thin wrapper around [`cli`].

pub mod analysis;
pub mod bench;
pub mod bundle;
pub mod cli;
pub mod completion;
mod contract;
pub mod explain;
pub mod fixture;
pub mod live;
pub mod load;
mod node_view;
pub mod pod_state;
pub mod report;
pub mod resources;
pub mod snapshot;
pub mod table;
pub mod upgrade_plan;

pub use analysis::analyze;
pub use report::Report;
pub use snapshot::Snapshot;
