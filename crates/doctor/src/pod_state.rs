//! What state a pod is in, as `kubectl get pods` would show it, and why, from its status alone.
//!
//! Also: how far a pod got through its init containers, which is how operands wait for each other on a
//! node (an init container named `<x>-validation` waits for the status file `<x>-ready`).

use std::fmt;

use serde::Serialize;

use crate::snapshot::{ContainerStateFacts, ContainerStatusFacts, PodFacts};

/// The state of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Running, every container ready.
    Ready,
    /// Not scheduled yet, or scheduled and its containers not created yet.
    Pending {
        /// Scheduler's or kubelet's reason (`Unschedulable`, `ContainerCreating`, `ImagePullBackOff`).
        reason: Option<String>,
        /// Their message.
        message: Option<String>,
    },
    /// Init containers have not all finished.
    Init {
        /// How many finished successfully.
        done: usize,
        /// How many there are.
        total: usize,
        /// The one not finished.
        current: Option<String>,
        /// Why it is stuck, when it says (`CrashLoopBackOff`, `Error`).
        reason: Option<String>,
        /// More detail: exit code and restarts, or the waiting message.
        detail: Option<String>,
    },
    /// A container keeps crashing.
    CrashLoop {
        /// The container.
        container: String,
        /// Restarts so far.
        restarts: i32,
        /// How it last ended (exit code and reason).
        last: Option<String>,
    },
    /// Running, but some container is not ready.
    NotReady {
        /// Which containers, and what the Ready condition says.
        reason: String,
    },
    /// Being deleted.
    Terminating,
    /// Ended with failure.
    Failed {
        /// The pod's reason (`UnexpectedAdmissionError`, `OutOfnvidia.com/gpu`, `Evicted`).
        reason: Option<String>,
        /// Its message.
        message: Option<String>,
    },
    /// Ended successfully (not what an operand should do).
    Succeeded,
    /// The node stopped reporting.
    Unknown,
}

/// The stable, machine-readable name of a state in the JSON report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateName {
    /// Running and ready.
    Ready,
    /// No pod.
    Absent,
    /// Pending.
    Pending,
    /// In its init containers.
    Init,
    /// Crash-looping.
    CrashLoop,
    /// Running, not ready.
    NotReady,
    /// Being deleted.
    Terminating,
    /// Failed.
    Failed,
    /// Succeeded.
    Succeeded,
    /// Unknown.
    Unknown,
}

impl PodState {
    /// Judges a pod from its status.
    pub fn of(pod: &PodFacts) -> PodState {
        if pod.is_terminating() {
            return PodState::Terminating;
        }
        let status = &pod.status;
        match status.phase.as_deref() {
            Some("Failed") => {
                return PodState::Failed {
                    reason: status.reason.clone(),
                    message: status.message.clone(),
                };
            }
            Some("Succeeded") => return PodState::Succeeded,
            Some("Unknown") => return PodState::Unknown,
            Some("Running") => return running_state(pod),
            _ => {}
        }
        if pod.spec.node_name.as_deref().is_none_or(str::is_empty) {
            let scheduled = pod
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            return PodState::Pending {
                reason: scheduled.and_then(|c| c.reason.clone()),
                message: scheduled.and_then(|c| c.message.clone()),
            };
        }
        if let Some(init) = init_progress(pod)
            && init.done < init.total
        {
            return PodState::Init {
                done: init.done,
                total: init.total,
                current: init.current,
                reason: init.reason,
                detail: init.detail,
            };
        }
        let waiting = status
            .container_statuses
            .iter()
            .find_map(|c| c.state.as_ref().and_then(|s| s.waiting.as_ref()));
        PodState::Pending {
            reason: waiting.and_then(|w| w.reason.clone()),
            message: waiting.and_then(|w| w.message.clone()),
        }
    }

    /// Whether the pod is ready.
    pub fn is_ready(&self) -> bool {
        matches!(self, PodState::Ready)
    }

