//! An in-memory Kubernetes API server that speaks the real HTTP/JSON protocol, so that `kube::Client`,
//! kube-runtime's `watcher`/`Controller` and `kubectl` use it unchanged. It is the ground the operator's
//! tests, benchmarks and demo stand on; where it is more lenient than a real API server, the operator would
//! pass here and fail in clusters, so fidelity is the point.
//!
//! Two ways in:
//! - in-process: [`FakeServer::client`] is a `kube::Client` over the router as a `tower::Service`, no
//!   sockets;
//! - on a socket: [`FakeServer::serve`] listens on `127.0.0.1` and writes a kubeconfig for it
//!   (`gpu-sim serve` does this from the command line).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gpuop_fakeserver::{FakeServer, Verb};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//!
//! let server = FakeServer::new();
//! let configmaps: Api<ConfigMap> = Api::default_namespaced(server.client_as("my-test"));
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("a".into());
//! configmaps.create(&PostParams::default(), &cm).await?;
//! assert_eq!(server.requests().count(Verb::Create, "configmaps"), 1);
//! assert_eq!(server.requests().writes_by("my-test"), 1);
//! # Ok(()) }
//! ```
//!
//! What it implements, and where it approximates, is listed in `docs/fakeserver.md`. In short: the
//! built-in resources this project needs plus any CRD, every verb with the real resource-version rules,
//! watches with bookmarks and the in-stream 410, JSON/merge/strategic patches and server-side apply with
//! managed fields and conflicts, status subresources, finalizers, owner-reference garbage collection,
//! namespace cleanup, discovery and enough OpenAPI for `kubectl apply`, request accounting and faults.
//!
//! Module map: `store` holds objects, their history and the read verbs, `write` what each write does, `gc` the controllers that delete
//! things, `ssa` and `fieldset` server-side apply, `patch` and `strategic` the other patches,
//! `typed`, `defaults` and `validation` what the server does to an object before storing it,
//! `watch` and `encode` what goes on the wire, `http` the router, `discovery` the discovery
//! documents, `accounting` and `faults` the test hooks, `authz` who may do what (tokens, RBAC and the
//! authorization report; only in [`Authorization::Rbac`] mode, see `docs/fakeserver.md`).

pub mod accounting;
pub mod authz;
mod causes;
mod clock;
mod defaults;
mod discovery;
mod encode;
mod error;
pub mod faults;
mod fieldset;
mod gc;
mod http;
mod json;
mod load;
mod logs;
mod object;
mod patch;
mod pods;
mod protobuf;
mod random;
mod registry;
mod selector;
mod serve;
mod shape;
mod ssa;
mod store;
mod strategic;
mod table;
mod typed;
mod validation;
mod watch;
mod write;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ::http::HeaderValue;
use serde_json::Value;

pub use accounting::{JournalEntry, RequestCounts, RequestKey, Verb, client_label};
pub use authz::Authorization;
pub use authz::report::{AuthorizationReport, Decided, Denial, GrantedRule, UserReport};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{ApiError, Cause, GroupKind, GroupResource};
pub use faults::{Faults, InjectedError};
pub use load::LoadError;
pub use logs::LogStream;
pub use serve::{ConnectError, Running, kubeconfig_with_token, kubeconfig_yaml};
pub use store::PodTermination;

use crate::accounting::{Journal, ListenerName, RequestLog};
use crate::authz::Authz;
use crate::faults::FaultInjector;
use crate::http::Shared;
use crate::store::{Store, StoreOptions, WriteOptions};

/// Settings of a [`FakeServer`], with the defaults of a real API server where one exists.
#[derive(Debug)]
#[must_use]
pub struct Builder {
    clock: Arc<dyn Clock>,
    seed: u64,
    history: usize,
    channel: usize,
    snapshots: usize,
    bookmark_interval: Duration,
    watch_timeout: Duration,
    pod_termination: PodTermination,
    faults: Faults,
    authorization: Authorization,
    journal: usize,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            seed: 0,
            history: 10_000,
            channel: 16_384,
            snapshots: 64,
            bookmark_interval: Duration::from_secs(60),
            watch_timeout: Duration::from_secs(30 * 60),
            pod_termination: PodTermination::Immediate,
            faults: Faults::default(),
            authorization: Authorization::AlwaysAllow,
            journal: 0,
        }
    }
}

