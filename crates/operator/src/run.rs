//! Wiring of a running operator: caches, leader election, the three controllers (policies, driver upgrades,
//! node labels), and the metrics and health endpoints, with one shutdown signal for all of them.
//! `gpu-operator run` and the simulator's in-process operator both start it here.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use gpuop_api::validate::ImageDefaults;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api_client;
use crate::caches::{Caches, Changes, Readiness};
use crate::context::Context;
use crate::controller::run_policies;
use crate::label_queue::run_labeller;
use crate::lease::{self, Leadership, Timing};
use crate::metrics::Metrics;
use crate::upgrade::run_upgrades;
use gpuop_api::labels::GpuDetection;

/// The lease NVIDIA's operator elects its leader on; sharing it keeps the two from leading at once.
pub const DEFAULT_LEASE_NAME: &str = gpuop_api::labels::LEADER_ELECTION_ID;

/// How to run the operator.
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace the operands run in (`OPERATOR_NAMESPACE`).
    pub namespace: String,
    /// How GPU nodes are recognised.
    pub detection: GpuDetection,
    /// Images from the environment.
    pub image_defaults: ImageDefaults,
    /// Leader election, or `None` to always lead (a single replica).
    pub leader_election: Option<LeaderElection>,
    /// Where to serve `/metrics`.
    pub metrics_address: Option<SocketAddr>,
    /// Where to serve `/healthz` and `/readyz`.
    pub health_address: Option<SocketAddr>,
    /// Seconds the validator has to pass on an upgraded node.
    pub upgrade_validation_timeout_seconds: u64,
}

impl Config {
    /// One replica that always leads, finds GPU nodes by NFD's labels, takes images from the policy alone
    /// and serves no HTTP endpoint: the operator as the simulator and the tests run it in-process.
    pub fn in_process(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            detection: GpuDetection::Nfd,
            image_defaults: ImageDefaults::default(),
            leader_election: None,
            metrics_address: None,
            health_address: None,
            upgrade_validation_timeout_seconds: gpuop_api::upgrade::DEFAULT_VALIDATION_TIMEOUT_SECONDS,
        }
    }
}

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Lease name, in the operator namespace.
    pub lease_name: String,
    /// This replica's identity.
    pub identity: String,
    /// This replica's Pod, made the Lease's owner while it holds it, so that the Lease goes with the Pod
    /// (an uninstall that deletes the Deployment leaves no Lease, even when the stopping replica can no
    /// longer delete it itself). `None` outside a Pod.
    pub owner: Option<OwnerReference>,
    /// Lease timing.
    pub timing: Timing,
}

