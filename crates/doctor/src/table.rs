//! What a person reads: the doctor's per-node table (operands in chain order with their state, the first
//! broken link), the findings under it, one node in detail, and the explanation of a pod.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuop_api::{OPERANDS, Operand};

use crate::explain::Explanation;
use crate::pod_state::StateName;
use crate::report::{Expectation, Finding, NodeReport, OperandOnNode, Report};

/// How many node names a grouped note lists before it says "and N more".
const NAMES_SHOWN: usize = 5;

/// The doctor's table, findings and notes; `wide` (`-o wide`) adds each node's workload, the GPU resources
/// it advertises (allocatable/capacity) and how many findings it has.
pub fn doctor(report: &Report, wide: bool) -> String {
    let mut out = String::new();
    let operands: Vec<Operand> = OPERANDS
        .iter()
        .map(|info| info.operand)
        .filter(|operand| {
            report
                .nodes
                .iter()
                .any(|n| n.operands.iter().any(|o| o.operand == *operand))
        })
        .collect();
    let headers = abbreviations(&operands);
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(report.nodes.len() + 1);
    let mut header = vec!["NODE".to_owned(), "GPUS".to_owned()];
    header.extend(headers.iter().map(|h| h.to_uppercase()));
    header.push("FIRST BROKEN LINK".to_owned());
    if wide {
        header.extend(["WORKLOAD", "RESOURCES", "FINDINGS"].map(str::to_owned));
    }
    rows.push(header);
    for node in &report.nodes {
        let mut row = vec![node.name.clone(), gpus(node)];
        for operand in &operands {
            row.push(cell(node.operands.iter().filter(|o| o.operand == *operand)));
        }
        row.push(
            match (node.first_broken_link, node.gpu || !node.findings.is_empty()) {
                (Some(link), _) => link.title().to_owned(),
                (None, true) => "none".to_owned(),
                (None, false) => "-".to_owned(),
            },
        );
        if wide {
            row.push(node.workload.clone().unwrap_or_else(|| "-".to_owned()));
            row.push(if node.advertised.is_empty() {
                "-".to_owned()
            } else {
                node.advertised
                    .iter()
                    .map(|a| format!("{}={}/{}", a.resource, a.allocatable, a.capacity))
                    .collect::<Vec<_>>()
                    .join(",")
            });
            row.push(node.findings.len().to_string());
        }
        rows.push(row);
    }
    out.push_str(&columns(&rows));
    let legend: Vec<String> = operands
        .iter()
        .zip(&headers)
        .filter(|(operand, header)| operand.id() != header.as_str())
        .map(|(operand, header)| format!("{}={operand}", header.to_uppercase()))
        .collect();
    if !legend.is_empty() {
        let _ = writeln!(out, "\nColumns in chain order: {}", legend.join(" "));
    }

    let with_findings: Vec<&NodeReport> = report.nodes.iter().filter(|n| !n.findings.is_empty()).collect();
    if !with_findings.is_empty() || !report.findings.is_empty() {
        out.push_str("\nFindings:\n");
        for node in with_findings {
            let _ = writeln!(out, "  {}:", node.name);
            for finding in &node.findings {
                let _ = writeln!(out, "    [{}] {}", finding.kind.name(), operand_message(finding));
            }
        }
        if !report.findings.is_empty() {
            out.push_str("  cluster:\n");
            for finding in &report.findings {
                let _ = writeln!(out, "    [{}] {}", finding.kind.name(), finding.message);
            }
        }
    }
    let notes = grouped_notes(report);
    if !notes.is_empty() {
        out.push_str("\nNotes:\n");
        for note in notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    let summary = &report.summary;
    let _ = writeln!(
        out,
        "\n{} ({} with GPUs): {}",
        counted(summary.nodes, "node"),
        summary.gpu_nodes,
        if summary.findings == 0 {
            "no findings".to_owned()
        } else {
            format!(
                "{} on {}{}",
                counted(summary.findings, "finding"),
                counted(summary.nodes_with_findings, "node"),
                if report.findings.is_empty() {
                    ""
                } else {
                    " and the cluster"
                }
            )
        }
    );
    out
}

/// A finding's message, led by the operand it concerns (`driver: ...`) when it names one.
fn operand_message(finding: &Finding) -> String {
    match finding.operand {
        Some(operand) => format!("{operand}: {}", finding.message),
        None => finding.message.clone(),
    }
}

/// `1 node`, `3 nodes`.
fn counted(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// One node in detail: every operand, every check, findings and notes.
pub fn node(report: &NodeReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Node {}: {}{}",
        report.name,
        if report.gpu { "GPU" } else { "no GPU" },
        report
            .workload
            .as_deref()
            .map(|w| format!(", workload {w}"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "  evidence: {}", report.gpu_evidence);
    for resource in &report.advertised {
        let _ = writeln!(
            out,
            "  {}: capacity {}, allocatable {}",
            resource.resource, resource.capacity, resource.allocatable
        );
    }
    let _ = writeln!(
        out,
        "  first broken link: {}\n",
        report.first_broken_link.map_or("none", |l| l.title())
    );
    if !report.operands.is_empty() {
        let mut rows = vec![vec![
            "OPERAND".to_owned(),
            "EXPECTED".to_owned(),
            "STATUS".to_owned(),
            "POD".to_owned(),
            "DETAIL".to_owned(),
        ]];
        for operand in &report.operands {
            rows.push(vec![
                operand.operand.id().to_owned(),
                expectation(operand.placement).to_owned(),
                operand.status.clone().unwrap_or_else(|| "absent".to_owned()),
                operand.pod.clone().unwrap_or_else(|| "-".to_owned()),
                operand.detail.clone().unwrap_or_default(),
            ]);
        }
        out.push_str(&columns(&rows));
        out.push('\n');
    }
    let mut rows = vec![vec!["CHECK".to_owned(), "STATUS".to_owned(), "WHY".to_owned()]];
    for check in &report.checks {
        rows.push(vec![
            check.check.name().to_owned(),
            serde_json::to_value(check.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            check.message.clone(),
        ]);
    }
    out.push_str(&columns(&rows));
    if !report.findings.is_empty() {
        out.push_str("\nFindings:\n");
        for finding in &report.findings {
            let _ = writeln!(
                out,
                "  [{}] ({}, {}) {}",
                finding.kind.name(),
                finding.check.name(),
                finding.link.title(),
                operand_message(finding)
            );
        }
    }
    if !report.notes.is_empty() {
        out.push_str("\nNotes:\n");
        for note in &report.notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    out
}

/// The explanation of a pod.
pub fn explanation(explanation: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", explanation.verdict.sentence);
    let _ = writeln!(
        out,
        "\nPod {}: {}{}",
        explanation.pod,
        explanation.status,
        explanation
            .node
            .as_deref()
            .map(|n| format!(" on {n}"))
            .unwrap_or_default()
    );
    if explanation.requests.is_empty() {
        out.push_str("  asks for no GPU resource\n");
    } else {
        for (resource, count) in &explanation.requests {
            let _ = writeln!(out, "  asks for {count} {resource}");
        }
    }
    if let Some(link) = explanation.verdict.link {
        let _ = writeln!(out, "  first broken link: {}", link.title());
    }
    if let Some(message) = &explanation.scheduler {
        let _ = writeln!(out, "  scheduler: {message}");
    }
    let gpu_nodes: Vec<_> = explanation.nodes.iter().filter(|n| n.gpu || n.fits).collect();
    if !gpu_nodes.is_empty() {
        let mut rows = vec![vec![
            "NODE".to_owned(),
            "FITS".to_owned(),
            "FREE GPUS".to_owned(),
            "WHY NOT".to_owned(),
            "CHAIN".to_owned(),
        ]];
        for fit in &gpu_nodes {
            rows.push(vec![
                fit.name.clone(),
                if fit.fits { "yes" } else { "no" }.to_owned(),
                if fit.free.is_empty() {
                    "-".to_owned()
                } else {
                    fit.free
                        .iter()
                        .map(|(r, c)| format!("{r}={c}"))
                        .collect::<Vec<_>>()
                        .join(",")
                },
                fit.reasons.join("; "),
                fit.first_broken_link
                    .map_or_else(|| "ok".to_owned(), |l| format!("broken at {}", l.title())),
            ]);
        }
        out.push('\n');
        out.push_str(&columns(&rows));
    }
    let mut others: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for fit in explanation.nodes.iter().filter(|n| !n.gpu && !n.fits) {
        let reason = fit.reasons.first().map_or("", String::as_str);
        others.entry(reason).or_default().push(&fit.name);
    }
    if !others.is_empty() {
        out.push_str("\nNodes without GPUs:\n");
        for (reason, names) in others {
            let _ = writeln!(out, "  {reason}: {}", names_text(&names));
        }
    }
    out.push('\n');
    for limit in &explanation.limits {
        let _ = writeln!(out, "Not evaluated: {limit}");
    }
    out
}

/// Short column headers: one-word ids as they are, others by their initials (`container-toolkit` -> `ct`),
/// falling back to the id where initials would collide.
fn abbreviations(operands: &[Operand]) -> Vec<String> {
    let initials = |operand: &Operand| -> String {
        let id = operand.id();
        if id.contains('-') {
            id.split('-').filter_map(|part| part.chars().next()).collect()
        } else {
            id.to_owned()
        }
    };
    let all: Vec<String> = operands.iter().map(initials).collect();
    operands
        .iter()
        .zip(&all)
        .map(|(operand, short)| {
            if all.iter().filter(|other| *other == short).count() > 1 {
                operand.id().to_owned()
            } else {
                short.clone()
            }
        })
        .collect()
}

/// A cell of the node table: the state of the operand's pod in a word.
fn cell<'a>(mut operands: impl Iterator<Item = &'a OperandOnNode>) -> String {
    let Some(operand) = operands.next() else {
        return "-".to_owned();
    };
    let text = match (operand.placement, operand.state) {
        (Expectation::NotSelected, _) => "extra".to_owned(),
        (Expectation::NoDaemonSet, _) => "no-ds".to_owned(),
        (Expectation::Excluded, StateName::Absent) => "tainted".to_owned(),
        (_, StateName::Ready) => "ok".to_owned(),
        (_, StateName::Absent) => "missing".to_owned(),
        (_, StateName::Init) => operand
            .status
            .as_deref()
            .map(|s| s.replace("Init:", "init ").replace("CrashLoopBackOff", "crash"))
            .unwrap_or_else(|| "init".to_owned()),
        (_, StateName::CrashLoop) => "crashloop".to_owned(),
        (_, StateName::Pending) => "pending".to_owned(),
        (_, StateName::NotReady) => "not-ready".to_owned(),
        (_, StateName::Terminating) => "terminating".to_owned(),
        (_, StateName::Failed) => "failed".to_owned(),
        (_, StateName::Succeeded) => "exited".to_owned(),
        (_, StateName::Unknown) => "unknown".to_owned(),
    };
    if operands.next().is_some() {
        format!("{text}+")
    } else {
        text
    }
}

fn gpus(node: &NodeReport) -> String {
    if node.advertised.is_empty() {
        return "-".to_owned();
    }
    let capacity: i64 = node.advertised.iter().map(|a| a.capacity).sum();
    let allocatable: i64 = node.advertised.iter().map(|a| a.allocatable).sum();
    if capacity == allocatable {
        allocatable.to_string()
    } else {
        format!("{allocatable}/{capacity}")
    }
}

fn expectation(expected: Expectation) -> &'static str {
    match expected {
        Expectation::Expected => "yes",
        Expectation::Excluded => "tainted",
        Expectation::NotSelected => "no",
        Expectation::NoDaemonSet => "no-ds",
    }
}

/// Notes, with the same note on many nodes said once with the nodes' names.
fn grouped_notes(report: &Report) -> Vec<String> {
    let mut notes: Vec<String> = report.notes.clone();
    let mut by_text: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in &report.nodes {
        for note in &node.notes {
            by_text.entry(note.as_str()).or_default().push(&node.name);
        }
    }
    for (text, names) in by_text {
        notes.push(format!("{}: {text}", names_text(&names)));
    }
    notes
}

fn names_text(names: &[&str]) -> String {
    if names.len() <= NAMES_SHOWN {
        names.join(", ")
    } else {
        format!(
            "{} and {} more",
            names[..NAMES_SHOWN].join(", "),
            names.len() - NAMES_SHOWN
        )
    }
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
fn columns(rows: &[Vec<String>]) -> String {
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..count)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_short_and_unambiguous() {
        let operands = [
            Operand::Driver,
            Operand::ContainerToolkit,
            Operand::OperatorValidator,
            Operand::DevicePlugin,
            Operand::VgpuManager,
            Operand::VfioManager,
        ];
        assert_eq!(
            abbreviations(&operands),
            ["driver", "ct", "ov", "dp", "vgpu-manager", "vfio-manager"]
        );
    }

    #[test]
    fn columns_align() {
        let rows = vec![
            vec!["NODE".to_owned(), "X".to_owned(), "LINK".to_owned()],
            vec!["a100-01".to_owned(), "ok".to_owned(), "none".to_owned()],
        ];
        assert_eq!(columns(&rows), "NODE     X   LINK\na100-01  ok  none\n");
    }
}
