//! Integration tests of the simulated cluster, one binary with a module per concern:
//! - `cluster`: `gpu-sim serve` as a child process, shared by the tests that drive it with real tools;
//! - `kubectl`: `gpu-sim serve` driven by the real kubectl;
//! - `helm`: a chart installed, upgraded and uninstalled with the real Helm, and the repository's chart installed;
//! - `install`: the repository's chart installed, upgraded and uninstalled with Helm on the RBAC-enforcing
//!   fake server and on a real control plane, the operator and the hooks running as the chart's
//!   ServiceAccounts, and the way out when the uninstall hook cannot run;
//! - `tools`: the pinned Helm from `target/tools/` (`scripts/tools.rs`, shared with the operator's tests);
//! - `rbac`: `gpu-sim serve --authorization rbac` driven by kubectl with admin and service-account tokens;
//! - `scenarios`: the simulator's actors on the fake API server, driven by hand-written objects and faults;
//! - `migrate`: taking over a cluster NVIDIA's operator converged, without restarting its operand pods;
//! - `operator`: the operator converging simulated clusters (controller-level tests of issue 5);
//! - `failures`: refused writes, resources the operator cannot list and policies that do not decode, each
//!   reported where users look while the rest keeps working;
//! - `labeller`: the node labeller when a node changes between its read and its write;
//! - `workloads`: GPU workloads, their disruption budgets and evictions, and scenario actions on objects;
//! - `upgrade`: the operator upgrading drivers node by node under running workloads, and NVIDIADriver pools;
//! - `scale`: in a converged 2,000-node cluster the operator's work follows what changed, not the cluster's
//!   size, and unrelated node churn wakes nothing;
//! - `chaos`: `gpu-sim chaos` on a few short seeds, two operator replicas under injected faults;
//! - `citizen`: the simulator on a real control plane, judged by its controllers (nodes stay Ready);
//! - `differential`: the fake server and kube-apiserver sent the same requests, their answers compared;
//! - `pods`: the cluster's pods as the tests list them;
//! - `oracle`: NVIDIA's operator and ours on real control planes with the same input, every object compared;
//! - `docs`: every console example in `README.md` and `docs/` run as written, its shown output checked.

#[path = "sim/chaos.rs"]
mod chaos;
#[path = "sim/citizen.rs"]
mod citizen;
#[path = "sim/cluster.rs"]
mod cluster;
#[path = "sim/differential.rs"]
mod differential;
#[path = "sim/docs.rs"]
mod docs;
#[path = "sim/failures.rs"]
mod failures;
#[path = "sim/helm.rs"]
mod helm;
#[path = "sim/install.rs"]
mod install;
#[path = "sim/kubectl.rs"]
mod kubectl;
#[path = "sim/labeller.rs"]
mod labeller;
#[path = "sim/migrate.rs"]
mod migrate;
#[path = "sim/operator.rs"]
mod operator;
#[path = "sim/oracle.rs"]
mod oracle;
#[path = "sim/pods.rs"]
mod pods;
#[path = "sim/rbac.rs"]
mod rbac;
#[path = "sim/scale.rs"]
mod scale;
#[path = "sim/scenarios.rs"]
mod scenarios;
#[path = "../../../scripts/tools.rs"]
mod tools;
#[path = "sim/upgrade.rs"]
mod upgrade;
#[path = "sim/workloads.rs"]
mod workloads;
