//! `gpu-operator uninstall`: removes everything the operator put on a cluster, as a Helm pre-delete hook
//! does while the operator still runs.
//!
//! It deletes every ClusterPolicy and NVIDIADriver, then watches until the operator has cleaned up after
//! itself: no object labelled `app.kubernetes.io/managed-by=gpu-operator` of any kind the operator renders
//! ([`MANAGED_KINDS`], namespaced ones in the operator namespace, cluster-scoped ones anywhere), and no node
//! carrying anything the operator wrote ([`node_cleanup`]). If the operator has not finished within the
//! first half of the timeout (its Deployment may already be gone), the command removes what is left
//! itself, then watches until nothing is left or the timeout passes.
//!
//! What is left is decided by pure functions over what the watches show ([`node_cleanup`], [`leftovers`]);
//! the operator's own rules are reused, not restated: the labeller with no policy
//! ([`crate::labeler::desired_labels`]) says which labels and annotations are the operator's, and
//! [`gpuop_api::upgrade::release`] which upgrade labels, annotations and cordons are.
//!
//! Nodes: a label is removed only while its value is still the one the operator wrote (the
//! `nvidia.com/gpu-operator.owned-labels` record), so a person's `nvidia.com/gpu.deploy.dcgm=false` stays,
//! as does any label the operator never wrote. A node a driver upgrade cordoned is uncordoned; a node a
//! person had cordoned before its upgrade began stays cordoned.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gpuop_api::labels::{self, GpuDetection, MANAGED_BY, MANAGED_BY_VALUE};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::apply::{MANAGED_KINDS, ManagedKind};
use crate::caches::spawn_until_cancelled;
use crate::labeler::{NodePatch, desired_labels};

/// How to uninstall.
#[derive(Clone, Debug)]
pub struct Options {
    /// The operator namespace (where its namespaced operand objects live).
    pub namespace: String,
    /// The leader-election Lease in that namespace: removed when nobody renews it.
    pub lease_name: String,
    /// How long everything may take. The operator has the first half to clean up after itself.
    pub timeout: Duration,
}

/// What is left to undo on one node. Empty when the node carries nothing of the operator's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCleanup {
    /// Labels and annotations to remove (every value is `None`).
    pub patch: NodePatch,
    /// Uncordon it: a driver upgrade cordoned it.
    pub uncordon: bool,
}

impl NodeCleanup {
    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.patch.is_empty() && !self.uncordon
    }

    /// The merge patch that undoes it and touches nothing else.
    pub fn to_merge_patch(&self) -> Value {
        let mut patch = self.patch.to_merge_patch();
        if self.uncordon {
            patch["spec"] = json!({ "unschedulable": false });
        }
        patch
    }
}

impl fmt::Display for NodeCleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let keys = |map: &BTreeMap<String, Option<String>>| map.keys().cloned().collect::<Vec<_>>().join(",");
        if !self.patch.labels.is_empty() {
            parts.push(format!("labels {}", keys(&self.patch.labels)));
        }
        if !self.patch.annotations.is_empty() {
            parts.push(format!("annotations {}", keys(&self.patch.annotations)));
        }
        if self.uncordon {
            parts.push("cordoned by a driver upgrade".to_owned());
        }
        f.write_str(&parts.join("; "))
    }
}

/// What uninstalling must undo on a node with these labels, annotations and cordon: the labels the operator
/// owns with the values it wrote, its routing label, deploy switches an operand paused, the owned-labels
/// record, and what driver upgrades left (their state label and annotations, their cordon).
pub fn node_cleanup(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    unschedulable: bool,
) -> NodeCleanup {
    // With no policy the labeller only removes, and GPU detection does not matter.
    let mut patch = desired_labels(labels, annotations, None, &GpuDetection::Nfd);
    let release = gpuop_api::upgrade::release(labels, annotations, unschedulable);
    for key in release.labels {
        patch.labels.insert(key.to_owned(), None);
    }
    for key in release.annotations {
        patch.annotations.insert(key.to_owned(), None);
    }
    NodeCleanup {
        patch,
        uncordon: release.uncordon,
    }
}

