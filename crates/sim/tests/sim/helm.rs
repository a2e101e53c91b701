//! Helm 4 (server-side apply with `fieldValidation=Strict`) installs, upgrades and uninstalls a chart shaped
//! like NVIDIA's (the ClusterPolicy CRD, a ClusterPolicy, the operator's Deployment and its RBAC) into
//! `gpu-sim serve`, as a person would on a real cluster. It runs the pinned Helm from `target/tools/`
//! (installed by `scripts/tools` when missing); where that cannot be had the test fails, saying why.

use std::path::{Path, PathBuf};
use std::process::Output;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};

use crate::cluster::{Cluster, succeeded, testdata};
use crate::tools::helm;

const NAMESPACE: &str = "gpu-operator";
const RELEASE: &str = "gpu";

/// The test chart, with this repository's CRDs in its `crds/` folder, copied under `dir`.
fn chart(dir: &Path) -> PathBuf {
    let chart = dir.join("chart");
    copy_tree(&testdata("helm/chart"), &chart);
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/gpu-operator-crds.yaml");
    std::fs::create_dir_all(chart.join("crds")).expect("crds folder");
    std::fs::copy(&crds, chart.join("crds/gpu-operator-crds.yaml")).expect("CRDs copied into the chart");
    chart
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("folder");
    for entry in std::fs::read_dir(from).expect("chart folder").flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("chart file copied");
        }
    }
}

/// Runs helm against the cluster, with its cache and configuration kept in the cluster's folder.
pub(crate) async fn run_helm(cluster: &Cluster, args: &[&str]) -> Output {
    let home = cluster.dir().join("helm-home");
    tokio::process::Command::new(helm())
        .args(args)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .await
        .expect("helm runs")
}

pub(crate) async fn helm_ok(cluster: &Cluster, args: &[&str]) -> String {
    succeeded("helm", args, &run_helm(cluster, args).await)
}

/// `helm install` of `chart` as `release` into the operator's namespace (created when missing), which must
/// end with the release deployed.
pub(crate) async fn helm_install(cluster: &Cluster, release: &str, chart: &str) {
    let installed = helm_ok(
        cluster,
        &[
            "install",
            release,
            chart,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ],
    )
    .await;
    assert!(installed.contains("STATUS: deployed"), "{installed}");
}

/// The arguments of `helm upgrade` of `release` to `chart` in the operator's namespace, then `flags` (split
/// at spaces).
pub(crate) fn upgrade<'a>(release: &'a str, chart: &'a str, flags: &'a str) -> Vec<&'a str> {
    let mut args = vec!["upgrade", release, chart, "--namespace", NAMESPACE];
    args.extend(flags.split_whitespace());
    args
}

pub(crate) async fn client(cluster: &Cluster) -> Client {
    let kubeconfig = Kubeconfig::read_from(cluster.kubeconfig()).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

fn policies(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
        "clusterpolicies",
    );
    Api::all_with(client.clone(), &resource)
}

/// Each release revision's `status` label, from the secrets Helm keeps them in.
async fn revisions(client: &Client) -> Vec<(String, String)> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let listed = secrets
        .list(&ListParams::default().labels(&format!("owner=helm,name={RELEASE}")))
        .await
        .expect("release secrets listed");
    let mut revisions: Vec<(String, String)> = listed
        .items
        .iter()
        .map(|secret| {
            let labels = secret.metadata.labels.clone().unwrap_or_default();
            let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
            (label("version"), label("status"))
        })
        .collect();
    revisions.sort();
    revisions
}

/// Whether a GET answered 404 Not Found.
fn gone<T>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 404)
}

/// Asserts that the Deployment's (first) container runs `expected`.
fn assert_image(deployment: &Deployment, expected: &str) {
    assert_eq!(image(deployment).as_deref(), Some(expected));
}

fn image(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
}

