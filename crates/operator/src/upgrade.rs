//! The upgrade controller: carries out [`gpuop_api::upgrade::decide`] for every upgrade pool (the
//! ClusterPolicy's driver, or each NVIDIADriver's, each with its own policy and budget).
//!
//! It reads the operator's caches and writes only to move a node: one merge patch per move (the state
//! label, annotations and the cordon together; a cordon carries the node's resourceVersion, so a node that
//! changed since the decision is decided again instead), evictions through the `pods/eviction` subresource
//! (PodDisruptionBudgets apply), and deletes of outdated driver pods (their `OnDelete` DaemonSet recreates
//! them from the latest revision). No polling: a move's echo in the node cache wakes the next pass, and a
//! patched node stands in for its cached copy until the cache shows it, so a lagging watch can never make
//! a pass count the budget from stale nodes. The pods of a node are watched only while it is being emptied.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpuop_api::labels::{UPGRADE_ENABLED_ANNOTATION, UPGRADE_STATE};
use gpuop_api::read::NodeRead;
use gpuop_api::upgrade::observe::{DriverPods, PoolScope, node_view, validators, workload_pod};
use gpuop_api::upgrade::{
    Decision, EVICTION_RETRY_SECONDS, NodeView, Step, UpgradeCounts, UpgradeState, WorkloadPod, decide,
};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::caches::spawn_until_cancelled;
use crate::changes::{Changed, NodeSource, PodSource};
use crate::context::Context;
use crate::handoff::{UpgradePool, Upgrades};
use crate::projection::{NodeRecord, WatchedNode};
use crate::retry::Backoff;
use crate::unconfirmed::{self, Unconfirmed};

/// The shortest time between the starts of two passes while nodes are being upgraded: each of a node's
/// moves waits for a pass.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(200);
/// The same while no node is being upgraded: a pass reads every node and operand pod, and while a cluster
/// rolls out they change by the thousand; the rollout keeps its CPU.
pub(crate) const IDLE_PASS_INTERVAL: Duration = Duration::from_secs(1);
/// A pass reads every node and operand pod: the next one starts no sooner than this many times the last
/// one's own computing (its writes not counted) after it, so that the controller takes at most a
/// twentieth of a core however large the cluster.
const PACE: u32 = 20;
/// How often a pass runs with nothing changed.
const RESYNC: Duration = Duration::from_secs(300);
/// How a failed step is retried (see [`crate::retry`]): every 2 s, or after the wait the server asks for.
/// A step is cheap to repeat (its patch and deletions are idempotent), and a node left half-way holds a
/// slot of the pool's budget.
const STEP_RETRY: Backoff = Backoff {
    base: Duration::from_secs(2),
    cap: Duration::from_secs(2),
};
/// Moves carried out at once.
const CONCURRENCY: usize = 16;

/// What a pass remembers for the next.
#[derive(Debug)]
struct Memory {
    /// The views of the nodes, kept from pass to pass.
    kept: Kept,
    /// Per node, the resourceVersion it had when this controller patched it, the patched node and its
    /// resourceVersion.
    patched: Unconfirmed<String, Patched>,
    /// Driver pods deleted, by name.
    deleted: Unconfirmed<String, ()>,
    /// Pods whose eviction was asked for, by `namespace/name`: not asked again before
    /// [`EVICTION_RETRY_SECONDS`].
    evicted: Unconfirmed<String, ()>,
    /// The pods of the nodes being emptied.
    node_pods: NodePods,
    /// Whether the last pass saw nodes waiting for or in an upgrade.
    upgrading: bool,
    /// How long the last pass computed (reading the caches and deciding; not waiting for its writes).
    computing: Duration,
}

impl Default for Memory {
    fn default() -> Self {
        Self {
            kept: Kept::default(),
            patched: Unconfirmed::default(),
            deleted: Unconfirmed::default(),
            evicted: Unconfirmed::new(Duration::from_secs(EVICTION_RETRY_SECONDS)),
            node_pods: NodePods::default(),
            upgrading: false,
            computing: Duration::ZERO,
        }
    }
}

/// A node as this controller patched it, until the cache shows the patch.
#[derive(Debug)]
struct Patched {
    before: Option<String>,
    node: Arc<NodeRecord>,
    version: Option<String>,
}

