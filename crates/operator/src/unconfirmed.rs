//! The one record of writes this replica made that the caches may not show yet.
//!
//! A write is answered long before its watch event arrives; until then the caches still hold the object as
//! it was, and a decision made from them would send the same write again. Each controller keeps its own
//! [`Unconfirmed`] (no lock is shared between the loops): the reconciler its applies, deletions and status
//! writes, the labeller its node patches, the upgrade controller its node patches, driver pod deletions and
//! evictions. A write is trusted for a window ([`IN_FLIGHT`] unless said otherwise) and then made again if
//! the caches still do not show it; a write the caches show is forgotten at once ([`Unconfirmed::settle`]).

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a write the caches have not shown yet is trusted before it is made again.
pub const IN_FLIGHT: Duration = Duration::from_secs(10);

/// The time as the records count it: tokio's clock (paused in tests), as a std `Instant`.
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Writes made, by the object they went to, each with when it was answered.
#[derive(Debug)]
pub struct Unconfirmed<K, W> {
    trust: Duration,
    entries: BTreeMap<K, (W, Instant)>,
}

impl<K: Ord, W> Default for Unconfirmed<K, W> {
    fn default() -> Self {
        Self::new(IN_FLIGHT)
    }
}

impl<K: Ord, W> Unconfirmed<K, W> {
    /// An empty record whose writes are trusted for `trust`.
    pub fn new(trust: Duration) -> Self {
        Self {
            trust,
            entries: BTreeMap::new(),
        }
    }

    /// Records `write` to `key`, answered at `at`; it replaces an earlier one to the same object.
    pub fn record(&mut self, key: K, write: W, at: Instant) {
        self.entries.insert(key, (write, at));
    }

    /// The write to `key` still trusted at `now`.
    pub fn trusted<Q: Ord + ?Sized>(&self, key: &Q, now: Instant) -> Option<&W>
    where
        K: Borrow<Q>,
    {
        self.entries
            .get(key)
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.trust)
            .map(|(write, _)| write)
    }

    /// The last write to `key` and when, trusted or not.
    pub fn last<Q: Ord + ?Sized>(&self, key: &Q) -> Option<(&W, Instant)>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key).map(|(write, at)| (write, *at))
    }

    /// Forgets the writes whose trust ended by `now`, and those `shown` says the caches show; returns the
    /// keys forgotten.
    pub fn settle(&mut self, now: Instant, mut shown: impl FnMut(&K, &W) -> bool) -> Vec<K>
    where
        K: Clone,
    {
        let trust = self.trust;
        let mut forgotten = Vec::new();
        self.entries.retain(|key, (write, at)| {
            let keep = now.saturating_duration_since(*at) < trust && !shown(key, write);
            if !keep {
                forgotten.push(key.clone());
            }
            keep
        });
        forgotten
    }

    /// Takes the write to `key` out of the record.
    pub fn take<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<(W, Instant)>
    where
        K: Borrow<Q>,
    {
        self.entries.remove(key)
    }

    /// Forgets every write: this replica stopped leading, and its writes may have been refused.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The objects written to, in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_trusted_for_its_window_and_no_longer() {
        let t0 = Instant::now();
        let mut record: Unconfirmed<&str, u32> = Unconfirmed::default();
        record.record("node-a", 1, t0);
        assert_eq!(record.trusted(&"node-a", t0), Some(&1));
        assert_eq!(
            record.trusted(&"node-a", t0 + IN_FLIGHT - Duration::from_millis(1)),
            Some(&1)
        );
        assert_eq!(record.trusted(&"node-a", t0 + IN_FLIGHT), None);
        assert_eq!(record.trusted(&"node-b", t0), None);
        // The last write stays readable after its trust ended, until it is settled.
        assert_eq!(record.last(&"node-a"), Some((&1, t0)));
    }

    #[test]
    fn a_later_write_replaces_the_earlier_and_restarts_the_trust() {
        let t0 = Instant::now();
        let mut record: Unconfirmed<&str, u32> = Unconfirmed::new(Duration::from_secs(2));
        record.record("node-a", 1, t0);
        record.record("node-a", 2, t0 + Duration::from_secs(1));
        assert_eq!(
            record.trusted(&"node-a", t0 + Duration::from_millis(2500)),
            Some(&2)
        );
    }

    #[test]
    fn settling_forgets_what_expired_and_what_the_caches_show() {
        let t0 = Instant::now();
        let mut record: Unconfirmed<&str, u32> = Unconfirmed::default();
        record.record("old", 1, t0);
        record.record("shown", 2, t0 + Duration::from_secs(5));
        record.record("pending", 3, t0 + Duration::from_secs(5));
        let forgotten = record.settle(t0 + IN_FLIGHT, |key, _| *key == "shown");
        assert_eq!(forgotten, vec!["old", "shown"]);
        assert_eq!(record.keys().copied().collect::<Vec<_>>(), vec!["pending"]);
        assert_eq!(record.take(&"pending"), Some((3, t0 + Duration::from_secs(5))));
        record.record("again", 4, t0);
        record.clear();
        assert_eq!(record.keys().count(), 0);
    }
}