/// [`node_cleanup`] of a node object.
pub fn node_cleanup_of(node: &Node) -> NodeCleanup {
    let empty = BTreeMap::new();
    node_cleanup(
        node.metadata.labels.as_ref().unwrap_or(&empty),
        node.metadata.annotations.as_ref().unwrap_or(&empty),
        node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
    )
}

/// One thing the operator left on the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leftover {
    /// An object: a ClusterPolicy or NVIDIADriver (still being deleted), or a managed object.
    Object {
        /// Kind.
        kind: &'static str,
        /// Namespace; empty for cluster-scoped objects.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A node's labels, annotations or cordon.
    Node {
        /// The node.
        name: String,
        /// What is left on it.
        cleanup: NodeCleanup,
    },
}

impl fmt::Display for Leftover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Leftover::Object {
                kind,
                namespace,
                name,
            } if namespace.is_empty() => write!(f, "{kind} {name}"),
            Leftover::Object {
                kind,
                namespace,
                name,
            } => write!(f, "{kind} {namespace}/{name}"),
            Leftover::Node { name, cleanup } => write!(f, "Node {name}: {cleanup}"),
        }
    }
}

/// Everything left, from what the watches show: every object listed (the watches select managed objects
/// and the owner kinds), then every node with something to undo.
pub fn leftovers<'a>(
    objects: impl IntoIterator<Item = (&'static str, &'a DynamicObject)>,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Vec<Leftover> {
    let mut left: Vec<Leftover> = objects
        .into_iter()
        .map(|(kind, object)| Leftover::Object {
            kind,
            namespace: object.namespace().unwrap_or_default(),
            name: object.name_any(),
        })
        .collect();
    left.extend(nodes.into_iter().filter_map(|node| {
        let cleanup = node_cleanup_of(node);
        (!cleanup.is_empty()).then(|| Leftover::Node {
            name: node.name_any(),
            cleanup,
        })
    }));
    left
}

/// What an uninstall did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// ClusterPolicies and NVIDIADrivers deleted (`Kind/name`).
    pub deleted: Vec<String>,
    /// Whether the operator removed everything itself, within the first half of the timeout.
    pub operator_finished: bool,
    /// What this command removed itself because the operator did not (printed as [`Leftover`]s).
    pub removed: Vec<String>,
    /// What is still there at the end.
    pub left: Vec<Leftover>,
    /// The holder of the leader-election Lease, left in place because a running operator renews it (it
    /// deletes the Lease when it stops); `None` when there is no Lease or it was removed.
    pub lease_held_by: Option<String>,
    /// How long it took.
    pub elapsed: Duration,
}

/// The summary `gpu-operator uninstall` prints: what was deleted, who cleaned up, and anything left.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    for owner in &report.deleted {
        out.push_str(&format!("deleted {owner}\n"));
    }
    if report.operator_finished {
        out.push_str("the operator removed everything it created\n");
    } else {
        out.push_str("the operator did not finish within half the timeout; removed what was left:\n");
        for removed in &report.removed {
            out.push_str(&format!("  {removed}\n"));
        }
    }
    if let Some(holder) = &report.lease_held_by {
        out.push_str(&format!(
            "the leader-election Lease stays while the running operator ({holder}) renews it; it deletes it when it stops\n"
        ));
    }
    if report.left.is_empty() {
        out.push_str(&format!(
            "nothing is left ({:.1}s)\n",
            report.elapsed.as_secs_f64()
        ));
    } else {
        out.push_str(&format!(
            "left behind after {:.1}s ({}):\n",
            report.elapsed.as_secs_f64(),
            report.left.len()
        ));
        for left in &report.left {
            out.push_str(&format!("  {left}\n"));
        }
    }
    out
}

