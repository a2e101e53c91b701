//! The ServiceAccount and RBAC of each operand, with the rules NVIDIA's operand images need: the driver
//! manager drains and labels nodes, the validator starts workload pods, feature discovery writes
//! NodeFeatures, the MIG manager pauses operands and deletes validator pods, and so on.
//!
//! Every operand gets a ServiceAccount, a Role and a RoleBinding; those that read or write cluster-scoped
//! objects also get a ClusterRole and ClusterRoleBinding. All are named after the operand's account
//! (`nvidia-driver`, `nvidia-device-plugin`, ...). The OpenShift `securitycontextconstraints` rule is kept
//! everywhere NVIDIA has it: it grants nothing on other clusters and keeps the objects identical.

use gpuop_api::labels::GROUP;
use gpuop_api::{Operand, OperandInfo};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use crate::manifest::{Objects, Owner, meta};

/// One RBAC rule.
#[derive(Clone, Copy, Debug)]
struct Rule {
    groups: &'static [&'static str],
    resources: &'static [&'static str],
    verbs: &'static [&'static str],
    names: &'static [&'static str],
}

/// A rule on any object of the resources (a macro, so rule tables stay constant).
macro_rules! rule {
    ($groups:expr, $resources:expr, $verbs:expr $(,)?) => {
        Rule {
            groups: $groups,
            resources: $resources,
            verbs: $verbs,
            names: &[],
        }
    };
}

/// Use of OpenShift's `privileged` SecurityContextConstraints.
const PRIVILEGED_SCC: Rule = Rule {
    groups: &["security.openshift.io"],
    resources: &["securitycontextconstraints"],
    verbs: &["use"],
    names: &["privileged"],
};
const READ_NODES: Rule = rule!(&[""], &["nodes"], &["get", "list", "watch"]);
const CLUSTER_VERSIONS: Rule = rule!(&["config.openshift.io"], &["clusterversions"], &["get", "list"]);
const NODE_FEATURES: Rule = rule!(
    &["nfd.k8s-sigs.io"],
    &["nodefeatures"],
    &["create", "get", "list", "watch", "update"],
);
const EVICT_PODS: Rule = rule!(&[""], &["pods/eviction"], &["create"]);
const WATCH_PODS: Rule = rule!(&[""], &["pods"], &["get", "list", "watch"]);

/// The ServiceAccount, Role and ClusterRole of an operand.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    /// Name of the ServiceAccount and of its roles and bindings.
    pub account: &'static str,
    role: &'static [Rule],
    cluster_role: &'static [Rule],
}

