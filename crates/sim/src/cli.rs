//! The command line of `gpu-sim`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use gpuop_fakeserver::faults::FaultRule;

/// The simulated GPU cluster.
#[derive(Debug, Parser)]
#[command(name = "gpu-sim", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator in-process on a simulated mixed GPU cluster and show each node's operands coming up.
    Demo(DemoArgs),
    /// Run a simulated cluster until stopped: served on 127.0.0.1 with a kubeconfig, or playing the nodes
    /// against an existing API server (`--kubeconfig`).
    Up(UpArgs),
    /// Serve the in-memory Kubernetes API server on 127.0.0.1, with a kubeconfig for it.
    Serve(ServeArgs),
    /// Run two operator replicas (their own processes, with leader election) on a simulated cluster while
    /// injecting faults on a schedule drawn from the seed, and check the operator's invariants throughout;
    /// exit 1 with the first violated invariant and the events leading to it.
    Chaos(ChaosArgs),
    /// Measure.
    #[command(subcommand)]
    Bench(Bench),
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// The fake API server at scale: load, full LISTs, watch fan-out, peak memory.
    Apiserver(ApiserverBenchArgs),
    /// The simulator at scale: create nodes, fan three DaemonSets out to all of them.
    Nodes(NodesBenchArgs),
    /// The operator (its own process) converging a simulated cluster, then a steady window.
    Converge(ConvergeBenchArgs),
    /// The operator (its own process) upgrading the driver of a converged cluster, node by node.
    Upgrade(UpgradeBenchArgs),
}

/// `gpu-sim demo`.
#[derive(Debug, Parser)]
pub struct DemoArgs {
    /// Give up (exit 1, naming what is not ready) after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub deadline_seconds: u64,
    /// Zero latency on the nodes (no image pulls, containers ready at once).
    #[arg(long)]
    pub instant: bool,
}

/// `gpu-sim up`.
#[derive(Debug, Parser)]
pub struct UpArgs {
    /// Scenario file: the cluster and a timeline of events; the demo cluster when absent.
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Play the nodes against the API server of this kubeconfig instead of serving a fake one.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Write a kubeconfig for the served API server here.
    #[arg(long, value_name = "FILE", conflicts_with = "kubeconfig")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Port of the served API server (0 picks a free one).
    #[arg(long, default_value_t = 0, conflicts_with = "kubeconfig")]
    pub port: u16,
    /// Also run the operator in-process (as the admin, also in rbac mode).
    #[arg(long)]
    pub with_operator: bool,
    /// How the served API server authorizes requests: `always-allow`, or `rbac` (bearer tokens and RBAC;
    /// the simulated cluster's own actors act as the admin).
    #[arg(long, value_enum, default_value_t = AuthorizationMode::AlwaysAllow, conflicts_with = "kubeconfig")]
    pub authorization: AuthorizationMode,
    /// Zero latency on the nodes.
    #[arg(long)]
    pub instant: bool,
    /// Whether the kubelets renew a Lease per node in kube-node-lease every 10 s and report their status
    /// every 5 min, as a real cluster's node lifecycle controller needs to keep the nodes Ready. Default:
    /// on with --kubeconfig, off on the served fake server (which has no such controller).
    #[arg(long, value_name = "on|off", value_parser = clap::builder::BoolishValueParser::new())]
    pub heartbeats: Option<bool>,
}

impl UpArgs {
    /// Whether the kubelets give heartbeats: asked for, or else against a real API server.
    pub fn heartbeats(&self) -> bool {
        self.heartbeats.unwrap_or(self.kubeconfig.is_some())
    }
}

