//! GPU workloads in the simulated cluster, without the operator: the ReplicaSet controller keeps their pods,
//! the scheduler places replacements on uncordoned nodes with free GPUs, the eviction API honours their
//! disruption budgets, running GPU pods outlive their node's driver pod, and scenario actions change any
//! object on the server. This is the cluster a driver upgrade controller works against.
//!
//! Waits are failure guards (see `scenarios::eventually`), never timings.

use std::collections::BTreeMap;

use gpuop_api::Operand;
use gpuop_api::labels::RESOURCE_GPU;
use gpuop_fakeserver::FakeServer;
use gpuop_sim::cluster_spec::{ClusterSpec, GpuSpec, NodePool};
use gpuop_sim::daemonset::is_ready;
use gpuop_sim::hardware::GpuModel;
use gpuop_sim::kubelet::Timing;
use gpuop_sim::scenario::{Action, DriverInstallFault, ObjectPatch, ObjectRef};
use gpuop_sim::simulation::Simulation;
use gpuop_sim::workload::{WORKLOAD_LABEL, Workload};
use gpuop_testkit::fixture;
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::scenarios::eventually;

/// Where the workloads run.
const ML: &str = "ml";
/// Where the operand DaemonSets go.
const OPERATORS: &str = "gpu-operator";
const OLD_DRIVER: &str = "nvcr.io/nvidia/driver:570.124.06-ubuntu22.04";
const NEW_DRIVER: &str = "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04";

/// A pool of `count` H100 nodes with `gpus` GPUs each; `host_driver`: the driver is on the host, so a
/// device plugin alone advertises the GPUs.
fn pool(count: u32, gpus: u32, host_driver: bool) -> NodePool {
    let mut pool = ClusterSpec::demo().node_pools.remove(1);
    pool.name = "gpu".into();
    pool.count = count;
    pool.gpu = Some(GpuSpec {
        model: GpuModel::H100_80GB,
        count: gpus,
    });
    pool.driver_preinstalled = host_driver;
    pool
}

/// An operand DaemonSet on every node, as plain as the simulator recognises it: its `app` label names the
/// operand.
fn operand(operand: Operand, image: &str, strategy: &str) -> DaemonSet {
    let app = operand.info().daemonset;
    let mut daemonset = fixture::daemonset(app)
        .namespace(OPERATORS)
        .selecting(&[("app", app)])
        .container(operand.id(), image)
        .update_strategy(strategy, None)
        .build();
    // Tolerates every taint, whatever its key.
    let everything = Toleration {
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    };
    let template = daemonset.spec.as_mut().and_then(|s| s.template.spec.as_mut());
    template.expect("the builder set a pod spec").tolerations = Some(vec![everything]);
    daemonset
}

struct Cluster {
    client: Client,
    sim: Simulation,
}

