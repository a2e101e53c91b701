//! Compact projections of Nodes and Pods: what the operator's decisions read of them, and nothing else,
//! with the strings thousands of objects share (label keys and values, node names, owner uids, revision
//! hashes) interned. At 10,000 nodes the caches hold these instead of `k8s_openapi` objects.
//!
//! **What a node keeps** ([`NodeRecord::project`]): the labels a rule reads, and no other (a real node
//! carries a hundred or more NFD labels and dozens from its cloud provider). Those are: every `nvidia.com/`
//! label (the labeller's, GPU feature discovery's, the upgrade state machine's) but GFD's timestamp
//! ([`GFD_TIMESTAMP`]); NFD's NVIDIA PCI, OS and
//! kernel labels (GPU detection, the facts); the labels the node's own record of what the labeller wrote
//! names (the labeller may remove those); and every key named by [`NodeKeys`]: the selectors of the rendered
//! pod templates, of the NVIDIADrivers and of `--gpu-node-selector`, which the caches are told of before
//! any decision uses them ([`crate::caches::NodeCache::covers`]). Also whether it carries any NFD label at
//! all (the census); the `nvidia.com/` annotations (the labeller's record of what it owns, the
//! upgrade controller's); taints, cordon, Ready; the container runtime. The resourceVersion is kept beside
//! the record ([`crate::caches::NodeCache::resource_version`]), so that a new version that changes nothing
//! kept leaves the record, and every judgement made of it, as it was.
//!
//! **What a pod keeps** ([`PodRecord::project`]): name, node, its DaemonSet owner's uid, its revision hash,
//! `app` and component labels (these four as one [`PodKind`] shared by the pods of a revision), readiness
//! and since when, deletion; of driver pods the highest restart
//! count and the `DRIVER_CONFIG_DIGEST` its containers run with.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use gpuop_api::labels::{
    COMPONENT, GFD_TIMESTAMP, GpuDetection, NFD_KERNEL_VERSION, NFD_NVIDIA_PCI, NFD_OS_ID, NFD_OS_VERSION,
    NFD_OS_VERSION_MAJOR, NFD_OSTREE_VERSION, NFD_PREFIX, NVIDIA_PREFIX, OWNED_LABELS,
};
use gpuop_api::read::{Labels, NodeRead, PodRead};
use gpuop_api::upgrade::observe::{REVISION_HASH, is_driver_pod};
use k8s_openapi::api::core::v1::{Node, Taint};

mod wire;
pub(crate) use wire::Str;

pub use wire::{WatchedNode, WatchedPod};

/// A shared string.
pub type Text = Arc<str>;

/// One copy of each string the projections share, and of each label table and pod kind (the nodes of a
/// pool carry the same kept labels; the pods of one DaemonSet revision the same owner, revision and app).
/// What no projection holds any more is dropped when its set has doubled since the last sweep.
#[derive(Debug, Default)]
pub struct Interner {
    strings: Shared<str>,
    tables: Shared<[(Text, Text)]>,
    kinds: Shared<PodKind>,
    /// Taint lists by their JSON (`Taint` has no `Hash`): the GPU nodes of a fleet carry the same few.
    taints: HashMap<String, Arc<[Taint]>>,
    taints_swept_at: usize,
}

/// One interned set.
#[derive(Debug)]
struct Shared<T: ?Sized> {
    items: HashSet<Arc<T>>,
    swept_at: usize,
}

impl<T: ?Sized> Default for Shared<T> {
    fn default() -> Self {
        Self {
            items: HashSet::new(),
            swept_at: 0,
        }
    }
}

impl<T: ?Sized + Eq + std::hash::Hash> Shared<T> {
    fn get(&mut self, item: &T, make: impl FnOnce(&T) -> Arc<T>) -> Arc<T> {
        if let Some(shared) = self.items.get(item) {
            return shared.clone();
        }
        if self.items.len() >= 2 * self.swept_at.max(1024) {
            self.items.retain(|s| Arc::strong_count(s) > 1);
            self.swept_at = self.items.len();
        }
        let shared = make(item);
        self.items.insert(shared.clone());
        shared
    }
}

impl Interner {
    /// The shared copy of `text`.
    pub fn intern(&mut self, text: &str) -> Text {
        self.strings.get(text, |text| Arc::from(text))
    }

    fn intern_table(&mut self, pairs: &[(Text, Text)]) -> Arc<[(Text, Text)]> {
        self.tables.get(pairs, |pairs| Arc::from(pairs))
    }