/// `gpu-sim chaos`.
#[derive(Debug, Parser)]
pub struct ChaosArgs {
    /// Seed of the schedule of injections (and of the API server's fault decisions).
    #[arg(long)]
    pub seed: u64,
    /// How long faults are injected: seconds, or with a unit (`90s`, `2m`). Settling and a quiet window
    /// follow.
    #[arg(long, value_parser = parse_duration)]
    pub duration: std::time::Duration,
    /// GPU nodes the cluster starts with (H100 × 8 each); nodes join and leave during the run.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub nodes: u32,
    /// The `gpu-operator` binary; by default the one next to `gpu-sim`.
    #[arg(long, value_name = "PATH")]
    pub operator: Option<PathBuf>,
    /// How long the cluster may take to converge once the faults stop, in seconds or with a unit.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub settle: std::time::Duration,
    /// Write each operator process's log (at info) to a file in this folder, named after the replica.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}

/// A duration as `90`, `90s`, `2m` or `1500ms`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let trimmed = text.trim();
    let (number, unit_ms) = if let Some(n) = trimmed.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = trimmed.strip_suffix('s') {
        (n, 1_000)
    } else if let Some(n) = trimmed.strip_suffix('m') {
        (n, 60_000)
    } else {
        (trimmed, 1_000)
    };
    number
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is not a duration: give whole seconds (90), or 90s, 2m, 1500ms"))
}

/// `gpu-sim bench nodes`.
#[derive(Debug, Parser)]
pub struct NodesBenchArgs {
    /// GPU nodes to create.
    #[arg(long, default_value_t = 5_000)]
    pub nodes: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub deadline_seconds: u64,
}

impl NodesBenchArgs {
    /// The deadline.
    pub fn deadline(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.deadline_seconds)
    }
}

/// `gpu-sim bench converge`.
#[derive(Debug, Parser)]
pub struct ConvergeBenchArgs {
    /// GPU nodes in the cluster.
    #[arg(long, default_value_t = 10)]
    pub nodes: u32,
    /// Length of the steady window after convergence, in seconds.
    #[arg(long, default_value_t = 30)]
    pub steady_seconds: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub deadline_seconds: u64,
    /// After the steady window, play unrelated node churn (heartbeat times, a label and an annotation no
    /// GPU operator reads) on this share of the nodes each second, e.g. 0.05 for 5%, and report the
    /// operator's CPU and requests meanwhile.
    #[arg(long, value_name = "SHARE", value_parser = parse_churn_share)]
    pub churn: Option<f64>,
    /// Length of the churn window in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub churn_seconds: u64,
    /// Seed of the churn: which nodes, in which order, get which change.
    #[arg(long, default_value_t = 1)]
    pub churn_seed: u64,
    /// Run on real control planes instead of the fake server: this operator, then NVIDIA's, each on a
    /// control plane of its own (kube-apiserver, its controller manager and scheduler from the binaries
    /// `KUBE_BINARIES` names; NVIDIA's operator from `NVIDIA_OPERATOR`, see `scripts/nvidia-operator`),
    /// every client's requests counted from the API server's audit log, the two side by side.
    #[arg(long, conflicts_with = "churn")]
    pub real_control_plane: bool,
}

/// A share of the nodes per second: more than 0, at most 1.
fn parse_churn_share(text: &str) -> Result<f64, String> {
    let share: f64 = text.trim().parse().map_err(|_| {
        format!("{text:?} is not a number: give a share such as 0.05 (5% of the nodes a second)")
    })?;
    crate::churn::Churn::new(share, 0)?;
    Ok(share)
}

impl ConvergeBenchArgs {
    /// The deadline.
    pub fn deadline(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.deadline_seconds)
    }
}

