//! Every failure visible where users look: a write the API server refuses, a resource the operator cannot
//! list, and a ClusterPolicy that does not decode are each reported on the ClusterPolicy's status (and
//! `/readyz`), while everything that does not depend on them keeps being applied.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use gpuop_api::ClusterPolicy;
use gpuop_api::labels::DEPLOY_PREFIX;
use gpuop_api::status::{CONDITION_ERROR, State};
use gpuop_fakeserver::{Authorization, FakeServer};
use gpuop_operator::run::{self, Config, Running};
use gpuop_sim::cluster_spec::ClusterSpec;
use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE, apply_policy, install};
use gpuop_sim::hardware::GpuModel;
use gpuop_sim::kubelet::Timing;
use gpuop_sim::simulation::Simulation;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::operator::{pool, until};

/// A simulated cluster (driven by `admin`) and the operator (on `operator`), serving `/readyz`.
struct Setup {
    admin: Client,
    simulation: Simulation,
    operator: Running,
}

/// The node every test's cluster has: one T4 node, `gpu-0`.
const NODE: &str = "gpu-0";

impl Setup {
    /// The one-node cluster ([`NODE`]) simulated as `admin`, and the operator running as `operator`.
    async fn start(admin: Client, operator: Client) -> Self {
        let spec = ClusterSpec {
            nfd: true,
            node_pools: vec![pool("gpu", 1, Some(GpuModel::T4))],
            workloads: Vec::new(),
        };
        let simulation = Simulation::start(admin.clone(), spec, Timing::instant())
            .await
            .expect("simulation starts");
        let config = Config {
            health_address: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            ..Config::in_process(NAMESPACE)
        };
        let operator = run::start(operator, config).await.expect("operator starts");
        Self {
            admin,
            simulation,
            operator,
        }
    }

    /// The cluster on an RBAC-enforcing server with the default policy applied, its operator allowed what
    /// [`operator_allowed`] allows for `read_only` and `hidden`; returns the policy's name too.
    async fn restricted(read_only: &[&str], hidden: &[&str]) -> (Self, String) {
        let server = FakeServer::builder().authorization(Authorization::Rbac).build();
        let admin = server.client_as(gpuop_sim::USER_AGENT);
        install(&admin).await.expect("CRDs and namespace install");
        let operator = operator_allowed(&server, &admin, read_only, hidden).await;
        let setup = Self::start(admin.clone(), operator).await;
        let name = apply_policy(&admin, DEFAULT_POLICY)
            .await
            .expect("policy applies");
        (setup, name)
    }

    async fn stop(self) {
        self.operator.stop().await;
        self.simulation.stop().await;
    }

    /// The status line and body of the operator's `/readyz`.
    async fn readyz(&self) -> Result<(String, String), String> {
        http_get(self.health(), "/readyz").await
    }

    /// What a user sees of `policy`: its state and Error condition, and the operands on [`NODE`].
    async fn shown(&self, policy: &str) -> Result<Shown, String> {
        let policy = self.policy(policy).await?;
        Ok(Shown {
            state: policy.status.as_ref().map(|s| s.state),
            error: error_condition(&policy).ok_or("no Error condition yet")?.clone(),
            operands: self.operands_on(NODE).await?,
        })
    }

    /// Waits until what `policy` shows is `reported`.
    async fn until_reported(&self, policy: &str, reported: Reported<'_>) {
        until(&format!("{reported:?}"), || async {
            let shown = self.shown(policy).await?;
            let readyz = self.readyz().await?;
            if reported.is_shown(&shown, &readyz) {
                Ok(())
            } else {
                Err(format!("{shown:?}, /readyz {readyz:?}"))
            }
        })
        .await;
    }

    fn health(&self) -> SocketAddr {
        *self.operator.bound.first().expect("the health endpoint is bound")
    }

    async fn policy(&self, name: &str) -> Result<ClusterPolicy, String> {
        Api::<ClusterPolicy>::all(self.admin.clone())
            .get(name)
            .await
            .map_err(|e| e.to_string())
    }

    /// Operand ids with a running pod on the node.
    async fn operands_on(&self, node: &str) -> Result<BTreeSet<String>, String> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), NAMESPACE);
        Ok(pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| gpuop_sim::kubelet::operand_of(&p).map(|o| o.id().to_owned()))
            .collect())
    }
}

