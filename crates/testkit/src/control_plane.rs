//! A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, each its own process, started from a directory of binaries on free loopback ports in a
//! temporary directory, and killed when the [`ControlPlane`] is dropped (also when the test panics).
//!
//! The API server authenticates static bearer tokens (an admin in `system:masters`) and service-account
//! tokens it signs itself (the TokenRequest API works), authorizes with `Node,RBAC`, and writes an audit log
//! of every request at level `Metadata` ([`crate::audit`]). The controller manager runs every default
//! controller with a service account per controller, as kubeadm sets it up, so that the node lifecycle,
//! garbage collector, DaemonSet, disruption and namespace controllers have exactly their upstream
//! permissions. There is no kubelet: the simulator plays the nodes.
//!
//! Two layouts of [`BINARIES_VAR`] are accepted: the upstream names a Kubernetes release ships
//! (`kube-apiserver`, `kube-controller-manager`, `kube-scheduler`) or the one program `kube` of
//! `shared/k8s` (`kube apiserver|controller-manager|scheduler`), each beside an `etcd`: upstream etcd, or
//! the four-flag embedded etcd of `shared/k8s`.

use std::fmt::Write as _;
use std::io::Read as _;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::BINARIES_VAR;
use crate::audit::AuditLog;
use crate::error::{Error, client_error, io};

/// How long each component may take to answer after it starts. Generous: two cores, and the tests of a
/// binary start several control planes at once.
const START_PATIENCE: Duration = Duration::from_secs(180);

/// Lines of a component's log quoted when it does not start.
const LOG_TAIL_LINES: usize = 25;

/// The programs of a control plane.
#[derive(Clone, Debug)]
pub struct Binaries {
    kube: Kube,
    etcd: PathBuf,
    /// Whether `etcd` is upstream's (`--listen-client-urls` and friends) rather than the four-flag one.
    upstream_etcd: bool,
}

#[derive(Clone, Debug)]
enum Kube {
    /// `kube apiserver|controller-manager|scheduler FLAGS`.
    OneProgram(PathBuf),
    /// Upstream's three programs.
    Upstream {
        apiserver: PathBuf,
        controller_manager: PathBuf,
        scheduler: PathBuf,
    },
}

/// The control plane's components.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Component {
    Etcd,
    Apiserver,
    ControllerManager,
    Scheduler,
}

impl Component {
    fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::Apiserver => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
        }
    }
}

