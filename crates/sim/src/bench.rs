//! `gpu-sim bench apiserver`: the fake API server at scale, measured the way clients meet it. The server
//! runs as its own process (`gpu-sim serve`, started from this binary), so its memory is its own; the
//! benchmark talks to it over loopback with kube clients:
//!
//! 1. create N nodes and M pods over HTTP (pods owned by a few DaemonSets, spread over the nodes);
//! 2. full LIST of nodes and of pods, raw (bytes on the wire) and decoded into k8s-openapi types;
//! 3. a label patch on one node reaching W watchers of all nodes;
//! 4. the server process's resident memory after loading and at its peak (`VmHWM`).
//!
//! Numbers are printed as a Markdown table for `BENCHMARKS.md`. This measures; it asserts nothing.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use gpuop_api::{Operand, labels};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::cli::ApiserverBenchArgs;

const NAMESPACE: &str = "gpu-operator";
const OPERANDS: [&str; 5] = [
    "nvidia-driver-daemonset",
    "nvidia-container-toolkit-daemonset",
    "nvidia-device-plugin-daemonset",
    "gpu-feature-discovery",
    "nvidia-dcgm-exporter",
];

fn node(index: usize) -> Value {
    let name = format!("gpu-node-{index:05}");
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": format!("zone-{}", index % 3),
            labels::GPU_PRESENT: "true", labels::GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3", labels::GPU_COUNT: "8",
            Operand::Driver.info().deploy_label: "true", Operand::DevicePlugin.info().deploy_label: "true",
            labels::NFD_NVIDIA_PCI[0]: "true"
        }},
        "spec": {"providerID": format!("aws:///zone/i-{index:017x}")},
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152Mi", labels::RESOURCE_GPU: "8", "pods": "110"},
            "allocatable": {"cpu": "191", "memory": "2090000Mi", labels::RESOURCE_GPU: "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", index / 65536 % 256, index / 256 % 256, index % 256)},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "containerRuntimeVersion": "containerd://2.0.0",
                         "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04 LTS", "operatingSystem": "linux",
                         "architecture": "amd64", "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""}
        }
    })
}

fn daemonset(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "gpu-operator"}},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": format!("nvcr.io/nvidia/{name}:v1")}]}}}
    })
}

