//! Command-line interface of `kubectl-gpu` (`kubectl gpu ...` when it is on the PATH).
//!
//! Exit status: 0 when healthy, 1 when there are findings (or the explained pod has a broken link), 2 when
//! the doctor could not run. `upgrade-plan`: 0 when the plan was computed, 2 when it could not be.
//!
//! Manners kubectl users expect: errors are one line, `error: ...`, whatever `RUST_BACKTRACE` says; a
//! closed standard output (`| head`) ends the command quietly; no escape sequence goes to a pipe.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use gpuop_api::labels::GpuDetection;
use gpuop_api::selector::LabelSelector;

use crate::analysis::analyze_with;
use crate::completion::{self, Shell};
use crate::explain::explain_with;
use crate::live::{ConnectionArgs, Live, Reads};
use crate::load::load_paths;
use crate::report::Report;
use crate::snapshot::Snapshot;
use crate::upgrade_plan::upgrade_plan_with;
use crate::{bench, table, upgrade_plan as plan_view};

/// The GPU operator's doctor: is every operand that should run on every node really running, in the right
/// order, and why can this pod not get its GPU.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-gpu",
    bin_name = "kubectl gpu",
    version,
    about,
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where to read the cluster from.
#[derive(Debug, Args)]
pub struct Source {
    /// Read a snapshot instead of the live cluster: a file or directory of `kubectl get -o json` or `-o yaml`
    /// output (lists, single objects, multi-document YAML). Repeatable.
    #[arg(long = "snapshot", value_name = "PATH")]
    pub snapshots: Vec<PathBuf>,
    /// How to reach the live cluster.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Also take nodes matching this label selector as GPU nodes, as the operator's `--gpu-node-selector`
    /// does (clusters without NFD); give the operator's value, so the two judge the same nodes.
    #[arg(long, value_name = "SELECTOR")]
    pub gpu_node_selector: Option<LabelSelector>,
}

