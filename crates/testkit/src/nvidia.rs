//! NVIDIA's GPU Operator as an oracle: its binary, built from NVIDIA's source (`shared/nvidia`, unpacked by
//! `scripts/nvidia-operator`), run against a [`ControlPlane`] as the admin, so that a test or benchmark
//! reads what NVIDIA's operator really creates for an input instead of what someone derived from its code.
//!
//! The binary reads its operands' manifests from [`ASSETS`] (a path compiled into it), so that folder must
//! hold the archive's `opt/gpu-operator`; [`NvidiaOperator::from_env`] checks that it does.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::control_plane::ControlPlane;
use crate::error::{Error, client_error, io};

/// The environment variable naming the unpacked archive of NVIDIA's operator (`scripts/nvidia-operator`
/// prints it): `gpu-operator`, `chart/`, `opt/gpu-operator/`.
pub const NVIDIA_OPERATOR_VAR: &str = "NVIDIA_OPERATOR";

/// Where NVIDIA's binary reads its operands' manifests.
pub const ASSETS: &str = "/opt/gpu-operator";

/// How long NVIDIA's CRDs may take to be established.
const CRD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The user agent NVIDIA's operator sends (controller-runtime's default: the binary's name first).
pub const USER_AGENT: &str = "gpu-operator";

/// The images NVIDIA's chart gives the operator's Deployment for operands a policy leaves without one.
const IMAGE_ENVIRONMENT: [(&str, &str); 2] = [
    ("VALIDATOR_IMAGE", "nvcr.io/nvidia/gpu-operator:v26.7.0"),
    (
        "DRIVER_MANAGER_IMAGE",
        "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
    ),
];

/// NVIDIA's operator, unpacked.
#[derive(Clone, Debug)]
pub struct NvidiaOperator {
    dir: PathBuf,
}

impl NvidiaOperator {
    /// The operator [`NVIDIA_OPERATOR_VAR`] names, checked: its binary runs, and [`ASSETS`] holds its
    /// manifests.
    pub fn from_env() -> Result<Self, Error> {
        let dir = std::env::var_os(NVIDIA_OPERATOR_VAR).ok_or(Error::NvidiaUnset)?;
        Self::in_dir(Path::new(&dir))
    }

    /// The operator unpacked in `dir`.
    pub fn in_dir(dir: &Path) -> Result<Self, Error> {
        let problem = |problem: String| Error::Nvidia {
            dir: dir.to_owned(),
            problem,
        };
        let binary = dir.join("gpu-operator");
        if !binary.is_file() {
            return Err(problem(format!("no binary {}", binary.display())));
        }
        for manifest in [
            "state-driver/0500_daemonset.yaml",
            "nvidia.com_clusterpolicies.yaml",
        ] {
            let shipped = dir.join("opt/gpu-operator").join(manifest);
            let installed = Path::new(ASSETS).join(manifest);
            match (std::fs::read(&shipped), std::fs::read(&installed)) {
                (Ok(a), Ok(b)) if a == b => {}
                (Err(error), _) => return Err(problem(format!("{}: {error}", shipped.display()))),
                _ => {
                    return Err(problem(format!(
                        "{} is not the archive's opt/gpu-operator (the binary reads its manifests there): \
                         run scripts/nvidia-operator as root",
                        installed.display()
                    )));
                }
            }
        }
        Ok(Self { dir: dir.to_owned() })
    }

