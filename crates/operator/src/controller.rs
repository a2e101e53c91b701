//! The policy reconciler and the node labeller, as thin I/O loops around the pure decisions (the third
//! controller, driver upgrades, is [`crate::upgrade`]).
//!
//! **The policy reconciler** runs one pass whenever any cache changes (passes coalesce: events that arrive
//! during a pass cause exactly one more): pick the active ClusterPolicy (the oldest; the others are marked
//! ignored), validate it, derive the cluster facts, render it and every NVIDIADriver it hands the driver to
//! ([`crate::drivers`]), apply only what changed, prune what is no longer rendered, write the statuses that
//! changed, and tell the upgrade controller its pools. An invalid policy gets a status naming the field and
//! changes nothing that runs.
//!
//! **The node labeller** ([`crate::label_queue`]) patches each node whose labels differ, only the keys
//! that differ, whenever the node changes or the policy's labelling inputs change; the reconciler hands it
//! those inputs on [`Context::labelling`].
//!
//! Only the leader writes; followers keep their caches warm and compute nothing they would write.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuop_api::status::{PolicyStatus, State};
use gpuop_api::upgrade::UpgradePolicy;
use gpuop_api::upgrade::observe::PoolScope;
use gpuop_api::validate::validate_with;
use gpuop_api::{ClusterPolicy, FieldError, NVIDIADriver, Operand, ValidatedPolicy};
use gpuop_render::NvidiaDriverFacts;
use gpuop_render::{ClusterFacts, Rendered, render};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::{Api, Client, CustomResourceExt, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::apply::{self, ApplyPlan, ObjectKey, Owned, Prune};
use crate::caches::Decoded;
use crate::context::Context;
use crate::drivers::{self, DriverOutcome, DriverPlan, DriversInput};
use crate::facts::FactsInput;
use crate::handoff::{UpgradePool, Upgrades};
use crate::labeler::LabelPolicy;
use crate::metrics::ReconciliationStatus;
use crate::pod_security;
use crate::projection::{NodeKeys, NodeRecord};
use crate::readiness::{self, Observed, Templates, observe};
use crate::report::{STATUS_INTERVAL, StatusTarget, StatusWrite, StatusWriter};
use crate::retry::Backoff;
use crate::status::{self, Failure, OperandObservation, Outcome, driver_status, policy_status};
use crate::unconfirmed::{IN_FLIGHT, Unconfirmed};

/// The shortest time between the starts of two passes.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(200);
/// How often the reconciler runs with nothing changed, to repair what it cannot watch.
const RESYNC: Duration = Duration::from_secs(300);
/// How a failed pass backs off (see [`crate::retry`]).
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(500),
    cap: Duration::from_secs(60),
};

/// The policy reconciler: the controllers' shared context, and what its passes remember.
pub struct Reconciler {
    context: Arc<Context>,
    recent: Mutex<Recent>,
    memo: Mutex<Memo>,
    /// The statuses written.
    statuses: StatusWriter,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for Reconciler {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.context
    }
}

/// What the last passes computed from inputs that have not changed since, reused instead of computed again.
#[derive(Debug, Default)]
struct Memo {
    render: Option<RenderMemo>,
    /// The inputs of the last apply plan that came out empty: while they stay the same, there is nothing
    /// to apply or prune.
    settled: Option<ApplyInputs>,
}

#[derive(Debug)]
struct RenderMemo {
    validated: ValidatedPolicy,
    facts: ClusterFacts,
    rendered: Arc<Rendered>,
    /// Its DaemonSets' pod templates, parsed once.
    templates: Arc<Templates>,
}

/// Everything an apply plan is made from.
#[derive(Debug)]
struct ApplyInputs {
    rendered: Arc<Rendered>,
    drivers: Vec<(String, Rendered)>,
    /// The owner references the objects get, the policy's first: part of each object's hash, so a policy
    /// deleted and made again under its name is applied again.
    owners: Vec<OwnerReference>,
    /// The managed objects in the caches; `live` is read from them.
    objects: Vec<(&'static str, Arc<kube::api::DynamicObject>)>,
    live: Arc<BTreeMap<ObjectKey, apply::LiveObject>>,
    orphan_drivers: bool,
    keep_drivers: BTreeSet<String>,
    keep_all: bool,
    unwatched: BTreeSet<String>,
}

impl ApplyInputs {
    /// Whether a plan made from `other` would be the plan made from these. Every field is named here, so an
    /// input added to the struct cannot be left out of the comparison: the build fails until it is compared.
    fn same(&self, other: &ApplyInputs) -> bool {
        let ApplyInputs {
            rendered,
            drivers,
            owners,
            objects: _,
            live: _,
            orphan_drivers,
            keep_drivers,
            keep_all,
            unwatched,
        } = self;
        (Arc::ptr_eq(rendered, &other.rendered) || *rendered == other.rendered)
            && *drivers == other.drivers
            && *owners == other.owners
            && *orphan_drivers == other.orphan_drivers
            && *keep_drivers == other.keep_drivers
            && *keep_all == other.keep_all
            && *unwatched == other.unwatched
            // The live objects: the very same cached ones, or ones that read the same for the plan.
            && (self.same_objects(&other.objects) || self.same_live(other))
    }

