//! `kubectl gpu bundle`: one tar.gz a person attaches to a support ticket, in place of a must-gather script.
//! It holds the snapshot (what `kubectl gpu snapshot` writes), the doctor's report and upgrade plan as the
//! commands print them, the ClusterPolicies and NVIDIADrivers with their status, the Events of the operator
//! namespace and of the GPU nodes, and the logs of the operator's and operands' containers (the previous
//! run too, where a container restarted), each log bounded ([`Bounds`]). `index.json` lists every file and
//! everything that could not be collected, and why.
//!
//! Invariants: no Secret is ever read or written (nothing here lists secrets; the snapshot holds only the
//! kinds in [`crate::snapshot::KINDS`]), and environment values whose name says secret are redacted from
//! the custom resources ([`redact`]). `doctor --snapshot BUNDLE.tar.gz` reads the archive's `snapshot.json`
//! ([`crate::load`] tells an archive by its magic bytes), so the bundle answers every command as the live
//! cluster did.
//!
//! What to collect ([`log_targets`], [`Bounds`]) and the archive ([`write_archive`]) are decided without a
//! client; [`collect`] does the requests.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use gpuop_api::labels::GpuDetection;
use gpuop_api::selector::LabelSelector;
use gpuop_api::{ClusterPolicy, NVIDIADriver, Operand};
use kube::Resource;
use kube::api::{ApiResource, DynamicObject, ListParams, LogParams};
use serde::Serialize;
use serde_json::{Value, json};

use crate::analysis::analyze_with;
use crate::live::{ConnectionArgs, Live, LiveError, Reads};
use crate::snapshot::{ContainerStatusFacts, PodFacts, Snapshot};
use crate::{table, upgrade_plan};

/// The operator's namespace when none is given.
pub const DEFAULT_NAMESPACE: &str = "gpu-operator";

/// `kubectl gpu bundle` arguments.
#[derive(Debug, Args)]
pub struct BundleArgs {
    /// The archive to write (`-` for standard output; default `gpu-bundle-<UTC time>.tar.gz` here).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The operator's namespace: its pods' logs and its Events are collected.
    #[arg(short = 'n', long, default_value = DEFAULT_NAMESPACE, value_name = "NAMESPACE")]
    pub namespace: String,
    /// How to reach the cluster.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Also take nodes matching this label selector as GPU nodes, as the operator's `--gpu-node-selector`
    /// does (clusters without NFD); give the operator's value, so the two judge the same nodes.
    #[arg(long, value_name = "SELECTOR")]
    pub gpu_node_selector: Option<LabelSelector>,
}

/// How much of each log is kept. Logs are the bulk of a bundle; the ends of logs are what explain a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bounds {
    /// `tailLines` of each log request: the last lines of a container's log.
    pub tail_lines: i64,
    /// `limitBytes` of each log request: at most this many bytes of those lines (their beginning).
    pub limit_bytes: i64,
    /// All logs together; once spent, further logs are listed as not collected.
    pub total_log_bytes: i64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            tail_lines: 2_000,
            limit_bytes: 256 * 1024,
            total_log_bytes: 32 * 1024 * 1024,
        }
    }
}

/// A file of the archive, as the index lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexedFile {
    /// Path inside the archive's top directory.
    pub path: String,
    /// What it is.
    pub what: String,
    /// Its size.
    pub bytes: usize,
    /// Where it was cut, and by which bound; `None` when whole (as far as the server said).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
}

/// Something that could not be collected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Missing {
    /// What was asked for.
    pub what: String,
    /// Why not: the server's answer, or the bound that stopped it.
    pub why: String,
}

/// `index.json`, schema `gpu-bundle/v1`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// `gpu-bundle/v1`.
    pub schema: &'static str,
    /// When the bundle was made (UTC, RFC 3339).
    pub created: String,
    /// The doctor's version.
    pub doctor_version: &'static str,
    /// The operator namespace collected.
    pub namespace: String,
    /// The log bounds in force.
    pub bounds: Bounds,
    /// Every file but this index, in archive order.
    pub files: Vec<IndexedFile>,
    /// What could not be collected.
    pub missing: Vec<Missing>,
}

/// A bundle in memory, before it is written.
#[derive(Debug)]
pub struct Bundle {
    /// The index.
    pub index: Index,
    contents: Vec<Vec<u8>>,
}

