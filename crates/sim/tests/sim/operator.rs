//! The operator converging simulated clusters: the controller-level behaviour of issue 5, checked through
//! the API the way a cluster admin would see it (pods on nodes, labels, objects, the policy's status).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gpuop_api::labels::OWNED_LABELS;
use gpuop_api::labels::{
    COMPONENT, DEPLOY_OPERANDS, DRIVER_OWNER, GPU_PRESENT, MANAGED_BY, UPGRADE_ENABLED_ANNOTATION,
    UPGRADE_STATE,
};
use gpuop_api::status::{PolicyStatus, State};
use gpuop_api::{ClusterPolicy, Operand};
use gpuop_fakeserver::{FakeServer, Faults, InjectedError, Verb};
use gpuop_operator::apply::MANAGED_KINDS;
use gpuop_operator::crd_install::{self, CrdOutcome};
use gpuop_operator::lease;
use gpuop_operator::run::{self, Config, DEFAULT_LEASE_NAME, LeaderElection, Running};
use gpuop_operator::uninstall::{self, Report};
use gpuop_sim::cluster_spec::{ClusterSpec, GpuSpec, NodePool, TaintSpec};
use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install, snapshot};
use gpuop_sim::hardware::GpuModel;
use gpuop_sim::heartbeat::Heartbeats;
use gpuop_sim::kubelet::Timing;
use gpuop_sim::progress::Row;
use gpuop_sim::scenario::Action;
use gpuop_sim::simulation::{Plays, Simulation};
use gpuop_testkit::Backend;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// Generous: a failure guard on a loaded two-core machine, not a performance assertion.
const PATIENCE: Duration = Duration::from_secs(90);

/// Waits until the check passes; panics with its last answer after [`PATIENCE`].
pub(crate) async fn until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    until_within(what, PATIENCE, Duration::from_millis(100), check).await;
}