/// What [`Setup::shown`] shows.
#[derive(Debug)]
struct Shown {
    state: Option<State>,
    error: Condition,
    operands: BTreeSet<String>,
}

/// A failure a test waits to see reported: the policy's Error condition, and what else shows it or works
/// all the same.
#[derive(Debug)]
struct Reported<'a> {
    /// The Error condition's reason, when it is True.
    reason: &'a str,
    /// What its message names.
    names: &'a str,
    state: Option<State>,
    /// Operands that run on [`NODE`] all the same.
    running: Vec<&'a str>,
    /// What `/readyz`, answering 503, names.
    readyz: Option<&'a str>,
}

impl<'a> Reported<'a> {
    /// An Error condition that is True for `reason`, its message naming `names`.
    fn error(reason: &'a str, names: &'a str) -> Self {
        Self {
            reason,
            names,
            state: None,
            running: Vec::new(),
            readyz: None,
        }
    }

    /// The policy in `state` as well.
    fn in_state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    /// `operand` running on [`NODE`] all the same.
    fn running(mut self, operand: &'a str) -> Self {
        self.running.push(operand);
        self
    }

    /// `/readyz` answering 503 and naming `names`.
    fn on_readyz(mut self, names: &'a str) -> Self {
        self.readyz = Some(names);
        self
    }

    fn is_shown(&self, shown: &Shown, (status, body): &(String, String)) -> bool {
        let error = &shown.error;
        error.status == "True"
            && error.reason == self.reason
            && error.message.contains(self.names)
            && self.state.is_none_or(|state| shown.state == Some(state))
            && self
                .running
                .iter()
                .all(|operand| shown.operands.contains(*operand))
            && self
                .readyz
                .is_none_or(|names| status.contains("503") && body.contains(names))
    }
}

fn error_condition(policy: &ClusterPolicy) -> Option<&Condition> {
    policy
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == CONDITION_ERROR)
}

/// The status line and body of a GET of `path` on a plain HTTP endpoint.
pub(crate) async fn http_get(address: SocketAddr, path: &'static str) -> Result<(String, String), String> {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(|e| e.to_string())?;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer.as_str(), ""));
        Ok((
            head.lines().next().unwrap_or_default().to_owned(),
            body.to_owned(),
        ))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// A client for the operator's ServiceAccount on an RBAC server, allowed everything the operator does but
/// writing the core resources `read_only`, and listing or watching the resources `hidden` (of any group).
async fn operator_allowed(
    server: &FakeServer,
    admin: &Client,
    read_only: &[&str],
    hidden: &[&str],
) -> Client {
    let create = |object: serde_json::Value| {
        let api: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &ApiResource::from_gvk(&GroupVersionKind::gvk(
                "rbac.authorization.k8s.io",
                "v1",
                object["kind"].as_str().unwrap_or_default(),
            )),
        );
        async move {
            let object: DynamicObject = serde_json::from_value(object).expect("an RBAC object");
            api.create(&PostParams::default(), &object)
                .await
                .expect("RBAC object created");
        }
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "gpu-operator"}})).unwrap(),
        )
        .await
        .expect("service account created");
    let shown = |resources: &[&str]| -> Vec<String> {
        resources
            .iter()
            .filter(|r| !hidden.contains(r))
            .map(|r| (*r).to_owned())
            .collect()
    };
    let grouped: [(&str, &[&str]); 12] = [
        ("apps", &["daemonsets", "controllerrevisions"]),
        (
            "rbac.authorization.k8s.io",
            &["clusterroles", "clusterrolebindings", "roles", "rolebindings"],
        ),
        ("node.k8s.io", &["runtimeclasses"]),
        (
            "nvidia.com",
            &[
                "clusterpolicies",
                "clusterpolicies/status",
                "clusterpolicies/finalizers",
                "nvidiadrivers",
                "nvidiadrivers/status",
                "nvidiadrivers/finalizers",
            ],
        ),
        ("coordination.k8s.io", &["leases"]),
        ("events.k8s.io", &["events"]),
        ("apiextensions.k8s.io", &["customresourcedefinitions"]),
        ("monitoring.coreos.com", &["servicemonitors"]),
        ("nfd.k8s-sigs.io", &["nodefeatures"]),
        ("security.openshift.io", &["securitycontextconstraints"]),
        ("config.openshift.io", &["clusterversions"]),
        ("resource.k8s.io", &["resourceclaims"]),
    ];
    let mut rules: Vec<serde_json::Value> = grouped
        .iter()
        .map(
            |(group, resources)| json!({"apiGroups": [group], "resources": shown(resources), "verbs": ["*"]}),
        )
        .collect();
    let core = [
        "nodes",
        "pods",
        "pods/eviction",
        "configmaps",
        "serviceaccounts",
        "namespaces",
        "events",
        "services",
    ];
    let writable: Vec<&str> = core.iter().copied().filter(|r| !read_only.contains(r)).collect();
    rules.push(json!({"apiGroups": [""], "resources": shown(&writable), "verbs": ["*"]}));
    rules.push(json!({"apiGroups": [""], "resources": shown(read_only), "verbs": ["get", "list", "watch"]}));
    // The unlisted ones may still be written: only the operator's own judgement keeps it from writing them.
    rules.extend(hidden.iter().map(|resource| {
        json!({"apiGroups": ["*"], "resources": [resource], "verbs": ["get", "create", "patch", "update", "delete"]})
    }));
    rules.retain(|rule| rule["resources"].as_array().is_some_and(|r| !r.is_empty()));
    create(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "gpu-operator-test"},
        "rules": rules,
    }))
    .await;
    create(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpu-operator-test"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NAMESPACE}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-operator-test"},
    }))
    .await;
    let token = server.token_for(NAMESPACE, "gpu-operator").expect("a token");
    server.client_with(Some(gpuop_operator::USER_AGENT), Some(&token))
}

