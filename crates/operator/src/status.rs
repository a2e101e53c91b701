//! The ClusterPolicy status, as a pure function of what the operator observed: per operand, on which nodes
//! it should run and on which it is ready; overall, NVIDIA's `state` and its `Ready`/`Error` condition pair
//! with NVIDIA's reason strings.
//!
//! Where NVIDIA's status misleads, this one does not: an operand that fits no GPU node is not "ready" but
//! reported with the nodes it excludes; not-ready operands are not errors (`Error` stays false, so alerts
//! on it mean a real failure); and every not-ready operand names (up to 20 of) its nodes.

use std::collections::BTreeSet;

use gpuop_api::status::{
    CONDITION_ERROR, CONDITION_READY, MAX_LISTED_NODES, OperandStatus, PolicyStatus, State, reason,
};
use gpuop_api::{FieldError, Operand};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::facts::Census;

/// What the operator observed about one enabled operand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperandObservation {
    /// The operand (its catalogue id is the status name).
    pub operand: Option<Operand>,
    /// How many nodes its DaemonSets should run on: the deploy switch is on, the selectors match, taints
    /// are tolerated.
    pub expected: usize,
    /// Of those, how many run its pod, ready.
    pub ready: usize,
    /// Of the others, the first [`MAX_LISTED_NODES`] by name (all the status lists).
    pub not_ready: Vec<String>,
    /// GPU nodes with its deploy switch on that its pods cannot go to (an untolerated taint, a selector).
    pub excluded: BTreeSet<String>,
}

/// A step of the pass that failed, as the status tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The `Error` condition's reason: the API's (`Forbidden`, `Invalid`, `NotFound`, ...) or the step's
    /// own (`RenderFailed`).
    pub reason: String,
    /// What failed, naming the object, and what was held back because of it.
    pub message: String,
}

/// What the last reconcile amounted to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The policy was applied; readiness is in the observations.
    Applied {
        /// Every enabled operand, in catalogue order.
        operands: Vec<OperandObservation>,
        /// GPU and NFD census of the nodes.
        census: Census,
        /// Steps that failed while the rest went ahead (refused writes, resources that cannot be watched);
        /// any makes the policy `notReady` with `Error=True`.
        failures: Vec<Failure>,
    },
    /// The policy is invalid: nothing was applied and running operands were left alone.
    Invalid(Vec<FieldError>),
    /// A step the whole pass depends on failed (facts, render): nothing was applied or pruned.
    Failed(Failure),
    /// Another ClusterPolicy is the active one.
    Ignored {
        /// Name of the active ClusterPolicy.
        active: String,
        /// Why this one cannot be read, when it does not decode.
        unreadable: Option<String>,
    },
}

/// Most node names an event note lists per operand; the condition lists [`MAX_LISTED_NODES`].
pub const EVENT_LISTED_NODES: usize = 3;
/// The longest event note kube-apiserver accepts, in bytes.
pub const EVENT_NOTE_LIMIT: usize = 1024;
/// The longest condition message kube-apiserver accepts for a `metav1.Condition`, in bytes.
pub const CONDITION_MESSAGE_LIMIT: usize = 32 * 1024;