impl Cluster {
    /// Starts the nodes and workloads, and the operands that make the GPUs allocatable: the device plugin,
    /// and a driver (OnDelete, as the operator deploys it for upgrades) where the host has none.
    async fn start(pool: NodePool, workloads: Vec<Workload>) -> Self {
        let server = FakeServer::new();
        let client = server.client_as("test");
        let host_driver = pool.driver_preinstalled;
        let gpus = pool.gpu.as_ref().map_or(0, |g| u64::from(g.count));
        let nodes: Vec<String> = pool.node_names().collect();
        let mut spec = ClusterSpec {
            nfd: true,
            node_pools: vec![pool],
            workloads: Vec::new(),
        };
        for workload in workloads {
            spec = spec.with_workload(workload);
        }
        spec.check().expect("a valid cluster spec");
        let sim = Simulation::start(server.client_as(gpuop_sim::USER_AGENT), spec, Timing::instant())
            .await
            .expect("the simulation starts");
        let cluster = Self { client, sim };
        cluster.create_namespace(OPERATORS).await;
        let mut operands = vec![operand(
            Operand::DevicePlugin,
            "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
            "RollingUpdate",
        )];
        if !host_driver {
            operands.push(operand(Operand::Driver, OLD_DRIVER, "OnDelete"));
        }
        let daemonsets: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), OPERATORS);
        for daemonset in operands {
            daemonsets
                .create(&PostParams::default(), &daemonset)
                .await
                .expect("DaemonSet created");
        }
        for node in nodes {
            eventually(&format!("{node} advertises its GPUs"), async || {
                let node = Api::<Node>::all(cluster.client.clone())
                    .get(&node)
                    .await
                    .map_err(|e| e.to_string())?;
                let allocatable = gpu_allocatable(&node);
                (allocatable == Some(gpus))
                    .then_some(())
                    .ok_or(format!("{allocatable:?}"))
            })
            .await;
        }
        cluster
    }

    async fn create_namespace(&self, name: &str) {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("a namespace");
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace created");
    }

    /// The workload's pods that are neither terminating nor terminal.
    async fn active_pods(&self, workload: &str) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ML);
        let selector = ListParams::default().labels(&format!("{WORKLOAD_LABEL}={workload}"));
        pods.list(&selector)
            .await
            .expect("pods listed")
            .items
            .into_iter()
            .filter(gpuop_sim::replicaset::is_active)
            .collect()
    }

    async fn replica_set(&self, name: &str) -> ReplicaSet {
        Api::<ReplicaSet>::namespaced(self.client.clone(), ML)
            .get(name)
            .await
            .expect("the ReplicaSet exists")
    }

    /// Waits until the ReplicaSet's status says `ready` of `replicas` pods, for its current generation.
    async fn replica_set_counts(&self, name: &str, replicas: i32, ready: i32) -> ReplicaSetStatus {
        eventually(
            &format!("ReplicaSet {name} counts {ready} of {replicas} ready"),
            async || {
                let rs = self.replica_set(name).await;
                let status = rs.status.clone().unwrap_or_default();
                let counted = status.replicas == replicas
                    && status.ready_replicas == Some(ready)
                    && status.available_replicas == Some(ready)
                    && status.observed_generation == rs.metadata.generation;
                if counted {
                    return Ok(status);
                }
                Err(format!("{status:?}; pods: {}", self.summary().await))
            },
        )
        .await
    }

    /// The workload pods, terminal ones included, as `kubectl get pods -o wide` would sum them up.
    async fn summary(&self) -> String {
        let pods = Api::<Pod>::namespaced(self.client.clone(), ML)
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .unwrap_or_default();
        let lines: Vec<String> = pods
            .iter()
            .map(|pod| {
                let status = pod.status.clone().unwrap_or_default();
                format!(
                    "{} on {:?}: {} {}",
                    pod.name_any(),
                    node_of(pod),
                    status.phase.unwrap_or_default(),
                    status.reason.unwrap_or_default()
                )
            })
            .collect();
        lines.join(", ")
    }

    async fn cordon(&self, node: &str) {
        Api::<Node>::all(self.client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await
            .expect("node cordoned");
    }

    async fn evict(&self, pod: &str) -> Result<(), kube::Error> {
        Api::<Pod>::namespaced(self.client.clone(), ML)
            .evict(pod, &EvictParams::default())
            .await
            .map(|_| ())
    }

    async fn operand_pod(&self, operand: Operand) -> Result<Pod, String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), OPERATORS);
        let selector = ListParams::default().labels(&format!("app={}", operand.info().daemonset));
        let mut live: Vec<Pod> = pods
            .list(&selector)
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        match live.len() {
            1 => Ok(live.remove(0)),
            n => Err(format!("{n} live {} pods", operand.id())),
        }
    }
}

