//! The node labeller as a work queue: which node to label next, how many at once, and when to look again.
//!
//! Keys are node names. The queue ([`WorkQueue`]) is pure (no clock of its own, no I/O) and keeps these
//! invariants:
//! - **Deduplicated.** A node queued twice is processed once. A node that changes while it is being
//!   processed is processed again after that, never concurrently with itself.
//! - **Bounded.** At most [`WORKERS`] nodes are processed at once, whatever the cluster's size.
//! - **Per-node back-off.** A node whose write failed waits [`BACKOFF_BASE`], doubling per failure up to
//!   [`BACKOFF_CAP`] (spread by up to a quarter so that nodes failing together do not retry together), and
//!   at least as long as a 429's `Retry-After`. Changes to it meanwhile do not cut the wait short: the retry
//!   reads the node as it is then. A success forgets its failures.
//! - **Looked at again when a write's trust ends.** The operator's node cache shows its own patch some
//!   time after the API server accepted it; until then ([`IN_FLIGHT`]) a patch the cache does not show yet
//!   is trusted rather than sent again, and the node is queued for the moment that trust ends.
//!
//! The decision for one node ([`decide`]) is pure too. The I/O around them ([`run_labeller`]) re-queues
//! every node when the policy's labelling inputs change, when this replica becomes the leader, and after
//! the node cache relisted (judged against the new list, see [`NodeEvent::Relisted`]); each write carries
//! the `resourceVersion` it was computed from, so a label a person set between the read and the write makes
//! the API server answer 409 instead of the operator overwriting it. A 409 is retried at once on the node as
//! a GET returns it, the patch recomputed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use gpuop_api::read::Labels;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::caches::{NodeEvent, lock};
use crate::context::Context;
use crate::labeler::{DesiredPatches, LabelPolicy, NodePatch};
use crate::projection::{NodeRecord, WatchedNode};
use crate::retry::{self, Backoff, Retry};
use crate::unconfirmed::{IN_FLIGHT, Unconfirmed, now};

/// Nodes labelled at once. A label patch is one small write; a handful in flight keep a node watch's
/// worth of work moving while leaving the API server's other clients their share (the labeller used to
/// send one chain of patches per 16 nodes, all at once: 625 concurrent at 10,000 nodes).
pub const WORKERS: usize = 16;
/// The first retry of a failed node waits this long.
pub const BACKOFF_BASE: Duration = Duration::from_millis(200);
/// The longest wait between two tries of one node.
pub const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// How the labeller backs off a node whose write failed.
const BACKOFF: Backoff = Backoff {
    base: BACKOFF_BASE,
    cap: BACKOFF_CAP,
};
/// Writes of one node tried at once, each after a 409 on the node as a GET returns it, before it backs off.
pub const CONFLICT_ATTEMPTS: usize = 3;

/// What became of processing one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing failed; look at the node again at `recheck_at` if set.
    Done {
        /// When a write's trust ends.
        recheck_at: Option<Instant>,
    },
    /// The node could not be labelled; try again after a back-off, and not before `retry_after` (a 429's
    /// `Retry-After`).
    Failed {
        /// The least wait the API server asked for.
        retry_after: Option<Duration>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// Queued to run at `at`.
    Waiting { at: Instant, backing_off: bool },
    /// Being processed; `again` is when a change that arrived meanwhile wants it processed next.
    Processing { again: Option<Instant> },
}

/// The labeller's queue of node names; see the module documentation for its invariants.
#[derive(Debug)]
pub struct WorkQueue {
    workers: usize,
    entries: HashMap<String, Entry>,
    /// Every waiting key by the time it is due; the first is the next to run.
    timers: BTreeSet<(Instant, String)>,
    failures: HashMap<String, u32>,
    in_flight: usize,
}

impl WorkQueue {
    /// An empty queue that hands out at most `workers` keys at once (at least one).
    pub fn new(workers: usize) -> Self {
        Self {
            workers: workers.max(1),
            entries: HashMap::new(),
            timers: BTreeSet::new(),
            failures: HashMap::new(),
            in_flight: 0,
        }
    }

