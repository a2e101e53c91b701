//! `kubectl-gpu`: the GPU operator's doctor. See `kubectl gpu --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    gpuop_doctor::cli::main()
}