fn gpu_allocatable(node: &Node) -> Option<u64> {
    node.status
        .as_ref()?
        .allocatable
        .as_ref()?
        .get(RESOURCE_GPU)?
        .0
        .parse()
        .ok()
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

fn last_exit_message(pod: &Pod) -> Option<String> {
    let main = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    main.last_state.as_ref()?.terminated.as_ref()?.message.clone()
}

fn where_they_run(pods: &[Pod]) -> BTreeMap<String, usize> {
    let mut nodes = BTreeMap::new();
    for pod in pods {
        *nodes
            .entry(node_of(pod).unwrap_or("(unscheduled)").to_owned())
            .or_default() += 1;
    }
    nodes
}

#[tokio::test]
async fn evictions_keep_the_budget_and_replacements_avoid_cordoned_nodes() {
    // 3 nodes × 2 GPUs for 4 pods of 1 GPU, at least 3 of them available.
    let train = Workload::gpu("train", 4)
        .in_namespace(ML)
        .with_min_available(IntOrString::Int(3));
    let cluster = Cluster::start(pool(3, 2, true), vec![train]).await;
    let status = cluster.replica_set_counts("train", 4, 4).await;
    assert_eq!(status.fully_labeled_replicas, Some(4));
    // The disruption controller's view, as `kubectl get pdb` shows it: 4 healthy, 3 needed, 1 allowed.
    let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(cluster.client.clone(), ML);
    eventually("the budget's status counts the pods", async || {
        let status = budgets.get("train").await.map_err(|e| e.to_string())?.status;
        match status
            .as_ref()
            .map(|s| (s.current_healthy, s.desired_healthy, s.disruptions_allowed))
        {
            Some((4, 3, 1)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let rs = cluster.replica_set("train").await;
    let pods = cluster.active_pods("train").await;
    for pod in &pods {
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("ReplicaSet", rs.metadata.uid.as_deref().unwrap(), Some(true))
        );
        let suffix = pod.name_any().strip_prefix("train-").unwrap().to_owned();
        assert!(
            suffix.len() == 5
                && suffix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
            "{}",
            pod.name_any()
        );
    }

    // The upgrade controller's moves on the busiest node: cordon, then evict its GPU pods.
    let placed = where_they_run(&pods);
    let (busiest, _) = placed.iter().max_by_key(|(_, count)| **count).unwrap();
    let busiest = busiest.clone();
    let on_busiest: Vec<String> = pods
        .iter()
        .filter(|p| node_of(p) == Some(busiest.as_str()))
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(on_busiest.len(), 2, "{placed:?}");
    cluster.cordon(&busiest).await;
    cluster
        .evict(&on_busiest[0])
        .await
        .expect("one disruption is allowed");
    // The replacement is not ready yet: a second eviction would leave 2 of the 3 the budget needs.
    match cluster.evict(&on_busiest[1]).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429, "{status:?}");
            assert!(status.message.contains("disruption budget"), "{status:?}");
        }
        other => panic!("the budget should refuse the eviction: {other:?}"),
    }
    // Once the replacement runs, it goes.
    eventually("the second eviction is allowed", async || {
        cluster.evict(&on_busiest[1]).await.map_err(|e| e.to_string())
    })
    .await;
    cluster.replica_set_counts("train", 4, 4).await;
    let moved = eventually("the pods run off the cordoned node", async || {
        let pods = cluster.active_pods("train").await;
        let placed = where_they_run(&pods);
        let settled = pods.len() == 4 && pods.iter().all(is_ready) && !placed.contains_key(&busiest);
        settled.then_some(placed.clone()).ok_or(format!("{placed:?}"))
    })
    .await;
    assert_eq!(moved.values().sum::<usize>(), 4);
    assert!(moved.values().all(|count| *count == 2), "{moved:?}");

    // With a second node cordoned there is room for 2 of the 4: an evicted pod's replacement waits.
    let (second, _) = moved.iter().next().unwrap();
    let second = second.clone();
    cluster.cordon(&second).await;
    let victim = cluster
        .active_pods("train")
        .await
        .into_iter()
        .find(|p| node_of(p) == Some(second.as_str()))
        .unwrap();
    cluster
        .evict(&victim.name_any())
        .await
        .expect("one disruption is allowed");
    let pending = eventually("the replacement is unschedulable", async || {
        let pods = cluster.active_pods("train").await;
        pods.into_iter()
            .find(|p| {
                node_of(p).is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.reason.as_deref() == Some("Unschedulable")))
            })
            .ok_or("no pod reported unschedulable".to_owned())
    })
    .await;
    let condition = pending.status.unwrap().conditions.unwrap().remove(0);
    assert_eq!(condition.type_, "PodScheduled");
    assert!(
        condition.message.as_deref().is_some_and(
            |m| m.contains("2 node(s) were unschedulable") && m.contains("1 Insufficient nvidia.com/gpu")
        ),
        "{condition:?}"
    );
    cluster.replica_set_counts("train", 4, 3).await;
    let placed = where_they_run(&cluster.active_pods("train").await);
    assert!(
        !placed.contains_key(&busiest) && placed.get(&second) == Some(&1),
        "{placed:?}"
    );
    cluster.sim.stop().await;
}

#[tokio::test]
async fn a_loaded_driver_is_not_touched_by_a_later_install_fault() {
    let cluster = Cluster::start(pool(1, 8, false), Vec::new()).await;
    let driver = eventually("the driver runs", async || {
        let pod = cluster.operand_pod(Operand::Driver).await?;
        is_ready(&pod)
            .then_some(pod.clone())
            .ok_or(format!("{:?}", pod.status))
    })
    .await;
    cluster
        .sim
        .apply(&Action::DriverInstallFails(DriverInstallFault::on("gpu-0")))
        .await
        .unwrap();
    // The kubelet has looked at the node since the fault: a device plugin pod started there afterwards.
    let plugin = cluster.operand_pod(Operand::DevicePlugin).await.unwrap();
    Api::<Pod>::namespaced(cluster.client.clone(), OPERATORS)
        .delete(&plugin.name_any(), &Default::default())
        .await
        .unwrap();
    eventually("a new device plugin runs", async || {
        let pod = cluster.operand_pod(Operand::DevicePlugin).await?;
        (pod.uid() != plugin.uid() && is_ready(&pod))
            .then_some(())
            .ok_or(format!("{:?}", pod.status))
    })
    .await;
    let still = cluster.operand_pod(Operand::Driver).await.unwrap();
    assert_eq!(still.uid(), driver.uid());
    assert!(is_ready(&still) && restarts(&still) == 0, "{:?}", still.status);
    assert_eq!(
        cluster.sim.host("gpu-0").unwrap().loaded_driver.as_deref(),
        Some("570.124.06")
    );
    cluster.sim.stop().await;
}

