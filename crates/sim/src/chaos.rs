//! `gpu-sim chaos --seed S --duration D`: two replicas of the operator, each the `gpu-operator` binary as
//! its own process with leader election, run a simulated GPU cluster while faults are injected on a
//! schedule drawn from the seed ([`schedule`]); the invariants ([`invariants`]) are checked throughout, and
//! once the faults stop the cluster must converge and then stay quiet. The run prints the seed and every
//! injection and observation as it happens; on the first violation it prints the invariant, the events that
//! led to it and the command that replays the seed, and fails.
//!
//! Each replica talks to the fake API server through a listener of its own, named after the replica
//! ([`FakeServer::serve_as`]): the server's journal tells the replicas' requests apart although they send
//! the same `User-Agent`, and orders each write against the Lease takeovers. Faults on the API hit only
//! the operator's requests (`client=gpu-operator-rs`), so that the simulated kubelets and the injections
//! themselves never fail: what fails to converge is the operator's doing.

pub mod invariants;
pub mod schedule;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use gpuop_api::ClusterPolicy;
use gpuop_api::labels::{COMPONENT, MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_fakeserver::faults::{Effect, FaultRule};
use gpuop_fakeserver::{FakeServer, Faults, InjectedError, JournalEntry, Running};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::{Discovery, Scope, verbs};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use self::invariants::{
    EndState, Invariant, Lasting, Leadership, Managed, PersonLabels, Request, RequestRate, Violation,
    duplicates, hot_loop, orphans, unconverged,
};
use self::schedule::{ApiError, EDITED_IMAGE, Injection, KillTarget, PERSON_TAINT, PolicyEdit, Step, plan};
use crate::cli::ChaosArgs;
use crate::cluster_bench::gpu_cluster;
use crate::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install, snapshot};
use crate::kubelet::Timing;
use crate::scenario::{Action, DriverInstallFault};
use crate::simulation::Simulation;

/// The field manager of the simulated person's edits.
pub const PERSON: &str = "chaos-person";

/// The node pool of the chaos cluster.
const POOL: &str = "gpu";

/// How long a duplicate or an orphan may last: a prune follows the apply that replaced an object, the
/// garbage collector follows its owner's deletion, both within seconds when the API answers.
const LASTING_GRACE: Duration = Duration::from_secs(30);

/// Requests answered less than this long ago are held back, so that all of them are judged in the order
/// they were answered although the journal is read while others are still being recorded.
const HOLD_BACK: Duration = Duration::from_millis(500);

/// How often the invariants are checked.
const TICK: Duration = Duration::from_millis(250);

/// How long the cluster must stay converged, after it first is, before the end is judged.
const QUIET: Duration = Duration::from_secs(12);

/// The journal's capacity: far more than a tick's requests.
const JOURNAL: usize = 200_000;

/// How many events before a violation are printed with it.
const EVENTS_SHOWN: usize = 30;

/// The `gpu-operator` binary: `--operator`, or the one next to this `gpu-sim`.
pub fn operator_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let binary = match given {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .context("locating gpu-sim")?
            .with_file_name("gpu-operator"),
    };
    if !binary.is_file() {
        bail!(
            "the operator binary {} does not exist: build it (cargo build --bins, or --release) so that it lies \
             next to gpu-sim, or name it with --operator PATH",
            binary.display()
        );
    }
    Ok(binary)
}

/// One running operator process.
struct Replica {
    /// Its Lease identity and listener name, `replica-a-1`: slot and incarnation.
    name: String,
    child: tokio::process::Child,
    listener: Running,
}

