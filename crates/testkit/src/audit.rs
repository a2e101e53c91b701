//! The API server's audit log read back: one [`AuditEvent`] per request, with the user, the user agent, the
//! verb, the object and the answer's code, as kube-apiserver saw them. Tests count a client's requests from
//! it the way a cluster admin would, not from the client's own logs.
//!
//! The log is written in batches (at most a second late), so [`AuditLog::settled`] first sends a request of
//! its own and waits until that request is in the log: everything answered before it is there too.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpuop_fakeserver::authz::rbac::{Attributes, UserInfo};
use gpuop_fakeserver::{RequestCounts, RequestKey, Verb, client_label};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use serde::Deserialize;

use crate::error::{Error, client_error, io};

/// How long a marker request may take to show in the log: the batch wait is one second.
const SETTLE_PATIENCE: Duration = Duration::from_secs(30);

/// One request, as the audit log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEvent {
    /// The user (`admin`, `system:serviceaccount:gpu-operator:gpu-operator`, ...) and its groups.
    pub user: UserInfo,
    /// The `User-Agent` header.
    pub user_agent: String,
    /// What the request asked, as the authorizer was asked it: the verb, the object (`resource` is `""`
    /// for a non-resource URL) and the path without its query.
    pub attrs: Attributes,
    /// The answer's code (a watch's as it started).
    pub code: u16,
    /// The answer's `Status` reason, where it failed.
    pub reason: String,
    /// The answer's `Status` message, where it failed.
    pub message: String,
    /// What the authorizer decided (`allow`, `forbid`), or `""` where it was not asked (an unauthenticated
    /// request).
    pub decision: String,
    /// The request path and query.
    pub uri: String,
    /// When the API server received it.
    pub received: jiff::Timestamp,
}

impl AuditEvent {
    /// Whether the request asked for a change.
    pub fn is_write(&self) -> bool {
        matches!(
            self.attrs.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// The request path, without its query.
    pub fn path(&self) -> &str {
        &self.attrs.path
    }

    /// Whether the client is `agent`: its user agent is `agent` or starts with `agent/`.
    pub fn by_agent(&self, agent: &str) -> bool {
        self.user_agent
            .strip_prefix(agent)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// The request as the fake server's request accounting keys it, so that counts compare across backends:
    /// the same verb, resource, scope and code, the user agent as the client. Server-side apply is a
    /// `patch` to the audit log (the fake server counts it as `APPLY`).
    pub fn key(&self) -> Option<RequestKey> {
        let attrs = &self.attrs;
        Some(RequestKey {
            verb: Verb::parse(&attrs.verb)?,
            group: attrs.api_group.clone(),
            version: attrs.api_version.clone(),
            resource: attrs.resource.clone(),
            subresource: attrs.subresource.clone(),
            // As kube-apiserver's request metrics (and the fake server) scope a request.
            scope: if !attrs.name.is_empty() {
                "resource".to_owned()
            } else if attrs.namespace.is_empty() {
                "cluster".to_owned()
            } else {
                "namespace".to_owned()
            },
            code: self.code,
            client: client_label(Some(&self.user_agent)),
        })
    }
}

/// Counts events as the fake server counts requests.
pub fn counts<'e>(events: impl IntoIterator<Item = &'e AuditEvent>) -> RequestCounts {
    events.into_iter().filter_map(AuditEvent::key).collect()
}

/// The wire form of an audit event (`audit.k8s.io/v1` `Event`), as much of it as is read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(rename = "auditID")]
    audit_id: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    verb: String,
    user: WireUser,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: Option<WireObject>,
    #[serde(default)]
    response_status: Option<WireStatus>,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
    request_received_timestamp: jiff::Timestamp,
}

#[derive(Deserialize)]
struct WireUser {
    #[serde(default)]
    username: String,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireObject {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Default, Deserialize)]
struct WireStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

/// A control plane's audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    marks: AtomicU64,
}

