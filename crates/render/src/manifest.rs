//! From typed Kubernetes objects to [`Manifest`]s: the operator namespace on namespaced kinds, and the two
//! labels every object this project creates carries (`app.kubernetes.io/managed-by: gpu-operator`, which
//! pruning selects on, and `app.kubernetes.io/component`, the operand it belongs to).
//!
//! Objects are built from k8s-openapi structs (or, for the Prometheus Operator's ServiceMonitor, a local
//! struct of the same shape) and converted once, here, so every object the renderer emits went through a
//! type that matches the API.

use std::collections::BTreeMap;

use gpuop_api::labels::{COMPONENT, MANAGED_BY, MANAGED_BY_VALUE};
use gpuop_api::{Operand, OperandInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, Metadata, NamespaceResourceScope, Resource};
use serde::Serialize;

use crate::Manifest;

/// `app.kubernetes.io/component` of objects that belong to no operand (RuntimeClasses, the operator's own
/// metrics Service), as NVIDIA labels its RuntimeClasses.
pub(crate) const OPERATOR_COMPONENT: &str = "gpu-operator";

/// Whether objects of a scope live in a namespace.
pub(crate) trait Scope {
    /// True for namespaced kinds.
    const NAMESPACED: bool;
}

impl Scope for NamespaceResourceScope {
    const NAMESPACED: bool = true;
}

impl Scope for ClusterResourceScope {
    const NAMESPACED: bool = false;
}

/// The state and operand the next objects belong to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owner {
    /// ClusterPolicy state.
    pub state: &'static str,
    /// The operand, if any.
    pub operand: Option<Operand>,
    /// Value of `app.kubernetes.io/component`.
    pub component: &'static str,
}

impl Owner {
    /// Objects of an operand, in its state.
    pub fn operand(info: &OperandInfo) -> Self {
        Self {
            state: info.state,
            operand: Some(info.operand),
            component: info.component,
        }
    }

    /// Objects of a state that belongs to no operand.
    pub fn operator(state: &'static str) -> Self {
        Self {
            state,
            operand: None,
            component: OPERATOR_COMPONENT,
        }
    }
}

/// The objects rendered so far, in order.
#[derive(Debug)]
pub(crate) struct Objects {
    namespace: String,
    manifests: Vec<Manifest>,
}

impl Objects {
    /// No objects yet, for this operator namespace.
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            manifests: Vec::new(),
        }
    }

    /// The operator namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Adds an object: sets its namespace when its kind is namespaced and adds the managed-by and component
    /// labels (they win over any label of the same key, since pruning and the driver upgrade rely on them).
    pub fn push<K>(&mut self, owner: Owner, mut object: K)
    where
        K: Resource + Metadata<Ty = ObjectMeta> + Serialize,
        K::Scope: Scope,
    {
        let metadata = object.metadata_mut();
        if <K::Scope as Scope>::NAMESPACED {
            metadata.namespace = Some(self.namespace.clone());
        }
        let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(MANAGED_BY.to_owned(), MANAGED_BY_VALUE.to_owned());
        labels.insert(COMPONENT.to_owned(), owner.component.to_owned());
        // Serializing these types cannot fail: every map in them has string keys.
        let value = serde_json::to_value(&object).unwrap_or_default();
        self.manifests.push(Manifest {
            state: owner.state,
            operand: owner.operand,
            object: value,
        });
    }

    /// The manifests, in the order they were added.
    pub fn into_manifests(self) -> Vec<Manifest> {
        self.manifests
    }
}

/// Metadata with a name and labels.
pub(crate) fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: (!labels.is_empty()).then(|| {
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
        ..ObjectMeta::default()
    }
}
