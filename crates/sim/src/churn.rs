//! Unrelated churn: the changes a real cluster's nodes see all the time that no GPU operator cares about.
//! A kubelet reports its conditions' `lastHeartbeatTime`, an agent bumps a label of its own
//! (`example.com/heartbeat-seq`), another records something in an annotation (`example.com/last-inventory`).
//! An operator that watches Nodes receives every one of these as a watch event; the benchmark measures what
//! it spends on them.
//!
//! The rate is a share of the nodes per second (`0.05`: 5% of the nodes each second). Changes are spread
//! evenly over each second, not made in bursts: the `k`-th change is due at `k / rate` seconds. The nodes
//! are visited in an order drawn from the seed, each once before any twice, so a window of `n / rate`
//! seconds touches every node once; which kind of change each visit makes is drawn from the seed too. The
//! plan is pure ([`Plan::due`]); [`play`] makes the writes, as PATCHes through the simulator's client.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::debug;

use crate::cluster_spec::NODE_CONDITIONS;

/// The label an unrelated agent bumps.
pub const SEQUENCE_LABEL: &str = "example.com/heartbeat-seq";

/// The annotation an unrelated agent writes.
pub const INVENTORY_ANNOTATION: &str = "example.com/last-inventory";

/// Writes in flight at once: enough to keep up at 10,000 nodes × 5% without a connection per write.
const IN_FLIGHT: usize = 16;

/// The longest the actor sleeps between looks.
const LOOK_AT_MOST: Duration = Duration::from_millis(100);

/// The shortest time between two looks: changes due within it go out together (a hundred slots a second
/// are even enough, and a look per change would cost more than the changes at 10,000 nodes).
const LOOK_AT_LEAST: Duration = Duration::from_millis(10);

/// How often the actor reads which nodes there are.
const NODES_EVERY: Duration = Duration::from_secs(1);

/// How much churn, and its seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Churn {
    share_per_second: f64,
    seed: u64,
}

impl Churn {
    /// Churn touching `share_per_second` of the nodes each second (more than 0, at most 1), drawn from
    /// `seed`.
    pub fn new(share_per_second: f64, seed: u64) -> Result<Self, String> {
        if !(share_per_second > 0.0 && share_per_second <= 1.0) {
            return Err(format!(
                "--churn {share_per_second}: give the share of nodes changed per second, more than 0 and at \
                 most 1 (0.05 = 5% of the nodes each second)"
            ));
        }
        Ok(Self {
            share_per_second,
            seed,
        })
    }

    /// The share of the nodes changed each second.
    pub fn share_per_second(&self) -> f64 {
        self.share_per_second
    }

    /// The share in millionths (at least one).
    fn share_micro(&self) -> u64 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let micro = (self.share_per_second * 1_000_000.0).round() as u64;
        micro.max(1)
    }
}

/// What one change does to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// Every condition's `lastHeartbeatTime` is now (the status subresource), as a kubelet reports.
    Heartbeat,
    /// [`SEQUENCE_LABEL`] is set to the change's sequence number.
    Label,
    /// [`INVENTORY_ANNOTATION`] is set to the change's sequence number.
    Annotation,
}

/// One change to one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The node.
    pub node: String,
    /// What changes.
    pub kind: ChangeKind,
    /// The change's number, from 0.
    pub seq: u64,
}

impl Change {
    /// The patch that makes the change, and whether it goes to the status subresource.
    pub fn patch(&self, now: Timestamp) -> (Value, bool) {
        match self.kind {
            ChangeKind::Heartbeat => {
                let conditions: Vec<Value> = NODE_CONDITIONS
                    .iter()
                    .map(|type_| json!({ "type": type_, "lastHeartbeatTime": Time(now) }))
                    .collect();
                (json!({ "status": { "conditions": conditions } }), true)
            }
            ChangeKind::Label => (
                json!({ "metadata": { "labels": { SEQUENCE_LABEL: self.seq.to_string() } } }),
                false,
            ),
            ChangeKind::Annotation => (
                json!({ "metadata": { "annotations": { INVENTORY_ANNOTATION: format!("seq-{}", self.seq) } } }),
                false,
            ),
        }
    }
}

/// Which changes are due when: the pure half of the churn actor.
#[derive(Clone, Debug)]
pub struct Plan {
    churn: Churn,
    made: u64,
    /// The nodes last asked about, and the order they are visited in.
    nodes: Vec<String>,
    order: Vec<String>,
}

impl Plan {
    /// A plan that has made no change yet.
    pub fn new(churn: Churn) -> Self {
        Self {
            churn,
            made: 0,
            nodes: Vec::new(),
            order: Vec::new(),
        }
    }

