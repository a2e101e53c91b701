//! The repository's chart end to end on an API server that enforces RBAC, the fake one and a real control
//! plane, from one test body: `helm install` with the demo cluster's nodes simulated, the operator running
//! as the chart's ServiceAccount until the cluster converges, `helm upgrade` with an outdated CRD (the
//! pre-upgrade hook brings it up to date), and `helm uninstall` (the pre-delete hook, run as the operator's
//! ServiceAccount) leaving no operand object, operator label or Lease behind; and the documented way out
//! when that hook cannot run.
//!
//! No container runs here, so [`Kubelet`] stands in for the chart's pods: it runs what they would run, the
//! `gpu-operator` command line of their containers, in-process, each with a token minted for its pod's
//! ServiceAccount through the TokenRequest API, exactly as a pod's projected token would be. On the fake
//! server, which has no Deployment or Job controller, it also makes the operator's Pod and reports each
//! hook Job's outcome in the Job's status; on a real control plane the real controllers make the Pods and
//! judge the Jobs, and it reports each hook's outcome in its Pod's status as a kubelet would. Any request the
//! chart's RBAC does not allow is refused by the server, so the test fails on it; and every permission the
//! chart grants that no request used must be justified in the chart, next to its rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Parser;
use gpuop_api::ImageDefaults;
use gpuop_fakeserver::authz::rbac::{PolicyRule, RoleKind};
use gpuop_fakeserver::{AuthorizationReport, GrantedRule};
use gpuop_operator::cli::{self, Cli, Command, CrdArgs};
use gpuop_operator::run::{self, Running};
use gpuop_sim::cluster_spec::ClusterSpec;
use gpuop_sim::simulation::Simulation;
use gpuop_testkit::control_plane::request_token;
use gpuop_testkit::{Backend, two_backends};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, ContainerState, ContainerStateTerminated, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, PATIENCE};
use crate::failures::http_get;
use crate::helm::{client, helm_install, helm_ok, run_helm, upgrade};
use crate::operator::playing;

const NAMESPACE: &str = "gpu-operator";
const RELEASE: &str = "gpu-operator";
const OPERATOR: &str = "system:serviceaccount:gpu-operator:gpu-operator";
const CRD_HOOK: &str = "system:serviceaccount:gpu-operator:gpu-operator-upgrade-crd";

/// The repository's chart, as Helm's argument.
fn chart() -> String {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gpu-operator");
    chart.to_str().expect("utf-8 path").to_owned()
}

/// Where the chart goes: an API server enforcing RBAC with the demo cluster's nodes simulated on it, and
/// kubectl and helm pointed at it as its admin.
struct Stage {
    backend: Arc<Backend>,
    cluster: Cluster,
    admin: Client,
    /// The fake server's listener, which kubectl, helm and the operator's clients connect to.
    _served: Option<gpuop_fakeserver::Running>,
    simulation: Simulation,
}

