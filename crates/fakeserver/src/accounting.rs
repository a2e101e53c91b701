//! Every request counted by verb, resource, response code and client, readable in-process
//! ([`RequestCounts`]) and served as `apiserver_request_total` on the server's `/metrics`, so tests and
//! benchmarks can assert exactly how many writes a client made.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, PoisonError};

/// The verbs, as the API server's metrics name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// GET of one object (or any non-resource path).
    Get,
    /// GET of a collection.
    List,
    /// GET with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH other than server-side apply.
    Patch,
    /// PATCH with `application/apply-patch+yaml`.
    Apply,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
}

impl Verb {
    /// The `verb` label of `apiserver_request_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::List => "LIST",
            Self::Watch => "WATCH",
            Self::Create => "POST",
            Self::Update => "PUT",
            Self::Patch => "PATCH",
            Self::Apply => "APPLY",
            Self::Delete => "DELETE",
            Self::DeleteCollection => "DELETECOLLECTION",
        }
    }

    /// Whether the verb changes objects.
    pub fn is_write(self) -> bool {
        !matches!(self, Self::Get | Self::List | Self::Watch)
    }

    /// Parses a verb by its metric label or its Kubernetes RBAC name (`get`, `list`, `create`, `patch`, ...).
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_lowercase().as_str() {
            "get" => Self::Get,
            "list" => Self::List,
            "watch" => Self::Watch,
            "create" | "post" => Self::Create,
            "update" | "put" => Self::Update,
            "patch" => Self::Patch,
            "apply" => Self::Apply,
            "delete" => Self::Delete,
            "deletecollection" => Self::DeleteCollection,
            _ => return None,
        })
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.metric_label())
    }
}

/// What one counted request was.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// The verb.
    pub verb: Verb,
    /// API group ("" for core and for non-resource paths).
    pub group: String,
    /// API version ("" for non-resource paths).
    pub version: String,
    /// Plural resource ("" for non-resource paths such as discovery).
    pub resource: String,
    /// Subresource ("status", "eviction", ...), or "".
    pub subresource: String,
    /// `resource` (one object), `namespace` (a namespace's collection), `cluster` (cluster-wide), or "".
    pub scope: String,
    /// The HTTP status code answered.
    pub code: u16,
    /// The client: the `User-Agent` up to its first space, or `unknown`.
    pub client: String,
}

/// A snapshot of the request counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    entries: BTreeMap<RequestKey, u64>,
}

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.entries.values().sum()
    }

    /// Requests with this verb on this resource (plural name), any code, any client.
    pub fn count(&self, verb: Verb, resource: &str) -> u64 {
        self.matching(|key| key.verb == verb && key.resource == resource)
    }

    /// Requests the filter accepts.
    pub fn matching(&self, filter: impl Fn(&RequestKey) -> bool) -> u64 {
        self.entries
            .iter()
            .filter(|(key, _)| filter(key))
            .map(|(_, n)| n)
            .sum()
    }

    /// Write requests (create, update, patch, apply, delete) of every client.
    pub fn writes(&self) -> u64 {
        self.matching(|key| key.verb.is_write())
    }

    /// Write requests made by `client` (matched against the user agent's product, e.g. `gpu-operator`).
    pub fn writes_by(&self, client: &str) -> u64 {
        self.matching(|key| key.verb.is_write() && client_matches(&key.client, client))
    }

    /// Requests made by `client`.
    pub fn by_client(&self, client: &str) -> u64 {
        self.matching(|key| client_matches(&key.client, client))
    }

    /// Every counter.
    pub fn iter(&self) -> impl Iterator<Item = (&RequestKey, u64)> {
        self.entries.iter().map(|(key, n)| (key, *n))
    }

    /// What happened between `earlier` and this snapshot.
    #[must_use]
    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        let entries = self
            .entries
            .iter()
            .map(|(key, n)| {
                (
                    key.clone(),
                    n - earlier.entries.get(key).copied().unwrap_or(0).min(*n),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        RequestCounts { entries }
    }

    /// The Prometheus text exposition of `apiserver_request_total`.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::from(
            "# HELP apiserver_request_total Counter of apiserver requests broken out for each verb, group, \
             version, resource, subresource, scope, response code and client.\n\
             # TYPE apiserver_request_total counter\n",
        );
        for (key, n) in &self.entries {
            let _ = writeln!(
                out,
                "apiserver_request_total{{verb=\"{}\",group=\"{}\",version=\"{}\",resource=\"{}\",subresource=\"{}\",\
                 scope=\"{}\",code=\"{}\",client=\"{}\"}} {n}",
                key.verb,
                escape(&key.group),
                escape(&key.version),
                escape(&key.resource),
                escape(&key.subresource),
                escape(&key.scope),
                key.code,
                escape(&key.client)
            );
        }
        out
    }
}

