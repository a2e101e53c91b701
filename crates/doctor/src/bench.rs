//! The benchmark behind `kubectl gpu bench` (hidden): a generated snapshot of a large converged cluster with
//! some faults planted is written to a file; a fresh process (this binary again, `bench --load FILE`) reads it
//! back and analyses it several times, so that its memory figures are those of the doctor alone. Wall time of
//! each step and resident memory (Linux `/proc/self/status`). Results go to `BENCHMARKS.md` by hand.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuop_api::Operand;
use k8s_openapi::api::core::v1::Node;

use crate::analysis::analyze;
use crate::fixture::{ClusterBuilder, NodeFixture};
use crate::load::{LoadError, load_paths};
use crate::table;

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The snapshot file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It could not be read back.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The measuring process failed.
    #[error("the measuring process failed: {0}")]
    Child(String),
}

/// What generating and writing the snapshot cost.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Nodes in the snapshot.
    pub nodes: usize,
    /// Pods in it.
    pub pods: usize,
    /// Size of the snapshot file.
    pub file_bytes: u64,
    /// Generating the cluster in memory.
    pub generate: Duration,
    /// Writing the snapshot file.
    pub write: Duration,
}

/// What reading and analysing the snapshot cost, in a process that did nothing else.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// Reading the file.
    pub load: Duration,
    /// Each analysis run.
    pub analyses: Vec<Duration>,
    /// Rendering the JSON report.
    pub render_json: Duration,
    /// Rendering the table.
    pub render_table: Duration,
    /// Findings of the analysis (faults are planted on 1% of the nodes).
    pub findings: usize,
    /// Resident memory before reading, in bytes.
    pub rss_start: Option<u64>,
    /// Resident memory with the snapshot read.
    pub rss_loaded: Option<u64>,
    /// Peak resident memory while reading.
    pub peak_load: Option<u64>,
    /// Peak resident memory over the whole process (reading, analysing, rendering).
    pub peak_total: Option<u64>,
}

/// Both halves.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Generating and writing.
    pub generated: Generated,
    /// Reading and analysing.
    pub measured: Measured,
    /// The snapshot file, when kept.
    pub kept: Option<std::path::PathBuf>,
}