impl Stage {
    /// The stage on `backend`, with Helm at hand.
    async fn on(backend: Backend) -> Self {
        crate::tools::helm();
        let (kubeconfig, served) = match &backend {
            Backend::Fake(server) => {
                let running = server
                    .serve(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
                    .await
                    .expect("the fake server listens");
                (running.kubeconfig().to_owned(), Some(running))
            }
            Backend::Real(plane) => (plane.kubeconfig(plane.admin_token()), None),
        };
        let cluster = Cluster::attached(&kubeconfig);
        let admin = client(&cluster).await;
        let (timing, plays) = playing(&backend);
        let nodes = backend.client_as(gpuop_sim::USER_AGENT).await;
        let simulation = Simulation::start_playing(nodes, ClusterSpec::demo(), timing, plays)
            .await
            .expect("the demo cluster's nodes join");
        Self {
            backend: Arc::new(backend),
            cluster,
            admin,
            _served: served,
            simulation,
        }
    }

    fn kubelet(&self, runs_jobs: bool) -> Kubelet {
        Kubelet::start(
            self.backend.clone(),
            self.admin.clone(),
            self.cluster.kubeconfig(),
            runs_jobs,
        )
    }

    /// Starts a [`Kubelet`] (running hook Jobs when `runs_jobs`), installs the chart with Helm, and waits
    /// until its ClusterPolicy is ready.
    async fn install(&self, chart: &str, runs_jobs: bool) -> Kubelet {
        let kubelet = self.kubelet(runs_jobs);
        helm_install(&self.cluster, RELEASE, chart).await;
        until("the chart's ClusterPolicy is ready", PATIENCE * 3, || async {
            policy_state(&self.admin)
                .await
                .and_then(|state| (state == "ready").then_some(()).ok_or(state))
        })
        .await;
        kubelet
    }

    async fn stop(self) {
        self.simulation.stop().await;
    }
}

/// What [`Kubelet`] saw and did.
#[derive(Default)]
struct Log {
    /// Each hook Job run: its name and whether its command succeeded.
    jobs: Vec<(String, bool)>,
    /// The server's authorization report right after each Job's command ran, while the hook's
    /// ServiceAccount and RBAC still exist (Helm deletes them once the Job succeeds).
    reports: Vec<AuthorizationReport>,
    /// The operator's health endpoint while it runs.
    health: Option<std::net::SocketAddr>,
}

/// Runs the chart's workloads in-process as their ServiceAccounts: the operator while its Deployment
/// exists, and each hook Job's command once, reporting its outcome as the Job controller (on the fake
/// server) or the Job's Pod's kubelet (on a real control plane) would.
struct Kubelet {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    log: Arc<Mutex<Log>>,
}

impl Kubelet {
    /// Runs the operator while its Deployment exists, and each hook Job when `runs_jobs`.
    fn start(backend: Arc<Backend>, admin: Client, kubeconfig: PathBuf, runs_jobs: bool) -> Self {
        let stop = CancellationToken::new();
        let log = Arc::new(Mutex::new(Log::default()));
        let task = tokio::spawn(kubelet(
            backend,
            admin,
            kubeconfig,
            runs_jobs,
            log.clone(),
            stop.clone(),
        ));
        Self { stop, task, log }
    }