/// The access an operand's pods have.
pub(crate) fn access(operand: Operand) -> Access {
    use Operand::*;
    let (account, role, cluster_role): (&str, &[Rule], &[Rule]) = match operand {
        Driver => (
            "nvidia-driver",
            &[PRIVILEGED_SCC],
            &[
                CLUSTER_VERSIONS,
                rule!(&[""], &["nodes"], &["get", "list", "patch", "update", "watch"]),
                WATCH_PODS,
                EVICT_PODS,
                // The driver manager finds GPU pods allocated through DRA before evicting them.
                rule!(&["resource.k8s.io"], &["resourceclaims"], &["get", "list"]),
                rule!(&["apps"], &["daemonsets"], &["get"]),
            ],
        ),
        ContainerToolkit => (
            "nvidia-container-toolkit",
            &[PRIVILEGED_SCC, rule!(&["apps"], &["daemonsets"], &["list"])],
            &[],
        ),
        OperatorValidator => (
            "nvidia-operator-validator",
            &[
                PRIVILEGED_SCC,
                rule!(
                    &[""],
                    &["pods"],
                    &["create", "get", "list", "watch", "update", "patch", "delete"],
                ),
                rule!(&["apps"], &["daemonsets"], &["get", "list", "watch"]),
            ],
            &[
                READ_NODES,
                rule!(
                    &[GROUP],
                    &["clusterpolicies/finalizers", "nvidiadrivers/finalizers"],
                    &["create", "get", "list", "watch", "update", "patch", "delete"],
                ),
            ],
        ),
        DevicePlugin => ("nvidia-device-plugin", &[PRIVILEGED_SCC], &[READ_NODES]),
        MpsControlDaemon => (
            "nvidia-device-plugin-mps-control-daemon",
            &[PRIVILEGED_SCC],
            &[READ_NODES],
        ),
        Dcgm => ("nvidia-dcgm", &[PRIVILEGED_SCC], &[]),
        DcgmExporter => (
            "nvidia-dcgm-exporter",
            &[PRIVILEGED_SCC, rule!(&[""], &["configmaps"], &["get", "list"])],
            &[],
        ),
        GpuFeatureDiscovery => (
            "nvidia-gpu-feature-discovery",
            &[
                PRIVILEGED_SCC,
                rule!(
                    &["nfd.k8s-sigs.io"],
                    &["nodefeatures"],
                    &["get", "list", "watch", "create", "update"],
                ),
                rule!(&[""], &["pods"], &["get"]),
            ],
            &[READ_NODES],
        ),
        MigManager => (
            "nvidia-mig-manager",
            &[
                PRIVILEGED_SCC,
                rule!(&[""], &["pods"], &["get", "list", "watch", "delete"]),
                rule!(
                    &[""],
                    &["configmaps"],
                    &["create", "get", "list", "update", "patch"]
                ),
            ],
            &[
                rule!(&[""], &["nodes"], &["get", "list", "watch", "update", "patch"]),
                rule!(&[""], &["pods"], &["list"]),
            ],
        ),
        NodeStatusExporter => (
            "nvidia-node-status-exporter",
            &[
                rule!(
                    &["security.openshift.io"],
                    &["securitycontextconstraints"],
                    &["use"]
                ),
                rule!(&[""], &["pods"], &["get", "list"]),
                rule!(&["apps"], &["daemonsets"], &["get", "list", "watch"]),
            ],
            &[READ_NODES],
        ),
        VgpuManager => (
            "nvidia-vgpu-manager",
            &[PRIVILEGED_SCC],
            &[
                CLUSTER_VERSIONS,
                rule!(&[""], &["nodes"], &["get", "list", "patch", "watch"]),
                WATCH_PODS,
                EVICT_PODS,
                rule!(&["apps"], &["daemonsets"], &["get"]),
            ],
        ),
        VgpuDeviceManager => (
            "nvidia-vgpu-device-manager",
            &[PRIVILEGED_SCC, WATCH_PODS],
            &[
                CLUSTER_VERSIONS,
                rule!(&[""], &["nodes"], &["get", "list", "watch", "update"]),
            ],
        ),
        SandboxValidator => (
            "nvidia-sandbox-validator",
            &[PRIVILEGED_SCC],
            &[rule!(&[""], &["nodes"], &["get"])],
        ),
        VfioManager => (
            "nvidia-vfio-manager",
            &[PRIVILEGED_SCC],
            &[
                CLUSTER_VERSIONS,
                rule!(&[""], &["nodes"], &["get", "list", "patch", "watch"]),
                WATCH_PODS,
                EVICT_PODS,
            ],
        ),
        SandboxDevicePlugin => (
            "nvidia-sandbox-device-plugin",
            &SANDBOX_PLUGIN_ROLE,
            &SANDBOX_PLUGIN_CLUSTER_ROLE,
        ),
        KataSandboxDevicePlugin => (
            "nvidia-kata-sandbox-device-plugin",
            &SANDBOX_PLUGIN_ROLE,
            &SANDBOX_PLUGIN_CLUSTER_ROLE,
        ),
        CcManager => (
            "nvidia-cc-manager",
            &[PRIVILEGED_SCC, WATCH_PODS],
            &[rule!(&[""], &["nodes"], &["get", "list", "patch", "watch"])],
        ),
    };
    Access {
        account,
        role,
        cluster_role,
    }
}

const SANDBOX_PLUGIN_ROLE: [Rule; 3] = [
    PRIVILEGED_SCC,
    rule!(&[""], &["pods"], &["create", "get", "list", "watch", "delete"]),
    NODE_FEATURES,
];
const SANDBOX_PLUGIN_CLUSTER_ROLE: [Rule; 2] = [CLUSTER_VERSIONS, rule!(&[""], &["nodes", "pods"], &["get"])];

