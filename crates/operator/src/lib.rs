//! The GPU operator: reconciles `ClusterPolicy` objects into operands on GPU nodes.
//!
//! Pure decisions: [`labeler`] (node labels), [`facts`] (cluster facts for rendering), [`readiness`] (which
//! nodes should run and do run each operand), [`status`] (the policy status), [`apply::plan`] (what to
//! write and prune), [`drift::drift`] (whether another writer changed a managed object; [`drift::report`]
//! is its I/O, the events that say so), [`diff_live`] (what
//! taking over a cluster would change); the upgrade decision itself is `gpuop_api::upgrade::decide`. Thin
//! I/O around them: [`caches`] (reflectors), [`controller`] (the policy reconciler), [`label_queue`] (the
//! node labeller's work queue), [`pod_security`] (the namespace's Pod Security labels), [`upgrade`] (the
//! driver upgrade controller), [`lease`] (leader election), [`api_client`] (every request bounded in time,
//! every write gated on leadership), [`run`] (process wiring, metrics and health endpoints). Commands that
//! install and remove the operator's footprint:
//! [`crd_install`] (`crd --apply`) and [`uninstall`].
//! The `gpu-operator` binary is a thin wrapper around [`cli`].

pub mod api_client;
pub mod apply;
pub mod caches;
pub mod changes;
pub mod check;
pub mod cli;
pub mod context;
pub mod controller;
pub mod crd_install;
pub mod diff_live;
pub mod drift;
pub mod drivers;
pub mod facts;
pub mod gulps;
pub mod handoff;
pub mod index;
pub mod label_queue;
pub mod labeler;
pub mod lease;
pub mod metrics;
pub mod pod_security;
pub mod projection;
pub mod readiness;
pub mod render_command;
pub mod run;
pub mod status;
pub mod trimmed;
pub mod uninstall;
pub mod upgrade;

/// The operator's `User-Agent`. Its product token is this project's alone: NVIDIA's operator sends
/// `gpu-operator/<version>`, so audit logs and request metrics can tell the two apart when both run.
pub const USER_AGENT: &str = concat!("gpu-operator-rs/", env!("CARGO_PKG_VERSION"));

/// Longer than every window in which the operator, with nothing changing, may still act by itself: a write
/// the caches have not shown yet is trusted for 10 s and then made again, status writes that change only
/// counts wait 1 s, and idle passes run every second. A check that the operator "writes nothing" in a
/// steady state must watch at least this long, or it cannot see a write it would repeat.
pub const STEADY_STATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(12);

#[cfg(test)]
mod tests {
    #[test]
    fn the_steady_state_window_outlasts_every_retry_and_trust_window() {
        let windows = [
            ("in-flight trust", crate::context::IN_FLIGHT),
            ("status interval", crate::controller::STATUS_INTERVAL),
            ("idle upgrade pass", crate::upgrade::IDLE_PASS_INTERVAL),
            ("lease retry", crate::lease::Timing::default().retry_period),
        ];
        for (name, window) in windows {
            assert!(super::STEADY_STATE_WINDOW > window, "{name}: {window:?}");
        }
    }
}
