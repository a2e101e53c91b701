//! What a chaos run checks, as pure functions over what it observed: the API server's journal of the
//! operator replicas' requests, the managed objects, the nodes, and the simulated cluster's progress.
//! Times are offsets from the start of the run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use gpuop_api::choice::WorkloadConfig;
use gpuop_api::labels::{COMPONENT, MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_api::placement::daemon_pod_fits;
use gpuop_api::status::{PolicyStatus, State};
use gpuop_api::{ClusterPolicySpec, OPERANDS};
use gpuop_fakeserver::Verb;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde_json::Value;

use crate::progress::{Progress, Row};

/// The invariants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    /// Never two objects for one rendered identity: two DaemonSets of one operand that both place a pod on
    /// one node.
    NoDuplicate,
    /// Never a managed object whose owner is gone, beyond the garbage collector's delay.
    NoOrphan,
    /// Never a label a person set changed by anyone else.
    PersonLabelsKept,
    /// Never a write from a replica that does not hold the Lease.
    OneLeaderWrites,
    /// The operator's writes stay bounded once the cluster is left alone.
    NoHotLoop,
    /// The operator process never exits by itself.
    OperatorStaysUp,
    /// At the end every node runs what it should, or the operator reports why not.
    Converged,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoDuplicate => "no duplicate managed object",
            Self::NoOrphan => "no orphaned managed object",
            Self::PersonLabelsKept => "no person-set label overwritten",
            Self::OneLeaderWrites => "never two leaders writing",
            Self::NoHotLoop => "no hot loop",
            Self::OperatorStaysUp => "the operator stays up",
            Self::Converged => "every node converged or reported",
        })
    }
}

/// An invariant found broken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// When it was found.
    pub at: Duration,
    /// What exactly.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant \"{}\" violated at {:.1}s: {}",
            self.invariant,
            self.at.as_secs_f64(),
            self.detail
        )
    }
}

/// One request of an operator replica, from the API server's journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// When it arrived.
    pub started: Duration,
    /// When it was answered.
    pub finished: Duration,
    /// The replica (its Lease identity).
    pub replica: String,
    /// The verb.
    pub verb: Verb,
    /// Plural resource.
    pub resource: String,
    /// Subresource, or "".
    pub subresource: String,
    /// Namespace, or "".
    pub namespace: String,
    /// Name, or "" for a collection.
    pub name: String,
    /// The answer's code.
    pub code: u16,
}

impl Request {
    /// Whether it is one of the leader election's own requests.
    pub fn is_lease(&self) -> bool {
        self.resource == "leases"
    }

    /// Whether it asks to change the cluster (reviews, which only ask a question, are not).
    pub fn is_write(&self) -> bool {
        self.verb.is_write() && !self.resource.ends_with("reviews")
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        match (self.namespace.as_str(), self.name.as_str()) {
            ("", "") => {}
            ("", name) => write!(f, " {name}")?,
            (namespace, "") => write!(f, " in {namespace}")?,
            (namespace, name) => write!(f, " {namespace}/{name}")?,
        }
        write!(
            f,
            " (answered {}) by {} at {:.2}s",
            self.code,
            self.replica,
            self.started.as_secs_f64()
        )
    }
}

/// Who held the Lease when, from the replicas' successful Lease writes: the only replica that can write a
/// Lease successfully is its holder (creating, renewing or taking it over; the chaos run never lets a
/// replica release it, its kills are `SIGKILL`).
#[derive(Clone, Debug, Default)]
pub struct Leadership {
    /// (from when, holder), in time order.
    changes: Vec<(Duration, String)>,
}

impl Leadership {
    /// The holder at `at`, and since when.
    pub fn holder_at(&self, at: Duration) -> Option<(&str, Duration)> {
        let index = self.changes.partition_point(|(from, _)| *from <= at);
        index
            .checked_sub(1)
            .and_then(|i| self.changes.get(i))
            .map(|(from, holder)| (holder.as_str(), *from))
    }

    /// The holder now.
    pub fn holder(&self) -> Option<&str> {
        self.changes.last().map(|(_, holder)| holder.as_str())
    }