/// The status to write, keeping the transition times of conditions that did not change.
///
/// `ready` needs proof: every GPU node carries the labels the labeller wants (so the operands that should
/// run there are known) and every operand is ready on every node that should run it. Until the caches show
/// both, the state is `notReady`, never a `ready` that a pipeline waiting for it would believe.
pub fn policy_status(
    outcome: &Outcome,
    namespace: &str,
    generation: Option<i64>,
    previous: Option<&PolicyStatus>,
    now: &Time,
) -> PolicyStatus {
    let (state, ready, error, operands) = match outcome {
        Outcome::Applied {
            operands,
            census,
            failures,
        } => {
            let statuses: Vec<OperandStatus> = operands.iter().filter_map(operand_status).collect();
            match failures.first() {
                None => {
                    let (state, (ready, reason, message)) =
                        readiness(operands, &statuses, census, MAX_LISTED_NODES);
                    (
                        state,
                        (ready, reason.to_owned(), message),
                        (false, reason::READY.to_owned(), String::new()),
                        Some(statuses),
                    )
                }
                // What runs is still counted per operand; the conditions say what failed.
                Some(first) => (
                    State::NotReady,
                    (false, reason::RECONCILE_FAILED.to_owned(), failure(outcome)),
                    (true, first.reason.clone(), failure(outcome)),
                    Some(statuses),
                ),
            }
        }
        // `Ready` says why too (NVIDIA leaves it at reason `Error` with no message): it is the condition
        // people and `kubectl wait` read first.
        Outcome::Invalid(_) => (
            State::NotReady,
            (false, reason::RECONCILE_FAILED.to_owned(), failure(outcome)),
            (true, reason::RECONCILE_FAILED.to_owned(), failure(outcome)),
            None,
        ),
        Outcome::Failed(failed) => (
            State::NotReady,
            (false, reason::RECONCILE_FAILED.to_owned(), failure(outcome)),
            (true, failed.reason.clone(), failure(outcome)),
            previous.and_then(|p| p.operands.clone()),
        ),
        Outcome::Ignored { active, unreadable } => {
            let message =
                format!("ClusterPolicy {active:?} is the active one (the oldest); this one is ignored");
            let error = match unreadable {
                None => (false, reason::READY.to_owned(), String::new()),
                Some(why) => (
                    true,
                    reason::RECONCILE_FAILED.to_owned(),
                    bounded(
                        &format!("this ClusterPolicy cannot be read: {why}"),
                        CONDITION_MESSAGE_LIMIT,
                    ),
                ),
            };
            (
                State::Ignored,
                (false, "Ignored".to_owned(), message),
                error,
                None,
            )
        }
    };
    let previous_conditions = previous.and_then(|p| p.conditions.as_deref()).unwrap_or_default();
    let conditions = vec![
        condition(
            CONDITION_READY,
            (ready.0, &ready.1, ready.2),
            generation,
            previous_conditions,
            now,
        ),
        condition(
            CONDITION_ERROR,
            (error.0, &error.1, error.2),
            generation,
            previous_conditions,
            now,
        ),
    ];
    PolicyStatus {
        state,
        namespace: Some(namespace.to_owned()),
        conditions: Some(conditions),
        observed_generation: generation,
        operands,
    }
}

/// The status of an NVIDIADriver: `disabled` while the ClusterPolicy keeps the driver, an error when it is
/// invalid or cannot be rendered, `notReady` while nodes it selects are shared with another NVIDIADriver or
/// its driver is not ready on every node routed to it, else `ready`. `observation` is its driver's.
pub fn driver_status(
    outcome: &crate::drivers::DriverOutcome,
    observation: Option<&OperandObservation>,
    namespace: &str,
    generation: Option<i64>,
    previous: Option<&PolicyStatus>,
    now: &Time,
) -> PolicyStatus {
    use crate::drivers::DriverOutcome;
    let no_error = (false, reason::READY, String::new());
    let (state, ready, error, operands) = match outcome {
        DriverOutcome::Disabled => (
            State::Disabled,
            (false, reason::ERROR, String::new()),
            (
                true,
                reason::RECONCILE_FAILED,
                "useNvidiaDriverCRD is not enabled in the ClusterPolicy: the ClusterPolicy manages the driver"
                    .to_owned(),
            ),
            None,
        ),
        DriverOutcome::Invalid(errors) => {
            let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
            let message = format!(
                "the NVIDIADriver is invalid and was not applied; running drivers are unchanged: {}",
                problems.join("; ")
            );
            (
                State::NotReady,
                (false, reason::ERROR, String::new()),
                (true, reason::RECONCILE_FAILED, bounded(&message, CONDITION_MESSAGE_LIMIT)),
                None,
            )
        }
        DriverOutcome::Failed(message) => (
            State::NotReady,
            (false, reason::ERROR, String::new()),
            (true, reason::RECONCILE_FAILED, bounded(message, CONDITION_MESSAGE_LIMIT)),
            previous.and_then(|p| p.operands.clone()),
        ),
        DriverOutcome::Rendered { problems, failures } => {
            let statuses: Vec<OperandStatus> = observation.and_then(operand_status).into_iter().collect();
            let not_ready = statuses.iter().find(|s| s.ready < s.expected);
            let failed = upgrade_failures(failures, MAX_LISTED_NODES);
            let ready = if !problems.is_empty() {
                let message = format!(
                    "nodes it selects get no new driver (their running driver is left alone): {}",
                    problems.join("; ")
                );
                (
                    false,
                    reason::CONFLICTING_NODE_SELECTOR,
                    bounded(&message, CONDITION_MESSAGE_LIMIT),
                )
            } else if not_ready.is_some() || failed.is_some() {
                let waiting: Vec<String> = failed
                    .into_iter()
                    .chain(not_ready.map(|status| describe(status, MAX_LISTED_NODES)))
                    .collect();
                (
                    false,
                    reason::DRIVER_NOT_READY,
                    bounded(&format!("not ready: {}", waiting.join("; ")), CONDITION_MESSAGE_LIMIT),
                )
            } else {
                let nodes = statuses.first().map_or(0, |s| s.expected);
                (
                    true,
                    reason::RECONCILED,
                    format!("the driver is ready on all {nodes} node(s) routed to this NVIDIADriver"),
                )
            };
            let state = if ready.0 { State::Ready } else { State::NotReady };
            (state, ready, no_error, Some(statuses))
        }
    };
    let previous_conditions = previous.and_then(|p| p.conditions.as_deref()).unwrap_or_default();
    PolicyStatus {
        state,
        namespace: Some(namespace.to_owned()),
        conditions: Some(vec![
            condition(CONDITION_READY, ready, generation, previous_conditions, now),
            condition(CONDITION_ERROR, error, generation, previous_conditions, now),
        ]),
        observed_generation: generation,
        operands,
    }
}