/// Waits until the check passes, checking every `every`; panics with its last answer after `patience`.
pub(crate) async fn until_within<F, Fut>(what: &str, patience: Duration, every: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = tokio::time::Instant::now();
    loop {
        match check().await {
            Ok(()) => return,
            Err(last) if started.elapsed() > patience => {
                panic!("{what}: still not so after {patience:?}: {last}")
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// The policy status's `Ready` condition; fails the test where it has none.
fn ready_condition(status: &PolicyStatus) -> &Condition {
    let mut conditions = status.conditions.iter().flatten();
    conditions
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition")
}

/// `Ok` where what was awaited is so, otherwise what was `seen` instead, for [`until`] to report.
fn reached(so: bool, seen: &impl std::fmt::Debug) -> Result<(), String> {
    if so { Ok(()) } else { Err(format!("{seen:?}")) }
}

pub(crate) fn pool(name: &str, count: u32, model: Option<GpuModel>) -> NodePool {
    let mut pool = ClusterSpec::demo().node_pools.remove(0);
    pool.name = name.into();
    pool.count = count;
    pool.gpu = model.map(|model| GpuSpec { model, count: 4 });
    pool
}

/// What the simulator plays on `backend`: the whole cluster on the fake server; only the nodes on a real
/// control plane (its controllers and scheduler do the rest), renewing their Leases as kubelets do so that
/// its node lifecycle controller keeps them Ready.
pub(crate) fn playing(backend: &Backend) -> (Timing, Plays) {
    if backend.is_real() {
        (
            Timing::instant().with_heartbeats(Heartbeats::kubelet()),
            Plays::NodesOnly,
        )
    } else {
        (Timing::instant(), Plays::Cluster)
    }
}

/// An API server (the fake one, or a real control plane), a simulated cluster on it, and the operator.
pub(crate) struct Cluster {
    pub(crate) backend: Backend,
    pub(crate) client: Client,
    pub(crate) simulation: Simulation,
    operator: Option<Running>,
}

impl Cluster {
    async fn start(pools: Vec<NodePool>) -> Self {
        let mut cluster = Self::without_operator(pools).await;
        cluster.start_operator().await;
        cluster
    }

    pub(crate) async fn without_operator(pools: Vec<NodePool>) -> Self {
        Self::on(Backend::fake(), pools).await
    }

    async fn without_operator_on(server: FakeServer, pools: Vec<NodePool>) -> Self {
        Self::on(Backend::Fake(server), pools).await
    }

    /// The simulated cluster on `backend`, without the operator (see [`playing`]).
    pub(crate) async fn on(backend: Backend, pools: Vec<NodePool>) -> Self {
        let client = backend.client_as(gpuop_sim::USER_AGENT).await;
        install(&client).await.expect("CRDs and namespace install");
        let spec = ClusterSpec {
            nfd: true,
            node_pools: pools,
            workloads: Vec::new(),
        };
        let (timing, plays) = playing(&backend);
        let simulation = Simulation::start_playing(client.clone(), spec, timing, plays)
            .await
            .expect("simulation starts");
        Self {
            backend,
            client,
            simulation,
            operator: None,
        }
    }

    /// The fake server, for a step only it can take (injected faults, its request journal).
    pub(crate) fn server(&self) -> &FakeServer {
        match &self.backend {
            Backend::Fake(server) => server,
            Backend::Real(_) => panic!("a fake-server-only step in a test on a real control plane"),
        }
    }

    /// An operator replica that leads only while it holds the lease; its requests count as `identity`'s.
    async fn replica(&self, identity: &str) -> Running {
        let config = Config {
            leader_election: Some(LeaderElection {
                lease_name: DEFAULT_LEASE_NAME.into(),
                identity: identity.into(),
                owner: None,
                timing: lease::Timing {
                    lease_duration: Duration::from_secs(2),
                    renew_deadline: Duration::from_millis(1500),
                    retry_period: Duration::from_millis(200),
                },
            }),
            ..Config::in_process(NAMESPACE)
        };
        run::start(self.backend.client_as(identity).await, config)
            .await
            .expect("replica starts")
    }

    async fn lease_held_by(&self, identity: &str) {
        self.until(&format!("{identity} holds the lease"), || async {
            match self.lease_holder().await {
                Some(holder) if holder == identity => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        })
        .await;
    }

    async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let lease = leases.get_opt(DEFAULT_LEASE_NAME).await.expect("lease reads")?;
        lease.spec?.holder_identity
    }

    pub(crate) async fn start_operator(&mut self) {
        let config = Config::in_process(NAMESPACE);
        self.operator = Some(
            run::start(self.backend.client_as(gpuop_operator::USER_AGENT).await, config)
                .await
                .expect("operator starts"),
        );
    }

    async fn stop_operator(&mut self) {
        if let Some(operator) = self.operator.take() {
            operator.stop().await;
        }
    }

    pub(crate) async fn stop(mut self) {
        self.stop_operator().await;
        self.simulation.stop().await;
    }

    pub(crate) async fn apply(&self, yaml: &str) {
        apply_policy(&self.client, yaml).await.expect("policy applies");
    }

    async fn patch_policy(&self, name: &str, spec: serde_json::Value) {
        let api: Api<ClusterPolicy> = Api::all(self.client.clone());
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .expect("policy patches");
    }

    async fn policy(&self, name: &str) -> ClusterPolicy {
        Api::<ClusterPolicy>::all(self.client.clone())
            .get(name)
            .await
            .expect("policy exists")
    }

    async fn node(&self, name: &str) -> Node {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .expect("node exists")
    }

    async fn label_node(&self, node: &str, key: &str, value: Option<&str>) {
        self.simulation
            .apply(&Action::Label {
                node: node.into(),
                key: key.into(),
                value: value.map(str::to_owned),
            })
            .await
            .expect("labels");
    }

    /// Operand ids with a pod on the node (not being deleted).
    async fn operands_on(&self, node: &str) -> BTreeSet<String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        pods.list(&ListParams::default())
            .await
            .expect("pods list")
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| gpuop_sim::kubelet::operand_of(&p).map(|o| o.id().to_owned()))
            .collect()
    }

    async fn managed(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let params = ListParams::default().labels(&format!("{MANAGED_BY}=gpu-operator"));
        for ds in Api::<DaemonSet>::namespaced(self.client.clone(), NAMESPACE)
            .list(&params)
            .await
            .unwrap()
            .items
        {
            names.insert(format!("DaemonSet/{}", ds.name_any()));
        }
        for sa in Api::<ServiceAccount>::namespaced(self.client.clone(), NAMESPACE)
            .list(&params)
            .await
            .unwrap()
            .items
        {
            names.insert(format!("ServiceAccount/{}", sa.name_any()));
        }
        for role in Api::<ClusterRole>::all(self.client.clone())
            .list(&params)
            .await
            .unwrap()
            .items
        {
            names.insert(format!("ClusterRole/{}", role.name_any()));
        }
        names
    }

    /// Waits until the operand ids with a pod on `node` are as `wanted`.
    async fn until_operands(&self, what: &str, node: &str, wanted: impl Fn(&BTreeSet<String>) -> bool) {
        let wanted = &wanted;
        self.until(what, || async {
            let on = self.operands_on(node).await;
            reached(wanted(&on), &on)
        })
        .await;
    }

    /// Waits until the check passes; panics with its last answer after [`PATIENCE`].
    pub(crate) async fn until<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        until(what, check).await;
    }

    /// Turns feature discovery off in the policy and waits until `who` prunes its DaemonSet.
    async fn feature_discovery_pruned(&self, who: &str) {
        self.switched_off(who, "gfd", "DaemonSet/gpu-feature-discovery")
            .await;
    }

    /// Switches the policy's `section` off and waits until `who` has pruned its `object`.
    async fn switched_off(&self, who: &str, section: &str, object: &str) {
        self.patch_policy("cluster-policy", json!({ section: { "enabled": false } }))
            .await;
        self.until(&format!("{who} prunes {object}"), || async {
            let managed = self.managed().await;
            reached(!managed.contains(object), &managed)
        })
        .await;
    }

    /// Waits until the policy is Ready and every operand that should run is ready on every node.
    pub(crate) async fn converged(&self, policy: &str) {
        let client = self.client.clone();
        let policy = policy.to_owned();
        self.until("the cluster converges", || {
            let client = client.clone();
            let policy = policy.clone();
            async move {
                let (rows, _) = snapshot(&client).await.map_err(|e| e.to_string())?;
                let status = Api::<ClusterPolicy>::all(client)
                    .get(&policy)
                    .await
                    .map_err(|e| e.to_string())?
                    .status;
                let ready = status.as_ref().is_some_and(|s| s.state == State::Ready);
                let lagging: Vec<String> = rows.iter().filter(|r| !r.converged()).map(Row::line).collect();
                if ready && lagging.is_empty() && rows.iter().any(|r| !r.operands.is_empty()) {
                    Ok(())
                } else {
                    let conditions = status.as_ref().map(|s| &s.conditions);
                    Err(format!(
                        "state {:?}, conditions {conditions:?}, not converged: {lagging:#?}",
                        status.as_ref().map(|s| s.state)
                    ))
                }
            }
        })
        .await;
    }
}

fn ids(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// What every GPU node of the default policy runs (no MIG-capable GPU, no MPS).
const CONTAINER_STACK: &[&str] = &[
    "driver",
    "container-toolkit",
    "operator-validator",
    "device-plugin",
    "dcgm-exporter",
    "gpu-feature-discovery",
];

#[tokio::test]
async fn a_preinstalled_driver_gets_no_driver_pod_and_deploy_switches_move_pods() {
    let mut preinstalled = pool("host-driver", 1, Some(GpuModel::L4));
    preinstalled.driver_preinstalled = true;
    preinstalled
        .labels
        .insert("nvidia.com/gpu.deploy.driver".into(), "false".into());
    let cluster = Cluster::start(vec![pool("l4", 1, Some(GpuModel::L4)), preinstalled]).await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    assert_eq!(cluster.operands_on("l4-0").await, ids(CONTAINER_STACK));
    let without_driver: Vec<&str> = CONTAINER_STACK
        .iter()
        .copied()
        .filter(|o| *o != "driver")
        .collect();
    assert_eq!(
        cluster.operands_on("host-driver-0").await,
        ids(&without_driver),
        "only the other node gets a driver pod"
    );
    assert_eq!(
        cluster.node("host-driver-0").await.labels()["nvidia.com/gpu.deploy.driver"],
        "false"
    );

    // A person switches the exporter off on one node, then on again; the other node keeps it throughout.
    for (switch, what) in [
        ("false", "the exporter leaves l4-0"),
        ("true", "the exporter returns to l4-0"),
    ] {
        let exporter = "nvidia.com/gpu.deploy.dcgm-exporter";
        cluster.label_node("l4-0", exporter, Some(switch)).await;
        let wanted = switch == "true";
        cluster
            .until_operands(what, "l4-0", |on| on.contains("dcgm-exporter") == wanted)
            .await;
        assert!(
            cluster
                .operands_on("host-driver-0")
                .await
                .contains("dcgm-exporter"),
            "the other node keeps it"
        );
    }

    // The kill switch empties the node; lifting it brings everything back.
    cluster.label_node("l4-0", DEPLOY_OPERANDS, Some("false")).await;
    cluster
        .until_operands("l4-0 runs no operand", "l4-0", |on| on.is_empty())
        .await;
    cluster.label_node("l4-0", DEPLOY_OPERANDS, None).await;
    // Until the operator has switched the node's operands back on, the emptied node and a `ready` status
    // from before still look converged: wait for the pods themselves.
    cluster
        .until_operands("l4-0 runs its operands again", "l4-0", |on| {
            *on == ids(CONTAINER_STACK)
        })
        .await;
    cluster.converged("cluster-policy").await;
    cluster.stop().await;
}

#[tokio::test]
async fn a_joining_node_is_labelled_and_its_operands_come_up_in_chain_order() {
    let cluster = Cluster::start(vec![pool("gpu", 1, Some(GpuModel::T4))]).await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    // Watch the new node's pods from before it joins. The fake server's resourceVersions are one ordered
    // sequence, so the version at which each operand's pod first turns Ready orders the operands without
    // ties, however slowly this test runs.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let mut from = pods
        .list_metadata(&ListParams::default().limit(1))
        .await
        .expect("pods list")
        .metadata
        .resource_version
        .expect("a list has a resourceVersion");
    cluster
        .simulation
        .apply(&Action::NodeJoins {
            pool: "gpu".into(),
            count: 1,
        })
        .await
        .unwrap();
    let mut ready_at: BTreeMap<String, u64> = BTreeMap::new();
    let all_ready =
        |ready_at: &BTreeMap<String, u64>| CONTAINER_STACK.iter().all(|id| ready_at.contains_key(*id));
    let watched = async {
        while !all_ready(&ready_at) {
            let params = WatchParams::default().fields("spec.nodeName=gpu-1").timeout(60);
            let mut events = pods.watch(&params, &from).await.expect("pods watch").boxed();
            while !all_ready(&ready_at)
                && let Some(event) = events.try_next().await.expect("pod events")
            {
                let pod = match event {
                    WatchEvent::Added(pod) | WatchEvent::Modified(pod) => pod,
                    WatchEvent::Bookmark(bookmark) => {
                        from = bookmark.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Deleted(_) => continue,
                    WatchEvent::Error(error) => panic!("pods watch: {error:?}"),
                };
                let at = pod.resource_version().expect("a resourceVersion");
                let ready = pod.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                if ready && let Some(operand) = gpuop_sim::kubelet::operand_of(&pod) {
                    ready_at
                        .entry(operand.id().to_owned())
                        .or_insert_with(|| version(Some(&at)));
                }
                from = at;
            }
        }
    };
    tokio::time::timeout(PATIENCE, watched)
        .await
        .unwrap_or_else(|_| panic!("gpu-1's operands did not all turn Ready: {ready_at:?}"));
    cluster.converged("cluster-policy").await;
    assert_eq!(
        cluster
            .node("gpu-1")
            .await
            .labels()
            .get(GPU_PRESENT)
            .map(String::as_str),
        Some("true")
    );
    for (first, then) in [
        ("driver", "container-toolkit"),
        ("container-toolkit", "device-plugin"),
        ("container-toolkit", "gpu-feature-discovery"),
        ("container-toolkit", "dcgm-exporter"),
        ("container-toolkit", "operator-validator"),
    ] {
        assert!(
            ready_at[first] < ready_at[then],
            "{then} Ready before {first}: {ready_at:?}"
        );
    }
    // One patch per node, however many times the node changed meanwhile: its deploy switches and, since
    // the sample policy turns automatic driver upgrades on, its `upgrade-done` with them (a MIG-capable GPU
    // would add one patch, once feature discovery reports it).
    let node_patches = cluster.server().requests().matching(|key| {
        key.verb == Verb::Patch
            && key.resource == "nodes"
            && gpuop_sim::product_token(&key.client) == gpuop_sim::product_token(gpuop_operator::USER_AGENT)
    });
    assert_eq!(node_patches, 2, "node patches for two T4 nodes");
    cluster.stop().await;
}

#[tokio::test]
async fn a_tainted_node_is_excluded_and_the_status_says_so() {
    let mut tainted = pool("reserved", 1, Some(GpuModel::T4));
    tainted.taints.push(TaintSpec {
        key: "dedicated".into(),
        value: Some("batch".into()),
        effect: "NoSchedule".into(),
    });
    let cluster = Cluster::start(vec![pool("gpu", 1, Some(GpuModel::T4)), tainted]).await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    assert!(cluster.operands_on("reserved-0").await.is_empty());
    let status = cluster.policy("cluster-policy").await.status.unwrap();
    let plugin = status
        .operands
        .iter()
        .flatten()
        .find(|o| o.name == "device-plugin")
        .unwrap();
    assert_eq!((plugin.expected, plugin.ready), (1, 1));
    assert_eq!(
        plugin.excluded_nodes.as_deref(),
        Some(&["reserved-0".to_owned()][..])
    );
    let ready = ready_condition(&status);
    assert!(ready.message.contains("reserved-0"), "{}", ready.message);
    cluster.stop().await;
}

#[tokio::test]
async fn disabling_a_component_prunes_it_and_deleting_the_policy_removes_everything() {
    let cluster = Cluster::start(vec![pool("gpu", 1, Some(GpuModel::T4)), pool("cpu", 1, None)]).await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    let before = cluster.managed().await;
    assert!(
        before.contains("DaemonSet/gpu-feature-discovery")
            && before.contains("ServiceAccount/nvidia-gpu-feature-discovery")
    );

    cluster
        .patch_policy("cluster-policy", json!({ "gfd": { "enabled": false } }))
        .await;
    cluster
        .until("feature discovery's objects are pruned", || async {
            let managed = cluster.managed().await;
            let left: Vec<&String> = managed
                .iter()
                .filter(|n| n.contains("gpu-feature-discovery"))
                .collect();
            reached(left.is_empty(), &left)
        })
        .await;
    assert!(
        !cluster
            .operands_on("gpu-0")
            .await
            .contains("gpu-feature-discovery")
    );
    assert!(
        cluster
            .managed()
            .await
            .contains("DaemonSet/nvidia-device-plugin-daemonset"),
        "the rest stays"
    );

    // A person's own label on the node is left alone by the cleanup.
    cluster
        .label_node("gpu-0", "nvidia.com/gpu.deploy.dcgm", Some("false"))
        .await;
    Api::<ClusterPolicy>::all(cluster.client.clone())
        .delete("cluster-policy", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .until("every managed object is gone", || async {
            let managed = cluster.managed().await;
            reached(managed.is_empty(), &managed)
        })
        .await;
    cluster
        .until("the operator's labels are gone", || async {
            let labels = cluster.node("gpu-0").await.labels().clone();
            let ours: Vec<&String> = labels
                .keys()
                .filter(|k| {
                    *k == GPU_PRESENT || (k.starts_with("nvidia.com/gpu.deploy.") && labels[*k] == "true")
                })
                .collect();
            reached(ours.is_empty(), &ours)
        })
        .await;
    assert_eq!(
        cluster
            .node("gpu-0")
            .await
            .labels()
            .get("nvidia.com/gpu.deploy.dcgm")
            .map(String::as_str),
        Some("false")
    );
    cluster.stop().await;
}

#[tokio::test]
async fn a_second_policy_is_ignored_and_an_invalid_one_changes_nothing_that_runs() {
    let cluster = Cluster::start(vec![pool("gpu", 1, Some(GpuModel::T4))]).await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    cluster
        .apply(&DEFAULT_POLICY.replace("name: cluster-policy", "name: second-policy"))
        .await;
    cluster
        .until("the second policy is marked ignored", || async {
            let status = cluster.policy("second-policy").await.status;
            match status {
                Some(status) if status.state == State::Ignored => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let ignored = cluster.policy("second-policy").await.status.unwrap();
    let ready = ready_condition(&ignored);
    assert!(
        ready.message.contains("\"cluster-policy\" is the active one"),
        "{}",
        ready.message
    );

    // An image without its version passes the CRD schema but not the operator's validation.
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let versions = |list: Vec<DaemonSet>| -> BTreeMap<String, Option<String>> {
        list.into_iter()
            .map(|ds| (ds.name_any(), ds.metadata.resource_version))
            .collect()
    };
    cluster
        .patch_policy("cluster-policy", json!({ "toolkit": { "version": "" } }))
        .await;
    cluster
        .until("the policy reports the invalid field", || async {
            let status = cluster.policy("cluster-policy").await.status.unwrap_or_default();
            let error = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Error" && c.status == "True")
                .cloned();
            match error {
                Some(error)
                    if error.message.contains("spec.toolkit.version")
                        && error.reason == "ReconcileFailed" =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    let status = cluster.policy("cluster-policy").await.status.unwrap_or_default();
    let ready = ready_condition(&status);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ReconcileFailed")
    );
    assert!(
        ready.message.contains("spec.toolkit.version"),
        "{}",
        ready.message
    );
    let before = versions(daemonsets.list(&ListParams::default()).await.unwrap().items);
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW).await;
    let after = versions(daemonsets.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(before, after, "no operand DaemonSet was touched");
    assert_eq!(
        cluster.operands_on("gpu-0").await,
        ids(CONTAINER_STACK),
        "every operand keeps running"
    );
    cluster.stop().await;
}

#[tokio::test]
async fn a_restarted_operator_converges_without_duplicates_and_then_writes_nothing() {
    let mut cluster = Cluster::start(vec![pool("gpu", 2, Some(GpuModel::T4))]).await;
    cluster.apply(DEFAULT_POLICY).await;
    // Kill the operator as soon as it has begun the rollout.
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    cluster
        .until("the rollout begins", || async {
            let count = daemonsets.list(&ListParams::default()).await.unwrap().items.len();
            if count > 0 {
                Ok(())
            } else {
                Err("no DaemonSet yet".into())
            }
        })
        .await;
    cluster.stop_operator().await;
    cluster.start_operator().await;
    cluster.converged("cluster-policy").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let mut per_node_and_set: BTreeMap<(String, String), usize> = BTreeMap::new();
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        let owner = pod
            .owner_references()
            .first()
            .map(|o| o.name.clone())
            .unwrap_or_default();
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        *per_node_and_set.entry((node, owner)).or_default() += 1;
    }
    assert!(
        per_node_and_set.values().all(|count| *count == 1),
        "one pod per DaemonSet per node: {per_node_and_set:?}"
    );
    let orphans: Vec<String> = daemonsets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|ds| ds.owner_references().iter().all(|o| o.kind != "ClusterPolicy"))
        .map(|ds| ds.name_any())
        .collect();
    assert!(orphans.is_empty(), "DaemonSets without their owner: {orphans:?}");

    // The sample policy turns automatic driver upgrades on: each node is marked `upgrade-done` (with its
    // driver switch, its driver pod coming from the latest revision).
    cluster
        .until("every node is marked upgrade-done", || async {
            let nodes = Api::<Node>::all(cluster.client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let states: Vec<Option<&String>> = nodes
                .items
                .iter()
                .map(|n| n.labels().get(UPGRADE_STATE))
                .collect();
            reached(
                states.iter().all(|s| s.is_some_and(|s| s == "upgrade-done")),
                &states,
            )
        })
        .await;
    // Steady state: nothing changes, so the operator writes nothing, not even a write it trusted and would
    // repeat when the window it trusts an unconfirmed write for ends.
    let before = cluster.server().requests();
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW).await;
    let window = cluster.server().requests().since(&before);
    assert_eq!(
        window.writes_by(gpuop_sim::product_token(gpuop_operator::USER_AGENT)),
        0,
        "writes in a steady window: {:?}",
        window.iter().collect::<Vec<_>>()
    );
    cluster.stop().await;
}

/// The operator's requests in a window of `window` that begins with `during`: how many, and which.
/// The window starts once the operator has sent nothing for 3 s (what converging left to do, such as a node
/// label that follows an operand's own, is done).
async fn operator_requests_while<Fut>(cluster: &Cluster, during: Fut, window: Duration) -> (u64, String)
where
    Fut: std::future::Future<Output = ()>,
{
    let operator = gpuop_sim::product_token(gpuop_operator::USER_AGENT);
    cluster
        .until("the operator is quiet for 3 s", || async {
            let before = cluster.backend.requests().await.by_client(operator);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let sent = cluster.backend.requests().await.by_client(operator) - before;
            if sent == 0 {
                Ok(())
            } else {
                Err(format!("{sent} requests in the last 3 s"))
            }
        })
        .await;
    let before = cluster.backend.requests().await;
    during.await;
    tokio::time::sleep(window).await;
    let requests = cluster.backend.requests().await.since(&before);
    let which: Vec<_> = requests
        .iter()
        .filter(|(key, _)| key.client.split('/').next() == Some(operator))
        .collect();
    (requests.by_client(operator), format!("{which:?}"))
}

gpuop_testkit::two_backends!(
    a_persons_edit_of_a_managed_daemonset_is_reverted_with_an_event_and_their_own_labels_stay
);

async fn a_persons_edit_of_a_managed_daemonset_is_reverted_with_an_event_and_their_own_labels_stay(
    backend: Backend,
) {
    let mut cluster = Cluster::on(backend, vec![pool("gpu", 1, Some(GpuModel::T4))]).await;
    cluster.start_operator().await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    let name = "nvidia-device-plugin-daemonset";
    let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let image = |ds: &DaemonSet| {
        let container = first_container(ds);
        (
            container.name.clone(),
            container.image.clone().unwrap_or_default(),
        )
    };
    let (container, rendered_image) = image(&daemonsets.get(name).await.expect("the DaemonSet exists"));

    // A person's own label and annotation on a managed object are theirs: the operator sends nothing.
    let person: Api<DaemonSet> =
        Api::namespaced(cluster.backend.client_as("kubectl/v1.33.0").await, NAMESPACE);
    let as_kubectl = |manager: &str| PatchParams {
        field_manager: Some(manager.into()),
        ..PatchParams::default()
    };
    let labelled = operator_requests_while(
        &cluster,
        async {
            person
                .patch(
                    name,
                    &as_kubectl("kubectl-label"),
                    &Patch::Merge(
                        json!({"metadata": {"labels": {"team": "ml"}, "annotations": {"team/owner": "ana"}}}),
                    ),
                )
                .await
                .expect("the person labels the DaemonSet");
        },
        gpuop_operator::STEADY_STATE_WINDOW,
    )
    .await;
    assert_eq!(
        labelled.0, 0,
        "the operator sent requests after a person labelled its DaemonSet: {}",
        labelled.1
    );

    // `kubectl edit` changes the image: the operator puts the rendered one back and says so.
    let edited_at = tokio::time::Instant::now();
    person
        .patch(
            name,
            &as_kubectl("kubectl-edit"),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": container, "image": "registry.example.com/patched-plugin:1"}
            ]}}}})),
        )
        .await
        .expect("the person edits the DaemonSet");
    cluster
        .until("the edited image is reverted", || async {
            let (_, now) = image(&daemonsets.get(name).await.map_err(|e| e.to_string())?);
            if now == rendered_image {
                Ok(())
            } else {
                Err(format!("image {now}"))
            }
        })
        .await;
    let reverted_in = edited_at.elapsed();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    cluster
        .until("an event names the DaemonSet and the editor", || async {
            let drift: Vec<String> = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(gpuop_operator::drift::REASON))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()).is_some())
                .filter_map(|e| e.note)
                .collect();
            if drift
                .iter()
                .any(|note| note.contains("kubectl-edit") && note.contains(".image"))
            {
                Ok(())
            } else {
                Err(format!("drift events about {name}: {drift:?}"))
            }
        })
        .await;
    let live = daemonsets.get(name).await.unwrap();
    assert_eq!(
        live.labels().get("team").map(String::as_str),
        Some("ml"),
        "the person's label stays"
    );
    assert_eq!(
        live.annotations().get("team/owner").map(String::as_str),
        Some("ana"),
        "the person's annotation stays"
    );
    assert!(
        reverted_in < Duration::from_secs(5),
        "reverted only after {reverted_in:?}"
    );

    // `kubectl edit` deleting an env var the operator sets: nobody owns it afterwards, it is put back too.
    // Env vars are keyed by name: the one put back may come back at another place in the list.
    let env_names = |ds: &DaemonSet| -> BTreeSet<String> {
        let container = first_container(ds);
        container.env.iter().flatten().map(|e| e.name.clone()).collect()
    };
    let rendered_env = env_names(&daemonsets.get(name).await.unwrap());
    let removed = rendered_env
        .first()
        .expect("the device plugin has env vars")
        .clone();
    person
        .patch(
            name,
            &as_kubectl("kubectl-edit"),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": container, "env": [{"name": removed, "$patch": "delete"}]}
            ]}}}})),
        )
        .await
        .expect("the person deletes an env var");
    cluster
        .until("the deleted env var is back", || async {
            let now = env_names(&daemonsets.get(name).await.map_err(|e| e.to_string())?);
            if now == rendered_env {
                Ok(())
            } else {
                Err(format!("env {now:?}"))
            }
        })
        .await;
    cluster
        .until("an event names the deleted env var", || async {
            let notes: Vec<String> = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(gpuop_operator::drift::REASON))
                .filter_map(|e| e.note)
                .collect();
            let field = format!("env[name={removed}]");
            if notes.iter().any(|note| note.contains(&field)) {
                Ok(())
            } else {
                Err(format!("drift events: {notes:?}"))
            }
        })
        .await;

    // Converged again, the operator sends no request at all.
    cluster.converged("cluster-policy").await;
    let steady = operator_requests_while(&cluster, async {}, gpuop_operator::STEADY_STATE_WINDOW).await;
    assert_eq!(
        steady.0, 0,
        "requests in a steady window after the repair: {}",
        steady.1
    );
    cluster.stop().await;
}

