//! `gpu-sim bench converge --real-control-plane`: this project's operator and NVIDIA's, one after the
//! other, each converging the sample ClusterPolicy on a real control plane of its own (kube-apiserver,
//! its controller manager and scheduler, from the binaries `KUBE_BINARIES` names) whose nodes the simulator
//! plays. Every client's requests are counted from the API server's audit log, as kube-apiserver saw them;
//! CPU and peak memory are each operator's own process's. Numbers are printed side by side as a Markdown
//! table for `BENCHMARKS.md`. This measures; it asserts nothing.
//!
//! NVIDIA's operator is the binary built from its source that `NVIDIA_OPERATOR` names
//! (`scripts/nvidia-operator`); ours is the `gpu-operator` binary beside this one.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use gpuop_testkit::nvidia::{NvidiaOperator, Usage, usage_of};
use gpuop_testkit::{AuditEvent, ControlPlane};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

use crate::cli::ConvergeBenchArgs;
use crate::cluster_bench::{gpu_cluster, operator_binary, spawn_operator, verbs_text};
use crate::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install};
use crate::heartbeat::Heartbeats;
use crate::kubelet::Timing;
use crate::simulation::{Plays, Simulation};

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
    ours: &std::path::Path,
    nvidia: &NvidiaOperator,
) -> anyhow::Result<Run> {
    eprintln!(
        "{operator:?}: starting a control plane and {} simulated nodes",
        args.nodes
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
    let simulation =
        Simulation::start_playing(client.clone(), gpu_cluster(args.nodes), timing, Plays::NodesOnly).await?;
    let mut process = match operator {
        Operator::Ours => {
            let kubeconfig = plane.dir().join("operator.kubeconfig");
            std::fs::write(&kubeconfig, plane.kubeconfig(plane.admin_token()))?;
            Process::Ours(spawn_operator(ours, &kubeconfig)?)
        }
        Operator::Nvidia => Process::Nvidia(nvidia.start(&plane, NAMESPACE)?),
    };
    // Whatever the operator did before the policy exists (its caches filling) counts as converging.
    let started = Instant::now();
    let from = jiff::Timestamp::now();
    let cpu_before = process.usage()?.cpu_seconds;
    apply_policy(&client, DEFAULT_POLICY).await?;
    eprintln!("{operator:?}: policy applied");
    loop {
        if let Some(why) = process.exited() {
            bail!("{why}");
        }
        match converged(&client, args.nodes).await {
            Ok(()) => break,
            Err(why) if started.elapsed() > args.deadline() => {
                bail!(
                    "{operator:?}'s operator did not converge within {:?}: {why}",
                    args.deadline()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    let converged_after = started.elapsed();
    let converged_at = jiff::Timestamp::now();
    let cpu_converged = process.usage()?.cpu_seconds;
    eprintln!(
        "{operator:?}: converged in {:.1} s; steady window of {} s",
        converged_after.as_secs_f64(),
        args.steady_seconds
    );
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let steady_until = jiff::Timestamp::now();
    let usage = process.usage()?;
    if let Some(why) = process.exited() {
        bail!("{why}");
    }
    let events = plane.requests_so_far().await?;
    drop(process);
    simulation.stop().await;
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

/// Requests by verb.
fn by_verb(events: &[&AuditEvent]) -> BTreeMap<String, u64> {
    let mut verbs = BTreeMap::new();
    for event in events {
        *verbs.entry(event.verb.to_uppercase()).or_default() += 1;
    }
    verbs
}

/// Whether the policy says ready and every operand DaemonSet runs its latest revision, ready, on every
/// node it selects, the device plugin on every GPU node.
async fn converged(client: &Client, nodes: u32) -> Result<(), String> {
    let (_, ready) = rolled_out(client).await?;
    let plugin_pods = ready.get("nvidia-device-plugin-daemonset").copied().unwrap_or(0);
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
    let policies = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
            "clusterpolicies",
        ),
    );
    let policy = policies.get("cluster-policy").await.map_err(|e| e.to_string())?;
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

fn total(verbs: &BTreeMap<String, u64>) -> u64 {
    verbs.values().sum()
}

fn print(args: &ConvergeBenchArgs, ours: &Run, theirs: &Run, whole: Duration) {
    let both = |label: &str, a: String, b: String| println!("| {label} | {a} | {b} |");
    println!(
        "| measurement ({} GPU nodes, real control plane, kube-apiserver's audit log) | this operator | NVIDIA's operator |",
        args.nodes
    );
    println!("| --- | --- | --- |");
    both(
        "policy applied → policy `ready`, every operand DaemonSet rolled out",
        format!("{:.1} s", ours.converged.as_secs_f64()),
        format!("{:.1} s", theirs.converged.as_secs_f64()),
    );
    both(
        "requests to converge",
        total(&ours.converge_requests).to_string(),
        total(&theirs.converge_requests).to_string(),
    );
    both(
        "of which writes",
        ours.converge_writes.to_string(),
        theirs.converge_writes.to_string(),
    );
    both(
        "requests to converge, by verb",
        verbs_text(&ours.converge_requests),
        verbs_text(&theirs.converge_requests),
    );
    let rate = |run: &Run| total(&run.steady_requests) as f64 / run.steady.as_secs_f64().max(1.0);
    both(
        &format!(
            "requests per second at rest (a {} s window after converging)",
            args.steady_seconds
        ),
        format!("{:.2}", rate(ours)),
        format!("{:.2}", rate(theirs)),
    );
    both(
        "requests at rest, by verb",
        or_none(&ours.steady_requests),
        or_none(&theirs.steady_requests),
    );
    both(
        "writes at rest",
        ours.steady_writes.to_string(),
        theirs.steady_writes.to_string(),
    );
    both(
        "CPU to converge",
        format!("{:.2} s", ours.cpu_converge),
        format!("{:.2} s", theirs.cpu_converge),
    );
    both(
        "CPU at rest",
        format!("{:.2} s", ours.cpu_steady),
        format!("{:.2} s", theirs.cpu_steady),
    );
    both(
        "peak memory (VmHWM)",
        format!("{:.0} MiB", mib(ours.usage.peak_memory)),
        format!("{:.0} MiB", mib(theirs.usage.peak_memory)),
    );
    println!(
        "| the whole benchmark run (both operators) | {:.0} s | |",
        whole.as_secs_f64()
    );
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
