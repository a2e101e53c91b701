//! Command-line interface of `gpu-operator`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::check;

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
    /// Print the ClusterPolicy and NVIDIADriver CustomResourceDefinitions as multi-document YAML.
    Crd,
    /// Check ClusterPolicy and NVIDIADriver manifests offline, as the API server and the operator would.
    ///
    /// Every problem is printed with its file, document and field. Images left unset in a policy may come
    /// from the same environment variables the operator reads (DRIVER_IMAGE, DEVICE_PLUGIN_IMAGE, ...).
    /// Exit status: 0 when every object is valid, 1 when any has a problem, 2 when a file cannot be read.
    Check {
        /// Manifest files (YAML, one or more documents each); `-` reads standard input.
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
    },
}

/// Parses the command line and runs the subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(gpuop_api::crd::crds_yaml().as_bytes()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("gpu-operator crd: cannot write: {error}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Check { files } => check::run(&files, &check::image_defaults_from_env()),
    }
}