/// Why a run stopped early.
enum Stop {
    /// An invariant was violated.
    Violation(Violation),
    /// The harness itself failed (not the operator's doing).
    Harness(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(error: anyhow::Error) -> Self {
        Self::Harness(error)
    }
}

impl From<Violation> for Stop {
    fn from(violation: Violation) -> Self {
        Self::Violation(violation)
    }
}

/// A running chaos run.
struct Run {
    seed: u64,
    origin: Instant,
    server: FakeServer,
    client: Client,
    simulation: Simulation,
    binary: PathBuf,
    kubeconfigs: tempfile::TempDir,
    log_dir: Option<PathBuf>,
    replicas: [Option<Replica>; 2],
    incarnations: [u32; 2],
    restarts: Vec<(Duration, usize)>,
    faults: Vec<(Duration, FaultRule)>,
    last_change: Duration,
    events: Vec<(Duration, String)>,
    held: Vec<Request>,
    leadership: Leadership,
    leader_changes: u32,
    rate: RequestRate,
    person_labels: PersonLabels,
    lasting: Lasting,
    listable: Vec<(ApiResource, Scope)>,
    operator_requests: u64,
    /// Operator requests answered 500 or 429 (injected).
    refused: u64,
}

/// `gpu-sim chaos`.
pub async fn chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let binary = operator_binary(args.operator.as_deref())?;
    if let Some(dir) = &args.log_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating --log-dir {}", dir.display()))?;
    }
    let replay = format!(
        "gpu-sim chaos --seed {} --duration {}s --nodes {}",
        args.seed,
        args.duration.as_secs(),
        args.nodes
    );
    println!(
        "gpu-sim chaos: seed {}, {:.0}s of faults on {} GPU nodes, operator {}",
        args.seed,
        args.duration.as_secs_f64(),
        args.nodes,
        binary.display()
    );
    let spec = gpu_cluster(args.nodes);
    let names: Vec<String> = spec.nodes().map(|(name, _)| name).collect();
    let steps = plan(args.seed, args.duration, POOL, &names);
    println!("schedule: {} injections", steps.len());
    let origin = Instant::now();
    let server = FakeServer::builder().seed(args.seed).journal(JOURNAL).build();
    let client = server.client_as(crate::USER_AGENT);
    install(&client).await?;
    let simulation = Simulation::start(client.clone(), spec, Timing::instant()).await?;
    let listable = listable_resources(&client).await?;
    apply_policy(&client, DEFAULT_POLICY).await?;
    let mut run = Run {
        seed: args.seed,
        origin,
        server,
        client,
        simulation,
        binary,
        kubeconfigs: tempfile::tempdir().context("creating a folder for the replicas' kubeconfigs")?,
        log_dir: args.log_dir.clone(),
        replicas: [None, None],
        incarnations: [0, 0],
        restarts: Vec::new(),
        faults: Vec::new(),
        last_change: Duration::ZERO,
        events: Vec::new(),
        held: Vec::new(),
        leadership: Leadership::default(),
        leader_changes: 0,
        rate: RequestRate::default(),
        person_labels: PersonLabels::default(),
        lasting: Lasting::default(),
        listable,
        operator_requests: 0,
        refused: 0,
    };
    // Stopped from outside (Ctrl-C, SIGTERM), the run still kills the replicas it started.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        outcome = run.play(&steps, args.duration, args.settle) => outcome,
        _ = tokio::signal::ctrl_c() => Err(Stop::Harness(anyhow::anyhow!("interrupted"))),
        _ = terminate.recv() => Err(Stop::Harness(anyhow::anyhow!("terminated"))),
    };
    run.stop_replicas().await;
    let Run {
        simulation, events, ..
    } = run;
    simulation.stop().await;
    match outcome {
        Ok(summary) => {
            println!("chaos: passed, seed {}: {summary}", args.seed);
            println!("replay: {replay}");
            Ok(())
        }
        Err(Stop::Violation(violation)) => {
            println!("chaos: FAILED, seed {}: {violation}", args.seed);
            println!("events leading to it:");
            let shown = events.len().saturating_sub(EVENTS_SHOWN);
            for (at, text) in &events[shown..] {
                println!("  [{:>6.1}s] {text}", at.as_secs_f64());
            }
            println!("replay: {replay}");
            bail!(
                "seed {}: invariant \"{}\" violated",
                args.seed,
                violation.invariant
            )
        }
        Err(Stop::Harness(error)) => {
            println!("replay: {replay}");
            Err(error.context(format!("seed {}: the chaos run itself failed", args.seed)))
        }
    }
}