    /// Takes one request, in the order they were answered. Returns the new holder when this request made
    /// one, and the violation when a replica wrote while another held the Lease (or before anyone did).
    pub fn observe(&mut self, request: &Request) -> (Option<String>, Option<Violation>) {
        if request.is_lease() {
            let took = request.is_write()
                && (200..300).contains(&request.code)
                && self.holder() != Some(request.replica.as_str());
            if took {
                self.changes.push((request.finished, request.replica.clone()));
                return (Some(request.replica.clone()), None);
            }
            return (None, None);
        }
        if !request.is_write() {
            return (None, None);
        }
        let detail = match self.holder_at(request.started) {
            Some((holder, _)) if holder == request.replica => return (None, None),
            Some((holder, since)) => format!(
                "{request}, while {holder} held the Lease (since {:.2}s)",
                since.as_secs_f64()
            ),
            None => format!("{request}, before any replica held the Lease"),
        };
        (
            None,
            Some(Violation {
                invariant: Invariant::OneLeaderWrites,
                at: request.finished,
                detail,
            }),
        )
    }
}

/// The operator's requests per second and per target (`PATCH nodes gpu-1`), Lease requests and watches
/// left out (the election's heartbeat, and long-lived streams).
#[derive(Clone, Debug, Default)]
pub struct RequestRate {
    per_second: BTreeMap<u64, BTreeMap<(bool, String), u64>>,
}

impl RequestRate {
    /// Counts a request.
    pub fn observe(&mut self, request: &Request) {
        if request.is_lease() || request.verb == Verb::Watch {
            return;
        }
        let mut target = format!("{} {}", request.verb, request.resource);
        if !request.subresource.is_empty() {
            target = format!("{target}/{}", request.subresource);
        }
        match (request.namespace.as_str(), request.name.as_str()) {
            ("", "") => {}
            ("", name) => target = format!("{target} {name}"),
            (namespace, name) => target = format!("{target} {namespace}/{name}"),
        }
        *self
            .per_second
            .entry(request.started.as_secs())
            .or_default()
            .entry((request.is_write(), target))
            .or_default() += 1;
    }

    /// Requests that started in `[from, to)` (whole seconds), per (is a write, target).
    pub fn between(&self, from: Duration, to: Duration) -> BTreeMap<(bool, String), u64> {
        let mut counts = BTreeMap::new();
        for targets in self
            .per_second
            .range(from.as_secs()..to.as_secs())
            .map(|(_, t)| t)
        {
            for (target, n) in targets {
                *counts.entry(target.clone()).or_default() += n;
            }
        }
        counts
    }

    /// Forgets what started before `before`.
    pub fn forget_before(&mut self, before: Duration) {
        self.per_second = self.per_second.split_off(&before.as_secs());
    }
}

/// How long the cluster must be left alone before the operator's requests are judged.
pub const CALM_AFTER: Duration = Duration::from_secs(20);
/// The window over which the operator's requests are counted once the cluster is calm.
pub const CALM_WINDOW: Duration = Duration::from_secs(10);
/// The most writes to one object in a calm window: an object is written once when the operator catches up
/// late (a retry after a refused write), a status a few times as operands become ready; a loop writes the
/// same object again and again.
pub const CALM_WRITES_PER_OBJECT: u64 = 5;
/// The most reads of one object or collection in a calm window (a relist per informer, a few GETs).
pub const CALM_READS_PER_TARGET: u64 = 10;
/// The most writes in all in a calm window: a whole rollout of the sample policy on a few nodes is about a
/// hundred.
pub const CALM_WRITES: u64 = 300;

/// The hot-loop check at `now`, when nothing was done to the cluster since `last_change`: in the
/// [`CALM_WINDOW`] before `now`, if all of it lies [`CALM_AFTER`] or more after the last change, the
/// operator wrote no object more than [`CALM_WRITES_PER_OBJECT`] times, read nothing more than
/// [`CALM_READS_PER_TARGET`] times, and made at most [`CALM_WRITES`] writes.
pub fn hot_loop(rate: &RequestRate, last_change: Duration, now: Duration) -> Option<Violation> {
    let from = now.checked_sub(CALM_WINDOW)?;
    if from < last_change + CALM_AFTER {
        return None;
    }
    let counts = rate.between(from, now);
    let writes: u64 = counts
        .iter()
        .filter(|((write, _), _)| *write)
        .map(|(_, n)| n)
        .sum();
    let (write, target, n) = counts
        .iter()
        .map(|((write, target), n)| (*write, target, *n))
        .max_by_key(|(write, _, n)| if *write { n * 2 } else { *n })?;
    let limit = if write {
        CALM_WRITES_PER_OBJECT
    } else {
        CALM_READS_PER_TARGET
    };
    let what = if n > limit {
        format!("{target} {n} times (at most {limit} expected)")
    } else if writes > CALM_WRITES {
        format!("{writes} writes (at most {CALM_WRITES} expected)")
    } else {
        return None;
    };
    Some(Violation {
        invariant: Invariant::NoHotLoop,
        at: now,
        detail: format!(
            "{what} from {:.0}s to {:.0}s, {:.0}s and more after the last injected change ({:.1}s)",
            from.as_secs_f64(),
            now.as_secs_f64(),
            CALM_AFTER.as_secs_f64(),
            last_change.as_secs_f64()
        ),
    })
}

