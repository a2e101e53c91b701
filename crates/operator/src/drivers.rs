//! NVIDIADriver objects: with the active ClusterPolicy's `spec.driver.useNvidiaDriverCRD`, the ClusterPolicy
//! renders no driver and each NVIDIADriver renders the driver DaemonSets of the GPU nodes routed to it
//! ([`gpuop_api::route_nodes`]); each gets its own status and, with automatic upgrades, an upgrade pool with
//! its own budget. Without it, every NVIDIADriver is `disabled`, as in NVIDIA's operator.
//!
//! [`plan`] is pure: routing, validation and rendering of every NVIDIADriver from the cached nodes. The
//! controller applies what it renders together with the ClusterPolicy's objects, so that one prune sees
//! everything the operator owns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpuop_api::labels::{DRIVER_OWNER, GpuDetection};
use gpuop_api::read::NodeRead;
use gpuop_api::upgrade::UpgradePolicy;
use gpuop_api::upgrade::observe::PoolScope;
use gpuop_api::validate::{ImageDefaults, validate_driver_with};
use gpuop_api::{DriverRouting, FieldError, NVIDIADriver, route_nodes};
use gpuop_render::{ContainerRuntime, NvidiaDriverFacts, Rendered, render_nvidia_driver};
use kube::ResourceExt;

use crate::facts::{FactsInput, cluster_facts};
use crate::handoff::UpgradePool;
use crate::index::Judgements;
use crate::projection::NodeRecord;

/// What became of one NVIDIADriver this pass, before its pods are judged.
#[derive(Clone, Debug, PartialEq)]
pub enum DriverOutcome {
    /// The ClusterPolicy does not hand the driver to NVIDIADriver objects.
    Disabled,
    /// The NVIDIADriver is invalid: nothing of it was applied and what runs is left alone.
    Invalid(Vec<FieldError>),
    /// It could not be rendered (or applied); the message says why.
    Failed(String),
    /// Rendered; the problems are nodes it selects but does not get (shared with another NVIDIADriver).
    Rendered {
        /// Routing problems, for the status and an event.
        problems: Vec<String>,
        /// Its nodes whose driver upgrade failed, with why.
        failures: Vec<(String, String)>,
    },
}

/// One NVIDIADriver's part of a pass.
#[derive(Clone, Debug)]
pub struct DriverPlan {
    /// The object.
    pub driver: Arc<NVIDIADriver>,
    /// What became of it.
    pub outcome: DriverOutcome,
    /// Its objects (none unless rendered).
    pub rendered: Rendered,
    /// Its upgrade pool, when it rendered.
    pub pool: Option<UpgradePool>,
    /// Names of the ConfigMaps it mounts file by file.
    pub config_maps: Vec<String>,
}

/// What the NVIDIADriver plan depends on besides the objects.
#[derive(Clone, Copy, Debug)]
pub struct DriversInput<'a> {
    /// Whether the active ClusterPolicy hands the driver to NVIDIADriver objects.
    pub enabled: bool,
    /// The operator namespace.
    pub namespace: &'a str,
    /// Images from the operator's environment.
    pub image_defaults: &'a ImageDefaults,
    /// The host's root filesystem.
    pub host_root: &'a str,
    /// The GPU nodes' container runtime.
    pub runtime: ContainerRuntime,
    /// Keys of the ConfigMaps NVIDIADrivers name, by ConfigMap name.
    pub config_map_keys: &'a BTreeMap<String, Vec<String>>,
    /// Seconds the validator has to pass on an upgraded node.
    pub validation_timeout_seconds: u64,
}

/// The routing of the GPU nodes among the live NVIDIADrivers.
pub fn routing(
    drivers: &[Arc<NVIDIADriver>],
    nodes: &[Arc<NodeRecord>],
    detection: &GpuDetection,
) -> DriverRouting {
    let live: Vec<&NVIDIADriver> = drivers.iter().map(|d| &**d).collect();
    route_nodes(
        nodes
            .iter()
            .filter(|node| detection.has_gpu(&node.labels))
            .map(|node| (&*node.name, &node.labels)),
        &live,
    )
}