/// Every resource that can be listed, but pods, events and leases (never the operator's own objects,
/// and the most numerous).
async fn listable_resources(client: &Client) -> anyhow::Result<Vec<(ApiResource, Scope)>> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the API server's resources")?;
    let mut found = Vec::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if !capabilities.supports_operation(verbs::LIST)
                || ["pods", "events", "leases"].contains(&resource.plural.as_str())
            {
                continue;
            }
            found.push((resource, capabilities.scope));
        }
    }
    Ok(found)
}

impl Run {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn event(&mut self, text: String) {
        let at = self.now();
        println!("[{:>6.1}s] {text}", at.as_secs_f64());
        self.events.push((at, text));
    }

    /// The whole run: the schedule, then settling, then a quiet window. Returns the summary line.
    async fn play(&mut self, steps: &[Step], duration: Duration, settle: Duration) -> Result<String, Stop> {
        // The schedule's offsets count from here, whatever setting the cluster up took.
        self.origin = Instant::now();
        self.start_replica(0).await?;
        self.start_replica(1).await?;
        let injections = steps.len();
        let mut steps = steps.iter().peekable();
        let mut ticks = 0u64;
        while self.now() < duration {
            while let Some(step) = steps.next_if(|step| step.at <= self.now()) {
                self.inject(&step.injection).await?;
            }
            self.due().await?;
            self.tick(ticks).await?;
            ticks += 1;
            tokio::time::sleep(TICK).await;
        }
        self.faults.clear();
        self.apply_faults();
        for slot in 0..2 {
            if self.replicas[slot].is_none() {
                self.start_replica(slot).await?;
            }
        }
        self.restarts.clear();
        self.last_change = self.now();
        let faults_stopped = self.now();
        self.event("faults stop: the API answers again, both replicas run; the cluster must converge".into());
        let mut converged_since: Option<Duration> = None;
        let mut last_problems = Vec::new();
        loop {
            self.tick(ticks).await?;
            ticks += 1;
            if ticks.is_multiple_of(4) {
                last_problems = self.end_problems().await?;
                match (last_problems.is_empty(), converged_since) {
                    (true, None) => {
                        converged_since = Some(self.now());
                        self.event(format!(
                            "converged {:.1}s after the faults stopped",
                            (self.now() - faults_stopped).as_secs_f64()
                        ));
                    }
                    (false, Some(_)) => {
                        self.event(format!("converged no longer: {}", last_problems.join("; ")));
                        converged_since = None;
                    }
                    _ => {}
                }
            }
            let now = self.now();
            // Quiet long enough to judge the writes of a whole calm window after the last change.
            let calm_judged = self.last_change + invariants::CALM_AFTER + invariants::CALM_WINDOW + HOLD_BACK;
            if converged_since.is_some_and(|since| now >= since + QUIET && now >= calm_judged) {
                break;
            }
            if converged_since.is_none() && now > faults_stopped + settle {
                return Err(Violation {
                    invariant: Invariant::Converged,
                    at: now,
                    detail: format!(
                        "not converged {:.0}s after the faults stopped: {}",
                        settle.as_secs_f64(),
                        last_problems.join("; ")
                    ),
                }
                .into());
            }
            tokio::time::sleep(TICK).await;
        }
        let lingering: Vec<String> = self.lasting.current().cloned().collect();
        if let Some(problem) = lingering.first() {
            return Err(Violation {
                invariant: if problem.contains("is owned by") {
                    Invariant::NoOrphan
                } else {
                    Invariant::NoDuplicate
                },
                at: self.now(),
                detail: format!("{problem}, still at the end"),
            }
            .into());
        }
        Ok(format!(
            "{} injections, {} Lease acquisitions, {} operator requests ({} answered 500 or 429); converged {:.1}s after the faults stopped and stayed so",
            injections,
            self.leader_changes,
            self.operator_requests,
            self.refused,
            converged_since.map_or(0.0, |since| (since - faults_stopped).as_secs_f64())
        ))
    }

