//! The simulated GPU cluster: the parts of a Kubernetes cluster that are not the API server, played by
//! ordinary API clients, so that the operator can be run, tested, demonstrated and benchmarked anywhere.
//!
//! - Data: [`cluster_spec`] (node pools as a person writes them), [`workload`] (GPU workloads and their
//!   ReplicaSets and disruption budgets), [`hardware`] (GPU models and their MIG profiles), [`scenario`] (a
//!   timeline of events, faults and changes to the cluster's objects), [`spec_file`] (reading either from
//!   YAML, every mistake named by file, line, column and field path).
//! - Pure decisions: [`daemonset`] (the DaemonSet controller), [`replicaset`] (the ReplicaSet controller),
//!   [`disruption`] (a PodDisruptionBudget's status),
//!   [`kubelet`] (one pod's next status),
//!   [`heartbeat`] (when each kubelet renews its Lease and reports its status), [`churn`] (unrelated
//!   changes to nodes, spread over each second),
//!   [`node_features`] (the labels and annotations NFD, the cloud and the control plane put on a node),
//!   [`host`] (what a node's host has and advertises), [`sharing`] (GPU sharing per resource, as the
//!   device plugin and feature discovery apply it), [`operands`] (operand configuration read through the
//!   images' contract), [`progress`] (what a person watching sees).
//! - I/O: [`simulation`] (a running cluster and scenario actions), [`actors`] (controllers, scheduler,
//!   kubelets), [`proc_stats`] (a process's CPU time and peak memory from `/proc`), and the commands [`demo`], [`up`], [`serve`], [`chaos`], [`bench`], [`cluster_bench`] and
//!   [`upgrade_bench`].

pub mod actors;
pub mod bench;
pub mod chaos;
pub mod churn;
pub mod cli;
pub mod cluster_bench;
pub mod cluster_spec;
pub mod daemonset;
pub mod demo;
pub mod disruption;
pub mod hardware;
pub mod heartbeat;
pub mod host;
pub mod kubelet;
pub mod node_features;
pub mod operands;
pub mod proc_stats;
pub mod progress;
pub mod real_bench;
pub mod replicaset;
pub mod scenario;
pub mod serve;
pub mod sharing;
pub mod simulation;
pub mod spec_file;
pub mod up;
pub mod upgrade_bench;
pub mod workload;

use cli::{Bench, Cli, Command};

/// The `User-Agent` of every client the simulator makes, in process or from a kubeconfig: API server audit
/// logs, request metrics and the fake server's request accounting tell its requests from the operator's
/// (`gpuop_operator::USER_AGENT`) and from people's.
pub const USER_AGENT: &str = concat!("gpu-sim/", env!("CARGO_PKG_VERSION"));

/// The product token of a `User-Agent` (`gpu-sim/0.1.0` → `gpu-sim`): what the fake server's request
/// accounting matches a client by (`writes_by`, `by_client`), so counts hold across versions.
pub fn product_token(user_agent: &str) -> &str {
    user_agent.split('/').next().unwrap_or(user_agent)
}

/// Whether logs on stderr are coloured: only on a terminal, and never when `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>), so that files, pipes and CI logs get plain text.
pub fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// The process's exit status for a command's result: a failure is one line on stderr, `error: ` and the
/// causes joined by `: `, never a backtrace (`RUST_BACKTRACE` is for bugs, and these are a user's mistakes
/// or the environment's).
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", one_line(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes joined by `: `, leaving out a cause its effect's message already ends with
/// (errors that both print their source and return it, as many do).
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Runs a `gpu-sim` command to completion.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let default_level = if matches!(cli.command, Command::Demo(_) | Command::Chaos(_)) {
        "warn"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_ansi(colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()),
        )
        .with_ansi(gpuop_operator::cli::log_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => {
                let timing = if args.instant {
                    kubelet::Timing::instant()
                } else {
                    kubelet::Timing::demo()
                };
                demo::demo(demo::DemoSettings {
                    deadline: std::time::Duration::from_secs(args.deadline_seconds),
                    timing,
                })
                .await
            }
            Command::Up(args) => up::up(args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Chaos(args) => chaos::chaos(args).await,
            Command::Bench(Bench::Apiserver(args)) => bench::apiserver(args).await,
            Command::Bench(Bench::Nodes(args)) => cluster_bench::nodes(args).await,
            Command::Bench(Bench::Converge(args)) if args.real_control_plane => {
                real_bench::converge(args).await
            }
            Command::Bench(Bench::Converge(args)) => cluster_bench::converge(args).await,
            Command::Bench(Bench::Upgrade(args)) if args.real_control_plane => {
                real_bench::upgrade(args).await
            }
            Command::Bench(Bench::Upgrade(args)) => upgrade_bench::upgrade(args).await,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_one_line_without_repeated_causes() {
        let io = std::io::Error::other("namespaces \"ops\" not found");
        let error = anyhow::Error::new(io)
            .context("x.yaml: ConfigMap \"c\": namespaces \"ops\" not found")
            .context("--load");
        assert_eq!(
            one_line(&error),
            r#"--load: x.yaml: ConfigMap "c": namespaces "ops" not found"#
        );
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None), "a pipe or a file gets plain text");
    }
}
