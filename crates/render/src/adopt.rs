//! Taking over objects another operator wrote: what of the live object a rendering keeps.
//!
//! Only one thing, and only for the driver: its `DRIVER_CONFIG_DIGEST`. NVIDIA's operator hashes Go's
//! printing of its own structures and this operator hashes its own, so for the same driver configuration
//! the two values differ; the value sits in the driver pod template, so taking our value over would
//! restart every driver pod, and a driver pod restart reloads the driver of its node under every GPU
//! workload there. The digest only has to change when what it summarises changes, so while the install
//! configuration of the live template is the one rendered, the live value stays. (Reproducing NVIDIA's
//! hash byte for byte would need Go's `%#v` printing of its structs, which no test here could check.)

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use crate::operands::driver::{DRIVER_CONFIG_DIGEST, config_digest};

/// Keeps the live `DRIVER_CONFIG_DIGEST` in a rendered driver DaemonSet (`desired`) when the live pod
/// template installs the same driver (same images, commands, literal environment, mounts and volumes:
/// what the digest summarises) and only the digest value differs. Returns whether `desired` changed.
/// Objects without the variable are left alone.
pub fn keep_live_driver_digest(desired: &mut Value, live: &PodSpec) -> bool {
    let Some(live_digest) = digest_in(live) else {
        return false;
    };
    let Some(pod) = desired.pointer("/spec/template/spec") else {
        return false;
    };
    let Ok(rendered) = serde_json::from_value::<PodSpec>(pod.clone()) else {
        return false;
    };
    let Some(rendered_digest) = digest_in(&rendered) else {
        return false;
    };
    if rendered_digest == live_digest || config_digest(&rendered) != config_digest(live) {
        return false;
    }
    let Some(pod) = desired.pointer_mut("/spec/template/spec") else {
        return false;
    };
    for list in ["initContainers", "containers"] {
        for container in pod
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            for var in container
                .get_mut("env")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if var["name"] == DRIVER_CONFIG_DIGEST {
                    var["value"] = Value::String(live_digest.clone());
                }
            }
        }
    }
    true
}

/// The digest a pod template carries (every driver container carries the same one).
fn digest_in(pod: &PodSpec) -> Option<String> {
    pod.init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .flat_map(|c| c.env.iter().flatten())
        .find(|var| var.name == DRIVER_CONFIG_DIGEST)
        .and_then(|var| var.value.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn driver(image: &str, digest: &str) -> Value {
        json!({"spec": {"template": {"spec": {
            "initContainers": [{"name": "k8s-driver-manager", "image": "manager:1",
                "env": [{"name": "DRIVER_CONFIG_DIGEST", "value": digest}]}],
            "containers": [{"name": "nvidia-driver-ctr", "image": image,
                "env": [{"name": "KERNEL_MODULE_TYPE", "value": "auto"},
                        {"name": "DRIVER_CONFIG_DIGEST", "value": digest}]}]
        }}}})
    }

    fn pod(object: &Value) -> PodSpec {
        serde_json::from_value(object["spec"]["template"]["spec"].clone()).unwrap()
    }

    #[test]
    fn the_same_install_keeps_the_live_digest_in_every_driver_container() {
        let live = driver("driver:595", "2904938383");
        let mut desired = driver("driver:595", "111");
        assert!(keep_live_driver_digest(&mut desired, &pod(&live)));
        assert_eq!(desired, live, "nothing left to change in the template");
        assert!(!keep_live_driver_digest(&mut desired, &pod(&live)), "idempotent");
    }

    #[test]
    fn a_different_install_takes_the_rendered_digest() {
        let live = driver("driver:580", "2904938383");
        let mut desired = driver("driver:595", "111");
        assert!(!keep_live_driver_digest(&mut desired, &pod(&live)));
        assert_eq!(desired, driver("driver:595", "111"));
    }

    #[test]
    fn objects_without_a_digest_are_left_alone() {
        let mut desired = json!({"spec": {"template": {"spec": {"containers": [{"name": "x"}]}}}});
        let before = desired.clone();
        assert!(!keep_live_driver_digest(&mut desired, &pod(&driver("d", "1"))));
        assert_eq!(desired, before);
    }
}