impl Binaries {
    /// The binaries in the directory [`BINARIES_VAR`] names.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var_os(BINARIES_VAR) {
            Some(dir) if !dir.is_empty() => Self::in_dir(Path::new(&dir)),
            _ => Err(Error::Unset),
        }
    }

    /// The binaries in `dir`, in either layout.
    pub fn in_dir(dir: &Path) -> Result<Self, Error> {
        let problem = |problem: String| Error::Binaries {
            dir: dir.to_owned(),
            problem,
        };
        if !dir.is_dir() {
            return Err(problem("not a directory".into()));
        }
        let executable = |name: &str| {
            let path = dir.join(name);
            let mode = std::fs::metadata(&path).ok().map(|m| m.permissions().mode());
            mode.is_some_and(|mode| mode & 0o111 != 0).then_some(path)
        };
        let kube = if let Some(one) = executable("kube") {
            Kube::OneProgram(one)
        } else {
            let found = ["kube-apiserver", "kube-controller-manager", "kube-scheduler"].map(executable);
            match found {
                [Some(apiserver), Some(controller_manager), Some(scheduler)] => Kube::Upstream {
                    apiserver,
                    controller_manager,
                    scheduler,
                },
                _ => {
                    let archived = std::fs::read_dir(dir).ok().and_then(|entries| {
                        entries.flatten().map(|e| e.file_name()).find(|name| {
                            name.to_str()
                                .is_some_and(|n| n.starts_with("kube-") && n.ends_with(".tar.xz"))
                        })
                    });
                    let hint = archived.map_or_else(String::new, |name| {
                        format!(
                            " ({} is an archive: unpack it with `tar -xJf {} -C DIR` and name DIR)",
                            name.to_string_lossy(),
                            dir.join(&name).display()
                        )
                    });
                    return Err(problem(format!(
                        "no executable kube-apiserver, kube-controller-manager and kube-scheduler, nor one \
                         `kube` program{hint}"
                    )));
                }
            }
        };
        let etcd = executable("etcd").ok_or_else(|| problem("no executable etcd".into()))?;
        let help = Command::new(&etcd)
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| problem(format!("cannot run {}: {e}", etcd.display())))?;
        let upstream_etcd = [help.stdout, help.stderr]
            .iter()
            .any(|text| String::from_utf8_lossy(text).contains("listen-client-urls"));
        Ok(Self {
            kube,
            etcd,
            upstream_etcd,
        })
    }

    /// The program and its first arguments for a component.
    fn command(&self, component: Component) -> (PathBuf, Vec<String>) {
        let sub = match component {
            Component::Etcd => return (self.etcd.clone(), Vec::new()),
            Component::Apiserver => "apiserver",
            Component::ControllerManager => "controller-manager",
            Component::Scheduler => "scheduler",
        };
        match &self.kube {
            Kube::OneProgram(path) => (path.clone(), vec![sub.to_owned()]),
            Kube::Upstream {
                apiserver,
                controller_manager,
                scheduler,
            } => {
                let path = match component {
                    Component::ControllerManager => controller_manager,
                    Component::Scheduler => scheduler,
                    Component::Etcd | Component::Apiserver => apiserver,
                };
                (path.clone(), Vec::new())
            }
        }
    }
}

/// One running component.
#[derive(Debug)]
struct Process {
    component: Component,
    binary: PathBuf,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Why it is not running, if it is not.
    fn exited(&mut self) -> Option<Error> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(self.failure(format!("exited with {status}"))),
            Err(error) => Some(self.failure(format!("cannot be waited for: {error}"))),
        }
    }

    fn failure(&self, what: String) -> Error {
        Error::NotStarted {
            component: self.component.name(),
            binary: self.binary.clone(),
            what,
            log: self.log.clone(),
            tail: log_tail(&self.log),
        }
    }
}