#[tokio::test]
async fn a_refused_write_is_in_the_status_and_the_states_that_do_not_need_it_are_applied() {
    // The operator may do everything but write Services: the DCGM exporter's Service is refused.
    let (setup, name) = Setup::restricted(&["services"], &[]).await;
    // The refusal is in the status, and feature discovery runs anyway.
    let reported = Reported::error("Forbidden", "Service gpu-operator/nvidia-dcgm-exporter")
        .in_state(State::NotReady)
        .running("gpu-feature-discovery")
        .running("device-plugin");
    setup.until_reported(&name, reported).await;
    setup.stop().await;
}

#[tokio::test]
async fn a_forbidden_list_is_reported_per_resource_and_its_kind_is_not_written() {
    // RuntimeClasses may be written but not listed or watched.
    let (setup, name) = Setup::restricted(&[], &["runtimeclasses"]).await;
    // The forbidden resource is named in the status and on /readyz, the driver runs.
    let reported = Reported::error("Forbidden", "cannot watch runtimeclasses.node.k8s.io (Forbidden)")
        .running("driver")
        .on_readyz("runtimeclasses.node.k8s.io: Forbidden");
    setup.until_reported(&name, reported).await;
    // The pass that wrote this status made its writes before it: none was a RuntimeClass.
    let runtime_classes: Api<DynamicObject> = Api::all_with(
        setup.admin.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("node.k8s.io", "v1", "RuntimeClass")),
    );
    assert_none(
        &runtime_classes,
        &ListParams::default(),
        "a kind the operator cannot watch is not written",
    )
    .await;
    setup.stop().await;
}

#[tokio::test]
async fn a_missing_crd_is_reported_and_everything_else_keeps_working_until_it_is_installed() {
    let server = FakeServer::new();
    let admin = server.client_as(gpuop_sim::USER_AGENT);
    // Only the ClusterPolicy CRD: the NVIDIADriver one is missing.
    apply_crd(&admin, gpuop_api::crd::cluster_policy_crd()).await;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .expect("namespace created");
    let setup = Setup::start(admin.clone(), server.client_as(gpuop_operator::USER_AGENT)).await;
    let name = apply_policy(&admin, DEFAULT_POLICY)
        .await
        .expect("policy applies");
    // The operands run, the policy names the missing CRD, /readyz too.
    let reported = Reported::error("NotFound", "nvidiadrivers.nvidia.com")
        .running("device-plugin")
        .on_readyz("nvidiadrivers.nvidia.com: NotFound");
    setup.until_reported(&name, reported).await;
    apply_crd(&admin, gpuop_api::crd::nvidia_driver_crd()).await;
    until(
        "once the CRD is there, the operator is ready and the error is gone",
        || async {
            let policy = setup.policy(&name).await?;
            let error = error_condition(&policy).ok_or("no Error condition")?;
            let (status, body) = setup.readyz().await?;
            if error.status == "False" && status.contains("200") && body.starts_with("ok") {
                Ok(())
            } else {
                Err(format!("Error condition {error:?}, /readyz {status}: {body}"))
            }
        },
    )
    .await;
    setup.stop().await;
}