/// Generates a cluster of `nodes` GPU nodes (A100s with MIG, H100s, L4s), plants faults on 1% of them, writes
/// it under `dir` (removed afterwards unless `keep`), and has a fresh process read it back and analyse it
/// `runs` times.
pub fn run(nodes: usize, runs: usize, dir: &Path, keep: bool) -> Result<BenchResult, BenchError> {
    let path = dir.join(format!("kubectl-gpu-bench-{nodes}.json"));
    let generated = generate(nodes, &path)?;
    let exe = std::env::current_exe().map_err(|e| BenchError::Child(e.to_string()))?;
    let output = Command::new(exe)
        .args(["bench", "--load"])
        .arg(&path)
        .args(["--runs", &runs.to_string()])
        .output()
        .map_err(|e| BenchError::Child(e.to_string()));
    if !keep {
        let _ = std::fs::remove_file(&path);
    }
    let output = output?;
    if !output.status.success() {
        return Err(BenchError::Child(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    let measured = Measured::parse(&String::from_utf8_lossy(&output.stdout))
        .ok_or_else(|| BenchError::Child("unreadable measurements".to_owned()))?;
    Ok(BenchResult {
        generated,
        measured,
        kept: keep.then_some(path),
    })
}

fn generate(nodes: usize, path: &Path) -> Result<Generated, BenchError> {
    let started = Instant::now();
    let mut snapshot = ClusterBuilder::new()
        .with_nodes((0..nodes).map(|i| match i % 3 {
            0 => Node::gpu(&format!("a100-{i:05}")).mig_capable(),
            1 => Node::gpu(&format!("h100-{i:05}")).with_gpus("NVIDIA-H100-80GB-HBM3", 8),
            _ => Node::gpu(&format!("l4-{i:05}")).with_gpus("NVIDIA-L4", 4),
        }))
        .build();
    for i in (0..nodes).step_by(100) {
        let name = snapshot.nodes[i].metadata.name.clone().unwrap_or_default();
        if let Some(pod) = snapshot.pod_of_mut(Operand::ContainerToolkit, &name) {
            pod.crash_loop(4);
        }
    }
    let generate = started.elapsed();
    let write_error = |source| BenchError::Write {
        path: path.display().to_string(),
        source,
    };
    let started = Instant::now();
    let file = std::fs::File::create(path).map_err(write_error)?;
    let mut writer = std::io::BufWriter::new(file);
    snapshot
        .write_json(&mut writer)
        .and_then(|()| writer.flush())
        .map_err(write_error)?;
    let write = started.elapsed();
    Ok(Generated {
        nodes: snapshot.nodes.len(),
        pods: snapshot.pods.len(),
        file_bytes: std::fs::metadata(path).map_err(write_error)?.len(),
        generate,
        write,
    })
}

/// The measuring half: reads the snapshot, analyses it `runs` times, renders it; prints [`Measured`] as
/// `key value` lines for the parent.
pub fn measure(path: &Path, runs: usize) -> Result<Measured, BenchError> {
    let rss_start = memory("VmRSS");
    let started = Instant::now();
    let snapshot = load_paths(&[path.to_owned()])?;
    let load = started.elapsed();
    let peak_load = memory("VmHWM");
    let rss_loaded = memory("VmRSS");
    let mut analyses = Vec::new();
    let mut report = analyze(&snapshot);
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        report = analyze(&snapshot);
        analyses.push(started.elapsed());
    }
    let started = Instant::now();
    let json = serde_json::to_string(&report).unwrap_or_default();
    let render_json = started.elapsed();
    let started = Instant::now();
    let text = table::doctor(&report, false);
    let render_table = started.elapsed();
    drop((json, text));
    Ok(Measured {
        load,
        analyses,
        render_json,
        render_table,
        findings: report.summary.findings,
        rss_start,
        rss_loaded,
        peak_load,
        peak_total: memory("VmHWM"),
    })
}

/// A `/proc/self/status` memory line, in bytes; Linux only.
fn memory(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl Measured {
    /// `key value` lines, durations in nanoseconds, memory in bytes (`-` when unknown).
    pub fn lines(&self) -> String {
        let bytes = |b: Option<u64>| b.map_or_else(|| "-".to_owned(), |b| b.to_string());
        let analyses: Vec<String> = self.analyses.iter().map(|d| d.as_nanos().to_string()).collect();
        format!(
            "load {}\nanalyses {}\nrender_json {}\nrender_table {}\nfindings {}\nrss_start {}\nrss_loaded {}\npeak_load {}\npeak_total {}\n",
            self.load.as_nanos(),
            analyses.join(","),
            self.render_json.as_nanos(),
            self.render_table.as_nanos(),
            self.findings,
            bytes(self.rss_start),
            bytes(self.rss_loaded),
            bytes(self.peak_load),
            bytes(self.peak_total),
        )
    }

    fn parse(text: &str) -> Option<Measured> {
        let mut measured = Measured::default();
        let nanos = |v: &str| v.parse::<u64>().ok().map(Duration::from_nanos);
        for line in text.lines() {
            let (key, value) = line.split_once(' ')?;
            match key {
                "load" => measured.load = nanos(value)?,
                "analyses" => measured.analyses = value.split(',').map(nanos).collect::<Option<_>>()?,
                "render_json" => measured.render_json = nanos(value)?,
                "render_table" => measured.render_table = nanos(value)?,
                "findings" => measured.findings = value.parse().ok()?,
                "rss_start" => measured.rss_start = value.parse().ok(),
                "rss_loaded" => measured.rss_loaded = value.parse().ok(),
                "peak_load" => measured.peak_load = value.parse().ok(),
                "peak_total" => measured.peak_total = value.parse().ok(),
                _ => {}
            }
        }
        (!measured.analyses.is_empty()).then_some(measured)
    }
}

impl fmt::Display for BenchResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |bytes: Option<u64>| {
            bytes.map_or_else(
                || "n/a".to_owned(),
                |b| format!("{:.0} MiB", b as f64 / f64::from(1 << 20)),
            )
        };
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        let (generated, measured) = (&self.generated, &self.measured);
        let mut sorted = measured.analyses.clone();
        sorted.sort();
        writeln!(f, "nodes:                   {}", generated.nodes)?;
        writeln!(f, "operand pods:            {}", generated.pods)?;
        writeln!(
            f,
            "findings:                {} (faults planted on 1% of nodes)",
            measured.findings
        )?;
        writeln!(
            f,
            "snapshot file:           {:.1} MiB",
            generated.file_bytes as f64 / f64::from(1 << 20)
        )?;
        writeln!(f, "generate:                {}", ms(generated.generate))?;
        writeln!(f, "write file:              {}", ms(generated.write))?;
        writeln!(f, "load file:               {}", ms(measured.load))?;
        writeln!(
            f,
            "analyze:                 median {} of {} runs (min {}, max {})",
            ms(sorted[sorted.len() / 2]),
            sorted.len(),
            ms(sorted[0]),
            ms(sorted[sorted.len() - 1])
        )?;
        writeln!(f, "render json:             {}", ms(measured.render_json))?;
        writeln!(f, "render table:            {}", ms(measured.render_table))?;
        writeln!(f, "RSS at start:            {}", mib(measured.rss_start))?;
        writeln!(f, "RSS with snapshot read:  {}", mib(measured.rss_loaded))?;
        writeln!(f, "peak RSS while reading:  {}", mib(measured.peak_load))?;
        writeln!(f, "peak RSS, whole process: {}", mib(measured.peak_total))?;
        if let Some(path) = &self.kept {
            writeln!(f, "snapshot kept at:        {}", path.display())?;
        }
        Ok(())
    }
}