#[tokio::test]
async fn it_converges_with_ten_percent_of_requests_failing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("gpuop_operator=info,kube_runtime=warn")
        .with_test_writer()
        .try_init();
    let cluster = Cluster::start(vec![pool("gpu", 2, Some(GpuModel::T4))]).await;
    cluster
        .server()
        .set_faults(Faults::new(7).error(None, None, 0.1, InjectedError::Internal));
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    cluster.server().set_faults(Faults::new(7));
    let failed: u64 = cluster
        .server()
        .requests()
        .iter()
        .filter(|(key, _)| key.code >= 500)
        .map(|(_, count)| count)
        .sum();
    assert!(failed > 0, "faults were injected");
    cluster.stop().await;
}

gpuop_testkit::two_backends!(
    only_the_leader_writes_and_another_replica_takes_over_when_it_is_killed_or_stops
);

/// Two replicas: only the leader writes. The leader is killed (its Lease left as it was); the other takes
/// over once the Lease expires, and the server receives no write from the killed one after the takeover.
/// The new leader stops gracefully, giving the Lease up; a third replica takes over at once.
async fn only_the_leader_writes_and_another_replica_takes_over_when_it_is_killed_or_stops(backend: Backend) {
    let cluster = Cluster::on(backend, vec![pool("gpu", 1, Some(GpuModel::T4))]).await;
    let first = cluster.replica("replica-a").await;
    cluster.lease_held_by("replica-a").await;
    let second = cluster.replica("replica-b").await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    let requests = cluster.backend.requests().await;
    assert!(
        requests.writes_by("replica-a") > 0,
        "the leader applied the operands"
    );
    assert_eq!(
        requests.writes_by("replica-b"),
        0,
        "a follower writes nothing, not even the lease it does not hold"
    );

    // The leader is killed; the follower takes over once the Lease expires and acts on the next change.
    first.kill().await;
    cluster.feature_discovery_pruned("replica-b").await;
    cluster.lease_held_by("replica-b").await;
    let in_order = cluster.backend.requests_in_order().await;
    let takeover = in_order
        .iter()
        .position(|r| {
            r.key.client == "replica-b"
                && r.key.resource == "leases"
                && r.key.verb.is_write()
                && r.key.code < 400
        })
        .expect("replica-b took the Lease over");
    let late: Vec<String> = in_order
        .iter()
        .skip(takeover)
        .filter(|r| r.key.client == "replica-a" && r.key.verb.is_write())
        .map(|r| format!("{:?} {} {}/{}", r.key.verb, r.key.resource, r.namespace, r.name))
        .collect();
    assert_eq!(
        late,
        Vec::<String>::new(),
        "writes of the killed leader received after the takeover"
    );

    // The new leader stops and gives the Lease up: a third replica leads at once.
    let third = cluster.replica("replica-c").await;
    second.stop().await;
    cluster
        .switched_off("replica-c", "dcgmExporter", "DaemonSet/nvidia-dcgm-exporter")
        .await;
    cluster.lease_held_by("replica-c").await;
    third.stop().await;
    cluster.stop().await;
}

