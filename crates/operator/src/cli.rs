//! Command-line interface of `gpu-operator`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::check;
use crate::lease::Timing;
use crate::run::{self, DEFAULT_LEASE_NAME, LeaderElection};
use gpuop_api::ImageDefaults;
use gpuop_api::labels::GpuDetection;

/// The GPU operator: makes nodes with NVIDIA GPUs usable by Kubernetes workloads, and keeps them so.
#[derive(Debug, Parser)]
#[command(name = "gpu-operator", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster of the usual kubeconfig (in-cluster, $KUBECONFIG, ~/.kube/config).
    Run(RunArgs),
    /// Print the ClusterPolicy and NVIDIADriver CustomResourceDefinitions as multi-document YAML, or apply
    /// them to the cluster.
    ///
    /// With --apply (a Helm pre-install/pre-upgrade hook: Helm never upgrades `crds/`), each CRD is
    /// server-side applied (field manager gpu-operator) and waited for until it is Established and its
    /// versions are served; one line per CRD says `created`, `updated` or `unchanged`. A live CRD that
    /// serves or stores a version this binary does not serve is never downgraded.
    /// Exit status: 0 when every CRD is applied and served, 1 when one is refused, fails or is not served
    /// within the timeout (the message names it), 2 when there is no usable kubeconfig.
    Crd(CrdArgs),
    /// Remove everything the operator put on the cluster (a Helm pre-delete hook, run while the operator
    /// still runs).
    ///
    /// Deletes every ClusterPolicy and NVIDIADriver, waits for the operator to delete its objects and
    /// remove its node labels, annotations and upgrade cordons, and removes what is left itself if the
    /// operator has not finished within half the timeout. Labels a person set or changed stay.
    /// Exit status: 0 when nothing is left, 1 when something is (each is listed), 2 when the cluster
    /// cannot be read or a ClusterPolicy or NVIDIADriver cannot be deleted.
    Uninstall(UninstallArgs),
    /// Check ClusterPolicy and NVIDIADriver manifests offline, as the API server and the operator would.
    ///
    /// Every problem is printed with its file, document and field. Images left unset in a policy may come
    /// from the same environment variables the operator reads (DRIVER_IMAGE, DEVICE_PLUGIN_IMAGE, ...).
    /// Exit status: 0 when every object is valid, 1 when any has a problem, 2 when a file cannot be read.
    Check {
        /// Manifest files (YAML, one or more documents each); `-` reads standard input; a folder stands
        /// for its `.yaml`, `.yml` and `.json` files, in name order, as with `kubectl apply -f`.
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
        /// Also read the files of the folders' subfolders, at any depth.
        #[arg(short = 'R', long)]
        recursive: bool,
    },
    /// Print the objects the operator would create for a ClusterPolicy, without a cluster; or, with
    /// `--diff-live`, what taking over the cluster of the usual kubeconfig would change.
    ///
    /// `--diff-live` renders the live ClusterPolicy (and NVIDIADrivers) against the live cluster's facts,
    /// compares with the live objects and prints per object: created, unchanged, metadata-only change, or
    /// pod template change with the differing fields and the pods that will restart, by node. It only reads.
    /// Exit status: 0 when no pod restarts, 1 when pods will restart, 2 on an error (including a change
    /// the API server would refuse, such as a different DaemonSet selector).
    Render {
        /// The ClusterPolicy manifest; `-` reads standard input.
        #[arg(
            short = 'f',
            long = "filename",
            required_unless_present = "diff_live",
            conflicts_with = "diff_live"
        )]
        file: Option<PathBuf>,
        /// Cluster facts (YAML: namespace, runtime, driverPools, serviceMonitorCrd, configMapKeys); by default
        /// namespace `gpu-operator`, containerd, one pool of Ubuntu 22.04 GPU nodes.
        #[arg(long, conflicts_with = "diff_live")]
        facts: Option<PathBuf>,
        /// Compare with the live cluster instead of printing YAML.
        #[arg(long)]
        diff_live: bool,
        /// The namespace the operands run in (with `--diff-live`).
        #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "gpu-operator")]
        namespace: String,
        /// GPU nodes also matched by this label selector, as given to `run` (with `--diff-live`).
        #[arg(long)]
        gpu_node_selector: Option<gpuop_api::selector::LabelSelector>,
    },
}

