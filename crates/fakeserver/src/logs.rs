//! `GET .../pods/{name}/log`: what the API server answers for a container's log, decided from the pod as
//! stored and the output a test gave the server ([`ContainerLogs`]). Nothing in this server runs
//! containers, so a container nobody wrote output for answers what a real server answers for a container
//! that wrote nothing: 200 and an empty body. The refusals are the real server's, word for word: no
//! container named when the pod has several, a container the pod does not have, a container that has not
//! started, and `previous=true` for a container that never terminated. Between restarts
//! (CrashLoopBackOff) a container's log is its last run's, as the kubelet serves it.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use crate::error::ApiError;

/// Which run of a container a log belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogStream {
    /// The running (or last) instance.
    Current,
    /// The instance before the last restart (`previous=true`).
    Previous,
}

/// Container output a test has written, by namespace, pod, container and stream.
#[derive(Debug, Default)]
pub(crate) struct ContainerLogs {
    logs: Mutex<HashMap<(String, String, String, LogStream), String>>,
}

impl ContainerLogs {
    pub(crate) fn set(&self, namespace: &str, pod: &str, container: &str, stream: LogStream, text: &str) {
        let key = (namespace.to_owned(), pod.to_owned(), container.to_owned(), stream);
        self.logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, text.to_owned());
    }

    fn get(&self, namespace: &str, pod: &str, container: &str, stream: LogStream) -> String {
        let key = (namespace.to_owned(), pod.to_owned(), container.to_owned(), stream);
        self.logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned()
            .unwrap_or_default()
    }
}

/// The query of a log request that changes what comes back.
#[derive(Debug, Default)]
pub(crate) struct LogQuery {
    pub(crate) container: Option<String>,
    pub(crate) previous: bool,
    pub(crate) tail_lines: Option<u64>,
    pub(crate) limit_bytes: Option<u64>,
}

/// The log of one container of `pod`, or the real server's refusal.
pub(crate) fn pod_log(pod: &Value, query: &LogQuery, logs: &ContainerLogs) -> Result<String, ApiError> {
    let text = |pointer: &str| {
        pod.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let name = text("/metadata/name");
    let namespace = text("/metadata/namespace");
    let names = |field: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{field}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect()
    };
    let (containers, init_containers) = (names("containers"), names("initContainers"));
    let container = match &query.container {
        Some(container) if !container.is_empty() => container.clone(),
        _ if containers.len() == 1 => containers[0].clone(),
        _ => {
            let mut message = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init_containers.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init_containers.join(" ")
                ));
            }
            return Err(ApiError::BadRequest(message));
        }
    };
    if !containers.contains(&container) && !init_containers.contains(&container) {
        return Err(ApiError::BadRequest(format!(
            "container {container} is not valid for pod {name}"
        )));
    }
    let status = ["containerStatuses", "initContainerStatuses"]
        .iter()
        .filter_map(|field| pod.pointer(&format!("/status/{field}")).and_then(Value::as_array))
        .flatten()
        .find(|s| s.get("name").and_then(Value::as_str) == Some(container.as_str()));
    // The kubelet's choice of container (validateContainerLogStatus), in its order.
    let state = |field: &str| {
        status
            .and_then(|s| s.get(field))
            .and_then(|state| state.as_object())
            .cloned()
            .unwrap_or_default()
    };
    let (current, last) = (state("state"), state("lastState"));
    let has =
        |state: &serde_json::Map<String, Value>, key: &str| state.get(key).is_some_and(|v| !v.is_null());
    let stream = if query.previous {
        if !has(&last, "terminated") {
            return Err(ApiError::BadRequest(format!(
                "previous terminated container \"{container}\" in pod \"{name}\" not found"
            )));
        }
        LogStream::Previous
    } else if has(&current, "running") || has(&current, "terminated") {
        LogStream::Current
    } else if has(&last, "terminated") {
        // Between restarts (CrashLoopBackOff) the log is the last run's.
        LogStream::Previous
    } else if has(&current, "waiting") {
        let reason = current
            .get("waiting")
            .and_then(|w| w.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let why = match reason {
            "ErrImagePull" => "image can't be pulled".to_owned(),
            "ImagePullBackOff" => "trying and failing to pull image".to_owned(),
            other => other.to_owned(),
        };
        return Err(ApiError::BadRequest(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {why}"
        )));
    } else {
        return Err(ApiError::BadRequest(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start - no logs yet"
        )));
    };
    Ok(bound(logs.get(&namespace, &name, &container, stream), query))
}

