//! Writing the rendered objects: server-side apply with the one field manager `gpu-operator`, only for
//! objects whose desired state changed, and pruning of managed objects no longer rendered.
//!
//! "Changed" is decided without reading the live object's body: every applied object carries the hash of
//! its desired state in the annotation [`APPLIED_HASH`], and a metadata-only cache of every managed object
//! (selected by `app.kubernetes.io/managed-by=gpu-operator`) says what was applied last. In steady state
//! this makes zero writes, also right after a restart. An object whose hash is current is written again
//! only when it drifted: another writer changed or removed a field the operator applied, which the cache's
//! copy of the object's `managedFields` shows (see [`crate::drift`]). Pruning deletes, by label, managed
//! objects that the last render did not produce and whose owner reference is the active ClusterPolicy (or
//! one of the NVIDIADrivers rendered with it), by uid: objects of another ClusterPolicy, or of an earlier
//! one of the same name, are left to their owner and to Kubernetes' garbage collector. It never runs for an
//! invalid policy.
//!
//! A refused write stops only what depends on it: the rest of its state, and the states of operands that
//! require its operand on the node (the catalogue's `requires`), of the same owner. Every other state is
//! still applied, and every refusal is returned with the object and the API's reason.
//!
//! A drift repair is an apply too: [`Repairs`] keeps it to one per version of the object, and
//! [`report_drift`] publishes the event that names the writer.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;
use std::sync::Arc;

use gpuop_api::Operand;
use gpuop_api::labels::{APPLIED_HASH, FIELD_MANAGER, MANAGED_BY, MANAGED_BY_VALUE, NVIDIA_DRIVER_NAME};
use gpuop_api::upgrade::observe::is_driver;
use gpuop_render::{Manifest, Rendered};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PropagationPolicy,
};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;
use tracing::{info, warn};

use crate::drift::{self, Drift};

/// A kind the operator renders, with what the API needs to address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManagedKind {
    /// `group/version` or `version` for core.
    pub api_version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Resource (plural).
    pub plural: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
}

/// Every kind the renderer produces, in the order pruning deletes them (DaemonSets first, RBAC last).
pub const MANAGED_KINDS: &[ManagedKind] = &[
    ManagedKind {
        api_version: "apps/v1",
        kind: "DaemonSet",
        plural: "daemonsets",
        namespaced: true,
    },
    ManagedKind {
        api_version: "monitoring.coreos.com/v1",
        kind: "ServiceMonitor",
        plural: "servicemonitors",
        namespaced: true,
    },
    ManagedKind {
        api_version: "v1",
        kind: "Service",
        plural: "services",
        namespaced: true,
    },
    ManagedKind {
        api_version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
        namespaced: true,
    },
    ManagedKind {
        api_version: "rbac.authorization.k8s.io/v1",
        kind: "RoleBinding",
        plural: "rolebindings",
        namespaced: true,
    },
    ManagedKind {
        api_version: "rbac.authorization.k8s.io/v1",
        kind: "Role",
        plural: "roles",
        namespaced: true,
    },
    ManagedKind {
        api_version: "rbac.authorization.k8s.io/v1",
        kind: "ClusterRoleBinding",
        plural: "clusterrolebindings",
        namespaced: false,
    },
    ManagedKind {
        api_version: "rbac.authorization.k8s.io/v1",
        kind: "ClusterRole",
        plural: "clusterroles",
        namespaced: false,
    },
    ManagedKind {
        api_version: "v1",
        kind: "ServiceAccount",
        plural: "serviceaccounts",
        namespaced: true,
    },
    ManagedKind {
        api_version: "node.k8s.io/v1",
        kind: "RuntimeClass",
        plural: "runtimeclasses",
        namespaced: false,
    },
];

impl ManagedKind {
    /// The kind of a rendered object.
    pub fn of(object: &Value) -> Option<&'static ManagedKind> {
        let api_version = object["apiVersion"].as_str()?;
        let kind = object["kind"].as_str()?;
        MANAGED_KINDS
            .iter()
            .find(|k| k.api_version == api_version && k.kind == kind)
    }

    /// The resource as the API and `kubectl` name it: `plural.group`, or `plural` for the core group.
    pub fn resource(&self) -> String {
        match self.api_version.rsplit_once('/') {
            Some((group, _)) => format!("{}.{group}", self.plural),
            None => self.plural.to_owned(),
        }
    }

    /// kube's description of the resource.
    pub fn api_resource(&self) -> ApiResource {
        let (group, version) = self
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", self.api_version));
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, self.kind), self.plural)
    }

    /// The API for objects of this kind (in `namespace` when namespaced).
    pub fn api(&self, client: Client, namespace: &str) -> Api<DynamicObject> {
        let resource = self.api_resource();
        if self.namespaced {
            Api::namespaced_with(client, namespace, &resource)
        } else {
            Api::all_with(client, &resource)
        }
    }
}

