//! A watch as a stream of newline-delimited JSON events, the way the API server sends them:
//! synthetic `ADDED` events for the current state (or replayed history from a resource version), the
//! `k8s.io/initial-events-end` bookmark for `sendInitialEvents`, live events filtered by namespace and
//! selectors (an object that stops matching is reported `DELETED`, one that starts matching `ADDED`),
//! periodic bookmarks, an in-stream `ERROR` with code 410 for an expired version, and the end of the stream
//! at `timeoutSeconds`.
//!
//! Changes wait in `backlog` until they are due: at once, or a fixed time after they happened when a
//! [`crate::faults::Faults::delay_watch_events`] fault holds the resource back. A bookmark claims at most the
//! version just before the first change still waiting, so a client resuming from it misses nothing.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::time::Instant;

use crate::encode::{self, Projection};
use crate::faults::WatchDelay;
use crate::object::Stored;
use crate::registry::ResourceInfo;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Change, ChangeKind, WatchStart, selects};

/// What a watcher asked for, beyond where it starts.
#[derive(Debug)]
pub(crate) struct WatchSpec {
    pub(crate) info: Arc<ResourceInfo>,
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) bookmarks: bool,
    pub(crate) bookmark_interval: Duration,
    pub(crate) timeout: Duration,
    /// Fault injection: end the stream after this many object events.
    pub(crate) drop_after: Option<usize>,
    pub(crate) projection: Projection,
    pub(crate) committed: Arc<AtomicU64>,
    /// Fault injection: how long after a change its event is delivered.
    pub(crate) delay: WatchDelay,
    /// Changes when every open stream is to end ([`crate::FakeServer::drop_watches`]).
    pub(crate) drops: tokio::sync::watch::Receiver<u64>,
}

#[derive(Debug)]
struct Watcher {
    spec: WatchSpec,
    start: WatchStart,
    initial: std::vec::IntoIter<Arc<Stored>>,
    /// Changes taken from history or the live feed, not yet delivered, oldest first.
    backlog: VecDeque<Arc<Change>>,
    queued: VecDeque<Bytes>,
    /// The newest version delivered (or passed over by the filters); bookmarks claim no more.
    last: u64,
    /// The newest version taken into `backlog`, so a change is never taken twice.
    received: u64,
    sent: usize,
    deadline: Instant,
    next_bookmark: Instant,
    done: bool,
}

/// The event stream for a watch that starts at `start`.
pub(crate) fn stream(
    mut start: WatchStart,
    spec: WatchSpec,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let now = Instant::now();
    let initial = std::mem::take(&mut start.initial).into_iter();
    let backlog: VecDeque<Arc<Change>> = std::mem::take(&mut start.backlog).into();
    let received = backlog
        .back()
        .map_or(start.from, |c| c.resource_version().max(start.from));
    let watcher = Watcher {
        // `timeoutSeconds` comes from the client: a deadline past what the clock can hold is no deadline.
        deadline: now
            .checked_add(spec.timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600)),
        next_bookmark: now + spec.bookmark_interval,
        last: start.from,
        received,
        spec,
        start,
        initial,
        backlog,
        queued: VecDeque::new(),
        sent: 0,
        done: false,
    };
    futures::stream::unfold(watcher, |mut watcher| async move {
        let line = watcher.next_line().await?;
        Some((Ok(line), watcher))
    })
}

impl Watcher {
    fn passes(&self, stored: &Stored) -> bool {
        self.spec
            .namespace
            .as_deref()
            .is_none_or(|ns| stored.meta.namespace == ns)
            && selects(&self.spec.info, stored, &self.spec.labels, &self.spec.fields)
    }

    fn object_line(&self, kind: &str, stored: &Stored) -> Bytes {
        crate::store::event_line(
            kind,
            &encode::object_in_stream(&self.spec.info, stored, &self.spec.projection, self.sent == 0),
        )
    }

    /// The line a change gives this watcher, if any.
    fn change_line(&self, change: &Change) -> Option<Bytes> {
        let now = change.kind != ChangeKind::Deleted && self.passes(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.passes(p));
        let plain =
            self.spec.projection.is_full() && change.object.meta.api_version == self.spec.info.api_version();
        match (now, before) {
            (false, false) => None,
            (true, _) => {
                let kind = if before { "MODIFIED" } else { "ADDED" };
                if plain && kind == change.kind.as_str() {
                    Some(change.line().clone())
                } else {
                    Some(self.object_line(kind, &change.object))
                }
            }
            (false, true) if change.kind == ChangeKind::Deleted => {
                if plain {
                    Some(change.line().clone())
                } else {
                    Some(self.object_line("DELETED", &change.object))
                }
            }
            (false, true) => {
                // It stopped matching: DELETED with its previous content at this change's version.
                let previous = change.previous.as_ref()?;
                let mut value = previous.value();
                value["metadata"]["resourceVersion"] =
                    serde_json::Value::from(change.resource_version().to_string());
                let stored = Stored::new(&value, &self.spec.info);
                Some(self.object_line("DELETED", &stored))
            }
        }
    }

