//! The operator's Prometheus metrics. The `gpu_operator_*` series keep NVIDIA's names, types and value
//! conventions, so alerts written for NVIDIA's operator keep working; per-operand node counts are added.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// `gpu_operator_reconciliation_status` values, as NVIDIA defines them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i64)]
pub enum ReconciliationStatus {
    /// Everything is ready.
    Success = 1,
    /// Operands are not ready yet.
    NotReady = 0,
    /// No usable ClusterPolicy (absent, ignored or invalid).
    PolicyUnavailable = -1,
    /// The operator failed (API errors).
    OperatorError = -2,
}

/// All metrics of one operator process.
#[derive(Debug, Default)]
pub struct Metrics {
    gpu_nodes_total: AtomicI64,
    reconciliation_status: AtomicI64,
    reconciliation_total: AtomicU64,
    reconciliation_failed_total: AtomicU64,
    reconciliation_has_nfd_labels: AtomicI64,
    reconciliation_last_success_ts_seconds: AtomicI64,
    driver_auto_upgrade_enabled: AtomicI64,
    leader: AtomicI64,
    upgrades: Mutex<gpuop_api::upgrade::UpgradeCounts>,
    operands: Mutex<BTreeMap<String, (i64, i64)>>,
    work: WorkCounters,
}

/// How much work the controllers did, counted where it is done: what the scale tests and benchmarks read
/// to tell whether the operator's cost follows what changed or the cluster's size.
#[derive(Debug, Default)]
struct WorkCounters {
    policy_passes: AtomicU64,
    upgrade_passes: AtomicU64,
    nodes_judged: AtomicU64,
    objects_rendered: AtomicU64,
}

/// A reading of the work counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Passes of the policy reconciler.
    pub policy_passes: u64,
    /// Passes of the upgrade controller.
    pub upgrade_passes: u64,
    /// Node judgements made: a node's facts or its placement against an operand's pod template derived
    /// anew (a judgement reused because nothing it reads changed is not counted).
    pub nodes_judged: u64,
    /// Objects rendered (each manifest of each render).
    pub objects_rendered: u64,
}

impl std::ops::Sub for Work {
    type Output = Work;

    fn sub(self, earlier: Work) -> Work {
        Work {
            policy_passes: self.policy_passes.saturating_sub(earlier.policy_passes),
            upgrade_passes: self.upgrade_passes.saturating_sub(earlier.upgrade_passes),
            nodes_judged: self.nodes_judged.saturating_sub(earlier.nodes_judged),
            objects_rendered: self.objects_rendered.saturating_sub(earlier.objects_rendered),
        }
    }
}

impl Metrics {
    /// Records the end of a reconcile pass.
    pub fn reconciled(&self, status: ReconciliationStatus, now_seconds: i64) {
        self.reconciliation_total.fetch_add(1, Ordering::Relaxed);
        self.reconciliation_status.store(status as i64, Ordering::Relaxed);
        match status {
            ReconciliationStatus::Success => self
                .reconciliation_last_success_ts_seconds
                .store(now_seconds, Ordering::Relaxed),
            ReconciliationStatus::OperatorError => {
                self.reconciliation_failed_total.fetch_add(1, Ordering::Relaxed);
            }
            ReconciliationStatus::NotReady | ReconciliationStatus::PolicyUnavailable => {}
        }
    }

    /// Records the node census.
    pub fn census(&self, gpu_nodes: usize, has_nfd_labels: bool) {
        self.gpu_nodes_total
            .store(i64::try_from(gpu_nodes).unwrap_or(i64::MAX), Ordering::Relaxed);
        self.reconciliation_has_nfd_labels
            .store(i64::from(has_nfd_labels), Ordering::Relaxed);
    }

    /// Records whether the operator upgrades drivers itself.
    pub fn auto_upgrade(&self, enabled: bool) {
        self.driver_auto_upgrade_enabled
            .store(i64::from(enabled), Ordering::Relaxed);
    }