impl Bundle {
    fn new(namespace: &str, bounds: Bounds, created: jiff::Timestamp) -> Bundle {
        Bundle {
            index: Index {
                schema: "gpu-bundle/v1",
                created: created.to_string(),
                doctor_version: env!("CARGO_PKG_VERSION"),
                namespace: namespace.to_owned(),
                bounds,
                files: Vec::new(),
                missing: Vec::new(),
            },
            contents: Vec::new(),
        }
    }

    fn add(
        &mut self,
        path: impl Into<String>,
        what: impl Into<String>,
        content: Vec<u8>,
        cut: Option<String>,
    ) {
        self.index.files.push(IndexedFile {
            path: path.into(),
            what: what.into(),
            bytes: content.len(),
            cut,
        });
        self.contents.push(content);
    }

    fn miss(&mut self, what: impl Into<String>, why: impl Into<String>) {
        self.index.missing.push(Missing {
            what: what.into(),
            why: why.into(),
        });
    }
}

/// One container log to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogTarget {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// The run before the last restart.
    pub previous: bool,
}

impl LogTarget {
    /// Its path in the archive.
    pub fn path(&self) -> String {
        let suffix = if self.previous { ".previous" } else { "" };
        format!(
            "logs/{}/{}/{}{suffix}.log",
            self.namespace, self.pod, self.container
        )
    }

    fn describe(&self) -> String {
        let run = if self.previous {
            "previous run of container"
        } else {
            "container"
        };
        format!(
            "log of {run} {} of pod {}/{}",
            self.container, self.namespace, self.pod
        )
    }
}

/// The logs to collect: every container (init containers first) of the operator namespace's pods and of the
/// operand pods, and the previous run of each container that restarted or has a last termination. A
/// container waiting to restart has only its previous log asked for: the current one is the same run.
pub fn log_targets(namespace_pods: &[PodFacts], snapshot: &Snapshot) -> Vec<LogTarget> {
    let operand_pods = snapshot.pods.iter().filter(|pod| {
        pod.metadata.owner_references.iter().any(|owner| {
            owner.kind == "DaemonSet"
                && snapshot.daemon_sets.iter().any(|ds| {
                    ds.metadata.uid.as_deref() == Some(owner.uid.as_str())
                        && Operand::of_daemonset(ds).is_some()
                })
        })
    });
    let mut seen = BTreeSet::new();
    let mut targets = Vec::new();
    for pod in namespace_pods.iter().chain(operand_pods) {
        if !seen.insert(pod.key()) {
            continue;
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let statuses: Vec<&ContainerStatusFacts> = pod
            .status
            .init_container_statuses
            .iter()
            .chain(&pod.status.container_statuses)
            .collect();
        for container in pod.spec.init_containers.iter().chain(&pod.spec.containers) {
            let target = |previous| LogTarget {
                namespace: namespace.clone(),
                pod: pod.metadata.name.clone(),
                container: container.name.clone(),
                previous,
            };
            let status = statuses.iter().find(|s| s.name == container.name);
            let terminated_before = status.is_some_and(|s| {
                s.restart_count > 0 || s.last_state.as_ref().is_some_and(|l| l.terminated.is_some())
            });
            // Between restarts (CrashLoopBackOff) the kubelet serves the last run as the current log: the
            // previous log alone holds it, once.
            let waiting = status
                .and_then(|s| s.state.as_ref())
                .is_some_and(|state| state.waiting.is_some());
            if !(terminated_before && waiting) {
                targets.push(target(false));
            }
            if terminated_before {
                targets.push(target(true));
            }
        }
    }
    targets
}

/// Replaces the values of environment variables (and any `name`/`value` pair) whose name says secret, and
/// drops managed fields and the last-applied annotation (a second copy of the spec).
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let secret_name = map.get("name").and_then(Value::as_str).is_some_and(|name| {
                let name = name.to_ascii_lowercase();
                [
                    "password",
                    "passwd",
                    "secret",
                    "token",
                    "credential",
                    "apikey",
                    "api_key",
                    "private",
                ]
                .iter()
                .any(|word| name.contains(word))
            });
            if secret_name && map.get("value").is_some_and(Value::is_string) {
                map.insert("value".to_owned(), json!("(redacted by kubectl gpu bundle)"));
            }
            if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
                if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
                }
            }
            map.values_mut().for_each(redact);
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// The default archive name for a bundle made at `now`.
pub fn default_name(now: jiff::Timestamp) -> String {
    format!("gpu-bundle-{}.tar.gz", now.strftime("%Y%m%dT%H%M%SZ"))
}

