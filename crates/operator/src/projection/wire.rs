//! The node and pod watches' lean decoding: a Node or Pod is read from the API's JSON into [`WatchedNode`]
//! or [`WatchedPod`], which hold only what the projections ([`super::NodeRecord::project`],
//! [`super::PodRecord::project`]) read. Everything else (managed fields, images, addresses, capacity,
//! other conditions, volumes, container specs) is skipped as it is read, without being built: a Node of a
//! real fleet is ~20 KB of JSON, most of it managed fields and NFD labels, and the whole of it was decoded
//! into a `k8s_openapi` object for every watch event before the projection found it unchanged.
//!
//! A node's labels are kept as they were sent, in one buffer (two allocations, not two per label): which
//! of them the projection keeps depends on the cache's keys and on the node's own record of what the
//! labeller wrote, which the projection applies. Of its annotations only NVIDIA's are kept (the only ones a
//! rule reads). A pod keeps, of its containers' environment, only `DRIVER_CONFIG_DIGEST`.
//!
//! A field that is read but malformed is an error naming the kind, the object (once its name was read)
//! and the field's path: `Node gpu-0: spec.unschedulable: invalid type: string "yes", expected a boolean`.
//! Fields that are not read are not checked.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::marker::PhantomData;

use gpuop_api::driver::DRIVER_CONFIG_DIGEST;
use gpuop_api::labels::{COMPONENT, NVIDIA_PREFIX};
use gpuop_api::read::{NodeRead, PodRead};
use gpuop_api::upgrade::observe::REVISION_HASH;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::NodeFields;

/// A Node as the node watch decodes it (see the module's doc).
#[derive(Clone, Debug, Default)]
pub struct WatchedNode {
    /// Its name, uid and resourceVersion (what kube's watcher and the cache read).
    metadata: ObjectMeta,
    labels: Pairs,
    /// The `nvidia.com/` annotations.
    annotations: Pairs,
    taints: Vec<Taint>,
    unschedulable: bool,
    ready: bool,
    runtime_version: Option<String>,
}

/// A Pod as the pod watch decodes it: only what [`super::PodRecord::project`] reads, as it reads it.
#[derive(Clone, Debug, Default)]
pub struct WatchedPod {
    /// Its name, namespace and resourceVersion (what kube's watcher reads).
    metadata: ObjectMeta,
    node_name: Option<String>,
    revision: Option<String>,
    app: Option<String>,
    component: Option<String>,
    terminating: bool,
    ready_since: Option<i64>,
    daemonset_uid: Option<String>,
    digest: Option<String>,
    restarts: i32,
}

/// String pairs (labels, annotations) in one buffer, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Pairs {
    text: String,
    /// Each pair's key as `text[start..middle]`, its value as `text[middle..end]`.
    spans: Vec<(u32, u32, u32)>,
}

impl Pairs {
    fn each(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spans.iter().map(|&(start, middle, end)| {
            (
                self.text.get(start as usize..middle as usize).unwrap_or_default(),
                self.text.get(middle as usize..end as usize).unwrap_or_default(),
            )
        })
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.each().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Sorts by key; of a key sent twice, the last value is kept (as a map would).
    fn seal(&mut self) {
        let text = &self.text;
        let key = |&(start, middle, _): &(u32, u32, u32)| text.get(start as usize..middle as usize);
        if self.spans.windows(2).all(|pair| key(&pair[0]) < key(&pair[1])) {
            return;
        }
        self.spans.sort_by(|a, b| key(a).cmp(&key(b)));
        self.spans.dedup_by(|later, kept| {
            let same = key(later) == key(kept);
            if same {
                *kept = *later;
            }
            same
        });
    }
}

/// Reads a JSON object of strings into [`Pairs`], keeping the pairs whose key `keep` accepts (the others'
/// values are still checked to be strings).
struct PairsVisitor(fn(&str) -> bool);

impl<'de> Visitor<'de> for PairsVisitor {
    type Value = Pairs;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings to strings")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Pairs, E> {
        Ok(Pairs::default())
    }