    fn intern_taints(&mut self, taints: &[Taint]) -> Arc<[Taint]> {
        // JSON names every field of every taint unambiguously.
        let Ok(key) = serde_json::to_string(taints) else {
            return Arc::from(taints);
        };
        if let Some(shared) = self.taints.get(&key) {
            return shared.clone();
        }
        if self.taints.len() >= 2 * self.taints_swept_at.max(64) {
            self.taints.retain(|_, shared| Arc::strong_count(shared) > 1);
            self.taints_swept_at = self.taints.len();
        }
        let shared: Arc<[Taint]> = Arc::from(taints);
        self.taints.insert(key, shared.clone());
        shared
    }

    fn intern_kind(&mut self, kind: &PodKind) -> Arc<PodKind> {
        self.kinds.get(kind, |kind| Arc::new(kind.clone()))
    }

    /// How many strings it holds.
    pub fn len(&self) -> usize {
        self.strings.items.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.strings.items.is_empty()
    }
}

/// The label keys (beyond the ones every node keeps: [`always_kept`]) that a selector the operator
/// evaluates reads: the selectors and affinities of the rendered pod templates, the NVIDIADrivers' node
/// selectors, GPU detection's selector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeKeys(BTreeSet<String>);

impl NodeKeys {
    /// The keys GPU detection reads.
    pub fn of_detection(detection: &GpuDetection) -> Self {
        let mut keys = Self::default();
        keys.extend(detection.keys());
        keys
    }

    /// Adds keys (those every node keeps are not recorded).
    pub fn extend<'a>(&mut self, keys: impl IntoIterator<Item = &'a str>) {
        for key in keys {
            if !always_kept(key) && !self.0.contains(key) {
                self.0.insert(key.to_owned());
            }
        }
    }

    /// Adds the keys a pod spec's node selector and required node affinity read.
    pub fn extend_from_pod_spec(&mut self, spec: &k8s_openapi::api::core::v1::PodSpec) {
        self.extend(spec.node_selector.iter().flatten().map(|(key, _)| key.as_str()));
        let terms = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        for term in terms {
            self.extend(term.match_expressions.iter().flatten().map(|r| r.key.as_str()));
        }
    }

    /// Whether every key of `other` is one of these.
    pub fn covers(&self, other: &NodeKeys) -> bool {
        other.0.is_subset(&self.0)
    }

    /// Both sets together.
    #[must_use]
    pub fn union(&self, other: &NodeKeys) -> NodeKeys {
        NodeKeys(self.0.union(&other.0).cloned().collect())
    }

    fn keeps(&self, key: &str) -> bool {
        always_kept(key) || self.0.contains(key)
    }
}

/// Label keys the operator's own rules read on any node: NVIDIA's (`nvidia.com/`: the labeller's deploy
/// switches, GPU feature discovery's MIG and product labels, the upgrade state) but for GPU feature
/// discovery's [`GFD_TIMESTAMP`], and NFD's NVIDIA PCI detection, OS release and kernel (driver pools,
/// precompiled drivers).
pub fn always_kept(key: &str) -> bool {
    (key.starts_with(NVIDIA_PREFIX) && key != GFD_TIMESTAMP)
        || NFD_NVIDIA_PCI.contains(&key)
        || [
            NFD_KERNEL_VERSION,
            NFD_OS_ID,
            NFD_OS_VERSION,
            NFD_OS_VERSION_MAJOR,
            NFD_OSTREE_VERSION,
        ]
        .contains(&key)
}

/// A table of labels (or annotations), sorted by key, keys and values shared, and the table itself shared
/// by every node that keeps the same ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelTable(Arc<[(Text, Text)]>);

impl LabelTable {
    /// `pairs` come sorted by key, each key once (a map's, or a [`WatchedNode`]'s).
    fn project<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        keep: impl Fn(&str) -> bool,
        interner: &mut Interner,
    ) -> Self {
        let kept: Vec<(Text, Text)> = pairs
            .into_iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| (interner.intern(k), interner.intern(v)))
            .collect();
        Self(interner.intern_table(&kept))
    }

    /// How many it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Where the shared table lies: equal tables are one (interned), so while a copy is held, equal
    /// addresses mean equal tables.
    pub fn address(&self) -> usize {
        Arc::as_ptr(&self.0).cast::<()>().addr()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A value, shared.
    pub fn shared(&self, key: &str) -> Option<Text> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| self.0[i].1.clone())
    }

    /// The table as a map, for code that needs one.
    pub fn to_map(&self) -> std::collections::BTreeMap<String, String> {
        self.each_label()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

impl Labels for LabelTable {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    fn each_label(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }
}

/// A Node as the operator keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    /// `metadata.name`.
    pub name: Text,
    /// `metadata.uid` (events name the node by it).
    pub uid: Option<Box<str>>,
    /// The labels kept (see the module's doc).
    pub labels: LabelTable,
    /// The `nvidia.com/` annotations.
    pub annotations: LabelTable,
    /// Whether the node carries any NFD label (kept or not).
    pub nfd_labels: bool,
    /// `spec.taints` (one list shared by the nodes that carry the same).
    pub taints: Arc<[Taint]>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Its Ready condition is True.
    pub ready: bool,
    /// `status.nodeInfo.containerRuntimeVersion`.
    pub runtime_version: Option<Text>,
}

