//! `gpu-sim`: see `gpu-sim --help`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    gpuop_sim::exit_code(gpuop_sim::run(gpuop_sim::cli::Cli::parse()))
}