    /// Queues `key` to be processed no later than `at`. An earlier time already queued wins, and so does a
    /// back-off in progress; a key being processed is processed again once it is done.
    pub fn add(&mut self, key: &str, at: Instant) {
        match self.entries.get_mut(key) {
            None => {
                self.entries.insert(
                    key.to_owned(),
                    Entry::Waiting {
                        at,
                        backing_off: false,
                    },
                );
                self.timers.insert((at, key.to_owned()));
            }
            Some(Entry::Waiting { at: due, backing_off }) => {
                if !*backing_off && at < *due {
                    self.timers.remove(&(*due, key.to_owned()));
                    self.timers.insert((at, key.to_owned()));
                    *due = at;
                }
            }
            Some(Entry::Processing { again }) => {
                *again = Some(again.map_or(at, |due| due.min(at)));
            }
        }
    }

    /// Queues every key for `at`.
    pub fn add_all<'a>(&mut self, keys: impl IntoIterator<Item = &'a str>, at: Instant) {
        for key in keys {
            self.add(key, at);
        }
    }

    /// The next key due by `now`, marked as being processed; `None` when nothing is due or every worker is
    /// busy. Each key handed out must be given back with [`done`](Self::done).
    pub fn next(&mut self, now: Instant) -> Option<String> {
        if self.in_flight >= self.workers {
            return None;
        }
        let (due, _) = self.timers.first()?;
        if *due > now {
            return None;
        }
        let (_, key) = self.timers.pop_first()?;
        self.entries
            .insert(key.clone(), Entry::Processing { again: None });
        self.in_flight += 1;
        Some(key)
    }

    /// Records how processing `key` ended at `now`, and queues it again if it has to be.
    pub fn done(&mut self, key: &str, outcome: Outcome, now: Instant) {
        let Some(Entry::Processing { again }) = self.entries.get(key).copied() else {
            return;
        };
        self.in_flight -= 1;
        let next = match outcome {
            Outcome::Done { recheck_at } => {
                self.failures.remove(key);
                match (again, recheck_at) {
                    (Some(a), Some(b)) => Some((a.min(b), false)),
                    (one, other) => one.or(other).map(|at| (at, false)),
                }
            }
            Outcome::Failed { retry_after } => {
                let failures = self.failures.entry(key.to_owned()).or_default();
                *failures = failures.saturating_add(1);
                let wait = BACKOFF.wait(key, *failures).max(retry_after.unwrap_or_default());
                Some((now + wait, true))
            }
        };
        match next {
            Some((at, backing_off)) => {
                self.entries
                    .insert(key.to_owned(), Entry::Waiting { at, backing_off });
                self.timers.insert((at, key.to_owned()));
            }
            None => {
                self.entries.remove(key);
            }
        }
    }

    /// When the next key falls due, if a worker is free to take it; the driver sleeps until then or until
    /// something changes.
    pub fn next_wake(&self) -> Option<Instant> {
        if self.in_flight >= self.workers {
            return None;
        }
        self.timers.first().map(|(at, _)| *at)
    }

    /// Forgets every waiting key and every failure (leadership lost: another replica labels now). Keys
    /// being processed still have to be given back.
    pub fn clear(&mut self) {
        self.timers.clear();
        self.failures.clear();
        self.entries.retain(|_, entry| match entry {
            Entry::Waiting { .. } => false,
            Entry::Processing { again } => {
                *again = None;
                true
            }
        });
    }

    /// Keys being processed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Keys waiting or being processed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key waits or is being processed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// When `key` is due, if it waits.
    pub fn due(&self, key: &str) -> Option<Instant> {
        match self.entries.get(key)? {
            Entry::Waiting { at, .. } => Some(*at),
            Entry::Processing { .. } => None,
        }
    }
}

/// The label patch this operator sent to a node and when, until the node cache shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The patch (one copy shared by every node it went to: [`Patches`]).
    pub patch: Arc<NodePatch>,
    /// When the API server accepted it.
    pub at: Instant,
}

impl Sent {
    /// Whether the node as cached carries every change of the patch.
    fn shown_by(&self, node: &NodeRecord) -> bool {
        self.patch
            .labels
            .iter()
            .all(|(k, v)| node.labels.get_label(k) == v.as_deref())
            && self
                .patch
                .annotations
                .iter()
                .all(|(k, v)| node.annotations.get_label(k) == v.as_deref())
    }
}