/// The archive's top directory for a bundle made at `created`.
fn top_directory(index: &Index) -> String {
    let created: jiff::Timestamp = index.created.parse().unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("gpu-bundle-{}", created.strftime("%Y%m%dT%H%M%SZ"))
}

/// Writes the bundle as a tar.gz: one top directory, `index.json` first, then the files in index order.
pub fn write_archive(bundle: &Bundle, out: impl Write) -> std::io::Result<()> {
    let top = top_directory(&bundle.index);
    let mtime = bundle
        .index
        .created
        .parse::<jiff::Timestamp>()
        .map_or(0, |t| t.as_second().max(0).unsigned_abs());
    let gzip = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gzip);
    let mut append = |path: &str, content: &[u8]| -> std::io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, format!("{top}/{path}"), content)
    };
    let mut index = serde_json::to_vec_pretty(&bundle.index).map_err(std::io::Error::from)?;
    index.push(b'\n');
    append("index.json", &index)?;
    for (file, content) in bundle.index.files.iter().zip(&bundle.contents) {
        append(&file.path, content)?;
    }
    tar.into_inner()?.finish()?.flush()
}

/// The README at the top of the archive.
fn readme(index: &Index) -> String {
    format!(
        "GPU operator support bundle, made by kubectl gpu bundle {} at {}.\n\n\
         index.json lists every file (what it is, its size, where a log was cut) and everything that could\n\
         not be collected, and why. snapshot.json is what `kubectl gpu snapshot` writes: run\n\
         `kubectl gpu doctor --snapshot THIS.tar.gz` (or explain, upgrade-plan) to read this cluster as it was.\n\
         Logs: the last {} lines of each container, at most {} bytes each, {} bytes in all. No Secret is included.\n",
        index.doctor_version,
        index.created,
        index.bounds.tail_lines,
        index.bounds.limit_bytes,
        index.bounds.total_log_bytes
    )
}

/// The server's answer in a sentence: `403 Forbidden: pods "x" is forbidden: ...`.
fn why(error: &LiveError) -> String {
    match error {
        LiveError::Request {
            source: kube::Error::Api(status),
            ..
        } => why_api(status),
        other => {
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    }
}

fn why_api(status: &kube::core::Status) -> String {
    format!("{} {}: {}", status.code, status.reason, status.message)
}

fn not_found(error: &LiveError) -> bool {
    matches!(error, LiveError::Request { source: kube::Error::Api(status), .. } if status.code == 404)
}

fn pretty(value: &impl Serialize) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

fn list_of(mut items: Vec<Value>, api_version: &str, kind: &str) -> Value {
    for item in &mut items {
        if let Some(map) = item.as_object_mut() {
            map.insert("apiVersion".to_owned(), api_version.into());
            map.insert("kind".to_owned(), kind.into());
        }
        redact(item);
    }
    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items})
}