/// A leader whose lease requests hang (the API server answers everything else) stops writing before the
/// other replica may take over: once the other's takeover of the Lease is answered, the server answers no
/// write of the old leader, although its caches keep showing it the changes it would act on. Before
/// leadership was a deadline, the old leader's election waited on its hung request forever, leading all
/// the while, and wrote alongside the new one.
#[tokio::test]
async fn a_leader_whose_renewals_hang_writes_nothing_once_another_takes_over() {
    let server = FakeServer::builder().journal(1_000_000).build();
    let cluster = Cluster::without_operator_on(server, vec![pool("gpu", 1, Some(GpuModel::T4))]).await;
    let first = cluster.replica("replica-a").await;
    cluster
        .until("replica-a holds the lease", || async {
            match cluster.lease_holder().await.as_deref() {
                Some("replica-a") => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        })
        .await;
    let second = cluster.replica("replica-b").await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;

    cluster
        .server()
        .set_faults(Faults::new(0).hang(None, Some("leases"), Some("replica-a")));
    cluster
        .until("replica-b takes the lease over", || async {
            match cluster.lease_holder().await.as_deref() {
                Some("replica-b") => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        })
        .await;
    // A change both replicas see in their caches: only a leader acts on it.
    cluster.feature_discovery_pruned("the new leader").await;
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW).await;

    // The journal holds the requests in the order they were answered: a write after the takeover in it
    // changed the cluster after replica-b led.
    let (journal, dropped) = cluster.server().take_journal();
    assert_eq!(dropped, 0, "the journal holds every request");
    let writes: Vec<(usize, &gpuop_fakeserver::JournalEntry)> = journal
        .iter()
        .filter(|entry| entry.key.verb.is_write())
        .enumerate()
        .collect();
    let (takeover, _) = *writes
        .iter()
        .find(|(_, w)| w.by("replica-b") && w.key.resource == "leases" && w.key.code < 300)
        .expect("replica-b's takeover of the lease is recorded");
    let late: Vec<_> = writes
        .iter()
        .filter(|(at, w)| w.by("replica-a") && *at > takeover)
        .collect();
    assert!(
        late.is_empty(),
        "replica-a wrote after replica-b took over (write {takeover}): {late:#?}"
    );
    assert!(
        writes
            .iter()
            .any(|(at, w)| w.by("replica-a") && w.key.resource != "leases" && *at < takeover),
        "replica-a wrote while it led"
    );
    assert!(
        writes
            .iter()
            .any(|(at, w)| w.by("replica-b") && w.key.resource != "leases" && *at > takeover),
        "replica-b acted on the change"
    );
    cluster.server().set_faults(Faults::new(0));
    first.stop().await;
    second.stop().await;
    cluster.stop().await;
}

/// The DaemonSet's first container (operand DaemonSets all have one).
fn first_container(ds: &DaemonSet) -> &k8s_openapi::api::core::v1::Container {
    ds.spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|pod| pod.containers.first())
        .expect("a DaemonSet with a container")
}