/// One copy of each patch the labeller keeps as sent: during a rollout every node is labelled within
/// seconds, the cache shows a patch only later, and the nodes of one kind get the same patch (the same
/// switches, the same record of what the operator owns). Patches no node keeps are dropped when the set
/// has doubled since the last sweep.
#[derive(Debug, Default)]
struct Patches {
    kept: std::collections::HashSet<Arc<NodePatch>>,
    swept_at: usize,
}

impl Patches {
    fn share(&mut self, patch: Arc<NodePatch>) -> Arc<NodePatch> {
        if let Some(kept) = self.kept.get(&patch) {
            return kept.clone();
        }
        if self.kept.len() >= 2 * self.swept_at.max(64) {
            self.kept.retain(|kept| Arc::strong_count(kept) > 1);
            self.swept_at = self.kept.len();
        }
        self.kept.insert(patch.clone());
        patch
    }
}

/// What to do about one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The node carries what it should.
    Nothing,
    /// The same patch was sent and the cache does not show it yet: trust it until then, and look again.
    Wait {
        /// When the trust ends.
        until: Instant,
    },
    /// Send this patch.
    Write(NodePatch),
}

/// Decides what to write to `node` at `now`, given the patch that gets it to the labels wanted
/// ([`crate::labeler::desired_labels`]) and the patch sent last and not yet shown by the cache.
pub fn decide(node: &NodeRecord, patch: NodePatch, sent: Option<&Sent>, now: Instant) -> Decision {
    if patch.is_empty() {
        return Decision::Nothing;
    }
    // The node may change again (its status, other labels) before the cache shows the last patch; the same
    // patch again would only repeat it. A different patch is a new decision and goes at once.
    if let Some(sent) = sent
        && *sent.patch == patch
        && !sent.shown_by(node)
    {
        let until = sent.at + IN_FLIGHT;
        if now < until {
            return Decision::Wait { until };
        }
    }
    Decision::Write(patch)
}

/// Runs the node labeller until `shutdown`: one patch per node whose labels differ from the desired ones,
/// at most [`WORKERS`] at once, only while this replica leads.
pub async fn run_labeller(
    context: Arc<Context>,
    mut node_events: mpsc::UnboundedReceiver<NodeEvent>,
    shutdown: CancellationToken,
) {
    if !context.caches.ready().await {
        return;
    }
    let mut labelling = context.labelling.subscribe();
    let mut leadership = context.leadership.clone();
    let mut leading = leadership.is_leader();
    let mut queue = WorkQueue::new(WORKERS);
    // Per node, the patch last sent that the cache did not show when the node was last processed.
    let mut unconfirmed: Unconfirmed<String, Arc<NodePatch>> = Unconfirmed::default();
    let mut patches = Patches::default();
    let desired = Arc::new(Mutex::new(DesiredPatches::default()));
    let mut working = FuturesUnordered::new();
    let all_nodes = |context: &Context| -> Vec<String> {
        context
            .caches
            .nodes
            .state()
            .iter()
            .map(|n| n.name.to_string())
            .collect()
    };
    if leading {
        queue.add_all(all_nodes(&context).iter().map(String::as_str), now());
    }
    loop {
        // `None` until the first reconcile decides the labelling inputs; nothing is labelled before.
        let policy = context.labelling.borrow().clone();
        if leading && let Some(policy) = &policy {
            while let Some(name) = queue.next(now()) {
                let sent = unconfirmed.take(&name).map(|(patch, at)| Sent { patch, at });
                working.push(label(
                    context.clone(),
                    desired.clone(),
                    name,
                    policy.clone(),
                    sent,
                ));
            }
        }
        let wake = queue
            .next_wake()
            .filter(|_| leading && policy.is_some())
            .map(tokio::time::Instant::from_std);
        tokio::select! {
            () = shutdown.cancelled() => return,
            Some(event) = node_events.recv() => {
                if leading {
                    match event {
                        NodeEvent::Changed(name) => queue.add(&name, now()),
                        NodeEvent::Relisted => {
                            queue.add_all(all_nodes(&context).iter().map(String::as_str), now());
                        }
                    }
                }
            }
            Ok(()) = labelling.changed() => {
                if leading {
                    queue.add_all(all_nodes(&context).iter().map(String::as_str), now());
                }
            }
            now_leading = leadership.changed() => {
                // Leading again, even after a loss this loop did not see: writes refused meanwhile were
                // dropped, so every node is looked at again.
                if now_leading {
                    queue.add_all(all_nodes(&context).iter().map(String::as_str), now());
                } else {
                    queue.clear();
                    unconfirmed.clear();
                }
                leading = now_leading;
            }
            Some((name, outcome, sent)) = working.next(), if !working.is_empty() => {
                queue.done(&name, outcome, now());
                if let (Some(sent), true) = (sent, leading) {
                    unconfirmed.record(name, patches.share(sent.patch), sent.at);
                }
            }
            () = tokio::time::sleep_until(wake.unwrap_or_else(tokio::time::Instant::now)), if wake.is_some() => {}
        }
    }
}

