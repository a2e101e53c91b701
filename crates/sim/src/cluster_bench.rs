//! Benchmarks of the simulated cluster and of the operator on it.
//!
//! - `gpu-sim bench nodes --nodes N`: create N GPU nodes and fan out three DaemonSets to all of them with
//!   zero latency; report both times and the peak memory of the process (server, simulator and all).
//! - `gpu-sim bench converge --nodes N`: run the `gpu-operator` binary as its own process against the fake
//!   API server, apply the default ClusterPolicy, and measure the time until every operand is ready on
//!   every node, the operator's API requests by verb, its writes during a steady window that follows
//!   (the target is zero) and its peak memory. A watch on the ClusterPolicy sees every status the operator
//!   writes: the benchmark reports how often it wrote, and whether any `ready` came before every operand
//!   ran on every node (the target is none).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use gpuop_api::status::{PolicyStatus, State};
use gpuop_api::{ClusterPolicy, labels};
use gpuop_fakeserver::FakeServer;
use gpuop_fakeserver::accounting::{RequestCounts, RequestKey};
use gpuop_operator::status::only_counts_differ;
use gpuop_testkit::fixture;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::actors::Convergence;
use crate::churn::Churn;
use crate::cli::{ConvergeBenchArgs, NodesBenchArgs};
use crate::cluster_spec::{ClusterSpec, GpuSpec, NodePool};
use crate::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install, snapshot};
use crate::hardware::GpuModel;
use crate::kubelet::Timing;
use crate::proc_stats;
use crate::simulation::Simulation;

/// A cluster of `count` GPU nodes (H100, 8 GPUs each) and nothing else.
pub fn gpu_cluster(count: u32) -> ClusterSpec {
    let mut pool: NodePool = ClusterSpec::demo().node_pools.remove(1);
    pool.name = "gpu".into();
    pool.count = count;
    pool.gpu = Some(GpuSpec {
        model: GpuModel::H100_80GB,
        count: 8,
    });
    ClusterSpec {
        nfd: true,
        node_pools: vec![pool],
        workloads: Vec::new(),
    }
}

pub use crate::proc_stats::peak_rss_mib;