/// What [`NodeRecord::project`] reads of a node, beyond [`NodeRead`]: a whole `Node` (one the operator
/// read or wrote through the API) or a [`WatchedNode`] (the node watch's lean decoding) answer alike.
pub trait NodeFields: NodeRead {
    /// `metadata.uid`.
    fn uid(&self) -> Option<&str>;
    /// Every label.
    fn each_label(&self) -> impl Iterator<Item = (&str, &str)>;
    /// The annotations (at least the `nvidia.com/` ones).
    fn each_annotation(&self) -> impl Iterator<Item = (&str, &str)>;
    /// `status.nodeInfo.containerRuntimeVersion`.
    fn runtime_version(&self) -> Option<&str>;
}

impl NodeFields for Node {
    fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    fn each_label(&self) -> impl Iterator<Item = (&str, &str)> {
        borrowed_pairs(self.metadata.labels.as_ref())
    }

    fn each_annotation(&self) -> impl Iterator<Item = (&str, &str)> {
        borrowed_pairs(self.metadata.annotations.as_ref())
    }

    fn runtime_version(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.container_runtime_version.as_str())
    }
}

/// The `(key, value)` pairs of a label or annotation map that may be absent.
fn borrowed_pairs(map: Option<&BTreeMap<String, String>>) -> impl Iterator<Item = (&str, &str)> {
    map.into_iter().flatten().map(|(k, v)| (k.as_str(), v.as_str()))
}

impl NodeRecord {
    /// The projection of `node`, keeping the NFD labels `keys` names.
    pub fn project(node: &impl NodeFields, keys: &NodeKeys, interner: &mut Interner) -> Self {
        // The labeller removes or rewrites a label its record names, whatever the key.
        let owned: Vec<&str> = node
            .annotation(OWNED_LABELS)
            .map(|pairs| {
                pairs
                    .split(',')
                    .filter_map(|pair| pair.split_once('=').map(|(key, _)| key))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            name: interner.intern(NodeRead::name(node)),
            uid: node.uid().map(Box::from),
            labels: LabelTable::project(
                node.each_label(),
                |key| keys.keeps(key) || owned.contains(&key),
                interner,
            ),
            annotations: LabelTable::project(
                node.each_annotation(),
                |key| key.starts_with(NVIDIA_PREFIX),
                interner,
            ),
            nfd_labels: node.each_label().any(|(key, _)| key.starts_with(NFD_PREFIX)),
            taints: interner.intern_taints(node.taints()),
            unschedulable: node.unschedulable(),
            ready: node.ready(),
            runtime_version: node.runtime_version().map(|v| interner.intern(v)),
        }
    }
}

impl NodeRead for NodeRecord {
    fn name(&self) -> &str {
        &self.name
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get_label(key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get_label(key)
    }

    fn taints(&self) -> &[Taint] {
        &self.taints
    }

    fn unschedulable(&self) -> bool {
        self.unschedulable
    }

    fn ready(&self) -> bool {
        self.ready
    }
}

/// What a driver pod keeps beyond what every pod keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverFields {
    /// The highest restart count of its containers.
    pub restarts: i32,
    /// `DRIVER_CONFIG_DIGEST` in its containers' environment.
    pub digest: Option<Text>,
}

/// What a pod has in common with every pod of its DaemonSet's revision (one copy shared by all of them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodKind {
    /// Its DaemonSet's uid.
    pub daemonset_uid: Option<Text>,
    /// `controller-revision-hash`.
    pub revision: Option<Text>,
    /// Its `app` label (the validator's pods are told by it).
    pub app: Option<Text>,
    /// Its `app.kubernetes.io/component` label.
    pub component: Option<Text>,
}

/// A Pod as the operator keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    /// `metadata.name`.
    pub name: Text,
    /// `spec.nodeName`.
    pub node: Option<Text>,
    /// Its owner, revision and app, shared.
    pub kind: Arc<PodKind>,
    /// Since when it has been ready, while it runs and is ready.
    pub ready_since: Option<i64>,
    /// Being deleted.
    pub terminating: bool,
    /// Of driver pods.
    pub driver: Option<Box<DriverFields>>,
}