/// A running operator.
#[derive(Debug)]
pub struct Running {
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// The controllers' shared context (caches, leadership).
    pub context: Arc<Context>,
    /// The addresses actually bound for metrics and health.
    pub bound: Vec<SocketAddr>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops every task (and gives the lease up), waiting for them to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }

    /// Ends every task where it is, as a killed process ends: nothing is given up or cleaned, a request
    /// being sent is dropped, and another replica leads only once the lease expires. (The caches' watches,
    /// which only read, are then stopped too.)
    pub async fn kill(self) {
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        self.shutdown.cancel();
    }
}

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The leader election's timing would let two replicas write at once.
    #[error(transparent)]
    Timing(#[from] lease::TimingError),
    /// An HTTP endpoint could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Starts the operator on a client. Every controller talks through [`api_client::gated`]: each request
/// bounded in time, each write sent only while this replica leads; the election uses `client` itself, its
/// requests bounded by the lease timing.
pub async fn start(client: Client, config: Config) -> Result<Running, StartError> {
    let timing = match &config.leader_election {
        Some(election) => Some(election.timing.validate()?),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let leadership = match (&config.leader_election, timing) {
        (Some(election), Some(timing)) => {
            let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
            let (leadership, task) = lease::elect(
                api,
                election.lease_name.clone(),
                election.identity.clone(),
                election.owner.clone(),
                timing,
                shutdown.clone(),
            );
            tasks.push(task);
            leadership
        }
        _ => Leadership::always(),
    };
    let client = api_client::gated(client, leadership.clone());
    let service_monitor_crd = service_monitor_crd(&client).await;
    let changed = Arc::new(Changes::default());
    let (caches, node_events) = Caches::start(
        &client,
        &config.namespace,
        service_monitor_crd,
        &changed,
        &shutdown,
    );
    let metrics = Arc::new(Metrics::default());
    let context = Arc::new(Context::new(
        client,
        config.namespace.clone(),
        caches,
        leadership,
        metrics.clone(),
        config.detection.clone(),
        config.image_defaults.clone(),
        service_monitor_crd,
        changed,
        config.upgrade_validation_timeout_seconds,
    ));
    let mut bound = Vec::new();
    if let Some(address) = config.metrics_address {
        let metrics = metrics.clone();
        let router = Router::new().route("/metrics", get(move || async move { metrics.render() }));
        bound.push(serve(address, router, &shutdown, &mut tasks).await?);
    }
    if let Some(address) = config.health_address {
        let availability = context.caches.availability.clone();
        let router = health_router(move || availability.readiness());
        bound.push(serve(address, router, &shutdown, &mut tasks).await?);
    }
    {
        let context = context.clone();
        tasks.push(tokio::spawn(async move {
            if context.caches.ready().await {
                let unavailable = context.caches.unavailable_required();
                if unavailable.is_empty() {
                    info!("caches synced; operator ready");
                } else {
                    let resources: Vec<String> = unavailable
                        .iter()
                        .map(|u| format!("{} ({})", u.resource, u.reason))
                        .collect();
                    warn!(unavailable = %resources.join(", "), "caches synced but for resources the API refuses; the controllers run without them and the operator is not ready");
                }
            }
        }));
    }
    tasks.push(tokio::spawn(run_policies(context.clone(), shutdown.clone())));
    tasks.push(tokio::spawn(run_upgrades(context.clone(), shutdown.clone())));
    tasks.push(tokio::spawn(run_labeller(
        context.clone(),
        node_events,
        shutdown.clone(),
    )));
    info!(namespace = %config.namespace, leader_election = config.leader_election.is_some(), "operator started");
    Ok(Running {
        metrics,
        context,
        bound,
        shutdown,
        tasks,
    })
}

/// `/healthz` answers while the process runs; `/readyz` with 200 once every cache the operator needs has
/// listed, else 503; its body names each resource that has not, with the API's reason (see
/// [`crate::caches::readiness`]).
pub fn health_router(readiness: impl Fn() -> Readiness + Clone + Send + Sync + 'static) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            let readiness = readiness();
            async move {
                let code = if readiness.ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (code, readiness.body)
            }
        }),
    )
}

async fn serve(
    address: SocketAddr,
    router: Router,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<SocketAddr, StartError> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| StartError::Listen { address, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| StartError::Listen { address, source })?;
    let shutdown = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        let server =
            axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.cancelled().await });
        if let Err(error) = server.await {
            warn!(%error, "HTTP endpoint failed");
        }
    }));
    Ok(local)
}

/// Whether the Prometheus Operator's ServiceMonitor CRD is installed (checked once, at start).
pub(crate) async fn service_monitor_crd(client: &Client) -> bool {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.get_opt("servicemonitors.monitoring.coreos.com").await {
        Ok(found) => found.is_some(),
        Err(error) => {
            warn!(%error, "cannot tell whether the ServiceMonitor CRD exists; rendering no ServiceMonitors");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn readiness_follows_the_caches_and_health_is_always_ok() {
        let availability = crate::caches::Availability::default();
        let pods = availability.track("pods", false);
        let router = {
            let availability = availability.clone();
            health_router(move || availability.readiness())
        };
        let answer = |router: Router, path: &'static str| async move {
            let response = router
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
            (status, String::from_utf8_lossy(&body).into_owned())
        };
        assert_eq!(answer(router.clone(), "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            answer(router.clone(), "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "pods: not listed yet\n".to_owned()
            )
        );
        pods.observe::<()>(&Ok(kube::runtime::watcher::Event::InitDone));
        assert_eq!(
            answer(router, "/readyz").await,
            (StatusCode::OK, "ok\n".to_owned())
        );
    }
}