/// A DaemonSet `name` in `bench` with one pod on every GPU node, tolerating the GPU taint.
fn bench_daemonset(name: &str) -> DaemonSet {
    let mut daemonset = fixture::daemonset(name)
        .namespace("bench")
        .selecting(&[("app", name)])
        .node_selector(&[(labels::NFD_NVIDIA_PCI[0], "true")])
        .container("main", "registry.local/bench:1")
        .build();
    let template = daemonset.spec.as_mut().and_then(|s| s.template.spec.as_mut());
    template.expect("the builder set a pod spec").tolerations = Some(vec![Toleration {
        key: Some(labels::GPU_TAINT.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }]);
    daemonset
}

/// `gpu-sim bench nodes`.
pub async fn nodes(args: NodesBenchArgs) -> anyhow::Result<()> {
    let server = FakeServer::new();
    let client = server.client_as(crate::USER_AGENT);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("bench".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces.create(&PostParams::default(), &namespace).await?;
    let started = Instant::now();
    let simulation = Simulation::start(client.clone(), gpu_cluster(args.nodes), Timing::instant()).await?;
    let nodes_created = started.elapsed();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "bench");
    let fan_out_started = Instant::now();
    for name in ["bench-a", "bench-b", "bench-c"] {
        daemonsets
            .create(&PostParams::default(), &bench_daemonset(name))
            .await?;
    }
    let expected = i32::try_from(args.nodes).unwrap_or(i32::MAX);
    loop {
        let list = daemonsets.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|ds| ds.status.as_ref().is_some_and(|s| s.number_ready == expected))
            .count();
        if ready == 3 {
            break;
        }
        if fan_out_started.elapsed() > args.deadline() {
            bail!(
                "the DaemonSets did not become ready on {} nodes within {:?}",
                args.nodes,
                args.deadline()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fan_out = fan_out_started.elapsed();
    let peak = peak_rss_mib("self").unwrap_or(f64::NAN);
    let requests = server.requests();
    simulation.stop().await;
    println!("| measurement ({} nodes, zero latency) | result |", args.nodes);
    println!("| --- | --- |");
    println!(
        "| create the nodes (simulator: create + status report each) | {:.2} s |",
        nodes_created.as_secs_f64()
    );
    println!(
        "| fan out 3 DaemonSets to every node, every pod Ready | {:.2} s |",
        fan_out.as_secs_f64()
    );
    println!("| pods created and made Ready | {} |", 3 * args.nodes);
    println!("| API requests in total | {} |", requests.total());
    println!(
        "| writes by resource (all clients) | {} |",
        verbs_text(&writes_by_resource(&requests))
    );
    println!("| peak memory of the process (server, simulator) | {peak:.0} MiB |");
    Ok(())
}

/// Writes by verb and resource (`patch pods/status`), whoever made them.
pub fn writes_by_resource(counts: &RequestCounts) -> BTreeMap<String, u64> {
    writes_of(counts, None)
}

/// Writes by verb and resource of one client (its product token), or of all (`None`).
fn writes_of(counts: &RequestCounts, client: Option<&str>) -> BTreeMap<String, u64> {
    let mut writes = BTreeMap::new();
    for (key, count) in counts
        .iter()
        .filter(|(key, _)| key.verb.is_write() && client.is_none_or(|client| made_by(key, client)))
    {
        let resource = if key.subresource.is_empty() {
            key.resource.clone()
        } else {
            format!("{}/{}", key.resource, key.subresource)
        };
        *writes
            .entry(format!("{:?} {resource}", key.verb).to_lowercase())
            .or_insert(0) += count;
    }
    writes
}

/// Requests of one client, by verb.
pub fn by_verb(counts: &RequestCounts, client: &str) -> BTreeMap<String, u64> {
    let mut verbs = BTreeMap::new();
    for (key, count) in counts.iter() {
        if made_by(key, client) {
            *verbs.entry(key.verb.metric_label().to_owned()).or_insert(0) += count;
        }
    }
    verbs
}

/// Whether `key`'s request came from `client` (its User-Agent's product token).
fn made_by(key: &RequestKey, client: &str) -> bool {
    key.client.split('/').next() == Some(client)
}

pub(crate) fn verbs_text(verbs: &BTreeMap<String, u64>) -> String {
    let mut text = String::new();
    for (verb, count) in verbs {
        let _ = write!(text, "{verb} {count}, ");
    }
    text.trim_end_matches(", ").to_owned()
}

/// The `gpu-operator` binary as its own process on the fake server of `kubeconfig`, killed when dropped.
pub(crate) fn spawn_operator(
    binary: &std::path::Path,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    tokio::process::Command::new(binary)
        .args([
            "run",
            "--namespace",
            NAMESPACE,
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--health-probe-bind-address",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}

/// The `gpu-operator` binary next to this one.
pub(crate) fn operator_binary() -> anyhow::Result<PathBuf> {
    let here = std::env::current_exe().context("locating gpu-sim")?;
    let binary = here.with_file_name("gpu-operator");
    if !binary.exists() {
        bail!(
            "{} does not exist; build it first (cargo build --release --bins)",
            binary.display()
        );
    }
    Ok(binary)
}

/// What the fake-server benchmarks measure: the fake server on a free port, a cluster simulated on it, and
/// the `gpu-operator` binary as its own process on it, reading a kubeconfig from a temporary folder.
pub(crate) struct FakeServerBench {
    pub(crate) server: FakeServer,
    pub(crate) running: gpuop_fakeserver::Running,
    /// The simulator's client.
    pub(crate) client: Client,
    pub(crate) simulation: Simulation,
    pub(crate) operator: tokio::process::Child,
    /// The operator's process id, as `/proc` names it.
    pub(crate) pid: String,
    /// The folder of the operator's kubeconfig, removed when dropped.
    pub(crate) dir: tempfile::TempDir,
}

impl FakeServerBench {
    /// Serves the fake server, installs the CRDs and namespace, simulates `spec` and starts the operator.
    pub(crate) async fn start(spec: ClusterSpec) -> anyhow::Result<Self> {
        let binary = operator_binary()?;
        let server = FakeServer::new();
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let running = crate::serve::listen(&server, 0, Some(&kubeconfig)).await?;
        let client: Client = server.client_as(crate::USER_AGENT);
        install(&client).await?;
        let simulation = Simulation::start(client.clone(), spec, Timing::instant()).await?;
        let operator = spawn_operator(&binary, &kubeconfig)?;
        let pid = operator.id().map(|p| p.to_string()).unwrap_or_default();
        Ok(Self {
            server,
            running,
            client,
            simulation,
            operator,
            pid,
            dir,
        })
    }
}

/// Every status write of the ClusterPolicy, as a watch sees it.
#[derive(Debug, Default)]
struct StatusLog {
    /// When each write showed up, and whether it changed the state or a condition's status or reason
    /// (rather than only counts and messages).
    writes: Vec<(Instant, bool)>,
    /// `ready` writes seen while some node did not run every operand it should.
    premature_ready: usize,
    /// Whether a `ready` write was seen at all.
    ready_seen: bool,
    /// When the latest write that turned the state to `ready` showed up.
    ready_at: Option<Instant>,
}

impl StatusLog {
    /// The shortest time between two writes, as the watch saw them.
    fn shortest_gap(&self) -> Option<Duration> {
        self.writes
            .windows(2)
            .map(|pair| pair[1].0.duration_since(pair[0].0))
            .min()
    }

    fn summary(&self) -> String {
        let changes = self.writes.iter().filter(|(_, changed)| *changed).count();
        let closest = self
            .writes
            .windows(2)
            .filter(|pair| !pair[1].1)
            .map(|pair| pair[1].0.duration_since(pair[0].0))
            .min();
        let spacing = closest.map_or(String::new(), |gap| {
            format!(
                "; count-only writes at least {:.2} s after the previous write",
                gap.as_secs_f64()
            )
        });
        format!(
            "{} ({changes} changes of state or condition{spacing})",
            self.writes.len()
        )
    }
}

fn lock(log: &Mutex<StatusLog>) -> std::sync::MutexGuard<'_, StatusLog> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records every status write of the ClusterPolicy; a `ready` is checked against the simulation's caches
/// at that moment, and against a fresh list of the cluster when they disagree with it.
async fn watch_statuses(client: Client, mut convergence: Convergence, log: Arc<Mutex<StatusLog>>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let policies: Api<ClusterPolicy> = Api::all(client.clone());
    // The watcher relists after an expired version or a dropped stream; its errors are not the end.
    let mut events = std::pin::pin!(
        watcher(policies, watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    let mut last: Option<PolicyStatus> = None;
    while let Some(event) = events.next().await {
        let Ok(policy) = event else { continue };
        let Some(status) = policy.status else { continue };
        if last.as_ref() == Some(&status) {
            continue;
        }
        let at = Instant::now();
        let changed = last
            .as_ref()
            .is_none_or(|last| !only_counts_differ(last, &status));
        let ready = status.state == State::Ready;
        let turned_ready = ready && last.as_ref().is_none_or(|last| last.state != State::Ready);
        // The caches may not have shown the last pods' readiness yet when the operator's own watch did: a
        // `ready` they disagree with is checked against a fresh list of the cluster before it counts.
        let premature = ready
            && !convergence.look().await
            && !snapshot(&client)
                .await
                .is_ok_and(|(rows, _)| rows.iter().all(|row| !row.operands.is_empty() && row.converged()));
        let mut log = lock(&log);
        log.writes.push((at, changed));
        log.premature_ready += usize::from(premature);
        log.ready_seen |= ready;
        if turned_ready {
            log.ready_at = Some(at);
        }
        drop(log);
        last = Some(status);
    }
}

/// CPU seconds of the operator's process and of this one (fake server, simulation and benchmark) at a
/// moment.
#[derive(Clone, Copy, Debug)]
struct Cpu {
    operator: f64,
    simulator: f64,
}

impl Cpu {
    fn now(pid: &str) -> Self {
        Self {
            operator: proc_stats::cpu_seconds(pid).unwrap_or(f64::NAN),
            simulator: proc_stats::cpu_seconds("self").unwrap_or(f64::NAN),
        }
    }

    fn since(self, earlier: Self) -> Self {
        Self {
            operator: self.operator - earlier.operator,
            simulator: self.simulator - earlier.simulator,
        }
    }
}

/// What the churn window measured.
#[derive(Debug)]
struct ChurnWindow {
    churn: Churn,
    seconds: u64,
    changes: u64,
    cpu: Cpu,
    requests: BTreeMap<String, u64>,
}

/// Requests by verb, or `none`.
fn requests_text(verbs: &BTreeMap<String, u64>) -> String {
    if verbs.is_empty() {
        "none".to_owned()
    } else {
        verbs_text(verbs)
    }
}

/// Seconds with a sign, for a share of time that a late look can make negative.
fn signed_seconds(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(after) => after.as_secs_f64(),
        None => -earlier.duration_since(later).as_secs_f64(),
    }
}

/// How long the converge benchmark waits between two looks: a look works out the nodes that changed since
/// the last one, all of them at once while a DaemonSet fans out over 10,000 nodes, so at scale looking every
/// 100 ms would take the cores the simulation and the operator are measured on. The moment every pod was
/// Ready is known to within this interval (the report gives it as a range).
fn look_interval(nodes: u32) -> Duration {
    Duration::from_millis((u64::from(nodes) / 20).clamp(100, 500))
}

/// `gpu-sim bench converge`.
pub async fn converge(args: ConvergeBenchArgs) -> anyhow::Result<()> {
    let run_started = Instant::now();
    let churn = args
        .churn
        .map(|share| Churn::new(share, args.churn_seed))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let mut bench = FakeServerBench::start(gpu_cluster(args.nodes)).await?;
    let before = bench.server.requests();
    let started = Instant::now();
    let statuses = Arc::new(Mutex::new(StatusLog::default()));
    let status_watch = tokio::spawn(watch_statuses(
        bench.client.clone(),
        bench.simulation.convergence(NAMESPACE),
        statuses.clone(),
    ));
    let cpu_applied = Cpu::now(&bench.pid);
    apply_policy(&bench.client, DEFAULT_POLICY).await?;
    // The moment every operand pod was Ready on every node lies between the last look that found one not
    // Ready and the first look after it that found all Ready: each look reads the simulation's caches
    // (the nodes whose Node or pods changed since the last look), so it is known to within the time
    // between those two.
    let mut convergence = bench.simulation.convergence(NAMESPACE);
    let policies: Api<ClusterPolicy> = Api::all(bench.client.clone());
    let mut pods_unready_seen = started;
    let mut pods_ready_seen: Option<Instant> = None;
    loop {
        // A look reads for as long as it takes: a pod it found not Ready was so at its start at the
        // earliest, and every pod it found Ready was so by its end.
        let look_started = Instant::now();
        let pods_ready = convergence.look().await;
        let policy = policies
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .next();
        let looked = Instant::now();
        if pods_ready {
            pods_ready_seen.get_or_insert(looked);
        } else {
            pods_unready_seen = look_started;
            pods_ready_seen = None;
        }
        let ready = policy
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.state == State::Ready);
        if ready && pods_ready {
            break;
        }
        if started.elapsed() > args.deadline() {
            let _ = bench.operator.kill().await;
            bail!("not converged within {:?}", args.deadline());
        }
        if let Some(status) = bench.operator.try_wait()? {
            bail!("gpu-operator exited early: {status}");
        }
        tokio::time::sleep(look_interval(args.nodes)).await;
    }
    let converged = started.elapsed();
    let cpu_rollout = Cpu::now(&bench.pid).since(cpu_applied);
    let peak_after_rollout = peak_rss_mib(&bench.pid).unwrap_or(f64::NAN);
    let at_convergence = bench.server.requests();
    // The watch delivers the ready write moments after the snapshot above saw it; wait for its verdict.
    let judged = Instant::now();
    while !lock(&statuses).ready_seen && judged.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    status_watch.abort();
    let statuses = std::mem::take(&mut *lock(&statuses));
    // The operator process names itself with its own User-Agent; its product token is what is counted.
    let operator_client = crate::product_token(gpuop_operator::USER_AGENT);
    let rollout = by_verb(&at_convergence.since(&before), operator_client);
    let cpu_steady_start = Cpu::now(&bench.pid);
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let cpu_steady = Cpu::now(&bench.pid).since(cpu_steady_start);
    let after = bench.server.requests();
    let steady = by_verb(&after.since(&at_convergence), operator_client);
    let steady_writes = writes_of(&after.since(&at_convergence), Some(operator_client));
    let churn_window = match churn {
        Some(churn) => {
            let requests_before = bench.server.requests();
            let cpu_before = Cpu::now(&bench.pid);
            let churning = bench.simulation.churn(churn);
            tokio::time::sleep(Duration::from_secs(args.churn_seconds)).await;
            let changes = churning.stop().await;
            let cpu = Cpu::now(&bench.pid).since(cpu_before);
            let requests = by_verb(&bench.server.requests().since(&requests_before), operator_client);
            Some(ChurnWindow {
                churn,
                seconds: args.churn_seconds,
                changes,
                cpu,
                requests,
            })
        }
        None => None,
    };
    if let Some(status) = bench.operator.try_wait()? {
        bail!("gpu-operator exited during the steady or churn window: {status}");
    }
    let peak = peak_rss_mib(&bench.pid).unwrap_or(f64::NAN);
    let cpu_operator_total = proc_stats::cpu_seconds(&bench.pid).unwrap_or(f64::NAN);
    let _ = bench.operator.kill().await;
    let policies: Api<ClusterPolicy> = Api::all(bench.client.clone());
    let operands = policies
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .next()
        .and_then(|p| p.status)
        .and_then(|s| s.operands)
        .unwrap_or_default();
    bench.simulation.stop().await;
    bench.running.shutdown().await;
    let simulator_cpu = proc_stats::cpu_seconds("self").unwrap_or(f64::NAN);
    let simulator_peak = peak_rss_mib("self").unwrap_or(f64::NAN);
    println!(
        "| measurement ({} GPU nodes, zero latency) | result |",
        args.nodes
    );
    println!("| --- | --- |");
    println!(
        "| policy applied → every operand ready on every node | {:.2} s |",
        converged.as_secs_f64()
    );
    match (pods_ready_seen, statuses.ready_at) {
        (Some(pods_ready), Some(ready)) => {
            let (earliest, latest) = (
                signed_seconds(pods_unready_seen, started),
                signed_seconds(pods_ready, started),
            );
            println!(
                "| of which the simulator's share: policy applied → every operand pod Ready on every node (the \
                 simulation's caches, between two looks of the benchmark) | {earliest:.2}–{latest:.2} s |"
            );
            // A `ready` the watch saw before the look that found every pod Ready came after the pods were,
            // and no sooner than the last look that found one not Ready.
            let ready_after = |moment: Instant| signed_seconds(ready, moment).max(0.0);
            println!(
                "| of which the operator's share: every operand pod Ready → the operator's status said `ready` \
                 | {:.2}–{:.2} s |",
                ready_after(pods_ready),
                ready_after(pods_unready_seen)
            );
        }
        _ => println!(
            "| time split | not measured: the status watch saw no `ready`, or no look found every pod Ready |"
        ),
    }
    println!(
        "| operator requests during the rollout, by verb | {} |",
        verbs_text(&rollout)
    );
    // Every write is a watch event for whoever watches its kind: what the operator had to read.
    println!(
        "| writes during the rollout, all clients, by resource | {} |",
        verbs_text(&writes_by_resource(&at_convergence.since(&before)))
    );
    println!(
        "| operator requests in the {} s steady window that follows | {} |",
        args.steady_seconds,
        requests_text(&steady)
    );
    println!(
        "| operator writes in the steady window | {} |",
        requests_text(&steady_writes)
    );
    println!(
        "| ClusterPolicy status writes during the rollout | {} |",
        statuses.summary()
    );
    println!(
        "| shortest gap between two ClusterPolicy status writes during the rollout | {} |",
        statuses
            .shortest_gap()
            .map_or("fewer than two writes".to_owned(), |gap| format!(
                "{:.2} s",
                gap.as_secs_f64()
            ))
    );
    println!(
        "| `ready` written before every operand ran on every node | {} |",
        match (statuses.ready_seen, statuses.premature_ready) {
            (false, _) => "ready never seen by the status watch".to_owned(),
            (true, 0) => "never".to_owned(),
            (true, n) => format!("{n} time(s)"),
        }
    );
    println!(
        "| operator CPU for the rollout (policy applied → every operand ready) | {:.2} s |",
        cpu_rollout.operator
    );
    println!(
        "| operator CPU in the {} s steady window | {:.2} s |",
        args.steady_seconds, cpu_steady.operator
    );
    if let Some(window) = &churn_window {
        #[allow(clippy::cast_precision_loss)]
        let per_second = window.changes as f64 / window.seconds.max(1) as f64;
        println!(
            "| unrelated node churn ({:.1}% of the nodes a second, seed {}) for {} s | {} changes ({per_second:.1} a second) |",
            window.churn.share_per_second() * 100.0,
            args.churn_seed,
            window.seconds,
            window.changes
        );
        #[allow(clippy::cast_precision_loss)]
        let per_minute = window.cpu.operator * 60.0 / window.seconds.max(1) as f64;
        println!(
            "| operator CPU during the churn window | {:.2} s ({per_minute:.2} s per minute) |",
            window.cpu.operator
        );
        println!(
            "| operator requests during the churn window, by verb | {} |",
            requests_text(&window.requests)
        );
    }
    println!("| operator CPU in total (its own process) | {cpu_operator_total:.2} s |");
    println!("| operator peak memory (VmHWM) after the rollout | {peak_after_rollout:.0} MiB |");
    println!("| operator peak memory (its own process) | {peak:.0} MiB |");
    println!(
        "| simulator CPU for the rollout (fake server, simulation and benchmark: one process) | {:.2} s |",
        cpu_rollout.simulator
    );
    if let Some(window) = &churn_window {
        println!(
            "| simulator CPU during the churn window | {:.2} s |",
            window.cpu.simulator
        );
    }
    println!("| simulator CPU in total | {simulator_cpu:.2} s |");
    println!("| simulator peak memory (VmHWM) | {simulator_peak:.0} MiB |");
    println!(
        "| the whole benchmark run | {:.0} s |",
        run_started.elapsed().as_secs_f64()
    );
    println!(
        "| operands ready | {} |",
        operands
            .iter()
            .map(|o| format!("{} {}/{}", o.name, o.ready, o.expected))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