/// Reads everything a bundle holds from the live cluster. Fails only when nothing at all could be read.
pub async fn collect(
    live: &Live,
    namespace: &str,
    detection: &GpuDetection,
    bounds: Bounds,
) -> anyhow::Result<Bundle> {
    let mut bundle = Bundle::new(namespace, bounds, jiff::Timestamp::now());
    let mut read_any = false;

    // Why what only the upgrade plan reads is missing, when it is.
    let mut plan_refused = None;
    let read = match live.snapshot(Reads::UpgradePlan).await {
        Ok(snapshot) => Ok(snapshot),
        // What only the upgrade plan reads (NVIDIADrivers, ControllerRevisions, PodDisruptionBudgets) may be
        // refused where the doctor's own reads are not: a snapshot without them still answers `doctor`.
        Err(error) => match live.snapshot(Reads::GpuPods).await {
            Ok(snapshot) => {
                bundle.miss(
                    "NVIDIADrivers, ControllerRevisions and PodDisruptionBudgets in snapshot.json (what upgrade-plan reads)",
                    why(&error),
                );
                plan_refused = Some(why(&error));
                Ok(snapshot)
            }
            Err(_) => Err(error),
        },
    };
    let snapshot = match read {
        Ok(snapshot) => {
            read_any = true;
            let mut json = Vec::new();
            snapshot.write_json(&mut json)?;
            bundle.add(
                "snapshot.json",
                "what `kubectl gpu snapshot` writes: read it with `kubectl gpu doctor --snapshot`",
                json,
                None,
            );
            let report = analyze_with(&snapshot, detection);
            bundle.add(
                "doctor.txt",
                "`kubectl gpu doctor`",
                table::doctor(&report, false).into_bytes(),
                None,
            );
            bundle.add(
                "doctor.json",
                "`kubectl gpu doctor -o json`",
                pretty(&report),
                None,
            );
            match plan_refused.map_or_else(
                || upgrade_plan::upgrade_plan_with(&snapshot, detection).map_err(|e| e.to_string()),
                Err,
            ) {
                Ok(plan) => {
                    bundle.add(
                        "upgrade-plan.txt",
                        "`kubectl gpu upgrade-plan`",
                        upgrade_plan::table(&plan).into_bytes(),
                        None,
                    );
                    bundle.add(
                        "upgrade-plan.json",
                        "`kubectl gpu upgrade-plan -o json`",
                        pretty(&upgrade_plan::json(&plan)),
                        None,
                    );
                }
                Err(why) => bundle.miss("the upgrade plan", why),
            }
            Some(snapshot)
        }
        Err(error) => {
            bundle.miss(
                "the snapshot, the doctor's report and the upgrade plan",
                why(&error),
            );
            None
        }
    };
    let nodes_known = snapshot.is_some();
    let snapshot = snapshot.unwrap_or_default();

    for resource in [
        ApiResource::erase::<ClusterPolicy>(&()),
        ApiResource::erase::<NVIDIADriver>(&()),
    ] {
        let (path, api_version, kind, what) = (
            DynamicObject::url_path(&resource, None),
            &resource.api_version,
            &resource.kind,
            &resource.plural,
        );
        match live.list_values(&path, ListParams::default(), what).await {
            Ok(items) => {
                read_any = true;
                bundle.add(
                    format!("objects/{what}.json"),
                    format!("every {kind}, with its status"),
                    pretty(&list_of(items, api_version, kind)),
                    None,
                );
            }
            Err(error) if not_found(&error) => bundle.miss(
                format!("{kind} objects"),
                format!("the cluster does not serve {path} (no CRD): {}", why(&error)),
            ),
            Err(error) => bundle.miss(format!("{kind} objects"), why(&error)),
        }
    }

    let gpu_nodes = nodes_known.then(|| {
        analyze_with(&snapshot, detection)
            .nodes
            .into_iter()
            .filter(|node| node.gpu)
            .map(|node| node.name)
            .collect()
    });
    read_any |= collect_events(live, namespace, gpu_nodes.as_ref(), &mut bundle).await;

    let namespace_pods = match live.pods_in(namespace).await {
        Ok(pods) => {
            read_any = true;
            pods
        }
        Err(error) => {
            bundle.miss(
                format!("the pods of namespace {namespace} (and their logs)"),
                why(&error),
            );
            Vec::new()
        }
    };
    read_any |= collect_logs(
        live,
        &log_targets(&namespace_pods, &snapshot),
        bounds,
        &mut bundle,
    )
    .await;

    if !read_any {
        let reasons: Vec<String> = bundle
            .index
            .missing
            .iter()
            .map(|m| format!("{}: {}", m.what, m.why))
            .collect();
        anyhow::bail!("nothing could be read from the cluster: {}", reasons.join("; "));
    }
    let text = readme(&bundle.index);
    bundle.index.files.insert(
        0,
        IndexedFile {
            path: "README.txt".to_owned(),
            what: "what this bundle is and how to read it".to_owned(),
            bytes: text.len(),
            cut: None,
        },
    );
    bundle.contents.insert(0, text.into_bytes());
    Ok(bundle)
}