    /// Whether these were read from the very same cached objects.
    fn same_objects(&self, objects: &[(&'static str, Arc<kube::api::DynamicObject>)]) -> bool {
        self.objects.len() == objects.len()
            && self
                .objects
                .iter()
                .zip(objects)
                .all(|((kind, object), (other_kind, other))| kind == other_kind && Arc::ptr_eq(object, other))
    }

    fn same_live(&self, other: &ApplyInputs) -> bool {
        self.live.len() == other.live.len()
            && self
                .live
                .iter()
                .zip(other.live.iter())
                .all(|((key, live), (other_key, other))| key == other_key && live.same_for_plan(other))
    }
}

/// Writes made recently whose echo the caches may not have delivered yet.
#[derive(Debug, Default)]
struct Recent {
    /// Objects applied, with the applied-hash they were given.
    applied: Unconfirmed<ObjectKey, String>,
    deleted: Unconfirmed<ObjectKey, ()>,
    /// Drift repairs made, by the version of the object they were made at.
    repairs: apply::Repairs,
}

impl Reconciler {
    /// The reconciler over the controllers' shared context, with nothing remembered yet.
    pub fn new(context: Arc<Context>) -> Self {
        Self {
            context,
            recent: Mutex::default(),
            memo: Mutex::default(),
            statuses: StatusWriter::default(),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.memo.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The policy's objects for these facts: the last render while neither changed (a rollout changes pods
    /// and node labels by the thousand, and nothing rendered reads them), a new one otherwise.
    fn render(
        &self,
        validated: &ValidatedPolicy,
        facts: &ClusterFacts,
    ) -> Result<Arc<Rendered>, gpuop_render::RenderError> {
        if let Some(last) = &self.memo().render
            && last.validated == *validated
            && last.facts == *facts
        {
            return Ok(last.rendered.clone());
        }
        let rendered = Arc::new(render(validated, facts)?);
        self.metrics.objects_rendered(rendered.objects.len());
        self.memo().render = Some(RenderMemo {
            validated: validated.clone(),
            facts: facts.clone(),
            rendered: rendered.clone(),
            templates: Arc::new(Templates::of(&rendered)),
        });
        Ok(rendered)
    }

    /// The pod templates of a rendering: those of the last policy rendering are parsed once, others (the
    /// NVIDIADrivers', rendered each pass) now.
    fn templates(&self, rendered: &Arc<Rendered>) -> Arc<Templates> {
        match &self.memo().render {
            Some(last) if Arc::ptr_eq(&last.rendered, rendered) => last.templates.clone(),
            _ => Arc::new(Templates::of(rendered)),
        }
    }
}

/// Why a step of a reconcile pass failed, one kind per step, each naming the object and carrying the API's
/// answer. A failed step is written to the active ClusterPolicy's status (`Error=True`, with
/// [`ReconcileError::reason`]); the pass is retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Validate: the active ClusterPolicy does not decode into the API's types.
    #[error(
        "ClusterPolicy {name:?} cannot be read, so it was not applied; running operands are unchanged: {error}"
    )]
    Undecodable {
        /// The policy.
        name: String,
        /// What does not decode.
        error: String,
    },
    /// Facts: reading an object the rendering depends on failed (a ConfigMap the policy names, a live
    /// driver DaemonSet).
    #[error("cannot read {object}: {source}")]
    Facts {
        /// `Kind namespace/name`.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Facts: a resource the caches cannot list or watch (a missing CRD, a forbidden list). Objects of
    /// that resource are not written until it can be watched.
    #[error("cannot watch {resource} ({reason}): {message}")]
    Watch {
        /// The resource (`nvidiadrivers.nvidia.com`).
        resource: String,
        /// The API's reason (`NotFound`, `Forbidden`).
        reason: String,
        /// The API's message.
        message: String,
    },
    /// Render: the policy cannot be turned into objects.
    #[error("cannot render ClusterPolicy {policy:?}: {message}")]
    Render {
        /// The policy.
        policy: String,
        /// Why.
        message: String,
    },
    /// Apply of a state: the API server refused an object of it; the states that depend on it were
    /// held back, the others applied.
    #[error("apply of {state} refused: {source}{}", held_back(skipped))]
    Apply {
        /// The state (`state-dcgm-exporter`).
        state: &'static str,
        /// The refused object and the API's answer.
        #[source]
        source: apply::ApplyError,
        /// Objects not applied because of it.
        skipped: Vec<ObjectKey>,
    },
    /// Prune: deleting an object no longer rendered was refused.
    #[error("prune refused: {source}")]
    Prune {
        /// The object and the API's answer.
        #[source]
        source: apply::ApplyError,
    },
    /// Labelling the operator's namespace for Pod Security (`spec.psa`) failed.
    #[error("cannot set the pod security labels of Namespace {namespace}: {source}")]
    PodSecurity {
        /// The namespace.
        namespace: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Status: writing a ClusterPolicy's or an NVIDIADriver's status failed.
    #[error("cannot write the status of {object}: {source}")]
    Status {
        /// `ClusterPolicy name` or `NVIDIADriver name`.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    /// The `Error` condition's reason: the API's (`Forbidden`, `Invalid`, `NotFound`, ...), or the step's
    /// own when no API answered (`ReconcileFailed` for a policy that does not decode, `RenderFailed`).
    pub fn reason(&self) -> String {
        match self {
            Self::Undecodable { .. } => gpuop_api::status::reason::RECONCILE_FAILED.to_owned(),
            Self::Render { .. } => "RenderFailed".to_owned(),
            Self::Watch { reason, .. } => reason.clone(),
            Self::Facts { source, .. } | Self::PodSecurity { source, .. } | Self::Status { source, .. } => {
                apply::api_reason(source)
            }
            Self::Apply { source, .. } | Self::Prune { source } => source.reason(),
        }
    }

    /// The failure as the ClusterPolicy's status tells it.
    pub fn failure(&self) -> Failure {
        Failure {
            reason: self.reason(),
            message: self.to_string(),
        }
    }
}

/// "; not applied until it is: DaemonSet ns/a, ..." for the objects not applied because of a refusal.
fn held_back(skipped: &[ObjectKey]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let names: Vec<String> = skipped
        .iter()
        .map(|(kind, namespace, name)| apply::object_name(kind, namespace, name))
        .collect();
    format!("; not applied until it is: {}", names.join(", "))
}

/// Runs the policy reconciler until `shutdown`.
pub async fn run_policies(context: Arc<Context>, shutdown: CancellationToken) {
    let context = Reconciler::new(context);
    if !context.caches.ready().await {
        return;
    }
    let mut leadership = context.leadership.clone();
    let mut failures = 0u32;
    let mut wait = Duration::ZERO;
    let mut last_pass: Option<Instant> = None;
    loop {
        let mut readiness_only = false;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = context.changed.policies.notified() => {}
            () = context.changed.readiness.notified() => readiness_only = true,
            _ = leadership.changed() => {}
            () = tokio::time::sleep(wait) => {}
        }
        // A rollout changes pods by the thousand; let them gather instead of judging them per event. Pods
        // move only readiness counts, which the status writes at most once per STATUS_INTERVAL: a pass for
        // them waits that long, unless something else changes meanwhile.
        if let Some(last) = last_pass {
            if readiness_only {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = context.changed.policies.notified() => {}
                    _ = leadership.changed() => {}
                    () = tokio::time::sleep_until(last + STATUS_INTERVAL) => {}
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(last + MIN_PASS_INTERVAL) => {}
            }
        }
        last_pass = Some(Instant::now());
        context.metrics.policy_pass();
        let error = match reconcile(&context).await {
            Ok(next) => {
                failures = 0;
                wait = next;
                continue;
            }
            Err(error) => error,
        };
        match BACKOFF.after(&error, "reconcile", failures + 1) {
            // The leadership ended mid-pass (a write found it over): nothing failed, the leader does the rest.
            None => {
                tracing::debug!(%error, "pass stopped: this replica no longer leads");
                failures = 0;
                wait = RESYNC;
            }
            Some(retry_in) => {
                failures += 1;
                wait = retry_in;
                warn!(%error, ?retry_in, "reconcile failed");
                context
                    .metrics
                    .reconciled(ReconciliationStatus::OperatorError, now_seconds());
            }
        }
    }
}

/// One reconcile pass over every ClusterPolicy; returns how long to wait for a change before the next.
///
/// A ClusterPolicy that does not decode keeps its place in the activation order (so that it never hands
/// the cluster to a newer one): as the active one it is reported like an invalid policy and changes
/// nothing that runs; as another one it is reported ignored, with why it cannot be read.
pub async fn reconcile(context: &Reconciler) -> Result<Duration, ReconcileError> {
    let leader = context.leadership.is_leader();
    context.metrics.leader(leader);
    let mut policies: Vec<Arc<Decoded<ClusterPolicy>>> = context
        .caches
        .policies
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .collect();
    policies.sort_by(|a, b| ClusterPolicy::activation_order_of(a.meta(), b.meta()));
    if context
        .caches
        .unavailable_required()
        .iter()
        .any(|u| u.resource == ClusterPolicy::crd_name())
    {
        // An empty store the API refuses to fill is not a cluster without ClusterPolicies: acting on it
        // would strip every node's deploy switches. The refusal is on /readyz and in the log; the listing
        // that ends it starts a pass.
        context
            .metrics
            .reconciled(ReconciliationStatus::PolicyUnavailable, now_seconds());
        return Ok(RESYNC);
    }
    let Some((active, others)) = policies.split_first() else {
        publish(&context.labelling, Some(None));
        publish(&context.upgrade_pools, Some(Upgrades::NoPolicy));
        if leader {
            label_namespace(context, false).await?;
        }
        context
            .metrics
            .reconciled(ReconciliationStatus::PolicyUnavailable, now_seconds());
        return Ok(RESYNC);
    };
    // A status put off for an ignored policy must be written too: the pass comes back for the earliest.
    // One that cannot be written does not keep the active policy from being served.
    let mut next_for_ignored: Option<Duration> = None;
    let mut first_error = None;
    for ignored in others {
        let outcome = Outcome::Ignored {
            active: active.name_any(),
            unreadable: ignored.0.as_ref().err().map(|invalid| invalid.error.clone()),
        };
        match write_status(context, &target_of(ignored), &outcome, leader).await {
            Ok(written) => {
                if let Some(deferred) = written.deferred {
                    next_for_ignored = Some(next_for_ignored.map_or(deferred, |wait| wait.min(deferred)));
                }
            }
            Err(error) => {
                warn!(reason = %error.reason(), %error, "cannot mark a ClusterPolicy ignored");
                first_error.get_or_insert(error);
            }
        }
    }
    let next = match &active.0 {
        Ok(policy) => reconcile_active(context, policy, leader).await?,
        Err(invalid) => {
            let error = ReconcileError::Undecodable {
                name: active.name_any(),
                error: invalid.error.clone(),
            };
            warn!(policy = %active.name_any(), %error, "the active ClusterPolicy cannot be read; nothing is changed");
            let written = write_status(
                context,
                &target_of(active),
                &Outcome::Failed(error.failure()),
                leader,
            )
            .await?;
            context
                .metrics
                .reconciled(ReconciliationStatus::PolicyUnavailable, now_seconds());
            written.deferred.unwrap_or(RESYNC)
        }
    };
    match first_error {
        Some(error) => Err(error),
        None => Ok(next_for_ignored.map_or(next, |wait| wait.min(next))),
    }
}

/// Makes the namespace's Pod Security labels what the policy's `psa.enabled` says.
async fn label_namespace(context: &Reconciler, enabled: bool) -> Result<(), ReconcileError> {
    pod_security::ensure(
        &context.client,
        &context.namespace,
        enabled,
        &context.pod_security,
    )
    .await
    .map_err(|source| ReconcileError::PodSecurity {
        namespace: context.namespace.clone(),
        source,
    })
}

/// Hands `value` to the controller that watches `channel`, waking it only when it changes; `None` leaves
/// the last one.
fn publish<T: PartialEq>(channel: &watch::Sender<Option<T>>, value: Option<T>) {
    if let Some(value) = value {
        channel.send_if_modified(|current| replace(current, Some(value)));
    }
}

/// Why the decide step stopped before it had anything to apply.
enum Stopped {
    /// A read the rendering depends on failed: nothing is changed, and the status says why.
    Facts(Box<ReconcileError>),
    /// The policy cannot be rendered.
    Render(Box<ReconcileError>),
}

/// The first half of the decide step: the NVIDIADrivers, how the nodes route to them, and what the
/// labeller is told.
struct Labelling {
    drivers: Vec<Arc<NVIDIADriver>>,
    /// Every node, when NVIDIADrivers route them; none otherwise (the judgements read what changed).
    nodes: Vec<Arc<NodeRecord>>,
    routing: gpuop_api::DriverRouting,
    policy: LabelPolicy,
    /// Whether the labeller gets `policy`: not while the NVIDIADrivers it needs cannot be listed.
    hand_on: bool,
}

/// What the active policy asks of the cluster now.
struct Planned {
    rendered: Arc<Rendered>,
    driver_plans: Vec<DriverPlan>,
    pools: Vec<UpgradePool>,
    census: crate::facts::Census,
}

/// The resources the caches cannot list or watch, as the steps that failed for them.
fn unwatched(context: &Reconciler) -> Vec<ReconcileError> {
    context
        .caches
        .unavailable_required()
        .into_iter()
        .map(|u| ReconcileError::Watch {
            resource: u.resource,
            reason: u.reason,
            message: u.message,
        })
        .collect()
}

/// What a store the API refuses to fill keeps from being done. An empty list is not the truth: without
/// the NVIDIADrivers (when they manage the driver) the labeller keeps its last inputs, or it would strip
/// every node's driver owner; without them or the nodes nothing is pruned (the driver DaemonSets would
/// go); without those, the pods or the DaemonSets the upgrade controller keeps its last pools. Everything
/// else goes on.
#[derive(Clone, Copy, Debug)]
struct Held {
    labelling: bool,
    pruning: bool,
    upgrades: bool,
}

impl Held {
    fn by(errors: &[ReconcileError], nvidia_drivers_on: bool) -> Self {
        let refused = |name: &str| {
            errors
                .iter()
                .any(|error| matches!(error, ReconcileError::Watch { resource, .. } if resource == name))
        };
        let labelling = nvidia_drivers_on && refused(NVIDIADriver::crd_name());
        let pruning = labelling || refused("nodes");
        Self {
            labelling,
            pruning,
            upgrades: pruning || refused("pods") || refused("daemonsets.apps"),
        }
    }
}

/// The decide step's first half, from the caches (no request is sent): the NVIDIADrivers' routing and
/// the labeller's inputs. `None` while the node cache does not keep a label a decision reads: it is
/// listing again, and the listing wakes the reconciler.
fn decide_labelling(context: &Reconciler, validated: &ValidatedPolicy, held: Held) -> Option<Labelling> {
    let nvidia_drivers_on = validated.spec.driver.use_nvidia_driver_crd();
    let drivers = context.caches.drivers.state();
    // No decision reads an NFD label the node cache does not keep: when a selector names a new one, the
    // nodes are listed again first (the relist wakes this reconciler).
    let mut keys = NodeKeys::of_detection(&context.detection);
    if nvidia_drivers_on {
        for driver in &drivers {
            keys.extend(driver.spec.effective_node_selector().keys().map(String::as_str));
        }
    }
    if !context.caches.nodes.covers(&keys) {
        return None;
    }
    // Only the NVIDIADrivers' routing reads every node each pass; without them, the judgements below read
    // the nodes that changed.
    let nodes: Vec<Arc<NodeRecord>> = if nvidia_drivers_on || !drivers.is_empty() {
        context.caches.nodes.state()
    } else {
        Vec::new()
    };
    let routing = if nvidia_drivers_on {
        drivers::routing(&drivers, &nodes, &context.detection)
    } else {
        gpuop_api::DriverRouting::default()
    };
    let mut policy = LabelPolicy::from_policy(validated);
    if nvidia_drivers_on {
        policy.nvidia_drivers = Some(
            drivers
                .iter()
                .filter(|d| d.metadata.deletion_timestamp.is_none())
                .map(|d| (**d).clone())
                .collect(),
        );
    }
    Some(Labelling {
        drivers,
        nodes,
        routing,
        policy,
        hand_on: !held.labelling,
    })
}

/// The decide step's second half, from the caches (no request is sent): the facts, the rendered objects
/// of the policy and of each NVIDIADriver, and the upgrade pools.
fn decide_plan(
    context: &Reconciler,
    validated: &ValidatedPolicy,
    labelling: &Labelling,
) -> Result<Planned, Stopped> {
    let nvidia_drivers_on = validated.spec.driver.use_nvidia_driver_crd();
    let Labelling {
        drivers,
        nodes,
        routing,
        policy: label_policy,
        ..
    } = labelling;
    let (mut facts, mut census) = {
        let mut judged = context.caches.judgements();
        judged.start_pass();
        let count = judged.refresh_facts(&context.caches.nodes, label_policy, &context.detection);
        context.metrics.nodes_judged(count);
        judged.cluster(FactsInput {
            namespace: &context.namespace,
            precompiled: validated.spec.driver.use_precompiled(),
            service_monitor_crd: context.service_monitor_crd,
        })
    };
    if nvidia_drivers_on {
        census.gpu_nodes_without_driver = routing.unmatched.iter().cloned().collect();
    }
    let driver_config_maps: Vec<String> = if nvidia_drivers_on {
        drivers.iter().flat_map(|d| drivers::config_maps(d)).collect()
    } else {
        Vec::new()
    };
    let read = config_map_keys(context, policy_config_maps(&validated.spec))
        .and_then(|policy| config_map_keys(context, driver_config_maps).map(|drivers| (policy, drivers)));
    let driver_config_map_keys = match read {
        Ok((policy, drivers)) => {
            facts.config_map_keys = policy;
            drivers
        }
        Err(refused) => {
            let error = ReconcileError::Watch {
                resource: refused.resource,
                reason: refused.reason,
                message: refused.message,
            };
            return Err(Stopped::Facts(Box::new(error)));
        }
    };
    context.metrics.census(census.gpu_nodes, census.nfd_labels);
    context
        .metrics
        .auto_upgrade(validated.spec.driver.is_auto_upgrade());

    let rendered = match context.render(validated, &facts) {
        Ok(rendered) => rendered,
        Err(error) => {
            let error = ReconcileError::Render {
                policy: validated.name.clone(),
                message: error.to_string(),
            };
            return Err(Stopped::Render(Box::new(error)));
        }
    };
    let host_root = NvidiaDriverFacts::host_root_of(Some(&validated.spec));
    let driver_plans = drivers::plan(
        drivers,
        nodes,
        &context.caches.judgements(),
        routing,
        DriversInput {
            enabled: nvidia_drivers_on,
            namespace: &context.namespace,
            image_defaults: &context.image_defaults,
            host_root: &host_root,
            runtime: facts.runtime,
            config_map_keys: &driver_config_map_keys,
            validation_timeout_seconds: context.upgrade_validation_timeout_seconds,
        },
    );
    context
        .metrics
        .objects_rendered(driver_plans.iter().map(|plan| plan.rendered.objects.len()).sum());
    let mut pools = upgrade_pools(context, validated, &rendered);
    pools.extend(driver_plans.iter().filter_map(|plan| plan.pool.clone()));
    Ok(Planned {
        rendered,
        driver_plans,
        pools,
        census,
    })
}

/// One pass over the active policy, in its steps: validate; decide what the labeller is told, and act on
/// it (with the namespace's Pod Security labels); decide what the policy asks of the cluster; act (apply,
/// prune, then hand the upgrade controller its pools); observe what runs; report the statuses. Returns how
/// long to wait for a change.
async fn reconcile_active(
    context: &Reconciler,
    active: &ClusterPolicy,
    leader: bool,
) -> Result<Duration, ReconcileError> {
    let validated = match validate_with(active, &context.image_defaults) {
        Ok(validated) => validated,
        Err(errors) => {
            // Leave everything running as it is; say which fields are wrong.
            let next = invalid(context, active, errors, leader).await?;
            context
                .metrics
                .reconciled(ReconciliationStatus::PolicyUnavailable, now_seconds());
            return Ok(next);
        }
    };
    // Steps that failed while the pass went on; each is in the status, the first is returned for back-off.
    let mut errors = unwatched(context);
    let held = Held::by(&errors, validated.spec.driver.use_nvidia_driver_crd());
    if leader && let Err(error) = label_namespace(context, validated.spec.psa_enabled()).await {
        warn!(reason = %error.reason(), %error, "cannot label the namespace for Pod Security; applying the rest");
        errors.push(error);
    }
    let Some(labelling) = decide_labelling(context, &validated, held) else {
        return Ok(IN_FLIGHT);
    };
    if labelling.hand_on {
        publish(&context.labelling, Some(Some(labelling.policy.clone())));
    }
    // A policy exists: "no policy" no longer holds for the upgrade controller, which would otherwise strip
    // the upgrade state the labeller is writing now. Its pools come after the apply.
    context.upgrade_pools.send_if_modified(|current| {
        let stale = matches!(current, Some(Upgrades::NoPolicy));
        if stale {
            *current = None;
        }
        stale
    });
    let planned = match decide_plan(context, &validated, &labelling) {
        Ok(planned) => planned,
        // Without the facts nothing can be rendered right: nothing is changed, and the status says why.
        Err(Stopped::Facts(error)) => return Err(failed(context, active, *error, leader).await),
        Err(Stopped::Render(error)) => {
            let outcome = Outcome::Failed(error.failure());
            let written = write_status(context, &policy_target(active), &outcome, leader).await?;
            context
                .metrics
                .reconciled(ReconciliationStatus::OperatorError, now_seconds());
            return Ok(written.deferred.unwrap_or(RESYNC));
        }
    };
    let Planned {
        rendered,
        driver_plans,
        pools,
        mut census,
    } = planned;
    let label_policy = labelling.policy;
    let awaiting_echo = if leader {
        match apply_rendered(context, active, &rendered, &driver_plans, &pools, held.pruning).await {
            Ok(applied) => {
                errors.extend(applied.refused);
                applied.awaiting_echo
            }
            Err(error) => return Err(failed(context, active, error, leader).await),
        }
    } else {
        false
    };
    // The upgrade controller acts on the DaemonSets as written.
    if !held.upgrades {
        publish(&context.upgrade_pools, Some(Upgrades::Pools(pools)));
    }

    // Observe what runs.
    let mut next = if awaiting_echo { IN_FLIGHT } else { RESYNC };
    let templates = context.templates(&rendered);
    let driver_templates: Vec<Templates> = driver_plans
        .iter()
        .map(|plan| Templates::of(&plan.rendered))
        .collect();
    // The pods are judged against the templates' selectors: the nodes must keep the NFD labels they read.
    let mut keys = NodeKeys::default();
    for templates in std::iter::once(&*templates).chain(&driver_templates) {
        keys = keys.union(templates.keys());
    }
    if !context.caches.nodes.covers(&keys) {
        return Ok(next.min(IN_FLIGHT));
    }
    let daemonsets = context.caches.daemonsets.state();
    let revisions = context.caches.revisions.state();
    let owners = readiness::owners(
        daemonsets.iter().map(|ds| &**ds),
        &revisions.iter().map(|r| &**r).collect::<Vec<_>>(),
    );
    let (operands, driver_observations) = {
        let mut judged = context.caches.judgements();
        // One view of the nodes and pods for the tallies and the census both: the nodes may have changed
        // since the facts were judged for rendering (a label the labeller must answer, say), and a census
        // older than the tallies could call a node labelled whose new operand the tallies already miss.
        let (nodes, pods) = (context.caches.nodes.read(), context.caches.pods.read());
        let count = judged.refresh_facts(&*nodes, &label_policy, &context.detection);
        let without_driver = std::mem::take(&mut census.gpu_nodes_without_driver);
        census = judged
            .cluster(FactsInput {
                namespace: &context.namespace,
                precompiled: validated.spec.driver.use_precompiled(),
                service_monitor_crd: context.service_monitor_crd,
            })
            .1;
        census.gpu_nodes_without_driver = without_driver;
        let observed = Observed {
            nodes: &*nodes,
            pods: &*pods,
            owners: &owners,
        };
        let (operands, placed) = observe(&templates, &observed, &context.detection, &mut judged);
        let mut count = count + placed;
        let driver_observations: Vec<Option<OperandObservation>> = driver_templates
            .iter()
            .map(|templates| {
                let (observations, judged_now) =
                    observe(templates, &observed, &context.detection, &mut judged);
                count += judged_now;
                observations.into_iter().next()
            })
            .collect();
        context.metrics.nodes_judged(count);
        (operands, driver_observations)
    };
    context.metrics.operands(
        operands
            .iter()
            .filter_map(|o| Some((o.operand?.id().to_owned(), o.expected as i64, o.ready as i64))),
    );
    for (plan, observation) in driver_plans.iter().zip(driver_observations) {
        match write_driver_status(context, plan, observation.as_ref(), leader).await {
            Ok(Some(deferred)) => next = next.min(deferred),
            Ok(None) => {}
            Err(error) => {
                warn!(reason = %error.reason(), %error, "cannot write an NVIDIADriver's status");
                errors.push(error);
            }
        }
    }
    let outcome = Outcome::Applied {
        operands,
        census,
        failures: errors.iter().map(ReconcileError::failure).collect(),
    };
    let written = write_status(context, &policy_target(active), &outcome, leader).await?;
    // Told in the status; the pass comes back with back-off. A resource the caches cannot watch needs no
    // retry from here: its reflector retries, and the pass runs again once it lists.
    if let Some(error) = errors
        .into_iter()
        .find(|error| !matches!(error, ReconcileError::Watch { .. }))
    {
        return Err(error);
    }
    let reconciliation = match written.status.state {
        State::Ready => ReconciliationStatus::Success,
        _ => ReconciliationStatus::NotReady,
    };
    context.metrics.reconciled(reconciliation, now_seconds());
    Ok(written.deferred.map_or(next, |deferred| deferred.min(next)))
}

/// Writes an NVIDIADriver's status (see [`crate::report`]); returns when to come back for a put-off write.
async fn write_driver_status(
    context: &Reconciler,
    plan: &DriverPlan,
    observation: Option<&OperandObservation>,
    leader: bool,
) -> Result<Option<Duration>, ReconcileError> {
    let driver = &*plan.driver;
    let target = StatusTarget::new(driver, driver.status.as_ref());
    let status_of = |previous: Option<&PolicyStatus>| {
        driver_status(
            &plan.outcome,
            observation,
            &context.namespace,
            target.generation(),
            previous,
            &now(),
        )
    };
    let written = context
        .statuses
        .write(
            &context.client,
            &context.recorder,
            &target,
            leader,
            status_of,
            status::driver_event,
        )
        .await
        .map_err(|source| ReconcileError::Status {
            object: target.describe(),
            source,
        })?;
    Ok(written.deferred)
}

/// The upgrade pools of a policy: its driver DaemonSets under its upgrade policy. None when NVIDIADriver
/// objects manage the driver; with sandbox workloads, or automatic upgrades off, the pool has no policy
/// (its state labels are removed).
fn upgrade_pools(context: &Reconciler, validated: &ValidatedPolicy, rendered: &Rendered) -> Vec<UpgradePool> {
    let driver = &validated.spec.driver;
    if driver.use_nvidia_driver_crd() {
        return Vec::new();
    }
    let daemonsets = rendered
        .objects
        .iter()
        .filter(|m| m.kind() == "DaemonSet" && m.operand == Some(Operand::Driver))
        .map(|m| m.name().to_owned())
        .collect();
    let policy = UpgradePolicy::of_cluster_policy(validated, context.upgrade_validation_timeout_seconds)
        .and_then(|policy| {
            policy
                .map_err(|error| warn!(%error, "spec.driver.upgradePolicy cannot be used; upgrades paused"))
                .ok()
        });
    vec![UpgradePool {
        owner: format!("ClusterPolicy/{}", validated.name),
        scope: PoolScope {
            routed_to: None,
            daemonsets,
            held: BTreeSet::new(),
        },
        policy,
    }]
}

fn replace<T: PartialEq>(current: &mut T, new: T) -> bool {
    if *current == new {
        false
    } else {
        *current = new;
        true
    }
}

/// Writes the status of an invalid policy; returns when the pass must run again.
async fn invalid(
    context: &Reconciler,
    policy: &ClusterPolicy,
    errors: Vec<FieldError>,
    leader: bool,
) -> Result<Duration, ReconcileError> {
    let outcome = Outcome::Invalid(errors);
    let written = write_status(context, &policy_target(policy), &outcome, leader).await?;
    Ok(written.deferred.unwrap_or(RESYNC))
}

/// Writes the status of a policy whose pass stopped at `error` (nothing was applied or pruned); returns the
/// error to retry with, or the status write's own when that fails too.
async fn failed(
    context: &Reconciler,
    policy: &ClusterPolicy,
    error: ReconcileError,
    leader: bool,
) -> ReconcileError {
    let outcome = Outcome::Failed(error.failure());
    match write_status(context, &policy_target(policy), &outcome, leader).await {
        Ok(_) => error,
        Err(status) => {
            warn!(reason = %error.reason(), %error, "a step failed and its status cannot be written");
            status
        }
    }
}

/// What [`apply_rendered`] did.
struct AppliedPass {
    /// Some writes were skipped as not echoed yet: the pass must come back.
    awaiting_echo: bool,
    /// Writes refused, one error per refused object.
    refused: Vec<ReconcileError>,
}

/// Applies what changed and prunes what is gone, skipping writes the caches have not echoed yet. Returns
/// whether it skipped any: then the pass must run again once those writes stop being trusted, in case they
/// never show (a write lost after the API server acknowledged it, or a watch that missed it).
///
/// Everything the operator owns is planned together: the policy's objects and every NVIDIADriver's. An
/// NVIDIADriver that is invalid or cannot be rendered keeps what it has; a driver DaemonSet no longer
/// rendered leaves its pods to the upgrade controller when an upgrade pool will replace them.
async fn apply_rendered(
    context: &Reconciler,
    policy: &ClusterPolicy,
    rendered: &Arc<Rendered>,
    drivers: &[DriverPlan],
    pools: &[UpgradePool],
    keep_all: bool,
) -> Result<AppliedPass, ReconcileError> {
    // Objects of a kind the caches cannot watch (required or optional) are not written: nothing would tell
    // what is live, so each pass would write them again. The status already names a required resource
    // (ReconcileError::Watch). With the nodes or the NVIDIADrivers refused, nothing is deleted.
    let unwatched: BTreeSet<String> = context
        .caches
        .availability
        .unavailable(true)
        .into_iter()
        .map(|u| u.resource)
        .collect();
    let objects = apply::managed_objects(&context.caches.managed);
    // The same objects as the last empty plan's: what it read of them stands (each pass would otherwise
    // copy every managed object's fields to compare them).
    let live = context
        .memo()
        .settled
        .as_ref()
        .filter(|settled| settled.same_objects(&objects))
        .map(|settled| settled.live.clone())
        .unwrap_or_else(|| Arc::new(apply::live_hashes_of(&objects)));
    let inputs = ApplyInputs {
        rendered: rendered.clone(),
        drivers: drivers
            .iter()
            .map(|plan| (plan.driver.name_any(), plan.rendered.clone()))
            .collect(),
        owners: std::iter::once(apply::owner_reference(policy))
            .chain(drivers.iter().map(|plan| apply::owner_reference(&*plan.driver)))
            .collect(),
        objects,
        live,
        orphan_drivers: pools.iter().any(|pool| pool.policy.is_some()),
        keep_drivers: drivers
            .iter()
            .filter(|plan| matches!(plan.outcome, DriverOutcome::Invalid(_) | DriverOutcome::Failed(_)))
            .map(|plan| plan.driver.name_any())
            .collect(),
        keep_all,
        unwatched,
    };
    // Nothing that the last empty plan was made from has changed: it would come out empty again.
    if context
        .memo()
        .settled
        .as_ref()
        .is_some_and(|settled| settled.same(&inputs))
    {
        return Ok(AppliedPass {
            awaiting_echo: false,
            refused: Vec::new(),
        });
    }
    let mut rendered = (**rendered).clone();
    keep_live_driver_digests(context, &mut rendered).await?;
    let mut driver_rendered = Vec::with_capacity(drivers.len());
    for plan in drivers {
        let mut objects = plan.rendered.clone();
        keep_live_driver_digests(context, &mut objects).await?;
        driver_rendered.push(objects);
    }
    let owned: Vec<Owned<'_>> = std::iter::once(&rendered)
        .chain(&driver_rendered)
        .zip(&inputs.owners)
        .map(|(rendered, owner)| Owned { rendered, owner })
        .collect();
    let live = &inputs.live;
    let rules = Prune {
        orphan_drivers: inputs.orphan_drivers,
        keep_drivers: &inputs.keep_drivers,
    };
    let mut plan = apply::plan(&owned, live, rules).map_err(|error| ReconcileError::Render {
        policy: policy.name_any(),
        message: error.to_string(),
    })?;
    if keep_all {
        plan.delete.clear();
    }
    plan.apply.retain(|((kind, _, _), _, _)| {
        apply::MANAGED_KINDS
            .iter()
            .find(|k| k.kind == *kind)
            .is_none_or(|k| !inputs.unwatched.contains(&k.resource()))
    });
    {
        let mut recent = context.recent();
        recent.repairs.retain_live(live);
        recent.repairs.skip_made(&mut plan, live);
    }
    if plan == ApplyPlan::default() {
        context.memo().settled = Some(inputs);
        return Ok(AppliedPass {
            awaiting_echo: false,
            refused: Vec::new(),
        });
    }
    let wanted = plan.apply.len() + plan.delete.len();
    let now = crate::unconfirmed::now();
    {
        let mut recent = context.recent();
        recent.applied.settle(now, |_, _| false);
        recent.deleted.settle(now, |_, _| false);
        plan.apply.retain(|(key, object, _)| {
            recent
                .applied
                .trusted(key, now)
                .is_none_or(|applied| applied != applied_hash(object))
        });
        plan.delete
            .retain(|key| recent.deleted.trusted(key, now).is_none());
    }
    let awaiting_echo = plan.apply.len() + plan.delete.len() < wanted;
    if plan == ApplyPlan::default() {
        return Ok(AppliedPass {
            awaiting_echo,
            refused: Vec::new(),
        });
    }
    let done = apply::execute(&context.client, &context.namespace, &plan).await;
    let applied: BTreeSet<&ObjectKey> = done.applied.iter().collect();
    for (key, object, _) in plan.apply.iter().filter(|(key, _, _)| applied.contains(key)) {
        if let (Some(drift), Some(current)) = (plan.drift.get(key), live.get(key)) {
            let recorder = context.recent().repairs.recorder(key, drift, &context.client);
            apply::report_drift(&recorder, key, object, current, drift).await;
            context.recent().repairs.record(key, Some(current));
        }
    }
    // Remember what was written, even when another write failed, so that it is not written twice; what
    // was refused or held back is tried again on the next pass.
    let mut recent = context.recent();
    let applied: BTreeSet<&ObjectKey> = done.applied.iter().collect();
    for (key, object, _) in plan.apply.iter().filter(|(key, _, _)| applied.contains(key)) {
        recent
            .applied
            .record(key.clone(), applied_hash(object).to_owned(), now);
    }
    for key in &done.deleted {
        recent.deleted.record(key.clone(), (), now);
    }
    let refused = done
        .refused
        .into_iter()
        .map(|refusal| match refusal.step {
            Some(step) => ReconcileError::Apply {
                state: step.state,
                source: refusal.error,
                skipped: refusal.skipped,
            },
            None => ReconcileError::Prune {
                source: refusal.error,
            },
        })
        .collect();
    Ok(AppliedPass {
        awaiting_echo,
        refused,
    })
}

/// Keeps the `DRIVER_CONFIG_DIGEST` of live driver DaemonSets that install what was rendered (see
/// [`gpuop_render::keep_live_driver_digest`]): adopting the driver DaemonSet of NVIDIA's operator, or of an
/// earlier version of this one, must not restart the driver on every node for a different hash of the same
/// configuration. The live DaemonSet comes from the cache; one the cache does not hold (not labelled as
/// ours yet: NVIDIA's, when the policy's `daemonsets.labels` lack our managed-by label; or not created yet)
/// is read, which stops once the operator's apply has labelled or created it.
async fn keep_live_driver_digests(
    context: &Reconciler,
    rendered: &mut Rendered,
) -> Result<(), ReconcileError> {
    for manifest in rendered
        .objects
        .iter_mut()
        .filter(|m| m.kind() == "DaemonSet" && m.operand == Some(Operand::Driver))
    {
        let namespace = manifest.object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(context.namespace.as_str())
            .to_owned();
        let name = manifest.name().to_owned();
        let cached = context
            .caches
            .daemonsets
            .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&namespace));
        let live = match cached {
            Some(ds) => Some((*ds).clone()),
            None => Api::<DaemonSet>::namespaced(context.client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(|source| ReconcileError::Facts {
                    object: apply::object_name("DaemonSet", &namespace, &name),
                    source,
                })?,
        };
        let Some(pod) = live.and_then(|ds| ds.spec).and_then(|spec| spec.template.spec) else {
            continue;
        };
        // Every pass keeps it again (the rendered value stays ours), so this is no decision to log at info.
        if gpuop_render::keep_live_driver_digest(&mut manifest.object, &pod) {
            tracing::debug!(daemonset = %name, "kept the live DRIVER_CONFIG_DIGEST: the driver it installs is the one rendered");
        }
    }
    Ok(())
}

fn applied_hash(object: &serde_json::Value) -> &str {
    object["metadata"]["annotations"][gpuop_api::labels::APPLIED_HASH]
        .as_str()
        .unwrap_or_default()
}

/// A ClusterPolicy that decoded, as the target of its status.
fn policy_target(policy: &ClusterPolicy) -> StatusTarget<'_> {
    StatusTarget::new(policy, policy.status.as_ref())
}

/// The ClusterPolicy whose status is written, also one that does not decode (its metadata still does).
fn target_of(policy: &Decoded<ClusterPolicy>) -> StatusTarget<'_> {
    match &policy.0 {
        Ok(decoded) => policy_target(decoded),
        Err(_) => StatusTarget::undecoded(policy),
    }
}

/// Writes a ClusterPolicy's status for `outcome` (see [`crate::report`]).
async fn write_status(
    context: &Reconciler,
    policy: &StatusTarget<'_>,
    outcome: &Outcome,
    leader: bool,
) -> Result<StatusWrite, ReconcileError> {
    let status_of = |previous: Option<&PolicyStatus>| {
        policy_status(outcome, &context.namespace, policy.generation(), previous, &now())
    };
    let event_of =
        |before: Option<&PolicyStatus>, after: &PolicyStatus| status::policy_event(outcome, before, after);
    context
        .statuses
        .write(
            &context.client,
            &context.recorder,
            policy,
            leader,
            status_of,
            event_of,
        )
        .await
        .map_err(|source| ReconcileError::Status {
            object: policy.describe(),
            source,
        })
}

/// The ConfigMaps a policy's driver (and vGPU manager) mount file by file.
pub(crate) fn policy_config_maps(spec: &gpuop_api::ClusterPolicySpec) -> Vec<String> {
    let driver = &spec.driver;
    let names = [
        driver
            .repo_config
            .as_ref()
            .and_then(|c| c.config_map_name.clone()),
        driver
            .cert_config
            .as_ref()
            .and_then(|c| c.get().map(str::to_owned)),
        driver
            .kernel_module_config
            .as_ref()
            .and_then(|c| c.get().map(str::to_owned)),
        spec.vgpu_manager
            .as_ref()
            .and_then(|v| v.kernel_module_config.as_ref())
            .and_then(|c| c.get().map(str::to_owned)),
    ];
    names.into_iter().flatten().filter(|n| !n.is_empty()).collect()
}

/// Keys of the named ConfigMaps (those a driver mounts file by file) in the operator namespace, from the
/// cache; a missing ConfigMap has no entry. Without the cache (the API refuses to list ConfigMaps) a policy
/// that names any cannot be rendered right.
fn config_map_keys(
    context: &Reconciler,
    names: Vec<String>,
) -> Result<BTreeMap<String, Vec<String>>, Box<crate::caches::Unavailable>> {
    if names.is_empty() {
        return Ok(BTreeMap::new());
    }
    if let Some(refused) = context
        .caches
        .unavailable_required()
        .into_iter()
        .find(|u| u.resource == crate::caches::CONFIG_MAP_KEYS)
    {
        return Err(Box::new(refused));
    }
    let mut keys = BTreeMap::new();
    for name in names {
        let reference = kube::runtime::reflector::ObjectRef::new(&name).within(&context.namespace);
        if let Some(config_map) = context.caches.config_maps.get(&reference) {
            keys.insert(name, keys_of(&config_map));
        }
    }
    Ok(keys)
}

fn keys_of(config_map: &ConfigMap) -> Vec<String> {
    let mut names: Vec<String> = config_map.data.iter().flatten().map(|(k, _)| k.clone()).collect();
    names.extend(config_map.binary_data.iter().flatten().map(|(k, _)| k.clone()));
    names
}

/// Keys of the named ConfigMaps in `namespace`; a missing ConfigMap has no entry.
pub(crate) async fn read_config_map_keys(
    client: &Client,
    namespace: &str,
    names: Vec<String>,
) -> Result<BTreeMap<String, Vec<String>>, ReconcileError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut keys = BTreeMap::new();
    for name in names {
        if keys.contains_key(&name) {
            continue;
        }
        let found = api.get_opt(&name).await.map_err(|source| ReconcileError::Facts {
            object: apply::object_name("ConfigMap", namespace, &name),
            source,
        })?;
        if let Some(config_map) = found {
            keys.insert(name, keys_of(&config_map));
        }
    }
    Ok(keys)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::labels::GpuDetection;
    use gpuop_fakeserver::{FakeServer, Verb};
    use serde_json::json;