    fn visit_none<E: de::Error>(self) -> Result<Pairs, E> {
        Ok(Pairs::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Pairs, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
        let mut pairs = Pairs::default();
        let span =
            |text: &String| u32::try_from(text.len()).map_err(|_| de::Error::custom("a map over 4 GiB"));
        loop {
            let start = span(&pairs.text)?;
            if map.next_key_seed(Append(&mut pairs.text))?.is_none() {
                break;
            }
            let middle = span(&pairs.text)?;
            let key = pairs.text.get(start as usize..).unwrap_or_default();
            if (self.0)(key) {
                let value = map.next_value_seed(Append(&mut pairs.text));
                let key = pairs
                    .text
                    .get(start as usize..middle as usize)
                    .unwrap_or_default();
                at(value, key)?;
                pairs.spans.push((start, middle, span(&pairs.text)?));
            } else {
                at(map.next_value::<Str<'de>>(), key)?;
                pairs.text.truncate(start as usize);
            }
        }
        pairs.seal();
        Ok(pairs)
    }
}

/// Appends a string to a buffer, without allocating one of its own.
struct Append<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Append<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        self.0.push_str(text);
        Ok(())
    }
}

fn every_key(_: &str) -> bool {
    true
}

fn nvidia_key(key: &str) -> bool {
    key.starts_with(NVIDIA_PREFIX)
}

/// Reads labels or annotations (null as none), keeping the pairs whose key it accepts.
struct PairsSeed(fn(&str) -> bool);

impl<'de> DeserializeSeed<'de> for PairsSeed {
    type Value = Pairs;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Pairs, D::Error> {
        deserializer.deserialize_option(PairsVisitor(self.0))
    }
}

/// What is read of an object's metadata.
trait Named {
    fn name(&self) -> Option<&str>;
}

#[derive(Default)]
struct NodeMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Pairs,
    annotations: Pairs,
}

impl<'de> Deserialize<'de> for NodeMeta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("node metadata"))
    }
}

impl<'de> FieldsOf<'de> for NodeMeta {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "name" => self.name = at(map.next_value::<Option<String>>(), "name")?,
            "uid" => self.uid = at(map.next_value::<Option<String>>(), "uid")?,
            "resourceVersion" => {
                self.resource_version = at(map.next_value::<Option<String>>(), "resourceVersion")?;
            }
            "labels" => {
                self.labels = at(map.next_value_seed(PairsSeed(every_key)), "labels")?;
            }
            "annotations" => {
                self.annotations = at(map.next_value_seed(PairsSeed(nvidia_key)), "annotations")?;
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl Named for NodeMeta {
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

#[derive(Deserialize)]
struct NodeSpec {
    taints: Option<Vec<Taint>>,
    unschedulable: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStatus {
    conditions: Option<Vec<Condition>>,
    node_info: Option<NodeInfo>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeInfo {
    container_runtime_version: String,
}

impl<'de> Deserialize<'de> for WatchedNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (meta, spec, status) = deserializer.deserialize_map(ObjectVisitor::<
            NodeMeta,
            PathTracked<NodeSpec>,
            PathTracked<NodeStatus>,
        >::new("Node"))?;
        let meta = meta.unwrap_or_default();
        let spec = spec.map(|s| s.0);
        let status = status.as_ref().map(|s| &s.0);
        Ok(Self {
            metadata: ObjectMeta {
                name: meta.name,
                uid: meta.uid,
                resource_version: meta.resource_version,
                ..ObjectMeta::default()
            },
            labels: meta.labels,
            annotations: meta.annotations,
            unschedulable: spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
            taints: spec.and_then(|s| s.taints).unwrap_or_default(),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            runtime_version: status
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.container_runtime_version.clone()),
        })
    }
}

impl NodeRead for WatchedNode {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)
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

impl NodeFields for WatchedNode {
    fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    fn each_label(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.each()
    }

    fn each_annotation(&self) -> impl Iterator<Item = (&str, &str)> {
        self.annotations.each()
    }

    fn runtime_version(&self) -> Option<&str> {
        self.runtime_version.as_deref()
    }
}

impl kube::Resource for WatchedNode {
    type DynamicType = ();
    type Scope = <Node as kube::Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Node::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Node::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Node::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Node::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What is read of a pod's metadata.
#[derive(Default)]
struct PodMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    /// `controller-revision-hash`, `app`, `app.kubernetes.io/component`: the labels a record keeps.
    labels: [Option<String>; 3],
    terminating: bool,
    daemonset_uid: Option<String>,
}

impl Named for PodMeta {
    fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// The pod labels a record keeps, in the order of [`PodMeta::labels`].
const POD_LABELS: [&str; 3] = [REVISION_HASH, "app", COMPONENT];

impl<'de> Deserialize<'de> for PodMeta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("pod metadata"))
    }
}