/// Runs the upgrade controller until `shutdown`.
pub async fn run_upgrades(context: Arc<Context>, shutdown: CancellationToken) {
    if !context.caches.ready().await {
        return;
    }
    let mut pools = context.upgrade_pools.subscribe();
    let mut leadership = context.leadership.clone();
    let mut memory = Memory::default();
    let mut wait = RESYNC;
    let mut last_pass: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = context.changed.upgrades.notified() => {}
            Ok(()) = pools.changed() => {}
            _ = leadership.changed() => {}
            () = tokio::time::sleep(wait) => {}
        }
        if let Some(last) = last_pass {
            let interval = if memory.upgrading {
                MIN_PASS_INTERVAL
            } else {
                IDLE_PASS_INTERVAL
            }
            .max(memory.computing * PACE);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(last + interval) => {}
            }
        }
        last_pass = Some(Instant::now());
        let current = context.upgrade_pools.borrow().clone();
        wait = match current {
            Some(Upgrades::Pools(pools)) if context.leadership.is_leader() => {
                pass(&context, &pools, &mut memory).await
            }
            Some(Upgrades::NoPolicy) if context.leadership.is_leader() => {
                memory = Memory::default();
                release_all(&context).await
            }
            _ => RESYNC,
        };
    }
}

/// One pass over every pool; returns how long to wait for a change before the next.
async fn pass(context: &Context, pools: &[UpgradePool], memory: &mut Memory) -> Duration {
    context.metrics.upgrade_pass();
    let mut computing = Duration::ZERO;
    let mut segment = Instant::now();
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    // A node whose patched copy stops standing in is viewed again from the cache.
    let instant = unconfirmed::now();
    let mut again: BTreeSet<String> = memory.patched.settle(instant, |_, _| false).into_iter().collect();
    memory.deleted.settle(instant, |_, _| false);
    memory.evicted.settle(instant, |_, _| false);
    let mut basis = Basis {
        scopes: pools.iter().map(|pool| pool.scope.clone()).collect(),
        daemonsets: context.caches.daemonsets.state(),
        revisions: context.caches.revisions.state(),
    };
    basis
        .daemonsets
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    basis
        .revisions
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    {
        let (nodes, pods) = (context.caches.nodes.read(), context.caches.pods.read());
        // This controller's own patches stand in for cached copies that do not show them yet; once the
        // cache shows a node changed since, the cache's copy is the newer one.
        memory.patched.settle(instant, |name, patched| {
            nodes.version(name) != patched.before.as_deref()
        });
        again.extend(memory.patched.keys().cloned());
        let patched = &memory.patched;
        let stand_in = |name: &str| patched.last(name).map(|(p, _)| p.node.clone());
        memory.kept.refresh(&*nodes, &*pods, basis, &stand_in, again, now);
    }

    let mut next = RESYNC;
    let mut total = UpgradeCounts::default();
    for (index, pool) in pools.iter().enumerate() {
        let Memory { kept, node_pods, .. } = &mut *memory;
        let members = &mut kept.members[index];
        let Some(policy) = &pool.policy else {
            let names: Vec<String> = members.keys().cloned().collect();
            computing += segment.elapsed();
            next = next.min(switch_off(context, pool, &names, memory).await);
            segment = Instant::now();
            continue;
        };
        // The nodes being emptied get their pods for this pass.
        let mut unknown: BTreeSet<String> = BTreeSet::new();
        for (name, view) in members.iter_mut() {
            view.pods = Vec::new();
            if emptying(view.state) {
                match node_pods.of(context, name) {
                    Some(pods) => view.pods = pods,
                    // Not listed yet: the node stays where it is this pass (it still counts in the budget).
                    None => {
                        unknown.insert(name.clone());
                    }
                }
            }
        }
        let views: Vec<&NodeView> = members.values().collect();
        let mut decision = decide(policy, &views, now);
        decision.steps.retain(|step| !unknown.contains(&step.node));
        computing += segment.elapsed();
        next = next.min(carry_out(context, pool, &decision, memory).await);
        segment = Instant::now();
        add(&mut total, &decision.counts);
    }
    let emptied: BTreeSet<&str> = memory
        .kept
        .members
        .iter()
        .flat_map(|members| members.values())
        .filter(|view| emptying(view.state))
        .map(|view| view.name.as_str())
        .collect();
    memory.node_pods.keep_only(&emptied);
    memory.upgrading = total.pending + total.in_progress > total.failed;
    context.metrics.upgrades(&total);
    memory.computing = computing + segment.elapsed();
    next
}

/// What the views were made for: the pools' scopes, the DaemonSets and their revisions (a change of any
/// of these that a view reads makes every view anew).
struct Basis {
    scopes: Vec<PoolScope>,
    daemonsets: Vec<Arc<DaemonSet>>,
    revisions: Vec<Arc<ControllerRevision>>,
}

