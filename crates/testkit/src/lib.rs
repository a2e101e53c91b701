//! What the project's tests share, so that one test body runs on the fake API server and on a real
//! Kubernetes control plane alike:
//!
//! - [`control_plane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler started from a
//!   directory of upstream binaries (named by [`control_plane::BINARIES_VAR`]) on free loopback ports, with
//!   RBAC, token authentication, service-account token signing and an audit log; stopped when dropped, also
//!   when a test panics;
//! - [`audit`]: that audit log read back as requests, to count a client's requests the way the API server
//!   saw them;
//! - [`ControlPlane::authorization_report`]: what its RBAC granted and refused, judged as the fake server
//!   reports it;
//! - [`nvidia`]: NVIDIA's GPU Operator, built from its source, run against a control plane as an oracle;
//! - [`backend`]: the fake server or the real control plane behind one type, and [`two_backends!`], which
//!   makes one test of each from a single body;
//! - [`fixture`]: builders of the nodes, pods, DaemonSets and other objects tests start from, so that no
//!   crate keeps its own copy.
//!
//! Everything but [`fixture`] is the default `control-plane` feature; a crate that needs only the builders
//! takes this crate with `default-features = false`.
//!
//! Tests on the real control plane are a named suite: their names end in `real_control_plane`, they are
//! `#[ignore]`d so that `cargo test` passes on a machine without the binaries, and they run with
//! `cargo test --workspace -- --ignored real_control_plane` where the binaries are (see the README).

#[cfg(feature = "control-plane")]
pub mod audit;
#[cfg(feature = "control-plane")]
mod authorization;
#[cfg(feature = "control-plane")]
pub mod backend;
#[cfg(feature = "control-plane")]
pub mod control_plane;
#[cfg(feature = "control-plane")]
mod error;
pub mod fixture;
#[cfg(feature = "control-plane")]
pub mod nvidia;

#[cfg(feature = "control-plane")]
pub use audit::{AuditEvent, AuditLog};
#[cfg(feature = "control-plane")]
pub use backend::{Backend, Received};
#[cfg(feature = "control-plane")]
pub use control_plane::{Binaries, ControlPlane};
#[cfg(feature = "control-plane")]
pub use error::Error;
#[cfg(feature = "control-plane")]
pub use nvidia::{NvidiaOperator, RunningNvidia};

/// The environment variable naming the directory of a control plane's binaries.
#[cfg(feature = "control-plane")]
pub const BINARIES_VAR: &str = "KUBE_BINARIES";
