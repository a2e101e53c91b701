//! `gpu-sim up`: a simulated cluster that runs until stopped. By default the fake API server is served on
//! loopback with a kubeconfig, so `kubectl`, `gpu-operator run` and `kubectl gpu` connect to it as to any
//! cluster; with `--kubeconfig` the simulator plays the nodes against an existing API server instead. A
//! scenario adds a timeline of events.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use gpuop_fakeserver::FakeServer;
use gpuop_operator::run::{self, Config};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::USER_AGENT;
use crate::cli::UpArgs;
use crate::demo::{NAMESPACE, install};
use crate::heartbeat::Heartbeats;
use crate::kubelet::Timing;
use crate::scenario::Scenario;
use crate::serve::listen;
use crate::simulation::{Plays, Simulation};

/// Reads a scenario file, or the demo cluster with no events.
pub fn load_scenario(path: Option<&Path>) -> anyhow::Result<Scenario> {
    match path {
        None => Ok(Scenario {
            cluster: None,
            timeline: Vec::new(),
        }),
        Some(path) => Ok(Scenario::from_file(path)?),
    }
}

/// A client for an existing API server from a kubeconfig file, naming itself [`USER_AGENT`] so that the
/// cluster's audit log tells the simulated kubelets' requests from everyone else's.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("using kubeconfig {}", path.display()))?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    Client::try_from(config).context("building a Kubernetes client")
}

/// Plays a scenario's timeline against a running simulation.
pub async fn play(simulation: Arc<Simulation>, scenario: &Scenario) {
    let started = Instant::now();
    let mut events = scenario.timeline.clone();
    events.sort_by_key(|event| event.at);
    for event in events {
        tokio::time::sleep_until(started + event.at).await;
        match simulation.apply(&event.action).await {
            Ok(()) => info!(at = ?event.at, action = ?event.action, "scenario event"),
            Err(error) => warn!(at = ?event.at, %error, "scenario event failed"),
        }
    }
}

/// Runs `gpu-sim up` until interrupted.
pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let scenario = load_scenario(args.scenario.as_deref())?;
    let mut served = None;
    let mut server_for_operator = None;
    let mut url = None;
    let client = match &args.kubeconfig {
        Some(path) => client_from_kubeconfig(path).await?,
        None => {
            let server = FakeServer::builder()
                .authorization(args.authorization.into())
                .build();
            let running = listen(&server, args.port, args.kubeconfig_out.as_deref()).await?;
            let client = server.client_as(USER_AGENT);
            install(&client).await?;
            url = Some(running.url());
            server_for_operator = Some(server.client_as(gpuop_operator::USER_AGENT));
            served = Some((server, running));
            client
        }
    };
    let mut timing = if args.instant {
        Timing::instant()
    } else {
        Timing::demo()
    };
    // A real cluster's node lifecycle controller marks nodes that give no sign of life NotReady and
    // taints them unreachable after its grace period; the fake server has no such controller.
    if args.heartbeats() {
        timing = timing.with_heartbeats(Heartbeats::kubelet());
    }
    // Against an existing API server its own DaemonSet controller and scheduler are at work already.
    let plays = if args.kubeconfig.is_some() {
        Plays::NodesOnly
    } else {
        Plays::Cluster
    };
    let simulation =
        Arc::new(Simulation::start_playing(client.clone(), scenario.cluster(), timing, plays).await?);
    let operator = match (args.with_operator, server_for_operator) {
        (false, _) => None,
        (true, operator_client) => {
            let operator_client = operator_client.unwrap_or(client.clone());
            Some(run::start(operator_client, Config::in_process(NAMESPACE)).await?)
        }
    };
    // One line on stdout that scripts can wait for: printed once the CRDs, the namespace, the nodes
    // and the operator are there, so that the next command finds them.
    if let Some(url) = url {
        println!("{url}");
    }
    let timeline = {
        let simulation = simulation.clone();
        tokio::spawn(async move { play(simulation, &scenario).await })
    };
    info!(
        nodes = simulation.state().hosts().len(),
        "simulated cluster is up; stop with Ctrl-C"
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    timeline.abort();
    if let Some(operator) = operator {
        operator.stop().await;
    }
    if let Ok(simulation) = Arc::try_unwrap(simulation) {
        simulation.stop().await;
    }
    if let Some((_server, running)) = served {
        running.shutdown().await;
    }
    Ok(())
}