impl AuditLog {
    /// The log at `path` (it need not exist yet).
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            marks: AtomicU64::new(0),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every request in the log so far, one event per request (a watch's start and end are one), in the
    /// order the API server received them. A last line still being written is left for the next read.
    pub fn read(&self) -> Result<Vec<AuditEvent>, Error> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(io(format!("reading {}", self.path.display()))(error)),
        };
        parse(&text).map_err(|(line, error)| Error::Io {
            what: format!(
                "{} line {line} is not an audit event: {error}",
                self.path.display()
            ),
            source: std::io::ErrorKind::InvalidData.into(),
        })
    }

    /// The log once it has caught up with this call: every request answered before it is in what is
    /// returned (so may be some answered since). The marks, GETs by `admin` of namespaces named
    /// `gpuop-testkit-mark-N` that do not exist, are left out.
    pub async fn settled(&self, admin: &kube::Client) -> Result<Vec<AuditEvent>, Error> {
        let mark = format!(
            "gpuop-testkit-mark-{}",
            self.marks.fetch_add(1, Ordering::Relaxed)
        );
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        namespaces
            .get_opt(&mark)
            .await
            .map_err(|e| client_error("sending the audit log's mark")(e.into()))?;
        let started = Instant::now();
        loop {
            let mut events = self.read()?;
            let is_mark = |e: &AuditEvent| e.attrs.resource == "namespaces" && e.attrs.name == mark;
            if events.iter().any(is_mark) {
                events.retain(|e| {
                    !(e.attrs.resource == "namespaces" && e.attrs.name.starts_with("gpuop-testkit-mark-"))
                });
                return Ok(events);
            }
            if started.elapsed() > SETTLE_PATIENCE {
                return Err(Error::Io {
                    what: format!(
                        "{} has not shown the request for namespace {mark} after {SETTLE_PATIENCE:?}",
                        self.path.display()
                    ),
                    source: std::io::ErrorKind::TimedOut.into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Reads the log's lines; the number and error of a complete line that does not read.
fn parse(text: &str) -> Result<Vec<AuditEvent>, (usize, serde_json::Error)> {
    let complete = text
        .rfind('\n')
        .map_or("", |end| text.get(..end).unwrap_or_default());
    let mut events: Vec<(String, AuditEvent)> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (number, line) in complete.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let wire: Wire = serde_json::from_str(line).map_err(|error| (number + 1, error))?;
        let object = wire.object_ref.unwrap_or_default();
        let status = wire.response_status.unwrap_or_default();
        let path = wire
            .request_uri
            .split_once('?')
            .map_or(wire.request_uri.as_str(), |(path, _)| path);
        let attrs = if object.resource.is_empty() {
            Attributes::non_resource(&wire.verb, path)
        } else {
            Attributes {
                verb: wire.verb,
                resource_request: true,
                api_group: object.api_group,
                api_version: object.api_version,
                resource: object.resource,
                subresource: object.subresource,
                namespace: object.namespace,
                name: object.name,
                path: path.to_owned(),
            }
        };
        let event = AuditEvent {
            user: UserInfo {
                name: wire.user.username,
                groups: wire.user.groups,
            },
            user_agent: wire.user_agent,
            attrs,
            code: status.code,
            reason: status.reason,
            message: status.message,
            decision: wire
                .annotations
                .get("authorization.k8s.io/decision")
                .cloned()
                .unwrap_or_default(),
            uri: wire.request_uri,
            received: wire.request_received_timestamp,
        };
        // A long-running request (a watch) has a `ResponseStarted` and, once it ends, a
        // `ResponseComplete` event with the same code: the first stands for the request, so that counting
        // before and after the watch ends sees one request.
        match at.get(&wire.audit_id) {
            Some(_) => {}
            None => {
                at.insert(wire.audit_id.clone(), events.len());
                events.push((wire.audit_id, event));
            }
        }
    }
    let mut events: Vec<AuditEvent> = events.into_iter().map(|(_, event)| event).collect();
    events.sort_by_key(|event| event.received);
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseStarted","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"gpu-operator/0.1.0","objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-04T10:00:00.000000Z","stageTimestamp":"2026-12-04T10:00:00.001000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseComplete","requestURI":"/apis/apps/v1/namespaces/gpu-operator/daemonsets/x?fieldManager=gpu-operator","verb":"patch","user":{"username":"system:serviceaccount:gpu-operator:gpu-operator"},"sourceIPs":["127.0.0.1"],"userAgent":"gpu-operator","objectRef":{"resource":"daemonsets","namespace":"gpu-operator","name":"x","apiGroup":"apps","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","message":"daemonsets.apps \"x\" is forbidden: User \"system:serviceaccount:gpu-operator:gpu-operator\" cannot patch resource \"daemonsets\" in API group \"apps\" in the namespace \"gpu-operator\"","reason":"Forbidden","code":403},"requestReceivedTimestamp":"2026-12-04T10:00:01.000000Z","stageTimestamp":"2026-12-04T10:00:01.001000Z","annotations":{"authorization.k8s.io/decision":"forbid","authorization.k8s.io/reason":""}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{"username":"admin","groups":["system:masters","system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"gpu-operator/0.1.0","objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-04T10:00:00.000000Z","stageTimestamp":"2026-12-04T10:04:50.000000Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","auditID":"c","stage":"Resp"#;

    #[test]
    fn one_event_per_request_and_a_half_written_line_waits() {
        let events = parse(LOG).expect("the log reads");
        assert_eq!(events.len(), 2, "{events:#?}");
        let watch = &events[0];
        assert_eq!(
            (
                watch.attrs.verb.as_str(),
                watch.attrs.resource.as_str(),
                watch.code
            ),
            ("watch", "nodes", 200)
        );
        assert!(watch.by_agent("gpu-operator") && !watch.by_agent("gpu-op"));
        assert!(!watch.is_write());
        let patch = &events[1];
        assert_eq!(patch.user.name, "system:serviceaccount:gpu-operator:gpu-operator");
        assert_eq!((patch.code, patch.reason.as_str()), (403, "Forbidden"));
        assert_eq!(patch.decision, "forbid");
        assert!(
            patch.message.ends_with(
                "cannot patch resource \"daemonsets\" in API group \"apps\" in the namespace \"gpu-operator\""
            ),
            "{}",
            patch.message
        );
        assert_eq!(patch.path(), "/apis/apps/v1/namespaces/gpu-operator/daemonsets/x");
        assert_eq!(
            (
                patch.attrs.api_group.as_str(),
                patch.attrs.namespace.as_str(),
                patch.attrs.name.as_str()
            ),
            ("apps", "gpu-operator", "x")
        );
        assert!(patch.is_write());

        let counted = counts(&events);
        assert_eq!(counted.count(Verb::Patch, "daemonsets"), 1);
        assert_eq!(counted.writes_by("gpu-operator"), 1);
        assert_eq!(counted.by_client("gpu-operator"), 2);
    }

    #[test]
    fn a_watch_counts_the_same_open_and_ended() {
        let first = LOG.lines().next().expect("a line");
        let open = counts(&parse(&format!("{first}\n")).expect("the log reads"));
        let ended = counts(&parse(LOG).expect("the log reads"));
        let watches =
            |counts: &RequestCounts| counts.matching(|key| key.verb == Verb::Watch && key.code == 200);
        assert_eq!((watches(&open), watches(&ended)), (1, 1));
        assert_eq!(ended.since(&open).matching(|key| key.verb == Verb::Watch), 0);
    }

    #[test]
    fn a_broken_line_is_named() {
        let (line, _) = parse("{}\n").expect_err("not an event");
        assert_eq!(line, 1);
    }
}
