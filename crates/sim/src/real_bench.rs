//! `gpu-sim bench converge --real-control-plane` and `gpu-sim bench upgrade --real-control-plane`: this
//! project's operator and NVIDIA's, one after the other, each on a real control plane of its own
//! (kube-apiserver, its controller manager and scheduler, from the binaries `KUBE_BINARIES` names) whose
//! nodes the simulator plays. `converge` measures the sample ClusterPolicy converging and the rest after it;
//! `upgrade` measures a driver version change rolling over nodes that run as many GPU pods as there are
//! nodes behind a PodDisruptionBudget, through the real eviction API. Every client's requests are counted from the API
//! server's audit log, as kube-apiserver saw them; CPU and peak memory are each operator's own process's.
//! Numbers are printed side by side as a Markdown table for `BENCHMARKS.md`. This measures; only the upgrade
//! fails, when this operator exceeded its budget.
//!
//! NVIDIA's operator is the binary built from its source that `NVIDIA_OPERATOR` names
//! (`scripts/nvidia-operator`); ours is the `gpu-operator` binary beside this one.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use gpuop_api::Operand;
use gpuop_testkit::nvidia::{NvidiaOperator, Usage, usage_of};
use gpuop_testkit::{AuditEvent, ControlPlane};
use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use crate::cli::{ConvergeBenchArgs, UpgradeBenchArgs};
use crate::cluster_bench::{gpu_cluster, operator_binary, spawn_operator, verbs_text};
use crate::cluster_spec::ClusterSpec;
use crate::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install};
use crate::heartbeat::Heartbeats;
use crate::kubelet::Timing;
use crate::simulation::{Plays, Simulation};
use crate::upgrade_bench::{NEW_VERSION, lock, watch_budget};
use crate::workload::Workload;

/// Which operator a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    Ours,
    Nvidia,
}

impl Operator {
    /// The product token of its `User-Agent`, by which its requests are counted.
    fn agent(self) -> &'static str {
        match self {
            Operator::Ours => crate::product_token(gpuop_operator::USER_AGENT),
            Operator::Nvidia => gpuop_testkit::nvidia::USER_AGENT,
        }
    }
}

/// What one run measured.
#[derive(Debug, Default)]
struct Run {
    converged: Duration,
    converge_requests: BTreeMap<String, u64>,
    converge_writes: u64,
    steady_requests: BTreeMap<String, u64>,
    steady_writes: u64,
    steady: Duration,
    cpu_converge: f64,
    cpu_steady: f64,
    usage: Usage,
}

/// The operator's process, whichever it is.
enum Process {
    Ours(tokio::process::Child),
    Nvidia(gpuop_testkit::RunningNvidia),
}

impl Process {
    fn usage(&self) -> anyhow::Result<Usage> {
        match self {
            Process::Ours(child) => {
                let pid = child.id().context("the operator has exited")?;
                Ok(usage_of(pid)?)
            }
            Process::Nvidia(running) => Ok(running.usage()?),
        }
    }

    fn exited(&mut self) -> Option<String> {
        match self {
            Process::Ours(child) => child
                .try_wait()
                .ok()
                .flatten()
                .map(|status| format!("gpu-operator exited: {status}")),
            Process::Nvidia(running) => running.exited().map(|error| error.to_string()),
        }
    }
}

/// `gpu-sim bench converge --real-control-plane`.
pub async fn converge(args: ConvergeBenchArgs) -> anyhow::Result<()> {
    let nvidia = NvidiaOperator::from_env()?;
    let ours = operator_binary()?;
    let run_started = Instant::now();
    let mine = measure(Operator::Ours, &args, &ours, &nvidia).await?;
    let theirs = measure(Operator::Nvidia, &args, &ours, &nvidia).await?;
    print(&args, &mine, &theirs, run_started.elapsed());
    Ok(())
}

