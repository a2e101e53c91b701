//! Which records of a cache changed since a reader last looked, so that a reader's work follows what
//! changed, not how many records there are.
//!
//! A [`ChangeLog`] numbers every change of a cache (a record replaced, added or removed) and keeps, per
//! name, only its latest number. A reader keeps the number it last read up to (its mark) and asks for what
//! changed since: the names, in O(changed), or [`Changed::All`] when the whole table was replaced (a relist)
//! after its mark. Reading does not consume anything, so any number of readers can follow one log, and a
//! reader that gives up mid-way simply asks again from its old mark.
//!
//! [`NodeSet`] and [`PodSet`] are the records of the node and pod caches with their logs; readers see them
//! through [`NodeSource`] and [`PodSource`], which the caches implement too (taking their lock per call).

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::projection::{NodeRecord, PodRecord, Text};

/// The nodes as a reader of changes sees them.
pub trait NodeSource {
    /// The mark of now, and what changed after `mark`.
    fn changes(&self, mark: u64) -> (u64, Changed);
    /// A node by name.
    fn node(&self, name: &str) -> Option<Arc<NodeRecord>>;
    /// Every node.
    fn nodes(&self) -> Vec<Arc<NodeRecord>>;
}

/// The pods as a reader of changes sees them: by node.
pub trait PodSource {
    /// The mark of now, and the nodes whose pods changed after `mark` (a pod added, replaced or removed
    /// there, or moved away).
    fn changes(&self, mark: u64) -> (u64, Changed);
    /// The pods on a node.
    fn on_node(&self, node: &str) -> Vec<Arc<PodRecord>>;
}

/// Nodes by name, with the log of their changes.
#[derive(Debug, Default)]
pub struct NodeSet {
    records: HashSet<ByName<Arc<NodeRecord>>>,
    log: ChangeLog,
}

impl NodeSet {
    /// Takes in a node's record; an equal one already there is kept (and nothing is logged). Says whether
    /// the record changed.
    pub fn put(&mut self, record: NodeRecord) -> bool {
        if self.get(&record.name).is_some_and(|old| **old == record) {
            return false;
        }
        self.log.changed(&record.name);
        self.records.replace(ByName(Arc::new(record)));
        true
    }

    /// Removes a node; says whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        match self.records.take(name) {
            Some(ByName(record)) => {
                self.log.changed(&record.name);
                true
            }
            None => false,
        }
    }

    /// Replaces every record (a relist).
    pub fn replace_all(&mut self, records: HashMap<Text, Arc<NodeRecord>>) {
        self.records = records.into_values().map(ByName).collect();
        self.log.replaced();
    }

    /// A node by name.
    pub fn get(&self, name: &str) -> Option<&Arc<NodeRecord>> {
        self.records.get(name).map(|record| &record.0)
    }

    /// Every node.
    pub fn values(&self) -> impl Iterator<Item = &Arc<NodeRecord>> {
        self.records.iter().map(|record| &record.0)
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl FromIterator<Arc<NodeRecord>> for NodeSet {
    fn from_iter<I: IntoIterator<Item = Arc<NodeRecord>>>(records: I) -> Self {
        let mut set = Self::default();
        set.replace_all(records.into_iter().map(|r| (r.name.clone(), r)).collect());
        set
    }
}

impl NodeSource for NodeSet {
    fn changes(&self, mark: u64) -> (u64, Changed) {
        (self.log.mark(), self.log.since(mark))
    }

    fn node(&self, name: &str) -> Option<Arc<NodeRecord>> {
        self.get(name).cloned()
    }

    fn nodes(&self) -> Vec<Arc<NodeRecord>> {
        self.values().cloned().collect()
    }
}

/// Pods by name and by node, with the log of the nodes whose pods changed.
#[derive(Debug, Default)]
pub struct PodSet {
    records: HashSet<ByName<Arc<PodRecord>>>,
    by_node: HashMap<Text, Vec<Arc<PodRecord>>>,
    log: ChangeLog,
}

impl PodSet {
    /// Takes in a pod's record; an equal one already there is kept (and nothing is logged). Returns the
    /// record now kept when it changed.
    pub fn put(&mut self, record: PodRecord) -> Option<Arc<PodRecord>> {
        if self.get(&record.name).is_some_and(|old| **old == record) {
            return None;
        }
        let record = Arc::new(record);
        self.unlink(&record.name);
        if let Some(node) = &record.node {
            self.by_node.entry(node.clone()).or_default().push(record.clone());
            self.log.changed(node);
        }
        self.records.replace(ByName(record.clone()));
        Some(record)
    }

    /// Removes a pod; returns its record when it was there.
    pub fn remove(&mut self, name: &str) -> Option<Arc<PodRecord>> {
        let removed = self.unlink(name);
        self.records.remove(name);
        removed
    }

    /// Takes a pod's record out of its node's list (logging the node); returns it.
    fn unlink(&mut self, name: &str) -> Option<Arc<PodRecord>> {
        let old = self.get(name)?.clone();
        if let Some(node) = &old.node {
            if let Some(pods) = self.by_node.get_mut(node) {
                pods.retain(|pod| *pod.name != *name);
                if pods.is_empty() {
                    self.by_node.remove(node);
                }
            }
            self.log.changed(node);
        }
        Some(old)
    }

    /// Replaces every record (a relist).
    pub fn replace_all(&mut self, records: HashMap<Text, Arc<PodRecord>>) {
        self.by_node.clear();
        for record in records.values() {
            if let Some(node) = &record.node {
                self.by_node.entry(node.clone()).or_default().push(record.clone());
            }
        }
        self.records = records.into_values().map(ByName).collect();
        self.log.replaced();
    }

    /// A pod by name.
    pub fn get(&self, name: &str) -> Option<&Arc<PodRecord>> {
        self.records.get(name).map(|record| &record.0)
    }

    /// Every pod.
    pub fn values(&self) -> impl Iterator<Item = &Arc<PodRecord>> {
        self.records.iter().map(|record| &record.0)
    }
}

impl PodSource for PodSet {
    fn changes(&self, mark: u64) -> (u64, Changed) {
        (self.log.mark(), self.log.since(mark))
    }

    fn on_node(&self, node: &str) -> Vec<Arc<PodRecord>> {
        self.by_node.get(node).cloned().unwrap_or_default()
    }
}

/// A value in a set by its name, found by a `&str`: the name is not kept a second time as a key (16 bytes
/// a record, and a table's worth of slack, at 70,000 pods).
#[derive(Debug)]
pub struct ByName<T>(pub T);

/// What a value is found by in a set of [`ByName`].
pub trait Named {
    /// The name.
    fn name(&self) -> &str;
}

impl Named for NodeRecord {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for PodRecord {
    fn name(&self) -> &str {
        &self.name
    }
}

impl<T: Named> Named for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
}

impl<T: Named> Borrow<str> for ByName<T> {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

impl<T: Named> PartialEq for ByName<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl<T: Named> Eq for ByName<T> {}

impl<T: Named> Hash for ByName<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the `str` hashes, so that a `&str` finds it.
        self.0.name().hash(state);
    }
}

