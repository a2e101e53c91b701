//! Where a test body runs: the fake API server, or a real control plane. The body takes a [`Backend`] and
//! asks it for clients and request counts; [`two_backends!`](crate::two_backends) makes a test of each from
//! it, so a case added later runs on both by default.

use gpuop_fakeserver::{Authorization, AuthorizationReport, FakeServer, RequestCounts, RequestKey};

use crate::audit;
use crate::control_plane::ControlPlane;

/// How many requests a fake server made by [`Backend::fake`] keeps in its journal: more than any
/// two-backend test sends.
pub const JOURNAL: usize = 200_000;

/// One request, as [`Backend::requests_in_order`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// What it was, its answer's code and its client, as request counts key it.
    pub key: RequestKey,
    /// The namespace of its object or collection, or "".
    pub namespace: String,
    /// Its object's name, or "" for a collection.
    pub name: String,
}

/// The API server a test runs against.
#[derive(Debug)]
pub enum Backend {
    /// The in-memory fake server: no controllers, no scheduler; the simulator plays them.
    Fake(FakeServer),
    /// kube-apiserver with its controller manager and scheduler; the simulator plays only the nodes.
    Real(Box<ControlPlane>),
}

impl Backend {
    /// A fresh fake server, keeping a journal of its newest [`JOURNAL`] requests for
    /// [`Backend::requests_in_order`].
    pub fn fake() -> Self {
        Backend::Fake(FakeServer::builder().journal(JOURNAL).build())
    }

    /// A fresh fake server that authorizes with RBAC, as a real control plane does; its in-process
    /// clients ([`Backend::client_as`]) are the admin's.
    pub fn fake_rbac() -> Self {
        Backend::Fake(
            FakeServer::builder()
                .journal(JOURNAL)
                .authorization(Authorization::Rbac)
                .build(),
        )
    }

    /// A fresh real control plane from the binaries [`crate::BINARIES_VAR`] names. Panics, with the reason,
    /// when there are none or they do not start: a test that asked for a real control plane and ran
    /// without one would prove nothing.
    pub async fn real() -> Self {
        match ControlPlane::from_env().await {
            Ok(plane) => Backend::Real(Box::new(plane)),
            Err(error) => panic!("cannot start a real control plane: {error}"),
        }
    }

    /// Whether this is a real control plane.
    pub fn is_real(&self) -> bool {
        matches!(self, Backend::Real(_))
    }

    /// A client acting as the cluster's admin, its requests sent with `User-Agent: <agent>` so that they are
    /// counted as `agent`'s.
    pub async fn client_as(&self, agent: &str) -> kube::Client {
        match self {
            Backend::Fake(server) => server.client_as(agent),
            Backend::Real(plane) => plane
                .client_with(plane.admin_token(), Some(agent))
                .await
                .unwrap_or_else(|error| panic!("a client for {agent}: {error}")),
        }
    }

    /// A client acting as the ServiceAccount `namespace/name`, with a token from the TokenRequest API, its
    /// requests sent with `User-Agent: <agent>`.
    pub async fn client_for_service_account(&self, namespace: &str, name: &str, agent: &str) -> kube::Client {
        match self {
            Backend::Fake(server) => {
                let token = server
                    .token_for(namespace, name)
                    .unwrap_or_else(|error| panic!("a token for {namespace}/{name}: {error}"));
                server.client_with(Some(agent), Some(&token))
            }
            Backend::Real(plane) => plane
                .client_for_service_account(namespace, name, Some(agent))
                .await
                .unwrap_or_else(|error| panic!("a client for {namespace}/{name}: {error}")),
        }
    }

    /// Every request answered so far, counted by verb, resource, code and client (user agent).
    /// Server-side apply counts as `Apply` on the fake server and as `Patch` on a real one (its audit log
    /// does not tell them apart); compare writes, not those two verbs, across backends.
    pub async fn requests(&self) -> RequestCounts {
        match self {
            Backend::Fake(server) => server.requests(),
            Backend::Real(plane) => audit::counts(&audit_events(plane).await),
        }
    }

    /// Every request so far, in the order the server received them: the fake server's journal, or a real
    /// control plane's audit log. Whether one client wrote after another's step is read from this, so a
    /// journal that had to let requests go (more than [`JOURNAL`]) fails the test rather than answer with
    /// part of the order.
    pub async fn requests_in_order(&self) -> Vec<Received> {
        match self {
            Backend::Fake(server) => {
                let (mut journal, dropped) = server.journal();
                assert_eq!(
                    dropped, 0,
                    "the fake server's journal let {dropped} requests go: the order is incomplete"
                );
                journal.sort_by_key(|entry| entry.started);
                journal
                    .into_iter()
                    .map(|entry| Received {
                        key: entry.key,
                        namespace: entry.namespace,
                        name: entry.name,
                    })
                    .collect()
            }
            Backend::Real(plane) => audit_events(plane)
                .await
                .into_iter()
                .filter_map(|event| {
                    Some(Received {
                        key: event.key()?,
                        namespace: event.attrs.namespace,
                        name: event.attrs.name,
                    })
                })
                .collect(),
        }
    }

    /// What RBAC granted and refused so far, per user (see [`AuthorizationReport`]): the fake server's own
    /// record, or a real control plane's audit log judged against its roles and bindings as they stand now.
    pub async fn authorization_report(&self) -> AuthorizationReport {
        match self {
            Backend::Fake(server) => server.authorization_report(),
            Backend::Real(plane) => plane
                .authorization_report()
                .await
                .unwrap_or_else(|error| panic!("the authorization report: {error}")),
        }
    }
}

async fn audit_events(plane: &ControlPlane) -> Vec<crate::AuditEvent> {
    plane
        .requests_so_far()
        .await
        .unwrap_or_else(|error| panic!("reading the audit log: {error}"))
}

/// Makes two tests of one async test body `fn NAME(backend: Backend)`: `NAME::fake_server`, and
/// `NAME::real_control_plane`, which is ignored unless asked for (`cargo test -- --ignored
/// real_control_plane`, with [`crate::BINARIES_VAR`] set). Both run on a multi-threaded runtime with two
/// workers, as the operator and the simulator share it. `two_backends!(NAME, fake_rbac)` gives the fake server
/// RBAC authorization ([`Backend::fake_rbac`]), which a real control plane always has.
#[macro_export]
macro_rules! two_backends {
    ($body:ident) => {
        $crate::two_backends!($body, fake);
    };
    ($body:ident, $fake:ident) => {
        mod $body {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fake_server() {
                super::$body($crate::Backend::$fake()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "on a real control plane: set KUBE_BINARIES and run `cargo test -- --ignored real_control_plane`"]
            async fn real_control_plane() {
                super::$body($crate::Backend::real().await).await;
            }
        }
    };
}
