//! Every request counted by verb, resource, response code and client, readable in-process
//! ([`RequestCounts`]) and served as `apiserver_request_total` on the server's `/metrics`, so tests and
//! benchmarks can assert exactly how many writes a client made.
//!
//! On request ([`Builder::journal`](crate::Builder::journal)) the server also keeps a journal: each request
//! with its object, when it arrived and when it was answered, and the listener it came through
//! ([`FakeServer::serve_as`](crate::FakeServer::serve_as)), so that a test can tell apart two processes
//! that send the same `User-Agent` and order their writes in time.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

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

/// Counts requests one by one: how another backend's requests (a real API server's audit log) are compared
/// with the fake server's.
impl FromIterator<RequestKey> for RequestCounts {
    fn from_iter<I: IntoIterator<Item = RequestKey>>(keys: I) -> Self {
        let mut entries = BTreeMap::new();
        for key in keys {
            *entries.entry(key).or_insert(0) += 1;
        }
        Self { entries }
    }
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

/// The live counters, shared by the router and the in-process handle.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestLog(Arc<Mutex<BTreeMap<RequestKey, u64>>>);

impl RequestLog {
    pub(crate) fn record(&self, key: RequestKey) {
        *self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default() += 1;
    }

    pub(crate) fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            entries: self.0.lock().unwrap_or_else(PoisonError::into_inner).clone(),
        }
    }

    pub(crate) fn reset(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// One request as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    /// When the server received it (before any injected latency).
    pub started: Instant,
    /// When the server answered it.
    pub finished: Instant,
    /// What it was, its answer's code and its client.
    pub key: RequestKey,
    /// The namespace in its path, or "".
    pub namespace: String,
    /// The object name in its path, or "" for a collection.
    pub name: String,
    /// The name of the listener it came through ([`FakeServer::serve_as`](crate::FakeServer::serve_as)),
    /// or "" (in-process clients and untagged listeners).
    pub listener: String,
}

impl JournalEntry {
    /// Whether the request was made by `client`, matched as [`RequestCounts::writes_by`] matches it.
    pub fn by(&self, client: &str) -> bool {
        client_matches(&self.key.client, client)
    }
}

/// The journal: the newest `capacity` requests, and how many older ones were let go.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    capacity: usize,
    entries: Mutex<VecDeque<JournalEntry>>,
    dropped: AtomicU64,
}

impl Journal {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    pub(crate) fn record(&self, entry: JournalEntry) {
        if !self.enabled() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity {
            entries.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        entries.push_back(entry);
    }

    /// The entries kept, oldest first, leaving them in place, and how many were let go unread.
    pub(crate) fn entries(&self) -> (Vec<JournalEntry>, u64) {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        (
            entries.iter().cloned().collect(),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    /// Every entry recorded since the last call, oldest first, and how many were let go unread.
    pub(crate) fn take(&self) -> (Vec<JournalEntry>, u64) {
        let entries = std::mem::take(&mut *self.entries.lock().unwrap_or_else(PoisonError::into_inner));
        (entries.into(), self.dropped.swap(0, Ordering::Relaxed))
    }
}

/// The name of the listener a request came through, put into its extensions by
/// [`FakeServer::serve_as`](crate::FakeServer::serve_as).
#[derive(Clone, Debug)]
pub(crate) struct ListenerName(pub(crate) Arc<str>);

/// The client label for a `User-Agent`: its first word, e.g. `kubectl/v1.32.4`.
pub fn client_label(user_agent: Option<&str>) -> String {
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
    fn the_journal_keeps_the_newest_entries_and_counts_the_rest() {
        let journal = Journal::new(2);
        let entry = |name: &str| JournalEntry {
            started: Instant::now(),
            finished: Instant::now(),
            key: key(Verb::Patch, "nodes", 200, "a"),
            namespace: String::new(),
            name: name.into(),
            listener: "replica-a".into(),
        };
        for name in ["n1", "n2", "n3"] {
            journal.record(entry(name));
        }
        let (entries, dropped) = journal.take();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["n2", "n3"]);
        assert_eq!(dropped, 1);
        assert_eq!(journal.take(), (Vec::new(), 0), "taken entries are gone");
        let off = Journal::default();
        off.record(entry("n1"));
        assert!(off.take().0.is_empty(), "a journal of capacity 0 keeps nothing");
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