impl Builder {
    /// The clock for `creationTimestamp`, `deletionTimestamp` and managed-field times.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The seed for uids and generated names (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How many changes each resource remembers for watches from an older version (default 10,000).
    /// Watching from before the oldest remembered change answers the in-stream 410.
    pub fn history(mut self, changes_per_resource: usize) -> Self {
        self.history = changes_per_resource.max(1);
        self
    }

    /// How far a watcher may fall behind before its stream is closed (default 16,384 changes).
    pub fn watch_buffer(mut self, changes: usize) -> Self {
        self.channel = changes.max(1);
        self
    }

    /// How often watches that allow bookmarks get one (default 60 s, like the API server).
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// How long a watch without `timeoutSeconds` lasts (default 30 min).
    pub fn watch_timeout(mut self, timeout: Duration) -> Self {
        self.watch_timeout = timeout;
        self
    }

    /// How deleting a pod bound to a node behaves (default [`PodTermination::Immediate`]).
    pub fn pod_termination(mut self, termination: PodTermination) -> Self {
        self.pod_termination = termination;
        self
    }

    /// Faults in force from the start.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// How requests are authorized (default [`Authorization::AlwaysAllow`]). With
    /// [`Authorization::Rbac`] requests need a bearer token ([`FakeServer::admin_token`],
    /// [`FakeServer::token_for`]) and are authorized by RBAC; the in-process [`FakeServer::client`] and
    /// [`FakeServer::client_as`] carry the admin token.
    pub fn authorization(mut self, authorization: Authorization) -> Self {
        self.authorization = authorization;
        self
    }

    /// Keep a journal of the newest `capacity` requests, each with its object, arrival and answer times and
    /// listener, read with [`FakeServer::take_journal`] (default 0: none).
    pub fn journal(mut self, capacity: usize) -> Self {
        self.journal = capacity;
        self
    }

    /// The server, holding the system namespaces and priority classes every cluster has (and in rbac mode
    /// the bootstrap ClusterRoles and bindings).
    pub fn build(self) -> FakeServer {
        let options = StoreOptions {
            history: self.history,
            channel: self.channel,
            snapshots: self.snapshots,
            seed: self.seed,
            pod_termination: self.pod_termination,
        };
        let faults = FaultInjector::default();
        faults.set(self.faults);
        let authz = Arc::new(Authz::new(self.authorization, self.seed, self.clock.clone()));
        let store = Store::new(options, self.clock);
        if authz.enforcing() {
            store.track_rbac(authz.index.clone());
            let opts = WriteOptions {
                manager: "kube-apiserver".into(),
                ..WriteOptions::default()
            };
            for object in authz::bootstrap_policy() {
                store
                    .create_object(object, &opts)
                    .expect("the bootstrap policy is valid");
            }
        }
        FakeServer {
            shared: Arc::new(Shared {
                store,
                requests: RequestLog::default(),
                journal: Journal::new(self.journal),
                faults,
                watch_drops: tokio::sync::watch::Sender::new(0),
                bookmark_interval: self.bookmark_interval,
                watch_timeout: self.watch_timeout,
                authz,
                logs: Default::default(),
            }),
        }
    }
}

/// An in-memory API server. Clones share the same cluster.
#[derive(Clone, Debug)]
pub struct FakeServer {
    shared: Arc<Shared>,
}

impl Default for FakeServer {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeServer {
    /// A server with default settings.
    pub fn new() -> Self {
        Builder::default().build()
    }

    /// Settings for a server.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The HTTP router, usable as a `tower::Service` or served with `axum::serve`.
    pub fn router(&self) -> axum::Router {
        http::router(self.shared.clone())
    }