/// `tailLines` first (the last lines), then `limitBytes` (the first bytes of what is left), as the kubelet
/// applies them.
fn bound(log: String, query: &LogQuery) -> String {
    let mut log = log;
    if let Some(tail) = query.tail_lines {
        let lines: Vec<&str> = log.split_inclusive('\n').collect();
        let keep = lines
            .len()
            .saturating_sub(usize::try_from(tail).unwrap_or(usize::MAX));
        log = lines[keep..].concat();
    }
    if let Some(limit) = query.limit_bytes.and_then(|l| usize::try_from(l).ok())
        && log.len() > limit
    {
        let mut cut = limit;
        while !log.is_char_boundary(cut) {
            cut -= 1;
        }
        log.truncate(cut);
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(restarted: bool) -> Value {
        let last = if restarted {
            json!({"terminated": {"exitCode": 1}})
        } else {
            json!({})
        };
        json!({"metadata": {"name": "p", "namespace": "n"},
               "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "main"}, {"name": "side"}]},
               "status": {"containerStatuses": [
                   {"name": "main", "state": {"running": {}}, "lastState": last, "restartCount": 1},
                   {"name": "side", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}})
    }

    fn query(container: &str, previous: bool) -> LogQuery {
        LogQuery {
            container: Some(container.to_owned()),
            previous,
            ..LogQuery::default()
        }
    }

    #[test]
    fn refusals_are_the_real_servers() {
        let logs = ContainerLogs::default();
        let error = |q: &LogQuery, restarted| pod_log(&pod(restarted), q, &logs).unwrap_err().to_string();
        assert_eq!(
            error(&LogQuery::default(), false),
            "a container name must be specified for pod p, choose one of: [main side] or one of the init containers: [init]"
        );
        assert_eq!(
            error(&query("x", false), false),
            "container x is not valid for pod p"
        );
        assert_eq!(
            error(&query("main", true), false),
            "previous terminated container \"main\" in pod \"p\" not found"
        );
        assert_eq!(
            error(&query("side", false), false),
            "container \"side\" in pod \"p\" is waiting to start: trying and failing to pull image"
        );
        assert_eq!(
            pod_log(&pod(false), &query("main", false), &logs).unwrap(),
            "",
            "wrote nothing"
        );
    }

    #[test]
    fn tail_lines_then_limit_bytes() {
        let logs = ContainerLogs::default();
        logs.set("n", "p", "main", LogStream::Current, "one\ntwo\nthree\n");
        logs.set("n", "p", "main", LogStream::Previous, "before\n");
        let mut q = query("main", false);
        q.tail_lines = Some(2);
        assert_eq!(pod_log(&pod(true), &q, &logs).unwrap(), "two\nthree\n");
        q.limit_bytes = Some(5);
        assert_eq!(pod_log(&pod(true), &q, &logs).unwrap(), "two\nt");
        assert_eq!(
            pod_log(&pod(true), &query("main", true), &logs).unwrap(),
            "before\n"
        );
        let mut crashing = pod(true);
        crashing["status"]["containerStatuses"][0]["state"] =
            json!({"waiting": {"reason": "CrashLoopBackOff"}});
        assert_eq!(
            pod_log(&crashing, &query("main", false), &logs).unwrap(),
            "before\n",
            "between restarts the log is the last run's"
        );
    }
}