    fn log<T>(&self, read: impl FnOnce(&Log) -> T) -> T {
        read(&self.log.lock().unwrap_or_else(PoisonError::into_inner))
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("the kubelet task ends");
    }
}

async fn kubelet(
    backend: Arc<Backend>,
    admin: Client,
    kubeconfig: PathBuf,
    runs_jobs: bool,
    log: Arc<Mutex<Log>>,
    stop: CancellationToken,
) {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    let jobs: Api<Job> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut operator: Option<Running> = None;
    let mut ran: BTreeSet<String> = BTreeSet::new();
    loop {
        let deployment = deployments.get_opt(RELEASE).await.ok().flatten();
        match (deployment, &operator) {
            (Some(deployment), None) => {
                if let Some(pod) = operator_pod(&backend, &admin, &deployment).await {
                    let running = start_operator(&admin, &kubeconfig, &deployment, &pod).await;
                    log.lock().unwrap_or_else(PoisonError::into_inner).health = running.bound.get(1).copied();
                    operator = Some(running);
                }
            }
            (None, Some(_)) => {
                if let Some(running) = operator.take() {
                    running.stop().await;
                }
                log.lock().unwrap_or_else(PoisonError::into_inner).health = None;
            }
            _ => {}
        }
        let listed = if runs_jobs {
            jobs.list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        for job in listed {
            let uid = job.metadata.uid.clone().unwrap_or_default();
            let finished = job
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| !c.is_empty());
            if finished || ran.contains(&uid) {
                continue;
            }
            let name = job.metadata.name.clone().unwrap_or_default();
            // On a real control plane the Job runs in a Pod its controller makes: once that Pod runs.
            let pod = if backend.is_real() {
                match running_pod_of(&admin, &name).await {
                    Some(pod) => Some(pod),
                    None => continue,
                }
            } else {
                None
            };
            ran.insert(uid);
            let succeeded = run_job(&admin, &kubeconfig, &job).await;
            let report = backend.authorization_report().await;
            {
                let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
                log.jobs.push((name.clone(), succeeded));
                log.reports.push(report);
            }
            match pod {
                Some(pod) => finish_pod(&admin, &pod, succeeded).await,
                None => finish_job(&jobs, &name, succeeded).await,
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    if let Some(running) = operator {
        running.stop().await;
    }
}

/// The container of a pod template with its ServiceAccount.
fn container_of(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> (String, Container) {
    let spec = spec.expect("a pod template with a spec");
    let account = spec
        .service_account_name
        .clone()
        .expect("the chart names the pod's ServiceAccount");
    let container = spec.containers.first().cloned().expect("a container");
    (account, container)
}

/// The `gpu-operator` command line of a container (the image's entrypoint is the binary).
fn command_line(container: &Container) -> Cli {
    let args = std::iter::once("gpu-operator".to_owned()).chain(container.args.clone().unwrap_or_default());
    Cli::try_parse_from(args)
        .unwrap_or_else(|error| panic!("the chart's {} arguments: {error}", container.name))
}

async fn start_operator(admin: &Client, kubeconfig: &Path, deployment: &Deployment, pod: &Pod) -> Running {
    let template = deployment.spec.as_ref().map(|s| &s.template);
    let (account, container) = container_of(template.and_then(|t| t.spec.as_ref()));
    let Command::Run(args) = command_line(&container).command else {
        panic!("the chart's Deployment runs `gpu-operator run`");
    };
    let images = ImageDefaults::from_pairs(
        container
            .env
            .iter()
            .flatten()
            .filter_map(|var| var.value.clone().map(|value| (var.name.clone(), value))),
    );
    let mut config = cli::run_config(args, pod.name_any(), images);
    // The Lease the operator holds is owned by its Pod, and goes with it when Helm deletes the Deployment.
    if let Some(election) = config.leader_election.as_mut() {
        election.owner = Some(cli::pod_owner(&pod.name_any(), &pod.uid().unwrap_or_default()));
    }
    // The pod's own ports; in-process, ports the system picks on loopback stand in for them.
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    config.metrics_address = config.metrics_address.map(|_| loopback);
    config.health_address = config.health_address.map(|_| loopback);
    let client = client_as(admin, kubeconfig, &account).await;
    run::start(client, config)
        .await
        .expect("the operator starts as its ServiceAccount")
}

/// A Pod of the operator's Deployment: on a real control plane the one its ReplicaSet made, once there is
/// one; on the fake server (no Deployment controller) one made here as the ReplicaSet would, owned by the
/// Deployment.
async fn operator_pod(backend: &Backend, admin: &Client, deployment: &Deployment) -> Option<Pod> {
    let pods = Api::<Pod>::namespaced(admin.clone(), NAMESPACE);
    let template = deployment
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    if backend.is_real() {
        let selector = template
            .metadata
            .and_then(|m| m.labels)
            .unwrap_or_default()
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",");
        let listed = pods.list(&ListParams::default().labels(&selector)).await.ok()?;
        return listed
            .items
            .into_iter()
            .find(|pod| pod.metadata.deletion_timestamp.is_none());
    }
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("gpu-operator-0".to_owned()),
            labels: template.metadata.and_then(|m| m.labels),
            owner_references: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "apps/v1".to_owned(),
                    kind: "Deployment".to_owned(),
                    name: deployment.name_any(),
                    uid: deployment.uid().unwrap_or_default(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    };
    Some(
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("the operator's Pod"),
    )
}

/// The running Pod of the Job `job`, made by the Job controller and started by a simulated kubelet.
async fn running_pod_of(admin: &Client, job: &str) -> Option<Pod> {
    let pods = Api::<Pod>::namespaced(admin.clone(), NAMESPACE);
    let listed = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .ok()?;
    listed.items.into_iter().find(|pod| {
        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && pod.metadata.deletion_timestamp.is_none()
    })
}

/// Reports a Job's Pod ended, as its kubelet would once the container exits: the Job controller then
/// judges the Job, which is what Helm waits for.
async fn finish_pod(admin: &Client, pod: &Pod, succeeded: bool) {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let (phase, exit_code, reason) = if succeeded {
        ("Succeeded", 0, "Completed")
    } else {
        ("Failed", 1, "Error")
    };
    let mut statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    for status in &mut statuses {
        let started = status
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone());
        status.ready = false;
        status.started = Some(false);
        status.state = Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                reason: Some(reason.to_owned()),
                started_at: started,
                finished_at: Some(now.clone()),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let status = json!({"status": {
        "phase": phase,
        "containerStatuses": statuses,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
        ],
    }});
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&status),
        )
        .await
        .unwrap_or_else(|error| panic!("Pod {} status: {error}", pod.name_any()));
}

async fn run_job(admin: &Client, kubeconfig: &Path, job: &Job) -> bool {
    let template = job.spec.as_ref().map(|s| &s.template);
    let (account, container) = container_of(template.and_then(|t| t.spec.as_ref()));
    let client = client_as(admin, kubeconfig, &account).await;
    let exit = match command_line(&container).command {
        Command::Crd(CrdArgs {
            apply: true,
            timeout_seconds,
        }) => cli::apply_crds(client, timeout_seconds).await,
        Command::Uninstall(args) => cli::uninstall(client, args).await,
        other => panic!("the chart runs {other:?} in a hook Job"),
    };
    exit == ExitCode::SUCCESS
}

/// Marks a Job finished as the Job controller would, which is what Helm waits for.
async fn finish_job(jobs: &Api<Job>, name: &str, succeeded: bool) {
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let status = if succeeded {
        json!({"status": {
            "startTime": now, "completionTime": now, "succeeded": 1,
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                {"type": "Complete", "status": "True", "lastTransitionTime": now},
            ],
        }})
    } else {
        json!({"status": {
            "startTime": now, "failed": 1,
            "conditions": [
                {"type": "FailureTarget", "status": "True", "lastTransitionTime": now},
                {"type": "Failed", "status": "True", "lastTransitionTime": now},
            ],
        }})
    };
    jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|error| panic!("Job {name} status: {error}"));
}

