//! The `pre-requisites` state: the RuntimeClasses operand pods (and workloads) run GPU containers with.
//!
//! `operator.runtimeClass` (default `nvidia`) always, with a handler of the same name, which the toolkit
//! configures in the container runtime; with CDI also `nvidia-cdi` and `nvidia-legacy`, the toolkit's
//! explicit-mode runtimes. With the NRI plugin no RuntimeClass is rendered: devices are injected by
//! annotation and the runtime configuration is left alone.

use k8s_openapi::api::node::v1::RuntimeClass;

use crate::inputs::Inputs;
use crate::manifest::{Objects, Owner, meta};

/// The state's name.
const STATE: &str = "pre-requisites";

/// Adds the RuntimeClasses the policy needs.
pub(crate) fn runtime_classes(inputs: &Inputs<'_>, objects: &mut Objects) {
    if inputs.spec.nri_plugin_enabled() {
        return;
    }
    let mut names = vec![inputs.spec.operator.runtime_class()];
    if inputs.spec.cdi_enabled() {
        names.extend(["nvidia-legacy", "nvidia-cdi"]);
    }
    for name in names {
        objects.push(
            Owner::operator(STATE),
            RuntimeClass {
                metadata: meta(name, &[]),
                handler: name.to_owned(),
                overhead: None,
                scheduling: None,
            },
        );
    }
}