/// What changed since a mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Everything may have: the table was replaced after the mark (or the reader never looked).
    All,
    /// Only these names (records replaced, added or removed).
    Names(Vec<Text>),
}

/// The latest change of each name, numbered.
#[derive(Debug, Default)]
pub struct ChangeLog {
    /// The number of the latest change (0: none yet).
    last: u64,
    /// Marks up to this number predate the last replacement of the whole table.
    replaced_at: u64,
    by_number: BTreeMap<u64, Text>,
    by_name: HashMap<Text, u64>,
}

impl ChangeLog {
    /// Records a change of `name`.
    pub fn changed(&mut self, name: &Text) {
        self.last += 1;
        if let Some(earlier) = self.by_name.insert(name.clone(), self.last) {
            self.by_number.remove(&earlier);
        }
        self.by_number.insert(self.last, name.clone());
    }

    /// Records that the whole table was replaced: every reader starts over.
    pub fn replaced(&mut self) {
        self.last += 1;
        self.replaced_at = self.last;
        self.by_number.clear();
        self.by_name.clear();
    }

    /// The mark a reader that has seen everything up to now keeps.
    pub fn mark(&self) -> u64 {
        self.last
    }

    /// What changed after `mark` (a reader's first mark is 0: everything).
    pub fn since(&self, mark: u64) -> Changed {
        if mark < self.replaced_at || mark == 0 {
            return Changed::All;
        }
        Changed::Names(
            self.by_number
                .range(mark + 1..)
                .map(|(_, name)| name.clone())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(changed: Changed) -> Vec<String> {
        match changed {
            Changed::All => vec!["*".to_owned()],
            Changed::Names(names) => names.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn a_reader_hears_each_changed_name_once_in_the_order_of_its_latest_change() {
        let mut log = ChangeLog::default();
        let (a, b, c): (Text, Text, Text) = ("a".into(), "b".into(), "c".into());
        assert_eq!(
            log.since(0),
            Changed::All,
            "a reader that never looked reads everything"
        );
        log.changed(&a);
        let mark = log.mark();
        assert_eq!(names(log.since(mark)), Vec::<String>::new());
        log.changed(&b);
        log.changed(&c);
        log.changed(&b);
        assert_eq!(names(log.since(mark)), ["c", "b"]);
        // Another reader, further along, is not affected by the first one's reading.
        let later = log.mark();
        log.changed(&a);
        assert_eq!(names(log.since(later)), ["a"]);
        assert_eq!(names(log.since(mark)), ["c", "b", "a"]);
        // Only the latest change of a name is kept.
        assert_eq!(log.by_number.len(), 3);
    }

    #[test]
    fn a_replaced_table_is_everything_for_readers_from_before_and_nothing_after() {
        let mut log = ChangeLog::default();
        log.changed(&"a".into());
        let before = log.mark();
        log.replaced();
        assert_eq!(log.since(before), Changed::All);
        let after = log.mark();
        assert_eq!(log.since(after), Changed::Names(Vec::new()));
        log.changed(&"b".into());
        assert_eq!(names(log.since(after)), ["b"]);
        assert_eq!(log.since(before), Changed::All);
    }
}
