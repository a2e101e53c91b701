//! The objects, their resource versions and their history, and the semantics of every verb: what a create,
//! update, patch, apply or delete does to an object and which watch events it causes.
//!
//! Invariants:
//! - one global resource version counter; every stored change takes the next value, and watch events of a
//!   resource reach watchers in that order;
//! - each resource keeps a bounded history of changes; a watch from a version older than the history's floor
//!   is expired (410), as is a LIST with `resourceVersionMatch=Exact` below it;
//! - a write that changes nothing stores nothing and sends no event, as on a real server;
//! - garbage collection and namespace cleanup run to completion after every write ([`State::settle`]).
//!
//! What each write does to an object is in [`crate::write`]. Nothing here knows HTTP: the router turns
//! requests into these calls and errors into `Status` objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::authz::rbac::{RbacIndex, RbacKind};
use crate::authz::{CreateOnApply, Escalation};
use crate::causes;
use crate::clock::{Clock, format_time};
use crate::error::{ApiError, GroupKind};
use crate::json::{self, text};
use crate::object::Stored;
use crate::patch::PatchType;
use crate::pods;
use crate::random::Random;
use crate::registry::{Registry, ResourceInfo, StorageKey};
use crate::selector::{FieldSelector, LabelSelector};
use crate::shape::Shape;
use crate::ssa::Scope;

/// Namespace and name; the namespace is empty for cluster-scoped objects.
pub(crate) type ObjectKey = (String, String);

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. \
You can start a new list without the continue parameter, or use the continue token in this response to retrieve \
the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that \
were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// How deleting a pod that is bound to a node behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodTermination {
    /// The pod goes at once, as if its kubelet confirmed instantly.
    #[default]
    Immediate,
    /// The pod gets `deletionTimestamp` and `deletionGracePeriodSeconds` and stays until it is deleted again
    /// with `gracePeriodSeconds=0`, which is what a kubelet does once the containers have stopped.
    Kubelet,
}

/// Tunables of the store.
#[derive(Clone, Debug)]
pub(crate) struct StoreOptions {
    pub(crate) history: usize,
    pub(crate) channel: usize,
    pub(crate) snapshots: usize,
    pub(crate) seed: u64,
    pub(crate) pod_termination: PodTermination,
}

/// What kind of change a watch event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One stored change: the object after it (with the change's resource version) and before it.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) kind: ChangeKind,
    pub(crate) object: Arc<Stored>,
    pub(crate) previous: Option<Arc<Stored>>,
    /// When the change was stored: a delayed watch delivers it a fixed time after this.
    pub(crate) at: tokio::time::Instant,
    line: Bytes,
}

impl Change {
    /// The change of `kind` that stores `value` (of resource `info`). The object is encoded once, inside
    /// its watch event line: the stored object's bytes are a slice of the line, so history holds one copy.
    fn new(kind: ChangeKind, value: &Value, info: &ResourceInfo, previous: Option<Arc<Stored>>) -> Self {
        let (object, line) = Stored::with_event_line(value, info, kind.as_str());
        Self {
            kind,
            object,
            previous,
            at: tokio::time::Instant::now(),
            line,
        }
    }

    pub(crate) fn resource_version(&self) -> u64 {
        self.object.meta.resource_version
    }

    /// The watch event line for this change, encoded once and shared by every watcher.
    pub(crate) fn line(&self) -> &Bytes {
        &self.line
    }
}

/// `{"type":"<kind>","object":<object>}\n`.
pub(crate) fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// The objects of one resource and their recent history.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) objects: BTreeMap<ObjectKey, Arc<Stored>>,
    pub(crate) history: VecDeque<Arc<Change>>,
    /// Changes at or below this version are no longer in `history`.
    pub(crate) floor: u64,
    pub(crate) sender: broadcast::Sender<Arc<Change>>,
}

impl Table {
    fn new(channel: usize, floor: u64) -> Self {
        Self {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            floor,
            sender: broadcast::channel(channel.max(1)).0,
        }
    }

    /// The objects in `namespace` (all when `None`), in key order.
    pub(crate) fn objects_in<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Stored>> + 'a> {
        match namespace {
            Some(namespace) => Box::new(
                self.objects
                    .range((namespace.to_owned(), String::new())..)
                    .take_while(move |((ns, _), _)| ns == namespace)
                    .map(|(_, stored)| stored),
            ),
            None => Box::new(self.objects.values()),
        }
    }
}

/// How unknown fields in a write are treated (`fieldValidation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

/// Who writes, and how.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriteOptions {
    pub(crate) manager: String,
    pub(crate) dry_run: bool,
    pub(crate) validation: FieldValidation,
    /// The write goes to the `/status` subresource.
    pub(crate) status: bool,
    /// Server-side apply: take fields other managers own.
    pub(crate) force: bool,
    /// Keep a `uid` and `creationTimestamp` the object brings (loading fixtures).
    pub(crate) keep_identity: bool,
    /// The keys the request body gave twice (dotted paths), reported as field validation asks.
    pub(crate) duplicates: Vec<String>,
    /// In rbac mode, for writes of Roles and bindings: the privilege-escalation check.
    pub(crate) escalation: Option<Arc<Escalation>>,
    /// In rbac mode, for a server-side apply: the requester's `create` authorization, which the server
    /// also demands when the apply creates the object.
    pub(crate) create_on_apply: Option<Arc<CreateOnApply>>,
}

