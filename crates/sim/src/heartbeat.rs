//! The kubelets' heartbeats, which keep nodes alive in a real cluster's node lifecycle controller: a Lease
//! per node in `kube-node-lease` renewed every `leaseDurationSeconds / 4` (10 s of 40 s), and the node's
//! status, conditions with their `lastHeartbeatTime`, reported every `nodeStatusReportFrequency` (5 min)
//! when nothing changed. Those are kubelet's defaults with the `NodeLease` heartbeat: the lifecycle
//! controller takes a node's last sign of life from its Lease's `renewTime` or from its Ready condition's
//! `lastHeartbeatTime`, whichever is later, and marks the node `Unknown` and taints it unreachable once
//! that is older than its grace period (`--node-monitor-grace-period`, 50 s).
//!
//! Renewals are spread, not made together: every node has a fixed phase within the renewal interval, one
//! of [`SLOTS`], chosen by a hash of its name, so that 5,000 nodes renew about 100 at a time fifty times
//! every 10 s instead of 5,000 at once. The schedule here is pure: it says which nodes are due at a time
//! and when to look again; the kubelets' actor makes the writes, through a `Pipeline`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

/// How often, and for how long, simulated kubelets give signs of life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeats {
    /// `spec.leaseDurationSeconds` of each node's Lease.
    pub lease_duration: Duration,
    /// How often a node's Lease is renewed (`spec.renewTime`).
    pub renew_every: Duration,
    /// How often the node's status is reported when nothing changed (its conditions'
    /// `lastHeartbeatTime`).
    pub report_every: Duration,
}

impl Heartbeats {
    /// Kubelet's defaults: a 40 s Lease renewed every 10 s (a quarter of its duration), status reported
    /// every 5 min (`nodeStatusReportFrequency`).
    pub fn kubelet() -> Self {
        Self {
            lease_duration: Duration::from_secs(40),
            renew_every: Duration::from_secs(10),
            report_every: Duration::from_secs(300),
        }
    }
}

/// The namespace kubelets keep their Leases in.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// How many phases renewals are spread over within one interval.
pub const SLOTS: u32 = 50;

/// What is due at one look.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// Nodes whose Lease is to be renewed (or created) now.
    pub renew: Vec<String>,
    /// Nodes whose status is to be reported now.
    pub report: Vec<String>,
    /// When something is next due (time since the schedule started); `None` with no nodes.
    pub next: Option<Duration>,
}

/// When each node's kubelet next renews its Lease and reports its status. Times are durations since the
/// schedule started, so the schedule is tested without a clock.
#[derive(Clone, Debug)]
pub struct Schedule {
    heartbeats: Heartbeats,
    renew_at: BTreeMap<String, Duration>,
    report_at: BTreeMap<String, Duration>,
}

impl Schedule {
    /// An empty schedule.
    pub fn new(heartbeats: Heartbeats) -> Self {
        Self {
            heartbeats,
            renew_at: BTreeMap::new(),
            report_at: BTreeMap::new(),
        }
    }

    /// What is due at `now` for `nodes`, the nodes whose kubelets run: a node new to the schedule renews
    /// and reports at its first phase from now on (a kubelet that starts creates its Lease and reports
    /// its status at once); a node gone from `nodes` is forgotten.
    pub fn due(&mut self, nodes: &BTreeSet<String>, now: Duration) -> Due {
        self.renew_at.retain(|node, _| nodes.contains(node));
        self.report_at.retain(|node, _| nodes.contains(node));
        let renew_every = self.heartbeats.renew_every.max(Duration::from_millis(1));
        let report_every = self.heartbeats.report_every.max(Duration::from_millis(1));
        let mut due = Due::default();
        for node in nodes {
            let phase = phase(node, renew_every);
            let first = next_at(phase, renew_every, now);
            let mut renew_at = self.renew_at.get(node).copied().unwrap_or(first);
            if renew_at <= now {
                due.renew.push(node.clone());
                // A look that came late does not bunch renewals up: the next one keeps the node's phase.
                renew_at = next_at(phase, renew_every, now + Duration::from_nanos(1));
            }
            let mut report_at = self.report_at.get(node).copied().unwrap_or(first);
            if report_at <= now {
                due.report.push(node.clone());
                report_at = next_at(phase, renew_every, now + report_every);
            }
            // Only a node seen for the first time or just due changes its entry.
            if self.renew_at.get(node) != Some(&renew_at) {
                self.renew_at.insert(node.clone(), renew_at);
            }
            if self.report_at.get(node) != Some(&report_at) {
                self.report_at.insert(node.clone(), report_at);
            }
            let soonest = renew_at.min(report_at);
            due.next = Some(due.next.map_or(soonest, |next| next.min(soonest)));
        }
        due
    }
}