/// Whether `b` tells a reader nothing `a` did not, but for counts, node lists and messages: the same
/// generation, state, and conditions with the same status and reason. Such a write can wait a moment.
pub fn only_counts_differ(a: &PolicyStatus, b: &PolicyStatus) -> bool {
    fn outline(status: &PolicyStatus) -> Vec<(&str, &str, &str)> {
        status
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect()
    }
    a.state == b.state && a.observed_generation == b.observed_generation && outline(a) == outline(b)
}

/// What the Event for a change of state says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// A `Warning` event rather than a `Normal` one.
    pub warning: bool,
    /// The condition's reason.
    pub reason: String,
    /// The note: the condition's message, shortened to a few node names per operand and to what
    /// kube-apiserver accepts ([`EVENT_NOTE_LIMIT`]).
    pub note: String,
}

/// The event for a change of state to `status`, which `outcome` produced.
pub fn transition(outcome: &Outcome, status: &PolicyStatus) -> Transition {
    let condition = |type_: &str| status.conditions.iter().flatten().find(|c| c.type_ == type_);
    let (warning, reason, note) = match outcome {
        Outcome::Applied {
            operands,
            census,
            failures,
        } => match failures.first() {
            None => {
                let statuses = status.operands.as_deref().unwrap_or_default();
                let (_, (_, reason, note)) = readiness(operands, statuses, census, EVENT_LISTED_NODES);
                (false, reason.to_owned(), note)
            }
            Some(first) => (true, first.reason.clone(), failure(outcome)),
        },
        Outcome::Invalid(_) => (true, reason::RECONCILE_FAILED.to_owned(), failure(outcome)),
        Outcome::Failed(failed) => (true, failed.reason.clone(), failure(outcome)),
        Outcome::Ignored { .. } => {
            let ready = condition(CONDITION_READY);
            (
                false,
                ready.map(|c| c.reason.clone()).unwrap_or_default(),
                ready.map(|c| c.message.clone()).unwrap_or_default(),
            )
        }
    };
    Transition {
        warning,
        reason,
        note: bounded(&note, EVENT_NOTE_LIMIT),
    }
}

/// The event a ClusterPolicy's new status calls for: one when its state or its `Error` condition changes
/// from `before` (the status it replaces).
pub fn policy_event(
    outcome: &Outcome,
    before: Option<&PolicyStatus>,
    after: &PolicyStatus,
) -> Option<Transition> {
    let changed = before.map(|b| b.state) != Some(after.state)
        || condition_of(before, CONDITION_ERROR) != condition_of(Some(after), CONDITION_ERROR);
    changed.then(|| transition(outcome, after))
}

