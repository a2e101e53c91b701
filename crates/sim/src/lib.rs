//! The simulated cluster around the fake API server, from the command line (`gpu-sim`).
//!
//! Today: `gpu-sim serve` runs the fake API server on loopback with a kubeconfig for kubectl and the
//! project's binaries, and `gpu-sim bench apiserver` measures it at scale (the numbers in `BENCHMARKS.md`).

pub mod bench;
pub mod cli;
pub mod serve;

use cli::{Bench, Cli, Command};

/// Runs a `gpu-sim` command to completion.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::serve(args).await,
            Command::Bench(Bench::Apiserver(args)) => bench::apiserver(args).await,
        }
    })
}