/// A client holding a fresh token of the ServiceAccount, minted through its `token` subresource.
async fn client_as(admin: &Client, kubeconfig: &Path, account: &str) -> Client {
    let token = request_token(admin.clone(), NAMESPACE, account)
        .await
        .unwrap_or_else(|error| panic!("a token for ServiceAccount {account}: {error}"));
    let mut config = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    for user in &mut config.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.token = Some(token.clone().into());
        }
    }
    let mut config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
        .await
        .expect("config");
    // As the chart's pods would run: the binary's own client settings.
    cli::configure(&mut config);
    Client::try_from(config).expect("client")
}

/// One rule of a Role or ClusterRole as the chart renders it, with the comment lines above it.
#[derive(Debug)]
struct ChartRule {
    comment: String,
}

/// The rules of every Role and ClusterRole in rendered manifests, keyed by (kind, namespace, name), each
/// with the comment written above it in the template.
fn chart_rules(manifests: &str, namespace: &str) -> BTreeMap<(String, String, String), Vec<ChartRule>> {
    let mut roles = BTreeMap::new();
    for document in manifests.split("\n---") {
        let top = |key: &str| {
            document.lines().find_map(|line| {
                line.strip_prefix(key)
                    .map(|v| v.trim().trim_matches('"').to_owned())
            })
        };
        let Some(kind) = top("kind:").filter(|k| k == "Role" || k == "ClusterRole") else {
            continue;
        };
        let name = top("  name:").unwrap_or_default();
        let role_namespace = match kind.as_str() {
            "Role" => top("  namespace:").unwrap_or_else(|| namespace.to_owned()),
            _ => String::new(),
        };
        let mut rules = Vec::new();
        let mut comment = Vec::new();
        let mut in_rules = false;
        for line in document.lines() {
            if line == "rules:" {
                in_rules = true;
            } else if in_rules && line.trim_start().starts_with('#') {
                comment.push(line.trim_start().trim_start_matches('#').trim().to_owned());
            } else if in_rules && line.starts_with("  - ") {
                rules.push(ChartRule {
                    comment: comment.join(" "),
                });
                comment.clear();
            } else if in_rules && !line.starts_with(' ') && !line.is_empty() {
                in_rules = false;
            }
        }
        roles.insert((kind, role_namespace, name), rules);
    }
    roles
}

