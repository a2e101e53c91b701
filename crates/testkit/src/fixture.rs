//! Builders of the Kubernetes objects tests start from: [`node`], [`pod`] and [`daemonset`], with
//! [`labels`] and [`controller_ref`] for their parts, and [`managers`] to read back who wrote an object.
//!
//! A builder starts from an empty object and each method sets one thing, so that what is built holds what
//! the test said and nothing more: a node given no taint and no cordon has no `spec`, a DaemonSet given no
//! selector has no template labels. Tests of code that reads these objects therefore see the same shapes the
//! API server would hand them for the same request.
//!
//! This module needs only `k8s-openapi` and `serde_json`, and knows nothing of the operator, so every crate's
//! tests may use it. (`gpuop-api`'s own tests do not: through this crate they would see a second copy of its
//! types.)

use std::collections::BTreeMap;

use k8s_openapi::Metadata;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateWaiting, ContainerStatus, Node, NodeSpec, Pod, PodCondition,
    PodSpec, PodStatus, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A label map from `(key, value)` pairs; a repeated key keeps its last value, as in a YAML map.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for &(key, value) in pairs {
        map.insert(key.to_owned(), value.to_owned());
    }
    map
}

/// The owner reference a controller puts on what it creates (`controller: true`), pointing at the object
/// `kind` `name` with `uid`.
pub fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Who wrote an object, as `(manager, operation)` pairs in the order of its managed fields.
pub fn managers(meta: &ObjectMeta) -> Vec<(String, String)> {
    let written = meta.managed_fields.as_deref().unwrap_or_default();
    let text = |value: &Option<String>| value.clone().unwrap_or_default();
    written
        .iter()
        .map(|entry| (text(&entry.manager), text(&entry.operation)))
        .collect()
}

/// A node named `name`, with nothing else set until a method says so.
pub fn node(name: &str) -> Builder<Node> {
    Builder::named(name)
}

/// A pod named `name`, with nothing else set until a method says so.
pub fn pod(name: &str) -> Builder<Pod> {
    Builder::named(name)
}

/// A DaemonSet named `name`, with nothing else set until a method says so.
pub fn daemonset(name: &str) -> Builder<DaemonSet> {
    Builder::named(name)
}

/// A [`Node`], [`Pod`] or [`DaemonSet`] under construction; see [`node`], [`pod`] and [`daemonset`].
#[derive(Clone, Debug)]
#[must_use]
pub struct Builder<K>(K);

impl<K: Metadata<Ty = ObjectMeta> + Default> Builder<K> {
    /// An empty object named `name`.
    fn named(name: &str) -> Self {
        let mut object = K::default();
        object.metadata_mut().name = Some(name.to_owned());
        Builder(object)
    }

    /// Adds labels to the object's own metadata (a DaemonSet's, not its pods').
    pub fn labels(mut self, pairs: &[(&str, &str)]) -> Self {
        let meta = self.0.metadata_mut();
        meta.labels.get_or_insert_default().extend(labels(pairs));
        self
    }

    /// The object.
    pub fn build(self) -> K {
        self.0
    }
}

impl Builder<Node> {
    /// Adds a `NoSchedule` taint, with no value, for each key (none for `None`).
    pub fn no_schedule<'a>(mut self, keys: impl IntoIterator<Item = &'a str>) -> Self {
        for key in keys {
            let effect = "NoSchedule".to_owned();
            let taint = Taint {
                key: key.to_owned(),
                effect,
                ..Taint::default()
            };
            self.spec().taints.get_or_insert_default().push(taint);
        }
        self
    }

    /// Sets `spec.unschedulable`, as `kubectl cordon` (`true`) and `uncordon` (`false`) do.
    pub fn unschedulable(mut self, cordoned: bool) -> Self {
        self.spec().unschedulable = Some(cordoned);
        self
    }

    /// Sets how much of `resource` the node offers to pods.
    pub fn allocatable(mut self, resource: &str, quantity: &str) -> Self {
        let status = self.0.status.get_or_insert_default();
        let allocatable = status.allocatable.get_or_insert_default();
        allocatable.insert(resource.to_owned(), Quantity(quantity.to_owned()));
        self
    }

    fn spec(&mut self) -> &mut NodeSpec {
        self.0.spec.get_or_insert_default()
    }
}

impl Builder<Pod> {
    /// Adds an owner reference, such as a [`controller_ref`].
    pub fn owned_by(mut self, owner: OwnerReference) -> Self {
        let owners = self.0.metadata.owner_references.get_or_insert_default();
        owners.push(owner);
        self
    }