impl<'de> FieldsOf<'de> for PodMeta {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "name" => self.name = at(map.next_value::<Option<String>>(), "name")?,
            "namespace" => self.namespace = at(map.next_value::<Option<String>>(), "namespace")?,
            "resourceVersion" => {
                self.resource_version = at(map.next_value::<Option<String>>(), "resourceVersion")?;
            }
            "labels" => {
                let labels = at(map.next_value::<Option<PodLabels>>(), "labels")?;
                self.labels = labels.unwrap_or_default().0;
            }
            "deletionTimestamp" => {
                self.terminating = at(map.next_value::<Option<Time>>(), "deletionTimestamp")?.is_some();
            }
            "ownerReferences" => {
                let owners = at(map.next_value::<Option<Each<Owner<'de>>>>(), "ownerReferences")?;
                // Its controller reference, when that is a DaemonSet.
                self.daemonset_uid = owners
                    .into_iter()
                    .flat_map(|each| each.0)
                    .find(|o| o.kind.as_deref() == Some("DaemonSet") && o.controller == Some(true))
                    .and_then(|o| o.uid)
                    .map(Cow::into_owned);
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// Of a pod's labels, those a record keeps; the others' values are checked to be strings, and not kept.
#[derive(Default)]
struct PodLabels([Option<String>; 3]);

impl<'de> Deserialize<'de> for PodLabels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("a map of strings to strings"))
    }
}

impl<'de> FieldsOf<'de> for PodLabels {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let value = at(map.next_value::<Str<'de>>(), key)?;
        if let Some(i) = POD_LABELS.iter().position(|kept| *kept == key) {
            self.0[i] = Some(value.0.into_owned());
        }
        Ok(())
    }
}

/// What is read of an owner reference.
#[derive(Default)]
struct Owner<'de> {
    kind: Option<Cow<'de, str>>,
    uid: Option<Cow<'de, str>>,
    controller: Option<bool>,
}

impl<'de> Deserialize<'de> for Owner<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("an owner reference"))
    }
}

impl<'de> FieldsOf<'de> for Owner<'de> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "kind" => self.kind = Some(at(map.next_value::<Str<'de>>(), "kind")?.0),
            "uid" => self.uid = Some(at(map.next_value::<Str<'de>>(), "uid")?.0),
            "controller" => self.controller = at(map.next_value::<Option<bool>>(), "controller")?,
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn finish<E: de::Error>(self) -> Result<Self, E> {
        // Both are required of an owner reference.
        if self.kind.is_none() {
            return Err(de::Error::missing_field("kind"));
        }
        if self.uid.is_none() {
            return Err(de::Error::missing_field("uid"));
        }
        Ok(self)
    }
}

/// What is read of a pod's spec.
#[derive(Default)]
struct PodWireSpec {
    node_name: Option<String>,
    /// `DRIVER_CONFIG_DIGEST` of the first container that sets it.
    digest: Option<String>,
}

impl<'de> Deserialize<'de> for PodWireSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("a pod spec"))
    }
}

impl<'de> FieldsOf<'de> for PodWireSpec {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "nodeName" => self.node_name = at(map.next_value::<Option<String>>(), "nodeName")?,
            "containers" => {
                let containers = at(map.next_value::<Option<Each<PodContainer>>>(), "containers")?;
                self.digest = containers
                    .into_iter()
                    .flat_map(|each| each.0)
                    .find_map(|c| c.digest);
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// Of a container, the `DRIVER_CONFIG_DIGEST` its environment sets.
#[derive(Default)]
struct PodContainer {
    digest: Option<String>,
}

impl<'de> Deserialize<'de> for PodContainer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("a container"))
    }
}

impl<'de> FieldsOf<'de> for PodContainer {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "env" => {
                let env = at(map.next_value::<Option<Each<PodEnv<'de>>>>(), "env")?;
                self.digest = env
                    .into_iter()
                    .flat_map(|each| each.0)
                    .find(|e| e.name.as_deref() == Some(DRIVER_CONFIG_DIGEST))
                    .and_then(|e| e.value)
                    .map(Cow::into_owned);
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// An environment variable: its name and value, borrowed from the input where it is not escaped.
#[derive(Default)]
struct PodEnv<'de> {
    name: Option<Cow<'de, str>>,
    value: Option<Cow<'de, str>>,
}

impl<'de> Deserialize<'de> for PodEnv<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("an environment variable"))
    }
}

