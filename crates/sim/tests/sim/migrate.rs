//! Taking over a cluster that NVIDIA's operator converged: the DaemonSets as NVIDIA's operator writes them
//! for the sample policy (`testdata/nvidia-converged/`, see its README) run their pods on simulated nodes
//! labelled as NVIDIA labels them; `render --diff-live` predicts what taking over changes; then our
//! operator takes over, and no operand pod restarts.

use std::collections::BTreeMap;

use gpuop_api::ClusterPolicy;
use gpuop_api::labels::GpuDetection;
use gpuop_api::validate::ImageDefaults;
use gpuop_operator::apply::MANAGED_KINDS;
use gpuop_operator::diff_live::{Change, DiffReport, EXIT_NOTHING_RESTARTS, EXIT_PODS_RESTART};
use gpuop_operator::render_command::{DiffLiveInput, diff_live};
use gpuop_sim::demo::{DEFAULT_POLICY, NAMESPACE};
use gpuop_sim::hardware::GpuModel;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::operator::{Cluster, pool};

/// What NVIDIA's operator writes for the sample policy on containerd / Ubuntu 22.04, as the oracle test
/// captured it (see the README there), in the order it creates them (service accounts and RBAC before the
/// DaemonSets that use them).
fn nvidia_objects() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/nvidia-converged");
    let mut objects: Vec<Value> = std::fs::read_dir(&dir)
        .expect("testdata folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("testdata reads");
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect();
    let rank = |object: &Value| {
        MANAGED_KINDS
            .iter()
            .rev()
            .position(|k| k.kind == object["kind"])
            .expect("a kind the operator renders")
    };
    objects.sort_by_key(|object| {
        (
            rank(object),
            object["metadata"]["name"].as_str().map(str::to_owned),
        )
    });
    objects
}

/// The deploy labels NVIDIA's operator sets on a GPU node in the container workload configuration (its
/// `gpuStateLabels`), plus the MIG manager's on MIG-capable nodes.
fn nvidia_node_labels(mig_capable: bool) -> Value {
    let mut labels = json!({"nvidia.com/gpu.present": "true"});
    for operand in [
        "driver",
        "gpu-feature-discovery",
        "container-toolkit",
        "device-plugin",
        "dcgm",
        "dcgm-exporter",
        "node-status-exporter",
        "operator-validator",
        "client",
    ] {
        labels[format!("nvidia.com/gpu.deploy.{operand}")] = json!("true");
    }
    if mig_capable {
        labels["nvidia.com/gpu.deploy.mig-manager"] = json!("true");
    }
    labels
}