/// Arguments of `gpu-operator crd`.
#[derive(Debug, clap::Args)]
pub struct CrdArgs {
    /// Apply the CRDs to the cluster of the usual kubeconfig instead of printing them.
    #[arg(long)]
    pub apply: bool,
    /// With --apply, seconds to wait in all for the CRDs to be established and served.
    #[arg(long, default_value_t = 120, requires = "apply")]
    pub timeout_seconds: u64,
}

/// Arguments of `gpu-operator uninstall`.
#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Namespace the operator and its operands run in.
    #[arg(long, env = "OPERATOR_NAMESPACE")]
    pub namespace: String,
    /// Seconds everything may take; the operator has the first half to clean up after itself.
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
    /// The operator's leader-election Lease, deleted when nobody renews it.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,
}

/// Arguments of `gpu-operator run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Namespace the operands run in.
    #[arg(long, env = "OPERATOR_NAMESPACE")]
    pub namespace: String,
    /// Elect a leader among replicas on a Lease; only the leader writes.
    #[arg(long)]
    pub leader_elect: bool,
    /// Name of the Lease (NVIDIA's operator uses the same one, so the two never lead at once).
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,
    /// Address of `/metrics`.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,
    /// Address of `/healthz` and `/readyz`.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_probe_bind_address: SocketAddr,
    /// Also treat nodes matching this label selector as GPU nodes (for clusters without NFD), e.g.
    /// `cloud.google.com/gke-accelerator`.
    #[arg(long)]
    pub gpu_node_selector: Option<gpuop_api::selector::LabelSelector>,
    /// Seconds the validator has to pass on a node after its driver was upgraded, before the node is
    /// marked `upgrade-failed`.
    #[arg(long, default_value_t = gpuop_api::upgrade::DEFAULT_VALIDATION_TIMEOUT_SECONDS)]
    pub upgrade_validation_timeout_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Parses the command line and runs the subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd(CrdArgs { apply: false, .. }) => write_stdout("crd", &gpuop_api::crd::crds_yaml()),
        Command::Crd(CrdArgs {
            apply: true,
            timeout_seconds,
        }) => with_client("crd", |client| apply_crds(client, timeout_seconds)),
        Command::Uninstall(args) => with_client("uninstall", |client| uninstall(client, args)),
        Command::Check { files, recursive } => {
            check::run(&files, recursive, &check::image_defaults_from_env())
        }
        Command::Render {
            diff_live: true,
            namespace,
            gpu_node_selector,
            ..
        } => diff_live(&namespace, gpu_node_selector),
        Command::Render { file, facts, .. } => match crate::render_command::render_files(
            file.as_deref().unwrap_or_else(|| std::path::Path::new("-")),
            facts.as_deref(),
            &check::image_defaults_from_env(),
        ) {
            Ok(yaml) => write_stdout("render", &yaml),
            Err(error) => {
                eprintln!("gpu-operator render: {error}");
                ExitCode::from(1)
            }
        },
        Command::Run(args) => run_operator(args),
    }
}