/// Identity of an object: kind, namespace (empty for cluster-scoped kinds) and name.
pub type ObjectKey = (&'static str, String, String);

/// Why applying or pruning failed; each names the object.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The renderer produced a kind the operator does not know how to address.
    #[error("{kind} {name:?} is of a kind the operator cannot apply (apiVersion {api_version:?})")]
    UnknownKind {
        /// apiVersion.
        api_version: String,
        /// Kind.
        kind: String,
        /// Name.
        name: String,
    },
    /// The API server refused a write.
    #[error("cannot {verb} {}: {source}", object_name(kind, namespace, name))]
    Api {
        /// `apply`, `take over` or `delete`.
        verb: &'static str,
        /// Kind.
        kind: &'static str,
        /// Namespace; empty for cluster-scoped kinds.
        namespace: String,
        /// Name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
}

impl ApplyError {
    /// The error for a rendered `manifest` of a kind the operator cannot address ([`key_of`] has no key).
    pub fn unknown_kind(manifest: &Manifest) -> Self {
        Self::UnknownKind {
            api_version: manifest.object["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            kind: manifest.kind().to_owned(),
            name: manifest.name().to_owned(),
        }
    }

    /// The API's reason for the refusal (`Forbidden`, `Invalid`, `NotFound`, ...), or `RequestFailed` when
    /// no answer came (a connection error, a timeout), or `UnknownKind`.
    pub fn reason(&self) -> String {
        match self {
            Self::UnknownKind { .. } => "UnknownKind".to_owned(),
            Self::Api { source, .. } => api_reason(source),
        }
    }
}

/// The API's reason in a kube error: the `Status` reason when the server answered one, else a reason made
/// of its HTTP code (`Code502`), else `RequestFailed` (no answer: a connection error, a timeout).
pub fn api_reason(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if is_reason(&status.reason) => status.reason.clone(),
        kube::Error::Api(status) => format!("Code{}", status.code),
        _ => "RequestFailed".to_owned(),
    }
}

/// Whether `reason` can be a condition's reason (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`).
fn is_reason(reason: &str) -> bool {
    let mut chars = reason.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && reason
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        && !reason.ends_with([',', ':'])
}

/// `Kind namespace/name`, or `Kind name` for cluster-scoped objects.
pub fn object_name(kind: &str, namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// The desired object with its owner and the hash of its desired state.
pub fn prepared(manifest: &Manifest, owner: &OwnerReference) -> (Value, String) {
    let mut object = manifest.object.clone();
    object["metadata"]["ownerReferences"] = serde_json::json!([owner]);
    let hash = content_hash(&object);
    object["metadata"]["annotations"][APPLIED_HASH] = Value::String(hash.clone());
    (object, hash)
}

/// A stable hash of an object's JSON (FNV-1a, 64 bits, hex).
pub fn content_hash(object: &Value) -> String {
    let mut hasher = Fnv64::default();
    hasher.write(object.to_string().as_bytes());
    format!("{:016x}", hasher.finish())
}

#[derive(Debug)]
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The controller owner reference every rendered object gets, so that deleting its ClusterPolicy (or
/// NVIDIADriver) garbage-collects them: the same reference every controller puts on what it creates.
pub fn owner_reference<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    gpuop_api::read::controller_ref(owner)
}

/// Every managed object in the caches, by kind. A cache replaces an object's `Arc` when it changes, so two
/// lists whose `Arc`s are the same hold the same objects.
pub fn managed_objects(
    caches: &BTreeMap<&'static str, Store<DynamicObject>>,
) -> Vec<(&'static str, Arc<DynamicObject>)> {
    caches
        .iter()
        .flat_map(|(kind, store)| store.state().into_iter().map(move |object| (*kind, object)))
        .collect()
}

/// What is applied now: object key → the applied-hash annotation, and what drift detection reads, for every
/// managed object read from the caches ([`managed_objects`]).
pub fn live_hashes_of(objects: &[(&'static str, Arc<DynamicObject>)]) -> BTreeMap<ObjectKey, LiveObject> {
    let mut live = BTreeMap::new();
    for (kind, object) in objects {
        let key = (*kind, object.namespace().unwrap_or_default(), object.name_any());
        live.insert(
            key,
            LiveObject {
                hash: object.annotations().get(APPLIED_HASH).cloned(),
                owners: object
                    .owner_references()
                    .iter()
                    .filter(|o| OWNER_KINDS.contains(&o.kind.as_str()))
                    .map(|o| o.uid.clone())
                    .collect(),
                managed: object
                    .labels()
                    .get(MANAGED_BY)
                    .is_some_and(|v| v == MANAGED_BY_VALUE),
                driver: is_driver(Some(object.labels())),
                nvidia_driver: object.labels().get(NVIDIA_DRIVER_NAME).cloned(),
                uid: object.metadata.uid.clone(),
                resource_version: object.metadata.resource_version.clone(),
                managed_fields: object.metadata.managed_fields.clone().unwrap_or_default(),
            },
        );
    }
    live
}

/// Kinds whose objects own what the operator renders: a ClusterPolicy, or an NVIDIADriver.
const OWNER_KINDS: &[&str] = &["ClusterPolicy", "NVIDIADriver"];

/// What the operator needs to know of a live managed object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveObject {
    /// Its applied-hash annotation.
    pub hash: Option<String>,
    /// The uids of the ClusterPolicies and NVIDIADrivers its owner references name.
    pub owners: Vec<String>,
    /// Whether it carries the managed-by label.
    pub managed: bool,
    /// Whether it is a driver's (`app.kubernetes.io/component: nvidia-driver`).
    pub driver: bool,
    /// The NVIDIADriver it was rendered for (its `nvidia.com/nvidiadriver` label).
    pub nvidia_driver: Option<String>,
    /// Its uid, for events about it.
    pub uid: Option<String>,
    /// Its `resourceVersion`.
    pub resource_version: Option<String>,
    /// Its `metadata.managedFields`, as the cache trims them ([`drift::trim_managed_fields`]).
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

impl LiveObject {
    /// Whether the two differ in nothing a plan reads: the `resourceVersion` changes with every write to
    /// the object, its status's included, and tells the plan nothing.
    pub fn same_for_plan(&self, other: &LiveObject) -> bool {
        let Self {
            hash,
            owners,
            managed,
            driver,
            nvidia_driver,
            uid,
            resource_version: _,
            managed_fields,
        } = self;
        *hash == other.hash
            && *owners == other.owners
            && *managed == other.managed
            && *driver == other.driver
            && *nvidia_driver == other.nvidia_driver
            && *uid == other.uid
            && *managed_fields == other.managed_fields
    }
}

/// Objects rendered for one owner (the ClusterPolicy, or one NVIDIADriver).
#[derive(Clone, Copy, Debug)]
pub struct Owned<'a> {
    /// The objects.
    pub rendered: &'a Rendered,
    /// Their owner.
    pub owner: &'a OwnerReference,
}

/// The key of a rendered object.
pub fn key_of(manifest: &Manifest) -> Option<ObjectKey> {
    let kind = ManagedKind::of(&manifest.object)?;
    let namespace = if kind.namespaced {
        manifest.object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
    } else {
        ""
    };
    Some((kind.kind, namespace.to_owned(), manifest.name().to_owned()))
}

/// The decisions of one apply pass: which objects to write, which to delete.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApplyPlan {
    /// Objects to server-side apply, in render order, with their hashes and where they belong.
    pub apply: Vec<(ObjectKey, Value, Step)>,
    /// Of those, the ones applied again because they drifted (their hash is current), and how.
    pub drift: BTreeMap<ObjectKey, Drift>,
    /// Objects to delete, in [`MANAGED_KINDS`] order.
    pub delete: Vec<ObjectKey>,
    /// Of those, the ones deleted with their dependents left behind (driver DaemonSets whose pods the
    /// upgrade controller replaces node by node).
    pub orphan: BTreeSet<ObjectKey>,
}

/// Where a rendered object belongs: which owner rendered it (its index in the `owned` list given to
/// [`plan`]), its ClusterPolicy state and its operand. A refused write skips what depends on it
/// ([`Step::depends_on`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Index of its owner in [`plan`]'s `owned`: 0 is the ClusterPolicy, then the NVIDIADrivers.
    pub owner: usize,
    /// Its state (`state-driver`, `pre-requisites`, ...).
    pub state: &'static str,
    /// Its operand; none for RuntimeClasses and the operator's own metrics objects.
    pub operand: Option<Operand>,
}

impl Step {
    /// Whether an object of this step must wait for `failed`: it is of the same owner and either in the
    /// same state (a DaemonSet whose ServiceAccount or Role was refused) or of an operand that requires
    /// `failed`'s operand on the node (the toolkit needs the driver). Objects of other owners, and of
    /// operands that do not need it, go ahead.
    pub fn depends_on(&self, failed: &Step) -> bool {
        if self.owner != failed.owner {
            return false;
        }
        if self.state == failed.state {
            return true;
        }
        match (self.operand, failed.operand) {
            (Some(operand), Some(required)) => operand.requires_transitively().contains(&required),
            _ => false,
        }
    }
}

/// How managed objects that were not rendered are pruned.
#[derive(Clone, Copy, Debug)]
pub struct Prune<'a> {
    /// Delete driver DaemonSets without their pods: an upgrade pool replaces those pods within its budget,
    /// never all at once.
    pub orphan_drivers: bool,
    /// NVIDIADrivers whose objects stay as they are (invalid ones: nothing running is touched).
    pub keep_drivers: &'a BTreeSet<String>,
}