/// Applies `crd` as the test's field manager.
async fn apply_crd(admin: &Client, crd: CustomResourceDefinition) {
    Api::<CustomResourceDefinition>::all(admin.clone())
        .patch(
            &crd.name_any(),
            &PatchParams::apply("test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("CRD {} applies: {e}", crd.name_any()));
}

/// Asserts that `api` lists nothing for `params`, naming what it found otherwise.
async fn assert_none<K>(api: &Api<K>, params: &ListParams, why: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let found = api.list(params).await.expect("lists").items;
    assert!(
        found.is_empty(),
        "{why}: {:?}",
        found.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
}

/// The Error condition of a status read as plain JSON (null when there is none).
fn error_condition_of(status: &serde_json::Value) -> serde_json::Value {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == CONDITION_ERROR)
        .cloned()
        .unwrap_or_default()
}

/// A fake server with the CRDs and namespace installed, but a ClusterPolicy CRD whose schema does not check
/// the spec (as one of another version or vendor may not), so that it stores what the operator's types
/// cannot decode; returns the server, its admin, and an API for ClusterPolicies as plain objects.
async fn with_loose_policies() -> (FakeServer, Client, Api<DynamicObject>) {
    let server = FakeServer::new();
    let admin = server.client_as(gpuop_sim::USER_AGENT);
    install(&admin).await.expect("CRDs and namespace install");
    let mut crd = serde_json::to_value(gpuop_api::crd::cluster_policy_crd()).expect("CRD serializes");
    for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
        version["schema"]["openAPIV3Schema"]["properties"]["spec"] =
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    }
    apply_crd(&admin, serde_json::from_value(crd).expect("a CRD")).await;
    let policies = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy")),
    );
    (server, admin, policies)
}

#[tokio::test]
async fn a_policy_that_does_not_decode_is_reported_on_itself_and_the_other_is_served() {
    let (server, admin, policies) = with_loose_policies().await;
    let name = apply_policy(&admin, DEFAULT_POLICY)
        .await
        .expect("policy applies");
    // Newer (the name breaks a tie of creation seconds), and `driver.enabled` is not a boolean.
    let unreadable: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "zz-unreadable"},
        "spec": {"driver": {"enabled": "yes please"}},
    }))
    .unwrap();
    let unreadable = policies
        .create(&PostParams::default(), &unreadable)
        .await
        .expect("the server stores it");
    // A managed object owned by the other ClusterPolicy: not the active one's to prune.
    let foreign: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "owned-by-another-policy",
            "labels": {gpuop_api::labels::MANAGED_BY: "gpu-operator"},
            "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "zz-unreadable",
                                 "uid": unreadable.uid().expect("a uid"), "controller": true}],
        },
    }))
    .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NAMESPACE);
    config_maps
        .create(&PostParams::default(), &foreign)
        .await
        .expect("config map created");
    let setup = Setup::start(admin.clone(), server.client_as(gpuop_operator::USER_AGENT)).await;
    until(
        "the readable policy is served and the other says why it is not",
        || async {
            let active = setup.policy(&name).await?;
            let other = policies.get("zz-unreadable").await.map_err(|e| e.to_string())?;
            let status = &other.data["status"];
            let error = error_condition_of(status);
            let operands = setup.operands_on(NODE).await?;
            let state = active.status.as_ref().map(|s| s.state);
            if state == Some(State::Ready)
                && operands.contains("device-plugin")
                && status["state"] == "ignored"
                && error["status"] == "True"
                && error["reason"] == "ReconcileFailed"
                && error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("cannot be read"))
            {
                Ok(())
            } else {
                Err(format!(
                    "active {state:?}, operands {operands:?}, unreadable one's status {status}"
                ))
            }
        },
    )
    .await;
    assert!(
        config_maps
            .get_opt("owned-by-another-policy")
            .await
            .expect("config maps read")
            .is_some(),
        "an object of another ClusterPolicy is not pruned"
    );
    setup.stop().await;
}