fn diff_live(namespace: &str, selector: Option<gpuop_api::selector::LabelSelector>) -> ExitCode {
    use crate::diff_live::EXIT_ERROR;
    use crate::render_command::DiffLiveInput;
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("gpu-operator render --diff-live: cannot start: {error}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let detection = GpuDetection::from_selector(selector);
    let image_defaults = check::image_defaults_from_env();
    let report = runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|error| format!("cannot reach the cluster: {error}"))?;
        let input = DiffLiveInput {
            namespace,
            detection: &detection,
            image_defaults: &image_defaults,
        };
        crate::render_command::diff_live(&client, input)
            .await
            .map_err(|error| error.to_string())
    });
    match report {
        Ok(report) => {
            let status = report.exit_status();
            match write_stdout("render", &report.to_text()) {
                code if code == ExitCode::SUCCESS => ExitCode::from(status),
                failed => failed,
            }
        }
        Err(error) => {
            eprintln!("gpu-operator render --diff-live: {error}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn write_stdout(command: &str, text: &str) -> ExitCode {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpu-operator {command}: cannot write: {error}");
            ExitCode::from(2)
        }
    }
}

/// Sets up logging as `RUST_LOG` says (default `info`), in colour only on a terminal without `NO_COLOR`.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let colour = log_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Whether log lines may carry ANSI colour codes: only for a person at a terminal, and never when
/// `NO_COLOR` is set to anything but the empty string (<https://no-color.org>). Escape codes in a file,
/// `kubectl logs` or a log collector are noise.
pub fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// Starts the async runtime `builder` describes, with its I/O and time drivers; where it cannot, says so for
/// `command` and gives the exit code.
fn start_runtime(
    command: &str,
    mut builder: tokio::runtime::Builder,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|error| {
        eprintln!("gpu-operator {command}: cannot start the async runtime: {error}");
        ExitCode::from(2)
    })
}

/// Runs a command that talks to the cluster of the usual kubeconfig, logging to stderr.
fn with_client<F, Fut>(command: &str, body: F) -> ExitCode
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    init_logging(LogFormat::Plain);
    let runtime = match start_runtime(command, tokio::runtime::Builder::new_multi_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        match client().await {
            Ok(client) => body(client).await,
            Err(error) => {
                eprintln!(
                    "gpu-operator {command}: cannot build a Kubernetes client from the kubeconfig or the in-cluster config: {error}"
                );
                ExitCode::from(2)
            }
        }
    })
}

/// `gpu-operator crd --apply` with `client`: prints one line per CRD; exit status 0 or 1.
pub async fn apply_crds(client: kube::Client, timeout_seconds: u64) -> ExitCode {
    let (done, result) =
        crate::crd_install::apply_all(&client, std::time::Duration::from_secs(timeout_seconds)).await;
    for (name, outcome) in done {
        println!("customresourcedefinition {name} {outcome}");
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpu-operator crd --apply: {error}");
            ExitCode::from(1)
        }
    }
}

/// `gpu-operator uninstall` with `client`: prints what it removed and what is left; exit status 0, 1 or 2.
pub async fn uninstall(client: kube::Client, args: UninstallArgs) -> ExitCode {
    let options = crate::uninstall::Options {
        namespace: args.namespace,
        lease_name: args.lease_name,
        timeout: std::time::Duration::from_secs(args.timeout_seconds),
    };
    let report = match crate::uninstall::uninstall(&client, &options).await {
        Ok(report) => report,
        Err(error) => {
            eprintln!("gpu-operator uninstall: {error}");
            return ExitCode::from(2);
        }
    };
    print!("{}", crate::uninstall::summary(&report));
    if report.left.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn run_operator(args: RunArgs) -> ExitCode {
    init_logging(args.log_format);
    // One thread: the operator's work is reading watch events, each a few microseconds of decoding, and
    // short passes. A multi-threaded runtime hands those between workers, waking and parking them for
    // every event, and gives each worker its own allocator arena.
    let runtime = match start_runtime("run", tokio::runtime::Builder::new_current_thread()) {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let client = match client().await {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(%error, "cannot build a Kubernetes client from the kubeconfig or the in-cluster config");
                return ExitCode::from(2);
            }
        };
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("gpu-operator-{}", std::process::id()));
        let mut config = run_config(args, identity.clone(), check::image_defaults_from_env());
        let uid = std::env::var("POD_UID").ok().filter(|uid| !uid.is_empty());
        if let (Some(election), Some(uid)) = (config.leader_election.as_mut(), uid) {
            election.owner = Some(pod_owner(&identity, &uid));
        }
        let running = match run::start(client, config).await {
            Ok(running) => running,
            Err(error) => {
                tracing::error!(%error, "cannot start");
                return ExitCode::from(2);
            }
        };
        shutdown_signal().await;
        tracing::info!("shutting down");
        running.stop().await;
        ExitCode::SUCCESS
    })
}