/// Why uninstalling could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// Listing a kind failed (other than it not being served).
    #[error("cannot list {kind}: {source}")]
    List {
        /// Kind.
        kind: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting a ClusterPolicy or NVIDIADriver failed.
    #[error("cannot delete {kind} {name}: {source}")]
    Delete {
        /// Kind.
        kind: &'static str,
        /// Name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The watches did not list everything within the timeout.
    #[error("cannot see the cluster: the watches of {kinds} did not list within the timeout")]
    NotSynced {
        /// The kinds not listed.
        kinds: String,
    },
}

/// The kinds whose objects own what the operator renders; uninstalling deletes every one of them.
const OWNER_KINDS: [ManagedKind; 2] = [
    ManagedKind {
        api_version: labels::CLUSTER_POLICY_API_VERSION,
        kind: "ClusterPolicy",
        plural: "clusterpolicies",
        namespaced: false,
    },
    ManagedKind {
        api_version: labels::NVIDIA_DRIVER_API_VERSION,
        kind: "NVIDIADriver",
        plural: "nvidiadrivers",
        namespaced: false,
    },
];

/// One RBAC permission a command needs: verbs on a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    /// API group (`""` for core).
    pub group: &'static str,
    /// Resource (plural).
    pub resource: &'static str,
    /// Whether it is granted in the operator namespace (a Role) rather than cluster-wide (a ClusterRole).
    pub namespaced: bool,
    /// Verbs.
    pub verbs: &'static [&'static str],
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() { "core" } else { self.group };
        let scope = if self.namespaced {
            "in the operator namespace"
        } else {
            "cluster-wide"
        };
        write!(
            f,
            "{group} {}: {} ({scope})",
            self.resource,
            self.verbs.join(", ")
        )
    }
}

/// Exactly the permissions [`uninstall`] uses; the chart's pre-delete hook grants these and no more.
pub fn permissions() -> Vec<Permission> {
    let mut permissions: Vec<Permission> = OWNER_KINDS
        .iter()
        .chain(MANAGED_KINDS)
        .map(|kind| Permission {
            group: kind.api_version.rsplit_once('/').map_or("", |(group, _)| group),
            resource: kind.plural,
            namespaced: kind.namespaced,
            verbs: &["list", "watch", "delete"],
        })
        .collect();
    permissions.push(Permission {
        group: "",
        resource: "nodes",
        namespaced: false,
        verbs: &["list", "watch", "patch"],
    });
    permissions.push(Permission {
        group: "coordination.k8s.io",
        resource: "leases",
        namespaced: true,
        verbs: &["get", "delete"],
    });
    permissions
}

/// Watches of the owners, the managed objects and the nodes; every change wakes `changed`.
struct Watches {
    objects: Vec<(&'static str, Store<DynamicObject>)>,
    nodes: Store<Node>,
    changed: Arc<Notify>,
    stop: CancellationToken,
}

impl Drop for Watches {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Watches {
    /// Starts a watch of each kind the cluster serves (a kind whose CRD is not installed has no objects).
    async fn start(client: &Client, namespace: &str) -> Result<Self, UninstallError> {
        let changed = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let managed = format!("{MANAGED_BY}={MANAGED_BY_VALUE}");
        let mut objects = Vec::new();
        let kinds = OWNER_KINDS
            .iter()
            .map(|kind| (kind, None))
            .chain(MANAGED_KINDS.iter().map(|kind| (kind, Some(managed.as_str()))));
        for (kind, selector) in kinds {
            let api = kind.api(client.clone(), namespace);
            let mut params = ListParams::default().limit(1);
            if let Some(selector) = selector {
                params = params.labels(selector);
            }
            match api.list_metadata(&params).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(source) => {
                    return Err(UninstallError::List {
                        kind: kind.kind,
                        source,
                    });
                }
            }
            let mut config = watcher::Config::default();
            if let Some(selector) = selector {
                config = config.labels(selector);
            }
            let writer = reflector::store::Writer::<DynamicObject>::new(kind.api_resource());
            let reader = writer.as_reader();
            let stream = watcher(api, config)
                .default_backoff()
                .modify(|object: &mut DynamicObject| {
                    object.data = Value::Null;
                    object.metadata.managed_fields = None;
                })
                .reflect(writer);
            run(stream, kind.kind, &changed, &stop);
            objects.push((kind.kind, reader));
        }
        let (nodes, writer) = reflector::store();
        let stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(|node: &mut Node| {
                node.metadata.managed_fields = None;
                node.status = None;
            })
            .reflect(writer);
        run(stream, "Node", &changed, &stop);
        Ok(Self {
            objects,
            nodes,
            changed,
            stop,
        })
    }