/// Labels one node; returns its name, how it went, and the patch sent that the cache does not show yet.
async fn label(
    context: Arc<Context>,
    desired: Arc<Mutex<DesiredPatches>>,
    name: String,
    policy: Option<LabelPolicy>,
    sent: Option<Sent>,
) -> (String, Outcome, Option<Sent>) {
    let Some(mut node) = context.caches.nodes.get(&name) else {
        return (name, Outcome::Done { recheck_at: None }, None);
    };
    let mut version = context.caches.nodes.resource_version(&name);
    let mut sent = sent;
    for attempt in 1..=CONFLICT_ATTEMPTS {
        let wanted = lock(&desired).of(&node, policy.as_ref(), &context.detection);
        let patch = match decide(&node, wanted, sent.as_ref(), now()) {
            Decision::Nothing => return (name, Outcome::Done { recheck_at: None }, None),
            Decision::Wait { until } => {
                return (
                    name,
                    Outcome::Done {
                        recheck_at: Some(until),
                    },
                    sent,
                );
            }
            Decision::Write(patch) => patch,
        };
        match write_labels(&context.client, &name, version.clone(), &patch).await {
            Ok(()) => {
                log_write(&name, &patch);
                let at = now();
                let recheck_at = Some(at + IN_FLIGHT);
                let patch = Arc::new(patch);
                return (name, Outcome::Done { recheck_at }, Some(Sent { patch, at }));
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < CONFLICT_ATTEMPTS => {
                // The node changed since it was read (a person, another controller, or this operator's own
                // write the cache does not show yet): decide again on the node as it is now.
                match Api::<WatchedNode>::all(context.client.clone())
                    .get_opt(&name)
                    .await
                {
                    Ok(Some(fresh)) => {
                        version = fresh.meta().resource_version.clone();
                        node = Arc::new(context.caches.nodes.project(&fresh));
                        // The API server's answer is newer than anything sent: nothing left to trust.
                        sent = None;
                    }
                    Ok(None) => return (name, Outcome::Done { recheck_at: None }, None),
                    Err(error) => return failed(&name, &error, sent),
                }
            }
            Err(error) => return failed(&name, &error, sent),
        }
    }
    // Unreachable: the last attempt returns whatever it meets; a node that kept changing backs off.
    (name, Outcome::Failed { retry_after: None }, sent)
}

fn failed(name: &str, error: &kube::Error, sent: Option<Sent>) -> (String, Outcome, Option<Sent>) {
    let retry_after = match retry::classify(error) {
        // Leadership ended while the node was being labelled: the leader labels it; the queue is cleared
        // as this replica hears of it.
        Retry::NotLeader => return (name.to_owned(), Outcome::Done { recheck_at: None }, None),
        Retry::AtLeast(wait) => Some(wait),
        Retry::BackOff => None,
    };
    warn!(node = %name, %error, ?retry_after, "cannot label node; backing off");
    (name.to_owned(), Outcome::Failed { retry_after }, sent)
}

/// The one place the labeller writes: a JSON merge patch of the changed labels and annotations that
/// carries `resourceVersion`, so that the API server refuses it (409) if the node changed since it was
/// read.
async fn write_labels(
    client: &Client,
    name: &str,
    resource_version: Option<String>,
    patch: &NodePatch,
) -> Result<(), kube::Error> {
    let mut body = patch.to_merge_patch();
    if let Some(version) = resource_version {
        body["metadata"]["resourceVersion"] = serde_json::Value::String(version);
    }
    // The answer is the whole node (~25 KB of JSON on a real fleet); nothing in it is read, so it is not
    // decoded: the node watch brings the change.
    let request = kube::core::Request::new(Node::url_path(&(), None))
        .patch(name, &PatchParams::default(), &Patch::Merge(body))
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

fn log_write(name: &str, patch: &NodePatch) {
    let changes: Vec<String> = patch
        .labels
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => format!("-{k}"),
        })
        .collect();
    info!(node = %name, labels = %changes.join(","), "labelled node");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labeler::desired_labels;
    use gpuop_api::labels::{GPU_PRESENT, GpuDetection};

    const MS: Duration = Duration::from_millis(1);

    fn done() -> Outcome {
        Outcome::Done { recheck_at: None }
    }

    fn failure() -> Outcome {
        Outcome::Failed { retry_after: None }
    }

    /// A one-worker queue that was given `gpu-0` at `at`, handed it out and heard `outcome` for it then.
    fn worked_once(outcome: Outcome, at: Instant) -> WorkQueue {
        let mut queue = WorkQueue::new(1);
        queue.add("gpu-0", at);
        queue.next(at);
        queue.done("gpu-0", outcome, at);
        queue
    }

    /// Every key due at `now`, handed out until the queue says no.
    fn drain(queue: &mut WorkQueue, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| queue.next(now)).collect()
    }

    #[test]
    fn a_node_queued_twice_is_processed_once() {
        let t0 = Instant::now();
        let mut queue = WorkQueue::new(4);
        queue.add("gpu-0", t0);
        queue.add("gpu-1", t0);
        queue.add("gpu-0", t0);
        queue.add_all(["gpu-1", "gpu-0"], t0);
        assert_eq!(drain(&mut queue, t0), ["gpu-0", "gpu-1"]);
        queue.done("gpu-0", done(), t0);
        queue.done("gpu-1", done(), t0);
        assert!(queue.is_empty(), "nothing is processed twice");
        assert_eq!(queue.next(t0 + BACKOFF_CAP), None);
    }

    #[test]
    fn a_node_that_changes_while_processed_runs_again_after_and_never_alongside() {
        let t0 = Instant::now();
        let mut queue = WorkQueue::new(4);
        queue.add("gpu-0", t0);
        assert_eq!(queue.next(t0).as_deref(), Some("gpu-0"));
        queue.add("gpu-0", t0 + MS);
        queue.add("gpu-0", t0 + 2 * MS);
        assert_eq!(queue.next(t0 + 3 * MS), None, "not while the first run goes on");
        queue.done("gpu-0", done(), t0 + 3 * MS);
        assert_eq!(drain(&mut queue, t0 + 3 * MS), ["gpu-0"], "once, after");
        queue.done("gpu-0", done(), t0 + 4 * MS);
        assert!(queue.is_empty());
    }

    #[test]
    fn an_earlier_time_wins_and_a_later_one_does_not_delay() {
        let t0 = Instant::now();
        let mut queue = WorkQueue::new(1);
        queue.add("gpu-0", t0 + IN_FLIGHT);
        queue.add("gpu-0", t0 + IN_FLIGHT * 2);
        assert_eq!(queue.due("gpu-0"), Some(t0 + IN_FLIGHT));
        queue.add("gpu-0", t0);
        assert_eq!(queue.due("gpu-0"), Some(t0));
        assert_eq!(queue.next_wake(), Some(t0));
    }

    /// Ten thousand nodes, each taking its own time to label, on a simulated clock: the queue never hands
    /// out more than its workers at once, and labels each node exactly once.
    #[test]
    fn at_most_workers_nodes_are_labelled_at_once() {
        let t0 = Instant::now();
        let mut queue = WorkQueue::new(WORKERS);
        let names: Vec<String> = (0..10_000).map(|i| format!("gpu-{i:05}")).collect();
        queue.add_all(names.iter().map(String::as_str), t0);
        // Events arrive meanwhile for nodes already queued: they change nothing.
        queue.add_all(names.iter().step_by(7).map(String::as_str), t0);
        let mut running: Vec<(Instant, String)> = Vec::new();
        let mut processed: HashMap<String, u32> = HashMap::new();
        let mut most = 0;
        let mut now = t0;
        loop {
            while let Some(name) = queue.next(now) {
                let took = MS * (1 + (BACKOFF.wait(&name, 1).as_micros() % 40) as u32);
                *processed.entry(name.clone()).or_default() += 1;
                running.push((now + took, name));
            }
            most = most.max(queue.in_flight());
            assert_eq!(queue.in_flight(), running.len());
            running.sort();
            if running.is_empty() {
                break;
            }
            let (finished, name) = running.remove(0);
            now = finished;
            queue.done(&name, done(), now);
        }
        assert_eq!(most, WORKERS);
        assert_eq!(processed.len(), names.len());
        assert!(processed.values().all(|runs| *runs == 1));
        assert!(queue.is_empty());
    }

    #[test]
    fn failures_back_off_doubling_to_a_cap_and_a_success_resets_it() {
        let t0 = Instant::now();
        let mut queue = WorkQueue::new(1);
        let mut now = t0;
        let mut waits = Vec::new();
        queue.add("gpu-0", now);
        for _ in 0..15 {
            assert_eq!(queue.next(now).as_deref(), Some("gpu-0"));
            queue.done("gpu-0", failure(), now);
            let due = queue.due("gpu-0").expect("queued again");
            assert_eq!(queue.next(due - MS), None, "not before its back-off ends");
            waits.push(due - now);
            now = due;
        }
        for (n, wait) in waits.iter().enumerate() {
            let exact = (BACKOFF_BASE * 2u32.pow(n as u32)).min(BACKOFF_CAP);
            assert!(
                *wait >= exact && *wait <= (exact + exact / 4).min(BACKOFF_CAP),
                "failure {}: waited {wait:?}, expected {exact:?} to a quarter more",
                n + 1
            );
        }
        assert_eq!(waits[0].as_millis() / 100, 2, "starts near 200 ms: {waits:?}");
        assert_eq!(*waits.last().unwrap(), BACKOFF_CAP);
        // Keys that fail together spread out.
        assert_ne!(BACKOFF.wait("gpu-0", 3), BACKOFF.wait("gpu-1", 3));

        assert_eq!(queue.next(now).as_deref(), Some("gpu-0"));
        queue.done("gpu-0", done(), now);
        assert!(queue.is_empty());
        queue.add("gpu-0", now);
        assert_eq!(queue.next(now).as_deref(), Some("gpu-0"));
        queue.done("gpu-0", failure(), now);
        let wait = queue.due("gpu-0").unwrap() - now;
        assert!(
            wait < BACKOFF_BASE * 2,
            "after a success the back-off starts again: {wait:?}"
        );
    }

    #[test]
    fn a_change_does_not_cut_a_back_off_short_and_retry_after_is_honoured() {
        let t0 = Instant::now();
        let retry_after = Some(Duration::from_secs(3));
        let mut queue = worked_once(Outcome::Failed { retry_after }, t0);
        assert_eq!(queue.due("gpu-0"), Some(t0 + Duration::from_secs(3)));
        queue.add("gpu-0", t0 + MS);
        assert_eq!(queue.next(t0 + MS), None, "the node keeps its back-off");
        assert_eq!(queue.due("gpu-0"), Some(t0 + Duration::from_secs(3)));
        assert_eq!(drain(&mut queue, t0 + Duration::from_secs(3)), ["gpu-0"]);
    }

    #[test]
    fn a_busy_queue_does_not_wake_its_driver_and_clear_forgets_what_waits() {
        let t0 = Instant::now();
        let mut queue = WorkQueue::new(1);
        queue.add_all(["gpu-0", "gpu-1"], t0);
        assert_eq!(queue.next(t0).as_deref(), Some("gpu-0"));
        assert_eq!(queue.next_wake(), None, "no worker is free: a wake-up would spin");
        queue.add("gpu-0", t0);
        queue.clear();
        assert_eq!(queue.len(), 1, "the node being labelled is still given back");
        queue.done("gpu-0", done(), t0);
        assert!(queue.is_empty(), "neither gpu-1 nor gpu-0's change is left");
    }

    #[test]
    fn a_429_waits_as_long_as_its_retry_after_says() {
        let status = |code: u16, retry_after_seconds: u32| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                details: Some(kube::core::response::StatusDetails {
                    name: "gpu-0".into(),
                    group: String::new(),
                    kind: "nodes".into(),
                    uid: String::new(),
                    causes: Vec::new(),
                    retry_after_seconds,
                }),
                ..kube::core::Status::default()
            }))
        };
        let (_, outcome, _) = super::failed("gpu-0", &status(429, 7), None);
        assert_eq!(
            outcome,
            Outcome::Failed {
                retry_after: Some(Duration::from_secs(7))
            }
        );
        let (_, outcome, _) = super::failed("gpu-0", &status(500, 7), None);
        assert_eq!(outcome, failure());
    }

    fn gpu_node(labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("gpu-0".into());
        node.metadata.labels = Some(
            [("feature.node.kubernetes.io/pci-10de.present", "true")]
                .iter()
                .chain(labels)
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        node
    }

    fn record(node: &Node) -> NodeRecord {
        let keys = crate::projection::NodeKeys::default();
        NodeRecord::project(node, &keys, &mut crate::projection::Interner::default())
    }

    fn policy() -> LabelPolicy {
        LabelPolicy::default()
    }

    /// The patch the labeller wants on `node` under [`policy`].
    fn wanted(node: &NodeRecord, detection: &GpuDetection) -> NodePatch {
        desired_labels(&node.labels, &node.annotations, Some(&policy()), detection)
    }

    /// The nodes of one kind get the same patch; the labeller keeps one copy of it while the cache does
    /// not show it, and drops the copies no node keeps any more.
    #[test]
    fn the_same_patch_sent_to_many_nodes_is_kept_once() {
        let t0 = Instant::now();
        let detection = GpuDetection::Nfd;
        let mut patches = Patches::default();
        let sent: Vec<Arc<NodePatch>> = (0..1000)
            .map(|_| {
                let node = record(&gpu_node(&[]));
                let Decision::Write(patch) = decide(&node, wanted(&node, &detection), None, t0) else {
                    panic!("a new GPU node is labelled");
                };
                patches.share(Arc::new(patch))
            })
            .collect();
        assert!(sent.iter().all(|patch| Arc::ptr_eq(patch, &sent[0])));
        drop(sent);
        for i in 0..200 {
            let mut patch = NodePatch::default();
            patch.labels.insert(format!("example.com/l{i}"), None);
            patches.share(Arc::new(patch));
        }
        assert!(patches.kept.len() < 200, "patches no node keeps are dropped");
    }

    #[test]
    fn a_write_the_cache_does_not_show_is_looked_at_again_when_its_trust_ends() {
        let t0 = Instant::now();
        let detection = GpuDetection::Nfd;
        let node = gpu_node(&[]);
        let Decision::Write(patch) = decide(&record(&node), wanted(&record(&node), &detection), None, t0)
        else {
            panic!("a new GPU node is labelled");
        };
        assert_eq!(patch.labels.get(GPU_PRESENT), Some(&Some("true".into())));
        let sent = Sent {
            patch: Arc::new(patch.clone()),
            at: t0,
        };
        // The node changes (its status, say) before the cache shows the patch: it is not sent again...
        let later = t0 + Duration::from_secs(1);
        let decision = decide(
            &record(&node),
            wanted(&record(&node), &detection),
            Some(&sent),
            later,
        );
        assert_eq!(
            decision,
            Decision::Wait {
                until: t0 + IN_FLIGHT
            }
        );
        // ...and the node is queued for the moment the trust ends.
        let recheck_at = Some(t0 + IN_FLIGHT);
        let mut queue = worked_once(Outcome::Done { recheck_at }, later);
        assert_eq!(queue.next(t0 + IN_FLIGHT - MS), None);
        assert_eq!(queue.next(t0 + IN_FLIGHT).as_deref(), Some("gpu-0"));
        // Then, with the cache still not showing it, the patch goes again (preconditioned: if it had landed,
        // the API server answers 409 and the node is read afresh).
        assert_eq!(
            decide(
                &record(&node),
                wanted(&record(&node), &detection),
                Some(&sent),
                t0 + IN_FLIGHT
            ),
            Decision::Write(patch.clone())
        );
        // Once the cache shows it, there is nothing to do.
        let mut shown = node;
        for (key, value) in &patch.labels {
            let labels = shown.metadata.labels.get_or_insert_default();
            match value {
                Some(value) => labels.insert(key.clone(), value.clone()),
                None => labels.remove(key),
            };
        }
        for (key, value) in &patch.annotations {
            if let Some(value) = value {
                shown
                    .metadata
                    .annotations
                    .get_or_insert_default()
                    .insert(key.clone(), value.clone());
            }
        }
        assert_eq!(
            decide(
                &record(&shown),
                wanted(&record(&shown), &detection),
                Some(&sent),
                later
            ),
            Decision::Nothing
        );
    }
}