/// Converges `args.nodes` GPU nodes with `operator` on a fresh control plane and measures it.
async fn measure(
    operator: Operator,
    args: &ConvergeBenchArgs,
    ours: &Path,
    nvidia: &NvidiaOperator,
) -> anyhow::Result<Run> {
    let mut bed = Bed::start(operator, gpu_cluster(args.nodes), ours, nvidia).await?;
    // Whatever the operator did before the policy exists (its caches filling) counts as converging.
    let started = Instant::now();
    let from = jiff::Timestamp::now();
    let cpu_before = bed.process.usage()?.cpu_seconds;
    apply_policy(&bed.client, DEFAULT_POLICY).await?;
    eprintln!("{operator:?}: policy applied");
    let nodes = args.nodes;
    bed.wait("converge", args.deadline(), |client| async move {
        converged(&client, nodes).await
    })
    .await
    .with_context(|| format!("{operator:?}'s operator"))?;
    let converged_after = started.elapsed();
    let converged_at = jiff::Timestamp::now();
    let cpu_converged = bed.process.usage()?.cpu_seconds;
    eprintln!(
        "{operator:?}: converged in {:.1} s; steady window of {} s",
        converged_after.as_secs_f64(),
        args.steady_seconds
    );
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let steady_until = jiff::Timestamp::now();
    let usage = bed.process.usage()?;
    if let Some(why) = bed.process.exited() {
        bail!("{why}");
    }
    let events = bed.stop().await?;
    let agent = operator.agent();
    let between = |from: jiff::Timestamp, to: jiff::Timestamp| -> Vec<&AuditEvent> {
        events
            .iter()
            .filter(|e| e.by_agent(agent) && e.received >= from && e.received < to)
            .collect()
    };
    let converging = between(from, converged_at);
    let steady = between(converged_at, steady_until);
    Ok(Run {
        converged: converged_after,
        converge_requests: by_verb(&converging),
        converge_writes: converging.iter().filter(|e| e.is_write()).count() as u64,
        steady_requests: by_verb(&steady),
        steady_writes: steady.iter().filter(|e| e.is_write()).count() as u64,
        steady: Duration::from_secs(args.steady_seconds),
        cpu_converge: cpu_converged - cpu_before,
        cpu_steady: usage.cpu_seconds - cpu_converged,
        usage,
    })
}

/// What one upgrade run measured.
#[derive(Debug)]
struct UpgradeRun {
    converged: Duration,
    upgraded: Duration,
    requests: BTreeMap<String, u64>,
    writes: BTreeMap<String, u64>,
    evictions: u64,
    refused_evictions: u64,
    max_in_progress: usize,
    max_unavailable: usize,
    cpu: f64,
    usage: Usage,
}

/// The workload's name and namespace: one pod of one GPU per node.
const WORKLOAD: (&str, &str) = ("train", "ml");

/// `gpu-sim bench upgrade --real-control-plane`.
pub async fn upgrade(args: UpgradeBenchArgs) -> anyhow::Result<()> {
    let nvidia = NvidiaOperator::from_env()?;
    let ours = operator_binary()?;
    let run_started = Instant::now();
    let mine = measure_upgrade(Operator::Ours, &args, &ours, &nvidia).await?;
    let theirs = measure_upgrade(Operator::Nvidia, &args, &ours, &nvidia).await?;
    print_upgrade(&args, &mine, &theirs, run_started.elapsed());
    if mine.max_in_progress > args.max_parallel as usize
        || mine.max_unavailable > allowed_unavailable(args.nodes)
    {
        bail!("this operator exceeded the upgrade budget");
    }
    Ok(())
}

/// `maxUnavailable: 25%` of the nodes, rounded up as both operators round it.
fn allowed_unavailable(nodes: u32) -> usize {
    nodes.div_ceil(4) as usize
}