/// Decides what to write: rendered objects whose hash differs from the live one or that drifted (see
/// [`drift::drift`]), and managed objects that were not rendered and whose owner reference is one of
/// `owned`'s owners, by uid (see [`Prune`]): an object of another ClusterPolicy, or of a deleted one that
/// garbage collection has not reached yet, is not ours to delete.
pub fn plan(
    owned: &[Owned<'_>],
    live: &BTreeMap<ObjectKey, LiveObject>,
    rules: Prune<'_>,
) -> Result<ApplyPlan, ApplyError> {
    let mut plan = ApplyPlan::default();
    let mut wanted = BTreeSet::new();
    let owners: BTreeSet<&str> = owned
        .iter()
        .map(|set| set.owner.uid.as_str())
        .filter(|uid| !uid.is_empty())
        .collect();
    for (index, manifest, owner) in owned
        .iter()
        .enumerate()
        .flat_map(|(index, set)| set.rendered.objects.iter().map(move |m| (index, m, set.owner)))
    {
        let key = key_of(manifest).ok_or_else(|| ApplyError::unknown_kind(manifest))?;
        let (object, hash) = prepared(manifest, owner);
        let step = Step {
            owner: index,
            state: manifest.state,
            operand: manifest.operand,
        };
        match live.get(&key) {
            Some(current) if current.hash.as_deref() == Some(hash.as_str()) => {
                if let Some(drift) = drift::drift(&object, &current.managed_fields) {
                    plan.drift.insert(key.clone(), drift);
                    plan.apply.push((key.clone(), object, step));
                }
            }
            _ => plan.apply.push((key.clone(), object, step)),
        }
        wanted.insert(key);
    }
    for kind in MANAGED_KINDS {
        for (key, object) in live.range((kind.kind, String::new(), String::new())..) {
            if key.0 != kind.kind {
                break;
            }
            let kept = object
                .nvidia_driver
                .as_ref()
                .is_some_and(|name| rules.keep_drivers.contains(name));
            let ours = object.owners.iter().any(|uid| owners.contains(uid.as_str()));
            if object.managed && ours && !wanted.contains(key) && !kept {
                if rules.orphan_drivers && object.driver && key.0 == "DaemonSet" {
                    plan.orphan.insert(key.clone());
                }
                plan.delete.push(key.clone());
            }
        }
    }
    Ok(plan)
}

/// The merge patch that makes the fields NVIDIA's operator wrote ours, if it wrote any: its entries in
/// `metadata.managedFields` (manager `gpu-operator`, operation `Update`, written by its Create and Update
/// calls) are folded into our `Apply` entry, as client-go's `csaupgrade` does when kubectl moves an object
/// from client-side to server-side apply. The patch carries the `resourceVersion` it was computed from, so
/// a concurrent write makes it fail rather than lose ownership information.
pub fn ownership_takeover(live: &DynamicObject) -> Option<Value> {
    let entries = live.metadata.managed_fields.as_ref()?;
    let foreign = |e: &&ManagedFieldsEntry| {
        e.manager.as_deref() == Some(FIELD_MANAGER)
            && e.operation.as_deref() == Some("Update")
            && e.subresource.as_deref().unwrap_or_default().is_empty()
    };
    if !entries.iter().any(|e| foreign(&e)) {
        return None;
    }
    let ours = |e: &ManagedFieldsEntry| {
        e.manager.as_deref() == Some(FIELD_MANAGER) && e.operation.as_deref() == Some("Apply")
    };
    let mut fields = Value::Object(serde_json::Map::new());
    let mut api_version = None;
    let mut time = None;
    for entry in entries.iter().filter(|e| ours(e) || foreign(e)) {
        if let Some(set) = &entry.fields_v1 {
            merge_field_sets(&mut fields, &set.0);
        }
        if ours(entry) || api_version.is_none() {
            api_version.clone_from(&entry.api_version);
            time.clone_from(&entry.time);
        }
    }
    let mut kept: Vec<Value> = entries
        .iter()
        .filter(|e| !ours(e) && !foreign(e))
        .map(|e| serde_json::to_value(e).unwrap_or_default())
        .collect();
    kept.push(serde_json::json!({
        "manager": FIELD_MANAGER,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }));
    Some(serde_json::json!({
        "metadata": {
            "resourceVersion": live.metadata.resource_version,
            "managedFields": kept,
        }
    }))
}

/// The union of two `fieldsV1` sets (nested objects keyed by `f:`/`k:`/`v:`/`i:` path elements).
fn merge_field_sets(into: &mut Value, from: &Value) {
    let (Value::Object(into), Value::Object(from)) = (into, from) else {
        return;
    };
    for (key, value) in from {
        match into.get_mut(key) {
            Some(existing) => merge_field_sets(existing, value),
            None => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

/// A write the API server refused.
#[derive(Debug)]
pub struct Refusal {
    /// Where the refused object belongs; `None` for a deletion (pruning).
    pub step: Option<Step>,
    /// The object and the API's answer.
    pub error: ApplyError,
    /// Objects not written because they depend on the refused one ([`Step::depends_on`]), in order.
    pub skipped: Vec<ObjectKey>,
}

/// What [`execute`] did.
#[derive(Debug, Default)]
pub struct Executed {
    /// Objects applied.
    pub applied: Vec<ObjectKey>,
    /// Objects deleted (or found already gone).
    pub deleted: Vec<ObjectKey>,
    /// Writes refused, in the order they were tried, each with what it held back.
    pub refused: Vec<Refusal>,
}

/// Carries out a plan in order. A refused write holds back only what depends on it (the rest of its state
/// and the states of operands that require its operand, see [`Step::depends_on`]); everything else is still
/// applied, and every deletion is still tried. Each refusal is logged with the object and the API's reason,
/// and returned.
pub async fn execute(client: &Client, namespace: &str, plan: &ApplyPlan) -> Executed {
    let mut done = Executed::default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for (key, object, step) in &plan.apply {
        let (kind, object_namespace, name) = key;
        if let Some(refusal) = done
            .refused
            .iter_mut()
            .find(|r| r.step.is_some_and(|failed| step.depends_on(&failed)))
        {
            refusal.skipped.push(key.clone());
            continue;
        }
        let managed = MANAGED_KINDS
            .iter()
            .find(|k| k.kind == *kind)
            .expect("keys come from MANAGED_KINDS");
        let namespace = if managed.namespaced {
            object_namespace.as_str()
        } else {
            namespace
        };
        let api = managed.api(client.clone(), namespace);
        match apply_one(&api, kind, name, object, &params).await {
            Ok(()) => done.applied.push(key.clone()),
            Err((verb, source)) => {
                let error = ApplyError::Api {
                    verb,
                    kind,
                    namespace: object_namespace.clone(),
                    name: name.clone(),
                    source: Box::new(source),
                };
                warn!(kind, namespace = %object_namespace, name = %name, state = step.state, reason = %error.reason(), %error, "write refused; what depends on it waits");
                done.refused.push(Refusal {
                    step: Some(*step),
                    error,
                    skipped: Vec::new(),
                });
            }
        }
    }
    for key in &plan.delete {
        let (kind, object_namespace, name) = key;
        let managed = MANAGED_KINDS
            .iter()
            .find(|k| k.kind == *kind)
            .expect("keys come from MANAGED_KINDS");
        let orphan = plan.orphan.contains(key);
        let params = DeleteParams {
            propagation_policy: Some(if orphan {
                PropagationPolicy::Orphan
            } else {
                PropagationPolicy::Background
            }),
            ..DeleteParams::default()
        };
        match managed
            .api(client.clone(), object_namespace)
            .delete(name, &params)
            .await
        {
            Ok(_) if orphan => info!(kind, name = %name, "pruned, its pods left for the upgrade controller"),
            Ok(_) => info!(kind, name = %name, "pruned: no longer rendered"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                let error = ApplyError::Api {
                    verb: "delete",
                    kind,
                    namespace: object_namespace.clone(),
                    name: name.clone(),
                    source: Box::new(source),
                };
                warn!(kind, namespace = %object_namespace, name = %name, reason = %error.reason(), %error, "prune refused");
                done.refused.push(Refusal {
                    step: None,
                    error,
                    skipped: Vec::new(),
                });
                continue;
            }
        }
        done.deleted.push(key.clone());
    }
    done
}

/// Applies one object, taking over the fields NVIDIA's operator wrote; on a refusal, says which call.
async fn apply_one(
    api: &Api<DynamicObject>,
    kind: &str,
    name: &str,
    object: &Value,
    params: &PatchParams,
) -> Result<(), (&'static str, kube::Error)> {
    let live = api
        .patch(name, params, &Patch::Apply(object))
        .await
        .map_err(|e| ("apply", e))?;
    if let Some(takeover) = ownership_takeover(&live) {
        // Fields NVIDIA's operator wrote stay its own under server-side apply, so a field it set that
        // we do not render would stay forever. Make them ours, then apply again: what we do not render
        // goes, what we render stays as it is (no change, no restart).
        api.patch(name, &PatchParams::default(), &Patch::Merge(&takeover))
            .await
            .map_err(|e| ("take over", e))?;
        api.patch(name, params, &Patch::Apply(object))
            .await
            .map_err(|e| ("apply", e))?;
        info!(kind, name = %name, "adopted: the fields NVIDIA's operator wrote are ours now");
    }
    info!(kind, name = %name, "applied");
    Ok(())
}

/// Repairs made, by object: the live `resourceVersion` each was made at. An object is repaired at most once
/// per version: if the repair changed nothing the API server keeps the version, and the drift, which then
/// cannot be the work of another writer, is not repaired again until the object changes.
///
/// Also the event recorder of each repaired object: kube's recorder counts a repeated event (same object,
/// reason and action) on the first one, note and all, so a repair of other fields or by another manager gets
/// a recorder, and an event, of its own, while the same repair repeated adds to its event's count.
#[derive(Default)]
pub struct Repairs {
    made: BTreeMap<ObjectKey, String>,
    recorders: BTreeMap<ObjectKey, (String, Recorder)>,
}

impl std::fmt::Debug for Repairs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repairs")
            .field("made", &self.made)
            .finish_non_exhaustive()
    }
}

impl Repairs {
    /// Whether a drift of this live object may be repaired now.
    pub fn due(&self, key: &ObjectKey, live: Option<&LiveObject>) -> bool {
        let version = live.and_then(|l| l.resource_version.as_ref());
        version.is_none() || self.made.get(key) != version
    }

    /// Records a repair made at the live object's version; forgets objects that are no longer live.
    pub fn record(&mut self, key: &ObjectKey, live: Option<&LiveObject>) {
        if let Some(version) = live.and_then(|l| l.resource_version.clone()) {
            self.made.insert(key.clone(), version);
        }
    }

    /// Forgets repairs of objects no longer live.
    pub fn retain_live(&mut self, live: &BTreeMap<ObjectKey, LiveObject>) {
        self.made.retain(|key, _| live.contains_key(key));
        self.recorders.retain(|key, _| live.contains_key(key));
    }

    /// The recorder for the event of this repair (see [`Repairs`]).
    pub fn recorder(&mut self, key: &ObjectKey, drift: &Drift, client: &Client) -> Recorder {
        let note = drift.note(key.0, &key.2);
        match self.recorders.get(key) {
            Some((last, recorder)) if *last == note => recorder.clone(),
            _ => {
                let recorder = Recorder::new(client.clone(), "gpu-operator".into());
                self.recorders.insert(key.clone(), (note, recorder.clone()));
                recorder
            }
        }
    }

    /// Takes out of `plan` the repairs already made at the live version.
    pub fn skip_made(&self, plan: &mut ApplyPlan, live: &BTreeMap<ObjectKey, LiveObject>) {
        let made: BTreeSet<ObjectKey> = plan
            .drift
            .keys()
            .filter(|key| !self.due(key, live.get(*key)))
            .cloned()
            .collect();
        plan.drift.retain(|key, _| !made.contains(key));
        plan.apply.retain(|(key, _, _)| !made.contains(key));
    }
}

/// Logs a repaired drift and publishes a Warning event about it on the object (where `kubectl describe`
/// of the object shows it), related to the object's owner (the ClusterPolicy or NVIDIADriver).
pub async fn report_drift(
    recorder: &Recorder,
    key: &ObjectKey,
    applied: &Value,
    live: &LiveObject,
    drift: &Drift,
) {
    let (kind, namespace, name) = key;
    let note = drift.note(kind, name);
    info!(kind, name = %name, manager = drift.manager.as_deref().unwrap_or_default(), fields = ?drift.fields, "drift repaired");
    let Some(managed) = MANAGED_KINDS.iter().find(|k| k.kind == *kind) else {
        return;
    };
    let regarding = ObjectReference {
        api_version: Some(managed.api_version.to_owned()),
        kind: Some(managed.kind.to_owned()),
        name: Some(name.clone()),
        namespace: managed.namespaced.then(|| namespace.clone()),
        uid: live.uid.clone(),
        ..ObjectReference::default()
    };
    let owner = &applied["metadata"]["ownerReferences"][0];
    let text = |field: &str| owner[field].as_str().map(str::to_owned);
    let related = text("kind").map(|kind| ObjectReference {
        api_version: text("apiVersion"),
        kind: Some(kind),
        name: text("name"),
        uid: text("uid"),
        ..ObjectReference::default()
    });
    let event = Event {
        type_: EventType::Warning,
        reason: drift::REASON.into(),
        note: Some(crate::status::bounded_note(&note)),
        action: "Apply".into(),
        secondary: related,
    };
    if let Err(error) = recorder.publish(&event, &regarding).await {
        warn!(%error, "cannot publish an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The rendered objects: one [`manifest`] per `(kind, apiVersion, name, data)`.
    fn rendered_objects(objects: &[(&str, &str, &str, &str)]) -> Rendered {
        let objects = objects
            .iter()
            .map(|&(kind, api_version, name, data)| manifest(kind, api_version, name, data))
            .collect();
        Rendered { objects }
    }

    fn manifest(kind: &str, api_version: &str, name: &str, data: &str) -> Manifest {
        Manifest {
            state: "state-driver",
            operand: None,
            object: json!({
                "apiVersion": api_version,
                "kind": kind,
                "metadata": {"name": name, "namespace": "gpu-operator", "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
                "data": {"x": data}
            }),
        }
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "nvidia.com/v1".into(),
            kind: "ClusterPolicy".into(),
            name: "p".into(),
            uid: "u".into(),
            ..OwnerReference::default()
        }
    }

    static KEEP_NONE: BTreeSet<String> = BTreeSet::new();
    const NONE: Prune<'static> = Prune {
        orphan_drivers: false,
        keep_drivers: &KEEP_NONE,
    };

    fn one(rendered: &Rendered) -> [Owned<'_>; 1] {
        static OWNER: std::sync::LazyLock<OwnerReference> = std::sync::LazyLock::new(owner);
        [Owned {
            rendered,
            owner: &OWNER,
        }]
    }

    fn live_from(rendered: &Rendered) -> BTreeMap<ObjectKey, LiveObject> {
        rendered
            .objects
            .iter()
            .map(|m| {
                let (_, hash) = prepared(m, &owner());
                (
                    key_of(m).unwrap(),
                    LiveObject {
                        hash: Some(hash),
                        owners: vec!["u".into()],
                        managed: true,
                        driver: false,
                        nvidia_driver: None,
                        ..LiveObject::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn only_changed_objects_are_applied() {
        let rendered = rendered_objects(&[("ConfigMap", "v1", "a", "1"), ("ConfigMap", "v1", "b", "1")]);
        let first = plan(&one(&rendered), &BTreeMap::new(), NONE).unwrap();
        assert_eq!(first.apply.len(), 2);
        let live = live_from(&rendered);
        assert_eq!(
            plan(&one(&rendered), &live, NONE).unwrap(),
            ApplyPlan::default(),
            "steady state writes nothing"
        );
        let changed = rendered_objects(&[("ConfigMap", "v1", "a", "2"), ("ConfigMap", "v1", "b", "1")]);
        let second = plan(&one(&changed), &live, NONE).unwrap();
        assert_eq!(second.apply.len(), 1);
        assert_eq!(
            second.apply[0].0,
            ("ConfigMap", "gpu-operator".to_owned(), "a".to_owned())
        );
        let applied = &second.apply[0].1;
        assert_eq!(applied["metadata"]["ownerReferences"][0]["kind"], "ClusterPolicy");
        assert!(applied["metadata"]["annotations"][APPLIED_HASH].is_string());
    }

    #[test]
    fn a_drifted_object_is_applied_again_and_one_as_applied_is_not() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
        let rendered = rendered_objects(&[("ConfigMap", "v1", "a", "1")]);
        let set = |data: Value| {
            json!({
                "f:metadata": {
                    "f:labels": {format!("f:{MANAGED_BY}"): {}},
                    "f:annotations": {format!("f:{APPLIED_HASH}"): {}},
                    "f:ownerReferences": {"k:{\"uid\":\"u\"}": {
                        ".": {}, "f:apiVersion": {}, "f:kind": {}, "f:name": {}, "f:uid": {}}},
                },
                "f:data": data,
            })
        };
        let entry = |manager: &str, operation: &str, fields: Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        };
        let mut live = live_from(&rendered);
        let key = ("ConfigMap", "gpu-operator".to_owned(), "a".to_owned());
        live.get_mut(&key).unwrap().managed_fields = vec![
            entry(FIELD_MANAGER, "Apply", set(json!({"f:x": {}}))),
            entry(
                "kubectl-edit",
                "Update",
                json!({"f:metadata": {"f:labels": {"f:team": {}}}}),
            ),
        ];
        assert_eq!(
            plan(&one(&rendered), &live, NONE).unwrap(),
            ApplyPlan::default(),
            "as applied, with a person's own label"
        );
        let mut taken = set(json!({}));
        taken.as_object_mut().unwrap().remove("f:data");
        live.get_mut(&key).unwrap().managed_fields = vec![
            entry(FIELD_MANAGER, "Apply", taken),
            entry("kubectl-edit", "Update", json!({"f:data": {"f:x": {}}})),
        ];
        let repair = plan(&one(&rendered), &live, NONE).unwrap();
        assert_eq!(repair.apply.len(), 1, "the edited object is applied again");
        assert_eq!(repair.drift[&key].manager.as_deref(), Some("kubectl-edit"));
        assert_eq!(repair.drift[&key].fields, ["data.x"]);
    }

    #[test]
    fn objects_no_longer_rendered_are_pruned_but_foreign_ones_are_not() {
        let rendered =
            rendered_objects(&[("ConfigMap", "v1", "a", "1"), ("DaemonSet", "apps/v1", "ds", "1")]);
        let mut live = live_from(&rendered);
        let now = rendered_objects(&[("ConfigMap", "v1", "a", "1")]);
        live.insert(
            ("ConfigMap", "gpu-operator".into(), "user".into()),
            LiveObject {
                hash: None,
                owners: Vec::new(),
                managed: true,
                driver: false,
                nvidia_driver: None,
                ..LiveObject::default()
            },
        );
        let plan = plan(&one(&now), &live, NONE).unwrap();
        assert_eq!(
            plan.delete,
            [("DaemonSet", "gpu-operator".to_owned(), "ds".to_owned())]
        );
        assert!(plan.apply.is_empty());
    }

    #[test]
    fn driver_daemonsets_are_orphaned_only_when_nvidia_drivers_take_over() {
        let empty = Rendered { objects: vec![] };
        let key = (
            "DaemonSet",
            "gpu-operator".to_owned(),
            "nvidia-driver-daemonset".to_owned(),
        );
        let live = BTreeMap::from([(
            key.clone(),
            LiveObject {
                hash: None,
                owners: vec!["u".into()],
                managed: true,
                driver: true,
                nvidia_driver: None,
                ..LiveObject::default()
            },
        )]);
        let switched = plan(
            &one(&empty),
            &live,
            Prune {
                orphan_drivers: true,
                ..NONE
            },
        )
        .unwrap();
        assert_eq!(switched.delete, std::slice::from_ref(&key));
        assert!(
            switched.orphan.contains(&key),
            "its pods stay for the upgrade controller"
        );
        let disabled = plan(&one(&empty), &live, NONE).unwrap();
        assert_eq!(disabled.delete, [key]);
        assert!(disabled.orphan.is_empty(), "a disabled driver goes with its pods");
    }

    fn entry(manager: &str, operation: &str, fields: &Value) -> Value {
        json!({"manager": manager, "operation": operation, "apiVersion": "apps/v1",
               "fieldsType": "FieldsV1", "fieldsV1": fields, "time": "2026-12-01T12:00:00Z"})
    }

    fn live_with(entries: &[Value]) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ds", "resourceVersion": "7", "managedFields": entries}
        }))
        .unwrap()
    }

    #[test]
    fn fields_nvidias_operator_wrote_become_ours_and_others_stay_theirs() {
        let live = live_with(&[
            entry(
                "gpu-operator",
                "Update",
                &json!({"f:spec": {"f:template": {"f:x": {}}}}),
            ),
            entry(
                "gpu-operator",
                "Apply",
                &json!({"f:spec": {"f:template": {"f:y": {}}}}),
            ),
            entry("kubectl-edit", "Update", &json!({"f:spec": {"f:z": {}}})),
            json!({"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
                   "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}),
        ]);
        let patch = ownership_takeover(&live).expect("NVIDIA's fields are there to take over");
        assert_eq!(
            patch["metadata"]["resourceVersion"], "7",
            "a concurrent write makes it fail"
        );
        let entries = patch["metadata"]["managedFields"].as_array().unwrap();
        let managers: Vec<_> = entries
            .iter()
            .map(|e| (e["manager"].as_str().unwrap(), e["operation"].as_str().unwrap()))
            .collect();
        assert_eq!(
            managers,
            [
                ("kubectl-edit", "Update"),
                ("kube-controller-manager", "Update"),
                ("gpu-operator", "Apply")
            ]
        );
        assert_eq!(
            entries[2]["fieldsV1"],
            json!({"f:spec": {"f:template": {"f:x": {}, "f:y": {}}}})
        );
        assert_eq!(
            entries[2]["time"], "2026-12-01T12:00:00Z",
            "a time the API accepts"
        );
        let ours_only = live_with(&[entry("gpu-operator", "Apply", &json!({"f:spec": {}}))]);
        assert_eq!(
            ownership_takeover(&ours_only),
            None,
            "nothing to take over: no extra writes"
        );
    }

    #[test]
    fn hashes_are_stable_and_kinds_are_known() {
        let a = manifest("ConfigMap", "v1", "a", "1");
        assert_eq!(prepared(&a, &owner()).1, prepared(&a.clone(), &owner()).1);
        assert_ne!(
            prepared(&a, &owner()).1,
            prepared(&manifest("ConfigMap", "v1", "a", "2"), &owner()).1
        );
        let unknown = rendered_objects(&[("Widget", "example.com/v1", "w", "1")]);
        let error = plan(&one(&unknown), &BTreeMap::new(), NONE).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"Widget "w" is of a kind the operator cannot apply (apiVersion "example.com/v1")"#
        );
        assert_eq!(
            ManagedKind::of(&json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass"}))
                .unwrap()
                .plural,
            "runtimeclasses"
        );
    }

    #[test]
    fn only_objects_of_the_active_policy_are_pruned() {
        let empty = Rendered { objects: vec![] };
        let object = |uid: &str| LiveObject {
            hash: None,
            owners: vec![uid.to_owned()],
            managed: true,
            driver: false,
            nvidia_driver: None,
            uid: None,
            resource_version: None,
            managed_fields: Vec::new(),
        };
        let key = |name: &str| ("ConfigMap", "gpu-operator".to_owned(), name.to_owned());
        let live = BTreeMap::from([
            (key("ours"), object("u")),
            (key("another-policys"), object("other-uid")),
            (key("a-deleted-policys"), object("old-uid-of-p")),
        ]);
        let plan = plan(&one(&empty), &live, NONE).unwrap();
        assert_eq!(
            plan.delete,
            [key("ours")],
            "objects owned by another ClusterPolicy uid are left to it and to garbage collection"
        );
    }

    #[test]
    fn a_refused_state_holds_back_only_its_own_rest_and_the_operands_that_require_it() {
        let step = |owner, state, operand| Step {
            owner,
            state,
            operand,
        };
        let driver = step(0, "state-driver", Some(Operand::Driver));
        let toolkit = step(0, "state-container-toolkit", Some(Operand::ContainerToolkit));
        let plugin = step(0, "state-device-plugin", Some(Operand::DevicePlugin));
        let exporter = step(0, "state-dcgm-exporter", Some(Operand::DcgmExporter));
        let gfd = step(0, "gpu-feature-discovery", Some(Operand::GpuFeatureDiscovery));
        let runtime_classes = step(0, "pre-requisites", None);
        assert!(toolkit.depends_on(&driver));
        assert!(plugin.depends_on(&driver), "transitively, through the toolkit");
        assert!(plugin.depends_on(&toolkit));
        assert!(!driver.depends_on(&toolkit));
        assert!(
            !gfd.depends_on(&exporter),
            "feature discovery does not need the exporter"
        );
        assert!(!plugin.depends_on(&exporter));
        assert!(exporter.depends_on(&exporter), "the rest of its own state waits");
        assert!(!plugin.depends_on(&runtime_classes));
        let pool_driver = step(1, "state-driver", Some(Operand::Driver));
        assert!(
            !toolkit.depends_on(&pool_driver),
            "an NVIDIADriver's refusal does not stop the ClusterPolicy's states"
        );
    }

    #[test]
    fn refusals_carry_the_apis_reason() {
        let refused = |code: u16, reason: &str| ApplyError::Api {
            verb: "apply",
            kind: "Service",
            namespace: "gpu-operator".into(),
            name: "nvidia-dcgm-exporter".into(),
            source: Box::new(kube::Error::Api(Box::new(kube::core::Status {
                status: Some(kube::core::response::StatusSummary::Failure),
                code,
                message: "services \"nvidia-dcgm-exporter\" is forbidden".into(),
                reason: reason.into(),
                details: None,
                metadata: None,
            }))),
        };
        let forbidden = refused(403, "Forbidden");
        assert_eq!(forbidden.reason(), "Forbidden");
        assert!(
            forbidden
                .to_string()
                .starts_with("cannot apply Service gpu-operator/nvidia-dcgm-exporter: "),
            "{forbidden}"
        );
        assert_eq!(refused(502, "").reason(), "Code502");
        assert_eq!(refused(400, "not a reason!").reason(), "Code400");
    }

    #[test]
    fn a_repair_is_made_once_per_version() {
        let key: ObjectKey = ("DaemonSet", "gpu-operator".into(), "ds".into());
        let at = |version: &str| LiveObject {
            resource_version: Some(version.into()),
            ..LiveObject::default()
        };
        let mut repairs = Repairs::default();
        assert!(repairs.due(&key, Some(&at("1"))));
        repairs.record(&key, Some(&at("1")));
        assert!(!repairs.due(&key, Some(&at("1"))), "the repair changed nothing");
        assert!(repairs.due(&key, Some(&at("2"))), "someone wrote again");
        repairs.retain_live(&BTreeMap::new());
        assert!(repairs.due(&key, Some(&at("1"))));
    }
}