impl Basis {
    /// Whether views made for `other` are what views made for `self` would be. Of a DaemonSet the views
    /// read its name, uid and spec (the driver config digest its pods should carry), never its status:
    /// during a rollout a driver DaemonSet's status changes with every node, and each change would make
    /// every node's view anew.
    fn same(&self, other: &Basis) -> bool {
        fn same_arcs<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b))
        }
        fn read(ds: &DaemonSet) -> (&Option<String>, &Option<String>, &Option<DaemonSetSpec>) {
            (&ds.metadata.name, &ds.metadata.uid, &ds.spec)
        }
        self.scopes == other.scopes
            && self.daemonsets.len() == other.daemonsets.len()
            && self
                .daemonsets
                .iter()
                .zip(&other.daemonsets)
                .all(|(a, b)| Arc::ptr_eq(a, b) || read(a) == read(b))
            && same_arcs(&self.revisions, &other.revisions)
    }
}

/// What the passes keep of the caches, brought up to date with the nodes whose record or pods changed
/// since the last pass: the driver pods and validators by node, and each pool's members as the decision
/// sees them. A pass costs the nodes that changed, not the cluster.
#[derive(Debug, Default)]
struct Kept {
    /// The node and pod caches' marks it is up to date with; `None` until the first pass.
    marks: Option<(u64, u64)>,
    basis: Option<Basis>,
    /// The driver pods, by node.
    drivers: DriverPods,
    /// Since when each node's validator has been Ready, by node.
    validators: BTreeMap<String, Option<i64>>,
    /// Per pool (in the order of the basis' scopes), its members' views by name. The pods of the nodes
    /// being emptied are set by each pass.
    members: Vec<BTreeMap<String, NodeView>>,
}

impl std::fmt::Debug for Basis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Basis")
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl Kept {
    /// Views again the nodes that changed since the last refresh and those in `again`, or every node when
    /// the basis changed or a cache was listed anew. `stand_in` gives a node as this controller patched it,
    /// where the cache does not show the patch yet. Returns how many nodes were viewed.
    fn refresh(
        &mut self,
        nodes: &(impl NodeSource + ?Sized),
        pods: &(impl PodSource + ?Sized),
        basis: Basis,
        stand_in: &dyn Fn(&str) -> Option<Arc<NodeRecord>>,
        again: BTreeSet<String>,
        now: i64,
    ) -> usize {
        let (node_mark, node_changes) = nodes.changes(self.marks.map_or(0, |m| m.0));
        let (pod_mark, pod_changes) = pods.changes(self.marks.map_or(0, |m| m.1));
        let same_basis = self.basis.as_ref().is_some_and(|kept| kept.same(&basis));
        // Made anew, the views still count each state from when it was first seen.
        let mut previous = Vec::new();
        let names: BTreeSet<String> = match (same_basis, node_changes, pod_changes) {
            (true, Changed::Names(changed), Changed::Names(moved)) => changed
                .iter()
                .chain(&moved)
                .map(|name| name.to_string())
                .chain(again)
                .collect(),
            _ => {
                self.drivers = DriverPods::default();
                self.validators.clear();
                previous = std::mem::replace(
                    &mut self.members,
                    basis.scopes.iter().map(|_| BTreeMap::new()).collect(),
                );
                nodes.nodes().iter().map(|node| node.name.to_string()).collect()
            }
        };
        let daemonsets: Vec<&DaemonSet> = basis.daemonsets.iter().map(|d| &**d).collect();
        let revisions: Vec<&ControllerRevision> = basis.revisions.iter().map(|r| &**r).collect();
        for name in &names {
            let Some(node) = stand_in(name).or_else(|| nodes.node(name)) else {
                self.drivers.by_node.remove(name);
                self.validators.remove(name);
                for members in &mut self.members {
                    members.remove(name);
                }
                continue;
            };
            let on_node = pods.on_node(name);
            let on_node = || on_node.iter().map(|pod| &**pod);
            match DriverPods::index(on_node(), &daemonsets, &revisions)
                .by_node
                .remove(name)
            {
                Some(drivers) => self.drivers.by_node.insert(name.clone(), drivers),
                None => self.drivers.by_node.remove(name),
            };
            match validators(on_node()).remove(name) {
                Some(since) => self.validators.insert(name.clone(), since),
                None => self.validators.remove(name),
            };
            let mut seen: Option<(UpgradeState, i64)> = None;
            for members in self.members.iter_mut().chain(&mut previous) {
                if let Some(old) = members.remove(name) {
                    seen = Some((old.state, old.state_since));
                }
            }
            for (scope, members) in basis.scopes.iter().zip(&mut self.members) {
                if !scope.includes(&*node, &self.drivers) {
                    continue;
                }
                let mut view = node_view(
                    &*node,
                    self.drivers.on(name, &scope.daemonsets),
                    self.validators.get(name).copied().flatten(),
                );
                // Eviction timeouts count from when the state was first seen.
                view.state_since = match seen {
                    Some((state, since)) if state == view.state => since,
                    _ => now,
                };
                members.insert(name.clone(), view);
            }
        }
        self.marks = Some((node_mark, pod_mark));
        self.basis = Some(basis);
        names.len()
    }
}

