//! Black-box tests: `gpu-sim serve` and `gpu-sim up` driven by the real `/usr/bin/kubectl`, as a person or
//! a script would use them. Every test fails, saying so, where kubectl is not installed.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Cluster, eventually, first_line, repository_root, testdata};

#[test]
fn apply_client_side_then_server_side() {
    let cluster = Cluster::start(&[]);
    let manifest = std::fs::read_to_string(testdata("operands.yaml")).expect("testdata");
    let first = cluster.ok(&["apply", "-f", &cluster.write("v1.yaml", &manifest)]);
    assert!(
        first.contains("daemonset.apps/nvidia-device-plugin-daemonset created"),
        "{first}"
    );
    assert!(first.contains("configmap/settings created"), "{first}");

    // A changed manifest: kubectl computes a strategic merge patch against its last-applied annotation.
    let changed = manifest
        .replace("value: single", "value: mixed")
        .replace("strategy: single", "strategy: mixed");
    let second = cluster.ok(&["apply", "-f", &cluster.write("v2.yaml", &changed)]);
    assert!(
        second.contains("daemonset.apps/nvidia-device-plugin-daemonset configured"),
        "{second}"
    );
    let ds = cluster.json(&["get", "daemonset", "nvidia-device-plugin-daemonset"]);
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"],
        "mixed"
    );
    assert_eq!(ds["metadata"]["generation"], 2);
    assert_eq!(
        ds["spec"]["updateStrategy"]["type"], "RollingUpdate",
        "server defaults are visible"
    );
    assert_eq!(
        cluster.json(&["get", "configmap", "settings"])["data"]["strategy"],
        "mixed"
    );

    // Server-side apply, with validation left on: the fake server's OpenAPI says it validates.
    let applied = cluster.ok(&[
        "apply",
        "--server-side",
        "-f",
        &cluster.write("v2.yaml", &changed),
    ]);
    assert!(applied.contains("serverside-applied"), "{applied}");
    let conflicting = changed.replace("value: mixed", "value: none");
    let path = cluster.write("v3.yaml", &conflicting);
    let refused = cluster.run(&[
        "apply",
        "--server-side",
        "--field-manager=someone-else",
        "-f",
        &path,
    ]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("conflict"), "{message}");
    cluster.ok(&[
        "apply",
        "--server-side",
        "--field-manager=someone-else",
        "--force-conflicts",
        "-f",
        &path,
    ]);
    let ds = cluster.json(&["get", "daemonset", "nvidia-device-plugin-daemonset"]);
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"],
        "none"
    );
}