/// Converges `args.nodes` GPU nodes, each running a pod of a GPU workload behind a PodDisruptionBudget,
/// with `operator`, then changes the driver version and measures the upgrade until every node runs it,
/// `upgrade-done` and uncordoned.
async fn measure_upgrade(
    operator: Operator,
    args: &UpgradeBenchArgs,
    ours: &Path,
    nvidia: &NvidiaOperator,
) -> anyhow::Result<UpgradeRun> {
    let (workload, namespace) = WORKLOAD;
    let spec = gpu_cluster(args.nodes).with_workload(
        Workload::gpu(workload, args.nodes)
            .in_namespace(namespace)
            .with_max_unavailable(IntOrString::String("10%".into())),
    );
    let mut bed = Bed::start(operator, spec, ours, nvidia).await?;
    let (budget, node_watch) = watch_budget(&bed.client);
    let started = Instant::now();
    apply_policy(&bed.client, DEFAULT_POLICY).await?;
    set_driver(
        &bed.client,
        json!({ "upgradePolicy": { "autoUpgrade": true, "maxParallelUpgrades": args.max_parallel, "maxUnavailable": "25%" } }),
    )
    .await?;
    let count = args.nodes as usize;
    let nodes = args.nodes;
    let judged = budget.clone();
    bed.wait("converge", args.deadline(), move |client| {
        let budget = judged.clone();
        async move {
            converged(&client, nodes).await?;
            if !lock(&budget).done(count) {
                return Err("not every node is `upgrade-done` and available".into());
            }
            workload_ready(&client, nodes).await
        }
    })
    .await
    .with_context(|| format!("{operator:?}'s operator"))?;
    let converged_after = started.elapsed();
    eprintln!(
        "{operator:?}: converged in {:.1} s; changing the driver's version",
        converged_after.as_secs_f64()
    );
    {
        let mut budget = lock(&budget);
        budget.max_unavailable = 0;
        budget.max_in_progress = 0;
    }
    let from = jiff::Timestamp::now();
    let cpu_before = bed.process.usage()?.cpu_seconds;
    let upgrading = Instant::now();
    set_driver(&bed.client, json!({ "version": NEW_VERSION })).await?;
    let judged = budget.clone();
    bed.wait("upgrade", args.deadline(), move |client| {
        let budget = judged.clone();
        async move {
            driver_template_on(&client, NEW_VERSION).await?;
            rolled_out(&client).await?;
            if lock(&budget).done(count) {
                Ok(())
            } else {
                Err("not every node is `upgrade-done` and available".into())
            }
        }
    })
    .await
    .with_context(|| format!("{operator:?}'s operator"))?;
    let upgraded = upgrading.elapsed();
    let to = jiff::Timestamp::now();
    eprintln!("{operator:?}: upgraded in {:.1} s", upgraded.as_secs_f64());
    let usage = bed.process.usage()?;
    node_watch.abort();
    let (max_unavailable, max_in_progress) = {
        let budget = lock(&budget);
        (budget.max_unavailable, budget.max_in_progress)
    };
    let events = bed.stop().await?;
    let agent = operator.agent();
    let during: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.by_agent(agent) && e.received >= from && e.received < to)
        .collect();
    let mut writes = BTreeMap::new();
    for event in during.iter().filter(|e| e.is_write()) {
        let attrs = &event.attrs;
        let resource = if attrs.subresource.is_empty() {
            attrs.resource.clone()
        } else {
            format!("{}/{}", attrs.resource, attrs.subresource)
        };
        *writes.entry(format!("{} {resource}", attrs.verb)).or_default() += 1;
    }
    let evictions: Vec<&&AuditEvent> = during
        .iter()
        .filter(|e| {
            e.attrs.verb == "create" && e.attrs.resource == "pods" && e.attrs.subresource == "eviction"
        })
        .collect();
    Ok(UpgradeRun {
        converged: converged_after,
        upgraded,
        requests: by_verb(&during),
        writes,
        evictions: evictions.len() as u64,
        refused_evictions: evictions.iter().filter(|e| e.code == 429).count() as u64,
        max_in_progress,
        max_unavailable,
        cpu: usage.cpu_seconds - cpu_before,
        usage,
    })
}