    /// Records the driver upgrade counts, summed over every pool.
    pub fn upgrades(&self, counts: &gpuop_api::upgrade::UpgradeCounts) {
        *self
            .upgrades
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = counts.clone();
    }

    /// Records whether this replica leads.
    pub fn leader(&self, leading: bool) {
        self.leader.store(i64::from(leading), Ordering::Relaxed);
    }

    /// Records, per operand id, nodes expected and ready; operands not listed are dropped.
    pub fn operands(&self, counts: impl IntoIterator<Item = (String, i64, i64)>) {
        let counts = counts
            .into_iter()
            .map(|(id, expected, ready)| (id, (expected, ready)))
            .collect();
        *self
            .operands
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = counts;
    }

    /// Counts a pass of the policy reconciler.
    pub fn policy_pass(&self) {
        self.work.policy_passes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a pass of the upgrade controller.
    pub fn upgrade_pass(&self) {
        self.work.upgrade_passes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts node judgements made anew.
    pub fn nodes_judged(&self, count: usize) {
        self.work.nodes_judged.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Counts rendered objects.
    pub fn objects_rendered(&self, count: usize) {
        self.work
            .objects_rendered
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    /// The work counted so far.
    pub fn work(&self) -> Work {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Work {
            policy_passes: load(&self.work.policy_passes),
            upgrade_passes: load(&self.work.upgrade_passes),
            nodes_judged: load(&self.work.nodes_judged),
            objects_rendered: load(&self.work.objects_rendered),
        }
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // One series with its HELP and TYPE lines; `kind` is `gauge` or `counter`.
        let series = |out: &mut String, kind: &str, name: &str, help: &str, value: &dyn std::fmt::Display| {
            let _ = write!(
                out,
                "# HELP gpu_operator_{name} {help}\n# TYPE gpu_operator_{name} {kind}\ngpu_operator_{name} {value}\n"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: i64| {
            series(out, "gauge", name, help, &value);
        };
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            series(out, "counter", name, help, &value);
        };
        let load = |value: &AtomicI64| value.load(Ordering::Relaxed);
        let total = |value: &AtomicU64| value.load(Ordering::Relaxed);
        for (kind, name, help, value) in [
            (
                "gauge",
                "gpu_nodes_total",
                "Number of nodes with GPUs",
                load(&self.gpu_nodes_total).to_string(),
            ),
            (
                "gauge",
                "reconciliation_last_success_ts_seconds",
                "Timestamp (in seconds) of the last reconciliation loop success",
                load(&self.reconciliation_last_success_ts_seconds).to_string(),
            ),
            (
                "gauge",
                "reconciliation_status",
                "1 if the reconciliation is currently successful, 0 if the operands are not ready, -1 if the cluster policy is unavailable, -2 if an error occurred within the operator.",
                load(&self.reconciliation_status).to_string(),
            ),
            (
                "counter",
                "reconciliation_total",
                "Total number of reconciliation",
                total(&self.reconciliation_total).to_string(),
            ),
            (
                "counter",
                "reconciliation_failed_total",
                "Number of failed reconciliation",
                total(&self.reconciliation_failed_total).to_string(),
            ),
            (
                "gauge",
                "reconciliation_has_nfd_labels",
                "1 if NFD mandatory kernel labels have been found, 0 otherwise",
                load(&self.reconciliation_has_nfd_labels).to_string(),
            ),
            (
                "gauge",
                "driver_auto_upgrade_enabled",
                "1 if driver auto upgrade is enabled 0 if not",
                load(&self.driver_auto_upgrade_enabled).to_string(),
            ),
        ] {
            series(&mut out, kind, name, help, &value);
        }
        {
            let upgrades = self
                .upgrades
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone();
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for (name, help, value) in [
                (
                    "nodes_upgrades_pending",
                    "Total number of nodes on which the driver is waiting to be upgraded",
                    upgrades.pending,
                ),
                (
                    "nodes_upgrades_in_progress",
                    "Total number of nodes on which the driver is being upgraded, failed ones included",
                    upgrades.in_progress,
                ),
                (
                    "nodes_upgrades_done",
                    "Total number of nodes on which the driver is up to date",
                    upgrades.done,
                ),
                (
                    "nodes_upgrades_failed",
                    "Total number of nodes on which the driver upgrade failed",
                    upgrades.failed,
                ),
                (
                    "nodes_upgrades_available",
                    "Total number of nodes on which a driver upgrade may start now",
                    upgrades.available,
                ),
            ] {
                gauge(&mut out, name, help, count(value));
            }
        }
        gauge(
            &mut out,
            "leader",
            "1 if this replica holds the leader lease, 0 otherwise",
            load(&self.leader),
        );
        let work = self.work();
        for (name, help, value) in [
            (
                "work_policy_passes_total",
                "Passes of the policy reconciler",
                work.policy_passes,
            ),
            (
                "work_upgrade_passes_total",
                "Passes of the upgrade controller",
                work.upgrade_passes,
            ),
            (
                "work_nodes_judged_total",
                "Node facts and placements derived anew (reused judgements are not counted)",
                work.nodes_judged,
            ),
            (
                "work_objects_rendered_total",
                "Objects rendered",
                work.objects_rendered,
            ),
        ] {
            counter(&mut out, name, help, value);
        }
        let operands = self
            .operands
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (name, help, pick) in [
            ("operand_nodes_expected", "Nodes an operand should run on", 0),
            (
                "operand_nodes_ready",
                "Nodes where an operand runs and is ready",
                1,
            ),
        ] {
            let _ = write!(
                out,
                "# HELP gpu_operator_{name} {help}\n# TYPE gpu_operator_{name} gauge\n"
            );
            for (operand, (expected, ready)) in operands.iter() {
                let value = if pick == 0 { expected } else { ready };
                let _ = writeln!(out, "gpu_operator_{name}{{operand=\"{operand}\"}} {value}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, series: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(series) && !l.starts_with('#'))
            .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
    }

    #[test]
    fn series_keep_nvidias_names_and_values() {
        let metrics = Metrics::default();
        metrics.census(3, true);
        metrics.reconciled(ReconciliationStatus::NotReady, 100);
        metrics.reconciled(ReconciliationStatus::OperatorError, 110);
        metrics.reconciled(ReconciliationStatus::Success, 120);
        metrics.operands([("driver".to_owned(), 3, 2)]);
        let text = metrics.render();
        for (series, expected) in [
            ("gpu_operator_gpu_nodes_total", "gpu_operator_gpu_nodes_total 3"),
            (
                "gpu_operator_reconciliation_status",
                "gpu_operator_reconciliation_status 1",
            ),
            (
                "gpu_operator_reconciliation_total",
                "gpu_operator_reconciliation_total 3",
            ),
            (
                "gpu_operator_reconciliation_failed_total",
                "gpu_operator_reconciliation_failed_total 1",
            ),
            (
                "gpu_operator_reconciliation_last_success_ts_seconds",
                "gpu_operator_reconciliation_last_success_ts_seconds 120",
            ),
            (
                "gpu_operator_reconciliation_has_nfd_labels",
                "gpu_operator_reconciliation_has_nfd_labels 1",
            ),
            (
                "gpu_operator_operand_nodes_ready",
                "gpu_operator_operand_nodes_ready{operand=\"driver\"} 2",
            ),
        ] {
            assert_eq!(line(&text, series), expected);
        }
        assert!(text.contains("# TYPE gpu_operator_reconciliation_total counter"));
        metrics.reconciled(ReconciliationStatus::PolicyUnavailable, 130);
        assert_eq!(
            line(&metrics.render(), "gpu_operator_reconciliation_status"),
            "gpu_operator_reconciliation_status -1"
        );
    }
}