    /// Whether its main containers have started (it got past its init containers, which is where operands
    /// wait for the operands they need).
    pub fn is_running(&self) -> bool {
        matches!(
            self,
            PodState::Ready | PodState::CrashLoop { .. } | PodState::NotReady { .. }
        )
    }

    /// The stable name of the state.
    pub fn name(&self) -> StateName {
        match self {
            PodState::Ready => StateName::Ready,
            PodState::Pending { .. } => StateName::Pending,
            PodState::Init { .. } => StateName::Init,
            PodState::CrashLoop { .. } => StateName::CrashLoop,
            PodState::NotReady { .. } => StateName::NotReady,
            PodState::Terminating => StateName::Terminating,
            PodState::Failed { .. } => StateName::Failed,
            PodState::Succeeded => StateName::Succeeded,
            PodState::Unknown => StateName::Unknown,
        }
    }

    /// A sentence-part saying why, where the objects show it.
    pub fn detail(&self) -> Option<String> {
        match self {
            PodState::Ready | PodState::Terminating | PodState::Succeeded | PodState::Unknown => None,
            PodState::Pending { reason, message } => join(reason.as_deref(), message.as_deref()),
            PodState::Init {
                done,
                total,
                current,
                reason,
                detail,
            } => {
                let current = current.as_deref().unwrap_or("an init container");
                let mut text = format!("init container {current} ({} of {total})", done + 1);
                match (reason, detail) {
                    (Some(reason), Some(detail)) => text.push_str(&format!(": {reason}, {detail}")),
                    (Some(reason), None) => text.push_str(&format!(": {reason}")),
                    (None, Some(detail)) => text.push_str(&format!(": {detail}")),
                    (None, None) => text.push_str(" has not finished"),
                }
                Some(text)
            }
            PodState::CrashLoop {
                container,
                restarts,
                last,
            } => {
                let mut text = format!("container {container} restarted {restarts} times");
                if let Some(last) = last {
                    text.push_str(&format!(", last {last}"));
                }
                Some(text)
            }
            PodState::NotReady { reason } => Some(reason.clone()),
            PodState::Failed { reason, message } => join(reason.as_deref(), message.as_deref()),
        }
    }
}

impl fmt::Display for PodState {
    /// The STATUS column of `kubectl get pods`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodState::Ready => f.write_str("Running"),
            PodState::Pending { reason, .. } => f.write_str(reason.as_deref().unwrap_or("Pending")),
            PodState::Init {
                reason: Some(reason), ..
            } => write!(f, "Init:{reason}"),
            PodState::Init { done, total, .. } => write!(f, "Init:{done}/{total}"),
            PodState::CrashLoop { .. } => f.write_str("CrashLoopBackOff"),
            PodState::NotReady { .. } => f.write_str("NotReady"),
            PodState::Terminating => f.write_str("Terminating"),
            PodState::Failed { reason, .. } => f.write_str(reason.as_deref().unwrap_or("Failed")),
            PodState::Succeeded => f.write_str("Completed"),
            PodState::Unknown => f.write_str("Unknown"),
        }
    }
}

fn join(reason: Option<&str>, message: Option<&str>) -> Option<String> {
    match (reason, message) {
        (Some(reason), Some(message)) => Some(format!("{reason}: {message}")),
        (Some(text), None) | (None, Some(text)) => Some(text.to_owned()),
        (None, None) => None,
    }
}