/// Events of the operator namespace and of the GPU nodes, from `events.k8s.io/v1` where the cluster serves
/// it, else from core `v1`. Returns whether any list succeeded.
/// `gpu_nodes` is `None` when the nodes could not be read: their Events are then not asked for.
async fn collect_events(
    live: &Live,
    namespace: &str,
    gpu_nodes: Option<&BTreeSet<String>>,
    bundle: &mut Bundle,
) -> bool {
    let mut api = ("/apis/events.k8s.io/v1", "events.k8s.io/v1", "regarding");
    let mut read_any = false;
    let in_namespace = match live
        .list_values(
            &format!("{}/namespaces/{namespace}/events", api.0),
            ListParams::default(),
            "events",
        )
        .await
    {
        Err(error) if not_found(&error) => {
            api = ("/api/v1", "v1", "involvedObject");
            live.list_values(
                &format!("/api/v1/namespaces/{namespace}/events"),
                ListParams::default(),
                "events",
            )
            .await
        }
        other => other,
    };
    let (path, api_version, subject) = api;
    match in_namespace {
        Ok(items) => {
            read_any = true;
            bundle.add(
                format!("events/{namespace}.json"),
                format!("Events of namespace {namespace} ({api_version})"),
                pretty(&list_of(items, api_version, "Event")),
                None,
            );
        }
        Err(error) => bundle.miss(format!("Events of namespace {namespace}"), why(&error)),
    }
    let Some(gpu_nodes) = gpu_nodes else {
        bundle.miss(
            "Events of the GPU nodes",
            "the nodes could not be read, so which nodes have GPUs is unknown",
        );
        return read_any;
    };
    let params = ListParams::default().fields(&format!("{subject}.kind=Node"));
    match live
        .list_values(&format!("{path}/events"), params, "events")
        .await
    {
        Ok(items) => {
            read_any = true;
            let items: Vec<Value> = items
                .into_iter()
                .filter(|event| {
                    event
                        .pointer(&format!("/{subject}/name"))
                        .and_then(Value::as_str)
                        .is_some_and(|name| gpu_nodes.contains(name))
                })
                .collect();
            bundle.add(
                "events/gpu-nodes.json",
                format!("Events of the {} GPU nodes ({api_version})", gpu_nodes.len()),
                pretty(&list_of(items, api_version, "Event")),
                None,
            );
        }
        Err(error) => bundle.miss("Events of the GPU nodes", why(&error)),
    }
    read_any
}

/// The logs, each bounded, until the total is spent. Returns whether any log was read.
async fn collect_logs(live: &Live, targets: &[LogTarget], bounds: Bounds, bundle: &mut Bundle) -> bool {
    let mut left = bounds.total_log_bytes;
    let mut read_any = false;
    for target in targets {
        if left <= 0 {
            bundle.miss(
                target.describe(),
                format!("the bundle's {} bytes of logs are spent", bounds.total_log_bytes),
            );
            continue;
        }
        let limit = bounds.limit_bytes.min(left);
        let params = LogParams {
            container: Some(target.container.clone()),
            previous: target.previous,
            tail_lines: Some(bounds.tail_lines),
            limit_bytes: Some(limit),
            ..LogParams::default()
        };
        match live.log(&target.namespace, &target.pod, &params).await {
            Ok(log) => {
                read_any = true;
                left -= i64::try_from(log.len()).unwrap_or(i64::MAX);
                let cut = log_cut(&log, limit, bounds);
                bundle.add(target.path(), target.describe(), log, cut);
            }
            Err(error) => bundle.miss(target.describe(), why(&error)),
        }
    }
    read_any
}

/// Which bound, if any, cut a log the server answered with `limitBytes` = `limit`: a log that fills the limit
/// was cut there (by the total when that made the limit smaller), one of `tailLines` lines was cut to them.
pub fn log_cut(log: &[u8], limit: i64, bounds: Bounds) -> Option<String> {
    let length = i64::try_from(log.len()).unwrap_or(i64::MAX);
    let lines = i64::try_from(log.iter().filter(|b| **b == b'\n').count()).unwrap_or(i64::MAX);
    if length >= limit && limit < bounds.limit_bytes {
        Some(format!(
            "at {limit} bytes: the bundle's {} bytes of logs were spent",
            bounds.total_log_bytes
        ))
    } else if length >= limit {
        Some(format!("at {limit} bytes (limitBytes)"))
    } else if lines >= bounds.tail_lines {
        Some(format!("to the last {} lines (tailLines)", bounds.tail_lines))
    } else {
        None
    }
}

