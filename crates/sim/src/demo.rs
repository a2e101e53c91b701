//! `gpu-sim demo`: the operator, in-process, bringing a simulated mixed GPU cluster to life, shown as it
//! happens. The cluster (see [`ClusterSpec::demo`]) has MIG-capable A100 nodes, H100 nodes, a node whose
//! driver is preinstalled, a GPU node tainted against the operands and a CPU-only node. The demo applies
//! the default ClusterPolicy and prints, per node, each operand coming up in chain order; it ends with a
//! summary and exits 0 once everything that should run is ready, or non-zero with the reason at a deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, bail};
use gpuop_api::ClusterPolicy;
use gpuop_fakeserver::FakeServer;
use gpuop_operator::crd_install;
use gpuop_operator::run::{self, Config};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::cluster_spec::ClusterSpec;
use crate::kubelet::Timing;
use crate::progress::{Row, rows};
use crate::simulation::{Simulation, create_namespace};

/// How long the CRDs may take to be served.
const CRD_PATIENCE: Duration = Duration::from_secs(120);

/// The namespace the operator deploys operands into.
pub const NAMESPACE: &str = "gpu-operator";

/// The ClusterPolicy NVIDIA's chart creates, as shipped in `deploy/samples/`.
pub const DEFAULT_POLICY: &str = include_str!("../../../deploy/samples/clusterpolicy.yaml");

/// Settings of a demo run.
#[derive(Clone, Debug)]
pub struct DemoSettings {
    /// Give up after this long.
    pub deadline: Duration,
    /// How long things take on the nodes.
    pub timing: Timing,
}

/// Installs the CRDs and the operator namespace, as `helm install` would before the operator starts: the
/// CRDs applied and waited for until they are established and served (a real API server serves a new
/// CRD a moment after it accepts it), as `gpu-operator crd --apply` does.
pub async fn install(client: &Client) -> anyhow::Result<()> {
    let (_, applied) = crd_install::apply_all(client, CRD_PATIENCE).await;
    applied.context("installing the CRDs")?;
    create_namespace(client, NAMESPACE)
        .await
        .context("creating the operator namespace")?;
    Ok(())
}

/// Applies a ClusterPolicy manifest as a person would with `kubectl apply --server-side`.
pub async fn apply_policy(client: &Client, yaml: &str) -> anyhow::Result<String> {
    let policy: ClusterPolicy = serde_saphyr::from_str(yaml).context("parsing the ClusterPolicy")?;
    let name = policy.metadata.name.clone().unwrap_or_default();
    let api: Api<ClusterPolicy> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("kubectl").force(),
        &Patch::Apply(&policy),
    )
    .await
    .with_context(|| format!("applying ClusterPolicy {name}"))?;
    Ok(name)
}

/// What the cluster looks like now, as the demo shows it.
pub async fn snapshot(client: &Client) -> anyhow::Result<(Vec<Row>, Option<ClusterPolicy>)> {
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let daemonsets: Vec<DaemonSet> = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items;
    let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items;
    let policy = Api::<ClusterPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .next();
    Ok((rows(&nodes, &daemonsets, &pods), policy))
}

/// Runs the demo; returns an error naming what did not converge at the deadline.
pub async fn demo(settings: DemoSettings) -> anyhow::Result<()> {
    let spec = ClusterSpec::demo();
    println!("gpu-sim demo: the GPU operator on a simulated cluster");
    for pool in &spec.node_pools {
        let gpu = pool
            .gpu
            .as_ref()
            .map_or("no GPU".to_owned(), |g| format!("{} × {}", g.count, g.model));
        let mut notes = Vec::new();
        if pool.driver_preinstalled {
            notes.push("driver preinstalled".to_owned());
        }
        notes.extend(pool.labels.iter().map(|(k, v)| format!("{k}={v}")));
        notes.extend(pool.taints.iter().map(|t| {
            format!(
                "taint {}={}:{}",
                t.key,
                t.value.clone().unwrap_or_default(),
                t.effect
            )
        }));
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        println!("  {} × {:<15} {gpu}, {}{notes}", pool.count, pool.name, pool.os);
    }
    let server = FakeServer::new();
    let client = server.client_as(crate::USER_AGENT);
    install(&client).await?;
    let simulation = Simulation::start(client.clone(), spec, settings.timing).await?;
    let operator = run::start(
        server.client_as(gpuop_operator::USER_AGENT),
        Config::in_process(NAMESPACE),
    )
    .await?;
    let started = Instant::now();
    let name = apply_policy(&client, DEFAULT_POLICY).await?;
    println!(
        "\n[{:>5.1}s] applied ClusterPolicy {name:?} (deploy/samples/clusterpolicy.yaml)",
        started.elapsed().as_secs_f64()
    );

    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut last_state = String::new();
    let outcome = loop {
        let (rows, policy) = snapshot(&client).await?;
        let elapsed = started.elapsed().as_secs_f64();
        for row in &rows {
            let line = row.line();
            if shown.get(&row.node) != Some(&line) {
                println!("[{elapsed:>5.1}s] {line}");
                shown.insert(row.node.clone(), line);
            }
        }
        let state = policy
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .map(|s| format!("{:?}", s.state))
            .unwrap_or_default();
        if state != last_state && !state.is_empty() {
            println!(
                "[{elapsed:>5.1}s] ClusterPolicy {name:?} is {}",
                state_word(&state)
            );
            last_state = state.clone();
        }
        let operands_running = rows.iter().any(|r| !r.operands.is_empty());
        if state == "Ready" && operands_running && rows.iter().all(Row::converged) {
            break Ok(started.elapsed());
        }
        if started.elapsed() > settings.deadline {
            let lagging: Vec<String> = rows
                .iter()
                .filter(|r| !r.converged())
                .map(|r| r.node.clone())
                .collect();
            break Err(format!(
                "not converged after {:?}: ClusterPolicy is {}, nodes not ready: {}",
                settings.deadline,
                state_word(&state),
                if lagging.is_empty() {
                    "none".to_owned()
                } else {
                    lagging.join(", ")
                }
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let (rows, policy) = snapshot(&client).await?;
    println!("\nSummary");
    for row in &rows {
        println!("  {}", row.line());
    }
    if let Some(status) = policy.and_then(|p| p.status) {
        for operand in status
            .operands
            .iter()
            .flatten()
            .filter(|o| o.expected > 0 || o.excluded_nodes.is_some())
        {
            let excluded = operand
                .excluded_nodes
                .as_ref()
                .map(|n| format!(", excluded (taint or selector): {}", n.join(", ")))
                .unwrap_or_default();
            println!(
                "  {:<24} ready on {} of {} nodes{excluded}",
                operand.name, operand.ready, operand.expected
            );
        }
        if let Some(ready) = status.conditions.iter().flatten().find(|c| c.type_ == "Ready") {
            println!("  Ready={} ({}): {}", ready.status, ready.reason, ready.message);
        }
    }
    let requests = server.requests();
    let operator_client = crate::product_token(gpuop_operator::USER_AGENT);
    println!(
        "  API requests by the operator: {} ({} writes)",
        requests.by_client(operator_client),
        requests.writes_by(operator_client)
    );
    operator.stop().await;
    simulation.stop().await;
    match outcome {
        Ok(elapsed) => {
            println!("\nConverged in {:.1}s.", elapsed.as_secs_f64());
            Ok(())
        }
        Err(reason) => bail!(reason),
    }
}

fn state_word(state: &str) -> &str {
    match state {
        "Ready" => "ready",
        "NotReady" => "not ready",
        "Ignored" => "ignored",
        "" => "not reported yet",
        other => other,
    }
}
