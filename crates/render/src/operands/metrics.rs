//! The `state-operator-metrics` state: the Service in front of the operator's own `/metrics` (port 8080,
//! selecting the operator's pods by `app=gpu-operator`) and, when the Prometheus Operator is installed, a
//! ServiceMonitor for it.
//!
//! NVIDIA always creates that ServiceMonitor when the CRD exists and ignores
//! `operator.metrics.serviceMonitor.enabled: false`; here an explicit `false` is honoured, and an absent
//! setting keeps NVIDIA's behaviour.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::inputs::Inputs;
use crate::manifest::{Objects, Owner, meta};
use crate::monitoring::ServiceMonitor;

/// The state's name.
const STATE: &str = "state-operator-metrics";
/// Name of the Service and ServiceMonitor, and `app` label of the operator's pods.
const NAME: &str = "gpu-operator";
/// Name of the metrics port.
const PORT_NAME: &str = "gpu-operator-metrics";
/// The operator's metrics port.
const PORT: i32 = 8080;

/// Adds the operator's metrics Service and, if wanted, its ServiceMonitor.
pub(crate) fn operator_metrics(inputs: &Inputs<'_>, objects: &mut Objects) {
    let owner = Owner::operator(STATE);
    objects.push(owner, metrics_service(NAME, PORT_NAME, PORT));
    let config = inputs
        .spec
        .operator
        .metrics
        .as_ref()
        .and_then(|m| m.service_monitor.as_ref());
    let disabled = config.is_some_and(|c| c.enabled == Some(false));
    if inputs.facts.service_monitor_crd && !disabled {
        let monitor = ServiceMonitor::new(NAME, NAME, PORT_NAME, "operator", objects.namespace());
        objects.push(owner, monitor.configured(config));
    }
}

/// A Service exposing one metrics port of the pods labelled `app=<name>`, marked for Prometheus scraping.
pub(crate) fn metrics_service(name: &str, port_name: &str, port: i32) -> Service {
    let mut metadata = meta(name, &[("app", name)]);
    metadata.annotations = Some(BTreeMap::from([(
        "prometheus.io/scrape".to_owned(),
        "true".to_owned(),
    )]));
    Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ports: Some(vec![ServicePort {
                name: Some(port_name.to_owned()),
                port,
                target_port: Some(IntOrString::Int(port)),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