/// The permissions a rule grants that none of the user's requests used, as `verb group/resource`.
fn unused_permissions(granted: &GrantedRule) -> Vec<String> {
    let PolicyRule {
        verbs,
        api_groups,
        resources,
        non_resource_urls,
        ..
    } = &granted.rule;
    let mut unused = Vec::new();
    for verb in verbs {
        for group in api_groups {
            for resource in resources {
                unused.push(format!("{verb} {group}/{resource}"));
            }
        }
        for url in non_resource_urls {
            unused.push(format!("{verb} nonResourceURL {url}"));
        }
    }
    unused.retain(|permission| !granted.used_as.contains(permission));
    unused
}

/// The verdict on one user's grants: every unused permission must be justified by the comment above its
/// rule in the chart, which says it is granted only so the operator may grant it to operands (RBAC
/// escalation prevention) or names the verb and why this run does not need it. Returns the unjustified
/// ones, and prints every unused one.
fn unjustified(
    report: &AuthorizationReport,
    user: &str,
    rules: &BTreeMap<(String, String, String), Vec<ChartRule>>,
) -> Vec<String> {
    let granted = report
        .users
        .get(user)
        .map(|u| u.rules.as_slice())
        .unwrap_or_default();
    assert!(
        !granted.is_empty(),
        "{user} made requests under rules the chart grants: {report:#?}"
    );
    let mut problems = Vec::new();
    for rule in granted.iter().filter(|r| !r.bootstrap) {
        let unused = unused_permissions(rule);
        if unused.is_empty() {
            continue;
        }
        let role = &rule.role;
        let kind = match role.kind {
            RoleKind::Role => "Role",
            RoleKind::ClusterRole => "ClusterRole",
        };
        let key = (kind.to_owned(), role.namespace.clone(), role.name.clone());
        let comment = rules
            .get(&key)
            .and_then(|r| r.get(rule.index))
            .map(|r| r.comment.to_lowercase())
            .unwrap_or_default();
        eprintln!(
            "{user}: {} {}[{}] unused: {unused:?}; the chart says: {comment}",
            key.0, key.2, rule.index
        );
        let justified = comment.contains("granted to operands") || comment.contains("not exercised");
        let names_verbs = unused.iter().all(|permission| {
            let verb = permission.split(' ').next().unwrap_or_default();
            comment
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|word| word == verb)
        });
        if !justified || !(rule.used == 0 || names_verbs) {
            problems.push(format!(
                "{} {} rule {}: {unused:?} unused, comment: {comment:?}",
                key.0, key.2, rule.index
            ));
        }
    }
    problems
}

/// Every refused request, whoever sent it, with the server's message.
fn denials(report: &AuthorizationReport) -> Vec<String> {
    report
        .denied
        .iter()
        .map(|denial| format!("{}: {}", denial.user, denial.message))
        .collect()
}