impl<'de> FieldsOf<'de> for PodEnv<'de> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "name" => self.name = Some(at(map.next_value::<Str<'de>>(), "name")?.0),
            "value" => self.value = at(map.next_value::<Option<Str<'de>>>(), "value")?.map(|v| v.0),
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn finish<E: de::Error>(self) -> Result<Self, E> {
        if self.name.is_none() {
            return Err(de::Error::missing_field("name"));
        }
        Ok(self)
    }
}

/// What is read of a pod's status.
#[derive(Default)]
struct PodWireStatus {
    running: bool,
    /// Whether its Ready condition is True, and since when.
    ready: Option<Option<Time>>,
    /// The highest restart count of its containers.
    restarts: Option<i32>,
}

impl<'de> Deserialize<'de> for PodWireStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("a pod status"))
    }
}

impl<'de> FieldsOf<'de> for PodWireStatus {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "phase" => {
                let phase = at(map.next_value::<Option<Str<'de>>>(), "phase")?;
                self.running = phase.is_some_and(|p| p.0 == "Running");
            }
            "conditions" => {
                let conditions = at(
                    map.next_value::<Option<Each<PodWireCondition<'de>>>>(),
                    "conditions",
                )?;
                self.ready = conditions
                    .into_iter()
                    .flat_map(|each| each.0)
                    .find(|c| c.type_.as_deref() == Some("Ready") && c.status.as_deref() == Some("True"))
                    .map(|c| c.last_transition_time);
            }
            "containerStatuses" => {
                let statuses = at(
                    map.next_value::<Option<Each<PodContainerStatus>>>(),
                    "containerStatuses",
                )?;
                self.restarts = statuses
                    .into_iter()
                    .flat_map(|each| each.0)
                    .map(|s| s.restart_count)
                    .max();
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct PodWireCondition<'de> {
    type_: Option<Cow<'de, str>>,
    status: Option<Cow<'de, str>>,
    last_transition_time: Option<Time>,
}

impl<'de> Deserialize<'de> for PodWireCondition<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("a pod condition"))
    }
}

impl<'de> FieldsOf<'de> for PodWireCondition<'de> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "type" => self.type_ = Some(at(map.next_value::<Str<'de>>(), "type")?.0),
            "status" => self.status = Some(at(map.next_value::<Str<'de>>(), "status")?.0),
            "lastTransitionTime" => {
                self.last_transition_time = at(map.next_value::<Option<Time>>(), "lastTransitionTime")?;
            }
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn finish<E: de::Error>(self) -> Result<Self, E> {
        if self.type_.is_none() {
            return Err(de::Error::missing_field("type"));
        }
        if self.status.is_none() {
            return Err(de::Error::missing_field("status"));
        }
        Ok(self)
    }
}

#[derive(Default)]
struct PodContainerStatus {
    restart_count: i32,
}

impl<'de> Deserialize<'de> for PodContainerStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Fields::<Self>::new("a container status"))
    }
}

impl<'de> FieldsOf<'de> for PodContainerStatus {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "restartCount" => self.restart_count = at(map.next_value::<i32>(), "restartCount")?,
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (meta, spec, status) =
            deserializer.deserialize_map(ObjectVisitor::<PodMeta, PodWireSpec, PodWireStatus>::new("Pod"))?;
        let meta = meta.unwrap_or_default();
        let spec = spec.unwrap_or_default();
        let status = status.unwrap_or_default();
        let [revision, app, component] = meta.labels;
        Ok(Self {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                resource_version: meta.resource_version,
                ..ObjectMeta::default()
            },
            node_name: spec.node_name,
            revision,
            app,
            component,
            terminating: meta.terminating,
            ready_since: status
                .ready
                .filter(|_| status.running)
                .map(|since| since.map_or(0, |t| t.0.as_second())),
            daemonset_uid: meta.daemonset_uid,
            digest: spec.digest,
            restarts: status.restarts.unwrap_or(0),
        })
    }
}