pub(crate) fn client_matches(recorded: &str, wanted: &str) -> bool {
    recorded == wanted || recorded.split('/').next() == Some(wanted)
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One write request, as the server answered it (see [`Builder::record_writes`](crate::Builder::record_writes)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    /// Its place among the answered writes, from 0: a write with a higher number was answered later, so
    /// whatever it changed was changed after everything a lower-numbered write changed.
    pub sequence: u64,
    /// The client, as [`RequestKey::client`].
    pub client: String,
    /// The verb.
    pub verb: Verb,
    /// Plural resource.
    pub resource: String,
    /// Subresource, or "".
    pub subresource: String,
    /// The object's namespace, if the path named one.
    pub namespace: Option<String>,
    /// The object's name, if the path named one (a create names it in its body).
    pub name: Option<String>,
    /// The HTTP status code answered.
    pub code: u16,
}

impl WriteRecord {
    /// Whether the request was made by `client` (matched as [`RequestCounts::writes_by`] matches it).
    pub fn by(&self, client: &str) -> bool {
        client_matches(&self.client, client)
    }
}

/// The live counters, shared by the router and the in-process handle; and, when asked for, every write in
/// the order answered.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestLog {
    counts: Arc<Mutex<BTreeMap<RequestKey, u64>>>,
    writes: Option<Arc<Mutex<Vec<WriteRecord>>>>,
}

impl RequestLog {
    /// Counters that also keep every write.
    pub(crate) fn recording_writes() -> Self {
        Self {
            writes: Some(Arc::default()),
            ..Self::default()
        }
    }

    /// Keeps a write of the object `namespace`/`name` if writes are recorded; call before
    /// [`RequestLog::record`], once the request is answered.
    pub(crate) fn record_write(&self, key: &RequestKey, namespace: Option<&str>, name: Option<&str>) {
        let Some(writes) = &self.writes else { return };
        if !key.verb.is_write() {
            return;
        }
        let mut writes = writes.lock().unwrap_or_else(PoisonError::into_inner);
        let sequence = writes.len() as u64;
        writes.push(WriteRecord {
            sequence,
            client: key.client.clone(),
            verb: key.verb,
            resource: key.resource.clone(),
            subresource: key.subresource.clone(),
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            code: key.code,
        });
    }

    /// The writes recorded so far, in the order answered.
    pub(crate) fn writes(&self) -> Vec<WriteRecord> {
        self.writes
            .as_ref()
            .map(|writes| writes.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .unwrap_or_default()
    }

    pub(crate) fn record(&self, key: RequestKey) {
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    pub(crate) fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            entries: self.counts.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        }
    }

    pub(crate) fn reset(&self) {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).clear();
        if let Some(writes) = &self.writes {
            writes.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }
}

/// The client label for a `User-Agent`: its first word, e.g. `kubectl/v1.32.4`.
pub(crate) fn client_label(user_agent: Option<&str>) -> String {
    user_agent
        .and_then(|agent| agent.split_whitespace().next())
        .filter(|agent| !agent.is_empty())
        .unwrap_or("unknown")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(verb: Verb, resource: &str, code: u16, client: &str) -> RequestKey {
        RequestKey {
            verb,
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: String::new(),
            scope: "resource".into(),
            code,
            client: client.into(),
        }
    }

    #[test]
    fn counts_by_verb_resource_and_client() {
        let log = RequestLog::default();
        log.record(key(Verb::Patch, "nodes", 200, "gpu-operator/0.1.0"));
        log.record(key(Verb::Patch, "nodes", 200, "gpu-operator/0.1.0"));
        log.record(key(Verb::List, "nodes", 200, "kubectl/v1.32.4"));
        let before = log.snapshot();
        log.record(key(Verb::Apply, "daemonsets", 409, "gpu-operator/0.1.0"));
        let counts = log.snapshot();
        assert_eq!(counts.count(Verb::Patch, "nodes"), 2);
        assert_eq!(counts.writes(), 3);
        assert_eq!(counts.writes_by("gpu-operator"), 3);
        assert_eq!(counts.by_client("kubectl"), 1);
        assert_eq!(counts.since(&before).total(), 1);
        let text = counts.to_prometheus();
        assert!(text.contains(
            r#"apiserver_request_total{verb="APPLY",group="",version="v1",resource="daemonsets",subresource="",scope="resource",code="409",client="gpu-operator/0.1.0"} 1"#
        ), "{text}");
    }

    #[test]
    fn writes_are_kept_in_the_order_answered_only_when_asked_for() {
        let counted = RequestLog::default();
        counted.record_write(&key(Verb::Patch, "nodes", 200, "a/1"), None, Some("n1"));
        assert!(counted.writes().is_empty(), "not recorded unless asked for");
        let log = RequestLog::recording_writes();
        log.record_write(
            &key(Verb::Update, "leases", 200, "a/1"),
            Some("ns"),
            Some("lease"),
        );
        log.record_write(&key(Verb::Get, "leases", 200, "b/1"), Some("ns"), Some("lease"));
        log.record_write(&key(Verb::Patch, "nodes", 409, "b/1"), None, Some("n1"));
        let writes = log.writes();
        assert_eq!(writes.len(), 2, "reads are not writes: {writes:?}");
        assert_eq!((writes[0].sequence, writes[1].sequence), (0, 1));
        assert!(writes[0].by("a") && !writes[0].by("b"));
        assert_eq!(writes[0].namespace.as_deref(), Some("ns"));
        assert_eq!((writes[1].name.as_deref(), writes[1].code), (Some("n1"), 409));
        log.reset();
        assert!(log.writes().is_empty());
    }

    #[test]
    fn the_client_is_the_user_agents_first_word() {
        assert_eq!(
            client_label(Some("kubectl/v1.32.4 (linux/amd64) kubernetes/abc")),
            "kubectl/v1.32.4"
        );
        assert_eq!(client_label(None), "unknown");
        assert_eq!(Verb::parse("patch"), Some(Verb::Patch));
        assert_eq!(Verb::parse("POST"), Some(Verb::Create));
    }
}