impl PodRecord {
    /// The projection of `pod`: a whole `Pod`, or a [`WatchedPod`] (the pod watch's lean decoding).
    pub fn project(pod: &(impl PodRead + ?Sized), interner: &mut Interner) -> Self {
        let driver = is_driver_pod(pod).then(|| {
            Box::new(DriverFields {
                restarts: pod.restarts(),
                digest: pod.driver_digest().map(|d| interner.intern(d)),
            })
        });
        let kind = PodKind {
            daemonset_uid: pod.daemonset_uid().map(|u| interner.intern(u)),
            revision: pod.label(REVISION_HASH).map(|r| interner.intern(r)),
            app: pod.label("app").map(|a| interner.intern(a)),
            component: pod.label(COMPONENT).map(|c| interner.intern(c)),
        };
        Self {
            name: Arc::from(PodRead::name(pod)),
            node: pod.node_name().map(|n| interner.intern(n)),
            kind: interner.intern_kind(&kind),
            ready_since: pod.ready_since(),
            terminating: pod.terminating(),
            driver,
        }
    }
}

impl PodRead for PodRecord {
    fn name(&self) -> &str {
        &self.name
    }

    fn node_name(&self) -> Option<&str> {
        self.node.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        match key {
            REVISION_HASH => self.kind.revision.as_deref(),
            "app" => self.kind.app.as_deref(),
            COMPONENT => self.kind.component.as_deref(),
            _ => None,
        }
    }

    fn terminating(&self) -> bool {
        self.terminating
    }

    fn ready_since(&self) -> Option<i64> {
        self.ready_since
    }

    fn daemonset_uid(&self) -> Option<&str> {
        self.kind.daemonset_uid.as_deref()
    }

    fn driver_digest(&self) -> Option<&str> {
        self.driver.as_ref()?.digest.as_deref()
    }

    fn restarts(&self) -> i32 {
        self.driver.as_ref().map_or(0, |d| d.restarts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn gpu_node(name: &str, timestamp: &str, cpu_flag: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.deploy.driver": "true",
                    GFD_TIMESTAMP: timestamp,
                    format!("feature.node.kubernetes.io/cpu-cpuid.{cpu_flag}"): "true",
                    "feature.node.kubernetes.io/pci-10de.present": "true",
                },
                "annotations": {"nvidia.com/gpu-driver-upgrade-enabled": "true"},
            },
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
        }))
        .expect("a node")
    }

    /// The nodes of a pool, which differ only in labels no rule reads (GFD's timestamp, NFD's CPU flags),
    /// hold one label table and one taint list between them; a selector that names the timestamp still gets it.
    #[test]
    fn nodes_that_differ_only_in_labels_no_rule_reads_share_one_table() {
        let mut interner = Interner::default();
        let keys = NodeKeys::default();
        let a = NodeRecord::project(&gpu_node("a", "1733000001", "AVX"), &keys, &mut interner);
        let b = NodeRecord::project(&gpu_node("b", "1733000002", "SSE4"), &keys, &mut interner);
        assert_eq!(a.label(GFD_TIMESTAMP), None);
        assert_eq!(a.label("nvidia.com/gpu.product"), Some("NVIDIA-H100-80GB-HBM3"));
        assert!(Arc::ptr_eq(&a.labels.0, &b.labels.0), "one label table");
        assert!(
            Arc::ptr_eq(&a.annotations.0, &b.annotations.0),
            "one annotation table"
        );
        assert!(Arc::ptr_eq(&a.taints, &b.taints), "one taint list");
        assert_eq!(a.taints[0].key, "nvidia.com/gpu");

        let mut named = NodeKeys::default();
        named.extend([GFD_TIMESTAMP]);
        let c = NodeRecord::project(&gpu_node("c", "1733000003", "AVX"), &named, &mut interner);
        assert_eq!(c.label(GFD_TIMESTAMP), Some("1733000003"));
    }

    fn operand_pod(name: &str, node: &str, revision: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": {"app": "nvidia-device-plugin-daemonset", REVISION_HASH: revision},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "plugin",
                                     "uid": "ds-1", "controller": true}],
            },
            "spec": {"nodeName": node, "containers": []},
        }))
        .expect("a pod")
    }

    /// The pods of one DaemonSet revision hold one copy of their owner, revision and app; a pod of the next
    /// revision has its own, and reads its own revision.
    #[test]
    fn pods_of_one_revision_share_their_kind() {
        let mut interner = Interner::default();
        let a = PodRecord::project(&operand_pod("p-a", "a", "r1"), &mut interner);
        let b = PodRecord::project(&operand_pod("p-b", "b", "r1"), &mut interner);
        let c = PodRecord::project(&operand_pod("p-c", "c", "r2"), &mut interner);
        assert!(Arc::ptr_eq(&a.kind, &b.kind));
        assert_eq!(b.daemonset_uid(), Some("ds-1"));
        assert_eq!(b.node_name(), Some("b"));
        assert_eq!(c.label(REVISION_HASH), Some("r2"));
        assert_eq!(a.label(REVISION_HASH), Some("r1"));
    }
}
