//! `gpu-operator`: the GPU operator's command line. See `gpu-operator --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    gpuop_operator::cli::main()
}