/// What the observer saw of one status write: its state and Ready reason, whether the driver DaemonSet
/// existed, and whether every operand pod on the nodes watched was Ready when it was written.
type StatusSeen = ((State, Option<String>), bool, Result<(), String>);

/// Every status the operator writes, in order, judged against the cluster at the moment it shows up.
struct StatusObserver {
    task: tokio::task::JoinHandle<()>,
    writes: tokio::sync::mpsc::UnboundedReceiver<StatusSeen>,
}

impl StatusObserver {
    fn start(client: &Client, nodes: &[&str]) -> Self {
        let client = client.clone();
        let nodes: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
        let (written, writes) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            use kube::runtime::WatchStreamExt;
            let policies: Api<ClusterPolicy> = Api::all(client.clone());
            // A watch error (a real API server may refuse the first list for a moment) is retried, not
            // the end of the observation.
            let mut events = std::pin::pin!(
                kube::runtime::watcher(policies, Default::default())
                    .default_backoff()
                    .applied_objects()
            );
            let mut last = None;
            loop {
                let policy = match events.try_next().await {
                    Ok(Some(policy)) => policy,
                    Ok(None) => return,
                    Err(_) => continue,
                };
                let Some(status) = policy.status else { continue };
                let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready");
                let seen = (status.state, ready.map(|c| c.reason.clone()));
                if last.as_ref() == Some(&seen) {
                    continue;
                }
                last = Some(seen.clone());
                let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
                let driver = daemonsets
                    .list(
                        &ListParams::default()
                            .labels(&format!("{COMPONENT}={}", Operand::Driver.info().component)),
                    )
                    .await
                    .is_ok_and(|list| !list.items.is_empty());
                let written_at = version(policy.metadata.resource_version.as_deref());
                let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
                let operands = stack_ready_on(&client, &nodes, written_at).await;
                if written.send((seen, driver, operands)).is_err() {
                    return;
                }
            }
        });
        Self { task, writes }
    }

    /// The writes seen until the first `ready` one has been judged (the observer judges each write after it
    /// shows up).
    async fn until_ready(mut self) -> Vec<StatusSeen> {
        let mut seen = Vec::new();
        while !seen
            .iter()
            .any(|((state, _), _, _): &StatusSeen| *state == State::Ready)
        {
            match tokio::time::timeout(PATIENCE, self.writes.recv()).await {
                Ok(Some(write)) => seen.push(write),
                _ => panic!("the observer never saw the ready status: {seen:#?}"),
            }
        }
        self.task.abort();
        seen
    }
}