/// The last [`LOG_TAIL_LINES`] lines of a log, for an error message.
pub(crate) fn log_tail(log: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(log) {
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_ok() {
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(LOG_TAIL_LINES);
    let tail = lines.get(from..).unwrap_or_default().join("\n");
    if tail.is_empty() {
        "(empty)".to_owned()
    } else {
        tail
    }
}

/// A running control plane. Dropping it kills every process it started and removes its directory, unless
/// the thread is panicking (a failed test): then the directory is kept and its path printed.
pub struct ControlPlane {
    processes: Vec<Process>,
    /// Leads the process group every component joins, and kills that group once the test process is gone,
    /// so that a test killed outright (a timeout's SIGKILL, which runs no `Drop`) leaves nothing running.
    watchdog: Child,
    url: String,
    ca_pem: String,
    admin_token: String,
    admin: std::sync::OnceLock<kube::Client>,
    audit: AuditLog,
    /// Declared last: removed after the processes that write into it are gone.
    dir: tempfile::TempDir,
}

/// The control plane's files, made before anything starts.
struct Files {
    ca_pem: String,
    admin_token: String,
}

impl ControlPlane {
    /// Starts a control plane from the binaries [`BINARIES_VAR`] names.
    pub async fn from_env() -> Result<Self, Error> {
        Self::start(&Binaries::from_env()?).await
    }

    /// Starts a control plane from `binaries` and waits until it serves: the API server ready, and the
    /// controller manager's service-account controller at work (every namespace has its `default`
    /// ServiceAccount, which pods need). A port found free and taken by another process before a component
    /// bound it (control planes starting side by side, clients' ephemeral ports) costs a fresh start on
    /// other ports, up to [`START_ATTEMPTS`] in all.
    pub async fn start(binaries: &Binaries) -> Result<Self, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(binaries).await {
                Err(error) if attempt < START_ATTEMPTS && error.is_port_taken() => attempt += 1,
                outcome => return outcome,
            }
        }
    }

    async fn start_once(binaries: &Binaries) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("control-plane-")
            .tempdir()
            .map_err(io("making the control plane's directory"))?;
        let root = dir.path().to_owned();
        for sub in ["pki", "logs", "etcd"] {
            std::fs::create_dir_all(root.join(sub)).map_err(io(format!("making {sub}/")))?;
        }
        let files = write_files(&root)?;
        let [etcd_port, peer_port, api_port, kcm_port, scheduler_port] = free_ports()?;
        let url = format!("https://127.0.0.1:{api_port}");
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -KILL 0",
                std::process::id()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(io("starting the control plane's watchdog (sh)"))?;
        let mut plane = Self {
            processes: Vec::new(),
            watchdog,
            url,
            ca_pem: files.ca_pem,
            admin_token: files.admin_token,
            admin: std::sync::OnceLock::new(),
            audit: AuditLog::new(root.join("audit.log")),
            dir,
        };
        for (name, token) in [
            ("controller-manager", CONTROLLER_MANAGER),
            ("scheduler", SCHEDULER),
        ] {
            let path = root.join(format!("{name}.kubeconfig"));
            std::fs::write(&path, plane.kubeconfig(&token_of(&root, token)?))
                .map_err(io(format!("writing {}", path.display())))?;
        }

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let data = root.join("etcd");
        let etcd_args = if binaries.upstream_etcd {
            vec![
                "--name=default".to_owned(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync".to_owned(),
            ]
        } else {
            vec![
                format!("--data-dir={}", data.display()),
                format!("--client-url={etcd_url}"),
                format!("--peer-url={peer_url}"),
                "--unsafe-no-fsync".to_owned(),
            ]
        };
        plane.spawn(binaries, Component::Etcd, etcd_args)?;
        plane
            .wait_for(Component::Etcd, || {
                let healthy = etcd_healthy(etcd_port);
                async move { healthy }
            })
            .await?;

        let pki = root.join("pki");
        let pki = |file: &str| pki.join(file).display().to_string();
        plane.spawn(
            binaries,
            Component::Apiserver,
            vec![
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".to_owned(),
                "--advertise-address=127.0.0.1".to_owned(),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={}", pki("apiserver.crt")),
                format!("--tls-private-key-file={}", pki("apiserver.key")),
                format!("--client-ca-file={}", pki("ca.crt")),
                format!("--token-auth-file={}", root.join("tokens.csv").display()),
                "--authorization-mode=Node,RBAC".to_owned(),
                "--allow-privileged=true".to_owned(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
                format!("--service-account-key-file={}", pki("sa.pub")),
                format!("--service-account-signing-key-file={}", pki("sa.key")),
                "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
                format!("--audit-log-path={}", plane.audit.path().display()),
                format!("--audit-policy-file={}", pki("audit-policy.yaml")),
                "--audit-log-maxsize=0".to_owned(),
                "--audit-log-maxbackup=0".to_owned(),
                "--audit-log-format=json".to_owned(),
                "--audit-log-mode=batch".to_owned(),
                "--audit-log-batch-max-wait=1s".to_owned(),
                "--v=1".to_owned(),
            ],
        )?;
        let admin = plane.admin().await?;
        plane
            .wait_for(Component::Apiserver, || {
                let admin = admin.clone();
                async move {
                    let request = http::Request::get("/readyz").body(Vec::new());
                    match request {
                        Ok(request) => admin.request_text(request).await.is_ok_and(|text| text == "ok"),
                        Err(_) => false,
                    }
                }
            })
            .await?;

        let kubeconfig = |name: &str| root.join(format!("{name}.kubeconfig")).display().to_string();
        let kcm = kubeconfig("controller-manager");
        plane.spawn(
            binaries,
            Component::ControllerManager,
            vec![
                format!("--kubeconfig={kcm}"),
                format!("--authentication-kubeconfig={kcm}"),
                format!("--authorization-kubeconfig={kcm}"),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={kcm_port}"),
                format!("--cert-dir={}", root.join("controller-manager-certs").display()),
                "--leader-elect=false".to_owned(),
                "--controllers=*".to_owned(),
                // Each controller as its own ServiceAccount, with its upstream role: the manager's own user
                // may not update nodes, delete dependents or evict.
                "--use-service-account-credentials=true".to_owned(),
                format!("--service-account-private-key-file={}", pki("sa.key")),
                format!("--root-ca-file={}", pki("ca.crt")),
                "--kube-api-qps=500".to_owned(),
                "--kube-api-burst=1000".to_owned(),
                "--v=1".to_owned(),
            ],
        )?;
        let scheduler = kubeconfig("scheduler");
        plane.spawn(
            binaries,
            Component::Scheduler,
            vec![
                format!("--kubeconfig={scheduler}"),
                format!("--authentication-kubeconfig={scheduler}"),
                format!("--authorization-kubeconfig={scheduler}"),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={scheduler_port}"),
                "--leader-elect=false".to_owned(),
                "--kube-api-qps=500".to_owned(),
                "--kube-api-burst=1000".to_owned(),
                "--v=1".to_owned(),
            ],
        )?;
        plane
            .wait_for(Component::ControllerManager, || {
                let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
                async move { accounts.get_opt("default").await.is_ok_and(|sa| sa.is_some()) }
            })
            .await?;
        Ok(plane)
    }

    fn spawn(&mut self, binaries: &Binaries, component: Component, args: Vec<String>) -> Result<(), Error> {
        let (binary, mut full) = binaries.command(component);
        full.extend(args);
        let log = self
            .dir
            .path()
            .join("logs")
            .join(format!("{}.log", component.name()));
        let file = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let stderr = file
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let child = Command::new(&binary)
            .args(&full)
            .current_dir(self.dir.path())
            .process_group(self.watchdog.id().try_into().unwrap_or(0))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        self.processes.push(Process {
            component,
            binary,
            child,
            log,
        });
        Ok(())
    }

    /// Waits until `answers` says the component serves, failing early when any component exits.
    async fn wait_for<F, Fut>(&mut self, component: Component, mut answers: F) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let started = Instant::now();
        loop {
            if let Some(error) = self.processes.iter_mut().find_map(Process::exited) {
                return Err(error);
            }
            if answers().await {
                return Ok(());
            }
            if started.elapsed() > START_PATIENCE {
                let process = self
                    .processes
                    .iter()
                    .find(|p| p.component == component)
                    .unwrap_or_else(|| unreachable!("{component:?} is waited for after it started"));
                return Err(process.failure(format!("did not answer within {START_PATIENCE:?}")));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory holding the control plane's files: `logs/`, `pki/`, `audit.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin's bearer token (user `admin` in `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Every request answered so far, from the audit log once it has caught up ([`AuditLog::settled`]).
    pub async fn requests_so_far(&self) -> Result<Vec<crate::AuditEvent>, Error> {
        self.audit.settled(&self.admin().await?).await
    }

    /// A kubeconfig for this API server whose user presents `token`.
    pub fn kubeconfig(&self, token: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: control-plane
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: user
  user:
    token: {token}
contexts:
- name: control-plane
  context: {{cluster: control-plane, user: user}}
current-context: control-plane
",
            url = self.url
        )
    }

    /// A client presenting `token`, its requests sent with `User-Agent: <agent>` where one is given.
    pub async fn client_with(&self, token: &str, agent: Option<&str>) -> Result<kube::Client, Error> {
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig(token))
            .map_err(|e| client_error("reading the control plane's kubeconfig")(e.into()))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| client_error("reading the control plane's kubeconfig")(e.into()))?;
        // The fake server's in-process clients have no retry layer; the operator turns kube's off too
        // (`gpuop_operator::cli::configure`): a 429 reaches the caller at once on both backends.
        config.default_retry = false;
        if let Some(agent) = agent {
            let agent = http::HeaderValue::from_str(agent)
                .map_err(|e| client_error(format!("user agent {agent:?}"))(e.into()))?;
            config.headers.push((http::header::USER_AGENT, agent));
        }
        kube::Client::try_from(config).map_err(|e| client_error("building a client")(e.into()))
    }

    /// The admin's client (one, shared: its connections are reused).
    pub async fn admin(&self) -> Result<kube::Client, Error> {
        if let Some(admin) = self.admin.get() {
            return Ok(admin.clone());
        }
        let admin = self.client_with(&self.admin_token, None).await?;
        Ok(self.admin.get_or_init(|| admin).clone())
    }

    /// A token for the ServiceAccount `namespace/name`, valid for an hour, from the TokenRequest API, as a
    /// pod's projected token is.
    pub async fn token_for(&self, namespace: &str, name: &str) -> Result<String, Error> {
        request_token(self.admin().await?, namespace, name).await
    }

    /// A client acting as the ServiceAccount `namespace/name`, with `User-Agent: <agent>` where one is given.
    pub async fn client_for_service_account(
        &self,
        namespace: &str,
        name: &str,
        agent: Option<&str>,
    ) -> Result<kube::Client, Error> {
        let token = self.token_for(namespace, name).await?;
        self.client_with(&token, agent).await
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url)
            .field("dir", &self.dir.path())
            .field("processes", &self.processes)
            .finish_non_exhaustive()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Newest first: the scheduler and controller manager before the API server, etcd last.
        for process in self.processes.iter_mut().rev() {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        // A failed test keeps the logs, the audit log and the certificates for whoever reads why.
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!(
                "the control plane's files (logs/, audit.log, pki/) are kept in {}",
                self.dir.path().display()
            );
        }
    }
}

/// A token for the ServiceAccount `namespace/name`, valid for an hour, that `client` requests from the
/// TokenRequest API as the kubelet does for a pod's projected token; on any API server, fake or real.
pub async fn request_token(client: kube::Client, namespace: &str, name: &str) -> Result<String, Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
    let mut request = TokenRequest::default();
    request.spec.expiration_seconds = Some(3600);
    let granted = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(|e| client_error(format!("requesting a token for {namespace}/{name}"))(e.into()))?;
    granted
        .status
        .map(|s| s.token)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| Error::Client {
            what: format!("the TokenRequest for {namespace}/{name}"),
            source: "answered without a token".into(),
        })
}

/// How many times [`ControlPlane::start`] tries when a port it picked was taken meanwhile.
const START_ATTEMPTS: u32 = 3;

/// Static tokens' users besides the admin.
const CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
const SCHEDULER: &str = "system:kube-scheduler";

/// The token of a static user, from `tokens.csv`.
fn token_of(root: &Path, user: &str) -> Result<String, Error> {
    let path = root.join("tokens.csv");
    let text = std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
    text.lines()
        .find_map(|line| {
            let mut fields = line.split(',');
            let token = fields.next()?;
            (fields.next() == Some(user)).then(|| token.to_owned())
        })
        .ok_or_else(|| Error::Io {
            what: format!("{} has no token for {user}", path.display()),
            source: std::io::ErrorKind::NotFound.into(),
        })
}

/// Writes the certificates, the service-account key, the tokens and the audit policy.
fn write_files(root: &Path) -> Result<Files, Error> {
    let pki = root.join("pki");
    let write = |name: &str, text: &str| {
        let path = pki.join(name);
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))
    };

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "gpuop-testkit-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
        "10.96.0.1".to_owned(),
    ])?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving_key = KeyPair::generate()?;
    let serving_cert = serving.signed_by(&serving_key, &ca)?;
    let sa_key = KeyPair::generate()?;

    write("ca.crt", &ca.pem())?;
    write("apiserver.crt", &serving_cert.pem())?;
    write("apiserver.key", &serving_key.serialize_pem())?;
    write("sa.key", &sa_key.serialize_pem())?;
    write("sa.pub", &sa_key.public_key_pem())?;
    write(
        "audit-policy.yaml",
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: Metadata\n",
    )?;

    let admin_token = random_token(root)?;
    let mut tokens = format!("{admin_token},admin,admin,\"system:masters\"\n");
    for (user, uid) in [(CONTROLLER_MANAGER, "kcm"), (SCHEDULER, "scheduler")] {
        let _ = writeln!(tokens, "{},{user},{uid}", random_token(root)?);
    }
    let path = root.join("tokens.csv");
    std::fs::write(&path, tokens).map_err(io(format!("writing {}", path.display())))?;
    Ok(Files {
        ca_pem: ca.pem(),
        admin_token,
    })
}

/// 32 hex digits from the system's random source.
fn random_token(root: &Path) -> Result<String, Error> {
    let mut bytes = [0_u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(io(format!(
            "reading /dev/urandom for {}'s tokens",
            root.display()
        )))?;
    Ok(bytes.iter().fold(String::new(), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    }))
}

/// Whether the etcd on `port` says it is healthy (`GET /health`): a bare connect could reach another
/// process that took a port between [`free_ports`] and etcd's start.
fn etcd_healthy(port: u16) -> bool {
    use std::io::Write as _;
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}

/// Free loopback ports, held together while they are picked so that no two are the same.
fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io("finding free loopback ports"))?;
    let mut ports = [0_u16; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(io("reading a loopback port"))?
            .port();
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_binaries(names: &[&str], etcd_help: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temporary directory");
        for name in names {
            let path = dir.path().join(name);
            let script = if *name == "etcd" {
                format!("#!/bin/sh\necho '{etcd_help}'\n")
            } else {
                "#!/bin/sh\nexit 1\n".to_owned()
            };
            std::fs::write(&path, script).expect("script written");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("made executable");
        }
        dir
    }

    #[test]
    fn both_layouts_are_found_and_etcd_flavours_told_apart() {
        let one = fake_binaries(&["kube", "etcd"], "-client-url string");
        let binaries = Binaries::in_dir(one.path()).expect("the shared/k8s layout");
        assert!(!binaries.upstream_etcd);
        let (program, args) = binaries.command(Component::ControllerManager);
        assert_eq!(program, one.path().join("kube"));
        assert_eq!(args, ["controller-manager"]);

        let upstream = fake_binaries(
            &[
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "etcd",
            ],
            "--listen-client-urls 'http://localhost:2379'",
        );
        let binaries = Binaries::in_dir(upstream.path()).expect("the upstream layout");
        assert!(binaries.upstream_etcd);
        let (program, args) = binaries.command(Component::Scheduler);
        assert_eq!(program, upstream.path().join("kube-scheduler"));
        assert!(args.is_empty());
    }

    #[test]
    fn a_missing_binary_is_named_with_the_directory() {
        let dir = fake_binaries(&["kube-apiserver", "kube-scheduler", "etcd"], "");
        let error = Binaries::in_dir(dir.path())
            .expect_err("no controller manager")
            .to_string();
        assert!(error.contains(&dir.path().display().to_string()), "{error}");
        assert!(error.contains("kube-controller-manager"), "{error}");

        std::fs::write(dir.path().join("kube-v1.36.2.tar.xz"), "").expect("archive written");
        let error = Binaries::in_dir(dir.path())
            .expect_err("an archive only")
            .to_string();
        assert!(error.contains("unpack it with `tar -xJf"), "{error}");

        let no_etcd = fake_binaries(&["kube"], "");
        let error = Binaries::in_dir(no_etcd.path()).expect_err("no etcd").to_string();
        assert!(error.contains("no executable etcd"), "{error}");
    }

    #[tokio::test]
    async fn a_component_that_exits_fails_the_start_with_its_log() {
        // Every program exits at once with a line on stderr: etcd is the first to be waited for.
        let dir = fake_binaries(&["kube"], "");
        let etcd = dir.path().join("etcd");
        std::fs::write(
            &etcd,
            "#!/bin/sh\n[ \"$1\" = --help ] && exit 0\necho 'etcd: cannot bind' >&2\nexit 3\n",
        )
        .expect("script written");
        std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).expect("made executable");
        let binaries = Binaries::in_dir(dir.path()).expect("binaries found");
        let error = ControlPlane::start(&binaries)
            .await
            .expect_err("etcd exits")
            .to_string();
        assert!(error.starts_with("etcd ("), "{error}");
        assert!(error.contains("exited with exit status: 3"), "{error}");
        assert!(error.contains("etcd: cannot bind"), "{error}");
    }

    /// The control plane the other tests stand on: a ServiceAccount's token works and has exactly its
    /// bindings' rights, the controllers act as their own ServiceAccounts (the TTL controller annotates a
    /// new node, and no controller is refused anything), and the audit log counts every request by user
    /// and agent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "on a real control plane: set KUBE_BINARIES and run `cargo test -- --ignored real_control_plane`"]
    async fn serves_tokens_rbac_controllers_and_audit_real_control_plane() {
        use k8s_openapi::api::core::v1::{Namespace, Node};
        use kube::api::ListParams;

        let plane = ControlPlane::from_env().await.unwrap_or_else(|e| panic!("{e}"));
        let admin = plane.admin().await.expect("admin client");
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some("probe".into());
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace created");

        // The namespace's `default` ServiceAccount comes from the controller manager; its token has no rights.
        let mut tries = 0;
        let account = loop {
            match plane
                .client_for_service_account("probe", "default", Some("probe-agent"))
                .await
            {
                Ok(client) => break client,
                Err(_) if tries < 100 => tries += 1,
                Err(error) => panic!("{error}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let nodes: Api<Node> = Api::all(account);
        let refused = nodes
            .list(&ListParams::default())
            .await
            .expect_err("no right to list nodes");
        assert!(
            matches!(refused, kube::Error::Api(ref s) if s.code == 403),
            "{refused:?}"
        );

        // A controller acts as its own ServiceAccount: the TTL controller annotates a new node, a write the
        // controller manager's own user may not make.
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "quiet"}
        }))
        .expect("a node");
        let admin_nodes: Api<Node> = Api::all(admin.clone());
        admin_nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node created");
        let started = Instant::now();
        loop {
            let node = admin_nodes.get("quiet").await.expect("node read");
            if node
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("node.alpha.kubernetes.io/ttl")
            {
                break;
            }
            assert!(
                started.elapsed() < START_PATIENCE,
                "the TTL controller never annotated the node"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let events = plane.audit().settled(&admin).await.expect("the audit log reads");
        let refusal = events
            .iter()
            .find(|e| e.by_agent("probe-agent") && e.attrs.resource == "nodes")
            .expect("the refused list is in the audit log");
        assert_eq!(
            (
                refusal.user.name.as_str(),
                refusal.attrs.verb.as_str(),
                refusal.code
            ),
            ("system:serviceaccount:probe:default", "list", 403)
        );
        let annotated = events
            .iter()
            .find(|e| e.attrs.resource == "nodes" && e.attrs.name == "quiet" && e.attrs.verb == "patch")
            .expect("the node's annotation is in the audit log");
        assert_eq!(
            annotated.user.name,
            "system:serviceaccount:kube-system:ttl-controller"
        );
        let refused: Vec<_> = events
            .iter()
            .filter(|e| {
                e.code == 403
                    && (e.user.name == CONTROLLER_MANAGER
                        || e.user.name.starts_with("system:serviceaccount:kube-system:"))
            })
            .map(|e| format!("{} {} {}", e.user.name, e.attrs.verb, e.attrs.resource))
            .collect();
        assert!(refused.is_empty(), "controllers were refused: {refused:?}");
    }
}