/// A node as this controller sees it: its own patch while the cache does not show it, else the cache's.
fn current_node(context: &Context, memory: &Memory, name: &str) -> Option<Arc<NodeRecord>> {
    match memory.patched.last(name) {
        Some((patched, _)) => Some(patched.node.clone()),
        None => context.caches.nodes.get(name),
    }
}

/// The resourceVersion of the node as this controller sees it: its own patch's while the cache does not
/// show it, else the cache's.
fn version_of(context: &Context, memory: &Memory, name: &str) -> Option<String> {
    match memory.patched.last(name) {
        Some((patched, _)) => patched.version.clone(),
        None => context.caches.nodes.resource_version(name),
    }
}

/// The node states in which the node's pods are needed.
fn emptying(state: UpgradeState) -> bool {
    matches!(
        state,
        UpgradeState::WaitForJobsRequired | UpgradeState::PodDeletionRequired | UpgradeState::DrainRequired
    )
}

/// Watches of the pods on the nodes being emptied, one per node (field selector `spec.nodeName`): the
/// controller sees evicted pods go, and is woken when they do, without polling. A watch starts when its node
/// starts being emptied and stops when the node moves on.
#[derive(Debug, Default)]
struct NodePods {
    watches: BTreeMap<String, NodeWatch>,
}

#[derive(Debug)]
struct NodeWatch {
    pods: Store<Pod>,
    listed: Arc<AtomicBool>,
    stop: CancellationToken,
}

impl NodePods {
    /// The node's pods as the eviction rules see them, once its watch has listed them (it starts now if
    /// it was not running).
    fn of(&mut self, context: &Context, node: &str) -> Option<Vec<WorkloadPod>> {
        let watch = self
            .watches
            .entry(node.to_owned())
            .or_insert_with(|| NodeWatch::start(context, node));
        watch
            .listed
            .load(Ordering::Acquire)
            .then(|| watch.pods.state().iter().map(|pod| workload_pod(pod)).collect())
    }

    /// Stops the watches of nodes no longer being emptied.
    fn keep_only(&mut self, nodes: &BTreeSet<&str>) {
        self.watches.retain(|node, _| nodes.contains(node.as_str()));
    }
}

/// Keeps what the eviction rules read ([`workload_pod`]): labels, owners, the mirror annotation, resources,
/// emptyDir volumes, phase and deletion.
fn trim_workload_pod(pod: &mut Pod) {
    use k8s_openapi::api::core::v1::{Container, PodStatus, Volume};
    pod.metadata.managed_fields = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|key, _| key == "kubernetes.io/config.mirror");
    }
    let trim = |containers: &mut Vec<Container>| {
        for container in containers.iter_mut() {
            *container = Container {
                name: std::mem::take(&mut container.name),
                resources: container.resources.take(),
                ..Container::default()
            };
        }
    };
    if let Some(spec) = pod.spec.as_mut() {
        trim(&mut spec.containers);
        if let Some(init) = spec.init_containers.as_mut() {
            trim(init);
        }
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| v.empty_dir.is_some());
            for volume in volumes.iter_mut() {
                *volume = Volume {
                    name: std::mem::take(&mut volume.name),
                    empty_dir: volume.empty_dir.take(),
                    ..Volume::default()
                };
            }
        }
    }
    if let Some(status) = pod.status.as_mut() {
        *status = PodStatus {
            phase: status.phase.take(),
            ..PodStatus::default()
        };
    }
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl NodeWatch {
    fn start(context: &Context, node: &str) -> Self {
        let (pods, writer) = reflector::store();
        let listed = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let stream = watcher(Api::<Pod>::all(context.client.clone()), config)
            .default_backoff()
            .modify(trim_workload_pod)
            .reflect(writer);
        let changed = context.changed.clone();
        let flag = listed.clone();
        let node = node.to_owned();
        spawn_until_cancelled(stream, &stop, move |event| match event {
            Ok(event) => {
                if matches!(event, watcher::Event::InitDone) {
                    flag.store(true, Ordering::Release);
                }
                changed.upgrades.notify_one();
            }
            Err(error) => warn!(%node, %error, "watch of the node's pods failed; retrying"),
        });
        Self { pods, listed, stop }
    }
}