/// No status written said the cluster GPU-less, or `ready` before every operand ran.
fn assert_honest(seen: &[StatusSeen]) {
    for ((state, reason), _, operands) in seen {
        assert_ne!(
            reason.as_deref(),
            Some("NoGPUNodes"),
            "a GPU cluster reported GPU-less: {seen:#?}"
        );
        if *state == State::Ready {
            assert!(
                operands.is_ok(),
                "ready written before the operands run ({operands:?}): {seen:#?}"
            );
        }
    }
}

/// Every operand of [`CONTAINER_STACK`] runs Ready on each of `nodes`, in pods last changed no later than
/// resourceVersion `by` (the fake server's versions are one ordered sequence, and kube-apiserver's are etcd's
/// revisions, ordered too), so that they were Ready
/// when the change `by` was made, not only by the time this LIST ran; the error names what is missing.
async fn stack_ready_on(client: &Client, nodes: &[&str], by: u64) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pods = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut missing = Vec::new();
    for node in nodes {
        let ready: BTreeSet<String> = pods
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(*node))
            .filter(|p| version(p.metadata.resource_version.as_deref()) <= by)
            .filter(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
            })
            .filter_map(|p| gpuop_sim::kubelet::operand_of(p).map(|o| o.id().to_owned()))
            .collect();
        let lacking: Vec<&str> = CONTAINER_STACK
            .iter()
            .copied()
            .filter(|id| !ready.contains(*id))
            .collect();
        if !lacking.is_empty() {
            missing.push(format!("{node}: {lacking:?}"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("; "))
    }
}

/// A resourceVersion as the fake server writes them (a number); unknown ones count as the latest.
fn version(resource_version: Option<&str>) -> u64 {
    resource_version.and_then(|v| v.parse().ok()).unwrap_or(u64::MAX)
}

#[tokio::test]
async fn no_ready_is_ever_written_before_the_operands_run_even_when_node_events_lag() {
    // On a real API server the operator's own node labels come back through its watch seconds after it
    // wrote them; here every node event reaches every watcher two seconds late.
    let mut cluster =
        Cluster::without_operator(vec![pool("l4", 2, Some(GpuModel::L4)), pool("cpu", 1, None)]).await;
    cluster
        .server()
        .set_faults(Faults::new(9).delay_watch_events("nodes", Duration::from_secs(2)));

    let observer = StatusObserver::start(&cluster.client, &["l4-0", "l4-1"]);
    let started = tokio::time::Instant::now();
    cluster.start_operator().await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;

    let seen = observer.until_ready().await;
    let first = seen.first().expect("the operator wrote a status");
    assert!(
        first.1,
        "the driver DaemonSet is applied in the first pass, before the first status: {seen:#?}"
    );
    assert_honest(&seen);

    // The changes of state were published as events the API server accepted (kube-apiserver refuses a note
    // over 1024 bytes, which a long node list used to make).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(cluster.client.clone());
    cluster
        .until("the event for ready is stored", || async {
            let reasons: Vec<String> = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ClusterPolicy"))
                .filter_map(|e| e.reason)
                .collect();
            if reasons.iter().any(|reason| reason == "Reconciled") {
                Ok(())
            } else {
                Err(format!("events about the policy: {reasons:?}"))
            }
        })
        .await;

    // The status is written at most once a second, changes of state included.
    let status_writes = cluster.server().requests().matching(|key| {
        key.resource == "clusterpolicies" && key.subresource == "status" && key.verb.is_write()
    });
    let since_start = started.elapsed();
    assert!(
        status_writes <= since_start.as_secs() + 1,
        "{status_writes} status writes in {since_start:?} ({} changes of state)",
        seen.len()
    );
    cluster.stop().await;
}