/// `gpu-sim bench upgrade`.
#[derive(Debug, Parser)]
pub struct UpgradeBenchArgs {
    /// GPU nodes in the cluster (each also runs one GPU workload pod).
    #[arg(long, default_value_t = 1_000)]
    pub nodes: u32,
    /// `maxParallelUpgrades`.
    #[arg(long, default_value_t = 50)]
    pub max_parallel: u32,
    /// Give up on convergence, and then on the upgrade, after this many seconds each.
    #[arg(long, default_value_t = 1_800)]
    pub deadline_seconds: u64,
    /// Run on real control planes instead of the fake server: this operator, then NVIDIA's, each on a
    /// control plane of its own (as `bench converge --real-control-plane`), the workload behind a
    /// PodDisruptionBudget that the real eviction API enforces, every client's requests counted from the
    /// API server's audit log, the two side by side.
    #[arg(long)]
    pub real_control_plane: bool,
}

impl UpgradeBenchArgs {
    /// The deadline.
    pub fn deadline(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.deadline_seconds)
    }
}

/// How deleting a pod bound to a node behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PodTermination {
    /// The pod goes at once.
    #[default]
    Immediate,
    /// The pod waits for a kubelet to delete it again with grace period 0.
    Kubelet,
}

/// How the served API server authorizes requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AuthorizationMode {
    /// Every request is allowed, with or without credentials.
    #[default]
    AlwaysAllow,
    /// Bearer tokens and RBAC, as a real API server: the kubeconfig written carries the admin's token
    /// (`kubernetes-admin` in `system:masters`); `kubectl create token` mints service-account tokens.
    Rbac,
}

impl From<AuthorizationMode> for gpuop_fakeserver::Authorization {
    fn from(mode: AuthorizationMode) -> Self {
        match mode {
            AuthorizationMode::AlwaysAllow => Self::AlwaysAllow,
            AuthorizationMode::Rbac => Self::Rbac,
        }
    }
}

/// `gpu-sim serve`.
#[derive(Debug, Parser)]
pub struct ServeArgs {
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Write a kubeconfig for the server here.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Create every object in this YAML/JSON file, or in this directory's YAML/JSON files, before
    /// serving. Repeatable: all paths are created together, Namespaces, CRDs and PriorityClasses first
    /// (e.g. `--load deploy/crds/ --load deploy/samples/clusterpolicy.yaml`). Nothing else is created: an
    /// object whose namespace no path brings is refused, as by a real API server.
    #[arg(long, value_name = "PATH")]
    pub load: Vec<PathBuf>,
    /// Seed for uids, generated names and fault decisions.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Inject a fault, e.g. `verb=patch,resource=nodes,rate=0.1,code=429,retry-after=2`,
    /// `verb=list,client=gpu-operator-rs,latency-ms=50` (only that client's lists),
    /// `resource=leases,client=replica-a,hang` (that client's lease requests are never answered), or
    /// `resource=nodes,watch-delay-ms=3000` (watch events of nodes arrive 3 s late). Repeatable.
    #[arg(long = "fault", value_name = "RULE")]
    pub faults: Vec<FaultRule>,
    /// End every watch stream after this many events.
    #[arg(long, value_name = "N")]
    pub drop_watches_after: Option<usize>,
    /// Changes remembered per resource for watches from older versions.
    #[arg(long, default_value_t = 10_000)]
    pub history: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    pub bookmark_seconds: u64,
    /// How deleting a pod bound to a node behaves.
    #[arg(long, value_enum, default_value_t = PodTermination::Immediate)]
    pub pod_termination: PodTermination,
    /// How requests are authorized: `always-allow`, or `rbac` (bearer tokens and RBAC; the report of every
    /// decision is at `GET /fake/authorization` for the admin).
    #[arg(long, value_enum, default_value_t = AuthorizationMode::AlwaysAllow)]
    pub authorization: AuthorizationMode,
}

