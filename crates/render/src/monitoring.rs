//! Prometheus Operator `ServiceMonitor` (`monitoring.coreos.com/v1`), which k8s-openapi does not have: a
//! local struct with the fields the operator sets, and the policy's scrape settings
//! (`serviceMonitor.interval`, `scrapeTimeout`, `honorLabels`, `relabelings`, `additionalLabels`) applied to
//! its first endpoint as NVIDIA applies them.

use std::collections::BTreeMap;

use gpuop_api::cluster_policy::{RelabelConfig, ServiceMonitorConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::{Metadata, NamespaceResourceScope, Resource};
use serde::Serialize;

use crate::manifest::meta;

/// A ServiceMonitor.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServiceMonitor {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta,
    spec: ServiceMonitorSpec,
}

/// What a ServiceMonitor scrapes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceMonitorSpec {
    endpoints: Vec<Endpoint>,
    job_label: String,
    namespace_selector: NamespaceSelector,
    selector: LabelSelector,
}

/// One scraped port.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct Endpoint {
    port: String,
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scrape_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    honor_labels: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    relabelings: Option<Vec<RelabelConfig>>,
}

/// Namespaces whose Services are scraped.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
struct NamespaceSelector {
    match_names: Vec<String>,
}

impl Resource for ServiceMonitor {
    const API_VERSION: &'static str = "monitoring.coreos.com/v1";
    const GROUP: &'static str = "monitoring.coreos.com";
    const KIND: &'static str = "ServiceMonitor";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "servicemonitors";
    type Scope = NamespaceResourceScope;
}

impl Metadata for ServiceMonitor {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl ServiceMonitor {
    /// Scrapes `/metrics` on the named port of the Services labelled `app=<app>` in the namespace.
    pub fn new(name: &str, app: &str, port: &str, job_label: &str, namespace: &str) -> Self {
        let mut selector = BTreeMap::new();
        selector.insert("app".to_owned(), app.to_owned());
        Self {
            api_version: <Self as Resource>::API_VERSION,
            kind: <Self as Resource>::KIND,
            metadata: meta(name, &[("app", app)]),
            spec: ServiceMonitorSpec {
                endpoints: vec![Endpoint {
                    port: port.to_owned(),
                    path: "/metrics".to_owned(),
                    ..Endpoint::default()
                }],
                job_label: job_label.to_owned(),
                namespace_selector: NamespaceSelector {
                    match_names: vec![namespace.to_owned()],
                },
                selector: LabelSelector {
                    match_labels: Some(selector),
                    match_expressions: None,
                },
            },
        }
    }

    /// Applies the policy's scrape settings.
    #[must_use]
    pub fn configured(mut self, config: Option<&ServiceMonitorConfig>) -> Self {
        let Some(config) = config else {
            return self;
        };
        if let Some(extra) = &config.additional_labels {
            self.metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(extra.clone());
        }
        let endpoint = &mut self.spec.endpoints[0];
        endpoint.interval = config.interval.clone().filter(|s| !s.is_empty());
        endpoint.scrape_timeout = config.scrape_timeout.clone().filter(|s| !s.is_empty());
        endpoint.honor_labels = config.honor_labels;
        endpoint.relabelings = config.relabelings.clone().filter(|r| !r.is_empty());
        self
    }
}