    /// Its chart's CustomResourceDefinitions (ClusterPolicy, NVIDIADriver, GPUCluster, ComputeDomain, ...),
    /// one file each.
    pub fn crd_files(&self) -> Result<Vec<PathBuf>, Error> {
        let crds = self.dir.join("chart/crds");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&crds)
            .map_err(io(format!("reading {}", crds.display())))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// Applies its chart's CRDs (server-side, taking over fields another manager set, as Helm's CRD
    /// install would) and waits until the API server serves them: its controllers watch GPUCluster and
    /// ComputeDomain too, and stop when a kind they watch is not served.
    pub async fn install_crds(&self, client: &kube::Client) -> Result<(), Error> {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut names = Vec::new();
        for file in self.crd_files()? {
            let text = std::fs::read_to_string(&file).map_err(io(format!("reading {}", file.display())))?;
            let crd: serde_json::Value = serde_saphyr::from_str(&text)
                .map_err(|e| client_error(format!("parsing {}", file.display()))(e.into()))?;
            let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            api.patch(&name, &PatchParams::apply("helm").force(), &Patch::Apply(&crd))
                .await
                .map_err(|e| client_error(format!("applying NVIDIA's CRD {name}"))(e.into()))?;
            names.push(name);
        }
        let started = std::time::Instant::now();
        for name in &names {
            loop {
                let crd = api
                    .get(name)
                    .await
                    .map_err(|e| client_error(format!("reading the CRD {name}"))(e.into()))?;
                let established = crd
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter().flatten())
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                if started.elapsed() > CRD_PATIENCE {
                    return Err(Error::Client {
                        what: format!("NVIDIA's CRD {name}"),
                        source: format!("not established after {CRD_PATIENCE:?}").into(),
                    });
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Starts it against `plane` as the admin, operating from `namespace` (which must exist), without
    /// leader election; its log goes to `logs/nvidia-operator.log` in the plane's directory. It stops
    /// when the returned value is dropped.
    pub fn start(&self, plane: &ControlPlane, namespace: &str) -> Result<RunningNvidia, Error> {
        let kubeconfig = plane.dir().join("nvidia-operator.kubeconfig");
        std::fs::write(&kubeconfig, plane.kubeconfig(plane.admin_token()))
            .map_err(io(format!("writing {}", kubeconfig.display())))?;
        let log = plane.dir().join("logs/nvidia-operator.log");
        let file = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let stderr = file
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let binary = self.dir.join("gpu-operator");
        let child = Command::new(&binary)
            .args([
                "--metrics-bind-address=127.0.0.1:0",
                "--health-probe-bind-address=127.0.0.1:0",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("OPERATOR_NAMESPACE", namespace)
            .envs(IMAGE_ENVIRONMENT)
            .current_dir(plane.dir())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        Ok(RunningNvidia { child, binary, log })
    }
}

/// NVIDIA's operator, running; killed when dropped.
#[derive(Debug)]
pub struct RunningNvidia {
    child: Child,
    binary: PathBuf,
    log: PathBuf,
}

/// What a process has cost so far, from `/proc`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Its peak resident memory (`VmHWM`), in bytes.
    pub peak_memory: u64,
    /// Its CPU time, user and system, in seconds.
    pub cpu_seconds: f64,
}

impl RunningNvidia {
    /// Why it is not running, if it is not.
    pub fn exited(&mut self) -> Option<Error> {
        let what = match self.child.try_wait() {
            Ok(None) => return None,
            Ok(Some(status)) => format!("exited with {status}"),
            Err(error) => format!("cannot be waited for: {error}"),
        };
        Some(Error::NotStarted {
            component: "NVIDIA's gpu-operator",
            binary: self.binary.clone(),
            what,
            log: self.log.clone(),
            tail: crate::control_plane::log_tail(&self.log),
        })
    }

    /// Its log.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// What it has cost so far.
    pub fn usage(&self) -> Result<Usage, Error> {
        usage_of(self.child.id())
    }
}

impl Drop for RunningNvidia {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What process `pid` has cost so far: its peak resident memory and its CPU time.
pub fn usage_of(pid: u32) -> Result<Usage, Error> {
    let read = |file: &str| -> Result<String, Error> {
        let path = format!("/proc/{pid}/{file}");
        let mut text = String::new();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .map_err(io(format!("reading {path}")))?;
        Ok(text)
    };
    let status = read("status")?;
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    // After the command's closing parenthesis: state, then 10 fields, then utime and stime, in clock
    // ticks (USER_HZ, 100 on Linux).
    let stat = read("stat")?;
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|field| field.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Ok(Usage {
        peak_memory: peak_kib * 1024,
        cpu_seconds: ticks as f64 / 100.0,
    })
}