/// Merges `driver` into the ClusterPolicy's `spec.driver`.
async fn set_driver(client: &Client, driver: serde_json::Value) -> anyhow::Result<()> {
    policies(client)
        .patch(
            "cluster-policy",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "driver": driver } })),
        )
        .await
        .context("patching the ClusterPolicy's driver")?;
    Ok(())
}

/// Whether the driver DaemonSet's pod template runs `version` (both operators put it in the image tag).
async fn driver_template_on(client: &Client, version: &str) -> Result<(), String> {
    // Both operators name it as the operand catalogue does.
    let name = Operand::Driver.info().daemonset;
    let driver = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .get(name)
        .await
        .map_err(|e| format!("{name}: {e}"))?;
    let images: Vec<String> = driver
        .spec
        .and_then(|spec| spec.template.spec)
        .map(|pod| pod.containers.into_iter().filter_map(|c| c.image).collect())
        .unwrap_or_default();
    if images.iter().any(|image| image.contains(version)) {
        Ok(())
    } else {
        Err(format!("{name} runs {images:?}, not yet {version}"))
    }
}

/// Whether the workload runs every one of its pods, ready.
async fn workload_ready(client: &Client, replicas: u32) -> Result<(), String> {
    let (name, namespace) = WORKLOAD;
    let ready = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| format!("{namespace}/{name}: {e}"))?
        .status
        .and_then(|status| status.ready_replicas)
        .unwrap_or(0);
    if u32::try_from(ready).unwrap_or(0) >= replicas {
        Ok(())
    } else {
        Err(format!("{ready} of {replicas} workload pods are ready"))
    }
}

fn print_upgrade(args: &UpgradeBenchArgs, ours: &UpgradeRun, theirs: &UpgradeRun, whole: Duration) {
    let per_node = |run: &UpgradeRun, what: &str| {
        let count = run.writes.get(what).copied().unwrap_or(0);
        format!("{:.1}", count as f64 / f64::from(args.nodes.max(1)))
    };
    let measurements: [Measurement<'_, UpgradeRun>; 12] = [
        (
            "policy applied → every node `upgrade-done`, every GPU pod running".into(),
            &|run| format!("{:.1} s", run.converged.as_secs_f64()),
        ),
        (
            "driver version changed → every node on it, `upgrade-done`, uncordoned".into(),
            &|run| format!("{:.1} s", run.upgraded.as_secs_f64()),
        ),
        ("requests during the upgrade".into(), &|run| {
            total(&run.requests).to_string()
        }),
        ("requests during the upgrade, by verb".into(), &|run| {
            verbs_text(&run.requests)
        }),
        ("writes during the upgrade".into(), &|run| {
            total(&run.writes).to_string()
        }),
        ("node patches per upgraded node".into(), &|run| {
            per_node(run, "patch nodes")
        }),
        ("writes during the upgrade, by verb and resource".into(), &|run| {
            verbs_text(&run.writes)
        }),
        ("evictions asked (of which refused with 429)".into(), &|run| {
            format!("{} ({})", run.evictions, run.refused_evictions)
        }),
        (
            format!("most nodes upgrading at once (limit {})", args.max_parallel),
            &|run| run.max_in_progress.to_string(),
        ),
        (
            format!(
                "most nodes unavailable at once (limit {})",
                allowed_unavailable(args.nodes)
            ),
            &|run| run.max_unavailable.to_string(),
        ),
        ("CPU during the upgrade".into(), &|run| {
            format!("{:.2} s", run.cpu)
        }),
        ("peak memory (VmHWM, converge and upgrade)".into(), &|run| {
            format!("{:.0} MiB", mib(run.usage.peak_memory))
        }),
    ];
    print_table(
        &format!(
            "measurement ({} GPU nodes, as many GPU pods as nodes behind a PodDisruptionBudget of maxUnavailable \
             10%, maxParallelUpgrades {}, maxUnavailable 25%, real control plane, kube-apiserver's audit log)",
            args.nodes, args.max_parallel
        ),
        &measurements,
        [ours, theirs],
        whole,
    );
}