    /// Binds the pod to the node `name`, as the scheduler does.
    pub fn on(mut self, name: &str) -> Self {
        let spec = self.0.spec.get_or_insert_default();
        spec.node_name = Some(name.to_owned());
        self
    }

    /// Sets the pod's phase (`Pending`, `Running`, `Succeeded`, `Failed`).
    pub fn phase(mut self, phase: &str) -> Self {
        self.status().phase = Some(phase.to_owned());
        self
    }

    /// Sets the pod's `Ready` condition, replacing any it had.
    pub fn ready(mut self, ready: bool) -> Self {
        let status = if ready { "True" } else { "False" }.to_owned();
        let condition = PodCondition {
            type_: "Ready".to_owned(),
            status,
            ..PodCondition::default()
        };
        let conditions = self.status().conditions.get_or_insert_default();
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(condition);
        self
    }

    /// A pod the kubelet runs: phase `Running` and a `Ready` condition saying `ready`.
    pub fn running(self, ready: bool) -> Self {
        self.phase("Running").ready(ready)
    }

    /// Adds a container status waiting for `reason`, such as `CrashLoopBackOff`.
    pub fn waiting(mut self, reason: &str) -> Self {
        let waiting = ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message: None,
        };
        let state = ContainerState {
            waiting: Some(waiting),
            ..ContainerState::default()
        };
        let container = ContainerStatus {
            state: Some(state),
            ..ContainerStatus::default()
        };
        let statuses = self.status().container_statuses.get_or_insert_default();
        statuses.push(container);
        self
    }

    fn status(&mut self) -> &mut PodStatus {
        self.0.status.get_or_insert_default()
    }
}