/// How long the operator must send nothing once a cluster has converged, on either backend: longer than
/// every window in which it may act by itself ([`gpuop_operator::STEADY_STATE_WINDOW`]).
const REST: Duration = Duration::from_secs(30);

gpuop_testkit::two_backends!(the_sample_policy_converges_on_fifty_nodes_honestly_and_then_rests);

/// The sample policy on fifty GPU nodes and a CPU node, as a cluster admin sees it: it converges; no status
/// says `ready` before every operand pod of every GPU node is Ready at that moment; every Event the operator
/// posts is accepted; and once converged the operator sends no request at all for [`REST`].
async fn the_sample_policy_converges_on_fifty_nodes_honestly_and_then_rests(backend: Backend) {
    let mut cluster = Cluster::on(
        backend,
        vec![
            pool("l4", 25, Some(GpuModel::L4)),
            pool("t4", 25, Some(GpuModel::T4)),
            pool("cpu", 1, None),
        ],
    )
    .await;
    let gpu_nodes: Vec<String> = (0..25)
        .flat_map(|i| [format!("l4-{i}"), format!("t4-{i}")])
        .collect();
    let observer = StatusObserver::start(
        &cluster.client,
        &gpu_nodes.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    cluster.start_operator().await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    assert_honest(&observer.until_ready().await);

    let operator = gpuop_sim::product_token(gpuop_operator::USER_AGENT);
    let events =
        cluster.backend.requests().await.matching(|key| {
            key.resource == "events" && key.verb.is_write() && key.client.starts_with(operator)
        });
    assert!(events > 0, "the operator posted no event");
    let refused: Vec<_> = cluster
        .backend
        .requests()
        .await
        .iter()
        .filter(|(key, _)| key.resource == "events" && key.code >= 400)
        .map(|(key, n)| format!("{n} x {key:?}"))
        .collect();
    assert!(refused.is_empty(), "events refused: {refused:?}");
    // Nobody but the operator wrote its objects: nothing drifted, so nothing was repaired (kube-apiserver
    // records its owner references differently from how they were applied, which once read as drift).
    let repairs: Vec<String> = Api::<k8s_openapi::api::events::v1::Event>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .expect("events list")
        .items
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some(gpuop_operator::drift::REASON))
        .filter_map(|event| event.note)
        .collect();
    assert!(
        repairs.is_empty(),
        "drift repaired where nobody changed anything: {repairs:#?}"
    );

    let (sent, which) = operator_requests_while(&cluster, async {}, REST).await;
    assert_eq!(sent, 0, "requests in a steady window: {which}");
    cluster.stop().await;
}

/// Every object labelled managed-by=gpu-operator, of every kind the operator renders that the server serves.
async fn managed_everywhere(client: &Client) -> Vec<String> {
    let params = ListParams::default().labels(&format!("{MANAGED_BY}=gpu-operator"));
    let mut found = Vec::new();
    for kind in MANAGED_KINDS {
        let api: Api<DynamicObject> = if kind.namespaced {
            Api::all_with(client.clone(), &kind.api_resource())
        } else {
            kind.api(client.clone(), NAMESPACE)
        };
        match api.list_metadata(&params).await {
            Ok(list) => found.extend(
                list.items
                    .iter()
                    .map(|o| format!("{} {}", kind.kind, o.name_any())),
            ),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => panic!("cannot list {}: {error}", kind.kind),
        }
    }
    found
}

/// What the operator may have left on a node: its own labels and annotations, and upgrade state.
fn operator_marks(node: &Node) -> Vec<String> {
    let mut marks: Vec<String> = node
        .labels()
        .iter()
        .filter(|(key, value)| {
            key.as_str() == GPU_PRESENT
                || key.as_str() == DRIVER_OWNER
                || key.as_str() == UPGRADE_STATE
                || (key.starts_with("nvidia.com/gpu.deploy.") && value.as_str() == "true")
        })
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    marks.extend(
        node.annotations()
            .keys()
            .filter(|key| key.as_str() == OWNED_LABELS || key.starts_with("nvidia.com/gpu-driver-upgrade"))
            .cloned(),
    );
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        marks.push("cordoned".into());
    }
    marks
}

/// Asserts the cluster carries nothing of the operator's, and the person's labels are where they were.
async fn assert_uninstalled(cluster: &Cluster, report: &Report) {
    assert!(
        report.left.is_empty(),
        "left behind: {}",
        uninstall::summary(report)
    );
    assert_eq!(managed_everywhere(&cluster.client).await, Vec::<String>::new());
    assert!(
        Api::<ClusterPolicy>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    for node in Api::<Node>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        assert_eq!(operator_marks(&node), Vec::<String>::new(), "{}", node.name_any());
    }
    let gpu = cluster.node("gpu-0").await;
    assert_eq!(gpu.labels().get("team").map(String::as_str), Some("ml"));
    assert_eq!(
        gpu.labels().get("nvidia.com/gpu.deploy.dcgm").map(String::as_str),
        Some("false"),
        "a deploy switch a person changed is theirs"
    );
}

/// Fails unless every request `client` made is one `permissions` grant: the chart grants exactly those.
fn assert_only_requests_granted(server: &FakeServer, client: &str, permissions: &[uninstall::Permission]) {
    let mut made = 0;
    for (key, _) in server.requests().iter().filter(|(key, _)| key.client == client) {
        if key.resource.is_empty() {
            continue; // discovery
        }
        made += 1;
        let verb = match key.verb {
            Verb::Apply => "patch".to_owned(),
            verb => format!("{verb:?}").to_lowercase(),
        };
        let granted = permissions.iter().any(|p| {
            p.group == key.group
                && p.resource == key.resource
                && key.subresource.is_empty()
                && p.verbs.contains(&verb.as_str())
                && (!p.namespaced || key.scope != "cluster")
        });
        assert!(
            granted,
            "{client} made a request its permissions do not grant: {key:?}"
        );
    }
    assert!(made > 0, "{client} made no request");
}