fn running_state(pod: &PodFacts) -> PodState {
    let statuses = &pod.status.container_statuses;
    if let Some(crashing) = statuses
        .iter()
        .find(|c| waiting_reason(c) == Some("CrashLoopBackOff"))
    {
        return PodState::CrashLoop {
            container: crashing.name.clone(),
            restarts: crashing.restart_count,
            last: crashing.last_state.as_ref().and_then(ended),
        };
    }
    let not_ready: Vec<&ContainerStatusFacts> = statuses.iter().filter(|c| !c.ready).collect();
    let ready_condition = pod.status.conditions.iter().find(|c| c.type_ == "Ready");
    let condition_false = ready_condition.is_some_and(|c| c.status != "True");
    if !statuses.is_empty() && not_ready.is_empty() && !condition_false {
        return PodState::Ready;
    }
    let mut reasons: Vec<String> = not_ready
        .iter()
        .map(|c| match waiting_reason(c) {
            Some(reason) => format!("container {} is {reason}", c.name),
            None => format!("container {} is not ready", c.name),
        })
        .collect();
    if statuses.is_empty() {
        reasons.push("no container reports a status".to_owned());
    }
    if let Some(message) = ready_condition.and_then(|c| c.message.as_deref())
        && reasons.is_empty()
    {
        reasons.push(message.to_owned());
    }
    if reasons.is_empty() {
        reasons.push("the Ready condition is not True".to_owned());
    }
    PodState::NotReady {
        reason: reasons.join("; "),
    }
}

fn waiting_reason(status: &ContainerStatusFacts) -> Option<&str> {
    status.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// How a container last ended: `exit code 1 (Error)`.
fn ended(state: &ContainerStateFacts) -> Option<String> {
    let terminated = state.terminated.as_ref()?;
    Some(match terminated.reason.as_deref() {
        Some(reason) => format!("exit code {} ({reason})", terminated.exit_code),
        None => format!("exit code {}", terminated.exit_code),
    })
}

/// How far a pod got through its init containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitProgress {
    /// Finished successfully, in order.
    pub done: usize,
    /// How many there are.
    pub total: usize,
    /// The first not finished.
    pub current: Option<String>,
    /// Why it is stuck, when it says.
    pub reason: Option<String>,
    /// Exit code and restarts, or the waiting message.
    pub detail: Option<String>,
}

/// The pod's init progress; `None` when it has no init containers.
pub fn init_progress(pod: &PodFacts) -> Option<InitProgress> {
    let statuses = &pod.status.init_container_statuses;
    let total = pod.spec.init_containers.len().max(statuses.len());
    if total == 0 {
        return None;
    }
    let mut done = 0;
    for (index, name) in init_container_names(pod).into_iter().enumerate() {
        let status = statuses.iter().find(|s| s.name == name);
        let state = status.and_then(|s| s.state.as_ref());
        let succeeded = state
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0);
        if succeeded {
            done = index + 1;
            continue;
        }
        let waiting = state.and_then(|s| s.waiting.as_ref());
        let failed = state.and_then(|s| s.terminated.as_ref());
        let restarts = status.map_or(0, |s| s.restart_count);
        let (reason, detail) = if let Some(waiting) =
            waiting.filter(|w| w.reason.as_deref() != Some("PodInitializing"))
        {
            let last = status.and_then(|s| s.last_state.as_ref()).and_then(ended);
            let detail = match (last, restarts) {
                (Some(last), restarts) if restarts > 0 => Some(format!("{restarts} restarts, last {last}")),
                (Some(last), _) => Some(format!("last {last}")),
                (None, _) => waiting.message.clone(),
            };
            (waiting.reason.clone(), detail)
        } else if let Some(failed) = failed {
            (
                Some(failed.reason.clone().unwrap_or_else(|| "Error".to_owned())),
                Some(format!("exit code {}", failed.exit_code)),
            )
        } else if state.is_some_and(|s| s.running.is_some()) {
            (None, Some("running".to_owned()))
        } else {
            (None, None)
        };
        return Some(InitProgress {
            done,
            total,
            current: Some(name),
            reason,
            detail,
        });
    }
    Some(InitProgress {
        done,
        total,
        current: None,
        reason: None,
        detail: None,
    })
}