/// Runs `check` every 100 ms until it succeeds, failing with what it saw last after `patience`.
async fn until<T, F, Fut>(what: &str, patience: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: still not so after {patience:?}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn policy_state(admin: &Client) -> Result<String, String> {
    let policies = Api::<kube::api::DynamicObject>::all_with(
        admin.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
            "clusterpolicies",
        ),
    );
    let policy = policies.get("cluster-policy").await.map_err(|e| e.to_string())?;
    Ok(policy.data["status"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

/// The namespace's Pod Security labels (enforce, audit, warn), space-separated.
fn pod_security_levels(cluster: &Cluster) -> String {
    let label = |mode: &str| format!("{{.metadata.labels.pod-security\\.kubernetes\\.io/{mode}}}");
    let template = format!(
        "jsonpath={} {} {}",
        label("enforce"),
        label("audit"),
        label("warn")
    );
    cluster
        .ok(&["get", "namespace", NAMESPACE, "-o", &template])
        .trim()
        .to_owned()
}

two_backends!(
    the_chart_installs_converges_upgrades_and_uninstalls_as_its_own_service_accounts,
    fake_rbac
);

async fn the_chart_installs_converges_upgrades_and_uninstalls_as_its_own_service_accounts(backend: Backend) {
    let stage = Stage::on(backend).await;
    let cluster = &stage.cluster;
    let admin = stage.admin.clone();
    let chart = &chart();
    // A person's own label on a GPU node, which nothing may take away.
    let gpu_node = until(
        "the demo cluster's GPU nodes are registered",
        PATIENCE,
        || async {
            let listed = cluster.ok(&[
                "get",
                "nodes",
                "-l",
                "feature.node.kubernetes.io/pci-10de.present=true",
                "-o",
                "name",
            ]);
            listed.lines().next().map(str::to_owned).ok_or(listed)
        },
    )
    .await;
    cluster.ok(&["label", &gpu_node, "team=ml"]);

    let kubelet = stage.install(chart, true).await;
    let health = kubelet
        .log(|log| log.health)
        .expect("the operator serves its health endpoint");
    for path in ["/healthz", "/readyz"] {
        let (status, _) = http_get(health, path).await.expect("the health endpoint answers");
        assert!(status.contains(" 200"), "{path}: {status}");
    }

    // A person edits an operand's image: the operator puts the rendered one back and says so in an Event
    // in its own namespace, which the chart must let it write.
    let daemonset = "daemonset/nvidia-device-plugin-daemonset";
    let image = |cluster: &Cluster| {
        cluster.ok(&[
            "get",
            daemonset,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].name}={.spec.template.spec.containers[0].image}",
        ])
    };
    let rendered = image(cluster);
    let (container, _) = rendered.split_once('=').expect("a container and its image");
    cluster.ok(&[
        "set",
        "image",
        daemonset,
        "-n",
        NAMESPACE,
        &format!("{container}=example.com/edited:v1"),
    ]);
    until(
        "the operator repairs the edited image and says so",
        PATIENCE,
        || async {
            let now = image(cluster);
            let events = cluster.ok(&[
                "get",
                "events.events.k8s.io",
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.items[*].reason}",
            ]);
            if now == rendered && events.contains("DriftRepaired") {
                Ok(())
            } else {
                Err(format!("image {now:?}, events {events:?}"))
            }
        },
    )
    .await;

    // An older CRD, as a previous release left it: the pre-upgrade hook must bring it up to date.
    cluster.ok(&[
        "patch",
        "crd",
        "clusterpolicies.nvidia.com",
        "--type=json",
        "-p=[{\"op\":\"remove\",\"path\":\"/spec/versions/0/additionalPrinterColumns/0\"}]",
    ]);
    let flags = "--reuse-values --set dcgmExporter.enabled=false --set psa.enabled=true";
    let upgraded = helm_ok(cluster, &upgrade(RELEASE, chart, flags)).await;
    assert!(upgraded.contains("STATUS: deployed"), "{upgraded}");
    let columns = cluster.ok(&[
        "get",
        "crd",
        "clusterpolicies.nvidia.com",
        "-o",
        "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
    ]);
    assert_eq!(
        columns.trim(),
        "Status Age",
        "the hook applied the CRD this version ships"
    );
    until(
        "the DCGM exporter is pruned, the namespace labelled privileged, the policy ready again",
        PATIENCE * 3,
        || async {
            let exporters = cluster.ok(&["get", "daemonsets", "-n", NAMESPACE, "-o", "name"]);
            if exporters.contains("nvidia-dcgm-exporter") {
                return Err(exporters);
            }
            let levels = pod_security_levels(cluster);
            if levels != "privileged privileged privileged" {
                return Err(format!("pod security labels {levels:?}"));
            }
            policy_state(&admin)
                .await
                .and_then(|state| (state == "ready").then_some(()).ok_or(state))
        },
    )
    .await;

    let uninstalled = helm_ok(cluster, &["uninstall", RELEASE, "--namespace", NAMESPACE]).await;
    assert!(uninstalled.contains("uninstalled"), "{uninstalled}");
    until("the operator stops with its Deployment", PATIENCE, || async {
        kubelet
            .log(|log| log.health)
            .map_or(Ok(()), |h| Err(h.to_string()))
    })
    .await;
    let (jobs, reports) = kubelet.log(|log| (log.jobs.clone(), log.reports.clone()));
    kubelet.stop().await;
    assert_eq!(
        jobs,
        [
            ("gpu-operator-upgrade-crd".to_owned(), true),
            ("gpu-operator-uninstall".to_owned(), true)
        ],
        "each hook ran once and succeeded"
    );

    // Nothing the operator made is left, and the person's label is.
    let managed = "app.kubernetes.io/managed-by=gpu-operator";
    for kinds in [
        "daemonsets,serviceaccounts,configmaps,services,roles,rolebindings",
        "clusterroles,clusterrolebindings,runtimeclasses",
    ] {
        let left = cluster.ok(&["get", kinds, "-A", "-l", managed, "-o", "name"]);
        assert_eq!(left.trim(), "", "operand objects left after uninstall");
    }
    assert_eq!(cluster.ok(&["get", "clusterpolicies", "-o", "name"]).trim(), "");
    assert_operator_namespace_left_empty(cluster);
    assert_no_operator_marks_on_nodes(cluster);
    assert_eq!(
        pod_security_levels(cluster),
        "",
        "the operator's pod security labels go with the policy"
    );
    let team = cluster.ok(&["get", &gpu_node, "-o", "jsonpath={.metadata.labels.team}"]);
    assert_eq!(team.trim(), "ml", "a person's label survives uninstall");

    // The chart's RBAC is exactly what was used: no request refused, every unused grant justified.
    let [after_upgrade, after_uninstall] = reports.as_slice() else {
        panic!("one report per hook, got {}", reports.len());
    };
    for report in [after_upgrade, after_uninstall] {
        assert_eq!(
            denials(report),
            Vec::<String>::new(),
            "requests the chart's RBAC refused"
        );
    }
    let manifests = run_helm(
        cluster,
        &[
            "template",
            RELEASE,
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "dcgmExporter.enabled=false",
        ],
    )
    .await;
    assert!(
        manifests.status.success(),
        "{}",
        String::from_utf8_lossy(&manifests.stderr)
    );
    let rules = chart_rules(&String::from_utf8_lossy(&manifests.stdout), NAMESPACE);
    let mut problems = unjustified(after_upgrade, CRD_HOOK, &rules);
    problems.extend(unjustified(after_uninstall, OPERATOR, &rules));
    assert!(
        problems.is_empty(),
        "permissions the chart grants that nothing used, unjustified:\n{}",
        problems.join("\n")
    );
    stage.stop().await;
}