/// Carries out a decision's steps, a few nodes at a time; returns when the pool wants another look.
async fn carry_out(
    context: &Context,
    pool: &UpgradePool,
    decision: &Decision,
    memory: &mut Memory,
) -> Duration {
    let mut next = decision.recheck_in.map_or(RESYNC, Duration::from_secs);
    // What this controller asked for a moment ago is not asked again: a deleted driver pod, or an eviction
    // (a refused one is retried after EVICTION_RETRY_SECONDS).
    let now = unconfirmed::now();
    let steps: Vec<Step> = decision
        .steps
        .iter()
        .map(|step| {
            let mut step = step.clone();
            step.evict
                .retain(|pod| memory.evicted.trusted(pod, now).is_none());
            if step
                .restart_driver
                .as_ref()
                .is_some_and(|pod| memory.deleted.trusted(pod, now).is_some())
            {
                step.restart_driver = None;
            }
            step
        })
        .filter(|step| !step.is_empty())
        .collect();
    for pod in steps.iter().flat_map(|step| &step.evict) {
        memory.evicted.record(pod.clone(), (), now);
    }
    for chunk in steps.chunks(CONCURRENCY) {
        let results = futures::future::join_all(chunk.iter().map(|step| {
            let node = current_node(context, memory, &step.node);
            let version = version_of(context, memory, &step.node);
            async move {
                let result = execute(context, pool, step, node.as_deref(), version.clone()).await;
                (step, node.map(|_| version), result)
            }
        }))
        .await;
        for (step, before, result) in results {
            match result {
                Ok(outcome) => {
                    if let (Some(patched), Some(before)) = (outcome.patched, before) {
                        let patched = Patched {
                            before,
                            node: Arc::new(context.caches.nodes.project(&patched)),
                            version: kube::Resource::meta(&patched).resource_version.clone(),
                        };
                        memory
                            .patched
                            .record(step.node.clone(), patched, unconfirmed::now());
                    }
                    if let Some(pod) = &step.restart_driver {
                        memory.deleted.record(pod.clone(), (), unconfirmed::now());
                    }
                    if let Some(error) = outcome.failed
                        && let Some(retry_in) = STEP_RETRY.after(&error, &step.node, 1)
                    {
                        warn!(node = %step.node, pool = %pool.owner, %error, ?retry_in, "driver upgrade step failed; retrying");
                        next = next.min(retry_in);
                    }
                }
                Err(error) => match STEP_RETRY.after(&error, &step.node, 1) {
                    // No longer the leader: the leader carries the upgrade on.
                    None => return RESYNC,
                    Some(retry_in) => {
                        warn!(node = %step.node, pool = %pool.owner, %error, ?retry_in, "driver upgrade step failed; retrying");
                        next = next.min(retry_in);
                    }
                },
            }
        }
    }
    next
}

/// What a step did: the node as patched, and an eviction or delete that failed (the rest was
/// still tried, and the patch stands).
#[derive(Default)]
struct Executed {
    patched: Option<WatchedNode>,
    failed: Option<kube::Error>,
}