/// One operator on a control plane of its own, with the simulator playing the nodes.
struct Bed {
    plane: ControlPlane,
    client: Client,
    simulation: Simulation,
    process: Process,
}

impl Bed {
    /// Starts a control plane, installs what either operator needs (ours: the CRDs and namespace;
    /// NVIDIA's: its own CRDs too), creates `spec`'s nodes and workloads, and starts `operator`.
    async fn start(
        operator: Operator,
        spec: ClusterSpec,
        ours: &Path,
        nvidia: &NvidiaOperator,
    ) -> anyhow::Result<Self> {
        eprintln!(
            "{operator:?}: starting a control plane and {} simulated nodes",
            spec.nodes().count()
        );
        let plane = ControlPlane::from_env().await?;
        let client = plane
            .client_with(plane.admin_token(), Some(crate::USER_AGENT))
            .await?;
        install(&client).await?;
        if operator == Operator::Nvidia {
            nvidia.install_crds(&client).await?;
        }
        let timing = Timing::instant().with_heartbeats(Heartbeats::kubelet());
        let simulation = Simulation::start_playing(client.clone(), spec, timing, Plays::NodesOnly).await?;
        let process = match operator {
            Operator::Ours => {
                let kubeconfig = plane.dir().join("operator.kubeconfig");
                std::fs::write(&kubeconfig, plane.kubeconfig(plane.admin_token()))?;
                Process::Ours(spawn_operator(ours, &kubeconfig)?)
            }
            Operator::Nvidia => Process::Nvidia(nvidia.start(&plane, NAMESPACE)?),
        };
        Ok(Self {
            plane,
            client,
            simulation,
            process,
        })
    }