#[tokio::test]
async fn an_active_policy_that_does_not_decode_is_reported_and_nothing_is_applied() {
    let (server, admin, policies) = with_loose_policies().await;
    let unreadable: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"enabled": "yes please"}},
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &unreadable)
        .await
        .expect("the server stores it");
    let setup = Setup::start(admin.clone(), server.client_as(gpuop_operator::USER_AGENT)).await;
    until("the policy says why it cannot be read", || async {
        let policy = policies.get("cluster-policy").await.map_err(|e| e.to_string())?;
        let status = &policy.data["status"];
        let error = error_condition_of(status);
        if status["state"] == "notReady"
            && error["status"] == "True"
            && error["reason"] == "ReconcileFailed"
            && error["message"]
                .as_str()
                .is_some_and(|m| m.contains("cannot be read") && m.contains("driver.enabled"))
        {
            Ok(())
        } else {
            Err(format!("status {status}"))
        }
    })
    .await;
    // The pass that wrote the status applied nothing before it.
    assert_none(
        &Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(admin.clone(), NAMESPACE),
        &ListParams::default().labels(&format!("{}=gpu-operator", gpuop_api::labels::MANAGED_BY)),
        "nothing is applied for a policy that cannot be read",
    )
    .await;
    setup.stop().await;
}

#[tokio::test]
async fn an_operator_that_may_not_list_cluster_policies_changes_nothing_it_finds() {
    let server = FakeServer::builder().authorization(Authorization::Rbac).build();
    let admin = server.client_as(gpuop_sim::USER_AGENT);
    install(&admin).await.expect("CRDs and namespace install");
    let mut setup = Setup::start(admin.clone(), server.client_as(gpuop_operator::USER_AGENT)).await;
    apply_policy(&admin, DEFAULT_POLICY)
        .await
        .expect("policy applies");
    until("the operands run", || async {
        let operands = setup.operands_on(NODE).await?;
        if operands.contains("device-plugin") {
            Ok(())
        } else {
            Err(format!("{operands:?}"))
        }
    })
    .await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let switches = || async {
        let node = nodes.get("gpu-0").await.expect("gpu-0");
        let switches: BTreeSet<(String, String)> = node
            .labels()
            .iter()
            .filter(|(key, _)| key.starts_with(DEPLOY_PREFIX))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        switches
    };
    let before_restart = switches().await;
    assert!(before_restart.contains(&(format!("{DEPLOY_PREFIX}device-plugin"), "true".to_owned())));
    // A restart whose permissions do not let it list ClusterPolicies (yet: a binding the API server's
    // authorizer has not caught up with): its empty store is no cluster without a policy.
    let restricted = operator_allowed(&server, &admin, &[], &["clusterpolicies"]).await;
    let config = Config {
        health_address: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        ..Config::in_process(NAMESPACE)
    };
    let restarted = run::start(restricted, config).await.expect("operator starts");
    std::mem::replace(&mut setup.operator, restarted).stop().await;
    until("/readyz names the refused ClusterPolicies", || async {
        let (status, body) = setup.readyz().await?;
        if status.contains("503") && body.contains("clusterpolicies.nvidia.com: Forbidden") {
            Ok(())
        } else {
            Err(format!("{status}: {body}"))
        }
    })
    .await;
    let before = server.requests();
    tokio::time::sleep(gpuop_operator::STEADY_STATE_WINDOW).await;
    let writes = server.requests().since(&before);
    assert_eq!(
        writes.writes_by(gpuop_sim::product_token(gpuop_operator::USER_AGENT)),
        0,
        "{:?}",
        writes.iter().collect::<Vec<_>>()
    );
    assert_eq!(switches().await, before_restart, "the deploy switches stay");
    assert!(
        setup
            .operands_on(NODE)
            .await
            .expect("pods")
            .contains("device-plugin")
    );
    setup.stop().await;
}