/// Heartbeat writes that are due, sent in the order they fell due, at most `cap` at once, each holding back
/// only its own node: a batch that waits for its slowest write before the next look let the Leases of the
/// first nodes expire while 1,000 nodes joined on a busy two-core machine (their renewals came every 30 to
/// 60 s instead of 10). A node already waiting or in flight is not queued again.
pub(crate) struct Pipeline<T> {
    cap: usize,
    queue: VecDeque<String>,
    waiting: BTreeSet<String>,
    in_flight: FuturesUnordered<BoxFuture<'static, (String, T)>>,
}

impl<T: Send + 'static> Pipeline<T> {
    /// An empty pipeline of at most `cap` writes in flight (at least one).
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            queue: VecDeque::new(),
            waiting: BTreeSet::new(),
            in_flight: FuturesUnordered::new(),
        }
    }

    /// Queues the nodes due now, but those already waiting or in flight.
    pub(crate) fn queue(&mut self, due: impl IntoIterator<Item = String>) {
        for node in due {
            if self.waiting.insert(node.clone()) {
                self.queue.push_back(node);
            }
        }
    }

    /// Starts queued writes, oldest first, while fewer than `cap` are in flight; `write` makes a node's
    /// write, or gives `None` for a node that is gone.
    pub(crate) fn start(&mut self, mut write: impl FnMut(&str) -> Option<BoxFuture<'static, T>>) {
        while self.in_flight.len() < self.cap {
            let Some(node) = self.queue.pop_front() else {
                break;
            };
            match write(&node) {
                Some(write) => self.in_flight.push(Box::pin(async move { (node, write.await) })),
                None => {
                    self.waiting.remove(&node);
                }
            }
        }
    }

    /// The next write to finish, with its node; pending while none is in flight.
    pub(crate) async fn finished(&mut self) -> (String, T) {
        match self.in_flight.next().await {
            Some((node, outcome)) => {
                self.waiting.remove(&node);
                (node, outcome)
            }
            None => std::future::pending().await,
        }
    }
}

/// A node's phase within the renewal interval: one of [`SLOTS`] evenly spaced, chosen by a hash of its name
/// (FNV-1a), so that renewals spread over the interval and a node keeps its phase however the cluster
/// changes around it.
fn phase(node: &str, interval: Duration) -> Duration {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let slot = u32::try_from(hash % u64::from(SLOTS)).unwrap_or(0);
    interval / SLOTS * slot
}

