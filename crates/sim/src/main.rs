//! `gpu-sim`: see `gpu-sim --help`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    gpuop_sim::run(gpuop_sim::cli::Cli::parse())
}
