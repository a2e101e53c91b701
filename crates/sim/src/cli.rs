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
    /// `verb=list,client=gpu-operator-rs,latency-ms=50` (only that client's lists), or
    /// `resource=nodes,watch-delay-ms=3000` (watch events of nodes arrive 3 s
    /// late). Repeatable.
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