async fn execute(
    context: &Context,
    pool: &UpgradePool,
    step: &Step,
    node: Option<&NodeRecord>,
    version: Option<String>,
) -> Result<Executed, kube::Error> {
    let mut executed = Executed::default();
    if step.patches_node() {
        if node.is_none() {
            return Ok(executed);
        }
        // The answer is the whole node (~25 KB of JSON on a real fleet): read as the node watch reads it.
        let api: Api<WatchedNode> = Api::all(context.client.clone());
        let mut metadata = Map::new();
        if let Some(state) = step.to {
            metadata.insert("labels".into(), json!({ UPGRADE_STATE: state.label() }));
        }
        if !step.annotations.is_empty() {
            let annotations: Map<String, Value> = step
                .annotations
                .iter()
                .map(|(key, value)| {
                    (
                        (*key).to_owned(),
                        value.clone().map_or(Value::Null, Value::String),
                    )
                })
                .collect();
            metadata.insert("annotations".into(), Value::Object(annotations));
        }
        if step.unschedulable == Some(true) {
            // A cordon takes budget: it holds only for the node as decided on.
            if let Some(version) = version {
                metadata.insert("resourceVersion".into(), Value::String(version));
            }
        }
        let mut patch = json!({ "metadata": metadata });
        if let Some(unschedulable) = step.unschedulable {
            patch["spec"] = json!({ "unschedulable": unschedulable });
        }
        match api
            .patch(&step.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(patched) => executed.patched = Some(patched),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                debug!(node = %step.node, "node changed since the decision; deciding again");
                return Ok(executed);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(executed),
            Err(error) => return Err(error),
        }
        if let Some(to) = step.to {
            info!(node = %step.node, pool = %pool.owner, from = %step.from, to = %to, "driver upgrade");
        }
        if let Some(cordon) = step.unschedulable {
            info!(node = %step.node, pool = %pool.owner, "{}", if cordon { "cordoned" } else { "uncordoned" });
        }
    }
    for key in &step.evict {
        let Some((namespace, name)) = key.split_once('/') else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(context.client.clone(), namespace);
        match api.evict(name, &EvictParams::default()).await {
            Ok(_) => info!(node = %step.node, pod = %key, "evicted for the driver upgrade"),
            Err(kube::Error::Api(status)) if status.code == 429 => {
                debug!(node = %step.node, pod = %key, message = %status.message, "eviction refused for now");
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => executed.failed = Some(error),
        }
    }
    if let Some(pod) = &step.restart_driver {
        let api: Api<Pod> = Api::namespaced(context.client.clone(), &context.namespace);
        match api.delete(pod, &DeleteParams::default()).await {
            Ok(_) => info!(node = %step.node, pod = %pod, "deleted the outdated driver pod"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => executed.failed = Some(error),
        }
    }
    if let (Some(note), Some(node)) = (&step.note, node) {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.to_owned(),
            note: Some(crate::status::bounded_note(&note.message)),
            action: "DriverUpgrade".into(),
            secondary: None,
        };
        let regarding = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.name.to_string()),
            uid: node.uid.as_deref().map(str::to_owned),
            ..Default::default()
        };
        if let Err(error) = context.recorder.publish(&event, &regarding).await {
            warn!(%error, "cannot publish an event");
        }
        if note.warning {
            warn!(node = %step.node, pool = %pool.owner, reason = note.reason, "{}", note.message);
        }
    }
    Ok(executed)
}

/// With automatic upgrades off, the state labels go (as NVIDIA's operator removes them), so that a later
/// switch-on starts from what the drivers are, not from stale states.
async fn switch_off(context: &Context, pool: &UpgradePool, members: &[String], memory: &Memory) -> Duration {
    let api: Api<Node> = Api::all(context.client.clone());
    let mut next = RESYNC;
    for node in members
        .iter()
        .filter_map(|name| current_node(context, memory, name))
    {
        let labelled = node.label(UPGRADE_STATE).is_some();
        let annotated = node.annotation(UPGRADE_ENABLED_ANNOTATION).is_some();
        if !labelled && !annotated {
            continue;
        }
        let patch = json!({
            "metadata": {
                "labels": { UPGRADE_STATE: null },
                "annotations": { UPGRADE_ENABLED_ANNOTATION: null },
            }
        });
        match api
            .patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(node = %node.name, pool = %pool.owner, "automatic driver upgrades are off; state label removed")
            }
            Err(error) => {
                warn!(node = %node.name, %error, "cannot remove the upgrade state label; retrying");
                next = Duration::from_secs(2);
            }
        }
    }
    next
}

/// With no ClusterPolicy, undoes what upgrades left on every node: the state label, the upgrade
/// annotations, and the cordons the upgrade made (see [`gpuop_api::upgrade::release`]). Node changes wake
/// the controller again, so a failed patch is retried on the next change or after a short wait.
async fn release_all(context: &Context) -> Duration {
    let api: Api<Node> = Api::all(context.client.clone());
    let mut next = RESYNC;
    for node in context.caches.nodes.state() {
        let release = release_of(&node);
        if release.is_empty() {
            continue;
        }
        match api
            .patch(
                &node.name,
                &PatchParams::default(),
                &Patch::Merge(release_patch(&release)),
            )
            .await
        {
            Ok(_) => {
                info!(node = %node.name, uncordoned = release.uncordon, "no ClusterPolicy: driver upgrade state removed")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                warn!(node = %node.name, %error, "cannot remove the driver upgrade state; retrying");
                next = Duration::from_secs(2);
            }
        }
    }
    next
}

