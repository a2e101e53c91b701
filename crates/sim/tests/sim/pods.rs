//! The cluster's pods as the tests list them: all that a selection matches, or only those not being deleted.

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};

/// The pods of `namespace` that `params` select.
pub(crate) async fn listed(client: &Client, namespace: &str, params: &ListParams) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(params)
        .await
        .expect("pods list")
        .items
}

/// The pods of `namespace` that `params` select, less those being deleted.
pub(crate) async fn live(client: &Client, namespace: &str, params: &ListParams) -> impl Iterator<Item = Pod> {
    listed(client, namespace, params)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
}
