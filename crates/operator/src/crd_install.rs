//! `gpu-operator crd --apply`: installs or upgrades the ClusterPolicy and NVIDIADriver CRDs on the cluster,
//! as a Helm pre-install/pre-upgrade hook does (Helm installs `crds/` once and never upgrades them).
//!
//! Each CRD is checked against the live one first ([`check_upgrade`], pure): a live CRD that serves a
//! version this binary does not know, or whose stored versions include one it would stop serving, was
//! written by a newer operator, and applying ours would make objects stored in that version unreadable. That
//! is refused, naming the CRD and the versions. Otherwise the CRD is server-side applied with the field
//! manager `gpu-operator` (forced: the CRD is this project's alone), and the command waits, bounded, until
//! the API server says it is `Established` and its discovery serves every version we serve.

use std::collections::BTreeSet;
use std::time::Duration;

use gpuop_api::labels::FIELD_MANAGER;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

/// What applying one CRD did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrdOutcome {
    /// It did not exist.
    Created,
    /// It existed and changed.
    Updated,
    /// It existed exactly so.
    Unchanged,
}

impl std::fmt::Display for CrdOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CrdOutcome::Created => "created",
            CrdOutcome::Updated => "updated",
            CrdOutcome::Unchanged => "unchanged",
        })
    }
}

/// Why a CRD was not installed; each names the CRD.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The live CRD is newer than this binary.
    #[error(
        "CustomResourceDefinition {name}: refusing to downgrade: {reason}; this gpu-operator serves {ours:?}. \
         Use the chart of the operator version that installed it, or a newer one"
    )]
    Downgrade {
        /// The CRD.
        name: String,
        /// What makes the live CRD newer.
        reason: String,
        /// The versions this binary serves.
        ours: Vec<String>,
    },
    /// Reading or writing the CRD failed.
    #[error("CustomResourceDefinition {name}: cannot {verb}: {source}")]
    Api {
        /// The CRD.
        name: String,
        /// `read` or `apply`.
        verb: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The CRD was applied but the API server did not establish it or serve its versions in time.
    #[error("CustomResourceDefinition {name}: applied, but {waiting} after {seconds}s")]
    NotEstablished {
        /// The CRD.
        name: String,
        /// What was still missing.
        waiting: String,
        /// The timeout.
        seconds: u64,
    },
}

/// Versions a CRD serves, in its order.
fn served(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.clone())
        .collect()
}

/// Whether `ours` may replace `live`: refused when `live` serves a version `ours` does not define, or has
/// objects stored in a version `ours` does not serve. Returns the reason when refused.
pub fn check_upgrade(live: &CustomResourceDefinition, ours: &CustomResourceDefinition) -> Result<(), String> {
    let known: BTreeSet<&str> = ours.spec.versions.iter().map(|v| v.name.as_str()).collect();
    let ours_served = served(ours);
    let unknown: Vec<String> = served(live)
        .into_iter()
        .filter(|v| !known.contains(v.as_str()))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "it serves {unknown:?}, which this gpu-operator does not know"
        ));
    }
    let stored: Vec<String> = live
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !ours_served.contains(v))
        .collect();
    if !stored.is_empty() {
        return Err(format!(
            "objects may be stored as {stored:?} (status.storedVersions), which this gpu-operator does not serve"
        ));
    }
    Ok(())
}

/// Exactly the permissions [`apply_all`] uses (cluster-wide, all limited to the CRDs' names): server-side
/// apply writes through `patch`, and the API server also demands `create` when that patch creates the
/// CRD. Discovery needs no grant.
pub fn permissions() -> crate::uninstall::Permission {
    crate::uninstall::Permission {
        group: "apiextensions.k8s.io",
        resource: "customresourcedefinitions",
        namespaced: false,
        verbs: &["get", "list", "watch", "patch", "create"],
    }
}

/// The CRDs this binary installs.
pub fn crds() -> [CustomResourceDefinition; 2] {
    [
        gpuop_api::crd::cluster_policy_crd(),
        gpuop_api::crd::nvidia_driver_crd(),
    ]
}

/// Applies every CRD of [`crds`] in turn and waits for each to be established and served, within
/// `timeout` for all of them together. Stops at the first CRD that fails; returns what was done until then
/// with the failure.
pub async fn apply_all(
    client: &Client,
    timeout: Duration,
) -> (Vec<(String, CrdOutcome)>, Result<(), CrdError>) {
    let deadline = Instant::now() + timeout;
    let mut done = Vec::new();
    for crd in crds() {
        match apply_one(client, &crd, deadline, timeout).await {
            Ok(outcome) => done.push((crd.name_any(), outcome)),
            Err(error) => return (done, Err(error)),
        }
    }
    (done, Ok(()))
}