fn pod(index: usize, nodes: usize, owner: &Value) -> Value {
    let operand = owner
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let node = format!("gpu-node-{:05}", index % nodes.max(1));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{operand}-{index:06}"), "namespace": NAMESPACE,
            "labels": {"app": operand, "controller-revision-hash": "6f7c9d8b5", "pod-template-generation": "1",
                       "app.kubernetes.io/managed-by": "gpu-operator"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": operand,
                                 "uid": owner.pointer("/metadata/uid"), "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "nodeName": node,
            "priorityClassName": "system-node-critical",
            "containers": [{
                "name": "main", "image": format!("nvcr.io/nvidia/{operand}:v1"),
                "args": ["--fail-on-init-error=false", "--mig-strategy=single"],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "resources": {"requests": {"cpu": "10m", "memory": "20Mi"}},
                "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "run-nvidia", "mountPath": "/run/nvidia"},
                                 {"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}]
            }],
            "volumes": [{"name": "run-nvidia", "hostPath": {"path": "/run/nvidia", "type": "DirectoryOrCreate"}},
                        {"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}],
            "tolerations": [{"key": labels::GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
        }
    })
}

/// A memory figure of process `pid` from `/proc/<pid>/status`, in MiB.
fn memory_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

async fn timed<T, F: std::future::Future<Output = anyhow::Result<T>>>(
    rounds: usize,
    mut run: impl FnMut() -> F,
) -> anyhow::Result<(Duration, Duration, T)> {
    let mut samples = Vec::new();
    let mut last = None;
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        last = Some(run().await?);
        samples.push(start.elapsed());
    }
    let best = samples.iter().min().copied().unwrap_or_default();
    Ok((median(&mut samples), best, last.context("at least one round")?))
}

/// `gpu-sim serve` as a child process; killed when dropped.
struct ServerProcess {
    child: Child,
    url: String,
}

impl ServerProcess {
    fn start() -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["serve", "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting gpu-sim serve")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut url = String::new();
        BufReader::new(stdout)
            .read_line(&mut url)
            .context("reading the server's address")?;
        Ok(Self {
            child,
            url: url.trim().to_owned(),
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&gpuop_fakeserver::kubeconfig_yaml(&self.url))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(crate::USER_AGENT),
        ));
        Ok(kube::Client::try_from(config)?)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates `objects` through `api`, `concurrency` at a time.
async fn create_all<K>(
    api: &Api<K>,
    objects: impl Iterator<Item = Value>,
    concurrency: usize,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(objects)
        .map(|object| async move {
            let object: K = serde_json::from_value(object)?;
            api.create(&PostParams::default(), &object).await?;
            Ok(())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Runs the benchmark and prints its report.
pub async fn apiserver(args: ApiserverBenchArgs) -> anyhow::Result<()> {
    let server = ServerProcess::start()?;
    let client = server.client().await?;
    let rss_empty = memory_mib(server.pid(), "VmRSS:").unwrap_or_default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let mut owners = Vec::new();
    for name in OPERANDS {
        let created = daemonsets
            .create(&PostParams::default(), &serde_json::from_value(daemonset(name))?)
            .await?;
        owners.push(serde_json::to_value(created)?);
    }

    let nodes_api: Api<Node> = Api::all(client.clone());
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    create_all(&nodes_api, (0..args.nodes).map(node), 16).await?;
    let nodes_loaded = start.elapsed();
    let start = Instant::now();
    create_all(
        &pods_api,
        (0..args.pods).map(|i| pod(i, args.nodes, &owners[i % owners.len()])),
        16,
    )
    .await?;
    let pods_loaded = start.elapsed();
    let rss_loaded = memory_mib(server.pid(), "VmRSS:").unwrap_or_default();
    let rounds = args.rounds;

    let raw = |path: &'static str| {
        let client = client.clone();
        move || {
            let client = client.clone();
            async move {
                let request = http::Request::get(path).body(Vec::new())?;
                Ok(client.request_text(request).await?.len())
            }
        }
    };
    let (nodes_raw, nodes_raw_best, nodes_bytes) = timed(rounds, raw("/api/v1/nodes")).await?;
    let (pods_raw, pods_raw_best, pods_bytes) = timed(rounds, raw("/api/v1/pods")).await?;
    let all_pods: Api<Pod> = Api::all(client.clone());
    let (nodes_typed, _, nodes_count) = timed(rounds, || async {
        Ok(nodes_api.list(&ListParams::default()).await?.items.len())
    })
    .await?;
    let (pods_typed, _, pods_count) = timed(rounds, || async {
        Ok(all_pods.list(&ListParams::default()).await?.items.len())
    })
    .await?;
    let (pods_paged, _, paged_count) = timed(rounds, || async {
        let mut count = 0;
        let mut params = ListParams::default().limit(500);
        loop {
            let page = all_pods.list(&params).await?;
            count += page.items.len();
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        Ok(count)
    })
    .await?;
    anyhow::ensure!(
        nodes_count == args.nodes && pods_count == args.pods && paged_count == args.pods,
        "lists are incomplete: {nodes_count} nodes, {pods_count} pods, {paged_count} paged pods"
    );

    let (fanout_median, fanout_worst) = fan_out(&client, args.watchers, rounds.max(5)).await?;
    let peak = memory_mib(server.pid(), "VmHWM:").unwrap_or_default();

    let per = |total: Duration, count: usize| total.as_secs_f64() * 1e6 / count.max(1) as f64;
    println!("| measurement | result |");
    println!("|---|---|");
    println!("| server RSS, empty | {rss_empty:.0} MiB |");
    println!(
        "| create {} nodes over HTTP, 16 in flight | {} ({:.0} µs/node) |",
        args.nodes,
        ms(nodes_loaded),
        per(nodes_loaded, args.nodes)
    );
    println!(
        "| create {} pods over HTTP, 16 in flight | {} ({:.0} µs/pod) |",
        args.pods,
        ms(pods_loaded),
        per(pods_loaded, args.pods)
    );
    println!("| server RSS after loading | {rss_loaded:.0} MiB |");
    println!(
        "| LIST all nodes, raw ({:.1} MiB) | median {}, best {} |",
        nodes_bytes as f64 / 1_048_576.0,
        ms(nodes_raw),
        ms(nodes_raw_best)
    );
    println!("| LIST all nodes, decoded by kube | median {} |", ms(nodes_typed));
    println!(
        "| LIST all pods, raw ({:.1} MiB) | median {}, best {} |",
        pods_bytes as f64 / 1_048_576.0,
        ms(pods_raw),
        ms(pods_raw_best)
    );
    println!("| LIST all pods, decoded by kube | median {} |", ms(pods_typed));
    println!(
        "| LIST all pods in pages of 500, decoded | median {} |",
        ms(pods_paged)
    );
    println!(
        "| label patch on one node seen by all {} node watchers | median {}, worst {} |",
        args.watchers,
        ms(fanout_median),
        ms(fanout_worst)
    );
    println!("| server peak RSS (VmHWM) | {peak:.0} MiB |");
    Ok(())
}

/// Patches one node's label and times until every watcher has the event; returns (median, worst).
async fn fan_out(
    client: &kube::Client,
    watchers: usize,
    rounds: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let version = nodes
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let (seen, mut arrivals) = mpsc::unbounded_channel::<(String, Instant)>();
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let mut stream = nodes
            .watch(&WatchParams::default().timeout(290), &version)
            .await?
            .boxed();
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Modified(node) = event
                    && let Some(round) = node
                        .metadata
                        .labels
                        .and_then(|l| l.get("bench.gpuop/round").cloned())
                    && seen.send((round, Instant::now())).is_err()
                {
                    return;
                }
            }
        }));
    }
    // Let every watch reach the server before the first patch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut samples = Vec::new();
    for round in 0..rounds {
        let label = round.to_string();
        let start = Instant::now();
        let patch = Patch::Merge(json!({"metadata": {"labels": {"bench.gpuop/round": label}}}));
        nodes
            .patch("gpu-node-00000", &PatchParams::default(), &patch)
            .await?;
        let mut reached = 0;
        let mut last = start;
        while reached < watchers {
            let (got, at) = tokio::time::timeout(Duration::from_secs(30), arrivals.recv())
                .await
                .context("a watcher missed the patch")?
                .context("watchers ended")?;
            if got == label {
                reached += 1;
                last = last.max(at);
            }
        }
        samples.push(last - start);
    }
    for task in tasks {
        task.abort();
    }
    let worst = samples.iter().max().copied().unwrap_or_default();
    Ok((median(&mut samples), worst))
}