impl Source {
    /// How GPU nodes are recognised: as the operator does with the same `--gpu-node-selector`.
    fn detection(&self) -> GpuDetection {
        GpuDetection::from_selector(self.gpu_node_selector.clone())
    }
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table a person reads.
    Table,
    /// The documented JSON schema (see docs/doctor.md).
    Json,
    /// The JSON schema, as YAML.
    Yaml,
    /// The table with more columns (`doctor`); the table elsewhere, as kubectl does for kinds without
    /// wide columns.
    Wide,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Audit every node: operands expected and running, their order, and the node contract.
    ///
    /// Exit status: 0 when there are no findings, 1 when there are, 2 when the doctor could not run.
    Doctor {
        /// Where to read from.
        #[command(flatten)]
        source: Source,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Only this node (shown in detail in the table format).
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// Keep watching the live cluster, re-running every --interval seconds.
        #[arg(long, conflicts_with = "snapshots")]
        watch: bool,
        /// Seconds between runs with --watch.
        #[arg(long, default_value_t = 5, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
        interval: u64,
    },
    /// Explain why a pod is Pending or cannot see its GPU, naming the first broken link.
    ///
    /// Exit status: 0 when no broken link is visible, 1 when one is, 2 when the doctor could not run.
    Explain {
        /// What to explain: `pod`.
        #[arg(value_parser = ["pod", "pods", "po"])]
        kind: String,
        /// The pod: NAMESPACE/NAME, or NAME with --namespace.
        target: String,
        /// Namespace of the pod (default: the context's, or `default` with --snapshot).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Where to read from.
        #[command(flatten)]
        source: Source,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Show what a driver upgrade would do now, per upgrade pool: the budget, nodes in progress and failed,
    /// the batches, the GPU pods each node would lose, the PodDisruptionBudgets that would block them, pods
    /// that could never be evicted, and the nodes left out. Read-only.
    ///
    /// Exit status: 0 when the plan was computed, 2 when it could not be.
    UpgradePlan {
        /// Where to read from.
        #[command(flatten)]
        source: Source,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Save what the doctor reads from the live cluster (and the pods that ask for GPUs) to a file that
    /// `--snapshot` reads back.
    Snapshot {
        /// The file to write (`-` for standard output).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// How to reach the live cluster.
        #[command(flatten)]
        connection: ConnectionArgs,
    },
    /// Write a support bundle: one tar.gz with the snapshot, the doctor's report, the ClusterPolicies and
    /// NVIDIADrivers, Events, and the operator's and operands' logs (see docs/doctor.md).
    ///
    /// Exit status: 0 when the archive was written (parts that could not be read are listed in its
    /// index.json and on standard error), 2 when nothing could be read.
    Bundle(crate::bundle::BundleArgs),
    /// Measure the analysis on a generated snapshot (see BENCHMARKS.md).
    #[command(hide = true)]
    Bench {
        /// Nodes in the generated snapshot.
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// Analysis runs to time.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Directory for the snapshot file (default: the system's temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Measure this snapshot file only (the benchmark's second process).
        #[arg(long, value_name = "FILE")]
        load: Option<PathBuf>,
        /// Keep the generated snapshot file.
        #[arg(long)]
        keep: bool,
    },
    /// Print a shell completion script.
    ///
    /// bash, zsh, fish and powershell complete `kubectl-gpu ...` typed as a command:
    /// `source <(kubectl gpu completion bash)`. kubectl (1.26 and later) completes `kubectl gpu ...` by
    /// running `kubectl_complete-gpu` from the PATH: `kubectl gpu completion kubectl-plugin` prints that
    /// script; save it as an executable `kubectl_complete-gpu` next to `kubectl-gpu`.
    Completion {
        /// The shell, or `kubectl-plugin`.
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// Parses the command line and runs the subcommand.
pub fn main() -> ExitCode {
    // kubectl's plugin completion (`kubectl_complete-gpu`): the words are completed, not parsed.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.first().is_some_and(|a| a == completion::COMPLETE) {
        return finish(print(&completion::complete(Cli::command(), &args[1..])).map(|()| ExitCode::SUCCESS));
    }
    let cli = Cli::parse();
    finish(run(cli.command))
}

/// The exit status of a command, and its error said once.
fn finish(outcome: anyhow::Result<ExitCode>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        // The reader went away (`| head`): nothing to say, and no one to say it to.
        Err(error) if stdout_closed(&error) => ExitCode::SUCCESS,
        // One line, as kubectl says it: the chain of causes through Display, never anyhow's Debug
        // (which adds a backtrace under RUST_BACKTRACE=1).
        Err(error) => {
            eprintln!("error: {}", explain_error(&error));
            ExitCode::from(2)
        }
    }
}

/// Standard output was closed before everything was written.
#[derive(Debug, thiserror::Error)]
#[error("standard output is closed")]
struct StdoutClosed;

fn stdout_closed(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.is::<StdoutClosed>()
            || cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes, each said once: some libraries repeat their cause in their own message.
fn explain_error(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Doctor {
            source,
            output,
            node,
            watch,
            interval,
        } => {
            if watch {
                return runtime()?.block_on(watch_doctor(&source, output, node.as_deref(), interval));
            }
            let snapshot = read(&source, Reads::Doctor)?;
            let report = doctor_report(&snapshot, &source.detection(), node.as_deref())?;
            // A large cluster's JSON report is tens of MiB: written as it is made, never held whole.
            let rendered = match output {
                Output::Json => {
                    print_json(&report)?;
                    String::new()
                }
                _ => render(&report, output, node.is_some())?,
            };
            print(&rendered)?;
            let verdict = verdict(report.has_findings());
            // The process ends here: freeing a large cluster's objects one by one is work the system does
            // at once when the process exits.
            std::mem::forget((snapshot, report, rendered));
            Ok(verdict)
        }
        Command::Explain {
            target,
            namespace,
            source,
            output,
            ..
        } => {
            let (namespace, name) = match target.split_once('/') {
                Some((namespace, name)) => (Some(namespace.to_owned()), name.to_owned()),
                None => (namespace, target.clone()),
            };
            let snapshot = if source.snapshots.is_empty() {
                runtime()?.block_on(async {
                    let live = Live::connect(&source.connection.connection()).await?;
                    let namespace = namespace
                        .clone()
                        .unwrap_or_else(|| live.default_namespace().to_owned());
                    let snapshot = live.snapshot_with_pod(&namespace, &name).await?;
                    anyhow::Ok((namespace, snapshot))
                })?
            } else {
                (
                    namespace.unwrap_or_else(|| "default".to_owned()),
                    read_files(&source.snapshots)?,
                )
            };
            let (namespace, snapshot) = snapshot;
            let explanation = explain_with(&snapshot, &source.detection(), &namespace, &name)?;
            let text = match output {
                Output::Table | Output::Wide => table::explanation(&explanation),
                Output::Json => serde_json::to_string_pretty(&explanation)? + "\n",
                Output::Yaml => to_yaml(&explanation)?,
            };
            print(&text)?;
            Ok(verdict(explanation.verdict.link.is_some()))
        }
        Command::UpgradePlan { source, output } => {
            let snapshot = read(&source, Reads::UpgradePlan)?;
            let plan = upgrade_plan_with(&snapshot, &source.detection())?;
            let text = match output {
                Output::Table | Output::Wide => plan_view::table(&plan),
                Output::Json => serde_json::to_string_pretty(&plan_view::json(&plan))? + "\n",
                Output::Yaml => to_yaml(&plan_view::json(&plan))?,
            };
            print(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Snapshot { output, connection } => {
            let connection = connection.connection();
            let snapshot = runtime()?.block_on(async {
                let live = Live::connect(&connection).await?;
                anyhow::Ok(live.snapshot(Reads::UpgradePlan).await?)
            })?;
            write_snapshot(&snapshot, &output)?;
            eprintln!(
                "kubectl gpu: saved {} nodes, {} DaemonSets, {} pods, {} RuntimeClasses, {} ClusterPolicies, \
                 {} NVIDIADrivers, {} ControllerRevisions, {} PodDisruptionBudgets to {}",
                snapshot.nodes.len(),
                snapshot.daemon_sets.len(),
                snapshot.pods.len(),
                snapshot.runtime_classes.len(),
                snapshot.cluster_policies.len(),
                snapshot.nvidia_drivers.len(),
                snapshot.controller_revisions.len(),
                snapshot.disruption_budgets.len(),
                output.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Bundle(args) => crate::bundle::run(&args),
        Command::Bench {
            nodes,
            runs,
            dir,
            load,
            keep,
        } => {
            let text = match load {
                Some(path) => bench::measure(&path, runs)?.lines(),
                None => bench::run(nodes, runs, &dir.unwrap_or_else(std::env::temp_dir), keep)?.to_string(),
            };
            print(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completion { shell } => {
            print(&completion::script(shell, Cli::command()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn verdict(problems: bool) -> ExitCode {
    if problems {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn read(source: &Source, reads: Reads) -> anyhow::Result<Snapshot> {
    if !source.snapshots.is_empty() {
        return read_files(&source.snapshots);
    }
    runtime()?.block_on(async {
        let live = Live::connect(&source.connection.connection()).await?;
        anyhow::Ok(live.snapshot(reads).await?)
    })
}

/// Reads snapshot files; one without a single node is not what the person meant to give.
fn read_files(paths: &[PathBuf]) -> anyhow::Result<Snapshot> {
    let snapshot = load_paths(paths)?;
    if snapshot.nodes.is_empty() {
        let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        bail!(
            "no Node in {}: a snapshot needs the nodes (kubectl get nodes -o json), or use kubectl gpu snapshot",
            paths.join(", ")
        );
    }
    Ok(snapshot)
}

fn doctor_report(
    snapshot: &Snapshot,
    detection: &GpuDetection,
    node: Option<&str>,
) -> anyhow::Result<Report> {
    let mut report = analyze_with(snapshot, detection);
    if let Some(node) = node
        && !report.retain_node(node)
    {
        bail!(
            "node {node} is not in the cluster ({} nodes)",
            snapshot.nodes.len()
        );
    }
    Ok(report)
}

fn render(report: &Report, output: Output, detailed: bool) -> anyhow::Result<String> {
    Ok(match output {
        Output::Json => serde_json::to_string_pretty(report)? + "\n",
        Output::Yaml => to_yaml(report)?,
        Output::Table | Output::Wide if detailed => report.nodes.iter().map(table::node).collect(),
        Output::Table => table::doctor(report, false),
        Output::Wide => table::doctor(report, true),
    })
}

/// The JSON schema as YAML (`-o yaml`), as kubectl prints an object.
fn to_yaml(value: &impl serde::Serialize) -> anyhow::Result<String> {
    serde_saphyr::to_string(value).context("cannot write YAML")
}

async fn watch_doctor(
    source: &Source,
    output: Output,
    node: Option<&str>,
    interval: u64,
) -> anyhow::Result<ExitCode> {
    let live = Live::connect(&source.connection.connection()).await?;
    let mut code = ExitCode::SUCCESS;
    loop {
        let text = match live.snapshot(Reads::Doctor).await {
            Ok(snapshot) => match doctor_report(&snapshot, &source.detection(), node) {
                Ok(report) => {
                    code = verdict(report.has_findings());
                    match output {
                        Output::Json => serde_json::to_string(&report)? + "\n",
                        // One YAML document per round, as `kubectl get -w -o yaml` separates them.
                        Output::Yaml => format!("---\n{}", to_yaml(&report)?),
                        Output::Table | Output::Wide => render(&report, output, node.is_some())?,
                    }
                }
                Err(error) => format!("error: {}\n", explain_error(&error)),
            },
            // A failed round is shown and retried; the watch goes on.
            Err(error) => format!("error: {}\n", explain_error(&error.into())),
        };
        if matches!(output, Output::Table | Output::Wide) {
            // On a terminal, clear the screen and redraw from the top; into a pipe or file, no escape
            // sequence: one round after the other.
            let clear = if std::io::stdout().is_terminal() {
                "\x1b[2J\x1b[H"
            } else {
                ""
            };
            print(&format!(
                "{clear}{} (every {interval}s, Ctrl-C to stop)\n\n{text}\n",
                jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M:%S UTC")
            ))?;
        } else {
            print(&text)?;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(code),
            () = tokio::time::sleep(Duration::from_secs(interval)) => {}
        }
    }
}

/// Writes to standard output. A closed pipe (`| head`) is [`StdoutClosed`], which ends the command quietly
/// (a `--watch` too, which would otherwise write into the void forever).
fn print(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        other => other.context("cannot write to standard output"),
    }
}

/// Writes a report as `-o json` prints it, as it is made, as [`print`] writes text.
fn print_json(report: &Report) -> anyhow::Result<()> {
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut stdout, report)
        .map_err(std::io::Error::from)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        other => other.context("cannot write to standard output"),
    }
}

fn write_snapshot(snapshot: &Snapshot, path: &Path) -> anyhow::Result<()> {
    if path == Path::new("-") {
        let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
        return snapshot
            .write_json(&mut stdout)
            .and_then(|()| stdout.flush())
            .context("cannot write to standard output");
    }
    let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut writer = std::io::BufWriter::new(file);
    snapshot
        .write_json(&mut writer)
        .and_then(|()| writer.flush())
        .with_context(|| format!("cannot write {}", path.display()))
}