/// A converged cluster where a person labelled gpu-0 for their team and switched DCGM off on it (the
/// operator had written `true` there).
async fn converged_with_a_persons_labels() -> Cluster {
    let cluster = Cluster::start(vec![pool("gpu", 2, Some(GpuModel::T4)), pool("cpu", 1, None)]).await;
    cluster.apply(DEFAULT_POLICY).await;
    cluster.converged("cluster-policy").await;
    assert_eq!(
        cluster
            .node("gpu-0")
            .await
            .labels()
            .get("nvidia.com/gpu.deploy.dcgm")
            .map(String::as_str),
        Some("true")
    );
    // The nodes carry the upgrade state too: uninstalling must remove that as well.
    cluster
        .until("gpu-0 has an upgrade state", || async {
            let node = cluster.node("gpu-0").await;
            match node.labels().get(UPGRADE_STATE) {
                Some(_) => Ok(()),
                None => Err(format!("{:?}", node.labels())),
            }
        })
        .await;
    cluster.label_node("gpu-0", "team", Some("ml")).await;
    cluster
        .label_node("gpu-0", "nvidia.com/gpu.deploy.dcgm", Some("false"))
        .await;
    cluster
}

#[tokio::test]
async fn uninstall_waits_for_the_operator_to_remove_everything_and_keeps_a_persons_labels() {
    let cluster = converged_with_a_persons_labels().await;
    assert!(!managed_everywhere(&cluster.client).await.is_empty());
    let options = uninstall::Options {
        namespace: NAMESPACE.into(),
        lease_name: DEFAULT_LEASE_NAME.into(),
        timeout: PATIENCE * 2,
    };
    let hook = cluster.server().client_as("uninstall-hook");
    let report = uninstall::uninstall(&hook, &options)
        .await
        .expect("uninstall runs");
    assert_only_requests_granted(cluster.server(), "uninstall-hook", &uninstall::permissions());
    assert_eq!(report.deleted, ["ClusterPolicy/cluster-policy"]);
    assert!(
        report.operator_finished,
        "the running operator cleans up after itself: {}",
        uninstall::summary(&report)
    );
    assert!(report.removed.is_empty());
    assert_uninstalled(&cluster, &report).await;
    cluster.stop().await;
}

#[tokio::test]
async fn uninstall_removes_what_a_stopped_operator_left_and_lifts_its_upgrade_cordon() {
    let mut cluster = converged_with_a_persons_labels().await;
    cluster.stop_operator().await;
    // The operator stopped in the middle of upgrading gpu-1's driver: cordoned, state label, annotation.
    Api::<Node>::all(cluster.client.clone())
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {
                    "labels": { UPGRADE_STATE: "validation-required" },
                    "annotations": { UPGRADE_ENABLED_ANNOTATION: "true" },
                },
                "spec": { "unschedulable": true },
            })),
        )
        .await
        .unwrap();
    // And its leader-election Lease, held by a replica that is gone.
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": DEFAULT_LEASE_NAME, "namespace": NAMESPACE},
        "spec": {"holderIdentity": "gpu-operator-gone", "leaseDurationSeconds": 1},
    }))
    .expect("a Lease");
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    leases
        .create(&Default::default(), &lease)
        .await
        .expect("the Lease is created");
    let options = uninstall::Options {
        namespace: NAMESPACE.into(),
        lease_name: DEFAULT_LEASE_NAME.into(),
        timeout: Duration::from_secs(20),
    };
    let hook = cluster.server().client_as("uninstall-hook");
    let report = uninstall::uninstall(&hook, &options)
        .await
        .expect("uninstall runs");
    assert_only_requests_granted(cluster.server(), "uninstall-hook", &uninstall::permissions());
    assert!(!report.operator_finished);
    assert!(
        report
            .removed
            .iter()
            .any(|r| r.starts_with("Node gpu-1:") && r.contains("cordoned by a driver upgrade")),
        "{}",
        uninstall::summary(&report)
    );
    assert!(
        report.removed.iter().any(|r| r.starts_with("Lease ")),
        "{}",
        uninstall::summary(&report)
    );
    assert!(
        leases
            .get_opt(DEFAULT_LEASE_NAME)
            .await
            .expect("leases read")
            .is_none()
    );
    assert_uninstalled(&cluster, &report).await;
    cluster.stop().await;
}

#[tokio::test]
async fn crd_apply_creates_is_idempotent_updates_and_never_downgrades() {
    let server = FakeServer::new();
    let client = server.client_as("crd-hook");
    let outcomes = |done: Vec<(String, CrdOutcome)>| -> Vec<String> {
        done.into_iter()
            .map(|(name, outcome)| format!("{name} {outcome}"))
            .collect()
    };
    let timeout = Duration::from_secs(30);
    let (done, result) = crd_install::apply_all(&client, timeout).await;
    result.expect("CRDs install");
    assert_eq!(
        outcomes(done),
        [
            "clusterpolicies.nvidia.com created",
            "nvidiadrivers.nvidia.com created"
        ]
    );
    assert!(
        Api::<ClusterPolicy>::all(server.client())
            .list(&ListParams::default())
            .await
            .is_ok(),
        "the kind is served"
    );
    let (done, result) = crd_install::apply_all(&client, timeout).await;
    result.unwrap();
    assert_eq!(
        outcomes(done),
        [
            "clusterpolicies.nvidia.com unchanged",
            "nvidiadrivers.nvidia.com unchanged"
        ]
    );

    // An older operator's CRD: a printer column fewer.
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    let mut older = gpuop_api::crd::cluster_policy_crd();
    older.spec.versions[0].additional_printer_columns = None;
    crds.patch(
        "clusterpolicies.nvidia.com",
        &PatchParams::apply("gpu-operator").force(),
        &Patch::Apply(&older),
    )
    .await
    .unwrap();
    let (done, result) = crd_install::apply_all(&client, timeout).await;
    result.unwrap();
    assert_eq!(
        outcomes(done),
        [
            "clusterpolicies.nvidia.com updated",
            "nvidiadrivers.nvidia.com unchanged"
        ]
    );
    assert_eq!(
        crds.get("clusterpolicies.nvidia.com")
            .await
            .unwrap()
            .spec
            .versions[0]
            .additional_printer_columns,
        gpuop_api::crd::cluster_policy_crd().spec.versions[0].additional_printer_columns
    );

    // A newer operator's CRD serves v2: applying ours would stop serving it.
    let mut newer = gpuop_api::crd::nvidia_driver_crd();
    let mut v2 = newer.spec.versions[0].clone();
    v2.name = "v2".into();
    v2.storage = false;
    newer.spec.versions.push(v2);
    crds.patch(
        "nvidiadrivers.nvidia.com",
        &PatchParams::apply("gpu-operator").force(),
        &Patch::Apply(&newer),
    )
    .await
    .unwrap();
    let (done, result) = crd_install::apply_all(&client, timeout).await;
    assert_eq!(outcomes(done), ["clusterpolicies.nvidia.com unchanged"]);
    let error = result.unwrap_err().to_string();
    assert!(
        error.starts_with("CustomResourceDefinition nvidiadrivers.nvidia.com: refusing to downgrade")
            && error.contains("\"v2\""),
        "{error}"
    );
    assert_only_requests_granted(&server, "crd-hook", &[crd_install::permissions()]);
    assert_eq!(
        crds.get("nvidiadrivers.nvidia.com")
            .await
            .unwrap()
            .spec
            .versions
            .len(),
        2,
        "the newer CRD is left as it is"
    );
}