#[tokio::test]
async fn only_the_new_driver_version_fails_and_running_gpu_pods_outlive_the_driver_pod() {
    let cluster = Cluster::start(
        pool(1, 8, false),
        vec![Workload::gpu("train", 8).in_namespace(ML)],
    )
    .await;
    cluster.replica_set_counts("train", 8, 8).await;
    let before: Vec<String> = cluster
        .active_pods("train")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    // An XID takes a GPU out of allocatable under the 8 pods that hold them all: they keep running.
    cluster
        .sim
        .apply(&Action::Xid {
            node: "gpu-0".into(),
            gpu: 3,
            code: 79,
        })
        .await
        .unwrap();
    eventually("allocatable drops to 7", async || {
        let node = Api::<Node>::all(cluster.client.clone())
            .get("gpu-0")
            .await
            .map_err(|e| e.to_string())?;
        (gpu_allocatable(&node) == Some(7))
            .then_some(())
            .ok_or(format!("{:?}", gpu_allocatable(&node)))
    })
    .await;
    cluster
        .sim
        .apply(&Action::DriverInstallFails(DriverInstallFault::of_version(
            "gpu-0",
            "580.95.05",
        )))
        .await
        .unwrap();
    // A person (or the upgrade controller) moves the driver to the new version, through a scenario patch.
    cluster
        .sim
        .apply(&Action::Patch(ObjectPatch {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: Operand::Driver.info().daemonset.into(),
            namespace: Some(OPERATORS.into()),
            merge: json!({"spec": {"template": {"spec": {"containers": [{"name": "driver", "image": NEW_DRIVER}]}}}}),
        }))
        .await
        .unwrap();
    let old = cluster.operand_pod(Operand::Driver).await.unwrap();
    assert_eq!(
        old.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some(OLD_DRIVER),
        "OnDelete: the running driver pod stays until deleted"
    );
    assert!(is_ready(&old), "the fault is for the new version only");
    Api::<Pod>::namespaced(cluster.client.clone(), OPERATORS)
        .delete(&old.name_any(), &Default::default())
        .await
        .unwrap();
    let failing = eventually("the new driver crash-loops", async || {
        let pod = cluster.operand_pod(Operand::Driver).await?;
        (pod.uid() != old.uid() && restarts(&pod) >= 2)
            .then_some(pod.clone())
            .ok_or(format!("{:?}", pod.status))
    })
    .await;
    assert_eq!(
        failing.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some(NEW_DRIVER)
    );
    assert!(
        last_exit_message(&failing)
            .is_some_and(|m| m.contains("failed to install the NVIDIA driver 580.95.05")),
        "{:?}",
        failing.status
    );
    assert_eq!(cluster.sim.host("gpu-0").unwrap().loaded_driver, None);
    // Through all this the GPU pods ran on: the same 8, all ready, none failed or replaced.
    let after = cluster.active_pods("train").await;
    assert!(after.iter().all(is_ready), "{after:?}");
    let mut names: Vec<String> = after.iter().map(ResourceExt::name_any).collect();
    names.sort();
    let mut before = before;
    before.sort();
    assert_eq!(names, before);
    let status = cluster.replica_set("train").await.status.unwrap();
    assert_eq!((status.replicas, status.ready_replicas), (8, Some(8)));
    cluster.sim.stop().await;
}

