//! The controllers a real cluster runs inside kube-controller-manager and the API server that decide when
//! objects go: the garbage collector (owner references, with background, foreground and orphan
//! propagation), the namespace controller (a deleted namespace empties, then goes) and the CRD cleanup (a
//! deleted CRD takes its custom resources with it).
//!
//! They run synchronously after every write, until nothing is left to do, so a test observes the settled
//! cluster as soon as its request returns. Every change they make is an ordinary write with watch events
//! and managed fields (`generic-garbage-collector`, `namespace-controller`).

use std::sync::Arc;

use serde_json::Value;

use crate::object::{Owner, Stored};
use crate::registry::ResourceInfo;
use crate::ssa::Scope;
use crate::store::{DeleteOptions, Propagation, State, Work};

const COLLECTOR: &str = "generic-garbage-collector";
const NAMESPACE_CONTROLLER: &str = "namespace-controller";

/// What the collector does with a dependent, given which of its owners still exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every owner is alive: nothing.
    Keep,
    /// Some owners are gone: drop the references to them.
    DropReferences(Vec<String>),
    /// No owner is alive: delete the dependent.
    Delete,
}

/// The collector's decision for a dependent with these owners.
pub(crate) fn judge(owners: &[Owner], alive: impl Fn(&Owner) -> bool) -> Verdict {
    if owners.is_empty() {
        return Verdict::Keep;
    }
    let gone: Vec<String> = owners
        .iter()
        .filter(|o| !alive(o))
        .map(|o| o.uid.clone())
        .collect();
    if gone.is_empty() {
        Verdict::Keep
    } else if gone.len() == owners.len() {
        Verdict::Delete
    } else {
        Verdict::DropReferences(gone)
    }
}

/// A bound on the work one write may cause, against loops.
const MAX_STEPS: usize = 1_000_000;

impl State {
    /// Runs the controllers until nothing is left to do.
    pub(crate) fn settle(&mut self) {
        let mut steps = 0;
        while let Some(work) = self.gc.pop_front() {
            steps += 1;
            if steps > MAX_STEPS {
                tracing::error!("garbage collection did not settle; dropping the rest of its work");
                self.gc.clear();
                return;
            }
            match work {
                Work::OwnerGone { uid } => {
                    let dependents: Vec<String> = self
                        .dependents
                        .get(&uid)
                        .map(|d| d.iter().cloned().collect())
                        .unwrap_or_default();
                    for dependent in dependents {
                        self.examine(&dependent);
                    }
                }
                Work::Dependent { uid } => self.examine(&uid),
                Work::Foreground { uid } => self.foreground(&uid),
                Work::Orphan { uid } => self.orphan(&uid),
                Work::Namespace { name } => self.namespace(&name),
                Work::Definition { name } => self.definition(&name),
            }
        }
    }

    /// Whether `owner`, referenced by `dependent`, exists where the dependent may refer to it.
    fn owner_alive(&self, dependent: &Stored, owner: &Owner) -> bool {
        match self.by_uid(&owner.uid) {
            Some((info, stored)) => !info.namespaced || stored.meta.namespace == dependent.meta.namespace,
            None => false,
        }
    }