async fn apply_one(
    client: &Client,
    crd: &CustomResourceDefinition,
    deadline: Instant,
    timeout: Duration,
) -> Result<CrdOutcome, CrdError> {
    let name = crd.name_any();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let api_error = |verb: &'static str| {
        let name = name.clone();
        move |source| CrdError::Api { name, verb, source }
    };
    let live = api.get_opt(&name).await.map_err(api_error("read"))?;
    if let Some(live) = &live {
        check_upgrade(live, crd).map_err(|reason| CrdError::Downgrade {
            name: name.clone(),
            reason,
            ours: served(crd),
        })?;
    }
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .map_err(api_error("apply"))?;
    let outcome = match &live {
        None => CrdOutcome::Created,
        Some(live) if live.resource_version() == applied.resource_version() => CrdOutcome::Unchanged,
        Some(_) => CrdOutcome::Updated,
    };
    let not_established = |waiting: String| CrdError::NotEstablished {
        name: name.clone(),
        waiting,
        seconds: timeout.as_secs(),
    };
    let established = tokio::time::timeout_at(
        deadline,
        await_condition(api.clone(), &name, conditions::is_crd_established()),
    )
    .await;
    match established {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => return Err(not_established(format!("watching it failed ({error})"))),
        Err(_) => return Err(not_established("it is not Established".to_owned())),
    }
    // Established says the names are accepted; discovery is what clients (Helm, kubectl, the operator)
    // resolve the kinds with, and it may lag a moment behind.
    let plural = &crd.spec.names.plural;
    for version in served(crd) {
        let group_version = format!("{}/{version}", crd.spec.group);
        loop {
            let listed = client.list_api_group_resources(&group_version).await;
            if listed.is_ok_and(|list| list.resources.iter().any(|r| r.name == *plural)) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(not_established(format!(
                    "discovery does not serve {plural} in {group_version}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionStatus, CustomResourceDefinitionVersion,
    };

    fn with_versions(
        mut crd: CustomResourceDefinition,
        versions: &[(&str, bool)],
    ) -> CustomResourceDefinition {
        let template = crd.spec.versions[0].clone();
        crd.spec.versions = versions
            .iter()
            .map(|(name, served)| CustomResourceDefinitionVersion {
                name: (*name).to_owned(),
                served: *served,
                storage: *name == "v1",
                ..template.clone()
            })
            .collect();
        crd
    }

    fn stored(mut crd: CustomResourceDefinition, versions: &[&str]) -> CustomResourceDefinition {
        crd.status = Some(CustomResourceDefinitionStatus {
            stored_versions: Some(versions.iter().map(|v| (*v).to_owned()).collect()),
            ..CustomResourceDefinitionStatus::default()
        });
        crd
    }

    #[test]
    fn the_same_or_an_older_crd_is_replaced() {
        let ours = gpuop_api::crd::cluster_policy_crd();
        assert_eq!(check_upgrade(&stored(ours.clone(), &["v1"]), &ours), Ok(()));
        // An older CRD that served a version we still define (but no longer serve) is upgraded.
        let ours = with_versions(ours, &[("v1", true), ("v1alpha1", false)]);
        let older = stored(
            with_versions(ours.clone(), &[("v1alpha1", true), ("v1", true)]),
            &["v1"],
        );
        assert_eq!(check_upgrade(&older, &ours), Ok(()));
    }

    #[test]
    fn a_newer_crd_is_never_downgraded() {
        let ours = gpuop_api::crd::cluster_policy_crd();
        let newer = with_versions(ours.clone(), &[("v1", true), ("v2", true)]);
        let reason = check_upgrade(&newer, &ours).unwrap_err();
        assert!(reason.contains(r#"["v2"]"#), "{reason}");
        // A version no longer served but still stored would leave objects unreadable.
        let ours = with_versions(ours, &[("v1", true), ("v1alpha1", false)]);
        let stored_old = stored(
            with_versions(ours.clone(), &[("v1", true), ("v1alpha1", false)]),
            &["v1alpha1", "v1"],
        );
        let reason = check_upgrade(&stored_old, &ours).unwrap_err();
        assert!(
            reason.contains("storedVersions") && reason.contains("v1alpha1"),
            "{reason}"
        );
        let error = CrdError::Downgrade {
            name: "clusterpolicies.nvidia.com".into(),
            reason,
            ours: served(&ours),
        };
        assert!(
            error
                .to_string()
                .starts_with("CustomResourceDefinition clusterpolicies.nvidia.com: refusing to downgrade:")
        );
    }
}