    /// Waits until every watch has listed once.
    async fn synced(&self, deadline: Instant) -> Result<(), UninstallError> {
        let mut waiting: Vec<&str> = Vec::new();
        for (kind, store) in &self.objects {
            if tokio::time::timeout_at(deadline, store.wait_until_ready())
                .await
                .is_err()
            {
                waiting.push(kind);
            }
        }
        if tokio::time::timeout_at(deadline, self.nodes.wait_until_ready())
            .await
            .is_err()
        {
            waiting.push("Node");
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(UninstallError::NotSynced {
                kinds: waiting.join(", "),
            })
        }
    }

    fn leftovers(&self) -> Vec<Leftover> {
        let objects: Vec<(&'static str, Arc<DynamicObject>)> = self
            .objects
            .iter()
            .flat_map(|(kind, store)| store.state().into_iter().map(move |o| (*kind, o)))
            .collect();
        let nodes = self.nodes.state();
        leftovers(
            objects.iter().map(|(kind, object)| (*kind, &**object)),
            nodes.iter().map(|node| &**node),
        )
    }

    /// Waits, woken by the watches, until nothing is left or `deadline` passes; returns what is left.
    async fn until_clean(&self, deadline: Instant) -> Vec<Leftover> {
        loop {
            let left = self.leftovers();
            if left.is_empty() {
                return left;
            }
            if tokio::time::timeout_at(deadline, self.changed.notified())
                .await
                .is_err()
            {
                return self.leftovers();
            }
        }
    }
}

fn run<S, T>(stream: S, kind: &'static str, changed: &Arc<Notify>, stop: &CancellationToken)
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send,
{
    let changed = changed.clone();
    spawn_until_cancelled(stream, stop, move |item| match item {
        Ok(_) => changed.notify_one(),
        Err(error) => warn!(kind, %error, "watch failed; retrying with back-off"),
    });
}

/// Uninstalls: deletes every ClusterPolicy and NVIDIADriver, gives the operator the first half of the
/// timeout to clean up, removes what is left itself, and reports what is still there at the end.
pub async fn uninstall(client: &Client, options: &Options) -> Result<Report, UninstallError> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    let operator_deadline = started + options.timeout / 2;
    let watches = Watches::start(client, &options.namespace).await?;
    watches.synced(deadline).await?;
    let mut report = Report::default();

    for owner in &OWNER_KINDS {
        let Some((_, store)) = watches.objects.iter().find(|(kind, _)| *kind == owner.kind) else {
            continue;
        };
        let api = owner.api(client.clone(), &options.namespace);
        for object in store.state() {
            let name = object.name_any();
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(source) => {
                    return Err(UninstallError::Delete {
                        kind: owner.kind,
                        name,
                        source,
                    });
                }
            }
            info!(kind = owner.kind, name = %name, "deleted");
            report.deleted.push(format!("{}/{name}", owner.kind));
        }
    }