impl PodRead for WatchedPod {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        match key {
            REVISION_HASH => self.revision.as_deref(),
            "app" => self.app.as_deref(),
            COMPONENT => self.component.as_deref(),
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
        self.daemonset_uid.as_deref()
    }

    fn driver_digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    fn restarts(&self) -> i32 {
        self.restarts
    }
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = <Pod as kube::Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A string, borrowed from the input where it is not escaped (`serde_json::from_str`, as kube decodes
/// watch events, lends unescaped strings).
pub(crate) struct Str<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(StrVisitor)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Str<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Str<'de>, E> {
        Ok(Str(Cow::Borrowed(text)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Str<'de>, E> {
        Ok(Str(Cow::Owned(text.to_owned())))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Str<'de>, E> {
        Ok(Str(Cow::Owned(text)))
    }
}

/// A JSON array read element by element, each element's index recorded on an error.
struct Each<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Each<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(EachVisitor(PhantomData))
    }
}

struct EachVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for EachVisitor<T> {
    type Value = Each<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Each<T>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        loop {
            let index = items.len();
            let item = seq.next_element::<T>();
            if item.is_err() {
                record(Segment::Index(index));
            }
            match item? {
                Some(item) => items.push(item),
                None => return Ok(Each(items)),
            }
        }
    }
}

/// An object read field by field into `Self` (starting from its default), each field's name recorded on
/// an error in it ([`at`]); fields not read are skipped unread.
trait FieldsOf<'de>: Default + Sized {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;

    /// Checks what was read once every field was.
    fn finish<E: de::Error>(self) -> Result<Self, E> {
        Ok(self)
    }
}

struct Fields<T> {
    expecting: &'static str,
    value: PhantomData<T>,
}

impl<T> Fields<T> {
    fn new(expecting: &'static str) -> Self {
        Self {
            expecting,
            value: PhantomData,
        }
    }
}

impl<'de, T: FieldsOf<'de>> Visitor<'de> for Fields<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut value = T::default();
        while let Some(key) = map.next_key::<Str<'de>>()? {
            value.field(&key.0, &mut map)?;
        }
        value.finish()
    }
}

/// One step of the path to a malformed field.
enum Segment {
    Key(String),
    Index(usize),
}

thread_local! {
    /// The path to the field an error came from, innermost step first: each level records its step as
    /// the error passes out of it (on errors only: reading costs nothing), and [`Traced`] reads it.
    static PATH: RefCell<Vec<Segment>> = const { RefCell::new(Vec::new()) };
}

fn record(segment: Segment) {
    PATH.with_borrow_mut(|path| path.push(segment));
}

/// `result`, with `key` recorded as a step of the error's path when it is an error.
fn at<T, E>(result: Result<T, E>, key: &str) -> Result<T, E> {
    if result.is_err() {
        record(Segment::Key(key.to_owned()));
    }
    result
}

/// A part whose errors' paths `serde_path_to_error` tracks (it allocates each key it reads, so it is kept
/// to the small parts of a node).
struct PathTracked<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for PathTracked<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_path_to_error::deserialize(deserializer)
            .map(PathTracked)
            .map_err(|error| {
                let steps: Vec<Segment> = error
                    .path()
                    .iter()
                    .filter_map(|step| match step {
                        serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
                        serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
                        serde_path_to_error::Segment::Enum { variant } => Some(Segment::Key(variant.clone())),
                        serde_path_to_error::Segment::Unknown => None,
                    })
                    .collect();
                PATH.with_borrow_mut(|path| path.extend(steps.into_iter().rev()));
                error.into_inner()
            })
    }
}

/// Reads an object's `metadata`, `spec` and `status` (each as `M`, `S`, `T`), skipping every other field
/// unread. An error names the kind, the object once its name was read (the API sends `metadata` first),
/// and the field's path.
struct ObjectVisitor<M, S, T> {
    kind: &'static str,
    parts: PhantomData<(M, S, T)>,
}