    /// Changes made so far.
    pub fn made(&self) -> u64 {
        self.made
    }

    /// The changes due by `elapsed` since the plan started that are not made yet, among `nodes`; and when
    /// the next one falls due (since the start). With no nodes nothing is due, and nothing is owed later.
    pub fn due(&mut self, nodes: &[String], elapsed: Duration) -> (Vec<Change>, Duration) {
        if nodes.is_empty() {
            return (Vec::new(), elapsed + LOOK_AT_MOST);
        }
        // In whole numbers, so that a change is due exactly when the next look says it is: changes per
        // second times a million is the share in millionths times the nodes.
        let per_second_micro = u128::from(self.churn.share_micro()) * nodes.len() as u128;
        let owed = elapsed.as_nanos() * per_second_micro / 1_000_000_000_000_000;
        let owed = u64::try_from(owed).unwrap_or(u64::MAX);
        if self.nodes != nodes {
            self.nodes = nodes.to_vec();
            self.order = self.order(nodes);
        }
        let order = &self.order;
        let changes = (self.made..owed.max(self.made))
            .map(|seq| {
                let node = order[usize::try_from(seq % order.len() as u64).unwrap_or(0)].clone();
                Change {
                    node,
                    kind: self.kind(seq),
                    seq,
                }
            })
            .collect();
        self.made = owed.max(self.made);
        let next_nanos = (u128::from(self.made) + 1)
            .saturating_mul(1_000_000_000_000_000)
            .div_ceil(per_second_micro.max(1));
        let next = Duration::from_nanos(u64::try_from(next_nanos).unwrap_or(u64::MAX));
        (changes, next)
    }

    /// The nodes in the order they are visited: by a hash of the seed and the name, so that a node keeps
    /// its place however the cluster changes around it.
    fn order(&self, nodes: &[String]) -> Vec<String> {
        let mut order: Vec<(u64, &String)> = nodes
            .iter()
            .map(|node| (mix(self.churn.seed, fnv(node)), node))
            .collect();
        order.sort();
        order.into_iter().map(|(_, node)| node.clone()).collect()
    }

    /// Half heartbeats, a quarter labels, a quarter annotations.
    fn kind(&self, seq: u64) -> ChangeKind {
        match mix(self.churn.seed ^ 0x9e37_79b9_7f4a_7c15, seq) % 4 {
            0 => ChangeKind::Label,
            1 => ChangeKind::Annotation,
            _ => ChangeKind::Heartbeat,
        }
    }
}

/// FNV-1a of a name.
fn fnv(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// SplitMix64 of a seed and a value: a well-spread number for each pair.
fn mix(seed: u64, value: u64) -> u64 {
    let mut z = seed.wrapping_add(value.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Makes one change; a failure (the node went) is logged at debug and not retried: churn is noise.
pub async fn apply(nodes: &Api<Node>, change: &Change, now: Timestamp) {
    let (patch, status) = change.patch(now);
    let params = PatchParams::default();
    let result = if status {
        // A strategic merge patch touches the conditions by type and leaves the rest of the status alone.
        nodes
            .patch_status(&change.node, &params, &Patch::Strategic(&patch))
            .await
    } else {
        nodes.patch(&change.node, &params, &Patch::Merge(&patch)).await
    };
    if let Err(error) = result {
        debug!(node = %change.node, %error, "churn: cannot change the node");
    }
}

/// Plays `churn` until dropped: reads the nodes to change from `nodes` at every look and counts the changes
/// made in `made`.
pub async fn play(client: Client, churn: Churn, nodes: impl Fn() -> Vec<String>, made: Arc<AtomicU64>) {
    use futures::StreamExt;

    let api: Api<Node> = Api::all(client);
    let mut plan = Plan::new(churn);
    let started = Instant::now();
    let mut names = nodes();
    let mut names_read = started;
    loop {
        if names_read.elapsed() >= NODES_EVERY {
            names = nodes();
            names_read = Instant::now();
        }
        let (changes, next) = plan.due(&names, started.elapsed());
        let now = Timestamp::now();
        let count = changes.len() as u64;
        let writes = changes.into_iter().map(|change| {
            let api = api.clone();
            async move { apply(&api, &change, now).await }
        });
        futures::stream::iter(writes)
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
        made.fetch_add(count, Ordering::Relaxed);
        let wait = next
            .saturating_sub(started.elapsed())
            .clamp(LOOK_AT_LEAST, LOOK_AT_MOST);
        tokio::time::sleep(wait).await;
    }
}

/// Churn being played; it stops when [`Churning::stop`] is called or its parent token is cancelled.
#[derive(Debug)]
pub struct Churning {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    made: Arc<AtomicU64>,
}

impl Churning {
    /// Starts playing `churn` on the nodes `nodes` names, until `parent` is cancelled or the churn stopped.
    pub fn start(
        client: Client,
        churn: Churn,
        nodes: impl Fn() -> Vec<String> + Send + 'static,
        parent: &tokio_util::sync::CancellationToken,
    ) -> Self {
        let stop = parent.child_token();
        let made = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, made) = (stop.clone(), made.clone());
            async move {
                // Stopping does not wait for writes in flight.
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = play(client, churn, nodes, made) => {}
                }
            }
        });
        Self { stop, task, made }
    }

    /// Changes made so far.
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    /// Stops the churn; returns how many changes it made.
    pub async fn stop(self) -> u64 {
        self.stop.cancel();
        let _ = self.task.await;
        self.made.load(Ordering::Relaxed)
    }
}