/// The outcome of a successful write.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) object: Arc<Stored>,
    pub(crate) created: bool,
    pub(crate) warnings: Vec<String>,
}

/// How dependents of a deleted object are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    Orphan,
    Background,
    Foreground,
}

/// Options of a delete.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOptions {
    pub(crate) propagation: Option<Propagation>,
    pub(crate) grace_period_seconds: Option<i64>,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) dry_run: bool,
}

/// The outcome of a delete.
#[derive(Debug)]
pub(crate) enum Deleted {
    /// The object is gone; this is its last state.
    Gone(Arc<Stored>),
    /// The object stays until finalizers (or a kubelet) let it go.
    Pending(Arc<Stored>),
}

/// Which resource version a LIST must serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VersionMatch {
    NotOlderThan,
    Exact,
}

/// A LIST request.
#[derive(Clone, Debug, Default)]
pub(crate) struct ListQuery {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) version_match: Option<VersionMatch>,
}

/// A LIST answer.
#[derive(Debug)]
pub(crate) struct ListResult {
    pub(crate) items: Vec<Arc<Stored>>,
    pub(crate) resource_version: u64,
    pub(crate) continue_token: Option<String>,
    pub(crate) remaining: Option<usize>,
}

/// A WATCH request.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchQuery {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) resource_version: Option<String>,
    pub(crate) version_match: Option<VersionMatch>,
    pub(crate) send_initial_events: Option<bool>,
    pub(crate) bookmarks: bool,
}

/// Where a watch starts: the synthetic initial events, the replayed history and the live feed.
#[derive(Debug)]
pub(crate) struct WatchStart {
    pub(crate) initial: Vec<Arc<Stored>>,
    /// Send the `k8s.io/initial-events-end` bookmark at this version after the initial events.
    pub(crate) initial_end: Option<u64>,
    pub(crate) backlog: Vec<Arc<Change>>,
    pub(crate) receiver: broadcast::Receiver<Arc<Change>>,
    /// Events at or below this version are already covered.
    pub(crate) from: u64,
    /// The version asked for is gone: send this in-stream error and close.
    pub(crate) expired: Option<ApiError>,
}

#[derive(Debug)]
struct Snapshot {
    id: u64,
    resource_version: u64,
    /// What was listed: a token is good only for the same resource and namespace.
    key: StorageKey,
    namespace: Option<String>,
    items: Arc<Vec<Arc<Stored>>>,
}

/// Something the controllers must look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// An object went: its dependents may have lost their last owner.
    OwnerGone { uid: String },
    /// An object with owner references was written: its owners may not exist.
    Dependent { uid: String },
    /// An object may be waiting for its dependents (`foregroundDeletion`).
    Foreground { uid: String },
    /// An object is being deleted with `orphan` propagation.
    Orphan { uid: String },
    /// A namespace may be terminating and may now be empty.
    Namespace { name: String },
    /// A CRD may be terminating and may now have no custom resources left.
    Definition { name: String },
}

/// The request a write comes from: the API server decodes each differently, so unknown fields are refused
/// (under `fieldValidation=Strict`) in each one's own words.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Source<'a> {
    /// POST or PUT: the body is the object; 400 `... cannot be handled as a ...: strict decoding error`.
    Body,
    /// A JSON, merge or strategic merge patch (the patch as sent): the patched object is decoded, and the
    /// refusal is a 422 about the field `patch`.
    Patch(PatchType, &'a Value),
    /// Server-side apply: unknown fields of the configuration were refused before merging (see
    /// [`State::refuse_undeclared`]); `fieldValidation` only checks the configuration for duplicates.
    Apply,
    /// The server's own writes (fixtures, bootstrap, controllers): unknown fields are dropped.
    Server,
}

/// The mutable state, behind the store's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) rv: u64,
    pub(crate) registry: Registry,
    pub(crate) tables: HashMap<StorageKey, Table>,
    pub(crate) uids: HashMap<String, (StorageKey, ObjectKey)>,
    pub(crate) dependents: HashMap<String, BTreeSet<String>>,
    pub(crate) gc: VecDeque<Work>,
    pub(crate) random: Random,
    snapshots: VecDeque<Snapshot>,
    next_snapshot: u64,
    pub(crate) next_ip: u32,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: StoreOptions,
    /// The RBAC index to keep up to date with Roles and bindings, in rbac mode only.
    pub(crate) rbac: Option<Arc<RwLock<RbacIndex>>>,
}

/// The store: state behind a lock, and the last resource version whose events have been sent.
#[derive(Debug)]
pub(crate) struct Store {
    state: Mutex<State>,
    committed: Arc<AtomicU64>,
    /// The state's clock, readable without its lock (ages in `Table` output).
    clock: Arc<dyn Clock>,
}

impl crate::authz::ServiceAccounts for Store {
    fn service_account_uid(&self, namespace: &str, name: &str) -> Result<String, ApiError> {
        let info = self
            .resolve("", "v1", "serviceaccounts")
            .ok_or(ApiError::NoSuchPath)?;
        Ok(self.get(&info, namespace, name)?.meta.uid.clone())
    }
}