    use crate::caches::{Caches, Changes};
    use crate::lease::Leadership;
    use crate::metrics::Metrics;

    const NAMESPACE: &str = "gpu-operator";

    /// A fake API server with the CRDs, the operator's namespace and one GPU node (by NFD's labels).
    fn cluster() -> FakeServer {
        let server = FakeServer::new();
        server.load_yaml(&gpuop_api::crd::crds_yaml()).expect("the CRDs");
        server
            .insert(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
            .expect("the namespace");
        server
            .insert(json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "gpu-0",
                    "labels": {gpuop_api::labels::NFD_NVIDIA_PCI[0]: "true"},
                },
            }))
            .expect("a GPU node");
        server
    }

    /// A reconciler on `server`, leading, its caches listed. The labeller and the upgrade controller do not
    /// run: what the reconciler hands them stays in the context for the test to read.
    async fn reconciler(server: &FakeServer, shutdown: &CancellationToken) -> Reconciler {
        let client = server.client();
        let changed = Arc::new(Changes::default());
        let (caches, _node_events) = Caches::start(&client, NAMESPACE, false, &changed, shutdown);
        assert!(caches.ready().await, "the caches list");
        let context = Context::new(
            client,
            NAMESPACE.to_owned(),
            caches,
            Leadership::always(),
            Arc::new(Metrics::default()),
            GpuDetection::from_selector(None),
            gpuop_api::validate::ImageDefaults::default(),
            false,
            changed,
            300,
        );
        Reconciler::new(Arc::new(context))
    }

    fn sample_policy() -> serde_json::Value {
        serde_saphyr::from_str(include_str!("../../../deploy/samples/clusterpolicy.yaml"))
            .expect("the sample")
    }

    /// Waits until the reconciler's caches hold the ClusterPolicy `name`.
    async fn cached_policy(context: &Reconciler, name: &str) {
        let seen = || {
            context
                .caches
                .policies
                .state()
                .iter()
                .any(|p| p.name_any() == name)
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while !seen() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the policy reaches the cache");
    }

    /// The managers of an object's `status`, as (manager, operation).
    fn status_managers(object: &serde_json::Value) -> Vec<(String, String)> {
        object["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| entry["subresource"] == "status")
            .map(|entry| {
                let field = |name: &str| entry[name].as_str().unwrap_or_default().to_owned();
                (field("manager"), field("operation"))
            })
            .collect()
    }

    #[tokio::test]
    async fn without_a_policy_the_other_controllers_are_told_there_is_none() {
        let server = cluster();
        let shutdown = CancellationToken::new();
        let context = reconciler(&server, &shutdown).await;
        assert_eq!(reconcile(&context).await.expect("a pass"), RESYNC);
        assert_eq!(
            *context.labelling.borrow(),
            Some(None),
            "the labeller strips its switches"
        );
        assert_eq!(*context.upgrade_pools.borrow(), Some(Upgrades::NoPolicy));
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_pass_applies_hands_on_and_reports_and_the_next_writes_nothing() {
        let server = cluster();
        server.insert(sample_policy()).expect("the policy");
        let shutdown = CancellationToken::new();
        let context = reconciler(&server, &shutdown).await;
        cached_policy(&context, "cluster-policy").await;
        reconcile(&context).await.expect("a pass");

        let daemonsets = server.requests().count(Verb::Apply, "daemonsets");
        assert!(daemonsets > 0, "the operands are applied");
        let labelling = context.labelling.borrow().clone();
        assert!(
            matches!(labelling, Some(Some(_))),
            "the labeller has its inputs: {labelling:?}"
        );
        let pools = context.upgrade_pools.borrow().clone();
        let Some(Upgrades::Pools(pools)) = pools else {
            panic!("the upgrade controller has its pools: {pools:?}");
        };
        assert_eq!(pools[0].owner, "ClusterPolicy/cluster-policy");
        let policy = server
            .get("nvidia.com/v1", "ClusterPolicy", "", "cluster-policy")
            .expect("the policy");
        assert_eq!(
            policy["status"]["state"], "notReady",
            "no operand runs without a kubelet"
        );
        assert_eq!(
            status_managers(&policy),
            vec![("gpu-operator".to_owned(), "Apply".to_owned())]
        );

        // Nothing changed: the writes just made are trusted while the caches catch up.
        let before = server.requests();
        reconcile(&context).await.expect("a second pass");
        let writes = server.requests().since(&before).writes();
        assert_eq!(writes, 0, "a pass with nothing changed writes nothing");
        shutdown.cancel();
    }

    /// The namespace's Pod Security labels are set in the act step, before the operands are applied, and
    /// on the leader alone.
    #[tokio::test]
    async fn pod_security_labels_come_with_the_apply_and_only_from_the_leader() {
        let server = cluster();
        let mut policy = sample_policy();
        policy["spec"]["psa"] = json!({"enabled": true});
        server.insert(policy).expect("the policy");
        let shutdown = CancellationToken::new();
        let context = reconciler(&server, &shutdown).await;
        cached_policy(&context, "cluster-policy").await;
        let enforce = || {
            let namespace = server
                .get("v1", "Namespace", "", NAMESPACE)
                .expect("the namespace");
            namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].clone()
        };
        // A follower decides, and writes nothing.
        let active = context.caches.policies.state()[0].clone();
        let Ok(active) = &active.0 else {
            panic!("the sample decodes");
        };
        reconcile_active(&context, active, false)
            .await
            .expect("a follower's pass");
        assert!(enforce().is_null(), "a follower does not label the namespace");
        assert_eq!(server.requests().writes(), 0, "nor writes anything else");
        reconcile(&context).await.expect("the leader's pass");
        assert_eq!(enforce(), "privileged");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn an_nvidia_drivers_status_goes_through_the_same_writer() {
        let server = cluster();
        let mut policy = sample_policy();
        policy["spec"]["driver"]["useNvidiaDriverCRD"] = json!(true);
        server.insert(policy).expect("the policy");
        let drivers = include_str!("../../../deploy/samples/nvidiadrivers.yaml");
        server.load_yaml(drivers).expect("the NVIDIADrivers");
        let shutdown = CancellationToken::new();
        let context = reconciler(&server, &shutdown).await;
        cached_policy(&context, "cluster-policy").await;
        tokio::time::timeout(Duration::from_secs(10), async {
            while context.caches.drivers.state().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the NVIDIADrivers reach the cache");
        // Their node selectors name labels the node cache did not keep: the first passes wait for the
        // nodes to be listed again with them.
        let status = || server.get("nvidia.com/v1alpha1", "NVIDIADriver", "", "default");
        tokio::time::timeout(Duration::from_secs(10), async {
            while status().is_none_or(|driver| driver["status"].is_null()) {
                reconcile(&context).await.expect("a pass");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the NVIDIADriver gets a status");
        let driver = status().expect("the default NVIDIADriver");
        assert!(
            driver["status"]["state"].is_string(),
            "a status: {}",
            driver["status"]
        );
        assert_eq!(
            status_managers(&driver),
            vec![("gpu-operator".to_owned(), "Apply".to_owned())],
            "written by server-side apply, as a ClusterPolicy's"
        );
        shutdown.cancel();
    }

    #[test]
    fn objects_held_back_are_named_after_the_refusal() {
        assert_eq!(held_back(&[]), "");
        let skipped = [
            (
                "DaemonSet",
                NAMESPACE.to_owned(),
                "nvidia-dcgm-exporter".to_owned(),
            ),
            ("Service", NAMESPACE.to_owned(), "nvidia-dcgm-exporter".to_owned()),
        ];
        let text = held_back(&skipped);
        assert!(text.starts_with("; not applied until it is: "), "{text}");
        assert!(text.contains("nvidia-dcgm-exporter"), "{text}");
    }

    #[test]
    fn a_hand_off_wakes_its_controller_only_when_it_changes() {
        let (channel, mut watching) = watch::channel(None::<Upgrades>);
        publish(&channel, Some(Upgrades::NoPolicy));
        assert!(watching.has_changed().unwrap());
        watching.mark_unchanged();
        publish(&channel, Some(Upgrades::NoPolicy));
        assert!(!watching.has_changed().unwrap(), "the same value wakes nobody");
        publish(&channel, None);
        assert!(
            !watching.has_changed().unwrap(),
            "nothing decided leaves the last value"
        );
        assert_eq!(*channel.borrow(), Some(Upgrades::NoPolicy));
    }
}
