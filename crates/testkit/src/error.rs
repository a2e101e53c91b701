//! Why the test kit could not start or read what a test needs.

use std::path::PathBuf;

use crate::BINARIES_VAR;
use crate::nvidia::NVIDIA_OPERATOR_VAR;

/// Why a control plane could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The variable naming the binaries is not set.
    #[error(
        "{BINARIES_VAR} is not set: set it to a directory holding kube-apiserver, kube-controller-manager, \
         kube-scheduler and etcd from a Kubernetes release (or the `kube` and `etcd` unpacked from \
         shared/k8s/kube-*.tar.xz) to run the tests on a real control plane"
    )]
    Unset,
    /// A binary is missing or not executable.
    #[error("{BINARIES_VAR}={dir}: {problem}", dir = .dir.display())]
    Binaries {
        /// The directory named.
        dir: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The variable naming NVIDIA's operator is not set.
    #[error(
        "{NVIDIA_OPERATOR_VAR} is not set: set it to the directory scripts/nvidia-operator prints (NVIDIA's \
         operator unpacked from shared/nvidia, its manifests copied to /opt/gpu-operator)"
    )]
    NvidiaUnset,
    /// NVIDIA's operator is not where the variable says, or its manifests are not installed.
    #[error("{NVIDIA_OPERATOR_VAR}={dir}: {problem}", dir = .dir.display())]
    Nvidia {
        /// The directory named.
        dir: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A component exited, or did not answer in time.
    #[error(
        "{component} ({binary}) {what}; the last lines of {log}:\n{tail}",
        binary = .binary.display(),
        log = .log.display()
    )]
    NotStarted {
        /// `etcd`, `kube-apiserver`, ...
        component: &'static str,
        /// The program run.
        binary: PathBuf,
        /// `exited with exit status: 1`, `did not answer within 180s`, ...
        what: String,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// Files of the control plane could not be written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key could not be made.
    #[error("making the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    /// A client of the control plane could not be made, or a request it sent failed.
    #[error("{what}: {source}")]
    Client {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// Whether a component could not bind its port: another process took it after it was found free.
    pub(crate) fn is_port_taken(&self) -> bool {
        matches!(self, Error::NotStarted { tail, .. } if tail.contains("address already in use"))
    }
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

pub(crate) fn client_error(
    what: impl Into<String>,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> Error {
    let what = what.into();
    move |source| Error::Client { what, source }
}