#[test]
fn get_watch_label_and_metrics() {
    let cluster = Cluster::start(&["--load", testdata("load").to_str().expect("utf-8")]);
    let loaded = cluster.json(&[
        "get",
        "configmaps",
        "-n",
        "gpu-operator",
        "default-mig-parted-config",
    ]);
    assert!(
        loaded["data"]["config.yaml"]
            .as_str()
            .is_some_and(|c| c.contains("all-disabled"))
    );

    let mut watch = cluster
        .command(&["get", "configmap", "default-mig-parted-config", "-n", "gpu-operator", "-w", "-o",
                   "jsonpath={.metadata.labels.nvidia\\.com/mig\\.config}{\"|\"}{.metadata.resourceVersion}{\"\\n\"}"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kubectl get -w");
    let stdout = watch.stdout.take().expect("stdout");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let initial = received
        .recv_timeout(Duration::from_secs(30))
        .expect("the current state first");
    assert!(initial.starts_with('|'), "no label yet: {initial:?}");
    let labelled = cluster.ok(&[
        "label",
        "configmap",
        "default-mig-parted-config",
        "-n",
        "gpu-operator",
        "nvidia.com/mig.config=all-1g.10gb",
    ]);
    assert!(labelled.contains("labeled"), "{labelled}");
    let change = received
        .recv_timeout(Duration::from_secs(30))
        .expect("the watch sees the change");
    assert!(change.starts_with("all-1g.10gb|"), "{change:?}");
    let _ = watch.kill();
    let _ = watch.wait();

    let metrics = cluster.ok(&["get", "--raw", "/metrics"]);
    let patches = metrics
        .lines()
        .find(|l| {
            l.starts_with("apiserver_request_total{verb=\"PATCH\"") && l.contains("resource=\"configmaps\"")
        })
        .expect("the label patch is counted");
    assert!(patches.contains("client=\"kubectl/"), "{patches}");
    assert!(patches.ends_with(" 1"), "{patches}");
}

#[test]
fn delete_and_wait_for_delete() {
    let cluster = Cluster::start(&[]);
    cluster.ok(&["create", "configmap", "held"]);
    // Sets the ConfigMap's finalizers, given as JSON, by a merge patch.
    let set_finalizers = |finalizers: &str| {
        let patch = format!(r#"{{"metadata":{{"finalizers":{finalizers}}}}}"#);
        cluster.ok(&["patch", "configmap", "held", "--type=merge", "-p", &patch]);
    };
    set_finalizers(r#"["example.com/hold"]"#);
    cluster.ok(&["delete", "configmap", "held", "--wait=false"]);
    let held = cluster.json(&["get", "configmap", "held"]);
    assert!(
        held["metadata"]["deletionTimestamp"].is_string(),
        "waits for its finalizer"
    );

    let mut wait = cluster
        .command(&["wait", "--for=delete", "configmap/held", "--timeout=60s"])
        .spawn()
        .expect("kubectl wait");
    set_finalizers("null");
    let status = wait.wait().expect("kubectl wait ends");
    assert!(status.success(), "kubectl wait --for=delete saw the deletion");
    let gone = cluster.run(&["get", "configmap", "held"]);
    assert!(String::from_utf8_lossy(&gone.stderr).contains(r#"configmaps "held" not found"#));

    cluster.ok(&["create", "configmap", "plain"]);
    let deleted = cluster.ok(&["delete", "configmap", "plain"]);
    assert!(deleted.contains(r#"configmap "plain" deleted"#), "{deleted}");
}

#[test]
fn create_generators_and_drain_use_protobuf_bodies() {
    let cluster = Cluster::start(&[]);
    // kubectl's typed clients send these bodies as protobuf.
    cluster.ok(&["create", "configmap", "literal", "--from-literal=strategy=single"]);
    assert_eq!(
        cluster.json(&["get", "configmap", "literal"])["data"]["strategy"],
        "single"
    );
    cluster.ok(&["create", "secret", "generic", "token", "--from-literal=key=hi"]);
    assert_eq!(cluster.json(&["get", "secret", "token"])["data"]["key"], "aGk=");
    cluster.ok(&["create", "namespace", "gpu-operator"]);
    cluster.ok(&["create", "serviceaccount", "gpu-operator", "-n", "gpu-operator"]);

    let fixture = testdata("node-with-pod.yaml");
    cluster.ok(&["apply", "-f", fixture.to_str().expect("utf-8")]);
    let drained = cluster.ok(&["drain", "gpu-node-1", "--force", "--timeout=60s"]);
    assert!(drained.contains("pod/cuda-job evicted"), "{drained}");
    assert_eq!(
        cluster.json(&["get", "node", "gpu-node-1"])["spec"]["unschedulable"],
        true
    );
    let metrics = cluster.ok(&["get", "--raw", "/metrics"]);
    assert!(
        metrics
            .lines()
            .any(|l| l.contains(r#"resource="pods",subresource="eviction""#) && l.contains(r#"code="201""#)),
        "{metrics}"
    );
}

#[test]
fn custom_resources_are_validated_as_by_the_api_server() {
    let cluster = Cluster::start(&[]);
    let crd = testdata("clusterpolicy-crd.yaml");
    cluster.ok(&["apply", "-f", crd.to_str().expect("utf-8")]);
    let resources = cluster.ok(&["api-resources", "--api-group=nvidia.com"]);
    assert!(resources.contains("clusterpolicies"), "{resources}");
    let invalid = testdata("invalid-policy.yaml");
    let refused = cluster.run(&["apply", "-f", invalid.to_str().expect("utf-8")]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains(r#"The ClusterPolicy "cluster-policy" is invalid"#),
        "{message}"
    );
    assert!(
        message.contains("spec.driver.enabled: Invalid value: \"string\""),
        "{message}"
    );
    assert!(
        message.contains(r#"spec.mig.strategy: Unsupported value: "double""#),
        "{message}"
    );
}

/// A node's name, and a label of it (`None` when absent).
fn node_label<'a>(node: &'a Value, key: &str) -> Option<&'a str> {
    node["metadata"]["labels"][key].as_str()
}

fn names(items: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = items
        .iter()
        .filter_map(|item| item["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[test]
fn up_serves_the_demo_cluster_and_plays_the_scenario() {
    let scenario = testdata("up-scenario.yaml");
    let cluster = Cluster::up(&["--scenario", scenario.to_str().expect("utf-8")]);
    // The scenario names no cluster: the demo cluster's seven nodes, as NFD and the kubelets left them.
    let nodes = eventually("the demo cluster's nodes", || {
        let nodes = cluster.items(&["get", "nodes"]);
        if nodes.len() == 7 {
            Ok(nodes)
        } else {
            Err(format!("{:?}", names(&nodes)))
        }
    });
    assert_eq!(
        names(&nodes),
        [
            "a100-0",
            "a100-1",
            "cpu-0",
            "h100-0",
            "h100-1",
            "l4-host-driver-0",
            "t4-reserved-0"
        ]
    );
    for node in &nodes {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let gpu = node_label(node, "feature.node.kubernetes.io/pci-10de.present");
        assert_eq!(
            gpu,
            (name != "cpu-0").then_some("true"),
            "NFD's GPU label on {name}"
        );
        assert_eq!(
            node_label(node, "feature.node.kubernetes.io/system-os_release.ID"),
            Some("ubuntu"),
            "{name}"
        );
        let ready = node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{name} is Ready");
        assert!(
            node["status"]["nodeInfo"]["containerRuntimeVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("containerd://")),
            "{name}"
        );
    }
    let preinstalled = nodes
        .iter()
        .find(|n| n["metadata"]["name"] == "l4-host-driver-0")
        .expect("the node with a host driver");
    assert_eq!(
        node_label(preinstalled, "nvidia.com/gpu.deploy.driver"),
        Some("false")
    );

    // The timeline: a person labels a100-0 and taints h100-1.
    eventually("the scenario's label and taint", || {
        let labelled = cluster.json(&["get", "node", "a100-0"]);
        let tainted = cluster.json(&["get", "node", "h100-1"]);
        let has_taint = tainted["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"] == "maintenance" && t["effect"] == "NoSchedule");
        match (node_label(&labelled, "example.com/team"), has_taint) {
            (Some("vision"), true) => Ok(()),
            (label, _) => Err(format!("label {label:?}, taints {}", tainted["spec"]["taints"])),
        }
    });

    // The simulated cluster runs what kubectl applies: a DaemonSet for GPU nodes rolls out to those it
    // tolerates (not the two tainted ones), and kubectl's own rollout check agrees.
    let monitor = testdata("gpu-monitor.yaml");
    cluster.ok(&["apply", "-f", monitor.to_str().expect("utf-8")]);
    let rollout = cluster.ok(&["rollout", "status", "daemonset/gpu-monitor", "--timeout=60s"]);
    assert!(rollout.contains("successfully rolled out"), "{rollout}");
    let status = cluster.json(&["get", "daemonset", "gpu-monitor"])["status"].clone();
    assert_eq!(status["desiredNumberScheduled"], 4, "{status}");
    assert_eq!(status["numberReady"], 4, "{status}");
    let pods = cluster.items(&["get", "pods", "-l", "app=gpu-monitor"]);
    let mut on: Vec<&str> = pods
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    on.sort_unstable();
    assert_eq!(on, ["a100-0", "a100-1", "h100-0", "l4-host-driver-0"]);
}

/// The `gpu-sim serve` line of docs/fakeserver.md's "On a socket" example, as `gpu-sim`'s arguments: what
/// a newcomer types first (issue 12). `--kubeconfig-out FILE` and the shell's redirection and `&` are left
/// out; the test gives its own kubeconfig.
fn documented_serve_command() -> Vec<String> {
    let page = std::fs::read_to_string(repository_root().join("docs/fakeserver.md")).expect("the page");
    let line = page
        .lines()
        .find_map(|line| line.strip_prefix("$ gpu-sim serve "))
        .expect("docs/fakeserver.md shows `$ gpu-sim serve ...`");
    let mut words = line.split_whitespace().map(str::to_owned).peekable();
    let mut args = vec!["serve".to_owned()];
    while let Some(word) = words.next() {
        match word.as_str() {
            "--kubeconfig-out" => {
                words.next();
            }
            ">" => {
                words.next();
            }
            "&" => {}
            _ if word.starts_with('>') => {}
            _ => args.push(word),
        }
    }
    args
}

#[test]
fn the_documented_serve_command_works_as_written() {
    let args = documented_serve_command();
    assert!(args.iter().any(|a| a == "--load"), "{args:?}");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cluster = Cluster::documented(&args);
    // The page's next command, and the sample the example loads.
    let namespaces = cluster.ok(&["get", "ns", "-o", "name"]);
    assert!(namespaces.contains("namespace/default"), "{namespaces}");
    let policies = cluster.ok(&["get", "clusterpolicies", "-o", "name"]);
    assert_eq!(policies.trim(), "clusterpolicy.nvidia.com/cluster-policy");
}

/// Runs `gpu-sim` from the repository's root to its end, with a backtrace asked for as a developer's shell
/// often has it, stderr a pipe (not a terminal) and colour not refused; returns (status, stderr).
fn gpu_sim_fails(args: &[&str]) -> (Option<i32>, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-sim"))
        .current_dir(repository_root())
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .expect("gpu-sim runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_load_the_server_refuses_is_one_line_naming_the_file_and_object() {
    // The samples are alternatives (three ClusterPolicies named cluster-policy), and one needs the
    // gpu-operator namespace, which a real API server would not create either.
    let (status, stderr) = gpu_sim_fails(&["serve", "--port", "0", "--load", "deploy/samples/"]);
    assert_eq!(status, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "error: --load: deploy/samples/clusterpolicy-mig-mixed-time-slicing.yaml: ConfigMap \
         \"time-slicing-config\": namespaces \"gpu-operator\" not found\n"
    );
}

#[test]
fn a_scenario_mistake_is_one_line_naming_the_file_line_column_and_entry() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("reboot.yaml");
    std::fs::write(&path, "timeline:\n  - {at: 5s, nodeReboots: a100-0}\n").expect("written");
    let (status, stderr) = gpu_sim_fails(&["up", "--port", "0", "--scenario", path.to_str().expect("utf-8")]);
    assert_eq!(status, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: {}:2:5: timeline[0]: unknown event `nodeReboots`; the events are nodeJoins, nodeLeaves, \
             nodeNotReady, nodeReady, driverInstallFails, xid, crashLoop, slowImagePulls, label, taint, apply, \
             patch, delete\n",
            path.display()
        )
    );
}

#[test]
fn logs_to_a_pipe_are_plain_text() {
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-sim"))
        .args(["serve", "--port", "0"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpu-sim starts");
    let stderr = server.stderr.take().expect("stderr");
    let line = first_line(stderr).recv_timeout(Duration::from_secs(30));
    let _ = server.kill();
    let _ = server.wait();
    let line = line.expect("gpu-sim logs that it serves");
    assert!(line.contains("serving the fake API server"), "{line:?}");
    assert!(!line.contains('\u{1b}'), "no ANSI escapes in {line:?}");
}