/// The ConfigMaps kube-controller-manager's root-ca-cert-publisher and service-ca-cert-publisher keep in
/// every namespace.
const CERTIFICATES_PUBLISHED: [&str; 2] =
    ["configmap/kube-root-ca.crt", "configmap/openshift-service-ca.crt"];

/// Nothing is left in the operator namespace but its `default` ServiceAccount and the certificates a real
/// control plane's publishers put in every namespace: the leader-election Lease went with the operator
/// (deleted when it stopped, or with its Pod), and the hooks left no object.
fn assert_operator_namespace_left_empty(cluster: &Cluster) {
    let listed = cluster.ok(&[
        "get",
        "leases,jobs,deployments,serviceaccounts,roles,rolebindings,configmaps",
        "-n",
        NAMESPACE,
        "-o",
        "name",
    ]);
    let left: Vec<&str> = listed
        .lines()
        .filter(|name| !CERTIFICATES_PUBLISHED.contains(name))
        .collect();
    assert_eq!(left, ["serviceaccount/default"], "left in the operator namespace");
}

/// No node carries a label or annotation of the operator's; what the demo's person set is still there.
fn assert_no_operator_marks_on_nodes(cluster: &Cluster) {
    let demo = gpuop_sim::cluster_spec::ClusterSpec::demo();
    let nodes: Value =
        serde_json::from_str(&cluster.ok(&["get", "nodes", "-o", "json"])).expect("nodes as JSON");
    for node in nodes["items"].as_array().into_iter().flatten() {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let labels = node["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let annotations = node["metadata"]["annotations"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        // The operator's switches and upgrade state are gone; what the demo's person set is still there.
        let operator_kind = |key: &str| {
            key.starts_with("nvidia.com/gpu.deploy.") || key.starts_with("nvidia.com/gpu-driver-upgrade")
        };
        let left: BTreeMap<&String, &Value> = labels.iter().filter(|(key, _)| operator_kind(key)).collect();
        let persons: BTreeMap<String, Value> = demo
            .nodes()
            .find(|(node, _)| node == name)
            .map(|(_, pool)| {
                pool.labels
                    .iter()
                    .filter(|(k, _)| operator_kind(k))
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect()
            })
            .unwrap_or_default();
        let persons: BTreeMap<&String, &Value> = persons.iter().collect();
        assert_eq!(
            left, persons,
            "{name}: labels of the operator's kind after uninstall"
        );
        assert!(
            !annotations.contains_key("nvidia.com/gpu-operator.owned-labels"),
            "{name} keeps the operator's annotation"
        );
    }
}

two_backends!(
    an_uninstall_whose_hook_cannot_run_ends_with_nothing_left_by_the_documented_steps,
    fake_rbac
);

/// The documented way out when the uninstall hook's Job cannot run (docs/install.md, "If the uninstall hook
/// cannot run"): `helm uninstall` times out and fails, keeping the Job; `helm uninstall --no-hooks`, deleting
/// the Job and `gpu-operator uninstall` run as the admin leave nothing behind: no operand object, no node
/// label of the operator's, no Lease, no object of the release or of its hooks.
async fn an_uninstall_whose_hook_cannot_run_ends_with_nothing_left_by_the_documented_steps(backend: Backend) {
    let stage = Stage::on(backend).await;
    let kubelet = stage.install(&chart(), false).await;
    let cluster = &stage.cluster;

    let failed = run_helm(
        cluster,
        &["uninstall", RELEASE, "--namespace", NAMESPACE, "--timeout", "5s"],
    )
    .await;
    assert!(
        !failed.status.success(),
        "the hook cannot run, so helm uninstall fails"
    );
    assert!(
        cluster
            .ok(&["get", "jobs", "-n", NAMESPACE, "-o", "name"])
            .contains("gpu-operator-uninstall")
    );

    helm_ok(
        cluster,
        &["uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks"],
    )
    .await;
    cluster.ok(&["delete", "job", "gpu-operator-uninstall", "-n", NAMESPACE]);
    until("the operator stops with its Deployment", PATIENCE, || async {
        kubelet
            .log(|log| log.health)
            .map_or(Ok(()), |h| Err(h.to_string()))
    })
    .await;
    kubelet.stop().await;
    let args = gpuop_operator::cli::UninstallArgs {
        namespace: NAMESPACE.to_owned(),
        timeout_seconds: 60,
        lease_name: gpuop_operator::run::DEFAULT_LEASE_NAME.to_owned(),
    };
    assert_eq!(
        cli::uninstall(stage.admin.clone(), args).await,
        ExitCode::SUCCESS,
        "gpu-operator uninstall"
    );

    let managed = "app.kubernetes.io/managed-by=gpu-operator";
    let left = cluster.ok(&[
        "get",
        "daemonsets,serviceaccounts,configmaps,services,roles,rolebindings,clusterroles,clusterrolebindings,runtimeclasses",
        "-A", "-l", managed, "-o", "name",
    ]);
    assert_eq!(left.trim(), "", "operand objects left");
    assert_operator_namespace_left_empty(cluster);
    let release = cluster.ok(&["get", "clusterroles,clusterrolebindings", "-o", "name"]);
    assert!(
        !release.contains("gpu-operator"),
        "the release's cluster RBAC is left: {release}"
    );
    assert_no_operator_marks_on_nodes(cluster);
    let releases = run_helm(
        cluster,
        &["list", "--namespace", NAMESPACE, "--uninstalling", "-q"],
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&releases.stdout).trim(),
        "",
        "the release is gone"
    );
    stage.stop().await;
}