/// Every pod of the namespace, by name, with its uid.
async fn pod_uids(client: &Client) -> BTreeMap<String, String> {
    crate::pods::live(client, NAMESPACE, &ListParams::default())
        .await
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

/// Whether every DaemonSet of the namespace has all its pods ready (and some DaemonSet has pods).
async fn daemonsets_ready(client: &Client) -> Result<(), String> {
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let mut scheduled = 0;
    let mut lagging = Vec::new();
    for ds in &daemonsets {
        let status = ds.status.clone().unwrap_or_default();
        scheduled += status.desired_number_scheduled;
        if status.number_ready != status.desired_number_scheduled {
            lagging.push(format!(
                "{}: {}/{}",
                ds.name_any(),
                status.number_ready,
                status.desired_number_scheduled
            ));
        }
    }
    if scheduled > 0 && lagging.is_empty() {
        Ok(())
    } else {
        Err(format!("{scheduled} scheduled; lagging {lagging:?}"))
    }
}

async fn predict(client: &Client) -> DiffReport {
    let input = DiffLiveInput {
        namespace: NAMESPACE,
        detection: &GpuDetection::Nfd,
        image_defaults: &ImageDefaults::default(),
    };
    diff_live(client, input)
        .await
        .expect("diff-live reads the cluster")
}

/// A simulated cluster (one H100 node, one L4 node) on which NVIDIA's operator converged the sample policy:
/// its node labels, its objects (each passed through `tweak` first), their pods ready. Our operator is not
/// running.
async fn nvidia_converged(tweak: impl Fn(&mut Value)) -> Cluster {
    let cluster = Cluster::without_operator(vec![
        pool("h100", 1, Some(GpuModel::H100_80GB)),
        pool("l4", 1, Some(GpuModel::L4)),
    ])
    .await;
    // NVIDIA's operator writes as `gpu-operator` with Create and Update calls.
    let nvidia = cluster.server().client_as("gpu-operator");
    cluster.apply(DEFAULT_POLICY).await;
    let policy_uid = Api::<ClusterPolicy>::all(cluster.client.clone())
        .get("cluster-policy")
        .await
        .expect("policy exists")
        .uid()
        .expect("a uid");
    for (node, mig_capable) in [("h100-0", true), ("l4-0", false)] {
        Api::<Node>::all(nvidia.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": nvidia_node_labels(mig_capable)}})),
            )
            .await
            .expect("node labels");
    }
    for mut object in nvidia_objects() {
        object["metadata"]["ownerReferences"][0]["uid"] = json!(policy_uid);
        tweak(&mut object);
        let kind = MANAGED_KINDS
            .iter()
            .find(|k| k.kind == object["kind"])
            .expect("a kind the operator renders");
        let object: DynamicObject = serde_json::from_value(object).expect("an object");
        kind.api(nvidia.clone(), NAMESPACE)
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("NVIDIA's {} {} is created: {e}", kind.kind, object.name_any()));
    }
    let client = cluster.client.clone();
    cluster
        .until("NVIDIA's operand pods are ready", || daemonsets_ready(&client))
        .await;
    cluster
}

#[tokio::test]
async fn taking_over_from_nvidias_operator_restarts_no_operand_pod() {
    let mut cluster = nvidia_converged(|_| {}).await;
    let before = pod_uids(&cluster.client).await;
    assert!(
        before.keys().any(|p| p.starts_with("nvidia-mig-manager")),
        "the MIG manager runs on the H100 node: {before:?}"
    );

    let report = predict(&cluster.client).await;
    assert_eq!(
        report.restarts(),
        Vec::<(&str, &str, &str)>::new(),
        "{}",
        report.to_text()
    );
    assert_eq!(
        report.exit_status(),
        EXIT_NOTHING_RESTARTS,
        "{}",
        report.to_text()
    );
    for object in report.objects.iter().filter(|o| o.kind == "DaemonSet") {
        assert!(
            matches!(object.change, Change::MetadataOnly { .. }),
            "NVIDIA's {} gets our labels and hash, nothing else: {:?}",
            object.name,
            object.change
        );
    }

    cluster.start_operator().await;
    cluster.converged("cluster-policy").await;

    let after = pod_uids(&cluster.client).await;
    assert_eq!(
        after, before,
        "every operand pod kept running: same names, same uids"
    );
    let report = predict(&cluster.client).await;
    let changed: Vec<_> = report
        .objects
        .iter()
        .filter(|o| o.change != Change::Unchanged)
        .collect();
    assert!(
        changed.is_empty(),
        "the live objects are the rendered ones: {changed:#?}"
    );
    for object in nvidia_objects() {
        let kind = MANAGED_KINDS
            .iter()
            .find(|k| k.kind == object["kind"])
            .expect("known");
        let name = object["metadata"]["name"].as_str().expect("named");
        let live = kind
            .api(cluster.client.clone(), NAMESPACE)
            .get(name)
            .await
            .expect("still there");
        let foreign = live.metadata.managed_fields.iter().flatten().any(|e| {
            e.manager.as_deref() == Some("gpu-operator") && e.operation.as_deref() == Some("Update")
        });
        assert!(!foreign, "{} {name}: NVIDIA's fields are ours now", kind.kind);
    }
    for ds in Api::<DaemonSet>::namespaced(cluster.client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("daemonsets list")
        .items
    {
        assert!(
            !ds.annotations().contains_key("openshift.io/scc"),
            "{}: what only NVIDIA's operator set is gone",
            ds.name_any()
        );
        let updates: Vec<_> = ds
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|e| {
                e.manager.as_deref() == Some("gpu-operator") && e.operation.as_deref() == Some("Update")
            })
            .collect();
        assert!(
            updates.is_empty(),
            "{}: NVIDIA's fields are ours now",
            ds.name_any()
        );
    }
    let driver = Api::<DaemonSet>::namespaced(cluster.client.clone(), NAMESPACE)
        .get("nvidia-driver-daemonset")
        .await
        .expect("the driver DaemonSet");
    let digest = driver.spec.and_then(|s| s.template.spec).and_then(|pod| {
        pod.containers
            .into_iter()
            .flat_map(|c| c.env.unwrap_or_default())
            .find(|e| e.name == "DRIVER_CONFIG_DIGEST")
            .and_then(|e| e.value)
    });
    let nvidias = nvidia_objects()
        .into_iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "nvidia-driver-daemonset")
        .and_then(|driver| {
            let containers = driver["spec"]["template"]["spec"]["containers"]
                .as_array()?
                .clone();
            containers
                .iter()
                .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
                .find(|e| e["name"] == "DRIVER_CONFIG_DIGEST")
                .and_then(|e| e["value"].as_str().map(str::to_owned))
        });
    assert!(nvidias.is_some(), "NVIDIA's driver DaemonSet has a digest");
    assert_eq!(
        digest, nvidias,
        "the live driver digest is kept: the driver installs the same configuration"
    );
    cluster.stop().await;
}