/// This replica's Pod (`POD_NAME`, `POD_UID` from the downward API) as an owner reference: the Lease it
/// holds goes with it.
pub fn pod_owner(name: &str, uid: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        ..Default::default()
    }
}

/// The operator's configuration from `gpu-operator run`'s arguments; `identity` names this replica in
/// the leader-election Lease, `image_defaults` are the images its environment names (`VALIDATOR_IMAGE`, ...).
pub fn run_config(args: RunArgs, identity: String, image_defaults: ImageDefaults) -> run::Config {
    run::Config {
        namespace: args.namespace,
        detection: GpuDetection::from_selector(args.gpu_node_selector),
        image_defaults,
        leader_election: args.leader_elect.then(|| LeaderElection {
            lease_name: args.lease_name,
            identity,
            owner: None,
            timing: Timing::default(),
        }),
        metrics_address: Some(args.metrics_bind_address),
        health_address: Some(args.health_probe_bind_address),
        upgrade_validation_timeout_seconds: args.upgrade_validation_timeout_seconds,
    }
}

/// A client from the kubeconfig or the in-cluster config that names itself in `User-Agent`, so that API
/// server audit logs and request metrics tell the operator's requests from everyone else's.
///
/// The connection and every read on it are bounded, so that no request waits forever on a server that
/// stopped answering: connecting within [`CONNECT_TIMEOUT`], and no read waiting longer than
/// [`READ_TIMEOUT`]. The read timeout applies to watch streams too, which are quiet for minutes by design
/// (kube-runtime's watcher asks the server to end them after 290 s), so it must be longer than that; the
/// tighter bound on every other request is [`crate::api_client`]'s, and on lease requests the election's.
async fn client() -> Result<kube::Client, Box<dyn std::error::Error>> {
    let mut config = kube::Config::infer().await?;
    configure(&mut config);
    Ok(kube::Client::try_from(config)?)
}

/// The operator's settings on a client configuration (see [`client`]).
///
/// kube's own retrying of 429, 503 and 504 answers is off: a 429 is often an answer, not a hiccup (an
/// eviction a PodDisruptionBudget refuses), and the operator's loops retry on their own schedule, within
/// their deadlines. With it on, each eviction a budget refused was sent again 15 times over about 220 s
/// (measured on kube-apiserver v1.36) before the upgrade saw the refusal.
pub fn configure(config: &mut kube::Config) {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    // The read timeout counts from when a request is written, not from when its pooled connection last
    // carried anything.
    config.reset_reader_on_write = true;
    config.default_retry = false;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(crate::USER_AGENT),
    ));
}

/// How long connecting to the API server may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest a read on a connection may wait: longer than the 290 s after which the server ends
/// kube-runtime's watches (and than the watcher's own 295 s idle limit), so that only a dead connection
/// trips it.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = interrupt.await;
            return;
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_leaves_refusals_to_the_operator_and_names_itself() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().expect("a URL"));
        assert!(
            config.default_retry,
            "kube retries 429, 503 and 504 unless told not to"
        );
        configure(&mut config);
        assert!(!config.default_retry, "a 429 reaches the operator at once");
        assert_eq!(config.read_timeout, Some(READ_TIMEOUT));
        assert!(
            config
                .headers
                .iter()
                .any(|(name, value)| name == http::header::USER_AGENT && value == crate::USER_AGENT)
        );
    }
    use std::ffi::OsStr;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(!log_colour(false, None), "a pipe or file gets no escape codes");
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(
            log_colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR does not count (no-color.org)"
        );
    }
}
