//! `gpu-sim serve --authorization rbac` driven by the real kubectl: the admin kubeconfig it writes,
//! `kubectl create token`, kubectl's own messages for 401 and 403, `kubectl auth can-i` and `whoami`, and
//! the authorization report read back over HTTP, the way an end-to-end test of the chart's RBAC uses them.

use serde_json::Value;

use crate::cluster::{Cluster, eventually};

const SA_USER: &str = "system:serviceaccount:gpu-operator:gpu-operator";

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn service_account_tokens_are_held_to_their_bindings() {
    let cluster = Cluster::start_rbac(&[]);
    let roles = cluster.ok(&["get", "clusterroles"]);
    for bootstrap in [
        "cluster-admin",
        "system:discovery",
        "system:basic-user",
        "system:public-info-viewer",
    ] {
        assert!(roles.contains(bootstrap), "{bootstrap} missing: {roles}");
    }
    cluster.ok(&["create", "namespace", "gpu-operator"]);
    cluster.ok(&["create", "serviceaccount", "gpu-operator", "-n", "gpu-operator"]);
    let token = cluster.ok(&["create", "token", "gpu-operator", "-n", "gpu-operator"]);
    let token = token.trim();
    assert!(!token.is_empty());

    let refused = cluster.run(&["--token", token, "get", "nodes"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains(&format!(
            "Error from server (Forbidden): nodes is forbidden: User \"{SA_USER}\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        )),
        "{}",
        stderr(&refused)
    );
    let no = cluster.run(&["--token", token, "auth", "can-i", "list", "nodes"]);
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    let whoami = cluster.ok(&["--token", token, "auth", "whoami"]);
    assert!(whoami.contains(SA_USER), "{whoami}");

    cluster.ok(&[
        "create",
        "clusterrole",
        "node-reader",
        "--verb=get,list,watch",
        "--resource=nodes",
    ]);
    cluster.ok(&[
        "create",
        "clusterrolebinding",
        "node-reader",
        "--clusterrole=node-reader",
        "--serviceaccount=gpu-operator:gpu-operator",
    ]);
    let yes = cluster.ok(&["--token", token, "auth", "can-i", "list", "nodes"]);
    assert_eq!(yes.trim(), "yes");
    cluster.ok(&["--token", token, "get", "nodes"]);
    let impersonated = cluster.ok(&["auth", "can-i", "list", "nodes", "--as", SA_USER]);
    assert_eq!(impersonated.trim(), "yes", "the admin may impersonate");
    let list = cluster.ok(&["--token", token, "auth", "can-i", "--list"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("nodes ") && l.contains("[get list watch]")),
        "{list}"
    );
    let can_i = cluster.run(&["--token", token, "auth", "can-i", "delete", "nodes"]);
    assert_eq!(String::from_utf8_lossy(&can_i.stdout).trim(), "no");

    let unauthorized = cluster.run(&["--token", "not-a-token", "get", "nodes"]);
    assert!(
        stderr(&unauthorized).contains("You must be logged in to the server"),
        "{}",
        stderr(&unauthorized)
    );

    let report: Value =
        serde_json::from_str(&cluster.ok(&["get", "--raw", "/fake/authorization"])).expect("JSON report");
    assert_eq!(report["mode"], "rbac");
    let denied: Vec<&str> = report["denied"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["user"] == SA_USER)
        .filter_map(|d| d["verb"].as_str())
        .collect();
    assert_eq!(denied, ["list"], "{report}");
    let rules = report["users"][SA_USER]["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let node_reader = rules
        .iter()
        .find(|r| r["role"]["name"] == "node-reader")
        .expect("the node-reader rule is granted");
    assert_eq!(node_reader["used"], 1, "{node_reader}");
    let refused = cluster.run(&["--token", token, "get", "--raw", "/fake/authorization"]);
    assert!(stderr(&refused).contains("Forbidden"), "{}", stderr(&refused));
}

#[test]
fn the_simulated_cluster_runs_under_rbac() {
    let cluster = Cluster::up_rbac(&[]);
    eventually("the simulated nodes are listed", || {
        let nodes = cluster.items(&["get", "nodes"]);
        if nodes.is_empty() {
            Err("no nodes".into())
        } else {
            Ok(())
        }
    });
    let anonymous = cluster.run(&[
        "--token",
        "",
        "--username",
        "x",
        "--password",
        "y",
        "get",
        "nodes",
    ]);
    assert!(!anonymous.status.success());
}