/// Name of the exporter's ClusterRole for reading pods, rendered only when metrics carry pod metadata.
pub(crate) const EXPORTER_READ_PODS: &str = "nvidia-dcgm-exporter-read-pods";

/// Adds the operand's ServiceAccount, Role, ClusterRole and bindings, in that order.
pub(crate) fn push_access(objects: &mut Objects, info: &OperandInfo) {
    push_access_named(
        objects,
        Owner::operand(info),
        info.operand,
        access(info.operand).account,
    );
}

/// Adds a ServiceAccount, Role, ClusterRole and bindings with the operand's rules under another name
/// (each NVIDIADriver pool has its own account with the driver's rules).
pub(crate) fn push_access_named(objects: &mut Objects, owner: Owner, operand: Operand, account: &str) {
    let access = access(operand);
    let namespace = objects.namespace().to_owned();
    let labels = asset_labels(operand, account, false);
    let cluster_labels = asset_labels(operand, account, true);
    objects.push(
        owner,
        ServiceAccount {
            metadata: meta(account, &labels),
            ..ServiceAccount::default()
        },
    );
    objects.push(
        owner,
        Role {
            metadata: meta(account, &labels),
            rules: Some(policy_rules(access.role)),
        },
    );
    if !access.cluster_role.is_empty() {
        push_cluster_role(objects, owner, account, access.cluster_role, &cluster_labels);
    }
    objects.push(
        owner,
        RoleBinding {
            metadata: meta(account, &labels),
            role_ref: role_ref("Role", account),
            subjects: Some(vec![subject(account, &namespace)]),
        },
    );
    if !access.cluster_role.is_empty() {
        push_cluster_role_binding(objects, owner, account, account, &cluster_labels);
    }
}

/// The labels NVIDIA's manifests give an operand's account and RBAC objects (`cluster`: its ClusterRoles
/// and bindings): `app` on the exporters' namespaced ones and the DCGM exporter's cluster-wide ones.
fn asset_labels(operand: Operand, account: &str, cluster: bool) -> Vec<(&'static str, &str)> {
    match (operand, cluster) {
        (Operand::DcgmExporter, _) | (Operand::NodeStatusExporter, false) => vec![("app", account)],
        _ => Vec::new(),
    }
}

/// The exporter's pod-reading ClusterRole and its binding to the exporter's account.
pub(crate) fn push_exporter_read_pods(objects: &mut Objects, info: &OperandInfo) {
    let owner = Owner::operand(info);
    let account = access(info.operand).account;
    let labels = asset_labels(info.operand, account, true);
    push_cluster_role(objects, owner, EXPORTER_READ_PODS, &[WATCH_PODS], &labels);
    push_cluster_role_binding(objects, owner, EXPORTER_READ_PODS, account, &labels);
}

fn push_cluster_role(
    objects: &mut Objects,
    owner: Owner,
    name: &str,
    rules: &[Rule],
    labels: &[(&str, &str)],
) {
    objects.push(
        owner,
        ClusterRole {
            metadata: meta(name, labels),
            rules: Some(policy_rules(rules)),
            aggregation_rule: None,
        },
    );
}

fn push_cluster_role_binding(
    objects: &mut Objects,
    owner: Owner,
    name: &str,
    account: &str,
    labels: &[(&str, &str)],
) {
    let namespace = objects.namespace().to_owned();
    objects.push(
        owner,
        ClusterRoleBinding {
            metadata: meta(name, labels),
            role_ref: role_ref("ClusterRole", name),
            subjects: Some(vec![subject(account, &namespace)]),
        },
    );
}

fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    rules
        .iter()
        .map(|rule| PolicyRule {
            api_groups: Some(strings(rule.groups)),
            resources: Some(strings(rule.resources)),
            verbs: strings(rule.verbs),
            resource_names: (!rule.names.is_empty()).then(|| strings(rule.names)),
            non_resource_urls: None,
        })
        .collect()
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

fn subject(account: &str, namespace: &str) -> Subject {
    Subject {
        api_group: None,
        kind: "ServiceAccount".to_owned(),
        name: account.to_owned(),
        namespace: Some(namespace.to_owned()),
    }
}