/// [`gpuop_api::upgrade::release`] of a node.
pub fn release_of(node: &NodeRecord) -> gpuop_api::upgrade::Release {
    gpuop_api::upgrade::release(
        &node.labels.to_map(),
        &node.annotations.to_map(),
        node.unschedulable,
    )
}

/// The merge patch that carries out a release and touches nothing else.
pub fn release_patch(release: &gpuop_api::upgrade::Release) -> Value {
    let nulls = |keys: &[&str]| -> Map<String, Value> {
        keys.iter().map(|k| ((*k).to_owned(), Value::Null)).collect()
    };
    let mut patch = json!({ "metadata": {} });
    if !release.labels.is_empty() {
        patch["metadata"]["labels"] = Value::Object(nulls(&release.labels));
    }
    if !release.annotations.is_empty() {
        patch["metadata"]["annotations"] = Value::Object(nulls(&release.annotations));
    }
    if release.uncordon {
        patch["spec"] = json!({ "unschedulable": false });
    }
    patch
}

fn add(total: &mut UpgradeCounts, counts: &UpgradeCounts) {
    total.managed += counts.managed;
    total.pending += counts.pending;
    total.in_progress += counts.in_progress;
    total.done += counts.done;
    total.failed += counts.failed;
    total.available += counts.available;
    total.unavailable += counts.unavailable;
    total.max_unavailable += counts.max_unavailable;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changes::{NodeSet, PodSet};
    use crate::projection::{Interner, NodeKeys, PodRecord};
    use crate::readiness::tests::{daemonset, node, pod, revision, seeded};
    use gpuop_api::Operand;
    use gpuop_api::labels::COMPONENT;

    /// A driver or validator pod as the upgrade controller reads it.
    fn operand_pod(operand: Operand, node: &str, ready: bool, hash: &str) -> PodRecord {
        let mut pod = pod(operand, node, ready, hash);
        let labels = pod.metadata.labels.get_or_insert_default();
        labels.insert(COMPONENT.to_owned(), operand.info().component.to_owned());
        labels.insert("app".to_owned(), operand.info().daemonset.to_owned());
        PodRecord::project(&pod, &mut Interner::default())
    }

    /// Over random changes of nodes (their state label, cordon), driver and validator pods, revisions and
    /// pools, the kept views stay what views made afresh are; a pass with nothing changed views no node,
    /// and one after one pod changed views that pod's node only.
    #[test]
    fn kept_views_follow_every_change_as_fresh_views_would() {
        let driver = daemonset(Operand::Driver);
        let scope = |held: &[&str]| PoolScope {
            routed_to: None,
            daemonsets: [driver.metadata.name.clone().unwrap()].into(),
            held: held.iter().map(|n| (*n).to_owned()).collect(),
        };
        let mut scopes = vec![scope(&[])];
        let daemonsets = vec![Arc::new(driver.clone())];
        let mut revisions = vec![Arc::new(revision(Operand::Driver, "r1", 1))];
        let mut interner = Interner::default();
        let mut nodes = NodeSet::default();
        let mut pods = PodSet::default();
        let mut next = seeded(4242);
        let states = [
            "",
            "upgrade-done",
            "upgrade-required",
            "cordon-required",
            "pod-restart-required",
        ];
        let mut kept = Kept::default();
        let no_stand_in = |_: &str| None;
        for round in 0..300 {
            let now = 1_000 + round;
            for _ in 0..next(5) + 1 {
                let name = format!("gpu-{:02}", next(50));
                match next(7) {
                    0 => {
                        let state = states[next(states.len())];
                        let labels: Vec<(&str, &str)> = [(UPGRADE_STATE, state)]
                            .into_iter()
                            .filter(|(_, v)| !v.is_empty())
                            .collect();
                        let mut node = node(&name, &labels, None);
                        node.spec.get_or_insert_default().unschedulable = Some(next(3) == 0);
                        nodes.put(NodeRecord::project(&node, &NodeKeys::default(), &mut interner));
                    }
                    1 => {
                        nodes.remove(&name);
                    }
                    2 => {
                        pods.remove(&format!("{}-{name}", Operand::Driver));
                    }
                    3 => {
                        pods.put(operand_pod(Operand::OperatorValidator, &name, next(2) == 0, "v"));
                    }
                    4 if next(6) == 0 => {
                        let number = revisions.len() as i64 + 1;
                        revisions.push(Arc::new(revision(Operand::Driver, &format!("r{number}"), number)));
                    }
                    5 if next(6) == 0 => {
                        scopes = vec![scope(&[&name])];
                    }
                    _ => {
                        let hash = format!("r{}", 1 + next(revisions.len()));
                        pods.put(operand_pod(Operand::Driver, &name, next(3) != 0, &hash));
                    }
                }
            }
            let basis = || Basis {
                scopes: scopes.clone(),
                daemonsets: daemonsets.clone(),
                revisions: revisions.clone(),
            };
            let before = kept.members.first().cloned().unwrap_or_default();
            kept.refresh(&nodes, &pods, basis(), &no_stand_in, BTreeSet::new(), now);
            let mut fresh = Kept::default();
            fresh.refresh(&nodes, &pods, basis(), &no_stand_in, BTreeSet::new(), now);
            assert_eq!(kept.drivers, fresh.drivers, "round {round}");
            assert_eq!(kept.validators, fresh.validators, "round {round}");
            assert_eq!(kept.members.len(), 1);
            let members = &kept.members[0];
            assert_eq!(
                members.keys().collect::<Vec<_>>(),
                fresh.members[0].keys().collect::<Vec<_>>(),
                "round {round}"
            );
            for (name, view) in members {
                // A state seen before counts from when it was first seen.
                let since = match before.get(name) {
                    Some(old) if old.state == view.state => old.state_since,
                    _ => now,
                };
                let fresh = &fresh.members[0][name];
                assert_eq!(view.state_since, since, "round {round}: {name}");
                assert_eq!(
                    NodeView {
                        state_since: now,
                        ..view.clone()
                    },
                    *fresh,
                    "round {round}: {name}"
                );
            }
        }
        assert!(kept.members[0].len() > 10, "the random cluster keeps members");

        let basis = || Basis {
            scopes: scopes.clone(),
            daemonsets: daemonsets.clone(),
            revisions: revisions.clone(),
        };
        let viewed = kept.refresh(&nodes, &pods, basis(), &no_stand_in, BTreeSet::new(), 5_000);
        assert_eq!(viewed, 0, "nothing changed");
        let name = kept.members[0].keys().next().unwrap().clone();
        pods.put(operand_pod(Operand::OperatorValidator, &name, true, "later"));
        let viewed = kept.refresh(&nodes, &pods, basis(), &no_stand_in, BTreeSet::new(), 5_001);
        assert_eq!(viewed, 1, "one pod changed");
        // The driver DaemonSet's status (and resourceVersion) moves as its pods do: no view reads it.
        let mut counted = driver.clone();
        counted.metadata.resource_version = Some("2".to_owned());
        counted.status.get_or_insert_default().number_ready = 7;
        let recounted = || Basis {
            scopes: scopes.clone(),
            daemonsets: vec![Arc::new(counted.clone())],
            revisions: revisions.clone(),
        };
        let viewed = kept.refresh(&nodes, &pods, recounted(), &no_stand_in, BTreeSet::new(), 5_000);
        assert_eq!(viewed, 0, "only the DaemonSet's status changed");
        // Its spec is read (the driver config digest): a new one views every node again.
        let mut respecified = counted.clone();
        respecified.spec.get_or_insert_default().min_ready_seconds = Some(5);
        let respecified = Basis {
            scopes: scopes.clone(),
            daemonsets: vec![Arc::new(respecified)],
            revisions: revisions.clone(),
        };
        let viewed = kept.refresh(&nodes, &pods, respecified, &no_stand_in, BTreeSet::new(), 5_000);
        assert_eq!(viewed, nodes.nodes().len(), "the DaemonSet's spec changed");
    }

    #[test]
    fn a_trimmed_pod_looks_the_same_to_the_eviction_rules() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "train-0", "namespace": "ml",
                "labels": {"app": "train"},
                "annotations": {"kubernetes.io/config.mirror": "x", "big": "y"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train",
                                     "uid": "u", "controller": true}],
                "managedFields": [{"manager": "kubectl"}],
            },
            "spec": {
                "nodeName": "gpu-0",
                "containers": [{"name": "c", "image": "cuda", "env": [{"name": "A", "value": "1"}],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "i", "image": "busybox"}],
                "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let mut trimmed = pod.clone();
        trim_workload_pod(&mut trimmed);
        assert_eq!(workload_pod(&trimmed), workload_pod(&pod));
        assert!(workload_pod(&pod).uses_gpu && workload_pod(&pod).empty_dir && workload_pod(&pod).daemon);
        assert!(trimmed.metadata.managed_fields.is_none());
        assert_eq!(trimmed.spec.as_ref().unwrap().volumes.as_ref().unwrap().len(), 1);
    }
}