/// The first time at or after `from` that falls on `phase` within every `interval`.
fn next_at(phase: Duration, interval: Duration, from: Duration) -> Duration {
    if from <= phase {
        return phase;
    }
    let interval_nanos = interval.as_nanos().max(1);
    let periods = (from - phase).as_nanos().div_ceil(interval_nanos);
    let offset = u64::try_from(periods.saturating_mul(interval_nanos)).unwrap_or(u64::MAX);
    phase.saturating_add(Duration::from_nanos(offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(count: usize) -> BTreeSet<String> {
        (0..count).map(|i| format!("h100-{i}")).collect()
    }

    fn every_second(seconds: u64) -> Heartbeats {
        Heartbeats {
            lease_duration: Duration::from_secs(4 * seconds),
            renew_every: Duration::from_secs(seconds),
            report_every: Duration::from_secs(30 * seconds),
        }
    }

    /// Steps the schedule from 0 to `until`, looking each time it asks to; counts renewals and reports
    /// per node and the largest batch.
    fn run(
        schedule: &mut Schedule,
        nodes: &BTreeSet<String>,
        until: Duration,
    ) -> (BTreeMap<String, usize>, BTreeMap<String, usize>, usize) {
        let mut renewals = BTreeMap::new();
        let mut reports = BTreeMap::new();
        let mut largest = 0;
        let mut now = Duration::ZERO;
        while now < until {
            let due = schedule.due(nodes, now);
            largest = largest.max(due.renew.len());
            for node in due.renew {
                *renewals.entry(node).or_insert(0) += 1;
            }
            for node in due.report {
                *reports.entry(node).or_insert(0) += 1;
            }
            let next = due.next.expect("nodes have a next time");
            assert!(next > now, "the schedule moves on: {next:?} after {now:?}");
            now = next;
        }
        (renewals, reports, largest)
    }

    #[test]
    fn every_node_renews_once_per_interval_and_reports_at_its_own_cadence() {
        let cluster = nodes(40);
        let mut schedule = Schedule::new(every_second(10));
        let (renewals, reports, _) = run(&mut schedule, &cluster, Duration::from_secs(600));
        assert_eq!(renewals.len(), 40);
        assert!(
            renewals.values().all(|n| *n == 60),
            "600 s of 10 s renewals: {:?}",
            renewals.values().collect::<BTreeSet<_>>()
        );
        assert!(
            reports.values().all(|n| *n == 2),
            "a report at start, then every 300 s: {:?}",
            reports.values().collect::<BTreeSet<_>>()
        );
    }

    #[test]
    fn renewals_are_spread_over_the_interval_not_made_together() {
        let cluster = nodes(2_000);
        let mut schedule = Schedule::new(Heartbeats::kubelet());
        let (renewals, _, largest) = run(&mut schedule, &cluster, Duration::from_secs(10));
        assert_eq!(
            renewals.len(),
            2_000,
            "every node renews within the first interval"
        );
        let even = 2_000 / SLOTS as usize;
        assert!(
            largest < even * 2,
            "the largest batch of renewals ({largest}) is near an even share ({even}), not the cluster"
        );
    }

    #[test]
    fn a_node_joins_at_its_phase_and_a_node_that_goes_is_forgotten() {
        let mut schedule = Schedule::new(every_second(10));
        let mut cluster = nodes(3);
        let first = schedule.due(&cluster, Duration::ZERO);
        assert!(first.next.is_some_and(|next| next <= Duration::from_secs(10)));
        cluster.insert("late-0".to_owned());
        let later = Duration::from_secs(35);
        let due = schedule.due(&cluster, later);
        assert!(
            due.next
                .is_some_and(|next| next <= later + Duration::from_secs(10)),
            "a joining node renews within one interval"
        );
        cluster.clear();
        assert_eq!(schedule.due(&cluster, later), Due::default());
    }

    #[test]
    fn next_at_keeps_the_phase() {
        let interval = Duration::from_secs(10);
        let phase = Duration::from_secs(3);
        assert_eq!(next_at(phase, interval, Duration::ZERO), phase);
        assert_eq!(next_at(phase, interval, Duration::from_secs(3)), phase);
        assert_eq!(
            next_at(phase, interval, Duration::from_millis(3_001)),
            Duration::from_secs(13)
        );
        assert_eq!(
            next_at(phase, interval, Duration::from_secs(27)),
            Duration::from_secs(33)
        );
    }

    /// A write that hangs holds back only its own node: the others are written, and finish, behind it;
    /// never more than the cap at once; a node queued twice is written once.
    #[tokio::test]
    async fn a_slow_write_holds_back_only_its_own_node() {
        let mut pipeline: Pipeline<&'static str> = Pipeline::new(2);
        let (release, hung) = tokio::sync::oneshot::channel::<()>();
        let mut hung = Some(hung);
        let mut started = Vec::new();
        pipeline.queue(["slow", "a", "b", "a", "c"].map(str::to_owned));
        let mut finished = Vec::new();
        loop {
            pipeline.start(|node| {
                started.push(node.to_owned());
                if node == "slow" {
                    let hung = hung.take().expect("the slow node is written once");
                    Some(Box::pin(async move {
                        let _ = hung.await;
                        "slow"
                    }))
                } else {
                    Some(Box::pin(async { "fast" }))
                }
            });
            assert!(pipeline.in_flight.len() <= 2, "at most the cap in flight");
            if finished.len() == 3 {
                break;
            }
            let (node, _) = pipeline.finished().await;
            finished.push(node);
        }
        assert_eq!(started, ["slow", "a", "b", "c"], "in order, each once");
        assert_eq!(finished, ["a", "b", "c"], "written while the slow one hangs");
        pipeline.queue(["slow".to_owned()]);
        assert!(pipeline.queue.is_empty(), "a node in flight is not queued again");
        release.send(()).expect("the slow write waits");
        assert_eq!(pipeline.finished().await, ("slow".to_owned(), "slow"));
        pipeline.queue(["slow".to_owned()]);
        assert_eq!(pipeline.queue.len(), 1, "once answered, it can be due again");
    }
}