#[tokio::test]
async fn a_field_only_nvidias_operator_set_goes_and_restarts_exactly_the_pods_diff_live_lists() {
    // As if NVIDIA's operator had set a variable on the device plugin that this operator does not render.
    let mut cluster = nvidia_converged(|object| {
        if object["kind"] == "DaemonSet" && object["metadata"]["name"] == "nvidia-device-plugin-daemonset" {
            object["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array_mut()
                .expect("env")
                .push(json!({"name": "NVIDIA_ONLY", "value": "1"}));
        }
    })
    .await;
    let before = pod_uids(&cluster.client).await;
    let report = predict(&cluster.client).await;
    let mut listed: Vec<String> = report
        .restarts()
        .iter()
        .map(|(_, _, pod)| (*pod).to_owned())
        .collect();
    listed.sort();
    let plugin_pods: Vec<String> = before
        .keys()
        .filter(|pod| pod.starts_with("nvidia-device-plugin-daemonset-"))
        .cloned()
        .collect();
    assert_eq!(listed, plugin_pods, "{}", report.to_text());
    assert_eq!(report.exit_status(), EXIT_PODS_RESTART);
    assert!(
        report
            .to_text()
            .contains("~ spec.template.spec.containers[nvidia-device-plugin].env"),
        "{}",
        report.to_text()
    );

    cluster.start_operator().await;
    cluster.converged("cluster-policy").await;
    let client = cluster.client.clone();
    cluster
        .until("the device plugin's pods are replaced", || {
            let client = client.clone();
            let plugin_pods = plugin_pods.clone();
            async move {
                let now = pod_uids(&client).await;
                let left: Vec<_> = plugin_pods.iter().filter(|p| now.contains_key(*p)).collect();
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?} still run"))
                }
            }
        })
        .await;
    cluster.converged("cluster-policy").await;
    let after = pod_uids(&cluster.client).await;
    for (pod, uid) in before.iter().filter(|(pod, _)| !listed.contains(pod)) {
        assert_eq!(after.get(pod), Some(uid), "{pod} was not listed and kept running");
    }
    let plugin = Api::<DaemonSet>::namespaced(cluster.client.clone(), NAMESPACE)
        .get("nvidia-device-plugin-daemonset")
        .await
        .expect("the device plugin DaemonSet");
    let env = serde_json::to_string(&plugin.spec.expect("spec").template).expect("serializes");
    assert!(
        !env.contains("NVIDIA_ONLY"),
        "what only NVIDIA's operator set is gone"
    );
    let report = predict(&cluster.client).await;
    assert_eq!(
        report.exit_status(),
        EXIT_NOTHING_RESTARTS,
        "{}",
        report.to_text()
    );
    cluster.stop().await;
}
