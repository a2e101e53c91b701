//! What the shared rules read of a Node and of a Pod, as two small traits: placement
//! ([`crate::placement`]) and the upgrade views ([`crate::upgrade::observe`]) are written once against
//! them, and work alike on `k8s_openapi` objects (the simulator, the doctor) and on the operator's compact
//! cache projections. Each reading rule (a pod is ready when it runs with its Ready condition true; a
//! node's taints; its cordon) lives in the `k8s_openapi` implementation here; a projection keeps what
//! these methods answered.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crate::driver::DRIVER_CONFIG_DIGEST;

/// A Node as the rules read it.
pub trait NodeRead {
    /// `metadata.name` (empty when absent).
    fn name(&self) -> &str;
    /// A label's value.
    fn label(&self, key: &str) -> Option<&str>;
    /// An annotation's value.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// `spec.taints`.
    fn taints(&self) -> &[Taint];
    /// `spec.unschedulable` (cordoned).
    fn unschedulable(&self) -> bool;
    /// Whether its `Ready` condition is `True`.
    fn ready(&self) -> bool;
}

/// A Pod as the rules read it.
pub trait PodRead {
    /// `metadata.name` (empty when absent).
    fn name(&self) -> &str;
    /// `spec.nodeName`.
    fn node_name(&self) -> Option<&str>;
    /// A label's value.
    fn label(&self, key: &str) -> Option<&str>;
    /// Whether it is being deleted (`metadata.deletionTimestamp`).
    fn terminating(&self) -> bool;
    /// Since when (seconds) it has been Ready, when it runs with its Ready condition true (0 when the
    /// condition has no transition time); `None` while it is not ready.
    fn ready_since(&self) -> Option<i64>;
    /// The uid of the DaemonSet that controls it (its controller owner reference of kind DaemonSet).
    fn daemonset_uid(&self) -> Option<&str>;
    /// The value of `DRIVER_CONFIG_DIGEST` in its containers' environment.
    fn driver_digest(&self) -> Option<&str>;
    /// The highest restart count of its containers.
    fn restarts(&self) -> i32;
}

impl NodeRead for Node {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }

    fn taints(&self) -> &[Taint] {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
    }

    fn unschedulable(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
    }

    fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }
}

impl PodRead for Pod {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn node_name(&self) -> Option<&str> {
        self.spec.as_ref()?.node_name.as_deref()
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    fn terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    fn ready_since(&self) -> Option<i64> {
        let status = self.status.as_ref()?;
        pod_ready_since(
            status.phase.as_deref(),
            status.conditions.iter().flatten().map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.last_transition_time.as_ref().map(|t| t.0.as_second()),
                )
            }),
        )
    }

    fn daemonset_uid(&self) -> Option<&str> {
        controller_uid(self.metadata.owner_references.iter().flatten(), "DaemonSet")
    }

    fn driver_digest(&self) -> Option<&str> {
        self.spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.env.iter().flatten())
            .find(|e| e.name == DRIVER_CONFIG_DIGEST)
            .and_then(|e| e.value.as_deref())
    }

    fn restarts(&self) -> i32 {
        self.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|statuses| statuses.iter().map(|s| s.restart_count).max())
            .unwrap_or(0)
    }
}

/// The pod-ready rule: the pod runs (phase `Running`) and its `Ready` condition is `True`. Returns since when
/// (that condition's last transition in seconds, 0 when it has none). `conditions` are `(type, status, last
/// transition)`; every reader of pods ([`PodRead::ready_since`]) answers with this.
pub fn pod_ready_since<'c>(
    phase: Option<&str>,
    conditions: impl IntoIterator<Item = (&'c str, &'c str, Option<i64>)>,
) -> Option<i64> {
    if phase != Some("Running") {
        return None;
    }
    conditions
        .into_iter()
        .find(|&(kind, status, _)| kind == "Ready" && status == "True")
        .map(|(_, _, since)| since.unwrap_or(0))
}

/// The uid of the controller among `owners` (the owner reference marked `controller`) when it is of `kind`.
pub fn controller_uid<'o>(
    owners: impl IntoIterator<Item = &'o OwnerReference>,
    kind: &str,
) -> Option<&'o str> {
    owners
        .into_iter()
        .find(|o| o.kind == kind && o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// The owner reference a controller puts on the objects it creates, which [`controller_uid`] finds: it
/// names `owner` as their controller and blocks `owner`'s foreground deletion until they are gone.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

macro_rules! forward {
    ($trait:ident for $wrapper:ty { $($method:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)* }) => {
        impl<T: $trait + ?Sized> $trait for $wrapper {
            $(fn $method(&self $(, $arg: $ty)*) -> $ret {
                (**self).$method($($arg),*)
            })*
        }
    };
}

macro_rules! forward_node {
    ($wrapper:ty) => {
        forward!(NodeRead for $wrapper {
            name() -> &str;
            label(key: &str) -> Option<&str>;
            annotation(key: &str) -> Option<&str>;
            taints() -> &[Taint];
            unschedulable() -> bool;
            ready() -> bool;
        });
    };
}

macro_rules! forward_pod {
    ($wrapper:ty) => {
        forward!(PodRead for $wrapper {
            name() -> &str;
            node_name() -> Option<&str>;
            label(key: &str) -> Option<&str>;
            terminating() -> bool;
            ready_since() -> Option<i64>;
            daemonset_uid() -> Option<&str>;
            driver_digest() -> Option<&str>;
            restarts() -> i32;
        });
    };
}

forward_node!(&T);
forward_node!(Arc<T>);
forward_pod!(&T);
forward_pod!(Arc<T>);

/// A node's labels as the label rules (GPU detection, selectors, routing, the labeller) read them: a
/// `BTreeMap` of a `k8s_openapi` object, or a cache projection's compact table.
pub trait Labels {
    /// A label's value.
    fn get_label(&self, key: &str) -> Option<&str>;
    /// Every label, by key.
    fn each_label(&self) -> impl Iterator<Item = (&str, &str)>;
}

impl Labels for std::collections::BTreeMap<String, String> {
    fn get_label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }

    fn each_label(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl<T: Labels + ?Sized> Labels for &T {
    fn get_label(&self, key: &str) -> Option<&str> {
        (**self).get_label(key)
    }

    fn each_label(&self) -> impl Iterator<Item = (&str, &str)> {
        (**self).each_label()
    }
}