/// A managed object (labelled `app.kubernetes.io/managed-by: gpu-operator`), as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct Managed {
    /// Kind.
    pub kind: String,
    /// Namespace, or "".
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `app.kubernetes.io/component`.
    pub component: Option<String>,
    /// Owner references: (kind, name, uid).
    pub owners: Vec<(String, String, String)>,
}

impl Managed {
    /// From a listed object of `kind`; `None` when it is not managed by the operator.
    pub fn from_value(kind: &str, object: &Value) -> Option<Self> {
        let metadata = object.get("metadata")?;
        let label = |key: &str| {
            metadata
                .get("labels")
                .and_then(|labels| labels.get(key))
                .and_then(Value::as_str)
        };
        if label(MANAGED_BY) != Some(MANAGED_BY_VALUE) {
            return None;
        }
        let text = |value: &Value, key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Some(Self {
            kind: kind.to_owned(),
            namespace: text(metadata, "namespace"),
            name: text(metadata, "name"),
            component: label(COMPONENT).map(str::to_owned),
            owners: metadata
                .get("ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|owner| (text(owner, "kind"), text(owner, "name"), text(owner, "uid")))
                .collect(),
        })
    }

    fn describe(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Nodes on which two managed DaemonSets of one operand would each run a pod.
pub fn duplicates(daemonsets: &[DaemonSet], nodes: &[Node]) -> Vec<String> {
    let mut by_component: BTreeMap<&str, Vec<&DaemonSet>> = BTreeMap::new();
    for ds in daemonsets {
        let labels = ds.labels();
        if labels.get(MANAGED_BY).map(String::as_str) != Some(MANAGED_BY_VALUE) {
            continue;
        }
        if let Some(component) = labels.get(COMPONENT) {
            by_component.entry(component).or_default().push(ds);
        }
    }
    let mut found = Vec::new();
    for (component, sets) in by_component.iter().filter(|(_, sets)| sets.len() > 1) {
        for node in nodes {
            let fitting: Vec<String> = sets
                .iter()
                .filter(|ds| {
                    ds.spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .is_some_and(|spec| daemon_pod_fits(node, spec).is_ok())
                })
                .map(|ds| ds.name_any())
                .collect();
            if fitting.len() > 1 {
                found.push(format!(
                    "DaemonSets {} of operand {component} would both run on node {}",
                    fitting.join(" and "),
                    node.name_any()
                ));
            }
        }
    }
    found
}

/// Managed objects whose owners are all gone. `live` holds the uids of every object of the kinds in
/// `judged`; an owner of another kind is not judged.
pub fn orphans(objects: &[Managed], live: &BTreeSet<String>, judged: &BTreeSet<String>) -> Vec<String> {
    objects
        .iter()
        .filter(|object| {
            !object.owners.is_empty()
                && object
                    .owners
                    .iter()
                    .all(|(kind, _, uid)| judged.contains(kind) && !live.contains(uid))
        })
        .map(|object| {
            let owners: Vec<String> = object
                .owners
                .iter()
                .map(|(kind, name, uid)| format!("{kind} {name} (uid {uid})"))
                .collect();
            format!(
                "{} is owned by {}, which is gone",
                object.describe(),
                owners.join(", ")
            )
        })
        .collect()
}

/// Problems that may appear for a moment (a prune follows an apply; the garbage collector follows a
/// deletion) and are violations only when they last: when each was first seen.
#[derive(Clone, Debug, Default)]
pub struct Lasting {
    first_seen: BTreeMap<String, Duration>,
}

impl Lasting {
    /// Takes the problems seen at `now`; returns the first that has lasted longer than `grace`, and since
    /// when it has been seen.
    pub fn observe(
        &mut self,
        now: Duration,
        problems: Vec<String>,
        grace: Duration,
    ) -> Option<(String, Duration)> {
        let current: BTreeSet<String> = problems.into_iter().collect();
        self.first_seen.retain(|problem, _| current.contains(problem));
        for problem in current {
            self.first_seen.entry(problem).or_insert(now);
        }
        self.first_seen
            .iter()
            .find(|(_, since)| now.saturating_sub(**since) > grace)
            .map(|(problem, since)| (problem.clone(), *since))
    }

    /// Problems seen now, whatever their age.
    pub fn current(&self) -> impl Iterator<Item = &String> {
        self.first_seen.keys()
    }
}

/// The node labels a person set, which nobody else may change.
#[derive(Clone, Debug, Default)]
pub struct PersonLabels {
    set: BTreeMap<(String, String), String>,
}

impl PersonLabels {
    /// A person set `key=value` on `node`.
    pub fn record(&mut self, node: &str, key: &str, value: &str) {
        self.set
            .insert((node.to_owned(), key.to_owned()), value.to_owned());
    }

    /// The node left: its labels are gone with it.
    pub fn forget_node(&mut self, node: &str) {
        self.set.retain(|(at, _), _| at != node);
    }

    /// The first person-set label that a node in `nodes` no longer has, with the field managers that now
    /// own the label (from the node's managed fields). `person` is the person's field manager.
    pub fn overwritten(&self, nodes: &[Node], person: &str) -> Option<String> {
        let by_name: BTreeMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), n)).collect();
        for ((node, key), value) in &self.set {
            let Some(live) = by_name.get(node) else {
                continue;
            };
            let now = live.labels().get(key);
            if now == Some(value) {
                continue;
            }
            let owners: Vec<String> = live
                .managed_fields()
                .iter()
                .filter(|entry| entry.manager.as_deref() != Some(person))
                .filter(|entry| {
                    entry
                        .fields_v1
                        .as_ref()
                        .and_then(|fields| fields.0.get("f:metadata"))
                        .and_then(|metadata| metadata.get("f:labels"))
                        .is_some_and(|labels| labels.get(format!("f:{key}")).is_some())
                })
                .map(|entry| {
                    format!(
                        "{} ({})",
                        entry.manager.as_deref().unwrap_or("unknown manager"),
                        entry.operation.as_deref().unwrap_or("unknown operation")
                    )
                })
                .collect();
            return Some(format!(
                "node {node} label {key}: a person set {value:?}, it is now {}; field managers of the label: {}",
                now.map_or("removed".to_owned(), |v| format!("{v:?}")),
                if owners.is_empty() {
                    "none other than the person".to_owned()
                } else {
                    owners.join(", ")
                }
            ));
        }
        None
    }
}