#[tokio::test]
async fn helm_installs_upgrades_and_uninstalls_a_chart() {
    let helm = helm();
    let cluster = Cluster::serve(&[]);
    let chart = chart(cluster.dir());
    let chart = chart.to_str().expect("utf-8 path");
    let client = client(&cluster).await;
    eprintln!("using {}", helm.display());

    // No --wait: Helm's readiness check of a Deployment reads its ReplicaSets, and gpu-sim serve runs no
    // deployment controller to make them (a real cluster would, and the wait would end).
    helm_install(&cluster, RELEASE, chart).await;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in ["clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com"] {
        let crd = crds
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name} from crds/: {e}"));
        let established = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            established
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name}"
        );
    }
    let policy = policies(&client)
        .get("cluster-policy")
        .await
        .expect("the chart's ClusterPolicy");
    assert_eq!(policy.data["spec"]["mig"]["strategy"], "single");
    let labels = policy.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("app.kubernetes.io/managed-by").map(String::as_str),
        Some("Helm")
    );
    let annotations = policy.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("meta.helm.sh/release-name").map(String::as_str),
        Some(RELEASE)
    );

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let deployment = deployments
        .get("gpu-operator")
        .await
        .expect("the chart's Deployment");
    assert_image(&deployment, "nvcr.io/nvidia/gpu-operator:v26.7.0");
    assert_eq!(
        gpuop_testkit::fixture::managers(&deployment.metadata),
        [("helm".to_owned(), "Apply".to_owned())],
        "Helm 4 applies server-side"
    );
    Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .get("gpu-operator")
        .await
        .expect("service account");
    Api::<Role>::namespaced(client.clone(), NAMESPACE)
        .get("gpu-operator")
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(client.clone(), NAMESPACE)
        .get("gpu-operator")
        .await
        .expect("role binding");
    Api::<ClusterRole>::all(client.clone())
        .get("gpu-operator")
        .await
        .expect("cluster role");
    Api::<ClusterRoleBinding>::all(client.clone())
        .get("gpu-operator")
        .await
        .expect("cluster role binding");
    assert_eq!(
        revisions(&client).await,
        [("1".to_owned(), "deployed".to_owned())]
    );

    // An upgrade with changed values changes the objects in place.
    let flags = "--set mig.strategy=mixed --set operator.version=v26.8.0";
    helm_ok(&cluster, &upgrade(RELEASE, chart, flags)).await;
    let policy = policies(&client)
        .get("cluster-policy")
        .await
        .expect("ClusterPolicy");
    assert_eq!(policy.data["spec"]["mig"]["strategy"], "mixed");
    let deployment = deployments.get("gpu-operator").await.expect("Deployment");
    assert_image(&deployment, "nvcr.io/nvidia/gpu-operator:v26.8.0");
    assert_eq!(deployment.metadata.generation, Some(2));
    assert_eq!(
        revisions(&client).await,
        [
            ("1".to_owned(), "superseded".to_owned()),
            ("2".to_owned(), "deployed".to_owned())
        ]
    );

    // A chart with a misspelled field fails as on a real cluster, and the release keeps what it had.
    let refused = run_helm(
        &cluster,
        &upgrade(RELEASE, chart, "--reuse-values --set typo=true"),
    )
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a misspelled field was accepted: {stderr}"
    );
    assert!(
        stderr.contains(
            "failed to create typed patch object (gpu-operator/gpu-operator; apps/v1, Kind=Deployment): \
             .spec.replica: field not declared in schema"
        ),
        "{stderr}"
    );
    let deployment = deployments.get("gpu-operator").await.expect("Deployment");
    assert_image(&deployment, "nvcr.io/nvidia/gpu-operator:v26.8.0");
    assert_eq!(
        deployment.metadata.generation,
        Some(2),
        "the failed upgrade changed nothing"
    );

    // Uninstalling removes the release's objects and records, and keeps the CRDs (Helm never deletes them).
    helm_ok(&cluster, &["uninstall", RELEASE, "--namespace", NAMESPACE]).await;
    assert!(
        gone(deployments.get("gpu-operator").await),
        "the Deployment is deleted"
    );
    assert!(
        gone(policies(&client).get("cluster-policy").await),
        "the ClusterPolicy is deleted"
    );
    assert!(
        gone(Api::<ClusterRole>::all(client.clone()).get("gpu-operator").await),
        "the ClusterRole is deleted"
    );
    assert_eq!(revisions(&client).await, [], "no release records are left");
    crds.get("clusterpolicies.nvidia.com")
        .await
        .expect("the CRD stays");
    let listed = helm_ok(&cluster, &["list", "--all-namespaces", "--short"]).await;
    assert_eq!(listed.trim(), "", "helm list shows no release");
}

