//! What the three controllers share: the API client, the caches, the leadership, metrics, and the channels
//! ([`crate::handoff`]) by which the policy reconciler hands its decisions to the node labeller and the
//! upgrade controller. It imports no controller; each controller imports it.

use std::sync::Arc;

use gpuop_api::labels::GpuDetection;
use gpuop_api::validate::ImageDefaults;
use kube::Client;
use kube::runtime::events::Recorder;
use tokio::sync::watch;

use crate::caches::{Caches, Changes};
use crate::handoff::{Labelling, Pools};
use crate::lease::Leadership;
use crate::metrics::Metrics;
use crate::pod_security;

/// Everything the controllers share.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Namespace the operands run in.
    pub namespace: String,
    /// The caches.
    pub caches: Caches,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// How GPU nodes are recognised.
    pub detection: GpuDetection,
    /// Images from the operator's environment.
    pub image_defaults: ImageDefaults,
    /// Whether the ServiceMonitor CRD is installed.
    pub service_monitor_crd: bool,
    /// Publishes events on state transitions.
    pub recorder: Recorder,
    /// Woken by every cache change.
    pub changed: Arc<Changes>,
    /// The labeller's inputs; `None` until the first reconcile decides them.
    pub labelling: Labelling,
    /// The upgrade controller's pools; `None` until the first reconcile decides them.
    pub upgrade_pools: Pools,
    /// Seconds the validator has to pass on an upgraded node.
    pub upgrade_validation_timeout_seconds: u64,
    /// The namespace's Pod Security labels as last applied.
    pub pod_security: pod_security::Applied,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("namespace", &self.namespace)
            .field("detection", &self.detection)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over started caches.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        namespace: String,
        caches: Caches,
        leadership: Leadership,
        metrics: Arc<Metrics>,
        detection: GpuDetection,
        image_defaults: ImageDefaults,
        service_monitor_crd: bool,
        changed: Arc<Changes>,
        upgrade_validation_timeout_seconds: u64,
    ) -> Self {
        let recorder = Recorder::new(client.clone(), "gpu-operator".into());
        let (labelling, _) = watch::channel(None);
        let (upgrade_pools, _) = watch::channel(None);
        Self {
            client,
            namespace,
            caches,
            leadership,
            metrics,
            detection,
            image_defaults,
            service_monitor_crd,
            recorder,
            changed,
            labelling,
            upgrade_pools,
            upgrade_validation_timeout_seconds,
            pod_security: pod_security::Applied::default(),
        }
    }
}