impl Builder<DaemonSet> {
    /// Sets the namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// Sets the uid, which the pods' owner references name.
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_owned());
        self
    }

    /// Sets `metadata.generation`, which the controller copies to its pods' `pod-template-generation`.
    pub fn generation(mut self, generation: i64) -> Self {
        self.0.metadata.generation = Some(generation);
        self
    }

    /// Selects its pods by these labels: the selector's `matchLabels` and the pod template's labels both.
    pub fn selecting(mut self, pairs: &[(&str, &str)]) -> Self {
        let spec = self.spec();
        let selected = spec.selector.match_labels.get_or_insert_default();
        selected.extend(labels(pairs));
        let template = spec.template.metadata.get_or_insert_default();
        template.labels.get_or_insert_default().extend(labels(pairs));
        self
    }

    /// Adds to the pod template's `nodeSelector`.
    pub fn node_selector(mut self, pairs: &[(&str, &str)]) -> Self {
        let selector = self.pod_spec().node_selector.get_or_insert_default();
        selector.extend(labels(pairs));
        self
    }

    /// Adds a toleration of any taint with `key` (operator `Exists`, any effect).
    pub fn tolerate(mut self, key: &str) -> Self {
        let (key, operator) = (Some(key.to_owned()), Some("Exists".to_owned()));
        let toleration = Toleration {
            key,
            operator,
            ..Toleration::default()
        };
        let tolerations = self.pod_spec().tolerations.get_or_insert_default();
        tolerations.push(toleration);
        self
    }

    /// Adds a container `name` running `image` to the pod template.
    pub fn container(mut self, name: &str, image: &str) -> Self {
        let image = Some(image.to_owned());
        let container = Container {
            name: name.to_owned(),
            image,
            ..Container::default()
        };
        self.pod_spec().containers.push(container);
        self
    }

    /// Sets the update strategy: `RollingUpdate`, with at most `max_unavailable` pods down where given, or
    /// `OnDelete`.
    pub fn update_strategy(mut self, kind: &str, max_unavailable: Option<IntOrString>) -> Self {
        let rolling_update = max_unavailable.map(|most| RollingUpdateDaemonSet {
            max_unavailable: Some(most),
            ..RollingUpdateDaemonSet::default()
        });
        self.spec().update_strategy = Some(DaemonSetUpdateStrategy {
            type_: Some(kind.to_owned()),
            rolling_update,
        });
        self
    }

    fn spec(&mut self) -> &mut DaemonSetSpec {
        self.0.spec.get_or_insert_default()
    }

    fn pod_spec(&mut self) -> &mut PodSpec {
        self.spec().template.spec.get_or_insert_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn a_repeated_label_key_keeps_its_last_value() {
        let map = labels(&[("a", "1"), ("b", "2"), ("a", "3")]);
        assert_eq!(
            map,
            BTreeMap::from([("a".into(), "3".into()), ("b".into(), "2".into())])
        );
    }

    #[test]
    fn a_node_holds_only_what_was_set() {
        let bare = node("n").build();
        assert_eq!(
            (bare.spec, bare.status),
            (None, None),
            "no spec or status until asked"
        );
        let none: Option<&str> = None;
        assert_eq!(node("n").no_schedule(none).build().spec, None);
        let tainted = node("n")
            .labels(&[("gpu", "true")])
            .no_schedule(Some("dedicated"))
            .unschedulable(true)
            .allocatable("nvidia.com/gpu", "8")
            .build();
        let spec = tainted.spec.expect("spec");
        assert_eq!(spec.unschedulable, Some(true));
        let taint = &spec.taints.expect("taints")[0];
        assert_eq!(
            (taint.key.as_str(), taint.effect.as_str(), taint.value.as_deref()),
            ("dedicated", "NoSchedule", None)
        );
        let allocatable = tainted.status.and_then(|s| s.allocatable).expect("allocatable");
        assert_eq!(allocatable["nvidia.com/gpu"], Quantity("8".into()));
    }

    #[test]
    fn a_pod_is_ready_by_its_one_ready_condition() {
        let pod = pod("p").running(true).ready(false).build();
        let status = pod.status.expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let conditions = status.conditions.expect("conditions");
        assert_eq!(conditions.len(), 1, "ready() replaces the condition");
        assert_eq!(conditions[0].status, "False");
    }

    #[test]
    fn a_pod_is_bound_owned_and_waiting_as_told() {
        let owner = controller_ref("apps/v1", "DaemonSet", "plugin", "ds-uid");
        let pod = pod("p")
            .on("gpu-0")
            .owned_by(owner.clone())
            .waiting("CrashLoopBackOff")
            .build();
        assert_eq!(pod.spec.and_then(|s| s.node_name).as_deref(), Some("gpu-0"));
        assert_eq!(pod.metadata.owner_references, Some(vec![owner]));
        let statuses = pod.status.and_then(|s| s.container_statuses).expect("statuses");
        let waiting = statuses[0].state.as_ref().and_then(|s| s.waiting.as_ref());
        assert_eq!(
            waiting.and_then(|w| w.reason.as_deref()),
            Some("CrashLoopBackOff")
        );
    }

    #[test]
    fn a_daemonset_selects_its_pods_by_selector_and_template_alike() {
        let ds = daemonset("plugin")
            .selecting(&[("app", "plugin")])
            .node_selector(&[("gpu", "true")])
            .tolerate("dedicated")
            .container("main", "v1")
            .update_strategy("RollingUpdate", Some(IntOrString::Int(1)))
            .build();
        let spec = ds.spec.expect("spec");
        let selected = spec.selector.match_labels.expect("matchLabels");
        assert_eq!(spec.template.metadata.and_then(|m| m.labels), Some(selected));
        let pod_spec = spec.template.spec.expect("pod spec");
        assert_eq!(pod_spec.node_selector, Some(labels(&[("gpu", "true")])));
        let toleration = &pod_spec.tolerations.expect("tolerations")[0];
        assert_eq!(
            (toleration.operator.as_deref(), toleration.effect.as_deref()),
            (Some("Exists"), None)
        );
        assert_eq!(pod_spec.containers[0].image.as_deref(), Some("v1"));
        let strategy = spec.update_strategy.expect("strategy");
        assert_eq!(
            strategy.rolling_update.and_then(|r| r.max_unavailable),
            Some(IntOrString::Int(1))
        );
        let plain = daemonset("plain").uid("u").build();
        assert_eq!(plain.spec, None, "no spec until a spec method");
    }

    #[test]
    fn managers_are_read_in_their_order() {
        let mut meta = ObjectMeta::default();
        assert!(managers(&meta).is_empty());
        let entry = |manager: &str, operation: &str| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            ..ManagedFieldsEntry::default()
        };
        meta.managed_fields = Some(vec![entry("helm", "Apply"), entry("kubectl", "Update")]);
        assert_eq!(
            managers(&meta),
            [
                ("helm".to_owned(), "Apply".to_owned()),
                ("kubectl".to_owned(), "Update".to_owned())
            ]
        );
    }
}