impl Store {
    /// The clock objects are stamped with.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A store holding what every cluster has: the system namespaces (with their `default` service
    /// accounts) and the system priority classes.
    pub(crate) fn new(options: StoreOptions, clock: Arc<dyn Clock>) -> Self {
        let state = State {
            rv: 0,
            registry: Registry::builtin(),
            tables: HashMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            gc: VecDeque::new(),
            random: Random::new(options.seed),
            snapshots: VecDeque::new(),
            next_snapshot: 0,
            next_ip: 10,
            clock: clock.clone(),
            options,
            rbac: None,
        };
        let store = Self {
            state: Mutex::new(state),
            committed: Arc::new(AtomicU64::new(0)),
            clock,
        };
        let opts = WriteOptions {
            manager: "kube-apiserver".into(),
            ..WriteOptions::default()
        };
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            store
                .create_object(namespace, &opts)
                .expect("system namespaces are valid");
        }
        for (name, value) in [
            ("system-node-critical", 2_000_001_000),
            ("system-cluster-critical", 2_000_000_000),
        ] {
            let class = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value,
                "description": "Used for system critical pods that must not be moved from their current node."});
            store
                .create_object(class, &opts)
                .expect("system priority classes are valid");
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state, then garbage-collects and publishes the new committed version.
    fn write<T>(&self, f: impl FnOnce(&mut State) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let mut state = self.lock();
        let result = f(&mut state);
        state.settle();
        self.committed.store(state.rv, Ordering::Release);
        result
    }

    /// Keeps `index` up to date with the Roles and bindings stored, from those stored now on.
    pub(crate) fn track_rbac(&self, index: Arc<RwLock<RbacIndex>>) {
        let mut state = self.lock();
        {
            let mut index = index.write().unwrap_or_else(PoisonError::into_inner);
            for (key, table) in &state.tables {
                if key.group != crate::authz::RBAC_GROUP {
                    continue;
                }
                if let Some(kind) = RbacKind::from_plural(&key.plural) {
                    for stored in table.objects.values() {
                        index.upsert(kind, &stored.value());
                    }
                }
            }
        }
        state.rbac = Some(index);
    }

    /// The version up to which every event has been handed to watchers.
    pub(crate) fn committed(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// The current resource version.
    pub(crate) fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// The resource served at `group/version/plural`.
    pub(crate) fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.lock().registry.find(group, version, plural)
    }

    /// A copy of the registry, for discovery.
    pub(crate) fn registry(&self) -> Registry {
        self.lock().registry.clone()
    }

    /// How many objects each resource holds.
    pub(crate) fn counts(&self) -> Vec<(StorageKey, usize)> {
        let state = self.lock();
        let mut counts: Vec<(StorageKey, usize)> = state
            .tables
            .iter()
            .map(|(key, table)| (key.clone(), table.objects.len()))
            .collect();
        counts.sort();
        counts
    }

    /// Expires every version older than now: history is dropped, so older watches and continue tokens get 410.
    pub(crate) fn compact(&self) {
        let mut state = self.lock();
        let rv = state.rv;
        for table in state.tables.values_mut() {
            table.history.clear();
            table.floor = rv;
        }
        state.snapshots.clear();
    }

    pub(crate) fn get(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<Stored>, ApiError> {
        let state = self.lock();
        state
            .lookup(info, namespace, name)
            .ok_or_else(|| not_found(info, name))
    }

    /// Creates an object found by its own `apiVersion` and `kind` (fixtures, bootstrap).
    pub(crate) fn create_object(&self, object: Value, opts: &WriteOptions) -> Result<Written, ApiError> {
        let api_version = text(&object, "/apiVersion").to_owned();
        let kind = text(&object, "/kind").to_owned();
        let info = self
            .lock()
            .registry
            .find_kind(&api_version, &kind)
            .ok_or_else(|| {
                ApiError::BadRequest(format!("no resource is registered for {api_version} {kind}"))
            })?;
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let namespace = if info.namespaced {
            Some(namespace.unwrap_or_else(|| "default".into()))
        } else {
            None
        };
        self.create(&info, namespace.as_deref(), object, opts)
    }

    pub(crate) fn create(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: Option<&str>,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.write(|state| state.create(info, namespace, body, opts, Source::Body))
    }

    pub(crate) fn update(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.write(|state| state.update(info, namespace, name, body, opts))
    }

    pub(crate) fn patch(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        kind: PatchType,
        patch: &Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.write(|state| match kind {
            PatchType::Apply => state.apply(info, namespace, name, patch, opts),
            _ => state.patch(info, namespace, name, kind, patch, opts),
        })
    }

    pub(crate) fn delete(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        self.write(|state| state.delete(info, namespace, name, opts))
    }

    /// Deletes every object the query selects; returns what was deleted (or is now being deleted).
    pub(crate) fn delete_collection(
        &self,
        info: &Arc<ResourceInfo>,
        namespace: Option<&str>,
        query: &ListQuery,
        opts: &DeleteOptions,
    ) -> Result<Vec<Arc<Stored>>, ApiError> {
        self.write(|state| {
            let targets: Vec<ObjectKey> = state
                .table(&info.storage_key())
                .objects_in(namespace)
                .filter(|s| selects(info, s, &query.labels, &query.fields))
                .map(|s| (s.meta.namespace.clone(), s.meta.name.clone()))
                .collect();
            let mut deleted = Vec::new();
            for (namespace, name) in targets {
                match state.delete(info, &namespace, &name, opts) {
                    Ok(Deleted::Gone(object) | Deleted::Pending(object)) => deleted.push(object),
                    Err(ApiError::NotFound { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            Ok(deleted)
        })
    }

    /// The `pods/eviction` subresource: deletes the pod unless a disruption budget forbids it.
    pub(crate) fn evict(&self, namespace: &str, name: &str, eviction: &Value) -> Result<(), ApiError> {
        self.write(|state| {
            let pods = state.registry.find("", "v1", "pods").expect("pods are built in");
            let budgets_info = state
                .registry
                .find("policy", "v1", "poddisruptionbudgets")
                .expect("built in");
            let pod = state
                .lookup(&pods, namespace, name)
                .ok_or_else(|| not_found(&pods, name))?
                .value();
            let budgets: Vec<Value> = state
                .table(&budgets_info.storage_key())
                .objects_in(Some(namespace))
                .map(|b| b.value())
                .collect();
            let selectors: Vec<LabelSelector> = budgets
                .iter()
                .filter_map(|b| LabelSelector::from_object(b.pointer("/spec/selector")).ok())
                .collect();
            let neighbours: Vec<Value> = state
                .table(&pods.storage_key())
                .objects_in(Some(namespace))
                .filter(|p| selectors.iter().any(|s| s.matches(p.as_ref())))
                .map(|p| p.value())
                .collect();
            pods::may_evict(&pod, &budgets, &neighbours)?;
            let options = eviction.get("deleteOptions");
            let opts = DeleteOptions {
                grace_period_seconds: options
                    .and_then(|o| o.get("gracePeriodSeconds"))
                    .and_then(Value::as_i64),
                uid: options
                    .and_then(|o| o.pointer("/preconditions/uid"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                resource_version: options
                    .and_then(|o| o.pointer("/preconditions/resourceVersion"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                ..DeleteOptions::default()
            };
            state.delete(&pods, namespace, name, &opts).map(|_| ())
        })
    }

    /// The `pods/binding` subresource.
    pub(crate) fn bind(
        &self,
        namespace: &str,
        name: &str,
        binding: &Value,
        manager: &str,
    ) -> Result<(), ApiError> {
        self.write(|state| {
            let pods = state.registry.find("", "v1", "pods").expect("pods are built in");
            let stored = state
                .lookup(&pods, namespace, name)
                .ok_or_else(|| not_found(&pods, name))?;
            let now = state.now();
            let mut value = stored.value();
            pods::bind(&mut value, binding, &now)?;
            state.system_update(
                &pods,
                &stored,
                value,
                manager,
                Scope::Main {
                    status_subresource: false,
                },
            );
            Ok(())
        })
    }

    /// The `namespaces/{name}/finalize` subresource: replaces `spec.finalizers`.
    pub(crate) fn finalize_namespace(
        &self,
        name: &str,
        body: &Value,
        manager: &str,
    ) -> Result<Arc<Stored>, ApiError> {
        self.write(|state| {
            let namespaces = state.registry.find("", "v1", "namespaces").expect("built in");
            let stored = state
                .lookup(&namespaces, "", name)
                .ok_or_else(|| not_found(&namespaces, name))?;
            let mut value = stored.value();
            value["spec"]["finalizers"] = body.pointer("/spec/finalizers").cloned().unwrap_or(json!([]));
            Ok(state.system_update(
                &namespaces,
                &stored,
                value,
                manager,
                Scope::Main {
                    status_subresource: true,
                },
            ))
        })
    }

    pub(crate) fn list(
        &self,
        info: &ResourceInfo,
        namespace: Option<&str>,
        query: &ListQuery,
    ) -> Result<ListResult, ApiError> {
        let mut state = self.lock();
        if let Some(token) = &query.continue_token {
            let token = ContinueToken::parse(token)?;
            if query
                .resource_version
                .as_deref()
                .is_some_and(|rv| !rv.is_empty() && rv != "0")
            {
                return Err(ApiError::BadRequest(
                    "specifying resource version is not allowed when using continue".into(),
                ));
            }
            let snapshot = state
                .snapshots
                .iter()
                .find(|s| s.id == token.snapshot)
                .ok_or_else(|| ApiError::Expired(CONTINUE_EXPIRED.into()))?;
            if snapshot.resource_version != token.resource_version
                || snapshot.key != info.storage_key()
                || snapshot.namespace.as_deref() != namespace
            {
                return Err(invalid_continue(""));
            }
            let (items, rv, id, offset) = (
                snapshot.items.clone(),
                snapshot.resource_version,
                token.snapshot,
                token.offset,
            );
            return Ok(page(&items, offset, query.limit, rv, id, query));
        }
        let current = state.rv;
        let requested = parse_version(query.resource_version.as_deref())?;
        let table = state.table(&info.storage_key());
        let (items, rv, unpaged): (Vec<Arc<Stored>>, u64, bool) = match (requested, query.version_match) {
            (None, _) => (collect(info, table, namespace, query), current, false),
            (Some(0), _) => (collect(info, table, namespace, query), current, true),
            (Some(wanted), _) if wanted > current => {
                return Err(ApiError::Timeout(format!(
                    "Too large resource version: {wanted}, current: {current}"
                )));
            }
            (Some(wanted), Some(VersionMatch::Exact)) => {
                if wanted < table.floor {
                    return Err(ApiError::Expired(format!(
                        "too old resource version: {wanted} ({})",
                        table.floor
                    )));
                }
                let past = historical(table, wanted);
                let items = past
                    .values()
                    .filter(|s| namespace.is_none_or(|ns| s.meta.namespace == ns))
                    .filter(|s| selects(info, s, &query.labels, &query.fields))
                    .cloned()
                    .collect();
                (items, wanted, false)
            }
            (Some(_), _) => (collect(info, table, namespace, query), current, false),
        };
        let limit = if unpaged {
            None
        } else {
            query.limit.filter(|limit| *limit > 0)
        };
        match limit {
            Some(limit) if items.len() > limit => {
                let id = state.next_snapshot;
                state.next_snapshot += 1;
                let items = Arc::new(items);
                state.snapshots.push_back(Snapshot {
                    id,
                    resource_version: rv,
                    key: info.storage_key(),
                    namespace: namespace.map(str::to_owned),
                    items: items.clone(),
                });
                while state.snapshots.len() > state.options.snapshots {
                    state.snapshots.pop_front();
                }
                Ok(page(&items, 0, Some(limit), rv, id, query))
            }
            _ => Ok(ListResult {
                items,
                resource_version: rv,
                continue_token: None,
                remaining: None,
            }),
        }
    }

    pub(crate) fn watch(
        &self,
        info: &ResourceInfo,
        namespace: Option<&str>,
        query: &WatchQuery,
    ) -> Result<WatchStart, ApiError> {
        if query.send_initial_events == Some(true) {
            let mut causes = Vec::new();
            if query.version_match != Some(VersionMatch::NotOlderThan) {
                causes.push(causes::forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !causes.is_empty() {
                let kind = GroupKind {
                    group: "meta.k8s.io".into(),
                    kind: "ListOptions".into(),
                };
                return Err(ApiError::invalid_causes(kind, "", causes));
            }
        }
        let mut state = self.lock();
        let current = state.rv;
        let requested = parse_version(query.resource_version.as_deref())?;
        let table = state.table(&info.storage_key());
        let receiver = table.sender.subscribe();
        let list_query = ListQuery {
            labels: query.labels.clone(),
            fields: query.fields.clone(),
            ..ListQuery::default()
        };
        let mut start = WatchStart {
            initial: Vec::new(),
            initial_end: None,
            backlog: Vec::new(),
            receiver,
            from: current,
            expired: None,
        };
        match (query.send_initial_events, requested) {
            (Some(true), wanted) => {
                if let Some(wanted) = wanted.filter(|w| *w > current) {
                    return Err(ApiError::Timeout(format!(
                        "Too large resource version: {wanted}, current: {current}"
                    )));
                }
                start.initial = collect(info, table, namespace, &list_query);
                // kube-apiserver v1.36 takes `sendInitialEvents` without `allowWatchBookmarks`, and then
                // sends no bookmark at the end of the initial events either.
                start.initial_end = query.bookmarks.then_some(current);
            }
            (Some(false), None | Some(0)) => {}
            (None, None | Some(0)) => start.initial = collect(info, table, namespace, &list_query),
            (_, Some(wanted)) => {
                if wanted < table.floor {
                    start.expired = Some(ApiError::Expired(format!(
                        "too old resource version: {wanted} ({})",
                        table.floor
                    )));
                } else {
                    start.backlog = table
                        .history
                        .iter()
                        .filter(|c| c.resource_version() > wanted)
                        .cloned()
                        .collect();
                    start.from = wanted;
                }
            }
        }
        Ok(start)
    }
}

fn parse_version(text: Option<&str>) -> Result<Option<u64>, ApiError> {
    match text {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|error: std::num::ParseIntError| {
                // `APIObjectVersioner.ParseResourceVersion`'s invalid error, wrapped by the storage layer.
                let why = match error.kind() {
                    std::num::IntErrorKind::PosOverflow => "value out of range",
                    _ => "invalid syntax",
                };
                ApiError::BadRequest(format!(
                    "invalid resource version: resourceVersion: Invalid value: {text:?}: strconv.ParseUint: parsing {text:?}: {why}"
                ))
            }),
    }
}

/// Where a paged list goes on: the snapshot of its first page and how far into it. On the wire it is what
/// kube-apiserver sends, base64url (unpadded) JSON with the version of the encoding `v`, the resource
/// version `rv` and the start `start` (here `<snapshot>/<offset>` rather than an etcd key), so a client
/// that sends back something else gets the real server's refusals.
#[derive(Debug, PartialEq, Eq)]
struct ContinueToken {
    snapshot: u64,
    offset: usize,
    resource_version: u64,
}

const CONTINUE_VERSION: &str = "meta.k8s.io/v1";

/// kube-apiserver's 400 for a continue token it cannot read.
fn invalid_continue(detail: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "invalid continue token: continue key is not valid{detail}"
    ))
}

impl ContinueToken {
    fn encode(&self) -> String {
        let json = json!({
            "v": CONTINUE_VERSION,
            "rv": self.resource_version,
            "start": format!("{}/{}", self.snapshot, self.offset),
        });
        URL_SAFE_NO_PAD.encode(json.to_string())
    }

    fn parse(token: &str) -> Result<Self, ApiError> {
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|error| {
            // Go's base64 reports the offset of the first byte it could not use.
            let at = match error {
                base64::DecodeError::InvalidByte(at, _) | base64::DecodeError::InvalidLastSymbol(at, _) => at,
                base64::DecodeError::InvalidLength(length) => length,
                base64::DecodeError::InvalidPadding => token.len(),
            };
            invalid_continue(&format!(": illegal base64 data at input byte {at}"))
        })?;
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|error| invalid_continue(&format!(": {error}")))?;
        if value.get("v").and_then(Value::as_str) != Some(CONTINUE_VERSION) {
            return Err(invalid_continue(
                ": server does not recognize this encoded version",
            ));
        }
        let resource_version = value
            .get("rv")
            .and_then(Value::as_u64)
            .filter(|rv| *rv > 0)
            .ok_or_else(|| {
                invalid_continue(": incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
            })?;
        let start = value
            .get("start")
            .and_then(Value::as_str)
            .filter(|start| !start.is_empty())
            .ok_or_else(|| invalid_continue(": encoded start key empty (version meta.k8s.io/v1)"))?;
        let (snapshot, offset) = start
            .split_once('/')
            .and_then(|(snapshot, offset)| Some((snapshot.parse().ok()?, offset.parse().ok()?)))
            .ok_or_else(|| invalid_continue(&format!(": {start}")))?;
        Ok(Self {
            snapshot,
            offset,
            resource_version,
        })
    }
}

fn page(
    items: &Arc<Vec<Arc<Stored>>>,
    offset: usize,
    limit: Option<usize>,
    rv: u64,
    id: u64,
    query: &ListQuery,
) -> ListResult {
    // A token is client input: its offset may be anything, so nothing here may overflow or slice past the end.
    let start = offset.min(items.len());
    let end = limit.map_or(items.len(), |limit| start.saturating_add(limit).min(items.len()));
    let more = end < items.len();
    let token = ContinueToken {
        snapshot: id,
        offset: end,
        resource_version: rv,
    };
    ListResult {
        items: items.get(start..end).unwrap_or_default().to_vec(),
        resource_version: rv,
        continue_token: more.then(|| token.encode()),
        // The real server counts the rest only when no selector filters the list.
        remaining: (more && query.labels.is_empty() && query.fields.is_empty())
            .then(|| items.len().saturating_sub(end)),
    }
}

/// Whether a stored object passes the label and field selectors.
pub(crate) fn selects(
    info: &ResourceInfo,
    stored: &Stored,
    labels: &LabelSelector,
    fields: &FieldSelector,
) -> bool {
    labels.matches(stored) && fields.matches(|field| stored.field(info, field))
}

fn collect(
    info: &ResourceInfo,
    table: &Table,
    namespace: Option<&str>,
    query: &ListQuery,
) -> Vec<Arc<Stored>> {
    if let (Some(namespace), Some(name)) = (
        namespace.or((!info.namespaced).then_some("")),
        query.fields.required("metadata.name"),
    ) {
        return table
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .filter(|s| selects(info, s, &query.labels, &query.fields))
            .cloned()
            .into_iter()
            .collect();
    }
    table
        .objects_in(namespace)
        .filter(|s| selects(info, s, &query.labels, &query.fields))
        .cloned()
        .collect()
}

/// The table's objects as they were at version `at`, rebuilt by undoing later changes.
fn historical(table: &Table, at: u64) -> BTreeMap<ObjectKey, Arc<Stored>> {
    let mut objects = table.objects.clone();
    for change in table
        .history
        .iter()
        .rev()
        .take_while(|c| c.resource_version() > at)
    {
        let key = (
            change.object.meta.namespace.clone(),
            change.object.meta.name.clone(),
        );
        match (&change.kind, &change.previous) {
            (ChangeKind::Added, _) | (_, None) => {
                objects.remove(&key);
            }
            (_, Some(previous)) => {
                objects.insert(key, previous.clone());
            }
        }
    }
    objects
}

pub(crate) fn not_found(info: &ResourceInfo, name: &str) -> ApiError {
    ApiError::NotFound {
        resource: info.group_resource(),
        name: name.to_owned(),
    }
}

/// The shape of an object of this resource, for merges.
pub(crate) fn shape_of(info: &ResourceInfo) -> Shape<'_> {
    match &info.custom {
        Some(custom) => Shape::custom(custom.schema.as_ref()),
        None => Shape::builtin(&info.kind),
    }
}

pub(crate) fn metadata_mut(value: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !value.get("metadata").is_some_and(Value::is_object) {
        value["metadata"] = json!({});
    }
    value["metadata"].as_object_mut().expect("just made an object")
}

pub(crate) fn finalizers(value: &Value) -> Vec<String> {
    json::strings(value, "/metadata/finalizers")
}

impl State {
    pub(crate) fn now(&self) -> String {
        format_time(self.clock.now())
    }

    pub(crate) fn table(&mut self, key: &StorageKey) -> &mut Table {
        let (channel, floor) = (self.options.channel, self.rv);
        self.tables
            .entry(key.clone())
            .or_insert_with(|| Table::new(channel, floor))
    }

    pub(crate) fn lookup(&self, info: &ResourceInfo, namespace: &str, name: &str) -> Option<Arc<Stored>> {
        let namespace = if info.namespaced { namespace } else { "" };
        self.tables
            .get(&info.storage_key())?
            .objects
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The resource of a storage key, at its storage (or first) version.
    pub(crate) fn info_for(&self, key: &StorageKey) -> Option<Arc<ResourceInfo>> {
        let candidates = self
            .registry
            .all()
            .iter()
            .filter(|r| r.group == key.group && r.plural == key.plural);
        let mut first = None;
        for candidate in candidates {
            if candidate
                .custom
                .as_ref()
                .is_none_or(|c| c.storage_version == candidate.version)
            {
                return Some(candidate.clone());
            }
            first.get_or_insert_with(|| candidate.clone());
        }
        first
    }

    /// An object by uid, with its resource.
    pub(crate) fn by_uid(&self, uid: &str) -> Option<(Arc<ResourceInfo>, Arc<Stored>)> {
        let (key, object) = self.uids.get(uid)?;
        let stored = self.tables.get(key)?.objects.get(object)?.clone();
        Some((self.info_for(key)?, stored))
    }

    fn publish(&mut self, key: &StorageKey, change: Change) {
        // The authorizer's index changes with the store, before the writer is answered, as if its informer
        // had no lag.
        if let Some(index) = &self.rbac
            && key.group == crate::authz::RBAC_GROUP
            && let Some(kind) = RbacKind::from_plural(&key.plural)
        {
            let mut index = index.write().unwrap_or_else(PoisonError::into_inner);
            let object = change.object.value();
            match change.kind {
                ChangeKind::Deleted => index.remove(kind, &object),
                ChangeKind::Added | ChangeKind::Modified => index.upsert(kind, &object),
            }
        }
        let history = self.options.history;
        let table = self.table(key);
        let change = Arc::new(change);
        table.history.push_back(change.clone());
        while table.history.len() > history {
            if let Some(dropped) = table.history.pop_front() {
                table.floor = dropped.resource_version();
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = table.sender.send(change);
    }

    fn index(&mut self, stored: &Arc<Stored>, key: StorageKey) {
        for owner in &stored.meta.owners {
            self.dependents
                .entry(owner.uid.clone())
                .or_default()
                .insert(stored.meta.uid.clone());
        }
        let object = (stored.meta.namespace.clone(), stored.meta.name.clone());
        self.uids.insert(stored.meta.uid.clone(), (key, object));
    }

    fn unindex(&mut self, stored: &Stored) {
        for owner in &stored.meta.owners {
            if let Some(dependents) = self.dependents.get_mut(&owner.uid) {
                dependents.remove(&stored.meta.uid);
                if dependents.is_empty() {
                    self.dependents.remove(&owner.uid);
                }
            }
        }
    }

    /// Stores `value` as the object's next version and tells watchers.
    pub(crate) fn commit(
        &mut self,
        info: &ResourceInfo,
        mut value: Value,
        previous: Option<Arc<Stored>>,
    ) -> Arc<Stored> {
        self.rv += 1;
        metadata_mut(&mut value).insert("resourceVersion".into(), Value::from(self.rv.to_string()));
        let kind = if previous.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        let change = Change::new(kind, &value, info, previous);
        let stored = change.object.clone();
        let key = info.storage_key();
        if let Some(previous) = &change.previous {
            self.unindex(previous);
        }
        self.index(&stored, key.clone());
        let object = (stored.meta.namespace.clone(), stored.meta.name.clone());
        self.table(&key).objects.insert(object, stored.clone());
        self.publish(&key, change);
        if !stored.meta.owners.is_empty() {
            self.gc.push_back(Work::Dependent {
                uid: stored.meta.uid.clone(),
            });
        }
        stored
    }

    /// Removes the object (whose last state is `value`) and tells watchers.
    pub(crate) fn remove(
        &mut self,
        info: &ResourceInfo,
        mut value: Value,
        previous: &Arc<Stored>,
    ) -> Arc<Stored> {
        self.rv += 1;
        metadata_mut(&mut value).insert("resourceVersion".into(), Value::from(self.rv.to_string()));
        let change = Change::new(ChangeKind::Deleted, &value, info, Some(previous.clone()));
        let stored = change.object.clone();
        let key = info.storage_key();
        let object = (previous.meta.namespace.clone(), previous.meta.name.clone());
        self.table(&key).objects.remove(&object);
        self.uids.remove(&previous.meta.uid);
        self.unindex(previous);
        self.publish(&key, change);
        self.gc.push_back(Work::OwnerGone {
            uid: previous.meta.uid.clone(),
        });
        for owner in &previous.meta.owners {
            self.gc.push_back(Work::Foreground {
                uid: owner.uid.clone(),
            });
        }
        if info.namespaced {
            self.gc.push_back(Work::Namespace {
                name: previous.meta.namespace.clone(),
            });
        }
        if let Some(custom) = &info.custom {
            self.gc.push_back(Work::Definition {
                name: custom.crd_name.clone(),
            });
        }
        if info.is("apiextensions.k8s.io", "CustomResourceDefinition") {
            self.registry.unregister_crd(&value);
            self.tables.remove(&StorageKey::of_crd(&value));
        }
        stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn store(history: usize) -> Store {
        let options = StoreOptions {
            history,
            channel: 64,
            snapshots: 4,
            seed: 1,
            pod_termination: PodTermination::Immediate,
        };
        Store::new(options, Arc::new(ManualClock::default()))
    }

    fn configmaps(store: &Store) -> Arc<ResourceInfo> {
        store.resolve("", "v1", "configmaps").expect("built in")
    }

    fn write(store: &Store, name: &str, value: &str) -> Arc<Stored> {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
                            "data": {"k": value}});
        let opts = WriteOptions {
            manager: "test".into(),
            ..WriteOptions::default()
        };
        let info = configmaps(store);
        match store.get(&info, "default", name) {
            Ok(_) => store.update(&info, "default", name, object, &opts),
            Err(_) => store.create(&info, Some("default"), object, &opts),
        }
        .expect("written")
        .object
    }

    #[test]
    fn a_write_that_changes_nothing_stores_nothing() {
        let store = store(10);
        let first = write(&store, "a", "1");
        let version = store.resource_version();
        let again = write(&store, "a", "1");
        assert_eq!(again.meta.resource_version, first.meta.resource_version);
        assert_eq!(store.resource_version(), version);
        let changed = write(&store, "a", "2");
        assert_eq!(changed.meta.resource_version, version + 1);
    }

    #[test]
    fn watches_replay_history_until_it_is_gone() {
        let store = store(2);
        let info = configmaps(&store);
        let first = write(&store, "a", "1").meta.resource_version;
        write(&store, "a", "2");
        write(&store, "a", "3");
        let query = |rv: u64| WatchQuery {
            resource_version: Some(rv.to_string()),
            ..WatchQuery::default()
        };
        // Two changes are remembered: watching from the first write replays both of them.
        let start = store.watch(&info, None, &query(first)).expect("watch");
        assert!(start.expired.is_none());
        assert_eq!(start.backlog.len(), 2);
        write(&store, "a", "4");
        let start = store.watch(&info, None, &query(first)).expect("watch");
        assert_eq!(
            start.expired.map(|e| e.code()),
            Some(410),
            "the change after {first} was forgotten"
        );
    }

    #[test]
    fn an_exact_list_rebuilds_the_past() {
        let store = store(10);
        let info = configmaps(&store);
        let then = write(&store, "a", "1").meta.resource_version;
        write(&store, "a", "2");
        write(&store, "b", "1");
        let query = ListQuery {
            resource_version: Some(then.to_string()),
            version_match: Some(VersionMatch::Exact),
            ..ListQuery::default()
        };
        let past = store.list(&info, Some("default"), &query).expect("listed");
        assert_eq!(past.resource_version, then);
        let values: Vec<Value> = past
            .items
            .iter()
            .map(|s| s.value()["data"]["k"].clone())
            .collect();
        assert_eq!(values, [json!("1")]);
    }

    #[test]
    fn a_continue_offset_past_the_end_pages_nothing() {
        let store = store(10);
        for name in ["a", "b", "c"] {
            write(&store, name, "1");
        }
        let items = Arc::new(
            store
                .list(&configmaps(&store), Some("default"), &ListQuery::default())
                .expect("listed")
                .items,
        );
        // A token is client input: an offset at the end of the address space must not overflow.
        let past = page(&items, usize::MAX, Some(2), 7, 0, &ListQuery::default());
        assert!(past.items.is_empty());
        assert_eq!(past.continue_token, None);
        let middle = page(&items, 1, Some(1), 7, 0, &ListQuery::default());
        assert_eq!(middle.items.len(), 1);
        assert_eq!(middle.remaining, Some(1));
    }

    #[test]
    fn continue_tokens_are_read_as_kube_apiserver_reads_them() {
        let token = ContinueToken {
            snapshot: 3,
            offset: 2,
            resource_version: 9,
        };
        assert_eq!(ContinueToken::parse(&token.encode()), Ok(token));
        let message = |token: &str| ContinueToken::parse(token).map_err(|e| e.to_string()).err();
        assert_eq!(
            message("!!!").as_deref(),
            Some("invalid continue token: continue key is not valid: illegal base64 data at input byte 0")
        );
        assert_eq!(
            message(&URL_SAFE_NO_PAD.encode(r#"{"v":"meta.k8s.io/v1","rv":1,"start":"x"}"#)).as_deref(),
            Some("invalid continue token: continue key is not valid: x")
        );
    }
}
