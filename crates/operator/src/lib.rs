//! The GPU operator: reconciles `ClusterPolicy` objects into operands on GPU nodes.
//!
//! The modules in layers; a module imports only from its own layer and those above it, so one pass reads top
//! to bottom (docs/operator.md, "How one pass flows"):
//!
//! - **Shared types and handles**: [`projection`] (what is kept of nodes and pods), [`changes`] (what
//!   changed in them), [`lease`] and [`api_client`] (leader election; every request bounded in time, every
//!   write gated on leadership), [`retry`] (what a failed request means for the next try), [`unconfirmed`]
//!   (writes the caches do not show yet), [`metrics`].
//! - **Pure decisions**: [`labeler`] (node labels), [`facts`] (cluster facts for rendering), [`handoff`]
//!   (what the policy reconciler decides for the other two controllers), [`drivers`] (the NVIDIADrivers'
//!   routing and renders), [`index`] and [`readiness`] (which nodes should run and do run each operand),
//!   [`status`] (the policy status), [`drift::drift`] (whether another writer changed a managed object),
//!   [`apply::plan`] (what to write and prune); the upgrade decision itself is
//!   `gpuop_api::upgrade::decide`.
//! - **Effects**: [`apply`] (server-side apply, prune, drift repairs and their events), [`pod_security`]
//!   (the namespace's Pod Security labels), [`report`] (every status and its event).
//! - **Observation**: [`caches`] (the reflectors, and who is woken by what changed).
//! - **What the controllers share**: [`context`].
//! - **The controllers**, which never import each other: [`controller`] (the policy reconciler),
//!   [`label_queue`] (the node labeller), [`upgrade`] (the driver upgrade controller); [`run`] wires them
//!   with the metrics and health endpoints.
//!
//! Commands: [`diff_live`] (what taking over a cluster would change, `render --diff-live`), and those that
//! install and remove the operator's footprint, [`crd_install`] (`crd --apply`) and [`uninstall`].
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
pub mod report;
pub mod retry;
pub mod run;
pub mod status;
pub mod trimmed;
pub mod unconfirmed;
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
    use std::collections::{BTreeMap, BTreeSet};

    /// The crate's modules (one per file under `src/`) and the other modules each one's non-test code
    /// names (`crate::<module>`), its tests (after the file's first `#[cfg(test)]` at column 0) left out.
    fn imports() -> BTreeMap<String, BTreeSet<String>> {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let modules: BTreeMap<String, String> = std::fs::read_dir(&src)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
            .map(|path| {
                let name = path.file_stem().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&path).unwrap())
            })
            .collect();
        modules
            .iter()
            .map(|(name, source)| {
                let code: String = source
                    .lines()
                    .take_while(|line| !line.starts_with("#[cfg(test)]"))
                    .filter(|line| !line.trim_start().starts_with("//"))
                    .collect::<Vec<_>>()
                    .join("\n");
                let named = modules
                    .keys()
                    .filter(|other| *other != name)
                    .filter(|other| {
                        code.match_indices(&format!("crate::{other}")).any(|(at, found)| {
                            !code[at + found.len()..].starts_with(|c: char| c == '_' || c.is_alphanumeric())
                        }) || code.contains(&format!("crate::{{{other}"))
                            || code.contains(&format!("crate::{{self, {other}"))
                    })
                    .cloned()
                    .collect();
                (name.clone(), named)
            })
            .collect()
    }

    #[test]
    fn no_module_imports_one_that_imports_it_back() {
        let imports = imports();
        assert!(imports.len() > 30, "{} modules found", imports.len());
        assert!(
            imports["run"].contains("controller"),
            "the scan sees imports: {:?}",
            imports["run"]
        );
        // Depth-first from each module: a path back to it is a circle.
        for start in imports.keys() {
            let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
            let mut seen = BTreeSet::new();
            while let Some(path) = stack.pop() {
                let last = *path.last().unwrap();
                for next in imports.get(last).into_iter().flatten() {
                    assert!(
                        next != start,
                        "an import circle: {} -> {start}",
                        path.join(" -> ")
                    );
                    if seen.insert(next.as_str()) {
                        let mut longer = path.clone();
                        longer.push(next);
                        stack.push(longer);
                    }
                }
            }
        }
    }

    #[test]
    fn the_steady_state_window_outlasts_every_retry_and_trust_window() {
        let windows = [
            ("in-flight trust", crate::unconfirmed::IN_FLIGHT),
            ("status interval", crate::report::STATUS_INTERVAL),
            ("idle upgrade pass", crate::upgrade::IDLE_PASS_INTERVAL),
            ("lease retry", crate::lease::Timing::default().retry_period),
        ];
        for (name, window) in windows {
            assert!(super::STEADY_STATE_WINDOW > window, "{name}: {window:?}");
        }
    }
}