/// Runs `kubectl gpu bundle`: 0 once the archive is written, whatever is missing from it (listed in the
/// index and summarised on standard error); an error (exit 2) when nothing could be read.
pub fn run(args: &BundleArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let connection = args.connection.connection();
    let bundle = runtime.block_on(async {
        let live = Live::connect(&connection).await?;
        let detection = GpuDetection::from_selector(args.gpu_node_selector.clone());
        collect(&live, &args.namespace, &detection, Bounds::default()).await
    })?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(default_name(jiff::Timestamp::now())));
    if output.as_os_str() == "-" {
        write_archive(&bundle, std::io::stdout().lock()).context("cannot write to standard output")?;
    } else {
        let file =
            std::fs::File::create(&output).with_context(|| format!("cannot create {}", output.display()))?;
        write_archive(&bundle, std::io::BufWriter::new(file))
            .with_context(|| format!("cannot write {}", output.display()))?;
    }
    let index = &bundle.index;
    let cut = index.files.iter().filter(|f| f.cut.is_some()).count();
    eprintln!(
        "kubectl gpu: wrote {} ({} files, {} logs cut to their bounds)",
        if output.as_os_str() == "-" {
            "the bundle to standard output".to_owned()
        } else {
            output.display().to_string()
        },
        index.files.len() + 1,
        cut
    );
    if !index.missing.is_empty() {
        eprintln!(
            "kubectl gpu: {} parts could not be collected (listed in index.json):",
            index.missing.len()
        );
        for missing in &index.missing {
            eprintln!("  {}: {}", missing.what, missing.why);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;

    #[test]
    fn logs_of_every_container_and_the_previous_run_of_those_that_restarted() {
        use fixture::{ClusterBuilder, NodeFixture};
        use gpuop_api::Operand;
        let mut snapshot = ClusterBuilder::new()
            .with_node(k8s_openapi::api::core::v1::Node::gpu("a100-01"))
            .build();
        let toolkit = snapshot.pod_of_mut(Operand::ContainerToolkit, "a100-01").unwrap();
        toolkit.crash_loop(3);
        let toolkit = toolkit.metadata.name.clone();
        let workload = PodFacts::workload("ml", "train").running_on("a100-01");
        snapshot.pods.push(workload);
        let targets = log_targets(&[], &snapshot);
        let previous: Vec<&LogTarget> = targets.iter().filter(|t| t.previous).collect();
        assert!(
            targets.len() >= snapshot.pods.len() - 1,
            "every container of every operand pod"
        );
        assert!(
            targets.iter().all(|t| t.pod != "train"),
            "workloads' logs are theirs"
        );
        assert_eq!(previous.len(), 1, "{previous:?}");
        assert_eq!(previous[0].pod, toolkit);
        assert!(previous[0].path().ends_with(".previous.log"));
    }

    #[test]
    fn the_index_says_which_bound_cut_a_log() {
        let bounds = Bounds {
            tail_lines: 3,
            limit_bytes: 10,
            total_log_bytes: 100,
        };
        assert_eq!(log_cut(b"a\nb\n", 10, bounds), None);
        assert_eq!(
            log_cut(b"a\nb\nc\n", 10, bounds).as_deref(),
            Some("to the last 3 lines (tailLines)")
        );
        assert_eq!(
            log_cut(b"0123456789", 10, bounds).as_deref(),
            Some("at 10 bytes (limitBytes)")
        );
        assert_eq!(
            log_cut(b"0123", 4, bounds).as_deref(),
            Some("at 4 bytes: the bundle's 100 bytes of logs were spent")
        );
    }

    #[test]
    fn secret_looking_values_are_redacted() {
        let mut policy = json!({"metadata": {"name": "p", "managedFields": [{}]},
            "spec": {"driver": {"env": [{"name": "HTTPS_PROXY", "value": "http://proxy"},
                                        {"name": "NGC_API_TOKEN", "value": "abc"}]}}});
        redact(&mut policy);
        assert_eq!(policy["spec"]["driver"]["env"][0]["value"], "http://proxy");
        assert_eq!(
            policy["spec"]["driver"]["env"][1]["value"],
            "(redacted by kubectl gpu bundle)"
        );
        assert!(policy["metadata"].get("managedFields").is_none());
    }
}
