//! What a person watching the simulation sees: per node, each operand the node should run, in the chain
//! order of the catalogue, and how far it got. Pure: rows from nodes, DaemonSets and pods.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuop_api::placement::{Misfit, daemon_pod_fits};
use gpuop_api::{OPERANDS, Operand};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use crate::kubelet::operand_of;

/// How far an operand got on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Running and ready.
    Ready,
    /// Its pod exists but is not ready yet: `Pending`, `Init 1/2`, `Running`.
    Starting(String),
    /// Its pod keeps failing: `CrashLoopBackOff`.
    Failing(String),
    /// It should run here but has no pod yet.
    Missing,
}

impl Progress {
    fn symbol(&self) -> String {
        match self {
            Progress::Ready => "✓".into(),
            Progress::Starting(detail) => format!("… {detail}"),
            Progress::Failing(detail) => format!("✗ {detail}"),
            Progress::Missing => "·".into(),
        }
    }
}

/// One node's operands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Node name.
    pub node: String,
    /// The GPUs the node advertises, e.g. `8 nvidia.com/gpu`, or `no GPU advertised`.
    pub advertised: String,
    /// Operands the node should run, in catalogue order, with their progress.
    pub operands: Vec<(Operand, Progress)>,
    /// Why operands switched on for the node cannot run there (an untolerated taint), if that is so.
    pub excluded: Option<String>,
}

impl Row {
    /// Whether every operand the node should run is ready.
    pub fn converged(&self) -> bool {
        self.operands
            .iter()
            .all(|(_, progress)| *progress == Progress::Ready)
    }

    /// One line for the node.
    pub fn line(&self) -> String {
        let mut line = format!("{:<18}", self.node);
        match (&self.excluded, self.operands.is_empty()) {
            (Some(why), _) => {
                let _ = write!(line, "operands excluded: {why}  ");
            }
            (None, true) => line.push_str("no operands  "),
            (None, false) => {}
        }
        for (operand, progress) in &self.operands {
            let _ = write!(line, "{} {}  ", operand.id(), progress.symbol());
        }
        let _ = write!(line, "[{}]", self.advertised);
        line.trim_end().to_owned()
    }
}

/// The rows of every node, in name order.
pub fn rows(nodes: &[Node], daemonsets: &[DaemonSet], pods: &[Pod]) -> Vec<Row> {
    let mut pods_by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            pods_by_node.entry(node).or_default().push(pod);
        }
    }
    let mut nodes: Vec<&Node> = nodes.iter().collect();
    nodes.sort_by_key(|node| node.name_any());
    nodes
        .into_iter()
        .map(|node| {
            let here = pods_by_node
                .get(&node.name_any())
                .map(Vec::as_slice)
                .unwrap_or_default();
            row(node, daemonsets, here)
        })
        .collect()
}

/// One node's row, given the operand DaemonSets and the pods bound to the node (pods being deleted
/// excluded).
pub fn row<D: Borrow<DaemonSet>>(node: &Node, daemonsets: &[D], here: &[&Pod]) -> Row {
    let mut operands = Vec::new();
    let mut excluded = None;
    for info in OPERANDS {
        let mut wanted = false;
        for ds in daemonsets.iter().map(Borrow::borrow).filter(|ds| {
            ds.labels().get(gpuop_api::labels::COMPONENT).map(String::as_str) == Some(info.component)
        }) {
            let Some(spec) = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
                continue;
            };
            match daemon_pod_fits(node, spec) {
                Ok(()) => wanted = true,
                Err(misfit @ Misfit::Taint(_))
                    if node.labels().get(info.deploy_label).is_some_and(|v| v == "true") =>
                {
                    excluded = Some(misfit.to_string());
                }
                Err(_) => {}
            }
        }
        if !wanted {
            continue;
        }
        let pod = here.iter().find(|pod| operand_of(pod) == Some(info.operand));
        operands.push((info.operand, pod.map_or(Progress::Missing, |pod| progress(pod))));
    }
    Row {
        node: node.name_any(),
        advertised: advertised(node),
        operands,
        excluded,
    }
}

fn progress(pod: &Pod) -> Progress {
    let Some(status) = pod.status.as_ref() else {
        return Progress::Starting("Pending".into());
    };
    let crash = status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
        .find_map(|c| {
            c.state
                .as_ref()?
                .waiting
                .as_ref()?
                .reason
                .clone()
                .filter(|r| r == "CrashLoopBackOff")
        });
    if let Some(reason) = crash {
        return Progress::Failing(reason);
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        return Progress::Ready;
    }
    let inits = status.init_container_statuses.as_deref().unwrap_or_default();
    let done = inits
        .iter()
        .filter(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        })
        .count();
    if done < inits.len() {
        return Progress::Starting(format!("Init {done}/{}", inits.len()));
    }
    Progress::Starting(status.phase.clone().unwrap_or_else(|| "Pending".into()))
}

fn advertised(node: &Node) -> String {
    let resources: Vec<String> = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter(|(name, quantity)| gpuop_api::labels::is_gpu_resource(name) && quantity.0 != "0")
        .map(|(name, quantity)| format!("{} {name}", quantity.0))
        .collect();
    if resources.is_empty() {
        "no GPU advertised".into()
    } else {
        resources.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuop_testkit::fixture;

    fn node(name: &str, labels: &[(&str, &str)], gpus: &str) -> Node {
        fixture::node(name)
            .labels(labels)
            .allocatable("nvidia.com/gpu", gpus)
            .build()
    }

    fn daemonset(operand: Operand) -> DaemonSet {
        let info = operand.info();
        fixture::daemonset(info.daemonset)
            .labels(&[(gpuop_api::labels::COMPONENT, info.component)])
            .node_selector(&[(info.deploy_label, "true")])
            .build()
    }

    fn pod(operand: Operand, node: &str, ready: bool, crash: bool) -> Pod {
        let component = operand.info().component;
        let pod = fixture::pod(&format!("{component}-{node}"))
            .labels(&[(gpuop_api::labels::COMPONENT, component)])
            .on(node)
            .running(ready);
        if crash {
            pod.waiting("CrashLoopBackOff")
        } else {
            pod
        }
        .build()
    }

    #[test]
    fn rows_follow_the_catalogue_chain_and_show_each_operands_progress() {
        let nodes = [
            node(
                "gpu-0",
                &[
                    ("nvidia.com/gpu.deploy.driver", "true"),
                    ("nvidia.com/gpu.deploy.device-plugin", "true"),
                ],
                "8",
            ),
            node("cpu-0", &[], "0"),
        ];
        let daemonsets = [daemonset(Operand::DevicePlugin), daemonset(Operand::Driver)];
        let pods = [
            pod(Operand::Driver, "gpu-0", true, false),
            pod(Operand::DevicePlugin, "gpu-0", false, true),
        ];
        let rows = rows(&nodes, &daemonsets, &pods);
        assert_eq!(rows[0].node, "cpu-0");
        assert!(rows[0].operands.is_empty() && rows[0].converged());
        assert_eq!(
            rows[0].line(),
            "cpu-0             no operands  [no GPU advertised]"
        );
        let gpu = &rows[1];
        assert_eq!(
            gpu.operands,
            [
                (Operand::Driver, Progress::Ready),
                (
                    Operand::DevicePlugin,
                    Progress::Failing("CrashLoopBackOff".into())
                )
            ]
        );
        assert!(!gpu.converged());
        assert_eq!(
            gpu.line(),
            "gpu-0             driver ✓  device-plugin ✗ CrashLoopBackOff  [8 nvidia.com/gpu]"
        );
    }
}