/// The repository's chart (`deploy/helm/gpu-operator`) installs with Helm's strict server-side apply, and
/// upgrades to each NVIDIA-compatibility values file, so no template writes a field the API does not know.
/// Upgrades skip the CRD hook (`operator.upgradeCRD=false`) and the uninstall skips the pre-delete hook:
/// `gpu-sim serve` runs no Job controller, so Helm would wait for the hook Jobs forever.
#[tokio::test]
async fn the_repository_chart_installs_and_upgrades_with_nvidia_values() {
    let cluster = Cluster::serve(&[]);
    let client = client(&cluster).await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gpu-operator");
    let chart = root.to_str().expect("utf-8 path");
    helm_install(&cluster, RELEASE, chart).await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get("gpu-operator")
        .await
        .expect("the operator's Deployment");
    assert_image(&deployment, "ghcr.io/gpuop/gpu-operator:0.1.0");
    Api::<Role>::namespaced(client.clone(), "default")
        .get("gpu-operator-events")
        .await
        .expect("the events Role in the namespace of cluster-scoped objects' events");
    policies(&client)
        .get("cluster-policy")
        .await
        .expect("the chart's ClusterPolicy");

    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("tests/compat/values"))
        .expect("compat values")
        .flatten()
        .map(|entry| entry.path())
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for file in &files {
        let mut args = upgrade(RELEASE, chart, "--set operator.upgradeCRD=false -f");
        args.push(file.to_str().expect("utf-8 path"));
        helm_ok(&cluster, &args).await;
        let drivers = Api::<DynamicObject>::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("nvidia.com", "v1alpha1", "NVIDIADriver"),
                "nvidiadrivers",
            ),
        );
        let default_driver = drivers.get_opt("default").await.expect("NVIDIADrivers readable");
        let wants_driver = file.ends_with("nvidiadriver-crd.yaml");
        assert_eq!(default_driver.is_some(), wants_driver, "{}", file.display());
    }

    helm_ok(
        &cluster,
        &["uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks"],
    )
    .await;
    assert!(gone(policies(&client).get("cluster-policy").await));
    assert!(gone(
        Api::<ClusterRole>::all(client.clone()).get("gpu-operator").await
    ));
}

/// The flow an end-to-end test of a chart's RBAC follows: Helm installs as the admin of
/// `gpu-sim serve --authorization rbac` (over HTTPS, with the admin token of the kubeconfig it wrote), then
/// the chart's service account gets a token and is held to exactly what the chart grants it.
#[tokio::test]
async fn helm_installs_into_an_rbac_server_and_the_chart_grants_its_service_account() {
    helm();
    let cluster = Cluster::start_rbac(&[]);
    let chart = chart(cluster.dir());
    let chart = chart.to_str().expect("utf-8 path");
    helm_install(&cluster, RELEASE, chart).await;
    let token = cluster.ok(&["create", "token", "gpu-operator", "-n", NAMESPACE]);
    let can_i = |args: &[&str]| {
        let mut all = vec!["--token", token.trim(), "auth", "can-i"];
        all.extend_from_slice(args);
        String::from_utf8_lossy(&cluster.run(&all).stdout)
            .trim()
            .to_owned()
    };
    assert_eq!(
        can_i(&["patch", "nodes"]),
        "yes",
        "granted by the chart's ClusterRole"
    );
    assert_eq!(
        can_i(&["create", "daemonsets.apps", "-n", NAMESPACE]),
        "yes",
        "by its Role"
    );
    assert_eq!(
        can_i(&["create", "daemonsets.apps", "-n", "default"]),
        "no",
        "only in its namespace"
    );
    assert_eq!(can_i(&["delete", "nodes"]), "no");
    let uninstalled = helm_ok(&cluster, &["uninstall", RELEASE, "--namespace", NAMESPACE]).await;
    assert!(uninstalled.contains("uninstalled"), "{uninstalled}");
    // The service account went with the release, and its tokens with it.
    let after = cluster.run(&["--token", token.trim(), "auth", "can-i", "patch", "nodes"]);
    let stderr = String::from_utf8_lossy(&after.stderr);
    assert!(stderr.contains("You must be logged in to the server"), "{stderr}");
}