    /// An in-process client (no `User-Agent`; its requests count as client `unknown`). In rbac mode it is
    /// the admin.
    pub fn client(&self) -> kube::Client {
        self.client_with(None, self.admin_token().as_deref())
    }

    /// An in-process client whose requests carry `User-Agent: <agent>`, so they can be counted per client
    /// and their writes get `<agent>` (up to a `/`) as field manager. In rbac mode it is the admin.
    pub fn client_as(&self, agent: &str) -> kube::Client {
        self.client_with(Some(agent), self.admin_token().as_deref())
    }

    /// An in-process client sending `Authorization: Bearer <token>` (and `User-Agent: <agent>` if given):
    /// in rbac mode it is whoever the token names.
    pub fn client_with(&self, agent: Option<&str>, token: Option<&str>) -> kube::Client {
        let agent = agent.map(|agent| {
            HeaderValue::from_str(agent).unwrap_or_else(|_| HeaderValue::from_static("invalid-agent"))
        });
        let token = token.map(|token| {
            HeaderValue::from_str(&format!("Bearer {token}"))
                .unwrap_or_else(|_| HeaderValue::from_static("Bearer invalid"))
        });
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut request: ::http::Request<kube::client::Body>| {
                if let Some(agent) = &agent {
                    request
                        .headers_mut()
                        .insert(::http::header::USER_AGENT, agent.clone());
                }
                if let Some(token) = &token {
                    request
                        .headers_mut()
                        .insert(::http::header::AUTHORIZATION, token.clone());
                }
                request
            })
            .service(self.router());
        kube::Client::new(service, "default")
    }

    /// How the server authorizes requests.
    pub fn authorization(&self) -> Authorization {
        self.shared.authz.mode()
    }

    /// The admin's bearer token (user `kubernetes-admin`, groups `system:masters` and
    /// `system:authenticated`), in rbac mode; it is the same for the same seed.
    pub fn admin_token(&self) -> Option<String> {
        self.shared.authz.admin_token().map(str::to_owned)
    }

    /// A token for the existing ServiceAccount `namespace/name`, valid for an hour, as
    /// `kubectl create token` gets one: user `system:serviceaccount:<namespace>:<name>`.
    pub fn token_for(&self, namespace: &str, service_account: &str) -> Result<String, ApiError> {
        self.shared
            .authz
            .mint(&self.shared.store, namespace, service_account, 3600)
            .map(|(token, _)| token)
    }

    /// An in-process client acting as the ServiceAccount `namespace/name` (with `User-Agent: <name>`).
    pub fn client_for_service_account(&self, namespace: &str, name: &str) -> Result<kube::Client, ApiError> {
        let token = self.token_for(namespace, name)?;
        Ok(self.client_with(Some(name), Some(&token)))
    }

    /// Every authorization decision so far: refused requests, and per user the granted rules and how often
    /// each was used (empty in always-allow mode). Also served to `system:masters` at
    /// `GET /fake/authorization`.
    pub fn authorization_report(&self) -> AuthorizationReport {
        self.shared.authz.report()
    }

    /// Forgets the decisions recorded so far (also `DELETE /fake/authorization`).
    pub fn reset_authorization_report(&self) {
        self.shared.authz.reset_report();
    }

    /// Serves the router on `addr` (use port 0 for a free one).
    pub async fn serve(&self, addr: SocketAddr) -> std::io::Result<Running> {
        Running::start(self.router(), addr, self.admin_token()).await
    }

    /// Serves the router on `addr` as [`FakeServer::serve`], naming every request that comes through this
    /// listener `name` in the journal ([`Builder::journal`]): processes that send the same `User-Agent`
    /// (two replicas of one operator) are told apart by the listener each is given.
    pub async fn serve_as(&self, addr: SocketAddr, name: &str) -> std::io::Result<Running> {
        let router = self.router().layer(axum::Extension(ListenerName(name.into())));
        Running::start(router, addr, self.admin_token()).await
    }