/// Whether the init container with this name finished successfully: `None` when the pod has none by
/// that name. A ready pod finished all of them.
pub fn init_container_passed(pod: &PodFacts, name: &str) -> Option<bool> {
    let names = init_container_names(pod);
    let position = names.iter().position(|n| n == name)?;
    if PodState::of(pod).is_running() {
        return Some(true);
    }
    let progress = init_progress(pod)?;
    Some(position < progress.done)
}

fn init_container_names(pod: &PodFacts) -> Vec<String> {
    if pod.spec.init_containers.is_empty() {
        pod.status
            .init_container_statuses
            .iter()
            .map(|s| s.name.clone())
            .collect()
    } else {
        pod.spec.init_containers.iter().map(|c| c.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> PodFacts {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn states_read_like_kubectl() {
        let ready = pod(
            serde_json::json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "a", "ready": true}]}}),
        );
        assert_eq!(PodState::of(&ready), PodState::Ready);

        let crash = pod(
            serde_json::json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "toolkit", "ready": false, "restartCount": 7,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}}),
        );
        let state = PodState::of(&crash);
        assert_eq!(state.to_string(), "CrashLoopBackOff");
        assert_eq!(
            state.detail().unwrap(),
            "container toolkit restarted 7 times, last exit code 1 (Error)"
        );
        assert!(state.is_running() && !state.is_ready());

        let init = pod(serde_json::json!({"spec": {"nodeName": "n",
                "initContainers": [{"name": "driver-validation"}, {"name": "toolkit-validation"},
                                   {"name": "cuda-validation"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "driver-validation", "state": {"terminated": {"exitCode": 0}}},
                {"name": "toolkit-validation", "restartCount": 3,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 1}}},
                {"name": "cuda-validation", "state": {"waiting": {"reason": "PodInitializing"}}}]}}));
        let state = PodState::of(&init);
        assert_eq!(state.to_string(), "Init:CrashLoopBackOff");
        assert_eq!(
            state.detail().unwrap(),
            "init container toolkit-validation (2 of 3): CrashLoopBackOff, 3 restarts, last exit code 1"
        );
        assert_eq!(init_container_passed(&init, "driver-validation"), Some(true));
        assert_eq!(init_container_passed(&init, "toolkit-validation"), Some(false));
        assert_eq!(init_container_passed(&init, "plugin-validation"), None);

        let waiting = pod(serde_json::json!({"spec": {"nodeName": "n",
                "initContainers": [{"name": "toolkit-validation"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "toolkit-validation", "state": {"running": {}}}]}}));
        assert_eq!(PodState::of(&waiting).to_string(), "Init:0/1");

        let unscheduled = pod(serde_json::json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/4 nodes are available: 4 Insufficient cpu."}]}}));
        let state = PodState::of(&unscheduled);
        assert_eq!(state.to_string(), "Unschedulable");
        assert_eq!(
            state.detail().unwrap(),
            "Unschedulable: 0/4 nodes are available: 4 Insufficient cpu."
        );

        let pulling = pod(
            serde_json::json!({"spec": {"nodeName": "n"}, "status": {"phase": "Pending",
            "containerStatuses": [{"name": "a", "state": {"waiting": {"reason": "ImagePullBackOff",
                "message": "Back-off pulling image"}}}]}}),
        );
        assert_eq!(PodState::of(&pulling).to_string(), "ImagePullBackOff");

        let unready = pod(
            serde_json::json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "exporter", "ready": false, "state": {"running": {}}}]}}),
        );
        assert_eq!(
            PodState::of(&unready),
            PodState::NotReady {
                reason: "container exporter is not ready".to_owned()
            }
        );

        let deleting = pod(
            serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "ready": true}]}}),
        );
        assert_eq!(PodState::of(&deleting), PodState::Terminating);

        let rejected = pod(
            serde_json::json!({"spec": {"nodeName": "n"}, "status": {"phase": "Failed",
            "reason": "UnexpectedAdmissionError", "message": "Allocate failed"}}),
        );
        assert_eq!(PodState::of(&rejected).to_string(), "UnexpectedAdmissionError");
    }
}
