//! `gpu-sim`: see `gpu-sim --help`.

use clap::Parser;

/// The fake server and the simulated cluster make and drop small JSON values all the time; glibc's malloc
/// spent about 40% of the process's CPU on them (`perf`, `gpu-sim bench converge --nodes 1000`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    gpuop_sim::exit_code(gpuop_sim::run(gpuop_sim::cli::Cli::parse()))
}