/// The event an NVIDIADriver's new status calls for: one when its `Ready` condition changes from `before`;
/// a warning when it says the driver failed, not merely that it is not ready yet.
pub fn driver_event(before: Option<&PolicyStatus>, after: &PolicyStatus) -> Option<Transition> {
    if condition_of(before, CONDITION_READY) == condition_of(Some(after), CONDITION_READY) {
        return None;
    }
    let ready = after
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == CONDITION_READY)?;
    let note = if ready.message.is_empty() {
        "the ClusterPolicy manages the driver"
    } else {
        &ready.message
    };
    Some(Transition {
        warning: ready.status != "True" && ready.reason != reason::DRIVER_NOT_READY,
        reason: ready.reason.clone(),
        note: bounded_note(note),
    })
}

/// The status and reason of a status's condition of this type.
fn condition_of<'a>(status: Option<&'a PolicyStatus>, type_: &str) -> Option<(&'a str, &'a str)> {
    status?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// The state and the `Ready` condition of an applied policy, listing up to `names` nodes per operand.
fn readiness(
    operands: &[OperandObservation],
    statuses: &[OperandStatus],
    census: &Census,
    names: usize,
) -> (State, (bool, &'static str, String)) {
    if census.gpu_nodes == 0 {
        let (reason, message) = if census.nfd_labels {
            (reason::NO_GPU_NODES, "no node has an NVIDIA GPU")
        } else {
            (
                reason::NFD_LABELS_MISSING,
                "no node has NFD labels; no GPU node can be detected",
            )
        };
        return (State::Ready, (true, reason, message.to_owned()));
    }
    let mut waiting = Vec::new();
    if !census.gpu_nodes_unlabelled.is_empty() {
        waiting.push(format!(
            "{} of {} GPU nodes do not show their operator labels yet ({})",
            census.gpu_nodes_unlabelled.len(),
            census.gpu_nodes,
            listed(
                &census.gpu_nodes_unlabelled,
                census.gpu_nodes_unlabelled.len(),
                names
            )
        ));
    }
    if !census.gpu_nodes_without_driver.is_empty() {
        waiting.push(format!(
            "{} GPU node(s) are selected by no NVIDIADriver and get no driver ({})",
            census.gpu_nodes_without_driver.len(),
            listed(
                &census.gpu_nodes_without_driver,
                census.gpu_nodes_without_driver.len(),
                names
            )
        ));
    }
    if let Some(failed) = upgrade_failures(&census.upgrade_failures, names) {
        waiting.push(failed);
    }
    for status in statuses.iter().filter(|s| s.ready < s.expected) {
        waiting.push(describe(status, names));
    }
    if !waiting.is_empty() {
        let message = format!("not ready: {}", waiting.join("; "));
        return (
            State::NotReady,
            (
                false,
                reason::OPERAND_NOT_READY,
                bounded(&message, CONDITION_MESSAGE_LIMIT),
            ),
        );
    }
    let mut message = "all operands are ready on every node that should run them".to_owned();
    let excluded: BTreeSet<&String> = operands.iter().flat_map(|o| o.excluded.iter()).collect();
    if !excluded.is_empty() {
        let excluded: Vec<&String> = excluded.into_iter().collect();
        message.push_str(&format!(
            "; {} GPU node(s) cannot run operands switched on for them (untolerated taint or selector): {}",
            excluded.len(),
            listed(&excluded, excluded.len(), names)
        ));
    }
    (
        State::Ready,
        (
            true,
            reason::RECONCILED,
            bounded(&message, CONDITION_MESSAGE_LIMIT),
        ),
    )
}

/// "driver upgrade failed on 2 node(s): a (why); b (why)", or nothing when none failed.
fn upgrade_failures(failures: &[(String, String)], names: usize) -> Option<String> {
    if failures.is_empty() {
        return None;
    }
    let shown: Vec<String> = failures
        .iter()
        .take(names)
        .map(|(node, why)| format!("{node} ({why})"))
        .collect();
    let more = failures.len().saturating_sub(shown.len());
    let mut text = format!(
        "driver upgrade failed on {} node(s): {}",
        failures.len(),
        shown.join("; ")
    );
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    Some(text)
}

/// The `Error` condition's message for a policy that could not be applied.
fn failure(outcome: &Outcome) -> String {
    let message = match outcome {
        Outcome::Invalid(errors) => {
            let problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!(
                "the ClusterPolicy is invalid and was not applied; running operands are unchanged: {}",
                problems.join("; ")
            )
        }
        Outcome::Failed(failed) => failed.message.clone(),
        Outcome::Applied { failures, .. } => {
            let messages: Vec<&str> = failures.iter().map(|f| f.message.as_str()).collect();
            messages.join("; ")
        }
        Outcome::Ignored { .. } => String::new(),
    };
    bounded(&message, CONDITION_MESSAGE_LIMIT)
}

fn operand_status(observation: &OperandObservation) -> Option<OperandStatus> {
    let operand = observation.operand?;
    let listed = |nodes: &mut dyn Iterator<Item = &String>| -> Option<Vec<String>> {
        let nodes: Vec<String> = nodes.take(MAX_LISTED_NODES).cloned().collect();
        (!nodes.is_empty()).then_some(nodes)
    };
    Some(OperandStatus {
        name: operand.id().to_owned(),
        expected: count(observation.expected),
        ready: count(observation.ready),
        not_ready_nodes: listed(&mut observation.not_ready.iter()),
        excluded_nodes: listed(&mut observation.excluded.iter()),
    })
}

fn describe(status: &OperandStatus, names: usize) -> String {
    let lagging = (status.expected - status.ready).max(0) as usize;
    let nodes = status.not_ready_nodes.as_deref().unwrap_or_default();
    format!(
        "{} on {lagging} of {} nodes ({})",
        status.name,
        status.expected,
        listed(nodes, lagging, names)
    )
}

/// The first `names` of `nodes`, and how many more of `total` there are.
fn listed(nodes: &[impl AsRef<str>], total: usize, names: usize) -> String {
    let shown: Vec<&str> = nodes.iter().take(names).map(AsRef::as_ref).collect();
    let more = total.saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// An Event note: `text` cut to what kube-apiserver accepts.
pub fn bounded_note(text: &str) -> String {
    bounded(text, EVENT_NOTE_LIMIT)
}

/// `text` cut to at most `limit` bytes at a character boundary, ending in `…` when cut.
fn bounded(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    const ELLIPSIS: char = '…';
    let mut end = limit.saturating_sub(ELLIPSIS.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = text.get(..end).unwrap_or_default().to_owned();
    cut.push(ELLIPSIS);
    cut
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn condition(
    type_: &str,
    (status, reason, message): (bool, &str, String),
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn observation(operand: Operand, expected: &[&str], ready: &[&str]) -> OperandObservation {
        let (expected, ready) = (nodes(expected), nodes(ready));
        OperandObservation {
            operand: Some(operand),
            expected: expected.len(),
            ready: ready.intersection(&expected).count(),
            not_ready: expected
                .difference(&ready)
                .take(MAX_LISTED_NODES)
                .cloned()
                .collect(),
            excluded: BTreeSet::new(),
        }
    }

    /// A pass that applied every object and observed `operands` on a cluster of `census`.
    fn applied(operands: Vec<OperandObservation>, census: Census) -> Outcome {
        Outcome::Applied {
            failures: Vec::new(),
            operands,
            census,
        }
    }

    fn census(gpu_nodes: usize) -> Census {
        Census {
            gpu_nodes,
            nfd_labels: true,
            ..Census::default()
        }
    }

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn ready_condition(status: &PolicyStatus) -> &Condition {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
    }

    /// A condition's status and reason, as the tests compare them.
    fn status_and_reason(condition: &Condition) -> (&str, &str) {
        (condition.status.as_str(), condition.reason.as_str())
    }

    fn error_condition(status: &PolicyStatus) -> &Condition {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Error")
            .unwrap()
    }

    #[test]
    fn all_ready_is_reconciled() {
        let outcome = applied(
            vec![observation(Operand::Driver, &["a", "b"], &["a", "b"])],
            census(2),
        );
        let status = policy_status(&outcome, "gpu-operator", Some(3), None, &time(100));
        assert_eq!(status.state, State::Ready);
        assert_eq!(status.namespace.as_deref(), Some("gpu-operator"));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(
            (
                ready_condition(&status).status.as_str(),
                ready_condition(&status).reason.as_str()
            ),
            ("True", "Reconciled")
        );
        assert_eq!(
            (
                error_condition(&status).status.as_str(),
                error_condition(&status).reason.as_str()
            ),
            ("False", "Ready")
        );
        let operands = status.operands.unwrap();
        assert_eq!(
            operands,
            [OperandStatus {
                name: "driver".into(),
                expected: 2,
                ready: 2,
                not_ready_nodes: None,
                excluded_nodes: None
            }]
        );
    }

    #[test]
    fn not_ready_names_the_operand_and_its_nodes_and_is_not_an_error() {
        let mut plugin = observation(Operand::DevicePlugin, &["a", "b", "c"], &["a"]);
        plugin.excluded = nodes(&["tainted"]);
        let outcome = applied(vec![plugin], census(4));
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        assert_eq!(status.state, State::NotReady);
        let ready = ready_condition(&status);
        assert_eq!(status_and_reason(ready), ("False", "OperandNotReady"));
        assert_eq!(ready.message, "not ready: device-plugin on 2 of 3 nodes (b, c)");
        assert_eq!(error_condition(&status).status, "False");
        let operand = &status.operands.unwrap()[0];
        assert_eq!(
            operand.not_ready_nodes.as_deref(),
            Some(&["b".to_owned(), "c".to_owned()][..])
        );
        assert_eq!(
            operand.excluded_nodes.as_deref(),
            Some(&["tainted".to_owned()][..])
        );
    }

    #[test]
    fn node_lists_are_bounded_but_counts_are_exact() {
        let expected: Vec<String> = (0..50).map(|i| format!("node-{i:02}")).collect();
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        let outcome = applied(vec![observation(Operand::Driver, &expected, &[])], census(50));
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        let operand = &status.operands.as_ref().unwrap()[0];
        assert_eq!((operand.expected, operand.ready), (50, 0));
        assert_eq!(operand.not_ready_nodes.as_ref().unwrap().len(), 20);
        assert!(ready_condition(&status).message.ends_with("node-19 and 30 more)"));
    }

    #[test]
    fn excluded_gpu_nodes_are_named_even_when_ready() {
        let mut driver = observation(Operand::Driver, &["a"], &["a"]);
        driver.excluded = nodes(&["reserved"]);
        let outcome = applied(vec![driver], census(2));
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        assert_eq!(status.state, State::Ready);
        assert!(ready_condition(&status).message.ends_with(
            "1 GPU node(s) cannot run operands switched on for them (untolerated taint or selector): reserved"
        ));
    }

    #[test]
    fn no_gpu_nodes_and_no_nfd_have_nvidias_reasons() {
        let none = applied(
            vec![],
            Census {
                gpu_nodes: 0,
                nfd_labels: true,
                ..Census::default()
            },
        );
        assert_eq!(
            ready_condition(&policy_status(&none, "ns", None, None, &time(1))).reason,
            "NoGPUNodes"
        );
        let no_nfd = applied(vec![], Census::default());
        assert_eq!(
            ready_condition(&policy_status(&no_nfd, "ns", None, None, &time(1))).reason,
            "NFDLabelsMissing"
        );
    }

    #[test]
    fn an_invalid_policy_is_an_error_naming_the_field() {
        let errors = vec![FieldError::unsupported(
            "spec.mig.strategy",
            "double",
            &["none", "single", "mixed"],
        )];
        let status = policy_status(&Outcome::Invalid(errors), "ns", Some(2), None, &time(1));
        let error = error_condition(&status);
        assert_eq!(status_and_reason(error), ("True", "ReconcileFailed"));
        assert!(
            error
                .message
                .contains(r#"spec.mig.strategy: "double" is not one of [none, single, mixed]"#),
            "{}",
            error.message
        );
        let ready = ready_condition(&status);
        assert_eq!(status_and_reason(ready), ("False", "ReconcileFailed"));
        assert_eq!(ready.message, error.message, "Ready names every wrong field too");
    }

    #[test]
    fn the_ignored_policy_names_the_active_one() {
        let status = policy_status(
            &Outcome::Ignored {
                active: "cluster-policy".into(),
                unreadable: None,
            },
            "ns",
            None,
            None,
            &time(1),
        );
        assert_eq!(status.state, State::Ignored);
        assert!(
            ready_condition(&status)
                .message
                .contains(r#""cluster-policy" is the active one"#)
        );
    }

    #[test]
    fn transition_times_move_only_when_a_condition_changes() {
        let ready = applied(vec![observation(Operand::Driver, &["a"], &["a"])], census(1));
        let not_ready = applied(vec![observation(Operand::Driver, &["a"], &[])], census(1));
        let first = policy_status(&ready, "ns", None, None, &time(10));
        let same = policy_status(&ready, "ns", None, Some(&first), &time(20));
        assert_eq!(
            first, same,
            "an unchanged status is identical, so it is not written again"
        );
        let changed = policy_status(&not_ready, "ns", None, Some(&first), &time(30));
        assert_eq!(ready_condition(&changed).last_transition_time, time(30));
        assert_eq!(
            error_condition(&changed).last_transition_time,
            time(10),
            "Error stayed False"
        );
    }

    #[test]
    fn failed_upgrades_and_unserved_nodes_keep_the_policy_not_ready_with_the_reason() {
        let outcome = applied(
            vec![observation(Operand::Driver, &["a", "b"], &["a", "b"])],
            Census {
                upgrade_failures: vec![("b".into(), "the validator did not pass within 600s".into())],
                gpu_nodes_without_driver: vec!["c".into()],
                ..census(3)
            },
        );
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        assert_eq!(status.state, State::NotReady);
        assert_eq!(
            ready_condition(&status).message,
            "not ready: 1 GPU node(s) are selected by no NVIDIADriver and get no driver (c); driver upgrade \
             failed on 1 node(s): b (the validator did not pass within 600s)"
        );
    }

    #[test]
    fn an_nvidia_driver_says_disabled_conflicting_failed_or_ready() {
        use crate::drivers::DriverOutcome;
        let reason = |status: &PolicyStatus| ready_condition(status).reason.clone();
        // The state, with the reason and message of the Ready condition.
        let verdict = |status: &PolicyStatus| {
            let ready = ready_condition(status);
            (status.state, ready.reason.clone(), ready.message.clone())
        };
        let disabled = driver_status(&DriverOutcome::Disabled, None, "ns", Some(1), None, &time(1));
        assert_eq!(disabled.state, State::Disabled);
        assert!(
            error_condition(&disabled)
                .message
                .contains("useNvidiaDriverCRD is not enabled")
        );

        let ready_driver = observation(Operand::Driver, &["a", "b"], &["a", "b"]);
        // The status of an NVIDIADriver rendered with these problems and failures, its driver ready.
        let rendered = |problems: Vec<String>, failures: Vec<(String, String)>| {
            let outcome = DriverOutcome::Rendered { problems, failures };
            driver_status(&outcome, Some(&ready_driver), "ns", Some(1), None, &time(1))
        };
        let ready = rendered(vec![], vec![]);
        assert_eq!(
            verdict(&ready),
            (
                State::Ready,
                "Reconciled".to_owned(),
                "the driver is ready on all 2 node(s) routed to this NVIDIADriver".to_owned()
            )
        );
        let operands = ready.operands.as_ref().unwrap();
        assert_eq!(
            (operands[0].expected, operands[0].ready),
            (2, 2),
            "nodes expected and ready"
        );

        let conflict = rendered(
            vec!["node c is also selected by NVIDIADriver h100".into()],
            vec![],
        );
        assert_eq!(reason(&conflict), "ConflictingNodeSelector");
        assert!(
            ready_condition(&conflict)
                .message
                .contains("node c is also selected by NVIDIADriver h100")
        );

        let failed = rendered(vec![], vec![("b".into(), "driver pod restarted 11 times".into())]);
        assert_eq!(
            verdict(&failed),
            (
                State::NotReady,
                "DriverNotReady".to_owned(),
                "not ready: driver upgrade failed on 1 node(s): b (driver pod restarted 11 times)".to_owned()
            )
        );
    }

    #[test]
    fn gpu_nodes_without_their_labels_keep_the_policy_not_ready() {
        // The first pass of a fresh cluster: no deploy label is visible yet, so no operand expects a node.
        let outcome = applied(
            vec![observation(Operand::Driver, &[], &[])],
            Census {
                gpu_nodes: 2,
                nfd_labels: true,
                gpu_nodes_unlabelled: vec!["a".into(), "b".into()],
                ..Census::default()
            },
        );
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        assert_eq!(status.state, State::NotReady);
        let ready = ready_condition(&status);
        assert_eq!(ready.reason, "OperandNotReady");
        assert_eq!(
            ready.message,
            "not ready: 2 of 2 GPU nodes do not show their operator labels yet (a, b)"
        );
    }

    #[test]
    fn an_event_note_fits_what_kube_apiserver_accepts() {
        let names: Vec<String> = (0..1000)
            .map(|i| format!("gpu-node-with-a-long-pool-name-{i:04}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let outcome = applied(
            gpuop_api::OPERANDS
                .iter()
                .map(|info| observation(info.operand, &names, &[]))
                .collect(),
            Census {
                gpu_nodes: 1000,
                nfd_labels: true,
                gpu_nodes_unlabelled: names.iter().map(|n| (*n).to_owned()).collect(),
                ..Census::default()
            },
        );
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        assert!(ready_condition(&status).message.len() > EVENT_NOTE_LIMIT);
        let event = transition(&outcome, &status);
        assert!(!event.warning);
        assert_eq!(event.reason, "OperandNotReady");
        assert!(event.note.len() <= EVENT_NOTE_LIMIT, "{} bytes", event.note.len());
        assert!(
            event.note.starts_with(
                "not ready: 1000 of 1000 GPU nodes do not show their operator labels yet \
                 (gpu-node-with-a-long-pool-name-0000, gpu-node-with-a-long-pool-name-0001, \
                 gpu-node-with-a-long-pool-name-0002 and 997 more); driver on 1000 of 1000 nodes"
            ),
            "{}",
            event.note
        );
    }

    #[test]
    fn a_long_failure_is_cut_within_the_limits_at_a_character_boundary() {
        let errors: Vec<FieldError> = (0..2000)
            .map(|i| FieldError::invalid(format!("spec.daemonsets.labels.ключ-{i}"), "ü", "not allowed"))
            .collect();
        let outcome = Outcome::Invalid(errors);
        let status = policy_status(&outcome, "ns", None, None, &time(1));
        let message = &error_condition(&status).message;
        assert!(message.len() <= CONDITION_MESSAGE_LIMIT && message.ends_with('…'));
        let event = transition(&outcome, &status);
        assert!(event.warning);
        assert_eq!(event.reason, "ReconcileFailed");
        assert!(event.note.len() <= EVENT_NOTE_LIMIT && event.note.ends_with('…'));
        assert!(event.note.starts_with("the ClusterPolicy is invalid"));
    }

    #[test]
    fn only_counts_and_messages_can_wait() {
        let progress = |ready: &[&str], generation| {
            let outcome = applied(
                vec![observation(Operand::Driver, &["a", "b", "c"], ready)],
                census(3),
            );
            policy_status(&outcome, "ns", Some(generation), None, &time(1))
        };
        let (one, two, all) = (
            progress(&["a"], 1),
            progress(&["a", "b"], 1),
            progress(&["a", "b", "c"], 1),
        );
        assert!(only_counts_differ(&one, &two), "a count moved");
        assert!(!only_counts_differ(&two, &all), "the state changed");
        assert!(
            !only_counts_differ(&one, &progress(&["a"], 2)),
            "a new generation was observed"
        );
        let invalid = policy_status(&Outcome::Invalid(vec![]), "ns", Some(1), None, &time(1));
        assert!(!only_counts_differ(&one, &invalid), "the Error condition changed");
    }

    #[test]
    fn a_refused_write_is_an_error_with_the_apis_reason_and_what_runs_is_still_counted() {
        let outcome = Outcome::Applied {
            operands: vec![observation(Operand::Driver, &["a"], &["a"])],
            census: census(1),
            failures: vec![Failure {
                reason: "Forbidden".into(),
                message:
                    "apply of state-dcgm-exporter refused: cannot apply Service gpu-operator/x: forbidden"
                        .into(),
            }],
        };
        let status = policy_status(&outcome, "ns", Some(3), None, &time(1));
        assert_eq!(
            status.state,
            State::NotReady,
            "all ready, yet a write was refused"
        );
        let error = error_condition(&status);
        assert_eq!(status_and_reason(error), ("True", "Forbidden"));
        assert!(
            error.message.contains("Service gpu-operator/x"),
            "{}",
            error.message
        );
        let ready = ready_condition(&status);
        assert_eq!(status_and_reason(ready), ("False", "ReconcileFailed"));
        assert_eq!(
            status.operands.as_ref().map(Vec::len),
            Some(1),
            "operands are still reported"
        );
        let event = transition(&outcome, &status);
        assert!(event.warning);
        assert_eq!(event.reason, "Forbidden");
    }
}