    /// Creates an object, found by its `apiVersion` and `kind`, keeping a `uid` and `creationTimestamp` it
    /// brings (so fixtures can refer to each other by owner references). Returns the stored object.
    pub fn insert(&self, object: Value) -> Result<Value, ApiError> {
        let opts = WriteOptions {
            manager: "gpu-sim-load".into(),
            keep_identity: true,
            ..WriteOptions::default()
        };
        Ok(self.shared.store.create_object(object, &opts)?.object.value())
    }

    /// Creates every object in a YAML (multi-document) or JSON text; returns how many.
    pub fn load_yaml(&self, text: &str) -> Result<usize, LoadError> {
        let objects = load::documents(text, "input")?
            .into_iter()
            .map(|o| ("input".to_owned(), o))
            .collect();
        load::create_all(&self.shared.store, objects)
    }

    /// Creates every object in the directory's `*.yaml`, `*.yml` and `*.json` files; returns how many.
    pub fn load_dir(&self, dir: &Path) -> Result<usize, LoadError> {
        load::create_all(&self.shared.store, load::read_dir(dir)?)
    }

    /// Creates every object in these files and directories (a directory's `*.yaml`, `*.yml` and `*.json`
    /// files) together, Namespaces, CRDs and PriorityClasses first whichever path brings them, so that a
    /// ConfigMap in one path finds its Namespace in another; returns how many. As on a real API server,
    /// an object whose namespace is in none of them is refused: nothing is created implicitly.
    pub fn load_paths<P: AsRef<Path>>(&self, paths: &[P]) -> Result<usize, LoadError> {
        let mut objects = Vec::new();
        for path in paths {
            objects.extend(load::read_path(path.as_ref())?);
        }
        load::create_all(&self.shared.store, objects)
    }

    /// The stored object of this `apiVersion` and `kind`, for assertions (namespace "" if cluster-scoped).
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let info = self.shared.store.registry().find_kind(api_version, kind)?;
        self.shared
            .store
            .get(&info, namespace, name)
            .ok()
            .map(|stored| encode::object(&info, &stored, &encode::Projection::Full))
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
    }

    /// Gives a container output, as if it had written it: `GET .../pods/{pod}/log` answers it (bounded by
    /// `tailLines` and `limitBytes`), `LogStream::Previous` with `previous=true` once the container has
    /// terminated before. A container given no output answers an empty log.
    pub fn set_log(&self, namespace: &str, pod: &str, container: &str, stream: LogStream, text: &str) {
        self.shared.logs.set(namespace, pod, container, stream, text);
    }

    /// A snapshot of the request counters.
    pub fn requests(&self) -> RequestCounts {
        self.shared.requests.snapshot()
    }

    /// Zeroes the request counters.
    pub fn reset_requests(&self) {
        self.shared.requests.reset();
    }

    /// The journal's entries kept so far, oldest first, leaving them for [`FakeServer::take_journal`], and
    /// how many were let go because the journal was full.
    pub fn journal(&self) -> (Vec<JournalEntry>, u64) {
        self.shared.journal.entries()
    }

    /// The journal's entries recorded since the last call, oldest first, and how many were let go unread
    /// because the journal was full (always none when [`Builder::journal`] was not set).
    pub fn take_journal(&self) -> (Vec<JournalEntry>, u64) {
        self.shared.journal.take()
    }

    /// Ends every open watch stream now, as an API server restart or a load balancer does; clients
    /// resume from the last version they saw. Streams opened later are not touched.
    pub fn drop_watches(&self) {
        self.shared.watch_drops.send_modify(|epoch| *epoch += 1);
    }

    /// Replaces the faults in force (`Faults::default()` for none).
    pub fn set_faults(&self, faults: Faults) {
        self.shared.faults.set(faults);
    }

    /// Expires every resource version older than now: watches from them get the in-stream 410, continue
    /// tokens 410, exact-version lists 410.
    pub fn compact(&self) {
        self.shared.store.compact();
    }

    /// The current resource version.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }
}