    info!(
        seconds = operator_deadline.saturating_duration_since(started).as_secs(),
        "waiting for the operator to remove what it created"
    );
    let left = watches.until_clean(operator_deadline).await;
    if left.is_empty() {
        report.operator_finished = true;
    } else {
        info!(
            left = left.len(),
            "the operator did not finish; removing what is left"
        );
        for leftover in &left {
            if remove(client, &options.namespace, leftover).await {
                report.removed.push(leftover.to_string());
            }
        }
    }
    report.left = watches.until_clean(deadline).await;
    match remove_unrenewed_lease(client, options).await {
        Ok(LeaseOutcome::Removed) => report
            .removed
            .push(format!("Lease {}/{}", options.namespace, options.lease_name)),
        Ok(LeaseOutcome::Held(holder)) => report.lease_held_by = Some(holder),
        Ok(LeaseOutcome::Absent) => {}
        Err(source) => report.left.push(Leftover::Object {
            kind: "Lease",
            namespace: options.namespace.clone(),
            name: format!("{} ({source})", options.lease_name),
        }),
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// What became of the leader-election Lease.
enum LeaseOutcome {
    /// There is none.
    Absent,
    /// Nobody renewed it: deleted.
    Removed,
    /// A running operator renews it: left to that operator, which deletes it when it stops.
    Held(String),
}

/// The holder a Lease names, if any.
pub fn lease_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|holder| !holder.is_empty())
}

/// Deletes the operator's leader-election Lease when nobody renews it (the operator stopped without
/// releasing it, or never ran), with a precondition on what was read. Whether somebody renews it is judged
/// by this command's own clock, as a candidate for the lease judges it (lease.rs), never by the holder's
/// timestamps: a Lease with a holder is watched for its whole duration, and one that changes in that time
/// is renewed.
async fn remove_unrenewed_lease(client: &Client, options: &Options) -> Result<LeaseOutcome, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &options.namespace);
    let Some(mut lease) = api.get_opt(&options.lease_name).await? else {
        return Ok(LeaseOutcome::Absent);
    };
    if let Some(holder) = lease_holder(&lease).map(str::to_owned) {
        let seconds = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0);
        let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0).max(1));
        let started = Instant::now();
        while started.elapsed() <= duration {
            tokio::time::sleep(duration.min(Duration::from_secs(1))).await;
            let Some(now) = api.get_opt(&options.lease_name).await? else {
                return Ok(LeaseOutcome::Absent);
            };
            if now.metadata.resource_version != lease.metadata.resource_version {
                info!(lease = %options.lease_name, %holder, "the Lease is renewed by a running operator, which deletes it when it stops");
                return Ok(LeaseOutcome::Held(holder));
            }
            lease = now;
        }
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&options.lease_name, &params).await {
        Ok(_) => {
            info!(lease = %options.lease_name, "deleted the operator's Lease, which nobody renewed");
            Ok(LeaseOutcome::Removed)
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(LeaseOutcome::Absent),
        Err(error) => Err(error),
    }
}