/// Changes by node and kind in a list of changes: what a test or a report reads.
pub fn tally(changes: &[Change]) -> BTreeMap<String, usize> {
    let mut nodes = BTreeMap::new();
    for change in changes {
        *nodes.entry(change.node.clone()).or_insert(0) += 1;
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("gpu-{i}")).collect()
    }

    fn churn(share: f64, seed: u64) -> Churn {
        Churn::new(share, seed).unwrap()
    }

    #[test]
    fn the_share_is_a_fraction_of_the_nodes() {
        for bad in [0.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            let error = Churn::new(bad, 1).unwrap_err();
            assert!(error.contains("more than 0 and at most 1"), "{error}");
        }
        assert!(Churn::new(1.0, 1).is_ok());
    }

    #[test]
    fn a_window_touches_the_share_of_the_nodes_each_once() {
        let cluster = nodes(1_000);
        let mut plan = Plan::new(churn(0.05, 7));
        // 10 s at 5% of 1,000 nodes: 500 changes, on 500 different nodes.
        let (changes, _) = plan.due(&cluster, Duration::from_secs(10));
        assert_eq!(changes.len(), 500);
        let touched = tally(&changes);
        assert_eq!(touched.len(), 500, "no node twice before every node once");
        // The next 10 s touch the other half: 20 s at 5% is every node once.
        let (more, _) = plan.due(&cluster, Duration::from_secs(20));
        let mut all = changes;
        all.extend(more);
        assert_eq!(tally(&all).len(), 1_000);
        assert!(tally(&all).values().all(|n| *n == 1));
        let kinds = |kind: ChangeKind| all.iter().filter(|c| c.kind == kind).count();
        let (heartbeats, labels, annotations) = (
            kinds(ChangeKind::Heartbeat),
            kinds(ChangeKind::Label),
            kinds(ChangeKind::Annotation),
        );
        assert!(
            (400..600).contains(&heartbeats)
                && (150..350).contains(&labels)
                && (150..350).contains(&annotations),
            "half heartbeats, a quarter each of labels and annotations: {heartbeats}, {labels}, {annotations}"
        );
    }

    #[test]
    fn changes_are_spread_over_each_second_not_bunched() {
        let cluster = nodes(2_000);
        let mut plan = Plan::new(churn(0.05, 3));
        // 100 changes a second: looking every 10 ms finds one due each time, never a second's worth.
        let mut largest = 0;
        let mut total = 0;
        for tick in 1..=300u64 {
            let (changes, next) = plan.due(&cluster, Duration::from_millis(10 * tick));
            largest = largest.max(changes.len());
            total += changes.len();
            assert!(
                next > Duration::from_millis(10 * tick) && next <= Duration::from_millis(10 * tick + 10),
                "the next change is due within 10 ms: {next:?} at tick {tick}"
            );
        }
        assert_eq!(total, 300, "3 s at 100 a second");
        assert!(largest <= 2, "at most a 10 ms share at once, not {largest}");
        // Looking late makes up what is owed, no more.
        let (late, _) = plan.due(&cluster, Duration::from_secs(5));
        assert_eq!(late.len(), 200);
    }

    #[test]
    fn the_same_seed_plays_the_same_changes_and_another_seed_others() {
        let cluster = nodes(300);
        let play = |seed| {
            Plan::new(churn(0.1, seed))
                .due(&cluster, Duration::from_secs(3))
                .0
        };
        assert_eq!(play(11), play(11));
        assert_ne!(play(11), play(12));
        let mut empty = Plan::new(churn(0.1, 1));
        assert!(empty.due(&[], Duration::from_secs(100)).0.is_empty());
        assert_eq!(empty.made(), 0, "nothing is owed for a time without nodes");
    }

    #[test]
    fn patches_touch_only_fields_no_gpu_operator_reads() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let change = |kind| Change {
            node: "gpu-0".into(),
            kind,
            seq: 42,
        };
        let (heartbeat, status) = change(ChangeKind::Heartbeat).patch(now);
        assert!(status);
        let conditions = heartbeat["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 4);
        assert!(conditions.iter().all(|c| {
            let fields: Vec<&String> = c.as_object().unwrap().keys().collect();
            fields == ["type", "lastHeartbeatTime"] || fields == ["lastHeartbeatTime", "type"]
        }));
        let (label, status) = change(ChangeKind::Label).patch(now);
        assert!(!status);
        assert_eq!(label, json!({"metadata": {"labels": {SEQUENCE_LABEL: "42"}}}));
        let (annotation, _) = change(ChangeKind::Annotation).patch(now);
        assert_eq!(
            annotation,
            json!({"metadata": {"annotations": {INVENTORY_ANNOTATION: "seq-42"}}})
        );
    }

    /// Through the fake server's own write paths: after a window of churn, each node differs from before
    /// only in the heartbeat times, the sequence label and the inventory annotation; no `nvidia.com/` or
    /// `feature.node.kubernetes.io/` label changed, and the status is otherwise the same.
    #[tokio::test]
    async fn churn_changes_nothing_but_unrelated_fields() {
        use crate::cluster_bench::gpu_cluster;
        use crate::cluster_spec::node_object;
        use kube::api::{ListParams, PostParams};

        let server = gpuop_fakeserver::FakeServer::new();
        let client = server.client_as(crate::USER_AGENT);
        let api: Api<Node> = Api::all(client.clone());
        let spec = gpu_cluster(20);
        let mut names = Vec::new();
        for (index, (name, pool)) in (0u32..).zip(spec.nodes()) {
            let mut node = node_object(&name, pool, true, index);
            node.metadata
                .labels
                .get_or_insert_default()
                .insert("nvidia.com/gpu.deploy.driver".into(), "true".into());
            api.create(&PostParams::default(), &node).await.unwrap();
            let status = json!({ "status": node.status });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
            names.push(name);
        }
        let before: BTreeMap<String, Node> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap(), n))
            .collect();
        let mut plan = Plan::new(churn(0.25, 5));
        // 4 s at 25% of 20 nodes: 20 changes, each node once.
        let (changes, _) = plan.due(&names, Duration::from_secs(4));
        assert_eq!(changes.len(), 20);
        // Whole seconds: condition times are stored to the second.
        let later = Timestamp::from_second(Timestamp::now().as_second() + 3_600).unwrap();
        for change in &changes {
            apply(&api, change, later).await;
        }
        let kinds: BTreeMap<&str, &ChangeKind> = changes.iter().map(|c| (c.node.as_str(), &c.kind)).collect();
        for node in api.list(&ListParams::default()).await.unwrap().items {
            let name = node.metadata.name.clone().unwrap();
            let old = &before[&name];
            let kind = kinds[name.as_str()];
            let mut labels = node.metadata.labels.clone().unwrap();
            let sequence = labels.remove(SEQUENCE_LABEL);
            assert_eq!(
                Some(&labels),
                old.metadata.labels.as_ref(),
                "{name}: no other label changed"
            );
            assert_eq!(sequence.is_some(), *kind == ChangeKind::Label, "{name}");
            let mut annotations = node.metadata.annotations.clone().unwrap();
            let inventory = annotations.remove(INVENTORY_ANNOTATION);
            assert_eq!(Some(&annotations), old.metadata.annotations.as_ref(), "{name}");
            assert_eq!(inventory.is_some(), *kind == ChangeKind::Annotation, "{name}");
            let mut status = node.status.clone().unwrap();
            let beats: Vec<_> = status
                .conditions
                .iter_mut()
                .flatten()
                .map(|c| c.last_heartbeat_time.take())
                .collect();
            let mut old_status = old.status.clone().unwrap();
            old_status
                .conditions
                .iter_mut()
                .flatten()
                .for_each(|c| c.last_heartbeat_time = None);
            assert_eq!(
                status, old_status,
                "{name}: the status changed only in heartbeat times"
            );
            let beaten = beats.iter().all(|t| t.as_ref().is_some_and(|t| t.0 == later));
            assert_eq!(beaten, *kind == ChangeKind::Heartbeat, "{name}: {beats:?}");
            assert_eq!(node.spec, old.spec, "{name}");
        }
    }
}