    fn count(&mut self, line: Bytes) -> Option<Bytes> {
        self.sent += 1;
        Some(line)
    }

    fn limit_reached(&self) -> bool {
        self.spec.drop_after.is_some_and(|limit| self.sent >= limit)
    }

    /// Takes a live change into the backlog unless it came already (from history).
    fn take(&mut self, change: Arc<Change>) {
        if change.resource_version() > self.received {
            self.received = change.resource_version();
            self.backlog.push_back(change);
        }
    }

    /// The first waiting change if it is due now; otherwise when it will be.
    fn due(&mut self) -> Result<Option<Arc<Change>>, Instant> {
        let Some(front) = self.backlog.front() else {
            return Ok(None);
        };
        // A delay too long to add (`Duration::MAX`, "never") keeps the change waiting; look again in a day.
        let Some(due) = front.at.checked_add(self.spec.delay.current()) else {
            return Err(Instant::now() + Duration::from_secs(24 * 3600));
        };
        if due > Instant::now() {
            return Err(due);
        }
        let change = self.backlog.pop_front();
        if let Some(change) = &change {
            self.last = self.last.max(change.resource_version());
        }
        Ok(change)
    }

    fn bookmark(&mut self) -> Bytes {
        // Everything up to `committed` has been handed to our receiver: take it first, so the bookmark
        // never claims a version whose events this watcher has not sent.
        let committed = self.spec.committed.load(Ordering::Acquire);
        let mut lagged = false;
        loop {
            match self.start.receiver.try_recv() {
                Ok(change) => self.take(change),
                Err(TryRecvError::Lagged(_)) => {
                    self.done = true;
                    lagged = true;
                    break;
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        while let Ok(Some(change)) = self.due() {
            if let Some(line) = self.change_line(&change) {
                self.queued.push_back(line);
            }
        }
        // A change still waiting (a delayed resource) caps the claim just below it.
        // After a lag the dropped changes were never sent: claim nothing beyond what was.
        let claim = match self.backlog.front() {
            _ if lagged => self.last,
            Some(next) => next.resource_version().saturating_sub(1),
            None => committed,
        };
        self.last = self.last.max(claim);
        encode::bookmark(
            &self.spec.info,
            self.last,
            false,
            &self.spec.projection,
            self.sent == 0,
        )
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.queued.pop_front() {
                if line.starts_with(b"{\"type\":\"BOOKMARK\"") {
                    return Some(line);
                }
                if self.limit_reached() {
                    return None;
                }
                return self.count(line);
            }
            if self.done || self.spec.drops.has_changed().unwrap_or(true) {
                return None;
            }
            if let Some(error) = self.start.expired.take() {
                self.done = true;
                return Some(encode::error_line(&error));
            }
            if self.limit_reached() {
                return None;
            }
            if let Some(object) = self.initial.next() {
                let line = self.object_line("ADDED", &object);
                return self.count(line);
            }
            if let Some(at) = self.start.initial_end.take() {
                return Some(encode::bookmark(
                    &self.spec.info,
                    at,
                    true,
                    &self.spec.projection,
                    self.sent == 0,
                ));
            }
            let waiting = match self.due() {
                Ok(Some(change)) => {
                    if let Some(line) = self.change_line(&change) {
                        return self.count(line);
                    }
                    continue;
                }
                Ok(None) => None,
                Err(due) => Some(due),
            };
            let bookmarks = self.spec.bookmarks;
            tokio::select! {
                () = tokio::time::sleep_until(self.deadline) => {
                    self.done = true;
                    return None;
                }
                _ = self.spec.drops.changed() => {
                    self.done = true;
                    return None;
                }
                () = tokio::time::sleep_until(self.next_bookmark), if bookmarks => {
                    self.next_bookmark = Instant::now() + self.spec.bookmark_interval;
                    let line = self.bookmark();
                    self.queued.push_back(line);
                }
                () = tokio::time::sleep_until(waiting.unwrap_or(self.deadline)), if waiting.is_some() => {}
                // While a change waits, newer ones stay in the channel: a watcher held back long enough
                // to fill it is closed like any slow watcher.
                received = self.start.receiver.recv(), if waiting.is_none() => match received {
                    Ok(change) => self.take(change),
                    // A watcher that cannot keep up is closed, as the API server does; the client
                    // resumes from its last version.
                    Err(RecvError::Lagged(_) | RecvError::Closed) => {
                        self.done = true;
                        return None;
                    }
                },
            }
        }
    }
}