impl<M, S, T> ObjectVisitor<M, S, T> {
    fn new(kind: &'static str) -> Self {
        Self {
            kind,
            parts: PhantomData,
        }
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Part {
    Metadata,
    Spec,
    Status,
    #[serde(other)]
    Other,
}

impl<'de, M, S, T> Visitor<'de> for ObjectVisitor<M, S, T>
where
    M: Deserialize<'de> + Named,
    S: Deserialize<'de>,
    T: Deserialize<'de>,
{
    type Value = (Option<M>, Option<S>, Option<T>);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} object", self.kind)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut meta, mut spec, mut status) = (None::<M>, None, None);
        while let Some(part) = map.next_key::<Part>()? {
            let name = meta.as_ref().and_then(Named::name);
            match part {
                Part::Metadata => meta = map.next_value_seed(Traced::new(self.kind, name, "metadata"))?,
                Part::Spec => spec = map.next_value_seed(Traced::new(self.kind, name, "spec"))?,
                Part::Status => status = map.next_value_seed(Traced::new(self.kind, name, "status"))?,
                Part::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((meta, spec, status))
    }
}

/// Decodes one part of an object (null as `None`), naming the object and the field's path on an error.
struct Traced<'a, V> {
    kind: &'static str,
    name: Option<&'a str>,
    field: &'static str,
    value: PhantomData<V>,
}

impl<'a, V> Traced<'a, V> {
    fn new(kind: &'static str, name: Option<&'a str>, field: &'static str) -> Self {
        Self {
            kind,
            name,
            field,
            value: PhantomData,
        }
    }
}

impl<'de, V: Deserialize<'de>> DeserializeSeed<'de> for Traced<'_, V> {
    type Value = Option<V>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<V>, D::Error> {
        PATH.with_borrow_mut(Vec::clear);
        Option::<V>::deserialize(deserializer).map_err(|error| {
            let object = match self.name {
                Some(name) => format!("{} {name}", self.kind),
                None => self.kind.to_owned(),
            };
            let mut field = self.field.to_owned();
            for step in PATH.take().iter().rev() {
                match step {
                    Segment::Key(key) => {
                        field.push('.');
                        field.push_str(key);
                    }
                    Segment::Index(index) => {
                        let _ = write!(field, "[{index}]");
                    }
                }
            }
            de::Error::custom(format_args!("{object}: {field}: {error}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{Interner, NodeKeys, NodeRecord, PodRecord};
    use gpuop_api::read::Labels;
    use serde_json::{Value, json};

    /// A GPU node as a real API server sends it: NFD's and a cloud provider's labels, NVIDIA's, managed
    /// fields recording every one of them, conditions, addresses, images, capacity.
    fn node_json() -> Value {
        let mut labels = serde_json::Map::new();
        for j in 0..150 {
            labels.insert(
                format!("feature.node.kubernetes.io/cpu-cpuid.F{j:03}"),
                json!("true"),
            );
        }
        for (key, value) in [
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
            ("feature.node.kubernetes.io/system-os_release.ID", "ubuntu"),
            ("feature.node.kubernetes.io/cpu-model.vendor_id", "AMD"),
            ("topology.kubernetes.io/zone", "us-east-1a"),
            ("node.kubernetes.io/instance-type", "p5.48xlarge"),
            ("kubernetes.io/hostname", "gpu-0"),
            ("nvidia.com/gpu.product", "H100"),
            ("nvidia.com/gpu.deploy.driver", "true"),
        ] {
            labels.insert(key.to_owned(), json!(value));
        }
        let fields: serde_json::Map<String, Value> =
            labels.keys().map(|key| (format!("f:{key}"), json!({}))).collect();
        json!({
            "kind": "Node", "apiVersion": "v1",
            "metadata": {
                "name": "gpu-0", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": labels,
                "annotations": {
                    "nvidia.com/gpu-operator.owned-labels": "topology.kubernetes.io/zone=us-east-1a,nvidia.com/gpu.present=true",
                    "nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
                "managedFields": [
                    {"manager": "nfd-worker", "operation": "Apply", "apiVersion": "v1",
                     "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": fields}}},
                ],
            },
            "spec": {
                "podCIDR": "10.0.0.0/24",
                "providerID": "aws:///us-east-1a/i-0",
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            },
            "status": {
                "capacity": {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "191", "memory": "2Ti", "nvidia.com/gpu": "8"},
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                     "reason": "KubeletReady", "message": "kubelet is posting ready status"},
                ],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "images": [{"names": ["nvcr.io/nvidia/driver:570"], "sizeBytes": 1_000_000_000_u64}],
                "nodeInfo": {
                    "machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.8.0",
                    "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://1.7.20",
                    "kubeletVersion": "v1.33.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        })
    }

    fn lean_node(json: &str) -> Result<WatchedNode, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The lean decoding projects to exactly what the whole Node projects to: the labels kept (NVIDIA's,
    /// NFD's NVIDIA PCI and OS, a key a selector names, one the labeller's record names) and none of the
    /// others, the NVIDIA annotations, taints, Ready, the runtime; managed fields and the rest skipped.
    #[test]
    fn a_watched_node_projects_as_the_whole_node_does() {
        let text = node_json().to_string();
        let whole: Node = serde_json::from_str(&text).unwrap();
        let lean = lean_node(&text).unwrap();
        let mut keys = NodeKeys::default();
        keys.extend(["feature.node.kubernetes.io/cpu-model.vendor_id"]);
        let mut interner = Interner::default();
        let from_whole = NodeRecord::project(&whole, &keys, &mut interner);
        let from_lean = NodeRecord::project(&lean, &keys, &mut interner);
        assert_eq!(from_lean, from_whole);
        let kept: Vec<&str> = from_lean.labels.each_label().map(|(k, _)| k).collect();
        assert_eq!(
            kept,
            [
                "feature.node.kubernetes.io/cpu-model.vendor_id",
                "feature.node.kubernetes.io/pci-10de.present",
                "feature.node.kubernetes.io/system-os_release.ID",
                "nvidia.com/gpu.deploy.driver",
                "nvidia.com/gpu.product",
                "topology.kubernetes.io/zone",
            ]
        );
        assert!(from_lean.ready && from_lean.nfd_labels);
        assert_eq!(from_lean.taints.len(), 1);
        assert_eq!(from_lean.runtime_version.as_deref(), Some("containerd://1.7.20"));
        assert_eq!(from_lean.annotations.len(), 2, "the NVIDIA annotations only");
        assert_eq!(
            kube::Resource::meta(&lean).resource_version.as_deref(),
            Some("42")
        );
        assert_eq!(
            lean.labels.spans.len(),
            158,
            "every label is there for the projection to choose"
        );
    }

    /// Labels sent out of order, or a key twice: the projection sees them as a map would hold them.
    #[test]
    fn labels_out_of_order_or_repeated_read_as_a_map_would() {
        let text = r#"{"metadata": {"name": "n", "labels": {
            "nvidia.com/b": "1", "nvidia.com/a": "1", "nvidia.com/b": "2", "zone": "x"}}}"#;
        let whole: Node = serde_json::from_str(text).unwrap();
        let lean = lean_node(text).unwrap();
        let mut interner = Interner::default();
        assert_eq!(
            NodeRecord::project(&lean, &NodeKeys::default(), &mut interner),
            NodeRecord::project(&whole, &NodeKeys::default(), &mut interner),
        );
        assert_eq!(lean.label("nvidia.com/b"), Some("2"));
        assert_eq!(lean.labels.spans.len(), 3);
    }

    /// A node that is nothing but a name (a deletion's tombstone may be), or has null parts, decodes.
    #[test]
    fn a_sparse_node_decodes() {
        let lean =
            lean_node(r#"{"metadata": {"name": "n", "labels": null}, "spec": null, "status": {}}"#).unwrap();
        assert_eq!(lean.name(), "n");
        assert!(!lean.ready() && !lean.unschedulable() && lean.taints().is_empty());
    }

    /// A field the projection reads that is malformed is an error naming the node and the field.
    #[test]
    fn a_malformed_field_is_an_error_naming_the_node_and_the_field() {
        let broken = |pointer: &str, value: Value| {
            let mut node = node_json();
            *node.pointer_mut(pointer).unwrap() = value;
            lean_node(&node.to_string()).unwrap_err().to_string()
        };
        let error = broken("/spec/taints/0/effect", json!(7));
        assert!(
            error.starts_with(
                "Node gpu-0: spec.taints[0].effect: invalid type: integer `7`, expected a string"
            ),
            "{error}"
        );
        let error = broken("/status/conditions/1/status", json!(true));
        assert!(
            error.starts_with("Node gpu-0: status.conditions[1].status: invalid type: boolean"),
            "{error}"
        );
        let error = broken("/metadata/labels/nvidia.com~1gpu.product", json!(["H100"]));
        assert!(
            error.starts_with(
                "Node: metadata.labels.nvidia.com/gpu.product: invalid type: sequence, expected a string"
            ),
            "{error}"
        );
        let error = broken("/metadata/labels/topology.kubernetes.io~1zone", json!(1));
        assert!(
            error.contains("metadata.labels.topology.kubernetes.io/zone: invalid type: integer"),
            "a label not kept is checked too: {error}"
        );
        let error = broken("/spec", json!("cordoned"));
        assert!(
            error.starts_with("Node gpu-0: spec: invalid type: string \"cordoned\""),
            "{error}"
        );
        // Fields nobody reads are not checked.
        let mut node = node_json();
        node["status"]["capacity"] = json!("lots");
        node["metadata"]["managedFields"] = json!(12);
        assert!(lean_node(&node.to_string()).is_ok());
    }

    /// Inside kube's watch event and list envelopes, as the watcher reads them.
    #[test]
    fn watch_events_and_lists_decode_lean() {
        let event = json!({"type": "MODIFIED", "object": node_json()}).to_string();
        let event: kube::core::WatchEvent<WatchedNode> = serde_json::from_str(&event).unwrap();
        let kube::core::WatchEvent::Modified(node) = event else {
            panic!("a modification");
        };
        assert_eq!(node.name(), "gpu-0");
        let list = json!({"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "43"},
                          "items": [node_json(), node_json()]})
        .to_string();
        let list: kube::core::ObjectList<WatchedNode> = serde_json::from_str(&list).unwrap();
        assert_eq!(list.items.len(), 2);
    }

    fn pod_json(component: &str) -> Value {
        json!({
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {
                "name": "driver-x", "namespace": "gpu-operator", "uid": "p-1", "resourceVersion": "7",
                "labels": {"app": "nvidia-driver-daemonset", "app.kubernetes.io/component": component,
                           "controller-revision-hash": "abc"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "ds-1",
                                     "controller": true}],
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {
                "nodeName": "gpu-0",
                "volumes": [{"name": "v", "hostPath": {"path": "/run"}}],
                "containers": [
                    {"name": "nvidia-driver-ctr", "image": "driver", "args": ["init"],
                     "env": [{"name": "A", "value": "1"},
                             {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                             {"name": DRIVER_CONFIG_DIGEST, "value": "d1"}]},
                    {"name": "peermem", "image": "driver"},
                ],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.1.0.7",
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"},
                ],
                "containerStatuses": [
                    {"name": "nvidia-driver-ctr", "ready": true, "restartCount": 12, "image": "i", "imageID": "",
                     "state": {"running": {"startedAt": "2026-01-01T00:00:05Z"}}},
                    {"name": "peermem", "ready": true, "restartCount": 1, "image": "i", "imageID": ""},
                ],
            },
        })
    }

    #[test]
    fn a_watched_pod_projects_as_the_whole_pod_does() {
        let mut interner = Interner::default();
        for component in [
            gpuop_api::Operand::Driver.info().component,
            "nvidia-device-plugin",
        ] {
            let text = pod_json(component).to_string();
            let whole: Pod = serde_json::from_str(&text).unwrap();
            let lean: WatchedPod = serde_json::from_str(&text).unwrap();
            let record = PodRecord::project(&lean, &mut interner);
            assert_eq!(record, PodRecord::project(&whole, &mut interner));
            assert_eq!(record.ready_since, Some(1_767_225_610));
            assert_eq!(record.kind.daemonset_uid.as_deref(), Some("ds-1"));
        }
        let driver = PodRecord::project(
            &serde_json::from_str::<WatchedPod>(
                &pod_json(gpuop_api::Operand::Driver.info().component).to_string(),
            )
            .unwrap(),
            &mut interner,
        );
        let fields = driver.driver.expect("a driver pod");
        assert_eq!((fields.restarts, fields.digest.as_deref()), (12, Some("d1")));
    }

    #[test]
    fn a_malformed_pod_field_is_an_error_naming_the_pod_and_the_field() {
        let mut pod = pod_json("nvidia-driver");
        pod["status"]["containerStatuses"][1]["restartCount"] = json!("twelve");
        let error = serde_json::from_str::<WatchedPod>(&pod.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("Pod driver-x: status.containerStatuses[1].restartCount: invalid type: string"),
            "{error}"
        );
    }
}