/// `gpu-sim bench apiserver`.
#[derive(Debug, Parser)]
pub struct ApiserverBenchArgs {
    /// Nodes to load.
    #[arg(long, default_value_t = 5_000)]
    pub nodes: usize,
    /// Pods to load, spread over the nodes.
    #[arg(long, default_value_t = 50_000)]
    pub pods: usize,
    /// Watchers of nodes that a label patch must reach.
    #[arg(long, default_value_t = 50)]
    pub watchers: usize,
    /// How many times each measurement is repeated.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    #[test]
    fn the_command_line_parses_faults_and_defaults() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "gpu-sim",
            "serve",
            "--port",
            "6443",
            "--fault",
            "verb=patch,resource=nodes,rate=0.5,code=500",
            "--pod-termination",
            "kubelet",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("serve")
        };
        assert_eq!(args.port, 6443);
        assert_eq!(args.faults.len(), 1);
        assert_eq!(args.pod_termination, PodTermination::Kubelet);
        assert_eq!(args.history, 10_000);
        let bad = Cli::try_parse_from(["gpu-sim", "serve", "--fault", "code=418"]).expect_err("refused");
        assert!(bad.to_string().contains("is not one of 500, 429, 409"), "{bad}");
    }

    #[test]
    fn chaos_takes_a_seed_a_duration_and_optional_nodes() {
        let cli =
            Cli::try_parse_from(["gpu-sim", "chaos", "--seed", "7", "--duration", "2m"]).expect("parses");
        let Command::Chaos(args) = cli.command else {
            panic!("chaos")
        };
        assert_eq!(
            (args.seed, args.duration, args.nodes),
            (7, Duration::from_secs(120), 4)
        );
        assert_eq!(args.settle, Duration::from_secs(90));
        for (text, expected) in [
            ("60", 60_000),
            ("60s", 60_000),
            ("1500ms", 1_500),
            (" 3m ", 180_000),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(expected)),
                "{text}"
            );
        }
        for bad in ["", "s", "-1", "1h", "1.5s", "é", "99999999999999999999m"] {
            let error = parse_duration(bad).expect_err(bad);
            assert!(error.contains("is not a duration"), "{error}");
        }
        let missing = Cli::try_parse_from(["gpu-sim", "chaos", "--duration", "10"]).expect_err("no seed");
        assert!(missing.to_string().contains("--seed"), "{missing}");
        let zero = Cli::try_parse_from([
            "gpu-sim",
            "chaos",
            "--seed",
            "1",
            "--duration",
            "10",
            "--nodes",
            "0",
        ]);
        assert!(zero.is_err(), "at least one node");
    }

    #[test]
    fn converge_takes_a_churn_share_and_window() {
        let converge = |args: &[&str]| {
            Cli::try_parse_from([&["gpu-sim", "bench", "converge"], args].concat()).map(|cli| {
                match cli.command {
                    Command::Bench(Bench::Converge(args)) => args,
                    other => panic!("converge, not {other:?}"),
                }
            })
        };
        let plain = converge(&[]).expect("parses");
        assert_eq!(
            (plain.churn, plain.churn_seconds, plain.churn_seed),
            (None, 60, 1)
        );
        let churn = converge(&["--churn", "0.05", "--churn-seconds", "10"]).expect("parses");
        assert_eq!((churn.churn, churn.churn_seconds), (Some(0.05), 10));
        for bad in ["0", "1.5", "five", "-0.1"] {
            let error = converge(&[&format!("--churn={bad}")]).expect_err(bad).to_string();
            assert!(error.contains("--churn") || error.contains("share"), "{error}");
        }
        assert!(converge(&["--churn", "0.1", "--churn-seconds", "0"]).is_err());
    }

    #[test]
    fn heartbeats_are_on_against_a_real_cluster_unless_switched_off() {
        let up = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["gpu-sim", "up"], args].concat()).expect("parses");
            let Command::Up(args) = cli.command else {
                panic!("up")
            };
            args.heartbeats()
        };
        assert!(!up(&[]), "off on the served fake server");
        assert!(up(&["--kubeconfig", "/tmp/kc"]));
        assert!(!up(&["--kubeconfig", "/tmp/kc", "--heartbeats", "off"]));
        assert!(up(&["--heartbeats", "on"]));
    }
}