#[tokio::test]
async fn scenario_actions_apply_patch_and_delete_a_cluster_policy() {
    let server = FakeServer::new();
    let client = server.client_as("test");
    gpuop_sim::demo::install(&client).await.expect("CRDs installed");
    let sim = Simulation::start(
        server.client_as(gpuop_sim::USER_AGENT),
        ClusterSpec {
            nfd: true,
            node_pools: vec![pool(1, 8, false)],
            workloads: Vec::new(),
        },
        Timing::instant(),
    )
    .await
    .unwrap();
    let sample = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/samples/clusterpolicy.yaml"),
    )
    .unwrap();
    let manifest: serde_json::Value = serde_saphyr::from_str(&sample).unwrap();
    sim.apply(&Action::Apply(manifest)).await.unwrap();
    let resource = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
        "clusterpolicies",
    );
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let applied = policies.get("cluster-policy").await.unwrap();
    assert_eq!(applied.data["spec"]["driver"]["version"], "595.91.07");
    assert!(
        applied
            .managed_fields()
            .iter()
            .any(|f| f.manager.as_deref() == Some("gpu-sim-scenario")
                && f.operation.as_deref() == Some("Apply")),
        "{:?}",
        applied.managed_fields()
    );

    sim.apply(&Action::Patch(ObjectPatch {
        api_version: "nvidia.com/v1".into(),
        kind: "ClusterPolicy".into(),
        name: "cluster-policy".into(),
        namespace: None,
        merge: json!({"spec": {"driver": {"version": "600.10.01"}}}),
    }))
    .await
    .unwrap();
    let patched = policies.get("cluster-policy").await.unwrap();
    assert_eq!(patched.data["spec"]["driver"]["version"], "600.10.01");
    assert_eq!(
        patched.data["spec"]["driver"]["upgradePolicy"]["maxUnavailable"], "25%",
        "a merge patch leaves the rest"
    );
    assert!(patched.metadata.generation > applied.metadata.generation);

    let missing = sim
        .apply(&Action::Patch(ObjectPatch {
            api_version: "nvidia.com/v1".into(),
            kind: "ClusterPolicy".into(),
            name: "no-such-policy".into(),
            namespace: None,
            merge: json!({"spec": {}}),
        }))
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains("patch ClusterPolicy no-such-policy"),
        "{missing}"
    );
    // The policy `cluster-policy` as the kind `kind`, which the server may not know.
    let policy_as = |kind: &str| ObjectRef {
        api_version: "nvidia.com/v1".into(),
        kind: kind.into(),
        name: "cluster-policy".into(),
        namespace: None,
    };
    let unknown = sim
        .apply(&Action::Delete(policy_as("ClusterPolicies")))
        .await
        .unwrap_err();
    assert!(
        unknown.to_string().contains("nvidia.com/v1/ClusterPolicies"),
        "{unknown}"
    );

    sim.apply(&Action::Delete(policy_as("ClusterPolicy")))
        .await
        .unwrap();
    assert!(policies.get_opt("cluster-policy").await.unwrap().is_none());
    sim.stop().await;
}

#[tokio::test]
async fn the_upgrade_scenario_sets_up_its_workloads_and_its_policy_changes_the_driver_version() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/scenarios/upgrade.yaml");
    let scenario = gpuop_sim::up::load_scenario(Some(&path)).expect("the scenario loads");
    let server = FakeServer::new();
    let client = server.client_as("test");
    gpuop_sim::demo::install(&client).await.expect("CRDs installed");
    let sim = Simulation::start(
        server.client_as(gpuop_sim::USER_AGENT),
        scenario.cluster(),
        Timing::instant(),
    )
    .await
    .expect("the simulation starts");
    for workload in &scenario.cluster().workloads {
        let rs = Api::<ReplicaSet>::namespaced(client.clone(), &workload.namespace)
            .get(&workload.name)
            .await
            .expect("the workload's ReplicaSet exists");
        assert_eq!(rs.spec.unwrap().replicas, Some(workload.replicas as i32));
        Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
            client.clone(),
            &workload.namespace,
        )
        .get(&workload.name)
        .await
        .expect("the workload's budget exists");
    }
    // The timeline's object actions, in order, against the CRDs' schemas.
    for event in &scenario.timeline {
        sim.apply(&event.action)
            .await
            .unwrap_or_else(|error| panic!("{:?}: {error}", event.action));
    }
    let resource = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
        "clusterpolicies",
    );
    let policy = Api::<DynamicObject>::all_with(client.clone(), &resource)
        .get("cluster-policy")
        .await
        .expect("the ClusterPolicy was applied");
    let driver = &policy.data["spec"]["driver"];
    assert_eq!(driver["version"], "580.95.05");
    assert_eq!(driver["upgradePolicy"]["autoUpgrade"], true);
    assert_eq!(driver["upgradePolicy"]["maxParallelUpgrades"], 3);
    assert_eq!(driver["upgradePolicy"]["maxUnavailable"], "25%");
    assert_eq!(
        sim.state()
            .faults()
            .driver_install_fails
            .iter()
            .collect::<Vec<_>>(),
        [&("a100-4".to_owned(), Some("580.95.05".to_owned()))]
    );
    sim.stop().await;
}