    /// Restarts and fault ends that are due.
    async fn due(&mut self) -> Result<(), Stop> {
        let now = self.now();
        let before = self.faults.len();
        self.faults.retain(|(until, _)| *until > now);
        if self.faults.len() != before {
            self.apply_faults();
            self.last_change = now;
            self.event(format!("{} API fault(s) ended", before - self.faults.len()));
        }
        let due: Vec<usize> = self
            .restarts
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, slot)| *slot)
            .collect();
        self.restarts.retain(|(at, _)| *at > now);
        for slot in due {
            if self.replicas[slot].is_none() {
                self.start_replica(slot).await?;
            }
        }
        Ok(())
    }

    fn apply_faults(&self) {
        let mut faults = Faults::new(self.seed);
        for (_, rule) in &self.faults {
            faults = faults.rule(rule.clone());
        }
        self.server.set_faults(faults);
    }

    async fn start_replica(&mut self, slot: usize) -> Result<(), Stop> {
        self.incarnations[slot] += 1;
        let name = format!("replica-{}-{}", ["a", "b"][slot], self.incarnations[slot]);
        let listener = self
            .server
            .serve_as(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), &name)
            .await
            .context("listening for a replica")?;
        let kubeconfig = self.kubeconfigs.path().join(format!("{name}.kubeconfig"));
        listener
            .write_kubeconfig(&kubeconfig)
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        let stderr = match &self.log_dir {
            Some(dir) => {
                let path = dir.join(format!("{name}.log"));
                std::process::Stdio::from(
                    std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
                )
            }
            None => std::process::Stdio::null(),
        };
        let child = tokio::process::Command::new(&self.binary)
            .args([
                "run",
                "--namespace",
                NAMESPACE,
                "--leader-elect",
                "--metrics-bind-address",
                "127.0.0.1:0",
                "--health-probe-bind-address",
                "127.0.0.1:0",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", &name)
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_OPERATOR_LOG")
                    .unwrap_or_else(|_| if self.log_dir.is_some() { "info" } else { "warn" }.to_owned()),
            )
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.event(format!("{name} started (pid {})", child.id().unwrap_or_default()));
        self.replicas[slot] = Some(Replica {
            name,
            child,
            listener,
        });
        self.last_change = self.now();
        Ok(())
    }

    async fn kill_replica(&mut self, slot: usize) -> Option<String> {
        let mut replica = self.replicas[slot].take()?;
        let _ = replica.child.start_kill();
        let _ = replica.child.wait().await;
        replica.listener.shutdown().await;
        Some(replica.name)
    }

    async fn stop_replicas(&mut self) {
        for slot in 0..2 {
            self.kill_replica(slot).await;
        }
    }

    /// One round of checks.
    async fn tick(&mut self, tick: u64) -> Result<(), Stop> {
        for replica in self.replicas.iter_mut().flatten() {
            if let Ok(Some(status)) = replica.child.try_wait() {
                return Err(Violation {
                    invariant: Invariant::OperatorStaysUp,
                    at: self.origin.elapsed(),
                    detail: format!("{} exited by itself: {status}", replica.name),
                }
                .into());
            }
        }
        self.read_journal()?;
        let horizon = self.now().saturating_sub(HOLD_BACK);
        if let Some(violation) = hot_loop(&self.rate, self.last_change, horizon) {
            return Err(violation.into());
        }
        self.rate
            .forget_before(horizon.saturating_sub(invariants::CALM_WINDOW + Duration::from_secs(1)));
        if tick.is_multiple_of(4) {
            self.check_objects().await?;
        }
        Ok(())
    }

    fn read_journal(&mut self) -> Result<(), Stop> {
        let (entries, dropped) = self.server.take_journal();
        if dropped > 0 {
            return Err(Stop::Harness(anyhow::anyhow!(
                "the API server's journal let {dropped} requests go before they were read"
            )));
        }
        let origin = self.origin;
        let since = |at: Instant| at.saturating_duration_since(origin);
        self.held.extend(
            entries
                .into_iter()
                .filter(|entry| !entry.listener.is_empty())
                .map(
                    |JournalEntry {
                         started,
                         finished,
                         key,
                         namespace,
                         name,
                         listener,
                     }| Request {
                        started: since(started),
                        finished: since(finished),
                        replica: listener,
                        verb: key.verb,
                        resource: key.resource,
                        subresource: key.subresource,
                        namespace,
                        name,
                        code: key.code,
                    },
                ),
        );
        self.held.sort_by_key(|request| request.finished);
        let horizon = self.now().saturating_sub(HOLD_BACK);
        let ready = self.held.partition_point(|request| request.finished <= horizon);
        let judged: Vec<Request> = self.held.drain(..ready).collect();
        for request in judged {
            self.operator_requests += 1;
            self.refused += u64::from(matches!(request.code, 429 | 500));
            self.rate.observe(&request);
            let (holder, violation) = self.leadership.observe(&request);
            if let Some(holder) = holder {
                self.leader_changes += 1;
                self.event(format!("{holder} holds the Lease"));
            }
            if let Some(violation) = violation {
                return Err(violation.into());
            }
        }
        Ok(())
    }

    /// Person-set labels, duplicates and orphans, from the server's objects.
    async fn check_objects(&mut self) -> Result<(), Stop> {
        let now = self.now();
        let nodes: Vec<Node> = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .context("listing nodes")?
            .items;
        if let Some(detail) = self.person_labels.overwritten(&nodes, PERSON) {
            return Err(Violation {
                invariant: Invariant::PersonLabelsKept,
                at: now,
                detail,
            }
            .into());
        }
        let managed = ListParams::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}"));
        let daemonsets = Api::<DaemonSet>::all(self.client.clone())
            .list(&managed)
            .await
            .context("listing DaemonSets")?
            .items;
        let mut problems = duplicates(&daemonsets, &nodes);
        let mut objects = Vec::new();
        for (resource, scope) in &self.listable {
            let api: Api<DynamicObject> = match scope {
                Scope::Cluster | Scope::Namespaced => Api::all_with(self.client.clone(), resource),
            };
            let list = api
                .list(&managed)
                .await
                .with_context(|| format!("listing {}", resource.plural))?;
            for item in list.items {
                let value = serde_json::to_value(&item).context("encoding a listed object")?;
                objects.extend(Managed::from_value(&resource.kind, &value));
            }
        }
        let mut live = BTreeSet::new();
        for policy in Api::<ClusterPolicy>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .context("listing ClusterPolicies")?
        {
            live.extend(policy.uid());
        }
        let drivers: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &ApiResource::erase::<gpuop_api::NVIDIADriver>(&()),
        );
        for driver in drivers
            .list(&ListParams::default())
            .await
            .context("listing NVIDIADrivers")?
        {
            live.extend(driver.uid());
        }
        let judged: BTreeSet<String> = ["ClusterPolicy".to_owned(), "NVIDIADriver".to_owned()].into();
        problems.extend(orphans(&objects, &live, &judged));
        if let Some((problem, since)) = self.lasting.observe(now, problems, LASTING_GRACE) {
            return Err(Violation {
                invariant: if problem.contains("is owned by") {
                    Invariant::NoOrphan
                } else {
                    Invariant::NoDuplicate
                },
                at: now,
                detail: format!("{problem} (since {:.1}s)", since.as_secs_f64()),
            }
            .into());
        }
        Ok(())
    }

    /// Why the end state is not converged; empty when it is.
    async fn end_problems(&self) -> Result<Vec<String>, Stop> {
        let (rows, policy) = snapshot(&self.client).await.context("reading the cluster")?;
        let daemonsets = Api::<DaemonSet>::namespaced(self.client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}")))
            .await
            .context("listing DaemonSets")?
            .items;
        let daemonsets: Vec<(String, String, Vec<String>)> = daemonsets
            .iter()
            .map(|ds| {
                let images = ds
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .map(|spec| spec.containers.iter().filter_map(|c| c.image.clone()).collect())
                    .unwrap_or_default();
                let component = ds.labels().get(COMPONENT).cloned().unwrap_or_default();
                (component, ds.name_any(), images)
            })
            .collect();
        let end = EndState {
            rows: &rows,
            status: policy.as_ref().and_then(|p| p.status.as_ref()),
            generation: policy.as_ref().and_then(|p| p.metadata.generation),
            spec: policy.as_ref().map(|p| &p.spec),
            daemonsets: &daemonsets,
            edited_image: EDITED_IMAGE,
        };
        Ok(unconverged(&end))
    }

    async fn inject(&mut self, injection: &Injection) -> Result<(), Stop> {
        self.event(format!("inject: {injection}"));
        let now = self.now();
        self.last_change = now;
        match injection {
            Injection::ApiErrors {
                verb,
                resource,
                rate,
                error,
                lasts,
            } => {
                let error = match error {
                    ApiError::Internal => InjectedError::Internal,
                    ApiError::TooManyRequests => InjectedError::TooManyRequests {
                        retry_after_seconds: 1,
                    },
                };
                let resource = resource.map(str::to_owned);
                self.add_fault(*lasts, *verb, resource, None, *rate, Effect::Error(error));
            }
            Injection::ApiLatency { verb, latency, lasts } => {
                self.add_fault(*lasts, *verb, None, None, 1.0, Effect::Latency(*latency))
            }
            Injection::LeaseStalls { lasts } => match self.leadership.holder().map(str::to_owned) {
                Some(holder) if self.replicas.iter().flatten().any(|r| r.name == holder) => {
                    let leases = Some("leases".to_owned());
                    let effect = Effect::Latency(*lasts);
                    self.add_fault(*lasts, None, leases, Some(holder.clone()), 1.0, effect);
                    self.event(format!("{holder}'s Lease requests hang"));
                }
                _ => self.event("no leading replica running: nothing stalled".into()),
            },
            Injection::DropWatches => self.server.drop_watches(),
            Injection::Compact => {
                self.server.compact();
                self.server.drop_watches();
            }
            Injection::KillReplica {
                target,
                restart_after,
            } => {
                let holder = self.leadership.holder().map(str::to_owned);
                let leads = |replica: &Option<Replica>| {
                    replica
                        .as_ref()
                        .is_some_and(|r| Some(r.name.as_str()) == holder.as_deref())
                };
                let slot = match target {
                    KillTarget::Leader => (0..2).find(|s| leads(&self.replicas[*s])),
                    KillTarget::Follower => {
                        (0..2).find(|s| self.replicas[*s].is_some() && !leads(&self.replicas[*s]))
                    }
                };
                match slot {
                    Some(slot) => {
                        if let Some(name) = self.kill_replica(slot).await {
                            self.event(format!("{name} killed (SIGKILL)"));
                            self.restarts.push((now + *restart_after, slot));
                        }
                    }
                    None => self.event("no such replica running: nothing killed".into()),
                }
            }
            Injection::NodeJoins { node } => {
                self.act(Action::NodeJoins {
                    pool: POOL.into(),
                    count: 1,
                })
                .await?;
                if !self.simulation.state().hosts().contains_key(node) {
                    return Err(Stop::Harness(anyhow::anyhow!(
                        "the schedule expected node {node} to join, the simulator named it otherwise"
                    )));
                }
            }
            Injection::NodeLeaves { node } => {
                self.act(Action::NodeLeaves(node.clone())).await?;
                self.person_labels.forget_node(node);
                self.simulation
                    .state()
                    .faults()
                    .driver_install_fails
                    .retain(|(at, _)| at != node);
            }
            Injection::DriverFails { node } => {
                self.act(Action::DriverInstallFails(DriverInstallFault {
                    node: node.clone(),
                    version: None,
                }))
                .await?;
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
                let on_node = ListParams::default()
                    .fields(&format!("spec.nodeName={node}"))
                    .labels(&format!("{COMPONENT}=nvidia-driver"));
                for pod in pods.list(&on_node).await.context("listing driver pods")? {
                    pods.delete(&pod.name_any(), &DeleteParams::default())
                        .await
                        .context("deleting a driver pod")?;
                }
            }
            Injection::Xid { node, gpu } => {
                self.act(Action::Xid {
                    node: node.clone(),
                    gpu: *gpu,
                    code: 79,
                })
                .await?
            }
            Injection::PersonLabels { node, key, value } => {
                let patch = json!({ "metadata": { "labels": { key: value } } });
                Api::<Node>::all(self.client.clone())
                    .patch(node, &person(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("labelling node {node}"))?;
                self.person_labels.record(node, key, value);
            }
            Injection::PersonTaints { node } | Injection::PersonUntaints { node } => {
                let nodes: Api<Node> = Api::all(self.client.clone());
                let current = nodes
                    .get(node)
                    .await
                    .with_context(|| format!("reading node {node}"))?;
                let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
                taints.retain(|t| t.key != PERSON_TAINT);
                if matches!(injection, Injection::PersonTaints { .. }) {
                    taints.push(Taint {
                        key: PERSON_TAINT.into(),
                        value: Some("chaos".into()),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    });
                }
                nodes
                    .patch(
                        node,
                        &person(),
                        &Patch::Merge(&json!({ "spec": { "taints": taints } })),
                    )
                    .await
                    .with_context(|| format!("tainting node {node}"))?;
            }
            Injection::PersonEditsDaemonSet { component }
            | Injection::PersonDeletesDaemonSet { component } => {
                let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), NAMESPACE);
                let selector = format!("{MANAGED_BY}={MANAGED_BY_VALUE},{COMPONENT}={component}");
                let found = daemonsets
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .context("listing DaemonSets")?;
                let Some(ds) = found.items.first() else {
                    self.event(format!("no DaemonSet of {component} to touch"));
                    return Ok(());
                };
                let name = ds.name_any();
                if matches!(injection, Injection::PersonDeletesDaemonSet { .. }) {
                    daemonsets
                        .delete(&name, &DeleteParams::default())
                        .await
                        .with_context(|| format!("deleting DaemonSet {name}"))?;
                } else {
                    let container = ds
                        .spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .and_then(|spec| spec.containers.first())
                        .map(|c| c.name.clone())
                        .unwrap_or_default();
                    let patch = json!({"spec": {"template": {"spec": {"containers": [
                        {"name": container, "image": EDITED_IMAGE}
                    ]}}}});
                    daemonsets
                        .patch(&name, &person(), &Patch::Strategic(&patch))
                        .await
                        .with_context(|| format!("editing DaemonSet {name}"))?;
                }
            }
            Injection::PolicyEdit(edit) => {
                let patch = match edit {
                    PolicyEdit::Switch { field, enabled } => {
                        json!({ "spec": { *field: { "enabled": enabled } } })
                    }
                    PolicyEdit::DevicePluginEnv(value) => json!({ "spec": { "devicePlugin": {
                        "env": [{ "name": "CHAOS_EDIT", "value": value.to_string() }]
                    } } }),
                };
                Api::<ClusterPolicy>::all(self.client.clone())
                    .patch("cluster-policy", &person(), &Patch::Merge(&patch))
                    .await
                    .context("editing ClusterPolicy cluster-policy")?;
            }
        }
        Ok(())
    }

    fn add_fault(
        &mut self,
        lasts: Duration,
        verb: Option<gpuop_fakeserver::Verb>,
        resource: Option<String>,
        listener: Option<String>,
        rate: f64,
        effect: Effect,
    ) {
        let rule = FaultRule {
            verb,
            resource,
            client: Some(crate::product_token(gpuop_operator::USER_AGENT).to_owned()),
            listener,
            rate,
            effect,
        };
        self.faults.push((self.now() + lasts, rule));
        self.apply_faults();
    }

    async fn act(&self, action: Action) -> anyhow::Result<()> {
        self.simulation
            .apply(&action)
            .await
            .with_context(|| format!("carrying out {action:?}"))
    }
}

fn person() -> PatchParams {
    PatchParams {
        field_manager: Some(PERSON.to_owned()),
        ..PatchParams::default()
    }
}