/// What the end of a run is judged on.
#[derive(Debug)]
pub struct EndState<'a> {
    /// Per node, its operands' progress (the simulator's own view).
    pub rows: &'a [Row],
    /// The ClusterPolicy's status.
    pub status: Option<&'a PolicyStatus>,
    /// The ClusterPolicy's generation.
    pub generation: Option<i64>,
    /// The ClusterPolicy's spec.
    pub spec: Option<&'a ClusterPolicySpec>,
    /// Managed DaemonSets in the operator's namespace: (component label, name, images of their containers).
    pub daemonsets: &'a [(String, String, Vec<String>)],
    /// The image a person's edit sets.
    pub edited_image: &'a str,
}

/// The components (`app.kubernetes.io/component`) of the DaemonSets a policy calls for on container GPU
/// nodes, from the operand catalogue: what must exist whatever a person deleted.
pub fn expected_components(spec: &ClusterPolicySpec) -> Vec<&'static str> {
    OPERANDS
        .iter()
        .filter(|info| (info.enabled)(spec))
        .filter(|info| {
            info.placements
                .iter()
                .any(|p| p.workload == WorkloadConfig::Container)
        })
        .map(|info| info.component)
        .collect()
}

/// Why the cluster has not converged: a DaemonSet the policy calls for that is missing, every node that
/// does not run what it should and is not reported so in the ClusterPolicy status, a status that
/// disagrees with the nodes, and managed DaemonSets that still carry a person's edit. Empty when
/// converged.
pub fn unconverged(end: &EndState<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(status) = end.status else {
        return vec!["the ClusterPolicy has no status".to_owned()];
    };
    if let Some(spec) = end.spec {
        for component in expected_components(spec) {
            if !end.daemonsets.iter().any(|(c, _, _)| c == component) {
                problems.push(format!(
                    "the policy calls for the DaemonSet of {component} and there is none"
                ));
            }
        }
    }
    let operands = status.operands.as_deref().unwrap_or_default();
    // The status lists at most 20 nodes per operand; a full list with more not ready is a report too.
    let reported = |operand: &str, node: &String| {
        operands.iter().any(|o| {
            let names = o.not_ready_nodes.as_deref().unwrap_or_default();
            o.name == operand && (names.contains(node) || (names.len() >= 20 && o.expected - o.ready > 20))
        })
    };
    let mut all_converged = true;
    for row in end.rows {
        let failing: Vec<String> = row
            .operands
            .iter()
            .filter(|(_, progress)| *progress != Progress::Ready)
            .filter(|(operand, _)| !reported(operand.id(), &row.node))
            .map(|(operand, progress)| format!("{} {progress:?}", operand.id()))
            .collect();
        all_converged &= row.converged();
        if !failing.is_empty() {
            problems.push(format!(
                "node {}: {} not ready and not reported in the ClusterPolicy status",
                row.node,
                failing.join(", ")
            ));
        }
        if let Some(why) = &row.excluded {
            let excluded = operands.iter().any(|o| {
                o.excluded_nodes
                    .as_deref()
                    .unwrap_or_default()
                    .contains(&row.node)
            });
            if !excluded {
                problems.push(format!(
                    "node {}: operands excluded ({why}) and no operand's excludedNodes names it",
                    row.node
                ));
            }
        }
    }
    match (all_converged, status.state) {
        (true, State::Ready) | (false, State::NotReady) => {}
        (true, state) => problems.push(format!(
            "every node runs its operands, but the ClusterPolicy status is {state:?}"
        )),
        (false, state) => problems.push(format!(
            "the ClusterPolicy status is {state:?} while some node does not run its operands"
        )),
    }
    if end.generation.is_some() && status.observed_generation != end.generation {
        problems.push(format!(
            "the ClusterPolicy status describes generation {:?}, its spec is at {:?}",
            status.observed_generation, end.generation
        ));
    }
    for (_, name, images) in end.daemonsets {
        if images.iter().any(|image| image == end.edited_image) {
            problems.push(format!(
                "DaemonSet {name} still runs the image a person set ({}): the operator did not repair the drift",
                end.edited_image
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::Operand;
    use gpuop_api::status::OperandStatus;
    use gpuop_testkit::fixture;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn request(replica: &str, verb: Verb, resource: &str, started: f64, code: u16) -> Request {
        Request {
            started: secs(started),
            finished: secs(started + 0.01),
            replica: replica.into(),
            verb,
            resource: resource.into(),
            subresource: String::new(),
            namespace: "gpu-operator".into(),
            name: "x".into(),
            code,
        }
    }

    #[test]
    fn a_write_after_another_replica_took_the_lease_is_two_leaders_writing() {
        let mut leadership = Leadership::default();
        let lease = |replica, at| request(replica, Verb::Update, "leases", at, 200);
        assert_eq!(leadership.observe(&lease("a", 1.0)).0.as_deref(), Some("a"));
        assert_eq!(
            leadership.observe(&lease("a", 3.0)).0,
            None,
            "a renewal changes nothing"
        );
        assert!(
            leadership
                .observe(&request("a", Verb::Apply, "daemonsets", 4.0, 200))
                .1
                .is_none()
        );
        // b's refused takeover changes nothing.
        assert_eq!(
            leadership
                .observe(&request("b", Verb::Update, "leases", 5.0, 409))
                .0,
            None
        );
        assert!(
            leadership
                .observe(&request("a", Verb::Patch, "nodes", 6.0, 200))
                .1
                .is_none()
        );
        assert_eq!(leadership.observe(&lease("b", 20.0)).0.as_deref(), Some("b"));
        assert!(
            leadership
                .observe(&request("b", Verb::Patch, "nodes", 20.5, 200))
                .1
                .is_none()
        );
        // a's write that arrived before b's takeover is a's; one that arrived after is not.
        assert!(
            leadership
                .observe(&request("a", Verb::Patch, "nodes", 19.9, 200))
                .1
                .is_none()
        );
        let violation = leadership
            .observe(&request("a", Verb::Patch, "nodes", 21.0, 500))
            .1
            .expect("violation");
        assert_eq!(violation.invariant, Invariant::OneLeaderWrites);
        assert!(
            violation
                .detail
                .contains("PATCH nodes gpu-operator/x (answered 500) by a at 21.00s")
                && violation.detail.contains("while b held the Lease (since 20.01s)"),
            "{}",
            violation.detail
        );
        // Reads by anyone are fine; a write before any election is not.
        assert!(
            leadership
                .observe(&request("a", Verb::List, "nodes", 22.0, 200))
                .1
                .is_none()
        );
        let mut fresh = Leadership::default();
        let early = fresh
            .observe(&request("a", Verb::Apply, "daemonsets", 0.5, 200))
            .1;
        assert!(early.is_some_and(|v| v.detail.contains("before any replica held the Lease")));
        let review = request("a", Verb::Create, "selfsubjectaccessreviews", 0.5, 201);
        assert!(
            fresh.observe(&review).1.is_none(),
            "a review asks, it does not write"
        );
    }

    #[test]
    fn a_hot_loop_is_one_object_written_again_and_again_in_a_calm_window() {
        let mut rate = RequestRate::default();
        // A late rollout: many objects, each written once.
        for i in 0..40 {
            let mut apply = request("a", Verb::Apply, "configmaps", 40.0 + f64::from(i) * 0.1, 200);
            apply.name = format!("c{i}");
            rate.observe(&apply);
            rate.observe(&request(
                "a",
                Verb::Update,
                "leases",
                40.0 + f64::from(i) * 0.1,
                200,
            ));
        }
        assert!(
            hot_loop(&rate, secs(5.0), secs(50.0)).is_none(),
            "each object once is no loop"
        );
        // One node patched every 0.3 s.
        for i in 0..30 {
            rate.observe(&request(
                "a",
                Verb::Patch,
                "nodes",
                60.0 + f64::from(i) * 0.3,
                200,
            ));
        }
        assert!(
            hot_loop(&rate, secs(5.0), secs(30.0)).is_none(),
            "nothing in 20..30"
        );
        assert!(
            hot_loop(&rate, secs(45.0), secs(70.0)).is_none(),
            "not judged within {CALM_AFTER:?} of a change"
        );
        let violation = hot_loop(&rate, secs(5.0), secs(70.0)).expect("a loop in 60..70");
        assert_eq!(violation.invariant, Invariant::NoHotLoop);
        assert!(
            violation
                .detail
                .starts_with("PATCH nodes gpu-operator/x 30 times (at most 5 expected) from 60s to 70s"),
            "{}",
            violation.detail
        );
        // Reads of one collection over and over are a loop too; lease requests never count.
        let mut reads = RequestRate::default();
        for i in 0..20 {
            reads.observe(&request(
                "a",
                Verb::List,
                "daemonsets",
                60.0 + f64::from(i) * 0.4,
                200,
            ));
            reads.observe(&request("a", Verb::Get, "leases", 60.0 + f64::from(i) * 0.4, 200));
        }
        let violation = hot_loop(&reads, secs(5.0), secs(70.0)).expect("a read loop");
        assert!(
            violation
                .detail
                .starts_with("LIST daemonsets gpu-operator/x 20 times (at most 10"),
            "{}",
            violation.detail
        );
        reads.forget_before(secs(70.0));
        assert!(reads.between(secs(0.0), secs(100.0)).is_empty());
    }

    fn gpu_node(name: &str, taint: Option<&str>) -> Node {
        fixture::node(name)
            .labels(&[("gpu", "true")])
            .no_schedule(taint)
            .build()
    }

    fn daemonset(name: &str, component: &str, tolerates: Option<&str>) -> DaemonSet {
        let daemonset = fixture::daemonset(name)
            .labels(&[(MANAGED_BY, MANAGED_BY_VALUE), (COMPONENT, component)])
            .node_selector(&[("gpu", "true")]);
        match tolerates {
            Some(key) => daemonset.tolerate(key),
            None => daemonset,
        }
        .build()
    }

    #[test]
    fn two_daemonsets_of_one_operand_on_one_node_are_a_duplicate() {
        let nodes = [gpu_node("n1", None), gpu_node("n2", Some("pool-b"))];
        let single = [daemonset("driver-a", "nvidia-driver", None)];
        assert!(duplicates(&single, &nodes).is_empty());
        // Two driver pools, each on its own nodes: no duplicate.
        let pools = [
            daemonset("driver-a", "nvidia-driver", None),
            daemonset("driver-b", "nvidia-driver", Some("pool-b")),
        ];
        assert_eq!(
            duplicates(&pools, &nodes),
            ["DaemonSets driver-a and driver-b of operand nvidia-driver would both run on node n1"]
        );
        let others = [
            daemonset("driver-a", "nvidia-driver", None),
            daemonset("plugin", "device-plugin", None),
        ];
        assert!(duplicates(&others, &nodes).is_empty());
    }

    #[test]
    fn an_object_whose_judged_owners_are_all_gone_is_an_orphan() {
        let object = |owners: Vec<(&str, &str)>| {
            Managed::from_value(
                "ConfigMap",
                &json!({"metadata": {
                    "name": "c", "namespace": "gpu-operator",
                    "labels": {MANAGED_BY: MANAGED_BY_VALUE, COMPONENT: "device-plugin"},
                    "ownerReferences": owners.iter().map(|(kind, uid)| json!({"kind": kind, "name": "cluster-policy", "uid": uid})).collect::<Vec<_>>(),
                }}),
            )
            .expect("managed")
        };
        let judged: BTreeSet<String> = ["ClusterPolicy".to_owned()].into();
        let live: BTreeSet<String> = ["u1".to_owned()].into();
        assert!(orphans(&[object(vec![("ClusterPolicy", "u1")])], &live, &judged).is_empty());
        assert_eq!(
            orphans(&[object(vec![("ClusterPolicy", "u0")])], &live, &judged),
            ["ConfigMap gpu-operator/c is owned by ClusterPolicy cluster-policy (uid u0), which is gone"]
        );
        assert!(
            orphans(&[object(vec![("Widget", "u0")])], &live, &judged).is_empty(),
            "not judged"
        );
        assert!(orphans(&[object(vec![])], &live, &judged).is_empty());
        let unmanaged = json!({"metadata": {"name": "c", "labels": {MANAGED_BY: "helm"}}});
        assert_eq!(Managed::from_value("ConfigMap", &unmanaged), None);
    }

    #[test]
    fn a_problem_counts_only_once_it_lasts_past_the_grace() {
        let mut lasting = Lasting::default();
        let grace = secs(10.0);
        assert_eq!(lasting.observe(secs(1.0), vec!["p".into()], grace), None);
        assert_eq!(lasting.observe(secs(5.0), vec![], grace), None, "gone: forgotten");
        assert_eq!(lasting.observe(secs(6.0), vec!["p".into()], grace), None);
        assert_eq!(
            lasting.observe(secs(16.5), vec!["p".into()], grace),
            Some(("p".to_owned(), secs(6.0)))
        );
    }

    fn labelled(node: &str, labels: &[(&str, &str)], manager_of: Option<(&str, &str)>) -> Node {
        let mut node = fixture::node(node).labels(labels).build();
        node.metadata.managed_fields = manager_of.map(|(manager, key)| {
            vec![ManagedFieldsEntry {
                manager: Some(manager.into()),
                operation: Some("Update".into()),
                fields_v1: Some(FieldsV1(
                    json!({"f:metadata": {"f:labels": {format!("f:{key}"): {}}}}),
                )),
                ..ManagedFieldsEntry::default()
            }]
        });
        node
    }

    #[test]
    fn a_person_set_label_changed_by_another_manager_is_named() {
        let key = "nvidia.com/gpu.deploy.dcgm-exporter";
        let mut person = PersonLabels::default();
        person.record("n1", key, "false");
        assert_eq!(
            person.overwritten(&[labelled("n1", &[(key, "false")], None)], "person"),
            None
        );
        let changed = person
            .overwritten(
                &[labelled("n1", &[(key, "true")], Some(("gpu-operator", key)))],
                "person",
            )
            .expect("overwritten");
        assert_eq!(
            changed,
            format!(
                "node n1 label {key}: a person set \"false\", it is now \"true\"; field managers of the label: gpu-operator (Update)"
            )
        );
        let removed = person
            .overwritten(&[labelled("n1", &[], None)], "person")
            .expect("removed");
        assert!(removed.contains("it is now removed"), "{removed}");
        person.forget_node("n1");
        assert_eq!(person.overwritten(&[labelled("n1", &[], None)], "person"), None);
    }

    fn row(node: &str, operands: Vec<(Operand, Progress)>) -> Row {
        Row {
            node: node.into(),
            advertised: "8 nvidia.com/gpu".into(),
            operands,
            excluded: None,
        }
    }

    fn status(state: State, not_ready: &[&str]) -> PolicyStatus {
        PolicyStatus {
            state,
            namespace: None,
            conditions: None,
            observed_generation: Some(2),
            operands: Some(vec![OperandStatus {
                name: "driver".into(),
                expected: 2,
                ready: 2 - i32::try_from(not_ready.len()).unwrap_or(0),
                not_ready_nodes: Some(not_ready.iter().map(|n| (*n).to_owned()).collect()),
                excluded_nodes: None,
            }]),
        }
    }

    #[test]
    fn a_node_that_is_not_ready_must_be_reported_and_the_status_must_agree() {
        let driver = Operand::Driver;
        let ready = [
            row("n1", vec![(driver, Progress::Ready)]),
            row("n2", vec![(driver, Progress::Ready)]),
        ];
        let failing = [
            row("n1", vec![(driver, Progress::Ready)]),
            row("n2", vec![(driver, Progress::Failing("CrashLoopBackOff".into()))]),
        ];
        fn end<'a>(rows: &'a [Row], status: &'a PolicyStatus) -> EndState<'a> {
            EndState {
                rows,
                status: Some(status),
                generation: Some(2),
                spec: None,
                daemonsets: &[],
                edited_image: "edited",
            }
        }
        let status_ready = status(State::Ready, &[]);
        let reported = status(State::NotReady, &["n2"]);
        let unreported = status(State::NotReady, &[]);
        let (ready, failing) = (&ready[..], &failing[..]);
        let (status_ready, reported, unreported) = (&status_ready, &reported, &unreported);
        assert!(unconverged(&end(ready, status_ready)).is_empty());
        assert!(
            unconverged(&end(failing, reported)).is_empty(),
            "reported with a reason"
        );
        assert_eq!(
            unconverged(&end(failing, unreported)),
            [
                "node n2: driver Failing(\"CrashLoopBackOff\") not ready and not reported in the ClusterPolicy status"
            ]
        );
        assert_eq!(
            unconverged(&end(ready, reported)),
            ["every node runs its operands, but the ClusterPolicy status is NotReady"]
        );
        let mut stale = end(ready, status_ready);
        stale.generation = Some(3);
        assert_eq!(
            unconverged(&stale),
            ["the ClusterPolicy status describes generation Some(2), its spec is at Some(3)"]
        );
        let edited = [(
            "device-plugin".to_owned(),
            "nvidia-device-plugin-daemonset".to_owned(),
            vec!["edited".to_owned()],
        )];
        let mut drifted = end(ready, status_ready);
        drifted.daemonsets = &edited;
        assert_eq!(
            unconverged(&drifted),
            [
                "DaemonSet nvidia-device-plugin-daemonset still runs the image a person set (edited): the operator did not repair the drift"
            ]
        );
        // A DaemonSet the policy calls for, deleted and not put back.
        let spec = ClusterPolicySpec::default();
        let expected = expected_components(&spec);
        assert!(
            expected.contains(&"device-plugin") && expected.contains(&"nvidia-driver"),
            "{expected:?}"
        );
        assert!(
            !expected.contains(&"vfio-manager"),
            "VM operands are not for container nodes"
        );
        let present: Vec<(String, String, Vec<String>)> = expected
            .iter()
            .filter(|c| **c != "device-plugin")
            .map(|c| ((*c).to_owned(), format!("ds-{c}"), Vec::new()))
            .collect();
        let mut missing = end(ready, status_ready);
        missing.spec = Some(&spec);
        missing.daemonsets = &present;
        assert_eq!(
            unconverged(&missing),
            ["the policy calls for the DaemonSet of device-plugin and there is none"]
        );
    }
}