/// Validates and renders every live NVIDIADriver for the nodes routed to it; `judged` holds every node's
/// facts.
pub fn plan(
    drivers: &[Arc<NVIDIADriver>],
    nodes: &[Arc<NodeRecord>],
    judged: &Judgements,
    routing: &DriverRouting,
    input: DriversInput<'_>,
) -> Vec<DriverPlan> {
    drivers
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .map(|driver| plan_one(driver, nodes, judged, routing, input))
        .collect()
}

fn plan_one(
    driver: &Arc<NVIDIADriver>,
    nodes: &[Arc<NodeRecord>],
    judged: &Judgements,
    routing: &DriverRouting,
    input: DriversInput<'_>,
) -> DriverPlan {
    let mut plan = DriverPlan {
        driver: driver.clone(),
        outcome: DriverOutcome::Disabled,
        rendered: Rendered::default(),
        pool: None,
        config_maps: config_maps(driver),
    };
    if !input.enabled {
        return plan;
    }
    let validated = match validate_driver_with(driver, input.image_defaults) {
        Ok(validated) => validated,
        Err(errors) => {
            plan.outcome = DriverOutcome::Invalid(errors);
            return plan;
        }
    };
    let name = driver.name_any();
    let routed = routing.driver(&name);
    // Nodes claimed by several NVIDIADrivers keep what runs there: the one whose owner label they still
    // carry keeps rendering their pool, and no upgrade pool touches them.
    let held: BTreeSet<String> = routed
        .map(|r| r.conflicts.keys().cloned().collect())
        .unwrap_or_default();
    let serves = |node: &NodeRecord| {
        let node_name: &str = &node.name;
        let owned = node.label(DRIVER_OWNER) == Some(name.as_str());
        routed.is_some_and(|r| r.nodes.contains(node_name)) || (held.contains(node_name) && owned)
    };
    // Only what does not depend on the labeller's inputs is read of the facts: pools, runtime, failures.
    let (facts, census) = cluster_facts(
        nodes
            .iter()
            .filter(|node| serves(node))
            .filter_map(|node| Some((&*node.name, judged.facts_of(&node.name)?))),
        FactsInput {
            namespace: input.namespace,
            precompiled: driver.spec.use_precompiled(),
            service_monitor_crd: false,
        },
    );
    let facts = NvidiaDriverFacts {
        namespace: input.namespace.to_owned(),
        runtime: input.runtime,
        pools: facts.driver_pools,
        host_root: input.host_root.to_owned(),
        config_map_keys: input.config_map_keys.clone(),
    };
    match render_nvidia_driver(&validated, &facts) {
        Ok(rendered) => {
            let daemonsets = rendered
                .objects
                .iter()
                .filter(|m| m.kind() == "DaemonSet")
                .map(|m| m.name().to_owned())
                .collect();
            let policy = UpgradePolicy::of_nvidia_driver(driver, input.validation_timeout_seconds)
                .and_then(Result::ok);
            plan.pool = Some(UpgradePool {
                owner: format!("NVIDIADriver/{name}"),
                scope: PoolScope {
                    routed_to: Some(name),
                    daemonsets,
                    held,
                },
                policy,
            });
            plan.outcome = DriverOutcome::Rendered {
                problems: routed
                    .map(|r| r.problems().iter().map(ToString::to_string).collect())
                    .unwrap_or_default(),
                failures: census.upgrade_failures,
            };
            plan.rendered = rendered;
        }
        Err(error) => plan.outcome = DriverOutcome::Failed(error.to_string()),
    }
    plan
}

/// The ConfigMaps an NVIDIADriver mounts file by file.
pub fn config_maps(driver: &NVIDIADriver) -> Vec<String> {
    let spec = &driver.spec;
    [&spec.repo_config, &spec.cert_config, &spec.kernel_module_config]
        .into_iter()
        .filter_map(|reference| reference.as_ref()?.get().map(str::to_owned))
        .collect()
}