/// Removes one leftover; returns whether the request was accepted (a failure is logged, and what it left
/// shows in the final check).
async fn remove(client: &Client, namespace: &str, leftover: &Leftover) -> bool {
    let result = match leftover {
        Leftover::Object {
            kind,
            namespace: object_namespace,
            name,
        } => {
            let Some(managed) = OWNER_KINDS.iter().chain(MANAGED_KINDS).find(|k| k.kind == *kind) else {
                return false;
            };
            let namespace = if object_namespace.is_empty() {
                namespace
            } else {
                object_namespace
            };
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            managed
                .api(client.clone(), namespace)
                .delete(name, &params)
                .await
                .map(|_| ())
        }
        Leftover::Node { name, cleanup } => Api::<Node>::all(client.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(cleanup.to_merge_patch()),
            )
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => {
            info!(%leftover, "removed");
            true
        }
        Err(kube::Error::Api(status)) if status.code == 404 => true,
        Err(error) => {
            warn!(%leftover, %error, "cannot remove");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_api::labels::OWNED_LABELS;
    use gpuop_api::labels::{DRIVER_OWNER, GPU_PRESENT, UPGRADE_ENABLED_ANNOTATION, UPGRADE_STATE};
    use gpuop_testkit::fixture;

    #[test]
    fn only_what_the_operator_wrote_is_removed_from_a_node() {
        let labels = fixture::labels(&[
            (GPU_PRESENT, "true"),
            ("nvidia.com/gpu.deploy.driver", "true"),
            // Written as "true", since changed by a person: theirs now.
            ("nvidia.com/gpu.deploy.dcgm", "false"),
            ("team", "ml"),
            (DRIVER_OWNER, "default"),
            (UPGRADE_STATE, "validation-required"),
        ]);
        let annotations = fixture::labels(&[
            (
                OWNED_LABELS,
                "nvidia.com/gpu.present=true,nvidia.com/gpu.deploy.driver=true,nvidia.com/gpu.deploy.dcgm=true",
            ),
            (UPGRADE_ENABLED_ANNOTATION, "true"),
            ("note", "a person's"),
        ]);
        let cleanup = node_cleanup(&labels, &annotations, true);
        let removed: Vec<&str> = cleanup.patch.labels.keys().map(String::as_str).collect();
        assert_eq!(
            removed,
            [
                UPGRADE_STATE,
                DRIVER_OWNER,
                "nvidia.com/gpu.deploy.driver",
                GPU_PRESENT,
            ]
        );
        assert!(cleanup.patch.labels.values().all(Option::is_none));
        let annotations_removed: Vec<&str> = cleanup.patch.annotations.keys().map(String::as_str).collect();
        assert_eq!(annotations_removed, [UPGRADE_ENABLED_ANNOTATION, OWNED_LABELS]);
        assert!(cleanup.uncordon, "the upgrade cordoned it");
        let patch = cleanup.to_merge_patch();
        assert_eq!(patch["spec"]["unschedulable"], false);
        assert_eq!(patch["metadata"]["labels"][GPU_PRESENT], Value::Null);
        assert!(patch["metadata"]["labels"].get("team").is_none());

        // Once patched, nothing is left.
        let after = fixture::labels(&[("nvidia.com/gpu.deploy.dcgm", "false"), ("team", "ml")]);
        assert!(node_cleanup(&after, &fixture::labels(&[("note", "a person's")]), false).is_empty());
    }

    #[test]
    fn a_lease_without_a_holder_names_none() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        let lease = |holder: Option<&str>| Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert_eq!(
            lease_holder(&lease(Some("gpu-operator-0"))),
            Some("gpu-operator-0")
        );
        assert_eq!(lease_holder(&lease(Some(""))), None);
        assert_eq!(lease_holder(&lease(None)), None);
        assert_eq!(lease_holder(&Lease::default()), None);
    }

    #[test]
    fn leftovers_name_every_object_and_node() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator"}
        }))
        .unwrap();
        let role: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "nvidia-operator-validator"}
        }))
        .unwrap();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-0", "labels": {GPU_PRESENT: "true", "team": "ml"},
                         "annotations": {OWNED_LABELS: "nvidia.com/gpu.present=true"}}
        }))
        .unwrap();
        let clean: Node =
            serde_json::from_value(json!({"metadata": {"name": "cpu-0", "labels": {"team": "ml"}}})).unwrap();
        let left: Vec<String> = leftovers([("DaemonSet", &object), ("ClusterRole", &role)], [&node, &clean])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            left,
            [
                "DaemonSet gpu-operator/nvidia-driver-daemonset",
                "ClusterRole nvidia-operator-validator",
                "Node gpu-0: labels nvidia.com/gpu.present; annotations nvidia.com/gpu-operator.owned-labels",
            ]
        );
    }
}