    fn examine(&mut self, uid: &str) {
        let Some((info, dependent)) = self.by_uid(uid) else {
            return;
        };
        match judge(&dependent.meta.owners, |owner| {
            self.owner_alive(&dependent, owner)
        }) {
            Verdict::Keep => {}
            Verdict::Delete => {
                if !dependent.meta.deleting {
                    self.collect(&info, &dependent, Propagation::Background);
                }
            }
            Verdict::DropReferences(gone) => {
                let mut value = dependent.value();
                if let Some(references) = value
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    references.retain(|r| {
                        !gone
                            .iter()
                            .any(|g| r.get("uid").and_then(Value::as_str) == Some(g))
                    });
                }
                self.system_update(
                    &info,
                    &dependent,
                    value,
                    COLLECTOR,
                    Scope::Main {
                        status_subresource: false,
                    },
                );
            }
        }
    }

    fn collect(&mut self, info: &Arc<ResourceInfo>, object: &Stored, propagation: Propagation) {
        let opts = DeleteOptions {
            propagation: Some(propagation),
            ..DeleteOptions::default()
        };
        if let Err(error) = self.delete(info, &object.meta.namespace, &object.meta.name, &opts) {
            tracing::warn!(%error, name = %object.meta.name, "garbage collector could not delete a dependent");
        }
    }

    fn dependents_of(&self, owner: &Stored) -> Vec<(Arc<ResourceInfo>, Arc<Stored>)> {
        self.dependents
            .get(&owner.meta.uid)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.by_uid(uid))
            .filter(|(_, d)| d.meta.owners.iter().any(|o| o.uid == owner.meta.uid))
            .collect()
    }

    /// The object with this uid if it is being deleted and still holds `finalizer`: an owner whose
    /// dependents foreground deletion or orphaning has yet to deal with.
    fn deleting_with(&self, uid: &str, finalizer: &str) -> Option<(Arc<ResourceInfo>, Arc<Stored>)> {
        self.by_uid(uid)
            .filter(|(_, owner)| owner.meta.deleting && owner.meta.finalizers.iter().any(|f| f == finalizer))
    }

    fn foreground(&mut self, uid: &str) {
        let Some((info, owner)) = self.deleting_with(uid, "foregroundDeletion") else {
            return;
        };
        for (dependent_info, dependent) in self.dependents_of(&owner) {
            if !dependent.meta.deleting {
                let has_own = self
                    .dependents
                    .get(&dependent.meta.uid)
                    .is_some_and(|d| !d.is_empty());
                let propagation = if has_own {
                    Propagation::Foreground
                } else {
                    Propagation::Background
                };
                self.collect(&dependent_info, &dependent, propagation);
            }
        }
        let Some((_, owner)) = self.by_uid(uid) else {
            return;
        };
        let blocked = self.dependents_of(&owner).iter().any(|(_, d)| {
            d.meta
                .owners
                .iter()
                .any(|o| o.uid == owner.meta.uid && o.block_owner_deletion)
        });
        if !blocked {
            self.drop_finalizer(&info, &owner, "foregroundDeletion");
        }
    }

    fn orphan(&mut self, uid: &str) {
        let Some((info, owner)) = self.deleting_with(uid, "orphan") else {
            return;
        };
        for (dependent_info, dependent) in self.dependents_of(&owner) {
            let mut value = dependent.value();
            if let Some(references) = value
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            {
                references.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            }
            self.system_update(
                &dependent_info,
                &dependent,
                value,
                COLLECTOR,
                Scope::Main {
                    status_subresource: false,
                },
            );
        }
        if let Some((_, owner)) = self.by_uid(uid) {
            self.drop_finalizer(&info, &owner, "orphan");
        }
    }

    fn drop_finalizer(&mut self, info: &Arc<ResourceInfo>, object: &Arc<Stored>, finalizer: &str) {
        let mut value = object.value();
        if let Some(list) = value
            .pointer_mut("/metadata/finalizers")
            .and_then(Value::as_array_mut)
        {
            list.retain(|f| f.as_str() != Some(finalizer));
            if list.is_empty()
                && let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut)
            {
                meta.remove("finalizers");
            }
        }
        self.system_update(
            info,
            object,
            value,
            COLLECTOR,
            Scope::Main {
                status_subresource: false,
            },
        );
    }

    fn namespace(&mut self, name: &str) {
        let namespaces = self.registry.find("", "v1", "namespaces").expect("built in");
        let Some(namespace) = self.lookup(&namespaces, "", name) else {
            return;
        };
        if !namespace.meta.deleting {
            return;
        }
        let mut remaining = 0;
        let keys: Vec<_> = self.tables.keys().cloned().collect();
        for key in keys {
            let Some(info) = self.info_for(&key) else { continue };
            if !info.namespaced {
                continue;
            }
            let contents: Vec<Arc<Stored>> = self.table(&key).objects_in(Some(name)).cloned().collect();
            for object in contents {
                if !object.meta.deleting {
                    let opts = DeleteOptions {
                        propagation: Some(Propagation::Background),
                        ..DeleteOptions::default()
                    };
                    let _ = self.delete(&info, name, &object.meta.name, &opts);
                }
                if self.lookup(&info, name, &object.meta.name).is_some() {
                    remaining += 1;
                }
            }
        }
        if remaining > 0 {
            return;
        }
        let Some(namespace) = self.lookup(&namespaces, "", name) else {
            return;
        };
        let mut value = namespace.value();
        if let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("finalizers");
        }
        self.system_update(
            &namespaces,
            &namespace,
            value,
            NAMESPACE_CONTROLLER,
            Scope::Main {
                status_subresource: true,
            },
        );
    }

    fn definition(&mut self, name: &str) {
        let definitions = self
            .registry
            .find("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .expect("built in");
        let Some(definition) = self.lookup(&definitions, "", name) else {
            return;
        };
        if !definition.meta.deleting {
            return;
        }
        let value = definition.value();
        let key = crate::registry::StorageKey::of_crd(&value);
        if let Some(info) = self.info_for(&key) {
            let contents: Vec<Arc<Stored>> = self.table(&key).objects.values().cloned().collect();
            for object in &contents {
                if !object.meta.deleting {
                    let opts = DeleteOptions::default();
                    let _ = self.delete(&info, &object.meta.namespace, &object.meta.name, &opts);
                }
            }
            if self.tables.get(&key).is_some_and(|t| !t.objects.is_empty()) {
                return;
            }
        }
        let Some(definition) = self.lookup(&definitions, "", name) else {
            return;
        };
        self.drop_finalizer(
            &definitions,
            &definition,
            "customresourcecleanup.apiextensions.k8s.io",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> Owner {
        Owner {
            uid: uid.into(),
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: uid.into(),
            block_owner_deletion: true,
        }
    }

    #[test]
    fn a_dependent_goes_only_when_every_owner_is_gone() {
        let owners = [owner("a"), owner("b")];
        assert_eq!(judge(&owners, |_| true), Verdict::Keep);
        assert_eq!(
            judge(&owners, |o| o.uid == "a"),
            Verdict::DropReferences(vec!["b".into()])
        );
        assert_eq!(judge(&owners, |_| false), Verdict::Delete);
        assert_eq!(judge(&[], |_| false), Verdict::Keep);
    }
}