    /// Polls `check` every second until it passes; fails when the operator exits or `deadline` passes,
    /// saying what was not so yet.
    async fn wait<F, Fut>(&mut self, what: &str, deadline: Duration, mut check: F) -> anyhow::Result<()>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let started = Instant::now();
        loop {
            if let Some(why) = self.process.exited() {
                bail!("{why}");
            }
            match check(self.client.clone()).await {
                Ok(()) => return Ok(()),
                Err(why) if started.elapsed() > deadline => {
                    bail!("did not {what} within {deadline:?}: {why}")
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    /// Stops the operator and the nodes, and then the control plane; gives every request the API server
    /// received.
    async fn stop(self) -> anyhow::Result<Vec<AuditEvent>> {
        let events = self.plane.requests_so_far().await?;
        drop(self.process);
        self.simulation.stop().await;
        Ok(events)
    }
}

/// Requests by verb.
fn by_verb(events: &[&AuditEvent]) -> BTreeMap<String, u64> {
    let mut verbs = BTreeMap::new();
    for event in events {
        *verbs.entry(event.attrs.verb.to_uppercase()).or_default() += 1;
    }
    verbs
}

/// Whether the policy says ready and every operand DaemonSet runs its latest revision, ready, on every
/// node it selects, the device plugin on every GPU node.
async fn converged(client: &Client, nodes: u32) -> Result<(), String> {
    let (_, ready) = rolled_out(client).await?;
    let plugin_pods = ready
        .get(Operand::DevicePlugin.info().daemonset)
        .copied()
        .unwrap_or(0);
    if u32::try_from(plugin_pods).unwrap_or(0) < nodes {
        return Err(format!(
            "the device plugin is ready on {plugin_pods} of {nodes} nodes"
        ));
    }
    Ok(())
}

/// Whether the ClusterPolicy `cluster-policy` says `ready` and every DaemonSet of the operator's namespace
/// runs its latest revision, ready, on every node it selects, whichever operator wrote them (NVIDIA's
/// status may say `ready` before any pod runs). Gives the policy as the API server has it and the ready
/// pods of each DaemonSet by name; otherwise what is not so yet.
pub async fn rolled_out(client: &Client) -> Result<(DynamicObject, BTreeMap<String, i32>), String> {
    let policy = policies(client)
        .get("cluster-policy")
        .await
        .map_err(|e| e.to_string())?;
    let state = policy.data["status"]["state"].as_str().unwrap_or_default();
    if state != "ready" {
        return Err(format!("the policy is {state:?}"));
    }
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let mut ready = BTreeMap::new();
    for ds in &daemonsets {
        let status = ds.status.clone().unwrap_or_default();
        let current = status.observed_generation == ds.metadata.generation
            && status.updated_number_scheduled.unwrap_or(0) == status.desired_number_scheduled
            && status.number_ready == status.desired_number_scheduled;
        if !current {
            return Err(format!("{} is rolling out: {status:?}", ds.name_any()));
        }
        ready.insert(ds.name_any(), status.number_ready);
    }
    Ok((policy, ready))
}

/// The ClusterPolicies, read untyped: whichever operator's CRD serves them (the same group, version and
/// plural).
fn policies(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::erase::<gpuop_api::ClusterPolicy>(&()),
    )
}

fn total(verbs: &BTreeMap<String, u64>) -> u64 {
    verbs.values().sum()
}

fn print(args: &ConvergeBenchArgs, ours: &Run, theirs: &Run, whole: Duration) {
    let rate = |run: &Run| total(&run.steady_requests) as f64 / run.steady.as_secs_f64().max(1.0);
    let measurements: [Measurement<'_, Run>; 10] = [
        (
            "policy applied → policy `ready`, every operand DaemonSet rolled out".into(),
            &|run| format!("{:.1} s", run.converged.as_secs_f64()),
        ),
        ("requests to converge".into(), &|run| {
            total(&run.converge_requests).to_string()
        }),
        ("of which writes".into(), &|run| run.converge_writes.to_string()),
        ("requests to converge, by verb".into(), &|run| {
            verbs_text(&run.converge_requests)
        }),
        (
            format!(
                "requests per second at rest (a {} s window after converging)",
                args.steady_seconds
            ),
            &|run| format!("{:.2}", rate(run)),
        ),
        ("requests at rest, by verb".into(), &|run| {
            or_none(&run.steady_requests)
        }),
        ("writes at rest".into(), &|run| run.steady_writes.to_string()),
        ("CPU to converge".into(), &|run| {
            format!("{:.2} s", run.cpu_converge)
        }),
        ("CPU at rest".into(), &|run| format!("{:.2} s", run.cpu_steady)),
        ("peak memory (VmHWM)".into(), &|run| {
            format!("{:.0} MiB", mib(run.usage.peak_memory))
        }),
    ];
    print_table(
        &format!(
            "measurement ({} GPU nodes, real control plane, kube-apiserver's audit log)",
            args.nodes
        ),
        &measurements,
        [ours, theirs],
        whole,
    );
}

/// One row of a side-by-side table: what is measured, and how it reads from one operator's run.
type Measurement<'a, R> = (String, &'a dyn Fn(&R) -> String);

/// Prints a side-by-side table in Markdown: a row per measurement of `runs` (ours, then NVIDIA's), then
/// how long the whole benchmark took.
fn print_table<R>(header: &str, measurements: &[Measurement<'_, R>], runs: [&R; 2], whole: Duration) {
    println!("| {header} | this operator | NVIDIA's operator |");
    println!("| --- | --- | --- |");
    let [ours, theirs] = runs;
    for (label, measure) in measurements {
        row(label, measure(ours), measure(theirs));
    }
    println!(
        "| the whole benchmark run (both operators) | {:.0} s | |",
        whole.as_secs_f64()
    );
}

/// A row of a side-by-side table: what is measured, ours, NVIDIA's.
fn row(label: &str, ours: impl std::fmt::Display, theirs: impl std::fmt::Display) {
    println!("| {label} | {ours} | {theirs} |");
}

fn or_none(verbs: &BTreeMap<String, u64>) -> String {
    if verbs.is_empty() {
        "none".to_owned()
    } else {
        verbs_text(verbs)
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
